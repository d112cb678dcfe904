"""Mermaid renderer: a `specflip.diagrams.graph.Graph` as flowchart text, which GitHub renders in Markdown."""

from __future__ import annotations

import json

from specflip.diagrams.graph import Edge, Graph, Node
from specflip.diagrams.style import CATALOGUE_ONLY, colours, grouped


def _text(s: str) -> str:
    """Mermaid entity codes for the characters its parser would take as syntax."""
    for raw, code in (("&", "#amp;"), ('"', "#quot;"), ("<", "#lt;"), (">", "#gt;"), ("|", "#124;")):
        s = s.replace(raw, code)
    return s.replace("\n", "<br/>")


def _id(node_id: str) -> str:
    return f"n_{node_id}"  # never a Mermaid keyword (end, class, ...)


def _node(node: Node) -> str:
    rows = [f"<b>{_text(node.title)}</b>", *(_text(line.strip()) for line in node.lines)]
    if node.violation:
        rows.append(f"<b>breaks {_text(node.violation)}</b>")
    return f'{_id(node.id)}["{"<br/>".join(rows)}"]'


def _edge_text(edge: Edge) -> str:
    rows = [f"<b>{_text(edge.action)}</b>{_text(edge.label[len(edge.action):])}" if edge.action
            else f"<i>{_text(edge.label)}</i>"]
    if edge.from_catalogue:
        rows.append("(from the catalogue: not reached)")
    rows += [_text(line) for line in edge.lines]
    return "<br/>".join(rows)


def to_mermaid(graph: Graph) -> str:
    trace = graph.kind == "trace"
    direction = "TB" if trace or graph.name.startswith("step") else "LR"
    # the front matter is YAML: a title with ": " in it must be quoted (a JSON string is valid YAML)
    out = ["---", f"title: {json.dumps(graph.title)}", "---", f"flowchart {direction}"]
    if trace:
        for mode, title in graph.lanes:
            out.append(f'  subgraph lane_{mode} ["{_text(title)}"]')
            out += [f"    {_node(n)}" for n in graph.nodes if n.lane == mode]
            out.append("  end")
    else:
        out += [f"  {_node(n)}" for n in graph.nodes]
    link_styles = []
    groups = [[e] for e in graph.edges] if trace else grouped(graph.edges)
    for i, group in enumerate(groups):
        first = group[0]
        text = "<br/>".join(_edge_text(e) for e in group) if not trace else ""
        arrow = "-.->" if all(e.from_catalogue for e in group) else "-->"
        source, target = _id(first.source), _id(first.target)
        out.append(f'  {source} {arrow}|"{text}"| {target}' if text else f"  {source} {arrow} {target}")
        stroke = CATALOGUE_ONLY if all(e.from_catalogue for e in group) else colours(first.mode, first.violation)[0]
        link_styles.append(f"  linkStyle {i} stroke:{stroke},stroke-width:{3 if first.violation else 1.5}px")
    out += link_styles
    for name in ("on", "off", "violation"):
        stroke, fill, text = colours(name if name != "violation" else "", name == "violation" or None)
        out.append(f"  classDef {name} fill:{fill},stroke:{stroke},color:{text}")
    for n in graph.nodes:
        cls = "violation" if n.violation else n.mode
        if cls:
            out.append(f"  class {_id(n.id)} {cls}")
    return "\n".join(out) + "\n"
