"""The BFS checker: verdicts for every design, shortest traces, vacuity and deadlock detection, the CLI."""

from __future__ import annotations

import json

import attrs
import pytest

from proofs.bfs import Search, check, model_successors
from proofs.verdicts import judge, report_markdown, reported_states, run_design, run_designs, stale_reports
from specflip.cli import DEFAULT_REPORTS, main
from statemodel import actions, invariants
from statemodel.actions import Action
from statemodel.design import DraftWhileOff, RequestSpec, Scope, ThresholdPolicy
from statemodel.designs import (
    ALL_DESIGNS,
    CANDIDATES,
    KNOWN_BAD,
    OVERLAP_KNOWN_BAD,
    RETRACT_CATCH_UP,
    SEEDS_FINAL,
    SHIPPED,
    get_design,
    overlap_scope,
)
from statemodel.invariants import Violation
from statemodel.model import Model
from statemodel.state import Batch, ForwardMode, Stage, Status, Thresholds
from tests.model_helpers import replay_trace


@pytest.mark.parametrize("design", KNOWN_BAD, ids=lambda d: d.name)
def test_known_bad_design_is_refuted_with_its_invariant(design) -> None:
    verdict = run_design(design)
    assert verdict.verdict == "refuted", verdict.reason
    assert verdict.invariant == design.expected_invariant
    last = verdict.result.trace[-1]
    assert verdict.result.violations and last.state is not None


def test_the_pool_answers_in_order_whatever_it_starts_first(tmp_path) -> None:
    """`expected_states` only orders the work: the verdicts come back (and reach `on_verdict`) in the order of the
    designs, each the one `run_design` gives; the guesses come from the reports `reported_states` reads."""
    designs = [get_design(name) for name in ("draft_kv_never_freed", "kv_reserve_by_current_steps",
                                             "seq_lens_advanced_twice", "zero_steps_skip_draft_extend")]
    for rank, design in enumerate(designs[:3]):  # the last has no report: it is started first
        (tmp_path / f"{design.name}.md").write_text(f"- Explored: {rank} states (counted ...)\n")
    seen = []
    verdicts = run_designs(designs, lambda d: Scope(), jobs=2, on_verdict=seen.append,
                           expected_states=reported_states(tmp_path))
    assert [v.design.name for v in verdicts] == [v.design.name for v in seen] == [d.name for d in designs]
    alone = [run_design(d) for d in designs]
    assert [(v.verdict, v.result.states, len(v.result.trace)) for v in verdicts] == [
        (v.verdict, v.result.states, len(v.result.trace)) for v in alone]
    assert [reported_states(tmp_path)(d) for d in designs] == [0, 1, 2, None]


@pytest.fixture(scope="module")
def every_verdict() -> dict[str, object]:
    """Every design of `specflip check` in the default scope, checked once for this module, in the pool."""
    return {v.design.name: v for v in run_designs(ALL_DESIGNS, lambda d: Scope())}  # candidates included


@pytest.mark.slow
@pytest.mark.parametrize("design", SHIPPED + CANDIDATES, ids=lambda d: d.name)
def test_shipped_design_passes_without_vacuity(design, every_verdict) -> None:
    verdict = every_verdict[design.name]
    assert verdict.verdict == "pass", verdict.reason
    assert verdict.result.complete and not verdict.result.vacuous and not verdict.result.eventually_failed
    assert all(verdict.result.sometimes_reached.values())


@pytest.mark.slow
def test_committed_proof_reports_match_the_model(every_verdict, tmp_path) -> None:
    """What `specflip check --check-reports` does in CI: each committed report is what the checker writes
    now. And the comparison can fail: a report edited by hand is stale."""
    verdicts = [every_verdict[d.name] for d in ALL_DESIGNS]
    assert stale_reports(verdicts, DEFAULT_REPORTS) == [], "run `specflip check` and commit proofs/reports/"
    copy = tmp_path / "reports"
    copy.mkdir()
    for v in verdicts:
        (copy / f"{v.design.name}.md").write_text((DEFAULT_REPORTS / f"{v.design.name}.md").read_text())
    edited = copy / f"{verdicts[0].design.name}.md"
    edited.write_text(edited.read_text().replace("states", "states (edited)", 1))
    (copy / f"{verdicts[-1].design.name}.md").unlink()
    assert stale_reports(verdicts, copy) == [str(edited), str(copy / f"{verdicts[-1].design.name}.md")]


