"""The switches' shared core (shim/switch/core.py) on SGLang's real HookRegistry and Scheduler class: each switch's
hook table is registered whole, each target with its one hook of its kind; the trace's config record and the guard's
announcement carry the design and the cap; the demand is read off the scheduler as the policy wants it."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

from shim.guard import api as guard_api  # noqa: E402
from shim.releases.registry import installed_line  # noqa: E402
from shim.switch import core  # noqa: E402
from shim.switch import v2 as switch_v2  # noqa: E402
from shim.switch.config import SwitchConfig  # noqa: E402

pytestmark = pytest.mark.sglang


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """SGLang's HookRegistry with empty tables for the test; the guard plugin's come back after it."""
    hook_registry = pytest.importorskip("sglang.srt.plugins.hook_registry")
    reg = hook_registry.HookRegistry
    monkeypatch.setattr(reg, "_hooks", defaultdict(list))
    monkeypatch.setattr(reg, "_patched", set())
    yield reg
    switch_v2._RUNTIME = None
    guard_api.announce_switch(None)


def registered(reg: Any, target: str) -> list[tuple[str, Any]]:
    return [(kind.name, fn) for kind, fn, _ in reg._hooks.get(target, [])]


@pytest.mark.parametrize("draft", ["retract", "sync"])
def test_the_v2_hook_table_is_registered_whole(registry: Any, tmp_path: Path, draft: str) -> None:
    config = SwitchConfig(6, 2, spec_cap=8, draft_while_off=draft, trace_dir=str(tmp_path))
    assert switch_v2.install_switch(registry, config)
    s = switch_v2
    table = [(s.T_ALLOCATABLE, s._allocatable_around, "AROUND"),
             (installed_line().plain_capture_target, s._init_cuda_graphs_after, "AFTER"),
             (s.T_FORWARD, s._forward_around, "AROUND")]
    if draft == "retract":
        table += [(s.T_NEXT_BATCH, s._next_batch_around, "AROUND"), (s.T_RUN_BATCH, s._run_batch_around, "AROUND")]
    else:
        table += [(s.T_UPDATE_RUNNING, s._update_running_batch_around, "AROUND")]
    for target, hook, kind in table:
        assert registered(registry, target) == [(kind, hook)], target
    # the trace's first record and the guard's announcement
    record = json.loads((tmp_path / next(p.name for p in tmp_path.iterdir())).read_text().splitlines()[0])
    assert record["action"] == "config" and record["design"] == config.design_name and record["spec_cap"] == 8
    announced = guard_api.announced_switch()
    assert announced is not None and announced.design_name == config.design_name and announced.spec_cap == 8


def test_demand_is_read_off_the_scheduler() -> None:
    from sglang.srt.managers.scheduler import Scheduler

    scheduler = object.__new__(Scheduler)  # the real class, bare: only the two fields demand reads are set
    scheduler.waiting_queue, scheduler.chunked_req = [object(), object(), object()], None
    assert core.demand(scheduler) == (3, 0)
    scheduler.waiting_queue, scheduler.chunked_req = None, object()
    assert core.demand(scheduler) == (0, 1)
