"""The auto switch's learner (statemodel.auto_policy) run against a measured throughput table instead of a server.

A sweep gives each mode's tokens/s per concurrency (bench/gpu/bench_client.py rows, or the reference table); a
simulated decode step at batch b in a mode takes the time that mode's measured throughput implies at b
(interpolated in log b between measured points; speculation's points are placed at the batch it ran,
min(c, spec cap)). The learner decides at every step, as the switch does, and sees the steps it chose, in windows
of `window` steps (the switch's rank-agreement window). Used by `specflip calibrate --auto` (what auto would settle
on for a measurement) and by the tests (no thrash, the budget, the cap); `noise` makes each step's time vary
(deterministically, from `seed`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from statemodel import auto_policy as ap

ACCEPT_LENGTH = 2.0  # tokens per request per speculative step; cancels out of the rates the learner compares


def _points(table: Mapping[int, float], spec_cap: int | None) -> list[tuple[int, float]]:
    """(batch, tok/s), ascending; speculation's concurrencies above its cap ran at the cap (the first one kept)."""
    out: dict[int, float] = {}
    for conc in sorted(table):
        batch = min(conc, spec_cap) if spec_cap is not None else conc
        out.setdefault(batch, table[conc])
    return sorted(out.items())


def throughput_at(points: list[tuple[int, float]], batch: int) -> float:
    """tok/s at `batch`: linear in log(batch) between measured points, flat beyond the ends."""
    if batch <= points[0][0]:
        return points[0][1] * batch / points[0][0] if batch < points[0][0] else points[0][1]
    for (b0, t0), (b1, t1) in zip(points, points[1:], strict=False):
        if batch <= b1:
            f = (math.log(batch) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return t0 + f * (t1 - t0)
    return points[-1][1]


@dataclass
class SimResult:
    state: ap.AutoState
    decisions: list[ap.Decision] = field(default_factory=list)  # the flips, in order
    modes: list[bool] = field(default_factory=list)  # the mode of each step (True: speculation)
    tokens: float = 0.0
    seconds: float = 0.0
    cap_breaches: int = 0  # flip_on decided with more requests running than the cap (must stay 0)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def simulate(plain: Mapping[int, float], spec: Mapping[int, float], demands: Iterable[int], *, spec_cap: int = 48,
             state: ap.AutoState | None = None, spec_on: bool = True, window: int = 8, noise: float = 0.0,
             seed: int = 0) -> SimResult:
    """One decode step per demand in `demands`; returns the learner's final state, its flips and the throughput."""
    rng = random.Random(seed)
    plain_pts, spec_pts = _points(plain, None), _points(spec, spec_cap)
    result = SimResult(state=state or ap.initial_state())
    pending: list[ap.Observation] = []
    for demand in demands:
        running = min(demand, spec_cap) if spec_on else demand
        decision = ap.decide(result.state, spec_on, demand, running, spec_cap)
        if decision.action is not None:
            if decision.action == ap.FLIP_ON and running > spec_cap:
                result.cap_breaches += 1
            spec_on = decision.action == ap.FLIP_ON
            result.decisions.append(decision)
        result.state = ap.commit(result.state, decision)
        batch = min(demand, spec_cap) if spec_on else demand
        result.modes.append(spec_on)
        if batch <= 0:
            continue
        tokens = batch * ACCEPT_LENGTH if spec_on else float(batch)
        seconds = tokens / throughput_at(spec_pts if spec_on else plain_pts, batch)
        if noise:
            seconds *= 1 + noise * (2 * rng.random() - 1)
        result.tokens += tokens
        result.seconds += seconds
        pending.append(ap.Observation(spec_on=spec_on, batch=batch, tokens=tokens, seconds=seconds))
        if len(pending) >= window:
            for obs in pending:
                result.state = ap.observe(result.state, obs)
            pending = []
    return result


def settled_modes(plain: Mapping[int, float], spec: Mapping[int, float], *, spec_cap: int = 48,
                  steps: int = 600) -> list[tuple[int, bool]]:
    """The mode the learner holds at each measured concurrency after a sweep up and back down (`steps` decode
    steps at each), carrying what it learned from one concurrency to the next as a live server does."""
    concs = sorted(set(plain) & set(spec))
    state, spec_on = ap.initial_state(), True
    held: dict[int, bool] = {}
    for conc in concs + concs[::-1]:
        res = simulate(plain, spec, [conc] * steps, spec_cap=spec_cap, state=state, spec_on=spec_on)
        state, spec_on = res.state, res.modes[-1]
        held[conc] = spec_on
    return [(c, held[c]) for c in concs]
