"""docs/model.md must name every field, action, invariant and design of the model, and nothing else.

The tables are found by their header's first cell; a row's first cell (backticks stripped) is the name it
documents. The expected names are read from the model itself, so adding a field, an action, an invariant or
a design without documenting it fails here, and so does a table row the model no longer backs.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from statemodel import design as design_module
from statemodel import state as state_module
from statemodel.actions import ACTION_CATALOGUE
from statemodel.designs import ALL_DESIGNS, OVERLAP_DESIGNS
from statemodel.invariants import INVARIANT_NAMES

DOC = Path(__file__).resolve().parent.parent / "docs" / "model.md"

# Which table (header's first cell) documents which kind of name.
FIELD_TABLE = "model field"
ENUM_TABLE = "model value"
ACTION_TABLE = "action"
INVARIANT_TABLE = "invariant"
DESIGN_TABLE = "design"
VERSION_COLUMNS = ("0.5.23", "0.5.16", "0.5.12")

FIELD_CLASSES = (
    state_module.Request,
    state_module.Batch,
    state_module.SpecInfo,
    state_module.GraphShape,
    state_module.State,
    state_module.Thresholds,
    state_module.Unprocessed,
    design_module.Design,
    design_module.Scope,
    design_module.ThresholdPolicy,
    design_module.AdaptiveTiers,
)
ENUM_CLASSES = (
    state_module.ForwardMode,
    state_module.SpecInfoKind,
    state_module.Status,
    state_module.Stage,
    state_module.SpecMode,
    design_module.DesignKind,
    design_module.ClearSpecOn,
    design_module.OutCacheLocFrom,
    design_module.DraftWhileOff,
    design_module.KvReserve,
    design_module.PlainStepGraphs,
    design_module.MergeSpecInfo,
    design_module.TreeDraft,
)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_tables(text: str) -> dict[str, list[list[str]]]:
    """Markdown tables by the first cell of their header row: the body rows, as lists of cells."""
    tables: dict[str, list[list[str]]] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines) - 1:
        line, below = lines[i].strip(), lines[i + 1].strip()
        if line.startswith("|") and below.startswith("|") and set(below) <= set("|-: "):
            header = _cells(line)
            rows = tables.setdefault(header[0], [])
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            continue
        i += 1
    return tables


def first_cells(tables: dict[str, list[list[str]]], table: str) -> list[str]:
    return [row[0].strip("`") for row in tables.get(table, [])]


def _field_names(cls: type) -> tuple[str, ...]:
    """An attrs class's fields, or a NamedTuple's (statemodel.state.Request)."""
    return cls._fields if issubclass(cls, tuple) else tuple(f.name for f in attrs.fields(cls))  # type: ignore[attr-defined]


def model_names() -> dict[str, list[str]]:
    """Every name the doc must document, per table, read from the model."""
    return {
        FIELD_TABLE: [f"{cls.__name__}.{name}" for cls in FIELD_CLASSES for name in _field_names(cls)],
        ENUM_TABLE: [f"{cls.__name__}.{m.name}" for cls in ENUM_CLASSES for m in cls],
        ACTION_TABLE: [a.name for a in ACTION_CATALOGUE],
        INVARIANT_TABLE: list(INVARIANT_NAMES),
        DESIGN_TABLE: [d.name for d in ALL_DESIGNS + OVERLAP_DESIGNS],
    }


def doc_drift(text: str, expected: dict[str, list[str]]) -> list[str]:
    """One line per problem: a name missing from its table, a row the model does not back, a duplicate."""
    tables = parse_tables(text)
    problems: list[str] = []
    for table, names in expected.items():
        documented = first_cells(tables, table)
        problems += [f"{table!r} table lacks {n}" for n in names if n not in documented]
        problems += [
            f"{table!r} table documents {n}, which the model does not have" for n in documented if n not in names
        ]
        problems += [f"{table!r} table documents {n} twice" for n in sorted(set(documented)) if documented.count(n) > 1]
    return problems


@pytest.fixture(scope="module")
def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


@pytest.mark.parametrize("table", [FIELD_TABLE, ENUM_TABLE, ACTION_TABLE, INVARIANT_TABLE, DESIGN_TABLE])
def test_doc_names_exactly_the_model(doc_text: str, table: str) -> None:
    expected = {table: model_names()[table]}
    assert expected[table], f"the model has no {table} names: the check would be vacuous"
    assert doc_drift(doc_text, expected) == []


@pytest.mark.parametrize("table", [FIELD_TABLE, ENUM_TABLE, ACTION_TABLE])
def test_correspondence_rows_fill_every_release_line(doc_text: str, table: str) -> None:
    tables = parse_tables(doc_text)
    rows = tables[table]
    short = [row[0] for row in rows if len(row) != 2 + len(VERSION_COLUMNS) or not all(row)]
    assert short == [], f"rows without a cell for meaning + {VERSION_COLUMNS}: {short}"


def test_correspondence_headers_name_the_release_lines(doc_text: str) -> None:
    headers = [
        _cells(line)
        for line in doc_text.splitlines()
        if line.startswith(f"| {FIELD_TABLE} |") or line.startswith(f"| {ACTION_TABLE} |")
    ]
    assert headers, "no correspondence table found"
    assert all(tuple(h[2:]) == VERSION_COLUMNS for h in headers), headers


def test_new_action_in_catalogue_is_reported(doc_text: str) -> None:
    expected = model_names()
    expected[ACTION_TABLE] = [*expected[ACTION_TABLE], "speculate_harder"]
    assert doc_drift(doc_text, expected) == ["'action' table lacks speculate_harder"]


def test_removed_row_and_stale_row_are_reported(doc_text: str) -> None:
    doctored = doc_text.replace("| `draft_sync` |", "| `draft_resync` |")
    doctored = doctored.replace("| `Request.kv_reserved` |", "| (deleted) |")
    problems = doc_drift(doctored, model_names())
    assert "'action' table lacks draft_sync" in problems
    assert "'action' table documents draft_resync, which the model does not have" in problems
    assert "'model field' table lacks Request.kv_reserved" in problems


def test_new_field_invariant_and_design_are_reported(doc_text: str) -> None:
    expected = model_names()
    expected[FIELD_TABLE].append("Batch.lookahead")
    expected[INVARIANT_TABLE].append("graphs_match_mode")
    expected[DESIGN_TABLE].append("mystery_design")
    problems = doc_drift(doc_text, expected)
    assert problems == [
        "'model field' table lacks Batch.lookahead",
        "'invariant' table lacks graphs_match_mode",
        "'design' table lacks mystery_design",
    ]
