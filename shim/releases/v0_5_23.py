"""The SGLang 0.5.23 line (what CI installs). The newest line: `ReleaseLine`'s defaults are its behaviour.

Guard: the v2 worker takes the ScheduleBatch; a Req keeps its KV lengths
in `req.kv` (ReqKvInfo); `release_kv_cache(req, tree_cache, *, checkpoint)`; the tree cache is a
`UnifiedRadixCache` (not `RadixCache`, which 0.5.23 still ships but never builds) whose `checkpoint(req, *,
up_to)` takes a running request's KV into the tree.

Lint (`specflip lint`, read with SGLang's own sizing functions):
`specflip lint` for SGLang 0.5.23: build the real `ServerArgs` from launch_server arguments and read what
SGLang sizes at start-up for every speculative runtime state, with SGLang's own sizing functions.

Paths are relative to the installed `sglang/srt/`. Per state, the adapter publishes the resolved config and
moves the spec bag to that state exactly as the adaptive switch does (`EAGLEWorkerV2.apply_runtime_state`:
`get_context().override(..., speculative_num_steps=, speculative_num_draft_tokens=)`), then asks:
  - `mem_cache/allocation_sizing.get_alloc_len_per_decode()`  KV reserve per decode (x2: get_alloc_reserve_per_decode)
  - the graph widths `speculative/spec_utils.resolve_num_tokens_per_req(phase="target_verify" | "draft_extend")`
    derives, read from what it reads (`tokens_per_req`: the spec bag's draft tokens, and
    `SpeculativeAlgorithm.get_num_tokens_per_req_for_target_verify`); importing spec_utils itself costs about 1 s
    (grammar backend, OpenAI protocol models) of a cold lint, and tests/test_lint.py checks the two agree
  - `speculative/adaptive_spec_params.AdaptiveSpeculativeParams.cuda_graph_bs_for_step`  graphs captured per state
  - `speculative/adaptive_spec_params.adaptive_unsupported_reason`  SGLang's refusal of adaptive
The logits-buffer size follows `model_executor/model_runner.ModelRunner.max_decode_logits_rows` (max over the
launch draft-token bound and every adaptive tier of max(capture_bs) x width); its capture-bs list follows
`model_executor/runner/base_cuda_graph_runner.get_batch_sizes_to_capture` (`sizing.graph_batch_sizes`: decode bs
clamped to the request pool, which is max_running_requests // attn_dp_size, and aligned at each state's verify width
to SGLang's own `utils/common.get_cuda_graph_batch_size_alignment()`, the attention TP size where the attention input
is gathered, read from the published config).
"""

from __future__ import annotations

from typing import Any

from shim.releases.base import ReleaseLine
from shim.releases.guard_hooks import V2Adapter
from shim.releases.server_args import LintInputError, quiet, silence_again
from shim.releases.sizing import Sizing, SpecflipPolicy, StepSizing, graph_batch_sizes, request_pool

_SB = "sglang.srt.managers.schedule_batch.ScheduleBatch"
_V2 = "sglang.srt.speculative.eagle_worker_v2"
_BRP = "sglang.srt.managers.scheduler_components.batch_result_processor"
_ALLOC = "sglang.srt.mem_cache.allocator.base.BaseTokenToKVPoolAllocator"  # free groups: the base's, not overridden


