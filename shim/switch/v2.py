"""specflip's speculation switch for SGLang's v2 EAGLE worker (0.5.16), as plugin hooks only.

Speculation goes off when demand (running + prefilling + waiting requests) reaches `t_off` and back on when
demand falls to `t_on` and the running batch fits under speculation's running cap (hysteresis): the model's
own rule (statemodel.policy.decide_flip, which the model's policy_wants_off / policy_wants_on use too), evaluated on
the scheduler's counts (shim/switch/policy.py).
A spec-off step is a real plain DECODE of the target: one token per request, on a decode CUDA graph runner
captured at start-up beside the verify graphs, no drafting. Each function below is named after the model
action it performs (statemodel.actions: flip_off, flip_on, prepare_for_decode, plain_decode, draft_sync).

Enable with `SPECFLIP_SWITCH=t_off:t_on` and install with `install_switch(HookRegistry, SwitchConfig.from_env())`
from a plugin entry point (shim/plugin.py: `register_switch`, or `register`), before `HookRegistry.apply_hooks()`,
which `load_plugins` calls. Other knobs:
  SPECFLIP_SWITCH_DRAFT   retract (default: design plain_off_retract_catch_up: speculation off is SGLang's own
                          plain scheduler path; the flip back on retracts the running requests, whose re-prefill
                          with speculation is the draft's catch-up) |
                          sync (design v2_switch_reserve_sync, draft-extend after every plain step, inside the
                          speculative scheduler path: slower, measured in docs/gpu-results.md) |
                          none (KNOWN BAD, measurement only: no draft work while off, zeroed draft input)
  SPECFLIP_SPEC_CAP       running-request cap while speculation is on (default 48, SGLang's speculative default)
  SPECFLIP_PLAIN_GRAPHS   decode (default: capture a plain decode runner) | eager
  SPECFLIP_PLAIN_PREFILL  graphs (default: the plain path's prefills replay the target's prefill CUDA graphs, see
                          PlainPrefillOnTargetGraphs) | eager (as SGLang would run them: a mode mismatch)
  SPECFLIP_SWITCH_TRACE   a directory: one JSONL trace of switch actions per process (switch-<pid>.jsonl)
  SPECFLIP_SWITCH_TRACE_EVERY  N (default 1): trace the two decode steps after each flip and every Nth other one
                          (flips always). For throughput runs: a traced step costs JSON and CUDA events on the
                          host. `specflip replay` needs every step (its conformance reads them all).

Launch the server with a high `--max-running-requests` (what plain decoding would run); the switch holds
admission at SPECFLIP_SPEC_CAP while speculation is on.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from shim.guard import api as guard_api
from shim.switch.config import (
    SwitchConfig,
    SwitchConfigError,
)
from shim.switch.policy import SwitchPolicy
from shim.switch.swap import AttributeSwap, plain_runner_side
from shim.timing.jsonl import JsonlTrace

# Hook targets (SGLang 0.5.16, docs/correspondence-research.md section 6).
T_FORWARD = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"
T_INIT_GRAPHS = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.init_cuda_graphs"
T_UPDATE_RUNNING = "sglang.srt.managers.scheduler.Scheduler.update_running_batch"
T_ALLOCATABLE = "sglang.srt.managers.scheduler.Scheduler.get_num_allocatable_reqs"
# draft mode "retract" flips here, where nothing is prepared yet and the in-flight result can be processed first
T_NEXT_BATCH = "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run"
T_RUN_BATCH = "sglang.srt.managers.scheduler.Scheduler.run_batch"  # the plain path's step trace (trace on only)

# The model actions (statemodel.actions.ACTION_CATALOGUE) one decode step performs, in order.
SPEC_STEP_ACTIONS = ("prepare_for_decode", "draft", "verify", "draft_extend")
PLAIN_STEP_ACTIONS = {"sync": ("prepare_for_decode", "plain_decode", "draft_sync"),
                      "retract": ("prepare_for_decode", "plain_decode"),
                      "none": ("prepare_for_decode", "plain_decode")}


@dataclass
class SwitchRuntime:
    """What the hooks share inside one scheduler process."""

    config: SwitchConfig
    policy: SwitchPolicy
    trace: JsonlTrace
    steps_since_flip: int = 0
    flips: int = 0
    plain_runner: Any = None
    plain_attn_backend: Any = None
    plain_prefill_runner: Any = None  # PlainPrefillOnTargetGraphs, or None: the plain path keeps the target's
    counters: dict[str, int] = field(default_factory=dict)
    # draft mode "retract": what enter_plain_path swapped out, put back by enter_spec_path
    spec_side: AttributeSwap = field(default_factory=AttributeSwap)
    fm_was_initialized: bool = False  # the future map had sized its buffers when the plain path was entered

    @property
    def plain_path(self) -> bool:
        """Whether speculation off runs SGLang's own plain scheduler path (draft mode "retract")."""
        return self.config.draft_while_off == "retract"

    def count(self, key: str) -> None:
        self.counters[key] = self.counters.get(key, 0) + 1

    def trace_this_step(self) -> bool:
        """Whether the decode step about to run goes into the trace (SPECFLIP_SWITCH_TRACE_EVERY)."""
        if not self.trace.enabled:
            return False
        every = self.config.trace_every
        return every == 1 or self.steps_since_flip < 2 or sum(self.counters.values()) % every == 0


