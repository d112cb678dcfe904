"""The auto learner fed the decode-step windows an H100 measured (issue 52), second run: 2026-12-06 (59347e0), `auto`
beside plain and always-on on the 8B-class pair, TP 1, SGLang 0.5.16, over the warm-ups and the traces accept_shift,
context, mixed, bursty_contrast, bursty (bench/gpu/results/2026-12-06_59347e0/workload_c/traces.tar.gz,
auto/switch-875.jsonl: each `auto_observe` window as [speculative, steps, seconds, accept length, KV tokens per
request (the mean, as that switch recorded it), running requests (the last decision's or traced step's), segment,
seconds since the trace's first record], in tests/data/h100_auto_windows_59347e0.json; segments 0 the warm-ups,
1 accept_shift, 2 context, 3 mixed, 4 bursty_contrast, 5 bursty; windows with steps of both modes left out).

What that run showed in the context trace's last phase (24 clients, every 8th prompt 2,000-3,500 tokens, auto 0.812x
the per-phase best): plain ran in from the phase before (8 long prompts, where a probe had found plain decoding at
7.3 ms a step against speculation's 20.4 ms); speculation at 24 requests had not run near that context, and the
prior (speculation while under its cap) flipped it on with the 24 requests running: their catch-up took 0.23 s, and
speculation then took 16.3-17.8 ms a step for its two tokens a request against plain decoding's 7.0 ms. A speculative
step is paced by its longest request (at 4 requests, one 2,800-token request among short ones: 13.7 ms, as 2 long
ones took 13.9 ms; 7.4 ms all short), and the mean context (332 tokens at 24) had made that batch look short."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from statemodel import auto_policy as ap

auto_quiet_phase = importlib.import_module("auto_quiet_phase")

WINDOWS = json.loads((Path(__file__).parent / "data" / "h100_auto_windows_59347e0.json").read_text())
CAP = 48
# the context trace's 24-client phase: its first decision on the recorded learner (the prior's flip-on) came at
# 244.169 s; its longest request read 2,000-3,500 KV tokens (LONG_PROMPT in bench/gpu/bursty_client.py)
C24_START = 244.169
# the measured steps there (auto_observe windows of 8): plain decoding 0.0557 s, speculation 0.1307 s (accept 2.0)
C24_PLAIN_S, C24_SPEC_S = 0.0557 / 8, 0.1307 / 8


def replay(until: float, state: ap.AutoState | None = None) -> ap.AutoState:
    """The learner after every window recorded before `until` (seconds since the trace's first record), each window's
    seconds spread evenly over its steps."""
    state = state or ap.initial_state()
    for spec, n, seconds, accept, context, batch, _segment, t in WINDOWS:
        if t >= until:
            break
        for _ in range(n):
            tokens = (None if accept is None else batch * accept) if spec else float(batch)
            state = ap.observe(state, ap.Observation(bool(spec), batch, tokens, seconds / n, context=context or 0.0))
    return state


def at_c24_start() -> ap.AutoState:
    """The learner at the 24-client phase's start, plain settled on the numbers since the 8-long phase's probe
    (learner step 4,235 of the recorded run), as the trace's decisions had it."""
    return attrs.evolve(replay(C24_START), incumbent=ap.PLAIN, flip_step=4235, want_since=None)


# the replay's contexts are the means the run recorded (in the 8-long phase 2,700-2,850 tokens, where the longest
# request would read more): the learner knows speculation at 8 requests up to about 3,090 tokens (`at_context`)
@pytest.mark.parametrize("longest", [2000.0, 2750.0, 3000.0])
def test_24_clients_with_long_prompts_among_them_stay_plain_where_8_long_ones_lost(longest: float) -> None:
    """At the phase's start, valued at its longest request's context, speculation at 24 requests is not known, and
    at 8 requests of that context plain decoding won by far: the prior runs plain, and speculation is not probed
    (with 24 requests running a flip-on pays their catch-up). The run flipped it on (reason `prior`)."""
    state = at_c24_start()
    for _ in range(3):  # the phase's first scheduling points: no flip, no probe
        d = ap.decide(state, False, 24, 24, CAP, context=longest)
        assert d.action is None and d.reason == "prior" and not d.wants_flip, d
        state = ap.commit(state, d)


def test_at_short_contexts_the_same_learner_still_speculates_at_24() -> None:
    """The control: the same learner at 24 requests of short prompts (speculation won at 8 and at 32 there) wants
    speculation; the rule reads the context."""
    d = ap.decide(at_c24_start(), False, 24, 24, CAP, context=100.0)
    assert d.wants_flip or d.action == ap.FLIP_ON, d


def run_phase(state: ap.AutoState, spec_on: bool, steps: int, longest: float) -> tuple[float, float, int]:
    """The 24-client phase closed-loop, each step the seconds that mode measured there (C24_PLAIN_S, C24_SPEC_S);
    a flip-on pays the catch-up the run measured (0.23 s). (tokens, seconds, flips)."""
    tokens = seconds = 0.0
    flips = 0
    pending: list[Any] = []
    for _ in range(steps):
        d = ap.decide(state, spec_on, 24, 24, CAP, context=longest)
        if d.action is not None:
            flips += 1
            spec_on = d.action == ap.FLIP_ON
            seconds += 0.23 if spec_on else 0.0
        state = ap.commit(state, d)
        step, made = (C24_SPEC_S, 48.0) if spec_on else (C24_PLAIN_S, 24.0)
        tokens += made
        seconds += step
        pending.append(ap.Observation(spec_on, 24, made, step, context=longest))
        if len(pending) == 8:  # the switch's agreement window
            for obs in pending:
                state = ap.observe(state, obs)
            pending = []
    return tokens, seconds, flips


def test_the_24_client_phase_runs_within_3_percent_of_plain() -> None:
    """The phase's 256 plain steps (two waves of 128 tokens) from the learner at its start, at the measured step
    costs: at least 0.97x plain decoding held (issue 52's target; the run: 0.812x), and no flip."""
    tokens, seconds, flips = run_phase(at_c24_start(), False, 256, 2750.0)
    assert flips == 0 and (tokens / seconds) / (24 / C24_PLAIN_S) >= 0.97, (flips, tokens / seconds)


def test_the_switch_values_a_batch_at_its_longest_request() -> None:
    """`batch_context` on a real ScheduleBatch of real Reqs: one 2,800-token prompt among three 32-token ones is
    valued at the long one's KV tokens (prompt and output), not at the mean (it paces a speculative step)."""
    from sglang_cpu import build_pools, make_req, make_server_args, new_batch, write_tiny_model_config

    from shim.switch.auto import batch_context

    pools = build_pools(make_server_args(write_tiny_model_config()), kv_size=4096)
    reqs = [make_req(f"r{i}", [5 + i] * (2800 if i == 3 else 32)) for i in range(4)]
    for req in reqs:
        req.output_ids.extend([7] * 10)
    assert batch_context(new_batch(pools, reqs)) == 2810.0


# --- the quiet phase after a burst (the mixed trace's last phase; bursty, bursty_contrast alike) ----------------------

# the bursts' ends before a quiet phase: (the last wave's idle, s; the learner step of the burst's flip off; its
# clients): the mixed trace's 128-client burst, bursty_contrast's 192 and bursty's 128. Each quiet phase's 2 requests
# arrived 55-80 ms later, prefilled one after the other; plain's steps at 2 requests: 5.7 ms
BURST_ENDS = [(303.164, 5749, 128), (338.920, 6774, 192), (384.034, 7940, 128)]
QUIET_PLAIN_S = 0.0457 / 8
# a turnover inside the mixed trace's burst: its wave ended at 302.074 s; the next wave's prefills admitted 1, 3, 6,
# 21, 21, 30, 33 and 13 requests, 10-20 ms apart (one or two decode steps between them)
TURNOVER, TURNOVER_PREFILLS = 302.074, [1, 3, 6, 21, 21, 30, 33, 13]


def after_burst(until: float, flip_step: int = 5749, peak: int = 128) -> ap.AutoState:
    """The learner at `until` inside or at the end of a burst: plain settled since `flip_step`, the hold at `peak`."""
    state = replay(until)
    return attrs.evolve(state, incumbent=ap.PLAIN, flip_step=flip_step, want_since=None, peak=peak,
                        peak_step=state.step, last_demand=peak, calm=0)


def steps_to_flip_on(state: ap.AutoState, limit: int = 64) -> int | None:
    """The plain steps of this run's quiet phase before speculation comes on (tests/auto_quiet_phase.py)."""
    return auto_quiet_phase.steps_to_flip_on(state, QUIET_PLAIN_S, CAP, limit)


@pytest.mark.parametrize(("end", "flip_step", "peak"), BURST_ENDS)
def test_the_quiet_phase_after_a_burst_is_valued_at_its_own_demand_within_a_window(
        end: float, flip_step: int, peak: int) -> None:
    """The hold (the most requests of the last 16 steps) valued the quiet phase's first 2 requests at the burst's
    128-192: plain for 15-23 steps, then speculation on with them running (p99 1.08-1.11x always-on's in bursty,
    bursty_contrast and mixed). Once the demand has settled (`calm_points` scheduling points with requests running,
    none waiting, the demand unchanged) it is the load, and speculation, a clear win at 2, comes on after 4 plain
    steps (bursty, bursty_contrast); after the mixed trace's long prompts at 2 requests plain decoding's value at 40
    tokens there is an interpolation until its own steps come in, one agreement window (8)."""
    steps = steps_to_flip_on(after_burst(end, flip_step, peak))
    assert steps is not None and steps <= 8, steps
    held = steps_to_flip_on(attrs.evolve(after_burst(end, flip_step, peak), params=ap.AutoParams(calm_points=0)))
    assert held is not None and held >= 15, held  # the hold by its steps alone, as the run had it


def test_a_turnover_inside_the_burst_keeps_the_hold() -> None:
    """The next wave's requests come back a few at a time, each scheduling point finding more waiting; between two
    prefills at most two decode steps, the first with none waiting: the demand never settles, the hold keeps the
    burst's 128, and nothing flips (speculation, a clear win at 1 to 6 requests, would come on and go off again)."""
    state = after_burst(TURNOVER)
    d = ap.commit(state, ap.decide(state, False, 0, 0, CAP))
    state, running = d, 0
    waiting = TURNOVER_PREFILLS[0]
    for i, admitted in enumerate(TURNOVER_PREFILLS):
        nxt = TURNOVER_PREFILLS[i + 1] if i + 1 < len(TURNOVER_PREFILLS) else 0
        points = [(running, waiting), (running + admitted, 0), (running + admitted, nxt)]
        for run, wait in points:  # the prefill's, then two decode steps'
            d = ap.decide(state, False, run + wait, run, CAP, context=40.0)
            assert d.action is None and (run + wait == 0 or d.load == 128), (i, run, wait, d)
            state = ap.commit(state, d)
        running, waiting = running + admitted, nxt


# --- a quiet phase of long prompts after a burst (the mixed trace's quiet_long_unpredictable) ------------------------

# its first decision with the 2 requests running came at 295.069 s: plain since a probe's flip off at learner step
# 4,856 (held through the 64-client burst), the requests' 2,775 tokens
LONG_QUIET, LONG_QUIET_FLIP_STEP = 295.069, 4856


def test_a_long_context_measured_in_an_earlier_phase_is_still_known_after_short_ones() -> None:
    """The context trace (60 s before) measured speculation at 2 requests and 2,800 tokens (19.5 ms a step as learned,
    against plain decoding's 7.0 ms: plain by 30 %), and until the mixed trace's first quiet phase (short prompts at 2
    clients) the learner valued it so. 250 steps of short contexts there moved the bucket's one line of seconds
    against context (its contexts' mean and spread, EWMA) so far that 2,775 tokens fell outside it: at the long quiet
    phase speculation was unknown, the prior flipped it on with the 2 requests running, at accept 1.0 (p99 1.255x
    plain's). What a bucket measured at a context stays known there (`context_band`): speculation is valued from it
    (plain wins), not flipped on by the prior. That estimate is 1,642 steps old, past `stale_after`, so the learner
    re-probes it (a probe on the budget, 24 steps, with the 2 requests' catch-up): the cost this leaves there."""
    state = attrs.evolve(replay(LONG_QUIET), incumbent=ap.PLAIN, flip_step=LONG_QUIET_FLIP_STEP, want_since=None)
    assert ap.value(replay(289.5), 1, 2, CAP, 2775.0) is not None  # known before the short quiet phase
    d = ap.decide(state, False, 2, 2, CAP, context=2775.0)
    assert d.spec_value is not None and d.plain_value is not None and d.plain_value > d.spec_value, d
    assert not d.wants_flip and d.reason != "prior" and (d.action is None or d.reason == "probe"), d