class Adapter(V2Adapter):
    release = "0.5.23"
    PLAIN_RESULT_TAKES_READING = True  # V2Adapter._result_reading: event_loop_overlap's order, read in 0.5.23's source
    TARGETS = (
        (f"{_SB}.prepare_for_extend", "AROUND", "around_prepare_for_extend"),
        (f"{_SB}.prepare_for_decode", "AFTER", "after_prepare_for_decode"),
        (f"{_SB}.merge_batch", "AROUND", "around_merge_batch"),
        (f"{_SB}.filter_batch", "AROUND", "around_filter_batch"),
        ("sglang.srt.mem_cache.common.release_kv_cache", "AROUND", "around_release_kv_cache"),
        # the tree a 0.5.23 server builds (mem_cache/registry.default_radix_cache_factory), enabled or not
        ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.checkpoint", "AROUND", "around_tree_cache_keep"),
        # the positions an insert creates in the tree, marked with the inserting request's draft coverage (issue 24)
        ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.insert", "AROUND", "around_tree_insert"),
        # its eviction (`evict` and `evict_for_alloc` both run `_evict`): the per-leaf frees judged by one scan
        ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache._evict", "AROUND", "around_tree_evict"),
        ("sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation", "BEFORE", "before_target_forward"),
        (f"{_V2}.EagleDraftWorker.draft", "BEFORE", "before_draft"),
        (f"{_V2}.EAGLEWorkerV2._build_trivial_verify_input", "BEFORE", "before_trivial_verify_input"),
        (f"{_V2}.EAGLEWorkerV2.verify", "BEFORE", "before_verify"),
        (f"{_V2}.EagleDraftWorker._draft_extend_for_decode", "BEFORE", "before_draft_extend_for_decode"),
        (f"{_V2}.EAGLEWorkerV2._stub_skipped_draft_extend", "BEFORE", "before_stub_skipped_draft_extend"),
        (f"{_V2}.EAGLEWorkerV2.apply_runtime_state", "AFTER", "after_apply_runtime_state"),
        # a decode result's processing, right after _resolve_spec_v2_tokens (spec) or the plain token listing:
        # the overlap schedule's process_result (a no-op in the normal loop)
        (f"{_BRP}.SchedulerBatchResultProcessor._normalize_decode_outputs", "AFTER",
         "after_normalize_decode_outputs"),
        # TP > 1: the ranks agree on the planned step before it runs (shim/guard/rank_check.py; TP 1: a no-op)
        ("sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run", "AFTER", "after_get_next_batch_to_run"),
        # the row positions a release or a switch's flip frees (issue 18; recorded only inside those steps), and a
        # free of a copy of row values judged by value (issue 51)
        ("sglang.srt.mem_cache.allocator.token.TokenToKVPoolAllocator.free", "BEFORE", "before_allocator_free"),
        # the slots an alloc hands out, against the live rows' slots by value (issue 51; shim/guard/slot_values.py)
        ("sglang.srt.mem_cache.allocator.token.TokenToKVPoolAllocator.alloc", "AFTER", "after_allocator_alloc"),
        # the error a slot-value check's device assert raises, met anywhere in the loop: its finding is raised from it
        ("sglang.srt.managers.scheduler.Scheduler.run_event_loop", "AROUND", "around_event_loop"),
        # the scheduler's start-up, before the model worker is built: whether the guard checks this configuration
        ("sglang.srt.managers.scheduler.Scheduler.init_model_worker", "BEFORE", "before_init_model_worker"),
        # the launching process, after SGLang checked the server arguments and before any scheduler process starts:
        # assert mode on a configuration the guard does not check stops the launch there (one line, no traceback)
        ("sglang.srt.server_args.ServerArgs.check_server_args", "AFTER", "after_check_server_args"),
        # the free group one result's processing releases its finished requests in: their finishes are checked as
        # one step at its end (Guard.end_release_group), after SGLang streamed their outputs
        (f"{_ALLOC}.free_group_begin", "AFTER", "after_free_group_begin"),
        (f"{_ALLOC}.free_group_end", "BEFORE", "before_free_group_end"),
    )

    def req_kv_lens(self, req: Any) -> tuple[bool, int, int, int]:
        kv = req.kv
        if kv is None or kv.req_pool_idx is None:
            return False, 0, 0, 0
        return True, int(kv.kv_committed_len), int(kv.kv_allocated_len), int(kv.cache_protected_len)

    def req_row(self, req: Any) -> int | None:
        kv = req.kv
        return None if kv is None else kv.req_pool_idx

    def tp_rank(self) -> int:
        from sglang.srt.runtime_context import get_parallel

        try:
            return int(get_parallel().tp_rank)
        except RuntimeError:  # not written in this process (single-process use, tests)
            return 0

    def server_args(self) -> Any:
        from sglang.srt.runtime_context import get_server_args

        try:
            return get_server_args()
        except Exception:  # noqa: BLE001 - not published: run with what the live objects say
            return None


# --- lint: what this line sizes at start-up ------------------------------------------------------------


