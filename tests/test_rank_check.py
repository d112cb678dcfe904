"""The guard's per-step rank agreement check under TP > 1 (shim/guard/rank_check.py), on real torch.distributed gloo
groups of two processes on the CPU (tests/tp_rank_process.py): ranks that agree run through; a flip one rank takes
one scheduler step late stops both ranks with one error naming the step and which ranks hold what, and nothing
hangs (a 30 s gloo timeout inside, a subprocess timeout outside)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shim.guard.core import Mode, SpecFlipViolation
from shim.guard.rank_check import (
    ABSENT,
    UNREADABLE,
    RankChecker,
    RankDisagreement,
    disagreement,
    fingerprint,
    rank_check_enabled,
    rids_hash,
)
from shim.guard.runtime import ConfigError, GuardRuntime
from specflip.cli import main as cli_main

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

WORKER = TESTS / "tp_rank_process.py"
FLIP_AT = 21  # tests/tp_rank_process.py: rank 1 flips at step 22, rank 0 at 21


def run_ranks(tmp_path: Path, scenarios: str, *extra: str, world: int = 2,
              timeout: float = 300) -> list[dict[str, dict[str, Any]]]:
    """Start `world` real processes of one gloo group running `scenarios` (comma-separated) in turn; their results,
    by rank, then by scenario. A hang fails here (the timeout)."""
    pytest.importorskip("torch.distributed")
    init = tmp_path / "group.init"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(world), str(init), scenarios,
                               str(tmp_path / f"rank{r}.json"), *extra], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = []
    for r, p in enumerate(procs):
        out = tmp_path / f"rank{r}.json"
        assert out.exists(), f"rank {r} wrote no result (exit {p.returncode}):\n{logs[r][-3000:]}"
        results.append(json.loads(out.read_text()))
    return results


# --- the check itself ------------------------------------------------------------------------------------


def fp(step: int, *, spec_on: bool = True, rids: tuple[str, ...] = ("a", "b"), transitions: int = 10) -> Any:
    return fingerprint(step, forward_mode=2, rids=rids, out_cache_loc_width=0 if spec_on else len(rids),
                       spec_algorithm_on=spec_on, spec_decode=spec_on, guard_mode_on=spec_on, guard_num_steps=3,
                       guard_transitions=transitions)


def test_disagreement_names_ranks_and_fields() -> None:
    same = [fp(5).values()] * 4
    assert disagreement(same) is None
    late = [fp(5, spec_on=False, transitions=11).values()] * 3 + [fp(5).values()]
    groups = disagreement(late)
    assert groups is not None and [ranks for _, ranks in groups] == [(0, 1, 2), (3,)]
    checker = RankChecker(lambda values: late, rank=3, world_size=4, mode=Mode.ASSERT)
    with pytest.raises(RankDisagreement) as info:
        checker.check(lambda step: fp(step))
    message = str(info.value)
    assert isinstance(info.value, SpecFlipViolation) and info.value.invariant == "ranks_agree"
    assert "scheduler step 5" in message and "ranks [0, 1, 2] hold" in message and "ranks [3] hold" in message
    assert "differs in tokens, spec_algorithm_on, spec_mode_on, transitions" in message


def test_an_unreadable_step_is_still_exchanged() -> None:
    """An error while reading this rank's step must not skip the exchange (its peers would wait in it): the rank
    sends an unreadable fingerprint, and the disagreement names it."""
    sent: list[tuple[int, ...]] = []

    def exchange(values: tuple[int, ...]) -> list[tuple[int, ...]]:
        sent.append(values)
        return [fp(1).values(), values]

    def broken(step: int) -> Any:
        raise AttributeError("no forward_mode")

    checker = RankChecker(exchange, rank=1, world_size=2, mode=Mode.ASSERT)
    with pytest.raises(RankDisagreement, match=r"ranks \[1\] hold step 1: unreadable"):
        checker.check(broken)
    assert sent == [(1,) + (UNREADABLE,) * 9]


def test_fingerprint_fields() -> None:
    """A plain decode writes out_cache_loc's slots, a verify batch x (steps + 1); no batch and a guard that is off
    say so (ABSENT), and the request ids' digest follows their order."""
    assert fp(1, spec_on=False).tokens == 2 and fp(1).tokens == 2 * 4
    idle = fingerprint(3, forward_mode=None, rids=(), out_cache_loc_width=0, spec_algorithm_on=False,
                       spec_decode=False, guard_mode_on=None, guard_num_steps=None, guard_transitions=None)
    assert (idle.has_batch, idle.batch_size, idle.transitions, idle.spec_mode_on) == (0, 0, ABSENT, ABSENT)
    assert rids_hash(["a", "b"]) != rids_hash(["b", "a"]) and rids_hash(["ab"]) != rids_hash(["a", "b"])
    assert fp(1, rids=("x", "y")).rids_hash != fp(1).rids_hash


