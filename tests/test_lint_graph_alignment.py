"""Lint's decode graph sizes are SGLang's own where the attention input is gathered (DP attention: the sizes are
aligned to the attention TP size). On each line, in a subprocess on the line's own interpreter and folders (the
release conformance run's set-up, tests/test_release_conformance.py; skipped where the line is not installed): real
ServerArgs resolved as `python -m sglang.launch_server argv` resolves them (lint's `build_server_args`), lint's
`read_sizing`, and the line's own `get_batch_sizes_to_capture` for the target's verify graphs on them. The model
runner it reads is a stand-in holding the request pool (`req_to_token_pool.size`, one scheduler's: max_running_requests
// the attention DP size) and the ServerArgs; on 0.5.12 the attention TP and CP sizes, which it reads from process
groups lint does not build, are stand-ins giving SGLang's own `compute_dp_attention_world_info`.

TP 4, DP attention over 2, 10 requests, 3 draft tokens: the attention TP size is 2, a scheduler's pool 5. SGLang
rounds the pool up to 6 and keeps the sizes whose tokens (size x 3) are even: 2, 4, 6. Lint said 1 ... 5."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

# a line not installed skips, which fails a CI run (tests/real_objects_required.py)
pytestmark = pytest.mark.sglang
REPO = Path(__file__).resolve().parents[1]
DRAFT_TOKENS = 3
LAUNCH = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", str(DRAFT_TOKENS), "--device", "cuda", "--max-running-requests", "10",
          "--tp-size", "4", "--dp-size", "2", "--enable-dp-attention")

SCRIPT = textwrap.dedent("""
    import json, sys, tempfile
    from pathlib import Path
    from types import SimpleNamespace
    sys.path[:0] = ["tests", "stand_ins/cpu"]
    __import__("line_imports").import_tp_worker_or_stand_ins()
    import sglang_cpu as h
    from shim.releases.registry import installed_line
    model = str(h.write_tiny_model_config(Path(tempfile.mkdtemp())))
    line = installed_line()
    sa = line.build_server_args(["--model-path", model, "--speculative-draft-model-path", model, *sys.argv[2:]])
    sizing = line.read_sizing(sa)  # lint (on 0.5.19 on it publishes the config SGLang's graph runners read)
    print("LINT", json.dumps({"graph_bs": [list(s.graph_bs) for s in sizing.states],
                              "logits_rows": sizing.logits_rows}), flush=True)
    if sys.argv[1] == "lint-only":
        sys.exit(0)
    cfg = line.launch_view(sa)
    try:  # the attention DP size SGLang published (0.5.22 on: resolution keeps it, not enable_dp_attention)
        from sglang.srt.runtime_context import get_parallel

        attn_dp = int(get_parallel().attn_dp_size)
    except ImportError:  # 0.5.12: ModelRunner's own
        attn_dp = int(cfg.dp_size) if cfg.enable_dp_attention else 1
    try:
        from sglang.srt.model_executor.runner import base_cuda_graph_runner as runner_module
    except ImportError:  # 0.5.12, 0.5.13
        from sglang.srt.model_executor import cuda_graph_runner as runner_module
        from sglang.srt.layers.dp_attention import compute_dp_attention_world_info

        attn_tp = compute_dp_attention_world_info(cfg.enable_dp_attention, 0, cfg.tp_size, cfg.dp_size)[1]

        def get_attention_tp_size_cpu_stand_in():  # the attention TP process group's size
            return attn_tp

        def get_attention_cp_size_cpu_stand_in():
            return 1

        runner_module.get_attention_tp_size = get_attention_tp_size_cpu_stand_in
        runner_module.get_attention_cp_size = get_attention_cp_size_cpu_stand_in
    model_runner = SimpleNamespace(req_to_token_pool=SimpleNamespace(size=int(cfg.max_running_requests) // attn_dp),
                                   server_args=sa)
    sglang_bs, _ = runner_module.get_batch_sizes_to_capture(model_runner, int(sys.argv[1]))
    print("SGLANG", json.dumps(list(sglang_bs)), flush=True)
""")


def sizes_on(line: str, width: str = str(DRAFT_TOKENS)) -> dict[str, object]:
    """Lint's sizing on `line` for LAUNCH (`graph_bs` per state, `logits_rows`) and, unless `width` is "lint-only",
    SGLang's own `get_batch_sizes_to_capture` at that width (`sglang`)."""
    from test_release_conformance import SETUPS, STAND_INS

    setup = SETUPS[line]
    if setup.missing():
        pytest.skip(f"SGLang {line} is not installed: {', '.join(setup.missing())}")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SPECFLIP_")},
           "PYTHONPATH": os.pathsep.join([*map(str, setup.folders()), str(STAND_INS), str(REPO)])}
    out = subprocess.run([str(REPO / setup.venv / "bin" / "python"), "-c", SCRIPT, width, *LAUNCH],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    found = {t.split(" ", 1)[0]: json.loads(t.split(" ", 1)[1]) for t in out.stdout.splitlines()
             if t.startswith(("LINT ", "SGLANG "))}
    assert out.returncode == 0 and "LINT" in found, out.stdout[-2000:] + out.stderr[-3000:]
    return {**found["LINT"], "sglang": found.get("SGLANG")}


# 0.5.12: the v1 worker's CudaGraphRunner, the alignment from `require_gathered_buffer(server_args)`; 0.5.13 the same
# for the v2 worker; 0.5.19: the first line whose alignment is read from the published config
# (`get_cuda_graph_batch_size_alignment()`), which lint stamps the derived widths into itself; 0.5.23
@pytest.mark.parametrize("line", ["0.5.12", "0.5.13", "0.5.19", "0.5.23"])
def test_lint_captures_the_sizes_sglang_aligns_to_the_attention_tp_size(line: str) -> None:
    result = sizes_on(line)
    assert result["sglang"] == [2, 4, 6], result  # the pool 5 rounded up to 6; sizes whose 3 tokens each are even
    assert result["graph_bs"] == [result["sglang"]], result
    assert result["logits_rows"] == 6 * DRAFT_TOKENS, result


# 0.5.16: the GPU host's line, whose runner reads the attention sizes from process groups; 0.5.17 (0.5.18 the same):
# whether to align comes from the published config, which lint publishes first (lint failed there before that);
# 0.5.21: the last line before resolution keeps the attention DP size itself (run by hand on 0.5.14, 0.5.18, 0.5.20
# and 0.5.22 too, 2026-12-07). The rule is the one SGLang's own runs above on 0.5.12, 0.5.13, 0.5.19
# and 0.5.23
@pytest.mark.parametrize("line", ["0.5.16", "0.5.17", "0.5.21"])
def test_lint_aligns_on_the_lines_whose_runner_needs_process_groups(line: str) -> None:
    result = sizes_on(line, "lint-only")
    assert result["graph_bs"] == [[2, 4, 6]] and result["logits_rows"] == 6 * DRAFT_TOKENS, result
