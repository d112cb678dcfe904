"""The guard is never silently absent when asked for: whether it checks a server is decided at the scheduler's
start-up (the 0.5.23 adapter's hook BEFORE SGLang's real `Scheduler.init_model_worker`, installed by SGLang's own
`load_plugins()` and HookRegistry), not at the first step. A configuration the model does not describe stops start-up
in assert mode with one line; in warn mode the server starts, with one line and `specflip_guard_checking{tp_rank} 0`
in the Prometheus registry SGLang's `/metrics` serves (shim/guard/metrics.py). The server arguments are real 0.5.23
ServerArgs; the model worker's build is a stand-in (it loads weights), named so, that records when it ran."""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

h = importlib.import_module("sglang_cpu")

from shim.guard.core import Mode  # noqa: E402

pytestmark = pytest.mark.sglang
REPO = Path(__file__).resolve().parents[1]
CHECKING = "specflip_guard_checking"


class ModelWorkerBuilt(Exception):
    """Raised by the stand-in for the model worker's build: start-up went on past the guard's decision."""


class WithMetrics:
    """The real ServerArgs as `--enable-metrics` resolves it (0.5.23's record is read-only once resolved)."""

    def __init__(self, sa: Any) -> None:
        self._sa = sa
        self.enable_metrics = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sa, name)


@pytest.fixture()
def fresh(runtime: Any) -> Iterator[Any]:
    """The installed runtime as a fresh scheduler process has it: nothing decided, no metrics, no guard built."""
    def clear() -> None:
        runtime.reset()
        runtime.disabled_reason, runtime.decided, runtime.metrics, runtime.rank = None, False, None, None
    clear()
    yield runtime
    runtime.mode = Mode.ASSERT
    clear()


