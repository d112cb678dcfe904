"""`specflip lint` cold against cached, side by side in one run, for each configuration in docs/lint.md.

Every measurement is a fresh process timed from the outside (wall clock, start to exit):
  - cold: `specflip lint ...` (as `python -m specflip.cli`, which runs `main()` as the script does, on this
    checkout's code) with an empty cache directory (a new $XDG_CACHE_HOME per run), so it imports SGLang and
    resolves the real ServerArgs;
  - cold, default process: the same through `main([...])` in a plain `python -c` (cyclic GC on, normal
    interpreter teardown): what the `specflip` script cost before it tuned its own process;
  - cached: the same command again on the cache the cold run left.
Floors, for scale: an empty interpreter, `import sglang.srt.server_args` alone, and every SGLang module lint
imports (server_args, the resolution pipeline, spec_utils), these two with GC off and no teardown, as lint
runs. Reported: the median of --reps runs and the ratios, and lint's own time against issue 21's targets:
cold minus the `import sglang.srt.server_args` floor (target <= 0.5 s), cached minus the empty interpreter
(target <= 0.2 s). Last, one process split into SGLang's imports and lint's own work once they are loaded
(without the cache, on an empty cache, cached). The machine is shared: compare within one run.

    .venv/bin/python bench/bench_lint.py [--reps 3]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
PY = sys.executable
SPECFLIP = [PY, "-m", "specflip.cli"]  # the script's entry point (main() owning its process), this checkout's code
STAND_INS = str(REPO / "stand_ins" / "cpu")

# docs/lint.md's timing table: (label, flags after --model-path <tiny> --speculative-draft-model-path <tiny>
# --speculative-algorithm EAGLE, exit)
CONFIGS: list[tuple[str, list[str], int]] = [
    ("static 3/1/4", ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                      "--speculative-num-draft-tokens", "4"], 0),
    ("adaptive", ["--speculative-adaptive"], 0),
    ("adaptive, cap 4", ["--speculative-adaptive", "--max-running-requests", "4"], 0),
    ("static 3/1/4, cap 128, specflip 100/60", ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                                                 "--speculative-num-draft-tokens", "4", "--max-running-requests",
                                                 "128", "--specflip-t-off", "100", "--specflip-t-on", "60"], 1),
]

_IN_PROCESS = "import sys; from specflip.cli import main; sys.exit(main(sys.argv[1:]))"
_FAST_EXIT = "import gc, os; gc.disable(); {body}; os._exit(0)"
FLOORS: list[tuple[str, str]] = [
    ("python -c pass", "pass"),
    ("import sglang.srt.server_args", _FAST_EXIT.format(body="import sglang.srt.server_args")),
    ("+ arg_groups.pipeline + spec_utils", _FAST_EXIT.format(
        body="import sglang.srt.server_args, sglang.srt.arg_groups.pipeline, sglang.srt.speculative.spec_utils")),
]


# One fresh process, collector off: SGLang's modules imported first (server_args, then what the resolution and the
# sizing import), then lint itself run three times on the first configuration: without the cache (resolution,
# every state's sizing, the rules), on an empty cache, and cached. Splits a cold run into SGLang's imports and
# lint's own work, which the whole-process timings above cannot.
_SPLIT = """
import argparse, contextlib, gc, io, json, sys, time
gc.disable()
t0 = time.perf_counter()
import sglang.srt.server_args
t1 = time.perf_counter()
import sglang.srt.arg_groups.pipeline, sglang.srt.speculative.spec_utils, sglang.srt.arg_groups.expert_pack_hook
t2 = time.perf_counter()
from specflip.lint.run import main
t3 = time.perf_counter()
out = {"import sglang.srt.server_args": t1 - t0, "+ the resolution and sizing modules": t2 - t1,
       "+ specflip.lint": t3 - t2}
for label, extra in (("lint, no cache (resolve, size every state, rules)", ["--no-cache"]),
                     ("lint, empty cache (the same, and the entry written)", []), ("lint, cached", [])):
    s = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        main(argparse.Namespace(argv=extra + sys.argv[1:]))
    out[label] = time.perf_counter() - s
