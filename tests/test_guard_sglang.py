"""The guard inside real sglang 0.5.23 on CPU: hooks installed by SGLang's own load_plugins() through
the `sglang.srt.plugins` entry point, real ScheduleBatch / Req / allocator / EagleDraftInput /
EagleVerifyInput objects, only GPU forwards stood in (tests/guard_fixtures.py)."""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")

from shim.guard.core import Mode, SpecFlipViolation  # noqa: E402
from specflip.explain import explain_traces  # noqa: E402
from statemodel.designs import (  # noqa: E402
    ADAPTIVE_WARM,
    CATCH_UP,
    KNOWN_BAD,
    SEEDS_FINAL,
    SHIPPED,
    SYNC_V2,
    V2_SWITCH,
)

pytestmark = pytest.mark.sglang
REPO = Path(__file__).resolve().parents[1]




@pytest.fixture(params=[False, True], ids=["radix_off", "radix_on"])
def radix(request: pytest.FixtureRequest) -> bool:
    """The radix cache disabled, and enabled as a server runs by default: finished and prefilled requests'
    KV goes into the tree (EAGLE's bigram keys), requests sharing gf.SYSTEM_PROMPT hit it, releases of a
    step run inside one allocator free group."""
    return bool(request.param)


# how a live server prefills, for the shipped-design runs: radix cache off / on, prefill rounds of at most 16
# tokens (chunked prefill: the requests are 34-36 tokens long) or unlimited
SERVING = [pytest.param(False, None, id="radix_off"), pytest.param(True, None, id="radix_on"),
           pytest.param(False, 16, id="radix_off-chunked"), pytest.param(True, 16, id="radix_on-chunked")]


configure = gf.configure_guard


# --- the plugin, through SGLang's entry point --------------------------------------------------------------


def test_load_plugins_installs_hooks_through_the_entry_point(runtime: Any) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry

    adapter = runtime.adapter
    assert adapter.release == "0.5.23"
    for target, _, method in adapter.TARGETS:
        hooks = [hook for _, hook, _ in HookRegistry._hooks[target]]
        assert getattr(adapter, method) in hooks, target
        assert target in HookRegistry._patched, target


def test_real_prepare_for_decode_fires_the_hook(runtime: Any, model_dir: Path) -> None:
    configure(runtime, CATCH_UP)
    pools = h.build_pools(h.make_server_args(model_dir), kv_size=256)
    batch = h.prefill(pools, [h.make_req("solo", list(range(5)))])
    before = dict(runtime.guard.covered)
    batch.prepare_for_decode()  # the real method, patched by HookRegistry.apply_hooks
    assert runtime.guard.covered["prepare_for_decode"] == before.get("prepare_for_decode", 0) + 1
    assert runtime.guard.covered["merge_batch"] == 1  # the prefilled batch became the running batch


