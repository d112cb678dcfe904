"""Each action's effect, on paths through the real transition function."""

from __future__ import annotations

import random

import attrs
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from statemodel.actions import ACTION_CATALOGUE, Action, apply, enabled, initial_states, prefill_action
from statemodel.design import Design, RequestSpec, Scope
from statemodel.designs import (
    ADAPTIVE_WARM,
    ALL_DESIGNS,
    CATCH_UP,
    RETRACT_CATCH_UP,
    SEEDS_FINAL,
    SYNC_V2,
    V2_SWITCH,
    get_design,
)
from statemodel.invariants import check_state
from statemodel.state import ForwardMode, SpecInfoKind, SpecMode, Stage, Status
from tests.model_helpers import initial_with, model_for, take, walk


def test_chunked_prefill_takes_two_steps_and_commits_the_first_token() -> None:
    m = model_for(SEEDS_FINAL)
    s = walk(m, initial_with(m, 4, 3), ["arrive", "prefill"])
    r0 = s.req(0)
    assert r0.status is Status.PREFILLING and r0.prefilled_len == 2 and r0.committed == 0
    assert s.launched is not None and s.launched.forward_mode is ForwardMode.EXTEND
    assert s.launched.out_cache_loc_width == 2
    s = walk(m, s, ["prefill"])
    r0 = s.req(0)
    assert r0.status is Status.RUNNING and r0.seq_len == 3 and r0.committed == 1 and r0.draft_current
    assert s.pending is not None and s.pending.spec_info.kind is SpecInfoKind.DRAFT_INPUT


def test_prefill_of_the_scheduler_picks_is_the_model_prefill() -> None:
    """The guard's prefill (the requests and chunks SGLang picked) moves the state as the model's own does
    for the same picks, and a pick the model would not make (a smaller chunk) is followed as given."""
    m = model_for(SEEDS_FINAL)
    s = walk(m, initial_with(m, 4, 3), ["arrive", "arrive"])
    own = walk(m, s, ["prefill"])
    assert s.launched is None
    assert own.launched is not None
    picks = [(rid, own.req(rid).prefilled_len) for rid in own.launched.rids]
    assert apply(s, prefill_action(picks), m.design, m.scope) == own
    assert s.req(0).prefill_target == 3
    smaller = apply(s, prefill_action([(0, 1)]), m.design, m.scope)
    assert smaller.req(0).prefilled_len == 1 and smaller.req(0).status is Status.PREFILLING
    assert smaller.req(1).status is Status.WAITING and smaller.kv_free == s.kv_free - 1 and smaller.pending is None
    assert prefill_action([(0, 1)]).describe() == "prefill(tokens={0: 1})"
    whole = apply(s, prefill_action([(1, s.req(1).prefill_target)]), m.design, m.scope)
    assert whole.req(1).status is Status.RUNNING and whole.pending is not None and whole.pending.rids == (1,)


def test_speculative_round_grows_seq_len_by_accepted_plus_one() -> None:
    m = model_for(SEEDS_FINAL)
    s = walk(m, initial_with(m, 4, 3), ["arrive", "prefill", "prefill", "merge_batch", "prepare_for_decode"])
    assert s.req(0).kv_reserved == 3  # steps 2 + bonus
    s = take(m, s, Action("draft", (2,)))
    assert s.launched.forward_mode is ForwardMode.TARGET_VERIFY and s.launched.out_cache_loc_width == 3
    assert s.launched.graph is not None and s.launched.graph.tokens_per_req == 3
    s = take(m, s, Action("verify", (1,)))
    r0 = s.req(0)
    assert (r0.seq_len, r0.committed, r0.kv_held, r0.kv_reserved) == (5, 3, 5, 1)
    assert not r0.draft_hidden_ready
    s = walk(m, s, ["draft_extend"])
    assert s.req(0).draft_current and s.stage is Stage.SCHEDULE
    assert s.running.spec_info.kind is SpecInfoKind.DRAFT_INPUT


@pytest.mark.parametrize(("design", "seq_len"), [(SEEDS_FINAL, 5), (CATCH_UP, 6), (V2_SWITCH, 6)],
                         ids=lambda x: getattr(x, "name", str(x)))
