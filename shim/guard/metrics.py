"""The guard's findings and whether it checks, as Prometheus metrics exported through SGLang's own metrics endpoint.

With `--enable-metrics` SGLang runs prometheus_client in multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set before its
scheduler processes start) and its HTTP server's `/metrics` collects every process's samples; what the guard records
in a scheduler process is therefore served there beside SGLang's `sglang:*` series:

* `specflip_guard_findings_total{invariant, tp_rank}`: the findings, per first broken invariant;
* `specflip_guard_checking{tp_rank}`: 1 while the guard checks this rank's steps, 0 when it was asked for
  (SPECFLIP_MODE warn or trace) but does not (a configuration it does not describe, decided at start-up, or an
  error inside the guard; the reason is in the `specflip guard off: ...` log line). An operator alerts on 0.

Without `--enable-metrics` prometheus_client is not imported (only inside `GuardMetrics`).
"""

from __future__ import annotations

from typing import Any

METRIC_NAME = "specflip_guard_findings"  # prometheus_client adds the counter's `_total`
CHECKING_NAME = "specflip_guard_checking"
_SHARED: dict[int, tuple[Any, Any]] = {}  # registry id -> its (Counter, Gauge): a name registers once per registry


class GuardMetrics:
    """Counts findings per invariant for one TP rank and says whether the guard checks there. `registry`:
    prometheus_client's default (what SGLang's `/metrics` collects) unless a test passes its own."""

    def __init__(self, rank: int, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge

        registry = REGISTRY if registry is None else registry
        shared = _SHARED.get(id(registry))
        if shared is None:
            counter = Counter(METRIC_NAME, "Steps the specflip guard found against the model, by first broken "
                              "invariant", labelnames=("invariant", "tp_rank"), registry=registry)
            # one scheduler process per TP rank; across processes (multiprocess mode) the live ones' lowest value:
            # 0 if any process of the rank does not check
            checking = Gauge(CHECKING_NAME, "1 while the specflip guard checks this TP rank's steps, 0 when it was "
                             "asked for but does not (the reason is in its 'specflip guard off' log line)",
                             labelnames=("tp_rank",), registry=registry, multiprocess_mode="livemin")
            shared = _SHARED[id(registry)] = (counter, checking)
        self._counter, self._checking = shared
        self.rank = str(rank)

    def count(self, invariant: str) -> None:
        self._counter.labels(invariant=invariant, tp_rank=self.rank).inc()

    def set_checking(self, on: bool) -> None:
        self._checking.labels(tp_rank=self.rank).set(1 if on else 0)
