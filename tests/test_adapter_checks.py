"""The 0.5.23 adapter's own judgements of a server (shim/releases/guard_hooks.py): which settings put it beyond what the
model describes, and the line that names each; the scope and design the guard checks it against; the overlap loop;
the scheduler's TP rank at start-up. Over real 0.5.23 ServerArgs (tests/sglang_cpu.py), one setting changed at a
time (`Changed`: the resolved record is read-only); the guard built at the first step; host readings of sizes
(`tensor_width`, 0.5.12's free group in its own `.venv12`); lint's graph sizes over real CUDA-launch arguments. These
decide whether the guard checks a server at all and what it and lint read: mutation testing (docs/mutation.md, target
`releases`) found the branches and lines no test held."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

h = importlib.import_module("sglang_cpu")

from shim.guard import api as guard_api  # noqa: E402
from shim.releases.guard_hooks import NO_CAP  # noqa: E402
from shim.releases.v0_5_23 import Adapter  # noqa: E402
from statemodel.design import Scope  # noqa: E402

pytestmark = pytest.mark.sglang


class Changed:
    """A real ServerArgs with some attributes read otherwise."""

    def __init__(self, sa: Any, **values: Any) -> None:
        self._sa = sa
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sa, name)


@pytest.fixture(scope="module")
def eagle(model_dir: Path) -> Any:
    return h.make_server_args(model_dir, speculative_algorithm="EAGLE")


@pytest.mark.parametrize(("values", "line"), [
    ({"page_size": 16}, "page_size 16 (--page-size; the model counts KV in single slots; supported: 1)"),
    ({"speculative_algorithm": "NGRAM"},
     "speculative algorithm NGRAM (--speculative-algorithm; supported: EAGLE, EAGLE3, none)"),
    ({"speculative_eagle_topk": 2},
     "speculative_eagle_topk 2 (--speculative-eagle-topk; the model drafts a chain: topk 1)"),
    ({"pp_size": 2}, "pipeline parallel size 2 (--pp-size; supported: 1)"),
    ({"enable_dp_attention": True}, "DP attention (--enable-dp-attention; not modelled)"),
    ({"enable_mixed_chunk": True}, "mixed chunked prefill (--enable-mixed-chunk; MIXED batches are not modelled)"),
    ({"disaggregation_mode": "prefill"}, "PD disaggregation (--disaggregation-mode prefill)"),
], ids=["page", "algorithm", "topk", "pp", "dp_attention", "mixed_chunk", "disaggregation"])
def test_each_setting_beyond_the_model_is_named_with_its_flag(eagle: Any, values: dict[str, Any], line: str) -> None:
    adapter = Adapter()
    assert adapter.unsupported_reason(eagle) is None
    assert adapter.unsupported_reason(Changed(eagle, **values)) == line


@pytest.mark.parametrize("values", [
    {"speculative_algorithm": "EAGLE3"},
    {"speculative_algorithm": None, "speculative_eagle_topk": 4},  # no speculation: its topk is not read
    {"speculative_eagle_topk": None},
    {"page_size": None},
    {"pp_size": None},
    {"pp_size": 1},
    {"disaggregation_mode": None},
], ids=["eagle3", "plain_topk", "topk_none", "page_none", "pp_none", "pp_1", "disaggregation_none"])
def test_settings_the_model_describes_leave_the_guard_on(eagle: Any, values: dict[str, Any]) -> None:
    assert Adapter().unsupported_reason(Changed(eagle, **values)) is None


def test_a_server_whose_arguments_say_nothing_is_judged_by_the_defaults() -> None:
    """Unpublished server arguments (None) or a record without the fields: SGLang's defaults, all supported."""
    adapter = Adapter()
    assert adapter.unsupported_reason(None) is None
    assert adapter.unsupported_reason(SimpleNamespace()) is None
    assert adapter.unsupported_reason(SimpleNamespace(speculative_algorithm="EAGLE")) is None


def test_the_overlap_loop_is_read_from_disable_overlap_schedule(eagle: Any) -> None:
    assert Adapter.runs_overlap_loop(eagle) is False  # the harness's normal loop
    assert Adapter.runs_overlap_loop(Changed(eagle, disable_overlap_schedule=False)) is True
    assert Adapter.runs_overlap_loop(None) is False
    assert Adapter.runs_overlap_loop(SimpleNamespace()) is False


