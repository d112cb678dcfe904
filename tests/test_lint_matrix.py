"""bench/gpu/lint_matrix.py, the start-up matrix runner, on CPU: its dry run lints configurations of the 0.5.16
matrix against the 0.5.16 source (.cache/sglang-src/0.5.16, unpacked by scripts/setup.sh, under the import
stand-ins of stand_ins/cpu_sglang_0_5_16) in one process, and its comparison of a prediction with an outcome.
This is also the 0.5.16 adapter's build_server_args/read_sizing running on SGLang 0.5.16's own ServerArgs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench" / "gpu"))
import lint_matrix  # noqa: E402

from shim.settings import settings  # noqa: E402

SRC_0_5_16 = Path(settings.SGLANG_0_5_16_SRC.get() or REPO / ".cache" / "sglang-src" / "0.5.16")


def test_verdicts() -> None:
    v = lint_matrix.verdict
    assert v("serves", "serves", False) == "match" and v("serves", "dies-at-startup", False) == "MISMATCH"
    assert v("dies-at-startup", "dies-at-first-request", False) == "match"
    assert v("dies-at-startup", "serves", False) == "MISMATCH"
    assert v("bad-input", "serves", False) == "stricter" and v("bad-input", "dies-at-startup", False) == "match"
    assert v("serves", "timeout", False) == "uncounted" and v("serves", "not-run", False) == "uncounted"
    assert v("bad-input", "serves", True) == "control"


def test_matrix_files_are_big_enough_and_expand(tmp_path: Path) -> None:
    for name, line in (("lint_matrix_0516.json", "0.5.16"), ("lint_matrix_0512.json", "0.5.12")):
        matrix = lint_matrix.load_matrix(REPO / "bench" / "gpu" / name)
        assert matrix["line"] == line and len([c for c in matrix["configs"] if not c.get("control")]) >= 30
        for c in matrix["configs"]:
            spec = lint_matrix.expand(c, models="/m", tiers_dir=tmp_path, port=1, line=line)
            assert "@" not in " ".join(spec["launch"])  # @EAGLE3 / @TIERS expanded
            if "SPECFLIP_SWITCH" in c.get("env", {}):
                assert "--specflip-t-off" in spec["lint_flags"]  # the switch's env reaches lint as its flags


@pytest.mark.skipif(not (SRC_0_5_16 / "sglang" / "srt").is_dir(), reason="no sglang 0.5.16 source unpacked")
def test_dry_run_predicts_the_h200_start_up_death_on_0_5_16(tmp_path: Path) -> None:
    """The configuration lint had called fit and that died at start-up on the H200 (default tiers, launch steps
    3) is now predicted to die there; the widest launch and the <= 3 tiers the H200 served are predicted to serve."""
    models = tmp_path / "models"
    for sub in ("target", "draft"):
        (models / sub).mkdir(parents=True)
        (models / sub / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM" if sub == "target" else "LlamaForCausalLMEagle3"],
            "model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 8 if sub == "target" else 1, "vocab_size": 2048,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}))
    only = ["adaptive_known_h200_death", "adaptive_default_7_8", "adaptive_le3", "static_steps_only",
            "eagle3_without_draft_model", "adaptive_topk2_dropped", "switch_reenable_above_cap"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["SPECFLIP_SGLANG_0_5_16_SRC"] = str(SRC_0_5_16)
    done = subprocess.run([sys.executable, str(REPO / "bench" / "gpu" / "lint_matrix.py"),
                           str(REPO / "bench" / "gpu" / "lint_matrix_0516.json"), "--dry-run", "--cpu-0516",
                           "--lint-one-process", "--models", str(models), "--out", str(tmp_path / "out"),
                           "--only", ",".join(only)], capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    jsonl = (tmp_path / "out" / "lint_matrix_0516.jsonl").read_text().splitlines()
    rows = {r["name"]: r for r in map(json.loads, jsonl)}
    predicts = {n: rows[n]["lint"]["predicts"] for n in only}
    assert predicts == {"adaptive_known_h200_death": "dies-at-startup", "adaptive_default_7_8": "serves",
                        "adaptive_le3": "serves", "static_steps_only": "dies-at-startup",
                        "eagle3_without_draft_model": "bad-input", "adaptive_topk2_dropped": "serves",
                        "switch_reenable_above_cap": "serves"}
    death = rows["adaptive_known_h200_death"]["lint"]
    assert death["exit"] == 1 and death["findings"] == [["shapes_agree", "startup"]]
    assert "needs 384 logits rows (48 requests x 8), sized 192 rows" in death["lines"][0]
    assert "SGLang drops --speculative-adaptive" in rows["adaptive_topk2_dropped"]["lint"]["lines"][0]
    assert "LINT_MATRIX 0.5.16: 7 configs" in done.stdout
