"""The auto switch's policy (SPECFLIP_SWITCH=auto): where speculation stops paying, learned from the server's own
decode steps, with no threshold to set. Pure and deterministic: no clock, no I/O, no randomness; the same
observations and the same questions give the same decisions, on every rank (docs/auto-switch.md).

What it learns. Each decode step the switch reports an `Observation`: the mode, the batch size, the tokens the step
committed (speculative: the verify's accept lengths summed; plain: one per request) and its seconds. Per mode and
per batch-size bucket (half octaves: 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, ...) the learner keeps an estimate of
the seconds a step takes (plain: per token each request gets, batch x seconds / tokens, the same) and of the batch
those steps ran at (the bucket's point: a batch, its seconds; the same weights): a running mean
over the first 64 steps, an EWMA after (weight `step_alpha`, 1/64), each step's seconds clipped to [1/2, 2] x the
estimate once it has `min_samples`, so one stalled step does not move it far. 64 steps, not 8: a step's seconds grow
with its requests' contexts, and an 8-step memory rated a mode by the part of its requests' lives it saw last (the
H200, the 2026-12-02 (eeb8707) run's look at the 2026-12-02 (50a6e62) traces: speculation at 48 from 9.5 to 12.7 ms a
step over each wave of 128-token requests, plain flat; at a wave's start speculation was valued 30 % above its mean).
Seconds and not their inverse, since a throughput is a ratio of sums: a mean of rates overrates a mode whose steps vary
(speculation's near its cap under a closed loop, where a prefill falls into most decode intervals but not all:
2026-12-02, 50a6e62). Speculation's tokens per step, the mean accept length, is learned apart, over every speculative
step at any batch (the same running mean, then EWMA): it is a property of the traffic, not of the batch, and a bucket
visited only when the traffic drafted badly (2026-12-01, 9b58d3b: warm-up requests at accept 1.0) would otherwise keep
that accept length until the bucket is probed again, thousands of steps later. The first `settle` steps after each mode
change are not used (the flip-on's re-prefill and the first steps of a mode are not its steady state).

What it decides. The demand d a decision values is the most requests (running + waiting) any decision saw within the
last `hold_steps` steps, or now's when more: a closed loop's requests of equal length finish together and their
clients' next ones arrive one by one, so at a wave's turnover the demand reads 1 for a moment (the H200, 2026-12-03
(eeb8707): speculation, a clear win at 1, came on at every wave at 48); idle time counts toward the hold as the steps
the held batch would have run in it (`observe_idle`: a turnover of a few ms keeps it, seconds between phases end it).
The hold values the held batch at its context too (`peak_context`: the first request back may be a short one among
long ones; the H200, 2026-12-06 (605161d)). At an emptied server after a burst past the cap, an idle stretch far past
the turnovers' (learned per context band of the held batch: the demand came back to the held peak after them) values
the arriving requests at their own demand where both modes were measured there (`_phase_change`: a quiet phase's first
request 56-84 ms after a burst of 192, the turnovers 5.5-10 ms; the H100, 2026-12-07 (001f95e)).
At demand d a mode's throughput is the batch it
would run over its seconds per step at that batch (speculation: times its accept length); speculation runs min(d, spec
cap) requests, plain decoding d. The seconds at a batch lie on the line between the known buckets' points on either side
of it (a decode step costs about a fixed part plus one per request), flat beyond the outermost point of the batch's own
bucket, each point capped at the least seconds of any point above it (more requests take no less: a probe that fell on
a turnover had made plain at 48 slower than at 128, 2026-12-03, eeb8707). Not a bucket's seconds alone: it spans half an
octave, and speculation's step grows across it far more than plain decoding's (the H200, 2026-12-02 (eeb8707): 46
requests valued at bucket 32's seconds made speculation 2 % ahead where it was 15 % behind). A bucket a mode never ran
at, between two it ran at, gets the same line: a sweep reaches buckets the probe budget has not covered (2026-12-02,
50a6e62: plain at 48, between its known 32 and 128). Such a value is an inference: it counts as known for the numbers
below, never for a clear win, and the bucket is still probed. Then:
- both modes known at d: the *incumbent* (the mode last chosen on the numbers) stays unless the other beats it by
  `margin`: a hysteresis band of 2 x margin around the break-even, so noise within it flips nothing;
- otherwise the prior: speculation on while d fits under its running cap, off above. Where the prior keeps the
  current mode and only the other is unknown, the learner *probes* it: a visit to the other mode for `probe_steps`
  steps, then back unless it won by the margin. Probes spend an exploration budget: `explore_fraction` of the steps
  observed (2 %), with `probe_credit` probes' worth at start; an estimate older than `stale_after` steps is probed
  again (when the budget allows), so a drifting host is followed, and so is a traffic that drafts better than the
  accept length learned last, which no plain step shows (the H200, 2026-12-02 (eedb8cd): the warm-up's traffic drafted
  at 1.0-1.5 and, plain held, speculation was not visited again for 8,192 steps). A first visit (the other mode never
  ran near this batch and context, and entering it re-prefills no running request) may borrow the budget's whole
  holding (`_probe_price`: the H200, 2026-12-06 (3a41e11): probes at short prompts had spent it, and plain decoding
  was never run at long ones). No probe starts while the demand is
  below the hold's peak (a wave's tail: its batch shrinks step by step), nor one of speculation with the demand past
  its cap (it would end at once). A flip on the prior into an unknown mode
  happens at most once per bucket and mode (after it the mode is known);
- a flip for the numbers or the prior waits until the mode has run `min_dwell` steps and every decision of the
  last `confirm_steps` steps wanted it (demand jumping across the crossover flips nothing), unless the numbers
  say the other mode wins by `clear_win` or more (far from the crossover: a burst begins or ends, not noise), or
  speculation holds requests waiting beyond its cap and plain is wanted (each step held costs them their wait),
  which wait for neither; nor does a flip with nothing running (it retracts nothing: about 0.1 ms), except where
  speculation would be left on a stale estimate of itself (`_refresh_first`); a probe's return does not wait;
- speculation comes back on only while the running batch fits under its cap (statemodel.policy.within_spec_cap,
  the model's rule), probes included.

The catch-up's cost (the draining burst of 2026-12-02 (92327c6) on the H200). Under the switch's default design a
flip-on retracts the running requests, and their re-prefill (target and draft over prompt and output) is the draft's
catch-up: every running request waits through it (there, for 21-24 requests of about 170 tokens, 31 ms median from the
flip to the first speculative step's launch, 28-247 ms). Closed-loop loads flip on at an emptied server, where it costs
nothing; a batch that drains gradually, or traffic that never stops, flips on with requests running. So a flip-on on the
numbers with requests running must also pay for its catch-up: the learner fits the catch-up's seconds as a fixed part
plus one per re-prefilled token (`observe_catch_up`: the flip to the first speculative decode launch, agreed across
ranks like the steps; `CatchUpCost`), and `gate_catch_up` lets such a flip-on through only when the time speculation
saves over the running requests' remaining tokens, at the two modes' throughputs at this demand, exceeds the catch-up
those requests cost: R x (1/plain - 1/spec) > c(T) (R: output tokens the running requests may still ask for, T: tokens
their re-prefill runs). Until a catch-up has been observed, nothing is gated; probes and the prior are not gated (they
learn what the numbers do not know yet). A held flip-on waits like a dwell (`reason` "catch_up"); as the batch drains, R
and T shrink together but speculation's gain at the lower demand grows, so it flips on later, with fewer requests to
retract. R counts only the requests running now, but speculation also serves those still to come: once every request
that ran at the first hold has finished and the numbers still want speculation, the load is steady, not draining, and
the flip-on goes through (`turned_over`; without it a steady low load of long prompts would stay plain for good).

Acceptance that shifts and the context (issue 52). No plain step shows the accept length: after requests the draft could
not predict flipped plain on, predictable ones that came back were not seen until speculation's estimate went stale.
Plain, held on the numbers, now *rechecks* speculation (`_recheck_due`) when its accept length fell by `clear_win` below
the highest it reached, speculation at that peak would win at this load, and the steps since it last drafted cover a
recheck's estimated loss (its `recheck_span` decode steps) over `recheck_fraction` of the time (the rechecks' cost is
bounded by construction), once the requests have turned over (most of the next batch's `arrivals` came after speculation
last drafted: the accept length belongs to the requests, and new ones are where it may have changed). A window's accept
length a clear win off the estimate twice in a row, beyond the windows' own spread (per verify result), starts the
estimate afresh (`accept_runs`; windows in which a request finished start no run). Where the draft's vocabulary is
smaller than the target's, the switch also counts the share of the committed tokens inside it (`Observation.coverage`),
which plain steps show and which bounds the accept length (`accept_bound`: 1 / (1 - coverage)): a bound risen by a clear
win over what speculation was measured at makes a recheck due at once, borrowing the budget, and a bound that cannot
beat plain decoding spends no recheck (`_recheck_due`); the coverage a recheck weighs is that of the next batch's own
requests once they have committed `batch_cover_tokens` (`batch_coverage`, counted per request by the switch), not the
windows' blend of the requests before them; without it, everything above is unchanged. A step reads every
running request's KV: each bucket keeps an estimate per context band (`context_band`), each its own line of seconds
against context (`Estimate.at_context`), and `decide` values every mode at the next batch's context (`context=`: the
switch gives the longest running or waiting request's, which paces a speculative step) from the buckets that ran near
it; a mode none of whose buckets did is probed there, so a phase of long prompts, where speculation pays at other
batches, is valued from what each mode measured there. Where plain decoding won by the margin at a smaller batch at this
context, or speculation was not ahead by the margin at half the batch or less (its gain falls by more than that over a
doubling), the prior runs plain and speculation is not probed (`_outgrown`). Speculation is not left for plain on a
clear win over a stale estimate of itself: its next steps re-measure it first (`_refresh_first`), so no probe with the
requests running, paying their catch-up, comes back for it (the H100, 2026-12-06, c93100f). The hold ends early where
the demand settled below its peak (`calm_points`: a quiet phase after a burst is not a turnover). The 2026-12-06
(59347e0, c93100f) H100 traces' findings: docs/auto-switch.md.

The model. Every decision is a flip_off or flip_on at a scheduling point where the model already lets the switch
flip; design `plain_off_retract_catch_up_auto` (statemodel.design.FreeFlips: off and on at any demand, on only within
the cap) checks every such sequence, probes included. The learner never proposes flip_on above the cap, so its
decisions are a subset of what that design explores (tests/test_auto_policy.py checks it).

Tiers (issue 23, SPECFLIP_SWITCH=auto with SPECFLIP_TIERS=3,1): the modes are plain decoding and speculation at each
step count of the ladder (`AutoState.tiers`, from low load to high; mode 0 is plain, mode i the ladder's i-th). Every
rule above holds per mode: an estimate per (mode, bucket); the accept length per tier (it depends on the step
count); the numbers compare every known mode against the incumbent with the margin (above the cap only with plain
among them: two tiers known there, plain not, would hold speculation where the prior runs plain); the prior is the
ladder's first tier (its low-load end: steps 3 in 3,1) while demand fits under the cap, plain above; a probe visits
the first stale mode (plain, then the ladder in order) on the same budget; dwell, confirmation and the clear win apply
to every mode change, a tier change included. A tier change is no flip: speculation stays on and the next decode runs
another step count, which design plain_off_retract_catch_up_tiers (statemodel.design.TierFlips: free flips, any tier
at every draft) allows at every draft. With no tiers (`tiers=()`) there are two modes, plain and speculation at whatever
step count the server runs, and the learner is the two-mode one above, decision for decision.

Use: `state = initial_state()` (tiers: `initial_state(tiers=(3, 1))`); per reported step `state = observe(state, obs)`
(per observed catch-up `state = observe_catch_up(state, tokens, seconds)`); per scheduling point `decision =
decide(state, spec_on, demand, running, spec_cap)` (tiers: `steps=` the tier running now), and for a flip-on with
requests running `decision = gate_catch_up(state, decision, remaining, catch_up_tokens)`; once the switch performed
`decision.action` and, with tiers, runs `decision.steps` (or there was no change) `state = commit(state, decision)`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import attrs

from statemodel.policy import within_spec_cap

FLIP_OFF = "flip_off"
FLIP_ON = "flip_on"
# KV tokens per request within which a bucket's seconds count as measured at any context (`Estimate.at_context`): a
# request's whole life at short prompts (32-token prompts and 128 outputs: 32 to 160 tokens); on the
# H100 (2026-12-06, b3a9830) speculation's step at 2 requests took 7.27 ms from 37 to 150 tokens
SHORT_CONTEXT = 128.0
PLAIN = 0  # the mode of plain decoding; speculation's modes are 1.. (the ladder's tiers in order; no tiers: 1 only)


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
    alpha: float = 0.125  # EWMA weight once known: the accept length, the catch-up's seconds per token
    step_alpha: float = 1 / 64  # ... and a bucket's step seconds: they follow the requests' lives (below)
    probe_steps: int = 24  # a probe's length: settle + min_samples + the rank-agreement window (8), rounded up
    explore_fraction: float = 0.02  # the probe budget: 2 % of observed steps
    probe_credit: int = 4  # probes the budget holds at start and at most
    stale_after: int = 1024  # steps after which an estimate is probed again (about one probe per budget period)
    # ... but plain decoding's, where speculation's measured value beats it by `clear_win`, only after this many: a
    # plain step's seconds follow the host and the batch, not the traffic, and speculation's own steps keep its value
    # fresh (`_behind_clearly`)
    stale_behind_after: int = 8192
    hold_steps: int = 16  # a decision values the most requests seen within the last 16 steps (a wave's turnover)
    # ... unless the demand has settled below that peak: this many scheduling points in a row with requests running,
    # none waiting and the demand unchanged (a wave's turnover brings its requests back a few at a time, each
    # scheduling point finding more: docs/auto-switch.md; 0: the hold ends by its steps only)
    calm_points: int = 4
    # ... and, at an emptied server, where it stood idle over this many times the longest idle stretch a wave's
    # turnover has shown at the held batch's context band (its demand came back to the held peak after it), the held
    # peak was a burst past the cap and both modes were measured at the arriving demand: a phase change, valued at its
    # own demand (`_phase_change`; 0: never)
    turnover_idle_factor: float = 2.0
    # a recheck of speculation whose accept length fell (the traffic drafts worse: issue 52): at most this share of
    # the time is spent rechecking, on the learner's own estimate of what a recheck loses if the traffic still drafts
    # as badly (0: no rechecks)
    recheck_fraction: float = 0.03
    recheck_steps: int = 16  # a recheck's length: settle + the agreement window's lag (8) + 6 accept samples
    # a recheck weighs the next batch's own coverage once its requests have committed this many tokens (`_recheck_due`):
    # two requests' first tokens (their prefill's) and one plain step; its noise costs at most a recheck, within budget
    batch_cover_tokens: int = 4
    # decode steps between the switch's agreements across ranks (shim.switch.auto.AutoSwitch.window): the learner
    # observes steps a window at a time, so a probe's or a recheck's end falls on a window's end (`recheck_span`)
    agree_window: int = 8

    @property
    def recheck_span(self) -> int:
        """The decode steps a recheck runs in the switch, which its estimated loss counts (`_recheck_due`): it ends at
        the first agreement at which the learner has counted `recheck_steps` steps since the flip, and the first
        window after a flip counts one step fewer than it runs (the interval across the flip is not measured). With
        the defaults 24 (16 counted: 7, 15, then 23 at the third window's end); the H100 (2026-12-06, 0b48981): every
        recheck's windows held 7, 8 and 8 speculative steps (tests/data/h100_auto_windows_0b48981_b.json), where the
        learner had priced 16."""
        w = max(1, self.agree_window)
        return w * -(-(self.recheck_steps + 1) // w)

    def __attrs_post_init__(self) -> None:
        if not (0 <= self.margin < 1 and 0 < self.alpha <= 1 and 0 < self.step_alpha <= 1
                and 0 <= self.explore_fraction < 1 and self.clear_win >= self.margin
                and 0 <= self.recheck_fraction < 1 and self.turnover_idle_factor >= 0):
            raise ValueError(f"auto policy: margin, alpha, step_alpha, explore_fraction, recheck_fraction or "
                             f"turnover_idle_factor out of range: {self}")
        if min(self.min_dwell, self.confirm_steps, self.settle, self.min_samples, self.probe_steps, self.probe_credit,
               self.stale_after, self.stale_behind_after, self.hold_steps, self.recheck_steps,
               self.calm_points, self.batch_cover_tokens) < 0 or self.min_samples < 1 \
                or self.agree_window < 1:
            raise ValueError(f"auto policy: step counts must be >= 0 (min_samples, agree_window >= 1): {self}")


@attrs.frozen
class Observation:
    """One decode step as the switch saw it (agreed across ranks before it gets here)."""

    spec_on: bool
    batch: int
    tokens: float | None  # tokens committed: the accept lengths summed (speculative), the batch size (plain);
    # None: a speculative step whose verify results were not processed yet (its seconds count, no accept length)
    seconds: float
    steps: int | None = None  # tiers: the step count a speculative step ran at; None without tiers
    # the KV tokens per request the step read (prompt and output; the switch gives its longest request's, which paces
    # a speculative step: shim.switch.auto.batch_context); 0: not known
    context: float = 0.0
    # the share of the tokens the target committed (the step's window's) that lie in the draft's vocabulary; None: no
    # signal (the draft's vocabulary is the target's, or no token was counted): `accept_bound`
    coverage: float | None = None
    # a request finished in the window that gave this step's accept length (its last verify may be cut short by its
    # length, not by the draft): such a window's sample is learned, but neither starts nor breaks a run (`accept_runs`)
    finished: bool = False
    # the verify results (one per request and verify) whose mean is this step's accept length: its window's, which
    # under the overlap schedule may hold fewer than its steps times its batch; 0: not known (the batch stands in)
    rows: int = 0


@attrs.frozen
class Estimate:
    mean: float  # what is estimated: a bucket's seconds per step, an accept length, the catch-up's seconds per token
    samples: int
    updated: int  # the learner's step count at the last sample
    at: float = 0.0  # a bucket's: the batch its samples ran at, averaged with the same weights (0 for the others)
    weighted: int = 0  # the samples the running mean's weight counts (0: all of them); a relearned estimate's since
    ctx: float = 0.0  # a bucket's: the KV tokens per request its samples ran at, the same weights (0: not known)
    ctx_sq: float = 0.0  # ... the mean of their squares, and of context x seconds, the same weights: the bucket's own
    ctx_s: float = 0.0  # line of seconds against context (`at_context`)

    def at_context(self, context: float) -> float | None:
        """A bucket's seconds per step at `context` (KV tokens per request), None where its samples did not run near
        that context. A step reads every request's KV, so its seconds grow with the context, by how much each mode's
        own and each batch's own: on the H100 (2026-12-06, b3a9830) speculation's step at 8 requests from 8 ms at
        about 100 tokens to 20-22 ms at 2,700, plain decoding's from 5.9 to about 6.6 ms, and at 2 requests plain's
        from 5.8 to 7-8 ms, the long prompts' prefills in its intervals. One slope per mode, learned at one batch and
        carried to others, made plain at 8 requests 17.7 ms there and speculation at 2 requests 4.2 ms at short
        contexts (issue 52). So each bucket keeps its own line: its seconds against its samples' contexts, weighted as
        its mean (a least-squares fit; flat where the contexts hardly varied, never falling with the context), and
        answers only within two standard deviations of its contexts plus half their mean (at least SHORT_CONTEXT):
        elsewhere the mode is not known at this context, and is probed like an unknown bucket."""
        if self.ctx <= 0:  # contexts not known: the bucket as measured
            return self.mean
        var = max(0.0, self.ctx_sq - self.ctx * self.ctx)
        if abs(context - self.ctx) > 2 * math.sqrt(var) + max(self.ctx / 2, SHORT_CONTEXT):
            return None
        # flat where the contexts spread less than a tenth of their mean or SHORT_CONTEXT / 2 (one standard
        # deviation): within a short request's life a step's seconds do not resolve a slope, and one fitted to their
        # noise (a prefill in an interval) put speculation at 2 requests 40 % slower 5 tokens further on
        # (tests/test_switch_auto.py's stand-in clock, 2026-12-06, where `_outgrown` then read it as a loss)
        slope = max(0.0, (self.ctx_s - self.ctx * self.mean) / var) \
            if var > max(0.1 * self.ctx, SHORT_CONTEXT / 2) ** 2 else 0.0
        return max(self.mean / 2, self.mean + slope * (context - self.ctx))


@attrs.frozen
class CatchUpCost:
    """A flip-on's catch-up, learned as a line: seconds = fixed + per token x tokens re-prefilled, a least-squares fit
    over the catch-ups observed (weighted means of tokens, seconds and their products: a running mean, then the EWMA
    weight `alpha`). Mostly a fixed cost on the H200 (2026-12-03, dff2822: 85 to 4,768 tokens in 21-47 ms), so one rate
    per token overrated a large catch-up several times; with one size seen so far, that rate is all there is."""

    samples: int
    updated: int
    tokens: float
    seconds: float
    tokens_sq: float
    tokens_seconds: float

    def seconds_for(self, tokens: float) -> float:
        var = self.tokens_sq - self.tokens * self.tokens
        if self.samples < 2 or var <= (0.1 * self.tokens) ** 2:  # (about) one size seen: its rate per token
            return self.seconds / self.tokens * tokens
        per_token = max(0.0, (self.tokens_seconds - self.tokens * self.seconds) / var)
        fixed = max(0.0, self.seconds - per_token * self.tokens)
        return fixed + per_token * tokens


@attrs.frozen
class Decision:
    """What `decide` answers; `commit` records it. `action`: FLIP_OFF, FLIP_ON or None (with tiers, a None action may
    still change the tier: `changes_tier`)."""

    action: str | None
    reason: str  # measured | prior | probe | recheck | probe_end | probing | dwell | confirming | cap | idle | catch_up
    incumbent: int  # the mode held on the numbers after this decision (PLAIN, or a speculative mode; no tiers: 1)
    demand: int
    running: int
    spec_value: float | None  # the throughput estimates compared (tokens/s at this demand), None: unknown; with
    plain_value: float | None  # tiers, spec_value is the best known tier's
    step: int
    wants_flip: bool = False  # the numbers (or the prior) want another mode; the change waits for dwell or confirmation
    steps: int | None = None  # tiers: the step count speculation runs at after this decision (None: plain; no tiers)
    changes_tier: bool = False  # tiers: speculation stays on at another step count (no flip)
    values: tuple[float | None, ...] = ()  # tiers: every mode's value (plain, then the ladder), for the trace
    saved_s: float | None = None  # gate_catch_up: the seconds speculation would save over the running requests
    catch_up_s: float | None = None  # ... and the seconds their catch-up (re-prefill) would cost
    load: int = 0  # the demand valued: `demand`, or the most seen within the last `hold_steps` steps
    context: float | None = None  # the KV tokens per running request the values are for (None: as learned)
    recheck_debt: float = 0.0  # a recheck: the budget's steps it borrowed, still owed after it (`_recheck_due`)


@attrs.frozen
class IdleStretch:
    """An idle stretch the demand hold outlived (`observe_idle`), until the demand shows what it was: a wave's
    turnover where it comes back to `peak`, not one where it settles below it (`calm_points`; `commit`). A wave's
    ramp can outlast the hold (its prefills 10-20 ms apart, up to 2 decode steps between them), so steps do not
    end it; the next stretch under a live hold replaces it. It also stands after the hold yielded to it (a wave that
    comes back then is learned). The switch does not call `observe_idle` where no hold is live, so a stretch may
    stand past the phase it began: learned later, where the demand reaches its peak, it can only raise
    its band's turnover (the rule then acts less often there); and at a decision with nothing running that no idle
    iteration preceded (the next requests already waiting when the last ones finished), it is still weighed
    (`_phase_change`)."""

    seconds: float  # agreed across ranks (the switch's MAX), like every input of the learner
    peak: int  # the hold's peak at the stretch's end
    band: int = 0  # the context band of the held batch (`peak_context`: `context_band`), whose turnover it may be


@attrs.frozen
class AutoState:
    params: AutoParams = AutoParams()
    # ((mode, bucket, context band), estimate), sorted: plain, tokens per request-second; a speculative mode, verify
    # steps per second (its tokens per request and step are its accept length, learned over every bucket)
    estimates: tuple[tuple[tuple[int, int, int], Estimate], ...] = ()
    # (mode, mean accept length: tokens per request per verify), EWMA over that mode's speculative steps
    accepts: tuple[tuple[int, Estimate], ...] = ()
    tiers: tuple[int, ...] = ()  # the ladder's step counts, from low load to high; (): speculation is one mode
    step: int = 0  # observations seen
    run_mode: int | None = None  # the mode of the last observation
    run_length: int = 0  # observations in that mode in a row
    flip_step: int = -(1 << 30)  # `step` at the last mode change (none yet: no dwell owed)
    want_since: int | None = None  # `step` since which every decision wanted another mode
    peak: int = 0  # the most requests a decision saw within `hold_steps` steps before `peak_step`
    peak_step: int = -(1 << 30)  # (moved back by idle time: `observe_idle`)
    peak_context: float = 0.0  # the context of the decision that last set the peak (the held batch's)
    # committed decisions in a row with requests running, none waiting and the demand unchanged (`calm_points`), and
    # the last one's demand
    calm: int = 0
    last_demand: int = 0
    # per context band of the held batch (`context_band` of `peak_context`), sorted: the longest idle stretch
    # (seconds) after which the demand came back to the hold's peak, a wave's turnover (none: not seen yet in that
    # band). A wave's turnover lasts as long as its clients take to send the next requests and the server to admit
    # them, which grows with their prompts: on the H100 (2026-12-07, 1009c9d) waves of 64 clients of 2,000-3,500-token
    # prompts idled 33 ms, waves of 2 to 192 clients of 32-token prompts 6-23 ms. And the last idle stretch the hold
    # outlived, until the demand shows which it was
    turnover_idles: tuple[tuple[int, float], ...] = ()
    idle: IdleStretch | None = None
    incumbent: int = 1  # the server starts with speculation on (with tiers: the ladder's first)
    credit: float = 0.0  # exploration budget left, in steps
    probes: int = 0
    flips: int = 0
    tier_changes: int = 0
    catch_up: CatchUpCost | None = None  # the seconds a flip-on's catch-up (re-prefill) takes, learned
    # (mode, the highest accept length it has drafted at, once known): what the traffic may draft at again
    accept_peaks: tuple[tuple[int, float], ...] = ()
    probe_len: int = 0  # the running probe's length (0: probe_steps); a recheck's is recheck_steps
    rechecks: int = 0  # rechecks of speculation whose accept length fell
    # (mode, samples in a row a clear win above (> 0) or below (< 0) its accept length's estimate, the mean square
    # of the samples' deviations from the estimate outside runs, each times its rows (the spread of one verify
    # result's accept length): EWMA, weight `alpha`; the estimate the run is judged against: its value at the run's
    # first sample)
    accept_runs: tuple[tuple[int, int, float, float], ...] = ()
    # the draft vocabulary's coverage of the tokens the target commits (`Observation.coverage`; EWMA, weight `alpha`,
    # over every observed step that carries it; None: no signal), and per speculative mode the coverage its accept
    # length was measured at (averaged with the accept length's own weights: the two are like for like)
    coverage: Estimate | None = None
    accept_covers: tuple[tuple[int, float], ...] = ()
    recheck_debt: float = 0.0  # budget steps an early recheck borrowed, not yet paid back (`_recheck_due`)

    def accept_cover(self, mode: int) -> float | None:
        return next((v for m, v in self.accept_covers if m == mode), None)

    def accept_peak(self, mode: int) -> float | None:
        return next((v for m, v in self.accept_peaks if m == mode), None)

    def turnover_idle(self, band: int | None = None) -> float:
        """The longest turnover's idle seconds of waves held at context band `band` (`turnover_idles`); where none
        was seen in that band, or `band` is None, the longest of any band (0.0: none seen)."""
        known = dict(self.turnover_idles)
        if band in known:
            return known[band]
        return max(known.values(), default=0.0)

    def estimate(self, mode: int, bucket: int, band: int = 0) -> Estimate | None:
        """A bucket's estimate in one context band (`context_band`; 0: short contexts, or contexts not known)."""
        for key, est in self.estimates:
            if key == (mode, bucket, band):
                return est
        return None

    def accept_of(self, mode: int) -> Estimate | None:
        for m, est in self.accepts:
            if m == mode:
                return est
        return None

    @property
    def accept(self) -> Estimate | None:
        """Speculation's accept length (no tiers: its one mode; with tiers, the ladder's first tier's)."""
        return self.accept_of(1)

    @property
    def modes(self) -> range:
        """PLAIN and each speculative mode."""
        return range(1 + max(1, len(self.tiers)))

    def mode_of(self, spec_on: bool, steps: int | None) -> int | None:
        """The mode a step ran in: PLAIN, or speculation's (with tiers, its step count's; None: a step count off
        the ladder, which nothing learns from)."""
        if not spec_on:
            return PLAIN
        if not self.tiers:
            return 1
        return self.tiers.index(steps) + 1 if steps in self.tiers else None

    def steps_of(self, mode: int) -> int | None:
        """The step count of a speculative mode with tiers; None for plain and without tiers."""
        return self.tiers[mode - 1] if self.tiers and mode != PLAIN else None

    def digest(self) -> str:
        """A short fingerprint of the whole state: equal on every rank when their learners agree."""
        return hashlib.sha1(repr(self).encode()).hexdigest()[:12]


def initial_state(params: AutoParams | None = None, tiers: tuple[int, ...] = ()) -> AutoState:
    """The learner at start-up; `tiers`: the ladder's step counts, from low load to high (distinct, >= 1)."""
    params = params or AutoParams()
    if len(set(tiers)) != len(tiers) or any(s < 1 for s in tiers):
        raise ValueError(f"auto policy: tiers must be distinct step counts >= 1, got {list(tiers)}")
    return AutoState(params=params, credit=float(params.probe_credit * params.probe_steps), tiers=tuple(tiers))


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


def _weight(n: int, alpha: float) -> float:
    """The weight of an estimate's `n`-th sample: a running mean over the first ones, then an EWMA with `alpha`."""
    return max(1.0 / n, alpha)


def _mix_weight(old: Estimate | None, alpha: float) -> float:
    """The weight `_ewma` gives the next sample of `old` (1: the first)."""
    if old is None:
        return 1.0
    return _weight((old.weighted + 1 if old.weighted else 0) or old.samples + 1, alpha)


def _ewma(old: Estimate | None, sample: float, step: int, alpha: float, at: float = 0.0, ctx: float = 0.0) -> Estimate:
    """A running mean over the first samples, then an EWMA with weight `alpha`; `at` (a bucket's batch size of this
    sample) and `ctx` (its KV tokens per request) are averaged with the same weights."""
    if old is None:
        return Estimate(mean=sample, samples=1, updated=step, at=at, ctx=ctx, ctx_sq=ctx * ctx, ctx_s=ctx * sample)
    n = old.samples + 1
    weighted = old.weighted + 1 if old.weighted else 0
    w = _mix_weight(old, alpha)
    mix = lambda a, b: a + w * (b - a)  # noqa: E731
    return Estimate(mean=mix(old.mean, sample), samples=n, updated=step, at=mix(old.at, at), weighted=weighted,
                    ctx=mix(old.ctx, ctx), ctx_sq=mix(old.ctx_sq, ctx * ctx), ctx_s=mix(old.ctx_s, ctx * sample))


def _clipped_ewma(old: Estimate | None, sample: float, step: int, p: AutoParams, alpha: float,
                  at: float = 0.0, ctx: float = 0.0, expected: float | None = None, clip: bool = True) -> Estimate:
    """`_ewma` with the sample clipped to [1/2, 2] x the estimate (`expected`: the estimate at the sample's context)
    once it has `min_samples`: one stalled step (or catch-up) does not move a known estimate far. `clip=False`: a
    sample the estimate cannot judge (a context it has not run near)."""
    if clip and old is not None and old.samples >= p.min_samples and not 0 < old.weighted < p.min_samples:
        ref = old.mean if expected is None else expected
        sample = min(max(sample, ref / 2), ref * 2)
    return _ewma(old, sample, step, alpha, at, ctx)


def observe(state: AutoState, obs: Observation) -> AutoState:
    """The state after one more observed decode step."""
    p = state.params
    mode = state.mode_of(obs.spec_on, obs.steps)
    run = state.run_length + 1 if mode == state.run_mode else 1
    step = state.step + 1
    credit = min(float(p.probe_credit * p.probe_steps), state.credit + p.explore_fraction)
    base = attrs.evolve(state, step=step, run_mode=mode, run_length=run, credit=credit)
    if obs.coverage is not None:  # a property of the traffic, whatever the mode and however settled
        base = attrs.evolve(base, coverage=_ewma(state.coverage, obs.coverage, step, p.alpha))
        if mode == PLAIN:
            base = _bounded_accepts(base)
    if mode is None or run <= p.settle or obs.batch <= 0 or not obs.seconds > 0:
        return base
    if mode == PLAIN and not (obs.tokens is not None and obs.tokens > 0):
        return base
    # the bucket keeps the seconds a step takes (plain: per token each request gets, the same), the accept length is
    # learned apart (below). Seconds, not their inverse: a throughput is tokens over seconds summed, and a mean of
    # 1 / seconds overrates a mode whose steps vary (a decode with a prefill in its interval, one without: 8 and 16 ms
    # average 12 ms, their rates 1 / 10.7 ms)
    seconds = obs.seconds if mode != PLAIN else obs.seconds * obs.batch / obs.tokens
    # the context (KV tokens per request): each bucket keeps an estimate per context band (`context_band`), each its
    # own line of seconds against its steps' contexts (`Estimate.at_context`)
    ctx = obs.context if obs.context > 0 else 0.0
    key = (mode, bucket_of(obs.batch), context_band(ctx))
    old = state.estimate(*key)
    # a stale estimate is learned afresh, its old mean weighing as one sample (it stays a point: its count stands): it
    # is probed again because it may be wrong (the H200, 2026-12-03 (dff2822): plain at 48 kept the running mean of a
    # ramp's prefill-filled intervals, about 9 ms, and a probe's 22 steps at 5.0 ms moved it to 6.2 ms only, below
    # speculation's value; `auto` held speculation at 48 through three rounds, 0.81x)
    old = attrs.evolve(old, weighted=1) if old is not None and step - old.updated > p.stale_after else old
    # the clip's reference is the band's seconds at this step's context, and a step at a context the band has not run
    # near is not clipped (a phase of long prompts is learned at its own step time)
    expected = None if old is None or not (ctx > 0 and old.ctx > 0) else old.at_context(ctx)
    clip = expected is not None or not (ctx > 0 and old is not None and old.ctx > 0)
    estimates = tuple(sorted([(k, e) for k, e in state.estimates if k != key]
                             + [(key, _clipped_ewma(old, seconds, step, p, p.step_alpha, at=float(obs.batch), ctx=ctx,
                                                    expected=expected, clip=clip))]))
    accepts, peaks, runs = base.accepts, state.accept_peaks, state.accept_runs  # (base: `_bounded_accepts`)
    if mode != PLAIN and obs.tokens is not None and obs.tokens > 0:  # tokens per request per verify: a property
        # of the traffic and the step count, the same at every batch size
        sample, was = obs.tokens / obs.batch, state.accept_of(mode)
        # the traffic drafts otherwise: `confirm_steps` samples in a row (two agreement windows) a clear win above or
        # below the estimate, on the same side, and beyond three times the samples' own spread about it, are learned
        # afresh, not averaged in over a dozen windows while speculation runs at accept 1.0 (the H100, 2026-12-07
        # (1009c9d): 23-24 steps at 1.0 into accept_shift's unpredictable phase, p99 1.055x plain's). A run is judged
        # against the estimate at its first sample (the EWMA it moves would leave the clear win within 11 samples of
        # a drop from 2.0 to 1.0), and its samples stay out of the spread (each would widen it for the next). Where
        # the windows' accept lengths vary by themselves the spread keeps it to the EWMA: the spread of one verify
        # result (a sample is the mean of its window's `rows`: one result varies as much as eight averaged over eight
        # would, so a sample's squared deviation is weighed by its rows); a window in which a request finished (its
        # last verify cut short by its length, not by the draft: two such in a row relearned a wave's end low)
        # neither starts nor breaks a run
        run, noise, ref = next(((r, v, f) for m, r, v, f in state.accept_runs if m == mode), (0, 0.0, 0.0))
        rows = obs.rows or obs.batch
        if not obs.finished:
            against = ref if run else (was.mean if was is not None else 0.0)
            side = 0
            if was is not None and was.samples >= p.min_samples and rows * (sample - against) ** 2 > 9 * noise:
                side = (sample >= against * (1 + p.clear_win)) - (sample * (1 + p.clear_win) <= against)
            run, ref = (run + side, ref) if side and run and (run > 0) == (side > 0) else (side, against)
        if was is not None and not run:
            noise += _weight(was.samples + 1, p.alpha) * (rows * (sample - was.mean) ** 2 - noise)
        restart = was is not None and abs(run) >= max(1, p.confirm_steps)
        if restart:
            was, run = attrs.evolve(was, mean=sample, weighted=1), 0
        runs = tuple(sorted([r for r in state.accept_runs if r[0] != mode] + [(mode, run, noise, ref)]))
        if obs.coverage is not None:  # the coverage this accept length was measured at, with its weights
            cover = state.accept_cover(mode)
            w = 1.0 if cover is None or restart else _mix_weight(was, p.alpha)
            cover = obs.coverage if cover is None else cover + w * (obs.coverage - cover)
            covers = tuple(sorted([(m, v) for m, v in state.accept_covers if m != mode] + [(mode, cover)]))
            base = attrs.evolve(base, accept_covers=covers)
        accept = _ewma(was, sample, step, p.alpha)
        accepts = tuple(sorted([(m, e) for m, e in accepts if m != mode] + [(mode, accept)]))
        # the highest accept length the traffic has drafted at (once the estimate is trusted, and not while a
        # recheck relearns it): a fallen one may come back (`_recheck_due`)
        if accept.samples >= p.min_samples and not 0 < accept.weighted < p.min_samples \
                and accept.mean > (state.accept_peak(mode) or 0.0):
            peaks = tuple(sorted([(m, v) for m, v in peaks if m != mode] + [(mode, accept.mean)]))
    return attrs.evolve(base, estimates=estimates, accepts=accepts, accept_peaks=peaks, accept_runs=runs)


def _bounded_accepts(state: AutoState) -> AutoState:
    """The state with each speculative mode's accept length lowered to what the traffic can draft now, where the
    trusted coverage (`_trusted_coverage`, of plain steps) bounds it below the estimate by a clear win (`accept_bound`),
    and the coverage it is held at recorded as the one it was measured at (`accept_cover`); `updated` stands
    (speculation has not drafted since: `_recheck_due` counts from it). The estimate then says what the current
    requests draft at most, not the mix of the ones before a shift and the first ones after: when the coverage rises
    again by a clear win, a recheck is due at once (`_recheck_due` (a)). A clear win below, not any dip: the coverage
    of a few requests' tokens is noisy, and a bound just under the estimate already caps speculation's value
    (`_value`). The H100 (2026-12-07, a197508; accept_shift after the mixed trace): one window of speculation at
    accept 1.375 into the unpredictable requests (a probe of plain then flipped it off) left the estimate at 1.62,
    blended with the 2.0 before, measured at a coverage of 0.57; through 1,000 plain steps at a coverage of 0 it
    stood, and when the predictable requests came back speculation was valued at 1.62 (419 against plain's 359
    tok/s), within `clear_win` of its peak of 2.0 and of the bound at 0.57: no recheck, and the flip waited for the
    16-step confirmation (1.10x the phase's p99)."""
    bound = _coverage_bound(state)
    if math.isinf(bound):
        return state
    cover = state.coverage
    assert cover is not None  # a finite bound is a trusted coverage's
    lowered = {m for m, e in state.accepts if m != PLAIN and bound * (1 + state.params.clear_win) <= e.mean}
    if not lowered:
        return state
    accepts = tuple((m, attrs.evolve(e, mean=bound) if m in lowered else e) for m, e in state.accepts)
    covers = tuple(sorted([(m, v) for m, v in state.accept_covers if m not in lowered]
                          + [(m, cover.mean) for m in lowered]))
    return attrs.evolve(state, accepts=accepts, accept_covers=covers)


def observe_idle(state: AutoState, seconds: float, spec_cap: int) -> AutoState:
    """The state after `seconds` more of idle time (nothing running, nothing waiting; agreed across ranks like the
    steps) while the demand hold is live: they count toward the hold as the steps the held batch would have run in
    them, `seconds` over the learned seconds of a step at the hold's peak (the mode the last step ran in; `_line`, or
    the mode's nearest known point), so a turnover of a few ms keeps the hold and seconds of idle time end it. The
    hold counts decode steps, and an idle server runs none: after the H100's bursts of 128-192 requests (2026-12-06,
    0b48981; bench/gpu/p99_account.py) 8 phase rounds' first decisions, 15-45 s later, were valued at the burst's
    load, and their first requests ran plain at 2 clients. Nothing changes where no hold is live or no step of any
    mode is known. A stretch the hold outlives is kept (`AutoState.idle`) for `commit` to learn whether it was a
    wave's turnover, and for `decide` to weigh it against the turnovers seen (`_phase_change`)."""
    if not seconds > 0:
        return state
    step_s = _held_step_seconds(state, spec_cap) if holding(state) else None
    if step_s is None:
        return state if state.idle is None else attrs.evolve(state, idle=None)
    if seconds >= step_s:
        # the hold's peak moves back by whole steps (rounded down: a turnover is never aged by more than it lasted)
        state = attrs.evolve(state, peak_step=state.peak_step - int(seconds / step_s))
    return attrs.evolve(state, idle=IdleStretch(seconds, state.peak, context_band(state.peak_context))
                        if holding(state) else None)


def _phase_change(state: AutoState, demand: int, running: int, spec_cap: int, context: float | None) -> bool:
    """Whether the requests arriving at an emptied server start a new phase, not a closed loop's next wave, so the
    hold yields to their own demand: the server stood idle over `turnover_idle_factor` times the longest a wave's
    turnover has idled (`commit` learns it) at the held batch's context band (`AutoState.turnover_idle`: a wave of
    long prompts turns over slower than one of short prompts), after a burst past speculation's cap, and both modes
    were measured at the demand and context arriving.

    On the H100 (2026-12-07, 001f95e; bench/gpu/p99_account.py) a closed loop's turnovers idled 5.5-10 ms and a
    burst's first requests came 7 ms after a quiet phase, while a quiet phase's first request came 56-84 ms after a
    burst of 192 (the clients' handling of its responses): inside the hold (16 steps at 8.5 ms), prefilled plain,
    speculation on with its 2 requests running (6 ms and a 10-23 ms catch-up onto requests of 0.5 s: the phase's p99
    1.05-1.10x always on's), where a flip with nothing running costs 0.1 ms. Where it was a turnover after all, the
    wave's demand passes the cap within a few prefills and plain comes back at once (`overflowing` in `decide`), its
    first requests running; the stretch is then learned as a turnover's. Until a turnover has been seen, where
    clients' round trips make turnovers idle as long as phase changes, and at a demand or context either mode has not
    run at (the mixed trace's long prompts the draft cannot predict: the hold's plain steps measure what the prior
    does not know), the hold stands. The H100 (2026-12-07, 1009c9d; the mixed trace): the waves of 64 clients of
    2,000-3,500-token prompts turned over in 33 ms, and one learning for every band had made the last quiet phase's
    first request, 62 ms after a burst of 128 short prompts (whose waves turned over in at most 23 ms), a turnover's:
    valued at 128, prefilled plain, speculation on with both running (p99 1.062x always on's)."""
    idle, p = state.idle, state.params
    turnover = 0.0 if idle is None else state.turnover_idle(idle.band)
    if idle is None or running > 0 or idle.peak <= spec_cap or not (p.turnover_idle_factor and turnover) \
            or idle.seconds <= p.turnover_idle_factor * turnover:
        return False
    valued = [_value(state, m, demand, spec_cap, context) for m in state.modes]
    return valued[PLAIN] is not None and valued[PLAIN][1] and any(v is not None and v[1] for v in valued[1:])


def holding(state: AutoState) -> bool:
    """Whether the demand hold is live: a decision now would value the most requests seen within `hold_steps` (decode
    steps since its peak, and idle time as steps: `observe_idle`)."""
    return state.step - state.peak_step <= state.params.hold_steps


def _held_step_seconds(state: AutoState, spec_cap: int) -> float | None:
    """The seconds of a step at the hold's peak in the mode the last step ran in (else the incumbent, then the other
    modes): its line (`_line`), else its known point nearest that batch; None where no mode has a known point."""
    first = state.run_mode if state.run_mode is not None else state.incumbent
    for mode in [first, *(m for m in state.modes if m != first)]:
        batch = _batch(mode, max(1, state.peak), spec_cap)
        line = _line(state, mode, batch)
        if line is not None:
            return line[0]
        points = [e for (m, _b, _band), e in state.estimates if m == mode and e.samples >= state.params.min_samples]
        if points:
            return min(points, key=lambda e: (abs(e.at - batch), -e.updated)).mean
    return None


def observe_catch_up(state: AutoState, tokens: int, seconds: float) -> AutoState:
    """The state after a flip-on's catch-up was observed: `tokens` re-prefilled (the retracted requests' prompts and
    outputs) in `seconds` (the flip to the first speculative decode launch). Fitted as a fixed part plus one per
    token (`CatchUpCost`); once `min_samples` are in, a sample is clipped to [1/2, 2] x the fit's seconds for its
    tokens."""
    if tokens <= 0 or not seconds > 0:
        return state
    p, old = state.params, state.catch_up or CatchUpCost(0, 0, 0.0, 0.0, 0.0, 0.0)  # the first sample weighs 1
    if old.samples >= p.min_samples:
        expected = old.seconds_for(tokens)
        seconds = min(max(seconds, expected / 2), expected * 2)
    w = _weight(old.samples + 1, p.alpha)
    mix = lambda a, b: a + w * (b - a)  # noqa: E731
    return attrs.evolve(state, catch_up=CatchUpCost(
        old.samples + 1, state.step, mix(old.tokens, tokens), mix(old.seconds, seconds),
        mix(old.tokens_sq, tokens * tokens), mix(old.tokens_seconds, tokens * seconds)))


def gate_catch_up(state: AutoState, decision: Decision, remaining: int, catch_up_tokens: int,
                  turned_over: bool = False) -> Decision:
    """`decision`, or no flip (reason "catch_up") where it is a flip-on on the numbers with requests running whose
    catch-up costs more than speculation saves them: `remaining` output tokens the running requests may still ask
    for (negative: no bound known, nothing is gated), `catch_up_tokens` tokens their re-prefill runs. `turned_over`:
    every request that ran when this flip-on was first held has finished since, and the numbers still want it: the
    load is steady, not a draining batch, and speculation will serve the requests still to come too, which the
    running requests' tokens do not count: it goes through. Deterministic: the batch's counts and requests are the
    same on every rank, and the estimates are agreed."""
    if decision.action != FLIP_ON or decision.reason != "measured" or catch_up_tokens <= 0 or remaining < 0 \
            or state.catch_up is None or not decision.spec_value or not decision.plain_value:
        return decision
    saved = remaining * (1.0 / decision.plain_value - 1.0 / decision.spec_value)
    cost = state.catch_up.seconds_for(catch_up_tokens)
    if saved > cost or turned_over:
        return attrs.evolve(decision, saved_s=saved, catch_up_s=cost)
    # held like a dwell: the incumbent stays, the want is kept (commit records want_since)
    return attrs.evolve(decision, action=None, reason="catch_up", incumbent=state.incumbent, wants_flip=True,
                        steps=state.steps_of(PLAIN), changes_tier=False, saved_s=saved, catch_up_s=cost)


def _batch(mode: int, demand: int, spec_cap: int) -> int:
    """The batch a mode runs at this demand: speculation min(demand, cap), plain decoding all of it."""
    return demand if mode == PLAIN else min(demand, spec_cap)


def context_band(context: float) -> int:
    """The context band of a step's context (KV tokens per request): 0 below 2 x SHORT_CONTEXT (a short request's
    whole life, or a context not known), then octaves: 256-511 tokens 1, 512-1,023 2, 1,024-2,047 3, 2,048-4,095 4.
    A bucket keeps an estimate per band, so what it measured at long contexts stays known while short ones run (the
    H100, 2026-12-06 (59347e0): one line per bucket, its contexts' mean and spread an EWMA, lost speculation's 2,800
    tokens at 2 requests to 250 steps of short ones, and the prior flipped it on there at accept 1.0)."""
    return 0 if context < 2 * SHORT_CONTEXT else int(math.log2(context / SHORT_CONTEXT))


def _bucket_estimate(state: AutoState, mode: int, bucket: int, context: float | None) -> Estimate | None:
    """The known estimate (`min_samples`) that answers for a bucket at `context`: its band's, where it ran near that
    context (`Estimate.at_context`), else the nearest band's that did (a context near a band's edge); with no
    context, the one updated last. None: no band of it ran near that context."""
    known = [(key[2], e) for key, e in state.estimates
             if key[:2] == (mode, bucket) and e.samples >= state.params.min_samples]
    return _pick(known, context)


def _pick(known: list[tuple[int, Estimate]], context: float | None) -> Estimate | None:
    """`_bucket_estimate` among one bucket's known (band, estimate) pairs."""
    if context is None:
        return max(known, key=lambda be: be[1].updated)[1] if known else None
    band = context_band(context)
    near = [(abs(b - band), -e.updated, b, e) for b, e in known if e.at_context(context) is not None]
    return min(near)[3] if near else None


def _known(state: AutoState, mode: int, batch: int, context: float | None = None) -> Estimate | None:
    return _bucket_estimate(state, mode, bucket_of(batch), context)


def _line(state: AutoState, mode: int, batch: int, context: float | None = None) -> tuple[float, float, bool] | None:
    """A mode's seconds per step at `batch`, the context (KV tokens per request) its points ran at there, and whether
    its own bucket measured them. Each known bucket is a point (the batch its samples ran at, its seconds); the
    seconds at `batch` lie on the line between the known points on either side (a decode step costs about a fixed
    part plus one per request), flat beyond the outermost one. Not the bucket's seconds alone: a bucket spans half an
    octave, and speculation's step grows across it far more than plain decoding's (the H200, 2026-12-02 (eeb8707): 9.8
    ms at 32, 12.6 ms at 48, plain 5.0 and 5.2), so a demand of 46 valued at bucket 32's seconds overrated speculation
    by a quarter, and the closed loop's demand, dipping from 48 to 46 as requests turned over, cut every confirmation of
    the flip off short. A bucket never measured, between two that were, is an inference (False), the same line
    (2026-12-02, 50a6e62: plain at 48, between its known 32 and 128); None outside the known buckets. `context`: each
    point is its bucket's seconds at that context (`Estimate.at_context`), and a bucket that has not run near it is
    no point there (its own batch then not measured): a step reads every request's KV, so a phase of long prompts
    makes every mode's step slower, each mode and batch by its own cost, and the mode not running now is valued at
    the context the requests have now, or probed there (issue 52)."""
    bands: dict[int, list[tuple[int, Estimate]]] = {}
    for (m, b, band), est in state.estimates:  # sorted by bucket: each bucket's known bands
        if m == mode and est.samples >= state.params.min_samples:
            bands.setdefault(b, []).append((band, est))
    points = []
    for bucket in bands:
        e = _pick(bands[bucket], context)
        if e is not None:
            sec = e.mean if context is None else e.at_context(context)
            points.append((e.at, sec, e.ctx))
    points = [pt for pt in points if pt[1] is not None]
    least = math.inf  # a step with more requests takes no less: a point is capped at the least seconds above it
    points = [(at, least := min(least, sec), ctx) for at, sec, ctx in reversed(points)][::-1]
    below = next((pt for pt in reversed(points) if pt[0] <= batch), None)  # sorted by bucket, and so by batch
    above = next((pt for pt in points if pt[0] >= batch), None)
    measured = _known(state, mode, batch, context) is not None
    if below is None or above is None:  # beyond the known points: the nearest, when it is the batch's own bucket
        return ((below or above)[1], (below or above)[2], True) if measured else None
    (lo, s_lo, c_lo), (hi, s_hi, c_hi) = below, above
    f = 0.0 if hi == lo else (batch - lo) / (hi - lo)
    return s_lo + f * (s_hi - s_lo), c_lo + f * (c_hi - c_lo), measured


def _step_seconds(state: AutoState, mode: int, batch: int, context: float | None = None) -> tuple[float, bool] | None:
    """A mode's seconds per step at `batch` (at `context`, KV tokens per request), and whether its own bucket
    measured them (`_line`)."""
    line = _line(state, mode, batch, context)
    return None if line is None else (line[0], line[2])


def _value(state: AutoState, mode: int, demand: int, spec_cap: int,
           context: float | None = None) -> tuple[float, bool] | None:
    """`value`, and whether the mode's own bucket measured it (False: interpolated)."""
    batch = _batch(mode, demand, spec_cap)
    seconds = _step_seconds(state, mode, batch, context)
    if seconds is None:
        return None
    if mode != PLAIN:  # the bucket's steps per second times the mode's accept length, at whatever batch it was learned
        accept = state.accept_of(mode)
        if accept is None:
            return None
        # ... at most what the draft vocabulary's coverage of the tokens committed now lets a verify accept
        # (`accept_bound`): the accept length is learned from speculative steps only, the coverage from every step
        # (the H200, 2026-12-07 (364b468): a probe of plain, begun one window into requests the draft could not
        # predict, ended on speculation's value at the accept length measured before (462 tok/s against plain's
        # 447) with the coverage at 0.0055, a bound of 1.006; the flip back retracted both requests, their catch-up
        # 19 ms, and two windows at accept 1.0 followed: 1.11x the phase's p99)
        return min(accept.mean, _coverage_bound(state)) * batch / seconds[0], seconds[1]
    return batch / seconds[0], seconds[1]


def _trusted_coverage(state: AutoState) -> Estimate | None:
    """The coverage the steps measured (`state.coverage`) once it has `min_samples`; None: no signal (yet)."""
    cover = state.coverage
    return cover if cover is not None and cover.samples >= state.params.min_samples else None


def _coverage_bound(state: AutoState) -> float:
    """`accept_bound` of the trusted coverage (`_trusted_coverage`); inf without the signal."""
    cover = _trusted_coverage(state)
    return math.inf if cover is None else accept_bound(cover.mean)


def value(state: AutoState, mode: int, demand: int, spec_cap: int, context: float | None = None) -> float | None:
    """A mode's estimated throughput (tokens/s) at this demand, None when it is not known yet (neither its bucket
    nor a bucket on each side of it: `_step_seconds`). `mode`: PLAIN (False) or a speculative mode (no tiers: True,
    i.e. 1). `context`: the KV tokens per request to value it at (None: as learned)."""
    known = _value(state, mode, demand, spec_cap, context)
    return None if known is None else known[0]


def _stale(state: AutoState, mode: int, demand: int, spec_cap: int, context: float | None = None) -> bool:
    """Whether a mode's bucket at this demand wants a probe: unknown, older than `stale_after`, or not run near this
    context (`Estimate.at_context`)."""
    age = _age(state, mode, demand, spec_cap, context)
    return age is None or age > state.params.stale_after


def _age(state: AutoState, mode: int, demand: int, spec_cap: int, context: float | None) -> int | None:
    """The steps since a mode's estimate at this demand and context was last updated (`_known` at the batch the mode
    runs at this demand); None where it has none."""
    est = _known(state, mode, _batch(mode, demand, spec_cap), context)
    return None if est is None else state.step - est.updated


def _behind_clearly(state: AutoState, other: int, cur: int, values: Sequence[float | None], measured: set[int],
                    demand: int, spec_cap: int, context: float | None) -> bool:
    """Whether a stale estimate of plain decoding is not worth a probe yet: speculation (`cur`) runs, its value here
    measured by its own steps, and it beats plain's by `clear_win` or more, with plain's estimate younger than
    `stale_behind_after`. A probe of plain from speculation costs the requests running through it (the flip off, its
    slower steps, the catch-up back: the H200, 2026-12-06 (3a41e11): 24-31 plain steps at 2 requests, 0.07 s of a 1.7 s
    phase and 1.15-1.22x its p99, where speculation led plain by 55 %); plain's seconds at a batch and context follow
    the host, not the traffic (speculation's accept length, which follows the traffic, is measured at every speculative
    step), so a clear lead does not close by itself within a budget period. A host that drifts or an estimate spoiled
    by prefills (the H200, 2026-12-03 (dff2822): plain at 48 valued at 9 ms a step, 5.0 ms measured) is still
    probed, after `stale_behind_after` steps, and at once where the lead is under `clear_win`. Where plain has not
    run near this batch and context, the points it ran at give a ceiling for it (`_plain_ceiling`)."""
    p = state.params
    if other != PLAIN or cur == PLAIN or cur not in measured:
        return False
    v_cur = values[cur]
    if PLAIN in measured:
        v_plain, age = values[PLAIN], _age(state, PLAIN, demand, spec_cap, context)
    else:
        v_plain, age = _plain_ceiling(state, demand, context)
    if v_cur is None or v_plain is None or v_cur < v_plain * (1 + p.clear_win):
        return False
    return age is not None and age <= p.stale_behind_after


def _plain_ceiling(state: AutoState, demand: int, context: float | None) -> tuple[float | None, int | None]:
    """Plain decoding's value at `demand` where it has not run near this batch and context, from the points it ran
    at (each bucket's estimate per context band), and the age of the point that gives it: a ceiling, not an estimate.
    A step reads every request's KV, so plain's seconds at a batch do not fall as the context grows
    (`Estimate.at_context` never slopes down), and a plain step of more requests takes no less but commits more tokens
    per second (a fixed part plus one per request): its value here is at most max(demand, the batch a point ran at)
    over that point's seconds (at this context where the point reaches it, `Estimate.at_context`; its mean where the
    context lies beyond it), the least of these. A probe of plain there, from speculation that leads the ceiling by
    `clear_win`, can only find plain further behind (the H200, 2026-12-06 (605161d): at 2, 3 and 8 short requests
    speculation measured at 1.4-1.55x plain's value where it had run, and plain was probed where it had not: 24 plain
    steps, a catch-up back, 1.05-1.08x the phase's p99). (None, None): no such point, or no context known."""
    if context is None:
        return None, None
    points = []
    for (mode, _bucket, _band), e in state.estimates:
        if mode == PLAIN and e.samples >= state.params.min_samples and e.ctx > 0:
            seconds = e.at_context(context)  # within the point's reach: its line; beyond it above: its mean
            if seconds is None and e.ctx <= context:
                seconds = e.mean
            if seconds is not None:
                points.append((max(demand, e.at) / seconds, state.step - e.updated))
    return min(points) if points else (None, None)


def _best(known: dict[int, float]) -> int:
    """The mode of the highest value among the known ones; a tie goes to the later mode."""
    return max(known, key=lambda m: (known[m], m))


def accept_bound(coverage: float) -> float:
    """The most tokens a verify can commit per request, on average, where `coverage` of the tokens the target commits
    lie in the draft's vocabulary: 1 / (1 - coverage). A draft token is accepted only where it is the target's own,
    and a draft with a reduced vocabulary (EAGLE-3's `draft_vocab_size`, SGLang's `hot_token_id`) proposes none
    outside it: of a verify's L committed tokens the L - 1 accepted ones lie in it, so over V verifies committing T
    tokens, I in the vocabulary, T - V <= I, and the mean accept length T / V <= 1 / (1 - I / T). The target commits
    the same tokens whether speculation drafts them or not (greedy; sampled, the same distribution), so plain
    decoding's tokens bound what speculation would accept. An upper bound only: tokens in the vocabulary may still
    be mispredicted."""
    return math.inf if coverage >= 1.0 else 1.0 / (1.0 - max(0.0, coverage))


def _recheck_due(state: AutoState, mode: int, load: int, running: int, spec_cap: int, context: float | None,
                 plain_value: float, arrivals: Sequence[int] | None = None,
                 batch_coverage: tuple[int, int] | None = None) -> float | None:
    """Whether plain decoding, held on the numbers, should recheck speculative `mode` now: None where not, else the
    budget steps the recheck leaves owed (`recheck_debt`, 0 when the budget covered it). Due where its accept length
    has fallen by `clear_win` or more below the highest the traffic drafted at (the traffic changed, not noise: issue
    52, requests the draft cannot predict), speculation at that highest accept length would beat plain decoding by the
    margin at this load (it may pay again), the steps since speculation last drafted cover what a recheck loses
    if the traffic still drafts as now over `recheck_fraction` of the time: the `recheck_span` decode steps a recheck
    runs, at the current accept length against plain decoding (at least a clear win's loss), plus the catch-up
    of the running requests (their re-prefill, the learned `CatchUpCost` at running x context tokens), and the
    requests have turned over since speculation last drafted: most of the next batch's requests (`arrivals`: the
    learner step at which the switch first saw each, running and waiting; None: not known, the steps alone decide)
    arrived after it. The accept length belongs to the requests: a batch speculation measured is measured, however
    many steps ago, and a recheck of it would spend the budget on what is known; new requests are where the traffic
    may have changed. So the rechecks keep the budget's bound (a recheck only comes later than the steps alone allow)
    and measure each population of requests at most once.
    No plain step shows the accept length, so this is how the learner sees requests that draft well again; its cost
    is bounded by construction, and where speculation would lose even at its best (high load) it never rechecks.

    The draft vocabulary's coverage (`state.coverage`, where the switch counts it: a draft with a reduced vocabulary)
    is what plain steps do show: the accept length speculation could reach is at most `accept_bound` of it. (a) Where
    that bound has risen by a clear win above both the accept length measured and the bound of the coverage it was
    measured at (`accept_cover`), the tokens are no longer the ones speculation drafted badly: the recheck is due now,
    its budget borrowed (it leaves owed what the steps since did not cover, and the next recheck, early or not, waits
    until that is paid back: over any run the rechecks spend at most the budget plus one recheck's holding). (b) The
    highest accept length valued is capped by the bound: where even that cannot beat plain decoding by the margin
    (outputs outside the draft's vocabulary), no recheck is spent. Without the signal both are absent and the rule
    is as before. The coverage weighed is the next batch's own (`batch_coverage`: hits and tokens its requests, running
    and waiting, committed so far) once they have committed `batch_cover_tokens`, else the steps' (`state.coverage`):
    a recheck measures these requests, and the windows' coverage blends in the requests before them, which a
    shift's first window still holds, and weighs it by steps (the H100, 2026-12-07 (159eaf8), accept_shift's
    predictable_again: the first window after the predictable requests came back held the unpredictable ones' last
    steps, a coverage of 0.5 and 0.30 learned where the new requests' own was 1.0; in one round that bound (1.44)
    valued speculation at 399 tok/s, under plain's 397 by the margin, and the recheck waited a second window: 15
    plain steps to the flip, 1.058x the phase's p99)."""
    p = state.params
    accept, peak = state.accept_of(mode), state.accept_peak(mode)
    if p.recheck_fraction <= 0 or accept is None or peak is None or peak < accept.mean * (1 + p.clear_win):
        return None
    batch = _batch(mode, load, spec_cap)
    line = _step_seconds(state, mode, batch, context)
    if line is None or not plain_value > 0:
        return None
    seconds = line[0]
    covered, bound = _trusted_coverage(state) is not None, _coverage_bound(state)
    if batch_coverage is not None and batch_coverage[1] >= max(1, p.batch_cover_tokens):  # the next batch's own
        covered, bound = True, accept_bound(batch_coverage[0] / batch_coverage[1])
    reach = min(peak, bound)
    if reach * batch / seconds <= plain_value * (1 + p.margin):
        return None
    # a recheck counts as losing at least what a clear win's loser loses: near the crossover it would cost next to
    # nothing by the numbers and recur at every dwell, a flip pair each time (the flips' own host work is not in the
    # numbers)
    now = accept.mean * batch / seconds
    loss = p.recheck_span * seconds * max(1.0 - now / plain_value, p.clear_win / (1 + p.clear_win))
    if running > 0 and context and state.catch_up is not None:
        loss += state.catch_up.seconds_for(running * context)
    plain_step = load / plain_value
    need = max(p.recheck_steps, loss / (p.recheck_fraction * plain_step)) + state.recheck_debt
    since = state.step - accept.updated
    if covered:  # (a): the bound rose by a clear win over what speculation was measured at
        then = state.accept_cover(mode)
        seen = max(accept.mean, 0.0 if then is None else accept_bound(then))
        if reach >= seen * (1 + p.clear_win) and since >= state.recheck_debt:
            return max(0.0, need - since)
    if since < need:
        return None
    return 0.0 if arrivals is None or 2 * sum(1 for a in arrivals if a > accept.updated) > len(arrivals) else None


def _probe_price(state: AutoState, cur: int, other: int, load: int, running: int, spec_cap: int,
                 context: float | None) -> float:
    """The credit a probe of `other` from `cur` needs now: `probe_steps`, or `probe_steps` less the budget's whole
    holding (`probe_credit` probes) for a *first visit* whose entry retracts nothing: `other` has never run near this
    batch and context (no estimate of its bucket answers there: `_known`; not merely stale), and the flip into it
    re-prefills no running request (plain decoding, a tier change, or nothing running). Such a probe borrows against
    the budget: the credit may fall to minus its holding, and every later probe waits until the steps have paid it
    back, so the probes' steps stay within `explore_fraction` of the steps observed plus twice the holding, as
    before it was once. Why: the budget is spent where the load is first met (short prompts, at each batch), and a
    phase of long prompts then finds it empty; a mode never measured near a context is not known there at all, and
    no rule that reads the numbers can find it faster while it is not run. The H200 (2026-12-06, 3a41e11; the context
    trace, tests/test_auto_h200_3a41e11.py): five probes at short prompts left 0.1 steps of credit at step 1,215;
    through the 2-long, 8-long and 24-mixed phases (steps 1,395-2,159) plain decoding was never run near their
    2,000-3,500 tokens, the credit stayed under one probe's 24 steps (5-18), and speculation held on the prior where
    plain decoding was 10-37 % faster (auto 0.911x, 0.738x and 0.783x the per-phase best)."""
    p = state.params
    first_visit = (other == PLAIN or cur != PLAIN or running <= 0) \
        and _age(state, other, load, spec_cap, context) is None
    return p.probe_steps - (p.probe_credit * p.probe_steps if first_visit else 0)


def _refresh_first(state: AutoState, cur: int, want: int, load: int, spec_cap: int, context: float | None) -> bool:
    """Whether speculation (`cur`), which the numbers would leave for plain decoding (`want`) on a clear win, must first
    re-measure itself here: its own estimate at this load and context is stale (`_stale`: older than `stale_after`). A
    stale estimate is probed again because it may have drifted, and leaving speculation on it leaves it stale: the next
    steady point with requests running probes it from plain, and a flip-on retracts every running request and
    re-prefills it (its catch-up), which grows with their contexts and which the catch-up line, fit on the small
    catch-ups seen before, does not predict. The H100 (2026-12-06, c93100f; the context trace's 8 clients of
    2,000-3,500-token prompts, its run.log's round 1): speculation's estimate at 8 requests and that context was round
    0's, 4,673 steps old; the first decision flipped plain on at once on it (a clear win: 1,072 against 814 tok/s), and
    126 steps later, the next wave's 8 requests running, the stale estimate was probed: 20,645 tokens re-prefilled in
    0.489 s (the largest catch-up before: 5,705 tokens, 12 ms), then 30 speculative steps at 20.1 ms for two tokens a
    request against plain decoding's 7.6 ms a token: the phase took 4.04 s against plain's 3.20 s, p99 1.24x. So such a
    win waits for the dwell and confirmation, whose speculative steps re-measure it (the first window of 8 refreshes the
    estimate, and the win is clear again). Only speculation's: a probe of plain, from speculation, retracts nothing, and
    a tier's re-probe from another tier is no flip. Only an estimate that exists: where speculation never ran near
    this batch and context, its steps would measure it for the first time, not refresh it, and the prior leaves it
    there only where it is outgrown (`_outgrown`, which also bars its probe) or past its cap. The H200 (2026-12-06,
    3a41e11, tests/test_auto_h200_3a41e11.py): at the 8-long phase's first wave, nothing running, plain decoding
    measured 10 % faster at 2 long requests, the prior's flip off waited 24 steps at 18.7 ms against plain's 5.9 ms."""
    if cur == PLAIN or want != PLAIN:
        return False
    age = _age(state, cur, load, spec_cap, context)
    return age is not None and age > state.params.stale_after


def _prior(state: AutoState, load: int, spec_cap: int, context: float | None) -> int:
    """The mode the prior runs at `load`: speculation (the ladder's first tier) while the load fits under its cap,
    plain above, and plain also where speculation cannot win there (`_ruled_out`)."""
    return PLAIN if load > spec_cap or _ruled_out(state, load, spec_cap, context) else 1


def _ruled_out(state: AutoState, load: int, spec_cap: int, context: float | None) -> bool:
    """Whether speculation cannot win at `load` and `context`, so the prior runs plain and speculation is not probed
    there: outgrown by the step costs measured (`_outgrown`), or capped by the tokens committed now
    (`_coverage_rules_out`)."""
    return _outgrown(state, load, spec_cap, context) or _coverage_rules_out(state)


def _coverage_rules_out(state: AutoState) -> bool:
    """Whether the draft vocabulary's coverage of the tokens committed now (`_coverage_bound`) caps speculation's
    accept length within the margin of what its step costs over plain decoding's: no batch or context where it could
    win. A speculative step runs the draft and verifies every draft token, so it takes at least a plain step's seconds
    at the same batch and context, and at least the least ratio of the two measured at any bucket and context band
    both modes ran in (the cheapest tier's, with tiers; 1 where none); speculation at accept length L then commits at
    most L / that ratio times plain decoding's tokens per second. The prior reads no step seconds where neither mode
    ran near this batch and context, and this bounds it there. The H100 (2026-12-07, 9613c8e; the mixed trace's 2
    clients of 3,100-token prompts the draft could not predict, after a burst of 64): the hold's end left the prior,
    which flipped speculation on with both running at a coverage of 0.059 (a bound of 1.06 against a least ratio of
    1.28); 0.38 s of speculative steps at accept 1.0 and 22.8 ms against plain's 7.6 ms, the phase 0.916x plain and its
    p99 1.26x. Without the signal the bound is infinite and nothing changes."""
    bound = _coverage_bound(state)
    if math.isinf(bound):
        return False
    known = [(key, e) for key, e in state.estimates if e.samples >= state.params.min_samples]
    plain = {(b, band): e.mean for (m, b, band), e in known if m == PLAIN and e.mean > 0}
    ratios = [e.mean / plain[(b, band)] for (m, b, band), e in known if m != PLAIN and (b, band) in plain]
    return bound <= max(1.0, min(ratios, default=1.0)) * (1 + state.params.margin)


def _outgrown(state: AutoState, load: int, spec_cap: int, context: float | None) -> bool:
    """Whether, at this context, plain decoding measured faster than every speculative mode, by the margin, at a batch
    below the bucket speculation would run this load in. Speculation's gain does not grow with the batch (its verify's
    work grows with the batch times the draft tokens, plain decoding's with the batch; the prior's one crossover says
    as much), so a batch where it lost bounds every larger one. The H100 (2026-12-06, 59347e0), the context trace's
    24 clients with 3 long prompts among them: at 8 requests and 2,700 tokens speculation had taken 20.4 ms a step
    (two tokens a request) against plain decoding's 7.3 ms, speculation at 24 had not run at that context, and the
    prior flipped it on with the 24 requests running (their catch-up 0.23 s), to 16.3 ms a step against plain
    decoding's 7.0 ms (0.812x the per-phase best there). Both modes must be measured by their own bucket there (an
    interpolated value is no evidence), and speculation is valued at the highest accept length the traffic has drafted
    at: a fallen accept length is the rechecks' to follow (`_recheck_due`), this rule only the step costs. Where
    speculation is outgrown, the prior runs plain and speculation is not probed (from plain, with requests running,
    a probe pays their catch-up).

    At a batch of half the load's or less, speculation not ahead of plain decoding by the margin (a tie within the
    noise) is outgrown too: its gain falls by more than the margin over every doubling of the batch that was measured.
    The H100, the 8B pair (2026-12-06, b3a9830, 32-token prompts: specflip.auto_sim.H100_PLAIN / H100_SPEC): 1.59x at
    2 requests, 1.48x at 8, 1.15x at 32; at 2,000-3,500-token prompts (2026-12-06, c93100f) a tie at 2 requests (13.3-
    14.9 ms a step for two tokens a request against plain's 7.2 ms for one) and 0.76x at 8 (20.1 against 7.6 ms). So a
    tie at 8 requests is a loss beyond the margin at 24: the replay of that run's context trace valued speculation at
    8 requests and 2,500 tokens at 1,062 tok/s against plain's 1,058, and the prior flipped it on at 24 (0.90x there,
    tests/test_auto_h100_c93100f.py).

    With tiers, the tiers measured at that batch and context decide; one that did not run there is no evidence (as
    without tiers, where speculation is only outgrown where it was measured), and at a batch where no tier ran there is
    no verdict (the prior's tier runs, and probes measure the others there). The H200 (2026-12-07, 364b468, tiers
    3,1): at the context trace's 8 long clients, steps 3 had lost to plain decoding at 2 long requests (13 against 6
    ms a step), steps 1 had only run at short contexts, and the prior, reading steps 1 as unknown, ran steps 3 for
    1.5 s at 18.6 ms a step against plain decoding's 6.3 ms (0.881 of plain there; the trace 0.934x `auto` without
    tiers)."""
    batch = _batch(1, load, spec_cap)
    own = bucket_of(batch)
    for bucket in sorted({b for (m, b, _), _e in state.estimates if m == PLAIN and b < own}):  # below the load's own
        smaller = bucket_floor(bucket)
        plain = _value(state, PLAIN, smaller, spec_cap, context)
        if plain is None or not plain[1]:
            continue
        best = None
        for m in state.modes[1:]:
            line, accept = _line(state, m, smaller, context), state.accept_of(m)
            if line is None or not line[2] or accept is None:
                continue  # with tiers, a tier not measured there is no evidence either way (the docstring)
            best = max(best or 0.0, max(accept.mean, state.accept_peak(m) or 0.0) * smaller / line[0])
        if best is not None:
            # beyond the noise: plain ahead by the margin; at half the batch or less, speculation not ahead by it
            # (its gain falls by more than the margin over a doubling of the batch: `_outgrown`)
            margin = 1 + state.params.margin
            if plain[0] * margin >= best if 2 * smaller <= batch else plain[0] >= best * margin:
                return True
    return False


def decide(state: AutoState, spec_on: bool, demand: int, running: int, spec_cap: int,
           steps: int | None = None, context: float | None = None,
           arrivals: Sequence[int] | None = None, batch_coverage: tuple[int, int] | None = None) -> Decision:
    """The mode change for the scheduling point at hand (or none), from the state alone. `demand`: running + waiting
    requests; `running`: requests in flight (the running batch, prefilled and chunked ones included); `steps`: with
    tiers, the step count speculation runs at now (one off the ladder counts as the ladder's first); `context`: the
    KV tokens per running request (prompt and output), the same on every rank (None: values as learned);
    `arrivals`: per request of the next batch (running and waiting), the learner step (`state.step`) at which the
    switch first saw it, the same on every rank (None: not known; a recheck then waits for the steps alone:
    `_recheck_due`); `batch_coverage`: (hits, tokens), the draft vocabulary's coverage of the output tokens the next
    batch's requests committed so far, from host lists every rank holds alike (None: not counted; a recheck then
    weighs the steps' coverage: `_recheck_due`)."""
    p = state.params
    cur = state.mode_of(spec_on, steps)
    cur = 1 if cur is None else cur
    context = context if context and context > 0 else None
    load = max(demand, state.peak) if holding(state) else demand
    if load > demand and demand > 0 and _phase_change(state, demand, running, spec_cap, context):
        load = demand  # the hold yields (`commit` ends it)
    # the hold values the held batch, at its context too: at a wave's turnover the next requests arrive one by one,
    # and the first one's prompt is not the batch's (the H200, 2026-12-06 (605161d), c24_mixed: a short request
    # arriving first at an emptied server, valued at 32 tokens, flipped speculation on; the next point found 17
    # waiting at 3,244 tokens, where plain wins, and the flip back came 0.39 s later with 24 running)
    if context is not None and load > demand and state.peak_context > context:
        context = state.peak_context
    valued = [_value(state, m, load, spec_cap, context) for m in state.modes]
    values = tuple(None if v is None else v[0] for v in valued)
    measured = {m for m, v in enumerate(valued) if v is not None and v[1]}  # the rest: interpolated, or unknown
    spec_known = [v for v in values[1:] if v is not None]
    v_spec, v_plain = (max(spec_known) if spec_known else None), values[PLAIN]

    def answer(action: str | None, reason: str, incumbent: int = state.incumbent, wants: bool = False,
               to: int = cur) -> Decision:
        return Decision(action, reason, incumbent, demand, running, v_spec, v_plain, state.step, wants,
                        steps=state.steps_of(to), changes_tier=bool(state.tiers) and PLAIN != to != cur != PLAIN,
                        values=values if state.tiers else (), load=load, context=context)

    if demand <= 0:
        return answer(None, "idle")
    dwell = state.step - state.flip_step
    probing = cur != state.incumbent
    # speculation would hold requests waiting behind its cap (the demand counts the running requests too)
    past_cap = not within_spec_cap(demand, spec_cap)
    if probing and dwell < (state.probe_len or p.probe_steps):
        if not (state.incumbent == PLAIN and cur != PLAIN and past_cap):
            return answer(None, "probing")
        # a probe of speculation that a burst overtook: past the cap requests wait behind it, which costs far more
        # than the probe learns (the H200, 2026-12-03 (dff2822): a probe begun at 43 on a burst's ramp held 80 of 128
        # waiting)
        return answer(_flip(cur, PLAIN), "probe_end", to=PLAIN)
    known = {m: v for m, v in enumerate(values) if v is not None}
    priors: list[int] = []

    def prior() -> int:  # `_prior`, computed once and only where a branch needs it (it values smaller batches)
        if not priors:
            priors.append(_prior(state, load, spec_cap, context))
        return priors[0]

    clear = False
    # on the numbers: a probe against the incumbent; otherwise two modes known, plain among them wherever the prior
    # would not speculate (with tiers, two known step counts compare the tiers only: above the cap, where the prior
    # runs plain, they would hold speculation at a demand plain decoding was never measured at)
    if (cur in known and state.incumbent in known) if probing \
            else len(known) >= 2 and (PLAIN in known or prior() != PLAIN):
        held = state.incumbent if state.incumbent in known else cur if cur in known else None
        best = _best(known)
        want = best if held is None or known[best] > known[held] * (1 + p.margin) else held
        # an interpolated value is an inference: it flips only after dwell and confirmation, never as a clear win;
        # and speculation is not left for plain on a stale estimate of itself (`_refresh_first`)
        clear = cur in measured and want in measured and known[want] >= known[cur] * (1 + p.clear_win) \
            and not _refresh_first(state, cur, want, load, spec_cap, context)
        reason = "measured"
    elif probing and (state.incumbent in known or (state.incumbent != PLAIN) == (prior() != PLAIN)):
        want, reason = state.incumbent, "probe_end"
    elif probing:  # the incumbent, chosen at another load, is not known here: the prior, not a flip back to it (the
        # H100, 2026-12-06 (b3a9830): a probe of plain begun at a burst's start ended at its first wave's turnover,
        # and speculation came back on with 121 requests coming, for one flip pair)
        want, reason = prior(), "prior"
    else:  # the prior: speculation (the ladder's first tier) while demand fits under its cap, plain above (`_prior`)
        want, reason = prior(), "prior"
    settled = want if reason in ("measured", "prior") else state.incumbent

    def recheck(modes: Sequence[int]) -> Decision | None:
        """The first of `modes` whose recheck from plain is due (`_recheck_due`), as its flip; a probe's conditions (a
        settled mode, a steady load, under the cap), no probe budget: its own bound is the share of time."""
        if cur != PLAIN or probing or reason != "measured" or values[PLAIN] is None or dwell < p.min_dwell \
                or load != demand or past_cap:
            return None
        for other in modes:
            debt = _recheck_due(state, other, load, running, spec_cap, context, values[PLAIN], arrivals,
                                batch_coverage)
            if debt is not None:
                return attrs.evolve(answer(_flip(cur, other), "recheck", incumbent=settled, to=other),
                                    recheck_debt=debt)
        return None

    if want == cur:
        # a probe measures a steady batch: none while the demand is below the hold's peak (a wave's tail or turnover,
        # where the batch shrinks and the intervals fill with the next wave's prefills; the H200, 2026-12-03, eeb8707)
        if not probing and values[cur] is not None and dwell >= p.min_dwell and load == demand:
            # a probe of speculation from plain needs the demand under the cap, not only the running batch: past it
            # the probe would end at once (above), learning nothing, its wave split at the cap (tests/closed_loop.py:
            # at a wave's turnover running reads 0 while 64 wait)
            for other in state.modes:  # plain, then the ladder: the first stale one the cap lets run
                if other != cur and state.credit >= _probe_price(state, cur, other, load, running, spec_cap, context) \
                        and _stale(state, other, load, spec_cap, context) \
                        and not _behind_clearly(state, other, cur, values, measured, load, spec_cap, context) \
                        and (other == PLAIN or cur != PLAIN or not past_cap) \
                        and (other == PLAIN or not _ruled_out(state, load, spec_cap, context)):
                    return answer(_flip(cur, other), "probe", incumbent=settled, to=other)
        # plain held on the numbers where speculation's accept length fell: recheck it when it may pay again, at a
        # bounded share of the time (`_recheck_due`)
        due = recheck(state.modes[1:])
        return due if due is not None else answer(None, reason, incumbent=settled)
    # speculation at its cap with requests waiting behind it, plain wanted: a dwell would hold them waiting, and the
    # batch it splits (the cap's share, the rest a few dozen steps later) leaves a tail that looks like a lull (the
    # H200, 2026-12-03 (9d1af93): tiers at 64 flipped on at every wave's tail of 16 and dwelt 40 steps at 48 of 64,
    # 0.78x)
    overflowing = cur != PLAIN and want == PLAIN and past_cap
    # nothing running: the flip retracts nothing, pays no catch-up and costs about 0.1 ms (the H100, 2026-12-06
    # (0b48981): a median 0.10 ms over 15 such flips), while each step the dwell or the confirmation holds runs the
    # arriving requests in the mode the numbers say loses, and the flip then comes with them running (4.4-8.8 ms and
    # a 9-20 ms catch-up to turn speculation on: bench/gpu/p99_account.py). So it waits for neither: such a point
    # comes once per arrival at an empty server, and what the new mode is worth is measured by its own steps.
    # Not where speculation would be left on a stale estimate of itself (`_refresh_first`: its steps re-measure it)
    idle = running <= 0 and not _refresh_first(state, cur, want, load, spec_cap, context)
    if not probing and not (reason == "measured" and clear) and not overflowing and not idle:
        # a clear win on the numbers is far from the crossover (a burst starts or ends): no dwell, no confirmation.
        # The H200 (2026-12-01, 25a6220): a lull of one request at a burst's start flipped speculation on, and the dwell
        # then held 80 requests waiting behind 48 speculative steps
        if dwell < p.min_dwell:
            return answer(None, "dwell", wants=True)
        confirmed = state.want_since is not None and state.step - state.want_since >= p.confirm_steps
        if not confirmed:
            # a recheck that is due goes now, where the numbers lean to speculation as where they hold plain: they
            # value it at the accept length of the requests it drafted badly, and the confirmation's steps run plain
            # for the requests that came back (the H100, 2026-12-07 (9a8a6a2), accept_shift's predictable_again: one
            # window in, the coverage 0.66 against 0.34 when that accept length (1.34) was measured, speculation
            # valued at 374 against plain's 354 tok/s; two more windows of plain to the flip, 1.10x the phase's p99)
            due = recheck((want,)) if want != PLAIN else None
            return due if due is not None else answer(None, "confirming", wants=True)
    if cur == PLAIN and not within_spec_cap(running, spec_cap):
        return answer(None, "cap", wants=True)
    return answer(_flip(cur, want), "probe_end" if probing else reason, incumbent=settled, to=want)


def _flip(cur: int, to: int) -> str | None:
    """The flip from mode `cur` to mode `to`: None between two speculative modes (a tier change)."""
    if (cur == PLAIN) == (to == PLAIN):
        return None
    return FLIP_ON if cur == PLAIN else FLIP_OFF


def commit(state: AutoState, decision: Decision) -> AutoState:
    """The state after the switch acted on `decision` (performed its flip or tier change, or it had none). A flip
    the switch put off (it waits for a prefilled batch to merge) is not committed: the next scheduling point decides
    again."""
    p = state.params
    settled = decision.running > 0 and decision.demand == decision.running == state.last_demand
    calm = state.calm + 1 if settled else 0
    if calm != state.calm or decision.demand != state.last_demand:
        state = attrs.evolve(state, calm=calm, last_demand=decision.demand)
    # the hold ends where the demand settled below its peak: after a burst, the quiet phase's requests are not a
    # turnover's first (the H100, 2026-12-06 (59347e0): the hold valued a quiet phase's first 2 requests at the
    # burst's 128 to 192 for 15-23 steps, plain, and then flipped speculation on with them running: their p99 1.08-1.11x
    # always-on's)
    calmed = p.calm_points > 0 and calm >= p.calm_points
    idle = state.idle
    if idle is not None and decision.demand >= idle.peak:  # the wave came back: the stretch was its band's turnover
        known = dict(state.turnover_idles)
        known[idle.band] = max(known.get(idle.band, 0.0), idle.seconds)
        state = attrs.evolve(state, turnover_idles=tuple(sorted(known.items())), idle=None)
    elif idle is not None and calmed:  # it settled below: a phase's start
        state = attrs.evolve(state, idle=None)
    if decision.demand >= state.peak or not holding(state) or decision.load < state.peak or calmed:
        state = attrs.evolve(state, peak=decision.demand, peak_step=state.step, peak_context=decision.context or 0.0)
    if decision.reason == "idle":  # no request: nothing to weigh, a wave's turnover; the want and its age stand
        return state
    if decision.action is None and not decision.changes_tier:
        want_since = (state.step if state.want_since is None else state.want_since) if decision.wants_flip else None
        if decision.incumbent == state.incumbent and want_since == state.want_since:
            return state
        return attrs.evolve(state, incumbent=decision.incumbent, want_since=want_since)
    flipped = attrs.evolve(state, incumbent=decision.incumbent, flip_step=state.step, want_since=None,
                           flips=state.flips + (decision.action is not None), probe_len=0,
                           tier_changes=state.tier_changes + decision.changes_tier)
    if decision.reason == "probe":
        return attrs.evolve(flipped, probes=state.probes + 1, credit=state.credit - state.params.probe_steps,
                            probe_len=state.params.probe_steps)
    if decision.reason == "recheck":  # the accept length is learned afresh: its old mean weighs as one sample
        mode = state.mode_of(True, decision.steps) or 1
        accepts = tuple((m, attrs.evolve(e, weighted=1) if m == mode else e) for m, e in state.accepts)
        return attrs.evolve(flipped, rechecks=state.rechecks + 1, probe_len=state.params.recheck_steps,
                            accepts=accepts, recheck_debt=decision.recheck_debt)
    return flipped


def held_modes(state: AutoState, spec_cap: int, largest: int = 512) -> list[tuple[int, int | None]]:
    """Per bucket floor up to `largest`: the mode the learner holds on the numbers there (the best of every mode),
    None where a mode is unknown. What the auto switch settled on, for traces, `specflip calibrate` and the tiers'
    simulation."""
    out: list[tuple[int, int | None]] = []
    bucket = 0
    while bucket_floor(bucket) <= largest:
        demand = bucket_floor(bucket)
        known = {m: v for m in state.modes if (v := value(state, m, demand, spec_cap)) is not None}
        out.append((demand, _best(known) if len(known) == len(state.modes) else None))
        bucket += 1
    return out


def boundaries(state: AutoState, spec_cap: int, largest: int = 512) -> list[tuple[int, bool | None]]:
    """Per bucket floor up to `largest`: whether the learner holds speculation there on the numbers (any tier),
    None where a mode is unknown."""
    return [(d, None if m is None else m != PLAIN) for d, m in held_modes(state, spec_cap, largest)]
