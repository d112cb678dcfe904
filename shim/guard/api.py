"""What a flip implementation (the switch) tells the guard: the steps SGLang itself has no function for.

Call after the flip has changed the batch. A no-op when the plugin is not loaded or the guard is off.
"""

from __future__ import annotations

from typing import Any

from shim.runtime import current


def notify_flip(on: bool, running_batch: Any) -> None:
    """Speculation was switched on (`on=True`) or off for `running_batch` (the scheduler's running
    ScheduleBatch, or None when nothing runs). Raises SpecFlipViolation in assert mode."""
    runtime = current()
    if runtime is None or runtime.adapter is None or not runtime.active:
        return
    runtime.adapter.on_flip(on, running_batch)
