"""The guard under SGLang 0.5.23's overlap schedule, on real objects (tests/overlap_loop.py)."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")
ol = importlib.import_module("overlap_loop")

from shim.guard.core import Mode, SpecFlipViolation  # noqa: E402
from statemodel.designs import ADAPTIVE_WARM, CATCH_UP, V2_SWITCH  # noqa: E402

pytestmark = pytest.mark.sglang




configure = gf.configure_guard


cycle = gf.accept_cycle


def test_request_finishing_at_step_n_runs_step_n_plus_one(runtime: Any, model_dir: Path) -> None:
    """Accepts 1..D (D = 4). `long` has 2+ tokens left when step N launches, so 0.5.23 does not exclude it;
    N's accepts finish it. Step N+1 was launched before N's result was processed, so it runs N+1 too; it is
    released in the processing of N's result (the iteration that launched N+1) and N+1's result skips it."""
    configure(runtime, V2_SWITCH)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), V2_SWITCH)
    short, other = gf.make_reqs("s", 2, max_new_tokens=8)
    drv.accepts = lambda req: 4 if req is short else [1, 2, 3, 4][len(req.output_ids) % 4]
    drv.add([short, other])
    drv.run_until_idle()
    # 1 token from the prefill, 4 per round: 5 after step 1, finished (9 >= 8) by step 2
    steps_with_short = [(it, rids) for it, mode, rids in drv.launched if "s0" in rids]
    assert len(steps_with_short) == 3  # steps 1, 2 and the one launched before step 2's result
    release_iteration = dict((rid, it) for it, rid in drv.released)["s0"]
    assert release_iteration == steps_with_short[-1][0]  # processed in the iteration that launched step 3
    assert ("s0" not in {rid for _, rid in drv.excluded}) and short.finished() and len(short.output_ids) == 9
    covered = runtime.guard.covered
    assert covered["process_result"] == covered["verify"] and covered["finish"] == 2
    assert gf.pool_accounted(drv.pools)


def test_prefill_merged_before_its_result_and_in_flight_finishes_excluded(runtime: Any, model_dir: Path) -> None:
    """A prefill launched while a batch runs is merged into it in the next iteration, before its result (the
    first token) is processed. 0.5.23 keeps out of the step it then prepares the requests whose queued result
    finishes them by length (`_reqs_finishing_inflight`): a request with max_new_tokens 1 right after its
    prefill, a decoding one with one token left; they leave the running batch unfinished and are released when
    that result is processed."""
    configure(runtime, V2_SWITCH)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), V2_SWITCH)
    drv.accepts = cycle([1, 2, 3, 4])
    drv.add(gf.make_reqs("a", 2, max_new_tokens=20))
    for _ in range(3):
        drv.iteration()
    one = h.make_req("one", list(range(40, 52)), max_new_tokens=1)
    late = gf.make_reqs("b", 1, max_new_tokens=3)
    drv.add([one, *late])
    drv.iteration()  # the prefill launches; the decode step before it is processed
    drv.iteration()  # merged, then excluded (`one`), the next decode launched, then the prefill's result
    assert {"one", "b0"} <= set(drv.merged_without_output)
    excluded_at = dict((rid, it) for it, rid in drv.excluded)
    assert excluded_at["one"] == drv.iteration_no
    assert all("one" not in rids for _, _, rids in drv.launched)
    assert one.finished() and not one.kv.holds_kv and ("one" in {rid for _, rid in drv.released})
    drv.run_until_idle()
    decoding = [(it, rid) for it, rid in drv.excluded if rid.startswith("a")]
    assert decoding  # a decoding request with one token left, excluded before its last result
    for it, rid in decoding:
        assert not any(rid in rids for at, _, rids in drv.launched if at >= it)
    assert runtime.guard.covered["finish"] == 4 and gf.pool_accounted(drv.pools)


def test_flip_with_a_round_in_flight(runtime: Any, model_dir: Path) -> None:
    """shim/switch/v2.py decides in update_running_batch, while step N's verify is unprocessed: its spec-off
    steps start from the seq_lens that verify published (resolved through the future map), publish seq_lens + 1
    themselves, and the flip back on happens with a plain step in flight."""
    configure(runtime, V2_SWITCH)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), V2_SWITCH)
    drv.accepts = cycle([4, 1, 3, 2])
    drv.add(gf.make_reqs("a", 3, max_new_tokens=40))
    for _ in range(4):
        drv.iteration()
    assert runtime.guard.state.unprocessed  # a verify in flight when the switch decides
    drv.iteration(flip="off")
    for _ in range(4):
        drv.iteration()
    drv.iteration(flip="on")
    drv.run_until_idle()
    covered = runtime.guard.covered
    for name in ("flip_off", "plain_decode", "draft_sync", "flip_on", "verify", "process_result", "finish"):
        assert covered.get(name), (name, covered)
    assert [mode for _, mode, _ in drv.launched].count("plain") == 5 and gf.pool_accounted(drv.pools)


def run_mixed(drv: Any, *, seed: int, flips: bool, adaptive: bool = False, iterations: int = 90) -> None:
    """A long mixed run: requests of varied lengths (some done at their first token) arriving over time,
    accepts 1..D, flips off and on at chosen iterations (the switch's), adaptive step changes; then drained."""
    import random

    rng = random.Random(seed)
    drv.accepts = lambda req: rng.randint(1, drv.worker.speculative_num_draft_tokens)
    n = 0
    for it in range(iterations):
        if it % 7 == 0 or (it % 5 == 0 and rng.random() < 0.5):
            k = rng.randint(1, 3)
            drv.add([h.make_req(f"r{n + i}", gf.SYSTEM_PROMPT + [200 + (n + i) % 50] * rng.randint(2, 9),
                                max_new_tokens=rng.choice([1, 2, 3, 6, 11, 17, 30])) for i in range(k)])
            n += k
        if adaptive:
            gf.set_steps(drv.worker, rng.choice([0, 1, 2, 3]))
        flip = None
        if flips and it in (12, 40, 66):
            flip = "off"
        elif flips and it in (24, 52, 80):
            flip = "on"
        drv.iteration(flip=flip)
    drv.run_until_idle()


@pytest.mark.parametrize("radix", [False, True], ids=["radix_off", "radix_on"])
@pytest.mark.parametrize(("design", "flips", "adaptive"), [(V2_SWITCH, True, False), (CATCH_UP, False, False),
                                                           (ADAPTIVE_WARM, False, True)],
                         ids=["v2_switch_flips", "catch_up", "adaptive_steps"])
def test_long_mixed_run_has_no_findings(runtime: Any, model_dir: Path, design: Any, flips: bool, adaptive: bool,
                                        radix: bool) -> None:
    configure(runtime, design, mode=Mode.WARN)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir, radix_cache=radix), design)
    run_mixed(drv, seed=7, flips=flips, adaptive=adaptive)
    guard = runtime.guard
    assert guard.config.design.name == f"{design.name}_overlap" and guard.config.scope.overlap
    # the server's step count (3 here; the checker's designs run 2): the model's reserve is SGLang's
    assert guard.config.design.largest_steps() == 3 or adaptive
    assert guard.found == [], guard.found[:3]
    covered = guard.covered
    for name in ("prefill", "merge_batch", "prepare_for_decode", "draft", "verify", "process_result", "finish",
                 "filter_batch"):
        assert covered.get(name), (name, covered)
    if flips:
        assert covered.get("flip_off", 0) >= 2 and covered.get("flip_on", 0) >= 2 and covered.get("plain_decode")
    assert covered["process_result"] == covered["verify"] + covered.get("plain_decode", 0)
    assert len(drv.released) == covered["finish"] >= 20 and drv.excluded
    assert not guard.state.unprocessed and gf.pool_accounted(drv.pools)