def test_a_request_finishing_mid_round_stops_its_output_and_its_worker_decides_seq_len(design: Design,
                                                                                      seq_len: int) -> None:
    """Request 0 (prompt 3, max_new_tokens 3) has 1 output and room for 2; its verify accepts 2 drafts + the
    bonus. The output stops at 3 on every line; the v1 worker cuts seq_len (and the KV) there too, the v2
    worker (0.5.16+) takes the whole run past it. The finish then frees all of it."""
    m = model_for(design)
    s = walk(m, initial_with(m, 4, 3), ["arrive", "prefill", "prefill", "merge_batch", "prepare_for_decode"])
    assert (s.req(0).seq_len, s.req(0).committed, s.req(0).kv_reserved) == (3, 1, 3)
    s = take(m, s, Action("draft", (2,)))
    verify = Action("verify", (2,))
    after = take(m, s, verify)
    r0 = after.req(0)
    assert (r0.committed, r0.seq_len, r0.kv_held, r0.kv_reserved) == (3, seq_len, seq_len, 6 - seq_len) and r0.done
    assert m.check_step(s, verify, after) == []
    s = walk(m, after, ["draft_extend", "finish"])
    assert s.req(0).status is Status.FINISHED and s.kv_free == s.kv_pool_size and m.check_state(s) == []


def test_the_v1_line_cuts_a_verify_at_the_finish_and_the_v2_lines_do_not() -> None:
    """Each design describes one worker: 0.5.12's v1 EagleVerifyInput.verify cuts the accepted run at the
    finish; 0.5.16 / 0.5.23's v2 run_eagle_verify adds the whole run to seq_lens."""
    for design in ALL_DESIGNS:
        assert design.verify_advances_past_finish is (design.sglang_line != "0.5.12"), design.name


def test_verify_offers_every_accept_count_per_request() -> None:
    m = model_for(ADAPTIVE_WARM)
    s = walk(m, m.init_states()[0], ["arrive", "prefill", "prefill", "arrive", "merge_batch", "prefill",
                                      "merge_batch", "prepare_for_decode"])
    assert s.running.size == 2
    s = take(m, s, Action("draft", (1,)))
    assert sorted(a.args for a in m.actions(s)) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_flip_off_releases_the_reserve_and_strips_the_batch() -> None:
    m = model_for(CATCH_UP)
    s = walk(m, initial_with(m, 2, 1), ["arrive", "prefill", "prefill", "merge_batch", "prepare_for_decode",
                                         "draft", "verify", "draft_extend", "arrive"])
    reserved = s.req(0).kv_reserved
    assert reserved > 0 and Action("flip_off") in m.actions(s)
    off = take(m, s, Action("flip_off"))
    assert off.spec_mode is SpecMode.OFF and off.req(0).kv_reserved == 0
    assert off.kv_free == s.kv_free + reserved
    assert off.running.spec_info.kind is SpecInfoKind.NONE and not off.running.spec_algorithm_on


def test_plain_step_is_a_real_decode_and_catch_up_runs_at_flip_on() -> None:
    m = model_for(CATCH_UP)
    s = walk(m, initial_with(m, 2, 1), ["arrive", "prefill", "prefill", "merge_batch", "arrive", "flip_off",
                                         "prepare_for_decode"])
    assert s.running.out_cache_loc_width == 1
    s = take(m, s, Action("plain_decode"))
    assert s.launched.forward_mode is ForwardMode.DECODE and s.launched.spec_info.kind is SpecInfoKind.NONE
    assert s.launched.graph is not None and s.launched.graph.tokens_per_req == 1
    assert s.req(0).draft_kv_len == 3 and s.req(0).seq_len == 4  # the draft fell behind by one token
    assert s.stage is Stage.SCHEDULE  # no draft sync in this design


def test_sync_design_runs_draft_sync_after_every_plain_step() -> None:
    m = model_for(SYNC_V2)
    s = walk(m, initial_with(m, 2, 1), ["arrive", "prefill", "prefill", "merge_batch", "arrive", "flip_off",
                                         "prepare_for_decode", "plain_decode"])
    assert s.stage is Stage.DECODED and enabled(s, SYNC_V2, Scope()) == [Action("draft_sync")]
    s = walk(m, s, ["draft_sync"])
    assert s.req(0).draft_current


