"""SGLang 0.5.23's overlap schedule (`Scheduler.event_loop_overlap`) on a CPU, over real objects, for the guard.

Not a test module. What runs for real (paths relative to ``sglang/srt/``):

- the loop's order (managers/scheduler.py ``event_loop_overlap``): get the next batch, launch it
  (``run_batch``), queue ``batch.copy()`` with its result, then process the PREVIOUS batch's result; in an
  iteration the real ``Scheduler.is_disable_overlap_for_batch`` runs without overlap (consecutive prefills with
  ``SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP``; a speculative decode batch with a grammar, on 0.5.16) the
  previous result is processed after the next batch was prepared and before it launches. 0.5.16's decision is
  its own function, compiled from its source (:func:`is_disable_overlap_for_batch_0_5_16`);
- ``get_next_batch_to_run``: the prefilled batch's real ``filter_batch`` + ``merge_batch`` (before that prefill's
  result is processed), the running batch's ``filter_batch()`` every step;
- ``update_running_batch``: the real ``Scheduler._reqs_finishing_inflight`` (0.5.23: requests whose queued result
  finishes them by length leave through ``filter_batch(reqs_to_exclude=...)``), the real ``check_decode_mem`` and
  ``retract_decode`` (retracted requests go back to the waiting queue and are prefilled again), the real
  ``prepare_for_decode``;
- ``run_batch``'s overlap branch: the real ``FutureMap(torch.device("cpu"), ...)`` (``resolve_seq_lens_cpu``,
  ``publish``), the real ``Scheduler._forward_isolation(batch, overlap=True)`` (snapshot / restore of every
  ScheduleBatch field, ``record_batch_in_overlap``), ``on_publish`` handed to the worker, the next draft input
  with ``future_indices`` put on the batch after the isolation;
- the worker: the real ``EAGLEWorkerV2.forward_batch_generation`` (draft, verify, ``on_publish(new_seq_lens)``,
  draft-extend) with the GPU forwards stood in by tests/guard_fixtures.py, or shim/switch/v2.py's real
  ``plain_decode`` for the switch's spec-off step;
- a decode result's processing: the real ``SchedulerBatchResultProcessor._normalize_decode_outputs`` (spec: the
  real ``_resolve_spec_v2_tokens``, ``kv_committed_len += accept_len``) called unbound on
  :class:`ResultProcessorCpuStandIn`, then ``process_batch_result_decode``'s per-request loop (skip finished or
  retracted requests, ``output_ids``, real ``update_finish_state``, real ``release_kv_cache``) inside a real
  allocator free group.

Stand-ins (named ``*_cpu_stand_in`` / ``*CpuStandIn``): the prefill forward
(:func:`prefill_launch_cpu_stand_in`, it publishes ``seq_lens`` as ``_forward_prefill_batch`` does), the
scheduler object (:func:`scheduler_cpu_stand_in`: only the fields the real methods above read), the result
processor (:class:`ResultProcessorCpuStandIn`), the future map's gather of the draft extras at launch
(:func:`resolve_spec_extras_cpu_stand_in`: the relay buffers hold what only the stood-in GPU forwards read), and
what tests/guard_fixtures.py stands in, and a grammar that accepts every token
(:class:`AnyTokenGrammarCpuStandIn`: no grammar backend is installed here; the guard sees nothing of the FSM, only
the order ``has_grammar`` gives the loop on 0.5.16). Chunked prefill runs when a test sets ``chunk_size`` (the
budget of every prefill): the request still being chunked is stashed at the top of ``get_next_batch_to_run``
(:meth:`OverlapDriver.stash_chunked_request`: the real ``checkpoint_kv_cache``) and left out of the merge, goes first
in the next prefill, and a middle chunk's result only counts down ``inflight_middle_chunks``.

A design whose speculation-off is SGLang's own plain scheduler path (``DraftWhileOff.RETRACT_ON_ENABLE``,
shim/switch/v2.py's draft mode "retract") flips as the switch does: the driver plays the Scheduler that the real
``shim.switch.v2.plain_path_flip`` reads and enters ``get_next_batch_to_run`` through the switch's real AROUND hook
(``_next_batch_around``), which flips first, with the switch's own policy. Its batches then take the path their
``spec_algorithm`` and the scheduler's ``model_worker`` give them, as ``run_batch``'s overlap branch does: the
real ``resolve_forward_inputs`` (a plain decode's input ids from the future map's ``output_tokens_buf``), the worker
the switch points the scheduler at, the scheduler's publish of ``seq_lens + 1`` after a plain forward and the real
``Scheduler._relay_forward_payload`` (the stash of each step's last token), with a real ``BeamCoordinator``.
There the stand-in model "samples" at the position the launched batch gives a request (its ``seq_lens``, what
the device knows; the host's ``output_ids`` lag a step under overlap) and returns a wrong token when the input
token relayed to it is not the request's last output (:func:`positions_from_launch_cpu_stand_in`), so greedy
outputs are exact only when the relay and the lengths are right.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from types import SimpleNamespace
from typing import Any

import guard_fixtures as gf
import sglang_cpu as h
import torch

from shim.switch.v2 import SwitchConfig
from shim.timing.jsonl import JsonlTrace
from statemodel.design import ClearSpecOn, Design, DraftWhileOff, OutCacheLocFrom

# the stand-in model's token at a request's host-side output position (tests/sglang_cpu.py), kept here because
# positions_from_launch_cpu_stand_in swaps it out while a launched batch runs
_TOKEN_AT_OUTPUT_LEN = h._stand_in_token


def greedy_token(req: Any, position: int) -> int:
    """The stand-in model's greedy token at output position `position` of `req`."""
    return _TOKEN_AT_OUTPUT_LEN(req, position - len(req.output_ids))