@pytest.mark.parametrize("loop", ["0.5.16_order", "no_cpu_mirror"])
@pytest.mark.parametrize(("design", "flips", "adaptive"), [(V2_SWITCH, True, False), (ADAPTIVE_WARM, False, True)],
                         ids=["v2_switch_flips", "adaptive_steps"])
def test_long_mixed_run_other_loops_have_no_findings(runtime: Any, model_dir: Path, design: Any, flips: bool,
                                                     adaptive: bool, loop: str) -> None:
    """0.5.16's order (no `_reqs_finishing_inflight`: requests a queued result finishes, prefill-finished ones
    included, run one more step and are released mid-processing), and a backend without the CPU seq_lens mirror
    (the guard then reads a result's lengths from kv_committed_len, and none at a plain launch)."""
    configure(runtime, design, mode=Mode.WARN)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), design, exclude_finishing=loop != "0.5.16_order",
                           cpu_seq_lens=loop != "no_cpu_mirror")
    run_mixed(drv, seed=11, flips=flips, adaptive=adaptive)
    guard = runtime.guard
    assert guard.found == [], guard.found[:3]
    assert bool(drv.excluded) == (loop != "0.5.16_order")
    if loop == "0.5.16_order":  # some request ran a step after the one whose result finished it
        last_step = {}
        for it, _, rids in drv.launched:
            for rid in rids:
                last_step[rid] = it
        assert any(last_step.get(rid, 0) >= it for it, rid in drv.released)
    assert not guard.state.unprocessed and gf.pool_accounted(drv.pools)