def test_mode_off_registers_no_hook() -> None:
    code = (
        "import sys; sys.path.insert(0, 'stand_ins/cpu');"
        "import sglang.srt.plugins as p; from sglang.srt.plugins.hook_registry import HookRegistry;"
        "p.load_plugins(); import shim.guard.runtime as r;"
        "print(r.current(), sum(1 for t in HookRegistry._hooks if 'specflip' in str(HookRegistry._hooks[t])))"
    )
    env = {"SPECFLIP_MODE": "off", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["None", "0"]


# --- shipped designs run clean -------------------------------------------------------------------------------


def run_threshold_scenario(drv: gf.DesignDriver, *, off_steps: int = 4, on_rounds: int = 4,
                           chunk_size: int | None = None) -> list[Any]:
    """Three requests on, a flip off, two more admitted while off, a flip on, all to the end. Every request
    leads with gf.SYSTEM_PROMPT; `chunk_size`: prefill in chunks of that many tokens. Returns the two requests
    admitted while off (with the radix cache on they hit the first three's prompt prefix)."""
    drv.admit_all(gf.make_reqs("a", 3, max_new_tokens=60, shared_prefix=gf.SYSTEM_PROMPT), chunk_size=chunk_size)
    for _ in range(on_rounds):
        drv.decode()
    drv.flip_off()
    for _ in range(off_steps):
        drv.decode()
    late = gf.make_reqs("b", 2, max_new_tokens=12, shared_prefix=gf.SYSTEM_PROMPT)
    drv.admit_all(late, chunk_size=chunk_size)
    for _ in range(off_steps):
        drv.decode()
    drv.flip_on()
    for _ in range(on_rounds):
        drv.decode(accepts=[4, 3, 1, 2, 4])
    drv.finish_and_filter()
    drv.run_to_completion()
    return late


def assert_served_as_configured(drv: gf.DesignDriver, late: list[Any], covered: dict[str, int], *, radix: bool,
                                chunk_size: int | None) -> None:
    """The run went the way its parameters say (the radix cache hit, the chunks happened: more prefill forwards
    than the two admissions) and ended with every slot back: free, or kept by the tree cache."""
    shared = len(gf.SYSTEM_PROMPT) - 1  # EAGLE's tree keys token pairs: a prefix of n tokens matches n - 1
    assert [r.num_matched_prefix_tokens >= shared for r in late] == [radix] * len(late)
    assert (h.tree_held(drv.pools) > 0) == radix
    assert (covered["prefill"] > 2) == (chunk_size is not None)
    assert not drv.batch.reqs and not drv.waiting and drv.chunked_req is None and gf.pool_accounted(drv.pools)


@pytest.mark.parametrize(("radix", "chunk_size"), SERVING)
@pytest.mark.parametrize("design", [CATCH_UP, SYNC_V2, SEEDS_FINAL], ids=lambda d: d.name)
def test_threshold_design_runs_clean(runtime: Any, model_dir: Path, design: Any, radix: bool,
                                     chunk_size: int | None) -> None:
    configure(runtime, design)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), design)
    late = run_threshold_scenario(drv, chunk_size=chunk_size)
    covered = runtime.guard.covered
    for name in ("prefill", "merge_batch", "prepare_for_decode", "draft", "verify", "draft_extend", "flip_off",
                 "plain_decode", "flip_on", "finish", "filter_batch"):
        assert covered.get(name, 0) > 0, (name, covered)
    assert covered.get("draft_sync" if design.draft_while_off.value == "sync_every_step" else "draft_catch_up")
    assert_served_as_configured(drv, late, covered, radix=radix, chunk_size=chunk_size)


def test_adaptive_design_runs_clean(runtime: Any, model_dir: Path, radix: bool) -> None:
    configure(runtime, ADAPTIVE_WARM)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), ADAPTIVE_WARM)
    drv.admit(gf.make_reqs("a", 3, max_new_tokens=40, shared_prefix=gf.SYSTEM_PROMPT))
    for steps in (3, 1, 0, 0, 2, 3, 0, 1):
        gf.set_steps(drv.worker, steps)
        drv.decode(accepts=[steps + 1, 1, 2])
        drv.finish_and_filter()
    covered = runtime.guard.covered
    assert covered["draft"] == 8 and covered["draft_extend"] == 8 and "skip_draft_extend" not in covered


def test_requests_finishing_at_their_prefill_run_clean(runtime: Any, model_dir: Path, radix: bool) -> None:
    """A request done at its first token (max_new_tokens 1, or a stop at once) is released inside the prefill's
    result processing, after the unfinished requests of its batch went into the tree: with a batch running and
    with none."""
    configure(runtime, V2_SWITCH)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), V2_SWITCH)
    prompt = gf.SYSTEM_PROMPT
    one = [h.make_req(f"one{i}", prompt + [300 + i] * (i + 2), max_new_tokens=1) for i in range(3)]
    drv.admit([*gf.make_reqs("a", 2, max_new_tokens=10, shared_prefix=prompt), one[0]])
    drv.decode()
    drv.admit([*gf.make_reqs("b", 1, max_new_tokens=10, shared_prefix=prompt), one[1]])
    for _ in range(20):
        if not drv.batch.reqs:
            break
        drv.decode()
        drv.finish_and_filter()
    assert not drv.batch.reqs
    drv.admit([one[2], *gf.make_reqs("c", 1, max_new_tokens=6, shared_prefix=prompt)])  # nothing runs
    for _ in range(20):
        if not drv.batch.reqs:
            break
        drv.decode()
        drv.finish_and_filter()
    assert [len(r.output_ids) for r in one] == [1, 1, 1] and not any(r.kv.holds_kv for r in one)
    assert runtime.guard.covered["finish"] == 7
    assert not drv.batch.reqs and gf.pool_accounted(drv.pools)

