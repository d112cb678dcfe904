"""The guard's hook bodies over live SGLang objects (`V2Adapter`), shared by every release line: what each hooked
SGLang call means to the model (`shim.guard.core.Guard`'s steps), and installing the hooks.

A line module (`v0_5_16`, `v0_5_23`, ...) subclasses `V2Adapter` with what differs: where a Req keeps its KV lengths,
the hook targets, the release_kv_cache signature, how to find the TP rank and the server arguments. The readings of
live objects are `guard_reading.LiveReading`'s, the rank-check glue `guard_ranks.RankCheckHooks`'.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable
from typing import Any

from shim.guard.api import announced_switch
from shim.guard.core import Guard, SpecFlipViolation
from shim.guard.observe import ObservedBatch, ObservedPool, ObservedRequest
from shim.guard.rank_check import RankChecker
from shim.guard.runtime import GuardRuntime
from shim.guard.slot_values import ALLOC, FREE, LiveRow
from shim.releases.guard_ranks import RankCheckHooks
from shim.releases.guard_reading import (
    LiveReading,
    host_ints,
    row_range,
    tensor_width,
)
from shim.releases.sizing import attention_dp_size
from statemodel.design import Design, Scope
from statemodel.designs import ADAPTIVE_WARM, CATCH_UP, get_design
from statemodel.state import ForwardMode

NO_CAP = 1 << 30


class V2Adapter(LiveReading, RankCheckHooks):
    """Maps a v2-worker SGLang line's live objects to the model and installs its hooks."""

    release = "unknown"
    # (dotted target, hook type name, method name on this adapter)
    TARGETS: tuple[tuple[str, str, str], ...] = ()

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
        # (batch, pool) read with the worker call's reading, for its later hooks (`pool_in_worker_call`), and with
        # `prepare_for_decode`'s, for that batch's launch; dropped with those readings and at every alloc and free
        self._worker_pool: tuple[Any, ObservedPool] | None = None
        self._prepared_pool: tuple[Any, ObservedPool] | None = None
        # row -> the request prefilled into it (`after_prepare_for_extend`): the live rows whose slots a free of a copy
        # or an alloc must not hit (shim/guard/slot_values.py); dropped at the request's release (`after` in
        # `around_release_kv_cache`: the guard keeps no finished request, its prompt and output, alive), and an entry
        # whose request left the row otherwise (a row passed on without a release the guard saw) is dropped on read
        self._live_reqs: dict[int, Any] = {}
        self._live_allocator: Any = None  # the KV allocator of those rows' pool (the batch's); others are not judged
        # (allocator, slots queued) while `free_group_end` runs: its one free of the queued copies is skipped (the
        # values were judged when each was queued)
        self._group_flush: tuple[Any, int] | None = None

    # --- per-release field access (overridden) ------------------------------------------------------

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

    def before_init_model_worker(self, scheduler: Any, *args: Any, **kwargs: Any) -> None:
        """`Scheduler.init_model_worker` BEFORE: the scheduler process's start-up, its logging set up, before the
        weights load and before anything is served. Whether the guard checks this configuration is decided here
        (`GuardRuntime.decide_at_start_up`), on the scheduler's own server arguments (`scheduler_server_args`): in
        assert mode one that the model does not describe stops start-up with one line; in warn and trace mode the
        guard is off with one line and, with `--enable-metrics`, `specflip_guard_checking{tp_rank} 0`. Where no
        server arguments can be read here, nothing is decided: the first step does (`guard`)."""
        rt = self.runtime
        if rt is None or rt.paused:
            return None
        sa = self.scheduler_server_args(scheduler)
        if sa is None:
            return None
        rt.decide_at_start_up(self.start_up_reason(sa), rank=self.scheduler_tp_rank(scheduler),
                              metrics=bool(getattr(sa, "enable_metrics", False)))
        return None

    def after_check_server_args(self, result: Any, server_args: Any, *args: Any, **kwargs: Any) -> None:
        """`ServerArgs.check_server_args` returned: in SGLang's launching process, where `Engine._launch_subprocesses`
        calls it after `load_plugins()` and before it starts any scheduler process (every line 0.5.12 ... 0.5.23;
        `python -m sglang.launch_server`, `sglang serve` and `Engine(...)` all launch through it). Assert mode on a
        configuration the guard does not check stops the launch here, with the one line each scheduler process would
        have said (`GuardRuntime.stop_at_launch`): no scheduler process starts to die of it, so SGLang's launcher
        prints no traceback after it. The rest of the decision stays each scheduler process's
        (`before_init_model_worker`), which also decides where this hook did not run."""
        rt = self.runtime
        if rt is not None:
            rt.stop_at_launch(self.start_up_reason(server_args))
        return None

    def start_up_reason(self, sa: Any) -> str | None:
        """What the start-up hooks decide on: `unsupported_reason` of the values resolution left in `sa`
        (`launch_view`), named with the release; None where the guard checks this configuration."""
        reason = self.unsupported_reason(self.launch_view(sa))
        return None if reason is None else f"sglang {self.release}: {reason}"

    def resolved_server_args(self) -> Any:
        """The published server arguments (`server_args`) as SGLang resolved them (`launch_view`), None where none
        are published: what the first step's scope, caps, overlap loop and configuration check read, as the start-up
        hooks do (from 0.5.19 the record keeps, e.g., `max_running_requests`, `chunked_prefill_size` and
        `disable_overlap_schedule` as the operator gave them, and resolution's values beside it)."""
        return self.launch_view(self.server_args())

    def launch_view(self, sa: Any) -> Any:
        """The resolved values of the server arguments `sa` as this line keeps them (its release line's
        `launch_view`: the record itself up to 0.5.18, which resolve into it; from 0.5.19 resolution's view, where a
        value SGLang chose, e.g. the EAGLE tree's topk, is not written back into the record)."""
        if sa is None:
            return None
        from shim.releases.registry import release_line

        return release_line(self.release).launch_view(sa)

    def scheduler_server_args(self, scheduler: Any) -> Any:
        """The server arguments at the scheduler's start-up: the Scheduler's own (`Scheduler.__init__` sets
        `self.server_args` before it calls `self.init_model_worker()` on every line 0.5.12 ... 0.5.23, read in each
        line's source by tests/test_guard_start_up.py), else the published ones (`server_args`). The published ones
        alone are not enough here: 0.5.12 ... 0.5.16 publish them (`set_global_server_args_for_scheduler`) only in
        `ModelRunner.__init__`, inside `init_model_worker`, after this hook (0.5.16: model_runner.py:311); 0.5.17 on
        publish them in `run_scheduler_process` before the Scheduler is built."""
        sa = getattr(scheduler, "server_args", None)
        return sa if sa is not None else self.server_args()

    def scheduler_tp_rank(self, scheduler: Any) -> int:
        """The scheduler's TP rank at its start-up, before the model worker sets up the TP group: its own record
        (`ps.tp_rank`, or `tp_rank` where it keeps no ParallelState), else the process-wide one (`tp_rank`)."""
        for rank in (getattr(getattr(scheduler, "ps", None), "tp_rank", None), getattr(scheduler, "tp_rank", None)):
            if isinstance(rank, int):
                return rank
        return self.tp_rank()

    def guard(self) -> Guard | None:
        """The live Guard, built at the first hooked step once the server's numbers are known. Whether the guard
        checks this configuration was decided at start-up (`before_init_model_worker`). Where nothing was decided
        there (the hook did not run in this process: a guard installed after the scheduler was built, a test driving
        batches directly; or it read no server arguments, which no line 0.5.12 ... 0.5.23 leaves it), an unsupported
        configuration is met here and turns the guard off: one line and, with `--enable-metrics`,
        `specflip_guard_checking{tp_rank} 0` (`GuardRuntime.off_at_first_step`; assert mode cannot stop start-up any
        more, the line says serving goes on)."""
        rt = self.runtime
        if rt is None or not rt.active:
            return None
        if rt.guard is None:
            sa = self.resolved_server_args()
            reason = self.unsupported_reason(sa)
            if reason:
                rt.off_at_first_step(f"sglang {self.release}: {reason}", rank=self.tp_rank(),
                                     metrics=bool(getattr(sa, "enable_metrics", False)))
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
            return f"page_size {sa.page_size} (--page-size; the model counts KV in single slots; supported: 1)"
        algo = getattr(sa, "speculative_algorithm", None)
        if algo not in (None, "EAGLE", "EAGLE3"):
            return f"speculative algorithm {algo} (--speculative-algorithm; supported: EAGLE, EAGLE3, none)"
        if algo is not None and (getattr(sa, "speculative_eagle_topk", 1) or 1) != 1:
            return (f"speculative_eagle_topk {sa.speculative_eagle_topk} (--speculative-eagle-topk; the model drafts "
                    f"a chain: topk 1)")
        if (getattr(sa, "pp_size", 1) or 1) > 1:
            return f"pipeline parallel size {sa.pp_size} (--pp-size; supported: 1)"
        # the record's flag, or the attention DP size resolution keeps (0.5.22 on its view says enable_dp_attention
        # False and dp_size 1 for --enable-dp-attention --dp-size 2, and attn_dp_size 2)
        if getattr(sa, "enable_dp_attention", False) or attention_dp_size(sa) > 1:
            return "DP attention (--enable-dp-attention; not modelled)"
        if getattr(sa, "enable_mixed_chunk", False):
            return "mixed chunked prefill (--enable-mixed-chunk; MIXED batches are not modelled)"
        if getattr(sa, "disaggregation_mode", "null") not in (None, "null"):
            return f"PD disaggregation (--disaggregation-mode {sa.disaggregation_mode})"
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
        # chunked prefill off (None, or <= 0: `--chunked-prefill-size -1`; SGLang's `init_chunked_prefill` makes
        # it None) lets one prefill batch extend a whole prompt: the model's chunk is then unbounded, not 1 token
        chunk = int(getattr(sa, "chunked_prefill_size", None) or 0)
        chunk = chunk if chunk > 0 else NO_CAP
        switch = announced_switch()
        # with the switch installed, speculation holds the switch's cap and plain decoding the launch cap
        spec_cap = min(cap, switch.spec_cap) if switch is not None else cap
        return Scope(requests=(), kv_pool_size=0, spec_cap=spec_cap, plain_cap=cap, chunk_size=chunk,
                     graph_capture_sizes=(), overlap=self.runs_overlap_loop(sa))

    @staticmethod
    def runs_overlap_loop(sa: Any) -> bool:
        """Whether the scheduler runs `event_loop_overlap` (step N's result processed after step N+1 launched):
        SGLang's `enable_overlap = not server_args.disable_overlap_schedule` (MLX aside), read once the server
        arguments are resolved (a CPU or a spec config may have turned it off)."""
        return sa is not None and getattr(sa, "disable_overlap_schedule", True) is False

    # --- hooks (signatures follow HookRegistry: BEFORE fn(*a, **k), AFTER fn(result, *a, **k),
    #     AROUND fn(original, *a, **k)) ----------------------------------------------------------------

    def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._worker_reading = None  # any hook but a worker call's own: the worker call's readings end
        self._prepared_reading = None  # and so does prepare_for_decode's (its own hook sets it after this)
        self._worker_pool = self._prepared_pool = None
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
        # the KV allocator whose allocs and frees the slot-value check follows: from this prefill's own alloc on
        self._live_allocator = getattr(batch, "token_to_kv_pool_allocator", None)
        result = original(batch, *args, **kwargs)
        self.after_prepare_for_extend(result, batch, *args, **kwargs)
        return result

    def after_prepare_for_extend(self, result: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        def step(g: Guard) -> None:
            if not batch.reqs:
                return
            self.remember_pool(getattr(batch, "req_to_token_pool", None))
            if g.slot_values.on:  # the rows the slot-value check reads (off: nothing reads them)
                for req in batch.reqs:
                    row = self.req_row(req)
                    if row is not None:
                        self._live_reqs[int(row)] = req
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
            self._prepared_pool = (batch, pool)
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

    def around_filter_batch(self, original: Callable[..., Any], batch: Any, *args: Any, **kwargs: Any) -> Any:
        if batch.forward_mode is None:
            # 0.5.23's bare running batch (Scheduler.__init__: ScheduleBatch(reqs=[])), filtered every iteration
            # before it ever held a request: nothing the model tracks
            return original(batch, *args, **kwargs)
        self._run(self._settle)
        held = batch.reqs  # filter_batch builds a new list: this one keeps what the batch held before
        result = original(batch, *args, **kwargs)

        def after(g: Guard) -> None:
            ref = self._running_ref() if self._running_ref else None
            if ref is not None and ref is not batch:
                return  # a batch other than the running one (e.g. a prefill batch dropping its chunked req)
            # where the running batch it knew is gone (SGLang assigned a prefilled batch in its place), the guard
            # tells a prefill batch from it by what the batch held
            if g.filter(self.observe_batch(batch), lambda: (self.observe_requests(batch), self.batch_pool(batch)),
                        held=tuple([str(r.rid) for r in held]) if ref is None else None):
                self.remember_running(batch)
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
            for row in window.get("owners", ()):  # the row it held is no live row now (a retraction re-prefills)
                if self._live_reqs.get(row) is req:
                    del self._live_reqs[row]
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
        self._worker_pool = self._prepared_pool = None
        rt = self.runtime
        g = rt.guard if rt is not None and rt.active else None
        if g is None or self._req_to_token is None:
            return None
        rows = row_range(free_index, self._req_to_token)
        if g.free_windows:
            g.record_free(rows)
        if g.slot_values.on and allocator is self._live_allocator:
            flush, self._group_flush = self._group_flush, None
            if flush is not None and flush[0] is allocator and flush[1] == int(free_index.numel()):
                return None  # free_group_end's cat of the slots queued in the group: each was seen as it was queued
            # a copy (no positions), or a row view no window judges: by value
            rt.run(self._freed_slots, g, allocator, free_index, rows is None or not g.free_windows)
        return None

    def _freed_slots(self, g: Guard, allocator: Any, free_index: Any, by_value: bool) -> None:
        checks = g.slot_values
        checks.track(allocator)
        if not checks.on:  # off
            return
        if checks.batching and not g.free_windows:  # the tree's eviction: judged and released at its end
            checks.hold(free_index)
            return
        if by_value:
            self._check_slot_values(g, free_index, FREE)
        checks.released(free_index)

    def around_tree_evict(self, original: Callable[..., Any], tree_cache: Any, *args: Any, **kwargs: Any) -> Any:
        """The radix tree's eviction (`RadixCache.evict`, `UnifiedRadixCache._evict`: each line's TARGETS): it frees
        each evicted leaf's slots, a copy of the leaf's values, one free per leaf, outside any window, so each would
        be judged by value against every live row (a [rows, longest] scan, shim/guard/slot_values.py). Those frees
        are held (`SlotValueCheck.begin_batch`) and judged by one scan when the eviction returns, before the alloc
        it makes room for: nothing allocates and no live row moves in between (an alloc inside one judges what is
        held first, `_allocated_slots`). The cost it saves: docs/guard.md, "The tree's eviction"."""
        rt = self.runtime
        g = rt.guard if rt is not None and rt.active else None
        if g is None or not g.slot_values.on:
            return original(tree_cache, *args, **kwargs)
        g.slot_values.begin_batch()
        try:
            return original(tree_cache, *args, **kwargs)
        finally:
            freed = g.slot_values.end_batch()
            if freed is not None:
                rt.run(self._judge_batched, g, freed, "TokenToKVPoolAllocator.free, in the tree's eviction "
                                                      "(judged when it returned)")

    def _judge_batched(self, g: Guard, freed: Any, where: str) -> None:
        """Frees held in a batch (`around_tree_evict`), judged as each would have been at its free with no window
        open, then their slots released."""
        self._check_slot_values(g, freed, FREE, where=where)
        g.slot_values.released(freed)

    def after_allocator_alloc(self, result: Any, allocator: Any, *args: Any, **kwargs: Any) -> None:
        """`TokenToKVPoolAllocator.alloc(n)`: the slots it hands out, and the copies freed since the last alloc,
        against the live rows' allocations (by value: shim/guard/slot_values.py)."""
        self._worker_pool = self._prepared_pool = None  # an alloc moves the pool: a held pool reading ends
        rt = self.runtime
        g = rt.guard if rt is not None and rt.active else None
        if g is None or allocator is not self._live_allocator or not g.slot_values.on:
            return None
        rt.run(self._allocated_slots, g, allocator, result)
        return None

    def _allocated_slots(self, g: Guard, allocator: Any, slots: Any) -> None:
        g.slot_values.track(allocator)
        if not g.slot_values.on:  # off
            return
        held = g.slot_values.take_batch()  # an alloc inside the tree's eviction: what it freed so far first
        if held is not None:
            self._judge_batched(g, held, "TokenToKVPoolAllocator.free, in the tree's eviction (judged at an alloc "
                                         "inside it)")
        self._check_slot_values(g, slots, ALLOC)

    def _check_slot_values(self, g: Guard, slots: Any, kind: str,
                           where: str = "TokenToKVPoolAllocator.free") -> None:
        """`kind` FREE: slots freed by a tensor that is no row view, against every live request's committed KV
        [0, kv_committed_len) now; inside a window (a release, a flip) the freeing requests' own part is theirs to
        free, their tree prefix [0, cache_protected_len) is not. A reserve [kv_committed_len, kv_allocated_len) may be
        freed before its request's allocation shrinks: the copy is judged again at the next alloc, against the
        allocations then. `kind` ALLOC: the slots handed out (None: none), and those copies."""
        self._judge_slot_values(g)
        checks = g.slot_values
        if kind == FREE:
            owners = g.free_windows[-1].owners_before if g.free_windows else {}
            found = checks.check(slots, self._req_to_token, self._live_rows(g, owners, committed=True), FREE, FREE)
            g.slot_value_findings(found, FREE, where)
            if not found:  # (warn mode) one finding per fault
                checks.defer(slots)
            return
        freed = checks.take_deferred()
        if freed is not None:
            rows = self._live_rows(g, {}, committed=False)
            found = checks.check(freed, self._req_to_token, rows, FREE, "free (judged at the next alloc)")
            g.slot_value_findings(found, FREE, "TokenToKVPoolAllocator.free, judged at the next alloc")
        if slots is not None:
            found = checks.allocated(slots, lambda: self._live_rows(g, {}, committed=False), self._req_to_token, ALLOC)
            g.slot_value_findings(found, ALLOC, "TokenToKVPoolAllocator.alloc")

    def around_event_loop(self, original: Callable[..., Any], scheduler: Any, *args: Any, **kwargs: Any) -> Any:
        """`Scheduler.run_event_loop`: where the process meets the error a slot-value check's device assert raised
        (a CUDA error at its next CUDA call, in SGLang's code or the guard's), the guard's finding is raised from it
        (`Guard.report_stopped`), before SGLang logs the exception and stops the server. Any other exception passes
        unchanged."""
        try:
            return original(scheduler, *args, **kwargs)
        except Exception as exc:
            rt = self.runtime
            g = rt.guard if rt is not None else None
            if g is not None and not isinstance(exc, SpecFlipViolation):
                g.report_stopped(exc)
            raise

    def _judge_slot_values(self, g: Guard) -> None:
        """The device checks queued at earlier allocator calls whose answers have arrived (no wait)."""
        for action, found in g.slot_values.judge_due():
            g.slot_value_findings(found, action.split()[0],
                                  f"TokenToKVPoolAllocator.{action}, answer read at a later allocator call")

    def _live_rows(self, g: Guard, owners: dict[int, tuple[str, int, int]], *, committed: bool) -> list[LiveRow]:
        """The live requests' rows, each as the positions nobody else may free or allocate: [0, kv_committed_len)
        (`committed`) or [0, kv_allocated_len); for a request of the window freeing now (`owners`) only its tree
        prefix [0, cache_protected_len)."""
        rows: list[LiveRow] = []
        index = g.index
        for row, req in list(self._live_reqs.items()):
            holds, done, allocated, protected = self.req_kv_lens(req)
            if not holds or self.req_row(req) != row:
                del self._live_reqs[row]  # released (or its row passed to another request)
                continue
            hi = protected if row in owners else done if committed else allocated
            if hi > 0:
                rows.append(LiveRow(row, 0, hi, index.get(str(req.rid), -1)))
        return rows

    def after_free_group_begin(self, result: Any, allocator: Any, *args: Any, **kwargs: Any) -> None:
        """`free_group_begin()`: the finishes released until the group ends are checked as one step. The readings of
        the iteration stand (a group that frees nothing moves nothing; a free clears them, `before_allocator_free`)."""
        self._with_guard_in_worker_call(Guard.begin_release_group)

    def before_free_group_end(self, allocator: Any, *args: Any, **kwargs: Any) -> None:
        """`free_group_end()`, before the queued slots go back to the free list: the group's finishes are checked."""
        queued = getattr(allocator, "free_group", None)
        self._group_flush = (allocator, sum(int(t.numel()) for t in queued)) if queued else None
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
            # the request's row: its duplicates of what the tree held are its to free (a free of their values, not
            # a row view, is checked by value against the other rows: shim/guard/slot_values.py); never judged here
            g.open_free_window(self.row_owners([req]))
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
            g.plain_decode(launched, reqs, self.pool_in_worker_call(batch),
                           where="TpModelWorker.forward_batch_generation (plain DECODE)",
                           seq_observed=getattr(batch, "seq_lens_cpu", None) is not None,
                           device_seq_lens_moved=self._device_seq_lens_moved(batch))
        self._with_guard_in_worker_call(step)
        return None

    def before_draft(self, draft_worker: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("with_topology") or batch.forward_mode.is_idle() or not batch.reqs:
            return None

        self._judge_draft(batch, lambda: int(draft_worker.speculative_num_steps), "EagleDraftWorker.draft")
        return None

    def before_trivial_verify_input(self, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        if batch.forward_mode.is_idle() or not batch.reqs:
            return None

        self._judge_draft(batch, lambda: 0, "EAGLEWorkerV2._build_trivial_verify_input (steps 0)")
        return None

    def _judge_draft(self, batch: Any, steps: Callable[[], int], where: str) -> None:
        """A speculative round's draft (`steps()` draft steps, read only when the guard judges) against the model."""

        def step(g: Guard) -> None:
            n = steps()
            self._take_prepared_reading(batch)
            g.draft(n, self.observe_requests_in_worker_call(batch), self.pool_in_worker_call(batch),
                    self._round_observer(batch), where=where)
        self._with_guard_in_worker_call(step)

    def before_verify(self, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        if batch.forward_mode.is_idle() or not batch.reqs:
            return None

        def step(g: Guard) -> None:
            verify_input = batch.spec_info
            graph = self.graph_for(worker.target_worker.model_runner, len(batch.reqs), verify_input)
            reqs = self.observe_requests_in_worker_call(batch)
            launched = self.observe_batch(batch, forward_mode=ForwardMode.TARGET_VERIFY, graph=graph,
                                          out_cache_loc_width=tensor_width(verify_input.draft_token), reqs=reqs)
            g.verify_launch(launched, reqs, self.pool_in_worker_call(batch),
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
            return self.observe_batch(batch, reqs=reqs), reqs, self.pool_in_worker_call(batch)

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

    def after_apply_runtime_state(self, result: Any, worker: Any, state: Any, *args: Any, **kwargs: Any) -> None:
        def step(g: Guard) -> None:
            g.note(f"adaptive controller: speculative_num_steps -> {state.speculative_num_steps}")
        self._with_guard(step)

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