def test_trace_of_an_overlap_run_replays(runtime: Any, model_dir: Path, tmp_path: Path) -> None:
    """The trace carries the queued results (State.unprocessed) and the overlap scope: `specflip explain`
    replays an overlap run and finds it conforms."""
    from specflip.explain import explain_traces

    trace = tmp_path / "overlap.jsonl"
    configure(runtime, V2_SWITCH, mode=Mode.TRACE)
    runtime.trace_template = str(trace)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), V2_SWITCH)
    run_mixed(drv, seed=3, flips=True, iterations=40)
    runtime.reset()
    report = explain_traces([str(trace)])
    assert report.conforms, report.render()
    assert report.covered.get("process_result") and report.covered.get("plain_decode")


def test_known_bad_reserve_of_steps_plus_one_is_caught(runtime: Any, model_dir: Path) -> None:
    configure(runtime, V2_SWITCH)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), V2_SWITCH)
    drv.add(gf.make_reqs("a", 2, max_new_tokens=30))
    with ol.reserve_once_cpu_stand_in(), pytest.raises(SpecFlipViolation) as caught:
        drv.run_until_idle()
    print(caught.value)
    assert caught.value.invariant == "kv_reserve_covers_writes"


def test_known_bad_plain_step_not_published_is_caught(runtime: Any, model_dir: Path) -> None:
    configure(runtime, V2_SWITCH)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), V2_SWITCH, bug="plain_step_not_published")
    drv.add(gf.make_reqs("a", 2, max_new_tokens=40))
    for _ in range(3):
        drv.iteration()
    drv.iteration(flip="off")
    with pytest.raises(SpecFlipViolation) as caught:
        for _ in range(6):
            drv.iteration()
    print(caught.value)
    assert caught.value.invariant == "seq_lens_growth"


# --- iterations SGLang runs without overlap (`Scheduler.is_disable_overlap_for_batch`) ----------------------------


def _driver(model_dir: Path, design: Any, **kwargs: Any) -> Any:
    """An OverlapDriver; with release "0.5.16" only where the 0.5.16 source is unpacked (scripts/setup.sh)."""
    try:
        return ol.OverlapDriver(ol.overlap_pools(model_dir), design, **kwargs)
    except FileNotFoundError as exc:
        pytest.skip(f"the sglang 0.5.16 source is not unpacked: {exc}")


def _with_grammar(reqs: list[Any]) -> list[Any]:
    for req in reqs:
        req.grammar = ol.any_token_grammar_cpu_stand_in()
    return reqs


