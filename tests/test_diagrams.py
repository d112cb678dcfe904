"""The diagrams come from the model: every action is drawn, the committed files match, and a model
change that alters a diagram makes `specflip diagram --check` fail."""

from __future__ import annotations

import shutil
from pathlib import Path

import attrs
import pytest

from specflip.cli import main as cli_main
from specflip.diagrams import graph as model_graph
from specflip.diagrams import render_texts, stale_files
from specflip.diagrams.dot import to_dot, to_svg
from specflip.diagrams.mermaid import to_mermaid
from statemodel.actions import ACTION_CATALOGUE, ActionInfo, ActionMode
from statemodel.designs import CANDIDATES, KNOWN_BAD, SHIPPED
from statemodel.state import Stage

DIAGRAMS = Path(__file__).resolve().parent.parent / "docs" / "diagrams"


@pytest.fixture(scope="module")
def observations() -> model_graph.Observations:
    return model_graph.observe()


@pytest.fixture(scope="module")
def graphs(observations) -> tuple[model_graph.Graph, ...]:
    return model_graph.all_graphs(obs=observations)


def _machine_actions(graphs) -> set[str]:
    machines = [g for g in graphs if g.name == "mode-level" or g.name.startswith("step-")]
    assert len(machines) == 3
    return set().union(*(g.actions() for g in machines))


def test_every_catalogue_action_is_an_edge_of_the_mode_or_step_diagrams(graphs):
    # the diagrams draw the scope without the overlap schedule: its actions are not drawn
    drawn = _machine_actions(graphs)
    assert {a.name for a in ACTION_CATALOGUE if not a.overlap_only} <= drawn
    overlap_only = {a.name for a in ACTION_CATALOGUE if a.overlap_only}
    assert overlap_only and not overlap_only & drawn


def test_every_action_is_drawn_in_the_rendered_dot_and_mermaid(graphs):
    machines = [g for g in graphs if g.name == "mode-level" or g.name.startswith("step-")]
    dot = "".join(to_dot(g) for g in machines)
    mermaid = "".join(to_mermaid(g) for g in machines)
    for info in ACTION_CATALOGUE:
        if info.overlap_only:
            continue
        assert f"<b>{info.name}</b>" in dot, info.name
        assert f"<b>{info.name}</b>" in mermaid, info.name


def test_edges_follow_the_catalogue_stages(graphs):
    for g in graphs:
        if not g.name.startswith("step-"):
            continue
        for e in g.edges:
            info = model_graph.ACTIONS_BY_NAME[e.action]
            assert e.source.split("_", 1)[1] in {s.value for s in info.stage_from}, e


def test_flips_change_mode_in_the_mode_level_diagram(graphs):
    mode_level = next(g for g in graphs if g.name == "mode-level")
    flips = {(e.action, e.source, e.target) for e in mode_level.edges if e.source != e.target}
    assert flips == {("flip_off", "on", "off"), ("flip_on", "off", "on")}


def test_an_action_the_exploration_never_takes_still_gets_its_catalogue_edge(observations):
    phantom = ActionInfo("phantom_step", (Stage.SCHEDULE,), Stage.PREPARED, ActionMode.OFF, "a test-only action",
                         "never")
    catalogue = ACTION_CATALOGUE + (phantom,)
    by_name = {a.name: a for a in catalogue}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model_graph, "ACTION_CATALOGUE", catalogue)
        mp.setattr(model_graph, "ACTIONS_BY_NAME", by_name)
        step_off = model_graph.step_level(observations, "off")
    edge = next(e for e in step_off.edges if e.action == "phantom_step")
    assert edge.from_catalogue and (edge.source, edge.target) == ("off_schedule", "off_prepared")


def test_counterexamples_end_red_on_the_expected_invariant(graphs):
    by_name = {g.name: g for g in graphs}
    for design in KNOWN_BAD:
        g = by_name[f"counterexample-{design.name}"]
        assert g.nodes[-1].violation == design.expected_invariant
        assert all(n.violation is None for n in g.nodes[:-1])


