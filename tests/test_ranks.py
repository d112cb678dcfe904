"""Rank agreement on per-rank traces written from model walks (synthetic: the transitions come from
the model itself, the file format from shim.guard.trace, as the guard writes it on each rank)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from shim.guard.ranks import RankTraceError, check_rank_agreement
from shim.guard.trace import TraceFormatError, TraceWriter, scope_to_json, state_delta, state_to_json
from statemodel.actions import Action
from statemodel.design import Scope
from statemodel.designs import SEEDS_FINAL
from statemodel.model import Model


def model_walk(seed: int, steps: int = 40) -> list[tuple[Action, dict]]:
    model = Model(SEEDS_FINAL, Scope())
    rng = random.Random(seed)
    state = model.init_states()[5]
    out = []
    for _ in range(steps):
        actions = model.actions(state)
        if not actions:
            break
        action = rng.choice(actions)
        after = model.next_state(state, action)
        out.append((action, state_delta(state, after)))
        state = after
    return out


def write_rank(path: Path, rank: int, walk: list[tuple[Action, dict]]) -> Path:
    model = Model(SEEDS_FINAL, Scope())
    writer = TraceWriter(path)
    writer.write({"kind": "header", "rank": rank, "release": "0.5.23", "design": SEEDS_FINAL.name,
                  "scope": scope_to_json(Scope()), "rids": [f"req-{i}" for i in range(4)],
                  "state": state_to_json(model.init_states()[5])})
    for number, (action, delta) in enumerate(walk, start=1):
        writer.write({"kind": "step", "rank": rank, "step": number, "action": action.name, "args": list(action.args),
                      "where": f"hook@rank{rank}", "new_rids": [], "delta": delta, "violations": []})
    writer.close()
    return path


def test_identical_ranks_agree(tmp_path: Path) -> None:
    walk = model_walk(1)
    paths = [write_rank(tmp_path / f"r{r}.jsonl", r, walk) for r in range(8)]
    result = check_rank_agreement(paths)
    assert result.agree and result.ranks == tuple(range(8)) and result.steps_compared == len(walk)
    assert "all 8 ranks" in result.describe()


def test_the_first_divergent_rank_and_step_are_named(tmp_path: Path) -> None:
    walk = model_walk(2)
    other = model_walk(3)
    first_diff = next(i for i, (a, b) in enumerate(zip(walk, other, strict=False)) if a != b)
    paths = [write_rank(tmp_path / f"r{r}.jsonl", r, walk) for r in range(8) if r != 6]
    paths.append(write_rank(tmp_path / "r6.jsonl", 6, other))
    result = check_rank_agreement(paths)
    assert not result.agree
    d = result.divergence
    assert d is not None and d.rank == 6 and d.step == first_diff + 1
    assert d.agreeing_ranks == (0, 1, 2, 3, 4, 5, 7)
    assert d.line == first_diff + 2  # the header is line 1
    assert "rank 6 diverged first" in result.describe()


def test_a_rank_that_stopped_early_diverges_where_its_trace_ends(tmp_path: Path) -> None:
    walk = model_walk(4)
    paths = [write_rank(tmp_path / f"r{r}.jsonl", r, walk) for r in range(4)]
    paths[2] = write_rank(tmp_path / "short.jsonl", 2, walk[:10])
    d = check_rank_agreement(paths).divergence
    assert d is not None and d.rank == 2 and d.step == 11 and d.actual is None
    assert "stopped before step 11" in d.describe()


def test_two_files_for_one_rank_is_a_clear_error(tmp_path: Path) -> None:
    walk = model_walk(5, steps=5)
    a = write_rank(tmp_path / "a.jsonl", 0, walk)
    b = write_rank(tmp_path / "b.jsonl", 0, walk)
    with pytest.raises(RankTraceError, match="two traces for rank 0"):
        check_rank_agreement([a, b])


def test_truncated_file_is_reported_with_its_line(tmp_path: Path) -> None:
    path = write_rank(tmp_path / "r0.jsonl", 0, model_walk(6, steps=5))
    text = path.read_text()
    path.write_text(text[:-20])
    with pytest.raises(TraceFormatError, match=r"r0.jsonl:6: truncated record"):
        check_rank_agreement([path])


def test_explain_reports_rank_agreement_over_rank_files(tmp_path: Path, capsys) -> None:
    from specflip.cli import main

    walk = model_walk(7)
    paths = [str(write_rank(tmp_path / f"r{r}.jsonl", r, walk)) for r in range(4)]
    assert main(["explain", *paths]) == 0
    assert "rank agreement: all 4 ranks [0, 1, 2, 3] took the same" in capsys.readouterr().out
    paths[3] = str(write_rank(tmp_path / "bad3.jsonl", 3, model_walk(8)))
    assert main(["explain", "--json", *paths]) == 1
    import json

    data = json.loads(capsys.readouterr().out)
    assert data["rank_agreement"]["agree"] is False and data["rank_agreement"]["first_divergence"]["rank"] == 3


def test_replay_counts_a_rank_divergence_as_unexplained(tmp_path: Path) -> None:
    from specflip.replay import explain_guard_traces

    walk = model_walk(9)
    same = [str(write_rank(tmp_path / f"r{r}.jsonl", r, walk)) for r in range(4)]
    agreed = explain_guard_traces(same)
    assert agreed["ranks_agree"] and agreed["unexplained"] == 0
    same[1] = str(write_rank(tmp_path / "odd1.jsonl", 1, model_walk(10)))
    split = explain_guard_traces(same)
    assert not split["ranks_agree"] and split["unexplained"] == 1
    assert split["result"]["rank_agreement"]["first_divergence"]["rank"] == 1
