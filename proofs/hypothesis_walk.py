"""A second, independent checking strategy: Hypothesis's RuleBasedStateMachine walks the same model.

Where BFS exhausts the scope, this samples long random interleavings and shrinks any failure to a
short, readable sequence of steps. It shares nothing with `proofs.bfs` but the model itself.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from statemodel.actions import Action
from statemodel.design import Design, Scope
from statemodel.invariants import Violation
from statemodel.model import Model
from statemodel.state import State


class ModelViolation(AssertionError):
    """Raised by the machine when a transition breaks an invariant; carries the violations."""

    def __init__(self, violations: list[Violation], steps: list[Action]) -> None:
        self.violations = violations
        self.steps = steps
        path = " -> ".join(a.describe() for a in steps)
        super().__init__(f"{violations[0].describe()}\n  after: {path}")


def machine_for(design: Design, scope: Scope | None = None) -> type[RuleBasedStateMachine]:
    """A RuleBasedStateMachine class that walks `design`'s model, picking among enabled actions."""
    model = Model(design, scope or Scope())
    inits = model.init_states()

    class DesignMachine(RuleBasedStateMachine):
        state: State
        steps: list[Action]

        @initialize(index=st.integers(min_value=0, max_value=len(inits) - 1))
        def start(self, index: int) -> None:
            self.state = inits[index]
            self.steps = []
            bad = model.check_state(self.state)
            if bad:
                raise ModelViolation(bad, self.steps)

        @rule(data=st.data())
        def step(self, data: Any) -> None:
            actions = model.actions(self.state)
            if not actions:
                return
            action = data.draw(st.sampled_from(actions), label="action")
            after = model.next_state(self.state, action)
            self.steps.append(action)
            bad = model.check_step(self.state, action, after)
            self.state = after
            if bad:
                raise ModelViolation(bad, self.steps)

        @invariant()
        def not_stuck_unfinished(self) -> None:
            # the "eventually" property, where the walk reaches a state at rest
            if hasattr(self, "state") and model.at_rest(self.state):
                failed = [e.name for e in model.eventually() if not e.holds(self.state)]
                assert not failed, f"a state at rest fails {failed}"

    DesignMachine.__name__ = f"Machine_{design.name}"
    return DesignMachine
