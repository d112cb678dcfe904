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

`--loop overlap` drives SGLang's overlap schedule instead (tests/overlap_loop.py: what a GPU server runs): one step
is one `event_loop_overlap` iteration, the result processing of the step before included. `--draft` picks the
switch's design there: `sync` (v2_switch_reserve_sync, a draft sync after every plain step; the default, as the
figures in docs/guard.md were measured) or `retract` (plain_off_retract_catch_up, `SPECFLIP_SWITCH_DRAFT=retract`:
the switch's default on a server, whose plain step is SGLang's own plain decode). `--clock cpu` times with the
scheduler thread's CPU time (`time.thread_time`): on a machine shared with other work the wall clock counts the time
the thread waited for a core.

`--line v1` drives SGLang 0.5.12's v1 EAGLEWorker on the non-overlap loop instead (run it with .venv12;
tests/sglang12_cpu.py V1LoopServer, the v1 switch in its default draft mode retract): the H200's v1 line, where the
guard's time is on the critical path. One step is one `event_loop_normal` iteration (get_next_batch_to_run, the
worker call, the result's processing); "spec" keeps speculation on, "plain" flips it off first. Only assert mode.

`--waves` measures, on the overlap loop, what a closed-loop benchmark's waves cost instead of steady steps: `size`
requests arrive in one prefill and finish in one iteration (each request is a model step of its own there: an
arrival, a release), and the in-guard time of those two iterations is reported per request (kinds "arrive" and
"finish"). On the H200 a round of the sweep at 256 runs two such waves.

`--ramp 1,31,34,39,23` measures a wave as a server's closed loop runs it (2026-12-04, 913095b): its requests reach the
scheduler over several prefills, three iterations apart, and those that came first finish first; the in-guard time of
the whole ramp and of the whole end is reported (kinds "ramp" and "end"). On the H200 that is where the guard's cost
showed: the steady decode step hides the guard's host time behind the GPU, a wave's ramp and end do not (docs/guard.md,
"Cost").

`--history 0,100,1000` measures steady speculative steps at 2 short requests (32-token prompts) after that many
long-prompt requests were served (2,000-3,500 tokens, four 600-token system prompts, waves of 8, 16 output tokens each,
the radix cache on, a 40,000-slot pool that the tree fills and evicts from; the switch's retract design, speculation
off from 4 requests: what a `context` trace leaves behind before the quiet phase after it, 2026-12-07 H200 call 5),
rows handed out in turn as on the GPU line (0.5.16; `_rows_in_turn_cpu_stand_in`).
The collector is frozen after a warm-up request, as the GPU runs' /freeze_gc, and the collections during the measured
steps are counted; after them, the SGLang requests still alive (not frozen) and the time of one full collection.
Each count is a fresh process (`--history-one`), fastest of `--repeat`; one row per count: the
in-guard time per step, its median, and the guard's per-request records after the history (to show they stay
bounded).

`--against REF` measures the guard of git revision REF (exported with `git archive` into a temporary folder) and
of this checkout side by side: rounds alternate between the two (each a fresh process), so that a change in the
machine's load falls on both; each cell keeps the fastest round per side. Only assert mode's in-guard time.

    .venv/bin/python bench/bench_guard.py [--steps N] [--sizes 1,16,64,256] [--repeat R]
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_guard.py --against main --rounds 3 --clock cpu [--loop overlap]
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_guard.py --loop overlap --draft retract --clock cpu --sizes 64,256
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_guard.py --waves --against main --rounds 3 --clock cpu --sizes 32,256
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_guard.py --ramp 1,31,34,39,23 --against main --rounds 3 --clock cpu
    OMP_NUM_THREADS=1 .venv12/bin/python bench/bench_guard.py --line v1 --against main --rounds 5 --clock cpu
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_guard.py --history 0,100,1000 --clock cpu --repeat 3
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))
# this checkout's argument types, also when --tree measures another (whose guard imports nothing of specflip)
from specflip.cli_args import OneLineParser, int_list, positive_int  # noqa: E402

# the code measured: this checkout, or the tree --tree names (the other side of --against)
REPO = Path(sys.argv[sys.argv.index("--tree") + 1]).resolve() if "--tree" in sys.argv[:-1] else HERE
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "stand_ins" / "cpu")]
warnings.simplefilter("ignore")


