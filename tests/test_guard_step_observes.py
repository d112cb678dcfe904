"""Each guard step compares the model's prediction with what the live objects show AT THAT STEP (issue 51's mutation
run of shim/guard/core.py): a step that stopped reading the pool, or the running batch, would still pass every test
that only counts findings, the next step that reads them blaming itself. Here a fault is planted just before one
step on real SGLang 0.5.23 objects (tests/guard_fixtures.py), and the finding must be raised from that step's hook,
with that step's action and where."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")

from shim.guard.core import SpecFlipViolation  # noqa: E402
from statemodel.designs import CATCH_UP  # noqa: E402

pytestmark = pytest.mark.sglang

Trigger = Callable[[], Any]


@dataclass(frozen=True)
class Case:
    name: str
    setup: Callable[[Any, Path, pytest.MonkeyPatch], Trigger]
    hook: str  # the adapter method the finding is raised from (a round settles in the next step's hook)
    invariant: str
    action: str
    where: str  # the step's location, as the report's last transition names it (or "seen at: ...")


def _driver(runtime: Any, model_dir: Path, *, n: int = 2, **guard: Any) -> Any:
    """`guard`: configure_guard's mode and trace (default: assert mode, no trace)."""
    gf.configure_guard(runtime, CATCH_UP, **guard)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), CATCH_UP)
    drv.admit(gf.make_reqs("r", n, max_new_tokens=40, shared_prefix=gf.SYSTEM_PROMPT))
    return drv


def _leak(drv: Any) -> None:
    """Three slots allocated and owned by nobody: the pool's free count drops, no request holds more."""
    drv.pools.allocator.alloc(3)


