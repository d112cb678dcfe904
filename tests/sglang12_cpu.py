"""Harness: REAL sglang 0.5.12 objects with the v1 EAGLEWorker on a CPU-only machine (.venv12, made by
scripts/setup-v1.sh), for the v1 switch (shim/switch/v1.py) and the 0.5.12 guard adapter. Not a test module.

Real sglang 0.5.12 code exercised (nothing re-implemented): ServerArgs (SGLANG_ENABLE_SPEC_V2=0: the
non-overlap schedule, so the batch is not spec-v2) and `set_global_server_args_for_scheduler`; ModelConfig on a
config.json without weights; ReqToTokenPool, MHATokenToKVPool, TokenToKVPoolAllocator, a disabled RadixCache;
Req; ScheduleBatch.init_new / prepare_for_extend / prepare_for_decode (both paths: `alloc_for_decode` and the
early return) / filter_batch(v1_spec_info_filtered=True) / merge_batch / get_model_worker_batch;
`Scheduler.update_running_batch` (filter, check_decode_mem, prepare_for_decode) on a scheduler object built
without __init__; `release_kv_cache`; EagleDraftInput (filter/merge), EagleVerifyInput with its real
`prepare_for_verify` (alloc_token_slots + req_to_token), EagleDraftExtendInput; and the real orchestration of
`EAGLEWorker.forward_batch_generation` (draft, verify, draft-extend or the idle stub, the result).

Stand-ins, each named `*_cpu_stand_in` / `*CpuStandIn`, put on the real classes BEFORE `load_plugins()` so that
SGLang's HookRegistry wraps them exactly as it wraps the real methods on a GPU host:
- `sgl_kernel` (CUDA kernels): an import-only module whose functions raise if called;
- the triton `assign_req_to_token_pool_func` (as imported by eagle_info) -> a torch loop;
- `TpModelWorker.forward_batch_generation` -> `target_forward_cpu_stand_in`: one token per request. It does what
  the real forward would do with the shapes it is given: a DECODE batch that replays a graph captured for more
  tokens per request, or whose out_cache_loc does not hold one slot per request, raises the size error the GPU
  raises ("The size of tensor a ... must match ...");
- `EAGLEWorker.draft` -> a chain-tree EagleVerifyInput; `EAGLEWorker.verify` -> the real prepare_for_verify, then
  EagleVerifyInput.verify's bookkeeping for queued accept lengths; `EAGLEWorker.forward_draft_extend_after_decode`
  -> checks the EagleDraftExtendInput it is fed and returns the next EagleDraftInput;
- the prefill forward + draft prefill and `process_batch_result_decode` (release of finished requests);
- the model runners and the target's CudaGraphRunner (host attributes only).
Tokens are a deterministic function of the request and the output position, so greedy outputs must come out the
same whether a step was speculative or plain.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("SGLANG_ENABLE_SPEC_V2", "0")  # 0.5.12: spec v1 (EAGLEWorker), non-overlap schedule

import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
STAND_INS_DIR = REPO_ROOT / "stand_ins" / "cpu"
VOCAB_SIZE = 1000
HIDDEN_SIZE = 64
TINY_MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN_SIZE,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
    "vocab_size": VOCAB_SIZE, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
}
STAND_IN_CALLS: dict[str, int] = {}


def _count(name: str) -> None:
    STAND_IN_CALLS[name] = STAND_IN_CALLS.get(name, 0) + 1


def _kernel_module_cpu_stand_in(name: str) -> types.ModuleType:
    """An import-only stand-in for a CUDA kernel package: any function it is asked for raises when called."""
    module = types.ModuleType(name)

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)

        def kernel_cpu_stand_in(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"{name}.{attr} is a CUDA kernel: no CPU stand-in")
        return kernel_cpu_stand_in

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    module.__path__ = []  # a package, so `from sgl_kernel.x import y` resolves
    return module


def install_import_stand_ins() -> None:
    """stand_ins/cpu (torchvision) on sys.path; sgl_kernel as an import-only module (0.5.12's scheduler imports
    sgl_kernel.kvcacheio through the host KV pool module)."""
    if str(STAND_INS_DIR) not in sys.path:
        sys.path.insert(0, str(STAND_INS_DIR))
    try:
        import sgl_kernel  # noqa: F401
    except ImportError:
        for name in ("sgl_kernel", "sgl_kernel.kvcacheio"):
            sys.modules.setdefault(name, _kernel_module_cpu_stand_in(name))


install_import_stand_ins()


def write_tiny_model_config(directory: str | Path | None = None) -> Path:
    target = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="specflip-tiny12-"))
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(TINY_MODEL_CONFIG))
    return target


def make_server_args(model_dir: str | Path, *, num_steps: int = 3, max_running_requests: int = 48) -> Any:
    """Real 0.5.12 ServerArgs for an EAGLE server on CPU (no draft model is loaded here), published as the
    scheduler's global server args."""
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    sa = ServerArgs(
        model_path=str(model_dir), device="cpu", dtype="float32", attention_backend="torch_native",
        skip_tokenizer_init=True, disable_cuda_graph=True, disable_radix_cache=True,
        max_running_requests=max_running_requests, page_size=1, random_seed=0, speculative_algorithm="EAGLE",
        speculative_num_steps=num_steps, speculative_eagle_topk=1, speculative_num_draft_tokens=num_steps + 1,
    )
    set_global_server_args_for_scheduler(sa)
    return sa


