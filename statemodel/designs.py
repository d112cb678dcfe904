"""The designs: every way of performing the flip that specflip ships or refutes, as data.

Shipped designs (implemented in shim/switch/ or by SGLang itself) and candidates (not implemented yet) must
pass every invariant within the scope; known-bad designs (each one change from a base design) must each be
refuted by a shortest counterexample whose last step breaks `expected_invariant`.
"""

from __future__ import annotations

import attrs

from statemodel.design import (
    AdaptiveTiers,
    ClearSpecOn,
    Design,
    DesignKind,
    DraftWhileOff,
    FreeFlips,
    KvReserve,
    MergeSpecInfo,
    OutCacheLocFrom,
    PlainStepGraphs,
    RequestSpec,
    Scope,
    ThresholdPolicy,
    TierFlips,
    TreeDraft,
)

# Threshold pairs the checker explores for every threshold design: off at 1..4, on below it. t_on = 3
# lies above speculation's running cap (2 in the scope): safe only because the policy is clamped.
THRESHOLDS = ThresholdPolicy(t_off_range=(1, 2, 3, 4), t_on_range=(0, 1, 2, 3))
# SGLang's adaptive tiers scaled to the scope: bs1 up to 2 steps, bs2 [0, 1], bs3 [0].
TIERS = AdaptiveTiers(tiers=((1, (1, 2)), (2, (0, 1)), (3, (0,))))

SEEDS_FINAL = Design(
    name="seeds_final",
    kind=DesignKind.SHIPPED,
    summary="The seeds' final design, done right: leave the ScheduleBatch alone; on the worker's copy clear "
    "spec_info and spec_algorithm; plain target forward on one slot per request allocated for the plain "
    "step (the plugin makes prepare_for_decode allocate it: v1 returns early when speculating), replaying "
    "a decode graph runner captured beside the verify graphs; restore; draft sync after every plain step.",
    source="shared/seeds (msg 5559)",
    sglang_line="0.5.12",
    policy=THRESHOLDS,
    verify_advances_past_finish=False,  # the v1 worker cuts the accepted run at the finish
    clear_spec_on=ClearSpecOn.WORKER_COPY,
    draft_while_off=DraftWhileOff.SYNC_EVERY_STEP,
)

CATCH_UP = Design(
    name="plain_off_catch_up",
    kind=DesignKind.CANDIDATE,
    summary="specflip's v2 switch: the flip takes spec_info and spec_algorithm off the batch so a spec-off "
    "step is a real plain DECODE; no draft work while off; one draft-extend over every token committed "
    "while off when speculation comes back; the running cap and KV reserve follow the mode and the "
    "policy never re-enables above speculation's cap.",
    source="issue 5 (v2 worker, 0.5.16 / 0.5.23)",
    sglang_line="0.5.23",
    policy=THRESHOLDS,
    clear_spec_on=ClearSpecOn.BATCH_AT_FLIP,
    draft_while_off=DraftWhileOff.CATCH_UP_ON_ENABLE,
)

SYNC_V2 = Design(
    name="plain_off_sync",
    kind=DesignKind.CANDIDATE,
    summary="specflip's v2 switch with the draft kept current: as plain_off_catch_up, but a draft-extend "
    "over the new token after every plain step instead of one catch-up.",
    source="issue 5 (v2 worker, 0.5.16 / 0.5.23)",
    sglang_line="0.5.23",
    policy=THRESHOLDS,
    clear_spec_on=ClearSpecOn.BATCH_AT_FLIP,
    draft_while_off=DraftWhileOff.SYNC_EVERY_STEP,
)

