"""Do the per-rank switch traces of a TP > 1 server agree? (issue 16, docs/tp.md)

The switch writes one trace per scheduler process (`SPECFLIP_SWITCH_TRACE=<dir>`: `switch-<pid>.jsonl`), so one per
TP rank. Each flip is listed with its scheduler step index (the forwards the switch traced before it: decode steps and
prefills), the batch it saw (running, waiting, chunked) and its decision, for every file, and the files are compared
event by event on what every rank must agree on (timestamps, durations and graph use are left out).

    python bench/gpu/switch_ranks.py TRACE_DIR [--json]

Exit 0: every file took the same flips at the same step indices (and the same steps between them); 1: a divergence
(the first one is named); 2: bad input (one line).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

FLIPS = ("flip_off", "flip_on")
STEPS = ("step", "prefill")
# per-rank details: when, how long, which graph ran
LOCAL = ("t", "ms", "graph", "seconds")


def events(path: Path) -> list[dict[str, Any]]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"{path}:{n}: not JSON") from None
        if record.get("action") in FLIPS + STEPS:
            out.append({k: v for k, v in record.items() if k not in LOCAL})
    return out


def flips(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    step = 0
    found = []
    for e in evs:
        if e["action"] in STEPS:
            step += 1
        else:
            found.append({"step": step, "decision": e["action"], "running": e.get("running"),
                          "waiting": e.get("waiting"), "chunked": e.get("chunked")})
    return found


def compare(paths: list[Path]) -> dict[str, Any]:
    per_file = {str(p): events(p) for p in paths}
    names = list(per_file)
    first = per_file[names[0]]
    divergence = None
    for name in names[1:]:
        other = per_file[name]
        for i in range(max(len(first), len(other))):
            a = first[i] if i < len(first) else None
            b = other[i] if i < len(other) else None
            if a != b:
                divergence = {"event": i + 1, "reference": names[0], "expected": a, "file": name, "actual": b}
                break
        if divergence:
            break
    return {"files": names, "events": {n: len(e) for n, e in per_file.items()},
            "flips": {n: flips(e) for n, e in per_file.items()}, "agree": divergence is None,
            "divergence": divergence}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace_dir")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    paths = sorted(Path(args.trace_dir).glob("switch-*.jsonl"))
    if len(paths) < 2:
        print(f"switch_ranks: {args.trace_dir}: need at least two switch-*.jsonl (one per rank), found {len(paths)}")
        return 2
    try:
        report = compare(paths)
    except (OSError, ValueError) as exc:
        print(f"switch_ranks: {exc}")
        return 2
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        ref = report["flips"][report["files"][0]]
        print(f"{len(paths)} rank traces, {len(ref)} flips in the first; per flip: step index, running, waiting, "
              "chunked, decision, on each rank")
        for i, _ in enumerate(ref):
            cells = []
            for name in report["files"]:
                fl = report["flips"][name]
                f = fl[i] if i < len(fl) else None
                cells.append("-" if f is None else f"{f['step']}:{f['running']}/{f['waiting']}/{f['chunked']} "
                             f"{f['decision']}")
            print(f"  flip {i + 1}: " + " | ".join(cells))
        d = report["divergence"]
        print("OK: every rank took the same flips at the same steps" if d is None else
              f"DIVERGED at event {d['event']}: {d['file']} has {d['actual']} where {d['reference']} has "
              f"{d['expected']}")
    return 0 if report["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
