"""The random-walk checking strategy (`proofs/simulation.py`, `specflip check --simulate`): it refutes the known-bad
designs with their own invariants, its walks are real steps of the model and a function of the seed, a shipped
design survives without being called proven, and a state at rest that fails `eventually` is caught."""

from __future__ import annotations

import json

import attrs
import pytest

from proofs.simulation import Walks, simulate
from proofs.verdicts import judge_walks
from specflip.cli import main
from statemodel.design import Scope
from statemodel.designs import (
    KNOWN_BAD,
    OVERLAP_KNOWN_BAD,
    SEEDS_FINAL,
    SHIPPED,
    get_design,
    large_scope,
    overlap_scope,
)
from statemodel.model import Model
from tests.model_helpers import replay_trace

# the tree's own known-bad designs (retract_catch_up_radix_unmarked, ..._evict_at_flip_on) take 3,600-4,500 walks
# of seed 0: a bug few paths reach, where BFS is the faster strategy (docs/model.md, "Random walks")
FEW_WALKS = Walks(walks=2_000, seed=0)


@pytest.mark.parametrize("design", KNOWN_BAD, ids=lambda d: d.name)
def test_random_walks_refute_each_known_bad_design_with_its_invariant(design) -> None:
    verdict = judge_walks(design, Scope(), simulate(Model(design, Scope()), FEW_WALKS))
    assert verdict.verdict == "refuted", verdict.reason
    assert verdict.invariant == design.expected_invariant and "not proven the shortest" in verdict.reason


@pytest.mark.parametrize("design", OVERLAP_KNOWN_BAD, ids=lambda d: d.name)
def test_random_walks_refute_overlap_known_bad_designs(design) -> None:
    scope = overlap_scope(design)
    verdict = judge_walks(design, scope, simulate(Model(design, scope), Walks(walks=20_000)))
    assert verdict.verdict == "refuted", verdict.reason


def test_a_walks_counterexample_replays_through_the_model_and_is_no_shorter_than_bfs() -> None:
    from proofs.bfs import check

    design = get_design("merge_unchecked_spec_info")
    model = Model(design, Scope())
    result = simulate(model, FEW_WALKS).result
    state = replay_trace(model, result.initial, result.trace)
    assert model.check_state(state)[0].invariant == design.expected_invariant
    assert len(result.trace) >= len(check(model).trace) and not result.complete


def test_the_walks_are_a_function_of_the_seed() -> None:
    model = Model(get_design("merge_unchecked_spec_info"), Scope())
    first, again = simulate(model, Walks(seed=7)), simulate(model, Walks(seed=7))
    assert first.walks_run == again.walks_run
    assert [s.action for s in first.result.trace] == [s.action for s in again.result.trace]
    others = {simulate(model, Walks(seed=seed)).walks_run for seed in range(8)}
    assert len(others) > 1  # the seed does choose the walks


@pytest.mark.parametrize("name", ["seeds_final", "retract_catch_up_radix_unmarked"])
def test_the_steps_kept_across_walks_change_no_walk(name) -> None:
    # kept_steps=0 works every step out afresh; 50 keeps a few and then works the rest out again: each must give the
    # walks, transitions, distinct states and counterexample of the default (a shipped design's 400 clean walks, and
    # a known-bad one's 3,604 walks to its bug, most of them retaking kept steps)
    model = Model(get_design(name), Scope())
    settings = Walks(walks=400 if name == "seeds_final" else 5_000, seed=0, shrink=False)
    runs = [simulate(model, attrs.evolve(settings, kept_steps=n)) for n in (Walks().kept_steps, 0, 50)]
    seen = {(r.walks_run, r.result.transitions, r.result.states, tuple(r.ended.items()),
             tuple((s.action, s.state) for s in r.result.trace)) for r in runs}
    assert len(seen) == 1, seen


@pytest.mark.parametrize("design", KNOWN_BAD, ids=lambda d: d.name)
def test_the_shrink_through_the_steps_the_walks_kept_gives_what_it_gives_without_them(design) -> None:
    # the shrinker looks up the steps the walks checked clean (and their states' enabled actions) before working
    # them out: with none kept (kept_steps=0) it works every one out, and must shrink to the same counterexample in
    # as many replays
    model = Model(design, Scope())
    for seed in range(3):
        kept, fresh = (simulate(model, Walks(walks=5_000, seed=seed, kept_steps=n)) for n in (Walks().kept_steps, 0))
        assert kept.found_steps == fresh.found_steps and kept.shrink_replays == fresh.shrink_replays
        assert kept.result.initial == fresh.result.initial and kept.result.violations == fresh.result.violations
        assert [(s.action, s.state) for s in kept.result.trace] == [(s.action, s.state) for s in fresh.result.trace]


def test_a_shipped_design_survives_and_is_not_called_proven() -> None:
    design = SHIPPED[0]
    sim = simulate(Model(design, Scope()), Walks(walks=300, seed=3))
    verdict = judge_walks(design, Scope(), sim)
    assert verdict.verdict == "survived" and verdict.ok and "not a proof" in verdict.reason
    assert sim.walks_run == 300 and sim.result.states > 100 and not sim.result.complete
    assert sim.result.max_depth <= Walks().max_depth


