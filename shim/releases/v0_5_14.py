"""The SGLang 0.5.14 line, as it differs from 0.5.15 (read in the 0.5.14 wheel, 2026-12-06).

* PrefillAdder admits a chunk by `req.fill_len` (the chunk's end; `extend_range` comes in 0.5.15).

CPU install: transformers 5.8.1 / tokenizers 0.22.2 (its pins).
"""

from __future__ import annotations

from typing import Any

from shim.releases import v0_5_15
from shim.releases.base import prefix_slots_chunk
from shim.releases.v0_5_22 import CPU_VERIFIED


class Adapter(v0_5_15.Adapter):
    release = "0.5.14"


class Line(v0_5_15.Line):
    """0.5.14 as it differs from 0.5.15: the kept-out chunk's end is `fill_len`."""

    version = "0.5.14"
    adapter_class = Adapter
    verified = tuple((feature, CPU_VERIFIED) for feature in ("guard", "switch", "step_timer", "lint"))

    def advance_kept_out_chunk(self, scheduler: Any, req: Any) -> int:
        return prefix_slots_chunk(scheduler, req, req.fill_len)


LINE = Line()
