"""The runtime guard: the model State of one scheduler (TP rank), moved by the hooked SGLang steps.

SGLang-free: the release lines' adapters (`shim.releases`) read live objects into `shim.guard.observe` facts and call
the methods here, one per model action. Each call

1. takes the model's own next state, `statemodel.actions.apply(before, action, design, scope)`: that
   keeps the ghost fields SGLang does not carry (draft_kv_len, draft_hidden_ready, the stage, the
   runtime mode) exactly as the model's transition function moves them;
2. overwrites every field the live objects do carry (batch shape, spec_info, KV per request, the
   pool) with what was observed, so a bug in SGLang or in a flip implementation shows up;
3. checks the transition with `shim.guard.checks.step_violations` (the model's invariants, the model's
   stage/mode rules);
4. records it (history; trace file) and, in assert mode, raises `SpecFlipViolation`; in warn and trace
   mode logs, rate-limited.

`Guard` is the steps and their bookkeeping (the speculative round, the transition record); its state-sync with
the observed objects (step 2) is `shim.guard.sync.ObservedStateSync`, its reporting (step 4) is
`shim.guard.report.GuardReporting`, its settings `shim.guard.config` (Mode, GuardConfig, SpecFlipViolation and
GuardDesync stay importable from here).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from shim.guard.checks import device_seq_lens_unmirrored, state_violations, step_violations
from shim.guard.config import GuardConfig as GuardConfig  # re-exported, as the names below: shim.guard.core's API
from shim.guard.config import Mode as Mode
from shim.guard.identity import IdentityChecks
from shim.guard.observe import ObservedBatch, ObservedPool, ObservedRequest
from shim.guard.report import GuardReporting
from shim.guard.report import SpecFlipViolation as SpecFlipViolation
from shim.guard.sync import GuardDesync as GuardDesync
from shim.guard.sync import ObservedStateSync, _draft_covered_as_observed, _draft_prefilled_as_observed
from shim.guard.trace import (
    TraceWriter,
    scope_to_json,
    state_delta_json,
    state_to_json,
    violation_to_json,
)
from shim.guard.tree_draft import TreeDraftChecks
from statemodel.actions import Action, apply, prefill_action, result_rows, transitions_in
from statemodel.design import Design
from statemodel.invariants import Violation, draft_extend_leaves_behind
from statemodel.state import (
    EMPTY_BATCH,
    Request,
    SpecMode,
    Stage,
    State,
    Status,
)

# the steps that run the draft over requests' rows (statemodel.actions: `_draft_extend_all`)
_DRAFT_WRITES = frozenset({"draft_extend", "draft_sync", "draft_catch_up"})


@attrs.define
class _Round:
    """A speculative round in flight: drafted (and launched for verify), result not yet processed."""

    observe: Callable[[], tuple[ObservedBatch, list[ObservedRequest], ObservedPool]]
    extend: str | None = None  # "draft_extend" or "skip_draft_extend" once the worker chose


@attrs.frozen
class _Release:
    """A finished request's release inside a free group, as observed there, not yet checked (`Guard.release`)."""

    rid: str
    reqs: list[ObservedRequest]
    pool: ObservedPool
    where: str
    found: list[Violation]  # what the identity checks found in it


