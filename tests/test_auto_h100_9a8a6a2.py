"""Held out: the auto learner fed the decode-step windows an H100 measured with main 9a8a6a2 (2026-12-07; the 8B-class
pair, TP 1, SGLang 0.5.16, one NVIDIA H100 80GB HBM3; plain, always on and `auto` side by side, every trace two
paired rounds: `BUDGET_S=570 bash bench/gpu/workload_call.sh`). bench/gpu/results/2026-12-07_9a8a6a2_h100/call_pa/
traces.tar.gz, tr/auto/switch-5803.jsonl (the auto server's scheduler); each `auto_observe` window carries the draft
vocabulary's coverage, and the replay feeds each window its own.

What that run showed (run.log; docs/results.md "A shifting workload"): every trace 0.995-0.997x the per-phase best,
and every phase's p99 within 1.03x the better static's but accept_shift's `predictable_again` (1.103x). There, one
window into the returning requests (coverage 1.0 in it, the estimate 0.66), speculation was valued at the accept
length measured over the unpredictable requests (1.34, at a coverage of 0.34) above plain (374 against 354 tok/s): a
flip the numbers wanted, not by a clear win, so it waited for the confirmation, two more windows of plain (0.09 s)
before the flip. The recheck `_recheck_due` finds due at that window now goes at once where the numbers lean to
speculation, as it did where they held plain (the H200 runs of 364b468: recheck at the first window)."""

from __future__ import annotations

import importlib

import pytest

from statemodel import auto_policy as ap

h200 = importlib.import_module("test_auto_h200_shifts")

TARBALL, MEMBER = "bench/gpu/results/2026-12-07_9a8a6a2_h100/call_pa/traces.tar.gz", "tr/auto/switch-5803.jsonl"
CAP = 48


def run_trace() -> tuple[list[list], list[tuple[float, int, float]], dict[float, float | None], list[dict], float]:
    """The auto server's switch trace with each window's coverage (`read_covered_run`)."""
    return h200.read_covered_run(TARBALL, MEMBER)


def returns() -> list[dict]:
    """The run's first decisions at predictable requests returning to a plain server (coverage in (0.5, 1) after
    windows at 0.0, 2 requests running): both rounds' `predictable_again`."""
    *_rest, recs, _t0 = run_trace()
    return [r for r in recs if r.get("action") == "auto_decide" and r["incumbent"] == "plain" and r["running"] == 2
            and 0.5 < (r.get("coverage") or 0.0) < 1.0 and r["want_since"] == r["learner_step"]]


def as_it_stood(r: dict, params: ap.AutoParams | None = None) -> ap.AutoState:
    """The learner after the run's windows before decision `r`, as the server stood there: plain, settled since the
    recorded flip, no flip wanted yet."""
    return h200.standing_plain_before(TARBALL, MEMBER, r, params)


def test_the_returns_were_held_for_confirmation() -> None:
    """The recorded decisions: speculation valued above plain, not by a clear win, the flip put off (`confirming`),
    and two windows later the flip on with both requests running."""
    recorded = returns()
    assert [(r["reason"], r["flip"], round(r["coverage"], 4)) for r in recorded] \
        == [("confirming", None, 0.6564), ("confirming", None, 0.6073)], recorded
    for r in recorded:
        assert r["plain_value"] < r["spec_value"] < r["plain_value"] * 1.25, r


@pytest.mark.parametrize("index", [0, 1])
def test_a_due_recheck_is_not_held_for_confirmation(index: int) -> None:
    """From the run's windows, each with its coverage, the same decision now flips speculation on at once, as a
    recheck (its accept length learned afresh); with rechecks off (`recheck_fraction` 0) plain is held: the accept
    length is the one the unpredictable requests' coverage bounded (`_bounded_accepts`), and only a recheck measures
    the requests that came back."""
    r = returns()[index]
    state = as_it_stood(r)
    assert ap.accept_bound(state.coverage.mean) > 2.0 > state.accept.mean * 1.25, (state.coverage, state.accept)
    d = ap.decide(state, False, r["demand"], r["running"], CAP, context=r["context"])
    assert (d.action, d.reason) == (ap.FLIP_ON, "recheck"), d
    assert ap.commit(state, d).accept.weighted == 1
    held = as_it_stood(r, ap.AutoParams(recheck_fraction=0.0))
    d = ap.decide(held, False, r["demand"], r["running"], CAP, context=r["context"])
    assert (d.action, d.reason, d.wants_flip) == (None, "measured", False), d
