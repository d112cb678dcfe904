"""bench/gpu/v1_summarize.py: the v1 line's side-by-side tables from a run's $OUT, its traces packed or loose, the
switch's start-up warm-up apart from the step timer's figures."""

from __future__ import annotations

import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "gpu"))

import v1_summarize  # noqa: E402

CALL_S22 = Path(__file__).resolve().parents[1] / "bench" / "gpu" / "results" / "2026-12-03_b86d557" / "v1"


def timing(t: float, kind: str, bs: int, ms: float, first: bool = False, **tag: bool) -> dict:
    return {"t": t, "action": "timing", "kind": kind, "bs": bs, "ms": ms, "host_ms": ms, "first_after_flip": first,
            "graph": True, **tag}


# the shape of the H200's v1 trace (2026-12-03, b86d557, `bare`): the warm-up's first flip paid 442 ms in its first
# plain step
TRACE = [{"t": 1.0, "action": "config"},
         {"t": 2.0, "action": "flip_off", "ms": 0.1, "warmup": True},
         timing(2.1, "plain", 48, 442.36, first=True, warmup=True),
         {"t": 2.2, "action": "flip_on", "ms": 0.2, "warmup": True},
         {"t": 10.0, "action": "flip_off", "ms": 0.3},
         timing(10.1, "plain", 5, 5.9, first=True),
         timing(10.2, "plain", 5, 4.9), timing(10.3, "plain", 5, 4.9),
         {"t": 11.0, "action": "flip_on", "ms": 0.4}]


def pack(out: Path, name: str, records: list[dict]) -> None:
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    with tarfile.open(out / "traces.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo(f"./tr/{name}/switch-7.jsonl")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("packed", [True, False])
def test_the_step_timer_leaves_the_warmup_out_and_reports_it_apart(tmp_path: Path, packed: bool) -> None:
    """The 2026-12-03 (b86d557) run's summary called the warm-up's 442 ms step "the first after the first flip": a
    start-up cost, reported as if the first flip in service had paid it. Read from the packed traces as from loose
    ones."""
    if packed:
        pack(tmp_path, "bare", TRACE)
    else:
        (tmp_path / "tr" / "bare").mkdir(parents=True)
        (tmp_path / "tr" / "bare" / "switch-7.jsonl").write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    lines = v1_summarize.trace_lines(str(tmp_path))
    assert lines[0] == "- `bare`: {'config': 1, 'flip_off': 1, 'timing': 3, 'flip_on': 1}"
    assert any(line.startswith("  - plain steps timed: 3 (3 on graphs); the first after the first flip: 5.90 ms "
                               "device") and "steady median 4.90 ms" in line and "max 5.90 ms device" in line
               for line in lines)
    assert "- bare: 1 timed steps, the longest 442.4 ms (plain, batch 48); 1 flips off, 1 on" in lines


def test_a_committed_run_summarizes_its_sweep_and_probe(tmp_path: Path) -> None:
    """The H200 run of 2026-12-03, b86d557 (its sweep and probes as the device wrote them): the tables come out of
    them."""
    for name in ("sweep.json", "probe_fresh.json", "probe_steady.json"):
        shutil.copy(CALL_S22 / name, tmp_path / name)
    table = v1_summarize.sweep_table(v1_summarize.load(str(tmp_path / "sweep.json")))
    assert any(row.startswith("| 32 | 4,474 (0.450) |") for row in table)
    probe = v1_summarize.probe_table(v1_summarize.load(str(tmp_path / "probe_fresh.json")),
                                     v1_summarize.load(str(tmp_path / "probe_steady.json")))
    assert "| on | 1.601 / 1.259 | 1.044 / 0.703 | +557, +556 | 12/12 |" in probe
    assert v1_summarize.trace_lines(str(tmp_path)) == ["(no switch trace)"]
