"""Summarise device runs: the throughput/latency table, the switch's step timings (first step after a flip
vs steady) and a figure (matplotlib, the bench extra: pip install -e '.[bench]').

usage: python bench/gpu/summarize.py OUTDIR_OR_JSONL... [--traces DIR_OR_TGZ...] [--md FILE] [--plot FILE [--title T]]
       python bench/gpu/summarize.py --pool BENCH_JSONL... [--md FILE]   (one file per side-by-side call: the
       switch's paired-round ratios against the better of plain and always on, pooled over the calls)
"""
import datetime
import glob
import json
import os
import random
import re
import statistics
import sys
import tarfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from shim.timing.jsonl import IDLE_GAP_MS  # noqa: E402 - the switch trace's idle spell (one rule)
from specflip.cli_args import OneLineParser, positive_float  # noqa: E402

CFG_LABEL = {
    "plain": "plain decoding",
    "spec": "EAGLE-3 always on",
    "adaptive": "SGLang adaptive (tier config: steps 3, 0 from t_off)",
    "switch": "specflip switch, calibrated thresholds",
    "auto": "specflip switch, SPECFLIP_SWITCH=auto",
    "switch_guard": "specflip switch + guard (assert)",
    "auto_guard": "SPECFLIP_SWITCH=auto + guard (assert)",
    "specflip": "specflip switch (v2_switch_reserve_sync)",
    "specflip_none": "specflip, no draft work while off (known bad)",
    "specflip_retract": "specflip switch, plain path (plain_off_retract_catch_up, 1:0)",
    "specflip_retract_guard": "the same + guard (assert)",
    "specflip_retract_eagerprefill": "the same, prefills eager (SPECFLIP_PLAIN_PREFILL=eager)",
    "specflip_v0": "specflip (sync), before the admission fix",
    "specflip_none_v0": "specflip (none), before the admission fix",
    "specflip_t1_v0": "specflip (sync), t_off 1 / t_on 0, before the fix",
    "spec_steps2": "EAGLE-3 always on, steps 2",
    "spec_steps1": "EAGLE-3 always on, steps 1",
    "tiers": "specflip tiers switch (thresholds)",
    "auto_tiers": "specflip tiers switch, SPECFLIP_SWITCH=auto",
    "auto_tiers31": "specflip switch, SPECFLIP_SWITCH=auto, SPECFLIP_TIERS=3,1",
}
# the configurations with a "/ best(plain, always on)" column unless --ratio names others
RATIO_CFGS = ("switch", "auto", "switch_guard", "auto_guard", "specflip", "specflip_none", "specflip_retract",
              "specflip_retract_eagerprefill", "tiers", "auto_tiers", "auto_tiers31")
CFG_ORDER = list(CFG_LABEL)


def jsonl_files(path, pattern):
    """The files of `pattern` in a run folder, sorted; a file given is itself."""
    return sorted(glob.glob(os.path.join(path, pattern))) if os.path.isdir(path) else [path]


def read_jsonl(path):
    with open(path) as fh:
        return [json.loads(x) for x in fh if x.strip()]


def load_rows(paths):
    return [r for p in paths for f in jsonl_files(p, "bench*.jsonl") for r in read_jsonl(f)]


def load_sections(paths, pattern, title, lines):
    """Markdown: per file of `pattern` in each run folder with rows, `title` (its `{name}` the file's) and `lines` of
    its rows."""
    return [x for p in paths for f in jsonl_files(p, pattern) if (rows := read_jsonl(f))
            for x in [title.format(name=os.path.basename(f)), "", *lines(rows), ""]]


def in_table_order(cfgs):
    """The configuration names `cfgs` in table order: the known ones as CFG_LABEL lists them, then the rest sorted."""
    cfgs = set(cfgs)
    return [c for c in CFG_ORDER if c in cfgs] + sorted(cfgs - set(CFG_ORDER))


def by_cfg_round(rows):
    """{configuration: {round: row}} and the configurations in table order."""
    by = {}
    for r in rows:
        by.setdefault(r["cfg"], {})[r["round"]] = r
    return by, in_table_order(by)


def trace_events(sources, traces=("switch", "steps")):
    """(config name, event) of every line of every switch and step-timer trace under a run's $OUT
    (tr/NAME/switch-*.jsonl, tr/NAME/steps-*.jsonl; `traces` names which) or its tgz, read and parsed once for all
    the reports. The switch's start-up warm-up's records carry "warmup" (shim/switch/warmup.py tags them); a trace
    written before that tag gets it from the server log beside it (`mark_warmup_from_log`)."""
    out, logs = [], {}
    for src in sources:
        if os.path.isdir(src):
            for f in [f for kind in traces for f in glob.glob(os.path.join(src, "tr", "*", f"{kind}-*.jsonl"))]:
                with open(f) as fh:
                    out.append((f.split(os.sep)[-2], fh.read()))
            for f in glob.glob(os.path.join(src, "tr", "*", "server.log")):
                with open(f, errors="replace") as fh:
                    logs[f.split(os.sep)[-2]] = fh.read()
        elif src.endswith((".tar.gz", ".tar.xz")):
            with tarfile.open(src) as t:
                for m in t.getmembers():
                    if m.isfile() and any(f"/{kind}-" in m.name for kind in traces):
                        out.append((m.name.split("/")[-2], t.extractfile(m).read().decode()))
                    elif m.isfile() and m.name.endswith("/server.log"):
                        logs[m.name.split("/")[-2]] = t.extractfile(m).read().decode(errors="replace")
    events = [(cfg, json.loads(line)) for cfg, text in out for line in text.splitlines()]
    return mark_warmup_from_log(events, logs)


# the line the switch's warm-up logs when it is done (shim/switch/warmup.py), SGLang's log time in front (UTC on the
# device host)
WARMUP_DONE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] specflip warm-up: ", re.M)
# the records of the server's steps and flips; the configuration and capture records come before the warm-up
STEP_ACTIONS = {"step", "timing", "prefill", "flip_off", "flip_on", "tier", "tier_applied", "auto_observe"}


def mark_warmup_from_log(events, logs):
    """`events` with "warmup" set on a configuration's step and flip records before its server log's warm-up line
    (plus 1 s: the log's time has whole seconds), for traces written before the switch tagged them. A configuration
    whose trace has a tag of its own, or whose log has no such line, is left as it is."""
    tagged = {cfg for cfg, ev in events if "warmup" in ev}
    ends = {}
    for cfg, text in logs.items():
        m = WARMUP_DONE.search(text)
        if m and cfg not in tagged:
            done = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
            ends[cfg] = done.replace(tzinfo=datetime.UTC).timestamp() + 1.0
    if not ends:
        return events
    return [(cfg, {**ev, "warmup": True} if cfg in ends and ev.get("action") in STEP_ACTIONS
             and ev.get("t", 0.0) < ends[cfg] else ev) for cfg, ev in events]