def leak_before_merge(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    drv = _driver(runtime, model_dir)
    drv.decode()
    late = drv.prefill(gf.make_reqs("late", 1, shared_prefix=gf.SYSTEM_PROMPT))
    late.forward_mode = late.forward_mode.DECODE
    _leak(drv)
    return lambda: drv.batch.merge_batch(late)


def leak_before_plain_forward(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    drv = _driver(runtime, model_dir)
    drv.flip_off()
    drv.decode()
    with h.patch_assign_req_to_token_pool():
        drv.batch.prepare_for_decode()
    _leak(drv)
    return lambda: drv.worker.target_worker.forward_batch_generation(drv.batch)


def leak_before_flip_off(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    drv = _driver(runtime, model_dir)
    drv.decode()
    drv.finish_and_filter()
    _leak(drv)
    return drv.flip_off


def leak_before_verify_launch(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch, **guard: Any) -> Trigger:
    """The leak between the draft and the verify's launch (while the verify input is built): the launch's second look
    at the state the draft step produced is the first reading of the pool since."""
    drv = _driver(runtime, model_dir, **guard)
    drv.decode()
    with h.patch_assign_req_to_token_pool():
        drv.batch.prepare_for_decode()
    build = h.make_eagle_verify_input

    def build_and_leak(batch: Any, **kwargs: Any) -> Any:
        _leak(drv)
        return build(batch, **kwargs)

    mp.setattr(h, "make_eagle_verify_input", build_and_leak)
    drv.worker.accept_lens_cpu_stand_in = [1, 1]
    return lambda: drv.worker.forward_batch_generation(drv.batch)


def _prepared(drv: Any) -> None:
    with h.patch_assign_req_to_token_pool():
        drv.batch.prepare_for_decode()


def leak_before_prefill(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    drv = _driver(runtime, model_dir)
    drv.flip_off()  # plain steps: no speculative round left to settle at the next hook
    drv.decode()
    _leak(drv)
    return lambda: drv.prefill(gf.make_reqs("late", 1, shared_prefix=gf.SYSTEM_PROMPT))


def leak_before_prepare_for_decode(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    drv = _driver(runtime, model_dir)
    drv.flip_off()  # plain steps: no speculative round left to settle at the next hook
    drv.decode()
    _leak(drv)
    return lambda: _prepared(drv)


def leak_before_draft(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    drv = _driver(runtime, model_dir)
    drv.decode()
    _prepared(drv)
    _leak(drv)
    drv.worker.accept_lens_cpu_stand_in = [1, 1]
    return lambda: drv.worker.forward_batch_generation(drv.batch)


def leak_before_filter(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    drv = _driver(runtime, model_dir, n=3)
    drv.flip_off()  # plain steps: no speculative round left to settle at the next hook
    drv.decode()
    _leak(drv)
    return lambda: drv.batch.filter_batch(keep_indices=[0, 1])


def leak_before_retract(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    from sglang.srt.mem_cache.common import release_kv_cache

    drv = _driver(runtime, model_dir)
    drv.flip_off()  # plain steps: no speculative round left to settle at the next hook
    drv.decode()
    _leak(drv)
    req = drv.batch.reqs[0]
    return lambda: release_kv_cache(req, drv.batch.tree_cache, checkpoint=False)


def leak_after_a_speculative_round(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """The leak after a round's result: the round settles (its verify with the accepts committed, then its
    draft-extend) at the scheduler's next hook, the first reading since."""
    drv = _driver(runtime, model_dir)
    drv.decode()
    _leak(drv)
    return lambda: _prepared(drv)


CASES = [
    Case("prefill", leak_before_prefill, "after_prepare_for_extend", "kv_conservation", "prefill",
         "ScheduleBatch.prepare_for_extend"),
    Case("prepare_for_decode", leak_before_prepare_for_decode, "after_prepare_for_decode", "kv_conservation",
         "prepare_for_decode", "ScheduleBatch.prepare_for_decode"),
    Case("settle_round", leak_after_a_speculative_round, "after_prepare_for_decode", "kv_conservation", "verify",
         "process_batch_result (verify result)"),
    Case("draft", leak_before_draft, "before_draft", "kv_conservation", "draft", "EagleDraftWorker.draft"),
    Case("filter", leak_before_filter, "around_filter_batch", "kv_conservation", "filter_batch",
         "ScheduleBatch.filter_batch"),
    Case("retract", leak_before_retract, "around_release_kv_cache", "kv_conservation", "retract",
         "mem_cache.common.release_kv_cache"),
    Case("merge", leak_before_merge, "around_merge_batch", "kv_conservation", "merge_batch",
         "ScheduleBatch.merge_batch"),
    Case("plain_decode", leak_before_plain_forward, "before_target_forward", "kv_conservation", "plain_decode",
         "TpModelWorker.forward_batch_generation (plain DECODE)"),
    Case("flip_off", leak_before_flip_off, "on_flip", "kv_conservation", "flip_off",
         "switch (shim.guard.api.notify_flip)"),
    # a re-observation, not a model step: reported against the draft, seen at the launch
    Case("verify_launch", leak_before_verify_launch, "before_verify", "kv_conservation", "draft",
         "seen at: EAGLEWorkerV2.verify (TARGET_VERIFY launch)"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_fault_planted_before_a_step_is_found_at_that_step(runtime: Any, model_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch, case: Case) -> None:
    trigger = case.setup(runtime, model_dir, monkeypatch)  # clean up to here
    with pytest.raises(SpecFlipViolation) as excinfo:
        trigger()
    exc = excinfo.value
    frames = {entry.name for entry in excinfo.traceback}
    assert case.hook in frames, (sorted(frames), str(exc))
    assert (exc.invariant, exc.action) == (case.invariant, case.action), str(exc)
    # the history's last entry is this step's, with its where (earlier entries name other steps' places)
    assert (case.where in str(exc) if case.where.startswith("seen at: ")
            else str(exc).rstrip().endswith(f" [{case.where}]")), str(exc)


def test_a_leak_in_a_results_processing_is_found_at_its_process_result(runtime: Any, model_dir: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the overlap schedule (tests/overlap_loop.py) three slots leak while the first speculative result's
    accepted runs are committed (`_resolve_spec_v2_tokens`): the guard's `process_result`, the hook right after, is
    the first step that reads the pool since, and names it."""
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

    ol = importlib.import_module("overlap_loop")
    resolve = SchedulerBatchResultProcessor._resolve_spec_v2_tokens

    def resolve_and_leak(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = resolve(self, *args, **kwargs)
        _leak(drv)
        return out

    # before the driver: its result processor binds the method when it is built
    monkeypatch.setattr(SchedulerBatchResultProcessor, "_resolve_spec_v2_tokens", resolve_and_leak)
    gf.configure_guard(runtime, CATCH_UP)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), CATCH_UP)
    drv.accepts = gf.accept_cycle([1, 2, 3, 4])
    drv.add(gf.make_reqs("o", 2, max_new_tokens=30))
    with pytest.raises(SpecFlipViolation) as excinfo:
        for _ in range(10):
            drv.iteration()
    exc = excinfo.value
    frames = {entry.name for entry in excinfo.traceback}
    assert "after_normalize_decode_outputs" in frames, (sorted(frames), str(exc))
    assert (exc.invariant, exc.action) == ("kv_conservation", "process_result"), str(exc)
    assert "3 slots leaked" in str(exc), str(exc)
    where = "SchedulerBatchResultProcessor._normalize_decode_outputs (result processed)"
    assert str(exc).rstrip().endswith(f" [{where}]"), str(exc)


def test_a_finding_at_a_re_observation_is_traced_as_a_refine_record(runtime: Any, model_dir: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Trace mode, the verify launch's leak above: the trace holds it as a `refine` record (not a model step) with
    the step it follows, where it was seen, and the violation with its numbers."""
    import json

    from shim.guard.core import Mode

    trace = tmp_path / "refine.jsonl"
    trigger = leak_before_verify_launch(runtime, model_dir, monkeypatch, mode=Mode.TRACE, trace=trace)
    trigger()  # trace mode: recorded, not raised
    runtime.reset()
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    found = [r for r in records if r["kind"] == "refine" and r["violations"]]
    assert found, [r["kind"] for r in records]
    first = found[0]
    assert (first["action"], first["where"]) == ("draft", "EAGLEWorkerV2.verify (TARGET_VERIFY launch)"), first
    assert [(v["invariant"], v["expected"], v["actual"]) for v in first["violations"]] == [
        ("kv_conservation", "1024", "1021")], first["violations"]
    assert set(first["delta"]) == {"kv_free"}, first["delta"]  # what the launch's reading changed: the free count
