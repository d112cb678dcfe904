"""The one palette every renderer uses: one colour for spec on, one for spec off, red for a violation."""

from __future__ import annotations

from specflip.diagrams.graph import Edge

# mode -> (stroke, fill, text)
COLOURS: dict[str, tuple[str, str, str]] = {
    "on": ("#1f5fa8", "#e3edf9", "#10253f"),
    "off": ("#7a4fa0", "#f0e8f7", "#2c1a3d"),
    "violation": ("#c62828", "#fde8e8", "#5c0f0f"),
    "": ("#555555", "#f4f4f4", "#222222"),
}
DETAIL_TEXT = "#444444"  # the reads/writes lines under an edge label
CATALOGUE_ONLY = "#999999"  # an edge the exploration did not reach: drawn dashed in this grey
FONT = "Helvetica"


def colours(mode: str, violation: str | None = None) -> tuple[str, str, str]:
    return COLOURS["violation" if violation else mode]


def grouped(edges: tuple[Edge, ...]) -> list[list[Edge]]:
    """Parallel edges (same ends) drawn as one arrow with one label block per action, in order."""
    groups: dict[tuple[str, str], list[Edge]] = {}
    for e in edges:
        groups.setdefault((e.source, e.target), []).append(e)
    return list(groups.values())
