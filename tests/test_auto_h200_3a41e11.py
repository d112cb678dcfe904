"""Held out: the auto learner fed the decode-step windows an H200 measured (2026-12-06; the wheel built from 3a41e11,
the code that ran main 0943833's, which the servers imported from the carried working tree; the 8B-class pair,
TP 1, SGLang 0.5.16, one NVIDIA H200; plain, always on, SGLang's adaptive switch, `auto` and `auto` + guard side by
side, one round per trace: context, accept_shift, bursty_contrast, in that order, after the
warm-ups at 1, 32 and 128 short-prompt clients). bench/gpu/results/2026-12-06_3a41e11_h200/traces.tar.gz,
tr/auto/switch-1023.jsonl (the auto server's scheduler; switch-709.jsonl is its other process's, one config line):
each `auto_observe` window in the replays' form (tests/test_auto_h200_shifts.py `extract_windows`, segments split
where the windows pause over 20 s: 0 the warm-ups, 1 context, 2 accept_shift, 3 bursty_contrast) is in
tests/data/h200_auto_windows_3a41e11.json; the catch-ups the windows carry are fed too (`observe_catch_up`).

What that run showed (run.log): auto 0.855x the per-phase best over the context trace: c2_short 0.934, c2_long 0.911,
c8_long 0.738, c24_mixed 0.783; in each long phase speculation ran throughout (auto's seconds equal always on's)
where plain decoding was faster on this card. The trace says why: plain decoding was never run near the long phases'
2,000-3,500 tokens, so nothing measured it faster there, and no probe of it ran. Every condition of `decide`'s probe
held from the 2-long phase's second wave on (speculation measured at that context, dwell 212 steps and more, the load
the demand, plain unknown there: `_stale`) but one: the probe budget. The run's probes (decisions "probe": learner
steps 13, 602, 687, 875, 1,215) had spent it at short prompts, 0.1 steps of credit left at step 1,215, earning 0.02 a
step: 4.9 at the 2-long phase's second wave (step 1,458), 15.1 at the 8-long phase's second (1,970), 17.7 at the
24-mixed phase's second (2,096), a probe needing 24. (`decide` is called at every scheduling point, mid-wave too; the
trace records a decision only where it differs from the one before, so each wave shows one `prior`.)

The plain server ran these phases (it has no switch trace): its SGLang decode-log lines (tr/plain/server.log,
`Decode batch ... gen throughput`, the lines of a wave after its first, which holds the prefill): 351-364 tok/s at 2
long requests, 1,339-1,359 at 8, 4,108-4,295 at 24 mixed, 1,720-1,757 at 8 short; so plain decoding's steps below
(5.56, 5.93, 5.71 and 4.60 ms). Speculation's are the auto server's windows of those phases (mean seconds per step)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import attrs
import pytest

from statemodel import auto_policy as ap

h200 = importlib.import_module("test_auto_h200_shifts")

TARBALL, MEMBER = "bench/gpu/results/2026-12-06_3a41e11_h200/traces.tar.gz", "tr/auto/switch-1023.jsonl"
WINDOWS = json.loads((Path(__file__).parent / "data" / "h200_auto_windows_3a41e11.json").read_text())
CAP = 48
# the catch-ups the switch trace recorded (seconds since its first record, tokens re-prefilled, seconds)
CATCH_UPS = [(138.759, 85, 0.015966), (153.787, 340, 0.013655), (154.497, 3232, 0.038353), (217.352, 222, 0.019724),
             (285.573, 122, 0.024094), (290.212, 248, 0.020362), (291.945, 186, 0.022305), (347.29, 128, 0.020472),
             (354.507, 234, 0.023432)]
# the learner steps of the run's probes (its `auto_decide` records with reason "probe")
PROBES = [13, 602, 687, 875, 1215, 2419, 4335, 5398]
# c2_long's first scheduling point (218.277 s, learner step 1,395): speculation on since the c2_short probe's return
# (a flip on at step 1,246), the incumbent
C2_LONG, C2_FLIP_STEP = 218.277, 1246


def test_the_windows_catch_ups_and_probes_are_the_switch_trace() -> None:
    """The replayed windows, catch-ups and probes are what the run's switch trace recorded (the H200 file's
    extractor)."""
    lines = h200._trace(TARBALL, MEMBER)
    assert h200.extract_windows(lines, 20.0) == WINDOWS
    assert h200.extract_catch_ups(lines) == CATCH_UPS
    records = [json.loads(line) for line in lines]
    assert [r["learner_step"] for r in records if r.get("action") == "auto_decide" and r["reason"] == "probe"] \
        == PROBES


def run_credit(step: int) -> float:
    """The probe budget the run's learner held at learner step `step`: its start credit, `explore_fraction` a step
    (capped at `probe_credit` probes), less `probe_steps` at each of the run's probes (`observe`, `commit`)."""
    p = ap.AutoParams()
    cap, credit, at = float(p.probe_credit * p.probe_steps), float(p.probe_credit * p.probe_steps), 0
    for probe in [s for s in PROBES if s < step] + [step]:
        for _ in range(probe - at):
            credit = min(cap, credit + p.explore_fraction)
        at = probe
        credit -= p.probe_steps if probe != step else 0
    return credit


