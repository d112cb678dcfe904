"""The guard's reading of live SGLang objects, for every release line: requests, the KV pool, batches, CUDA graphs.

Only host-side data is read: python ints and lists, `.shape` of tensors, and the CPU mirrors SGLang keeps
(`seq_lens_cpu`), after checking they are on the CPU. Never `.item()`, `.tolist()` or `.cpu()` of a device tensor: the
guard adds no GPU synchronisation (`host_ints` is the one place that reads tensor values). `LiveReading` is the
readings' half of the guard's adapter (`guard_hooks.V2Adapter`); a line module overrides where its Req keeps its KV
lengths and row (`req_kv_lens`, `req_row`) and anything else its line reads otherwise.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from shim.guard.observe import ObservedBatch, ObservedPool, ObservedRequest
from statemodel.identity import RowRange
from statemodel.state import ForwardMode, SpecInfoKind

_FORWARD_MODES = {
    "IDLE": ForwardMode.IDLE, "EXTEND": ForwardMode.EXTEND, "DECODE": ForwardMode.DECODE,
    "MIXED": ForwardMode.MIXED, "TARGET_VERIFY": ForwardMode.TARGET_VERIFY,
    "DRAFT_EXTEND": ForwardMode.DRAFT_EXTEND, "DRAFT_EXTEND_V2": ForwardMode.DRAFT_EXTEND,
}


# SGLang's ForwardMode member (by id; the entry holds the member, so its id is not reused) -> the model's: an Enum's
# `.name` and `__hash__` are Python-level calls, and every observed batch asks
_MODE_BY_ID: dict[int, tuple[Any, ForwardMode]] = {}


def _model_mode(member: Any) -> ForwardMode:
    entry = _MODE_BY_ID.get(id(member))
    if entry is None or entry[0] is not member:
        entry = _MODE_BY_ID[id(member)] = (member, _FORWARD_MODES.get(member.name, ForwardMode.IDLE))
    return entry[1]


_new_tuple = tuple.__new__


class HostReadError(RuntimeError):
    """An adapter was about to read a device tensor's values (a GPU sync): refused."""


def tensor_width(tensor: Any) -> int:
    """Entries along dim 0 from the shape alone (a 0-d tensor is one slot; None is none)."""
    if tensor is None:
        return 0
    shape = tuple(tensor.shape)
    return 1 if not shape else int(shape[0])


