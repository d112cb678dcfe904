"""The model interface every consumer uses (stateright's shape): initial states, actions, next state,
and properties of three kinds: always (the invariants), sometimes (reachability, so no invariant holds
vacuously), eventually (checked on states at rest: every request finishes, nothing deadlocks).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from statemodel import actions as _actions
from statemodel.actions import Action, result_rows
from statemodel.design import Design, FreeFlips, Scope, ThresholdPolicy, TierFlips, TreeDraft
from statemodel.invariants import INVARIANTS, Invariant, Violation, check_state, check_step, check_transition
from statemodel.policy import equivalent_thresholds
from statemodel.state import SpecMode, Stage, State, Status, Thresholds, forgotten_requests

# the actions that only change what the policy runs, doing no request's work (`Model.at_rest`)
POLICY_ACTIONS = frozenset({"flip_off", "flip_on"})


@attrs.frozen
class Sometimes:
    """A transition that must occur somewhere in the explored space."""

    name: str
    summary: str
    holds: Callable[[State, Action, State], bool]


@attrs.frozen
class Eventually:
    """A property every state at rest (`Model.at_rest`: no work left to do) must satisfy."""

    name: str
    summary: str
    holds: Callable[[State], bool]


def _named(name: str) -> Callable[[State, Action, State], bool]:
    return lambda before, action, after: action.name == name


def _accepts(before: State, action: Action) -> list[tuple[int, int]]:
    """(request, accepted draft tokens) of a verify, or of a processed verify result (overlap)."""
    if action.name == "verify" and before.launched is not None and action.args:
        return list(zip(before.launched.rids, action.args, strict=True))
    if action.name == "process_result" and action.args:
        rows = result_rows(before)
        return [(rid, n) for rid, n in zip(before.unprocessed[0].rids, action.args, strict=True) if rid in rows]
    return []


def _verify_accepting(count: int) -> Callable[[State, Action, State], bool]:
    return lambda before, action, after: any(n == count for _, n in _accepts(before, action))


def _draft_with(pred: Callable[[int], bool]) -> Callable[[State, Action, State], bool]:
    return lambda before, action, after: action.name == "draft" and pred(action.args[0])


def _chunked(before: State, action: Action, after: State) -> bool:
    # a request part-way through its prompt after the prefill (prefilled_len < prefill_target would hold for any
    # request prefilled before: prefill_target grows with the output)
    return action.name == "prefill" and any(r.status is Status.PREFILLING for r in after.requests)


def _flip_with_batch(before: State, action: Action, after: State) -> bool:
    return action.name in ("flip_off", "flip_on") and before.running.size > 0


def _finish_at_prefill(before: State, action: Action, after: State) -> bool:
    return action.name == "finish" and before.pending is not None and action.args[0] in before.pending.rids


def _finish_mid_round(before: State, action: Action, after: State) -> bool:
    """A verify accepts more tokens than some request has left: it finishes inside the round, and its
    design's worker decides how far seq_len goes (Design.verify_advances_past_finish)."""
    requests = before.requests
    return any(accepted + 1 > requests[rid].max_new_tokens - requests[rid].committed
               for rid, accepted in _accepts(before, action))


def _second_launch(before: State, action: Action, after: State) -> bool:
    """Overlap: a step is launched while the previous step's result is still unprocessed."""
    return action.name in ("verify", "plain_decode") and len(after.unprocessed) == 2


def _finished_runs_next(before: State, action: Action, after: State) -> bool:
    """Overlap: a result skips a request that an earlier result finished (it ran in this step anyway)."""
    if action.name != "process_result":
        return False
    rows = result_rows(before)
    return any(rid not in rows and before.req(rid).status is not Status.WAITING for rid in before.unprocessed[0].rids)


def _result_after_prepare(before: State, action: Action, after: State) -> bool:
    """Overlap: an iteration run without overlap processes the last result after the next step was prepared."""
    return action.name == "process_result" and before.stage is Stage.PREPARED


