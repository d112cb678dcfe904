"""SPECFLIP_SWITCH_RADIX=keep_out (issue 24, docs/prefix-cache.md), shared by the v2 and v1 switches: while
speculation is off, SGLang's own `req.skip_radix_cache_insert` keeps tokens computed without the draft (no draft KV
at their slots) out of the radix tree; the flip-on retraction gives each request its own flag back.

Opt-in: on 0.5.16 (H200, session 8) the flag leaked KV slots through chunked prefill, whose stash returns early for a
flagged request (`resume_chunk_kept_out` fixes that on the CPU; not yet rerun on the GPU).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# a request's own skip_radix_cache_insert before the switch kept its while-off tokens out of the radix tree
SKIP_INSERT_WAS = "specflip_skip_radix_cache_insert_was"


def keep_out_of_tree(reqs: Iterable[Any]) -> None:
    """A forward without the draft writes no draft KV at its slots, so the tree must not cache them (a later hit
    would draft over garbage): SGLang's own flag, which the release and the stash read, keeps them out."""
    for req in reqs:
        req.__dict__.setdefault(SKIP_INSERT_WAS, getattr(req, "skip_radix_cache_insert", False))
        req.skip_radix_cache_insert = True


def give_back_flags(reqs: Iterable[Any]) -> None:
    """Flip-on: the retracted requests are prefilled again with the draft, so the tree may cache them again."""
    for req in reqs:
        if SKIP_INSERT_WAS in req.__dict__:
            req.skip_radix_cache_insert = req.__dict__.pop(SKIP_INSERT_WAS)


def resume_chunk_kept_out(scheduler: Any) -> int:
    """SPECFLIP_SWITCH_RADIX=keep_out: the request being chunked, barred from the tree (skip_radix_cache_insert),
    resumes after the chunk that ran, as 0.5.23's `checkpoint_kv_cache` has it ("published or not"). 0.5.16's and
    0.5.12's stash (`maybe_cache_unfinished_req`) returns early for such a request and leaves `prefix_indices` at
    the tree match: its next chunk re-extends from there on fresh slots, and the slots of the chunks before,
    overwritten in its req_to_token row, are lost to the pool (the H200 leak, docs/prefix-cache.md). Call before
    get_next_batch_to_run stashes (its stash then has nothing new to cache, as for any kept-out chunk). Returns the
    tokens the request's prefix advanced by."""
    req = getattr(scheduler, "chunked_req", None)
    if req is None or not getattr(req, "skip_radix_cache_insert", False):
        return 0
    if hasattr(req, "prefix_indices"):  # 0.5.16, 0.5.12: the prefix is the slots themselves, the row on the Req
        if req.req_pool_idx is None:
            return 0
        if hasattr(req, "extend_range"):  # 0.5.16: add_chunked_req's range of the chunk that ran
            end = req.extend_range.end if req.extend_range is not None else 0
        else:  # 0.5.12: add_chunked_req cut fill_ids at the chunk's end (init_next_round_input restores them)
            end = len(req.fill_ids)
        start = len(req.prefix_indices)
        if end > start:
            # what cache_unfinished_req leaves there for the part it does not cache: the request's own row
            row = scheduler.req_to_token_pool.req_to_token[req.req_pool_idx, :end]
            req.prefix_indices = row.to(dtype=req.prefix_indices.dtype, copy=True)
        return max(0, end - start)
    start, end = req.prefix_len, req.extend_end  # 0.5.23 (whose own stash advances it too)
    if end > start:
        req.prefix_len = end
    return max(0, end - start)