@dataclass
class CpuPools:
    server_args: Any
    model_config: Any
    req_to_token_pool: Any
    kv_pool: Any
    allocator: Any
    tree_cache: Any
    spec_algorithm: Any


def build_pools(server_args: Any, *, kv_size: int = 2048, max_reqs: int = 64, radix_cache: bool = False,
                chunk_cache: bool = False) -> CpuPools:
    """``radix_cache``: an enabled RadixCache (EAGLE's bigram keys), as a server without
    ``--disable-radix-cache`` has; otherwise a disabled one, or with ``chunk_cache`` a ChunkCache, what a server
    with ``--disable-radix-cache`` and a chunked prefill size builds (Scheduler.init_cache; its stash keeps the
    chunks' slots on the request)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    model_config = ModelConfig.from_server_args(server_args)
    req_to_token_pool = ReqToTokenPool(size=max_reqs, max_context_len=model_config.context_len + 64, device="cpu",
                                       enable_memory_saver=False)
    kv_pool = MHATokenToKVPool(size=kv_size, page_size=1, dtype=torch.float32,
                               head_num=model_config.get_num_kv_heads(1), head_dim=model_config.head_dim,
                               layer_num=model_config.num_hidden_layers, device="cpu", enable_memory_saver=False)
    allocator = TokenToKVPoolAllocator(size=kv_size, dtype=torch.float32, device="cpu", kvcache=kv_pool,
                                       need_sort=False)
    params = CacheInitParams(disable=not radix_cache, req_to_token_pool=req_to_token_pool,
                             token_to_kv_pool_allocator=allocator, page_size=1, is_eagle=True)
    if chunk_cache and not radix_cache:
        from sglang.srt.mem_cache.chunk_cache import ChunkCache

        tree_cache = ChunkCache(params)
    else:
        tree_cache = RadixCache(params)
    return CpuPools(server_args, model_config, req_to_token_pool, kv_pool, allocator, tree_cache,
                    SpeculativeAlgorithm.from_string(server_args.speculative_algorithm))


def make_req(rid: str, input_ids: Sequence[int], *, max_new_tokens: int) -> Any:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    params.normalize(None)
    params.verify(VOCAB_SIZE)
    return Req(rid, "", list(input_ids), params, vocab_size=VOCAB_SIZE)


def stand_in_token(req: Any, offset: int = 0) -> int:
    """The 'greedy' token at output position len(output_ids) + offset: a function of the request and the
    position only, whatever kind of step produces it."""
    return (sum(req.origin_input_ids) + 7 * (len(req.output_ids) + offset) + 1) % VOCAB_SIZE


# --- GPU stand-ins ---------------------------------------------------------------------------------------------


def assign_req_to_token_pool_cpu_stand_in(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                          start_offset: torch.Tensor, end_offset: torch.Tensor,
                                          out_cache_loc: torch.Tensor, batch_size: int) -> None:
    """The triton assign_req_to_token_pool: req_to_token[row_i, start_i:end_i] = the next slots of out_cache_loc."""
    pos = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        n = int(end) - int(start)
        if n > 0:
            req_to_token[row, start:end] = out_cache_loc[pos:pos + n].to(req_to_token.dtype)
        pos += max(n, 0)


@dataclass
class CudaGraphRunnerCpuStandIn:
    """What 0.5.12's CudaGraphRunner.can_run reads: capture sizes and tokens per request (1: DECODE graphs;
    num_draft_tokens: the TARGET_VERIFY graphs a speculative target captures)."""

    num_tokens_per_bs: int
    capture_bs: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])

    @property
    def max_bs(self) -> int:
        return max(self.capture_bs)


@dataclass
class ModelRunnerCpuStandIn:
    model_config: Any
    spec_algorithm: Any
    graph_runner: Any = None
    attn_backend: Any = None
    tp_group: Any = None


def target_forward_cpu_stand_in(self: Any, model_worker_batch: Any, forward_batch: Any = None,
                                pp_proxy_tensors: Any = None, is_verify: bool = False,
                                skip_attn_backend_init: bool = False) -> Any:
    """TpModelWorker.forward_batch_generation: one sampled token per request. Shape checks are the GPU's."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.managers.utils import GenerationBatchResult

    _count("target_forward")
    mwb = model_worker_batch
    bs = len(mwb.reqs)
    runner = self.model_runner.graph_runner
    graph = runner is not None and bs <= runner.max_bs
    speculative = mwb.spec_info is not None and not mwb.spec_algorithm.is_none()
    tokens_per_req = runner.num_tokens_per_bs if graph else (2 if speculative else 1)
    slots = 0 if mwb.out_cache_loc is None else (1 if mwb.out_cache_loc.dim() == 0 else mwb.out_cache_loc.shape[0])
    if mwb.forward_mode.is_decode() and (tokens_per_req != 1 or speculative):
        raise RuntimeError(f"The size of tensor a ({bs * max(tokens_per_req, 2)}) must match the size of tensor b "
                           f"({bs}) at non-singleton dimension 0 (a DECODE batch replayed with speculative shapes)")
    if mwb.forward_mode.is_decode() and slots != bs:
        raise RuntimeError(f"The size of tensor a ({slots}) must match the size of tensor b ({bs}) at non-singleton "
                           f"dimension 0 (out_cache_loc of a DECODE batch)")
    tokens = [stand_in_token(req) for req in mwb.reqs]
    hidden = torch.zeros((bs, HIDDEN_SIZE), dtype=torch.float32)
    return GenerationBatchResult(logits_output=LogitsProcessorOutput(next_token_logits=None, hidden_states=hidden),
                                 next_token_ids=torch.tensor(tokens, dtype=torch.int64), can_run_cuda_graph=graph)


