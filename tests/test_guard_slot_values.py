"""Slot identity by value (issue 51): a slot freed or handed out again while another live request's row holds it, when
what is freed is no view of a row (shim/guard/slot_values.py), on real SGLang 0.5.23 objects (tests/guard_fixtures.py).

Each fault is injected into the real allocator and caught at the allocator hook that frees or allocates it, before the
next forward: the finding's invariant, its action, and the hook's frame on the traceback are asserted. A clean run
with the check on finds nothing and the check did run (its count of checks grew)."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

import torch  # noqa: E402

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")

from shim.guard.core import SpecFlipViolation  # noqa: E402
from statemodel.designs import CATCH_UP  # noqa: E402

pytestmark = pytest.mark.sglang


@pytest.fixture
def slot_mode(runtime: Any) -> Iterator[Callable[[str], None]]:
    """Set SPECFLIP_GUARD_SLOT_VALUES's value on the runtime (the Guard built next reads it); restored after."""
    before = runtime.slot_values

    def set_mode(mode: str) -> None:
        runtime.slot_values = mode
        runtime.reset()
    yield set_mode
    runtime.slot_values = before
    runtime.reset()


def _driver(runtime: Any, model_dir: Path, *, radix: bool = False, n: int = 2) -> Any:
    gf.configure_guard(runtime, CATCH_UP)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), CATCH_UP)
    drv.admit(gf.make_reqs("r", n, max_new_tokens=40, shared_prefix=gf.SYSTEM_PROMPT))
    drv.decode()
    drv.finish_and_filter()
    return drv


def _own_slots(drv: Any, req: Any) -> Any:
    """A view of the last two positions of `req`'s committed KV (its own, not the tree's)."""
    end = req.kv.kv_committed_len
    return drv.pools.req_to_token_pool.req_to_token[req.kv.req_pool_idx, end - 2:end]


def _reserve_slots(drv: Any, req: Any) -> Any:
    """A view of the last two positions of `req`'s speculative reserve [kv_committed_len, kv_allocated_len)."""
    end = req.kv.kv_allocated_len
    assert end - 2 >= req.kv.kv_committed_len, "the reserve holds two slots at least"
    return drv.pools.req_to_token_pool.req_to_token[req.kv.req_pool_idx, end - 2:end]


def _copies() -> dict[str, Callable[[Any], Any]]:
    """What a switch might free instead of a row view: each a new tensor holding the row's slot values."""
    return {
        "clone": lambda view: view.clone(),
        "index_select": lambda view: torch.index_select(view._base[view.storage_offset() // view._base.stride(0)], 0,
                                                        torch.arange(view.storage_offset() % view._base.stride(0),
                                                                     view.storage_offset() % view._base.stride(0)
                                                                     + view.numel())),
        "arithmetic": lambda view: torch.arange(2, dtype=torch.int64) + int(view[0]),  # values recomputed
    }


def _release_also_frees(drv: Any, mp: pytest.MonkeyPatch, copy: Any) -> Callable[[], Any]:
    """The first running request finishes; its release also frees `copy` (slot values, no row view)."""
    from sglang.srt.mem_cache.common import release_kv_cache

    done = drv.batch.reqs[0]
    done.finished_reason = gf_finished()
    pool, allocator = drv.pools.req_to_token_pool, drv.pools.allocator
    original_free = pool.free
    assert copy._base is None  # no view of the row: the row check cannot place it

    def free_row_and_foreign_copy(req: Any, *args: Any, **kwargs: Any) -> Any:
        if req is done:
            allocator.free(copy)
        return original_free(req, *args, **kwargs)

    mp.setattr(pool, "free", free_row_and_foreign_copy)
    return lambda: release_kv_cache(done, drv.batch.tree_cache, checkpoint=False)


def gf_finished() -> Any:
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    return FINISH_LENGTH(length=1)


def _raises_at(trigger: Callable[[], Any], hook: str, invariant: str, action: str) -> SpecFlipViolation:
    with pytest.raises(SpecFlipViolation) as excinfo:
        trigger()
    frames = {entry.name for entry in excinfo.traceback}
    assert hook in frames, (sorted(frames), str(excinfo.value))
    assert (excinfo.value.invariant, excinfo.value.action) == (invariant, action), str(excinfo.value)
    return excinfo.value


@pytest.mark.parametrize("variant", sorted(_copies()))
@pytest.mark.parametrize("radix", [False, True], ids=["radix-off", "radix-on"])
def test_a_copy_of_another_requests_slots_freed_in_a_release_is_caught_at_the_free(
        runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch, variant: str, radix: bool) -> None:
    drv = _driver(runtime, model_dir, radix=radix)
    other = drv.batch.reqs[1]
    trigger = _release_also_frees(drv, monkeypatch, _copies()[variant](_own_slots(drv, other)))
    exc = _raises_at(trigger, "before_allocator_free", "slots_freed_owned", "free")
    assert str(other.rid) in exc.rids, str(exc)
    assert "other live requests' rows still hold" in str(exc)


def test_a_copy_freed_outside_any_release_is_caught_at_the_free(runtime: Any, model_dir: Path) -> None:
    """No window open (between steps, where tree eviction frees): still judged, against every live row."""
    drv = _driver(runtime, model_dir)
    copy = _own_slots(drv, drv.batch.reqs[0]).clone()
    _raises_at(lambda: drv.pools.allocator.free(copy), "before_allocator_free", "slots_freed_owned", "free")


def tree_of_leaves(runtime: Any, model_dir: Path, leaves: int = 12) -> Any:
    """`leaves` short requests served with the radix cache on (distinct first tokens: the tree keeps each prompt as a
    leaf of its root), then two requests decoding: their rows are the live rows an eviction's frees are judged
    against."""
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=True), CATCH_UP)
    gf.configure_guard(runtime, CATCH_UP)
    drv.admit([h.make_req(f"leaf{i}", [100 + i, *range(300, 310)], max_new_tokens=2) for i in range(leaves)])
    drv.run_to_completion()
    drv.admit(gf.make_reqs("r", 2, max_new_tokens=40))
    drv.decode()
    assert int(drv.pools.tree_cache.evictable_size()) >= leaves * 10
    return drv


