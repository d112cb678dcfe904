"""Breadth-first explicit-state exploration: the one core the checker and the diagrams share.

`Search` walks a transition system breadth-first from its roots, deduplicating nodes by hash, and yields
every edge (every action out of every node it expands), in a fixed order, each marked new or not. `check`
is the exhaustive checker on top of it: it checks every edge, including edges into a state seen before
(a step invariant can break on those too), and stops at the first violation. Edges come in order of the
depth of the node they leave, so the first violating edge ends a shortest counterexample.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

import attrs

from statemodel.actions import Action
from statemodel.invariants import Violation
from statemodel.model import Model, Sometimes
from statemodel.state import State

N = TypeVar("N", bound=Hashable)


class Search(Generic[N]):
    """Breadth-first search over nodes reached from `roots` by `successors(node) -> [(action, node)]`.

    `edges()` yields (before, action, after, new, kept) for every edge out of every expanded node; `new` says
    `after` was reached for the first time (it is queued); `kept` is the node the search keeps for `after`'s key:
    `after` itself when new, the node first found with that key when not, None when `after` was dropped
    (beyond `max_nodes`). Nodes are deduplicated by `key(node)` (the node
    itself by default); the first node found with a key is the one expanded and the one paths go through,
    so every path is made of real steps. `max_nodes` bounds the keys kept: a node found beyond it is
    neither kept nor queued, and `truncated` is set. `path(node)` is the shortest path from a root to an
    expanded node, as the root and the (action, node) steps after it.
    """

    def __init__(self, roots: Iterable[N], successors: Callable[[N], Iterable[tuple[Action, N]]],
                 max_nodes: int | None = None, key: Callable[[N], Hashable] | None = None) -> None:
        self.successors = successors
        self.max_nodes = max_nodes
        self.key = key
        self.truncated = False
        self.max_depth = 0
        # key -> (the key of the node it was reached from, the action, its depth, the node); None, None for a root
        self.parent: dict[Hashable, tuple[Hashable, Action | None, int, N]] = {}
        self.roots: list[N] = []
        for root in roots:
            k = root if key is None else key(root)
            if k not in self.parent:
                self.parent[k] = (None, None, 0, root)
                self.roots.append(root)

    def __len__(self) -> int:
        return len(self.parent)

    def edges(self) -> Iterator[tuple[N, Action, N, bool, N | None]]:
        parent = self.parent
        get = parent.get
        bound = self.max_nodes
        key = self.key
        queue: deque[tuple[N, Hashable, int]] = deque(
            (root, root if key is None else key(root), 0) for root in self.roots)
        successors = self.successors
        while queue:
            node, node_key, depth = queue.popleft()
            below = depth + 1
            for action, after in successors(node):
                after_key = after if key is None else key(after)
                seen = get(after_key)
                if seen is not None:
                    yield node, action, after, False, seen[3]
                    continue
                if bound is not None and len(parent) >= bound:
                    self.truncated = True
                    yield node, action, after, False, None
                    continue
                parent[after_key] = (node_key, action, below, after)
                if below > self.max_depth:
                    self.max_depth = below
                queue.append((after, after_key, below))
                yield node, action, after, True, after

    def path(self, node: N) -> tuple[N, list[tuple[Action, N]]]:
        steps: list[tuple[Action, N]] = []
        prev, action, _, cur = self.parent[node if self.key is None else self.key(node)]
        while prev is not None:
            assert action is not None
            steps.append((action, cur))
            prev, action, _, cur = self.parent[prev]
        steps.reverse()
        return cur, steps


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """The exploration allocates millions of immutable objects and frees none: the cyclic collector would
    traverse all of them again and again (10-20% of the time) and can never collect one."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def note_reached(unreached: list[Sometimes], reached: dict[str, bool], before: State, action: Action,
                 after: State) -> None:
    """Mark the sometimes-properties this step reaches, and drop them from `unreached` (most are reached early, so
    the caller asks only while some are left)."""
    for s in [s for s in unreached if s.holds(before, action, after)]:
        reached[s.name] = True
        unreached.remove(s)


def model_successors(model: Model) -> Callable[[State], list[tuple[Action, State]]]:
    """Every enabled action of `model` in a state, with the state it leads to, in the model's order."""
    actions, next_state = model.actions, model.next_state

    def successors(state: State) -> list[tuple[Action, State]]:
        return [(action, next_state(state, action)) for action in actions(state)]

    return successors


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
    cpu_seconds: float = 0.0
    # states at rest (`Model.at_rest`) the `eventually` properties were checked on: none means they held vacuously
    states_at_rest: int = 0

    @property
    def refuted(self) -> bool:
        return bool(self.violations)

    @property
    def vacuous(self) -> list[str]:
        return [name for name, reached in self.sometimes_reached.items() if not reached]


