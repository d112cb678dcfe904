"""What the two switches share (the v1 EAGLEWorker's, shim/switch/v1.py, and the v2 one's, shim/switch/v2.py): the
runtime's common state, the demand the policy reads off the scheduler, the trace's config record and the guard's
announcement, the hook table's installation (with the warm-up), and a decode step's CUDA-event timer.

Each switch keeps what its worker does otherwise: where it flips (v1: prepare_for_decode or get_next_batch_to_run;
v2: update_running_batch or get_next_batch_to_run), its plain step, and which hooks it installs (its `hook table`,
installed here in the order it lists them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shim.guard import api as guard_api
from shim.switch import warmup
from shim.switch.config import SwitchConfig
from shim.switch.policy import SwitchPolicy
from shim.switch.swap import AttributeSwap
from shim.timing.jsonl import JsonlTrace

# one hook: (dotted SGLang target, the hook, HookRegistry's HookType name: "AROUND", "AFTER", "BEFORE")
Hook = tuple[str, Callable[..., Any], str]


@dataclass
class SwitchCore:
    """What either switch's hooks share inside one scheduler process (each switch's `SwitchRuntime` adds its own)."""

    config: SwitchConfig
    policy: SwitchPolicy
    trace: JsonlTrace
    steps_since_flip: int = 0
    flips: int = 0
    plain_runner: Any = None  # the decode CUDA graph runner for plain steps (None: eager)
    plain_attn_backend: Any = None
    counters: dict[str, int] = field(default_factory=dict)
    # draft mode "retract": what the switch's entry into the plain path swapped out, put back at flip-on
    spec_side: AttributeSwap = field(default_factory=AttributeSwap)

    @property
    def plain_path(self) -> bool:
        """Whether speculation off runs SGLang's own plain scheduler path (draft mode "retract")."""
        return self.config.draft_while_off == "retract"

    def count(self, key: str) -> None:
        self.counters[key] = self.counters.get(key, 0) + 1


def demand(scheduler: Any) -> tuple[int, int]:
    """(requests waiting, 1 while one is being chunk-prefilled): the demand besides the running batch that the
    policy reads."""
    return (len(getattr(scheduler, "waiting_queue", ()) or ()),
            1 if getattr(scheduler, "chunked_req", None) is not None else 0)


def announce(trace: JsonlTrace, design: str, **config: Any) -> None:
    """The trace's first record (the design and the configuration, which holds `spec_cap`) and the guard's reference
    design and scope."""
    trace.event("config", design=design, **config)
    guard_api.announce_switch(design, config["spec_cap"])


def install_hooks(registry: Any, config: SwitchConfig, hooks: Sequence[Hook]) -> None:
    """Register `hooks` on `registry` (SGLang's HookRegistry class) in their order, then the warm-up, which runs every
    path a flip takes before the server listens."""
    from sglang.srt.plugins.hook_registry import HookType

    for target, hook, kind in hooks:
        registry.register(target, hook, HookType[kind])
    warmup.install(registry, config)


def start_step_timer(stream: Any = None) -> tuple[Any, Any]:
    """(start, end) CUDA events with timing, `start` recorded on `stream` (None: the current one); the caller records
    `end` after the step and hands both to `JsonlTrace.timed` (read back when done: no host sync)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    return start, end
