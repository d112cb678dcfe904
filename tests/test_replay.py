"""`specflip replay` on CPU: greedy equality, lost requests, conformance and admission stalls, judged on
outputs and switch traces recorded on the H200 (tests/regressions/recorded, real), plus the switch's policy."""

import argparse
import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from shim.guard import api as guard_api
from shim.releases.registry import installed_line
from shim.switch.v2 import (
    PLAIN_STEP_ACTIONS,
    SPEC_STEP_ACTIONS,
    SwitchConfig,
    SwitchConfigError,
    SwitchPolicy,
)
from specflip import replay
from specflip.replay import Outcome, check_outputs, conformance, judge, read_trace_events, send_schedule
from specflip.schedules import Schedule, ScheduledRequest
from statemodel.actions import ACTIONS_BY_NAME
from statemodel.design import DesignKind
from statemodel.designs import get_design

RECORDED = Path(__file__).parent / "regressions" / "recorded"
REPORT = RECORDED / "replay_h200_excerpt.json"
TRACE_OK = RECORDED / "switch_trace_h200_replay.jsonl"
TRACE_STALL = RECORDED / "switch_trace_h200_before_admission_fix.jsonl"
GUARD_TRACE = RECORDED / "guard_trace_h200_overlap_excerpt.jsonl.gz"


def recorded_runs():
    runs = json.loads(REPORT.read_text())["runs"]
    return ([Schedule.from_json(r["schedule"]) for r in runs],
            [[Outcome.from_json(o) for o in r["outcomes"]] for r in runs])


# ------------------------------------------------------------------------------------------------
# greedy equality on recorded outputs


def test_recorded_h200_outputs_are_greedy_exact():
    scheds, outs = recorded_runs()
    for s, o in zip(scheds, outs, strict=True):
        chk = check_outputs(s, o)
        assert chk["greedy_exact"] == chk["requests"] == len(s.requests)
        assert not chk["lost"] and not chk["errors"] and not chk["mismatched"]


def test_one_wrong_token_is_reported_with_its_position():
    scheds, outs = recorded_runs()
    s, o = scheds[0], list(outs[0])
    bad = list(o[0].output_ids)
    bad[3] = (bad[3] + 1) % 2048
    o[0] = Outcome(o[0].index, tuple(bad), None, o[0].latency_s)
    chk = check_outputs(s, o)
    assert chk["greedy_exact"] == len(o) - 1
    assert chk["mismatched"] == [{"index": 0, "first_bad": 3, "len": len(bad), "want_len": len(bad),
                                  "got": bad[3:7], "want": s.requests[0].expected_output()[3:7]}]


def test_short_output_errors_and_lost_requests_are_counted_apart():
    s = Schedule("up", 6, 2, tuple(ScheduledRequest(0.0, (10,), 3) for _ in range(3)))
    outs = [Outcome(0, (11, 12), None, 0.1), Outcome(1, None, "HTTPError: 500", 0.1),
            Outcome(2, None, "lost: no response (thread still waiting)", 1.0)]
    chk = check_outputs(s, outs)
    assert chk["greedy_exact"] == 0
    assert chk["mismatched"][0]["first_bad"] == 2 and len(chk["errors"]) == 1 and len(chk["lost"]) == 1


def test_reference_server_outputs_must_be_equal():
    scheds, outs = recorded_runs()
    ref = [Outcome(o.index, o.output_ids, None, 0.0) for o in outs[1]]
    assert check_outputs(scheds[1], outs[1], ref)["reference_mismatched"] == []
    ref[0] = Outcome(0, (1, 2, 3), None, 0.0)
    assert check_outputs(scheds[1], outs[1], ref)["reference_mismatched"] == [0]


# ------------------------------------------------------------------------------------------------
# conformance of the switch's trace to the model


def test_recorded_h200_trace_conforms_to_v2_switch_reserve_sync():
    conf = conformance(read_trace_events([TRACE_OK]), "v2_switch_reserve_sync")
    assert conf["unexplained"] == []
    assert {"flip_off", "flip_on", "plain_decode", "draft_sync", "verify"} <= set(conf["covered"])
    assert conf["admission_stalls"] == []


def test_the_same_trace_does_not_conform_to_the_catch_up_design():
    # plain_off_catch_up does no draft work while off: a draft_sync after a plain step is unexplained
    conf = conformance(read_trace_events([TRACE_OK]), "plain_off_catch_up")
    assert conf["unexplained"] and {u["action"] for u in conf["unexplained"]} == {"draft_sync"}


