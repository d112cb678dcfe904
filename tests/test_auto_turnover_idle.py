"""A quiet phase after a burst is valued at its own demand where the server stood idle far longer than a closed loop's
turnovers (issue 52's p99 target; statemodel.auto_policy `_phase_change`, `observe_idle`, `commit`).

The cause, from the H100 run of 2026-12-07 (main 001f95e; the 8B-class pair, TP 1, SGLang 0.5.16;
`bench/gpu/p99_account.py bench/gpu/results/2026-12-07_001f95e_h100`): bursty_contrast's quiet phase after its burst of
192 had a p99 1.053x and 1.100x always on's. Its first request came 56.5 and 73.3 ms after the burst's last one
finished, inside the demand hold (16 steps at 8.5 ms), so it was valued at 192 and prefilled plain, and speculation came
on with 2 running (5.7 ms and a 10-23 ms catch-up onto requests of 0.5 s). Each closed-loop turnover of that run (2
clients: the server empties and their next requests come) idled 5.5-7.5 ms, and the burst's first requests came 7.3 ms
after the quiet phase's last."""

from __future__ import annotations

import importlib

import attrs
import pytest

from statemodel import auto_policy as ap

phase_start = importlib.import_module("test_auto_phase_start")
h200 = importlib.import_module("test_auto_h200_shifts")

CAP = 48
TURNOVER_S = 0.0072  # the run's 2-client turnovers: 5.5-7.5 ms idle
QUIET_STARTS_S = [0.0565, 0.0733]  # its quiet phases' first requests after the burst of 192
# a wave of 192 coming back, as the H100 traces' prefills had it (docs/auto-switch.md, `calm_points`)
RAMP = [1, 2, 2, 14, 22, 25, 36, 40, 50]
CONTEXT = 40.0  # the reference learner's steps: short prompts


def two_client_waves(state: ap.AutoState, waves: int, idle_s: float, spec_on: bool) -> ap.AutoState:
    """`waves` turnovers of a closed loop of 2 clients: the server idles `idle_s`, the first request arrives, then
    the second while the first is admitted, then 16 decode steps of both (the reference table's seconds)."""
    for _ in range(waves):
        state = ap.commit(state, ap.decide(state, spec_on, 0, 0, CAP))  # the emptied server's idle iteration
        state = ap.observe_idle(state, idle_s, CAP)
        for running, waiting in ((0, 1), (1, 1)):
            d = ap.decide(state, spec_on, running + waiting, running, CAP)
            assert d.action is None, d
            state = ap.commit(state, d)
        for _step in range(16):
            state = ap.commit(state, ap.decide(state, spec_on, 2, 2, CAP))
            state = run_steps(state, spec_on, 2, 1)
    return state


def speculating(params: ap.AutoParams | None = None) -> ap.AutoState:
    """The reference learner (tests/test_auto_phase_start.py), both modes measured at 1, 2, 8 and 128 requests of
    40-token contexts (short prompts), speculation on and held, its dwell served."""
    state = phase_start.measured((1, 2, 8, 128), params, CONTEXT)
    return attrs.evolve(state, incumbent=1, flip_step=state.step - 300)


def run_steps(state: ap.AutoState, spec_on: bool, batch: int, steps: int) -> ap.AutoState:
    return phase_start.run_steps(state, spec_on, batch, steps, CONTEXT)


def after_a_burst(params: ap.AutoParams | None = None, turnovers: int = 3) -> ap.AutoState:
    """`speculating()` through `turnovers` waves of 2 clients, then a burst of 192 arriving at once (plain, flipped
    off with nothing running) and 120 of its decode steps: the hold's peak 192, the server emptied."""
    state = two_client_waves(speculating(params), turnovers, TURNOVER_S, True)
    state = ap.commit(state, ap.decide(state, True, 0, 0, CAP))
    state = ap.observe_idle(state, TURNOVER_S, CAP)
    d = ap.decide(state, True, 192, 0, CAP)
    assert (d.action, d.load) == (ap.FLIP_OFF, 192), d
    state = ap.commit(state, d)
    for _step in range(120):
        state = ap.commit(state, ap.decide(state, False, 192, 192, CAP))
        state = run_steps(state, False, 192, 1)
    return ap.commit(state, ap.decide(state, False, 0, 0, CAP))


