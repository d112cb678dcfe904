"""Issue 21: `specflip lint`'s verdict against real SGLang start-ups, one release line per run.

For every configuration of a matrix file (bench/gpu/lint_matrix_<line>.json) it asks `specflip lint` (the CLI, one
subprocess per configuration, `--json --no-cache`) what will happen to one request, starts the server for real,
sends it one /generate request, and compares. Rows: $OUT/lint_matrix_<line>.jsonl; table: $OUT/lint_matrix_<line>.md.

How the lead runs it (device `run`, from the repo root; each line about 7 minutes wall at most):
  0.5.16 (carry [".whl"]; .whl/ from ../shared/gpu-host/build-bundle.sh):
      BUDGET_S=540 bash bench/gpu/lint_matrix.sh 0.5.16 2>&1 | tail -n 80
  0.5.12, v1 EAGLEWorker (carry [".whl12"]; .whl12/ from ../shared/gpu-host/v1-0.5.12/build-bundle.sh, plus an
  attrs wheel in .whl12/ when the host has no attrs, as docs/v1.md builds it):
      BUDGET_S=540 bash bench/gpu/lint_matrix.sh 0.5.12 2>&1 | tail -n 80
  lint_matrix.sh unpacks the bundle, writes the counter models (gen_models.py), installs specflip's plugin entry
  point and runs this file, 12 servers at a time (PARALLEL), with a global deadline (MATRIX_S, default 420 s):
  whatever has not finished by then is written as `not-run`, never lost to a kill. The matrix files list the
  configurations that decide the most first. Setup (unpack, models) takes about 30 s before the matrix.
On this CPU machine (predictions only, no servers; about 35 s a line; lint reads the models' config.json):
  .venv/bin/python .whl/gen_models.py /tmp/models    # once (or ../shared/gpu-host/gen_models.py; or --models DIR)
  .venv/bin/python bench/gpu/lint_matrix.py bench/gpu/lint_matrix_0516.json --dry-run --cpu-0516 --lint-one-process
  PYTHONPATH=$PWD .venv12/bin/python bench/gpu/lint_matrix.py bench/gpu/lint_matrix_0512.json --dry-run \
      --lint-one-process --lint-python .venv12/bin/python

Verdicts. lint exit 0: it predicts the server serves. Exit 1: every finding carries its effect (docs/lint.md,
"Effects"), and the prediction for one request is the worst of them: `dies-at-startup`, `dies-at-first-request`,
or `serves` (a finding whose fault needs load, a later flip or more requests, e.g. running_within_cap). Exit 2:
lint refuses the input (`bad-input`); it matches a server that dies, and is listed as `stricter` when the server
serves. Outcomes: `serves` (the request came back; `exact` says whether it is the counter's greedy output),
`dies-at-startup` (the process exited or never answered /health in time with its log showing a traceback),
`dies-at-first-request` (healthy, then the request failed or the server died under it), `timeout` (never healthy,
no death either: not counted), `not-run` (the global deadline came first: not counted). Control rows (plain
decoding, which lint does not judge) check the harness, not lint.

Servers run --parallel at a time on one GPU, each on its own port with its KV pool capped (--max-total-tokens) and
--mem-fraction-static 0.5. Why not a small fraction: 0.5.16 sizes the KV pool as the memory free now minus
(1 - fraction) x the memory free when the process started (`kv_cache_configurator._profile_available_bytes`), so
with a small fraction a neighbour's allocation between those two moments makes rest_memory <= 0 and the server
dies at start-up for a reason that has nothing to do with the configuration. With 0.5 the neighbours may take half
of the free memory in that window, and the cap keeps each pool small (8 layers x 256 hidden: 32k tokens ~ 256 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from shim.settings import settings  # noqa: E402 - the repo root is put on the path first
from shim.switch.config import SwitchConfig, SwitchConfigError  # noqa: E402
from specflip.cli_args import OneLineParser, number, positive_float, positive_int  # noqa: E402

PREDICTS = ("serves", "dies-at-startup", "dies-at-first-request")
VOCAB = 2048  # gen_models.py's counter target: greedy token k is (last prompt token + 1 + k) % 2048
PROMPT = [11, 402, 77, 903, 5, 1200, 64, 300]
NEW_TOKENS = 24
# the CPU stand-ins under which 0.5.16's source (.cache/sglang-src/0.5.16) imports in .venv: its xgrammar
# import and the transformers config registration that .venv's newer transformers already has (see the package)
CPU_0516_PATHS = (Path(settings.SGLANG_0_5_16_SRC.get() or REPO / ".cache" / "sglang-src" / "0.5.16"),
                  REPO / "stand_ins" / "cpu_sglang_0_5_16", REPO / "stand_ins" / "cpu")


def load_matrix(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    names = [c["name"] for c in data["configs"]]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SystemExit(f"{path}: duplicate config names {sorted(dup)}")
    return data


def expand(config: dict[str, Any], *, models: str, tiers_dir: Path, port: int, line: str) -> dict[str, Any]:
    """The server's argv and env and lint's argv for one configuration.

    `flags`: launch_server flags; @EAGLE3 stands for the EAGLE-3 algorithm with the counter draft model, @TIERS
    for the path of this configuration's `tiers` object (or `tiers_text`, written verbatim) in a temp dir.
    `env`: the server's extra environment (SPECFLIP_SWITCH... become lint's --specflip-* flags through the
    switch's own SwitchConfig.from_env; SGLANG_* reach lint too). `lint_extra`: more lint-only flags."""
    flags = config.get("flags", "")
    if "@TIERS" in flags:
        tiers_path = tiers_dir / f"{config['name']}.json"
        text = config["tiers_text"] if "tiers_text" in config else json.dumps(config["tiers"])
        tiers_path.write_text(text)
        flags = flags.replace("@TIERS", str(tiers_path))
    flags = flags.replace("@EAGLE3", f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {models}/draft")
    launch = ["--model-path", f"{models}/target", "--attention-backend", "triton", "--sampling-backend", "pytorch",
              "--skip-tokenizer-init", "--mem-fraction-static", "0.5", "--max-total-tokens", "32768",
              *shlex.split(flags)]
    env = {k: str(v) for k, v in config.get("env", {}).items()}
    lint_flags: list[str] = []
    try:
        switch = SwitchConfig.from_env(env, default_draft="sync" if line == "0.5.12" else "retract")
    except SwitchConfigError as exc:
        raise SystemExit(f"{config['name']}: {exc}") from None
    if switch is not None:
        lint_flags += ["--specflip-t-off", str(switch.t_off), "--specflip-t-on", str(switch.t_on),
                       "--specflip-spec-cap", str(switch.spec_cap), "--specflip-draft", switch.draft_while_off,
                       "--specflip-plain-graphs", switch.plain_graphs]
    lint_flags += shlex.split(config.get("lint_extra", ""))
    return {"launch": launch, "port": port, "env": env, "lint_flags": lint_flags}


# ---- lint ---------------------------------------------------------------------------------------------------

def lint_env(env: dict[str, str], extra_pythonpath: Sequence[Path]) -> dict[str, str]:
    full_env = dict(os.environ, **env)
    paths = [str(p) for p in extra_pythonpath] + [str(REPO)]
    if full_env.get("PYTHONPATH"):
        paths.append(full_env["PYTHONPATH"])
    full_env["PYTHONPATH"] = os.pathsep.join(paths)
    return full_env


def lint_argv(launch: list[str], lint_flags: list[str]) -> list[str]:
    return ["--json", "--no-cache", *lint_flags, *launch]


def run_lint(python: Sequence[str], launch: list[str], lint_flags: list[str], env: dict[str, str],
             extra_pythonpath: Sequence[Path] = (), timeout: float = 240) -> dict[str, Any]:
    """`specflip lint --json --no-cache` in a fresh process, as a user runs it. Returns exit code, prediction,
    lint's own lines (what it prints without --json) and its time."""
    full_env = lint_env(env, extra_pythonpath)
    cmd = [*python, "-m", "specflip.cli", "lint", *lint_argv(launch, lint_flags)]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"exit": None, "predicts": "lint-timeout", "lines": [f"lint did not answer in {timeout:.0f} s"],
                "seconds": round(time.monotonic() - t0, 1)}
    return lint_result(proc.returncode, proc.stdout, proc.stderr, round(time.monotonic() - t0, 1))


