"""The SGLang 0.5.20 line, as it differs from 0.5.21 (read in the 0.5.20 wheel, 2026-12-06).

* The draft worker's `draft_tp_context(tp_group)` takes no `owns_attention`.

CPU install: as 0.5.21 (transformers 5.12.1, tokenizers 0.22.2, xgrammar).
"""

from __future__ import annotations

import sys
from typing import Any

from shim.releases import v0_5_21
from shim.releases.base import _moe_contexts
from shim.releases.v0_5_22 import CPU_VERIFIED


class Adapter(v0_5_21.Adapter):
    release = "0.5.20"


class Line(v0_5_21.Line):
    """0.5.20 as it differs from 0.5.21: the draft worker's TP context over its TP group only."""

    version = "0.5.20"
    adapter_class = Adapter
    verified = tuple((feature, CPU_VERIFIED) for feature in ("guard", "switch", "step_timer", "lint"))

    def draft_worker_contexts(self, worker: Any) -> list[Any]:
        dw = worker.draft_worker
        mod = sys.modules["sglang.srt.speculative.eagle_worker_v2"]
        return [dw.draft_tp_context(dw.draft_runner.tp_group), *_moe_contexts(mod)]


LINE = Line()
