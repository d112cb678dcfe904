"""Exercise tests/sglang_cpu.py: real sglang 0.5.23 ScheduleBatch / pools on CPU."""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stand_ins" / "cpu"))

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("torch")
    pytest.importorskip("sglang.srt.managers.schedule_batch")

h = importlib.import_module("sglang_cpu")

pytestmark = pytest.mark.sglang

NUM_STEPS, TOPK, NUM_DRAFT = 3, 1, 4
# eagle_prepare_for_decode reserves get_alloc_reserve_per_decode() = 2 * max(steps * topk, draft tokens)
RESERVE = 2 * max(NUM_STEPS * TOPK, NUM_DRAFT)
KV_SIZE = 256


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return h.write_tiny_model_config(tmp_path_factory.mktemp("tiny-model"))


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
