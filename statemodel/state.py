"""The batch state that matters across spec-on and spec-off steps, as frozen attrs classes (and one NamedTuple,
`Request`: see its docstring).

Every class here is immutable and hashable so that the checker can deduplicate states by hash.
Field names follow SGLang where SGLang has a name (`forward_mode`, `spec_info`, `out_cache_loc`,
`seq_lens`); `docs/model.md` maps each field to the SGLang attribute it stands for, per release line.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Sequence
from itertools import compress
from operator import add, is_not
from typing import Any, Generic, NamedTuple, TypeVar

import attrs

# `replace(...)` methods: a keyword left at _KEEP keeps the field (None is a value some fields take)
_KEEP: Any = type("_Keep", (), {"__repr__": lambda self: "KEEP"})()


class _Enum(enum.Enum):
    """An enum hashed by identity: its members are singletons, and Enum's own `__hash__` (a Python function
    hashing the member's name) was a tenth of the checker's time (every new Request and State hashes some)."""

    __hash__ = object.__hash__


class ForwardMode(_Enum):
    """SGLang's `ForwardMode`, restricted to the modes a decode-time flip touches."""

    IDLE = "IDLE"
    EXTEND = "EXTEND"
    DECODE = "DECODE"
    MIXED = "MIXED"
    TARGET_VERIFY = "TARGET_VERIFY"
    DRAFT_EXTEND = "DRAFT_EXTEND"


class SpecInfoKind(_Enum):
    """What `batch.spec_info` holds: nothing, an `EagleDraftInput` or an `EagleVerifyInput`."""

    NONE = "none"
    DRAFT_INPUT = "draft_input"
    VERIFY_INPUT = "verify_input"


class Status(_Enum):
    """Where a request is in the scheduler. A retracted request goes back to WAITING."""

    NOT_ARRIVED = "not_arrived"
    WAITING = "waiting"
    PREFILLING = "prefilling"  # part of its prompt is in KV (chunked prefill)
    RUNNING = "running"
    FINISHED = "finished"


class Stage(_Enum):
    """Where one scheduler iteration is: the scheduler's part, or the worker forward in flight."""

    SCHEDULE = "schedule"  # get_next_batch_to_run / process_batch_result
    PREPARED = "prepared"  # prepare_for_decode ran; the worker forward comes next
    DRAFTED = "drafted"  # draft ran; the verify input is built
    VERIFIED = "verified"  # verify ran; draft-extend comes next
    DECODED = "decoded"  # a plain target decode ran; a draft sync may come next


class SpecMode(_Enum):
    """The runtime mode a flip policy chose."""

    ON = "on"
    OFF = "off"


@attrs.frozen(cache_hash=True)
class SpecInfo:
    """`batch.spec_info`: its kind, how many requests it has rows for, and tokens per row."""

    kind: SpecInfoKind = SpecInfoKind.NONE
    rows: int = 0
    tokens_per_row: int = 0

    @classmethod
    def none(cls) -> SpecInfo:
        return _NO_SPEC_INFO

    def describe(self) -> str:
        if self.kind is SpecInfoKind.NONE:
            return "none"
        return f"{self.kind.value}[{self.rows}x{self.tokens_per_row}]"


_NO_SPEC_INFO = SpecInfo()


@attrs.frozen(cache_hash=True)
class GraphShape:
    """The CUDA graph a forward replays: the captured batch-size bucket x tokens per request."""

    batch_bucket: int
    tokens_per_req: int

    def describe(self) -> str:
        return f"{self.batch_bucket}x{self.tokens_per_req}"