V2_SWITCH = Design(
    name="v2_switch_reserve_sync",
    kind=DesignKind.SHIPPED,
    summary="specflip's v2 switch as shim/switch/v2.py implements it on SGLang 0.5.16: the ScheduleBatch keeps "
    "its draft input and prepare_for_decode its speculative path (the reserve is topped up, never released); "
    "a spec-off step strips spec_info and spec_algorithm only inside the worker call (_forward_isolation "
    "restores them), takes its slot from the v2 over-allocation, replays a decode graph runner captured at "
    "start-up, and a draft-extend follows every plain step.",
    source="shim/switch/v2.py; docs/archive/gpu-results.md (H200, 0.5.16)",
    sglang_line="0.5.16",
    policy=THRESHOLDS,
    clear_spec_on=ClearSpecOn.WORKER_COPY,
    out_cache_loc_from=OutCacheLocFrom.V2_RESERVE,
    release_reserve_at_flip_off=False,
    draft_while_off=DraftWhileOff.SYNC_EVERY_STEP,
)

ADAPTIVE_WARM = Design(
    name="sglang_adaptive_warm",
    kind=DesignKind.SHIPPED,
    summary="SGLang 0.5.23's --speculative-adaptive: per batch-size tiers of step counts including 0 "
    "(a trivial one-token verify), draft-extend kept running at steps=0, KV reserve sized for the "
    "largest tier.",
    source="sglang 0.5.23 eagle_worker_v2.py, adaptive_spec_params.py",
    sglang_line="0.5.23",
    policy=TIERS,
    zero_step_draft_extend=True,
)

RETRACT_CATCH_UP = attrs.evolve(
    CATCH_UP,
    name="plain_off_retract_catch_up",
    kind=DesignKind.SHIPPED,
    summary="specflip's v2 switch on SGLang's plain path, as shim/switch/v2.py implements it with "
    "SPECFLIP_SWITCH_DRAFT=retract: plain_off_catch_up with the catch-up by retraction: no draft work while off; "
    "flip-on retracts every running request (ScheduleBatch.release_req without tree insertion: KV freed, back to "
    "waiting with its output) and its prefill with speculation on runs the target and the draft over prompt + "
    "output.",
    source=("shim/switch/v2.py (draft mode retract); docs/throughput-plan.md; "
            "docs/archive/gpu-results.md (H200, 0.5.16)"),
    sglang_line="0.5.16",
    draft_while_off=DraftWhileOff.RETRACT_ON_ENABLE,
)

# Every flip a policy may take: off and on at any demand, on only within the spec cap (statemodel.design.FreeFlips).
FREE_FLIPS = FreeFlips()

AUTO_RETRACT_CATCH_UP = attrs.evolve(
    RETRACT_CATCH_UP,
    name="plain_off_retract_catch_up_auto",
    summary="plain_off_retract_catch_up with the flips free: off and on at any scheduling point, at any demand, on "
    "only while the running batch fits under speculation's cap. The auto switch (SPECFLIP_SWITCH=auto, "
    "statemodel.auto_policy) decides from measured step times, probes included, only among these flips.",
    source="shim/switch/v2.py (SPECFLIP_SWITCH=auto, draft mode retract); statemodel/auto_policy.py; issue 17",
    policy=FREE_FLIPS,
)

# Issue 23: the switch picks among plain decoding and EAGLE-3 at each step count the server has graphs for (scaled
# to the scope: steps 1 and 2; the largest decides the reserve), on SGLang's own adaptive runtime states.
TIERS_RETRACT_CATCH_UP = attrs.evolve(
    RETRACT_CATCH_UP,
    name="plain_off_retract_catch_up_tiers",
    summary="plain_off_retract_catch_up with speculative tiers, as shim/switch/v2_tiers.py implements it "
    "(SPECFLIP_TIERS): flips free between plain decoding and speculation, and while on each decode step runs any "
    "tier's step count, applied at the top of the worker's forward after prepare_for_decode topped up a reserve "
    "sized for the largest tier (SGLang's adaptive runtime states); a tier change needs no draft work (draft-extend "
    "runs in every tier), flip-on retracts and re-prefills with the draft as before.",
    source="issue 23; shim/switch/v2_tiers.py; sglang 0.5.16 speculative/adaptive_runtime_state.py, "
    "eagle_worker_v2.py apply_runtime_state, mem_cache/allocation_sizing.py",
    policy=TierFlips(steps=(1, 2)),
)

