"""Long clean runs (issue 51): every shipped and candidate design that runs on SGLang 0.5.23's objects, driven on real
objects on the CPU (stand-in forwards only) for at least 2,000 scheduler steps with flips, the radix cache on and off,
chunked prefill on and off, the guard in assert mode: no finding, every request served, every slot back.

Traffic (seeded, deterministic): requests arrive at random, each a shared system prompt (gf.SYSTEM_PROMPT, cached in
the tree by the first wave, with the draft) plus a suffix of its own that starts with a token no other request's
suffix starts with, 4 to 40 new tokens; speculation flips off and on every 3 to 30 steps (the design drivers'
`flip_off` / `flip_on`, what a switch of that design does), or, for the retract designs, wherever the real switch's
thresholds put it under the demand the arrivals make. Why suffixes of their own: the checker refutes
`plain_off_catch_up` with SGLang's radix cache as it is through a prompt cached by a request that finished while off
and hit later (tests/test_prefix_cache.py), which the guard rightly reports; a clean run is one where no request hits
such a prompt, and one whose running requests' tree prefixes the catch-up covers (the false alarm issue 51 fixed).

The designs and their drivers: tests/guard_fixtures.py's DesignDriver (SGLang's normal loop) for seeds_final,
v2_switch_reserve_sync, sglang_adaptive_warm (its "flips" are step-count changes, 0 included), plain_off_catch_up and
plain_off_sync; tests/overlap_loop.py's OverlapDriver with the real switch (shim/switch/v2.py, draft mode retract)
for plain_off_retract_catch_up, and with the radix cache on its `keep_out` default, plain_off_retract_catch_up_radix;
the same loop with the real auto switch (tests/test_switch_auto.py's AutoDriver: the real `_next_batch_around`,
`_run_batch_around` and `_process_result_around` hooks, decisions the learner's own from the stand-in step clock)
over phases of 1-2 and 6-9 requests for plain_off_retract_catch_up_auto; and with the real tiers switch (ladder 3,3:1,1
beside t_off 6, t_on 2; SGLang's real AdaptiveController applies each tier in the real forward,
tests/test_switch_tiers.py's set-up) over phases of 0-1 and 3-9 requests for plain_off_retract_catch_up_tiers.
The v1 candidates (SGLang 0.5.12) have theirs in tests/test_v1_switch.py (`V1_LONG_RUN_DESIGNS`), run under .venv12.

Marked `long_run` (scripts/test.sh runs every test; `-m "not long_run"` leaves these out). Cost, 2026-12-06 on the
2-core development machine shared with other jobs (`/usr/bin/time .venv/bin/python -m pytest
tests/test_guard_long_run.py -q`): at commit cac089c 13 tests, 62 s of CPU (user + sys); with the auto and tiers runs
(branch guardcov) 17 tests, 79 s of CPU (5.5 min wall on the loaded machine); the four new ones 22 s of CPU
(`-k "auto or tiers"`, less the 16 s a run of the meta-test alone takes). The v1 runs in tests/test_v1_switch.py:
4 tests, 24 s of CPU with .venv12's start-up.
"""

from __future__ import annotations

import importlib
import random
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")
ol = importlib.import_module("overlap_loop")

from shim.settings import settings  # noqa: E402
from shim.switch.v2 import SwitchConfig  # noqa: E402
from statemodel.design import ClearSpecOn, DraftWhileOff  # noqa: E402
from statemodel.designs import (  # noqa: E402
    ADAPTIVE_WARM,
    AUTO_RETRACT_CATCH_UP,
    CANDIDATES,
    CATCH_UP,
    RETRACT_CATCH_UP,
    RETRACT_CATCH_UP_RADIX,
    SEEDS_FINAL,
    SHIPPED,
    SYNC_V2,
    TIERS_RETRACT_CATCH_UP,
    V2_SWITCH,
)

pytestmark = [pytest.mark.sglang, pytest.mark.long_run]