def test_retract_keeps_committed_output_and_frees_everything() -> None:
    scope = attrs.evolve(Scope(), kv_pool_size=9)
    m = model_for(SEEDS_FINAL, scope)
    s = initial_with(m, 4, 3)
    s = walk(m, s, ["arrive", "prefill", "prefill", "merge_batch", "prepare_for_decode", "draft", "verify",
                    "draft_extend", "arrive", "prefill", "merge_batch"])
    # two requests each want a reserve of 3 for the next speculative step; 9 slots cannot hold that
    assert any(a.name == "retract" for a in m.actions(s)), [a.describe() for a in m.actions(s)]
    before = s.req(0)
    s = take(m, s, Action("retract", (0,)))
    r0 = s.req(0)
    assert r0.status is Status.WAITING and r0.committed == before.committed
    assert (r0.kv_held, r0.kv_reserved, r0.seq_len) == (0, 0, 0)
    assert 0 not in s.running.rids and s.running.spec_info.rows == s.running.size


def test_flip_on_by_retraction_retracts_running_requests_and_their_prefill_catches_the_draft_up() -> None:
    # request 1 finishes while off, so demand falls to t_on with request 0 running and its draft behind
    m = model_for(RETRACT_CATCH_UP, attrs.evolve(Scope(), requests=(RequestSpec(2, 4), RequestSpec(1, 2))))
    s = walk(m, initial_with(m, 2, 1), ["arrive", "prefill", "merge_batch", "arrive", "flip_off", "prefill",
                                         "merge_batch", "prepare_for_decode", "plain_decode", "finish",
                                         "filter_batch"])
    before = s.req(0)
    assert before.status is Status.RUNNING and not before.draft_current and before.committed == 2
    assert not any(a.name == "draft_catch_up" for a in m.actions(s))
    on = take(m, s, Action("flip_on"))
    r0 = on.req(0)
    assert on.spec_mode is SpecMode.ON and on.running.rids == ()
    assert r0.status is Status.WAITING and r0.committed == before.committed
    assert (r0.kv_held, r0.kv_reserved, r0.seq_len, r0.draft_kv_len) == (0, 0, 0, 0)
    assert on.kv_free == s.kv_free + before.kv_held
    assert not m.check_step(s, Action("flip_on"), on)
    # the re-prefill (prompt 2 + output 2, in two chunks) runs with speculation on: the draft covers it all
    s = walk(m, on, ["prefill", "prefill"])
    r0 = s.req(0)
    assert r0.status is Status.RUNNING and r0.seq_len == 4 and r0.committed == 3 and r0.draft_current
    s = walk(m, s, ["merge_batch", "prepare_for_decode"])
    drafted = take(m, s, Action("draft", (2,)))
    assert not m.check_step(s, Action("draft", (2,)), drafted)


def test_flip_on_by_retraction_also_retracts_the_batch_prefilled_while_off() -> None:
    m = model_for(RETRACT_CATCH_UP, attrs.evolve(Scope(), requests=(RequestSpec(1, 2), RequestSpec(1, 3))))
    s = walk(m, initial_with(m, 2, 1), ["arrive", "prefill", "merge_batch", "arrive", "flip_off",
                                         "prepare_for_decode", "plain_decode", "finish", "filter_batch", "prefill"])
    assert s.pending is not None and s.pending.rids == (1,) and not s.req(1).draft_current
    on = take(m, s, Action("flip_on"))
    assert on.pending is None and on.req(1).status is Status.WAITING and on.req(1).kv_held == 0
    assert on.kv_free == s.kv_free + s.req(1).kv_held


@pytest.mark.parametrize("with_running", [False, True], ids=["nothing_running", "beside_a_running_batch"])
def test_a_request_done_at_its_prefill_finishes_before_the_merge_and_never_joins(with_running: bool) -> None:
    from statemodel.design import RequestSpec

    # one request wants a single new token, which its prefill produces (a health check); the other runs 3
    health_check, runs = RequestSpec(1, 1), RequestSpec(1, 3)
    scope = Scope(requests=(runs, health_check) if with_running else (health_check, runs))
    m = model_for(SEEDS_FINAL, scope)
    s = m.init_states()[0]
    s = walk(m, s, ["arrive", "prefill", "merge_batch"] if with_running else ["arrive"])
    s = walk(m, s, ["arrive", "prefill"] if with_running else ["prefill"])
    done_at_prefill = 1 if with_running else 0
    assert s.pending is not None and done_at_prefill in s.pending.rids and s.req(done_at_prefill).done
    assert Action("finish", (done_at_prefill,)) in m.actions(s)
    free_before = s.kv_free
    s = take(m, s, Action("finish", (done_at_prefill,)))
    assert s.req(done_at_prefill).status is Status.FINISHED and s.kv_free > free_before
    s = take(m, s, Action("merge_batch"))
    assert done_at_prefill not in s.running.rids and s.pending is None
    assert s.running.rids == ((0,) if with_running else ())
    assert s.running.spec_info.rows == len(s.running.rids)


