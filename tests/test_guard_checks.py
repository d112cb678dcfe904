"""shim/guard/checks.py's legal-transition test: a flip where the design waits for the results in flight."""

from __future__ import annotations

import attrs

from shim.guard.checks import LEGAL_TRANSITION, transition_violations
from statemodel.actions import Action
from statemodel.designs import get_design
from statemodel.state import EMPTY_BATCH, SpecMode, Stage, State, Unprocessed


def test_a_flip_with_a_result_in_flight_is_illegal_where_the_design_waits_for_it() -> None:
    waits = get_design("v1_plain_off_retract_catch_up_overlap_plain")
    no_wait = get_design("v1_overlap_flip_on_in_flight")
    assert waits.flip_waits_for_results and not no_wait.flip_waits_for_results
    idle = State(requests=(), running=EMPTY_BATCH, pending=None, launched=None, stage=Stage.SCHEDULE,
                 spec_mode=SpecMode.OFF, num_steps=3, kv_free=8, kv_pool_size=8)
    in_flight = attrs.evolve(idle, unprocessed=(Unprocessed((), None),))
    flip_on = Action("flip_on")
    found = transition_violations(in_flight, flip_on, overlap=True, design=waits)
    assert [v.invariant for v in found] == [LEGAL_TRANSITION] and "1 launched step(s) unprocessed" in found[0].message
    assert transition_violations(idle, flip_on, overlap=True, design=waits) == []
    assert transition_violations(in_flight, flip_on, overlap=True, design=no_wait) == []
    assert transition_violations(in_flight, flip_on, overlap=True) == []  # no design: stage and mode only


# --- every verdict of transition_violations, to the field (issue 51: mutants of its messages and branches survived the
# tests above; scripts/mutation.sh) ---------------------------------------------------------------------------------

from shim.guard.checks import state_violations, step_violations  # noqa: E402
from statemodel.actions import ACTIONS_BY_NAME  # noqa: E402
from statemodel.design import Scope  # noqa: E402
from statemodel.invariants import Violation, check_state, check_step  # noqa: E402

IDLE_ON = State(requests=(), running=EMPTY_BATCH, pending=None, launched=None, stage=Stage.SCHEDULE,
                spec_mode=SpecMode.ON, num_steps=3, kv_free=8, kv_pool_size=8)


def test_an_unknown_action_is_illegal() -> None:
    assert transition_violations(IDLE_ON, Action("teleport")) == [Violation(
        LEGAL_TRANSITION, "'teleport' is not a model action", expected=" | ".join(ACTIONS_BY_NAME), actual="teleport")]


def test_an_action_from_a_stage_it_never_starts_from_is_illegal() -> None:
    prepared = attrs.evolve(IDLE_ON, stage=Stage.PREPARED)
    assert transition_violations(prepared, Action("prepare_for_decode")) == [Violation(
        LEGAL_TRANSITION, "prepare_for_decode ran at stage prepared; the model runs it only from schedule",
        expected="schedule", actual="prepared")]
    # overlap: finish may also start from prepared, and process_result exists only there
    assert transition_violations(prepared, Action("finish", (0,)), overlap=True) == []
    assert [v.expected for v in transition_violations(prepared, Action("finish", (0,)))] == ["schedule"]
    drafted = attrs.evolve(IDLE_ON, stage=Stage.DRAFTED)
    assert [v.expected for v in transition_violations(drafted, Action("process_result"), overlap=True)] == [
        "schedule or prepared"]


def test_an_action_of_the_other_mode_is_illegal() -> None:
    off = attrs.evolve(IDLE_ON, spec_mode=SpecMode.OFF)
    assert transition_violations(off, Action("flip_off")) == [Violation(
        LEGAL_TRANSITION, "flip_off belongs to speculation on but speculation is off", expected="on", actual="off")]
    assert transition_violations(IDLE_ON, Action("flip_on")) == [Violation(
        LEGAL_TRANSITION, "flip_on belongs to speculation off but speculation is on", expected="off", actual="on")]
    assert transition_violations(off, Action("prepare_for_decode")) == []  # an action of either mode
    both_wrong = transition_violations(off, Action("draft", (2,)))  # stage schedule, speculation off
    assert [(v.expected, v.actual) for v in both_wrong] == [("prepared", "schedule"), ("on", "off")]


