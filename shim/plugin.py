"""The SGLang plugin: entry point `specflip = "shim.plugin:register"` in group `sglang.srt.plugins`.

SGLang's `load_plugins()` calls `register()` in every process before the scheduler, the workers and
their CUDA graphs exist. Environment:

* `SPECFLIP_MODE=off|warn|assert|trace` (default off: no hook is registered at all).
* `SPECFLIP_TRACE=<path>` trace file (JSONL; `{rank}` and `{pid}` are filled in). Trace mode without it
  writes `specflip-trace.rank{rank}.jsonl` in the working directory.
* `SPECFLIP_DESIGN=<design name>` the reference design whose transition function moves the ghost state
  (default: the design of the switch installed in this process (shim/switch_v2.py: `plain_off_retract_catch_up`,
  or `v2_switch_reserve_sync` with SPECFLIP_SWITCH_DRAFT=sync), else `sglang_adaptive_warm` with
  --speculative-adaptive, else `plain_off_catch_up`).
* `SPECFLIP_SPEC_CAP`, `SPECFLIP_PLAIN_CAP` running-request caps per mode (default: max_running_requests).
* `SPECFLIP_STEP_TIMER=<dir>` a per-step timer for any server, switch or not (shim/step_timer.py).

An unsupported release or configuration logs one message and leaves the guard off.
"""

from __future__ import annotations

import logging

from shim.guard import Mode
from shim.runtime import ConfigError, GuardRuntime, current, install

logger = logging.getLogger("specflip.guard")


def register() -> None:
    """Install the guard's hooks through SGLang's HookRegistry, or nothing (with one message why)."""
    # specflip's v2 switch (shim/switch_v2.py, issue 5): a no-op unless SPECFLIP_SWITCH is set
    from shim.switch_v2 import install_from_env as install_switch_v2_from_env
    install_switch_v2_from_env()
    # the per-step timer (shim/step_timer.py): a no-op unless SPECFLIP_STEP_TIMER is set
    from shim.step_timer import install_from_env as install_step_timer_from_env
    install_step_timer_from_env()
    if current() is not None:
        return  # already registered in this process
    try:
        runtime = GuardRuntime.from_env()
    except ConfigError as exc:
        logger.error("specflip guard off: %s", exc)
        return
    if runtime.mode is Mode.OFF:
        return
    from shim.adapters import select_adapter

    adapter, why = select_adapter()
    if adapter is None:
        logger.warning("specflip guard off: %s", why)
        return
    problem = adapter.install(runtime)
    if problem:
        logger.warning("specflip guard off: %s", problem)
        return
    install(runtime)
    logger.info("specflip guard on: mode %s, sglang %s, %d hooks", runtime.mode.value, adapter.release,
                len(adapter.TARGETS))