def expected_output(req: Any) -> list[int]:
    """The greedy output the stand-in model defines for `req`, as long as its output is."""
    return [greedy_token(req, p) for p in range(len(req.output_ids))]


def scheduler_cpu_stand_in() -> Any:
    """A Scheduler with no model: the fields `_forward_isolation(overlap=True)` (`record_batch_in_overlap`),
    `_reqs_finishing_inflight` and `is_disable_overlap_for_batch` read. `object.__new__`: the methods are the real
    ones."""
    from sglang.srt.managers.scheduler import Scheduler

    sched = object.__new__(Scheduler)
    sched.batch_record_ct = 0
    sched.batch_record_buf = [None, None]
    sched.result_queue = deque()
    sched.enable_skip_finishing_decode = True  # event_loop_overlap sets it
    sched.require_mlp_sync = False  # no DP attention
    return sched


def _function_0_5_16(module: str, name: str, namespace: dict[str, Any], cls: str | None = None) -> Callable[..., Any]:
    """A function (a method of `cls`) of SGLang 0.5.16's `sglang/srt/<module>`, compiled from its source (the wheel
    scripts/setup.sh unpacks to .cache/sglang-src/0.5.16, or $SPECFLIP_SGLANG_0_5_16_SRC) with `namespace` for the
    names its module imports. Raises FileNotFoundError without the source."""
    import ast
    from pathlib import Path

    from shim.settings import settings

    root = Path(settings.SGLANG_0_5_16_SRC.get() or Path(__file__).resolve().parents[1] / ".cache" / "sglang-src"
                / "0.5.16")
    path = root / "sglang" / "srt" / module
    body = ast.parse(path.read_text()).body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    func = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module(body=[func], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def is_disable_overlap_for_batch_0_5_16() -> Callable[..., bool]:
    """SGLang 0.5.16's `Scheduler.is_disable_overlap_for_batch`, compiled from its source. Unlike 0.5.23's (EAGLE's
    verify advances the grammar FSM itself), it runs a speculative decode batch that carries a grammar without
    overlap. Raises FileNotFoundError without the source."""
    from typing import Optional

    from sglang.srt.environ import envs
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    namespace: dict[str, Any] = {"envs": envs, "Optional": Optional, "ScheduleBatch": ScheduleBatch}
    return _function_0_5_16("managers/scheduler.py", "is_disable_overlap_for_batch", namespace, cls="Scheduler")


class TreeCacheUnfinished0516CpuStandIn:
    """0.5.16's tree call for a running request's computed tokens, `cache_unfinished_req(req, chunked=...)`, on a
    0.5.23 tree: the real `checkpoint_kv_cache` (insert, repoint the row, the next extend resumes after it)."""

    def __init__(self, tree_cache: Any) -> None:
        self.tree_cache = tree_cache

    def cache_unfinished_req(self, req: Any, chunked: bool = False) -> None:
        from sglang.srt.mem_cache.common import checkpoint_kv_cache

        checkpoint_kv_cache(req, self.tree_cache)


def stash_chunked_request_0_5_16(tree_cache: Any) -> Callable[[Any], None]:
    """SGLang 0.5.16's `Scheduler.stash_chunked_request(req)`: its `maybe_cache_unfinished_req(req, tree_cache,
    chunked=True)` compiled from its source, which returns at once for a request with `skip_radix_cache_insert`
    (0.5.23's `checkpoint_kv_cache` still advances the request's prefix then); otherwise the tree call of
    :class:`TreeCacheUnfinished0516CpuStandIn`. Raises FileNotFoundError without the source."""
    namespace: dict[str, Any] = {"Req": Any, "BasePrefixCache": Any}
    maybe_cache = _function_0_5_16("mem_cache/common.py", "maybe_cache_unfinished_req", namespace)
    tree = TreeCacheUnfinished0516CpuStandIn(tree_cache)
    return lambda req: maybe_cache(req, tree, chunked=True)


def any_token_grammar_cpu_stand_in() -> Any:
    """A request's grammar (`req.grammar`) that accepts every token and never terminates: the real grammar
    backends (xgrammar, llguidance, outlines) are not installed here. `ScheduleBatch` derives `has_grammar` from
    it (init_new, merge_batch, filter_batch), which is what the loop's order reads."""
    from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject

    class AnyTokenGrammarCpuStandIn(BaseGrammarObject):
        def accept_token(self, token: int) -> None:
            pass

    return AnyTokenGrammarCpuStandIn()


class ResultProcessorCpuStandIn:
    """What `SchedulerBatchResultProcessor._normalize_decode_outputs` / `_resolve_spec_v2_tokens` read from
    their `self` (the real class is a frozen dataclass of 20 scheduler parts): the model worker (its
    `on_verify_complete_cpu`), a metrics reporter that records nothing, the pools. Its methods are the real
    ones, taken from the class."""

    def __init__(self, model_worker: Any, pools: h.CpuPools) -> None:
        from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

        cls = SchedulerBatchResultProcessor
        self.model_worker = model_worker
        self.token_to_kv_pool_allocator = pools.allocator
        self.tree_cache = pools.tree_cache
        self.metrics_reporter = SimpleNamespace(snapshot_spec_decode_metrics=lambda *a, **k: None)
        self._resolve_spec_v2_tokens = partial(cls._resolve_spec_v2_tokens, self)
        self.advance_grammar_fsm = partial(cls.advance_grammar_fsm, self)
        self._accept_grammar_tokens = partial(cls._accept_grammar_tokens, self)

    def normalize(self, **kwargs: Any) -> Any:
        """The real `_normalize_decode_outputs`, looked up on the class when called (where SGLang's HookRegistry
        wrapped it)."""
        from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

        return SchedulerBatchResultProcessor._normalize_decode_outputs(self, **kwargs)


def prefill_launch_cpu_stand_in(batch: Any, on_publish: Callable[[Any], None] | None) -> Any:
    """`EAGLEWorkerV2._forward_prefill_batch` (or the target's prefill) at launch: one token per request,
    `on_publish(batch.seq_lens)`, the draft's next input. Its host bookkeeping waits for the result processing."""
    from sglang.srt.managers.utils import GenerationBatchResult

    tokens = [h._stand_in_token(req) for req in batch.reqs]
    if on_publish is not None:
        on_publish(batch.seq_lens)
    draft = h.make_eagle_draft_input(batch, bonus_tokens=tokens) if not batch.spec_algorithm.is_none() else None
    return GenerationBatchResult(next_token_ids=torch.tensor(tokens, dtype=torch.int64), next_draft_input=draft)


def resolve_spec_extras_cpu_stand_in(batch: Any) -> None:
    """`FutureMap._resolve_spec_extras` (in `resolve_forward_inputs`): between steps the draft input carries only
    `future_indices` (merge_batch / filter_batch keep them per row); at launch its tensors are gathered from the
    relay buffers at those rows. Here they are filled with the stand-in draft's values, one row per request."""
    info = batch.spec_info
    if info is None or not info.is_draft_input() or info.future_indices is None:
        return
    fresh = h.make_eagle_draft_input(batch)
    info.topk_p, info.topk_index, info.hidden_states = fresh.topk_p, fresh.topk_index, fresh.hidden_states
    info.bonus_tokens = fresh.bonus_tokens


def launch_positions(batch: Any) -> list[int]:
    """The output position each request's first token of this forward takes, from what the launched batch holds
    (the device's view): a prefill and a plain decode write up to seq_lens (prompt + output so far, the input token
    included), a verify starts from the committed length, one short of the bonus token it verifies from."""
    lens = (batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens).tolist()
    verify = not batch.spec_algorithm.is_none() and not batch.forward_mode.is_extend()
    return [int(n) - len(req.origin_input_ids) + (1 if verify else 0) for req, n in zip(batch.reqs, lens, strict=True)]


@contextlib.contextmanager
def positions_from_launch_cpu_stand_in(batch: Any, relayed: Any = None) -> Iterator[list[str]]:
    """While `batch`'s forward runs, the stand-in model's token for a request is the greedy token at the position
    the launched batch gives it (:func:`launch_positions`) plus the offset the stand-in asks for. `relayed`: the
    input token each request got from the future map (a plain decode's input_ids, a verify's bonus_tokens); a
    request whose relayed token is not its last output gets a wrong token (as a model fed the wrong token would
    give). Yields the ids of those requests."""
    vocab = h.VOCAB_SIZE
    base = dict(zip(map(id, batch.reqs), launch_positions(batch), strict=True))
    wrong: list[str] = []
    if relayed is not None:
        for req, token in zip(batch.reqs, relayed.tolist(), strict=True):
            if int(token) != greedy_token(req, base[id(req)] - 1):
                wrong.append(str(req.rid))
    shift = {id(r): 1 for r in batch.reqs if str(r.rid) in wrong}

    def token(req: Any, offset: int = 0) -> int:
        return (greedy_token(req, base[id(req)] + offset) + shift.get(id(req), 0)) % vocab

    saved, h._stand_in_token = h._stand_in_token, token
    try:
        yield wrong
    finally:
        h._stand_in_token = saved


def resolve_spec_extras_relayed_cpu_stand_in(batch: Any, future_map: Any) -> None:
    """:func:`resolve_spec_extras_cpu_stand_in` for the draft's topk and hidden state, and the bonus token from the
    real relay buffer the step before stashed it in (`FutureMap.output_tokens_buf` at `future_indices`, what
    `_resolve_spec_extras` gathers it from)."""
    resolve_spec_extras_cpu_stand_in(batch)
    info = batch.spec_info
    if info is not None and info.is_draft_input() and info.future_indices is not None:
        info.bonus_tokens = future_map.output_tokens_buf[info.future_indices].to(torch.int32)


class RecordedSwitchTrace(JsonlTrace):
    """shim/switch/v2.py's trace of switch actions, kept in memory (`events`) instead of a JSONL file."""

    def __init__(self) -> None:
        super().__init__(None)
        self.events: list[dict[str, Any]] = []

    def event(self, action: str, **info: Any) -> None:
        self.events.append({"action": action, **info})


class OverlapDriver:
    """The overlap loop over real objects, one `iteration()` per `event_loop_overlap` pass.

    `accepts`: a callable (request -> accept length, drafts + bonus) for spec steps. `bug` injects a known-bad:
    "plain_step_not_published" (the switch's spec-off step without `on_publish(seq_lens + 1)`). `launched`
    records the request ids of every launched decode batch, `released` the order requests were released in
    (with the iteration number), for the tests' own checks of the order of events."""

    def __init__(self, pools: h.CpuPools, design: Design, *, num_steps: int = 3, bug: str | None = None,
                 exclude_finishing: bool = True, cpu_seq_lens: bool = True, release: str = "0.5.23",
                 switch_config: SwitchConfig | None = None) -> None:
        """`exclude_finishing` False: 0.5.16's order, which has no `_reqs_finishing_inflight` (a request its queued
        result finishes runs one more step). `cpu_seq_lens` False: an attention backend that opts out of the CPU
        mirror (`needs_cpu_seq_lens`): `resolve_seq_lens_cpu` leaves `seq_lens_cpu` None. `release`: whose
        `is_disable_overlap_for_batch` decides which iterations run without overlap ("0.5.23" or "0.5.16").
        `switch_config`: the switch's thresholds for a design whose speculation-off is the plain scheduler path
        (draft mode "retract"; default t_off 4, t_on 1)."""
        from sglang.srt.managers.overlap_utils import FutureMap

        self.pools = pools
        self.design = design
        self.bug = bug
        # speculation off on SGLang's own plain scheduler path: the switch flips at get_next_batch_to_run
        self.plain_path = design.draft_while_off is DraftWhileOff.RETRACT_ON_ENABLE
        # there the target keeps the verify graphs a speculative server captures, which the switch swaps for its
        # decode runner while off (a plain DECODE on them would replay a verify graph's shape)
        self.worker = gf.make_workers(pools, num_steps=num_steps, verify_graphs=self.plain_path)
        self.future_map = FutureMap(torch.device("cpu"), pools.spec_algorithm, pools.req_to_token_pool,
                                    needs_cpu_seq_lens=cpu_seq_lens)
        self.sched = scheduler_cpu_stand_in()
        self.sched.enable_skip_finishing_decode = exclude_finishing
        self.processor = ResultProcessorCpuStandIn(self.worker, pools)
        self.running: Any = None
        self.last_batch: Any = None
        self.waiting: list[Any] = []
        self.spec_on = True
        self.pending_flip: str | None = None
        self.accepts: Callable[[Any], int] = lambda req: 2
        self.iteration_no = 0
        self.launched: list[tuple[int, str, tuple[str, ...]]] = []  # (iteration, mode, rids)
        self.released: list[tuple[int, str]] = []
        self.merged_without_output: list[str] = []  # requests merged before their prefill result was processed
        self.excluded: list[tuple[int, str]] = []  # 0.5.23 _reqs_finishing_inflight, per iteration
        self.retracted: list[tuple[int, str]] = []  # retract_decode, per iteration
        self.not_overlapped: list[int] = []  # iterations is_disable_overlap_for_batch ran without overlap
        self.retract_next = False  # the next update_running_batch retracts (SGLANG_TEST_RETRACT's branch)
        self.chunk_size: int | None = None  # every prefill's token budget (rem_chunk_tokens); None: no chunking
        self.chunked_req: Any = None  # Scheduler.chunked_req
        from sglang.srt.managers.scheduler import Scheduler

        decide = Scheduler.is_disable_overlap_for_batch
        if release == "0.5.16":
            decide = is_disable_overlap_for_batch_0_5_16()
        self.is_disable_overlap_for_batch = partial(decide, self.sched)
        self.decode_graphs = gf.DecodeCudaGraphRunnerCpuStandIn(captured_req_width=1)
        self.switch = self._switch_runtime(switch_config) \
            if design.out_cache_loc_from is OutCacheLocFrom.V2_RESERVE or self.plain_path else None
        self.flips: list[tuple[int, str]] = []  # (iteration, action) of the switch's flips (plain path)
        self.wrong_input: list[tuple[int, str]] = []  # (iteration, rid): a relayed input token not the last output
        self.prefilled: list[tuple[int, bool, tuple[str, ...]]] = []  # (iteration, speculative, rids), plain path
        if self.plain_path:
            self._play_scheduler(pools)

    def _switch_runtime(self, config: SwitchConfig | None = None) -> Any:
        from shim.switch.v2 import SwitchPolicy, SwitchRuntime

        if self.plain_path:
            config = config or SwitchConfig(t_off=4, t_on=1, draft_while_off="retract", plain_graphs="decode")
            if self.bug is None and config.design_name != self.design.name.removesuffix("_overlap"):
                raise ValueError(f"shim/switch/v2.py's {config.draft_while_off!r} mode implements "
                                 f"{config.design_name}, not {self.design.name}")
            trace: JsonlTrace = RecordedSwitchTrace()
        else:
            mode = "sync" if self.design.draft_while_off is DraftWhileOff.SYNC_EVERY_STEP else "none"
            config = SwitchConfig(t_off=4, t_on=1, draft_while_off=mode, plain_graphs="decode")
            trace = JsonlTrace(None)
        return SwitchRuntime(config=config, policy=SwitchPolicy(config), trace=trace,
                             plain_runner=self.decode_graphs, plain_attn_backend=None)

    # --- the Scheduler shim/switch_v2.plain_path_flip reads (draft mode "retract") ---------------------------

    def _play_scheduler(self, pools: h.CpuPools) -> None:
        """The Scheduler fields plain_path_flip and run_batch's overlap branch read: the switch swaps
        `spec_algorithm` (what new prefill batches carry) and `model_worker` (EAGLEWorkerV2 or the target's
        TpModelWorker, `tp_worker`) between the two sides, and the future map's and the target runner's fields."""
        from sglang.srt.beam_search.coordinator import BeamCoordinator
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        self.enable_overlap = True
        self.hisparse_coordinator = None
        self.spec_algorithm = pools.spec_algorithm
        self.model_worker = self.worker
        self.tp_worker = self.worker.target_worker
        self.server_args = pools.server_args
        self.beam_coordinator = BeamCoordinator(
            model_config=pools.model_config, spec_algorithm=pools.spec_algorithm, dllm_enabled=False,
            max_req_len=pools.model_config.context_len, req_to_token_pool=pools.req_to_token_pool,
            token_to_kv_pool_allocator=pools.allocator, tree_cache=pools.tree_cache, future_map=self.future_map)
        self.running = ScheduleBatch(reqs=[], batch_is_full=False)  # Scheduler.__init__'s empty running batch

    @property
    def result_queue(self) -> Any:
        return self.sched.result_queue

    @property
    def waiting_queue(self) -> list[Any]:
        return self.waiting

    @property
    def req_to_token_pool(self) -> Any:
        return self.pools.req_to_token_pool

    @property
    def token_to_kv_pool_allocator(self) -> Any:
        return self.pools.allocator

    @property
    def tree_cache(self) -> Any:
        return self.pools.tree_cache

    def _add_request_to_queue(self, req: Any, is_retracted: bool = False) -> None:
        self.waiting.append(req)  # the waiting queue's end, as Scheduler._add_request_to_queue appends

    def process_batch_result(self, batch: Any, result: Any) -> None:
        """`Scheduler.process_batch_result` of a launched step's queued copy and result."""
        if batch.forward_mode.is_extend():
            self.process_prefill_result(batch, result)
        else:
            self.process_decode_result(batch, result)

    def _next_batch_through_switch(self) -> Any:
        """get_next_batch_to_run as shim/switch/v2.py hooks it (AROUND, draft mode "retract"): the real
        `_next_batch_around` with this driver's switch runtime installed for the call, which runs the real
        plain_path_flip on the running batch and last batch before anything of the iteration is planned."""
        from shim.switch import v2 as switch_v2

        flips = self.switch.flips
        saved, switch_v2._RUNTIME = switch_v2._RUNTIME, self.switch
        try:
            plan = switch_v2._next_batch_around(OverlapDriver._plan_next_batch, self, running_batch=self.running,
                                                 last_batch=self.last_batch)
        finally:
            switch_v2._RUNTIME = saved
        if self.switch.flips != flips:
            self.flips.append((self.iteration_no, "flip_on" if self.switch.policy.spec_on else "flip_off"))
        self.spec_on = self.switch.policy.spec_on
        return plan

    # --- the loop -------------------------------------------------------------------------------------

    def add(self, reqs: Sequence[Any]) -> None:
        """Requests reach the waiting queue (the next iteration prefills them)."""
        self.waiting.extend(reqs)

    def iteration(self, *, flip: str | None = None) -> Any:
        """One `event_loop_overlap` pass. `flip` ("off"/"on"): the switch's decision, taken at the next
        update_running_batch (an iteration that runs a prefill, or nothing, has none)."""
        self.iteration_no += 1
        if flip is not None:
            self.pending_flip = flip
        batch = self.get_next_batch_to_run()
        not_overlapped = self.is_disable_overlap_for_batch(batch, last_batch=self.last_batch)
        if not_overlapped:
            self.not_overlapped.append(self.iteration_no)
            self.pop_and_process()  # the last batch's result, before this batch launches
        if batch is not None:
            result = self.run_batch(batch)
            self.sched.result_queue.append((batch.copy(), result))
        if self.last_batch is not None and not not_overlapped:
            self.pop_and_process()
        self.last_batch = batch
        return batch

    def idle(self) -> bool:
        return (self.running is None or self.running.is_empty()) and not self.waiting \
            and not self.sched.result_queue and self.pending_flip is None and self.chunked_req is None

    def run_until_idle(self, max_iterations: int = 200) -> None:
        for _ in range(max_iterations):
            if self.idle():
                return
            self.iteration()
        raise AssertionError("the loop did not drain")

    def get_next_batch_to_run(self) -> Any:
        """The batch to launch, as the event loop takes it from SGLang's NextBatchPlan (and its running batch)."""
        if self.plain_path:
            plan = self._next_batch_through_switch()
        else:
            plan = self._plan_next_batch(running_batch=self.running, last_batch=self.last_batch)
        self.running = plan.running_batch
        return plan.batch_to_run

    def _plan_next_batch(self, running_batch: Any, last_batch: Any) -> Any:
        """`Scheduler.get_next_batch_to_run(running_batch, last_batch)`, returning SGLang's own NextBatchPlan as the
        real one does (0.5.16, 0.5.23): `running_batch` is the driver's running batch (kept in `self.running`),
        `last_batch` the prefilled batch to merge, if any."""
        from sglang.srt.managers.schedule_batch import NextBatchPlan

        batch = self._plan_batch(running_batch, last_batch)
        return NextBatchPlan(batch_to_run=batch, running_batch=self.running)

    def _plan_batch(self, running_batch: Any, last_batch: Any) -> Any:
        """The body of `_plan_next_batch`: the batch to run."""
        assert running_batch is self.running
        chunked = self.chunked_req
        if chunked is not None and chunked.extend_end > chunked.prefix_len:
            self.stash_chunked_request(chunked)
        last = last_batch
        if last is not None and last.forward_mode.is_extend():
            last.filter_batch(reqs_to_exclude=[chunked] if chunked is not None else None)
            if not last.is_empty() and last is not self.running:
                self.merged_without_output += [str(r.rid) for r in last.reqs if not r.output_ids]
                if self.running is None or self.running.is_empty():
                    self.running = last
                else:
                    self.running.merge_batch(last)
        if self.running is not None:
            self.running.filter_batch()  # every step (0.5.23): results processed since may have finished some
        if self.waiting or chunked is not None:
            batch, self.chunked_req = h.schedule_prefill(self.pools, self.waiting, chunked_req=chunked,
                                                         chunk_size=self.chunk_size,
                                                         spec_algorithm=self._batch_algorithm())
            return batch
        if self.running is None or self.running.is_empty():
            if self.pending_flip is not None:  # the switch flips an idle server where admission is sized
                on, self.pending_flip = self.pending_flip == "on", None
                if on != self.spec_on:
                    self._flip(on, None)
            return None
        return self.update_running_batch(self.running)

    def update_running_batch(self, batch: Any) -> Any:
        from sglang.srt.managers.scheduler import Scheduler

        if self.pending_flip is not None:
            on, self.pending_flip = self.pending_flip == "on", None
            if on != self.spec_on:
                self._flip(on, batch)
        finishing = Scheduler._reqs_finishing_inflight(self.sched, batch)
        self.excluded += [(self.iteration_no, str(r.rid)) for r in finishing]
        batch.filter_batch(reqs_to_exclude=finishing)
        if batch.is_empty():
            return None
        kv_full = not batch.check_decode_mem()
        if kv_full and finishing:
            return None  # the queued result frees the finishing requests' KV: decode the rest next step
        if kv_full or self.retract_next:
            self.retract_next = False
            with h.patch_assign_req_to_token_pool():
                retracted, _, aborted = batch.retract_decode()
            assert not aborted
            self.retracted += [(self.iteration_no, str(r.rid)) for r in retracted]
            self.waiting.extend(retracted)  # _add_request_to_queue(req, is_retracted=True)
            if batch.is_empty():
                return None
        with h.patch_assign_req_to_token_pool():
            batch.prepare_for_decode()
        return batch

    def run_batch(self, batch: Any) -> Any:
        """`Scheduler.run_batch`'s overlap branch."""
        from sglang.srt.managers.scheduler import Scheduler

        if self.plain_path:
            return self._run_batch_plain_path(batch)
        fm = self.future_map
        fm.resolve_seq_lens_cpu(batch)
        spec = not batch.spec_algorithm.is_none()
        extend = batch.forward_mode.is_extend()
        if spec and not extend:
            resolve_spec_extras_cpu_stand_in(batch)
        if not extend:
            mode = "spec" if spec and self.spec_on else "plain"
            self.launched.append((self.iteration_no, mode, tuple(str(r.rid) for r in batch.reqs)))
        with Scheduler._forward_isolation(self.sched, batch, overlap=True):
            future_indices = batch.req_pool_indices
            on_publish = partial(fm.publish, future_indices) if spec else None
            if extend:
                result = prefill_launch_cpu_stand_in(batch, on_publish)
            elif spec and self.spec_on:
                self.worker.accept_lens_cpu_stand_in = [self.accepts(r) for r in batch.reqs]
                result = self.worker.forward_batch_generation(batch, on_publish=on_publish)
            elif spec:
                result = self._switch_plain_step(batch, on_publish)
            else:
                result = self.worker.target_worker.forward_batch_generation(batch)
            if not spec:
                fm.publish(future_indices, batch.seq_lens + 1)
        batch.input_ids = None  # next-iteration input ids come through the future map
        if spec:
            batch.spec_info = result.next_draft_input
            batch.spec_info.future_indices = future_indices
        return result

    def _run_batch_plain_path(self, batch: Any) -> Any:
        """`Scheduler.run_batch`'s overlap branch as the switch's draft mode "retract" runs it: the batch's
        spec_algorithm and the scheduler's `model_worker` (both the switch's) pick the path, the input ids of a plain
        decode come from the future map (real `resolve_forward_inputs`), every step's last token is stashed there
        (real `_relay_forward_payload`)."""
        from sglang.srt.managers.overlap_utils import resolve_forward_inputs
        from sglang.srt.managers.scheduler import Scheduler

        fm = self.future_map
        fm.resolve_seq_lens_cpu(batch)
        resolve_forward_inputs(batch, fm)
        spec = not batch.spec_algorithm.is_none()
        extend = batch.forward_mode.is_extend()
        relayed = None
        if extend:
            self.prefilled.append((self.iteration_no, spec, tuple(str(r.rid) for r in batch.reqs)))
        else:
            if spec:
                resolve_spec_extras_relayed_cpu_stand_in(batch, fm)
                relayed = batch.spec_info.bonus_tokens
            else:  # a plain decode launched without its input ids is fed the wrong token
                relayed = batch.input_ids if batch.input_ids is not None else torch.full((len(batch.reqs),), -1)
            self.launched.append((self.iteration_no, "spec" if spec else "plain",
                                  tuple(str(r.rid) for r in batch.reqs)))
        with Scheduler._forward_isolation(self.sched, batch, overlap=True), \
                positions_from_launch_cpu_stand_in(batch, relayed) as wrong:
            self.wrong_input += [(self.iteration_no, rid) for rid in wrong]
            future_indices = batch.req_pool_indices
            on_publish = partial(fm.publish, future_indices) if spec else None
            if extend:
                result = prefill_launch_cpu_stand_in(batch, on_publish)
            elif spec:
                self.worker.accept_lens_cpu_stand_in = [self.accepts(r) for r in batch.reqs]
                result = self.model_worker.forward_batch_generation(batch, on_publish=on_publish)
            else:
                result = self.model_worker.forward_batch_generation(batch)
            if not spec:
                fm.publish(future_indices, batch.seq_lens + 1)
            Scheduler._relay_forward_payload(self, batch, future_indices, result)
        batch.input_ids = None  # next-iteration input ids come through the future map
        if spec:
            batch.spec_info = result.next_draft_input
            batch.spec_info.future_indices = future_indices
        return result

    def _switch_plain_step(self, batch: Any, on_publish: Any) -> Any:
        """shim/switch/v2.py's spec-off step, as its `_forward_around` hands it the scheduler's on_publish."""
        from shim.switch.v2 import plain_decode

        if self.bug == "plain_step_not_published":
            on_publish = None
        return plain_decode(self.worker, batch, on_publish, self.switch)

    def stash_chunked_request(self, req: Any) -> None:
        """`Scheduler.stash_chunked_request`: the real `checkpoint_kv_cache` (the chunk goes into the tree unless the
        request is barred from it; either way the next chunk resumes after this one)."""
        from sglang.srt.mem_cache.common import checkpoint_kv_cache

        checkpoint_kv_cache(req, self.pools.tree_cache)

    def pop_and_process(self) -> None:
        copy, result = self.sched.result_queue.popleft()
        self.process_batch_result(copy, result)

    def process_prefill_result(self, batch: Any, result: Any) -> None:
        """`process_batch_result_prefill`: the first token, the finish of a request done at once (released), the
        prompt of the others into the tree; inside a free group."""
        from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

        tokens = result.next_token_ids.tolist()
        allocator = self.pools.allocator
        allocator.free_group_begin()
        for req, token in zip(batch.reqs, tokens, strict=True):
            if req.finished() or req.is_retracted:
                continue
            if req.inflight_middle_chunks > 0:
                req.inflight_middle_chunks -= 1  # a middle chunk: no token (the stash cached it, if anything)
                continue
            req.output_ids.append(token)
            req.update_finish_state()
            if req.finished():
                self.released.append((self.iteration_no, str(req.rid)))
                release_kv_cache(req, self.pools.tree_cache, checkpoint=True)
            else:
                checkpoint_kv_cache(req, self.pools.tree_cache)
        allocator.free_group_end()

    def process_decode_result(self, batch: Any, result: Any) -> None:
        """`process_batch_result_decode`: the real `_normalize_decode_outputs` (spec: `_resolve_spec_v2_tokens`),
        then per request, inside one free group, as there."""
        from sglang.srt.mem_cache.common import release_kv_cache

        tokens, _ = self.processor.normalize(batch=batch, result=result, logits_output=result.logits_output,
                                             next_token_ids=result.next_token_ids)
        allocator = self.pools.allocator
        allocator.free_group_begin()
        for i, req in enumerate(batch.reqs):
            if req.finished() or req.is_retracted:
                continue  # finished by the step before (the overlap loop ran it once more)
            req.output_ids.extend(tokens[i])
            req.update_finish_state(len(tokens[i]))
            if req.finished():
                self.released.append((self.iteration_no, str(req.rid)))
                release_kv_cache(req, self.pools.tree_cache, checkpoint=True)
        allocator.free_group_end()

    # --- flips (the switch's decision, taken in update_running_batch while the last step is in flight) --------

    def _batch_algorithm(self) -> Any:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        if self.plain_path:
            return self.spec_algorithm  # ScheduleBatch.init_new(..., spec_algorithm=self.spec_algorithm)
        carries = self.spec_on or self.design.clear_spec_on is not ClearSpecOn.BATCH_AT_FLIP
        return self.pools.spec_algorithm if carries else SpeculativeAlgorithm.NONE

    def _flip(self, on: bool, batch: Any) -> None:
        import shim.guard.api

        if self.design.clear_spec_on is not ClearSpecOn.WORKER_COPY or self.switch is None:
            raise NotImplementedError("the overlap driver flips the way shim/switch/v2.py does (V2 reserve)")
        self.spec_on = on
        self.switch.policy.spec_on = on
        shim.guard.api.notify_flip(on, batch)


@contextlib.contextmanager
def reserve_once_cpu_stand_in() -> Iterator[None]:
    """The known-bad of a reserve of steps + 1: `eagle_prepare_for_decode` takes `get_alloc_len_per_decode()`
    instead of SGLang's `get_alloc_reserve_per_decode()` (2x, the double buffer for the committed lag)."""
    from sglang.srt.mem_cache import allocation_sizing
    from sglang.srt.speculative import eagle_utils

    saved = eagle_utils.get_alloc_reserve_per_decode
    eagle_utils.get_alloc_reserve_per_decode = allocation_sizing.get_alloc_len_per_decode
    try:
        yield
    finally:
        eagle_utils.get_alloc_reserve_per_decode = saved


def overlap_pools(model_dir: Any, *, num_steps: int = 3, kv_size: int = 1024, radix_cache: bool = False) -> h.CpuPools:
    """EAGLE pools whose published server args say the overlap loop runs (ServerArgs turns it off on a CPU;
    a GPU server keeps it: it is spec v2's default)."""
    sa = h.make_server_args(model_dir, speculative_algorithm="EAGLE", num_steps=num_steps, topk=1,
                            num_draft_tokens=num_steps + 1, max_running_requests=16)
    return h.build_pools(sa, kv_size=kv_size, max_reqs=32, radix_cache=radix_cache, overlap_schedule=True)