def test_a_step_invariant_broken_only_on_an_edge_into_a_visited_state_is_found(monkeypatch) -> None:
    """The checker checks every edge. Here a plain step whose forward is lost leaves the state exactly as
    prepared: a self-loop into a state already reached, and the only edge that breaks an invariant
    (seq_lens_growth: the step must grow seq_len by 1). The rule before (check an edge only when it reaches
    a new state) finds nothing in this model; the checker finds it, at the shortest depth."""
    monkeypatch.setitem(actions._HANDLERS, "plain_decode", lambda state, action, design, scope: state)
    scope = attrs.evolve(Scope(), requests=(RequestSpec(1, 2),))
    model = Model(attrs.evolve(SEEDS_FINAL, policy=ThresholdPolicy((1,), (0,))), scope)

    search = Search(model.init_states(), model_successors(model))
    edges = list(search.edges())
    assert not any(model.check_step(before, action, after) for before, action, after, new, _ in edges if new)
    into_visited = [(b, a, c) for b, a, c, new, _ in edges if not new and model.check_transition(b, a, c)]
    assert into_visited and all(a.name == "plain_decode" and b == c for b, a, c in into_visited)

    result = check(model)
    assert [v.invariant for v in result.violations] == ["seq_lens_growth"]
    trace = result.trace
    assert trace[-1].action.name == "plain_decode" and trace[-1].state == trace[-2].state
    assert _violation_within(model, len(trace)) and not _violation_within(model, len(trace) - 1)
    verdict = judge(attrs.evolve(SEEDS_FINAL, policy=ThresholdPolicy((1,), (0,))), scope, result)
    assert verdict.verdict == "fail" and "breaks seq_lens_growth" in verdict.reason


def test_a_state_invariant_broken_only_on_an_edge_into_a_known_key_with_another_launched_batch_is_found(
        monkeypatch) -> None:
    """The checker gives an edge into a known key the step invariants only when the state it reaches has the kept
    state's launched batch (the key forgets the launched batch outside stage DRAFTED; `_check`'s edge condition).
    With another launched batch it checks the state invariants too: here one that reads the launched batch and
    breaks in one key only with the batch a later edge brings, never in a state reached first (a new key)."""
    model = Model(SEEDS_FINAL, attrs.evolve(Scope(), requests=(RequestSpec(1, 1), RequestSpec(1, 1))))
    search = Search(model.init_states(), model_successors(model), key=model.dedup_key)
    edges = list(search.edges())
    target = next(after for _, _, after, new, kept in edges
                  if not new and kept is not None and after.launched != kept.launched)
    target_key = model.dedup_key(target)

    def launched_as_in_target(state, scope):
        if state.launched == target.launched and model.dedup_key(state) == target_key:
            return [Violation("launched_as_in_target", "the launched batch of the target state")]
        return []

    monkeypatch.setattr(invariants, "_STATE_CHECKS", (*invariants._STATE_CHECKS, launched_as_in_target))
    assert not any(launched_as_in_target(after, None) for _, _, after, new, _ in edges if new)
    assert not any(launched_as_in_target(root, None) for root in search.roots)
    result = check(model)
    assert [v.invariant for v in result.violations] == ["launched_as_in_target"]
    assert result.trace[-1].state == target


def _dead_fields_scrambled(state):
    """`state` with what `forget_finished` forgets changed, for every finished request out of every batch."""
    in_batch = set(state.running.rids).union(*(b.rids for b in (state.pending, state.launched) if b is not None),
                                              *(u.rids for u in state.unprocessed))
    return state.replace(requests=tuple(
        r.replace(prefilled_len=r.prefilled_len + 7, seq_len=r.seq_len + 5, draft_kv_len=r.draft_kv_len + 3,
                  draft_hidden_ready=not r.draft_hidden_ready)
        if r.status is Status.FINISHED and r.rid not in in_batch else r for r in state.requests))


