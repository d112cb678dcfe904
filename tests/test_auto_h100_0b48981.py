"""Held out for the learner of 933e7d3: the auto learner fed the decode-step windows an H100 measured with that learner
running (2026-12-06, code 0b48981; the 8B-class pair, TP 1, SGLang 0.5.16, one NVIDIA H100 80GB; plain, always on and
`auto` side by side; two calls on one warm machine, each the traces context, accept_shift, bursty_contrast, two paired
rounds: bench/gpu/results/2026-12-06_0b48981/call_a and call_b, `traces.tar.gz`, the auto server's scheduler
`tr/auto/switch-903.jsonl` (call a) and `tr/auto/switch-5578.jsonl` (call b)). Each `auto_observe` window in the
replays' form (tests/test_auto_h200_shifts.py `extract_windows`, segments split where the windows pause over 10 s: 0
the warm-ups, 1 context, 2 accept_shift, 3 bursty_contrast, 4-6 the same in round 1) is in
tests/data/h100_auto_windows_0b48981_a.json and _b.json; the catch-ups the windows carry are fed too.

What the run showed (run.log): accept_shift, auto over the per-phase best, 0.982 (call a) and 0.967 (call b); call b
missed it in round 1's `predictable_again` (predictable requests at 2 clients after the unpredictable phase, accept
length 1.0 to 2.0): 4.31 s against always-on's 3.88 s (the call's median over both rounds 4.12 / 3.89 s, 0.947; p99
1.268x); every other round of that phase within 1 % of always on. The trace says why: plain held at accept 1.0 sees
predictable requests only at its next recheck of speculation (`_recheck_due`), and the rechecks form a cycle of
221-253 learner steps through the unpredictable phase (each a recheck's estimated loss, 16 steps at accept 1.0 and
the catch-up of the requests running, over `recheck_fraction`, 3 %, of plain decoding's time: about 2 waves of 2
requests of 128 tokens, 127 plain steps each). Where that cycle stood when the predictable requests came decided the
phase:
- call a round 0 (learner steps 3,162-4,151) and call b round 0 (3,170-4,159): the rechecks fell at wave starts (2
  admitted, none running: nothing retracted), 253 steps apart, and one fell at the phase's first scheduling point:
  speculation from the phase's first step;
- call a round 1 (7,858-8,843): a recheck began 15 steps before the phase's first point, mid-wave, and its last steps
  drafted the new requests at 2.0: kept, speculation from the phase's first step;
- call b round 1 (7,858-8,834): the rechecks fell mid-wave with the 2 requests running (catch-up 10.5 ms each, at
  steps 8,064, 8,308, 8,552, 8,804); the last ended at step 8,827, 7 steps before the predictable requests came
  (272.194 s, step 8,834), so the next came 222 steps into the phase (9,056, 273.450 s, 1.26 s in): its first wave and
  most of its second ran plain, 0.947x.
The replay below reproduced both with the rule of 0b48981: the recheck at the phase's first point from rounds 0's
state, 216 steps in from call b round 1's. Since 0a54b11 a recheck is priced at the 24 decode steps the switch's
windows make it (`AutoParams.recheck_span`) and waits for requests speculation has not drafted (`_recheck_due`'s
arrivals):
closed-loop from each round's unpredictable phase the rechecks fall at admissions and predictable_again's first
admission is rechecked in all four rounds (docs/auto-switch.md, "Rechecks at a turnover")."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import attrs
import pytest

from statemodel import auto_policy as ap

h200 = importlib.import_module("test_auto_h200_shifts")

DATA = Path(__file__).parent / "data"
TARBALLS = {"a": ("bench/gpu/results/2026-12-06_0b48981/call_a/traces.tar.gz", "tr/auto/switch-903.jsonl"),
            "b": ("bench/gpu/results/2026-12-06_0b48981/call_b/traces.tar.gz", "tr/auto/switch-5578.jsonl")}
WINDOWS = {call: json.loads((DATA / f"h100_auto_windows_0b48981_{call}.json").read_text()) for call in TARBALLS}
CAP = 48
# the catch-ups each switch trace recorded (seconds since its first record, tokens re-prefilled, seconds)
CATCH_UPS = {
    "a": [(112.57, 5, 0.018074), (113.185, 37, 0.016763), (121.95, 348, 0.011798), (122.757, 3296, 0.019205),
          (165.17, 100, 0.014907), (171.272, 408, 0.013221), (212.094, 74, 0.01652), (259.803, 88, 0.012333),
          (280.337, 74, 0.019811), (282.842, 5689, 0.011241), (286.479, 272, 0.016402), (287.153, 392, 0.012526),
          (325.426, 74, 0.018021), (330.791, 312, 0.018648), (332.326, 314, 0.012359), (333.804, 300, 0.011429),
          (335.296, 286, 0.011081), (376.024, 74, 0.010367)],
    "b": [(50.208, 5, 0.020178), (50.808, 37, 0.011165), (59.551, 348, 0.011688), (60.358, 3296, 0.017557),
          (102.667, 100, 0.015221), (108.756, 408, 0.012283), (149.511, 90, 0.011916), (196.695, 74, 0.009123),
          (217.273, 74, 0.011196), (219.662, 5661, 0.010279), (223.348, 272, 0.010573), (224.013, 296, 0.010738),
          (262.277, 82, 0.010406), (267.467, 268, 0.010504), (268.955, 254, 0.010723), (270.441, 240, 0.010936),
          (271.973, 242, 0.010512), (273.505, 244, 0.010586), (312.946, 74, 0.009436)]}


@pytest.mark.parametrize("call", sorted(TARBALLS))
def test_the_windows_and_catch_ups_are_the_switch_traces(call: str) -> None:
    """The replayed windows and catch-ups are what each call's switch trace recorded (the H200 file's extractor)."""
    lines = h200._trace(*TARBALLS[call])
    assert h200.extract_windows(lines, 10.0) == WINDOWS[call]
    assert h200.extract_catch_ups(lines) == CATCH_UPS[call]


def replay(call: str, until: float, params: ap.AutoParams | None = None, coverage: bool = False) -> ap.AutoState:
    """Call `call`'s learner before `until` (`replay_windows`); `coverage`: with the draft-vocabulary coverage the
    trace's requests had (`h200.phase_coverage` over `UNPREDICTABLE_SPANS`)."""
    return h200.replay_windows(WINDOWS[call], CATCH_UPS[call], until, params,
                               coverage=h200.phase_coverage(UNPREDICTABLE_SPANS[call]) if coverage else None)


