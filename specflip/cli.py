"""The `specflip` command line: one entry point, one subcommand per job.

Subcommands import their modules lazily so that `specflip check` never pays for SGLang imports.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from specflip.cli_args import (
    OneLineParser,
    at_least,
    http_url,
    non_negative_int,
    positive_float,
    positive_int,
)
from specflip.errors import UsageError

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = Path(__file__).resolve().parent / "examples"  # ready inputs for ranks and lint (examples/README.md)
DEFAULT_REPORTS = REPO_ROOT / "proofs" / "reports"
DEFAULT_DIAGRAMS = REPO_ROOT / "docs" / "diagrams"
# `check --simulate N --depth D` bounds: a walk takes about 1 ms of CPU (2,000 walks of v2_switch_reserve_sync:
# 1.8 s, 2026-12-06, the 2-core CPU machine the repository's CI runs on), so a million walks is about 20 minutes
# a design; beyond it a run would outlast any session silently
MAX_WALKS = 1_000_000
MAX_DEPTH = 100_000
# `replay`'s generated schedules: Hypothesis draws each one (about 0.06 s of CPU a schedule at the defaults,
# 2026-12-06, this 2-core machine), and a schedule holds up to t_off + 8 requests; past these a run would draw
# silently for hours (`--schedules 10**9`, `--t-off 10**9`)
MAX_SCHEDULES = 10_000
MAX_T_OFF = 1_024
MAX_NEW_CAP = 65_536

EXIT_CODES = """exit codes (every subcommand):
  0  fine: every design as expected, the trace conforms, the configuration fits, ...
  1  a finding: a design not as expected, an illegal step, a lint finding, a failed replay, stale diagrams
  2  bad usage or input: an unknown flag, a bad value, an unreadable or malformed file, a directory that
     cannot be written; one line on stderr, never a traceback"""


class _VersionAction(argparse.Action):
    """argparse's version action, with the version looked up only when asked for (lint's cached run is ~0.1 s)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help=str(kwargs.get("help", "")))

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(f"specflip {_version()}")
        parser.exit(0)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specflip")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _cmd_check(args: argparse.Namespace) -> int:
    from proofs.simulation import Walks
    from proofs.verdicts import (
        REPORT_MARK,
        Verdict,
        reported_states,
        run_designs,
        stale_reports,
        verdicts_json,
        write_reports,
    )
    from specflip.outputs import directory_argument, has_mark, refuse_foreign, writable_dir
    from statemodel.design import Scope
    from statemodel.designs import ALL_DESIGNS, OVERLAP_DESIGNS, get_design, large_scope, overlap_scope

    try:
        default = OVERLAP_DESIGNS if args.overlap else ALL_DESIGNS
        designs = [get_design(n) for n in args.design] if args.design else list(default)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    if args.check_reports and args.design:
        raise UsageError("--check-reports compares every report: leave out --design")
    walks = None
    if args.simulate is not None:
        if args.check_reports:
            raise UsageError("--check-reports compares the exhaustive proofs: leave out --simulate")
        walks = Walks(args.simulate, args.depth or Walks().max_depth, args.seed or 0, shrink=args.shrink)
    elif args.seed is not None or args.depth is not None or not args.shrink:
        raise UsageError("--seed, --depth and --no-shrink shape the random walks: give --simulate N with them")
    elif args.scope == "large":
        raise UsageError("--scope large is beyond what the exhaustive search can finish: give --simulate N with it")
    given_dir = args.reports_dir is not None
    reports_root = directory_argument(args.reports_dir, "--reports-dir") if given_dir else DEFAULT_REPORTS
    reports_dir = reports_root / "overlap" if args.overlap else reports_root
    # proof reports come from the exhaustive check only; by default into the checkout's proofs/reports only, and
    # only when run from inside that checkout (an installed copy, or a run from elsewhere, writes none unless asked)
    writes_reports = args.write_reports and not args.design and not args.check_reports and walks is None
    skipped_reports = writes_reports and not given_dir and not _inside_own_checkout()
    writes_reports = writes_reports and not skipped_reports
    if writes_reports:
        # before the checking (minutes): the directory takes the reports and no file of the user's is in the way
        writable_dir(reports_dir, "reports directory")
        refuse_foreign(reports_dir, [f"{d.name}.md" for d in designs], has_mark(REPORT_MARK), "specflip check")
    # with --json, stdout holds the JSON only: progress and the per-design lines go to stderr
    lines = sys.stderr if args.json else sys.stdout

    def show(verdict: Verdict) -> None:
        mark = "ok " if verdict.ok else "BAD"
        r = verdict.result
        print(f"{mark} {verdict.design.name:34s} {verdict.design.kind.value:9s} {verdict.verdict:12s} "
              f"{r.states:>8,} states {r.seconds:6.1f}s  {verdict.reason}", file=lines, flush=True)

    # a bound far above the spaces (overlap: 1.28M states at most, plain_off_catch_up_overlap; default: 0.14M)
    if args.scope == "large":
        scope_for, limit = (lambda design: large_scope(design, overlap=args.overlap)), 0  # walks: no state bound
    elif args.overlap:
        scope_for, limit = overlap_scope, 12_000_000
    else:
        scope_for, limit = (lambda design: Scope()), 2_000_000
    started = time.perf_counter()
    # the last run's reports only order the work (largest first): the verdicts do not read them
    verdicts = run_designs(designs, scope_for, max_states=limit, jobs=args.jobs, show_progress=True,
                           on_verdict=show, expected_states=reported_states(reports_dir), walks=walks)
    if args.json:
        print(verdicts_json(verdicts))
    stale: list[str] = []
    if args.check_reports:
        stale = stale_reports(verdicts, reports_dir)
        for path in stale:
            print(f"stale proof report: {path} (run `specflip check{' --overlap' if args.overlap else ''}`)",
                  file=lines)
    elif writes_reports:
        try:
            write_reports(verdicts, reports_dir)
        except OSError as exc:
            raise UsageError(f"cannot write the proof reports into {reports_dir}: {exc.strerror or exc}") from None
        print(f"proof reports written to {reports_dir}", file=lines)
    elif skipped_reports:
        print(f"proof reports not written: run from specflip's checkout ({REPO_ROOT}) to refresh its proofs/reports, "
              "or give --reports-dir DIR", file=lines)
    bad = [v for v in verdicts if not v.ok]
    cpu = sum(v.result.cpu_seconds for v in verdicts)
    print(f"{len(verdicts) - len(bad)}/{len(verdicts)} designs as expected"
          + (f"; unexpected: {', '.join(v.design.name for v in bad)}" if bad else "")
          + f" ({time.perf_counter() - started:.1f}s wall, {cpu:.1f}s CPU in the checker)", file=lines)
    return 1 if bad or stale else 0


