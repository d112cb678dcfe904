"""Fixtures for the guard tests: real sglang 0.5.23 objects on CPU, hooked through SGLang's own
`load_plugins()`, driven through the steps of each design.

Built on tests/sglang_cpu.py (real ServerArgs, pools, Req, ScheduleBatch, EagleDraftInput,
EagleVerifyInput). What runs for real here: `ScheduleBatch.prepare_for_extend / prepare_for_decode /
merge_batch / filter_batch`, `release_kv_cache`, `alloc_token_slots`, and the orchestration of
`EAGLEWorkerV2.forward_batch_generation` (activate steps, draft or trivial verify input, verify,
draft-extend or its skip stub). Replaced, because they are GPU forwards, by functions named
`*_cpu_stand_in`, put on the real classes BEFORE `load_plugins()` so that SGLang's HookRegistry wraps
them exactly as it wraps the real methods on a GPU host:

- `TpModelWorker.forward_batch_generation` -> `target_forward_cpu_stand_in` (samples one token/request)
- `EagleDraftWorker.draft` -> `draft_cpu_stand_in` (a real EagleVerifyInput, chain tree)
- `EAGLEWorkerV2.verify` -> `verify_cpu_stand_in` (accepts what the test queued)
- `EagleDraftWorker._draft_extend_for_decode` -> `draft_extend_for_decode_cpu_stand_in`
- the triton `assign_req_to_token_pool_func` -> the harness's `assign_req_to_token_pool_cpu_stand_in`

Objects a GPU host builds and a CPU cannot (model runners, CUDA graph runners) are named
`*CpuStandIn` and carry only the attributes SGLang reads from them. `object.__new__` builds the
workers without loading a model; their methods are the real ones.

The scheduler's own bookkeeping between worker calls (Scheduler.run_batch's non-overlap spec branch,
BatchResultProcessor._resolve_spec_v2_tokens / process_batch_result_decode) is reproduced by
`settle_spec_result_cpu_stand_in` / `settle_plain_result_cpu_stand_in`, as in the harness.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_cpu as h  # noqa: E402  (puts stand_ins/cpu on sys.path)

from statemodel.design import ClearSpecOn, Design, DraftWhileOff, OutCacheLocFrom  # noqa: E402

STAND_IN_CALLS: dict[str, int] = {}


def _count(name: str) -> None:
    STAND_IN_CALLS[name] = STAND_IN_CALLS.get(name, 0) + 1


# --- GPU stand-ins (installed under the hooks) ---------------------------------------------------------


def target_forward_cpu_stand_in(self: Any, batch: Any = None, forward_batch: Any = None, pp_proxy_tensors: Any = None,
                                is_verify: bool = False, skip_attn_backend_init: Any = None, *,
                                capture_hidden_mode: Any = None, return_kv_loc_plan: bool = False) -> Any:
    """TpModelWorker.forward_batch_generation: one sampled token per request, and the hidden states when the
    caller captures them in full (shim/switch/v2.py's plain step, for its draft sync)."""
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    _count("target_forward")
    tokens = [h._stand_in_token(req) for req in batch.reqs]
    logits_output = None
    if capture_hidden_mode is not None and capture_hidden_mode == CaptureHiddenMode.FULL:
        # a DECODE forward captures one hidden state per token: one per request (what a draft-extend reads)
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        logits_output = LogitsProcessorOutput(next_token_logits=None,
                                              hidden_states=torch.zeros((len(tokens), h.HIDDEN_SIZE)))
    return GenerationBatchResult(next_token_ids=torch.tensor(tokens, dtype=torch.int64), logits_output=logits_output)


def draft_cpu_stand_in(self: Any, batch: Any, *, with_topology: bool = False) -> Any:
    """EagleDraftWorker.draft: the EagleVerifyInput a k-step chain draft builds."""
    _count("draft")
    k = int(self.speculative_num_steps)
    return h.make_eagle_verify_input(batch, num_steps=k, topk=1, num_draft_tokens=k + 1)


def verify_cpu_stand_in(self: Any, batch: Any, pp_proxy_tensors: Any = None, grammar_barrier: Any = None) -> Any:
    """EAGLEWorkerV2.verify (run_eagle_verify): accepts the lengths queued on the worker."""
    from sglang.srt.managers.utils import GenerationBatchResult

    _count("verify")
    verify_input = batch.spec_info
    width = int(verify_input.draft_token_num)
    bs = len(batch.reqs)
    queued = list(getattr(self, "accept_lens_cpu_stand_in", None) or [width] * bs)
    accept = [max(1, min(width, int(queued[i % len(queued)]))) for i in range(bs)]
    tokens = [[h._stand_in_token(req, j) for j in range(width)] for req in batch.reqs]
    accept_lens = torch.tensor(accept, dtype=torch.int32)
    bonus = [tokens[i][accept[i] - 1] for i in range(bs)]
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    return GenerationBatchResult(
        next_token_ids=torch.tensor([t for row in tokens for t in row], dtype=torch.int64),
        accept_lens=accept_lens, new_seq_lens=batch.seq_lens + accept_lens.to(batch.seq_lens.dtype),
        next_draft_input=EagleDraftInput(bonus_tokens=torch.tensor(bonus, dtype=torch.int32)),
        speculative_num_draft_tokens=width, num_correct_drafts=sum(a - 1 for a in accept),
    )


def draft_extend_for_decode_cpu_stand_in(self: Any, batch: Any, batch_result: Any, *, kv_loc_plan: Any = None) -> None:
    """EagleDraftWorker._draft_extend_for_decode: fills the next draft input's topk / hidden states."""
    _count("draft_extend")
    nd = batch_result.next_draft_input
    bs = len(batch.reqs)
    nd.topk_p = torch.ones((bs, 1), dtype=torch.float32)
    nd.topk_index = torch.zeros((bs, 1), dtype=torch.int64)
    nd.hidden_states = torch.zeros((bs, h.HIDDEN_SIZE), dtype=torch.float32)


def _install_gpu_stand_ins() -> None:
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.mem_cache import allocation
    from sglang.srt.speculative import spec_utils
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

    TpModelWorker.forward_batch_generation = target_forward_cpu_stand_in
    EagleDraftWorker.draft = draft_cpu_stand_in
    EAGLEWorkerV2.verify = verify_cpu_stand_in
    EagleDraftWorker._draft_extend_for_decode = draft_extend_for_decode_cpu_stand_in
    for module in (allocation, spec_utils):
        module.assign_req_to_token_pool_func = h.assign_req_to_token_pool_cpu_stand_in


# --- objects a GPU host builds -----------------------------------------------------------------------------


@dataclass
class DecodeCudaGraphRunnerCpuStandIn:
    """What SGLang reads from a DecodeCudaGraphRunner before replaying: capture sizes and the tokens per
    request it was captured for (1: plain DECODE; num_draft_tokens: TARGET_VERIFY)."""

    captured_req_width: int
    capture_bs: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])

    @property
    def max_bs(self) -> int:
        return max(self.capture_bs)