# SGLang's radix cache on (its default), every prompt a prefix of one token sequence: the same switch keeps out of
# the tree every token computed without the draft (issue 24; docs/prefix-cache.md). What the v2 switch does by default
# (SPECFLIP_SWITCH_RADIX=keep_out; tests/test_switch_retract.py, radix cache on); the guard follows the tree's draft
# coverage beside its reference design (shim/guard/tree_draft.py)
RETRACT_CATCH_UP_RADIX = attrs.evolve(
    RETRACT_CATCH_UP,
    name="plain_off_retract_catch_up_radix",
    kind=DesignKind.SHIPPED,
    summary="plain_off_retract_catch_up on a server with SGLang's radix cache on, as shim/switch/v2.py implements it: "
    "every request of a batch run while off gets req.skip_radix_cache_insert, so tokens computed without the draft "
    "never go into the tree, and the flip-on retraction gives the flag back (the re-prefill runs the draft); a "
    "prefix hit, a retracted request's own re-prefill included, only ever reuses slots whose draft KV was written.",
    source="issue 24; docs/prefix-cache.md; shim/switch/v2.py; sglang 0.5.23 mem_cache/common.py checkpoint_kv_cache, "
    "release_kv_cache",
    radix_cache=True,
    tree_draft=TreeDraft.NOT_INSERTED_WITHOUT_DRAFT,
)

SHIPPED = (SEEDS_FINAL, V2_SWITCH, ADAPTIVE_WARM, RETRACT_CATCH_UP, AUTO_RETRACT_CATCH_UP, TIERS_RETRACT_CATCH_UP,
           RETRACT_CATCH_UP_RADIX)

# Issue 22: the v1 switch (SGLang 0.5.12's EAGLEWorker, non-overlap) on SGLang's plain path. seeds_final's worker-side
# plain step (the speculative scheduler path, a draft sync after every plain step) cost 0.53-0.62x of a plain server on
# the H200's 8B pair; this is plain_off_retract_catch_up with the v1 worker's verify (it cuts the accepted run at a
# finish) and the radix cache handled as the v2 switch does (skip_radix_cache_insert while off). A candidate: its
# real-object run is on 0.5.12 (tests/test_v1_switch.py), not among the 0.5.23 guard runs every shipped design has.
V1_RETRACT_CATCH_UP = attrs.evolve(
    RETRACT_CATCH_UP,
    name="v1_plain_off_retract_catch_up",
    kind=DesignKind.CANDIDATE,
    summary="specflip's v1 switch (SGLang 0.5.12's EAGLEWorker, non-overlap schedule) on SGLang's plain path, as "
    "shim/switch/v1.py implements it with SPECFLIP_SWITCH_DRAFT=retract (its default since issue 22): flip-off takes "
    "spec_info and spec_algorithm off the running and the prefilled batch (the input ids are the last draft input's "
    "bonus tokens; v1 holds no reserve between steps) and points the scheduler at the target worker, so a spec-off "
    "step is SGLang's own plain decode; no draft work while off, and every request run while off keeps its tokens "
    "out of the radix tree; flip-on retracts every running request (ScheduleBatch.retract_all: release_req without "
    "tree insertion) and its prefill with speculation on runs the target and the draft over prompt + output.",
    source="shim/switch/v1.py (draft mode retract); docs/v1.md; issue 22",
    sglang_line="0.5.12",
    verify_advances_past_finish=False,  # the v1 worker cuts the accepted run at the finish
)
# the same with the radix cache on (the server default), as plain_off_retract_catch_up_radix is for v2: the guard's
# reference is the design above (its tree check runs beside it), this one proves the tree stays draft-covered
V1_RETRACT_CATCH_UP_RADIX = attrs.evolve(
    V1_RETRACT_CATCH_UP,
    name="v1_plain_off_retract_catch_up_radix",
    summary="v1_plain_off_retract_catch_up on a server with SGLang's radix cache on: every request of a batch run "
    "while off gets req.skip_radix_cache_insert and the flip-on retraction gives it back, so a prefix hit only ever "
    "reuses slots whose draft KV was written.",
    radix_cache=True,
    tree_draft=TreeDraft.NOT_INSERTED_WITHOUT_DRAFT,
)

