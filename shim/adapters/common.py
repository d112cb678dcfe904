"""What the v2-worker release lines (0.5.16, 0.5.23) share: reading live objects, the hook bodies.

A release module (`sglang_0_5_23`, `sglang_0_5_16`) subclasses `V2Adapter` with what differs: where
a Req keeps its KV lengths, the release_kv_cache signature, how to find the TP rank and the server
arguments. Only host-side data is read: python ints and lists, `.shape` of tensors, and the CPU
mirrors SGLang keeps (`seq_lens_cpu`), after checking they are on the CPU. Never `.item()`,
`.tolist()` or `.cpu()` of a device tensor: the guard adds no GPU synchronisation.
"""

from __future__ import annotations

import logging
import pkgutil
import weakref
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from shim.guard.api import announced_switch
from shim.guard.core import Guard, Mode, SpecFlipViolation
from shim.guard.observe import ObservedBatch, ObservedPool, ObservedRequest
from shim.guard.rank_check import RankChecker, StepFingerprint, fingerprint, group_exchange
from shim.guard.runtime import GuardRuntime
from statemodel.design import Design, Scope
from statemodel.designs import ADAPTIVE_WARM, CATCH_UP, get_design
from statemodel.identity import RowRange
from statemodel.state import ForwardMode, SpecInfoKind, SpecMode

logger = logging.getLogger("specflip.guard")

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


NO_CAP = 1 << 30
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