def test_a_state_at_rest_that_fails_eventually_is_caught() -> None:
    # a pool too small for the longest prompt: its chunked prefill holds the pool and nothing can move
    scope = attrs.evolve(Scope(), kv_pool_size=2)
    verdict = judge_walks(SEEDS_FINAL, scope, simulate(Model(SEEDS_FINAL, scope), FEW_WALKS))
    assert verdict.verdict == "fail" and verdict.result.eventually_failed == ("all_requests_finish",)
    assert verdict.result.eventually_trace  # the walk that got stuck


def test_walks_of_a_design_that_may_flip_at_any_demand_end_at_rest_not_going_round() -> None:
    # `auto` enables a flip in every state: without the rest check and the loop avoidance its walks spent their
    # depth flipping off and on, never ending where `eventually` is checked
    design = get_design("plain_off_retract_catch_up_auto")
    sim = simulate(Model(design, Scope()), Walks(walks=100, seed=5))
    assert sim.ended == {"at rest": 100, "looped": 0, "depth": 0}
    assert sim.result.max_depth < Walks().max_depth


def test_a_walk_stops_at_its_depth() -> None:
    sim = simulate(Model(SHIPPED[0], Scope()), Walks(walks=50, max_depth=3))
    assert sim.result.max_depth == 3 and sim.walks_run == 50


def test_the_large_scope_is_larger_and_the_walks_refute_there_too() -> None:
    design = get_design("retract_catch_up_radix_unmarked")  # a bug few paths reach in the default scope
    scope = large_scope(design)
    assert len(scope.requests) > len(Scope().requests) and scope.kv_pool_size > Scope().kv_pool_size
    assert large_scope(get_design("sglang_adaptive_warm")).kv_pool_size > scope.kv_pool_size  # its double reserve
    assert large_scope(design, overlap=True).overlap
    verdict = judge_walks(design, scope, simulate(Model(design, scope), FEW_WALKS))
    assert verdict.verdict == "refuted", verdict.reason
    shipped = SHIPPED[0]
    sim = simulate(Model(shipped, large_scope(shipped)), Walks(walks=100, seed=2))
    assert judge_walks(shipped, large_scope(shipped), sim).verdict == "survived"


def test_cli_simulate_refutes_and_writes_no_report(capsys, tmp_path) -> None:
    code = main(["check", "--simulate", "500", "--seed", "1", "--json", "--reports-dir", str(tmp_path),
                 "--design", "seq_lens_advanced_twice", "--design", "draft_kv_never_freed"])
    captured = capsys.readouterr()
    assert code == 0
    data = json.loads(captured.out)["designs"]
    assert [d["verdict"] for d in data] == ["refuted", "refuted"]
    assert all(d["found_steps"] >= len(d["trace"]) > 0 for d in data)  # the shrunk trace, and the walk's length
    assert "not proven the shortest" in data[0]["reason"] and list(tmp_path.iterdir()) == []


def test_cli_simulate_exits_1_when_a_known_bad_design_survives(capsys) -> None:
    # one walk of depth 2 reaches no bug: the verdict is unexpected, a finding
    assert main(["check", "--simulate", "1", "--depth", "2", "--design", "no_draft_work_while_off"]) == 1
    assert "not-refuted" in capsys.readouterr().out


def test_cli_simulate_bad_usage_is_one_line(capsys) -> None:
    assert main(["check", "--seed", "3", "--design", "draft_kv_never_freed"]) == 2
    assert "--simulate" in capsys.readouterr().err
    assert main(["check", "--simulate", "10", "--check-reports"]) == 2
    assert "--check-reports" in capsys.readouterr().err
    assert main(["check", "--scope", "large", "--design", "draft_kv_never_freed"]) == 2
    assert "--simulate" in capsys.readouterr().err
    for bad in (["--simulate", "0"], ["--simulate", "x"], ["--simulate", "5", "--depth", "0"],
                ["--simulate", "5", "--seed", "-1"], ["--simulate", "5", "--scope", "huge"]):
        with pytest.raises(SystemExit) as exc:
            main(["check", *bad, "--design", "draft_kv_never_freed"])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and len(err.strip().splitlines()) == 1


