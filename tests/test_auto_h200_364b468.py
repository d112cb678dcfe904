"""Held out: the auto learner fed the decode-step windows an H200 measured with main 364b468 (2026-12-07; the 8B-class
pair, TP 1, SGLang 0.5.16, one NVIDIA H200; plain, always on, SGLang's adaptive switch, `auto` and `auto` + guard side
by side: context and accept_shift two rounds, bursty_contrast one).
bench/gpu/results/2026-12-07_364b468_h200_call5/traces.tar.gz, tr/auto/switch-6360.jsonl (the auto server's
scheduler). The first run whose switch counted the draft vocabulary's coverage (`auto_draft_vocabulary` 1,024 ids):
each `auto_observe` window carries it, so the replay feeds each window its own.

What that run showed (run.log; docs/results.md "A shifting workload"): accept_shift round 0's `unpredictable` phase at
1.108x the better static's p99 (round 1: 1.036x). One window into the unpredictable requests (accept 1.0, coverage
0.0) speculation, still valued above plain, probed plain; at the probe's end the coverage was 0.0055, whose bound on the
accept length is 1.006, but speculation was valued at the accept length it had measured before (462 tok/s against
plain's 447), and the flip back retracted both requests (their catch-up 19 ms) for two windows at accept 1.0 before
the flip off on the numbers. Speculation's value is now capped by the coverage's bound (`_coverage_bound`)."""

from __future__ import annotations

import importlib

import attrs

from statemodel import auto_policy as ap

h200 = importlib.import_module("test_auto_h200_shifts")

TARBALL, MEMBER = "bench/gpu/results/2026-12-07_364b468_h200_call5/traces.tar.gz", "tr/auto/switch-6360.jsonl"
CAP = 48


def run_trace() -> tuple[list[list], list[tuple[float, int, float]], dict[float, float | None], list[dict], float]:
    """The auto server's switch trace with each window's coverage (`read_covered_run`)."""
    return h200.read_covered_run(TARBALL, MEMBER)


def replay(until: float, coverage: bool = True) -> ap.AutoState:
    windows, catch_ups, cover, _recs, _t0 = run_trace()
    return h200.replay_windows(windows, catch_ups, until, coverage=(lambda w: cover[w[7]]) if coverage else None)


def probe_ends() -> list[dict]:
    """The run's flips back to speculation at a probe's end with the coverage under 0.1 (requests the draft cannot
    predict): round 0's unpredictable phase."""
    *_rest, recs, _t0 = run_trace()
    return [r for r in recs if r.get("action") == "auto_decide" and r["reason"] == "probe_end"
            and r["flip"] == "flip_on" and r.get("coverage", 1.0) < 0.1]


def test_the_switch_counted_the_draft_vocabularys_coverage() -> None:
    """The run's switch read the draft's vocabulary (SGLang's `hot_token_id` on its EagleDraftWorker: 1,024 ids) and
    every window carries the coverage: 1.0 in the predictable phases, 0.0 in the unpredictable ones."""
    *_rest, cover, recs, _t0 = run_trace()
    vocab = [r for r in recs if r.get("action") == "auto_draft_vocabulary"]
    assert [r.get("size") for r in vocab] == [1024], vocab
    assert cover and all(c is not None for c in cover.values())
    assert {0.0, 1.0} <= set(cover.values())


def test_a_probe_of_plain_ends_on_plain_where_the_coverage_bounds_the_accept_length_at_one() -> None:
    """Round 0's unpredictable phase: the probe of plain that began one window into the requests ended with the
    coverage at 0.0055 and flipped speculation back on (recorded: `probe_end`, flip_on, speculation valued 462 against
    plain's 447). From the run's windows, each with its coverage, the same decision now stays plain on the numbers:
    speculation is valued at the bound's accept length (1.006), under plain. Without the signal (the control: no
    coverage) the same state flips back, as the run did."""
    ends = probe_ends()
    assert [(r["running"], r["incumbent"], r["coverage"]) for r in ends] == [(2, "spec", 0.0055)], ends
    _w, _c, _cover, _recs, t0 = run_trace()
    for r in ends:
        for signal in (True, False):
            state = replay(r["t"] - t0, coverage=signal)
            # as the server stood: the probe of plain ran its length from speculation, held on the numbers
            state = attrs.evolve(state, incumbent=1, flip_step=state.step - state.params.probe_steps, probe_len=0,
                                 want_since=None)
            d = ap.decide(state, False, r["demand"], r["running"], CAP, context=r["context"])
            if signal:
                assert ap._coverage_bound(state) < 1.01, state.coverage
                assert d.action is None and d.incumbent == ap.PLAIN and d.spec_value < d.plain_value, d
            else:
                assert d.action == ap.FLIP_ON and d.reason == "probe_end", d