def test_the_initial_states_are_built_once_and_a_caller_cannot_change_them() -> None:
    m = model_for(SEEDS_FINAL)
    first = m.init_states()
    assert first == initial_states(SEEDS_FINAL, Scope()) and len(first) == len(SEEDS_FINAL.policy.pairs())
    first.clear()  # the caller's own list: the model's stays whole
    again = m.init_states()
    assert again == initial_states(SEEDS_FINAL, Scope())
    assert all(a is b for a, b in zip(again, m.init_states(), strict=True))  # kept, not built again
    assert m == model_for(SEEDS_FINAL) and hash(m) == hash(model_for(SEEDS_FINAL))  # the cache is no field


def test_unknown_action_is_a_clear_error() -> None:
    m = model_for(SEEDS_FINAL)
    with pytest.raises(ValueError, match="unknown action 'warp'"):
        apply(m.init_states()[0], Action("warp"), SEEDS_FINAL, Scope())


def test_unknown_design_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="no design named 'nope'; known designs: seeds_final"):
        get_design("nope")


def test_catalogue_is_complete() -> None:
    names = [a.name for a in ACTION_CATALOGUE]
    assert len(names) == len(set(names))
    for required in ("arrive", "prefill", "draft", "verify", "draft_extend", "plain_decode", "finish", "retract",
                     "merge_batch", "filter_batch", "flip_off", "flip_on", "prepare_for_decode"):
        assert required in names


# ----------------------------------------------------------------------------------------------
# The overlap schedule (Scope.overlap): a step's result is processed after the next step launched

OVERLAP = Scope(overlap=True)
SPEC_ROUND = ["prepare_for_decode", "draft", "verify", "draft_extend"]


def _overlap_start(design_name: str = "v2_switch_reserve_sync_overlap"):
    m = model_for(get_design(design_name), OVERLAP)
    # thresholds 4/3: one request never flips; r0 has prompt 3, max_new_tokens 3, one output after prefill
    s = walk(m, initial_with(m, 4, 3), ["arrive", "prefill", "prefill", "merge_batch"])
    return m, s


def test_overlap_verify_launches_and_its_result_moves_the_request_later() -> None:
    m, s = _overlap_start()
    s = walk(m, s, ["prepare_for_decode", "draft"])
    assert m.actions(s) == [Action("verify")]  # no accepts at the launch
    before = s.req(0)
    s = walk(m, s, ["verify", "draft_extend"])
    r0 = s.req(0)
    assert (r0.seq_len, r0.committed, r0.kv_held, r0.kv_reserved) == (before.seq_len, before.committed,
                                                                      before.kv_held, before.kv_reserved)
    assert [u.describe() for u in s.unprocessed] == ["verify(steps=2) rids=[0]"] and s.unprocessed[0].draft_extended
    # the loop launches the next step first and processes this result after it
    names = {a.name for a in m.actions(s)}
    assert "prepare_for_decode" in names and "process_result" not in names
    s = walk(m, s, SPEC_ROUND)
    after = take(m, s, Action("process_result", (1,)))
    r0 = after.req(0)
    assert (r0.seq_len, r0.committed, r0.kv_held, r0.kv_reserved) == (5, 3, 5, 4)
    assert r0.draft_current and len(after.unprocessed) == 1
    assert m.check_step(s, Action("process_result", (1,)), after) == []


