"""bench/gpu/bench_client.py and summarize.py, side by side: rounds interleaved over several servers, paired ratios.

The SGLang server cannot run here (no GPU): `CounterServerCpuStandIn` answers /generate with the counter model's
greedy outputs (what the GPU host's models give) and records the order requests reach it."""

from __future__ import annotations

import datetime
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "gpu"))

import bench_client  # noqa: E402
import summarize  # noqa: E402

VOCAB = 2048


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


class BackloggedServer(ThreadingHTTPServer):
    """A listen backlog for the traces' 24 concurrent requests (the default of 5 resets connections beyond it)."""

    request_queue_size = 256


class CounterServerCpuStandIn:
    """/generate: output k = (last prompt token + 1 + k) mod vocab, after `delay_s`; /freeze_gc: counted. `log` is a
    shared list of (server name, request kind) in arrival order."""

    def __init__(self, name: str, log: list[tuple[str, str]], delay_s: float, wrong: bool = False) -> None:
        outer = self
        self.name, self.log, self.delay_s, self.wrong, self.freezes = name, log, delay_s, wrong, 0
        self.prompts: list[list[int]] = []
        self.lengths: list[int] = []  # each request's max_new_tokens, in arrival order

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                if self.path == "/freeze_gc":
                    outer.freezes += 1
                    self._reply(b"Garbage collection frozen.\n")
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.log.append((outer.name, "generate"))
                time.sleep(outer.delay_s)
                ids, n = body["input_ids"], body["sampling_params"]["max_new_tokens"]
                outer.prompts.append(ids)
                outer.lengths.append(n)
                out = [(ids[-1] + 1 + k + int(outer.wrong)) % VOCAB for k in range(n)]
                # the slow stand-in plays a speculative server: it reports an accept length; both report the prompt
                # tokens a prefix cache holding every earlier prompt would serve
                cached = max((common_prefix(ids, p) for p in outer.prompts[:-1]), default=0)
                meta: dict[str, Any] = {"cached_tokens": cached}
                if outer.name == "slow":  # as SGLang reports it: verifies and accepted drafts, at accept 2.0
                    verifies = max(1, len(out) // 2)
                    meta.update(spec_accept_length=len(out) / verifies, spec_verify_ct=verifies,
                                spec_num_correct_drafts=verifies)
                self._reply(json.dumps({"output_ids": out, "meta_info": meta}).encode())

            def _reply(self, data: bytes) -> None:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(data)

        self.httpd = BackloggedServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def servers() -> Any:
    log: list[tuple[str, str]] = []
    made = [CounterServerCpuStandIn("fast", log, 0.001), CounterServerCpuStandIn("slow", log, 0.015),
            CounterServerCpuStandIn("wrong", log, 0.001, wrong=True)]
    yield made, log
    for s in made:
        s.httpd.shutdown()


def run(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_client.py", *argv])
    bench_client.main()


def test_side_by_side_rounds_are_interleaved_and_paired(servers: Any, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (fast, slow, wrong), log = servers
    out = tmp_path / "bench.jsonl"
    spec = ",".join(f"{s.name}={s.url}" for s in (fast, slow, wrong))
    run(["--servers", spec, "--concurrency", "1,2", "--rounds", "3", "--scale", "2", "--new-tokens", "4",
         "--warmup", "1", "--freeze-gc", "--out", str(out)], monkeypatch)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["cfg"], r["conc"]) for r in rows] == [(n, c) for c in (1, 2) for n in ("fast", "slow", "wrong")]
    for r in rows:
        assert r["nreq"] == 16 and r["outputs"] == 3 * 16 and r["errors"] == 0
        assert r["exact"] == (0 if r["cfg"] == "wrong" else 48)  # the counter check catches a wrong server
        assert sorted(r["round_tok_s_in_order"]) == r["round_tok_s"] and len(r["round_tok_s"]) == 3
    assert [s.freezes for s in (fast, slow, wrong)] == [1, 1, 1]
    # after the warm-up round (1 + 8 requests each), each round sends one server's warm-up + measured requests,
    # then the next's: at concurrency 1, round k starts with server k (rotated order)
    measured = [name for name, _ in log[3 * 9:]]
    per_server_round = 1 + 16  # min(c, 4) warm-up requests, then 16 measured, at concurrency 1
    firsts = [measured[i * per_server_round] for i in range(9)]
    assert firsts == ["fast", "slow", "wrong", "slow", "wrong", "fast", "wrong", "fast", "slow"]
    # the slow server's rounds are slower in every matched pair: the paired ratio says so round by round
    by = {(r["cfg"], r["conc"]): r for r in rows}
    ratios = summarize.paired_ratios(by[("slow", 1)], by[("fast", 1)])
    assert len(ratios) == 3 and all(x < 1 for x in ratios)
    assert summarize.paired_ratios(by[("slow", 1)], {"round_tok_s": [1.0]}) == []  # not side by side: no pairs


def test_no_round_starts_after_the_deadline_and_a_cut_concurrency_keeps_its_rounds(
        servers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """The deadline is checked before every round, not only before a concurrency's first (2026-12-03, b86d557: the 256
    rounds started before the deadline and the call's timeout killed them, nothing recorded). The slow stand-in's round
    takes at least 135 ms (a warm-up request and 8 measured ones, 15 ms each, one at a time), past a 0.1 s deadline: one
    round each, then no more."""
    (fast, slow, _), _ = servers
    out = tmp_path / "bench.jsonl"
    run(["--servers", f"fast={fast.url},slow={slow.url}", "--concurrency", "1,2", "--rounds", "3", "--new-tokens", "4",
         "--deadline", "0.1", "--out", str(out)], monkeypatch)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["cfg"], r["conc"], r["rounds"]) for r in rows] == [("fast", 1, 1), ("slow", 1, 1)]
    printed = capsys.readouterr().out
    assert "BENCH_SKIP conc=1: deadline after 1 of 3 rounds" in printed
    assert "BENCH_SKIP conc=2: deadline" in printed