def at_c2_long() -> ap.AutoState:
    """The learner at c2_long's first scheduling point as the run had it: the replayed estimates, speculation the
    incumbent since step 1,246, the run's probe budget, the hold at c2_short's 2."""
    state = h200.replay_windows(WINDOWS, CATCH_UPS, C2_LONG)
    assert state.step == 1395
    return attrs.evolve(state, incumbent=1, flip_step=C2_FLIP_STEP, want_since=None, probes=5,
                        credit=run_credit(state.step), peak=2, peak_step=state.step, last_demand=2, calm=0)


# the context trace's phases from c2_long on: (name, clients, waves' longest request at their first decode step (the
# windows'), speculation's seconds a step (its windows' mean there), plain decoding's (the plain server's decode log))
PHASES = [("c2_long", 2, (3000.0, 2574.0, 2959.0, 3221.0), 0.0978 / 8, 2 / 360.0),
          ("c8_short", 8, (32.0, 32.0, 32.0), 0.0520 / 8, 8 / 1740.0),
          ("c8_long", 8, (3386.0, 3155.0), 0.1495 / 8, 8 / 1350.0),
          ("c24_mixed", 24, (2386.0, 3148.0), 0.1190 / 8, 24 / 4200.0)]
LENGTH = 127  # decode tokens a request (128 out, the first from its prefill)


def catch_up_s(tokens: float) -> float:
    """A flip-on's catch-up with requests running: the line through this run's largest (3,232 tokens, 38 ms) and
    the 886650f H200 run's (9,874 tokens, 0.244 s; tests/test_auto_h200_shifts.py)."""
    return 0.038353 + (tokens - 3232) * (0.243786 - 0.038353) / (9874 - 3232)