@attrs.frozen(cache_hash=True)
class Batch:
    """A batch as the scheduler holds it (`ScheduleBatch`) or as a forward launches it.

    `out_cache_loc_width` is the number of KV slots the forward writes into; `graph` is the CUDA
    graph the forward replays (None: eager, or no forward launched).
    """

    rids: tuple[int, ...] = ()
    forward_mode: ForwardMode = ForwardMode.IDLE
    spec_info: SpecInfo = _NO_SPEC_INFO
    spec_algorithm_on: bool = False
    out_cache_loc_width: int = 0
    graph: GraphShape | None = None
    extend_tokens: int = 0  # EXTEND only: tokens the prefill writes

    @property
    def size(self) -> int:
        return len(self.rids)

    def tokens_written_per_req(self) -> int:
        """Tokens per request the target forward of this batch writes into the KV pool."""
        if self.forward_mode is ForwardMode.TARGET_VERIFY:
            return self.spec_info.tokens_per_row
        if self.forward_mode in (ForwardMode.DECODE, ForwardMode.DRAFT_EXTEND):
            return 1
        return 0

    def tokens_written(self) -> int:
        if self.forward_mode in (ForwardMode.EXTEND, ForwardMode.MIXED):
            return self.extend_tokens
        return self.size * self.tokens_written_per_req()

    def replace(self, *, rids: tuple[int, ...] = _KEEP, forward_mode: ForwardMode = _KEEP,
                spec_info: SpecInfo = _KEEP, spec_algorithm_on: bool = _KEEP, out_cache_loc_width: int = _KEEP,
                graph: GraphShape | None = _KEEP, extend_tokens: int = _KEEP) -> Batch:
        """`attrs.evolve(self, ...)` at a third of its cost (every step moves a batch or two): the slots are set
        directly, as `Request.replace` does (`_check_replace` holds it to what `__init__` builds)."""
        new = _new_object(Batch)
        _set_b_rids(new, self.rids if rids is _KEEP else rids)
        _set_b_forward_mode(new, self.forward_mode if forward_mode is _KEEP else forward_mode)
        _set_b_spec_info(new, self.spec_info if spec_info is _KEEP else spec_info)
        _set_b_spec_algorithm_on(new, self.spec_algorithm_on if spec_algorithm_on is _KEEP else spec_algorithm_on)
        _set_b_out_cache_loc_width(new, self.out_cache_loc_width if out_cache_loc_width is _KEEP
                                   else out_cache_loc_width)
        _set_b_graph(new, self.graph if graph is _KEEP else graph)
        _set_b_extend_tokens(new, self.extend_tokens if extend_tokens is _KEEP else extend_tokens)
        _set_b_cached_hash(new, None)
        return new


_new_object = object.__new__
(_set_b_rids, _set_b_forward_mode, _set_b_spec_info, _set_b_spec_algorithm_on, _set_b_out_cache_loc_width,
 _set_b_graph, _set_b_extend_tokens, _set_b_cached_hash) = (
    Batch.__dict__[name].__set__ for name in (
        "rids", "forward_mode", "spec_info", "spec_algorithm_on", "out_cache_loc_width", "graph", "extend_tokens",
        "_attrs_cached_hash"))


EMPTY_BATCH = Batch()