print(json.dumps(out))
"""


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="runs per cell (the median is reported)")
    args = parser.parse_args()

    tiny = importlib.import_module("sglang_cpu").write_tiny_model_config()
    base_env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
    base_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), base_env.get("PYTHONPATH")]))
    # the CPU image has no torchvision; sglang.srt.configs imports it (lint adds the same stand-in itself)
    floor_env = {**base_env, "PYTHONPATH": os.pathsep.join(filter(None, [base_env.get("PYTHONPATH"), STAND_INS]))}

    print(f"sglang lint timings, median of {args.reps} (load average {os.getloadavg()[0]:.1f} at start)")
    print(f"{'configuration':40s} {'cold':>7s} {'cold,default':>13s} {'cached':>7s} {'cold/cached':>12s} "
          f"{'cold/default':>13s}  exit")
    colds: list[float] = []
    cacheds: list[float] = []
    for label, flags, want in CONFIGS:
        lint_args = ["lint", "--model-path", str(tiny), "--speculative-draft-model-path", str(tiny),
                     "--speculative-algorithm", "EAGLE", *flags]
        cold, default, cached, codes = [], [], [], set()
        for _ in range(args.reps):
            with tempfile.TemporaryDirectory(prefix="specflip-lint-bench-") as cache:
                env = {**base_env, "XDG_CACHE_HOME": cache}
                t, rc = _timed([*SPECFLIP, *lint_args], env)
                cold.append(t)
                codes.add(rc)
                t, rc = _timed([*SPECFLIP, *lint_args], env)
                cached.append(t)
                codes.add(rc)
            with tempfile.TemporaryDirectory(prefix="specflip-lint-bench-") as cache:
                t, rc = _timed([PY, "-c", _IN_PROCESS, *lint_args], {**base_env, "XDG_CACHE_HOME": cache})
                default.append(t)
                codes.add(rc)
        c, d, k = statistics.median(cold), statistics.median(default), statistics.median(cached)
        colds.append(c)
        cacheds.append(k)
        exit_note = str(want) if codes == {want} else f"{sorted(codes)} (expected {want})"
        print(f"{label:40s} {c:6.2f}s {d:12.2f}s {k:6.2f}s {c / k:11.0f}x {c / d:12.2f}x  {exit_note}")

    print("\nfloors (fresh process, no lint code)")
    floors = {}
    for label, code in FLOORS:
        times = [_timed([PY, "-c", code], floor_env)[0] for _ in range(args.reps)]
        floors[label] = statistics.median(times)
        print(f"{label:40s} {floors[label]:6.2f}s")
    floor = floors[FLOORS[-1][0]]
    verdict = "below" if floor > 2.0 else "above"
    print(f"\ncold lint / SGLang import floor: {statistics.median(colds) / floor:.2f}x (median cold "
          f"{statistics.median(colds):.2f}s; a 2 s cold target is {verdict} this floor of {floor:.2f}s)")
    # issue 21's targets: lint's own time beyond importing SGLang's server_args (cold) / beyond the interpreter
    own_cold = statistics.median(colds) - floors[FLOORS[1][0]]
    own_cached = statistics.median(cacheds) - floors[FLOORS[0][0]]
    for label, own, target in (("cold, beyond import server_args", own_cold, 0.5),
                               ("cached, beyond python -c pass", own_cached, 0.2)):
        print(f"lint's own time, {label}: {own:.2f}s (target <= {target} s: {'met' if own <= target else 'NOT met'})")

    print("\none process, split (median of --reps): SGLang's imports, then lint's own work")
    label, flags, _ = CONFIGS[0]
    lint_args = ["--model-path", str(tiny), "--speculative-draft-model-path", str(tiny), "--speculative-algorithm",
                 "EAGLE", *flags]
    splits = []
    for _ in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="specflip-lint-bench-") as cache:
            done = subprocess.run([PY, "-c", _SPLIT, *lint_args], env={**floor_env, "XDG_CACHE_HOME": cache}, cwd=REPO,
                                  capture_output=True, text=True)
        splits.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for key in splits[0]:
        print(f"  {key:55s} {statistics.median(s[key] for s in splits):6.3f}s")


if __name__ == "__main__":
    main()
