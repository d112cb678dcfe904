"""Breadth-first explicit-state checking: every interleaving within the scope, states deduplicated by
hash, so the first violation found is at the smallest depth and its trace is a shortest counterexample.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import attrs

from statemodel.actions import Action
from statemodel.invariants import Violation
from statemodel.model import Model
from statemodel.state import State


@attrs.frozen
class TraceStep:
    """One numbered step of a counterexample: the action and the state it led to."""

    index: int
    action: Action
    state: State


@attrs.frozen
class Result:
    """What one exhaustive run found."""

    design: str
    states: int
    transitions: int
    max_depth: int
    seconds: float
    complete: bool  # False: stopped at max_states before exhausting the scope
    violations: tuple[Violation, ...]  # of the counterexample's last step; empty if none
    trace: tuple[TraceStep, ...]
    initial: State | None
    sometimes_reached: dict[str, bool]
    eventually_failed: tuple[str, ...]
    eventually_trace: tuple[TraceStep, ...]
    invariants_checked: tuple[str, ...]

    @property
    def refuted(self) -> bool:
        return bool(self.violations)

    @property
    def vacuous(self) -> list[str]:
        return [name for name, reached in self.sometimes_reached.items() if not reached]


Progress = Callable[[int, int, int], None]  # states, transitions, depth


def check(model: Model, *, max_states: int = 2_000_000, progress: Progress | None = None,
          progress_every: int = 50_000) -> Result:
    """Explore `model` breadth-first; stop at the first violation (shortest counterexample)."""
    started = time.perf_counter()
    parent: dict[State, tuple[State, Action] | None] = {}
    depth_of: dict[State, int] = {}
    queue: deque[State] = deque()
    sometimes = model.sometimes()
    reached = {s.name: False for s in sometimes}
    eventually = model.eventually()
    transitions = 0
    max_depth = 0

    def finish(violations: list[Violation], last: State | None, failed: tuple[str, ...] = (),
               ev_last: State | None = None, complete: bool = True) -> Result:
        trace, initial = _trace(parent, last) if last is not None else ((), None)
        ev_trace, ev_initial = _trace(parent, ev_last) if ev_last is not None else ((), None)
        return Result(
            design=model.design.name, states=len(parent), transitions=transitions, max_depth=max_depth,
            seconds=time.perf_counter() - started, complete=complete, violations=tuple(violations),
            trace=trace, initial=initial if initial is not None else ev_initial, sometimes_reached=reached,
            eventually_failed=failed, eventually_trace=ev_trace,
            invariants_checked=tuple(i.name for i in model.always()),
        )

    for init in model.init_states():
        if init in parent:
            continue
        parent[init] = None
        depth_of[init] = 0
        bad = model.check_state(init)
        if bad:
            return finish(bad, init)
        queue.append(init)

    first_stuck: State | None = None
    failed_eventually: list[str] = []
    while queue:
        state = queue.popleft()
        depth = depth_of[state]
        acts = model.actions(state)
        if not acts and first_stuck is None:
            failed = [e.name for e in eventually if not e.holds(state)]
            if failed:
                first_stuck, failed_eventually = state, failed
        for action in acts:
            nxt = model.next_state(state, action)
            transitions += 1
            for s in sometimes:
                if not reached[s.name] and s.holds(state, action, nxt):
                    reached[s.name] = True
            if nxt in parent:
                continue
            parent[nxt] = (state, action)
            depth_of[nxt] = depth + 1
            max_depth = max(max_depth, depth + 1)
            bad = model.check_step(state, action, nxt)
            if bad:
                return finish(bad, nxt)
            queue.append(nxt)
            if progress is not None and len(parent) % progress_every == 0:
                progress(len(parent), transitions, depth + 1)
            if len(parent) >= max_states:
                return finish([], None, complete=False)
    return finish([], None, tuple(failed_eventually), first_stuck)


def _trace(parent: dict[State, tuple[State, Action] | None], last: State) -> tuple[tuple[TraceStep, ...], State]:
    steps: list[tuple[Action, State]] = []
    cur = last
    while True:
        link = parent[cur]
        if link is None:
            break
        prev, action = link
        steps.append((action, cur))
        cur = prev
    steps.reverse()
    return tuple(TraceStep(i + 1, a, s) for i, (a, s) in enumerate(steps)), cur