def test_cli_help_states_the_walks_default_depth(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    assert f"(default {Walks().max_depth})" in " ".join(capsys.readouterr().out.split())


def _assert_real_counterexample(model: Model, result, invariant: str) -> None:
    """Each step enabled where taken and the state the model reaches (replay_trace), no step before the last breaking
    anything, the last breaking `invariant`."""
    state = result.initial
    replay_trace(model, state, result.trace)
    for i, step in enumerate(result.trace):
        bad = model.check_step(state, step.action, step.state)
        if i < len(result.trace) - 1:
            assert not bad, f"step {i + 1} of {len(result.trace)} already breaks {bad[0].invariant}"
        else:
            assert bad and bad[0].invariant == invariant and list(result.violations) == bad
        state = step.state


@pytest.mark.parametrize("design", KNOWN_BAD, ids=lambda d: d.name)
def test_a_shrunk_counterexample_is_real_breaks_the_same_invariant_and_is_no_longer(design) -> None:
    model = Model(design, Scope())
    for seed in range(3):
        sim = simulate(model, Walks(walks=5_000, seed=seed))
        _assert_real_counterexample(model, sim.result, design.expected_invariant)
        assert len(sim.result.trace) <= sim.found_steps and sim.shrink_replays > 0


def test_shrinking_takes_a_walk_down_to_the_shortest_counterexample_where_it_can() -> None:
    from proofs.bfs import check

    design = get_design("seeds_attempt1_spec_info_left")
    model = Model(design, Scope())
    raw, shrunk = simulate(model, Walks(seed=0, shrink=False)), simulate(model, Walks(seed=0))
    # the same walk: shrinking starts from what the walks found
    assert raw.walks_run == shrunk.walks_run and raw.found_steps == shrunk.found_steps == len(raw.result.trace)
    assert raw.shrink_replays == 0 and raw.result.trace[-1].action == shrunk.result.trace[-1].action
    assert len(raw.result.trace) == 14 and len(shrunk.result.trace) == len(check(model).trace) == 7
    _assert_real_counterexample(model, raw.result, design.expected_invariant)


@pytest.mark.parametrize("name", ["seeds_attempt1_spec_info_left", "seq_lens_advanced_twice"])
def test_the_shrink_moves_a_counterexample_only_to_an_earlier_initial_state(name) -> None:
    # the same actions from a later initial state are no simpler: trying those (as the shrink once did) moved seed
    # 2's walk from initial state 0 to 1 and left it 8 steps long; only earlier ones leave BFS's 7
    model = Model(get_design(name), Scope())
    inits = model.init_states()
    for seed in range(5):
        raw, shrunk = (simulate(model, Walks(seed=seed, shrink=s)).result for s in (False, True))
        assert inits.index(shrunk.initial) <= inits.index(raw.initial)
        assert len(shrunk.trace) == 7, (seed, len(shrunk.trace))


def test_a_state_at_rest_that_fails_eventually_is_shrunk_to_one_that_still_fails() -> None:
    scope = attrs.evolve(Scope(), kv_pool_size=2)
    model = Model(SEEDS_FINAL, scope)
    for seed in range(3):
        sim = simulate(model, Walks(walks=200, seed=seed))
        result = sim.result
        assert result.eventually_failed == ("all_requests_finish",) and not result.violations
        last = replay_trace(model, result.initial, result.eventually_trace)
        finish_all = next(e for e in model.eventually() if e.name == "all_requests_finish")
        assert model.at_rest(last) and not finish_all.holds(last)
        assert len(result.eventually_trace) <= sim.found_steps and sim.shrink_replays > 0


def test_cli_no_shrink_needs_simulate(capsys) -> None:
    assert main(["check", "--no-shrink", "--design", "seq_lens_advanced_twice"]) == 2
    assert "--no-shrink" in capsys.readouterr().err


def test_the_shrink_keeps_only_candidates_that_break_the_invariant_it_was_given() -> None:
    from proofs.shrink import shrink
    from statemodel.invariants import Violation

    model = Model(get_design("seeds_attempt1_spec_info_left"), Scope())
    found = simulate(model, Walks(seed=0, shrink=False)).result  # 14 steps, breaks spec_info_matches_mode
    steps = [(s.action, s.state) for s in found.trace]
    assert len(shrink(model, found.initial, steps, found.violations).steps) == 7
    # asked to keep another invariant, no shorter candidate breaks it (they break spec_info_matches_mode): unchanged
    other = shrink(model, found.initial, steps, [Violation("kv_conservation", "as if")])
    assert list(other.steps) == steps and other.violations[0].invariant == "kv_conservation"


def test_the_shrink_keeps_no_candidate_where_another_invariant_breaks_first() -> None:
    import random

    from proofs.shrink import shrink

    # a path that goes on past its first violation: seeds_attempt2's step 8 breaks shapes_agree, step 9
    # kv_conservation (seed 0 of this walk that does not stop)
    model = Model(get_design("seeds_attempt2_tuple_unpack"), Scope())
    rng, state, steps, broken = random.Random(0), model.init_states()[0], [], []
    while len(steps) < 9:
        actions = model.actions(state)
        action = actions[rng.randrange(len(actions))]
        after = model.next_state(state, action)
        steps.append((action, after))
        broken.append([v.invariant for v in model.check_step(state, action, after)])
        state = after
    assert broken[7][0] == "shapes_agree" and broken[8][0] == "kv_conservation" and not any(broken[:7])
    last = model.check_step(steps[7][1], *steps[8])
    shrunk = shrink(model, model.init_states()[0], steps, last)
    # every shorter path to kv_conservation breaks shapes_agree on the way: none is kept
    assert list(shrunk.steps) == steps and shrunk.initial == model.init_states()[0]
