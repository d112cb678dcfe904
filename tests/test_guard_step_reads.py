"""What a guard step reads of the launched batch, checked AT THAT STEP (issue 51's mutation samples of
shim/guard/core.py, docs/mutation.md): a step that stopped overlaying the batch it launches would pass every test
that plants a fault in the pool or the requests. Here the launched batch itself is wrong on real SGLang 0.5.23
objects (tests/guard_fixtures.py), and the finding must be raised from that step's hook."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")

from shim.guard.core import SpecFlipViolation  # noqa: E402
from statemodel.designs import CATCH_UP  # noqa: E402

pytestmark = pytest.mark.sglang


def _driver(runtime: Any, model_dir: Path, *, n: int = 2) -> Any:
    gf.configure_guard(runtime, CATCH_UP)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), CATCH_UP)
    drv.admit(gf.make_reqs("r", n, max_new_tokens=40, shared_prefix=gf.SYSTEM_PROMPT))
    return drv


def test_a_verify_launched_with_too_few_slots_is_found_at_its_launch(runtime: Any, model_dir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The verify input built one draft token short: the TARGET_VERIFY launch's out_cache_loc (its draft tokens) is
    narrower than the tokens a verify of these requests writes. The launch's look at the batch it launches
    (`Guard.verify_launch` overlaying `launched`) names it there: `shapes_agree` (and, the spec_info built from the
    same tokens, `spec_info_matches_batch`)."""
    drv = _driver(runtime, model_dir)
    drv.decode()
    with h.patch_assign_req_to_token_pool():
        drv.batch.prepare_for_decode()
    build = h.make_eagle_verify_input

    def build_one_short(batch: Any, **kwargs: Any) -> Any:
        verify_input = build(batch, **kwargs)
        verify_input.draft_token = verify_input.draft_token[:-1]
        return verify_input

    monkeypatch.setattr(h, "make_eagle_verify_input", build_one_short)
    drv.worker.accept_lens_cpu_stand_in = [1, 1]
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.worker.forward_batch_generation(drv.batch)
    exc = excinfo.value
    assert "before_verify" in {entry.name for entry in excinfo.traceback}, str(exc)
    # one token short is also a spec_info of too few rows (its rows are draft tokens / tokens per row): both named
    assert exc.invariant in ("spec_info_matches_batch", "shapes_agree"), str(exc)
    assert "shapes_agree broken" in str(exc) or exc.invariant == "shapes_agree", str(exc)
    assert "seen at: EAGLEWorkerV2.verify (TARGET_VERIFY launch)" in str(exc), str(exc)


def test_a_prefill_launched_with_too_few_slots_is_found_at_its_prepare(runtime: Any, model_dir: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`prepare_for_extend` handed an out_cache_loc one slot short of the tokens its EXTEND batch writes (the slots
    allocated and the request's row as usual): the prefill's look at the batch it launches (`Guard.prefill`
    overlaying `launched`) names it there, as `shapes_agree`."""
    import sglang.srt.managers.schedule_batch as schedule_batch

    drv = _driver(runtime, model_dir)
    drv.flip_off()  # plain steps: no speculative round left to settle at the next hook
    drv.decode()
    alloc = schedule_batch.alloc_for_extend

    def alloc_one_short(batch: Any) -> Any:
        out_cache_loc, *rest = alloc(batch)
        return (out_cache_loc[:-1], *rest)

    monkeypatch.setattr(schedule_batch, "alloc_for_extend", alloc_one_short)
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.prefill(gf.make_reqs("late", 1, shared_prefix=gf.SYSTEM_PROMPT))
    exc = excinfo.value
    assert "after_prepare_for_extend" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert exc.invariant == "shapes_agree", str(exc)
    assert str(exc).rstrip().endswith(" [ScheduleBatch.prepare_for_extend]"), str(exc)


def test_a_verify_that_grew_seq_lens_too_far_is_found_where_its_round_settles(
        runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a round, one request's seq_len (device tensor and CPU mirror) one past what its committed accepts
    give: the round's verify, settled at the scheduler's next hook, compares the seq_lens it launched
    (`settle_round`'s `seq_rids`) and names it there, as the verify's."""
    drv = _driver(runtime, model_dir)
    drv.decode()
    drv.batch.seq_lens[0] += 1
    drv.batch.seq_lens_cpu[0] += 1
    with pytest.raises(SpecFlipViolation) as excinfo, h.patch_assign_req_to_token_pool():
        drv.batch.prepare_for_decode()
    exc = excinfo.value
    assert "after_prepare_for_decode" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert exc.action == "verify", str(exc)
    assert "seq_len" in exc.invariant, str(exc)
    assert str(exc).rstrip().endswith(" [process_batch_result (verify result)]"), str(exc)


def test_an_arrival_is_traced_with_the_prefill_that_showed_it(runtime: Any, model_dir: Path, tmp_path: Path) -> None:
    """Trace mode: the requests a prefill shows first arrive as one step, traced with that prefill's place (a
    finding at an arrival names it; `Guard._arrive` passes its `where` on)."""
    import json

    from shim.guard.core import Mode

    trace = tmp_path / "arrive.jsonl"
    gf.configure_guard(runtime, CATCH_UP, mode=Mode.TRACE, trace=trace)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), CATCH_UP)
    drv.admit(gf.make_reqs("r", 2, max_new_tokens=40, shared_prefix=gf.SYSTEM_PROMPT))
    runtime.reset()
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    arrivals = [r for r in steps if r["kind"] == "step" and r["action"] == "arrive"]
    assert [(r["where"], r["new_rids"]) for r in arrivals] == [("ScheduleBatch.prepare_for_extend", ["r0", "r1"])], \
        arrivals


