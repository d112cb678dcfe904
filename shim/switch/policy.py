"""The switch's flip decision on the scheduler's counts: statemodel.policy.decide_flip under the switch's design
(both switches use it; the v1 switch under seeds_final), plus the admission cap that follows the mode."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from shim.switch.auto import AutoSwitch
from shim.switch.config import SwitchConfig
from statemodel.actions import policy_may_flip
from statemodel.design import Scope, ThresholdPolicy, TierFlips
from statemodel.designs import get_design
from statemodel.policy import Flip, decide_flip, decide_tier
from statemodel.state import EMPTY_BATCH, Batch, Request, SpecMode, Stage, State, Status


@dataclass
class SwitchPolicy:
    """The design's threshold policy (hysteresis, re-enabled only within speculation's cap when the design clamps).
    `design_name`: the design the switch implements (default: the one the configuration's draft mode names)."""

    config: SwitchConfig
    spec_on: bool = True
    design_name: str | None = None
    auto: AutoSwitch | None = None  # SPECFLIP_SWITCH=auto: the learner decides, within the model's free flips
    refused: int = 0  # auto decisions the model did not allow (none expected: the learner keeps to the cap)
    clamp: bool = field(init=False)
    # SPECFLIP_TIERS: the step count speculation runs with (statemodel.policy.decide_tier); None: no tiers
    tier: int | None = None

    def __post_init__(self) -> None:
        policy = get_design(self.design_name or self.config.design_name).policy
        self.clamp = isinstance(policy, ThresholdPolicy | TierFlips) and policy.clamp_to_spec_cap
        if self.config.tiers is not None:
            self.tier = self.config.tiers.steps[0]

    def follow_tier(self, demand: int) -> int | None:
        """While speculation is on, the tier for this demand (the ladder's hysteresis; auto: the tier of the
        learner's last committed decision); the new step count when it changed, else None. Off: the tier waits
        (flip-on starts from the demand then, or from the learner's choice)."""
        ladder = self.config.tiers
        if ladder is None or self.tier is None or not self.spec_on:
            return None
        if self.auto is not None:
            steps = self.tier if self.auto.tier is None else self.auto.tier
        else:
            steps = decide_tier(self.tier, demand, ladder.steps, ladder.bounds)
        if steps == self.tier:
            return None
        self.tier = steps
        return steps

    def wants(self, running: int, waiting: int, chunked: int = 0,
              batch_work: Callable[[], tuple[int, int, frozenset[str]]] | None = None,
              context: float | None = None, rids: list[str] | None = None) -> Flip | None:
        """The flip for these counts (`running` running, `chunked` prefilling, `waiting` waiting requests), or
        None, without changing the mode. A Flip is a str: "flip_off" / "flip_on", the model action's name.
        `batch_work` (auto only): the running requests' remaining output and re-prefill tokens and rids, on demand.
        `context` (auto only): the context of the batch that runs next (shim.switch.auto.next_context); `rids` (auto
        only): its requests' rids (shim.switch.auto.request_ids)."""
        c = self.config
        if self.auto is None:
            return decide_flip(self.spec_on, running + chunked + waiting, running + chunked, c.t_off, c.t_on,
                               c.spec_cap if self.clamp else None)
        decision = self.auto.decide(self.spec_on, running, waiting, chunked, steps=self.tier, batch_work=batch_work,
                                    context=context, rids=rids)
        ladder = c.tiers.steps if c.tiers is not None and self.tier is not None else ()
        if (decision.action is not None and decision.action not in model_free_flips(
                self.design_name or c.design_name, self.spec_on, running, waiting, chunked, c.spec_cap)) \
                or (decision.steps is not None and decision.steps not in ladder):
            self.refused += 1  # the model's free flips (and with tiers, a step count of the ladder) or nothing
            return None
        if decision.action is None:
            # no flip: the learner records it now (confirmation, a probe kept, a tier change follow_tier applies)
            self.auto.commit(decision)
            return None
        return Flip(decision.action)

    def performed(self, action: str) -> None:
        """The switch performed `action` (from `wants`): the mode follows, the learner records its decision (a flip
        the switch put off is not recorded: the next scheduling point decides again)."""
        self.spec_on = action == Flip.ON
        if self.auto is not None and self.auto.last is not None and self.auto.last.action == action:
            self.auto.commit(self.auto.last)

    def trace_fields(self) -> dict[str, object]:
        """What a flip's trace record adds: the auto policy's inputs and state (nothing for thresholds)."""
        return {} if self.auto is None else self.auto.trace_fields()

    def decide(self, running: int, waiting: int, chunked: int = 0) -> Flip | None:
        """As `wants`, for the decode step about to be prepared; updates the mode."""
        action = self.wants(running, waiting, chunked)
        if action is not None:
            self.performed(action)
        return action

    def admission_cap(self, running: int, allocatable: int) -> int:
        """How many more requests may be admitted: speculation's cap while on, the launch cap while off."""
        if self.spec_on:
            return min(allocatable, self.config.spec_cap - running)
        return allocatable


@functools.lru_cache(maxsize=4096)
def model_free_flips(design_name: str, spec_on: bool, running: int, waiting: int, chunked: int,
                     spec_cap: int) -> tuple[str, ...]:
    """The flips a free-flip design (SPECFLIP_SWITCH=auto) may take for these counts: the model's rule
    (statemodel.actions.policy_may_flip) on a state holding `running` running, `chunked` prefilling and `waiting`
    waiting requests. The auto policy's decision must be one of them."""
    statuses = [Status.RUNNING] * running + [Status.PREFILLING] * chunked + [Status.WAITING] * waiting
    requests = tuple(Request(rid=i, prompt_len=1, max_new_tokens=1, status=st) for i, st in enumerate(statuses))
    state = State(requests=requests, running=Batch(rids=tuple(range(running))) if running else EMPTY_BATCH,
                  pending=None, launched=None, stage=Stage.SCHEDULE,
                  spec_mode=SpecMode.ON if spec_on else SpecMode.OFF, num_steps=1, kv_free=0, kv_pool_size=0)
    return policy_may_flip(state, get_design(design_name), Scope(requests=(), spec_cap=spec_cap, plain_cap=1 << 30))
