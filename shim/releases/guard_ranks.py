"""The guard's rank-check glue (TP > 1): the ranks agree on the step before it runs (shim.guard.rank_check).

`RankCheckHooks` is the rank-check half of the guard's adapter (`guard_hooks.V2Adapter`): it decides once per process
whether the check runs and feeds it each iteration's plan as a fingerprint.
"""

from __future__ import annotations

import logging
from typing import Any

from shim.guard.core import Mode, SpecFlipViolation
from shim.guard.rank_check import RankChecker, StepFingerprint, fingerprint, group_exchange
from shim.guard.runtime import GuardRuntime
from shim.releases.guard_reading import tensor_width
from statemodel.state import SpecMode

logger = logging.getLogger("specflip.guard")


class RankCheckHooks:
    """`rank_checker` and the hook on `Scheduler.get_next_batch_to_run` (state set up by `V2Adapter.__init__`)."""

    runtime: GuardRuntime | None
    _rank_checker: RankChecker | bool | None
    _worker_reading: Any

    def rank_checker(self, scheduler: Any) -> RankChecker | None:
        """The process's RankChecker, decided once: on when the guard is on, SPECFLIP_RANK_CHECK allows it, the
        scheduler's TP CPU group holds more than one rank and the configuration is one the guard supports. Every
        input is the same on every rank (the environment, the server arguments, the group), so every rank decides
        alike and each exchange has all its peers."""
        if self._rank_checker is None:
            self._rank_checker = False
            rt = self.runtime
            group = getattr(scheduler, "tp_cpu_group", None)
            if rt is not None and rt.mode is not Mode.OFF and rt.rank_check and group is not None \
                    and self.unsupported_reason(self.resolved_server_args()) is None:
                import torch.distributed as dist

                world = dist.get_world_size(group)
                if world > 1:
                    self._rank_checker = RankChecker(group_exchange(group, world), rank=dist.get_rank(group),
                                                     world_size=world, mode=rt.mode)
        return self._rank_checker or None

    def after_get_next_batch_to_run(self, plan: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
        """`Scheduler.get_next_batch_to_run` returned this iteration's plan (after the switch's flip, before
        `run_batch`): with TP > 1 the ranks exchange its fingerprint. Runs on every iteration of every rank, also
        while this rank's guard is off (its fingerprint says so): a rank that skipped the exchange would leave its
        peers waiting in it."""
        self._worker_reading = None  # every scheduler iteration passes here before its worker call
        checker = self.rank_checker(scheduler)
        rt = self.runtime
        if checker is None or rt is None or rt.paused:
            return None
        batch = getattr(plan, "batch_to_run", None)
        g = rt.guard if rt.active else None
        if g is None and rt.active:
            try:
                g = self.guard()
            except Exception:  # noqa: BLE001 - the guard's own start-up error surfaces at its own hooks
                g = None
        state = g.check_pending() if g is not None else None
        model = {"guard_mode_on": None if state is None else state.spec_mode is SpecMode.ON,
                 "guard_num_steps": None if state is None else state.num_steps,
                 "guard_transitions": None if g is None else g.step_number}

        def make(step: int) -> StepFingerprint:
            if batch is None or not batch.reqs:
                return fingerprint(step, forward_mode=None, rids=(), out_cache_loc_width=0, spec_algorithm_on=False,
                                   spec_decode=False, **model)
            spec_on = not batch.spec_algorithm.is_none()
            mode = batch.forward_mode
            return fingerprint(step, forward_mode=int(mode), rids=[str(r.rid) for r in batch.reqs],
                               out_cache_loc_width=tensor_width(batch.out_cache_loc), spec_algorithm_on=spec_on,
                               spec_decode=spec_on and mode.is_decode(), **model)

        try:
            checker.check(make)
        except SpecFlipViolation:
            raise
        except Exception:
            if rt.mode is Mode.ASSERT:
                raise
            # warn / trace mode: the exchange failed (a peer is gone); stop exchanging, serving goes on
            logger.exception("specflip guard: the rank agreement check failed; it stops on this rank")
            checker.stopped = True
        return None