def test_the_batch_a_merge_produced_is_traced_where_it_was_seen(runtime: Any, model_dir: Path,
                                                                  tmp_path: Path) -> None:
    """Trace mode: after `merge_batch` ran, the guard looks at the running batch it produced (`refine_running`), a
    `refine` record with that place (what a finding there would name)."""
    import json

    from shim.guard.core import Mode

    trace = tmp_path / "merge.jsonl"
    gf.configure_guard(runtime, CATCH_UP, mode=Mode.TRACE, trace=trace)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), CATCH_UP)
    drv.admit(gf.make_reqs("r", 2, max_new_tokens=40, shared_prefix=gf.SYSTEM_PROMPT))
    drv.decode()
    late = drv.prefill(gf.make_reqs("late", 1, shared_prefix=gf.SYSTEM_PROMPT))
    late.forward_mode = late.forward_mode.DECODE
    drv.batch.merge_batch(late)
    runtime.reset()
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    last_merge = max(i for i, r in enumerate(records) if r["kind"] == "step" and r["action"] == "merge_batch")
    after_merge = records[last_merge + 1:]
    assert after_merge and (after_merge[0]["kind"], after_merge[0]["where"]) == (
        "refine", "ScheduleBatch.merge_batch (result)"), after_merge[:1]


def test_a_request_wrong_just_before_a_catch_up_is_found_at_the_catch_up(runtime: Any, model_dir: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Speculation back on (CATCH_UP: the draft catches up with one draft-extend at flip-on): a request's allocated
    length one past what it holds, with no slot allocated for it, just before the catch-up. The catch-up reads its
    requests (`draft_extend_starts` overlaying `reqs`) and names it there, not the next step."""
    drv = _driver(runtime, model_dir)
    print("BEFORE", runtime.guard.state.running, drv.batch.spec_info, drv.batch.spec_algorithm)
    drv.flip_off()
    print("AFTER", runtime.guard.state.running, drv.batch.spec_info, drv.batch.spec_algorithm)
    drv.decode()
    catch_up = drv.draft_extend_outside_round

    def wrong_then_catch_up() -> None:
        drv.batch.reqs[0].kv.kv_allocated_len += 1
        catch_up()

    monkeypatch.setattr(drv, "draft_extend_outside_round", wrong_then_catch_up)
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.flip_on()
    exc = excinfo.value
    assert "before_draft_extend_for_decode" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert exc.action == "draft_catch_up", str(exc)
    assert str(exc).rstrip().endswith(" [EagleDraftWorker._draft_extend_for_decode]"), str(exc)


def test_a_retraction_that_frees_another_requests_slot_is_blamed_on_the_retraction(
        runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A retraction (speculation off) that, inside SGLang's release, also frees the newest slot of another running
    request: what the identity check of the release found (`slots_freed_owned`) is the retraction's finding
    (`Guard.release` passes it on as `extra`), named before the counts it unbalanced."""
    from sglang.srt.mem_cache.common import release_kv_cache

    # the slot-value check (on by default on the CPU) would stop the free itself, before the retraction's step
    monkeypatch.setattr(runtime, "slot_values", "off")
    drv = _driver(runtime, model_dir)
    drv.flip_off()  # plain steps: no speculative round left to settle at the next hook
    drv.decode()
    victim, other = drv.batch.reqs
    allocator = drv.pools.allocator
    free = allocator.free
    rows = drv.pools.req_to_token_pool.req_to_token
    newest = other.kv.kv_committed_len - 1
    stolen = rows[other.kv.req_pool_idx, newest:newest + 1]  # a view of its row, as SGLang frees

    def free_and_steal(slots: Any) -> Any:
        monkeypatch.setattr(allocator, "free", free)  # once
        free(stolen)
        return free(slots)

    monkeypatch.setattr(allocator, "free", free_and_steal)
    with pytest.raises(SpecFlipViolation) as excinfo:
        release_kv_cache(victim, drv.batch.tree_cache, checkpoint=False)
    exc = excinfo.value
    assert (exc.invariant, exc.action) == ("slots_freed_owned", "retract"), str(exc)


def test_a_prefilled_batch_is_traced_with_the_draft_input_it_carries(runtime: Any, model_dir: Path,
                                                                     tmp_path: Path) -> None:
    """Trace mode: a speculative prefill leaves the prefilled batch carrying the speculative algorithm and one draft
    input row per request (`_draft_prefilled_as_observed`, given the launched batch's `spec_algorithm_on`); the
    running batch it becomes carries them on."""
    import json

    from shim.guard.core import Mode

    trace = tmp_path / "prefill.jsonl"
    gf.configure_guard(runtime, CATCH_UP, mode=Mode.TRACE, trace=trace)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), CATCH_UP)
    drv.admit(gf.make_reqs("r", 2, max_new_tokens=40, shared_prefix=gf.SYSTEM_PROMPT))
    drv.decode()
    runtime.reset()
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    prefill = next(r for r in steps if r["kind"] == "step" and r["action"] == "prefill")
    merged = next(r for r in steps if r["kind"] == "step" and r["action"] == "merge_batch")
    assert merged["where"] == "scheduler (running batch := prefilled batch)", merged["where"]  # no merge_batch call
    for batch in (prefill["delta"]["pending"], merged["delta"]["running"]):
        seen = (batch["rids"], batch["spec_info"], batch["spec_algorithm_on"])
        assert seen == ([0, 1], ["draft_input", 2, 1], True), batch


