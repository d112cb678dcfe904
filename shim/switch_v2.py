"""specflip's speculation switch for SGLang's v2 EAGLE worker (0.5.16), as plugin hooks only.

Speculation goes off when demand (running + prefilling + waiting requests) reaches `t_off` and back on when
demand falls to `t_on` and the running batch fits under speculation's running cap (hysteresis): the model's
own rule (statemodel.actions.policy_wants_off / policy_wants_on), evaluated on the scheduler's counts.
A spec-off step is a real plain DECODE of the target: one token per request, on a decode CUDA graph runner
captured at start-up beside the verify graphs, no drafting. Each function below is named after the model
action it performs (statemodel.actions: flip_off, flip_on, prepare_for_decode, plain_decode, draft_sync).

Enable with `SPECFLIP_SWITCH=t_off:t_on` and install with `install_switch(HookRegistry, SwitchConfig.from_env())`
from the plugin entry point (before `HookRegistry.apply_hooks()`, which `load_plugins` calls). Other knobs:
  SPECFLIP_SWITCH_DRAFT   sync (default: design v2_switch_reserve_sync, draft-extend after every plain step) |
                          none (KNOWN BAD, measurement only: no draft work while off, zeroed draft input)
  SPECFLIP_SPEC_CAP       running-request cap while speculation is on (default 48, SGLang's speculative default)
  SPECFLIP_PLAIN_GRAPHS   decode (default: capture a plain decode runner) | eager
  SPECFLIP_SWITCH_TRACE   a directory: one JSONL trace of switch actions per process (switch-<pid>.jsonl)

Launch the server with a high `--max-running-requests` (what plain decoding would run); the switch holds
admission at SPECFLIP_SPEC_CAP while speculation is on.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ENV_SWITCH = "SPECFLIP_SWITCH"
DRAFT_MODES = ("sync", "none")
GRAPH_MODES = ("decode", "eager")
DESIGN_FOR_DRAFT_MODE = {"sync": "v2_switch_reserve_sync", "none": "no_draft_work_while_off"}

# Hook targets (SGLang 0.5.16, docs/correspondence-research.md section 6).
T_FORWARD = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"
T_INIT_GRAPHS = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.init_cuda_graphs"
T_UPDATE_RUNNING = "sglang.srt.managers.scheduler.Scheduler.update_running_batch"
T_ALLOCATABLE = "sglang.srt.managers.scheduler.Scheduler.get_num_allocatable_reqs"

# The model actions (statemodel.actions.ACTION_CATALOGUE) one decode step performs, in order.
SPEC_STEP_ACTIONS = ("prepare_for_decode", "draft", "verify", "draft_extend")
PLAIN_STEP_ACTIONS = {"sync": ("prepare_for_decode", "plain_decode", "draft_sync"),
                      "none": ("prepare_for_decode", "plain_decode")}


class SwitchConfigError(ValueError):
    """A bad SPECFLIP_* setting; the message is one line."""


@dataclass(frozen=True)
class SwitchConfig:
    t_off: int
    t_on: int
    spec_cap: int = 48
    draft_while_off: str = "sync"
    plain_graphs: str = "decode"
    trace_dir: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.t_on < self.t_off:
            raise SwitchConfigError(f"{ENV_SWITCH}: need 0 <= t_on < t_off, got t_off={self.t_off} t_on={self.t_on}")
        if self.spec_cap < 1:
            raise SwitchConfigError(f"SPECFLIP_SPEC_CAP must be >= 1, got {self.spec_cap}")
        if self.draft_while_off not in DRAFT_MODES:
            raise SwitchConfigError(f"SPECFLIP_SWITCH_DRAFT must be one of {DRAFT_MODES}, got {self.draft_while_off!r}")
        if self.plain_graphs not in GRAPH_MODES:
            raise SwitchConfigError(f"SPECFLIP_PLAIN_GRAPHS must be one of {GRAPH_MODES}, got {self.plain_graphs!r}")

    @property
    def design_name(self) -> str:
        """The checker design (statemodel/designs.py) this configuration implements."""
        return DESIGN_FOR_DRAFT_MODE[self.draft_while_off]

    @classmethod
    def parse_thresholds(cls, text: str) -> tuple[int, int]:
        try:
            off, on = (int(x) for x in text.split(":"))
        except ValueError:
            raise SwitchConfigError(f"{ENV_SWITCH} must be 't_off:t_on' (two integers), got {text!r}") from None
        return off, on

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> SwitchConfig | None:
        """The configuration from SPECFLIP_* variables, or None when the switch is not enabled."""
        env = dict(os.environ) if env is None else env
        text = env.get(ENV_SWITCH, "").strip()
        if not text:
            return None
        off, on = cls.parse_thresholds(text)
        try:
            cap = int(env.get("SPECFLIP_SPEC_CAP", "48"))
        except ValueError:
            raise SwitchConfigError(f"SPECFLIP_SPEC_CAP must be an integer, got {env['SPECFLIP_SPEC_CAP']!r}") from None
        return cls(t_off=off, t_on=on, spec_cap=cap,
                   draft_while_off=env.get("SPECFLIP_SWITCH_DRAFT", "sync").strip() or "sync",
                   plain_graphs=env.get("SPECFLIP_PLAIN_GRAPHS", "decode").strip() or "decode",
                   trace_dir=env.get("SPECFLIP_SWITCH_TRACE") or None)


@functools.lru_cache(maxsize=4096)
def model_policy_action(design_name: str, spec_on: bool, running: int, waiting: int, chunked: int, t_off: int,
                        t_on: int, spec_cap: int) -> str | None:
    """'flip_off', 'flip_on' or None, as the model decides for these counts: the rule is the model's
    (statemodel.actions.policy_wants_off / policy_wants_on under the design), evaluated on a state holding
    `running` running, `chunked` prefilling and `waiting` waiting requests."""
    from statemodel.actions import policy_wants_off, policy_wants_on
    from statemodel.design import Scope
    from statemodel.designs import get_design
    from statemodel.state import EMPTY_BATCH, Batch, Request, SpecMode, Stage, State, Status, Thresholds

    statuses = [Status.RUNNING] * running + [Status.PREFILLING] * chunked + [Status.WAITING] * waiting
    requests = tuple(Request(rid=i, prompt_len=1, max_new_tokens=1, status=st) for i, st in enumerate(statuses))
    state = State(requests=requests, running=Batch(rids=tuple(range(running))) if running else EMPTY_BATCH,
                  pending=None, launched=None, stage=Stage.SCHEDULE,
                  spec_mode=SpecMode.ON if spec_on else SpecMode.OFF, num_steps=1, kv_free=0, kv_pool_size=0,
                  thresholds=Thresholds(t_off, t_on))
    design = get_design(design_name)
    if policy_wants_off(state, design):
        return "flip_off"
    if policy_wants_on(state, design, Scope(requests=(), spec_cap=spec_cap, plain_cap=1 << 30)):
        return "flip_on"
    return None


@dataclass
class SwitchPolicy:
    """The design's threshold policy (hysteresis, re-enabled only within speculation's cap). The flip rule is
    the model's own, evaluated on the counts the hooks see; the admission cap follows the mode."""

    config: SwitchConfig
    spec_on: bool = True

    def decide(self, running: int, waiting: int, chunked: int = 0) -> str | None:
        """'flip_off', 'flip_on' or None for the decode step about to be prepared; updates the mode."""
        c = self.config
        action = model_policy_action(c.design_name, self.spec_on, running, waiting, chunked, c.t_off, c.t_on,
                                     c.spec_cap)
        if action is not None:
            self.spec_on = action == "flip_on"
        return action

    def admission_cap(self, running: int, allocatable: int) -> int:
        """How many more requests may be admitted: speculation's cap while on, the launch cap while off."""
        if self.spec_on:
            return min(allocatable, self.config.spec_cap - running)
        return allocatable