def start_up(runtime: Any, sa: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """SGLang's real `Scheduler.init_model_worker` (hooked) on a scheduler whose server arguments are `sa`, up to
    the model worker's build (a stand-in that records the guard's state when it is reached, then stops start-up
    there). Returns what the stand-in recorded (empty: never reached)."""
    from sglang.srt.managers.scheduler import Scheduler

    monkeypatch.setattr(runtime.adapter, "server_args", lambda: sa)
    seen: list[Any] = []

    def init_tp_model_worker_cpu_stand_in() -> None:
        seen.append((runtime.active, runtime.disabled_reason))
        raise ModelWorkerBuilt

    scheduler = Scheduler.__new__(Scheduler)
    scheduler.init_tp_model_worker = init_tp_model_worker_cpu_stand_in
    with pytest.raises(ModelWorkerBuilt):
        scheduler.init_model_worker()
    return seen


def gauge(rank: str = "0") -> float | None:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(CHECKING, {"tp_rank": rank})


@pytest.mark.parametrize(("setting", "kwargs", "named"), [
    ("page size", {"page_size": 16}, "page_size 16 (--page-size;"),
    ("topk", {"topk": 2, "num_draft_tokens": 6}, "speculative_eagle_topk 2 (--speculative-eagle-topk;"),
])
def test_assert_mode_stops_start_up_before_the_model_loads_with_one_line(
        fresh: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch, setting: str, kwargs: dict[str, Any],
        named: str) -> None:
    sa = h.make_server_args(model_dir, speculative_algorithm="EAGLE", **kwargs)
    monkeypatch.delenv("SPECFLIP_ON_BAD_CONFIG", raising=False)
    with pytest.raises(SystemExit) as stop:
        start_up(fresh, sa, monkeypatch)
    line = str(stop.value.code)
    assert "\n" not in line and line.startswith("specflip: SPECFLIP_MODE=assert asks for a guard that stops faults, "
                                                "but the guard does not check this server: sglang 0.5.23: ")
    assert named in line  # the setting at fault, and what to do
    assert "Change that setting, or set SPECFLIP_MODE=warn to serve without the guard's checks, or " \
           "SPECFLIP_MODE=off" in line


def test_assert_mode_with_on_bad_config_warn_serves_without_the_guard(
        fresh: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """SPECFLIP_ON_BAD_CONFIG=warn, the opt-out of every start-up stop, holds here too: one error line, then the
    guard is off (decided before the model worker is built) and serving goes on."""
    monkeypatch.setenv("SPECFLIP_ON_BAD_CONFIG", "warn")
    sa = h.make_server_args(model_dir, speculative_algorithm="EAGLE", page_size=16)
    with caplog.at_level(logging.WARNING, logger="specflip.guard"):
        seen = start_up(fresh, sa, monkeypatch)
    assert seen == [(False, "sglang 0.5.23: page_size 16 (--page-size; the model counts KV in single slots; "
                            "supported: 1)")]
    ours = [r for r in caplog.records if r.name == "specflip.guard"]
    assert len(ours) == 1 and ours[0].levelno == logging.ERROR  # one line: the opt-out's, not a second warning
    assert ours[0].getMessage().startswith("specflip guard off: SPECFLIP_MODE=assert asks for a guard")


def test_warn_mode_serves_on_with_one_line_and_the_gauge_at_0(
        fresh: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    fresh.mode = Mode.WARN
    sa = WithMetrics(h.make_server_args(model_dir, speculative_algorithm="EAGLE", page_size=16))
    with caplog.at_level(logging.WARNING, logger="specflip.guard"):
        seen = start_up(fresh, sa, monkeypatch)
    assert seen and seen[0][0] is False  # off before the model worker was built: decided at start-up
    lines = [r.getMessage() for r in caplog.records if "specflip guard off" in r.getMessage()]
    assert lines == ["specflip guard off on TP rank 0: sglang 0.5.23: page_size 16 (--page-size; the model counts KV "
                     "in single slots; supported: 1) (SPECFLIP_MODE=warn: serving goes on without the guard's "
                     f"checks; /metrics: {CHECKING} 0)"]
    assert gauge() == 0
    # the first step's hooks pass through: no guard is built, no second line
    assert fresh.adapter.guard() is None and fresh.guard is None


def test_a_supported_server_exports_checking_1_until_the_guard_turns_itself_off(
        fresh: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh.mode = Mode.WARN
    sa = WithMetrics(h.make_server_args(model_dir, speculative_algorithm="EAGLE"))
    seen = start_up(fresh, sa, monkeypatch)
    assert seen == [(True, None)] and gauge() == 1
    guard = fresh.adapter.guard()  # built at the first step: it counts into the same rank's metrics
    assert guard is not None and guard.metrics is fresh.metrics
    fresh.disable("internal error (logged above)")  # what GuardRuntime.run does with an error inside the guard
    assert gauge() == 0


def test_hook_targets_missing_stop_start_up_in_assert_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """A guard asked to stop faults that cannot be installed (a hook target this SGLang lacks) stops start-up at
    `load_plugins()` with one line, instead of one warning and a server without it."""
    import shim.guard.runtime as runtime_mod
    from shim import plugin
    from shim.releases import release_line

    adapter_class = type(release_line().adapter())
    monkeypatch.setattr(runtime_mod, "_RUNTIME", None)  # a fresh process: no guard registered yet
    monkeypatch.setattr(adapter_class, "TARGETS",
                        (("sglang.srt.managers.scheduler.Scheduler.no_such_method", "BEFORE", "before_draft"),))
    monkeypatch.setenv("SPECFLIP_MODE", "assert")
    monkeypatch.delenv("SPECFLIP_ON_BAD_CONFIG", raising=False)
    with pytest.raises(SystemExit) as stop:
        plugin.register_guard()
    line = str(stop.value.code)
    assert "\n" not in line and "SPECFLIP_MODE=assert asks for the guard, which cannot be installed: sglang 0.5.23: " \
        "hook targets not found: sglang.srt.managers.scheduler.Scheduler.no_such_method" in line
    assert "Set SPECFLIP_MODE=warn to serve without the guard's checks, or SPECFLIP_MODE=off" in line
    assert runtime_mod.current() is None
    monkeypatch.setenv("SPECFLIP_MODE", "warn")  # warn mode: one warning, no guard, start-up goes on
    plugin.register_guard()
    assert runtime_mod.current() is None


SCHEDULER_SCRIPT = textwrap.dedent("""
    import multiprocessing, sys, tempfile
    from pathlib import Path
    sys.path[:0] = ["tests", "stand_ins/cpu"]
    import importlib
    import sglang.srt.plugins as plugins
    gf = importlib.import_module("guard_fixtures")
    import sglang_cpu as h
    gf._install_gpu_stand_ins()
    plugins.load_plugins()  # the guard through SGLang's entry point, assert mode from SPECFLIP_MODE
    from sglang.srt.managers.scheduler import Scheduler
    sa = h.make_server_args(h.write_tiny_model_config(Path(tempfile.mkdtemp())), speculative_algorithm="EAGLE",
                            page_size=16)
    h.publish_server_args(sa)  # what SGLang's run_scheduler_process publishes before it builds the Scheduler

    def model_worker_cpu_stand_in():
        print("MODEL WORKER BUILT", flush=True)
        sys.exit(0)

    scheduler = Scheduler.__new__(Scheduler)
    scheduler.init_tp_model_worker = model_worker_cpu_stand_in
    # a scheduler process as SGLang starts one (multiprocessing), its start-up up to the model worker's build
    proc = multiprocessing.get_context("fork").Process(target=scheduler.init_model_worker)
    proc.start()
    proc.join()
    print("EXIT", proc.exitcode, flush=True)
""")


def test_the_scheduler_process_ends_with_the_one_line_and_no_traceback(tmp_path: Path) -> None:
    """In a scheduler process (a multiprocessing child, as SGLang starts one) the stop is a SystemExit that SGLang's
    `run_scheduler_process` does not catch (it catches Exception): the process writes the one line and exits 1 (its
    launcher then reports the scheduler died during initialization)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SPECFLIP_")}, "SPECFLIP_MODE": "assert",
           "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", SCHEDULER_SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "EXIT 1" in out.stdout and "MODEL WORKER BUILT" not in out.stdout, out.stdout
    ours = [line for line in out.stderr.splitlines() if "specflip" in line and "guard on" not in line]
    assert len(ours) == 1 and ours[0].startswith("specflip: SPECFLIP_MODE=assert asks for a guard that stops faults")
    assert "page_size 16" in ours[0] and "Traceback" not in out.stderr
