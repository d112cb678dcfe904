"""Issue 23: the switch's speculative tiers (SPECFLIP_TIERS, shim/switch/v2_tiers.py, design
plain_off_retract_catch_up_tiers). The tier rule (statemodel.policy.decide_tier), its configuration, and the switch on
SGLang 0.5.23's real objects under the overlap loop (tests/overlap_loop.py): the scheduler decides the tier at
get_next_batch_to_run, the real EAGLEWorkerV2.forward_batch_generation applies it through SGLang's real
AdaptiveController, flips to plain and back retract as before, and the guard (assert mode, the tiers design) follows
every tier change."""

from __future__ import annotations

import importlib
import json
import logging
import sys
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from shim.switch.config import SwitchConfig, SwitchConfigError, TierLadder
from statemodel.designs import DESIGNS_BY_NAME, get_design
from statemodel.policy import decide_tier

TIERS = get_design("plain_off_retract_catch_up_tiers")


# --- the rule ---------------------------------------------------------------------------------------------------


LADDER = TierLadder.parse("3,8:4,2,16:12,1")


def walk(demands: list[int], start: int = 3) -> list[int]:
    steps, out = start, []
    for d in demands:
        steps = decide_tier(steps, d, LADDER.steps, LADDER.bounds)
        out.append(steps)
    return out


def test_tiers_follow_demand_with_hysteresis() -> None:
    assert walk([1, 7, 8, 15, 16, 40]) == [3, 3, 2, 2, 1, 1]  # up at each boundary's `up`
    assert walk([16, 13, 12, 5, 4, 0], start=1) == [1, 1, 2, 2, 3, 3]  # down at each boundary's `down`
    assert walk([9, 5, 9, 5]) == [2, 2, 2, 2]  # between up and down: no flapping
    assert walk([20, 2]) == [1, 3]  # several boundaries in one decision
    assert decide_tier(7, 10, LADDER.steps, LADDER.bounds) == 2  # a step count off the ladder starts at the bottom
    assert decide_tier(3, 100, (3,), ()) == 3  # one tier: the on/off switch at that step count


def test_every_decision_is_a_step_count_of_the_ladder_and_the_model_covers_ladders() -> None:
    """The model's TierFlips lets each decode step run any tier (scaled to the scope: steps 1 and 2, the largest one
    sizing the reserve); the switch's decisions are each one of the ladder's step counts."""
    seen = set(walk(list(range(0, 40)) + list(range(40, -1, -1))))
    assert seen == set(LADDER.steps)
    assert TIERS.steps_choices(1) == TIERS.steps_choices(3) == (1, 2) and TIERS.largest_steps() == 2
    assert f"{TIERS.name}_overlap" in DESIGNS_BY_NAME


@pytest.mark.parametrize(("env", "message"), [
    ({"SPECFLIP_SWITCH": "40:30", "SPECFLIP_TIERS": "3,8"}, "a step count last"),
    ({"SPECFLIP_SWITCH": "40:30", "SPECFLIP_TIERS": "3,x:1,1"}, "must be 'steps[,up:down,steps]"),
    ({"SPECFLIP_SWITCH": "40:30", "SPECFLIP_TIERS": "3,4:8,1"}, "needs 0 <= down < up"),
    ({"SPECFLIP_SWITCH": "40:30", "SPECFLIP_TIERS": "3,8:4,2,6:5,1"}, "must rise"),
    ({"SPECFLIP_SWITCH": "40:30", "SPECFLIP_TIERS": "3,8:4,0"}, "not steps 0"),
    ({"SPECFLIP_SWITCH": "40:30", "SPECFLIP_TIERS": "3,40:4,1"}, "below t_off 40"),
    ({"SPECFLIP_SWITCH": "auto", "SPECFLIP_TIERS": "3,8:4,1"}, "with SPECFLIP_SWITCH=auto the boundaries are learned"),
    ({"SPECFLIP_SWITCH": "auto", "SPECFLIP_TIERS": "3,1,3"}, "distinct"),
    ({"SPECFLIP_SWITCH": "auto", "SPECFLIP_TIERS": "3,x"}, "with SPECFLIP_SWITCH=auto: the step counts only"),
    ({"SPECFLIP_SWITCH": "40:30", "SPECFLIP_TIERS": "3,1"}, "only auto learns the boundaries"),
    ({"SPECFLIP_SWITCH": "40:30", "SPECFLIP_SWITCH_DRAFT": "sync", "SPECFLIP_TIERS": "3,8:4,1"}, "retract"),
    ({"SPECFLIP_TIERS": "3,8:4,1"}, "needs SPECFLIP_SWITCH=t_off:t_on"),
])
def test_bad_tiers_are_one_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(SwitchConfigError) as info:
        SwitchConfig.from_env(env)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_tiers_config_names_the_tiers_design() -> None:
    config = SwitchConfig.from_env({"SPECFLIP_SWITCH": "40:30", "SPECFLIP_TIERS": " 3, 8:4 ,1"})
    assert config is not None and config.tiers == TierLadder((3, 1), ((8, 4),))
    assert config.design_name == TIERS.name and config.tiers.describe() == "3,8:4,1"
    plain = SwitchConfig.from_env({"SPECFLIP_SWITCH": "40:30"})
    assert plain is not None and plain.tiers is None and plain.design_name == "plain_off_retract_catch_up"