def _threshold_twins(model: Model, state):
    """`state` with each other threshold pair of its design that the dedup key counts as the same."""
    pairs = model.design.policy.pairs() if isinstance(model.design.policy, ThresholdPolicy) else ()
    key = model.dedup_key(state)
    twins = (state.replace(thresholds=Thresholds(*pair)) for pair in pairs)
    return [twin for twin in twins if twin != state and model.dedup_key(twin) == key]


def _launched_twins(model: Model, state):
    """`state` with another batch as the one the last forward ran on, where the dedup key forgets it (a batch no
    step could launch: its state invariants break, the edges out of it must not notice)."""
    if state.stage is Stage.DRAFTED:
        return []
    other = Batch((0,), ForwardMode.DECODE, out_cache_loc_width=3) if state.launched is None else None
    return [state.replace(launched=other)]


def _unlike_behaviours(model: Model, max_states: int = 4000, twins_of=None, own_invariants: bool = True) -> list[str]:
    """Where two states with one dedup key behave differently: enabled actions, their keys after, any
    invariant of the edges out of them, any sometimes-property (and, with `own_invariants`, the state invariants
    of the two states themselves). Empty: the checker may count them once. `twins_of(model, state)`: the states
    to compare `state` with (default: its finished requests' dead fields scrambled)."""
    found = []
    sometimes = model.sometimes()
    for state, _, _, new, _ in Search(model.init_states(), model_successors(model), max_nodes=max_states).edges():
        if not new:
            continue
        for twin in (twins_of(model, state) if twins_of else [_dead_fields_scrambled(state)]):
            if twin == state:
                continue
            assert model.dedup_key(twin) == model.dedup_key(state)
            acts = model.actions(state)
            if model.actions(twin) != acts or (own_invariants and model.check_state(twin) != model.check_state(state)):
                found.append(f"actions or state invariants differ in {state}")
                continue
            for action in acts:
                after, twin_after = model.next_state(state, action), model.next_state(twin, action)
                if model.dedup_key(after) != model.dedup_key(twin_after):
                    found.append(f"{action.describe()} leads to different keys")
                names = [v.invariant for v in model.check_step(state, action, after)]
                if names != [v.invariant for v in model.check_step(twin, action, twin_after)]:
                    found.append(f"{action.describe()} breaks different invariants")
                for s in sometimes:
                    if s.holds(state, action, after) != s.holds(twin, action, twin_after):
                        found.append(f"{action.describe()}: {s.name} differs")
    return found


# three requests: small enough to exhaust, so the states where requests have finished (and threshold pairs merge)
# are all compared
_SMALL = attrs.evolve(Scope(), requests=(RequestSpec(1, 2), RequestSpec(2, 1), RequestSpec(1, 1)))


@pytest.mark.parametrize("design", [SEEDS_FINAL, RETRACT_CATCH_UP, get_design("plain_off_catch_up"),
                                    get_design("no_draft_work_while_off")], ids=lambda d: d.name)
def test_states_with_equivalent_thresholds_behave_alike(design) -> None:
    """The dedup key counts two threshold pairs once where the policy answers them alike at every demand still
    reachable (statemodel.policy.equivalent_thresholds): the states it merges behave alike, in a scope exhausted."""
    model = Model(design, _SMALL)
    assert _unlike_behaviours(model, max_states=None, twins_of=_threshold_twins) == []


def test_a_policy_that_reads_thresholds_otherwise_is_caught(monkeypatch) -> None:
    """The test above can fail: a policy that flips off one request before the off threshold makes an off
    threshold just out of reach matter, and the states the key merges behave differently."""
    decide = actions.decide_flip

    def off_one_early(spec_on, demand, in_flight, t_off, t_on, spec_cap):
        return decide(spec_on, demand + 1 if spec_on else demand, in_flight, t_off, t_on, spec_cap)

    monkeypatch.setattr(actions, "decide_flip", off_one_early)
    assert _unlike_behaviours(Model(SEEDS_FINAL, _SMALL), max_states=None, twins_of=_threshold_twins) != []


@pytest.mark.parametrize("design", [SEEDS_FINAL, get_design("v2_switch_reserve_sync"),
                                    get_design("sglang_adaptive_warm"), get_design("merge_unchecked_spec_info")],
                         ids=lambda d: d.name)