def test_overlap_processes_the_oldest_result_right_after_the_next_launch() -> None:
    m, s = _overlap_start()
    s = walk(m, s, SPEC_ROUND + SPEC_ROUND)
    assert [u.steps for u in s.unprocessed] == [2, 2]
    # only pop_and_process of step N is possible now, with N's accepts
    assert {a.name for a in m.actions(s)} == {"process_result"}
    assert sorted(a.args for a in m.actions(s)) == [(0,), (1,), (2,)]
    s = take(m, s, Action("process_result", (0,)))
    assert s.req(0).seq_len == 4 and s.req(0).committed == 2 and len(s.unprocessed) == 1


def test_overlap_a_request_finished_by_step_n_runs_in_n_plus_1_and_is_skipped() -> None:
    m, s = _overlap_start()
    s = walk(m, s, SPEC_ROUND + SPEC_ROUND)  # N+1 launched before N's finish was known
    s = take(m, s, Action("process_result", (2,)))  # N accepts 2 + bonus: r0 reaches max_new_tokens 3
    r0 = s.req(0)
    assert r0.done and r0.status is Status.RUNNING and 0 in s.unprocessed[0].rids
    # nothing to launch (r0 is done): N+1's result is processed; it skips r0: one choice, nothing moves
    assert [a for a in m.actions(s) if a.name == "process_result"] == [Action("process_result", (0,))]
    skipped = take(m, s, Action("process_result", (0,)))
    assert skipped.req(0) == r0 and skipped.unprocessed == ()
    assert m.check_step(s, Action("process_result", (0,)), skipped) == []
    done = walk(m, skipped, ["finish"])
    assert done.kv_free == done.kv_pool_size


def test_overlap_reserve_is_topped_up_from_the_stale_committed_length() -> None:
    """N+1 is prepared before N's accepts reach the host: the 2x reserve still covers both verifies, the
    1x reserve does not (kv_reserve_covers_writes counts the unprocessed verify's worst case)."""
    for name, reserved, broken in (("v2_switch_reserve_sync_overlap", 6, []),
                                   ("reserve_1x_under_overlap", 3, ["kv_reserve_covers_writes"])):
        m, s = _overlap_start(name)
        s = walk(m, s, [*SPEC_ROUND, "prepare_for_decode"])
        assert s.req(0).kv_reserved == reserved and s.req(0).kv_held == 3  # nothing moved: N is unprocessed
        before = s
        s = take(m, s, Action("draft", (2,)))
        assert [v.invariant for v in m.check_step(before, Action("draft", (2,)), s)] == broken, name


def test_overlap_plain_step_commits_its_token_when_processed() -> None:
    m = model_for(get_design("v2_switch_reserve_sync_overlap"), OVERLAP)
    s = walk(m, initial_with(m, 2, 1), ["arrive", "prefill", "prefill", "merge_batch", "arrive", "flip_off",
                                         "prepare_for_decode", "plain_decode"])
    r0 = s.req(0)
    assert r0.seq_len == 4 and r0.committed == 1 and s.unprocessed[0].steps is None  # seq_lens move at launch
    s = walk(m, s, ["draft_sync", "prepare_for_decode", "plain_decode", "draft_sync", "process_result"])
    assert s.req(0).committed == 2 and s.req(0).seq_len == 5 and len(s.unprocessed) == 1


def test_overlap_retract_drops_the_request_from_unprocessed_results() -> None:
    scope = attrs.evolve(OVERLAP, kv_pool_size=9)
    m = model_for(get_design("reserve_1x_under_overlap"), scope)
    s = walk(m, initial_with(m, 4, 3), ["arrive", "prefill", "prefill", "merge_batch", *SPEC_ROUND, "arrive",
                                         "prefill", "merge_batch"])
    retracts = [a for a in m.actions(s) if a.name == "retract"]
    assert retracts, [a.describe() for a in m.actions(s)]
    s = take(m, s, Action("retract", (0,)))
    assert all(0 not in u.rids for u in s.unprocessed)


def test_without_overlap_no_result_is_ever_queued() -> None:
    for design in (V2_SWITCH, ADAPTIVE_WARM):
        m = model_for(design)
        seen, frontier = set(), list(m.init_states())
        while frontier and len(seen) < 3000:
            s = frontier.pop()
            for a in m.actions(s):
                assert a.name != "process_result"
                nxt = m.next_state(s, a)
                assert nxt.unprocessed == ()
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)