def _released_before_launch(before: State, action: Action, after: State) -> bool:
    """Overlap: a step launches with a request that was released after the step was prepared."""
    return action.name in ("verify", "plain_decode") and any(
        before.req(rid).status is Status.FINISHED for rid in before.running.rids)


def _flip_on_retracts(before: State, action: Action, after: State) -> bool:
    """A flip-on that sends a running request back to waiting (catch-up by retraction)."""
    return action.name == "flip_on" and any(
        after.req(rid).status is Status.WAITING for rid in before.running.rids)


def _reprefill_with_draft(before: State, action: Action, after: State) -> bool:
    """A prefill with speculation on completes a request that already had output (it was retracted): the
    target and the draft run over prompt + output."""
    return action.name == "prefill" and after.spec_mode is SpecMode.ON and any(
        a.committed and a.status is not Status.RUNNING and b.status is Status.RUNNING and b.draft_current
        for a, b in zip(before.requests, after.requests, strict=True))


def _prefix_hit(before: State, action: Action, after: State) -> bool:
    """Radix cache: a prefill takes part of a prompt from the tree (it computes fewer tokens than it fills)."""
    if action.name != "prefill" or after.launched is None:
        return False
    filled = sum(b.prefilled_len - a.prefilled_len for a, b in zip(before.requests, after.requests, strict=True)
                 if b.prefilled_len > a.prefilled_len)
    return filled > after.launched.extend_tokens


def _prompt_cached_without_draft(before: State, action: Action, after: State) -> bool:
    """Radix cache: a request starts a prefill with speculation on while part of its prompt is cached without
    draft KV (the case the tree's draft coverage is for)."""
    tree = before.prefix_cache
    return action.name == "prefill" and before.spec_mode is SpecMode.ON and any(
        a.status is Status.WAITING and b.status is not Status.WAITING
        and False in tree[:min(a.prompt_len, a.prefill_target - 1)]
        for a, b in zip(before.requests, after.requests, strict=True))


def _kept_out_of_tree(before: State, action: Action, after: State) -> bool:
    """Radix cache: a prefill without the draft leaves prompt tokens it computed out of the tree."""
    return action.name == "prefill" and after.spec_mode is SpecMode.OFF and any(
        b.cached_len < min(b.prefilled_len, b.prompt_len) for b in after.requests if b.status is not Status.WAITING)


def _tree_evicts(before: State, action: Action, after: State) -> bool:
    return len(after.prefix_cache) < len(before.prefix_cache)


def _steps_switched(before: State, action: Action, after: State) -> bool:
    return action.name == "draft" and action.args[0] != before.num_steps


_THRESHOLDS: dict[tuple[int, int], Thresholds] = {}

# (mode, thresholds, requests not finished) -> the Thresholds the key holds: equivalent_thresholds, asked once
_EQUIVALENT: dict[tuple[SpecMode, Thresholds, int], Thresholds] = {}

# Model.dedup_key: a state's fields but the pool size, what the key forgets replaced
DedupKey = tuple[object, ...]


def _thresholds(pair: tuple[int, int]) -> Thresholds:
    """One shared Thresholds per pair: keys holding it compare by identity."""
    t = _THRESHOLDS.get(pair)
    if t is None:
        t = _THRESHOLDS[pair] = Thresholds(*pair)
    return t


