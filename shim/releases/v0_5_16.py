"""The SGLang 0.5.16 line (the GPU host, torch 2.11), as it differs from 0.5.23.

Guard: the v2 worker takes the ScheduleBatch (no ModelWorkerBatch);
a Req keeps `kv_committed_len`, `req_pool_idx` and `cache_protected_len` on itself and only
`kv_allocated_len` in `req.kv` (ReqKvInfo, None while no row is held); `release_kv_cache(req, tree_cache,
is_insert=True)`. Hook targets are the same dotted paths as 0.5.23 (checked against the 0.5.16 wheel's
source by tests/test_guard_adapters.py where that source is unpacked).

Lint, transcribed from the 0.5.16 wheel's source (read, not installed here):
`specflip lint` for SGLang 0.5.16, transcribed from the 0.5.16 wheel's source (read, not installed here).

0.5.16 resolves ServerArgs in `__post_init__` (plain attributes, no published config bags), so the sizing is a
pure function of those attributes. What 0.5.16 sizes (paths relative to `sglang/srt/` of the 0.5.16 wheel):
  - KV reserve: `mem_cache/allocation_sizing.get_alloc_len_per_decode(server_args)` =
    max(steps * topk, server_args.max_speculative_num_draft_tokens) (page 1 or topk 1), where
    `server_args.max_speculative_num_draft_tokens` (server_args.py ~L7523) is max(candidate_steps) + 1 under
    --speculative-adaptive: the largest state, as in 0.5.23. x2 in get_alloc_reserve_per_decode.
  - Logits buffer: `model_executor/model_runner.ModelRunner.max_decode_logits_rows` (~L722) =
    max(capture_bs) x decode_num_tokens_per_req() of the LAUNCH draft-token count only (0.5.23 takes the max
    over every adaptive tier); `model_executor/graph_shared_output.GraphSharedOutput.get_logits_buffer` asserts
    rows <= max_rows (sglang #30549).
  - Graphs per adaptive state: EVERY candidate state is captured at start-up at the whole decode capture list.
    `speculative/adaptive_runtime_state.AdaptiveController.init_states` builds each candidate, passing
    `AdaptiveSpeculativeParams.cuda_graph_bs_for_step(steps)`, but that is None unless `--cuda-graph-bs` was given
    (`eagle_worker_v2` passes `server_args.cuda_graph_bs_decode`, unset by default), and when given,
    `EAGLEWorkerV2._override_worker_state` overrides `cuda_graph_bs_decode` while the runners read
    `cuda_graph_config.decode.bs`, resolved once in `__post_init__` (`model_executor/runner/
    base_cuda_graph_runner.get_batch_sizes_to_capture`). So the tier routing prunes nothing: a candidate wider
    than the launch width asserts in `GraphSharedOutput.get_logits_buffer` during capture (seen on the H200:
    default tiers, launch steps 3, died at start-up; launch steps 7 / 8 draft tokens started). Default tiers
    `DEFAULT_ADAPTIVE_CONFIG` = bs1 [1,3,7], bs8 [0,1,3], bs32 [0,1], bs64 [0]; launch steps
    candidate_steps[len // 2] (`arg_groups/speculative_hook.py` ~L750).
  - Refusals: `adaptive_unsupported_reason` (topk != 1, dp attention, multi-layer EAGLE, TBO, PD-mux).
This module is not exercised against an installed 0.5.16 in CI; `sizing_from_values` is, on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shim.releases import v0_5_23
from shim.releases.base import ReleaseLine, prefix_slots_chunk
from shim.releases.guard_hooks import V2Adapter
from shim.releases.server_args import LintInputError, given_flag
from shim.releases.sizing import (
    Sizing,
    SpecflipPolicy,
    StepSizing,
    attention_tp_size,
    graph_batch_sizes,
    request_pool,
)

Adapter0523 = v0_5_23.Adapter


class Adapter(V2Adapter):
    release = "0.5.16"
    PLAIN_RESULT_TAKES_READING = True  # V2Adapter._result_reading: checked against 0.5.16's source where it is unpacked
    # 0.5.23's targets, but the radix cache's prompt insertion is still called cache_unfinished_req here
    # and its tree is RadixCache, whose eviction deletes leaves in Python: the guard forgets them there
    TARGETS = tuple(
        ("sglang.srt.mem_cache.radix_cache.RadixCache.cache_unfinished_req", how, hook)
        if hook == "around_tree_cache_keep"
        else ("sglang.srt.mem_cache.radix_cache.RadixCache.insert", how, hook) if hook == "around_tree_insert"
        else ("sglang.srt.mem_cache.radix_cache.RadixCache.evict", how, hook) if hook == "around_tree_evict"
        else (target, how, hook)
        for target, how, hook in Adapter0523.TARGETS) + (
        ("sglang.srt.mem_cache.radix_cache.RadixCache._delete_leaf", "BEFORE", "before_tree_delete_leaf"),)

    def req_namespace(self, req: Any) -> Any:
        return req.extra_key, None  # 0.5.16's RadixKey has no cache_salt of its own

    def key_namespace(self, key: Any) -> Any:
        return key.extra_key, None

    def req_kv_lens(self, req: Any) -> tuple[bool, int, int, int]:
        kv = req.kv
        if kv is None or req.req_pool_idx is None:
            return False, 0, 0, 0
        return True, int(req.kv_committed_len), int(kv.kv_allocated_len), int(req.cache_protected_len)

    def req_row(self, req: Any) -> int | None:
        return req.req_pool_idx

    def tp_rank(self) -> int:
        from sglang.srt.runtime_context import get_parallel

        try:
            return int(get_parallel().tp_rank)
        except (RuntimeError, AttributeError, AssertionError):  # not written in this process (0.5.16's
            return 0  # get_tp_group asserts its group is set up: no TP group yet, at start-up)

    def server_args(self) -> Any:
        from sglang.srt.server_args import get_global_server_args

        try:
            return get_global_server_args()
        except Exception:  # noqa: BLE001 - not published yet: run with what the live objects say
            return None


# --- lint: what this line sizes at start-up ------------------------------------------------------------


DEFAULT_ADAPTIVE_TIERS: tuple[tuple[int, tuple[int, ...]], ...] = (
    (1, (1, 3, 7)), (8, (0, 1, 3)), (32, (0, 1)), (64, (0,)))


def spec_decode_capture_bs(max_bs: int) -> list[int]:
    """`generate_decode_cuda_graph_batch_sizes`, speculative branch (identical in 0.5.16 and 0.5.23)."""
    bs = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + list(range(72, 257, 8))
          + list(range(272, max_bs + 1, 16)))
    bs = [b for b in bs if b <= max_bs]
    return bs if max_bs in bs else [*bs, max_bs]


def sizing_from_values(line: ReleaseLine, *, algorithm: str = "EAGLE", topk: int = 1, steps: int | None = None,
                       draft_tokens: int | None = None, adaptive: bool = False,
                       tiers: Sequence[tuple[int, Sequence[int]]] = DEFAULT_ADAPTIVE_TIERS,
                       max_running_requests: int = 48, capture_bs: Sequence[int] | None = None,
                       overlap: bool = True, refusals: Sequence[str] = (),
                       skip_zero_step_draft_extend: bool = False,
                       specflip: SpecflipPolicy | None = None, graph_pool: int | None = None,
                       graph_alignment: int = 1, two_batch_overlap: bool = False) -> Sizing:
    """0.5.16's start-up sizing from resolved values (what its ServerArgs attributes hold). The target's graphs:
    `sizing.graph_batch_sizes` of `capture_bs` over one scheduler's request pool (`graph_pool`, default
    max_running_requests), aligned to `graph_alignment` (`Line.graph_alignment`) at each state's verify width (per
    request under `two_batch_overlap`)."""
    tiers = tuple((bs, tuple(sorted(set(s)))) for bs, s in sorted(tiers))
    candidates = sorted({s for _, st in tiers for s in st})
    if adaptive:
        steps = candidates[len(candidates) // 2] if steps is None else steps
        draft_tokens = steps + 1
        max_draft = max(candidates) + 1
    else:
        if steps is None or draft_tokens is None:
            raise LintInputError(f"{line.version} static speculation needs --speculative-num-steps and "
                                 "-num-draft-tokens")
        max_draft = draft_tokens
    listed = spec_decode_capture_bs(max_running_requests) if capture_bs is None else capture_bs
    pool = max_running_requests if graph_pool is None else graph_pool

    def graphs(width: int) -> list[int]:  # get_batch_sizes_to_capture of a runner capturing `width` per request
        return graph_batch_sizes(listed, pool, alignment=graph_alignment, width=width,
                                 two_batch_overlap=two_batch_overlap)

    states = []
    for s in (candidates if adaptive else [steps]):
        d = s + 1 if adaptive else draft_tokens
        alloc_len = max(s * topk if s else topk, max_draft)  # `speculative_num_steps or 1`
        # every state at the whole list (the tier pruning never reaches the capture), aligned at its own width
        states.append(StepSizing(steps=s, draft_tokens=d, alloc_len=alloc_len, verify_width=d,
                                 draft_extend_width=d, graph_bs=tuple(graphs(d))))
    logits_rows = max(graphs(draft_tokens), default=0) * draft_tokens  # launch width only
    return Sizing(release=line.version, algorithm=algorithm, topk=topk, launch_steps=steps,
                  launch_draft_tokens=draft_tokens,
                  overlap=overlap, max_running_requests=max_running_requests, logits_rows=logits_rows,
                  states=tuple(states), adaptive=adaptive, tiers=tiers if adaptive else (),
                  refusals=tuple(refusals), skip_zero_step_draft_extend=skip_zero_step_draft_extend,
                  specflip=specflip)


def adaptive_reading(sa: Any) -> tuple[list[str], list[tuple[int, Any]]]:
    """(refusals, tiers) of a resolved launch on the lines up to this one: SGLang dropping --speculative-adaptive,
    and the adaptive config's candidate steps per batch size."""
    from sglang.srt.speculative.adaptive_spec_params import _load_adaptive_config, adaptive_unsupported_reason

    if sa.speculative_algorithm is None:
        raise LintInputError("no --speculative-algorithm: nothing switches, nothing to lint")
    refusals = []
    if getattr(sa, "_specflip_given_adaptive", False) and not sa.speculative_adaptive:
        reason = adaptive_unsupported_reason(sa)
        refusals.append(f"SGLang drops --speculative-adaptive: {reason or 'disabled during resolution'}; "
                        "the server runs the static launch parameters")
    _, entries = _load_adaptive_config(sa.speculative_adaptive_config or None)
    return refusals, [(bs, entry["candidate_steps"]) for bs, entry in entries.items()]