_RUNTIME: SwitchRuntime | None = None


def runtime() -> SwitchRuntime | None:
    return _RUNTIME


# ------------------------------------------------------------------------------------------------
# Scheduler side: flip_off / flip_on and the running cap


def flip(rt: SwitchRuntime, scheduler: Any, batch: Any) -> str | None:
    """Decide the mode for the decode step `update_running_batch` is about to prepare."""
    running = batch.batch_size() if batch is not None else 0
    waiting = len(getattr(scheduler, "waiting_queue", ()) or ())
    chunked = 1 if getattr(scheduler, "chunked_req", None) is not None else 0
    action = rt.policy.decide(running, waiting, chunked)
    if action is not None:
        rt.flips += 1
        rt.steps_since_flip = 0
        rt.trace.event(action, running=running, waiting=waiting, chunked=chunked)
        if action == "flip_off" and batch is not None:
            # admission was held at the speculative cap, which marks the batch full; without this reset the
            # waiting requests are admitted only after a running one finishes
            batch.batch_is_full = False
            running_batch = getattr(scheduler, "running_batch", None)
            if running_batch is not None:
                running_batch.batch_is_full = False
        # the guard (when loaded) must see the flip, or it judges the next plain step as a speculative one
        guard_api.notify_flip(action == "flip_on", batch)
    return action


