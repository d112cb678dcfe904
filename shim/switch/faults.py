"""FAULT INJECTION, for testing the guard only: bugs a developer of a speculation switch could really make, injected
into the v2 switch's draft mode "retract" (shim/switch/v2.py, v2_flip.py) so that the guard's identity checks (issue
18, docs/guard.md "Identity checks") and its rank agreement check (docs/tp.md) can be shown to catch them on a live
server. Never on unless its variable is set.

  SPECFLIP_FAULT=<name>[,<name>...]

  reserve_off_by_one    (class 1, slot identity) flip-off frees the first reserved request's reserve one row position
                        late: req_to_token[row, committed+1 : allocated+1] instead of [committed : allocated). The
                        position past the allocation (a stale entry: a slot already free, or another request's) is
                        freed, the first reserved slot leaks; the counts balance. The guard reports
                        `slots_freed_owned broken by flip_off`.
  flip_keeps_allocated  (class 5, blame) flip-off frees every reserve but leaves kv_allocated_len where it was. The
                        guard reports `slots_freed_owned broken by flip_off` (with kv_conservation), blamed on the flip.
  plain_token_twice     (class 2, token content) after each flip-off, once the first plain step's result is processed,
                        one running request's newest output token is appended a second time. The guard reports
                        `committed_output_kept broken by prepare_for_decode` (or by the finish it brings forward).

  SPECFLIP_FAULT_LATE_FLIP=<TP rank>[:<n>]
                        (rank agreement) that rank performs the switch's n-th flip (default the first) one scheduler
                        step later than the other ranks (the flip taken at the top of get_next_batch_to_run is skipped
                        once there), so that the guard's rank agreement check (shim/guard/rank_check.py) can be shown
                        to stop it on a TP > 1 server. Its state lives on the switch's runtime (LateFlipFault).

Each SPECFLIP_FAULT fault fires at every flip-off (plain_token_twice: once per flip-off), so that warn mode shows it
repeatedly. A line `specflip FAULT INJECTION: <name> fired ...` is logged (logger specflip.switch) each time it fires.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shim.settings import SettingError, settings
from shim.switch.config import SwitchConfigError

ENV_FAULT = settings.FAULT.name  # declared in shim/settings.py
FAULTS: dict[str, str] = {
    "reserve_off_by_one": "flip-off frees one request's reserve one row position late (a slot leaked, another freed)",
    "flip_keeps_allocated": "flip-off frees the reserve but keeps kv_allocated_len",
    "plain_token_twice": "the first plain step after a flip-off appends one request's token twice",
}
logger = logging.getLogger("specflip.switch")

_ACTIVE: frozenset[str] = frozenset()
_plain_token_armed = -1  # iterations since the flip-off that armed plain_token_twice; -1: not armed


def install_from_env(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Read SPECFLIP_FAULT (unset: no fault). An unknown name raises SwitchConfigError (the switch stays off)."""
    global _ACTIVE, _plain_token_armed
    try:
        names = settings.FAULT.get(environ)
    except SettingError as exc:
        raise SwitchConfigError(str(exc)) from None
    _ACTIVE, _plain_token_armed = names, -1
    for name in sorted(names):
        logger.warning("specflip FAULT INJECTION on: %s: %s (%s); testing only", name, FAULTS[name], ENV_FAULT)
    return names


def active(name: str) -> bool:
    return name in _ACTIVE


def fired(name: str, detail: str) -> None:
    logger.warning("specflip FAULT INJECTION: %s fired (%s)", name, detail)


def reserve_range(rid: str, start: int, end: int, first: bool) -> tuple[int, int]:
    """The row positions flip-off frees for a reserve [start, end): shifted by one for the first reserved request
    under reserve_off_by_one."""
    if first and _ACTIVE and "reserve_off_by_one" in _ACTIVE:
        fired("reserve_off_by_one", f"request {rid}: freed [{start + 1}, {end + 1}) for the reserve [{start}, {end})")
        return start + 1, end + 1
    return start, end


def keeps_allocated(rid: str) -> bool:
    """Whether flip-off leaves kv_allocated_len as it was after freeing the reserve (flip_keeps_allocated)."""
    if _ACTIVE and "flip_keeps_allocated" in _ACTIVE:
        fired("flip_keeps_allocated", f"request {rid}: reserve freed, kv_allocated_len kept")
        return True
    return False


def flip_performed(action: str) -> None:
    """The switch flipped: plain_token_twice arms at each flip-off."""
    global _plain_token_armed
    if _ACTIVE and "plain_token_twice" in _ACTIVE:
        _plain_token_armed = 0 if action == "flip_off" else -1


def before_next_batch(running_batch: Any, spec_on: bool) -> None:
    """The top of get_next_batch_to_run (the switch's hook): under plain_token_twice, in the second iteration after a
    flip-off (the first plain step's result has been processed), one running request's newest token again."""
    global _plain_token_armed
    if _plain_token_armed < 0 or spec_on or running_batch is None:
        return
    _plain_token_armed += 1
    if _plain_token_armed < 2:
        return
    for req in running_batch.reqs:
        if not req.finished() and req.output_ids:
            req.output_ids.append(req.output_ids[-1])
            _plain_token_armed = -1
            fired("plain_token_twice", f"request {req.rid}: token {req.output_ids[-1]} appended twice, "
                                       f"{len(req.output_ids)} output tokens now")
            return


ENV_LATE_FLIP = settings.FAULT_LATE_FLIP.name


def tp_rank_of(scheduler: Any) -> int:
    """The scheduler's rank in its TP group (SGLang's `tp_cpu_group`); 0 without a group (TP 1)."""
    group = getattr(scheduler, "tp_cpu_group", None)
    if group is None:
        return 0
    import torch.distributed as dist

    return dist.get_rank(group)


@dataclass
class LateFlipFault:
    """Delays the `nth` flip on TP rank `rank` by one scheduler step (fault injection)."""

    rank: int
    nth: int = 1
    seen: int = 0  # flips this rank was about to perform
    fired: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LateFlipFault | None:
        try:
            value = settings.FAULT_LATE_FLIP.get(environ)
        except SettingError as exc:
            raise SwitchConfigError(str(exc)) from None
        if value is None:
            return None
        fault = cls(*value)
        logger.warning("specflip FAULT INJECTION on: TP rank %d performs flip %d one scheduler step late (%s); "
                       "testing only", fault.rank, fault.nth, ENV_LATE_FLIP)
        return fault

    def delays(self, scheduler: Any) -> bool:
        """Whether the flip the policy just decided is held back on this rank for this step (once)."""
        if self.fired or tp_rank_of(scheduler) != self.rank:
            return False
        self.seen += 1
        if self.seen < self.nth:
            return False
        self.fired = True
        logger.warning("specflip FAULT INJECTION: flip held back one scheduler step on TP rank %d", self.rank)
        return True
