"""`specflip lint` cold and cached against importing SGLang's `server_args`, per release line, side by side in one run.

Issue 21's targets: lint's own time beyond importing SGLang's `server_args` <= 0.5 s cold and <= 0.2 s cached.
For each release line available here, every measurement is a fresh process timed from the outside (wall clock,
start to exit), the median of --reps:
  - import server_args: `import sglang.srt.server_args` alone, in the process settings lint's script uses (cyclic
    GC off, TORCHDYNAMO_DISABLE=1, no interpreter teardown), so the difference below is lint's and not theirs;
  - lint cold: `specflip lint ...` (as `python -m specflip.cli`, which runs `main()` as the script does, on this
    checkout's code) with an empty cache directory (a new $XDG_CACHE_HOME per run): it imports SGLang and
    resolves the real ServerArgs;
  - lint's own time, cold: lint cold - import server_args (target <= 0.5 s). It holds SGLang's own resolution
    (`resolve_once` / `__post_init__`, and the modules they import: the model config, quantization methods),
    lint's modules and lint's work;
  - cached: the same command again on the entry the cold run left (target <= 0.2 s). It imports no SGLang, so
    all of it is lint's own time; `python -c pass` is printed beside it for scale.
Release lines: 0.5.23 (.venv), 0.5.16 (its unpacked source, .cache/sglang-src/0.5.16 or
$SPECFLIP_SGLANG_0_5_16_SRC, under the CPU import stand-ins, run by .venv's Python as tests/test_lint_matrix.py
does), 0.5.12 (.venv12, the v1 worker: SGLANG_ENABLE_SPEC_V2=0). A line that is not here is skipped, saying so.
The machine is shared: compare within one run.

    .venv/bin/python bench/bench_lint.py [--reps 3] [--lines 0.5.23,0.5.16,0.5.12]
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
from shim.settings import settings  # noqa: E402 - the repo root is put first
from specflip.cli_args import OneLineParser, positive_int  # noqa: E402

STAND_INS = REPO / "stand_ins" / "cpu"
SRC_0_5_16 = Path(settings.SGLANG_0_5_16_SRC.get() or REPO / ".cache" / "sglang-src" / "0.5.16")

# (label, flags after --model-path <tiny> --speculative-draft-model-path <tiny> --speculative-algorithm EAGLE)
CONFIGS: list[tuple[str, list[str]]] = [
    ("static 3/1/4", ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                      "--speculative-num-draft-tokens", "4"]),
    ("adaptive", ["--speculative-adaptive"]),
    ("adaptive, cap 4", ["--speculative-adaptive", "--max-running-requests", "4"]),
    ("static 3/1/4, cap 128, specflip 100/60", ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                                                 "--speculative-num-draft-tokens", "4", "--max-running-requests",
                                                 "128", "--specflip-t-off", "100", "--specflip-t-on", "60"]),
]
# the process settings of lint's script (specflip.lint.run.main with owns_process), for the import floor
IMPORT_SERVER_ARGS = "import gc, os; gc.disable(); import sglang.srt.server_args; os._exit(0)"
TARGET_COLD_S, TARGET_CACHED_S = 0.5, 0.2

# One fresh process in lint's own settings, the first configuration: SGLang's server_args imported, then lint's
# modules, then lint run twice without the cache (the first run also imports what SGLang's resolution imports:
# the model config, quantization methods, the pipeline's hooks; the second is lint's work alone: parse, resolve,
# size every state, the rules), then once on an empty cache and once cached. Splits a cold run's own time into
# SGLang's and lint's parts, which the whole-process timings cannot.
SPLIT = """
import argparse, contextlib, gc, io, json, os, sys, tempfile, time
gc.disable()
os.environ["TORCHDYNAMO_DISABLE"] = "1"
clock = time.perf_counter
t = clock()
import sglang.srt.server_args
out = {"import server_args": clock() - t}
t = clock()
from specflip.lint.run import main
out["lint's modules"] = clock() - t
def once(extra):
    t = clock()
    with contextlib.redirect_stdout(io.StringIO()):
        main(argparse.Namespace(argv=extra + sys.argv[1:]))
    return clock() - t
