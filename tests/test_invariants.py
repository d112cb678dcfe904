"""Each invariant on hand-built states: one that holds it, one that breaks it, with the numbers named."""

from __future__ import annotations

import operator

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

import statemodel.invariants as invariants_module
import statemodel.state as state_module
from statemodel.actions import Action
from statemodel.design import Scope
from statemodel.designs import CATCH_UP, SEEDS_FINAL
from statemodel.invariants import (
    INVARIANT_NAMES,
    INVARIANTS,
    Violation,
    check_state,
    check_step,
    check_transition,
    committed_never_lost,
    draft_extend_leaves_behind,
    draft_kv_covers_prefix,
    kv_conservation,
    kv_reserve_covers_writes,
    requests_in_one_place,
    result_not_after_reprefill,
    running_within_cap,
    seq_lens_growth,
    shapes_agree,
    spec_info_matches_batch,
    spec_info_matches_mode,
)
from statemodel.state import (
    FEW_OF_MANY,
    Batch,
    FoldByIdentity,
    ForwardMode,
    GraphShape,
    Request,
    SpecInfo,
    SpecInfoKind,
    SpecMode,
    Stage,
    State,
    Status,
    Unprocessed,
    changed_indices,
)

SCOPE = Scope()


def running_req(rid: int, seq_len: int = 4, committed: int = 2, reserved: int = 0, draft_kv: int | None = None,
                hidden: bool = True) -> Request:
    return Request(rid=rid, prompt_len=seq_len - committed + 1, max_new_tokens=5, status=Status.RUNNING,
                   prefilled_len=seq_len - committed + 1, seq_len=seq_len, committed=committed, kv_held=seq_len,
                   kv_reserved=reserved, draft_kv_len=seq_len if draft_kv is None else draft_kv,
                   draft_hidden_ready=hidden)


def make_state(requests: tuple[Request, ...], running: Batch, launched: Batch | None = None, pool: int = 30,
               mode: SpecMode = SpecMode.ON, stage: Stage = Stage.SCHEDULE) -> State:
    used = sum(r.kv_held + r.kv_reserved for r in requests)
    return State(requests=requests, running=running, pending=None, launched=launched, stage=stage, spec_mode=mode,
                 num_steps=2, kv_free=pool - used, kv_pool_size=pool)


def draft_input(rows: int) -> SpecInfo:
    return SpecInfo(SpecInfoKind.DRAFT_INPUT, rows, 1)


TWO = (running_req(0), running_req(1))
RUNNING_SPEC = Batch(rids=(0, 1), forward_mode=ForwardMode.DECODE, spec_info=draft_input(2), spec_algorithm_on=True)


def test_names_are_unique_and_stable() -> None:
    assert len(set(INVARIANT_NAMES)) == len(INVARIANT_NAMES)
    assert set(INVARIANT_NAMES) == {
        "spec_info_matches_mode", "spec_info_matches_batch", "shapes_agree", "kv_reserve_covers_writes",
        "kv_conservation", "draft_kv_covers_prefix", "seq_lens_growth", "committed_never_lost",
        "result_not_after_reprefill", "running_within_cap", "requests_in_one_place",
    }
    assert all(inv.summary for inv in INVARIANTS)


def test_plain_decode_with_draft_input_left_breaks_spec_info_matches_mode() -> None:
    # the seeds' attempt 1 at 10 requests x 16 draft tokens
    reqs = tuple(running_req(i) for i in range(10))
    launched = Batch(rids=tuple(range(10)), forward_mode=ForwardMode.DECODE, spec_info=draft_input(10),
                     spec_algorithm_on=True, out_cache_loc_width=10, graph=GraphShape(16, 16))
    state = make_state(reqs, attrs.evolve(launched, graph=None), launched, pool=200, mode=SpecMode.OFF)
    names = [v.invariant for v in check_state(state, SCOPE)]
    assert names[0] == "spec_info_matches_mode"
    shape = [v for v in shapes_agree(state, SCOPE)]
    assert "16 requests x 16 tokens = 256 rows" in shape[0].message
    assert "10 requests x 1 tokens = 10" in shape[0].message


def test_clean_plain_decode_holds() -> None:
    launched = Batch(rids=(0, 1), forward_mode=ForwardMode.DECODE, out_cache_loc_width=2, graph=GraphShape(2, 1))
    state = make_state(TWO, attrs.evolve(launched, graph=None), launched, mode=SpecMode.OFF)
    assert check_state(state, SCOPE) == []


def test_verify_input_must_match_target_verify() -> None:
    launched = Batch(rids=(0, 1), forward_mode=ForwardMode.TARGET_VERIFY, spec_info=draft_input(2),
                     spec_algorithm_on=True, out_cache_loc_width=2)
    state = make_state(TWO, RUNNING_SPEC, launched)
    assert [v.invariant for v in spec_info_matches_mode(state, SCOPE)] == ["spec_info_matches_mode"]


def test_spec_info_rows_must_match_batch() -> None:
    short = attrs.evolve(RUNNING_SPEC, spec_info=draft_input(1))
    bad = spec_info_matches_batch(make_state(TWO, short), SCOPE)
    assert bad and bad[0].expected == "2" and bad[0].actual == "1"
    assert spec_info_matches_batch(make_state(TWO, RUNNING_SPEC), SCOPE) == []


def test_out_cache_loc_width_must_equal_tokens_written() -> None:
    reqs = tuple(running_req(i, reserved=3) for i in range(2))
    good = Batch(rids=(0, 1), forward_mode=ForwardMode.TARGET_VERIFY,
                 spec_info=SpecInfo(SpecInfoKind.VERIFY_INPUT, 2, 3), spec_algorithm_on=True,
                 out_cache_loc_width=6, graph=GraphShape(2, 3))
    assert shapes_agree(make_state(reqs, RUNNING_SPEC, good), SCOPE) == []
    bad = attrs.evolve(good, out_cache_loc_width=2)
    found = shapes_agree(make_state(reqs, RUNNING_SPEC, bad), SCOPE)
    assert found[0].message == ("out_cache_loc holds 2 slots; a TARGET_VERIFY step of 2 requests x 3 writes 6")