def test_states_with_another_launched_batch_behave_alike(design) -> None:
    """The dedup key forgets the batch the last forward ran on except at stage DRAFTED (verify runs on it): no
    step out of any other stage reads it, so the edges out of two such states break the same invariants (the
    states' own state invariants differ: the checker checks those on every edge, into a known key too)."""
    assert _unlike_behaviours(Model(design, _SMALL), max_states=None, twins_of=_launched_twins,
                              own_invariants=False) == []


def test_overlap_states_with_another_launched_batch_behave_alike() -> None:
    design = get_design("v2_switch_reserve_sync_overlap")
    scope = attrs.evolve(overlap_scope(design), requests=_SMALL.requests)
    assert _unlike_behaviours(Model(design, scope), max_states=8000, twins_of=_launched_twins,
                              own_invariants=False) == []


def test_a_step_that_reads_the_launched_batch_is_caught(monkeypatch) -> None:
    """The test above can fail: an arrival that kept the launched batch instead of clearing it carries the
    forgotten batch into the next state, whose invariants then differ."""
    arrive = actions._arrive

    def arrive_keeping_launched(state, action, design, scope):
        return arrive(state, action, design, scope).replace(launched=state.launched)

    monkeypatch.setitem(actions._HANDLERS, "arrive", arrive_keeping_launched)
    assert _unlike_behaviours(Model(SEEDS_FINAL, _SMALL), max_states=None, twins_of=_launched_twins,
                              own_invariants=False) != []


@pytest.mark.parametrize("design", [SEEDS_FINAL, RETRACT_CATCH_UP, get_design("v2_switch_reserve_sync"),
                                    get_design("sglang_adaptive_warm"), get_design("clear_on_scheduler_batch"),
                                    get_design("merge_unchecked_spec_info")], ids=lambda d: d.name)
def test_states_with_one_dedup_key_behave_alike(design) -> None:
    """The checker counts states by `Model.dedup_key`, which forgets what no step reads of a finished request
    out of every batch: the states it merges must enable the same actions, to the same keys, breaking the same
    invariants and reaching the same sometimes-properties."""
    assert _unlike_behaviours(Model(design, Scope())) == []


def test_overlap_states_with_one_dedup_key_behave_alike() -> None:
    design = get_design("v2_switch_reserve_sync_overlap")
    assert _unlike_behaviours(Model(design, overlap_scope(design)), max_states=8000) == []


def test_an_invariant_that_reads_a_forgotten_field_is_caught(monkeypatch) -> None:
    """The test above can fail: a state invariant that reads every request's seq_len (a bound on it, say)
    reads a field the key forgets, and is caught."""
    def seq_len_bounded(state, scope):
        return [Violation("seq_len_bounded", f"request {r.rid}", (r.rid,)) for r in state.requests
                if r.seq_len > r.prompt_len + r.max_new_tokens]

    monkeypatch.setattr(invariants, "_STATE_CHECKS", (*invariants._STATE_CHECKS, seq_len_bounded))
    assert any("state invariants differ" in line for line in _unlike_behaviours(Model(SEEDS_FINAL, Scope())))


def _state_invariants_unlike_the_kept_state(model: Model, max_states: int | None = None) -> list[str]:
    """Edges into a known key whose state has the kept state's launched batch: the checker gives them the step
    invariants only, the state invariants being the kept state's. Where they are not, listed."""
    found = []
    search = Search(model.init_states(), model_successors(model), max_nodes=max_states, key=model.dedup_key)
    for _, action, after, new, kept in search.edges():
        if not new and kept is not None and after.launched == kept.launched:
            if model.check_state(after) != model.check_state(kept):
                found.append(f"{action.describe()}: state invariants differ from the kept state's")
    return found


@pytest.mark.parametrize("design", [SEEDS_FINAL, RETRACT_CATCH_UP, get_design("v2_switch_reserve_sync"),
                                    get_design("clear_on_scheduler_batch")], ids=lambda d: d.name)
def test_an_edge_into_a_known_key_reaches_a_state_as_good_as_the_kept_one(design) -> None:
    """The checker skips the state invariants of such an edge's state (proofs/bfs.py): exhausting a small scope,
    they are the kept state's on every such edge."""
    assert _state_invariants_unlike_the_kept_state(Model(design, _SMALL)) == []