Progress = Callable[[int, int, int], None]  # states, transitions, depth


def check(model: Model, *, max_states: int = 2_000_000, progress: Progress | None = None,
          progress_every: int = 50_000) -> Result:
    """Explore `model` breadth-first, checking every edge with every invariant (`check_step`); stop at the first
    violation (a shortest counterexample). States are counted by `model.dedup_key`, which may forget a field
    that a state invariant reads (the batch the last forward ran on): so an edge into a key seen before is
    checked in full too, on the state it really reaches, unless that state's batch the last forward ran on is the
    one of the state kept for its key. Then the step invariants are checked (`check_transition`) and the state
    invariants are known to hold: the kept state passed them when it was reached, and the two states differ only
    in what the key forgets besides that batch, which no state invariant reads (`tests/test_checker.py` compares
    the state invariants of the states the key merges, and is shown to fail on an invariant reading a forgotten
    field; docs/model.md, "What the checker counts")."""
    with no_cyclic_gc():
        return _check(model, max_states, progress, progress_every)


def _check(model: Model, max_states: int, progress: Progress | None, progress_every: int) -> Result:
    started, cpu_started = time.perf_counter(), time.process_time()
    actions, next_state = model.actions, model.next_state
    eventually, at_rest = model.eventually(), model.at_rest
    stuck: list[tuple[State, list[str]]] = []  # the first state at rest (shallowest) that fails `eventually`
    states_at_rest = 0

    def successors(state: State) -> list[tuple[Action, State]]:
        nonlocal states_at_rest
        acts = actions(state)
        if at_rest(state, acts):
            states_at_rest += 1
            failed = [e.name for e in eventually if not e.holds(state)]
            if failed and not stuck:
                stuck.append((state, failed))
        return [(action, next_state(state, action)) for action in acts]

    search: Search[State] = Search(model.init_states(), successors, max_nodes=max_states, key=model.dedup_key)
    sometimes = model.sometimes()
    reached = {s.name: False for s in sometimes}
    unreached = list(sometimes)  # shrinks as they are reached: most are, early
    transitions = 0

    def finish(violations: list[Violation], last: tuple[State, Action, State] | None = None,
               complete: bool = True, bad_initial: State | None = None) -> Result:
        trace: tuple[TraceStep, ...] = ()
        initial = bad_initial
        if last is not None:
            before, action, after = last
            initial, steps = search.path(before)
            trace = _numbered([*steps, (action, after)])
        failed: tuple[str, ...] = ()
        ev_trace: tuple[TraceStep, ...] = ()
        if complete and not violations and stuck:
            ev_initial, ev_steps = search.path(stuck[0][0])
            failed, ev_trace = tuple(stuck[0][1]), _numbered(ev_steps)
            initial = ev_initial
        return Result(
            design=model.design.name, states=len(search), transitions=transitions, max_depth=search.max_depth,
            seconds=time.perf_counter() - started, complete=complete, violations=tuple(violations),
            trace=trace, initial=initial, sometimes_reached=reached, eventually_failed=failed,
            eventually_trace=ev_trace, invariants_checked=tuple(i.name for i in model.always()),
            cpu_seconds=time.process_time() - cpu_started, states_at_rest=states_at_rest,
        )

    for init in search.roots:
        bad = model.check_state(init)
        if bad:
            return finish(bad, bad_initial=init)

    check_step, check_transition = model.check_step, model.check_transition
    next_report = progress_every
    for before, action, after, new, kept in search.edges():
        transitions += 1
        if unreached:
            note_reached(unreached, reached, before, action, after)
        if search.truncated:
            return finish([], complete=False)
        if new or kept is None or (after.launched is not kept.launched and after.launched != kept.launched):
            bad = check_step(before, action, after)
        else:  # the state invariants of `after` are those of `kept`, which held
            bad = check_transition(before, action, after)
        if bad:
            return finish(bad, (before, action, after))
        if progress is not None and new and len(search) >= next_report:
            next_report += progress_every
            progress(len(search), transitions, search.max_depth)
    return finish([])


def _numbered(steps: list[tuple[Action, State]]) -> tuple[TraceStep, ...]:
    return tuple(TraceStep(i + 1, a, s) for i, (a, s) in enumerate(steps))
