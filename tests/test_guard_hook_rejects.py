"""Every hook the guard judges at rejects an illegal step AT THAT HOOK (issue 51).

The guard's other tests count hooks that fired; with the step check of `prepare_for_decode` returning nothing, all of
them still passed (a double prepare went unreported). Here each hook the 0.5.23 adapter installs is fed one illegal
step on real SGLang objects (tests/guard_fixtures.py): a step from a stage the model never runs it from
(`legal_transition`), or one that breaks a model or identity invariant. The test performs, inside `pytest.raises`, only
the one SGLang call that runs the hook, and asserts that the guard's finding is raised from that hook's adapter method
(its frame is on the traceback) with the invariant and the model action expected. So a hook whose check is removed
fails here: nothing is raised in that call, or the finding comes from another hook.

`test_every_hook_is_judged_here_or_said_why_not` holds the list to the adapter's TARGETS: a new hook needs a case
here, or a line in NOT_JUDGED saying why it judges nothing of its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")
slot_values = importlib.import_module("test_guard_slot_values")  # its tree of leaves and eviction

import shim.guard.api  # noqa: E402
from shim.guard.core import SpecFlipViolation  # noqa: E402
from statemodel.designs import ADAPTIVE_WARM, CATCH_UP  # noqa: E402

pytestmark = pytest.mark.sglang

Trigger = Callable[[], Any]


@dataclass(frozen=True)
class Case:
    """`setup(runtime, model_dir, monkeypatch)` runs the steps before the illegal one (clean) and returns the one call
    that runs it. The finding must come from adapter method `judged_at` (default: the hook itself)."""

    hook: str  # the adapter method SGLang's HookRegistry calls (TARGETS' third column), or "on_flip"
    setup: Callable[[Any, Path, pytest.MonkeyPatch], Trigger]
    invariant: str
    action: str
    judged_at: str | None = None
    seen_at: str | None = None  # a re-observation's finding names where it was seen


def _driver(runtime: Any, model_dir: Path, design: Any = CATCH_UP, *, radix: bool = False, n: int = 2,
            max_new_tokens: int = 40) -> Any:
    gf.configure_guard(runtime, design)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), design)
    drv.admit(gf.make_reqs("r", n, max_new_tokens=max_new_tokens, shared_prefix=gf.SYSTEM_PROMPT))
    return drv


def _prepare(drv: Any) -> None:
    with h.patch_assign_req_to_token_pool():
        drv.batch.prepare_for_decode()


# --- the illegal steps, one per hook ------------------------------------------------------------------------------


def prefill_while_prepared(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """A prefill between prepare_for_decode and the decode forward: the model prefills only at SCHEDULE."""
    drv = _driver(runtime, model_dir)
    drv.decode()
    _prepare(drv)
    late = gf.make_reqs("late", 1, shared_prefix=gf.SYSTEM_PROMPT)
    return lambda: drv.prefill(late)


def prepare_twice(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """prepare_for_decode twice for one step (issue 51's mutation: this went unreported)."""
    drv = _driver(runtime, model_dir)
    drv.decode()
    _prepare(drv)
    return lambda: _prepare(drv)


def merge_while_prepared(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """A prefilled batch merged after prepare_for_decode: the model merges only at SCHEDULE."""
    drv = _driver(runtime, model_dir)
    drv.decode()
    late = drv.prefill(gf.make_reqs("late", 1, shared_prefix=gf.SYSTEM_PROMPT))
    late.forward_mode = late.forward_mode.DECODE
    _prepare(drv)
    return lambda: drv.batch.merge_batch(late)


def filter_while_prepared(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """A request leaves the running batch after prepare_for_decode (its slot allocated for the step)."""
    drv = _driver(runtime, model_dir, n=3)
    drv.flip_off()
    drv.decode()
    _prepare(drv)
    return lambda: drv.batch.filter_batch(keep_indices=[0, 1])


def retract_while_prepared(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """A running request released (a retraction) between prepare_for_decode and its forward."""
    from sglang.srt.mem_cache.common import release_kv_cache

    drv = _driver(runtime, model_dir)
    drv.decode()
    _prepare(drv)
    req = drv.batch.reqs[0]
    return lambda: release_kv_cache(req, drv.batch.tree_cache, checkpoint=False)


def free_foreign_slots_in_release(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """A finishing request's release also frees slots of another running request's row (the allocator's free hook
    records the row positions; the release that frees them is judged with them)."""
    from sglang.srt.mem_cache.common import release_kv_cache

    drv = _driver(runtime, model_dir, max_new_tokens=40)
    drv.decode()
    drv.finish_and_filter()
    done, other = drv.batch.reqs
    done.finished_reason = _finished()
    pool = drv.pools.req_to_token_pool
    allocator = drv.pools.allocator
    original_free = pool.free

    def free_row_and_a_foreign_slot(req: Any, *args: Any, **kwargs: Any) -> Any:
        if req is done:
            allocator.free(pool.req_to_token[other.kv.req_pool_idx, 0:2])  # a view of the other request's row
        return original_free(req, *args, **kwargs)

    mp.setattr(pool, "free", free_row_and_a_foreign_slot)
    return lambda: release_kv_cache(done, drv.batch.tree_cache, checkpoint=False)


def alloc_a_live_slot(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """Another request's live slot is put on the free list behind free()'s back; an alloc hands it out (slot identity
    by value: shim/guard/slot_values.py)."""
    import torch

    drv = _driver(runtime, model_dir)
    drv.decode()
    drv.finish_and_filter()
    other = drv.batch.reqs[1]
    allocator = drv.pools.allocator
    live = drv.pools.req_to_token_pool.req_to_token[other.kv.req_pool_idx, 0:2].to(torch.int64)
    allocator.free_pages = torch.cat((live, allocator.free_pages))
    return lambda: allocator.alloc(2)


def stop_at_a_freed_copy(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """SPECFLIP_GUARD_SLOT_VALUES=assert: a copy of another request's committed slots is freed; the check's device
    assert raises (on the CPU at once; on a GPU at the process's next CUDA call), and the hook around the scheduler's
    event loop raises the finding read from the answer the check copied out (shim/guard/slot_values.py)."""
    mp.setattr(runtime, "slot_values", "assert")
    drv = _driver(runtime, model_dir)
    drv.decode()
    drv.finish_and_filter()
    other = drv.batch.reqs[1]
    copy = drv.pools.req_to_token_pool.req_to_token[other.kv.req_pool_idx, 0:2].clone()
    return lambda: runtime.adapter.around_event_loop(lambda _scheduler: drv.pools.allocator.free(copy), None)


def free_a_live_copy_in_the_trees_eviction(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """The radix tree evicts short leaves (one free per leaf, held by the guard), and inside the eviction a copy of
    another running request's committed slots is freed too: judged by the one scan when the eviction returns."""
    drv = slot_values.tree_of_leaves(runtime, model_dir, leaves=4)
    other = drv.batch.reqs[1]
    copy = drv.pools.req_to_token_pool.req_to_token[other.kv.req_pool_idx, 0:2].clone()
    slot_values.count_frees(drv.pools.allocator, mp, also_free=copy)
    return slot_values.evict_all(drv)


def _finished() -> Any:
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    return FINISH_LENGTH(length=1)


def leak_before_tree_checkpoint(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """Slots leak (allocated, owned by nobody) and then the tree takes a running request's tokens: the checkpoint's
    re-reading of the pool is the guard's first look at it."""
    from sglang.srt.mem_cache.common import checkpoint_kv_cache

    drv = _driver(runtime, model_dir, radix=True)
    drv.decode()
    drv.finish_and_filter()
    drv.pools.allocator.alloc(3)  # the leak
    req = drv.batch.reqs[0]
    return lambda: checkpoint_kv_cache(req, drv.batch.tree_cache)


def plain_forward_unprepared(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """A plain DECODE forward launched again without prepare_for_decode (no slot for its tokens)."""
    drv = _driver(runtime, model_dir)
    drv.flip_off()
    drv.decode()
    target = drv.worker.target_worker
    return lambda: target.forward_batch_generation(drv.batch)


def draft_unprepared(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """The speculative worker runs a second round on the batch without prepare_for_decode (no reserve topped up)."""
    drv = _driver(runtime, model_dir)
    drv.decode()
    return lambda: drv.worker.forward_batch_generation(drv.batch)


def trivial_verify_unprepared(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """As draft_unprepared, at steps 0 (the adaptive worker's trivial one-token verify)."""
    drv = _driver(runtime, model_dir, ADAPTIVE_WARM)
    gf.set_steps(drv.worker, 0)
    drv.decode(accepts=[1, 1])
    return lambda: drv.worker.forward_batch_generation(drv.batch)


def verify_wider_than_drafted(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """The draft builds a verify input wider than twice its steps + 1 per request: the verify writes past the
    reserve prepare_for_decode topped up (the draft hook saw a legal draft; the verify launch is where it shows)."""
    drv = _driver(runtime, model_dir)
    drv.decode()
    _prepare(drv)
    build = h.make_eagle_verify_input

    def wider(batch: Any, *, num_steps: int, topk: int, num_draft_tokens: int) -> Any:
        return build(batch, num_steps=num_steps, topk=topk, num_draft_tokens=2 * num_draft_tokens + 1)

    mp.setattr(h, "make_eagle_verify_input", wider)
    drv.worker.accept_lens_cpu_stand_in = [1, 1]
    return lambda: drv.worker.forward_batch_generation(drv.batch)


def catch_up_while_prepared(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """A draft-extend outside a round (the flip's catch-up) after prepare_for_decode: the model catches up only at
    SCHEDULE."""
    drv = _driver(runtime, model_dir)
    drv.decode()
    drv.finish_and_filter()
    _prepare(drv)
    return drv.draft_extend_outside_round


def skipped_extend_then_draft(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND at steps 0 under a design that keeps the draft-extend: the stub's hook
    records the skip in the round, and the next draft, at steps 2, starts on a stale draft KV."""
    from sglang.srt.environ import envs

    mp.setenv(envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.name, "1")
    drv = _driver(runtime, model_dir, ADAPTIVE_WARM)
    gf.set_steps(drv.worker, 0)
    drv.decode(accepts=[1, 1])
    gf.set_steps(drv.worker, 2)
    _prepare(drv)
    return lambda: drv.worker.forward_batch_generation(drv.batch)


def group_finish_leaks(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """Two requests finish in one result's free group and their draft reserve is never freed (draft_kv_never_freed):
    the group's finishes are judged as one step at the group's end."""
    from sglang.srt.mem_cache import common

    drv = _driver(runtime, model_dir, ADAPTIVE_WARM, max_new_tokens=4)
    mp.setattr(common, "_release_overallocated_kv_indices", lambda *a, **k: None)  # the leak
    _prepare(drv)
    drv.worker.accept_lens_cpu_stand_in = [4, 4]
    result = drv.worker.forward_batch_generation(drv.batch)
    return lambda: gf.settle_spec_result_cpu_stand_in(drv.batch, result)


def flip_on_while_on(runtime: Any, model_dir: Path, mp: pytest.MonkeyPatch) -> Trigger:
    """The switch announces flip-on while speculation is on already."""
    drv = _driver(runtime, model_dir)
    drv.decode()
    drv.finish_and_filter()
    return lambda: shim.guard.api.notify_flip(True, drv.batch)


CASES = [
    Case("around_prepare_for_extend", prefill_while_prepared, "legal_transition", "arrive",
         judged_at="after_prepare_for_extend"),
    Case("after_prepare_for_decode", prepare_twice, "legal_transition", "prepare_for_decode"),
    Case("around_merge_batch", merge_while_prepared, "legal_transition", "merge_batch"),
    Case("around_filter_batch", filter_while_prepared, "legal_transition", "filter_batch"),
    Case("around_release_kv_cache", retract_while_prepared, "legal_transition", "retract"),
    Case("before_allocator_free", free_foreign_slots_in_release, "slots_freed_owned", "finish",
         judged_at="around_release_kv_cache"),
    # a re-observation, not a model step: reported against the last step, "seen at" the tree
    Case("around_tree_cache_keep", leak_before_tree_checkpoint, "kv_conservation", "draft_extend",
         seen_at="seen at: UnifiedRadixCache (prompt into the tree)"),
    Case("before_target_forward", plain_forward_unprepared, "legal_transition", "plain_decode"),
    Case("before_draft", draft_unprepared, "legal_transition", "draft"),
    Case("before_trivial_verify_input", trivial_verify_unprepared, "legal_transition", "draft"),
    # the positions it writes past the row's allocation (identity), and past the model's reserve
    Case("before_verify", verify_wider_than_drafted, "writes_within_allocation", "draft",
         seen_at="seen at: EAGLEWorkerV2.verify (TARGET_VERIFY launch)"),
    Case("before_draft_extend_for_decode", catch_up_while_prepared, "legal_transition", "draft_catch_up"),
    Case("before_stub_skipped_draft_extend", skipped_extend_then_draft, "draft_kv_covers_prefix", "draft",
         judged_at="before_draft"),
    Case("after_allocator_alloc", alloc_a_live_slot, "slots_allocated_free", "alloc"),
    Case("around_tree_evict", free_a_live_copy_in_the_trees_eviction, "slots_freed_owned", "free",
         seen_at="in the tree's eviction"),
    Case("around_event_loop", stop_at_a_freed_copy, "slots_freed_owned", "free"),
    Case("before_free_group_end", group_finish_leaks, "kv_conservation", "finish"),
    Case("after_free_group_begin", group_finish_leaks, "kv_conservation", "finish",
         judged_at="before_free_group_end"),
    Case("on_flip", flip_on_while_on, "legal_transition", "flip_on"),
]

# adapter hooks (0.5.23 TARGETS) that judge nothing of their own in the normal loop, one process, and why
NOT_JUDGED = {
    "around_tree_insert": "records the positions an insert creates (shim/guard/tree_draft.py); judged at the next "
                          "draft (tests/test_guard_tree_draft.py), a record h51fix changes",
    "after_apply_runtime_state": "a note in the history (the adaptive controller's step switch)",
    "after_normalize_decode_outputs": "the overlap schedule's process_result; a no-op in the normal loop "
                                      "(tests/test_guard_overlap.py drives the overlap loop)",
    "after_get_next_batch_to_run": "the TP > 1 rank agreement check (tests/test_rank_check.py, gloo processes)",
    "before_init_model_worker": "judges the server's settings at start-up, not a step: whether the guard checks this "
                                "configuration (tests/test_guard_start_up.py: assert mode stops, warn mode serves on)",
    "after_check_server_args": "judges the server's settings in SGLang's launching process, not a step: assert mode on "
                               "a configuration the guard does not check stops the launch before any scheduler "
                               "process starts (tests/test_guard_start_up.py)",
}


def test_every_hook_is_judged_here_or_said_why_not(runtime: Any) -> None:
    hooks = {method for _, _, method in runtime.adapter.TARGETS}
    judged = {c.hook for c in CASES}
    assert hooks == (judged - {"on_flip"}) | set(NOT_JUDGED), hooks ^ ((judged - {"on_flip"}) | set(NOT_JUDGED))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.hook)
def test_an_illegal_step_is_rejected_at_its_hook(runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                 case: Case) -> None:
    trigger = case.setup(runtime, model_dir, monkeypatch)  # clean: raises nothing
    with pytest.raises(SpecFlipViolation) as excinfo:
        trigger()
    exc = excinfo.value
    frames = {entry.name for entry in excinfo.traceback}
    assert (case.judged_at or case.hook) in frames, (sorted(frames), str(exc))
    assert (exc.invariant, exc.action) == (case.invariant, case.action), str(exc)
    assert case.seen_at is None or case.seen_at in str(exc), str(exc)