def test_rank_check_env() -> None:
    assert rank_check_enabled({}) and not rank_check_enabled({"SPECFLIP_RANK_CHECK": "off"})
    assert not GuardRuntime.from_env({"SPECFLIP_MODE": "assert", "SPECFLIP_RANK_CHECK": "0"}).rank_check
    with pytest.raises(ConfigError, match="SPECFLIP_RANK_CHECK='maybe'"):
        GuardRuntime.from_env({"SPECFLIP_MODE": "assert", "SPECFLIP_RANK_CHECK": "maybe"})


# --- two real processes, gloo ------------------------------------------------------------------------------


def test_two_ranks_agree_then_late_flip_stops_both_then_warn_mode(tmp_path: Path) -> None:
    """Agreeing ranks run through; a late flip raises on both ranks with the same verdict; in warn mode it is logged
    and every rank stops checking at the same step, so no exchange is left waiting for a peer."""
    ranks = run_ranks(tmp_path, "agree,late_flip,warn_late_flip")
    agree = [r["agree"] for r in ranks]
    assert [r["outcome"] for r in agree] == ["ok", "ok"] and [r["checks"] for r in agree] == [40, 40]
    late = [r["late_flip"] for r in ranks]
    for r in late:
        assert r["outcome"] == "RankDisagreement", r
        assert r["step"] == FLIP_AT and r["invariant"] == "ranks_agree"
        assert f"scheduler step {FLIP_AT} on TP rank {r['rank']}" in r["message"]
        assert "ranks [0] hold" in r["message"] and "ranks [1] hold" in r["message"]
        assert [ranks for _, ranks in r["groups"]] == [[0], [1]]
    assert late[0]["groups"] == late[1]["groups"]  # the same verdict on both ranks, from the same gathered list
    for r in (r["warn_late_flip"] for r in ranks):
        assert r["outcome"] == "ok" and r["stopped"] and r["checks"] == FLIP_AT, r
        assert len(r["found"]) == 1 and "ranks [1] hold" in r["found"][0]


@pytest.mark.sglang
def test_guard_adapter_on_real_objects_two_ranks(tmp_path: Path, model_dir: Path) -> None:
    """The real adapter hook over real SGLang 0.5.23 objects with the switch's real plain path, one process per rank:
    the ranks agree through every flip and finish every request; with the fault injection on rank 1 (its first flip
    one scheduler step late: its second flip, back on) both ranks raise RankDisagreement at that step, before the
    step's forward."""
    pytest.importorskip("sglang.srt.managers.schedule_batch")
    ranks = run_ranks(tmp_path, "driver,driver_late_flip", str(model_dir))
    clean = [r["driver"] for r in ranks]
    for r in clean:
        assert r["outcome"] == "ok", r.get("traceback", r)
        assert r["finished"] == r["requests"] == 9 and r["guard_found"] == 0
        assert r["flips"] == ["flip_off", "flip_on", "flip_off", "flip_on"]
    assert clean[0]["checks"] == clean[1]["checks"] >= 60  # one exchange per scheduler iteration
    # each rank's switch flipped at the same scheduler iterations (its own decision, from counts both ranks hold)
    assert clean[0]["flip_iterations"] == clean[1]["flip_iterations"]
    late = [r["driver_late_flip"] for r in ranks]
    steps = {r["step"] for r in late if "step" in r}
    for r in late:
        assert r["outcome"] == "RankDisagreement", r.get("traceback", r)
        assert "ranks [0] hold" in r["message"] and "ranks [1] hold" in r["message"]
        assert "spec_algorithm_on" in r["message"] and "spec_mode_on" in r["message"]
    # the per-rank switch traces, compared as on the GPU host (`specflip ranks DIR`): the same flips at the same
    # scheduler steps on both ranks in the clean run; the fault run's diverge at rank 1's late flip
    assert cli_main(["ranks", str(tmp_path / "switch_driver")]) == 0
    assert cli_main(["ranks", str(tmp_path / "switch_driver_late_flip")]) == 1
    # at the scheduler step where the clean run flipped back on (its second flip), with requests decoding
    assert steps == {clean[0]["flip_iterations"][1]}
    assert "forward_mode 2" in late[0]["message"] and "batch spec on" in late[0]["message"]
