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

The flip itself (its decision, order, record and the guard's notification) is the switch core's `plain_path_flip`
(shim/switch/core.py), as on the v2 worker; `V1Side` below is what the v1 worker does its own way.
"""

from __future__ import annotations

from typing import Any

from shim.switch import core


def enter_plain_path(rt: Any, scheduler: Any) -> None:
    """Point the scheduler and the target's model runner at the plain side (rt.spec_side remembers what was
    there): new batches are formed plain (ScheduleBatch.init_new reads scheduler.spec_algorithm), run_batch takes
    the worker-batch branch and the target worker, the target replays the plain decode graphs (what both workers
    point: core.enter_plain_side, at v1's `graph_runner`)."""
    core.enter_plain_side(rt, scheduler, "graph_runner")
    if rt.config.v1_loop == "overlap":  # shim/switch/v1_loop.py: plain iterations run as the overlap loop's
        rt.spec_side.set(scheduler, "enable_overlap", True)


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


class V1Side:
    """The v1 worker's side of a plain-path flip (core.WorkerSide; core.plain_path_flip decides and sequences)."""

    follows_tiers = False  # the v1 worker has no tier to apply (SPECFLIP_TIERS is v2's)

    def flip_on_waits(self, running_batch: Any, pending: Any) -> bool:
        return core.flip_on_waits(running_batch, pending)

    def flip_starting(self, scheduler: Any, reqs: list[Any]) -> dict[str, Any]:
        """Nothing: the non-overlap loop processed every launched result before get_next_batch_to_run, and
        v1_loop.py drains the one in flight first when a flip is due (flip_due)."""
        return {}

    def leave_spec(self, rt: Any, scheduler: Any, running_batch: Any, pending: Any, reqs: list[Any]) -> dict[str, Any]:
        """v1 holds no KV reserve between steps: only the batches change (finished requests filtered first, as
        update_running_batch does; the draft input's bonus tokens become the plain path's output ids)."""
        if any(r.finished() for r in running_batch.reqs):
            running_batch.filter_batch(v1_spec_info_filtered=True)  # what update_running_batch does first
        for batch in (running_batch, pending):
            if batch is not None and not batch.is_empty():
                to_plain_batch(batch, overlap=rt.config.v1_loop == "overlap")
        return {}

    def enter_plain(self, rt: Any, scheduler: Any) -> None:
        enter_plain_path(rt, scheduler)

    def to_retract(self, scheduler: Any, running_batch: Any, record: dict[str, Any]) -> list[Any]:
        return list(running_batch.reqs)

    def retract(self, scheduler: Any, running_batch: Any, reqs: list[Any]) -> None:
        """SGLang's own retraction of every running request (release_req without tree insertion; the request keeps
        its output), as update_running_batch does under memory pressure."""
        running_batch.retract_all(scheduler.server_args)

    def enter_spec(self, rt: Any, scheduler: Any, running_batch: Any) -> None:
        rt.spec_side.restore()
        running_batch.spec_algorithm = scheduler.spec_algorithm
        running_batch.spec_info = None
        running_batch.enable_overlap = False  # speculative iterations run as the normal loop's (v1_loop.py)

    def record_flip(self, rt: Any, action: str, record: dict[str, Any]) -> None:
        """A model action of the v1 switch's record (counted, and in the recorded run tests check)."""
        rt.record(action, **record)


SIDE = V1Side()


def flip_due(rt: Any, scheduler: Any) -> str | None:
    """The flip the policy wants for the iteration about to be planned, without performing it (core.plain_path_flip
    deciding only)."""
    return core.plain_path_flip(rt, SIDE, scheduler, scheduler.running_batch, scheduler.last_batch, decide_only=True)


def plain_path_flip(rt: Any, scheduler: Any) -> str | None:
    """Decide and perform a flip for the iteration get_next_batch_to_run is about to plan (core.plain_path_flip on
    the scheduler's running batch and last batch); returns the action performed."""
    return core.plain_path_flip(rt, SIDE, scheduler, scheduler.running_batch, scheduler.last_batch)
