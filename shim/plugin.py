"""The SGLang plugins: one entry point (group `sglang.srt.plugins`) per feature and one that combines them.

SGLang's `load_plugins()` calls each registered entry point in every process before the scheduler, the workers
and their CUDA graphs exist. Each feature is a no-op unless its environment variables turn it on:

* `register_switch`: specflip's v2 switch (shim/switch/v2.py), when `SPECFLIP_SWITCH=t_off:t_on` is set; not on a
  server that runs SGLang's v1 EAGLEWorker.
* `register_switch_v1`: the v1 switch (shim/switch/v1.py, on a line that ships the v1 EAGLEWorker, with
  SGLANG_ENABLE_SPEC_V2=0), when
  `SPECFLIP_SWITCH` is set.
* `register_step_timer`: the per-step timer for any server, when `SPECFLIP_STEP_TIMER=<dir>` is set
  (shim/timing/step_timer.py).
* `register_guard`: the runtime guard, when `SPECFLIP_MODE` is set:
  * `SPECFLIP_MODE=off|warn|assert|trace` (default off: no hook is registered at all).
  * `SPECFLIP_TRACE=<path>` trace file (JSONL; `{rank}` and `{pid}` are filled in). Trace mode without it
    writes `specflip-trace.rank{rank}.jsonl` in the working directory.
  * `SPECFLIP_DESIGN=<design name>` the reference design whose transition function moves the ghost state
    (default: the design the installed switch announced through shim.guard.api (shim/switch/v2.py:
    `plain_off_retract_catch_up`, or `v2_switch_reserve_sync` with SPECFLIP_SWITCH_DRAFT=sync), else
    `sglang_adaptive_warm` with --speculative-adaptive, else `plain_off_catch_up`).
  * `SPECFLIP_SPEC_CAP`, `SPECFLIP_PLAIN_CAP` running-request caps per mode (default: max_running_requests).
  * `SPECFLIP_RANK_CHECK=on|off` the per-step rank agreement check under TP > 1 (default on; docs/tp.md).
  * Measurement only: `SPECFLIP_COUNT_SYNCS=1` counts the guard steps' host-device syncs (CUDA);
    `SPECFLIP_GUARD_CLOCK=1` (or the seconds per line) logs the guard steps' thread CPU time per hook and their
    share of the thread's (shim/guard/clock.py).
  A bad SPECFLIP_* guard setting (an unknown mode or design, a cap that is not an integer) stops start-up with
  one line naming the variable, unless `SPECFLIP_ON_BAD_CONFIG=warn` (then: one error line, the guard off). So does
  an SGLang release no line of shim/releases/ describes, when SPECFLIP_MODE or SPECFLIP_SWITCH asks for specflip
  (the line names the supported range). An unsupported configuration logs one message and leaves the guard off.
* `register` (the project's entry point, `specflip = "shim.plugin:register"`): the v2 switch, the step timer,
  then the guard (the guard last: it reads what the switch announced).
* `register_v1` (the v1 kit's entry point, bench/gpu/v1_run.sh): the v1 switch, then the guard.
"""

from __future__ import annotations

import logging
import os

from shim.guard.core import Mode
from shim.guard.runtime import ConfigError, GuardRuntime, current, install, on_bad_config
from shim.releases import UnsupportedRelease, release_line
from shim.switch import v1 as switch_v1
from shim.switch import v2 as switch_v2
from shim.timing import step_timer

logger = logging.getLogger("specflip.guard")


def supported_or_stop(asked_by: str) -> bool:
    """Whether the installed SGLang is a release line specflip supports (shim/releases/). When it is not and
    `asked_by` (SPECFLIP_SWITCH, SPECFLIP_MODE) asked for specflip, start-up stops with one line naming the supported
    range, as for any bad setting (SPECFLIP_ON_BAD_CONFIG=warn: one error line, and the server runs without it)."""
    try:
        release_line()
    except UnsupportedRelease as exc:
        on_bad_config(ConfigError(f"{asked_by}={os.environ.get(asked_by, '').strip()} asks for specflip, but {exc}"))
        return False
    return True


def register_switch() -> None:
    """specflip's v2 switch: a no-op unless SPECFLIP_SWITCH is set (idempotent)."""
    if os.environ.get("SPECFLIP_SWITCH", "").strip() and not supported_or_stop("SPECFLIP_SWITCH"):
        return
    switch_v2.install_from_env()


def register_switch_v1() -> None:
    """The v1 switch on SGLang's v1 EAGLEWorker (design v1_plain_off_retract_catch_up; with
    SPECFLIP_SWITCH_DRAFT=sync, seeds_final): a no-op unless SPECFLIP_SWITCH is set."""
    if os.environ.get("SPECFLIP_SWITCH", "").strip() and not supported_or_stop("SPECFLIP_SWITCH"):
        return
    switch_v1.install_from_env()


def register_step_timer() -> None:
    """The per-step timer: a no-op unless SPECFLIP_STEP_TIMER is set (idempotent)."""
    step_timer.install_from_env()


def register_guard() -> None:
    """Install the guard's hooks through SGLang's HookRegistry, or nothing (with one message why); idempotent."""
    if current() is not None:
        return  # already registered in this process
    try:
        runtime = GuardRuntime.from_env()
    except ConfigError as exc:
        on_bad_config(exc)  # stops start-up unless SPECFLIP_ON_BAD_CONFIG=warn
        return
    if runtime.mode is Mode.OFF:
        return
    if not supported_or_stop("SPECFLIP_MODE"):
        return
    adapter = release_line().adapter()
    problem = adapter.install(runtime)
    if problem:
        logger.warning("specflip guard off: %s", problem)
        return
    install(runtime)
    logger.info("specflip guard on: mode %s, sglang %s, %d hooks", runtime.mode.value, adapter.release,
                len(adapter.TARGETS))


def register() -> None:
    """The project's entry point: the v2 switch, the step timer and the guard, each as its variables say."""
    register_switch()
    register_step_timer()
    register_guard()


def register_v1() -> None:
    """The v1 kit's entry point: the v1 switch, then the guard (a no-op unless SPECFLIP_MODE is set; under the switch's
    overlap loop its v1-line adapter takes the overlap scope of the design the switch announced)."""
    register_switch_v1()
    register_guard()