# Candidates: checked like shipped designs (they must pass), not implemented in shim/ yet, so no real-object run.
# plain_off_catch_up is the guard's reference design on a server without a switch (no flip ever happens there).
CANDIDATES: tuple[Design, ...] = (CATCH_UP, SYNC_V2, V1_RETRACT_CATCH_UP,
                                  V1_RETRACT_CATCH_UP_RADIX)


def _known_bad(base: Design, *, name: str, summary: str, source: str, expected_invariant: str,
               **change: object) -> Design:
    """A known-bad design: `base` (a shipped design, a candidate, or SGLang's own) with exactly one field changed."""
    if len(change) != 1:
        raise ValueError(f"{name}: a known-bad design is one change from its base, got {sorted(change)}")
    return attrs.evolve(base, name=name, kind=DesignKind.KNOWN_BAD, summary=summary, source=source,
                        expected_invariant=expected_invariant, **change)  # type: ignore[arg-type]


KNOWN_BAD = (
    _known_bad(
        SEEDS_FINAL, name="seeds_final_verify_graphs_only", expected_invariant="shapes_agree",
        summary="The seeds' final design exactly as written: spec_info and spec_algorithm cleared on the worker "
        "copy, but a speculative server has captured only target-verify graphs and CudaGraphRunner.can_run "
        "ignores forward_mode, so the plain decode still replays a verify graph.",
        source="sglang 0.5.12 model_executor/cuda_graph_runner.py (docs/correspondence-research.md)",
        plain_step_graphs=PlainStepGraphs.VERIFY_RUNNER,
    ),
    _known_bad(
        SEEDS_FINAL, name="seeds_attempt1_spec_info_left", expected_invariant="spec_info_matches_mode",
        summary="Seeds' attempt 1: the EagleDraftInput stays on the batch of a plain decode; the CUDA graph "
        "runner prepares the speculative shape (\"size of tensor a (160) must match tensor b (2)\").",
        source="shared/seeds (msg 5536); ANCHORS.md seeds row",
        clear_spec_on=ClearSpecOn.NOWHERE,
    ),
    _known_bad(
        SEEDS_FINAL, name="seeds_attempt2_tuple_unpack", expected_invariant="shapes_agree",
        summary="Seeds' attempt 2: the fallback allocates its own slots and unpacks "
        "`out_cache_loc, _ = alloc_token_slots(..., backup_state=False)`, a tensor, not a tuple.",
        source="shared/seeds (msg 5556, 5559)",
        out_cache_loc_from=OutCacheLocFrom.TUPLE_UNPACK,
    ),
    _known_bad(
        SEEDS_FINAL, name="clear_on_scheduler_batch", expected_invariant="draft_kv_covers_prefix",
        summary="Clears spec_info and spec_algorithm on the ScheduleBatch instead of the worker's copy: the "
        "draft input the next draft step needs is gone when speculation comes back.",
        source="shared/seeds (msg 5559: 'not the ScheduleBatch itself')",
        clear_spec_on=ClearSpecOn.SCHEDULER_BATCH,
    ),
    _known_bad(
        ADAPTIVE_WARM, name="zero_steps_skip_draft_extend", expected_invariant="draft_kv_covers_prefix",
        summary="Adaptive steps=0 with draft-extend skipped (SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND) and no "
        "recovery: when steps go back up the draft runs on a stale KV.",
        source="ANCHORS.md: sglang adaptive; TRT-LLM PR #16888; vllm-metal PR #716",
        zero_step_draft_extend=False,
    ),
    _known_bad(
        ADAPTIVE_WARM, name="kv_reserve_by_current_steps", expected_invariant="kv_reserve_covers_writes",
        summary="The speculative KV reserve is sized by the current step count; the adaptive switch to more "
        "steps happens after prepare_for_decode, so the verify writes past the reserve.",
        source="sglang PR #24055",
        kv_reserve=KvReserve.CURRENT_STATE,
    ),
    _known_bad(
        CATCH_UP, name="merge_unchecked_spec_info", expected_invariant="spec_info_matches_batch",
        summary="merge_batch concatenates spec_info as it is: a batch prefilled while speculation was off "
        "(no draft input) merges into a speculative running batch and spec_info loses rows.",
        source="sglang PR #10090 comment (merge_batch -> spec_info.merge_batch shape error under load)",
        merge_spec_info=MergeSpecInfo.CONCAT_UNCHECKED,
    ),
    _known_bad(
        ADAPTIVE_WARM, name="draft_kv_never_freed", expected_invariant="kv_conservation",
        summary="The KV over-allocated for draft tokens is not freed when a request finishes.",
        source="sglang #13826, #19518",
        free_reserved_on_finish=False,
    ),
    _known_bad(
        CATCH_UP, name="reenable_above_spec_cap", expected_invariant="running_within_cap",
        summary="The policy re-enables speculation at t_on although more requests run than speculation "
        "holds (48 against 128 on the GPU host).",
        source="issue 2; GPU-HOST.md (max_running_requests 48 with speculation)",
        policy=ThresholdPolicy(t_off_range=(4,), t_on_range=(3,), clamp_to_spec_cap=False),
    ),
    _known_bad(
        CATCH_UP, name="no_draft_work_while_off", expected_invariant="draft_kv_covers_prefix",
        summary="No draft work while off and no catch-up when speculation comes back: the draft KV is stale.",
        source="vLLM PR #4592 ('disabled forever'), TRT-LLM PR #16888, vllm-metal PR #716",
        draft_while_off=DraftWhileOff.NONE,
    ),
    _known_bad(
        CATCH_UP, name="seq_lens_advanced_twice", expected_invariant="seq_lens_growth",
        summary="A plain step whose seq_lens are advanced by prepare_for_decode and again by the speculative "
        "worker's post-verify bookkeeping.",
        source="sglang closed PR #13804 (cleanup_speculative_state re-allocates and resets per step)",
        plain_step_advances_seq_lens_twice=True,
    ),
)
# The tier switch's known-bad designs (issue 23), kept apart from KNOWN_BAD (the ones injected into the guard)
TIERS_KNOWN_BAD: tuple[Design, ...] = (
    _known_bad(
        TIERS_RETRACT_CATCH_UP, name="tiers_reserve_by_current_tier", expected_invariant="kv_reserve_covers_writes",
        summary="The tier switch with the reserve sized for the tier in force at prepare_for_decode: the switch to a "
        "larger tier applies at the top of the forward, after the top-up, and its verify writes past the reserve.",
        source="issue 23; sglang PR #24055 (the same fault in SGLang's adaptive switch)",
        kv_reserve=KvReserve.CURRENT_STATE,
    ),
    _known_bad(
        TIERS_RETRACT_CATCH_UP, name="tiers_no_catch_up_at_flip_on", expected_invariant="draft_kv_covers_prefix",
        summary="The tier switch with no draft work while off and no retraction at flip-on: the next tier drafts "
        "over a draft KV that misses every token decoded plain.",
        source="issue 23; vLLM PR #4592, TRT-LLM PR #16888",
        draft_while_off=DraftWhileOff.NONE,
    ),
)

