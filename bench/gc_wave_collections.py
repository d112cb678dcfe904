"""The collector's young collections over one closed-loop wave, with and without the guard, on real sglang 0.5.23
objects (CPU, the overlap loop: tests/overlap_loop.py).

A full collection after `/freeze_gc` walks every tracked object made since; how soon one comes follows how many tracked
objects the scheduler's iterations leave behind between collections (each young collection counts 700 net
allocations). This runs one wave of `--ramp` requests (arriving in prefills of those sizes, three iterations apart,
24 new tokens each, the switch's retract design off at any demand: `bench/bench_guard.py --ramp`'s wave), after one
unmeasured wave and `gc.freeze()`, with the guard paused and in assert mode, and counts the collections per generation
(`gc.callbacks`). The stand-in forward makes few tensors, so the counts are the host's objects: SGLang's and the
guard's.

    OMP_NUM_THREADS=1 .venv/bin/python bench/gc_wave_collections.py [--ramp 1,31,34,39,23]
"""

from __future__ import annotations

import gc
import importlib
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(HERE), str(HERE / "tests"), str(HERE / "bench"), str(HERE / "stand_ins" / "cpu")]
warnings.simplefilter("ignore")

from specflip.cli_args import OneLineParser  # noqa: E402


def _sizes(text: str) -> list[int]:
    sizes = [int(x) for x in text.split(",") if x.strip()]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--ramp wants positive sizes, comma-separated: {text!r}")
    return sizes


def wave(drv: Any, gf: Any, chunks: list[int], tag: str, iterations_apart: int) -> int:
    """One wave through `drv` (its prefills `iterations_apart` iterations apart); its iterations."""
    iterations = 0
    for number, count in enumerate(chunks):
        drv.add(gf.make_reqs(f"{tag}{number}", count, max_new_tokens=24))
        for _ in range(iterations_apart):
            drv.iteration()
            iterations += 1
    while not drv.idle():
        drv.iteration()
        iterations += 1
    return iterations


def main() -> None:
    parser = OneLineParser(prog="gc_wave_collections", description=__doc__.splitlines()[0])
    parser.add_argument("--ramp", type=_sizes, default=[1, 31, 34, 39, 23], help="the wave's prefills' sizes")
    args = parser.parse_args()
    bench_guard = importlib.import_module("bench_guard")
    gf = importlib.import_module("guard_fixtures")
    h = importlib.import_module("sglang_cpu")
    from shim.switch.config import SwitchConfig
    from statemodel.designs import RETRACT_CATCH_UP

    runtime = gf.install_guard_plugin()
    bench_guard._time_guard_runs(runtime, time.perf_counter)
    model_dir = h.write_tiny_model_config()
    size = sum(args.ramp)
    for label in ("unguarded", "assert"):
        bench_guard._arm(runtime, label, RETRACT_CATCH_UP.name)
        drv = bench_guard._overlap_driver(h, model_dir, size, size * 200 + 64, RETRACT_CATCH_UP,
                                          SwitchConfig(t_off=1, t_on=0))
        wave(drv, gf, args.ramp, f"warm-{label}-", bench_guard.RAMP_ITERATIONS)
        gc.collect()
        gc.freeze()  # as /freeze_gc after a server's warm-up
        collections = [0, 0, 0]

        def count(phase: str, info: dict[str, Any], collections: list[int] = collections) -> None:
            if phase == "stop":
                collections[min(2, int(info["generation"]))] += 1

        gc.callbacks.append(count)
        try:
            iterations = wave(drv, gf, args.ramp, f"{label}-", bench_guard.RAMP_ITERATIONS)
        finally:
            gc.callbacks.remove(count)
            gc.unfreeze()
        print(f"{label:>9}: a wave of {size} in {iterations} iterations: collections by generation {collections}")
    runtime.reset()
    runtime.paused = True


if __name__ == "__main__":
    main()
