"""The adapters against SGLang's source: every hook target and every Req/ReqKvInfo field an adapter
reads exists in that release. 0.5.23 is checked against the installed package (CI); 0.5.16 cannot be
installed beside it, so it is checked against an unpacked 0.5.16 wheel when one is at
$SPECFLIP_SGLANG_0_5_16_SRC (default /tmp/sg/0.5.16), and skipped otherwise."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from shim.guard import api as guard_api
from shim.releases import LINES, UnsupportedRelease, release_line
from shim.releases.v0_5_16 import Adapter as Adapter0516
from shim.releases.v0_5_23 import Adapter as Adapter0523
from shim.settings import settings
from shim.switch.config import SwitchConfig


def installed_root() -> Path | None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def root_0_5_16() -> Path | None:
    root = Path(settings.SGLANG_0_5_16_SRC.get() or "/tmp/sg/0.5.16")
    return root if (root / "sglang" / "srt").is_dir() else None


def find_definition(root: Path, target: str) -> bool:
    """`pkg.module.Class.method` or `pkg.module.function` defined in the source under `root`."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        path = root.joinpath(*parts[:cut]).with_suffix(".py")
        if path.is_file():
            names = parts[cut:]
            break
    else:
        return False
    body = ast.parse(path.read_text()).body
    for name in names:
        node = next((n for n in body if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name == name), None)
        if node is None:
            return False
        body = node.body if isinstance(node, ast.ClassDef) else []
    return True