def _inside_own_checkout() -> bool:
    """Whether specflip runs from its own source checkout (a git checkout with its pyproject.toml, not an installed
    copy) and the current directory is inside it: where `specflip check` refreshes proofs/reports by default."""
    if not ((REPO_ROOT / ".git").exists() and (REPO_ROOT / "pyproject.toml").is_file()):
        return False
    try:
        return Path.cwd().resolve().is_relative_to(REPO_ROOT)
    except OSError:  # the current directory was removed
        return False


def _no_empty_paths(paths: Sequence[str], what: str) -> None:
    """UsageError for an empty path argument (`Path("")` is the current directory, which the user did not name)."""
    if any(not p.strip() for p in paths):
        raise UsageError(f"an empty {what} path was given: name a file")


def _cmd_explain(args: argparse.Namespace) -> int:
    from specflip.explain import main as explain_main

    _no_empty_paths(args.traces, "trace")
    return explain_main(args)


def _cmd_ranks(args: argparse.Namespace) -> int:
    import json

    from specflip.ranks import RankTraceError, check_switch_agreement

    _no_empty_paths(args.traces, "trace")
    try:
        result = check_switch_agreement(args.traces)
    except RankTraceError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(result.as_json(), indent=2))
    else:
        print("\n".join(result.report_lines()))
    return 0 if result.agree else 1


def _cmd_diagram(args: argparse.Namespace) -> int:
    from specflip.diagrams import main as diagram_main
    from specflip.outputs import directory_argument

    if args.out is not None:
        directory_argument(args.out, "--out")
    elif not args.check and not _inside_own_checkout():
        # the default rewrites the checkout's docs/diagrams and README.md: from inside that checkout only
        raise UsageError(f"give --out DIR: the default, {DEFAULT_DIAGRAMS} (and README.md beside docs/), is written "
                         "only from inside specflip's own checkout")
    args.out = args.out or str(DEFAULT_DIAGRAMS)
    return diagram_main(args)


def _cmd_lint(args: argparse.Namespace) -> int:
    from specflip.lint.run import main as lint_main

    return lint_main(args, owns_process=getattr(args, "owns_process", False))


def _cmd_replay(args: argparse.Namespace) -> int:
    from specflip.replay import main as replay_main

    return replay_main(args)


def _cmd_settings(args: argparse.Namespace) -> int:
    import json

    from shim import settings as table

    if args.json:
        print(json.dumps(table.rows(), indent=2))
    elif args.markdown:
        print(table.markdown(), end="")
    else:
        for row in table.rows():
            print(f"{row['name']}  [{row['feature']}]  {row['type']}  (default: {row['default']})")
            print(f"    {row['meaning']}")
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from specflip.calibrate import CalibrateError
    from specflip.calibrate import main as calibrate_main

    try:
        return calibrate_main(args)
    except CalibrateError as exc:
        raise UsageError(str(exc)) from None


