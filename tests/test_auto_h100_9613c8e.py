"""Held out: the auto learner fed the decode-step windows an H100 measured on the `mixed` trace with main 9613c8e
(2026-12-07; its package as 001f95e's; the 8B-class pair, TP 1, SGLang 0.5.16, one NVIDIA H100 80GB HBM3; plain, always
on and `auto` side by side, one round: `TRACE_ROUNDS=1 TRACES=mixed BUDGET_S=335 bash bench/gpu/workload_call.sh`).
bench/gpu/results/2026-12-07_9613c8e_h100_mixed/traces.tar.gz, tr/auto/switch-944.jsonl; each window carries the
draft vocabulary's coverage, and the replay feeds each window its own.

What that run showed (run.log; docs/results.md "A shifting workload"): the trace 0.980x the per-phase best and 1.145x
the better static, every phase within 1.05x of the better static's p99 but `quiet_long_unpredictable` (2 clients of
3,100-token prompts whose outputs the draft cannot predict, after a burst of 64 mixed requests): 0.916x plain there,
p99 1.26x. The hold valued the phase's first request at the burst's 64 (plain); when it ended, nothing had run near
2 requests at that context, and the prior flipped speculation on with both running, the coverage at 0.059 (its
bound on the accept length 1.06): 0.38 s of speculative steps at accept 1.0, 22.8 ms each against plain's 7.6 ms, and
a flip off on the numbers. The prior now runs plain where the coverage rules speculation out (`_coverage_rules_out`)."""

from __future__ import annotations

import importlib

import attrs

from statemodel import auto_policy as ap

h200 = importlib.import_module("test_auto_h200_shifts")

TARBALL, MEMBER = "bench/gpu/results/2026-12-07_9613c8e_h100_mixed/traces.tar.gz", "tr/auto/switch-944.jsonl"
CAP = 48


def prior_flips_on() -> list[dict]:
    """The run's flips on by the prior with requests running."""
    *_rest, recs, _t0 = h200.read_covered_run(TARBALL, MEMBER)
    return [r for r in recs if r.get("action") == "auto_decide" and r["reason"] == "prior"
            and r["flip"] == "flip_on" and r["running"] > 0]


def test_the_prior_flipped_speculation_on_at_a_coverage_of_006() -> None:
    """The recorded decision: 2 long requests running, neither mode valued there, the coverage 0.0588."""
    assert [(r["running"], r["spec_value"], r["coverage"], r["context"]) for r in prior_flips_on()] \
        == [(2, None, 0.0588, 3108.0)]


def test_the_prior_runs_plain_where_the_coverage_rules_speculation_out() -> None:
    """From the run's windows, each with its coverage, the state as the server stood at that decision (plain, its
    flip and the want's start where the run had them): the learner now keeps plain on the prior (the coverage's bound
    1.06 within the margin of the least ratio of a speculative step's seconds to a plain one's the run measured, about
    1.3) and probes no speculation; without the signal it flips speculation on, as the run did."""
    windows, catch_ups, cover, _recs, t0 = h200.read_covered_run(TARBALL, MEMBER)
    (r,) = prior_flips_on()
    for signal in (True, False):
        coverage = (lambda w: cover[w[7]]) if signal else None
        state = h200.replay_windows(windows, catch_ups, r["t"] - t0, coverage=coverage)
        state = h200.standing_plain(state, r, wanted=True)
        d = ap.decide(state, False, r["demand"], r["running"], CAP, context=r["context"])
        if signal:
            assert 1.0 < ap._coverage_bound(state) < 1.1 and ap._coverage_rules_out(state), state.coverage
            assert (d.action, d.reason, d.incumbent) == (None, "prior", ap.PLAIN), d
        else:
            assert not ap._coverage_rules_out(state)
            assert (d.action, d.reason) == (ap.FLIP_ON, "prior"), d


def test_a_coverage_that_admits_a_gain_leaves_the_prior_as_it_was() -> None:
    """At the same state with the coverage of the burst before it (0.5: a bound of 2.0, above the step cost's
    ratio), speculation is not ruled out, and the prior is the run's."""
    *_rest, t0 = h200.read_covered_run(TARBALL, MEMBER)
    (r,) = prior_flips_on()
    state = h200.replay_covered_run(TARBALL, MEMBER, r["t"] - t0)
    half = attrs.evolve(state, coverage=attrs.evolve(state.coverage, mean=0.5))
    assert ap._coverage_bound(half) == 2.0 and not ap._coverage_rules_out(half)
