"""Held out: the auto learner fed the decode-step windows an H200 measured, a run the learner's 2026-12-06 changes
(12560da..511791d, fitted on H100 traces: tests/test_auto_h100_shifts.py) never saw. 2026-12-06 (code 886650f, the
learner before those changes), the 8B-class pair, TP 1, SGLang 0.5.16, five servers side by side (plain, always on,
`auto`, `auto` with tiers, `auto` + guard), one NVIDIA H200; the traces bursty_contrast, context, accept_shift, then
bursty_contrast again (bench/gpu/results/2026-12-06_886650f/workload_f/traces.tar.gz, tr/auto/switch-10531.jsonl:
each `auto_observe` window as [speculative, steps, seconds, accept length, KV tokens per request (the mean, as that
switch recorded it), running requests (the last decision's with requests running, or the last traced step's),
segment, seconds since the trace's first record], in tests/data/h200_auto_windows_886650f.json, extracted as the
H100 windows were (`extract_windows` below reproduces tests/data/h100_auto_windows_59347e0.json from its tarball
exactly); segments split where the windows pause over 20 s (the other servers' turns; five servers' warm-ups
paused 10.8 s, the H100 file's three under 8 s, split at 10 s): 0 the warm-ups, 1
bursty_contrast, 2 context, 3 accept_shift, 4 bursty_contrast's second round; windows with steps of both modes left
out). The catch-ups the windows carry (tokens, seconds) are fed too (`observe_catch_up`): a recheck's cost counts them.

What the recorded (old) learner did there (`bench/gpu/summarize.py bench/gpu/results/2026-12-06_886650f/workload_f`):
context 0.868x the per-phase best (8 clients of 2,000-3,500-token prompts: speculation held on the prior, 0.751x;
24 clients with every 8th prompt long: 0.729x), accept_shift 0.963x (predictable requests returning at 2 clients:
0.934x), bursty_contrast 0.997x. Each test below replays the windows to a phase's start and asks the current learner
what it does there; where it would not pick the faster mode, the test is an xfail with the reason measured."""

from __future__ import annotations

import functools
import importlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from statemodel import auto_policy as ap

auto_quiet_phase = importlib.import_module("auto_quiet_phase")

ROOT = Path(__file__).resolve().parent.parent
WINDOWS = json.loads((Path(__file__).parent / "data" / "h200_auto_windows_886650f.json").read_text())
CAP = 48
# the catch-ups the switch trace recorded (seconds since its first record, tokens re-prefilled, seconds)
CATCH_UPS = [(75.827, 5, 0.019365), (76.309, 37, 0.009656), (90.888, 1760, 0.016849), (134.446, 128, 0.010469),
             (138.804, 98, 0.011479), (186.933, 100, 0.010695), (189.435, 5900, 0.011652), (192.018, 408, 0.011954),
             (199.313, 9874, 0.243786), (256.853, 106, 0.011715), (258.204, 172, 0.011689), (259.58, 238, 0.012552),
             (261.048, 82, 0.01167), (302.577, 108, 0.010987)]


def extract_windows(trace_lines: list[str], gap: float, tiers: bool = False) -> list[list]:
    """A switch trace's `auto_observe` windows in the replays' form (the module docstring), segments split where the
    windows pause over `gap` seconds. `tiers`: each speculative window also gives the step count it ran at (a ninth
    element: the one tier its `accept_by_steps` has an accept length for; a window that changed tier is left out)."""
    records = [json.loads(line) for line in trace_lines if line.strip()]
    t0, running, last, segment, out = records[0]["t"], 0, None, 0, []
    for r in records:
        if r.get("action") == "auto_decide":
            running = r["running"] or running
        elif r.get("action") == "step" and "bs" in r:
            running = r["bs"]
        elif r.get("action") == "auto_observe":
            t = round(r["t"] - t0, 3)
            segment += last is not None and t - last > gap
            last = t
            if r["spec"] in (0, r["n"]):
                window = [int(r["spec"] > 0), r["n"], r["seconds"], r["accept_mean"], r["context"], running, segment, t]
                if tiers:
                    ran = [int(k) for k, v in (r.get("accept_by_steps") or {}).items() if v is not None]
                    if r["spec"] and len(ran) != 1:
                        continue
                    window.append(ran[0] if r["spec"] else None)
                out.append(window)
    return out


