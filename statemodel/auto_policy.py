"""The auto switch's policy (SPECFLIP_SWITCH=auto): where speculation stops paying, learned from the server's own
decode steps, with no threshold to set. Pure and deterministic: no clock, no I/O, no randomness; the same
observations and the same questions give the same decisions, on every rank (docs/auto-switch.md).

What it learns. Each decode step the switch reports an `Observation`: the mode, the batch size, the tokens the step
committed (speculative: the verify's accept lengths summed; plain: one per request) and its seconds. Per mode and
per batch-size bucket (half octaves: 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, ...) the learner keeps an estimate of
the steps per second each request makes (1 / seconds; plain: tokens / (batch x seconds), the same): a running mean over
the first `min_samples` steps, an EWMA after (weight `alpha`), each step's rate clipped to [1/2, 2] x the estimate
once it is known, so one stalled step does not move it far. Speculation's tokens per step, the mean accept length,
is learned apart, over every speculative step at any batch (the same running mean, then EWMA): it is a property of
the traffic, not of the batch, and a bucket visited only when the traffic drafted badly (session 7: warm-up requests
at accept 1.0) would otherwise keep that accept length until the bucket is probed again, thousands of steps later.
The first `settle` steps after each mode change are not used (the flip-on's re-prefill and the first steps of a
mode are not its steady state).

What it decides. At demand d (running + waiting requests) a mode's throughput is its estimate at the batch it would
run, times that batch: speculation runs min(d, spec cap) requests, plain decoding d. Then:
- both modes known at d: the *incumbent* (the mode last chosen on the numbers) stays unless the other beats it by
  `margin`: a hysteresis band of 2 x margin around the break-even, so noise within it flips nothing;
- otherwise the prior: speculation on while d fits under its running cap, off above. Where the prior keeps the
  current mode and only the other is unknown, the learner *probes* it: a visit to the other mode for `probe_steps`
  steps, then back unless it won by the margin. Probes spend an exploration budget: `explore_fraction` of the steps
  observed (2 %), with `probe_credit` probes' worth at start; an estimate older than `stale_after` steps is probed
  again (when the budget allows), so a drifting host is followed, slowly. A flip on the prior into an unknown mode
  happens at most once per bucket and mode (after it the mode is known);
- a flip for the numbers or the prior waits until the mode has run `min_dwell` steps and every decision of the
  last `confirm_steps` steps wanted it (demand jumping across the crossover flips nothing), unless the numbers
  say the other mode wins by `clear_win` or more (far from the crossover: a burst begins or ends, not noise),
  which waits for neither; a probe's return does not wait;
- speculation comes back on only while the running batch fits under its cap (statemodel.policy.within_spec_cap,
  the model's rule), probes included.

The model. Every decision is a flip_off or flip_on at a scheduling point where the model already lets the switch
flip; design `plain_off_retract_catch_up_auto` (statemodel.design.FreeFlips: off and on at any demand, on only within
the cap) checks every such sequence, probes included. The learner never proposes flip_on above the cap, so its
decisions are a subset of what that design explores (tests/test_auto_policy.py checks it).

Use: `state = initial_state()`; per reported step `state = observe(state, obs)`; per scheduling point
`decision = decide(state, spec_on, demand, running, spec_cap)`; once the switch performed `decision.action` (or it is
None) `state = commit(state, decision)`.
"""

from __future__ import annotations

import hashlib

import attrs

from statemodel.policy import within_spec_cap

FLIP_OFF = "flip_off"
FLIP_ON = "flip_on"