class SwitchTrace:
    """JSONL of the switch's actions (model action names) and per-step device timings; no host syncs:
    CUDA events are read back only once they have completed."""

    def __init__(self, trace_dir: str | None) -> None:
        self._fh = None
        self._lock = threading.Lock()
        self._pending: list[tuple[Any, Any, dict[str, Any]]] = []
        self._flushed = 0.0
        if trace_dir:
            os.makedirs(trace_dir, exist_ok=True)
            self.path = os.path.join(trace_dir, f"switch-{os.getpid()}.jsonl")
            self._fh = open(self.path, "a", buffering=1 << 16)  # noqa: SIM115 - lives as long as the process
            threading.Thread(target=self._flush_loop, daemon=True, name="specflip-trace-flush").start()

    @property
    def enabled(self) -> bool:
        return self._fh is not None

    def _flush_loop(self) -> None:
        # an idle server writes nothing: flush from here so a live replay sees every event
        while True:
            time.sleep(0.5)
            with self._lock:
                if self._fh is not None:
                    self._fh.flush()

    def event(self, action: str, **info: Any) -> None:
        if self._fh is None:
            return
        now = time.time()
        with self._lock:
            self._fh.write(json.dumps({"t": round(now, 6), "action": action, **info}) + "\n")
            if now - self._flushed > 0.5:  # a live replay reads the file while the server runs
                self._fh.flush()
                self._flushed = now

    def timed(self, start: Any, end: Any, info: dict[str, Any]) -> None:
        if self._fh is None:
            return
        self._pending.append((start, end, info))
        self.drain()

    def drain(self, force: bool = False) -> None:
        keep = []
        for start, end, info in self._pending:
            if force or end.query():
                self.event("timing", ms=round(start.elapsed_time(end), 4), **info)
            else:
                keep.append((start, end, info))
        self._pending = keep
        if force and self._fh is not None:
            self._fh.flush()


