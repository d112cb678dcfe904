"""Benchmark: the checker before and after issue 20 side by side, and its time to each known-bad bug next
to Hypothesis's.

    python bench/bench_checker.py [--repeat N] [--jobs J] [--symmetry] [--overlap] [--json FILE]

Everything is measured in one run on this machine, side by side:

- before: the checker as it was before issue 20 (`check_before_issue_20`, a frozen copy kept here for this
  comparison only: it checks an edge only when it reaches a new state), one design after another;
- after, one process: `proofs.bfs.check` (every edge checked), one design after another;
- after, the pool: `proofs.verdicts.run_designs`, what `specflip check` runs (one process per core).

Wall and CPU seconds are both reported: the machine is shared, so wall time is noisy; CPU time is what
each checker spent. `--symmetry` also counts the states of each shipped design with every batch's request
order canonicalised (the one symmetry this scope has; see docs). Hypothesis is timed twice: finding the bug
(generate phase only) and finding + shrinking it, with a fixed seed per repeat.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis import seed as hyp_seed  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

from proofs.bfs import Result, TraceStep, check  # noqa: E402
from proofs.hypothesis_walk import ModelViolation, machine_for  # noqa: E402
from proofs.verdicts import run_designs  # noqa: E402
from statemodel.actions import Action  # noqa: E402
from statemodel.design import Design, Scope  # noqa: E402
from statemodel.designs import ALL_DESIGNS, KNOWN_BAD, OVERLAP_DESIGNS, overlap_scope  # noqa: E402
from statemodel.invariants import Violation  # noqa: E402
from statemodel.model import Model  # noqa: E402
from statemodel.state import State, Unprocessed  # noqa: E402


def check_before_issue_20(model: Model, max_states: int = 2_000_000) -> Result:
    """The checker before issue 20, for this comparison only: `if nxt in parent: continue` came before
    `check_step`, so an edge into a state seen before was never checked."""
    started, cpu_started = time.perf_counter(), time.process_time()
    parent: dict[State, tuple[State, Action] | None] = {}
    depth_of: dict[State, int] = {}
    queue: deque[State] = deque()
    sometimes = model.sometimes()
    reached = {s.name: False for s in sometimes}
    eventually = model.eventually()
    transitions = 0
    max_depth = 0

    def finish(violations: list[Violation], last: State | None, failed: tuple[str, ...] = (),
               complete: bool = True) -> Result:
        steps: list[TraceStep] = []
        cur = last
        while cur is not None and parent[cur] is not None:
            prev, action = parent[cur]  # type: ignore[misc]
            steps.append(TraceStep(0, action, cur))
            cur = prev
        trace = tuple(TraceStep(i + 1, s.action, s.state) for i, s in enumerate(reversed(steps)))
        return Result(
            design=model.design.name, states=len(parent), transitions=transitions, max_depth=max_depth,
            seconds=time.perf_counter() - started, complete=complete, violations=tuple(violations),
            trace=trace, initial=cur, sometimes_reached=reached, eventually_failed=failed, eventually_trace=(),
            invariants_checked=tuple(i.name for i in model.always()), cpu_seconds=time.process_time() - cpu_started,
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
    failed_eventually: list[str] = []
    while queue:
        state = queue.popleft()
        depth = depth_of[state]
        acts = model.actions(state)
        if not acts and not failed_eventually:
            failed_eventually = [e.name for e in eventually if not e.holds(state)]
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
            if len(parent) >= max_states:
                return finish([], None, complete=False)
    return finish([], None, tuple(failed_eventually))


def batch_order_canonical(state: State) -> State:
    """`state` with the requests of every batch (running, pending, launched, each unprocessed result) in id
    order: the model reads a batch as a set (every rule is per request; a verify's accepts go with its rids)."""
    def canonical(batch):  # noqa: ANN001, ANN202
        if batch is None or len(batch.rids) < 2 or list(batch.rids) == sorted(batch.rids):
            return batch
        return batch.replace(rids=tuple(sorted(batch.rids)))
    unprocessed = tuple(u if list(u.rids) == sorted(u.rids) else Unprocessed(tuple(sorted(u.rids)), u.steps,
                                                                                u.draft_extended)
                        for u in state.unprocessed)
    return state.replace(running=canonical(state.running), pending=canonical(state.pending),
                         launched=canonical(state.launched), unprocessed=unprocessed)


def count_up_to_batch_order(model: Model) -> int:
    """States of `model`, two states that differ only in the order of a batch's requests counted once."""
    seen: set[State] = set()
    queue: deque[State] = deque()
    for init in model.init_states():
        key = batch_order_canonical(init)
        if key not in seen:
            seen.add(key)
            queue.append(init)
    while queue:
        state = queue.popleft()
        for action in model.actions(state):
            after = model.next_state(state, action)
            key = batch_order_canonical(after)
            if key not in seen:
                seen.add(key)
                queue.append(after)
    return len(seen)


def time_hypothesis(design: Design, seed: int, shrink: bool) -> tuple[float, int]:
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    conf = settings(max_examples=20_000, stateful_step_count=80, deadline=None, database=None, phases=phases,
                    suppress_health_check=list(HealthCheck))
    machine = machine_for(design)
    started = time.perf_counter()
    try:
        run_state_machine_as_test(hyp_seed(seed)(machine), settings=conf)
    except ModelViolation as exc:
        return time.perf_counter() - started, len(exc.steps)
    return float("nan"), 0


def _summary(r: Result) -> tuple[str | None, int]:
    return (r.violations[0].invariant if r.violations else None), len(r.trace)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="Hypothesis runs per known-bad design")
    parser.add_argument("--jobs", type=int, help="processes for the pool (default: one per core)")
    parser.add_argument("--symmetry", action="store_true", help="also count states up to batch order")
    parser.add_argument("--overlap", action="store_true", help="the overlap designs and scope instead")
    parser.add_argument("--no-hypothesis", dest="hypothesis", action="store_false")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    designs = list(OVERLAP_DESIGNS if args.overlap else ALL_DESIGNS)
    scope_for = overlap_scope if args.overlap else (lambda d: Scope())
    limit = 12_000_000 if args.overlap else 2_000_000
    figures: dict[str, object] = {"scope": scope_for(designs[0]).describe(), "designs": [], "known_bad": []}
    print(f"scope: {figures['scope']}\n")

    print(f"{'design':32s} {'states before':>13s} {'after':>8s} {'x':>5s} {'transitions':>11s} | "
          f"{'before wall':>11s} {'cpu':>6s} | {'after wall':>10s} {'cpu':>6s} | verdict (before = after)")
    rows = []
    totals = {"before_wall": 0.0, "before_cpu": 0.0, "after_wall": 0.0, "after_cpu": 0.0}
    for design in designs:
        model = Model(design, scope_for(design))
        gc.collect()
        before = check_before_issue_20(model, limit)
        gc.collect()
        after = check(model, max_states=limit)
        same = _summary(before) == _summary(after)
        totals["before_wall"] += before.seconds
        totals["before_cpu"] += before.cpu_seconds
        totals["after_wall"] += after.seconds
        totals["after_cpu"] += after.cpu_seconds
        row = {"design": design.name, "kind": design.kind.value, "states": after.states,
               "states_before": before.states, "transitions": after.transitions,
               "before_seconds": before.seconds, "before_cpu_seconds": before.cpu_seconds,
               "after_seconds": after.seconds, "after_cpu_seconds": after.cpu_seconds,
               "invariant": _summary(after)[0], "trace_steps": _summary(after)[1], "same_verdict": same}
        if args.symmetry and not after.violations:
            row["states_up_to_batch_order"] = count_up_to_batch_order(model)
        rows.append(row)
        print(f"{design.name:32s} {before.states:13,d} {after.states:8,d} {before.states / after.states:5.2f} "
              f"{after.transitions:11,d} | {before.seconds:11.2f} "
              f"{before.cpu_seconds:6.2f} | {after.seconds:10.2f} {after.cpu_seconds:6.2f} | "
              f"{row['invariant'] or 'no violation'} ({row['trace_steps']} steps) {'same' if same else 'DIFFERS'}"
              + (f"; up to batch order: {row['states_up_to_batch_order']:,} states "
                 f"(x{after.states / row['states_up_to_batch_order']:.3f})" if "states_up_to_batch_order" in row
                 else ""), flush=True)
    figures["designs"] = rows
    gc.collect()
    started = time.perf_counter()
    pooled = run_designs(designs, scope_for, max_states=limit, jobs=args.jobs)
    pool_wall = time.perf_counter() - started
    pool_cpu = sum(v.result.cpu_seconds for v in pooled)
    figures["totals"] = {**totals, "pool_wall": pool_wall, "pool_cpu": pool_cpu, "pool_jobs": args.jobs or "cores"}
    print(f"\nall {len(designs)} designs, one after another: before {totals['before_wall']:.1f} s wall / "
          f"{totals['before_cpu']:.1f} s CPU; after {totals['after_wall']:.1f} s wall / "
          f"{totals['after_cpu']:.1f} s CPU")
    print(f"all {len(designs)} designs, after, in the pool (what `specflip check` runs): {pool_wall:.1f} s wall, "
          f"{pool_cpu:.1f} s CPU in the checker; before / pool, wall: {totals['before_wall'] / pool_wall:.2f}x\n")

    if args.hypothesis and not args.overlap:
        print(f"{'known-bad design':32s} {'BFS s':>8s} {'steps':>5s} {'Hyp find s':>10s} {'Hyp+shrink s':>12s} "
              f"{'steps':>5s} {'find/BFS':>9s} {'shrink/BFS':>10s}")
        for design in KNOWN_BAD:
            bfs_runs = [check(Model(design, Scope())) for _ in range(args.repeat)]
            bfs = statistics.median(r.seconds for r in bfs_runs)
            find = [time_hypothesis(design, seed, shrink=False) for seed in range(args.repeat)]
            shrunk = [time_hypothesis(design, seed, shrink=True) for seed in range(args.repeat)]
            find_s = statistics.median(t for t, _ in find)
            shrink_s = statistics.median(t for t, _ in shrunk)
            steps = statistics.median(n for _, n in shrunk)
            print(f"{design.name:32s} {bfs:8.3f} {len(bfs_runs[0].trace):5d} {find_s:10.3f} {shrink_s:12.3f} "
                  f"{steps:5.0f} {find_s / bfs:9.1f} {shrink_s / bfs:10.1f}", flush=True)
            figures["known_bad"].append({  # type: ignore[union-attr]
                "design": design.name, "bfs_seconds": bfs, "bfs_steps": len(bfs_runs[0].trace),
                "hypothesis_find_seconds": find_s, "hypothesis_shrink_seconds": shrink_s,
                "hypothesis_steps_after_shrink": steps, "find_ratio": find_s / bfs, "shrink_ratio": shrink_s / bfs,
            })
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
