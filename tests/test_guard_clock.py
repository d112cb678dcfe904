"""SPECFLIP_GUARD_CLOCK: the guard steps' thread CPU and wall time per hook, logged as one line per window."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

from shim.guard.clock import ENV_GUARD_CLOCK, GuardClock, hook_name
from shim.guard.core import Mode
from shim.guard.runtime import ConfigError, GuardRuntime


class TickingClocksStandIn:
    """time.thread_time_ns / perf_counter_ns stand-ins: each read advances by a set step, so a test knows the sums."""

    def __init__(self, cpu_step: int, wall_step: int) -> None:
        self.cpu = self.wall = 0
        self.cpu_step, self.wall_step = cpu_step, wall_step

    def cpu_ns(self) -> int:
        self.cpu += self.cpu_step
        return self.cpu

    def wall_ns(self) -> int:
        self.wall += self.wall_step
        return self.wall


def test_steps_are_summed_per_hook_and_a_line_is_logged_per_window() -> None:
    clocks = TickingClocksStandIn(cpu_step=1_000, wall_step=2_000_000)
    lines: list[str] = []
    clock = GuardClock(log_every_s=0.017, cpu_ns=clocks.cpu_ns, wall_ns=clocks.wall_ns, log=lines.append)
    seen: list[int] = []
    for i in range(3):
        clock.run("prepare", seen.append, i)  # each step: one cpu read and one wall read before, one each after
    clock.run("verify", seen.append, 3)
    # the window (17 ms) starts at the first step's first reads; 2 ms per wall read: 14 ms at the fourth step's end
    assert seen == [0, 1, 2, 3] and lines == []
    clock.run("verify", seen.append, 4)  # 18 ms: the window ends here
    assert len(lines) == 1 and clock.windows == 1 and clock.by_hook == {}
    line = lines[0]
    assert "guard steps 5" in line and "prepare 3 x 1.0 us cpu / 2000.0 us wall" in line
    assert "verify 2 x 1.0 us cpu" in line
    # the thread's CPU over the window: from the first step's first read to the last step's last read, 10 reads
    # of 1 us apart (9 us); the guard's own 5 us of it
    assert "guard steps 5: 0.000 s CPU (55.6 % of the thread's)" in line
    clock.flush()
    assert len(lines) == 1  # an empty window logs nothing


def test_a_step_that_raises_is_still_timed_and_the_error_passes_through() -> None:
    clocks = TickingClocksStandIn(cpu_step=10, wall_step=10)
    clock = GuardClock(cpu_ns=clocks.cpu_ns, wall_ns=clocks.wall_ns, log=lambda line: None)

    def failing() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        clock.run("failing", failing)
    assert clock.by_hook["failing"][0] == 1


def test_hook_names_come_from_the_adapters_step_closures() -> None:
    def on_prepare_for_decode() -> Any:
        def step(guard: Any) -> None:
            return None
        return step

    def call_with_guard(step: Any) -> None:
        step(None)

    assert hook_name(call_with_guard, (on_prepare_for_decode(),)).endswith("on_prepare_for_decode.step")
    assert hook_name(len, ([1],)) == "len"


@pytest.mark.parametrize("raw, every", [("1", 30.0), ("5", 5.0), ("0.5", 0.5)])
def test_the_variable_turns_the_clock_on_with_its_window(raw: str, every: float) -> None:
    runtime = GuardRuntime.from_env({"SPECFLIP_MODE": "assert", ENV_GUARD_CLOCK: raw})
    assert runtime.clock is not None and runtime.clock.log_every_ns == int(every * 1e9)
    assert GuardRuntime.from_env({"SPECFLIP_MODE": "assert", ENV_GUARD_CLOCK: "0"}).clock is None


@pytest.mark.parametrize("raw", ["-3", "soon", "nan"])
def test_a_bad_window_is_a_config_error_naming_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError, match=ENV_GUARD_CLOCK):
        GuardRuntime.from_env({"SPECFLIP_MODE": "warn", ENV_GUARD_CLOCK: raw})


@pytest.mark.sglang
def test_the_clock_names_the_real_hooks_of_a_guarded_overlap_run(runtime: Any, model_dir: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The guard plugin on real SGLang 0.5.23 objects (the overlap loop of tests/overlap_loop.py): with the clock on,
    the line names the adapter's hooks and the run stays clean."""
    require_sglang_cpu()
    gf = importlib.import_module("guard_fixtures")
    ol = importlib.import_module("overlap_loop")
    from statemodel.designs import V2_SWITCH

    gf.configure_guard(runtime, V2_SWITCH)
    runtime.clock = GuardClock(log_every_s=3600)
    try:
        drv = ol.OverlapDriver(ol.overlap_pools(model_dir), V2_SWITCH)
        drv.accepts = gf.accept_cycle([1, 2, 3, 4])
        drv.add(gf.make_reqs("c", 3, max_new_tokens=12))
        drv.run_until_idle()
        with caplog.at_level(logging.INFO, logger="specflip.guard"):
            runtime.clock.flush()
    finally:
        runtime.clock = None
    line = next(r.getMessage() for r in caplog.records if "guard clock" in r.getMessage())
    assert "prepare_for_decode" in line and "% of the thread's" in line
    assert runtime.mode is Mode.ASSERT and runtime.disabled_reason is None and gf.pool_accounted(drv.pools)
