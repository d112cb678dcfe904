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


def device_seq_lens_unmirrored(rids: tuple[int, ...], where: str) -> list[Violation]:
    """A plain DECODE launches with device `seq_lens` that moved since `prepare_for_decode` set them beside their host
    mirror (`seq_lens_cpu`), while the mirror did not: the lengths the forward attends over and writes at are not the
    ones the guard (and SGLang's host side) read. Found from tensor identity and `_version` (an in-place write bumps
    it), never from values: no sync."""
    return [Violation(
        "seq_lens_mirrored",
        f"the plain DECODE at {where} launches with device seq_lens written after prepare_for_decode without its host "
        "mirror seq_lens_cpu: the positions the forward attends over and writes are not the ones the host reads",
        rids, expected="seq_lens as prepare_for_decode left them (or moved with seq_lens_cpu)",
        actual="seq_lens moved, seq_lens_cpu not")]
