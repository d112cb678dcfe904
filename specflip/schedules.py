"""Request schedules that drive a server's running batch across the switch's thresholds.

A schedule is plain data (arrival times, prompts, max_new_tokens): JSON in, JSON out, so a schedule that
once found a problem can be kept as a regression case. `schedules(t_off, t_on)` is the Hypothesis
strategy; its patterns push the running batch up through `t_off`, down through `t_on`, oscillate around a
threshold, or make requests finish exactly while the batch crosses one. Hypothesis shrinks a failing one
towards fewer requests, shorter prompts and fewer tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
from hypothesis import strategies as st

PATTERNS = ("up", "down", "oscillate", "finish_at_flip")
VOCAB = 2048  # the counter target's vocabulary (gen_models.py)
DRAFT_VOCAB = 1024  # the draft is right only inside its vocabulary: accept lengths vary within a batch


class ScheduleError(ValueError):
    """A malformed schedule; the message is one line."""


@attrs.frozen
class ScheduledRequest:
    arrival_s: float
    prompt: tuple[int, ...]
    max_new_tokens: int

    def expected_output(self, vocab: int = VOCAB) -> list[int]:
        """What the counter target must produce greedily: (last prompt token + 1 + k) mod vocab."""
        last = self.prompt[-1]
        return [(last + 1 + k) % vocab for k in range(self.max_new_tokens)]


@attrs.frozen
class Schedule:
    pattern: str
    t_off: int
    t_on: int
    requests: tuple[ScheduledRequest, ...]

    @property
    def duration_hint_s(self) -> float:
        return max((r.arrival_s for r in self.requests), default=0.0)

    def peak_concurrency_bound(self) -> int:
        return len(self.requests)

    def to_json(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern, "t_off": self.t_off, "t_on": self.t_on,
            "requests": [{"arrival_s": r.arrival_s, "prompt": list(r.prompt), "max_new_tokens": r.max_new_tokens}
                         for r in self.requests],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Schedule:
        try:
            reqs = tuple(ScheduledRequest(float(r["arrival_s"]), tuple(int(t) for t in r["prompt"]),
                                          int(r["max_new_tokens"])) for r in data["requests"])
            sched = cls(str(data["pattern"]), int(data["t_off"]), int(data["t_on"]), reqs)
        except (KeyError, TypeError, ValueError) as exc:
            raise ScheduleError(f"malformed schedule: {exc!r}") from None
        validate(sched)
        return sched


def validate(sched: Schedule) -> None:
    if sched.pattern not in PATTERNS:
        raise ScheduleError(f"unknown pattern {sched.pattern!r}; known: {', '.join(PATTERNS)}")
    if not 0 <= sched.t_on < sched.t_off:
        raise ScheduleError(f"need 0 <= t_on < t_off, got t_off={sched.t_off} t_on={sched.t_on}")
    if not sched.requests:
        raise ScheduleError("a schedule needs at least one request")
    for i, r in enumerate(sched.requests):
        if r.arrival_s < 0 or not r.prompt or r.max_new_tokens < 1:
            raise ScheduleError(f"request {i}: arrival >= 0, a non-empty prompt and max_new_tokens >= 1 needed")
        if any(not 0 <= t < VOCAB for t in r.prompt):
            raise ScheduleError(f"request {i}: prompt token outside the vocabulary [0, {VOCAB})")


# the field that marks a JSON file as written by `specflip replay` (its schedules and its reports): such a file may
# be replaced by the next run; any other file of the same name is the user's (specflip.outputs.writable_file)
WRITTEN_BY = "written_by"
WRITTEN_BY_MARK = f'"{WRITTEN_BY}": "specflip replay'


def schedules_json(schedules: Iterable[Schedule]) -> str:
    """The text `--save-schedules` writes: the schedules under a `written_by` mark (`load` reads it, a bare list of
    schedules and one schedule object too)."""
    return json.dumps({WRITTEN_BY: "specflip replay --save-schedules",
                       "schedules": [s.to_json() for s in schedules]}, indent=1) + "\n"


def save(schedules: Iterable[Schedule], path: str | Path) -> None:
    Path(path).write_text(schedules_json(schedules))


def load(path: str | Path) -> list[Schedule]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScheduleError(f"cannot read schedules from {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if isinstance(data, dict):
        data = data["schedules"] if "schedules" in data else [data]
    if not isinstance(data, list):
        raise ScheduleError(f"malformed schedules in {path}: a list of schedules expected")
    return [Schedule.from_json(d) for d in data]


# ------------------------------------------------------------------------------------------------
# The strategy


@st.composite
def prompts(draw: st.DrawFn) -> tuple[int, ...]:
    length = draw(st.integers(1, 48))
    body = draw(st.lists(st.integers(3, VOCAB - 1), min_size=length - 1, max_size=length - 1))
    # the last token decides the counter's outputs; both sides of the draft vocabulary occur
    last = draw(st.one_of(st.integers(0, DRAFT_VOCAB - 1), st.integers(0, VOCAB - 1)))
    return (*body, last)


def _request(arrival: float, prompt: tuple[int, ...], max_new: int) -> ScheduledRequest:
    return ScheduledRequest(round(arrival, 3), prompt, max_new)


@st.composite
def schedules(draw: st.DrawFn, t_off: int = 6, t_on: int = 2, pattern: str | None = None,
              max_new_cap: int = 96) -> Schedule:
    """One schedule whose running batch crosses the thresholds in the chosen (or a drawn) pattern."""
    pattern = pattern or draw(st.sampled_from(PATTERNS))
    new_tokens = st.integers(4, max_new_cap)
    reqs: list[ScheduledRequest] = []
    if pattern == "up":
        # a ramp from nothing to above t_off, arrivals closer than a request's lifetime
        n = draw(st.integers(t_off, t_off + 6))
        gap = draw(st.floats(0.0, 0.05))
        for i in range(n):
            reqs.append(_request(i * gap, draw(prompts()), draw(st.integers(max_new_cap // 2, max_new_cap))))
    elif pattern == "down":
        # a burst above t_off whose requests finish at spread-out times, down through t_on
        n = draw(st.integers(t_off, t_off + 8))
        for _ in range(n):
            reqs.append(_request(0.0, draw(prompts()), draw(new_tokens)))
    elif pattern == "oscillate":
        # waves around the threshold separated by pauses
        waves = draw(st.integers(2, 4))
        t = 0.0
        for _ in range(waves):
            size = draw(st.integers(max(1, t_off - 2), t_off + 2))
            for _ in range(size):
                reqs.append(_request(t + draw(st.floats(0.0, 0.02)), draw(prompts()), draw(st.integers(4, 32))))
            t += draw(st.floats(0.05, 0.4))  # the pause
    else:  # finish_at_flip
        # long requests hold the batch just under t_off; short ones push it over and finish right away,
        # so finishes, filter_batch and flips land in the same few steps
        base = draw(st.integers(max(1, t_on), t_off - 1))
        for _ in range(base):
            reqs.append(_request(0.0, draw(prompts()), draw(st.integers(max_new_cap // 2, max_new_cap))))
        extra = draw(st.integers(1, 6))
        for i in range(extra):
            reqs.append(_request(draw(st.floats(0.0, 0.2)) + 0.01 * i, draw(prompts()), draw(st.integers(1, 6))))
    reqs.sort(key=lambda r: r.arrival_s)
    return Schedule(pattern, t_off, t_on, tuple(reqs))


def generate(count: int, t_off: int = 6, t_on: int = 2, seed: int = 0, max_new_cap: int = 96) -> list[Schedule]:
    """`count` schedules drawn by Hypothesis (deterministic for a seed), every pattern represented."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed

    out: list[Schedule] = []
    per = -(-count // len(PATTERNS))
    for k, pattern in enumerate(PATTERNS):
        drawn: list[Schedule] = []

        # B023: collect() runs right here, inside this iteration
        @hypothesis_seed(seed * 1000 + k)
        @settings(max_examples=per * 3, database=None, deadline=None, suppress_health_check=list(HealthCheck))
        @given(schedules(t_off, t_on, pattern, max_new_cap))
        def collect(sched: Schedule) -> None:
            if len(drawn) < per and sched not in drawn:  # noqa: B023
                drawn.append(sched)  # noqa: B023

        collect()
        out.extend(drawn)
    # interleave patterns so a truncated run still covers each
    out.sort(key=lambda s: PATTERNS.index(s.pattern))
    by = {p: [s for s in out if s.pattern == p] for p in PATTERNS}
    mixed = [s for group in zip(*by.values(), strict=False) for s in group]
    rest = [s for s in out if s not in mixed]
    return (mixed + rest)[:count]