def test_a_flip_off_that_leaves_the_draft_input_on_the_batch_is_recorded_as_it_left_it(
        runtime: Any, model_dir: Path) -> None:
    """A flip-off (notified as the switch does, `shim.guard.api.notify_flip`) that leaves the running batch's draft
    input and algorithm in place, where this design clears them at the flip: the guard's state after the flip holds
    the running batch as the flip left it (`Guard.flip` overlaying `running`), which the next plain launch is checked
    against, not the model's cleared batch."""
    import shim.guard.api
    from statemodel.state import SpecInfoKind

    drv = _driver(runtime, model_dir)
    drv.decode()
    drv.spec_on = False
    shim.guard.api.notify_flip(False, drv.batch)  # the batch's spec_info and spec_algorithm left as they were
    guard = runtime.guard
    assert guard.last_action is not None and guard.last_action.name == "flip_off"
    running = guard.state.running
    assert (running.spec_info.kind, running.spec_info.rows, running.spec_algorithm_on) == \
        (SpecInfoKind.DRAFT_INPUT, 2, True), running


def test_a_round_that_leaves_the_draft_input_a_row_short_is_found_at_its_draft_extend(
        runtime: Any, model_dir: Path) -> None:
    """After a round, the running batch's draft input one row short of its requests (the draft-extend's next draft
    input built for one request of two): the round's draft-extend, settled at the scheduler's next hook, reads the
    running batch the round left (`settle_round` overlaying `running`) and names it there, not the
    `prepare_for_decode` that follows in the same hook."""
    import torch

    drv = _driver(runtime, model_dir)
    drv.decode()
    drv.batch.spec_info.filter_batch(new_indices=torch.tensor([0]))
    with pytest.raises(SpecFlipViolation) as excinfo, h.patch_assign_req_to_token_pool():
        drv.batch.prepare_for_decode()
    exc = excinfo.value
    assert "after_prepare_for_decode" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert (exc.invariant, exc.action) == ("spec_info_matches_batch", "draft_extend"), str(exc)
    assert str(exc).rstrip().endswith(" [process_batch_result (verify result)]"), str(exc)