def evict_all(drv: Any) -> Callable[[], Any]:
    """The tree's own eviction of everything it may evict, as SGLang's alloc path calls it."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    tree = drv.pools.tree_cache
    return lambda: tree.evict(EvictParams(num_tokens=int(tree.evictable_size())))


def count_frees(allocator: Any, mp: pytest.MonkeyPatch, also_free: Any = None) -> list[int]:
    """Counts the allocator's frees from now on (through the hooked method); with `also_free`, the first of them
    also frees that tensor (a fault inside whatever frees)."""
    frees = [0]
    hooked_free = allocator.free

    def counted_free(index: Any, *args: Any, **kwargs: Any) -> Any:
        frees[0] += 1
        if frees[0] == 1 and also_free is not None:
            hooked_free(also_free)
        return hooked_free(index, *args, **kwargs)

    mp.setattr(allocator, "free", counted_free)
    return frees


def test_the_trees_eviction_is_judged_by_one_scan_when_it_returns(runtime: Any, model_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The tree frees each evicted leaf's slots by value, one free per leaf, outside any window: each would be a scan
    of the live rows (`SlotValueCheck.check`). Inside the eviction they are held and judged by one scan when it
    returns (`V2Adapter.around_tree_evict`), then kept for the next alloc as any freed copy is."""
    drv = tree_of_leaves(runtime, model_dir)
    checks = runtime.guard.slot_values
    frees = count_frees(drv.pools.allocator, monkeypatch)
    scans, deferred = checks.checked, len(checks.deferred)
    evicted = int(drv.pools.tree_cache.evictable_size())
    evict_all(drv)()
    assert frees[0] >= 12 and int(drv.pools.tree_cache.evictable_size()) == 0, frees
    assert checks.checked - scans == 1, (checks.checked - scans, frees)
    assert not checks.batching and not checks.batched
    assert len(checks.deferred) == deferred + 1 and checks.deferred[-1].numel() == evicted
    assert not runtime.guard.found
    drv.run_to_completion()  # the next allocs judge them again, and hand the evicted slots out
    assert not runtime.guard.found


@pytest.mark.parametrize("copy_of", ["live", "leaf"])
def test_a_copy_of_a_live_row_freed_in_the_trees_eviction_is_caught_when_it_returns(
        runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch, copy_of: str) -> None:
    """A free of a copy of a live request's committed slots inside the eviction: caught when the eviction returns,
    before anything is allocated, in the eviction's hook. The same free of a leaf's own slots (what the eviction
    frees anyway, freed twice) is no other request's: no finding here."""
    drv = tree_of_leaves(runtime, model_dir)
    other = drv.batch.reqs[1]
    copy = _own_slots(drv, other).clone() if copy_of == "live" else None
    count_frees(drv.pools.allocator, monkeypatch, also_free=copy)
    if copy_of == "leaf":
        evict_all(drv)()
        assert not runtime.guard.found
        return
    exc = _raises_at(evict_all(drv), "around_tree_evict", "slots_freed_owned", "free")
    assert str(other.rid) in exc.rids, str(exc)
    assert "in the tree's eviction (judged when it returned)" in str(exc), str(exc)