def _grammar_run(drv: Any) -> None:
    """Structured-output requests (a grammar each) and one without, accepts 1..D, the switch's flips (its spec-off
    step keeps spec_algorithm EAGLE on the batch), some requests done at their first token; then drained."""
    drv.accepts = cycle([4, 1, 3, 2, 4])
    drv.add(_with_grammar(gf.make_reqs("g", 3, max_new_tokens=13)) + gf.make_reqs("p", 1, max_new_tokens=17))
    for it in range(24):
        if it == 3:
            drv.add(_with_grammar([h.make_req("once", list(range(60, 70)), max_new_tokens=1)]))
        if it == 5:
            drv.add(_with_grammar(gf.make_reqs("late", 2, max_new_tokens=9, start=5)))
        drv.iteration(flip="off" if it == 8 else "on" if it == 14 else None)
    drv.run_until_idle()


def test_grammar_decode_runs_without_overlap_on_0_5_16(runtime: Any, model_dir: Path) -> None:
    """0.5.16's real `is_disable_overlap_for_batch` runs a speculative decode batch that carries a grammar without
    overlap: step N's result is processed after step N+1 was prepared (filter, prepare_for_decode: the model's stage
    PREPARED) and before N+1 launches, and the requests N finishes are released there, then run N+1 anyway (its
    result skips them). Assert mode: any finding raises. On the model before these iterations were mapped, the first
    such result was a `legal_transition` (process_result at stage PREPARED)."""
    configure(runtime, V2_SWITCH)
    drv = _driver(model_dir, V2_SWITCH, exclude_finishing=False, release="0.5.16")
    _grammar_run(drv)
    guard = runtime.guard
    decode_launches = {it for it, _, _ in drv.launched}
    assert len(drv.not_overlapped) >= 10 and set(drv.not_overlapped) <= decode_launches
    # a request released in an iteration run without overlap, before that iteration's step launched with it
    launched_at = {it: rids for it, _, rids in drv.launched}
    released_then_run = [(it, rid) for it, rid in drv.released
                         if it in drv.not_overlapped and rid in launched_at.get(it, ())]
    assert released_then_run, (drv.released, drv.not_overlapped)
    covered = guard.covered
    assert covered.get("flip_off") and covered.get("flip_on") and covered.get("plain_decode")
    assert covered["process_result"] == covered["verify"] + covered["plain_decode"]
    assert covered["finish"] == len(drv.released) == 7
    assert guard.found == [] and not guard.state.unprocessed and gf.pool_accounted(drv.pools)


def test_grammar_decode_keeps_overlap_on_0_5_23(runtime: Any, model_dir: Path) -> None:
    """0.5.23's real decision keeps EAGLE + grammar overlapped (`supports_grammar_overlap`: the verify advances the
    grammar FSM behind the grammar barrier): the same run, every iteration overlapped, no finding."""
    configure(runtime, V2_SWITCH)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), V2_SWITCH)
    _grammar_run(drv)
    assert drv.not_overlapped == [] and runtime.guard.found == []
    assert not runtime.guard.state.unprocessed and gf.pool_accounted(drv.pools)


@pytest.mark.parametrize("release", ["0.5.23", "0.5.16"])
def test_consecutive_prefills_run_without_overlap(runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                  release: str) -> None:
    """`SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP`: a prefill right after a prefill waits for the first one's result
    (its first tokens, the release of a request done at once) before it launches. Real decision of each release."""
    monkeypatch.setenv("SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP", "1")
    configure(runtime, V2_SWITCH)
    drv = _driver(model_dir, V2_SWITCH, release=release)
    drv.accepts = cycle([1, 2, 3, 4])
    drv.add(gf.make_reqs("a", 2, max_new_tokens=9))
    drv.iteration()
    drv.add([h.make_req("one", list(range(40, 52)), max_new_tokens=1), *gf.make_reqs("b", 1, max_new_tokens=5)])
    drv.iteration()  # a prefill after a prefill: the first one's result is processed before it launches
    assert drv.not_overlapped == [2]
    drv.add(gf.make_reqs("c", 1, max_new_tokens=4))
    drv.iteration()  # and the next: the release of `one` (done at its first token) before `c` launches
    assert drv.not_overlapped == [2, 3] and ("one" in {rid for _, rid in drv.released})
    drv.run_until_idle()
    guard = runtime.guard
    assert guard.found == [] and guard.covered["finish"] == len(drv.released) == 5
    assert not guard.state.unprocessed and gf.pool_accounted(drv.pools)