def lint_worker() -> int:
    """--lint-worker: one process lints every job read from stdin (a JSON list of {name, argv, env}) in turn,
    through the same `specflip.lint.run` entry as the CLI, and prints one JSON line per job. One SGLang import
    for the whole matrix (the CPU dry run; on the host every configuration gets its own CLI process)."""
    import contextlib
    import io

    from specflip.lint.run import main as lint_main

    jobs = json.loads(sys.stdin.read())
    for job in jobs:
        saved = {k: os.environ.get(k) for k in job["env"]}
        os.environ.update(job["env"])
        out, err = io.StringIO(), io.StringIO()
        t0 = time.monotonic()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = lint_main(argparse.Namespace(argv=job["argv"]))
        except Exception as exc:  # a crash of lint is a row, not the end of the matrix
            code, err = 3, io.StringIO(f"lint raised {type(exc).__name__}: {exc}")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        print(json.dumps({"name": job["name"], "exit": code, "stdout": out.getvalue(), "stderr": err.getvalue(),
                          "seconds": round(time.monotonic() - t0, 1)}), flush=True)
    return 0


def lint_result(code: int | None, stdout: str, stderr: str, seconds: float) -> dict[str, Any]:
    """A lint row from `specflip lint --json`'s exit code and output."""
    out: dict[str, Any] = {"exit": code, "seconds": seconds}
    if code in (0, 1):
        try:
            data = json.loads(stdout)
        except ValueError:
            return {**out, "predicts": "lint-crashed", "lines": (stdout + stderr).strip().splitlines()[-8:]}
        out.update(predicts=data.get("predicts", "?"), lines=data.get("lines", []),
                   findings=[(f["rule"], f.get("effect")) for f in data.get("findings", [])])
    elif code == 2:
        out.update(predicts="bad-input", lines=stderr.strip().splitlines()[-1:])
    else:
        out.update(predicts="lint-crashed", lines=(stdout + stderr).strip().splitlines()[-8:])
    return out


