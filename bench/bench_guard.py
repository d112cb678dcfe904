"""The guard's cost per decode step, on real sglang 0.5.23 objects (CPU), side by side in one run.

One "step" = a real `ScheduleBatch.prepare_for_decode` plus the worker call of that step with the GPU
forward stood in (tests/guard_fixtures.py): a speculative round (draft -> verify -> draft-extend
orchestration of the real EAGLEWorkerV2.forward_batch_generation) and a plain DECODE step. Each batch
size is timed with the guard paused (hooks installed, passing through: the cost of `SPECFLIP_MODE=off`
is lower still, no hook at all), in assert mode and in trace mode. The stand-in forwards cost far less
than a GPU forward, so the ratios overstate what a server would see; the absolute microseconds per
step are the figure to compare with a real step time.

Each cell is timed `--repeat` times and the fastest kept: the step time of a spec cell at 256 requests
swings by milliseconds between runs on a shared machine. `in-guard` is the time spent inside the guard's
own steps (`GuardRuntime.run`), the figure that does not depend on the stand-ins' noise. Set
OMP_NUM_THREADS=1 on a busy machine: torch's spinning worker threads slow the stand-ins' tensor ops
by orders of magnitude when the cores are oversubscribed.

    .venv/bin/python bench/bench_guard.py [--steps N] [--sizes 1,16,64,256] [--repeat R]
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "stand_ins" / "cpu")]
warnings.simplefilter("ignore")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per cell")
    parser.add_argument("--sizes", default="1,16,64,256")
    parser.add_argument("--repeat", type=int, default=3, help="timings per cell; the fastest is kept")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    gf = importlib.import_module("guard_fixtures")
    h = importlib.import_module("sglang_cpu")
    from shim.guard.core import Mode
    from statemodel.designs import CATCH_UP

    runtime = gf.install_guard_plugin()
    in_guard = [0.0]
    run = runtime.run

    def timed_run(fn: object, *a: object, **k: object) -> None:
        started = time.perf_counter()
        try:
            run(fn, *a, **k)  # type: ignore[arg-type]
        finally:
            in_guard[0] += time.perf_counter() - started

    runtime.run = timed_run  # type: ignore[method-assign]
    model_dir = h.write_tiny_model_config()
    trace_dir = Path(tempfile.mkdtemp(prefix="specflip-bench-"))
    rows = []
    for size in sizes:
        for kind in ("spec", "plain"):
            cells: dict[str, float] = {}
            for _ in range(args.repeat):
                for label in ("unguarded", "assert", "trace"):
                    runtime.reset()
                    runtime.paused = label == "unguarded"
                    runtime.disabled_reason = None
                    runtime.mode = Mode.TRACE if label == "trace" else Mode.ASSERT
                    runtime.design_name = CATCH_UP.name
                    runtime.trace_template = str(trace_dir / f"{size}-{kind}.jsonl") if label == "trace" else None
                    steps = args.steps
                    pools = gf.eagle_pools(model_dir, num_steps=3, kv_size=size * (size // 2 + steps * 6 + 80) + 64,
                                           max_reqs=size + 1, max_running_requests=size + 1)
                    drv = gf.DesignDriver(pools, CATCH_UP)
                    drv.admit(gf.make_reqs("b", size, max_new_tokens=10 * steps + 10))
                    if kind == "plain":
                        drv.flip_off()
                    drv.decode(accepts=[2])  # warm-up
                    in_guard[0] = 0.0
                    started = time.perf_counter()
                    for _ in range(steps):
                        drv.decode(accepts=[2])
                    step_us = (time.perf_counter() - started) / steps * 1e6
                    cells[label] = min(cells.get(label, step_us), step_us)
                    if label != "unguarded":
                        guard_us = in_guard[0] / steps * 1e6
                        cells[f"{label} in"] = min(cells.get(f"{label} in", guard_us), guard_us)
            rows.append((size, kind, cells))
    runtime.reset()
    runtime.paused = True
    print(f"guard cost per decode step, sglang 0.5.23 objects on CPU, {args.steps} steps per cell, fastest of "
          f"{args.repeat} (microseconds)")
    print(f"{'batch':>5} {'step':>5} {'unguarded':>10} {'assert':>10} {'trace':>10} {'assert/x':>9} {'trace/x':>8}"
          f" {'assert +us':>10} {'trace +us':>10} {'in-guard a':>10} {'in-guard t':>10}")
    for size, kind, c in rows:
        base = c["unguarded"]
        print(f"{size:>5} {kind:>5} {base:>10.0f} {c['assert']:>10.0f} {c['trace']:>10.0f} "
              f"{c['assert'] / base:>9.2f} {c['trace'] / base:>8.2f} {c['assert'] - base:>10.0f} "
              f"{c['trace'] - base:>10.0f} {c['assert in']:>10.0f} {c['trace in']:>10.0f}")


if __name__ == "__main__":
    main()
