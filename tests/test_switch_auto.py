"""SPECFLIP_SWITCH=auto (shim/switch/auto.py in shim/switch/v2.py) on real SGLang 0.5.23 objects under the overlap
schedule (tests/overlap_loop.py): the real `_next_batch_around` / `plain_path_flip` flip as the auto policy decides,
the real `_run_batch_around` and `_process_result_around` hooks feed it. What cannot run on a CPU is the GPU's step
time: `StepClockCpuStandIn` advances a clock by a synthetic step time per (mode, batch size) at each launch, where
speculation wins at small batches and plain decoding at large ones. The guard runs in assert mode. And the rank
agreement: two real gloo ranks (torch.distributed on the CPU) with different clocks take identical decisions."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")
ol = importlib.import_module("overlap_loop")

from shim.switch import auto as auto_switch  # noqa: E402
from shim.switch import v2 as switch_v2  # noqa: E402
from shim.switch.config import SwitchConfig, SwitchConfigError  # noqa: E402
from specflip.cli import main as cli_main  # noqa: E402
from specflip.ranks import RANKS_FROM_FIELD, check_switch_agreement  # noqa: E402
from statemodel import auto_policy as ap  # noqa: E402
from statemodel.designs import AUTO_RETRACT_CATCH_UP, DESIGNS_BY_NAME  # noqa: E402

pytestmark = pytest.mark.sglang

# small enough for a CPU run of a few hundred iterations; the defaults are for a GPU server
PARAMS = ap.AutoParams(min_dwell=6, confirm_steps=2, settle=1, min_samples=2, probe_steps=6, probe_credit=4,
                       explore_fraction=0.05, hold_steps=2)


def test_env_parsing() -> None:
    cfg = SwitchConfig.from_env({"SPECFLIP_SWITCH": "auto"})
    assert cfg is not None and cfg.auto and cfg.design_name == AUTO_RETRACT_CATCH_UP.name
    assert cfg.draft_while_off == "retract" and cfg.spec_cap == 48
    assert SwitchConfig.from_env({"SPECFLIP_SWITCH": " auto ", "SPECFLIP_SPEC_CAP": "32"}).spec_cap == 32
    assert not SwitchConfig.from_env({"SPECFLIP_SWITCH": "32:16"}).auto
    with pytest.raises(SwitchConfigError, match="auto runs on SGLang's plain path"):
        SwitchConfig.from_env({"SPECFLIP_SWITCH": "auto", "SPECFLIP_SWITCH_DRAFT": "sync"})
    with pytest.raises(SwitchConfigError, match="or 'auto'"):
        SwitchConfig.from_env({"SPECFLIP_SWITCH": "automatic"})


def test_install_registers_the_observation_hooks() -> None:
    from sglang.srt.plugins.hook_registry import HookType

    class Registry:
        def __init__(self) -> None:
            self.hooks: list[tuple[str, Any, Any]] = []

        def register(self, target: str, fn: Any, kind: Any) -> None:
            self.hooks.append((target, fn, kind))

    saved = switch_v2._RUNTIME
    try:
        reg = Registry()
        assert switch_v2.install_switch(reg, SwitchConfig.from_env({"SPECFLIP_SWITCH": "auto"}))
        targets = {t: (fn, kind) for t, fn, kind in reg.hooks}
        assert targets[switch_v2.T_RUN_BATCH] == (switch_v2._run_batch_around, HookType.AROUND)
        assert targets[switch_v2.T_PROCESS_RESULT] == (switch_v2._process_result_around, HookType.AROUND)
        assert switch_v2.runtime().policy.auto is not None
        reg = Registry()
        switch_v2.install_switch(reg, SwitchConfig.from_env({"SPECFLIP_SWITCH": "4:1"}))
        assert switch_v2.T_PROCESS_RESULT not in {t for t, _, _ in reg.hooks}
        assert switch_v2.runtime().policy.auto is None
    finally:
        switch_v2._RUNTIME = saved


class StepClockCpuStandIn:
    """The GPU's step time, which the CPU cannot give: at each launch the clock moves on by the synthetic time of
    the step launched (speculation: 2 ms + 0.5 ms per request, for about 2 tokens a request; plain: 1.5 ms + 0.1 ms
    a request, for 1; speculation wins by 28 % at one request and 13 % at two, plain by 5 % at four, 30 % at
    eight)."""

    def __init__(self, prefill_s_per_token: float = 0.0) -> None:
        self.now = 0.0
        self.prefill_s_per_token = prefill_s_per_token  # a prefill's time (the flip-on's catch-up is one)

    def __call__(self) -> float:
        return self.now

    @staticmethod
    def step_seconds(spec: bool, bs: int) -> float:
        return (2e-3 + 0.5e-3 * bs) if spec else (1.5e-3 + 0.1e-3 * bs)


class AutoDriver(ol.OverlapDriver):
    """The overlap loop with the switch's run_batch and process_batch_result hooks (AROUND), as install_switch
    registers them for SPECFLIP_SWITCH=auto."""

    clock: StepClockCpuStandIn

    @contextlib.contextmanager
    def _installed(self) -> Iterator[None]:
        saved, switch_v2._RUNTIME = switch_v2._RUNTIME, self.switch
        try:
            yield
        finally:
            switch_v2._RUNTIME = saved

    def run_batch(self, batch: Any) -> Any:
        with self._installed():
            out = switch_v2._run_batch_around(ol.OverlapDriver.run_batch, self, batch)
        if batch.forward_mode.is_decode():
            self.clock.now += self.clock.step_seconds(not batch.spec_algorithm.is_none(), batch.batch_size())
        elif batch.forward_mode.is_extend():
            self.clock.now += getattr(self.clock, "prefill_s_per_token", 0.0) * int(batch.extend_num_tokens or 0)
        return out

    def process_batch_result(self, batch: Any, result: Any) -> None:
        with self._installed():
            switch_v2._process_result_around(ol.OverlapDriver.process_batch_result, self, batch, result)


def auto_driver(model_dir: Path) -> AutoDriver:
    config = SwitchConfig(t_off=0, t_on=0, auto=True, draft_while_off="retract", spec_cap=16)
    drv = AutoDriver(ol.overlap_pools(model_dir), AUTO_RETRACT_CATCH_UP, switch_config=config)
    drv.clock = StepClockCpuStandIn()
    drv.switch.policy.auto = auto_switch.AutoSwitch(spec_cap=16, window=2, state=ap.initial_state(PARAMS),
                                                    clock=drv.clock)
    drv.accepts = gf.accept_cycle([2, 1, 3, 2])
    return drv


def flips_of(drv: AutoDriver) -> list[dict[str, Any]]:
    return [e for e in drv.switch.trace.events if e["action"] in ("flip_off", "flip_on")]


def test_auto_flips_where_its_observations_say(runtime: Any, model_dir: Path) -> None:
    """Phases of one or two requests and of eight, refilled as they finish: the auto switch learns the synthetic
    step times through the real hooks and ends each phase in the mode that wins there (speculation for one or two
    requests, plain for eight), flipping on the numbers; outputs greedy-exact, the guard (assert mode, design
    plain_off_retract_catch_up_auto under overlap) finds nothing, every flip is traced with the learner's inputs."""
    gf.configure_guard(runtime, AUTO_RETRACT_CATCH_UP)
    drv = auto_driver(model_dir)
    auto = drv.switch.policy.auto
    phases = [(2, 60), (8, 70), (1, 60), (8, 70), (2, 60)]
    reqs, last_iterations = drive_phases(drv, phases)
    # (phase's last iteration, the mode that should win there)
    ends = [(it, concurrency < 4) for it, (concurrency, _) in zip(last_iterations, phases, strict=True)]
    guard = runtime.guard
    assert guard.config.design.name == DESIGNS_BY_NAME[f"{AUTO_RETRACT_CATCH_UP.name}_overlap"].name
    assert guard.found == [] and ol_greedy(reqs) == []
    for iteration, spec_wins in ends[1:]:  # the first phase starts on speculation anyway
        assert spec_on_at(drv, iteration) is spec_wins
    flips = flips_of(drv)
    assert {f["reason"] for f in flips} & {"measured", "prior"} and drv.switch.policy.refused == 0
    assert all(f["policy"] == "auto" and "digest" in f and "demand" in f for f in flips)
    assert auto.agreements > 0 and auto.state.step > 0 and auto.accept_mean > 1.0  # verify accepts were read
    assert len(flips) <= 4 * len(ends)  # no thrash: a few flips per phase at most


