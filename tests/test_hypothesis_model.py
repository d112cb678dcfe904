"""Hypothesis's RuleBasedStateMachine as an independent explorer of the same model.

It must find every known-bad design's bug on its own (naming the same invariant as the BFS checker)
and walk every shipped design without a violation.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from proofs.hypothesis_walk import ModelViolation, machine_for
from statemodel.designs import (
    KNOWN_BAD,
    OVERLAP_CANDIDATES,
    OVERLAP_KNOWN_BAD,
    OVERLAP_SHIPPED,
    SHIPPED,
    overlap_scope,
)

# No shrinking in CI: finding the bug is what is tested here; shrinking is timed in bench/.
FIND = settings(max_examples=3000, stateful_step_count=80, deadline=None, database=None,
                phases=[Phase.generate], suppress_health_check=list(HealthCheck), derandomize=True)
WALK = settings(max_examples=60, stateful_step_count=80, deadline=None, database=None,
                suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.mark.parametrize("design", KNOWN_BAD, ids=lambda d: d.name)
def test_hypothesis_finds_each_known_bad_bug(design) -> None:
    with pytest.raises(ModelViolation) as caught:
        run_state_machine_as_test(machine_for(design), settings=FIND)
    assert caught.value.violations[0].invariant == design.expected_invariant


@pytest.mark.parametrize("design", SHIPPED, ids=lambda d: d.name)
def test_hypothesis_walks_shipped_designs_cleanly(design) -> None:
    run_state_machine_as_test(machine_for(design), settings=WALK)


@pytest.mark.parametrize("design", OVERLAP_KNOWN_BAD, ids=lambda d: d.name)
def test_hypothesis_finds_each_overlap_known_bad_bug(design) -> None:
    with pytest.raises(ModelViolation) as caught:
        run_state_machine_as_test(machine_for(design, overlap_scope(design)), settings=FIND)
    assert caught.value.violations[0].invariant == design.expected_invariant


@pytest.mark.parametrize("design", OVERLAP_SHIPPED + OVERLAP_CANDIDATES, ids=lambda d: d.name)
def test_hypothesis_walks_overlap_shipped_designs_cleanly(design) -> None:
    run_state_machine_as_test(machine_for(design, overlap_scope(design)), settings=WALK)
