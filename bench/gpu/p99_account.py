"""Account for `auto`'s per-phase p99 from a side-by-side --trace call's raw files (issue 52's p99 target).

usage: python bench/gpu/p99_account.py CALL_DIR [--cfg auto] [--base spec] [--gap 5]

CALL_DIR holds bursty_client.py's trace_*.jsonl rows, run.log (the order the rows ran in) and traces.tar.gz (the
switch trace of CFG's server: the largest tr/CFG/switch-*.jsonl). The switch trace has no request ids, so each
CFG round is matched to one busy stretch of its switch trace (records more than --gap seconds apart split them; the
last stretches are the trace rounds, checked against the row's total seconds), and each phase to the stretch's
seconds by the row's phase_s. Per phase it prints what the switch did (decisions, flips with their ms and catch-up
seconds, decode-step windows per mode) and the excess those cost the requests running then:
- a window in the mode that loses in that phase (the faster static's mode, by the rows' median phase seconds) costs
  each running request its seconds minus the seconds the faster mode takes for the same tokens a request (the
  faster mode's seconds a token a request from the phase's own windows in that mode, else from the whole call's at
  the same batch size);
- a flip costs its ms and its catch-up seconds (every running request waits for both).
The slowest request of a phase lives about the better static's p99 seconds; the most excess inside any stretch of
that length is what the switch can have added to it ("max in one life"). What the switch's decisions do not explain
(the residual: auto's p99 minus the better static's minus that excess) is the per-step cost of the switch or noise;
so is what the excess leaves of the phase's seconds over the faster static's in the same round.
Rows with per-request records (bursty_client.py's `req`, since 2026-12-06) also get the slowest request's own
start, latency and the excess inside its own life.
"""
import io
import json
import os
import re
import statistics
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from specflip.cli_args import OneLineParser, positive_float  # noqa: E402

BURSTY = re.compile(r"^BURSTY (\{.*\})\s*$")


def run_order(call_dir):
    """The trace rows in the order they ran (run.log's BURSTY lines, cut to 300 characters there: the keys that
    identify a row), as (trace, cfg, round)."""
    out = []
    with open(os.path.join(call_dir, "run.log")) as fh:
        for line in fh:
            if line.startswith("BURSTY "):
                m = re.search(r'"cfg": "([^"]+)", "round": (\d+)', line)
                t = re.search(r'"trace": "([^"]+)"', line)
                if m and t:
                    out.append((t.group(1), m.group(1), int(m.group(2))))
    return out


def trace_rows(call_dir):
    """{(trace, cfg, round): row} from the call's trace_*.jsonl."""
    rows = {}
    for name in sorted(os.listdir(call_dir)):
        if name.startswith("trace_") and name.endswith(".jsonl"):
            with open(os.path.join(call_dir, name)) as fh:
                for line in fh:
                    if line.strip():
                        r = json.loads(line)
                        rows[(r["trace"], r["cfg"], r["round"])] = r
    return rows


def switch_records(call_dir, cfg):
    """The records of CFG's largest switch trace in traces.tar.gz."""
    with tarfile.open(os.path.join(call_dir, "traces.tar.gz")) as tar:
        members = [m for m in tar.getmembers()
                   if re.fullmatch(rf"(.*/)?tr/{re.escape(cfg)}/switch-\d+\.jsonl", m.name)]
        if not members:
            raise SystemExit(f"p99_account: no tr/{cfg}/switch-*.jsonl in {call_dir}/traces.tar.gz")
        f = tar.extractfile(max(members, key=lambda m: m.size))
        return [json.loads(x) for x in io.TextIOWrapper(f, encoding="utf-8") if x.strip()]


def busy(r):
    """A record of work: anything but the start-up's and an idle decision."""
    if r.get("warmup") or r["action"] in ("config", "capture_plain_runner"):
        return False
    return r["action"] != "auto_decide" or bool(r.get("running") or r.get("waiting"))


def stretches(records, gap):
    """[(first busy t, last busy t)] of the busy stretches, split where busy records are more than `gap` s apart."""
    out = []
    for r in records:
        if busy(r):
            if not out or r["t"] - out[-1][1] > gap:
                out.append([r["t"], r["t"]])
            out[-1][1] = r["t"]
    return [tuple(s) for s in out]


