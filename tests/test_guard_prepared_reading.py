"""A batch's launch reads what `prepare_for_decode`'s hook read (guard_reading.py `_take_prepared_reading`),
and so does the plain result processed in the same iteration (`_result_reading`), on SGLang 0.5.23's real objects under
the overlap loop with the switch's plain path (tests/overlap_loop.py), the guard in assert mode: one reading of the
batch per plain iteration, and none saved when a request's output grew in between (a result processed there with no
hook of the guard's, as 0.5.16's loop does without overlap)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
ol = importlib.import_module("overlap_loop")

from shim.switch.config import SwitchConfig  # noqa: E402
from statemodel.designs import RETRACT_CATCH_UP  # noqa: E402

pytestmark = pytest.mark.sglang


@contextmanager
def readings(adapter: Any) -> Iterator[list[str]]:
    """Which of the adapter's methods read the batch's requests while the block runs, in order."""
    reads: list[str] = []
    original = adapter._observe_reqs

    def counted(reqs: list[Any], seq_lens: Any) -> Any:
        caller = sys._getframe(1)
        if caller.f_code.co_name == "_read_batch":  # a batch's reading: the hook that asked for it
            caller = caller.f_back
        reads.append(caller.f_code.co_qualname.split(".")[1])
        return original(reqs, seq_lens)

    adapter._observe_reqs = counted
    try:
        yield reads
    finally:
        del adapter._observe_reqs


def three_iterations_then_the_rest(runtime: Any, drv: Any, mode: str) -> list[str]:
    """Three iterations launching `mode` steps, with no finding, and what each hook read in them (`readings`); then
    the run to its end: no finding, the pool accounted, every output greedy-exact."""
    with readings(runtime.adapter) as reads:
        for _ in range(3):
            drv.iteration()
    assert [launched for _, launched, _ in drv.launched[-3:]] == [mode] * 3
    assert runtime.guard.found == []
    drv.run_until_idle()
    assert runtime.guard.found == [] and gf.pool_accounted(drv.pools)
    assert all(r.finished() and list(r.output_ids) == ol.expected_output(r) for r in drv.reqs)
    return reads


def plain_driver(model_dir: Path) -> Any:
    config = SwitchConfig(t_off=1, t_on=0, draft_while_off="retract", plain_graphs="decode")  # off at once
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir, kv_size=4096), RETRACT_CATCH_UP, switch_config=config)
    drv.reqs = gf.make_reqs("p", 8, max_new_tokens=40)
    drv.add(drv.reqs)
    for _ in range(5):  # prefill, merge, the flip off, plain steps
        drv.iteration()
    assert drv.launched[-1][1] == "plain"
    return drv


def test_a_plain_launch_reads_what_prepare_read(runtime: Any, model_dir: Path) -> None:
    gf.configure_guard(runtime, RETRACT_CATCH_UP)
    reads = three_iterations_then_the_rest(runtime, plain_driver(model_dir), "plain")
    # per plain iteration one reading, prepare_for_decode's: the launch and the previous step's result read nothing new
    assert reads == ["after_prepare_for_decode"] * 3


def test_a_request_whose_output_grew_in_between_is_read_again(runtime: Any, model_dir: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Between get_next_batch_to_run and run_batch (where the loop asks is_disable_overlap_for_batch) a token lands
    in one request's output with no hook of the guard's, as a result processed there would append it: the launch
    reads the batch again, and its check names the token (a reading reused from prepare_for_decode would have let
    the step run, to be caught only at its result)."""
    from shim.guard.report import SpecFlipViolation

    gf.configure_guard(runtime, RETRACT_CATCH_UP)
    drv = plain_driver(model_dir)
    req = drv.running.reqs[0]
    decide = drv.is_disable_overlap_for_batch

    def append_then_decide(batch: Any, **kwargs: Any) -> bool:
        req.output_ids.append(req.output_ids[-1])
        return decide(batch, **kwargs)

    monkeypatch.setattr(drv, "is_disable_overlap_for_batch", append_then_decide)
    with readings(runtime.adapter) as reads, pytest.raises(SpecFlipViolation) as caught:
        drv.iteration()
    assert "committed_output_kept broken by plain_decode" in str(caught.value) and f"'{req.rid}'" in str(caught.value)
    assert reads == ["after_prepare_for_decode", "observe_requests_in_worker_call"]  # the launch read again


def test_a_speculative_launch_reads_what_prepare_read(runtime: Any, model_dir: Path) -> None:
    """A speculative iteration: the worker call's first hook (the draft) takes prepare_for_decode's reading; the
    previous step's result is read again (`_resolve_spec_v2_tokens` committed its accepted tokens' KV)."""
    gf.configure_guard(runtime, RETRACT_CATCH_UP)
    config = SwitchConfig(t_off=64, t_on=0, draft_while_off="retract")  # speculation stays on
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir, kv_size=4096), RETRACT_CATCH_UP, switch_config=config)
    drv.reqs = gf.make_reqs("s", 8, max_new_tokens=40)
    drv.add(drv.reqs)
    for _ in range(4):  # prefill, merge, speculative steps
        drv.iteration()
    reads = three_iterations_then_the_rest(runtime, drv, "spec")
    assert reads == ["after_prepare_for_decode", "after_normalize_decode_outputs"] * 3


def test_a_result_whose_output_grew_after_the_launch_is_read_again(runtime: Any, model_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Between the launch of step N+1 and the processing of step N's result two tokens land in one request's output
    with no hook of the guard's: the result hook reads the batch again (not the reading prepare_for_decode took), and
    its check names the request at the result (a reused reading would have let it pass to the next hook)."""
    from shim.guard.report import SpecFlipViolation

    gf.configure_guard(runtime, RETRACT_CATCH_UP)
    drv = plain_driver(model_dir)
    req = drv.running.reqs[0]
    process = drv.process_batch_result

    def append_then_process(batch: Any, result: Any) -> None:
        req.output_ids.extend(req.output_ids[-1:] * 2)
        process(batch, result)

    monkeypatch.setattr(drv, "process_batch_result", append_then_process)
    with readings(runtime.adapter) as reads, pytest.raises(SpecFlipViolation) as caught:
        drv.iteration()
    assert "committed_output_kept broken by process_result" in str(caught.value)
    assert f"'{req.rid}'" in str(caught.value)
    assert reads == ["after_prepare_for_decode", "after_normalize_decode_outputs"]  # the result read again