@dataclass
class PrefillCudaGraphRunnerCpuStandIn:
    """What SGLang's PrefillCudaGraphRunner (body-capture prefill graphs, 0.5.16) checks before a replay: the batch's
    hidden-state capture mode equals the one it captured with, and the tokens fit the largest captured size."""

    capture_hidden_mode: Any
    max_num_tokens: int = 64
    executed: list[Any] = field(default_factory=list)

    def can_run_graph(self, forward_batch: Any) -> bool:
        if forward_batch.capture_hidden_mode != self.capture_hidden_mode:
            return False
        return len(forward_batch.input_ids) <= self.max_num_tokens

    def execute(self, forward_batch: Any, **kwargs: Any) -> str:
        self.executed.append(forward_batch)
        return "graph replay"


@dataclass
class ModelRunnerCpuStandIn:
    model_config: Any
    spec_algorithm: Any
    decode_cuda_graph_runner: Any = None
    attn_backend: Any = field(default_factory=lambda: SimpleNamespace(verify_mask=None, max_context_len=4096))


@dataclass
class SchedulerCpuStandIn:
    """What shim/switch_v2.flip reads from a Scheduler: its queue counts and running batch."""

    running_batch: Any
    waiting_queue: list[Any] = field(default_factory=list)
    chunked_req: Any = None