def test_a_merge_whose_draft_input_keeps_only_the_running_rows_is_found_at_the_merge(
        runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`merge_batch` ran, but the draft input's merge did nothing (`EagleDraftInput.merge_batch` kept the running
    batch's rows only): the guard's look at the batch the merge produced (`refine_running`, from the merge hook's
    after-part) names it there, before any later step reads the running batch."""
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    drv = _driver(runtime, model_dir)
    drv.decode()
    late = drv.prefill(gf.make_reqs("late", 1, shared_prefix=gf.SYSTEM_PROMPT))
    late.forward_mode = late.forward_mode.DECODE
    monkeypatch.setattr(EagleDraftInput, "merge_batch", lambda self, other: None)
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.batch.merge_batch(late)
    exc = excinfo.value
    assert "around_merge_batch" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert (exc.invariant, exc.action) == ("spec_info_matches_batch", "merge_batch"), str(exc)
    assert "seen at: ScheduleBatch.merge_batch (result)" in str(exc), str(exc)


def test_a_draft_extend_run_again_while_off_is_named_a_draft_sync(runtime: Any, model_dir: Path) -> None:
    """Speculation off under `plain_off_sync` (a draft sync after every plain step): the flip implementation runs
    the draft-extend a second time after one plain step. While off, a draft-extend outside a round is the design's
    draft sync (`draft_extend_starts`: stage decoded or speculation off), and a second one finds the stage moved on:
    `legal_transition` on `draft_sync`, not a catch-up that speculation off forbids."""
    from statemodel.designs import SYNC_V2

    gf.configure_guard(runtime, SYNC_V2)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), SYNC_V2)
    drv.admit(gf.make_reqs("r", 2, max_new_tokens=40, shared_prefix=gf.SYSTEM_PROMPT))
    drv.flip_off()
    drv.decode()  # the plain step and its draft sync
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.draft_extend_outside_round()
    exc = excinfo.value
    assert "before_draft_extend_for_decode" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert (exc.invariant, exc.action) == ("legal_transition", "draft_sync"), str(exc)
    assert "ran at stage schedule; the model runs it only from decoded" in str(exc), str(exc)


def _two_finishing_together(runtime: Any, model_dir: Path, **guard: Any) -> Any:
    """Two requests (speculation off: one token a step) that finish at the same step: their releases run in one
    allocator free group, checked as one `finish` step at the group's end (`Guard._check_releases`)."""
    gf.configure_guard(runtime, CATCH_UP, **guard)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), CATCH_UP)
    drv.admit(gf.make_reqs("r", 2, max_new_tokens=4, shared_prefix=gf.SYSTEM_PROMPT))
    drv.flip_off()
    for _ in range(3):
        drv.decode()
    assert all(req.finished() for req in drv.batch.reqs)
    return drv


