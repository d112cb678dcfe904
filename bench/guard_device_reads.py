"""Tensor value reads per decode step inside the guard's steps, by hook, on SGLang 0.5.23's overlap loop (CPU).

Device reads (a host-device sync each on a GPU server) and host-mirror reads (`host_ints`: seq_lens_cpu, the result's
host copies) counted by tests/test_guard_device_reads.py's `DeviceReadCounterCpuStandIn`, speculative and plain steps
at each batch size, the guard in assert mode with slot values on the GPU's assert path.

    OMP_NUM_THREADS=1 .venv/bin/python bench/guard_device_reads.py [--sizes 2,8] [--steps 10]
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(HERE), str(HERE / "tests")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,8", help="batch sizes, comma-separated")
    parser.add_argument("--steps", type=int, default=10, help="counted steps per cell")
    args = parser.parse_args()
    reads = importlib.import_module("test_guard_device_reads")
    runtime = reads.gf.install_guard_plugin()
    runtime.paused = False
    model_dir = reads.h.write_tiny_model_config()
    steps = args.steps
    for size in (int(s) for s in args.sizes.split(",")):
        for kind in ("spec", "plain"):
            counter = reads.counted_steps(runtime, model_dir, size, kind, steps)
            device = sum(counter.device_reads.values()) / steps
            host = sum(counter.host_reads.values()) / steps
            hooks = ", ".join(f"{hook.split('.')[1]} {n / steps:g}" for hook, n in sorted(counter.host_reads.items()))
            print(f"batch {size} {kind:5s}: device reads per step {device:g}; host-mirror reads per step {host:g} "
                  f"({hooks})")
            for (hook, site), n in counter.device_reads.most_common():
                print(f"    device read {n / steps:g} per step: {hook} at {site}")


if __name__ == "__main__":
    main()