@pytest.mark.parametrize("design", [V2_SWITCH, CATCH_UP], ids=lambda d: d.name)
def test_requests_finishing_mid_round_run_clean(runtime: Any, model_dir: Path, radix: bool, design: Any) -> None:
    """Two requests one token short of max_new_tokens accept two tokens in one verify (the H200's
    seq_lens_growth at a request's finish): the v2 worker moves seq_lens and kv_committed_len by the whole run,
    one token past the last output, and the first request's release settles the round while the second has its
    KV committed but is not finished yet."""
    configure(runtime, design)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), design)
    reqs = gf.make_reqs("m", 2, max_new_tokens=6, shared_prefix=gf.SYSTEM_PROMPT)
    drv.admit(reqs)
    prompts = [len(r.origin_input_ids) for r in reqs]
    for _ in range(2):  # 1 token from the prefill, 2 per round: 5 outputs, both running
        drv.decode(accepts=[2, 2])
    # the KV holds the prompt and every output but the newest (the next round's input)
    assert [r.kv.kv_committed_len for r in reqs] == [p + 4 for p in prompts] and not any(r.finished() for r in reqs)
    drv.decode(accepts=[2, 2])  # 7 outputs, 6 allowed: both finish in this round
    assert all(r.finished() and r.finished_len == 6 and len(r.output_ids) == 7 and not r.kv.holds_kv for r in reqs)
    # the whole run went into the KV: the 6th output's too, which a capped verify (v1) would not have written
    assert [r.kv.kv_committed_len for r in reqs] == [p + 6 for p in prompts]
    drv.finish_and_filter()
    covered = runtime.guard.covered
    assert covered["verify"] == 3 and covered["finish"] == 2 and covered["filter_batch"] == 1
    assert not drv.batch.reqs and gf.pool_accounted(drv.pools)



@pytest.mark.parametrize("spec_on", [True, False], ids=["spec_on", "spec_off"])
def test_retraction_and_prefill_again_run_clean(runtime: Any, model_dir: Path, radix: bool, spec_on: bool) -> None:
    """The real ScheduleBatch.retract_decode (what update_running_batch does when the pool runs short) releases a
    request's KV without caching it; the scheduler prefills it again later, its prompt and outputs so far. With
    the radix cache on, that prefill hits what the tree kept of it."""
    configure(runtime, V2_SWITCH)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), V2_SWITCH)
    drv.admit(gf.make_reqs("r", 3, max_new_tokens=30, shared_prefix=gf.SYSTEM_PROMPT))
    for _ in range(3):
        drv.decode()
    if not spec_on:
        drv.flip_off()
        drv.decode()
    with h.patch_assign_req_to_token_pool():
        retracted, _, aborted = drv.batch.retract_decode()
    assert retracted and not aborted and all(not r.kv.holds_kv for r in retracted)
    outputs = [len(r.output_ids) for r in retracted]
    drv.decode()
    drv.admit(retracted)
    hit = [r.num_matched_prefix_tokens for r in retracted]
    assert [n >= len(r.origin_input_ids) - 1 for n, r in zip(hit, retracted, strict=True)] == [radix] * len(hit)
    if not spec_on:
        drv.decode()
        drv.flip_on()
    drv.run_to_completion(40)
    assert runtime.guard.covered["retract"] == len(retracted)
    assert all(len(r.output_ids) >= n for r, n in zip(retracted, outputs, strict=True))
    assert not drv.batch.reqs and gf.pool_accounted(drv.pools)


def test_tree_eviction_under_pool_pressure_runs_clean(runtime: Any, model_dir: Path) -> None:
    """A full pool with the radix cache on: the allocator evicts finished requests' KV from the tree to serve the
    running ones (alloc_token_slots -> evict), through flips."""
    configure(runtime, V2_SWITCH)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=True, kv_size=256), V2_SWITCH)
    tree = drv.pools.tree_cache
    evict_for_alloc, evicted = tree.evict_for_alloc, []

    def counting_evict_for_alloc(*args: Any, **kwargs: Any) -> Any:  # the real method, its effect counted
        before = tree.evictable_size()
        result = evict_for_alloc(*args, **kwargs)
        evicted.append(before - tree.evictable_size())
        return result

    tree.evict_for_alloc = counting_evict_for_alloc

    def run_out() -> None:
        for _ in range(30):
            if not drv.batch.reqs:
                return
            drv.decode()
            drv.finish_and_filter()

    drv.admit(gf.make_reqs("a", 3, max_new_tokens=20, shared_prefix=gf.SYSTEM_PROMPT))
    run_out()
    assert tree.evictable_size() > 0 and not sum(evicted)
    drv.admit([h.make_req(f"w{i}", [500 + i] * 40, max_new_tokens=20) for i in range(3)])  # no prefix in the tree
    drv.flip_off()
    for _ in range(3):
        drv.decode()
    drv.flip_on()
    run_out()
    assert sum(evicted) > 0  # the first wave's KV made room for the second's
    assert not drv.batch.reqs and gf.pool_accounted(drv.pools)


