"""SPECFLIP_COUNT_SYNCS: the guard's own host-device syncs, counted with torch's sync debug mode.

CI's torch has no CUDA, so torch's mode switch is replaced by `SyncDebugModeCpuStandIn`, which warns exactly as
torch's c10 code does (the same text, only while the mode is "warn"). The real mode runs on the H200
(bench/gpu/device_run.sh, docs/archive/gpu-results.md).
"""

from __future__ import annotations

import warnings

import pytest

from shim.guard.core import Mode
from shim.guard.runtime import ENV_COUNT_SYNCS, SYNC_WARNING_TEXT, ConfigError, GuardRuntime, SyncCounter


class SyncDebugModeCpuStandIn:
    """torch.cuda.get/set_sync_debug_mode without CUDA: keeps the mode; `synchronize()` warns like torch."""

    def __init__(self) -> None:
        self.mode: str | int = 0

    def get(self) -> str | int:
        return self.mode

    def set(self, mode: str | int) -> None:
        self.mode = mode

    def synchronize(self) -> None:
        if self.mode in ("warn", 1):
            warnings.warn(SYNC_WARNING_TEXT, UserWarning, stacklevel=2)


def counter_with_stand_in() -> tuple[SyncCounter, SyncDebugModeCpuStandIn]:
    mode = SyncDebugModeCpuStandIn()
    return SyncCounter(get_mode=mode.get, set_mode=mode.set), mode


def test_syncs_inside_guard_steps_are_counted_by_site_and_the_mode_is_restored() -> None:
    counter, mode = counter_with_stand_in()

    def guard_step_that_syncs() -> None:
        mode.synchronize()
        mode.synchronize()

    counter.run(guard_step_that_syncs)
    counter.run(lambda: None)
    assert (counter.steps, counter.syncs) == (2, 2)
    first = guard_step_that_syncs.__code__.co_firstlineno
    assert dict(counter.sites) == {f"test_sync_counter.py:{first + 1}": 1, f"test_sync_counter.py:{first + 2}": 1}
    assert mode.mode == 0  # restored after each step
    mode.synchronize()  # outside guard steps nothing is counted (the mode is off again)
    assert counter.syncs == 2
    assert "2 host-device syncs in 2 guard steps" in counter.summary()


def test_a_sync_free_step_counts_zero_and_other_warnings_still_reach_the_caller() -> None:
    counter, _ = counter_with_stand_in()
    with pytest.warns(DeprecationWarning, match="not a sync"):
        counter.run(lambda: warnings.warn("not a sync", DeprecationWarning, stacklevel=1))
    assert (counter.steps, counter.syncs) == (1, 0)


def test_the_mode_is_restored_when_the_guard_step_raises() -> None:
    counter, mode = counter_with_stand_in()
    mode.mode = "error"

    def failing() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        counter.run(failing)
    assert mode.mode == "error"


def test_runtime_routes_guard_steps_through_the_counter() -> None:
    runtime = GuardRuntime(Mode.WARN)
    counter, mode = counter_with_stand_in()
    runtime.sync_counter = counter
    runtime.run(mode.synchronize)
    assert counter.syncs == 1


def test_counting_without_cuda_is_a_clear_config_error() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match=ENV_COUNT_SYNCS):
        GuardRuntime.from_env({"SPECFLIP_MODE": "warn", ENV_COUNT_SYNCS: "1"})
