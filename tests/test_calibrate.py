"""`specflip calibrate`: the switch's thresholds from throughput rows, on files recorded on the H200
(bench/gpu/results, real) and on the issue's table; bad input is one line and exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shim.switch.v2 import SwitchConfig, SwitchConfigError
from specflip.calibrate import CalibrateError, Calibration, _check_with_switch, calibrate
from specflip.cli import main

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "gpu" / "results"
# 2026-11-29 (44eaff4), all servers side by side: plain wins everywhere
S3_CALL3 = RESULTS / "2026-11-29_44eaff4/bench_call3.jsonl"
FINAL = RESULTS / "2026-11-29_4233485/bench_final.jsonl"
# the same plain/spec rows as bench_final (call 1 of that run)
CALL1 = RESULTS / "2026-11-29_4233485/bench_call1.jsonl"

# The issue's table (tok/s at concurrency 1/8/32/128): speculation wins at low concurrency, which no file
# recorded on this host shows (plain wins everywhere in bench/gpu/results).
ISSUE_TABLE = {"plain": (495, 3506, 11514, 25811), "spec": (615, 4571, 9902, 19268)}
ISSUE_CONCS = (1, 8, 32, 128)


def write_rows(path, table, concs=ISSUE_CONCS):
    path.write_text("".join(json.dumps({"cfg": cfg, "conc": c, "tok_s": t}) + "\n"
                            for cfg, toks in table.items() for c, t in zip(concs, toks, strict=True)))
    return path


def run_cli(capsys, *argv):
    rc = main(["calibrate", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def switch_line(out):
    return [line for line in out.splitlines() if line.startswith("SPECFLIP_SWITCH")]


def test_plain_wins_everywhere_on_the_h200_gives_off_when_busy(capsys):
    rc, out, _ = run_cli(capsys, S3_CALL3)
    assert rc == 0
    assert switch_line(out) == ["SPECFLIP_SWITCH=1:0"]
    assert sum(line.endswith("  no") for line in out.splitlines()) == 9 and "  yes" not in out
    assert "why: speculation wins at no measured concurrency" in out
    # the table carries the recorded numbers, not rounded-away ones
    assert "41445.6" in out and "23719.8" in out


def test_the_other_h200_sweep_agrees_and_repeated_rows_are_named():
    result = calibrate([str(FINAL), str(CALL1)])
    assert (result.t_off, result.t_on) == (1, 0) and not any(r.wins for r in result.rows)
    assert max(result.rows, key=lambda r: r.ratio).conc == 8  # 0.859, still short of plain
    dup = [n for n in result.notes if "2 rows" in n]
    assert len(dup) == 18  # 9 concurrencies x 2 cfgs, each measured in both files
    assert all(f"used the last, {CALL1}:" in n for n in dup)


def test_the_issues_table_gives_32_8(tmp_path, capsys):
    path = write_rows(tmp_path / "issue.jsonl", ISSUE_TABLE)
    rc, out, _ = run_cli(capsys, path)
    assert rc == 0 and switch_line(out) == ["SPECFLIP_SWITCH=32:8"]
    assert [r.wins for r in calibrate([str(path)]).rows] == [True, True, False, False]
    rc, out, _ = run_cli(capsys, path, "--json")
    data = json.loads(out)
    assert (data["t_off"], data["t_on"], data["SPECFLIP_SWITCH"]) == (32, 8, "32:8")
    assert [r["conc"] for r in data["rows"] if r["wins"]] == [1, 8] and data["notes"] == []


def test_margin_moves_the_wins(tmp_path):
    path = str(write_rows(tmp_path / "issue.jsonl", ISSUE_TABLE))
    # spec/plain is 1.242 at c=1 and 1.304 at c=8
    at = {m: calibrate([path], margin=m) for m in (0.0, 0.25, 0.31)}
    assert (at[0.0].t_off, at[0.0].t_on) == (32, 8) and not at[0.0].notes
    # 25%: c=1 no longer wins but c=8 does: not a prefix, reported, t_on stays the largest win
    assert [r.wins for r in at[0.25].rows] == [False, True, False, False]
    assert (at[0.25].t_off, at[0.25].t_on) == (32, 8)
    assert any("not a prefix" in n and "c=1 " in n for n in at[0.25].notes)
    assert (at[0.31].t_off, at[0.31].t_on) == (1, 0)
    # and on the recorded sweep no margin makes speculation win (best 0.672 at c=32)
    assert calibrate([str(S3_CALL3)], margin=0.0).switch_env == "1:0"


def test_spec_cap_caps_t_on_and_a_win_at_the_top_means_no_switch(tmp_path, capsys):
    path = str(write_rows(tmp_path / "issue.jsonl", ISSUE_TABLE))
    capped = calibrate([path], spec_cap=4)
    assert (capped.t_off, capped.t_on) == (32, 4) and "running cap" in capped.why
    assert any("above the speculative running cap 4" in n for n in capped.notes)
    low = write_rows(tmp_path / "low.jsonl", {"plain": (495, 3506), "spec": (615, 4571)}, concs=(1, 8))
    rc, out, _ = run_cli(capsys, low)
    assert rc == 0 and switch_line(out) == ["SPECFLIP_SWITCH unset (no switch: speculation always on)"]
    assert calibrate([str(low)]).to_json()["SPECFLIP_SWITCH"] is None


def test_thresholds_read_back_through_the_switchs_own_rule(tmp_path):
    path = str(write_rows(tmp_path / "issue.jsonl", ISSUE_TABLE))
    for result in (calibrate([path]), calibrate([path], spec_cap=4), calibrate([str(S3_CALL3)])):
        config = SwitchConfig.from_env({"SPECFLIP_SWITCH": result.switch_env,
                                        "SPECFLIP_SPEC_CAP": str(result.spec_cap)})
        assert (config.t_off, config.t_on, config.spec_cap) == (result.t_off, result.t_on, result.spec_cap)
    # the check itself refuses what the switch refuses
    bad = Calibration("plain", "spec", (path,), 0.05, 48, (), 8, 8, "")
    with pytest.raises(SwitchConfigError):
        _check_with_switch(bad)


@pytest.mark.parametrize(("content", "extra", "message"), [
    (None, (), "cannot read"),
    ('{"cfg": "plain", "conc": 1, "tok_s": 5}\n{oops\n', (), ":2: not JSON"),
    ("[1, 2]\n", (), ":1: a row must be a JSON object"),
    ('{"cfg": "spec", "conc": 1, "tok_s": 0}\n', (), "needs a positive 'tok_s'"),
    ('{"cfg": "plain", "conc": "8", "tok_s": 5}\n', (), "needs an integer 'conc'"),
    ('{"cfg": "plain", "conc": 1, "tok_s": 5}\n{"cfg": "spec", "conc": 2, "tok_s": 5}\n', (),
     "no concurrency measured for both 'plain' (c=[1]) and 'spec' (c=[2])"),
    ('{"cfg": "plain", "conc": 1, "tok_s": 5}\n', ("--margin", "-0.1"), "--margin must be from 0 to 1"),
    ('{"cfg": "plain", "conc": 1, "tok_s": 5}\n', ("--margin", "1e308"), "--margin must be from 0 to 1"),
    ('{"cfg": "plain", "conc": 1, "tok_s": 5}\n', ("--margin", "nan"), "--margin must be from 0 to 1"),
    ('{"cfg": "plain", "conc": 1, "tok_s": 5}\n', ("--spec-cap", "0"), "--spec-cap must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, content, extra, message):
    path = tmp_path / "bench.jsonl"
    if content is not None:
        path.write_text(content)
    rc, out, err = run_cli(capsys, path, *extra)
    assert rc == 2 and out == ""
    err = err.strip()
    assert err.startswith("specflip calibrate: ") and "\n" not in err and message in err, err


def test_missing_cfg_names_what_the_file_has(capsys):
    no_plain = RESULTS / "2026-11-29_44eaff4/bench_call1.jsonl"
    rc, _, err = run_cli(capsys, no_plain)
    assert rc == 2
    assert err.strip() == (f"specflip calibrate: no rows with cfg 'plain' in {no_plain} "
                           "(cfgs found: sw_guard, sw_noguard)")
    with pytest.raises(CalibrateError, match="cfg 'specflip'"):
        calibrate([str(S3_CALL3)], spec="specflip")


def test_calibrate_does_not_import_sglang():
    code = ("import sys; from specflip.cli import main; "
            f"rc = main(['calibrate', {str(S3_CALL3)!r}]); "
            "assert rc == 0 and not any(m == 'sglang' or m.startswith('sglang.') for m in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "SPECFLIP_SWITCH=1:0" in proc.stdout


# The 8B-class reference (GPU-HOST.md, "The anchor that decides"): speculation wins up to 24, plain from 32
ANCHOR_8B = {"plain": (221, 850, 3218, 4544, 6017, 10506, 22078), "spec": (331, 1236, 3768, 4841, 5778, 6560, 6856)}
ANCHOR_CONCS = (1, 4, 16, 24, 32, 64, 256)


def test_auto_settles_where_the_thresholds_do_on_the_8b_anchor(tmp_path, capsys):
    path = write_rows(tmp_path / "anchor.jsonl", ANCHOR_8B, ANCHOR_CONCS)
    rc, out, _ = run_cli(capsys, path, "--auto")
    assert rc == 0 and switch_line(out)[0] == "SPECFLIP_SWITCH=32:24"
    assert switch_line(out)[1].startswith("SPECFLIP_SWITCH=auto would settle on: speculation at c=1, 4, 16, 24; "
                                          "plain at c=32, 64, 256")
    rc, out, _ = run_cli(capsys, path, "--auto", "--json")
    data = json.loads(out)
    assert [a["mode"] for a in data["auto"]] == ["spec"] * 4 + ["plain"] * 3
    rc, out, _ = run_cli(capsys, path)
    assert "SPECFLIP_SWITCH=auto" not in out and "auto" not in calibrate([str(path)]).to_json()


def test_auto_on_a_host_where_plain_wins_everywhere(capsys):
    rc, out, _ = run_cli(capsys, S3_CALL3, "--auto")
    assert rc == 0 and "SPECFLIP_SWITCH=auto would settle on: speculation at c=none;" in out


# 2026-12-01 (9b58d3b), call 3: plain, steps 3 (spec) and steps 1 always on, 8B pair
S7_CALL3 = RESULTS / "2026-12-01_9b58d3b/bench_call3.jsonl"


def test_tiers_simulates_the_tiered_auto_learner_on_the_h200_rows(capsys):
    """`--tiers spec=3,spec_steps1=1`: the tiered learner on the 2026-12-01 (9b58d3b) run's per-tier rows settles on the
    best static mode at every concurrency (steps 1 up to 32, plain from 64), within 3 % of it (the docs/tiers.md
    table)."""
    rc, out, _ = run_cli(capsys, S7_CALL3, "--tiers", "spec=3,spec_steps1=1")
    assert rc == 0 and "SPECFLIP_SWITCH=auto with tiers, simulated" in out
    rc, out, _ = run_cli(capsys, S7_CALL3, "--tiers", "spec=3,spec_steps1=1", "--json")
    rows = json.loads(out)["auto_tiers"]
    assert [r["conc"] for r in rows] == [1, 4, 16, 24, 32, 64, 256]
    assert [r["best"] for r in rows] == ["steps=1"] * 5 + ["plain"] * 2
    assert all(r["fresh"] == r["best"] == r["sweep"] and r["fresh_over_best"] >= 0.97 for r in rows)
    assert set(rows[0]["static"]) == {"plain", "steps=3", "steps=1"}
    rc, out, _ = run_cli(capsys, S7_CALL3)
    assert "with tiers" not in out and "auto_tiers" not in calibrate([str(S7_CALL3)]).to_json()


@pytest.mark.parametrize(("tiers", "message"), [
    ("spec=3,spec=1", "distinct cfgs and distinct step counts"),
    ("spec=3,spec_steps1=3", "distinct cfgs and distinct step counts"),
    ("spec:3", "--tiers must be CFG=STEPS"),
    ("spec=0", "--tiers must be CFG=STEPS"),
    ("plain=1", "names the plain cfg"),
    ("spec=3,nosuch=1", "no rows with cfg 'nosuch'"),
])
def test_bad_tiers_are_one_line_and_exit_2(capsys, tiers, message):
    rc, out, err = run_cli(capsys, S7_CALL3, "--tiers", tiers)
    assert rc == 2 and out == ""
    err = err.strip()
    assert err.startswith("specflip calibrate: ") and "\n" not in err and message in err, err
