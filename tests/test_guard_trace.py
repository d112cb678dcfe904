"""Trace schema, `specflip explain` and the guard's configuration: no SGLang needed.

Traces here are written from walks of the model itself (statemodel.actions.enabled/apply), in the
guard's schema; tampering with one record must make explain name that record.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from shim.guard.core import Mode
from shim.guard.runtime import ConfigError, GuardRuntime, mode_from_env
from shim.guard.trace import (
    TRACE_VERSION,
    TraceFormatError,
    TraceWriter,
    apply_delta,
    scope_to_json,
    state_delta,
    state_delta_json,
    state_from_json,
    state_to_json,
)
from specflip.cli import main as cli_main
from specflip.explain import explain_traces
from specflip.trace_reader import read_records
from statemodel.actions import apply, enabled, initial_states
from statemodel.design import Scope
from statemodel.designs import CATCH_UP, SHIPPED

SCOPE = Scope()


def walk(design: object, steps: int, seed: int) -> list[tuple[object, object, object]]:
    rng = random.Random(seed)
    state = initial_states(design, SCOPE)[0]
    out = []
    for _ in range(steps):
        choices = enabled(state, design, SCOPE)
        if not choices:
            break
        action = rng.choice(choices)
        after = apply(state, action, design, SCOPE)
        out.append((state, action, after))
        state = after
    return out


def write_trace(path: Path, design: object = CATCH_UP, steps: int = 60, seed: int = 1) -> list[str]:
    transitions = walk(design, steps, seed)
    first = transitions[0][0]
    lines = [json.dumps({"v": TRACE_VERSION, "kind": "header", "rank": 0, "release": "model", "design": design.name,
                         "scope": scope_to_json(SCOPE), "rids": [f"r{i}" for i in range(len(first.requests))],
                         "state": state_to_json(first)})]
    for number, (before, action, after) in enumerate(transitions, start=1):
        lines.append(json.dumps({"v": TRACE_VERSION, "kind": "step", "rank": 0, "step": number, "action": action.name,
                                 "args": list(action.args), "where": "model", "new_rids": [],
                                 "delta": state_delta(before, after), "violations": []}))
    path.write_text("\n".join(lines) + "\n")
    return lines


@pytest.mark.parametrize("design", SHIPPED, ids=lambda d: d.name)
def test_state_json_round_trips(design: object) -> None:
    for before, _, after in walk(design, 40, 3):
        assert state_from_json(json.loads(json.dumps(state_to_json(after)))) == after
        assert apply_delta(before, json.loads(json.dumps(state_delta(before, after)))) == after


@pytest.mark.parametrize("design", SHIPPED, ids=lambda d: d.name)
def test_delta_text_is_the_delta(design: object, tmp_path: Path) -> None:
    """The guard writes deltas as text built directly (state_delta_json); it must read back as exactly
    state_delta's dict, statuses and booleans included, through the writer and the reader."""
    transitions = walk(design, 60, 5)
    writer = TraceWriter(tmp_path / "t.jsonl")
    first = transitions[0][0]
    writer.write({"kind": "header", "rank": 0, "release": "model", "design": design.name,
                  "scope": scope_to_json(SCOPE), "rids": [], "state": state_to_json(first)})
    for number, (before, _, after) in enumerate(transitions, start=1):
        assert json.loads(state_delta_json(before, after)) == state_delta(before, after)
        writer.write({"kind": "refine", "rank": 0, "step": number, "where": "model", "action": "x",
                      "delta": state_delta_json(before, after), "violations": []})
    writer.close()
    records = [record for _, record in read_records(tmp_path / "t.jsonl")][1:]
    assert [r["delta"] for r in records] == [state_delta(b, a) for b, _, a in transitions]
    assert {r["step"] for r in records} == set(range(1, len(transitions) + 1))
    assert any(r["delta"].get("requests") for r in records)
    # the bool is written as a JSON bool (1 == True would hide an int), statuses as their values
    written = [req for r in records for req in r["delta"].get("requests", {}).values()]
    assert {type(req["draft_hidden_ready"]) for req in written} == {bool}
    assert {type(req["kv_held"]) for req in written} == {int}


def test_model_walk_trace_conforms_and_reports_coverage(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path)
    report = explain_traces([path])
    assert report.conforms, report.render()
    assert report.covered["arrive"] >= 1 and sum(report.covered.values()) == report.files[0].steps
    assert "the trace conforms" in report.render()