def test_graph_bucket_smaller_than_batch_is_a_shape_error() -> None:
    launched = Batch(rids=(0, 1), forward_mode=ForwardMode.DECODE, out_cache_loc_width=2, graph=GraphShape(1, 1))
    assert shapes_agree(make_state(TWO, launched, launched, mode=SpecMode.OFF), SCOPE)


def test_kv_conservation_catches_leak_and_double_free() -> None:
    state = make_state(TWO, RUNNING_SPEC)
    assert kv_conservation(state, SCOPE) == []
    leak = kv_conservation(attrs.evolve(state, kv_free=state.kv_free - 1), SCOPE)
    assert "1 slots leaked" in leak[0].message
    double = kv_conservation(attrs.evolve(state, kv_free=state.kv_free + 2), SCOPE)
    assert "2 slots freed twice" in double[0].message
    # balanced counts with a negative free count (held beyond the pool): named as such, not "0 slots freed twice"
    first = TWO[0]
    over = attrs.evolve(state, kv_free=-3, requests=(first.replace(kv_held=first.kv_held + state.kv_free + 3),
                                                     *state.requests[1:]))
    beyond = kv_conservation(over, SCOPE)
    assert over.kv_accounted() == over.kv_pool_size and "3 slots handed out beyond the pool" in beyond[0].message
    finished_holding = TWO[0].replace(status=Status.FINISHED)
    held = kv_conservation(make_state((finished_holding, TWO[1]), RUNNING_SPEC), SCOPE)
    assert any("finished but still holds" in v.message for v in held)


def test_verify_beyond_reserve_breaks_kv_reserve_covers_writes() -> None:
    reqs = (running_req(0, reserved=3), running_req(1, reserved=2))
    launched = Batch(rids=(0, 1), forward_mode=ForwardMode.TARGET_VERIFY,
                     spec_info=SpecInfo(SpecInfoKind.VERIFY_INPUT, 2, 3), spec_algorithm_on=True,
                     out_cache_loc_width=6)
    found = kv_reserve_covers_writes(make_state(reqs, RUNNING_SPEC, launched), SCOPE)
    assert found[0].rids == (1,) and found[0].expected == "3" and found[0].actual == "2"


def test_running_within_cap_depends_on_mode() -> None:
    three = tuple(running_req(i) for i in range(3))
    batch = Batch(rids=(0, 1, 2), forward_mode=ForwardMode.DECODE)
    assert running_within_cap(make_state(three, batch, mode=SpecMode.OFF), SCOPE) == []
    assert running_within_cap(make_state(three, batch, mode=SpecMode.ON), SCOPE)[0].expected == "<= 2"


def test_draft_needs_current_draft_kv_and_hidden_state() -> None:
    current = make_state(TWO, RUNNING_SPEC, stage=Stage.PREPARED)
    draft = Action("draft", (2,))
    assert draft_kv_covers_prefix(current, draft, current, SCOPE, CATCH_UP) == []
    stale = make_state((running_req(0, draft_kv=3), TWO[1]), RUNNING_SPEC, stage=Stage.PREPARED)
    found = draft_kv_covers_prefix(stale, draft, stale, SCOPE, CATCH_UP)
    assert found[0].rids == (0,) and "covering 3 of 4" in found[0].message
    # steps=0 drafts nothing: a stale draft is allowed there
    assert draft_kv_covers_prefix(stale, Action("draft", (0,)), stale, SCOPE, CATCH_UP) == []
    lost = make_state(TWO, attrs.evolve(RUNNING_SPEC, spec_info=SpecInfo.none()), stage=Stage.PREPARED)
    assert "draft input" in draft_kv_covers_prefix(lost, draft, lost, SCOPE, CATCH_UP)[0].message


def test_seq_lens_grow_by_accepted_plus_one() -> None:
    launched = Batch(rids=(0, 1), forward_mode=ForwardMode.TARGET_VERIFY,
                     spec_info=SpecInfo(SpecInfoKind.VERIFY_INPUT, 2, 3), spec_algorithm_on=True)
    before = make_state(TWO, RUNNING_SPEC, launched, stage=Stage.DRAFTED)
    verify = Action("verify", (2, 0))
    good = tuple(r.replace(seq_len=r.seq_len + n, committed=r.committed + n)
                 for r, n in zip(TWO, (3, 1), strict=True))
    assert seq_lens_growth(before, verify, attrs.evolve(before, requests=good), SCOPE, CATCH_UP) == []
    bad = tuple(r.replace(seq_len=r.seq_len + n) for r, n in zip(TWO, (3, 2), strict=True))
    found = seq_lens_growth(before, verify, attrs.evolve(before, requests=bad), SCOPE, CATCH_UP)
    assert [v.rids for v in found] == [(1,)]
    assert found[0].expected == "5" and found[0].actual == "6"
    # both grown by request 0's count: request 1 is named (each request held to its own growth)
    both = tuple(r.replace(seq_len=r.seq_len + 3) for r in TWO)
    assert [v.rids for v in seq_lens_growth(before, verify, attrs.evolve(before, requests=both), SCOPE, CATCH_UP)] \
        == [(1,)]
    # a request outside the verify (finished earlier) read again as another object: it had to grow by nothing
    done = running_req(2)._replace(status=Status.FINISHED, kv_held=0)
    three = make_state((*TWO, done), RUNNING_SPEC, launched, stage=Stage.DRAFTED)
    again = (*bad, done._replace(committed=done.committed))
    assert [v.rids for v in seq_lens_growth(three, verify, attrs.evolve(three, requests=again), SCOPE, CATCH_UP)] \
        == [(1,)]
    # seq_lens that went back, each by as much as before + after makes the growth (2 -> 1, 1 -> 0): both named
    short = make_state((running_req(0, seq_len=2, committed=1), running_req(1, seq_len=1, committed=0)),
                       RUNNING_SPEC, launched, stage=Stage.DRAFTED)
    back = tuple(r.replace(seq_len=r.seq_len - 1) for r in short.requests)
    assert [v.rids for v in seq_lens_growth(short, verify, attrs.evolve(short, requests=back), SCOPE, CATCH_UP)] \
        == [(0,), (1,)]