STEPS = settings.LONG_RUN_STEPS.get()  # per run; a longer run: set SPECFLIP_LONG_RUN_STEPS
CHUNK = 16  # prefill rounds of at most 16 tokens (the prompts are 27-37 tokens) in every other phase of a run
PHASE = 250  # steps: chunked prefill on in the odd phases, off in the even ones


def chunk_at(step: int) -> int | None:
    return CHUNK if (step // PHASE) % 2 else None
NORMAL_LOOP = [SEEDS_FINAL, V2_SWITCH, ADAPTIVE_WARM, CATCH_UP, SYNC_V2]
# the v1 (0.5.12) candidates' long runs are in tests/test_v1_switch.py, which runs under .venv12 (scripts/test.sh)
V1_LONG_RUN_DESIGNS = {"v1_plain_off_retract_catch_up", "v1_plain_off_retract_catch_up_radix"}


class Traffic:
    """Seeded arrivals: requests on gf.SYSTEM_PROMPT with suffixes of their own."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.made: list[Any] = []

    def requests(self, count: int) -> list[Any]:
        out = []
        for _ in range(count):
            n = len(self.made)
            suffix = [1000 + n] + [self.rng.randrange(200, 900) for _ in range(self.rng.randrange(2, 12))]
            req = h.make_req(f"r{n}", gf.SYSTEM_PROMPT + suffix, max_new_tokens=self.rng.randrange(4, 41))
            self.made.append(req)
            out.append(req)
        return out

    def served(self) -> list[str]:
        """Requests not finished with their whole output."""
        return [str(r.rid) for r in self.made
                if not r.finished() or len(r.output_ids) < r.sampling_params.max_new_tokens]

    def not_greedy(self) -> list[str]:
        """Requests whose output is not the overlap loop's stand-in model's greedy one (tests/overlap_loop.py)."""
        return [str(r.rid) for r in self.made if list(r.output_ids) != ol.expected_output(r)]


def run_normal_loop(runtime: Any, model_dir: Path, design: Any, *, radix: bool, steps: int = STEPS,
                    seed: int = 0) -> dict[str, int]:
    """`steps` decode steps of `design` through the DesignDriver, with arrivals and flips, chunked prefill on and off
    in turn (`chunk_at`); returns counts."""
    gf.configure_guard(runtime, design)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix, kv_size=2048), design)
    traffic = Traffic(seed)
    rng = traffic.rng
    adaptive = design.is_adaptive
    sync_while_off = design.draft_while_off is DraftWhileOff.SYNC_EVERY_STEP and \
        design.clear_spec_on is ClearSpecOn.BATCH_AT_FLIP
    drv.admit_all(traffic.requests(3), chunk_size=CHUNK)  # the first wave caches the system prompt, drafted
    flips = decodes = 0
    next_flip = rng.randrange(3, 31)
    tiers = [3, 2, 1, 0]
    chunked = 0
    while decodes < steps:
        chunk_size = chunk_at(decodes)
        running = len(drv.batch.reqs) if drv.batch is not None else 0
        admitted = not running or (running < 8 and rng.random() < 0.25)
        if running and admitted:
            drv.admit_all(traffic.requests(rng.randrange(1, 4)), chunk_size=chunk_size)
            running = len(drv.batch.reqs)
        if not running:
            drv.admit_all(traffic.requests(1), chunk_size=chunk_size)
        chunked += admitted and chunk_size is not None
        # plain_off_sync: a request admitted while off has its draft brought up by the sync after the next plain step
        # (the driver prefills it without the draft), so speculation comes back only after one
        held = sync_while_off and admitted and not drv.spec_on
        if decodes >= next_flip and not held:
            next_flip = decodes + rng.randrange(3, 31)
            flips += 1
            if adaptive:
                gf.set_steps(drv.worker, rng.choice(tiers))
            elif drv.spec_on:
                drv.flip_off()
            else:
                drv.flip_on()
        k = int(drv.worker.speculative_num_steps)
        drv.decode(accepts=[rng.randrange(1, k + 2) for _ in range(4)])
        drv.finish_and_filter()
        decodes += 1
    if not adaptive and not drv.spec_on:
        drv.flip_on()
    drv.run_to_completion(max_steps=200)
    assert traffic.served() == [] and not drv.batch.reqs and gf.pool_accounted(drv.pools)
    return {"decodes": decodes, "flips": flips, "requests": len(traffic.made), "chunked_admissions": chunked}


def run_retract_loop(runtime: Any, model_dir: Path, *, radix: bool, steps: int = STEPS,
                     seed: int = 0) -> dict[str, int]:
    """`steps` iterations of the overlap loop with the real retract switch (t_off 4, t_on 1; radix `keep_out`),
    demand from seeded arrivals, chunked prefill on and off in turn; returns counts."""
    gf.configure_guard(runtime, RETRACT_CATCH_UP)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir, radix_cache=radix, kv_size=2048), RETRACT_CATCH_UP,
                           switch_config=SwitchConfig(t_off=4, t_on=1, draft_while_off="retract", radix="keep_out"))
    traffic = Traffic(seed)
    rng = traffic.rng
    drv.accepts = lambda req: rng.randrange(1, 5)
    drv.add(traffic.requests(3))
    burst_until = quiet_until = 0
    for it in range(steps):
        drv.chunk_size = chunk_at(it)
        demand = (len(drv.running.reqs) if drv.running is not None else 0) + len(drv.waiting)
        # bursts (demand over t_off) and quiet phases (down to t_on, then a few more iterations) in turn: the switch
        # flips between them
        if it >= burst_until and not quiet_until and demand <= 1:
            quiet_until = it + rng.randrange(2, 8)
        if quiet_until and it >= quiet_until:
            burst_until, quiet_until = it + rng.randrange(5, 20), 0
        want = 6 if it < burst_until else 1
        if demand < want:
            drv.add(traffic.requests(want - demand))
        drv.iteration()
    drv.run_until_idle(max_iterations=1000)
    assert traffic.served() == [] and gf.pool_accounted(drv.pools)
    return {"iterations": steps, "flips": len(drv.flips), "requests": len(traffic.made)}


@pytest.mark.parametrize("radix", [False, True], ids=["radix_off", "radix_on"])
@pytest.mark.parametrize("design", NORMAL_LOOP, ids=lambda d: d.name)
def test_long_run_is_clean(runtime: Any, model_dir: Path, design: Any, radix: bool) -> None:
    counts = run_normal_loop(runtime, model_dir, design, radix=radix)
    g = runtime.guard
    assert g.found == [] and counts["decodes"] >= STEPS and counts["flips"] >= STEPS // 30, counts
    assert counts["chunked_admissions"] > 0 and g.covered["prefill"] > counts["requests"] // 3, (counts, g.covered)
    for name in ("draft", "verify", "prefill", "finish") if design.is_adaptive else \
            ("draft", "verify", "flip_off", "flip_on", "plain_decode", "prefill", "finish"):
        assert g.covered.get(name, 0) > 0, (name, g.covered)


def phased_demand(rng: random.Random, low: tuple[int, int], high: tuple[int, int]) -> Any:
    """Demand in phases of 15 to 60 iterations, low and high in turn (each phase's level drawn from its range): a
    load whose best mode changes, so a switch that follows it flips. Returns a function of the iteration."""
    level, until, high_phase = 0, 0, False

    def want(it: int) -> int:
        nonlocal level, until, high_phase
        if it >= until:
            high_phase = not high_phase
            level = rng.randint(*(high if high_phase else low))
            until = it + rng.randrange(15, 61)
        return level
    return want


def top_up(drv: Any, traffic: Traffic, want: int) -> None:
    """New requests up to `want` not finished (waiting, being prefilled or running)."""
    live = sum(1 for r in traffic.made if not r.finished())
    if live < want:
        drv.add(traffic.requests(want - live))


def drive(drv: Any, traffic: Any, want: Any, steps: int) -> None:
    """`steps` iterations of `drv` with the demand `want(iteration)` topped up from `traffic`, chunked prefill on and
    off in turn, then until idle: every request served, greedy-exact, every slot accounted for."""
    for it in range(steps):
        drv.chunk_size = chunk_at(it)
        top_up(drv, traffic, want(it))
        drv.iteration()
    drv.run_until_idle(max_iterations=1000)
    assert traffic.served() == [] and gf.pool_accounted(drv.pools)
    assert traffic.not_greedy() == []


def run_auto_loop(runtime: Any, model_dir: Path, *, radix: bool, steps: int = STEPS, seed: int = 0) -> tuple[
        dict[str, int], Any]:
    """`steps` iterations of the overlap loop with the real auto switch (shim/switch/auto.py through the real
    `_next_batch_around`, `_run_batch_around` and `_process_result_around` hooks, tests/test_switch_auto.py's
    AutoDriver), its decisions its own from the stand-in step clock (speculation wins at one or two requests, plain
    from four) over phases of 1-2 and 6-9 requests, chunked prefill on and off in turn; returns counts and the
    driver."""
    auto_tests = importlib.import_module("test_switch_auto")
    from shim.switch import auto as auto_switch
    from statemodel import auto_policy as ap

    gf.configure_guard(runtime, AUTO_RETRACT_CATCH_UP)
    config = SwitchConfig(t_off=0, t_on=0, auto=True, draft_while_off="retract", spec_cap=16)
    drv = auto_tests.AutoDriver(ol.overlap_pools(model_dir, radix_cache=radix, kv_size=2048),
                                AUTO_RETRACT_CATCH_UP, switch_config=config)
    drv.clock = auto_tests.StepClockCpuStandIn()
    drv.switch.policy.auto = auto_switch.AutoSwitch(spec_cap=16, window=2, state=ap.initial_state(auto_tests.PARAMS),
                                                    clock=drv.clock)
    traffic = Traffic(seed)
    rng = traffic.rng
    drv.accepts = lambda req: rng.randrange(1, 5)
    want = phased_demand(rng, (1, 2), (6, 9))
    drive(drv, traffic, want, steps)
    return {"iterations": steps, "flips": len(drv.flips), "requests": len(traffic.made)}, drv


def run_tiers_loop(runtime: Any, model_dir: Path, tiers_config: Path, monkeypatch: pytest.MonkeyPatch, *,
                   radix: bool, steps: int = STEPS, seed: int = 0) -> tuple[dict[str, int], list[int]]:
    """`steps` iterations of the overlap loop with the real tiers switch (SPECFLIP_TIERS=3,3:1,1 beside t_off 6, t_on
    2: steps 3 below demand 3, steps 1 from 3 down to 1, plain from 6), SGLang's real AdaptiveController applying the
    tier inside the real forward (tests/test_switch_tiers.py's set-up), over phases of demand 0-4 and 2-9, chunked
    prefill on and off in turn; returns counts and the step count of every speculative decode."""
    from shim.switch.config import TierLadder

    tier_tests = importlib.import_module("test_switch_tiers")
    gf.configure_guard(runtime, TIERS_RETRACT_CATCH_UP)
    config = SwitchConfig(t_off=6, t_on=2, draft_while_off="retract", tiers=TierLadder((3, 1), ((3, 1),)))
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir, radix_cache=radix, kv_size=2048), TIERS_RETRACT_CATCH_UP,
                           switch_config=config)
    tier_tests.adaptive_controller_for(drv.worker, gf, (1, 3), tiers_config)
    applied, _ = tier_tests.record_tier_activations(monkeypatch, drv)
    traffic = Traffic(seed)
    rng = traffic.rng
    # accept lengths within the tier the forward is about to run (the switch decided it this iteration)
    drv.accepts = lambda req: min(rng.randrange(1, 5), drv.switch.policy.tier + 1)
    want = phased_demand(rng, (0, 1), (3, 9))
    drive(drv, traffic, want, steps)
    tier_changes = sum(1 for e in drv.switch.trace.events if e["action"] == "tier")
    return ({"iterations": steps, "flips": len(drv.flips), "requests": len(traffic.made),
             "tier_changes": tier_changes}, [s for _, _, s in applied])


@pytest.mark.parametrize("radix", [False, True], ids=["radix_off", "radix_on"])
def test_long_run_retract_switch_is_clean(runtime: Any, model_dir: Path, radix: bool) -> None:
    """plain_off_retract_catch_up (and, with the radix cache on, plain_off_retract_catch_up_radix: the switch's
    keep_out, the guard's tree check beside the reference design)."""
    counts = run_retract_loop(runtime, model_dir, radix=radix)
    g = runtime.guard
    assert g.found == [] and counts["flips"] >= STEPS // 50, counts
    assert not g.tree_record.without_draft


@pytest.mark.parametrize("radix", [False, True], ids=["radix_off", "radix_on"])
def test_long_run_auto_switch_is_clean(runtime: Any, model_dir: Path, radix: bool) -> None:
    """plain_off_retract_catch_up_auto: the auto switch flips where its own measurements put it, both ways, many
    times; outputs greedy-exact, no finding."""
    counts, drv = run_auto_loop(runtime, model_dir, radix=radix)
    g = runtime.guard
    assert g.config.design.name == f"{AUTO_RETRACT_CATCH_UP.name}_overlap"
    # many flips, not a rate: the learner decides how often (rechecks priced at their real steps and timed at a
    # turnover of the requests flip less: 38 in 2,000 iterations with the radix cache on, 2026-12-06, 1be09ed)
    assert g.found == [] and counts["flips"] >= STEPS // 100, counts
    assert {a for _, a in drv.flips} == {"flip_off", "flip_on"} and drv.switch.policy.refused == 0
    reasons = {e["reason"] for e in drv.switch.trace.events if e["action"] in ("flip_off", "flip_on")}
    assert "measured" in reasons, reasons  # its decisions came from the step times it learned, not the prior only
    assert not g.tree_record.without_draft


@pytest.fixture
def tiers_config(tmp_path: Path) -> Path:
    import json

    path = tmp_path / "tiers.json"
    path.write_text(json.dumps({"warmup_batches": 0, "update_interval": 1, "1": {"candidate_steps": [1, 3]}}))
    return path


@pytest.mark.parametrize("radix", [False, True], ids=["radix_off", "radix_on"])
def test_long_run_tiers_switch_is_clean(runtime: Any, model_dir: Path, tiers_config: Path,
                                        monkeypatch: pytest.MonkeyPatch, radix: bool) -> None:
    """plain_off_retract_catch_up_tiers: flips between the two tiers and plain, both ways, many times; no finding."""
    counts, steps_run = run_tiers_loop(runtime, model_dir, tiers_config, monkeypatch, radix=radix)
    g = runtime.guard
    assert g.config.design.name == f"{TIERS_RETRACT_CATCH_UP.name}_overlap"
    # a mode change is a flip or a tier change: at least one per 50 steps in all, each kind at least one per 200
    assert g.found == [] and counts["flips"] + counts["tier_changes"] >= STEPS // 50, counts
    assert min(counts["flips"], counts["tier_changes"]) >= STEPS // 200, counts
    assert set(steps_run) == {1, 3} and g.covered["draft"] == len(steps_run)
    assert not g.tree_record.without_draft


def test_every_shipped_and_candidate_design_has_a_long_run() -> None:
    here = {d.name for d in NORMAL_LOOP} | {RETRACT_CATCH_UP.name, RETRACT_CATCH_UP_RADIX.name,
                                            AUTO_RETRACT_CATCH_UP.name, TIERS_RETRACT_CATCH_UP.name}
    assert {d.name for d in SHIPPED + CANDIDATES} == here | V1_LONG_RUN_DESIGNS
    # the v1 file's long run names the designs it runs (and asserts each is the guard's reference there)
    v1_source = (Path(__file__).parent / "test_v1_switch.py").read_text()
    assert "def test_long_run_is_clean_v1" in v1_source and all(f'"{name}"' in v1_source
                                                                 for name in V1_LONG_RUN_DESIGNS)
