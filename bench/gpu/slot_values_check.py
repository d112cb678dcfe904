"""The guard's slot-value check (shim/guard/slot_values.py) on one device, without SGLang: its cost per call, old
against new, that the new path makes no host-device sync, and that its device assert stops the device before the
work queued after it and the guard still names the fault.

    python3 bench/gpu/slot_values_check.py            # on the GPU host, from the repo root (about a minute)
    python3 bench/gpu/slot_values_check.py --device cpu --iters 200   # the same code on a CPU (no sync count)

1. Cost per call (`--iters` calls each, after `--warmup`): host microseconds (perf_counter around the calls, nothing
   synchronised inside) and device microseconds (torch.cuda.Event around them, then one synchronize), for
   * alloc: an alloc of `--alloc` slots checked against the in-use bitmap: `old` (code 4ff5577: `in_use[slots] = True`,
     then the late answer: clone, pinned copy, event), `late` and `stop` (this code: index_fill_, then the late answer,
     or the int64 answer's pinned copy and `torch._assert_async`);
   * free: the free of a copy of a live row's values, scanned against `--rows` live rows of `--longest` positions:
     `old` (4ff5577: `torch.isin` over the gathered block, then the late answer), `late`, `stop` (the bitmap scan);
   * release: the in-use bitmap cleared at a free: `old` (`in_use[slots] = False`), `new` (index_fill_).
   Every late/stop call is followed by `judge_due` (the next allocator hook reads answers that have arrived) as the
   adapter does.
2. Host syncs (CUDA only): `torch.cuda.set_sync_debug_mode("warn")` around `--iters` calls of each variant, warnings
   counted; then mode "error" around the new variants (any sync raises). Expected: new 0; old free > 0 (isin).
3. The device assert, in a subprocess per case (the CUDA context does not survive a device-side assert): `fault` frees
   a copy of a live row's slots in stop mode, queues the "next forward" (a kernel whose result is copied into pinned
   host memory), then meets the CUDA error at a synchronize and calls `Guard.report_stopped` (what the adapter's hook
   around `Scheduler.run_event_loop` calls). Expected: the process exits 1 with the line `specflip: slots_freed_owned
   broken by free (the device stopped at this check) ...` on stderr, and the "next forward" did not run (its pinned
   flag still 0). `clean` frees slots nobody holds: no error, the flag 1.
Prints one line per figure and `RESULT ok` / `RESULT FAILED (...)` last; exits 0 / 1.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))


def _attrs_on_path() -> None:
    """statemodel needs attrs; where the host's python lacks it, take it from the SGLang bundle (.whl/site.tar.xz)."""
    try:
        import attrs  # noqa: F401
    except ImportError:
        bundle = REPO / ".whl" / "site.tar.xz"
        target = Path("/tmp/slot_values_check_site")
        if not (target / "attrs").is_dir():
            if not bundle.is_file():
                raise SystemExit("slot_values_check: needs the attrs package (or .whl/site.tar.xz carried)") from None
            with tarfile.open(bundle) as tar:
                tar.extractall(target, members=[m for m in tar if m.name.split("/")[0] in ("attr", "attrs")],
                               filter="data")
        sys.path.insert(0, str(target))


_attrs_on_path()

import torch  # noqa: E402

from shim.guard.slot_values import ALLOC, FREE, LiveRow, SlotValueCheck  # noqa: E402


class AllocatorStandIn:
    """What SlotValueCheck.track reads of a TokenToKVPoolAllocator (its device and size): no SGLang here."""

    def __init__(self, device: str, size: int) -> None:
        self.device = device
        self.size = size


def setup(device: str, pool: int, rows: int, longest: int) -> tuple[Any, list[LiveRow]]:
    """A req_to_token of `rows` live rows, each `longest` distinct slots of a pool of `pool` slots; the top 64 slots
    are held by none."""
    assert rows * longest < pool - 64, "the pool holds every live row"
    req_to_token = torch.zeros(rows + 4, longest + 64, dtype=torch.int32, device=device)
    slots = torch.randperm(pool - 64, device=device)[: rows * longest].to(torch.int32) + 1
    req_to_token[:rows, :longest] = slots.view(rows, longest)
    live = [LiveRow(row=i, lo=0, hi=longest, rid=i) for i in range(rows)]
    return req_to_token, live


# --- code 4ff5577's device path, for the comparison (its SlotValueCheck in late mode, the parts a call runs) --------