def test_seq_lens_growth_names_every_request_of_a_large_batch_that_did_not_grow() -> None:
    """A verify of FEW_OF_MANY requests (where `changed_indices` scans for the few that moved) after which no request
    moved at all: each had to grow by its accepted count + 1, so each is named; all of them grown: clean."""
    n = FEW_OF_MANY
    reqs = tuple(running_req(i) for i in range(n))
    running = Batch(rids=tuple(range(n)), forward_mode=ForwardMode.DECODE, spec_info=draft_input(n),
                    spec_algorithm_on=True)
    launched = Batch(rids=tuple(range(n)), forward_mode=ForwardMode.TARGET_VERIFY,
                     spec_info=SpecInfo(SpecInfoKind.VERIFY_INPUT, n, 3), spec_algorithm_on=True)
    before = make_state(reqs, running, launched, stage=Stage.DRAFTED, pool=200)
    verify = Action("verify", (0,) * n)
    assert [v.rids for v in seq_lens_growth(before, verify, before, SCOPE, CATCH_UP)] == [(i,) for i in range(n)]
    grown = tuple(r.replace(seq_len=r.seq_len + 1, committed=r.committed + 1) for r in reqs)
    assert seq_lens_growth(before, verify, attrs.evolve(before, requests=grown), SCOPE, CATCH_UP) == []


def test_seq_lens_growth_at_a_finish_follows_the_designs_worker() -> None:
    """Request 0 has room for 2 more outputs and its verify accepts 2 drafts + the bonus: the v1 worker
    (seeds_final) moves seq_len by the 2 it keeps, the v2 worker (plain_off_catch_up) by all 3."""
    near_done = (running_req(0, seq_len=5, committed=3), TWO[1])
    launched = Batch(rids=(0, 1), forward_mode=ForwardMode.TARGET_VERIFY,
                     spec_info=SpecInfo(SpecInfoKind.VERIFY_INPUT, 2, 3), spec_algorithm_on=True)
    before = make_state(near_done, RUNNING_SPEC, launched, stage=Stage.DRAFTED)
    verify = Action("verify", (2, 0))
    for design, grown, other, other_grown in ((SEEDS_FINAL, 2, CATCH_UP, 3), (CATCH_UP, 3, SEEDS_FINAL, 2)):
        after = attrs.evolve(before, requests=(near_done[0].replace(seq_len=5 + grown, committed=5),
                                               near_done[1].replace(seq_len=5, committed=3)))
        assert seq_lens_growth(before, verify, after, SCOPE, design) == []
        found = seq_lens_growth(before, verify, after, SCOPE, other)
        assert [v.rids for v in found] == [(0,)]
        assert (found[0].expected, found[0].actual) == (str(5 + other_grown), str(5 + grown))


def test_committed_tokens_are_never_lost() -> None:
    before = make_state(TWO, RUNNING_SPEC)
    fewer = (TWO[0].replace(committed=1), TWO[1])
    found = committed_never_lost(before, Action("retract", (0,)), attrs.evolve(before, requests=fewer), SCOPE,
                                 CATCH_UP)
    assert found[0].message == "retract dropped request 0's output from 2 to 1 tokens"


def test_check_step_orders_violations_by_invariant_order() -> None:
    reqs = tuple(running_req(i) for i in range(2))
    launched = Batch(rids=(0, 1), forward_mode=ForwardMode.DECODE, spec_info=draft_input(2), spec_algorithm_on=True,
                     out_cache_loc_width=1, graph=GraphShape(2, 3))
    before = make_state(reqs, RUNNING_SPEC, stage=Stage.PREPARED, mode=SpecMode.OFF)
    after = attrs.evolve(before, launched=launched, kv_free=before.kv_free - 1)
    names = [v.invariant for v in check_step(before, Action("plain_decode"), after, SCOPE, CATCH_UP)]
    assert names == sorted(names, key=INVARIANT_NAMES.index)
    assert names[0] == "spec_info_matches_mode" and "kv_conservation" in names


def test_check_transition_lists_several_step_violations_in_report_order() -> None:
    """A plain step whose seq_lens did not grow and that took a committed token from each of two requests: four step
    violations of two invariants, in report order, each invariant's in request order (the sort of several)."""
    before = make_state(TWO, RUNNING_SPEC)
    after = attrs.evolve(before, requests=tuple(r.replace(committed=r.committed - 1) for r in TWO))
    found = check_transition(before, Action("plain_decode"), after, SCOPE, CATCH_UP)
    assert [(v.invariant, v.rids) for v in found] == [
        ("seq_lens_growth", (0,)), ("seq_lens_growth", (1,)), ("committed_never_lost", (0,)),
        ("committed_never_lost", (1,))]
    assert INVARIANT_NAMES.index("seq_lens_growth") < INVARIANT_NAMES.index("committed_never_lost")


