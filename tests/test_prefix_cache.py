"""The radix cache in the model (issue 24): the tree's draft coverage moves with matches, checkpoints, releases and
evictions, `draft_kv_covers_prefix` sees a cached prefix without draft KV, and the designs with the cache on are
judged by the checker (the shipped one's exhaustive pass is in test_checker's slow shipped-design test)."""

from __future__ import annotations

import attrs
import pytest

from proofs.verdicts import run_design
from statemodel.actions import Action, draft_written_in_tree, evictable, match_len
from statemodel.design import Scope, TreeDraft
from statemodel.designs import (
    ALL_DESIGNS,
    CATCH_UP,
    KNOWN_BAD,
    RADIX_KNOWN_BAD,
    RETRACT_CATCH_UP,
    RETRACT_CATCH_UP_RADIX,
    SHIPPED,
    get_design,
)
from statemodel.invariants import check_step, draft_kv_covers_prefix, tree_draft_missing
from statemodel.model import Model
from statemodel.state import EMPTY_BATCH, Batch, ForwardMode, SpecInfo, SpecInfoKind, SpecMode, State, Status
from tests.model_helpers import initial_with, model_for, walk

UNMARKED = get_design("retract_catch_up_radix_unmarked")


def _prefilled_while_off(design) -> State:
    """Request 0 (prompt 3) prefilled in two chunks with speculation off."""
    model = model_for(design)
    return walk(model, initial_with(model, 1, 0), ["arrive", "flip_off", "prefill", "prefill"])


def test_prefill_while_off_checkpoints_its_prompt_into_the_tree_without_draft_kv() -> None:
    model = model_for(UNMARKED)
    state = walk(model, initial_with(model, 1, 0), ["arrive", "flip_off", "prefill"])
    r0 = state.req(0)
    # checkpoint_kv_cache after the first chunk: its two tokens are the tree's now, locked by the request
    assert state.prefix_cache == (False, False)
    assert (r0.status, r0.cached_len, r0.kv_held, state.kv_free) == (Status.PREFILLING, 2, 0, 9)
    state = walk(model, state, ["prefill"])
    r0 = state.req(0)
    assert state.prefix_cache == (False, False, False)
    assert (r0.status, r0.seq_len, r0.cached_len, r0.kv_held) == (Status.RUNNING, 3, 3, 0)
    assert state.kv_accounted() == state.kv_pool_size


def test_the_shipped_design_keeps_tokens_computed_without_the_draft_out_of_the_tree() -> None:
    state = _prefilled_while_off(RETRACT_CATCH_UP_RADIX)
    r0 = state.req(0)
    assert state.prefix_cache == ()
    assert (r0.status, r0.cached_len, r0.kv_held, state.kv_free) == (Status.RUNNING, 0, 3, 8)


def test_release_unlocks_and_the_reprefill_hits_its_own_prompt() -> None:
    """Flip-on retracts request 0 (release without checkpoint: its prompt stays in the tree); its re-prefill with
    speculation on matches the prompt it cached while off: the draft KV of 3 positions was never written."""
    model = model_for(UNMARKED)
    state = _prefilled_while_off(UNMARKED)
    state = walk(model, state, ["merge_batch", "prepare_for_decode", "plain_decode", "arrive"])
    state = attrs.evolve(state, thresholds=attrs.evolve(state.thresholds, t_on=2, t_off=3))
    state = walk(model, state, ["flip_on"])
    assert state.req(0).status is Status.WAITING and state.req(0).cached_len == 0
    assert state.prefix_cache == (False, False, False) and evictable(state) == 3
    state = walk(model, state, ["prefill"])
    r0 = state.req(0)
    # prompt 3 + output 2: the match takes the whole prompt (one token short of the fill), the chunk the rest
    assert (r0.status, r0.cached_len, r0.prefilled_len, r0.kv_held) == (Status.RUNNING, 3, 5, 2)
    assert tree_draft_missing(state, 0) == 3


def _two_waiting(tree: tuple[bool, ...], design) -> tuple[Model, State]:
    """Request 0 retracted with one output token (fill 4) and request 2 (prompt 2) wait; the tree holds `tree`."""
    model = model_for(design)
    base = initial_with(model, 4, 0)
    requests = list(base.requests)
    requests[0] = requests[0].replace(status=Status.WAITING, committed=1)
    requests[2] = requests[2].replace(status=Status.WAITING)
    return model, base.replace(requests=tuple(requests), prefix_cache=tree, kv_free=base.kv_pool_size - len(tree))


