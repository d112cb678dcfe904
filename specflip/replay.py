"""`specflip replay`: send flip schedules to a live SGLang server and judge what came back.

Reports, per run: greedy equality (the counter target makes every output exactly known; with
`--compare-url` also equal to a server without speculation), lost requests, errors, and conformance of the
switch's trace to the model (every observed action is a model action allowed in the stage and mode the
trace is in; which model actions were covered). Guard traces (shim.guard.trace, SPECFLIP_MODE=trace) are
explained by `specflip.explain.explain_traces` when that module is present.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from shim.guard.trace import TraceFormatError
from shim.settings import settings
from specflip.explain import explain_traces
from specflip.outputs import cache_dir, has_mark, writable_dir, writable_file, write_file
from specflip.ranks import RankTraceError
from specflip.schedules import (
    VOCAB,
    WRITTEN_BY,
    WRITTEN_BY_MARK,
    Schedule,
    ScheduleError,
    generate,
    load,
    schedules_json,
)
from statemodel.actions import ACTIONS_BY_NAME
from statemodel.design import DraftWhileOff
from statemodel.designs import get_design
from statemodel.state import SpecMode, Stage


class ReplayError(RuntimeError):
    """A problem the user can act on; printed as one line."""


@attrs.frozen
class Outcome:
    """What one request got back."""

    index: int
    output_ids: tuple[int, ...] | None
    error: str | None
    latency_s: float
    accept_length: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "output_ids": None if self.output_ids is None else list(self.output_ids),
                "error": self.error, "latency_s": round(self.latency_s, 4), "accept_length": self.accept_length}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Outcome:
        ids = d.get("output_ids")
        return cls(int(d["index"]), None if ids is None else tuple(int(x) for x in ids), d.get("error"),
                   float(d.get("latency_s", 0.0)), d.get("accept_length"))


# ------------------------------------------------------------------------------------------------
# Sending


def post_generate(url: str, prompt: Sequence[int], max_new_tokens: int, timeout_s: float) -> dict[str, Any]:
    body = json.dumps({"input_ids": list(prompt), "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def send_schedule(url: str, sched: Schedule, timeout_s: float = 120.0) -> list[Outcome]:
    """Send every request at its arrival time (one thread each) and collect the outcomes in order."""
    results: list[Outcome | None] = [None] * len(sched.requests)
    t0 = time.monotonic()

    def one(i: int) -> None:
        r = sched.requests[i]
        delay = r.arrival_s - (time.monotonic() - t0)
        if delay > 0:
            time.sleep(delay)
        start = time.monotonic()
        try:
            j = post_generate(url, r.prompt, r.max_new_tokens, timeout_s)
            meta = j.get("meta_info", {}) or {}
            results[i] = Outcome(i, tuple(j.get("output_ids") or ()), None, time.monotonic() - start,
                                 meta.get("spec_accept_length"))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            results[i] = Outcome(i, None, f"{type(exc).__name__}: {exc}", time.monotonic() - start)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(sched.requests))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout_s + sched.duration_hint_s + 5)
    return [r if r is not None else Outcome(i, None, "lost: no response (thread still waiting)", timeout_s)
            for i, r in enumerate(results)]


# ------------------------------------------------------------------------------------------------
# Checks on recorded outcomes (CPU, tested in CI)


def check_outputs(sched: Schedule, outcomes: Sequence[Outcome], reference: Sequence[Outcome] | None = None,
                  vocab: int = VOCAB) -> dict[str, Any]:
    """Greedy equality against the counter (and a reference server's outputs, when given)."""
    if len(outcomes) != len(sched.requests):
        raise ReplayError(f"{len(outcomes)} outcomes for {len(sched.requests)} requests")
    lost, errors, mismatched, ref_mismatched = [], [], [], []
    for req, out in zip(sched.requests, outcomes, strict=True):
        if out.error is not None:
            (lost if out.error.startswith("lost") else errors).append({"index": out.index, "error": out.error})
            continue
        got = list(out.output_ids or ())
        want = req.expected_output(vocab)
        if got != want:
            diffs = (k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b)
            first = next(diffs, min(len(got), len(want)))
            mismatched.append({"index": out.index, "first_bad": first, "len": len(got), "want_len": len(want),
                               "got": got[first:first + 4], "want": want[first:first + 4]})
        if reference is not None:
            ref = reference[out.index]
            if ref.output_ids is not None and tuple(got) != ref.output_ids:
                ref_mismatched.append(out.index)
    accepts = [o.accept_length for o in outcomes if o.accept_length is not None]
    return {
        "requests": len(outcomes), "greedy_exact": len(outcomes) - len(lost) - len(errors) - len(mismatched),
        "lost": lost, "errors": errors, "mismatched": mismatched, "reference_mismatched": ref_mismatched,
        "accept_length_min": min(accepts) if accepts else None,
        "accept_length_max": max(accepts) if accepts else None,
    }


# ------------------------------------------------------------------------------------------------
# Conformance of the switch trace to the model


def expand_steps(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """A switch trace writes one 'step' line per decode step listing its actions; one event per action."""
    out: list[dict[str, Any]] = []
    for ev in events:
        if ev.get("action") == "step":
            base = {k: v for k, v in ev.items() if k not in ("action", "actions")}
            out.extend({**base, "action": a} for a in ev.get("actions", ()))
        else:
            out.append(ev)
    return out


def read_trace_events(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for p in paths:
        try:
            lines = Path(p).read_text().splitlines()
        except OSError as exc:
            raise ReplayError(f"cannot read trace {p}: {exc}") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                raise ReplayError(f"{p}:{n}: not a JSON line") from None
            if not isinstance(ev, dict):
                raise ReplayError(f"{p}:{n}: not a JSON object (a switch trace record is one)")
            ev["_file"] = str(p)
            events.append(ev)
    return expand_steps(events)


NON_ACTIONS = {"config", "timing", "capture_plain_runner"}


def conformance(events: Sequence[dict[str, Any]], design_name: str) -> dict[str, Any]:
    """Walk each trace file's actions through the model's action catalogue: the action must exist, its
    stage_from must hold the current stage and its spec_mode the current mode (flip_off/flip_on move the
    mode). After plain_decode the stage is DECODED exactly when the design syncs the draft every step."""
    design = get_design(design_name)
    syncs = design.draft_while_off is DraftWhileOff.SYNC_EVERY_STEP
    unexplained: list[dict[str, Any]] = []
    covered: dict[str, int] = {}
    files: dict[str, tuple[Stage, bool]] = {}
    for ev in events:
        name = ev.get("action")
        if name in NON_ACTIONS:
            continue
        stage, spec_on = files.get(ev.get("_file", ""), (Stage.SCHEDULE, True))
        info = ACTIONS_BY_NAME.get(name)
        problem = None
        if info is None:
            problem = "not a model action"
        elif stage not in info.stage_from:
            problem = f"stage {stage.name} not in {[s.name for s in info.stage_from]}"
        elif not info.spec_mode.allows(SpecMode.ON if spec_on else SpecMode.OFF):
            problem = f"needs speculation {info.spec_mode.value}, trace is {'on' if spec_on else 'off'}"
        if problem is not None:
            unexplained.append({"action": name, "problem": problem, "file": ev.get("_file"), "t": ev.get("t")})
            continue
        covered[name] = covered.get(name, 0) + 1
        if name == "flip_off":
            spec_on = False
        elif name == "flip_on":
            spec_on = True
        stage = Stage.DECODED if (name == "plain_decode" and syncs) else info.stage_to
        files[ev.get("_file", "")] = (stage, spec_on)
    return {"design": design_name, "events": sum(covered.values()) + len(unexplained),
            "unexplained": unexplained, "covered": dict(sorted(covered.items())),
            "not_covered": sorted(set(ACTIONS_BY_NAME) - set(covered)),
            "admission_stalls": admission_stalls(events)}


def admission_stalls(events: Sequence[dict[str, Any]], min_steps: int = 8) -> list[dict[str, Any]]:
    """flip_off events with requests waiting after which `min_steps` plain steps ran with no prefill: the
    waiting requests were not admitted although speculation's cap no longer applied (found on the H200:
    the scheduler's batch_is_full flag, set while admission was held at the speculative cap)."""
    stalls: list[dict[str, Any]] = []
    pending: dict[str, dict[str, Any]] = {}
    for ev in events:
        f, name = ev.get("_file", ""), ev.get("action")
        if name == "flip_off" and (ev.get("waiting") or 0) > 0:
            pending[f] = {"file": f, "t": ev.get("t"), "running": ev.get("running"), "waiting": ev.get("waiting"),
                          "steps": 0}
        elif name in ("prefill", "flip_on"):
            pending.pop(f, None)
        elif name == "plain_decode" and f in pending:
            pending[f]["steps"] += 1
            if pending[f]["steps"] == min_steps:
                stalls.append(pending.pop(f))
    return stalls


def explain_guard_traces(paths: Sequence[str]) -> dict[str, Any]:
    """The guard's explainer (specflip.explain.explain_traces) over guard traces, or a clear note why not."""
    if not paths:
        return {"available": False, "note": "no guard traces found (run the server with SPECFLIP_MODE=trace)"}
    try:
        report = explain_traces(list(paths))
    except (TraceFormatError, RankTraceError) as exc:  # the explainer's own one-line errors, as `specflip explain`
        return {"available": True, "error": f"{type(exc).__name__}: {exc}", "violations": 0, "unexplained": 1}
    data = report.to_json()
    illegal = data["first_illegal"]
    # one trace per TP rank: every rank must take the same transitions; a divergence counts as unexplained
    ranks = data["rank_agreement"]
    ranks_agree = ranks is None or bool(ranks["agree"])
    # a trace that breaks (cut short, a damaged line) was explained only up to the break: count the break
    breaks = len(data["breaks"])
    return {"available": True, "result": data, "unexplained": len(illegal) + (0 if ranks_agree else 1) + breaks,
            "violations": sum(len(step["violations"]) for step in illegal), "ranks_agree": ranks_agree}


# ------------------------------------------------------------------------------------------------
# Report


def summarise(runs: Sequence[dict[str, Any]], conf: dict[str, Any] | None, guard: dict[str, Any] | None,
              guard_violations: int = 0) -> dict[str, Any]:
    exact = sum(r["check"]["greedy_exact"] for r in runs)
    total = sum(r["check"]["requests"] for r in runs)
    lost = sum(len(r["check"]["lost"]) for r in runs)
    errors = sum(len(r["check"]["errors"]) for r in runs)
    mism = sum(len(r["check"]["mismatched"]) for r in runs)
    refm = sum(len(r["check"]["reference_mismatched"]) for r in runs)
    unexplained = len(conf["unexplained"]) if conf else None
    stalls = len(conf.get("admission_stalls", ())) if conf else None
    ok = (total > 0 and exact == total and lost == 0 and errors == 0 and refm == 0 and guard_violations == 0
          and (unexplained in (0, None)) and (stalls in (0, None)))
    # without a guard trace nothing was read: say so rather than print a 0 nobody counted (in assert mode a
    # violation stops the scheduler, which then shows as lost requests and errors)
    observed = bool(guard and guard.get("available"))
    return {"schedules": len(runs), "requests": total, "greedy_exact": exact, "lost": lost, "errors": errors,
            "mismatched": mism, "reference_mismatched": refm, "unexplained_transitions": unexplained,
            "guard_violations": guard_violations if observed else None, "admission_stalls": stalls, "ok": ok,
            "failing_schedules": [i for i, r in enumerate(runs) if r["check"]["greedy_exact"] != r["check"]["requests"]
                                  or r["check"]["reference_mismatched"]]}


def format_summary(summary: dict[str, Any], conf: dict[str, Any] | None) -> str:
    lines = [f"replay: {summary['schedules']} schedules, {summary['requests']} requests, "
             f"greedy-exact {summary['greedy_exact']}/{summary['requests']}, lost {summary['lost']}, "
             f"errors {summary['errors']}, reference mismatches {summary['reference_mismatched']}, "
             "guard violations " + ("not observed (no guard trace)" if summary["guard_violations"] is None
                                    else str(summary["guard_violations"]))]
    if conf is not None:
        lines.append(f"conformance ({conf['design']}): {conf['events']} actions, "
                     f"{len(conf['unexplained'])} unexplained, {len(conf.get('admission_stalls', ()))} admission "
                     f"stalls; covered {conf['covered']}")
    else:
        lines.append("conformance: no switch trace")
    lines.append("OK" if summary["ok"] else "FAILED")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# Server launch


def wait_healthy(url: str, proc: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise ReplayError(f"server exited with {proc.returncode} before it was healthy")
        try:
            urllib.request.urlopen(url.rstrip("/") + "/health", timeout=2)
            return
        except (urllib.error.URLError, OSError):
            time.sleep(2)
    raise ReplayError(f"server at {url} not healthy after {timeout_s:.0f}s")


SERVER_LOG_MARK = "# server log of `specflip replay --launch`"


def launch_server(server_args: Sequence[str], trace_dir: str, log_path: str, port: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, SPECFLIP_MODE=settings.MODE.raw() or "trace",
               SPECFLIP_TRACE=os.path.join(trace_dir, "specflip-trace.rank{rank}.jsonl"),
               SPECFLIP_SWITCH_TRACE=trace_dir)
    cmd = [sys.executable, "-m", "sglang.launch_server", "--port", str(port), *server_args]
    try:
        log = open(log_path, "wb")  # noqa: SIM115 - handed to the child
        log.write(f"{SERVER_LOG_MARK}: {' '.join(cmd)}\n".encode())  # the mark: the next --launch may replace it
        log.flush()
    except OSError as exc:
        raise ReplayError(f"cannot write the server log {log_path}: {exc.strerror or exc}") from None
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ------------------------------------------------------------------------------------------------
# CLI


def read_recorded(path: str) -> tuple[list[Schedule], list[list[Outcome]], list[list[Outcome]] | None]:
    """(schedules, outcomes, reference outcomes or None) of a report `--out` wrote; ReplayError for any other
    shape, naming the run and what is wrong."""
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReplayError(f"cannot read recorded report {path}: {getattr(exc, 'strerror', None) or exc}") from None
    runs = rec.get("runs") if isinstance(rec, dict) else None
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise ReplayError(f"{path} is not a replay report (`specflip replay --out`): it needs a list of runs, "
                          "each an object with a schedule and its outcomes")
    schedules, outcomes, refs = [], [], []
    for i, run in enumerate(runs):
        try:
            schedules.append(Schedule.from_json(run["schedule"]))
            outcomes.append([Outcome.from_json(o) for o in run["outcomes"]])
            refs.append([Outcome.from_json(o) for o in run["reference"]] if run.get("reference") else None)
        except ScheduleError as exc:
            raise ReplayError(f"{path}: run {i}: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ReplayError(f"{path}: run {i} is not a recorded run ({type(exc).__name__}: {exc})") from None
    all_refs = None if any(r is None for r in refs) else [r for r in refs if r is not None]
    return schedules, outcomes, all_refs


def _schedules_from(args: argparse.Namespace) -> list[Schedule]:
    if getattr(args, "schedules_file", None) is not None:
        if not args.schedules_file.strip():
            raise ReplayError("--schedules-file is empty: name a schedules file")
        return load(args.schedules_file)
    if not 0 <= args.t_on < args.t_off:
        raise ReplayError(f"--t-on must be below --t-off (got --t-off {args.t_off} --t-on {args.t_on}): the "
                          "switch turns speculation off above t_off and back on at t_on")
    return generate(args.schedules, t_off=args.t_off, t_on=args.t_on, seed=args.seed, max_new_cap=args.max_new_cap)


def judge(schedules: Sequence[Schedule], outcomes: Sequence[Sequence[Outcome]],
          references: Sequence[Sequence[Outcome]] | None, trace_dir: str | None, design: str) -> dict[str, Any]:
    runs = []
    for i, (s, outs) in enumerate(zip(schedules, outcomes, strict=True)):
        ref = references[i] if references is not None else None
        runs.append({"schedule": s.to_json(), "outcomes": [o.to_json() for o in outs],
                     "reference": None if ref is None else [o.to_json() for o in ref],
                     "check": check_outputs(s, outs, ref)})
    conf = None
    guard: dict[str, Any] | None = None
    violations = 0
    if trace_dir:
        switch_paths = sorted(glob.glob(os.path.join(trace_dir, "switch-*.jsonl")))
        if switch_paths:
            conf = conformance(read_trace_events(switch_paths), design)
        guard_paths = sorted(p for p in glob.glob(os.path.join(trace_dir, "*.jsonl")) if "switch-" not in p)
        guard = explain_guard_traces(guard_paths)
        violations = int(guard.get("violations", 0) or 0) + int(guard.get("unexplained", 0) or 0)
    summary = summarise(runs, conf, guard, violations)
    return {"summary": summary, "conformance": conf, "guard": guard, "runs": runs}


def main(args: argparse.Namespace) -> int:
    if getattr(args, "owns_process", False):
        # Hypothesis keeps a cache of source constants in its home directory, `.hypothesis/` under the current
        # directory unless this says otherwise: a replay run leaves nothing in the user's directory
        os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(cache_dir("hypothesis")))
    try:
        return _main(args)
    except (ReplayError, ScheduleError) as exc:
        print(f"specflip replay: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    trace_dir_given = getattr(args, "trace_dir", None)
    if trace_dir_given is not None and not (getattr(args, "launch", False) and not Path(trace_dir_given).exists()) \
            and not Path(trace_dir_given).is_dir():
        # read after the run (switch-*.jsonl, guard traces): a mistyped one would judge silently without them
        raise ReplayError(f"--trace-dir {trace_dir_given!r} is not a directory")
    if getattr(args, "recorded", None) is not None:
        if not args.recorded.strip():
            raise ReplayError("--recorded is empty: name a report `specflip replay --out` wrote")
        schedules, outcomes, refs = read_recorded(args.recorded)
        report = judge(schedules, outcomes, refs, args.trace_dir, args.design)
        print(format_summary(report["summary"], report["conformance"]))
        return 0 if report["summary"]["ok"] else 1

    # the files this run writes are checked before the work (generating, minutes of requests): a directory, an
    # unwritable place or a file specflip did not write stops it with one line; its own earlier files it replaces
    is_ours = has_mark(WRITTEN_BY_MARK)
    save_to = getattr(args, "save_schedules", None)
    if save_to is not None:
        writable_file(save_to, "schedules file", is_ours, "--save-schedules")
    if args.out is not None:
        writable_file(args.out, "report file", is_ours, "--out")
        if save_to is not None and Path(save_to).resolve() == Path(args.out).resolve():
            raise ReplayError("--save-schedules and --out name the same file: give each its own")
    schedules = _schedules_from(args)
    if save_to is not None:
        write_file(Path(save_to), schedules_json(schedules), "the schedules file")
        print(f"wrote {len(schedules)} schedules to {save_to}")
        if not (args.url or args.launch):
            return 0
    if not (args.url or args.launch):
        raise ReplayError("give --url of a live server, --launch, or --recorded")
    proc = None
    url = args.url or f"http://127.0.0.1:{args.port}"
    trace_dir = args.trace_dir
    if args.launch:
        if not args.server_arg:
            raise ReplayError("--launch needs the server's arguments: --server-arg=--model-path --server-arg=PATH ...")
        if trace_dir is not None and not trace_dir.strip():
            raise ReplayError("--trace-dir is empty: name a directory")
        trace_dir = trace_dir or os.path.abspath("specflip-traces")
        writable_dir(Path(trace_dir), "trace directory")
        log_path = writable_file(os.path.join(trace_dir, "server.log"), "server log", has_mark(SERVER_LOG_MARK),
                                 "--launch")
        proc = launch_server(args.server_arg, trace_dir, str(log_path), args.port)
    try:
        wait_healthy(url, proc, args.launch_timeout if proc else 10)
        outcomes, refs = [], [] if args.compare_url else None
        for i, s in enumerate(schedules):
            outs = send_schedule(url, s, args.timeout)
            outcomes.append(outs)
            if refs is not None:
                refs.append(send_schedule(args.compare_url, s, args.timeout))
            chk = check_outputs(s, outs)
            print(f"schedule {i} ({s.pattern}, {len(s.requests)} requests): exact {chk['greedy_exact']}/"
                  f"{chk['requests']}", flush=True)
        time.sleep(1.0)  # let the server flush its trace buffers on the next steps
    finally:
        if proc is not None:
            stop_server(proc)
    report = judge(schedules, outcomes, refs, trace_dir, args.design)
    print(format_summary(report["summary"], report["conformance"]))
    if args.out is not None:
        write_file(Path(args.out), report_json(report), "the report file")
    return 0 if report["summary"]["ok"] else 1


def report_json(report: dict[str, Any]) -> str:
    """The text `--out` writes: the report under the `written_by` mark (`--recorded` reads it back)."""
    return json.dumps({WRITTEN_BY: "specflip replay --out", **report}, indent=1) + "\n"