def warmup_lines(events):
    """Markdown: per configuration, what its start-up warm-up's records hold (left out of every other report): the
    timed steps (their kernel builds) and the flips."""
    per = {}
    for cfg, ev in events:
        if ev.get("warmup"):
            per.setdefault(cfg, []).append(ev)
    md = []
    for cfg, evs in sorted(per.items()):
        timed = [e for e in evs if e.get("action") == "timing"]
        flips = [e["action"] for e in evs if e.get("action") in ("flip_off", "flip_on")]
        longest = max(timed, key=lambda e: e["ms"], default=None)
        md.append(f"- {cfg}: {len(timed)} timed steps"
                  + (f", the longest {longest['ms']:.1f} ms ({longest['kind']}, batch {longest['bs']})"
                     if longest else "")
                  + f"; {flips.count('flip_off')} flips off, {flips.count('flip_on')} on")
    return ["", "The switch's start-up warm-up (shim/switch/warmup.py), left out of the figures above:", ""] + md \
        if md else []


# the server configuration whose always-on throughput a learner mode is to be compared with
MODE_SERVER = {"plain": "plain", "spec": "spec", "steps=3": "spec", "steps=2": "spec_steps2", "steps=1": "spec_steps1"}


def learner_values_lines(events, rows):
    """Markdown: what an `auto` server's learner valued each mode at (tok/s, the median over its flip, tier and
    decision records at that demand) beside what the server running that mode always made at the same concurrency
    in the same call (bench rows; a demand no concurrency matches gives none). The learner times decode intervals;
    the client, whole requests: this says how far apart the two are, mode by mode. [] without such records."""
    tok_s = {(r["cfg"], r["conc"]): r["tok_s"] for r in rows}
    per = {}
    for cfg, ev in events:
        demand = ev.get("load") or ev.get("demand")  # the demand the values are for (`load` since 2026-12-03, eeb8707)
        if ev.get("policy") != "auto" or ev.get("warmup") or not demand:
            continue
        values = ev.get("values") or {"plain": ev.get("plain_value"), "spec": ev.get("spec_value")}
        for mode, v in values.items():
            if v is not None:
                per.setdefault((cfg, demand, mode), []).append(v)
    lines = []
    for (cfg, demand, mode), vals in sorted(per.items()):
        server = MODE_SERVER.get(mode)
        made = tok_s.get((server, demand))
        learned = statistics.median(vals)
        lines.append(f"| {cfg} | {demand} | {mode} | {learned:,.0f} ({len(vals)}) | "
                     + (f"{server}: {made:,.0f} | {learned / made:.2f} |" if made else "- | - |"))
    if not lines:
        return []
    return ["", "The `auto` learner's values against what the servers made (tok/s; the learner's: median over its "
            "decisions at that demand, n in brackets):", "",
            "| configuration | demand | mode | learner | server at that concurrency | learner / server |",
            "|---|---|---|---|---|---|"] + lines


def step_class(ev):
    """A timed decode step: the first after a flip, the first after an idle spell without a flip (its GPU clocked
    down: the baseline a flip-on's first step, which follows the server emptying, is compared with), or steady."""
    if ev["first_after_flip"]:
        return "first after a flip"
    if ev.get("after_prefill"):  # the step timer's first decode after a prefill: idle before it, or under load
        idle = ev.get("idle_ms")
        return "first after idle, no flip" if idle is not None and idle >= IDLE_GAP_MS else "first after a prefill"
    gap = ev.get("gap_ms")
    return "first after idle, no flip" if gap is not None and gap >= IDLE_GAP_MS else "steady"


# a decode launch this long after the one before, relative to its own step time, found the GPU done with the step before
IDLE_STREAM_FACTOR = 1.5


def onto_idle_stream(ev):
    """Whether a timed step was launched onto an idle stream: the host's gap since the previous decode launch longer
    than 1.5x the step itself, so the GPU had finished the step before. Its CUDA events then take in the host's own
    preparation of the launch inside run_batch, which a steady step's overlaps with the step before it; a first step
    after a flip is launched so as a rule (the flip's host work comes in between)."""
    gap = ev.get("gap_ms")
    return gap is not None and gap > IDLE_STREAM_FACTOR * ev["ms"]


def timed_steps(events, timer=False, classify=step_class):
    """The switch trace's CUDA-event step times (the step timer's with `timer`) by (configuration, kind, batch size,
    class), the class `classify(event)` (default `step_class`; None leaves the step out)."""
    by = {}
    for cfg, ev in events:
        if ev.get("action") == "timing" and bool(ev.get("timer")) == timer and (cls := classify(ev)) is not None:
            by.setdefault((cfg, ev["kind"], ev["bs"], cls), []).append(ev["ms"])
    return by


def pooled_ratios(steps, by, base_class):
    """Each timed step of `steps` [(cfg, event)] over the median of the `base_class` steps of its configuration, kind
    and batch size in `by` (timed_steps), pooled per (configuration, kind); a step with no such base gives none."""
    pooled, medians = {}, {}
    for cfg, ev in steps:
        key = (cfg, ev["kind"], ev["bs"], base_class)
        if key not in medians:
            medians[key] = statistics.median(by[key]) if by.get(key) else None
        if medians[key] is not None:
            pooled.setdefault((cfg, ev["kind"]), []).append(ev["ms"] / medians[key])
    return pooled


def pooled_lines(title, pooled):
    """Markdown: `title`, then per (configuration, kind) the pooled ratios' median, range and count."""
    return ["", title, ""] + [f"- {cfg}, {kind}: {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f}, n={len(r)})"
                              for (cfg, kind), r in sorted(pooled.items())]


def first_step_pooled(events):
    """Markdown: per configuration and kind, every first step after a flip over the steady median of its own batch
    size, pooled (the per-batch table's cells hold 1-6 samples each); then those of them that also followed an idle
    spell (a flip-on at a round's first arrival: the server had emptied, its GPU clocked down) over the median of
    the first steps after idle without a flip of their batch size, the baseline that separates the flip's cost from
    the idle spell's. [] when no first step has a steady median."""
    by = timed_steps(events)
    flips = [(cfg, ev) for cfg, ev in events
             if ev.get("action") == "timing" and not ev.get("timer") and ev["first_after_flip"]]
    pooled = pooled_ratios(flips, by, "steady")
    if not pooled:
        return []
    after_idle = pooled_ratios([(cfg, ev) for cfg, ev in flips if ev.get("gap_ms") is not None
                                and ev["gap_ms"] >= IDLE_GAP_MS], by, "first after idle, no flip")
    # the like-for-like base: steps without a flip that were launched onto an idle stream too, any gap
    idle_stream = timed_steps(events, classify=lambda ev: "onto an idle stream"
                              if not ev["first_after_flip"] and onto_idle_stream(ev) else None)
    over_idle_stream = pooled_ratios(flips, idle_stream, "onto an idle stream")
    md = pooled_lines("First step after a flip over a steady step of its batch size, pooled (median, range, n):",
                      pooled)
    if over_idle_stream:
        md += pooled_lines("First step after a flip over a step without a flip launched onto an idle stream (its host "
                           f"gap since the last launch over {IDLE_STREAM_FACTOR}x the step: the CUDA events take in "
                           "the launch's own host preparation, as after a flip) of its batch size, pooled (median, "
                           "range, n):", over_idle_stream)
    if after_idle:
        md += pooled_lines("First step after a flip that followed an idle spell, over a first step after idle "
                           "without a flip of its batch size, pooled (median, range, n):", after_idle)
    return md


