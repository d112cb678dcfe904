"""Summarize bench/gpu/v1_run.sh's side-by-side run (issue 22): throughput per configuration and concurrency with
paired ratios, the first-flip probe (fresh server against the same pattern later), and the switch traces' step
timer (the first step after a flip against the steady ones), the start-up warm-up apart. Standard library and
summarize.py (this folder) only.

usage: python3 bench/gpu/v1_summarize.py OUT_DIR    (reads sweep.json, probe_fresh.json, probe_steady.json, and
       tr/<server>/switch-*.jsonl or, once v1_run.sh has packed them, traces*.tar.gz / traces*.tar.xz; prints markdown)
"""

from __future__ import annotations

import collections
import glob
import json
import os
import statistics
import sys

# the trace reader and the warm-up's records reported apart, as on the v2 line (this folder)
from summarize import trace_events, warmup_lines

ORDER = ("off", "off_nonoverlap", "on", "switch", "bare", "bare_overlap", "switch_overlap", "defaults", "sync",
         "switch54")
# switch, on and sync run the guard (assert mode); off and bare do not: bare / off and switch / on are like for like
RATIOS = (("bare", "off"), ("switch", "off"), ("switch", "on"), ("bare", "on"), ("sync", "off"), ("switch54", "off"),
          ("on", "off"), ("bare", "off_nonoverlap"), ("off_nonoverlap", "off"), ("bare_overlap", "off"),
          ("bare_overlap", "on"), ("bare_overlap", "bare"), ("defaults", "off"), ("switch", "defaults"),
          ("switch_overlap", "bare_overlap"), ("switch_overlap", "off"))