@attrs.frozen
class AutoParams:
    """The learner's parameters. The defaults need no tuning: each is a property of the method, not of a host
    (docs/auto-switch.md says why each value)."""

    margin: float = 0.03  # the other mode must beat the incumbent by 3 % (the 8B host's crossover: 4 % at c=32)
    min_dwell: int = 48  # decode steps in a mode before a flip on the numbers (a flip-on re-prefills the batch)
    confirm_steps: int = 16  # steps the other mode must have been wanted without a break before the flip
    clear_win: float = 0.25  # a win this large needs no confirmation (far from the crossover: a burst, not noise)
    settle: int = 2  # steps after a mode change not used for estimates
    min_samples: int = 8  # steps before an estimate is trusted
    alpha: float = 0.125  # EWMA weight once known
    probe_steps: int = 24  # a probe's length: settle + min_samples + the rank-agreement window (8), rounded up
    explore_fraction: float = 0.02  # the probe budget: 2 % of observed steps
    probe_credit: int = 4  # probes the budget holds at start and at most
    stale_after: int = 8192  # steps after which an estimate is probed again

    def __attrs_post_init__(self) -> None:
        if not (0 <= self.margin < 1 and 0 < self.alpha <= 1 and 0 <= self.explore_fraction < 1
                and self.clear_win >= self.margin):
            raise ValueError(f"auto policy: margin, alpha, explore_fraction out of range: {self}")
        if min(self.min_dwell, self.confirm_steps, self.settle, self.min_samples, self.probe_steps, self.probe_credit,
               self.stale_after) < 0 or self.min_samples < 1:
            raise ValueError(f"auto policy: step counts must be >= 0 (min_samples >= 1): {self}")


@attrs.frozen
class Observation:
    """One decode step as the switch saw it (agreed across ranks before it gets here)."""

    spec_on: bool
    batch: int
    tokens: float | None  # tokens committed: the accept lengths summed (speculative), the batch size (plain);
    # None: a speculative step whose verify results were not processed yet (its seconds count, no accept length)
    seconds: float


@attrs.frozen
class Estimate:
    rate: float  # tokens per request-second
    samples: int
    updated: int  # the learner's step count at the last sample


@attrs.frozen
class Decision:
    """What `decide` answers; `commit` records it. `action`: FLIP_OFF, FLIP_ON or None."""

    action: str | None
    reason: str  # measured | prior | probe | probe_end | probing | dwell | confirming | cap | idle
    incumbent: bool  # the mode held on the numbers after this decision (True: speculation)
    demand: int
    running: int
    spec_value: float | None  # the throughput estimates compared (tokens/s at this demand), None: unknown
    plain_value: float | None
    step: int
    wants_flip: bool = False  # the numbers (or the prior) want the other mode; the flip waits for dwell or confirmation


@attrs.frozen
class AutoState:
    params: AutoParams = AutoParams()
    # ((spec_on, bucket), estimate), sorted: plain, tokens per request-second; speculation, verify steps per
    # second (its tokens per request and step are `accept`, learned over every bucket)
    estimates: tuple[tuple[tuple[bool, int], Estimate], ...] = ()
    accept: Estimate | None = None  # mean accept length (tokens per request per verify), EWMA over speculative steps
    step: int = 0  # observations seen
    run_mode: bool | None = None  # the mode of the last observation
    run_length: int = 0  # observations in that mode in a row
    flip_step: int = -(1 << 30)  # `step` at the last flip (none yet: no dwell owed)
    want_since: int | None = None  # `step` since which every decision wanted the other mode
    incumbent: bool = True  # the server starts with speculation on
    credit: float = 0.0  # exploration budget left, in steps
    probes: int = 0
    flips: int = 0

    def estimate(self, spec_on: bool, bucket: int) -> Estimate | None:
        for key, est in self.estimates:
            if key == (spec_on, bucket):
                return est
        return None

    def digest(self) -> str:
        """A short fingerprint of the whole state: equal on every rank when their learners agree."""
        return hashlib.sha1(repr(self).encode()).hexdigest()[:12]


def initial_state(params: AutoParams | None = None) -> AutoState:
    params = params or AutoParams()
    return AutoState(params=params, credit=float(params.probe_credit * params.probe_steps))