def read_sizing(line: ReleaseLine, server_args: Any, specflip: SpecflipPolicy | None = None, *,
                republish: bool = True) -> Sizing:
    """What SGLang 0.5.23 sizes at start-up for every runtime state of a resolved `ServerArgs`.

    `republish=False` (inside a running server): use the config already published; the spec bag is moved
    through the states and put back as it was.
    """
    from sglang.srt import runtime_context
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_len_per_decode
    from sglang.srt.speculative.adaptive_spec_params import (
        AdaptiveSpeculativeParams,
        _load_adaptive_config,
        adaptive_unsupported_reason,
    )
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.utils.common import get_cuda_graph_batch_size_alignment

    cfg = resolving_view(server_args)
    if cfg.speculative_algorithm is None:
        raise LintInputError("no --speculative-algorithm: nothing switches, nothing to lint")
    refusals: list[str] = []
    adaptive = bool(cfg.speculative_adaptive)
    if bool(getattr(server_args, "speculative_adaptive", False)) and not adaptive:
        reason = adaptive_unsupported_reason(server_args)
        refusals.append(f"SGLang drops --speculative-adaptive: {reason or 'disabled during resolution'}; "
                        "the server runs the static launch parameters")
    algo = SpeculativeAlgorithm.from_string(cfg.speculative_algorithm)
    topk = int(cfg.speculative_eagle_topk or 1)
    launch_steps = int(cfg.speculative_num_steps)
    launch_draft = int(cfg.speculative_num_draft_tokens)
    max_running = int(cfg.max_running_requests)
    if republish:
        with quiet():  # publish logs the overrides a previous lint left behind
            runtime_context.publish(server_args, role="scheduler")
        line.stamp_derived_widths(server_args)
    # the graphs' batch-size alignment, SGLang's own from the published config (the attention TP size where the
    # attention input is gathered, e.g. DP attention); the launch state's target graphs are captured at its width
    alignment = int(get_cuda_graph_batch_size_alignment())
    capture_bs = _capture_bs(cfg, max_running, alignment, tokens_per_req("target_verify", algo, launch_draft))

    tiers: tuple[tuple[int, tuple[int, ...]], ...] = ()
    policy = None
    if adaptive:
        _, entries = _load_adaptive_config(cfg.speculative_adaptive_config)
        tiers = tuple((bs, tuple(sorted(set(e["candidate_steps"])))) for bs, e in sorted(entries.items()))
        with quiet():
            policy = AdaptiveSpeculativeParams(launch_steps, cfg.speculative_adaptive_config)
            policy.set_cuda_graph_bs(capture_bs or None)
        state_steps = sorted({s for _, steps in tiers for s in steps})
    else:
        state_steps = [launch_steps]

    ctx = runtime_context.get_context()
    spec = runtime_context.get_spec()
    saved = {"speculative_num_steps": spec.speculative_num_steps,
             "speculative_num_draft_tokens": spec.speculative_num_draft_tokens}
    states = []
    try:
        for steps in state_steps:
            draft = steps + 1 if adaptive else launch_draft  # AdaptiveController.init_states: steps + 1
            ctx.override("specflip.lint", speculative_num_steps=steps, speculative_num_draft_tokens=draft)
            verify_width = tokens_per_req("target_verify", algo, draft)
            if policy is not None:
                # the state's own target runner (build_adaptive_runtime_state) captures its pruned list at its width
                graph_bs = tuple(graph_batch_sizes(policy.cuda_graph_bs_for_step(steps), request_pool(cfg, max_running),
                                                   alignment=alignment, width=verify_width,
                                                   two_batch_overlap=_two_batch_overlap(cfg)))
            else:
                graph_bs = tuple(capture_bs)
            states.append(StepSizing(
                steps=steps, draft_tokens=draft, alloc_len=int(get_alloc_len_per_decode()),
                verify_width=verify_width,
                draft_extend_width=tokens_per_req("draft_extend", algo),
                graph_bs=graph_bs))
        logits_rows = _logits_rows(cfg, algo, capture_bs, [s.draft_tokens for s in states] if adaptive else [],
                                   runtime_context.max_speculative_num_draft_tokens(), max_running, alignment)
    finally:
        ctx.override("specflip.lint.restore", **saved)

    return Sizing(
        release=line.version, algorithm=cfg.speculative_algorithm, topk=topk, launch_steps=launch_steps,
        launch_draft_tokens=launch_draft, overlap=not bool(cfg.disable_overlap_schedule),
        max_running_requests=max_running, logits_rows=logits_rows, states=tuple(states), adaptive=adaptive,
        tiers=tiers, refusals=tuple(refusals),
        skip_zero_step_draft_extend=bool(envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.get()), specflip=specflip)


