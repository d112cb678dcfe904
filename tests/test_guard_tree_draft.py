"""The guard follows the radix tree's draft coverage (issue 24, shim/guard/tree_draft.py) on real SGLang 0.5.23 objects
under its overlap loop with the retract switch (tests/overlap_loop.py, stand-in forwards): a burst that flips
speculation off caches a new shared prefix with no draft KV; a request of the quiet phase after it hits that prefix
with speculation on. With `SPECFLIP_SWITCH_RADIX=insert` (SGLang's own tree: the known-bad design
`retract_catch_up_radix_unmarked`) the guard flags that request at its first draft step, naming it and the
positions missing; with `keep_out` (the default) and in a run that never flips it finds nothing. The positions
missing are checked against a host-side record of which forward last wrote each slot (the test reads slot values;
the guard does not)."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")
ol = importlib.import_module("overlap_loop")
sr = importlib.import_module("test_switch_retract")

from shim.guard.core import Guard, Mode, SpecFlipViolation  # noqa: E402
from shim.switch.v2 import SwitchConfig  # noqa: E402
from statemodel.design import DesignKind  # noqa: E402
from statemodel.designs import CATCH_UP, RADIX_KNOWN_BAD, get_design  # noqa: E402

pytestmark = pytest.mark.sglang

SHARED = list(range(600, 628))  # the prefix the burst brings: 28 tokens, new to the tree
BURST = 5  # demand 5 >= t_off 4: the burst runs with speculation off


def shared_prefix_run(model_dir: Path, radix_mode: str | None) -> tuple[Any, dict[str, Any]]:
    """The burst (5 requests on SHARED, equal lengths: they finish together while off, so flip-on retracts nothing),
    then, once it is done, one quiet request 'q' on SHARED and a suffix of its own. `radix_mode` None: no switch (a
    server that never flips). Returns the driver and a host-side record: 'q_missing', the positions of q's tree prefix
    whose slot the last forward writing it wrote without the draft (once q holds it), and 'q_cached', that prefix."""
    if radix_mode is None:  # the switch with a threshold no demand here reaches: speculation stays on
        drv = ol.OverlapDriver(ol.overlap_pools(model_dir, radix_cache=True), sr.RETRACT,
                               switch_config=SwitchConfig(t_off=100, t_on=1, draft_while_off="retract"))
        drv.accepts = sr.cycle([4, 1, 3, 2])
    else:
        drv = sr.driver(model_dir, radix=True, radix_mode=radix_mode)
    with_draft: dict[int, bool] = {}  # slot -> whether the forward that last wrote it ran the draft
    seen: dict[str, int] = {}
    run_batch, iteration = drv.run_batch, drv.iteration

    def recording_run_batch(batch: Any) -> Any:
        spec = not batch.spec_algorithm.is_none()
        if batch.forward_mode.is_extend() or not spec:  # a speculative decode's out_cache_loc is the worker's
            with_draft.update(dict.fromkeys(batch.out_cache_loc.tolist(), spec))
        return run_batch(batch)

    def recording_iteration(**kwargs: Any) -> Any:
        out = iteration(**kwargs)
        if not radix_mode or drv.spec_on:  # a speculating request's own tokens are the draft's
            for req in drv.running.reqs if drv.running is not None else []:
                row = drv.pools.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
                with_draft.update(dict.fromkeys(row[req.kv.cache_protected_len:req.kv.kv_allocated_len].tolist(),
                                                True))
        for req in drv.running.reqs if drv.running is not None else []:
            if str(req.rid) == "q" and "q_cached" not in seen and req.kv.cache_protected_len:
                row = drv.pools.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
                prefix = row[:req.kv.cache_protected_len].tolist()
                seen["q_cached"] = len(prefix)
                seen["q_missing"] = sum(with_draft.get(slot) is False for slot in prefix)
        return out

    drv.run_batch, drv.iteration = recording_run_batch, recording_iteration
    burst = [h.make_req(f"b{i}", SHARED + [700 + i] * (2 + i), max_new_tokens=6) for i in range(BURST)]
    drv.add(burst)
    drv.run_until_idle()
    quiet = h.make_req("q", SHARED + [800] * 4, max_new_tokens=8)
    drv.add([quiet])
    drv.run_until_idle()
    seen["reqs"] = [*burst, quiet]
    return drv, seen


def flagged(guard: Guard) -> list[tuple[str, str]]:
    """The tree findings the guard made: (action, the numbers)."""
    return [(action, v.actual) for action, found in guard.found for v in found
            if v.invariant == "draft_kv_covers_prefix"]


def test_insert_flags_a_hit_on_a_prefix_cached_while_off_warn_mode(runtime: Any, model_dir: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """The switch's default (insert): the burst's shared prefix goes into the tree without draft KV; q hits it after
    flip-on. Warn mode: the guard logs it once, naming q and the positions missing (as many as the slots' own record
    says), counts it, and serving goes on (every output greedy, every slot back)."""
    gf.configure_guard(runtime, sr.RETRACT, mode=Mode.WARN)
    with caplog.at_level(logging.WARNING, logger="specflip.guard"):
        drv, seen = shared_prefix_run(model_dir, "insert")
    assert [a for _, a in drv.flips][:2] == ["flip_off", "flip_on"]
    assert seen["q_missing"] > 0  # q really drafts over slots the draft never wrote
    assert flagged(runtime.guard) == [("draft", f"{seen['q_missing']} positions without draft KV")]
    lines = [r.getMessage() for r in caplog.records if "draft_kv_covers_prefix broken by draft" in r.getMessage()]
    assert len(lines) == 1 and "requests ['q']" in lines[0], lines
    # the prefix it matched at admission (under the overlap loop q drafts before its prefill's checkpoint repoints the
    # rest of its prompt, its own slots, at the tree)
    assert f"tokens from the radix cache, {seen['q_missing']} of them without draft KV" in lines[0]
    assert sr.not_greedy(seen["reqs"]) == []
    assert sr.free_list_exact(drv.pools) and gf.pool_accounted(drv.pools)


def test_insert_flags_a_hit_on_a_prefix_cached_while_off_assert_mode(runtime: Any, model_dir: Path) -> None:
    """The same run in assert mode: the guard raises at q's first draft step, before the draft forward runs."""
    gf.configure_guard(runtime, sr.RETRACT)
    with pytest.raises(SpecFlipViolation) as caught:
        shared_prefix_run(model_dir, "insert")
    exc = caught.value
    assert exc.invariant == "draft_kv_covers_prefix" and exc.action == "draft" and exc.rids == ("q",), exc
    assert "positions without draft KV" in str(exc) and "broken by draft" in str(exc)


