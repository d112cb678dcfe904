"""What the v2 switch's hooks share inside one scheduler process (shim/switch/v2.py holds the one instance)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from shim.switch.core import SwitchCore
from shim.timing.jsonl import IDLE_GAP_MS


@dataclass
class SwitchRuntime(SwitchCore):
    """What the hooks share inside one scheduler process (in draft mode "retract" `spec_side` holds what
    enter_plain_path swapped out, put back by enter_spec_path)."""

    plain_prefill_runner: Any = None  # PlainPrefillOnTargetGraphs, or None: the plain path keeps the target's
    fm_was_initialized: bool = False  # the future map had sized its buffers when the plain path was entered
    last_decode_launch: float = 0.0  # perf_counter at the last decode step's launch (kept while the trace is on)
    tiers_off: bool = False  # SPECFLIP_TIERS set but the server has no runtime state for a tier (v2_tiers.py)

    def trace_this_step(self, gap_ms: float | None = None) -> bool:
        """Whether the decode step about to run goes into the trace (SPECFLIP_SWITCH_TRACE_EVERY): every Nth, the
        two after each flip, and the first after an idle spell (`gap_ms` >= IDLE_GAP_MS)."""
        if not self.trace.enabled:
            return False
        every = self.config.trace_every
        return (every == 1 or self.steps_since_flip < 2 or (gap_ms is not None and gap_ms >= IDLE_GAP_MS)
                or sum(self.counters.values()) % every == 0)

    def decode_gap_ms(self) -> float | None:
        """Host milliseconds since the previous decode step was launched (None before the first), traced only."""
        now = time.perf_counter()
        gap = None if not self.last_decode_launch else (now - self.last_decode_launch) * 1000
        self.last_decode_launch = now
        return gap
