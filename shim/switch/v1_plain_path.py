"""The v1 switch's draft mode "retract" (design v1_plain_off_retract_catch_up, issue 22): speculation off is SGLang's
own plain scheduler path on the v1 worker's server, as the v2 switch's default design does on the v2 lines.

seeds_final ran every spec-off step inside the speculative path: the scheduler's spec-v1 branches, the EAGLEWorker's
forward hook, a worker-copy of the batch, per-request bookkeeping in Python and a draft-extend forward (the draft
sync) after every plain step. Here a spec-off step is the plain server's step: `flip_off` takes spec_info and
spec_algorithm off the running batch (and a prefilled batch not merged yet) and points the scheduler at the target
worker, the target's model runner at a plain DECODE graph runner captured at start-up. No draft work while off;
`flip_on` retracts every running request (ScheduleBatch.retract_all: release_req without tree insertion) and its
prefill with speculation on is the draft's catch-up. Both run at the top of Scheduler.get_next_batch_to_run, where
the non-overlap loop has processed every launched step's result.
"""

from __future__ import annotations

import time
from typing import Any

from shim.guard import api as guard_api
from shim.switch.radix_keep_out import give_back_flags
from shim.switch.v2_flip import _pending_prefill, flip_on_waits, reseat_seq_lens


def enter_plain_path(rt: Any, scheduler: Any) -> None:
    """Point the scheduler and the target's model runner at the plain side (rt.spec_side remembers what was
    there): new batches are formed plain (ScheduleBatch.init_new reads scheduler.spec_algorithm), run_batch takes
    the worker-batch branch and the target worker, the target replays the plain decode graphs."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    none = SpeculativeAlgorithm.NONE
    side = rt.spec_side
    side.set(scheduler, "spec_algorithm", none)
    side.set(scheduler, "model_worker", scheduler.tp_worker)
    mr = scheduler.tp_worker.model_runner
    side.set(mr, "graph_runner", rt.plain_runner)  # None: eager
    if rt.plain_attn_backend is not None:
        side.set(mr, "attn_backend", rt.plain_attn_backend)
    side.set(mr, "spec_algorithm", none)
    if rt.config.v1_loop == "overlap":  # shim/switch/v1_loop.py: plain iterations run as the overlap loop's
        side.set(scheduler, "enable_overlap", True)


def to_plain_batch(batch: Any, overlap: bool = False) -> None:
    """A speculative batch made plain: the next plain prepare_for_decode reads its input ids from output_ids,
    which v1 leaves holding the last verify's flat accepted tokens (several per request). Each request's last
    committed token takes their place (the draft input's bonus token; for a prefilled batch, its sampled one).
    `overlap`: its plain steps run in the overlap loop's order (ScheduleBatch.enable_overlap: seq_lens out of
    place, one step's delay in retract_decode and in the penalties' output ids)."""
    import torch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    last = [req.output_ids[-1] if req.output_ids else req.origin_input_ids[-1] for req in batch.reqs]
    batch.output_ids = torch.tensor(last, dtype=torch.int64).to(batch.seq_lens.device, non_blocking=True)
    batch.spec_algorithm = SpeculativeAlgorithm.NONE
    batch.spec_info = None
    batch.batch_is_full = False
    batch.enable_overlap = overlap


def retract_running(scheduler: Any, running_batch: Any) -> int:
    """SGLang's own retraction of every running request (release_req without tree insertion; the request keeps
    its output and goes back to the waiting queue), as update_running_batch does under memory pressure."""
    reqs = list(running_batch.reqs)
    if not reqs:
        return 0
    running_batch.retract_all(scheduler.server_args)
    for req in reqs:
        scheduler._add_request_to_queue(req, is_retracted=True)
    return len(reqs)


def flip_due(rt: Any, scheduler: Any) -> str | None:
    """The flip the policy wants for the iteration about to be planned, without performing it (the threshold
    policy's `wants` changes nothing). Demand is every unfinished request of the running batch and of a prefilled
    batch not merged yet, plus the waiting queue. No flip while a chunked prefill is in progress (its earlier chunks
    would straddle the flip)."""
    if scheduler.chunked_req is not None:
        return None
    running = scheduler.running_batch
    pending = _pending_prefill(scheduler, running, scheduler.last_batch)
    in_batch = sum(not r.finished() for r in running.reqs)
    if pending is not None:
        in_batch += sum(not r.finished() for r in pending.reqs)
    return rt.policy.wants(in_batch, len(scheduler.waiting_queue), 0)


def plain_path_flip(rt: Any, scheduler: Any) -> str | None:
    """Decide (flip_due) and perform a flip for the iteration get_next_batch_to_run is about to plan; returns the
    action. flip_on waits while the running batch holds finished requests or a prefilled batch is not merged (the
    model lets the flip come later): the requests it retracts are then exactly the running ones."""
    action = flip_due(rt, scheduler)
    running = scheduler.running_batch
    pending = _pending_prefill(scheduler, running, scheduler.last_batch)
    if action is None or (action == "flip_on" and flip_on_waits(running, pending)):
        return None
    in_batch = [r for r in running.reqs if not r.finished()]
    if pending is not None:
        in_batch += [r for r in pending.reqs if not r.finished()]
    waiting = len(scheduler.waiting_queue)
    tic = time.perf_counter()
    retracted = 0
    if action == "flip_off":
        if any(r.finished() for r in running.reqs):
            running.filter_batch(v1_spec_info_filtered=True)  # what update_running_batch does first
        for batch in (running, pending):
            if batch is not None and not batch.is_empty():
                to_plain_batch(batch, overlap=rt.config.v1_loop == "overlap")
        if not running.is_empty():
            reseat_seq_lens(running)  # v1's verify leaves orig_seq_lens and seq_lens_sum behind
        enter_plain_path(rt, scheduler)
    else:
        retracted = retract_running(scheduler, running)
        give_back_flags(scheduler.waiting_queue)  # re-prefilled with the draft: the tree may cache them again
        rt.spec_side.restore()
        running.spec_algorithm = scheduler.spec_algorithm
        running.spec_info = None
        running.batch_is_full = False
        running.enable_overlap = False  # speculative iterations run as the normal loop's (v1_loop.py)
    rt.policy.performed(action)
    rt.flips += 1
    rt.steps_since_flip = 0
    rt.record(action, running=len(in_batch), waiting=waiting, retracted=retracted,
              ms=round((time.perf_counter() - tic) * 1e3, 3))
    guard_api.notify_flip(action == "flip_on", running)
    return action