def test_the_scope_holds_the_servers_caps_and_chunk(eagle: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard_api, "_SWITCH", None)
    adapter = Adapter()
    sa = Changed(eagle, chunked_prefill_size=64)
    assert adapter.scope(sa) == Scope(requests=(), kv_pool_size=0, spec_cap=16, plain_cap=16, chunk_size=64,
                                      graph_capture_sizes=(), overlap=False)
    unbounded = Changed(eagle, max_running_requests=None, chunked_prefill_size=None, disable_overlap_schedule=False)
    assert adapter.scope(unbounded) == Scope(requests=(), kv_pool_size=0, spec_cap=NO_CAP, plain_cap=NO_CAP,
                                             chunk_size=NO_CAP, graph_capture_sizes=(), overlap=True)
    guard_api.announce_switch("v2_switch_reserve_sync", 8)
    assert (adapter.scope(sa).spec_cap, adapter.scope(sa).plain_cap) == (8, 16)
    assert adapter.scope(Changed(sa, max_running_requests=4)).spec_cap == 4  # the launch cap bounds the switch's
    # a chunk of one token is still a chunk: only <= 0 turns chunked prefill off (`Scheduler.init_chunked_prefill`)
    assert adapter.scope(Changed(eagle, chunked_prefill_size=1)).chunk_size == 1


def test_the_reference_design_is_sglangs_adaptive_one_for_an_adaptive_server(eagle: Any,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard_api, "_SWITCH", None)
    adapter = Adapter()
    assert adapter.reference_design(Changed(eagle, speculative_adaptive=True)).name == "sglang_adaptive_warm"
    assert adapter.reference_design(Changed(eagle, speculative_adaptive=False)).name == "plain_off_catch_up"
    assert adapter.reference_design(SimpleNamespace()).name == "plain_off_catch_up"


def test_the_scheduler_tp_rank_at_start_up() -> None:
    """The scheduler's own record (`ps.tp_rank`), else its `tp_rank`, else the process-wide rank (0 here)."""
    adapter = Adapter()
    assert adapter.scheduler_tp_rank(SimpleNamespace(ps=SimpleNamespace(tp_rank=3), tp_rank=1)) == 3
    assert adapter.scheduler_tp_rank(SimpleNamespace(ps=SimpleNamespace(tp_rank=None), tp_rank=2)) == 2
    assert adapter.scheduler_tp_rank(SimpleNamespace(tp_rank=5)) == 5
    assert adapter.scheduler_tp_rank(SimpleNamespace(tp_rank="1")) == 0  # not an int: not a rank
    assert adapter.scheduler_tp_rank(SimpleNamespace()) == 0


def test_a_release_no_line_describes_runs_v1_only_before_the_first_line_without_it_and_only_when_asked() -> None:
    from shim.releases.registry import worker_kind

    off = {"SGLANG_ENABLE_SPEC_V2": "0"}
    assert worker_kind("0.5.11", off) == "v1"
    assert worker_kind("0.5.11", {}) == "v2"  # both ship; v2 is the default
    assert worker_kind("0.5.11", {"SGLANG_ENABLE_SPEC_V2": "1"}) == "v2"
    assert worker_kind("0.5.99", off) == "v2"  # no v1 worker left there


@pytest.mark.parametrize("value", ["0", "false", "False", "no", "NO", "n", "N", "off", " 0", "0 ", "1", "true", "yes",
                                   "y", "", "junk"])
def test_the_v1_worker_is_named_exactly_where_sglang_reads_the_flag_as_false(value: str) -> None:
    """SGLang reads SGLANG_ENABLE_SPEC_V2 with its `EnvBool` (srt/environ.py, the same words in 0.5.12 and 0.5.23):
    false for "false", "0", "no", "n" in any case, not stripped; any other value is warned about and taken as the
    default, True (0.5.12 then runs the v2 worker). specflip named v1 for "off" and " 0" (the v2 worker runs) and v2
    for "n" (the v1 worker runs): the switch and guard of the other worker (found 2026-12-06 from the mutant
    `registry.worker_kind` 32, docs/mutation.md)."""
    from sglang.srt.environ import EnvBool

    from shim.releases.registry import worker_kind

    try:
        v2 = EnvBool(True).parse(value)
    except ValueError:
        v2 = True
    env = {"SGLANG_ENABLE_SPEC_V2": value}
    assert worker_kind("0.5.12", env) == worker_kind("0.5.11", env) == ("v2" if v2 else "v1")
    assert worker_kind("0.5.16", env) == "v2"  # no v1 worker left there