def test_shipped_designs_are_all_driven() -> None:
    # plain_off_retract_catch_up: switch_v2's retract mode through the overlap loop (tests/test_switch_retract.py);
    # plain_off_retract_catch_up_auto: SPECFLIP_SWITCH=auto through the same loop (tests/test_switch_auto.py);
    # plain_off_retract_catch_up_tiers: SPECFLIP_TIERS through the same loop (tests/test_switch_tiers.py);
    # plain_off_retract_catch_up_radix: the default keep_out with the radix cache on, the guard's tree check beside
    # its reference design (tests/test_switch_retract.py, tests/test_guard_tree_draft.py)
    driven = {CATCH_UP.name, SYNC_V2.name, SEEDS_FINAL.name, ADAPTIVE_WARM.name, V2_SWITCH.name,
              "plain_off_retract_catch_up", "plain_off_retract_catch_up_auto", "plain_off_retract_catch_up_tiers",
              "plain_off_retract_catch_up_radix"}
    assert {d.name for d in SHIPPED} <= driven, "a shipped design has no real-object run"


# --- every known-bad design, injected into the real objects ----------------------------------------------------

BAD = {d.name: d for d in KNOWN_BAD}
# the shipped design each bug claims to implement: the guard's reference design for that run
CLAIMS = {
    "seeds_final_verify_graphs_only": SEEDS_FINAL, "seeds_attempt1_spec_info_left": SEEDS_FINAL,
    "seeds_attempt2_tuple_unpack": SEEDS_FINAL, "clear_on_scheduler_batch": SEEDS_FINAL,
    "zero_steps_skip_draft_extend": ADAPTIVE_WARM, "kv_reserve_by_current_steps": ADAPTIVE_WARM,
    "draft_kv_never_freed": ADAPTIVE_WARM, "merge_unchecked_spec_info": CATCH_UP,
    "reenable_above_spec_cap": CATCH_UP, "no_draft_work_while_off": CATCH_UP, "seq_lens_advanced_twice": CATCH_UP,
}


def test_every_known_bad_design_has_an_injection() -> None:
    assert set(BAD) == set(CLAIMS), "a known-bad design is not injected into real objects"


def _expect(name: str, excinfo: pytest.ExceptionInfo[SpecFlipViolation]) -> SpecFlipViolation:
    exc = excinfo.value
    assert exc.invariant == BAD[name].expected_invariant, str(exc)
    assert exc.rank == 0 and exc.action and exc.rids
    assert f"{exc.invariant} broken by" in str(exc) and "TP rank 0" in str(exc) and "last transitions:" in str(exc)
    return exc


def _calls() -> dict[str, int]:
    return dict(gf.STAND_IN_CALLS)


def _seeds_driver(runtime: Any, model_dir: Path, radix: bool, bug: str, n: int = 3) -> gf.DesignDriver:
    configure(runtime, CLAIMS[bug])
    design = BAD[bug]
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), design, bug=bug)
    drv.admit(gf.make_reqs("s", n, shared_prefix=gf.SYSTEM_PROMPT))
    drv.decode()
    drv.decode()
    drv.flip_off()
    return drv


@pytest.mark.parametrize("bug", ["seeds_attempt1_spec_info_left", "seeds_final_verify_graphs_only",
                                 "seeds_attempt2_tuple_unpack"])
def test_seeds_plain_step_bugs_caught_before_the_target_forward(runtime: Any, model_dir: Path, radix: bool,
                                                                 bug: str) -> None:
    drv = _seeds_driver(runtime, model_dir, radix, bug, n=2 if bug == "seeds_attempt2_tuple_unpack" else 3)
    calls = _calls()
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.decode()
    exc = _expect(bug, excinfo)
    assert exc.action == "plain_decode"
    assert gf.STAND_IN_CALLS.get("target_forward", 0) == calls.get("target_forward", 0)  # never ran