def test_each_flip_waits_for_the_results_in_flight_where_the_design_says() -> None:
    waits = get_design("v1_plain_off_retract_catch_up_overlap_plain")
    in_flight = attrs.evolve(IDLE_ON, unprocessed=(Unprocessed((), None), Unprocessed((), None)))
    assert transition_violations(in_flight, Action("flip_off"), overlap=True, design=waits) == [Violation(
        LEGAL_TRANSITION, "flip_off with 2 launched step(s) unprocessed; v1_plain_off_retract_catch_up_overlap_plain "
        "flips only once the results in flight are processed", expected="no result in flight", actual="2 in flight")]
    assert transition_violations(in_flight, Action("prepare_for_decode"), overlap=True, design=waits) == []


def test_step_violations_is_the_legal_check_then_the_model_invariants() -> None:
    design, scope = get_design("plain_off_catch_up"), Scope()
    broken = attrs.evolve(IDLE_ON, kv_free=7)  # a slot leaked: kv_conservation
    illegal = step_violations(IDLE_ON, Action("flip_on"), broken, scope, design)
    assert [v.invariant for v in illegal] == [LEGAL_TRANSITION, "kv_conservation"]
    assert illegal[1:] == check_state(broken, scope)
    legal = step_violations(IDLE_ON, Action("flip_off"), broken, scope, design)
    assert legal == check_step(IDLE_ON, Action("flip_off"), broken, scope, design) and legal
    assert [v.invariant for v in legal] == ["kv_conservation"]
    assert step_violations(IDLE_ON, Action("flip_off"), IDLE_ON, scope, design) == []
    assert state_violations(broken, scope) == check_state(broken, scope) != []


def _first_reached(design_name: str, action_name: str, scope: Scope) -> tuple[State, Action]:
    """A state of `design_name`'s model where `action_name` is enabled, found breadth-first, and that action."""
    from collections import deque

    from statemodel.model import Model

    model = Model(get_design(design_name), scope)
    queue, seen = deque(model.init_states()), set()
    while queue:
        state = queue.popleft()
        for action in model.actions(state):
            if action.name == action_name:
                return state, action
            after = model.next_state(state, action)
            if after not in seen:
                seen.add(after)
                queue.append(after)
    raise AssertionError(f"{action_name} never enabled")


def test_step_violations_passes_the_scope_and_the_design_on() -> None:
    from statemodel.actions import apply

    # the overlap scope: finish also from prepared (and only there)
    overlap = Scope(overlap=True)
    prepared = attrs.evolve(IDLE_ON, stage=Stage.PREPARED)
    assert step_violations(prepared, Action("finish", ()), prepared, overlap, get_design("plain_off_catch_up")) == []
    assert [v.invariant for v in step_violations(prepared, Action("finish", ()), prepared, Scope(),
                                                 get_design("plain_off_catch_up"))] == [LEGAL_TRANSITION]
    # the design: its flips wait for the results in flight
    waits = get_design("v1_plain_off_retract_catch_up_overlap_plain")
    in_flight = attrs.evolve(IDLE_ON, unprocessed=(Unprocessed((), None),))
    assert [v.invariant for v in step_violations(in_flight, Action("flip_off"), in_flight, overlap, waits)] == [
        LEGAL_TRANSITION]
    # and the design's worker decides what a verify grows (Design.verify_advances_past_finish)
    design = get_design("plain_off_catch_up")
    before, verify = _first_reached(design.name, "verify", Scope())
    assert step_violations(before, verify, apply(before, verify, design, Scope()), Scope(), design) == []