class Request(NamedTuple):
    """One request's share of the state.

    `seq_len` is tokens in the target's KV (SGLang's `seq_lens`), `committed` the output tokens the
    request has (`len(req.output_ids)`); `kv_held` KV slots holding committed tokens, `kv_reserved`
    slots over-allocated for draft tokens; `draft_kv_len` how far the draft model's KV covers the
    committed prefix, `draft_hidden_ready` whether the hidden state / bonus token the next draft
    step starts from exists. `cached_len` (radix cache only): the leading tokens of the request that
    are the radix tree's slots (matched or checkpointed), locked by it and not in `kv_held`; the draft
    KV there is whatever the tree's slots hold (`State.prefix_cache`), which `draft_kv_len` does not see.

    The one model record that is not an attrs class: a NamedTuple is built, hashed and compared in C. The actions
    rebuild every running request at every step (the checker's and the guard's hot loop: a third of the guard's time
    at 256 requests went to building attrs instances), and frozen-and-hashable is all the model asks of it.
    """

    rid: int
    prompt_len: int
    max_new_tokens: int
    status: Status = Status.NOT_ARRIVED
    prefilled_len: int = 0
    seq_len: int = 0
    committed: int = 0
    kv_held: int = 0
    kv_reserved: int = 0
    draft_kv_len: int = 0
    draft_hidden_ready: bool = False
    cached_len: int = 0

    @property
    def prefill_target(self) -> int:
        """Tokens a (re-)prefill must put in KV: the prompt plus outputs kept across a retract."""
        return self.prompt_len + self.committed

    @property
    def done(self) -> bool:
        return self.committed >= self.max_new_tokens

    @property
    def draft_current(self) -> bool:
        return self.draft_kv_len == self.seq_len and self.draft_hidden_ready

    def replace(self, *, status: Status | None = None, prefilled_len: int | None = None, seq_len: int | None = None,
                committed: int | None = None, kv_held: int | None = None, kv_reserved: int | None = None,
                draft_kv_len: int | None = None, draft_hidden_ready: bool | None = None,
                cached_len: int | None = None) -> Request:
        """A copy with the fields a step moves changed (rid, prompt_len and max_new_tokens never move). No field is
        optional, so None means "keep"."""
        return _new_tuple(Request, (
            self[0], self[1], self[2],
            self[3] if status is None else status,
            self[4] if prefilled_len is None else prefilled_len,
            self[5] if seq_len is None else seq_len,
            self[6] if committed is None else committed,
            self[7] if kv_held is None else kv_held,
            self[8] if kv_reserved is None else kv_reserved,
            self[9] if draft_kv_len is None else draft_kv_len,
            self[10] if draft_hidden_ready is None else draft_hidden_ready,
            self[11] if cached_len is None else cached_len))

    def decoded(self, seq_len: int, committed: int, kv_held: int, kv_reserved: int, draft_kv_len: int,
                draft_hidden_ready: bool) -> Request:
        """`replace` of the six fields a decode step or its result moves, all given, by position: the steps that
        rebuild every running request at every iteration (`_plain_decode`, `_process_result`) skip the keyword
        parsing and the keep tests. Held to `replace` at import."""
        return _new_tuple(Request, (self[0], self[1], self[2], self[3], self[4], seq_len, committed, kv_held,
                                    kv_reserved, draft_kv_len, draft_hidden_ready, self[11]))


_new_tuple = tuple.__new__


def _check_request_replace() -> None:
    """Request.replace and Request.decoded index the fields by position: a field added, removed or moved fails
    here at import."""
    if Request._fields != ("rid", "prompt_len", "max_new_tokens", "status", "prefilled_len", "seq_len", "committed",
                           "kv_held", "kv_reserved", "draft_kv_len", "draft_hidden_ready", "cached_len"):
        raise ImportError("statemodel.state: Request's fields changed; update Request.replace and Request.decoded")
    base = Request(7, 5, 9, Status.RUNNING, 5, 6, 2, 6, 3, 6, True, 2)
    built = Request(7, 5, 9, Status.WAITING, 4, 3, 2, 1, 0, 3, False, 1)
    fast = base.replace(status=Status.WAITING, prefilled_len=4, seq_len=3, kv_held=1, kv_reserved=0, draft_kv_len=3,
                        draft_hidden_ready=False, cached_len=1)
    if fast != built or type(fast) is not Request or base.replace() != base:
        raise ImportError("statemodel.state: Request.replace no longer builds what Request() builds")
    decoded = base.decoded(8, 3, 7, 2, 8, False)
    want = base._replace(seq_len=8, committed=3, kv_held=7, kv_reserved=2, draft_kv_len=8, draft_hidden_ready=False)
    if decoded != want or type(decoded) is not Request:
        raise ImportError("statemodel.state: Request.decoded no longer builds what Request.replace builds")


_check_request_replace()


