"""SPECFLIP_GUARD_CLOCK=1: what the guard's own steps cost on a live server, per hook, in the scheduler thread.

The CPU benchmark (bench/bench_guard.py) times the guard on real SGLang objects on this machine; a server's
throughput loss with the guard on is a second, indirect figure. This clock is the figure in between: the thread
CPU time and the wall time inside every guard step of the running server, by hook, logged every `log_every_s`
seconds of wall time as one line, with the share of the thread's own CPU time those steps took in the window. The
per-hook times are the figure to read: on a GPU server the scheduler thread spins in CUDA synchronisation while it
waits, so its CPU time follows its wall time and the share overstates the throughput cost. A loss well above what
the per-hook times add to an iteration points outside the guard's steps (a synchronisation: SPECFLIP_COUNT_SYNCS, or
the hooks' wrappers). Measurement only: two clock reads per guard step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from shim.settings import settings

logger = logging.getLogger("specflip.guard")

ENV_GUARD_CLOCK = settings.GUARD_CLOCK.name  # declared in shim/settings.py


def hook_name(fn: Callable[..., Any], args: tuple[Any, ...]) -> str:
    """The hook a guard step `fn(*args)` belongs to: the adapters run `step(guard)` closures through one method
    (`_call_with_guard(step)`), so the closure's qualified name (`...on_prepare_for_decode.<locals>.step`) names it;
    any other step is named by `fn`."""
    target = args[0] if args and callable(args[0]) else fn
    name = getattr(target, "__qualname__", None) or repr(target)
    return name.replace(".<locals>", "")


class GuardClock:
    """Thread CPU and wall time inside each guard step, summed per hook over a window of `log_every_s` seconds."""

    def __init__(self, log_every_s: float = 30.0, *, cpu_ns: Callable[[], int] = time.thread_time_ns,
                 wall_ns: Callable[[], int] = time.perf_counter_ns, log: Callable[[str], None] | None = None) -> None:
        self._cpu_ns, self._wall_ns = cpu_ns, wall_ns
        self._log = log or (lambda line: logger.info("%s", line))
        self.log_every_ns = int(log_every_s * 1e9)
        self.windows = 0
        self.window_cpu0: int | None = None  # the first window starts at the first guard step, in the thread that
        self.window_wall0 = 0                # runs the steps (thread CPU time is per thread)
        self.by_hook: dict[str, list[int]] = {}  # hook -> [steps, cpu ns, wall ns], this window

    def _start_window(self, cpu: int, wall: int) -> None:
        self.window_cpu0, self.window_wall0 = cpu, wall
        self.by_hook = {}

    def run(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """`fn(*args, **kwargs)`, its thread CPU and wall time added to hook `name`."""
        cpu0, wall0 = self._cpu_ns(), self._wall_ns()
        if self.window_cpu0 is None:
            self._start_window(cpu0, wall0)
        try:
            fn(*args, **kwargs)
        finally:
            cpu1, wall1 = self._cpu_ns(), self._wall_ns()
            entry = self.by_hook.get(name)
            if entry is None:
                entry = self.by_hook[name] = [0, 0, 0]
            entry[0] += 1
            entry[1] += cpu1 - cpu0
            entry[2] += wall1 - wall0
            if wall1 - self.window_wall0 >= self.log_every_ns:
                self.flush(cpu1, wall1)

    def summary(self, cpu: int, wall: int) -> str:
        """One line for the window that ends at (`cpu`, `wall`): totals, the share of the thread's CPU time, and the
        hooks by CPU time."""
        guard_cpu = sum(e[1] for e in self.by_hook.values())
        guard_wall = sum(e[2] for e in self.by_hook.values())
        steps = sum(e[0] for e in self.by_hook.values())
        thread_cpu = max(cpu - (self.window_cpu0 or cpu), 1)
        hooks = ", ".join(f"{name} {n} x {c / n / 1e3:.1f} us cpu / {w / n / 1e3:.1f} us wall"
                          for name, (n, c, w) in sorted(self.by_hook.items(), key=lambda kv: -kv[1][1]))
        return (f"specflip guard clock: {(wall - self.window_wall0) / 1e9:.1f} s wall, scheduler thread CPU "
                f"{thread_cpu / 1e9:.3f} s, guard steps {steps}: {guard_cpu / 1e9:.3f} s CPU "
                f"({100 * guard_cpu / thread_cpu:.1f} % of the thread's), {guard_wall / 1e9:.3f} s wall; "
                f"by hook: {hooks or 'none'}")

    def flush(self, cpu: int | None = None, wall: int | None = None) -> None:
        """Log the window's line (if it saw a guard step) and start the next window."""
        cpu = self._cpu_ns() if cpu is None else cpu
        wall = self._wall_ns() if wall is None else wall
        if self.by_hook:
            self._log(self.summary(cpu, wall))
            self.windows += 1
        self._start_window(cpu, wall)
