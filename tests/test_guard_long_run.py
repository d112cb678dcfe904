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
for plain_off_retract_catch_up, and with the radix cache on its `keep_out` default, plain_off_retract_catch_up_radix.
Not here: the auto and tiers variants of the retract design (their switches learn from a step clock; driven in
tests/test_switch_auto.py and tests/test_switch_tiers.py) and the v1 candidates (SGLang 0.5.12,
tests/test_v1_switch.py).

Marked `long_run` (scripts/test.sh runs every test; `-m "not long_run"` leaves these out). Cost, 2026-12-06 at commit
cac089c on the 2-core development machine shared with other jobs: 13 tests, 62 s of CPU (user + sys), 2 min 28 s wall
at 41 % of a core (`/usr/bin/time -v .venv/bin/python -m pytest tests/test_guard_long_run.py -q`).
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
    CANDIDATES,
    CATCH_UP,
    RETRACT_CATCH_UP,
    RETRACT_CATCH_UP_RADIX,
    SEEDS_FINAL,
    SHIPPED,
    SYNC_V2,
    V2_SWITCH,
)

pytestmark = [pytest.mark.sglang, pytest.mark.long_run]

STEPS = settings.LONG_RUN_STEPS.get()  # per run; a longer run: set SPECFLIP_LONG_RUN_STEPS
CHUNK = 16  # prefill rounds of at most 16 tokens (the prompts are 27-37 tokens) in every other phase of a run
PHASE = 250  # steps: chunked prefill on in the odd phases, off in the even ones


def chunk_at(step: int) -> int | None:
    return CHUNK if (step // PHASE) % 2 else None
NORMAL_LOOP = [SEEDS_FINAL, V2_SWITCH, ADAPTIVE_WARM, CATCH_UP, SYNC_V2]
# driven elsewhere (module docstring): the auto and tiers switches, the v1 (0.5.12) candidates
ELSEWHERE = {"plain_off_retract_catch_up_auto", "plain_off_retract_catch_up_tiers", "v1_plain_off_retract_catch_up",
             "v1_plain_off_retract_catch_up_radix"}


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


@pytest.mark.parametrize("radix", [False, True], ids=["radix_off", "radix_on"])
def test_long_run_retract_switch_is_clean(runtime: Any, model_dir: Path, radix: bool) -> None:
    """plain_off_retract_catch_up (and, with the radix cache on, plain_off_retract_catch_up_radix: the switch's
    keep_out, the guard's tree check beside the reference design)."""
    counts = run_retract_loop(runtime, model_dir, radix=radix)
    g = runtime.guard
    assert g.found == [] and counts["flips"] >= STEPS // 50, counts
    assert not g.tree_record.without_draft


def test_every_shipped_and_candidate_design_has_a_long_run_or_is_named_elsewhere() -> None:
    here = {d.name for d in NORMAL_LOOP} | {RETRACT_CATCH_UP.name, RETRACT_CATCH_UP_RADIX.name}
    assert {d.name for d in SHIPPED + CANDIDATES} == here | ELSEWHERE
