"""specflip's v1 loop (SPECFLIP_V1_LOOP=overlap; design v1_plain_off_retract_catch_up_overlap_plain, issue 22).

A v1 EAGLE server runs SGLang's normal loop for every iteration: the v1 EAGLEWorker cannot overlap (its verify
changes the ScheduleBatch in place, and the next step is prepared from it), so SGLang turns the overlap schedule off
for the whole server. Above the threshold the switch's plain path is then a plain server in the normal loop, 0.81-0.87x
the same server in the overlap loop on the H200 (docs/v1.md, 2026-12-02, 8aaf33a). This loop, installed in place of
Scheduler.event_loop_normal, runs each iteration in the loop its side needs:

* speculation on (scheduler.enable_overlap False, as SGLang set it): the normal loop's iteration, the step's result
  processed before the next step is prepared;
* speculation off (the plain side sets scheduler.enable_overlap, shim/switch/v1_plain_path.enter_plain_path): the
  overlap loop's iteration, as Scheduler.event_loop_overlap runs it (step N+1 prepared and launched, then step N's
  result processed; run_batch's overlap branch with a FutureMap of plain token ids, made here at start);
* a flip processes the result in flight first (flip_due: the same decision the flip itself makes), so the flip finds
  the state the normal loop gives it. Without it, SGLang would process that result after a flip-on cleared
  `enable_overlap`, so without skipping the requests the flip retracted: a re-prefilled one would get its token twice.

The model checks this order under the overlap scope (Design.overlap_spec_steps False, flip_waits_for_results True);
`v1_overlap_spec_steps` (speculative steps overlapped too, on v1's reserve) and `v1_overlap_flip_on_in_flight` (no drain
before a flip) are refuted.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from shim.switch.v1_plain_path import flip_due


def init_overlap_state(scheduler: Any) -> None:
    """What Scheduler.init_overlap makes when the overlap schedule is on and a non-overlap scheduler lacks: the
    FutureMap (plain token ids only: no speculative step ever goes through it), the batch record ring and the
    result queue. The streams (forward, copy) exist in both modes."""
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    scheduler.future_map = FutureMap(scheduler.max_running_requests, scheduler.chunked_prefill_size,
                                     scheduler.model_config.context_len, scheduler.device, SpeculativeAlgorithm.NONE)
    scheduler.batch_record_buf = [None] * 2
    scheduler.batch_record_ct = 0
    scheduler.result_queue = deque()


def process_oldest(scheduler: Any) -> None:
    batch, result = scheduler.result_queue.popleft()
    scheduler.process_batch_result(batch, result)


def iteration(rt: Any, scheduler: Any) -> Any:
    """One scheduler iteration after the requests were received; returns the batch launched (or None)."""
    queue = scheduler.result_queue
    if queue and flip_due(rt, scheduler):
        while queue:  # a flip processes the result in flight first
            process_oldest(scheduler)
    batch = scheduler.get_next_batch_to_run()  # the flip, if due, happens here (v1.py's _next_batch_around)
    scheduler.cur_batch = batch
    overlap = bool(scheduler.enable_overlap)  # the side the batch was formed on
    if queue and (not overlap or scheduler.is_disable_overlap_for_batch(batch)):
        while queue:
            process_oldest(scheduler)
    result = None
    if batch:
        result = scheduler.run_batch(batch)
        queue.append((batch.copy() if overlap else batch, result))
    if not overlap:  # event_loop_normal's order
        if batch:
            process_oldest(scheduler)
        else:
            scheduler.on_idle()
    else:  # event_loop_overlap's order
        if scheduler.last_batch:
            while len(queue) > (1 if batch else 0):
                process_oldest(scheduler)
        elif batch is None:
            scheduler.on_idle()
        if scheduler.is_generation:
            scheduler.launch_batch_sample_if_needed(result)
    scheduler.last_batch = batch
    return batch


def run(rt: Any, scheduler: Any) -> None:
    """The loop (never returns), under SGLang's grad mode for its event loops."""
    from sglang.srt.environ import envs
    from sglang.srt.utils import DynamicGradMode

    @DynamicGradMode()
    def loop() -> None:
        init_overlap_state(scheduler)
        rt.trace.event("v1_loop", loop="overlap")
        while True:
            scheduler.process_input_requests(scheduler.recv_requests())
            if scheduler._engine_paused:
                continue
            iteration(rt, scheduler)
            if envs.SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY.get():
                scheduler.self_check_during_busy()

    loop()