def test_assert_mode_stops_at_a_copy_freed_in_the_trees_eviction(runtime: Any, model_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  slot_mode: Callable[[str], None],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The device-assert path of the same fault: the one scan at the eviction's end stops the device."""
    slot_mode("assert")
    drv = tree_of_leaves(runtime, model_dir)
    other = drv.batch.reqs[1]
    count_frees(drv.pools.allocator, monkeypatch, also_free=_own_slots(drv, other).clone())
    exc = _stopped_at(evict_all(drv), runtime, "slots_freed_owned", "free", caplog)
    assert str(other.rid) in exc.rids, str(exc)


def test_a_release_that_frees_a_copy_of_its_own_tree_prefix_is_caught(runtime: Any, model_dir: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The releasing request's own part is its to free; its tree prefix [0, cache_protected_len) is not (the only
    running request: no other row holds those slots)."""
    drv = _driver(runtime, model_dir, radix=True, n=1)
    done = drv.batch.reqs[0]
    assert done.kv.cache_protected_len >= 2, "the shared system prompt is in the tree"
    prefix = drv.pools.req_to_token_pool.req_to_token[done.kv.req_pool_idx, 0:2].clone()
    trigger = _release_also_frees(drv, monkeypatch, prefix)
    _raises_at(trigger, "before_allocator_free", "slots_freed_owned", "free")


def test_a_copy_of_another_requests_reserve_freed_is_caught_at_the_next_alloc(runtime: Any, model_dir: Path) -> None:
    """A reserve may be freed just before its request's allocation shrinks (a switch's flip-off does so): at the free
    only committed KV is judged; the copy is judged again at the next alloc, against the allocations then, before the
    slots are handed out and before the next forward."""
    drv = _driver(runtime, model_dir)
    allocator = drv.pools.allocator
    allocator.free(_reserve_slots(drv, drv.batch.reqs[1]).clone())  # the allocation is left as it was: the fault

    def prepare() -> None:
        with h.patch_assign_req_to_token_pool():
            drv.batch.prepare_for_decode()
    exc = _raises_at(prepare, "after_allocator_alloc", "slots_freed_owned", "free")
    assert "judged at the next alloc" in str(exc)


def _live_slots_put_back_on_the_free_list(drv: Any) -> tuple[torch.Tensor, Callable[[], None]]:
    """Request 1's live slots put back on the free list behind the allocator's free() (no free hook sees it), and
    the next step's real alloc (prepare_for_decode) that hands them out."""
    allocator = drv.pools.allocator
    live = _own_slots(drv, drv.batch.reqs[1]).clone()
    allocator.free_pages = torch.cat((live, allocator.free_pages))

    def prepare() -> None:
        with h.patch_assign_req_to_token_pool():
            drv.batch.prepare_for_decode()
    return live, prepare


def test_a_live_slot_handed_out_again_is_caught_at_the_alloc(runtime: Any, model_dir: Path) -> None:
    """Reuse: another request's live slot put back on the free list behind the allocator's free() (no free hook
    sees it); the next step's real alloc (prepare_for_decode) hands it out."""
    drv = _driver(runtime, model_dir)
    live, prepare = _live_slots_put_back_on_the_free_list(drv)
    exc = _raises_at(prepare, "after_allocator_alloc", "slots_allocated_free", "alloc")
    assert str(drv.batch.reqs[1].rid) in exc.rids, str(exc)


def test_late_mode_judges_a_freed_copy_at_the_next_allocator_call(runtime: Any, model_dir: Path,
                                                                   slot_mode: Callable[[str], None]) -> None:
    """SPECFLIP_GUARD_SLOT_VALUES=late (auto's path for device tensors in warn mode, on the CPU): the free itself
    passes, its answer is read at the next allocator call, which reports it."""
    slot_mode("late")
    drv = _driver(runtime, model_dir)
    allocator = drv.pools.allocator
    allocator.free(_own_slots(drv, drv.batch.reqs[0]).clone())  # queued, not judged yet
    guard = runtime.guard
    assert guard is not None and len(guard.slot_values.pending) == 1
    exc = _raises_at(lambda: allocator.alloc(1), "after_allocator_alloc", "slots_freed_owned", "free")
    assert "judged one allocator call late" in str(exc)


