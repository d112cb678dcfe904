"""The `specflip` command line: one entry point, one subcommand per job.

Subcommands import their modules lazily so that `specflip check` never pays for SGLang imports.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REPORTS = REPO_ROOT / "proofs" / "reports"


class UsageError(Exception):
    """Bad input from the user: printed as one clear line, exit 2."""


def _cmd_check(args: argparse.Namespace) -> int:
    from proofs.verdicts import Verdict, run_designs, stale_reports, verdicts_json, write_reports
    from statemodel.design import Scope
    from statemodel.designs import ALL_DESIGNS, OVERLAP_DESIGNS, get_design, overlap_scope

    try:
        default = OVERLAP_DESIGNS if args.overlap else ALL_DESIGNS
        designs = [get_design(n) for n in args.design] if args.design else list(default)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {args.jobs}")
    if args.check_reports and args.design:
        raise UsageError("--check-reports compares every report: leave out --design")
    # with --json, stdout holds the JSON only: progress and the per-design lines go to stderr
    lines = sys.stderr if args.json else sys.stdout

    def show(verdict: Verdict) -> None:
        mark = "ok " if verdict.ok else "BAD"
        r = verdict.result
        print(f"{mark} {verdict.design.name:34s} {verdict.design.kind.value:9s} {verdict.verdict:12s} "
              f"{r.states:>8,} states {r.seconds:6.1f}s  {verdict.reason}", file=lines, flush=True)

    # the overlap scope's spaces reach 7.3M states (plain_off_catch_up_overlap; docs/overlap-plan.md: risks)
    if args.overlap:
        scope_for, limit = overlap_scope, 12_000_000
    else:
        scope_for, limit = (lambda design: Scope()), 2_000_000
    started = time.perf_counter()
    verdicts = run_designs(designs, scope_for, max_states=limit, jobs=args.jobs, show_progress=True,
                           on_verdict=show)
    if args.json:
        print(verdicts_json(verdicts))
    reports_dir = Path(args.reports_dir) / "overlap" if args.overlap else Path(args.reports_dir)
    stale: list[str] = []
    if args.check_reports:
        stale = stale_reports(verdicts, reports_dir)
        for path in stale:
            print(f"stale proof report: {path} (run `specflip check{' --overlap' if args.overlap else ''}`)",
                  file=lines)
    elif args.write_reports and not args.design:
        write_reports(verdicts, reports_dir)
        print(f"proof reports written to {reports_dir}", file=lines)
    bad = [v for v in verdicts if not v.ok]
    cpu = sum(v.result.cpu_seconds for v in verdicts)
    print(f"{len(verdicts) - len(bad)}/{len(verdicts)} designs as expected"
          + (f"; unexpected: {', '.join(v.design.name for v in bad)}" if bad else "")
          + f" ({time.perf_counter() - started:.1f}s wall, {cpu:.1f}s CPU in the checker)", file=lines)
    return 1 if bad or stale else 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from shim.guard.explain import main as explain_main

    return explain_main(args)


def _cmd_ranks(args: argparse.Namespace) -> int:
    import json

    from shim.guard.ranks import RankTraceError, check_switch_agreement

    try:
        result = check_switch_agreement(args.traces)
    except RankTraceError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        d = result.divergence
        print(json.dumps({"ranks": list(result.ranks), "agree": result.agree, "compared": result.steps_compared,
                          "first_divergence": None if d is None else {"record": d.step, "rank": d.rank,
                                                                      "path": d.path, "line": d.line,
                                                                      "message": d.describe()}}, indent=2))
    else:
        print(f"auto switch decisions: {result.describe()}".replace("transitions", "records (windows and flips)"))
    return 0 if result.agree else 1


def _cmd_diagram(args: argparse.Namespace) -> int:
    from specflip.diagrams import main as diagram_main

    return diagram_main(args)


def _cmd_lint(args: argparse.Namespace) -> int:
    from specflip.lint.run import main as lint_main

    return lint_main(args, owns_process=getattr(args, "owns_process", False))


def _cmd_replay(args: argparse.Namespace) -> int:
    from specflip.replay import main as replay_main

    return replay_main(args)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from specflip.calibrate import CalibrateError
    from specflip.calibrate import main as calibrate_main

    try:
        return calibrate_main(args)
    except CalibrateError as exc:
        raise UsageError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specflip", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="exhaustively check every shipped and known-bad design")
    check.add_argument("--design", action="append", help="check only this design (repeatable)")
    check.add_argument("--json", action="store_true", help="print verdicts as JSON")
    check.add_argument("--overlap", action="store_true",
                       help="the overlap schedule (results processed one step late): check the overlap designs")
    check.add_argument("--no-reports", dest="write_reports", action="store_false",
                       help="do not rewrite the proof reports")
    check.add_argument("--reports-dir", default=str(DEFAULT_REPORTS), help="where proof reports go")
    check.add_argument("--check-reports", action="store_true",
                       help="write no report; exit 1 if a committed proof report differs from the model's")
    check.add_argument("--jobs", type=int, help="designs checked at once, one process each (default: one per core)")
    check.set_defaults(func=_cmd_check)

    explain = sub.add_parser("explain", help="replay guard traces through the model")
    explain.add_argument("traces", nargs="+", help="JSONL trace file(s), one per rank")
    explain.add_argument("--json", action="store_true")
    explain.set_defaults(func=_cmd_explain)

    ranks = sub.add_parser("ranks", help="do the auto switch's per-rank switch traces agree (windows and flips)?")
    ranks.add_argument("traces", nargs="+", help="switch-<pid>.jsonl files (SPECFLIP_SWITCH_TRACE), one per rank")
    ranks.add_argument("--json", action="store_true")
    ranks.set_defaults(func=_cmd_ranks)

    diagram = sub.add_parser("diagram", help="generate the state diagrams in docs/ from the model")
    diagram.add_argument("--check", action="store_true", help="exit 1 if a committed diagram is stale")
    diagram.add_argument("--out", default=str(REPO_ROOT / "docs" / "diagrams"))
    diagram.set_defaults(func=_cmd_diagram)

    # Every argument after `lint` is passed through untouched (launch_server flags start with "--" too);
    # specflip.lint.run parses its own flags (--json, --specflip-*, --help) out of them.
    lint = sub.add_parser("lint", help="check a speculative server configuration before it starts",
                          add_help=False, prefix_chars="+")
    lint.add_argument("argv", nargs="*", help="launch_server arguments, plus --json / --specflip-* / --help")
    lint.set_defaults(func=_cmd_lint)

    replay = sub.add_parser("replay", help="send Hypothesis flip schedules to a live SGLang server")
    replay.add_argument("--url")
    replay.add_argument("--launch", action="store_true")
    replay.add_argument("--schedules", type=int, default=20)
    # the rest of replay's flags (kept here so `specflip` starts without importing Hypothesis)
    replay.add_argument("--schedules-file", help="replay these schedules (JSON) instead of generating")
    replay.add_argument("--save-schedules", help="write the generated schedules here (exit unless --url/--launch)")
    replay.add_argument("--seed", type=int, default=0)
    replay.add_argument("--t-off", type=int, default=6, help="the switch's t_off the schedules straddle")
    replay.add_argument("--t-on", type=int, default=2, help="the switch's t_on the schedules straddle")
    replay.add_argument("--max-new-cap", type=int, default=96)
    replay.add_argument("--design", default="v2_switch_reserve_sync", help="checker design the switch implements")
    replay.add_argument("--trace-dir", help="where the server writes traces (switch-*.jsonl and guard traces)")
    replay.add_argument("--compare-url", help="a server without speculation: outputs must be equal")
    replay.add_argument("--recorded", help="judge a recorded report (JSON from --out) instead of sending")
    replay.add_argument("--out", help="write the full report (schedules, outcomes, checks) as JSON here")
    replay.add_argument("--timeout", type=float, default=120.0)
    replay.add_argument("--port", type=int, default=30000)
    replay.add_argument("--server-arg", action="append", default=[], help="launch_server argument (repeatable)")
    replay.add_argument("--launch-timeout", type=float, default=300.0)
    replay.set_defaults(func=_cmd_replay)

    calibrate = sub.add_parser("calibrate", help="the switch's thresholds (SPECFLIP_SWITCH) from a throughput "
                               "measurement of plain decoding and always-on speculation")
    calibrate.add_argument("bench", nargs="+", help="bench_client.py JSONL file(s): one row per (cfg, conc)")
    calibrate.add_argument("--plain", default="plain", help="cfg of the plain-decoding rows")
    calibrate.add_argument("--spec", default="spec", help="cfg of the always-on speculation rows")
    calibrate.add_argument("--margin", type=float, default=0.05,
                           help="speculation wins at c when spec tok/s >= plain tok/s x (1 + margin)")
    calibrate.add_argument("--spec-cap", type=int, default=48,
                           help="SPECFLIP_SPEC_CAP the switch will run with (t_on is capped at it)")
    calibrate.add_argument("--auto", action="store_true",
                           help="also print where SPECFLIP_SWITCH=auto would settle for this measurement")
    calibrate.add_argument("--json", action="store_true")
    calibrate.set_defaults(func=_cmd_calibrate)
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