def test_an_edge_into_a_known_key_with_an_invariant_reading_a_forgotten_field_is_caught(monkeypatch) -> None:
    """The test above can fail: with a state invariant that reads a field the key forgets, the state an edge
    reaches and the kept state differ."""
    def finished_within_its_output(state, scope):  # seq_len of a finished request: the key forgets it
        return [Violation("finished_within_its_output", f"request {r.rid}", (r.rid,)) for r in state.requests
                if r.status is Status.FINISHED and r.seq_len > r.prompt_len + r.committed - 1]

    monkeypatch.setattr(invariants, "_STATE_CHECKS", (*invariants._STATE_CHECKS, finished_within_its_output))
    # v2_switch_reserve_sync: edges of its small scope reach states whose finished requests differ from the kept ones
    assert _state_invariants_unlike_the_kept_state(Model(get_design("v2_switch_reserve_sync"), _SMALL)) != []


def test_the_dedup_key_merges_states_and_keeps_the_verdict() -> None:
    model = Model(get_design("sglang_adaptive_warm"), Scope())
    every_state = Search(model.init_states(), model_successors(model))
    for _ in every_state.edges():
        pass
    result = check(model)
    assert judge(model.design, model.scope, result).verdict == "pass"
    assert result.complete and result.states < len(every_state)


def test_catch_up_by_retraction_is_reached_and_its_twin_without_it_is_refuted() -> None:
    """The retraction at flip-on is what keeps the draft current: without it (speculation back on, nothing
    retracted, no catch-up) the design is no_draft_work_while_off, which the checker refutes."""
    names = {s.name for s in Model(RETRACT_CATCH_UP, Scope()).sometimes()}
    assert {"flip_on_retracts", "reprefill_with_draft"} <= names
    assert "draft_catch_up" not in names
    twin = get_design("no_draft_work_while_off")
    same = {"name": twin.name, "kind": twin.kind, "summary": twin.summary, "source": twin.source,
            "expected_invariant": twin.expected_invariant, "sglang_line": twin.sglang_line}
    assert attrs.evolve(RETRACT_CATCH_UP, draft_while_off=DraftWhileOff.NONE, **same) == twin
    verdict = run_design(twin)
    assert verdict.verdict == "refuted" and verdict.invariant == "draft_kv_covers_prefix"
    assert any(step.action.name == "flip_on" for step in verdict.result.trace)


def test_catch_up_by_retraction_must_retract_the_batch_prefilled_while_off(monkeypatch) -> None:
    """Retracting only the running batch at flip-on leaves a batch prefilled while off (no draft KV), merged
    just after, to draft on a stale KV: the checker finds it."""
    release = actions._release_to_waiting

    def running_only(state, rids, **kwargs):
        pending = state.pending.rids if state.pending is not None else ()
        return release(state, tuple(rid for rid in rids if rid not in pending), **kwargs)

    monkeypatch.setattr(actions, "_release_to_waiting", running_only)
    result = check(Model(RETRACT_CATCH_UP, Scope()))
    assert result.violations[0].invariant == "draft_kv_covers_prefix"
    assert [s.action.name for s in result.trace][-4:-2] == ["flip_on", "merge_batch"]


def _violation_within(model: Model, depth: int) -> bool:
    """Depth-limited DFS, independent of the BFS: is any violation reachable in <= depth steps?"""
    def dfs(state, left: int) -> bool:
        if left == 0:
            return False
        for action in model.actions(state):
            nxt = model.next_state(state, action)
            if model.check_step(state, action, nxt) or dfs(nxt, left - 1):
                return True
        return False
    return any(dfs(s, depth) for s in model.init_states())


@pytest.mark.parametrize("name", ["seeds_attempt1_spec_info_left", "seq_lens_advanced_twice",
                                  "draft_kv_never_freed"])
def test_counterexample_is_shortest(name: str) -> None:
    design = get_design(name)
    model = Model(design, Scope())
    result = check(model)
    length = len(result.trace)
    assert _violation_within(model, length)
    assert not _violation_within(model, length - 1), f"a violation exists in fewer than {length} steps"


def test_trace_replays_through_the_model() -> None:
    design = get_design("merge_unchecked_spec_info")
    model = Model(design, Scope())
    result = check(model)
    state = replay_trace(model, result.initial, result.trace)
    assert model.check_state(state)[0].invariant == design.expected_invariant


