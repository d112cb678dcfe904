"""The SGLang 0.5.21 line, as it differs from 0.5.22 (read in the 0.5.21 wheel, 2026-12-06).

* The tree (UnifiedRadixCache, what the factory builds) takes an unfinished request's prompt in
  `cache_unfinished_req(req, chunked=False)`: there is no `checkpoint` yet; `release_kv_cache(req, tree_cache,
  is_insert=True)`.
* The chunked request's admitted range is `req.extend_range` (set_extend_range), not `extend_end`, and its prefix is
  `req.prefix_indices`, the slots themselves: the kept-out chunk advances as on 0.5.16, its row read off `req.kv`.
* The draft's TP context is the draft worker's own `draft_tp_context(tp_group, owns_attention=...)`.

CPU install: transformers 5.12.1 / tokenizers 0.22.2 (its pins; .venv's transformers 5.19 refuses the `qwen3_asr`
config 0.5.21 registers) and xgrammar (its server_args imports the function-call parsers at module level).
"""

from __future__ import annotations

import sys
from typing import Any

from shim.releases import v0_5_22
from shim.releases.base import _moe_contexts
from shim.releases.v0_5_22 import CPU_VERIFIED

_KEEP = "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.cache_unfinished_req"


class Adapter(v0_5_22.Adapter):
    release = "0.5.21"
    TARGETS = tuple((_KEEP, how, hook) if hook == "around_tree_cache_keep" else (target, how, hook)
                    for target, how, hook in v0_5_22.Adapter.TARGETS)


class Line(v0_5_22.Line):
    """0.5.21 as it differs from 0.5.22: the kept-out chunk's range is `extend_range` over `prefix_indices`; the draft's
    TP context is the draft worker's own, over its TP group."""

    version = "0.5.21"
    adapter_class = Adapter
    verified = tuple((feature, CPU_VERIFIED) for feature in ("guard", "switch", "step_timer", "lint"))

    def advance_kept_out_chunk(self, scheduler: Any, req: Any) -> int:
        return prefix_slots_in_kv_chunk(scheduler, req, req.extend_range.end if req.extend_range is not None else 0)

    def draft_worker_contexts(self, worker: Any) -> list[Any]:
        dw = worker.draft_worker
        mod = sys.modules["sglang.srt.speculative.eagle_worker_v2"]
        return [dw.draft_tp_context(dw.draft_runner.tp_group, owns_attention=dw.draft_owns_attention),
                *_moe_contexts(mod)]


def prefix_slots_in_kv_chunk(scheduler: Any, req: Any, end: int) -> int:
    """base.prefix_slots_chunk for the lines whose row is `req.kv.req_pool_idx` (0.5.19 ... 0.5.21)."""
    row = req.kv.req_pool_idx
    if row is None:
        return 0
    start = len(req.prefix_indices)
    if end > start:
        slots = scheduler.req_to_token_pool.req_to_token[row, :end]
        req.prefix_indices = slots.to(dtype=req.prefix_indices.dtype, copy=True)
    return max(0, end - start)


LINE = Line()
