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

from specflip.diagrams.dot import SVG_SOURCE_MARK, dot_sha, svg_source_sha, to_dot, to_svg
from specflip.diagrams.graph import Graph, all_graphs
from specflip.diagrams.mermaid import to_mermaid
from specflip.errors import UsageError
from specflip.outputs import has_mark, read_manifest, refuse_foreign, writable_dir, write_files

README = Path(__file__).resolve().parents[2] / "README.md"
REPO_DIAGRAMS = README.parent / "docs" / "diagrams"
MANIFEST = ".specflip-diagrams"  # the names `specflip diagram` wrote into a directory other than REPO_DIAGRAMS
MANIFEST_MARK = "# written by `specflip diagram`: the files it wrote into this directory (and may replace)"
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
    """Write (or `--check`) the diagrams. Into the repository's own docs/diagrams it also refreshes README.md's
    embedded diagram and removes diagrams of designs that no longer exist; into any other directory it writes
    only its own file names and removes only files it wrote there before (listed in MANIFEST)."""
    out = Path(args.out)
    own_docs = out.resolve() == REPO_DIAGRAMS.resolve()
    if not args.check:
        writable_dir(out, "diagram directory")  # before building and rendering the graphs (about 30 s)
    graphs = all_graphs()
    if args.check:
        problems = [f"{out}/{line}" for line in stale_files(out, graphs)]
        current = README.read_text()
        if own_docs and readme_with_diagram(current, _mode_level_mermaid(graphs)) != current:
            problems.append(f"{README}: the embedded mode-level diagram differs from the model")
        for line in problems:
            print(f"stale: {line}", file=sys.stderr)
        if problems:
            print("the diagrams do not match the model: run `specflip diagram` and commit docs/diagrams/ and README.md",
                  file=sys.stderr)
            return 1
        print(f"{len(graphs) * len(SUFFIXES)} diagram files in {out} match the model")
        return 0
    # before rendering: none of the user's files is in the way of ours
    names = {f"{g.name}{suffix}" for g in graphs for suffix in SUFFIXES}
    wrote_before = set() if own_docs else read_manifest(out / MANIFEST)
    if not own_docs:
        refuse_foreign(out, names | {MANIFEST}, lambda p: p.name in wrote_before or _is_generated(p)
                       or (p.name == MANIFEST and has_mark(MANIFEST_MARK)(p)), "specflip diagram")
    try:
        files = generate(graphs)
    except Exception as exc:  # graphviz.ExecutableNotFound and friends: one line, not a traceback
        raise UsageError(f"cannot render SVG ({type(exc).__name__}: {exc}); install graphviz's `dot`") from None
    for path in sorted(out.glob("*")):
        # a design that no longer exists leaves no stale diagram behind; elsewhere only what we wrote there
        ours = path.suffix in SUFFIXES if own_docs else path.name in wrote_before
        if ours and path.name not in files and path.name != MANIFEST:
            path.unlink()
    write_files(out, files, "diagram")
    if not own_docs:
        write_files(out, {MANIFEST: MANIFEST_MARK + "\n" + "".join(f"{name}\n" for name in sorted(files))},
                    "diagram manifest")
    else:
        write_files(README.parent, {README.name: readme_with_diagram(README.read_text(), _mode_level_mermaid(graphs))},
                    "README")
    print(f"{len(files)} diagram files written to {out}")
    return 0


def _is_generated(path: Path) -> bool:
    """An SVG specflip rendered carries the hash of its DOT source."""
    return path.suffix == ".svg" and has_mark(SVG_SOURCE_MARK)(path)