def draft_cpu_stand_in(self: Any, batch: Any) -> Any:
    """EAGLEWorker.draft: the EagleVerifyInput of a k-step chain draft (topk 1)."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    _count("draft")
    bs, k = len(batch.reqs), int(self.speculative_num_steps)
    n = k + 1
    seq_lens = batch.seq_lens.to(torch.int64)
    depth = torch.arange(n, dtype=torch.int64)
    return EagleVerifyInput(
        draft_token=torch.zeros(bs * n, dtype=torch.int64), custom_mask=torch.ones(1, dtype=torch.bool),
        positions=(seq_lens[:, None] + depth[None, :]).reshape(-1),
        retrieve_index=torch.arange(bs * n, dtype=torch.int64).reshape(bs, n),
        retrieve_next_token=torch.where(depth + 1 < n, depth + 1, -1).expand(bs, n).contiguous(),
        retrieve_next_sibling=torch.full((bs, n), -1, dtype=torch.int64), retrieve_cum_len=None, spec_steps=k,
        topk=1, draft_token_num=n, capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=int(batch.seq_lens_cpu.sum()), seq_lens_cpu=batch.seq_lens_cpu.clone(),
    )


def verify_cpu_stand_in(self: Any, batch: Any) -> Any:
    """EAGLEWorker.verify: the real EagleVerifyInput.prepare_for_verify (the verify slots), then what
    EagleVerifyInput.verify does for the accept lengths queued on the worker (output_ids, check_finished,
    kv lengths, free the unaccepted slots, seq_lens, the draft-extend input of the unfinished rows)."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput, EagleVerifyOutput

    _count("verify")
    spec_info = batch.spec_info
    spec_info.prepare_for_verify(batch, self.page_size)
    batch.forward_mode = ForwardMode.TARGET_VERIFY
    bs, n = len(batch.reqs), int(spec_info.draft_token_num)
    queued = list(getattr(self, "accept_lens_cpu_stand_in", None) or [n])
    accept, tokens = [], []
    for i, req in enumerate(batch.reqs):
        want = max(1, min(n, int(queued[i % len(queued)])))
        row = []
        for _ in range(want):
            row.append(stand_in_token(req))
            req.output_ids.append(row[-1])
            req.check_finished()
            if req.finished():
                break
        req.kv_committed_len += len(row)
        req.kv_allocated_len = req.kv_committed_len
        accept.append(len(row))
        tokens.append(row)
    slots = batch.out_cache_loc.reshape(bs, n)
    keep_mask = torch.arange(n)[None, :] < torch.tensor(accept)[:, None]
    self.token_to_kv_pool_allocator.free(slots[~keep_mask])
    accept_t = torch.tensor(accept, dtype=torch.int32)
    batch.seq_lens.add_(accept_t.to(batch.seq_lens.dtype))
    batch.seq_lens_cpu.add_(accept_t.to(batch.seq_lens_cpu.dtype))
    unfinished = [i for i, req in enumerate(batch.reqs) if not req.finished()]
    rows = torch.tensor(unfinished, dtype=torch.int64)
    batch.out_cache_loc = torch.cat([slots[i, :accept[i]] for i in unfinished]) if unfinished \
        else torch.empty(0, dtype=torch.int64)
    draft_extend_input = EagleDraftExtendInput(
        hidden_states=torch.zeros((sum(accept[i] for i in unfinished), HIDDEN_SIZE)),
        num_correct_drafts=accept_t[rows] - 1, num_accept_tokens=accept_t[rows],
        num_accept_tokens_cpu=[accept[i] for i in unfinished],
        input_ids=torch.tensor([t for i in unfinished for t in tokens[i]], dtype=torch.int32),
        seq_lens=batch.seq_lens[rows], seq_lens_cpu=batch.seq_lens_cpu[unfinished],
        req_pool_indices=batch.req_pool_indices[rows],
    )
    batch.forward_mode = ForwardMode.DECODE
    flat = torch.tensor([t for row in tokens for t in row], dtype=torch.int64)
    output = EagleVerifyOutput(draft_extend_input=draft_extend_input,
                               logits_output=LogitsProcessorOutput(next_token_logits=None), accept_tokens=flat,
                               num_correct_drafts_per_req_cpu=[a - 1 for a in accept],
                               accept_indices=torch.arange(flat.shape[0]))
    return output.logits_output, output, False