PREFILL_S = 2e-4  # the stand-in clock's prefill time per token: a catch-up of a few requests costs tens of ms


def test_a_flip_on_with_requests_running_learns_its_catch_up_and_then_waits_for_it_to_pay(
        runtime: Any, model_dir: Path) -> None:
    """Phases whose requests finish one by one, so the flips on come with requests running: each retracts them, and
    the learner records the catch-up (the retracted requests' prompt and output tokens, the seconds from the flip to
    the first speculative decode: the stand-in clock's prefill time per token, so nothing else is timed).
    Then, with a catch-up the learner holds to cost a second per token, draining bursts keep plain decoding while
    requests run where the numbers alone would flip on. Outputs greedy-exact, the guard (assert) finds nothing."""
    gf.configure_guard(runtime, AUTO_RETRACT_CATCH_UP)
    drv = auto_driver(model_dir)
    drv.clock.prefill_s_per_token = PREFILL_S
    auto = drv.switch.policy.auto
    reqs, _ = drive_phases(drv, [(2, 40), (8, 50), (1, 30), (8, 50)])

    def flips_on_with_requests_running(since: int = 0) -> list[dict[str, Any]]:
        return [f for f in flips_of(drv)[since:] if f["action"] == "flip_on" and f["running"] > 0]

    under_load = flips_on_with_requests_running()
    assert under_load and all(f["retracted"] == f["running"] for f in under_load)
    # one catch-up learned per flip-on with requests running, at the prefill clock's 200 us per re-prefilled token
    # (a flip-on undone before its first speculative decode, or followed by an idle spell, times nothing); waiting
    # requests admitted into the re-prefill's batch count their tokens too (one flip-on here: 180 retracted + 54)
    assert auto.state.catch_up is not None and 1 <= auto.state.catch_up.samples <= len(under_load)
    assert auto.state.catch_up.seconds_for(1000) == pytest.approx(PREFILL_S * 1000)

    # a catch-up of a second per token (catch-ups of 1,000 tokens in 1,000 s), learned long ago: a flip-on with
    # requests running never pays for it now
    auto.state = attrs.evolve(auto.state, catch_up=ap.CatchUpCost(samples=100, updated=auto.state.step, tokens=1000.0,
                                                                  seconds=1000.0, tokens_sq=1e6, tokens_seconds=1e6))
    learned = len(flips_of(drv))
    for k in range(3):  # bursts of 8 whose requests finish one by one (6, 11, ... 41 tokens)
        wave = [h.make_req(f"e{k}_{i}", gf.SYSTEM_PROMPT + [500 + 8 * k + i] * 3, max_new_tokens=6 + 5 * i)
                for i in range(8)]
        reqs += wave
        drv.add(wave)
        drv.run_until_idle(max_iterations=400)
    # the numbers wanted speculation with requests running and waited; what still flipped on under load was the
    # prior (a mode not known yet at that demand) or a probe, which learn what the numbers do not know
    assert auto.catch_up_holds > 0
    assert {f["reason"] for f in flips_on_with_requests_running(learned)} <= {"prior", "probe", "probe_end"}
    assert runtime.guard.found == [] and ol_greedy(reqs) == [] and drv.switch.policy.refused == 0


def drive_phases(drv: Any, phases: list[tuple[int, int]]) -> tuple[list[Any], list[int]]:
    """Phases of (concurrency, iterations): each iteration tops the requests in flight up to the phase's concurrency
    with new ones (12 tokens each, on the shared system prompt), then runs; then until idle. Returns every request
    and each phase's last iteration."""
    reqs: list[Any] = []
    ends: list[int] = []
    for phase, (concurrency, length) in enumerate(phases):
        for _ in range(length):
            live = [r for r in reqs if not r.finished()]
            wave = [h.make_req(f"p{phase}_{len(reqs) + i}", gf.SYSTEM_PROMPT + [300 + len(reqs) + i] * 3,
                               max_new_tokens=12) for i in range(concurrency - len(live))]
            reqs += wave
            drv.add(wave)
            drv.iteration()
        ends.append(drv.iteration_no)
    drv.run_until_idle()
    return reqs, ends