@attrs.frozen(cache_hash=True)
class Unprocessed:
    """A step launched under the overlap schedule whose result the host has not processed yet
    (SGLang's `result_queue` entry). `steps` is the verify's step count, None for a plain step;
    `draft_extended` whether the draft-extend after the verify ran (it covers the accepted tokens
    on the device, so the draft KV grows with seq_len when the result is processed); `reserve_slot` (a plain
    step only) whether it wrote its token into a slot of the v2 reserve (`OutCacheLocFrom.V2_RESERVE`): that slot
    stays reserved until the result is processed, where SGLang's `kv_committed_len` moves
    (`_resolve_spec_v2_tokens`, `kv_committed_len += accept_len`), so it is held from then on.
    `applies_to_retracted`: requests retracted since the launch whose rows the result still applies to. A retraction
    voids a request's rows (SGLang skips `req.is_retracted` there), but 0.5.12 skips them only while the scheduler's
    `enable_overlap` is set, and the v1 switch's own loop clears it at flip-on (Design.overlap_spec_steps False)."""

    rids: tuple[int, ...]
    steps: int | None
    draft_extended: bool = False
    reserve_slot: bool = False
    applies_to_retracted: tuple[int, ...] = ()

    @property
    def is_spec(self) -> bool:
        return self.steps is not None

    @property
    def reserved_writes(self) -> int:
        """KV slots of the reserve this step may write per request: a verify every draft token (steps + 1), a plain
        step its one slot when that slot is the v2 reserve's, else none."""
        if self.steps is not None:
            return self.steps + 1
        return 1 if self.reserve_slot else 0

    def describe(self) -> str:
        what = "plain" if self.steps is None else f"verify(steps={self.steps})"
        return f"{what} rids={list(self.rids)}"


@attrs.frozen(cache_hash=True)
class Thresholds:
    """The flip policy's thresholds on demand (running + waiting requests): off at `t_off`, on at `t_on`."""

    t_off: int
    t_on: int


@attrs.frozen(cache_hash=True)
class State:
    """The whole model state: requests, the scheduler's batches, the KV pool, the runtime mode.

    `running` is the scheduler's running `ScheduleBatch`; `pending` a prefilled batch not yet merged
    into it; `launched` the batch the last forward ran on: the worker's copy (`ModelWorkerBatch`)
    on lines that have one, the `ScheduleBatch` itself on lines that do not.
    """

    requests: tuple[Request, ...]
    running: Batch
    pending: Batch | None
    launched: Batch | None
    stage: Stage
    spec_mode: SpecMode
    num_steps: int
    kv_free: int
    kv_pool_size: int
    thresholds: Thresholds | None = None
    # overlap schedule only (Scope.overlap): launched steps whose results wait, oldest first; always () without
    unprocessed: tuple[Unprocessed, ...] = ()
    # radix cache only (Design.radix_cache): the tree's cached tokens of the scope's shared token sequence (every
    # prompt is a prefix of it), in order, each True where the draft KV of its slot was written; always () without
    prefix_cache: tuple[bool, ...] = ()

    def req(self, rid: int) -> Request:
        return self.requests[rid]

    def with_requests(self, changed: dict[int, Request]) -> tuple[Request, ...]:
        if not changed:
            return self.requests
        requests = list(self.requests)
        for rid, r in changed.items():
            requests[rid] = r  # requests[rid] is request rid (State.req)
        return tuple(requests)

    def waiting(self) -> list[Request]:
        return [r for r in self.requests if r.status in (Status.WAITING, Status.PREFILLING)]

    def in_flight_count(self) -> int:
        """Requests the running batch holds now or will once merged: pending and chunked ones count."""
        chunked = _CHUNKED(self.requests, _count_chunked, _move_chunked, add)
        return self.running.size + (self.pending.size if self.pending else 0) + chunked

    def demand(self) -> int:
        """What the flip policy looks at: requests running plus requests waiting to run."""
        statuses = [r.status for r in self.requests]  # list.count: the loop in C
        return len(statuses) - statuses.count(Status.NOT_ARRIVED) - statuses.count(Status.FINISHED)

    def kv_accounted(self) -> int:
        """Slots free, held, reserved, or the radix tree's."""
        return self.kv_free + _HELD(self.requests, _held_and_reserved, _move_held_and_reserved, add) \
            + len(self.prefix_cache)

    def all_finished(self) -> bool:
        return all(r.status is Status.FINISHED for r in self.requests)

    def replace(self, *, requests: tuple[Request, ...] = _KEEP, running: Batch = _KEEP, pending: Batch | None = _KEEP,
                launched: Batch | None = _KEEP, stage: Stage = _KEEP, spec_mode: SpecMode = _KEEP,
                num_steps: int = _KEEP, kv_free: int = _KEEP, kv_pool_size: int = _KEEP,
                thresholds: Thresholds | None = _KEEP, unprocessed: tuple[Unprocessed, ...] = _KEEP,
                prefix_cache: tuple[bool, ...] = _KEEP) -> State:
        """`attrs.evolve(self, ...)` at a quarter of its cost: every action and every guard overlay makes a new State.
        The slots are set directly, as `Request.replace` does (`_check_replace` holds it to what `__init__` builds)."""
        new = _new_object(State)
        _set_s_requests(new, self.requests if requests is _KEEP else requests)
        _set_s_running(new, self.running if running is _KEEP else running)
        _set_s_pending(new, self.pending if pending is _KEEP else pending)
        _set_s_launched(new, self.launched if launched is _KEEP else launched)
        _set_s_stage(new, self.stage if stage is _KEEP else stage)
        _set_s_spec_mode(new, self.spec_mode if spec_mode is _KEEP else spec_mode)
        _set_s_num_steps(new, self.num_steps if num_steps is _KEEP else num_steps)
        _set_s_kv_free(new, self.kv_free if kv_free is _KEEP else kv_free)
        _set_s_kv_pool_size(new, self.kv_pool_size if kv_pool_size is _KEEP else kv_pool_size)
        _set_s_thresholds(new, self.thresholds if thresholds is _KEEP else thresholds)
        _set_s_unprocessed(new, self.unprocessed if unprocessed is _KEEP else unprocessed)
        _set_s_prefix_cache(new, self.prefix_cache if prefix_cache is _KEEP else prefix_cache)
        _set_s_cached_hash(new, None)
        return new


