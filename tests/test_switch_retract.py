"""shim/switch/v2.py's draft mode "retract" (design plain_off_retract_catch_up) under SGLang 0.5.23's overlap schedule,
on real objects (tests/overlap_loop.py): speculation off is SGLang's own plain scheduler path, flip-on retracts every
running and prefilled request, whose re-prefill with speculation is the draft's catch-up. The real `_next_batch_around`
hook and `plain_path_flip` decide and flip at the top of get_next_batch_to_run, with the switch's own policy; the
guard runs in assert mode (any finding raises)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")
ol = importlib.import_module("overlap_loop")

from shim.guard import api as guard_api  # noqa: E402
from shim.guard.core import Mode, SpecFlipViolation  # noqa: E402
from shim.switch import v2 as switch_v2  # noqa: E402
from shim.switch.v2 import SwitchConfig  # noqa: E402
from statemodel.designs import DESIGNS_BY_NAME, get_design  # noqa: E402

RETRACT = get_design("plain_off_retract_catch_up")
# under the overlap loop the guard checks the design's overlap variant where the catalogue has one
GUARD_DESIGN = DESIGNS_BY_NAME.get(f"{RETRACT.name}_overlap", RETRACT)
# arrivals (iteration: max_new_tokens per request): each wave crosses t_off; the long request of a wave outlives it,
# so demand falls to t_on with it still running (a retraction) and the next wave finds it speculating (a flip-off
# with its verify in flight, whose reserve is released)
WAVES = {0: [6, 9, 14, 20, 50], 30: [5, 8, 12, 17], 50: [3, 7, 11, 16, 40]}

pytestmark = pytest.mark.sglang




def configure(rt: Any) -> None:
    gf.configure_guard(rt, RETRACT)


cycle = gf.accept_cycle


def driver(model_dir: Path, *, t_on: int = 1, radix: bool = False, radix_mode: str = "insert") -> Any:
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir, radix_cache=radix), RETRACT,
                           switch_config=SwitchConfig(t_off=4, t_on=t_on, draft_while_off="retract", radix=radix_mode))
    drv.accepts = cycle([4, 1, 3, 2])
    return drv


def run_waves(drv: Any, iterations: int = 80) -> list[Any]:
    """The WAVES workload to the end of its arrivals, then drained; returns every request."""
    reqs: list[Any] = []
    for it in range(iterations):
        if it in WAVES:
            wave = [h.make_req(f"w{it}_{i}", gf.SYSTEM_PROMPT + [200 + len(reqs) + i] * (3 + i), max_new_tokens=m)
                    for i, m in enumerate(WAVES[it])]
            reqs += wave
            drv.add(wave)
        drv.iteration()
    drv.run_until_idle()
    return reqs


def not_greedy(reqs: list[Any]) -> list[str]:
    """Requests whose output is not the stand-in model's greedy one, or is short of max_new_tokens."""
    return [str(r.rid) for r in reqs if not r.finished() or list(r.output_ids) != ol.expected_output(r)
            or len(r.output_ids) < r.sampling_params.max_new_tokens]


def free_list_exact(pools: Any) -> bool:
    """Every slot back exactly once: the allocator's free list (free_pages + release_pages) holds distinct slots of
    1..size (0 is the padding slot), and with the tree's slots they are the whole pool. Stricter than a count
    (gf.pool_accounted): a slot leaked and another freed twice balance in the count."""
    import torch

    alloc = pools.allocator
    free = torch.cat([alloc.free_pages, alloc.release_pages]).tolist()
    return len(set(free)) == len(free) and all(1 <= s <= alloc.size for s in free) \
        and len(free) + h.tree_held(pools) == alloc.size


def events(drv: Any, action: str) -> list[dict[str, Any]]:
    return [e for e in drv.switch.trace.events if e["action"] == action]


def spec_on_at(drv: Any, iteration: int) -> bool:
    """Whether speculation was on for the step launched in `iteration` (the switch flips at the top of it)."""
    on = True
    for it, action in drv.flips:
        if it <= iteration:
            on = action == "flip_on"
    return on


