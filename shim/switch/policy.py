"""The switch's flip decision on the scheduler's counts: statemodel.policy.decide_flip under the switch's design
(both switches use it; the v1 switch under seeds_final), plus the admission cap that follows the mode."""

from __future__ import annotations

from dataclasses import dataclass, field

from shim.switch.config import SwitchConfig
from statemodel.design import ThresholdPolicy
from statemodel.designs import get_design
from statemodel.policy import Flip, decide_flip


@dataclass
class SwitchPolicy:
    """The design's threshold policy (hysteresis, re-enabled only within speculation's cap when the design clamps).
    `design_name`: the design the switch implements (default: the one the configuration's draft mode names)."""

    config: SwitchConfig
    spec_on: bool = True
    design_name: str | None = None
    clamp: bool = field(init=False)

    def __post_init__(self) -> None:
        policy = get_design(self.design_name or self.config.design_name).policy
        self.clamp = isinstance(policy, ThresholdPolicy) and policy.clamp_to_spec_cap

    def wants(self, running: int, waiting: int, chunked: int = 0) -> Flip | None:
        """The flip for these counts (`running` running, `chunked` prefilling, `waiting` waiting requests), or
        None, without changing the mode. A Flip is a str: "flip_off" / "flip_on", the model action's name."""
        c = self.config
        return decide_flip(self.spec_on, running + chunked + waiting, running + chunked, c.t_off, c.t_on,
                           c.spec_cap if self.clamp else None)

    def decide(self, running: int, waiting: int, chunked: int = 0) -> Flip | None:
        """As `wants`, for the decode step about to be prepared; updates the mode."""
        action = self.wants(running, waiting, chunked)
        if action is not None:
            self.spec_on = action is Flip.ON
        return action

    def admission_cap(self, running: int, allocatable: int) -> int:
        """How many more requests may be admitted: speculation's cap while on, the launch cap while off."""
        if self.spec_on:
            return min(allocatable, self.config.spec_cap - running)
        return allocatable
