"""The guard's per-step rank agreement check (shim/guard/rank_check.py) on a real gloo group of CPU processes, side
by side with what SGLang itself already exchanges on that group every scheduler iteration with TP > 1, in one run.

Per scheduler iteration, per rank, µs (median of `--steps`, best of `--repeat` rounds):
* `fingerprint`: building the step's fingerprint from `bs` request ids (the 63-bit blake2b of the rids dominates);
* `exchange`: the all-gather of the 10 int64 fields over the gloo group (`world` processes on this machine);
* `sglang recv broadcast`: SGLang 0.5.23's own `broadcast_pyobj([])` over the same group, which `recv_requests`
  runs at every iteration of every TP > 1 server (the floor the check adds to: about one more such collective).
With `--guard`, bench/bench_guard.py then runs in the same invocation for the guard's own step cost.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_rank_check.py [--world 2] [--steps 400] [--sizes 1,16,64,256]
                                                                 [--repeat 3] [--guard]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from specflip.cli_args import OneLineParser, at_least, int_list, positive_int  # noqa: E402 - the repo root is put first

at_least_2 = at_least(2)  # ranks: a rank check needs a group


def timed(fn: Callable[[], object], steps: int) -> float:
    samples = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def rank_main(rank: int, world: int, init: str, steps: int, sizes: list[int], repeat: int) -> None:
    import torch.distributed as dist

    from shim.guard.core import Mode
    from shim.guard.rank_check import RankChecker, fingerprint, group_exchange

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    group = dist.new_group(list(range(world)), backend="gloo")
    try:
        from sglang.srt.utils.common import broadcast_pyobj
    except ImportError:
        broadcast_pyobj = None
    checker = RankChecker(group_exchange(group, world), rank=rank, world_size=world, mode=Mode.ASSERT)
    rows = []
    for bs in sizes:
        rids = [f"{i:032x}" for i in range(bs)]  # SGLang's rids are uuid4 hex strings

        def make(step: int, rids: list[str] = rids) -> object:
            return fingerprint(step, forward_mode=2, rids=rids, out_cache_loc_width=len(rids), spec_algorithm_on=False,
                               spec_decode=False, guard_mode_on=False, guard_num_steps=3, guard_transitions=step)
        build = min(timed(lambda: make(1), steps) for _ in range(repeat))
        check = min(timed(lambda: checker.check(make), steps) for _ in range(repeat))
        bcast = (min(timed(lambda: broadcast_pyobj([], rank, group, src=0), steps) for _ in range(repeat))
                 if broadcast_pyobj is not None else float("nan"))
        rows.append((bs, build, check - build, check, bcast))
    if rank == 0:
        print(f"world {world} (gloo, CPU processes on this machine), {steps} steps per cell, best of {repeat}")
        print(f"{'batch':>6} {'fingerprint µs':>15} {'exchange µs':>12} {'check total µs':>15} "
              f"{'sglang recv broadcast µs':>25}")
        for bs, build, exch, total, bcast in rows:
            print(f"{bs:>6} {build:>15.1f} {exch:>12.1f} {total:>15.1f} {bcast:>25.1f}")
    dist.destroy_process_group()


def main() -> None:
    parser = OneLineParser(prog="bench_rank_check", description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=at_least_2, default=2)
    parser.add_argument("--steps", type=positive_int, default=400)
    parser.add_argument("--sizes", type=int_list(1), default="1,16,64,256")
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--guard", action="store_true", help="then run bench/bench_guard.py (the guard's step cost)")
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--init", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = list(args.sizes)
    if args.rank is not None:
        rank_main(args.rank, args.world, args.init, args.steps, sizes, args.repeat)
        return
    with tempfile.TemporaryDirectory() as tmp:
        init = str(Path(tmp) / "init")
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--init", init, "--world",
                                   str(args.world), "--steps", str(args.steps), "--sizes", ",".join(map(str, sizes)),
                                   "--repeat", str(args.repeat)], env=env) for r in range(args.world)]
        codes = [p.wait(timeout=900) for p in procs]
    if any(codes):
        raise SystemExit(f"a rank failed: exit codes {codes}")
    if args.guard:
        print("\nthe guard's own cost per decode step (bench/bench_guard.py, same run):", flush=True)
        subprocess.run([sys.executable, str(REPO / "bench" / "bench_guard.py"), "--steps", "10", "--repeat", "2",
                        "--sizes", args.sizes], check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))


if __name__ == "__main__":
    main()