@pytest.mark.parametrize("radix", [False, "keep_out", "insert"], ids=["radix_off", "radix_on", "radix_on_insert"])
def test_flips_both_ways_greedy_exact_no_leak(runtime: Any, model_dir: Path, radix: bool | str) -> None:
    """Three waves cross t_off = 4 and fall back to t_on = 1: the switch flips off (a verify in flight drained
    first, its reserve released, the running batch's seq_lens rebuilt) and on (the running request retracted and
    re-prefilled with speculation) three times each. Every output is the greedy one, every plain step got its input
    token through the future map's plain relay, every slot is back, and the guard found nothing. With SGLang's own
    tree (`SPECFLIP_SWITCH_RADIX=insert`, warn mode) it finds only what that tree does wrong: re-prefills after
    flip-on that hit prompts cached while off (draft_kv_covers_prefix, issue 24); serving goes on."""
    gf.configure_guard(runtime, RETRACT, mode=Mode.WARN if radix == "insert" else None)
    drv = driver(model_dir, radix=bool(radix), radix_mode=radix if isinstance(radix, str) else "insert")
    fm, target = drv.future_map, drv.worker.target_worker.model_runner
    verify_graphs = target.decode_cuda_graph_runner
    start = drv.pools.available_size()
    reqs = run_waves(drv)
    guard = runtime.guard
    assert guard.config.design.name == GUARD_DESIGN.name and guard.config.scope.overlap
    if radix == "insert":
        assert guard.found and {v.invariant for _, found in guard.found for v in found} == {"draft_kv_covers_prefix"}
    else:
        assert guard.found == []
    assert not guard.state.unprocessed
    assert not_greedy(reqs) == [] and drv.wrong_input == []
    assert free_list_exact(drv.pools) and gf.pool_accounted(drv.pools)
    if not radix:
        assert drv.pools.available_size() == start
    # flips both ways, alternating, as the switch traced them
    offs, ons = events(drv, "flip_off"), events(drv, "flip_on")
    assert [a for _, a in drv.flips] == ["flip_off", "flip_on"] * 3 and len(offs) == len(ons) == 3
    # a flip-off that found a verify in flight (launched the iteration before), processed it and released a reserve
    off_at = [it for it, a in drv.flips if a == "flip_off"]
    spec_launched = {it for it, mode, _ in drv.launched if mode == "spec"}
    assert any(e["drained"] and e["reserve_freed"] > 0 and it - 1 in spec_launched
               for it, e in zip(off_at, offs, strict=True))
    assert any(e["retracted"] >= 1 for e in ons)
    retracted = sum(e["retracted"] for e in ons)
    assert retracted == guard.covered["retract"] == sum(r.retraction_count for r in reqs)
    # while off every decode step took the plain path (the target's DECODE), while on the speculative one
    assert all((mode == "spec") == spec_on_at(drv, it) for it, mode, _ in drv.launched)
    plain = [1 for _, mode, _ in drv.launched if mode == "plain"]
    assert len(plain) == guard.covered["plain_decode"] > 0 and guard.covered["verify"] > 0
    # a retracted request is prefilled again with speculation, in the iteration of the flip-on
    on_at = [it for it, a in drv.flips if a == "flip_on"]
    for r in (r for r in reqs if r.retraction_count):
        assert any(spec and str(r.rid) in rids and it in on_at for it, spec, rids in drv.prefilled), r.rid
    # the switch left the spec side as it found it
    assert drv.spec_algorithm is drv.pools.spec_algorithm and drv.model_worker is drv.worker
    assert fm.spec_algo is drv.pools.spec_algorithm and target.spec_algorithm is drv.pools.spec_algorithm
    assert target.decode_cuda_graph_runner is verify_graphs and verify_graphs.captured_req_width == 4
    assert not drv.switch.spec_side


