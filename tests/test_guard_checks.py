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