def _capture_bs(cfg: Any, max_running: int, alignment: int = 1, width: int = 1) -> list[int]:
    """Decode graph batch sizes (base_cuda_graph_runner.get_batch_sizes_to_capture: `sizing.graph_batch_sizes`) of a
    runner capturing `width` tokens per request, with the graphs' batch-size `alignment`; [] when graphs are off."""
    from sglang.srt.model_executor.cuda_graph_config import Backend

    graph_cfg = cfg.cuda_graph_config
    if cfg.disable_cuda_graph or graph_cfg is None or graph_cfg.decode.backend == Backend.DISABLED:
        return []
    return graph_batch_sizes(graph_cfg.decode.bs, request_pool(cfg, max_running), alignment=alignment, width=width,
                             two_batch_overlap=_two_batch_overlap(cfg))


def _two_batch_overlap(cfg: Any) -> bool:
    return bool(getattr(cfg, "enable_two_batch_overlap", False))


def _logits_rows(cfg: Any, algo: Any, capture_bs: list[int], tier_draft_tokens: list[int],
                 max_draft: int | None, max_running: int | None = None, alignment: int = 1) -> int:
    """ModelRunner.max_decode_logits_rows: the launch bound and every adaptive tier, each at its own width
    (get_batch_sizes_to_capture at that width) x the width."""
    if not capture_bs:
        return 0
    rows = 0
    for d in [max_draft or 1, *tier_draft_tokens]:
        width = tokens_per_req("target_verify", algo, d)
        sizes = capture_bs if max_running is None else _capture_bs(cfg, max_running, alignment, width)
        rows = max(rows, max(sizes, default=0) * width)
    return rows


def tokens_per_req(phase: str, algo: Any, num_draft_tokens: int | None = None) -> int:
    """`speculative/spec_utils.resolve_num_tokens_per_req(phase=...)` for the target's graphs (not a draft
    worker), read from what it reads: the published spec bag and the algorithm's own target-verify hook.
    spec_utils is not imported for it: its module imports (grammar backend, OpenAI protocol models, the
    speculative kernels) cost about 1 s of a cold lint, and its function is these lines.
    tests/test_lint.py::test_tokens_per_req_is_sglangs_resolve_num_tokens_per_req holds the two together."""
    from sglang.srt.runtime_context import get_spec

    spec = get_spec()
    if phase == "draft_extend":
        return int(spec.speculative_num_draft_tokens)
    if phase == "target_verify":
        draft = spec.speculative_num_draft_tokens if num_draft_tokens is None else num_draft_tokens
        return int(algo.get_num_tokens_per_req_for_target_verify(draft, False))
    raise ValueError(f"lint reads no {phase!r} width")


class Line(ReleaseLine):
    """0.5.23: a Req keeps its row and KV lengths in `req.kv`; the future map has no lazy sizing flag; the draft's TP
    context is a module function over its parallel layout (ReleaseLine's defaults)."""

    version = "0.5.23"
    adapter_class = Adapter
    # SGLang 0.5.23 pins torch 2.14.1: it cannot run on the device image (torch 2.11.0), so CPU only
    verified = (
        ("guard", "CPU, real 0.5.23 objects in CI (tests/test_guard_sglang.py, tests/test_guard_adapters.py)"),
        ("switch", "CPU, real 0.5.23 objects in CI (tests/test_switch_*.py, tests/test_replay.py; the launching "
                   "process with the warm-up named: tests/test_release_conformance.py); no GPU run"),
        ("step_timer", "CPU, real 0.5.23 hook registry in CI (tests/test_step_timer.py)"),
        ("lint", "CPU, real 0.5.23 ServerArgs in CI (tests/test_lint.py)"),
    )


    # --- lint ---------------------------------------------------------------------------------------------

    def resolve_server_args(self, argv: list[str], verbose: bool) -> Any:
        """`prepare_server_args`, then `resolve_once` (0.5.23 resolves into published config bags)."""
        from sglang.srt.server_args import prepare_server_args

        server_args = prepare_server_args(argv)
        silence_again(verbose)  # prepare_server_args re-configured logging
        server_args.resolve_once()
        return server_args

    def launch_view(self, server_args: Any) -> Any:
        """The resolved view: 0.5.23 keeps resolved values in its bags."""
        from sglang.srt.arg_groups.overrides import resolving_view

        return resolving_view(server_args)

    def stamp_derived_widths(self, server_args: Any) -> None:
        """After lint published `server_args` in its own process: the parallel widths no flag sets (the attention TP
        size, ...), which the graphs' batch-size alignment reads. From 0.5.20 `publish` computes them from the
        resolved config: nothing to do."""

    # this module's functions, called as methods: the line is their first argument (a later line inherits them)
    read_sizing = read_sizing


LINE = Line()