# --- accept_shift at 2 clients: the unpredictable phase, then predictable_again ------------------------------------

# measured at 2 requests (the windows of segments 2 and 5, medians): plain decoding 0.0456 s a window of 8 steps,
# speculation 0.0582 s at accept 2.0 and 0.0572-0.0593 s at accept 1.0; a mid-wave recheck's catch-up (2 requests):
# 10.4-10.9 ms. Each phase: 8 waves of 2 requests of 128 tokens (the first from the prefill)
PLAIN_S, SPEC_S, SPEC_1_S, CATCH_UP_S, WAVES = 0.0456 / 8, 0.0582 / 8, 0.0576 / 8, 0.0106, 8
# predictable_again's first scheduling point (2 waiting, none running) per round: (call, seconds since the trace's
# first record, learner steps since speculation last drafted there: the last recheck's end)
PREDICTABLE_AGAIN = {"a0": ("a", 222.006, 230), "b0": ("b", 159.386, 230), "b1": ("b", 272.194, 7)}
# the unpredictable phase's flip off on the numbers (the first wave's 16 confirming steps at accept 1.0 behind it):
# (call, seconds, its learner step, the phase's steps until predictable_again's first point, the run's rechecks there)
UNPREDICTABLE = {"a0": ("a", 216.087, 3162, 989, 3), "b0": ("b", 153.464, 3170, 989, 3),
                 "a1": ("a", 329.376, 7858, 985, 4), "b1": ("b", 266.216, 7858, 976, 4)}
# the unpredictable phases' spans per call (seconds since the trace's first record): from the end of the window that
# drafted the phase's first steps among the predictable phase's last (accept 1.375-1.875) to predictable_again's
# first point (round 1 of call a: before the window that drafted its first steps at 1.625)
UNPREDICTABLE_SPANS = {"a": [(215.96, 222.006), (329.25, 335.43)], "b": [(153.34, 159.386), (266.09, 272.194)]}


