"""Benchmark: the BFS checker's speed, and its time to each known-bad bug next to Hypothesis's.

    python bench/bench_checker.py [--repeat N] [--json FILE]

Everything is measured in one run on this machine, side by side; times are medians of N runs.
Hypothesis is timed twice: finding the bug (generate phase only) and finding + shrinking it, with
a fixed seed per repeat so the runs differ but are reproducible.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

from proofs.bfs import check  # noqa: E402
from proofs.hypothesis_walk import ModelViolation, machine_for  # noqa: E402
from statemodel.design import Scope  # noqa: E402
from statemodel.designs import KNOWN_BAD, SHIPPED  # noqa: E402
from statemodel.model import Model  # noqa: E402


def time_hypothesis(design, seed: int, shrink: bool) -> tuple[float, int]:
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    conf = settings(max_examples=20_000, stateful_step_count=80, deadline=None, database=None, phases=phases,
                    suppress_health_check=list(HealthCheck))
    machine = machine_for(design)
    from hypothesis import seed as hyp_seed

    started = time.perf_counter()
    try:
        run_state_machine_as_test(hyp_seed(seed)(machine), settings=conf)
    except ModelViolation as exc:
        return time.perf_counter() - started, len(exc.steps)
    return float("nan"), 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    scope = Scope()
    figures: dict[str, object] = {"scope": scope.describe(), "shipped": [], "known_bad": []}

    print(f"scope: {scope.describe()}\n")
    print(f"{'shipped design':32s} {'states':>9s} {'transitions':>12s} {'seconds':>8s} {'states/s':>9s}")
    for design in SHIPPED:
        runs = [check(Model(design, scope)) for _ in range(args.repeat)]
        secs = statistics.median(r.seconds for r in runs)
        r = runs[0]
        print(f"{design.name:32s} {r.states:9,d} {r.transitions:12,d} {secs:8.2f} {r.states / secs:9,.0f}")
        figures["shipped"].append({"design": design.name, "states": r.states, "transitions": r.transitions,
                                   "seconds": secs, "states_per_second": r.states / secs})
    total = sum(d["seconds"] for d in figures["shipped"])
    print(f"{'time to exhaust the scope, all shipped designs':48s} {total:8.2f} s\n")

    print(f"{'known-bad design':32s} {'BFS s':>8s} {'steps':>5s} {'Hyp find s':>10s} {'Hyp+shrink s':>12s} "
          f"{'steps':>5s} {'find/BFS':>9s} {'shrink/BFS':>10s}")
    for design in KNOWN_BAD:
        bfs_runs = [check(Model(design, scope)) for _ in range(args.repeat)]
        bfs = statistics.median(r.seconds for r in bfs_runs)
        find = [time_hypothesis(design, seed, shrink=False) for seed in range(args.repeat)]
        shrunk = [time_hypothesis(design, seed, shrink=True) for seed in range(args.repeat)]
        find_s = statistics.median(t for t, _ in find)
        shrink_s = statistics.median(t for t, _ in shrunk)
        steps = statistics.median(n for _, n in shrunk)
        print(f"{design.name:32s} {bfs:8.3f} {len(bfs_runs[0].trace):5d} {find_s:10.3f} {shrink_s:12.3f} "
              f"{steps:5.0f} {find_s / bfs:9.1f} {shrink_s / bfs:10.1f}")
        figures["known_bad"].append({
            "design": design.name, "bfs_seconds": bfs, "bfs_steps": len(bfs_runs[0].trace),
            "hypothesis_find_seconds": find_s, "hypothesis_shrink_seconds": shrink_s,
            "hypothesis_steps_after_shrink": steps, "find_ratio": find_s / bfs, "shrink_ratio": shrink_s / bfs,
        })
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
