"""The guard's state-sync with the observed SGLang objects: SGLang's request ids numbered as the model's, observed
batches as model batches, and a model state with every field the live objects carry replaced by what was observed
(the ghost fields SGLang does not carry stay as the model's transition function moved them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shim.guard.config import GuardConfig
from shim.guard.observe import ObservedBatch, ObservedPool, ObservedRequest
from shim.guard.trace import TraceWriter, compact_state
from statemodel.state import (
    Batch,
    GraphShape,
    Request,
    SpecInfo,
    SpecInfoKind,
    State,
    Status,
)

_NO_RIDS: frozenset[str] = frozenset()


class GuardDesync(RuntimeError):
    """The guard's picture lost track of SGLang's (a step it did not see): an error in the guard, not a
    violation of the model."""


class ObservedStateSync:
    """The state-sync half of `shim.guard.core.Guard` (a mixin: it reads and renumbers the guard's requests)."""

    config: GuardConfig
    names: list[str]  # SGLang's rid per model request id
    index: dict[str, int]  # model request id per SGLang rid
    state: State
    trace: TraceWriter | None
    # (model request id, output tokens) of requests the last overlay saw holding more output tokens than the model's
    # `committed`: judged by the step that records it (statemodel.identity.output_bound; issue 18, token content)
    outputs_over_committed: list[tuple[int, int]]
    # the last `_indices`: (SGLang rids, index, its length, model ids, all known)
    _last_indices: tuple[tuple[str, ...], dict[str, int], int, tuple[int, ...], bool] | None = None
    # the last overlay of requests: (reading, requests in, requests out, index, its length, outputs noted)
    _overlay_memo: tuple | None = None
    # `_batch`'s memo: (index, its length, {observation: the model's Batch})
    _batches: tuple[dict[str, int], int, dict[ObservedBatch, Batch]] | None = None

    def _live(self, batch: Batch) -> set[int]:
        return {rid for rid in batch.rids if self.state.req(rid).status is not Status.FINISHED}

    def _compact(self) -> None:
        live = set(self.state.running.rids) | set(self.state.pending.rids if self.state.pending else ())
        live.update(rid for u in self.state.unprocessed for rid in u.rids)  # a queued result still names them
        keep = [r.rid for r in self.state.requests if r.status is not Status.FINISHED or r.rid in live]
        if len(keep) == len(self.state.requests):
            return
        self.state = compact_state(self.state, keep)
        self.names = [self.names[i] for i in keep]
        self.index = {name: i for i, name in enumerate(self.names)}
        if self.trace is not None:
            self.trace.write({"kind": "compact", "rank": self.config.rank, "keep": keep})

    def _indices(self, rids: tuple[str, ...]) -> tuple[tuple[int, ...], bool]:
        """The model's ids of SGLang's `rids` (-1 for a request the guard does not know), and whether it knows them
        all. The hooks of one iteration name the same batch several times (the filter, the launch, the draft
        sync...): the last answer is kept and taken again for an equal tuple (a C comparison of the same string
        objects) while the numbering is the same (`_compact` makes a new index, `_arrive` grows it)."""
        index = self.index
        last = self._last_indices
        if last is not None and last[1] is index and last[2] == len(index) and last[0] == rids:
            return last[3], last[4]
        get = index.get
        ids = tuple([get(r, -1) for r in rids])
        known = -1 not in ids
        self._last_indices = (rids, index, len(index), ids, known)
        return ids, known

    def _batch(self, obs: ObservedBatch) -> Batch:
        """The model's Batch of an observation. The hooks of an iteration observe a few batches over and over (the
        running batch, the launched one): the Batches of the last few observations are kept while the numbering is
        the same (frozen: the very object is handed out again for an equal observation)."""
        index = self.index
        memo = self._batches
        if memo is None or memo[0] is not index or memo[1] != len(index):
            memo = self._batches = (index, len(index), {})
        made = memo[2].get(obs)
        if made is not None:
            return made
        rids, known = self._indices(obs.rids)
        if not known:
            rids = tuple(self._known(r) for r in obs.rids)  # raises GuardDesync naming the request
        if len(memo[2]) >= 8:  # a few shapes per iteration: older ones are not asked for again
            memo[2].clear()
        made = memo[2][obs] = self._new_batch(obs, rids)
        return made

    @staticmethod
    def _new_batch(obs: ObservedBatch, rids: tuple[int, ...]) -> Batch:
        return Batch(
            rids=rids, forward_mode=obs.forward_mode,
            spec_info=SpecInfo(obs.spec_kind, obs.spec_rows, obs.spec_tokens_per_row)
            if obs.spec_kind is not SpecInfoKind.NONE else SpecInfo.none(),
            spec_algorithm_on=obs.spec_algorithm_on, out_cache_loc_width=obs.out_cache_loc_width,
            graph=None if obs.graph is None else GraphShape(*obs.graph), extend_tokens=obs.extend_tokens,
        )

    def _known(self, rid: str) -> int:
        index = self.index.get(rid)
        if index is None:
            raise GuardDesync(f"request {rid!r} is in a batch but the guard never saw it prefilled")
        return index

    def _running_from(self, predicted: Batch, obs: ObservedBatch) -> Batch:
        real = self._batch(obs)
        if (predicted.rids == real.rids and predicted.spec_algorithm_on is real.spec_algorithm_on
                and predicted.spec_info == real.spec_info):
            return predicted  # the model's batch already holds what was observed: no copy
        return predicted.replace(rids=real.rids, spec_info=real.spec_info, spec_algorithm_on=real.spec_algorithm_on)

    def _overlay(self, state: State, *, running: ObservedBatch | None = None, launched: ObservedBatch | None = None,
                 reqs: Iterable[ObservedRequest] = (), pool: ObservedPool | None = None,
                 seq_rids: Iterable[str] = (), seq_lens: Mapping[str, int] | None = None) -> State:
        """`state` with every field the live objects carry replaced by what was observed. `seq_lens`: the observed
        seq_len of the `seq_rids` by rid, in place of the readings' own (a reading taken earlier in the iteration and
        reused, whose KV and output fields still hold: `V2Adapter.after_normalize_decode_outputs`)."""
        if not seq_rids:
            seq_rids = _NO_RIDS  # most overlays observe no seq_len: no empty set built for them
        elif type(seq_rids) is not set and not isinstance(seq_rids, frozenset):
            seq_rids = set(seq_rids)
        requests = state.requests
        index_of = self.index
        memo = self._overlay_memo
        if (memo is not None and reqs is memo[0] and (requests is memo[1] or requests is memo[2])
                and index_of is memo[3] and len(index_of) == memo[4] and not seq_rids):
            # the same reading over the requests the last pass read or wrote: that pass's result (a second pass over
            # its own result changes nothing: it wrote what it compares), and the same outputs noted
            overlaid = memo[2]
            self.outputs_over_committed.extend(memo[5])
        else:
            overlaid = self._overlay_requests(requests, reqs, seq_rids, seq_lens)
        changes: dict[str, object] = {}
        if overlaid is not requests:
            changes["requests"] = overlaid
        if running is not None:
            real = self._running_from(state.running, running)
            if real is not state.running:
                changes["running"] = real
        if launched is not None:
            changes["launched"] = self._batch(launched)
        # what already holds the observed value is kept: a step that moved nothing observed stays the very state
        if pool is not None and (pool.free != state.kv_free or pool.size != state.kv_pool_size):
            changes["kv_free"] = pool.free
            changes["kv_pool_size"] = pool.size
        return state.replace(**changes) if changes else state  # type: ignore[arg-type]

    def _overlay_requests(self, requests: tuple[Request, ...], reqs: Iterable[ObservedRequest],
                          seq_rids: set[str] | frozenset[str],
                          seq_lens: Mapping[str, int] | None = None) -> tuple[Request, ...]:
        """`requests` with the observed KV lengths (and seq_len, for `seq_rids`: the reading's, or `seq_lens`'s where
        given) put in; `requests` itself when
        nothing differs. Remembered for the next overlay when `reqs` is a list (an adapter's reading, which the
        hooks of one worker call share; it is held here, so its identity is not reused)."""
        updated: list[Request] | None = None  # copied on the first request that differs
        index_of = self.index
        noted = self.outputs_over_committed
        first_noted = len(noted)
        # the observation unpacked (ObservedRequest's fields in order: a tuple unpacks faster than 5 named reads)
        for rid, _, _, output_len, held, allocated, _, seen_len, holds_kv, _ in reqs:
            index = index_of.get(rid)
            if index is None:
                continue
            r = requests[index]
            if output_len > r.committed:  # one comparison per request: the output check's common case
                noted.append((index, output_len))
            if holds_kv:
                reserved = allocated - held
            else:
                held = reserved = 0
            # seq_len is observed where the step that moves it is seen
            seq_len = (seen_len if seq_lens is None else seq_lens[rid]) if rid in seq_rids else r.seq_len
            if held != r.kv_held or reserved != r.kv_reserved or seq_len != r.seq_len:
                if updated is None:
                    updated = list(requests)
                updated[index] = _with_observed(r, seq_len, held, reserved)
        overlaid = requests if updated is None else tuple(updated)
        # kept only for a list (a generator is spent) and no seq_rids (the hooks that share a reading pass none)
        self._overlay_memo = (reqs, requests, overlaid, index_of, len(index_of), noted[first_noted:]) \
            if type(reqs) is list and not seq_rids else None
        return overlaid


# `_overlay` unpacks an ObservedRequest by position: a field added, dropped or moved fails here at import
if ObservedRequest._fields != ("rid", "prompt_len", "max_new_tokens", "output_len", "kv_committed", "kv_allocated",
                               "kv_committed_len", "seq_len", "holds_kv", "prefilled_len"):
    raise ImportError("shim.guard.observe.ObservedRequest's fields changed; update ObservedStateSync._overlay")


def _with_observed(r: Request, seq_len: int, kv_held: int, kv_reserved: int) -> Request:
    """`r` with the fields the live objects carry replaced by what was observed. `Request.replace`, not
    attrs.evolve (a third of the cost): the overlay runs for every request of the batch at every step."""
    return r.replace(seq_len=seq_len, kv_held=kv_held, kv_reserved=kv_reserved)


def _draft_prefilled_as_observed(state: State, draft_prefills: bool, spec_algorithm_on: bool) -> State:
    """The prefill's outcome for the draft as the live batch shows it: the draft prefilled with the requests whose
    prefill completed iff the batch carried the speculative algorithm (the worker's prefill branch), and the
    prefilled batch carries that algorithm and a draft input row per request then."""
    pending = state.pending
    if pending is None:
        return state
    changed = {}
    for rid in pending.rids:
        r = state.req(rid)
        want_len = r.prefilled_len if draft_prefills else 0
        if r.draft_kv_len != want_len or r.draft_hidden_ready is not draft_prefills:
            changed[rid] = r.replace(draft_kv_len=want_len, draft_hidden_ready=draft_prefills)
    spec = (SpecInfo(SpecInfoKind.DRAFT_INPUT, pending.size, 1) if draft_prefills and spec_algorithm_on
            else SpecInfo.none())
    if not changed and pending.spec_info == spec and pending.spec_algorithm_on is spec_algorithm_on:
        return state
    return state.replace(requests=state.with_requests(changed),
                         pending=pending.replace(spec_info=spec, spec_algorithm_on=spec_algorithm_on))


def _draft_covered_as_observed(before: State, after: State, covered: set[int]) -> State:
    """A draft-extend outside a round (a catch-up, a sync) as it really ran: the model's action brings every running
    request's draft KV up to date, but the draft writes KV only for the rows of the batch it ran on. A running request
    outside that batch keeps the draft coverage it had before (issue 18: a catch-up that skips the requests admitted
    while speculation was off)."""
    missed = {rid: before.requests[rid] for rid in after.running.rids if rid not in covered
              and rid < len(before.requests)}
    if not missed:
        return after
    changed = {rid: after.requests[rid].replace(draft_kv_len=r.draft_kv_len, draft_hidden_ready=r.draft_hidden_ready)
               for rid, r in missed.items()}
    return after.replace(requests=after.with_requests(changed))