def main() -> None:
    parser = OneLineParser(prog="bench_guard", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=20, help="timed steps per cell")
    parser.add_argument("--sizes", type=int_list(1), default="1,16,64,256", help="batch sizes, comma-separated")
    parser.add_argument("--repeat", type=positive_int, default=3, help="timings per cell; the fastest is kept")
    parser.add_argument("--loop", choices=("normal", "overlap"), default="normal",
                        help="the scheduler loop driven: normal (CATCH_UP) or overlap (the switch, --draft)")
    parser.add_argument("--draft", choices=("sync", "retract"), default="sync",
                        help="--loop overlap: the switch's design, sync (V2_SWITCH) or retract (RETRACT_CATCH_UP, "
                             "the switch's default on a server)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: time.perf_counter; cpu: the thread's CPU time (time.thread_time)")
    parser.add_argument("--line", choices=("v2", "v1"), default="v2",
                        help="v2: sglang 0.5.23 objects (.venv); v1: 0.5.12's v1 EAGLEWorker, non-overlap (.venv12)")
    parser.add_argument("--against", metavar="REF", help="a git revision measured side by side with this checkout")
    parser.add_argument("--rounds", type=positive_int, default=3, help="--against: alternating rounds per side")
    parser.add_argument("--waves", action="store_true",
                        help="the overlap loop's arrivals and finishes of a whole wave, per request, not steady steps")
    parser.add_argument("--ramp", type=int_list(1), metavar="SIZES",
                        help="a wave's ramp and end as a server's closed loop runs them: its requests arrive in "
                             "prefills of these sizes, three iterations apart (e.g. 1,31,34,39,23)")
    parser.add_argument("--history", type=int_list(0), metavar="COUNTS",
                        help="steady speculative steps at 2 short requests after this many long-prompt requests "
                             "were served (radix cache on, 40,000-slot pool), one row per count (e.g. 0,100,1000)")
    parser.add_argument("--history-one", type=int, help=argparse.SUPPRESS)  # one count, this process (--history)
    parser.add_argument("--evict", type=int_list(1), metavar="LEAVES",
                        help="a long prefill that evicts this many short leaves from the radix tree, 8 requests "
                             "decoding beside it (e.g. 25,100,400): its iteration's in-guard time, one row per count")
    parser.add_argument("--per-hook", action="store_true",
                        help="also the assert run's in-guard time per hook (its fastest repeat), per decode step")
    parser.add_argument("--tree", help=argparse.SUPPRESS)  # read at import (REPO)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one line: the cells (--against)
    parser.add_argument("--assert-only", action="store_true", help=argparse.SUPPRESS)  # (--against)
    args = parser.parse_args()
    if args.against:
        against(args)
        return
    sizes = list(args.sizes)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    if args.line == "v1":
        rows = _v1_rows(args, sizes, clock)
        if args.json:
            print(json.dumps([[size, kind, c] for size, kind, c in rows]))
        else:
            print(f"in-guard time per v1 iteration, assert mode, {args.clock} clock, fastest of {args.repeat} "
                  f"(microseconds)")
            for size, kind, c in rows:
                print(f"{size:>5} {kind:>5} {c['assert in']:>10.0f}")
        return

    if args.history:
        history_rows(args)
        return
    gf = importlib.import_module("guard_fixtures")
    h = importlib.import_module("sglang_cpu")
    if args.history_one is not None:
        print(json.dumps(_history_cell(args, args.history_one, gf, h)))
        return
    fastest = f"assert mode, {args.clock} clock, fastest of {args.repeat} (microseconds)"
    if args.evict:
        _report(args, _evict_rows(args, clock, gf, h),
                f"a long prefill evicting N short leaves from the radix tree (overlap loop, speculation on, 8 requests "
                f"decoding): its iteration, {fastest}",
                f"{'leaves':>6} {'frees':>6} {'scans':>6} {'in-guard':>9} {'iteration':>10} {'unguarded':>10}",
                lambda size, _, c: f"{size:>6} {c['frees']:>6.0f} {c['scans']:>6.0f} {c['assert in']:>9.0f} "
                                   f"{c['assert']:>10.0f} {c['unguarded']:>10.0f}")
        return
    if args.ramp:
        _report(args, _ramp_rows(args, clock, gf, h),
                f"a wave's ramp (prefills of {','.join(map(str, args.ramp))}, {RAMP_ITERATIONS} iterations apart) and "
                f"end on the overlap loop, in plain: in-guard time of each phase, {fastest}",
                f"{'batch':>5} {'phase':>6} {'in-guard':>9} {'phase':>10} {'unguarded':>10}",
                lambda size, kind, c: f"{size:>5} {kind:>6} {c['assert in']:>9.0f} {c['assert']:>10.0f} "
                                      f"{c['unguarded']:>10.0f}")
        return
    if args.waves:
        _report(args, _wave_rows(args, sizes, clock, gf, h),
                f"a wave on the overlap loop (switch draft mode retract): in-guard time per request, {fastest}",
                f"{'batch':>5} {'kind':>6} {'in-guard':>9} {'iteration':>10} {'unguarded':>10}",
                lambda size, kind, c: f"{size:>5} {kind:>6} {c['assert in']:>9.1f} {c['assert']:>10.0f} "
                                      f"{c['unguarded']:>10.0f}")
        return
    from statemodel.designs import CATCH_UP, RETRACT_CATCH_UP, V2_SWITCH

    design = CATCH_UP if args.loop == "normal" else RETRACT_CATCH_UP if args.draft == "retract" else V2_SWITCH

    runtime = gf.install_guard_plugin()
    in_guard, by_hook = _time_guard_runs(runtime, clock)
    model_dir = h.write_tiny_model_config()
    trace_dir = Path(tempfile.mkdtemp(prefix="specflip-bench-"))
    rows = []
    for size in sizes:
        for kind in ("spec", "plain"):
            cells: dict[str, float] = {}
            for _ in range(args.repeat):
                for label in ("assert",) if args.assert_only else ("unguarded", "assert", "trace"):
                    _arm(runtime, label, design.name,
                         str(trace_dir / f"{size}-{kind}.jsonl") if label == "trace" else None)
                    steps = args.steps
                    step = _overlap_steps(gf, h, model_dir, size, steps, kind, design) if args.loop == "overlap" \
                        else _normal_steps(gf, model_dir, size, steps, kind, design)
                    in_guard[0] = 0.0
                    by_hook.clear()
                    started = clock()
                    for _ in range(steps):
                        step()
                    step_us = (clock() - started) / steps * 1e6
                    cells[label] = min(cells.get(label, step_us), step_us)
                    if label != "unguarded":
                        guard_us = in_guard[0] / steps * 1e6
                        if label == "assert" and guard_us < cells.get("assert in", float("inf")):
                            cells["assert hooks"] = {n: t / steps * 1e6 for n, t in by_hook.items()}
                        cells[f"{label} in"] = min(cells.get(f"{label} in", guard_us), guard_us)
            rows.append((size, kind, cells))
    runtime.reset()
    runtime.paused = True
    if args.json:
        print(json.dumps([[size, kind, c] for size, kind, c in rows]))
        return
    print(f"guard cost per decode step, sglang 0.5.23 objects on CPU, {args.steps} steps per cell, fastest of "
          f"{args.repeat} (microseconds)")
    print(f"{'batch':>5} {'step':>5} {'unguarded':>10} {'assert':>10} {'trace':>10} {'assert/x':>9} {'trace/x':>8}"
          f" {'assert +us':>10} {'trace +us':>10} {'in-guard a':>10} {'in-guard t':>10}")
    for size, kind, c in rows:
        base = c["unguarded"]
        print(f"{size:>5} {kind:>5} {base:>10.0f} {c['assert']:>10.0f} {c['trace']:>10.0f} "
              f"{c['assert'] / base:>9.2f} {c['trace'] / base:>8.2f} {c['assert'] - base:>10.0f} "
              f"{c['trace'] - base:>10.0f} {c['assert in']:>10.0f} {c['trace in']:>10.0f}")
    if args.per_hook:
        print("\nassert mode, in-guard microseconds per decode step by hook (the fastest repeat)")
        for size, kind, c in rows:
            hooks = sorted(c["assert hooks"].items(), key=lambda item: -item[1])
            print(f"{size:>5} {kind:>5} " + ", ".join(f"{name} {us:.0f}" for name, us in hooks))


