"""The one check the guard and `specflip explain` both run on a transition.

Every rule comes from the model: invariants from `statemodel.invariants.check_step`, and the
"legal transition" test from `statemodel.actions.ACTION_CATALOGUE` (the stage an action starts from
and the runtime mode it belongs to). Nothing here restates a rule.
"""

from __future__ import annotations

from statemodel.actions import ACTIONS_BY_NAME, Action, flip_waits
from statemodel.design import Design, Scope
from statemodel.invariants import Violation, check_state, check_step
from statemodel.state import State

LEGAL_TRANSITION = "legal_transition"


def transition_violations(before: State, action: Action, *, overlap: bool = False,
                          design: Design | None = None) -> list[Violation]:
    """The action exists, starts from the stage `before` is in (under the overlap schedule `overlap`), and
    belongs to the current mode; a flip, when `design` makes flips wait for the results in flight, has none
    (statemodel.actions.flip_waits; the policy's demand itself is the switch's, not seen here)."""
    info = ACTIONS_BY_NAME.get(action.name)
    if info is None:
        return [Violation(LEGAL_TRANSITION, f"{action.name!r} is not a model action",
                          expected=" | ".join(ACTIONS_BY_NAME), actual=action.name)]
    problems = []
    stages = info.stages(overlap)
    if before.stage not in stages:
        want = " or ".join(s.value for s in stages)
        problems.append(Violation(
            LEGAL_TRANSITION,
            f"{action.name} ran at stage {before.stage.value}; the model runs it only from {want}",
            expected=want, actual=before.stage.value,
        ))
    if not info.spec_mode.allows(before.spec_mode):
        problems.append(Violation(
            LEGAL_TRANSITION,
            f"{action.name} belongs to speculation {info.spec_mode.value} but speculation is {before.spec_mode.value}",
            expected=info.spec_mode.value, actual=before.spec_mode.value,
        ))
    if design is not None and action.name in ("flip_on", "flip_off") and flip_waits(before, design):
        problems.append(Violation(
            LEGAL_TRANSITION,
            f"{action.name} with {len(before.unprocessed)} launched step(s) unprocessed; {design.name} flips only "
            "once the results in flight are processed",
            expected="no result in flight", actual=f"{len(before.unprocessed)} in flight",
        ))
    return problems


def step_violations(before: State, action: Action, after: State, scope: Scope, design: Design) -> list[Violation]:
    """A legal transition, then every model invariant of the step (under `design`) and of its result. The
    step invariants presume a legal step (a verify has a launched batch...): an illegal one gets the state
    invariants of its result only."""
    illegal = transition_violations(before, action, overlap=scope.overlap, design=design)
    if illegal:
        return illegal + check_state(after, scope)
    return check_step(before, action, after, scope, design)


def state_violations(state: State, scope: Scope) -> list[Violation]:
    """Every state invariant (a re-observation of the same step, e.g. the verify batch at launch)."""
    return check_state(state, scope)
