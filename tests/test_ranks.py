"""Rank agreement on per-rank traces written from model walks (synthetic: the transitions come from
the model itself, the file format from shim.guard.trace, as the guard writes it on each rank)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from shim.guard.trace import TraceFormatError, TraceWriter, scope_to_json, state_delta, state_to_json
from specflip.ranks import RankTraceError, check_rank_agreement
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


# --- the switch's per-rank traces (`specflip ranks`, check_switch_agreement), threshold policy: no rank field ---

RECORDED_SWITCH = Path(__file__).parent / "regressions" / "recorded" / "switch_trace_h200_replay.jsonl"


def flip_one_step_late(lines: list[str], which: int) -> list[str]:
    """The trace with its `which`-th flip (0-based) moved after the scheduler step that followed it."""
    at = [n for n, line in enumerate(lines) if '"flip_' in line][which]
    return [*lines[:at], lines[at + 1], lines[at], *lines[at + 2:]]


def test_switch_traces_of_a_threshold_server_agree_and_diverge(tmp_path: Path, capsys) -> None:
    """A recorded H200 switch trace (thresholds) as every rank's: they agree, and the per-flip listing shows each
    flip's scheduler step index, batch and decision on each rank; with rank 2's second flip one step late, the
    ranks diverge at that flip, and the message names the record, the step index and the ranks."""
    import json

    from specflip.cli import main
    from specflip.ranks import RANKS_FROM_ORDER, check_switch_agreement

    lines = RECORDED_SWITCH.read_text().splitlines()
    for rank in range(3):
        (tmp_path / f"switch-{100 + rank}.jsonl").write_text("\n".join(lines) + "\n")
    same = check_switch_agreement([tmp_path])
    assert same.agree and same.ranks == (0, 1, 2) and same.ranks_from == RANKS_FROM_ORDER
    assert same.records_compared == len(lines)
    flips = same.traces[0].flips
    assert [f.decision for f in flips] == ["flip_off", "flip_on", "flip_off", "flip_on", "flip_off"]
    # the step index: decode steps and prefills traced before the flip, counted from the file itself
    first = next(n for n, line in enumerate(lines) if '"flip_' in line)
    assert flips[0].step == sum(1 for line in lines[:first] if json.loads(line)["action"] in ("step", "prefill"))
    assert main(["ranks", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"rank 0 = {tmp_path / 'switch-100.jsonl'}" in out and "no rank field" in out
    assert f"flip 1: {flips[0].describe()} | {flips[0].describe()} | {flips[0].describe()}" in out
    assert out.strip().splitlines()[-1].startswith("OK: all 3 ranks [0, 1, 2]")

    (tmp_path / "switch-102.jsonl").write_text("\n".join(flip_one_step_late(lines, 1)) + "\n")
    split = check_switch_agreement(sorted(tmp_path.glob("*.jsonl")))
    assert not split.agree
    d = split.result.divergence
    assert d is not None and d.rank == 2 and d.agreeing_ranks == (0, 1)
    assert split.traces[2].flips[1].step == flips[1].step + 1
    message = split.describe()
    assert f"rank 2 diverged first, at switch record {d.step} (scheduler step index {flips[1].step}, after flip 1)" \
        in message and "where ranks [0, 1] have flip_on" in message
    assert main(["ranks", "--json", str(tmp_path)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["first_divergence"]["rank"] == 2 and data["first_divergence"]["step_index"] == flips[1].step
    assert data["flips"]["2"][1]["step"] == flips[1].step + 1
    # a rank whose trace ends early diverges at the first record it lacks
    (tmp_path / "switch-102.jsonl").write_text("\n".join(lines[:first]) + "\n")
    cut = check_switch_agreement([tmp_path])
    assert not cut.agree and "rank 2" in cut.describe() and "stopped before" in cut.describe()


def test_switch_traces_bad_input_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    from specflip.cli import main

    assert main(["ranks", str(tmp_path)]) == 2
    assert "no switch-*.jsonl in this directory" in capsys.readouterr().err
    (tmp_path / "switch-1.jsonl").write_text(RECORDED_SWITCH.read_text())
    (tmp_path / "switch-2.jsonl").write_text('["a list"]\n')
    assert main(["ranks", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "switch-2.jsonl:1: a record must be a JSON object, got list" in err
    assert main(["ranks", str(tmp_path), str(tmp_path / "switch-1.jsonl")]) == 2
    assert "given twice" in capsys.readouterr().err
    (tmp_path / "switch-2.jsonl").write_text('{"action": "auto_observe", "rank": 0}\n{"action": "step", "rank": 1}\n')
    assert main(["ranks", str(tmp_path)]) == 2
    assert "records of ranks [0, 1] in one trace" in capsys.readouterr().err