def test_seeds_messages_give_plain_numbers(runtime: Any, model_dir: Path) -> None:
    drv = _seeds_driver(runtime, model_dir, False, "seeds_attempt2_tuple_unpack", n=2)
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.decode()
    assert "out_cache_loc holds 1 slots; a DECODE step of 2 requests x 1 writes 2" in str(excinfo.value)
    assert "'s0'" in str(excinfo.value) and "'s1'" in str(excinfo.value)


def test_clear_on_scheduler_batch_caught_before_the_draft(runtime: Any, model_dir: Path, radix: bool) -> None:
    drv = _seeds_driver(runtime, model_dir, radix, "clear_on_scheduler_batch")
    drv.decode()
    drv.decode()  # plain steps: the ScheduleBatch loses its EagleDraftInput
    drv.flip_on()
    calls = _calls()
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.decode()
    assert _expect("clear_on_scheduler_batch", excinfo).action == "draft"
    assert gf.STAND_IN_CALLS.get("draft", 0) == calls.get("draft", 0)


def test_zero_steps_skip_draft_extend_caught_at_the_upshift(runtime: Any, model_dir: Path, radix: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.environ import envs

    monkeypatch.setenv(envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.name, "1")
    configure(runtime, ADAPTIVE_WARM)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), BAD["zero_steps_skip_draft_extend"])
    drv.admit(gf.make_reqs("z", 3, shared_prefix=gf.SYSTEM_PROMPT))
    gf.set_steps(drv.worker, 0)
    drv.decode(accepts=[1, 1, 1])  # steps 0: trivial verify, draft-extend skipped (the real stub runs)
    gf.set_steps(drv.worker, 2)
    calls = _calls()
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.decode()
    assert _expect("zero_steps_skip_draft_extend", excinfo).action == "draft"
    assert runtime.guard.covered.get("skip_draft_extend") == 1
    assert gf.STAND_IN_CALLS.get("draft", 0) == calls.get("draft", 0)


def test_kv_reserve_by_current_steps_caught_before_the_draft(runtime: Any, model_dir: Path, radix: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.speculative import eagle_utils

    configure(runtime, ADAPTIVE_WARM)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), BAD["kv_reserve_by_current_steps"], num_steps=1)
    # the bug: the reserve follows the step count current at prepare_for_decode (PR #24055)
    monkeypatch.setattr(eagle_utils, "get_alloc_reserve_per_decode", lambda: drv.worker.speculative_num_steps + 1)
    drv.admit(gf.make_reqs("k", 3, shared_prefix=gf.SYSTEM_PROMPT))
    drv.decode(accepts=[2, 2, 2])
    with h.patch_assign_req_to_token_pool():
        drv.batch.prepare_for_decode()  # reserves for steps 1
    gf.set_steps(drv.worker, 3)  # the adaptive controller switches after prepare_for_decode
    drv.worker.accept_lens_cpu_stand_in = [4, 4, 4]
    calls = _calls()
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.worker.forward_batch_generation(drv.batch)
    assert _expect("kv_reserve_by_current_steps", excinfo) and "writes 4 tokens per request" in str(excinfo.value)
    assert gf.STAND_IN_CALLS.get("verify", 0) == calls.get("verify", 0)


def test_merge_unchecked_spec_info_caught_before_the_merge(runtime: Any, model_dir: Path, radix: bool) -> None:
    configure(runtime, CATCH_UP)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), BAD["merge_unchecked_spec_info"])
    drv.admit(gf.make_reqs("m", 2, shared_prefix=gf.SYSTEM_PROMPT))
    drv.decode()
    drv.flip_off()
    late = drv.prefill(gf.make_reqs("late", 2, shared_prefix=gf.SYSTEM_PROMPT))  # prefilled while off: no draft input
    drv.flip_on()
    late.forward_mode = late.forward_mode.DECODE
    rows_before = len(drv.batch.reqs)
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.batch.merge_batch(late)
    _expect("merge_unchecked_spec_info", excinfo)
    assert len(drv.batch.reqs) == rows_before  # raised before ScheduleBatch.merge_batch ran


def test_draft_kv_never_freed_caught_at_finish(runtime: Any, model_dir: Path, radix: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.mem_cache import common

    configure(runtime, ADAPTIVE_WARM)
    monkeypatch.setattr(common, "_release_overallocated_kv_indices", lambda *a, **k: None)  # the leak
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), BAD["draft_kv_never_freed"])
    drv.admit(gf.make_reqs("f", 2, max_new_tokens=6, shared_prefix=gf.SYSTEM_PROMPT))
    calls = _calls()
    with pytest.raises(SpecFlipViolation) as excinfo:
        for _ in range(6):
            drv.decode(accepts=[4, 4])
            drv.finish_and_filter()
    assert _expect("draft_kv_never_freed", excinfo).action == "finish"
    assert "leaked" in str(excinfo.value)
    assert gf.STAND_IN_CALLS.get("draft", 0) - calls.get("draft", 0) <= 2  # caught at the release, no later