def host_ints(tensor: Any) -> list[int]:
    """Values of a CPU tensor (SGLang's `*_cpu` mirrors). A device tensor is refused, not synced."""
    device = getattr(tensor, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        raise HostReadError(f"refusing to read a {device} tensor on the host (that would sync the GPU)")
    values = tensor.tolist()
    if values and type(values[0]) is int:
        return values  # an integer tensor's tolist() is python ints already (one dtype for every entry)
    return [int(x) for x in values]


_CAPTURE_SIZES: list[Any] = [None, ()]  # (a copy of the last capture_bs list asked about, its sizes sorted)


def cuda_graph_runner_replay(runner: Any, batch_size: int) -> tuple[int, int] | None:
    """The graph a `model_executor.cuda_graph_runner.CudaGraphRunner` (0.5.12's and 0.5.13's decode runner, in the
    model runner's `graph_runner`) replays for `batch_size` requests: its `can_run` read from its host attributes. It
    ignores the forward's tokens per request: a speculative target replays its verify graphs (`num_tokens_per_bs` =
    draft tokens) for any batch that fits, so a plain step on them is the guard's to catch. None: eager."""
    if runner is None or batch_size > int(runner.max_bs):
        return None
    sizes = sorted_capture_sizes(runner.capture_bs)
    at = bisect_left(sizes, batch_size)  # the first captured size >= batch_size
    return (sizes[at] if at < len(sizes) else int(runner.max_bs)), int(runner.num_tokens_per_bs)


def sorted_capture_sizes(capture_bs: Any) -> tuple[int, ...]:
    """A CUDA graph runner's captured batch sizes as sorted python ints. Asked at every verify and plain launch; a
    server's list is 30-50 sizes, sorted once: the last answer is taken again while the list compares equal to a
    copy of the one it came from (a C comparison of ints)."""
    if type(capture_bs) is not list:  # only a list's == is a plain comparison of values (never a tensor's)
        return tuple(sorted(int(b) for b in capture_bs))
    last = _CAPTURE_SIZES
    if last[0] == capture_bs:
        return last[1]
    sizes = tuple(sorted(int(b) for b in capture_bs))
    _CAPTURE_SIZES[:] = [list(capture_bs), sizes]
    return sizes


def row_range(index: Any, req_to_token: Any) -> RowRange | None:
    """The req_to_token row positions a 1-D index tensor views, from its metadata alone (`_base`, strides and the
    storage offset: no value is read, so no sync); None when it is no contiguous view of one row of `req_to_token`
    (a copy, a gather, a cat)."""
    base = getattr(index, "_base", None)
    if base is None or base is not req_to_token or index.dim() != 1 or index.stride(0) != 1:
        return None
    width = req_to_token.stride(0)
    row, start = divmod(index.storage_offset() - req_to_token.storage_offset(), width)
    end = start + int(index.numel())
    if end > req_to_token.shape[1]:
        return None
    return RowRange(row, start, end)


class _GrowingNumelSum:
    """`sum(int(t.numel()) for t in queued)` for a free group's queue, reading only the tensors appended since the last
    call on the same list. The guard counts the queue after every release, and a step releases every finished request
    inside one group: summed afresh, a burst of k finishes read k*k/2 tensors. SGLang starts each group with a new list
    (`free_group_begin`: `self.free_group = []`, every release line) and only appends to it; a list that is another
    object, or shorter than last seen, is summed afresh. The list is held, so its id is not reused while remembered."""

    __slots__ = ("_queued", "_seen", "_total")

    def __init__(self) -> None:
        self._queued: list[Any] | None = None
        self._seen = 0
        self._total = 0

    def __call__(self, queued: list[Any]) -> int:
        if queued is not self._queued or len(queued) < self._seen:
            self._queued, self._seen, self._total = queued, 0, 0
        total = self._total
        for indices in queued[self._seen:]:
            total += int(indices.numel())
        self._seen, self._total = len(queued), total
        return total


_QUEUED_INDICES = _GrowingNumelSum()  # the free group's token indices (page size 1)

_QUEUED_PAGE_IDS = _GrowingNumelSum()  # 0.5.23's paged free_page_ids_group


def pending_free_slots(allocator: Any) -> int:
    """Slots freed inside a free group and not yet returned to the free list.

    The scheduler releases every finished request of a step between ``free_group_begin`` and
    ``free_group_end``; inside it ``free()`` only queues the indices, so ``available_size()`` leaves them
    out until the group ends. The guard checks right after each release, so it counts the queue as free.
    0.5.12 / 0.5.16 flag the group with ``is_not_in_free_group`` (the list outlives the group); 0.5.23
    sets ``free_group`` to None outside one."""
    if getattr(allocator, "is_not_in_free_group", False):
        return 0
    queued = getattr(allocator, "free_group", None) or []
    page_size = int(getattr(allocator, "page_size", 1) or 1)
    # 0.5.23's paged free_segment queues page ids, not token indices
    queued_pages = _QUEUED_PAGE_IDS(getattr(allocator, "free_page_ids_group", None) or [])
    if not queued:
        return queued_pages * page_size
    if page_size == 1:
        return _QUEUED_INDICES(queued)
    import torch  # paged pools free whole pages: count the distinct pages (a sync, only at finishes)

    return (int(torch.unique(torch.cat(list(queued)) // page_size).numel()) + queued_pages) * page_size


def _no_output_grew(reqs: list[Any], readings: list[ObservedRequest]) -> bool:
    """Whether each request's output is as long as its reading took it: a reading stands only while none grew (a result
    processed without a hook of the guard's appends tokens)."""
    return [len(r.output_ids) for r in reqs] == [o[3] for o in readings]  # ObservedRequest.output_len


class LiveReading:
    """The adapter's readings of live objects, and the readings it holds for a later hook of the same step (state
    set up by `guard_hooks.V2Adapter.__init__`)."""

    _running_ref: Callable[[], Any] | None
    _read_now: tuple[Any, list[ObservedRequest], ObservedPool] | None
    _worker_reading: tuple[Any, Any, int, list[int] | None, list[ObservedRequest]] | None
    _prepared_reading: tuple[Any, Any, int, list[int] | None, list[ObservedRequest]] | None
    _req_to_token: Any
    _live_reqs: dict[int, Any]
    _seq_lens_prepared: tuple[Any, int, Any, int] | None
    _worker_pool: tuple[Any, ObservedPool] | None
    _prepared_pool: tuple[Any, ObservedPool] | None

    # a plain decode result's processing writes nothing a reading takes before `_normalize_decode_outputs` returns
    # (checked against this release's source: tests/test_guard_adapters.py), so the result hook may take the reading
    # the iteration's prepare_for_decode / launch took of the same requests (`_result_reading`)
    PLAIN_RESULT_TAKES_READING = False

    def req_kv_lens(self, req: Any) -> tuple[bool, int, int, int]:
        """(holds KV, kv_committed_len, kv_allocated_len, cache_protected_len)."""
        raise NotImplementedError

    def req_row(self, req: Any) -> int | None:
        """The request's req_to_token row (`req_pool_idx`), None while it holds none."""
        raise NotImplementedError

    def row_owners(self, reqs: list[Any]) -> dict[int, tuple[str, int, int]]:
        """row -> (rid, cache_protected_len, kv_allocated_len) of each request holding a row (python ints)."""
        owners = {}
        for req in reqs:
            holds, _, allocated, protected = self.req_kv_lens(req)
            row = self.req_row(req) if holds else None
            if row is not None:
                owners[int(row)] = (str(req.rid), protected, allocated)
        return owners

    def rows_allocated(self, owners: dict[int, tuple[str, int, int]], reqs: list[Any]) -> dict[int, int | None]:
        """row -> kv_allocated_len now for the rows in `owners` (None: the request no longer holds that row)."""
        now: dict[int, int | None] = {}
        for req in reqs:
            holds, _, allocated, _ = self.req_kv_lens(req)
            row = self.req_row(req) if holds else None
            if row is not None and int(row) in owners and owners[int(row)][0] == str(req.rid):
                now[int(row)] = allocated
        return now

    def observe_request(self, req: Any, seq_len: int | None = None) -> ObservedRequest:
        return self._observe_reqs([req], [seq_len])[0]

    def observe_requests(self, batch: Any) -> list[ObservedRequest]:
        return self._read_batch(batch)[1]

    def _read_batch(self, batch: Any) -> tuple[list[int] | None, list[ObservedRequest]]:
        """(the seq_lens_cpu values, None without the mirror; the requests' readings)."""
        reqs = batch.reqs
        mirror = getattr(batch, "seq_lens_cpu", None)
        if mirror is not None and tensor_width(mirror) == len(reqs):
            seq_lens = host_ints(mirror)  # the CPU mirror, read once for the batch
            return seq_lens, self._observe_reqs(reqs, seq_lens)
        return None, self._observe_reqs(reqs, [None] * len(reqs))

    def observe_requests_in_worker_call(self, batch: Any, *, lengths: bool = True) -> list[ObservedRequest]:
        """`observe_requests(batch)` for a hook inside the speculative worker's call (`forward_batch_generation`):
        the readings the call's first hook took are reused when nothing but the worker ran since (no other hook of
        the guard's, `_run` drops them) on the same batch, the same reqs list of the same length, with the
        seq_lens_cpu values read now (one host list). Nothing the worker runs writes the fields read: no Req KV
        length, row, output, finish or prompt, no allocation or free (docs/guard.md, "Cost";
        tests/test_guard_adapters.py holds SGLang's worker code to it). `lengths` False: the caller takes no seq_len
        from the reading (the draft-extend's steps compare none: `Guard.draft_extend_starts`), so a held reading is
        taken as it is, without the tuples rebuilt for the lengths of now."""
        reqs = batch.reqs
        count = len(reqs)
        held = self._worker_reading
        if not lengths and held is not None and held[0] is batch and held[1] is reqs and held[2] == count:
            return held[4]
        mirror = getattr(batch, "seq_lens_cpu", None)
        seq_lens = host_ints(mirror) if mirror is not None and tensor_width(mirror) == count else None
        if held is not None and held[0] is batch and held[1] is reqs and held[2] == count:
            if held[3] == seq_lens:
                return held[4]
            # the worker moved the batch's seq_lens (the switch's plain step publishes seq_lens + 1 for the target and
            # restores them for its draft sync): the same readings with these lengths (kv_committed_len without them)
            new_tuple, observed_type = _new_tuple, ObservedRequest
            lengths = [o[6] for o in held[4]] if seq_lens is None else seq_lens
            # ObservedRequest's fields by position (sync.py checks their order at import): the length is the 8th
            observed = [new_tuple(observed_type, (rid, prompt, most, out, own, alloc, committed, n, holds, filled))
                        for (rid, prompt, most, out, own, alloc, committed, _, holds, filled), n
                        in zip(held[4], lengths, strict=True)]
            self._worker_reading = (batch, reqs, count, seq_lens, observed)
            return observed
        observed = self._observe_reqs(reqs, [None] * count if seq_lens is None else seq_lens)
        self._worker_reading = (batch, reqs, count, seq_lens, observed)
        return observed

    def _observe_reqs(self, reqs: list[Any], seq_lens: list[int] | list[None]) -> list[ObservedRequest]:
        # one tight loop: this runs for every request of the batch several times per decode step
        kv_lens = self.req_kv_lens
        out: list[ObservedRequest] = []
        append = out.append
        new_tuple = _new_tuple
        observed = ObservedRequest
        for req, seq_len in zip(reqs, seq_lens, strict=True):
            holds, committed, allocated, protected = kv_lens(req)
            if holds:
                own_committed = committed - protected if committed > protected else 0
                own_allocated = allocated - protected if allocated > protected else 0
            else:
                own_committed = own_allocated = 0
            append(new_tuple(observed, (  # ObservedRequest's fields in order, without __new__'s call cost
                str(req.rid), len(req.origin_input_ids), int(req.sampling_params.max_new_tokens or 0),
                len(req.output_ids), own_committed, own_allocated, committed,
                committed if seq_len is None else seq_len, holds, committed,
            )))
        return out

    def observe_pool(self, allocator: Any, tree_cache: Any = None) -> ObservedPool:
        free = int(allocator.available_size()) + pending_free_slots(allocator)
        if tree_cache is not None:
            # slots the tree cache owns belong to no request: the model counts them free
            free += int(tree_cache.evictable_size()) + int(tree_cache.protected_size())
        return ObservedPool(free=free, size=int(allocator.size))

    def batch_pool(self, batch: Any) -> ObservedPool:
        return self.observe_pool(batch.token_to_kv_pool_allocator, getattr(batch, "tree_cache", None))

    def pool_in_worker_call(self, batch: Any) -> ObservedPool:
        """`batch_pool(batch)` for a hook inside the speculative worker's call: the pool the call's first hook read
        (or `prepare_for_decode`'s hook, taken with its reading: `_take_prepared_reading`) while the worker call's
        reading of this batch stands. The worker allocates and frees nothing (`observe_requests_in_worker_call`),
        and every alloc and free drops the held pool (the allocator hooks), as does every other hook of the
        guard's (`_run`); the tree cache's lock moves shift slots between its evictable and protected sizes, whose
        sum is what the pool counts. A speculative round's draft, verify and draft-extend read it once."""
        held = self._worker_pool
        if held is not None and held[0] is batch and self._worker_reading is not None:
            return held[1]
        pool = self.batch_pool(batch)
        self._worker_pool = (batch, pool)
        return pool

    def spec_shape(self, spec_info: Any) -> tuple[SpecInfoKind, int, int]:
        if spec_info is None:
            return SpecInfoKind.NONE, 0, 0
        if spec_info.is_verify_input():
            per_row = int(spec_info.draft_token_num)
            return SpecInfoKind.VERIFY_INPUT, tensor_width(spec_info.draft_token) // max(per_row, 1), per_row
        if spec_info.is_draft_input():
            future = getattr(spec_info, "future_indices", None)
            rows = tensor_width(future) if future is not None else tensor_width(spec_info.topk_index)
            return SpecInfoKind.DRAFT_INPUT, rows, 1
        return SpecInfoKind.NONE, 0, 0

    def observe_batch(self, batch: Any, *, forward_mode: ForwardMode | None = None, graph: Any = None,
                      spec_info: Any = ..., out_cache_loc_width: int | None = None,
                      reqs: list[ObservedRequest] | None = None) -> ObservedBatch:
        """`reqs`: this batch's requests as just read (their rids, in order, without reading them again)."""
        # an empty ScheduleBatch is no batch to SGLang (the scheduler drops it): no spec_info either
        kind, rows, per_row = self.spec_shape(batch.spec_info if spec_info is ... else spec_info) if batch.reqs \
            else (SpecInfoKind.NONE, 0, 0)
        mode = forward_mode or _model_mode(batch.forward_mode)
        return ObservedBatch(
            rids=tuple([str(r.rid) for r in batch.reqs] if reqs is None else [o[0] for o in reqs]),
            forward_mode=mode, spec_kind=kind, spec_rows=rows,
            spec_tokens_per_row=per_row, spec_algorithm_on=not batch.spec_algorithm.is_none(),
            out_cache_loc_width=tensor_width(batch.out_cache_loc) if out_cache_loc_width is None
            else out_cache_loc_width,
            graph=graph, extend_tokens=int(batch.extend_num_tokens or 0) if mode is ForwardMode.EXTEND else 0,
        )

    def graph_for(self, model_runner: Any, batch_size: int, spec_info: Any) -> tuple[int, int] | None:
        """The CUDA graph a forward of `batch_size` requests would replay: DecodeCudaGraphRunner.can_run_graph
        read from its host-side attributes (None: eager)."""
        runner = getattr(model_runner, "decode_cuda_graph_runner", None)
        if runner is None:
            return None
        width = int(runner.captured_req_width)
        per_req = getattr(spec_info, "num_tokens_per_req", -1) if spec_info is not None else -1
        if per_req is not None and per_req > 0 and per_req != width:
            return None
        sizes = sorted_capture_sizes(runner.capture_bs)
        at = bisect_left(sizes, batch_size)  # the first captured size >= batch_size
        if at == len(sizes) or batch_size > int(runner.max_bs):
            return None
        return sizes[at], width

    def merge_preview(self, batch: Any, other: Any) -> ObservedBatch:
        """The batch `batch.merge_batch(other)` produces, computed before it runs (its spec_info rows as
        ScheduleBatch.merge_batch / EagleDraftInput.merge_batch concatenate them)."""
        own = self.observe_batch(batch)
        theirs = self.observe_batch(other)
        kind, rows, per_row = own.spec_kind, own.spec_rows, own.spec_tokens_per_row
        if batch.spec_info is not None:  # `if self.spec_info: self.spec_info.merge_batch(other.spec_info)`
            if rows == 0:
                kind, rows, per_row = theirs.spec_kind, theirs.spec_rows, theirs.spec_tokens_per_row
            elif theirs.spec_kind is kind:
                rows += theirs.spec_rows
        return ObservedBatch(rids=own.rids + theirs.rids, forward_mode=own.forward_mode, spec_kind=kind,
                             spec_rows=rows, spec_tokens_per_row=per_row, spec_algorithm_on=own.spec_algorithm_on)

    def remember_pool(self, req_to_token_pool: Any) -> None:
        if req_to_token_pool is not None:
            req_to_token = req_to_token_pool.req_to_token
            if req_to_token is not self._req_to_token:
                self._live_reqs.clear()  # rows of another pool (one process, many tests)
            self._req_to_token = req_to_token

    def remember_running(self, batch: Any) -> None:
        self._running_ref = weakref.ref(batch)
        self.remember_pool(getattr(batch, "req_to_token_pool", None))

    def req_namespace(self, req: Any) -> Any:
        """The tree's namespace of a request's keys, as `key_namespace` reads it off a RadixKey."""
        return getattr(req, "extra_key", None), getattr(req, "cache_salt", None) or None

    def key_namespace(self, key: Any) -> Any:
        return getattr(key, "extra_key", None), getattr(key, "cache_salt", None) or None

    def _remember_seq_lens(self, batch: Any) -> None:
        """The seq_lens tensors `prepare_for_decode` left on `batch`, by identity and `_version` (metadata: no sync)."""
        mirror, device = getattr(batch, "seq_lens_cpu", None), getattr(batch, "seq_lens", None)
        self._seq_lens_prepared = None if mirror is None or device is None else (
            mirror, mirror._version, device, device._version)

    def _device_seq_lens_moved(self, batch: Any) -> bool:
        """A plain DECODE launch whose host mirror is the one `prepare_for_decode` left, unwritten, while its device
        seq_lens are another tensor or were written in place since: the device lengths disagree with the host's."""
        held = self._seq_lens_prepared
        if held is None:
            return False
        mirror, device = getattr(batch, "seq_lens_cpu", None), getattr(batch, "seq_lens", None)
        if mirror is not held[0] or mirror._version != held[1] or device is None:
            return False  # the host mirror moved too (a switch's own launch lengths): the model compares its values
        return device is not held[2] or device._version != held[3]

    def _take_prepared_reading(self, batch: Any) -> None:
        """The launch of a batch (plain, or a speculative worker call's first hook) reads what `prepare_for_decode`'s
        hook read, when nothing moved the batch in
        between: no other hook of the guard's ran (`_run` drops the reading, and so does a free), the batch and its
        reqs list are the same objects, no request's output grew (a result processed in between appends tokens,
        with no hook of the guard's when it is a prefill's: 0.5.16's loop without overlap runs it there), and
        `observe_requests_in_worker_call` then compares the seq_lens mirror. Between the two SGLang runs
        `is_disable_overlap_for_batch`, that result processing, and run_batch's reads of the batch; for a speculative
        batch also EAGLEWorkerV2.forward_batch_generation up to its draft (an idle draft input made when the batch
        has none), which writes nothing a reading takes (tests/test_guard_adapters.py, the worker call's scan)."""
        held, self._prepared_reading = self._prepared_reading, None
        pool, self._prepared_pool = self._prepared_pool, None
        if held is None or held[0] is not batch or held[1] is not batch.reqs or self._worker_reading is not None:
            return
        if _no_output_grew(held[1], held[4]):
            self._worker_reading = held
            if pool is not None and pool[0] is batch:
                self._worker_pool = pool  # the pool read with it (`pool_in_worker_call`)

    def _result_reading(self, batch: Any, held: tuple[Any, Any, int, list[int] | None, list[ObservedRequest]] | None,
                        ) -> list[ObservedRequest] | None:
        """The readings a plain decode result's hook takes over from this iteration's reading of the same requests
        (one reading per plain overlap iteration instead of two), or None: read them again. Under 0.5.23's overlap
        loop (`Scheduler.event_loop_overlap`) one iteration runs get_next_batch_to_run (filter, merge,
        `prepare_for_decode` of step N+1: its hook reads the batch, after alloc_for_decode moved the KV lengths),
        `is_disable_overlap_for_batch`, then `run_batch(N+1)` (the launch hook takes that reading; the worker call
        writes nothing a reading takes: tests/test_guard_adapters.py), `_apply_war_barrier`, `batch.copy()`, and then
        step N's `process_batch_result` (a trace flush, the load published) and `process_batch_result_decode`:
        `copy_done.synchronize()`, `snapshot_auxiliary_output_starts`,
        `materialize_sampling_mask_output` and `_normalize_decode_outputs`, whose plain branch only lists the
        tokens. None of these writes a Req field a reading takes (KV lengths, row, output, prompt, budget, rid): a
        plain step's KV lengths move in `prepare_for_decode` (before the reading), its output in the loop after this
        hook. When the loop runs N+1 without overlap, step N's result is processed right after that
        `prepare_for_decode`, with only `is_disable_overlap_for_batch` in between. Taken only when all of these hold:
        - this release's source was checked for that order (`PLAIN_RESULT_TAKES_READING`; 0.5.16's loop and result
          processing run the same steps, less the auxiliary output snapshot and the sampling masks);
        - the result is a plain step's (`batch.spec_algorithm` none: `_normalize_decode_outputs` did not run
          `_resolve_spec_v2_tokens`, which commits the accepted tokens' KV);
        - no other hook of the guard's ran since the reading (`_run` drops it, and so does a free);
        - the copy holds the very Req objects the reading read, in its order (a request finished or retracted at
          step N's launch is left out of N+1's batch: the lists differ, read again);
        - no request's output grew since (as `_take_prepared_reading`).
        The seq_len comes from the copy's mirror, as before (`Guard.process_result`'s `seq_lens`); the pool is read."""
        if held is None or not self.PLAIN_RESULT_TAKES_READING or not batch.spec_algorithm.is_none():
            return None
        reqs, readings = batch.reqs, held[4]
        # Req defines no __eq__: list equality is an identity test per item (the same objects compare equal at C speed)
        if len(reqs) != len(readings) or reqs != held[1]:
            return None
        return readings if _no_output_grew(reqs, readings) else None

    def _round_observer(self, batch: Any) -> Callable[[], tuple[ObservedBatch, list[ObservedRequest], ObservedPool]]:
        def observe() -> tuple[ObservedBatch, list[ObservedRequest], ObservedPool]:
            now = self._read_now
            if now is not None and now[0] is batch:
                return self.observe_batch(batch), now[1], now[2]
            return self.observe_batch(batch), self.observe_requests(batch), self.batch_pool(batch)
        return observe
