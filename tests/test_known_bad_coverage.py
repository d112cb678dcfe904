"""Every model invariant is refuted by at least one known-bad design, so that `specflip check` fails when an invariant
goes vacuous (issue 51: with `committed_never_lost` made always true, `specflip check` still passed).

A new invariant without a known-bad design fails `test_every_invariant_has_a_known_bad_design`; an invariant made to
hold always fails `test_an_invariant_made_vacuous_fails_its_known_bad_design` (and `specflip check`, whose verdict for
that design is then "not refuted").
"""

from __future__ import annotations

import attrs
import pytest

from proofs.verdicts import run_design
from statemodel import invariants
from statemodel.design import DesignKind, Scope
from statemodel.designs import (
    ALL_DESIGNS,
    INVARIANT_KNOWN_BAD,
    INVARIANT_KNOWN_BAD_BASES,
    OVERLAP_DESIGNS,
    overlap_scope,
)
from statemodel.invariants import INVARIANT_NAMES, INVARIANTS

DESCRIPTIVE = {"name", "kind", "summary", "source", "expected_invariant"}

# (design, scope) of every known-bad design `specflip check` and `specflip check --overlap` run
KNOWN_BAD_CHECKED = [(d, Scope()) for d in ALL_DESIGNS if d.kind is DesignKind.KNOWN_BAD] + [
    (d, overlap_scope(d)) for d in OVERLAP_DESIGNS if d.kind is DesignKind.KNOWN_BAD]


def _refuting(name: str) -> list[tuple[object, Scope]]:
    return [(d, s) for d, s in KNOWN_BAD_CHECKED if d.expected_invariant == name]


def test_every_invariant_has_a_known_bad_design() -> None:
    missing = [name for name in INVARIANT_NAMES if not _refuting(name)]
    assert not missing, f"no known-bad design refutes {missing}: add one (statemodel/designs.py)"
    assert {d.expected_invariant for d, _ in KNOWN_BAD_CHECKED} <= set(INVARIANT_NAMES)


@pytest.mark.parametrize("design", INVARIANT_KNOWN_BAD, ids=lambda d: d.name)
def test_invariant_known_bad_design_is_one_change_and_refuted(design) -> None:
    base = INVARIANT_KNOWN_BAD_BASES[design.name]
    changed = {f.name for f in attrs.fields(type(base))
               if f.name not in DESCRIPTIVE and getattr(base, f.name) != getattr(design, f.name)}
    assert len(changed) == 1 and base.kind is not DesignKind.KNOWN_BAD, changed
    verdict = run_design(design)
    assert verdict.verdict == "refuted" and verdict.invariant == design.expected_invariant, verdict.reason


def _smallest_default_scope_refutation(name: str) -> tuple[object, int]:
    """The known-bad design of the default scope whose refutation of `name` explores fewest states, and that count."""
    best = None
    for design, scope in _refuting(name):
        if scope != Scope():
            continue
        verdict = run_design(design)
        assert verdict.verdict == "refuted" and verdict.invariant == name, verdict.reason
        if best is None or verdict.result.states < best[1]:
            best = (design, verdict.result.states)
    assert best is not None
    return best


def _vacuous(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The invariant `name` made to hold always, where the model's checks call it."""
    check = next(inv.check for inv in INVARIANTS if inv.name == name)
    monkeypatch.setattr(invariants, "_STEP_CHECKS", tuple(c for c in invariants._STEP_CHECKS if c is not check))
    monkeypatch.setattr(invariants, "_STATE_CHECKS", tuple(c for c in invariants._STATE_CHECKS if c is not check))


# refuted only in the overlap scope (v1_overlap_flip_on_in_flight): made vacuous, that design's search runs past a
# million states (about 6 minutes on two shared cores; measured 2026-12-06) before it ends "not refuted". `specflip
# check --overlap` in scripts/test.sh runs it; here it is left out
OVERLAP_ONLY = {name for name in INVARIANT_NAMES if not any(s == Scope() for _, s in _refuting(name))}


@pytest.mark.parametrize("name", [n for n in INVARIANT_NAMES if n not in OVERLAP_ONLY])
def test_an_invariant_made_vacuous_fails_its_known_bad_design(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With `name` made to hold always, the known-bad design that refutes it fastest is no longer refuted by it within
    twice the states its refutation took (exhausted or cut short: either way `specflip check` fails it)."""
    design, states = _smallest_default_scope_refutation(name)
    _vacuous(monkeypatch, name)
    verdict = run_design(design, max_states=2 * states + 1000)
    assert not (verdict.verdict == "refuted" and verdict.invariant == name), verdict.reason