def test_reenable_above_spec_cap_caught_at_the_flip(runtime: Any, model_dir: Path, radix: bool) -> None:
    configure(runtime, CATCH_UP, spec_cap=2, plain_cap=4)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), BAD["reenable_above_spec_cap"])
    drv.admit(gf.make_reqs("c", 2, shared_prefix=gf.SYSTEM_PROMPT))
    drv.decode()
    drv.flip_off()
    drv.admit(gf.make_reqs("d", 1, shared_prefix=gf.SYSTEM_PROMPT))
    drv.decode()
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.flip_on()
    assert _expect("reenable_above_spec_cap", excinfo).action == "flip_on"
    assert "3 requests run with speculation on; that mode holds at most 2" in str(excinfo.value)


def test_no_draft_work_while_off_caught_before_the_draft(runtime: Any, model_dir: Path, radix: bool) -> None:
    configure(runtime, CATCH_UP)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), BAD["no_draft_work_while_off"],
                          bug="no_draft_work_while_off")
    drv.admit(gf.make_reqs("n", 3, shared_prefix=gf.SYSTEM_PROMPT))
    drv.decode()
    drv.flip_off()
    drv.decode()
    drv.decode()
    drv.flip_on()  # no catch-up
    calls = _calls()
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.decode()
    assert _expect("no_draft_work_while_off", excinfo).action == "draft"
    assert gf.STAND_IN_CALLS.get("draft", 0) == calls.get("draft", 0)


def test_seq_lens_advanced_twice_caught_before_the_target_forward(runtime: Any, model_dir: Path, radix: bool) -> None:
    configure(runtime, CATCH_UP)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), BAD["seq_lens_advanced_twice"],
                          bug="seq_lens_advanced_twice")
    drv.admit(gf.make_reqs("t", 3, shared_prefix=gf.SYSTEM_PROMPT))
    drv.decode()
    drv.flip_off()
    calls = _calls()
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.decode()
    assert _expect("seq_lens_advanced_twice", excinfo).action == "plain_decode"
    assert gf.STAND_IN_CALLS.get("target_forward", 0) == calls.get("target_forward", 0)


# --- warn mode, internal errors, trace + explain -------------------------------------------------------------


def test_warn_mode_logs_and_never_raises(runtime: Any, model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    configure(runtime, CATCH_UP, mode=Mode.WARN)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), BAD["seq_lens_advanced_twice"], bug="seq_lens_advanced_twice")
    drv.admit(gf.make_reqs("w", 3))
    drv.flip_off()
    with caplog.at_level(logging.WARNING, logger="specflip.guard"):
        for _ in range(5):
            drv.decode()  # the bug repeats every step
    found = [v.invariant for _, vs in runtime.guard.found for v in vs]
    assert found.count("seq_lens_growth") >= 5
    warned = [r for r in caplog.records if "seq_lens_growth broken by" in r.getMessage()]
    assert len(warned) == 1  # rate-limited: one report per invariant per interval (the totals lines are counts)


def test_an_error_inside_the_guard_never_propagates_in_warn_mode(runtime: Any, model_dir: Path,
                                                                 caplog: pytest.LogCaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    configure(runtime, CATCH_UP, mode=Mode.WARN)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), CATCH_UP)
    drv.admit(gf.make_reqs("e", 2))

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("bug in the guard")

    monkeypatch.setattr(runtime.guard, "prepare_for_decode", broken)
    errors = runtime.internal_errors  # a process-wide count: a test run before this one may have counted some
    with caplog.at_level(logging.WARNING, logger="specflip.guard"):
        for _ in range(3):
            drv.decode()  # serving goes on
    assert runtime.disabled_reason and runtime.internal_errors == errors + 1
    assert sum("internal error" in r.getMessage() for r in caplog.records) >= 1


