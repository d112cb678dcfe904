"""SPECFLIP_SWITCH_RADIX=keep_out (issue 24, docs/prefix-cache.md), shared by the v2 and v1 switches: while
speculation is off, SGLang's own `req.skip_radix_cache_insert` keeps tokens computed without the draft (no draft KV
at their slots) out of the radix tree; the flip-on retraction gives each request its own flag back.

Opt-in: on the GPU line (H200, 2026-12-01, 17aacf4) the flag leaked KV slots through chunked prefill, whose stash
returns early for a flagged request on the lines that keep a prefix's slots on the Req (`resume_chunk_kept_out` fixes
that on the CPU; not yet rerun on the GPU).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shim.releases.registry import installed_line

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
    resumes after the chunk that ran ("published or not", as the newest line's own `checkpoint_kv_cache` has it).
    Where a line's stash returns early for such a request instead, its next chunk would re-extend from the tree match
    on fresh slots and the slots of the chunks before would be lost to the pool (the H200 leak, docs/prefix-cache.md):
    the release line advances the prefix (shim/releases/, `advance_kept_out_chunk`). Call before
    get_next_batch_to_run stashes (its stash then has nothing new to cache, as for any kept-out chunk). Returns the
    tokens the request's prefix advanced by."""
    req = getattr(scheduler, "chunked_req", None)
    if req is None or not getattr(req, "skip_radix_cache_insert", False):
        return 0
    return installed_line().advance_kept_out_chunk(scheduler, req)
