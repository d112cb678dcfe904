"""The auto switch (SPECFLIP_SWITCH=auto) inside the v2 switch: the learner of statemodel.auto_policy fed with the
server's own decode steps, its observations agreed across tensor-parallel ranks (docs/auto-switch.md).

What it observes, on the host, with no host-device sync:
- a step's seconds: the wall time between the `Scheduler.run_batch` calls of two consecutive decode batches of the
  same mode, with no flip and no idle iteration between (under the overlap schedule the host waits for step N-1's
  result before it launches step N+1, so at steady state this interval is the GPU's step time); attributed to the
  first. A prefill launched between them stays in: serving new requests is part of what a mode costs at that load
  (and at high concurrency a prefill runs between most decode steps, so leaving those out would leave little);
- the batch size of that step, and its context: the KV tokens of its longest request (prompt and output,
  `len(origin_input_ids) + len(output_ids)`, host lists; the same on every rank, so not agreed; `batch_context` says
  why the longest), which the learner takes into its estimates (issue 52: with long prompts a step reads much more
  KV, and where speculation pays moves). A decision values the modes at the context of the batch that runs next, as
  far as the host knows it (`next_context`): the longest of the running requests (prompt and output) and of the
  waiting ones (`Scheduler.waiting_queue`, which the load already counts: prompt, and output for a retracted one),
  not the last decode batch's: that is the previous phase's when a new phase's requests arrive (the H100,
  2026-12-06, 0b48981, bench/gpu/p99_account.py: 8 requests of 2,000-3,500-token prompts valued at the short phase's
  159 tokens kept speculation for 23 steps at 18.5 ms against plain's 7.6 ms);
- the tokens it committed: plain, one per request; speculative, the batch size times the mean accept length of the
  verify results processed since the last agreement (`result.accept_lens`, which SGLang has copied to the host and
  checked `is_cpu` before `process_batch_result` returns; read after it, summed on the CPU: SGLang's
  `scheduler_components/batch_result_processor.py`, as read in the lines of shim/releases/v0_5_16.py and v0_5_23.py,
  asserts `result.accept_lens.is_cpu` in the speculative decode's result processing and reads `.tolist()` there, the
  EAGLE worker v2's verify having filled `GenerationBatchResult.accept_lens` and `copy_to_cpu` moved it). A window
  that processed no verify result gives its speculative steps their seconds only (the learner keeps the accept length
  apart). The learner tracks it per window and rechecks speculation when it fell and may pay again
  (statemodel.auto_policy `_recheck_due`).
- the draft vocabulary's coverage of the tokens the target commits, where the draft's vocabulary is smaller than the
  target's (an EAGLE-3 draft's `draft_vocab_size`: SGLang's `hot_token_id`, read once at start-up into a host set,
  `draft_vocabulary`): per processed decode result, of the tokens it committed (plain: each request's newest output
  token; speculative: each request's last `accept_lens` tokens), those in that set, from the host's `req.output_ids`
  (no device read). A draft token outside its vocabulary is never accepted, so this share bounds the accept length
  speculation could reach (statemodel.auto_policy `accept_bound`), and plain steps show it: the learner rechecks
  speculation as soon as it rose and skips rechecks it says cannot pay. Absent for a draft with the target's whole
  vocabulary: then the learner behaves as without it.
- with tiers (SPECFLIP_TIERS beside SPECFLIP_SWITCH=auto): each step's step count, and each verify result's accept
  lengths summed per step count (the switch tells which result ran at which: `on_launched`), so the learner learns
  the accept length per tier.
- a flip-on's catch-up: the tokens the retracted requests re-prefill (`on_flip_on`) and those of waiting requests
  admitted into the same prefills, and the seconds from the flip to the first speculative decode launch
  (statemodel.auto_policy.gate_catch_up: a flip-on on the numbers with requests running must save them more than
  their catch-up costs; `decide` takes the batch's counts lazily, `batch_work`).

Rank agreement (issue 16): every rank runs the same batches, so the decode-step count, the modes and the batch
sizes are the same on every rank; the seconds are not (per-rank clocks). Every `window` decode steps, counted
identically on every rank, the window's seconds and accept sums are all-reduced (MAX) over SGLang's CPU group
(`scheduler.tp_cpu_group`, gloo) and only then fed to the learner; at TP 1 no collective runs. Every decision reads
only the learner's state, which is a function of agreed observations, and the counts every rank has, so every
rank flips at the same scheduler step. The decision's context (`next_context`) is read from host lists every rank
has alike: the running requests' and the waiting queue's token ids (SGLang broadcasts each received request over
the TP group before any rank queues it: `broadcast_pyobj` from the group's first rank, in
scheduler_components/request_receiver.py as read in the line of shim/releases/v0_5_23.py; so the queue, whose
length the load counts, is the same on every rank). The switch trace records each window (`auto_observe`) and each
flip with the learner's inputs and a digest of its state; `specflip.ranks.check_switch_agreement` compares them
across ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import attrs

from shim.switch.warmup import is_warmup_batch
from statemodel import auto_policy as ap

AGREE_WINDOW = ap.AutoParams().agree_window  # decode steps between agreements (the learner prices rechecks by it)


@dataclass
class AutoSwitch:
    """The learner and what feeds it, in one scheduler process."""

    spec_cap: int
    window: int = AGREE_WINDOW
    state: ap.AutoState = field(default_factory=ap.initial_state)
    clock: Callable[[], float] = time.perf_counter  # the host's clock; tests pass a stand-in for the GPU's steps
    # (spec_on, batch) of the steps measured in this window, their step counts (tiers; else None) and their
    # seconds (per rank until agreed)
    pending: list[tuple[bool, int]] = field(default_factory=list)
    pending_steps: list[int | None] = field(default_factory=list)
    pending_context: list[float] = field(default_factory=list)  # their contexts (`batch_context`)
    seconds: list[float] = field(default_factory=list)
    accept_tokens: int = 0  # verify results processed in this window: accept lengths summed, and rows
    accept_rows: int = 0
    # tiers: the same per step count, {steps: [tokens, rows]}
    accept_by_steps: dict[int, list[int]] = field(default_factory=dict)
    accept_mean: float = 1.0  # the last agreed mean accept length (tokens per request per speculative step)
    decode_steps: int = 0  # decode run_batch calls seen (the same count on every rank)
    # (time, spec_on, batch, flips, steps, context) of the last decode launch
    prev: tuple[float, bool, int, int, int | None, float] | None = None
    context: float | None = None  # the context (`batch_context`) of the last decode batch (None before one)
    # tiers: id() of each launched speculative decode's result -> its step count, until the result is processed
    result_steps: dict[int, int] = field(default_factory=dict)
    last: ap.Decision | None = None
    tier: int | None = None  # tiers: the step count of the last committed decision (what the switch runs)
    agreements: int = 0
    rank: int = 0  # the scheduler's TP rank (trace records only)
    # a flip-on's catch-up: (clock at the flip, tokens re-prefilled so far, rids counted: the retracted requests',
    # then any admitted into their re-prefill) until the first speculative decode launch, then (tokens, seconds)
    # until the window's agreement
    catch_up_started: tuple[float, int, frozenset[str]] | None = None
    catch_up_seen: tuple[int, float] | None = None
    catch_up_holds: int = 0  # scheduling points where a flip-on on the numbers waited for its catch-up to pay
    held_rids: frozenset[str] | None = None  # the requests running when the current hold began
    warming: bool = False  # the start-up warm-up's decodes are running (shim/switch/warmup.py): nothing learned
    traced: tuple[Any, ...] | None = None  # the last decision's key written by `trace_decision`
    # the clock at the first idle iteration since the last decode step (None: none since): the idle time the hold
    # counts (`before_decision`)
    idle_since: float | None = None
    # rid -> the learner step (`state.step`, agreed) at the first scheduling point that saw the request, running or
    # waiting, for the requests of the last decision's next batch: when each arrived, for the recheck's turnover
    # (statemodel.auto_policy `_recheck_due`); the same on every rank (the requests and the agreed steps are)
    first_seen: dict[str, int] = field(default_factory=dict)
    # the draft's vocabulary (target token ids) where it is smaller than the target's (`draft_vocabulary`, read at
    # start-up); None: no coverage signal. The window's committed tokens counted, and those in it
    vocab: frozenset[int] | None = None
    cover_tokens: int = 0
    cover_hits: int = 0
    # ... and per request, rid -> [hits, tokens] over its life, for the requests of the last decision's next batch:
    # a recheck weighs the coverage of the requests it would measure (`batch_coverage`), not the window's blend of the
    # ones before them; the same on every rank (host lists of the same requests)
    request_cover: dict[str, list[int]] = field(default_factory=dict)
    batch_cover: tuple[int, int] | None = None  # the last decision's `batch_coverage` (None: not counted)
    # a processed decode result of this window held a finished request (its last verify may be cut short by its
    # length, not by the draft): `Observation.finished`
    finished_seen: bool = False

    def __post_init__(self) -> None:
        # the learner prices a recheck by the windows this switch agrees at (AutoParams.recheck_span)
        if self.state.params.agree_window != self.window:
            self.state = attrs.evolve(self.state, params=attrs.evolve(self.state.params, agree_window=self.window))

    # --- decisions ------------------------------------------------------------------------------------------

    def decide(self, spec_on: bool, running: int, waiting: int, chunked: int = 0, steps: int | None = None,
               batch_work: Callable[[], tuple[int, int, frozenset[str]]] | None = None,
               context: float | None = None, rids: Iterable[str] | None = None) -> ap.Decision:
        """The learner's decision for these counts (the switch checks it against the model and performs it);
        `steps`: with tiers, the step count speculation runs at now; `batch_work`: (output tokens the running requests
        may still ask for, tokens their re-prefill would run, their rids), read only for a flip-on with requests
        running; `context`: the context of the batch that runs next (`next_context`; None or 0, none known: the last
        decode batch's); `rids`: the requests of the batch that runs next, running and waiting (`request_ids`; None:
        not known, no arrivals given)."""
        arrivals = self.batch_cover = None
        if rids is not None:
            step, seen = self.state.step, self.first_seen
            self.first_seen = {rid: seen.get(rid, step) for rid in rids}
            arrivals = tuple(self.first_seen.values())
            if self.vocab is not None:  # finished requests dropped; only plain rechecks weigh the batch's coverage
                cover = self.request_cover
                self.request_cover = {rid: cover[rid] for rid in self.first_seen if rid in cover}
                if not spec_on:
                    counts = self.request_cover.values()
                    self.batch_cover = (sum(c[0] for c in counts), sum(c[1] for c in counts))
        d = ap.decide(self.state, spec_on, running + waiting + chunked, running + chunked, self.spec_cap, steps=steps,
                      context=context or self.context, arrivals=arrivals, batch_coverage=self.batch_cover)
        if d.action == ap.FLIP_ON and d.reason == "measured" and running + chunked > 0 and batch_work is not None:
            remaining, catch_up, rids = batch_work()
            # held before, and every request held then has finished: the batch turned over (a steady load)
            turned_over = self.held_rids is not None and self.held_rids.isdisjoint(rids)
            d = ap.gate_catch_up(self.state, d, remaining, catch_up, turned_over=turned_over)
            held = d.reason == "catch_up"
            self.catch_up_holds += held
            self.held_rids = (self.held_rids or rids) if held else None
        elif not d.wants_flip and d.reason != "idle":  # an idle moment (a wave's turnover) keeps the hold
            self.held_rids = None  # the numbers no longer want speculation: a later hold starts afresh
        self.last = d
        return d

    def commit(self, decision: ap.Decision) -> None:
        """The switch performed `decision` (its flip or tier change, or it had none)."""
        self.state = ap.commit(self.state, decision)
        if decision.steps is not None:
            self.tier = decision.steps

    def trace_fields(self) -> dict[str, Any]:
        """The learner's inputs and state at the last decision, for the flip's trace record."""
        d = self.last
        if d is None:
            return {}
        return {"policy": "auto", "rank": self.rank, "reason": d.reason, "demand": d.demand, "load": d.load,
                "learner_step": d.step,
                "spec_value": None if d.spec_value is None else round(d.spec_value, 3),
                "plain_value": None if d.plain_value is None else round(d.plain_value, 3),
                "incumbent": self.mode_name(d.incumbent), "probes": self.state.probes,
                "rechecks": self.state.rechecks,
                "context": None if d.context is None else round(d.context, 1),
                "digest": self.state.digest(),
                **({} if self.state.coverage is None else {"coverage": round(self.state.coverage.mean, 4)}),
                **({} if self.batch_cover is None else {"batch_coverage": list(self.batch_cover)}),
                **({} if not d.recheck_debt else {"recheck_debt": round(d.recheck_debt, 1)}),
                **({} if not self.state.turnover_idle() else
                   {"turnover_idle_ms": round(1000 * self.state.turnover_idle(), 1)}),
                **({} if d.catch_up_s is None else {"saved_s": round(d.saved_s or 0.0, 4),
                                                     "catch_up_s": round(d.catch_up_s, 4)}),
                **({} if not self.state.tiers else
                   {"steps": d.steps, "values": {self.mode_name(m): None if v is None else round(v, 3)
                                                 for m, v in enumerate(d.values)}})}

    def trace_decision(self, trace: Any, running: int, waiting: int) -> None:
        """A decision unlike the one before it (reason, wanted flip, action or incumbent) in the switch trace
        (`auto_decide`): what the learner wanted between flips, where a flip that never came was held (a dwell, a
        confirmation cut short, a catch-up). Only while tracing; one record per change, not per step."""
        d = self.last
        key = None if d is None else (d.reason, d.wants_flip, d.action, d.incumbent)
        if key is None or key == self.traced:
            return
        self.traced = key
        trace.event("auto_decide", running=running, waiting=waiting, wants_flip=d.wants_flip, flip=d.action,
                    flip_step=self.state.flip_step, want_since=self.state.want_since, **self.trace_fields())

    def mode_name(self, mode: int) -> str:
        """A learner mode as traces name it: plain, spec (no tiers) or steps=N."""
        steps = self.state.steps_of(mode)
        return "plain" if mode == ap.PLAIN else "spec" if steps is None else f"steps={steps}"

    # --- observations ---------------------------------------------------------------------------------------

    def on_run_batch(self, scheduler: Any, batch: Any, flips: int, trace: Any = None,
                     steps: int | None = None) -> None:
        """At the entry of `Scheduler.run_batch`: time the previous decode step, agree the window when it is full.
        `steps`: with tiers, the step count this (speculative) batch runs at. A tier change does not cut the
        interval: it swaps graphs inside the next forward, after this clock read; the learner skips the first
        steps of every mode anyway (`settle`)."""
        if batch is not None and is_warmup_batch(batch):  # its steps pay kernel builds: not the steady state
            self.warming, self.prev, self.catch_up_started = True, None, None
            return
        if self.warming and batch is not None:  # the first batch after the warm-up: the learner starts afresh
            self.warming = False
            self.state = ap.initial_state(self.state.params, tiers=self.state.tiers)
            self.accept_tokens = self.accept_rows = 0
            self.cover_tokens = self.cover_hits = 0
            self.finished_seen = False
            self.accept_by_steps = {}
            self.held_rids = None
            self.first_seen = {}
            self.request_cover = {}
        if batch is None or not batch.forward_mode.is_decode():
            if batch is not None and self.catch_up_started is not None and batch.forward_mode.is_extend():
                self._count_admitted(batch)
            return  # a prefill between two decodes: its time counts to the decode step before it
        now = self.clock()
        self.rank = tp_rank(scheduler)
        spec_on = not batch.spec_algorithm.is_none()
        if self.catch_up_started is not None:  # the first decode after the flip-on: speculative, or flipped off again
            started, tokens, _ = self.catch_up_started
            self.catch_up_seen = (tokens, now - started) if spec_on else self.catch_up_seen
            self.catch_up_started = None
        bs = batch.batch_size()
        self.idle_since = None
        self.context = batch_context(batch)
        prev = self.prev
        if prev is not None and prev[1] == spec_on and prev[3] == flips:
            self.pending.append((prev[1], prev[2]))
            self.pending_steps.append(prev[4])
            self.pending_context.append(prev[5])
            self.seconds.append(now - prev[0])
        self.prev = (now, spec_on, bs, flips, steps if spec_on else None, self.context)
        self.decode_steps += 1
        if self.decode_steps % self.window == 0:
            self.agree(scheduler, trace)

    def on_flip_on(self, catch_up_tokens: int, retracted: frozenset[str] = frozenset()) -> None:
        """The switch flipped speculation on, retracting the requests `retracted`, whose re-prefill runs
        `catch_up_tokens` tokens (0: none running, nothing to time)."""
        self.catch_up_started = (self.clock(), catch_up_tokens, retracted) if catch_up_tokens > 0 else None

    def _count_admitted(self, batch: Any) -> None:
        """A prefill before the catch-up's first speculative decode: waiting requests admitted into it beside the
        retracted ones count their tokens too (prompt and output, as the retracted requests' do), since its seconds
        hold their prefill; each request once (a chunked prompt comes back in several prefills). The same on every
        rank: the batch is."""
        started, tokens, counted = self.catch_up_started
        admitted = [req for req in batch.reqs if str(req.rid) not in counted]
        if admitted:
            tokens += sum(len(req.origin_input_ids) + len(req.output_ids) for req in admitted)
            counted = counted | {str(req.rid) for req in admitted}
            self.catch_up_started = (started, tokens, counted)

    def on_idle(self) -> None:
        """An iteration with nothing to run: the next decode's interval would contain the idle time (and so would a
        catch-up being timed); the idle time starts here for the hold (`before_decision`)."""
        self.prev = None
        self.catch_up_started = None
        if self.idle_since is None:
            self.idle_since = self.clock()

    def before_decision(self, scheduler: Any, waiting: int) -> None:
        """At a scheduling point, before its decision: the first one with requests waiting after idle iterations
        (`on_idle`) ages the learner's demand hold by the idle time (statemodel.auto_policy.observe_idle: a few ms of
        a wave's turnover keep it, seconds between phases end it). The seconds are each rank's own clock, so they are
        agreed first (MAX over the TP CPU group, as a window is): every rank calls this at the same scheduling point,
        since the idle iterations (no batch to run), the waiting queue (SGLang broadcasts every received request from
        the group's first rank before any rank queues it, once per loop iteration) and the learner's state (agreed)
        are the same on every rank. One collective per idle stretch, none where no hold is live or at TP 1."""
        if self.idle_since is None or waiting <= 0:
            return
        since, self.idle_since = self.idle_since, None
        if self.warming or not ap.holding(self.state):
            return
        seconds = all_reduce_max(scheduler, [self.clock() - since])[0]
        self.state = ap.observe_idle(self.state, seconds, self.spec_cap)

    def on_launched(self, result: Any, steps: int) -> None:
        """After `Scheduler.run_batch` launched a speculative decode at `steps` (tiers): its result's step count,
        for `on_result` (under the overlap schedule the result is processed an iteration later, after the next
        tier may have been chosen)."""
        self.result_steps[id(result)] = steps

    def on_result(self, batch: Any, result: Any) -> None:
        """After `Scheduler.process_batch_result`: a verify's accept lengths, already on the host; the tokens the
        result committed, in the draft's vocabulary or not (`count_coverage`)."""
        steps = self.result_steps.pop(id(result), None)
        accept = getattr(result, "accept_lens", None)
        if batch is None or self.warming:
            return
        if batch.forward_mode.is_extend():  # a prefill commits its requests' first tokens
            self.count_coverage(batch.reqs, None, prefill=True)
            return
        if not batch.forward_mode.is_decode():
            return
        self.count_coverage(batch.reqs, accept)
        if accept is None:
            return
        # a verify's only (plain steps give no accept length; speculation runs at most `spec_cap` requests). Under the
        # overlap schedule a request that finished at the step before is still in this batch: the flag may come a
        # window late, which only keeps one more window out of a run
        self.finished_seen = self.finished_seen or any(req.finished() for req in batch.reqs)
        if getattr(accept, "is_cpu", False):  # never a device tensor: reading one would sync
            tokens, rows = int(accept.sum()), int(accept.numel())
            self.accept_tokens += tokens
            self.accept_rows += rows
            if steps is not None:
                per_tier = self.accept_by_steps.setdefault(steps, [0, 0])
                per_tier[0] += tokens
                per_tier[1] += rows

    def count_coverage(self, reqs: Any, accept: Any, prefill: bool = False) -> None:
        """The tokens a processed result committed, and those in the draft's vocabulary: per request its newest
        output token (a plain step: `accept` None), or its last accept length's tokens (a verify: `accept_lens`, on
        the host; a device tensor is not read, and rows that do not match the requests are not counted); a prefill's
        (`prefill`), a request's first output token (one whose prompt has more chunks to come commits none, and a
        retracted one's re-prefill is left out: what it commits there is not told apart from the tokens before; so
        two returning requests are weighed by a recheck a step sooner). Host lists only: `req.output_ids`, which the
        result's processing has extended (a request that finished in it is left out with the rest: its last tokens
        are not counted)."""
        vocab = self.vocab
        if vocab is None:  # no signal: nothing is counted
            return
        if prefill:
            per_req = [(req, req.output_ids) for req in reqs if len(req.output_ids) == 1]
        elif accept is None:
            per_req = [(req, req.output_ids[-1:]) for req in reqs]
        else:
            if not getattr(accept, "is_cpu", False):
                return
            lens = accept.tolist()
            if len(lens) != len(reqs):
                return
            per_req = [(req, req.output_ids[-n:]) for req, n in zip(reqs, lens, strict=True) if n > 0]
        for req, committed in per_req:
            # a finished or retracted request's result commits nothing (SGLang skips it; under the overlap schedule
            # one that finished at the step before is still in this batch): not counted, its last tokens included
            if not committed or req.finished() or req.is_retracted:
                continue
            hits = sum(map(vocab.__contains__, committed))
            self.cover_tokens += len(committed)
            self.cover_hits += hits
            counts = self.request_cover.setdefault(str(req.rid), [0, 0])
            counts[0] += hits
            counts[1] += len(committed)

    def agree(self, scheduler: Any, trace: Any = None) -> None:
        """Agree the window across ranks (MAX over the TP CPU group; nothing at TP 1), then feed the learner."""
        tiers = self.state.tiers  # every rank has the same ladder: the same length of values
        per_tier = [float(x) for s in tiers for x in self.accept_by_steps.get(s, (0, 0))]
        catch_up = self.catch_up_seen or (0, 0.0)  # its tokens are the same on every rank, its seconds are not
        # the coverage counts are the same on every rank (host lists of the same requests); agreed all the same, and
        # only where the signal exists (every rank reads the same draft)
        cover = [float(self.cover_hits), float(self.cover_tokens)] if self.vocab is not None else []
        values = [*self.seconds, float(self.accept_tokens), float(self.accept_rows), *per_tier, *cover,
                  float(self.finished_seen), float(catch_up[0]), catch_up[1]]
        values = all_reduce_max(scheduler, values)
        finished, catch_up_tokens, catch_up_s = values[-3] > 0, int(values[-2]), values[-1]
        values = values[:-3]
        coverage = None
        if cover:
            hits, counted, values = values[-2], values[-1], values[:-2]
            coverage = hits / counted if counted > 0 else None
        n = len(self.seconds)
        seconds, (tokens, rows) = values[:n], values[n:n + 2]
        # the verify results processed in this window: under the overlap schedule, those of the steps launched from
        # one before the window to one before its end. A window with none (its steps' results come after the
        # agreement) gives its steps no accept length: the last agreed one (1.0 before any) is not theirs
        mean = tokens / rows if rows > 0 else None
        if mean is not None:
            self.accept_mean = mean
        tier_sums = values[n + 2:]
        tier_means = {s: (tier_sums[2 * i] / tier_sums[2 * i + 1] if tier_sums[2 * i + 1] > 0 else None)
                      for i, s in enumerate(tiers)}
        tier_rows = {s: int(tier_sums[2 * i + 1]) for i, s in enumerate(tiers)}
        for (spec_on, bs), steps, sec, ctx in zip(self.pending, self.pending_steps, seconds, self.pending_context,
                                                  strict=True):
            step_mean = tier_means.get(steps) if tiers else mean
            tok = (None if step_mean is None else bs * step_mean) if spec_on else float(bs)
            self.state = ap.observe(self.state, ap.Observation(spec_on=spec_on, batch=bs, tokens=tok, seconds=sec,
                                                               steps=steps, context=ctx, coverage=coverage,
                                                               finished=finished,
                                                               rows=tier_rows.get(steps, 0) if tiers else int(rows)))
        if catch_up_tokens > 0:
            self.state = ap.observe_catch_up(self.state, catch_up_tokens, catch_up_s)
        self.catch_up_seen = None
        self.agreements += 1
        if trace is not None:
            trace.event("auto_observe", rank=self.rank, decode_step=self.decode_steps, n=len(self.pending),
                        spec=sum(1 for s, _ in self.pending if s), seconds=round(sum(seconds), 6),
                        accept_mean=None if mean is None else round(mean, 4), learner_step=self.state.step,
                        context=round(sum(self.pending_context) / n, 1) if n else None,
                        digest=self.state.digest(),
                        **({} if coverage is None else {"coverage": round(coverage, 4)}),
                        **({} if not rows else {"rows": int(rows), "accept_learned": self.accept_learned()}),
                        **({} if not finished else {"finished": True}),
                        **({} if not catch_up_tokens else {"catch_up_tokens": catch_up_tokens,
                                                           "catch_up_s": round(catch_up_s, 6)}),
                        **({} if not tiers else {"accept_by_steps": {
                            str(s): None if m is None else round(m, 4) for s, m in tier_means.items()}}))
        self.pending, self.pending_steps, self.pending_context, self.seconds = [], [], [], []
        self.accept_tokens = self.accept_rows = 0
        self.cover_tokens = self.cover_hits = 0
        self.finished_seen = False
        self.accept_by_steps = {}

    def accept_learned(self) -> dict[str, list[float]]:
        """Per speculative mode the learner holds an accept length for (trace name): [its estimate, the run of samples
        a clear win off it (signed), their spread per verify result] (`AutoState.accept_runs`): whether and when a
        shift was relearned, which the windows' means alone do not tell."""
        runs = {m: (r, v) for m, r, v, _ref in self.state.accept_runs}
        return {self.mode_name(m): [round(e.mean, 4), *((runs[m][0], round(runs[m][1], 4)) if m in runs else ())]
                for m, e in self.state.accepts}


def draft_vocabulary(worker: Any) -> frozenset[int] | None:
    """The draft's vocabulary as target token ids, read once at start-up from SGLang's speculative worker (the v2
    EAGLE worker, every line specflip supports): its draft worker's (`EagleDraftWorker`, the v2 worker's
    `draft_worker`) `hot_token_id`, which `init_lm_head` takes from an EAGLE-3 draft model's `d2t` buffer (draft id +
    d2t = target id; `LlamaForCausalLMEagle3.load_weights`) or `init_token_map` loads from `--speculative-token-map`,
    before the worker's CUDA graphs are captured; a worker that holds it itself (the v1 `EAGLEWorker`) is read as
    such. None where the draft proposes from the target's whole vocabulary (no map, or one that covers
    `target_worker.model_config.vocab_size` ids): then there is no coverage signal. One device read, here only. (On
    the H100, 2026-12-07, main 1c4e1ad, the v2 worker itself was read: `hot_token_id` is not its attribute, and the
    counter draft's 1,024 ids went unread: `auto_draft_vocabulary` size None.)"""
    hot = getattr(worker, "hot_token_id", None)
    if hot is None:
        hot = getattr(getattr(worker, "draft_worker", None), "hot_token_id", None)
    if hot is None:
        return None
    ids = frozenset(int(t) for t in (hot.tolist() if hasattr(hot, "tolist") else hot))
    target = getattr(getattr(getattr(worker, "target_worker", None), "model_config", None), "vocab_size", None)
    if not ids or (target is not None and len(ids) >= int(target)):
        return None
    return ids


def batch_context(batch: Any) -> float:
    """The context a decode batch's step is valued at: the KV tokens (prompt and output) of its longest request, from
    the host's lists (no device read), the same on every rank; 0 (not known) for a batch whose requests carry no such
    lists. The longest, not the mean: on the H100 (2026-12-06, 59347e0; the 8B pair, triton attention) a speculative
    step at 4 requests with one 2,800-token request among 32-token ones took 13.7 ms, as at 2 requests both that long
    (13.9 ms), against 7.4 ms with all four short; at 24 requests with 3 long ones 16.3 ms (8 all long: 20.4 ms). The
    mean (757 and 332 tokens there) valued such a batch as nearly short: at 24 clients the learner found no step near
    that context, and the prior flipped speculation on (issue 52). Plain decoding's step hardly moved either way
    (6.9-7.3 ms)."""
    return max(map(request_context, getattr(batch, "reqs", None) or ()), default=0.0)


def next_context(running: Iterable[Any], waiting: Iterable[Any]) -> float:
    """The context a decision values the modes at: that of the batch that runs next, as far as the host knows it,
    the KV tokens of its longest request, among the running requests (prompt and output) and the waiting ones
    (`Scheduler.waiting_queue`: a new request's prompt; a retracted one's prompt and output, which its re-prefill
    runs); 0 where none is known. Host lists only, the same on every rank. The waiting requests are the ones a new
    phase brings: valued at the last decode batch's context, 8 requests of 2,000-3,500-token prompts arriving after
    a short phase were valued at its 159 tokens and kept speculation (23 steps at 18.5 ms against plain's 7.6 ms),
    and 8 short ones after a long phase at its 3,340-3,592 tokens and ran plain, then flipped on with 8 running and
    paid a catch-up (the H100, 2026-12-06, 0b48981; bench/gpu/p99_account.py on
    bench/gpu/results/2026-12-06_0b48981/call_a)."""
    return max(map(request_context, chain(running, waiting)), default=0.0)


def request_ids(running: Iterable[Any], waiting: Iterable[Any]) -> list[str]:
    """The rids of the batch that runs next, as far as the host knows it: the running requests and the waiting ones
    (`Scheduler.waiting_queue`); host lists only, the same on every rank (each request is broadcast before any rank
    queues it). The learner stamps each with the step it was first seen at (`AutoSwitch.decide`): the recheck's
    turnover of the requests (statemodel.auto_policy `_recheck_due`)."""
    return [str(req.rid) for req in chain(running, waiting)]


def request_context(req: Any) -> float:
    """A request's KV tokens from the host's lists: prompt and output (0 for one that carries no such lists)."""
    return float(len(getattr(req, "origin_input_ids", ())) + len(getattr(req, "output_ids", ())))


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