def ol_greedy(reqs: list[Any]) -> list[str]:
    return [str(r.rid) for r in reqs if not r.finished() or list(r.output_ids) != ol.expected_output(r)]


def spec_on_at(drv: Any, iteration: int) -> bool:
    on = True
    for it, action in drv.flips:
        if it <= iteration:
            on = action == "flip_on"
    return on


# --- two ranks ----------------------------------------------------------------------------------------------


def run_two_ranks(tmp_path: Path, agree: bool) -> dict[int, list[Any]]:
    """Two rank processes (tests/auto_rank_worker.py, a fresh interpreter each, the repo on its path: the suite's
    own sys.path edits do not leak into them), a gloo group between them through a file store."""
    import json
    import os
    import subprocess

    init = tmp_path / f"init-{agree}"
    traces = tmp_path / f"traces-{agree}"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "stand_ins" / "cpu"), str(root)])}
    procs = [subprocess.Popen([sys.executable, str(root / "tests" / "auto_rank_worker.py"), str(r), str(init),
                               "1" if agree else "0", str(traces), str(tmp_path / f"out-{agree}-{r}.json")], env=env)
             for r in range(2)]
    for p in procs:
        assert p.wait(timeout=300) == 0
    return {r: [tuple(x) for x in json.loads((tmp_path / f"out-{agree}-{r}.json").read_text())] for r in range(2)}


def test_two_ranks_agree_on_every_decision(tmp_path: Path) -> None:
    """With the window's step times all-reduced (MAX) over a real gloo group, two ranks whose clocks differ take the
    same decision at every scheduling point and end with the same learner state; without the collective (each rank
    its own seconds) they diverge: the agreement is what makes them equal."""
    agreed = run_two_ranks(tmp_path, agree=True)
    assert agreed[0] == agreed[1]
    assert sum(1 for _, action, _, _ in agreed[0] if action) >= 2
    apart = run_two_ranks(tmp_path, agree=False)
    assert apart[0] != apart[1]
    # the per-rank switch traces say the same: `specflip ranks` (specflip.ranks.check_switch_agreement)
    same = check_switch_agreement(sorted((tmp_path / "traces-True").glob("*.jsonl")))
    assert same.agree and same.ranks == (0, 1) and same.ranks_from == RANKS_FROM_FIELD and same.records_compared > 100
    split = sorted((tmp_path / "traces-False").glob("*.jsonl"))
    diverged = check_switch_agreement(split)
    assert not diverged.agree and "diverged first" in diverged.describe()
    assert cli_main(["ranks", *map(str, split)]) == 1
    assert cli_main(["ranks", *map(str, sorted((tmp_path / "traces-True").glob("*.jsonl")))]) == 0
    # the pair shipped for `specflip ranks` (specflip/examples/ranks) is this run's, record for record but the wall
    # clock's `t`
    shipped = Path(__file__).resolve().parents[1] / "specflip" / "examples" / "ranks"
    for rank in range(2):
        fresh = next((tmp_path / "traces-True").glob(f"switch-rank{rank}-*.jsonl"))
        assert without_t(fresh) == without_t(shipped / f"switch-rank{rank}.jsonl")


def without_t(path: Path) -> list[dict[str, Any]]:
    import json

    return [{k: v for k, v in json.loads(line).items() if k != "t"} for line in path.read_text().splitlines()]