def test_a_finish_that_keeps_its_row_is_found_in_its_free_group(runtime: Any, model_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Of two finishes in one free group, one release gives its slots back but not its req_to_token row (the row's
    free skipped): the request still holds a row after its finish. The group's step reads the finished requests
    (`_check_releases` overlaying each release's reading) and names it there: no later step reads a finished
    request again."""
    drv = _two_finishing_together(runtime, model_dir)
    pool = drv.pools.req_to_token_pool
    free, kept = pool.free, drv.batch.reqs[0]

    def free_all_rows_but_one(req: Any, *args: Any, **kwargs: Any) -> Any:
        return None if req is kept else free(req, *args, **kwargs)

    monkeypatch.setattr(pool, "free", free_all_rows_but_one)
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.finish_and_filter()
    exc = excinfo.value
    assert "before_free_group_end" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert (exc.invariant, exc.action, exc.rids) == ("kv_conservation", "finish", ("r0",)), str(exc)
    assert "request 'r0' is finished but still holds" in str(exc), str(exc)


def test_a_free_groups_finishes_are_traced_as_one_step_where_they_ran(runtime: Any, model_dir: Path,
                                                                      tmp_path: Path) -> None:
    """Trace mode: the two finishes of one free group are one `finish` step record, with the place of the releases
    (what a finding there names), and the steps are numbered 1, 2, 3, ... in the order they ran; the guard keeps
    only the last `config.history` of them in memory."""
    import json

    from shim.guard.core import Mode

    trace = tmp_path / "finish.jsonl"
    drv = _two_finishing_together(runtime, model_dir, mode=Mode.TRACE, trace=trace)
    drv.finish_and_filter()
    guard = runtime.guard  # the history a report lists: the last `config.history` steps only
    assert len(guard.history) == guard.config.history < guard.step_number, (len(guard.history), guard.step_number)
    runtime.reset()
    steps = [r for r in map(json.loads, trace.read_text().splitlines()) if r["kind"] == "step"]
    assert len(steps) > 5 and [r["step"] for r in steps] == list(range(1, len(steps) + 1)), [r["step"] for r in steps]
    finishes = [(r["args"], r["where"]) for r in steps if r["action"] == "finish"]
    assert finishes == [([0, 1], "mem_cache.common.release_kv_cache")], finishes


@pytest.mark.parametrize("chunk_size", [None, 16], ids=["whole", "chunked"])
def test_a_steps_0_round_over_a_tree_prefix_without_draft_kv_waits_for_the_first_real_draft(
        runtime: Any, model_dir: Path, chunk_size: int | None) -> None:
    """Radix cache on: a request p prefilled and finished while speculation was off leaves its prompt in the tree
    without draft KV (no catch-up covers a request gone by flip-on); after flip-on, q's prompt hits it. A round at
    steps 0 (the trivial one-token verify) runs no draft over that prefix: no finding there (`Guard.draft` passes the
    round's steps to the tree check). The first round that drafts (steps 3) names q and the positions missing: all
    20 of p's own, also when p's prompt went in chunk by chunk, its first chunk into the tree while p was still
    prefilling (`Guard.prefill` noting each chunk run without the draft under p's rid)."""
    gf.configure_guard(runtime, CATCH_UP)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=True), CATCH_UP)
    drv.admit(gf.make_reqs("a", 2, max_new_tokens=40, shared_prefix=gf.SYSTEM_PROMPT))
    drv.decode()
    drv.flip_off()
    prompt = gf.SYSTEM_PROMPT + [400 + i for i in range(20)]
    drv.admit_all([h.make_req("p", prompt, max_new_tokens=2)], chunk_size=chunk_size)
    for _ in range(3):
        drv.decode()
        drv.finish_and_filter()
    assert [str(req.rid) for req in drv.batch.reqs] == ["a0", "a1"]  # p finished while off
    drv.flip_on()
    drv.admit([h.make_req("q", prompt + [500, 501, 502], max_new_tokens=20)])
    guard = runtime.guard
    assert set(guard.tree_missing) == {"q"}
    gf.set_steps(drv.worker, 0)
    drv.decode(accepts=[1, 1, 1])
    assert guard.found == [] and set(guard.tree_missing) == {"q"}  # still to be named at a real draft
    gf.set_steps(drv.worker, 3)
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.decode()
    exc = excinfo.value
    assert (exc.invariant, exc.action, exc.rids) == ("draft_kv_covers_prefix", "draft", ("q",)), str(exc)
    assert "20 of them without draft KV" in str(exc), str(exc)


def test_a_retracted_request_re_prefilled_onto_a_tree_prefix_without_draft_kv_is_named_again(
        runtime: Any, model_dir: Path) -> None:
    """Warn mode, the run above up to q's first draft (named: 20 positions without draft KV). Then q is retracted
    (the real `retract_decode`) and prefilled again: it matches the tree afresh, the same 20 positions without draft
    KV among them. Its release forgot what the guard knew of its tree prefix (`Guard.release` -> `tree_forget_request`),
    so its next draft names it again: the same fault seen again (a repeat, not a new count), and nothing of the
    earlier hold is left behind."""
    from shim.guard.core import Mode

    gf.configure_guard(runtime, CATCH_UP, mode=Mode.WARN)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=True), CATCH_UP)
    drv.admit(gf.make_reqs("a", 2, max_new_tokens=40, shared_prefix=gf.SYSTEM_PROMPT))
    drv.decode()
    drv.flip_off()
    prompt = gf.SYSTEM_PROMPT + [400 + i for i in range(20)]
    drv.admit([h.make_req("p", prompt, max_new_tokens=2)])
    for _ in range(3):
        drv.decode()
        drv.finish_and_filter()
    drv.flip_on()
    drv.admit([h.make_req("q", prompt + [500, 501, 502], max_new_tokens=20)])
    guard = runtime.guard
    drv.decode()
    assert [(a, v.invariant, v.rids, v.actual) for a, found in guard.found for v in found] == [
        ("draft", "draft_kv_covers_prefix", (2,), "20 positions without draft KV")]
    with h.patch_assign_req_to_token_pool():
        retracted, _, aborted = drv.batch.retract_decode()
    assert [str(req.rid) for req in retracted] == ["q"] and not aborted
    drv.admit(retracted)
    drv.decode()
    assert guard.finding_counts["draft_kv_covers_prefix"] == 1
    assert guard.repeat_counts["draft_kv_covers_prefix"] == 1  # q's new hold, named at its next draft
    assert guard.tree_missing == {}