def test_auto_takes_a_ladder_of_step_counts() -> None:
    """With SPECFLIP_SWITCH=auto the ladder is the step counts only (the learner finds the boundaries); it implements
    the tiers design (TierFlips over-approximates the learner's choices as it does the thresholds')."""
    config = SwitchConfig.from_env({"SPECFLIP_SWITCH": "auto", "SPECFLIP_TIERS": "3, 1"})
    assert config is not None and config.auto and config.tiers == TierLadder((3, 1), learned=True)
    assert config.design_name == TIERS.name and config.tiers.describe() == "3,1"
    one = SwitchConfig.from_env({"SPECFLIP_SWITCH": "auto", "SPECFLIP_TIERS": "2"})
    assert one is not None and one.tiers == TierLadder((2,)) and one.design_name == TIERS.name


def test_a_bad_tiers_setting_leaves_the_switch_off_with_one_log_line(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    from shim.switch import v2 as switch_v2

    monkeypatch.setenv("SPECFLIP_SWITCH", "40:30")
    monkeypatch.setenv("SPECFLIP_TIERS", "3,8:4")
    monkeypatch.setattr(switch_v2, "_RUNTIME", None)
    with caplog.at_level(logging.ERROR, logger="specflip.switch"):
        assert switch_v2.install_from_env() is False
    assert [r.getMessage() for r in caplog.records if r.name == "specflip.switch"] == \
        ["specflip switch off: SPECFLIP_TIERS must be 'steps[,up:down,steps]...' from low load to high, e.g. "
         "'3,8:4,1' (a step count last), got '3,8:4'"]


# --- real objects -------------------------------------------------------------------------------------------------

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stand_ins" / "cpu"))


def _sglang() -> tuple[Any, Any, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pytest.importorskip("torch")
        pytest.importorskip("sglang.srt.managers.schedule_batch")
    return (importlib.import_module("guard_fixtures"), importlib.import_module("sglang_cpu"),
            importlib.import_module("overlap_loop"))


def adaptive_controller_for(worker: Any, gf: Any, steps: tuple[int, ...], config: Path) -> Any:
    """SGLang's real AdaptiveController (and its real AdaptiveSpeculativeParams from `config`) on `worker`, with one
    runtime state per step count: a real SpecRuntimeState whose target graph is a stand-in captured at steps + 1
    tokens per request (what build_adaptive_runtime_state captures on the GPU). The worker's apply_runtime_state is
    the CPU stand-in: what the real one does to the step counts and the target's graph runner."""
    from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController, SpecRuntimeState
    from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

    params = AdaptiveSpeculativeParams(initial_steps=worker.speculative_num_steps, cfg_path=str(config))
    controller = AdaptiveController(worker, params)
    for s in steps:
        controller.register(SpecRuntimeState(
            speculative_num_steps=s, speculative_num_draft_tokens=s + 1, draft_attn_backend=None,
            cuda_graph_runner=None, target_attn_backend=None,
            target_graph_runner=gf.DecodeCudaGraphRunnerCpuStandIn(captured_req_width=s + 1),
            draft_extend_attn_backend=None, cuda_graph_runner_for_draft_extend=None))

    def apply_runtime_state_cpu_stand_in(state: Any) -> None:
        if worker.speculative_num_steps == state.speculative_num_steps:
            return
        gf.set_steps(worker, state.speculative_num_steps)
        worker.target_worker.model_runner.decode_cuda_graph_runner = state.target_graph_runner

    worker.apply_runtime_state = apply_runtime_state_cpu_stand_in
    worker.adaptive_controller = controller
    return controller


# arrivals (iteration: max_new_tokens per request): demand climbs through the steps-3 tier (< 3), the steps-1 tier
# (3..5) and plain (>= 6), falls back through both (t_on 2, tier boundary 3:1), and again
WAVES = {0: [12, 30], 4: [10, 14], 8: [9, 13, 16], 40: [8, 30], 44: [6, 9, 12, 20]}


@pytest.fixture
def tiers_config(tmp_path: Path) -> Path:
    path = tmp_path / "tiers.json"
    # a config SGLang's own controller would act on at once (no warm-up, every verify): the switch must keep it out
    path.write_text(json.dumps({"warmup_batches": 0, "update_interval": 1, "1": {"candidate_steps": [1, 3]}}))
    return path


def record_tier_activations(monkeypatch: pytest.MonkeyPatch, drv: Any) -> tuple[list[tuple[int, int, int]],
                                                                                 list[tuple[int, int]]]:
    """EAGLEWorkerV2.activate_step_by_batch wrapped as shim/switch/v2.py's AROUND hook wraps it, with the driver's
    runtime, recording (iteration, batch size, steps) of every speculative decode and (steps, tokens per request of
    the target graph in force) at each."""
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    from shim.switch.v2_tiers import activate_tier

    applied: list[tuple[int, int, int]] = []
    widths: list[tuple[int, int]] = []
    orig_activate = EAGLEWorkerV2.activate_step_by_batch

    def activate(self: Any, batch_size: int) -> None:
        if not activate_tier(drv.switch, self):
            orig_activate(self, batch_size)
        applied.append((drv.iteration_no, batch_size, self.speculative_num_steps))
        widths.append((self.speculative_num_steps, self.target_worker.model_runner.decode_cuda_graph_runner
                       .captured_req_width))
    monkeypatch.setattr(EAGLEWorkerV2, "activate_step_by_batch", activate)
    return applied, widths


@pytest.mark.sglang
def test_the_switch_runs_every_tier_and_plain_on_real_objects(runtime: Any, model_dir: Path, tiers_config: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiers switch over waves that cross both tiers and plain decoding, both ways: every speculative decode runs
    the tier the switch chose (applied by SGLang's controller inside the real forward, its verify graph the tier's
    own), the flips retract as before, every output is the greedy one, every slot is back, and the guard (assert
    mode, the tiers design) found nothing while following each tier change."""
    gf, h, ol = _sglang()


    gf.configure_guard(runtime, TIERS)
    config = SwitchConfig(t_off=6, t_on=2, draft_while_off="retract", tiers=TierLadder((3, 1), ((3, 1),)))
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), TIERS, switch_config=config)
    adaptive_controller_for(drv.worker, gf, (1, 3), tiers_config)
    cycle = gf.accept_cycle([4, 1, 3, 2])
    # accept lengths within the tier the forward is about to run (the switch decided it this iteration)
    drv.accepts = lambda req: min(cycle(req), drv.switch.policy.tier + 1)
    applied, widths = record_tier_activations(monkeypatch, drv)

    reqs: list[Any] = []
    for it in range(120):
        if it in WAVES:
            wave = [h.make_req(f"w{it}_{i}", gf.SYSTEM_PROMPT + [300 + len(reqs) + i] * (2 + i), max_new_tokens=m)
                    for i, m in enumerate(WAVES[it])]
            reqs += wave
            drv.add(wave)
        drv.iteration()
    drv.run_until_idle()

    guard = runtime.guard
    assert guard.config.design.name == f"{TIERS.name}_overlap" and guard.found == []
    assert all(r.finished() and list(r.output_ids) == ol.expected_output(r) for r in reqs)
    assert gf.pool_accounted(drv.pools)
    tiers = [e for e in drv.switch.trace.events if e["action"] == "tier"]
    flips = [a for _, a in drv.flips]
    # both tiers and plain ran, the tier changed both ways, and speculation went off and on
    assert {s for _, _, s in applied} == {1, 3}
    assert {e["steps"] for e in tiers} == {1, 3} and flips[:2] == ["flip_off", "flip_on"]
    assert any(mode == "plain" for _, mode, _ in drv.launched)
    # every speculative decode ran the switch's tier, on that tier's verify graph
    # (0.5.23's can_run_graph runs a verify of another width eager: the guard cannot tell, so the test checks)
    assert widths and all(width == steps + 1 for steps, width in widths)
    assert drv.switch.counters.get("tier_change", 0) >= 2
    # a batch of 3..5 requests never ran steps 3 once the tier had moved up, and none below 1 ran steps 1 (t_on 2 <
    # the boundary's down 1 + 1): the ladder's hysteresis, as decided
    assert all(s == 1 for _, bs, s in applied if bs >= 3)
    assert guard.covered["draft"] == len(applied)


class TierStepClockCpuStandIn:
    """The GPU's step time per mode, which the CPU cannot give (tests/test_switch_auto.py's AutoDriver advances it at
    each decode launch): plain 1.0 ms + 0.05 ms a request; steps 1 1.2 + 0.3 ms; steps 3 0.5 + 0.9 ms. With the
    accept lengths of ACCEPTS (steps 3: 2.75 a request, steps 1: 2.0) steps 3 wins at one and two requests, steps 1
    at three, plain from five (and ties steps 1 at four). The step count is the worker's, which the tier applied
    inside the forward just launched."""

    def __init__(self, worker: Any) -> None:
        self.now = 0.0
        self.worker = worker

    def __call__(self) -> float:
        return self.now

    def step_seconds(self, spec: bool, bs: int) -> float:
        if not spec:
            return 1.0e-3 + 0.05e-3 * bs
        return (1.2e-3 + 0.3e-3 * bs) if self.worker.speculative_num_steps == 1 else (0.5e-3 + 0.9e-3 * bs)


ACCEPTS = [4, 2, 3, 2]  # per request, in turn; a tier accepts at most steps + 1


@pytest.mark.sglang
def test_auto_tiers_learn_plain_and_every_tier_on_real_objects(runtime: Any, model_dir: Path, tiers_config: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """SPECFLIP_SWITCH=auto with SPECFLIP_TIERS=3,1: the learner (small parameters for a CPU run) picks among plain
    and both tiers from the synthetic step times, through the real hooks (get_next_batch_to_run, run_batch,
    process_batch_result) and SGLang's real AdaptiveController in the real forward, over phases of one or two
    requests and of seven, refilled as they finish. It crosses the tiers and plain both ways; each verify runs on
    its tier's graph; every output is greedy-exact, every slot back, and the guard (assert mode, the tiers design)
    found nothing. Its observations carry the tier each step ran at, and its accept lengths are per tier."""
    gf, h, ol = _sglang()
    from test_switch_auto import PARAMS, AutoDriver, drive_phases

    from shim.switch.auto import AutoSwitch
    from statemodel import auto_policy as ap

    gf.configure_guard(runtime, TIERS)
    config = SwitchConfig.from_env({"SPECFLIP_SWITCH": "auto", "SPECFLIP_TIERS": "3,1", "SPECFLIP_SPEC_CAP": "16"})
    assert config is not None and config.design_name == TIERS.name
    drv = AutoDriver(ol.overlap_pools(model_dir), TIERS, switch_config=config)
    adaptive_controller_for(drv.worker, gf, (1, 3), tiers_config)
    drv.clock = TierStepClockCpuStandIn(drv.worker)
    auto = drv.switch.policy.auto = AutoSwitch(spec_cap=16, window=2, clock=drv.clock,
                                               state=ap.initial_state(PARAMS, tiers=(3, 1)))
    cycle = gf.accept_cycle(ACCEPTS)
    drv.accepts = lambda req: min(cycle(req), drv.switch.policy.tier + 1)
    applied, widths = record_tier_activations(monkeypatch, drv)
    observed: list[ap.Observation] = []
    real_observe = ap.observe

    def observe(state: ap.AutoState, obs: ap.Observation) -> ap.AutoState:
        observed.append(obs)
        return real_observe(state, obs)
    monkeypatch.setattr(ap, "observe", observe)

    reqs, _ = drive_phases(drv, [(2, 50), (7, 50), (1, 50), (7, 50), (2, 50)])

    guard = runtime.guard
    assert guard.config.design.name == f"{TIERS.name}_overlap" and guard.found == []
    assert all(r.finished() and list(r.output_ids) == ol.expected_output(r) for r in reqs)
    assert gf.pool_accounted(drv.pools)
    events = drv.switch.trace.events
    flips = [e for e in events if e["action"] in ("flip_off", "flip_on")]
    tier_moves = [e["steps"] for e in events if e["action"] == "tier"]
    # plain and both tiers, both ways: off and on, steps 3 -> 1 and 1 -> 3
    assert {f["action"] for f in flips} == {"flip_off", "flip_on"}
    assert any(mode == "plain" for _, mode, _ in drv.launched)
    assert {s for _, _, s in applied} == {1, 3} and 1 in tier_moves and 3 in tier_moves
    assert all(width == steps + 1 for steps, width in widths)  # every verify on its tier's graph
    assert drv.switch.policy.refused == 0 and auto.state.tier_changes >= 2 and auto.state.flips >= 2
    # what it learned: steps 3 at two requests, plain at seven (the bucket of 6-7), flipping on the numbers too
    held = dict(ap.held_modes(auto.state, 16, 8))
    assert auto.state.steps_of(held[2]) == 3 and held[6] == ap.PLAIN
    assert "measured" in {f["reason"] for f in flips}
    assert all(f["policy"] == "auto" and "values" in f and "digest" in f for f in flips)
    # observations carry the tier they ran at; each tier learned its own accept length (steps 1 at most 2)
    spec_steps = {o.steps for o in observed if o.spec_on}
    assert spec_steps == {1, 3} and all(o.steps is None for o in observed if not o.spec_on)
    acc3, acc1 = auto.state.accept_of(1), auto.state.accept_of(2)
    assert acc3 is not None and acc1 is not None and acc1.mean <= 2.0 < acc3.mean


@pytest.mark.sglang
def test_auto_tiers_credit_each_result_to_the_tier_it_ran_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the overlap schedule a verify result is processed after the next step launched, maybe at another tier:
    its accept lengths go to the step count it ran at (on_launched), each window agrees one accept sum per tier of the
    ladder (the same list length on every rank, whichever tiers ran), and each observation carries its step count."""
    import torch
    from test_switch_auto import _batch

    from shim.switch import auto as auto_switch
    from statemodel import auto_policy as ap

    agreed: list[int] = []
    real_reduce = auto_switch.all_reduce_max
    monkeypatch.setattr(auto_switch, "all_reduce_max", lambda sched, values: agreed.append(len(values))
                        or real_reduce(sched, values))
    t = [0.0]
    auto = auto_switch.AutoSwitch(spec_cap=48, window=4, clock=lambda: t[0], state=ap.initial_state(tiers=(3, 1)))
    observed: list[ap.Observation] = []
    real_observe = ap.observe
    monkeypatch.setattr(ap, "observe", lambda state, obs: observed.append(obs) or real_observe(state, obs))
    sched = object()
    prev: tuple[Any, Any] | None = None
    for steps in [3, 3, 3, 3, 1, 1, 1, 3]:  # the overlap loop: launch N, then process N-1's result
        batch = _batch("spec", 2)
        auto.on_run_batch(sched, batch, 0, None, steps=steps)
        result = type("Result", (), {"accept_lens": torch.tensor([steps + 1, steps + 1])})()
        auto.on_launched(result, steps)
        if prev is not None:
            auto.on_result(*prev)
        prev = (batch, result)
        t[0] += 0.004 if steps == 1 else 0.006
    # 3 then 4 intervals, the two sums, one pair per tier, the finished flag, the catch-up's tokens and seconds
    assert agreed == [3 + 2 + 2 * 2 + 1 + 2, 4 + 2 + 2 * 2 + 1 + 2]
    assert [o.steps for o in observed] == [3, 3, 3, 3, 1, 1, 1]
    # every step's tokens are its own tier's accept (4 at steps 3, 2 at steps 1), not the second window's mix (2.5)
    assert [o.tokens for o in observed] == [8.0, 8.0, 8.0, 8.0, 4.0, 4.0, 4.0]
    assert auto.result_steps == {id(prev[1]): 3}  # launched, not yet processed


@pytest.mark.sglang
def test_sglang_accept_length_controller_is_kept_out(tiers_config: Path) -> None:
    """SGLang's own controller (warm-up 0, every verify) moves the step count on low accepts; under the tiers
    switch EAGLEWorkerV2.on_verify_complete_cpu goes through the switch's hook and nothing moves. Without the
    switch the same call moves it (the check can fail)."""
    gf, _, _ = _sglang()
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    from shim.switch import v2 as switch_v2
    from shim.switch.policy import SwitchPolicy
    from shim.switch.v2_runtime import SwitchRuntime
    from shim.timing.jsonl import JsonlTrace

    worker = gf.make_workers(_pools(), num_steps=3)
    adaptive_controller_for(worker, gf, (1, 3), tiers_config)
    config = SwitchConfig(t_off=6, t_on=2, draft_while_off="retract", tiers=TierLadder((3, 1), ((3, 1),)))
    rt = SwitchRuntime(config=config, policy=SwitchPolicy(config), trace=JsonlTrace(None))
    verify_done = partial(switch_v2._verify_done_around, EAGLEWorkerV2.on_verify_complete_cpu, worker)
    saved = switch_v2._RUNTIME
    try:
        switch_v2._RUNTIME = rt
        for _ in range(12):  # the EMA from 2 (steps 3's neutral start) below steps 1's 0.25 threshold
            verify_done([0, 0], batch_size=2)
        assert worker.speculative_num_steps == 3
        switch_v2._RUNTIME = None
        for _ in range(12):  # the EMA from 2 (steps 3's neutral start) below steps 1's 0.25 threshold
            verify_done([0, 0], batch_size=2)
        assert worker.speculative_num_steps == 1
    finally:
        switch_v2._RUNTIME = saved


def _pools() -> Any:
    _, _, ol = _sglang()
    h = importlib.import_module("sglang_cpu")
    import tempfile

    return ol.overlap_pools(h.write_tiny_model_config(Path(tempfile.mkdtemp())))


@pytest.mark.sglang
def test_a_tier_without_a_runtime_state_turns_the_tiers_off(tiers_config: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """A tier the server built no runtime state for (not in the adaptive config's candidate_steps), or no
    --speculative-adaptive at all: one error line at start-up, the tiers off, the worker's routing SGLang's."""
    gf, _, _ = _sglang()
    from shim.switch.policy import SwitchPolicy
    from shim.switch.v2_runtime import SwitchRuntime
    from shim.switch.v2_tiers import activate_tier, check_tier_states
    from shim.timing.jsonl import JsonlTrace

    worker = gf.make_workers(_pools(), num_steps=3)
    config = SwitchConfig(t_off=6, t_on=2, draft_while_off="retract", tiers=TierLadder((3, 2, 1), ((3, 2), (4, 3))))
    for controller_steps, problem in [(None, "needs --speculative-adaptive"), ((1, 3), "steps [2] have no runtime")]:
        if controller_steps is not None:
            adaptive_controller_for(worker, gf, controller_steps, tiers_config)
        rt = SwitchRuntime(config=config, policy=SwitchPolicy(config), trace=JsonlTrace(None))
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="specflip.switch"):
            check_tier_states(rt, worker)
        lines = [r.getMessage() for r in caplog.records if r.name == "specflip.switch"]
        assert len(lines) == 1 and problem in lines[0] and rt.tiers_off
        assert activate_tier(rt, worker) is False
    rt = SwitchRuntime(config=SwitchConfig(t_off=6, t_on=2, draft_while_off="retract",
                                           tiers=TierLadder((3, 1), ((3, 1),))),
                       policy=SwitchPolicy(SwitchConfig(t_off=6, t_on=2, draft_while_off="retract",
                                                        tiers=TierLadder((3, 1), ((3, 1),)))),
                       trace=JsonlTrace(None))
    check_tier_states(rt, worker)
    assert not rt.tiers_off


def test_each_tiers_known_bad_design_is_one_change_from_the_tiers_design() -> None:
    import attrs

    from statemodel.designs import TIERS_KNOWN_BAD, TIERS_KNOWN_BAD_BASES

    assert {d.name for d in TIERS_KNOWN_BAD} == set(TIERS_KNOWN_BAD_BASES) == {
        "tiers_reserve_by_current_tier", "tiers_no_catch_up_at_flip_on"}
    for design in TIERS_KNOWN_BAD:
        base = TIERS_KNOWN_BAD_BASES[design.name]
        changed = {f.name for f in attrs.fields(type(base)) if f.name not in
                   {"name", "kind", "summary", "source", "expected_invariant"}
                   and getattr(base, f.name) != getattr(design, f.name)}
        assert len(changed) == 1 and base is TIERS


# --- lint: every tier's runtime state ----------------------------------------------------------------------------


def _tiers_policy(text: str = "3,8:4,1", t_off: int = 40, t_on: int = 30) -> Any:
    from specflip.lint.run import _own_parser, specflip_policy

    own = _own_parser().parse_args(["--specflip-t-off", str(t_off), "--specflip-t-on", str(t_on),
                                    "--specflip-tiers", text])
    return specflip_policy(own)


def test_lint_checks_each_tier_on_0_5_16_sizing() -> None:
    """0.5.16 sizes the shared logits buffer for the launch width only (sglang #30549): the tiers server launches at
    its largest tier (bench/gpu/tiers_8b.json, steps 3) and every tier fits; launched at steps 1, the steps-3 tier's
    graphs outgrow the buffer. A tier the server builds no state for is a finding, as is a server without
    --speculative-adaptive."""
    from shim.releases import release_line
    from specflip.lint.rules import SHAPES, check, reachable_states, summary

    lint_0_5_16 = release_line("0.5.16")

    policy = _tiers_policy()
    assert policy.tiers == (3, 1) and policy.tier_bounds == ((8, 4),)
    server = partial(lint_0_5_16.sizing_from_values, adaptive=True, tiers=((1, (1, 2, 3)),),
                     max_running_requests=256, specflip=policy)
    fits = server(steps=3)
    assert check(fits) == []
    assert [(st.steps, where) for st, where in reachable_states(fits)] == [
        (3, "(specflip tier at demand 0-7)"), (1, "(specflip tier at demand 5-39)")]
    assert "by tiers [3, 1]" in summary(fits)
    narrow = check(server(steps=1))
    # every state 0.5.16 builds at start-up is captured (docs/lint.md): steps 2 and 3 both outgrow a steps-1 buffer
    assert {f.rule for f in narrow} == {SHAPES}
    assert sorted(f.state.split()[0] for f in narrow) == ["steps=2", "steps=3"]
    missing = check(lint_0_5_16.sizing_from_values(adaptive=True, tiers=((1, (1, 3)),), steps=3,
                                                   max_running_requests=256, specflip=_tiers_policy("3,8:4,2")))
    assert [(f.rule, f.state) for f in missing] == [(SHAPES, "specflip tier steps=2")]
    static = check(lint_0_5_16.sizing_from_values(steps=3, draft_tokens=4, max_running_requests=256,
                                                  specflip=policy))
    assert [f.state for f in static] == ["specflip tier steps=3", "specflip tier steps=1"]


def test_lint_checks_each_auto_tier() -> None:
    """`--specflip-auto --specflip-tiers 3,1`: every tier is a state the learner may pick at any demand; each is
    checked as the threshold tiers' are (a launch at steps 1 on 0.5.16 outgrows the buffer for steps 3)."""
    from shim.releases import release_line
    from specflip.lint.rules import SHAPES, check, reachable_states, summary

    lint_0_5_16 = release_line("0.5.16")
    from specflip.lint.run import _own_parser, specflip_policy

    policy = specflip_policy(_own_parser().parse_args(["--specflip-auto", "--specflip-tiers", "3,1"]))
    assert policy is not None and policy.auto and policy.tiers == (3, 1) and policy.tier_bounds == ()
    server = partial(lint_0_5_16.sizing_from_values, adaptive=True, tiers=((1, (1, 2, 3)),),
                     max_running_requests=256, specflip=policy)
    fits = server(steps=3)
    assert check(fits) == []
    assert [(st.steps, where) for st, where in reachable_states(fits)] == [
        (3, "(specflip auto tier, any demand)"), (1, "(specflip auto tier, any demand)")]
    assert "specflip off/on (auto) by tiers [3, 1]" in summary(fits)
    assert {f.rule for f in check(server(steps=1))} == {SHAPES}
    missing = check(lint_0_5_16.sizing_from_values(adaptive=True, tiers=((1, (1, 3)),), steps=3,
                                                   max_running_requests=256, specflip=specflip_policy(
                                                       _own_parser().parse_args(["--specflip-auto",
                                                                                 "--specflip-tiers", "3,2"]))))
    assert [(f.rule, f.state) for f in missing] == [(SHAPES, "specflip tier steps=2")]


@pytest.mark.sglang
def test_lint_cli_takes_auto_tiers_on_0_5_23(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`specflip lint --specflip-auto --specflip-tiers 3,1` on SGLang 0.5.23's real ServerArgs with the tiers server's
    adaptive config (bench/gpu/tiers_8b.json): every tier fits (exit 0, one summary line); thresholds beside
    --specflip-auto are bad usage (exit 2, one line)."""
    import importlib.metadata

    from specflip.cli import main

    if importlib.metadata.version("sglang") != "0.5.23":
        pytest.skip("needs sglang 0.5.23 (scripts/setup.sh)")
    h = importlib.import_module("sglang_cpu")
    model = h.write_tiny_model_config(tmp_path)
    launch = ["--model-path", str(model), "--speculative-draft-model-path", str(model), "--device", "cuda",
              "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
              "--speculative-num-draft-tokens", "4", "--max-running-requests", "256", "--speculative-adaptive",
              "--speculative-adaptive-config", str(Path(__file__).resolve().parents[1] / "bench/gpu/tiers_8b.json")]
    assert main(["lint", "--no-cache", "--specflip-auto", "--specflip-tiers", "3,1", *launch]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("ok: sglang 0.5.23") and "specflip off/on (auto) by tiers [3, 1]" in out[-1]
    assert main(["lint", "--specflip-auto", "--specflip-t-off", "40", "--specflip-tiers", "3,1", *launch]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specflip lint:") and "\n" not in err and "without --specflip-t-off" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--specflip-tiers", "3,8:4,1"], "--specflip-tiers needs --specflip-t-off"),
    (["--specflip-auto", "--specflip-t-off", "40"], "without --specflip-t-off"),
    (["--specflip-auto", "--specflip-tiers", "3,8:4,1"], "with SPECFLIP_SWITCH=auto the boundaries are learned"),
    (["--specflip-t-off", "40", "--specflip-t-on", "30", "--specflip-tiers", "3,1"], "only auto learns"),
    (["--specflip-t-off", "40", "--specflip-t-on", "30", "--specflip-tiers", "3,8"], "a step count last"),
    (["--specflip-t-off", "8", "--specflip-t-on", "4", "--specflip-tiers", "3,8:4,1"], "below t_off 8"),
])
def test_lint_refuses_bad_tiers_with_one_line(argv: list[str], message: str) -> None:
    from specflip.lint.run import LintUsageError, _own_parser, specflip_policy

    with pytest.raises(LintUsageError) as info:
        specflip_policy(_own_parser().parse_args(argv))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_tier_decision_reads_counts_and_configuration_only() -> None:
    """TP > 1: every rank must pick the same tier. decide_tier reads only its arguments, and the switch's
    follow_tier feeds it the mode, its own last tier and the ladder (the demand comes from plain_path_flip's shared
    counts, tests/test_switch_rank_consistency.py)."""
    from shim.switch.policy import SwitchPolicy
    from tests.test_switch_rank_consistency import function_ast, names_read

    node = function_ast(decide_tier)
    params = {a.arg for a in node.args.args}
    assert params == {"steps", "demand", "ladder", "bounds"}
    assert set().union(*(names_read(s) for s in node.body)) <= params | {"i", "index", "len"}
    follow = function_ast(SwitchPolicy.follow_tier)
    read = set().union(*(names_read(s) for s in follow.body))
    # auto: the tier of the learner's last committed decision (its state agreed across ranks, docs/auto-switch.md)
    assert read <= {"self", "demand", "ladder", "config", "tiers", "tier", "spec_on", "steps", "decide_tier",
                    "bounds", "None", "auto"}, read