def run_phase(state: ap.AutoState, spec_on: bool, batch: int, waves: tuple[float, ...], spec_s: float,
              plain_s: float) -> tuple[ap.AutoState, bool, float, list[tuple[int, str]]]:
    """One phase closed-loop: each wave `batch` requests of `LENGTH` decode tokens (its scheduling points first: idle,
    then all waiting with nothing running), every step at its mode's seconds (speculation drafting 2.0), a flip-on
    with requests running paying their catch-up; observed in windows of 8 as the switch does (a step's seconds only
    where the next step runs in the same mode with no flip or idle between). (state, spec_on, seconds, flips)."""
    seconds, step, flips = 0.0, 0, []
    pending: list[ap.Observation] = []
    window = 0
    for longest in waves:
        last: ap.Observation | None = None
        for running, waiting in ((0, 0), (0, batch)):
            d = ap.decide(state, spec_on, running + waiting, running, CAP, context=longest if waiting else None)
            if d.action is not None:
                flips.append((step, f"{d.action}:{d.reason}"))
                spec_on = d.action == ap.FLIP_ON
            state = ap.commit(state, d)
        made = 0
        while made < LENGTH:
            context = longest + made
            d = ap.decide(state, spec_on, batch, batch, CAP, context=context)
            if d.action is not None:
                flips.append((step, f"{d.action}:{d.reason}"))
                spec_on = d.action == ap.FLIP_ON
                if spec_on:
                    cost = catch_up_s(batch * context)
                    seconds += cost
                    state = ap.observe_catch_up(state, int(batch * context), cost)
            if last is not None and d.action is None:
                pending.append(last)
            state = ap.commit(state, d)
            s, tokens = (spec_s, 2.0 * batch) if spec_on else (plain_s, float(batch))
            made, seconds, step = made + int(tokens // batch), seconds + s, step + 1
            last, window = ap.Observation(spec_on, batch, tokens, s, context=context), window + 1
            if window == 8:
                for obs in pending:
                    state = ap.observe(state, obs)
                pending, window = [], 0
    return state, spec_on, seconds, flips


def the_context_trace() -> dict[str, tuple[float, list[tuple[int, str]]]]:
    """Per phase from c2_long on: auto's seconds over the per-phase best's (the faster of all-plain and
    all-speculative decoding, the same steps), and its flips."""
    state, spec_on, out = at_c2_long(), True, {}
    for name, batch, waves, spec_s, plain_s in PHASES:
        state, spec_on, seconds, flips = run_phase(state, spec_on, batch, waves, spec_s, plain_s)
        best = len(waves) * min(-(-LENGTH // 2) * spec_s, LENGTH * plain_s)
        out[name] = (best / seconds, flips)
    return out


def test_the_run_had_no_credit_for_a_probe_at_the_long_phases() -> None:
    """The diagnosis: at each long phase's second wave (speculation measured there by then) the run's budget held
    less than one probe's steps, and every other condition of the probe held."""
    p = ap.AutoParams()
    assert [round(run_credit(s), 1) for s in (1215 + 1, 1458, 1970, 2096)] == [0.1, 4.9, 15.1, 17.7]
    assert all(run_credit(s) < p.probe_steps for s in (1458, 1970, 2096))
    # the 2-long phase's second wave (219.240 s, step 1,458), its first scheduling point (nothing running, 2 waiting,
    # the longest 2,562 tokens): the run decided "prior" (speculation 295 tok/s, plain None); with a probe's credit the
    # same state probes plain decoding, with the run's the old price (`probe_steps`) does not
    state = attrs.evolve(h200.replay_windows(WINDOWS, CATCH_UPS, 219.240), incumbent=1, flip_step=C2_FLIP_STEP,
                         want_since=None, probes=5, peak=2, last_demand=2)
    state = attrs.evolve(state, peak_step=state.step)
    assert state.step == 1458
    d = ap.decide(attrs.evolve(state, credit=float(p.probe_steps)), True, 2, 0, CAP, context=2562.0)
    assert (d.action, d.reason, d.plain_value) == (ap.FLIP_OFF, "probe", None) and d.spec_value is not None, d
    assert ap._probe_price(state, 1, ap.PLAIN, 2, 0, CAP, 2562.0) < run_credit(1458) < p.probe_steps


def test_c2_long_first_visits_plain_decoding_on_a_borrowed_budget() -> None:
    """From the run's state, speculation measured at the 2-long contexts after the first wave's first windows,
    plain decoding never run near them: the probe of plain goes ahead with 5 steps of credit (a first visit that
    retracts nothing borrows against the budget: `_probe_price`), and plain, 10 % faster there, stays."""
    state = at_c2_long()
    state, spec_on, _seconds, flips = run_phase(state, True, *PHASES[0][1:])
    assert flips[:1] == [(flips[0][0], "flip_off:probe")] and not spec_on, flips
    assert state.credit < 0 and state.probes == 6, state.credit


def test_the_context_trace_within_3_percent_of_the_per_phase_best() -> None:
    """The run's long phases from c2_long on, closed-loop from the run's state: every phase at least 0.97x the
    per-phase best (the run: c2_long 0.911, c8_short 1.004, c8_long 0.738, c24_mixed 0.783, prefills included);
    plain decoding probed once at 2 long requests, then the prior runs plain at 8 and 24 (`_outgrown`) from their
    first scheduling point, nothing running (`_refresh_first` asks a re-measure of an estimate that exists only), and
    speculation comes back for the 8 short ones."""
    out = the_context_trace()
    assert all(ratio >= 0.97 for ratio, _ in out.values()), out
    assert [f for _, f in out["c2_long"][1]] == ["flip_off:probe"], out  # within the first wave
    assert out["c8_long"][1] == [(0, "flip_off:prior")] and out["c24_mixed"][1] == [], out  # at once, nothing running
    assert [f for _, f in out["c8_short"][1]][0] == "flip_on:measured", out


@pytest.mark.parametrize("credit", [0.1, 96.0])
def test_a_stale_estimate_still_waits_for_the_budget(credit: float) -> None:
    """Only a first visit borrows: plain decoding at 2 short requests, measured by c2_short's probe but now older
    than `stale_behind_after` (speculation fresh there, a clear win ahead of it), is re-probed only with a probe's steps
    of credit."""
    state = at_c2_long()
    step = state.step + ap.AutoParams().stale_behind_after + 100
    fresh = tuple((k, attrs.evolve(e, updated=step) if k[0] == 1 else e) for k, e in state.estimates)
    state = attrs.evolve(state, estimates=fresh, step=step, flip_step=step - 100, credit=credit, peak_step=step)
    d = ap.decide(state, True, 2, 2, CAP, context=100.0)
    assert d.plain_value is not None and d.spec_value is not None, d
    assert (d.action == ap.FLIP_OFF and d.reason == "probe") == (credit >= ap.AutoParams().probe_steps), d


@pytest.mark.parametrize(("running", "credit", "probes"), [(32, 5.0, False), (0, 5.0, True), (32, 24.0, True)])
def test_a_first_visit_borrows_only_where_its_entry_retracts_nothing(running: int, credit: float,
                                                                     probes: bool) -> None:
    """Speculation never run at 32 requests (measured at 24 and 48: an interpolated value there), plain decoding
    measured at 32 and ahead by the margin (the 8B reference table: tests/test_auto_phase_start.py): a probe of
    speculation from plain with the 32 requests running would re-prefill them (its catch-up), so it waits for a
    probe's steps of credit; at the wave's start, nothing running, it borrows."""
    phase_start = importlib.import_module("test_auto_phase_start")
    state = ap.initial_state()
    for spec_on, batch in ((True, 24), (True, 48), (False, 32)):
        state = phase_start.run_steps(state, spec_on, batch, 24)
    state = attrs.evolve(state, incumbent=ap.PLAIN, flip_step=state.step - 100, want_since=None, credit=credit,
                         peak=32, peak_step=state.step)
    d = ap.decide(state, False, 32, running, CAP)
    assert d.plain_value is not None and d.spec_value is not None and d.plain_value > d.spec_value * 1.03, d
    assert (d.action == ap.FLIP_ON and d.reason == "probe") == probes, d


def test_plain_a_clear_win_behind_fresh_speculation_waits_longer_for_its_probe() -> None:
    """The run's probes of plain at learner steps 2,419 (accept_shift's predictable phase), 4,335 (bursty_contrast's
    quiet phase, its first scheduling point) and 5,398 each visited plain decoding at 1-2 short requests where
    speculation, running and measured there, led plain's stale estimate by 48-55 % (e.g. 666 against 455 tok/s): 24
    plain steps and a catch-up back for a number a budget period does not move. Plain's estimate, a clear win behind,
    is probed again only after `stale_behind_after` steps; the same state with the lead under `clear_win`, or with
    plain's estimate older than that, is probed."""
    lines = h200._trace(TARBALL, MEMBER)
    records = [json.loads(line) for line in lines]
    t0 = records[0]["t"]
    for r in [r for r in records if r.get("action") == "auto_decide" and r["reason"] == "probe"
              and r["learner_step"] in (2419, 4335, 5398)]:
        state = h200.settled_speculating(h200.replay_windows(WINDOWS, CATCH_UPS, r["t"] - t0), r["demand"])
        d = ap.decide(state, True, r["demand"], r["running"], CAP, context=r["context"])
        assert d.action is None and d.reason == "measured", (r["learner_step"], d)
        assert d.spec_value >= d.plain_value * (1 + state.params.clear_win), d
        # the run's learner (every stale estimate probed after `stale_after`) probed here
        then = attrs.evolve(state, params=attrs.evolve(state.params, stale_behind_after=0))
        assert ap.decide(then, True, r["demand"], r["running"], CAP, context=r["context"]).reason == "probe"
        # a lead under the clear win: probed at `stale_after`
        close = attrs.evolve(state, params=attrs.evolve(state.params, clear_win=d.spec_value / d.plain_value - 0.99))
        assert ap.decide(close, True, r["demand"], r["running"], CAP, context=r["context"]).reason == "probe"
        # plain's estimate older than `stale_behind_after`: probed
        old = attrs.evolve(state, step=state.step + state.params.stale_behind_after, flip_step=state.step - 300
                           + state.params.stale_behind_after, peak_step=state.step + state.params.stale_behind_after)
        fresh = tuple((k, attrs.evolve(e, updated=old.step) if k[0] == 1 else e) for k, e in old.estimates)
        assert ap.decide(attrs.evolve(old, estimates=fresh), True, r["demand"], r["running"], CAP,
                         context=r["context"]).reason == "probe"
