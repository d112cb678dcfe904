"""The v2 worker's own flip actions on the scheduler, draft mode "retract" (design plain_off_retract_catch_up):
speculation off is SGLang's own plain scheduler path. flip_off frees the speculative reserve and points the
scheduler, its future map and the target's model runner at the plain side; flip_on retracts the running requests
(their re-prefill with speculation is the draft's catch-up) and points everything back. The core's
`plain_path_flip` (shim/switch/core.py) decides, sequences and records them through `V2Side` (shim/switch/v2.py)."""

from __future__ import annotations

from typing import Any

from shim.releases.registry import installed_line
from shim.switch import core, faults
from shim.switch.v2_runtime import SwitchRuntime


def _kv_row(req: Any) -> tuple[int | None, int, int]:
    """(req_to_token row, committed, allocated) of a request; row None when it holds none (the release line's
    reading: shim/releases/)."""
    return installed_line().kv_row(req)


def drain_in_flight(scheduler: Any) -> bool:
    """Process the launched step's result now, as SGLang's own pause_generation does before it retracts.
    True when one was processed; the loop then has nothing to pop (`last_batch` is cleared)."""
    queue = getattr(scheduler, "result_queue", None)
    if not getattr(scheduler, "enable_overlap", False) or scheduler.last_batch is None or not queue:
        return False
    done_batch, result = queue.popleft()
    scheduler.process_batch_result(done_batch, result)
    scheduler.last_batch = None
    return True


def release_reserve(scheduler: Any, reqs: list[Any]) -> int:
    """Free each request's speculative reserve [kv_committed_len, kv_allocated_len), as release_kv_cache
    frees an over-allocation at finish; returns the number of slots freed."""
    req_to_token = scheduler.req_to_token_pool.req_to_token
    allocator = scheduler.token_to_kv_pool_allocator
    freed = 0
    for req in reqs:
        row, start, end = _kv_row(req)
        if req.finished() or row is None:
            continue
        if end > start:
            # shim/switch/faults.py (SPECFLIP_FAULT, tests only) may shift the range or keep the length
            lo, hi = faults.reserve_range(str(req.rid), start, end, first=freed == 0)
            allocator.free(req_to_token[row, lo:hi])
            if not faults.keeps_allocated(str(req.rid)):
                req.kv.kv_allocated_len = start
            freed += end - start
    return freed


def _set_batch_algorithm(batch: Any, algorithm: Any) -> None:
    batch.spec_algorithm = algorithm
    batch.spec_info = None  # flip_off: no draft input on a plain batch; flip_on: its requests re-prefill
    batch.input_ids = None  # resolved at launch from the future map's last-token relay, in both modes


def enter_plain_path(rt: SwitchRuntime, scheduler: Any) -> None:
    """Point the scheduler, its future map and the target's model runner at the plain side (what both workers
    point: core.enter_plain_side; the future map and the prefill graphs are v2's)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    fm = scheduler.future_map
    side = rt.spec_side
    rt.fm_was_initialized = installed_line().future_map_sizes_lazily and fm._forward_buf_initialized
    core.enter_plain_side(rt, scheduler, installed_line().decode_graph_runner_attr)
    # the plain relay: input ids gathered from output_tokens_buf, a stash carries the bonus token only
    side.set(fm, "spec_algo", SpeculativeAlgorithm.NONE)
    side.set(fm, "need_topk", False)
    side.set(fm, "need_hidden_states", False)
    if rt.plain_prefill_runner is not None:
        side.set(scheduler.tp_worker.model_runner, "prefill_cuda_graph_runner", rt.plain_prefill_runner)


def enter_spec_path(rt: SwitchRuntime, scheduler: Any) -> None:
    """Undo enter_plain_path."""
    if not rt.spec_side:
        return
    fm = scheduler.future_map
    if rt.fm_was_initialized or not installed_line().future_map_sizes_lazily:
        rt.spec_side.restore()
    else:  # lazy sizing, first stashed while off: sized for the plain payload, so size it again at the next spec stash
        rt.spec_side.restore(keep=((fm, "need_topk"), (fm, "need_hidden_states")))
        fm._forward_buf_initialized = False


def retract_all_running(scheduler: Any, reqs: list[Any]) -> None:
    """ScheduleBatch.release_req for each request without tree insertion (SGLang's retract_all, as its
    pause_generation(mode="retract") calls it); the core queues them again with their output kept."""
    from sglang.srt.managers import schedule_batch

    kwargs = dict(reqs=reqs, req_to_token_pool=scheduler.req_to_token_pool,
                  token_to_kv_pool_allocator=scheduler.token_to_kv_pool_allocator, tree_cache=scheduler.tree_cache,
                  hisparse_coordinator=getattr(scheduler, "hisparse_coordinator", None))
    kwargs.update(installed_line().retract_all_kwargs(scheduler))  # offload_kv False: re-prefilled, never restored
    schedule_batch.retract_all(**kwargs)