def run_waves(state: ap.AutoState, accept: float, waves: int, spec_on: bool = False,
              first_made: int = 0, length: int = 127,
              coverage: float | tuple[float, ...] | None = None) -> tuple[float, list[tuple[int, str]], int,
                                                                          ap.AutoState]:
    """`waves` waves of 2 requests closed-loop from `state` (the trace's scheduling points between waves: idle, 2
    waiting, then both running), `length` (127) decode tokens each (the first wave from token `first_made`), every
    step at its mode's measured seconds (speculation drafting at `accept`), a flip-on with the 2 running paying the
    measured catch-up, fed in windows of 8 decode steps as the switch measures them (`AutoSwitch.on_run_batch`): a
    step's seconds only where the next decode step runs in the same mode with no flip or idle iteration between, so
    a wave's last step and the step before a flip are not observed, and a recheck runs 24 steps (its windows 7, 8 and
    8 observed, as in the run; until 0a54b11 this replay fed every step, and its rechecks ran 16); each decision is
    given its requests' arrivals as the switch stamps them (the learner step of the wave's first scheduling point;
    the first wave's, `first_made` steps before the start); `coverage`: every step's draft-vocabulary coverage (a
    tuple: per wave, in turn; None: no signal). (decode and catch-up seconds, [(step, action:reason)], steps, the
    state)."""
    spec_s = SPEC_S if accept >= 2.0 else SPEC_1_S
    seconds, step, flips = 0.0, 0, []
    pending: list[ap.Observation] = []
    window = 0  # decode steps in the window so far
    last: ap.Observation | None = None  # the previous decode step, observed once the next shows it was not cut
    for wave in range(waves):
        arrivals = (state.step - (first_made if not wave else 0),) * 2
        cover = coverage[wave % len(coverage)] if isinstance(coverage, tuple) else coverage
        if wave or not first_made:
            last = None  # the idle iteration between waves: the wave's last step is not observed
            for running, waiting in ((0, 0), (0, 2)):
                d = ap.decide(state, spec_on, running + waiting, running, CAP, context=159.0,
                              arrivals=arrivals[:waiting])
                if d.action is not None:
                    flips.append((step, f"{d.action}:{d.reason}"))
                    spec_on = d.action == ap.FLIP_ON
                state = ap.commit(state, d)
        made = first_made if not wave else 0
        while made < length:
            context = 32.0 + made
            d = ap.decide(state, spec_on, 2, 2, CAP, context=context, arrivals=arrivals)
            if d.action is not None:
                flips.append((step, f"{d.action}:{d.reason}"))
                spec_on = d.action == ap.FLIP_ON
                if spec_on:
                    seconds += CATCH_UP_S
                    state = ap.observe_catch_up(state, int(2 * context), CATCH_UP_S)
            if last is not None and d.action is None:
                pending.append(last)
            state = ap.commit(state, d)
            s, tokens = (spec_s, 2 * accept) if spec_on else (PLAIN_S, 2.0)
            made, seconds, step = made + int(tokens // 2), seconds + s, step + 1
            last, window = ap.Observation(spec_on, 2, tokens, s, context=context, coverage=cover), window + 1
            if window == 8:
                for obs in pending:
                    state = ap.observe(state, obs)
                pending, window = [], 0
    return seconds, flips, step, state


def at_predictable_again(round_: str) -> ap.AutoState:
    """The learner at the round's predictable_again first point, plain held on the numbers since the last recheck
    ended as many steps before as in the run."""
    call, start, since = PREDICTABLE_AGAIN[round_]
    state = replay(call, start)
    return attrs.evolve(state, incumbent=ap.PLAIN, flip_step=state.step - since, want_since=None)


@pytest.mark.parametrize("round_", ["a0", "b0"])
def test_predictable_again_is_rechecked_at_its_first_point_where_the_cycle_was_due(round_: str) -> None:
    """Rounds 0 of both calls: 230 steps since the last recheck ended, the next is due at the phase's first point (2
    admitted, none running, nothing to retract), finds accept 2.0 and stays: always on's decode seconds within 1 %."""
    seconds, flips, _steps, _state = run_waves(at_predictable_again(round_), 2.0, WAVES)
    assert flips == [(0, "flip_on:recheck")], flips
    assert WAVES * 64 * SPEC_S / seconds >= 0.99, seconds


def test_from_call_b_round_1s_own_state_the_recheck_waits_for_its_budget() -> None:
    """Call b round 1 from the run's own state at predictable_again's first point: the last recheck (the rule of
    0b48981, mid-wave) ended 7 steps before the predictable requests came. A recheck is now priced at the 24 decode
    steps it runs, and with the 2 requests running their catch-up too, so from there the budget allows the next only
    past the phase's second wave: at the third's admission (254 steps in), then kept. Such a state does not arise
    under the new price at this load (its rechecks start at admissions: the closed loops below); the test pins that
    the budget still holds from it."""
    seconds, flips, _steps, _state = run_waves(at_predictable_again("b1"), 2.0, WAVES)
    assert flips == [(254, "flip_on:recheck")], flips


def unpredictable_then_predictable(round_: str, waves: int = WAVES, coverage: bool = False) -> tuple[
        float, list[tuple[int, str]], int, float, list[tuple[int, str]]]:
    """The round closed-loop from its unpredictable phase's flip off (`waves` waves at accept 1.0, the first 24 tokens
    in) through predictable_again (8 waves at 2.0). `coverage`: with the draft-vocabulary coverage the requests had
    (the counter draft's ids below 1,024: the unpredictable requests' outputs none, the predictable ones' all), in
    the replayed windows and the waves; else no signal. (unpredictable seconds, its flips, its steps,
    predictable_again's seconds, its flips)."""
    call, start, _step, _steps, _rechecks = UNPREDICTABLE[round_]
    state = replay(call, start + 0.001, coverage=coverage)
    state = attrs.evolve(state, incumbent=ap.PLAIN, flip_step=state.step, want_since=None)
    seconds, flips, n, state = run_waves(state, 1.0, waves, first_made=24, coverage=0.0 if coverage else None)
    spec_on = bool(flips) and flips[-1][1].startswith(ap.FLIP_ON)
    again, flips_again, _n, _state = run_waves(state, 2.0, WAVES, spec_on=spec_on, coverage=1.0 if coverage else None)
    return seconds, flips, n, again, flips_again


def test_predictable_again_within_3_percent_of_always_on_in_call_b_round_1() -> None:
    """Issue 52's target in the phase, at least 0.97x always on's decode seconds, in the round the run missed (call b
    round 1: 0.898x, the recheck cycle 7 steps past a recheck at the return), closed-loop from the round's own
    unpredictable phase: priced at the 24 steps they run, a mid-wave recheck (the 2 requests' catch-up on top) is
    not affordable before the next admission, so the rechecks fall at admissions (the third, fifth and seventh
    wave), and predictable_again's first admission is rechecked and kept. (Until 0a54b11 a strict xfail from the run's
    state at the return: 0.892x.)"""
    _s, _f, _n, seconds, flips = unpredictable_then_predictable("b1")
    assert flips[:1] == [(0, "flip_on:recheck")], flips
    assert WAVES * 64 * SPEC_S / seconds >= 0.97, seconds


@pytest.mark.parametrize("round_", sorted(UNPREDICTABLE))
def test_the_unpredictable_phase_is_rechecked_at_a_bounded_rate(round_: str) -> None:
    """Each round's unpredictable phase from its flip off (the first wave 24 tokens in) to predictable_again's first
    point, replayed: rechecks as often as the run's, at most 5 per 1,000 steps (each a flip on and its return: at
    most 11 flips per 1,000), the time against plain decoding held throughout within `recheck_fraction` (3 %) and
    the rechecks' catch-ups."""
    call, start, _step, steps, run_rechecks = UNPREDICTABLE[round_]
    state = replay(call, start + 0.001)
    state = attrs.evolve(state, incumbent=ap.PLAIN, flip_step=state.step, want_since=None)
    seconds, flips, n, end = run_waves(state, 1.0, WAVES, first_made=24)
    rechecks = end.rechecks - state.rechecks
    assert abs(rechecks - run_rechecks) <= 1 and rechecks * 1000 / n <= 5 and len(flips) * 1000 / n <= 11, flips
    plain = (WAVES * 127 - 24) * PLAIN_S
    assert seconds / plain - 1 <= 0.03 + rechecks * CATCH_UP_S / plain, (seconds / plain, n, steps)


@pytest.mark.parametrize("round_", [
    pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=(
        "the first recheck, priced at the relearned accept 1.0, falls mid-wave (step 328): the later ones follow "
        "it, and the return lands 104 steps after the last, under the budget's spacing: seen 224 steps in, 0.889x")))
    if r == "a1" else r for r in sorted(UNPREDICTABLE)])