class V2Adapter:
    """Maps a v2-worker SGLang line's live objects to the model and installs its hooks."""

    release = "unknown"
    # (dotted target, hook type name, method name on this adapter)
    TARGETS: tuple[tuple[str, str, str], ...] = ()
    # a plain decode result's processing writes nothing a reading takes before `_normalize_decode_outputs` returns
    # (checked against this release's source: tests/test_guard_adapters.py), so the result hook may take the reading
    # the iteration's prepare_for_decode / launch took of the same requests (`_result_reading`)
    PLAIN_RESULT_TAKES_READING = False

    def __init__(self) -> None:
        self.runtime: GuardRuntime | None = None
        self._running_ref: Callable[[], Any] | None = None
        # (batch, requests, pool) read by the hook running now, for a round observer of the same batch called
        # inside it (nothing of SGLang's runs in between: the same readings, read once)
        self._read_now: tuple[Any, list[ObservedRequest], ObservedPool] | None = None
        # (batch, its reqs list, their count, the seq_lens_cpu values, the readings) taken by the first hook of a
        # worker call (draft, trivial verify input, plain target forward) for the later hooks of the same call
        # (verify, draft-extend): `observe_requests_in_worker_call`. Dropped at every other hook.
        self._worker_reading: tuple[Any, Any, int, list[int] | None, list[ObservedRequest]] | None = None
        # the same, taken by `prepare_for_decode`'s hook, for that batch's launch (the worker call's first hook:
        # `_take_prepared_reading`) when nothing moved the batch in between, and for the result processed in the
        # same iteration (`_result_reading`)
        self._prepared_reading: tuple[Any, Any, int, list[int] | None, list[ObservedRequest]] | None = None
        # the per-step rank agreement check (TP > 1); False: decided off for this process
        self._rank_checker: RankChecker | bool | None = None
        self._req_to_token: Any = None  # the req_to_token tensor frees are attributed to (ReqToTokenPool's)
        # between a switch's notify_flip_starting and notify_flip: the rows it may free, and their requests
        self._flip_owners: dict[int, tuple[str, int, int]] | None = None
        self._flip_reqs: list[Any] = []
        # (seq_lens_cpu, its _version, seq_lens, its _version) as the last prepare_for_decode left them: a plain launch
        # whose device seq_lens moved alone since is caught (`_device_seq_lens_findings`)
        self._seq_lens_prepared: tuple[Any, int, Any, int] | None = None

    # --- per-release field access (overridden) ------------------------------------------------------

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

    def tp_rank(self) -> int:
        raise NotImplementedError

    def server_args(self) -> Any:
        raise NotImplementedError

    def resolve(self, target: str) -> Any:
        obj_path, _, attr = target.rpartition(".")
        return getattr(pkgutil.resolve_name(obj_path), attr)

    # --- install ------------------------------------------------------------------------------------

    def install(self, runtime: GuardRuntime) -> str | None:
        """Register every hook through SGLang's HookRegistry, or none: returns why not, or None."""
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        missing = []
        for target, _, _ in self.TARGETS:
            try:
                self.resolve(target)
            except Exception as exc:  # noqa: BLE001 - any failure means this target is not there
                missing.append(f"{target} ({type(exc).__name__})")
        if missing:
            return f"sglang {self.release}: hook targets not found: {', '.join(missing)}"
        self.runtime = runtime
        runtime.adapter = self
        for target, kind, method in self.TARGETS:
            HookRegistry.register(target, getattr(self, method), HookType[kind])
        return None

    def guard(self) -> Guard | None:
        """The live Guard, built at the first hooked step once the server's numbers are known."""
        rt = self.runtime
        if rt is None or not rt.active:
            return None
        if rt.guard is None:
            sa = self.server_args()
            reason = self.unsupported_reason(sa)
            if reason:
                rt.disable(f"sglang {self.release}: {reason}")
                return None
            rt.start(design=self.reference_design(sa), scope=self.scope(sa), rank=self.tp_rank(),
                     release=self.release, num_steps=int(getattr(sa, "speculative_num_steps", None) or 0),
                     metrics=bool(getattr(sa, "enable_metrics", False)))
        return rt.guard

    def unsupported_reason(self, sa: Any) -> str | None:
        """Configurations the model does not describe: the guard stays off for them."""
        if sa is None:
            return None
        if getattr(sa, "page_size", 1) not in (None, 1):
            return f"page_size {sa.page_size} (the model counts KV in single slots; supported: 1)"
        algo = getattr(sa, "speculative_algorithm", None)
        if algo not in (None, "EAGLE", "EAGLE3"):
            return f"speculative algorithm {algo} (supported: EAGLE, EAGLE3, none)"
        if algo is not None and (getattr(sa, "speculative_eagle_topk", 1) or 1) != 1:
            return f"speculative_eagle_topk {sa.speculative_eagle_topk} (the model drafts a chain: topk 1)"
        if (getattr(sa, "pp_size", 1) or 1) > 1:
            return f"pipeline parallel size {sa.pp_size} (supported: 1)"
        if getattr(sa, "enable_dp_attention", False):
            return "DP attention (not modelled)"
        if getattr(sa, "enable_mixed_chunk", False):
            return "mixed chunked prefill (MIXED batches are not modelled)"
        if getattr(sa, "disaggregation_mode", "null") not in (None, "null"):
            return f"PD disaggregation ({sa.disaggregation_mode})"
        return None

    def reference_design(self, sa: Any) -> Design:
        """SPECFLIP_DESIGN overrides this (shim.guard.runtime); else the design the installed switch announced
        (shim.guard.api), else SGLang's own adaptive design or specflip's catch-up design."""
        switch = announced_switch()
        if switch is not None:
            return get_design(switch.design_name)
        return ADAPTIVE_WARM if getattr(sa, "speculative_adaptive", False) else CATCH_UP

    def scope(self, sa: Any) -> Scope:
        cap = int(getattr(sa, "max_running_requests", None) or NO_CAP)
        chunk = int(getattr(sa, "chunked_prefill_size", None) or NO_CAP)
        switch = announced_switch()
        # with the switch installed, speculation holds the switch's cap and plain decoding the launch cap
        spec_cap = min(cap, switch.spec_cap) if switch is not None else cap
        return Scope(requests=(), kv_pool_size=0, spec_cap=spec_cap, plain_cap=cap, chunk_size=max(chunk, 1),
                     graph_capture_sizes=(), overlap=self.runs_overlap_loop(sa))

    @staticmethod
    def runs_overlap_loop(sa: Any) -> bool:
        """Whether the scheduler runs `event_loop_overlap` (step N's result processed after step N+1 launched):
        SGLang's `enable_overlap = not server_args.disable_overlap_schedule` (MLX aside), read once the server
        arguments are resolved (a CPU or a spec config may have turned it off)."""
        return sa is not None and getattr(sa, "disable_overlap_schedule", True) is False

    # --- observation ----------------------------------------------------------------------------------

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

    def remember_pool(self, req_to_token_pool: Any) -> None:
        if req_to_token_pool is not None:
            self._req_to_token = req_to_token_pool.req_to_token

    def remember_running(self, batch: Any) -> None:
        self._running_ref = weakref.ref(batch)
        self.remember_pool(getattr(batch, "req_to_token_pool", None))

    # --- hooks (signatures follow HookRegistry: BEFORE fn(*a, **k), AFTER fn(result, *a, **k),
    #     AROUND fn(original, *a, **k)) ----------------------------------------------------------------

    def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._worker_reading = None  # any hook but a worker call's own: the worker call's readings end
        self._prepared_reading = None  # and so does prepare_for_decode's (its own hook sets it after this)
        self._run_in_worker_call(fn, *args, **kwargs)

    def _run_in_worker_call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """`_run` for a hook inside the speculative worker's call: the call's readings are kept."""
        rt = self.runtime
        if rt is not None and rt.active:
            rt.run(fn, *args, **kwargs)

    def _with_guard(self, step: Callable[[Guard], None]) -> None:
        """Every hook's one shape: `step(guard)` under the runtime's error handling (`GuardRuntime.run`), only
        while the guard is live (built at the first hooked step, see `guard`)."""
        self._run(self._call_with_guard, step)

    def _with_guard_in_worker_call(self, step: Callable[[Guard], None]) -> None:
        """`_with_guard` for the hooks inside the speculative worker's call, which keep its readings
        (`observe_requests_in_worker_call`)."""
        self._run_in_worker_call(self._call_with_guard, step)

    def _call_with_guard(self, step: Callable[[Guard], None]) -> None:
        rt = self.runtime
        # inside GuardRuntime.run, which runs only an active runtime: a built guard is the live one
        g = rt.guard if rt is not None and rt.guard is not None else self.guard()
        if g is not None:
            step(g)

    def around_prepare_for_extend(self, original: Callable[..., Any], batch: Any, *args: Any, **kwargs: Any) -> Any:
        # close a speculative round before the prefill allocates: its pool reading must not count the new
        # requests' slots, which belong to requests the guard has not seen arrive yet
        self._run(self._settle)
        result = original(batch, *args, **kwargs)
        self.after_prepare_for_extend(result, batch, *args, **kwargs)
        return result

    def after_prepare_for_extend(self, result: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        def step(g: Guard) -> None:
            if not batch.reqs:
                return
            spec_on = not batch.spec_algorithm.is_none()
            reqs = self.observe_requests(batch)
            # a re-prefill (after a retraction) carries the output it kept: checked token for token
            outputs = [(obs.rid, req.output_ids) for obs, req in zip(reqs, batch.reqs, strict=True) if obs.output_len]
            g.prefill(self.observe_batch(batch, spec_info=None), reqs, self.batch_pool(batch),
                      draft_prefills=spec_on, where="ScheduleBatch.prepare_for_extend", outputs=outputs)
            if not getattr(getattr(batch, "tree_cache", None), "disable", True):
                for req in batch.reqs:  # the prefix each matched in the tree (locked: cache_protected_len)
                    self.tree_prefix_seen(g, req)
        self._with_guard(step)

    # --- the radix tree's draft coverage (issue 24; shim/guard/tree_draft.py) ------------------------------------

    def req_namespace(self, req: Any) -> Any:
        """The tree's namespace of a request's keys, as `key_namespace` reads it off a RadixKey."""
        return getattr(req, "extra_key", None), getattr(req, "cache_salt", None) or None

    def key_namespace(self, key: Any) -> Any:
        return getattr(key, "extra_key", None), getattr(key, "cache_salt", None) or None

    def tree_prefix_seen(self, g: Guard, req: Any) -> None:
        """The request's tree prefix (`cache_protected_len`, a python int) and, only when the guard's record holds
        positions without draft KV, its token ids (host lists)."""
        cached = self.req_kv_lens(req)[3]
        g.tree_prefix_seen(str(req.rid), cached,
                           lambda: (list(req.origin_input_ids) + list(req.output_ids), self.req_namespace(req)))

    def around_tree_insert(self, original: Callable[..., Any], tree_cache: Any, params: Any, *args: Any,
                           **kwargs: Any) -> Any:
        """`RadixCache.insert` (0.5.16) / `UnifiedRadixCache.insert` (0.5.23): the positions `[prefix_len,
        len(key))` are new in the tree; the guard marks them with the draft coverage of the request being cached."""
        result = original(tree_cache, params, *args, **kwargs)
        if getattr(tree_cache, "disable", False):
            return result

        def step(g: Guard) -> None:
            key = params.key  # read after the call: 0.5.16's insert turns it into EAGLE's bigram view in place
            g.tree_created(key.raw_token_ids(), self.key_namespace(key), int(result.prefix_len), len(key),
                           bigram=bool(key.is_bigram))
        self._with_guard(step)
        return result

    def before_tree_delete_leaf(self, tree_cache: Any, node: Any, *args: Any, **kwargs: Any) -> None:
        """0.5.16's `RadixCache._delete_leaf(node)` (eviction): the guard forgets the leaf's positions. The path's
        tokens are the host keys of the node and its ancestors, walked only when the record holds anything."""
        def step(g: Guard) -> None:
            if not g.tree_record.without_draft:
                return
            chain = []
            n = node
            while n is not None and n.parent is not None:
                chain.append(n)
                n = n.parent
            chain.reverse()
            tokens: list[int] = []
            for i, part in enumerate(chain):
                raw = list(part.key.raw_token_ids())
                # a bigram key of N positions spans N + 1 tokens, sharing its first with its parent's last
                tokens.extend(raw[1:] if part.key.is_bigram and i else raw)
            end = sum(len(part.key) for part in chain)
            g.tree_record.forgotten(tokens, self.key_namespace(node.key), end - len(node.key), end)
        self._with_guard(step)

    def after_prepare_for_decode(self, result: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        def step(g: Guard) -> None:
            if not batch.reqs:
                return
            self.remember_running(batch)
            spec_path = not batch.spec_algorithm.is_none()
            # the speculative path leaves out_cache_loc to the worker: no slots of this step in it
            batch_reqs = batch.reqs
            seq_lens, reqs = self._read_batch(batch)
            pool = self.batch_pool(batch)
            running = self.observe_batch(batch, out_cache_loc_width=0 if spec_path else None, reqs=reqs)
            self._remember_seq_lens(batch)
            self._read_now = (batch, reqs, pool)  # the round in flight on this batch settles in this call
            try:
                g.prepare_for_decode(running, reqs, pool)
            finally:
                self._read_now = None
            # for the launch of this batch (the worker call's first hook: before_target_forward for a plain batch,
            # before_draft / before_trivial_verify_input for a speculative one) and this iteration's result hook
            self._prepared_reading = (batch, batch_reqs, len(batch_reqs), seq_lens, reqs)
        self._with_guard(step)

    def around_merge_batch(self, original: Callable[..., Any], batch: Any, other: Any, *args: Any,
                           **kwargs: Any) -> Any:
        def before(g: Guard) -> None:
            if not other.reqs:
                return
            pending = self.observe_batch(other)
            merged = self.merge_preview(batch, other)
            g.merge(merged, pending, self.observe_requests(batch) + self.observe_requests(other),
                    self.batch_pool(batch))
        self._with_guard(before)
        result = original(batch, other, *args, **kwargs)

        def after(g: Guard) -> None:
            if other.reqs:
                self.remember_running(batch)
                g.refine_running(self.observe_batch(batch), where="ScheduleBatch.merge_batch (result)")
        self._with_guard(after)
        return result

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

    def around_filter_batch(self, original: Callable[..., Any], batch: Any, *args: Any, **kwargs: Any) -> Any:
        if batch.forward_mode is None:
            # 0.5.23's bare running batch (Scheduler.__init__: ScheduleBatch(reqs=[])), filtered every iteration
            # before it ever held a request: nothing the model tracks
            return original(batch, *args, **kwargs)
        self._run(self._settle)
        result = original(batch, *args, **kwargs)

        def after(g: Guard) -> None:
            ref = self._running_ref() if self._running_ref else None
            if ref is not None and ref is not batch:
                return  # a batch other than the running one (e.g. a prefill batch dropping its chunked req)
            self.remember_running(batch)
            g.filter(self.observe_batch(batch), lambda: (self.observe_requests(batch), self.batch_pool(batch)))
        self._with_guard(after)
        return result

    def around_release_kv_cache(self, original: Callable[..., Any], req: Any, tree_cache: Any, *args: Any,
                                **kwargs: Any) -> Any:
        finished = bool(req.finished())
        window: dict[str, Any] = {}

        # three guarded calls per release, not six (a wave's end releases every request of it)
        def open_window(g: Guard) -> None:
            if g.round is not None:
                g.settle_round()  # not the finishes waiting in a free group: this one joins them
            # the positions it frees are attributed to this request's row (record_free, inside the window)
            self.remember_pool(getattr(tree_cache, "req_to_token_pool", None))
            window["owners"] = self.row_owners([req])
            g.open_free_window(window["owners"])
            g.tree_inserting.append(str(req.rid))  # its KV may go into the tree
            window["inserting"] = True

        def close_window(g: Guard) -> None:
            try:
                if "owners" in window and g.free_windows:
                    window["found"] = g.close_free_window(self.rows_allocated(window["owners"], [req]),
                                                          "finish" if finished else "retract")
            finally:
                if window.get("inserting") and g.tree_inserting:
                    g.tree_inserting.pop()
        self._with_guard(open_window)
        try:
            result = original(req, tree_cache, *args, **kwargs)
        finally:
            self._with_guard(close_window)

        def after(g: Guard) -> None:
            pool = self.observe_pool(tree_cache.token_to_kv_pool_allocator, tree_cache)
            g.release(str(req.rid), finished=finished, reqs=[self.observe_request(req)], pool=pool,
                      where="mem_cache.common.release_kv_cache", outputs=[(str(req.rid), req.output_ids)],
                      extra=window.get("found", ()))
        self._with_guard(after)
        return result

    def before_allocator_free(self, allocator: Any, free_index: Any, *args: Any, **kwargs: Any) -> None:
        """`TokenToKVPoolAllocator.free(index)`: inside a window the guard opened (a release, a flip), the row
        positions `index` views, from tensor metadata only."""
        self._worker_reading = None  # a free moves the pool (none happens inside a worker call; if one did: re-read)
        self._prepared_reading = None
        rt = self.runtime
        g = rt.guard if rt is not None and rt.active else None
        if g is None or not g.free_windows or self._req_to_token is None:
            return None
        g.record_free(row_range(free_index, self._req_to_token))
        return None

    def after_free_group_begin(self, result: Any, allocator: Any, *args: Any, **kwargs: Any) -> None:
        """`free_group_begin()`: the finishes released until the group ends are checked as one step. The readings of
        the iteration stand (a group that frees nothing moves nothing; a free clears them, `before_allocator_free`)."""
        self._with_guard_in_worker_call(Guard.begin_release_group)

    def before_free_group_end(self, allocator: Any, *args: Any, **kwargs: Any) -> None:
        """`free_group_end()`, before the queued slots go back to the free list: the group's finishes are checked."""
        self._with_guard_in_worker_call(Guard.end_release_group)

    def around_tree_cache_keep(self, original: Callable[..., Any], tree_cache: Any, req: Any, *args: Any,
                               **kwargs: Any) -> Any:
        """The radix cache takes an unfinished request's prompt into the tree (0.5.12 / 0.5.16
        `cache_unfinished_req`, 0.5.23 `checkpoint`): slots that duplicate what the tree already held go back to
        the pool and the request's own share shrinks to what lies past `cache_protected_len`. No model step:
        the guard re-reads that request and the pool, and kv_conservation still has to hold. The slots it frees (the
        duplicates of what the tree held) are the tree's: a window of their own keeps them out of a flip's window
        (a flip's drain processes a prefill's result, and 0.5.16's `cache_unfinished_req` frees there; seen live as a
        false `slots_freed_owned` on the H200); they are counted, not judged (kv_conservation counts them)."""
        window: dict[str, bool] = {}

        def open_window(g: Guard) -> None:
            g.open_free_window({})
            window["open"] = True

        def close_window(g: Guard) -> None:
            if window.get("open") and g.free_windows:
                g.free_windows.pop()
        self._with_guard(open_window)
        self._with_guard(lambda g: g.tree_inserting.append(str(req.rid)))
        try:
            result = original(tree_cache, req, *args, **kwargs)
        finally:
            self._with_guard(close_window)
            self._with_guard(lambda g: g.tree_inserting.pop() if g.tree_inserting else None)
        if getattr(tree_cache, "disable", False):
            return result  # a disabled tree returns at once (0.5.23 still calls it per prefill and finish)

        def after(g: Guard) -> None:
            pool = self.observe_pool(tree_cache.token_to_kv_pool_allocator, tree_cache)
            g.tree_cache_update([self.observe_request(req)], pool,
                                where=f"{type(tree_cache).__name__} (prompt into the tree)")
            self.tree_prefix_seen(g, req)  # repointed at the tree's slots up to its new cache_protected_len
        self._with_guard(after)
        return result

    def _settle(self) -> None:
        g = self.guard()
        if g is not None:
            g.settle_round()

    def before_target_forward(self, worker: Any, batch: Any = None, *args: Any, **kwargs: Any) -> None:
        is_verify = kwargs.get("is_verify", args[2] if len(args) > 2 else False)
        if batch is None or is_verify or not batch.forward_mode.is_decode() or not batch.reqs:
            return None

        def step(g: Guard) -> None:
            graph = self.graph_for(worker.model_runner, len(batch.reqs), batch.spec_info)
            self._take_prepared_reading(batch)
            reqs = self.observe_requests_in_worker_call(batch)
            launched = self.observe_batch(batch, graph=graph, reqs=reqs)
            g.plain_decode(launched, reqs, self.batch_pool(batch),
                           where="TpModelWorker.forward_batch_generation (plain DECODE)",
                           seq_observed=getattr(batch, "seq_lens_cpu", None) is not None,
                           device_seq_lens_moved=self._device_seq_lens_moved(batch))
        self._with_guard_in_worker_call(step)
        return None

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
        if held is None or held[0] is not batch or held[1] is not batch.reqs or self._worker_reading is not None:
            return
        if _no_output_grew(held[1], held[4]):
            self._worker_reading = held

    def _round_observer(self, batch: Any) -> Callable[[], tuple[ObservedBatch, list[ObservedRequest], ObservedPool]]:
        def observe() -> tuple[ObservedBatch, list[ObservedRequest], ObservedPool]:
            now = self._read_now
            if now is not None and now[0] is batch:
                return self.observe_batch(batch), now[1], now[2]
            return self.observe_batch(batch), self.observe_requests(batch), self.batch_pool(batch)
        return observe

    def before_draft(self, draft_worker: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("with_topology") or batch.forward_mode.is_idle() or not batch.reqs:
            return None

        def step(g: Guard) -> None:
            steps = int(draft_worker.speculative_num_steps)
            self._take_prepared_reading(batch)
            g.draft(steps, self.observe_requests_in_worker_call(batch), self.batch_pool(batch),
                    self._round_observer(batch), where="EagleDraftWorker.draft")
        self._with_guard_in_worker_call(step)
        return None

    def before_trivial_verify_input(self, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        if batch.forward_mode.is_idle() or not batch.reqs:
            return None

        def step(g: Guard) -> None:
            self._take_prepared_reading(batch)
            g.draft(0, self.observe_requests_in_worker_call(batch), self.batch_pool(batch), self._round_observer(batch),
                    where="EAGLEWorkerV2._build_trivial_verify_input (steps 0)")
        self._with_guard_in_worker_call(step)
        return None

    def before_verify(self, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        if batch.forward_mode.is_idle() or not batch.reqs:
            return None

        def step(g: Guard) -> None:
            verify_input = batch.spec_info
            graph = self.graph_for(worker.target_worker.model_runner, len(batch.reqs), verify_input)
            reqs = self.observe_requests_in_worker_call(batch)
            launched = self.observe_batch(batch, forward_mode=ForwardMode.TARGET_VERIFY, graph=graph,
                                          out_cache_loc_width=tensor_width(verify_input.draft_token), reqs=reqs)
            g.verify_launch(launched, reqs, self.batch_pool(batch),
                            where="EAGLEWorkerV2.verify (TARGET_VERIFY launch)")
        self._with_guard_in_worker_call(step)
        return None

    def before_draft_extend_for_decode(self, draft_worker: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        self._draft_extend(batch, skipped=False, where="EagleDraftWorker._draft_extend_for_decode")

    def before_stub_skipped_draft_extend(self, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        self._draft_extend(batch, skipped=True, where="EAGLEWorkerV2._stub_skipped_draft_extend")

    def _draft_extend(self, batch: Any, *, skipped: bool, where: str) -> None:
        if batch.forward_mode.is_idle() or not batch.reqs:
            return

        def observe() -> tuple[ObservedBatch, list[ObservedRequest], ObservedPool]:
            # called now or never (a round in flight only notes the extend): inside this worker call; the steps it
            # feeds (draft_extend, draft_sync, draft_catch_up) take no seq_len from it
            reqs = self.observe_requests_in_worker_call(batch, lengths=False)
            return self.observe_batch(batch, reqs=reqs), reqs, self.batch_pool(batch)

        def step(g: Guard) -> None:
            g.draft_extend_starts(skipped=skipped, observe=observe, where=where)
        self._with_guard_in_worker_call(step)

    def after_normalize_decode_outputs(self, normalized: Any, processor: Any, *args: Any, **kwargs: Any) -> None:
        """`SchedulerBatchResultProcessor._normalize_decode_outputs(batch=, result=, ...)` returned: in a decode
        result's processing, right after `_resolve_spec_v2_tokens` committed the accepted runs
        (`kv_committed_len += accept_len`) on the spec path, or the plain tokens were listed, and before
        `free_group_begin` and the per-request loop that finishes and releases. Under the overlap schedule that
        is the model's `process_result` of the oldest launched step; `batch` is the copy queued at its launch."""
        batch, result = kwargs.get("batch"), kwargs.get("result")
        if batch is None or result is None or not batch.reqs:
            return
        # taken before `_with_guard` drops it: this iteration's reading of the batch launched (or about to launch)
        held = self._worker_reading or self._prepared_reading

        def step(g: Guard) -> None:
            if not g.config.scope.overlap:
                return  # the normal loop settles rounds at the scheduler's next hook
            reqs = batch.reqs
            spec = not batch.spec_algorithm.is_none() and getattr(result, "accept_lens", None) is not None
            accept = host_ints(result.accept_lens) if spec else None  # _resolve_spec_v2_tokens asserts CPU
            mirror = batch.seq_lens_cpu
            if mirror is not None and tensor_width(mirror) == len(reqs):
                # the copy's seq_lens_cpu: the lengths step N+1 launched from; its verify added accept_lens
                base = host_ints(mirror)
                seq_lens: list[int] | list[None] = [b + a for b, a in zip(base, accept, strict=True)] \
                    if accept is not None else base
            else:
                # no CPU mirror (needs_cpu_seq_lens False): kv_committed_len, just advanced to the same length
                seq_lens = [None] * len(reqs)
            pool = self.observe_pool(processor.token_to_kv_pool_allocator, getattr(processor, "tree_cache", None))
            where = "SchedulerBatchResultProcessor._normalize_decode_outputs (result processed)"
            reused = self._result_reading(batch, held)
            if reused is not None:
                lengths = dict(zip([o[0] for o in reused], [o[6] for o in reused] if seq_lens[0] is None
                                   else seq_lens, strict=True))  # kv_committed_len without a mirror, as a reading
                g.process_result(list(lengths), None, reused, pool, where=where, seq_lens=lengths)
                return
            observed = self._observe_reqs(reqs, seq_lens)
            g.process_result([o[0] for o in observed], accept, observed, pool, where=where)
        self._with_guard(step)

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

    def after_apply_runtime_state(self, result: Any, worker: Any, state: Any, *args: Any, **kwargs: Any) -> None:
        def step(g: Guard) -> None:
            g.note(f"adaptive controller: speculative_num_steps -> {state.speculative_num_steps}")
        self._with_guard(step)

    # --- TP > 1: the ranks agree on the step before it runs (shim.guard.rank_check) -----------------------------

    def rank_checker(self, scheduler: Any) -> RankChecker | None:
        """The process's RankChecker, decided once: on when the guard is on, SPECFLIP_RANK_CHECK allows it, the
        scheduler's TP CPU group holds more than one rank and the configuration is one the guard supports. Every
        input is the same on every rank (the environment, the server arguments, the group), so every rank decides
        alike and each exchange has all its peers."""
        if self._rank_checker is None:
            self._rank_checker = False
            rt = self.runtime
            group = getattr(scheduler, "tp_cpu_group", None)
            if rt is not None and rt.mode is not Mode.OFF and rt.rank_check and group is not None \
                    and self.unsupported_reason(self.server_args()) is None:
                import torch.distributed as dist

                world = dist.get_world_size(group)
                if world > 1:
                    self._rank_checker = RankChecker(group_exchange(group, world), rank=dist.get_rank(group),
                                                     world_size=world, mode=rt.mode)
        return self._rank_checker or None

    def after_get_next_batch_to_run(self, plan: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
        """`Scheduler.get_next_batch_to_run` returned this iteration's plan (after the switch's flip, before
        `run_batch`): with TP > 1 the ranks exchange its fingerprint. Runs on every iteration of every rank, also
        while this rank's guard is off (its fingerprint says so): a rank that skipped the exchange would leave its
        peers waiting in it."""
        self._worker_reading = None  # every scheduler iteration passes here before its worker call
        checker = self.rank_checker(scheduler)
        rt = self.runtime
        if checker is None or rt is None or rt.paused:
            return None
        batch = getattr(plan, "batch_to_run", None)
        g = rt.guard if rt.active else None
        if g is None and rt.active:
            try:
                g = self.guard()
            except Exception:  # noqa: BLE001 - the guard's own start-up error surfaces at its own hooks
                g = None
        state = g.check_pending() if g is not None else None
        model = {"guard_mode_on": None if state is None else state.spec_mode is SpecMode.ON,
                 "guard_num_steps": None if state is None else state.num_steps,
                 "guard_transitions": None if g is None else g.step_number}

        def make(step: int) -> StepFingerprint:
            if batch is None or not batch.reqs:
                return fingerprint(step, forward_mode=None, rids=(), out_cache_loc_width=0, spec_algorithm_on=False,
                                   spec_decode=False, **model)
            spec_on = not batch.spec_algorithm.is_none()
            mode = batch.forward_mode
            return fingerprint(step, forward_mode=int(mode), rids=[str(r.rid) for r in batch.reqs],
                               out_cache_loc_width=tensor_width(batch.out_cache_loc), spec_algorithm_on=spec_on,
                               spec_decode=spec_on and mode.is_decode(), **model)

        try:
            checker.check(make)
        except SpecFlipViolation:
            raise
        except Exception:
            if rt.mode is Mode.ASSERT:
                raise
            # warn / trace mode: the exchange failed (a peer is gone); stop exchanging, serving goes on
            logger.exception("specflip guard: the rank agreement check failed; it stops on this rank")
            checker.stopped = True
        return None

    # --- called by a flip implementation (shim.guard.api.notify_flip) -----------------------------------------

    def on_flip_starting(self, reqs: list[Any]) -> None:
        """A switch is about to flip over `reqs` (the running and prefilled requests it may touch): a round in
        flight settles now, and the positions the flip frees are recorded against these requests' rows."""
        def step(g: Guard) -> None:
            g.flip_starting()
            if self._flip_owners is not None and g.free_windows:
                g.free_windows.pop()  # a flip that never notified its end
            self._flip_owners = self.row_owners(reqs)
            self._flip_reqs = list(reqs)
            g.open_free_window(self._flip_owners)
        self._with_guard(step)

    def _flip_slot_findings(self, g: Guard, on: bool) -> list[Any]:
        owners, reqs = self._flip_owners, self._flip_reqs
        self._flip_owners, self._flip_reqs = None, []
        if owners is None or not g.free_windows:
            return []
        return g.close_free_window(self.rows_allocated(owners, reqs), "flip_on" if on else "flip_off")

    def on_flip(self, on: bool, batch: Any) -> None:
        def step(g: Guard) -> None:
            extra = self._flip_slot_findings(g, on)
            if batch is None or not batch.reqs:
                # an empty running batch still names the pool: a flip that released KV (flip-on by retraction)
                # is checked against it; without one, the pool as last observed
                real_pool = batch is not None and getattr(batch, "token_to_kv_pool_allocator", None) is not None
                g.flip(on, None, [], self.batch_pool(batch) if real_pool else g_pool_or_none(g), where="switch",
                       extra=extra)
                return
            self.remember_running(batch)
            g.flip(on, self.observe_batch(batch), self.observe_requests(batch), self.batch_pool(batch),
                   where="switch (shim.guard.api.notify_flip)", extra=extra)
        self._with_guard(step)


def g_pool_or_none(guard: Guard) -> ObservedPool:
    """The pool as last observed (a flip with nothing running changes no KV)."""
    state = guard.check_pending()
    return ObservedPool(free=state.kv_free, size=state.kv_pool_size)


def _no_output_grew(reqs: list[Any], readings: list[ObservedRequest]) -> bool:
    """Whether each request's output is as long as its reading took it: a reading stands only while none grew (a result
    processed without a hook of the guard's appends tokens)."""
    return [len(r.output_ids) for r in reqs] == [o[3] for o in readings]  # ObservedRequest.output_len