def test_overlap_result_processed_after_the_next_step_was_prepared() -> None:
    """An iteration SGLang runs without overlap (is_disable_overlap_for_batch): step N's result is processed at
    PREPARED, after N+1's prepare_for_decode and before its launch; the request N finishes is released there and
    still runs N+1 (its verify row writes freed slots), whose result then skips it."""
    m, s = _overlap_start()
    s = walk(m, s, [*SPEC_ROUND, "prepare_for_decode"])
    assert s.stage is Stage.PREPARED and len(s.unprocessed) == 1
    assert {a.name for a in m.actions(s)} == {"draft", "process_result"}
    before = s
    s = take(m, s, Action("process_result", (2,)))  # N accepts 2 + bonus: r0 reaches max_new_tokens 3
    assert m.check_step(before, Action("process_result", (2,)), s) == []
    assert s.stage is Stage.PREPARED and s.req(0).done and s.unprocessed == ()
    assert Action("finish", (0,)) in m.actions(s)
    s = take(m, s, Action("finish", (0,)))
    assert s.req(0).status is Status.FINISHED and s.kv_free == s.kv_pool_size and s.running.rids == (0,)
    before = s
    s = take(m, s, Action("draft", (2,)))
    assert m.check_step(before, Action("draft", (2,)), s) == []  # its row's writes need no reserve: it was released
    s = walk(m, s, ["verify", "draft_extend"])
    # N+1's result skips r0: one choice, nothing moves
    assert [a for a in m.actions(s) if a.name == "process_result"] == [Action("process_result", (0,))]
    s = take(m, s, Action("process_result", (0,)))
    assert s.req(0).status is Status.FINISHED and s.unprocessed == ()


def test_overlap_plain_step_keeps_the_row_of_a_request_released_after_prepare() -> None:
    """The switch's spec-off step takes its slots from req_to_token at seq_lens: a row released after the step was
    prepared still has one (a freed slot), so out_cache_loc matches the batch."""
    m = model_for(get_design("v2_switch_reserve_sync_overlap"), OVERLAP)
    s = walk(m, initial_with(m, 2, 1), ["arrive", "prefill", "prefill", "merge_batch", "arrive", "flip_off",
                                         "prepare_for_decode", "plain_decode", "draft_sync", "prepare_for_decode",
                                         "process_result", "plain_decode", "draft_sync", "prepare_for_decode"])
    s = take(m, s, Action("process_result"))  # r0's third token: done
    s = take(m, s, Action("finish", (0,)))
    before = s
    s = take(m, s, Action("plain_decode"))
    assert s.launched.out_cache_loc_width == s.launched.size == 1 and s.req(0).status is Status.FINISHED
    assert m.check_step(before, Action("plain_decode"), s) == []


def test_without_overlap_nothing_but_the_launch_runs_at_prepared() -> None:
    for design in (V2_SWITCH, ADAPTIVE_WARM, CATCH_UP):
        m = model_for(design)
        seen, frontier = set(), list(m.init_states())
        while frontier and len(seen) < 3000:
            s = frontier.pop()
            for a in m.actions(s):
                assert s.stage is not Stage.PREPARED or a.name in ("draft", "plain_decode"), a
                nxt = m.next_state(s, a)
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)


@pytest.mark.parametrize("overlap", [False, True], ids=["normal_loop", "overlap"])
def test_a_request_done_at_its_prefill_is_prepared_once_under_overlap(overlap: bool) -> None:
    """0.5.16's overlap order (issue 18): the prefilled batch is merged and the next decode prepared before the
    prefill's result is processed, so a request its prefill finished runs that one decode step and is released
    after (the result skips it). The checker explores it, as the guard accepts it on a live server; the normal
    loop releases it first. Once prepared, no second decode step is prepared with it."""
    from statemodel.designs import DESIGNS_BY_NAME, overlap_scope

    health_check, runs = RequestSpec(1, 1), RequestSpec(1, 3)
    base = DESIGNS_BY_NAME["plain_off_catch_up_overlap"] if overlap else CATCH_UP
    scope = attrs.evolve(overlap_scope(base) if overlap else Scope(), requests=(runs, health_check), kv_pool_size=40)
    m = model_for(base, scope)
    s = walk(m, initial_with(m, 4, 0), ["arrive", "prefill", "merge_batch", "arrive", "prefill", "merge_batch"])
    assert s.req(1).done and s.req(1).status is Status.RUNNING and 1 in s.running.rids
    names = {a.name for a in m.actions(s)}
    assert ("prepare_for_decode" in names) is overlap and "finish" in names
    if not overlap:
        return
    prepared = take(m, s, Action("prepare_for_decode"))
    assert prepared.req(1).kv_reserved > 0 and m.check_step(s, Action("prepare_for_decode"), prepared) == []
    launched = walk(m, prepared, ["draft", "verify", "draft_extend"])
    assert "prepare_for_decode" not in {a.name for a in m.actions(launched)}  # released first now
    done = walk(m, launched, ["finish"])
    assert done.req(1).status is Status.FINISHED