def first_step_after_idle_baseline(events):
    """Markdown: the step timer's first decode after a prefill that followed an idle spell, on any server (no switch
    needed), over the steady timed steps of its kind and batch size, pooled per configuration: what a switch's first
    step after a flip-on at a round's first arrival is to be compared with. [] without such steps."""
    by = timed_steps(events, timer=True)
    firsts = [(cfg, ev) for cfg, ev in events if ev.get("action") == "timing" and ev.get("timer")
              and step_class(ev) == "first after idle, no flip"]
    pooled = pooled_ratios(firsts, by, "steady")
    return pooled_lines("Step timer: the first decode step after a prefill on an emptied server (idle spell, no "
                        "flip) over a steady step of its batch size, pooled (median, range, n):", pooled) if pooled \
        else []


def first_step_table(events):
    """Markdown: the first decode step after a flip against steady steps and first-after-idle steps of the same
    kind and batch size (issue 17: <= 1.1x a steady step), per configuration, medians of the switch trace's CUDA
    events; [] when no trace has both."""
    by = timed_steps(events)
    rows = []
    for (cfg, kind, bs, which), first in sorted(by.items()):
        if which != "first after a flip":
            continue
        steady = by.get((cfg, kind, bs, "steady"), [])
        idle = by.get((cfg, kind, bs, "first after idle, no flip"), [])
        med = statistics.median
        cells = [cfg, kind, str(bs), f"{med(first):.2f} ({len(first)})",
                 f"{med(steady):.2f} ({len(steady)})" if steady else "-",
                 f"{med(first) / med(steady):.2f}" if steady else "-",
                 f"{med(idle):.2f} ({len(idle)})" if idle else "-",
                 f"{med(first) / med(idle):.2f}" if idle else "-"]
        rows.append("| " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["", "First decode step after a flip, same kind and batch size (median ms, n):", "",
            "| configuration | step | batch | first after a flip | steady | ratio | first after idle, no flip | "
            "ratio |", "|---|---|---|---|---|---|---|---|"] + rows


def flip_on_under_load(events):
    """Markdown: per configuration, the flips on with requests running (the switch's default design retracts them,
    and their re-prefill rebuilds the draft KV): the requests each retracted, the time from the flip to the launch of
    the first speculative step after it (the switch trace's host clock: the re-prefill and that step's launch, what
    the running requests wait through; its `step` record is written at the launch), and that step's device time.
    A `timing` record's own time is when the trace read its CUDA events back, at a later traced step: up to a whole
    trace interval after the step (SPECFLIP_SWITCH_TRACE_EVERY), so it is not the step's time.
    [] when no flip on had a request running."""
    per_cfg = {}
    for cfg, ev in events:
        if not ev.get("timer"):
            per_cfg.setdefault(cfg, []).append(ev)
    md = []
    for cfg, evs in sorted(per_cfg.items()):
        flip, launched, waits, retracted, device = None, False, [], [], []
        for ev in sorted(evs, key=lambda e: e.get("t", 0.0)):
            act = ev.get("action")
            if act == "flip_on":
                flip, launched = (ev if ev.get("running") else None), False
            elif act == "flip_off":
                flip = None
            elif flip is not None and not launched and act == "step" and "verify" in ev.get("actions", ()):
                waits.append((ev["t"] - flip["t"]) * 1e3)
                retracted.append(flip.get("retracted", 0))
                launched = True
            elif flip is not None and launched and act == "timing" and ev["kind"] == "spec" \
                    and ev.get("first_after_flip"):
                device.append(ev["ms"])
                flip = None
        if waits:
            steps = (f"; that step {statistics.median(device):.1f} ms on the device (median; "
                     f"{min(device):.1f}-{max(device):.1f})") if device else ""
            md.append(f"- {cfg}: {len(waits)} flips on with requests running, {min(retracted)}-{max(retracted)} "
                      f"retracted each; the flip to the launch of the first speculative step: median "
                      f"{statistics.median(waits):.0f} ms ({min(waits):.0f}-{max(waits):.0f}){steps}")
    return ["", "Flips on under load (switch trace):", ""] + md if md else []


def timings(events):
    by = {}
    for cfg, ev in events:
        act = ev.get("action")
        if act == "timing":
            kind = ev["kind"] + (" (step timer)" if ev.get("timer") else "")
            key = (cfg, kind, step_class(ev))
            by.setdefault(key, []).append((ev["bs"], ev["ms"]))
        elif act == "step_time":  # shim/timing/step_timer.py: one scheduler loop iteration, host clock
            key = (cfg, ev["kind"] + " loop iteration (host)", "steady")
            by.setdefault(key, []).append((ev["bs"], ev["host_ms"]))
        elif act in ("flip_off", "flip_on"):
            by.setdefault((cfg, "flips", act), []).append((ev.get("running"), 0.0))
        elif act == "prefill" and "graph" in ev:  # the plain path's prefills (shim/switch/v2.py, trace on)
            by.setdefault((cfg, "plain prefills", "graph" if ev["graph"] else "eager"), []).append((ev["bs"], 0.0))
        elif act == "capture_plain_runner":
            by.setdefault((cfg, "capture", "s"), []).append((0, ev["seconds"]))
    return by


def fmt_cell(r):
    if r is None:
        return "-"
    cell = f"{r['tok_s']:,.0f} / {r['lat_mean']:.2f} s"
    total = r.get("outputs", r["nreq"])
    return cell if r["exact"] == total else cell + f" ({r['exact']}/{total} exact)"


def table(rows, ratio_cfgs=RATIO_CFGS):
    concs = sorted({r["conc"] for r in rows})
    cfgs = in_table_order(r["cfg"] for r in rows)
    get = {(r["cfg"], r["conc"]): r for r in rows}
    ratio_cfgs = [c for c in ratio_cfgs if c in cfgs]
    paired = any("round_tok_s_in_order" in r for r in rows)  # side by side: round k of each config is a pair
    head = ["concurrency"] + [CFG_LABEL.get(c, c) for c in cfgs] + [f"{c} / best(plain, always on)" for c in ratio_cfgs]
    head += [f"{c} / best, paired rounds (median, min-max)" for c in ratio_cfgs] if paired else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in concs:
        cells = [fmt_cell(get.get((cfg, c))) for cfg in cfgs]
        best = best_static_tok_s(get, c)
        for rc in ratio_cfgs:
            cells.append(f"{get[(rc, c)]['tok_s'] / best:.2f}" if best and (rc, c) in get else "-")
        for rc in ratio_cfgs if paired else ():
            ratios = paired_best_ratios(get, rc, c)
            cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def best_static_tok_s(get, conc):
    """The better of plain's and EAGLE-3 always on's tok/s at `conc` (whichever the rows have; 0: neither)."""
    return max((get[(b, conc)]["tok_s"] for b in ("plain", "spec") if (b, conc) in get), default=0)


def paired_ratios(row, base):
    """tok/s ratios of matched rounds (bench_client.py --servers: round k of each server used the same prompts,
    back to back), or [] when the rows were not measured side by side."""
    if not row or not base or "round_tok_s_in_order" not in row or "round_tok_s_in_order" not in base:
        return []
    return [a / b for a, b in zip(row["round_tok_s_in_order"], base["round_tok_s_in_order"], strict=False) if b]


def over_table(rows, base):
    """Every other configuration over `base`, round by round (side by side: round k of each is a pair), per
    concurrency: the paired median and range, e.g. a guarded switch over the bare one."""
    get = {(r["cfg"], r["conc"]): r for r in rows}
    cfgs = [c for c in dict.fromkeys(r["cfg"] for r in rows) if c != base]
    head = ["concurrency"] + [f"{c} / {base} (paired median, min-max)" for c in cfgs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for conc in sorted({r["conc"] for r in rows if r["cfg"] == base}):
        cells = []
        for c in cfgs:
            ratios = paired_ratios(get.get((c, conc)), get.get((base, conc)))
            cells.append(f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})" if ratios else "-")
        lines.append(f"| {conc} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_best_ratios(get, cfg, conc):
    """Round k of `cfg` over the better of plain and EAGLE-3 always on in round k (whichever of the two the call
    measured), for one side-by-side call's rows `get` ((cfg, conc) -> row); [] when not side by side."""
    row = get.get((cfg, conc))
    bases = [get[(b, conc)] for b in ("plain", "spec") if (b, conc) in get]
    if not row or not bases or any("round_tok_s_in_order" not in r for r in (row, *bases)):
        return []
    best = [max(rounds) for rounds in zip(*(b["round_tok_s_in_order"] for b in bases), strict=False)]
    return paired_ratios(row, {"round_tok_s_in_order": best})


def pooled_stats(files, cfg="specflip_retract", resamples=2000, seed=0):
    """Paired-round ratios of `cfg` over the better of plain and always on, pooled over several side-by-side calls
    (one bench JSONL each): per concurrency the pairs, the pooled median with a bootstrap 95 % interval
    (resampled pairs, seeded) and each call's median."""
    by_conc = {}
    for f in files:
        get = {(r["cfg"], r["conc"]): r for r in load_rows([f])}
        for c in sorted({conc for name, conc in get if name == cfg}):
            ratios = paired_best_ratios(get, cfg, c)
            if ratios:
                by_conc.setdefault(c, []).append(ratios)
    if not by_conc:
        raise SystemExit(f"summarize --pool: no side-by-side pairs of {cfg!r} against plain / always on in {files}")
    rng = random.Random(seed)
    stats = []
    for c, calls in sorted(by_conc.items()):
        ratios = [x for rs in calls for x in rs]
        medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
        stats.append({"conc": c, "pairs": len(ratios), "calls": len(calls), "median": statistics.median(ratios),
                      "lo": medians[int(0.025 * resamples)], "hi": medians[int(0.975 * resamples) - 1],
                      "per_call": [statistics.median(rs) for rs in calls]})
    return stats


def pooled(files, target=0.95, cfg="specflip_retract"):
    """pooled_stats of `cfg` as a markdown table, with whether each pooled median reaches `target`."""
    lines = [f"| concurrency | pairs (calls) | pooled median | bootstrap 95 % interval | median per call | "
             f">= {target} |", "|---|---|---|---|---|---|"]
    for st in pooled_stats(files, cfg):
        per_call = ", ".join(f"{m:.2f}" for m in st["per_call"])
        lines.append(f"| {st['conc']} | {st['pairs']} ({st['calls']}) | {st['median']:.3f} | "
                     f"{st['lo']:.3f}-{st['hi']:.3f} | {per_call} | {'yes' if st['median'] >= target else 'NO'} |")
    return "\n".join(lines)


def pyplot():
    """matplotlib's pyplot on its file-only backend: the bench extra (`pip install -e '.[bench]'`, which
    scripts/setup.sh installs). Without it, a figure asked for is bad usage: one line, exit 2."""
    try:
        import matplotlib
    except ImportError:
        print("summarize.py: the figures (--plot, --plot-bursty) need matplotlib: pip install -e '.[bench]' "
              "(scripts/setup.sh installs it)", file=sys.stderr)
        raise SystemExit(2) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path):
    """`fig` written to `path` in the format its extension names (svg, png, pdf), without a timestamp or random ids
    in an SVG, so the same data writes the same file."""
    plt = pyplot()
    plt.rcParams["svg.hashsalt"] = "specflip"
    plt.rcParams["svg.fonttype"] = "none"  # text as text: a smaller file, searchable
    fig.savefig(path, dpi=110, metadata={"Date": None} if path.endswith((".svg", ".pdf")) else None)
    plt.close(fig)
    return path


def pooled_figure(stats, target=0.95):
    """The pooled median ratio per concurrency with its bootstrap interval, each call's median beside it, the
    target and 1.0."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    concs = [st["conc"] for st in stats]
    medians = [st["median"] for st in stats]
    ax.errorbar(concs, medians, yerr=[[m - st["lo"] for m, st in zip(medians, stats, strict=True)],
                                      [st["hi"] - m for m, st in zip(medians, stats, strict=True)]],
                fmt="o", color="tab:blue", capsize=3, label="pooled median, bootstrap 95 % interval")
    calls = [(st["conc"], m) for st in stats for m in st["per_call"]]
    ax.scatter([c * 1.08 for c, _ in calls], [m for _, m in calls], s=9, color="grey", label="one call's median")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.axhline(target, color="tab:red", linestyle="--", linewidth=1, label=f"target {target}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(concs, [str(c) for c in concs])
    ax.set_xlabel("concurrency")
    ax.set_ylabel("switch / best(plain, always on)")
    ax.set_title("paired rounds pooled over calls", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def timing_lines(everything):
    """Markdown: the switch traces' reports from `trace_events`' (configuration, event) pairs, the warm-up's apart."""
    events = [(cfg, ev) for cfg, ev in everything if not ev.get("warmup")]
    md = []
    for (cfg, kind, which), vals in sorted(timings(events).items()):
        ms = [v[1] for v in vals]
        if kind == "flips":
            md.append(f"- {cfg}: {len(vals)} x {which}")
        elif kind == "plain prefills":
            md.append(f"- {cfg}: {len(vals)} plain-path prefills ran {which}")
        elif kind == "capture":
            md.append(f"- {cfg}: plain decode runner captured in {ms[0]:.1f} s")
        else:  # spec / plain steps (switch trace, step timer), loop iterations (step timer)
            what = kind if "loop iteration" in kind else f"{kind} step"
            md.append(f"- {cfg}, {what}, {which}: n={len(ms)}, median {statistics.median(ms):.2f} ms, "
                      f"mean {statistics.mean(ms):.2f} ms, mean batch {statistics.mean(v[0] for v in vals):.1f}")
    md += first_step_table(events)
    md += first_step_pooled(events)
    md += first_step_after_idle_baseline(events)
    md += flip_on_under_load(events)
    md += step_timer_lines(events)
    md += warmup_lines(everything)
    return md


def step_timer_lines(events):
    """The step timer's loop iterations and device spans by batch size bucket, configurations side by side."""
    buckets = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    by = {}
    for cfg, ev in events:
        if ev.get("action") == "step_time" or (ev.get("action") == "timing" and ev.get("timer")
                                               and not ev.get("after_prefill")):
            bucket = next(b for b in buckets if ev["bs"] <= b or b == buckets[-1])
            what = "host" if ev["action"] == "step_time" else "device"
            by.setdefault((cfg, what), {}).setdefault(bucket, []).append(ev.get("host_ms", ev.get("ms")))
    gc_lines = prefill_report(events) + gc_report(events)
    if not by:
        return gc_lines
    md = ["", "Step timer (shim/timing/step_timer.py), median ms per decode step by batch size (up to), "
          "n in brackets:", "",
          "| configuration | clock | " + " | ".join(str(b) for b in buckets) + " |",
          "|---|---|" + "---|" * len(buckets)]
    for (cfg, what), per in sorted(by.items()):
        cells = [f"{statistics.median(per[b]):.2f} ({len(per[b])})" if b in per else "-" for b in buckets]
        clock = "loop iteration (host)" if what == "host" else "run_batch span (CUDA events)"
        md.append(f"| {cfg} | {clock} | " + " | ".join(cells) + " |")
    return md + gc_lines


def prefill_report(events):
    """The step timer's prefill lines: what each admitted request costs the loop, per configuration (medians)."""
    per = {}
    for cfg, ev in events:
        if ev.get("action") == "prefill" and "run_ms" in ev:
            per.setdefault(cfg, {}).setdefault("run", []).append(ev["run_ms"])
            if ev.get("since_last_ms") is not None:
                per[cfg].setdefault("gap", []).append(ev["since_last_ms"])
            if ev.get("since_arrival_ms") is not None:
                per[cfg].setdefault("arrival", []).append(ev["since_arrival_ms"])
        elif ev.get("action") == "first_decode":
            per.setdefault(cfg, {}).setdefault("first", []).append(ev["since_prefill_ms"])
    med = lambda xs: f"{statistics.median(xs):.2f}" if xs else "-"  # noqa: E731
    md = [f"- {cfg}: {len(d.get('run', []))} prefills (step timer), median ms: "
          f"run_batch host time {med(d.get('run'))}, since the previous run_batch {med(d.get('gap'))}, "
          f"since the request reached the scheduler {med(d.get('arrival'))}, "
          f"prefill to the next decode step {med(d.get('first'))}"
          for cfg, d in sorted(per.items())]
    return ["", *md] if md else []


def gc_report(events):
    """The step timer's last `gc` line per scheduler process: collections and ms in the garbage collector."""
    last = {}
    for cfg, ev in events:
        if ev.get("action") == "gc" and ev["decode_steps"] >= last.get(cfg, {}).get("decode_steps", 0):
            last[cfg] = ev
    md = [f"- {cfg}: Python GC over {ev['decode_steps']} decode steps: collections by generation "
          f"{ev['gc_collections']}, ms {ev['gc_ms']}, longest {ev['gc_max_ms']} "
          f"({sum(ev['gc_ms']) / ev['decode_steps']:.3f} ms per decode step)" for cfg, ev in sorted(last.items())]
    return ["", *md] if md else []


def figure(rows, ratio_cfgs=RATIO_CFGS, title=None):
    """Throughput per configuration over concurrency and, for `ratio_cfgs`, the paired-round ratio to the better of
    plain and always on (median, with the rounds' range), or the ratio of the medians when not side by side."""
    plt = pyplot()
    cfgs = in_table_order(r["cfg"] for r in rows)
    get = {(r["cfg"], r["conc"]): r for r in rows}
    concs = sorted({r["conc"] for r in rows})
    ratio_cfgs = [c for c in ratio_cfgs if c in cfgs]
    color = {cfg: f"C{i % 10}" for i, cfg in enumerate(cfgs)}  # one colour per configuration in both panels
    fig, axes = plt.subplots(1, 2 if ratio_cfgs else 1, figsize=(12 if ratio_cfgs else 6.4, 4.5), squeeze=False)
    tput = axes[0][0]
    for cfg in cfgs:
        rs = sorted((r for r in rows if r["cfg"] == cfg), key=lambda r: r["conc"])
        tput.plot([r["conc"] for r in rs], [r["tok_s"] for r in rs], marker="o", color=color[cfg],
                  label=CFG_LABEL.get(cfg, cfg))
    tput.set_yscale("log")
    tput.set_ylabel("output tokens/s (median round)")
    if ratio_cfgs:
        ratio = axes[0][1]
        for cfg in ratio_cfgs:
            xs, mid, lo, hi = [], [], [], []
            for c in concs:
                rs = paired_best_ratios(get, cfg, c)
                if not rs and (cfg, c) in get:
                    best = best_static_tok_s(get, c)
                    rs = [get[(cfg, c)]["tok_s"] / best] if best else []
                if rs:
                    xs.append(c)
                    mid.append(statistics.median(rs))
                    lo.append(mid[-1] - min(rs))
                    hi.append(max(rs) - mid[-1])
            ratio.errorbar(xs, mid, yerr=[lo, hi], marker="o", capsize=3, color=color[cfg],
                           label=CFG_LABEL.get(cfg, cfg))
        ratio.axhline(1.0, color="grey", linewidth=0.8)
        ratio.set_ylabel("over the better of plain and always on\n(paired rounds: median, range)")
    for ax in axes[0]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(concs, [str(c) for c in concs])
        ax.set_xlabel("concurrency")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(textwrap.fill(title, 160), fontsize=10)
    fig.tight_layout()
    return fig


def trace_table(paths):
    """Issue 52's named traces (bursty_client.py --trace: trace_NAME.jsonl): per trace, the whole trace per
    configuration, then each phase."""
    return load_sections(paths, "trace_*.jsonl", "## Trace {name} (bursty_client.py --trace; paired rounds)",
                         trace_lines)


# issue 52's targets: auto >= 0.97x the per-phase best on every trace; p99 <= 1.05x the better static's in every
# phase; the guard within 2 %
TRACE_TARGETS = {"per_phase_best": 0.97, "p99": 1.05, "guard": 0.98}


def trace_lines(rows):
    """Markdown: the whole trace per configuration (per-phase best / this, better static / this, `auto` / this: for
    `auto_guard` the guard's cost; paired medians over the rounds), then per phase: each configuration's seconds over
    the per-phase best (the faster of plain and always on in that phase, same round) and its p99 over the better
    static p99 of that phase. A ratio needs both rows of its round; "-" where the call ran no such configuration."""
    by, cfgs = by_cfg_round(rows)
    statics = [b for b in ("plain", "spec") if b in by]
    med = statistics.median
    cell = lambda xs, f="{:.3f}": f.format(med(xs)) if xs else "-"  # noqa: E731
    labels = next(iter(next(iter(by.values())).values()))["phase_labels"]
    n = len(labels)

    def best(k, key, j=None):
        got = [(by[b][k][key] if j is None else by[b][k][key][j]) for b in statics if k in by[b]]
        return min(got) if len(got) == len(statics) and got else None

    head = ["configuration", "rounds", "total s", "exact", "per-phase best / this", "better static / this",
            "auto / this", "p99 s (whole trace)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cfgs:
        rs = by[c]
        if any(r["errors"] for r in rs.values()):
            lines.append(f"| {CFG_LABEL.get(c, c)} | {len(rs)} | failed: {sum(r['errors'] for r in rs.values())} "
                         "requests with errors |" + " - |" * (len(head) - 3))
            continue
        phase_best = [sum(ph) / r["total_s"] for k, r in rs.items()
                      if (ph := [best(k, "phase_s", j) for j in range(n)]) and None not in ph]
        static = [b / r["total_s"] for k, r in rs.items() if (b := best(k, "total_s")) is not None]
        vs_auto = [by["auto"][k]["total_s"] / r["total_s"] for k, r in rs.items() if k in by.get("auto", {})]
        lines.append(f"| {CFG_LABEL.get(c, c)} | {len(rs)} | {med(r['total_s'] for r in rs.values()):.2f} | "
                     f"{sum(r['exact'] for r in rs.values())}/{sum(r['requests'] for r in rs.values())} | "
                     f"{cell(phase_best)} | {cell(static)} | {cell(vs_auto)} | "
                     f"{med(r['lat_p99'] for r in rs.values()):.2f} |")
    lines += ["", "Per phase: seconds (median), per-phase best / this, p99 s, p99 / the better static p99 (paired "
              "medians), mean accept length:", "",
              "| phase | " + " | ".join(CFG_LABEL.get(c, c) for c in cfgs) + " |", "|---|" + "---|" * len(cfgs)]
    misses = []
    for j, label in enumerate(labels):
        cells = []
        for c in cfgs:
            rs = {k: r for k, r in by[c].items() if not r["errors"]}
            speed = [b / r["phase_s"][j] for k, r in rs.items() if (b := best(k, "phase_s", j)) is not None]
            p99 = [r["phase_p99"][j] / b for k, r in rs.items() if (b := best(k, "phase_p99", j)) is not None]
            acc = [r["phase_accept"][j] for r in rs.values() if r["phase_accept"][j] is not None]
            secs, tails = [r["phase_s"][j] for r in rs.values()], [r["phase_p99"][j] for r in rs.values()]
            cells.append(f"{cell(secs, '{:.2f}')} s, {cell(speed)}, p99 {cell(tails, '{:.2f}')} s ({cell(p99)}), "
                         f"acc {cell(acc, '{:.2f}')}" if secs else "-")
            if c.startswith("auto") and p99 and med(p99) > TRACE_TARGETS["p99"]:
                misses.append(f"{c}: p99 {med(p99):.3f}x the better static's in phase {j} ({label})")
        lines.append(f"| {j} {label} | " + " | ".join(cells) + " |")
    for c in [c for c in cfgs if c.startswith("auto")]:
        whole = [sum(ph) / r["total_s"] for k, r in by[c].items()
                 if (ph := [best(k, "phase_s", j) for j in range(n)]) and None not in ph and not r["errors"]]
        if whole and med(whole) < TRACE_TARGETS["per_phase_best"]:
            misses.append(f"{c}: {med(whole):.3f}x the per-phase best over the trace")
    guard = [by["auto"][k]["total_s"] / r["total_s"] for k, r in by.get("auto_guard", {}).items()
             if k in by.get("auto", {})]
    if guard and med(guard) < TRACE_TARGETS["guard"]:
        misses.append(f"auto_guard: {med(guard):.3f}x auto's speed (the guard's cost over 2 %)")
    lines += ["", "Issue 52's targets (>= 0.97x the per-phase best, p99 <= 1.05x the better static's per phase, "
              "the guard within 2 %): " + ("; ".join(misses) + "." if misses else "met where measured.")]
    return lines


def bursty_table(paths):
    """The bursty load (bursty_client.py rows): per configuration the median schedule time, tok/s and p99 latency
    over its rounds, and its paired-round time against the better static setting (plain, always on), against the
    per-phase best (each phase at the faster of the two, summed: what a free on/off choice once per phase would make)
    and against SGLang's adaptive switch in the same round (> 1: faster); with the quiet phases' mean accept length,
    prefix-cache hit rate and lone starts per round (`lone_cell`). Under the table, SGLang adaptive over the
    per-phase best: the most any on/off choice per phase makes against it. One table per file (bursty.jsonl,
    bursty_prefix.jsonl: the --shared-prefix load)."""
    return load_sections(paths, "bursty*.jsonl", "## Bursty load, {name} (bursty_client.py: quiet phases and bursts; "
                         "paired rounds)", bursty_lines)


def bursty_lines(rows):
    by, cfgs = by_cfg_round(rows)
    statics = [b for b in ("plain", "spec") if b in by]
    rounds = {k for b in statics for k in by[b]}
    best_static = {k: min(by[b][k]["total_s"] for b in statics if k in by[b]) for k in rounds}
    # the phases line up: every server of a round ran the same schedule
    per_phase = {k: sum(map(min, zip(*(by[b][k]["phase_s"] for b in statics if k in by[b]), strict=True)))
                 for k in rounds}
    head = ["configuration", "rounds", "total s (median)", "tok/s", "p99 latency s", "quiet p99 s", "exact",
            "best static / this (paired median)", "per-phase best / this (paired median)",
            "adaptive / this (paired median)", "quiet accept", "quiet hit", "quiet lone starts (rounds)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cfgs:
        rs = list(by[c].values())
        if any(r["errors"] for r in rs):  # a server that failed requests (died): its times mean nothing
            lines.append(f"| {CFG_LABEL.get(c, c)} | {len(rs)} | failed: {sum(r['errors'] for r in rs)} requests "
                         f"with errors, {sum(r['exact'] for r in rs)}/{sum(r['requests'] for r in rs)} exact |"
                         + " - |" * (len(head) - 3))
            continue
        med = lambda key, rs=rs: statistics.median(r[key] for r in rs)
        vs_best = [best_static[k] / r["total_s"] for k, r in by[c].items() if k in best_static]
        vs_phase = [per_phase[k] / r["total_s"] for k, r in by[c].items() if k in per_phase]
        vs_ad = [by["adaptive"][k]["total_s"] / r["total_s"] for k, r in by[c].items() if k in by.get("adaptive", {})]
        cell = lambda xs: f"{statistics.median(xs):.3f}" if xs else "-"
        opt = lambda key, rs=rs: [r[key] for r in rs if r.get(key) is not None]
        lines.append(f"| {CFG_LABEL.get(c, c)} | {len(rs)} | {med('total_s'):.2f} | {med('tok_s'):,.0f} | "
                     f"{med('lat_p99'):.2f} | {med('quiet_lat_p99'):.2f} | {sum(r['exact'] for r in rs)}/"
                     f"{sum(r['requests'] for r in rs)} | {cell(vs_best)} | {cell(vs_phase)} | {cell(vs_ad)} | "
                     f"{cell(opt('quiet_accept'))} | {cell(opt('quiet_hit'))} | {lone_cell(by[c])} |")
    bound = [by["adaptive"][k]["total_s"] / per_phase[k] for k in per_phase if k in by.get("adaptive", {})]
    if bound:
        names = " and ".join(CFG_LABEL.get(b, b) for b in statics)
        lines += ["", f"Per-phase best (each phase at the faster of {names}, summed): "
                  f"{statistics.median(per_phase.values()):.2f} s (median); SGLang adaptive over it "
                  f"{statistics.median(bound):.3f} ({min(bound):.3f}-{max(bound):.3f}): the most an on/off choice "
                  "made once per phase, at no cost, makes against it."]
    lines += window_lines(by, statics)
    return lines


# issue 17's bursty targets: a switch >= 1.2x the better static setting and >= 2x SGLang's adaptive switch
BURSTY_TARGETS = (1.2, 2.0)


def phase_kind_seconds(rounds):
    """(quiet, burst): a configuration's seconds in each kind of phase (phase_s alternates quiet phase, burst),
    summed over the schedule, the median over its rounds."""
    return tuple(statistics.median(sum(r["phase_s"][kind::2]) for r in rounds) for kind in (0, 1))


def target_window(mine, statics, adaptive, targets=BURSTY_TARGETS, grid=2000, top=4.0):
    """The burst scalings k (every burst k times as long, the quiet phases as they are) at which a configuration
    with phase seconds `mine` (quiet, burst) is >= targets[0] x every static's and >= targets[1] x adaptive's
    (q + k b over q' + k b'): (low, high) over a grid of k in (0, top], or None where no k meets both. Each ratio
    is monotone in k, so the k meeting both are one interval. An estimate: it takes a burst's time to scale with its
    requests, as whole waves do."""
    def ratio(other, k):
        return (other[0] + k * other[1]) / (mine[0] + k * mine[1])
    ok = [k for k in (top * (i + 1) / grid for i in range(grid))
          if min(ratio(s, k) for s in statics) >= targets[0] and ratio(adaptive, k) >= targets[1]]
    return (ok[0], ok[-1]) if ok else None


def window_lines(by, statics):
    """Markdown: where issue 17's two bursty targets can both be met. Per switch configuration (and the per-phase
    best), the range of burst scalings k, relative to this load (k = 1), at which its phase times meet both: the
    bursts must be long enough for the 2x over adaptive and short enough for the 1.2x over static, and a load outside
    that range cannot meet both with any policy at these phase times."""
    if "adaptive" not in by or not statics:
        return []
    seconds = {c: phase_kind_seconds(list(rounds.values())) for c, rounds in by.items()
               if not any(r["errors"] for r in rounds.values())}
    if "adaptive" not in seconds or any(b not in seconds for b in statics):
        return []
    # the per-phase best only where both static settings ran (with one it is that setting itself)
    best = {"per-phase best": (min(seconds[b][0] for b in statics), min(seconds[b][1] for b in statics))} \
        if len(statics) > 1 else {}
    mine = {**best, **{CFG_LABEL.get(c, c): seconds[c] for c in seconds if c not in statics and c != "adaptive"}}
    low, high = BURSTY_TARGETS
    lines = ["", f"Where both targets ({low}x the better static setting, {high}x SGLang adaptive) hold, by burst "
             "length (bursts k times this load's, the quiet phases as they are; an estimate from the median phase "
             "seconds, a burst's time taken to scale with its requests):", ""]
    for name, s in mine.items():
        w = target_window(s, [seconds[b] for b in statics], seconds["adaptive"])
        where = f"k in {w[0]:.2f}-{w[1]:.2f}" if w else "no k"
        lines.append(f"- {name} (quiet {s[0]:.2f} s, bursts {s[1]:.2f} s): {where}")
    return lines


def bursty_figure(rows, title=None):
    """The bursty load per configuration: its median round's phases as one bar, quiet phases and bursts in their own
    colours, the round's total at the end; configurations that failed requests are left out (their times mean
    nothing)."""
    plt = pyplot()
    by, cfgs = by_cfg_round(rows)
    cfgs = [c for c in cfgs if not any(r["errors"] for r in by[c].values())]
    if not cfgs:
        raise ValueError("every configuration failed requests in some round: nothing to draw")
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.55 * len(cfgs)))
    colour = ("tab:blue", "tab:orange")  # the schedule alternates: quiet phase, burst, quiet phase, ...
    for y, c in enumerate(reversed(cfgs)):
        ranked = sorted(by[c].values(), key=lambda r: r["total_s"])
        median = ranked[(len(ranked) - 1) // 2]
        left = 0.0
        for i, seconds in enumerate(median["phase_s"]):
            ax.barh(y, seconds, left=left, color=colour[i % 2], edgecolor="white")
            left += seconds
        ax.text(median["total_s"], y, f" {median['total_s']:.2f} s", va="center", fontsize=8)
    ax.set_yticks(range(len(cfgs)), [CFG_LABEL.get(c, c) for c in reversed(cfgs)], fontsize=8)
    ax.set_xlabel("seconds (the median round of each; bars: its phases in order)")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colour[0]), plt.Rectangle((0, 0), 1, 1, color=colour[1])],
              labels=["quiet phase", "burst"], fontsize=8, loc="lower right")
    ax.set_xlim(0, 1.12 * max(r["total_s"] for c in cfgs for r in by[c].values()))
    if title:
        fig.suptitle(textwrap.fill(title, 110), fontsize=9)
    fig.tight_layout()
    return fig


