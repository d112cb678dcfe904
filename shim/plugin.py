"""The SGLang plugins: one entry point (group `sglang.srt.plugins`) per feature and one that combines them.

SGLang's `load_plugins()` calls each registered entry point in every process before the scheduler, the workers
and their CUDA graphs exist. Each feature is a no-op unless its environment variables turn it on:

* `register_switch`: specflip's v2 switch (shim/switch/v2.py), when `SPECFLIP_SWITCH=t_off:t_on` is set. On a line
  that offers no v2 switch (0.5.12: `offers_v2_switch` False) SPECFLIP_SWITCH stops start-up with one line that says
  how to get the v1 switch (the v1 kit's entry point below), whichever worker the server runs.
* `register_switch_v1`: the v1 switch (shim/switch/v1.py, on a line that ships the v1 EAGLEWorker, with
  SGLANG_ENABLE_SPEC_V2=0 or --disable-overlap-schedule), when `SPECFLIP_SWITCH` is set. Where SGLang builds no v1
  worker, start-up stops with one line: at plugin load on a line that ships none, else once SGLang has resolved its
  server arguments (in the launching process after `ServerArgs.check_server_args`, and in each scheduler process
  before `Scheduler.init_model_worker`), as for a bad setting below.
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
  A configuration the guard does not describe (page_size > 1, topk > 1, DP attention, ...: the release adapter's
  `unsupported_reason`) is decided at start-up: with SPECFLIP_MODE=assert in SGLang's launching process, after its
  `ServerArgs.check_server_args` and before any scheduler process starts, and again in each scheduler process
  (`Scheduler.init_model_worker`, before the weights load). Assert mode stops start-up with one line naming the
  setting and what to do (as for a bad setting below, SPECFLIP_ON_BAD_CONFIG=warn included); in warn or trace mode
  each scheduler process says one warning line, the server
  serves without the guard's checks, and with `--enable-metrics` `specflip_guard_checking{tp_rank} 0` says so
  (shim/guard/metrics.py). Hook targets missing from the installed SGLang stop start-up the same way in assert mode.
* Every SPECFLIP_* setting is declared in shim/settings.py (`specflip settings`, docs/settings.md). Each entry point
  parses and checks all the settings of its features before it installs anything (`check_settings`): a bad value of
  any of them stops start-up with one line naming the variable and what it allows, unless
  `SPECFLIP_ON_BAD_CONFIG=warn` (then: one error line, and the features those settings belong to stay off).
* An SGLang release no line of shim/releases/ describes, when SPECFLIP_MODE or SPECFLIP_SWITCH asks for specflip,
  stops start-up the same way (the line names the supported range).
* `register` (the project's entry point, `specflip = "shim.plugin:register"`): the v2 switch, the step timer,
  then the guard (the guard last: it reads what the switch announced).
* `register_v1` (the v1 kit's entry point, bench/gpu/v1_run.sh): the v1 switch, then the guard. Its settings check
  also refuses what the v1 switch cannot run (SPECFLIP_SWITCH=auto, SPECFLIP_TIERS: shim.switch.v1.check_config).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from shim import settings as table
from shim.guard.core import Mode
from shim.guard.runtime import ConfigError, GuardRuntime, current, install, on_bad_config
from shim.releases import Release, UnsupportedRelease, release_line
from shim.settings import FEATURE_FAULTS as FAULTS
from shim.settings import FEATURE_GUARD as GUARD
from shim.settings import FEATURE_START_UP as START_UP
from shim.settings import FEATURE_STEP_TIMER as STEP_TIMER
from shim.settings import FEATURE_SWITCH as SWITCH
from shim.switch import v1 as switch_v1
from shim.switch import v2 as switch_v2
from shim.switch.config import SwitchConfigError
from shim.timing import step_timer

logger = logging.getLogger("specflip.guard")

FEATURE_TEXT = {GUARD: "guard", SWITCH: "switch", STEP_TIMER: "step timer"}


def check_settings(features: tuple[str, ...], environ: Mapping[str, str] | None = None, *,
                   switch: str = "v2") -> dict[str, list[str]]:
    """Parse every SPECFLIP_* setting of `features` and build each feature's configuration (their combinations),
    installing nothing: {one-line problem: the features it turns off}, empty when every setting is good. `switch`:
    the switch the entry point installs ("v1": the v1 kit's, which also refuses what the v1 switch cannot run)."""
    found: dict[str, list[str]] = {}

    def bad(problem: Exception, *of: str) -> None:
        found.setdefault(str(problem), [])
        found[str(problem)] += [f for f in of if f in features and f not in found[str(problem)]]

    for problem in table.problems(environ, features + (FAULTS, START_UP)):
        setting = table.settings.by_name()[problem.names[0]]
        bad(problem, *setting.features)
    switch_config = switch_v1.checked_config_from_env if switch == "v1" else switch_v1.config_from_env
    checks = ((SWITCH, lambda: switch_config(environ), SwitchConfigError),  # v2's, and V1_LOOP's
              (STEP_TIMER, lambda: step_timer.StepTimerConfig.from_env(environ), step_timer.StepTimerConfigError),
              (GUARD, lambda: GuardRuntime.from_env(environ), ConfigError))
    for feature, build, error in checks:
        if feature in features:
            try:
                build()
            except error as exc:
                bad(exc, feature)
    return found


def settings_gate(features: tuple[str, ...], *, switch: str = "v2") -> set[str]:
    """Before an entry point installs anything: the features a bad setting turns off (SPECFLIP_ON_BAD_CONFIG=warn,
    after one error line), else SystemExit with one line naming every bad setting and what it allows."""
    found = check_settings(features, switch=switch)
    if not found:
        return set()
    off = {f for fs in found.values() for f in fs}
    on_bad_config(ConfigError("; ".join(found)),
                  feature=" and ".join(FEATURE_TEXT[f] for f in features if f in off) or "plugin")
    return off


def supported_or_stop(asked_by: str, feature: str) -> Release | None:
    """The installed SGLang's release line (shim/releases/), or None where specflip supports none. When it is not and
    `asked_by` (SPECFLIP_SWITCH, SPECFLIP_MODE) asked for specflip, start-up stops with one line naming the supported
    range, as for any bad setting (SPECFLIP_ON_BAD_CONFIG=warn: one error line, and the server runs without it)."""
    try:
        return release_line()
    except UnsupportedRelease as exc:
        asked = table.settings.by_name()[asked_by].raw()
        on_bad_config(ConfigError(f"{asked_by}={asked} asks for specflip, but {exc}"), feature=feature)
        return None


def register_switch() -> None:
    """specflip's v2 switch: a no-op unless SPECFLIP_SWITCH is set (idempotent)."""
    if table.settings.SWITCH.is_set():
        line = supported_or_stop(table.settings.SWITCH.name, "switch")
        if line is None:
            return
        if not line.offers_v2_switch:  # on either worker: the v1 one's switch comes with the v1 kit, not from here
            switch = table.settings.SWITCH
            offered = line.v1_switch_howto or line.features()["switch"]
            on_bad_config(ConfigError(f"{switch.name}={switch.raw()} asks for the switch, which sglang {line.version} "
                                      f"does not offer through specflip's entry point: {offered}"), feature="switch")
            return
        draft = table.settings.SWITCH_DRAFT
        if draft.get() == "none" and not line.stubs_skipped_draft_extend and line.worker_kind(os.environ) == "v2":
            on_bad_config(ConfigError(f"{draft.name}=none asks for plain steps that stub the skipped draft-extend, "
                                      f"which sglang {line.version} cannot (no "
                                      f"EAGLEWorkerV2._stub_skipped_draft_extend)"), feature="switch")
            return
    switch_v2.install_from_env()


def register_switch_v1() -> None:
    """The v1 switch on SGLang's v1 EAGLEWorker (design v1_plain_off_retract_catch_up; with
    SPECFLIP_SWITCH_DRAFT=sync, seeds_final): a no-op unless SPECFLIP_SWITCH is set. A line that ships no v1 worker
    stops start-up here; on one that does, whether the server runs it is decided on SGLang's resolved server arguments
    (`shim.switch.v1.check_worker`)."""
    if table.settings.SWITCH.is_set():
        line = supported_or_stop(table.settings.SWITCH.name, "switch")
        if line is None or switch_v1.refuse_wrong_worker(line):
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
    line = supported_or_stop(table.settings.MODE.name, "guard")
    if line is None:
        return
    adapter = line.adapter()
    problem = adapter.install(runtime)
    if problem:
        if runtime.mode is Mode.ASSERT:  # a guard asked to stop faults that could not be installed: no start-up
            on_bad_config(ConfigError(f"{table.settings.MODE.name}=assert asks for the guard, which cannot be "
                                      f"installed: {problem}"), feature="guard",
                          remedy=f"Set {table.settings.MODE.name}=warn to serve without the guard's checks, or "
                                 f"{table.settings.MODE.name}=off")
        logger.warning("specflip guard off: %s", problem)
        return
    install(runtime)
    logger.info("specflip guard on: mode %s, sglang %s, %d hooks", runtime.mode.value, adapter.release,
                len(adapter.TARGETS))


def register() -> None:
    """The project's entry point: every setting checked first (settings_gate), then the v2 switch, the step timer
    and the guard, each as its variables say."""
    off = settings_gate((SWITCH, STEP_TIMER, GUARD))
    if SWITCH not in off:
        register_switch()
    if STEP_TIMER not in off:
        register_step_timer()
    if GUARD not in off:
        register_guard()


def register_v1() -> None:
    """The v1 kit's entry point: every setting checked first, then the v1 switch, then the guard (a no-op unless
    SPECFLIP_MODE is set; under the switch's overlap loop its v1-line adapter takes the overlap scope of the design the
    switch announced)."""
    off = settings_gate((SWITCH, GUARD), switch="v1")
    if SWITCH not in off:
        register_switch_v1()
    if GUARD not in off:
        register_guard()