def test_a_plain_step_while_speculating_is_unexplained(tmp_path):
    # synthetic trace (labelled): a plain step without a flip_off before it
    p = tmp_path / "switch-1.jsonl"
    p.write_text(json.dumps({"action": "step", "actions": ["prepare_for_decode", "plain_decode", "draft_sync"]})
                 + "\n" + json.dumps({"action": "no_such_action"}) + "\n")
    conf = conformance(read_trace_events([p]), "v2_switch_reserve_sync")
    assert [u["action"] for u in conf["unexplained"]] == ["plain_decode", "draft_sync", "no_such_action"]


def test_the_admission_stall_found_on_the_h200_is_flagged():
    conf = conformance(read_trace_events([TRACE_STALL]), "v2_switch_reserve_sync")
    assert conf["unexplained"] == []
    assert len(conf["admission_stalls"]) == 1 and conf["admission_stalls"][0]["waiting"] == 13


def test_bad_trace_line_is_a_one_line_error(tmp_path):
    p = tmp_path / "switch-2.jsonl"
    p.write_text("{not json\n")
    with pytest.raises(replay.ReplayError, match="not a JSON line"):
        read_trace_events([p])
    p.write_text('["a list"]\n')
    with pytest.raises(replay.ReplayError, match="switch-2.jsonl:1: not a JSON object"):
        read_trace_events([p])


# ------------------------------------------------------------------------------------------------
# the report and the CLI on recorded outputs


def _recorded_args(path, trace_dir=None):
    return argparse.Namespace(recorded=str(path), trace_dir=trace_dir, design="v2_switch_reserve_sync")


def test_judge_and_cli_pass_the_recorded_run(tmp_path, capsys):
    scheds, outs = recorded_runs()
    trace_dir = tmp_path / "traces"
    trace_dir.mkdir()
    (trace_dir / "switch-7.jsonl").write_text(TRACE_OK.read_text())
    rep = judge(scheds, outs, None, str(trace_dir), "v2_switch_reserve_sync")
    assert rep["summary"]["ok"] and rep["summary"]["unexplained_transitions"] == 0
    assert rep["guard"] == {"available": False,  # a switch trace only: no guard trace to explain
                            "note": "no guard traces found (run the server with SPECFLIP_MODE=trace)"}
    (tmp_path / "r.json").write_text(json.dumps(rep))
    assert replay.main(_recorded_args(tmp_path / "r.json", str(trace_dir))) == 0
    assert "OK" in capsys.readouterr().out


def test_cli_fails_on_a_stall_trace_and_on_a_wrong_output(tmp_path):
    scheds, outs = recorded_runs()
    trace_dir = tmp_path / "traces"
    trace_dir.mkdir()
    (trace_dir / "switch-8.jsonl").write_text(TRACE_STALL.read_text())
    rep = judge(scheds, outs, None, str(trace_dir), "v2_switch_reserve_sync")
    assert not rep["summary"]["ok"] and rep["summary"]["admission_stalls"] == 1
    rep = judge(scheds, outs, None, None, "v2_switch_reserve_sync")
    rep["runs"][0]["outcomes"][0]["output_ids"][0] += 1
    (tmp_path / "bad.json").write_text(json.dumps(rep))
    assert replay.main(_recorded_args(tmp_path / "bad.json")) == 1