# What each known-bad design changed one field of (tests check that exactly one model field differs).
KNOWN_BAD_BASES: dict[str, Design] = {
    "seeds_final_verify_graphs_only": SEEDS_FINAL,
    "seeds_attempt1_spec_info_left": SEEDS_FINAL,
    "seeds_attempt2_tuple_unpack": SEEDS_FINAL,
    "clear_on_scheduler_batch": SEEDS_FINAL,
    "zero_steps_skip_draft_extend": ADAPTIVE_WARM,
    "kv_reserve_by_current_steps": ADAPTIVE_WARM,
    "merge_unchecked_spec_info": CATCH_UP,
    "draft_kv_never_freed": ADAPTIVE_WARM,
    "reenable_above_spec_cap": CATCH_UP,
    "no_draft_work_while_off": CATCH_UP,
    "seq_lens_advanced_twice": CATCH_UP,
}
TIERS_KNOWN_BAD_BASES: dict[str, Design] = {d.name: TIERS_RETRACT_CATCH_UP for d in TIERS_KNOWN_BAD}

# The radix cache's known-bad designs (issue 24): refuted by the checker and shown on real 0.5.23 objects
# (tests/test_switch_retract.py, the tree without the switch's skip_radix_cache_insert). The guard catches the first
# on real objects (it is SGLang's own tree; tests/test_guard_tree_draft.py); the other two change the tree itself, which
# no SGLang line does, so only KNOWN_BAD are injected by tests/test_guard_sglang.py
RADIX_KNOWN_BAD: tuple[Design, ...] = (
    _known_bad(
        RETRACT_CATCH_UP_RADIX, name="retract_catch_up_radix_unmarked",
        tree_draft=TreeDraft.IGNORED,
        summary="plain_off_retract_catch_up with SGLang's radix cache as it is: prompts prefilled while off are "
        "checkpointed into the tree with target KV and no draft KV; after flip-on a request hitting them (a retracted "
        "request's own re-prefill too) drafts over slots the draft never wrote.",
        source="issue 24; docs/throughput-plan.md (catch-up by retraction); sglang 0.5.23 mem_cache/common.py "
        "checkpoint_kv_cache, mem_cache/radix_cache.py RadixCache.checkpoint",
        expected_invariant="draft_kv_covers_prefix",
    ),
    _known_bad(
        RETRACT_CATCH_UP_RADIX, name="retract_catch_up_radix_match_stops",
        tree_draft=TreeDraft.MATCH_STOPS_AT_MISSING,
        summary="The radix cache marks each token with whether its draft KV was written and a match with speculation "
        "on stops at the first unmarked one, but the checkpoint after the prefill finds the recomputed tokens already "
        "in the tree and repoints the request at the tree's unmarked slots (freeing its own).",
        source="issue 24; sglang 0.5.23 mem_cache/radix_cache.py RadixCache.checkpoint (req_to_token rewritten to the "
        "tree's indices)",
        expected_invariant="draft_kv_covers_prefix",
    ),
    _known_bad(
        RETRACT_CATCH_UP_RADIX, name="retract_catch_up_radix_evict_at_flip_on",
        tree_draft=TreeDraft.EVICT_AT_FLIP_ON,
        summary="The radix cache marks each token with whether its draft KV was written and flip-on evicts the "
        "unmarked ones, but a request already done at flip-on (left to finish) still locks its unmarked prompt: it "
        "cannot be evicted and the next request hits it.",
        source="issue 24; sglang 0.5.23 mem_cache/radix_cache.py (locked nodes are not evictable)",
        expected_invariant="draft_kv_covers_prefix",
    ),
)