def test_a_leak_just_before_a_catch_up_is_found_at_the_catch_up(runtime: Any, model_dir: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """As the test above, with three slots leaked (allocated, owned by nobody) just before the catch-up: the
    catch-up reads the pool (`draft_extend_starts` overlaying `pool`) and names the leak there."""
    drv = _driver(runtime, model_dir)
    drv.flip_off()
    drv.decode()
    catch_up = drv.draft_extend_outside_round

    def leak_then_catch_up() -> None:
        drv.pools.allocator.alloc(3)
        catch_up()

    monkeypatch.setattr(drv, "draft_extend_outside_round", leak_then_catch_up)
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.flip_on()
    exc = excinfo.value
    assert "before_draft_extend_for_decode" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert (exc.invariant, exc.action) == ("kv_conservation", "draft_catch_up"), str(exc)
    assert "3 slots leaked" in str(exc), str(exc)


def test_a_merge_result_found_at_fault_is_traced_with_the_requests_it_names(
        runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Trace mode, the merge above whose draft input keeps only the running rows: the `refine` record of the
    merge's result holds the violation with the requests it names, by their SGLang rids."""
    import json

    from sglang.srt.speculative.eagle_info import EagleDraftInput

    from shim.guard.core import Mode

    trace = tmp_path / "merge.jsonl"
    gf.configure_guard(runtime, CATCH_UP, mode=Mode.TRACE, trace=trace)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), CATCH_UP)
    drv.admit(gf.make_reqs("r", 2, max_new_tokens=40, shared_prefix=gf.SYSTEM_PROMPT))
    drv.decode()
    late = drv.prefill(gf.make_reqs("late", 1, shared_prefix=gf.SYSTEM_PROMPT))
    late.forward_mode = late.forward_mode.DECODE
    monkeypatch.setattr(EagleDraftInput, "merge_batch", lambda self, other: None)
    drv.batch.merge_batch(late)
    runtime.reset()
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    found = [(v["invariant"], v["rids"]) for r in records if r["kind"] == "refine"
             and r["where"] == "ScheduleBatch.merge_batch (result)" for v in r["violations"]]
    assert found == [("spec_info_matches_batch", ["r0", "r1", "late0"])], found


def test_a_request_wrong_just_before_a_filter_is_found_at_the_filter(runtime: Any, model_dir: Path) -> None:
    """Speculation off, three running requests: one leaves the batch while another's allocated length is one past
    what it holds (no slot allocated for it). The filter reads the requests left (`Guard.filter` overlaying `reqs`)
    and names it there."""
    drv = _driver(runtime, model_dir, n=3)
    drv.flip_off()
    drv.decode()
    drv.batch.reqs[0].kv.kv_allocated_len += 1
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.batch.filter_batch(keep_indices=[0, 1])
    exc = excinfo.value
    assert "around_filter_batch" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert exc.action == "filter_batch", str(exc)
    assert str(exc).rstrip().endswith(" [ScheduleBatch.filter_batch]"), str(exc)