def install_guard_plugin() -> Any:
    """Stand-ins under the hooks, SPECFLIP_MODE=assert, then SGLang's own `load_plugins()`. Returns the
    GuardRuntime the entry point installed. Once per process (load_plugins is idempotent)."""
    import sglang.srt.plugins as plugins

    import shim.guard.runtime

    if shim.guard.runtime.current() is not None:
        return shim.guard.runtime.current()
    if plugins._plugins_loaded:
        raise RuntimeError("sglang's load_plugins() already ran in this process without the specflip guard")
    _install_gpu_stand_ins()
    with mock.patch.dict(os.environ, {"SPECFLIP_MODE": "assert"}):
        plugins.load_plugins()
    runtime = shim.guard.runtime.current()
    if runtime is None:
        raise RuntimeError("load_plugins() ran but the specflip entry point installed no guard")
    return runtime


def make_workers(pools: h.CpuPools, *, num_steps: int, verify_graphs: bool = False) -> Any:
    """A real EAGLEWorkerV2 (object.__new__: no model loaded) with a real EagleDraftWorker and
    TpModelWorker behind it; their GPU methods are the stand-ins above."""
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

    graph = DecodeCudaGraphRunnerCpuStandIn(captured_req_width=num_steps + 1) if verify_graphs else None
    target = object.__new__(TpModelWorker)
    target._model_runner = ModelRunnerCpuStandIn(pools.model_config, pools.spec_algorithm, graph)
    target.model_config = pools.model_config
    draft = object.__new__(EagleDraftWorker)
    draft.speculative_num_steps = num_steps
    draft.topk = 1
    draft.parallel_layout = SimpleNamespace(tp_group=None, disable_cp=False)
    draft.draft_runner = ModelRunnerCpuStandIn(pools.model_config, pools.spec_algorithm)
    worker = object.__new__(EAGLEWorkerV2)
    worker.__dict__.update(
        server_args=pools.server_args, topk=1, speculative_num_steps=num_steps,
        speculative_num_draft_tokens=num_steps + 1, device="cpu", _target_worker=target, _draft_worker=draft,
        page_size=1, speculative_algorithm=pools.spec_algorithm, enable_dp_spec_prefill_coordination=False,
        adaptive_controller=None, _hosts_draft=True, _additional_graph_memory_usage={},
        _additional_graph_time_usage={},
        req_to_token_pool=pools.req_to_token_pool,  # what BaseSpecWorker.alloc_memory_pool sets
    )
    return worker


def set_steps(worker: Any, steps: int) -> None:
    """What EAGLEWorkerV2.apply_runtime_state does to the step count when the adaptive controller picks."""
    worker.speculative_num_steps = steps
    worker.speculative_num_draft_tokens = steps + 1
    worker._draft_worker.speculative_num_steps = steps


# --- scheduler bookkeeping between worker calls --------------------------------------------------------------


def settle_spec_result_cpu_stand_in(batch: Any, result: Any) -> None:
    """Scheduler.run_batch (non-overlap spec v2) + process_batch_result_decode, in 0.5.23's order:
    `_resolve_spec_v2_tokens` first adds every row's whole accepted run to kv_committed_len (seq_lens took it
    in the verify already, past max_new_tokens too); then, request by request inside one allocator free group,
    output_ids, `update_finish_state` and, for a request now finished, `release_kv_cache`
    (`_handle_finish_state_updated_req`). So when the first finished request is released, the later rows have
    their KV committed but are not finished yet: what the guard sees on a live server."""
    from sglang.srt.mem_cache.common import release_kv_cache

    batch.spec_info = result.next_draft_input
    batch.seq_lens = result.new_seq_lens
    batch.seq_lens_cpu = result.new_seq_lens.to("cpu")
    batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
    batch.input_ids = None
    accept = result.accept_lens.tolist()
    stride = int(result.speculative_num_draft_tokens)
    tokens = result.next_token_ids.tolist()
    runs: list[list[int] | None] = []
    for i, req in enumerate(batch.reqs):
        if req.finished() or req.is_retracted:
            runs.append(None)
            continue
        accepted = tokens[i * stride: i * stride + accept[i]]
        req.kv.kv_committed_len += len(accepted)
        runs.append(accepted)
    allocator = batch.token_to_kv_pool_allocator
    allocator.free_group_begin()
    for req, accepted in zip(batch.reqs, runs, strict=True):
        if accepted is None:
            continue
        req.output_ids.extend(accepted)
        req.update_finish_state(len(accepted))
        if req.finished():
            release_kv_cache(req, batch.tree_cache, checkpoint=True)
    allocator.free_group_end()