# ---- servers ------------------------------------------------------------------------------------------------

def _get(url: str, timeout: float) -> int:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status


def one_request(port: int, timeout: float = 60) -> tuple[bool, str, bool]:
    """POST one greedy /generate with input_ids; (answered, detail, exact counter output)."""
    body = json.dumps({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0,
                                                                 "ignore_eos": True}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, f"request failed: {type(exc).__name__}: {exc}"[:300], False
    ids = data.get("output_ids") or []
    want = [(PROMPT[-1] + 1 + k) % VOCAB for k in range(NEW_TOKENS)]
    return True, f"{len(ids)} tokens, head {ids[:5]}", ids == want


def stop_group(proc: subprocess.Popen) -> None:
    """The server's whole process group (scheduler and detokenizer children too): TERM, then KILL."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def tail(path: Path, n: int = 30) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln[:400] for ln in lines[-n:]]


def run_server(name: str, spec: dict[str, Any], out_dir: Path, timeout: float, deadline: float,
               python: str) -> dict[str, Any]:
    """Start one server, wait for /health or death (at most `timeout` s, never past `deadline`), send one
    request, stop it. The outcome and, unless it served, the last 30 log lines."""
    log_path = out_dir / f"server_{name}.log"
    env = dict(os.environ, **spec["env"])
    cmd = [python, "-m", "sglang.launch_server", *spec["launch"], "--port", str(spec["port"])]
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    row: dict[str, Any] = {"port": spec["port"]}
    try:
        limit = min(t0 + timeout, deadline)
        healthy = False
        while time.monotonic() < limit:
            if proc.poll() is not None:
                break
            try:
                healthy = _get(f"http://127.0.0.1:{spec['port']}/health", 2) == 200
            except (urllib.error.URLError, OSError):
                healthy = False
            if healthy:
                break
            time.sleep(2)
        row["startup_s"] = round(time.monotonic() - t0, 1)
        if not healthy:
            died = proc.poll() is not None
            text = "\n".join(tail(log_path, 400))
            if died or "Traceback" in text:
                row["outcome"] = "dies-at-startup"
            else:
                row["outcome"] = "timeout" if time.monotonic() < deadline else "not-run"
            row["exit_code"] = proc.poll()
            row["log_tail"] = tail(log_path)
            return row
        request_s = max(5.0, min(60.0, deadline + 30 - time.monotonic()))  # never far past the deadline
        answered, detail, exact = one_request(spec["port"], timeout=request_s)
        time.sleep(1)  # a server that dies under the request: give its exit a moment to show
        alive = proc.poll() is None
        row["request"] = detail
        if answered and alive:
            row["outcome"], row["exact"] = "serves", exact
        else:
            row["outcome"] = "dies-at-first-request"
            row["log_tail"] = tail(log_path)
        return row
    finally:
        stop_group(proc)
        row["wall_s"] = round(time.monotonic() - t0, 1)


# ---- comparison and report ----------------------------------------------------------------------------------

def verdict(predicts: str, outcome: str | None, control: bool) -> str:
    """match / MISMATCH / stricter (lint refuses the input, the server serves) / control / uncounted."""
    if control:
        return "control"
    if outcome in (None, "not-run", "timeout") or predicts in ("lint-crashed", "lint-timeout", "?"):
        return "uncounted"
    dies = outcome.startswith("dies")
    if predicts == "bad-input":
        return "match" if dies else "stricter"
    if predicts == "serves":
        return "match" if outcome == "serves" else "MISMATCH"
    return "match" if dies else "MISMATCH"


def markdown(line: str, rows: list[dict[str, Any]], dry_run: bool) -> str:
    head = ("| # | config | lint exit | lint predicts | outcome | verdict | start-up s | lint's first line |\n"
            "|---|---|---|---|---|---|---|---|\n")
    body = []
    for i, r in enumerate(rows, 1):
        lint = r["lint"]
        first = (lint.get("lines") or [""])[0].replace("|", "\\|")[:160]
        outcome = r.get("outcome") or ("(dry run)" if dry_run else "-")
        if r.get("outcome") == "serves" and r.get("exact") is False:
            outcome += " (output NOT exact)"
        body.append(f"| {i} | `{r['name']}` | {lint.get('exit')} | {lint.get('predicts')} | {outcome} | "
                    f"{r.get('verdict', '-')} | {r.get('startup_s', '-')} | {first} |")
    return f"### SGLang {line}\n\n" + head + "\n".join(body) + "\n"


def summarize(line: str, rows: list[dict[str, Any]]) -> str:
    counted = [r for r in rows if r.get("verdict") in ("match", "MISMATCH")]
    match = sum(r["verdict"] == "match" for r in counted)
    parts = [f"LINT_MATRIX {line}: {len(rows)} configs, {len(counted)} counted, {match} match, "
             f"{len(counted) - match} mismatch"]
    other_phase = [r["name"] for r in counted if r["verdict"] == "match" and r.get("outcome", "").startswith("dies")
                   and r["lint"].get("predicts") != r.get("outcome")]
    if other_phase:  # a death lint predicted, in another phase than it said: a match, listed for the record
        parts.append(f"{len(other_phase)} died in another phase than predicted ({', '.join(other_phase)})")
    not_exact = [r["name"] for r in rows if r.get("outcome") == "serves" and r.get("exact") is False]
    if not_exact:
        parts.append(f"served a wrong output: {', '.join(not_exact)}")
    for key in ("stricter", "control", "uncounted"):
        n = sum(r.get("verdict") == key for r in rows)
        if n:
            parts.append(f"{n} {key}")
    lint_says = {p: sum(r["lint"].get("predicts") == p for r in rows) for p in (*PREDICTS, "bad-input")}
    parts.append("lint predicts " + ", ".join(f"{k} {v}" for k, v in lint_says.items()))
    return "; ".join(parts)


def lint_all_in_one_process(python: Sequence[str], names: list[str], specs: dict[str, dict[str, Any]],
                            extra_pythonpath: Sequence[Path], timeout: float) -> dict[str, dict[str, Any]]:
    """Every configuration through one --lint-worker process (its environment: the stand-in paths)."""
    jobs = [{"name": n, "argv": lint_argv(specs[n]["launch"], specs[n]["lint_flags"]), "env": specs[n]["env"]}
            for n in names]
    cmd = [*python, str(Path(__file__).resolve()), "--lint-worker"]
    results: dict[str, dict[str, Any]] = {}
    try:
        proc = subprocess.run(cmd, input=json.dumps(jobs), capture_output=True, text=True,
                              env=lint_env({}, extra_pythonpath), timeout=timeout, cwd=REPO)
        stdout, stderr = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = "lint worker timed out"
    for line in stdout.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        results[row["name"]] = lint_result(row["exit"], row["stdout"], row["stderr"], row["seconds"])
    for n in names:
        results.setdefault(n, {"exit": None, "predicts": "lint-crashed", "lines": stderr.strip().splitlines()[-5:]})
    return results


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--lint-worker"]:
        return lint_worker()
    ap = OneLineParser(prog="lint_matrix", description=__doc__.splitlines()[0])
    ap.add_argument("matrix", type=Path, help="bench/gpu/lint_matrix_<line>.json")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--models", default="/tmp/models", help="gen_models.py's output (target/, draft/)")
    ap.add_argument("--dry-run", action="store_true", help="lint predictions only, no servers (CPU)")
    ap.add_argument("--parallel", type=positive_int, default=12, help="servers at a time")
    ap.add_argument("--lint-jobs", type=positive_int, default=4, help="lint processes at a time")
    ap.add_argument("--timeout", type=positive_float, default=170, help="seconds a server may take to become healthy")
    ap.add_argument("--deadline", type=number, default=os.environ.get("MATRIX_S", "420"),
                    help="seconds for the whole matrix; what has not finished then is written as not-run")
    ap.add_argument("--lint-python", default=sys.executable)
    ap.add_argument("--server-python", default=sys.executable)
    ap.add_argument("--cpu-0516", action="store_true",
                    help="lint against the 0.5.16 source in .cache/sglang-src/0.5.16 with the CPU stand-ins")
    ap.add_argument("--only", default="", help="comma-separated config names")
    ap.add_argument("--lint-one-process", action="store_true",
                    help="lint every configuration in one process (one SGLang import; the CPU dry run)")
    args = ap.parse_args(argv)

    t_start = time.monotonic()
    deadline = t_start + args.deadline
    matrix = load_matrix(args.matrix)
    line = matrix["line"]
    configs = matrix["configs"]
    if args.only:
        keep = set(args.only.split(","))
        configs = [c for c in configs if c["name"] in keep]
    args.out.mkdir(parents=True, exist_ok=True)
    tiers_dir = Path(tempfile.mkdtemp(prefix="lint_matrix_tiers_"))
    # HTTP ports below Linux's ephemeral range (32768+), where 0.5.12/0.5.16 take their NCCL port (get_free_port):
    # a neighbour cannot take a port another server binds only at the end of its start-up
    specs = {c["name"]: expand(c, models=args.models, tiers_dir=tiers_dir, port=31000 + 3 * i, line=line)
             for i, c in enumerate(configs)}
    extra_path = CPU_0516_PATHS if args.cpu_0516 else ()
    rows = {c["name"]: {"name": c["name"], "line": line, "flags": c.get("flags", ""), "env": c.get("env", {}),
                        "tiers": c.get("tiers", c.get("tiers_text")), "why": c.get("why", ""),
                        "control": bool(c.get("control")), "lint": {}} for c in configs}
    print(f"== lint matrix {line}: {len(configs)} configs, dry_run={args.dry_run}, parallel={args.parallel}, "
          f"deadline {args.deadline:.0f} s", flush=True)

    lock = threading.Lock()

    def lint_one(name: str) -> None:
        if time.monotonic() > deadline - 20:
            with lock:
                rows[name]["lint"] = {"exit": None, "predicts": "lint-timeout", "lines": ["deadline before lint ran"]}
            return
        spec = specs[name]
        res = run_lint(shlex.split(args.lint_python), spec["launch"], spec["lint_flags"], spec["env"], extra_path,
                       timeout=max(30.0, min(240.0, deadline - time.monotonic())))
        with lock:
            rows[name]["lint"] = res
        print(f"   lint {name}: exit {res.get('exit')} -> {res.get('predicts')} ({res.get('seconds')} s)", flush=True)

    def serve_one(name: str) -> None:
        if time.monotonic() > deadline - 60:
            with lock:
                rows[name]["outcome"] = "not-run"
            return
        res = run_server(name, specs[name], args.out, args.timeout, deadline, args.server_python)
        with lock:
            rows[name].update(res)
        print(f"   server {name}: {res['outcome']} after {res.get('startup_s')} s "
              f"(t={time.monotonic() - t_start:.0f}s)", flush=True)

    if args.lint_one_process:
        res = lint_all_in_one_process(shlex.split(args.lint_python), [c["name"] for c in configs], specs, extra_path,
                                      timeout=max(60.0, deadline - time.monotonic()))
        for name, r in res.items():
            rows[name]["lint"] = r
            print(f"   lint {name}: exit {r.get('exit')} -> {r.get('predicts')} ({r.get('seconds')} s)", flush=True)
    # lint and servers side by side: neither needs the other's result until the comparison
    with ThreadPoolExecutor(max_workers=max(1, args.lint_jobs)) as lint_pool:
        lint_futs = [] if args.lint_one_process else [lint_pool.submit(lint_one, c["name"]) for c in configs]
        if not args.dry_run:
            with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as server_pool:
                futs = []
                for c in configs:
                    futs.append(server_pool.submit(serve_one, c["name"]))
                for f in futs:
                    f.result()
        for f in lint_futs:
            f.result()

    ordered = [rows[c["name"]] for c in configs]
    for r in ordered:
        r["verdict"] = verdict(r["lint"].get("predicts", "?"), None if args.dry_run else r.get("outcome"),
                               r["control"])
    suffix = line.replace(".", "")
    jsonl = args.out / f"lint_matrix_{suffix}.jsonl"
    with open(jsonl, "w") as f:
        for r in ordered:
            f.write(json.dumps(r) + "\n")
    md = markdown(line, ordered, args.dry_run)
    (args.out / f"lint_matrix_{suffix}.md").write_text(md)
    print(md)
    mism = [r for r in ordered if r["verdict"] == "MISMATCH"]
    for r in mism:
        print(f"== MISMATCH {r['name']}: lint {r['lint'].get('predicts')} ({r['lint'].get('lines')}), "
              f"server {r.get('outcome')}; log tail:")
        for ln in (r.get("log_tail") or [])[-12:]:
            print("   ", ln)
    print(summarize(line, ordered) + f"; wall {time.monotonic() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