def _update_running_batch_around(orig: Any, self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    rt = _RUNTIME
    if rt is not None and not rt.plain_path and batch is not None and not batch.is_empty():
        flip(rt, self, batch)
    return orig(self, batch, *args, **kwargs)


def _allocatable_around(orig: Any, self: Any, running_bs: int, *args: Any, **kwargs: Any) -> int:
    res = orig(self, running_bs, *args, **kwargs)
    rt = _RUNTIME
    if rt is None:
        return res
    if running_bs == 0 and not rt.policy.spec_on and not rt.plain_path:
        # update_running_batch is not called while nothing runs: an idle server flips on here, before the
        # next prefill is formed (t_on = 0 re-enables only when idle)
        flip(rt, self, None)
    return rt.policy.admission_cap(running_bs, res)


# ------------------------------------------------------------------------------------------------
# Scheduler side, draft mode "retract" (design plain_off_retract_catch_up): speculation off is SGLang's own
# plain scheduler path. Every branch of the loop keys on the batch's (and for new batches the scheduler's)
# spec_algorithm, and the worker is `scheduler.model_worker`: flip_off points both at the plain side, flip_on
# back. Both run at the top of get_next_batch_to_run, before anything of the next step is prepared, and
# first process the launched step's result (the model's flip_waits_for_results): flip_off frees the
# reserve that result's verify writes into, flip_on retracts requests that result still extends.


def _kv_row(req: Any) -> tuple[int | None, int, int]:
    """(req_to_token row, committed, allocated) of a request; row None when it holds none. 0.5.16 keeps the
    row and the committed length on the Req and `kv` is None without a row; 0.5.23 keeps all in req.kv."""
    kv = getattr(req, "kv", None)
    if kv is None:
        return None, int(getattr(req, "kv_committed_len", 0)), 0
    if hasattr(req, "kv_committed_len"):
        return req.req_pool_idx, int(req.kv_committed_len), int(kv.kv_allocated_len)
    return kv.req_pool_idx, int(kv.kv_committed_len), int(kv.kv_allocated_len)


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
            allocator.free(req_to_token[row, start:end])
            req.kv.kv_allocated_len = start
            freed += end - start
    return freed


def reseat_seq_lens(batch: Any) -> None:
    """A plain decode reads seq_lens on the batch; the speculative loop leaves them to the future map (the
    verify's accepts). After the result is processed each request's committed length is the truth."""
    import torch

    lens = [_kv_row(req)[1] for req in batch.reqs]
    device = batch.seq_lens.device
    batch.seq_lens_cpu = torch.tensor(lens, dtype=torch.int64)
    batch.seq_lens = batch.seq_lens_cpu.to(device)
    orig_dtype = batch.orig_seq_lens.dtype if batch.orig_seq_lens is not None else torch.int32
    batch.orig_seq_lens = torch.tensor(lens, dtype=orig_dtype).to(device)
    batch.seq_lens_sum = sum(lens)


def _set_batch_algorithm(batch: Any, algorithm: Any) -> None:
    batch.spec_algorithm = algorithm
    batch.spec_info = None  # flip_off: no draft input on a plain batch; flip_on: its requests re-prefill
    batch.input_ids = None  # resolved at launch from the future map's last-token relay, in both modes


def enter_plain_path(rt: SwitchRuntime, scheduler: Any) -> None:
    """Point the scheduler, its future map and the target's model runner at the plain side."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    none = SpeculativeAlgorithm.NONE
    fm = scheduler.future_map
    mr = scheduler.tp_worker.model_runner
    side = rt.spec_side
    rt.fm_was_initialized = getattr(fm, "_forward_buf_initialized", False)
    side.set(scheduler, "spec_algorithm", none)  # the prefill batches formed while off (ScheduleBatch.init_new)
    side.set(scheduler, "model_worker", scheduler.tp_worker)
    # the plain relay: input ids gathered from output_tokens_buf, a stash carries the bonus token only
    side.set(fm, "spec_algo", none)
    side.set(fm, "need_topk", False)
    side.set(fm, "need_hidden_states", False)
    side.set(mr, "decode_cuda_graph_runner", rt.plain_runner)  # None: eager
    if rt.plain_attn_backend is not None:
        side.set(mr, "attn_backend", rt.plain_attn_backend)
    side.set(mr, "spec_algorithm", none)
    if rt.plain_prefill_runner is not None:
        side.set(mr, "prefill_cuda_graph_runner", rt.plain_prefill_runner)


def enter_spec_path(rt: SwitchRuntime, scheduler: Any) -> None:
    """Undo enter_plain_path."""
    if not rt.spec_side:
        return
    fm = scheduler.future_map
    if rt.fm_was_initialized or not hasattr(fm, "_forward_buf_initialized"):  # 0.5.23: no lazy sizing flag
        rt.spec_side.restore()
    else:  # 0.5.16, first stashed while off: sized for the plain payload, so size it again at the next spec stash
        rt.spec_side.restore(keep=((fm, "need_topk"), (fm, "need_hidden_states")))
        fm._forward_buf_initialized = False


def _pending_prefill(scheduler: Any, running_batch: Any, last_batch: Any) -> Any:
    """The prefilled batch get_next_batch_to_run will merge (SGLang's `last_batch`), or None."""
    if last_batch is None or last_batch is running_batch or not last_batch.forward_mode.is_extend():
        return None
    return last_batch


def retract_all_running(scheduler: Any, reqs: list[Any]) -> None:
    """ScheduleBatch.release_req for each request without tree insertion (SGLang's retract_all, as its
    pause_generation(mode="retract") calls it), then back to the waiting queue with its output kept."""
    from sglang.srt.managers import schedule_batch

    kwargs = dict(reqs=reqs, req_to_token_pool=scheduler.req_to_token_pool,
                  token_to_kv_pool_allocator=scheduler.token_to_kv_pool_allocator, tree_cache=scheduler.tree_cache,
                  hisparse_coordinator=getattr(scheduler, "hisparse_coordinator", None))
    params = inspect.signature(schedule_batch.retract_all).parameters
    if "server_args" in params:  # 0.5.16
        kwargs["server_args"] = scheduler.server_args
    if "offload_kv" in params:
        kwargs["offload_kv"] = False  # re-prefilled, never restored from host
    schedule_batch.retract_all(**kwargs)
    for req in reqs:
        scheduler._add_request_to_queue(req, is_retracted=True)


def flip_on_waits(running_batch: Any, pending: Any) -> bool:
    """Whether flip-on must wait an iteration: a prefilled batch is not merged yet, or the running batch still
    holds finished requests (update_running_batch filters them, merge_batch merges it, the guard sees both)."""
    return pending is not None or any(r.finished() for r in running_batch.reqs)


def plain_path_flip(rt: SwitchRuntime, scheduler: Any, running_batch: Any, last_batch: Any) -> Any:
    """Decide and perform a flip for the iteration get_next_batch_to_run is about to plan; returns the
    `last_batch` to hand it.

    flip_on waits while the running batch still holds requests that finished (update_running_batch filters
    them next) or a prefilled batch waits to be merged: the model lets the flip come later, and so the
    running batch it retracts is exactly the model's."""
    if scheduler.chunked_req is not None:
        return last_batch  # a chunked prefill never straddles a flip: its earlier chunks' draft KV
    pending = _pending_prefill(scheduler, running_batch, last_batch)
    in_batch = [r for r in running_batch.reqs if not r.finished()]
    if pending is not None:
        in_batch += [r for r in pending.reqs if not r.finished()]
    waiting = len(scheduler.waiting_queue)
    action = rt.policy.wants(len(in_batch), waiting, 0)
    if action is None:
        return last_batch
    if action == "flip_on" and flip_on_waits(running_batch, pending):
        return last_batch
    tic = time.perf_counter()
    drained = drain_in_flight(scheduler)
    freed = retracted = 0
    if action == "flip_off":
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        freed = release_reserve(scheduler, in_batch)
        if not running_batch.is_empty():
            reseat_seq_lens(running_batch)
        for batch in (running_batch, pending):
            if batch is not None:
                _set_batch_algorithm(batch, SpeculativeAlgorithm.NONE)
        enter_plain_path(rt, scheduler)
    else:
        if drained and any(r.finished() for r in running_batch.reqs):
            running_batch.filter_batch()  # what update_running_batch would do first (the guard sees it)
        in_batch = list(running_batch.reqs)
        if in_batch:
            retract_all_running(scheduler, in_batch)
            retracted = len(in_batch)
        running_batch.reqs = []  # each one left through retract_all (the guard saw each release)
        enter_spec_path(rt, scheduler)
        _set_batch_algorithm(running_batch, scheduler.spec_algorithm)
    rt.policy.spec_on = action == "flip_on"
    running_batch.batch_is_full = False
    rt.flips += 1
    rt.steps_since_flip = 0
    rt.trace.event(action, running=len(in_batch), waiting=waiting, chunked=0, drained=drained,
                   reserve_freed=freed, retracted=retracted, ms=round((time.perf_counter() - tic) * 1e3, 3))
    guard_api.notify_flip(action == "flip_on", running_batch)  # empty: the guard still reads its pool
    return last_batch


def _next_batch_around(orig: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    rt = _RUNTIME
    if rt is None or not rt.plain_path:
        return orig(self, *args, **kwargs)
    running_batch = kwargs.pop("running_batch", None) if "running_batch" in kwargs else args[0]
    last_batch = kwargs.pop("last_batch", None) if "last_batch" in kwargs else (args[1] if len(args) > 1 else None)
    last_batch = plain_path_flip(rt, self, running_batch, last_batch)
    return orig(self, running_batch=running_batch, last_batch=last_batch)


def _run_batch_around(orig: Any, self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    """The plain path's decode steps in the switch trace (speculative ones go through _forward_around)."""
    rt = _RUNTIME
    if rt is None or not batch.spec_algorithm.is_none():
        return orig(self, batch, *args, **kwargs)
    if not batch.forward_mode.is_decode():
        out = orig(self, batch, *args, **kwargs)
        if batch.forward_mode.is_extend():  # a plain prefill (the speculative ones: _forward_around)
            rt.trace.event("prefill", bs=batch.batch_size(), graph=bool(getattr(out, "can_run_cuda_graph", False)))
        return out
    if not rt.trace_this_step():
        out = orig(self, batch, *args, **kwargs)
        rt.count("plain_step")
        rt.steps_since_flip += 1
        return out
    import torch

    bs = batch.batch_size()
    stream = getattr(self, "forward_stream", None) if getattr(self, "enable_overlap", False) else None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    first = rt.steps_since_flip == 0 and rt.flips > 0
    out = orig(self, batch, *args, **kwargs)
    end.record(stream)
    rt.count("plain_step")
    rt.trace.event("step", actions=PLAIN_STEP_ACTIONS["retract"], bs=bs, graph=bool(out.can_run_cuda_graph))
    rt.trace.timed(start, end, {"kind": "plain", "bs": bs, "first_after_flip": first})
    rt.steps_since_flip += 1
    return out


# ------------------------------------------------------------------------------------------------
# Worker side


def capture_plain_decode_runner(worker: Any, rt: SwitchRuntime) -> None:
    """Capture a plain DECODE graph runner (1 token per request) for the target, beside its verify graphs.

    A speculative target captures TARGET_VERIFY graphs only and `can_run_graph` ignores forward_mode, so a
    plain batch would replay a verify graph: plain steps must run on their own runner (or eager).
    """
    import torch  # noqa: F401 - CUDA must be initialised here already
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    mr = worker.target_worker.model_runner
    hidden_mode = CaptureHiddenMode.FULL if rt.config.draft_while_off == "sync" else CaptureHiddenMode.NULL
    tic = time.perf_counter()
    # the runner picks DECODE, width 1, no verify spec_info
    with AttributeSwap.around((mr, "spec_algorithm", SpeculativeAlgorithm.NONE)) as swap:
        if hasattr(mr, "init_new_workspace"):
            swap.set(mr, "init_new_workspace", mr.init_new_workspace)  # the new backend may change it: put back
        rt.plain_attn_backend = mr._get_attention_backend(init_new_workspace=True)
        if rt.config.plain_graphs == "decode" and mr.decode_cuda_graph_runner is not None:
            from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

            class PlainDecodeCudaGraphRunner(DecodeCudaGraphRunner):  # type: ignore[misc, valid-type]
                """Captures with the hidden-state mode the draft sync needs (a mismatch falls back to eager)."""

                def capture(self, *a: Any, **k: Any) -> Any:
                    self.capture_hidden_mode = hidden_mode
                    return super().capture(*a, **k)

            rt.plain_runner = PlainDecodeCudaGraphRunner(mr, attn_backend=rt.plain_attn_backend)
    if rt.plain_path and rt.config.plain_prefill == "graphs":
        rt.plain_prefill_runner = plain_prefill_view(getattr(mr, "prefill_cuda_graph_runner", None))
    rt.trace.event("capture_plain_runner", seconds=round(time.perf_counter() - tic, 3),
                   graphs=rt.plain_runner is not None, prefill_graphs=rt.plain_prefill_runner is not None,
                   capture_bs=list(getattr(rt.plain_runner, "capture_bs", []) or []))


class PlainPrefillOnTargetGraphs:
    """The target's prefill CUDA graphs, offered to the plain path's prefills.

    An EAGLE-3 target captures its prefill graphs (breakable: the transformer body only) with hidden-state capture
    FULL, and `PrefillCudaGraphRunner.can_run_graph` turns away any batch whose mode differs: every prefill on the
    plain path (mode NULL) ran eager, many kernel launches of host time per prefill, which a plain server does not
    pay. The captured body is the same in both modes (the EAGLE-3 auxiliary hidden states are a model attribute, not
    the mode); the mode only steers the logits processor, which runs eagerly on the live batch after the body. So a
    NULL-mode batch is checked as if the graphs had been captured for it, and everything else goes to the runner.
    """

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    def can_run_graph(self, forward_batch: Any) -> bool:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        runner = self.runner
        if forward_batch.capture_hidden_mode != CaptureHiddenMode.NULL:
            return bool(runner.can_run_graph(forward_batch))
        captured = runner.capture_hidden_mode
        runner.capture_hidden_mode = CaptureHiddenMode.NULL
        try:
            return bool(runner.can_run_graph(forward_batch))
        finally:
            runner.capture_hidden_mode = captured

    def __getattr__(self, name: str) -> Any:  # execute(), and whatever else the model runner reads
        return getattr(self.runner, name)


def plain_prefill_view(runner: Any) -> PlainPrefillOnTargetGraphs | None:
    """The view over the target's prefill graph runner, or None where there are no graphs to offer."""
    if runner is None or not hasattr(runner, "can_run_graph") or not hasattr(runner, "capture_hidden_mode"):
        return None  # None or SGLang's EagerRunner (prefill graphs off): the plain path runs eager anyway
    return PlainPrefillOnTargetGraphs(runner)


def _init_cuda_graphs_after(result: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    if _RUNTIME is not None:
        capture_plain_decode_runner(self, _RUNTIME)
    return result


def _worker_contexts(worker: Any) -> list[Any]:
    mod = sys.modules["sglang.srt.speculative.eagle_worker_v2"]
    dw = worker.draft_worker
    if hasattr(dw, "draft_tp_context"):  # 0.5.16: a per-worker context factory over the draft's TP group
        ctxs = [dw.draft_tp_context(dw.draft_runner.tp_group)]
    else:  # 0.5.23: a module function over the draft's parallel layout (what forward_batch_generation enters)
        ctxs = [mod.draft_tp_context(dw.parallel_layout)]
    for name in ("speculative_moe_backend_context", "speculative_moe_a2a_backend_context"):
        if hasattr(mod, name):
            ctxs.append(getattr(mod, name)())
    return ctxs


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

    with AttributeSwap.around(*plain_runner_side(rt, worker.target_worker.model_runner, "decode_cuda_graph_runner",
                                                 SpeculativeAlgorithm.NONE)):
        res = worker.target_worker.forward_batch_generation(
            batch, capture_hidden_mode=CaptureHiddenMode.FULL if sync else CaptureHiddenMode.NULL)
    rt.count("plain_graph" if res.can_run_cuda_graph else "plain_eager")

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
    if hasattr(result, "extra_keep_alive_refs"):
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


def _forward_around(orig: Any, self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    rt = _RUNTIME
    if rt is None:
        return orig(self, batch, *args, **kwargs)
    is_extend = batch.forward_mode.is_extend() or batch.is_extend_in_batch
    if is_extend:
        rt.trace.event("prefill", bs=int(batch.seq_lens.shape[0]))
        return orig(self, batch, *args, **kwargs)
    bs = int(batch.seq_lens.shape[0])
    if batch.forward_mode.is_idle() or bs == 0:
        return orig(self, batch, *args, **kwargs)
    if args:  # forward_batch_generation(batch, on_publish=None): positional or keyword
        on_publish, args = args[0], args[1:]
    else:
        on_publish = kwargs.pop("on_publish", None)
    timing = rt.trace_this_step()
    if timing:
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    first = rt.steps_since_flip == 0 and rt.flips > 0
    if rt.policy.spec_on:
        out = orig(self, batch, *args, on_publish=on_publish, **kwargs)
        rt.count("spec_step")
        actions = SPEC_STEP_ACTIONS
        kind = "spec"
    else:
        out = plain_decode(self, batch, on_publish, rt)
        rt.count("plain_step")
        actions = PLAIN_STEP_ACTIONS[rt.config.draft_while_off]
        kind = "plain"
    if timing:
        # one line per decode step (the model actions it performed, in order) keeps the trace cheap
        rt.trace.event("step", actions=actions, bs=bs, graph=bool(out.can_run_cuda_graph))
        end.record()
        rt.trace.timed(start, end, {"kind": kind, "bs": bs, "first_after_flip": first})
    rt.steps_since_flip += 1
    return out


# ------------------------------------------------------------------------------------------------
# Installation


def install_switch(registry: Any, config: SwitchConfig | None) -> bool:
    """Register the switch's hooks on `registry` (SGLang's HookRegistry class); False when config is None.

    Call from the plugin entry point before `HookRegistry.apply_hooks()` runs, e.g.
        install_switch(HookRegistry, SwitchConfig.from_env())
    """
    global _RUNTIME
    if config is None:
        return False
    from sglang.srt.plugins.hook_registry import HookType

    _RUNTIME = SwitchRuntime(config=config, policy=SwitchPolicy(config), trace=JsonlTrace(config.trace_dir))
    _RUNTIME.trace.event("config", design=config.design_name, t_off=config.t_off, t_on=config.t_on,
                         spec_cap=config.spec_cap, draft_while_off=config.draft_while_off,
                         plain_graphs=config.plain_graphs, plain_prefill=config.plain_prefill,
                         trace_every=config.trace_every)
    guard_api.announce_switch(config.design_name, config.spec_cap)  # the guard's reference design and scope
    if not _RUNTIME.plain_path:  # the plain path flips in get_next_batch_to_run: one wrapper less per step
        registry.register(T_UPDATE_RUNNING, _update_running_batch_around, HookType.AROUND)
    registry.register(T_ALLOCATABLE, _allocatable_around, HookType.AROUND)
    registry.register(T_INIT_GRAPHS, _init_cuda_graphs_after, HookType.AFTER)
    registry.register(T_FORWARD, _forward_around, HookType.AROUND)
    if _RUNTIME.plain_path:
        registry.register(T_NEXT_BATCH, _next_batch_around, HookType.AROUND)
        if _RUNTIME.trace.enabled:
            registry.register(T_RUN_BATCH, _run_batch_around, HookType.AROUND)
    return True


V1_WORKER_RELEASES = ("0.5.11", "0.5.12")  # the last lines that still ship the v1 EAGLEWorker


def v1_worker_selected(release: str | None, env: Mapping[str, str]) -> bool:
    """Whether this server runs SGLang's v1 EAGLEWorker, whose switch is shim/switch/v1.py: on the lines
    that still have it, SGLANG_ENABLE_SPEC_V2=0 selects it. Installing this (v2) switch there as well
    doubles the scheduler hooks (seen on the H200: two AROUND hooks on prepare_for_decode, a slot leaked)."""
    flag = env.get("SGLANG_ENABLE_SPEC_V2", "").strip().lower()
    return release in V1_WORKER_RELEASES and flag in ("0", "false", "no", "off")


def install_from_env() -> bool:
    """Install the switch as SPECFLIP_* say (idempotent); a bad setting logs one line and leaves it off."""
    if _RUNTIME is not None:
        return True
    try:
        release: str | None = version("sglang")
    except PackageNotFoundError:
        release = None
    if v1_worker_selected(release, os.environ):
        logging.getLogger("specflip.switch").info(
            "specflip v2 switch not installed: SGLANG_ENABLE_SPEC_V2=0 selects the v1 EAGLEWorker (shim/switch/v1.py)")
        return False
    try:
        config = SwitchConfig.from_env()
    except SwitchConfigError as exc:
        logging.getLogger("specflip.switch").error("specflip switch off: %s", exc)
        return False
    if config is None:
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry

    return install_switch(HookRegistry, config)