def test_unprocessed_verify_keeps_its_worst_case_reserved_under_overlap() -> None:
    """Overlap: step N's verify (steps 2) is unprocessed while N+1's verify (3 tokens a request) launches:
    the reserve must hold both worst cases, 6; a request finished since is not counted (its slots were freed
    after the launch, and reuse comes later in stream order)."""
    overlap = attrs.evolve(SCOPE, overlap=True)
    launched = Batch(rids=(0, 1), forward_mode=ForwardMode.TARGET_VERIFY,
                     spec_info=SpecInfo(SpecInfoKind.VERIFY_INPUT, 2, 3), spec_algorithm_on=True,
                     out_cache_loc_width=6)
    n = Unprocessed(rids=(0, 1), steps=2, draft_extended=True)
    reqs = (running_req(0, reserved=6), running_req(1, reserved=5))
    state = attrs.evolve(make_state(reqs, RUNNING_SPEC, launched), unprocessed=(n,))
    found = kv_reserve_covers_writes(state, overlap)
    assert [(v.rids, v.expected, v.actual) for v in found] == [((1,), "6", "5")]
    assert "unprocessed may write 3 tokens of request 1" in found[0].message
    # between launches: the unprocessed verify alone needs 3 (a reserve released under it breaks this)
    between = attrs.evolve(make_state((running_req(0, reserved=3), running_req(1, reserved=2)), RUNNING_SPEC),
                           unprocessed=(n,))
    assert [v.rids for v in kv_reserve_covers_writes(between, overlap)] == [(1,)]
    # a plain step's result writes nothing more; a finished request needs nothing
    finished = running_req(1).replace(status=Status.FINISHED, kv_held=0, kv_reserved=0)
    done = attrs.evolve(make_state((running_req(0, reserved=3), finished), RUNNING_SPEC),
                        unprocessed=(n, Unprocessed(rids=(0,), steps=None)))
    assert kv_reserve_covers_writes(done, overlap) == []
    # two unprocessed verifies of one request: their worst cases add up (3 + 3), more than either alone
    two = attrs.evolve(make_state((running_req(0, reserved=5), running_req(1, reserved=6)), RUNNING_SPEC),
                       unprocessed=(n, n))
    assert [(v.rids, v.expected, v.actual) for v in kv_reserve_covers_writes(two, overlap)] == [((0,), "6", "5")]


def test_process_result_must_grow_seq_len_by_the_accepted_run() -> None:
    from statemodel.designs import get_design

    overlap = attrs.evolve(SCOPE, overlap=True)
    design = get_design("v2_switch_reserve_sync_overlap")
    before = attrs.evolve(make_state((running_req(0, reserved=6),), RUNNING_SPEC),
                          unprocessed=(Unprocessed(rids=(0,), steps=2, draft_extended=True),))
    action = Action("process_result", (1,))
    good = attrs.evolve(before, unprocessed=(), requests=(before.req(0).replace(
        seq_len=6, committed=4, kv_held=6, kv_reserved=4, draft_kv_len=6),))
    assert seq_lens_growth(before, action, good, overlap, design) == []
    short = attrs.evolve(good, requests=(good.req(0).replace(seq_len=5),))
    assert [v.expected for v in seq_lens_growth(before, action, short, overlap, design)] == ["6"]
    # the launch itself grows nothing under overlap
    assert [v.expected for v in seq_lens_growth(before, Action("verify"), good, overlap, design)] == ["4"]


# --- a step that moves a few requests of a large batch (statemodel.state.FoldByIdentity, changed_indices) -----------

def _batch_of(count: int) -> tuple[Request, ...]:
    return tuple(running_req(i, seq_len=4 + i % 3, reserved=i % 2) for i in range(count))


_FOLDS = (  # (compute, move, join) as each use passes them
    (state_module._held_and_reserved, state_module._move_held_and_reserved, operator.add),
    (state_module._count_chunked, state_module._move_chunked, operator.add),
    (invariants_module._holding_no_kv, invariants_module._move_holding_no_kv, operator.add),
)
_EDIT = st.tuples(st.integers(0, 63), st.sampled_from(list(Status)), st.integers(0, 9), st.integers(0, 3),
                  st.integers(0, 9))


@settings(max_examples=300, deadline=None)
@given(count=st.integers(1, 64), edits=st.lists(_EDIT, max_size=12), appended=st.lists(_EDIT, max_size=9))
def test_a_fold_moved_by_the_requests_a_step_changed_is_the_fold_computed_afresh(
        count: int, edits: list[tuple[int, Status, int, int, int]],
        appended: list[tuple[int, Status, int, int, int]]) -> None:
    """`appended`: requests that join the tuple at its end (the guard's arrivals), each in any status."""
    before = _batch_of(count)
    after = list(before)
    for index, status, held, reserved, committed in edits:
        after[index % count] = after[index % count].replace(status=status, kv_held=held, kv_reserved=reserved,
                                                            committed=committed)
    for _, status, held, reserved, committed in appended:
        after.append(running_req(len(after)).replace(status=status, kv_held=held, kv_reserved=reserved,
                                                     committed=committed))
    after_t = tuple(after)
    for compute, move, join in _FOLDS:
        fold: FoldByIdentity = FoldByIdentity()
        assert fold(before, compute, move, join) == compute(before)
        assert fold(after_t, compute, move, join) == compute(after_t), compute.__name__


def test_a_fold_of_a_large_batch_is_moved_by_the_changed_requests_only() -> None:
    """The fast path is taken where it should be (the property above holds without it too): a finish of one request
    of 32 moves the fold, and a step that moves every request computes it afresh."""
    before = _batch_of(32)
    finished = before[7].replace(status=Status.FINISHED, kv_held=0, kv_reserved=0)
    after = before[:7] + (finished,) + before[8:]
    computed = []

    def compute(requests: tuple[Request, ...]) -> int:
        computed.append(requests)
        return state_module._held_and_reserved(requests)

    move, join = state_module._move_held_and_reserved, operator.add
    fold: FoldByIdentity = FoldByIdentity()
    fold(before, compute, move, join)
    assert fold(after, compute, move, join) == state_module._held_and_reserved(after)
    assert computed == [before]  # the second value was moved, not computed
    # an arrival: the same requests and one more at the end; only the new one is folded
    arrived = after + (running_req(32, reserved=3),)
    assert fold(arrived, compute, move, join) == state_module._held_and_reserved(arrived)
    assert computed[1:] == [arrived[32:]]
    grown = tuple(r.replace(kv_held=r.kv_held + 1) for r in arrived)
    assert fold(grown, compute, move, join) == state_module._held_and_reserved(grown)
    assert computed[-1] is grown
    many = grown + tuple(running_req(i) for i in range(33, 40))  # more than an eighth appended: afresh
    assert fold(many, compute, move, join) == state_module._held_and_reserved(many)
    assert computed[-1] is many
    assert changed_indices(before, after) == [7]
    assert changed_indices(after, grown) is None  # more than an eighth moved


