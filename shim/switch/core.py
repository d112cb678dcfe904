"""The switch core: what the two switches (the v1 EAGLEWorker's, shim/switch/v1.py, and the v2 one's,
shim/switch/v2.py) share, written once.

* the runtime's common state (`SwitchCore`; each switch's `SwitchRuntime` adds its own fields);
* the flip of the plain path (draft mode "retract", the default on both workers): `plain_path_flip` decides (the
  demand the policy reads, no flip during a chunked prefill, flip-on's wait, the late-flip fault), sequences (leave
  speculation, reseat seq_lens, enter the plain side; or retract for the catch-up, give the radix flags back, enter
  speculation) and records every flip; `flip_done`, every flip's bookkeeping (the counters the step trace reads,
  the record, the guard's notification), also for the in-step flips of draft mode "sync";
* what a flip-off points at the plain side on either worker (`enter_plain_side`), and the target's plain forward of
  a spec-off step inside the speculative worker (`plain_forward`);
* the admission cap's hook (`allocatable_hook`: speculation's running cap on new admissions while it is on);
* the demand the policy reads off the scheduler, the trace's config record and the guard's announcement, the
  warm-up's trace tag, a decode step's stream and CUDA-event timer;
* the hook table's installation (`install_hooks`, with the warm-up).

What a worker does its own way is behind `WorkerSide`, one implementation per worker (`V1Side` in
shim/switch/v1_plain_path.py, `V2Side` in shim/switch/v2.py): what its flip does first (v2: the guard's
notification and the in-flight result drained; v1: nothing, its loops process every result before the flip), how a
flip-off makes the batches plain (v1: finished requests filtered, the output ids; v2: the KV reserve released) and
what it points at the plain side besides the core's (v1: the overlap loop's flag; v2: the future map, the prefill
graphs), which requests a flip-on retracts and how (v1: ScheduleBatch.retract_all; v2: schedule_batch.retract_all,
finished ones filtered after a drain), how speculation is entered again, and how a flip is recorded (v1 also counts
it as a model action; v2 leaves its counters to the steps, whose sum paces SPECFLIP_SWITCH_TRACE_EVERY).

Each switch keeps what differs beyond that: its hook targets and hook bodies, i.e. where it flips (v1: at
prepare_for_decode with the demand read at update_running_batch, or at get_next_batch_to_run; v2: at
update_running_batch and, idle, at the admission cap's hook, or at get_next_batch_to_run); its plain step inside the
speculative worker (v1: a worker copy and v1's per-token bookkeeping, then forward_draft_extend_after_decode; v2: a
verify-shaped result inside _forward_isolation, then _draft_extend_for_decode); its step trace (v1 samples per step
kind, v2 on the sum of its counters and after an idle gap); and its plain-runner capture.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from shim.guard import api as guard_api
from shim.releases.registry import installed_line
from shim.switch import faults, warmup
from shim.switch.auto import next_context, request_ids
from shim.switch.config import SwitchConfig
from shim.switch.faults import LateFlipFault
from shim.switch.policy import SwitchPolicy
from shim.switch.radix_keep_out import give_back_flags
from shim.switch.swap import AttributeSwap, plain_runner_side
from shim.timing.jsonl import JsonlTrace

# one hook: (dotted SGLang target, the hook, HookRegistry's HookType name: "AROUND", "AFTER", "BEFORE")
Hook = tuple[str, Callable[..., Any], str]


@dataclass
class SwitchCore:
    """What either switch's hooks share inside one scheduler process (each switch's `SwitchRuntime` adds its own)."""

    config: SwitchConfig
    policy: SwitchPolicy
    trace: JsonlTrace
    steps_since_flip: int = 0
    flips: int = 0
    plain_runner: Any = None  # the decode CUDA graph runner for plain steps (None: eager)
    plain_attn_backend: Any = None
    counters: dict[str, int] = field(default_factory=dict)
    # draft mode "retract": what the switch's entry into the plain path swapped out, put back at flip-on
    spec_side: AttributeSwap = field(default_factory=AttributeSwap)
    late_flip: LateFlipFault | None = None  # FAULT INJECTION for tests only (SPECFLIP_FAULT_LATE_FLIP); None: off

    @property
    def plain_path(self) -> bool:
        """Whether speculation off runs SGLang's own plain scheduler path (draft mode "retract")."""
        return self.config.draft_while_off == "retract"

    @property
    def first_after_flip(self) -> bool:
        """Whether the decode step about to run is the first since a flip."""
        return self.steps_since_flip == 0 and self.flips > 0

    def count(self, key: str) -> None:
        self.counters[key] = self.counters.get(key, 0) + 1