@dataclass
class SwitchRuntime:
    """What the hooks share inside one scheduler process."""

    config: SwitchConfig
    policy: SwitchPolicy
    trace: SwitchTrace
    steps_since_flip: int = 0
    flips: int = 0
    plain_runner: Any = None
    plain_attn_backend: Any = None
    counters: dict[str, int] = field(default_factory=dict)

    def count(self, key: str) -> None:
        self.counters[key] = self.counters.get(key, 0) + 1


_RUNTIME: SwitchRuntime | None = None


def runtime() -> SwitchRuntime | None:
    return _RUNTIME


# ------------------------------------------------------------------------------------------------
# Scheduler side: flip_off / flip_on and the running cap


def flip(rt: SwitchRuntime, scheduler: Any, batch: Any) -> str | None:
    """Decide the mode for the decode step `update_running_batch` is about to prepare."""
    running = batch.batch_size() if batch is not None else 0
    waiting = len(getattr(scheduler, "waiting_queue", ()) or ())
    chunked = 1 if getattr(scheduler, "chunked_req", None) is not None else 0
    action = rt.policy.decide(running, waiting, chunked)
    if action is not None:
        rt.flips += 1
        rt.steps_since_flip = 0
        rt.trace.event(action, running=running, waiting=waiting, chunked=chunked)
        if action == "flip_off" and batch is not None:
            # admission was held at the speculative cap, which marks the batch full; without this reset the
            # waiting requests are admitted only after a running one finishes
            batch.batch_is_full = False
            running_batch = getattr(scheduler, "running_batch", None)
            if running_batch is not None:
                running_batch.batch_is_full = False
        # the guard (when loaded) must see the flip, or it judges the next plain step as a speculative one
        import shim.api

        shim.api.notify_flip(action == "flip_on", batch)
    return action


