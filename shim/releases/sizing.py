"""What one SGLang release line sized at start-up for one launch configuration (`Sizing`), as each line's
`read_sizing` reads it and `specflip lint`'s rules (specflip/lint/rules.py) check it. Plain data, no SGLang."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["Sizing", "SpecflipPolicy", "StepSizing"]


@attrs.frozen
class StepSizing:
    """What SGLang sized for one step count (one adaptive runtime state, or the static launch state)."""

    steps: int
    draft_tokens: int
    alloc_len: int  # get_alloc_len_per_decode() while this state is the published one
    verify_width: int  # tokens per request the target-verify graph of this state is captured at
    draft_extend_width: int  # tokens per request the draft-extend of this state is sized for
    graph_bs: tuple[int, ...] = ()  # batch sizes with a captured target graph for this state (empty: eager)


@attrs.frozen
class SpecflipPolicy:
    """The settings of specflip's threshold switch that lint checks (shim.switch.config.SwitchConfig validates
    them; the flip rule itself is the model's, statemodel.policy.decide_flip)."""

    t_off: int
    t_on: int
    spec_cap: int = 48
    plain_graphs: str = "decode"
    draft_while_off: str = "retract"
    # SPECFLIP_TIERS: the step counts the switch runs while on, and the demand boundaries (up, down) between them
    # (shim.switch.config.TierLadder validates them); empty: the launch step count (SGLang's adaptive routing)
    tiers: tuple[int, ...] = ()
    tier_bounds: tuple[tuple[int, int], ...] = ()
    # SPECFLIP_SWITCH=auto: the learner flips (on only within spec_cap) and picks the tier at any demand; t_off /
    # t_on unused
    auto: bool = False


@attrs.frozen
class Sizing:
    """What one SGLang release sized at start-up for one launch configuration (plain data, JSON round-trip)."""

    release: str
    algorithm: str | None
    topk: int
    launch_steps: int
    launch_draft_tokens: int
    overlap: bool
    max_running_requests: int
    logits_rows: int  # rows of the shared logits buffer the graph runners write into
    states: tuple[StepSizing, ...]
    adaptive: bool = False
    tiers: tuple[tuple[int, tuple[int, ...]], ...] = ()  # ((min_batch_size, candidate_steps), ...)
    refusals: tuple[str, ...] = ()  # what SGLang dropped (the server starts without it), one line each
    fatal_refusals: tuple[str, ...] = ()  # what SGLang refuses when it builds the workers: start-up stops
    skip_zero_step_draft_extend: bool = False
    specflip: SpecflipPolicy | None = None
    # the adaptive switch happens inside the forward, after prepare_for_decode reserved KV under the previous
    # state (the v2 worker); False: the next prepare already reserves for the state that runs (0.5.12's v1 worker)
    switch_after_reserve: bool = True

    def state(self, steps: int) -> StepSizing:
        return next(s for s in self.states if s.steps == steps)

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sizing:
        data = dict(data)
        data["states"] = tuple(StepSizing(**{**s, "graph_bs": tuple(s["graph_bs"])}) for s in data["states"])
        data["tiers"] = tuple((bs, tuple(steps)) for bs, steps in data["tiers"])
        data["refusals"] = tuple(data["refusals"])
        data["fatal_refusals"] = tuple(data.get("fatal_refusals", ()))
        flip = data["specflip"]
        if flip:
            flip = {**flip, "tiers": tuple(flip.get("tiers", ())),
                    "tier_bounds": tuple(tuple(b) for b in flip.get("tier_bounds", ()))}
        data["specflip"] = SpecflipPolicy(**flip) if flip else None
        return cls(**data)
