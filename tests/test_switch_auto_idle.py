"""The auto switch on real SGLang objects (0.5.23's ScheduleBatch, allocators, the overlap loop of
tests/overlap_loop.py, the switch's own hooks): idle time between phases ages the learner's demand hold, agreed
across ranks before it reaches the learner, and a phase's first requests, arriving at the emptied server, get the
mode their own demand wants at once (statemodel.auto_policy `observe_idle` and the flip with nothing running; the
H100 run of 2026-12-06, 0b48981: tests/test_auto_phase_start.py)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

import attrs
import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")
sa = importlib.import_module("test_switch_auto")

from shim.switch import auto as auto_switch  # noqa: E402
from statemodel import auto_policy as ap  # noqa: E402
from statemodel.designs import AUTO_RETRACT_CATCH_UP  # noqa: E402

pytestmark = pytest.mark.sglang

# the CPU parameters of tests/test_switch_auto.py, with the default hold (16 steps): it outlasts the drain of a phase
PARAMS = attrs.evolve(sa.PARAMS, hold_steps=16)


def phase_after_idle(runtime: Any, model_dir: Path, idle_s: float, spec_cap: int | None = None,
                     turnover_idle: float = 0.0) -> tuple[Any, list[Any], int]:
    """A phase of 8 requests (plain wins there by 30 % on the stand-in clock), drained; an idle iteration; `idle_s`
    seconds on the clock; then 2 requests arrive (speculation wins at 2) and run to the end. The hold's peak (8) is
    set at the drain's last step, so only the idle time can end it. `spec_cap`: the learner's own (the driver's is
    16, the CPU pools' size); `turnover_idle`: the longest idle time of a wave's turnover it has seen. (driver,
    requests, the arrival's iteration)."""
    gf.configure_guard(runtime, AUTO_RETRACT_CATCH_UP)
    drv = sa.auto_driver(model_dir)
    if spec_cap is not None:
        drv.switch.policy.auto = auto_switch.AutoSwitch(spec_cap=spec_cap, window=2, clock=drv.clock)
    auto = drv.switch.policy.auto
    auto.state = ap.initial_state(PARAMS)
    reqs, _ = sa.drive_phases(drv, [(2, 40), (8, 60)])
    assert not drv.switch.policy.spec_on  # plain at 8, learned on the numbers
    auto.state = attrs.evolve(auto.state, peak=8, peak_step=auto.state.step, calm=0,
                              turnover_idles=((0, turnover_idle),) if turnover_idle else ())
    assert drv.iteration() is None and auto.idle_since == drv.clock.now  # the idle iteration: the idle time starts
    drv.clock.now += idle_s
    wave = [h.make_req(f"q{i}", gf.SYSTEM_PROMPT + [700 + i] * 3, max_new_tokens=12) for i in range(2)]
    reqs += wave
    drv.add(wave)
    drv.iteration()
    arrival = drv.iteration_no
    assert auto.idle_since is None  # agreed and aged once, at the first scheduling point with requests waiting
    drv.run_until_idle()
    assert runtime.guard.found == [] and sa.ol_greedy(reqs) == [] and drv.switch.policy.refused == 0
    return drv, reqs, arrival


def test_seconds_of_idle_time_end_the_hold_and_speculation_comes_on_before_the_phase_runs(
        runtime: Any, model_dir: Path) -> None:
    """20 s of idle time: the 2 arriving requests are valued at 2, and speculation comes on at that first scheduling
    point, with nothing running (nothing retracted, no catch-up), through the real `_next_batch_around`."""
    drv, _reqs, arrival = phase_after_idle(runtime, model_dir, 20.0)
    assert drv.flips[-1] == (arrival, "flip_on"), drv.flips
    flip = sa.flips_of(drv)[-1]
    assert (flip["running"], flip["waiting"], flip["retracted"], flip["load"]) == (0, 2, 0, 2), flip


def test_a_turnover_of_a_few_ms_keeps_the_hold(runtime: Any, model_dir: Path) -> None:
    """The control: 2 ms of idle time (a wave's turnover) keeps the hold at 8, where plain wins: no flip at the
    arrival (the hold then ends by its steps, `calm_points`, and speculation comes later, with requests running)."""
    drv, _reqs, arrival = phase_after_idle(runtime, model_dir, 0.002)
    assert all(it != arrival for it, _ in drv.flips), drv.flips
    decided = drv.switch.policy.auto
    assert decided.state.step > 0


# --- rank agreement -------------------------------------------------------------------------------------------------


def clock_reads_outside(fn_source: str, agreed_by: str = "all_reduce_max") -> list[int]:
    """Line numbers of `self.clock()` calls in `fn_source` that are not inside an argument of `agreed_by(...)`."""
    tree = ast.parse(fn_source)
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == agreed_by:
            inside |= {id(sub) for arg in node.args for sub in ast.walk(arg)}
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == "clock" and id(node) not in inside]


def test_the_idle_seconds_reach_the_learner_only_agreed_across_ranks() -> None:
    """Each rank's clock differs, and a decision that differs between ranks hangs or corrupts the server (docs/tp.md):
    in `AutoSwitch.before_decision`, which feeds the learner the idle time, every clock read is inside the argument
    of the MAX all-reduce (over the TP CPU group), and the learner gets only that answer. The check fails on a version
    that feeds the raw clock."""
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(auto_switch.AutoSwitch.before_decision))
    assert "observe_idle" in source and "all_reduce_max" in source
    assert clock_reads_outside(source) == []
    raw = source.replace("all_reduce_max(scheduler, [self.clock() - since])[0]", "self.clock() - since")
    assert raw != source and clock_reads_outside(raw) != []