def extract_catch_ups(trace_lines: list[str]) -> list[tuple[float, int, float]]:
    """The catch-ups a switch trace's `auto_observe` windows carried: (seconds since its first record, tokens
    re-prefilled, seconds), the replays' `CATCH_UPS` form."""
    records = [json.loads(line) for line in trace_lines if line.strip()]
    return [(round(r["t"] - records[0]["t"], 3), r["catch_up_tokens"], r["catch_up_s"]) for r in records
            if r.get("action") == "auto_observe" and "catch_up_s" in r]


def _trace(tarball: str, member: str) -> list[str]:
    with tarfile.open(ROOT / tarball) as tar:
        f = tar.extractfile(member)
        assert f is not None
        return io.TextIOWrapper(f, encoding="utf-8").readlines()


@functools.cache
def read_run(tarball: str, member: str, tiers: bool = False) -> tuple[list[list], list[tuple[float, int, float]],
                                                                      list[dict], float]:
    """A run's switch trace, read once: its windows (`extract_windows`, gap 20 s; `tiers`: with each one's step count)
    and catch-ups in the replays' form, its records and their first time."""
    lines = _trace(tarball, member)
    recs = [json.loads(line) for line in lines]
    return extract_windows(lines, 20.0, tiers=tiers), extract_catch_ups(lines), recs, recs[0]["t"]


@functools.cache
def read_covered_run(tarball: str, member: str) -> tuple[list[list], list[tuple[float, int, float]],
                                                         dict[float, float | None], list[dict], float]:
    """`read_run` of a run whose switch counted the draft vocabulary's coverage, with each window's coverage by its
    time (the window's eighth element), for `replay_windows(..., coverage=lambda w: cover[w[7]])`."""
    windows, catch_ups, recs, t0 = read_run(tarball, member)
    cover = {round(r["t"] - t0, 3): r.get("coverage") for r in recs if r.get("action") == "auto_observe"}
    return windows, catch_ups, cover, recs, t0


def replay_covered_run(tarball: str, member: str, until: float, params: ap.AutoParams | None = None) -> ap.AutoState:
    """The learner after a covered run's windows before `until` (s since its trace's first record), each window fed
    its own coverage (`read_covered_run`, `replay_windows`)."""
    windows, catch_ups, cover, _recs, _t0 = read_covered_run(tarball, member)
    return replay_windows(windows, catch_ups, until, params=params, coverage=lambda w: cover[w[7]])


def standing_plain_before(tarball: str, member: str, r: dict, params: ap.AutoParams | None = None) -> ap.AutoState:
    """A covered run's learner before its recorded `auto_decide` `r`, as the plain server stood there
    (`replay_covered_run`, `standing_plain`: settled since the recorded flip, no flip wanted yet)."""
    *_rest, t0 = read_covered_run(tarball, member)
    return standing_plain(replay_covered_run(tarball, member, r["t"] - t0, params), r)


@pytest.mark.parametrize(("tarball", "member", "gap", "data"), [
    ("bench/gpu/results/2026-12-06_59347e0/workload_c/traces.tar.gz", "tr/auto/switch-875.jsonl", 10.0,
     "h100_auto_windows_59347e0.json"),
    ("bench/gpu/results/2026-12-06_886650f/workload_f/traces.tar.gz", "tr/auto/switch-10531.jsonl", 20.0,
     "h200_auto_windows_886650f.json")])
def test_the_windows_are_the_switch_traces(tarball: str, member: str, gap: float, data: str) -> None:
    """The replayed windows are what the runs' switch traces recorded, extracted one way for both cards."""
    windows = json.loads((Path(__file__).parent / "data" / data).read_text())
    assert extract_windows(_trace(tarball, member), gap) == windows


def test_the_catch_ups_are_the_switch_trace() -> None:
    """`CATCH_UPS` is what the H200 run's `auto_observe` windows carried."""
    assert extract_catch_ups(_trace("bench/gpu/results/2026-12-06_886650f/workload_f/traces.tar.gz",
                                    "tr/auto/switch-10531.jsonl")) == CATCH_UPS