@runtime_checkable
class WorkerSide(Protocol):
    """What one EAGLE worker's switch does its own way at a flip of the plain path; `plain_path_flip` does the rest.
    Implementations: `shim.switch.v1_plain_path.V1Side`, `shim.switch.v2.V2Side`."""

    # the worker applies the switch's speculative tier (SPECFLIP_TIERS; v2 only): the core follows the demand with it
    follows_tiers: bool

    def flip_on_waits(self, running_batch: Any, pending: Any) -> bool:
        """Whether flip-on must wait an iteration: the core's rule `flip_on_waits`, through the name the worker's
        module holds, so that a test can take the wait out for one worker (tests/test_switch_retract.py)."""
        ...

    def flip_starting(self, scheduler: Any, reqs: list[Any]) -> dict[str, Any]:
        """A flip is about to act on `reqs`: what the worker does first (v2: the guard's notification, the in-flight
        result drained). Returns the flip record's fields it adds (in their order), later ones updated in place."""
        ...

    def leave_spec(self, rt: Any, scheduler: Any, running_batch: Any, pending: Any, reqs: list[Any]) -> dict[str, Any]:
        """Flip-off, on the batches (the running one and a prefilled one not merged yet, `pending`): speculation's
        per-batch state off. Returns record fields to update."""
        ...

    def enter_plain(self, rt: Any, scheduler: Any) -> None:
        """Flip-off: point the scheduler and the target's model runner at the plain side (`rt.spec_side` keeps what
        was there; `enter_plain_side` does what both workers point)."""
        ...

    def to_retract(self, scheduler: Any, running_batch: Any, record: dict[str, Any]) -> list[Any]:
        """Flip-on: the running requests it retracts (their re-prefill with speculation is the draft's catch-up)."""
        ...

    def retract(self, scheduler: Any, running_batch: Any, reqs: list[Any]) -> None:
        """Flip-on: release `reqs` without tree insertion, their output kept (the core queues them again)."""
        ...

    def enter_spec(self, rt: Any, scheduler: Any, running_batch: Any) -> None:
        """Flip-on: undo `enter_plain`; the (now empty) running batch speculative again."""
        ...

    def record_flip(self, rt: Any, action: str, record: dict[str, Any]) -> None:
        """Write the flip's record (the trace; v1 also counts the model action)."""
        ...


def _pending_prefill(scheduler: Any, running_batch: Any, last_batch: Any) -> Any:
    """The prefilled batch get_next_batch_to_run will merge (SGLang's `last_batch`), or None."""
    if last_batch is None or last_batch is running_batch or not last_batch.forward_mode.is_extend():
        return None
    return last_batch


def flip_on_waits(running_batch: Any, pending: Any) -> bool:
    """Whether flip-on must wait an iteration: a prefilled batch is not merged yet, or the running batch still
    holds finished requests (update_running_batch filters them, merge_batch merges it, the guard sees both)."""
    return pending is not None or any(r.finished() for r in running_batch.reqs)


def catch_up_work(reqs: list[Any]) -> tuple[int, int, frozenset[str]]:
    """(output tokens `reqs` may still ask for, tokens their re-prefill runs: prompt and output, their rids): what a
    flip-on's retraction of `reqs` would save and cost (statemodel.auto_policy.gate_catch_up); remaining -1 when a
    request sets no max_new_tokens (no bound: nothing is gated). Python ints, lists and strings only."""
    remaining = catch_up = 0
    for req in reqs:
        out = len(req.output_ids)
        limit = req.sampling_params.max_new_tokens
        if limit is None:
            remaining = -1
        elif remaining >= 0:
            remaining += max(0, int(limit) - out)
        catch_up += len(req.origin_input_ids) + out
    return remaining, catch_up, frozenset(str(req.rid) for req in reqs)


