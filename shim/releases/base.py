"""The `Release` protocol: everything specflip needs from one SGLang release line, and `ReleaseLine`, the base
every line module's `Line` derives from (a line states only how it differs from the line it derives from).

What a line answers, by consumer:
* the guard: `adapter()` (the hook targets and the hook bodies that read this line's live objects);
* the switches: `worker_kind` (SGLang's v1 EAGLEWorker or the v2 one), the v2 switch's plain side
  (`plain_capture_target`, `decode_graph_runner_attr`, `decode_graph_runner_class`, `prefill_graph_runner_attr`),
  `kv_row` (a request's row and KV lengths),
  `future_map_sizes_lazily`, `retract_all_kwargs`, `advance_kept_out_chunk`, `draft_worker_contexts`,
  `result_keeps_refs`, `model_runner_has_workspace_flag`;
* the step timer: `step_timer_targets`;
* lint: `build_server_args`, `launch_value`, `read_sizing` (shim/releases/server_args.py runs the common part);
* `specflip releases`: `features` and `verified`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

WorkerKind = Literal["v1", "v2"]
FEATURES = ("guard", "switch", "step_timer", "lint")
# the values SGLang's `EnvBool` reads as false (0.5.12 srt/environ.py: `value.lower()` in these, not stripped); any
# other value it does not know ("off", " 0") it warns about and takes the default, True: the v2 worker
SPEC_V2_OFF = ("false", "0", "no", "n")


def spec_v2_off(env: Mapping[str, str]) -> bool:
    """Whether SGLANG_ENABLE_SPEC_V2 in `env` turns SGLang's v2 EAGLE worker off, read as SGLang reads it."""
    return env.get("SGLANG_ENABLE_SPEC_V2", "").lower() in SPEC_V2_OFF


def v1_worker_runs(env: Mapping[str, str], resolved: Any = None) -> bool:
    """Whether a line that still ships SGLang's v1 EAGLEWorker runs it: its `SpeculativeAlgorithm.create_worker`
    returns EAGLEWorker exactly where the overlap schedule is off (`enable_overlap = not
    server_args.disable_overlap_schedule`), and resolution turns the overlap schedule off for
    `--disable-overlap-schedule`, for topk > 1 and for SGLANG_ENABLE_SPEC_V2 false (0.5.12 server_args.py
    `_handle_speculative_decoding`), among others. `resolved`: the server arguments as SGLang resolved them
    (`ReleaseLine.launch_view`), which say it; without them (at plugin load, before SGLang parsed its arguments)
    the environment variable is all there is to read."""
    if resolved is not None:
        return bool(resolved.disable_overlap_schedule)
    return spec_v2_off(env)


@runtime_checkable
class Release(Protocol):
    """One SGLang release line as specflip sees it."""

    version: str  # the base line, "0.5.16" (a ".postN" release uses it)
    ships_v1_worker: bool  # SGLang's v1 EAGLEWorker is still there (the overlap schedule off selects it)
    offers_v2_switch: bool  # the v2 worker has the hook points shim/switch/v2.py needs
    plain_capture_target: str  # the v2 switch captures its plain decode graph runner AFTER this (v2_capture.py)
    decode_graph_runner_attr: str  # the target model runner's attribute holding its decode graph runner
    decode_graph_runner_class: str  # that runner's class (the plain runner derives from it)
    prefill_graph_runner_attr: str | None  # the prefill graph runner the plain path's prefills may replay; None: none
    stubs_skipped_draft_extend: bool  # EAGLEWorkerV2._stub_skipped_draft_extend (the v2 switch's draft mode none)
    future_map_sizes_lazily: bool
    result_keeps_refs: bool
    step_timer_targets: tuple[str, str]
    model_runner_has_workspace_flag: bool
    verified: tuple[tuple[str, str], ...]

    def worker_kind(self, env: Mapping[str, str], server_args: Any = None) -> WorkerKind: ...

    def adapter(self) -> Any: ...

    def kv_row(self, req: Any) -> tuple[int | None, int, int]: ...

    def retract_all_kwargs(self, scheduler: Any) -> dict[str, Any]: ...

    def advance_kept_out_chunk(self, scheduler: Any, req: Any) -> int: ...

    def draft_worker_contexts(self, worker: Any) -> list[Any]: ...

    def features(self) -> dict[str, str]: ...

    def build_server_args(self, argv: Sequence[str], *, verbose: bool = False) -> Any: ...

    def launch_value(self, server_args: Any, attribute: str) -> Any: ...

    def read_sizing(self, server_args: Any, specflip: Any = None, *, republish: bool = True) -> Any: ...

    # the switch's warm-up in --warmups (shim/switch/warmup.py)
    warmup_hook_target: str

    def add_warmup(self, server_args: Any, name: str) -> bool: ...