def test_a_free_is_placed_in_its_req_to_token_row_from_the_view_alone(eagle: Any) -> None:
    """`row_range`: the row positions a free's index views in the real ReqToTokenPool's `req_to_token`; a copy, a
    strided view, a 2-D view, or a view of another tensor of the same shape places nothing (the guard then judges the
    freed slots by value)."""
    import torch

    from shim.releases.guard_reading import row_range
    from statemodel.identity import RowRange

    req_to_token = h.build_pools(eagle).req_to_token_pool.req_to_token
    assert row_range(req_to_token[2, 3:7], req_to_token) == RowRange(2, 3, 7)
    assert row_range(req_to_token[0, :1], req_to_token) == RowRange(0, 0, 1)
    assert row_range(req_to_token[2, 3:7].clone(), req_to_token) is None
    assert row_range(req_to_token[2, 3:9:2], req_to_token) is None
    assert row_range(req_to_token[1:3, 0:2], req_to_token) is None
    other = torch.zeros_like(req_to_token)
    assert row_range(other[2, 3:7], req_to_token) is None


def _adapter_over(sa: Any, runtime: Any) -> Adapter:
    """A 0.5.23 adapter whose published server arguments are `sa` (what `runtime_context.get_server_args` returns in a
    scheduler), with `runtime` as `install` would set it."""
    adapter = Adapter()
    adapter.server_args = lambda: sa  # type: ignore[method-assign]
    adapter.runtime = runtime
    runtime.adapter = adapter
    return adapter


