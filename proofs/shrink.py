"""Shrinking a counterexample: fewer steps that break the same invariant, through the model's own steps.

A random walk (`proofs.simulation`) finds a counterexample fast but long: it wanders before it reaches the bug.
Hypothesis shrinks the failures it finds before it reports one; this does the same for the walks, on the model
directly. The model is deterministic, so a counterexample is its initial state and its actions. The shrink tries
the same actions from each initial state before its own in the model's order (as Hypothesis shrinks a drawn index
toward 0), then deletes runs of steps, longest first and at every offset (delta debugging), leaving out an action a
deletion left disabled. Each candidate is replayed: every action must be enabled
where it is taken (`Model.actions`), and it is kept when a step breaks the same invariant as the original and, with
every invariant checked (`check_step`, as a walk checks its steps), no step breaks another one before it; for an
`eventually` failure, when it ends at rest failing the same property. The result is a counterexample, not a
shortest one: breadth-first search (`proofs.bfs`) proves shortness.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs

from statemodel.actions import Action
from statemodel.invariants import Violation
from statemodel.model import Model
from statemodel.state import State


@attrs.frozen
class Shrunk:
    """A shrunk counterexample: the initial state, its steps (action, state after), what its last step breaks
    (`violations`, or the `eventually` properties its last state at rest fails), and how many replays it took."""

    initial: State
    steps: tuple[tuple[Action, State], ...]
    violations: tuple[Violation, ...]
    eventually_failed: tuple[str, ...]
    replays: int


class _Replayer:
    """Replays action sequences from a state and says whether they still show the failure being shrunk. Candidates
    share most of their steps (the same actions from the same states), so each step is taken once and kept. A
    candidate's steps are checked for the invariant being shrunk alone, which ends it; one that shows the failure is
    then checked with every invariant (`check_step`), and kept only if no step breaks another one first."""

    def __init__(self, model: Model, invariant: str | None, eventually: tuple[str, ...],
                 clean: Mapping[tuple[State, Action], tuple[State, object]],
                 enabled: Mapping[State, tuple[list[Action], bool]]) -> None:
        self.model = model
        self._clean, self._known_enabled = clean, enabled
        self.invariant = invariant  # the step's broken invariant, or None for an `eventually` failure
        self.eventually = eventually
        self.replays = 0
        target = next((i for i in model.always() if i.name == invariant), None)
        scope, design = model.scope, model.design
        if target is None:
            self._breaks: Callable[[State, Action, State], list[Violation]] = lambda before, action, after: []
        elif target.on_step:
            self._breaks = lambda before, action, after: target.check(before, action, after, scope, design)
        else:
            self._breaks = lambda before, action, after: target.check(after, scope)
        # (state, action) -> (the state after, whether it breaks the invariant shrunk), or None where the action is
        # not enabled; and the same step's violations of every invariant, once a candidate through it is checked
        self._steps: dict[tuple[State, Action], tuple[State, bool] | None] = {}
        self._checked: dict[tuple[State, Action], list[Violation]] = {}
        self._enabled: dict[State, list[Action]] = {}

    def enabled(self, state: State) -> list[Action]:
        acts = self._enabled.get(state)
        if acts is None:
            known = self._known_enabled.get(state)
            acts = self._enabled[state] = self.model.actions(state) if known is None else known[0]
        return acts

    def _step(self, state: State, action: Action) -> tuple[State, bool] | None:
        key = (state, action)
        if key in self._steps:
            return self._steps[key]
        clean = self._clean.get(key)
        if clean is not None:  # a step the walks took and checked clean: it breaks nothing
            taken = self._steps[key] = (clean[0], False)
            self._checked[key] = []
            return taken
        taken = None
        if action in self.enabled(state):
            after = self.model.next_state(state, action)
            taken = (after, bool(self._breaks(state, action, after)))
        self._steps[key] = taken
        return taken

    def _violations(self, before: State, action: Action, after: State) -> list[Violation]:
        key = (before, action)
        found = self._checked.get(key)
        if found is None:
            found = self._checked[key] = self.model.check_step(before, action, after)
        return found

    def replay(self, start: State, actions: Sequence[Action], skip: bool = False
               ) -> tuple[list[tuple[Action, State]], list[Violation], tuple[str, ...]] | None:
        """The steps of `actions` from `start` up to the first that breaks the invariant being shrunk, with its
        violations; None if an action is not enabled where it is taken (with `skip`: such an action is left out), a
        step breaks another invariant first, or none breaks it (for an `eventually` failure: the last state is not
        at rest failing the same property)."""
        self.replays += 1
        state = start
        steps: list[tuple[Action, State]] = []
        broke = False
        for action in actions:
            taken = self._step(state, action)
            if taken is None:
                if skip:
                    continue
                return None
            after, broke = taken
            steps.append((action, after))
            if broke:
                break
            state = after
        failed: tuple[str, ...] = ()
        if not broke:
            model = self.model
            if self.invariant is not None or not model.at_rest(state):
                return None
            failed = tuple(e.name for e in model.eventually() if not e.holds(state))
            if not set(self.eventually) <= set(failed):
                return None
        # a candidate: every step checked with every invariant, none broken before its last step
        before = start
        for i, (action, after) in enumerate(steps):
            bad = self._violations(before, action, after)
            if bad and (i < len(steps) - 1 or not broke or bad[0].invariant != self.invariant):
                return None
            before = after
        return steps, (bad if broke else []), failed


def shrink(model: Model, initial: State, steps: Sequence[tuple[Action, State]], violations: Sequence[Violation],
           eventually_failed: Sequence[str] = (),
           clean: Mapping[tuple[State, Action], tuple[State, object]] | None = None,
           enabled: Mapping[State, tuple[list[Action], bool]] | None = None) -> Shrunk:
    """Shrink the counterexample `initial`, `steps`: its last step breaks `violations` (the first of them names the
    invariant kept), or, with no violations, its last state is at rest and fails `eventually_failed`. `clean` and
    `enabled` are what the walks that found it kept (`proofs.simulation`): steps every invariant held on, to the
    state after (and its key), and states' enabled actions (and whether at rest); a replay through them is a lookup."""
    if not violations and not eventually_failed:
        raise ValueError("shrink: nothing fails in this trace")
    replayer = _Replayer(model, violations[0].invariant if violations else None, tuple(eventually_failed),
                         clean or {}, enabled or {})
    best_initial, best = initial, list(steps)
    best_bad, best_failed = list(violations), tuple(eventually_failed)

    def take(start: State, found: tuple[list[tuple[Action, State]], list[Violation], tuple[str, ...]]) -> None:
        nonlocal best_initial, best, best_bad, best_failed
        best_initial, (best, best_bad, best_failed) = start, found

    # an earlier initial state (the walks pick one at random): the same actions from each, the first that still fails.
    # Only earlier ones: a later one is no simpler, and trying them cost time and shortened no known-bad design's trace
    walked = [a for a, _ in best]
    inits = model.init_states()
    earlier = inits[:inits.index(best_initial)] if best_initial in inits else inits
    for init in earlier:
        if (found := replayer.replay(init, walked)) is not None and len(found[0]) <= len(best):
            take(init, found)
            break
    # delete runs of steps, longest first, each run at every offset; the steps before a run are kept, so the replay
    # starts after them. One pass: a second one shortened none of the known-bad designs' walks further.
    size = len(best) // 2
    while size >= 1:
        i = 0
        while i + size <= len(best):
            start = best_initial if i == 0 else best[i - 1][1]
            found = replayer.replay(start, [a for a, _ in best[i + size:]], skip=True)
            if found is not None and len(found[0]) < len(best) - i:
                take(best_initial, (best[:i] + found[0], found[1], found[2]))  # and again at this offset
            else:
                i += 1
        size //= 2
    return Shrunk(best_initial, tuple(best), tuple(best_bad), best_failed, replayer.replays)