@settings(max_examples=200, deadline=None)
@given(design=st.sampled_from(ALL_DESIGNS), choices=st.lists(st.integers(0, 1 << 16), max_size=40),
       order=st.randoms(use_true_random=False))
def test_an_arrival_of_several_requests_is_their_arrivals_in_turn(design: Design, choices: list[int],
                                                                   order: random.Random) -> None:
    """The guard records the requests a prefill shows first as one `arrive` of several (shim/guard/core.py): the
    same state as their single arrivals one after another, in any order, and the same findings as those steps."""
    m = model_for(design)
    state = m.init_states()[0]
    for choice in choices:  # a random path; arrivals are left for the end now and then
        options = [a for a in m.actions(state) if a.name != "arrive" or choice % 3 == 0]
        if not options:
            break
        state = m.next_state(state, options[choice % len(options)])
    waiting = [r.rid for r in state.requests if r.status is Status.NOT_ARRIVED]
    assume(waiting and state.stage is Stage.SCHEDULE)
    order.shuffle(waiting)
    several = Action("arrive", tuple(waiting))
    after = apply(state, several, design, m.scope)
    one_by_one, found = state, set()
    for rid in waiting:
        nxt = apply(one_by_one, Action("arrive", (rid,)), design, m.scope)
        found |= {(v.invariant, v.rids) for v in m.check_step(one_by_one, Action("arrive", (rid,)), nxt)}
        one_by_one = nxt
    assert after == one_by_one
    assert {(v.invariant, v.rids) for v in m.check_step(state, several, after)} == found


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(design=st.sampled_from(ALL_DESIGNS), overlap=st.booleans(), choices=st.lists(st.integers(0, 1 << 16),
                                                                                     min_size=40, max_size=120),
       order=st.randoms(use_true_random=False))
def test_a_finish_of_several_requests_is_their_finishes_in_turn(design: Design, overlap: bool, choices: list[int],
                                                               order: random.Random) -> None:
    """The guard checks the finishes one result's processing releases (SGLang's free group) as one `finish` of them
    all (shim/guard/core.py, `_check_releases`): the same state as their finishes one after another, in any order,
    and the same findings as those steps."""
    m = model_for(design, Scope(overlap=overlap))
    state = m.init_states()[0]
    for choice in choices:  # a random path that finishes nothing, until two or more requests can finish
        options = m.actions(state)
        if sum(a.name == "finish" for a in options) >= 2:
            break
        options = [a for a in options if a.name != "finish"]
        if not options:
            break
        state = m.next_state(state, options[choice % len(options)])
    done = [a.args[0] for a in m.actions(state) if a.name == "finish"]
    assume(len(done) >= 2)
    order.shuffle(done)
    several = Action("finish", tuple(done))
    after = apply(state, several, design, m.scope)
    one_by_one, found = state, set()
    for rid in done:
        single = Action("finish", (rid,))
        assert single in m.actions(one_by_one)  # each still enabled after the others: none moves another
        nxt = apply(one_by_one, single, design, m.scope)
        found |= {v.invariant for v in m.check_step(one_by_one, single, nxt)}
        one_by_one = nxt
    assert after == one_by_one
    # the one step breaks the rules the finishes in turn break, but for one the state before them broke already
    # (reported at the step that led there) and a later finish of the group mends (a violation names the requests
    # short at its own step: the rules, not the lists, are compared)
    at_once = {v.invariant for v in m.check_step(state, several, after)}
    already = {v.invariant for v in check_state(state, m.scope)}
    assert at_once <= found <= at_once | already
