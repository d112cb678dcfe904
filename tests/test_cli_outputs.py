"""No lost files, no tracebacks (issue 50): every case runs the real `specflip` command line in a fresh process (as a
user types it) from a directory of the user's own files, and ends in the documented exit code with one line on
stderr, no traceback, and every file of the user's as it was (nothing added, nothing changed, nothing removed)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specflip.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "specflip" / "examples"


def snapshot(root: Path) -> dict[str, str]:
    """Every file and directory under `root`, with a digest of each file's bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The user's working directory, holding a trace of theirs (1.77 MB, as in the issue) and a notes file."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "trace.jsonl").write_bytes(os.urandom(1_770_000))
    (work / "notes.json").write_text('{"mine": true}\n')
    return work


def specflip(cwd: Path, *argv: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """`specflip argv...` as its own process in `cwd` (this checkout's code first; caches outside `cwd`)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           "XDG_CACHE_HOME": str(cwd.parent / "cache"), "HOME": str(cwd.parent)}
    return subprocess.run([sys.executable, "-m", "specflip.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def one_line_exit_2(done: subprocess.CompletedProcess[str], *words: str) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# --- replay: the files it writes -----------------------------------------------------------------------------------


def test_replay_never_overwrites_a_file_it_did_not_write(home: Path) -> None:
    before = snapshot(home)
    done = specflip(home, "replay", "--schedules", "2", "--save-schedules", "trace.jsonl")
    one_line_exit_2(done, "specflip replay:", "trace.jsonl already exists and was not written by specflip",
                    "--save-schedules")
    # --out is checked before any request is sent (the server here does not exist: no time is spent on it)
    done = specflip(home, "replay", "--schedules", "2", "--url", "http://127.0.0.1:9", "--out", "notes.json")
    one_line_exit_2(done, "notes.json already exists and was not written by specflip", "--out")
    assert snapshot(home) == before


def test_replay_replaces_its_own_schedules_file(home: Path) -> None:
    before = snapshot(home)
    assert specflip(home, "replay", "--schedules", "2", "--save-schedules", "mine/s.json").returncode == 0
    done = specflip(home, "replay", "--schedules", "4", "--save-schedules", "mine/s.json")
    assert done.returncode == 0 and done.stderr == "" and "wrote 4 schedules" in done.stdout
    saved = json.loads((home / "mine" / "s.json").read_text())
    assert saved["written_by"] == "specflip replay --save-schedules" and len(saved["schedules"]) == 4
    # what it wrote is what --schedules-file reads back; nothing else of the user's changed, no .hypothesis/ left
    done = specflip(home, "replay", "--schedules-file", "mine/s.json", "--save-schedules", "mine/again.json")
    assert done.returncode == 0 and "wrote 4 schedules" in done.stdout
    assert {k: v for k, v in snapshot(home).items() if not k.startswith("mine")} == before


@pytest.mark.parametrize(("target", "words"), [
    (".", "schedules file . is a directory"),
    ("", "--save-schedules is empty"),
    ("/proc/specflip-cannot-be-here/s.json", "cannot create directory of the schedules file /proc/specflip-cannot"),
    ("/proc/specflip.json", "cannot write the schedules file /proc/specflip.json"),  # /proc takes no new file
])
def test_replay_save_schedules_onto_a_directory_or_an_unwritable_place(home: Path, target: str, words: str) -> None:
    before = snapshot(home)
    one_line_exit_2(specflip(home, "replay", "--schedules", "2", "--save-schedules", target), words)
    assert snapshot(home) == before


def test_replay_launch_keeps_a_server_log_of_the_users(home: Path) -> None:
    (home / "traces").mkdir()
    (home / "traces" / "server.log").write_text("my server's log\n")
    before = snapshot(home)
    done = specflip(home, "replay", "--launch", "--trace-dir", "traces", "--server-arg=--model-path",
                    "--server-arg=nowhere")
    one_line_exit_2(done, "server.log already exists and was not written by specflip", "--launch")
    assert snapshot(home) == before


def test_replay_leaves_no_hypothesis_directory(home: Path) -> None:
    before = snapshot(home)
    done = specflip(home, "replay", "--schedules", "4", "--save-schedules", "s.json")
    assert done.returncode == 0
    after = snapshot(home)
    assert set(after) - set(before) == {"s.json"}, sorted(set(after) - set(before))


# --- the other commands --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "words"), [
    (["check", "--simulate", "99999999999999999999999"], "argument --simulate: must be at most 1,000,000"),
    (["check", "--simulate", "10", "--depth", "100000000"], "argument --depth: must be at most 100,000"),
    (["check", "--reports-dir", ""], "--reports-dir is empty"),
    (["replay", "--schedules", "1000000000", "--save-schedules", "s.json"], "--schedules: must be at most 10,000"),
    (["replay", "--t-off", "1000000000", "--save-schedules", "s.json"], "--t-off: must be at most 1,024"),
    (["lint", "--model-path", "m", "--specflip-t-off", "abc"], "specflip lint: argument --specflip-t-off: not an"),
    (["lint", "--model-path", "m", "--specflip-spec-cap", "1e3"], "specflip lint: argument --specflip-spec-cap"),
    (["calibrate", "--margin", "1e308", "trace.jsonl"], "--margin must be from 0 to 1"),
    (["diagram", "--out", ""], "--out is empty"),
    (["ranks", "", "trace.jsonl"], "an empty trace path"),
    (["explain", ""], "an empty trace path"),
    (["replay", "--schedules-file", ""], "--schedules-file is empty"),
    (["replay", "--recorded", ""], "--recorded is empty"),
    (["replay", "--recorded", "notes.json", "--trace-dir", "nowhere"], "--trace-dir 'nowhere' is not a directory"),
])
def test_a_bad_value_is_one_line_exit_2_and_no_file_changes(home: Path, argv: list[str], words: str) -> None:
    before = snapshot(home)
    line = one_line_exit_2(specflip(home, *argv), words)
    assert line.startswith(f"specflip {argv[0]}: "), line
    assert snapshot(home) == before


def _sglang_release() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


needs_sglang = pytest.mark.skipif(_sglang_release() not in ("0.5.23", "0.5.16", "0.5.12"),
                                  reason="needs a supported sglang (scripts/setup.sh)")


@needs_sglang
@pytest.mark.parametrize(("value", "words"), [
    ("100000000000000000000", "--speculative-num-steps 100000000000000000000: must be at most 2,147,483,647"),
    ("1e20", "--speculative-num-steps 1e20: not an integer"),
    ("3.0", "--speculative-num-steps 3.0: not an integer"),
])
def test_lint_refuses_a_launch_value_out_of_range(home: Path, value: str, words: str) -> None:
    model = str(EXAMPLES / "lint" / "target")
    done = specflip(home, "lint", "--model-path", model, "--speculative-draft-model-path",
                    str(EXAMPLES / "lint" / "draft"), "--speculative-algorithm", "EAGLE3",
                    "--speculative-num-steps", value, "--speculative-eagle-topk", "1",
                    "--speculative-num-draft-tokens", "4")
    one_line_exit_2(done, "specflip lint: ", words)


@needs_sglang
def test_lint_model_config_that_is_not_text(home: Path) -> None:
    (home / "model").mkdir()
    (home / "model" / "config.json").write_bytes(bytes(range(128, 256)))
    before = snapshot(home)
    done = specflip(home, "lint", "--model-path", "model", "--speculative-draft-model-path", "model",
                    "--speculative-algorithm", "EAGLE")
    one_line_exit_2(done, "specflip lint: the model config model/config.json is not text")
    assert snapshot(home) == before


# --- check: where the proof reports go by default --------------------------------------------------------------------


@pytest.fixture
def no_checking(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The exhaustive check itself (a minute of CPU) replaced by no designs: these tests are about where reports go."""
    import proofs.verdicts

    written: list[Any] = []
    monkeypatch.setattr(proofs.verdicts, "run_designs", lambda *args, **kwargs: [])
    monkeypatch.setattr(proofs.verdicts, "write_reports", lambda verdicts, directory: written.append(directory))
    return written


def test_check_writes_no_reports_when_run_outside_its_checkout(home: Path, no_checking: list[Any],
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(home)
    assert cli_main(["check"]) == 0
    out = capsys.readouterr().out
    assert no_checking == [] and "proof reports not written: run from specflip's checkout" in out
    # from inside the checkout (README's first command), or with --reports-dir, they are written
    monkeypatch.chdir(REPO / "docs")
    assert cli_main(["check"]) == 0
    assert no_checking == [REPO / "proofs" / "reports"] and "proof reports written to" in capsys.readouterr().out
    monkeypatch.chdir(home)
    assert cli_main(["check", "--reports-dir", str(home / "reports")]) == 0
    assert no_checking[-1] == home / "reports"


def test_check_help_says_where_reports_go(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["check", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "written only when run from inside that checkout" in out and "at most 1,000,000" in out


# --- the shipped examples ------------------------------------------------------------------------------------------


def test_ranks_runs_on_the_shipped_example(home: Path) -> None:
    done = specflip(home, "ranks", str(EXAMPLES / "ranks"))
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    assert "flip 4:" in done.stdout and done.stdout.strip().splitlines()[-1].startswith("OK: all 2 ranks [0, 1]")
    help_text = specflip(home, "ranks", "--help").stdout
    assert f"specflip ranks {EXAMPLES / 'ranks'}" in " ".join(help_text.split())


@needs_sglang
def test_lint_runs_on_the_shipped_example(home: Path) -> None:
    help_text = " ".join(specflip(home, "lint", "--help").stdout.split())
    argv = ["--model-path", str(EXAMPLES / "lint" / "target"), "--speculative-draft-model-path",
            str(EXAMPLES / "lint" / "draft"), "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--specflip-auto"]
    assert "specflip lint " + " ".join(argv[:4]) in help_text.replace("\\ ", "")
    done = specflip(home, "lint", *argv)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    assert done.stdout.startswith("ok: sglang ") and "EAGLE3" in done.stdout and "(auto) fit" in done.stdout
