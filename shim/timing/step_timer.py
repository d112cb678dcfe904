"""A per-step timer for any SGLang server (plain, speculative, with or without specflip's switch), as a plugin hook.

Issue 5's open question is where the switch's plain path loses 12-29 % against a plain server
(docs/archive/gpu-results.md, "2026-11-29, 51b4fd4"): GPU time per step, or host time between steps. The switch's own
trace times its steps; a plain server had nothing to compare with. This hook records, for decode batches:

* `host_ms`: the time from the previous `Scheduler.run_batch` entry to this one, i.e. one loop iteration
  (a host-bound loop's step time), for every decode step that follows a decode step;
* a CUDA event pair around `run_batch` on the forward stream (`timing` events, read back only once complete,
  so no host sync), for every Nth decode step and the first after each run of prefills (marked `after_prefill`,
  with `idle_ms`, the loop's wait before that run: on a server that had emptied, an idle spell).

and for every prefill a `prefill` line (batch size, `run_batch`'s host time, the time since the previous
`run_batch` and since the request reached the scheduler, hooked on `Scheduler.handle_generate_request`), then a
`first_decode` line for the decode step after it: what each admitted request costs the loop, where a plain and a
switch server could differ at low concurrency when no decode step shows it.

Enable with `SPECFLIP_STEP_TIMER=<dir>` (one `steps-<pid>.jsonl` per process; `bench/gpu/summarize.py` reads
them) and optionally `SPECFLIP_STEP_TIMER_EVERY=N` (default 16: one line per N decode steps).

A profile window says where the host time goes: with `SPECFLIP_STEP_PROFILE=<flag file>`, the first time the flag
file exists (looked for every 32nd decode step), the scheduler thread runs under cProfile for the next
`SPECFLIP_STEP_PROFILE_STEPS` decode steps (default 800), every loop iteration's work included; then
`profile-<pid>.pstats` and a `profile` line (steps, wall ms per step) are written beside the step lines.
`bench/gpu/profile_diff.py` compares two servers' profiles per decode step.

The time the scheduler process spends in Python's garbage collector (gc.callbacks) is reported too: a `gc` line
every GC_REPORT_STEPS decode steps with the collections and milliseconds so far per generation (a full collection
walks every tracked object, and a speculative server holds more of them than a plain one).
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shim.releases import ReleaseLine, UnsupportedRelease
from shim.releases.registry import installed_line
from shim.settings import SettingError, settings
from shim.timing.jsonl import JsonlTrace

# the timer's settings, declared in shim/settings.py
ENV_DIR = settings.STEP_TIMER.name
ENV_EVERY = settings.STEP_TIMER_EVERY.name
# the hook targets, as the release line names them (shim/releases/); these where no line describes the release
T_RUN_BATCH, T_ARRIVAL = ReleaseLine.step_timer_targets
ENV_PROFILE = settings.STEP_PROFILE.name
ENV_PROFILE_STEPS = settings.STEP_PROFILE_STEPS.name
PROFILE_POLL_STEPS = 32  # how often (decode steps) the flag file is looked for: a stat() is not free
GC_REPORT_STEPS = 2048


class GcClock:
    """Collections and time spent in Python's garbage collector, by generation; install as a gc.callbacks entry."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.collections = [0, 0, 0]
        self.ms = [0.0, 0.0, 0.0]
        self.max_ms = [0.0, 0.0, 0.0]

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        if self.started is None:
            return
        ms = (time.perf_counter() - self.started) * 1e3
        self.started = None
        generation = min(2, int(info.get("generation", 0)))
        self.collections[generation] += 1
        self.ms[generation] += ms
        self.max_ms[generation] = max(self.max_ms[generation], ms)

    def snapshot(self) -> dict[str, list[Any]]:
        return {"gc_collections": list(self.collections), "gc_ms": [round(x, 3) for x in self.ms],
                "gc_max_ms": [round(x, 3) for x in self.max_ms]}


class StepTimerConfigError(ValueError):
    """A bad SPECFLIP_STEP_TIMER* setting; the message is one line."""


