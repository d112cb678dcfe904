"""The flip policy as one pure function: the model, both switches and lint ask it, nobody restates it.

`decide_flip` takes plain counts, so a caller needs no `State`: the model passes its state's counts
(statemodel.actions.policy_wants_off / policy_wants_on), the switches the scheduler's counts, lint the
thresholds it is given. A further policy (e.g. an online one) is another function with the same shape:
counts and settings in, a `Flip` or None out, nothing changed.
"""

from __future__ import annotations

import enum


class Flip(enum.StrEnum):
    """A flip the policy asks for; the value (a str, as traces write it) is the model action that performs it."""

    OFF = "flip_off"
    ON = "flip_on"


def decide_flip(spec_on: bool, demand: int, in_flight: int, t_off: int, t_on: int,
                spec_cap: int | None) -> Flip | None:
    """The threshold policy with hysteresis: speculation off when `demand` (running + prefilling + waiting
    requests) reaches `t_off`; back on when it has fallen to `t_on` and, when `spec_cap` is given, the
    `in_flight` requests (running, about to be merged, prefilling) fit under speculation's running cap.
    `spec_cap=None`: no clamp. None: stay in the current mode."""
    if spec_on:
        return Flip.OFF if demand >= t_off else None
    if demand > t_on:
        return None
    if spec_cap is not None and not within_spec_cap(in_flight, spec_cap):
        return None
    return Flip.ON


def within_spec_cap(in_flight: int, spec_cap: int) -> bool:
    """Whether speculation may come back on: the `in_flight` requests (running, about to be merged, prefilling)
    fit under its running cap. The one copy of the rule: the threshold policy's clamp (decide_flip), the model's
    free flips (statemodel.actions.policy_may_flip) and the auto policy (statemodel.auto_policy) ask it."""
    return in_flight <= spec_cap


def decide_tier(steps: int, demand: int, ladder: tuple[int, ...], bounds: tuple[tuple[int, int], ...]) -> int:
    """The speculative tier (a step count) for `demand` while speculation is on, with hysteresis per boundary.

    `ladder`: the step counts from low load to high load (e.g. (3, 1)); `bounds[i] = (up, down)` lies between
    ladder[i] and ladder[i + 1]: demand at or above `up` moves to ladder[i + 1], at or below `down` back to
    ladder[i] (down < up). `steps`: the tier now; one not on the ladder (start-up, the launch steps) starts from
    the bottom. Plain decoding above the last tier is decide_flip's (t_off / t_on), not this function's.
    """
    i = ladder.index(steps) if steps in ladder else 0
    while i + 1 < len(ladder) and demand >= bounds[i][0]:
        i += 1
    while i > 0 and demand <= bounds[i - 1][1]:
        i -= 1
    return ladder[i]


def equivalent_thresholds(spec_on: bool, t_off: int, t_on: int, max_demand: int) -> tuple[int, int]:
    """The one threshold pair standing for every pair that `decide_flip` answers alike, from now on, at every
    demand up to `max_demand` (the checker counts states by it, `statemodel.model.Model.dedup_key`): an off
    threshold above `max_demand` is never reached, like `max_demand + 1`; an on threshold at or above it is always
    met, like `max_demand`; and with speculation on and the off threshold out of reach, speculation stays on, so
    the on threshold is never asked."""
    if spec_on and t_off > max_demand:
        return max_demand + 1, 0
    return min(t_off, max_demand + 1), min(t_on, max_demand)
