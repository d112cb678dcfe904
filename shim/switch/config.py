"""The switch's configuration from SPECFLIP_* (both switches, `specflip lint` and `specflip calibrate` validate
through it): plain data, no SGLang import. The knobs are documented in shim/switch/v2.py."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from shim.settings import SettingError, settings

ENV_SWITCH = settings.SWITCH.name  # the switch's settings are declared in shim/settings.py


class DraftMode(enum.StrEnum):
    """SPECFLIP_SWITCH_DRAFT: what the draft does while speculation is off (a str, as in traces and configs)."""

    SYNC = "sync"  # design v2_switch_reserve_sync (v1: seeds_final): a draft-extend after every plain step
    RETRACT = "retract"  # design plain_off_retract_catch_up: SGLang's plain path; the flip on retracts
    NONE = "none"  # KNOWN BAD, measurement only (no_draft_work_while_off)


DRAFT_MODES = tuple(m.value for m in DraftMode)
GRAPH_MODES = ("decode", "eager")
PREFILL_MODES = ("graphs", "eager")
DESIGN_FOR_DRAFT_MODE = {DraftMode.SYNC: "v2_switch_reserve_sync", DraftMode.RETRACT: "plain_off_retract_catch_up",
                         DraftMode.NONE: "no_draft_work_while_off"}


ENV_TIERS = settings.TIERS.name
TIERS_DESIGN = "plain_off_retract_catch_up_tiers"  # the design that over-approximates every tier ladder

AUTO = "auto"  # SPECFLIP_SWITCH=auto: no thresholds, the learner decides (shim/switch/auto.py)
AUTO_DESIGN = "plain_off_retract_catch_up_auto"  # the free-flip design that over-approximates it


RADIX_MODES = ("insert", "keep_out")
# SPECFLIP_V1_LOOP (the v1 switch only): SGLang's normal loop for every iteration, or specflip's loop that runs the
# plain iterations as SGLang's overlap loop does (shim/switch/v1_loop.py)
V1_LOOPS = ("normal", "overlap")


class SwitchConfigError(ValueError):
    """A bad SPECFLIP_* setting; the message is one line."""


TIERS_SYNTAX = "'steps[,up:down,steps]...' from low load to high, e.g. '3,8:4,1'"
AUTO_TIERS_SYNTAX = "the step counts only, from low load to high, e.g. '3,1'"


@dataclass(frozen=True)
class TierLadder:
    """SPECFLIP_TIERS: the speculative tiers (EAGLE step counts) from low load to high, and the demand boundaries
    between neighbours with hysteresis (statemodel.policy.decide_tier); plain decoding above the last tier is the
    switch's t_off / t_on. `3,8:4,1`: steps 3 below demand 8, steps 1 from 8 (back to 3 at demand 4).
    With SPECFLIP_SWITCH=auto the learner finds the boundaries: `3,1`, the step counts only (`learned`)."""

    steps: tuple[int, ...]
    bounds: tuple[tuple[int, int], ...] = ()
    learned: bool = False  # no boundaries given: SPECFLIP_SWITCH=auto learns them (statemodel.auto_policy)

    def __post_init__(self) -> None:
        if self.learned and self.bounds:
            raise SwitchConfigError(f"{ENV_TIERS}: a learned ladder has no boundaries, got {list(self.bounds)}")
        if not self.steps or (not self.learned and len(self.bounds) != len(self.steps) - 1):
            raise SwitchConfigError(f"{ENV_TIERS} must be {TIERS_SYNTAX}, got steps {list(self.steps)} "
                                    f"with {len(self.bounds)} boundaries")
        if any(s < 1 for s in self.steps) or len(set(self.steps)) != len(self.steps):
            raise SwitchConfigError(f"{ENV_TIERS}: step counts must be distinct and >= 1 (plain decoding is the "
                                    f"switch's off mode, not steps 0), got {list(self.steps)}")
        for i, (up, down) in enumerate(self.bounds):
            if not 0 <= down < up:
                raise SwitchConfigError(f"{ENV_TIERS}: boundary {up}:{down} needs 0 <= down < up")
            if i and (up <= self.bounds[i - 1][0] or down <= self.bounds[i - 1][1]):
                raise SwitchConfigError(f"{ENV_TIERS}: boundaries must rise from low load to high, got "
                                        f"{self.bounds[i - 1][0]}:{self.bounds[i - 1][1]} then {up}:{down}")

    @property
    def largest(self) -> int:
        return max(self.steps)

    def describe(self) -> str:
        if self.learned:
            return ",".join(str(s) for s in self.steps)
        parts = [str(self.steps[0])]
        for (up, down), s in zip(self.bounds, self.steps[1:], strict=True):
            parts += [f"{up}:{down}", str(s)]
        return ",".join(parts)

    @classmethod
    def parse(cls, text: str) -> TierLadder:
        """`steps[,up:down,steps]...`, or step counts alone (`3,1`: a ladder whose boundaries auto learns)."""
        items = [x.strip() for x in text.split(",")]
        if len(items) > 1 and ":" not in text:
            try:
                steps = tuple(int(x) for x in items)
            except ValueError:
                raise SwitchConfigError(f"{ENV_TIERS} must be {TIERS_SYNTAX} (with {ENV_SWITCH}=auto: "
                                        f"{AUTO_TIERS_SYNTAX}), got {text!r}") from None
            return cls(steps=steps, learned=True)
        if len(items) % 2 == 0:
            raise SwitchConfigError(f"{ENV_TIERS} must be {TIERS_SYNTAX} (a step count last), got {text!r}")
        try:
            steps = tuple(int(x) for x in items[0::2])
            bounds = tuple((int(u), int(d)) for u, d in (x.split(":") for x in items[1::2]))
        except ValueError:
            raise SwitchConfigError(f"{ENV_TIERS} must be {TIERS_SYNTAX}, got {text!r}") from None
        return cls(steps=steps, bounds=bounds)


@dataclass(frozen=True)
class SwitchConfig:
    t_off: int
    t_on: int
    spec_cap: int = 48
    draft_while_off: DraftMode = DraftMode.RETRACT  # a plain str is accepted and converted
    plain_graphs: str = "decode"
    plain_prefill: str = "graphs"
    trace_dir: str | None = None
    trace_every: int = 1
    auto: bool = False  # SPECFLIP_SWITCH=auto: the learner decides (t_off / t_on unused)
    tiers: TierLadder | None = None  # SPECFLIP_TIERS: the step count follows the load while speculation is on
    # SPECFLIP_SWITCH_RADIX: "keep_out" (the default, issue 24: SGLang's skip_radix_cache_insert on every request run
    # while off, so the tree never caches a token without draft KV; design plain_off_retract_catch_up_radix) or
    # "insert" (SGLang's own tree: a later hit drafts over positions whose draft KV was never written; outputs stay
    # exact, acceptance drops). keep_out leaked KV slots on the GPU line on 2026-12-01 (17aacf4) (a kept-out chunked
    # prefill, fixed by radix_keep_out.resume_chunk_kept_out); the 2026-12-01 (25a6220) run's H200 rerun at concurrency
    # 256 served 512/512, no leak
    radix: str = "keep_out"
    # SPECFLIP_SWITCH_WARMUP=on|off: run every path a flip takes before the server listens (shim/switch/warmup.py)
    warmup: bool = True
    # SPECFLIP_V1_LOOP=normal|overlap (the v1 switch only, draft mode retract; shim/switch/v1_loop.py). Unset: normal
    # here; the v1 switch's own reading (shim/switch/v1.py config_from_env) makes it overlap in draft mode retract
    v1_loop: str = "normal"

    def __post_init__(self) -> None:
        if self.tiers is not None:
            if self.draft_while_off != DraftMode.RETRACT:
                raise SwitchConfigError(f"{ENV_TIERS} needs SPECFLIP_SWITCH_DRAFT=retract, "
                                        f"got {self.draft_while_off!r}")
            if self.auto and self.tiers.bounds:  # refused, not ignored: a boundary the switch would not keep
                raise SwitchConfigError(f"{ENV_TIERS}: with {ENV_SWITCH}=auto the boundaries are learned; give "
                                        f"{AUTO_TIERS_SYNTAX}, got '{self.tiers.describe()}'")
            if not self.auto and self.tiers.learned:
                raise SwitchConfigError(f"{ENV_TIERS} must be {TIERS_SYNTAX} (a step count last) with "
                                        f"{ENV_SWITCH}=t_off:t_on (only auto learns the boundaries), got "
                                        f"'{self.tiers.describe()}'")
            if self.tiers.bounds and self.tiers.bounds[-1][0] >= self.t_off:
                raise SwitchConfigError(f"{ENV_TIERS}: the last boundary {self.tiers.bounds[-1][0]} must lie below "
                                        f"t_off {self.t_off} (its tier would never run)")
        if self.auto and self.draft_while_off != DraftMode.RETRACT:
            raise SwitchConfigError(f"{ENV_SWITCH}=auto runs on SGLang's plain path: SPECFLIP_SWITCH_DRAFT=retract, "
                                    f"got {self.draft_while_off!r}")
        if not self.auto and not 0 <= self.t_on < self.t_off:
            raise SwitchConfigError(f"{ENV_SWITCH}: need 0 <= t_on < t_off, got t_off={self.t_off} t_on={self.t_on}")
        if self.spec_cap < 1:
            raise SwitchConfigError(f"SPECFLIP_SPEC_CAP must be >= 1, got {self.spec_cap}")
        if self.draft_while_off not in DRAFT_MODES:
            raise SwitchConfigError(f"SPECFLIP_SWITCH_DRAFT must be one of {DRAFT_MODES}, got {self.draft_while_off!r}")
        object.__setattr__(self, "draft_while_off", DraftMode(self.draft_while_off))
        if self.trace_every < 1:
            raise SwitchConfigError(f"SPECFLIP_SWITCH_TRACE_EVERY must be >= 1, got {self.trace_every}")
        if self.plain_graphs not in GRAPH_MODES:
            raise SwitchConfigError(f"SPECFLIP_PLAIN_GRAPHS must be one of {GRAPH_MODES}, got {self.plain_graphs!r}")
        if self.plain_prefill not in PREFILL_MODES:
            raise SwitchConfigError(f"SPECFLIP_PLAIN_PREFILL must be one of {PREFILL_MODES}, "
                                    f"got {self.plain_prefill!r}")
        if self.v1_loop not in V1_LOOPS:
            raise SwitchConfigError(f"SPECFLIP_V1_LOOP must be one of {V1_LOOPS}, got {self.v1_loop!r}")
        if self.v1_loop == "overlap" and self.draft_while_off != DraftMode.RETRACT:
            raise SwitchConfigError("SPECFLIP_V1_LOOP=overlap overlaps SGLang's plain path: "
                                    f"SPECFLIP_SWITCH_DRAFT=retract, got '{self.draft_while_off}'")
        if self.radix not in RADIX_MODES:
            raise SwitchConfigError(f"SPECFLIP_SWITCH_RADIX must be one of {RADIX_MODES}, got {self.radix!r}")

    @property
    def design_name(self) -> str:
        """The checker design (statemodel/designs.py) this configuration implements."""
        if self.tiers is not None:  # auto or thresholds: TierFlips over-approximates either's choices
            return TIERS_DESIGN
        if self.auto:
            return AUTO_DESIGN
        return DESIGN_FOR_DRAFT_MODE[self.draft_while_off]

    @classmethod
    def parse_thresholds(cls, text: str) -> tuple[int, int]:
        try:
            off, on = (int(x) for x in text.split(":"))
        except ValueError:
            raise SwitchConfigError(f"{ENV_SWITCH} must be 't_off:t_on' (two integers) or 'auto', got {text!r}") \
                from None
        return off, on

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, default_draft: str = "retract") -> SwitchConfig | None:
        """The configuration from SPECFLIP_* variables (read through shim/settings.py), or None when the switch is not
        enabled. `default_draft`: SPECFLIP_SWITCH_DRAFT when unset."""
        try:
            switch = settings.SWITCH.get(env)
            if switch is None:
                if settings.TIERS.is_set(env):
                    raise SwitchConfigError(f"{ENV_TIERS} needs {ENV_SWITCH}=t_off:t_on (plain above the last tier) "
                                            f"or {ENV_SWITCH}=auto")
                return None
            auto = switch == AUTO
            off, on = (0, 0) if auto else switch
            spec_cap = settings.SPEC_CAP.get(env)
            return cls(t_off=off, t_on=on, spec_cap=48 if spec_cap is None else spec_cap, tiers=settings.TIERS.get(env),
                       draft_while_off=settings.SWITCH_DRAFT.get(env) if settings.SWITCH_DRAFT.is_set(env)
                       else default_draft,
                       plain_graphs=settings.PLAIN_GRAPHS.get(env), plain_prefill=settings.PLAIN_PREFILL.get(env),
                       trace_dir=settings.SWITCH_TRACE.get(env), trace_every=settings.SWITCH_TRACE_EVERY.get(env),
                       auto=auto, radix=settings.SWITCH_RADIX.get(env), warmup=settings.SWITCH_WARMUP.get(env),
                       v1_loop=settings.V1_LOOP.get(env) or "normal")
        except SettingError as exc:
            raise SwitchConfigError(str(exc)) from None