class ReleaseLine:
    """Defaults: what the v2-worker lines share. A line module's `Line` overrides what its line does otherwise."""

    version: ClassVar[str] = ""
    ships_v1_worker: ClassVar[bool] = False
    # the v2 worker has the hook points the v2 switch needs; a line without them is not offered the v2 switch
    offers_v2_switch: ClassVar[bool] = True
    # where the line offers no v2 switch but ships the v1 EAGLEWorker: how to get the v1 switch instead (one line)
    v1_switch_howto: ClassVar[str | None] = None
    # The v2 switch's plain side (shim/switch/v2_capture.py). It captures its plain decode graph runner AFTER
    # `plain_capture_target`: there the target's model runner and its graph runners exist and SGLang has captured the
    # target's and the draft's graphs (the scheduler's init_all_cuda_graphs calls EAGLEWorkerV2.init_cuda_graphs after
    # the target's). The runner lives in the model runner's `decode_graph_runner_attr`, an instance of
    # `decode_graph_runner_class`; the plain path's prefills replay the target's prefill graphs through
    # `prefill_graph_runner_attr` (PlainPrefillOnTargetGraphs: a runner with can_run_graph and capture_hidden_mode).
    plain_capture_target: ClassVar[str] = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.init_cuda_graphs"
    decode_graph_runner_attr: ClassVar[str] = "decode_cuda_graph_runner"
    decode_graph_runner_class: ClassVar[str] = (
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner")
    prefill_graph_runner_attr: ClassVar[str | None] = "prefill_cuda_graph_runner"
    # EAGLEWorkerV2._stub_skipped_draft_extend exists: the v2 switch's draft mode "none" (plain_decode) stubs the
    # draft-extend it skips with it
    stubs_skipped_draft_extend: ClassVar[bool] = True
    # the future map sizes its buffers at the first stash (`_forward_buf_initialized`): a flip back to speculation
    # must let the next speculative stash size them again
    future_map_sizes_lazily: ClassVar[bool] = False
    # GenerationBatchResult carries `extra_keep_alive_refs` (tensors kept alive until the result is processed)
    result_keeps_refs: ClassVar[bool] = True
    # the model runner's `init_new_workspace` flag, which `_get_attention_backend(init_new_workspace=True)` may change
    model_runner_has_workspace_flag: ClassVar[bool] = True
    # schedule_batch.retract_all takes `server_args` / `offload_kv`
    retract_all_takes_server_args: ClassVar[bool] = False
    retract_all_takes_offload_kv: ClassVar[bool] = True
    # (feature, where it was verified), one entry per place: "CPU, ..." (real SGLang objects in CI) or
    # "GPU <card>, <dates>: ... (<file>)". Features: FEATURES.
    verified: ClassVar[tuple[tuple[str, str], ...]] = ()
    # the step timer's hook targets: a scheduler iteration's batch run, a request's arrival
    step_timer_targets: ClassVar[tuple[str, str]] = (
        "sglang.srt.managers.scheduler.Scheduler.run_batch",
        "sglang.srt.managers.scheduler.Scheduler.handle_generate_request")
    # the guard's adapter class for this line (a subclass of shim.releases.guard_hooks.V2Adapter)
    adapter_class: ClassVar[type] = object

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "verified" not in cls.__dict__:
            cls.verified = ()  # where a line was verified is that line's own fact: never inherited

    def __repr__(self) -> str:
        return f"<SGLang {self.version} line>"

    # --- the worker --------------------------------------------------------------------------------------

    def worker_kind(self, env: Mapping[str, str], server_args: Any = None) -> WorkerKind:
        """The EAGLE worker a server of this line runs: v1 where the line still ships it and runs it
        (`v1_worker_runs`: the overlap schedule off in `server_args` as SGLang resolved them, or, without them,
        SGLANG_ENABLE_SPEC_V2 false in `env`); else v2 (from the first line without it, `create_worker` returns
        EAGLEWorkerV2 with the overlap schedule on or off)."""
        if not self.ships_v1_worker:
            return "v2"
        resolved = None if server_args is None else self.launch_view(server_args)
        return "v1" if v1_worker_runs(env, resolved) else "v2"

    # --- the guard ---------------------------------------------------------------------------------------

    def adapter(self) -> Any:
        """A fresh guard adapter for this line."""
        return self.adapter_class()

    # --- reading live objects (the switches) -------------------------------------------------------------

    def kv_row(self, req: Any) -> tuple[int | None, int, int]:
        """(req_to_token row, kv_committed_len, kv_allocated_len) of a request; row None while it holds none.
        Default: everything in `req.kv` (ReqKvInfo)."""
        kv = req.kv
        if kv is None:
            return None, 0, 0
        return kv.req_pool_idx, int(kv.kv_committed_len), int(kv.kv_allocated_len)

    def retract_all_kwargs(self, scheduler: Any) -> dict[str, Any]:
        """The line's extra keyword arguments of `schedule_batch.retract_all` (beyond reqs, the pools and the tree)."""
        kwargs: dict[str, Any] = {}
        if self.retract_all_takes_server_args:
            kwargs["server_args"] = scheduler.server_args
        if self.retract_all_takes_offload_kv:
            kwargs["offload_kv"] = False  # re-prefilled, never restored from host
        return kwargs

    def advance_kept_out_chunk(self, scheduler: Any, req: Any) -> int:
        """A chunked request barred from the tree resumes after the chunk that ran (shim/switch/radix_keep_out.py
        `resume_chunk_kept_out`); returns the tokens its prefix advanced by. Default: the prefix is `prefix_len`
        and the chunk's end `extend_end` (the line's own stash advances it too)."""
        start, end = req.prefix_len, req.extend_end
        if end > start:
            req.prefix_len = end
        return max(0, end - start)

    def draft_worker_contexts(self, worker: Any) -> list[Any]:
        """The context managers the v2 worker's draft-extend runs under (what forward_batch_generation enters).
        Default: the module function over the draft's parallel layout, and the speculative MoE contexts."""
        mod = sys.modules["sglang.srt.speculative.eagle_worker_v2"]
        ctxs = [mod.draft_tp_context(worker.draft_worker.parallel_layout)]
        return ctxs + _moe_contexts(mod)

    # --- lint: ServerArgs and what the line sizes at start-up (shim/releases/server_args.py) ----------------------

    def build_server_args(self, argv: Sequence[str], *, verbose: bool = False) -> Any:
        """`ServerArgs` as `python -m sglang.launch_server argv` builds it on this line, resolved (lint)."""
        from shim.releases.server_args import build_server_args

        return build_server_args(self, argv, verbose=verbose)

    def resolve_server_args(self, argv: list[str], verbose: bool) -> Any:
        """`prepare_server_args(argv)` and whatever else this line's launch runs to resolve it."""
        raise NotImplementedError

    def launch_view(self, server_args: Any) -> Any:
        """What holds the resolved launch values: the ServerArgs itself, or the line's resolved view of it."""
        raise NotImplementedError

    def launch_value(self, server_args: Any, attribute: str) -> Any:
        """A launch attribute as resolution left it."""
        return getattr(self.launch_view(server_args), attribute)

    def check_adaptive_config(self, path: str, launch_steps: int) -> None:
        """LintInputError for an adaptive config this line refuses. Default: SGLang's own tier validation."""
        from shim.releases.server_args import check_tiered_adaptive_config

        check_tiered_adaptive_config(path)

    def read_sizing(self, server_args: Any, specflip: Any = None, *, republish: bool = True) -> Any:
        """What this line sizes at start-up for a resolved ServerArgs (a shim.releases.sizing.Sizing)."""
        raise NotImplementedError

    # --- specflip releases ---------------------------------------------------------------------------------

    def features(self) -> dict[str, str]:
        """feature (FEATURES) -> how it works on this line, one line each."""
        return {"guard": "yes, on the v2 EAGLE worker (shim/releases/guard_hooks.py)",
                "switch": "v2 (shim/switch/v2.py; SPECFLIP_SWITCH=t_off:t_on or auto)",
                "step_timer": "yes (shim/timing/step_timer.py)",
                "lint": "yes (specflip lint)"}

    # --- the switch's warm-up in --warmups (shim/switch/warmup.py) -------------------------------------------------
    # Where specflip names its warm-up in `--warmups`: a BEFORE hook on `warmup_hook_target` in the launching process,
    # and `write_warmups`, which writes the list there so that what the HTTP server reads before it listens has it.
    # Default (0.5.19 on): the ServerArgs record holds the operator's input and is writable until `resolve_once`
    # seals it (Engine._launch_subprocesses runs it first, after the plugins); the HTTP server's list
    # (`server_args.warmups`, or from 0.5.20 the published serving bag) comes from that input. After resolution
    # the record is read-only and the bags are published only after check_server_args.
    warmup_hook_target: ClassVar[str] = "sglang.srt.server_args.ServerArgs.resolve_once"

    def add_warmup(self, server_args: Any, name: str) -> bool:
        """Add `name` to the launch's `--warmups` (kept as the operator gave it, `name` last; once). False where this
        record can no longer take it (resolved before specflip's hook ran): the server then starts without it."""
        names = [n for n in (server_args.warmups or "").split(",") if n]
        if name in names:
            return True
        return self.write_warmups(server_args, ",".join([*names, name]))

    def write_warmups(self, server_args: Any, value: str) -> bool:
        """Set `--warmups` to `value` as this line allows at `warmup_hook_target`. Default: the unsealed input."""
        if getattr(server_args, "_resolution_finished", False) or getattr(server_args, "_input_frozen", False):
            return False
        server_args.warmups = value
        return True


def assign_warmups(line: ReleaseLine, server_args: Any, value: str) -> bool:
    """`write_warmups` for lines whose ServerArgs is a plain dataclass, writable after resolution (0.5.15 and
    before): a plain assignment."""
    server_args.warmups = value
    return True


def _moe_contexts(mod: Any) -> list[Any]:
    return [getattr(mod, name)() for name in ("speculative_moe_backend_context", "speculative_moe_a2a_backend_context")
            if name in vars(mod)]


def prefix_slots_chunk(scheduler: Any, req: Any, end: int) -> int:
    """`advance_kept_out_chunk` for lines whose prefix is the slots themselves (`req.prefix_indices`) and whose row is
    on the Req: the stash (`maybe_cache_unfinished_req`) returns early for a kept-out request and leaves
    `prefix_indices` at the tree match, so its next chunk would re-extend from there on fresh slots and the slots of
    the chunks before, overwritten in its req_to_token row, would be lost to the pool. `end`: the chunk's end."""
    if req.req_pool_idx is None:
        return 0
    start = len(req.prefix_indices)
    if end > start:
        # what cache_unfinished_req leaves there for the part it does not cache: the request's own row
        row = scheduler.req_to_token_pool.req_to_token[req.req_pool_idx, :end]
        req.prefix_indices = row.to(dtype=req.prefix_indices.dtype, copy=True)
    return max(0, end - start)