# --- retraction under overlap -------------------------------------------------------------------------------------


@pytest.mark.parametrize("in_flight", ["verify", "plain_step"])
@pytest.mark.parametrize("radix", [False, True], ids=["radix_off", "radix_on"])
def test_retraction_with_a_result_in_flight(runtime: Any, model_dir: Path, in_flight: str, radix: bool) -> None:
    """The real `retract_decode` in `update_running_batch` (the branch SGLANG_TEST_RETRACT forces; pool pressure:
    the next test) while step N's result is queued: the retracted request leaves the step N+1 prepared next,
    N's result skips it (`is_retracted`), it goes back to the waiting queue with its output, is prefilled again
    (`prepare_for_extend` clears `is_retracted`) and finishes. With a verify in flight and with a plain step in
    flight (the switch's spec-off step)."""
    configure(runtime, V2_SWITCH)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir, radix_cache=radix), V2_SWITCH)
    drv.accepts = cycle([2, 4, 1, 3])
    reqs = gf.make_reqs("r", 3, max_new_tokens=24, shared_prefix=gf.SYSTEM_PROMPT)
    drv.add(reqs)
    for _ in range(3):
        drv.iteration()
    if in_flight == "plain_step":
        drv.iteration(flip="off")
        drv.iteration()
    guard = runtime.guard
    assert [u.is_spec for u in guard.state.unprocessed] == [in_flight == "verify"]
    drv.retract_next = True
    drv.iteration()
    assert drv.retracted and all(it == drv.iteration_no for it, _ in drv.retracted)
    victims = {rid for _, rid in drv.retracted}
    victim_reqs = [r for r in reqs if str(r.rid) in victims]
    outputs = {str(r.rid): len(r.output_ids) for r in victim_reqs}
    assert all(r.is_retracted and not r.kv.holds_kv for r in victim_reqs)
    assert not any(victims & set(rids) for it, _, rids in drv.launched if it == drv.iteration_no)
    if in_flight == "plain_step":
        drv.iteration(flip="on")
    drv.run_until_idle()
    assert all(r.finished() and len(r.output_ids) >= outputs[str(r.rid)] for r in victim_reqs)
    assert guard.covered["retract"] == len(victims) and guard.covered["finish"] == 3
    assert guard.found == [] and not guard.state.unprocessed and gf.pool_accounted(drv.pools)


@pytest.mark.parametrize("radix", [False, True], ids=["radix_off", "radix_on"])
def test_retraction_under_pool_pressure(runtime: Any, model_dir: Path, radix: bool) -> None:
    """A pool of 60 slots for 3 requests: the real `check_decode_mem` fails in `update_running_batch` while the last
    verify's result is queued (the double reserve is measured from the stale committed length) and the real
    `retract_decode` retracts. The test admits a retracted request again once the pool has room for its prompt, its
    output so far and one reserve (the loop here prefills whatever waits; SGLang's PrefillAdder would wait too), so
    it is prefilled again while the others decode; everything finishes."""
    configure(runtime, V2_SWITCH)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir, kv_size=60, radix_cache=radix), V2_SWITCH)
    drv.accepts = cycle([2, 4, 1, 3])
    reqs = gf.make_reqs("r", 3, max_new_tokens=24)
    drv.add(reqs)
    held: list[Any] = []
    in_flight_at_retract = []
    for _ in range(120):
        room = drv.pools.available_size() + int(drv.pools.tree_cache.evictable_size())  # the tree evicts on demand
        if held and room >= len(held[0].origin_input_ids) + len(held[0].output_ids) + 8:
            drv.add([held.pop(0)])
        if drv.idle() and not held:
            break
        queued = [copy.forward_mode.is_decode() for copy, _ in drv.sched.result_queue]
        count = len(drv.retracted)
        drv.iteration()
        if len(drv.retracted) > count:
            in_flight_at_retract.append(queued)
            held += [r for r in drv.waiting if r.is_retracted]
            drv.waiting = [r for r in drv.waiting if not r.is_retracted]
    guard = runtime.guard
    assert len(drv.retracted) >= 2 and all(q == [True] for q in in_flight_at_retract)  # a decode result queued
    assert guard.covered["retract"] == len(drv.retracted) and guard.covered["prefill"] > 1
    assert all(r.finished() for r in reqs) and guard.covered["finish"] == 3
    assert guard.found == [] and not guard.state.unprocessed and gf.pool_accounted(drv.pools)