def test_closed_loop_the_return_is_seen_at_its_first_admission(round_: str) -> None:
    """Each round closed-loop from its unpredictable phase's flip off through predictable_again: the rechecks fall at
    the admissions of new requests (every second wave at 2 clients: 127 steps a wave, about 230 steps of budget at an
    emptied server, more mid-wave, where the 2 running requests' catch-up counts too), and the return is rechecked at
    its first admission. The phase's 8 waves put the return on a rechecked admission: with 7 or 9 it falls on one the
    budget skips and is seen 127-232 steps later (docs/auto-switch.md, "Rechecks at a turnover"); round a1 meets that
    case (the xfail's reason) since the accept length is relearned at 1.0 at the drop (tests/test_auto_h100_1009c9d.py):
    its first recheck is priced at 1.0, not at the EWMA's leftover 1.11 (until then every round passed). With the draft
    vocabulary's coverage, as the run's switch counts it, the return is seen 8 steps in whatever the alignment
    (`test_with_the_coverage_the_return_is_seen_in_its_first_window`, below)."""
    _s, flips, _n, seconds, flips_again = unpredictable_then_predictable(round_)
    assert all(f.endswith(("recheck", "probe_end")) for _s, f in flips), flips
    rechecks = [s for s, f in flips if f == "flip_on:recheck"]
    assert all((24 + s) % 127 == 0 for s in rechecks), (round_, rechecks)  # at admissions
    assert flips_again[:1] == [(0, "flip_on:recheck")] and WAVES * 64 * SPEC_S / seconds >= 0.99, flips_again


