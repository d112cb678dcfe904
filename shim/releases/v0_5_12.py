"""The SGLang 0.5.12 line. Its guard adapter covers the v1 EAGLEWorker (SGLANG_ENABLE_SPEC_V2=0 or
--disable-overlap-schedule): the seeds' line. What differs from the v2 lines (docs/correspondence-research.md
sections 0.1 and 7.2):

* a Req keeps `req_pool_idx`, `kv_committed_len`, `kv_allocated_len` and `cache_protected_len` on itself;
  `release_kv_cache(req, tree_cache, is_insert=True)`;
* the worker takes the ScheduleBatch and builds a `ModelWorkerBatch` (the worker's copy) per sub-forward;
  the plain target forward sees that copy, which has no allocator: the pool is read off the running batch;
* `prepare_for_decode` returns early on the speculative path, allocating nothing and leaving the previous
  verify's slots in `out_cache_loc`: the hook is AROUND, and a step that did not replace `out_cache_loc`
  allocated nothing;
* v1 holds no KV reserve between steps: the verify slots are allocated in
  `EagleVerifyInput.prepare_for_verify` and live in `batch.out_cache_loc`, not in `req.kv_allocated_len`.
  The model reserves them at prepare_for_decode (KvReserve.LARGEST_STATE); the adapter leaves that ghost
  reserve standing until prepare_for_verify, where the real allocation is observed and checked;
* `EagleVerifyInput.verify` drops finished requests' rows from the next draft input before the scheduler's
  `filter_batch(v1_spec_info_filtered=True)` drops the requests: such a draft input still stands for every
  request of the batch, the finished ones included;
* the draft input after a verify is `EagleDraftExtendInput` (`forward_draft_extend_after_decode`), then an
  `EagleDraftInput` without `future_indices`;
* the target's CUDA graphs are a `CudaGraphRunner` at `model_runner.graph_runner` (`num_tokens_per_bs`,
  `capture_bs`, `max_bs`; `can_run` ignores forward_mode).

Lint:
`specflip lint` for SGLang 0.5.12, the v1 line (`SGLANG_ENABLE_SPEC_V2=0`: the v1 `EAGLEWorker`, no overlap).

Read from the installed 0.5.12 (`.venv12` here; the `.whl12` bundle on the GPU host). Paths are relative to its
`sglang/srt/`. 0.5.12 resolves ServerArgs in `__post_init__` (plain attributes), like 0.5.16, but its adaptive
mode is another design:
  - Adaptive: `speculative/adaptive_spec_params.AdaptiveSpeculativeParams` moves the step count with the EMA of
    the accept length, at any batch size: no batch-size tiers. Its config (`load_adaptive_config`) is one flat
    JSON object; `candidate_steps` (default [1, 3, 7]) plus the launch steps are the states, and fewer than two
    distinct ones is an AssertionError when the worker is built (start-up). Tier keys ("1", "8", ... as 0.5.16
    reads them) are ignored. A candidate steps 0 dies at start-up: `speculative/draft_utils.DraftBackendFactory
    .create_decode_backend` returns no backend for steps == 1 only (0.5.16: steps <= 1).
  - States: `speculative/eagle_worker.EAGLEWorker.build_adaptive_runtime_state` builds every candidate at
    start-up (draft tokens = steps + 1), each with its own target `CudaGraphRunner` and draft runners at the whole
    `cuda_graph_bs` list (`model_executor/cuda_graph_runner.get_batch_sizes_to_capture`: clamped to the request
    pool, which is max_running_requests // the attention DP size, and aligned to the attention TP size where the
    attention input is gathered: `sizing.graph_batch_sizes`). There is no shared logits buffer in 0.5.12: each
    runner sizes its own.
  - KV: `managers/utils.get_alloc_len_per_decode(server_args)` = max(steps * topk, draft tokens) of the CURRENT
    state: `apply_runtime_state` writes the state into server_args. The v1 worker switches at the end of a
    forward, so the next prepare_for_decode already reserves for the state that runs (switch_after_reserve is
    False); under SGLANG_ENABLE_SPEC_V2=1 (overlap) 0.5.12 runs the v2 worker, which switches inside the forward.
  - Refusals: `adaptive_unsupported_reason` (algorithm not EAGLE/EAGLE3, topk != 1, DP attention, multi-layer
    EAGLE, TBO, PD-mux): server_args drops --speculative-adaptive with a warning.
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from shim.guard.api import announced_switch
from shim.guard.core import Guard
from shim.guard.observe import ObservedBatch, ObservedPool, ObservedRequest
from shim.releases import v0_5_16
from shim.releases.base import ReleaseLine, assign_warmups, prefix_slots_chunk
from shim.releases.guard_hooks import V2Adapter
from shim.releases.guard_reading import cuda_graph_runner_replay, host_ints, tensor_width
from shim.releases.server_args import LintInputError
from shim.releases.sizing import Sizing, SpecflipPolicy, StepSizing, graph_batch_sizes
from statemodel.design import Design, Scope
from statemodel.designs import SEEDS_FINAL, get_design
from statemodel.state import ForwardMode, SpecInfoKind

new_tuple = tuple.__new__
_SB = "sglang.srt.managers.schedule_batch.ScheduleBatch"
_V1 = "sglang.srt.speculative.eagle_worker.EAGLEWorker"


class Adapter(V2Adapter):
    release = "0.5.12"
    TARGETS = (
        (f"{_SB}.prepare_for_extend", "AROUND", "around_prepare_for_extend"),
        (f"{_SB}.prepare_for_decode", "AROUND", "around_prepare_for_decode"),
        (f"{_SB}.merge_batch", "AROUND", "around_merge_batch"),
        (f"{_SB}.filter_batch", "AROUND", "around_filter_batch"),
        ("sglang.srt.mem_cache.common.release_kv_cache", "AROUND", "around_release_kv_cache"),
        ("sglang.srt.mem_cache.radix_cache.RadixCache.cache_unfinished_req", "AROUND", "around_tree_cache_keep"),
        ("sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation", "BEFORE", "before_target_forward"),
        (f"{_V1}.draft", "BEFORE", "before_draft_v1"),
        ("sglang.srt.speculative.eagle_info.EagleVerifyInput.prepare_for_verify", "AFTER", "after_prepare_for_verify"),
        (f"{_V1}.forward_draft_extend_after_decode", "BEFORE", "before_draft_extend_after_decode"),
        (f"{_V1}._draft_preprocess_idle", "BEFORE", "before_draft_preprocess_idle"),
        # a decode result's processing (spec v1 and plain): the overlap scope's process_result, with the v1 switch's
        # own loop (shim/switch/v1_loop.py); a no-op in the normal loop
        ("sglang.srt.managers.scheduler_output_processor_mixin.SchedulerOutputProcessorMixin."
         "process_batch_result_decode", "BEFORE", "before_process_batch_result_decode"),
        # the scheduler's start-up, before the model worker is built: whether the guard checks this configuration
        ("sglang.srt.managers.scheduler.Scheduler.init_model_worker", "BEFORE", "before_init_model_worker"),
        # the launching process, after SGLang checked the server arguments and before any scheduler process starts:
        # assert mode on a configuration the guard does not check stops the launch there (one line, no traceback)
        ("sglang.srt.server_args.ServerArgs.check_server_args", "AFTER", "after_check_server_args"),
    )

    def __init__(self) -> None:
        super().__init__()
        self._worker_ref: Callable[[], Any] | None = None
        # the overlap scope: the verify's launch reading, which its draft-extend is checked against (v1's verify has
        # committed on the host by then; the model records that at the result's processing)
        self._verify_reading: tuple[Any, list[ObservedRequest], ObservedPool] | None = None

    # --- per-release field access ---------------------------------------------------------------------

    def req_kv_lens(self, req: Any) -> tuple[bool, int, int, int]:
        if req.req_pool_idx is None:
            return False, 0, 0, 0
        return True, int(req.kv_committed_len), int(req.kv_allocated_len), int(req.cache_protected_len)

    def req_row(self, req: Any) -> int | None:
        return req.req_pool_idx

    def tp_rank(self) -> int:
        try:
            from sglang.srt.distributed import get_tensor_model_parallel_rank

            return int(get_tensor_model_parallel_rank())
        except Exception:  # noqa: BLE001 - no TP group in this process (single-process use, tests)
            return 0

    server_args = v0_5_16.Adapter.server_args  # published the same way (get_global_server_args)

    def unsupported_reason(self, sa: Any) -> str | None:
        reason = super().unsupported_reason(sa)
        if reason or sa is None:
            return reason
        if getattr(sa, "speculative_algorithm", None) and LINE.worker_kind(os.environ, sa) == "v2":
            return ("the overlap schedule runs EAGLEWorkerV2 on 0.5.12; this adapter covers the v1 EAGLEWorker "
                    "(SGLANG_ENABLE_SPEC_V2=0 or --disable-overlap-schedule)")
        return None

    def scope(self, sa: Any) -> Scope:
        """The overlap scope also under the v1 switch's own loop (its design keeps speculative steps unoverlapped,
        Design.overlap_spec_steps), where SGLang's server arguments still say the normal loop."""
        scope = super().scope(sa)
        switch = announced_switch()
        if switch is not None and not get_design(switch.design_name).overlap_spec_steps:
            scope = attrs.evolve(scope, overlap=True)
        return scope

    def reference_design(self, sa: Any) -> Design:
        """The design the v1 switch announced (seeds_final when none did) with the server's step count: the model's
        reserve (KvReserve.LARGEST_STATE, steps + 1 per request) stands in for v1's verify allocation until
        prepare_for_verify makes it."""
        switch = announced_switch()
        design = get_design(switch.design_name) if switch is not None else SEEDS_FINAL
        steps = getattr(sa, "speculative_num_steps", None) if sa is not None else None
        return attrs.evolve(design, num_steps=int(steps)) if steps else design

    # --- observation ------------------------------------------------------------------------------------

    def spec_shape(self, spec_info: Any) -> tuple[SpecInfoKind, int, int]:
        if spec_info is not None and type(spec_info).__name__ == "EagleDraftExtendInput":
            # the accepted tokens of a round on their way into the draft model: one draft-input row per request
            return SpecInfoKind.DRAFT_INPUT, tensor_width(spec_info.seq_lens), 1
        return super().spec_shape(spec_info)

    def observe_requests_in_worker_call(self, batch: Any, *, lengths: bool = True) -> list[ObservedRequest]:
        """A fresh reading at every hook: 0.5.12's v1 worker writes what a reading takes inside its own call (its
        verify appends the accepted tokens to `output_ids` and frees the rejected draft slots), so the reuse the v2
        worker allows (`V2Adapter.observe_requests_in_worker_call`) would hand a later hook stale outputs."""
        return self.observe_requests(batch)

    def observe_batch(self, batch: Any, *, forward_mode: ForwardMode | None = None, graph: Any = None,
                      spec_info: Any = ..., out_cache_loc_width: int | None = None,
                      reqs: list[ObservedRequest] | None = None) -> ObservedBatch:
        obs = super().observe_batch(batch, forward_mode=forward_mode, graph=graph, spec_info=spec_info,
                                    out_cache_loc_width=out_cache_loc_width, reqs=reqs)
        if obs.spec_kind is SpecInfoKind.DRAFT_INPUT and obs.spec_rows < len(obs.rids):
            finished = sum(1 for req in batch.reqs if req.finished())
            if obs.spec_rows + finished == len(obs.rids):  # v1 verify dropped the finished rows already
                obs = obs._replace(spec_rows=len(obs.rids))
        return obs

    def batch_pool(self, batch: Any) -> ObservedPool:
        allocator = getattr(batch, "token_to_kv_pool_allocator", None)
        if allocator is None:  # a ModelWorkerBatch: the pool is the running ScheduleBatch's
            running = self._running_ref() if self._running_ref else None
            if running is None:
                raise RuntimeError("a worker batch was launched before the guard saw any running batch")
            return super().batch_pool(running)
        return super().batch_pool(batch)

    def graph_for(self, model_runner: Any, batch_size: int, spec_info: Any) -> tuple[int, int] | None:
        """The CUDA graph a forward of `batch_size` requests replays: 0.5.12's CudaGraphRunner (`graph_runner`)."""
        return cuda_graph_runner_replay(getattr(model_runner, "graph_runner", None), batch_size)

    def observe_requests_with_verify_slots(self, batch: Any, per_request: int) -> list[ObservedRequest]:
        """Requests as the model counts them while a v1 verify holds its slots: `per_request` slots each,
        allocated beyond kv_committed_len (they sit in batch.out_cache_loc, not in req.kv_allocated_len)."""
        # built by position (ObservedRequest's field order is checked at import, shim/guard/sync.py): a
        # NamedTuple's _replace costs a Python call and a dict per request
        return [new_tuple(ObservedRequest, (rid, prompt, most, out, own, own + per_request, committed, n, True, filled))
                if holds else r
                for r in self.observe_requests(batch)
                for rid, prompt, most, out, own, _, committed, n, holds, filled in (r,)]

    # --- hooks --------------------------------------------------------------------------------------------

    def around_prepare_for_decode(self, original: Callable[..., Any], batch: Any, *args: Any, **kwargs: Any) -> Any:
        before = batch.out_cache_loc
        result = original(batch, *args, **kwargs)

        def step(g: Guard) -> None:
            if not batch.reqs:
                return
            self.remember_running(batch)
            if batch.out_cache_loc is not None and batch.out_cache_loc is not before:
                # the plain path ran (alloc_for_decode): slots, kv lengths and the pool are all observable
                g.prepare_for_decode(self.observe_batch(batch), self.observe_requests(batch), self.batch_pool(batch))
            else:
                # v1's speculative path allocated nothing: the model's reserve stands until prepare_for_verify
                g.prepare_for_decode(self.observe_batch(batch, out_cache_loc_width=0), [], None)  # type: ignore[arg-type]
        self._with_guard(step)
        return result

    def before_draft_v1(self, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        if batch.forward_mode.is_idle() or not batch.reqs:
            return None
        self._worker_ref = weakref.ref(worker)

        def step(g: Guard) -> None:
            g.draft(int(worker.speculative_num_steps), [], None, self._round_observer(batch),  # type: ignore[arg-type]
                    where="EAGLEWorker.draft")
        self._with_guard(step)
        return None

    def after_prepare_for_verify(self, result: Any, verify_input: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        if batch.forward_mode.is_idle() or not batch.reqs:
            return None

        def step(g: Guard) -> None:
            worker = self._worker_ref() if self._worker_ref else None
            graph = self.graph_for(worker.target_worker.model_runner, len(batch.reqs), verify_input) \
                if worker is not None else None
            width = tensor_width(batch.out_cache_loc)
            launched = self.observe_batch(batch, forward_mode=ForwardMode.TARGET_VERIFY, graph=graph,
                                          spec_info=verify_input, out_cache_loc_width=width)
            per_request = width // max(len(batch.reqs), 1)
            reqs, pool = self.observe_requests_with_verify_slots(batch, per_request), self.batch_pool(batch)
            if g.config.scope.overlap:
                self._verify_reading = (batch, reqs, pool)
            g.verify_launch(launched, reqs, pool, where="EagleVerifyInput.prepare_for_verify (TARGET_VERIFY launch)")
        self._with_guard(step)
        return None

    def before_draft_extend_after_decode(self, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        self._v1_draft_extend(batch, where="EAGLEWorker.forward_draft_extend_after_decode")

    def _v1_draft_extend(self, batch: Any, *, where: str) -> None:
        held, self._verify_reading = self._verify_reading, None
        if held is None or held[0] is not batch or not batch.reqs:
            self._draft_extend(batch, skipped=False, where=where)
            return

        def observe() -> tuple[ObservedBatch, list[ObservedRequest], ObservedPool]:
            # the overlap scope: the model's verify is its launch, and v1's verify has already committed the accepted
            # tokens and freed the rejected slots on the host: the draft-extend is read as at the verify's launch,
            # the commit is checked where the result is processed (before_process_batch_result_decode)
            return self.observe_batch(batch, reqs=held[1]), held[1], held[2]

        def step(g: Guard) -> None:
            g.draft_extend_starts(skipped=False, observe=observe, where=where)
        self._with_guard_in_worker_call(step)

    def before_process_batch_result_decode(self, scheduler: Any, batch: Any, result: Any, *args: Any,
                                           **kwargs: Any) -> None:
        """The overlap scope's process_result (the v1 switch's own loop): a plain step's result one iteration after
        its launch, a speculative step's right after its worker call. Read before the per-request loop appends a
        plain step's tokens and releases what finished: host mirrors only (`copy_done` is waited on after)."""
        rt = self.runtime
        built = rt.guard if rt is not None else None
        if not batch.reqs or (built is not None and not built.config.scope.overlap):
            return  # the normal loop settles rounds at the scheduler's next hook: nothing to do per step here

        def step(g: Guard) -> None:
            if not g.config.scope.overlap:
                return  # the guard built at this hook, for the normal loop
            spec = not batch.spec_algorithm.is_none()
            # v1's verify moved seq_lens_cpu by each accepted run already; a plain copy's mirror is its launch's
            accept = [int(c) + 1 for c in result.num_correct_drafts_per_req_cpu] if spec else None
            mirror = batch.seq_lens_cpu
            seq_lens = host_ints(mirror) if mirror is not None and tensor_width(mirror) == len(batch.reqs) \
                else [None] * len(batch.reqs)
            observed = self._observe_reqs(batch.reqs, seq_lens)
            pool = self.observe_pool(scheduler.token_to_kv_pool_allocator, getattr(scheduler, "tree_cache", None))
            g.process_result([o[0] for o in observed], accept, observed, pool,
                             where="Scheduler.process_batch_result_decode (result processed)")
        self._with_guard(step)

    def before_draft_preprocess_idle(self, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        # every request of a live batch finished in this step: v1 installs its idle draft input instead of a
        # draft-extend. The model's draft-extend / draft_sync of finished requests, with nothing left to extend.
        if not batch.forward_mode.is_idle() and batch.reqs:
            self._v1_draft_extend(batch, where="EAGLEWorker._draft_preprocess_idle (all finished)")


# --- lint: what this line sizes at start-up ------------------------------------------------------------


DEFAULT_CANDIDATE_STEPS: tuple[int, ...] = (1, 3, 7)


def adaptive_candidates(config: Any, launch_steps: int) -> tuple[int, ...]:
    """`AdaptiveSpeculativeParams.__init__`: the config's candidate_steps (default [1, 3, 7]) plus the launch
    steps. LintInputError for a config SGLang would fail on when it builds the worker."""
    if not isinstance(config, dict):
        raise LintInputError(f"0.5.12 reads the adaptive config as one JSON object "
                             f"(e.g. {{\"candidate_steps\": [1, 3]}}), not a {type(config).__name__}")
    raw = config.get("candidate_steps", list(DEFAULT_CANDIDATE_STEPS))
    if not isinstance(raw, list) or not all(_is_step(s) for s in raw):
        raise LintInputError(f"candidate_steps must be a list of non-negative integers, got {json.dumps(raw)}")
    return tuple(sorted({*raw, launch_steps}))


def sizing_from_values(line: ReleaseLine, *, algorithm: str = "EAGLE3", topk: int = 1, steps: int, draft_tokens: int,
                       adaptive: bool = False, adaptive_config: Any = None, max_running_requests: int = 48,
                       cuda_graph_bs: Sequence[int] | None = None, overlap: bool = False,
                       refusals: Sequence[str] = (), specflip: SpecflipPolicy | None = None,
                       graph_pool: int | None = None, graph_alignment: int = 1,
                       two_batch_overlap: bool = False) -> Sizing:
    """0.5.12's start-up sizing from resolved values (what its ServerArgs attributes hold). Each state's target
    `CudaGraphRunner` captures `sizing.graph_batch_sizes` of `cuda_graph_bs` over one scheduler's request pool
    (`graph_pool`, default max_running_requests), aligned to `graph_alignment` (`Line.graph_alignment`) at the
    state's verify width (`num_tokens_per_bs`; per request under `two_batch_overlap`)."""
    refusals = list(refusals)
    fatal: list[str] = []
    tiers: tuple[tuple[int, tuple[int, ...]], ...] = ()
    if adaptive:
        config = {} if adaptive_config is None else adaptive_config
        candidates = adaptive_candidates(config, steps)
        ignored = sorted(k for k in config if isinstance(k, str) and k.isdigit())
        if ignored:
            refusals.append(f"SGLang 0.5.12 ignores the tier keys {ignored} of the adaptive config (it reads one "
                            f"flat object); it runs candidate_steps {list(candidates)} at every batch size")
        if 0 in candidates:
            # 0.5.16 skips the multi-step draft backend for steps <= 1 ("nospec"); 0.5.12 only for steps == 1
            fatal.append(f"the adaptive candidate_steps {list(candidates)} include steps 0, which 0.5.12 cannot "
                         "build: DraftBackendFactory.create_decode_backend builds a multi-step draft backend over "
                         "no steps (triton: IndexError in TritonMultiStepDraftBackend; seen on the H200)")
        if len(candidates) < 2:
            fatal.append(f"the adaptive candidate_steps {list(candidates)} (with the launch steps) have fewer than "
                         "2 distinct values: AdaptiveSpeculativeParams asserts when the worker is built")
        tiers = ((1, candidates),)  # one tier: the accept length, not the batch size, picks the state
        state_steps: Sequence[int] = candidates
    else:
        state_steps = [steps]
    pool = max_running_requests if graph_pool is None else graph_pool
    states = []
    for s in state_steps:
        d = s + 1 if adaptive else draft_tokens
        graph_bs = graph_batch_sizes(cuda_graph_bs, pool, alignment=graph_alignment, width=d,
                                     two_batch_overlap=two_batch_overlap)
        states.append(StepSizing(steps=s, draft_tokens=d, alloc_len=max(s * topk if s else topk, d), verify_width=d,
                                 draft_extend_width=d, graph_bs=tuple(graph_bs)))
    # no shared logits buffer: every runner sizes its own rows, so the largest is what is there
    logits_rows = max((max(st.graph_bs) * st.verify_width for st in states if st.graph_bs), default=0)
    return Sizing(release=line.version, algorithm=algorithm, topk=topk, launch_steps=steps,
                  launch_draft_tokens=draft_tokens,
                  overlap=overlap, max_running_requests=max_running_requests, logits_rows=logits_rows,
                  states=tuple(states), adaptive=adaptive and not fatal, tiers=tiers if adaptive else (),
                  refusals=tuple(refusals), fatal_refusals=tuple(fatal), specflip=specflip,
                  switch_after_reserve=overlap)


def read_sizing(line: ReleaseLine, server_args: Any, specflip: SpecflipPolicy | None = None, *,
                republish: bool = True) -> Sizing:
    """What 0.5.12 sizes at start-up for a resolved ServerArgs (`republish`: the adapter interface; 0.5.12 has
    nothing published to move)."""
    sa = server_args
    if sa.speculative_algorithm is None:
        raise LintInputError("no --speculative-algorithm: nothing switches, nothing to lint")
    given_adaptive = bool(getattr(sa, "_specflip_given_adaptive", False))
    config: Any = None
    if sa.speculative_adaptive and sa.speculative_adaptive_config:
        config = _read_adaptive_config(sa.speculative_adaptive_config)
    refusals = []
    if given_adaptive and not sa.speculative_adaptive:
        from sglang.srt.speculative.adaptive_spec_params import adaptive_unsupported_reason

        reason = adaptive_unsupported_reason(sa)
        refusals.append(f"SGLang drops --speculative-adaptive: {reason or 'disabled during resolution'}; "
                        "the server runs the static launch parameters")
    graphs = [] if sa.disable_cuda_graph else list(sa.cuda_graph_bs or [])
    return line.sizing_from_values(
        algorithm=sa.speculative_algorithm, topk=sa.speculative_eagle_topk or 1, steps=sa.speculative_num_steps,
        draft_tokens=sa.speculative_num_draft_tokens, adaptive=bool(sa.speculative_adaptive),
        adaptive_config=config, max_running_requests=sa.max_running_requests, cuda_graph_bs=graphs,
        overlap=not sa.disable_overlap_schedule, refusals=refusals, specflip=specflip,
        **line.graph_layout(sa, republish=republish))


def check_adaptive_config(path: str, launch_steps: int) -> None:
    """LintInputError for a malformed adaptive config: what 0.5.12 fails on, and tier entries ("1": {...}, the
    0.5.16+ format) that are malformed. 0.5.12 ignores tier keys, but a broken tiers file is bad input on every
    line, as it is where resolution drops --speculative-adaptive."""
    config = _read_adaptive_config(path)
    try:
        adaptive_candidates(config, launch_steps)
        for key, entry in config.items():
            if not key.isdigit():
                continue
            steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
            if not isinstance(steps, list) or not steps or not all(_is_step(s) for s in steps):
                raise LintInputError(f"tier {key!r}: candidate_steps must be a non-empty list of non-negative "
                                     f"integers, got {json.dumps(steps)}")
    except LintInputError as exc:
        raise LintInputError(f"the adaptive config {path}: {exc}") from None


def _is_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_adaptive_config(path: str) -> Any:
    """The adaptive config as 0.5.12's `load_adaptive_config` reads it (json.load)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise LintInputError(f"cannot read the adaptive config {path}: {exc}") from None


class Line(v0_5_16.Line):
    """0.5.12 as it differs from 0.5.16: it still ships the v1 EAGLEWorker (the overlap schedule off runs it:
    SGLANG_ENABLE_SPEC_V2=0, --disable-overlap-schedule or topk > 1: `base.v1_worker_runs`; the v1 switch is
    shim/switch/v1.py); a Req keeps kv_allocated_len on itself too; add_chunked_req cuts fill_ids at the chunk's end
    (init_next_round_input restores them); GenerationBatchResult has no extra_keep_alive_refs; retract_all is a
    ScheduleBatch method only (the v2 switch's retraction, which calls the module function, does not run here)."""

    version = "0.5.12"
    adapter_class = Adapter
    # Its EAGLEWorkerV2 lacks what the v2 switch hooks and calls (read in the 0.5.12 wheel, 2026-12-06): no
    # `init_cuda_graphs` (the plain capture's target) and no `activate_step_by_batch`, and `retract_all` is a
    # ScheduleBatch method only (the v2 switch's flip-on calls the module function). Its switch is the v1 one, which
    # the v1 kit's entry point installs; SPECFLIP_SWITCH through specflip's own entry point stops start-up
    # (shim.plugin.register_switch), on either worker.
    offers_v2_switch = False
    v1_switch_howto = ("the v1 switch: SGLANG_ENABLE_SPEC_V2=0 and the v1 kit's entry point shim.plugin:register_v1 "
                       "in place of specflip's (SGLANG_PLUGINS=specflip_v1; bench/gpu/v1_run.sh, docs/v1.md)")
    future_map_sizes_lazily = False  # its FutureMap sizes its buffers at construction (no _forward_buf_initialized)
    verified = (
        ("guard", "GPU H200, 2026-12-03: assert mode in the v1 switch's own loop (docs/archive/gpu-results.md, "
                  "2026-12-03; docs/v1.md)"),
        ("guard", "CPU, real 0.5.12 objects in CI (.venv12: tests/test_v1_switch.py)"),
        ("switch", "GPU H200, 2026-11-29 to 2026-12-03: the v1 switch, greedy-exact (docs/v1.md; "
                   "docs/archive/gpu-results.md)"),
        ("switch", "CPU, real 0.5.12 objects in CI (.venv12: tests/test_v1_switch.py, "
                   "tests/test_keep_out_chunk_0_5_12.py)"),
        ("lint", "GPU H200, 2026-12-01: predictions against real start-ups (docs/archive/gpu-results.md, 2026-12-01)"),
        ("lint", "CPU, real 0.5.12 ServerArgs in CI (.venv12: tests/test_lint_v1.py)"),
    )

    def features(self) -> dict[str, str]:
        return {**super().features(),
                "guard": "yes, on the v1 EAGLEWorker (the overlap schedule off: SGLANG_ENABLE_SPEC_V2=0 or "
                         "--disable-overlap-schedule; the overlap schedule's v2 worker is not covered)",
                "switch": "v1 (shim/switch/v1.py, SGLANG_ENABLE_SPEC_V2=0; the v1 kit's entry point "
                          "shim.plugin:register_v1: SPECFLIP_SWITCH=t_off:t_on, no auto, no tiers); the v2 switch "
                          "is not offered (its EAGLEWorkerV2 has no init_cuda_graphs, no activate_step_by_batch, no "
                          "module retract_all): SPECFLIP_SWITCH through specflip's own entry point stops start-up"}
    ships_v1_worker = True
    result_keeps_refs = False
    write_warmups = assign_warmups  # ServerArgs has no `override` and is writable after resolution (as 0.5.15)

    def kv_row(self, req: Any) -> tuple[int | None, int, int]:
        if req.req_pool_idx is None:
            return None, int(req.kv_committed_len), 0
        return req.req_pool_idx, int(req.kv_committed_len), int(req.kv_allocated_len)

    def advance_kept_out_chunk(self, scheduler: Any, req: Any) -> int:
        return prefix_slots_chunk(scheduler, req, len(req.fill_ids))


    # --- lint ---------------------------------------------------------------------------------------------

    def check_adaptive_config(self, path: str, launch_steps: int) -> None:
        check_adaptive_config(path, launch_steps)

    # this module's functions, called as methods: the line is their first argument (a later line inherits them)
    read_sizing = read_sizing
    sizing_from_values = sizing_from_values


LINE = Line()