@pytest.mark.parametrize(("round_warmup", "warm"), [("min4", 4), ("full", 8)])
def test_each_round_warms_with_min4_or_the_full_concurrency(servers: Any, monkeypatch: pytest.MonkeyPatch,
                                                              round_warmup: str, warm: int) -> None:
    """--round-warmup: each round's unmeasured requests before the measured ones, at concurrency 8: 4 of them
    (min4, the default), or 8 (full: the round starts at the load it measures)."""
    (fast, _, _), log = servers
    run(["--servers", f"fast={fast.url}", "--concurrency", "8", "--rounds", "2", "--new-tokens", "2",
         "--round-warmup", round_warmup], monkeypatch)
    assert len(log) == 2 * (warm + 16)
    with pytest.raises(SystemExit):  # argparse's choices: one line, exit 2
        run(["--servers", f"fast={fast.url}", "--round-warmup", "some"], monkeypatch)


@pytest.mark.parametrize(("argv", "message"), [
    (["--servers", "plain"], "argument --servers: wants NAME=URL[,NAME=URL...], got 'plain'"),
    ([], "give a configuration name or --servers"),
    (["x", "--concurrency", "1,four"], "argument --concurrency: not an integer: 'four'"),
    (["x", "--concurrency", "-1"], "argument --concurrency: must be at least 0, got -1"),
    (["x", "--warmup", "0"], "argument --warmup: must be at least 1, got 0"),
    (["x", "--rounds", "0"], "argument --rounds: must be at least 1, got 0"),
    (["x", "--deadline", "soon"], "argument --deadline: not a number: 'soon'"),
])
def test_bad_arguments_are_one_clear_line(argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        run(argv, monkeypatch)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err == f"bench_client: {message} (see `bench_client --help`)\n"


def _call(path: Path, rounds: dict[str, dict[int, list[float]]]) -> str:
    """One side-by-side call's bench JSONL: cfg -> concurrency -> round_tok_s_in_order."""
    path.write_text("".join(json.dumps({"cfg": cfg, "conc": c, "round_tok_s_in_order": r, "tok_s": sorted(r)[0]})
                            + "\n" for cfg, per in rounds.items() for c, r in per.items()))
    return str(path)


def test_pooled_ratios_take_the_better_base_each_round_and_say_when_the_target_is_missed(tmp_path: Path) -> None:
    """--pool: round k of the switch over the better of plain and always on in round k, pooled over the calls;
    the same code says NO for a switch 10 % behind (so a passing verdict can fail)."""
    a = _call(tmp_path / "a.jsonl", {"plain": {1: [100, 100, 100], 8: [100, 100, 100]},
                                     "spec": {1: [200, 50, 50]},
                                     "specflip_retract": {1: [190, 99, 101], 8: [90, 90, 90]}})
    b = _call(tmp_path / "b.jsonl", {"plain": {1: [10, 10]}, "specflip_retract": {1: [10, 10]}})
    get = {(r["cfg"], r["conc"]): r for r in summarize.load_rows([a])}
    assert summarize.paired_best_ratios(get, "specflip_retract", 1) == [0.95, 0.99, 1.01]  # spec won round 1
    assert summarize.paired_best_ratios(get, "specflip_retract", 2) == []
    lines = summarize.pooled([a, b]).splitlines()
    row1 = next(line for line in lines if line.startswith("| 1 |")).split(" | ")
    assert row1[1:4] == ["5 (2)", "1.000", row1[3]] and row1[4] == "0.99, 1.00" and row1[5].startswith("yes")
    row8 = next(line for line in lines if line.startswith("| 8 |")).split(" | ")
    assert row8[1:3] == ["3 (1)", "0.900"] and row8[3] == "0.900-0.900" and row8[5].startswith("NO")
    fig = summarize.pooled_figure(summarize.pooled_stats([a, b]))
    medians = fig.axes[0].lines[0].get_xydata().tolist()  # the errorbar's markers: the pooled median per concurrency
    assert [c for c, _ in medians] == [1, 8] and medians[1][1] == pytest.approx(0.9)
    per_call = next(c for c in fig.axes[0].collections if type(c).__name__ == "PathCollection")
    assert len(per_call.get_offsets()) == 2 + 1  # a dot per call: two calls at 1, one at 8
    svg = summarize.save(fig, str(tmp_path / "pooled.svg"))
    assert ElementTree.parse(svg).getroot().tag == "{http://www.w3.org/2000/svg}svg"
    with pytest.raises(SystemExit, match="no side-by-side pairs"):
        summarize.pooled([_call(tmp_path / "c.jsonl", {"plain": {1: [1.0]}})])


def test_over_pairs_every_configuration_with_the_base_and_ratio_names_the_columns(tmp_path: Path) -> None:
    """--over: round k of each configuration over round k of the base (not the medians: the rounds are pairs);
    --ratio: the configurations given a column over the better of plain and always on."""
    rows = [{"cfg": cfg, "conc": 64, "round_tok_s_in_order": r, "tok_s": sorted(r)[1], "lat_mean": 1.0, "nreq": 8,
             "exact": 8} for cfg, r in (("switch", [100, 120, 80]), ("guard", [96, 120, 40]), ("plain", [50, 50, 50]))]
    lines = summarize.over_table(rows, "switch").splitlines()
    assert lines[0] == ("| concurrency | guard / switch (paired median, min-max) "
                        "| plain / switch (paired median, min-max) |")
    assert lines[2].startswith("| 64 | 0.960 (0.500-1.000) | 0.500 (0.417-0.625) |")
    default = summarize.table(rows).splitlines()[0]
    assert "guard / best" not in default and "switch / best(plain, always on)" in default
    named = summarize.table(rows, ("guard",)).splitlines()
    assert "guard / best, paired rounds" in named[0] and "switch / best" not in named[0]
    assert named[2].endswith("| 1.92 (0.80-2.40) |")  # 96/50, 120/50, 40/50: paired, not 96/50 from the medians


def test_the_figure_draws_each_configuration_and_the_paired_ratios_the_table_gives(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--plot: throughput per configuration, and the paired-round ratios of the --ratio configurations (median and
    range, the table's figures); written the same, byte for byte, from the same rows; without matplotlib one line,
    exit 2."""
    rows = [{"cfg": cfg, "conc": c, "round_tok_s_in_order": r, "tok_s": sorted(r)[1], "lat_mean": 1.0, "nreq": 8,
             "exact": 8} for c in (16, 64)
            for cfg, r in (("switch", [100, 120, 80]), ("guard", [96, 120, 40]), ("plain", [50, 50, 50]))]
    fig = summarize.figure(rows, ("guard",), title="stand-in rows")
    tput, ratio = fig.axes
    assert [line.get_label() for line in tput.lines] == ["plain decoding", "specflip switch, calibrated thresholds",
                                                          "guard"]  # the table's order: known ones first
    assert tput.lines[0].get_xydata().tolist() == [[16, 50], [64, 50]]
    (guard,) = [c for c in ratio.containers if c.get_label() == "guard"]
    medians, _, (bars,) = guard.lines  # an errorbar: the medians' line, its caps, its bars
    assert medians.get_ydata().tolist() == pytest.approx([1.92, 1.92])  # as the table: 96/50, 120/50, 40/50
    assert [seg[:, 1].tolist() for seg in bars.get_segments()] == [pytest.approx([0.8, 2.4])] * 2  # the range
    assert fig._suptitle.get_text() == "stand-in rows"
    first, again = (summarize.save(summarize.figure(rows, ("guard",)), str(tmp_path / n)) for n in ("a.svg", "b.svg"))
    assert Path(first).read_bytes() == Path(again).read_bytes()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the bench extra not installed
    with pytest.raises(SystemExit) as exc:
        summarize.figure(rows)
    assert exc.value.code == 2 and "pip install -e '.[bench]'" in capsys.readouterr().err


def test_bursty_load_pairs_rounds_and_summarize_compares_with_the_best_static_setting(
        servers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import bursty_client
    (fast, slow, wrong), log = servers
    out = tmp_path / "bursty.jsonl"
    # the fast stand-in plays the better static setting ("plain"), the slow one the worse ("spec")
    spec = f"plain={fast.url},spec={slow.url},switch={wrong.url}"
    monkeypatch.setattr(sys, "argv", ["bursty_client.py", "--servers", spec, "--cycles", "2", "--low-conc", "1",
                                      "--low-requests", "3", "--burst-conc", "4", "--burst-requests", "8",
                                      "--rounds", "2", "--new-tokens", "4", "--out", str(out)])
    bursty_client.main()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["cfg"], r["round"]) for r in rows] == [("plain", 0), ("spec", 0), ("switch", 0),
                                                      ("spec", 1), ("switch", 1), ("plain", 1)]
    for r in rows:
        assert r["requests"] == 2 * (3 + 8) and r["errors"] == 0 and len(r["phase_s"]) == 4
        assert r["quiet_lone"] is None  # one request in flight in a quiet phase: no arrival can be alone
        assert r["exact"] == (0 if r["cfg"] == "switch" else 22)  # the counter check catches a wrong server
        assert r["lat_p99"] >= r["lat_p50"] > 0
    # every server got the same schedule: 2 rounds x 22 requests
    assert sorted({n for n, _ in log}) == ["fast", "slow", "wrong"] and len(log) == 3 * 2 * 22
    lines = summarize.bursty_table([str(tmp_path)])
    table = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in lines if line.startswith("| ")}
    assert float(table["plain decoding"][7]) == 1.0  # plain is the better static setting in each round
    assert float(table["EAGLE-3 always on"][7]) < 1.0
    # each phase at the faster static setting sums to no more than the faster one's total: never a larger ratio
    for label in ("plain decoding", "EAGLE-3 always on"):
        assert float(table[label][8]) <= float(table[label][7])
    assert table["specflip switch, calibrated thresholds"][6] == "0/44"
    assert table["plain decoding"][12] == "- |"  # no quiet lone starts to count
    # a committed bursty file given by itself is that table, not bench rows (bench/gpu/results/bursty_*.jsonl)
    committed = tmp_path / "results" / "bursty_s0_call1.jsonl"
    committed.parent.mkdir()
    committed.write_text(out.read_text())
    monkeypatch.setattr(sys, "argv", ["summarize.py", str(committed), "--traces"])
    summarize.main()
    printed = capsys.readouterr().out
    assert "(no bench rows)" in printed and "## Bursty load, bursty_s0_call1.jsonl" in printed
    # --plot-bursty: per configuration its median round's phases in order (the faster of two rounds), in one bar
    fig = summarize.bursty_figure(rows, title="stand-ins")
    bars = fig.axes[0].patches
    assert len(bars) == 3 * 4
    plain = min((r for r in rows if r["cfg"] == "plain"), key=lambda r: r["total_s"])
    top = sorted(bars, key=lambda b: (-b.get_y(), b.get_x()))[:4]  # plain: the first configuration, drawn on top
    assert [b.get_width() for b in top] == pytest.approx(plain["phase_s"])
    assert [b.get_x() for b in top] == pytest.approx([sum(plain["phase_s"][:i]) for i in range(4)])
    failed = [{**r, "errors": 1} if r["cfg"] == "spec" else r for r in rows]  # a configuration that failed requests
    assert len(summarize.bursty_figure(failed).axes[0].patches) == 2 * 4  # is left out
    with pytest.raises(ValueError, match="nothing to draw"):
        summarize.bursty_figure([{**r, "errors": 1} for r in rows])
    monkeypatch.setattr(sys, "argv", ["summarize.py", str(tmp_path), "--traces", "--plot-bursty",
                                      str(tmp_path / "bursty.svg")])
    summarize.main()
    assert ElementTree.parse(tmp_path / "bursty.svg").getroot().tag == "{http://www.w3.org/2000/svg}svg"
    monkeypatch.setattr(sys, "argv", ["summarize.py", str(tmp_path), str(committed), "--traces", "--plot-bursty",
                                      str(tmp_path / "two.svg")])
    with pytest.raises(SystemExit) as exc:
        summarize.main()
    assert exc.value.code == 2 and "found 2 file(s)" in capsys.readouterr().err


def test_lone_starts_count_the_requests_no_other_start_came_near(servers: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A quiet-phase request more than LONE_START_S from every other start reached the server alone (the 2026-12-03
    (9d1af93) run's slow bursty round); the bursty rows count them per round, and summarize lists them round by
    round."""
    import bursty_client
    assert bursty_client.lone_starts([0.0, 0.001, 0.1, 0.2, 0.2049]) == 1  # 0.1 alone; two pairs within 5 ms
    assert bursty_client.lone_starts([0.0, 0.006, 0.012]) == 3 and bursty_client.lone_starts([]) == 0
    (fast, _, _), _ = servers
    out = tmp_path / "bursty.jsonl"
    monkeypatch.setattr(sys, "argv", ["bursty_client.py", "--servers", f"plain={fast.url}", "--cycles", "1",
                                      "--low-conc", "2", "--low-requests", "6", "--burst-conc", "2",
                                      "--burst-requests", "2", "--rounds", "2", "--new-tokens", "2", "--out", str(out)])
    bursty_client.main()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(isinstance(r["quiet_lone"], int) and 0 <= r["quiet_lone"] <= 6 for r in rows)
    cell = summarize.lone_cell({r["round"]: r for r in rows})
    assert cell == f"{rows[0]['quiet_lone']}, {rows[1]['quiet_lone']}"
    assert summarize.lone_cell({0: {"cfg": "plain"}}) == "-"  # rows from before the count


def test_bursty_shared_prefix_spans_a_burst_and_the_quiet_phase_after_it(
        servers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24's load: a new shared prefix per burst, which the next quiet phase starts with too; the accept length
    is averaged per phase kind (None where the server reports none)."""
    import bursty_client
    (fast, slow, _), _ = servers
    out = tmp_path / "bursty.jsonl"
    monkeypatch.setattr(sys, "argv", ["bursty_client.py", "--servers", f"plain={fast.url},spec={slow.url}",
                                      "--cycles", "2", "--low-conc", "1", "--low-requests", "2", "--burst-conc", "1",
                                      "--burst-requests", "3", "--rounds", "1", "--new-tokens", "2",
                                      "--shared-prefix", "5", "--out", str(out)])
    bursty_client.main()
    rows = {r["cfg"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["spec"]["quiet_accept"] == rows["spec"]["burst_accept"] == 2.0
    assert rows["plain"]["quiet_accept"] is None and rows["plain"]["exact"] == 10
    prompts = fast.prompts  # quiet 2, burst 3, quiet 2, burst 3, in order (one request in flight)
    assert slow.prompts == prompts and len(prompts) == 10 and all(len(p) == 5 + 32 for p in prompts)
    heads = [tuple(p[:5]) for p in prompts]
    assert heads[2:7] == [heads[2]] * 5 and heads[7:] == [heads[7]] * 3  # a burst and the quiet phase after it
    assert len({heads[0], heads[2], heads[7]}) == 3
    # the quiet phases' prompt tokens the cache served: the shared prefix of 3 of their 4 prompts (the first prompt
    # of all hits nothing; a burst: 2 of its 3), give or take a random token that happens to match past it
    assert 15 / (4 * 37) <= rows["plain"]["quiet_hit"] < 0.2 and 20 / (6 * 37) <= rows["plain"]["burst_hit"] < 0.2


def test_bursty_follow_ups_continue_the_bursts_conversations(
        servers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24's multi-turn load: the first quiet prompts after a burst are that burst's prompts, their greedy
    answers and a new turn, so a server returns them exact and its cache serves the earlier turn."""
    import bursty_client
    (fast, _, _), _ = servers
    out = tmp_path / "bursty.jsonl"
    monkeypatch.setattr(sys, "argv", ["bursty_client.py", "--servers", f"plain={fast.url}", "--cycles", "2",
                                      "--low-conc", "1", "--low-requests", "3", "--burst-conc", "1",
                                      "--burst-requests", "3", "--rounds", "1", "--new-tokens", "4",
                                      "--follow-ups", "2", "--out", str(out)])
    bursty_client.main()
    row = json.loads(out.read_text())
    assert row["exact"] == 12 and row["errors"] == 0
    prompts = fast.prompts  # quiet 3, burst 3, quiet 3 (2 follow-ups), burst 3
    for turn, earlier in zip(prompts[6:8], prompts[4:6], strict=True):  # the burst's last two
        answer = [(earlier[-1] + 1 + k) % 2048 for k in range(4)]
        assert turn[:len(earlier) + 4] == earlier + answer and len(turn) == len(earlier) + 4 + 16
    assert len(prompts[8]) == 32 and all(len(q) == 32 for q in prompts[:3])  # no burst before the first quiet phase
    monkeypatch.setattr(sys, "argv", ["bursty_client.py", "--servers", "a=http://127.0.0.1:9", "--follow-ups", "17"])
    with pytest.raises(SystemExit) as e:
        bursty_client.main()
    assert e.value.code == 2


def test_target_window_is_where_both_bursty_targets_hold() -> None:
    """Issue 17's two bursty targets pull the burst length apart: >= 2x adaptive wants long bursts, >= 1.2x the better
    static setting short ones. With quiet/burst seconds plain (6, 2), always on (4, 6), adaptive (4, 8) and a switch at
    the per-phase best (4, 2): 1.2x plain holds while (6 + 2k) >= 1.2 (4 + 2k), k <= 3; 2x adaptive from
    (4 + 8k) >= 2 (4 + 2k), k >= 1; always on never binds."""
    low, high = summarize.target_window((4.0, 2.0), [(6.0, 2.0), (4.0, 6.0)], (4.0, 8.0), grid=4000, top=4.0)
    assert low == pytest.approx(1.0, abs=1e-3) and high == pytest.approx(3.0, abs=1e-3)
    # a switch slower in the quiet phases than the best: its window shrinks from both ends, then is gone
    narrower = summarize.target_window((4.4, 2.0), [(6.0, 2.0), (4.0, 6.0)], (4.0, 8.0))
    assert narrower is not None and low < narrower[0] < narrower[1] < high
    assert summarize.target_window((5.0, 2.0), [(6.0, 2.0), (4.0, 6.0)], (4.0, 8.0)) is None
    rounds = {k: {"cfg": cfg, "round": k, "total_s": sum(ph), "phase_s": ph, "errors": 0}
              for k, (cfg, ph) in enumerate([("plain", [3.0, 1.0, 3.0, 1.0]), ("spec", [2.0, 3.0, 2.0, 3.0]),
                                             ("adaptive", [2.0, 4.0, 2.0, 4.0]), ("switch", [2.0, 1.0, 2.0, 1.0])])}
    lines = summarize.window_lines({r["cfg"]: {0: r} for r in rounds.values()}, ["plain", "spec"])
    assert "- per-phase best (quiet 4.00 s, bursts 2.00 s): k in 1.00-3.00" in lines
    assert "- specflip switch, calibrated thresholds (quiet 4.00 s, bursts 2.00 s): k in 1.00-3.00" in lines
    assert summarize.window_lines({"plain": {0: rounds[0]}}, ["plain"]) == []  # no adaptive server: no window
    # one static setting ran (the 2026-12-03 (fea0197) run's call 2): no per-phase best, the switch against that setting
    one = summarize.window_lines({r["cfg"]: {0: r} for r in rounds.values() if r["cfg"] != "spec"}, ["plain"])
    assert not any("per-phase best" in line for line in one)
    assert "- specflip switch, calibrated thresholds (quiet 4.00 s, bursts 2.00 s): k in 1.00-3.00" in one


def test_bursty_client_refuses_a_zero_phase(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import bursty_client
    monkeypatch.setattr(sys, "argv", ["bursty_client.py", "--servers", "a=http://127.0.0.1:9", "--burst-conc", "0"])
    with pytest.raises(SystemExit) as e:
        bursty_client.main()
    assert e.value.code == 2 and "argument --burst-conc: must be at least 1, got 0" in capsys.readouterr().err


def test_first_step_after_a_flip_is_compared_with_steady_and_after_idle_steps_of_its_batch() -> None:
    """Issue 17's first-step figure: a flip-on follows the server emptying, so its first step is compared with
    first steps after idle without a flip (gap_ms >= the idle gap), as well as with steady ones, batch-matched."""
    def timing(ms: float, bs: int, first: bool = False, gap: float | None = 5.0) -> tuple[str, dict]:
        return ("switch", {"action": "timing", "kind": "spec", "bs": bs, "ms": ms, "first_after_flip": first,
                           "gap_ms": gap})

    events = [timing(6.7, 1, first=True, gap=900.0), timing(5.9, 1), timing(6.0, 1), timing(6.9, 1, gap=400.0),
              timing(7.0, 2, first=True), timing(1.0, 4)]
    assert [summarize.step_class(ev) for _, ev in events[:4]] == [
        "first after a flip", "steady", "steady", "first after idle, no flip"]
    rows = summarize.first_step_table(events)
    assert rows[-2] == "| switch | spec | 1 | 6.70 (1) | 5.95 (2) | 1.13 | 6.90 (1) | 0.97 |"
    assert rows[-1] == "| switch | spec | 2 | 7.00 (1) | - | - | - | - |"  # no steady step at batch 2: no ratio
    assert summarize.first_step_table(events[1:3]) == []  # no flip: no table


def test_first_steps_after_flips_are_pooled_over_batch_sizes() -> None:
    """The per-batch cells hold 1-6 samples on the H200: every first step after a flip over the steady median of its
    own batch size, pooled per configuration and kind; a batch size with no steady step gives no ratio."""
    def timing(ms: float, bs: int, first: bool = False) -> tuple[str, dict]:
        return ("switch", {"action": "timing", "kind": "spec", "bs": bs, "ms": ms, "first_after_flip": first,
                           "gap_ms": 5.0})

    events = [timing(6.0, 1), timing(6.0, 1), timing(6.6, 1, first=True), timing(8.0, 4), timing(12.0, 4, first=True),
              timing(9.0, 4, first=True), timing(7.0, 2, first=True)]
    lines = summarize.first_step_pooled(events)
    assert lines[-1] == "- switch, spec: 1.12x (1.10-1.50, n=3)"  # 1.10 at batch 1, 1.50 and 1.125 at batch 4
    assert summarize.first_step_pooled(events[:2]) == []  # no flip: nothing pooled


def test_first_steps_after_flips_are_pooled_against_steps_launched_onto_an_idle_stream() -> None:
    """On the H200 131 of 133 first steps after a flip were launched onto an idle stream (the host's gap since the
    last launch over 1.5x the step): their CUDA events take in the launch's host preparation, which a steady step's
    hide behind the step before. The like-for-like base is a step without a flip launched so too, at any gap."""
    def timing(ms: float, gap: float, first: bool = False) -> tuple[str, dict]:
        return ("switch", {"action": "timing", "kind": "plain", "bs": 8, "ms": ms, "first_after_flip": first,
                           "gap_ms": gap})

    events = [timing(5.0, 5.1), timing(5.0, 4.9), timing(5.1, 7.0),  # steady: launched behind the step before
              timing(6.0, 12.0), timing(6.2, 60.0),  # no flip, onto an idle stream (the second after an idle spell)
              timing(6.1, 20.0, first=True)]
    assert [summarize.onto_idle_stream(ev) for _, ev in events] == [False, False, False, True, True, True]
    lines = summarize.first_step_pooled(events)
    # over the steady median 5.05 (5.0, 5.0, 5.1 and the 6.0 after a 12 ms gap, under the idle spell's 50 ms)
    assert "- switch, plain: 1.21x (1.21-1.21, n=1)" in lines
    i = next(n for n, line in enumerate(lines) if line.startswith("First step after a flip over a step without"))
    assert lines[i + 2] == "- switch, plain: 1.00x (1.00-1.00, n=1)"  # 6.1 over the median of 6.0 and 6.2


def test_first_steps_after_flips_that_followed_idle_are_pooled_against_first_steps_after_idle() -> None:
    """A flip-on at a round's first arrival follows the server emptying: its first step is pooled a second time over
    the first steps after idle without a flip of its batch size (the idle spell's own cost), and only those steps:
    a flip under load (gap below the idle spell) is not."""
    def timing(ms: float, bs: int, first: bool = False, gap: float = 5.0) -> tuple[str, dict]:
        return ("switch", {"action": "timing", "kind": "spec", "bs": bs, "ms": ms, "first_after_flip": first,
                           "gap_ms": gap})

    events = [timing(6.0, 1), timing(6.0, 1), timing(7.0, 1, gap=900.0), timing(7.2, 1, gap=800.0),
              timing(7.7, 1, first=True, gap=700.0), timing(6.6, 1, first=True)]
    lines = summarize.first_step_pooled(events)
    assert lines[3] == "- switch, spec: 1.19x (1.10-1.28, n=2)"  # over the steady 6.0: 7.7 and 6.6
    assert lines[-1] == "- switch, spec: 1.08x (1.08-1.08, n=1)"  # 7.7 over the after-idle median 7.1 only
    assert not any("idle spell" in line for line in summarize.first_step_pooled(events[:2] + events[-1:]))


def test_the_warmups_steps_and_flips_are_left_out_of_the_first_step_figures(tmp_path: Path) -> None:
    """The switch's start-up warm-up pays the kernel builds (the H200, 2026-12-02 (50a6e62): a first plain step of 8.95
    s): its records are reported apart. Tagged by the switch, or, for a trace written before the tag, everything before
    the server log's warm-up line."""
    def timing(t: float, ms: float, first: bool = False, **tag: bool) -> dict:
        return {"t": t, "action": "timing", "kind": "plain", "bs": 256, "ms": ms, "first_after_flip": first,
                "gap_ms": 5.0, **tag}

    done = datetime.datetime(2026, 12, 2, 15, 23, 40, tzinfo=datetime.UTC).timestamp()
    tagged = [timing(done - 9, 8952.8, first=True, warmup=True),
              {"t": done - 9, "action": "flip_off", "warmup": True}, {"t": done + 5, "action": "flip_off"},
              timing(done + 5, 9.0, first=True), timing(done + 6, 8.8), timing(done + 7, 8.8)]
    untagged = [{k: v for k, v in ev.items() if k != "warmup"} for ev in tagged]
    for name, trace in (("tagged", tagged), ("logged", untagged)):
        folder = tmp_path / "tr" / name
        folder.mkdir(parents=True)
        (folder / "switch-1.jsonl").write_text("".join(json.dumps(ev) + "\n" for ev in trace))
        (folder / "server.log").write_text("[2026-12-02 15:23:26] Running warmup specflip\n[2026-12-02 15:23:40] "
                                           "specflip warm-up: 31 + 256 requests in 3.8 + 10.5 s\n")
    lines = summarize.timing_lines(summarize.trace_events([str(tmp_path)]))
    for name in ("tagged", "logged"):
        assert f"| {name} | plain | 256 | 9.00 (1) | 8.80 (2) | 1.02 | - | - |" in lines
        assert f"- {name}: 1 timed steps, the longest 8952.8 ms (plain, batch 256); 1 flips off, 0 on" in lines
    (tmp_path / "tr" / "logged" / "server.log").write_text("no warm-up ran\n")  # nothing to go by: all steady
    assert "| logged | plain | 256 | 4480.90 (2) | 8.80 (2) | 509.19 | - | - |" in summarize.timing_lines(
        summarize.trace_events([str(tmp_path)]))


def test_the_auto_learners_values_are_set_beside_what_the_servers_made() -> None:
    """2026-12-02 (50a6e62): `auto` held steps 1 at 48 valuing it 1.33x what always-on steps 1 made there. The report
    sets each mode's learned value (median over the decisions at a demand) beside the server of that mode at that
    concurrency; the warm-up's decisions and demands no concurrency matches give no ratio."""
    rows = [{"cfg": "plain", "conc": 48, "tok_s": 8000.0}, {"cfg": "spec_steps1", "conc": 48, "tok_s": 7500.0}]

    def decision(demand: int, plain: float | None, steps1: float, **tag: bool) -> tuple[str, dict]:
        return ("auto_tiers31", {"action": "tier", "policy": "auto", "demand": demand,
                                 "values": {"plain": plain, "steps=3": None, "steps=1": steps1}, **tag})

    events = [decision(48, None, 9900.0), decision(48, 8800.0, 10100.0), decision(48, 1.0, 1.0, warmup=True),
              decision(69, 12000.0, 8000.0), ("switch", {"action": "flip_off", "policy": "thresholds", "demand": 48})]
    lines = summarize.learner_values_lines(events, rows)
    assert "| auto_tiers31 | 48 | plain | 8,800 (1) | plain: 8,000 | 1.10 |" in lines
    assert "| auto_tiers31 | 48 | steps=1 | 10,000 (2) | spec_steps1: 7,500 | 1.33 |" in lines
    assert "| auto_tiers31 | 69 | plain | 12,000 (1) | - | - |" in lines
    assert summarize.learner_values_lines(events[-1:], rows) == []


def test_bursty_stagger_spreads_the_burst_lengths_the_same_for_every_server(
        servers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--stagger F: each burst request asks for --new-tokens times a factor in [1-F, 1+F], drawn once per round, so
    every server gets the same lengths (a burst drains gradually: the switch flips back on with requests running);
    quiet requests keep --new-tokens, a follow-up continues its burst request's own answer, and outputs stay exact."""
    import bursty_client
    (fast, slow, _), _ = servers
    out = tmp_path / "bursty.jsonl"
    monkeypatch.setattr(sys, "argv", ["bursty_client.py", "--servers", f"plain={fast.url},spec={slow.url}",
                                      "--cycles", "2", "--low-conc", "1", "--low-requests", "3", "--burst-conc", "1",
                                      "--burst-requests", "6", "--rounds", "1", "--new-tokens", "8", "--stagger", "0.5",
                                      "--follow-ups", "2", "--out", str(out)])
    bursty_client.main()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["exact"], r["errors"]) for r in rows] == [(18, 0), (18, 0)]
    assert fast.lengths == slow.lengths and fast.prompts == slow.prompts
    bursts = fast.lengths[3:9] + fast.lengths[12:]  # quiet 3, burst 6, quiet 3, burst 6, in order
    assert all(4 <= n <= 12 for n in bursts) and len(set(bursts)) > 1
    assert fast.lengths[:3] == fast.lengths[9:12] == [8] * 3
    for turn, earlier, n in zip(fast.prompts[9:11], fast.prompts[7:9], fast.lengths[7:9], strict=True):
        assert turn[:len(earlier) + n] == earlier + [(earlier[-1] + 1 + k) % VOCAB for k in range(n)]
    for bad in ("1", "-0.1"):
        monkeypatch.setattr(sys, "argv", ["bursty_client.py", "--servers", "a=http://127.0.0.1:9", "--stagger", bad])
        with pytest.raises(SystemExit) as e:
            bursty_client.main()
        assert e.value.code == 2


def test_flips_on_under_load_report_the_retracted_and_the_wait_to_the_first_speculative_step() -> None:
    def ev(t: float, action: str, **kw: object) -> tuple[str, dict]:
        return "switch", {"t": t, "action": action, **kw}

    spec = ("prepare_for_decode", "draft", "verify", "draft_extend")
    plain = ("prepare_for_decode", "plain_decode")
    events = [
        ev(1.0, "flip_on", running=0, retracted=0),  # an empty server: nothing waits
        ev(1.05, "step", actions=spec, bs=1),
        ev(1.1, "timing", kind="spec", bs=1, ms=6.0, first_after_flip=True),
        ev(2.0, "flip_off", running=40),
        ev(3.0, "flip_on", running=3, retracted=3),
        ev(3.04, "step", actions=plain, bs=40),  # the step launched before the flip, traced after it
        ev(3.05, "timing", kind="plain", bs=3, ms=5.0, first_after_flip=False),
        ("switch", {"t": 3.06, "action": "timing", "kind": "spec", "bs": 3, "ms": 7.0, "timer": True,
                    "first_after_flip": False}),  # the step timer's, not the switch's
        ev(3.08, "step", actions=spec, bs=3),  # the first speculative step's launch: the wait ends here
        ev(3.09, "step", actions=spec, bs=3),
        # read back at a later traced step: its record's time is not the step's
        ev(9.0, "timing", kind="spec", bs=3, ms=7.5, first_after_flip=True),
        ev(10.0, "flip_off", running=40),
        ev(11.0, "flip_on", running=2, retracted=2),
        ev(11.01, "flip_off", running=40),  # off again before a speculative step: no wait to report
        ev(11.5, "step", actions=spec, bs=2),
        ev(11.6, "timing", kind="spec", bs=2, ms=7.0, first_after_flip=True),
    ]
    lines = summarize.flip_on_under_load(events)
    assert lines[-1] == ("- switch: 1 flips on with requests running, 3-3 retracted each; the flip to the launch of "
                         "the first speculative step: median 80 ms (80-80); that step 7.5 ms on the device (median; "
                         "7.5-7.5)")
    assert summarize.flip_on_under_load(events[:4]) == []


def test_open_loop_arrivals_are_seeded_poisson_per_phase_with_spread_lengths() -> None:
    import random

    import open_loop_client as ol
    a = ol.arrivals([5.0, 50.0], 2.0, 2, 100, 0.5, VOCAB, random.Random(7))
    assert a == ol.arrivals([5.0, 50.0], 2.0, 2, 100, 0.5, VOCAB, random.Random(7))  # the same for every server
    assert [t for t, *_ in a] == sorted(t for t, *_ in a) and 0 < a[0][0] and a[-1][0] < 8.0
    for t, prompt, n, i in a:
        assert i == int(t // 2.0) % 2  # phase k of the profile covers [2k, 2k + 2) s
        assert 50 <= n <= 150 and len(prompt) == 32 and 0 <= prompt[-1] < 300  # the draft's range (accept 2.0)
    fast = sum(1 for *_, i in a if i == 1)
    assert 100 < fast < 300 and sum(1 for *_, i in a if i == 0) < fast / 3  # about 2 x 2 x 50 and 2 x 2 x 5
    assert {n for _, _, n, _ in ol.arrivals([5.0], 4.0, 1, 100, 0.0, VOCAB, random.Random(1))} == {100}


def test_open_loop_sends_the_same_schedule_to_every_server_and_times_from_arrival(
        servers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import open_loop_client as ol
    (fast, slow, wrong), log = servers
    out = tmp_path / "open_loop.jsonl"
    spec = f"plain={fast.url},spec={slow.url},switch={wrong.url}"
    monkeypatch.setattr(sys, "argv", ["open_loop_client.py", "--servers", spec, "--rates", "20,80", "--phase-s",
                                      "0.4", "--rounds", "2", "--new-tokens", "4", "--out", str(out)])
    ol.main()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["cfg"], r["round"]) for r in rows] == [("plain", 0), ("spec", 0), ("switch", 0),
                                                      ("spec", 1), ("switch", 1), ("plain", 1)]
    n = rows[0]["requests"]
    assert n > 10 and all(r["requests"] == n and r["errors"] == 0 for r in rows)
    assert [r["exact"] for r in rows] == [n, n, 0, n, 0, n]  # the counter check catches a wrong server
    assert sorted(fast.prompts[:n]) == sorted(slow.prompts[:n]) == sorted(wrong.prompts[:n])  # one schedule
    for r in rows:
        assert len(r["rate_p99"]) == 2 and r["lat_p99"] >= r["lat_p50"] > 0 and r["in_flight"] > 0
    slow_rows = [r for r in rows if r["cfg"] == "spec"]
    assert all(r["lat_p50"] >= 0.015 for r in slow_rows)  # its 15 ms per request counts from the arrival
    assert all(r["accept"] == 2.0 for r in slow_rows) and all(r["accept"] is None for r in rows if r["cfg"] == "plain")
    lines = summarize.open_loop_table([str(tmp_path)])
    table = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in lines if line.startswith("| ")}
    assert float(table["plain decoding"][9]) == 1.0 and float(table["EAGLE-3 always on"][9]) < 1.0


@pytest.mark.parametrize("argv, message", [
    (["--rates", "0,4"], "argument --rates: must be more than 0, got 0"),
    (["--rates", "fast"], "argument --rates: not a number: 'fast'"),
    (["--phase-s", "0"], "argument --phase-s: must be more than 0, got 0"),
    (["--spread", "1"], "argument --spread: must be below 1, got 1.0"),
    (["--rounds", "0"], "argument --rounds: must be at least 1, got 0"),
])
def test_open_loop_client_refuses_bad_input_in_one_line(argv: list[str], message: str,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    import open_loop_client as ol
    monkeypatch.setattr(sys, "argv", ["open_loop_client.py", "--servers", "a=http://127.0.0.1:9", *argv])
    with pytest.raises(SystemExit) as e:
        ol.main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err


def test_named_traces_make_their_prompts_and_summarize_reports_issue_52s_ratios(
        servers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """bursty_client.py --trace (issue 52) against the counter stand-ins: each named trace's rows in its own file,
    every configuration the same prompts; unpredictable prompts end where the counter's outputs stay at or above the
    draft's 1,024 ids (accept 1.0 on the GPU pair), predictable ones below 300, long prompts 2,000-3,500 tokens, a
    mixed phase every 8th request long. summarize.py's trace tables give the ratios issue 52 asks for: the per-phase
    best (the faster of plain and always on per phase), the better static setting, p99 per phase, `auto` over a
    configuration (the guard's cost), and name each missed target."""
    import bursty_client

    (fast, slow, _), log = servers
    # plain (fast) is the per-phase best in every phase; auto runs at plain's speed, auto_guard at spec's
    spec = f"plain={fast.url},spec={slow.url},auto={fast.url},auto_guard={slow.url}"
    monkeypatch.setattr(sys, "argv", ["bursty_client.py", "--servers", spec, "--trace", "accept_shift,context",
                                      "--rounds", "1", "--new-tokens", "4", "--out", str(tmp_path / "trace.jsonl")])
    assert bursty_client.main() == 0
    shift = [json.loads(x) for x in (tmp_path / "trace_accept_shift.jsonl").read_text().splitlines()]
    context = [json.loads(x) for x in (tmp_path / "trace_context.jsonl").read_text().splitlines()]
    assert [r["cfg"] for r in shift] == ["plain", "spec", "auto", "auto_guard"]
    for r in shift + context:
        assert r["errors"] == 0 and r["exact"] == r["requests"] and len(r["phase_s"]) == len(r["phase_labels"])
        assert len(r["phase_p99"]) == len(r["phase_labels"]) and r["trace"] in ("accept_shift", "context")
        # each request's [phase, start s after the round's, latency s, output tokens], in start order: a phase's
        # slowest is its p99 (16-48 requests), every request of a phase starts after the earlier phases' ended
        req = r["req"]
        assert len(req) == r["requests"] and req == sorted(req) and {q[3] for q in req} == {4}
        ends = [sum(r["phase_s"][:i + 1]) for i in range(len(r["phase_s"]))]
        for i, p99 in enumerate(r["phase_p99"]):
            mine = [q for q in req if q[0] == i]
            assert len(mine) == dict((lab, n) for lab, _, n, _, _ in bursty_client.TRACES[r["trace"]])[
                r["phase_labels"][i]]
            assert max(q[2] for q in mine) == p99
            assert all((ends[i - 1] if i else 0.0) - 0.002 <= q[1] and q[1] + q[2] <= ends[i] + 0.002 for q in mine)
    assert shift[0]["phase_labels"] == ["predictable", "unpredictable", "predictable_again"]
    # each server got the same prompts: the fast stand-in twice (plain, auto), in the order of the phases
    per_run = sum(n for _, _, n, _, _ in bursty_client.TRACES["accept_shift"] + bursty_client.TRACES["context"])
    assert len(fast.prompts) == 2 * per_run and len(slow.prompts) == 2 * per_run
    shift_prompts = fast.prompts[:48]  # plain's accept_shift run: 16 predictable, 16 unpredictable, 16 predictable
    assert sorted(map(len, shift_prompts)) == [32] * 48  # arrival order within a phase varies, the phases do not
    assert all(q[-1] < 300 for q in shift_prompts[:16] + shift_prompts[32:])
    assert all(1024 <= q[-1] < 2048 - 4 for q in shift_prompts[16:32])
    context_prompts = fast.prompts[96:96 + 112]  # round-major: each trace on every server, then the next trace
    lengths = [len(q) for q in context_prompts]
    assert all(2000 <= n <= 3500 for n in lengths[8:16] + lengths[48:64])  # c2_long, c8_long
    assert sum(n > 32 for n in lengths[64:]) == 48 // bursty_client.MIX_LONG  # c24_mixed: every 8th long
    assert set(lengths[:8] + lengths[16:48]) == {32}
    same = lambda a, b: sorted(map(tuple, a)) == sorted(map(tuple, b))  # noqa: E731
    assert same(fast.prompts[:48], fast.prompts[48:96]) and same(context_prompts, fast.prompts[208:])  # plain, auto

    lines = summarize.trace_table([str(tmp_path)])
    text = "\n".join(lines)
    assert "## Trace trace_accept_shift.jsonl" in text and "## Trace trace_context.jsonl" in text
    table = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in lines if line.startswith("| ")}
    auto, guard = table[summarize.CFG_LABEL["auto"]], table[summarize.CFG_LABEL["auto_guard"]]
    # per-phase best / this, better static / this, auto / this
    # ratios are there and parse (which is larger depends on the stand-ins' times, which a busy CPU moves)
    assert all(float(row[i]) > 0 for row in (auto, guard) for i in (4, 5, 6))
    assert "| 1 unpredictable |" in text and "| 4 c24_mixed |" in text
    assert "auto_guard:" in text and "the guard's cost over 2 %" in text  # the slow stand-in misses the targets
    # summarize.py on a run folder prints the trace tables; a trace file given by itself is read as one too
    monkeypatch.setattr(sys, "argv", ["summarize.py", str(tmp_path / "trace_context.jsonl"), "--traces"])
    summarize.main()
    printed = capsys.readouterr().out
    assert "## Trace trace_context.jsonl" in printed and "(no bench rows)" in printed


@pytest.mark.parametrize(("argv", "message"), [
    (["--trace", "nosuch"],
     "argument --trace: wants names from load, accept_shift, context, bursty, bursty_contrast, mixed, got 'nosuch'"),
    (["--trace", "context", "--new-tokens", "1100"],
     "argument --trace: unpredictable prompts need --vocab - --new-tokens > 1024 (the draft's vocabulary), got "
     "2048 - 1100"),
])
def test_bad_trace_arguments_are_one_clear_line(argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import bursty_client

    monkeypatch.setattr(sys, "argv", ["bursty_client.py", "--servers", "a=http://127.0.0.1:9", *argv])
    with pytest.raises(SystemExit) as exc:
        bursty_client.main()
    assert exc.value.code == 2 and capsys.readouterr().err == f"bursty_client: {message} (see `bursty_client --help`)\n"


def test_accept_length_counts_speculative_steps_only() -> None:
    """A request the switch decoded partly plain: SGLang's spec_accept_length (completion tokens / verifies) read 128
    for one verify among 128 tokens (the 2026-12-06 (b3a9830) `auto` rows); over its speculative steps it is 2.0."""
    partly_plain = {"spec_accept_length": 128.0, "spec_verify_ct": 1, "spec_num_correct_drafts": 1}
    assert bench_client.accept_length(partly_plain) == 2.0
    always_on = {"spec_accept_length": 2.0, "spec_verify_ct": 64, "spec_num_correct_drafts": 64}
    assert bench_client.accept_length(always_on) == 2.0
    assert bench_client.accept_length({"spec_verify_ct": 16, "spec_num_correct_drafts": 0}) == 1.0
    assert bench_client.accept_length({}) is None  # plain server: no verify
    assert bench_client.accept_length({"spec_verify_ct": 0}) is None