def _normal_steps(gf: Any, model_dir: Path, size: int, steps: int, kind: str, design: Any) -> Callable[[], Any]:
    """The normal loop (tests/guard_fixtures.py DesignDriver): `size` requests decoding, speculation off for
    "plain"; returns one decode step, warmed up once."""
    pools = gf.eagle_pools(model_dir, num_steps=3, kv_size=size * (size // 2 + steps * 6 + 80) + 64,
                           max_reqs=size + 1, max_running_requests=size + 1)
    drv = gf.DesignDriver(pools, design)
    drv.admit(gf.make_reqs("b", size, max_new_tokens=10 * steps + 10))
    if kind == "plain":
        drv.flip_off()
    drv.decode(accepts=[2])  # warm-up
    return lambda: drv.decode(accepts=[2])


def _arm(runtime: Any, label: str, design_name: str, trace_template: str | None = None) -> None:
    """A fresh guard for one timed run: paused ("unguarded": the hooks pass through), assert or trace mode."""
    from shim.guard.core import Mode

    runtime.reset()
    runtime.paused = label == "unguarded"
    runtime.disabled_reason = None
    runtime.mode = Mode.TRACE if label == "trace" else Mode.ASSERT
    runtime.design_name = design_name
    runtime.trace_template = trace_template


def _overlap_driver(h: Any, model_dir: Path, size: int, kv_size: int, design: Any, switch_config: Any) -> Any:
    """tests/overlap_loop.py's OverlapDriver over fresh pools for `size` running requests (EAGLE, steps 3, topk 1,
    4 draft tokens, SGLang's overlap schedule)."""
    ol = importlib.import_module("overlap_loop")
    sa = h.make_server_args(model_dir, speculative_algorithm="EAGLE", num_steps=3, topk=1,
                            num_draft_tokens=4, max_running_requests=size + 1)
    # the overlap loop as a GPU launch resolves it (the guard reads SGLang's resolved view: tests/sglang_cpu.py)
    pools = h.build_pools(sa, kv_size=kv_size, max_reqs=size + 1, overlap_schedule=True)
    return ol.OverlapDriver(pools, design, switch_config=switch_config)


def _overlap_steps(gf: Any, h: Any, model_dir: Path, size: int, steps: int, kind: str,
                   design: Any) -> Callable[[], Any]:
    """The overlap loop (tests/overlap_loop.py OverlapDriver) under the switch's `design`: `size` requests decoding,
    speculation off for "plain"; returns one loop iteration, warmed up. The sync design flips when told; the retract
    design's switch decides at get_next_batch_to_run from its thresholds (off at 1 running for "plain", never for
    "spec")."""
    from shim.switch.config import SwitchConfig
    from statemodel.design import DraftWhileOff

    retract = design.draft_while_off is DraftWhileOff.RETRACT_ON_ENABLE
    config = SwitchConfig(t_off=1 if kind == "plain" else size + 1, t_on=0) if retract else None
    drv = _overlap_driver(h, model_dir, size, size * (size // 2 + steps * 8 + 80) + 64, design, config)
    drv.add(gf.make_reqs("b", size, max_new_tokens=10 * steps + 20))
    for _ in range(3):  # prefill, merge, the first decode steps
        drv.iteration()
    if kind == "plain" and not retract:
        drv.iteration(flip="off")
    for _ in range(2):
        drv.iteration()
    if retract and drv.launched[-1][1] != kind:
        raise SystemExit(f"bench_guard: the retract switch runs {drv.launched[-1][1]} steps, not {kind}")
    return drv.iteration


def _report(args: argparse.Namespace, rows: list[Any], title: str, header: str,
            line: Callable[[int, str, dict[str, float]], str]) -> None:
    """A mode's rows: one JSON line (`--json`, for `--against`), else its title, header and a line per row."""
    if args.json:
        print(json.dumps([[size, kind, c] for size, kind, c in rows]))
        return
    print(title)
    print(header)
    for size, kind, c in rows:
        print(line(size, kind, c))


def _wave_rows(args: argparse.Namespace, sizes: list[int], clock: Callable[[], float], gf: Any,
               h: Any) -> list[Any]:
    """`size` requests admitted in one prefill and finished in one iteration (the overlap loop, the retract switch's
    design kept on speculation): per size, kind "arrive" (the prefill's iteration) and "finish" (the iteration that
    released them), the in-guard time per request (`assert in`) and the iteration's whole time, guarded and not."""
    from shim.switch.config import SwitchConfig
    from statemodel.designs import RETRACT_CATCH_UP

    runtime = gf.install_guard_plugin()
    in_guard, _ = _time_guard_runs(runtime, clock)
    model_dir = h.write_tiny_model_config()
    rows = []
    for size in sizes:
        cells: dict[str, dict[str, float]] = {"arrive": {}, "finish": {}}
        for _ in range(args.repeat):
            for label in ("unguarded", "assert"):
                _arm(runtime, label, RETRACT_CATCH_UP.name)
                drv = _overlap_driver(h, model_dir, size, size * 200 + 64, RETRACT_CATCH_UP,
                                      SwitchConfig(t_off=size + 1, t_on=0))
                drv.add(gf.make_reqs("w", size, max_new_tokens=4))
                for number in range(32):
                    released = len(drv.released)
                    in_guard[0] = 0.0
                    started = clock()
                    drv.iteration()
                    spent = clock() - started
                    kind = "arrive" if number == 0 else "finish" if len(drv.released) - released == size else None
                    if kind is not None:
                        _keep_fastest(cells[kind], label, spent, in_guard[0] / size)
                    if drv.idle():
                        break
                if len(drv.released) != size:
                    raise SystemExit(f"bench_guard: the wave of {size} released {len(drv.released)} requests")
        for kind in ("arrive", "finish"):
            if "assert in" not in cells[kind]:
                raise SystemExit(f"bench_guard: no {kind} iteration of the wave of {size} (not all in one)")
            rows.append((size, kind, cells[kind]))
    runtime.reset()
    runtime.paused = True
    return rows


# per prefill of --ramp, its own included: the 2026-12-03 (80ec134) run's H200 traces, prefills 20-30 ms apart
RAMP_ITERATIONS = 3


def _ramp_rows(args: argparse.Namespace, clock: Callable[[], float], gf: Any, h: Any) -> list[Any]:
    """A wave as a server's closed loop runs it (2026-12-04, 913095b, docs/guard.md "Cost"): its requests reach the
    scheduler over several prefills with decode steps between (`--ramp`, RAMP_ITERATIONS iterations per prefill), and
    those that came first finish first. Kinds: "ramp" (the prefills' iterations) and "end" (from the iteration of the
    first release to the last), each the in-guard time of the whole phase (`assert in`) and the phase's time, guarded
    and not. The wave runs in plain (the switch's retract design, off at any demand), as `auto` runs a wave of 128."""
    from shim.switch.config import SwitchConfig
    from statemodel.designs import RETRACT_CATCH_UP

    chunks = list(args.ramp)
    size = sum(chunks)
    new_tokens = 24  # long enough for every prefill to come before the first finish
    runtime = gf.install_guard_plugin()
    in_guard, _ = _time_guard_runs(runtime, clock)
    model_dir = h.write_tiny_model_config()
    cells: dict[str, dict[str, float]] = {"ramp": {}, "end": {}}
    for _ in range(args.repeat):
        for label in ("unguarded", "assert"):
            _arm(runtime, label, RETRACT_CATCH_UP.name)
            drv = _overlap_driver(h, model_dir, size, size * 200 + 64, RETRACT_CATCH_UP, SwitchConfig(t_off=1, t_on=0))
            totals = {"ramp": [0.0, 0.0], "end": [0.0, 0.0]}  # phase -> [in-guard, iterations' time]
            for number, count in enumerate(chunks):
                drv.add(gf.make_reqs(f"w{number}", count, max_new_tokens=new_tokens))
                for _ in range(RAMP_ITERATIONS):
                    _timed_iteration(drv, clock, in_guard, totals["ramp"])
            if drv.released:
                raise SystemExit("bench_guard: a request of the ramp finished before its last prefill")
            while not drv.released:
                drv.iteration()
            while not drv.idle():
                _timed_iteration(drv, clock, in_guard, totals["end"])
            if len(drv.released) != size:
                raise SystemExit(f"bench_guard: the wave of {size} released {len(drv.released)} requests")
            for phase, (guard, spent) in totals.items():
                _keep_fastest(cells[phase], label, spent, guard)
    runtime.reset()
    runtime.paused = True
    return [(size, phase, cells[phase]) for phase in ("ramp", "end")]


EVICT_LEAF = 32  # prompt tokens of each short request the tree keeps (distinct first tokens: leaves of the root)


def _evict_rows(args: argparse.Namespace, clock: Callable[[], float], gf: Any, h: Any) -> list[Any]:
    """`--evict`: per count N, N short requests served (their KV kept in the radix tree as N leaves), then 8 requests
    decoding, then one prompt as long as the pool's free slots and most of the tree: its prefill's alloc evicts the
    leaves, one allocator free per evicted leaf (the context trace's shape: long prompts after short waves, 2026-12-07
    H100 call PA). Kind "evict": the prefill's iteration, its in-guard time (`assert in`), the iteration guarded and
    not, and (assert runs) the allocator frees it made and the guard's by-value scans (`SlotValueCheck.checked`)."""
    import random

    from shim.switch.config import SwitchConfig
    from statemodel.designs import RETRACT_CATCH_UP

    runtime = gf.install_guard_plugin()
    in_guard, _ = _time_guard_runs(runtime, clock)
    model_dir = h.write_tiny_model_config(max_position_embeddings=32768)  # the long prompt's context
    ol = importlib.import_module("overlap_loop")
    rows = []
    for leaves in args.evict:
        cell: dict[str, float] = {}
        for _ in range(args.repeat):
            for label in ("unguarded", "assert"):
                _arm(runtime, label, RETRACT_CATCH_UP.name)
                sa = h.make_server_args(model_dir, speculative_algorithm="EAGLE", num_steps=3, topk=1,
                                        num_draft_tokens=4, max_running_requests=64)
                pools = h.build_pools(sa, kv_size=leaves * (EVICT_LEAF + 4) + 4096, max_reqs=65, radix_cache=True,
                                      overlap_schedule=True)
                # speculation stays on: the switch's plain steps are not what this measures
                drv = ol.OverlapDriver(pools, RETRACT_CATCH_UP, switch_config=SwitchConfig(t_off=1 << 20, t_on=0))
                rng = random.Random(leaves)
                for start in range(0, leaves, 32):
                    drv.add([h.make_req(f"leaf{i}", [1 + i % 998, *rng.choices(range(1, 999), k=EVICT_LEAF - 1)],
                                        max_new_tokens=2) for i in range(start, min(leaves, start + 32))])
                    drv.run_until_idle(100)
                drv.add([h.make_req(f"bg{j}", [rng.randrange(1, 999) for _ in range(200)], max_new_tokens=1 << 12)
                         for j in range(8)])
                for _ in range(5):
                    drv.iteration()
                tree = pools.tree_cache
                kept = int(tree.evictable_size())
                if kept < leaves * EVICT_LEAF:
                    raise SystemExit(f"bench_guard: the tree kept {kept} slots of {leaves} leaves")
                frees = _count_frees(pools.allocator)
                scans = runtime.guard.slot_values.checked if runtime.guard is not None else 0
                drv.add([h.make_req("long", [rng.randrange(1, 999) for _ in range(pools.available_size() + kept - 300)],
                                    max_new_tokens=4)])
                in_guard[0] = 0.0
                started = clock()
                drv.iteration()
                _keep_fastest(cell, label, clock() - started, in_guard[0])
                if int(tree.evictable_size()) > kept // 2:
                    raise SystemExit(f"bench_guard: the long prefill evicted {kept - int(tree.evictable_size())} of "
                                     f"{kept} slots")
                if label == "assert":
                    cell["frees"] = frees[0]
                    cell["scans"] = runtime.guard.slot_values.checked - scans
        rows.append((leaves, "evict", cell))
    runtime.reset()
    runtime.paused = True
    return rows


def _count_frees(allocator: Any) -> list[int]:
    """A one-item list that counts `allocator.free` calls from now on (through the hooked method)."""
    frees = [0]
    hooked_free = allocator.free

    def counted_free(index: Any, *a: Any, **k: Any) -> Any:
        frees[0] += 1
        return hooked_free(index, *a, **k)

    allocator.free = counted_free
    return frees


# --history: the context trace's shape (2026-12-07 H200 call 5: prompts of 2,000-3,500 tokens, --max-total-tokens 40000)
HISTORY_POOL = 40_000
HISTORY_ROWS = 257  # --max-running-requests 256: SGLang hands rows out in turn, so a history passes through all of them
HISTORY_WAVE = 8
HISTORY_STEPS = 48  # measured steps of the two short requests (128 output tokens, 2 per step: about 60 in all)


def history_rows(args: argparse.Namespace) -> None:
    """`--history`: each count in a fresh process (a process's collector and heap start alike), `--repeat` times, the
    fastest in-guard time per step kept; one row per count."""
    rows = []
    for count in args.history:
        best: dict[str, Any] | None = None
        for _ in range(args.repeat):
            out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--history-one", str(count),
                                  "--clock", args.clock], capture_output=True, text=True, check=False)
            if out.returncode != 0:
                raise SystemExit(f"bench_guard: the history run of {count} failed: "
                                 f"{out.stderr.strip().splitlines()[-1:]}")
            cell = json.loads(out.stdout.strip().splitlines()[-1])
            if best is None or cell["in-guard min"] < best["in-guard min"]:
                best = cell
        rows.append((count, best))
    if args.json:
        print(json.dumps(rows))
        return
    print(f"steady speculative steps at 2 requests after N long-prompt requests (overlap loop, retract switch, radix "
          f"cache, {HISTORY_POOL}-slot pool), assert mode, {args.clock} clock, {HISTORY_STEPS} steps, fastest of "
          f"{args.repeat} processes (microseconds per step)")
    print(f"{'history':>7} {'in-guard min':>12} {'median':>7} {'step median':>11} {'gc (gen 0/1/2)':>14} "
          f"{'full gc ms':>10}  guard's records (requests alive: SGLang Reqs not frozen, after the steps)")
    for count, c in rows:
        assert c is not None
        gcs = "/".join(str(n) for n in c["gc"])
        print(f"{count:>7} {c['in-guard min']:>12.0f} {c['in-guard median']:>7.0f} {c['step median']:>11.0f} "
              f"{gcs:>14} {c['full gc ms']:>10.2f}  {c['records']}")


def _history_cell(args: argparse.Namespace, count: int, gf: Any, h: Any) -> dict[str, Any]:
    """One `--history` count in this process: the history, then the measured steps (module docstring)."""
    import gc
    import random

    from shim.switch.config import SwitchConfig
    from statemodel.designs import RETRACT_CATCH_UP

    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    runtime = gf.install_guard_plugin()
    in_guard, _ = _time_guard_runs(runtime, clock)
    model_dir = h.write_tiny_model_config(max_position_embeddings=4096)  # the long prompts' context
    _arm(runtime, "assert", RETRACT_CATCH_UP.name)
    ol = importlib.import_module("overlap_loop")
    sa = h.make_server_args(model_dir, speculative_algorithm="EAGLE", num_steps=3, topk=1, num_draft_tokens=4,
                            max_running_requests=HISTORY_ROWS - 1)
    pools = h.build_pools(sa, kv_size=HISTORY_POOL, max_reqs=HISTORY_ROWS, radix_cache=True, overlap_schedule=True)
    _rows_in_turn_cpu_stand_in(pools.req_to_token_pool)
    drv = ol.OverlapDriver(pools, RETRACT_CATCH_UP, switch_config=SwitchConfig(t_off=4, t_on=2))
    rng = random.Random(count)
    systems = [[rng.randrange(1, 999) for _ in range(600)] for _ in range(4)]
    drv.add([h.make_req("warm", [5] * 32, max_new_tokens=8)])
    drv.run_until_idle(400)
    gc.collect()
    gc.freeze()  # as the GPU runs' /freeze_gc after their warm-up
    served = 0
    while served < count:
        wave = []
        # waves of 8 (speculation off from 4) and of 2 (on): the trace's phases, and the switch's flips between them
        for _ in range(min(HISTORY_WAVE if (served // 16) % 2 == 0 else 2, count - served)):
            prompt = systems[served % 4] + [rng.randrange(1, 999) for _ in range(rng.randrange(1400, 2900))]
            wave.append(h.make_req(f"ctx{served}", prompt, max_new_tokens=16))
            served += 1
        drv.add(wave)
        drv.run_until_idle(400)
        del wave  # the bench holds no request (the count of those alive below)
    drv.add([h.make_req(f"quiet{i}", [rng.randrange(1, 999) for _ in range(32)], max_new_tokens=128)
             for i in range(2)])
    for _ in range(6):  # the prefill, the merge, the first decode steps
        drv.iteration()
    collections = [0, 0, 0]

    def count_collections(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop":
            collections[min(2, int(info["generation"]))] += 1

    gc.callbacks.append(count_collections)
    guard, steps = [], []
    try:
        for _ in range(HISTORY_STEPS):
            in_guard[0] = 0.0
            started = clock()
            drv.iteration()
            steps.append((clock() - started) * 1e6)
            guard.append(in_guard[0] * 1e6)
            if drv.launched[-1][1] != "spec":
                raise SystemExit("bench_guard: a measured step of the history run was not speculative")
    finally:
        gc.callbacks.remove(count_collections)
    from sglang.srt.managers.schedule_batch import Req

    alive = sum(1 for o in gc.get_objects() if type(o) is Req)  # not frozen: the warm-up's are not counted
    started = time.perf_counter()
    gc.collect()  # a full collection walks every tracked object not frozen
    full_ms = (time.perf_counter() - started) * 1e3
    g = runtime.guard
    records = {"requests alive": alive, "names": len(g.names), "outputs_seen": len(g.outputs_seen),
               "tree record": len(g.tree_record.without_draft), "tree prefixes": len(g._tree_prefix),
               "live rows": len(runtime.adapter._live_reqs), "flips": len(drv.flips)}
    guard.sort()
    steps.sort()
    return {"in-guard min": guard[0], "in-guard median": guard[len(guard) // 2], "step median": steps[len(steps) // 2],
            "gc": collections, "full gc ms": full_ms, "records": records}


def _rows_in_turn_cpu_stand_in(req_to_token_pool: Any) -> None:
    """The GPU line's row order on 0.5.23's ReqToTokenPool: SGLang 0.5.12-0.5.16's `ReqToTokenPool.alloc` hands rows
    out from the front of `free_slots` (`free_slots[:need_size]`, a freed row appended at the end), so a server's
    requests pass through every row in turn; 0.5.23's `alloc_rows` takes the last freed (`free_slots[-need_size:]`),
    so a CPU history reuses a few. The same generation bump and callback as 0.5.23's, the rows from the front."""
    pool = req_to_token_pool

    def alloc_rows(need_size: int) -> list[int] | None:
        if need_size > len(pool.free_slots):
            return None
        select_index = pool.free_slots[:need_size]
        del pool.free_slots[:need_size]
        pool.req_generation[select_index] += 1
        if pool._on_alloc_rows is not None:
            pool._on_alloc_rows(select_index)
        return select_index

    pool.alloc_rows = alloc_rows


def _keep_fastest(cell: dict[str, float], label: str, spent: float, in_guard: float) -> None:
    """A cell keeps the fastest of its repeats, in microseconds: the whole time under `label`, and for an assert run
    the in-guard time too (`assert in`)."""
    cell[label] = min(cell.get(label, spent * 1e6), spent * 1e6)
    if label == "assert":
        cell["assert in"] = min(cell.get("assert in", in_guard * 1e6), in_guard * 1e6)


def _timed_iteration(drv: Any, clock: Callable[[], float], in_guard: list[float], total: list[float]) -> None:
    """One loop iteration, its in-guard time and its whole time added to `total` ([in-guard, time])."""
    in_guard[0] = 0.0
    started = clock()
    drv.iteration()
    total[1] += clock() - started
    total[0] += in_guard[0]


def _time_guard_runs(runtime: Any, clock: Callable[[], float]) -> tuple[list[float], dict[str, float]]:
    """Wrap `runtime.run` (every guard step goes through it) so that its time adds up in the returned one-item
    list, and per hook in the returned dict (the adapter method the step came from), which the caller empties before
    the steps it measures."""
    in_guard = [0.0]
    by_hook: dict[str, float] = {}
    run = runtime.run

    def timed_run(fn: Any, *a: Any, **k: Any) -> None:
        started = clock()
        try:
            run(fn, *a, **k)
        finally:
            spent = clock() - started
            in_guard[0] += spent
            # a hook's step is a closure handed to _call_with_guard: "V2Adapter.after_prepare_for_decode.<locals>.step"
            name = getattr(a[0] if a and callable(a[0]) else fn, "__qualname__", "?").split(".<locals>")[0]
            by_hook[name] = by_hook.get(name, 0.0) + spent

    runtime.run = timed_run  # type: ignore[method-assign]
    return in_guard, by_hook


def _v1_rows(args: argparse.Namespace, sizes: list[int], clock: Callable[[], float]) -> list[Any]:
    """The v1 line (sglang 0.5.12, v1 EAGLEWorker, non-overlap loop, the v1 switch in draft mode retract): the
    in-guard time per iteration, assert mode."""
    os.environ.setdefault("SGLANG_ENABLE_SPEC_V2", "0")
    h = importlib.import_module("sglang12_cpu")
    import sglang.srt.plugins as plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    import shim.guard.runtime
    import shim.switch.v1 as sw
    from shim.switch.config import SwitchConfig

    h.install_gpu_stand_ins()
    h.install_scheduler_loop_stand_in()
    sw.install_switch(HookRegistry, SwitchConfig(t_off=1, t_on=0, draft_while_off="retract"))
    os.environ["SPECFLIP_MODE"] = "assert"
    plugins.load_plugins()
    runtime = shim.guard.runtime.current()
    assert runtime is not None and runtime.adapter.release == "0.5.12", "run --line v1 with .venv12"
    in_guard, _ = _time_guard_runs(runtime, clock)
    model_dir = h.write_tiny_model_config()
    rows = []
    for size in sizes:
        for kind in ("spec", "plain"):
            best = float("inf")
            for _ in range(args.repeat):
                runtime.reset()
                runtime.paused = False
                srv = h.V1LoopServer(h.build_pools(h.make_server_args(model_dir), kv_size=size * (args.steps * 8 + 64)
                                                   + 64, max_reqs=size + 8))
                # spec: a threshold above the batch keeps speculation on; plain: flipped off at the first iteration
                t_off, t_on = (size + 1, size) if kind == "spec" else (1, 0)
                rt = sw.set_runtime(SwitchConfig(t_off=t_off, t_on=t_on, spec_cap=max(48, size + 1),
                                                 draft_while_off="retract"))
                if kind == "plain":
                    rt.plain_runner = h.CudaGraphRunnerCpuStandIn(num_tokens_per_bs=1)
                srv.add(h.make_reqs("b", size, max_new_tokens=args.steps * 4 + 16))
                for _ in range(3):  # the prefill, the merge, the first decode steps
                    srv.iteration()
                in_guard[0] = 0.0
                for _ in range(args.steps):
                    srv.iteration()
                assert srv.kinds[-1] == kind, srv.kinds[-3:]
                best = min(best, in_guard[0] / args.steps * 1e6)
            rows.append((size, kind, {"assert in": best}))
    runtime.reset()
    runtime.paused = True
    return rows


def against(args: argparse.Namespace) -> None:
    """Side by side: REF's guard (git archive into a temporary folder) and this checkout's, alternating rounds."""
    base = Path(tempfile.mkdtemp(prefix="specflip-bench-base-"))
    archive = subprocess.run(["git", "-C", str(HERE), "archive", args.against], capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"bench_guard: git archive {args.against}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
    common = [sys.executable, str(Path(__file__).resolve()), "--json", "--assert-only", "--steps", str(args.steps),
              "--sizes", ",".join(map(str, args.sizes)), "--repeat", str(args.repeat), "--loop", args.loop,
              "--draft", args.draft, "--clock", args.clock, "--line", args.line] + (["--waves"] if args.waves else []) \
        + (["--ramp", ",".join(map(str, args.ramp))] if args.ramp else []) \
        + (["--evict", ",".join(map(str, args.evict))] if args.evict else [])
    best: dict[tuple[str, int, str], float] = {}
    loads = []
    try:
        for _ in range(args.rounds):
            for side, tree in (("base", base), ("branch", HERE)):
                loads.append(os.getloadavg()[0])
                out = subprocess.run([*common, "--tree", str(tree)], capture_output=True, text=True, check=False)
                if out.returncode != 0:
                    raise SystemExit(f"bench_guard: the {side} run failed: {out.stderr.strip().splitlines()[-1:]}")
                for size, kind, cells in json.loads(out.stdout.strip().splitlines()[-1]):
                    key = (side, size, kind)
                    best[key] = min(best.get(key, cells["assert in"]), cells["assert in"])
    finally:
        shutil.rmtree(base)  # the export this run made
    loop = "v1 non-overlap" if args.line == "v1" else "overlap" if args.waves or args.ramp or args.evict else args.loop
    what = ("per request of a wave (arrive, finish)" if args.waves
            else f"of a wave's ramp ({','.join(map(str, args.ramp))}) and end" if args.ramp
            else "of a long prefill evicting N leaves (batch: N)" if args.evict else "per decode step")
    print(f"in-guard time {what}, assert mode, {loop} loop, {args.clock} clock, {args.steps} steps, "
          f"fastest of {args.rounds} alternating rounds x {args.repeat} (microseconds); {args.against} -> this "
          f"checkout; 1-minute load average {min(loads):.1f}-{max(loads):.1f}")
    print(f"{'batch':>5} {'step':>6} {args.against:>10} {'branch':>10} {'ratio':>6}")
    kinds = ("arrive", "finish") if args.waves else ("ramp", "end") if args.ramp else ("evict",) if args.evict \
        else ("spec", "plain")
    for size in [sum(args.ramp)] if args.ramp else args.evict if args.evict else args.sizes:
        for kind in kinds:
            old, new = best[("base", size, kind)], best[("branch", size, kind)]
            print(f"{size:>5} {kind:>6} {old:>10.1f} {new:>10.1f} {new / old:>6.2f}")


if __name__ == "__main__":
    main()