def track_draft_coverage(drv: Any) -> tuple[list[tuple[int, int]], list[bool]]:
    """Record, per slot, whether the forward that last wrote it ran the draft (a prefill with speculation, or a
    request's own tokens while it speculates), and after every iteration the tree's slots without draft KV. Returns
    the lists it fills: (iteration, tree slots without draft KV), and a retracted request's skip_radix_cache_insert
    at its prefill with speculation."""
    with_draft: dict[int, bool] = {}  # slot -> whether the forward that last wrote it ran the draft
    stale: list[tuple[int, int]] = []
    reprefilled: list[bool] = []
    run_batch, iteration = drv.run_batch, drv.iteration

    def recording_run_batch(batch: Any) -> Any:
        spec = not batch.spec_algorithm.is_none()
        if batch.forward_mode.is_extend() or not spec:  # a speculative decode's out_cache_loc is the worker's
            with_draft.update(dict.fromkeys(batch.out_cache_loc.tolist(), spec))
        if batch.forward_mode.is_extend() and spec:
            reprefilled.extend(r.skip_radix_cache_insert for r in batch.reqs if r.retraction_count)
        return run_batch(batch)

    def checked_iteration(**kwargs: Any) -> Any:
        out = iteration(**kwargs)
        if drv.spec_on:  # a speculating request's own tokens (past its tree prefix) are the draft's
            for req in drv.running.reqs:
                row = drv.pools.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
                with_draft.update(dict.fromkeys(row[req.kv.cache_protected_len:req.kv.kv_allocated_len].tolist(),
                                                True))
        tree = drv.pools.tree_cache.all_values_flatten().tolist()
        missing = [slot for slot in tree if with_draft.get(slot) is False]
        if missing:
            stale.append((drv.iteration_no, len(missing)))
        return out

    drv.run_batch, drv.iteration = recording_run_batch, checked_iteration
    return stale, reprefilled


@pytest.mark.parametrize("keep_out", [True, False, "insert", "default"],
                         ids=["keep_out", "without_skip_insert", "insert", "default"])
def test_the_radix_tree_caches_only_tokens_computed_with_the_draft(runtime: Any, model_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   keep_out: bool | str) -> None:
    """Issue 24 (design plain_off_retract_catch_up_radix): with the radix cache on, every slot the tree holds after
    an iteration was last written by a forward with the draft (a prefill with speculation, or a request's own
    tokens while it speculates). The switch sets `skip_radix_cache_insert` on every request of a batch run while
    off and gives it back at the flip-on retraction. Without it, the prompts prefilled while off are checkpointed
    into the tree with no draft KV, and the re-prefills after flip-on hit them."""
    from sglang.srt.managers.schedule_batch import Req

    if keep_out is False:  # the flag reads False and ignores the switch's writes
        monkeypatch.setattr(Req, "skip_radix_cache_insert", property(lambda self: False, lambda self, value: None),
                            raising=False)
    # without the flag the guard (warn mode: serving goes on) flags the drafts over those hits (issue 24)
    # "default": SPECFLIP_SWITCH_RADIX unset, read as the plugin reads it (keep_out since 2026-12-01, 25a6220);
    # "insert": SGLang's own tree behaviour, asked for
    default_mode = SwitchConfig.from_env({"SPECFLIP_SWITCH": "4:1"}).radix  # type: ignore[union-attr]
    mode = {"default": default_mode, "insert": "insert"}.get(keep_out, "keep_out")  # type: ignore[call-overload]
    clean = mode == "keep_out" and keep_out is not False
    gf.configure_guard(runtime, RETRACT, mode=None if clean else Mode.WARN)
    drv = driver(model_dir, radix=True, radix_mode=mode)
    stale, reprefilled = track_draft_coverage(drv)
    reqs = run_waves(drv)
    assert not_greedy(reqs) == [] and [a for _, a in drv.flips] == ["flip_off", "flip_on"] * 3
    assert any(not spec for _, spec, _ in drv.prefilled)  # prompts were prefilled while off
    if not clean:
        assert stale, "the tree never cached a token computed without the draft"
        found = runtime.guard.found
        assert found and {v.invariant for _, f in found for v in f} == {"draft_kv_covers_prefix"}
        return
    assert stale == [] and runtime.guard.found == []
    assert len(drv.pools.tree_cache.all_values_flatten()) > 0  # the tree still caches what the draft computed
    assert reprefilled and not any(reprefilled)  # the flag given back at the flip-on retraction
    assert free_list_exact(drv.pools) and gf.pool_accounted(drv.pools)