@contextlib.contextmanager
def forward_isolation(batch: Any) -> Iterator[None]:
    """SGLang's own `Scheduler._forward_isolation(batch, overlap=False)` (0.5.23), the context the non-overlap
    scheduler runs a spec-v2 worker forward in: it snapshots every ScheduleBatch field when the batch carries a
    speculative algorithm and restores them all afterwards. With overlap=False it never reads the scheduler,
    so a Scheduler with no state stands for it."""
    from sglang.srt.managers.scheduler import Scheduler

    with Scheduler._forward_isolation(object.__new__(Scheduler), batch, overlap=False):
        yield


def settle_plain_result_cpu_stand_in(batch: Any, result: Any) -> None:
    """process_batch_result_decode for a plain step: one token per request."""
    tokens = result.next_token_ids.tolist()
    for req, token in zip(batch.reqs, tokens, strict=True):
        req.output_ids.append(token)
        req.update_finish_state()
    batch.input_ids = torch.tensor(tokens, dtype=torch.int64)


# --- design drivers -------------------------------------------------------------------------------------------


class DesignDriver:
    """Performs one design's steps on real objects: what a flip implementation of that design does.

    `bug` injects one known-bad behaviour (the names of statemodel.designs.KNOWN_BAD, plus the seeds'
    attempts, plus the v2 switch's: "v2_plain_step_not_restored", "v2_spec_info_left_on_launch"); None runs
    the design as written.

    A design whose plain slot comes from the v2 reserve (shim/switch/v2.py's, v2_switch_reserve_sync) runs
    its spec-off steps through the real switch code, `shim.switch.v2.plain_decode`.
    """

    def __init__(self, pools: h.CpuPools, design: Design, *, num_steps: int = 3, bug: str | None = None) -> None:
        self.pools = pools
        self.design = design
        self.bug = bug
        # the seeds' line (0.5.12, v1 worker): a ModelWorkerBatch copy per forward, verify-only target graphs,
        # a verify that stops at the finish, and the seeds' plugin has prepare_for_decode allocate the plain slot
        self.seeds_line = design.sglang_line == "0.5.12"
        self.worker = make_workers(pools, num_steps=num_steps, verify_graphs=self.seeds_line)
        self.decode_graphs = DecodeCudaGraphRunnerCpuStandIn(captured_req_width=1)
        self.batch: Any = None  # the running ScheduleBatch
        self.chunked_req: Any = None  # the Scheduler's chunked_req: the request a prefill chunk is in flight for
        self.waiting: list[Any] = []  # the Scheduler's waiting_queue
        self.spec_on = True
        self.accepts: list[int] = [2, 1, 4]
        self.rounds = 0
        self.switch = self._switch_runtime() if design.out_cache_loc_from is OutCacheLocFrom.V2_RESERVE else None

    def _switch_runtime(self) -> Any:
        """shim/switch/v2.py's per-process runtime, as install_switch + capture_plain_decode_runner leave it;
        the plain runner is the decode graph runner stand-in. The flips are the test's (flip_off / flip_on),
        so the thresholds only have to be valid."""
        from shim.switch.v2 import JsonlTrace, SwitchConfig, SwitchPolicy, SwitchRuntime

        mode = "sync" if self.design.draft_while_off is DraftWhileOff.SYNC_EVERY_STEP else "none"
        config = SwitchConfig(t_off=4, t_on=1, draft_while_off=mode, plain_graphs="decode")
        if self.bug is None and config.design_name != self.design.name:
            raise ValueError(f"shim/switch/v2.py implements {config.design_name}, not {self.design.name}")
        return SwitchRuntime(config=config, policy=SwitchPolicy(config), trace=JsonlTrace(None),
                             plain_runner=self.decode_graphs, plain_attn_backend=None)

    # scheduler side ----------------------------------------------------------------------------------------
    def _spec_algorithm(self, on: bool) -> Any:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        return self.pools.spec_algorithm if on else SpeculativeAlgorithm.NONE

    def prefill(self, reqs: list[Any], *, chunk_size: int | None = None) -> Any:
        """A prefill batch (get_new_batch_prefill: the chunked request's next chunk first, then the waiting
        queue, `reqs` joining its end; the prefill forward and its result processing)."""
        self.waiting.extend(reqs)
        batch_carries_spec = self.spec_on or self.design.clear_spec_on is not ClearSpecOn.BATCH_AT_FLIP
        batch, self.chunked_req = h.schedule_prefill(self.pools, self.waiting, chunked_req=self.chunked_req,
                                                     chunk_size=chunk_size,
                                                     spec_algorithm=self._spec_algorithm(batch_carries_spec))
        h.prefill_forward_cpu_stand_in(batch)
        return batch

    def admit(self, reqs: list[Any], *, chunk_size: int | None = None) -> None:
        """One prefill round and the next scheduler iteration's start: the request still being chunked is
        stashed and left out, the rest merged into the running batch (or made it, when nothing runs)."""
        batch = h.next_round_after_prefill(self.prefill(reqs, chunk_size=chunk_size), self.chunked_req)
        if batch.reqs:
            self.merge(batch)

    def admit_all(self, reqs: list[Any], *, chunk_size: int | None = None) -> None:
        """Admit `reqs` with a prefill budget of `chunk_size` tokens per round (None: no limit), as many prefill
        rounds as it takes: the scheduler runs a prefill round, before any decode, while a request is being
        chunked or waits."""
        self.admit(reqs, chunk_size=chunk_size)
        while self.chunked_req is not None or self.waiting:
            self.admit([], chunk_size=chunk_size)

    def merge(self, batch: Any) -> None:
        batch.forward_mode = batch.forward_mode.DECODE  # Scheduler: the prefilled batch turns decode
        if self.batch is None or not self.batch.reqs:
            self.batch = batch
        else:
            self.batch.merge_batch(batch)

    def finish_and_filter(self) -> list[Any]:
        released = h.release_finished_cpu_stand_in(self.pools, self.batch)
        return released

    def run_to_completion(self, max_steps: int = 60) -> None:
        """Decode (and release what finishes) until the batch is empty, at most `max_steps` steps."""
        for _ in range(max_steps):
            if not self.batch.reqs:
                return
            self.decode()
            self.finish_and_filter()

    # flips ----------------------------------------------------------------------------------------------------
    def flip_off(self) -> None:
        import shim.guard.api

        if self.design.release_reserve_at_flip_off:
            self._release_reserve()
        if self.design.clear_spec_on is ClearSpecOn.BATCH_AT_FLIP:
            self.batch.spec_info = None
            self.batch.spec_algorithm = self._spec_algorithm(False)
        self.spec_on = False
        if self.switch is not None:
            self.switch.policy.spec_on = False
        shim.guard.api.notify_flip(False, self.batch)

    def flip_on(self) -> None:
        import shim.guard.api

        self.spec_on = True
        if self.switch is not None:
            self.switch.policy.spec_on = True
        if self.design.clear_spec_on is ClearSpecOn.BATCH_AT_FLIP:
            self.batch.spec_algorithm = self._spec_algorithm(True)
            self.batch.spec_info = h.make_eagle_draft_input(self.batch)
        shim.guard.api.notify_flip(True, self.batch)
        if self.design.draft_while_off is DraftWhileOff.CATCH_UP_ON_ENABLE and self.bug != "no_draft_work_while_off":
            self.draft_extend_outside_round()

    def _release_reserve(self) -> None:
        """Free each request's speculative over-allocation [kv_committed_len, kv_allocated_len)."""
        rows = self.pools.req_to_token_pool.req_to_token
        for req in self.batch.reqs:
            kv = req.kv
            if kv.kv_allocated_len > kv.kv_committed_len:
                slots = rows[kv.req_pool_idx, kv.kv_committed_len:kv.kv_allocated_len]
                self.pools.allocator.free(slots.to(torch.int64))
                kv.kv_allocated_len = kv.kv_committed_len

    def draft_extend_outside_round(self) -> None:
        """A draft-extend the flip implementation runs itself: the catch-up at flip-on, or the sync after a
        plain step."""
        from sglang.srt.managers.utils import GenerationBatchResult

        result = GenerationBatchResult(next_draft_input=h.make_eagle_draft_input(self.batch))
        self.worker.draft_worker._draft_extend_for_decode(self.batch, result)
        if self.batch.spec_info is not None or self.design.clear_spec_on is ClearSpecOn.WORKER_COPY:
            self.batch.spec_info = result.next_draft_input

    # decode rounds --------------------------------------------------------------------------------------------
    def decode(self, accepts: Sequence[int] | None = None) -> None:
        if any(req.finished() for req in self.batch.reqs):
            # the scheduler's next iteration starts with update_running_batch: finished requests leave first
            self.finish_and_filter()
        if self.spec_on:
            self.spec_round(accepts)
        else:
            self.plain_step()

    def spec_round(self, accepts: Sequence[int] | None = None) -> None:
        with h.patch_assign_req_to_token_pool():
            self.batch.prepare_for_decode()
        queued = list(accepts or self.accepts)
        if self.seeds_line:
            # the v1 worker's verify (0.5.12 EagleVerifyInput.verify) cuts a request's accepted run at its finish
            # (`accept_index[i, j + 1:] = -1`): seq_lens and kv_committed_len stop at max_new_tokens, where the v2
            # worker these objects belong to commits the whole run
            queued = [min(queued[i % len(queued)], req.sampling_params.max_new_tokens - len(req.output_ids))
                      for i, req in enumerate(self.batch.reqs)]
        self.worker.accept_lens_cpu_stand_in = queued
        result = self.worker.forward_batch_generation(self.batch)
        settle_spec_result_cpu_stand_in(self.batch, result)
        self.rounds += 1

    def plain_step(self) -> None:
        if self.switch is not None:
            self.v2_switch_plain_step()
            return
        batch = self.batch
        worker_copy = self.seeds_line
        if worker_copy and batch.spec_algorithm is not None and not batch.spec_algorithm.is_none() \
                and self.bug != "seeds_attempt2_tuple_unpack":
            # v1 premise of the seeds' design: the plugin has prepare_for_decode allocate the plain slot
            saved = batch.spec_algorithm
            batch.spec_algorithm = self._spec_algorithm(False)
            batch.prepare_for_decode()
            batch.spec_algorithm = saved
        else:
            with h.patch_assign_req_to_token_pool():
                batch.prepare_for_decode()
        if self.bug == "seq_lens_advanced_twice":
            batch.seq_lens = batch.seq_lens + 1
            batch.seq_lens_cpu = batch.seq_lens_cpu + 1
        launched = batch
        if worker_copy and self.bug not in ("seeds_attempt1_spec_info_left", "clear_on_scheduler_batch"):
            launched = copy.copy(batch)  # the ModelWorkerBatch of the seeds' line
            launched.spec_info = None
            launched.spec_algorithm = self._spec_algorithm(False)
        if self.bug == "clear_on_scheduler_batch":
            batch.spec_info = None
            batch.spec_algorithm = self._spec_algorithm(False)
        if self.bug == "seeds_attempt2_tuple_unpack":
            from sglang.srt.mem_cache.allocation import alloc_token_slots

            out_cache_loc, _ = alloc_token_slots(self.pools.tree_cache, len(batch.reqs))
            launched.out_cache_loc = out_cache_loc
        runner = self.worker.target_worker.model_runner
        saved_graphs = runner.decode_cuda_graph_runner
        if worker_copy and self.bug != "seeds_final_verify_graphs_only":
            runner.decode_cuda_graph_runner = self.decode_graphs  # the seeds' captured decode runner
        try:
            result = self.worker.target_worker.forward_batch_generation(launched)
        finally:
            runner.decode_cuda_graph_runner = saved_graphs
        settle_plain_result_cpu_stand_in(batch, result)
        if self.design.draft_while_off is DraftWhileOff.SYNC_EVERY_STEP:
            self.draft_extend_outside_round()


    def v2_switch_plain_step(self) -> None:
        """A spec-off step of shim/switch/v2.py as the non-overlap scheduler runs it: the real prepare_for_decode
        (its speculative path: the batch keeps its spec_algorithm, the reserve is topped up), the switch's
        plain_decode (+ draft_sync) inside SGLang's _forward_isolation, then the scheduler's spec-v2 settle of
        the verify-shaped result."""
        from shim.switch.v2 import plain_decode

        batch = self.batch
        with h.patch_assign_req_to_token_pool():
            batch.prepare_for_decode()
        isolation = contextlib.nullcontext() if self.bug == "v2_plain_step_not_restored" else forward_isolation(batch)
        leave = self._spec_info_left_on_launch(batch) if self.bug == "v2_spec_info_left_on_launch" \
            else contextlib.nullcontext()
        with isolation, leave:
            result = plain_decode(self.worker, batch, None, self.switch)
        settle_spec_result_cpu_stand_in(batch, result)

    @contextlib.contextmanager
    def _spec_info_left_on_launch(self, batch: Any) -> Iterator[None]:
        """The bug: the plain DECODE launches with the batch's EagleDraftInput still on it. Put back between the
        switch's strip and the (hooked) target forward, so the guard's hook sees the launched batch."""
        target = self.worker.target_worker
        draft_input = batch.spec_info
        hooked = type(target).forward_batch_generation  # the real slot, wrapped by SGLang's HookRegistry

        def launch_with_spec_info(launched: Any, *args: Any, **kwargs: Any) -> Any:
            launched.spec_info = draft_input
            return hooked(target, launched, *args, **kwargs)

        target.forward_batch_generation = launch_with_spec_info
        try:
            yield
        finally:
            del target.forward_batch_generation