def test_ranks_bad_input_is_one_line(tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    good = tmp_path / "switch-1.jsonl"
    good.write_text('{"t": 1, "action": "flip_off", "running": 5, "waiting": 0, "chunked": 0}\n')
    assert cli_main(["ranks", str(bad), str(good)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specflip ranks:") and "not JSON" in err and "\n" not in err
    assert cli_main(["ranks", str(good)]) == 2  # one rank: nothing to compare
    assert "need at least two switch traces" in capsys.readouterr().err
    guard = tmp_path / "guard.jsonl"
    guard.write_text('{"kind": "header", "rank": 0}\n')
    assert cli_main(["ranks", str(good), str(guard)]) == 2
    assert "not a switch trace" in capsys.readouterr().err
    auto = tmp_path / "auto.jsonl"  # an auto trace (rank field) with a threshold one (none): not one run
    auto.write_text('{"t": 1, "action": "auto_observe", "rank": 1, "n": 8}\n')
    assert cli_main(["ranks", str(good), str(auto)]) == 2
    assert "has a rank field" in capsys.readouterr().err


def _batch(mode: str, bs: int) -> Any:
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    batch = ScheduleBatch(reqs=[h.make_req(f"r{i}", [1, 2, 3]) for i in range(bs)], batch_is_full=False)
    batch.forward_mode = ForwardMode.EXTEND if mode == "prefill" else ForwardMode.DECODE
    batch.spec_algorithm = SpeculativeAlgorithm.EAGLE3 if mode == "spec" else SpeculativeAlgorithm.NONE
    return batch


def test_which_intervals_are_observed() -> None:
    """Decode to decode in one mode: a step (a prefill between stays in it); across a flip or an idle iteration:
    not; accept lengths only from a host tensor (a device one would need a sync), only for decode results."""
    import torch

    t = [0.0]
    auto = auto_switch.AutoSwitch(spec_cap=48, window=100, clock=lambda: t[0])
    sched = object()
    for mode, bs, dt, flips in [("spec", 4, 0.010, 0), ("spec", 4, 0.012, 0), ("prefill", 2, 0.005, 0),
                                ("spec", 6, 0.020, 0), ("plain", 6, 0.002, 1), ("plain", 6, 0.003, 1)]:
        auto.on_run_batch(sched, _batch(mode, bs), flips)
        t[0] += dt
    auto.on_idle()
    auto.on_run_batch(sched, _batch("plain", 1), 1)
    # (spec, 4) 10 ms; (spec, 4) 12 + 5 ms of prefill; the flip cuts spec 6 -> plain 6; (plain, 6) 2 ms; idle cuts
    assert auto.pending == [(True, 4), (True, 4), (False, 6)]
    assert [round(s, 6) for s in auto.seconds] == [0.010, 0.017, 0.002]
    auto.on_result(_batch("spec", 3), type("Result", (), {"accept_lens": torch.tensor([2, 3, 1])})())
    auto.on_result(_batch("prefill", 3), type("Result", (), {"accept_lens": torch.tensor([9, 9, 9])})())
    auto.on_result(_batch("spec", 2), type("Result", (), {"accept_lens": torch.empty(2, device="meta")})())
    assert (auto.accept_tokens, auto.accept_rows) == (6, 3)
    auto.agree(sched)
    assert auto.accept_mean == 2.0 and auto.state.step == 3 and auto.pending == [] and auto.agreements == 1


def test_a_window_tells_the_learner_its_verify_results_and_whether_a_request_finished(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each agreed window's observations carry the verify results behind its accept length (`rows`) and whether a
    processed verify held a finished request (real `Req`s, one finished by length as SGLang marks it): what
    `observe`'s shift rule weighs (tests/test_auto_h100_1009c9d.py). A plain result is not a verify's."""
    import torch

    observed: list[ap.Observation] = []
    real_observe = ap.observe
    monkeypatch.setattr(ap, "observe", lambda state, obs: observed.append(obs) or real_observe(state, obs))
    t = [0.0]
    auto = auto_switch.AutoSwitch(spec_cap=48, window=2, clock=lambda: t[0])
    sched = object()

    def two_steps() -> None:  # the second ends the window of 2: its agreement
        for _ in range(2):
            auto.on_run_batch(sched, _batch("spec", 2), 0)
            t[0] += 0.01
    two_steps()
    observed.clear()
    for finish in (False, True):
        done = _batch("plain", 2)
        h.finish_req(done.reqs[0])
        auto.on_result(done, None)  # a plain result with a finished request: not a verify's
        batch = _batch("spec", 2)
        if finish:
            h.finish_req(batch.reqs[1])
        auto.on_result(batch, type("Result", (), {"accept_lens": torch.tensor([2, 3])})())
        auto.on_result(_batch("spec", 2), type("Result", (), {"accept_lens": torch.tensor([1, 2])})())
        two_steps()
    assert [(o.rows, o.finished) for o in observed] == [(4, False)] * 2 + [(4, True)] * 2
    # the trace's view of the learner's accept length after the window: [estimate, run, spread]
    assert list(auto.accept_learned()) == ["spec"] and auto.accept_learned()["spec"][0] == auto.state.accept.mean


def test_the_trace_records_each_change_of_decision_once() -> None:
    """`auto_decide`: a record where the decision differs from the one before it (reason, wanted flip, action,
    incumbent), none for a repeat: between flips it shows what the learner wanted and what held the flip."""
    state = ap.initial_state(PARAMS)
    for spec_on, seconds in [(True, 0.0125)] * 8 + [(False, 0.0052)] * 8:
        state = ap.observe(state, ap.Observation(spec_on, 48, 48 * (2.0 if spec_on else 1.0), seconds))
    auto = auto_switch.AutoSwitch(spec_cap=48, window=8, state=attrs.evolve(state, flip_step=state.step))
    trace = ol.RecordedSwitchTrace()
    keys = []
    for demand in [48, 48, 48, 2, 2, 48]:
        d = auto.decide(True, demand, 0)
        auto.trace_decision(trace, demand, 0)
        keys.append((d.reason, d.wants_flip, d.action, d.incumbent))
        auto.commit(d)
    changes = [k for i, k in enumerate(keys) if i == 0 or k != keys[i - 1]]
    assert [(e["reason"], e["wants_flip"], e["flip"]) for e in trace.events] == [k[:3] for k in changes]
    assert keys[0] == ("dwell", True, None, 1) and len(trace.events) < len(keys)
    assert all(e["action"] == "auto_decide" and {"demand", "running", "want_since", "flip_step", "spec_value",
                                                 "plain_value"} <= e.keys() for e in trace.events)


def test_accept_lengths_across_the_overlap_schedule() -> None:
    """Under the overlap schedule a step's verify result is processed after the next step launched, so a window can
    close before any of its speculative steps' results are in (here: a window of 2 right after a flip on). Its
    steps then give their seconds only, not the last agreed accept length (1.0 before any, or the previous
    mode's): the learner's accept length is the verify results' own mean, 2.0, and speculation's value at batch 1
    is 2 tokens per 6 ms step. Before the fix the first window fed 1.0 (the default) as these steps' accept."""
    import torch

    t = [0.0]
    auto = auto_switch.AutoSwitch(spec_cap=48, window=2, clock=lambda: t[0])
    sched = object()
    result = type("Result", (), {"accept_lens": torch.tensor([2])})()
    windows: list[dict[str, Any]] = []
    trace = type("TraceRecorder", (), {"event": lambda self, action, **kw: windows.append(kw)})()
    prev: Any = None
    for _ in range(20):  # the overlap loop: launch step N, then process step N-1's result
        batch = _batch("spec", 1)
        auto.on_run_batch(sched, batch, 0, trace)
        if prev is not None:
            auto.on_result(prev, result)
        prev = batch
        t[0] += 0.006
    # the first window closed before any result: no accept length; every later one: the results' own, 2.0
    assert [w["accept_mean"] for w in windows] == [None] + [2.0] * 9
    assert auto.state.accept is not None and auto.state.accept.mean == 2.0
    assert ap.value(auto.state, True, 1, 48) == pytest.approx(2 / 0.006)


# --- issue 52: acceptance that shifts, the context -----------------------------------------------------------


def test_unpredictable_requests_flip_plain_and_predictable_ones_are_rechecked_back(
        runtime: Any, model_dir: Path) -> None:
    """Issue 52 through the real hooks: two requests at a time drafting at 2-3 (speculation wins by the stand-in
    clock), then requests the draft cannot predict (accept 1.0: every verify accepts only its bonus token, and
    speculation's step yields one token for more time than plain's), then predictable ones again. The switch reads
    the verify results' `accept_lens` from the real batch results, flips plain on the numbers, and, no plain step
    showing the accept length, flips speculation back on with a recheck (reason `recheck`) once predictable requests
    return, and holds it. Each decision is valued at the running requests' context (prompt and output tokens per
    request, `batch_context`), which the trace records. Outputs greedy-exact, the guard (assert) finds nothing."""
    gf.configure_guard(runtime, AUTO_RETRACT_CATCH_UP)
    drv = auto_driver(model_dir)
    auto = drv.switch.policy.auto
    # a recheck of 5 learner steps runs 6 decode steps in windows of 2 (AutoParams.recheck_span), as 6 did before the
    # learner priced it by its windows (0a54b11)
    auto.state = ap.initial_state(attrs.evolve(PARAMS, recheck_steps=5, agree_window=auto.window))
    reqs: list[Any] = []
    ends: list[int] = []
    for accepts in ([2, 3, 2, 3], [1], [2, 3, 2, 3]):
        drv.accepts = gf.accept_cycle(accepts)
        more, last = drive_phases(drv, [(2, 160)])
        reqs += more
        ends += last
    assert runtime.guard.found == [] and ol_greedy(reqs) == [] and drv.switch.policy.refused == 0
    assert not spec_on_at(drv, ends[1]) and spec_on_at(drv, ends[2])  # plain for accept 1.0, speculation after
    flips = flips_of(drv)
    rechecks = [f for f in flips if f["reason"] == "recheck"]
    assert rechecks and auto.state.rechecks == len(rechecks)
    # no thrash while the requests stay unpredictable: the flips there are the drop's and the rechecks' (each a flip
    # on and its return)
    assert len([it for it, _ in drv.flips if ends[0] < it <= ends[1]]) <= 2 * auto.state.rechecks + 2
    # the context: prompt (the system prompt and 3 tokens) and output (at most 12) tokens per request
    prompt = len(gf.SYSTEM_PROMPT) + 3
    assert all(f["context"] is not None and prompt <= f["context"] <= prompt + 12 for f in rechecks)
    assert all(f["context"] is None or prompt <= f["context"] <= prompt + 12 for f in flips)


# --- issue 52: a decision is valued at the batch that runs next ---------------------------------------------------


def long_prompt(tag: int, tokens: int) -> list[int]:
    """A prompt of `tokens` tokens (the shared system prompt, then ids below the tiny model's vocabulary)."""
    return gf.SYSTEM_PROMPT + [200 + (tag * 37 + i) % 700 for i in range(tokens - len(gf.SYSTEM_PROMPT))]


def test_a_decision_is_valued_at_the_longest_running_or_waiting_request(runtime: Any, model_dir: Path) -> None:
    """Through the real `plain_path_flip`: two short requests decode, then a request with a 400-token prompt arrives.
    The decision at the scheduling point where it waits (the running batch still short) is valued at its prompt, not
    at the last decode batch's context (the short requests'); at every scheduling point the context is the longest
    unfinished request's (running, prefilled, or waiting), which with nothing waiting is the running batch's own;
    during a hold (the demand below its peak) the held batch's, where that is longer (`AutoState.peak_context`).
    Outputs greedy-exact, the guard (assert) finds nothing."""
    gf.configure_guard(runtime, AUTO_RETRACT_CATCH_UP)
    drv = auto_driver(model_dir)
    auto = drv.switch.policy.auto
    reqs = [h.make_req(f"s{i}", gf.SYSTEM_PROMPT + [300 + i] * 3, max_new_tokens=40 + 4 * i) for i in range(2)]
    # (the decision's context, the last decode batch's, the waiting requests' contexts, the longest unfinished's)
    seen: list[tuple[float | None, float | None, list[float], float]] = []
    held: list[bool] = []  # per scheduling point: the hold valued a load above the demand
    decide = auto.decide

    def recording_decide(*args: Any, **kwargs: Any) -> ap.Decision:
        d = decide(*args, **kwargs)
        live = [auto_switch.request_context(r) for r in reqs if not r.finished()]
        seen.append((d.context, auto.context, [auto_switch.request_context(r) for r in drv.waiting],
                     max(live, default=0.0)))
        held.append(d.load > d.demand)
        return d

    auto.decide = recording_decide  # type: ignore[method-assign]
    drv.add(reqs)
    for _ in range(8):
        drv.iteration()
    long = h.make_req("long", long_prompt(0, 400), max_new_tokens=8)
    reqs.append(long)
    arrived = len(seen)
    drv.add([long])
    drv.run_until_idle()
    assert runtime.guard.found == [] and ol_greedy(reqs) == [] and drv.switch.policy.refused == 0
    # (a) where it waits beside the short running batch: valued at its prompt, not the last decode batch's context
    ctx, last_decode, waiting, _ = seen[arrived]
    assert waiting == [400.0] and last_decode is not None and last_decode < 100 and ctx == 400.0
    # every scheduling point with a request in flight: the longest of them, running or waiting
    assert all(ctx == longest if not hold else ctx is not None and ctx >= longest
               for (ctx, _, _, longest), hold in zip(seen, held, strict=True) if longest > 0)
    assert any(not hold for hold in held)
    # (b) nothing waiting: the running batch's longest request (prompt and output), as it grows: the last decode
    # batch's context and the tokens committed since (at most num_steps + 1 = 4 a request); the first, after the
    # prefill, had no decode before it
    steady = [(ctx, last) for ctx, last, waiting, longest in seen[:arrived] if not waiting and longest > 0]
    assert len(steady) >= 6 and len({ctx for ctx, _ in steady}) > 1 and steady[0][1] is None
    assert all(last is not None and 0 <= ctx - last <= 4 for ctx, last in steady[1:])
    # once the long request finished: the short ones' again, not the 400-token request's
    assert seen[-1][0] is not None and seen[-1][0] < 100


def test_eight_long_prompts_arriving_after_a_short_phase_are_valued_long(runtime: Any, model_dir: Path) -> None:
    """The H100's c8_long (2026-12-06, 0b48981): a short phase ends (its last decode batch's context is short), then 8
    requests of 2,000-3,500-token prompts wait. The learner knows both contexts at 8 requests, as it did there:
    at short contexts speculation 1,982 tok/s against plain's 1,444, at long ones 366.7 against 1,102.9. The real
    `plain_path_flip` (decide only) values the waiting requests at their longest prompt and flips speculation off at
    once (a clear win); valued at the last decode batch's context, as before, it kept speculation. The same state
    with 8 short requests waiting keeps speculation."""
    from shim.switch import core
    from shim.switch import v2 as switch_v2

    gf.configure_guard(runtime, AUTO_RETRACT_CATCH_UP)
    drv = auto_driver(model_dir)
    auto = drv.switch.policy.auto
    reqs, _ = drive_phases(drv, [(2, 30)])  # the short phase, through the real hooks, then idle
    assert runtime.guard.found == [] and ol_greedy(reqs) == []
    short = auto.context
    assert short is not None and short < 100 and drv.switch.policy.spec_on
    # the estimates at 8 requests: (context, speculation's tok/s, plain's), accept length 2
    state = ap.initial_state(PARAMS)
    for context, spec_tps, plain_tps in [(40.0, 1982.0, 1444.0), (2800.0, 366.7, 1102.9)]:
        for spec_on, tps in [(True, spec_tps)] * 8 + [(False, plain_tps)] * 8:
            tokens = 8 * (2.0 if spec_on else 1.0)
            state = ap.observe(state, ap.Observation(spec_on, 8, tokens, tokens / tps, context=context))
    auto.state = attrs.evolve(state, incumbent=ap.PLAIN + 1, flip_step=state.step, peak=0, want_since=None)

    def decide_with_waiting(prompts: list[int]) -> str | None:
        drv.waiting = [h.make_req(f"w{i}", long_prompt(i, n), max_new_tokens=8) for i, n in enumerate(prompts)]
        try:
            return core.plain_path_flip(drv.switch, switch_v2.SIDE, drv, drv.running, drv.last_batch,
                                        decide_only=True)
        finally:
            drv.waiting = []

    longs = [2000 + 214 * i for i in range(8)]  # 2,000 to 3,498 tokens
    assert decide_with_waiting(longs) == "flip_off"
    d = auto.last
    assert d.context == max(longs) and d.reason == "measured" and d.plain_value > d.spec_value
    assert decide_with_waiting([30] * 8) is None
    d = auto.last
    assert d.context == 30 and d.reason == "measured" and d.spec_value > d.plain_value


def steps(state: ap.AutoState, accept: float, spec_on: bool, count: int,
          coverage: float | None = None) -> ap.AutoState:
    """`state` after `count` observed steps of 2 requests (speculative at `accept`, 7.2 ms; plain, 5.7 ms), each with
    the draft vocabulary's `coverage` (None: no signal)."""
    for _ in range(count):
        state = ap.observe(state, ap.Observation(spec_on, 2, 2 * accept if spec_on else 2.0,
                                                 0.0072 if spec_on else 0.0057, coverage=coverage))
    return state


def test_the_switch_stamps_each_request_with_the_step_it_first_saw_it_and_a_recheck_waits_for_new_ones() -> None:
    """`AutoSwitch.decide` with the next batch's rids (`request_ids`, host lists every rank holds alike): each request
    keeps the learner step of the first decision that saw it, finished ones are dropped, and the decision is given
    those steps as arrivals: plain held at a fallen accept length does not recheck the requests speculation drafted
    (they arrived before it last drafted), though the steps now afford a recheck, and does at the scheduling point
    where new ones wait."""
    auto = auto_switch.AutoSwitch(spec_cap=48, state=steps(steps(ap.initial_state(), 2.0, True, 80), 1.0, True, 32))
    assert auto.state.params.agree_window == auto.window == auto_switch.AGREE_WINDOW
    auto.decide(True, 2, 0, rids=["a", "b"])  # speculation drafts a and b (at 1.0)
    arrived = auto.state.step
    auto.state = steps(auto.state, 1.0, True, 8)
    auto.state = attrs.evolve(steps(auto.state, 1.0, False, 400), incumbent=ap.PLAIN, flip_step=auto.state.step)
    held = auto.decide(False, 2, 0, rids=["a", "b"])  # a and b still running, plain since: stamped as they were
    assert auto.first_seen == {"a": arrived, "b": arrived}
    assert held.action is None and held.reason == "measured", held
    assert ap.decide(auto.state, False, 2, 2, 48).reason == "recheck"  # the steps alone would recheck here
    new = auto.decide(False, 0, 2, rids=["c", "d"])  # a wave's admission: a and b gone, c and d new
    assert auto.first_seen == {"c": auto.state.step, "d": auto.state.step}
    assert new.action == ap.FLIP_ON and new.reason == "recheck", new
    assert auto_switch.request_ids([type("R", (), {"rid": 7})()], [type("R", (), {"rid": "w"})()]) == ["7", "w"]


def test_a_recheck_weighs_the_coverage_of_the_requests_it_would_measure() -> None:
    """`AutoSwitch` counts each request's coverage (hits and tokens, `request_cover`) from the decode results it
    processes and gives plain decisions the next batch's own (`batch_coverage`): the requests that finished are dropped,
    waiting ones count none. After unpredictable requests (outputs outside the draft's vocabulary) flipped plain,
    predictable ones arriving make the recheck due at the scheduling point where they have committed
    `batch_cover_tokens` (4: here two plain steps of two requests), between two agreements (the window's coverage, which
    the learner weighs otherwise, still blends in the requests before them); before that the steps' coverage decides
    (none due), and requests as unpredictable as the last spend none. Under speculation nothing is summed; with no draft
    vocabulary nothing is counted."""
    state = steps(steps(ap.initial_state(), 2.0, True, 80, 1.0), 1.0, True, 32, 0.0)
    state = attrs.evolve(steps(state, 1.0, False, 100, 0.0), incumbent=ap.PLAIN, flip_step=state.step)

    def plain_steps(auto: auto_switch.AutoSwitch, reqs: list[Any], token: int, count: int) -> None:
        batch = _batch("plain", len(reqs))
        batch.reqs = reqs
        for _ in range(count):
            for req in reqs:
                req.output_ids.append(token)
            auto.on_result(batch, type("Result", (), {"accept_lens": None})())

    for vocab in (frozenset(range(4)), None):
        auto = auto_switch.AutoSwitch(spec_cap=48, state=state)
        auto.vocab = vocab
        old = [h.make_req("a", [1, 2, 3]), h.make_req("b", [1, 2, 3])]
        plain_steps(auto, old, 9, 5)  # unpredictable: outside the vocabulary
        held = auto.decide(False, 2, 0, rids=["a", "b"])
        assert (held.action, held.reason, auto.batch_cover) == (None, "measured", (0, 10) if vocab else None), held
        new = [h.make_req("c", [1, 2, 3]), h.make_req("d", [1, 2, 3])]
        assert auto.decide(False, 0, 2, rids=["c", "d"]).action is None  # admitted: nothing committed yet
        assert auto.batch_cover == ((0, 0) if vocab else None) and "a" not in auto.request_cover
        plain_steps(auto, new, 1, 1)  # predictable: 2 tokens, under batch_cover_tokens
        assert auto.decide(False, 2, 0, rids=["c", "d"]).action is None and auto.state.coverage.mean < 0.01
        plain_steps(auto, new, 1, 1)
        d = auto.decide(False, 2, 0, rids=["c", "d"])
        if vocab is None:
            assert (d.action, d.reason, auto.request_cover) == (None, "measured", {}), d
            continue
        assert (d.action, d.reason, auto.batch_cover) == (ap.FLIP_ON, "recheck", (4, 4)), d
        assert auto.trace_fields()["batch_coverage"] == [4, 4]
        assert ap.decide(auto.state, False, 2, 2, 48).action is None  # the steps' coverage alone: not due
        assert auto.decide(True, 2, 0, rids=["c", "d"]) and auto.batch_cover is None  # speculating: not summed
        others = [h.make_req("e", [1, 2, 3]), h.make_req("f", [1, 2, 3])]
        plain_steps(auto, others, 9, 2)  # as unpredictable as the last: the batch's own bound rules the recheck out
        assert auto.decide(False, 2, 0, rids=["e", "f"]).action is None and auto.batch_cover == (0, 4)


# --- issue 52: the draft vocabulary's coverage of the committed tokens ---------------------------------------------


def eagle3_draft_hot_token_ids(d2t: list[int]) -> Any:
    """The real EAGLE-3 draft model's `hot_token_id` from its checkpoint's `d2t` buffer: SGLang's own
    `LlamaForCausalLMEagle3.load_weights` (draft id + d2t = target id) on the model class, its layers not built
    (they need a TP group and weights; `load_weights` reads only its parameters, none here, for `d2t`)."""
    import torch
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    model = object.__new__(LlamaForCausalLMEagle3)
    torch.nn.Module.__init__(model)
    model.hot_token_id = None
    model.load_weights([("d2t", torch.tensor(d2t, dtype=torch.int64)),
                        ("t2d", torch.zeros(len(d2t), dtype=torch.bool))])
    return model.hot_token_id


def eagle_worker_v2_over(hot_token_id: Any, target_vocab: int) -> Any:
    """A real `EAGLEWorkerV2` and its real `EagleDraftWorker`, their `__init__` not run (it builds model runners on
    a GPU): the draft worker holds `hot_token_id` where SGLang's `init_lm_head` / `init_token_map` leave it before
    the worker's CUDA graphs; the target worker (a TpModelWorker, stood in) its `model_config.vocab_size`."""
    from types import SimpleNamespace

    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

    draft = object.__new__(EagleDraftWorker)
    draft.hot_token_id = hot_token_id
    worker = object.__new__(EAGLEWorkerV2)
    worker._draft_worker = draft
    worker._target_worker = SimpleNamespace(model_config=SimpleNamespace(vocab_size=target_vocab))
    return worker


def test_the_draft_vocabulary_is_read_at_start_up_from_sglangs_hot_token_ids(tmp_path: Path) -> None:
    """The switch reads the draft's vocabulary once, as target ids: from an EAGLE-3 draft's `d2t` (SGLang's own
    `load_weights`: the benchmark's counter draft has d2t all 0, ids 0..1,023 of 2,048; here 8 of 16, half of them
    shifted) and from a `--speculative-token-map` file (SGLang's own `load_token_map`); none where the draft holds
    the target's whole vocabulary or has no map (no signal). Through the real hook (`_init_cuda_graphs_after`, the
    plain runner's capture, which needs a GPU, replaced): the auto switch holds it, the trace says its size."""
    from sglang.srt.speculative.spec_utils import load_token_map

    hot = eagle3_draft_hot_token_ids([0, 0, 0, 0, 8, 8, 8, 8])
    assert auto_switch.draft_vocabulary(eagle_worker_v2_over(hot, 16)) == frozenset({0, 1, 2, 3, 12, 13, 14,
                                                                                             15})
    full = eagle3_draft_hot_token_ids([0] * 16)
    assert auto_switch.draft_vocabulary(eagle_worker_v2_over(full, 16)) is None
    assert auto_switch.draft_vocabulary(eagle_worker_v2_over(None, 16)) is None
    import torch

    torch.save([5, 9, 11], tmp_path / "hot.pt")
    mapped = load_token_map(str(tmp_path / "hot.pt"))
    assert auto_switch.draft_vocabulary(eagle_worker_v2_over(mapped, 16)) == frozenset({5, 9, 11})

    saved, capture = switch_v2._RUNTIME, switch_v2.capture_plain_decode_runner
    events: list[tuple[str, dict[str, Any]]] = []
    try:
        switch_v2.install_switch(type("Registry", (), {"register": lambda *a: None})(),
                                 SwitchConfig.from_env({"SPECFLIP_SWITCH": "auto"}))
        rt = switch_v2.runtime()
        rt.trace = type("TraceRecorder", (), {"event": lambda self, a, **kw: events.append((a, kw)),
                                              "enabled": True})()
        switch_v2.capture_plain_decode_runner = lambda worker, runtime: None
        switch_v2._init_cuda_graphs_after(None, eagle_worker_v2_over(hot, 16))
        assert rt.policy.auto.vocab == frozenset({0, 1, 2, 3, 12, 13, 14, 15})
        assert ("auto_draft_vocabulary", {"size": 8}) in events
    finally:
        switch_v2._RUNTIME, switch_v2.capture_plain_decode_runner = saved, capture


def test_the_coverage_counts_the_tokens_each_result_committed() -> None:
    """Per processed result, from the requests' host lists: a plain step's newest token per request, a verify's last
    `accept_lens` tokens per request (its accepted drafts and bonus), a prefill's first output tokens (not a chunk's
    that commits none, nor the tokens of requests past their first); device tensors and rows that do not match are
    not counted. The window's share is agreed and given to the learner with each step
    (`Observation.coverage`), which keeps it (`AutoState.coverage`) and the share its accept length was measured at
    (`accept_cover`); with no draft vocabulary (None) nothing is counted and the learner sees no signal."""
    import torch

    t = [0.0]
    windows: list[dict[str, Any]] = []
    trace = type("TraceRecorder", (), {"event": lambda self, action, **kw: windows.append(kw)})()
    for vocab in (frozenset(range(4)), None):
        auto = auto_switch.AutoSwitch(spec_cap=48, window=2, clock=lambda: t[0])
        auto.vocab = vocab
        reqs = [h.make_req("a", [1, 2, 3]), h.make_req("b", [1, 2, 3])]
        reqs[0].output_ids, reqs[1].output_ids = [9, 1], [9, 9]
        # a request finished at the step before (under the overlap schedule still in the batch) and a retracted one:
        # their results commit nothing
        done, retracted = h.make_req("c", [1, 2, 3]), h.make_req("d", [1, 2, 3])
        done.output_ids, retracted.output_ids = [0, 0], [2]
        h.finish_req(done)
        retracted.is_retracted = True
        plain = _batch("plain", 2)
        plain.reqs = reqs + [done, retracted]
        auto.on_result(plain, type("Result", (), {"accept_lens": None})())  # newest: 1 in, 9 out
        assert (auto.cover_hits, auto.cover_tokens) == ((1, 2) if vocab else (0, 0))
        spec = _batch("spec", 2)
        spec.reqs = reqs + [done, retracted]
        reqs[0].output_ids += [3, 2, 0]
        reqs[1].output_ids += [9]
        auto.on_result(spec, type("Result", (), {"accept_lens": torch.tensor([3, 1, 2, 1])})())  # 3, 2, 0 and 9: 3 of 4
        assert (auto.cover_hits, auto.cover_tokens) == ((4, 6) if vocab else (0, 0))
        prefill = _batch("prefill", 2)
        first, chunk = h.make_req("e", [1, 2, 3]), h.make_req("f", [1, 2, 3])
        first.output_ids = [2]  # its prompt's last chunk: the first output token, in; the chunk before its last: none
        prefill.reqs = reqs + [first, chunk, done]
        auto.on_result(prefill, type("Result", (), {"accept_lens": None})())
        assert (auto.cover_hits, auto.cover_tokens) == ((5, 7) if vocab else (0, 0))
        assert auto.request_cover == ({"a": [4, 4], "b": [0, 2], "e": [1, 1]} if vocab else {})
        auto.on_result(spec, type("Result", (), {"accept_lens": torch.tensor([3])})())  # rows do not match
        device = type("DeviceTensorStandIn", (), {"is_cpu": False, "tolist": lambda self: pytest.fail("read")})()
        auto.on_result(spec, type("Result", (), {"accept_lens": device})())
        assert (auto.cover_hits, auto.cover_tokens) == ((5, 7) if vocab else (0, 0))
        windows.clear()
        for mode in ("spec", "spec", "spec"):
            auto.on_run_batch(object(), _batch(mode, 2), 0, trace)
            t[0] += 0.01
        assert [w.get("coverage") for w in windows] == ([round(5 / 7, 4)] if vocab else [None])
        if vocab is None:
            assert auto.state.coverage is None and auto.state.accept_covers == ()
        else:
            assert auto.state.coverage is not None and auto.state.coverage.mean == pytest.approx(5 / 7)
            assert (auto.cover_hits, auto.cover_tokens) == (0, 0)


def test_through_the_real_hooks_the_coverage_follows_the_committed_tokens(runtime: Any, model_dir: Path) -> None:
    """The coverage through the real `_process_result_around` hook under the overlap schedule: a draft vocabulary of
    the tiny model's even ids (`auto.vocab`, as `draft_vocabulary` would set it), phases of 2 and 8 requests in both
    modes. The switch counts the committed tokens of every decode result, plain (newest token) and verify (its real
    `accept_lens` from the batch result), each exactly once: over the run the tokens counted are the decode tokens
    the requests committed, the hits those with even ids. The learner holds the coverage and the one its accept
    length was measured at; outputs greedy-exact, the guard (assert) finds nothing."""
    gf.configure_guard(runtime, AUTO_RETRACT_CATCH_UP)
    drv = auto_driver(model_dir)
    auto = drv.switch.policy.auto
    auto.vocab = frozenset(range(0, h.VOCAB_SIZE, 2))
    counted: list[tuple[bool, int, int]] = []
    count = auto.count_coverage

    def spy(reqs: Any, accept: Any, prefill: bool = False) -> None:
        before = (auto.cover_hits, auto.cover_tokens)
        count(reqs, accept, prefill=prefill)
        kind = "prefill" if prefill else "verify" if accept is not None else "plain"
        counted.append((kind, auto.cover_hits - before[0], auto.cover_tokens - before[1]))

    auto.count_coverage = spy
    reqs, _ends = drive_phases(drv, [(2, 40), (8, 50), (2, 40)])
    assert runtime.guard.found == [] and ol_greedy(reqs) == []
    assert {kind for kind, _, n in counted if n} == {"prefill", "verify", "plain"}  # both modes and the prefills
    assert sum(n for kind, _, n in counted if kind == "prefill") == len(reqs)  # each request's first token, once
    hits, tokens = sum(c[1] for c in counted), sum(c[2] for c in counted)
    committed = [t for r in reqs for t in r.output_ids]
    assert 0.7 * len(committed) <= tokens <= len(committed), (tokens, len(committed))
    assert 0.3 < hits / tokens < 0.7 and abs(hits / tokens - sum(t % 2 == 0 for t in committed) / len(committed)) < 0.05
    assert auto.state.coverage is not None and auto.state.accept_cover(1) is not None
