"""Held out: the auto learner fed the decode-step windows an H200 measured with main 605161d (2026-12-06; the 8B-class
pair, TP 1, SGLang 0.5.16, one NVIDIA H200; plain, always on, `auto`, `auto` + guard and `auto` + guard without slot
values side by side: context and accept_shift two rounds, bursty_contrast one).
bench/gpu/results/2026-12-06_605161d_h200/traces.tar.gz, tr/auto/switch-1064.jsonl (the auto server's scheduler).

What that run showed (run.log; docs/archive/gpu-results.md "2026-12-06, b3a9830 to 605161d"): `auto` 0.984x the
per-phase best over the context trace, every phase at 0.99-1.00 but `c24_mixed` (0.944: 24 clients, 2,000-3,500-token
prompts beside short ones). The trace says why: at each wave's turnover the clients' next requests arrive one by one,
and the first scheduling point with a request found one short prompt waiting at an emptied server (context 32, the
hold's load 8 or 24). Valued there, speculation won, and a flip with nothing running waits for no dwell: speculation
came on. The next point found 17 or 23 waiting at 3,244-3,472 tokens, where plain decoding wins; in round 1's first wave
the flip back came after the wave's prefill and 8 speculative steps at 24 (0.39 s into the phase, 15 ms with 24
running). The hold now values the held batch at its context too (`AutoState.peak_context`)."""

from __future__ import annotations

import importlib

import attrs

from statemodel import auto_policy as ap

h200 = importlib.import_module("test_auto_h200_shifts")

TARBALL, MEMBER = "bench/gpu/results/2026-12-06_605161d_h200/traces.tar.gz", "tr/auto/switch-1064.jsonl"
CAP = 48


def run_trace() -> tuple[list[list], list[tuple[float, int, float]], list[dict], float]:
    """The auto server's switch trace (`read_run`)."""
    return h200.read_run(TARBALL, MEMBER)


def test_c24_mixeds_first_arrival_is_valued_at_the_held_batchs_context() -> None:
    """Both waves of c24_mixed in context round 1 (learner steps 7,220 and 7,338): the run's first decision with a
    request flipped speculation on at context 32 (recorded: `flip_on`, reason measured, load 8 then 24); from the
    run's own windows, with the hold's peak and its context as the run's previous decision had them (the idle point
    just before: load 8 at 3,347 tokens, then 24 at 3,371), plain decoding stays. Without the held context (the
    control: `peak_context` 0) the same state flips speculation on, as the run did."""
    windows, catch_ups, recs, t0 = run_trace()
    flips = [r for r in recs if r.get("action") == "flip_on" and r["learner_step"] in (7220, 7338)]
    assert [(r["learner_step"], r["reason"], r["load"], r["context"]) for r in flips] \
        == [(7220, "measured", 8, 32.0), (7338, "measured", 24, 32.0)]
    for flip in flips:
        idle = [r for r in recs if r.get("action") == "auto_decide" and r["reason"] == "idle"
                and r["learner_step"] == flip["learner_step"] and r["t"] <= flip["t"]][-1]
        state = h200.replay_windows(windows, catch_ups, flip["t"] - t0)
        state = attrs.evolve(state, incumbent=ap.PLAIN, flip_step=state.step - 100, want_since=None,
                             peak=idle["load"], peak_step=state.step, peak_context=idle["context"], last_demand=0,
                             calm=0)
        d = ap.decide(state, False, flip["demand"], flip["running"], CAP, context=flip["context"])
        assert d.action is None and d.load == idle["load"] and d.context == idle["context"], d
        assert d.plain_value > d.spec_value, d
        then = ap.decide(attrs.evolve(state, peak_context=0.0), False, flip["demand"], flip["running"], CAP,
                         context=flip["context"])
        assert then.action == ap.FLIP_ON and then.context == flip["context"], then