def test_match_locks_and_checkpoint_repoints_duplicates_at_the_trees_slots() -> None:
    model, state = _two_waiting((False, True, True), UNMARKED)
    after = model.next_state(state, Action("prefill"))
    r0, r2 = after.req(0), after.req(2)
    # r0: match 3 (its prompt), computes its output token; r2: match 1 (one short of its prompt), computes t1,
    # which the tree holds already: freed, and r2 reads the tree's slot
    assert (r0.cached_len, r0.kv_held, r2.cached_len, r2.kv_held) == (3, 1, 2, 0)
    assert after.launched.extend_tokens == 2 and after.kv_free == state.kv_free - 2 + 1
    assert after.prefix_cache == state.prefix_cache and after.kv_accounted() == after.kv_pool_size
    assert (tree_draft_missing(after, 0), tree_draft_missing(after, 2)) == (1, 1)


def test_a_match_that_stops_at_missing_draft_kv_is_undone_by_the_checkpoint() -> None:
    design = get_design("retract_catch_up_radix_match_stops")
    tree = (False, True, True)
    model, state = _two_waiting(tree, design)
    assert match_len(tree, state.req(0), True, design) == 0 and match_len(tree, state.req(0), False, design) == 3
    after = model.next_state(state, Action("prefill"))
    r0 = after.req(0)
    # r0 recomputed t0 and t1 with the draft, then the checkpoint repointed it at the tree's copies
    assert (r0.prefilled_len, r0.cached_len, r0.kv_held) == (2, 2, 0)
    assert tree_draft_missing(after, 0) == 1


def test_prefill_evicts_unlocked_tree_tokens_from_the_tail_when_the_pool_is_short() -> None:
    model = model_for(RETRACT_CATCH_UP_RADIX)
    base = initial_with(model, 4, 0)
    requests = list(base.requests)
    requests[0] = requests[0].replace(status=Status.FINISHED)
    requests[1] = requests[1].replace(status=Status.RUNNING, seq_len=8, committed=1, kv_held=8, draft_kv_len=8,
                                      draft_hidden_ready=True)
    requests[2] = requests[2].replace(status=Status.WAITING)
    running = Batch(rids=(1,), forward_mode=ForwardMode.DECODE, spec_info=SpecInfo(SpecInfoKind.DRAFT_INPUT, 1, 1),
                    spec_algorithm_on=True)
    state = base.replace(requests=tuple(requests), running=running, kv_free=0, prefix_cache=(True, True, True))
    assert state.kv_accounted() == state.kv_pool_size and evictable(state) == 3
    after = model.next_state(state, Action("prefill"))
    r2 = after.req(2)
    # r2 matches t0 and computes t1 into the slot evicted from the tail (t2); its checkpoint frees the duplicate
    assert after.prefix_cache == (True, True)
    assert (r2.status, r2.cached_len, r2.kv_held, after.kv_free) == (Status.RUNNING, 2, 0, 1)
    assert not model.check_step(state, Action("prefill"), after)


def test_finish_unlocks_the_cached_prefix_and_keeps_it_cached() -> None:
    model = model_for(UNMARKED)
    state = _prefilled_while_off(UNMARKED)
    state = walk(model, state, ["merge_batch", "prepare_for_decode", "plain_decode", "prepare_for_decode",
                                "plain_decode", "finish"])
    assert state.req(0).status is Status.FINISHED and state.req(0).cached_len == 0
    assert state.prefix_cache == (False, False, False) and evictable(state) == 3
    assert state.kv_free + len(state.prefix_cache) == state.kv_pool_size


def test_draft_kv_covers_prefix_names_the_request_and_the_positions_missing() -> None:
    model, state = _two_waiting((False, True, True), UNMARKED)
    state = model.next_state(state, Action("prefill"))
    running = Batch(rids=(0, 2), forward_mode=ForwardMode.DECODE, spec_info=SpecInfo(SpecInfoKind.DRAFT_INPUT, 2, 1),
                    spec_algorithm_on=True)
    before = state.replace(running=running, pending=None, launched=None)
    found = draft_kv_covers_prefix(before, Action("draft", (2,)), before, Scope(), UNMARKED)
    assert len(found) == 1 and found[0].rids == (0, 2)
    assert "request 0's first 3 tokens from the radix cache, 1 of them without draft KV" in found[0].message
    # the same state with every cached token's draft KV written: nothing to report; a zero-step draft reads none
    covered = before.replace(prefix_cache=(True, True, True))
    assert not draft_kv_covers_prefix(covered, Action("draft", (2,)), covered, Scope(), UNMARKED)
    assert not draft_kv_covers_prefix(before, Action("draft", (0,)), before, Scope(), UNMARKED)


def test_kv_conservation_counts_the_trees_slots_and_its_locks() -> None:
    model = model_for(UNMARKED)
    state = _prefilled_while_off(UNMARKED)
    leaked = state.replace(prefix_cache=state.prefix_cache[:2])
    found = check_step(state, Action("arrive", (1,)), leaked, Scope(), UNMARKED)
    assert [v.invariant for v in found] == ["kv_conservation"] * 2
    assert "1 slots leaked" in found[0].message and "locks 3 tree tokens of 2" in found[1].message
    waiting = state.replace(requests=state.with_requests({0: state.req(0).replace(status=Status.WAITING)}),
                            running=EMPTY_BATCH, pending=None, spec_mode=SpecMode.OFF)
    assert "locks 3 tree tokens" in model.check_state(waiting)[0].message