def bucket_of(batch: int) -> int:
    """Half-octave bucket of a batch size: 1 -> 0, 2 -> 1, 3 -> 2, 4 -> 3, 6 -> 4, 8 -> 5, ... 32 -> 9, 48 -> 10."""
    if batch <= 1:
        return 0
    k = batch.bit_length() - 1  # 2^k <= batch < 2^(k+1)
    return 2 * k - 1 + (1 if batch >= 3 << (k - 1) else 0)


def bucket_floor(bucket: int) -> int:
    """The smallest batch size in a bucket (the inverse of bucket_of on bucket floors)."""
    if bucket == 0:
        return 1
    k, half = (bucket + 1) // 2, (bucket + 1) % 2
    return (3 << (k - 1)) if half else (1 << k)


def observe(state: AutoState, obs: Observation) -> AutoState:
    """The state after one more observed decode step."""
    p = state.params
    run = state.run_length + 1 if obs.spec_on == state.run_mode else 1
    step = state.step + 1
    credit = min(float(p.probe_credit * p.probe_steps), state.credit + p.explore_fraction)
    base = attrs.evolve(state, step=step, run_mode=obs.spec_on, run_length=run, credit=credit)
    if run <= p.settle or obs.batch <= 0 or not obs.seconds > 0:
        return base
    if not obs.spec_on and not (obs.tokens is not None and obs.tokens > 0):
        return base
    # speculation: the bucket keeps its verify steps per second, the accept length is learned apart (below)
    rate = 1.0 / obs.seconds if obs.spec_on else obs.tokens / (obs.batch * obs.seconds)
    key = (obs.spec_on, bucket_of(obs.batch))
    old = state.estimate(*key)
    if old is None:
        new = Estimate(rate=rate, samples=1, updated=step)
    else:
        if old.samples >= p.min_samples:
            rate = min(max(rate, old.rate / 2), old.rate * 2)
        n = old.samples + 1
        weight = max(1.0 / n, p.alpha)
        new = Estimate(rate=old.rate + weight * (rate - old.rate), samples=n, updated=step)
    estimates = tuple(sorted([(k, e) for k, e in state.estimates if k != key] + [(key, new)]))
    accept = state.accept
    if obs.spec_on and obs.tokens is not None and obs.tokens > 0:  # tokens per request per verify: a property
        # of the traffic, the same at every batch size
        length = obs.tokens / obs.batch
        if accept is None:
            accept = Estimate(rate=length, samples=1, updated=step)
        else:
            n = accept.samples + 1
            accept = Estimate(rate=accept.rate + max(1.0 / n, p.alpha) * (length - accept.rate), samples=n,
                              updated=step)
    return attrs.evolve(base, estimates=estimates, accept=accept)


def _known(state: AutoState, spec_on: bool, batch: int) -> Estimate | None:
    est = state.estimate(spec_on, bucket_of(batch))
    return est if est is not None and est.samples >= state.params.min_samples else None


def value(state: AutoState, spec_on: bool, demand: int, spec_cap: int) -> float | None:
    """A mode's estimated throughput (tokens/s) at this demand, None when its estimate is not known yet."""
    batch = min(demand, spec_cap) if spec_on else demand
    est = _known(state, spec_on, batch)
    if est is None:
        return None
    if spec_on:  # the bucket's step rate times the accept length learned last, at whatever batch it was seen
        return None if state.accept is None else est.rate * state.accept.rate * batch
    return est.rate * batch


def _stale(state: AutoState, spec_on: bool, demand: int, spec_cap: int) -> bool:
    batch = min(demand, spec_cap) if spec_on else demand
    est = _known(state, spec_on, batch)
    return est is None or state.step - est.updated > state.params.stale_after