# Known-bad designs that give a model invariant a refutation where no other known-bad design does (issue 51: an
# invariant made to hold always must fail `specflip check`; tests/test_known_bad_coverage.py holds every invariant to
# one). Checked by the checker only: not injected into real objects by tests/test_guard_sglang.py.
INVARIANT_KNOWN_BAD: tuple[Design, ...] = (
    _known_bad(
        RETRACT_CATCH_UP, name="retract_drops_output", expected_invariant="committed_never_lost",
        summary="The catch-up by retraction with the retracted request started again from its prompt: its output "
        "is dropped (a re-queue that resets output_ids, or an abort and resubmit), so tokens already committed and "
        "streamed are taken back and generated a second time.",
        source="issue 51 (committed_never_lost had no known-bad design); sglang 0.5.23 Req.reset_for_retract "
        "keeps output_ids",
        retract_keeps_output=False,
    ),
    _known_bad(
        CATCH_UP, name="merge_drops_last_chunked", expected_invariant="requests_in_one_place",
        summary="The prefilled batch, as it joins the running batch, leaves out the request whose last chunk it just "
        "prefilled (the scheduler's exclusion of its chunked request still names it): the request keeps its KV and "
        "its first token, and is never decoded again.",
        source="issue 51 (a live request dropped from the prefilled batch as it becomes the running batch, found by "
        "the guard's mutants, docs/mutation.md); sglang 0.5.23 Scheduler.get_next_batch_to_run excludes the chunked "
        "request from the prefilled batch by identity (`reqs_to_exclude`)",
        merge_drops_last_chunked=True,
    ),
)
INVARIANT_KNOWN_BAD_BASES: dict[str, Design] = {"retract_drops_output": RETRACT_CATCH_UP,
                                                "merge_drops_last_chunked": CATCH_UP}