def _update_running_batch_around(orig: Any, self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    rt = _RUNTIME
    if rt is not None and batch is not None and not batch.is_empty():
        flip(rt, self, batch)
    return orig(self, batch, *args, **kwargs)


def _allocatable_around(orig: Any, self: Any, running_bs: int, *args: Any, **kwargs: Any) -> int:
    res = orig(self, running_bs, *args, **kwargs)
    rt = _RUNTIME
    if rt is None:
        return res
    if running_bs == 0 and not rt.policy.spec_on:
        # update_running_batch is not called while nothing runs: an idle server flips on here, before the
        # next prefill is formed (t_on = 0 re-enables only when idle)
        flip(rt, self, None)
    return rt.policy.admission_cap(running_bs, res)


# ------------------------------------------------------------------------------------------------
# Worker side


def capture_plain_decode_runner(worker: Any, rt: SwitchRuntime) -> None:
    """Capture a plain DECODE graph runner (1 token per request) for the target, beside its verify graphs.

    A speculative target captures TARGET_VERIFY graphs only and `can_run_graph` ignores forward_mode, so a
    plain batch would replay a verify graph: plain steps must run on their own runner (or eager).
    """
    import torch  # noqa: F401 - CUDA must be initialised here already
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    mr = worker.target_worker.model_runner
    hidden_mode = CaptureHiddenMode.FULL if rt.config.draft_while_off == "sync" else CaptureHiddenMode.NULL
    saved_algo, saved_ws = mr.spec_algorithm, getattr(mr, "init_new_workspace", None)
    tic = time.perf_counter()
    mr.spec_algorithm = SpeculativeAlgorithm.NONE  # the runner picks DECODE, width 1, no verify spec_info
    try:
        rt.plain_attn_backend = mr._get_attention_backend(init_new_workspace=True)
        if rt.config.plain_graphs == "decode" and mr.decode_cuda_graph_runner is not None:
            from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

            class PlainDecodeCudaGraphRunner(DecodeCudaGraphRunner):  # type: ignore[misc, valid-type]
                """Captures with the hidden-state mode the draft sync needs (a mismatch falls back to eager)."""

                def capture(self, *a: Any, **k: Any) -> Any:
                    self.capture_hidden_mode = hidden_mode
                    return super().capture(*a, **k)

            rt.plain_runner = PlainDecodeCudaGraphRunner(mr, attn_backend=rt.plain_attn_backend)
    finally:
        mr.spec_algorithm = saved_algo
        if saved_ws is not None:
            mr.init_new_workspace = saved_ws
    rt.trace.event("capture_plain_runner", seconds=round(time.perf_counter() - tic, 3),
                   graphs=rt.plain_runner is not None,
                   capture_bs=list(getattr(rt.plain_runner, "capture_bs", []) or []))


def _init_cuda_graphs_after(result: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    if _RUNTIME is not None:
        capture_plain_decode_runner(self, _RUNTIME)
    return result


def _worker_contexts(worker: Any) -> list[Any]:
    import sys

    mod = sys.modules["sglang.srt.speculative.eagle_worker_v2"]
    dw = worker.draft_worker
    if hasattr(dw, "draft_tp_context"):  # 0.5.16: a per-worker context factory over the draft's TP group
        ctxs = [dw.draft_tp_context(dw.draft_runner.tp_group)]
    else:  # 0.5.23: a module function over the draft's parallel layout (what forward_batch_generation enters)
        ctxs = [mod.draft_tp_context(dw.parallel_layout)]
    for name in ("speculative_moe_backend_context", "speculative_moe_a2a_backend_context"):
        if hasattr(mod, name):
            ctxs.append(getattr(mod, name)())
    return ctxs


def plain_decode(worker: Any, batch: Any, on_publish: Any, rt: SwitchRuntime) -> Any:
    """Model action plain_decode (+ draft_sync): a real DECODE of the target, one token per request.

    The slot comes from the v2 reserve `prepare_for_decode` already holds: req_to_token[row, seq_lens].
    Everything written to `batch` is undone by the scheduler's `_forward_isolation`.
    """
    import torch
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    sync = rt.config.draft_while_off == "sync"
    draft_input = batch.spec_info
    old = batch.seq_lens
    old_cpu, old_sum, old_orig = batch.seq_lens_cpu, batch.seq_lens_sum, batch.orig_seq_lens
    bs = old.shape[0]
    ndt = worker.speculative_num_draft_tokens
    r2t = worker.req_to_token_pool.req_to_token
    rows = batch.req_pool_indices
    spec_algo = batch.spec_algorithm

    batch.input_ids = draft_input.bonus_tokens.to(torch.int64)
    batch.out_cache_loc = r2t[rows, old].to(torch.int64)
    new = old + 1
    batch.seq_lens = new
    batch.seq_lens_cpu = None if old_cpu is None else old_cpu + 1
    batch.seq_lens_sum = None  # recomputed by ForwardBatch.init_new from seq_lens_cpu when present
    if old_orig is not None:
        batch.orig_seq_lens = old_orig + 1
    batch.forward_mode = ForwardMode.DECODE
    batch.spec_info = None
    batch.spec_algorithm = SpeculativeAlgorithm.NONE

    mr = worker.target_worker.model_runner
    saved = (mr.decode_cuda_graph_runner, mr.attn_backend, mr.spec_algorithm)
    mr.decode_cuda_graph_runner = rt.plain_runner
    if rt.plain_attn_backend is not None:
        mr.attn_backend = rt.plain_attn_backend
    mr.spec_algorithm = SpeculativeAlgorithm.NONE
    try:
        res = worker.target_worker.forward_batch_generation(
            batch, capture_hidden_mode=CaptureHiddenMode.FULL if sync else CaptureHiddenMode.NULL)
    finally:
        mr.decode_cuda_graph_runner, mr.attn_backend, mr.spec_algorithm = saved
    rt.count("plain_graph" if res.can_run_cuda_graph else "plain_eager")

    tokens = res.next_token_ids.to(torch.int64)
    if on_publish is not None:
        on_publish(new)
    # A verify-shaped result with one accepted token per request: the scheduler's spec-v2 bookkeeping and
    # the draft-extend graph (num_draft_tokens per request) take it unchanged.
    predict = tokens.new_zeros((bs, ndt))
    predict[:, 0] = tokens
    predict = predict.reshape(-1)
    accept_lens = torch.ones(bs, dtype=torch.int32, device=old.device)
    result = GenerationBatchResult(
        logits_output=res.logits_output, next_token_ids=predict, can_run_cuda_graph=res.can_run_cuda_graph,
        speculative_num_draft_tokens=ndt, next_draft_input=EagleDraftInput(bonus_tokens=tokens.to(torch.int32)),
        accept_lens=accept_lens, new_seq_lens=new,
    )
    keep = [batch.input_ids, batch.out_cache_loc, new, predict, accept_lens]
    if sync:
        draft_sync(worker, batch, result, old, old_cpu, old_sum, old_orig, spec_algo, keep)
    else:
        worker._stub_skipped_draft_extend(batch, result)
    if hasattr(result, "extra_keep_alive_refs"):
        result.extra_keep_alive_refs = list(result.extra_keep_alive_refs or []) + keep
    return result


def draft_sync(worker: Any, batch: Any, result: Any, old: Any, old_cpu: Any, old_sum: Any, old_orig: Any,
               spec_algo: Any, keep: list[Any]) -> None:
    """Model action draft_sync: a draft-extend over the one token the plain step committed, laid out as a
    verify with one accepted token (slot row 0 of each request's num_draft_tokens window)."""
    import contextlib

    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    bs = old.shape[0]
    ndt = worker.speculative_num_draft_tokens
    hidden = result.logits_output.hidden_states
    padded = hidden.new_zeros((bs, ndt, hidden.shape[-1]))
    padded[:, 0] = hidden[:bs]
    result.logits_output.hidden_states = padded.reshape(bs * ndt, hidden.shape[-1])
    r2t = worker.req_to_token_pool.req_to_token
    offsets = torch.arange(ndt, device=old.device, dtype=old.dtype)
    batch.out_cache_loc = r2t[batch.req_pool_indices[:, None], old[:, None] + offsets].reshape(-1).to(torch.int64)
    batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum, batch.orig_seq_lens = old, old_cpu, old_sum, old_orig
    batch.spec_algorithm = spec_algo
    batch.forward_mode = ForwardMode.DECODE
    keep += [padded, batch.out_cache_loc]
    with contextlib.ExitStack() as stack:
        for ctx in _worker_contexts(worker):
            stack.enter_context(ctx)
        worker.draft_worker._draft_extend_for_decode(batch, result)


def _forward_around(orig: Any, self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    rt = _RUNTIME
    if rt is None:
        return orig(self, batch, *args, **kwargs)
    is_extend = batch.forward_mode.is_extend() or batch.is_extend_in_batch
    if is_extend:
        rt.trace.event("prefill", bs=int(batch.seq_lens.shape[0]))
        return orig(self, batch, *args, **kwargs)
    bs = int(batch.seq_lens.shape[0])
    if batch.forward_mode.is_idle() or bs == 0:
        return orig(self, batch, *args, **kwargs)
    if args:  # forward_batch_generation(batch, on_publish=None): positional or keyword
        on_publish, args = args[0], args[1:]
    else:
        on_publish = kwargs.pop("on_publish", None)
    timing = rt.trace.enabled
    if timing:
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    first = rt.steps_since_flip == 0 and rt.flips > 0
    if rt.policy.spec_on:
        out = orig(self, batch, *args, on_publish=on_publish, **kwargs)
        rt.count("spec_step")
        actions = SPEC_STEP_ACTIONS
        kind = "spec"
    else:
        out = plain_decode(self, batch, on_publish, rt)
        rt.count("plain_step")
        actions = PLAIN_STEP_ACTIONS[rt.config.draft_while_off]
        kind = "plain"
    # one line per decode step (the model actions it performed, in order) keeps the trace cheap
    rt.trace.event("step", actions=actions, bs=bs, graph=bool(out.can_run_cuda_graph))
    if timing:
        end.record()
        rt.trace.timed(start, end, {"kind": kind, "bs": bs, "first_after_flip": first})
    rt.steps_since_flip += 1
    return out


# ------------------------------------------------------------------------------------------------
# Installation


def install_switch(registry: Any, config: SwitchConfig | None) -> bool:
    """Register the switch's hooks on `registry` (SGLang's HookRegistry class); False when config is None.

    Call from the plugin entry point before `HookRegistry.apply_hooks()` runs, e.g.
        install_switch(HookRegistry, SwitchConfig.from_env())
    """
    global _RUNTIME
    if config is None:
        return False
    from sglang.srt.plugins.hook_registry import HookType

    _RUNTIME = SwitchRuntime(config=config, policy=SwitchPolicy(config), trace=SwitchTrace(config.trace_dir))
    _RUNTIME.trace.event("config", design=config.design_name, t_off=config.t_off, t_on=config.t_on,
                         spec_cap=config.spec_cap, draft_while_off=config.draft_while_off,
                         plain_graphs=config.plain_graphs)
    registry.register(T_UPDATE_RUNNING, _update_running_batch_around, HookType.AROUND)
    registry.register(T_ALLOCATABLE, _allocatable_around, HookType.AROUND)
    registry.register(T_INIT_GRAPHS, _init_cuda_graphs_after, HookType.AFTER)
    registry.register(T_FORWARD, _forward_around, HookType.AROUND)
    return True


V1_WORKER_RELEASES = ("0.5.11", "0.5.12")  # the last lines that still ship the v1 EAGLEWorker


def v1_worker_selected(release: str | None, env: Mapping[str, str]) -> bool:
    """Whether this server runs SGLang's v1 EAGLEWorker, whose switch is shim/switch_v1.py: on the lines
    that still have it, SGLANG_ENABLE_SPEC_V2=0 selects it. Installing this (v2) switch there as well
    doubles the scheduler hooks (seen on the H200: two AROUND hooks on prepare_for_decode, a slot leaked)."""
    flag = env.get("SGLANG_ENABLE_SPEC_V2", "").strip().lower()
    return release in V1_WORKER_RELEASES and flag in ("0", "false", "no", "off")


def install_from_env() -> bool:
    """Install the switch as SPECFLIP_* say (idempotent); a bad setting logs one line and leaves it off."""
    if _RUNTIME is not None:
        return True
    from importlib.metadata import PackageNotFoundError, version

    try:
        release: str | None = version("sglang")
    except PackageNotFoundError:
        release = None
    if v1_worker_selected(release, os.environ):
        logging.getLogger("specflip.switch").info(
            "specflip v2 switch not installed: SGLANG_ENABLE_SPEC_V2=0 selects the v1 EAGLEWorker (shim/switch_v1.py)")
        return False
    try:
        config = SwitchConfig.from_env()
    except SwitchConfigError as exc:
        logging.getLogger("specflip.switch").error("specflip switch off: %s", exc)
        return False
    if config is None:
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry

    return install_switch(HookRegistry, config)


def plugin_entry() -> None:
    """Entry point (group `sglang.srt.plugins`) that installs only this switch (the GPU kit registers it)."""
    install_from_env()