def test_shipped_design_on_a_scope_without_flips_fails_as_vacuous() -> None:
    # one short request never reaches t_off=4: the flip properties are never exercised
    scope = attrs.evolve(Scope(), requests=(RequestSpec(1, 2),))
    design = attrs.evolve(SEEDS_FINAL, policy=ThresholdPolicy((4,), (3,)))
    verdict = judge(design, scope, check(Model(design, scope)))
    assert verdict.verdict == "fail"
    assert "flip_off" in verdict.result.vacuous and "never reached" in verdict.reason


def test_deadlock_fails_eventually() -> None:
    # a pool too small for the longest prompt: its chunked prefill holds the pool and nothing can move
    scope = attrs.evolve(Scope(), kv_pool_size=2)
    verdict = judge(SEEDS_FINAL, scope, check(Model(SEEDS_FINAL, scope)))
    assert verdict.verdict == "fail"
    assert verdict.result.eventually_failed == ("all_requests_finish",)


def test_a_design_that_may_flip_at_any_demand_is_checked_for_deadlock_too() -> None:
    # `auto` enables a flip in every state, so it never reaches a state with no action: the checker before
    # Model.at_rest never checked `eventually` on it. The same too-small pool deadlocks it with flips still enabled.
    design = get_design("plain_off_retract_catch_up_auto")
    scope = attrs.evolve(Scope(), kv_pool_size=2)
    result = check(Model(design, scope))
    assert result.eventually_failed == ("all_requests_finish",) and result.eventually_trace
    state = replay_trace(Model(design, scope), result.initial, result.eventually_trace)
    assert Model(design, scope).actions(state) and Model(design, scope).at_rest(state)
    assert {a.name for a in Model(design, scope).actions(state)} <= {"flip_off", "flip_on"}


def test_a_shipped_design_whose_eventually_holds_vacuously_fails(every_verdict) -> None:
    verdict = every_verdict["plain_off_retract_catch_up_auto"]
    assert verdict.result.states_at_rest > 0
    emptied = judge(verdict.design, verdict.scope, attrs.evolve(verdict.result, states_at_rest=0))
    assert emptied.verdict == "fail" and "no state at rest" in emptied.reason


def test_known_bad_with_no_violation_is_not_refuted() -> None:
    # the same bad design, judged in a scope where its bug cannot show (no flip ever happens)
    design = get_design("seeds_attempt1_spec_info_left")
    scope = attrs.evolve(Scope(), requests=(RequestSpec(1, 2),))
    verdict = judge(design, scope, check(Model(attrs.evolve(design, policy=ThresholdPolicy((4,), (3,))), scope)))
    assert verdict.verdict == "not-refuted"


def test_report_names_the_invariant_and_numbers_the_steps() -> None:
    verdict = run_design(get_design("seeds_attempt1_spec_info_left"))
    text = report_markdown(verdict)
    assert "**Verdict: refuted**" in text and "`spec_info_matches_mode`: **broken**" in text
    assert "\n1. arrive(0)\n" in text and "plain_decode" in text


