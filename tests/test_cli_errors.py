"""Bad input, tried as a new user would (issue 19): each case ends in one clear line and the documented exit
code (0 fine, 1 a finding, 2 bad usage or input), never a traceback, and no file specflip did not write is lost.
Every case runs through `specflip.cli.main`, the same entry point as the `specflip` script."""

from __future__ import annotations

import argparse
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


# --- the command line itself -------------------------------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith("specflip ")


@pytest.mark.parametrize("command", ["check", "explain", "ranks", "diagram", "replay", "calibrate"])
def test_every_flag_has_help_and_the_exit_codes_are_listed(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    from specflip.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    for action in sub._actions:
        assert action.help, (command, action.dest)
    code, out, _ = run(capsys, command, "--help")
    assert code == 0 and "exit codes" in out and "2  bad usage or input" in out


@pytest.mark.parametrize(("argv", "words"), [
    (["bogus"], "invalid choice"),
    (["replay", "--schedules", "0"], "--schedules: must be at least 1, got 0"),
    (["replay", "--schedules", "many"], "--schedules: not an integer"),
    (["replay", "--url", "not-a-url"], "--url: not an http(s) URL"),
    (["replay", "--url", "http://127.0.0.1:port"], "--url: not an http(s) URL"),
    (["replay", "--timeout", "-1"], "--timeout: must be more than 0"),
])
def test_a_bad_flag_value_is_one_line_exit_2(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    one_line(err, words)


# --- replay ---------------------------------------------------------------------------------------------------------


def test_replay_thresholds_the_wrong_way_round(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "replay", "--t-off", "2", "--t-on", "6", "--save-schedules", str(tmp_path / "s.json"))
    assert code == 2 and not (tmp_path / "s.json").exists()
    one_line(err, "--t-on must be below --t-off")


@pytest.mark.parametrize(("content", "words"), [
    ('{"runs": 5}', "not a replay report"),
    ("[1, 2]", "not a replay report"),
    ('{"runs": [{"schedule": {}, "outcomes": []}]}', "run 0: malformed schedule"),
    ('{"runs": [{"schedule": {"pattern": "up", "t_off": 6, "t_on": 2, "requests": '
     '[{"arrival_s": 0, "prompt": [5], "max_new_tokens": 2}]}, "outcomes": [{"output_ids": [1]}]}]}',
     "run 0 is not a recorded run"),
    ("\x00\x01 not json", "cannot read recorded report"),
])
def test_replay_recorded_file_of_the_wrong_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                                                 words: str) -> None:
    path = tmp_path / "rec.json"
    path.write_text(content)
    code, _, err = run(capsys, "replay", "--recorded", str(path))
    assert code == 2
    one_line(err, words)


@pytest.mark.parametrize(("content", "words"), [
    (b"\x8e\x00\xff", "cannot read schedules"),
    (b"[1]", "malformed schedule"),
    (b'{"x": 1}', "malformed schedule"),
])
def test_replay_schedules_file_of_the_wrong_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes,
                                                  words: str) -> None:
    path = tmp_path / "schedules.json"
    path.write_bytes(content)
    code, _, err = run(capsys, "replay", "--schedules-file", str(path))
    assert code == 2
    one_line(err, words)


def test_replay_recorded_report_still_judged(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "replay", "--recorded", str(RECORDED / "replay_h200_excerpt.json"))
    assert code == 0 and out.strip().endswith("OK")


# --- writing into a directory the user names ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graphs_once() -> Any:
    """The real `all_graphs()` (about 30 s: it runs the checker), computed once for this module's tests."""
    from specflip.diagrams.graph import all_graphs

    return all_graphs()