def first_quiet_decision(state: ap.AutoState, idle_s: float, context: float | None = None) -> ap.Decision:
    return ap.decide(ap.observe_idle(state, idle_s, CAP), False, 1, 0, CAP, context=context)


def test_the_turnovers_idle_time_is_learned() -> None:
    """Each 2-client wave's stretch comes back to the hold's peak (2): the longest is kept; the burst's start, its
    demand past the peak, is one too."""
    state = after_a_burst()
    assert state.turnover_idle() == TURNOVER_S and state.idle is None
    waves = two_client_waves(speculating(), 2, TURNOVER_S, True)
    assert two_client_waves(waves, 1, 0.009, True).turnover_idle() == 0.009
    assert two_client_waves(waves, 1, 0.005, True).turnover_idle() == TURNOVER_S


@pytest.mark.parametrize("idle_s", QUIET_STARTS_S)
def test_a_quiet_phase_after_a_burst_speculates_from_its_first_request(idle_s: float) -> None:
    """The run's stretches (7.8x and 10.2x its turnovers'): the first request is valued at its own demand, and
    speculation comes on with nothing running; the hold ends there, so the second request's point keeps it. Without
    the rule (`turnover_idle_factor` 0, as the run had it): the prior at the burst's 192, plain, as the run decided."""
    state = after_a_burst()
    d = first_quiet_decision(state, idle_s)
    assert (d.action, d.load, d.running) == (ap.FLIP_ON, 1, 0), d
    state = ap.commit(ap.observe_idle(state, idle_s, CAP), d)
    assert state.peak == 1
    second = ap.decide(state, True, 2, 1, CAP)
    assert (second.action, second.load) == (None, 2), second
    as_run = first_quiet_decision(after_a_burst(ap.AutoParams(turnover_idle_factor=0.0)), idle_s)
    assert (as_run.action, as_run.load) == (None, 192), as_run


def test_the_hold_stands_where_the_stretch_is_not_far_past_the_turnovers() -> None:
    """Twice the longest turnover or less (a turnover that idled longer than the ones before it), no turnover seen
    yet (the rule learns from the traffic; the hold ages by its steps alone), or a held peak within speculation's cap
    (a wave speculation could serve): the first request is valued at the held 192 (or the held 32), as before."""
    state = after_a_burst()
    assert first_quiet_decision(state, 2 * TURNOVER_S).load == 192
    assert first_quiet_decision(state, 2.01 * TURNOVER_S).load == 1
    unseen = attrs.evolve(state, turnover_idles=())
    assert first_quiet_decision(unseen, QUIET_STARTS_S[0]).load == 192
    at_32 = attrs.evolve(state, peak=32)
    assert first_quiet_decision(at_32, QUIET_STARTS_S[0]).load == 32


def test_the_hold_stands_where_neither_mode_ran_at_the_arriving_context() -> None:
    """A request of 3,100 tokens where neither mode has run at that context (the mixed trace's long prompts the draft
    could not predict, after a burst: the hold's plain steps measure it before the prior would guess): held."""
    state = after_a_burst()
    assert first_quiet_decision(state, QUIET_STARTS_S[0], context=40.0).load == 1
    d = first_quiet_decision(state, QUIET_STARTS_S[0], context=3100.0)
    assert d.load == 192, d


