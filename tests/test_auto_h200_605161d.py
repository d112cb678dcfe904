"""Held out: the auto learner fed the decode-step windows an H200 measured with main 605161d (2026-12-06; the 8B-class
pair, TP 1, SGLang 0.5.16, one NVIDIA H200; plain, always on, `auto`, `auto` + guard and `auto` + guard without slot
values side by side: context and accept_shift two rounds, bursty_contrast one).
bench/gpu/results/2026-12-06_605161d_h200/traces.tar.gz, tr/auto/switch-1064.jsonl (the auto server's scheduler).

What that run showed (run.log; docs/results.md "A shifting workload"): `auto` 0.984x the per-phase best over the
context trace, every phase at 0.99-1.00 but `c24_mixed` (0.944: 24 clients, 2,000-3,500-token prompts beside short
ones). The trace says why: at each wave's turnover the clients' next requests arrive one by one, and the first
scheduling point with a request found one short prompt waiting at an emptied server (context 32, the hold's load 8
or 24). Valued there, speculation won, and a flip with nothing running waits for no dwell: speculation came on. The
next point found 17 or 23 waiting at 3,244-3,472 tokens, where plain decoding wins; in round 1's first wave the flip
back came after the wave's prefill and 8 speculative steps at 24 (0.39 s into the phase, 15 ms with 24 running).
The hold now values the held batch at its context too (`AutoState.peak_context`)."""

from __future__ import annotations

import functools
import importlib
import json

import attrs

from statemodel import auto_policy as ap

h200 = importlib.import_module("test_auto_h200_shifts")

TARBALL, MEMBER = "bench/gpu/results/2026-12-06_605161d_h200/traces.tar.gz", "tr/auto/switch-1064.jsonl"
CAP = 48


@functools.cache
def run_trace() -> tuple[list[list], list[tuple[float, int, float]], list[dict], float]:
    """The auto server's switch trace, read once: its windows and catch-ups in the replays' form, its records and
    their first time."""
    lines = h200._trace(TARBALL, MEMBER)
    recs = [json.loads(line) for line in lines]
    return h200.extract_windows(lines, 20.0), h200.extract_catch_ups(lines), recs, recs[0]["t"]


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
