"""Held out for the learner of aad690c: the auto learner fed the decode-step windows an H100 measured with that learner
running (2026-12-06, code c93100f; the 8B-class pair, TP 1, SGLang 0.5.16, one NVIDIA H100 80GB; plain, always on and
`auto` side by side; the traces context, accept_shift, bursty_contrast, two rounds each (run.log's rounds 0 and 1), in
that order: bench/gpu/results/2026-12-06_c93100f/traces_h100/traces.tar.gz, tr/auto/switch-2285.jsonl, the auto server's
scheduler; switch-2077.jsonl is its other process's, one config line). Each `auto_observe` window in the replays' form
(tests/test_auto_h200_shifts.py `extract_windows`, segments split where the windows pause over 10 s: 0 the warm-ups, 1
context, 2 accept_shift, 3 bursty_contrast, 4-6 the same in round 1) is in tests/data/h100_auto_windows_c93100f.json;
the catch-ups the windows carry are fed too (`observe_catch_up`).

What that run showed (run.log): auto 0.962x the per-phase best over the context trace, its miss the 8-long phase
(8 clients of 2,000-3,500-token prompts, two waves of 8 requests of 128 tokens): plain 3.14 / 3.20 s, always on
3.87 / 4.02 s, auto 3.29 s in round 0 and 4.04 s in round 1, p99 1.237x the better static's. The trace says why:
- round 0 (learner steps 2,145-2,374): speculation on from the 8-short phase; at the phase's first decision with its 8
  requests running (127.577 s, their longest request 3,373 tokens) speculation at 8 requests had not run near that
  context, and the prior ran plain (`_outgrown`: the 2-long phase's probe had measured plain decoding 285 tok/s
  against speculation's 158 at 2 requests); plain after 23 confirming steps (step 2,168), then held on the numbers;
- round 1 (steps 6,841-7,060): both modes' estimates at 8 requests and that context were round 0's, speculation's
  4,673 steps old, past `stale_after` (1,024). The first decision with the 8 requests running (247.732 s, 3,437 tokens)
  flipped plain on at once on them, a clear win (1,072 against 814 tok/s), which left speculation's estimate stale;
  126 steps later (249.298 s, step 6,967), the next wave's 8 requests running (3,221 tokens), the learner probed it:
  the round's 2-long phase had measured speculation at 2 requests within the margin of plain decoding (its
  decisions: 293 and 260 tok/s at 2,771 and 3,481 tokens against plain's 275), so `_outgrown` no longer barred the
  probe, and probes pay no catch-up gate. The flip-on retracted the 8 requests: 20,645 tokens re-prefilled in 0.489 s
  (the learned catch-up line, fit on catch-ups of at most 5,705 tokens in 12-21 ms, had it at 15 ms), then 30
  speculative steps at 20.1 ms for two tokens a request against plain decoding's 7.6 ms for one, and back to plain
  (`probe_end`, step 6,997). The probe and its catch-up are the round's 0.75 s over round 0.
The learner now re-measures speculation before leaving it on a stale estimate of itself (`_refresh_first`): the
first window of speculative steps refreshes it, the win is clear again, and no probe comes back for it."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import attrs
import pytest

from statemodel import auto_policy as ap

h200 = importlib.import_module("test_auto_h200_shifts")

TARBALL, MEMBER = "bench/gpu/results/2026-12-06_c93100f/traces_h100/traces.tar.gz", "tr/auto/switch-2285.jsonl"
WINDOWS = json.loads((Path(__file__).parent / "data" / "h100_auto_windows_c93100f.json").read_text())
CAP = 48
# the catch-ups the switch trace recorded (seconds since its first record, tokens re-prefilled, seconds)
CATCH_UPS = [(63.364, 5, 0.01893), (63.992, 37, 0.01602), (73.276, 348, 0.013101), (74.139, 3296, 0.02092),
             (118.411, 100, 0.019093), (124.848, 408, 0.01184), (167.62, 90, 0.017094), (217.186, 74, 0.015744),
             (238.421, 74, 0.016131), (241.052, 5705, 0.011581), (244.709, 272, 0.012375), (245.438, 392, 0.011859),
             (250.004, 20645, 0.488758), (286.316, 74, 0.047173), (297.006, 316, 0.018588), (338.956, 74, 0.014109)]


def test_the_windows_and_catch_ups_are_the_switch_trace() -> None:
    """The replayed windows and catch-ups are what the run's switch trace recorded (the H200 file's extractor)."""
    lines = h200._trace(TARBALL, MEMBER)
    assert h200.extract_windows(lines, 10.0) == WINDOWS
    assert h200.extract_catch_ups(lines) == CATCH_UPS


def replay(until: float) -> ap.AutoState:
    """This run's learner before `until` (`replay_windows`)."""
    return h200.replay_windows(WINDOWS, CATCH_UPS, until)