def plain_path_flip(rt: SwitchCore, side: WorkerSide, scheduler: Any, running_batch: Any, last_batch: Any,
                    decide_only: bool = False) -> str | None:
    """Decide and perform a flip of the plain path (draft mode "retract") for the iteration get_next_batch_to_run
    is about to plan, before anything of it is prepared; returns the flip performed, or None. `decide_only`: the
    flip the policy wants now, nothing performed (v1_loop drains the result in flight first when one is due).

    Demand is every unfinished request of the running batch and of a prefilled batch not merged yet, plus the
    waiting queue. No flip while a chunked prefill is in progress (its earlier chunks would straddle the flip).
    flip_on waits while the running batch still holds requests that finished (update_running_batch filters them
    next) or a prefilled batch waits to be merged: the model lets the flip come later, and so the running batch it
    retracts is exactly the model's."""
    if scheduler.chunked_req is not None:
        return None  # a chunked prefill never straddles a flip: its earlier chunks' draft KV
    pending = _pending_prefill(scheduler, running_batch, last_batch)
    in_batch = [r for r in running_batch.reqs if not r.finished()]
    if pending is not None:
        in_batch += [r for r in pending.reqs if not r.finished()]
    waiting = len(scheduler.waiting_queue)
    # auto values the modes at the longest request of the batch that runs next: the running ones and those waiting
    context = None if rt.policy.auto is None else next_context(in_batch, scheduler.waiting_queue)
    # ... and stamps each of those requests with the step it first saw it at (a recheck waits for new ones)
    rids = None if rt.policy.auto is None else request_ids(in_batch, scheduler.waiting_queue)
    action = rt.policy.wants(len(in_batch), waiting, 0, batch_work=lambda: catch_up_work(in_batch), context=context,
                             rids=rids)
    if decide_only:
        return action
    if rt.policy.auto is not None and rt.trace.enabled:
        rt.policy.auto.trace_decision(rt.trace, len(in_batch), waiting)
    if action is None:
        steps = rt.policy.follow_tier(len(in_batch) + waiting) if side.follows_tiers else None
        if steps is not None:
            rt.trace.event("tier", **{**rt.policy.trace_fields(), "steps": steps, "running": len(in_batch),
                                      "waiting": waiting})
        return None
    if action == "flip_on" and side.flip_on_waits(running_batch, pending):
        return None
    if rt.late_flip is not None and rt.late_flip.delays(scheduler):
        return None  # fault injection only (shim/switch/faults.py): this rank flips a step late
    tic = time.perf_counter()
    record = side.flip_starting(scheduler, in_batch)
    retracted = 0
    if action == "flip_off":
        record.update(side.leave_spec(rt, scheduler, running_batch, pending, in_batch))
        if not running_batch.is_empty():
            reseat_seq_lens(running_batch)
        side.enter_plain(rt, scheduler)
    else:
        in_batch = side.to_retract(scheduler, running_batch, record)
        if in_batch:
            if rt.policy.auto is not None:  # the catch-up the learner times (to the first speculative decode)
                _, tokens, rids = catch_up_work(in_batch)
                rt.policy.auto.on_flip_on(tokens, rids)
            side.retract(scheduler, running_batch, in_batch)
            for req in in_batch:
                scheduler._add_request_to_queue(req, is_retracted=True)
            retracted = len(in_batch)
        give_back_flags(scheduler.waiting_queue)  # re-prefilled with the draft: the tree may cache them again
        side.enter_spec(rt, scheduler, running_batch)
    rt.policy.performed(action)
    if action == "flip_on" and side.follows_tiers:  # the tier for the demand flip-on found (the re-prefill's)
        rt.policy.follow_tier(len(in_batch) + waiting)
    faults.flip_performed(action)
    running_batch.batch_is_full = False  # admission was held at speculation's cap, which marks the batch full
    # running_batch is empty after flip-on: the guard still reads its pool
    flip_done(rt, side, action, running_batch,
              {"running": len(in_batch), "waiting": waiting, **record, "retracted": retracted,
               "ms": round((time.perf_counter() - tic) * 1e3, 3), **rt.policy.trace_fields()})
    return action