def test_cli_missing_recording_is_a_one_line_error(tmp_path, capsys):
    assert replay.main(_recorded_args(tmp_path / "absent.json")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specflip replay: cannot read recorded report") and "\n" not in err


# ------------------------------------------------------------------------------------------------
# sending: against a counter server stand-in on localhost (the GPU run uses the real SGLang server)


class _CounterServerCpuStandIn(BaseHTTPRequestHandler):
    """Answers /generate like the counter target; drops requests whose prompt ends in 999 (a lost request)."""

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ids, n = body["input_ids"], body["sampling_params"]["max_new_tokens"]
        if ids[-1] == 999:
            threading.Event().wait(2.0)
            return
        out = json.dumps({"output_ids": [(ids[-1] + 1 + k) % 2048 for k in range(n)],
                          "meta_info": {"spec_accept_length": 1.5}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture()
def counter_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _CounterServerCpuStandIn)
    srv.daemon_threads = True
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_send_schedule_collects_outputs_in_order_and_reports_a_timeout(counter_server):
    s = Schedule("up", 6, 2, (ScheduledRequest(0.0, (3, 7), 5), ScheduledRequest(0.02, (2047,), 3),
                              ScheduledRequest(0.01, (999,), 2)))
    outs = send_schedule(counter_server, s, timeout_s=0.5)
    assert outs[0].output_ids == (8, 9, 10, 11, 12) and outs[1].output_ids == (0, 1, 2)
    assert outs[2].output_ids is None and "timed out" in outs[2].error
    chk = check_outputs(s, outs)
    assert chk["greedy_exact"] == 2 and len(chk["errors"]) == 1


# ------------------------------------------------------------------------------------------------
# the switch: its policy and its contract with the model


def test_policy_hysteresis_and_the_spec_cap_clamp():
    pol = SwitchPolicy(SwitchConfig(t_off=16, t_on=8, spec_cap=48))
    assert pol.decide(running=10, waiting=5) is None and pol.spec_on
    assert pol.decide(running=10, waiting=6) == "flip_off"
    assert pol.decide(running=9, waiting=0) is None  # between t_on and t_off: stays off
    assert pol.decide(running=8, waiting=0) == "flip_on"
    assert pol.admission_cap(running=8, allocatable=200) == 40  # speculation's cap while on
    pol.decide(running=100, waiting=0)
    assert pol.admission_cap(running=100, allocatable=156) == 156  # the launch cap while off
    clamped = SwitchPolicy(SwitchConfig(t_off=100, t_on=60, spec_cap=48), spec_on=False)
    assert clamped.decide(running=55, waiting=0) is None  # t_on reached but above speculation's cap
    waiting = SwitchPolicy(SwitchConfig(t_off=16, t_on=8), spec_on=False)
    assert waiting.decide(running=4, waiting=10) is None  # the model counts waiting requests as demand
    assert waiting.decide(running=4, waiting=4) == "flip_on"


def test_switch_actions_are_model_actions_and_designs_exist():
    for name in SPEC_STEP_ACTIONS + tuple(a for acts in PLAIN_STEP_ACTIONS.values() for a in acts):
        assert name in ACTIONS_BY_NAME
    assert get_design(SwitchConfig(2, 1).design_name).kind is DesignKind.SHIPPED
    assert get_design(SwitchConfig(2, 1, draft_while_off="none").design_name).kind is DesignKind.KNOWN_BAD


@pytest.mark.parametrize("env, message", [
    ({"SPECFLIP_SWITCH": "16"}, "t_off:t_on"),
    ({"SPECFLIP_SWITCH": "8:16"}, "t_on < t_off"),
    ({"SPECFLIP_SWITCH": "16:8", "SPECFLIP_SWITCH_DRAFT": "later"}, "SPECFLIP_SWITCH_DRAFT"),
    ({"SPECFLIP_SWITCH": "16:8", "SPECFLIP_SPEC_CAP": "many"}, "SPECFLIP_SPEC_CAP"),
    ({"SPECFLIP_SWITCH": "16:8", "SPECFLIP_PLAIN_PREFILL": "cached"}, "SPECFLIP_PLAIN_PREFILL=.cached.: expected"),
])
def test_switch_config_errors_are_one_line(env, message):
    with pytest.raises(SwitchConfigError, match=message) as exc:
        SwitchConfig.from_env(env)
    assert "\n" not in str(exc.value)


def test_switch_is_off_without_its_variable():
    assert SwitchConfig.from_env({}) is None
    assert SwitchConfig.from_env({"SPECFLIP_SWITCH": "16:8"}) == SwitchConfig(16, 8)
    assert SwitchConfig.from_env({"SPECFLIP_SWITCH": "16:8"}).plain_prefill == "graphs"
    eager = SwitchConfig.from_env({"SPECFLIP_SWITCH": "16:8", "SPECFLIP_PLAIN_PREFILL": "eager"})
    assert eager is not None and eager.plain_prefill == "eager"


def test_install_switch_registers_on_the_real_hook_registry(tmp_path):
    hook_registry = pytest.importorskip("sglang.srt.plugins.hook_registry")
    from shim.switch import v2 as switch_v2

    registry = hook_registry.HookRegistry
    # the guard plugin's registrations, which test modules run later read (pytest -p randomly, -k ...)
    saved = ({target: list(hooks) for target, hooks in registry._hooks.items()}, set(registry._patched))
    registry.reset()
    try:
        assert switch_v2.install_switch(registry, None) is False
        assert switch_v2.install_switch(registry, SwitchConfig(6, 2, spec_cap=8, draft_while_off="sync",
                                                               trace_dir=str(tmp_path)))
        targets = set(registry._hooks)
        assert {switch_v2.T_FORWARD, installed_line().plain_capture_target, switch_v2.T_UPDATE_RUNNING,
                switch_v2.T_ALLOCATABLE} <= targets
        assert switch_v2.T_NEXT_BATCH not in targets
        # the plain path (draft mode retract) flips in get_next_batch_to_run and leaves update_running_batch alone
        registry.reset()
        switch_v2._RUNTIME = None
        assert switch_v2.install_switch(registry, SwitchConfig(6, 2, spec_cap=8, draft_while_off="retract"))
        targets = set(registry._hooks)
        assert {switch_v2.T_FORWARD, installed_line().plain_capture_target, switch_v2.T_NEXT_BATCH,
                switch_v2.T_ALLOCATABLE} <= targets
        assert switch_v2.T_UPDATE_RUNNING not in targets and switch_v2.T_RUN_BATCH not in targets  # no trace: no hook
    finally:
        registry.reset()
        registry._hooks.update(saved[0])
        registry._patched.update(saved[1])
        switch_v2._RUNTIME = None
        guard_api.announce_switch(None)
    trace = next(tmp_path.glob("switch-*.jsonl")).read_text()
    assert '"design": "v2_switch_reserve_sync"' in trace


def test_install_from_env_is_off_without_the_variable_and_one_line_on_a_bad_one(monkeypatch, caplog):
    from shim.switch import v2 as switch_v2

    monkeypatch.delenv("SPECFLIP_SWITCH", raising=False)
    assert switch_v2.install_from_env() is False
    monkeypatch.setenv("SPECFLIP_SWITCH", "4:9")
    assert switch_v2.install_from_env() is False
    assert "specflip switch off: SPECFLIP_SWITCH='4:9': expected 't_off:t_on' with 0 <= t_on < t_off" in caplog.text
    assert switch_v2.runtime() is None


def test_guard_traces_go_through_the_guards_explainer(tmp_path):
    scheds, outs = recorded_runs()
    (tmp_path / "switch-9.jsonl").write_text(TRACE_OK.read_text())
    rep = judge(scheds, outs, None, str(tmp_path), "v2_switch_reserve_sync")
    assert rep["guard"]["available"] is False and rep["summary"]["ok"]
    guard_trace = tmp_path / "specflip-trace.rank0.jsonl"
    guard_trace.write_bytes(gzip.decompress(GUARD_TRACE.read_bytes()))  # a live guard trace (H200, overlap loop)
    rep = judge(scheds, outs, None, str(tmp_path), "v2_switch_reserve_sync")
    assert rep["guard"]["available"] and rep["guard"]["result"]["conforms"] and rep["summary"]["ok"]
    assert (rep["guard"]["unexplained"], rep["guard"]["violations"], rep["guard"]["ranks_agree"]) == (0, 0, True)
    guard_trace.write_text("{}\n")  # not a guard trace: the explainer rejects it, and the replay fails
    rep = judge(scheds, outs, None, str(tmp_path), "v2_switch_reserve_sync")
    assert rep["guard"]["error"].startswith("TraceFormatError") and not rep["summary"]["ok"]


def test_v2_switch_stays_off_where_the_v1_worker_runs() -> None:
    # seen on the H200: with SGLANG_ENABLE_SPEC_V2=0 on 0.5.12 both switches installed their scheduler
    # hooks (two AROUND hooks on prepare_for_decode) and the guard stopped a 1-slot leak at the first finish
    from shim.switch.v2 import v1_worker_selected

    assert v1_worker_selected("0.5.12", {"SGLANG_ENABLE_SPEC_V2": "0"})
    assert v1_worker_selected("0.5.11", {"SGLANG_ENABLE_SPEC_V2": "False"})
    assert not v1_worker_selected("0.5.12", {})  # 0.5.12 defaults to the v2 worker
    assert not v1_worker_selected("0.5.16", {"SGLANG_ENABLE_SPEC_V2": "0"})  # no v1 worker left there