def test_a_wave_arrives_in_one_step_and_its_finishes_are_one_step_at_the_free_group_end(
        runtime: Any, model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A wave's requests reach the scheduler together: the guard records those a prefill shows first as one `arrive`
    of all of them, and the finishes one result's processing releases inside the allocator's free group as one `finish`
    of all of them at the group's end (statemodel.actions._arrive and _finish; tests/test_actions.py holds each to its
    single steps in turn). Both are named in the history; the coverage counts every request."""
    configure(runtime, V2_SWITCH)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), V2_SWITCH)
    drv.accepts = cycle([1, 2, 3, 4])
    drv.add(gf.make_reqs("a", 6, max_new_tokens=6))
    with caplog.at_level(logging.INFO, logger="specflip.guard"):
        drv.iteration()
    # the guard says it is on once it is built, at the first hooked step (a server's logging is set up by then)
    assert "specflip guard checking: design v2_switch_reserve_sync_overlap (overlap schedule), mode assert, TP rank 0" \
        in caplog.text
    guard = runtime.guard
    assert guard.covered["arrive"] == 6
    arrivals = [line for line in guard._history_lines() if " arrive(" in line]
    assert len(arrivals) == 1 and "arrive('a0', 'a1', 'a2', 'a3' and 2 more)" in arrivals[0], arrivals
    drv.add(gf.make_reqs("b", 1, max_new_tokens=6))
    drv.iteration()
    assert guard.covered["arrive"] == 7 and any(" arrive('b0')" in line for line in guard._history_lines())
    finishes: set[str] = set()
    while not drv.idle():
        drv.iteration()
        finishes |= {line.split("] ")[0] for line in guard._history_lines() if " finish(" in line}
        assert not guard.releasing and not guard.in_free_group  # checked by the end of each result's processing
    assert any(", " in line for line in finishes), finishes  # several finishes of one result: one step
    assert guard.covered["finish"] == len(drv.released) == 7 and gf.pool_accounted(drv.pools)


def test_a_leak_in_a_free_group_is_blamed_on_its_own_release(runtime: Any, model_dir: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The finishes of one free group are checked as one step; when that step finds a count broken (here each release
    keeps its over-allocated slots: sglang #13826's leak, with no position freed that the request does not own, so no
    identity finding), each release is checked in turn, and the report names the first release that broke it, at the
    group's end, before anything else runs."""
    from sglang.srt.mem_cache import common

    configure(runtime, ADAPTIVE_WARM)
    monkeypatch.setattr(common, "_release_overallocated_kv_indices", lambda *a, **k: None)  # the leak
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), ADAPTIVE_WARM)
    drv.accepts = cycle([1, 2, 3, 4])
    drv.add(gf.make_reqs("g", 3, max_new_tokens=6))
    released = 0
    with pytest.raises(SpecFlipViolation) as excinfo:
        for _ in range(40):
            released = len(drv.released)
            drv.iteration()
    exc = excinfo.value
    assert exc.invariant == "kv_conservation" and exc.action == "finish" and "leaked" in str(exc)
    first = exc.rids[0]
    assert len(exc.rids) == 1 and f"broken by finish('{first}')" in str(exc), str(exc)
    assert "[mem_cache.common.release_kv_cache]" in str(exc)  # the release's own step, in the history
    assert released == 0  # the first releases: raised in the result's processing that released them