def test_a_retraction_that_keeps_its_row_is_found_at_the_retraction(runtime: Any, model_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Speculation off: a retraction gives its slots back but not its req_to_token row (the row's free skipped): the
    retracted request still holds a row. The retraction reads the request it released (`Guard.release` passing
    `reqs` to the `retract` step) and names it there."""
    from sglang.srt.mem_cache.common import release_kv_cache

    drv = _driver(runtime, model_dir)
    drv.flip_off()
    drv.decode()
    pool, victim = drv.pools.req_to_token_pool, drv.batch.reqs[0]
    free = pool.free
    monkeypatch.setattr(pool, "free", lambda req, *a, **k: None if req is victim else free(req, *a, **k))
    with pytest.raises(SpecFlipViolation) as excinfo:
        release_kv_cache(victim, drv.batch.tree_cache, checkpoint=False)
    exc = excinfo.value
    assert "around_release_kv_cache" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert (exc.action, exc.rids) == ("retract", ("r0",)), str(exc)


def test_a_finish_that_frees_anothers_slot_in_a_balanced_free_group_is_blamed_on_it(
        runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slot values off. Of two finishes in one free group, r0's release frees r1's newest slot instead of its own
    (views of the rows, as SGLang frees); r1's release then frees its whole row. The group's counts balance (as many
    slots freed as the two held), but what r0's release itself was found to do (`slots_freed_owned`) is reported on
    r0's finish: `_check_releases` takes the group as one step only when no release was found at fault."""
    monkeypatch.setattr(runtime, "slot_values", "off")
    drv = _two_finishing_together(runtime, model_dir)
    r0, r1 = drv.batch.reqs
    allocator, rows = drv.pools.allocator, drv.pools.req_to_token_pool.req_to_token
    free = allocator.free
    newest = r1.kv.kv_committed_len - 1
    stolen = rows[r1.kv.req_pool_idx, newest:newest + 1]

    def free_anothers_instead(slots: Any) -> Any:
        monkeypatch.setattr(allocator, "free", free)  # r0's release only
        free(slots[:-1])
        return free(stolen)

    release = h.release_finished_cpu_stand_in
    monkeypatch.setattr(allocator, "free", free_anothers_instead)
    with pytest.raises(SpecFlipViolation) as excinfo:
        release(drv.pools, drv.batch)
    exc = excinfo.value
    assert (exc.invariant, exc.action) == ("slots_freed_owned", "finish"), str(exc)


def test_a_plain_decode_prepared_with_a_draft_input_a_row_short_is_found_at_its_prepare(
        runtime: Any, model_dir: Path) -> None:
    """Speculation off (this design takes the draft input off the batch at the flip): a draft input of one row put
    on the running batch of two before `prepare_for_decode`. The step's look at the running batch it prepared
    (`Guard.prepare_for_decode` overlaying `running`) names it there, as `spec_info_matches_batch`, not the plain
    launch after it."""
    import torch

    drv = _driver(runtime, model_dir)
    drv.flip_off()
    drv.decode()
    draft_input = h.make_eagle_draft_input(drv.batch)
    draft_input.filter_batch(new_indices=torch.tensor([0]))
    drv.batch.spec_info = draft_input
    with pytest.raises(SpecFlipViolation) as excinfo, h.patch_assign_req_to_token_pool():
        drv.batch.prepare_for_decode()
    exc = excinfo.value
    assert "after_prepare_for_decode" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert (exc.invariant, exc.action) == ("spec_info_matches_batch", "prepare_for_decode"), str(exc)


def _one_past(req: Any) -> None:
    """The request's allocated length one past the slots it holds (none allocated for it)."""
    req.kv.kv_allocated_len += 1


def test_a_request_wrong_just_before_a_merge_is_found_at_the_merge(runtime: Any, model_dir: Path) -> None:
    """A running request wrong just before `merge_batch` takes a prefilled one in: the merge reads the requests of
    both batches (`Guard.merge` passing `reqs` on) and names it there."""
    drv = _driver(runtime, model_dir)
    drv.decode()
    late = drv.prefill(gf.make_reqs("late", 1, shared_prefix=gf.SYSTEM_PROMPT))
    late.forward_mode = late.forward_mode.DECODE
    _one_past(drv.batch.reqs[0])
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.batch.merge_batch(late)
    exc = excinfo.value
    assert "around_merge_batch" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert exc.action == "merge_batch", str(exc)
    assert str(exc).rstrip().endswith(" [ScheduleBatch.merge_batch]"), str(exc)


def test_a_request_wrong_just_before_a_draft_is_found_at_the_draft(runtime: Any, model_dir: Path) -> None:
    """A running request's allocated length one past what it holds, set after `prepare_for_decode` and before the
    round's draft, on a reqs list the prepare's reading did not read (so the draft reads its requests afresh,
    `_take_prepared_reading`): the draft reads them (`Guard.draft` passing `reqs` to its step) and names it there,
    not the verify launch after it."""
    drv = _driver(runtime, model_dir)
    drv.decode()
    with h.patch_assign_req_to_token_pool():
        drv.batch.prepare_for_decode()
    drv.batch.reqs = list(drv.batch.reqs)
    _one_past(drv.batch.reqs[0])
    drv.worker.accept_lens_cpu_stand_in = [1, 1]
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.worker.forward_batch_generation(drv.batch)
    exc = excinfo.value
    assert "before_draft" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert exc.action == "draft", str(exc)
    assert str(exc).rstrip().endswith(" [EagleDraftWorker.draft]"), str(exc)


def test_a_request_wrong_just_before_a_verify_launch_is_found_at_its_launch(runtime: Any, model_dir: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A running request's allocated length one past what it holds, set inside the draft (after its step was
    checked, before the verify launches), on a reqs list the draft's reading did not read: the launch's look at
    the batch (`Guard.verify_launch` overlaying `reqs`) names it there, not the round's settling after it."""
    drv = _driver(runtime, model_dir)
    drv.decode()
    with h.patch_assign_req_to_token_pool():
        drv.batch.prepare_for_decode()
    build = h.make_eagle_verify_input

    def build_then_wrong(batch: Any, **kwargs: Any) -> Any:
        verify_input = build(batch, **kwargs)
        batch.reqs = list(batch.reqs)
        _one_past(batch.reqs[0])
        return verify_input

    monkeypatch.setattr(h, "make_eagle_verify_input", build_then_wrong)
    drv.worker.accept_lens_cpu_stand_in = [1, 1]
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.worker.forward_batch_generation(drv.batch)
    exc = excinfo.value
    assert "before_verify" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert "seen at: EAGLEWorkerV2.verify (TARGET_VERIFY launch)" in str(exc), str(exc)


def test_a_release_of_a_request_retracted_already_is_no_step(runtime: Any, model_dir: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Speculation off: a request retracted (its KV released, the guard holds it as waiting), then released again
    before any re-prefill. SGLang's `release_kv_cache` returns at once for a request holding no KV where the tree cache
    is mamba-capable (it may free a mamba state allocated before the KV); the cache's `supports_mamba` answer is stood
    in here (a hybrid mamba model's cache is not built on this CPU). The guard's `release` takes that as no step: a
    request it holds as holding no KV releases nothing, no second `retract` is recorded (`Guard.release`'s early
    return)."""
    from sglang.srt.mem_cache.common import release_kv_cache

    drv = _driver(runtime, model_dir)
    drv.flip_off()
    drv.decode()
    victim, tree_cache = drv.batch.reqs[0], drv.batch.tree_cache
    release_kv_cache(victim, tree_cache, checkpoint=False)  # the retraction: a step of its own
    guard = runtime.guard
    steps, last = guard.step_number, guard.history[-1]
    assert last[1].name == "retract", last
    monkeypatch.setattr(tree_cache, "supports_mamba", lambda: True, raising=False)
    release_kv_cache(victim, tree_cache, checkpoint=False)
    # no second retraction recorded of a request that held nothing (and, raise mode, no finding raised)
    assert (guard.step_number, guard.history[-1]) == (steps, last), guard.history[-1]
