"""Harness: REAL sglang 0.5.23 scheduler objects on a CPU-only machine, for specflip's guard tests.

Not a test module (pytest collects ``test_*.py`` only). Import it after putting ``stand_ins/cpu``
on ``sys.path`` -- :func:`ensure_stand_ins_on_path` does that, and importing this module calls it.
Paths below are relative to the installed ``sglang/srt/`` package.

Real sglang code exercised (nothing re-implemented):

- ``server_args.ServerArgs`` (device="cpu", attention_backend="torch_native", skip_tokenizer_init,
  disable_cuda_graph; the EAGLE variant needs no draft model: ``speculative_draft_model_path`` may stay
  None, ServerArgs only switches to non-overlap spec v2 and max_running_requests 48 unless given) and
  ``runtime_context.publish(server_args, role="scheduler")``.
- ``configs/model_config.ModelConfig.from_server_args`` on a config.json without weights.
- ``mem_cache/memory_pool.ReqToTokenPool``, ``mem_cache/memory_pool.MHATokenToKVPool``,
  ``mem_cache/allocator/token.TokenToKVPoolAllocator`` (``available_size()``, ``free_group_begin/end``),
  the tree cache SGLang's own ``mem_cache/registry.default_radix_cache_factory`` builds (a
  ``UnifiedRadixCache``, disabled or, with ``build_pools(radix_cache=True)``, enabled with EAGLE's bigram keys).
- ``managers/schedule_batch.Req`` + ``Req.init_next_round_input`` (the tree match), ``tree_cache.lock``;
  ``ScheduleBatch.init_new``,
  ``ScheduleBatch.prepare_for_extend``, ``ScheduleBatch.prepare_for_decode`` (plain:
  ``mem_cache/allocation.alloc_for_decode``; EAGLE: ``speculative/spec_utils.spec_prepare_for_decode``
  -> ``speculative/eagle_utils.eagle_prepare_for_decode`` -> ``mem_cache/allocation.alloc_for_spec_decode``),
  ``ScheduleBatch.filter_batch``, ``ScheduleBatch.merge_batch``.
- ``speculative/eagle_info.EagleDraftInput`` (and its ``filter_batch`` / ``merge_batch``),
  ``speculative/eagle_info.EagleVerifyInput``.
- ``Req.update_finish_state``, ``mem_cache/common.release_kv_cache`` and ``checkpoint_kv_cache`` after a stand-in
  forward, inside allocator free groups where the scheduler opens them.

Scheduler logic a CPU test drives itself (the Scheduler cannot be built without a model), each following the
0.5.23 code it names: :func:`schedule_prefill` (``get_new_batch_prefill`` / ``PrefillAdder``: tree match,
lock, chunking), :func:`next_round_after_prefill` (``get_next_batch_to_run``: stash the chunked request,
filter the prefill batch), the result processing in :func:`prefill_forward_cpu_stand_in` and
:func:`release_finished_cpu_stand_in` (``process_batch_result_prefill / _decode``).

Stand-ins (pure torch / pure Python, each named ``*_cpu_stand_in``):

- :func:`assign_req_to_token_pool_cpu_stand_in` replaces
  ``mem_cache/allocation.assign_req_to_token_pool_func`` (a triton kernel launch; triton has no CPU
  driver). Patched into ``sglang.srt.mem_cache.allocation`` (where ``alloc_for_spec_decode`` looks it
  up) and ``sglang.srt.speculative.spec_utils`` (re-export) by :func:`patch_assign_req_to_token_pool`
  while a spec prepare_for_decode runs.
- :func:`plain_decode_forward_cpu_stand_in` replaces ``TpModelWorker.forward_batch_generation`` for a
  decode batch plus the scheduler's ``process_batch_result_decode`` bookkeeping: it "samples" one token
  per request, appends it to ``req.output_ids``, sets ``batch.input_ids`` for the next step and runs the
  real ``Req.update_finish_state``. (KV slots were already allocated and committed by
  ``prepare_for_decode``: ``alloc_for_decode_default`` bumps ``kv_committed_len``/``kv_allocated_len``.)
- :func:`prefill_forward_cpu_stand_in` is the same for the prefill batch (first output token; a middle
  chunk gets none), with ``process_batch_result_prefill``'s release / ``checkpoint_kv_cache``.
- :func:`spec_verify_forward_cpu_stand_in` replaces ``EAGLEWorkerV2.forward_batch_generation``
  (draft + ``speculative/eagle_worker_common.run_eagle_verify`` + draft extend, all CUDA) for given
  accept lengths (accepted drafts + the bonus token), then does what sglang's own bookkeeping does:
  ``new_seq_lens = batch.seq_lens + accept_lens`` (run_eagle_verify), ``batch.seq_lens/seq_lens_cpu =
  new_seq_lens`` and ``batch.spec_info = next_draft_input`` (``Scheduler.run_batch``, non-overlap spec
  v2), ``req.kv.kv_committed_len += accept_len`` and ``output_ids`` extended
  (``BatchResultProcessor._resolve_spec_v2_tokens`` / ``process_batch_result_decode``), real
  ``Req.update_finish_state(accept_len)``. Accepted tokens reuse slots that ``eagle_prepare_for_decode``
  over-allocated, so no allocation happens here (topk == 1, page_size == 1 layout).
- :func:`release_finished_cpu_stand_in` calls the real ``release_kv_cache`` for finished requests inside one
  free group, as ``process_batch_result_decode`` does, then the real ``ScheduleBatch.filter_batch``.
- :func:`make_eagle_draft_input` / :func:`make_eagle_verify_input` fill the real dataclasses with
  dummy tensors of the right shapes (what the draft model would produce).
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
STAND_INS_DIR = REPO_ROOT / "stand_ins" / "cpu"


def ensure_stand_ins_on_path() -> None:
    """Put ``stand_ins/cpu`` (the torchvision import stand-in) at the front of ``sys.path``."""
    path = str(STAND_INS_DIR)
    if path not in sys.path:
        sys.path.insert(0, path)


ensure_stand_ins_on_path()

TINY_MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}
VOCAB_SIZE: int = TINY_MODEL_CONFIG["vocab_size"]
HIDDEN_SIZE: int = TINY_MODEL_CONFIG["hidden_size"]


def write_tiny_model_config(directory: str | Path | None = None, *,
                            max_position_embeddings: int | None = None) -> Path:
    """Write a config.json (no weights, no tokenizer) for a tiny llama; return its directory.
    `max_position_embeddings`: a longer context than the tiny default, for long prompts."""
    target = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="specflip-tiny-"))
    target.mkdir(parents=True, exist_ok=True)
    config = dict(TINY_MODEL_CONFIG)
    if max_position_embeddings is not None:
        config["max_position_embeddings"] = max_position_embeddings
    (target / "config.json").write_text(json.dumps(config))
    return target


def make_server_args(
    model_dir: str | Path,
    *,
    speculative_algorithm: str | None = None,
    num_steps: int = 3,
    topk: int = 1,
    num_draft_tokens: int = 4,
    max_running_requests: int = 16,
    page_size: int = 1,
) -> Any:
    """Real ``ServerArgs`` for CPU. ``speculative_algorithm="EAGLE"`` needs no draft model path: nothing
    is loaded here (a real EAGLEWorkerV2 would need one)."""
    from sglang.srt.server_args import ServerArgs

    kwargs: dict[str, Any] = {
        "model_path": str(model_dir),
        "device": "cpu",
        "dtype": "float32",
        "attention_backend": "torch_native",
        "skip_tokenizer_init": True,
        "disable_cuda_graph": True,
        # the harness runs the scheduler's normal loop (each step's result before the next step); the overlap
        # loop is tests/overlap_loop.py's
        "disable_overlap_schedule": True,
        "disable_radix_cache": True,
        "max_running_requests": max_running_requests,
        "page_size": page_size,
        "random_seed": 0,
    }
    if speculative_algorithm is not None:
        kwargs.update(
            {
                "speculative_algorithm": speculative_algorithm,
                "speculative_num_steps": num_steps,
                "speculative_eagle_topk": topk,
                "speculative_num_draft_tokens": num_draft_tokens,
            }
        )
    return ServerArgs(**kwargs)


def publish_server_args(server_args: Any) -> None:
    """``runtime_context.publish(server_args, role="scheduler")``: the process-wide config bags
    (``get_spec()``, ``get_schedule()``...) that prepare_for_decode reads."""
    from sglang.srt import runtime_context

    runtime_context.publish(server_args, role="scheduler")


@dataclass
class CpuPools:
    """The memory objects a scheduler owns, built for CPU."""

    server_args: Any
    model_config: Any
    req_to_token_pool: Any
    kv_pool: Any
    allocator: Any
    tree_cache: Any
    spec_algorithm: Any

    @property
    def is_spec(self) -> bool:
        return not self.spec_algorithm.is_none()

    def available_size(self) -> int:
        """Free KV slots: ``TokenToKVPoolAllocator.available_size()``."""
        return int(self.allocator.available_size())


def build_pools(server_args: Any, *, kv_size: int = 512, max_reqs: int = 16, radix_cache: bool = False,
                overlap_schedule: bool = False) -> CpuPools:
    """Publish ``server_args`` and build ReqToTokenPool, MHATokenToKVPool, TokenToKVPoolAllocator and the tree
    cache a 0.5.23 scheduler builds (``kv_size`` token slots, ``max_reqs`` request rows).

    ``radix_cache``: the prefix cache enabled, as a server without ``--disable-radix-cache`` has it (finished
    and prefilled requests' KV goes into the tree, shared prompt prefixes hit); otherwise disabled. Either
    way the tree is what SGLang's own ``mem_cache/registry.default_radix_cache_factory`` builds: on 0.5.23
    that is a ``UnifiedRadixCache`` (FULL component, bigram keys for EAGLE), not the older ``RadixCache``.

    ``overlap_schedule``: the overlap loop, as a GPU launch resolves it (spec v2's default). On a CPU SGLang's
    resolution turns it off for speculation, and keeps that choice beside the record (0.5.23: a declaration the
    resolved view and the published config read, not the record): the GPU's choice is declared after it, through
    SGLang's own ``declare_resolution``, so the record, SGLang's resolved view and the published config all say the
    overlap loop runs."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext, default_radix_cache_factory
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    server_args.disable_radix_cache = not radix_cache  # the published config says what the tree is
    if overlap_schedule:
        from sglang.srt.arg_groups.overrides import declare_resolution

        server_args.disable_overlap_schedule = False  # the launch's input: the default
        server_args.resolve_once()  # what Engine._launch_subprocesses runs first (publish would run it otherwise)
        declare_resolution(server_args, "overlap_schedule_gpu_resolution_cpu_stand_in", disable_overlap_schedule=False)
    publish_server_args(server_args)
    model_config = ModelConfig.from_server_args(server_args)
    spec_algorithm = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
    # Row width: context + headroom for the spec over-allocation (sglang sizes it the same way,
    # mem_cache/allocation_sizing.get_req_to_token_extra_context_len).
    row_width = model_config.context_len + 4 * max(server_args.speculative_num_draft_tokens or 1, 8)
    req_to_token_pool = ReqToTokenPool(
        size=max_reqs, max_context_len=row_width, device="cpu", enable_memory_saver=False
    )
    kv_pool = MHATokenToKVPool(
        size=kv_size,
        page_size=server_args.page_size,
        dtype=torch.float32,
        head_num=model_config.get_num_kv_heads(1),
        head_dim=model_config.head_dim,
        layer_num=model_config.num_hidden_layers,
        device="cpu",
        enable_memory_saver=False,
    )
    allocator = TokenToKVPoolAllocator(
        size=kv_size, dtype=torch.float32, device="cpu", kvcache=kv_pool, need_sort=False
    )
    # the CacheInitParams fields mem_cache/kv_cache_builder.py sets that matter on one CPU rank
    params = CacheInitParams(
        disable=not radix_cache,
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool_allocator=allocator,
        page_size=server_args.page_size,
        is_eagle=spec_algorithm.is_eagle(),
        chunked_prefill_size=server_args.chunked_prefill_size,
    )
    context = TreeCacheBuildContext(
        server_args=server_args, params=params, is_hybrid_swa=False, is_hybrid_ssm=False,
        enable_hierarchical_cache=False, disable_radix_cache=not radix_cache, tp_worker=None,
        model_config=model_config, tp_size=1, tp_rank=0, tp_group=None,
    )
    tree_cache = default_radix_cache_factory(context)
    return CpuPools(
        server_args=server_args,
        model_config=model_config,
        req_to_token_pool=req_to_token_pool,
        kv_pool=kv_pool,
        allocator=allocator,
        tree_cache=tree_cache,
        spec_algorithm=spec_algorithm,
    )


def make_req(rid: str, input_ids: Sequence[int], *, max_new_tokens: int = 64) -> Any:
    """A real ``Req`` with greedy sampling (``ignore_eos`` so only max_new_tokens finishes it)."""
    from array import array

    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    params.normalize(None)
    params.verify(VOCAB_SIZE)
    return Req(rid, "", array("q", input_ids), params, vocab_size=VOCAB_SIZE)


def new_batch(pools: CpuPools, reqs: list[Any], *, chunked_req: Any = None, spec_algorithm: Any = None) -> Any:
    """``ScheduleBatch.init_new`` (non-overlap); ``spec_algorithm`` the server's unless given."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    return ScheduleBatch.init_new(
        reqs,
        pools.req_to_token_pool,
        pools.allocator,
        pools.tree_cache,
        pools.model_config,
        enable_overlap=False,
        spec_algorithm=pools.spec_algorithm if spec_algorithm is None else spec_algorithm,
        chunked_req=chunked_req,
    )


def schedule_prefill(pools: CpuPools, waiting: list[Any], *, chunked_req: Any = None,
                     chunk_size: int | None = None, spec_algorithm: Any = None) -> tuple[Any, Any]:
    """The prefill half of ``Scheduler.get_new_batch_prefill``: the request still being chunked, if any, then
    requests from ``waiting`` (the waiting queue, in order; those admitted are taken out of it, as the
    scheduler rebuilds ``waiting_queue``) while the ``chunk_size`` budget (``rem_chunk_tokens``; None: no
    chunked prefill) lasts. Returns (the prepared EXTEND batch, the request still being chunked or None).

    As ``PrefillAdder`` does: the chunked request first (``init_next_round_input()`` without the tree: its
    prefix is its own row; ``add_chunked_req`` sets ``extend_end``), then each new request matches the tree
    (``init_next_round_input(tree_cache)``: ``prefix_len``, ``last_node``, ``cache_protected_len``), takes a
    tree lock on its match when the tree is enabled (``_commit_prefill_admission``; a disabled tree with
    ``ignore_eos`` goes through ``add_one_req_ignore_eos``, which takes none) and gets ``extend_end``, cut at
    the budget for the one request that does not fit, which ends the admission. The scheduler counts the
    chunk in flight (``inflight_middle_chunks += 1``) before ``ScheduleBatch.init_new(..., chunked_req=...)``
    (``spec_algorithm``: the server's unless given) and the real ``prepare_for_extend``."""
    tree_cache = pools.tree_cache
    budget = chunk_size
    can_run: list[Any] = []
    still_chunked = None
    if chunked_req is not None:
        chunked_req.init_next_round_input()
        remaining = len(chunked_req.full_untruncated_fill_ids) - chunked_req.prefix_len
        tokens = remaining if budget is None else min(remaining, budget)
        chunked_req.extend_end = chunked_req.prefix_len + tokens
        still_chunked = chunked_req if tokens < remaining else None
        can_run.append(chunked_req)
        budget = None if budget is None else budget - tokens
    for req in list(waiting):
        if still_chunked is not None or budget == 0:
            break
        req.init_next_round_input(tree_cache)
        remaining = len(req.full_untruncated_fill_ids) - req.prefix_len
        tokens = remaining if budget is None else min(remaining, budget)
        req.extend_end = req.prefix_len + tokens
        if not tree_cache.disable:
            req.lock = tree_cache.lock(req.last_node)
        if tokens < remaining:
            still_chunked = req
        can_run.append(req)
        waiting.remove(req)
        budget = None if budget is None else budget - tokens
    if not can_run:
        raise ValueError("nothing to prefill")
    if still_chunked is not None:
        still_chunked.inflight_middle_chunks += 1
    batch = new_batch(pools, can_run, chunked_req=still_chunked, spec_algorithm=spec_algorithm)
    batch.prepare_for_extend()
    return batch, still_chunked


def prefill(pools: CpuPools, reqs: list[Any], *, run_forward: bool = True) -> Any:
    """Admit ``reqs`` (:func:`schedule_prefill`, no chunking), build the batch and run the real
    ``prepare_for_extend``; with ``run_forward`` also the prefill stand-in forward and its result processing
    (first output token, the EagleDraftInput in spec mode, the tree checkpoint)."""
    batch, _ = schedule_prefill(pools, list(reqs))
    if run_forward:
        prefill_forward_cpu_stand_in(batch)
    return batch


def next_round_after_prefill(batch: Any, chunked_req: Any = None) -> Any:
    """The start of ``Scheduler.get_next_batch_to_run`` after a prefill: the request still being chunked is
    stashed (``stash_chunked_request`` -> real ``checkpoint_kv_cache``: its chunk goes into the tree) and
    left out, and the prefill batch drops it and the finished requests (real ``filter_batch``). Returns the
    batch, ready to merge into (or become) the running batch."""
    from sglang.srt.mem_cache.common import checkpoint_kv_cache

    if chunked_req is not None and chunked_req.extend_end > chunked_req.prefix_len:
        checkpoint_kv_cache(chunked_req, batch.tree_cache)
    batch.filter_batch(reqs_to_exclude=[chunked_req] if chunked_req is not None else None)
    return batch


def _stand_in_token(req: Any, offset: int = 0) -> int:
    """Deterministic 'sampled' token: depends on the request and its output position only."""
    return (sum(req.origin_input_ids) + 7 * (len(req.output_ids) + offset) + 1) % VOCAB_SIZE


def prefill_forward_cpu_stand_in(batch: Any) -> list[int]:
    """Stand-in for the prefill forward, then what the real ``process_batch_result_prefill`` does with its
    result, inside one ``free_group_begin() / free_group_end()`` as there: a request whose last chunk ran
    gets one token in ``output_ids`` and the real ``update_finish_state``; a finished one the real
    ``release_kv_cache(checkpoint=True)``, an unfinished one the real ``checkpoint_kv_cache`` (its prompt goes
    into the tree, which takes over the slots); a middle chunk only counts down ``inflight_middle_chunks``.
    ``batch.input_ids`` becomes the next decode input; in spec mode the worker's ``_draft_extend_for_prefill``
    result (an EagleDraftInput) becomes ``batch.spec_info``."""
    from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

    tokens = [_stand_in_token(req) for req in batch.reqs]
    allocator = batch.token_to_kv_pool_allocator
    allocator.free_group_begin()
    for req, token in zip(batch.reqs, tokens, strict=True):
        if req.finished() or req.is_retracted:
            continue
        if req.inflight_middle_chunks > 0:
            req.inflight_middle_chunks -= 1  # a middle chunk: no token, nothing cached yet
            continue
        req.output_ids.append(token)
        req.update_finish_state()
        if req.finished():
            release_kv_cache(req, batch.tree_cache, checkpoint=True)
        else:
            checkpoint_kv_cache(req, batch.tree_cache)
    allocator.free_group_end()
    batch.input_ids = torch.tensor(tokens, dtype=torch.int64)
    if not batch.spec_algorithm.is_none():
        batch.spec_info = make_eagle_draft_input(batch, bonus_tokens=tokens)
    return tokens


def plain_decode_forward_cpu_stand_in(batch: Any) -> list[int]:
    """Stand-in for a plain decode forward + ``process_batch_result_decode``: one token per request."""
    tokens = [_stand_in_token(req) for req in batch.reqs]
    for req, token in zip(batch.reqs, tokens, strict=True):
        req.output_ids.append(token)
        req.update_finish_state()
    batch.input_ids = torch.tensor(tokens, dtype=torch.int64)
    return tokens


def decode_step(batch: Any) -> list[int]:
    """One plain decode iteration: real ``prepare_for_decode`` then the stand-in forward."""
    batch.prepare_for_decode()
    return plain_decode_forward_cpu_stand_in(batch)


# --- EAGLE ------------------------------------------------------------------------------------------


def assign_req_to_token_pool_cpu_stand_in(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    batch_size: int,
) -> None:
    """Pure-torch stand-in for ``mem_cache/allocation.assign_req_to_token_pool_func`` (triton kernel):
    for request ``i`` write the next ``end_offset[i] - start_offset[i]`` entries of ``out_cache_loc``
    into ``req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]``."""
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    pos = 0
    for i in range(batch_size):
        n = int(ends[i]) - int(starts[i])
        if n > 0:
            req_to_token[rows[i], starts[i] : ends[i]] = out_cache_loc[pos : pos + n].to(req_to_token.dtype)
        pos += max(n, 0)


@contextlib.contextmanager
def patch_assign_req_to_token_pool() -> Iterator[None]:
    """Swap :func:`assign_req_to_token_pool_cpu_stand_in` into every module that looks the triton
    launcher up by name, and restore the originals afterwards."""
    from sglang.srt.mem_cache import allocation
    from sglang.srt.speculative import spec_utils

    modules = [allocation, spec_utils]
    saved = [m.assign_req_to_token_pool_func for m in modules]
    try:
        for m in modules:
            m.assign_req_to_token_pool_func = assign_req_to_token_pool_cpu_stand_in
        yield
    finally:
        for m, original in zip(modules, saved, strict=True):
            m.assign_req_to_token_pool_func = original


def spec_prepare_for_decode(batch: Any) -> None:
    """Real ``ScheduleBatch.prepare_for_decode`` in spec mode, with the triton launch stood in."""
    with patch_assign_req_to_token_pool():
        batch.prepare_for_decode()


def make_eagle_draft_input(
    batch: Any, *, bonus_tokens: Sequence[int] | None = None, topk: int | None = None
) -> Any:
    """A real ``EagleDraftInput`` for ``batch`` (what ``_draft_extend_*`` hands the next round):
    ``topk_p``/``topk_index`` (bs, topk), ``hidden_states`` (bs, hidden), ``bonus_tokens`` (bs,)."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    bs = len(batch.reqs)
    topk = topk or batch_server_topk() or 1
    if bonus_tokens is None:
        bonus_tokens = [req.output_ids[-1] if req.output_ids else 0 for req in batch.reqs]
    return EagleDraftInput(
        topk_p=torch.full((bs, topk), 1.0 / topk, dtype=torch.float32),
        topk_index=torch.arange(bs * topk, dtype=torch.int64).reshape(bs, topk) % VOCAB_SIZE,
        hidden_states=torch.zeros((bs, HIDDEN_SIZE), dtype=torch.float32),
        bonus_tokens=torch.tensor(list(bonus_tokens), dtype=torch.int32),
        capture_hidden_mode=CaptureHiddenMode.LAST,
    )


def batch_server_topk() -> int | None:
    """``get_spec().speculative_eagle_topk`` of the published ServerArgs."""
    from sglang.srt.runtime_context import get_spec

    return get_spec().speculative_eagle_topk


def make_eagle_verify_input(batch: Any, *, num_steps: int, topk: int, num_draft_tokens: int) -> Any:
    """A real ``EagleVerifyInput`` for ``batch`` (what ``EagleDraftWorker.draft`` builds): a chain tree
    (topk == 1: token j's next is j+1), draft tokens (bs * num_draft_tokens,), positions =
    seq_len + depth."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    bs = len(batch.reqs)
    n = num_draft_tokens
    seq_lens = batch.seq_lens.to(torch.int64)
    depth = torch.arange(n, dtype=torch.int64)
    positions = (seq_lens[:, None] + depth[None, :]).reshape(-1)
    retrieve_index = torch.arange(bs * n, dtype=torch.int64).reshape(bs, n)
    retrieve_next_token = torch.where(depth + 1 < n, depth + 1, torch.full_like(depth, -1))
    retrieve_next_token = retrieve_next_token.expand(bs, n).contiguous()
    retrieve_next_sibling = torch.full((bs, n), -1, dtype=torch.int64)
    seq_lens_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else seq_lens.cpu()
    # Causal mask over [prefix | draft chain] per request, flattened as sglang's tree builder does.
    mask_parts = []
    # the chain's lower triangle, built by a comparison: torch.tril of a bool tensor took about 10 ms a call on a
    # 2-core machine with two intra-op threads (2 us with one), 78 % of a long guard run's time (2026-12-06)
    tree = depth[:, None] >= depth[None, :]
    for sl in seq_lens_cpu.tolist():
        prefix = torch.ones((n, int(sl)), dtype=torch.bool)
        mask_parts.append(torch.cat([prefix, tree], dim=1).reshape(-1))
    return EagleVerifyInput(
        draft_token=torch.zeros(bs * n, dtype=torch.int64),
        custom_mask=torch.cat(mask_parts) if mask_parts else torch.empty(0, dtype=torch.bool),
        positions=positions,
        retrieve_index=retrieve_index,
        retrieve_next_token=retrieve_next_token,
        retrieve_next_sibling=retrieve_next_sibling,
        retrieve_cum_len=None,
        spec_steps=num_steps,
        topk=topk,
        draft_token_num=n,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=int(seq_lens_cpu.sum()),
        seq_lens_cpu=seq_lens_cpu,
    )


@dataclass
class VerifyResult:
    """What a stand-in verify round produced (mirrors ``GenerationBatchResult`` fields)."""

    accept_lens: list[int]
    accepted_tokens: list[list[int]]
    new_seq_lens: torch.Tensor


def spec_verify_forward_cpu_stand_in(batch: Any, accept_lens: Sequence[int]) -> VerifyResult:
    """Stand-in for ``EAGLEWorkerV2.forward_batch_generation`` on a decode batch, then sglang's own
    bookkeeping (see the module docstring). ``accept_lens[i]`` = accepted drafts + 1 bonus token,
    1 <= accept_lens[i] <= num_draft_tokens. Call after :func:`spec_prepare_for_decode`."""
    from sglang.srt.runtime_context import get_spec

    spec = get_spec()
    num_draft_tokens = int(spec.speculative_num_draft_tokens)
    bs = len(batch.reqs)
    if len(accept_lens) != bs:
        raise ValueError(f"need {bs} accept lengths, got {len(accept_lens)}")
    for n in accept_lens:
        if not 1 <= n <= num_draft_tokens:
            raise ValueError(f"accept length {n} outside [1, {num_draft_tokens}]")
    batch.spec_info = make_eagle_verify_input(
        batch,
        num_steps=int(spec.speculative_num_steps),
        topk=int(spec.speculative_eagle_topk or 1),
        num_draft_tokens=num_draft_tokens,
    )
    accept = torch.tensor(list(accept_lens), dtype=batch.seq_lens.dtype)
    for req, n in zip(batch.reqs, accept_lens, strict=True):
        # The verify window [seq_len, seq_len + num_draft_tokens) must lie inside the reservation.
        assert req.kv.kv_allocated_len >= req.kv.kv_committed_len + n, (req.rid, req.kv)
    # run_eagle_verify: new_seq_lens = batch.seq_lens + accept_lens
    new_seq_lens = batch.seq_lens + accept
    accepted_tokens = [
        [_stand_in_token(req, k) for k in range(n)] for req, n in zip(batch.reqs, accept_lens, strict=True)
    ]
    # Scheduler.run_batch (non-overlap spec v2): carry seq_lens and the next draft input.
    batch.seq_lens = new_seq_lens
    if batch.seq_lens_cpu is not None:
        batch.seq_lens_cpu = new_seq_lens.to("cpu")
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
    batch.input_ids = None
    batch.spec_info = make_eagle_draft_input(batch, bonus_tokens=[toks[-1] for toks in accepted_tokens])
    # BatchResultProcessor._resolve_spec_v2_tokens + process_batch_result_decode.
    for req, toks in zip(batch.reqs, accepted_tokens, strict=True):
        if req.finished() or req.is_retracted:
            continue
        req.kv.kv_committed_len += len(toks)
        req.spec_verify_ct += 1
        req.output_ids.extend(toks)
        req.update_finish_state(len(toks))
    return VerifyResult(list(accept_lens), accepted_tokens, new_seq_lens)


def spec_decode_step(batch: Any, accept_lens: Sequence[int]) -> VerifyResult:
    """One EAGLE iteration: real (patched) ``prepare_for_decode`` then the stand-in verify."""
    spec_prepare_for_decode(batch)
    return spec_verify_forward_cpu_stand_in(batch, accept_lens)


# --- leaving the batch ------------------------------------------------------------------------------


def finish_req(req: Any) -> None:
    """Mark ``req`` finished by length, as ``update_finish_state`` does at max_new_tokens."""
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
    req.finished_len = len(req.output_ids)


def release_finished_cpu_stand_in(pools: CpuPools, batch: Any) -> list[Any]:
    """For each finished request the real ``release_kv_cache(req, tree_cache, checkpoint=True)``, all inside
    one ``free_group_begin() / free_group_end()`` (as ``process_batch_result_decode`` releases them: the
    frees are queued until the group ends), then the real ``batch.filter_batch()`` (the scheduler's next
    ``get_next_batch_to_run``). Returns the released reqs."""
    from sglang.srt.mem_cache.common import release_kv_cache

    released = [req for req in batch.reqs if req.finished() and req.kv.holds_kv]
    pools.allocator.free_group_begin()
    for req in released:
        release_kv_cache(req, pools.tree_cache, checkpoint=True)
    pools.allocator.free_group_end()
    batch.filter_batch()
    return released


def tree_held(pools: CpuPools) -> int:
    """KV slots the tree cache owns (evictable + locked): no request's, and not in the free list."""
    return int(pools.tree_cache.evictable_size()) + int(pools.tree_cache.protected_size())


def merge_batches(batch: Any, other: Any) -> Any:
    """Real ``ScheduleBatch.merge_batch`` (``batch`` absorbs ``other``)."""
    batch.merge_batch(other)
    return batch


def kv_lens(batch: Any) -> list[tuple[int, int]]:
    """(kv_committed_len, kv_allocated_len) per request, from ``req.kv`` (``ReqKvInfo``)."""
    return [(req.kv.kv_committed_len, req.kv.kv_allocated_len) for req in batch.reqs]