_K = TypeVar("_K")
_V = TypeVar("_V")


class LastByIdentity(Generic[_K, _V]):
    """A one-entry memo: `compute(key)` for the last `key`, taken again while the same object comes back. For frozen
    keys (a State, a requests tuple), which the guard's step and the invariants checked after it ask about in turn
    (a step that moves no request keeps the tuple). The key is held here, so its id is not reused by another
    object: the same object means the same answer."""

    __slots__ = ("_key", "_value")

    def __init__(self) -> None:
        self._key: object = LastByIdentity  # no key yet: an object no caller passes
        self._value: Any = None

    def __call__(self, key: _K, compute: Callable[[_K], _V]) -> _V:
        if key is self._key:
            return self._value
        value = compute(key)
        self._key, self._value = key, value
        return value


# a batch this large that a step moves a few requests of is folded by those requests only (FoldByIdentity, the
# invariants' fast paths): below it a fresh pass costs less than finding them (the checker's scopes are far below)
FEW_OF_MANY = 16


def changed_indices(before: Sequence[object], after: Sequence[object], *, prefix: bool = False) -> list[int] | None:
    """The positions at which `after` holds another object than `before`, in order, when both are as long, at least
    FEW_OF_MANY, and at most an eighth of the positions changed; None otherwise (also, without the scan, when two of
    four probes differ). The scan runs in C: a finish or a retraction moves one request of a running batch, and the
    guard checks each such step against the whole state. `prefix`: `after` may be longer, and only its first
    len(before) positions are compared (FoldByIdentity's appended requests)."""
    n = len(before)
    if n < FEW_OF_MANY or (n > len(after) if prefix else n != len(after)):
        return None
    last = _LAST_CHANGED
    if before is last[0] and after is last[1] and prefix is last[3]:
        return last[2]  # the folds and the step invariants of one step ask about the same pair in turn
    if (before[0] is not after[0]) + (before[n >> 2] is not after[n >> 2]) + (before[n >> 1] is not after[n >> 1]) \
            + (before[n - 1] is not after[n - 1]) > 1:
        return None  # a step that moved the batch (a decode, a result): not worth the scan
    flags = list(map(is_not, before, after))  # map stops at the shorter: `before`'s positions
    moved = None if flags.count(True) > len(flags) >> 3 else list(compress(range(len(flags)), flags))
    last[:] = (before, after, moved, prefix)  # held, so that their ids are not reused while remembered
    return moved


_LAST_CHANGED: list = [None, None, None, False]  # changed_indices' last (before, after, answer, prefix)