def lone_cell(rounds):
    """The quiet phases' requests that reached the server alone, round by round (bursty_client.py's quiet_lone; "-"
    where the rows predate it or one request was in flight): a round whose clients fell out of step pays a lone
    prefill per request on a speculative server."""
    got = [rounds[k].get("quiet_lone") for k in sorted(rounds)]
    return ", ".join("-" if n is None else str(n) for n in got) if any(n is not None for n in got) else "-"


def open_loop_table(paths):
    """The open-loop load (open_loop_client.py rows, open_loop.jsonl): per configuration the medians over its rounds
    of the schedule's seconds, tok/s, p50 and p99 latency (from each request's arrival) and p99 per rate of the
    profile, the mean requests in flight, and the better static setting's p50 and p99 over its own in the same round
    (> 1: lower latency than the better of plain and always on)."""
    return load_sections(paths, "open_loop.jsonl", "## Open-loop load, {name} (open_loop_client.py: arrivals on a "
                         "fixed schedule; paired rounds)", open_loop_lines)


def open_loop_lines(rows):
    by, cfgs = by_cfg_round(rows)
    statics = [b for b in ("plain", "spec") if b in by]

    def best(key, k):
        got = [by[b][k][key] for b in statics if k in by[b]]
        return min(got) if got else None

    def ratio(key, rounds):
        """The better static setting's `key` over this configuration's, paired by round (median)."""
        got = [b / r[key] for k, r in rounds.items() if (b := best(key, k)) is not None]
        return f"{statistics.median(got):.3f}" if got else "-"

    head = ["configuration", "rounds", "seconds", "tok/s", "p50 s", "p99 s", "p99 s per rate", "in flight", "exact",
            "best static p50 / this", "best static p99 / this"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    med = statistics.median
    for c in cfgs:
        rs = list(by[c].values())
        if any(r["errors"] for r in rs):
            lines.append(f"| {CFG_LABEL.get(c, c)} | {len(rs)} | failed: {sum(r['errors'] for r in rs)} requests "
                         "with errors |" + " - |" * (len(head) - 3))
            continue
        per_rate = [med(got) if (got := [r["rate_p99"][j] for r in rs if r["rate_p99"][j] is not None]) else None
                    for j in range(len(rs[0]["rate_p99"]))]
        lines.append(f"| {CFG_LABEL.get(c, c)} | {len(rs)} | {med(r['total_s'] for r in rs):.2f} | "
                     f"{med(r['tok_s'] for r in rs):,.0f} | {med(r['lat_p50'] for r in rs):.2f} | "
                     f"{med(r['lat_p99'] for r in rs):.2f} | "
                     f"{', '.join('-' if x is None else f'{x:.2f}' for x in per_rate)} | "
                     f"{med(r['in_flight'] for r in rs):.1f} | {sum(r['exact'] for r in rs)}/"
                     f"{sum(r['requests'] for r in rs)} | {ratio('lat_p50', by[c])} | {ratio('lat_p99', by[c])} |")
    return lines


def main():
    p = OneLineParser(prog="summarize", description=__doc__.splitlines()[0])
    p.add_argument("sources", nargs="+", help="a run's $OUT folder or bench JSONL files")
    p.add_argument("--traces", nargs="*", default=None, help="trace sources (default: the run folders)")
    p.add_argument("--md")
    p.add_argument("--plot", metavar="FILE", help="a figure of the bench rows (--pool: of the pooled ratios), in the "
                   "format the name's extension gives (.svg, .png, .pdf); needs matplotlib, the bench extra")
    p.add_argument("--plot-bursty", metavar="FILE", help="a figure of the bursty load's rows (one file: bursty*.jsonl, "
                   "or a run folder's bursty.jsonl): each configuration's phases")
    p.add_argument("--title", help="--plot, --plot-bursty: the figure's title (what it was measured on)")
    p.add_argument("--pool", action="store_true", help="pool the switch's paired ratios over these calls' files")
    p.add_argument("--cfg", default="specflip_retract", help="--pool: the configuration whose ratios are pooled")
    p.add_argument("--target", type=positive_float, default=0.95,
                   help="--pool: the ratio each pooled median must reach")
    p.add_argument("--ratio", type=lambda v: tuple(c for c in v.split(",") if c), default=RATIO_CFGS,
                   metavar="CFG,...", help="the configurations given a '/ best(plain, always on)' column "
                                           f"(default: {','.join(RATIO_CFGS)})")
    p.add_argument("--over", metavar="CFG", help="also every configuration over CFG, paired rounds")
    a = p.parse_args()
    if a.pool:
        text = pooled(a.sources, a.target, a.cfg)
        print(text)
        if a.plot:
            print("plot:", save(pooled_figure(pooled_stats(a.sources, a.cfg), a.target), a.plot))
        if a.md:
            with open(a.md, "w") as fh:
                fh.write(text + "\n")
        return 0
    # a run folder holds every kind of file; a file given is one kind, by its name (bench_*, bursty_*, open_loop*)
    dirs = [s for s in a.sources if os.path.isdir(s)]
    named = {kind: [s for s in a.sources if not os.path.isdir(s) and os.path.basename(s).startswith(kind)]
             for kind in ("bursty", "open_loop", "trace")}
    rows = load_rows([s for s in a.sources if s not in named["bursty"] + named["open_loop"] + named["trace"]])
    traces = a.traces if a.traces is not None else dirs
    md = ["## Throughput / mean latency", "", table(rows, a.ratio) if rows else "(no bench rows)", ""]
    if a.over and rows:
        if not any(r["cfg"] == a.over for r in rows):
            p.error(f"--over {a.over}: no such configuration in the bench rows")
        md += [f"## Over {a.over}, paired rounds", "", over_table(rows, a.over), ""]
    md += ["## Switch step timings (GPU ms per decode step, CUDA events around the worker call)", ""]
    events = trace_events(traces)  # read and parsed once for every report of them
    md += timing_lines(events)
    if rows:
        md += learner_values_lines(events, rows)
    md += [""] + bursty_table(dirs + named["bursty"])
    md += trace_table(dirs + named["trace"])
    md += open_loop_table(dirs + named["open_loop"])
    text = "\n".join(md)
    print(text)
    if a.md:
        with open(a.md, "w") as fh:
            fh.write(text + "\n")
    if a.plot and rows:
        print("plot:", save(figure(rows, a.ratio, a.title), a.plot))
    if a.plot_bursty:
        bursty = [read_jsonl(f) for src in dirs + named["bursty"] for f in jsonl_files(src, "bursty.jsonl")]
        if len(bursty) != 1 or not bursty[0]:
            p.error(f"--plot-bursty wants the rows of one bursty load; found {len(bursty)} file(s) with rows")
        try:
            fig = bursty_figure(bursty[0], a.title)
        except ValueError as exc:
            p.error(f"--plot-bursty: {exc}")
        print("plot:", save(fig, a.plot_bursty))


if __name__ == "__main__":
    sys.exit(main())