def windows(records):
    """The decode-step windows (`auto_observe`) with the running count of the last decision or step before each:
    [(t_end, spec, steps, seconds, accept, running)]; a window's steps end at its t."""
    running, out = 0, []
    for r in records:  # tests/test_auto_h200_shifts.py `extract_windows`'s running count
        if r["action"] == "auto_decide":
            running = r["running"] or running
        elif r["action"] == "step" and "bs" in r:
            running = r["bs"]
        elif r["action"] == "auto_observe" and r["spec"] in (0, r["n"]):
            out.append((r["t"], r["spec"] > 0, r["n"], r["seconds"], r["accept_mean"] or 1.0, running))
    return out


def s_per_token(wins, spec, running):
    """Median seconds a step per token a request, over windows of this mode at this batch size (None: none)."""
    got = [w[3] / w[2] / (w[4] if spec else 1.0) for w in wins if w[1] == spec and w[5] == running and w[2] >= 4]
    return statistics.median(got) if got else None


def excess_events(recs, wins, all_wins, fast_spec):
    """[(t, seconds, what)]: each wrong-mode window's excess and each flip's stall, for every request running then."""
    ev = []
    for t, spec, n, sec, acc, running in wins:
        if spec == fast_spec:
            continue
        rate = s_per_token(wins, fast_spec, running) or s_per_token(all_wins, fast_spec, running)
        if rate is None:
            continue
        tokens = n * (acc if spec else 1.0)
        ev.append((t, sec - tokens * rate, f"{'spec' if spec else 'plain'} window"))
    for r in recs:
        if r["action"] in ("flip_on", "flip_off"):
            ev.append((r["t"], (r.get("ms") or 0.0) / 1000, f"{r['action']} {r['reason']}"))
        if r["action"] == "auto_observe" and r.get("catch_up_s"):
            ev.append((r["t"], r["catch_up_s"], "catch-up"))
    return sorted(ev)


def max_in_life(ev, life):
    """The most excess inside any stretch of `life` seconds."""
    best = 0.0
    for i, (t, _, _) in enumerate(ev):
        best = max(best, sum(x for u, x, _ in ev[i:] if u <= t + life))
    return best


def compress(reasons):
    """Runs of equal decision reasons: 'a x3, b, ...'."""
    out = []
    for x in reasons:
        if out and out[-1][0] == x:
            out[-1][1] += 1
        else:
            out.append([x, 1])
    return ", ".join(f"{x} x{k}" if k > 1 else x for x, k in out)


def median_phase(rows, trace, cfg, i, key):
    got = [r[key][i] for (tr, c, _), r in rows.items() if tr == trace and c == cfg]
    return statistics.median(got) if got else None