out["first run: SGLang's resolution imports + lint's work"] = once(["--no-cache"])
out["lint's work (second run, no cache)"] = once(["--no-cache"])
once([])
out["cached run, in process"] = once([])
print(json.dumps(out))
"""


def release_lines(base_env: dict[str, str]) -> dict[str, tuple[str, dict[str, str], dict[str, str]] | str]:
    """Each release line: (python, environment of a cold run, environment of a cached run), or why it is not
    here. The cached run of 0.5.16 goes without the import stand-ins: it imports no SGLang (a stand-in that does
    not hit the cache fails, and its exit code shows it), and stand_ins/cpu_sglang_0_5_16/sitecustomize.py
    imports transformers at interpreter start, a CPU-only cost the GPU host has not."""
    path = os.pathsep.join(filter(None, [str(REPO), base_env.get("PYTHONPATH")]))
    lines: dict[str, tuple[str, dict[str, str], dict[str, str]] | str] = {}
    venv = REPO / ".venv" / "bin" / "python"
    plain = {**base_env, "PYTHONPATH": path}
    lines["0.5.23"] = (str(venv), plain, plain) if venv.exists() else "no .venv"
    if not (SRC_0_5_16 / "sglang" / "srt").is_dir():
        lines["0.5.16"] = f"no 0.5.16 source at {SRC_0_5_16}"
    elif not venv.exists():
        lines["0.5.16"] = "no .venv"
    else:
        stand_ins = [str(REPO / "stand_ins" / "cpu_sglang_0_5_16"), str(STAND_INS)]
        source = os.pathsep.join([path, str(SRC_0_5_16)])
        lines["0.5.16"] = (str(venv), {**base_env, "PYTHONPATH": os.pathsep.join([source, *stand_ins])},
                           {**base_env, "PYTHONPATH": source})
    venv12 = REPO / ".venv12" / "bin" / "python"
    v1 = {**base_env, "PYTHONPATH": path, "SGLANG_ENABLE_SPEC_V2": "0"}
    lines["0.5.12"] = (str(venv12), v1, v1) if venv12.exists() else "no .venv12"
    return lines


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds: user + system of the child, exit code) of one fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.returncode


def _version(python: str, env: dict[str, str]) -> str:
    done = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"], env=env,
                          cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or "?"


Row = tuple[str, float, float, float, float, float, float, int]


def bench_line(python: str, env: dict[str, str], cached_env: dict[str, str], floor_env: dict[str, str],
               tiny: Path, reps: int) -> list[Row]:
    """Per configuration: (label, import server_args, lint cold, own cold, own cold in CPU seconds, cached, cached
    in CPU seconds, exit code), medians. Each rep times the import and the cold run back to back, and lint's own
    time is the median of those paired differences, so a load that changes during the run moves both sides of
    one difference alike. CPU seconds (the child's user + system time) hardly move with the load of a shared
    machine; wall seconds do."""
    rows = []
    for label, flags in CONFIGS:
        argv = [python, "-m", "specflip.cli", "lint", "--model-path", str(tiny), "--speculative-draft-model-path",
                str(tiny), "--speculative-algorithm", "EAGLE", *flags]
        imports, cold, own, own_cpu, cached, cached_cpu, codes = [], [], [], [], [], [], set()
        for _ in range(reps):
            with tempfile.TemporaryDirectory(prefix="specflip-lint-bench-") as cache:
                wall_import, cpu_import, _ = _timed([python, "-c", IMPORT_SERVER_ARGS], floor_env)
                imports.append(wall_import)
                wall, cpu, rc = _timed(argv, {**env, "XDG_CACHE_HOME": cache})
                cold.append(wall)
                own.append(wall - wall_import)
                own_cpu.append(cpu - cpu_import)
                codes.add(rc)
                wall, cpu, rc = _timed(argv, {**cached_env, "XDG_CACHE_HOME": cache})
                cached.append(wall)
                cached_cpu.append(cpu)
                codes.add(rc)
        code = codes.pop() if len(codes) == 1 else -1  # -1: the exit code changed between runs
        med = statistics.median
        rows.append((label, med(imports), med(cold), med(own), med(own_cpu), med(cached), med(cached_cpu), code))
    return rows


def main() -> None:
    parser = OneLineParser(prog="bench_lint", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=positive_int, default=3, help="runs per cell (the median is reported)")
    parser.add_argument("--lines", default="0.5.23,0.5.16,0.5.12", help="release lines to time, comma-separated")
    args = parser.parse_args()

    tiny = importlib.import_module("sglang_cpu").write_tiny_model_config()
    base_env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "TORCHDYNAMO_DISABLE")}
    lines = release_lines(base_env)
    print(f"specflip lint timings, median of {args.reps} fresh processes (load average {os.getloadavg()[0]:.1f} "
          f"at start); targets: own cold <= {TARGET_COLD_S} s, cached <= {TARGET_CACHED_S} s")
    verdicts = []
    for line in args.lines.split(","):
        how = lines.get(line, f"unknown line {line}")
        if isinstance(how, str):
            print(f"\n{line}: skipped ({how})")
            continue
        python, env, cached_env = how
        found = _version(python, env)
        floor_env = {**env, "TORCHDYNAMO_DISABLE": "1",
                     "PYTHONPATH": os.pathsep.join([env["PYTHONPATH"], str(STAND_INS)])}  # lint adds it itself
        empty = statistics.median(_timed([python, "-c", "pass"], cached_env)[0] for _ in range(args.reps))
        print(f"\n{line} (sglang {found}; python -c pass {empty:.2f} s); own = cold - import, wall (CPU) seconds")
        print(f"  {'configuration':40s} {'import server_args':>18s} {'lint cold':>10s} {'own cold':>15s} "
              f"{'cached':>15s}  exit")
        splits = []
        for _ in range(args.reps):
            with tempfile.TemporaryDirectory(prefix="specflip-lint-bench-") as cache:
                done = subprocess.run([python, "-c", SPLIT, "--model-path", str(tiny), "--speculative-draft-model-path",
                                       str(tiny), "--speculative-algorithm", "EAGLE", *CONFIGS[0][1]],
                                      env={**floor_env, "XDG_CACHE_HOME": cache}, cwd=REPO, capture_output=True,
                                      text=True)
            splits.append(json.loads(done.stdout.strip().splitlines()[-1]))
        split = {key: statistics.median(one[key] for one in splits) for key in splits[0]}
        print(f"  one process ({CONFIGS[0][0]}): " + "; ".join(f"{k} {v:.2f} s" for k, v in split.items()))
        own_one = split["lint's modules"] + split["lint's work (second run, no cache)"]
        sglang_part = split["first run: SGLang's resolution imports + lint's work"] - split[
            "lint's work (second run, no cache)"]
        print(f"  => lint's own modules + work {own_one:.2f} s; SGLang's resolution imports {sglang_part:.2f} s")
        for label, imports, cold, own, own_cpu, cached, cached_cpu, code in bench_line(
                python, env, cached_env, floor_env, tiny, args.reps):
            verdicts.append((line, label, own, own_cpu, cached, cached_cpu))
            print(f"  {label:40s} {imports:17.2f}s {cold:9.2f}s {own:6.2f}s ({own_cpu:5.2f}s) "
                  f"{cached:6.2f}s ({cached_cpu:5.2f}s)  {code}")
    if verdicts:
        for index, what, target in ((2, "own cold, wall", TARGET_COLD_S), (3, "own cold, CPU", TARGET_COLD_S),
                                    (4, "cached, wall", TARGET_CACHED_S), (5, "cached, CPU", TARGET_CACHED_S)):
            worst = max(verdicts, key=lambda v: v[index])
            print(f"worst {what}: {worst[index]:.2f} s ({worst[0]}, {worst[1]}; target <= {target} s: "
                  f"{'met' if worst[index] <= target else 'NOT met'})")


if __name__ == "__main__":
    main()
