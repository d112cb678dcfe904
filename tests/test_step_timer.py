"""shim/timing/step_timer.py: the per-step timer any server can load (a plain one included), on the CPU with
SGLang's real ForwardMode / SpeculativeAlgorithm and HookRegistry. The CUDA events are stood in by
`TimingEventCpuStandIn` (torch.cuda.Event cannot be created without a GPU)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from shim.timing import step_timer
from shim.timing.step_timer import StepTimer, StepTimerConfig, StepTimerConfigError

# what SGLang imports but a CPU machine lacks (torchvision...): the project's named CPU stand-ins
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stand_ins" / "cpu"))

from timing_stand_in import TimingEventCpuStandIn  # noqa: E402


def batch(mode: str, spec: bool, size: int) -> Any:
    sb = pytest.importorskip("sglang.srt.model_executor.forward_batch_info")
    spec_info = pytest.importorskip("sglang.srt.speculative.spec_info")
    algo = spec_info.SpeculativeAlgorithm.EAGLE3 if spec else spec_info.SpeculativeAlgorithm.NONE
    return SimpleNamespace(forward_mode=getattr(sb.ForwardMode, mode), spec_algorithm=algo,
                           batch_size=lambda: size)


def read(path: Path) -> list[dict[str, Any]]:
    files = list(path.glob("steps-*.jsonl"))
    assert len(files) == 1
    return [json.loads(line) for line in files[0].read_text().splitlines()]


def test_config_from_env(tmp_path: Path) -> None:
    d = str(tmp_path / "timer")  # a directory that does not exist yet (created when the timer starts)
    assert StepTimerConfig.from_env({}) is None
    assert StepTimerConfig.from_env({"SPECFLIP_STEP_TIMER": d}) == StepTimerConfig(d, 16)
    assert StepTimerConfig.from_env({"SPECFLIP_STEP_TIMER": d, "SPECFLIP_STEP_TIMER_EVERY": "4"}).every == 4
    with pytest.raises(StepTimerConfigError, match="SPECFLIP_STEP_TIMER_EVERY=.often.: expected an integer"):
        StepTimerConfig.from_env({"SPECFLIP_STEP_TIMER": d, "SPECFLIP_STEP_TIMER_EVERY": "often"})
    with pytest.raises(StepTimerConfigError, match=">= 1"):
        StepTimerConfig(d, 0)
    profiled = StepTimerConfig.from_env({"SPECFLIP_STEP_TIMER": d, "SPECFLIP_STEP_PROFILE": d + "/flag",
                                         "SPECFLIP_STEP_PROFILE_STEPS": "64"})
    assert (profiled.profile_flag, profiled.profile_steps) == (d + "/flag", 64)
    with pytest.raises(StepTimerConfigError, match="SPECFLIP_STEP_PROFILE_STEPS=.lots.: expected an integer"):
        StepTimerConfig.from_env({"SPECFLIP_STEP_TIMER": d, "SPECFLIP_STEP_PROFILE_STEPS": "lots"})


def test_loop_iterations_and_device_time_of_decode_steps(tmp_path: Path) -> None:
    """Every decode step that follows a decode step gets its loop iteration (host clock); a prefill in between
    breaks the run (its iteration is not a decode step's); the CUDA events go on the forward stream under
    overlap and are read back only once complete."""
    timer = StepTimer(StepTimerConfig(str(tmp_path), every=1), TimingEventCpuStandIn)
    scheduler = SimpleNamespace(enable_overlap=True, forward_stream="forward-stream")
    calls = []

    def run_batch(sched: Any, b: Any) -> str:
        calls.append(b)
        time.sleep(0.002)  # a step's worth of work, so that an iteration lasts longer than nothing
        return "result"

    steps = [batch("DECODE", False, 4), batch("DECODE", False, 4), batch("EXTEND", False, 2),
             batch("DECODE", True, 6), batch("DECODE", True, 6)]
    for b in steps:
        assert timer.around_run_batch(run_batch, scheduler, b) == "result"
    assert calls == steps
    timer.trace.drain(force=True)
    events = read(tmp_path)
    loops = [e for e in events if e["action"] == "step_time"]
    assert [(e["kind"], e["bs"]) for e in loops] == [("plain", 4), ("spec", 6)]
    assert all(e["host_ms"] >= 2.0 for e in loops)  # at least the step before it: the clock is the loop's
    timings = [e for e in events if e["action"] == "timing"]
    assert [(e["kind"], e["bs"], e["timer"]) for e in timings] == [("plain", 4, True)] * 2 + [("spec", 6, True)] * 2


def test_every_prefill_and_the_decode_step_after_it(tmp_path: Path) -> None:
    """Each prefill gets a line (batch size, the time since the previous run_batch entry, its own host time), and
    so does the first decode step after it: a per-request cost a decode-only clock cannot see. An IDLE batch
    gets none."""
    timer = StepTimer(StepTimerConfig(str(tmp_path), every=64), TimingEventCpuStandIn)
    scheduler = SimpleNamespace(enable_overlap=False)

    def run_batch(sched: Any, b: Any) -> None:
        time.sleep(0.004 if b.forward_mode.is_extend() else 0.001)

    for b in (batch("DECODE", False, 2), "arrival", batch("EXTEND", False, 1), batch("EXTEND", False, 3),
              batch("DECODE", False, 4), batch("DECODE", False, 4), batch("IDLE", False, 0), batch("DECODE", False, 4)):
        if b == "arrival":  # a request handed to the scheduler, 3 ms before its prefill
            timer.around_arrival(lambda sched, req: None, scheduler, "req")
            time.sleep(0.003)
            continue
        timer.around_run_batch(run_batch, scheduler, b)
    timer.trace.drain(force=True)
    events = read(tmp_path)
    prefills = [e for e in events if e["action"] == "prefill"]
    assert [e["bs"] for e in prefills] == [1, 3]
    assert all(e["run_ms"] >= 4.0 for e in prefills)
    assert prefills[0]["since_last_ms"] >= 1.0  # the decode step before it
    assert prefills[1]["since_last_ms"] >= 4.0  # the first prefill's own call
    assert prefills[0]["since_arrival_ms"] >= 3.0
    assert prefills[1]["since_arrival_ms"] is None  # no request arrived since the previous run_batch
    firsts = [e for e in events if e["action"] == "first_decode"]
    assert [(e["bs"], e["since_prefill_ms"] >= 4.0) for e in firsts] == [(4, True)]


def test_every_nth_decode_step_only(tmp_path: Path) -> None:
    timer = StepTimer(StepTimerConfig(str(tmp_path), every=3), TimingEventCpuStandIn)
    scheduler = SimpleNamespace(enable_overlap=False)
    for _ in range(7):
        timer.around_run_batch(lambda s, b: None, scheduler, batch("DECODE", False, 1))
    timer.trace.drain(force=True)
    events = read(tmp_path)
    assert len([e for e in events if e["action"] == "step_time"]) == 2  # decode steps 3 and 6
    assert len([e for e in events if e["action"] == "timing"]) == 2


def test_install_registers_on_the_real_hook_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hook_registry = pytest.importorskip("sglang.srt.plugins.hook_registry")
    registry = hook_registry.HookRegistry
    # the guard plugin's registrations, which other test modules read
    saved = ({target: list(hooks) for target, hooks in registry._hooks.items()}, set(registry._patched))
    registry.reset()
    monkeypatch.setattr(step_timer, "_TIMER", None)
    try:
        assert step_timer.install_step_timer(registry, None) is False
        assert step_timer.install_step_timer(registry, StepTimerConfig(str(tmp_path)), TimingEventCpuStandIn)
        assert [(t.name, fn.__name__) for t, fn, _ in registry._hooks[step_timer.T_RUN_BATCH]] == \
            [("AROUND", "around_run_batch")]
        assert [(t.name, fn.__name__) for t, fn, _ in registry._hooks[step_timer.T_ARRIVAL]] == \
            [("AROUND", "around_arrival")]
        registry.apply_hooks()  # both targets resolve on the real Scheduler
        assert {step_timer.T_RUN_BATCH, step_timer.T_ARRIVAL} <= registry._patched
    finally:
        registry.reset()
        registry._hooks.update(saved[0])
        registry._patched.update(saved[1])
    step_timer._TIMER.trace.drain(force=True)
    assert read(tmp_path)[0] == {**read(tmp_path)[0], "action": "config", "step_timer_every": 16}


def test_a_timer_error_never_stops_the_step(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An error inside the timer (here a batch without forward_mode) turns the timer off with one log line; the
    scheduler's step still runs, then and afterwards."""
    timer = StepTimer(StepTimerConfig(str(tmp_path), every=1), TimingEventCpuStandIn)
    ran = []
    with caplog.at_level("ERROR", logger="specflip.step_timer"):
        assert timer.around_run_batch(lambda s, b: ran.append(b) or "ok", None, SimpleNamespace()) == "ok"
    assert timer.broken and len(ran) == 1 and "step timer off" in caplog.text
    assert timer.around_run_batch(lambda s, b: ran.append(b) or "ok", None, batch("DECODE", False, 1)) == "ok"
    assert len(ran) == 2


def extra_host_work() -> int:
    """What the 'other' server does per step and the base one does not (profile_diff must name it)."""
    return sum(range(50_000))  # about a millisecond: well above the noise of a loaded machine


def profiled_server(tmp_path: Path, name: str, extra: bool, steps_before_flag: int = 40) -> Path:
    """A scheduler loop of decode steps under the step timer with a profile window of 64 steps, opened by the flag
    file after `steps_before_flag` steps; returns the trace folder."""
    folder = tmp_path / name
    flag = folder / "profile.flag"
    timer = StepTimer(StepTimerConfig(str(folder), every=1000, profile_flag=str(flag), profile_steps=64))

    def run_batch(sched: Any, b: Any) -> None:
        if extra:
            extra_host_work()

    for step in range(240):
        if step == steps_before_flag:
            flag.touch()
        timer.around_run_batch(run_batch, None, batch("DECODE", False, 2))
    timer.trace.drain(force=True)
    return folder


def test_profile_window_opens_on_the_flag_and_closes_after_its_steps(tmp_path: Path) -> None:
    folder = profiled_server(tmp_path, "server", extra=True)
    profiles = [e for e in read(folder) if e["action"] == "profile"]
    assert len(profiles) == 1  # once per process, although the flag stays
    assert profiles[0]["decode_steps"] == 64 and profiles[0]["wall_ms_per_step"] > 0
    (pstats_file,) = folder.glob("profile-*.pstats")
    assert profiles[0]["path"] == pstats_file.name
    import pstats

    calls = {key[2]: value[1] for key, value in pstats.Stats(str(pstats_file)).stats.items()}
    assert calls["extra_host_work"] == 64  # exactly the window's steps (opened at the first poll after the flag)


def test_no_flag_no_profile(tmp_path: Path) -> None:
    folder = profiled_server(tmp_path, "server", extra=False, steps_before_flag=10_000)
    assert not list(folder.glob("profile-*.pstats"))
    assert not [e for e in read(folder) if e["action"] == "profile"]


def test_profile_diff_names_the_extra_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "gpu"))
    import profile_diff

    (base,) = profiled_server(tmp_path, "base", extra=False).glob("profile-*.pstats")
    (other,) = profiled_server(tmp_path, "other", extra=True).glob("profile-*.pstats")
    assert profile_diff.main([str(base), str(other), "--top", "3"]) == 0
    out = capsys.readouterr().out
    cumulative = out.split("== cumulative")[1].split("== own")[0]
    assert "extra_host_work" in cumulative
    # and the other way round it is the largest decrease, not an increase at the top
    profile_diff.main([str(other), str(base), "--top", "1"])
    assert "extra_host_work" not in capsys.readouterr().out.split("== cumulative")[1].split("== own")[0]