def test_a_recheck_is_priced_at_the_decode_steps_the_switchs_windows_run() -> None:
    """Every recheck of the run ran windows of 7, 8 and 8 measured speculative steps (the interval across the flip
    unmeasured: 24 decode steps), which `AutoParams.recheck_span` derives from `recheck_steps` and the agreement
    window; the learner's budget prices that many (it priced 16, `recheck_steps`, until 0a54b11): from call b round
    1's flip off, at an emptied server, a recheck becomes affordable after its loss at the accept length relearned at
    the drop, 1.0 (24 steps at the accept-1.0 step against plain's for the same tokens), over 3 % of plain's time
    (at the EWMA's leftover 1.09, before the relearning at a shift: 200-260 steps)."""
    rechecks = []
    for spec, n, _sec, _acc, _ctx, _batch, segment, _t in WINDOWS["b"]:
        if segment == 5 and spec:
            rechecks.append(rechecks.pop() + [n] if rechecks and rechecks[-1][-1] != 0 else [n])
        elif segment == 5 and rechecks and rechecks[-1][-1] != 0:
            rechecks[-1].append(0)
    short = [r[:-1] for r in rechecks if len(r) <= 4]  # the rechecks (not the phases speculation held)
    assert short and all(r == [7, 8, 8] for r in short), short
    p = ap.AutoParams()
    assert p.recheck_span == 1 + sum(short[0]) == 24
    call, start, _step, _steps, _rechecks = UNPREDICTABLE["b1"]
    state = replay(call, start + 0.001)
    state = attrs.evolve(state, incumbent=ap.PLAIN, flip_step=state.step, want_since=None)
    spec_s, plain_s = ap._step_seconds(state, 1, 2, 100.0)[0], 2 / ap.value(state, ap.PLAIN, 2, CAP, 100.0)
    accept = state.accept.mean
    loss = p.recheck_span * spec_s * max(1 - accept * plain_s / spec_s, p.clear_win / (1 + p.clear_win))
    due = next(k for k in range(1, 1000) if ap._recheck_due(
        attrs.evolve(state, step=state.accept.updated + k), 1, 2, 0, CAP, 100.0, 2 / plain_s) is not None)
    assert due == math.ceil(loss / (p.recheck_fraction * plain_s)), (due, loss)
    assert accept == 1.0 and 290 < due < 340, (accept, due)  # 16 steps priced: about 210


