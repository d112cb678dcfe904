"""`worker_kind` names the EAGLE worker SGLang itself builds: on each line, real ServerArgs resolved as
`python -m sglang.launch_server argv` resolves them (lint's `build_server_args`), and SGLang's own
`SpeculativeAlgorithm.create_worker` on them, in a subprocess on the line's own interpreter and folders (the release
conformance run's set-up, tests/test_release_conformance.py; skipped where the line is not installed).

The line that still ships the v1 EAGLEWorker builds it wherever resolution left the overlap schedule off: for
SGLANG_ENABLE_SPEC_V2 false, but also for `--disable-overlap-schedule` and for topk > 1 with the variable unset.
`worker_kind` read only the variable, so it named the v2 worker for those two: a server of the v1 worker, taken
for one of the v2 worker. From the first line without it, every setting builds EAGLEWorkerV2."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

# a line not installed skips, which fails a CI run (tests/real_objects_required.py)
pytestmark = pytest.mark.sglang
REPO = Path(__file__).resolve().parents[1]
CHAIN = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
TREE = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6")

SCRIPT = textwrap.dedent("""
    import json, os, sys, tempfile
    from pathlib import Path
    sys.path[:0] = ["tests", "stand_ins/cpu"]
    __import__("line_imports").import_tp_worker_or_stand_ins()
    import sglang_cpu as h
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from shim.releases import installed_release, worker_kind
    from shim.releases.registry import installed_line
    model = str(h.write_tiny_model_config(Path(tempfile.mkdtemp())))
    line = installed_line()
    for spec_v2, args in json.loads(sys.argv[1]):
        os.environ["SGLANG_ENABLE_SPEC_V2"] = spec_v2  # SGLang's EnvBool reads the environment at each get()
        sa = line.build_server_args(["--model-path", model, "--speculative-draft-model-path", model, "--device",
                                     "cpu", "--speculative-algorithm", "EAGLE3", *args])
        algorithm = SpeculativeAlgorithm.from_string(line.launch_value(sa, "speculative_algorithm"))
        print("RESULT", json.dumps([spec_v2, args, {
            "sglang": algorithm.create_worker(sa).__name__, "line": line.worker_kind(os.environ, sa),
            "registry": worker_kind(installed_release(), os.environ, sa),
            "env_only": line.worker_kind(os.environ)}]), flush=True)
""")

V1, V2 = "EAGLEWorker", "EAGLEWorkerV2"


# "1" is the variable unset (EnvBool(True)), spelled out: the 0.5.12 import stand-ins (sglang12_cpu) default it to 0
OVERLAP_OFF = (*CHAIN, "--disable-overlap-schedule")
CASES = (("1", CHAIN), ("0", CHAIN), ("1", OVERLAP_OFF), ("1", TREE))


@functools.cache
def built_on(line: str) -> dict[tuple[str, tuple[str, ...]], dict[str, str]]:
    """For each of CASES: what SGLang `line` builds for EAGLE3 with those flags and SGLANG_ENABLE_SPEC_V2, and what
    specflip names (one subprocess per line)."""
    from test_release_conformance import SETUPS, STAND_INS

    setup = SETUPS[line]
    if setup.missing():
        pytest.skip(f"SGLang {line} is not installed: {', '.join(setup.missing())}")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SPECFLIP_")},
           "PYTHONPATH": os.pathsep.join([*map(str, setup.folders()), str(STAND_INS), str(REPO)])}
    out = subprocess.run([str(REPO / setup.venv / "bin" / "python"), "-c", SCRIPT, json.dumps(CASES)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=300)
    found = [json.loads(t.removeprefix("RESULT ")) for t in out.stdout.splitlines() if t.startswith("RESULT ")]
    assert out.returncode == 0 and len(found) == len(CASES), out.stdout[-2000:] + out.stderr[-3000:]
    return {(spec_v2, tuple(args)): result for spec_v2, args, result in found}


# `env_only`: what the variable alone says (before SGLang parsed its arguments, at plugin load): the v1 worker only
# where it is false
@pytest.mark.parametrize(("spec_v2", "args", "worker"), [
    ("1", CHAIN, V2), ("0", CHAIN, V1), ("1", OVERLAP_OFF, V1), ("1", TREE, V1),
], ids=["default", "spec_v2_off", "overlap_off", "topk_2"])
def test_the_v1_line_names_the_worker_sglang_builds(spec_v2: str, args: tuple[str, ...], worker: str) -> None:
    result = built_on("0.5.12")[spec_v2, args]
    kind = "v1" if worker == V1 else "v2"
    assert result["sglang"] == worker, result
    assert result["line"] == result["registry"] == kind, result
    assert result["env_only"] == ("v1" if spec_v2 == "0" else "v2"), result


@pytest.mark.parametrize("line", ["0.5.16", "0.5.23"])
def test_a_line_without_the_v1_worker_builds_v2_whatever_the_overlap_schedule(line: str) -> None:
    results = built_on(line)
    assert results[("0", CHAIN)]["sglang"] == results[("1", OVERLAP_OFF)]["sglang"] == V2  # SGLang's own answer
    assert all(r == {"sglang": V2, "line": "v2", "registry": "v2", "env_only": "v2"} for r in results.values()), \
        results