def test_a_finish_in_a_large_batch_still_breaks_the_step_invariants_it_breaks() -> None:
    """seq_lens_growth and committed_never_lost look only at the requests a step changed when few of many did: a
    finish that also moves its seq_len or drops its output is still caught, and a clean one is clean."""
    requests = _batch_of(32)
    running = Batch(rids=tuple(range(32)), forward_mode=ForwardMode.DECODE, spec_info=draft_input(32),
                    spec_algorithm_on=True)
    before = make_state(requests, running, pool=400)
    finish = Action("finish", (5,))

    def after_with(r: Request) -> State:
        return attrs.evolve(before, requests=requests[:5] + (r,) + requests[6:])

    clean = after_with(requests[5].replace(status=Status.FINISHED, kv_held=0, kv_reserved=0))
    assert seq_lens_growth(before, finish, clean, SCOPE, CATCH_UP) == []
    assert committed_never_lost(before, finish, clean, SCOPE, CATCH_UP) == []
    grew = after_with(requests[5].replace(status=Status.FINISHED, seq_len=requests[5].seq_len + 1))
    assert [v.rids for v in seq_lens_growth(before, finish, grew, SCOPE, CATCH_UP)] == [(5,)]
    dropped = after_with(requests[5].replace(status=Status.FINISHED, committed=0))
    assert [v.rids for v in committed_never_lost(before, finish, dropped, SCOPE, CATCH_UP)] == [(5,)]


def test_a_finish_in_a_large_batch_that_keeps_its_kv_is_named_by_kv_conservation() -> None:
    """kv_conservation's requests holding KV in a status that holds none are moved by the requests a step changed
    when few of many did (`_HOLDING_NO_KV`, as the guard's steps change them): one finish of 32 that keeps its KV is
    named, after the whole batch was checked."""
    requests = _batch_of(32)
    running = Batch(rids=tuple(range(32)), forward_mode=ForwardMode.DECODE, spec_info=draft_input(32),
                    spec_algorithm_on=True)
    before = make_state(requests, running, pool=400)
    assert [v.rids for v in kv_conservation(before, SCOPE) if v.rids] == []
    kept = attrs.evolve(before, requests=requests[:5] + (requests[5].replace(status=Status.FINISHED),) + requests[6:])
    assert [v.rids for v in kv_conservation(kept, SCOPE) if v.rids] == [(5,)]


def test_result_not_after_reprefill_flags_a_row_kept_for_a_request_whose_reprefill_started() -> None:
    """A plain result still applying to request 0, retracted since its launch (Unprocessed.applies_to_retracted): once
    0 runs again (re-prefilled) the result commits a position the re-prefill computed: a violation; while 0 waits
    (its re-prefill will include the token) none; a result that does not apply to it, none."""
    plain = Batch(rids=(0, 1), forward_mode=ForwardMode.DECODE)
    kept = Unprocessed((0, 1), None, applies_to_retracted=(0,))
    before = attrs.evolve(make_state(TWO, plain, mode=SpecMode.ON), unprocessed=(kept,))
    action = Action("process_result")
    found = result_not_after_reprefill(before, action, before, SCOPE, CATCH_UP)
    assert [v.invariant for v in found] == ["result_not_after_reprefill"] and found[0].rids == (0,)
    waiting = attrs.evolve(before, requests=(TWO[0]._replace(status=Status.WAITING), TWO[1]))
    assert result_not_after_reprefill(waiting, action, waiting, SCOPE, CATCH_UP) == []
    voided = attrs.evolve(before, unprocessed=(Unprocessed((1,), None),))
    assert result_not_after_reprefill(voided, action, voided, SCOPE, CATCH_UP) == []


# --- slots_freed_owned reads ranges first (statemodel.identity._all_within, _tile) --------------------------------

_RANGE = st.tuples(st.integers(0, 12), st.integers(0, 6))


@settings(max_examples=400, deadline=None)
@given(spans=st.lists(_RANGE, max_size=5), own_start=st.integers(0, 6), before=st.integers(0, 14),
       after=st.one_of(st.none(), st.integers(0, 14)))
def test_slots_freed_owned_finds_what_the_positions_show(spans: list[tuple[int, int]], own_start: int, before: int,
                                                         after: int | None) -> None:
    """The ranges-first shortcut skips an owner only where its freed positions, as a set, break nothing: a request
    released whole freed only inside [own_start, allocated_before), one that keeps its row freed exactly
    [allocated_after, allocated_before)."""
    from statemodel.identity import RowOwner, RowRange, slots_freed_owned

    frees = [RowRange(3, start, start + width) for start, width in spans]
    owner = RowOwner(rid=1, row=3, own_start=own_start, allocated_before=before, allocated_after=after)
    got = {p for f in frees for p in range(f.start, f.end)}
    clean = all(own_start <= p < before for p in got) if after is None else got == set(range(after, before))
    assert (slots_freed_owned(frees, [owner], "finish") == []) == clean


# --- the whole Violation of branches no known-bad design of the default scope ends on (issue 51's mutation run) ------

