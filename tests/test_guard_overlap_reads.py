"""What a guard step reads under SGLang 0.5.23's overlap schedule (tests/overlap_loop.py: the real loop order, real
FutureMap, real `EAGLEWorkerV2.forward_batch_generation` with the GPU forwards stood in), checked AT THAT STEP
(issue 51's mutation samples of shim/guard/core.py, docs/mutation.md): there the verify is recorded at its launch and
the draft-extend runs behind it on the device, so each is a model step of its own, with its own reading and place."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")
ol = importlib.import_module("overlap_loop")

from shim.guard.core import Mode, SpecFlipViolation  # noqa: E402
from statemodel.designs import CATCH_UP  # noqa: E402

pytestmark = pytest.mark.sglang

VERIFY_WHERE = "EAGLEWorkerV2.verify (TARGET_VERIFY launch)"
DRAFT_EXTEND_WHERE = "EagleDraftWorker._draft_extend_for_decode"


def test_an_overlap_rounds_verify_and_draft_extend_are_traced_where_they_ran(runtime: Any, model_dir: Path,
                                                                          tmp_path: Path) -> None:
    """Trace mode, overlap loop: every speculative round's verify (recorded at its launch, `Guard.verify_launch`) and
    draft-extend (`Guard.draft_extend_starts`) is a step record with the place it ran (what a finding there names)."""
    trace = tmp_path / "overlap.jsonl"
    gf.configure_guard(runtime, CATCH_UP, mode=Mode.TRACE, trace=trace)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), CATCH_UP)
    drv.accepts = gf.accept_cycle([1, 2, 3, 4])
    drv.add(gf.make_reqs("o", 2, max_new_tokens=12))
    for _ in range(5):
        drv.iteration()
    runtime.reset()
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    places = {(r["action"], r["where"]) for r in steps if r["kind"] == "step" and r["action"] in ("verify",
                                                                                                "draft_extend")}
    assert places == {("verify", VERIFY_WHERE), ("draft_extend", DRAFT_EXTEND_WHERE)}, places


def fault_inside_an_overlap_verify(runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                   fault: Callable[[Any, Any], None]) -> pytest.ExceptionInfo[SpecFlipViolation]:
    """Two overlap-loop requests under CATCH_UP with `fault(batch, allocator)` applied once inside the first verify
    forward (after its launch was checked, before the draft-extend behind it): what the guard raised."""
    build, token = h.make_eagle_verify_input, h._stand_in_token
    armed: list[Any] = []

    def build_and_arm(batch: Any, *args: Any, **kwargs: Any) -> Any:
        armed.append(batch)  # the draft built the verify input: the verify forward comes next
        return build(batch, *args, **kwargs)

    def token_with_fault(*args: Any, **kwargs: Any) -> Any:
        if armed and armed[-1] is not None:
            fault(armed.pop(), drv.pools.allocator)
            armed.append(None)  # once
        return token(*args, **kwargs)

    monkeypatch.setattr(h, "make_eagle_verify_input", build_and_arm)
    monkeypatch.setattr(h, "_stand_in_token", token_with_fault)
    gf.configure_guard(runtime, CATCH_UP)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), CATCH_UP)
    drv.accepts = gf.accept_cycle([1, 2, 3, 4])
    drv.add(gf.make_reqs("o", 2, max_new_tokens=30))
    with pytest.raises(SpecFlipViolation) as excinfo:
        for _ in range(6):
            drv.iteration()
    return excinfo


def leak_three(batch: Any, allocator: Any) -> None:
    allocator.alloc(3)  # owned by nobody


def free_three_free_slots_again(batch: Any, allocator: Any) -> None:
    allocator.free(allocator.free_pages[:3].clone())  # slots already free, freed again: the free list counts them twice


@pytest.mark.parametrize(("fault", "text"), [(leak_three, "3 slots leaked"), (free_three_free_slots_again, None)])
def test_a_pool_fault_in_an_overlap_verify_is_found_at_its_draft_extend(runtime: Any, model_dir: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        fault: Any, text: str | None) -> None:
    """Overlap loop: three slots leak, or three free slots are freed again, inside the verify forward (after its launch
    was checked, before the draft-extend behind it): the draft-extend's step reads the pool (`Guard.draft_extend_starts`
    overlaying it; the pool a speculative round's hooks read once, `pool_in_worker_call`, is read again after an alloc
    or a free) and names it there, not the result's processing that reads the pool next."""
    excinfo = fault_inside_an_overlap_verify(runtime, model_dir, monkeypatch, fault)
    exc = excinfo.value
    assert "before_draft_extend_for_decode" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert (exc.invariant, exc.action) == ("kv_conservation", "draft_extend"), str(exc)
    assert text is None or text in str(exc), str(exc)
    assert str(exc).rstrip().endswith(f" [{DRAFT_EXTEND_WHERE}]"), str(exc)


def test_a_result_processed_with_a_seq_len_one_too_far_is_found_at_its_processing(runtime: Any, model_dir: Path,
                                                                                  ) -> None:
    """Overlap loop: the queued copy of a launched speculative step carries one request's host seq_len one past what
    the step launched from, so its result gives that request one token more than its accepted run. The result's
    processing compares the seq_len of every request the result grows (`Guard.process_result`'s `seq_rids`) and names
    it there: `seq_lens_growth` on `process_result`."""
    gf.configure_guard(runtime, CATCH_UP)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), CATCH_UP)
    drv.accepts = gf.accept_cycle([1, 2, 3, 4])
    drv.add(gf.make_reqs("o", 2, max_new_tokens=30))
    for _ in range(3):
        drv.iteration()
    queued, _ = drv.sched.result_queue[-1]
    assert queued.forward_mode.is_decode() and not queued.spec_algorithm.is_none()
    queued.seq_lens_cpu[0] += 1
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.iteration()
    exc = excinfo.value
    assert "after_normalize_decode_outputs" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert (exc.invariant, exc.action) == ("seq_lens_growth", "process_result"), str(exc)


def test_a_request_wrong_in_an_overlap_verify_is_found_at_its_draft_extend(runtime: Any, model_dir: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Overlap loop: inside the verify forward (after its launch was checked, before the draft-extend behind it) a
    request's allocated length goes one past what it holds, on a reqs list the launch's reading did not read (so the
    draft-extend reads its requests afresh, `observe_requests_in_worker_call`). The draft-extend's step reads them
    (`Guard.draft_extend_starts` passing `reqs` to its step) and names it there, not the result's processing."""

    def allocated_one_past(batch: Any, allocator: Any) -> None:
        batch.reqs = list(batch.reqs)
        batch.reqs[0].kv.kv_allocated_len += 1  # no slot allocated for it

    excinfo = fault_inside_an_overlap_verify(runtime, model_dir, monkeypatch, allocated_one_past)
    exc = excinfo.value
    assert "before_draft_extend_for_decode" in {entry.name for entry in excinfo.traceback}, str(exc)
    assert exc.action == "draft_extend", str(exc)
    assert str(exc).rstrip().endswith(f" [{DRAFT_EXTEND_WHERE}]"), str(exc)
