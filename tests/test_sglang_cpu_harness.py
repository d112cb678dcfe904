"""Exercise tests/sglang_cpu.py: real sglang 0.5.23 ScheduleBatch / pools on CPU."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

h = importlib.import_module("sglang_cpu")

pytestmark = pytest.mark.sglang

NUM_STEPS, TOPK, NUM_DRAFT = 3, 1, 4
# eagle_prepare_for_decode reserves get_alloc_reserve_per_decode() = 2 * max(steps * topk, draft tokens)
RESERVE = 2 * max(NUM_STEPS * TOPK, NUM_DRAFT)
KV_SIZE = 256



@pytest.fixture
def plain(model_dir: Path) -> h.CpuPools:
    return h.build_pools(h.make_server_args(model_dir), kv_size=KV_SIZE)


@pytest.fixture
def eagle(model_dir: Path) -> h.CpuPools:
    sa = h.make_server_args(
        model_dir, speculative_algorithm="EAGLE", num_steps=NUM_STEPS, topk=TOPK, num_draft_tokens=NUM_DRAFT
    )
    return h.build_pools(sa, kv_size=KV_SIZE)


def three_reqs(prefix: str = "r") -> list[Any]:
    return [h.make_req(f"{prefix}{i}", list(range(10 + i, 20 + 2 * i)), max_new_tokens=40) for i in range(3)]


def test_torchvision_is_the_stand_in() -> None:
    import torchvision
    import torchvision.transforms as T

    assert torchvision.IS_SPECFLIP_STAND_IN
    with pytest.raises(torchvision.TorchvisionStandInError):
        T.Compose([])


def test_prefill_then_plain_decode(plain: h.CpuPools) -> None:
    reqs = three_reqs()
    input_lens = [len(r.origin_input_ids) for r in reqs]
    batch = h.prefill(plain, reqs)
    assert batch.forward_mode.is_extend()
    assert batch.seq_lens.tolist() == input_lens
    assert plain.available_size() == KV_SIZE - sum(input_lens)
    assert h.kv_lens(batch) == [(n, n) for n in input_lens]

    for step in range(1, 6):
        before = plain.available_size()
        prev_seq = batch.seq_lens.tolist()
        h.decode_step(batch)
        assert batch.forward_mode.is_decode()
        assert batch.seq_lens.tolist() == [s + 1 for s in prev_seq]
        assert batch.seq_lens_cpu.tolist() == batch.seq_lens.tolist()
        assert plain.available_size() == before - len(reqs)
        assert batch.out_cache_loc.numel() == len(reqs)
        # the new slot is registered at position prev_seq in each request's req_to_token row
        rows = plain.req_to_token_pool.req_to_token
        for i, req in enumerate(batch.reqs):
            assert int(rows[req.kv.req_pool_idx, prev_seq[i]]) == int(batch.out_cache_loc[i])
        assert h.kv_lens(batch) == [(n + step, n + step) for n in input_lens]
    assert [len(r.output_ids) for r in reqs] == [6, 6, 6]


def test_eagle_prepare_for_decode_over_allocates(eagle: h.CpuPools) -> None:
    reqs = three_reqs()
    input_lens = [len(r.origin_input_ids) for r in reqs]
    batch = h.prefill(eagle, reqs)
    assert type(batch.spec_info).__name__ == "EagleDraftInput"
    stale_out_cache_loc = batch.out_cache_loc
    after_prefill = eagle.available_size()

    h.spec_prepare_for_decode(batch)
    assert batch.forward_mode.is_decode()
    # seq_lens and out_cache_loc are left to the worker (verify): unchanged
    assert batch.seq_lens.tolist() == input_lens
    assert batch.out_cache_loc is stale_out_cache_loc
    # KV: kv_allocated_len = kv_committed_len + RESERVE per request, committed unchanged
    assert h.kv_lens(batch) == [(n, n + RESERVE) for n in input_lens]
    assert eagle.available_size() == after_prefill - RESERVE * len(reqs)
    rows = eagle.req_to_token_pool.req_to_token
    for req in batch.reqs:
        assert (rows[req.kv.req_pool_idx, : req.kv.kv_allocated_len] > 0).all()

    # verify: accept lengths (drafts + bonus) advance seq_lens and kv_committed_len only
    h.spec_verify_forward_cpu_stand_in(batch, [1, 2, 4])
    assert batch.seq_lens.tolist() == [input_lens[0] + 1, input_lens[1] + 2, input_lens[2] + 4]
    assert [c for c, _ in h.kv_lens(batch)] == batch.seq_lens.tolist()
    assert eagle.available_size() == after_prefill - RESERVE * len(reqs)
    assert type(batch.spec_info).__name__ == "EagleDraftInput"

    # next prepare tops each request up to committed + RESERVE (only the shortfall is allocated)
    before = eagle.available_size()
    h.spec_prepare_for_decode(batch)
    assert h.kv_lens(batch) == [(s, s + RESERVE) for s in batch.seq_lens.tolist()]
    assert eagle.available_size() == before - (1 + 2 + 4)


def test_eagle_verify_input_fields(eagle: h.CpuPools) -> None:
    batch = h.prefill(eagle, three_reqs())
    h.spec_prepare_for_decode(batch)
    vi = h.make_eagle_verify_input(batch, num_steps=NUM_STEPS, topk=TOPK, num_draft_tokens=NUM_DRAFT)
    assert vi.is_verify_input()
    assert vi.draft_token.shape == (3 * NUM_DRAFT,)
    assert vi.retrieve_index.shape == (3, NUM_DRAFT)
    assert vi.num_tokens_per_req == NUM_DRAFT
    assert vi.max_tree_depth == NUM_STEPS + 1


def test_filter_batch_after_finish_frees_kv(plain: h.CpuPools, eagle: h.CpuPools) -> None:
    batch = h.prefill(plain, three_reqs())
    h.decode_step(batch)
    before = plain.available_size()
    gone = batch.reqs[1]
    held = gone.kv.kv_allocated_len
    h.finish_req(gone)
    released = h.release_finished_cpu_stand_in(plain, batch)
    assert released == [gone]
    assert [r.rid for r in batch.reqs] == ["r0", "r2"]
    assert batch.seq_lens.shape == (2,)
    assert plain.available_size() == before + held
    assert gone.kv.kv_allocated_len == 0 and not gone.kv.holds_kv

    # EAGLE: release frees the over-allocation too; spec_info is filtered along
    batch = h.prefill(eagle, three_reqs())
    h.spec_decode_step(batch, [2, 3, 1])
    before = eagle.available_size()
    gone = batch.reqs[0]
    held = gone.kv.kv_allocated_len
    assert held > gone.kv.kv_committed_len
    h.finish_req(gone)
    h.release_finished_cpu_stand_in(eagle, batch)
    assert eagle.available_size() == before + held
    assert batch.spec_info.topk_p.shape[0] == 2
    assert batch.spec_info.bonus_tokens.shape == (2,)
    h.spec_decode_step(batch, [1, 1])


def test_merge_batch(plain: h.CpuPools, eagle: h.CpuPools) -> None:
    a = h.prefill(plain, three_reqs("a"))
    h.decode_step(a)
    b = h.prefill(plain, [h.make_req("b0", [5, 6, 7, 8], max_new_tokens=10)])
    b.prepare_for_decode()  # a new prefill batch joins running as a decode batch
    h.plain_decode_forward_cpu_stand_in(b)
    seq = a.seq_lens.tolist() + b.seq_lens.tolist()
    h.merge_batches(a, b)
    assert [r.rid for r in a.reqs] == ["a0", "a1", "a2", "b0"]
    assert a.seq_lens.tolist() == seq
    assert a.out_cache_loc is None
    before = plain.available_size()
    h.decode_step(a)
    assert plain.available_size() == before - 4

    ea = h.prefill(eagle, three_reqs("a"))
    eb = h.prefill(eagle, [h.make_req("b0", [5, 6, 7, 8], max_new_tokens=10)])
    h.merge_batches(ea, eb)
    assert ea.spec_info.topk_index.shape[0] == 4
    assert ea.spec_info.hidden_states.shape == (4, h.HIDDEN_SIZE)
    h.spec_decode_step(ea, [1, 2, 3, 4])
    assert [c for c, _ in h.kv_lens(ea)] == ea.seq_lens.tolist()


# --- the radix cache, free groups, chunked prefill (what a live scheduler does around the batch) -------------

SHARED = list(range(100, 124))  # a prompt prefix the requests share (a system prompt)


def eagle_pools(model_dir: Path, *, radix_cache: bool) -> h.CpuPools:
    sa = h.make_server_args(
        model_dir, speculative_algorithm="EAGLE", num_steps=NUM_STEPS, topk=TOPK, num_draft_tokens=NUM_DRAFT
    )
    return h.build_pools(sa, kv_size=KV_SIZE, radix_cache=radix_cache)


def own_slots(reqs: list[Any]) -> int:
    """Slots the requests hold themselves: [cache_protected_len, kv_allocated_len) of each row."""
    return sum(r.kv.kv_allocated_len - r.kv.cache_protected_len for r in reqs if r.kv.holds_kv)


def accounted(pools: h.CpuPools, reqs: list[Any]) -> int:
    from shim.releases.guard_reading import pending_free_slots

    return pools.available_size() + pending_free_slots(pools.allocator) + h.tree_held(pools) + own_slots(reqs)


@pytest.mark.parametrize("radix", [False, True], ids=["radix_off", "radix_on"])
def test_the_tree_is_the_one_a_0_5_23_server_builds(model_dir: Path, radix: bool) -> None:
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    pools = eagle_pools(model_dir, radix_cache=radix)
    assert type(pools.tree_cache) is UnifiedRadixCache
    assert pools.tree_cache.disable is not radix and pools.tree_cache.tree_core.is_eagle
    assert pools.server_args.disable_radix_cache is not radix


def test_radix_cache_prefix_hits_and_the_tree_takes_the_prompt(model_dir: Path) -> None:
    pools = eagle_pools(model_dir, radix_cache=True)
    first = [h.make_req(f"a{i}", SHARED + list(range(10 + i, 20 + i)), max_new_tokens=8) for i in range(2)]
    batch = h.prefill(pools, first)
    # each prompt went into the tree (EAGLE keys token pairs: n tokens, n - 1 keys), the row points at it
    assert [r.kv.cache_protected_len for r in first] == [len(r.origin_input_ids) - 1 for r in first]
    assert pools.tree_cache.protected_size() == 2 * (len(first[0].origin_input_ids) - 1) - (len(SHARED) - 1)
    assert accounted(pools, first) == KV_SIZE

    late = h.make_req("b", SHARED + [7, 7, 7], max_new_tokens=8)
    late_batch, _ = h.schedule_prefill(pools, [late])
    assert late.num_matched_prefix_tokens == len(SHARED) - 1 and late.kv.cache_protected_len == len(SHARED) - 1
    assert late_batch.extend_num_tokens == late_batch.out_cache_loc.numel() == len(late.origin_input_ids) - 23
    assert accounted(pools, [*first, late]) == KV_SIZE
    h.prefill_forward_cpu_stand_in(late_batch)
    h.merge_batches(batch, late_batch)
    h.spec_decode_step(batch, [4, 4, 4])
    assert accounted(pools, batch.reqs) == KV_SIZE
    for req in batch.reqs:
        h.finish_req(req)
    h.release_finished_cpu_stand_in(pools, batch)
    # every slot is back: free, or the tree's (what it keeps of the finished requests, all evictable now)
    assert not batch.reqs and pools.available_size() + pools.tree_cache.evictable_size() == KV_SIZE
    assert pools.tree_cache.protected_size() == 0


@pytest.mark.parametrize("radix", [False, True], ids=["radix_off", "radix_on"])
def test_a_release_inside_a_free_group_is_queued(model_dir: Path, radix: bool) -> None:
    from sglang.srt.mem_cache.common import release_kv_cache

    from shim.releases.guard_reading import pending_free_slots

    pools = eagle_pools(model_dir, radix_cache=radix)
    reqs = [h.make_req(f"g{i}", SHARED + [i, i + 1], max_new_tokens=8) for i in range(2)]
    batch = h.prefill(pools, reqs)
    h.spec_decode_step(batch, [3, 2])
    gone = batch.reqs[0]
    h.finish_req(gone)
    available = pools.available_size()
    pools.allocator.free_group_begin()
    release_kv_cache(gone, pools.tree_cache, checkpoint=True)
    queued = pending_free_slots(pools.allocator)
    # the frees wait for the group's end; with the tree on, the finished request's KV went into the tree but
    # the last token's slot (no pair key for it) and the speculative reserve are freed
    assert pools.available_size() == available and queued > 0
    assert accounted(pools, [batch.reqs[1]]) == KV_SIZE
    pools.allocator.free_group_end()
    assert pools.available_size() == available + queued and pending_free_slots(pools.allocator) == 0


def test_the_queued_count_follows_a_group_of_releases(model_dir: Path) -> None:
    """pending_free_slots reads only the frees queued since its last look on the same group: after each release of a
    group it is the queue summed afresh, and the next group (a new list) starts from nothing."""
    from sglang.srt.mem_cache.common import release_kv_cache

    from shim.releases.guard_reading import pending_free_slots

    pools = eagle_pools(model_dir, radix_cache=False)
    reqs = [h.make_req(f"q{i}", SHARED + [i, i + 1], max_new_tokens=8) for i in range(4)]
    batch = h.prefill(pools, reqs)
    h.spec_decode_step(batch, [3, 2, 1, 2])
    allocator = pools.allocator
    for group in (batch.reqs[:3], batch.reqs[3:]):
        allocator.free_group_begin()
        assert pending_free_slots(allocator) == 0
        for req in group:
            h.finish_req(req)
            release_kv_cache(req, pools.tree_cache, checkpoint=True)
            assert pending_free_slots(allocator) == sum(int(t.numel()) for t in allocator.free_group) > 0
        allocator.free_group_end()
        assert pending_free_slots(allocator) == 0


@pytest.mark.parametrize("radix", [False, True], ids=["radix_off", "radix_on"])
def test_chunked_prefill_follows_the_scheduler(model_dir: Path, radix: bool) -> None:
    pools = eagle_pools(model_dir, radix_cache=radix)
    long = h.make_req("long", SHARED + list(range(30)), max_new_tokens=8)  # 54 tokens: chunks of 16
    short = h.make_req("short", [5, 6, 7], max_new_tokens=8)
    waiting, chunked, rounds, prefilled = [long, short], None, 0, []
    while waiting or chunked is not None:
        batch, chunked = h.schedule_prefill(pools, waiting, chunked_req=chunked, chunk_size=16)
        rounds += 1
        assert batch.extend_num_tokens <= 16
        # the scheduler counts a chunk in flight before prepare_for_extend; the result processing counts it down
        assert long.inflight_middle_chunks == (1 if chunked is long else 0)
        h.prefill_forward_cpu_stand_in(batch)
        assert long.inflight_middle_chunks == 0
        assert len(long.output_ids) == (0 if chunked is long else 1)  # no token until the last chunk
        h.next_round_after_prefill(batch, chunked)
        assert chunked not in batch.reqs
        prefilled += batch.reqs
        assert accounted(pools, [long, short]) == KV_SIZE
    assert rounds == 4 and [r.rid for r in prefilled] == ["long", "short"]
    assert long.kv.kv_committed_len == len(long.origin_input_ids) and len(short.output_ids) == 1
    if radix:  # each stashed chunk went into the tree
        assert long.kv.cache_protected_len == len(long.origin_input_ids) - 1