# --- the 8-long phase (c8_long) --------------------------------------------------------------------------------------

# the measured steps at 8 requests and these contexts (auto_observe windows of 8): plain decoding 0.0607 s, speculation
# 0.1609 s (accept 2.0); the probe's catch-up of the 8 requests: 20,645 tokens, 0.489 s
C8_PLAIN_S, C8_SPEC_S, C8_CATCH_UP = 0.0607 / 8, 0.1609 / 8, (20645, 0.488758)
# each round's first decision with the 8 requests running: (seconds since the trace's first record, steps since the
# last flip, the wave's longest request: the first wave's, then the second's)
C8_ROUND_0, C8_ROUND_1 = (127.577, 244, (3373.0, 3270.0)), (247.732, 181, (3437.0, 3221.0))


def run_tie(state: ap.AutoState) -> ap.AutoState:
    """`state` with speculation at 2 requests in the long context band as the run's learner valued it (its decisions
    in round 1's 2-long phase: 293 tok/s at 2,771 tokens, 260.3 at 3,481; plain decoding 275): 271 tok/s at 3,221
    tokens, within the margin of plain, where c93100f's `_outgrown` (plain ahead by the margin) did not hold, as the
    run's probe shows. The replay spreads a window's seconds evenly, and the windows with a long prompt's prefill in
    one step's interval put about twice a step's seconds on each of its 8 steps (clipped): it has that speculation
    8 % below plain."""
    key, (s1, c1), (s2, c2) = (1, ap.bucket_of(2), 4), (4 / 293.0, 2771.0), (4 / 260.3, 3481.0)
    est = state.estimate(*key)
    assert est is not None
    slope, mid, mean, var = (s2 - s1) / (c2 - c1), (c1 + c2) / 2, (s1 + s2) / 2, 355.0 ** 2  # a line through both
    line = attrs.evolve(est, mean=mean, ctx=mid, ctx_sq=var + mid * mid, ctx_s=mid * mean + slope * var)
    others = [(k, e) for k, e in state.estimates if k != key]
    return attrs.evolve(state, estimates=tuple(sorted([*others, (key, line)])))


