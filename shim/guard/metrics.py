"""The guard's findings as a Prometheus counter, exported through SGLang's own metrics endpoint.

With `--enable-metrics` SGLang runs prometheus_client in multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set before its
scheduler processes start) and its HTTP server's `/metrics` collects every process's samples; a counter the guard
increments in a scheduler process is therefore served there as `specflip_guard_findings_total{invariant, tp_rank}`,
beside SGLang's `sglang:*` series. Without `--enable-metrics` nothing here is imported.
"""

from __future__ import annotations

from typing import Any

METRIC_NAME = "specflip_guard_findings"  # prometheus_client adds the counter's `_total`
_SHARED: dict[int, Any] = {}  # registry id -> its Counter: a name registers once per registry and process


class GuardMetrics:
    """Counts findings per invariant for one TP rank. `registry`: prometheus_client's default (what SGLang's
    `/metrics` collects) unless a test passes its own."""

    def __init__(self, rank: int, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter

        registry = REGISTRY if registry is None else registry
        counter = _SHARED.get(id(registry))
        if counter is None:
            counter = Counter(METRIC_NAME, "Steps the specflip guard found against the model, by first broken "
                              "invariant", labelnames=("invariant", "tp_rank"), registry=registry)
            _SHARED[id(registry)] = counter
        self._counter = counter
        self.rank = str(rank)

    def count(self, invariant: str) -> None:
        self._counter.labels(invariant=invariant, tp_rank=self.rank).inc()