def forward_draft_extend_after_decode_cpu_stand_in(self: Any, batch: Any) -> Any:
    """EAGLEWorker.forward_draft_extend_after_decode: checks the EagleDraftExtendInput is consistent (what the
    triton kernel and the draft forward index by) and returns the next iteration's EagleDraftInput."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput, EagleDraftInput

    _count("draft_extend")
    dei = batch.spec_info
    assert isinstance(dei, EagleDraftExtendInput), type(dei)
    n = dei.seq_lens.shape[0]
    assert len(dei.num_accept_tokens_cpu) == n == dei.req_pool_indices.shape[0] == dei.num_accept_tokens.shape[0]
    assert sum(dei.num_accept_tokens_cpu) == dei.input_ids.shape[0] == batch.out_cache_loc.shape[0]
    ends = torch.cumsum(torch.tensor(dei.num_accept_tokens_cpu), 0) - 1
    return EagleDraftInput(bonus_tokens=dei.input_ids[ends].to(torch.int32),
                           hidden_states=torch.zeros((n, HIDDEN_SIZE)), topk_p=torch.ones((n, 1)),
                           topk_index=torch.zeros((n, 1), dtype=torch.int64),
                           capture_hidden_mode=CaptureHiddenMode.LAST)


def install_gpu_stand_ins() -> None:
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.speculative import eagle_info
    from sglang.srt.speculative.eagle_worker import EAGLEWorker

    TpModelWorker.forward_batch_generation = target_forward_cpu_stand_in
    EAGLEWorker.draft = draft_cpu_stand_in
    EAGLEWorker.verify = verify_cpu_stand_in
    EAGLEWorker.forward_draft_extend_after_decode = forward_draft_extend_after_decode_cpu_stand_in
    eagle_info.assign_req_to_token_pool_func = assign_req_to_token_pool_cpu_stand_in


def make_worker(pools: CpuPools, *, num_steps: int = 3) -> Any:
    """A real EAGLEWorker (object.__new__: no model loaded) over a real TpModelWorker; their GPU methods are the
    stand-ins above. The target replays a verify-shaped CudaGraphRunner, as a speculative target does."""
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.speculative.eagle_worker import EAGLEWorker
    from sglang.srt.utils import empty_context

    target = object.__new__(TpModelWorker)
    target._model_runner = ModelRunnerCpuStandIn(pools.model_config, pools.spec_algorithm,
                                                 CudaGraphRunnerCpuStandIn(num_tokens_per_bs=num_steps + 1))
    target.model_config = pools.model_config
    worker = object.__new__(EAGLEWorker)
    worker.__dict__.update(
        server_args=pools.server_args, topk=1, speculative_num_steps=num_steps,
        speculative_num_draft_tokens=num_steps + 1, device="cpu", target_worker=target, page_size=1,
        speculative_algorithm=pools.spec_algorithm, adaptive_controller=None, draft_tp_context=empty_context,
        token_to_kv_pool_allocator=pools.allocator, req_to_token_pool=pools.req_to_token_pool,
        _model_runner=ModelRunnerCpuStandIn(pools.model_config, pools.spec_algorithm),
    )
    return worker


def make_scheduler(pools: CpuPools) -> Any:
    """A real Scheduler object (no __init__) with what update_running_batch reads."""
    from sglang.srt.managers.scheduler import Scheduler

    scheduler = object.__new__(Scheduler)
    scheduler.__dict__.update(enable_hierarchical_cache=False, forward_ct=0, new_token_ratio=0.4,
                              new_token_ratio_decay=0.01, min_new_token_ratio=0.1, waiting_queue=[],
                              chunked_req=None, server_args=pools.server_args, tree_cache=pools.tree_cache,
                              token_to_kv_pool_allocator=pools.allocator, enable_metrics=False)
    return scheduler


class V1Server:
    """A scheduler loop on real 0.5.12 objects: prefill (+ draft prefill stand-in), merge, update_running_batch,
    the worker's forward_batch_generation (hooked by the switch and the guard), result processing."""

    def __init__(self, pools: CpuPools, *, num_steps: int = 3) -> None:
        self.pools = pools
        self.worker = make_worker(pools, num_steps=num_steps)
        self.scheduler = make_scheduler(pools)
        self.running: Any = None
        self.finished: list[Any] = []

    def admit(self, reqs: list[Any]) -> None:
        """get_new_batch_prefill + run_batch (target + draft prefill) + merge into the running batch."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.mem_cache.common import maybe_cache_unfinished_req, release_kv_cache
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        for req in reqs:
            req.init_next_round_input(self.pools.tree_cache)
        batch = ScheduleBatch.init_new(reqs, self.pools.req_to_token_pool, self.pools.allocator, self.pools.tree_cache,
                                       self.pools.model_config, enable_overlap=False,
                                       spec_algorithm=self.pools.spec_algorithm)
        batch.prepare_for_extend()
        tokens = [stand_in_token(req) for req in batch.reqs]  # prefill forward + process_batch_result_prefill
        for req, token in zip(batch.reqs, tokens, strict=True):
            req.output_ids.append(token)
            req.check_finished()
            if req.finished():
                release_kv_cache(req, self.pools.tree_cache)
                self.finished.append(req)
            else:  # the radix cache takes the prompt (and frees slots that duplicate what it holds)
                maybe_cache_unfinished_req(req, self.pools.tree_cache)
        batch.output_ids = torch.tensor(tokens, dtype=torch.int64)
        bs = len(reqs)  # forward_draft_extend (draft prefill): the first EagleDraftInput
        batch.spec_info = EagleDraftInput(bonus_tokens=torch.tensor(tokens, dtype=torch.int32),
                                          hidden_states=torch.zeros((bs, HIDDEN_SIZE)), topk_p=torch.ones((bs, 1)),
                                          topk_index=torch.zeros((bs, 1), dtype=torch.int64))
        batch.filter_batch()  # get_next_batch_to_run: last_batch.filter_batch, then merge or become running
        if batch.is_empty():
            return
        if self.running is None or self.running.is_empty():
            self.running = batch
        else:
            self.running.merge_batch(batch)

    def step(self) -> Any:
        """One decode iteration; returns the worker's result."""
        batch = self.scheduler.update_running_batch(self.running)
        if batch.is_empty():
            return None
        result = self.worker.forward_batch_generation(batch)
        batch.output_ids = result.next_token_ids  # run_batch
        self.process_batch_result_decode_cpu_stand_in(batch)
        return result

    def process_batch_result_decode_cpu_stand_in(self, batch: Any) -> None:
        """process_batch_result_decode for spec v1: outputs were appended in the worker; finished requests
        release their KV (real release_kv_cache)."""
        release_finished(batch.reqs, self.pools.allocator, self.pools.tree_cache, self.finished)

    def run_until_done(self, limit: int = 400) -> None:
        for _ in range(limit):
            if self.running is None or all(req.finished() for req in self.running.reqs):
                self.step_filter_only()
                return
            self.step()
        raise AssertionError("requests did not finish")

    def step_filter_only(self) -> None:
        if self.running is not None:
            self.running.filter_batch(v1_spec_info_filtered=True)


