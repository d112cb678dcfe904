"""The auto switch (SPECFLIP_SWITCH=auto) inside the v2 switch: the learner of statemodel.auto_policy fed with the
server's own decode steps, its observations agreed across tensor-parallel ranks (docs/auto-switch.md).

What it observes, on the host, with no host-device sync:
- a step's seconds: the wall time between the `Scheduler.run_batch` calls of two consecutive decode batches of the
  same mode, with no flip and no idle iteration between (under the overlap schedule the host waits for step N-1's
  result before it launches step N+1, so at steady state this interval is the GPU's step time); attributed to the
  first. A prefill launched between them stays in: serving new requests is part of what a mode costs at that load
  (and at high concurrency a prefill runs between most decode steps, so leaving those out would leave little);
- the batch size of that step;
- the tokens it committed: plain, one per request; speculative, the batch size times the mean accept length of the
  verify results processed since the last agreement (`result.accept_lens`, which SGLang has copied to the host and
  checked `is_cpu` before `process_batch_result` returns; read after it, summed on the CPU). A window that processed
  no verify result gives its speculative steps their seconds only (the learner keeps the accept length apart).

Rank agreement (issue 16): every rank runs the same batches, so the decode-step count, the modes and the batch
sizes are the same on every rank; the seconds are not (per-rank clocks). Every `window` decode steps, counted
identically on every rank, the window's seconds and accept sums are all-reduced (MAX) over SGLang's CPU group
(`scheduler.tp_cpu_group`, gloo) and only then fed to the learner; at TP 1 no collective runs. Every decision reads
only the learner's state, which is a function of agreed observations, and the counts every rank has, so every
rank flips at the same scheduler step. The switch trace records each window (`auto_observe`) and each flip with the
learner's inputs and a digest of its state; `shim.guard.ranks.check_switch_agreement` compares them across ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from statemodel import auto_policy as ap

AGREE_WINDOW = 8  # decode steps between agreements (AutoParams.probe_steps counts it in)


@dataclass
class AutoSwitch:
    """The learner and what feeds it, in one scheduler process."""

    spec_cap: int
    window: int = AGREE_WINDOW
    state: ap.AutoState = field(default_factory=ap.initial_state)
    clock: Callable[[], float] = time.perf_counter  # the host's clock; tests pass a stand-in for the GPU's steps
    # (spec_on, batch) of the steps measured in this window, and their seconds (per rank until agreed)
    pending: list[tuple[bool, int]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    accept_tokens: int = 0  # verify results processed in this window: accept lengths summed, and rows
    accept_rows: int = 0
    accept_mean: float = 1.0  # the last agreed mean accept length (tokens per request per speculative step)
    decode_steps: int = 0  # decode run_batch calls seen (the same count on every rank)
    prev: tuple[float, bool, int, int] | None = None  # (time, spec_on, batch, flips) of the last decode launch
    last: ap.Decision | None = None
    agreements: int = 0
    rank: int = 0  # the scheduler's TP rank (trace records only)

    # --- decisions ------------------------------------------------------------------------------------------

    def decide(self, spec_on: bool, running: int, waiting: int, chunked: int = 0) -> ap.Decision:
        """The learner's decision for these counts (the switch checks it against the model and performs it)."""
        self.last = ap.decide(self.state, spec_on, running + waiting + chunked, running + chunked, self.spec_cap)
        return self.last

    def commit(self, decision: ap.Decision) -> None:
        """The switch performed `decision` (or it had no flip)."""
        self.state = ap.commit(self.state, decision)

    def trace_fields(self) -> dict[str, Any]:
        """The learner's inputs and state at the last decision, for the flip's trace record."""
        d = self.last
        if d is None:
            return {}
        return {"policy": "auto", "rank": self.rank, "reason": d.reason, "demand": d.demand, "learner_step": d.step,
                "spec_value": None if d.spec_value is None else round(d.spec_value, 3),
                "plain_value": None if d.plain_value is None else round(d.plain_value, 3),
                "incumbent": "spec" if d.incumbent else "plain", "probes": self.state.probes,
                "digest": self.state.digest()}

    # --- observations ---------------------------------------------------------------------------------------

    def on_run_batch(self, scheduler: Any, batch: Any, flips: int, trace: Any = None) -> None:
        """At the entry of `Scheduler.run_batch`: time the previous decode step, agree the window when it is full."""
        if batch is None or not batch.forward_mode.is_decode():
            return  # a prefill between two decodes: its time counts to the decode step before it
        now = self.clock()
        self.rank = tp_rank(scheduler)
        spec_on = not batch.spec_algorithm.is_none()
        bs = batch.batch_size()
        prev = self.prev
        if prev is not None and prev[1] == spec_on and prev[3] == flips:
            self.pending.append((prev[1], prev[2]))
            self.seconds.append(now - prev[0])
        self.prev = (now, spec_on, bs, flips)
        self.decode_steps += 1
        if self.decode_steps % self.window == 0:
            self.agree(scheduler, trace)

    def on_idle(self) -> None:
        """An iteration with nothing to run: the next decode's interval would contain the idle time."""
        self.prev = None

    def on_result(self, batch: Any, result: Any) -> None:
        """After `Scheduler.process_batch_result`: a verify's accept lengths, already on the host."""
        accept = getattr(result, "accept_lens", None)
        if accept is None or batch is None or not batch.forward_mode.is_decode():
            return
        if getattr(accept, "is_cpu", False):  # never a device tensor: reading one would sync
            self.accept_tokens += int(accept.sum())
            self.accept_rows += int(accept.numel())

    def agree(self, scheduler: Any, trace: Any = None) -> None:
        """Agree the window across ranks (MAX over the TP CPU group; nothing at TP 1), then feed the learner."""
        values = [*self.seconds, float(self.accept_tokens), float(self.accept_rows)]
        values = all_reduce_max(scheduler, values)
        seconds, (tokens, rows) = values[:-2], values[-2:]
        # the verify results processed in this window: under the overlap schedule, those of the steps launched from
        # one before the window to one before its end. A window with none (its steps' results come after the
        # agreement) gives its steps no accept length: the last agreed one (1.0 before any) is not theirs
        mean = tokens / rows if rows > 0 else None
        if mean is not None:
            self.accept_mean = mean
        for (spec_on, bs), sec in zip(self.pending, seconds, strict=True):
            tok = (None if mean is None else bs * mean) if spec_on else float(bs)
            self.state = ap.observe(self.state, ap.Observation(spec_on=spec_on, batch=bs, tokens=tok, seconds=sec))
        self.agreements += 1
        if trace is not None:
            trace.event("auto_observe", rank=self.rank, decode_step=self.decode_steps, n=len(self.pending),
                        spec=sum(1 for s, _ in self.pending if s), seconds=round(sum(seconds), 6),
                        accept_mean=None if mean is None else round(mean, 4), learner_step=self.state.step,
                        digest=self.state.digest())
        self.pending, self.seconds = [], []
        self.accept_tokens = self.accept_rows = 0


def tp_rank(scheduler: Any) -> int:
    return int(getattr(scheduler, "tp_rank", 0) or 0)


def all_reduce_max(scheduler: Any, values: list[float]) -> list[float]:
    """The element-wise maximum of `values` over the scheduler's tensor-parallel ranks, through SGLang's own CPU
    group (gloo); `values` unchanged at TP 1. Every rank calls it at the same decode step with a list of the same
    length (the window's steps are the same on every rank)."""
    if int(getattr(scheduler, "tp_size", 1) or 1) <= 1:
        return values
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=scheduler.tp_cpu_group)
    return [float(x) for x in tensor.tolist()]