def test_off_mode_checks_nothing(runtime: Any, model_dir: Path, slot_mode: Callable[[str], None]) -> None:
    slot_mode("off")
    drv = _driver(runtime, model_dir)
    drv.pools.allocator.free(_own_slots(drv, drv.batch.reqs[0]).clone())  # the fault, unjudged
    assert runtime.guard.slot_values.checked == runtime.guard.slot_values.allocs == 0


@pytest.mark.parametrize("radix", [False, True], ids=["radix-off", "radix-on"])
def test_a_clean_run_finds_nothing_and_the_check_ran(runtime: Any, model_dir: Path, radix: bool) -> None:
    gf.configure_guard(runtime, CATCH_UP)
    kv_size = 256  # small: the later waves get slots the earlier ones freed
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix, kv_size=kv_size), CATCH_UP)
    for wave in "abc":
        drv.admit(gf.make_reqs(wave, 3, max_new_tokens=12, shared_prefix=gf.SYSTEM_PROMPT))
        drv.run_to_completion()
    late = gf.make_reqs("s", 2, max_new_tokens=8, shared_prefix=gf.SYSTEM_PROMPT)
    drv.merge(drv.prefill(late))
    drv.decode()
    drv.flip_off()  # frees each reserve (a copy of its values) before the allocation shrinks
    drv.decode()
    drv.flip_on()
    drv.run_to_completion()
    guard = runtime.guard
    assert guard is not None and not guard.found
    checks = guard.slot_values
    assert checks.allocs >= 10, checks.allocs  # every alloc was checked against the slots in use
    assert checks.allocated_slots > kv_size, checks.allocated_slots  # freed slots were handed out again
    assert checks.checked >= 3, checks.checked  # the flip-off's reserve copies, by value against the live rows


def test_the_live_rows_let_go_of_a_request_at_its_release(runtime: Any, model_dir: Path) -> None:
    """The rows the slot-value check reads (`V2Adapter._live_reqs`, row -> request) drop a request when it is released,
    finished or retracted: without it they were dropped only when a row scan read them (a free of a copy), which a
    steady decode may never run, so the guard kept finished requests, their prompts and outputs, alive
    (bench/bench_guard.py --history)."""
    gf.configure_guard(runtime, CATCH_UP)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=True), CATCH_UP)
    first = gf.make_reqs("a", 3, max_new_tokens=6, shared_prefix=gf.SYSTEM_PROMPT)
    drv.admit(first)
    live = runtime.adapter._live_reqs
    assert sorted(map(id, live.values())) == sorted(map(id, first))  # the check reads these rows
    drv.run_to_completion()
    assert all(r.finished() for r in first)
    assert not live, [str(r.rid) for r in live.values()]
    second = gf.make_reqs("b", 3, max_new_tokens=20, shared_prefix=gf.SYSTEM_PROMPT)
    drv.admit(second)
    drv.decode()
    with h.patch_assign_req_to_token_pool():  # the real retract_decode, as update_running_batch runs it
        retracted, _, aborted = drv.batch.retract_decode()
    assert retracted and not aborted
    holding = [r for r in second if r.kv.holds_kv]
    assert holding and sorted(map(id, live.values())) == sorted(map(id, holding))
    assert runtime.guard is not None and not runtime.guard.found


@pytest.mark.parametrize(("mode", "stop", "on_host", "path"), [
    ("auto", True, True, "now"), ("auto", False, True, "now"),  # a CPU server: judged at the hook
    ("auto", True, False, "stop"),  # a GPU, the guard in assert mode: the device assert
    ("auto", False, False, "late"),  # a GPU, warn or trace mode: never takes the server down
    ("assert", True, True, "stop"), ("assert", True, False, "stop"),  # the device path, also on host tensors
    ("assert", False, False, "late"), ("assert", False, True, "late"),
    ("late", True, True, "late"), ("late", True, False, "late"),
    ("sync", True, False, "now"), ("sync", False, False, "now"),
    ("off", True, True, "off"), ("off", True, False, "off"),
])
def test_the_path_each_mode_takes(mode: str, stop: bool, on_host: bool, path: str) -> None:
    """SPECFLIP_GUARD_SLOT_VALUES, the guard's mode (`stop`: assert) and the tensors' device choose how a check's
    answer is read (shim/guard/slot_values.py, `path_for`)."""
    from shim.guard.slot_values import path_for

    assert path_for(mode, stop, on_host) == path


