"""`specflip lint <launch_server args...>`: refuse a speculative configuration that cannot survive its own
switches, before the server starts.

Builds SGLang's own `ServerArgs` from the arguments (the installed release, through its release line in
`shim/releases/`), derives every runtime state the server can switch into and checks each
against what SGLang sizes at start-up (rules: `specflip/lint/rules.py`, named after the model's invariants).

Exit 0: every state fits (one summary line). Exit 1: one line per finding. Exit 2: bad input (unknown flag,
a value below what a server runs with, an unreadable or malformed file, no draft model, unsupported release).
A launch value SGLang silently replaces is named in a `note:` line. SGLang's own log lines: `--verbose`.
`lint_server_args(server_args)` is the same check for a server that
is starting (the guard's assert mode calls it once).

Resolving ServerArgs imports SGLang's whole resolution pipeline (torch, transformers, model configs): seconds
(docs/lint.md, bench/bench_lint.py). The sizing read for one configuration is cached under
~/.cache/specflip/lint, keyed by everything it depends on (release, install path, arguments, SGLANG_*
environment, adaptive config and model config.json bytes).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shim.releases import UnsupportedRelease, release_line
from shim.releases.server_args import LintInputError, SGLangRefused
from shim.switch.config import SwitchConfig, SwitchConfigError, TierLadder
from specflip.cli_args import OneLineParser, integer
from specflip.lint.rules import (
    SGLANG_REFUSES,
    STARTUP,
    Finding,
    Sizing,
    SpecflipPolicy,
    check,
    predicted_outcome,
    summary,
)

CACHE_VERSION = 1


class LintUsageError(Exception):
    """Bad input: one line, exit 2."""


USAGE = ("usage: specflip lint [--json] [--no-cache] [--verbose] [--specflip-t-off N --specflip-t-on N | "
         "--specflip-auto [--specflip-spec-cap N] [--specflip-plain-graphs decode|eager] "
         "[--specflip-draft retract|sync|none] [--specflip-tiers T]] "
         "<python -m sglang.launch_server arguments>")


HELP = """specflip lint's own flags (every other argument goes to SGLang's launch_server parser):
  --json                    print {ok, release, notes, summary, predicts, lines, findings, sizing} as JSON
                            (predicts: serves, dies-at-startup or dies-at-first-request, for one request)
  --no-cache                resolve afresh instead of reading the cached sizing (~/.cache/specflip/lint)
  --verbose                 show SGLang's own log lines and warnings (on stderr; resolves afresh)
  --specflip-t-off N        specflip's switch: speculation off at N running requests (with --specflip-t-on)
  --specflip-t-on N         specflip's switch: speculation back on at N running requests (below t_off)
  --specflip-auto           specflip's switch with SPECFLIP_SWITCH=auto (instead of --specflip-t-off/--specflip-t-on)
  --specflip-spec-cap N     the switch's running cap while speculating (default 48)
  --specflip-plain-graphs decode|eager   how the switch runs plain steps (default decode)
  --specflip-draft retract|sync|none     the draft's work while speculation is off (default retract)
  --specflip-tiers 'steps[,up:down,steps]...'  the switch's speculative tiers (SPECFLIP_TIERS, docs/tiers.md):
                            every tier's runtime state is checked (graphs, logits rows, KV reserve); with
                            --specflip-auto the step counts only, e.g. 3,1 (the learner picks among them)
  --help, -h                this text