def test_the_model_default_design_has_no_radix_cache_and_its_shipped_radix_twin_differs_only_there() -> None:
    assert not RETRACT_CATCH_UP.radix_cache and RETRACT_CATCH_UP_RADIX in SHIPPED
    twin = attrs.evolve(RETRACT_CATCH_UP, radix_cache=True, tree_draft=TreeDraft.NOT_INSERTED_WITHOUT_DRAFT)
    assert attrs.evolve(twin, name=RETRACT_CATCH_UP_RADIX.name, summary=RETRACT_CATCH_UP_RADIX.summary,
                        source=RETRACT_CATCH_UP_RADIX.source) == RETRACT_CATCH_UP_RADIX
    radix_bad = [d for d in ALL_DESIGNS if d.radix_cache and d.expected_invariant]
    assert radix_bad == list(RADIX_KNOWN_BAD) and not any(d.radix_cache for d in KNOWN_BAD)
    assert {d.tree_draft for d in radix_bad} == {TreeDraft.IGNORED, TreeDraft.MATCH_STOPS_AT_MISSING,
                                                  TreeDraft.EVICT_AT_FLIP_ON}
    assert all(d.draft_while_off is RETRACT_CATCH_UP.draft_while_off for d in radix_bad)


@pytest.mark.parametrize("design", RADIX_KNOWN_BAD, ids=lambda d: d.name)
def test_radix_known_bad_design_is_refuted_with_its_invariant(design) -> None:
    verdict = run_design(design)
    assert verdict.verdict == "refuted" and verdict.invariant == design.expected_invariant == "draft_kv_covers_prefix"
    assert len(verdict.result.trace) == 19


def test_the_default_design_with_the_radix_cache_is_refuted_after_a_flip_on() -> None:
    verdict = run_design(UNMARKED)
    assert verdict.verdict == "refuted" and verdict.invariant == "draft_kv_covers_prefix"
    names = [step.action.name for step in verdict.result.trace]
    assert "flip_off" in names and "flip_on" in names and names[-1] == "draft"
    assert len(names) == 19
    assert "from the radix cache" in verdict.result.violations[0].message


# plain_off_catch_up with SGLang's radix cache as it is (issue 51): what its catch-up does to the tree
CATCH_UP_RADIX = attrs.evolve(CATCH_UP, name="plain_off_catch_up_radix", radix_cache=True)


def test_the_catch_up_writes_the_draft_kv_of_the_tree_slots_its_requests_point_at() -> None:
    """Request 0 is prefilled while off: its checkpoint puts its prompt into the tree without draft KV and points its
    row at the tree's slots. The catch-up at flip-on runs the draft over its whole row (`draft_written_in_tree`: from
    draft KV 0 to seq_len), so those tree slots hold draft KV now and its first draft step is correct."""
    model = model_for(CATCH_UP_RADIX)
    state = walk(model, initial_with(model, 1, 0), ["arrive", "flip_off", "prefill", "prefill", "merge_batch",
                                                    "prepare_for_decode", "plain_decode"])
    r0 = state.req(0)
    assert state.prefix_cache == (False, False, False) and (r0.cached_len, r0.draft_kv_len, r0.seq_len) == (3, 0, 4)
    assert draft_written_in_tree(r0, r0.replace(draft_kv_len=r0.seq_len), r0.cached_len) == (0, 3)
    state = walk(model, attrs.evolve(state, thresholds=attrs.evolve(state.thresholds, t_on=2, t_off=3)),
                 ["flip_on", "draft_catch_up"])
    assert state.prefix_cache == (True, True, True) and tree_draft_missing(state, 0) == 0
    before = state
    state = walk(model, state, ["prepare_for_decode"])
    draft = next(a for a in model.actions(state) if a.name == "draft" and a.args[0] > 0)
    assert check_step(state, draft, model.next_state(state, draft), Scope(), CATCH_UP_RADIX) == []
    # a draft-extend that starts at or past the tree prefix writes none of it
    assert draft_written_in_tree(before.req(0), before.req(0), 3) == (4, 3)


def test_catch_up_with_the_radix_cache_is_refuted_only_through_a_request_that_finished_while_off() -> None:
    """What the catch-up cannot cover: a request prefilled and finished while off leaves its prompt in the tree
    without draft KV, and a request admitted after flip-on hits it. The checker's shortest counterexample is that one
    (a request finished before flip-on), not the catch-up's own requests."""
    verdict = run_design(CATCH_UP_RADIX)
    assert verdict.verdict == "fail" and verdict.invariant == "draft_kv_covers_prefix"
    names = [step.action.name for step in verdict.result.trace]
    on = names.index("flip_on")
    assert "finish" in names[:on] and "draft_catch_up" not in names and names[-1] == "draft"