def test_spec_info_rows_of_the_launched_batch_are_named_as_the_launched_batchs() -> None:
    launched = Batch(rids=(0, 1), forward_mode=ForwardMode.TARGET_VERIFY,
                     spec_info=SpecInfo(SpecInfoKind.VERIFY_INPUT, 1, 3), spec_algorithm_on=True,
                     out_cache_loc_width=6)
    named = [invariants_module.Violation(
        "spec_info_matches_batch", "the launched batch holds 2 requests but its spec_info has 1 rows", (0, 1),
        expected="2", actual="1")]
    assert spec_info_matches_batch(make_state(TWO, RUNNING_SPEC, launched), SCOPE) == named
    # checked whatever the running batch carries: one without spec_info is skipped, not the end of the check
    plain = Batch(rids=(0, 1), forward_mode=ForwardMode.DECODE)
    assert spec_info_matches_batch(make_state(TWO, plain, launched), SCOPE) == named


def test_a_finished_request_holding_kv_and_tree_tokens_is_named_with_its_counts() -> None:
    """A finished request still holding 4 + 1 slots and locking 2 tree tokens; a running one locking more tree tokens
    than the tree holds."""
    finished = running_req(0, reserved=1).replace(status=Status.FINISHED, cached_len=2)
    greedy = running_req(1).replace(cached_len=4)
    tree = (True, True, False)
    state = attrs.evolve(make_state((finished, greedy), RUNNING_SPEC), prefix_cache=tree)
    state = attrs.evolve(state, kv_free=state.kv_free - len(tree))
    V = invariants_module.Violation
    assert kv_conservation(state, SCOPE) == [
        V("kv_conservation", "request 0 is finished but still holds 4 + 1 reserved slots", (0,), expected="0",
          actual="5"),
        V("kv_conservation", "request 0 is finished and locks 2 tree tokens of 3", (0,), expected="0", actual="2"),
        V("kv_conservation", "request 1 is running and locks 4 tree tokens of 3", (1,), expected="<= 3", actual="4"),
    ]


def test_result_not_after_reprefill_names_the_token_committed_twice() -> None:
    plain = Batch(rids=(0, 1), forward_mode=ForwardMode.DECODE)
    before = attrs.evolve(make_state(TWO, plain), unprocessed=(Unprocessed((0, 1), None, applies_to_retracted=(0,)),))
    found = result_not_after_reprefill(before, Action("process_result"), before, SCOPE, CATCH_UP)
    assert [(v.rids, v.expected, v.actual, v.message) for v in found] == [
        ((0,), "the result skips it", "a token committed twice",
         "process_result commits a token of a step launched before request 0 was retracted, after its re-prefill "
         "started: that position is computed again")]


def _verify_of(rids: tuple[int, ...], tokens: int = 3) -> Batch:
    return Batch(rids=rids, forward_mode=ForwardMode.TARGET_VERIFY,
                 spec_info=SpecInfo(SpecInfoKind.VERIFY_INPUT, len(rids), tokens), spec_algorithm_on=True,
                 out_cache_loc_width=len(rids) * tokens)


def test_kv_reserve_covers_writes_answers_each_state_afresh_past_its_memo() -> None:
    """The memo of the last state's answer (`_LAST_RESERVE_SHORT`) holds only for the same requests and rids: the same
    launched batch over other requests, and the same requests under another launched batch, are checked again."""
    launched = _verify_of((0, 1))
    covered = (running_req(0, reserved=3), running_req(1, reserved=3))
    short = (running_req(0, reserved=3), running_req(1, reserved=2))
    assert kv_reserve_covers_writes(make_state(covered, RUNNING_SPEC, launched), SCOPE) == []
    assert [v.rids for v in kv_reserve_covers_writes(make_state(short, RUNNING_SPEC, launched), SCOPE)] == [(1,)]
    # one requests tuple, two launches: over request 0 (covered), then over request 1 (short)
    assert kv_reserve_covers_writes(make_state(short, RUNNING_SPEC, _verify_of((0,))), SCOPE) == []
    assert [v.rids for v in kv_reserve_covers_writes(make_state(short, RUNNING_SPEC, _verify_of((1,))), SCOPE)] == [
        (1,)]
    # the same state twice: the memo's answer, the same as the first
    state = make_state(short, RUNNING_SPEC, launched)
    assert kv_reserve_covers_writes(state, SCOPE) == kv_reserve_covers_writes(state, SCOPE) != []


def test_a_prefill_whose_out_cache_loc_is_not_its_extend_tokens_is_named_by_its_requests_alone() -> None:
    """A prefill writes its extend tokens, no fixed count per request: the line gives the batch's size alone."""
    prefill = Batch(rids=(0, 1), forward_mode=ForwardMode.EXTEND, extend_tokens=7, out_cache_loc_width=6)
    assert [(v.message, v.expected, v.actual) for v in shapes_agree(make_state(TWO, RUNNING_SPEC, prefill), SCOPE)] \
        == [("out_cache_loc holds 6 slots; a EXTEND step of 2 requests writes 7", "7", "6")]


def test_kv_reserve_covers_writes_takes_its_memo_only_for_as_many_groups_each_the_same() -> None:
    """A verify over request 0 (4 tokens a request) leaves request 1 unchecked; then the same requests, an unprocessed
    verify over the same rids object and a launch over request 1 (2 + 2: the same most) must check request 1, which
    has nothing reserved: the last answer holds for the one group both share, not for the new one."""
    reqs = (running_req(0, reserved=4), running_req(1, reserved=0))
    rids = (0,)
    assert kv_reserve_covers_writes(make_state(reqs, RUNNING_SPEC, _verify_of(rids, tokens=4)), SCOPE) == []
    state = attrs.evolve(make_state(reqs, RUNNING_SPEC, _verify_of((1,), tokens=2)),
                         unprocessed=(Unprocessed(rids=rids, steps=1),))
    assert [v.rids for v in kv_reserve_covers_writes(state, SCOPE)] == [(1,)]


def test_kv_reserve_covers_writes_names_the_request_with_the_fewest_slots_reserved() -> None:
    reqs = (running_req(0, reserved=2), running_req(1, reserved=1))
    found = kv_reserve_covers_writes(make_state(reqs, RUNNING_SPEC, _verify_of((0, 1))), SCOPE)
    assert [(v.rids, v.expected, v.actual, v.message) for v in found] == [
        ((0, 1), "3", "1", "the verify step writes 3 tokens per request but only 1 slots are reserved")]


