"""The SGLang 0.5.23 line (what CI installs). The newest line: `ReleaseLine`'s defaults are its behaviour.

Guard: the v2 worker takes the ScheduleBatch; a Req keeps its KV lengths
in `req.kv` (ReqKvInfo); `release_kv_cache(req, tree_cache, *, checkpoint)`; the tree cache is a
`UnifiedRadixCache` (not `RadixCache`, which 0.5.23 still ships but never builds) whose `checkpoint(req, *,
up_to)` takes a running request's KV into the tree."""

from __future__ import annotations

from typing import Any

from shim.adapters.common import V2Adapter
from shim.releases.base import ReleaseLine

_SB = "sglang.srt.managers.schedule_batch.ScheduleBatch"
_V2 = "sglang.srt.speculative.eagle_worker_v2"
_BRP = "sglang.srt.managers.scheduler_components.batch_result_processor"
_ALLOC = "sglang.srt.mem_cache.allocator.base.BaseTokenToKVPoolAllocator"  # free groups: the base's, not overridden


class Adapter(V2Adapter):
    release = "0.5.23"
    PLAIN_RESULT_TAKES_READING = True  # V2Adapter._result_reading: event_loop_overlap's order, read in 0.5.23's source
    TARGETS = (
        (f"{_SB}.prepare_for_extend", "AROUND", "around_prepare_for_extend"),
        (f"{_SB}.prepare_for_decode", "AFTER", "after_prepare_for_decode"),
        (f"{_SB}.merge_batch", "AROUND", "around_merge_batch"),
        (f"{_SB}.filter_batch", "AROUND", "around_filter_batch"),
        ("sglang.srt.mem_cache.common.release_kv_cache", "AROUND", "around_release_kv_cache"),
        # the tree a 0.5.23 server builds (mem_cache/registry.default_radix_cache_factory), enabled or not
        ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.checkpoint", "AROUND", "around_tree_cache_keep"),
        # the positions an insert creates in the tree, marked with the inserting request's draft coverage (issue 24)
        ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.insert", "AROUND", "around_tree_insert"),
        ("sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation", "BEFORE", "before_target_forward"),
        (f"{_V2}.EagleDraftWorker.draft", "BEFORE", "before_draft"),
        (f"{_V2}.EAGLEWorkerV2._build_trivial_verify_input", "BEFORE", "before_trivial_verify_input"),
        (f"{_V2}.EAGLEWorkerV2.verify", "BEFORE", "before_verify"),
        (f"{_V2}.EagleDraftWorker._draft_extend_for_decode", "BEFORE", "before_draft_extend_for_decode"),
        (f"{_V2}.EAGLEWorkerV2._stub_skipped_draft_extend", "BEFORE", "before_stub_skipped_draft_extend"),
        (f"{_V2}.EAGLEWorkerV2.apply_runtime_state", "AFTER", "after_apply_runtime_state"),
        # a decode result's processing, right after _resolve_spec_v2_tokens (spec) or the plain token listing:
        # the overlap schedule's process_result (a no-op in the normal loop)
        (f"{_BRP}.SchedulerBatchResultProcessor._normalize_decode_outputs", "AFTER",
         "after_normalize_decode_outputs"),
        # TP > 1: the ranks agree on the planned step before it runs (shim/guard/rank_check.py; TP 1: a no-op)
        ("sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run", "AFTER", "after_get_next_batch_to_run"),
        # the row positions a release or a switch's flip frees (issue 18; recorded only inside those steps)
        ("sglang.srt.mem_cache.allocator.token.TokenToKVPoolAllocator.free", "BEFORE", "before_allocator_free"),
        # the free group one result's processing releases its finished requests in: their finishes are checked as
        # one step at its end (Guard.end_release_group), after SGLang streamed their outputs
        (f"{_ALLOC}.free_group_begin", "AFTER", "after_free_group_begin"),
        (f"{_ALLOC}.free_group_end", "BEFORE", "before_free_group_end"),
    )

    def req_kv_lens(self, req: Any) -> tuple[bool, int, int, int]:
        kv = req.kv
        if kv is None or kv.req_pool_idx is None:
            return False, 0, 0, 0
        return True, int(kv.kv_committed_len), int(kv.kv_allocated_len), int(kv.cache_protected_len)

    def req_row(self, req: Any) -> int | None:
        kv = req.kv
        return None if kv is None else kv.req_pool_idx

    def tp_rank(self) -> int:
        from sglang.srt.runtime_context import get_parallel

        try:
            return int(get_parallel().tp_rank)
        except RuntimeError:  # not written in this process (single-process use, tests)
            return 0

    def server_args(self) -> Any:
        from sglang.srt.runtime_context import get_server_args

        try:
            return get_server_args()
        except Exception:  # noqa: BLE001 - not published: run with what the live objects say
            return None


class Line(ReleaseLine):
    """0.5.23: a Req keeps its row and KV lengths in `req.kv`; the future map has no lazy sizing flag; the draft's TP
    context is a module function over its parallel layout (ReleaseLine's defaults)."""

    version = "0.5.23"
    adapter_class = Adapter
    lint_module = "specflip.lint.sglang_0_5_23"


LINE = Line()