@pytest.mark.parametrize(("stash", "fix"), [("0.5.23", True), ("0.5.23", False), ("0.5.16", True), ("0.5.16", False)],
                         ids=["0.5.23", "0.5.23_without_fix", "0.5.16", "0.5.16_without_fix"])
def test_keep_out_resumes_a_chunked_prefill_after_its_chunk(runtime: Any, model_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch, stash: str,
                                                            fix: bool) -> None:
    """The keep_out leak of the H200 (0.5.16, docs/prefix-cache.md): every prefill is chunked (20 tokens), so
    requests are chunked while off and carry skip_radix_cache_insert into their stash. 0.5.16's stash
    (`maybe_cache_unfinished_req`, compiled from its source) then returns without advancing the request's prefix:
    its next chunk re-extends from the tree match on fresh slots and the earlier chunk's slots are lost. The switch's
    `resume_chunk_kept_out` advances it first (before the stash, on either line); without it the guard (assert mode)
    stops the re-prefill on kv_conservation. 0.5.23's own stash (`checkpoint_kv_cache`) advances it, fix or not.
    Every output stays greedy, every slot comes back, and the tree still caches only tokens computed with the
    draft (issue 24)."""
    configure(runtime)
    drv = driver(model_dir, radix=True, radix_mode="keep_out")
    drv.chunk_size = 20
    if stash == "0.5.16":
        drv.stash_chunked_request = ol.stash_chunked_request_0_5_16(drv.pools.tree_cache)
    advanced: list[int] = []  # tokens the switch advanced a kept-out chunked request's prefix by
    resume = switch_v2.resume_chunk_kept_out
    monkeypatch.setattr(switch_v2, "resume_chunk_kept_out",
                        (lambda sched: advanced.append(resume(sched)) or advanced[-1]) if fix else (lambda sched: 0))
    chunked_off: list[str] = []  # requests whose chunk ran while speculation was off
    plan = drv._plan_batch

    def recording_plan(running_batch: Any, last_batch: Any) -> Any:
        batch = plan(running_batch, last_batch)
        if drv.chunked_req is not None and not drv.switch.policy.spec_on:
            chunked_off.append(str(drv.chunked_req.rid))
        return batch

    drv._plan_batch = recording_plan
    stale, _ = track_draft_coverage(drv)
    if stash == "0.5.16" and not fix:
        with pytest.raises(SpecFlipViolation) as caught:
            run_waves(drv)
        assert caught.value.invariant == "kv_conservation" and caught.value.action == "prefill", caught.value
        assert "slots leaked" in str(caught.value) and chunked_off
        return
    reqs = run_waves(drv)
    assert chunked_off and stale == [] and runtime.guard.found == []
    assert not_greedy(reqs) == [] and [a for _, a in drv.flips] == ["flip_off", "flip_on"] * 3
    assert free_list_exact(drv.pools) and gf.pool_accounted(drv.pools)
    assert len(drv.pools.tree_cache.all_values_flatten()) > 0
    assert (sum(advanced) > 0) == fix


