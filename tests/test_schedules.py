"""The Hypothesis strategy for flip schedules: valid, threshold-straddling, JSON round-trip, shrinkable."""

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from specflip.schedules import (
    DRAFT_VOCAB,
    PATTERNS,
    VOCAB,
    Schedule,
    ScheduledRequest,
    ScheduleError,
    generate,
    load,
    save,
    schedules,
    validate,
)

REGRESSIONS = Path(__file__).parent / "regressions"
FAST = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@FAST
@given(st.integers(2, 10).flatmap(lambda off: st.tuples(st.just(off), st.integers(0, off - 1))).flatmap(
    lambda th: schedules(th[0], th[1])))
def test_every_drawn_schedule_is_valid_and_round_trips(sched):
    validate(sched)
    assert Schedule.from_json(json.loads(json.dumps(sched.to_json()))) == sched
    assert [r.arrival_s for r in sched.requests] == sorted(r.arrival_s for r in sched.requests)


@FAST
@given(schedules(6, 2, "up"))
def test_up_pushes_demand_through_t_off(sched):
    assert len(sched.requests) >= sched.t_off
    # arrivals closer than a request's lifetime: the ramp overlaps
    assert sched.duration_hint_s <= 0.05 * len(sched.requests)


@FAST
@given(schedules(6, 2, "down"))
def test_down_starts_above_t_off_and_drains_through_t_on(sched):
    assert len(sched.requests) >= sched.t_off
    assert all(r.arrival_s == 0.0 for r in sched.requests)
    # different lengths make the batch shrink step by step, through t_on
    assert len({r.max_new_tokens for r in sched.requests}) >= 1


@FAST
@given(schedules(6, 2, "oscillate"))
def test_oscillate_has_waves_around_the_threshold(sched):
    arrivals = [r.arrival_s for r in sched.requests]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert any(g >= 0.03 for g in gaps), "waves are separated by pauses"
    assert len(sched.requests) >= 2 * (sched.t_off - 2)


@FAST
@given(schedules(6, 2, "finish_at_flip"))
def test_finish_at_flip_mixes_long_base_with_short_requests(sched):
    short = [r for r in sched.requests if r.max_new_tokens <= 6]
    long = [r for r in sched.requests if r.max_new_tokens > 6]
    assert short and long
    assert len(long) <= sched.t_off - 1  # the base holds the batch just under t_off


def test_counter_expectation_wraps_around_the_vocabulary():
    r = ScheduledRequest(0.0, (5, VOCAB - 2), 4)
    assert r.expected_output() == [VOCAB - 1, 0, 1, 2]


def test_prompts_reach_both_sides_of_the_draft_vocabulary():
    lasts = {s.requests[i].prompt[-1] < DRAFT_VOCAB for s in generate(8) for i in range(len(s.requests))}
    assert lasts == {True, False}


def test_generate_is_deterministic_and_covers_every_pattern():
    a, b = generate(8, seed=3), generate(8, seed=3)
    assert a == b and len(a) == 8
    assert {s.pattern for s in a} == set(PATTERNS)
    assert generate(8, seed=4) != a


def test_shrinking_keeps_a_failing_schedule_minimal():
    # a ramp that "fails" once 9 requests overlap: Hypothesis shrinks to exactly 9 requests, arriving at
    # once, with one-token prompts and the fewest new tokens the pattern allows
    found = find(schedules(6, 2, "up"), lambda s: len(s.requests) >= 9,
                 settings=settings(database=None, max_examples=500))
    assert len(found.requests) == 9
    assert all(len(r.prompt) == 1 and r.arrival_s == 0.0 for r in found.requests)
    assert {r.max_new_tokens for r in found.requests} == {48}


@pytest.mark.parametrize("bad, message", [
    ({"pattern": "sideways", "t_off": 6, "t_on": 2, "requests": [{"arrival_s": 0, "prompt": [1], "max_new_tokens": 1}]},
     "unknown pattern"),
    ({"pattern": "up", "t_off": 2, "t_on": 2, "requests": [{"arrival_s": 0, "prompt": [1], "max_new_tokens": 1}]},
     "t_on < t_off"),
    ({"pattern": "up", "t_off": 6, "t_on": 2, "requests": []}, "at least one request"),
    ({"pattern": "up", "t_off": 6, "t_on": 2, "requests": [{"arrival_s": 0, "prompt": [VOCAB], "max_new_tokens": 1}]},
     "outside the vocabulary"),
    ({"pattern": "up", "t_off": 6, "requests": []}, "malformed"),
])
def test_bad_schedules_get_a_one_line_error(bad, message):
    with pytest.raises(ScheduleError, match=message) as exc:
        Schedule.from_json(bad)
    assert "\n" not in str(exc.value)


def test_save_and_load(tmp_path):
    scheds = generate(4)
    path = tmp_path / "s.json"
    save(scheds, path)
    assert load(path) == scheds
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ScheduleError, match="cannot read"):
        load(tmp_path / "broken.json")


def test_regression_schedules_stay_valid():
    files = sorted(REGRESSIONS.glob("*.json"))
    assert files, "tests/regressions holds the schedules that once found a problem"
    for f in files:
        data = json.loads(f.read_text())
        sched = Schedule.from_json(data["schedule"])
        assert data["found"]
        cap = data.get("server_env", {}).get("SPECFLIP_SPEC_CAP")
        if f.stem == "admission_stall_after_flip_off":
            # the stall needs more simultaneous arrivals than speculation's cap admits
            assert sum(1 for r in sched.requests if r.arrival_s == 0.0) > int(cap)
