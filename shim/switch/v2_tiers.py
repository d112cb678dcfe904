"""The v2 switch's speculative tiers (SPECFLIP_TIERS, design plain_off_retract_catch_up_tiers): while speculation is
on, the EAGLE step count follows the load (statemodel.policy.decide_tier), between plain decoding above t_off and the
largest tier at low load.

The step-count changes reuse SGLang's own adaptive runtime states (`--speculative-adaptive` with a tier config whose
candidate_steps hold every tier, e.g. bench/gpu/tiers_8b.json): SGLang captures per step count its draft, verify and
draft-extend CUDA graphs and attention backends, sizes the logits buffer and the KV reserve per request for the
largest candidate (ServerArgs.max_speculative_num_draft_tokens, the reserve rule KvReserve.LARGEST_STATE /
TWICE_LARGEST), and applies a state with `EAGLEWorkerV2.apply_runtime_state` at the top of a decode forward
(`activate_step_by_batch`), after prepare_for_decode topped the reserve up: the model's `draft(k)` choosing k. The
switch only replaces the choice: the scheduler decides the tier on its demand at get_next_batch_to_run and the
worker's activate_step_by_batch applies it; SGLang's accept-length controller (on_verify_complete) is kept out, so
nothing else moves the step count. The guard follows as it follows SGLang's adaptive switch: the draft step reads
the draft worker's speculative_num_steps.

With SPECFLIP_SWITCH=auto the tier is the learner's (statemodel.auto_policy over plain and every tier): the scheduler
takes it from the learner's committed decision at the same point (SwitchPolicy.follow_tier) and the worker applies
it the same way; `launch_tier` tells the learner which step count each speculative decode ran at.
"""

from __future__ import annotations

import logging
from typing import Any

from shim.switch.v2_runtime import SwitchRuntime
from statemodel import auto_policy as ap


def missing_tier_states(rt: SwitchRuntime, worker: Any) -> str | None:
    """Why the server cannot run the configured tiers (one line), or None: each tier needs an adaptive runtime
    state (SGLang builds them at start-up for every candidate step count of --speculative-adaptive-config)."""
    tiers = rt.config.tiers
    if tiers is None:
        return None
    controller = getattr(worker, "adaptive_controller", None)
    if controller is None:
        return ("SPECFLIP_TIERS needs --speculative-adaptive with a --speculative-adaptive-config whose "
                f"candidate_steps hold every tier {list(tiers.steps)} (e.g. bench/gpu/tiers_8b.json)")
    built = sorted(getattr(controller, "_states", {}))
    missing = [s for s in tiers.steps if s not in built]
    if missing:
        return (f"SPECFLIP_TIERS steps {missing} have no runtime state on this server (built: {built}); add them to "
                "the candidate_steps of --speculative-adaptive-config")
    return None


def check_tier_states(rt: SwitchRuntime, worker: Any) -> None:
    """At start-up, after SGLang built its runtime states: a tier the server has no state for turns the tiers
    off (one error line; speculation then keeps the launch step count between the flips)."""
    problem = missing_tier_states(rt, worker)
    rt.trace.event("tiers", ladder=None if rt.config.tiers is None else rt.config.tiers.describe(),
                   launch_steps=int(getattr(worker, "speculative_num_steps", 0)), problem=problem)
    if problem is not None:
        logging.getLogger("specflip.switch").error("specflip tiers off: %s", problem)
        rt.policy.tier = None
        rt.tiers_off = True
        auto = rt.policy.auto
        if auto is not None:  # at start-up, before any observation: the learner's two modes, plain and the launch
            auto.state = ap.initial_state(auto.state.params)


def launch_tier(rt: SwitchRuntime, batch: Any) -> int | None:
    """The step count a batch `Scheduler.run_batch` is about to launch runs at: the switch's tier for a speculative
    decode (activate_tier applies it inside this launch's forward), None otherwise or without tiers."""
    if rt.config.tiers is None or rt.tiers_off or rt.policy.tier is None or batch is None:
        return None
    if not batch.forward_mode.is_decode() or batch.spec_algorithm.is_none():
        return None
    return rt.policy.tier


def activate_tier(rt: SwitchRuntime, worker: Any) -> bool:
    """EAGLEWorkerV2.activate_step_by_batch for the switch: apply the tier the scheduler chose (SGLang's own
    controller `_activate`, i.e. worker.apply_runtime_state of its prebuilt state). True when the switch decided
    (the caller then skips SGLang's batch-size routing)."""
    steps = rt.policy.tier
    controller = getattr(worker, "adaptive_controller", None)
    if steps is None or controller is None or rt.tiers_off:
        return False
    if steps != worker.speculative_num_steps:
        controller._activate(steps)
        rt.count("tier_change")
        rt.trace.event("tier_applied", steps=steps)
    return True
