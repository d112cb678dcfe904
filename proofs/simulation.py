"""Seeded random walks over the model: stateright's simulation checker, the third checking strategy.

Breadth-first search proves a design and returns a shortest counterexample, but to do so it pays for every state
above the bug's depth. A random walk reaches a bug that many paths lead to after a few walks: on the known-bad
designs of the default scope this finds a counterexample in milliseconds where BFS takes up to a third of a second
and Hypothesis, walking the same model, seconds (`bench/bench_checker.py`). It proves nothing: a design that
survives N walks is not shown correct, and its counterexamples are not the shortest (BFS's are).

Each walk starts from an initial state chosen at random, takes an enabled action chosen uniformly at random
at every step, checks every step with the model's own `check_step` (the same invariants as BFS), and ends at a
terminal state, where the model's `eventually` properties are checked, or after `max_depth` steps. The walks are
a function of `seed` alone: the same seed gives the same walks and the same counterexample.
"""

from __future__ import annotations

import random
import time

import attrs

from proofs.bfs import Result, TraceStep, no_cyclic_gc
from statemodel.actions import Action
from statemodel.invariants import Violation
from statemodel.model import Model
from statemodel.state import State


@attrs.frozen
class Walks:
    """How many walks, how deep each may go, and the seed they all follow from."""

    walks: int = 2_000
    max_depth: int = 200
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        if self.walks < 1 or self.max_depth < 1:
            raise ValueError(f"walks and max_depth must be at least 1, got {self.walks} and {self.max_depth}")


@attrs.frozen
class SimulationResult:
    """A `Result` (its `complete` always False: a sample proves nothing) and how many walks it took."""

    result: Result
    walks_run: int
    settings: Walks


def simulate(model: Model, settings: Walks = Walks()) -> SimulationResult:
    """Walk `model` at random until a step breaks an invariant or a terminal state fails an `eventually` property,
    or `settings.walks` walks end clean. `states` counts the distinct states (by `model.dedup_key`) the walks met."""
    with no_cyclic_gc():
        return _simulate(model, settings)


def _simulate(model: Model, settings: Walks) -> SimulationResult:
    started, cpu_started = time.perf_counter(), time.process_time()
    rng = random.Random(settings.seed)
    inits = model.init_states()
    actions, next_state, check_step, key = model.actions, model.next_state, model.check_step, model.dedup_key
    eventually = model.eventually()
    sometimes = model.sometimes()
    reached = {s.name: False for s in sometimes}
    unreached = list(sometimes)
    seen: set[object] = set()
    transitions = deepest = 0

    def finish(walks: int, violations: list[Violation] | None = None, initial: State | None = None,
               steps: list[tuple[Action, State]] | None = None, failed: tuple[str, ...] = ()) -> SimulationResult:
        violations, steps = violations or [], steps or []
        trace = tuple(TraceStep(i + 1, a, s) for i, (a, s) in enumerate(steps))
        result = Result(
            design=model.design.name, states=len(seen), transitions=transitions,
            max_depth=max(deepest, len(steps)),
            seconds=time.perf_counter() - started, complete=False, violations=tuple(violations),
            trace=trace if violations else (), initial=initial, sometimes_reached=reached,
            eventually_failed=failed, eventually_trace=() if violations else trace,
            invariants_checked=tuple(i.name for i in model.always()),
            cpu_seconds=time.process_time() - cpu_started,
        )
        return SimulationResult(result, walks, settings)

    for walk in range(1, settings.walks + 1):
        state = inits[rng.randrange(len(inits))]
        seen.add(key(state))
        bad = model.check_state(state)
        if bad:
            return finish(walk, bad, state)
        initial, steps = state, []
        for _ in range(settings.max_depth):
            enabled = actions(state)
            if not enabled:
                failed = tuple(e.name for e in eventually if not e.holds(state))
                if failed:
                    return finish(walk, initial=initial, steps=steps, failed=failed)
                break
            action = enabled[rng.randrange(len(enabled))]
            after = next_state(state, action)
            transitions += 1
            steps.append((action, after))
            seen.add(key(after))
            if unreached:
                for s in [s for s in unreached if s.holds(state, action, after)]:
                    reached[s.name] = True
                    unreached.remove(s)
            bad = check_step(state, action, after)
            if bad:
                return finish(walk, bad, initial, steps)
            state = after
        deepest = max(deepest, len(steps))
    return finish(settings.walks)
