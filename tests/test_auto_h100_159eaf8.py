"""A recheck weighs the coverage of the requests it would measure (`decide`'s `batch_coverage`), not the windows'
blend of the requests before them (issue 52's p99 target after a shift of the accept length).

Held out: the H100 run of 2026-12-07 (main 159eaf8; the 8B-class pair, TP 1, SGLang 0.5.16, one NVIDIA H100 80GB
HBM3; plain, always on and `auto` side by side, two paired rounds of mixed then accept_shift: `TRACE_ROUNDS=2
TRACES=mixed,accept_shift BUDGET_S=565 bash bench/gpu/workload_call.sh`), bench/gpu/results/2026-12-07_159eaf8_h100/
call_pa/traces.tar.gz, tr/auto/switch-1008.jsonl. accept_shift's predictable_again had a p99 1.057x always-on's
(rounds 1.055, 1.058; bench/gpu/p99_account.py). In both rounds the first window after the predictable requests came
back held the unpredictable ones' last steps too: a coverage of 0.5, which the learner's steps weighed to 0.30 (the
new requests' own tokens all lay in the counter draft's vocabulary: every later window of the phase 1.0). In round 0
that bound (1.44) valued speculation above plain decoding (378 tok/s) by the margin and the recheck went at that
window; in round 1 plain stood at 397 tok/s, the bound did not clear it, and the recheck waited one more window: 15
plain steps to the flip where round 0 had 7."""

from __future__ import annotations

import importlib

import pytest

from statemodel import auto_policy as ap

h200 = importlib.import_module("test_auto_h200_shifts")

TARBALL, MEMBER = "bench/gpu/results/2026-12-07_159eaf8_h100/call_pa/traces.tar.gz", "tr/auto/switch-1008.jsonl"
CAP = 48
# per round: the learner step of the recorded decision at the predictable requests' admission (plain, 2 waiting),
# and the decode step that ended the first window after it
ADMISSIONS = [(4397, 4464), (8109, 8224)]


def first_window(index: int) -> tuple[dict, dict, ap.AutoState]:
    """Round `index`'s admission decision and first window as recorded, and the learner after that window as the
    plain server stood there (the run's windows replayed, each with its own coverage)."""
    step, decode_step = ADMISSIONS[index]
    *_rest, recs, t0 = h200.read_covered_run(TARBALL, MEMBER)
    (r,) = [r for r in recs if r.get("action") == "auto_decide" and r["learner_step"] == step
            and r["reason"] == "measured" and r["waiting"] == 2]
    (w,) = [x for x in recs if x.get("action") == "auto_observe" and x["decode_step"] == decode_step]
    return r, w, h200.standing_plain(h200.replay_covered_run(TARBALL, MEMBER, w["t"] - t0 + 0.001), r)


def test_the_first_window_blended_the_requests_before() -> None:
    """The recorded windows: each round's first window after the admission held the unpredictable requests' last
    steps (coverage 0.5), the learner's coverage 0.30 after it; the recheck came at that window in round 0, one
    window later in round 1 (coverage 0.76 by then), at plain values of 378 and 397 tok/s."""
    *_rest, recs, _t0 = h200.read_covered_run(TARBALL, MEMBER)
    rechecks = [r for r in recs if r.get("action") == "flip_on" and r.get("reason") == "recheck"]
    for index, flip in enumerate(rechecks):
        r, w, state = first_window(index)
        assert (w["n"], w["spec"], w["coverage"]) == (7, 0, 0.5), w
        assert round(state.coverage.mean, 4) == 0.3037
        assert flip["learner_step"] - w["learner_step"] == (0, 8)[index], (flip, w)
        assert (flip["running"], round(flip["coverage"], 4)) == (2, (0.3037, 0.7607)[index])
        assert flip["plain_value"] == (378.472, 397.4)[index] == r["plain_value"]


@pytest.mark.parametrize("index", [0, 1])
def test_the_batchs_own_coverage_makes_the_recheck_due_at_the_first_window(index: int) -> None:
    """At each round's first window, at the plain value the server held there: weighing the steps' coverage (no batch
    coverage, or fewer than `batch_cover_tokens` of it) the recheck is due in round 0 and not in round 1, as recorded;
    weighing the new requests' own tokens (4 of 4 in the vocabulary: their prefill's and one plain step) it is due in
    both. Requests as unpredictable as the last (0 of 4) spend no recheck."""
    r, _w, state = first_window(index)
    def due(batch_coverage: tuple[int, int] | None) -> float | None:
        return ap._recheck_due(state, 1, 2, 2, CAP, 37.0, r["plain_value"], batch_coverage=batch_coverage)
    recorded = (0.0, None)[index]
    assert due(None) == recorded and due((3, 3)) == recorded
    assert due((4, 4)) == 0.0
    assert due((0, 4)) is None