def test_the_guard_built_at_the_first_step_follows_the_server(eagle: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`V2Adapter.guard` where no start-up decision ran: a paused or off runtime builds nothing; a setting beyond the
    model turns the guard off with its line; a supported server gets SGLang's adaptive design when adaptive, and the
    server's `speculative_num_steps` as the step count of a one-step-count design."""
    from shim.guard.config import Mode
    from shim.guard.runtime import GuardRuntime

    monkeypatch.setattr(guard_api, "_SWITCH", None)
    paused = GuardRuntime(Mode.WARN)
    paused.paused = True
    assert _adapter_over(eagle, paused).guard() is None and paused.guard is None
    off = GuardRuntime(Mode.WARN)
    off.disable("off for the test")
    assert _adapter_over(eagle, off).guard() is None and off.guard is None

    paged = GuardRuntime(Mode.WARN)
    assert _adapter_over(Changed(eagle, page_size=16), paged).guard() is None and paged.guard is None
    assert paged.disabled_reason == ("sglang 0.5.23: page_size 16 (--page-size; the model counts KV in single "
                                     "slots; supported: 1)")

    adaptive = _adapter_over(Changed(eagle, speculative_adaptive=True), GuardRuntime(Mode.WARN)).guard()
    assert adaptive is not None and adaptive.config.design.name == "sglang_adaptive_warm"
    static = _adapter_over(Changed(eagle, speculative_num_steps=3), GuardRuntime(Mode.WARN)).guard()
    assert static is not None
    assert (static.config.design.name, static.config.design.num_steps) == ("plain_off_catch_up", 3)


def test_the_guard_built_at_the_first_step_checks_the_servers_scope_and_takes_only_what_its_record_says(
        model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`V2Adapter.guard` builds the Guard against the server's own scope (its caps and chunk: `running_within_cap`
    and the chunk's rules read them), and takes from the record only what it says: a record without
    `speculative_num_steps` keeps the design's own step count, one without `enable_metrics` makes no gauge."""
    from shim.guard.config import Mode
    from shim.guard.runtime import GuardRuntime
    from statemodel.designs import get_design

    monkeypatch.setattr(guard_api, "_SWITCH", None)
    # its own server arguments, as an operator passes them (the module's `eagle` may have been resolved by an
    # earlier test, and the guard reads the resolved view, where the record's chunk is not what resolution keeps)
    sa = h.make_server_args(model_dir, speculative_algorithm="EAGLE")
    sa.chunked_prefill_size = 64
    adapter = _adapter_over(sa, GuardRuntime(Mode.WARN))
    built = adapter.guard()
    assert built is not None and built.config.scope == Adapter().scope(adapter.resolved_server_args())
    assert (built.config.scope.plain_cap, built.config.scope.chunk_size) == (16, 64)
    bare = GuardRuntime(Mode.WARN)
    guard = _adapter_over(SimpleNamespace(), bare).guard()
    assert guard is not None and guard.config.design == get_design("plain_off_catch_up")
    assert get_design("plain_off_catch_up").num_steps != 1
    assert (bare.metrics, guard.metrics) == (None, None)


def test_a_server_record_without_enable_metrics_is_decided_as_one_without_metrics() -> None:
    """`--enable-metrics` is read with the default False at start-up (`before_init_model_worker`, on the scheduler's
    own record) and at the first step (`guard`), as `unsupported_reason` reads the other fields: a record without it
    turns the guard off with its line and no gauge, never an AttributeError out of SGLang's start-up hook."""
    from shim.guard.config import Mode
    from shim.guard.runtime import GuardRuntime

    line = "sglang 0.5.23: page_size 16 (--page-size; the model counts KV in single slots; supported: 1)"
    at_start = GuardRuntime(Mode.WARN)
    _adapter_over(None, at_start).before_init_model_worker(
        SimpleNamespace(server_args=SimpleNamespace(page_size=16), tp_rank=0))
    assert (at_start.decided, at_start.disabled_reason, at_start.metrics) == (True, line, None)
    first_step = GuardRuntime(Mode.WARN)
    assert _adapter_over(SimpleNamespace(page_size=16), first_step).guard() is None
    assert (first_step.disabled_reason, first_step.metrics) == (line, None)


def test_host_readings_take_any_cpu_tensor_or_sequence() -> None:
    """`host_ints` gives python ints for a CPU tensor of any dtype (a float or bool tensor's `tolist()` does not), and
    `sorted_capture_sizes` sorts a runner's sizes held as a tuple or tensor as it does a list (only a list's answer is
    memoised)."""
    import torch

    from shim.releases.guard_reading import host_ints, sorted_capture_sizes

    assert host_ints(torch.tensor([3, 1], dtype=torch.int32)) == [3, 1]
    for tensor in (torch.tensor([3.0, 1.0]), torch.tensor([True, False])):
        values = host_ints(tensor)
        assert values == [int(v) for v in tensor.tolist()] and all(type(v) is int for v in values)
    assert host_ints(torch.tensor([], dtype=torch.float32)) == []
    assert sorted_capture_sizes((4, 1, 2)) == (1, 2, 4)
    assert sorted_capture_sizes(torch.tensor([8, 2])) == (2, 8)
    assert sorted_capture_sizes([4, 1, 2]) == (1, 2, 4)


def test_a_batch_without_out_cache_loc_is_read_as_no_slots_wide(model_dir: Path) -> None:
    """`tensor_width(None)`: a real ScheduleBatch before `prepare_for_extend` has no `out_cache_loc`; it writes no
    slot (the guard's `out_cache_loc_width` 0), where a 0-d tensor is one slot."""
    import torch

    from shim.releases.guard_reading import tensor_width

    pools = h.build_pools(h.make_server_args(model_dir, speculative_algorithm="EAGLE"))  # its own: pools publish it
    batch = h.new_batch(pools, [h.make_req("a", [1, 2, 3])])
    assert batch.out_cache_loc is None
    from statemodel.state import ForwardMode

    read = Adapter().observe_batch(batch, forward_mode=ForwardMode.EXTEND, spec_info=None)
    assert read.out_cache_loc_width == 0
    # its request holds no req_to_token row yet: read as holding no KV, none committed, nothing prefilled
    (req,) = Adapter().observe_requests(batch)
    assert (req.holds_kv, req.kv_committed, req.kv_allocated, req.kv_committed_len, req.prefilled_len) == \
        (False, 0, 0, 0, 0)
    assert tensor_width(torch.tensor(7)) == 1
    assert tensor_width(torch.zeros(5, dtype=torch.int64)) == 5


@pytest.mark.parametrize("chunk", [-1, 0, None])
def test_chunked_prefill_off_is_an_unbounded_chunk(eagle: Any, chunk: int | None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang turns chunked prefill off for `chunked_prefill_size` None or <= 0 (`Scheduler.init_chunked_prefill`:
    `chunked_prefill_size <= 0` -> None; `--chunked-prefill-size -1` is the documented off): a prefill batch then
    extends a whole prompt, so the model's `Scope.chunk_size` (tokens one prefill batch extends at most) is unbounded,
    not 1 token."""
    monkeypatch.setattr(guard_api, "_SWITCH", None)
    from sglang.srt.server_args import ServerArgs

    # -1 as an operator passes it (a real ServerArgs keeps it); 0 and None as a resolved record may hold them
    sa = ServerArgs(model_path=eagle.model_path, device="cpu", dtype="float32", attention_backend="torch_native",
                    skip_tokenizer_init=True, disable_cuda_graph=True, disable_overlap_schedule=True,
                    speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=1,
                    speculative_num_draft_tokens=4, chunked_prefill_size=-1) if chunk == -1 \
        else Changed(eagle, chunked_prefill_size=chunk)
    assert sa.chunked_prefill_size == chunk
    assert Adapter().scope(sa).chunk_size == NO_CAP


def _cuda_launch(model_dir: Path, *flags: str) -> Any:
    """Real 0.5.23 ServerArgs of a CUDA launch (lint's input: graphs on), resolved as lint reads them."""
    from sglang.srt.arg_groups.overrides import resolving_view

    from shim.releases import release_line

    sa = release_line("0.5.23").build_server_args([
        "--model-path", str(model_dir), "--speculative-draft-model-path", str(model_dir), "--device", "cuda",
        "--speculative-algorithm", "EAGLE", *flags])
    return sa, resolving_view(sa)


def test_lint_captures_the_sizes_sglangs_decode_runner_captures(model_dir: Path) -> None:
    """`_capture_bs` (`get_batch_sizes_to_capture`): sizes above the request pool are dropped and the pool's own size
    added; a pool of one request captures only 1; a size 0 is no graph (SGLang's runner asserts every captured size
    is positive)."""
    from shim.releases.v0_5_23 import _capture_bs

    _, cfg = _cuda_launch(model_dir, "--cuda-graph-bs-decode", "1", "2", "4", "--max-running-requests", "1")
    assert list(cfg.cuda_graph_config.decode.bs) == [1, 2, 4] and int(cfg.max_running_requests) == 1
    assert _capture_bs(cfg, 1) == [1]
    assert _capture_bs(cfg, 3) == [1, 2, 3]
    _, cfg = _cuda_launch(model_dir, "--cuda-graph-bs-decode", "0", "1", "2")
    assert list(cfg.cuda_graph_config.decode.bs) == [0, 1, 2]  # resolution keeps it
    assert _capture_bs(cfg, int(cfg.max_running_requests)) == [1, 2]


def test_lint_sizes_each_schedulers_request_pool_by_its_attention_dp_size(model_dir: Path) -> None:
    """A scheduler's request pool is `max_running_requests // attn_dp_size` (0.5.23 pool_configurator.py), which is
    what `get_batch_sizes_to_capture` clamps the sizes to: plain DP (`--dp-size 2`) runs whole schedulers, each with
    the full pool (attn_dp_size 1); DP attention splits it. `_capture_bs` divided by `dp_size` (found 2026-12-06 from
    the mutant `_capture_bs` 23, docs/mutation.md): [1, 2] and [1, 2, 4] here, each the other's answer."""
    from shim.releases.v0_5_23 import _capture_bs

    sizes = ("--max-running-requests", "4", "--cuda-graph-bs-decode", "1", "2", "4")
    _, plain_dp = _cuda_launch(model_dir, "--dp-size", "2", *sizes)
    assert (int(plain_dp.dp_size), int(plain_dp.attn_dp_size)) == (2, 1)
    assert _capture_bs(plain_dp, 4) == [1, 2, 4]
    _, dp_attention = _cuda_launch(model_dir, "--tp-size", "2", "--dp-size", "2", "--enable-dp-attention", *sizes)
    assert int(dp_attention.attn_dp_size) == 2
    assert _capture_bs(dp_attention, 4) == [1, 2]
    assert _capture_bs(dp_attention, 5) == [1, 2]  # 5 // 2: a pool of whole requests
    assert all(type(b) is int for b in _capture_bs(dp_attention, 5))


def test_dp_attention_is_named_on_the_view_resolution_keeps(model_dir: Path) -> None:
    """`--tp-size 2 --dp-size 2 --enable-dp-attention`: 0.5.23's resolved view (what the start-up hooks and the first
    step judge) says enable_dp_attention False and dp_size 1, and keeps the attention DP size (2) apart; the check read
    the flag alone, so the guard took a DP-attention server for one it checks (found 2026-12-07)."""
    chain = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
    sa, cfg = _cuda_launch(model_dir, *chain, "--tp-size", "2", "--dp-size", "2", "--enable-dp-attention")
    assert sa.enable_dp_attention and not cfg.enable_dp_attention and int(cfg.attn_dp_size) == 2
    assert Adapter().start_up_reason(sa) == "sglang 0.5.23: DP attention (--enable-dp-attention; not modelled)"
    _, plain_dp = _cuda_launch(model_dir, *chain, "--dp-size", "2")  # whole schedulers, each one the guard checks
    assert Adapter().unsupported_reason(plain_dp) is None


def test_lint_sizes_the_logits_rows_for_every_tiers_own_draft_tokens(model_dir: Path) -> None:
    """`_logits_rows` (ModelRunner.max_decode_logits_rows): the widest of the launch bound and each adaptive tier,
    each at its own draft-token count, not at the count published now."""
    from sglang.srt import runtime_context
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from shim.releases.v0_5_23 import _logits_rows

    sa, cfg = _cuda_launch(model_dir, "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                              "--speculative-num-draft-tokens", "4")
    runtime_context.publish(sa, role="scheduler")
    assert runtime_context.get_spec().speculative_num_draft_tokens == 4
    algo = SpeculativeAlgorithm.from_string("EAGLE")
    assert _logits_rows(cfg, algo, [1, 8], [], 4) == 8 * 4
    assert _logits_rows(cfg, algo, [1, 8], [2, 6], 4) == 8 * 6  # a tier wider than the launch
    assert _logits_rows(cfg, algo, [1, 8], [2, 3], None) == 8 * 3  # no launch bound: 1
    assert _logits_rows(cfg, algo, [1, 8], [], None) == 8 * 1
    assert _logits_rows(cfg, algo, [], [2, 6], 4) == 0  # graphs off


_FREE_GROUP_0_5_12 = """
import sys
sys.path.insert(0, "tests")
import sglang12_cpu as h12
h12.install_import_stand_ins()
from shim.releases.guard_reading import pending_free_slots
allocator = h12.build_pools(h12.make_server_args(h12.write_tiny_model_config()), kv_size=64).allocator
seen = [pending_free_slots(allocator)]
slots = allocator.alloc(4)
allocator.free_group_begin()
allocator.free(slots)
seen.append((pending_free_slots(allocator), allocator.available_size()))
allocator.free_group_end()
seen.append((pending_free_slots(allocator), allocator.available_size(), len(allocator.free_group)))
print(seen)
"""


def test_a_free_group_that_ended_queues_nothing_on_0_5_12() -> None:
    """`pending_free_slots` on a real 0.5.12 TokenToKVPoolAllocator (its `.venv12`, in a subprocess: one process holds
    one SGLang): inside a free group the queued slots count as free; after `free_group_end` the group's list outlives
    it (0.5.12 / 0.5.16 flag the group with `is_not_in_free_group` only), and nothing is pending."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    python = Path(sys.executable).parents[2] / ".venv12" / "bin" / "python"  # beside this interpreter's venv
    if not python.exists():
        pytest.skip(f"no {python} (bash scripts/setup-v1.sh)")
    env = dict(os.environ, PYTHONPATH=str(repo))
    env.pop("SPECFLIP_REQUIRE_SGLANG_V1", None)
    run = subprocess.run([str(python), "-c", _FREE_GROUP_0_5_12], cwd=repo, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "[0, (4, 60), (0, 64, 1)]"


def test_a_paused_or_absent_runtime_decides_nothing_at_start_up() -> None:
    """`before_init_model_worker` with no runtime (the guard not installed) or a paused one (its hooks installed but
    passing through: tests share one process) decides nothing, even for a server the model does not describe: no
    line, the guard not turned off; the first step decides (`guard`)."""
    from shim.guard.config import Mode
    from shim.guard.runtime import GuardRuntime

    scheduler = SimpleNamespace(server_args=SimpleNamespace(page_size=16), tp_rank=0)
    absent = Adapter()
    absent.runtime = None
    assert absent.before_init_model_worker(scheduler) is None
    paused = GuardRuntime(Mode.WARN)
    paused.paused = True
    _adapter_over(None, paused).before_init_model_worker(scheduler)
    assert (paused.decided, paused.disabled_reason, paused.metrics) == (False, None, None)


def test_a_free_group_counts_each_queued_slot_as_the_pool_will_free_it(model_dir: Path) -> None:
    """`pending_free_slots` on 0.5.23's real TokenToKVPoolAllocator (page size 1): inside a free group every queued
    index counts, as `free_group_end` will hand each to the free list (a slot freed twice is counted twice there), so
    the pool's reading (`observe_pool`: available + pending) is the same before and after the group ends; a double
    free then shows as more free slots than the pool holds, not hidden by the reading. After the group nothing is
    pending."""
    from shim.releases.guard_reading import pending_free_slots

    # its own server arguments: building pools publishes them (the module's `eagle` may be resolved by then)
    allocator = h.build_pools(h.make_server_args(model_dir, speculative_algorithm="EAGLE"), kv_size=64).allocator
    slots = allocator.alloc(4)
    available = allocator.available_size()
    allocator.free_group_begin()
    allocator.free(slots)
    allocator.free(slots[:1])  # a double free, queued again
    pending = pending_free_slots(allocator)
    assert allocator.available_size() == available
    allocator.free_group_end()
    assert (pending, allocator.available_size()) == (5, available + 5)
    assert pending_free_slots(allocator) == 0


_LINT_POOL_0_5_21 = """
import sys
from shim.releases import release_line
line = release_line("0.5.21")
model, sizes = sys.argv[1], sys.argv[2:]
launch = ["--model-path", model, "--speculative-draft-model-path", model, "--device", "cuda",
          "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", "4", "--cuda-graph-bs-decode", *sizes]
seen = []
for running in ("4", "5"):
    for widths in ([], ["--dp-size", "2"], ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"]):
        sa = line.build_server_args(launch + ["--max-running-requests", running, *widths])
        seen.append([list(state.graph_bs) for state in line.read_sizing(sa).states])
import sglang
print(sglang.__version__, seen)
"""


def test_lint_sizes_the_request_pool_on_a_line_without_attn_dp_size(model_dir: Path) -> None:
    """0.5.19-0.5.21 read with 0.5.23's lint (`_capture_bs`) keep `attn_dp_size` out of ServerArgs (in the parallel
    state: `derive_attention_widths`, the DP size under DP attention, else 1). On real 0.5.21 (its folders of
    .cache/sglang-lines, in a subprocess: one process holds one SGLang), a launch's decode graph sizes under plain DP
    keep the full pool and under DP attention take `max_running_requests // dp_size`, as 0.5.21's
    kv_cache_configurator sizes the pool."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    lines = repo / ".cache" / "sglang-lines"
    (row,) = [t.split() for t in (repo / "scripts" / "sglang-lines.txt").read_text().splitlines()
              if t.split()[:1] == ["0.5.21"]]
    folders = [lines / req.replace("==", "-") for req in row[2:]]
    if not all((f / ".specflip-installed").exists() for f in folders):
        pytest.skip("0.5.21 not in .cache/sglang-lines (bash scripts/setup-lines.sh)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, folders), str(repo / "stand_ins" / "cpu"),
                                                       str(repo)]))
    run = subprocess.run([sys.executable, "-c", _LINT_POOL_0_5_21, str(model_dir), "1", "2", "4"], cwd=repo,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    single, plain_dp, dp_attention = [[1, 2, 4]], [[1, 2, 4]], [[1, 2]]
    assert run.stdout.strip().splitlines()[-1] == \
        f"0.5.21 {[single, plain_dp, dp_attention, single, plain_dp, dp_attention]}"


def test_every_missing_hook_target_is_named_in_the_one_line() -> None:
    """`install` registers every hook or none: where targets are missing from this SGLang it registers nothing and
    returns one line naming each missing target with why it did not resolve (assert mode stops start-up with it:
    tests/test_guard_start_up.py)."""
    from shim.guard.config import Mode
    from shim.guard.runtime import GuardRuntime

    adapter = Adapter()
    adapter.TARGETS = (("sglang.srt.managers.scheduler.Scheduler.no_such_method", "BEFORE", "before_draft"),
                       *Adapter.TARGETS[:1],
                       ("sglang.srt.no_such_module.Thing.run", "AFTER", "before_draft"))
    runtime = GuardRuntime(Mode.WARN)
    assert adapter.install(runtime) == (
        "sglang 0.5.23: hook targets not found: sglang.srt.managers.scheduler.Scheduler.no_such_method "
        "(AttributeError), sglang.srt.no_such_module.Thing.run (AttributeError)")
    assert getattr(runtime, "adapter", None) is None
