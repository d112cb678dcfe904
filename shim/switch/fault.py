"""FAULT INJECTION, for testing only. Never on unless its variable is set.

  SPECFLIP_FAULT_LATE_FLIP=<TP rank>[:<n>]   that rank performs the switch's n-th flip (default the first) one
                                       scheduler step later than the other ranks (draft mode "retract", the default:
                                       the flip taken at the top of get_next_batch_to_run is skipped once there), so
                                       that the guard's rank agreement check (shim/guard/rank_check.py) can be shown
                                       to stop it on a TP > 1 server
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shim.switch.config import SwitchConfigError

ENV_LATE_FLIP = "SPECFLIP_FAULT_LATE_FLIP"
logger = logging.getLogger("specflip.switch")


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
        env = os.environ if environ is None else environ
        raw = env.get(ENV_LATE_FLIP, "").strip()
        if not raw:
            return None
        try:
            rank, _, nth = raw.partition(":")
            fault = cls(int(rank), int(nth or 1))
        except ValueError:
            raise SwitchConfigError(f"{ENV_LATE_FLIP} must be RANK or RANK:N (integers), got {raw!r}") from None
        if fault.rank < 0 or fault.nth < 1:
            raise SwitchConfigError(f"{ENV_LATE_FLIP} needs a TP rank >= 0 and N >= 1, got {raw!r}")
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