def test_flip_off_with_the_verify_in_flight_is_caught(runtime: Any, model_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch without `drain_in_flight` at flip-off: the reserve it releases is the one the launched verify
    writes into. The guard stops it at the flip: a flip its design makes only with no result in flight
    (legal_transition, statemodel.actions.flip_waits), and the reserve the verify in flight writes is gone."""
    drain = switch_v2.drain_in_flight
    # the mode changes after the flip's work: speculation is still on while a flip-off drains
    monkeypatch.setattr(switch_v2, "drain_in_flight", lambda sched: False if sched.switch.policy.spec_on
                        else drain(sched))
    configure(runtime)
    drv = driver(model_dir)
    with pytest.raises(SpecFlipViolation) as caught:
        run_waves(drv)
    assert caught.value.invariant == "legal_transition" and caught.value.action == "flip_off", caught.value
    assert "kv_reserve_covers_writes broken by flip_off" in str(caught.value)
    assert events(drv, "flip_off")[-1]["reserve_freed"] > 0  # it did release a reserve, with a verify in flight


def test_reserve_kept_at_flip_off_is_caught(runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch without `release_reserve`: the plain steps' prepare_for_decode writes its new slot over a
    reserved one at req_to_token[row, seq_len], which leaks; at the release the request frees as many stale row
    entries past it (slot 0 among them). The free list shows it; the guard, which counts slots, does not yet."""
    monkeypatch.setattr(switch_v2, "release_reserve", lambda sched, reqs: 0)
    configure(runtime)
    drv = driver(model_dir)
    try:
        run_waves(drv)
    except SpecFlipViolation as exc:  # the guard catching it one day is as good
        assert exc.invariant in ("kv_conservation", "kv_reserve_covers_writes"), exc
        return
    assert not free_list_exact(drv.pools)


def finishes_with_queued_result(drv: Any, req: Any) -> bool:
    """`req` is in the queued decode step and that step's token is its last."""
    queued = any(req in copy.reqs for copy, _ in drv.result_queue if not copy.forward_mode.is_extend())
    return queued and len(req.output_ids) + 1 >= req.sampling_params.max_new_tokens


@pytest.mark.parametrize("bug", [None, "flip_on_does_not_wait"])
def test_flips_with_a_prefilled_batch_not_merged_yet(runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                     bug: str | None) -> None:
    """t_off 4, t_on 2. Flip-off while a speculative prefill is in flight: its result is processed first and the
    batch is merged without speculation. Flip-on while a plain prefill is in flight and not merged: its request is
    retracted with the running one and both are prefilled again with speculation (flip-on waits until it is
    merged). The bug: flip-on does not wait: the prefilled batch is not retracted, and it joins the speculative
    running batch without draft KV, its KV held where the guard's model released it."""
    configure(runtime)
    drv = driver(model_dir, t_on=2)
    long = h.make_req("long", gf.SYSTEM_PROMPT + [300] * 5, max_new_tokens=60)
    short = gf.make_reqs("a", 4, max_new_tokens=6)
    new = h.make_req("new", gf.SYSTEM_PROMPT + [301] * 4, max_new_tokens=9)
    drv.add([long])
    for _ in range(4):
        drv.iteration()
    drv.add(short[:2])
    drv.iteration()  # demand 3: a speculative prefill launches, not merged yet
    pending = drv.last_batch
    assert pending.forward_mode.is_extend() and not pending.spec_algorithm.is_none()
    drv.add(short[2:])
    drv.iteration()  # demand 5: flip-off, its result processed first
    off = events(drv, "flip_off")
    assert len(off) == 1 and off[0]["drained"] and off[0]["running"] == 3 and pending.spec_info is None
    for _ in range(30):  # plain decoding until the last short request's last token is in flight
        left = [r for r in short if not r.finished()]
        if left and all(finishes_with_queued_result(drv, r) for r in left):
            break
        drv.iteration()
    assert not drv.spec_on and all(mode == "plain" for _, mode, rids in drv.launched if "a0" in rids)
    drv.add([new])
    drv.iteration()  # a plain prefill launches; the short requests finish in this iteration's processing
    pending = drv.last_batch
    assert pending.forward_mode.is_extend() and pending.spec_algorithm.is_none() and pending.reqs == [new]
    if bug == "flip_on_does_not_wait":
        monkeypatch.setattr(switch_v2, "flip_on_waits", lambda *args: False)
        with pytest.raises(SpecFlipViolation) as caught:
            drv.run_until_idle()
        print(caught.value)
        assert caught.value.invariant == "kv_conservation" and caught.value.action == "flip_on"
        return
    drv.iteration()  # demand 2 (long running, new prefilled): flip-on waits for the prefilled batch to merge
    assert events(drv, "flip_on") == [] and "new" in [str(r.rid) for r in drv.running.reqs]
    for _ in range(3):
        drv.iteration()  # then retracts both (after update_running_batch filtered the finished short ones)
        if events(drv, "flip_on"):
            break
    on = events(drv, "flip_on")
    assert len(on) == 1 and on[0]["retracted"] == 2 and long.retraction_count == new.retraction_count == 1
    assert (drv.iteration_no, True, ("long", "new")) in drv.prefilled
    drv.run_until_idle()
    guard = runtime.guard
    assert not_greedy([long, new, *short]) == [] and drv.wrong_input == []
    assert guard.found == [] and guard.covered["retract"] == 2 and not guard.state.unprocessed
    assert free_list_exact(drv.pools) and gf.pool_accounted(drv.pools)


# --- installation ---------------------------------------------------------------------------------------------------


def test_retract_mode_from_env_is_its_design() -> None:
    config = SwitchConfig.from_env({"SPECFLIP_SWITCH": "16:8", "SPECFLIP_SWITCH_DRAFT": "retract"})
    assert config == SwitchConfig(16, 8, draft_while_off="retract")
    assert config.design_name == RETRACT.name == "plain_off_retract_catch_up"
    assert switch_v2.PLAIN_STEP_ACTIONS["retract"] == ("prepare_for_decode", "plain_decode")


@pytest.mark.parametrize(("draft", "trace"), [("retract", False), ("retract", True), ("sync", True)])
def test_install_switch_registers_the_next_batch_hook_in_retract_mode(tmp_path: Path, draft: str, trace: bool) -> None:
    """Draft mode "retract" flips at get_next_batch_to_run (AROUND) and traces the plain path's steps at run_batch
    (only with a trace); the other modes hook neither."""
    hook_registry = pytest.importorskip("sglang.srt.plugins.hook_registry")
    registry = hook_registry.HookRegistry
    # the guard plugin's registrations and patches, which other tests read
    saved = ({target: list(hooks) for target, hooks in registry._hooks.items()}, set(registry._patched))
    registry.reset()
    try:
        config = SwitchConfig(6, 2, spec_cap=8, draft_while_off=draft, trace_dir=str(tmp_path) if trace else None)
        assert switch_v2.install_switch(registry, config)
        hooks = dict(registry._hooks)
        retract = draft == "retract"
        assert (switch_v2.T_NEXT_BATCH in hooks) == retract
        assert (switch_v2.T_RUN_BATCH in hooks) == (retract and trace)
        if retract:
            assert [(t.name, fn) for t, fn, _ in hooks[switch_v2.T_NEXT_BATCH]] == \
                [("AROUND", switch_v2._next_batch_around)]
        assert switch_v2.runtime().plain_path == retract
    finally:
        registry.reset()
        registry._hooks.update(saved[0])
        registry._patched.update(saved[1])
        switch_v2._RUNTIME = None
        guard_api.announce_switch(None)
    if trace:
        assert f'"design": "{SwitchConfig(6, 2, draft_while_off=draft).design_name}"' in \
            next(tmp_path.glob("switch-*.jsonl")).read_text()


def test_next_batch_hook_passes_through_without_the_retract_mode() -> None:
    """No switch, or a switch in another mode: the hook calls get_next_batch_to_run as it was called."""
    calls = []

    def orig(self: Any, *args: Any, **kwargs: Any) -> str:
        calls.append((self, args, kwargs))
        return "plan"

    saved = switch_v2._RUNTIME
    try:
        sync = SwitchConfig(4, 1, draft_while_off="sync")
        for rt in (None, switch_v2.SwitchRuntime(config=sync, policy=switch_v2.SwitchPolicy(sync),
                                                 trace=switch_v2.JsonlTrace(None))):
            switch_v2._RUNTIME = rt
            assert switch_v2._next_batch_around(orig, "sched", running_batch="rb", last_batch="lb") == "plan"
    finally:
        switch_v2._RUNTIME = saved
    assert calls == [("sched", (), {"running_batch": "rb", "last_batch": "lb"})] * 2


# --- found by these tests on 0.5.23 and fixed: the guard's filter hook, the relay buffers across a flip cycle ---


def test_guard_filter_hook_on_the_bare_running_batch(runtime: Any, model_dir: Path) -> None:
    """A fresh 0.5.23 Scheduler's running batch is `ScheduleBatch(reqs=[], batch_is_full=False)` (forward_mode and
    spec_algorithm None), and get_next_batch_to_run calls its filter_batch() every iteration (0.5.16 only for a
    prefill-only batch). The guard's filter hook must let it pass (it once raised AttributeError there)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    ol.overlap_pools(model_dir)  # published server args, as on a server
    configure(runtime)
    errors = runtime.internal_errors
    try:
        ScheduleBatch(reqs=[], batch_is_full=False).filter_batch()
        assert runtime.internal_errors == errors  # the hook let it through: no guard error
    finally:
        runtime.internal_errors = errors  # the process-wide count other tests read


def test_spec_relay_buffers_survive_a_flip_cycle(runtime: Any, model_dir: Path) -> None:
    configure(runtime)
    drv = driver(model_dir)
    fm = drv.future_map
    drv.add([h.make_req("long", gf.SYSTEM_PROMPT + [300] * 5, max_new_tokens=30)])
    for _ in range(3):
        drv.iteration()
    buffers = (fm.topk_p_buf, fm.topk_index_buf, fm.hidden_states_buf)
    assert fm.need_topk and all(b is not None for b in buffers)
    drv.add(gf.make_reqs("a", 4, max_new_tokens=3))
    drv.run_until_idle()
    assert [a for _, a in drv.flips] == ["flip_off", "flip_on"]
    assert all(now is before for now, before in zip((fm.topk_p_buf, fm.topk_index_buf, fm.hidden_states_buf),
                                                    buffers, strict=True))


def forward_batch(mode: str, tokens: int) -> Any:
    from types import SimpleNamespace

    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    return SimpleNamespace(capture_hidden_mode=getattr(CaptureHiddenMode, mode), input_ids=[0] * tokens)


def test_plain_prefills_replay_the_targets_prefill_graphs() -> None:
    """An EAGLE-3 target's prefill graphs are captured with hidden-state capture FULL; a plain prefill (NULL) was
    turned away and ran eager. Through the view it is checked as if they were captured for NULL, and replays; every
    other check still holds, other modes are checked as before, and the runner keeps its captured mode."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    runner = gf.PrefillCudaGraphRunnerCpuStandIn(capture_hidden_mode=CaptureHiddenMode.FULL, max_num_tokens=64)
    assert not runner.can_run_graph(forward_batch("NULL", 32))  # what SGLang does: eager
    view = switch_v2.plain_prefill_view(runner)
    assert view is not None
    assert view.can_run_graph(forward_batch("NULL", 32))
    assert not view.can_run_graph(forward_batch("NULL", 65))  # too many tokens: eager, as for the runner
    assert view.can_run_graph(forward_batch("FULL", 32)) and not view.can_run_graph(forward_batch("LAST", 32))
    assert runner.capture_hidden_mode == CaptureHiddenMode.FULL
    batch = forward_batch("NULL", 8)
    assert view.execute(batch) == "graph replay" and runner.executed == [batch]  # the runner's own replay
    # no graphs to offer: SGLang's EagerRunner (no capture mode) or none
    assert switch_v2.plain_prefill_view(None) is None
    assert switch_v2.plain_prefill_view(type("EagerRunner", (), {"can_run_graph": lambda self, fb: False})()) is None


def test_the_view_is_the_targets_prefill_runner_while_off_only(runtime: Any, model_dir: Path) -> None:
    """flip_off puts the view in the target's model runner, flip_on puts the speculative runner back."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    configure(runtime)
    drv = driver(model_dir)
    target = drv.worker.target_worker.model_runner
    spec_graphs = gf.PrefillCudaGraphRunnerCpuStandIn(capture_hidden_mode=CaptureHiddenMode.FULL)
    target.prefill_cuda_graph_runner = spec_graphs
    drv.switch.plain_prefill_runner = switch_v2.plain_prefill_view(spec_graphs)
    drv.add([h.make_req(f"p{i}", gf.SYSTEM_PROMPT + [210 + i] * 4, max_new_tokens=8 + i) for i in range(5)])
    seen = set()
    for _ in range(40):
        drv.iteration()
        runner = target.prefill_cuda_graph_runner
        seen.add("view" if runner is drv.switch.plain_prefill_runner else "spec" if runner is spec_graphs else "other")
        assert (runner is spec_graphs) == drv.switch.policy.spec_on
    drv.run_until_idle()
    assert [a for _, a in drv.flips][:2] == ["flip_off", "flip_on"] and seen == {"view", "spec"}
    assert target.prefill_cuda_graph_runner is spec_graphs and not drv.switch.spec_side
