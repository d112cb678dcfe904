"""specflip's speculation switch for SGLang's v2 EAGLE worker (the lines in shim/releases/), as plugin hooks only.

Speculation goes off when demand (running + prefilling + waiting requests) reaches `t_off` and back on when
demand falls to `t_on` and the running batch fits under speculation's running cap (hysteresis): the model's
own rule (statemodel.policy.decide_flip, which the model's policy_wants_off / policy_wants_on use too), evaluated on
the scheduler's counts (shim/switch/policy.py).
A spec-off step is a real plain DECODE of the target: one token per request, on a decode CUDA graph runner
captured at start-up beside the verify graphs, no drafting. Each function below is named after the model
action it performs (statemodel.actions: flip_off, flip_on, prepare_for_decode, plain_decode, draft_sync).
This module holds the hooks, the in-step flip of draft modes "sync" and "none" (`flip`), the v2 worker's side of a
plain-path flip (`V2Side`) and installation. What the v1 switch shares is the switch core's (shim/switch/core.py):
the plain path's flip (`plain_path_flip`: decision, order, record), every flip's bookkeeping, the admission cap's
hook and the runtime's common state. The units this module calls are beside it (and re-exported here):
`v2_runtime` (SwitchRuntime), `v2_flip` (the v2 worker's flip actions), `v2_capture` (the plain runner made at
start-up), `v2_plain_step` (the spec-off step inside the speculative worker).

Enable with `SPECFLIP_SWITCH=t_off:t_on`, or `SPECFLIP_SWITCH=auto` (no thresholds: the switch learns where
speculation stops paying from its own step times, shim/switch/auto.py, docs/auto-switch.md), and install with
`install_switch(HookRegistry, SwitchConfig.from_env())` from a plugin entry point (shim/plugin.py:
`register_switch`, or `register`), before `HookRegistry.apply_hooks()`, which `load_plugins` calls. Other knobs:
  SPECFLIP_SWITCH_DRAFT   retract (default: design plain_off_retract_catch_up: speculation off is SGLang's own
                          plain scheduler path; the flip back on retracts the running requests, whose re-prefill
                          with speculation is the draft's catch-up) |
                          sync (design v2_switch_reserve_sync, draft-extend after every plain step, inside the
                          speculative scheduler path: slower, measured in docs/archive/gpu-results.md) |
                          none (KNOWN BAD, measurement only: no draft work while off, zeroed draft input)
  SPECFLIP_TIERS          'steps[,up:down,steps]...' (e.g. 3,8:4,1): while on, the EAGLE step count follows the
                          demand (design plain_off_retract_catch_up_tiers, shim/switch/v2_tiers.py, docs/tiers.md);
                          with SPECFLIP_SWITCH=auto the step counts only (e.g. 3,1): the learner picks among plain
                          and every tier (boundaries given with auto are refused);
                          needs draft mode retract and --speculative-adaptive with a config holding every tier
  SPECFLIP_SPEC_CAP       running-request cap while speculation is on (default 48, SGLang's speculative default)
  SPECFLIP_PLAIN_GRAPHS   decode (default: capture a plain decode runner) | eager
  SPECFLIP_PLAIN_PREFILL  graphs (default: the plain path's prefills replay the target's prefill CUDA graphs, see
                          PlainPrefillOnTargetGraphs) | eager (as SGLang would run them: a mode mismatch)
  SPECFLIP_SWITCH_WARMUP  on (default: before the server listens, two waves of requests run every path a flip
                          takes, so a cold cache's kernel builds fall at start-up; shim/switch/warmup.py) | off
  SPECFLIP_SWITCH_TRACE   a directory: one JSONL trace of switch actions per process (switch-<pid>.jsonl)
  SPECFLIP_SWITCH_RADIX   keep_out (default; issue 24's fix through SGLang's skip_radix_cache_insert: tokens
                          computed while off stay out of the radix tree; its leak through chunked prefill is fixed
                          by resume_chunk_kept_out, a1e2254; H200 rerun 2026-12-01, 25a6220) | insert (SGLang's own
                          tree: a later hit drafts over stale draft KV, outputs exact; docs/prefix-cache.md)
  SPECFLIP_FAULT_LATE_FLIP  FAULT INJECTION, tests only: a TP rank that performs the first flip one scheduler step
                          late (shim/switch/faults.py; docs/tp.md)
  SPECFLIP_FAULT          FAULT INJECTION, tests only: switch bugs the guard's identity checks must catch
                          (shim/switch/faults.py; docs/guard.md)
  SPECFLIP_SWITCH_TRACE_EVERY  N (default 1): trace the two decode steps after each flip and every Nth other one
                          (flips always). For throughput runs: a traced step costs JSON and CUDA events on the
                          host. `specflip replay` needs every step (its conformance reads them all).

Launch the server with a high `--max-running-requests` (what plain decoding would run); the switch holds
admission at SPECFLIP_SPEC_CAP while speculation is on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from shim import releases
from shim.guard import api as guard_api
from shim.releases.registry import installed_line
from shim.switch import core, faults
from shim.switch.auto import AutoSwitch, draft_vocabulary
from shim.switch.config import (
    SwitchConfig,
    SwitchConfigError,
)
from shim.switch.core import _pending_prefill as _pending_prefill
from shim.switch.core import catch_up_work as catch_up_work
from shim.switch.core import flip_on_waits, plain_path_flip
from shim.switch.core import reseat_seq_lens as reseat_seq_lens
from shim.switch.faults import LateFlipFault
from shim.switch.policy import SwitchPolicy
from shim.switch.radix_keep_out import keep_out_of_tree, resume_chunk_kept_out

# re-exported (`X as X`): the names this module held before the split into v2_*.py stay importable from it
from shim.switch.swap import AttributeSwap as AttributeSwap
from shim.switch.swap import plain_runner_side as plain_runner_side
from shim.switch.v2_capture import PlainPrefillOnTargetGraphs as PlainPrefillOnTargetGraphs
from shim.switch.v2_capture import capture_plain_decode_runner
from shim.switch.v2_capture import plain_prefill_view as plain_prefill_view
from shim.switch.v2_flip import (
    _set_batch_algorithm,
    drain_in_flight,
    enter_plain_path,
    enter_spec_path,
    release_reserve,
    retract_all_running,
)
from shim.switch.v2_plain_step import draft_sync as draft_sync
from shim.switch.v2_plain_step import plain_decode
from shim.switch.v2_runtime import SwitchRuntime
from shim.switch.v2_tiers import activate_tier, check_tier_states, launch_tier
from shim.timing.jsonl import JsonlTrace
from statemodel import auto_policy as ap

# Hook targets (the same on every v2 line, docs/correspondence-research.md section 6; the plain capture's is the
# release's `plain_capture_target`, shim/releases/).
T_FORWARD = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"
T_UPDATE_RUNNING = "sglang.srt.managers.scheduler.Scheduler.update_running_batch"
T_ALLOCATABLE = "sglang.srt.managers.scheduler.Scheduler.get_num_allocatable_reqs"
# draft mode "retract" flips here, where nothing is prepared yet and the in-flight result can be processed first
T_NEXT_BATCH = "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run"
T_RUN_BATCH = "sglang.srt.managers.scheduler.Scheduler.run_batch"  # the plain path's step trace; auto's step times
T_PROCESS_RESULT = "sglang.srt.managers.scheduler.Scheduler.process_batch_result"  # auto: accept lengths on the host
# SPECFLIP_TIERS (shim/switch/v2_tiers.py): the worker applies the switch's tier; SGLang's accept-length controller out
T_ACTIVATE_STEPS = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.activate_step_by_batch"
T_VERIFY_DONE = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.on_verify_complete_cpu"

# The model actions (statemodel.actions.ACTION_CATALOGUE) one decode step performs, in order.
SPEC_STEP_ACTIONS = ("prepare_for_decode", "draft", "verify", "draft_extend")
PLAIN_STEP_ACTIONS = {"sync": ("prepare_for_decode", "plain_decode", "draft_sync"),
                      "retract": ("prepare_for_decode", "plain_decode"),
                      "none": ("prepare_for_decode", "plain_decode")}


_RUNTIME: SwitchRuntime | None = None


def runtime() -> SwitchRuntime | None:
    return _RUNTIME


# ------------------------------------------------------------------------------------------------
# Scheduler side: flip_off / flip_on and the running cap


def flip(rt: SwitchRuntime, scheduler: Any, batch: Any) -> str | None:
    """Decide the mode for the decode step `update_running_batch` is about to prepare."""
    running = batch.batch_size() if batch is not None else 0
    waiting, chunked = core.demand(scheduler)
    action = rt.policy.decide(running, waiting, chunked)
    if action is not None:
        if action == "flip_off" and batch is not None:
            # admission was held at the speculative cap, which marks the batch full; without this reset the
            # waiting requests are admitted only after a running one finishes
            batch.batch_is_full = False
            running_batch = getattr(scheduler, "running_batch", None)
            if running_batch is not None:
                running_batch.batch_is_full = False
        core.flip_done(rt, SIDE, action, batch, {"running": running, "waiting": waiting, "chunked": chunked})
    return action


def _update_running_batch_around(orig: Any, self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    rt = _RUNTIME
    if rt is not None and not rt.plain_path and batch is not None and not batch.is_empty():
        flip(rt, self, batch)
    return orig(self, batch, *args, **kwargs)


def _flip_when_idle(rt: SwitchRuntime, scheduler: Any) -> None:
    """update_running_batch is not called while nothing runs: an idle server flips on here (in the admission cap's
    hook), before the next prefill is formed (t_on = 0 re-enables only when idle). The plain path flips at
    get_next_batch_to_run, idle or not."""
    if not rt.policy.spec_on and not rt.plain_path:
        flip(rt, scheduler, None)


_allocatable_around = core.allocatable_hook(runtime, _flip_when_idle)


# ------------------------------------------------------------------------------------------------
# Scheduler side, draft mode "retract" (design plain_off_retract_catch_up): speculation off is SGLang's own
# plain scheduler path. Every branch of the loop keys on the batch's (and for new batches the scheduler's)
# spec_algorithm, and the worker is `scheduler.model_worker`: flip_off points both at the plain side, flip_on
# back. Both run at the top of get_next_batch_to_run, before anything of the next step is prepared, and
# first process the launched step's result (the model's flip_waits_for_results): flip_off frees the
# reserve that result's verify writes into, flip_on retracts requests that result still extends.


class V2Side:
    """The v2 worker's side of a plain-path flip (core.WorkerSide; core.plain_path_flip decides and sequences). Its
    steps are this module's names (v2_flip.py's, re-exported), looked up at each flip: tests replace them here."""

    follows_tiers = True  # SPECFLIP_TIERS: the worker applies the tier (activate_step_by_batch, v2_tiers.py)

    def flip_on_waits(self, running_batch: Any, pending: Any) -> bool:
        return flip_on_waits(running_batch, pending)

    def flip_starting(self, scheduler: Any, reqs: list[Any]) -> dict[str, Any]:
        """The guard settles what ran before and watches what the flip frees; then the launched step's result is
        processed (the model's flip_waits_for_results): flip_off frees the reserve that result's verify writes
        into, flip_on retracts requests that result still extends."""
        guard_api.notify_flip_starting(reqs)
        return {"chunked": 0, "drained": drain_in_flight(scheduler), "reserve_freed": 0}

    def leave_spec(self, rt: SwitchRuntime, scheduler: Any, running_batch: Any, pending: Any,
                   reqs: list[Any]) -> dict[str, Any]:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        freed = release_reserve(scheduler, reqs)
        for batch in (running_batch, pending):
            if batch is not None:
                _set_batch_algorithm(batch, SpeculativeAlgorithm.NONE)
        return {"reserve_freed": freed}

    def enter_plain(self, rt: SwitchRuntime, scheduler: Any) -> None:
        enter_plain_path(rt, scheduler)

    def to_retract(self, scheduler: Any, running_batch: Any, record: dict[str, Any]) -> list[Any]:
        if record["drained"] and any(r.finished() for r in running_batch.reqs):
            running_batch.filter_batch()  # what update_running_batch would do first (the guard sees it)
        return list(running_batch.reqs)

    def retract(self, scheduler: Any, running_batch: Any, reqs: list[Any]) -> None:
        retract_all_running(scheduler, reqs)

    def enter_spec(self, rt: SwitchRuntime, scheduler: Any, running_batch: Any) -> None:
        running_batch.reqs = []  # each one left through retract_all (the guard saw each release)
        enter_spec_path(rt, scheduler)
        _set_batch_algorithm(running_batch, scheduler.spec_algorithm)

    def record_flip(self, rt: SwitchRuntime, action: str, record: dict[str, Any]) -> None:
        rt.trace.event(action, **record)


SIDE = V2Side()


def _process_result_around(orig: Any, self: Any, batch: Any, result: Any, *args: Any, **kwargs: Any) -> Any:
    """The auto policy reads a verify's accept lengths once SGLang has them on the host."""
    out = orig(self, batch, result, *args, **kwargs)
    rt = _RUNTIME
    if rt is not None and rt.policy.auto is not None:
        rt.policy.auto.on_result(batch, result)
    return out


def _next_batch_around(orig: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    rt = _RUNTIME
    if rt is None or not rt.plain_path:
        return orig(self, *args, **kwargs)
    running_batch = kwargs.pop("running_batch", None) if "running_batch" in kwargs else args[0]
    last_batch = kwargs.pop("last_batch", None) if "last_batch" in kwargs else (args[1] if len(args) > 1 else None)
    faults.before_next_batch(running_batch, rt.policy.spec_on)  # SPECFLIP_FAULT only (tests); else a no-op
    if rt.config.radix == "keep_out":
        resume_chunk_kept_out(self)  # before SGLang's stash: on some lines it would not advance a kept-out chunk
    if rt.policy.auto is not None:  # after idle iterations, the idle time ages the learner's demand hold
        rt.policy.auto.before_decision(self, len(self.waiting_queue))
    plain_path_flip(rt, SIDE, self, running_batch, last_batch)
    plan = orig(self, running_batch=running_batch, last_batch=last_batch)
    batch = plan.batch_to_run  # a NextBatchPlan: the batch to launch and the running batch
    if batch is None and rt.policy.auto is not None:
        rt.policy.auto.on_idle()
    if batch is not None and not rt.policy.spec_on and rt.config.radix == "keep_out":
        keep_out_of_tree(batch.reqs)  # issue 24, the default (shim/switch/radix_keep_out.py)
    return plan


def _run_batch_around(orig: Any, self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    """The plain path's decode steps in the switch trace (speculative ones go through _forward_around); the auto
    policy's step times (every decode batch, both modes) and, with tiers, the step count each one ran at."""
    rt = _RUNTIME
    auto = rt.policy.auto if rt is not None else None
    if auto is None:
        return _run_batch_traced(orig, rt, self, batch, *args, **kwargs)
    steps = launch_tier(rt, batch)
    auto.on_run_batch(self, batch, rt.flips, rt.trace if rt.trace.enabled else None, steps=steps)
    out = _run_batch_traced(orig, rt, self, batch, *args, **kwargs)
    if steps is not None:
        auto.on_launched(out, steps)
    return out


def _run_batch_traced(orig: Any, rt: SwitchRuntime | None, self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    """`Scheduler.run_batch`, with its plain decode steps (and plain prefills) traced when the trace is on."""
    core.mark_warmup(rt, batch)
    if rt is None or not rt.trace.enabled or not batch.spec_algorithm.is_none():
        return orig(self, batch, *args, **kwargs)
    if not batch.forward_mode.is_decode():
        out = orig(self, batch, *args, **kwargs)
        if batch.forward_mode.is_extend():  # a plain prefill (the speculative ones: _forward_around)
            rt.trace.event("prefill", bs=batch.batch_size(), graph=bool(getattr(out, "can_run_cuda_graph", False)))
        return out
    gap = rt.decode_gap_ms()
    if not rt.trace_this_step(gap):
        out = orig(self, batch, *args, **kwargs)
        rt.count("plain_step")
        rt.steps_since_flip += 1
        return out
    bs = batch.batch_size()
    stream = core.step_stream(self)
    start, end = core.start_step_timer(stream)
    first = rt.first_after_flip
    out = orig(self, batch, *args, **kwargs)
    end.record(stream)
    rt.count("plain_step")
    rt.trace.event("step", actions=PLAIN_STEP_ACTIONS["retract"], bs=bs, graph=bool(out.can_run_cuda_graph))
    rt.trace.timed(start, end, {"kind": "plain", "bs": bs, "first_after_flip": first, "gap_ms": _ms(gap)})
    rt.steps_since_flip += 1
    return out


# ------------------------------------------------------------------------------------------------
# Worker side


def _ms(gap: float | None) -> float | None:
    return None if gap is None else round(gap, 2)


def _init_cuda_graphs_after(result: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    if _RUNTIME is not None:
        capture_plain_decode_runner(self, _RUNTIME)
        auto = _RUNTIME.policy.auto
        if auto is not None:  # the draft's vocabulary, once: the learner's coverage signal (shim/switch/auto.py)
            auto.vocab = draft_vocabulary(self)
            _RUNTIME.trace.event("auto_draft_vocabulary", size=None if auto.vocab is None else len(auto.vocab))
        if _RUNTIME.config.tiers is not None:
            check_tier_states(_RUNTIME, self)
    return result


def _activate_steps_around(orig: Any, self: Any, batch_size: int, *args: Any, **kwargs: Any) -> Any:
    """SPECFLIP_TIERS: the step count is the switch's tier, not SGLang's batch-size routing."""
    rt = _RUNTIME
    if rt is not None and activate_tier(rt, self):
        return None
    return orig(self, batch_size, *args, **kwargs)


def _verify_done_around(orig: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """SPECFLIP_TIERS: SGLang's accept-length controller must not move the step count behind the switch."""
    rt = _RUNTIME
    if rt is not None and rt.config.tiers is not None and not rt.tiers_off:
        return None
    return orig(self, *args, **kwargs)


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
    gap = rt.decode_gap_ms() if rt.trace.enabled else None
    timing = rt.trace_this_step(gap)
    if timing:
        start, end = core.start_step_timer()
    first = rt.first_after_flip
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
        extra = {"steps": int(self.speculative_num_steps)} if kind == "spec" and rt.config.tiers is not None else {}
        rt.trace.event("step", actions=actions, bs=bs, graph=bool(out.can_run_cuda_graph), **extra)
        end.record()
        rt.trace.timed(start, end, {"kind": kind, "bs": bs, "first_after_flip": first, "gap_ms": _ms(gap)})
    rt.steps_since_flip += 1
    return out


# ------------------------------------------------------------------------------------------------
# Installation


def install_switch(registry: Any, config: SwitchConfig | None, late_flip: LateFlipFault | None = None) -> bool:
    """Register the switch's hooks on `registry` (SGLang's HookRegistry class); False when config is None.
    `late_flip`: a fault injection for tests (SPECFLIP_FAULT_LATE_FLIP), never on by default.

    Call from the plugin entry point before `HookRegistry.apply_hooks()` runs, e.g.
        install_switch(HookRegistry, SwitchConfig.from_env())
    """
    global _RUNTIME
    if config is None:
        return False
    auto = AutoSwitch(spec_cap=config.spec_cap,
                      state=ap.initial_state(tiers=() if config.tiers is None else config.tiers.steps)) \
        if config.auto else None
    _RUNTIME = SwitchRuntime(config=config, policy=SwitchPolicy(config, auto=auto), trace=JsonlTrace(config.trace_dir),
                             late_flip=late_flip)
    core.announce(_RUNTIME.trace, config.design_name,
                  policy="auto" if config.auto else "thresholds",
                  auto_params=None if auto is None else repr(auto.state.params), t_off=config.t_off,
                  t_on=config.t_on,
                  spec_cap=config.spec_cap, draft_while_off=config.draft_while_off,
                  plain_graphs=config.plain_graphs, plain_prefill=config.plain_prefill,
                  trace_every=config.trace_every,
                  tiers=None if config.tiers is None else config.tiers.describe())
    hooks: list[core.Hook] = []
    if not _RUNTIME.plain_path:  # the plain path flips in get_next_batch_to_run: one wrapper less per step
        hooks.append((T_UPDATE_RUNNING, _update_running_batch_around, "AROUND"))
    hooks += [(T_ALLOCATABLE, _allocatable_around, "AROUND"),
              (installed_line().plain_capture_target, _init_cuda_graphs_after, "AFTER"),
              (T_FORWARD, _forward_around, "AROUND")]
    if _RUNTIME.plain_path:
        hooks.append((T_NEXT_BATCH, _next_batch_around, "AROUND"))
        if _RUNTIME.trace.enabled or auto is not None:
            hooks.append((T_RUN_BATCH, _run_batch_around, "AROUND"))
        if auto is not None:
            hooks.append((T_PROCESS_RESULT, _process_result_around, "AROUND"))
    if config.tiers is not None:
        hooks += [(T_ACTIVATE_STEPS, _activate_steps_around, "AROUND"),
                  (T_VERIFY_DONE, _verify_done_around, "AROUND")]
    core.install_hooks(registry, config, hooks)
    return True


def v1_worker_selected(release: str | None, env: Mapping[str, str]) -> bool:
    """Whether this server runs SGLang's v1 EAGLEWorker, whose switch is shim/switch/v1.py: on the lines
    that still have it, the overlap schedule off runs it (the release layer says which: shim/releases/); here, at
    plugin load, before SGLang parsed its arguments, SGLANG_ENABLE_SPEC_V2=0 is what can be read.
    Installing this (v2) switch there as well doubles the scheduler hooks (seen on the H200: two AROUND hooks on
    prepare_for_decode, a slot leaked)."""
    return releases.worker_kind(release, env) == "v1"


def install_from_env() -> bool:
    """Install the switch as SPECFLIP_* say (idempotent); a bad setting logs one line and leaves it off."""
    if _RUNTIME is not None:
        return True
    if v1_worker_selected(releases.installed_release(), os.environ):
        logging.getLogger("specflip.switch").info(
            "specflip v2 switch not installed: SGLANG_ENABLE_SPEC_V2=0 selects the v1 EAGLEWorker (shim/switch/v1.py)")
        return False
    try:
        config = SwitchConfig.from_env()
        late_flip = LateFlipFault.from_env() if config is not None else None
        if config is not None:
            faults.install_from_env()
    except SwitchConfigError as exc:
        logging.getLogger("specflip.switch").error("specflip switch off: %s", exc)
        return False
    if config is None:
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry

    return install_switch(HookRegistry, config, late_flip)