def test_without_the_check_the_same_run_goes_unreported(runtime: Any, model_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The check taken out (no tree findings): the run above passes unreported; the model's other invariants do not
    see it (the guard's model does not follow the tree)."""
    monkeypatch.setattr(Guard, "tree_draft_violations", lambda self, steps, running: [])
    gf.configure_guard(runtime, sr.RETRACT)
    _, seen = shared_prefix_run(model_dir, "insert")
    assert seen["q_missing"] > 0 and runtime.guard.found == []


def test_keep_out_same_traffic_no_finding(runtime: Any, model_dir: Path) -> None:
    """SPECFLIP_SWITCH_RADIX=keep_out: nothing computed while off goes into the tree; q computes the prefix itself
    (with the draft). Assert mode: no finding."""
    gf.configure_guard(runtime, sr.RETRACT)
    drv, seen = shared_prefix_run(model_dir, "keep_out")
    assert [a for _, a in drv.flips][:2] == ["flip_off", "flip_on"]
    assert runtime.guard.found == [] and seen.get("q_missing", 0) == 0
    assert not runtime.guard.tree_record.without_draft


def test_radix_on_without_flips_no_finding(runtime: Any, model_dir: Path) -> None:
    """A server that never flips (the switch's t_off above any demand here), radix on: q hits the burst's prefix,
    which the draft computed. Assert mode: no finding, and the hit happened."""
    gf.configure_guard(runtime, sr.RETRACT)
    drv, seen = shared_prefix_run(model_dir, None)
    assert drv.flips == [] and sr.not_greedy(seen["reqs"]) == []
    assert seen["q_cached"] >= len(SHARED) - 1 and seen["q_missing"] == 0
    assert runtime.guard.found == [] and not runtime.guard.tree_record.without_draft


def test_insert_follows_the_radix_known_bad_design_and_keep_out_is_the_default() -> None:
    """The design the insert runs above follow is the refuted `retract_catch_up_radix_unmarked`, whose counterexample
    breaks the invariant the guard reports; the switch's default is keep_out, the shipped design that passes."""
    default = SwitchConfig.from_env({"SPECFLIP_SWITCH": "4:1"})
    assert default is not None and default.radix == "keep_out"
    unmarked = {d.name: d for d in RADIX_KNOWN_BAD}["retract_catch_up_radix_unmarked"]
    assert unmarked.expected_invariant == "draft_kv_covers_prefix"
    shipped = get_design("plain_off_retract_catch_up_radix")
    assert shipped.kind is DesignKind.SHIPPED and shipped.expected_invariant is None


def test_the_0_5_16_eviction_hook_forgets_what_the_tree_dropped(model_dir: Path) -> None:
    """0.5.16's tree is `RadixCache` (0.5.23 still ships it: the same Python trie), whose eviction deletes leaves
    through `_delete_leaf`, where the 0.5.16 adapter's hook forgets their positions. On a real RadixCache with EAGLE's
    bigram keys and a real allocator: two prompts sharing a prefix, inserted without draft KV (the second splits the
    first's node), then evicted whole: every leaf's path is rebuilt from the host keys and the record ends empty.
    Inserted again with draft KV, nothing is without it."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    from shim.guard.core import GuardConfig
    from shim.releases.v0_5_16 import Adapter as Adapter0516
    from statemodel.design import Scope

    pools = h.build_pools(h.make_server_args(model_dir), kv_size=128)
    tree = RadixCache(CacheInitParams(disable=False, req_to_token_pool=pools.req_to_token_pool,
                                      token_to_kv_pool_allocator=pools.allocator, page_size=1, is_eagle=True))
    guard = Guard(GuardConfig(mode=Mode.ASSERT, design=sr.RETRACT, scope=Scope()))
    adapter = Adapter0516()
    adapter._with_guard = lambda step: step(guard)  # the hooks' one shape, with this guard live
    tree._delete_leaf = lambda node, orig=tree._delete_leaf: (adapter.before_tree_delete_leaf(tree, node), orig(node))
    prompts = [SHARED + [900, 901, 902], SHARED + [910, 911]]

    def insert(tokens: list[int]) -> None:
        adapter.around_tree_insert(RadixCache.insert, tree, InsertParams(key=RadixKey(list(tokens), None),
                                                                         value=pools.allocator.alloc(len(tokens))))

    # cached for a request whose draft KV covers none of them (a prefill while off); the model's coverage is read here
    guard.tree_inserting.append("off")
    guard.drafted_upto = lambda rid: 0  # type: ignore[method-assign]
    for tokens in prompts:
        insert(tokens)
    record = guard.tree_record
    assert len(record.without_draft) == tree.total_size() == len(SHARED) - 1 + 3 + 2  # bigram positions
    marks = record.marks(prompts[1], (None, None), len(prompts[1]) - 1)
    assert marks.count(False) == len(prompts[1]) - 1  # the second prompt's path, through the split node
    tree.evict(EvictParams(num_tokens=tree.evictable_size()))
    assert tree.total_size() == 0 and record.without_draft == set()
    guard.drafted_upto = lambda rid: 10**6  # type: ignore[method-assign]
    insert(prompts[0])
    assert record.without_draft == set() and tree.total_size() == len(prompts[0]) - 1


# --- plain_off_catch_up with the radix cache on (issue 51): the catch-up at flip-on covers the tree prefix ------------


def catch_up_radix_run(runtime: Any, model_dir: Path, *, chunk_size: int | None = None) -> tuple[Any, dict[str, Any]]:
    """A switch outside this project that follows `plain_off_catch_up` (tests/guard_fixtures.py's DesignDriver: the
    flip takes spec_info off the batch, no draft work while off, one draft-extend over the whole batch at flip-on) on
    real 0.5.23 objects with the radix cache on: three requests on gf.SYSTEM_PROMPT speculate, speculation goes off,
    two requests with prompts new to the tree are prefilled while off (their checkpoint inserts the new positions
    without draft KV and repoints their rows at the tree's slots), speculation comes back on, and the catch-up runs
    the draft over every running request's row. Returns the driver and what the guard's tree record held: 'before_on'
    (positions without draft KV just before flip-on), 'late' (the two requests)."""
    gf.configure_guard(runtime, CATCH_UP)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=True), CATCH_UP)
    drv.admit_all(gf.make_reqs("a", 3, max_new_tokens=40, shared_prefix=gf.SYSTEM_PROMPT), chunk_size=chunk_size)
    for _ in range(2):
        drv.decode()
    drv.flip_off()
    drv.decode()
    late = [h.make_req(f"late{i}", gf.SYSTEM_PROMPT + [300 + i] * (5 + i), max_new_tokens=12) for i in range(2)]
    drv.admit_all(late, chunk_size=chunk_size)
    drv.decode()
    seen = {"before_on": len(runtime.guard.tree_record.without_draft), "late": late}
    drv.flip_on()
    for _ in range(3):
        drv.decode(accepts=[4, 3, 1, 2, 4])
    drv.finish_and_filter()
    drv.run_to_completion()
    return drv, seen


@pytest.mark.parametrize("chunk_size", [None, 16], ids=["whole", "chunked"])
def test_catch_up_covers_the_tree_prefix_no_false_alarm(runtime: Any, model_dir: Path, chunk_size: int | None) -> None:
    """Issue 51: the requests prefilled while off hold tree slots without draft KV (the guard's record says so before
    flip-on); the catch-up at flip-on writes the draft KV over their whole rows, tree slots included (the model's
    `draft_written_in_tree`), so their first draft step is correct. Assert mode: no finding, every request served,
    and the record holds nothing without draft KV once the catch-up ran."""
    drv, seen = catch_up_radix_run(runtime, model_dir, chunk_size=chunk_size)
    g = runtime.guard
    assert seen["before_on"] > 0  # the prompts new to the tree went in without draft KV while off
    assert g.found == [] and g.covered.get("draft_catch_up") == 1 and g.covered.get("draft", 0) > 0
    assert not g.tree_record.without_draft and not g.tree_missing
    assert all(r.finished() for r in seen["late"]) and gf.pool_accounted(drv.pools)