def replay_windows(windows: list[list], catch_ups: list[tuple[float, int, float]], until: float,
                   params: ap.AutoParams | None = None,
                   coverage: Callable[[list], float | None] | None = None,
                   tiers: tuple[int, ...] = ()) -> ap.AutoState:
    """The learner after every window (and catch-up) of a run's trace recorded before `until`, each window's seconds
    spread evenly over its steps (every card's replay tests read their traces through this one). `coverage`: each
    window's draft-vocabulary coverage (`Observation.coverage`; the runs' switches did not count it, so a replay
    gives what the trace's requests had: `phase_coverage`); None: no signal. `tiers`: the ladder, each window's step
    count its ninth element (`extract_windows(..., tiers=True)`)."""
    state = ap.initial_state(params, tiers=tiers)
    pending = [c for c in catch_ups if c[0] < until]
    for window in windows:
        spec, n, seconds, accept, context, batch, _segment, t = window[:8]
        steps = window[8] if tiers else None
        if t >= until:
            break
        while pending and pending[0][0] <= t:
            _, tokens, cost = pending.pop(0)
            state = ap.observe_catch_up(state, tokens, cost)
        for _ in range(n):
            tokens = (None if accept is None else batch * accept) if spec else float(batch)
            state = ap.observe(state, ap.Observation(bool(spec), batch, tokens, seconds / n, context=context or 0.0,
                                                     coverage=None if coverage is None else coverage(window),
                                                     steps=steps))
    return state


def standing_plain(state: ap.AutoState, r: dict, wanted: bool = False) -> ap.AutoState:
    """A replayed state as a plain server stood at its recorded `auto_decide` `r`: its last flip (`flip_step`) and, with
    `wanted`, the start of the flip it wanted (`want_since`) as many learner steps back as the record has them (the
    replay's step count is not the server's); else no flip wanted yet."""
    def back(step: int) -> int:
        return state.step - (r["learner_step"] - step)
    return attrs.evolve(state, incumbent=ap.PLAIN, flip_step=back(r["flip_step"]),
                        want_since=back(r["want_since"]) if wanted else None)


def settled_speculating(state: ap.AutoState, demand: int) -> ap.AutoState:
    """A replayed state as the server stood at a recorded decision under speculation: settled there (its flip 300
    steps back), `demand` held as the hold's peak and the last demand, and credit for a probe, so that only the
    estimates decide whether a probe starts."""
    return attrs.evolve(state, incumbent=1, flip_step=state.step - 300, credit=96.0, peak=demand,
                        peak_step=state.step, last_demand=demand, calm=0)


def phase_coverage(unpredictable: list[tuple[float, float]]) -> Callable[[list], float | None]:
    """A run's draft-vocabulary coverage per window, from its trace's phases: the benchmark's counter draft holds
    the target ids below 1,024, every predictable request's outputs lie there (1.0) and every unpredictable one's
    above (0.0: bench/gpu/bursty_client.py `unpredictable_token`). `unpredictable`: the spans (seconds since the
    trace's first record, from the first window after the phase began to its end) of the unpredictable phases; the
    warm-ups (segment 0) not known (None)."""
    def of(window: list) -> float | None:
        segment, t = window[6], window[7]
        return None if segment == 0 else 0.0 if any(a < t < b for a, b in unpredictable) else 1.0
    return of


def replay(until: float) -> ap.AutoState:
    """This H200 run's learner before `until` (`replay_windows`)."""
    return replay_windows(WINDOWS, CATCH_UPS, until)


# --- context: 8 clients of long prompts (c8_long), then 24 with every 8th prompt long (c24_mixed) --------------------

# c2_long: plain since a probe's flip off at learner step 2,736 (plain 5.5 ms a step against speculation's 12.2 ms at
# 2 requests and 2,850 tokens); at 189.193 s, the requests at 2,948 tokens, the run flipped speculation on on the prior
# (speculation's one line no longer reached that context) and off again 6 steps later on the numbers
C2_LONG, C2_FLIP_STEP = 189.193, 2736


@pytest.mark.parametrize("longest", [2948.0, 3300.0])
def test_2_long_clients_stay_plain_as_their_contexts_grow(longest: float) -> None:
    """The current learner still values speculation there (its context band's line), plain ahead by the margin:
    plain held on the numbers, no flip on the prior (plain was the faster mode: 3.43 s against 3.76 s)."""
    state = attrs.evolve(replay(C2_LONG), incumbent=ap.PLAIN, flip_step=C2_FLIP_STEP, want_since=None)
    d = ap.decide(state, False, 2, 2, CAP, context=longest)
    assert d.action is None and d.reason == "measured" and not d.wants_flip, d
    assert d.spec_value is not None and d.plain_value is not None and d.plain_value > d.spec_value, d