def _cmd_releases(args: argparse.Namespace) -> int:
    from specflip.releases import main as releases_main

    return releases_main(args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="specflip", description=__doc__, epilog=EXIT_CODES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_VersionAction, help="print specflip's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str, example: str = "", **kwargs: object) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text + (f"\n\n{example}" if example else ""),
                              epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
                              **kwargs)  # type: ignore[arg-type]

    check = add("check", "exhaustively check every shipped and known-bad design")
    check.add_argument("--design", action="append", help="check only this design (repeatable)")
    check.add_argument("--json", action="store_true", help="print verdicts as JSON")
    check.add_argument("--overlap", action="store_true",
                       help="the overlap schedule (results processed one step late): check the overlap designs")
    check.add_argument("--no-reports", dest="write_reports", action="store_false",
                       help="do not rewrite the proof reports")
    check.add_argument("--reports-dir", metavar="DIR",
                       help="where the exhaustive check writes its proof reports (checked before the checking starts; "
                            "a file of the same name that specflip did not write stops the command). Default: "
                            "proofs/reports of specflip's own checkout, written only when run from inside that "
                            "checkout (as README's first command does); an installed copy, or a run from another "
                            "directory, writes no report unless given --reports-dir; --check-reports reads the "
                            "checkout's")
    check.add_argument("--check-reports", action="store_true",
                       help="write no report; exit 1 if a committed proof report differs from the model's")
    check.add_argument("--jobs", type=positive_int,
                       help="designs checked at once, one process each (default: one per core)")
    check.add_argument("--simulate", type=at_least(1, MAX_WALKS), metavar="N",
                       help="N seeded random walks per design instead of the exhaustive search: a counterexample fast, "
                            "shrunk but not proven the shortest; a design that survives is not proven (no reports "
                            f"written). N at most {MAX_WALKS:,} (about 1 ms of CPU a walk)")
    check.add_argument("--seed", type=non_negative_int, help="--simulate: the walks' seed (default 0)")
    check.add_argument("--depth", type=at_least(1, MAX_DEPTH),
                       help=f"--simulate: steps per walk at most, up to {MAX_DEPTH:,} (default 200)")
    check.add_argument("--no-shrink", dest="shrink", action="store_false",
                       help="--simulate: report a counterexample as the walk found it, without shrinking it")
    check.add_argument("--scope", choices=("default", "large"), default="default",
                       help="--simulate: the default scope BFS exhausts, or a larger one (six requests, caps 3 and 5: "
                            "statemodel.designs.large_scope)")
    check.set_defaults(func=_cmd_check)

    explain = add("explain", "replay guard traces through the model")
    explain.add_argument("traces", nargs="+", help="guard trace file(s), JSONL or JSONL.gz, one per rank")
    explain.add_argument("--json", action="store_true", help="print the report as JSON")
    explain.set_defaults(func=_cmd_explain)

    ranks = add("ranks", "do the switch's per-rank traces of a TP > 1 server agree (steps, flips, auto windows)? "
                "Lists each flip's scheduler step index, batch and decision on every rank",
                example=f"example (a two-rank auto run shipped with specflip): specflip ranks {EXAMPLES / 'ranks'}")
    ranks.add_argument("traces", nargs="+",
                       help="switch-<pid>.jsonl files (SPECFLIP_SWITCH_TRACE), one per rank, or directories of them; "
                            "ranks from the records' rank field (auto), else the order given")
    ranks.add_argument("--json", action="store_true", help="print the result as JSON")
    ranks.set_defaults(func=_cmd_ranks)

    diagram = add("diagram", "generate the state diagrams in docs/ from the model")
    diagram.add_argument("--check", action="store_true", help="exit 1 if a committed diagram is stale")
    diagram.add_argument("--out", metavar="DIR",
                         help="directory for the .dot/.svg/.mmd files (default: the repository's docs/diagrams, "
                              "which also refreshes README.md, written only when run from inside specflip's own "
                              "checkout); elsewhere only specflip's own files are written")
    diagram.set_defaults(func=_cmd_diagram)

    # Every argument after `lint` is passed through untouched (launch_server flags start with "--" too);
    # specflip.lint.run parses its own flags (--json, --specflip-*, --help) out of them.
    lint = add("lint", "check a speculative server configuration before it starts (`specflip lint --help`)",
               add_help=False, prefix_chars="+")
    lint.add_argument("argv", nargs="*", help="launch_server arguments, plus --json / --specflip-* / --help")
    lint.set_defaults(func=_cmd_lint)

    replay = add("replay", "send Hypothesis flip schedules to a live SGLang server")
    replay.add_argument("--url", type=http_url, help="a live server to send the schedules to")
    replay.add_argument("--launch", action="store_true",
                        help="start a server (python -m sglang.launch_server with --server-arg ...) and stop it after")
    replay.add_argument("--schedules", type=at_least(1, MAX_SCHEDULES), default=20,
                        help=f"how many schedules to generate (at most {MAX_SCHEDULES:,})")
    # the rest of replay's flags (kept here so `specflip` starts without importing Hypothesis)
    replay.add_argument("--schedules-file", help="replay these schedules (JSON) instead of generating")
    replay.add_argument("--save-schedules", metavar="FILE",
                        help="write the generated schedules here (exit unless --url/--launch); an existing FILE is "
                             "replaced only if specflip replay wrote it (its written_by field), never a file of yours")
    replay.add_argument("--seed", type=non_negative_int, default=0, help="Hypothesis seed of the generated schedules")
    replay.add_argument("--t-off", type=at_least(1, MAX_T_OFF), default=6,
                        help=f"the switch's t_off the schedules straddle (more than --t-on, at most {MAX_T_OFF:,}: a "
                             "schedule sends up to t_off + 8 requests)")
    replay.add_argument("--t-on", type=non_negative_int, default=2, help="the switch's t_on the schedules straddle")
    replay.add_argument("--max-new-cap", type=at_least(1, MAX_NEW_CAP), default=96,
                        help=f"largest max_new_tokens of a request (at most {MAX_NEW_CAP:,})")
    replay.add_argument("--design", default="v2_switch_reserve_sync", help="checker design the switch implements")
    replay.add_argument("--trace-dir", help="where the server writes traces (switch-*.jsonl and guard traces)")
    replay.add_argument("--compare-url", type=http_url, help="a server without speculation: outputs must be equal")
    replay.add_argument("--recorded", help="judge a recorded report (JSON from --out) instead of sending")
    replay.add_argument("--out", metavar="FILE",
                        help="write the full report (schedules, outcomes, checks) as JSON here (checked before any "
                             "request is sent; an existing FILE is replaced only if specflip replay wrote it)")
    replay.add_argument("--timeout", type=positive_float, default=120.0, help="seconds to wait for one request")
    replay.add_argument("--port", type=positive_int, default=30000, help="port of the server --launch starts")
    replay.add_argument("--server-arg", action="append", default=[], help="launch_server argument (repeatable)")
    replay.add_argument("--launch-timeout", type=positive_float, default=300.0,
                        help="seconds to wait for a --launch server to become healthy")
    replay.set_defaults(func=_cmd_replay)

    settings = add("settings", "list every SPECFLIP_* environment variable: name, type, default and meaning "
                   "(shim/settings.py)")
    form = settings.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print the table as JSON")
    form.add_argument("--markdown", action="store_true", help="print the table as markdown (docs/settings.md)")
    settings.set_defaults(func=_cmd_settings)

    calibrate = add("calibrate", "the switch's thresholds (SPECFLIP_SWITCH) from a throughput "
                    "measurement of plain decoding and always-on speculation")
    calibrate.add_argument("bench", nargs="+", help="bench_client.py JSONL file(s): one row per (cfg, conc)")
    calibrate.add_argument("--plain", default="plain", help="cfg of the plain-decoding rows")
    calibrate.add_argument("--spec", default="spec", help="cfg of the always-on speculation rows")
    calibrate.add_argument("--margin", type=float, default=0.05,
                           help="speculation wins at c when spec tok/s >= plain tok/s x (1 + margin); from 0 to "
                                "1 (1: speculation must be twice as fast as plain decoding)")
    calibrate.add_argument("--spec-cap", type=int, default=48,
                           help="SPECFLIP_SPEC_CAP the switch will run with (t_on is capped at it)")
    calibrate.add_argument("--auto", action="store_true",
                           help="also print where SPECFLIP_SWITCH=auto would settle for this measurement")
    calibrate.add_argument("--tiers", metavar="CFG=STEPS,...",
                           help="also simulate SPECFLIP_SWITCH=auto with tiers on these cfgs' rows (each always on "
                                "at its step count, the ladder from low load to high, e.g. spec=3,spec_steps1=1)")
    calibrate.add_argument("--json", action="store_true", help="print the result as JSON")
    calibrate.set_defaults(func=_cmd_calibrate)

    releases = add("releases", "the SGLang release lines specflip supports: what works on each (guard, switch, step "
                   "timer, lint) and where it was verified")
    releases.add_argument("--json", action="store_true", help="print the table as JSON")
    releases.set_defaults(func=_cmd_releases)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # argv None: the `specflip` script itself, which owns the process (in-process callers pass a list)
    args.owns_process = argv is None
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except UsageError as exc:
        print(f"specflip {args.command}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        print(f"specflip {args.command}: this command needs {exc.name!r}, which is not installed", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
