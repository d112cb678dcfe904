"""Seeded random walks over the model: stateright's simulation checker, the third checking strategy.

Breadth-first search proves a design and returns a shortest counterexample, but to do so it pays for every state
above the bug's depth. A random walk reaches a bug that many paths lead to after a few walks: on the known-bad
designs of the default scope this finds a counterexample in milliseconds, where BFS takes up to 0.4 s and
Hypothesis, walking the same model, 8x to 132x as long (`bench/bench_checker.py`). It proves nothing: a design that
survives N walks is not shown correct, and its counterexamples are not proven the shortest (BFS's are).

Each walk starts from an initial state chosen at random, takes an enabled action chosen uniformly at random
at every step, checks every step with the model's own `check_step` (the same invariants as BFS), and ends at a
state at rest (`Model.at_rest`: nothing left to do but flip), where the model's `eventually` properties are
checked, or after `max_depth` steps. An action that leads back to a state on the walk's own path is checked (an edge
into a state seen before can break a step invariant) but not taken, another is drawn; a walk whose every action
leads back ends there. So at rest the walk still takes the flips left, each checked, until they go round. The walks are
a function of `seed` alone: the same seed gives the same walks and the same counterexample. The model is
deterministic, so each edge checked clean and each state's enabled actions are kept across walks: a step that a later
walk takes again costs a lookup, and so does a step the shrinker replays (it is handed what the walks kept).

A counterexample found is then shrunk (`proofs.shrink`, as Hypothesis shrinks the failures it finds): fewer steps of
the same model that break the same invariant. The result says how long the walk's own was and what shrinking cost.
"""

from __future__ import annotations

import random
import time

import attrs

from proofs.bfs import Result, TraceStep, no_cyclic_gc, note_reached
from proofs.shrink import shrink
from statemodel.actions import Action
from statemodel.invariants import Violation
from statemodel.model import DedupKey, Model
from statemodel.state import State


@attrs.frozen
class Walks:
    """How many walks, how deep each may go, the seed they all follow from, and whether a counterexample found is
    shrunk before it is reported."""

    walks: int = 2_000
    max_depth: int = 200
    seed: int = 0
    shrink: bool = True
    # steps (and states' enabled actions) kept for later walks, at most; past it a step is worked out again. Each
    # keeps its state alive: 20,000 walks of v2_switch_reserve_sync in the large scope peaked at 525 MB unbounded,
    # 328 MB with this bound, in the same CPU time (the steps kept first are the ones walks retake most)
    kept_steps: int = 200_000

    def __attrs_post_init__(self) -> None:
        if self.walks < 1 or self.max_depth < 1 or self.kept_steps < 0:
            raise ValueError(f"walks and max_depth must be at least 1 and kept_steps at least 0, got {self.walks}, "
                             f"{self.max_depth} and {self.kept_steps}")


@attrs.frozen
class SimulationResult:
    """A `Result` (its `complete` always False: a sample proves nothing; its seconds include the shrinking), how
    many walks it took, and how the finished walks ended: at rest (its flips, if any, walked until they went round),
    elsewhere with every enabled action leading back onto the walk's own path, or at `max_depth`. For a
    counterexample: the steps of the walk that found it (`found_steps`; the result's trace is the shrunk one),
    and the replays and CPU seconds the shrinking took (0 when not shrunk)."""

    result: Result
    walks_run: int
    settings: Walks
    ended: dict[str, int]
    found_steps: int = 0
    shrink_replays: int = 0
    shrink_cpu_seconds: float = 0.0


def simulate(model: Model, settings: Walks = Walks()) -> SimulationResult:
    """Walk `model` at random until a step breaks an invariant or a state at rest fails an `eventually` property,
    or `settings.walks` walks end clean. `states` counts the distinct states (by `model.dedup_key`) the walks met."""
    with no_cyclic_gc():
        return _simulate(model, settings)


