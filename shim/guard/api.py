"""What a flip implementation (a switch) tells the guard: the one interface between the two, pointing one way
(a switch imports this module; the guard never imports a switch).

* `announce_switch(design_name, spec_cap)` when the switch is installed (before the guard's adapter picks its
  reference design and scope; `None` when none is): which checker design the switch implements and the running
  cap it holds while speculation is on.
* `notify_flip_starting(reqs)` before a flip acts (optional), and `notify_flip(on, running_batch)` after each flip,
  the step SGLang itself has no function for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shim.guard.runtime import current


@dataclass(frozen=True)
class SwitchAnnouncement:
    """The installed switch, as the guard needs to know it."""

    design_name: str  # a design of statemodel.designs
    spec_cap: int  # running-request cap while speculation is on


_SWITCH: SwitchAnnouncement | None = None


def announce_switch(design_name: str | None, spec_cap: int = 0) -> None:
    """The switch installed in this process implements `design_name` with speculation's running cap `spec_cap`
    (`design_name=None`: no switch)."""
    global _SWITCH
    _SWITCH = None if design_name is None else SwitchAnnouncement(design_name, spec_cap)


def announced_switch() -> SwitchAnnouncement | None:
    """What the installed switch announced, or None when no switch is installed."""
    return _SWITCH


def notify_flip_starting(reqs: list[Any]) -> None:
    """A flip is about to act on `reqs` (the running and prefilled requests it may touch; SGLang Reqs). Optional, and
    before anything of the flip happens: the guard settles a round in flight on the objects as they are (so that the
    flip's own effect is blamed on the flip) and attributes the KV positions the flip frees to these requests' rows
    (statemodel.identity.slots_freed_owned), judged at the `notify_flip` that follows."""
    runtime = current()
    if runtime is None or runtime.adapter is None or not runtime.active:
        return
    starting = getattr(runtime.adapter, "on_flip_starting", None)
    if starting is not None:
        starting(reqs)


def notify_flip(on: bool, running_batch: Any) -> None:
    """Speculation was switched on (`on=True`) or off for `running_batch` (the scheduler's running
    ScheduleBatch, or None when nothing runs). Call after the flip has changed the batch. A no-op when the
    plugin is not loaded or the guard is off; raises SpecFlipViolation in assert mode."""
    runtime = current()
    if runtime is None or runtime.adapter is None or not runtime.active:
        return
    runtime.adapter.on_flip(on, running_batch)
