"""The violations each known-bad design's shortest counterexample ends with, to the field: invariant, message, requests,
expected and actual, against tests/golden/known_bad_violations.json. The guard's messages are built from these
fields ("expected 1024, actual 1021"); the proof reports hold the messages only, so mutants of `expected` / `actual` in
statemodel/invariants.py survived every test (scripts/mutation.sh, docs/mutation.md).

Regenerate after a deliberate change: `.venv/bin/python tests/test_known_bad_violations.py`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proofs.verdicts import run_design  # noqa: E402
from statemodel.design import DesignKind  # noqa: E402
from statemodel.designs import ALL_DESIGNS  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "golden" / "known_bad_violations.json"
KNOWN_BAD = [d for d in ALL_DESIGNS if d.kind is DesignKind.KNOWN_BAD]


def violations_of(design: object) -> list[dict[str, object]]:
    result = run_design(design).result  # type: ignore[arg-type]
    return [{"invariant": v.invariant, "message": v.message, "rids": list(v.rids), "expected": v.expected,
             "actual": v.actual} for v in result.violations]


@pytest.mark.parametrize("design", KNOWN_BAD, ids=lambda d: d.name)
def test_known_bad_violation_fields_are_as_recorded(design: object) -> None:
    golden = json.loads(GOLDEN.read_text())
    assert violations_of(design) == golden[design.name]  # type: ignore[attr-defined]


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps({d.name: violations_of(d) for d in KNOWN_BAD}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