class FoldByIdentity(Generic[_V]):
    """`LastByIdentity` for a fold over a requests tuple (a sum, a count, a filter): for a tuple in which a few
    requests are other objects than in the last one (`changed_indices`), the last value moved
    by those requests alone, `move(value, old, new)`; for a tuple that is the last one with a few requests appended
    (the guard's arrivals: a request joins the state when SGLang first shows it) and few of the others changed, that
    moved value joined with the fold of the appended ones, `join(value, compute(appended))`; otherwise
    `compute(requests)` afresh. `move` and `join` must give what `compute` gives (tests/test_invariants.py holds each
    use to it), as new values: the old one is not changed."""

    __slots__ = ("_key", "_value")

    def __init__(self) -> None:
        self._key: tuple[Request, ...] | None = None
        self._value: Any = None

    def __call__(self, requests: tuple[Request, ...], compute: Callable[[tuple[Request, ...]], _V],
                 move: Callable[[_V, Request, Request], _V], join: Callable[[_V, _V], _V]) -> _V:
        last = self._key
        if requests is last:
            return self._value
        # below FEW_OF_MANY (the checker's states) changed_indices has no answer: not asked
        if last is not None and (n := len(last)) >= FEW_OF_MANY and 0 <= (appended := len(requests) - n) <= n >> 3:
            moved = changed_indices(last, requests, prefix=appended > 0)
            if moved is not None:
                value = self._value
                for i in moved:
                    value = move(value, last[i], requests[i])
                if appended:
                    value = join(value, compute(requests[n:]))
                self._key, self._value = requests, value
                return value
        value = compute(requests)
        self._key, self._value = requests, value
        return value


def _held_and_reserved(requests: tuple[Request, ...]) -> int:
    return sum([r.kv_held + r.kv_reserved for r in requests])  # a list sums faster


def _move_held_and_reserved(value: int, old: Request, new: Request) -> int:
    return value - old.kv_held - old.kv_reserved + new.kv_held + new.kv_reserved


def _count_chunked(requests: tuple[Request, ...]) -> int:
    return [r.status for r in requests].count(Status.PREFILLING)  # list.count: the loop in C


def _move_chunked(value: int, old: Request, new: Request) -> int:
    return value - (old.status is Status.PREFILLING) + (new.status is Status.PREFILLING)


_HELD: FoldByIdentity[int] = FoldByIdentity()  # kv_accounted
_CHUNKED: FoldByIdentity[int] = FoldByIdentity()  # in_flight_count


(_set_s_requests, _set_s_running, _set_s_pending, _set_s_launched, _set_s_stage, _set_s_spec_mode, _set_s_num_steps,
 _set_s_kv_free, _set_s_kv_pool_size, _set_s_thresholds, _set_s_unprocessed, _set_s_prefix_cache,
 _set_s_cached_hash) = (
    State.__dict__[name].__set__ for name in (
        "requests", "running", "pending", "launched", "stage", "spec_mode", "num_steps", "kv_free", "kv_pool_size",
        "thresholds", "unprocessed", "prefix_cache", "_attrs_cached_hash"))


def forget_finished(state: State) -> State:
    """`state` with what no step reads any more of each finished request that has left every batch (running,
    pending, launched, unprocessed) set to fixed values: its prefilled_len, seq_len, draft_kv_len and
    draft_hidden_ready. Such a request never runs again; actions, invariants and properties read its status,
    output and KV only (`tests/test_checker.py` holds them to it). Two states equal here behave alike, so the
    checker counts them once (`Model.dedup_key`); the counterexamples it prints keep the real values."""
    requests = forgotten_requests(state, state.launched)
    return state if requests is state.requests else state.replace(requests=requests)


