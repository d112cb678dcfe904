"""The switch's configuration from SPECFLIP_* (both switches, `specflip lint` and `specflip calibrate` validate
through it): plain data, no SGLang import. The knobs are documented in shim/switch/v2.py."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

ENV_SWITCH = "SPECFLIP_SWITCH"


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


AUTO = "auto"  # SPECFLIP_SWITCH=auto: no thresholds, the learner decides (shim/switch/auto.py)
AUTO_DESIGN = "plain_off_retract_catch_up_auto"  # the free-flip design that over-approximates it


class SwitchConfigError(ValueError):
    """A bad SPECFLIP_* setting; the message is one line."""


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

    def __post_init__(self) -> None:
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

    @property
    def design_name(self) -> str:
        """The checker design (statemodel/designs.py) this configuration implements."""
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
    def from_env(cls, env: dict[str, str] | None = None, *, default_draft: str = "retract") -> SwitchConfig | None:
        """The configuration from SPECFLIP_* variables, or None when the switch is not enabled.
        `default_draft`: SPECFLIP_SWITCH_DRAFT when unset (the v1 switch implements sync only)."""
        env = dict(os.environ) if env is None else env
        text = env.get(ENV_SWITCH, "").strip()
        if not text:
            return None
        auto = text == AUTO
        off, on = (0, 0) if auto else cls.parse_thresholds(text)
        try:
            cap = int(env.get("SPECFLIP_SPEC_CAP", "48"))
        except ValueError:
            raise SwitchConfigError(f"SPECFLIP_SPEC_CAP must be an integer, got {env['SPECFLIP_SPEC_CAP']!r}") from None
        try:
            every = int(env.get("SPECFLIP_SWITCH_TRACE_EVERY", "1"))
        except ValueError:
            raise SwitchConfigError("SPECFLIP_SWITCH_TRACE_EVERY must be an integer, got "
                                    f"{env['SPECFLIP_SWITCH_TRACE_EVERY']!r}") from None
        return cls(t_off=off, t_on=on, spec_cap=cap,
                   draft_while_off=env.get("SPECFLIP_SWITCH_DRAFT", default_draft).strip() or default_draft,
                   plain_graphs=env.get("SPECFLIP_PLAIN_GRAPHS", "decode").strip() or "decode",
                   plain_prefill=env.get("SPECFLIP_PLAIN_PREFILL", "graphs").strip() or "graphs",
                   trace_dir=env.get("SPECFLIP_SWITCH_TRACE") or None, trace_every=every, auto=auto)