def class_fields(root: Path, module: str, cls: str) -> set[str]:
    tree = ast.parse(root.joinpath(*module.split(".")).with_suffix(".py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fields = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
            fields.add(sub.target.id)
        target = getattr(sub, "target", None) if isinstance(sub, ast.AnnAssign) else None
        targets = sub.targets if isinstance(sub, ast.Assign) else [target] if target is not None else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                fields.add(t.attr)
    return fields


RELEASES = [
    pytest.param(Adapter0523, installed_root, id="0.5.23"),
    pytest.param(Adapter0516, root_0_5_16, id="0.5.16"),
]


@pytest.mark.parametrize(("adapter", "root_of"), RELEASES)
def test_every_hook_target_exists(adapter: type, root_of: object) -> None:
    root = root_of()
    if root is None or not (root / "sglang" / "srt").is_dir():
        pytest.skip(f"no sglang {adapter.release} source here")
    missing = [t for t, _, _ in adapter.TARGETS if not find_definition(root, t)]
    assert not missing
    assert not find_definition(root, "sglang.srt.managers.schedule_batch.ScheduleBatch.no_such_method")


@pytest.mark.parametrize(("adapter", "root_of"), RELEASES)
def test_req_kv_fields_exist(adapter: type, root_of: object) -> None:
    root = root_of()
    if root is None or not (root / "sglang" / "srt").is_dir():
        pytest.skip(f"no sglang {adapter.release} source here")
    req = class_fields(root, "sglang.srt.managers.schedule_batch", "Req")
    kv = class_fields(root, "sglang.srt.managers.schedule_batch", "ReqKvInfo")
    if adapter is Adapter0523:
        assert {"kv_committed_len", "kv_allocated_len", "cache_protected_len", "req_pool_idx"} <= kv
    else:
        assert {"kv_committed_len", "cache_protected_len", "req_pool_idx", "kv"} <= req
        assert "kv_allocated_len" in kv and "kv_committed_len" not in kv


def test_kv_mapping_per_release() -> None:
    req_23 = SimpleNamespace(kv=SimpleNamespace(req_pool_idx=3, kv_committed_len=12, kv_allocated_len=20,
                                                cache_protected_len=4))
    req_16 = SimpleNamespace(kv=SimpleNamespace(kv_allocated_len=20), kv_committed_len=12, req_pool_idx=3,
                             cache_protected_len=4)
    assert Adapter0523().req_kv_lens(req_23) == Adapter0516().req_kv_lens(req_16) == (True, 12, 20, 4)
    released_16 = SimpleNamespace(kv=None, kv_committed_len=12, req_pool_idx=None, cache_protected_len=0)
    assert Adapter0516().req_kv_lens(released_16) == (False, 0, 0, 0)


def test_version_dispatch() -> None:
    assert {"0.5.23", "0.5.16", "0.5.12"} <= set(LINES)
    with pytest.raises(UnsupportedRelease, match=r"0\.5\.11 is not a supported release .*SGLang 0\.5\.12 to 0\.5\.23"):
        release_line("0.5.11")
    assert release_line("0.5.16").adapter().release == "0.5.16"
    assert release_line("0.5.16.post1").adapter().release == "0.5.16"  # a .postN release: its base line
    assert release_line("0.5.23").adapter().release == "0.5.23"


def test_reference_design_and_caps_follow_the_installed_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard learns the switch's design and cap only through shim.guard.api.announce_switch."""
    sa = SimpleNamespace(max_running_requests=256, chunked_prefill_size=8192, speculative_adaptive=False)
    adapter = Adapter0523()
    monkeypatch.setattr(guard_api, "_SWITCH", None)
    assert adapter.reference_design(sa).name == "plain_off_catch_up"
    assert adapter.scope(sa).spec_cap == 256
    config = SwitchConfig(t_off=16, t_on=8, spec_cap=48, draft_while_off="sync")
    guard_api.announce_switch(config.design_name, config.spec_cap)
    assert adapter.reference_design(sa).name == "v2_switch_reserve_sync"
    scope = adapter.scope(sa)
    assert (scope.spec_cap, scope.plain_cap) == (48, 256)


@pytest.mark.parametrize("adapter_class", [Adapter0523, Adapter0516], ids=["0.5.23", "0.5.16"])
def test_the_overlap_schedule_is_followed_and_the_rest_still_refused(adapter_class: type) -> None:
    """The overlap loop (disable_overlap_schedule False) is guarded with Scope.overlap and the reference design's
    overlap variant (SGLang's double reserve); the normal loop keeps the plain scope. Configurations the model
    does not describe stay refused under either loop."""
    from shim.guard.core import Mode
    from shim.guard.runtime import GuardRuntime

    adapter = adapter_class()
    overlap = SimpleNamespace(disable_overlap_schedule=False, page_size=1, speculative_algorithm="EAGLE3",
                              max_running_requests=8, chunked_prefill_size=64, speculative_adaptive=False)
    normal = SimpleNamespace(**{**vars(overlap), "disable_overlap_schedule": True})
    assert adapter.unsupported_reason(overlap) is None and adapter.unsupported_reason(normal) is None
    assert adapter.scope(overlap).overlap and not adapter.scope(normal).overlap
    for sa, name in ((overlap, "plain_off_catch_up_overlap"), (normal, "plain_off_catch_up")):
        rt = GuardRuntime(Mode.WARN)
        guard = rt.start(design=adapter.reference_design(sa), scope=adapter.scope(sa), rank=0, release="x")
        assert guard.config.design.name == name
    # the server's speculative_num_steps replaces the checker's step count of a one-step-count design only
    rt = GuardRuntime(Mode.WARN)
    guard = rt.start(design=adapter.reference_design(overlap), scope=adapter.scope(overlap), rank=0, release="x",
                     num_steps=3)
    assert (guard.config.design.name, guard.config.design.num_steps) == ("plain_off_catch_up_overlap", 3)
    from statemodel.designs import ADAPTIVE_WARM, DESIGNS_BY_NAME

    adaptive = rt.start(design=ADAPTIVE_WARM, scope=adapter.scope(overlap), rank=0, release="x", num_steps=5)
    assert adaptive.config.design == DESIGNS_BY_NAME["sglang_adaptive_warm_overlap"]  # its tiers say its steps
    paged = SimpleNamespace(**{**vars(overlap), "page_size": 16})
    assert "page_size" in (adapter.unsupported_reason(paged) or "")
    mixed = SimpleNamespace(**{**vars(overlap), "enable_mixed_chunk": True})
    assert "mixed" in (adapter.unsupported_reason(mixed) or "")


@pytest.mark.parametrize(("adapter", "root_of"), RELEASES)
def test_tree_draft_fields_exist(adapter: type, root_of: object) -> None:
    """What the radix tree's draft coverage reads (issue 24, shim/guard/tree_draft.py): the request's token lists and
    namespace, the RadixKey's host fields, an insert's prefix_len, and on 0.5.16 the evicted leaf's key and parent."""
    root = root_of()
    if root is None or not (root / "sglang" / "srt").is_dir():
        pytest.skip(f"no sglang {adapter.release} source here")
    req = class_fields(root, "sglang.srt.managers.schedule_batch", "Req")
    assert {"origin_input_ids", "output_ids", "extra_key"} <= req
    key = class_fields(root, "sglang.srt.mem_cache.radix_cache", "RadixKey")
    assert {"token_ids", "extra_key", "is_bigram"} <= key
    assert find_definition(root, "sglang.srt.mem_cache.radix_cache.RadixKey.raw_token_ids")
    result = ast.parse(root.joinpath("sglang/srt/mem_cache/base_prefix_cache.py").read_text())
    insert_result = next(n for n in result.body if isinstance(n, ast.ClassDef) and n.name == "InsertResult")
    assert "prefix_len" in {s.target.id for s in insert_result.body
                            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    if adapter is Adapter0516:
        assert {"key", "parent"} <= class_fields(root, "sglang.srt.mem_cache.radix_cache", "TreeNode")
    else:
        assert "cache_salt" in req and "cache_salt" in key


# What one reading of a request takes (shim/releases/guard_reading.py `_observe_reqs`, `req_kv_lens`) and what frees or
# allocates pool slots: nothing a speculative worker call runs may write these, or the readings its first hook took
# could not serve its later hooks (`V2Adapter.observe_requests_in_worker_call`).
_READ_FIELDS = {"kv_committed_len", "kv_allocated_len", "cache_protected_len", "req_pool_idx", "kv", "output_ids",
                "origin_input_ids", "max_new_tokens", "rid"}
_POOL_CALLS = {"free", "alloc", "alloc_for_decode", "alloc_for_extend", "alloc_for_spec_decode", "alloc_token_slots",
               "release_kv_cache", "free_group_begin", "free_group_end", "evict"}
# code under the worker's packages that the worker call never runs: the scheduler's side of speculation
# (ScheduleBatch.prepare_for_decode's spec path, a scheduler hook) and algorithms the guard refuses
_NOT_IN_A_WORKER_CALL = {
    ("speculative/eagle_utils.py", "eagle_prepare_for_decode"),
    ("speculative/dflash_info_v2.py", "*"), ("speculative/uno_info.py", "*"),
    # MiniCPM sparse attention reserves its compressed-cache slots at start-up and after a cache flush, never in a step
    ("layers/attention/minicpm/cache.py", "reset_allocator"),
}


def _worker_call_writes(path: Path, rel: str) -> list[str]:
    """Each store to an attribute a reading takes, and each call that moves pool slots (or appends to output_ids),
    in `path`, as 'file:line function: what' (functions listed in _NOT_IN_A_WORKER_CALL left out)."""
    found = []
    tree = ast.parse(path.read_text())
    for func in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]:
        if (rel, func.name) in _NOT_IN_A_WORKER_CALL or (rel, "*") in _NOT_IN_A_WORKER_CALL:
            continue
        found += _writes_in(func, rel, func.name)
    return found


def _writes_in(code: ast.AST, rel: str, name: str) -> list[str]:
    """`_worker_call_writes`'s findings in one function (or a part of one: `code`)."""
    found = []
    for node in ast.walk(code):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and sub.attr in _READ_FIELDS and isinstance(sub.ctx, ast.Store):
                    found.append(f"{rel}:{node.lineno} {name}: stores .{sub.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            owner = node.func.value if isinstance(node.func, ast.Attribute) else None
            if called in ("append", "extend"):
                if isinstance(owner, ast.Attribute) and owner.attr == "output_ids":
                    found.append(f"{rel}:{node.lineno} {name}: output_ids.{called}")
            elif called in _POOL_CALLS and (owner is None or "alloc" in ast.unparse(owner)
                                            or "pool" in ast.unparse(owner) or "cache" in ast.unparse(owner)):
                found.append(f"{rel}:{node.lineno} {name}: calls {ast.unparse(node.func)}")
    return found


def _method(srt: Path, rel: str, cls: str, name: str) -> ast.FunctionDef | None:
    """The method's definition in the source under `srt`, None where the release has none."""
    tree = ast.parse((srt / rel).read_text())
    owner = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next((n for n in owner.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _unparsed(srt: Path, rel: str, cls: str, name: str) -> str:
    method = _method(srt, rel, cls, name)
    assert method is not None, f"{rel}: no {cls}.{name}"
    return ast.unparse(method)


# What the overlap loop runs between prepare_for_decode of step N+1 (its hook's reading) and the hook after step
# N's `_normalize_decode_outputs` (shim/releases/guard_reading.py `_result_reading`), the worker call aside (the
# scan above): (file, class, method; 0.5.16 lacks the last three but one), and of process_batch_result_decode only what
# precedes that call
_BEFORE_A_PLAIN_RESULT = (
    ("managers/scheduler.py", "Scheduler", "is_disable_overlap_for_batch"),
    ("managers/scheduler.py", "Scheduler", "run_batch"),
    ("managers/scheduler.py", "Scheduler", "_apply_war_barrier"),
    ("managers/scheduler.py", "Scheduler", "process_batch_result"),
    ("managers/schedule_batch.py", "ScheduleBatch", "copy"),
    ("managers/scheduler_components/batch_result_processor.py", "SchedulerBatchResultProcessor",
     "snapshot_auxiliary_output_starts"),
    ("managers/scheduler_components/batch_result_processor.py", "SchedulerBatchResultProcessor",
     "_visible_output_len"),
    ("managers/scheduler_components/batch_result_processor.py", "SchedulerBatchResultProcessor",
     "materialize_sampling_mask_output"),
    ("managers/scheduler_components/batch_result_processor.py", "SchedulerBatchResultProcessor",
     "_normalize_decode_outputs"),
)


@pytest.mark.parametrize(("adapter", "root_of"), RELEASES)
def test_a_plain_result_moves_nothing_a_reading_takes_before_its_hook(adapter: type, root_of: object) -> None:
    """Between a plain overlap iteration's prepare_for_decode and the hook of the result it processes, the scheduler
    writes no Req field a reading takes and moves no pool slot (the worker call: the test above): what lets that hook
    take the iteration's reading (`V2Adapter.PLAIN_RESULT_TAKES_READING`). The loop's order is held too."""
    assert adapter.PLAIN_RESULT_TAKES_READING
    root = root_of()
    if root is None or not (root / "sglang" / "srt").is_dir():
        pytest.skip(f"no sglang {adapter.release} source here")
    srt = root / "sglang" / "srt"
    methods = [(rel, name, _method(srt, rel, cls, name)) for rel, cls, name in _BEFORE_A_PLAIN_RESULT]
    found = [w for rel, name, method in methods if method is not None for w in _writes_in(method, rel, name)]
    assert sum(method is None for _, _, method in methods) <= 3
    decode = _method(srt, "managers/scheduler_components/batch_result_processor.py", "SchedulerBatchResultProcessor",
                     "process_batch_result_decode")
    assert decode is not None
    at = next(i for i, stmt in enumerate(decode.body) if "self._normalize_decode_outputs(" in ast.unparse(stmt))
    found += [w for stmt in decode.body[:at] for w in _writes_in(stmt, "batch_result_processor", decode.name)]
    assert found == []
    # the plain branch of _normalize_decode_outputs only lists the tokens; the speculative one commits KV elsewhere
    normalize = "".join(_unparsed(srt, "managers/scheduler_components/batch_result_processor.py",
                                  "SchedulerBatchResultProcessor", "_normalize_decode_outputs").split())
    assert "ifnotbatch.spec_algorithm.is_none():next_token_ids=self._resolve_spec_v2_tokens(" in normalize
    # event_loop_overlap: prepare (get_next_batch_to_run), the launch, the copy queued, then the last result
    loop = _unparsed(srt, "managers/scheduler.py", "Scheduler", "event_loop_overlap")
    order = [loop.index(s) for s in ("self.get_next_batch_to_run(", "self.is_disable_overlap_for_batch(",
                                     "self.run_batch(batch)", "batch.copy()", "if not disable_overlap_for_batch:")]
    assert order == sorted(order)
    # the scan sees a write where there is one: the speculative branch's commit (why only a plain result takes it)
    resolve = _method(srt, "managers/scheduler_components/batch_result_processor.py", "SchedulerBatchResultProcessor",
                      "_resolve_spec_v2_tokens")
    assert resolve is not None
    assert any("stores .kv_committed_len" in w for w in _writes_in(resolve, "batch_result_processor", resolve.name))


@pytest.mark.parametrize(("adapter", "root_of"), RELEASES)
def test_a_worker_call_moves_nothing_a_reading_takes(adapter: type, root_of: object) -> None:
    """The speculative worker's call (EAGLEWorkerV2.forward_batch_generation: draft, verify, draft-extend; the target
    worker and the model runner under it; the switch's plain step inside it) writes no Req field a reading takes and
    frees or allocates no pool slot: the scheduler's code does, before and after the call. That is what lets the
    readings of the call's first hook serve its later ones."""
    root = root_of()
    if root is None or not (root / "sglang" / "srt").is_dir():
        pytest.skip(f"no sglang {adapter.release} source here")
    srt = root / "sglang" / "srt"
    files = [p for d in ("speculative", "model_executor", "layers") for p in sorted((srt / d).rglob("*.py"))]
    files.append(srt / "managers" / "tp_worker.py")
    found = [w for p in files for w in _worker_call_writes(p, str(p.relative_to(srt)))]
    repo = Path(__file__).resolve().parents[1]
    found += _worker_call_writes(repo / "shim/switch/v2_plain_step.py", "shim/switch/v2_plain_step.py")
    assert found == []
    # the scan sees such a write where there is one: the scheduler's own result processing commits the tokens
    processor = srt / "managers" / "scheduler_components" / "batch_result_processor.py"
    assert any("stores .kv_committed_len" in w for w in _worker_call_writes(processor, "batch_result_processor"))
