"""torch.cuda.Event(enable_timing=True) cannot be created without a GPU: the tests' one stand-in for it
(tests/test_step_timer.py, tests/test_switch_warmup.py)."""

from __future__ import annotations

import time
from typing import Any


class TimingEventCpuStandIn:
    """torch.cuda.Event(enable_timing=True) on the host clock: record, query, elapsed_time in ms."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.streams: list[Any] = []

    def record(self, stream: Any = None) -> None:
        self.at = time.perf_counter()
        self.streams.append(stream)

    def query(self) -> bool:
        return self.at is not None

    def elapsed_time(self, end: TimingEventCpuStandIn) -> float:
        assert self.at is not None and end.at is not None
        return (end.at - self.at) * 1e3