@pytest.fixture
def diagram_graphs(graphs_once: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    import specflip.diagrams

    monkeypatch.setattr(specflip.diagrams, "all_graphs", lambda: graphs_once)
    return graphs_once


def test_diagram_out_unwritable_fails_before_rendering(capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import specflip.diagrams

    def built() -> None:
        raise AssertionError("the graphs were built before the output directory was checked")

    monkeypatch.setattr(specflip.diagrams, "all_graphs", built)
    code, _, err = run(capsys, "diagram", "--out", "/proc/specflip-cannot-be-here")
    assert code == 2  # not after building and rendering every graph
    one_line(err, "cannot create diagram directory /proc/specflip-cannot-be-here")


def test_diagram_out_keeps_every_file_of_the_user(tmp_path: Path, diagram_graphs: Any,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from specflip.diagrams import MANIFEST, README

    out = tmp_path / "mine"
    out.mkdir()
    (out / "mode-level.dot").write_text("my own graph\n")  # a name specflip writes, but the user's file
    (out / "notes.svg").write_text("my notes\n")
    (out / "old.dot").write_text("my old graph\n")
    readme = README.read_bytes()
    code, _, err = run(capsys, "diagram", "--out", str(out))
    assert code == 2
    one_line(err, "already holds mode-level.dot, not written by specflip")
    assert (out / "mode-level.dot").read_text() == "my own graph\n"

    (out / "mode-level.dot").unlink()
    code, out_text, err = run(capsys, "diagram", "--out", str(out))
    assert code == 0 and err == [] and "diagram files written" in out_text
    assert (out / "notes.svg").read_text() == "my notes\n" and (out / "old.dot").read_text() == "my old graph\n"
    assert (out / "mode-level.dot").read_text() != "my own graph\n" and (out / MANIFEST).is_file()
    assert README.read_bytes() == readme  # only `--out` docs/diagrams refreshes the README

    # a second run replaces its own files and removes only a file it wrote there before
    (out / "counterexample-gone.dot").write_text("written by an older specflip\n")
    with open(out / MANIFEST, "a") as manifest:
        manifest.write("counterexample-gone.dot\n")
    code, _, err = run(capsys, "diagram", "--out", str(out))
    assert code == 0 and err == []
    assert not (out / "counterexample-gone.dot").exists() and (out / "old.dot").read_text() == "my old graph\n"


def test_check_reports_dir_is_checked_before_the_checking(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import proofs.verdicts

    def checked(*args: object, **kwargs: object) -> None:
        raise AssertionError("the designs were checked before the reports directory")

    monkeypatch.setattr(proofs.verdicts, "run_designs", checked)
    code, out, err = run(capsys, "check", "--reports-dir", "/proc/specflip-cannot-be-here")
    assert code == 2 and out == ""
    one_line(err, "cannot create reports directory")

    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "seeds_final.md").write_text("my notes on the seeds\n")
    code, out, err = run(capsys, "check", "--reports-dir", str(reports))
    assert code == 2 and out == ""
    one_line(err, "already holds seeds_final.md, not written by specflip")
    assert (reports / "seeds_final.md").read_text() == "my notes on the seeds\n"


# --- the guard's settings, through SGLang's own plugin loader ----------------------------------------------------


REPO = Path(__file__).resolve().parents[1]
_LOAD_PLUGINS = ("import sys; sys.path.insert(0, 'stand_ins/cpu'); import sglang.srt.plugins as p; p.load_plugins();"
                 "import shim.guard.runtime as r; print('serving, guard:', r.current())")


def _start_with(env: dict[str, str]) -> Any:
    import subprocess
    import sys

    full = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-c", _LOAD_PLUGINS], cwd=REPO, env=full, capture_output=True, text=True,
                          timeout=300)


def test_a_bad_guard_mode_stops_start_up() -> None:
    done = _start_with({"SPECFLIP_MODE": "asert"})
    assert done.returncode != 0 and "serving" not in done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    one_line(lines[-1:], "SPECFLIP_MODE='asert'", "off, warn, assert, trace", "SPECFLIP_ON_BAD_CONFIG=warn")
    assert "Traceback" not in done.stderr


def test_a_bad_guard_setting_with_the_opt_out_serves_without_the_guard() -> None:
    done = _start_with({"SPECFLIP_MODE": "asert", "SPECFLIP_ON_BAD_CONFIG": "warn"})
    assert done.returncode == 0 and "serving, guard: None" in done.stdout
    assert "specflip guard off: SPECFLIP_MODE='asert'" in done.stderr and "Traceback" not in done.stderr


# --- lint: bad values, malformed tiers, SGLang's rewrites and its own output (issue 21) ------------------------------

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
}


def _sglang_0_5_23() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang") == "0.5.23"
    except PackageNotFoundError:
        return False


needs_sglang = pytest.mark.skipif(not _sglang_0_5_23(), reason="needs sglang 0.5.23 (scripts/setup.sh)")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    return str(d)


@pytest.fixture
def lint_base(tiny: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return ["lint", "--model-path", tiny, "--speculative-draft-model-path", tiny, "--speculative-algorithm", "EAGLE"]


@needs_sglang
@pytest.mark.parametrize(("tiers", "words"), [
    ("[1, 2]", "must be a JSON object of batch-size tiers"),
    ('{"1": null}', "tier '1' must be an object with candidate_steps, not null"),
    ('{"1": [1, 3]}', "tier '1' must be an object with candidate_steps, not an array"),
    ('{"1": {"candidate_steps": [-1]}}', "candidate_steps must be a list of non-negative ints"),
    ('{"1": {"candidate_steps": "1,3"}}', "candidate_steps must be a list of non-negative ints"),
    ('{"one": {"candidate_steps": [1]}}', "at least one integer-string BS key"),
    ("\"tiers\"", "not a string"),
])
def test_lint_malformed_tiers_file(lint_base: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   tiers: str, words: str) -> None:
    path = tmp_path / "tiers.json"
    path.write_text(tiers)
    code, out, err = run(capsys, *lint_base, "--speculative-adaptive", "--speculative-adaptive-config", str(path))
    assert code == 2 and out == ""
    one_line(err, "specflip lint: the adaptive config", words)


@needs_sglang
@pytest.mark.parametrize(("flag", "value"), [
    ("--speculative-num-steps", "0"), ("--speculative-num-steps", "-1"),
    ("--speculative-num-draft-tokens", "0"), ("--speculative-num-draft-tokens", "-2"),
    ("--speculative-eagle-topk", "0"), ("--speculative-eagle-topk", "-1"),
    ("--max-running-requests", "0"), ("--max-running-requests", "-3"),
])
def test_lint_zero_or_negative_value(lint_base: list[str], capsys: pytest.CaptureFixture[str], flag: str,
                                     value: str) -> None:
    others = {"--speculative-num-steps": "3", "--speculative-eagle-topk": "1", "--speculative-num-draft-tokens": "4"}
    others.pop(flag, None)
    argv = [*lint_base, flag, value, *(x for kv in others.items() for x in kv)]
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    one_line(err, f"{flag} {value}: must be at least 1; SGLang 0.5.23 ")


@needs_sglang
def test_lint_zero_value_names_what_sglang_does_with_it(lint_base: list[str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Draft tokens 0 under topk 1 is replaced by steps + 1 without a word; topk 0 is kept as given."""
    code, _, err = run(capsys, *lint_base, "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                       "--speculative-num-draft-tokens", "0")
    assert code == 2
    one_line(err, "--speculative-num-draft-tokens 0: must be at least 1; SGLang 0.5.23 would silently run 4")
    code, _, err = run(capsys, *lint_base, "--speculative-num-steps", "3", "--speculative-eagle-topk", "0",
                       "--speculative-num-draft-tokens", "4")
    assert code == 2
    one_line(err, "--speculative-eagle-topk 0: must be at least 1; SGLang 0.5.23 would run with 0 as given")


@needs_sglang
def test_lint_eagle_without_a_draft_model(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "lint", "--no-cache", "--model-path", tiny, "--speculative-algorithm", "EAGLE")
    assert code == 2 and out == ""
    one_line(err, "--speculative-algorithm EAGLE needs --speculative-draft-model-path")


@needs_sglang
def test_lint_sglang_failing_on_a_partial_launch_triple_is_a_finding_not_a_traceback(
        lint_base: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # SGLang 0.5.23 itself crashes on these in resolution (TypeError, a bare assert): the server would not start
    for flag, value, exc in (("--speculative-num-steps", "3", "TypeError"),
                             ("--speculative-num-draft-tokens", "4", "AssertionError")):
        code, out, err = run(capsys, *lint_base, flag, value)
        assert code == 1 and err == []
        lines = out.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("sglang_refuses: launch:")
        assert exc in lines[0] and "speculative_hook.py:" in lines[0] and f"only {flag} given" in lines[0]


@needs_sglang
def test_lint_names_a_value_sglang_silently_rewrites(lint_base: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*lint_base, "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "9"]
    code, out, err = run(capsys, *argv)
    assert code == 0 and err == []
    note, ok = out.strip().splitlines()
    assert note == "note: --speculative-num-draft-tokens 9 is not what runs: SGLang 0.5.23 replaces it with 4"
    assert ok.startswith("ok: ")
    code, out, _ = run(capsys, *argv, "--json")  # from the cache: the note is derived, not cached
    assert code == 0 and json.loads(out)["notes"] == [note]
    code, out, _ = run(capsys, *argv[:-1], "4")
    assert code == 0 and "note:" not in out


@needs_sglang
def test_lint_prints_its_own_lines_only_and_sglangs_with_verbose(tiny: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", "specflip.cli", "lint", "--model-path", tiny, "--speculative-draft-model-path", tiny,
            "--speculative-algorithm", "EAGLE", "--speculative-adaptive"]
    quiet = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == "" and len(quiet.stdout.splitlines()) == 1
    loud = subprocess.run([*argv, "--verbose"], env=env, capture_output=True, text=True, timeout=300)
    assert loud.returncode == 0 and loud.stdout == quiet.stdout
    assert "Max running requests is reset to 48" in loud.stderr  # SGLang's own warning


def test_lint_help_lists_its_flags_and_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "lint", "--help")
    assert code == 0
    for flag in ("--json", "--no-cache", "--verbose", "--specflip-t-off", "--specflip-draft", "exit codes"):
        assert flag in out
