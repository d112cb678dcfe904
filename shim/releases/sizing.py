"""What one SGLang release line sized at start-up for one launch configuration (`Sizing`), as each line's
`read_sizing` reads it and `specflip lint`'s rules (specflip/lint/rules.py) check it. Plain data, no SGLang."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["Sizing", "SpecflipPolicy", "StepSizing", "graph_batch_sizes", "request_pool"]


def graph_batch_sizes(listed: Any, pool: int, *, alignment: int = 1, width: int = 1,
                      two_batch_overlap: bool = False) -> list[int]:
    """The batch sizes a decode graph runner captures: SGLang's `get_batch_sizes_to_capture` (0.5.12, 0.5.13
    `model_executor/cuda_graph_runner.py`; 0.5.14 on `model_executor/runner/base_cuda_graph_runner.py`; the same
    steps on every line), given the sizes `listed` (the launch's decode graph list), one scheduler's request `pool`,
    the line's batch-size `alignment` (its `mul_base`: the attention TP size where the attention input is gathered,
    e.g. under DP attention, times 2 under two-batch overlap) and the tokens per request the runner captures (`width`;
    taken as 1 under `two_batch_overlap`, which splits each request's rows across two micro-batches). The pool is
    first rounded up to the alignment and added where the list reaches past it; a size is kept where its tokens (size
    x width) are a multiple of the alignment and it fits the pool. A size <= 0 is no graph (SGLang asserts every
    captured size is positive). [] where nothing is listed (graphs off)."""
    bs = [int(b) for b in listed or ()]
    if not bs:
        return []
    width = 1 if two_batch_overlap else width
    alignment = max(1, int(alignment))
    pool = -(-max(1, int(pool)) // alignment) * alignment
    if max(bs) > pool:
        bs.append(pool)
    return sorted({b for b in bs if 0 < b <= pool and b * width % alignment == 0})


def attention_dp_size(cfg: Any) -> int:
    """The attention DP size of a resolved launch: `attn_dp_size` where the line keeps it (0.5.22 on), else
    SGLang's own derivation (`compute_dp_attention_world_info`: dp_size under --enable-dp-attention, else 1). One
    scheduler's request pool is max_running_requests // it (0.5.12 `model_runner_kv_cache_mixin`, 0.5.23
    `pool_configurator`): plain DP (--dp-size without --enable-dp-attention) runs whole schedulers, each with the
    full pool."""
    attn_dp = getattr(cfg, "attn_dp_size", None)
    if attn_dp is None:
        attn_dp = (getattr(cfg, "dp_size", 1) or 1) if getattr(cfg, "enable_dp_attention", False) else 1
    return max(1, int(attn_dp or 1))


def request_pool(cfg: Any, max_running: int) -> int:
    """One scheduler's request pool, whose size the decode graphs are clamped to: `max_running` (the launch's
    max_running_requests) // the attention DP size (`attention_dp_size`)."""
    return max(1, int(max_running) // attention_dp_size(cfg))


def attention_tp_size(cfg: Any) -> int:
    """The attention TP size of a resolved launch (SGLang's `compute_dp_attention_world_info`): tp_size //
    attention DP size // attention CP size."""
    cp = int(getattr(cfg, "attn_cp_size", 1) or 1)
    return max(1, int(getattr(cfg, "tp_size", 1) or 1) // attention_dp_size(cfg) // cp)


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