def _simulate(model: Model, settings: Walks) -> SimulationResult:
    started, cpu_started = time.perf_counter(), time.process_time()
    rng = random.Random(settings.seed)
    inits = model.init_states()
    actions, next_state, check_step, key = model.actions, model.next_state, model.check_step, model.dedup_key
    at_rest = model.at_rest
    eventually = model.eventually()
    sometimes = model.sometimes()
    reached = {s.name: False for s in sometimes}
    unreached = list(sometimes)
    seen: set[DedupKey] = set()
    ended = {"at rest": 0, "looped": 0, "depth": 0}
    transitions = deepest = 0

    def finish(walks: int, violations: list[Violation] | None = None, initial: State | None = None,
               steps: list[tuple[Action, State]] | None = None, failed: tuple[str, ...] = ()) -> SimulationResult:
        violations, steps = violations or [], steps or []
        found_steps, replays, shrink_cpu = len(steps), 0, 0.0
        if (violations or failed) and settings.shrink and initial is not None and steps:
            shrink_cpu_started = time.process_time()
            shrunk = shrink(model, initial, steps, violations, failed, taken, enabled)
            initial, steps, violations = shrunk.initial, list(shrunk.steps), list(shrunk.violations)
            failed, replays = shrunk.eventually_failed, shrunk.replays
            shrink_cpu = time.process_time() - shrink_cpu_started
        trace = tuple(TraceStep(i + 1, a, s) for i, (a, s) in enumerate(steps))
        result = Result(
            design=model.design.name, states=len(seen), transitions=transitions,
            max_depth=max(deepest, found_steps),
            seconds=time.perf_counter() - started, complete=False, violations=tuple(violations),
            trace=trace if violations else (), initial=initial, sometimes_reached=reached,
            eventually_failed=failed, eventually_trace=() if violations else trace,
            invariants_checked=tuple(i.name for i in model.always()),
            cpu_seconds=time.process_time() - cpu_started, states_at_rest=ended["at rest"],
        )
        return SimulationResult(result, walks, settings, ended, found_steps, replays, shrink_cpu)

    # kept across walks (the module docstring, Walks.kept_steps); only an edge that checked clean is kept: a broken one
    # ends the run
    taken: dict[tuple[State, Action], tuple[State, DedupKey]] = {}
    enabled: dict[State, tuple[list[Action], bool]] = {}
    keep = settings.kept_steps
    for walk in range(1, settings.walks + 1):
        state = inits[rng.randrange(len(inits))]
        state_key = key(state)
        if state_key not in seen:
            seen.add(state_key)
            bad = model.check_state(state)
            if bad:
                return finish(walk, bad, state)
        initial, steps, on_path, rested = state, [], {state_key}, False
        while True:
            if len(steps) == settings.max_depth:
                ended["depth"] += 1
                break
            known = enabled.get(state)
            if known is None:
                acts = actions(state)
                known = (acts, at_rest(state, acts))
                if len(enabled) < keep:
                    enabled[state] = known
            candidates, resting = known
            if resting:
                failed = tuple(e.name for e in eventually if not e.holds(state))
                if failed:
                    return finish(walk, initial=initial, steps=steps, failed=failed)
                rested = True
                if not candidates:
                    ended["at rest"] += 1
                    break
            # an action back onto the walk's own path is checked but not taken: a walk of flips off and on (which
            # `auto` may take at any step) would spend its depth going round without reaching anything new. At rest
            # the flips left are walked too (several known-bad designs break on them) until they go round.
            while candidates:
                i = rng.randrange(len(candidates))
                action = candidates[i]
                transitions += 1
                edge = taken.get((state, action))
                if edge is None:
                    after = next_state(state, action)
                    if unreached:
                        note_reached(unreached, reached, state, action, after)
                    bad = check_step(state, action, after)
                    if bad:
                        return finish(walk, bad, initial, [*steps, (action, after)])
                    after_key = key(after)
                    seen.add(after_key)
                    if len(taken) < keep:
                        taken[state, action] = (after, after_key)
                else:
                    after, after_key = edge
                if after_key not in on_path:
                    break
                candidates = candidates[:i] + candidates[i + 1:]
            if not candidates:
                ended["at rest" if rested else "looped"] += 1
                break
            steps.append((action, after))
            on_path.add(after_key)
            state = after
        deepest = max(deepest, len(steps))
    return finish(settings.walks)