@pytest.mark.parametrize(("radix", "chunk_size"), [SERVING[0], SERVING[3]])
def test_trace_of_a_clean_run_conforms_and_covers_the_flip(runtime: Any, model_dir: Path, tmp_path: Path,
                                                          radix: bool, chunk_size: int | None) -> None:
    trace = tmp_path / "clean.jsonl"
    configure(runtime, SYNC_V2, mode=Mode.TRACE, trace=trace)
    run_threshold_scenario(gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), SYNC_V2),
                           chunk_size=chunk_size)
    runtime.reset()
    report = explain_traces([trace])
    assert report.conforms, report.render()
    for name in ("flip_off", "plain_decode", "draft_sync", "flip_on", "draft", "verify", "draft_extend", "finish"):
        assert report.covered.get(name), name


def test_trace_of_a_bad_run_names_the_first_illegal_step(runtime: Any, model_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "bad.jsonl"
    configure(runtime, CATCH_UP, mode=Mode.TRACE, trace=trace)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), BAD["no_draft_work_while_off"], bug="no_draft_work_while_off")
    drv.admit(gf.make_reqs("x", 2))
    drv.decode()
    drv.flip_off()
    drv.decode()
    drv.flip_on()
    drv.decode()  # trace mode: logged, not raised
    runtime.reset()
    report = explain_traces([trace])
    assert not report.conforms
    first = report.first_illegal[0]
    assert first.action == "draft" and first.violations[0].invariant == "draft_kv_covers_prefix"
    assert set(first.rids) == {"x0", "x1"}


# --- no GPU synchronisation ------------------------------------------------------------------------------------------


def test_adapter_reads_no_device_tensor_values(runtime: Any, model_dir: Path) -> None:
    """Every device-side tensor of a real batch moved to the meta device (shapes, no values: any
    .item()/.tolist()/.cpu() on them raises); the adapter's observations must not change."""
    import torch

    from shim.releases.guard_reading import HostReadError, host_ints

    configure(runtime, CATCH_UP)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), CATCH_UP)
    drv.admit(gf.make_reqs("g", 3))
    drv.decode()
    with h.patch_assign_req_to_token_pool():
        drv.batch.prepare_for_decode()
    adapter = runtime.adapter
    batch = drv.batch
    expected = (adapter.observe_batch(batch), adapter.observe_requests(batch), adapter.batch_pool(batch))
    for name in ("seq_lens", "req_pool_indices", "out_cache_loc", "input_ids", "orig_seq_lens"):
        value = getattr(batch, name, None)
        if isinstance(value, torch.Tensor):
            setattr(batch, name, value.to("meta"))
    spec = batch.spec_info
    for name in ("topk_p", "topk_index", "hidden_states", "bonus_tokens"):
        setattr(spec, name, getattr(spec, name).to("meta"))
    assert (adapter.observe_batch(batch), adapter.observe_requests(batch), adapter.batch_pool(batch)) == expected
    with pytest.raises(HostReadError):
        host_ints(torch.zeros(3, device="meta"))



# --- shim/switch/v2.py (v2_switch_reserve_sync): spec-off steps through the real switch code ------------------


def _outputs(drv: gf.DesignDriver) -> dict[str, int]:
    return {r.rid: len(r.output_ids) for r in drv.batch.reqs}


def _v2_plain_steps(drv: gf.DesignDriver, count: int) -> None:
    """Plain steps of the switch; each must commit exactly one token per request, keep the draft input and
    the speculative algorithm on the ScheduleBatch (the _forward_isolation restore + the scheduler's settle)."""
    for _ in range(count):
        before = _outputs(drv)
        calls = _calls()
        drv.decode()
        assert _outputs(drv) == {rid: n + 1 for rid, n in before.items()}
        assert gf.STAND_IN_CALLS["target_forward"] == calls.get("target_forward", 0) + 1
        assert gf.STAND_IN_CALLS["draft_extend"] == calls.get("draft_extend", 0) + 1  # the draft sync
        batch = drv.batch
        assert batch.spec_info is not None and batch.spec_info.is_draft_input()
        assert not batch.spec_algorithm.is_none()
        assert batch.seq_lens_cpu.tolist() == [r.kv.kv_committed_len for r in batch.reqs]