def test_track_sets_the_path_and_the_bitmaps_on_the_allocators_device() -> None:
    from shim.guard.slot_values import SlotValueCheck

    check = SlotValueCheck("auto", stop=True)
    assert check.on and check.path is None  # no allocator yet
    check.track(type("CpuAllocator", (), {"device": "cpu", "size": 64})())
    assert check.path == "now" and check.in_use is not None and check.in_use.device.type == "cpu"
    assert check.in_use.numel() == 66 and not bool(check.in_use.any())
    off = SlotValueCheck("off", stop=True)
    off.track(type("CpuAllocator", (), {"device": "cpu", "size": 64})())
    assert not off.on and off.in_use is None


def _stopped_at(trigger: Callable[[], Any], runtime: Any, invariant: str, action: str,
                caplog: pytest.LogCaptureFixture) -> SpecFlipViolation:
    """`trigger` run as the scheduler's event loop runs it (the adapter's hook around `Scheduler.run_event_loop`, the
    function SGLang's HookRegistry calls): the check's `torch._assert_async` raises (on the CPU at once; on a GPU the
    process meets the CUDA error at a later CUDA call), and the finding, read from the answer the check copied to host
    memory before the assert, is raised from that error and logged."""
    with caplog.at_level(logging.ERROR, logger="specflip.guard"):
        exc = _raises_at(lambda: runtime.adapter.around_event_loop(lambda _scheduler: trigger(), None),
                         "around_event_loop", invariant, action)
    assert isinstance(exc.__cause__, RuntimeError), repr(exc.__cause__)  # the assert's error, as the process met it
    assert "the device stopped at this check" in str(exc)
    first = str(exc).split("\n")[0]
    assert first.startswith(f"specflip: {invariant} broken by {action}"), first
    assert any(m.split("\n")[0] == first for m in caplog.messages), caplog.messages  # the finding's line, logged
    assert runtime.guard.slot_values.path == "stop"
    return exc


def test_assert_mode_stops_at_a_freed_copy_and_names_it(runtime: Any, model_dir: Path,
                                                         slot_mode: Callable[[str], None],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """SPECFLIP_GUARD_SLOT_VALUES=assert (auto's path on a GPU in assert mode) on host tensors: the same code as on a
    device, where `torch._assert_async` raises at once. The finding names the slot and the row holding it, decoded
    from the one int64 the check copied out."""
    slot_mode("assert")
    drv = _driver(runtime, model_dir)
    other = drv.batch.reqs[1]
    copy = _own_slots(drv, other).clone()
    exc = _stopped_at(lambda: drv.pools.allocator.free(copy), runtime, "slots_freed_owned", "free", caplog)
    assert str(other.rid) in exc.rids, str(exc)
    named = exc.violations[0].actual
    assert any(f"slot {s} (row {other.kv.req_pool_idx} position" in named for s in copy.tolist()), named


def test_assert_mode_stops_at_an_alloc_of_a_live_slot(runtime: Any, model_dir: Path,
                                                      slot_mode: Callable[[str], None],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A live slot put back on the free list behind free()'s back, handed out by the next step's alloc: the device
    assert stops there; the finding names the slot (which row holds it is not read: no row scan per alloc)."""
    slot_mode("assert")
    drv = _driver(runtime, model_dir)
    live, prepare = _live_slots_put_back_on_the_free_list(drv)
    exc = _stopped_at(prepare, runtime, "slots_allocated_free", "alloc", caplog)
    assert f"slot {max(live.tolist())}, in use, its holder not read" in str(exc), str(exc)


def test_assert_mode_on_a_clean_run_finds_nothing_and_answers_are_drained(runtime: Any, model_dir: Path,
                                                                           slot_mode: Callable[[str], None]) -> None:
    """The device-assert path on a correct run with slot reuse and flips: no assert fires, every answer says no hit,
    and nothing is queued for a later hook (a clean STOP answer is never read)."""
    slot_mode("assert")
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=True, kv_size=256), CATCH_UP)
    gf.configure_guard(runtime, CATCH_UP)
    for wave in "ab":
        drv.admit(gf.make_reqs(wave, 3, max_new_tokens=12, shared_prefix=gf.SYSTEM_PROMPT))
        drv.run_to_completion()
    drv.admit(gf.make_reqs("s", 2, max_new_tokens=8, shared_prefix=gf.SYSTEM_PROMPT))
    drv.decode()
    drv.flip_off()
    drv.decode()
    drv.flip_on()
    drv.run_to_completion()
    guard = runtime.guard
    assert guard is not None and not guard.found
    checks = guard.slot_values
    assert checks.path == "stop" and checks.allocs >= 10 and checks.checked >= 3, (checks.allocs, checks.checked)
    assert not checks.pending and checks.stopped_findings() == []