# c8_long's first decision with its 8 requests running came at 194.329 s (learner step 3,469), speculation on since
# c8_short's flip on the numbers at step 3,225; the run held it on the prior through the phase (18.2-18.9 ms a
# step for two tokens a request), 0.751x plain decoding's phase time (plain 2.73 s, always on 3.65 s)
C8_LONG, C8_FLIP_STEP = 194.329, 3225
C8_SPEC_S = 0.1486 / 8
# plain decoding at 8 requests and these contexts did not run on the auto server; the plain server's phase took 0.748x
# always on's (2.73 / 3.65 s, prefills in both), so a plain step at 0.748 x half a speculative step's seconds
C8_PLAIN_S = 0.748 * C8_SPEC_S / 2


def run_phase(state: ap.AutoState, spec_on: bool, batch: int, steps: int, context: float, spec_s: float,
              plain_s: float, catch_up_s: float = 0.0) -> tuple[float, float, list[str]]:
    """A phase closed-loop at `batch` requests, each step the seconds its mode measured there, fed in the switch's
    windows of 8; a flip-on pays `catch_up_s`. (tokens, seconds, the flips)."""
    tokens = seconds = 0.0
    flips: list[str] = []
    pending: list[ap.Observation] = []
    for _ in range(steps):
        d = ap.decide(state, spec_on, batch, batch, CAP, context=context)
        if d.action is not None:
            flips.append(f"{d.action}:{d.reason}")
            spec_on = d.action == ap.FLIP_ON
            seconds += catch_up_s if spec_on else 0.0
        state = ap.commit(state, d)
        step, made = (spec_s, 2.0 * batch) if spec_on else (plain_s, float(batch))
        tokens, seconds = tokens + made, seconds + step
        pending.append(ap.Observation(spec_on, batch, made, step, context=context))
        if len(pending) == 8:
            for obs in pending:
                state = ap.observe(state, obs)
            pending = []
    return tokens, seconds, flips


@pytest.mark.parametrize("longest", [2000.0, 2700.0, 3500.0])
def test_8_long_clients_run_plain_where_2_long_ones_lost(longest: float) -> None:
    """At c8_long's start speculation at 8 requests is not known at these contexts, and neither is plain decoding;
    at 2 requests (c2_long, a probe) plain decoding took 5.5 ms a step against speculation's 11-12 ms (two tokens a
    request): plain by 25 % and more. The prior runs plain (`_outgrown`), and speculation, held on the numbers
    before, goes off after its confirmation; the run held it on the prior for the whole phase."""
    state = attrs.evolve(replay(C8_LONG), incumbent=1, flip_step=C8_FLIP_STEP, want_since=None)
    d = ap.decide(state, True, 8, 8, CAP, context=longest)
    assert d.action is None and d.reason == "confirming" and d.wants_flip, d
    # the phase's two waves of 128 tokens: 128 speculative steps, or 256 plain ones
    tokens, seconds, flips = run_phase(state, True, 8, 256, longest, C8_SPEC_S, C8_PLAIN_S)
    assert flips == ["flip_off:prior"], flips
    # the 16 confirming steps at speculation's 18.6 ms: 0.96x plain over the phase (the run, speculation held: 0.748x)
    assert (tokens / seconds) / (8 / C8_PLAIN_S) >= 0.95, tokens / seconds


# c24_mixed's first decision (22 waiting, then 24 running) came at 197.360 s (learner step 3,595). The run: a probe
# of plain at 24 (5.95 ms a step), then speculation back on (valued at the mean context, 409 tokens) with the 24
# requests running (catch-up 0.24 s), 14.1-17.1 ms a step for two tokens a request: 0.729x plain's phase time
C24_MIXED = 197.360
C24_PLAIN_S, C24_SPEC_S, C24_CATCH_UP_S = 0.0476 / 8, 0.1250 / 8, 0.2438


