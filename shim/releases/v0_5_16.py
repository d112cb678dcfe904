"""The SGLang 0.5.16 line (the GPU host, torch 2.11), as it differs from 0.5.23.

Guard: the v2 worker takes the ScheduleBatch (no ModelWorkerBatch);
a Req keeps `kv_committed_len`, `req_pool_idx` and `cache_protected_len` on itself and only
`kv_allocated_len` in `req.kv` (ReqKvInfo, None while no row is held); `release_kv_cache(req, tree_cache,
is_insert=True)`. Hook targets are the same dotted paths as 0.5.23 (checked against the 0.5.16 wheel's
source by tests/test_guard_adapters.py where that source is unpacked)."""

from __future__ import annotations

from typing import Any

from shim.adapters.common import V2Adapter
from shim.releases import v0_5_23
from shim.releases.base import prefix_slots_chunk

Adapter0523 = v0_5_23.Adapter


class Adapter(V2Adapter):
    release = "0.5.16"
    PLAIN_RESULT_TAKES_READING = True  # V2Adapter._result_reading: checked against 0.5.16's source where it is unpacked
    # 0.5.23's targets, but the radix cache's prompt insertion is still called cache_unfinished_req here
    # and its tree is RadixCache, whose eviction deletes leaves in Python: the guard forgets them there
    TARGETS = tuple(
        ("sglang.srt.mem_cache.radix_cache.RadixCache.cache_unfinished_req", how, hook)
        if hook == "around_tree_cache_keep"
        else ("sglang.srt.mem_cache.radix_cache.RadixCache.insert", how, hook) if hook == "around_tree_insert"
        else (target, how, hook)
        for target, how, hook in Adapter0523.TARGETS) + (
        ("sglang.srt.mem_cache.radix_cache.RadixCache._delete_leaf", "BEFORE", "before_tree_delete_leaf"),)

    def req_namespace(self, req: Any) -> Any:
        return req.extra_key, None  # 0.5.16's RadixKey has no cache_salt of its own

    def key_namespace(self, key: Any) -> Any:
        return key.extra_key, None

    def req_kv_lens(self, req: Any) -> tuple[bool, int, int, int]:
        kv = req.kv
        if kv is None or req.req_pool_idx is None:
            return False, 0, 0, 0
        return True, int(req.kv_committed_len), int(kv.kv_allocated_len), int(req.cache_protected_len)

    def req_row(self, req: Any) -> int | None:
        return req.req_pool_idx

    def tp_rank(self) -> int:
        from sglang.srt.runtime_context import get_parallel

        try:
            return int(get_parallel().tp_rank)
        except (RuntimeError, AttributeError):  # not written in this process
            return 0

    def server_args(self) -> Any:
        from sglang.srt.server_args import get_global_server_args

        try:
            return get_global_server_args()
        except Exception:  # noqa: BLE001 - not published yet: run with what the live objects say
            return None


class Line(v0_5_23.Line):
    """0.5.16 as it differs from 0.5.23 for the switches: the row and the committed length on the Req, `req.kv`
    None without a row; the future map sizes its buffers lazily; retract_all takes server_args; the kept-out chunk's
    end is `extend_range`; the draft's TP context is a per-worker factory over the draft's TP group."""

    version = "0.5.16"
    adapter_class = Adapter
    lint_module = "specflip.lint.sglang_0_5_16"
    future_map_sizes_lazily = True
    retract_all_takes_server_args = True

    def kv_row(self, req: Any) -> tuple[int | None, int, int]:
        kv = req.kv
        if kv is None:
            return None, int(req.kv_committed_len), 0
        return req.req_pool_idx, int(req.kv_committed_len), int(kv.kv_allocated_len)

    def advance_kept_out_chunk(self, scheduler: Any, req: Any) -> int:
        # add_chunked_req's range of the chunk that ran
        return prefix_slots_chunk(scheduler, req, req.extend_range.end if req.extend_range is not None else 0)

    def draft_worker_contexts(self, worker: Any) -> list[Any]:
        import sys

        from shim.releases.base import _moe_contexts

        dw = worker.draft_worker
        mod = sys.modules["sglang.srt.speculative.eagle_worker_v2"]
        return [dw.draft_tp_context(dw.draft_runner.tp_group), *_moe_contexts(mod)]


LINE = Line()
