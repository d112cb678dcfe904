"""The switch core (shim/switch/core.py) and its worker sides: both switches' plain-path flips are the core's
`plain_path_flip`, which decides, sequences and records every flip and calls the worker's side (`WorkerSide`) for what
that worker does its own way. Here on SGLang 0.5.23's real objects under the overlap schedule (tests/overlap_loop.py),
the v2 worker's side wrapped to record the calls the core makes; the v1 side runs the same core in
tests/test_v1_switch.py (.venv12)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

retract = importlib.import_module("test_switch_retract")  # its driver and workload (t_off 4, t_on 1, three waves)

from shim.switch import core, v1_plain_path  # noqa: E402
from shim.switch import v2 as switch_v2  # noqa: E402

pytestmark = pytest.mark.sglang

# what the core asks of the worker's side at each flip, in order (flip_on_waits answered False first at a flip-on)
FLIP_OFF_CALLS = ["flip_starting", "leave_spec", "enter_plain", "record_flip"]
FLIP_ON_CALLS = ["flip_on_waits", "flip_starting", "to_retract", "retract", "enter_spec", "record_flip"]


def test_both_workers_implement_the_worker_side() -> None:
    """One implementation of the protocol per worker, every member present (a runtime check of the Protocol)."""
    for side in (v1_plain_path.SIDE, switch_v2.SIDE):
        assert isinstance(side, core.WorkerSide), type(side).__name__
    assert switch_v2.plain_path_flip is core.plain_path_flip  # the v2 hook calls the core's flip itself
    assert v1_plain_path.SIDE.follows_tiers is False and switch_v2.SIDE.follows_tiers is True


class RecordingV2Side(switch_v2.V2Side):
    """The v2 worker's real side, each call the core makes logged (name, and what flip_on_waits answered)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.records: list[tuple[str, dict[str, Any]]] = []

    def flip_on_waits(self, running_batch: Any, pending: Any) -> bool:
        waits = super().flip_on_waits(running_batch, pending)
        self.calls.append(("flip_on_waits", waits))
        return waits

    def flip_starting(self, scheduler: Any, reqs: list[Any]) -> dict[str, Any]:
        self.calls.append(("flip_starting", len(reqs)))
        return super().flip_starting(scheduler, reqs)

    def leave_spec(self, rt: Any, scheduler: Any, running_batch: Any, pending: Any,
                   reqs: list[Any]) -> dict[str, Any]:
        self.calls.append(("leave_spec", len(reqs)))
        return super().leave_spec(rt, scheduler, running_batch, pending, reqs)

    def enter_plain(self, rt: Any, scheduler: Any) -> None:
        self.calls.append(("enter_plain", bool(rt.spec_side)))
        super().enter_plain(rt, scheduler)

    def to_retract(self, scheduler: Any, running_batch: Any, record: dict[str, Any]) -> list[Any]:
        reqs = super().to_retract(scheduler, running_batch, record)
        self.calls.append(("to_retract", len(reqs)))
        return reqs

    def retract(self, scheduler: Any, running_batch: Any, reqs: list[Any]) -> None:
        self.calls.append(("retract", len(reqs)))
        super().retract(scheduler, running_batch, reqs)

    def enter_spec(self, rt: Any, scheduler: Any, running_batch: Any) -> None:
        self.calls.append(("enter_spec", bool(rt.spec_side)))
        super().enter_spec(rt, scheduler, running_batch)

    def record_flip(self, rt: Any, action: str, record: dict[str, Any]) -> None:
        self.calls.append(("record_flip", action))
        self.records.append((action, dict(record)))
        super().record_flip(rt, action, record)


def flips_of(calls: list[tuple[str, Any]]) -> list[tuple[str, list[str]]]:
    """The calls split per flip (each ends with record_flip), a flip-on's waits that held it back left out."""
    flips: list[tuple[str, list[str]]] = []
    current: list[str] = []
    for name, value in calls:
        if name == "flip_on_waits" and value:
            continue  # held back: no flip this iteration, nothing else called
        current.append(name)
        if name == "record_flip":
            flips.append((value, current))
            current = []
    assert current in ([], ["flip_on_waits"]), current
    return flips


def test_the_core_sequences_every_flip_through_the_worker_side(runtime: Any, model_dir: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Three waves across t_off = 4, back to t_on = 1: every flip-off calls the side to leave speculation then enter
    the plain side, every flip-on to retract then enter speculation, the record last; the record the side writes is
    the trace's flip record; the flip counters and the guard (assert mode) follow; outputs stay greedy."""
    retract.configure(runtime)
    side = RecordingV2Side()
    monkeypatch.setattr(switch_v2, "SIDE", side)
    drv = retract.driver(model_dir)
    reqs = retract.run_waves(drv)
    flips = flips_of(side.calls)
    assert [action for action, _ in flips] == ["flip_off", "flip_on"] * 3, flips
    for action, calls in flips:
        assert calls == (FLIP_OFF_CALLS if action == "flip_off" else FLIP_ON_CALLS), (action, calls)
    # the plain side is entered with nothing swapped out, speculation's with the plain side's swaps to undo
    assert [v for n, v in side.calls if n == "enter_plain"] == [False] * 3
    assert [v for n, v in side.calls if n == "enter_spec"] == [True] * 3
    traced = [e for e in drv.switch.trace.events if e["action"] in ("flip_off", "flip_on")]
    assert [(e["action"], {k: v for k, v in e.items() if k != "action"}) for e in traced] == side.records
    assert list(side.records[0][1]) == ["running", "waiting", "chunked", "drained", "reserve_freed", "retracted",
                                        "ms"]
    assert drv.switch.flips == 6 and runtime.guard.found == []
    assert retract.not_greedy(reqs) == []