ALL_DESIGNS: tuple[Design, ...] = (SHIPPED + CANDIDATES + KNOWN_BAD + RADIX_KNOWN_BAD + TIERS_KNOWN_BAD
                                   + INVARIANT_KNOWN_BAD)


def _with_v2_reserve(design: Design) -> Design:
    # a design that releases the reserve at flip-off must not flip with a verify in flight
    return attrs.evolve(
        design, name=f"{design.name}_overlap", kv_reserve=KvReserve.TWICE_LARGEST,
        flip_waits_for_results=design.release_reserve_at_flip_off and not design.is_adaptive,
        summary=f"{design.name} under the overlap schedule, with the reserve SGLang's eagle_prepare_for_decode "
        "takes (committed + 2 x (steps + 1), both loops): " + design.summary,
        source=f"{design.source}; sglang 0.5.16 speculative/eagle_utils.py eagle_prepare_for_decode, "
        "managers/scheduler.py event_loop_overlap",
    )


# Checked under Scope(overlap=True) (`specflip check --overlap`): the v2 designs (the overlap loop is a
# v2 worker thing) with SGLang's double reserve, and the known-bad ones that only the overlap loop refutes.
OVERLAP_SHIPPED: tuple[Design, ...] = tuple(
    _with_v2_reserve(d) for d in (CATCH_UP, SYNC_V2, V2_SWITCH, ADAPTIVE_WARM, RETRACT_CATCH_UP, AUTO_RETRACT_CATCH_UP,
                                  TIERS_RETRACT_CATCH_UP))