def flip_done(rt: SwitchCore, side: WorkerSide, action: str, running_batch: Any, record: dict[str, Any]) -> None:
    """Every flip's bookkeeping once it changed the batches (the plain path's, and the in-step flips of draft mode
    "sync"): the flip counters the step trace reads, the worker's record of it, and the guard's notification (when
    loaded; without it the guard would judge the next plain step as a speculative one)."""
    rt.flips += 1
    rt.steps_since_flip = 0
    side.record_flip(rt, action, record)
    guard_api.notify_flip(action == "flip_on", running_batch)


def reseat_seq_lens(batch: Any) -> None:
    """A plain decode reads seq_lens on the batch, which speculation leaves behind (v2: to the future map, the
    verify's accepts; v1: orig_seq_lens and seq_lens_sum): each request's committed length is the truth."""
    import torch

    lens = [installed_line().kv_row(req)[1] for req in batch.reqs]
    device = batch.seq_lens.device
    batch.seq_lens_cpu = torch.tensor(lens, dtype=torch.int64)
    batch.seq_lens = batch.seq_lens_cpu.to(device)
    orig_dtype = batch.orig_seq_lens.dtype if batch.orig_seq_lens is not None else torch.int32
    batch.orig_seq_lens = torch.tensor(lens, dtype=orig_dtype).to(device)
    batch.seq_lens_sum = sum(lens)


def enter_plain_side(rt: SwitchCore, scheduler: Any, runner_attr: str) -> None:
    """What a flip-off points at the plain side on either worker (`rt.spec_side` keeps what was there): the scheduler
    (new batches are formed plain: ScheduleBatch.init_new reads its spec_algorithm; run_batch calls the target
    worker) and the target's model runner (the plain decode graph runner at `runner_attr`, None: eager; the plain
    attention backend; spec_algorithm NONE)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    none = SpeculativeAlgorithm.NONE
    side = rt.spec_side
    side.set(scheduler, "spec_algorithm", none)
    side.set(scheduler, "model_worker", scheduler.tp_worker)
    for obj, name, value in plain_runner_side(rt, scheduler.tp_worker.model_runner, runner_attr, none):
        side.set(obj, name, value)


def plain_forward(rt: SwitchCore, target_worker: Any, runner_attr: str, batch: Any, **kwargs: Any) -> Any:
    """The target's plain DECODE forward of a spec-off step run inside the speculative worker (draft mode "sync"):
    the target's model runner on the plain side for the call (`runner_attr`: where the worker's target keeps its
    decode graph runner), the step counted by how it ran (plain_graph / plain_eager)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    with AttributeSwap.around(*plain_runner_side(rt, target_worker.model_runner, runner_attr,
                                                 SpeculativeAlgorithm.NONE)):
        res = target_worker.forward_batch_generation(batch, **kwargs)
    rt.count("plain_graph" if res.can_run_cuda_graph else "plain_eager")
    return res