def test_cli_json_matches_the_schema(capsys) -> None:
    code = main(["check", "--json", "--design", "seeds_attempt2_tuple_unpack", "--design", "draft_kv_never_freed"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in data["designs"]] == ["seeds_attempt2_tuple_unpack", "draft_kv_never_freed"]
    for d in data["designs"]:
        assert set(d) >= {"name", "kind", "verdict", "invariant", "trace", "states"}
        assert d["kind"] == "known-bad" and d["verdict"] == "refuted" and isinstance(d["states"], int)
        assert all(isinstance(step, str) for step in d["trace"])


def test_cli_json_keeps_stdout_for_the_json_and_progress_on_stderr(capsys) -> None:
    code = main(["check", "--json", "--jobs", "1", "--design", "draft_kv_never_freed"])
    captured = capsys.readouterr()
    assert code == 0
    assert [d["name"] for d in json.loads(captured.out)["designs"]] == ["draft_kv_never_freed"]
    assert "draft_kv_never_freed" in captured.err and "1/1 designs as expected" in captured.err


def test_cli_check_reports_needs_every_design(capsys) -> None:
    assert main(["check", "--check-reports", "--design", "draft_kv_never_freed"]) == 2
    assert "--check-reports" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # an argparse type check: one line, exit 2
        main(["check", "--jobs", "0", "--design", "draft_kv_never_freed"])
    assert exc.value.code == 2 and "--jobs" in capsys.readouterr().err


def test_cli_unknown_design_is_a_clear_error(capsys) -> None:
    assert main(["check", "--design", "nope"]) == 2
    assert "no design named 'nope'" in capsys.readouterr().err


def test_every_design_has_a_unique_name_and_a_source() -> None:
    names = [d.name for d in ALL_DESIGNS]
    assert len(names) == len(set(names))
    assert all(d.source and d.summary for d in ALL_DESIGNS)
    assert all(d.expected_invariant for d in KNOWN_BAD) and not any(d.expected_invariant for d in SHIPPED)


# ----------------------------------------------------------------------------------------------
# The overlap schedule: `specflip check --overlap`


@pytest.mark.parametrize("design", OVERLAP_KNOWN_BAD, ids=lambda d: d.name)
def test_overlap_known_bad_design_is_refuted_with_its_invariant(design) -> None:
    verdict = run_design(design, overlap_scope(design))
    assert verdict.verdict == "refuted", verdict.reason
    assert verdict.invariant == design.expected_invariant
    # and without the overlap schedule the same design is not refuted that way: the bug is overlap's
    assert check(Model(design, Scope()), max_states=20_000).violations == ()


def test_overlap_adaptive_design_passes_without_vacuity() -> None:
    design = get_design("sglang_adaptive_warm_overlap")
    verdict = run_design(design, overlap_scope(design))
    assert verdict.verdict == "pass", verdict.reason
    reached = verdict.result.sometimes_reached
    assert reached["process_result"] and reached["second_launch"] and reached["finished_runs_next"]
    assert reached["result_after_prepare"] and reached["released_before_launch"]


# The overlap shipped and candidate designs (0.3-1.3M states, 14-57 s each on one core) are exhausted by
# scripts/test.sh, `specflip check --overlap --check-reports`, in its process pool: each as expected, its report as
# committed.


def test_cli_overlap_checks_the_overlap_designs(capsys) -> None:
    code = main(["check", "--overlap", "--no-reports", "--design", "reserve_1x_under_overlap"])
    out = capsys.readouterr().out
    assert code == 0 and "reserve_1x_under_overlap" in out and "refuted" in out


def test_search_on_a_small_graph_yields_every_edge_in_order_and_shortest_paths() -> None:
    """proofs.bfs.Search by itself (the checker's and the diagrams' core), on a graph small enough to state every
    edge: two roots (one given twice), a diamond with a back edge, a node reached at depth 3. Every edge out of every
    expanded node in breadth-first order, marked new or not with the node kept for its key; `path` is the shortest,
    through the first node found for each key, with a key or without; `max_nodes` drops what lies beyond it and says
    so. Mutation testing (docs/mutation.md) found `path` without a key and the bound untested by the checker's tests."""
    a, b, c = Action("a"), Action("b"), Action("c")
    graph = {0: [(a, 1), (b, 2)], 1: [(a, 3)], 2: [(a, 3), (c, 0)], 3: [(b, 4)], 4: [], 10: [(a, 4)]}
    search = Search([0, 10, 0], lambda n: graph[n])
    assert search.roots == [0, 10] and len(search) == 2
    edges = list(search.edges())
    assert edges == [(0, a, 1, True, 1), (0, b, 2, True, 2), (10, a, 4, True, 4), (1, a, 3, True, 3),
                     (2, a, 3, False, 3), (2, c, 0, False, 0), (3, b, 4, False, 4)]
    assert len(search) == 6 and search.max_depth == 2 and search.truncated is False
    alone = Search([4], lambda n: graph[n])  # a root with no edge: depth 0
    assert list(alone.edges()) == [] and alone.max_depth == 0 and alone.path(4) == (4, [])
    assert search.path(3) == (0, [(a, 1), (a, 3)])
    assert search.path(4) == (10, [(a, 4)]) and search.path(0) == (0, [])
    # keyed by parity: the first node found with a key is the one kept, expanded and walked through
    keyed = Search([0], lambda n: graph[n], key=lambda n: n % 2)
    assert [(x, y, new, kept) for x, _, y, new, kept in keyed.edges()] == [(0, 1, True, 1), (0, 2, False, 0),
                                                                           (1, 3, False, 1)]
    assert keyed.path(3) == (0, [(a, 1)]) and keyed.max_depth == 1
    # bounded: nodes found beyond max_nodes are neither kept nor expanded
    bounded = Search([0], lambda n: graph[n], max_nodes=2)
    assert [(y, new, kept) for _, _, y, new, kept in bounded.edges()] == [(1, True, 1), (2, False, None),
                                                                          (3, False, None)]
    assert bounded.truncated and len(bounded) == 2
    # an edge after a dropped one is still yielded (the checker still judges its step): here into a node kept before
    # (mutation testing: `continue` made `break` there survived every test)
    after_drop = {0: [(a, 1), (b, 2), (c, 0)], 1: []}
    assert [(y, new, kept) for _, _, y, new, kept in Search([0], lambda n: after_drop[n], max_nodes=2).edges()] == [
        (1, True, 1), (2, False, None), (0, False, 0)]


def test_check_reports_progress_every_n_new_states() -> None:
    """`check(progress=..., progress_every=n)` calls back after each n more states kept (states, transitions, depth so
    far), never more often, and passes the callback on: what `specflip check` prints to stderr on long runs
    (mutation testing found it reached by no fast test: the designs the tests check stay under the default 50,000)."""
    calls: list[tuple[int, int, int]] = []
    result = check(Model(SEEDS_FINAL, Scope(requests=(RequestSpec(4, 3), RequestSpec(2, 2)))),
                   progress=lambda *a: calls.append(a), progress_every=40)
    assert result.complete and not result.refuted and result.states >= 120
    assert len(calls) == result.states // 40
    assert [s for s, _, _ in calls] == [40 * k for k in range(1, len(calls) + 1)]  # at each 40th new state
    assert all(t >= s - 1 for s, t, _ in calls) and [d for _, _, d in calls] == sorted(d for _, _, d in calls)
    assert check(Model(SEEDS_FINAL, Scope(requests=(RequestSpec(4, 3),))), progress_every=40).complete  # none given


def test_check_counts_the_states_at_rest_and_stops_at_max_states() -> None:
    """What `check` reports beside its verdict, held to an independent walk of the same model (proofs.bfs.Search, the
    model's dedup key): `states_at_rest` is the number of states kept that are at rest (where `eventually` is
    checked), `transitions` the edges walked, a design that passes has no trace and no `eventually` trace, and
    `max_states` stops the search there, incomplete (mutation testing: the fast checker tests read none of these
    exactly)."""
    import time

    model = Model(SEEDS_FINAL, Scope(requests=(RequestSpec(4, 3), RequestSpec(2, 2))))
    started, cpu_started = time.perf_counter(), time.process_time()
    result = check(model)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    # its own clocks: within the call's (the checker's speed is measured in bench/, never asserted here)
    assert 0 < result.seconds <= wall and 0 < result.cpu_seconds <= cpu
    walk = Search(model.init_states(), model_successors(model), key=model.dedup_key)
    edges = sum(1 for _ in walk.edges())
    at_rest = sum(1 for *_, state in walk.parent.values() if model.at_rest(state))
    assert result.complete and not result.refuted and result.states == len(walk) and result.transitions == edges
    assert result.trace == () and result.violations == () and result.max_depth == walk.max_depth
    assert result.states_at_rest == at_rest > 0
    assert result.eventually_failed == () and result.eventually_trace == ()
    bounded = check(model, max_states=50)
    assert bounded.complete is False and bounded.states == 50 and not bounded.refuted


def test_a_bad_initial_state_is_the_counterexample_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """An initial state that breaks a state invariant is refuted at once: no step, the initial state named (mutation
    testing: no design of the repo starts broken, so no test read `initial` there)."""
    bad = Violation("kv_conservation", "broken from the start", ())
    monkeypatch.setattr(Model, "check_state", lambda self, state: [bad])
    model = Model(SEEDS_FINAL, Scope(requests=(RequestSpec(2, 2),)))
    result = check(model)
    assert result.refuted and result.violations == (bad,) and result.trace == ()
    assert result.initial == model.init_states()[0] and result.design == SEEDS_FINAL.name and result.transitions == 0
