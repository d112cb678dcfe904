"""The v2 switch's spec-off decode step inside the speculative worker (draft modes "sync" and "none"): model
actions plain_decode and draft_sync."""

from __future__ import annotations

import contextlib
from typing import Any

from shim.releases.registry import installed_line
from shim.switch import core
from shim.switch.v2_runtime import SwitchRuntime


def _worker_contexts(worker: Any) -> list[Any]:
    return installed_line().draft_worker_contexts(worker)


def plain_decode(worker: Any, batch: Any, on_publish: Any, rt: SwitchRuntime) -> Any:
    """Model action plain_decode (+ draft_sync): a real DECODE of the target, one token per request.

    The slot comes from the v2 reserve `prepare_for_decode` already holds: req_to_token[row, seq_lens].
    Everything written to `batch` is undone by the scheduler's `_forward_isolation`.
    """
    import torch
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    sync = rt.config.draft_while_off == "sync"
    draft_input = batch.spec_info
    old = batch.seq_lens
    old_cpu, old_sum, old_orig = batch.seq_lens_cpu, batch.seq_lens_sum, batch.orig_seq_lens
    bs = old.shape[0]
    ndt = worker.speculative_num_draft_tokens
    r2t = worker.req_to_token_pool.req_to_token
    rows = batch.req_pool_indices
    spec_algo = batch.spec_algorithm

    batch.input_ids = draft_input.bonus_tokens.to(torch.int64)
    batch.out_cache_loc = r2t[rows, old].to(torch.int64)
    new = old + 1
    batch.seq_lens = new
    batch.seq_lens_cpu = None if old_cpu is None else old_cpu + 1
    batch.seq_lens_sum = None  # recomputed by ForwardBatch.init_new from seq_lens_cpu when present
    if old_orig is not None:
        batch.orig_seq_lens = old_orig + 1
    batch.forward_mode = ForwardMode.DECODE
    batch.spec_info = None
    batch.spec_algorithm = SpeculativeAlgorithm.NONE

    res = core.plain_forward(rt, worker.target_worker, installed_line().decode_graph_runner_attr, batch,
                             capture_hidden_mode=CaptureHiddenMode.FULL if sync else CaptureHiddenMode.NULL)

    tokens = res.next_token_ids.to(torch.int64)
    if on_publish is not None:
        on_publish(new)
    # A verify-shaped result with one accepted token per request: the scheduler's spec-v2 bookkeeping and
    # the draft-extend graph (num_draft_tokens per request) take it unchanged.
    predict = tokens.new_zeros((bs, ndt))
    predict[:, 0] = tokens
    predict = predict.reshape(-1)
    accept_lens = torch.ones(bs, dtype=torch.int32, device=old.device)
    result = GenerationBatchResult(
        logits_output=res.logits_output, next_token_ids=predict, can_run_cuda_graph=res.can_run_cuda_graph,
        speculative_num_draft_tokens=ndt, next_draft_input=EagleDraftInput(bonus_tokens=tokens.to(torch.int32)),
        accept_lens=accept_lens, new_seq_lens=new,
    )
    keep = [batch.input_ids, batch.out_cache_loc, new, predict, accept_lens]
    if sync:
        draft_sync(worker, batch, result, old, old_cpu, old_sum, old_orig, spec_algo, keep)
    else:
        worker._stub_skipped_draft_extend(batch, result)
    if installed_line().result_keeps_refs:
        result.extra_keep_alive_refs = list(result.extra_keep_alive_refs or []) + keep
    return result


def draft_sync(worker: Any, batch: Any, result: Any, old: Any, old_cpu: Any, old_sum: Any, old_orig: Any,
               spec_algo: Any, keep: list[Any]) -> None:
    """Model action draft_sync: a draft-extend over the one token the plain step committed, laid out as a
    verify with one accepted token (slot row 0 of each request's num_draft_tokens window)."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    bs = old.shape[0]
    ndt = worker.speculative_num_draft_tokens
    hidden = result.logits_output.hidden_states
    padded = hidden.new_zeros((bs, ndt, hidden.shape[-1]))
    padded[:, 0] = hidden[:bs]
    result.logits_output.hidden_states = padded.reshape(bs * ndt, hidden.shape[-1])
    r2t = worker.req_to_token_pool.req_to_token
    offsets = torch.arange(ndt, device=old.device, dtype=old.dtype)
    batch.out_cache_loc = r2t[batch.req_pool_indices[:, None], old[:, None] + offsets].reshape(-1).to(torch.int64)
    batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum, batch.orig_seq_lens = old, old_cpu, old_sum, old_orig
    batch.spec_algorithm = spec_algo
    batch.forward_mode = ForwardMode.DECODE
    keep += [padded, batch.out_cache_loc]
    with contextlib.ExitStack() as stack:
        for ctx in _worker_contexts(worker):
            stack.enter_context(ctx)
        worker.draft_worker._draft_extend_for_decode(batch, result)