def test_kv_reserve_covers_writes_says_steps_for_a_plain_steps_reserve_slot_and_verifies_otherwise() -> None:
    overlap = attrs.evolve(SCOPE, overlap=True)
    reqs = (running_req(0, reserved=0), running_req(1, reserved=3))
    plain = make_state(reqs, RUNNING_SPEC)
    verify = Unprocessed(rids=(0, 1), steps=2, draft_extended=True)
    found = kv_reserve_covers_writes(attrs.evolve(plain, unprocessed=(verify,)), overlap)
    assert [v.message for v in found] == [
        "launched verifies whose results are unprocessed may write 3 tokens of request 0, "
        "but only 0 slots are reserved"]
    slot = Unprocessed(rids=(0,), steps=None, reserve_slot=True)
    found = kv_reserve_covers_writes(attrs.evolve(plain, unprocessed=(slot,)), overlap)
    assert [v.message for v in found] == [
        "launched steps whose results are unprocessed may write 1 tokens of request 0, "
        "but only 0 slots are reserved"]


def test_requests_in_one_place_names_a_running_request_in_no_batch() -> None:
    """Request 1 left the running batch unfinished (the guard's mutants' fault: dropped as the prefilled batch became
    the running batch): it keeps its KV, so kv_conservation holds, and only this invariant names it."""
    state = make_state(TWO, attrs.evolve(RUNNING_SPEC, rids=(0,), spec_info=draft_input(1)))
    assert not kv_conservation(state, SCOPE)
    [v] = requests_in_one_place(state, SCOPE)
    assert (v.invariant, v.rids, v.expected, v.actual) == (
        "requests_in_one_place", (1,), "in the running or the prefilled batch", "in no batch")
    assert v.message == ("request 1 is running (2 of 5 output tokens, 4 KV slots held) but in neither the running "
                         "batch nor the prefilled batch: it is never decoded again")
    assert [x.invariant for x in check_state(state, SCOPE)] == ["requests_in_one_place"]
    # in the prefilled batch instead, it is in one place
    assert not requests_in_one_place(state.replace(pending=Batch(rids=(1,), forward_mode=ForwardMode.DECODE)), SCOPE)
    assert not requests_in_one_place(make_state(TWO, RUNNING_SPEC), SCOPE)


def test_requests_in_one_place_names_a_request_in_two_places_or_waiting_in_a_batch() -> None:
    both = make_state(TWO, RUNNING_SPEC).replace(pending=Batch(rids=(1,), forward_mode=ForwardMode.DECODE))
    [v] = requests_in_one_place(both, SCOPE)
    assert (v.invariant, v.message, v.rids, v.expected, v.actual) == (
        "requests_in_one_place", "request 1 is in the running batch and the prefilled batch", (1,), "in one batch once",
        "in the running batch and the prefilled batch")
    twice = make_state(TWO, attrs.evolve(RUNNING_SPEC, rids=(0, 1, 1), spec_info=draft_input(3)))
    [v] = requests_in_one_place(twice, SCOPE)
    assert (v.message, v.rids, v.actual) == (
        "request 1 is twice in the running batch", (1,), "twice in the running batch")
    waiting = make_state((running_req(0), running_req(1)._replace(status=Status.WAITING, kv_held=0, seq_len=0)),
                         RUNNING_SPEC)
    [v] = requests_in_one_place(waiting, SCOPE)
    assert (v.invariant, v.message, v.rids, v.expected, v.actual) == (
        "requests_in_one_place", "request 1 is waiting but in the running batch", (1,), "waiting: in no batch",
        "in the running batch")
    # a finished request not yet filtered out is in its batch rightly, once
    finished = make_state((running_req(0), running_req(1)._replace(status=Status.FINISHED, kv_held=0)), RUNNING_SPEC)
    assert not requests_in_one_place(finished, SCOPE)
    finished_twice = finished.replace(running=attrs.evolve(RUNNING_SPEC, rids=(0, 1, 1), spec_info=draft_input(3)))
    assert [(v.message, v.rids) for v in requests_in_one_place(finished_twice, SCOPE)] == [
        ("request 1 is twice in the running batch", (1,))]


def test_requests_in_one_place_lets_a_request_done_or_finished_by_its_queued_result_leave() -> None:
    """A request done (its output complete, released next) may be out of the batches, and so may one whose queued
    result finishes it (0.5.23's `_reqs_finishing_inflight` leaves it out of the next step): one output token short
    and named by an unprocessed step. Two short, or not named, it is a finding."""
    batch = attrs.evolve(RUNNING_SPEC, rids=(0,), spec_info=draft_input(1))
    done = make_state((running_req(0), running_req(1, seq_len=7, committed=5)), batch)
    assert not requests_in_one_place(done, SCOPE)
    one_short = (running_req(0), running_req(1, seq_len=6, committed=4))
    queued = make_state(one_short, batch).replace(unprocessed=(Unprocessed(rids=(0, 1), steps=None),))
    assert not requests_in_one_place(queued, SCOPE)
    assert [v.rids for v in requests_in_one_place(queued.replace(unprocessed=(Unprocessed(rids=(0,), steps=None),)),
                                                  SCOPE)] == [(1,)]
    two_short = queued.replace(requests=(running_req(0), running_req(1, seq_len=5, committed=3)))
    assert [v.rids for v in requests_in_one_place(two_short, SCOPE)] == [(1,)]