def make_reqs(prefix: str, count: int, *, max_new_tokens: int, start: int = 0) -> list[Any]:
    return [make_req(f"{prefix}{start + i}", list(range(10 + i, 18 + 2 * i)), max_new_tokens=max_new_tokens)
            for i in range(count)]


def expected_output(req: Any) -> list[int]:
    """The greedy output the stand-in target defines for `req` (position by position)."""
    probe = SimpleNamespace(origin_input_ids=req.origin_input_ids, output_ids=[])
    out = []
    for _ in range(req.sampling_params.max_new_tokens):
        out.append(stand_in_token(probe))
        probe.output_ids.append(out[-1])
    return out


# --- the non-overlap scheduler loop, for the v1 switch's plain path (draft mode retract) ---------------------------


def get_next_batch_to_run_cpu_stand_in(self: Any) -> Any:
    """Scheduler.get_next_batch_to_run, its steps for this harness (the real one needs a fully built scheduler):
    the prefilled batch (`last_batch`) filtered and merged into the running batch; then a prefill of every waiting
    request the real `get_num_allocatable_reqs` (hooked by the switch's admission cap) admits, each first matched
    against the tree (`init_next_round_input`, as PrefillAdder does); else the real `update_running_batch`.

    Chunked prefill when the scheduler has `chunk_size_cpu_stand_in` (the prefill token budget, the server's
    `chunked_prefill_size`; None: no chunking), in 0.5.12's order: the request being chunked (`chunked_req`) is
    stashed first (the real `Scheduler.stash_chunked_request`: `maybe_cache_unfinished_req(chunked=True)`) and left
    out of the merge (`filter_batch(chunked_req_to_exclude=...)`), then the prefill is the real PrefillAdder's with
    that budget: the chunked request first (`init_next_round_input()`, `add_chunked_req`), then waiting requests
    (`add_one_req`) while it admits them; `is_chunked` counted up for a request still being chunked, the batch built
    with `chunked_req` (`init_new`, `prepare_for_extend`)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    chunk_size = getattr(self, "chunk_size_cpu_stand_in", None)
    chunked = self.chunked_req
    if chunked is not None:
        self.stash_chunked_request(chunked)
    last = self.last_batch
    if last is not None and last.forward_mode.is_extend():
        last.filter_batch(chunked_req_to_exclude=[chunked] if chunked is not None else None)
        if not last.is_empty():
            if self.running_batch.is_empty():
                self.running_batch = last
            else:
                self.running_batch.merge_batch(last)
    if chunked is not None or (chunk_size is not None and self.waiting_queue):
        # a request being chunked goes on (its last chunk unbounded if the budget was taken away meanwhile)
        batch = _chunked_prefill_batch(self, chunk_size if chunk_size is not None else 1 << 30)
        if batch is not None:
            return batch
    elif self.waiting_queue:
        room = self.get_num_allocatable_reqs(len(self.running_batch.reqs))
        reqs = self.waiting_queue[:max(room, 0)]
        if reqs:
            del self.waiting_queue[:len(reqs)]
            for req in reqs:
                req.init_next_round_input(self.tree_cache)
            batch = ScheduleBatch.init_new(reqs, self.req_to_token_pool, self.token_to_kv_pool_allocator,
                                           self.tree_cache, self.model_config, False, self.spec_algorithm)
            batch.prepare_for_extend()
            return batch
    if not self.running_batch.is_empty():
        self.running_batch = self.update_running_batch(self.running_batch)
        return None if self.running_batch.is_empty() else self.running_batch
    return None


def _chunked_prefill_batch(self: Any, chunk_size: int) -> Any:
    """0.5.12's `_get_new_batch_prefill_raw` with a chunk budget, the steps this harness needs (see above)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

    adder = PrefillAdder(1, self.tree_cache, self.token_to_kv_pool_allocator, self.running_batch,
                         self.new_token_ratio, rem_input_tokens=16384, rem_chunk_tokens=chunk_size)
    if self.chunked_req is not None:
        self.chunked_req.init_next_round_input()
        self.chunked_req = adder.add_chunked_req(self.chunked_req)
    room = self.get_num_allocatable_reqs(len(self.running_batch.reqs))
    for req in list(self.waiting_queue):
        if len(adder.can_run_list) >= room:
            break
        req.init_next_round_input(self.tree_cache)
        if adder.add_one_req(req, has_chunked_req=self.chunked_req is not None,
                             truncation_align_size=None) != AddReqResult.CONTINUE:
            break
    if not adder.can_run_list:
        return None
    self.waiting_queue[:] = [r for r in self.waiting_queue if r not in adder.can_run_list]
    if adder.new_chunked_req is not None:
        assert self.chunked_req is None
        self.chunked_req = adder.new_chunked_req
    if self.chunked_req is not None:
        self.chunked_req.is_chunked += 1
    batch = ScheduleBatch.init_new(adder.can_run_list, self.req_to_token_pool, self.token_to_kv_pool_allocator,
                                   self.tree_cache, self.model_config, False, self.spec_algorithm,
                                   chunked_req=self.chunked_req)
    batch.prepare_for_extend()
    return batch