def test_tampered_step_is_the_first_illegal_step(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = write_trace(path)
    target = next(i for i, line in enumerate(lines) if json.loads(line).get("action") == "prefill")
    record = json.loads(lines[target])
    record["delta"]["kv_free"] = record["delta"].get("kv_free", 11) - 1  # one slot vanishes
    lines[target] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    report = explain_traces([path])
    assert not report.conforms
    first = report.first_illegal[0]
    assert (first.line, first.action, first.violations[0].invariant) == (target + 1, "prefill", "kv_conservation")


def test_a_finding_the_guard_recorded_is_reported_though_the_states_conform(tmp_path: Path) -> None:
    """Slot identity and token checks read what a trace does not hold: explain reports what the guard recorded (as a
    warn-mode server's trace of a freed live slot has it) instead of calling the trace conforming."""
    path = tmp_path / "t.jsonl"
    lines = write_trace(path)
    target = next(i for i, line in enumerate(lines) if json.loads(line).get("action") == "prefill")
    record = json.loads(lines[target])
    record["violations"] = [{"invariant": "slots_freed_owned", "message": "flip_off freed [44, 45), which it still "
                             "holds", "rids": ["r0"], "expected": "freed [40, 44)", "actual": "freed [41, 45)"}]
    lines[target] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    report = explain_traces([path])
    assert not report.conforms
    first = report.first_illegal[0]
    assert (first.line, first.action, first.rids) == (target + 1, "prefill", ("r0",))
    assert first.violations[0].invariant == "slots_freed_owned" and "recorded by the guard" in report.render()


def test_action_from_the_wrong_stage_is_illegal(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = write_trace(path)
    record = json.loads(lines[1])
    record["action"], record["args"] = "verify", []
    lines[1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    first = explain_traces([path]).first_illegal[0]
    assert first.line == 2 and first.violations[0].invariant == "legal_transition"


@pytest.mark.parametrize(("mangle", "line", "words"), [
    (lambda ls: ls[:3] + [ls[3][:20]], 4, "truncated"),
    (lambda ls: ls[:2] + ["{not json"] + ls[3:], 3, "not JSON"),
    (lambda ls: ls[1:], 1, "starts with a header"),
    (lambda ls: [ls[0].replace(f'"v": {TRACE_VERSION}', '"v": 99')] + ls[1:], 1, "schema version 99"),
    (lambda ls: ls[:2] + [json.dumps({"v": TRACE_VERSION, "kind": "step", "rank": 0})] + ls[3:], 3, "lacks"),
])
def test_malformed_trace_names_the_line(tmp_path: Path, mangle: object, line: int, words: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    lines = mangle(write_trace(path))
    text = "\n".join(lines) + ("" if words == "truncated" else "\n")
    path.write_text(text)
    if line == 1:  # not a trace at all: nothing to explain
        with pytest.raises(TraceFormatError) as excinfo:
            explain_traces([path])
        assert excinfo.value.line == line and words in str(excinfo.value)
    else:  # a trace that breaks after its header: explained up to the break, which is reported
        report = explain_traces([path])
        assert len(report.breaks) == 1 and report.breaks[0].startswith(f"{path}:{line}:") and words in report.breaks[0]
        assert report.files[0].steps == line - 2 and not report.conforms
    assert cli_main(["explain", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"t.jsonl:{line}:" in err[0]


def test_cli_exit_codes_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path)
    assert cli_main(["explain", "--json", str(path), str(path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["conforms"] and len(data["files"]) == 2


def test_mode_parsing() -> None:
    assert mode_from_env({}) is Mode.OFF
    assert mode_from_env({"SPECFLIP_MODE": "Assert"}) is Mode.ASSERT
    with pytest.raises(ConfigError, match="expected one of off, warn, assert, trace"):
        mode_from_env({"SPECFLIP_MODE": "loud"})
    with pytest.raises(ConfigError, match="no design named"):
        GuardRuntime.from_env({"SPECFLIP_MODE": "warn", "SPECFLIP_DESIGN": "nope"})
    rt = GuardRuntime.from_env({"SPECFLIP_MODE": "trace"})
    assert rt.trace_template == "specflip-trace.rank{rank}.jsonl"


def test_register_in_off_mode_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import shim.guard.runtime
    import shim.plugin

    saved = shim.guard.runtime.current()
    shim.guard.runtime.install(None)
    try:
        monkeypatch.setenv("SPECFLIP_MODE", "off")
        shim.plugin.register()
        assert shim.guard.runtime.current() is None
    finally:
        shim.guard.runtime.install(saved)


H200_OVERLAP_TRACE = Path(__file__).parent / "regressions" / "recorded" / "guard_trace_h200_overlap_excerpt.jsonl.gz"


def _unpack_h200_overlap_trace() -> list[str]:
    import gzip

    return gzip.decompress(H200_OVERLAP_TRACE.read_bytes()).decode().splitlines()


def test_guard_trace_recorded_on_the_h200_under_overlap_conforms(tmp_path: Path) -> None:
    # the first 1,287 steps of the guard's trace in the 2026-11-29 (44eaff4) run's replay on a live 0.5.16 server with
    # the overlap schedule and the specflip switch (docs/archive/gpu-results.md, "2026-11-29, 44eaff4", call 2)
    path = tmp_path / "h200.jsonl"
    path.write_text("\n".join(_unpack_h200_overlap_trace()) + "\n")
    report = explain_traces([path])
    assert report.conforms, report.render()
    assert report.files[0].designs == ("v2_switch_reserve_sync_overlap",)
    assert report.files[0].releases == ("0.5.16",)
    for action in ("process_result", "flip_off", "flip_on", "plain_decode", "draft_sync", "verify", "finish"):
        assert report.covered.get(action, 0) > 0, action


def test_one_wrong_seq_len_in_the_h200_overlap_trace_is_found(tmp_path: Path) -> None:
    lines = _unpack_h200_overlap_trace()
    target = next(i for i, line in enumerate(lines) if '"action":"process_result"' in line
                  and '"seq_len"' in line and i > 200)
    record = json.loads(lines[target])
    rid, req = next(iter(record["delta"]["requests"].items()))
    req["seq_len"] += 1  # the result claims one token more than the round accepted
    lines[target] = json.dumps(record)
    path = tmp_path / "h200_bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = explain_traces([path])
    assert not report.conforms
    first = report.first_illegal[0]
    assert first.line == target + 1 and first.action == "process_result"
    assert {v.invariant for v in first.violations} == {"seq_lens_growth"}


def test_an_illegal_step_before_a_break_is_a_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    lines = write_trace(path)
    record = json.loads(lines[1])
    record["action"], record["args"] = "verify", []
    lines[1] = json.dumps(record)
    path.write_text("\n".join(lines[:4]) + "\n" + lines[4][:20])  # and the writer died mid-line 5
    assert cli_main(["explain", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "first illegal step" in out and "the trace breaks at" in out and f"{path}:5" in out
    assert len(err.strip().splitlines()) == 1 and "t.jsonl:5: truncated record" in err
