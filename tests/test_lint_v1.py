"""`specflip lint` on the v1 line: the CLI on REAL sglang 0.5.12 (.venv12, SGLANG_ENABLE_SPEC_V2=0: the v1
EAGLEWorker), resolving 0.5.12's own ServerArgs on CPU. Skipped where the installed sglang is not 0.5.12; in the
.venv12 run (scripts/test.sh) a skip fails it. The start-up matrix (bench/gpu/lint_matrix_0512.json) checks the
same verdicts against real 0.5.12 servers on the GPU host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from lint_cases import cases, verdict

try:
    _RELEASE = version("sglang")
except PackageNotFoundError:
    _RELEASE = None
REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.sglang_v1,
              pytest.mark.skipif(_RELEASE != "0.5.12", reason="needs sglang 0.5.12 (.venv12: scripts/setup-v1.sh)")]

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "torch_dtype": "float32"}
SPEC = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "0")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(TINY))
    m = str(tmp_path / "m")
    return ["lint", "--json", "--model-path", m, "--speculative-draft-model-path", m, "--speculative-algorithm",
            "EAGLE3", "--cuda-graph-max-bs", "16"]


def lint(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict | str]:
    from specflip.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code in (0, 1) else err.strip())


def test_v1_default_candidates_fit(base: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, data = lint(capsys, *base, *SPEC, "--speculative-adaptive")
    assert code == 0 and data["release"] == "0.5.12" and data["predicts"] == "serves"
    sizing = data["sizing"]
    assert [s["steps"] for s in sizing["states"]] == [1, 3, 7] and not sizing["overlap"]
    assert not sizing["switch_after_reserve"]  # the v1 worker: each prepare reserves for the state that runs


def test_v1_single_candidate_dies_at_startup(base: list[str], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "one.json"
    cfg.write_text(json.dumps({"candidate_steps": [3]}))
    code, data = lint(capsys, *base, *SPEC, "--speculative-adaptive", "--speculative-adaptive-config", str(cfg))
    assert code == 1 and data["predicts"] == "dies-at-startup"
    assert data["findings"][0]["rule"] == "sglang_refuses" and "fewer than 2 distinct" in data["lines"][0]


def test_v1_adaptive_dropped_under_topk_2_serves_static(base: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, data = lint(capsys, *base, "--speculative-adaptive", "--speculative-num-steps", "3",
                      "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6")
    assert code == 1 and data["predicts"] == "serves"
    assert "SGLang drops --speculative-adaptive: speculative_eagle_topk=2" in data["lines"][0]


def test_v1_partial_triple_fails_in_resolution_and_zero_is_named(base: list[str],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, data = lint(capsys, *base, "--speculative-num-steps", "3")
    assert code == 1 and data["predicts"] == "dies-at-startup"
    assert "SGLang 0.5.12's resolution fails on these arguments: TypeError" in data["lines"][0]
    code, err = lint(capsys, *base, "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                     "--speculative-num-draft-tokens", "0")
    assert code == 2 and len(err.splitlines()) == 1
    assert "--speculative-num-draft-tokens 0: must be at least 1; SGLang 0.5.12 would silently run 4" in err


# issue 21's bad inputs on 0.5.12 (tests/lint_cases.py: the table 0.5.23 and 0.5.16 run in test_lint_bad_input.py)
CASES = {case_id: want for case_id, _, want in cases("/m", Path("/m"), write=False)}


@pytest.fixture(scope="module")
def case_argvs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    root = tmp_path_factory.mktemp("lint-bad-input-0512")
    (root / "m").mkdir()
    (root / "m" / "config.json").write_text(json.dumps(TINY))
    return {case_id: argv for case_id, argv, _ in cases(str(root / "m"), root / "tiers")}


@pytest.mark.parametrize("case_id", list(CASES))
def test_v1_bad_input(case_argvs: dict[str, list[str]], case_id: str, tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from specflip.cli import main

    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "0")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    code = main(case_argvs[case_id])
    out, err = capsys.readouterr()
    problem = verdict("0.5.12", CASES[case_id], code, out, err)
    assert problem is None, problem


def test_v1_prints_its_own_lines_only_and_sglangs_with_verbose(tmp_path: Path) -> None:
    """The CLI as a process on 0.5.12: its one line on stdout and nothing on stderr; with --verbose SGLang's own
    warnings and log lines on stderr, and the same stdout."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(TINY))
    m = str(tmp_path / "m")
    argv = [sys.executable, "-m", "specflip.cli", "lint", "--model-path", m, "--speculative-draft-model-path", m,
            "--speculative-algorithm", "EAGLE3", *SPEC]
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(REPO),
           "SGLANG_ENABLE_SPEC_V2": "0", "XDG_CACHE_HOME": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    quiet = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert quiet.stderr == "" and quiet.stdout.startswith("ok: sglang 0.5.12") and len(quiet.stdout.splitlines()) == 1
    loud = subprocess.run([*argv, "--verbose"], env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert loud.returncode == 0 and loud.stdout == quiet.stdout
    assert "Max running requests is reset to 48" in loud.stderr  # SGLang 0.5.12's own log line
    assert "UserWarning" in loud.stderr  # and its import-time warnings
