"""Actions: the real scheduler and worker steps, as transitions of `State` under a `Design`.

`enabled(state, design, scope)` lists what can happen next; `apply(state, action, design, scope)`
computes the next state. Actions only do what the real code does: they never refuse to run a step
because it would break an invariant. Catching that is the invariants' job (`statemodel.invariants`).

ACTION_CATALOGUE documents each action once; the diagrams, docs and the guard read it.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Iterator

import attrs

from statemodel.design import (
    ClearSpecOn,
    Design,
    DraftWhileOff,
    FreeFlips,
    KvReserve,
    MergeSpecInfo,
    OutCacheLocFrom,
    PlainStepGraphs,
    Scope,
    ThresholdPolicy,
    TreeDraft,
)
from statemodel.policy import Flip, decide_flip, within_spec_cap
from statemodel.state import (
    EMPTY_BATCH,
    Batch,
    ForwardMode,
    GraphShape,
    LastByIdentity,
    Request,
    SpecInfo,
    SpecInfoKind,
    SpecMode,
    Stage,
    State,
    Status,
    Thresholds,
    Unprocessed,
)


@attrs.frozen(cache_hash=True)
class Action:
    """One transition: a name from ACTION_CATALOGUE and its arguments (request id, accept counts...)."""

    name: str
    args: tuple[int, ...] = ()

    def describe(self) -> str:
        if not self.args:
            return self.name
        if self.name in ("verify", "process_result"):
            return f"{self.name}(accepts={list(self.args)})"
        if self.name == "draft":
            return f"draft(steps={self.args[0]})"
        if self.name == "prefill":
            picks = ", ".join(f"{rid}: {tokens}" for rid, tokens in zip(self.args[::2], self.args[1::2], strict=True))
            return f"prefill(tokens={{{picks}}})"
        return f"{self.name}({', '.join(map(str, self.args))})"


_SHARED_ACTIONS: dict[tuple[str, tuple[int, ...]], Action] = {}


def _action(name: str, args: tuple[int, ...] = ()) -> Action:
    """The one shared Action for (name, args): `enabled` lists a few hundred distinct ones over and over (the
    checker's hot loop), and an Action is frozen, so one object serves them all."""
    action = _SHARED_ACTIONS.get((name, args))
    if action is None:
        action = _SHARED_ACTIONS[(name, args)] = Action(name, args)
    return action


class ActionMode(enum.Enum):
    """The runtime mode an action belongs to: speculation on, off, or either."""

    ON = "on"
    OFF = "off"
    ANY = "any"

    def modes(self) -> tuple[SpecMode, ...]:
        """The runtime modes the action runs in."""
        return (SpecMode.ON, SpecMode.OFF) if self is ActionMode.ANY else (SpecMode(self.value),)

    def allows(self, mode: SpecMode) -> bool:
        return self is ActionMode.ANY or self.value == mode.value


@attrs.frozen
class ActionInfo:
    name: str
    stage_from: tuple[Stage, ...]
    stage_to: Stage
    spec_mode: ActionMode  # the runtime mode the action belongs to
    summary: str
    guard: str  # when the action is enabled, in words (diagram edge labels read it)
    overlap_only: bool = False  # exists only under Scope.overlap (the diagrams draw the scope without it)
    # stages it may also start from under Scope.overlap: an iteration SGLang runs without overlap
    # (`Scheduler.is_disable_overlap_for_batch`) processes the last result, releases included, after the
    # next step was prepared and before it launches
    overlap_stage_from: tuple[Stage, ...] = ()

    def stages(self, overlap: bool) -> tuple[Stage, ...]:
        """The stages the action starts from in a scope with or without the overlap schedule."""
        return self.stage_from + self.overlap_stage_from if overlap else self.stage_from


ACTION_CATALOGUE: tuple[ActionInfo, ...] = (
    ActionInfo("arrive", (Stage.SCHEDULE,), Stage.SCHEDULE, ActionMode.ANY,
               "a request reaches the waiting queue", "requests left to arrive"),
    ActionInfo("prefill", (Stage.SCHEDULE,), Stage.SCHEDULE, ActionMode.ANY,
               "an EXTEND batch of waiting requests (chunked: at most chunk_size tokens); the draft "
               "prefills too unless speculation is off and the draft catches up later",
               "waiting requests, room under the running cap and in KV"),
    ActionInfo("merge_batch", (Stage.SCHEDULE,), Stage.SCHEDULE, ActionMode.ANY,
               "the prefilled batch joins the running batch, spec_info rows with it", "a prefilled batch"),
    ActionInfo("finish", (Stage.SCHEDULE,), Stage.SCHEDULE, ActionMode.ANY,
               "a request that reached max_new_tokens frees its KV (held and reserved)",
               "a running request is done", overlap_stage_from=(Stage.PREPARED,)),
    ActionInfo("filter_batch", (Stage.SCHEDULE,), Stage.SCHEDULE, ActionMode.ANY,
               "finished requests leave the running batch and its spec_info", "finished requests in the batch"),
    ActionInfo("retract", (Stage.SCHEDULE,), Stage.SCHEDULE, ActionMode.ANY,
               "under KV pressure a running request frees its KV and waits; its output is kept",
               "KV too small for the next decode step"),
    ActionInfo("flip_off", (Stage.SCHEDULE,), Stage.SCHEDULE, ActionMode.ON,
               "the policy switches speculation off", "demand >= t_off; free flips: any demand"),
    ActionInfo("flip_on", (Stage.SCHEDULE,), Stage.SCHEDULE, ActionMode.OFF,
               "the policy switches speculation back on; a design that catches up by retraction first "
               "retracts every running request (it re-prefills with the draft)",
               "demand <= t_on (and running <= spec cap); free flips: running <= spec cap"),
    ActionInfo("draft_catch_up", (Stage.SCHEDULE,), Stage.SCHEDULE, ActionMode.ON,
               "one draft-extend over every token committed while speculation was off",
               "speculation on, some request's draft KV behind"),
    ActionInfo("prepare_for_decode", (Stage.SCHEDULE,), Stage.PREPARED, ActionMode.ANY,
               "plain path: one KV slot per request, out_cache_loc set; speculative path: top the "
               "draft-token reserve up, out_cache_loc left to the worker",
               "a running batch, nothing to finish, merge or flip"),
    ActionInfo("draft", (Stage.PREPARED,), Stage.DRAFTED, ActionMode.ON,
               "the worker picks its step count (adaptive: activate_step_by_batch) and drafts k tokens; "
               "k = 0 builds the trivial one-token verify input", "speculative path prepared"),
    ActionInfo("verify", (Stage.DRAFTED,), Stage.VERIFIED, ActionMode.ON,
               "TARGET_VERIFY forward; each request accepts 0..k draft tokens plus the bonus token",
               "verify input built"),
    ActionInfo("draft_extend", (Stage.VERIFIED,), Stage.SCHEDULE, ActionMode.ON,
               "DRAFT_EXTEND forward over the accepted tokens; the next draft input is built",
               "verify done"),
    ActionInfo("skip_draft_extend", (Stage.VERIFIED,), Stage.SCHEDULE, ActionMode.ON,
               "steps=0 with SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND: the draft KV is not updated",
               "steps = 0 and the design skips it"),
    ActionInfo("plain_decode", (Stage.PREPARED,), Stage.SCHEDULE, ActionMode.OFF,
               "the target runs a plain DECODE forward, one token per request, on the decode graphs",
               "speculation off"),
    ActionInfo("draft_sync", (Stage.DECODED,), Stage.SCHEDULE, ActionMode.OFF,
               "draft-extend over the one token the plain step committed", "the design syncs every step"),
    ActionInfo("process_result", (Stage.SCHEDULE,), Stage.SCHEDULE, ActionMode.ANY,
               "overlap schedule: the oldest launched step's result is processed (process_batch_result_decode); "
               "a verify's requests accept 0..k draft tokens plus the bonus token, seq_len / output / KV move "
               "then; a plain step's token is committed; requests finished or retracted since are skipped; "
               "in an iteration run without overlap, after the next step was prepared",
               "a launched step's result is unprocessed", overlap_only=True, overlap_stage_from=(Stage.PREPARED,)),
)

ACTIONS_BY_NAME: dict[str, ActionInfo] = {a.name: a for a in ACTION_CATALOGUE}


def initial_states(design: Design, scope: Scope) -> list[State]:
    """One initial state per policy parameter set (each threshold pair), all requests not arrived."""
    requests = tuple(
        Request(rid=i, prompt_len=spec.prompt_len, max_new_tokens=spec.max_new_tokens)
        for i, spec in enumerate(scope.requests)
    )
    base = State(
        requests=requests, running=EMPTY_BATCH, pending=None, launched=None, stage=Stage.SCHEDULE,
        spec_mode=SpecMode.ON, num_steps=design.largest_steps(), kv_free=scope.kv_pool_size,
        kv_pool_size=scope.kv_pool_size,
    )
    if isinstance(design.policy, ThresholdPolicy):
        return [attrs.evolve(base, thresholds=Thresholds(off, on)) for off, on in design.policy.pairs()]
    return [base]


# ----------------------------------------------------------------------------------------------
# The policy


def policy_wants_off(state: State, design: Design) -> bool:
    t = state.thresholds
    return (t is not None and state.spec_mode is SpecMode.ON
            and decide_flip(True, state.demand(), state.in_flight_count(), t.t_off, t.t_on, None) is Flip.OFF)


def policy_wants_on(state: State, design: Design, scope: Scope) -> bool:
    t = state.thresholds
    if t is None or state.spec_mode is not SpecMode.OFF:
        return False
    clamp = isinstance(design.policy, ThresholdPolicy) and design.policy.clamp_to_spec_cap
    return decide_flip(False, state.demand(), state.in_flight_count(), t.t_off, t.t_on,
                       scope.spec_cap if clamp else None) is Flip.ON


def policy_may_flip(state: State, design: Design, scope: Scope) -> tuple[str, ...]:
    """The flips a FreeFlips design may take now, each a choice (the step may also go on without it): flip_off
    whenever speculation is on, flip_on whenever it is off and (clamped) the running batch fits under the spec
    cap (statemodel.policy.within_spec_cap), at any demand. Nothing for other policies (theirs is due,
    policy_wants_off / policy_wants_on)."""
    policy = design.policy
    if not isinstance(policy, FreeFlips):
        return ()
    if state.spec_mode is SpecMode.ON:
        return (Flip.OFF.value,)
    if not policy.clamp_to_spec_cap or within_spec_cap(state.in_flight_count(), scope.spec_cap):
        return (Flip.ON.value,)
    return ()


def running_cap(state: State, scope: Scope) -> int:
    return scope.spec_cap if state.spec_mode is SpecMode.ON else scope.plain_cap


def decode_write_slots(steps: int, topk: int = 1, draft_tokens: int | None = None) -> int:
    """KV slots one speculative decode step writes per request: SGLang's get_alloc_len_per_decode,
    max(steps * topk, draft tokens) (the model: topk 1, steps + 1 draft tokens)."""
    return max(steps * topk, steps + 1 if draft_tokens is None else draft_tokens)


def reserve_slots(kv_reserve: KvReserve, current_write_slots: int, largest_write_slots: int) -> int:
    """Draft-token KV slots the speculative prepare_for_decode reserves per request, from the slots a step writes
    (`decode_write_slots`) in the state published at the top-up and in the largest state. The one reserve rule:
    the model's prepare_for_decode and `specflip lint` both read it."""
    if kv_reserve is KvReserve.CURRENT_STATE:
        return current_write_slots
    if kv_reserve is KvReserve.TWICE_LARGEST:
        return 2 * largest_write_slots
    return largest_write_slots


def reserve_per_request(state: State, design: Design) -> int:
    """Draft-token KV slots a speculative decode step reserves per request (topk 1: steps + 1)."""
    return reserve_slots(design.kv_reserve, decode_write_slots(state.num_steps),
                         decode_write_slots(design.largest_steps()))


def _spec_prepare_path(state: State, design: Design) -> bool:
    """Whether prepare_for_decode takes SGLang's speculative path. It keys on the batch's
    spec_algorithm. Designs that take the plain slot from a fresh allocation have the scheduler
    prepare a plain decode while speculation is off (on the v1 line the plugin hooks
    prepare_for_decode to do so); designs that take it from the v2 reserve keep the speculative path."""
    if not state.running.spec_algorithm_on:
        return False
    return state.spec_mode is SpecMode.ON or design.out_cache_loc_from is OutCacheLocFrom.V2_RESERVE


def decode_kv_need(state: State, design: Design) -> int:
    if _spec_prepare_path(state, design):
        want = reserve_per_request(state, design)
        return sum(max(0, want - state.req(rid).kv_reserved) for rid in state.running.rids)
    return state.running.size


def evictable(state: State) -> int:
    """Radix cache: tree tokens no request locks, which an allocation may evict (the chain's tail is its LRU
    leaf). 0 without the cache."""
    tree = state.prefix_cache
    if not tree:
        return 0
    return len(tree) - max([r.cached_len for r in state.requests])


def _evict_for(tree: tuple[bool, ...], free: int, need: int) -> tuple[tuple[bool, ...], int]:
    """evict_from_tree_cache: when `need` slots exceed the free ones, drop that many unlocked tokens from the
    tree's tail (the caller made sure they are unlocked); returns the tree and the free count after."""
    if need <= free:
        return tree, free
    cut = need - free
    return tree[:len(tree) - cut], free + cut


def _draft_stale(state: State) -> list[int]:
    return [rid for rid in state.running.rids if not state.req(rid).draft_current]


# ----------------------------------------------------------------------------------------------
# Enabled actions


def enabled(state: State, design: Design, scope: Scope) -> list[Action]:
    """Every action the real scheduler/worker could take next, in a fixed order."""
    if state.stage is Stage.SCHEDULE:
        return _enabled_schedule(state, design, scope)
    if state.stage is Stage.PREPARED:
        if state.spec_mode is SpecMode.ON:
            launch = [_action("draft", (k,)) for k in design.steps_choices(state.running.size)]
        else:
            launch = [_action("plain_decode")]
        if scope.overlap and not _spec_unoverlapped(state, design):
            # an iteration SGLang runs without overlap (is_disable_overlap_for_batch: a speculative decode batch
            # with a grammar on 0.5.16, consecutive prefills): the last step's result is processed after this
            # step was prepared, before it launches; the requests it finishes are released then and still run
            launch += _prepared_result_choices(state)
        return launch
    if state.stage is Stage.DRAFTED:
        if scope.overlap:
            return [_action("verify")]  # the launch only: the accepts are known when its result is processed
        k = state.num_steps
        sizes = [range(k + 1)] * state.launched.size  # type: ignore[union-attr]
        return [_action("verify", accepts) for accepts in itertools.product(*sizes)]
    if state.stage is Stage.VERIFIED:
        if state.num_steps == 0 and not design.zero_step_draft_extend:
            return [_action("skip_draft_extend")]
        return [_action("draft_extend")]
    if state.stage is Stage.DECODED:
        return [_action("draft_sync")]
    raise AssertionError(state.stage)


def _enabled_schedule(state: State, design: Design, scope: Scope) -> list[Action]:
    if len(state.unprocessed) > 1 or (state.unprocessed and state.unprocessed[0].is_spec
                                      and _spec_unoverlapped(state, design)):
        # overlap: the step just launched; the loop's next move is pop_and_process of the one before (or, for a
        # speculative step its design never overlaps, of that step itself)
        return _process_result_choices(state)
    out: list[Action] = []
    statuses = [r.status for r in state.requests]
    if Status.NOT_ARRIVED in statuses:  # arrivals in id order: a stated scope choice that keeps the space small
        out.append(_action("arrive", (statuses.index(Status.NOT_ARRIVED),)))  # requests[rid] is request rid
    done = _finishable(state, state.running.rids)
    requests = state.requests
    finished_in_batch = Status.FINISHED in [requests[rid].status for rid in state.running.rids]
    out.extend(_action("finish", (rid,)) for rid in done)
    if state.pending is not None:
        # process_batch_result_prefill releases a request its prefill already finished (max_new_tokens 1,
        # SGLang's health check) before the prefilled batch is filtered and merged
        out.extend(_action("finish", (rid,)) for rid in _finishable(state, state.pending.rids))
    if finished_in_batch:
        out.append(_action("filter_batch"))
    if state.pending is not None:
        out.append(_action("merge_batch"))
    elif _can_prefill(state, scope):
        out.append(_action("prefill"))
    wants_off = policy_wants_off(state, design)
    wants_on = not wants_off and policy_wants_on(state, design, scope)
    if flip_waits(state, design):
        pass  # the flip is due (prepare waits for it below) but waits for the result first
    elif wants_off:
        out.append(_action("flip_off"))
    elif wants_on:
        out.append(_action("flip_on"))
    else:
        out.extend(_action(name) for name in policy_may_flip(state, design, scope))
    flip_due = wants_off or wants_on
    catch_up_due = (
        state.spec_mode is SpecMode.ON
        and design.draft_while_off is DraftWhileOff.CATCH_UP_ON_ENABLE
        and not design.is_adaptive
        and bool(_draft_stale(state))
    )
    if catch_up_due:
        out.append(_action("draft_catch_up"))
    decode_ready = state.running.size > 0 and not done and not finished_in_batch and state.pending is None
    if decode_ready and not flip_due and not catch_up_due:
        if decode_kv_need(state, design) <= state.kv_free + (evictable(state) if state.prefix_cache else 0):
            out.append(_action("prepare_for_decode"))
        else:
            out.extend(_action("retract", (rid,)) for rid in state.running.rids)
    elif done and _done_at_prefill_may_decode(state, done, design, scope) and not finished_in_batch \
            and state.pending is None and not flip_due and not catch_up_due:
        out.append(_action("prepare_for_decode"))
    if state.unprocessed and not any(a.name in ("prepare_for_decode", "prefill") for a in out):
        # overlap: the loop processes step N's result right after it launches the next batch (forced above
        # for a decode step), or at once when there is none to launch; a prefill launch is atomic here,
        # so N may stay unprocessed across it (a superset of SGLang's order)
        out.extend(_process_result_choices(state))
    return out


def _done_at_prefill_may_decode(state: State, done: list[int], design: Design, scope: Scope) -> bool:
    """Under the overlap schedule a request its (re-)prefill finished is merged and prepared for one decode step
    before the prefill's result is processed (the model's prefill is atomic: the host learns the first token one
    iteration later, 0.5.16's event_loop_overlap); it runs that step, whose result skips it (`result_rows`), and is
    released after. The normal loop releases it first. Only when the step's KV fits: the retraction branch stays the
    normal one's (a request done at its prefill is released before any retraction is considered). Not after a flip
    since that prefill: a flip processes the results in flight first (Design.flip_waits_for_results), the prefill's
    among them, so the request is released before the next decode; a request prefilled in the current mode is
    draft-current when speculation is on."""
    if not scope.overlap or _spec_unoverlapped(state, design):
        return False
    spec_off = state.spec_mode is SpecMode.OFF
    for rid in done:
        r = state.requests[rid]
        if not _done_at_prefill_not_decoded(r) or not (spec_off or r.draft_current):
            return False
    return decode_kv_need(state, design) <= state.kv_free + (evictable(state) if state.prefix_cache else 0)


def _done_at_prefill_not_decoded(r: Request) -> bool:
    """Done by its (re-)prefill, and no decode step prepared for it since (no reserve, no plain slot grown)."""
    return r.seq_len == r.prefilled_len and r.kv_reserved == 0


def flip_waits(state: State, design: Design) -> bool:
    """No flip now: the design flips only once no launched step's result is unprocessed (Design.flip_waits_for_results;
    the guard holds a live flip to it too, shim/guard/checks.py)."""
    return design.flip_waits_for_results and bool(state.unprocessed)


def _spec_unoverlapped(state: State, design: Design) -> bool:
    """Speculation is on and the design runs speculative iterations without overlap (Design.overlap_spec_steps):
    the loop processes a speculative step's result before it prepares the next step, as the normal loop does."""
    return not design.overlap_spec_steps and state.spec_mode is SpecMode.ON


def _prepared_result_choices(state: State) -> list[Action]:
    """Overlap, at stage PREPARED: the last result's processing, then the releases it makes."""
    done = [_action("finish", (rid,)) for rid in _finishable(state, state.running.rids)]
    return done + (_process_result_choices(state) if state.unprocessed else [])


def _finishable(state: State, rids: tuple[int, ...]) -> list[int]:
    """The requests of `rids` that may `finish` now: running, with every output token committed."""
    requests = state.requests
    return [rid for rid in rids if requests[rid].status is Status.RUNNING and requests[rid].done]


def result_rows(state: State) -> tuple[int, ...]:
    """The requests the oldest unprocessed result applies to: running and not yet done on the host.
    A request finished (or done) since the step launched is skipped (batch_result_processor
    _resolve_spec_v2_tokens: `if req.finished() ... continue`); a retracted one left the result."""
    return _RESULT_ROWS(state, _result_rows)  # the guard, the step and its invariant ask in turn


def _result_rows(state: State) -> tuple[int, ...]:
    requests = state.requests
    head = state.unprocessed[0]
    kept = head.applies_to_retracted
    return tuple([rid for rid in head.rids
                  if (requests[rid].status is Status.RUNNING and not requests[rid].done) or rid in kept])


_RESULT_ROWS: LastByIdentity[State, tuple[int, ...]] = LastByIdentity()


def _process_result_choices(state: State) -> list[Action]:
    head = state.unprocessed[0]
    if head.steps is None:
        return [_action("process_result")]
    rows = set(result_rows(state))
    sizes = [range(head.steps + 1) if rid in rows else range(1) for rid in head.rids]
    return [_action("process_result", accepts) for accepts in itertools.product(*sizes)]


def result_growth(state: State, action: Action, design: Design) -> dict[int, tuple[int, int]]:
    """(seq_len growth, output tokens kept) per request that `process_result` applies to; the one rule
    `_process_result` and the `seq_lens_growth` invariant both read. A plain step grew seq_len at launch.
    The result is shared with the next call for the same objects (the step, then its invariant): do not change it."""
    last = _LAST_RESULT_GROWTH
    if last[0] is state and last[1] is action and last[2] is design:
        return last[3]
    head = state.unprocessed[0]
    rows = set(result_rows(state))
    if head.steps is None:
        growth = {rid: (0, 1) for rid in head.rids if rid in rows}
    else:
        requests = state.requests
        growth = {rid: verify_growth(requests[rid], accepted, design)
                  for rid, accepted in zip(head.rids, action.args, strict=True) if rid in rows}
    # the objects are frozen and held here, so the same three objects mean the same answer
    _LAST_RESULT_GROWTH[:] = (state, action, design, growth)
    return growth


_LAST_RESULT_GROWTH: list = [None, None, None, None]  # (state, action, design, growth) of the last result_growth


def _can_prefill(state: State, scope: Scope) -> bool:
    available = state.kv_free + (evictable(state) if state.prefix_cache else 0)
    prefilling = [r for r in state.requests if r.status is Status.PREFILLING]
    if prefilling:
        return available > 0
    waiting = [r for r in state.requests if r.status is Status.WAITING]
    return bool(waiting) and state.in_flight_count() < running_cap(state, scope) and available > 0


# ----------------------------------------------------------------------------------------------
# Next state


def apply(state: State, action: Action, design: Design, scope: Scope) -> State:
    """The state after `action`; `action` must be one `enabled` returned for `state`."""
    handler = _HANDLERS.get(action.name)
    if handler is None:
        raise ValueError(f"unknown action {action.name!r}; known: {sorted(_HANDLERS)}")
    return handler(state, action, design, scope)


def _arrive(state: State, action: Action, design: Design, scope: Scope) -> State:
    """Requests reach the waiting queue: one (the checker's arrivals, in id order) or several at once (SGLang's
    `recv_requests` takes every request waiting on its socket in one call; the guard records the requests a prefill
    shows first as one step). Several are the arrivals of each in turn: no arrival enables, disables or moves
    anything but its own request (tests/test_actions.py holds the one to the other)."""
    requests = state.requests
    changed = {rid: requests[rid].replace(status=Status.WAITING) for rid in action.args}
    return state.replace(requests=state.with_requests(changed), launched=None)


def prefill_action(picks: Iterable[tuple[int, int]]) -> Action:
    """A `prefill` of the requests the real scheduler picked: (request id, tokens its chunk extends) each,
    in batch order. The checker's `prefill` has no arguments: the model's own PrefillAdder picks."""
    return Action("prefill", tuple(x for pick in picks for x in pick))


def _prefill(state: State, action: Action, design: Design, scope: Scope) -> State:
    """An EXTEND batch: the picked requests extend by their chunk; a request whose chunk reaches its
    prefill target runs (and the draft prefills with it, unless speculation is off and the draft catches
    up later). With the radix cache on, the model's own PrefillAdder picks (the guard's model runs without the
    tree; its tree check runs beside it, shim/guard/tree_draft.py)."""
    if design.radix_cache:
        return _prefill_radix(state, design, scope)
    args = action.args
    picks = zip(args[::2], args[1::2], strict=True) if args else prefill_adder_picks(state, scope)
    changed: dict[int, Request] = {}
    completed: list[int] = []
    extended = 0
    draft_prefills = state.spec_mode is SpecMode.ON or design.draft_while_off is DraftWhileOff.SYNC_EVERY_STEP
    requests = state.requests
    for rid, tokens in picks:
        extended += tokens
        new = _extend_chunk(requests[rid], tokens, draft_prefills)
        if new.status is Status.RUNNING:
            completed.append(rid)
        changed[rid] = new
    launched, pending = _prefill_batches(state, design, changed, completed, extended, draft_prefills)
    return state.replace(requests=state.with_requests(changed), pending=pending, launched=launched,
                        kv_free=state.kv_free - extended)


def _extend_chunk(r: Request, tokens: int, draft_prefills: bool) -> Request:
    """One prefill chunk of `tokens` for request `r`; the chunk that reaches its prefill target makes it run (its
    first output token committed; the draft prefilled with it when `draft_prefills`)."""
    new = r.replace(prefilled_len=r.prefilled_len + tokens, kv_held=r.kv_held + tokens, status=Status.PREFILLING)
    if new.prefilled_len != new.prefill_target:
        return new
    return new.replace(status=Status.RUNNING, seq_len=new.prefilled_len, committed=new.committed + 1,
                       draft_kv_len=new.prefilled_len if draft_prefills else 0, draft_hidden_ready=draft_prefills)


def _prefill_batches(state: State, design: Design, changed: dict[int, Request], completed: list[int],
                     extended: int, draft_prefills: bool) -> tuple[Batch, Batch | None]:
    """The EXTEND batch a prefill launches and the prefilled batch it leaves to merge (None: nothing completed)."""
    launched = Batch(rids=tuple(changed), forward_mode=ForwardMode.EXTEND, out_cache_loc_width=extended,
                     extend_tokens=extended)
    pending = None
    if completed:
        on_batch = _batch_spec_algorithm(state, design)
        spec = SpecInfo(SpecInfoKind.DRAFT_INPUT, len(completed), 1) if draft_prefills and on_batch else SpecInfo.none()
        pending = Batch(rids=tuple(completed), forward_mode=ForwardMode.DECODE, spec_info=spec,
                        spec_algorithm_on=on_batch)
    return launched, pending


def match_len(tree: tuple[bool, ...], r: Request, draft_prefills: bool, design: Design) -> int:
    """match_prefix for a request starting a (re-)prefill: the cached part of its prompt, one token short of
    what it fills (_compute_max_prefix_len: the forward computes at least one token); with
    TreeDraft.MATCH_STOPS_AT_MISSING and the draft running on this prefill, up to the first token without draft KV."""
    limit = min(len(tree), r.prompt_len, r.prefill_target - 1)
    if design.tree_draft is TreeDraft.MATCH_STOPS_AT_MISSING and draft_prefills and False in tree[:limit]:
        return tree.index(False)
    return max(limit, 0)


def _prefill_radix(state: State, design: Design, scope: Scope) -> State:
    """_prefill with SGLang's radix cache. A request starting a (re-)prefill first matches the tree and locks
    the match (init_next_round_input); only the rest is computed, unlocked tree tokens evicted when the pool is
    short. After the forward each request's computed prompt tokens go into the tree (checkpoint_kv_cache):
    tokens the tree holds already are freed and the request's row repointed at the tree's slots (their draft KV
    with them), new ones are added, marked with whether the draft ran over them."""
    budget = scope.chunk_size
    draft_prefills = state.spec_mode is SpecMode.ON or design.draft_while_off is DraftWhileOff.SYNC_EVERY_STEP
    requests = list(state.requests)
    tree = state.prefix_cache
    free = state.kv_free
    completed: list[int] = []
    order: list[int] = []
    start: dict[int, int] = {}  # prefilled_len before this chunk
    extended = 0
    for r in _admission_order(state, scope):
        if budget == 0:
            break
        matched = match_len(tree, r, draft_prefills, design) if r.prefilled_len == 0 else 0
        locked = max([x.cached_len for x in requests] + [matched])
        tokens = min(r.prefill_target - r.prefilled_len - matched, budget, free + len(tree) - locked)
        if tokens <= 0:
            break  # no room in the pool even after evicting (PrefillAdder: NO_TOKEN)
        if matched:
            r = r.replace(prefilled_len=matched, cached_len=matched)
            requests[r.rid] = r
        tree, free = _evict_for(tree, free, tokens)
        start[r.rid] = r.prefilled_len
        free -= tokens
        budget -= tokens
        extended += tokens
        new = _extend_chunk(r, tokens, draft_prefills)
        if new.status is Status.RUNNING:
            completed.append(r.rid)
        requests[r.rid] = new
        order.append(r.rid)
    for rid in order:  # checkpoint_kv_cache, after the forward, in batch order
        r = requests[rid]
        upto = min(r.prefilled_len, r.prompt_len)  # its tokens beyond the prompt are its own branch: no one hits them
        if upto <= r.cached_len or r.cached_len < min(start[rid], r.prompt_len):
            continue  # nothing new of the prompt, or an earlier chunk was kept out: a tree path has no gaps
        if design.tree_draft is TreeDraft.NOT_INSERTED_WITHOUT_DRAFT and not draft_prefills:
            continue  # req.skip_radix_cache_insert: computed without the draft
        duplicate = max(0, min(upto, len(tree)) - r.cached_len)
        added = max(0, upto - len(tree))
        tree = tree + (draft_prefills,) * added
        free += duplicate
        requests[rid] = r.replace(kv_held=r.kv_held - duplicate - added, cached_len=upto)
    changed = {rid: requests[rid] for rid in order}
    launched, pending = _prefill_batches(state, design, changed, completed, extended, draft_prefills)
    return state.replace(requests=state.with_requests(changed), pending=pending, launched=launched,
                        kv_free=free, prefix_cache=tree)


def _admission_order(state: State, scope: Scope) -> Iterator[Request]:
    """PrefillAdder's order: a chunked request first, then waiting ones by id, a new one only while the running cap
    has room (the one admission rule of the plain and the radix prefill)."""
    room = running_cap(state, scope) - state.in_flight_count()
    for r in sorted(state.waiting(), key=lambda r: (r.status is not Status.PREFILLING, r.rid)):
        if r.status is Status.WAITING:
            if room == 0:
                continue
            room -= 1
        yield r


def prefill_adder_picks(state: State, scope: Scope) -> list[tuple[int, int]]:
    """PrefillAdder in FCFS order: a chunked request first, then waiting ones under cap and KV."""
    budget = min(scope.chunk_size, state.kv_free)
    picks: list[tuple[int, int]] = []
    for r in _admission_order(state, scope):
        if budget == 0:
            break
        tokens = min(r.prefill_target - r.prefilled_len, budget)
        budget -= tokens
        picks.append((r.rid, tokens))
    return picks


def _batch_spec_algorithm(state: State, design: Design) -> bool:
    """Whether batches carry spec_algorithm EAGLE now: always, unless the flip takes it off the batch."""
    return state.spec_mode is SpecMode.ON or design.clear_spec_on is not ClearSpecOn.BATCH_AT_FLIP


def _merge_batch(state: State, action: Action, design: Design, scope: Scope) -> State:
    pending = state.pending
    assert pending is not None
    # get_next_batch_to_run filters the prefilled batch first: requests done at their prefill never join,
    # and a batch left empty is dropped without a merge
    pending = _shrink(pending, tuple(rid for rid in pending.rids if state.req(rid).status is not Status.FINISHED
                                     and not (design.merge_drops_last_chunked
                                              and state.req(rid).prefilled_len > scope.chunk_size)))
    if not pending.rids:
        return state.replace(pending=None, launched=None)
    running = state.running
    rids = running.rids + pending.rids
    if design.merge_spec_info is MergeSpecInfo.CONCAT_UNCHECKED:
        # ScheduleBatch.merge_batch: `if self.spec_info: self.spec_info.merge_batch(other.spec_info)`
        lead = running.spec_info if running.size else pending.spec_info
        rows = sum(b.spec_info.rows for b in (running, pending) if b.spec_info.kind is lead.kind)
        spec = attrs.evolve(lead, rows=rows) if lead.kind is not SpecInfoKind.NONE else lead
    elif _batch_spec_algorithm(state, design):
        # rows for everyone; requests prefilled without the draft stay stale until a catch-up
        spec = SpecInfo(SpecInfoKind.DRAFT_INPUT, len(rids), 1)
    else:
        spec = SpecInfo.none()
    merged = Batch(rids=rids, forward_mode=ForwardMode.DECODE, spec_info=spec,
                   spec_algorithm_on=_batch_spec_algorithm(state, design))
    return state.replace(running=merged, pending=None, launched=None)


def _finish(state: State, action: Action, design: Design, scope: Scope) -> State:
    """A finished request is released: one (the checker's), or several at once (the guard checks the releases of one
    result's processing, SGLang's free group, as one step). Several are the releases of each in turn: a release moves
    nothing but its own request and the free count (tests/test_actions.py holds the one to the other)."""
    requests = state.requests
    changed: dict[int, Request] = {}
    freed = 0
    for rid in action.args:
        r = requests[rid]
        freed += r.kv_held + (r.kv_reserved if design.free_reserved_on_finish else 0)
        changed[rid] = r.replace(status=Status.FINISHED, kv_held=0, kv_reserved=0, cached_len=0)  # unlocks its prefix
    return state.replace(requests=state.with_requests(changed), kv_free=state.kv_free + freed, launched=None)


def single_steps(action: Action) -> tuple[Action, ...]:
    """The checker's steps `action` stands for, in order: an arrive or finish of several requests is each request's
    own (`_arrive` and `_finish` of several are these in turn); any other action is itself."""
    if action.name in _SEVERAL and len(action.args) > 1:
        return tuple(Action(action.name, (rid,)) for rid in action.args)
    return (action,)


def transitions_in(action: Action) -> int:
    """`len(single_steps(action))` without building them: what the guard's and `specflip explain`'s coverage counts."""
    return len(action.args) if action.name in _SEVERAL else 1


_SEVERAL = ("arrive", "finish")  # the actions the guard may take for several requests at once


def _filter_batch(state: State, action: Action, design: Design, scope: Scope) -> State:
    keep = tuple(rid for rid in state.running.rids if state.req(rid).status is not Status.FINISHED)
    return state.replace(running=_shrink(state.running, keep), launched=None)


def _shrink(batch: Batch, keep: tuple[int, ...]) -> Batch:
    spec = batch.spec_info
    if spec.kind is not SpecInfoKind.NONE:
        spec = SpecInfo(spec.kind, spec.rows - (batch.size - len(keep)), spec.tokens_per_row)
    return batch.replace(rids=keep, spec_info=spec if keep else SpecInfo.none())


def _retract(state: State, action: Action, design: Design, scope: Scope) -> State:
    return _release_to_waiting(state, (action.args[0],), keep_output=design.retract_keeps_output)


def _release_to_waiting(state: State, rids: tuple[int, ...], *, rows_kept: bool = False,
                        keep_output: bool = True) -> State:
    """ScheduleBatch.release_req without tree insertion: each request frees its KV (held and reserved), leaves
    the running (or prefilled, not yet merged) batch and waits; its output is kept and re-prefilled. `rows_kept`:
    the launched results still apply to it (Unprocessed.applies_to_retracted). `keep_output` False: the output is
    dropped and the request starts again from its prompt (Design.retract_keeps_output)."""
    changed: dict[int, Request] = {}
    freed = 0
    for rid in rids:
        r = state.req(rid)
        changed[rid] = r.replace(status=Status.WAITING, prefilled_len=0, seq_len=0, kv_held=0, kv_reserved=0,
                                 draft_kv_len=0, draft_hidden_ready=False, cached_len=0,
                                 committed=r.committed if keep_output else 0)
        freed += r.kv_held + r.kv_reserved
    running = _shrink(state.running, tuple(rid for rid in state.running.rids if rid not in changed))
    pending = state.pending
    if pending is not None and any(rid in changed for rid in pending.rids):
        keep = tuple(rid for rid in pending.rids if rid not in changed)
        pending = _shrink(pending, keep) if keep else None
    # a retracted request's rows in launched results are void (it re-prefills from its committed output), unless
    # the loop that processes them no longer skips retracted requests
    if rows_kept:
        unprocessed = tuple(attrs.evolve(u, applies_to_retracted=u.applies_to_retracted + tuple(
            x for x in u.rids if x in changed)) for u in state.unprocessed)
    else:
        unprocessed = tuple(attrs.evolve(u, rids=tuple(x for x in u.rids if x not in changed))
                            for u in state.unprocessed)
    return state.replace(requests=state.with_requests(changed), running=running, pending=pending,
                        kv_free=state.kv_free + freed, launched=None, unprocessed=unprocessed)


def _flip_off(state: State, action: Action, design: Design, scope: Scope) -> State:
    changed: dict[int, Request] = {}
    freed = 0
    if design.release_reserve_at_flip_off:
        for rid in state.running.rids:
            r = state.req(rid)
            if r.kv_reserved:
                freed += r.kv_reserved
                changed[rid] = r.replace(kv_reserved=0)
    running = state.running
    if design.clear_spec_on is ClearSpecOn.BATCH_AT_FLIP:
        running = running.replace(spec_info=SpecInfo.none(), spec_algorithm_on=False)
    pending = state.pending
    if pending is not None and design.clear_spec_on is ClearSpecOn.BATCH_AT_FLIP:
        pending = pending.replace(spec_info=SpecInfo.none(), spec_algorithm_on=False)
    return state.replace(requests=state.with_requests(changed), running=running, pending=pending,
                        spec_mode=SpecMode.OFF, kv_free=state.kv_free + freed, launched=None)


def _flip_on(state: State, action: Action, design: Design, scope: Scope) -> State:
    if design.draft_while_off is DraftWhileOff.RETRACT_ON_ENABLE:
        # the draft has nothing of the tokens committed while off: every request the running batch holds or
        # will once merged goes back to waiting, and its re-prefill with speculation on is the catch-up; one
        # already done is left to finish (SGLang released it when its result was processed)
        in_batch = state.running.rids + (state.pending.rids if state.pending is not None else ())
        # the v1 switch's loop processes the results in flight after this flip without overlap: 0.5.12 then skips
        # no retracted request (Unprocessed.applies_to_retracted)
        state = _release_to_waiting(state, tuple(
            rid for rid in in_batch if state.req(rid).status is Status.RUNNING and not state.req(rid).done),
            rows_kept=not design.overlap_spec_steps, keep_output=design.retract_keeps_output)
    if design.tree_draft is TreeDraft.EVICT_AT_FLIP_ON and False in state.prefix_cache:
        # every unlocked tree token from the first one without draft KV on (a radix subtree goes with its root)
        tree = state.prefix_cache
        cut = max(tree.index(False), len(tree) - evictable(state))
        state = state.replace(prefix_cache=tree[:cut], kv_free=state.kv_free + len(tree) - cut)
    running = state.running
    if design.clear_spec_on is ClearSpecOn.BATCH_AT_FLIP and running.size:
        running = running.replace(spec_info=SpecInfo(SpecInfoKind.DRAFT_INPUT, running.size, 1),
                               spec_algorithm_on=True)
    elif design.clear_spec_on is ClearSpecOn.BATCH_AT_FLIP:
        running = running.replace(spec_algorithm_on=True)
    pending = state.pending
    if pending is not None and design.clear_spec_on is ClearSpecOn.BATCH_AT_FLIP:
        pending = pending.replace(spec_algorithm_on=True)
    return state.replace(running=running, pending=pending, spec_mode=SpecMode.ON, launched=None)


def _draft_extend_all(state: State, rids: tuple[int, ...]) -> dict[int, Request]:
    """The draft KV of `rids` brought up to seq_len, the hidden state ready; a request already so stays the very
    same object (under overlap a draft-extend follows its verify's launch, and its result moved both lengths)."""
    requests = state.requests
    changed = {}
    for rid in rids:
        r = requests[rid]
        if r.draft_kv_len != r.seq_len or not r.draft_hidden_ready:
            changed[rid] = r.replace(draft_kv_len=r.seq_len, draft_hidden_ready=True)
    return changed


def draft_written_in_tree(before: Request, after: Request, cached_len: int) -> tuple[int, int]:
    """The radix-tree positions a draft-extend (a round's, a sync, a catch-up) wrote the draft KV of, for one request:
    `[start, end)`, empty when `end <= start`. The draft runs over the request's row from where its draft KV stopped
    (`before.draft_kv_len`) to where it now reaches (`after.draft_kv_len`), and the row's first `cached_len` positions
    are the tree's slots (matched, or repointed by a checkpoint); the draft pool shares the target's slot indices, so
    those of them in that range now hold draft KV for every request that reaches them through the tree. A request
    prefilled while speculation was off (draft KV 0) brought up to date by the catch-up at flip-on covers its whole
    tree prefix. The model's draft-extends and the guard's record of the live tree (shim/guard/tree_draft.py) both
    take this."""
    return before.draft_kv_len, min(after.draft_kv_len, cached_len)


def _with_draft_extended(state: State, changed: dict[int, Request]) -> tuple[tuple[Request, ...], tuple[bool, ...]]:
    """The requests after a draft-extend (`_draft_extend_all`'s `changed`) and the tree with the positions it wrote
    marked (`draft_written_in_tree`)."""
    tree = state.prefix_cache
    if tree and False in tree:
        requests = state.requests
        for rid, new in changed.items():
            old = requests[rid]
            start, end = draft_written_in_tree(old, new, old.cached_len)
            if end > start and False in tree[start:end]:
                tree = tree[:start] + (True,) * (end - start) + tree[end:]
    return state.with_requests(changed), tree


def _draft_batch(rids: tuple[int, ...]) -> Batch:
    return Batch(rids=rids, forward_mode=ForwardMode.DRAFT_EXTEND,
                 spec_info=SpecInfo(SpecInfoKind.DRAFT_INPUT, len(rids), 1), spec_algorithm_on=True)


def _draft_catch_up(state: State, action: Action, design: Design, scope: Scope) -> State:
    rids = state.running.rids
    running = state.running.replace(spec_info=SpecInfo(SpecInfoKind.DRAFT_INPUT, len(rids), 1),
                           spec_algorithm_on=True)
    requests, tree = _with_draft_extended(state, _draft_extend_all(state, rids))
    return state.replace(requests=requests, running=running, launched=_draft_batch(rids), prefix_cache=tree)


def _prepare_for_decode(state: State, action: Action, design: Design, scope: Scope) -> State:
    rids = state.running.rids
    requests = state.requests
    if _spec_prepare_path(state, design):
        # eagle_prepare_for_decode / alloc_for_spec_decode: top the reserve up; seq_lens and
        # out_cache_loc are the worker's business
        want = reserve_per_request(state, design)
        allocated = 0
        changed: dict[int, Request] = {}
        for rid in rids:
            r = requests[rid]
            extra = want - r.kv_reserved
            if extra > 0:  # a request whose reserve is full stays the very same object
                allocated += extra
                changed[rid] = r.replace(kv_reserved=want)
        requests = state.with_requests(changed)
        running = state.running.replace(forward_mode=ForwardMode.DECODE, out_cache_loc_width=0)
    else:
        # plain path: alloc_for_decode, one slot per request. Every running request moves: stored in place, by
        # position, as `_plain_decode` does (a third less than a keyword `replace` per request and a dict)
        allocated = len(rids)
        updated = list(requests)
        for rid in rids:
            r = requests[rid]
            updated[rid] = r.decoded(r.seq_len, r.committed, r.kv_held + 1, r.kv_reserved, r.draft_kv_len,
                                     r.draft_hidden_ready)
        if rids:  # no request moved: the very same tuple
            requests = tuple(updated)
        running = state.running.replace(forward_mode=ForwardMode.DECODE, out_cache_loc_width=len(rids))
    if allocated > state.kv_free and state.prefix_cache:  # alloc evicts unlocked tree tokens first
        tree, free = _evict_for(state.prefix_cache, state.kv_free, allocated)
        return state.replace(requests=requests, running=running, stage=Stage.PREPARED,
                            kv_free=free - allocated, launched=None, prefix_cache=tree)
    return state.replace(requests=requests, running=running, stage=Stage.PREPARED,
                        kv_free=state.kv_free - allocated, launched=None)


def _select_graph(batch: Batch, design: Design, scope: Scope, draft_tokens: int) -> GraphShape | None:
    """CudaGraphRunner: a batch with spec_algorithm set and spec_info present replays the target-verify
    graph of `draft_tokens` per request; a plain DECODE batch replays what the design gave plain
    steps (on a speculative server, only the verify graphs exist unless a decode runner was captured)."""
    bucket = scope.graph_bucket(batch.size)
    if bucket is None:
        return None
    speculative = batch.spec_algorithm_on and batch.spec_info.kind is not SpecInfoKind.NONE
    if speculative or batch.forward_mode is ForwardMode.TARGET_VERIFY:
        return GraphShape(bucket, draft_tokens)
    if design.plain_step_graphs is PlainStepGraphs.EAGER:
        return None
    if design.plain_step_graphs is PlainStepGraphs.VERIFY_RUNNER:
        return GraphShape(bucket, draft_tokens)
    return GraphShape(bucket, 1)


def _draft(state: State, action: Action, design: Design, scope: Scope) -> State:
    steps = action.args[0]
    rids = state.running.rids
    spec = SpecInfo(SpecInfoKind.VERIFY_INPUT, len(rids), steps + 1)
    verify_batch = Batch(rids=rids, forward_mode=ForwardMode.TARGET_VERIFY, spec_info=spec, spec_algorithm_on=True,
                         out_cache_loc_width=len(rids) * (steps + 1))
    verify_batch = verify_batch.replace(graph=_select_graph(verify_batch, design, scope, steps + 1))
    return state.replace(launched=verify_batch, stage=Stage.DRAFTED, num_steps=steps)


def verify_growth(r: Request, accepted: int, design: Design) -> tuple[int, int]:
    """What a verify that accepted `accepted` draft tokens (plus the bonus token) adds to request `r`:
    (seq_len growth, output tokens kept). The output stops at max_new_tokens; seq_len (and the KV behind
    it) takes the whole run where the design's worker advances past the finish, the kept part otherwise.
    The one rule `_verify` and the `seq_lens_growth` invariant both read."""
    run = accepted + 1
    left = r.max_new_tokens - r.committed
    kept = run if run < left else left  # min(), without the call: this runs twice per request per verify
    return (run if design.verify_advances_past_finish else kept), kept


def _verify(state: State, action: Action, design: Design, scope: Scope) -> State:
    launched = state.launched
    assert launched is not None
    if scope.overlap:
        # the verify is launched; the host learns its accepts only when its result is processed. The draft input's
        # hidden state it consumes is rebuilt by the draft-extend (or its skip) in the same worker call, before any
        # scheduler step (VERIFIED enables only those two): nothing can see it missing, so it is not cleared here
        return state.replace(stage=Stage.VERIFIED, launched=None,
                            unprocessed=(*state.unprocessed, Unprocessed(launched.rids, state.num_steps)))
    changed = {}
    requests = state.requests
    for rid, accepted in zip(launched.rids, action.args, strict=True):
        r = requests[rid]
        grown, kept = verify_growth(r, accepted, design)
        used = min(grown, r.kv_reserved)
        # tokens the verify wrote and kept in seq_len move from the reserve into held slots; the rest of
        # the reserve stays allocated for the next round (SGLang v2 over-allocation), freed at finish
        changed[rid] = r.replace(seq_len=r.seq_len + grown, committed=r.committed + kept, kv_held=r.kv_held + used,
                                  kv_reserved=r.kv_reserved - used, draft_hidden_ready=False)
    # the verify forward has run: nothing is in flight until draft-extend launches
    return state.replace(requests=state.with_requests(changed), stage=Stage.VERIFIED, launched=None)


def _draft_extend(state: State, action: Action, design: Design, scope: Scope) -> State:
    rids = state.running.rids
    running = state.running.replace(spec_info=SpecInfo(SpecInfoKind.DRAFT_INPUT, len(rids), 1),
                           spec_algorithm_on=True, out_cache_loc_width=0)
    unprocessed = state.unprocessed
    if scope.overlap:
        # it runs on the device over the verify's accepted tokens, which the host learns later
        unprocessed = (*unprocessed[:-1], attrs.evolve(unprocessed[-1], draft_extended=True))
    requests, tree = _with_draft_extended(state, _draft_extend_all(state, rids))
    return state.replace(requests=requests, running=running, launched=_draft_batch(rids), stage=Stage.SCHEDULE,
                         unprocessed=unprocessed, prefix_cache=tree)


def _skip_draft_extend(state: State, action: Action, design: Design, scope: Scope) -> State:
    # the draft input is rebuilt from the verify's bonus token, but the draft KV is not extended
    changed = {rid: state.req(rid).replace(draft_hidden_ready=True) for rid in state.running.rids}
    return state.replace(requests=state.with_requests(changed), launched=None, stage=Stage.SCHEDULE)


def _plain_decode(state: State, action: Action, design: Design, scope: Scope) -> State:
    rids = state.running.rids
    running = state.running
    worker = running  # the batch the target forward runs on
    # the EagleDraftInput on the ScheduleBatch held the hidden states the next draft needs
    clears_hidden = design.clear_spec_on is ClearSpecOn.SCHEDULER_BATCH
    if design.clear_spec_on is ClearSpecOn.WORKER_COPY:
        worker = running.replace(spec_info=SpecInfo.none(), spec_algorithm_on=False)
    elif clears_hidden:
        running = running.replace(spec_info=SpecInfo.none(), spec_algorithm_on=False)
        worker = running
    # out_cache_loc = req_to_token[req_pool_indices, seq_lens]: one reserved slot per request becomes held; a
    # request without one contributes no slot. Under overlap it stays reserved until the result is processed:
    # SGLang commits it there (kv_committed_len += accept_len 1), the model's process_result moves it
    from_reserve = design.out_cache_loc_from is OutCacheLocFrom.V2_RESERVE
    holds_at_launch = from_reserve and not scope.overlap
    growth = 2 if design.plain_step_advances_seq_lens_twice else 1
    # seq_lens move at launch; under overlap the token reaches the output when the result is processed
    committed = 0 if scope.overlap else 1
    have = 0
    requests = state.requests
    updated = list(requests)  # every running request moves: stored in place, not through a dict (State.with_requests)
    for rid in rids:  # each request rebuilt once, with every field the step moves
        r = requests[rid]
        held, reserved = r.kv_held, r.kv_reserved
        if from_reserve:
            if reserved:
                have += 1
                if holds_at_launch:
                    held, reserved = held + 1, reserved - 1
            elif r.status is Status.FINISHED:
                have += 1  # released after this step was prepared (overlap): its row still reads req_to_token
        updated[rid] = r.decoded(r.seq_len + growth, r.committed + committed, held, reserved, r.draft_kv_len,
                                 False if clears_hidden else r.draft_hidden_ready)
    kv_free = state.kv_free
    if from_reserve:
        worker = worker.replace(out_cache_loc_width=have)
    elif design.out_cache_loc_from is OutCacheLocFrom.TUPLE_UNPACK:
        # alloc_token_slots(..., backup_state=False) returns one tensor of len(rids) slots: unpacking
        # it into two names takes its first element (a scalar) when there are exactly 2, else fails
        kv_free -= len(rids)
        worker = worker.replace(out_cache_loc_width=1 if len(rids) == 2 else -1)
    worker = worker.replace(forward_mode=ForwardMode.DECODE)
    worker = worker.replace(graph=_select_graph(worker, design, scope, state.num_steps + 1))
    syncs = design.draft_while_off is DraftWhileOff.SYNC_EVERY_STEP
    unprocessed = (*state.unprocessed, Unprocessed(rids, None, reserve_slot=from_reserve)) if scope.overlap \
        else state.unprocessed
    return state.replace(requests=tuple(updated) if rids else requests, running=running, launched=worker,
                        kv_free=kv_free, stage=Stage.DECODED if syncs else Stage.SCHEDULE, unprocessed=unprocessed)


def _draft_sync(state: State, action: Action, design: Design, scope: Scope) -> State:
    rids = state.running.rids
    running = state.running
    if running.spec_algorithm_on or design.clear_spec_on is ClearSpecOn.WORKER_COPY:
        running = running.replace(spec_info=SpecInfo(SpecInfoKind.DRAFT_INPUT, len(rids), 1))
    requests, tree = _with_draft_extended(state, _draft_extend_all(state, rids))
    return state.replace(requests=requests, running=running, launched=_draft_batch(rids), stage=Stage.SCHEDULE,
                         prefix_cache=tree)


def _process_result(state: State, action: Action, design: Design, scope: Scope) -> State:
    head = state.unprocessed[0]
    requests, reserve_slot, extended = state.requests, head.reserve_slot, head.draft_extended
    growth = result_growth(state, action, design)
    updated = list(requests)  # as in _plain_decode: stored in place
    for rid, (grown, kept) in growth.items():
        r = requests[rid]  # requests[rid] is request rid (State.req)
        # a verify's accepted run moves from the reserve into held slots; so does a plain step's slot of the reserve
        moved = 1 if reserve_slot else grown
        used = moved if moved < r.kv_reserved else r.kv_reserved  # min(), without the call
        # the draft-extend that followed the verify on the device covered the accepted run too
        draft_kv_len = r.draft_kv_len + grown if extended else r.draft_kv_len
        updated[rid] = r.decoded(r.seq_len + grown, r.committed + kept, r.kv_held + used, r.kv_reserved - used,
                                 draft_kv_len, r.draft_hidden_ready)
    return state.replace(requests=tuple(updated) if growth else requests, unprocessed=state.unprocessed[1:],
                        launched=None)


_HANDLERS = {
    "arrive": _arrive,
    "prefill": _prefill,
    "merge_batch": _merge_batch,
    "finish": _finish,
    "filter_batch": _filter_batch,
    "retract": _retract,
    "flip_off": _flip_off,
    "flip_on": _flip_on,
    "draft_catch_up": _draft_catch_up,
    "prepare_for_decode": _prepare_for_decode,
    "draft": _draft,
    "verify": _verify,
    "draft_extend": _draft_extend,
    "skip_draft_extend": _skip_draft_extend,
    "plain_decode": _plain_decode,
    "draft_sync": _draft_sync,
    "process_result": _process_result,
}

assert set(_HANDLERS) == set(ACTIONS_BY_NAME), "every catalogued action has exactly one handler"

__all__ = [
    "ACTION_CATALOGUE",
    "ACTIONS_BY_NAME",
    "Action",
    "ActionInfo",
    "ActionMode",
    "apply",
    "decode_write_slots",
    "draft_written_in_tree",
    "enabled",
    "initial_states",
    "prefill_action",
    "prefill_adder_picks",
    "reserve_slots",
    "result_growth",
    "result_rows",
    "verify_growth",
]
