"""The guard's process-wide runtime: mode, the live Guard, and the all-or-nothing switch-off.

SGLang-free. The adapter's hooks call `GuardRuntime.run(fn, ...)`; this owns the rules that keep a
guard from half-working or silently absent: a configuration it does not describe is decided at start-up: in assert
mode start-up stops with one line, in SGLang's launching process before any scheduler process starts
(`stop_at_launch`), else at the scheduler's start-up (`decide_at_start_up`); in warn/trace mode each scheduler process
turns the guard off with one line and `specflip_guard_checking 0` in /metrics; an error inside the guard itself turns
it off in warn/trace mode (logged once, the same gauge 0) and propagates only in assert mode, where the point is to
stop.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from shim.guard.clock import GuardClock, hook_name
from shim.guard.core import Guard, GuardConfig, Mode, SpecFlipViolation
from shim.guard.metrics import CHECKING_NAME
from shim.guard.trace import trace_path_for
from shim.settings import SettingError, settings
from statemodel.design import Design, Scope
from statemodel.designs import DESIGNS_BY_NAME, get_design

logger = logging.getLogger("specflip.guard")

# the guard's settings, declared in shim/settings.py (their names kept here for the modules that quote them)
ENV_MODE = settings.MODE.name
ENV_TRACE = settings.TRACE.name
ENV_DESIGN = settings.DESIGN.name
ENV_SPEC_CAP = settings.SPEC_CAP.name
ENV_PLAIN_CAP = settings.PLAIN_CAP.name
ENV_COUNT_SYNCS = settings.COUNT_SYNCS.name
ENV_ON_BAD_CONFIG = settings.ON_BAD_CONFIG.name  # stop (default) | warn: what a bad SPECFLIP_* setting does
# the warning torch's sync debug mode issues at each synchronizing CUDA call (c10/cuda/CUDAFunctions.cpp)
SYNC_WARNING_TEXT = "called a synchronizing CUDA operation"
DEFAULT_TRACE = "specflip-trace.rank{rank}.jsonl"


class ConfigError(ValueError):
    """A SPECFLIP_* variable with a value specflip does not accept (any feature's: shim.plugin.check_settings)."""


def on_bad_config(problem: ConfigError | SettingError, environ: Mapping[str, str] | None = None,
                  feature: str = "guard", remedy: str = "Fix the setting") -> None:
    """A setting specflip cannot honour stops start-up (SystemExit: SGLang's plugin loader logs and ignores a
    plugin's Exceptions, and a feature silently absent is worse than none), unless SPECFLIP_ON_BAD_CONFIG=warn asks
    to serve without `feature` (the feature the bad setting belongs to); then it logs one error line and returns.
    `remedy`: what the line tells the operator to do first (the opt-out is always named after it)."""
    choice, bad_value = _bad_config_choice(environ)
    why = "" if bad_value is None or bad_value in str(problem) else f" ({bad_value})"
    if choice == "warn":
        logger.error("specflip %s off: %s (%s=warn: serving without the %s)", feature, problem, ENV_ON_BAD_CONFIG,
                     feature)
        return
    raise SystemExit(f"specflip: {problem}; the server does not start with a setting specflip cannot honour{why}. "
                     f"{remedy}, or set {ENV_ON_BAD_CONFIG}=warn to serve without the {feature}")


def _bad_config_choice(environ: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """SPECFLIP_ON_BAD_CONFIG as `on_bad_config` reads it: ("stop" or "warn", None), or ("stop", the one line saying
    its value is bad)."""
    try:
        return settings.ON_BAD_CONFIG.get(environ), None
    except SettingError as exc:
        return "stop", str(exc)


def bad_config_stops(environ: Mapping[str, str] | None = None) -> bool:
    """Whether `on_bad_config` stops start-up (SPECFLIP_ON_BAD_CONFIG is not warn), without saying anything."""
    return _bad_config_choice(environ)[0] != "warn"


def mode_from_env(environ: Mapping[str, str] | None = None) -> Mode:
    try:
        return Mode(settings.MODE.get(environ))
    except SettingError as exc:
        raise ConfigError(str(exc)) from None


class GuardRuntime:
    """One per process. `guard` is built lazily by the adapter once the server's numbers are known."""

    def __init__(self, mode: Mode, *, trace_template: str | None = None, design_name: str | None = None,
                 spec_cap: int | None = None, plain_cap: int | None = None) -> None:
        self.mode = mode
        self.trace_template = trace_template
        self.design_name = design_name
        self.spec_cap = spec_cap
        self.plain_cap = plain_cap
        self.guard: Guard | None = None
        self.adapter: Any = None  # the release adapter that installed the hooks
        self.disabled_reason: str | None = None
        self.paused = False  # hooks stay installed but pass through (tests share one process)
        self.internal_errors = 0
        self.sync_counter: SyncCounter | None = None
        self.clock: GuardClock | None = None  # SPECFLIP_GUARD_CLOCK: the guard steps timed (shim/guard/clock.py)
        self.slot_values = "auto"  # SPECFLIP_GUARD_SLOT_VALUES: when slot values are judged (shim/guard/slot_values.py)
        self.rank_check = True  # SPECFLIP_RANK_CHECK: the per-step rank agreement check where TP > 1
        self.reporter: FindingsReporter | None = None  # warn/trace: held-back findings and totals on a timer
        # --enable-metrics: this rank's findings counter and `specflip_guard_checking` gauge (shim/guard/metrics.py),
        # made at the start-up decision (or when the guard is built) and handed to the Guard
        self.metrics: Any = None
        self.rank: int | None = None  # this process's TP rank, once the start-up decision read it
        self.decided = False  # decide_at_start_up ran in this process

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GuardRuntime:
        env = environ
        try:
            mode = Mode(settings.MODE.get(env))
            template = settings.TRACE.get(env) or (DEFAULT_TRACE if mode is Mode.TRACE else None)
            runtime = cls(mode, trace_template=template, design_name=settings.DESIGN.get(env),
                          spec_cap=settings.SPEC_CAP.get(env), plain_cap=settings.PLAIN_CAP.get(env))
            runtime.rank_check = settings.RANK_CHECK.get(env)
            runtime.slot_values = settings.GUARD_SLOT_VALUES.get(env)
            if settings.COUNT_SYNCS.get(env):
                runtime.sync_counter = SyncCounter()
            every = settings.GUARD_CLOCK.get(env)
        except SettingError as exc:
            raise ConfigError(str(exc)) from None
        if every is not None:
            runtime.clock = GuardClock(log_every_s=every)
        return runtime

    @property
    def active(self) -> bool:
        return self.mode is not Mode.OFF and self.disabled_reason is None and not self.paused

    def disable(self, reason: str, *, said: bool = False) -> None:
        """Turn the guard off for this process, with one message (`said`: its one line was logged already), and
        `specflip_guard_checking` 0 where metrics are exported."""
        if self.disabled_reason is None:
            self.disabled_reason = reason
            rank = "" if self.rank is None else f" on TP rank {self.rank}"
            if not said:
                logger.warning("specflip guard off%s: %s (%s=%s: serving goes on without the guard's checks%s)", rank,
                               reason, ENV_MODE, self.mode.value,
                               f"; /metrics: {CHECKING_NAME} 0" if self.metrics is not None else "")
            if self.metrics is not None:
                self.metrics.set_checking(False)
            if self.guard is not None:
                self.guard.close()

    def _rank_metrics(self, rank: int) -> Any:
        """This rank's GuardMetrics, made once (prometheus_client imported only here, where metrics are exported)."""
        if self.metrics is None:
            from shim.guard.metrics import GuardMetrics

            self.metrics = GuardMetrics(rank)
        return self.metrics

    def decide_at_start_up(self, unsupported: str | None, *, rank: int, metrics: bool) -> bool:
        """Whether the guard checks this server, decided once per process at the scheduler's start-up (the release
        adapter's hook before the model worker is built, on the Scheduler's own server arguments; nothing is
        served yet). `unsupported`: the configuration the model does not describe (None: checked). Assert mode (the
        operator asked for a guard that stops faults) stops start-up on it with one line naming the setting and what
        to do, through the same path as a bad SPECFLIP_* setting (`on_bad_config`; SPECFLIP_ON_BAD_CONFIG=warn
        serves on without the guard). Warn and trace mode serve on: one warning line. `metrics`: the server exports
        Prometheus metrics (`--enable-metrics`): `specflip_guard_checking{tp_rank}` says 1 or 0 from here on."""
        if self.decided or self.mode is Mode.OFF:
            return self.active
        self.decided, self.rank = True, rank
        if metrics:
            self._rank_metrics(rank)
        if unsupported is not None:
            if self.mode is Mode.ASSERT:  # returns only where SPECFLIP_ON_BAD_CONFIG=warn (its one error line said it)
                self._stop_unchecked(unsupported)
            self.disable(unsupported, said=self.mode is Mode.ASSERT)
        elif self.metrics is not None:
            self.metrics.set_checking(self.disabled_reason is None)
        return self.active

    def stop_at_launch(self, unsupported: str | None) -> None:
        """`decide_at_start_up`'s stop, decided earlier: in SGLang's launching process, once it has checked the server
        arguments and before it starts any scheduler process (the release adapter's hook after
        `ServerArgs.check_server_args`). Assert mode on a configuration the model does not describe stops the launch
        here with the same one line, so that no scheduler process starts only to die of it (SGLang's launcher then
        prints its own tracebacks after that line). Nothing else is decided here, nothing is recorded: warn and trace
        mode, SPECFLIP_ON_BAD_CONFIG=warn and a supported server are each scheduler process's to decide and say
        (`decide_at_start_up`: one line per process, and the gauge where metrics are exported)."""
        if unsupported is not None and self.mode is Mode.ASSERT and not self.paused and bad_config_stops():
            self._stop_unchecked(unsupported)

    def _stop_unchecked(self, unsupported: str) -> None:
        """Assert mode on a configuration the guard does not check: the one line, through `on_bad_config`."""
        on_bad_config(ConfigError(f"{ENV_MODE}=assert asks for a guard that stops faults, but the guard does "
                                  f"not check this server: {unsupported}"), feature="guard",
                      remedy=f"Change that setting, or set {ENV_MODE}=warn to serve without the guard's "
                             f"checks, or {ENV_MODE}=off")

    def off_at_first_step(self, unsupported: str, *, rank: int, metrics: bool) -> None:
        """`decide_at_start_up`'s fallback, where it decided nothing in this process (the adapter's `guard`): the
        configuration the model does not describe, met at the first hooked step, turns the guard off with one line
        and, where metrics are exported, `specflip_guard_checking{tp_rank} 0`. Assert mode cannot stop start-up any
        more (the server is serving): its line says serving goes on without the guard's checks."""
        if self.rank is None:
            self.rank = rank
        if metrics:
            self._rank_metrics(self.rank)
        self.disable(unsupported)

    def start(self, *, design: Design, scope: Scope, rank: int, release: str, num_steps: int | None = None,
              metrics: bool = False) -> Guard:
        """Build the Guard (the adapter calls this at the first hooked step). `num_steps`: the server's
        `speculative_num_steps`, the step count of a design whose steps are one number (`Design.num_steps`, 2 in the
        checker's scope): its reserve is what SGLang reserves then. `metrics`: the server exports Prometheus metrics
        (`--enable-metrics`): the findings are counted there too (shim/guard/metrics.py)."""
        if self.design_name:
            design = get_design(self.design_name)
        if scope.overlap:
            # the overlap loop: the design's variant checked under it (SGLang's double reserve), where there is one
            design = DESIGNS_BY_NAME.get(f"{design.name}_overlap", design)
        if num_steps and num_steps != design.num_steps and design.steps_choices(1) == (design.num_steps,):
            design = attrs.evolve(design, num_steps=num_steps)
        if self.spec_cap is not None or self.plain_cap is not None:
            scope = attrs.evolve(scope, spec_cap=self.spec_cap or scope.spec_cap,
                                 plain_cap=self.plain_cap or scope.plain_cap)
        trace_path = trace_path_for(self.trace_template, rank) if self.trace_template else None
        self.guard = Guard(GuardConfig(mode=self.mode, design=design, scope=scope, rank=rank, release=release,
                                       trace_path=trace_path, slot_values=self.slot_values))
        if metrics:  # the rank's metrics made at the start-up decision, or here where it did not run
            if self.metrics is None:
                self._rank_metrics(rank).set_checking(True)
            self.guard.metrics = self.metrics
        if self.mode is not Mode.ASSERT and self.reporter is None:
            self.reporter = FindingsReporter(self, every_s=self.guard.config.warn_interval_s)
        # the line an operator looks for: "guard on" at registration can come before the scheduler process sets up
        # its logging (none of the GPU-line server logs of 2026-12-03 (80ec134) and 2026-12-04 (913095b) has it); this
        # one comes at the first hooked step
        logger.info("specflip guard checking: design %s%s, mode %s, TP rank %d, sglang %s", design.name,
                    " (overlap schedule)" if scope.overlap else "", self.mode.value, rank, release)
        return self.guard

    def reset(self) -> None:
        """Forget the Guard (a fresh one is built at the next hooked step)."""
        if self.guard is not None:
            self.guard.close()
        self.guard = None

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run one guard step. Violations raise only in assert mode (the Guard decides); any other
        error is the guard's own bug: it propagates in assert mode, else it switches the guard off."""
        if not self.active:
            return
        try:
            if self.clock is not None:  # measurement: the clock times the step, the sync counter's work included
                self.clock.run(hook_name(fn, args), self._step, fn, *args, **kwargs)
            elif self.sync_counter is not None:
                self.sync_counter.run(fn, *args, **kwargs)
            else:  # the production path: one call
                fn(*args, **kwargs)
        except SpecFlipViolation:
            raise
        except Exception:
            self.internal_errors += 1
            if self.mode is Mode.ASSERT:
                raise
            logger.exception("specflip guard: internal error; the guard switches itself off and serving goes on")
            self.disable("internal error (logged above)")

    def _step(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """A guard step as the clock times it: through the sync counter when that is on too."""
        if self.sync_counter is not None:
            self.sync_counter.run(fn, *args, **kwargs)
        else:
            fn(*args, **kwargs)


class FindingsReporter:
    """A daemon thread that, every `every_s`, has the live guard log its held-back findings and its totals
    (`GuardReporting.report_held_back`): in warn and trace mode a finding held back by the rate limit is reported
    within one interval even when no step follows it (an idle server, or one about to stop)."""

    def __init__(self, runtime: GuardRuntime, *, every_s: float) -> None:
        self.runtime = runtime
        self.every_s = every_s
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="specflip-guard-reporter", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            guard = self.runtime.guard
            if guard is not None and self.runtime.mode in (Mode.WARN, Mode.TRACE):
                guard.report_held_back()

    def stop(self) -> None:
        self._stop.set()


def report_at_shutdown() -> None:
    """The installed guard's held-back findings and totals, now (atexit, and SIGTERM: see `install`)."""
    runtime = _RUNTIME
    if runtime is not None and runtime.guard is not None:
        runtime.guard.report_held_back(force=True)


def _report_on_sigterm() -> None:
    """SIGTERM (how a process group is stopped, and how SGLang stops its daemons) ends a process without atexit:
    report first, then do what was set before (its handler; or the default, which ends the process)."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        return

    def handler(signum: int, frame: Any) -> None:
        report_at_shutdown()
        if callable(previous):
            previous(signum, frame)
        else:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)


class SyncCounter:
    """Counts the host-device synchronisations the guard's own steps make (SPECFLIP_COUNT_SYNCS=1): torch's sync
    debug mode is switched to "warn" only while a guard step runs, and its warnings are caught and counted by
    call site instead of printed. Measurement only (catching warnings costs time); the target is 0."""

    def __init__(self, log_every: int = 500, *, get_mode: Callable[[], int] | None = None,
                 set_mode: Callable[[str | int], None] | None = None) -> None:
        if get_mode is None or set_mode is None:
            import torch

            if not torch.cuda.is_available():
                raise ConfigError(f"{ENV_COUNT_SYNCS}: counting host-device syncs needs CUDA (torch sync debug mode)")
            get_mode, set_mode = torch.cuda.get_sync_debug_mode, torch.cuda.set_sync_debug_mode
        self._get_mode, self._set_mode = get_mode, set_mode
        self.steps = 0
        self.syncs = 0
        self.sites: Counter[str] = Counter()
        self.log_every = log_every

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.steps += 1
        previous = self._get_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self._set_mode("warn")
            try:
                fn(*args, **kwargs)
            finally:
                self._set_mode(previous)
        for w in caught:
            if SYNC_WARNING_TEXT in str(w.message):
                self.syncs += 1
                site = f"{os.path.basename(w.filename)}:{w.lineno}"
                if site not in self.sites:
                    logger.warning("specflip guard: host-device sync in a guard step at %s", site)
                self.sites[site] += 1
            else:  # not ours to swallow
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if self.steps % self.log_every == 0:
            logger.info("specflip guard: %s", self.summary())

    def summary(self) -> str:
        sites = ", ".join(f"{site} x{n}" for site, n in self.sites.most_common(5)) or "none"
        return f"{self.syncs} host-device syncs in {self.steps} guard steps (sites: {sites})"


_RUNTIME: GuardRuntime | None = None


def current() -> GuardRuntime | None:
    """The runtime `shim.plugin.register` installed in this process (None: the plugin did not load)."""
    return _RUNTIME


def install(runtime: GuardRuntime | None) -> None:
    """Make `runtime` this process's guard; the first time, also report its findings at shutdown."""
    global _RUNTIME, _SHUTDOWN_REPORT
    _RUNTIME = runtime
    if runtime is not None and runtime.mode is not Mode.ASSERT and not _SHUTDOWN_REPORT:
        atexit.register(report_at_shutdown)
        _report_on_sigterm()
        _SHUTDOWN_REPORT = True


_SHUTDOWN_REPORT = False