@pytest.mark.parametrize("longest", [2000.0, 2750.0, 3500.0])
def test_24_mixed_clients_stay_plain(longest: float) -> None:
    """Entering from c8_long in plain (where this learner would be), valued at its longest request's context:
    speculation at 24 is not known there, plain won at 2 requests by far, so the prior runs plain and speculation is
    not probed; the phase (two waves of 128 tokens) runs at plain decoding's measured step, no flip."""
    state = attrs.evolve(replay(C24_MIXED), incumbent=ap.PLAIN, flip_step=C8_FLIP_STEP + 260, want_since=None)
    d = ap.decide(state, False, 24, 24, CAP, context=longest)
    assert d.action is None and d.reason == "prior" and not d.wants_flip, d
    tokens, seconds, flips = run_phase(state, False, 24, 256, longest, C24_SPEC_S, C24_PLAIN_S, C24_CATCH_UP_S)
    assert flips == [] and (tokens / seconds) / (24 / C24_PLAIN_S) >= 0.97, (flips, tokens / seconds)


def test_24_mixed_clients_entered_in_speculation_go_plain() -> None:
    """Entered with speculation on (as the run had it, the 8-long phase held speculative): the prior wants plain at
    the longest request's context and flips it off after the confirmation, never back on."""
    state = attrs.evolve(replay(C24_MIXED), incumbent=1, flip_step=C8_FLIP_STEP, want_since=None)
    tokens, seconds, flips = run_phase(state, True, 24, 256, 2750.0, C24_SPEC_S, C24_PLAIN_S, C24_CATCH_UP_S)
    assert flips == ["flip_off:prior"], flips
    assert (tokens / seconds) / (24 / C24_PLAIN_S) >= 0.95, tokens / seconds  # 0.96x: the confirmation's steps


def test_at_short_contexts_the_same_learner_still_weighs_speculation_at_24() -> None:
    """The control: the same state at 24 requests of short prompts does not run plain on the prior (the rule reads
    the context): both modes are known there, within a few per cent (the run's probe ground)."""
    state = attrs.evolve(replay(C24_MIXED), incumbent=ap.PLAIN, flip_step=C8_FLIP_STEP + 260, want_since=None)
    d = ap.decide(state, False, 24, 24, CAP, context=100.0)
    assert d.reason != "prior" and d.spec_value is not None and d.plain_value is not None, d


# --- accept_shift: predictable requests return at 2 clients (predictable_again) --------------------------------------

# the phase's first scheduling point came at 260.360 s (learner step 5,256): plain since a recheck's end at step 5,114
# (speculation at accept 1.0), the accept length learned 1.0, its peak 2.0. Measured there: plain decoding 4.47 ms a
# step, speculation at accept 2.0 5.80 ms, a recheck's catch-up 11.7 ms; each wave 2 requests of 128 tokens (the first
# from the prefill). The run rechecked at step 5,390, 134 steps into the phase (its previous recheck: step 5,091):
# the first wave ran plain, 0.934x always on over the phase
PREDICTABLE_AGAIN, PA_FLIP_STEP = 260.360, 5114
PA_PLAIN_S, PA_SPEC_S, PA_CATCH_UP_S, PA_WAVES = 0.0358 / 8, 0.0464 / 8, 0.0117, 8