def test_gc_time_by_generation_every_report_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real collector drives the clock (gc.callbacks); the timer reports it every GC_REPORT_STEPS decode steps."""
    import gc

    monkeypatch.setattr(step_timer, "GC_REPORT_STEPS", 4)
    clock = step_timer.GcClock()
    timer = StepTimer(StepTimerConfig(str(tmp_path), every=1000), None, clock)
    gc.callbacks.append(clock)
    try:
        def run_batch(sched: Any, b: Any) -> None:
            gc.collect(0)
            gc.collect(2)

        for _ in range(9):
            timer.around_run_batch(run_batch, None, batch("DECODE", False, 1))
    finally:
        gc.callbacks.remove(clock)
    timer.trace.drain(force=True)
    reports = [e for e in read(tmp_path) if e["action"] == "gc"]
    assert [e["decode_steps"] for e in reports] == [4, 8]
    # reported before the step's run_batch: 3 and 7 steps' collections (at least: the interpreter may add its own)
    assert reports[0]["gc_collections"][0] >= 3 and reports[0]["gc_collections"][2] >= 3
    assert reports[1]["gc_collections"][2] >= 7 and reports[1]["gc_ms"][2] >= reports[1]["gc_max_ms"][2] > 0
    assert clock.started is None  # every start met its stop


def test_the_first_decode_after_a_prefill_is_timed_with_the_idle_spell_before_it(tmp_path: Path) -> None:
    """Whatever `every` says, the first decode step after a run of prefills gets its CUDA events, marked with the
    loop's wait before the first prefill of the run: on a server that had emptied, the baseline for a switch's
    first step after a flip-on (which follows the same idle spell and prefill). Steady steps stay every Nth."""
    timer = StepTimer(StepTimerConfig(str(tmp_path), every=64), TimingEventCpuStandIn)
    scheduler = SimpleNamespace(enable_overlap=False)
    run = lambda sched, b: None  # noqa: E731 - the stood-in forward
    timer.around_run_batch(run, scheduler, batch("DECODE", True, 2))
    time.sleep(0.06)  # the server empties: an idle spell longer than IDLE_GAP_MS before the next arrival's prefill
    for b in (batch("EXTEND", False, 1), batch("EXTEND", False, 1), batch("DECODE", True, 2),
              batch("DECODE", True, 2), batch("EXTEND", False, 1), batch("DECODE", True, 3)):
        timer.around_run_batch(run, scheduler, b)
    timer.trace.drain(force=True)
    timed = [e for e in read(tmp_path) if e["action"] == "timing"]
    assert [(e["bs"], e["after_prefill"]) for e in timed] == [(2, True), (3, True)]  # the steady ones: every 64th
    assert timed[0]["idle_ms"] >= 60.0  # the wait before the first prefill of the run, not the second's
    assert timed[1]["idle_ms"] < 60.0  # a prefill under load: the decode step just before it


def test_summarize_pools_the_timers_first_steps_after_idle_over_its_steady_steps() -> None:
    """bench/gpu/summarize.py: the step timer's first decode after an idle spell's prefill, over the steady timed
    steps of its kind and batch size; a first decode after a prefill under load is not pooled, and neither kind
    enters the steady medians."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "gpu"))
    import summarize

    def timing(ms: float, bs: int, **extra: Any) -> tuple[str, dict]:
        return ("spec", {"action": "timing", "kind": "spec", "bs": bs, "ms": ms, "first_after_flip": False,
                         "timer": True, **extra})

    events = [timing(6.0, 2), timing(6.2, 2), timing(7.2, 2, after_prefill=True, idle_ms=900.0),
              timing(6.5, 2, after_prefill=True, idle_ms=8.0), timing(9.0, 4, after_prefill=True, idle_ms=900.0)]
    assert summarize.first_step_after_idle_baseline(events)[-1] == "- spec, spec: 1.18x (1.18-1.18, n=1)"
    assert summarize.first_step_after_idle_baseline(events[:2] + events[3:4]) == []
    table = "\n".join(summarize.step_timer_lines(events))
    assert "| spec | run_batch span (CUDA events) | - | 6.10 (2) |" in table