def capture_plain_decode(rt: SwitchCore, mr: Any, runner_attr: str, runner_class: type,
                         keep_workspace_flag: bool = False) -> Any:
    """At start-up, beside the target's verify graphs: the plain side's attention backend and, where plain graphs are
    asked for and the target has a decode runner at `runner_attr`, a plain DECODE CUDA graph runner of `runner_class`
    (`rt.plain_attn_backend`, `rt.plain_runner`). A speculative target captures verify graphs only and the runner's
    graph check ignores forward_mode, so without its own runner a plain batch would replay a verify graph (design
    seeds_final_verify_graphs_only, refuted by the model). Returns the hidden-state mode it captured with: FULL where
    the draft sync reads the plain step's hidden states (draft mode "sync"), else NULL; it must be the one every plain
    batch asks for, because a runner recaptures every graph when a batch asks for another (seconds on an 8B target).
    `keep_workspace_flag`: the model runner has `init_new_workspace`, which a new backend may change: put it back."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    hidden_mode = CaptureHiddenMode.FULL if rt.config.draft_while_off == "sync" else CaptureHiddenMode.NULL
    # the runner picks DECODE, width 1, no verify spec_info
    with AttributeSwap.around((mr, "spec_algorithm", SpeculativeAlgorithm.NONE)) as swap:
        if keep_workspace_flag:
            swap.set(mr, "init_new_workspace", mr.init_new_workspace)
        rt.plain_attn_backend = mr._get_attention_backend(init_new_workspace=True)
        if rt.config.plain_graphs == "decode" and getattr(mr, runner_attr, None) is not None:

            class PlainDecodeCudaGraphRunner(runner_class):  # type: ignore[misc, valid-type]
                """Captured with the hidden-state mode the plain steps ask for (above)."""

                def capture(self, *a: Any, **k: Any) -> Any:
                    self.capture_hidden_mode = hidden_mode
                    return super().capture(*a, **k)

            rt.plain_runner = PlainDecodeCudaGraphRunner(mr, attn_backend=rt.plain_attn_backend)
    return hidden_mode


def allocatable_hook(runtime: Callable[[], SwitchCore | None],
                     idle: Callable[[SwitchCore, Any], Any] | None = None) -> Callable[..., int]:
    """The AROUND hook on Scheduler.get_num_allocatable_reqs: new admissions capped at speculation's running cap
    while it is on (SwitchPolicy.admission_cap), nothing while off. `runtime`: the switch's runtime (read at each
    call); `idle(rt, scheduler)`: called first while nothing runs (v2's in-step flip re-enables an idle server)."""

    def _allocatable_around(orig: Any, scheduler: Any, running_bs: int, *args: Any, **kwargs: Any) -> int:
        res = orig(scheduler, running_bs, *args, **kwargs)
        rt = runtime()
        if rt is None:
            return res
        if idle is not None and running_bs == 0:
            idle(rt, scheduler)
        return rt.policy.admission_cap(running_bs, res)

    return _allocatable_around


def demand(scheduler: Any) -> tuple[int, int]:
    """(requests waiting, 1 while one is being chunk-prefilled): the demand besides the running batch that the
    policy reads."""
    return (len(getattr(scheduler, "waiting_queue", ()) or ()),
            1 if getattr(scheduler, "chunked_req", None) is not None else 0)


def announce(trace: JsonlTrace, design: str, **config: Any) -> None:
    """The trace's first record (the design and the configuration, which holds `spec_cap`) and the guard's reference
    design and scope."""
    trace.event("config", design=design, **config)
    guard_api.announce_switch(design, config["spec_cap"])


def install_hooks(registry: Any, config: SwitchConfig, hooks: Sequence[Hook]) -> None:
    """Register `hooks` on `registry` (SGLang's HookRegistry class) in their order, then the warm-up, which runs every
    path a flip takes before the server listens."""
    from sglang.srt.plugins.hook_registry import HookType

    for target, hook, kind in hooks:
        registry.register(target, hook, HookType[kind])
    warmup.install(registry, config)


def mark_warmup(rt: SwitchCore | None, batch: Any) -> None:
    """At Scheduler.run_batch, with the trace on: the warm-up's records say so (bench/gpu/summarize.py leaves them
    out), every record of its steps (speculative ones too)."""
    if rt is not None and rt.trace.enabled:
        warmup.mark_trace(rt.trace, batch)


def step_stream(scheduler: Any) -> Any:
    """The stream a scheduler's decode step runs on: the scheduler's forward stream under the overlap loop (v2's;
    v1_loop.py's plain iterations), else None (the current one)."""
    return getattr(scheduler, "forward_stream", None) if getattr(scheduler, "enable_overlap", False) else None


def start_step_timer(stream: Any = None) -> tuple[Any, Any]:
    """(start, end) CUDA events with timing, `start` recorded on `stream` (None: the current one); the caller records
    `end` after the step and hands both to `JsonlTrace.timed` (read back when done: no host sync)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    return start, end
