"""A JSONL event file with per-step device timings, shared by the switch's trace (SPECFLIP_SWITCH_TRACE) and the
step timer (SPECFLIP_STEP_TIMER): one writer, no host syncs."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

# A decode step launched this long after the previous one follows an idle spell: its GPU has clocked down, a flip or
# not. The switch traces such steps (shim/switch/v2_runtime.py) and bench/gpu/summarize.py classes them apart, so a
# flip-on's first step (the server had emptied) is compared with first steps after idle without a flip.
IDLE_GAP_MS = 50.0

class JsonlTrace:
    """JSONL of events (the switch's: model action names) and per-step device timings; no host syncs:
    CUDA events are read back only once they have completed."""

    def __init__(self, trace_dir: str | None, prefix: str = "switch") -> None:
        self._fh = None
        self._lock = threading.Lock()
        self._pending: list[tuple[Any, Any, dict[str, Any]]] = []
        self._flushed = 0.0
        # fields every record carries while set: {"warmup": True} through the switch's start-up warm-up
        # (shim/switch/warmup.py), so that a summary can leave its steps and flips out of the steady state
        self.tag: dict[str, Any] = {}
        if trace_dir:
            os.makedirs(trace_dir, exist_ok=True)
            self.path = os.path.join(trace_dir, f"{prefix}-{os.getpid()}.jsonl")
            self._fh = open(self.path, "a", buffering=1 << 16)  # noqa: SIM115 - lives as long as the process
            threading.Thread(target=self._flush_loop, daemon=True, name="specflip-trace-flush").start()

    @property
    def enabled(self) -> bool:
        return self._fh is not None

    def _flush_loop(self) -> None:
        # an idle server writes nothing: flush from here so a live replay sees every event
        while True:
            time.sleep(0.5)
            with self._lock:
                if self._fh is not None:
                    self._fh.flush()

    def event(self, action: str, **info: Any) -> None:
        if self._fh is None:
            return
        now = time.time()
        with self._lock:
            self._fh.write(json.dumps({"t": round(now, 6), "action": action, **self.tag, **info}) + "\n")
            if now - self._flushed > 0.5:  # a live replay reads the file while the server runs
                self._fh.flush()
                self._flushed = now

    def timed(self, start: Any, end: Any, info: dict[str, Any]) -> None:
        if self._fh is None:
            return
        # the tag as the step ran: its record is written once its events complete, at a later step
        self._pending.append((start, end, {**self.tag, **info} if self.tag else info))
        self.drain()

    def drain(self, force: bool = False) -> None:
        keep = []
        for start, end, info in self._pending:
            if force or end.query():
                self.event("timing", ms=round(start.elapsed_time(end), 4), **info)
            else:
                keep.append((start, end, info))
        self._pending = keep
        if force and self._fh is not None:
            self._fh.flush()