example (an EAGLE-3 pair of Llama-3-8B's shape shipped with specflip, config.json only; {examples}/README.md):
  specflip lint --model-path {examples}/lint/target --speculative-draft-model-path {examples}/lint/draft \\
      --speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 \\
      --speculative-num-draft-tokens 4 --specflip-auto

exit codes:
  0  every state fits (one summary line)
  1  a finding: one line per broken rule (docs/lint.md)
  2  bad usage or input: one line on stderr (an unknown flag, a value below what a server runs with, an
     unreadable or malformed adaptive config, an unreadable model config, no draft model, no
     --speculative-algorithm, an unsupported SGLang release)"""


def _own_parser() -> argparse.ArgumentParser:
    # every other specflip command's parser: a bad value is one line naming `specflip lint` and the flag, exit 2
    p = OneLineParser(prog="specflip lint", add_help=False, allow_abbrev=False)
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-cache", action="store_true")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--help", "-h", action="store_true")
    p.add_argument("--specflip-t-off", type=integer)
    p.add_argument("--specflip-t-on", type=integer)
    p.add_argument("--specflip-auto", action="store_true")
    p.add_argument("--specflip-spec-cap", type=integer, default=48)
    p.add_argument("--specflip-plain-graphs", default="decode")
    p.add_argument("--specflip-draft", default="retract")
    p.add_argument("--specflip-tiers")
    return p


def split_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """specflip's own flags, and the rest (the launch_server arguments, order kept)."""
    own, rest = _own_parser().parse_known_args(list(argv))
    return own, rest


def specflip_policy(own: argparse.Namespace) -> SpecflipPolicy | None:
    thresholds = own.specflip_t_off is not None or own.specflip_t_on is not None
    if own.specflip_auto and thresholds:
        raise LintUsageError("--specflip-auto learns where to flip: give it without --specflip-t-off/--specflip-t-on")
    if not thresholds and not own.specflip_auto:
        if own.specflip_tiers:
            raise LintUsageError("--specflip-tiers needs --specflip-t-off and --specflip-t-on (plain above the tiers) "
                                 "or --specflip-auto")
        return None
    if not own.specflip_auto and (own.specflip_t_off is None or own.specflip_t_on is None):
        raise LintUsageError("--specflip-t-off and --specflip-t-on go together")
    try:  # the switch's own validation, so lint accepts exactly what the switch accepts
        tiers = TierLadder.parse(own.specflip_tiers) if own.specflip_tiers else None
        cfg = SwitchConfig(t_off=own.specflip_t_off or 0, t_on=own.specflip_t_on or 0, auto=own.specflip_auto,
                           spec_cap=own.specflip_spec_cap, draft_while_off=own.specflip_draft,
                           plain_graphs=own.specflip_plain_graphs, tiers=tiers)
    except SwitchConfigError as exc:
        raise LintUsageError(str(exc)) from None
    return SpecflipPolicy(t_off=cfg.t_off, t_on=cfg.t_on, spec_cap=cfg.spec_cap, plain_graphs=cfg.plain_graphs,
                          draft_while_off=cfg.draft_while_off, tiers=() if tiers is None else tiers.steps,
                          tier_bounds=() if tiers is None else tiers.bounds, auto=cfg.auto)


# launch values lint refuses before SGLang sees them (flag, least value). SGLang 0.5.23 takes each of these
# without a word: topk 0 stays 0 (its kernels then read it as 1 in some places and 0 in others), draft tokens 0
# become steps + 1 under topk 1, a running cap of 0 or less passes resolution; a launch with 0 draft steps drafts
# nothing (0 is a state the adaptive switch may step down to, not a launch value). docs/lint.md: "Bad values".
LEAST_VALUES: tuple[tuple[str, int], ...] = (
    ("--speculative-num-steps", 1), ("--speculative-num-draft-tokens", 1), ("--speculative-eagle-topk", 1),
    ("--max-running-requests", 1),
)
# the launch values SGLang may rewrite during resolution, and the Sizing field that holds what it kept
REWRITABLE: tuple[tuple[str, str], ...] = (
    ("--speculative-num-steps", "launch_steps"), ("--speculative-num-draft-tokens", "launch_draft_tokens"),
    ("--speculative-eagle-topk", "topk"), ("--max-running-requests", "max_running_requests"),
)


# the most any of those flags can be: SGLang indexes KV slots with int32 (req_to_token in mem_cache/memory_pool.py,
# 0.5.23), so draft tokens or requests past it cannot be held; without this bound lint said
# `--speculative-num-steps 100000000000000000000` fit
MOST_VALUE = 2**31 - 1


def _given_int(argv: Sequence[str], flag: str) -> int | None:
    """The integer given for `flag`, or None (not given, or not an integer: SGLang's parser says so)."""
    raw = _flag_value(argv, flag)
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None


def check_values(argv: Sequence[str], release: str | None = None) -> None:
    """LintUsageError (exit 2) for a launch value that is not an integer, above MOST_VALUE or below what a speculative
    server can run with. With `release`, a value below the least also says what that SGLang release does with it
    (replaces it silently, runs with it, or fails)."""
    for flag, least in LEAST_VALUES:
        raw = _flag_value(argv, flag)
        if raw is not None and _given_int(argv, flag) is None:
            raise LintUsageError(f"{flag} {raw}: not an integer")
        value = _given_int(argv, flag)
        if value is not None and value > MOST_VALUE:
            raise LintUsageError(f"{flag} {raw}: must be at most {MOST_VALUE:,} (SGLang indexes KV slots with int32)")
        if value is not None and value < least:
            what = _what_sglang_does(argv, release, flag, value) if release else ""
            raise LintUsageError(f"{flag} {value}: must be at least {least}{what} (docs/lint.md, \"Bad values\")")


# the ServerArgs attribute each floored flag resolves into
_ATTRIBUTE = {"--speculative-num-steps": "speculative_num_steps",
              "--speculative-num-draft-tokens": "speculative_num_draft_tokens",
              "--speculative-eagle-topk": "speculative_eagle_topk", "--max-running-requests": "max_running_requests"}


def _what_sglang_does(argv: Sequence[str], release: str, flag: str, value: int) -> str:
    """What SGLang's own resolution makes of a bad value: '; SGLang <release> would silently run 4' (or run with
    it, or fail on it). Best effort: anything else SGLang objects to first leaves the line without it."""
    adapter = _line_module(release)
    try:
        server_args = adapter.build_server_args(_with_default_device(list(argv)))
        kept = adapter.launch_value(server_args, _ATTRIBUTE[flag])
    except SGLangRefused:
        return f"; SGLang {release}'s resolution fails on it"
    except Exception:  # noqa: BLE001 - another problem of the arguments: the floor alone is the message
        return ""
    if kept == value:
        return f"; SGLang {release} would run with {value} as given"
    return f"; SGLang {release} would silently run {kept}"


def rewrite_notes(argv: Sequence[str], sizing: Sizing) -> list[str]:
    """One line per launch value SGLang silently replaced during resolution, naming the flag."""
    notes = []
    for flag, field in REWRITABLE:
        given, kept = _given_int(argv, flag), getattr(sizing, field)
        if given is not None and given != kept:
            notes.append(f"note: {flag} {given} is not what runs: SGLang {sizing.release} replaces it with {kept}")
    return notes


def installed_release() -> str:
    """The installed sglang's release line (shim/releases/); a usage error where no line describes it."""
    try:
        return release_line().version
    except UnsupportedRelease as exc:
        raise LintUsageError(f"{exc}; lint reads the installed release's ServerArgs") from None


def _line_module(release: str) -> Any:
    """The release line that builds `release`'s ServerArgs and reads its sizing (shim/releases/)."""
    return release_line(release)


def _flag_value(argv: Sequence[str], *names: str) -> str | None:
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def _read_inputs(argv: Sequence[str]) -> dict[str, str]:
    """Bytes of the files the configuration names (hashed into the cache key); unreadable ones are errors."""
    files: dict[str, str] = {}
    cfg_path = _flag_value(argv, "--speculative-adaptive-config")
    if cfg_path is not None:
        try:
            text = Path(cfg_path).read_text()
            tiers = json.loads(text)
        except OSError as exc:
            raise LintUsageError(f"cannot read the adaptive config {cfg_path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise LintUsageError(f"the adaptive config {cfg_path} is not text (JSON expected)") from None
        except json.JSONDecodeError as exc:
            raise LintUsageError(f"the adaptive config {cfg_path} is not JSON: {exc.msg} "
                                 f"at line {exc.lineno}") from None
        problem = _tiers_shape_problem(tiers)
        if problem:
            raise LintUsageError(f"the adaptive config {cfg_path} {problem}")
        files["adaptive_config"] = text
    model = _flag_value(argv, "--model-path", "--model")
    if model is not None and (Path(model) / "config.json").is_file():
        config = Path(model) / "config.json"
        try:
            files["model_config"] = config.read_text()
        except OSError as exc:
            raise LintUsageError(f"cannot read the model config {config}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise LintUsageError(f"the model config {config} is not text (JSON expected)") from None
    return files


def _tiers_shape_problem(tiers: Any) -> str | None:
    """What SGLang reads an adaptive config as, before its own checks (which assume it): an object whose tier
    entries (the batch-size keys) are objects. SGLang's checks of the entries run in the adapter; the one they let
    through is a JSON boolean among candidate_steps (Python's True is an int), a step count of 1 or 0 by accident."""
    example = '{"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 1]}}'
    if not isinstance(tiers, dict):
        return f"must be a JSON object of batch-size tiers like {example}, not {_json_kind(tiers)}"
    entries = [(f"tier {key!r}", entry) for key, entry in tiers.items() if key.isdigit()]
    for where, entry in entries:
        if not isinstance(entry, dict):
            return f"{where} must be an object with candidate_steps, not {_json_kind(entry)}"
    # 0.5.12 reads one flat object: its candidate_steps sit at the top
    for where, entry in [*entries, ("the top level", tiers)]:
        steps = entry.get("candidate_steps")
        if isinstance(steps, list) and any(isinstance(s, bool) for s in steps):
            return f"{where}: candidate_steps must be JSON integers, not booleans: {json.dumps(steps)}"
    return None


def _json_kind(value: Any) -> str:
    """The JSON name of a parsed value's type, as a user wrote it."""
    if value is None:
        return "null"
    for kind, name in ((bool, "a boolean"), (dict, "an object"), (list, "an array"), (str, "a string"),
                       ((int, float), "a number")):
        if isinstance(value, kind):
            return name
    return type(value).__name__  # pragma: no cover - json.loads makes nothing else


def _cache_key(release: str, argv: Sequence[str], files: dict[str, str], policy: SpecflipPolicy | None) -> str:
    spec = importlib.util.find_spec("sglang")
    env = {k: v for k, v in os.environ.items() if k.startswith(("SGLANG_", "CUDA_VISIBLE_DEVICES", "HF_"))}
    blob = json.dumps({"v": CACHE_VERSION, "release": release, "where": str(spec.origin if spec else ""),
                       "argv": list(argv), "env": env, "files": files,
                       "policy": None if policy is None else [policy.t_off, policy.t_on, policy.spec_cap,
                                                              policy.plain_graphs, policy.draft_while_off,
                                                              list(policy.tiers), list(policy.tier_bounds),
                                                              policy.auto],
                       "rules": _rules_fingerprint()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _rules_fingerprint() -> str:
    # the adapters' code decides what a cached sizing holds: a change to it invalidates the cache
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for p in sorted(here.glob("sglang_*.py")) + [here / "rules.py"]:
        digest.update(p.read_bytes())
    return digest.hexdigest()[:16]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specflip" / "lint"


def _with_default_device(argv: list[str]) -> list[str]:
    """lint describes a GPU server; on a machine without an accelerator SGLang cannot pick the device itself."""
    if _flag_value(argv, "--device") is not None:
        return argv
    try:
        import torch  # noqa: F401 - already imported by SGLang when this matters

        has_gpu = bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover - torch missing or broken: SGLang will say so
        has_gpu = False
    return argv if has_gpu else [*argv, "--device", "cuda"]


def sizing_for(argv: Sequence[str], policy: SpecflipPolicy | None, *, use_cache: bool = True,
               verbose: bool = False) -> Sizing | str:
    """The Sizing of a launch configuration, or SGLang's refusal as one line. `verbose`: SGLang's own log lines
    and warnings go to stderr (so it resolves afresh: a cached answer has none to show)."""
    release = installed_release()
    check_values(argv, release)
    files = _read_inputs(argv)
    cache_file = _cache_dir() / f"{_cache_key(release, argv, files, policy)}.json"
    if use_cache and not verbose and cache_file.is_file():
        try:
            data = json.loads(cache_file.read_text())
            return data["refused"] if "refused" in data else Sizing.from_json(data["sizing"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a stale or torn cache entry: recompute
    adapter = _line_module(release)
    try:
        server_args = adapter.build_server_args(_with_default_device(list(argv)), verbose=verbose)
        result: Sizing | str = adapter.read_sizing(server_args, policy)
    except SGLangRefused as exc:
        result = str(exc)
    except LintInputError as exc:
        raise LintUsageError(str(exc)) from None
    if use_cache:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            payload = {"refused": result} if isinstance(result, str) else {"sizing": result.to_json()}
            tmp = cache_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(payload))
            tmp.replace(cache_file)
        except OSError:
            pass  # a read-only home: lint still answers, just slower next time
    return result


def lint_argv(argv: Sequence[str], policy: SpecflipPolicy | None = None, *, use_cache: bool = True,
              verbose: bool = False) -> tuple[Sizing | None, list[Finding]]:
    """Findings for launch_server arguments (specflip's flags already stripped)."""
    result = sizing_for(argv, policy, use_cache=use_cache, verbose=verbose)
    if isinstance(result, str):
        return None, [Finding(SGLANG_REFUSES, "launch", "the configuration as given", "refused at start-up",
                              "change the flag SGLang names", result, STARTUP)]
    return result, check(result)


def lint_server_args(server_args: Any, policy: SpecflipPolicy | None = None) -> list[Finding]:
    """The lint findings for a resolved ServerArgs inside a starting server (the guard's assert mode).

    Reads the config the server already published and leaves it as it was; no cache, no re-parse.
    """
    release = installed_release()
    adapter = _line_module(release)
    sizing = adapter.read_sizing(server_args, policy, republish=False)
    return check(sizing)


def main(args: argparse.Namespace, *, owns_process: bool = False) -> int:
    """The `specflip lint` command. `owns_process`: called as the process's entry point (the `specflip`
    script), so the process may be tuned for one short run and left without interpreter teardown."""
    if not owns_process:
        return _run(args)
    # Importing SGLang allocates ~400k container objects and the cyclic collector re-scans them over and over
    # (about 1 s of a cold run here). A one-shot process needs no collection: the OS reclaims it all at exit.
    gc.disable()
    # SGLang's quantization and MoE modules, which its resolution pipeline imports (configs/model_config), wrap
    # kernels in torch.compile at import; each wrap loads TorchInductor and Dynamo's repro tooling (about 1.3 s
    # of a cold run here). lint compiles and runs nothing, so in its own process torch's documented switch makes
    # torch.compile return the function as it is; ServerArgs and the sizing read are unchanged (a test compares
    # this process's sizing with an in-process one). Never set for in-process callers, e.g. a starting server.
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    code = _run(args)
    _exit_now(code)
    return code  # pragma: no cover - _exit_now does not return


def _exit_now(code: int) -> None:
    """Exit without interpreter teardown. Everything lint produces is written by now (output flushed here,
    the cache file renamed into place); tearing down torch, transformers and SGLang takes about 1.3 s and
    nothing of theirs needs it (no server, no compile, no temp files were started)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to deliver
            pass
    os._exit(code)


def _run(args: argparse.Namespace) -> int:
    argv = list(getattr(args, "argv", None) or [])
    try:
        own, rest = split_args(argv)
        if own.help:
            print(USAGE)
            print(__doc__.strip().splitlines()[0])
            print()
            print(HELP.replace("{examples}", str(Path(__file__).resolve().parent.parent / "examples")))
            return 0
        if not rest:
            raise LintUsageError("no launch_server arguments given; " + USAGE)
        policy = specflip_policy(own)
        sizing, findings = lint_argv(rest, policy, use_cache=not own.no_cache, verbose=own.verbose)
    except LintUsageError as exc:
        print(f"specflip lint: {exc}", file=sys.stderr)
        return 2
    notes = rewrite_notes(rest, sizing) if sizing is not None else []
    lines = [*notes, *(f.describe() for f in findings)]
    if not findings:
        assert sizing is not None
        lines.append(summary(sizing))
    if own.json:
        print(json.dumps({"ok": not findings, "release": sizing.release if sizing else None, "notes": notes,
                          "summary": summary(sizing) if sizing and not findings else None,
                          "predicts": predicted_outcome(findings), "lines": lines,
                          "findings": [f.to_json() for f in findings],
                          "sizing": sizing.to_json() if sizing else None}, indent=2))
        return 1 if findings else 0
    for line in lines:
        print(line)
    return 1 if findings else 0