def test_flip_paths_of_threshold_designs_go_off_and_back_on(graphs):
    by_name = {g.name: g for g in graphs}
    for design in SHIPPED + CANDIDATES:
        actions = [e.action for e in by_name[f"flip-{design.name}"].edges]
        if design.is_adaptive:
            assert "flip_off" not in actions and "draft" in actions
        else:
            assert actions.index("flip_off") < actions.index("plain_decode") < actions.index("flip_on")
            # the path shows how the design brings the draft up to date
            recovery = {"sync_every_step": "draft_sync", "catch_up_on_enable": "draft_catch_up",
                        "retract_on_enable": "prefill"}  # the re-prefill after flip_on retracted the batch
            back_on = actions.index("flip_on") if design.draft_while_off.value == "retract_on_enable" else 0
            assert recovery[design.draft_while_off.value] in actions[back_on:]
        assert actions[-1] == "draft"


def test_committed_diagrams_match_the_model(graphs):
    assert stale_files(DIAGRAMS, graphs) == []


def test_check_fails_when_the_model_changes_a_diagram(graphs, observations, tmp_path):
    out = tmp_path / "diagrams"
    shutil.copytree(DIAGRAMS, out)
    assert stale_files(out, graphs) == []
    # a guard reworded in the catalogue changes the edge label of the mode-level and step diagrams
    flip_off = model_graph.ACTIONS_BY_NAME["flip_off"]
    reworded = attrs.evolve(flip_off, guard="demand > t_off")
    catalogue = tuple(reworded if a.name == "flip_off" else a for a in ACTION_CATALOGUE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model_graph, "ACTION_CATALOGUE", catalogue)
        mp.setattr(model_graph, "ACTIONS_BY_NAME", {a.name: a for a in catalogue})
        changed = (model_graph.mode_level(observations), *graphs[1:])
    problems = stale_files(out, changed)
    assert problems == ["mode-level.dot: differs from what the model produces",
                        "mode-level.mmd: differs from what the model produces",
                        "mode-level.svg: not rendered from the current mode-level.dot"]


def test_check_fails_on_an_edited_or_stale_file(graphs, tmp_path):
    out = tmp_path / "diagrams"
    shutil.copytree(DIAGRAMS, out)
    mmd = out / "step-spec-on.mmd"
    mmd.write_text(mmd.read_text().replace("draft_extend", "draft_extended"))
    svg = out / "mode-level.svg"
    svg.write_text(to_svg(to_dot(graphs[1])))  # an SVG of another graph's DOT
    (out / "flip-removed_design.dot").write_text("digraph {}\n")
    assert stale_files(out, graphs) == [
        "step-spec-on.mmd: differs from what the model produces",
        "mode-level.svg: not rendered from the current mode-level.dot",
        "flip-removed_design.dot: no longer produced by the model",
    ]


def test_cli_check_exits_non_zero_on_a_missing_diagram_directory(tmp_path, capsys):
    assert cli_main(["diagram", "--check", "--out", str(tmp_path / "nothing")]) == 1
    assert "mode-level.dot: missing" in capsys.readouterr().err


def test_rendering_is_deterministic(graphs):
    assert render_texts(graphs) == render_texts(graphs)
    dot = to_dot(graphs[0])
    assert to_svg(dot) == to_svg(dot)
    assert "Generated by graphviz version" not in to_svg(dot)


def test_the_docs_page_shows_every_diagram(graphs):
    page = (DIAGRAMS.parent / "diagrams.md").read_text()
    missing = [g.name for g in graphs if f"(diagrams/{g.name}.svg)" not in page]
    assert missing == []


def test_mermaid_front_matter_is_valid_yaml() -> None:
    # GitHub does not render a Mermaid block whose front matter YAML fails to parse
    yaml = pytest.importorskip("yaml")
    for g in model_graph.all_graphs():
        text = to_mermaid(g)
        assert text.startswith("---\n")
        front = text.split("---\n")[1]
        assert yaml.safe_load(front)["title"] == g.title