def read_sizing(line: ReleaseLine, server_args: Any, specflip: SpecflipPolicy | None = None, *,
                republish: bool = True) -> Sizing:  # pragma: no cover - needs this line installed
    sa = server_args
    refusals, tiers = adaptive_reading(sa)
    from sglang.srt.environ import envs
    from sglang.srt.model_executor.cuda_graph_config import Backend

    decode = sa.cuda_graph_config.decode if getattr(sa, "cuda_graph_config", None) else None
    graphs_off = sa.disable_cuda_graph or decode is None or decode.backend == Backend.DISABLED
    capture_bs = [] if graphs_off else list(decode.bs or [])
    return line.sizing_from_values(
        algorithm=sa.speculative_algorithm, topk=sa.speculative_eagle_topk or 1, steps=sa.speculative_num_steps,
        draft_tokens=sa.speculative_num_draft_tokens, adaptive=bool(sa.speculative_adaptive), tiers=tiers,
        max_running_requests=sa.max_running_requests, capture_bs=capture_bs,
        overlap=not sa.disable_overlap_schedule, refusals=refusals,
        skip_zero_step_draft_extend=bool(envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.get()), specflip=specflip,
        **line.graph_layout(sa, republish=republish))


class Line(v0_5_23.Line):
    """0.5.16 as it differs from 0.5.23 for the switches: the row and the committed length on the Req, `req.kv`
    None without a row; the future map sizes its buffers lazily; retract_all takes server_args; the kept-out chunk's
    end is `extend_range`; the draft's TP context is a per-worker factory over the draft's TP group."""

    version = "0.5.16"
    adapter_class = Adapter
    # the GPU line (the device image's torch 2.11.0); dates from docs/archive/gpu-results.md and its git log
    verified = (
        ("guard", "GPU H200, 2026-11-29 to 2026-12-04: assert mode in the v2 switch's server, replay and sweeps "
                  "(docs/archive/gpu-results.md)"),
        ("guard", "CPU, the hook targets against the 0.5.16 wheel's source (tests/test_guard_adapters.py)"),
        ("switch", "GPU H200, 2026-11-29 to 2026-12-03: the v2 switch and SPECFLIP_SWITCH=auto, greedy-exact sweeps "
                   "at concurrency 1-256 (docs/archive/gpu-results.md)"),
        ("step_timer", "GPU H200, 2026-11-30 to 2026-12-03: the per-step timer in the benchmark servers "
                       "(docs/archive/gpu-results.md)"),
        ("lint", "GPU H200, 2026-12-01: predictions against 71 real start-ups (docs/archive/gpu-results.md; "
                 "bench/gpu/results/lint/)"),
        ("lint", "CPU, the 0.5.16 wheel's source in CI (tests/test_lint_bad_input.py, tests/test_lint_matrix.py)"),
    )
    future_map_sizes_lazily = True
    retract_all_takes_server_args = True

    def kv_row(self, req: Any) -> tuple[int | None, int, int]:
        kv = req.kv
        if kv is None:
            return None, int(req.kv_committed_len), 0
        return req.req_pool_idx, int(req.kv_committed_len), int(kv.kv_allocated_len)

    def advance_kept_out_chunk(self, scheduler: Any, req: Any) -> int:
        # add_chunked_req's range of the chunk that ran
        return prefix_slots_chunk(scheduler, req, req.extend_range.end if req.extend_range is not None else 0)

    def draft_worker_contexts(self, worker: Any) -> list[Any]:
        import sys

        from shim.releases.base import _moe_contexts

        dw = worker.draft_worker
        mod = sys.modules["sglang.srt.speculative.eagle_worker_v2"]
        return [dw.draft_tp_context(dw.draft_runner.tp_group), *_moe_contexts(mod)]

    # --- the switch's warm-up in --warmups ---------------------------------------------------------------------
    # 0.5.16 resolves in ServerArgs.__post_init__ (no resolve_once); the HTTP server reads `server_args.warmups`.
    # The record's post-resolution writer is `ServerArgs.override(source, **fields)`: a plain assignment raises under
    # SGLANG_STRICT_CONFIG_MUTATION here, and always from 0.5.17 on.
    warmup_hook_target = "sglang.srt.server_args.ServerArgs.check_server_args"

    def write_warmups(self, server_args: Any, value: str) -> bool:
        server_args.override("specflip", warmups=value)
        return True


    # --- lint ---------------------------------------------------------------------------------------------

    def resolve_server_args(self, argv: list[str], verbose: bool) -> Any:
        """`prepare_server_args`: 0.5.16 resolves in ServerArgs.__post_init__, into the plain attributes."""
        from sglang.srt.server_args import prepare_server_args

        server_args = prepare_server_args(argv)
        # resolution turns an unsupported --speculative-adaptive off (with a warning lint silences): keep what was given
        object.__setattr__(server_args, "_specflip_given_adaptive", given_flag(argv, "--speculative-adaptive"))
        return server_args

    def launch_view(self, server_args: Any) -> Any:
        return server_args

    def graph_alignment(self, server_args: Any, *, republish: bool = True) -> int:
        """The decode graphs' batch-size alignment (`get_batch_sizes_to_capture`'s `mul_base`; 0.5.17 and 0.5.18 name
        it `get_cuda_graph_batch_size_alignment(server_args)`), from the resolved ServerArgs: 2 under two-batch
        overlap, times the attention TP size where SGLang's own `require_gathered_buffer(server_args)` says the
        attention input is gathered (DP attention, a MoE all-to-all backend; the process-wide MoE all-to-all backend
        is read at its default), times the attention CP size where the product is no multiple of it. The attention
        sizes are SGLang's derivation (`sizing.attention_tp_size`): up to 0.5.18 they live in process groups, which
        lint does not build."""
        sa = server_args
        alignment = 2 if getattr(sa, "enable_two_batch_overlap", False) else 1
        if self.gathered_buffer_required(sa, republish=republish):
            alignment *= attention_tp_size(sa)
        cp = int(getattr(sa, "attn_cp_size", 1) or 1)
        return alignment * cp if alignment % cp else alignment

    def gathered_buffer_required(self, server_args: Any, *, republish: bool = True) -> bool:
        """SGLang's own `require_gathered_buffer(server_args)` (DP attention, a MoE all-to-all backend, ...), which
        reads the ServerArgs up to 0.5.16."""
        from sglang.srt.utils.common import require_gathered_buffer

        return bool(require_gathered_buffer(server_args))

    def graph_layout(self, server_args: Any, *, republish: bool = True) -> dict[str, Any]:
        """`sizing_from_values`' graph arguments for a resolved ServerArgs: one scheduler's request pool
        (max_running_requests // the attention DP size), the alignment, two-batch overlap. `republish`: lint's own
        process (False: inside a running server, its config published already)."""
        sa = server_args
        return {"graph_pool": request_pool(sa, sa.max_running_requests),
                "graph_alignment": self.graph_alignment(sa, republish=republish),
                "two_batch_overlap": bool(getattr(sa, "enable_two_batch_overlap", False))}

    # this module's functions, called as methods: the line is their first argument (a later line inherits them)
    read_sizing = read_sizing
    sizing_from_values = sizing_from_values


LINE = Line()
