"""specflip's speculation switch for SGLang's v1 EAGLE worker (on the lines that ship it, shim/releases/;
SGLANG_ENABLE_SPEC_V2=0 or --disable-overlap-schedule): the seeds' own system, done right, through plugin hooks only.

Two designs (statemodel/designs.py), chosen by SPECFLIP_SWITCH_DRAFT (below). The default since issue 22,
`v1_plain_off_retract_catch_up`, is in shim/switch/v1_plain_path.py (the v1 worker's side, `V1Side`, of the switch
core's `plain_path_flip`, shim/switch/core.py, which the v2 switch runs too): speculation off is SGLang's own plain
scheduler path, as a plain server runs it. The admission cap's hook and every flip's bookkeeping are the core's
too. The seeds' design `seeds_final` (`sync`) is the rest of this module: every function below that changes
SGLang state is named after the model action it performs (statemodel.actions.ACTION_CATALOGUE):

* `flip_off` / `flip_on`: the threshold policy with hysteresis, decided by the model's own
  `statemodel.policy.decide_flip`, as the model's `policy_wants_off` / `policy_wants_on` (clamped to
  speculation's running cap). The ScheduleBatch is left
  alone (ClearSpecOn.WORKER_COPY); v1 holds no KV reserve between steps, so nothing is released.
* `prepare_for_decode` (speculation off): v1's ScheduleBatch.prepare_for_decode returns early whenever the
  batch carries a speculative algorithm: no slot, no seq_lens + 1. The switch runs SGLang's own plain path
  for the call (alloc_for_decode: one slot per request, kv lengths + 1, seq_lens + 1), with the input ids
  taken from the draft input's bonus tokens (v1 leaves the last verify's flat accepted tokens in output_ids).
* `plain_decode`: the target's plain DECODE forward on the worker's copy (the ModelWorkerBatch) with
  spec_info and spec_algorithm cleared, replaying a decode CUDA graph runner captured at start-up beside the
  verify graphs (PlainStepGraphs.DECODE_RUNNER; `SPECFLIP_PLAIN_GRAPHS=eager` runs it eagerly); then the v1
  bookkeeping that EagleVerifyInput.verify does for a speculative step (output_ids, finish, grammar).
* `draft_sync`: v1's own `forward_draft_extend_after_decode`, fed as a verify that accepted no draft (one
  token per request, finished rows left out in order), so re-enabling finds the draft KV and hidden state
  current.

Configuration (same parsing as the v2 switch, shim.switch.config.SwitchConfig): `SPECFLIP_SWITCH=t_off:t_on`,
`SPECFLIP_SPEC_CAP`, `SPECFLIP_PLAIN_GRAPHS=decode|eager`, `SPECFLIP_SWITCH_TRACE=<dir>`, and
`SPECFLIP_SWITCH_DRAFT`:
  retract (default since issue 22; design v1_plain_off_retract_catch_up, shim/switch/v1_plain_path.py): speculation
          off is SGLang's own plain scheduler path, flip-on retracts the running requests and their re-prefill with
          speculation is the draft's catch-up. The hooks above that name seeds_final's actions are not installed;
          the flips run at Scheduler.get_next_batch_to_run.
  sync    (seeds_final, the functions above): kept for the side-by-side measurement of issue 22 (docs/v1.md).
and `SPECFLIP_V1_LOOP=normal|overlap` (retract only): overlap runs the plain iterations in the overlap loop's order
(shim/switch/v1_loop.py, design v1_plain_off_retract_catch_up_overlap_plain). Unset, it is overlap (config_from_env),
with the guard or without: the guard follows both loops (the overlap one through the adapter's overlap scope), live
on the H200 since 2026-12-03 (d3f54dc).
Install with `install_switch(HookRegistry, SwitchConfig.from_env(default_draft="sync"))` before
`HookRegistry.apply_hooks()`, or through the entry point `shim.plugin:register_v1` (group `sglang.srt.plugins`),
which also loads the guard (a no-op unless SPECFLIP_MODE is set). Where SGLang builds no v1 EAGLEWorker for the server
(its resolved server arguments leave the overlap schedule on), start-up stops with one line (`check_worker`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shim.guard import api as guard_api
from shim.guard.runtime import ConfigError, bad_config_stops, on_bad_config
from shim.releases import Release
from shim.releases.registry import installed_line
from shim.settings import settings
from shim.switch import core, v1_loop, v1_plain_path
from shim.switch.config import SwitchConfig, SwitchConfigError
from shim.switch.core import SwitchCore
from shim.switch.policy import SwitchPolicy
from shim.switch.radix_keep_out import keep_out_of_tree, resume_chunk_kept_out
from shim.switch.swap import AttributeSwap
from shim.timing.jsonl import JsonlTrace

DESIGN = "seeds_final"  # SPECFLIP_SWITCH_DRAFT=sync
RETRACT_DESIGN = "v1_plain_off_retract_catch_up"  # SPECFLIP_SWITCH_DRAFT=retract (the default)
DESIGN_FOR_DRAFT_MODE = {"sync": DESIGN, "retract": RETRACT_DESIGN}
OVERLAP_LOOP_DESIGN = "v1_plain_off_retract_catch_up_overlap_plain"  # SPECFLIP_V1_LOOP=overlap (shim/switch/v1_loop.py)
# The functions of this module that perform a model action, by action name (tests check the names exist in
# the model's catalogue and that a recorded run is a path of the design).
SWITCH_ACTIONS = ("flip_off", "flip_on", "prepare_for_decode", "plain_decode", "draft_sync")

# Hook targets (the v1 worker's lines, docs/correspondence-research.md section 7.2).
T_UPDATE_RUNNING = "sglang.srt.managers.scheduler.Scheduler.update_running_batch"
T_ALLOCATABLE = "sglang.srt.managers.scheduler.Scheduler.get_num_allocatable_reqs"
T_PREPARE = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode"
T_FORWARD = "sglang.srt.speculative.eagle_worker.EAGLEWorker.forward_batch_generation"
T_INIT_GRAPHS = "sglang.srt.speculative.eagle_worker.EAGLEWorker.init_cuda_graphs"
# draft mode retract: the flips, at the top of the non-overlap loop's iteration; the decode steps' trace
T_NEXT_BATCH = "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run"
T_RUN_BATCH = "sglang.srt.managers.scheduler.Scheduler.run_batch"
# The v1 worker's line fills BatchTokenIDOutput.spec_verify_ct only while scheduler.spec_algorithm is set, and its
# tokenizer manager indexes it per request: the plain path's NONE crashed the first output on the H200 (the v2 lines'
# OutputStreamer keeps its own copy of the algorithm)
T_STREAM = "sglang.srt.managers.scheduler.Scheduler.stream_output_generation"
# SPECFLIP_V1_LOOP=overlap: specflip's loop in place of the normal one (shim/switch/v1_loop.py)
T_LOOP = "sglang.srt.managers.scheduler.Scheduler.event_loop_normal"
# start-up (both draft modes): whether SGLang builds the v1 EAGLEWorker, on its resolved server arguments; in the
# launching process after it checked them, before any scheduler process starts, and in each scheduler process before
# its model worker is built (`check_worker`)
T_CHECK_ARGS = "sglang.srt.server_args.ServerArgs.check_server_args"
T_INIT_WORKER = "sglang.srt.managers.scheduler.Scheduler.init_model_worker"
START_UP_HOOKS = (T_CHECK_ARGS, T_INIT_WORKER)
TARGETS = (T_UPDATE_RUNNING, T_ALLOCATABLE, T_PREPARE, T_FORWARD, T_INIT_GRAPHS, T_NEXT_BATCH, T_RUN_BATCH, T_STREAM,
           T_LOOP, *START_UP_HOOKS)
HOOKS_FOR_DRAFT_MODE = {"sync": (T_UPDATE_RUNNING, T_ALLOCATABLE, T_PREPARE, T_INIT_GRAPHS, T_FORWARD),
                        "retract": (T_ALLOCATABLE, T_INIT_GRAPHS, T_NEXT_BATCH, T_RUN_BATCH, T_STREAM)}


# what the v1 switch takes, named in every refusal of check_config
V1_TAKES = ("the v1 switch takes SPECFLIP_SWITCH=t_off:t_on (thresholds; auto is the v2 switch's), "
            "SPECFLIP_SWITCH_DRAFT=retract or sync, and no SPECFLIP_TIERS")


def check_config(config: SwitchConfig) -> SwitchConfig:
    """The v1 switch implements v1_plain_off_retract_catch_up (retract) and seeds_final (sync), with thresholds and
    one step count (the v1 worker has no tier to apply). The v1 kit's entry point runs this in its settings check,
    before anything is installed (shim.plugin.check_settings)."""
    if config.draft_while_off not in DESIGN_FOR_DRAFT_MODE:
        raise SwitchConfigError(f"SPECFLIP_SWITCH_DRAFT={config.draft_while_off!r}: the v1 switch implements "
                                f"retract ({RETRACT_DESIGN}) and sync ({DESIGN}); {V1_TAKES}")
    if config.auto:
        raise SwitchConfigError(f"SPECFLIP_SWITCH=auto: {V1_TAKES}")
    if config.tiers is not None:
        raise SwitchConfigError(f"SPECFLIP_TIERS={config.tiers.describe()!r}: {V1_TAKES}")
    return config


def design_for(config: SwitchConfig) -> str:
    """The model design the v1 switch implements under `config`."""
    if config.v1_loop == "overlap":
        return OVERLAP_LOOP_DESIGN
    return DESIGN_FOR_DRAFT_MODE[config.draft_while_off]


@dataclass
class SwitchRuntime(SwitchCore):
    """What the hooks share inside one scheduler process (the policy decides under seeds_final; in draft mode
    retract `spec_side` holds what v1_plain_path.enter_plain_path swapped out)."""

    demand: tuple[int, int] | None = None  # (waiting, chunked) of the scheduler iteration in progress
    recorded: list[str] | None = None  # the model actions performed, in order (tests set a list)

    def record(self, action: str, **info: Any) -> None:
        self.count(action)
        if self.recorded is not None:
            self.recorded.append(action)
        self.trace.event(action, **info)


_RUNTIME: SwitchRuntime | None = None


def runtime() -> SwitchRuntime | None:
    return _RUNTIME


# ------------------------------------------------------------------------------------------------
# Scheduler side: flip_off / flip_on, prepare_for_decode, the running cap


def flip_off(rt: SwitchRuntime, batch: Any) -> None:
    """Model action flip_off. seeds_final clears spec state on the worker's copy only, and v1 holds no KV
    reserve between steps (verify sets kv_allocated_len = kv_committed_len): nothing on the batch's KV changes.
    Admission held at speculation's cap marked the batch full, which SGLang clears only when the batch shrinks:
    the flip raises the cap, so it clears the mark (as v2's flip-off does)."""
    batch.batch_is_full = False
    core.flip_done(rt, v1_plain_path.SIDE, "flip_off", batch, {"running": len(batch.reqs)})


def flip_on(rt: SwitchRuntime, batch: Any) -> None:
    """Model action flip_on. The draft was synced after every plain step, so the batch's EagleDraftInput is
    current and the next speculative round starts from it as it is."""
    core.flip_done(rt, v1_plain_path.SIDE, "flip_on", batch, {"running": len(batch.reqs)})


def decide_flip(rt: SwitchRuntime, batch: Any) -> str | None:
    """Before the decode step is prepared: ask the policy, and perform the flip it chose."""
    waiting, chunked = rt.demand or (0, 0)
    action = rt.policy.decide(len(batch.reqs), waiting, chunked)
    if action == "flip_off":
        flip_off(rt, batch)
    elif action == "flip_on":
        flip_on(rt, batch)
    return action


def prepare_for_decode(rt: SwitchRuntime, orig: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    """Model action prepare_for_decode while speculation is off: SGLang's own plain path (alloc_for_decode,
    kv_committed_len/kv_allocated_len + 1, seq_lens + 1), which v1 skips whenever spec_algorithm is set.
    spec_algorithm is NONE for the call only; the input ids are the draft input's bonus tokens."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    rt.record("prepare_for_decode", bs=len(batch.reqs))
    batch.output_ids = batch.spec_info.bonus_tokens  # the plain path reads input_ids (and penalties) from here
    saved = batch.spec_algorithm
    batch.spec_algorithm = SpeculativeAlgorithm.NONE
    try:
        return orig(batch, *args, **kwargs)
    finally:
        batch.spec_algorithm = saved


def _prepare_for_decode_around(orig: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    rt = _RUNTIME
    if rt is None or rt.plain_path or not batch.reqs or batch.spec_algorithm.is_none() or batch.is_spec_v2:
        return orig(batch, *args, **kwargs)
    decide_flip(rt, batch)
    if rt.policy.spec_on:
        return orig(batch, *args, **kwargs)
    return prepare_for_decode(rt, orig, batch, *args, **kwargs)


def _update_running_batch_around(orig: Any, scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    rt = _RUNTIME
    if rt is None or rt.plain_path:
        return orig(scheduler, batch, *args, **kwargs)
    # demand for the policy: requests waiting (and one being chunk-prefilled) besides the running batch
    rt.demand = core.demand(scheduler)
    try:
        return orig(scheduler, batch, *args, **kwargs)
    finally:
        rt.demand = None


# the admission cap (both draft modes): the core's hook on this switch's runtime
_allocatable_around = core.allocatable_hook(runtime)


# ------------------------------------------------------------------------------------------------
# Worker side: plain_decode, draft_sync


def capture_plain_decode_runner(worker: Any, rt: SwitchRuntime) -> None:
    """The target's plain DECODE graph runner (the v1 line's CudaGraphRunner, at `graph_runner`) and attention backend,
    captured beside its TARGET_VERIFY graphs (core.capture_plain_decode says why)."""
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

    tic = time.perf_counter()
    hidden_mode = core.capture_plain_decode(rt, worker.target_worker.model_runner, "graph_runner", CudaGraphRunner)
    rt.trace.event("capture_plain_runner", seconds=round(time.perf_counter() - tic, 3),
                   graphs=rt.plain_runner is not None, hidden_mode=hidden_mode.name,
                   capture_bs=list(getattr(rt.plain_runner, "capture_bs", []) or []))


def _init_cuda_graphs_after(result: Any, worker: Any, *args: Any, **kwargs: Any) -> Any:
    if _RUNTIME is not None:
        capture_plain_decode_runner(worker, _RUNTIME)
    return result


def worker_copy_for_plain_step(batch: Any) -> Any:
    """The ModelWorkerBatch the plain forward runs on: spec_info and spec_algorithm cleared on the copy only
    (the ScheduleBatch keeps its EagleDraftInput), hidden states FULL for the draft sync."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    mwb = batch.get_model_worker_batch()
    mwb.spec_info = None
    mwb.spec_algorithm = SpeculativeAlgorithm.NONE
    mwb.capture_hidden_mode = CaptureHiddenMode.FULL
    return mwb


def plain_decode(rt: SwitchRuntime, worker: Any, batch: Any) -> tuple[Any, Any]:
    """Model action plain_decode: the target's DECODE forward on the worker copy, on the plain runner, then
    v1's per-token bookkeeping (EagleVerifyInput.verify does it for speculative steps; the scheduler skips
    it for spec v1). Returns (target result, sampled tokens)."""
    rt.record("plain_decode", bs=len(batch.reqs))
    mwb = worker_copy_for_plain_step(batch)
    res = core.plain_forward(rt, worker.target_worker, "graph_runner", mwb)
    rt.trace.event("plain_graph" if res.can_run_cuda_graph else "plain_eager", bs=len(batch.reqs))
    tokens = res.next_token_ids
    think_end_id = getattr(batch.model_config, "think_end_id", None)
    for req, token in zip(batch.reqs, tokens.tolist(), strict=True):
        req.output_ids.append(token)
        if req.require_reasoning and think_end_id is not None:
            req.update_reasoning_tokens(token, think_end_id)
        req.check_finished()
        if not req.finished() and req.grammar is not None:
            req.grammar.accept_token(token)
            req.check_finished()
    return res, tokens


def draft_sync(rt: SwitchRuntime, worker: Any, batch: Any, target_result: Any, tokens: Any) -> None:
    """Model action draft_sync: v1's forward_draft_extend_after_decode over the one token the plain step
    committed, laid out as a verify that accepted no draft (EagleDraftExtendInput, one token per request).
    Finished rows are left out in order, as EagleVerifyInput.verify does: the scheduler then filters with
    v1_spec_info_filtered=True. Leaves the next EagleDraftInput on the ScheduleBatch."""
    import torch
    from sglang.srt.layers.moe.utils import speculative_moe_a2a_backend_context, speculative_moe_backend_context
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

    rt.record("draft_sync", bs=len(batch.reqs))
    keep = [i for i, req in enumerate(batch.reqs) if not req.finished()]
    if not keep:
        worker._draft_preprocess_idle(batch)  # v1's own stub when every request finished
        return
    n = len(keep)
    device = batch.seq_lens.device
    rows = torch.tensor(keep, dtype=torch.int64, device=device)
    hidden = target_result.logits_output.hidden_states
    batch.spec_info = EagleDraftExtendInput(
        hidden_states=None if hidden is None else hidden[rows],
        num_correct_drafts=torch.zeros(n, dtype=torch.int32, device=device),
        num_accept_tokens=torch.ones(n, dtype=torch.int32, device=device),
        num_accept_tokens_cpu=[1] * n,
        input_ids=tokens[rows].to(torch.int32),
        seq_lens=batch.seq_lens[rows],
        seq_lens_cpu=batch.seq_lens_cpu[keep],
        req_pool_indices=batch.req_pool_indices[rows],
    )
    batch.out_cache_loc = batch.out_cache_loc[rows]  # the slots this step wrote: the draft writes the same
    with contextlib.ExitStack() as stack:
        stack.enter_context(worker.draft_tp_context(worker.draft_model_runner.tp_group))
        stack.enter_context(speculative_moe_backend_context())
        stack.enter_context(speculative_moe_a2a_backend_context())
        batch.spec_info = worker.forward_draft_extend_after_decode(batch)


def _forward_around(orig: Any, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    rt = _RUNTIME
    if (rt is None or rt.plain_path or rt.policy.spec_on or batch.forward_mode.is_extend() or batch.is_extend_in_batch
            or batch.forward_mode.is_idle() or not batch.reqs):
        return orig(worker, batch, *args, **kwargs)
    from sglang.srt.managers.utils import GenerationBatchResult

    res, tokens = plain_decode(rt, worker, batch)
    draft_sync(rt, worker, batch, res, tokens)
    bs = len(batch.reqs)
    return GenerationBatchResult(logits_output=res.logits_output, next_token_ids=tokens, num_correct_drafts=0,
                                 num_correct_drafts_per_req_cpu=[0] * bs, can_run_cuda_graph=res.can_run_cuda_graph)


# ------------------------------------------------------------------------------------------------
# Draft mode retract (v1_plain_off_retract_catch_up): the flips at the top of the loop's iteration


def _next_batch_around(orig: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    rt = _RUNTIME
    if rt is None or not rt.plain_path:
        return orig(scheduler, *args, **kwargs)
    if rt.config.radix == "keep_out":  # issue 24, the default (shim/switch/radix_keep_out.py)
        resume_chunk_kept_out(scheduler)  # before SGLang's stash: this line's would not advance a kept-out chunk
    v1_plain_path.plain_path_flip(rt, scheduler)
    batch = orig(scheduler, *args, **kwargs)
    if batch is not None and not rt.policy.spec_on and rt.config.radix == "keep_out":
        keep_out_of_tree(batch.reqs)
    return batch


def _stream_output_around(orig: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """Outputs streamed while the plain path holds scheduler.spec_algorithm at NONE carry the per-request
    speculative counters all the same (the launch algorithm for the call only): see T_STREAM."""
    rt = _RUNTIME
    launch = rt.spec_side.saved(scheduler, "spec_algorithm") if rt is not None and rt.plain_path else None
    if launch is None:
        return orig(scheduler, *args, **kwargs)
    with AttributeSwap.around((scheduler, "spec_algorithm", launch)):
        return orig(scheduler, *args, **kwargs)


def _event_loop_around(orig: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """SPECFLIP_V1_LOOP=overlap: specflip's loop (plain iterations overlapped) in place of SGLang's normal one."""
    rt = _RUNTIME
    if rt is None or rt.config.v1_loop != "overlap":
        return orig(scheduler, *args, **kwargs)
    return v1_loop.run(rt, scheduler)


def _run_batch_around(orig: Any, scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    """The step timer of the switch trace (installed only with SPECFLIP_SWITCH_TRACE): every decode step's device
    time (CUDA events, read back when done: no host sync), its kind, and whether it is the first after a flip."""
    rt = _RUNTIME
    core.mark_warmup(rt, batch)
    if rt is None or not rt.plain_path or not rt.trace.enabled or not batch.forward_mode.is_decode():
        return orig(scheduler, batch, *args, **kwargs)
    kind = "plain" if batch.spec_algorithm.is_none() else "spec"
    every = rt.config.trace_every  # SPECFLIP_SWITCH_TRACE_EVERY: the two steps after a flip and every Nth other one
    if every > 1 and rt.steps_since_flip >= 2 and rt.counters.get(f"{kind}_step", 0) % every:
        rt.counters[f"{kind}_step"] = rt.counters.get(f"{kind}_step", 0) + 1
        rt.steps_since_flip += 1
        return orig(scheduler, batch, *args, **kwargs)
    bs = batch.batch_size()
    first = rt.first_after_flip
    # an overlapped plain step runs on the scheduler's forward stream (v1_loop.py), the normal loop's on this one
    stream = core.step_stream(scheduler)
    start, end = core.start_step_timer(stream)
    tic = time.perf_counter()
    out = orig(scheduler, batch, *args, **kwargs)
    end.record(stream)
    rt.counters[f"{kind}_step"] = rt.counters.get(f"{kind}_step", 0) + 1
    if kind == "plain":
        rt.count("plain_graph" if out.can_run_cuda_graph else "plain_eager")
    rt.trace.timed(start, end, {"kind": kind, "bs": bs, "first_after_flip": first,
                                "graph": bool(getattr(out, "can_run_cuda_graph", False)),
                                "host_ms": round((time.perf_counter() - tic) * 1e3, 3)})
    rt.steps_since_flip += 1
    return out


# ------------------------------------------------------------------------------------------------
# Start-up: the worker SGLang builds


def wrong_worker(line: Release, server_args: Any = None) -> tuple[str, str] | None:
    """(why, what to do) where SGLang `line` builds no v1 EAGLEWorker for `server_args` (as SGLang resolved them:
    `line.worker_kind`), None where it builds it. Without server arguments (at plugin load, before SGLang parsed its
    own) only a line that ships no v1 worker is known to be wrong: on a line that ships it, `--disable-overlap-schedule`
    may still select it where the environment does not."""
    if not line.ships_v1_worker:
        return (f"sglang {line.version} ships no v1 EAGLEWorker (every server runs EAGLEWorkerV2)",
                "Use specflip's own entry point (shim.plugin:register, SGLANG_PLUGINS=specflip), whose v2 switch runs "
                "there")
    if server_args is None or line.worker_kind(os.environ, server_args) == "v1":
        return None
    return (f"sglang {line.version} runs EAGLEWorkerV2 for this server (its resolved server arguments leave the "
            f"overlap schedule on)",
            "Launch the v1 worker (SGLANG_ENABLE_SPEC_V2=0 or --disable-overlap-schedule)")


def refuse_wrong_worker(line: Release, server_args: Any = None) -> bool:
    """Whether the worker is wrong for the v1 switch (`wrong_worker`); where it is, start-up stops with one line
    (`on_bad_config`, as a bad setting does), unless SPECFLIP_ON_BAD_CONFIG=warn: then one error line, and True."""
    wrong = wrong_worker(line, server_args)
    if wrong is None:
        return False
    why, remedy = wrong
    on_bad_config(ConfigError(f"{settings.SWITCH.name}={settings.SWITCH.raw()} asks for the v1 kit's switch, which "
                              f"runs on SGLang's v1 EAGLEWorker, but {why}"), feature="switch", remedy=remedy)
    return True


def check_worker(server_args: Any) -> None:
    """Whether the switch installed at plugin load runs on the worker SGLang builds, decided on SGLang's resolved
    server arguments: the v1 kit installs before SGLang parsed them (only SGLANG_ENABLE_SPEC_V2 can be read then),
    and its hooks on the scheduler (the flips at get_next_batch_to_run among them) would run as well on
    EAGLEWorkerV2's batches, which they were not written for. A wrong worker stops start-up with one line (the rule of
    a bad setting), rather than serving without the switch asked for or with the v2 switch in its place: the v1 kit
    names one design (the guard's reference, the trace's), and the line where the v1 worker ships offers no v2 switch.
    SPECFLIP_ON_BAD_CONFIG=warn: one error line, and this process's switch is off (its hooks pass through)."""
    if _RUNTIME is not None and refuse_wrong_worker(installed_line(), server_args):
        set_runtime(None)
        guard_api.announce_switch(None)


def _check_server_args_after(result: Any, server_args: Any, *args: Any, **kwargs: Any) -> Any:
    """`ServerArgs.check_server_args` AFTER, in SGLang's launching process (every line runs it there after
    load_plugins() and before any scheduler process starts; the arguments are resolved): a wrong worker stops the
    launch here, so that no scheduler process starts only to die of it (SGLang's launcher then prints tracebacks
    after the line). SPECFLIP_ON_BAD_CONFIG=warn says nothing here: each scheduler process says its line."""
    if bad_config_stops():
        check_worker(server_args)
    return result


def _init_model_worker_before(scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """`Scheduler.init_model_worker` BEFORE, in each scheduler process: `Scheduler.__init__` sets `self.server_args`
    (resolved, from the launching process) before it builds the model worker, on every line. Decides where the
    launching process did not (SPECFLIP_ON_BAD_CONFIG=warn; a launch that did not check its arguments)."""
    server_args = getattr(scheduler, "server_args", None)
    if server_args is not None:
        check_worker(server_args)


# ------------------------------------------------------------------------------------------------
# Installation


def install_switch(registry: Any, config: SwitchConfig | None) -> bool:
    """Register the switch's hooks on `registry` (SGLang's HookRegistry class); False when config is None.
    Call before `HookRegistry.apply_hooks()` (load_plugins calls it after every plugin ran)."""
    if config is None:
        return False
    rt = set_runtime(config)
    assert rt is not None
    core.announce(rt.trace, design_for(config), worker="v1", t_off=config.t_off, t_on=config.t_on,
                  spec_cap=config.spec_cap, plain_graphs=config.plain_graphs, draft_while_off=config.draft_while_off,
                  loop=config.v1_loop)
    hooks = {T_UPDATE_RUNNING: (_update_running_batch_around, "AROUND"),
             T_ALLOCATABLE: (_allocatable_around, "AROUND"),
             T_PREPARE: (_prepare_for_decode_around, "AROUND"),
             T_INIT_GRAPHS: (_init_cuda_graphs_after, "AFTER"),
             T_FORWARD: (_forward_around, "AROUND"),
             T_NEXT_BATCH: (_next_batch_around, "AROUND"),
             T_RUN_BATCH: (_run_batch_around, "AROUND"),
             T_STREAM: (_stream_output_around, "AROUND"),
             T_LOOP: (_event_loop_around, "AROUND"),
             T_CHECK_ARGS: (_check_server_args_after, "AFTER"),
             T_INIT_WORKER: (_init_model_worker_before, "BEFORE")}
    targets = (HOOKS_FOR_DRAFT_MODE[config.draft_while_off] + ((T_LOOP,) if config.v1_loop == "overlap" else ())
               + START_UP_HOOKS)
    # T_RUN_BATCH only with the trace, which alone reads it: one wrapper less per step
    core.install_hooks(registry, config, [(target, *hooks[target]) for target in targets
                                          if target != T_RUN_BATCH or rt.trace.enabled])
    return True


def set_runtime(config: SwitchConfig | None) -> SwitchRuntime | None:
    """A fresh runtime for `config` (speculation on, nothing recorded); None: the hooks stay registered and
    pass everything through (speculation always on)."""
    global _RUNTIME
    _RUNTIME = None if config is None else SwitchRuntime(config=check_config(config),
                                                         policy=SwitchPolicy(config, design_name=design_for(config)),
                                                         trace=JsonlTrace(config.trace_dir))
    return _RUNTIME


def config_from_env(env: Mapping[str, str] | None = None) -> SwitchConfig | None:
    """The v1 switch's configuration: SwitchConfig.from_env with SPECFLIP_SWITCH_DRAFT retract by default, and, when
    SPECFLIP_V1_LOOP is unset in draft mode retract, the overlap loop (plain iterations overlapped, v1_loop.py), with
    the guard or without: the guard followed it live on the H200 with no finding (docs/v1.md; 2026-12-03, d3f54dc)."""
    config = SwitchConfig.from_env(env, default_draft="retract")
    if config is None or settings.V1_LOOP.is_set(env) or config.draft_while_off != "retract":
        return config
    return dataclasses.replace(config, v1_loop="overlap")


def checked_config_from_env(env: Mapping[str, str] | None = None) -> SwitchConfig | None:
    """config_from_env, refused (SwitchConfigError) where the v1 switch cannot run it (check_config)."""
    config = config_from_env(env)
    return None if config is None else check_config(config)


def install_from_env() -> bool:
    """Install the switch as SPECFLIP_* say (config_from_env); False when SPECFLIP_SWITCH is unset, or (one line
    logged) on a bad setting."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    log = logging.getLogger("specflip.switch")
    try:
        config = checked_config_from_env()
    except SwitchConfigError as exc:
        log.error("specflip v1 switch off: %s", exc)
        return False
    if config is not None and config.draft_while_off == "retract":
        log.info("specflip v1 switch: the %s loop (SPECFLIP_V1_LOOP%s)", config.v1_loop,
                 "" if settings.V1_LOOP.is_set() else
                 " unset: overlap in draft mode retract")
    return install_switch(HookRegistry, config)