def forgotten_requests(state: State, launched: Batch | None) -> tuple[Request, ...]:
    """The requests of `forget_finished(state)`, with `launched` standing for the batch the last forward ran on
    (`Model.dedup_key` passes None where no step reads it); `state.requests` itself where nothing is forgotten."""
    requests = state.requests
    finished = [r for r in requests if r.status is Status.FINISHED]
    if not finished:
        return requests
    running, pending, unprocessed = state.running.rids, state.pending, state.unprocessed
    forgotten: list[Request] | None = None
    for r in finished:
        rid = r.rid
        if (rid in running or (pending is not None and rid in pending.rids)
                or (launched is not None and rid in launched.rids)
                or (unprocessed and any(rid in u.rids for u in unprocessed))):
            continue
        f = _FORGOTTEN.get(r)
        if f is None:
            f = _FORGOTTEN[r] = Request(rid, r.prompt_len, r.max_new_tokens, Status.FINISHED, 0, 0, r.committed,
                                        r.kv_held, r.kv_reserved, 0, False)
        if f is not r:
            if forgotten is None:
                forgotten = list(requests)
            forgotten[rid] = f  # requests[rid] is request rid (State.req)
    return requests if forgotten is None else tuple(forgotten)


# a finished request -> the one forget_finished puts in its place (a few hundred at most; shared, so that equal
# keys share their requests and compare by identity)
_FORGOTTEN: dict[Request, Request] = {}


def _check_replace(cls: type, sample: Any) -> None:
    """`cls.replace` sets every field: it must change exactly the field named, for each field."""
    names = tuple(a.name for a in attrs.fields(cls))
    if tuple(inspect.signature(cls.replace).parameters)[1:] != names:
        raise ImportError(f"statemodel.state: {cls.__name__}'s fields changed; update {cls.__name__}.replace")
    for name in names:
        marker = object()  # a value no field holds: it shows up where the field named went
        moved = sample.replace(**{name: marker})
        where = [n for n in names if getattr(moved, n) is marker]
        if where != [name] or moved != attrs.evolve(sample, **{name: marker}):
            raise ImportError(f"statemodel.state: {cls.__name__}.replace does not set {name}")
    # replace skips __init__: no validator or converter may be skipped, and the hash cache starts empty as there
    if any(a.validator is not None or a.converter is not None for a in attrs.fields(cls)):
        raise ImportError(f"statemodel.state: {cls.__name__} has a validator or converter; its replace skips __init__")
    hash(sample)
    copy = sample.replace()
    if copy != sample or copy.__getstate__() != attrs.evolve(sample).__getstate__() or hash(copy) != hash(sample):
        raise ImportError(f"statemodel.state: {cls.__name__}.replace no longer builds what {cls.__name__}() builds")


_check_replace(Batch, Batch((1,), ForwardMode.DECODE, SpecInfo(SpecInfoKind.DRAFT_INPUT, 1, 1), True, 1,
                            GraphShape(1, 1), 0))
_check_replace(State, State((), Batch(), None, None, Stage.SCHEDULE, SpecMode.ON, 2, 4, 4, Thresholds(2, 1), (),
                            (True, False)))


def _fast_cached_hash(cls: type) -> None:
    """Give `cls` (an attrs.frozen(cache_hash=True) class) a `__hash__` that hashes the same fields into the same
    cache slot at about half of attrs' cost: attrs wraps each hash in an int subclass (so that a pickled copy
    carries none) and sets the slot by name through object.__setattr__. A slotted attrs class drops the cache
    when unpickled anyway (`__setstate__`), so a plain int is safe there. Generated from the fields, so a field
    added to the class is hashed too; equal objects hash alike because the hash reads only fields `__eq__` reads."""
    fields = [a for a in attrs.fields(cls) if a.eq]
    if any(a.hash is False for a in fields) or "_attrs_cached_hash" not in getattr(cls, "__slots__", ()):
        raise ImportError(f"statemodel.state: {cls.__name__} is not a slotted class hashing every compared field")
    names = "".join(f"self.{a.name}, " for a in fields)
    namespace = {"_set_cache": cls.__dict__["_attrs_cached_hash"].__set__}
    exec(  # noqa: S102 - the source is built from the class's own field names only
        "def __hash__(self):\n"
        "    h = self._attrs_cached_hash\n"
        "    if h is None:\n"
        f"        h = hash(({names}))\n"
        "        _set_cache(self, h)\n"
        "    return h\n", namespace)
    cls.__hash__ = namespace["__hash__"]  # type: ignore[method-assign]


for _cls in (SpecInfo, GraphShape, Batch, Unprocessed, Thresholds, State):
    _fast_cached_hash(_cls)