def test_a_turnover_taken_for_a_phase_change_costs_one_flip_and_is_learned() -> None:
    """A wave of 192 whose first request came after a stretch past twice the turnovers (a client that paused): the
    hold yields and speculation comes on with nothing running; the wave's prefills (the H100's ramp) turn plain back
    on at the first point past the cap, its first requests running (no dwell: they would wait behind the cap), and
    no flip after; the stretch is learned as a turnover's, so the next one as long keeps the hold."""
    state = after_a_burst()
    idle_s = QUIET_STARTS_S[0]
    state = ap.observe_idle(state, idle_s, CAP)
    spec_on, running, flips = False, 0, []
    for waiting in RAMP:
        d = ap.decide(state, spec_on, running + waiting, running, CAP)
        state = ap.commit(state, d)
        if d.action is not None:
            flips.append((d.action, running + waiting))
            spec_on = d.action == ap.FLIP_ON
        running += waiting
    assert flips == [(ap.FLIP_ON, 1), (ap.FLIP_OFF, 66)], flips  # 66: the first demand past the cap (1 + ... + 25)
    for _ in range(2):
        state = ap.commit(state, ap.decide(state, False, 192, running, CAP))
    state = ap.commit(state, ap.decide(state, False, 192, 192, CAP))
    assert state.turnover_idle() == idle_s and state.idle is None
    state = ap.commit(state, ap.decide(state, False, 0, 0, CAP))
    assert first_quiet_decision(state, idle_s).load == 192


def test_a_phase_start_that_settles_is_not_learned_as_a_turnover() -> None:
    """The quiet phase with the hold standing (a stretch within twice the turnovers): its 2 requests settle
    (`calm_points`), the hold ends, and the stretch is dropped, not learned."""
    state = ap.observe_idle(after_a_burst(), 0.012, CAP)
    assert state.idle == ap.IdleStretch(0.012, 192)
    for running, waiting in ((0, 1), (1, 1)):
        state = ap.commit(state, ap.decide(state, False, running + waiting, running, CAP))
    for _step in range(6):
        state = ap.commit(state, ap.decide(state, False, 2, 2, CAP))
        state = run_steps(state, False, 2, 1)
    assert state.idle is None and state.turnover_idle() == TURNOVER_S


# --- the H100 runs' own windows ------------------------------------------------------------------------------------

BEFORE = "bench/gpu/results/2026-12-07_001f95e_h100/traces.tar.gz", "tr/auto/switch-953.jsonl"
AFTER = "bench/gpu/results/2026-12-07_a197508_h100/traces.tar.gz", "tr/auto/switch-982.jsonl"
# the quiet phases after a burst of 192 (bursty_contrast, both rounds) or 128 (mixed's last): (the run, the first
# scheduling point, s since the trace's first record; the idle seconds before it (bench/gpu/p99_account.py); the
# longest turnover idle time the learner had seen (001f95e: the round's 2-client turnovers, 7.3 ms; a197508: its
# record's `turnover_idle_ms`); the burst; the load the run valued there)
QUIET_AFTER_BURST = [(BEFORE, 234.127, 0.0565, 0.0073, 192, 192), (BEFORE, 349.448, 0.0733, 0.0073, 192, 192),
                     (AFTER, 211.460, 0.0965, 0.0169, 192, 1), (AFTER, 274.966, 0.0615, 0.0184, 128, 1),
                     (AFTER, 347.330, 0.0933, 0.0184, 192, 1)]


@pytest.mark.parametrize(("run", "t", "idle_s", "turnover_s", "burst", "run_load"), QUIET_AFTER_BURST)
def test_the_runs_quiet_phases_speculate_from_their_first_request(
        run: tuple[str, str], t: float, idle_s: float, turnover_s: float, burst: int, run_load: int) -> None:
    """The learner replayed to each quiet phase (every window before it), standing as the run's server did (plain,
    the hold's peak at the burst's) with the turnovers' idle time learned: the first request (1 waiting, 32 tokens)
    is valued at 1 and speculation comes on with nothing running, as the a197508 run did (then a flip_on of 0.1 ms);
    with the rule off (`turnover_idle_factor` 0, the 001f95e run's learner), the hold's peak, plain, as that run
    decided."""
    *_rest, recs, t0 = h200.read_covered_run(*run)
    (r,) = [r for r in recs if r.get("action") == "auto_decide" and abs(r["t"] - t0 - t) < 0.001]
    assert (r["load"], r["demand"], r["running"]) == (run_load, 1, 0), r
    assert r.get("turnover_idle_ms", 1000 * turnover_s) == round(1000 * turnover_s, 1), r
    state = h200.standing_plain(h200.replay_covered_run(*run, t), r)
    state = attrs.evolve(state, peak=burst, peak_step=state.step,
                         turnover_idles=((0, turnover_s),))
    d = first_quiet_decision(state, idle_s, context=32.0)
    assert (d.action, d.load, d.running) == (ap.FLIP_ON, 1, 0), d
    old = attrs.evolve(state, params=attrs.evolve(state.params, turnover_idle_factor=0.0))
    held = first_quiet_decision(old, idle_s, context=32.0)
    assert (held.action, held.load) == (None, burst), held


