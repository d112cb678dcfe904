"""Bad input, tried as a new user would (issue 19): each case ends in one clear line and the documented exit
code (0 fine, 1 a finding, 2 bad usage or input), never a traceback, and no file specflip did not write is lost.
Every case runs through `specflip.cli.main`, the same entry point as the `specflip` script."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from specflip.cli import main as cli_main

RECORDED = Path(__file__).parent / "regressions" / "recorded"
GUARD_TRACE_GZ = RECORDED / "guard_trace_h200_overlap_excerpt.jsonl.gz"
SWITCH_TRACE = RECORDED / "switch_trace_h200_replay.jsonl"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    """(exit code, stdout, stderr lines) of `specflip argv...`; argparse's own exit is caught as its code."""
    try:
        code = cli_main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.strip()]


def one_line(err: list[str], *words: str) -> str:
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    for w in words:
        assert w in err[0], (w, err[0])
    return err[0]


# --- explain ---------------------------------------------------------------------------------------------------


def _guard_records(count: int) -> list[dict[str, Any]]:
    lines = gzip.decompress(GUARD_TRACE_GZ.read_bytes()).decode().splitlines()
    return [json.loads(line) for line in lines[:count]]


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_explain_reads_the_repositorys_gzipped_trace(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "explain", str(GUARD_TRACE_GZ))
    assert code == 0 and err == [] and "the trace conforms to the model" in out


def test_explain_on_binary_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(128, 256)) * 4)
    code, _, err = run(capsys, "explain", str(path))
    assert code == 2
    one_line(err, "blob.bin:1:", "not UTF-8")


def test_explain_names_a_switch_trace(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "explain", str(SWITCH_TRACE))
    assert code == 2
    one_line(err, "switch trace", "specflip replay")


def test_explain_a_truncated_trace_up_to_its_break(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = gzip.decompress(GUARD_TRACE_GZ.read_bytes()).decode()
    lines = text.splitlines(keepends=True)
    path = tmp_path / "cut.jsonl"
    path.write_text("".join(lines[:40]) + lines[40][:25])  # the writer died mid-line 41
    code, out, err = run(capsys, "explain", str(path))
    assert code == 2
    one_line(err, "cut.jsonl:41:", "truncated record")
    assert "the trace breaks at" in out and "cut.jsonl:41" in out and "no illegal step before the break" in out
    steps = int(out.split(": ", 1)[1].split(" steps")[0])
    assert steps == sum(1 for line in lines[:40] if '"kind":"step"' in line) > 0


def test_explain_a_cut_gzip_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(GUARD_TRACE_GZ.read_bytes()[:20_000])
    code, out, err = run(capsys, "explain", str(path))
    assert code == 2
    one_line(err, "cut.jsonl.gz:", "gzip stream breaks")
    assert "the trace breaks at" in out


@pytest.mark.parametrize(("mangle", "line", "words"), [
    (lambda rs: rs[0].update(rank="zero"), 1, "'rank' is str"),
    (lambda rs: rs[2].update(args="3"), 3, "'args' is str"),
    (lambda rs: rs[1].update(delta=[1, 2]), 2, "'delta' is list"),
    (lambda rs: rs[0]["state"].update(stage=7), 1, "not a valid Stage"),
    (lambda rs: rs[0]["state"].update(kv_free="lots"), 1, "does not rebuild a model state"),
    (lambda rs: rs[0]["scope"].update(spec_cap=None), 1, "does not rebuild a model state"),
    (lambda rs: rs[1]["delta"].update(requests=[1]), 2, "does not rebuild a model state"),
    (lambda rs: rs[2].update(args=["x"]), 3, "does not rebuild a model state"),
])
def test_explain_record_with_fields_of_the_wrong_type(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      mangle: Any, line: int, words: str) -> None:
    records = copy.deepcopy(_guard_records(6))
    mangle(records)
    code, _, err = run(capsys, "explain", str(_write(tmp_path / "t.jsonl", records)))
    assert code == 2
    one_line(err, f"t.jsonl:{line}:", words)