def account(call_dir, cfg="auto", base="spec", gap=5.0):
    rows, order = trace_rows(call_dir), run_order(call_dir)
    mine = [k for k in order if k[1] == cfg and k in rows]
    recs = switch_records(call_dir, cfg)
    spans = stretches(recs, gap)[-len(mine):]
    all_wins = windows(recs)
    t0 = recs[0]["t"]
    lines = [f"# {call_dir}: {cfg}'s phases against the switch trace ({len(mine)} rounds)"]
    for key, (start, end) in zip(mine, spans, strict=False):
        row = rows[key]
        trace, _, k = key
        off = abs(end - start - row["total_s"]) > 0.5  # then the stretch is not this round's
        lines += ["", f"## {trace} round {k}: busy {end - start:.2f} s in the switch trace at {start - t0:.2f} s, "
                      f"the row's total {row['total_s']:.2f} s" + (" (MISMATCH: not this round's?)" if off else "")]
        at = start
        for i, (label, sec) in enumerate(zip(row["phase_labels"], row["phase_s"], strict=True)):
            lo, hi = at, at + sec
            at = hi
            statics = {c: (median_phase(rows, trace, c, i, "phase_s"), median_phase(rows, trace, c, i, "phase_p99"))
                       for c in ("plain", base)}
            fast = min(statics, key=lambda c: statics[c][0] or float("inf"))
            best_p99 = min(p for _, p in statics.values() if p is not None)
            fast_spec = fast != "plain"
            prec = [r for r in recs if lo <= r["t"] < hi]
            pw = [w for w in all_wins if lo <= w[0] < hi]
            ev = excess_events(prec, pw, all_wins, fast_spec)
            life = max_in_life(ev, best_p99)
            p99 = row["phase_p99"][i]
            spec_w = [w for w in pw if w[1]]
            plain_w = [w for w in pw if not w[1]]

            def mode(ws):
                n = sum(w[2] for w in ws)
                return (f"{n} steps {sum(w[3] for w in ws):.3f} s"
                        + (f" ({1000 * sum(w[3] for w in ws) / n:.2f} ms/step)" if n else ""))
            lines.append(f"- phase {i} {label} ({sec:.2f} s; {cfg} p99 {p99:.3f} s, better static p99 "
                         f"{best_p99:.3f} s: {p99 / best_p99:.3f}x; faster mode {fast} {statics[fast][0]:.2f} s, "
                         f"{cfg} / it {sec / statics[fast][0]:.3f})")
            lines.append(f"  windows: spec {mode(spec_w)}; plain {mode(plain_w)}; running "
                         f"{sorted({w[5] for w in pw})}")
            first = next((r for r in recs if lo - 0.02 <= r["t"] < hi and r["action"] == "auto_decide"
                          and r["demand"] > 0), None)
            if first is not None:  # the admission's decision: what the arriving requests were valued at
                # and how long the server had stood empty before it (the decision before it was `idle`: a closed
                # loop's turnover is a few ms, a phase's start after a burst tens of ms; the demand hold counts it)
                before = next((r for r in reversed(recs) if r["t"] < first["t"] and r["action"] == "auto_decide"),
                              None)
                empty = f" after {1000 * (first['t'] - before['t']):.0f} ms idle" \
                    if before is not None and before["reason"] == "idle" else ""
                lines.append(f"  first decision at {first['t'] - lo:+.3f} s{empty}: {first['reason']}, running "
                             f"{first['running']}, waiting {first['waiting']}, valued at load {first['load']} and "
                             f"context {first['context']}, spec {first['spec_value']} / plain {first['plain_value']} "
                             f"tok/s, {'speculating' if first['incumbent'] != 'plain' else 'plain'} incumbent")
            reasons = [r["reason"] for r in prec if r["action"] == "auto_decide"]
            lines.append(f"  decisions: {compress(reasons) or '-'}")
            for r in prec:
                if r["action"] in ("flip_on", "flip_off"):
                    cu = next((x["catch_up_s"] for x in prec if x["t"] > r["t"] and x.get("catch_up_s")), None)
                    lines.append(f"  {r['action']} at +{r['t'] - lo:.3f} s ({r['reason']}): {r.get('running')} "
                                 f"running, {r.get('ms')} ms, retracted {r.get('retracted')}"
                                 + (f", catch-up {cu * 1000:.1f} ms" if cu and r["action"] == "flip_on" else ""))
            total = sum(x for _, x, _ in ev)
            lines.append(f"  excess (wrong-mode windows + flips + catch-ups): {total:.3f} s in the phase, "
                         f"max in one life ({best_p99:.2f} s) {life:.3f} s; p99 over the better static "
                         f"{p99 - best_p99:+.3f} s, residual {p99 - best_p99 - life:+.3f} s")
            same = rows.get((trace, fast, k))  # the faster static's own round: the phase's seconds beside auto's
            if same is not None:
                d = sec - same["phase_s"][i]
                lines.append(f"  seconds: {cfg} {sec:.3f} against {fast} {same['phase_s'][i]:.3f} in the same round "
                             f"({d:+.3f} s); the excess explains {total:.3f} s, unexplained {d - total:+.3f} s "
                             f"({100 * (d - total) / same['phase_s'][i]:+.1f} %: the switch's per-step cost, or noise)")
            reqs = [q for q in row.get("req", []) if q[0] == i]
            if reqs:
                q = max(reqs, key=lambda q: q[2])
                own = [(t, x, w) for t, x, w in ev if start + q[1] <= t <= start + q[1] + q[2]]
                lines.append(f"  slowest request: start +{start + q[1] - lo:.3f} s into the phase, {q[2]:.3f} s, "
                             f"{q[3]} tokens; excess in its "
                             f"life {sum(x for _, x, _ in own):.3f} s ("
                             + (", ".join(f"{w} {x * 1000:.0f} ms" for _, x, w in own if abs(x) >= 0.002) or "-")
                             + ")")
    return lines


def main():
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("call_dir")
    p.add_argument("--cfg", default="auto", help="the switch's configuration name (its tr/CFG/ switch trace)")
    p.add_argument("--base", default="spec", help="the speculative static configuration")
    p.add_argument("--gap", type=positive_float, default=5.0, help="seconds without work that split busy stretches")
    a = p.parse_args()
    if not os.path.isfile(os.path.join(a.call_dir, "run.log")):
        p.error(f"{a.call_dir}: no run.log (a device call's folder: run.log, trace_*.jsonl, traces.tar.gz)")
    print("\n".join(account(a.call_dir, a.cfg, a.base, a.gap)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
