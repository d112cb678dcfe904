"""`specflip diagram`: every diagram of docs/diagrams/ generated from the model, or checked against it.

Each graph of `specflip.diagrams.graph.all_graphs()` becomes `<name>.dot`, `<name>.svg` and `<name>.mmd`.
`--check` compares the DOT and Mermaid text byte for byte, and checks that each SVG was rendered from
exactly the current DOT (the hash it carries), so it needs no `dot` program and does not depend on
the local graphviz version's layout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from specflip.diagrams.dot import dot_sha, svg_source_sha, to_dot, to_svg
from specflip.diagrams.graph import Graph, all_graphs
from specflip.diagrams.mermaid import to_mermaid

README = Path(__file__).resolve().parents[2] / "README.md"
README_BEGIN = "<!-- specflip diagram: mode-level (generated; do not edit) -->"
README_END = "<!-- specflip diagram: end -->"

# suffix -> renderer of a graph's text; the SVG is rendered from the DOT (see generate)
TEXT_RENDERERS: dict[str, Callable[[Graph], str]] = {".dot": to_dot, ".mmd": to_mermaid}
SUFFIXES = (".dot", ".svg", ".mmd")


def render_texts(graphs: tuple[Graph, ...]) -> dict[str, str]:
    """file name -> content for the DOT and Mermaid files (no SVG: that needs `dot`)."""
    return {f"{g.name}{suffix}": render(g) for g in graphs for suffix, render in TEXT_RENDERERS.items()}


def generate(graphs: tuple[Graph, ...]) -> dict[str, str]:
    """file name -> content for every file, SVG included."""
    files = render_texts(graphs)
    for g in graphs:
        files[f"{g.name}.svg"] = to_svg(files[f"{g.name}.dot"])
    return dict(sorted(files.items()))


def stale_files(out: Path, graphs: tuple[Graph, ...]) -> list[str]:
    """One line per committed file that differs from what the model produces now."""
    problems = []
    texts = render_texts(graphs)
    for name, content in sorted(texts.items()):
        path = out / name
        if not path.exists():
            problems.append(f"{name}: missing")
        elif path.read_text() != content:
            problems.append(f"{name}: differs from what the model produces")
    for g in graphs:
        path = out / f"{g.name}.svg"
        if not path.exists():
            problems.append(f"{path.name}: missing")
        elif svg_source_sha(path.read_text()) != dot_sha(texts[f"{g.name}.dot"]):
            problems.append(f"{path.name}: not rendered from the current {g.name}.dot")
    expected = {f"{g.name}{s}" for g in graphs for s in SUFFIXES}
    for path in sorted(out.glob("*")):
        if path.suffix in SUFFIXES and path.name not in expected:
            problems.append(f"{path.name}: no longer produced by the model")
    return problems


def readme_with_diagram(readme: str, mermaid: str) -> str:
    """The README with the mode-level Mermaid diagram between its markers (GitHub renders it)."""
    start, end = readme.find(README_BEGIN), readme.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"README.md lacks the markers {README_BEGIN!r} ... {README_END!r}")
    block = f"{README_BEGIN}\n```mermaid\n{mermaid.rstrip()}\n```\n"
    return readme[:start] + block + readme[end:]


def _mode_level_mermaid(graphs: tuple[Graph, ...]) -> str:
    return next(to_mermaid(g) for g in graphs if g.name == "mode-level")


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    graphs = all_graphs()
    if args.check:
        problems = [f"{out}/{line}" for line in stale_files(out, graphs)]
        current = README.read_text()
        if readme_with_diagram(current, _mode_level_mermaid(graphs)) != current:
            problems.append(f"{README}: the embedded mode-level diagram differs from the model")
        for line in problems:
            print(f"stale: {line}", file=sys.stderr)
        if problems:
            print("the diagrams do not match the model: run `specflip diagram` and commit docs/diagrams/ and README.md",
                  file=sys.stderr)
            return 1
        print(f"{len(graphs) * len(SUFFIXES)} diagram files in {out} match the model")
        return 0
    try:
        files = generate(graphs)
    except Exception as exc:  # graphviz.ExecutableNotFound and friends: one line, not a traceback
        print(f"specflip diagram: cannot render SVG ({type(exc).__name__}: {exc}); install graphviz's `dot`",
              file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    expected = set(files)
    for path in sorted(out.glob("*")):
        if path.suffix in SUFFIXES and path.name not in expected:
            path.unlink()  # a design that no longer exists leaves no stale diagram behind
    for name, content in files.items():
        (out / name).write_text(content)
    README.write_text(readme_with_diagram(README.read_text(), _mode_level_mermaid(graphs)))
    print(f"{len(files)} diagram files written to {out}")
    return 0