def test_requests_in_one_place_answers_each_state_afresh_past_its_memo() -> None:
    """Its memos (the very objects found clean last; whether the batches' rids repeat) never answer for another
    state: the same batches with a request's status changed, and the same requests with the batch changed."""
    clean = make_state(TWO, RUNNING_SPEC)
    assert not requests_in_one_place(clean, SCOPE) and not requests_in_one_place(clean, SCOPE)
    waiting = clean.replace(requests=(TWO[0], TWO[1]._replace(status=Status.WAITING, kv_held=0, seq_len=0)))
    assert [v.rids for v in requests_in_one_place(waiting, SCOPE)] == [(1,)]
    dropped = clean.replace(running=attrs.evolve(RUNNING_SPEC, rids=(0,), spec_info=draft_input(1)))
    assert [v.rids for v in requests_in_one_place(dropped, SCOPE)] == [(1,)]
    twice = clean.replace(running=attrs.evolve(RUNNING_SPEC, rids=(0, 1, 0), spec_info=draft_input(3)))
    assert [v.rids for v in requests_in_one_place(twice, SCOPE)] == [(0,)]
    assert [v.rids for v in requests_in_one_place(twice, SCOPE)] == [(0,)]
    # the same requests, both batches emptied (the empty rids tuple is one object): both running requests are named
    assert not requests_in_one_place(clean, SCOPE)
    emptied = clean.replace(running=attrs.evolve(RUNNING_SPEC, rids=(), spec_info=draft_input(0)))
    assert [v.rids for v in requests_in_one_place(emptied, SCOPE)] == [(0,), (1,)]
    # only the running batch's rids changed (the prefilled batch's empty tuple is the same object): a finished
    # request twice in it, whose counts balance, is named
    finished = make_state((TWO[0], TWO[1]._replace(status=Status.FINISHED, kv_held=0)), RUNNING_SPEC)
    assert not requests_in_one_place(finished, SCOPE)
    finished_twice = finished.replace(running=attrs.evolve(RUNNING_SPEC, rids=(0, 1, 1), spec_info=draft_input(3)))
    assert [v.rids for v in requests_in_one_place(finished_twice, SCOPE)] == [(1,)]
    # the same requests and running batch, a prefilled batch that holds a running request too: named
    assert not requests_in_one_place(clean, SCOPE)
    both = clean.replace(pending=Batch(rids=(1,), forward_mode=ForwardMode.EXTEND))
    assert [v.rids for v in requests_in_one_place(both, SCOPE)] == [(1,)]


def test_draft_extend_leaves_behind_names_the_running_requests_the_catch_up_left_out() -> None:
    """A catch-up over part of the running batch: the running requests outside it whose draft is not current, the first
    of them named with its draft KV; a current one left out, or a stale one inside, is no fault."""
    reqs = (running_req(0, seq_len=6, draft_kv=3), running_req(1, seq_len=5, draft_kv=2),
            running_req(2, seq_len=4, draft_kv=1), running_req(3))
    state = make_state(reqs, Batch(rids=(0, 1, 2, 3), forward_mode=ForwardMode.DECODE))
    assert draft_extend_leaves_behind(state, {0}, "draft_catch_up") == [Violation(
        "draft_kv_covers_prefix",
        "draft_catch_up runs the draft over 2 of 4 running requests: request 1's draft KV stays at 2 of 5 committed "
        "tokens", (1, 2), expected="every running request in the draft_catch_up's batch", actual="2 left out")]
    assert draft_extend_leaves_behind(state, {0, 1, 2}, "draft_catch_up") == []  # request 3, left out, is current
    assert draft_extend_leaves_behind(state, {0, 1, 2, 3}, "draft_catch_up") == []


def test_a_violation_describes_itself_with_its_requests() -> None:
    assert Violation("kv_conservation", "2 slots lost", (3, 1)).describe() == \
        "kv_conservation: 2 slots lost (requests [3, 1])"
    assert Violation("kv_conservation", "2 slots lost").describe() == "kv_conservation: 2 slots lost"


def test_kv_reserve_covers_writes_names_the_launched_verify_beside_the_unprocessed_verifies() -> None:
    """A request in the launched verify and in an unprocessed verify: the message names both writes. An unprocessed
    plain step without a reserve slot (it writes nothing more) does not make the verifies "steps"."""
    overlap = attrs.evolve(SCOPE, overlap=True)
    reqs = (running_req(0, reserved=3), running_req(1, reserved=6))
    verify = Unprocessed(rids=(0, 1), steps=2, draft_extended=True)
    plain = Unprocessed(rids=(1,), steps=None)
    state = attrs.evolve(make_state(reqs, RUNNING_SPEC, _verify_of((0, 1))), unprocessed=(plain, verify))
    assert kv_reserve_covers_writes(state, overlap) == [Violation(
        "kv_reserve_covers_writes",
        "the verify step writes 3 tokens and launched verifies whose results are unprocessed may write 3 tokens of "
        "request 0, but only 3 slots are reserved", (0,), expected="6", actual="3")]


def test_a_plain_steps_result_that_grows_seq_len_is_named() -> None:
    """Under overlap a plain step grows seq_len at its launch; its result, processed later, grows nothing: a request
    grown there is named (the all-zero expected growth taken as no growth at all)."""
    from statemodel.designs import get_design

    overlap = attrs.evolve(SCOPE, overlap=True)
    design = get_design("v2_switch_reserve_sync_overlap")
    plain = attrs.evolve(RUNNING_SPEC, spec_info=SpecInfo(SpecInfoKind.NONE, 0, 0), spec_algorithm_on=False)
    before = attrs.evolve(make_state((running_req(0, reserved=1), running_req(1, reserved=1)), plain,
                                     mode=SpecMode.OFF), unprocessed=(Unprocessed(rids=(0, 1), steps=None),))
    action = Action("process_result", (1, 1))
    kept = attrs.evolve(before, unprocessed=())
    assert seq_lens_growth(before, action, kept, overlap, design) == []
    grown = attrs.evolve(kept, requests=(kept.req(0), kept.req(1).replace(seq_len=5)))
    assert seq_lens_growth(before, action, grown, overlap, design) == [Violation(
        "seq_lens_growth", "process_result moved seq_len of request 1 from 4 to 5; it must grow by 0", (1,),
        expected="4", actual="5")]
