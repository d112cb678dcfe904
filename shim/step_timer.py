"""A per-step timer for any SGLang server (plain, speculative, with or without specflip's switch), as a plugin hook.

Issue 5's open question is where the switch's plain path loses 12-29 % against a plain server
(docs/gpu-results.md, "Session 4"): GPU time per step, or host time between steps. The switch's own trace
times its steps; a plain server had nothing to compare with. This hook records, for decode batches:

* `host_ms`: the time from the previous `Scheduler.run_batch` entry to this one, i.e. one loop iteration
  (a host-bound loop's step time), for every decode step that follows a decode step;
* a CUDA event pair around `run_batch` on the forward stream (`timing` events, read back only once complete,
  so no host sync), for every Nth decode step.

Enable with `SPECFLIP_STEP_TIMER=<dir>` (one `steps-<pid>.jsonl` per process; `bench/gpu/summarize.py` reads
them) and optionally `SPECFLIP_STEP_TIMER_EVERY=N` (default 16: one line per N decode steps).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

ENV_DIR = "SPECFLIP_STEP_TIMER"
ENV_EVERY = "SPECFLIP_STEP_TIMER_EVERY"
T_RUN_BATCH = "sglang.srt.managers.scheduler.Scheduler.run_batch"


class StepTimerConfigError(ValueError):
    """A bad SPECFLIP_STEP_TIMER* setting; the message is one line."""


@dataclass(frozen=True)
class StepTimerConfig:
    trace_dir: str
    every: int = 16

    def __post_init__(self) -> None:
        if self.every < 1:
            raise StepTimerConfigError(f"{ENV_EVERY} must be >= 1, got {self.every}")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> StepTimerConfig | None:
        env = dict(os.environ) if env is None else env
        trace_dir = env.get(ENV_DIR, "").strip()
        if not trace_dir:
            return None
        try:
            every = int(env.get(ENV_EVERY, "16"))
        except ValueError:
            raise StepTimerConfigError(f"{ENV_EVERY} must be an integer, got {env[ENV_EVERY]!r}") from None
        return cls(trace_dir=trace_dir, every=every)


class StepTimer:
    """What the hook keeps between calls inside one scheduler process. `event_factory` makes a timing event
    (`torch.cuda.Event(enable_timing=True)` on a server)."""

    def __init__(self, config: StepTimerConfig, event_factory: Any = None) -> None:
        from shim.switch_v2 import SwitchTrace

        self.config = config
        self.trace = SwitchTrace(config.trace_dir, prefix="steps")
        self.event_factory = event_factory
        self.last_entry: float | None = None
        self.last_was_decode = False
        self.decode_steps = 0
        self.broken = False

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
        start, end, stream, info = events
        out = orig(scheduler, batch, *args, **kwargs)
        try:
            end.record(stream)
            self.trace.timed(start, end, info)
        except Exception:  # noqa: BLE001
            self._break()
        return out

    def _before(self, scheduler: Any, batch: Any) -> tuple[Any, Any, Any, dict[str, Any]] | None:
        """Record the loop iteration; the started event pair when this step is timed on the device."""
        now = time.perf_counter()
        period, self.last_entry = (None if self.last_entry is None else now - self.last_entry), now
        decode = batch.forward_mode.is_decode()
        steady = decode and self.last_was_decode and period is not None
        self.last_was_decode = decode
        if not decode:
            return None
        self.decode_steps += 1
        if self.decode_steps % self.config.every:
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
        return start, end, stream, {"kind": kind, "bs": bs, "first_after_flip": False, "timer": True}

    def _break(self) -> None:
        self.broken = True
        logging.getLogger("specflip.step_timer").exception("specflip step timer off after an error (serving goes on)")


_TIMER: StepTimer | None = None


def install_step_timer(registry: Any, config: StepTimerConfig | None, event_factory: Any = None) -> bool:
    """Register the timer's hook on `registry` (SGLang's HookRegistry class); False when config is None."""
    global _TIMER
    if config is None:
        return False
    from sglang.srt.plugins.hook_registry import HookType

    timer = StepTimer(config, event_factory)
    timer.trace.event("config", step_timer_every=config.every)
    registry.register(T_RUN_BATCH, timer.around_run_batch, HookType.AROUND)
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
    import functools

    import torch
    from sglang.srt.plugins.hook_registry import HookRegistry

    return install_step_timer(HookRegistry, config, functools.partial(torch.cuda.Event, enable_timing=True))