def load(path: str) -> dict | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def sweep_table(sweep: dict) -> list[str]:
    tps: dict[tuple[int, str], list[float]] = collections.defaultdict(list)
    lat: dict[tuple[int, str], list[float]] = collections.defaultdict(list)
    by_round: dict[tuple[int, int, str], float] = {}
    exact: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for p in sweep["phases"]:
        key = (p["concurrency"], p["server"])
        tps[key].append(p["tokens_per_s"])
        lat[key].append(p["latency_mean_s"])
        by_round[(p["round"], p["concurrency"], p["server"])] = p["tokens_per_s"]
        exact[p["server"]][0] += p["exact"]
        exact[p["server"]][1] += p["requests"]
    servers = [s for s in ORDER if any(k[1] == s for k in tps)]
    ratios = [(a, b) for a, b in RATIOS if a in servers and b in servers]
    head = ["concurrency"] + [f"{s} tok/s (lat s)" for s in servers] + [f"{a}/{b}" for a, b in ratios]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for conc in sorted({k[0] for k in tps}):
        cells = [str(conc)]
        for s in servers:
            v = tps.get((conc, s))
            cells.append(f"{statistics.median(v):,.0f} ({statistics.median(lat[(conc, s)]):.3f})" if v else "-")
        for a, b in ratios:  # the median of the per-round paired ratios
            pairs = [by_round[(r, c, a)] / by_round[(r, c, b)] for (r, c, s) in by_round
                     if c == conc and s == a and (r, c, b) in by_round and by_round[(r, c, b)] > 0]
            cells.append(f"{statistics.median(pairs):.2f} (n={len(pairs)})" if pairs else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("exact outputs: " + ", ".join(f"{s} {exact[s][0]}/{exact[s][1]}" for s in servers))
    return lines


def probe_table(fresh: dict | None, steady: dict | None) -> list[str]:
    if not fresh:
        return ["(no first-flip probe)"]
    later = {p["server"]: p for p in (steady or {}).get("probes", [])}
    lines = ["| server | fresh: long / max short (s) | later: long / max short (s) | first-flip cost: long, "
             "max short (ms) | exact |", "|---|---|---|---|---|"]
    for p in fresh["probes"]:
        q = later.get(p["server"])
        if q is None:
            lines.append(f"| {p['server']} | {p['long_latency_s']:.3f} / {p['max_short_latency_s']:.3f} | - | - | "
                         f"{p['exact']}/6 |")
            continue
        d_long = (p["long_latency_s"] - q["long_latency_s"]) * 1e3
        d_short = (p["max_short_latency_s"] - q["max_short_latency_s"]) * 1e3
        lines.append(f"| {p['server']} | {p['long_latency_s']:.3f} / {p['max_short_latency_s']:.3f} | "
                     f"{q['long_latency_s']:.3f} / {q['max_short_latency_s']:.3f} | {d_long:+.0f}, {d_short:+.0f} | "
                     f"{p['exact'] + q['exact']}/12 |")
    return lines


def switch_traces(out: str) -> dict[str, list[dict]]:
    """Each server's switch-trace records, time-ordered, read by summarize.py's `trace_events`: from tr/<server>/
    under OUT, or, once v1_run.sh has packed them, from its traces tarball (traces.tar.gz; committed as .tar.xz)."""
    sources = [out] if glob.glob(os.path.join(out, "tr", "*", "switch-*.jsonl")) \
        else sorted(glob.glob(os.path.join(out, "traces*.tar.gz")) + glob.glob(os.path.join(out, "traces*.tar.xz")))
    traces: dict[str, list[dict]] = collections.defaultdict(list)
    for name, ev in trace_events(sources, traces=("switch",)):
        traces[name].append(ev)
    return {name: sorted(events, key=lambda e: e.get("t", 0)) for name, events in sorted(traces.items())}


def trace_lines(out: str) -> list[str]:
    """The step timer per server, the switch's start-up warm-up left out (its steps pay the kernel builds and its
    flips are no traffic's: shim/switch/warmup.py tags them) and reported apart."""
    lines = []
    traces = switch_traces(out)
    for name, everything in traces.items():
        events = [e for e in everything if not e.get("warmup")]
        counts = collections.Counter(e["action"] for e in events)
        flips = [e for e in events if e["action"] in ("flip_off", "flip_on")]
        lines.append(f"- `{name}`: {dict(counts)}")
        cap = [e for e in events if e["action"] == "capture_plain_runner"]
        if cap:
            lines.append(f"  - plain runner captured at start-up in {cap[0].get('seconds')} s, hidden mode "
                         f"{cap[0].get('hidden_mode')}, batch sizes {cap[0].get('capture_bs')}")
        if flips and "ms" in flips[0]:
            ms = [f["ms"] for f in flips]
            lines.append(f"  - flip host time: first {flips[0]['action']} {ms[0]:.1f} ms; the others median "
                         f"{statistics.median(ms[1:]) if ms[1:] else 0:.1f} ms, max {max(ms[1:] or [0]):.1f} ms")
        for kind in ("plain", "spec"):  # the step timer (SPECFLIP_SWITCH_TRACE_EVERY: a sample of the steady steps)
            timings = [e for e in events if e["action"] == "timing" and e.get("kind") == kind]
            first = [e for e in timings if e.get("first_after_flip")]
            steady = [e for e in timings if not e.get("first_after_flip")]
            if not first:
                continue
            med = statistics.median(e["ms"] for e in steady) if steady else 0.0
            host = statistics.median(e.get("host_ms", 0.0) for e in steady) if steady else 0.0
            f0 = first[0]
            lines.append(f"  - {kind} steps timed: {len(timings)} ({sum(bool(e.get('graph')) for e in timings)} on "
                         f"graphs); the first after the first flip: {f0['ms']:.2f} ms device, "
                         f"{f0.get('host_ms', 0):.2f} ms host (bs {f0['bs']}); steady median {med:.2f} ms device, "
                         f"{host:.2f} ms host; the first after any flip: max {max(e['ms'] for e in first):.2f} ms "
                         f"device, {max(e.get('host_ms', 0) for e in first):.2f} ms host")
    lines += warmup_lines([(name, e) for name, events in traces.items() for e in events])
    return lines or ["(no switch trace)"]


def main() -> int:
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print("usage: python3 bench/gpu/v1_summarize.py OUT_DIR", file=sys.stderr)
        return 2
    out = sys.argv[1]
    sweep = load(os.path.join(out, "sweep.json"))
    print("## Side by side (median tok/s over rounds, mean latency; ratios: median of per-round paired ratios)\n")
    print("\n".join(sweep_table(sweep)) if sweep else "(no sweep.json)")
    print("\n## First flip on a freshly started server (probe: 1 long request, then 5 short ones)\n")
    print("\n".join(probe_table(load(os.path.join(out, "probe_fresh.json")),
                                load(os.path.join(out, "probe_steady.json")))))
    print("\n## Switch traces\n")
    print("\n".join(trace_lines(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
