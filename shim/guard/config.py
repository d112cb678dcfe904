"""The guard's settings (one per scheduler / TP rank) and its modes."""

from __future__ import annotations

import enum

import attrs

from statemodel.design import Design, Scope


class Mode(enum.Enum):
    OFF = "off"
    WARN = "warn"
    ASSERT = "assert"
    TRACE = "trace"


@attrs.define
class GuardConfig:
    mode: Mode
    design: Design  # the reference design apply() moves the ghost state with
    scope: Scope  # kv_pool_size, spec_cap / plain_cap (running_within_cap), chunk_size
    rank: int = 0
    release: str = "unknown"
    trace_path: str | None = None
    history: int = 6
    warn_interval_s: float = 30.0
    slot_values: str = "auto"  # SPECFLIP_GUARD_SLOT_VALUES (shim/guard/slot_values.py)