def decide(state: AutoState, spec_on: bool, demand: int, running: int, spec_cap: int) -> Decision:
    """The flip for the scheduling point at hand (or None), from the state alone. `demand`: running + waiting
    requests; `running`: requests in flight (the running batch, prefilled and chunked ones included)."""
    p = state.params
    v_spec, v_plain = value(state, True, demand, spec_cap), value(state, False, demand, spec_cap)

    def answer(action: str | None, reason: str, incumbent: bool = state.incumbent, wants: bool = False) -> Decision:
        return Decision(action, reason, incumbent, demand, running, v_spec, v_plain, state.step, wants)

    if demand <= 0:
        return answer(None, "idle")
    dwell = state.step - state.flip_step
    probing = spec_on != state.incumbent
    if probing and dwell < p.probe_steps:
        return answer(None, "probing")
    v_cur = v_spec if spec_on else v_plain
    clear = False
    if v_spec is not None and v_plain is not None:
        inc, challenger = (v_spec, v_plain) if state.incumbent else (v_plain, v_spec)
        want = (not state.incumbent) if challenger > inc * (1 + p.margin) else state.incumbent
        clear = max(v_spec, v_plain) >= min(v_spec, v_plain) * (1 + p.clear_win)
        reason = "measured"
    elif probing:
        want, reason = state.incumbent, "probe_end"
    else:
        want, reason = demand <= spec_cap, "prior"
    settled = want if reason in ("measured", "prior") else state.incumbent
    if want == spec_on:
        other = not spec_on
        if (not probing and v_cur is not None and _stale(state, other, demand, spec_cap)
                and state.credit >= p.probe_steps and dwell >= p.min_dwell
                and (not other or within_spec_cap(running, spec_cap))):
            return answer(FLIP_ON if other else FLIP_OFF, "probe", incumbent=settled)
        return answer(None, reason, incumbent=settled)
    if not probing and not (reason == "measured" and clear):
        # a clear win on the numbers is far from the crossover (a burst starts or ends): no dwell, no confirmation.
        # The H200 (session 9): a lull of one request at a burst's start flipped speculation on, and the dwell
        # then held 80 requests waiting behind 48 speculative steps
        if dwell < p.min_dwell:
            return answer(None, "dwell", wants=True)
        confirmed = state.want_since is not None and state.step - state.want_since >= p.confirm_steps
        if not confirmed:
            return answer(None, "confirming", wants=True)
    if want and not within_spec_cap(running, spec_cap):
        return answer(None, "cap", wants=True)
    return answer(FLIP_ON if want else FLIP_OFF, "probe_end" if probing else reason, incumbent=settled)


def commit(state: AutoState, decision: Decision) -> AutoState:
    """The state after the switch acted on `decision` (performed its flip, or it had none). A flip the switch
    put off (it waits for a prefilled batch to merge) is not committed: the next scheduling point decides again."""
    if decision.action is None:
        want_since = (state.step if state.want_since is None else state.want_since) if decision.wants_flip else None
        if decision.incumbent == state.incumbent and want_since == state.want_since:
            return state
        return attrs.evolve(state, incumbent=decision.incumbent, want_since=want_since)
    flipped = attrs.evolve(state, incumbent=decision.incumbent, flip_step=state.step, flips=state.flips + 1,
                           want_since=None)
    if decision.reason == "probe":
        return attrs.evolve(flipped, probes=state.probes + 1, credit=state.credit - state.params.probe_steps)
    return flipped


def boundaries(state: AutoState, spec_cap: int, largest: int = 512) -> list[tuple[int, bool | None]]:
    """Per bucket floor up to `largest`: the mode the learner holds on the numbers there (True: speculation),
    None where either mode is unknown. What the auto switch settled on, for traces and `specflip calibrate`."""
    out: list[tuple[int, bool | None]] = []
    bucket = 0
    while bucket_floor(bucket) <= largest:
        demand = bucket_floor(bucket)
        v_spec, v_plain = value(state, True, demand, spec_cap), value(state, False, demand, spec_cap)
        out.append((demand, None if v_spec is None or v_plain is None else v_spec >= v_plain))
        bucket += 1
    return out
