"""The auto switch's learner (statemodel.auto_policy) run against a measured throughput table instead of a server.

A sweep gives each mode's tokens/s per concurrency (bench/gpu/bench_client.py rows, or the reference table); a
simulated decode step at batch b in a mode takes the time that mode's measured throughput implies at b
(interpolated in log b between measured points; speculation's points are placed at the batch it ran,
min(c, spec cap)). The learner decides at every step, as the switch does, and sees the steps it chose, in windows
of `window` steps (the switch's rank-agreement window). Used by `specflip calibrate --auto` (what auto would settle
on for a measurement) and by the tests (no thrash, the budget, the cap); `noise` makes each step's time vary
(deterministically, from `seed`).

Two properties of the traffic are inputs, per step or fixed (issue 52): its accept length (`accept`: tokens per
request per verify; the table's were measured at ACCEPT_LENGTH, and a speculative step keeps its time at any accept
length, its tokens scale: requests the draft cannot predict draft at 1.0), and its context (`context`: KV tokens per
running request). A step reads every request's KV, so its seconds are the table's plus a KV-read term that grows with
the context (`StepCost`): the tables were measured at TABLE_CONTEXT tokens per request, and with long prompts every
step costs more, plain decoding's one token per request as much as speculation's verify, whose accepted tokens share
it: where speculation pays moves to larger batches. A third, where the draft's vocabulary is smaller than the target's:
the share of the tokens the target commits that lie in it (`coverage`, which the switch counts and the learner reads
as a bound on the accept length: statemodel.auto_policy.accept_bound); the counter draft's 1,024 ids hold every
output of a predictable request (1.0) and none of an unpredictable one's (0.0). Not given: no signal, as with a draft
of the target's whole vocabulary.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import attrs

from statemodel import auto_policy as ap

ACCEPT_LENGTH = 2.0  # tokens per request per speculative step the tables were measured at (the counter draft)
# KV tokens per request the tables were measured at: 32-token prompts, 128 output tokens (about 96 on average)
TABLE_CONTEXT = 96.0


@dataclass(frozen=True)
class StepCost:
    """A decode step's seconds beyond the table's: per request, each KV token beyond TABLE_CONTEXT costs `plain` (a
    plain step) or `spec` (a speculative one) seconds. The defaults are the 8B-class pair's KV read at the H100's
    memory bandwidth: 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes = 128 KiB per token at about 3 TB/s; a
    verify reads the target's KV once (its draft tokens share it) and the draft's three steps their own one layer
    (3/32 more). An estimate, not a measurement: the learner is not told it, it learns each bucket's line of seconds
    against context from its steps (statemodel.auto_policy.Estimate.at_context). H100_COST below is measured."""

    plain: float = 4.4e-8
    spec: float = 4.4e-8 * (1 + 3 / 32)
    table_context: float = TABLE_CONTEXT
    # seconds per KV token per request beyond TABLE_CONTEXT that a step pays whatever its batch (a small batch's
    # attention does not fill the GPU: its time grows with the context, hardly with the batch)
    plain_flat: float = 0.0
    spec_flat: float = 0.0

    def extra(self, spec_on: bool, batch: int, context: float) -> float:
        per_request, flat = (self.spec, self.spec_flat) if spec_on else (self.plain, self.plain_flat)
        return (per_request * batch + flat) * (context - self.table_context)


# The H100 and the 8B-class pair as the 2026-12-06 (b3a9830) traces of `auto` measured them (bench/gpu/results/
# 2026-12-06_b3a9830/workload_a/traces.tar.gz, switch-3452.jsonl, the `auto_observe` windows; TP 1, SGLang 0.5.16):
# a step's seconds at short contexts (32-token prompts, 128 outputs): plain 5.75 ms at 1 request, 5.8 at 2, 5.87 at 8,
# 7.35 at 128; speculation (accept 2.0) 7.2 ms at 1, 7.29 at 2, 7.95 at 8, about 12.5 at its cap of 48 (the warm-up's
# 7,658 tok/s at 128); 32 requests interpolated (plain 6.3, speculation 11 ms), as tok/s tables. With 2,000-3,500-token
# prompts (about 2,750 tokens per request): speculation at 8 requests 19.4-22.4 ms (+12.3 ms) and at 2 about 13 ms
# (+5.8 ms: the phase times of always on and plain there were equal), so (1.37e-6 + 4.1e-7 x batch) s per KV token;
# plain at 2 requests 7.6-8.0 ms (+2 ms, taken as the same at any batch: 7.5e-7 s per KV token; the plain server's
# phase times give less, about +0.75 ms at 2 and +0.5 ms at 8, so this is the switch's plain runner's own cost).
H100_PLAIN = {1: 174, 2: 345, 8: 1363, 32: 5080, 128: 17415}
H100_SPEC = {1: 278, 2: 550, 8: 2013, 32: 5818, 48: 7680, 128: 7680}
H100_COST = StepCost(plain=0.0, spec=4.1e-7, plain_flat=7.5e-7, spec_flat=1.37e-6)


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
    decisions: list[ap.Decision] = field(default_factory=list)  # the flips (and tier changes), in order
    modes: list[bool] = field(default_factory=list)  # the mode of each step (True: speculation)
    steps: list[int] = field(default_factory=list)  # tiers only: each step's step count (0: plain)
    tokens: float = 0.0
    seconds: float = 0.0
    step_tokens: list[float] = field(default_factory=list)  # each step's tokens and seconds (0 for an idle step)
    step_seconds: list[float] = field(default_factory=list)
    cap_breaches: int = 0  # flip_on decided with more requests running than the cap (must stay 0)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def simulate(plain: Mapping[int, float], spec: Mapping[int, float], demands: Iterable[int], *, spec_cap: int = 48,
             state: ap.AutoState | None = None, spec_on: bool = True, window: int = 8, noise: float = 0.0,
             seed: int = 0, traffic: Sequence[float] | None = None, accept: float | Sequence[float] | None = None,
             context: float | Sequence[float] | None = None, cost: StepCost = StepCost(),
             tell_context: bool = True, fixed: bool = False,
             coverage: float | Sequence[float] | None = None) -> SimResult:
    """One decode step per demand in `demands`; returns the learner's final state, its flips and the throughput.
    `accept`, fixed or per step: the traffic's accept length (default the table's, ACCEPT_LENGTH; 1.0: requests the
    draft cannot predict); a speculative step keeps the table's time, its tokens scale. `traffic`, per step: the
    same relative to the table's (0.5: accept 1.0 where the table's drafted at 2.0; not with `accept`). `context`,
    fixed or per step: the KV tokens per running request, which the learner is told as the switch tells it, and
    which moves each step's seconds by `cost` (default: none given, the table's steps, and the learner is told
    nothing; `tell_context=False`: the steps' seconds move, the learner is told nothing, as before issue 52).
    `fixed`: the mode `spec_on` is held, a static setting (the learner only observes). `coverage`, fixed or per step:
    the draft vocabulary's share of the committed tokens, which the learner is told with every step (default: none,
    no signal); it does not move the steps (give `accept` consistent with it: at most `accept_bound(coverage)`)."""
    if accept is not None:
        if traffic is not None:
            raise ValueError("give the accept length (accept) or its ratio to the table's (traffic), not both")
        traffic = _PerStep(accept, 1 / ACCEPT_LENGTH)
    return _simulate(_points(plain, None), {None: (_points(spec, spec_cap), ACCEPT_LENGTH)}, demands,
                     spec_cap=spec_cap, state=state or ap.initial_state(), steps=None if spec_on else PLAIN_STEPS,
                     window=window, noise=noise, seed=seed, traffic=traffic,
                     context=None if context is None else _PerStep(context), cost=cost, tell_context=tell_context,
                     fixed=fixed, coverage=None if coverage is None else _PerStep(coverage))


class _PerStep:
    """A per-step input given fixed or per step, times `scale`: indexable by the step."""

    def __init__(self, values: float | Sequence[float], scale: float = 1.0) -> None:
        self.values, self.scale = values, scale

    def __getitem__(self, i: int) -> float:
        v = self.values if isinstance(self.values, int | float) else self.values[i]
        return v * self.scale


PLAIN_STEPS = 0  # the simulation's step count of plain decoding


def simulate_tiers(plain: Mapping[int, float], tiers: Mapping[int, Mapping[int, float]], demands: Iterable[int], *,
                   accept: Mapping[int, float] | None = None, spec_cap: int = 48, state: ap.AutoState | None = None,
                   steps: int | None = None, window: int = 8, noise: float = 0.0, seed: int = 0) -> SimResult:
    """As `simulate`, with speculation at each step count of `tiers` (the ladder, from low load to high: its order is
    the dict's; each a tok/s table, always on at that step count). `accept`: tokens per request per verify of each
    tier (default ACCEPT_LENGTH; it sets a step's time from the measured tok/s, and the learner's values do not
    depend on it). `steps`: the tier running at the start (default the ladder's first, as the switch starts; 0:
    plain)."""
    ladder = tuple(tiers)
    state = state or ap.initial_state(tiers=ladder)
    if state.tiers != ladder:
        raise ValueError(f"the learner's tiers {list(state.tiers)} are not the tables' {list(ladder)}")
    accept = accept or {}
    tables = {s: (_points(tiers[s], spec_cap), accept.get(s, ACCEPT_LENGTH)) for s in ladder}
    return _simulate(_points(plain, None), tables, demands, spec_cap=spec_cap, state=state,
                     steps=ladder[0] if steps is None else steps, window=window, noise=noise, seed=seed)


def _simulate(plain_pts: list[tuple[int, float]], spec: Mapping[int | None, tuple[list[tuple[int, float]], float]],
              demands: Iterable[int], *, spec_cap: int, state: ap.AutoState, steps: int | None, window: int,
              noise: float, seed: int, traffic: Sequence[float] | _PerStep | None = None,
              context: _PerStep | None = None, cost: StepCost = StepCost(), tell_context: bool = True,
              fixed: bool = False, coverage: _PerStep | None = None) -> SimResult:
    """The loop of both: `spec` maps each step count (None: speculation without tiers) to its points and accept
    length; `steps` is the mode at the start (PLAIN_STEPS: plain)."""
    rng = random.Random(seed)
    result = SimResult(state=state)
    pending: list[ap.Observation] = []
    spec_on = steps != PLAIN_STEPS
    tier = steps if spec_on else next(iter(spec))  # the tier speculation runs at (kept while off)
    for i, demand in enumerate(demands):
        running = min(demand, spec_cap) if spec_on else demand
        ctx = None if context is None else context[i]
        told = ctx if tell_context else None
        decision = ap.decide(result.state, spec_on, demand, running, spec_cap, steps=tier, context=told)
        if fixed:
            decision = attrs.evolve(decision, action=None, changes_tier=False)
        if decision.action is not None or decision.changes_tier:
            if decision.action == ap.FLIP_ON and running > spec_cap:
                result.cap_breaches += 1
            if decision.action is not None:
                spec_on = decision.action == ap.FLIP_ON
            if decision.steps is not None:
                tier = decision.steps
            result.decisions.append(decision)
        result.state = ap.commit(result.state, decision)
        batch = min(demand, spec_cap) if spec_on else demand
        result.modes.append(spec_on)
        if tier is not None:
            result.steps.append(tier if spec_on else PLAIN_STEPS)
        if batch <= 0:
            result.step_tokens.append(0.0)
            result.step_seconds.append(0.0)
            continue
        points, accept = spec[tier] if spec_on else (plain_pts, 1.0)
        tokens = batch * accept
        seconds = tokens / throughput_at(points, batch)
        if ctx is not None:  # the KV read beyond the table's context (at least half the table's step remains)
            seconds = max(seconds / 2, seconds + cost.extra(spec_on, batch, ctx))
        if spec_on and traffic is not None:
            tokens *= traffic[i]
        if noise:
            seconds *= 1 + noise * (2 * rng.random() - 1)
        result.tokens += tokens
        result.seconds += seconds
        result.step_tokens.append(tokens)
        result.step_seconds.append(seconds)
        pending.append(ap.Observation(spec_on=spec_on, batch=batch, tokens=tokens, seconds=seconds,
                                      steps=tier if spec_on else None, context=told or 0.0,
                                      coverage=None if coverage is None else coverage[i]))
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


@dataclass(frozen=True)
class TierRow:
    """One concurrency of the tiers' simulation: the measured tok/s of each static setting, the best of them, and
    what the auto learner settled on, on a steady load from a fresh start and after a sweep up and back down."""

    conc: int
    static: dict[int, float]  # step count (0: plain) -> measured tok/s
    fresh_steps: int  # the mode a fresh learner ends in after `steady` steps at this concurrency (0: plain)
    fresh_ratio: float  # its simulated tok/s over those steps (probes and learning included) / the best static
    sweep_steps: int  # the mode held here on the way back down a sweep up and down

    @property
    def best(self) -> int:
        return max(self.static, key=lambda s: self.static[s])


def settled_tiers(plain: Mapping[int, float], tiers: Mapping[int, Mapping[int, float]], *, spec_cap: int = 48,
                  steady: int = 1500, sweep: int = 600, noise: float = 0.04) -> list[TierRow]:
    """The tiered learner against the measured tables at every concurrency measured for all of them."""
    concs = sorted(set(plain).intersection(*(set(t) for t in tiers.values())))
    fresh = {c: simulate_tiers(plain, tiers, [c] * steady, spec_cap=spec_cap, noise=noise, seed=c) for c in concs}
    state, start = ap.initial_state(tiers=tuple(tiers)), None
    down: dict[int, int] = {}
    for conc in concs + concs[::-1]:
        res = simulate_tiers(plain, tiers, [conc] * sweep, spec_cap=spec_cap, state=state, steps=start, noise=noise,
                             seed=conc)
        state, start = res.state, res.steps[-1]
        down[conc] = start
    rows = []
    for c in concs:
        static = {PLAIN_STEPS: float(plain[c]), **{s: float(t[c]) for s, t in tiers.items()}}
        rows.append(TierRow(c, static, fresh[c].steps[-1], fresh[c].tok_s / max(static.values()), down[c]))
    return rows