def old_alloc(in_use: Any, slots: Any, pending: list[Any]) -> None:
    hit = in_use[slots]
    in_use[slots] = True
    taken = slots.clone()
    _old_answer(hit.any(), pending, taken)


def old_free(slots: Any, req_to_token: Any, rows: list[LiveRow], pending: list[Any]) -> None:
    device = req_to_token.device
    longest = max(r.hi for r in rows)
    on_dev = device.type != "cpu"
    index = torch.tensor([r.row for r in rows], pin_memory=on_dev).to(device, non_blocking=True)
    bounds = torch.tensor([(r.lo, r.hi) for r in rows], pin_memory=on_dev).to(device, non_blocking=True)
    block = req_to_token[index, :longest]
    at = torch.arange(longest, device=device)
    hit = torch.isin(block, slots.to(block.dtype)) & (at >= bounds[:, :1]) & (at < bounds[:, 1:])
    _old_answer(hit.any(), pending, block)


def old_release(in_use: Any, slots: Any) -> None:
    in_use[slots] = False


def _old_answer(any_hit: Any, pending: list[Any], keep: Any) -> None:
    on_dev = any_hit.device.type != "cpu"
    answer = torch.empty((), dtype=torch.bool, pin_memory=on_dev)
    answer.copy_(any_hit, non_blocking=on_dev)
    event = None
    if on_dev:
        event = torch.cuda.Event()
        event.record()
    pending.append((answer, event, keep))
    pending[:] = [p for p in pending if p[1] is not None and not p[1].query()]  # judge_due: drop what arrived


# --- timing -----------------------------------------------------------------------------------------------------

def timed(device: str, fn: Callable[[], None], iters: int, warmup: int) -> tuple[float, float]:
    """(host us, device us) per call."""
    for _ in range(warmup):
        fn()
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host = (time.perf_counter() - t0) / iters * 1e6
    dev = float("nan")
    if cuda:
        end.record()
        torch.cuda.synchronize()
        dev = start.elapsed_time(end) * 1e3 / iters
    return host, dev


def variants(device: str, pool: int, rows: int, longest: int, alloc: int) -> dict[str, Callable[[], None]]:
    """Each variant as a call that leaves the state as it found it (an alloc's slots released again)."""
    req_to_token, live = setup(device, pool, rows, longest)
    allocator = AllocatorStandIn(device, pool)
    assert alloc <= 64
    free_slots = torch.arange(pool - alloc + 1, pool + 1, device=device)  # slots no live row holds (`setup`)
    nobody = free_slots[:alloc].clone()  # a clean free of a copy: no live row holds these
    old_in_use = torch.zeros(pool + 2, dtype=torch.bool, device=device)
    old_pending: list[Any] = []
    checks = {}
    for mode in ("late", "stop"):
        check = SlotValueCheck("assert" if mode == "stop" else "late", stop=True)
        check.track(allocator)
        assert check.path == mode, (check.path, mode)
        checks[mode] = check

    def new_alloc(check: SlotValueCheck) -> Callable[[], None]:
        def call() -> None:
            check.judge_due()
            check.allocated(free_slots, lambda: live, req_to_token, ALLOC)
            check.released(free_slots)
        return call

    def new_free(check: SlotValueCheck) -> Callable[[], None]:
        def call() -> None:
            check.judge_due()
            check.check(nobody, req_to_token, live, FREE, FREE)
        return call

    def old_alloc_call() -> None:
        old_alloc(old_in_use, free_slots, old_pending)
        old_release(old_in_use, free_slots)

    calls = {
        "alloc old": old_alloc_call,
        "alloc late": new_alloc(checks["late"]),
        "alloc stop": new_alloc(checks["stop"]),
        "free old": lambda: old_free(nobody, req_to_token, live, old_pending),
        "free late": new_free(checks["late"]),
        "free stop": new_free(checks["stop"]),
        "release old": lambda: old_release(old_in_use, free_slots),
        "release new": lambda: checks["late"].released(free_slots),
    }
    return calls


