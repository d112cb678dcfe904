"""Warn mode an operator can alert on, in real sglang 0.5.23 on the CPU: every finding counted, the findings the
rate limit held back logged on the reporter's timer and at shutdown (SIGTERM included), and the counts exported as a
Prometheus counter (shim/guard/metrics.py). The findings are real ones: SGLang's own steps=0 draft-extend skip
(SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1, design zero_steps_skip_draft_extend) before each upshift."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
ol = importlib.import_module("overlap_loop")

from shim.guard.core import Mode  # noqa: E402
from shim.guard.runtime import FindingsReporter  # noqa: E402
from statemodel.actions import Action  # noqa: E402
from statemodel.designs import ADAPTIVE_WARM, KNOWN_BAD  # noqa: E402
from statemodel.invariants import Violation  # noqa: E402

pytestmark = pytest.mark.sglang
REPO = Path(__file__).resolve().parents[1]
BAD = {d.name: d for d in KNOWN_BAD}
UPSHIFTS = 4


def upshifts_after_skipped_extends(runtime: Any, model_dir: Path, n: int = UPSHIFTS, drv: Any = None) -> Any:
    """`n` rounds of steps 0 (the draft-extend skipped by SGLang's own stub) then steps 2: each upshift drafts over a
    KV the draft never extended, one finding each, on a warn-mode guard that goes on serving. `drv`: the driver of an
    earlier call, whose requests go on (one guard sees one scheduler's requests); returns the driver."""
    if drv is None:
        drv = gf.DesignDriver(gf.eagle_pools(model_dir), BAD["zero_steps_skip_draft_extend"])
        drv.admit(gf.make_reqs("w", 3, max_new_tokens=64, shared_prefix=gf.SYSTEM_PROMPT))
    for _ in range(n):
        gf.set_steps(drv.worker, 0)
        drv.decode(accepts=[1, 1, 1])
        gf.set_steps(drv.worker, 2)
        drv.decode()
    return drv


@pytest.fixture()
def warn_guard(runtime: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    from sglang.srt.environ import envs

    monkeypatch.setenv(envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.name, "1")
    gf.configure_guard(runtime, ADAPTIVE_WARM, mode=Mode.WARN)
    yield runtime
    gf.configure_guard(runtime, ADAPTIVE_WARM)


def test_every_finding_is_counted_past_the_rate_limit(warn_guard: Any, model_dir: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="specflip.guard"):
        upshifts_after_skipped_extends(warn_guard, model_dir)
    guard = warn_guard.guard
    assert guard.finding_counts == {"draft_kv_covers_prefix": UPSHIFTS}
    # the 30 s rate limit logged the first one whole and held the other three back
    logged = [r.getMessage() for r in caplog.records if "draft_kv_covers_prefix broken by" in r.getMessage()]
    assert len(logged) == 1 and guard._suppressed == {"draft_kv_covers_prefix": UPSHIFTS - 1}


def test_held_back_findings_are_logged_by_the_reporter_without_another_step(
        warn_guard: Any, model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    upshifts_after_skipped_extends(warn_guard, model_dir)
    guard = warn_guard.guard
    guard.config.warn_interval_s = 0.05
    reporter = FindingsReporter(warn_guard, every_s=0.05)
    try:
        with caplog.at_level(logging.WARNING, logger="specflip.guard"):
            deadline = time.monotonic() + 10
            while guard._suppressed or guard._totals_logged != UPSHIFTS:
                assert time.monotonic() < deadline, "the reporter logged nothing"
                time.sleep(0.02)
    finally:
        reporter.stop()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert f"specflip: {UPSHIFTS - 1} more draft_kv_covers_prefix findings since the last report on TP rank 0" in text
    assert f"specflip guard: {UPSHIFTS} findings in all on TP rank 0 since start (draft_kv_covers_prefix " \
           f"{UPSHIFTS})" in text


def test_findings_are_exported_as_a_prometheus_counter(warn_guard: Any, model_dir: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from shim.guard.metrics import GuardMetrics

    registry = CollectorRegistry()
    drv = upshifts_after_skipped_extends(warn_guard, model_dir, n=1)  # builds the guard
    warn_guard.guard.metrics = GuardMetrics(0, registry)
    upshifts_after_skipped_extends(warn_guard, model_dir, n=3, drv=drv)
    value = registry.get_sample_value("specflip_guard_findings_total",
                                      {"invariant": "draft_kv_covers_prefix", "tp_rank": "0"})
    assert value == 3 and warn_guard.guard.finding_counts["draft_kv_covers_prefix"] == 4
    assert b'specflip_guard_findings_total{invariant="draft_kv_covers_prefix",tp_rank="0"} 3.0' in \
        generate_latest(registry)


def overlap_upshifts_after_skipped_extends(model_dir: Path, n: int = UPSHIFTS) -> list[tuple[int, int, list[str]]]:
    """The same fault under the overlap schedule (tests/overlap_loop.py: SGLang 0.5.23's event_loop_overlap order over
    real objects), as SGLang's adaptive switch ran it on the H100 (docs/results.md): `n` rounds of 3 steps-0
    iterations (the draft-extend skipped by SGLang's own stub), then 4 at steps 3. Returns (round, iteration, the
    SGLang names of the requests) of each finding the guard counted."""
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), ADAPTIVE_WARM)
    drv.accepts = lambda req: 2 if drv.worker.speculative_num_steps else 1
    drv.add(gf.make_reqs("o", 3, max_new_tokens=64, shared_prefix=gf.SYSTEM_PROMPT))
    for _ in range(3):
        drv.iteration()
    guard = None
    counted: list[tuple[int, int, list[str]]] = []
    for rnd in range(n):
        for steps, iterations in ((0, 3), (3, 4)):
            gf.set_steps(drv.worker, steps)
            for _ in range(iterations):
                total = guard.findings_total if guard is not None else 0
                drv.iteration()
                guard = drv_guard()
                if guard.findings_total > total:
                    _, found = guard.found[-1]
                    counted.append((rnd, drv.iteration_no, sorted({guard.names[r] for v in found for r in v.rids})))
    drv.run_until_idle()
    return counted


def drv_guard() -> Any:
    import shim.guard.runtime

    rt = shim.guard.runtime.current()
    assert rt is not None and rt.guard is not None
    return rt.guard


def test_under_the_overlap_schedule_a_fault_seen_twice_is_counted_once(warn_guard: Any, model_dir: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """SGLang's adaptive switch with the steps-0 draft-extend skip, 4 re-enables, the overlap schedule (what gave 8
    findings on the H100, docs/results.md): the guard looks at each fault twice (the first steps-3 draft finds the
    draft KV short by the steps-0 results processed so far; the last steps-0 step, in flight then, is processed after
    that draft launched, and the next draft finds the same requests short by its position too) and counts it once:
    4 findings, one per re-enable, each over the same requests, and 4 repeats named in the totals line, not counted,
    not exported. Without the episode rule (shim/guard/report.py) it counts 8."""
    with caplog.at_level(logging.WARNING, logger="specflip.guard"):
        counted = overlap_upshifts_after_skipped_extends(model_dir)
        guard = warn_guard.guard
        guard.report_held_back(force=True)
    assert guard.finding_counts == {"draft_kv_covers_prefix": UPSHIFTS}
    assert guard.repeat_counts == {"draft_kv_covers_prefix": UPSHIFTS}
    assert [rnd for rnd, _, _ in counted] == list(range(UPSHIFTS))  # one per re-enable
    assert all(rids == ["o0", "o1", "o2"] for _, _, rids in counted)
    assert f"specflip guard: {UPSHIFTS} findings in all on TP rank 0 since start (draft_kv_covers_prefix {UPSHIFTS}; " \
           f"the same faults seen again, not counted: draft_kv_covers_prefix {UPSHIFTS})" in caplog.text


def test_a_finding_is_new_once_its_action_passed_clean_or_it_names_another_request(warn_guard: Any,
                                                                                   model_dir: Path) -> None:
    """The episode rule on a live guard: the same invariant at the same action over a subset of the requests an open
    finding named is a repeat; at another action, or over a request it did not name, a new finding; after that
    action passed a check clean, or after a flip, a new finding again."""
    upshifts_after_skipped_extends(warn_guard, model_dir, n=1)  # builds the guard: one finding, open at `draft`
    guard = warn_guard.guard
    draft = Action("draft", (2,))

    def look(*rids: int) -> None:
        guard._report(draft, (Violation("draft_kv_covers_prefix", "short", rids),))

    counts = guard.finding_counts
    open_rids = sorted(guard.names.index(n) for n in next(iter(guard._open.values())))
    assert counts["draft_kv_covers_prefix"] == 1 and len(open_rids) == 3
    look(*open_rids[:2])  # a subset: the same fault again
    assert counts["draft_kv_covers_prefix"] == 1 and guard.repeat_counts["draft_kv_covers_prefix"] == 1
    look(*open_rids)  # all three again: still the same
    assert counts["draft_kv_covers_prefix"] == 1
    guard._report(Action("verify"), (Violation("draft_kv_covers_prefix", "short", tuple(open_rids)),))
    assert counts["draft_kv_covers_prefix"] == 2  # at another action: another fault
    guard.close_open_findings(draft)  # a draft step passed its check clean
    look(*open_rids[:1])
    assert counts["draft_kv_covers_prefix"] == 3
    guard.close_open_findings(Action("flip_off"))  # a flip ends every open finding
    look(*open_rids[:1])
    assert counts["draft_kv_covers_prefix"] == 4
    look(*open_rids[:2])  # a request the open finding did not name: a new fault
    assert counts["draft_kv_covers_prefix"] == 5 and guard.repeat_counts["draft_kv_covers_prefix"] == 2


class MetricsOn:
    """The real ServerArgs as `--enable-metrics` resolves it (0.5.23's record is read-only once resolved)."""

    def __init__(self, sa: Any) -> None:
        self._sa = sa
        self.enable_metrics = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sa, name)


def test_the_adapter_counts_into_sglangs_registry_when_metrics_are_on(warn_guard: Any, model_dir: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`--enable-metrics`: the adapter's guard counts into prometheus_client's default registry, the one SGLang's
    `/metrics` serves (in multiprocess mode, through PROMETHEUS_MULTIPROC_DIR)."""
    from prometheus_client import REGISTRY

    adapter = warn_guard.adapter
    sa = adapter.server_args()
    assert not sa.enable_metrics
    monkeypatch.setattr(adapter, "server_args", lambda: MetricsOn(sa))  # read when the guard starts, below
    before = REGISTRY.get_sample_value("specflip_guard_findings_total",
                                       {"invariant": "draft_kv_covers_prefix", "tp_rank": "0"}) or 0
    upshifts_after_skipped_extends(warn_guard, model_dir, n=2)
    assert REGISTRY.get_sample_value("specflip_guard_findings_total",
                                     {"invariant": "draft_kv_covers_prefix", "tp_rank": "0"}) == before + 2


SIGTERM_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    sys.path[:0] = ["tests", "stand_ins/cpu"]
    import logging; logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    import importlib
    import sglang.srt.plugins as plugins
    gf = importlib.import_module("guard_fixtures")
    gf._install_gpu_stand_ins()
    plugins.load_plugins()  # the guard through SGLang's entry point, warn mode from SPECFLIP_MODE
    import shim.guard.runtime as r
    from test_guard_warn_mode import upshifts_after_skipped_extends
    import sglang_cpu as h
    from pathlib import Path
    import tempfile
    model_dir = h.write_tiny_model_config(Path(tempfile.mkdtemp()))
    upshifts_after_skipped_extends(r.current(), model_dir)
    print("HELD", dict(r.current().guard._suppressed), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    print("NOT REACHED", flush=True)
""")


def test_sigterm_reports_the_held_back_findings_before_the_process_ends(tmp_path: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SPECFLIP_")}, "SPECFLIP_MODE": "warn",
           "SPECFLIP_DESIGN": "sglang_adaptive_warm", "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1",
           "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", SIGTERM_SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == -signal.SIGTERM, out.stderr[-3000:]
    assert f"HELD {{'draft_kv_covers_prefix': {UPSHIFTS - 1}}}" in out.stdout and "NOT REACHED" not in out.stdout
    assert f"specflip: {UPSHIFTS - 1} more draft_kv_covers_prefix findings since the last report" in out.stderr
    assert f"specflip guard: {UPSHIFTS} findings in all on TP rank 0 since start" in out.stderr


@pytest.mark.parametrize("flip", ["flip_off", "flip_on"])
def test_a_flip_with_a_finding_of_its_own_still_ends_every_open_finding(warn_guard: Any, model_dir: Path,
                                                                        flip: str) -> None:
    """A flip, off or on, ends the open findings whether it passed clean or was found at fault itself (its identity
    checks: the positions it freed): the same fault seen after it is a new finding, not a repeat of one from before
    it."""
    upshifts_after_skipped_extends(warn_guard, model_dir, n=1)  # one finding, open at `draft`
    guard = warn_guard.guard
    draft = Action("draft", (2,))
    open_rids = sorted(guard.names.index(n) for n in next(iter(guard._open.values())))
    counts = guard.finding_counts
    assert counts["draft_kv_covers_prefix"] == 1
    freed = Violation("slots_freed_owned", "the flip freed a slot another request owns", (open_rids[0],))
    state = guard.state
    guard._record(state, Action(flip), state, "switch", extra=[freed], checked=True)  # found at the flip
    assert counts["slots_freed_owned"] == 1 and not guard._open
    guard._report(draft, (Violation("draft_kv_covers_prefix", "short", tuple(open_rids[:1])),))
    assert counts["draft_kv_covers_prefix"] == 2 and guard.repeat_counts["draft_kv_covers_prefix"] == 0