def run_two_ranks(tmp_path: Path, agree: bool) -> dict[int, list[Any]]:
    """Two rank processes (tests/auto_idle_rank_worker.py, a fresh interpreter each), a gloo group between them through
    a file store (as tests/test_switch_auto.py runs tests/auto_rank_worker.py)."""
    import json
    import os
    import subprocess
    import sys

    init = tmp_path / f"init-idle-{agree}"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "stand_ins" / "cpu"), str(root)])}
    procs = [subprocess.Popen([sys.executable, str(root / "tests" / "auto_idle_rank_worker.py"), str(r), str(init),
                               "1" if agree else "0", str(tmp_path / f"idle-{agree}-{r}.json")], env=env)
             for r in range(2)]
    for p in procs:
        assert p.wait(timeout=300) == 0
    return {r: [tuple(x) for x in json.loads((tmp_path / f"idle-{agree}-{r}.json").read_text())] for r in range(2)}


def test_two_ranks_whose_clocks_saw_different_idle_times_take_the_same_decisions(tmp_path: Path) -> None:
    """Two real gloo ranks: after a phase of 100 requests (plain), rank 0's clock saw 10 ms of idle time and rank 1's
    5 s, on either side of where the idle time ends the hold (16 steps of about 13 ms). With the idle seconds agreed
    (MAX) both value the 2 arriving requests at 2 and flip speculation on there, nothing running, and end in the same
    state; each rank with its own seconds (no collective), rank 0 keeps the hold (plain at 100) and rank 1 flips:
    the decisions split, which would hang a tensor-parallel server."""
    agreed = run_two_ranks(tmp_path, agree=True)
    assert agreed[0] == agreed[1]
    arrival = agreed[0][201]
    assert arrival[1:4] == (ap.FLIP_ON, "prior", 2), arrival
    apart = run_two_ranks(tmp_path, agree=False)
    assert apart[0][201][1:4] == (None, "prior", 100) and apart[1][201][1:4] == (ap.FLIP_ON, "prior", 2), apart


# --- an idle stretch far past the turnovers' (statemodel.auto_policy `_phase_change`) -----------------------------


def test_an_idle_stretch_far_past_the_turnovers_values_the_arrivals_at_their_own_demand(
        runtime: Any, model_dir: Path) -> None:
    """The learner's cap at 4, so the phase of 8 is a burst past it; turnovers of 1 ms learned, 5 ms of idle time
    after it (within the hold by its steps): the 2 arriving requests are valued at 2 and speculation comes on at
    that first scheduling point, nothing running, through the real hooks. With no turnover learned, or turnovers of
    3 ms (5 ms within twice them), the hold stands at 8: no flip at the arrival."""
    drv, _reqs, arrival = phase_after_idle(runtime, model_dir, 0.005, spec_cap=4, turnover_idle=0.001)
    assert drv.flips[-1] == (arrival, "flip_on"), drv.flips
    flip = sa.flips_of(drv)[-1]
    assert (flip["running"], flip["waiting"], flip["retracted"], flip["load"]) == (0, 2, 0, 2), flip
    assert flip["turnover_idle_ms"] == 1.0
    for turnover_idle in (0.0, 0.003):
        held, _reqs, at = phase_after_idle(runtime, model_dir, 0.005, spec_cap=4, turnover_idle=turnover_idle)
        assert all(it != at for it, _ in held.flips), (turnover_idle, held.flips)