def count_syncs(fn: Callable[[], None], iters: int) -> int:
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(iters):
                fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def no_sync(fn: Callable[[], None], iters: int) -> str | None:
    """None, or the error torch raised at a synchronizing call in sync debug mode "error"."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(iters):
            fn()
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return None


# --- the device assert, in a child process ---------------------------------------------------------------------

def child(case: str, device: str) -> int:
    """Run one assert case (see the module docstring); the parent reads stdout/stderr and the exit code."""
    import logging

    from shim.guard.core import Guard, GuardConfig, Mode, SpecFlipViolation
    from statemodel.design import Scope
    from statemodel.designs import CATCH_UP

    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    on_dev = device.startswith("cuda")
    # auto: what a GPU server in assert mode runs (stop); on a CPU auto judges at the hook, so assert takes stop there
    guard = Guard(GuardConfig(mode=Mode.ASSERT, design=CATCH_UP, scope=Scope(),
                              slot_values="auto" if on_dev else "assert"))
    req_to_token, live = setup(device, 4096, 4, 64)
    check = guard.slot_values
    check.track(AllocatorStandIn(device, 4096))
    print(f"path {check.path}", flush=True)
    freed = (req_to_token[2, 10:14].clone() if case == "fault"
             else torch.arange(4000, 4004, device=device)).to(torch.int64)
    flag = torch.zeros((), dtype=torch.int32, pin_memory=on_dev)
    try:
        check.check(freed, req_to_token, live, FREE, FREE)  # the free of a copy (stop: answer copied, then assert)
        nxt = torch.ones(1024, device=device).cumsum(0)  # "the next forward", queued after the assert
        flag.copy_((nxt[-1] == 1024).to(torch.int32), non_blocking=on_dev)
        if on_dev:
            torch.cuda.synchronize()  # where the process meets the device's error (SGLang: its next CUDA call)
        print(f"no error; next forward ran: {int(flag)}", flush=True)
        return 0
    except Exception as exc:  # noqa: BLE001 - the CUDA error (or, on a CPU, the assert's RuntimeError)
        print(f"error met: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
        print(f"next forward ran: {int(flag)}", flush=True)  # host memory: readable after the fault
        try:
            guard.report_stopped(exc)
        except SpecFlipViolation as finding:
            print(f"finding raised: {finding.invariant} at {finding.action}", flush=True)
            return 1
        print("no finding", flush=True)
        return 2


def run_child(case: str, device: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, __file__, "--child", case, "--device", device], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc.returncode, proc.stdout + proc.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--pool", type=int, default=400_000, help="KV slots in the pool (an 8B server: ~400k)")
    parser.add_argument("--rows", type=int, default=8, help="live rows scanned by a free of a copy")
    parser.add_argument("--longest", type=int, default=3000, help="positions of the longest live row")
    parser.add_argument("--alloc", type=int, default=8, help="slots per alloc (a decode step: one per request)")
    parser.add_argument("--child", choices=("fault", "clean"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.device)
    problems: list[str] = []
    cuda = args.device.startswith("cuda")
    print(f"device {torch.cuda.get_device_name() if cuda else 'cpu'}, torch {torch.__version__}, pool {args.pool}, "
          f"rows {args.rows} x {args.longest}, alloc {args.alloc}, iters {args.iters}")
    calls = variants(args.device, args.pool, args.rows, args.longest, args.alloc)
    for name, fn in calls.items():
        host, dev = timed(args.device, fn, args.iters, args.warmup)
        print(f"cost {name:12s} host {host:8.1f} us/call  device {dev:8.1f} us/call")
    if cuda:
        for name, fn in calls.items():
            print(f"syncs {name:12s} {count_syncs(fn, args.iters)} in {args.iters} calls (sync debug mode warn)")
        for name, fn in calls.items():
            if name.endswith("old"):
                continue
            error = no_sync(fn, args.iters)
            print(f"sync-free {name:12s} {'yes' if error is None else 'NO: ' + error} (sync debug mode error)")
            if error is not None:
                problems.append(f"{name} synced")
    else:
        print("syncs: not counted (no CUDA: torch's sync debug mode is CUDA's)")
    for case in ("fault", "clean"):
        rc, out = run_child(case, args.device)
        print(f"--- assert case {case}: exit {rc}")
        sys.stdout.write(io.StringIO(out).read())
        line = next((ln for ln in out.splitlines() if "specflip: slots_freed_owned broken by free" in ln), None)
        if case == "fault":
            if rc == 0 or line is None or "the device stopped at this check" not in line:
                problems.append("fault: no finding line")
            if cuda and "next forward ran: 0" not in out:
                problems.append("fault: the work queued after the assert ran")
        elif rc != 0 or line is not None or (cuda and "next forward ran: 1" not in out):
            problems.append("clean: an error or a finding")
    print("RESULT ok" if not problems else f"RESULT FAILED ({'; '.join(problems)})")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