class Guard(ObservedStateSync, GuardReporting, IdentityChecks, TreeDraftChecks):
    """Model state + checks for one TP rank. Not thread-safe: one scheduler thread drives it."""

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.state = self._initial_state()
        self.step_number = 0
        # (step, action, where, request name) per transition, or a note; formatted only when a message is built
        self.history: deque[tuple[int, Action, str, str | None] | str] = deque(maxlen=config.history)
        self.covered: dict[str, int] = {}
        self.round: _Round | None = None
        # the releases of finished requests inside the allocator's free group (one result's processing), by model id,
        # checked as one step when the group ends (`end_release_group`) or before any other step
        self.releasing: dict[int, _Release] = {}
        self.in_free_group = False
        self.last_action: Action | None = None
        self._init_reporting()
        self._init_identity()
        self._init_tree_draft()
        self.trace: TraceWriter | None = TraceWriter(config.trace_path) if config.trace_path else None
        if self.trace is not None:
            self.trace.write({"kind": "header", "rank": config.rank, "release": config.release,
                              "design": config.design.name, "scope": scope_to_json(config.scope),
                              "rids": list(self.names), "state": state_to_json(self.state)})

    def design_for_identity(self) -> Design:
        return self.config.design

    def _initial_state(self) -> State:
        scope = self.config.scope
        return State(requests=(), running=EMPTY_BATCH, pending=None, launched=None, stage=Stage.SCHEDULE,
                     spec_mode=SpecMode.ON, num_steps=self.config.design.largest_steps(),
                     kv_free=scope.kv_pool_size, kv_pool_size=scope.kv_pool_size)

    # --- the public steps (one per model action) ----------------------------------------------------

    def prefill(self, launched: ObservedBatch, reqs: list[ObservedRequest], pool: ObservedPool,
                *, draft_prefills: bool, where: str = "prepare_for_extend",
                outputs: Sequence[tuple[str, Sequence[int]]] = ()) -> None:
        """An EXTEND batch was prepared: its requests arrive (if new) and prefill: the model's `prefill` of the
        requests and chunks the real PrefillAdder picked (`prefill_action`). The draft prefills with them when
        the batch carries the speculative algorithm (the v2 worker's prefill branch), as observed."""
        self.settle_round()
        self._merge_pending_implicitly(None)
        arriving = [r for r in reqs if r.rid not in self.index]
        if arriving:
            self._arrive(arriving, where)
        before = self.state
        requests, index = before.requests, self.index
        for obs in reqs:  # what an insert of this chunk into the radix tree is marked with (tree_draft)
            self.tree_prefill_chunk(obs.rid, requests[index[obs.rid]].prefilled_len, draft_prefills)
        action = prefill_action((index[obs.rid], obs.prefilled_len - requests[index[obs.rid]].prefilled_len)
                                for obs in reqs)
        # a re-prefill after a retraction starts from the output the request kept: compared before the step
        extra = self.output_violations(outputs, "prefill") if outputs else []
        after = self._overlay(apply(before, action, self.config.design, self.config.scope),
                              launched=launched, reqs=reqs, pool=pool)
        after = _draft_prefilled_as_observed(after, draft_prefills, launched.spec_algorithm_on)
        self._record(before, action, after, where, extra=extra)

    def merge(self, merged: ObservedBatch, pending: ObservedBatch, reqs: list[ObservedRequest], pool: ObservedPool,
              *, where: str = "ScheduleBatch.merge_batch") -> None:
        """`running.merge_batch(pending)` is about to run; `merged` is the batch it will produce."""
        self.settle_round()
        known_pending = self.state.pending
        # requests done at their prefill were filtered out of `pending` already; the model's merge drops them
        if known_pending is None or self._live(known_pending) != set(self._indices(pending.rids)[0]):
            self.state = attrs.evolve(self.state, pending=self._batch(pending))
        else:
            self.state = attrs.evolve(self.state, pending=attrs.evolve(
                known_pending, spec_info=self._batch(pending).spec_info,
                spec_algorithm_on=pending.spec_algorithm_on))
        self._transition(Action("merge_batch"), where, running=merged, reqs=reqs, pool=pool)

    def refine_running(self, running: ObservedBatch, *, where: str) -> None:
        """The running batch as it really is after a step the guard already recorded."""
        if self.releasing:
            self._check_releases()
        new = attrs.evolve(self.state, running=self._running_from(self.state.running, running))
        self._refine(new, where)

    def filter(self, running: ObservedBatch, observe: Callable[[], tuple[list[ObservedRequest], ObservedPool]],
               *, where: str = "ScheduleBatch.filter_batch", held: tuple[str, ...] | None = None) -> bool:
        """`running.filter_batch()` ran. `observe` reads the batch's requests and the pool: only when the filter is
        a step (SGLang filters the running batch every iteration; mostly nothing leaves it). `held`: the batch's
        requests before the filter, where the adapter cannot tell which batch is the running one. Returns whether it
        was the running batch (or the prefilled batch becoming it)."""
        self.settle_round()
        observed = self._indices(running.rids)[0]
        state = self.state
        pending = state.pending
        if state.running.rids:
            prefilled = pending is not None and set(observed) <= set(pending.rids)
            # a batch that held none of the running requests is another batch: a prefill batch dropping its chunked
            # request before the merge (one of a middle chunk only, with nothing completed, is left empty)
            other = held is not None and set(self._indices(held)[0]).isdisjoint(state.running.rids)
            if other or (prefilled and (observed or any(
                    state.req(rid).status is not Status.FINISHED for rid in state.running.rids))):
                # the prefilled batch filtering itself before merge_batch (get_next_batch_to_run); left empty
                # (every request done at its prefill), SGLang drops it: the model's merge of finished requests
                if not observed and pending is not None:
                    self._transition(Action("merge_batch"), where, pool=observe()[1])
                return False
        self._merge_pending_implicitly(running)
        if observed == self.state.running.rids:
            return True  # nothing left the batch (retract already shrank it): not a transition
        reqs, pool = observe()
        self._transition(Action("filter_batch"), where, running=running, reqs=reqs, pool=pool)
        self._compact()
        return True

    def tree_cache_update(self, reqs: list[ObservedRequest], pool: ObservedPool, *, where: str) -> None:
        """The tree cache took part of these requests' KV (the adapter's `around_tree_cache_keep`): their own
        slots and the pool as they really are now. Not a model action, so only the state invariants apply."""
        if self.releasing:
            self._check_releases()
        known = [obs for obs in reqs if obs.rid in self.index]
        new = self._overlay(self.state, reqs=known, pool=pool)
        if new is not self.state:
            self._refine(new, where)

    def release(self, rid: str, *, finished: bool, reqs: list[ObservedRequest], pool: ObservedPool,
                where: str = "release_kv_cache", outputs: Sequence[tuple[str, Sequence[int]]] = (),
                extra: Sequence[Violation] = ()) -> None:
        """A request's KV was released: `finish` when it is done, `retract` otherwise. `outputs`: its output
        tokens; `extra`: what the identity checks found in the release (the positions it freed)."""
        if self.round is not None or not finished:
            self.settle_round()  # a round settles first (no release is pending then), and a retraction is a step now
        index = self.index.get(rid)
        if (index is None or index in self.releasing
                or self.state.req(index).status not in (Status.RUNNING, Status.PREFILLING)):
            return  # not a request the guard tracks as holding KV (e.g. aborted before prefill), or released already
        name = "finish" if finished else "retract"
        self.tree_forget_request(rid)
        found = list(extra) + (self.output_violations(outputs, name) if outputs else [])
        if finished:
            # a finish inside the free group waits for the group's end, unless something else steps first: the
            # output check above read the state before it, which the other releases of the group do not move
            self.releasing[index] = _Release(rid, reqs, pool, where, found)
            if not self.in_free_group:
                self._check_releases()
            return
        self._transition(Action(name, (index,)), where, reqs=reqs, pool=pool, extra=found)

    def check_pending(self) -> State:
        """The state with the finishes waiting in a free group checked in (a reader outside the guard's steps)."""
        if self.releasing:
            self._check_releases()
        return self.state

    def begin_release_group(self) -> None:
        """The allocator's free group opened (`free_group_begin`): its finishes are checked as one step."""
        if self.releasing:
            self._check_releases()
        self.in_free_group = True

    def end_release_group(self) -> None:
        """The free group ends (`free_group_end`; SGLang has streamed the finished outputs by then): its finishes are
        checked now, before any later step."""
        self.in_free_group = False
        self._check_releases()

    def _check_releases(self) -> None:
        """The finishes of a free group as one model step, `finish` of them all (statemodel.actions._finish: their
        releases in turn), against what was observed at each: its request, and the pool after the last. Where that
        step, or an identity check of a release, finds anything, each release is checked in turn instead, as it
        happened, with the pool as it was then: the report blames the release that broke the rule (issue 18). What
        the one step cannot see: a count that one release of the group unbalances and a later one balances again,
        which takes a release freeing positions it does not own (`slots_freed_owned`, still checked per release)."""
        group = self.releasing
        if not group:
            return
        self.releasing = {}
        entries = list(group.items())
        if len(entries) > 1 and not any(release.found for _, release in entries):
            before = self.state
            action = Action("finish", tuple(group))
            noted = len(self.outputs_over_committed)
            observed = [obs for _, release in entries for obs in release.reqs]
            after = self._overlay(apply(before, action, self.config.design, self.config.scope), reqs=observed,
                                  pool=entries[-1][1].pool)
            found = step_violations(before, action, after, self.config.scope, self.config.design)
            # outputs past the model's committed count (noted by the overlay) within what the step allows
            noted_now = self.outputs_over_committed[noted:]
            if not found and not (noted_now and self.over_committed_violations(after, action.name)):
                self._record(before, action, after, entries[-1][1].where, checked=True)
                for _, release in entries:
                    self.forget_output(release.rid)
                return
            del self.outputs_over_committed[noted:]  # the releases in turn note them again
        for index, release in entries:
            self._transition(Action("finish", (index,)), release.where, reqs=release.reqs, pool=release.pool,
                             extra=release.found)
            self.forget_output(release.rid)

    def prepare_for_decode(self, running: ObservedBatch, reqs: list[ObservedRequest], pool: ObservedPool,
                           *, where: str = "ScheduleBatch.prepare_for_decode",
                           outputs: Sequence[tuple[str, Sequence[int]]] = ()) -> None:
        """`outputs`: each running request's output tokens (SGLang rid, `req.output_ids`), checked against what the
        steps so far committed (statemodel.identity.committed_output_kept)."""
        self.settle_round()
        self._merge_pending_implicitly(running)
        extra = self.output_violations(outputs, "prepare_for_decode") if outputs else []
        if not self.config.scope.overlap:  # under overlap a launched step's tokens reach output_ids a look later
            extra += self.dropped_output_violations(reqs, "prepare_for_decode")
        # every request's output length is compared with committed in the overlay (outputs_over_committed)
        self._transition(Action("prepare_for_decode"), where, running=running, reqs=reqs, pool=pool, extra=extra)

    def draft(self, steps: int, reqs: list[ObservedRequest], pool: ObservedPool,
              observe_round: Callable[[], tuple[ObservedBatch, list[ObservedRequest], ObservedPool]],
              *, where: str) -> None:
        """The worker is about to draft `steps` tokens (0: the trivial one-token verify). Under the overlap
        schedule no round is kept: the verify is recorded at its launch, its result by `process_result`."""
        if self.releasing:
            self._check_releases()
        if not self.config.scope.overlap:
            self.round = _Round(observe=observe_round)
        # a running request whose radix-tree prefix lacks draft KV (the model's rule over the live tree's marks)
        extra = self.tree_draft_violations(steps, self.state.running.rids)
        self._transition(Action("draft", (steps,)), where, reqs=reqs, pool=pool, extra=extra)

    def verify_launch(self, launched: ObservedBatch, reqs: list[ObservedRequest], pool: ObservedPool,
                      *, where: str) -> None:
        """The verify batch as it launches: a second look at the state the draft step produced. Under the
        overlap schedule it is also the model's `verify` (the launch; the accepts come with the result)."""
        if self.releasing:
            self._check_releases()
        state = self._overlay(self.state, launched=launched, reqs=reqs, pool=pool)  # one new State, not two
        # the positions it writes, from the launch's seq_lens (identity: statemodel.identity.writes_within_allocation)
        self._refine(state, where, extra=self.write_violations(reqs, launched.spec_tokens_per_row, "verify"))
        if self.config.scope.overlap:
            self._transition(Action("verify"), where, reqs=reqs, pool=pool)

    def draft_extend_starts(self, *, skipped: bool,
                            observe: Callable[[], tuple[ObservedBatch, list[ObservedRequest], ObservedPool]],
                            where: str) -> None:
        """A draft-extend (or its skip) starts. Inside a round it closes the round once the result is
        processed; outside one it is the design's draft sync or catch-up. `observe` reads the batch
        (running, requests, pool) only when the step is checked now: inside a round it is not."""
        if self.releasing:
            self._check_releases()
        if self.round is not None:
            self.round.extend = "skip_draft_extend" if skipped else "draft_extend"
            return
        if self.config.scope.overlap and self.state.stage is Stage.VERIFIED:
            # overlap: the verify was recorded at launch; the draft-extend runs on the device behind it
            _, reqs, pool = observe()
            self._transition(Action("skip_draft_extend" if skipped else "draft_extend"), where, reqs=reqs, pool=pool)
            return
        if skipped:
            return
        if self.state.stage is Stage.DECODED or self.state.spec_mode is SpecMode.OFF:
            name = "draft_sync"
        else:
            name = "draft_catch_up"
        batch, reqs, pool = observe()
        # the draft KV it writes is the batch's it ran on: a running request outside that batch is not covered
        covered = set(self._indices(batch.rids)[0])
        # a catch-up is one draft-extend over the whole batch: one that leaves a stale request out is named now, before
        # its forward (issue 51), not at the next draft step
        extra = draft_extend_leaves_behind(self.state, covered, name) if name == "draft_catch_up" else []
        self._transition(Action(name), where, reqs=reqs, pool=pool, draft_covered=covered, extra=extra)

    def plain_decode(self, launched: ObservedBatch, reqs: list[ObservedRequest], pool: ObservedPool,
                     *, where: str, seq_observed: bool = True, device_seq_lens_moved: bool = False) -> None:
        """A plain target DECODE forward is about to run on `launched`. `seq_observed`: the batch has its CPU
        mirror of seq_lens (without it an observation falls back to kv_committed_len, which under the overlap
        schedule lags the results not processed yet). `device_seq_lens_moved`: the adapter found the launch's device
        seq_lens written since prepare_for_decode, their host mirror not (checks.device_seq_lens_unmirrored)."""
        self.settle_round()
        seq_rids = set(launched.rids)
        if self.config.scope.overlap and not seq_observed:
            seq_rids = set()
        elif self.state.unprocessed:
            # overlap: the launch already sees the seq_lens a verify whose result is unprocessed produced
            # (resolved from the future map); the model adds that verify's growth when the result is processed
            pending = {self.names[rid] for u in self.state.unprocessed if u.is_spec for rid in u.rids}
            seq_rids -= pending
        self._transition(Action("plain_decode"), where, launched=launched, reqs=reqs, pool=pool,
                         seq_rids=seq_rids,
                         extra=device_seq_lens_unmirrored(self._indices(launched.rids)[0], where)
                         if device_seq_lens_moved else ())

    def process_result(self, rids: list[str], accept_lens: list[int] | None, reqs: list[ObservedRequest],
                       pool: ObservedPool, *, where: str, seq_lens: Mapping[str, int] | None = None) -> None:
        """Overlap schedule: the oldest launched decode step's result is being processed (its accepts are on
        the host now, `kv_committed_len` has moved). `rids` are the requests of the queued batch copy,
        `accept_lens` their accepted runs (drafts + bonus; None for a plain step), `reqs` observed with the
        seq_len the result gives them. The releases that follow in the same processing are `finish` steps, checked
        as one at the free group's end (`end_release_group`). `seq_lens`: the seq_len the result gives each request
        by rid, where `reqs` carry an earlier one (a reading of the same requests taken earlier in the iteration,
        reused: the adapter's reasons)."""
        if self.releasing:
            self._check_releases()
        if not self.config.scope.overlap:
            return  # the normal loop: the round settles at the next scheduler hook
        state = self.state
        if not state.unprocessed:
            self.note(f"a result with no launched step the guard saw ({where})")
            return
        head = state.unprocessed[0]
        rows = set(result_rows(state))
        names = self.names
        if head.steps is None:
            action = Action("process_result")
        else:
            get = dict(zip(rids, accept_lens or [], strict=False)).get
            # max(0, run - 1), without the call: once per request per result
            accepts = [(run - 1 if run > 1 else 0) if rid in rows and (run := get(names[rid])) is not None else 0
                       for rid in head.rids]
            action = Action("process_result", tuple(accepts))
        # the result shows the length after this step; a plain step launched after it grew the model's seq_len at
        # its launch already, so those requests' lengths are compared where that step's result is processed
        later_plain = {rid for u in state.unprocessed[1:] if not u.is_spec for rid in u.rids}
        self._transition(action, where, reqs=reqs, pool=pool,
                         seq_rids={names[rid] for rid in (rows - later_plain if later_plain else rows)},
                         seq_lens=seq_lens)

    def flip_starting(self) -> None:
        """A switch is about to flip (`shim.guard.api.notify_flip_starting`): a round in flight settles now, on the
        objects as its result left them, so that what the flip does is judged as the flip's."""
        self.settle_round()

    def flip(self, on: bool, running: ObservedBatch | None, reqs: list[ObservedRequest], pool: ObservedPool,
             *, where: str = "switch", extra: Sequence[Violation] = ()) -> None:
        """The flip policy switched speculation on or off (called by the switch, after it acted). `extra`: what the
        identity checks found in it (the positions it freed)."""
        self.settle_round()
        if running is not None:
            self._merge_pending_implicitly(running)
        self._transition(Action("flip_on" if on else "flip_off"), where, running=running, reqs=reqs, pool=pool,
                         extra=extra)

    def settle_round(self) -> None:
        """Close a speculative round once its result is on the host: verify with the accept counts the
        scheduler committed (kv_committed_len growth), then the draft-extend (or its skip). Every step but a finish
        inside a free group comes here first: the finishes waiting there are checked before it."""
        if self.releasing:
            self._check_releases()
        current = self.round
        if current is None:
            return
        self.round = None
        batch, reqs, pool = current.observe()
        before = self.state
        launched = before.launched
        if launched is None or before.stage is not Stage.DRAFTED:
            return
        by_rid = {r.rid: r for r in reqs}
        accepts = []
        requests, names = before.requests, self.names
        launched_names = [names[rid] for rid in launched.rids]
        for rid, name in zip(launched.rids, launched_names, strict=True):
            seq_len = requests[rid].seq_len
            obs = by_rid.get(name)
            # seq_len as observed, past a request's finish too: what a verify may add there is the design's
            # (Design.verify_advances_past_finish), checked by seq_lens_growth
            committed = obs.kv_committed_len if obs is not None else seq_len
            accepts.append(max(0, committed - seq_len - 1))
        where = "process_batch_result (verify result)"
        self._transition(Action("verify", tuple(accepts)), where, reqs=reqs, pool=pool,
                         seq_rids=set(launched_names))
        extend = current.extend or "draft_extend"
        self._transition(Action(extend), where, running=batch, reqs=reqs, pool=pool)


    # --- machinery -----------------------------------------------------------------------------------

    def _arrive(self, arriving: list[ObservedRequest], where: str) -> None:
        """The requests a prefill shows first arrive, as one model step: a wave's requests reach the scheduler
        together, and an arrival each (the whole state checked after every one) cost a prefill of k new requests k
        checks of the state (2026-12-04, 913095b: 70 % of the prefill hook's time at 31-39 new requests of 128)."""
        first = len(self.names)
        names = [obs.rid for obs in arriving]
        self.names.extend(names)
        self.index.update(zip(names, range(first, first + len(names)), strict=True))
        new = tuple(Request(rid=first + i, prompt_len=obs.prompt_len, max_new_tokens=obs.max_new_tokens)
                    for i, obs in enumerate(arriving))
        base = self.state
        before = base.replace(requests=base.requests + new)  # NOT_ARRIVED, as in initial_states
        action = Action("arrive", tuple(range(first, first + len(new))))
        after = apply(before, action, self.config.design, self.config.scope)
        self._record(before, action, after, where, new_rids=names, trace_base=base)

    def _merge_pending_implicitly(self, running: ObservedBatch | None) -> None:
        """SGLang assigns the prefilled batch as the running batch when nothing runs (no merge_batch call): the first
        hook that observes the running batch (`running`; None: a prefill, which sees no running batch) while the model
        has a prefilled batch and nothing running sees that assignment, and takes the batch as observed. What it lacks
        of the prefilled batch is the model's `requests_in_one_place` to judge, at this hook: a live request dropped
        (by the prefilled batch's own filter, say) is a finding; those SGLang leaves out on purpose are finished at
        their prefill (released before), still being chunked (prefilling: never in the prefilled batch) or done (the
        newest line's `_reqs_finishing_inflight`: their queued prefill result finishes them)."""
        pending = self.state.pending
        if pending is None or self.state.running.rids:
            return  # SGLang only assigns when its running batch is empty; otherwise it calls merge_batch
        self._transition(Action("merge_batch"), "scheduler (running batch := prefilled batch)", running=running)


    def _transition(self, action: Action, where: str, *, running: ObservedBatch | None = None,
                    launched: ObservedBatch | None = None, reqs: Iterable[ObservedRequest] = (),
                    pool: ObservedPool | None = None, seq_rids: Iterable[str] = (),
                    new_rids: list[str] | None = None, extra: Sequence[Violation] = (),
                    draft_covered: set[int] | None = None, seq_lens: Mapping[str, int] | None = None) -> None:
        before = self.state
        predicted = apply(before, action, self.config.design, self.config.scope)
        if draft_covered is not None:
            predicted = _draft_covered_as_observed(before, predicted, draft_covered)
        after = self._overlay(predicted, running=running, launched=launched, reqs=reqs, pool=pool, seq_rids=seq_rids,
                              seq_lens=seq_lens)
        if self._tree_prefix and action.name in _DRAFT_WRITES:
            self.tree_draft_written(before, after)  # the tree slots its rows point at have draft KV now
        self._record(before, action, after, where, new_rids=new_rids, extra=extra)

    def _record(self, before: State, action: Action, after: State, where: str,
                new_rids: list[str] | None = None, trace_base: State | None = None,
                extra: Sequence[Violation] = (), checked: bool = False) -> None:
        """`checked`: the caller found the step clean already (`_check_releases`)."""
        found = () if checked else tuple(step_violations(before, action, after, self.config.scope,
                                                         self.config.design))
        if self.outputs_over_committed:
            extra = list(extra) + self.over_committed_violations(after, action.name)
        if extra:
            found = tuple(extra) + found  # an identity broken is the root cause of any count it unbalanced
        self.step_number += 1
        self.covered[action.name] = self.covered.get(action.name, 0) + transitions_in(action)
        self.last_action = action
        # the request's name now: a later compaction renumbers the requests
        self.history.append((self.step_number, action, where, self._request_name(action)))
        if self.trace is not None:
            self.trace.write({"kind": "step", "rank": self.config.rank, "step": self.step_number,
                              "action": action.name, "args": list(action.args), "where": where,
                              "new_rids": new_rids or [],
                              "delta": state_delta_json(trace_base or before, after),
                              "violations": [violation_to_json(v, self.names) for v in found]})
        self.state = after
        if found:
            self._report(action, found)
            if action.name in ("flip_on", "flip_off"):
                self.close_open_findings(action, clean=False)
            return
        if self._open:
            self.close_open_findings(action)
        if self._suppressed:
            self._flush_suppressed()

    def _refine(self, new: State, where: str, extra: Sequence[Violation] = ()) -> None:
        found = tuple(extra) + tuple(state_violations(new, self.config.scope))
        if self.outputs_over_committed:
            found = tuple(self.over_committed_violations(new, "refine")) + found
        if self.trace is not None:
            action = self.last_action.name if self.last_action else "refine"
            self.trace.write({"kind": "refine", "rank": self.config.rank, "step": self.step_number, "where": where,
                              "action": action,
                              "delta": state_delta_json(self.state, new),
                              "violations": [violation_to_json(v, self.names) for v in found]})
        self.state = new
        if found:
            self._report(self.last_action or Action("refine"), found, where=where)


    def close(self) -> None:
        self._check_releases()
        self.report_held_back(force=True)
        if self.trace is not None:
            self.trace.close()
            self.trace = None