@pytest.mark.parametrize(("radix", "chunk_size"), SERVING)
def test_v2_switch_runs_clean(runtime: Any, model_dir: Path, radix: bool, chunk_size: int | None) -> None:
    configure(runtime, V2_SWITCH)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), V2_SWITCH)
    assert drv.switch is not None and drv.switch.config.design_name == V2_SWITCH.name
    drv.admit_all(gf.make_reqs("a", 3, max_new_tokens=60, shared_prefix=gf.SYSTEM_PROMPT), chunk_size=chunk_size)
    for _ in range(4):
        drv.decode()
    drv.flip_off()
    assert all(r.kv.kv_allocated_len > r.kv.kv_committed_len for r in drv.batch.reqs)  # reserve kept
    _v2_plain_steps(drv, 4)
    late = gf.make_reqs("b", 2, max_new_tokens=12, shared_prefix=gf.SYSTEM_PROMPT)
    drv.admit_all(late, chunk_size=chunk_size)  # prefilled while off: with its draft input
    _v2_plain_steps(drv, 4)
    drv.flip_on()
    for _ in range(4):
        drv.decode(accepts=[4, 3, 1, 2, 4])
    drv.finish_and_filter()
    drv.run_to_completion()
    covered = runtime.guard.covered
    for name in ("prefill", "merge_batch", "prepare_for_decode", "draft", "verify", "draft_extend", "flip_off",
                 "plain_decode", "draft_sync", "flip_on", "finish", "filter_batch"):
        assert covered.get(name, 0) > 0, (name, covered)
    assert covered["plain_decode"] == covered["draft_sync"] == 8 and "draft_catch_up" not in covered
    assert sum(drv.switch.counters.values()) == 8  # every plain step ran through switch_v2.plain_decode
    assert_served_as_configured(drv, late, covered, radix=radix, chunk_size=chunk_size)


def test_v2_switch_spec_info_left_on_launch_caught_before_the_target_forward(runtime: Any, model_dir: Path,
                                                                              radix: bool) -> None:
    configure(runtime, V2_SWITCH)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), V2_SWITCH, bug="v2_spec_info_left_on_launch")
    drv.admit(gf.make_reqs("v", 3, shared_prefix=gf.SYSTEM_PROMPT))
    drv.decode()
    drv.flip_off()
    calls = _calls()
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.decode()
    exc = excinfo.value
    # the seeds' attempt 1 is the same bug on the v1 line: the model names the invariant it breaks
    assert exc.invariant == BAD["seeds_attempt1_spec_info_left"].expected_invariant, str(exc)
    assert exc.action == "plain_decode" and set(exc.rids) == {"v0", "v1", "v2"}
    assert gf.STAND_IN_CALLS.get("target_forward", 0) == calls.get("target_forward", 0)  # never ran


def test_v2_switch_without_the_isolation_restore_differs_only_in_out_cache_loc(runtime: Any,
                                                                                model_dir: Path) -> None:
    """Without _forward_isolation the plain step is not caught, rightly: the switch's draft_sync puts back
    seq_lens / spec_algorithm / forward_mode itself and the scheduler re-applies spec_info and seq_lens; what
    stays behind is the draft-extend's out_cache_loc, which the speculative path never reads."""
    import dataclasses

    import torch

    fields = {}
    for bug in (None, "v2_plain_step_not_restored"):
        configure(runtime, V2_SWITCH)
        drv = gf.DesignDriver(gf.eagle_pools(model_dir), V2_SWITCH, bug=bug)
        drv.admit(gf.make_reqs("r", 3))
        drv.decode()
        drv.flip_off()
        _v2_plain_steps(drv, 2)
        fields[bug] = {f.name: getattr(drv.batch, f.name) for f in dataclasses.fields(drv.batch)}
    differs = {name for name, value in fields[None].items() if isinstance(value, torch.Tensor)
               and not torch.equal(value, fields["v2_plain_step_not_restored"][name])}
    assert differs == {"out_cache_loc"}


def test_v2_switch_flip_tells_the_guard(runtime: Any, model_dir: Path) -> None:
    from shim.switch import v2 as switch_v2

    configure(runtime, V2_SWITCH)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), V2_SWITCH)
    drv.admit(gf.make_reqs("f", 3))
    drv.decode()
    t_off = drv.switch.config.t_off
    scheduler = gf.SchedulerCpuStandIn(running_batch=drv.batch, waiting_queue=gf.make_reqs("w", t_off - 3))
    assert switch_v2.flip(drv.switch, scheduler, drv.batch) == "flip_off"  # demand reached t_off
    assert runtime.guard.covered.get("flip_off") == 1
    drv.spec_on = False
    _v2_plain_steps(drv, 1)  # the guard judges it as a spec-off step
    assert runtime.guard.covered["plain_decode"] == 1
