"""Issue 21: `specflip lint` on bad input and its own output, on real SGLang of each release line here. Bad values,
EAGLE without a draft model and malformed tiers files of every shape (tests/lint_cases.py, one table for every
line) exit 2 with one line, never a traceback; a value SGLang silently rewrites is named. SGLang's warnings and
log lines reach the terminal only with --verbose.

0.5.23: the installed sglang, in this process. 0.5.16: its unpacked source (.cache/sglang-src/0.5.16 or
$SPECFLIP_SGLANG_0_5_16_SRC) under the CPU import stand-ins, as bench/gpu/lint_matrix.py --cpu-0516 runs it, in
subprocesses. 0.5.12: tests/test_lint_v1.py (.venv12)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pytest
from lint_cases import DRIVER, cases, verdict
from sglang_cpu import write_tiny_model_config

from shim.settings import settings

REPO = Path(__file__).resolve().parents[1]
SRC_0_5_16 = Path(settings.SGLANG_0_5_16_SRC.get() or REPO / ".cache" / "sglang-src" / "0.5.16")
# the CPU import stand-ins under which 0.5.16's source imports in .venv (bench/gpu/lint_matrix.py, CPU_0516_PATHS)
PATH_0_5_16 = os.pathsep.join([str(REPO), str(SRC_0_5_16), str(REPO / "stand_ins" / "cpu_sglang_0_5_16"),
                               str(REPO / "stand_ins" / "cpu")])

try:
    _RELEASE = version("sglang")
except PackageNotFoundError:
    _RELEASE = None
needs_0_5_23 = pytest.mark.skipif(_RELEASE != "0.5.23", reason="needs sglang 0.5.23 (scripts/setup.sh)")
needs_0_5_16 = pytest.mark.skipif(not (SRC_0_5_16 / "sglang" / "srt").is_dir(), reason="no sglang 0.5.16 source")

CASE_IDS = [case_id for case_id, _, _ in cases("/m", Path("/m"), write=False)]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[str], dict[str, Any]]]:
    root = tmp_path_factory.mktemp("lint-bad-input")
    model = str(write_tiny_model_config(root / "model"))
    return {case_id: (argv, want) for case_id, argv, want in cases(model, root / "tiers")}


@needs_0_5_23
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_0_5_23(table: dict[str, tuple[list[str], dict[str, Any]]], case_id: str, capsys: pytest.CaptureFixture[str],
                monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from specflip.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    argv, want = table[case_id]
    code = main(argv)
    out, err = capsys.readouterr()
    assert verdict("0.5.23", want, code, out, err) is None, verdict("0.5.23", want, code, out, err)


def _env_0_5_16(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XDG_CACHE_HOME")}
    return {**env, "PYTHONPATH": PATH_0_5_16, "XDG_CACHE_HOME": str(cache), "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def results_0_5_16(table: dict[str, tuple[list[str], dict[str, Any]]],
                   tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every case through the CLI's main() on 0.5.16, in one subprocess (its import costs seconds)."""
    root = tmp_path_factory.mktemp("lint-0516")
    result = root / "results.json"
    argvs = json.dumps([table[c][0] for c in CASE_IDS])
    done = subprocess.run([sys.executable, "-c", DRIVER, str(result)], input=argvs,
                          env=_env_0_5_16(root / "cache"), cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and result.is_file(), done.stderr[-3000:]
    return dict(zip(CASE_IDS, json.loads(result.read_text()), strict=True))


@needs_0_5_16
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_0_5_16(table: dict[str, tuple[list[str], dict[str, Any]]], results_0_5_16: dict[str, dict[str, Any]],
                case_id: str) -> None:
    run = results_0_5_16[case_id]
    problem = verdict("0.5.16", table[case_id][1], run["code"], run["out"], run["err"])
    assert problem is None, problem


@needs_0_5_16
def test_0_5_16_prints_its_own_lines_only_and_sglangs_with_verbose(tmp_path: Path) -> None:
    """The CLI as a process on 0.5.16: its one line on stdout and nothing on stderr; with --verbose SGLang's own
    warnings and log lines on stderr, and the same stdout."""
    model = str(write_tiny_model_config(tmp_path / "model"))
    argv = [sys.executable, "-m", "specflip.cli", "lint", "--model-path", model, "--speculative-draft-model-path",
            model, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk",
            "1", "--speculative-num-draft-tokens", "4"]
    env = _env_0_5_16(tmp_path / "cache")
    quiet = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert quiet.stderr == "" and quiet.stdout.startswith("ok: sglang 0.5.16") and len(quiet.stdout.splitlines()) == 1
    loud = subprocess.run([*argv, "--verbose"], env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert loud.returncode == 0 and loud.stdout == quiet.stdout
    assert "Max running requests is reset to 48" in loud.stderr  # SGLang 0.5.16's own log line
    assert "UserWarning" in loud.stderr  # and its import-time warnings