def install_scheduler_loop_stand_in() -> None:
    """Before load_plugins(): the switch's and the guard's hooks wrap them as they wrap the real methods."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_output_processor_mixin import SchedulerOutputProcessorMixin

    Scheduler.get_next_batch_to_run = get_next_batch_to_run_cpu_stand_in
    SchedulerOutputProcessorMixin.process_batch_result_decode = process_batch_result_decode_cpu_stand_in


def process_batch_result_decode_cpu_stand_in(self: Any, batch: Any, result: Any) -> None:
    """0.5.12's process_batch_result_decode, its per-request loop only (V1OverlapLoopServer calls it): a spec v1 step's
    tokens were appended by its verify; a plain step's are appended here, a request an earlier result finished or
    retracted being skipped under overlap; what finished is released inside the allocator's free group. Released
    requests go to `self.finished_cpu_stand_in` (the harness's list)."""
    if batch.spec_algorithm.is_none():
        for req, token in zip(batch.reqs, result.next_token_ids.tolist(), strict=True):
            if not (self.enable_overlap and (req.finished() or req.is_retracted)):
                req.output_ids.append(token)
                req.check_finished()
    release_finished(batch.reqs, self.token_to_kv_pool_allocator, self.tree_cache, self.finished_cpu_stand_in)


def release_finished(reqs: list[Any], allocator: Any, tree_cache: Any, finished: list[Any]) -> None:
    """As the scheduler does after a step: every finished request not released yet releases its KV (real
    release_kv_cache), all inside one allocator free group; `finished` collects them."""
    from sglang.srt.mem_cache.common import release_kv_cache

    allocator.free_group_begin()
    for req in reqs:
        if req.finished() and req not in finished:
            release_kv_cache(req, tree_cache)
            finished.append(req)
    allocator.free_group_end()


class V1LoopServer:
    """Scheduler.event_loop_normal on a real Scheduler object (no __init__): get_next_batch_to_run (hooked), then
    run_batch's two branches as 0.5.12 has them (spec v1: the EAGLEWorker gets the ScheduleBatch; spec_algorithm
    NONE: `scheduler.model_worker` gets `get_model_worker_batch()`), then the result's processing (the prefill's,
    the plain decode's, or spec v1's), then `last_batch = batch`. A scheduler-level spec_algorithm NONE (the
    switch's plain path) makes new batches plain, as ScheduleBatch.init_new does on the GPU host."""

    def __init__(self, pools: CpuPools, *, num_steps: int = 3, max_running: int = 48) -> None:
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        self.pools = pools
        self.worker = make_worker(pools, num_steps=num_steps)
        s = make_scheduler(pools)
        pools.server_args.pp_max_micro_batch_size = max_running
        empty = ScheduleBatch.init_new([], pools.req_to_token_pool, pools.allocator, pools.tree_cache,
                                       pools.model_config, False, pools.spec_algorithm)
        s.__dict__.update(running_batch=empty, last_batch=None, spec_algorithm=pools.spec_algorithm,
                          tp_worker=self.worker.target_worker, model_worker=self.worker,
                          model_config=pools.model_config,
                          req_to_token_pool=pools.req_to_token_pool, enable_priority_scheduling=False,
                          disaggregation_mode=DisaggregationMode.NULL, max_queued_requests=None,
                          enable_hicache_storage=False)
        self.scheduler = s
        self.finished: list[Any] = []
        self.kinds: list[str] = []  # per iteration: prefill / spec / plain

    def add(self, reqs: list[Any]) -> None:
        self.scheduler.waiting_queue.extend(reqs)

    def iteration(self) -> Any:
        s = self.scheduler
        batch = s.get_next_batch_to_run()
        if batch is not None:
            self.run_and_process(batch)
        s.last_batch = batch
        return batch

    def run_and_process(self, batch: Any) -> None:
        """The normal loop's run_batch and process_batch_result of one batch, by its kind."""
        if batch.forward_mode.is_extend():
            self._prefill(batch)
        elif batch.spec_algorithm.is_none():
            self._plain_decode(batch)
        else:
            self._spec_decode(batch)

    def _release_finished(self, batch: Any) -> None:
        release_finished(batch.reqs, self.pools.allocator, self.pools.tree_cache, self.finished)

    def _prefill(self, batch: Any) -> None:
        """run_batch + process_batch_result_prefill: the target's token for each request (a retracted request's
        next one), the draft prefill's EagleDraftInput when the batch speculates."""
        from sglang.srt.mem_cache.common import maybe_cache_unfinished_req, release_kv_cache
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        self.kinds.append("prefill")
        _count("prefill" if batch.spec_algorithm.is_none() else "spec_prefill")
        tokens = [stand_in_token(req) for req in batch.reqs]
        for req, token in zip(batch.reqs, tokens, strict=True):
            if req.is_chunked > 0:  # being chunked: its prefill is not finished (process_batch_result_prefill)
                req.is_chunked -= 1
                continue
            req.output_ids.append(token)
            req.check_finished()
            if req.finished():
                release_kv_cache(req, self.pools.tree_cache)
                self.finished.append(req)
            else:
                maybe_cache_unfinished_req(req, self.pools.tree_cache)
        batch.output_ids = torch.tensor(tokens, dtype=torch.int64)
        if not batch.spec_algorithm.is_none():
            bs = len(batch.reqs)
            batch.spec_info = EagleDraftInput(bonus_tokens=torch.tensor(tokens, dtype=torch.int32),
                                              hidden_states=torch.zeros((bs, HIDDEN_SIZE)),
                                              topk_p=torch.ones((bs, 1)),
                                              topk_index=torch.zeros((bs, 1), dtype=torch.int64))

    def _plain_decode(self, batch: Any) -> None:
        """run_batch's worker-batch branch and process_batch_result_decode's non-spec path."""
        self.kinds.append("plain")
        result = self.scheduler.model_worker.forward_batch_generation(batch.get_model_worker_batch())
        batch.output_ids = result.next_token_ids
        for req, token in zip(batch.reqs, result.next_token_ids.tolist(), strict=True):
            req.output_ids.append(token)
            req.check_finished()
        self._release_finished(batch)

    def _spec_decode(self, batch: Any) -> None:
        self.kinds.append("spec")
        result = self.scheduler.model_worker.forward_batch_generation(batch)
        batch.output_ids = result.next_token_ids
        self._release_finished(batch)

    def run_until_idle(self, limit: int = 600) -> None:
        for _ in range(limit):
            s = self.scheduler
            if not s.waiting_queue and all(r.finished() for r in s.running_batch.reqs) and (
                    s.last_batch is None or not s.last_batch.forward_mode.is_extend()):
                self.iteration()  # the idle iteration (filter, flips at no demand)
                return
            self.iteration()
        raise AssertionError("requests did not finish")


class V1OverlapLoopServer(V1LoopServer):
    """shim/switch/v1_loop.py's real ``iteration`` (SPECFLIP_V1_LOOP=overlap) on the real Scheduler object, with
    0.5.12's real ``FutureMap`` on the CPU (``alloc_future_indices``, ``resolve_future``, ``store_to_map``), the real
    ``is_disable_overlap_for_batch`` and the real ``get_next_batch_to_run`` (hooked by the switch). Stand-ins, set on
    the scheduler object: ``run_batch`` (:meth:`run_batch_cpu_stand_in`) and ``process_batch_result``
    (:meth:`process_batch_result_cpu_stand_in`), as V1LoopServer has them for the normal loop's iteration, and for
    an overlapped one split as run_batch's overlap branch and process_batch_result_{prefill,decode} split them. An
    overlapped plain step's stand-in model "samples" at the position the launched batch's seq_lens give and returns a
    wrong token when the input token relayed to it through the future map is not the one before: greedy outputs are
    exact only when the order and the relay are right."""

    def __init__(self, pools: CpuPools, *, num_steps: int = 3, max_running: int = 48) -> None:
        from shim.switch.v1_loop import init_overlap_state

        super().__init__(pools, num_steps=num_steps, max_running=max_running)
        s = self.scheduler
        s.__dict__.update(max_running_requests=max_running, chunked_prefill_size=pools.server_args.chunked_prefill_size,
                          device="cpu", is_generation=True, enable_overlap=False, cur_batch=None,
                          require_mlp_sync=False, run_batch=self.run_batch_cpu_stand_in,
                          process_batch_result=self.process_batch_result_cpu_stand_in, on_idle=lambda: None,
                          launch_batch_sample_if_needed=lambda result: None, finished_cpu_stand_in=self.finished)
        init_overlap_state(s)
        self.overlapped = 0  # plain launches made while the step before was still unprocessed

    def iteration(self) -> Any:
        import shim.switch.v1 as sw
        from shim.switch import v1_loop

        return v1_loop.iteration(sw.runtime(), self.scheduler)

    def run_batch_cpu_stand_in(self, batch: Any) -> Any:
        """The normal loop's iteration: a speculative decode's worker call (spec v1: the EAGLEWorker gets the
        ScheduleBatch), a prefill nothing yet (the processing stand-in runs V1LoopServer's). The overlap loop's:
        run_batch's overlap branch with the real future map, the forward stood in."""
        from sglang.srt.managers.utils import GenerationBatchResult

        s = self.scheduler
        if not s.enable_overlap:
            if batch.forward_mode.is_extend():
                return None
            self.kinds.append("spec")
            result = s.model_worker.forward_batch_generation(batch)
            batch.output_ids = result.next_token_ids
            return result
        self.overlapped += bool(s.result_queue)
        mwb = batch.get_model_worker_batch()
        future = s.future_map.alloc_future_indices(len(batch.reqs))
        s.future_map.resolve_future(mwb)
        if batch.forward_mode.is_extend():
            self.kinds.append("prefill")
            _count("prefill")
            tokens = [stand_in_token(req) for req in batch.reqs]
            graph = False
        else:
            self.kinds.append("plain")
            graph = s.model_worker.forward_batch_generation(mwb).can_run_cuda_graph  # its shape checks
            tokens = []
            for req, seq_len, token_in in zip(batch.reqs, mwb.seq_lens.tolist(), mwb.input_ids.tolist(), strict=True):
                k = int(seq_len) - len(req.origin_input_ids)  # the output position the device writes
                token = stand_in_token(req, k - len(req.output_ids))
                relayed = token_in == stand_in_token(req, k - 1 - len(req.output_ids))
                tokens.append(token if relayed else (token + 1) % VOCAB_SIZE)
        result = GenerationBatchResult(logits_output=None, next_token_ids=torch.tensor(tokens, dtype=torch.int64),
                                       can_run_cuda_graph=graph)
        s.future_map.store_to_map(future, result)
        batch.output_ids = -future.indices
        return result

    def process_batch_result_cpu_stand_in(self, batch: Any, result: Any) -> None:
        """A decode result: Scheduler.process_batch_result_decode (its stand-in, hooked by the guard). A prefill's: in
        the normal loop V1LoopServer's step; in the overlap loop process_batch_result_prefill's per-request loop (a
        request an earlier result finished, or retracted, is skipped)."""
        from sglang.srt.mem_cache.common import maybe_cache_unfinished_req

        if result is None:
            self.run_and_process(batch)
            return
        if not batch.forward_mode.is_extend():
            self.scheduler.process_batch_result_decode(batch, result)
            return
        for req, token in zip(batch.reqs, result.next_token_ids.tolist(), strict=True):
            if req.finished() or req.is_retracted:
                continue
            if req.is_chunked > 0:  # being chunked: its prefill is not finished
                req.is_chunked -= 1
                continue
            req.output_ids.append(token)
            req.check_finished()
            if not req.finished():
                maybe_cache_unfinished_req(req, self.pools.tree_cache)
        self._release_finished(batch)
