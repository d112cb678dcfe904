"""The SGLang 0.5.22 line, as it differs from 0.5.23 (read in the 0.5.22 wheel, 2026-12-06).

* The draft's TP context is `spec_utils.draft_tp_context(owns_attention)`, called with the draft worker's
  `draft_owns_attention` (0.5.23: `draft_tp_context(parallel_layout)`).

The same as 0.5.23 in what specflip reads: the hook targets (UnifiedRadixCache with `checkpoint`, the factory's tree
for every server), `req.kv` (ReqKvInfo, always set, with `cache_inserted_len`), `release_kv_cache(req, tree_cache, *,
checkpoint)`, `retract_all(..., offload_kv)`, the future map without lazy sizing, `runtime_context`. CPU install:
`sglang==0.5.22 --no-deps` beside .venv (its transformers 5.19.0 / tokenizers 0.23.2 pins are .venv's; xgrammar is
imported lazily there). Verified: tests/test_release_conformance.py on its real objects.
"""

from __future__ import annotations

import sys
from typing import Any

from shim.releases import v0_5_23
from shim.releases.base import _moe_contexts

# where the lines without a GPU run of their own were verified
CPU_CONFORMANCE = ("CPU, CI: its hook targets resolve, it reads real objects, and its launching process with "
                   "specflip's hooks runs to the scheduler's start with the switch's warm-up named "
                   "(tests/test_release_conformance.py)")
CPU_VERIFIED = CPU_CONFORMANCE + "; no GPU run"  # a line whose `verified` has no GPU entry


class Adapter(v0_5_23.Adapter):
    release = "0.5.22"


class Line(v0_5_23.Line):
    """0.5.22 as it differs from 0.5.23: the draft's TP context takes `draft_owns_attention`."""

    version = "0.5.22"
    adapter_class = Adapter
    verified = tuple((feature, CPU_VERIFIED) for feature in ("guard", "switch", "step_timer", "lint"))

    def draft_worker_contexts(self, worker: Any) -> list[Any]:
        mod = sys.modules["sglang.srt.speculative.eagle_worker_v2"]
        return [mod.draft_tp_context(worker.draft_worker.draft_owns_attention), *_moe_contexts(mod)]


LINE = Line()