@pytest.mark.parametrize("length", [8, 24, 64, 127, 200])
def test_rechecks_at_every_turnover_keep_the_budgets_bound(length: int) -> None:
    """Adversarial for the turnover rule: from call b round 1's flip off, 20,000 steps of waves of 2 requests that
    draft at 1.0 (new requests at every wave, `length` steps apart: at 8, at every window; at most 200, so the
    contexts stay in one band): the requests' turnover never holds a recheck back, and the budget alone bounds them.
    Priced at the 24 steps a recheck runs, the time lost against plain decoding held throughout stays within
    `recheck_fraction` (3 %: 30 plain steps per 1,000; 0943833's learner, pricing 16, lost 31.6-33.4), and the flips
    are the rechecks' and probes' own (a flip on and its return each)."""
    call, start, _step, _steps, _rechecks = UNPREDICTABLE["b1"]
    state = replay(call, start + 0.001)
    state = attrs.evolve(state, incumbent=ap.PLAIN, flip_step=state.step, want_since=None)
    waves = 20_000 // length
    seconds, flips, n, end = run_waves(state, 1.0, waves, length=length)
    rechecks, probes = end.rechecks - state.rechecks, end.probes - state.probes
    assert rechecks >= 20 and len(flips) <= 2 * (rechecks + probes) + 1, (rechecks, probes, len(flips))
    assert seconds / (waves * length * PLAIN_S) - 1 <= ap.AutoParams().recheck_fraction, (seconds, n)


# --- the draft vocabulary's coverage (the counter draft's ids below 1,024): a signal plain steps show ----------------


@pytest.mark.parametrize("waves", [7, 8, 9])
@pytest.mark.parametrize("round_", sorted(UNPREDICTABLE))
def test_with_the_coverage_the_return_is_seen_in_its_first_window(round_: str, waves: int) -> None:
    """Each round closed-loop from its unpredictable phase's flip off through predictable_again, with the coverage
    the requests had (the unpredictable ones' outputs all outside the draft's vocabulary, the predictable ones' all
    in it): through the unpredictable phase the coverage's bound on the accept length (1.0) cannot beat plain
    decoding, so no recheck is spent there (`_recheck_due` (b)), nor the stale estimate's probe at 9
    waves (1,024 steps on: `_coverage_rules_out`; before, 0.99x plain there); once predictable requests return, the
    bound rises with the first window of their tokens and speculation comes back then, whatever the phase's length:
    the recheck (a), or at 9 waves, speculation's estimate stale by then, its probe; 0.988-0.993x always on (without
    the signal, 7 or 9 waves: 0.885-0.935x)."""
    seconds, flips, n, again, flips_again = unpredictable_then_predictable(round_, waves, coverage=True)
    assert not flips, flips
    assert (waves * 127 - 24) * PLAIN_S / seconds >= 0.999, seconds
    assert flips_again[:1] == [(8, "flip_on:probe" if waves == 9 else "flip_on:recheck")], flips_again
    assert WAVES * 64 * SPEC_S / again >= 0.97, again


@pytest.mark.parametrize("coverage", [0.0, 1.0, (0.0, 1.0), (1.0, 0.0, 0.0)])
@pytest.mark.parametrize("length", [8, 127])
def test_a_misleading_coverage_keeps_the_rechecks_within_the_budget(coverage: float | tuple[float, ...],
                                                                     length: int) -> None:
    """Adversarial for the coverage rule: from call b round 1's flip off, 20,000 steps of waves of 2 requests that
    draft at 1.0 whatever the coverage says: none of it in the draft's vocabulary (0.0: no recheck spent, (b)), all of
    it (1.0: tokens in the vocabulary the draft still mispredicts; the bound rose once, over the 0 the flip off was
    measured at), or rising at every second or third wave (each rise a recheck due early, (a)). Each early recheck
    borrows the budget and the next waits until it is paid back, so the rechecks spend at most the budget (3 %: 30
    plain steps per 1,000) plus one recheck, and flip no more often than without the signal (one recheck's flip
    pair over the run at most)."""
    call, start, _step, _steps, _rechecks = UNPREDICTABLE["b1"]
    waves = 20_000 // length
    runs = {}
    for signal in (False, True):
        state = replay(call, start + 0.001, coverage=signal)
        state = attrs.evolve(state, incumbent=ap.PLAIN, flip_step=state.step, want_since=None)
        seconds, flips, n, end = run_waves(state, 1.0, waves, length=length, coverage=coverage if signal else None)
        runs[signal] = (len(flips), seconds / (waves * length * PLAIN_S) - 1, end.rechecks - state.rechecks)
    (flips_off, _lost_off, _r_off), (flips_on, lost_on, rechecks_on) = runs[False], runs[True]
    assert flips_on <= flips_off + 2, runs
    assert lost_on <= ap.AutoParams().recheck_fraction, runs
    assert rechecks_on == 0 if coverage == 0.0 else rechecks_on >= 20, runs