def test_the_held_context_ends_with_the_hold() -> None:
    """After the hold (idle time between phases: `observe_idle`), a short request at an empty server is valued at its
    own context: the c8_short phase of round 1 after c2_long's 2,800-3,300 tokens came on speculating at once (the run's
    first decision there: load 3 at 32 tokens, speculation on), and so it still does."""
    windows, _catch_ups, recs, t0 = run_trace()
    first = next(r for r in recs if r.get("action") == "flip_on" and r["t"] - t0 > 350.0 and r["context"] == 32.0)
    state = h200.replay_windows(windows, [], first["t"] - t0)
    held = attrs.evolve(state, incumbent=ap.PLAIN, flip_step=state.step - 100, peak=2, peak_context=3300.0,
                        peak_step=state.step - 10 * state.params.hold_steps)
    assert not ap.holding(held)
    d = ap.decide(held, False, first["demand"], first["running"], CAP, context=first["context"])
    assert d.action == ap.FLIP_ON and d.context == 32.0, d


def test_plain_never_run_near_a_clear_lead_is_not_probed_below_its_ceiling() -> None:
    """The run's probes of plain decoding at learner steps 1,184 (context round 0's c2_short: 2 requests at 143
    tokens) and 1,941 (c8_short: 8 at 135) flipped speculation off for 24 plain steps and a catch-up back; the
    phases' p99 were 1.056x and 1.053x the better static server's (round 1, which did not probe: 0.98x and 0.99x).
    Plain had not run at those batches and contexts, but it had run at other batches, at contexts up to these, which
    bound its value there (`_plain_ceiling`: 443 and 1,760 tok/s), and speculation, measured there, led that ceiling
    by 1.39-1.52x. Now no probe; with plain's ceiling older than `stale_behind_after`, or the lead under `clear_win`,
    the probe the run made."""
    windows, catch_ups, recs, t0 = run_trace()
    probes = [r for r in recs if r.get("action") == "auto_decide" and r["reason"] == "probe"
              and r["learner_step"] in (1184, 1941)]
    assert [(r["load"], r["context"], r["incumbent"]) for r in probes] == [(2, 143.0, "spec"), (8, 135.0, "spec")]
    for r in probes:
        state = h200.settled_speculating(h200.replay_windows(windows, catch_ups, r["t"] - t0), r["demand"])
        d = ap.decide(state, True, r["demand"], r["running"], CAP, context=r["context"])
        assert d.action is None and d.reason == "measured", (r["learner_step"], d)
        ceiling, age = ap._plain_ceiling(state, r["demand"], r["context"])
        assert ceiling is not None and d.spec_value >= ceiling * (1 + state.params.clear_win), (ceiling, d)
        assert 0 <= age <= state.params.stale_behind_after, age
        then = attrs.evolve(state, params=attrs.evolve(state.params, stale_behind_after=0))
        assert ap.decide(then, True, r["demand"], r["running"], CAP, context=r["context"]).reason == "probe"
        close = attrs.evolve(state, params=attrs.evolve(state.params, clear_win=d.spec_value / ceiling - 0.99))
        assert ap.decide(close, True, r["demand"], r["running"], CAP, context=r["context"]).reason == "probe"


def test_plains_ceiling_reads_only_points_at_a_shorter_or_reached_context() -> None:
    """A ceiling is what plain decoding cannot beat: a point at 2 requests and 100 tokens (5 ms a step) bounds plain
    at 2-4 requests and 100-3,000 tokens (its seconds do not fall with either); a point only at 3,000 tokens bounds
    nothing at 100 (plain may be faster there); a point of more requests bounds fewer by its own rate."""
    state = ap.initial_state()
    short = ap.Estimate(mean=0.005, samples=32, updated=0, at=2.0, ctx=100.0, ctx_sq=100.0 ** 2, ctx_s=0.5)
    long = ap.Estimate(mean=0.008, samples=32, updated=0, at=2.0, ctx=3000.0, ctx_sq=3000.0 ** 2, ctx_s=24.0)
    with_short = attrs.evolve(state, estimates=(((ap.PLAIN, ap.bucket_of(2), 0), short),), step=10)
    assert ap._plain_ceiling(with_short, 2, 3000.0) == (400.0, 10)
    assert ap._plain_ceiling(with_short, 4, 100.0) == (800.0, 10)
    assert ap._plain_ceiling(with_short, 1, 100.0) == (400.0, 10)
    with_long = attrs.evolve(state, estimates=(((ap.PLAIN, ap.bucket_of(2), 4), long),))
    assert ap._plain_ceiling(with_long, 2, 100.0) == (None, None)
    assert ap._plain_ceiling(with_long, 2, None) == (None, None)