@attrs.frozen
class Model:
    """One design under one scope: what the checker explores and what the guard checks against."""

    design: Design
    scope: Scope
    # built on the first call and kept: every strategy asks for them (a walk per run, the shrinker per
    # counterexample), they cost about 50 us to build on the 2-core machine (2026-12-05, b4a32a6), and a State is
    # immutable
    _inits: tuple[State, ...] | None = attrs.field(default=None, init=False, eq=False, repr=False)

    def init_states(self) -> list[State]:
        inits = self._inits
        if inits is None:
            inits = tuple(_actions.initial_states(self.design, self.scope))
            object.__setattr__(self, "_inits", inits)
        return list(inits)

    def actions(self, state: State) -> list[Action]:
        return _actions.enabled(state, self.design, self.scope)

    def next_state(self, state: State, action: Action) -> State:
        return _actions.apply(state, action, self.design, self.scope)

    def dedup_key(self, state: State) -> DedupKey:
        """What the checker counts states by: two states with one key enable the same actions, to successors with
        one key again, and every invariant and property reads them alike, so the checker expands one of them
        (docs/model.md, "What the checker counts"). The key forgets what nothing reads any more: the dead fields
        of a finished request out of every batch (`forget_finished`); which threshold pair, among the pairs the
        policy answers alike at every demand still reachable (`equivalent_thresholds`: a request that finished
        never comes back, so demand stays within the requests not finished); and the batch the last forward ran
        on, except where a step reads it (stage DRAFTED: verify runs on it). Every other step replaces `launched`,
        and only the state invariants of the state itself read it: the checker checks them on every edge.

        The key is the state's fields in a plain tuple (the pool size, fixed by the scope, left out), not a State:
        a tuple is built, hashed and compared in C, where a State's attrs `__init__` and `__eq__` run in Python
        (the checker builds a key for every edge and compares it on every edge into a known key)."""
        launched = state.launched if state.stage is Stage.DRAFTED else None
        requests = state.requests
        statuses = [r.status for r in requests]  # forgetting keeps every status
        finished = statuses.count(Status.FINISHED)
        if finished:  # a finished request only in a forgotten batch: out of all
            requests = forgotten_requests(state, launched)
        thresholds = t = state.thresholds
        if t is not None:
            asked = (state.spec_mode, t, len(statuses) - finished)
            thresholds = _EQUIVALENT.get(asked)
            if thresholds is None:
                pair = equivalent_thresholds(state.spec_mode is SpecMode.ON, t.t_off, t.t_on, asked[2])
                thresholds = _EQUIVALENT[asked] = t if pair == (t.t_off, t.t_on) else _thresholds(pair)
        return (requests, state.running, state.pending, launched, state.stage, state.spec_mode, state.num_steps,
                state.kv_free, thresholds, state.unprocessed, state.prefix_cache)

    def at_rest(self, state: State, enabled: list[Action] | None = None) -> bool:
        """No work can happen any more: no action is enabled but the policy's flips, here or in any state the flips
        alone lead to. Where the `eventually` properties are checked: a design that may flip at any demand (`auto`,
        tiers) enables a flip in every state, so it never reaches a state with no action at all. `enabled` is
        `actions(state)` when the caller has it."""
        acts = self.actions(state) if enabled is None else enabled
        for action in acts:  # a plain loop: the checker asks this of every state it expands
            if action.name not in POLICY_ACTIONS:
                return False
        todo, seen = [state], {self.dedup_key(state)}
        while todo:
            here = todo.pop()
            for action in acts if here is state else self.actions(here):
                if action.name not in POLICY_ACTIONS:
                    return False
                there = self.next_state(here, action)
                key = self.dedup_key(there)
                if key not in seen:
                    seen.add(key)
                    todo.append(there)
        return True

    def always(self) -> tuple[Invariant, ...]:
        return INVARIANTS

    def check_state(self, state: State) -> list[Violation]:
        return check_state(state, self.scope)

    def check_step(self, before: State, action: Action, after: State) -> list[Violation]:
        return check_step(before, action, after, self.scope, self.design)

    def check_transition(self, before: State, action: Action, after: State) -> list[Violation]:
        """The step invariants of one transition only: for an edge into a state whose own invariants held."""
        return check_transition(before, action, after, self.scope, self.design)

    def sometimes(self) -> tuple[Sometimes, ...]:
        """Reachability properties that apply to this design."""
        out = [
            Sometimes("prefill_chunked", "a prompt is prefilled in more than one chunk", _chunked),
            Sometimes("merge_batch", "a prefilled batch merges into the running batch", _named("merge_batch")),
            Sometimes("finish", "a request finishes", _named("finish")),
            Sometimes("finish_at_prefill", "a request finishes in its prefilled batch, before the merge",
                      _finish_at_prefill),
            Sometimes("finish_mid_round", "a verify accepts more tokens than a request has left",
                      _finish_mid_round),
            Sometimes("filter_batch", "finished requests are filtered out", _named("filter_batch")),
            Sometimes("retract", "a request is retracted under KV pressure", _named("retract")),
            Sometimes("draft_k_steps", "a draft of at least one step", _draft_with(lambda k: k > 0)),
        ]
        if self.scope.overlap:
            out += [
                Sometimes("process_result", "a launched step's result is processed", _named("process_result")),
                Sometimes("second_launch", "a step launches while the previous result is unprocessed",
                          _second_launch),
                Sometimes("finished_runs_next", "a request finished by one step ran in the next (its result is "
                          "skipped)", _finished_runs_next),
                Sometimes("result_after_prepare", "a result is processed after the next step was prepared (an "
                          "iteration SGLang runs without overlap)", _result_after_prepare),
                Sometimes("released_before_launch", "a step launches with a request released after the step was "
                          "prepared", _released_before_launch),
            ]
        if self.design.radix_cache:
            out.append(Sometimes("prefix_hit", "a prefill takes part of a prompt from the radix cache", _prefix_hit))
            if self.design.tree_draft is TreeDraft.NOT_INSERTED_WITHOUT_DRAFT:
                # nothing without draft KV is ever cached; the tree holds few enough tokens in this scope that no
                # allocation has to evict them (docs/prefix-cache.md)
                out.append(Sometimes("kept_out_of_tree", "a prefill without the draft leaves the prompt tokens it "
                                     "computed out of the radix cache", _kept_out_of_tree))
            else:
                out += [
                    Sometimes("prompt_cached_without_draft", "a request starts a prefill with speculation on while "
                              "part of its prompt is cached without draft KV", _prompt_cached_without_draft),
                    Sometimes("tree_evicts", "tokens are evicted from the radix cache", _tree_evicts),
                ]
        largest = self.design.largest_steps()
        out += [Sometimes(f"verify_accepts_{n}", f"a verify where some request accepts {n} draft tokens",
                          _verify_accepting(n)) for n in range(largest + 1)]
        if isinstance(self.design.policy, ThresholdPolicy | FreeFlips):
            out += [
                Sometimes("plain_decode", "a spec-off step runs a plain decode", _named("plain_decode")),
                Sometimes("flip_off", "speculation is switched off", _named("flip_off")),
                Sometimes("flip_on", "speculation is switched back on", _named("flip_on")),
                Sometimes("flip_with_running_batch", "a flip happens while requests are running",
                          _flip_with_batch),
            ]
            if self.design.draft_while_off.value == "sync_every_step":
                out.append(Sometimes("draft_sync", "the draft syncs after a plain step", _named("draft_sync")))
            if self.design.draft_while_off.value == "catch_up_on_enable":
                out.append(Sometimes("draft_catch_up", "the draft catches up at flip-on", _named("draft_catch_up")))
            if isinstance(self.design.policy, TierFlips):
                out.append(Sometimes("steps_switch", "the switch changes the tier (step count) while on",
                                     _steps_switched))
            if self.design.draft_while_off.value == "retract_on_enable":
                out.append(Sometimes("flip_on_retracts", "flip-on retracts a running request; its re-prefill "
                                     "with speculation on catches the draft up", _flip_on_retracts))
                out.append(Sometimes("reprefill_with_draft", "a request with output re-prefills with speculation "
                                     "on: target and draft over prompt + output", _reprefill_with_draft))
        else:
            out += [
                Sometimes("zero_step", "a steps=0 round (trivial verify)", _draft_with(lambda k: k == 0)),
                Sometimes("steps_switch", "the adaptive controller switches step count", _steps_switched),
            ]
        return tuple(out)

    def eventually(self) -> tuple[Eventually, ...]:
        return (
            Eventually("all_requests_finish", "every request finishes (no deadlock, no request lost)",
                       lambda s: s.all_finished()),
        )
