"""shim/switch/radix_keep_out.py's `resume_chunk_kept_out` on REAL sglang 0.5.12 objects (.venv12; skipped elsewhere):
the `prefix_indices` line of SGLang (0.5.12, 0.5.16), whose stash of a chunked request
(`Scheduler.stash_chunked_request` -> `maybe_cache_unfinished_req`) returns at once for a request with
`skip_radix_cache_insert` and leaves its prefix at the tree match. The next chunk (`init_next_round_input()`,
`PrefillAdder.add_chunked_req`, `prepare_for_extend`) then re-extends from there on fresh slots, and the earlier
chunk's slots, overwritten in the request's row, leak: the keep_out leak of docs/prefix-cache.md. Harness:
tests/sglang12_cpu.py."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pytest

try:
    _RELEASE = version("sglang")
except PackageNotFoundError:
    _RELEASE = None

pytestmark = [pytest.mark.sglang_v1,
              pytest.mark.skipif(_RELEASE != "0.5.12", reason="needs sglang 0.5.12 (.venv12: scripts/setup-v1.sh)")]

if _RELEASE == "0.5.12":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import sglang12_cpu as h

from shim.switch.radix_keep_out import resume_chunk_kept_out  # noqa: E402

CHUNK = 16


def _chunk(pools: Any, scheduler: Any, req: Any, *, first: bool) -> Any:
    """get_new_batch_prefill with a 16-token chunk budget: the real PrefillAdder (`add_one_req` for a new request,
    `add_chunked_req` after `init_next_round_input()` for the one being chunked), `ScheduleBatch.init_new` and
    `prepare_for_extend`. Returns the request still being chunked, or None."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.schedule_policy import PrefillAdder

    empty = ScheduleBatch(reqs=[], batch_is_full=False)
    adder = PrefillAdder(1, pools.tree_cache, pools.allocator, empty, 0.4, rem_input_tokens=4096,
                         rem_chunk_tokens=CHUNK)
    if first:
        req.init_next_round_input(pools.tree_cache)
        adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
        chunked = adder.new_chunked_req
    else:
        req.init_next_round_input()
        chunked = adder.add_chunked_req(req)
    batch = ScheduleBatch.init_new(adder.can_run_list, pools.req_to_token_pool, pools.allocator, pools.tree_cache,
                                   pools.model_config, enable_overlap=False, spec_algorithm=pools.spec_algorithm,
                                   chunked_req=chunked)
    batch.prepare_for_extend()
    scheduler.chunked_req = chunked
    return chunked


def _chunked_prefill(pools: Any, req: Any, *, fix: bool) -> tuple[int, int, Any]:
    """`req` prefilled in 16-token chunks, at most three rounds after the first (get_next_batch_to_run: the switch's
    resume_chunk_kept_out with `fix`, the real stash, the next chunk). Returns (rounds, tokens advanced, the request
    still being chunked or None)."""
    from sglang.srt.managers.scheduler import Scheduler

    scheduler = h.make_scheduler(pools)
    scheduler.req_to_token_pool = pools.req_to_token_pool
    chunked, rounds, advanced = _chunk(pools, scheduler, req, first=True), 0, 0
    while chunked is not None and rounds < 3:
        rounds += 1
        if fix:
            advanced += resume_chunk_kept_out(scheduler)
        Scheduler.stash_chunked_request(scheduler, chunked)
        chunked = _chunk(pools, scheduler, chunked, first=False)
    return rounds, advanced, chunked


@pytest.mark.parametrize("fix", [True, False], ids=["resume_chunk_kept_out", "without_fix"])
def test_a_kept_out_chunked_prefill_leaks_no_slot(fix: bool) -> None:
    """Alone, the slots are counted; after tests/test_v1_switch.py in one process, the guard it installed (assert
    mode, the 0.5.12 adapter) watches the same steps and stops the re-extend without the fix."""
    from sglang.srt.mem_cache.common import release_kv_cache

    import shim.guard.runtime
    from shim.guard.core import SpecFlipViolation

    guard = shim.guard.runtime.current()
    if guard is not None:
        guard.reset()  # a fresh Guard for these pools
    pools = h.build_pools(h.make_server_args(h.write_tiny_model_config()), kv_size=256, max_reqs=8, radix_cache=True)
    req = h.make_req("r", list(range(10, 50)), max_new_tokens=4)  # 40 tokens: three chunks
    req.skip_radix_cache_insert = True  # the switch's keep-out, on a request prefilled while off
    if guard is not None and not fix:
        with pytest.raises(SpecFlipViolation) as caught:
            _chunked_prefill(pools, req, fix=fix)
        guard.reset()
        assert caught.value.invariant == "kv_conservation" and "16 slots leaked" in str(caught.value)
        return
    rounds, advanced, chunked = _chunked_prefill(pools, req, fix=fix)
    # the request leaves (a retraction, or a finish with the flag: nothing inserted either way)
    release_kv_cache(req, pools.tree_cache, is_insert=False)
    tree = pools.tree_cache
    assert tree.evictable_size() + tree.protected_size() == 0  # kept out: the tree holds none of its slots
    leaked = pools.allocator.size - pools.allocator.available_size()
    if fix:
        assert (rounds, advanced, chunked, leaked) == (2, 2 * CHUNK, None, 0)
    else:  # the same first chunk again each round, each one's slots lost
        assert chunked is not None and leaked == rounds * CHUNK