def predictable_again(state: ap.AutoState, coverage: float | None = None) -> tuple[float, list[tuple[int, str]]]:
    """The phase closed-loop from `state`: waves of 2 requests (the trace's scheduling points: idle, 1 waiting, then
    both running), 127 decode tokens each, every step at its mode's measured seconds (speculation drafts at 2.0 again),
    fed in windows of 8, each decision given its requests' arrivals; `coverage`: each step's draft-vocabulary
    coverage (None: no signal). (decode and catch-up seconds, [(the phase's step, action:reason)])."""
    spec_on, seconds, step, flips = False, 0.0, 0, []
    pending: list[ap.Observation] = []
    for _ in range(PA_WAVES):
        arrivals = (state.step,) * 2  # as the switch stamps them: the learner step each was first seen at
        for running, waiting in ((0, 0), (0, 1)):
            state = ap.commit(state, ap.decide(state, spec_on, running + waiting, running, CAP, context=159.0,
                                               arrivals=arrivals[:waiting]))
        made = 0
        while made < 127:
            context = 32.0 + made
            d = ap.decide(state, spec_on, 2, 2, CAP, context=context, arrivals=arrivals)
            if d.action is not None:
                flips.append((step, f"{d.action}:{d.reason}"))
                spec_on = d.action == ap.FLIP_ON
                seconds += PA_CATCH_UP_S if spec_on else 0.0
                if spec_on:
                    state = ap.observe_catch_up(state, int(2 * context), PA_CATCH_UP_S)
            state = ap.commit(state, d)
            s, tokens = (PA_SPEC_S, 4.0) if spec_on else (PA_PLAIN_S, 2.0)
            made, seconds, step = made + int(tokens // 2), seconds + s, step + 1
            pending.append(ap.Observation(spec_on, 2, tokens, s, context=context, coverage=coverage))
            if len(pending) == 8:
                for obs in pending:
                    state = ap.observe(state, obs)
                pending = []
    return seconds, flips


# accept_shift's unpredictable phase: from its first window (the one ending at 255.496 s drafted at 1.75, the phase's
# first steps among the predictable phase's last) to predictable_again's first point
PA_UNPREDICTABLE = [(255.5, PREDICTABLE_AGAIN)]


def at_predictable_again(coverage: bool = False) -> ap.AutoState:
    """The learner at predictable_again's first point; `coverage`: with the draft-vocabulary coverage the trace's
    requests had (`phase_coverage`), as a switch that counts it would have seen it."""
    state = replay_windows(WINDOWS, CATCH_UPS, PREDICTABLE_AGAIN,
                           coverage=phase_coverage(PA_UNPREDICTABLE) if coverage else None)
    return attrs.evolve(state, incumbent=ap.PLAIN, flip_step=PA_FLIP_STEP, want_since=None)


def test_predictable_requests_returning_are_rechecked_and_kept() -> None:
    """Plain held at accept 1.0 rechecks speculation within its bounded period (the recheck's estimated loss over 3 %
    of the time: about 150-300 steps here), finds the traffic drafting at 2.0 again, and keeps speculation for the
    rest of the phase (one flip, no flip back)."""
    _seconds, flips = predictable_again(at_predictable_again())
    assert [f for _s, f in flips] == ["flip_on:recheck"], flips
    assert flips[0][0] <= 300, flips


def test_predictable_again_runs_within_3_percent_of_always_on() -> None:
    """Issue 52's target in the phase: at least 0.97x always on's decode seconds (the run: 0.934x), with the draft
    vocabulary's coverage of the committed tokens (the counter draft's 1,024 ids: 0 through the unpredictable phase,
    1 once predictable requests return): the coverage's bound on the accept length rises in the phase's first window
    and the recheck is due from then (`_recheck_due` (a)), kept: 48 steps in, 0.971x, where the dwell allows it (this
    harness commits the decision of the point with 1 waiting, a first-visit probe of speculation at batch 1, without
    performing it, which restarts the dwell; with the dwell run out a recheck is due at the first window's end:
    `test_the_coverage_makes_a_recheck_due_at_the_first_window`). (A strict xfail until the coverage signal: below.)"""
    seconds, flips = predictable_again(at_predictable_again(coverage=True), coverage=1.0)
    assert [f for _s, f in flips] == ["flip_on:recheck"] and flips[0][0] <= 48, flips
    always_on = PA_WAVES * 64 * PA_SPEC_S
    assert always_on / seconds >= 0.97, always_on / seconds


def test_the_coverage_makes_a_recheck_due_at_the_first_window() -> None:
    """From the same state, plain held past its dwell: one window (8 steps) of predictable requests' tokens, all in
    the draft's vocabulary, lifts the coverage from 0 to 0.66 (its bound on the accept length 2.9, above the peak of
    2.0 and a clear win above the 1.0 measured at coverage 0): a recheck is due now, borrowing the budget (the steps
    it owes: its price less the 142 + 8 steps since speculation last drafted); without the signal it is not."""
    for coverage, due in ((1.0, True), (None, False)):
        state = at_predictable_again(coverage=coverage is not None)
        for i in range(8):
            state = ap.observe(state, ap.Observation(False, 2, 2.0, PA_PLAIN_S, context=40.0 + i, coverage=coverage))
        d = ap.decide(state, False, 2, 2, CAP, context=48.0, arrivals=(state.step - 8,) * 2)
        assert (d.action, d.reason) == ((ap.FLIP_ON, "recheck") if due else (None, "measured")), d
        assert not due or d.recheck_debt > 0, d


def test_without_the_coverage_signal_the_return_waits_for_the_recheck_budget() -> None:
    """The same phase with no coverage signal (a draft with the target's whole vocabulary): plain held at accept 1.0
    sees the returning requests only at its next recheck, whose period the budget (`recheck_fraction`, 3 %) bounds;
    from this state (886650f's mid-wave recheck 142 steps before) it comes 176 steps in, 0.913x always on's decode
    seconds (the run: 134 steps, 0.934x); this was the strict xfail for 0.97x."""
    seconds, flips = predictable_again(at_predictable_again())
    assert flips[:1] == [(176, "flip_on:recheck")], flips
    assert 0.90 < PA_WAVES * 64 * PA_SPEC_S / seconds < 0.92, seconds


# --- bursty_contrast: 2 clients quiet, 192 in a burst, twice per round --------------------------------------------

# each burst's start (seconds since the trace's first record) and its prefills as the trace had them, speculation on
# (held on the numbers in the quiet phase before): round 1's first and second burst, round 2's second. The run flipped
# plain on at each burst's first scheduling point, a probe that happened to be due there
BURST_STARTS = [(137.434, [3, 15, 18, 13, 6, 12, 10, 9, 19, 26, 25, 36]),
                (141.863, [1, 22, 24, 23, 19, 32, 24, 41, 6]),
                (305.601, [4, 19, 23, 21, 22, 34, 36, 33])]
# the burst's plain step at 192 requests (the run's windows there)
BURST_PLAIN_S = 0.0614 / 8


@pytest.mark.parametrize("credit", [None, 0.0])
@pytest.mark.parametrize(("start", "prefills"), BURST_STARTS)
def test_a_burst_runs_plain(start: float, prefills: list[int], credit: float | None) -> None:
    """Each scheduling point of the burst's ramp (requests running, the next prefill waiting): plain decoding is on
    before the demand passes twice the cap, and stays on through 64 decode steps of the 192 (always on took 2.3x
    plain's phase time). With the probe budget spent (credit 0), the prior flips it off on its own, no later than at
    the first point past the cap."""
    state = replay(start)
    state = state if credit is None else attrs.evolve(state, credit=credit)
    spec_on, running = True, 0
    for waiting in prefills:
        d = ap.decide(state, spec_on, running + waiting, running, CAP, context=40.0)
        spec_on = spec_on if d.action is None else d.action == ap.FLIP_ON
        state = ap.commit(state, d)
        running += waiting
        assert not spec_on or running + waiting <= 2 * CAP, (running, waiting, d)
    pending = []
    for step in range(64):
        d = ap.decide(state, spec_on, running, running, CAP, context=40.0 + step)
        assert d.action is None and not spec_on, d
        state = ap.commit(state, d)
        pending.append(ap.Observation(False, running, float(running), BURST_PLAIN_S, context=40.0 + step))
        if len(pending) == 8:
            for obs in pending:
                state = ap.observe(state, obs)
            pending = []


# each burst's end before a quiet phase: (the quiet phase's first scheduling point, s; the learner step of the burst's
# flip off). The run flipped speculation on 15 and 23 steps into the quiet phase, with its 2 requests running (the
# hold: the burst's 192), the quiet phase's p99 1.029x and 1.062x always on's
BURST_ENDS = [(138.667, 1689), (302.417, 6343)]
QUIET_PLAIN_S = 0.0357 / 8


def steps_to_flip_on(state: ap.AutoState, limit: int = 64) -> int | None:
    """The plain steps of this run's quiet phase before speculation comes on (tests/auto_quiet_phase.py)."""
    return auto_quiet_phase.steps_to_flip_on(state, QUIET_PLAIN_S, CAP, limit)


@pytest.mark.parametrize(("end", "flip_step"), BURST_ENDS)
def test_the_quiet_phase_after_a_burst_speculates_within_a_window(end: float, flip_step: int) -> None:
    """The quiet phase (always on 1.5x plain there): the hold ends once the demand settled (`calm_points`), and
    speculation comes on after 4 plain steps; with the hold by its steps alone (calm_points 0), as the run had it,
    after 24."""
    state = replay(end)
    state = attrs.evolve(state, incumbent=ap.PLAIN, flip_step=flip_step, want_since=None, peak=192,
                         peak_step=state.step, last_demand=192, calm=0)
    steps = steps_to_flip_on(state)
    assert steps is not None and steps <= 8, steps
    held = steps_to_flip_on(attrs.evolve(state, params=ap.AutoParams(calm_points=0)))
    assert held is not None and held >= 15, held
