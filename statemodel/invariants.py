"""Named invariants: the one definition the checker, the runtime guard, the diagrams and the docs read.

Two shapes: a state invariant looks at one state; a step invariant looks at one transition
(before, action, after). Each returns the violations it finds, with expected vs actual in numbers.
Names are stable: they appear in `SpecFlipViolation` messages, proof reports, traces and docs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Sequence

import attrs

from statemodel.actions import Action, result_growth, result_rows, verify_growth
from statemodel.design import Design, Scope
from statemodel.state import (
    Batch,
    FoldByIdentity,
    ForwardMode,
    Request,
    SpecInfoKind,
    SpecMode,
    State,
    Status,
    changed_indices,
)


@attrs.frozen
class Violation:
    invariant: str
    message: str
    rids: tuple[int, ...] = ()
    expected: str = ""
    actual: str = ""

    def describe(self) -> str:
        who = f" (requests {list(self.rids)})" if self.rids else ""
        return f"{self.invariant}: {self.message}{who}"


@attrs.frozen
class Invariant:
    name: str
    summary: str
    check: Callable[..., list[Violation]]
    on_step: bool  # True: check(before, action, after, scope, design); False: check(state, scope)


# spec_info kinds a launched forward may carry, per forward mode.
ALLOWED_SPEC_INFO: dict[ForwardMode, frozenset[SpecInfoKind]] = {
    ForwardMode.IDLE: frozenset({SpecInfoKind.NONE}),
    ForwardMode.EXTEND: frozenset({SpecInfoKind.NONE}),
    ForwardMode.MIXED: frozenset({SpecInfoKind.NONE}),
    ForwardMode.DECODE: frozenset({SpecInfoKind.NONE}),  # a plain target decode
    ForwardMode.TARGET_VERIFY: frozenset({SpecInfoKind.VERIFY_INPUT}),
    ForwardMode.DRAFT_EXTEND: frozenset({SpecInfoKind.DRAFT_INPUT}),
}


def _launched(state: State) -> Batch | None:
    return state.launched


def spec_info_matches_mode(state: State, scope: Scope) -> list[Violation]:
    """The forward just launched carries the spec_info its forward_mode reads, and no other."""
    batch = _launched(state)
    if batch is None:
        return []
    allowed = ALLOWED_SPEC_INFO[batch.forward_mode]
    problems: list[Violation] = []
    if batch.spec_info.kind not in allowed:
        want = " or ".join(sorted(k.value for k in allowed))
        problems.append(Violation(
            "spec_info_matches_mode",
            f"a {batch.forward_mode.value} forward of {batch.size} requests carries spec_info "
            f"{batch.spec_info.describe()}; it must carry {want}",
            batch.rids, expected=want, actual=batch.spec_info.kind.value,
        ))
    if batch.forward_mode is ForwardMode.DECODE and batch.spec_algorithm_on:
        problems.append(Violation(
            "spec_info_matches_mode",
            f"a plain DECODE forward of {batch.size} requests still has spec_algorithm set",
            batch.rids, expected="spec_algorithm NONE", actual="spec_algorithm EAGLE",
        ))
    return problems


def spec_info_matches_batch(state: State, scope: Scope) -> list[Violation]:
    """spec_info has one row per request of the batch it is attached to (merge/filter keep it so)."""
    problems = []
    for label, batch in (("running batch", state.running), ("launched batch", state.launched)):
        if batch is None or batch.spec_info.kind is SpecInfoKind.NONE:
            continue
        if batch.spec_info.rows != batch.size:
            problems.append(Violation(
                "spec_info_matches_batch",
                f"the {label} holds {batch.size} requests but its spec_info has {batch.spec_info.rows} rows",
                batch.rids, expected=str(batch.size), actual=str(batch.spec_info.rows),
            ))
    return problems


_PLACED_STATUSES = frozenset({Status.RUNNING, Status.FINISHED})  # a request in a batch runs, or finished there


def requests_in_one_place(state: State, scope: Scope) -> list[Violation]:
    """Every running request not yet done is in exactly one of the running batch and the prefilled batch, once; no
    waiting, prefilling or not-arrived request is in either (they are the waiting queue's). Exempt: a running
    request whose queued result finishes it (under overlap 0.5.23 leaves it out of the next step,
    `_reqs_finishing_inflight`: its output is one token short of max_new_tokens and an unprocessed step names it).
    A live request dropped from a batch keeps its KV, so `kv_conservation` holds: it is never decoded again."""
    running = state.running.rids
    pending = state.pending.rids if state.pending is not None else ()
    requests = state.requests
    last = _LAST_PLACED
    if last[3] and requests is last[0] and running is last[1] and pending is last[2]:
        return []  # the very objects found clean last (the guard's looks at one step ask in turn)
    statuses = list(map(_STATUS, requests))  # map, list.count: the loops in C
    placed = running + pending if pending else running
    held = list(map(statuses.__getitem__, placed))
    distinct = _LAST_DISTINCT
    if running is not distinct[0] or pending is not distinct[1]:  # the batches keep their rids across most steps
        distinct[:] = (running, pending, len(set(placed)) == len(placed))
    in_batch_running = held.count(Status.RUNNING)
    if (distinct[2] and in_batch_running == statuses.count(Status.RUNNING)
            and in_batch_running + held.count(Status.FINISHED) == len(placed)):
        last[:] = (requests, running, pending, True)  # held, so that their ids are not reused while remembered
        return []  # the common case: each running request held once, nothing else held
    return _misplaced(state, running, pending)


_STATUS = operator.itemgetter(Request._fields.index("status"))  # Request.status, as map's C call
_LAST_PLACED: list = [None, None, None, False]  # (requests, running rids, pending rids, clean) of the last check
_LAST_DISTINCT: list = [None, None, False]  # (running rids, pending rids, no rid twice) of the last check


def _misplaced(state: State, running: tuple[int, ...], pending: tuple[int, ...]) -> list[Violation]:
    requests = state.requests
    problems: list[Violation] = []
    seen: dict[int, str] = {}
    for label, rids in (("running batch", running), ("prefilled batch", pending)):
        for rid in rids:
            r = requests[rid]
            if rid in seen:
                where = "twice in the " + label if seen[rid] == label else f"in the {seen[rid]} and the {label}"
                problems.append(Violation(
                    "requests_in_one_place", f"request {rid} is {where}", (rid,), expected="in one batch once",
                    actual=where,
                ))
            seen.setdefault(rid, label)
            if r.status not in _PLACED_STATUSES:
                problems.append(Violation(
                    "requests_in_one_place", f"request {rid} is {r.status.value} but in the {label}",
                    (rid,), expected=f"{r.status.value}: in no batch", actual=f"in the {label}",
                ))
    queued = {rid for u in state.unprocessed for rid in u.rids}
    for r in requests:
        if (r.status is Status.RUNNING and r.rid not in seen and not r.done
                and not (r.committed + 1 >= r.max_new_tokens and r.rid in queued)):
            problems.append(Violation(
                "requests_in_one_place",
                f"request {r.rid} is running ({r.committed} of {r.max_new_tokens} output tokens, {r.kv_held} KV "
                "slots held) but in neither the running batch nor the prefilled batch: it is never decoded again",
                (r.rid,), expected="in the running or the prefilled batch", actual="in no batch",
            ))
    return problems


def shapes_agree(state: State, scope: Scope) -> list[Violation]:
    """out_cache_loc width == tokens the forward writes == the replayed CUDA graph's shape."""
    batch = _launched(state)
    if batch is None or batch.forward_mode is ForwardMode.DRAFT_EXTEND:
        return []  # draft-extend writes the draft model's own pool
    problems = []
    written = batch.tokens_written()
    if batch.out_cache_loc_width != written:
        per_req = batch.tokens_written_per_req()
        how = f"{batch.size} requests x {per_req}" if per_req else f"{batch.size} requests"
        problems.append(Violation(
            "shapes_agree",
            f"out_cache_loc holds {batch.out_cache_loc_width} slots; a {batch.forward_mode.value} step of "
            f"{how} writes {written}",
            batch.rids, expected=str(written), actual=str(batch.out_cache_loc_width),
        ))
    graph = batch.graph
    if graph is not None:
        per_req = batch.tokens_written_per_req()
        if graph.tokens_per_req != per_req or graph.batch_bucket < batch.size:
            problems.append(Violation(
                "shapes_agree",
                f"the replayed CUDA graph is {graph.batch_bucket} requests x {graph.tokens_per_req} tokens "
                f"= {graph.batch_bucket * graph.tokens_per_req} rows; the {batch.forward_mode.value} step "
                f"feeds {batch.size} requests x {per_req} tokens = {batch.size * per_req}",
                batch.rids, expected=f"{batch.size}x{per_req}", actual=graph.describe(),
            ))
    return problems


_HOLD_NO_KV = (Status.FINISHED, Status.NOT_ARRIVED, Status.WAITING)
_HOLDS_NO_KV = frozenset(_HOLD_NO_KV)  # Status hashes by identity: a set test is one lookup


def kv_conservation(state: State, scope: Scope) -> list[Violation]:
    """free + held + reserved == pool size, nothing negative: no leak, no double free."""
    accounted = state.kv_accounted()
    problems = []
    if accounted != state.kv_pool_size or state.kv_free < 0:
        held = sum(r.kv_held for r in state.requests)
        reserved = sum(r.kv_reserved for r in state.requests)
        if accounted == state.kv_pool_size:  # balanced with a negative free count: more handed out than the pool had
            what = f"{-state.kv_free} slots handed out beyond the pool"
        else:
            what = f"{abs(state.kv_pool_size - accounted)} slots " \
                   f"{'leaked' if accounted < state.kv_pool_size else 'freed twice'}"
        problems.append(Violation(
            "kv_conservation",
            f"KV pool of {state.kv_pool_size} slots: free {state.kv_free} + held {held} + reserved {reserved} "
            f"= {accounted}; {what}",
            expected=str(state.kv_pool_size), actual=str(accounted),
        ))
    for r in _HOLDING_NO_KV(state.requests, _holding_no_kv, _move_holding_no_kv, operator.add):
        problems.append(Violation(
            "kv_conservation",
            f"request {r.rid} is {r.status.value} but still holds {r.kv_held} + {r.kv_reserved} reserved slots",
            (r.rid,), expected="0", actual=str(r.kv_held + r.kv_reserved),
        ))
    if state.prefix_cache:  # radix cache: only a request holding KV locks tree tokens, and only cached ones
        problems.extend(Violation(
            "kv_conservation",
            f"request {r.rid} is {r.status.value} and locks {r.cached_len} tree tokens of {len(state.prefix_cache)}",
            (r.rid,), expected="0" if r.status in _HOLD_NO_KV else f"<= {len(state.prefix_cache)}",
            actual=str(r.cached_len),
        ) for r in state.requests if r.cached_len and (
            r.status in _HOLD_NO_KV or r.cached_len > len(state.prefix_cache)))
    return problems


def _holding_no_kv(requests: tuple[Request, ...]) -> list[Request]:
    """The requests holding KV in a status that holds none (most hold KV and run: the status test rules them out)."""
    return [r for r in requests if r.status in _HOLDS_NO_KV and (r.kv_held or r.kv_reserved)]


def _move_holding_no_kv(value: list[Request], old: Request, new: Request) -> list[Request]:
    """`_holding_no_kv` after request `old` became `new`: in request order (requests[rid] is request rid)."""
    moved = [r for r in value if r.rid != old.rid]
    if new.status in _HOLDS_NO_KV and (new.kv_held or new.kv_reserved):
        moved.append(new)
        moved.sort(key=_rid)
    return moved


def _rid(r: Request) -> int:
    return r.rid


_HOLDING_NO_KV: FoldByIdentity[list[Request]] = FoldByIdentity()  # kv_conservation
# (requests, most, the rids tuples, whether a running one of them has fewer than `most` reserved): the common case
# of kv_reserve_covers_writes
_LAST_RESERVE_SHORT: list = [None, 0, [], False]


def kv_reserve_covers_writes(state: State, scope: Scope) -> list[Violation]:
    """A verify forward writes only into slots reserved for it: draft tokens <= reserved per request.
    Under overlap the slots of every launched verify whose result is unprocessed stay reserved too, at
    its worst case (every draft token accepted), and so does the slot of the v2 reserve an unprocessed plain step
    wrote (`Unprocessed.reserve_slot`), for each request still running (one released after its step was prepared
    writes into freed slots before any later owner does, in stream order)."""
    batch = _launched(state)
    verifying = batch is not None and batch.forward_mode is ForwardMode.TARGET_VERIFY
    if not verifying and not state.unprocessed:
        return []
    requests = state.requests
    writing = [u for u in state.unprocessed if u.reserved_writes]
    per_req = batch.spec_info.tokens_per_row if verifying else 0  # type: ignore[union-attr]
    # the common case first: every request's reserve covers the most any one request may need (the sum of all)
    most = per_req + sum([u.reserved_writes for u in writing])
    groups = [u.rids for u in writing] + [batch.rids if verifying else ()]  # type: ignore[union-attr]
    last = _LAST_RESERVE_SHORT
    if (last[0] is requests and last[1] == most and len(last[2]) == len(groups)
            and all(map(operator.is_, last[2], groups))):
        short_any = last[3]  # the same frozen requests and rids as the state checked before (LastByIdentity's rule)
    else:
        short_any = any([r.kv_reserved < most and r.status is Status.RUNNING
                         for rids in groups for r in map(requests.__getitem__, rids)])
        _LAST_RESERVE_SHORT[:] = (requests, most, groups, short_any)
    if not short_any:
        return []
    need: dict[int, int] = {}
    for result in writing:
        writes = result.reserved_writes
        for rid in result.rids:
            if requests[rid].status is Status.RUNNING:  # freed since: later writes land after, in stream order
                need[rid] = need.get(rid, 0) + writes
    pending = dict(need)
    for rid in batch.rids if verifying else ():  # type: ignore[union-attr]
        if requests[rid].status is Status.RUNNING:  # released after its step was prepared: as above
            need[rid] = need.get(rid, 0) + per_req
    short = [rid for rid, n in need.items() if requests[rid].kv_reserved < n]
    if not short:
        return []
    rid = min(short, key=lambda x: requests[x].kv_reserved)
    have, want = requests[rid].kv_reserved, need[rid]
    if not pending.get(rid):
        message = f"the verify step writes {per_req} tokens per request but only {have} slots are reserved"
    else:
        launch = f"the verify step writes {per_req} tokens and " if verifying and rid in batch.rids else ""  # type: ignore[union-attr]
        plain = any(u.steps is None and u.reserve_slot and rid in u.rids for u in state.unprocessed)
        steps = "steps" if plain else "verifies"
        message = (f"{launch}launched {steps} whose results are unprocessed may write {pending[rid]} tokens of "
                   f"request {rid}, but only {have} slots are reserved")
    return [Violation("kv_reserve_covers_writes", message, tuple(short), expected=str(want), actual=str(have))]


def running_within_cap(state: State, scope: Scope) -> list[Violation]:
    """No more requests run than the current mode can hold (speculation holds fewer)."""
    cap = scope.spec_cap if state.spec_mode is SpecMode.ON else scope.plain_cap
    count = state.in_flight_count()
    if count <= cap:
        return []
    return [Violation(
        "running_within_cap",
        f"{count} requests run with speculation {state.spec_mode.value}; that mode holds at most {cap}",
        state.running.rids, expected=f"<= {cap}", actual=str(count),
    )]


def seq_lens_growth(before: State, action: Action, after: State, scope: Scope, design: Design) -> list[Violation]:
    """seq_lens grow by accepted+1 on a verify (under overlap: when its result is processed), by 1 on a
    plain decode, and not at all otherwise (except prefill, which sets them, and a release to waiting:
    retract, or flip-on by retraction, which clears them)."""
    if action.name == "prefill":
        return []
    expected_growth = _expected_growth(before, action, design, scope)
    if expected_growth and not any(expected_growth.values()):
        expected_growth = {}  # every request stays as it is (a plain step's result): the same test, one pass fewer
    if not expected_growth and before.requests is after.requests:
        return []  # no request changed, and none had to
    before_requests, after_requests = before.requests, after.requests
    if not expected_growth:
        # a step that moves a few requests of a large batch (a finish, a retraction): only those can have grown
        moved = changed_indices(before_requests, after_requests)
        if moved is not None and all([after_requests[i].seq_len == before_requests[i].seq_len for i in moved]):
            return []
    if len(before_requests) == len(after_requests):
        # the common case as one comprehension: every request grew by what it had to (the loop below finds nothing)
        grown = [b.seq_len - a.seq_len for a, b in zip(before_requests, after_requests, strict=True)]
        if expected_growth:
            get = expected_growth.get
            if grown == [get(a.rid, 0) for a in before_requests]:
                return []
        elif not any(grown):
            return []
    problems = []
    get = expected_growth.get
    for a, b in zip(before_requests, after_requests, strict=True):
        want = get(a.rid, 0) if expected_growth else 0
        if a is b and not want:
            continue  # the same request object: it did not grow, and need not
        if b.status is Status.WAITING and a.status is not Status.WAITING:
            continue  # released (ScheduleBatch.release_req): its re-prefill sets seq_len again
        if b.seq_len - a.seq_len != want:
            problems.append(Violation(
                "seq_lens_growth",
                f"{action.name} moved seq_len of request {a.rid} from {a.seq_len} to {b.seq_len}; "
                f"it must grow by {want}",
                (a.rid,), expected=str(a.seq_len + want), actual=str(b.seq_len),
            ))
    return problems


def _expected_growth(before: State, action: Action, design: Design, scope: Scope) -> dict[int, int]:
    if action.name == "process_result":
        return {rid: grown for rid, (grown, _) in result_growth(before, action, design).items()}
    if action.name == "verify" and scope.overlap:
        return {}  # overlap: the launch grows nothing; its result does, when processed
    if action.name == "verify":
        # at a request's finish the design's worker decides: the whole run (v2) or up to max_new_tokens (v1)
        requests = before.requests
        return {
            rid: verify_growth(requests[rid], accepted, design)[0]
            for rid, accepted in zip(before.launched.rids, action.args, strict=True)  # type: ignore[union-attr]
        }
    if action.name == "plain_decode":
        return dict.fromkeys(before.running.rids, 1)
    return {}


def draft_kv_covers_prefix(before: State, action: Action, after: State, scope: Scope,
                           design: Design) -> list[Violation]:
    """Before any draft step, the draft model's KV covers every committed token and the hidden
    state it starts from exists, the prefix a request took from the radix cache included."""
    if action.name != "draft" or action.args[0] == 0:
        return []
    spec = before.running.spec_info
    if spec.kind is not SpecInfoKind.DRAFT_INPUT:
        return [Violation(
            "draft_kv_covers_prefix",
            f"draft step {action.args[0]} starts from spec_info {spec.describe()}: the draft input (hidden "
            f"states, bonus tokens) of {before.running.size} requests is gone",
            before.running.rids, expected="draft_input", actual=spec.kind.value,
        )]
    stale = [r for r in map(before.requests.__getitem__, before.running.rids) if not r.draft_current]
    if not stale:
        return _tree_prefix_without_draft(before, action) if before.prefix_cache else []
    r = stale[0]
    hidden = "present" if r.draft_hidden_ready else "missing"
    return [Violation(
        "draft_kv_covers_prefix",
        f"draft step {action.args[0]} starts with the draft KV covering {r.draft_kv_len} of {r.seq_len} "
        f"committed tokens of request {r.rid}, hidden state {hidden}",
        tuple(x.rid for x in stale), expected=f"{r.seq_len} tokens, hidden state present",
        actual=f"{r.draft_kv_len} tokens, hidden state {hidden}",
    )]


def draft_extend_leaves_behind(before: State, covered: Collection[int], action: str) -> list[Violation]:
    """A catch-up (`draft_catch_up`: one draft-extend over the whole running batch, `statemodel.actions`) that ran
    over only the requests in `covered`: each running request it left out whose draft is not current
    (`Request.draft_current`, the rule `draft_kv_covers_prefix` holds every request to at a draft step) would start the
    next draft step without its draft KV. Named at the catch-up itself, before its forward runs."""
    requests = before.requests
    left = [rid for rid in before.running.rids if rid not in covered and not requests[rid].draft_current]
    if not left:
        return []
    r = requests[left[0]]
    return [Violation(
        "draft_kv_covers_prefix",
        f"{action} runs the draft over {before.running.size - len(left)} of {before.running.size} running requests: "
        f"request {r.rid}'s draft KV stays at {r.draft_kv_len} of {r.seq_len} committed tokens",
        tuple(left), expected=f"every running request in the {action}'s batch",
        actual=f"{len(left)} left out",
    )]


def tree_draft_missing(state: State, rid: int) -> int:
    """Positions of request `rid`'s prefix that are radix-tree slots whose draft KV was never written."""
    return prefix_draft_missing(state.prefix_cache, state.requests[rid].cached_len)


def prefix_draft_missing(marks: Sequence[bool], cached_len: int) -> int:
    """Of the first `cached_len` positions of a radix-tree path (`marks`: per position, whether the draft KV of its
    slot was written), those without draft KV. The model's tree is one chain (`State.prefix_cache`); the guard
    passes the live tree's marks along the request's own path (shim/guard/tree_draft.py)."""
    return list(marks[:cached_len]).count(False)


def tree_prefix_violations(steps: int, missing: dict[int, tuple[int, int]]) -> list[Violation]:
    """A draft step of `steps` that starts with requests whose cached prefix lacks draft KV: `missing` maps each such
    request to (its cached prefix length, the positions of it without draft KV)."""
    if not missing:
        return []
    rid, (cached, lacking) = next(iter(missing.items()))
    return [Violation(
        "draft_kv_covers_prefix",
        f"draft step {steps} starts with request {rid}'s first {cached} tokens from the radix cache, "
        f"{lacking} of them without draft KV (cached while the draft did not run)",
        tuple(missing), expected=f"{cached} cached tokens with draft KV",
        actual=f"{lacking} positions without draft KV",
    )]


def _tree_prefix_without_draft(before: State, action: Action) -> list[Violation]:
    requests = before.requests
    missing = {rid: (requests[rid].cached_len, n) for rid in before.running.rids
               if (n := tree_draft_missing(before, rid))}
    return tree_prefix_violations(action.args[0], missing)


def committed_never_lost(before: State, action: Action, after: State, scope: Scope,
                         design: Design) -> list[Violation]:
    """No step takes away an output token a request has committed, retraction included."""
    before_requests, after_requests = before.requests, after.requests
    if before_requests is after_requests:
        return []
    moved = changed_indices(before_requests, after_requests)
    if moved is not None:  # a few requests of a large batch moved: only they can have lost output
        lost = [(before_requests[i], after_requests[i]) for i in moved
                if after_requests[i].committed < before_requests[i].committed]
    else:
        lost = [(a, b) for a, b in zip(before_requests, after_requests, strict=True) if b.committed < a.committed]
    return [Violation(
        "committed_never_lost",
        f"{action.name} dropped request {a.rid}'s output from {a.committed} to {b.committed} tokens",
        (a.rid,), expected=str(a.committed), actual=str(b.committed),
    ) for a, b in lost]


def result_not_after_reprefill(before: State, action: Action, after: State, scope: Scope,
                               design: Design) -> list[Violation]:
    """A launched step's result commits no token to a request retracted since that launch whose re-prefill has
    started: the re-prefill computes that position again from the output it kept, so the token would be twice."""
    if action.name != "process_result" or not before.unprocessed[0].applies_to_retracted:
        return []
    rows = set(result_rows(before))
    late = [rid for rid in before.unprocessed[0].applies_to_retracted
            if rid in rows and before.req(rid).status is not Status.WAITING]
    return [Violation(
        "result_not_after_reprefill",
        f"{action.name} commits a token of a step launched before request {rid} was retracted, after its re-prefill "
        "started: that position is computed again",
        (rid,), expected="the result skips it", actual="a token committed twice",
    ) for rid in late]


# The order is the order of report: a broken precondition of the step first, then the batch the
# step launched, then the pool, then the step's effect.
INVARIANTS: tuple[Invariant, ...] = (
    Invariant("draft_kv_covers_prefix", draft_kv_covers_prefix.__doc__ or "", draft_kv_covers_prefix, True),
    Invariant("spec_info_matches_mode", spec_info_matches_mode.__doc__ or "", spec_info_matches_mode, False),
    Invariant("spec_info_matches_batch", spec_info_matches_batch.__doc__ or "", spec_info_matches_batch, False),
    Invariant("shapes_agree", shapes_agree.__doc__ or "", shapes_agree, False),
    Invariant("kv_reserve_covers_writes", kv_reserve_covers_writes.__doc__ or "", kv_reserve_covers_writes, False),
    Invariant("kv_conservation", kv_conservation.__doc__ or "", kv_conservation, False),
    Invariant("seq_lens_growth", seq_lens_growth.__doc__ or "", seq_lens_growth, True),
    Invariant("committed_never_lost", committed_never_lost.__doc__ or "", committed_never_lost, True),
    Invariant("result_not_after_reprefill", result_not_after_reprefill.__doc__ or "", result_not_after_reprefill,
              True),
    Invariant("requests_in_one_place", requests_in_one_place.__doc__ or "", requests_in_one_place, False),
    Invariant("running_within_cap", running_within_cap.__doc__ or "", running_within_cap, False),
)

INVARIANT_NAMES: tuple[str, ...] = tuple(i.name for i in INVARIANTS)


_STATE_CHECKS = tuple(inv.check for inv in INVARIANTS if not inv.on_step)
_STEP_CHECKS = tuple(inv.check for inv in INVARIANTS if inv.on_step)


def check_state(state: State, scope: Scope) -> list[Violation]:
    """Every state invariant, in the fixed order of INVARIANTS."""
    found: list[Violation] = []
    for check in _STATE_CHECKS:
        found.extend(check(state, scope))
    return found


def check_transition(before: State, action: Action, after: State, scope: Scope, design: Design) -> list[Violation]:
    """Every step invariant of one transition, without the state invariants of its result: what an edge
    into a state already checked still needs (the checker checks every edge, `proofs.bfs`)."""
    found: list[Violation] = []
    for check in _STEP_CHECKS:
        bad = check(before, action, after, scope, design)
        if bad:  # nearly always empty: no call to extend
            found.extend(bad)
    if len(found) > 1:
        found.sort(key=lambda v: _REPORT_ORDER[v.invariant])
    return found


def check_step(before: State, action: Action, after: State, scope: Scope, design: Design) -> list[Violation]:
    """Every step invariant of one transition under `design` (whose worker decides what some steps
    do), then every state invariant of its result."""
    found: list[Violation] = []
    for check in _STEP_CHECKS:
        bad = check(before, action, after, scope, design)
        if bad:  # nearly always empty: no call to extend
            found.extend(bad)
    for check in _STATE_CHECKS:
        bad = check(after, scope)
        if bad:
            found.extend(bad)
    if len(found) > 1:  # nothing to order in the common case: no violation
        found.sort(key=lambda v: _REPORT_ORDER[v.invariant])
    return found


_REPORT_ORDER = {name: i for i, name in enumerate(INVARIANT_NAMES)}