def c8_long(state: ap.AutoState, waves: tuple[float, ...]) -> tuple[float, list[tuple[int, str]]]:
    """The phase closed-loop from its first decision with the 8 requests running (speculation on): each wave 8
    requests of 127 decode tokens, the next wave's scheduling points first (idle, 1 waiting: the trace's), every step at
    its mode's measured seconds, a flip-on with the 8 requests running paying the run's catch-up; fed in windows of
    8. (decode and catch-up seconds, [(the phase's step, action:reason)])."""
    spec_on, seconds, step, flips = True, 0.0, 0, []
    pending: list[ap.Observation] = []
    for i, longest in enumerate(waves):
        for running, waiting in ((0, 0), (0, 1)) if i else ():
            state = ap.commit(state, ap.decide(state, spec_on, running + waiting, running, CAP, context=longest))
        made = 0
        while made < 127:
            context = longest + made
            d = ap.decide(state, spec_on, 8, 8, CAP, context=context)
            if d.action is not None:
                flips.append((step, f"{d.action}:{d.reason}"))
                spec_on = d.action == ap.FLIP_ON
                if spec_on:
                    seconds += C8_CATCH_UP[1]
                    state = ap.observe_catch_up(state, *C8_CATCH_UP)
            state = ap.commit(state, d)
            s, tokens = (C8_SPEC_S, 16.0) if spec_on else (C8_PLAIN_S, 8.0)
            made, seconds, step = made + int(tokens // 8), seconds + s, step + 1
            pending.append(ap.Observation(spec_on, 8, tokens, s, context=context))
            if len(pending) == 8:
                for obs in pending:
                    state = ap.observe(state, obs)
                pending = []
    return seconds, flips


def at_c8_long(start: float, since_flip: int, tie: bool) -> ap.AutoState:
    """The learner at a round's first decision with the 8 requests running, speculation settled on the numbers
    `since_flip` steps before (the trace's), the hold at the phase's 8."""
    state = replay(start)
    state = run_tie(state) if tie else state
    return attrs.evolve(state, incumbent=1, flip_step=state.step - since_flip, want_since=None, peak=8,
                        peak_step=state.step, last_demand=8, calm=0)


@pytest.mark.parametrize("tie", [False, True], ids=["replayed", "as_the_run_valued_2_requests"])
def test_round_1_leaves_speculation_after_re_measuring_it_and_never_probes_it(tie: bool) -> None:
    """Round 1: speculation's estimate at 8 requests and this context is round 0's, stale. The first decision does
    not flip plain on at once on it (the run did, and probed it 126 steps later with the next wave's 8 requests
    running: their catch-up 0.489 s); the first window of speculative steps refreshes it, plain comes on on the
    numbers, and the phase has that one flip: at least 0.97x plain decoding held (the run: 0.79x)."""
    start, since_flip, waves = C8_ROUND_1
    state = at_c8_long(start, since_flip, tie)
    assert ap._stale(state, 1, 8, CAP, waves[0])
    d = ap.decide(state, True, 8, 8, CAP, context=waves[0])
    assert d.action is None and d.wants_flip and d.plain_value > d.spec_value * 1.25, d  # a clear win, stale
    seconds, flips = c8_long(state, waves)
    assert [f for _s, f in flips] == ["flip_off:measured"] and flips[0][0] <= 16, flips
    plain = len(waves) * 127 * C8_PLAIN_S
    assert plain / seconds >= 0.97, plain / seconds


def test_round_0_goes_plain_within_a_probe_and_stays() -> None:
    """Round 0: speculation at 8 requests has not run near this context. The run's prior ran plain (`_outgrown`: its
    2-long probe had valued speculation at 2 requests at 158 tok/s, a window with a long prompt's prefill in one
    step's interval among its first samples); the replay, whose windows spread that step's seconds over 8 steps and
    their contexts, has it within the margin there, so speculation runs on the prior, and plain decoding, not known
    at 8 requests at this context, is probed: a flip off either way, within 24 steps, and no other flip: at least
    0.95x plain decoding held (the run: 3.29 s against plain's 3.14 / 3.20 s)."""
    start, since_flip, waves = C8_ROUND_0
    seconds, flips = c8_long(at_c8_long(start, since_flip, False), waves)
    assert len(flips) == 1 and flips[0][1] in ("flip_off:prior", "flip_off:probe") and flips[0][0] <= 24, flips
    plain = len(waves) * 127 * C8_PLAIN_S
    assert plain / seconds >= 0.95, plain / seconds


# --- the 24-mixed phase (c24_mixed): 24 clients, every 8th prompt long ----------------------------------------------

# each round's first decision with requests waiting (the 24 arriving), plain on since the 8-long phase: (seconds, steps
# since the flip off). Plain decoding at 24 requests there: 3,082-3,158 tok/s (7.7 ms a step); speculation did not run
# at 24 near these contexts on this card: the 2026-12-06 (59347e0) run's 16.3 ms (tests/test_auto_h100_shifts.py).
# The longest request's context at the phase's decisions: 2,503-3,599 tokens (three long prompts among 24)
C24_ROUNDS = [(130.226, 206), (251.041, 63)]
C24_PLAIN_S, C24_SPEC_S, C24_CATCH_UP_S = 24 / 3100, 0.1307 / 8, 0.23


@pytest.mark.parametrize("longest", [2503.0, 2750.0, 3270.0, 3599.0])
@pytest.mark.parametrize(("start", "since_flip"), C24_ROUNDS)
def test_24_mixed_clients_stay_plain(start: float, since_flip: int, longest: float) -> None:
    """Both rounds: at the longest request's context speculation at 24 is not known and plain won at a smaller batch
    there: the prior runs plain, no probe; two waves of 128 tokens at plain's measured step, no flip (the run:
    1.004x the per-phase best)."""
    state = replay(start)
    state = attrs.evolve(state, incumbent=ap.PLAIN, flip_step=state.step - since_flip, want_since=None)
    tokens, seconds, flips = h200.run_phase(state, False, 24, 256, longest, C24_SPEC_S, C24_PLAIN_S, C24_CATCH_UP_S)
    assert flips == [] and (tokens / seconds) / (24 / C24_PLAIN_S) >= 0.97, flips


# --- bursty_contrast: the quiet phase after each burst (2 clients) ----------------------------------------------------

# each burst's end: (the quiet phase's first scheduling point, s; steps since the burst's flip off, a probe of plain at
# its first point). The run flipped speculation on at the quiet phase's first point with its 2 requests running, plain
# decoding 5.7 ms a step there (0.0457 s a window, the 59347e0 run's): the quiet phases at 0.985x / 0.984x the best
QUIET_STARTS, QUIET_PLAIN_S = [(217.018, 127), (338.811, 127)], 0.0457 / 8


@pytest.mark.parametrize(("start", "since_flip"), QUIET_STARTS)
def test_the_quiet_phase_after_a_burst_speculates_within_a_window(start: float, since_flip: int) -> None:
    """Both rounds' quiet phase after the first burst: the hold ends once the demand settled (`calm_points`), and
    speculation, a clear win at 2 requests, comes on within one window of plain steps."""
    state = replay(start)
    state = attrs.evolve(state, incumbent=ap.PLAIN, flip_step=state.step - since_flip, want_since=None, peak=192,
                         peak_step=state.step, last_demand=192, calm=0)
    steps = h200.auto_quiet_phase.steps_to_flip_on(state, QUIET_PLAIN_S, CAP)
    assert steps is not None and steps <= 8, steps