# --- turnovers per context band (the H100 run of 2026-12-07, main 1009c9d) -------------------------------------------

MIXED = "bench/gpu/results/2026-12-07_1009c9d_h100/call_pa/traces.tar.gz", "tr/auto/switch-994.jsonl"
# mixed round 0's last quiet phase: its first scheduling point (s since the trace's first record), 62 ms after the
# burst of 128 (bench/gpu/p99_account.py); the turnovers the run had learned: waves of 2-192 clients of short prompts
# 22.8 ms at most (its record at 151.1 s), the burst of 64 clients of 2,000-3,500-token prompts 33.0 ms (200.7 s)
MIXED_QUIET, MIXED_IDLE_S, SHORT_TURNOVER_S, LONG_TURNOVER_S = 209.195, 0.062, 0.0228, 0.033


def test_a_long_prompt_waves_turnover_is_learned_in_its_own_band() -> None:
    """A wave held at 3,400-token contexts (band 4) that idles 33 ms and comes back is that band's turnover; the
    short waves' (band 0) stays theirs, and a band with none seen reads the longest of any."""
    state = after_a_burst()
    state = attrs.evolve(state, peak=64, peak_step=state.step, peak_context=3400.0)
    state = ap.observe_idle(state, LONG_TURNOVER_S, CAP)
    assert state.idle == ap.IdleStretch(LONG_TURNOVER_S, 64, ap.context_band(3400.0)) and state.idle.band == 4
    state = ap.commit(state, ap.decide(state, False, 64, 0, CAP, context=3400.0))
    assert state.turnover_idles == ((0, TURNOVER_S), (4, LONG_TURNOVER_S)) and state.idle is None
    assert (state.turnover_idle(0), state.turnover_idle(4), state.turnover_idle(2)) \
        == (TURNOVER_S, LONG_TURNOVER_S, LONG_TURNOVER_S)


def test_the_mixed_traces_last_quiet_phase_speculates_from_its_first_request() -> None:
    """The run's learner replayed to the last quiet phase of mixed round 0, standing as its server did (plain, the
    hold's peak the burst's 128 at 159 tokens): with the turnovers per band, the first request (62 ms after the burst,
    over twice the short waves' 22.8 ms) is valued at 1 and speculation comes on with nothing running; with one
    turnover for every band (the long-prompt wave's 33 ms, as the run had it) the hold stands at 128, plain, as the run
    decided (then speculation on with both running, 0.093 s in: p99 1.052x always on's that round)."""
    *_rest, recs, t0 = h200.read_covered_run(*MIXED)
    (r,) = [r for r in recs if r.get("action") == "auto_decide" and abs(r["t"] - t0 - MIXED_QUIET) < 0.001]
    assert (r["load"], r["demand"], r["running"], r["reason"], r["turnover_idle_ms"]) == (128, 1, 0, "prior", 33.0), r
    state = h200.standing_plain(h200.replay_covered_run(*MIXED, MIXED_QUIET), r)
    state = attrs.evolve(state, peak=128, peak_step=state.step, peak_context=159.0,
                         turnover_idles=((0, SHORT_TURNOVER_S), (4, LONG_TURNOVER_S)))
    d = first_quiet_decision(state, MIXED_IDLE_S, context=32.0)
    assert (d.action, d.load, d.running) == (ap.FLIP_ON, 1, 0), d
    one_for_all = attrs.evolve(state, turnover_idles=((0, LONG_TURNOVER_S),))
    held = first_quiet_decision(one_for_all, MIXED_IDLE_S, context=32.0)
    assert (held.action, held.load) == (None, 128), held