OVERLAP_KNOWN_BAD: tuple[Design, ...] = (
    attrs.evolve(
        V2_SWITCH, name="reserve_1x_under_overlap", kind=DesignKind.KNOWN_BAD,
        summary="v2_switch_reserve_sync with a reserve of steps + 1 under the overlap schedule: step N+1 is "
        "prepared before step N's accepts reach the host, so its reserve is topped up from the stale committed "
        "length and N+1's verify writes past it.",
        source="docs/overlap-plan.md; sglang 0.5.16 speculative/allocation_sizing.py (the 2x comment)",
        expected_invariant="kv_reserve_covers_writes",
    ),
)
OVERLAP_KNOWN_BAD += (
    attrs.evolve(
        _with_v2_reserve(CATCH_UP), name="flip_off_with_verify_in_flight", kind=DesignKind.KNOWN_BAD,
        flip_waits_for_results=False,
        summary="plain_off_catch_up under the overlap schedule with SGLang's double reserve, flipping as soon as "
        "the policy says: the flip decides in update_running_batch while step N's verify is unprocessed, and "
        "releasing the reserve at flip-off frees the slots that verify writes.",
        source="docs/overlap-plan.md (flips with a round in flight); shim/switch/v2.py",
        expected_invariant="kv_reserve_covers_writes",
    ),
)
# Issue 22: the v1 switch with its plain steps in the overlap loop (shim/switch/v1_loop.py, SPECFLIP_V1_LOOP=overlap).
# The v1 worker cannot overlap a speculative step, so every speculative iteration runs as the normal loop's (its
# result processed before the next step is prepared), and the reserve stays v1's; a plain step overlaps as on a plain
# server, and a flip processes the result in flight first (its retraction releases the slots that step writes).
V1_OVERLAP_PLAIN = attrs.evolve(
    V1_RETRACT_CATCH_UP,
    name="v1_plain_off_retract_catch_up_overlap_plain",
    summary="v1_plain_off_retract_catch_up in specflip's v1 loop (SPECFLIP_V1_LOOP=overlap): speculative iterations "
    "as SGLang's normal loop runs them (the v1 EAGLEWorker cannot overlap), plain iterations as its overlap loop "
    "(step N+1 prepared and launched before step N's result is processed); a flip first processes the result in "
    "flight.",
    source="shim/switch/v1_loop.py; sglang 0.5.12 managers/scheduler.py event_loop_normal, event_loop_overlap",
    flip_waits_for_results=True,
    overlap_spec_steps=False,
)
OVERLAP_CANDIDATES: tuple[Design, ...] = (V1_OVERLAP_PLAIN,)
OVERLAP_KNOWN_BAD += (
    attrs.evolve(
        V1_OVERLAP_PLAIN, name="v1_overlap_spec_steps", kind=DesignKind.KNOWN_BAD, overlap_spec_steps=True,
        summary="v1_plain_off_retract_catch_up_overlap_plain with the speculative steps overlapped too, on the v1 "
        "worker's reserve: step N+1 is prepared before step N's accepts reach the host.",
        source="shim/switch/v1_loop.py (why speculative iterations run without overlap)",
        expected_invariant="kv_reserve_covers_writes",
    ),
    attrs.evolve(
        V1_OVERLAP_PLAIN, name="v1_overlap_flip_on_in_flight", kind=DesignKind.KNOWN_BAD,
        flip_waits_for_results=False,
        summary="v1_plain_off_retract_catch_up_overlap_plain flipping on while a plain step's result is in flight: "
        "the flip clears the scheduler's enable_overlap, 0.5.12 then processes that result without skipping the "
        "requests the flip retracted, and a re-prefilled request gets the step's token a second time.",
        source="shim/switch/v1_loop.py (why a flip processes the result in flight first); sglang 0.5.12 "
        "managers/scheduler_output_processor_mixin.py process_batch_result_decode",
        expected_invariant="result_not_after_reprefill",
    ),
)
OVERLAP_DESIGNS: tuple[Design, ...] = OVERLAP_SHIPPED + OVERLAP_CANDIDATES + OVERLAP_KNOWN_BAD


def overlap_scope(design: Design) -> Scope:
    """The scope an overlap design is checked in: the default one with the overlap schedule. The adaptive
    design's double reserve for its largest tier (6 slots a request) leaves no two requests room to run its
    steps-0 tier in 11 slots; 15 lets them (the zero_step sometimes-property needs it)."""
    return Scope(overlap=True, kv_pool_size=15 if design.is_adaptive else Scope().kv_pool_size)


def large_scope(design: Design, overlap: bool = False) -> Scope:
    """A scope beyond what BFS exhausts, for random walks only (`specflip check --simulate N --scope large`): six
    requests with prompts of 1 to 4 tokens and 2 to 4 new ones, caps of 3 running with speculation and 5 without,
    CUDA graphs for 1, 2 and 4, a pool of 16 slots (retraction still happens), 4 more for the adaptive designs'
    double reserve as in `overlap_scope`."""
    return Scope(requests=(RequestSpec(3, 4), RequestSpec(1, 3), RequestSpec(2, 2), RequestSpec(1, 2),
                           RequestSpec(4, 3), RequestSpec(2, 4)),
                 kv_pool_size=20 if design.is_adaptive else 16, spec_cap=3, plain_cap=5,
                 graph_capture_sizes=(1, 2, 4), overlap=overlap)
DESIGNS_BY_NAME: dict[str, Design] = {d.name: d for d in ALL_DESIGNS + OVERLAP_DESIGNS}


def get_design(name: str) -> Design:
    """A design by name, with a clear error listing the known names."""
    try:
        return DESIGNS_BY_NAME[name]
    except KeyError:
        raise KeyError(f"no design named {name!r}; known designs: {', '.join(DESIGNS_BY_NAME)}") from None