@dataclass(frozen=True)
class StepTimerConfig:
    trace_dir: str
    every: int = 16
    profile_flag: str | None = None
    profile_steps: int = 800

    def __post_init__(self) -> None:
        if self.every < 1:
            raise StepTimerConfigError(f"{ENV_EVERY} must be >= 1, got {self.every}")
        if self.profile_steps < 1:
            raise StepTimerConfigError(f"{ENV_PROFILE_STEPS} must be >= 1, got {self.profile_steps}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StepTimerConfig | None:
        try:
            trace_dir = settings.STEP_TIMER.get(env)
            if trace_dir is None:
                return None
            return cls(trace_dir=trace_dir, every=settings.STEP_TIMER_EVERY.get(env),
                       profile_flag=settings.STEP_PROFILE.get(env), profile_steps=settings.STEP_PROFILE_STEPS.get(env))
        except SettingError as exc:
            raise StepTimerConfigError(str(exc)) from None


class StepTimer:
    """What the hook keeps between calls inside one scheduler process. `event_factory` makes a timing event
    (`torch.cuda.Event(enable_timing=True)` on a server)."""

    def __init__(self, config: StepTimerConfig, event_factory: Any = None, gc_clock: GcClock | None = None) -> None:
        self.config = config
        self.gc_clock = gc_clock
        self.trace = JsonlTrace(config.trace_dir, prefix="steps")
        self.event_factory = event_factory
        self.last_entry: float | None = None
        self.last_was_decode = False
        self.last_was_prefill = False
        self.last_period: float | None = None
        # the loop's wait before the latest run of prefills (None: none yet): an idle spell when the server had emptied
        self.idle_before_prefill: float | None = None
        self.last_arrival: float | None = None  # the latest request handed to the scheduler (handle_generate_request)
        self.decode_steps = 0
        self.broken = False
        self.profiler: Any = None  # cProfile.Profile while the profile window is open
        self.profile_started: tuple[int, float] | None = None  # (decode step, perf_counter) at the window's start
        self.profile_done = False

    def around_run_batch(self, orig: Any, scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        if self.broken:
            return orig(scheduler, batch, *args, **kwargs)
        try:
            events = self._before(scheduler, batch)
        except Exception:  # noqa: BLE001 - a measurement tool never takes the server down
            self._break()
            return orig(scheduler, batch, *args, **kwargs)
        if events is None:
            return orig(scheduler, batch, *args, **kwargs)
        if events == "prefill":
            return self._timed_prefill(orig, scheduler, batch, *args, **kwargs)
        start, end, stream, info = events
        out = orig(scheduler, batch, *args, **kwargs)
        try:
            end.record(stream)
            self.trace.timed(start, end, info)
        except Exception:  # noqa: BLE001
            self._break()
        return out

    def _before(self, scheduler: Any, batch: Any) -> tuple[Any, Any, Any, dict[str, Any]] | str | None:
        """Record the loop iteration; the started event pair when this step is timed on the device; "prefill"
        when the batch is a prefill (its host time is taken around the call)."""
        now = time.perf_counter()
        period, self.last_entry = (None if self.last_entry is None else now - self.last_entry), now
        decode = batch.forward_mode.is_decode()
        steady = decode and self.last_was_decode and period is not None
        after_prefill = decode and self.last_was_prefill and period is not None
        if batch.forward_mode.is_extend() and not self.last_was_prefill:
            self.idle_before_prefill = period
        self.last_was_decode = decode
        self.last_was_prefill = batch.forward_mode.is_extend()
        self.last_period = period
        if not decode:
            return "prefill" if self.last_was_prefill else None
        if after_prefill:  # the prefill's loop iteration: where a plain and a switch server may differ per request
            self.trace.event("first_decode", bs=batch.batch_size(), since_prefill_ms=round(period * 1e3, 4))
        self.decode_steps += 1
        if self.config.profile_flag is not None and not self.profile_done:
            self._profile_window(now)
        if self.gc_clock is not None and self.decode_steps % GC_REPORT_STEPS == 0:
            self.trace.event("gc", decode_steps=self.decode_steps, **self.gc_clock.snapshot())
        # the first decode after a prefill is always timed: on an emptied server it is the baseline for a switch's
        # first step after a flip-on, which follows the same idle spell and prefill (bench/gpu/summarize.py)
        if self.decode_steps % self.config.every and not after_prefill:
            return None
        kind = "plain" if batch.spec_algorithm.is_none() else "spec"
        bs = batch.batch_size()
        if steady:
            self.trace.event("step_time", kind=kind, bs=bs, host_ms=round(period * 1e3, 4))
        if self.event_factory is None:
            return None
        stream = getattr(scheduler, "forward_stream", None) if getattr(scheduler, "enable_overlap", False) else None
        start, end = self.event_factory(), self.event_factory()
        start.record(stream)
        info: dict[str, Any] = {"kind": kind, "bs": bs, "first_after_flip": False, "timer": True}
        if after_prefill:
            idle = self.idle_before_prefill
            info.update(after_prefill=True, idle_ms=None if idle is None else round(idle * 1e3, 4))
        return start, end, stream, info

    def around_arrival(self, orig: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
        self.last_arrival = time.perf_counter()
        return orig(scheduler, *args, **kwargs)

    def _timed_prefill(self, orig: Any, scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        """A `prefill` line for every prefill: its batch size, the time since the previous run_batch entry (the
        last decode step, or the idle wait for the request), since the latest request arrived at the scheduler
        (when it came after that entry) and the host time of run_batch itself."""
        tic = time.perf_counter()
        out = orig(scheduler, batch, *args, **kwargs)
        try:
            gap, arrival = self.last_period, self.last_arrival
            fresh = arrival is not None and (gap is None or arrival >= tic - gap)
            self.trace.event("prefill", bs=batch.batch_size(), run_ms=round((time.perf_counter() - tic) * 1e3, 4),
                             since_last_ms=None if gap is None else round(gap * 1e3, 4),
                             since_arrival_ms=round((tic - arrival) * 1e3, 4) if fresh else None)
        except Exception:  # noqa: BLE001
            self._break()
        return out

    def _profile_window(self, now: float) -> None:
        """Open the cProfile window when the flag file appears; close it and write the profile after
        `profile_steps` decode steps. Runs on the scheduler thread (cProfile profiles the calling thread)."""
        if self.profiler is None:
            if self.decode_steps % PROFILE_POLL_STEPS or not os.path.exists(self.config.profile_flag or ""):
                return
            import cProfile

            self.profiler = cProfile.Profile()
            self.profile_started = (self.decode_steps, now)
            self.profiler.enable()
            return
        assert self.profile_started is not None
        steps = self.decode_steps - self.profile_started[0]
        if steps < self.config.profile_steps:
            return
        self.profiler.disable()
        self.profile_done = True
        path = os.path.join(self.config.trace_dir, f"profile-{os.getpid()}.pstats")
        self.profiler.dump_stats(path)
        self.profiler = None
        self.trace.event("profile", path=os.path.basename(path), decode_steps=steps,
                         wall_ms_per_step=round((now - self.profile_started[1]) * 1e3 / steps, 4))

    def _break(self) -> None:
        if self.profiler is not None:
            self.profiler.disable()
            self.profiler = None
            self.profile_done = True
        self.broken = True
        logging.getLogger("specflip.step_timer").exception("specflip step timer off after an error (serving goes on)")


_TIMER: StepTimer | None = None


def install_step_timer(registry: Any, config: StepTimerConfig | None, event_factory: Any = None) -> bool:
    """Register the timer's hook on `registry` (SGLang's HookRegistry class); False when config is None."""
    global _TIMER
    if config is None:
        return False
    from sglang.srt.plugins.hook_registry import HookType

    gc_clock = GcClock()
    gc.callbacks.append(gc_clock)
    timer = StepTimer(config, event_factory, gc_clock)
    timer.trace.event("config", step_timer_every=config.every)
    try:
        run_batch, arrival = installed_line().step_timer_targets
    except UnsupportedRelease:  # the timer serves any server: the scheduler's methods as every line names them
        run_batch, arrival = T_RUN_BATCH, T_ARRIVAL
    registry.register(run_batch, timer.around_run_batch, HookType.AROUND)
    registry.register(arrival, timer.around_arrival, HookType.AROUND)
    _TIMER = timer
    return True


def install_from_env() -> bool:
    """Install the timer as SPECFLIP_STEP_TIMER* say (idempotent); a bad setting logs one line and leaves it off."""
    if _TIMER is not None:
        return True
    try:
        config = StepTimerConfig.from_env()
    except StepTimerConfigError as exc:
        logging.getLogger("specflip.step_timer").error("specflip step timer off: %s", exc)
        return False
    if config is None:
        return False
    import torch
    from sglang.srt.plugins.hook_registry import HookRegistry

    return install_step_timer(HookRegistry, config, functools.partial(torch.cuda.Event, enable_timing=True))