# a system prompt the requests of a run share: with the radix cache on, the later ones hit it in the tree
SYSTEM_PROMPT: list[int] = list(range(100, 124))


def make_reqs(prefix: str, count: int, *, max_new_tokens: int = 40, start: int = 0,
              shared_prefix: Sequence[int] = ()) -> list[Any]:
    """`count` requests, each led by `shared_prefix`: prompts differ between them, and request i of one call has
    the prompt of request i of any other (with the radix cache on, a whole-prompt hit)."""
    return [h.make_req(f"{prefix}{start + i}", list(shared_prefix) + list(range(10 + i, 20 + 2 * i)),
                       max_new_tokens=max_new_tokens) for i in range(count)]


def eagle_pools(model_dir: Path, *, num_steps: int = 3, kv_size: int = 1024, max_reqs: int = 32,
                max_running_requests: int = 16, radix_cache: bool = False) -> h.CpuPools:
    sa = h.make_server_args(model_dir, speculative_algorithm="EAGLE", num_steps=num_steps, topk=1,
                            num_draft_tokens=num_steps + 1, max_running_requests=max_running_requests)
    return h.build_pools(sa, kv_size=kv_size, max_reqs=max_reqs, radix_cache=radix_cache)


def pool_accounted(pools: h.CpuPools) -> bool:
    """Every slot is back: in the free list or owned by the tree cache (no request holds any)."""
    return pools.available_size() + h.tree_held(pools) == pools.allocator.size


def configure_guard(rt: Any, design: Any, *, mode: Any = None, spec_cap: int | None = None,
                    plain_cap: int | None = None, trace: Path | None = None) -> None:
    """Reset the installed guard runtime for one test: `design`'s rules, `mode` (default assert), the caps and
    the trace file (None: no trace)."""
    from shim.guard.core import Mode

    rt.reset()
    rt.mode = Mode.ASSERT if mode is None else mode
    rt.design_name = design.name
    rt.spec_cap, rt.plain_cap = spec_cap, plain_cap
    rt.trace_template = str(trace) if trace else None
    rt.disabled_reason = None


def accept_cycle(values: list[int]) -> Any:
    """Accept lengths (drafts + bonus) per request: each request walks `values` from its own offset."""
    seen: dict[str, int] = {}

    def accept(req: Any) -> int:
        rid = str(req.rid)
        seen[rid] = seen.get(rid, sum(map(ord, rid))) + 1
        return values[seen[rid] % len(values)]
    return accept