def test_the_coverage_caps_speculations_value_only_below_the_accept_length() -> None:
    """Where the coverage is 1.0 (the predictable phases: no bound) speculation's value is its accept length's, as
    without the signal: at the run's first recorded decisions with requests running, speculation valued and the
    coverage at 1.0, the replay values speculation the same with and without it."""
    *_rest, recs, t0 = run_trace()
    decisions = [r for r in recs if r.get("action") == "auto_decide" and r.get("coverage") == 1.0
                 and r["running"] > 0 and r["spec_value"] is not None][:6]
    assert decisions
    for r in decisions:
        with_signal, without = replay(r["t"] - t0), replay(r["t"] - t0, coverage=False)
        assert ap._coverage_bound(with_signal) > 100
        v = ap.value(with_signal, 1, r["demand"], CAP, context=r["context"])
        assert v is not None and v == ap.value(without, 1, r["demand"], CAP, context=r["context"])


# --- tiers (call 4: `auto` with tiers 3,1 beside `auto`; tr/auto_tiers/switch-1033.jsonl) ----------------------------

TIERS_TARBALL = "bench/gpu/results/2026-12-07_364b468_h200_call4/traces.tar.gz"
TIERS_MEMBER = "tr/auto_tiers/switch-1033.jsonl"


def tiers_trace() -> tuple[list[list], list[tuple[float, int, float]], list[dict], float]:
    """The tiers server's switch trace (`read_run`), its windows with each one's step count."""
    return h200.read_run(TIERS_TARBALL, TIERS_MEMBER, tiers=True)


def test_tiers_at_long_contexts_follow_the_tiers_measured_there() -> None:
    """The run's two decisions that ran speculation at the context trace's long phases on the prior (recorded: the
    tier change to steps 3 at the 8 long clients' first arrival, load 8 at 2,317 tokens, then the flip on with 24
    running at 2,394 tokens, a 225 ms catch-up): steps 3 had lost to plain decoding at 2 long requests, steps 1 had
    run only at short contexts. From the run's windows, each with its step count, the prior now runs plain at both
    (`_outgrown` on the tier measured there). With steps 3's long-context points removed (no tier measured there)
    there is no verdict and the prior runs the ladder's first tier, as the run did."""
    windows, catch_ups, recs, t0 = tiers_trace()
    spec_priors = [r for r in recs if r.get("action") == "auto_decide" and r["reason"] == "prior"
                   and (r["context"] or 0) >= 2000 and r["steps"] is not None and r["load"] >= 8
                   and (r["running"] == 0 or r["flip"] == "flip_on")]  # not the speculative steps after the flip
    assert [(r["load"], r["context"], r["running"], r["flip"]) for r in spec_priors] \
        == [(8, 2317.0, 0, None), (24, 2394.0, 24, "flip_on")]
    for r in spec_priors:
        state = h200.replay_windows(windows, catch_ups, r["t"] - t0, tiers=(3, 1))
        spec_on = r["flip"] is None  # the first: speculating (steps 1, held) at an emptied server; the second: plain
        state = attrs.evolve(state, incumbent=state.mode_of(True, 1) if spec_on else ap.PLAIN,
                             flip_step=state.step - 300,
                             want_since=None, peak=r["load"], peak_step=state.step, peak_context=r["context"])
        line3, line1 = ap._line(state, 1, 2, r["context"]), ap._line(state, 2, 2, r["context"])
        assert line3 is not None and line3[2] and (line1 is None or not line1[2]), (line3, line1)
        d = ap.decide(state, spec_on, r["demand"], r["running"], CAP, steps=1 if spec_on else None,
                      context=r["context"])
        assert d.reason == "prior" and d.incumbent == ap.PLAIN, d
        assert d.action == (ap.FLIP_OFF if spec_on else None), d
        unmeasured = attrs.evolve(state, estimates=tuple((k, e) for k, e in state.estimates
                                                         if not (k[0] == 1 and e.ctx >= 1000)))
        assert not ap._outgrown(unmeasured, r["load"], CAP, r["context"])
