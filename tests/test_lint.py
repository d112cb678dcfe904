"""`specflip lint` on CPU with the real ServerArgs of the installed SGLang (0.5.23): configurations known to fit
pass, a configuration built to break each rule fails with that rule's (model invariant) name."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from shim.releases import release_line
from shim.releases.server_args import LintInputError, SGLangRefused
from shim.releases.v0_5_23 import tokens_per_req
from specflip.lint.rules import (
    DRAFT_KV,
    KV_RESERVE,
    LATER,
    RULE_NAMES,
    RUNNING_CAP,
    SGLANG_REFUSES,
    SHAPES,
    STARTUP,
    SpecflipPolicy,
    check,
    predicted_outcome,
)
from statemodel.invariants import INVARIANT_NAMES

# each release line's lint reading (shim/releases/): the installed 0.5.23 on real objects, the others from values
sglang_23, lint_0_5_16, lint_0_5_12 = release_line("0.5.23"), release_line("0.5.16"), release_line("0.5.12")
try:
    import importlib.metadata as _md

    _RELEASE = _md.version("sglang")
except Exception:  # pragma: no cover
    _RELEASE = None
needs_sglang = pytest.mark.skipif(_RELEASE != "0.5.23", reason="needs sglang 0.5.23 (scripts/setup.sh)")

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps(TINY))
    return str(d)


def sizing(model_dir, *flags, policy=None):
    sa = sglang_23.build_server_args(["--model-path", model_dir, "--speculative-draft-model-path", model_dir,
                                      "--device", "cuda", *flags])
    return sglang_23.read_sizing(sa, policy)


def rules(findings):
    return {f.rule for f in findings}


def test_rule_names_are_model_invariants_except_the_one_lint_only_rule():
    assert set(RULE_NAMES) - set(INVARIANT_NAMES) == {SGLANG_REFUSES}


# ---- fitting configurations ------------------------------------------------------------------------------

@needs_sglang
def test_static_eagle_fits(model_dir):
    s = sizing(model_dir, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
               "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
    assert s.max_running_requests == 48  # SGLang's speculative default
    assert [(st.steps, st.draft_tokens) for st in s.states] == [(3, 4)]
    assert check(s) == []


@needs_sglang
def test_default_adaptive_tiers_0_5_23_fit(model_dir):
    s = sizing(model_dir, "--speculative-algorithm", "EAGLE", "--speculative-adaptive")
    assert s.tiers == ((1, (1, 3, 5, 7)), (8, (0, 1, 3)), (32, (0, 1)), (64, (0,)))
    assert s.launch_steps == 3
    assert {st.steps: st.alloc_len for st in s.states} == {0: 8, 1: 8, 3: 8, 5: 8, 7: 8}  # largest state
    assert s.logits_rows >= max(max(st.graph_bs) * st.verify_width for st in s.states if st.graph_bs)
    assert check(s) == []


@needs_sglang
def test_specflip_policy_within_cap_fits(model_dir):
    policy = SpecflipPolicy(t_off=64, t_on=32, spec_cap=48)
    s = sizing(model_dir, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
               "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
               "--max-running-requests", "128", policy=policy)
    assert check(s) == []


# ---- one configuration per rule that breaks it -------------------------------------------------------------

@needs_sglang
def test_sglang_refuses_adaptive_with_topk_2(model_dir):
    s = sizing(model_dir, "--speculative-algorithm", "EAGLE", "--speculative-adaptive", "--speculative-num-steps",
               "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6")
    assert not s.adaptive
    found = check(s)
    assert rules(found) == {SGLANG_REFUSES} and "topk" in found[0].message


@needs_sglang
def test_sglang_refuses_steps_outside_the_candidates(model_dir):
    with pytest.raises(SGLangRefused, match="candidate_steps"):
        sizing(model_dir, "--speculative-algorithm", "EAGLE", "--speculative-adaptive", "--speculative-num-steps", "4")


@needs_sglang
def test_skipped_zero_step_draft_extend_breaks_draft_kv(model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND", "1")
    s = sizing(model_dir, "--speculative-algorithm", "EAGLE", "--speculative-adaptive")
    found = check(s)
    assert rules(found) == {DRAFT_KV}
    assert found[0].state == "steps=0 -> steps=1"


@needs_sglang
def test_specflip_without_draft_work_breaks_draft_kv(model_dir):
    s = sizing(model_dir, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
               "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--max-running-requests", "128",
               policy=SpecflipPolicy(t_off=64, t_on=32, draft_while_off="none"))
    assert rules(check(s)) == {DRAFT_KV}


@needs_sglang
def test_reenable_above_spec_cap_breaks_running_within_cap(model_dir):
    s = sizing(model_dir, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
               "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--max-running-requests", "128",
               policy=SpecflipPolicy(t_off=100, t_on=60, spec_cap=48))
    found = check(s)
    assert rules(found) == {RUNNING_CAP}
    assert found[0].needed == "60 running requests" and found[0].sized == "speculation holds 48"


@needs_sglang
def test_spec_cap_above_launch_cap_breaks_running_within_cap(model_dir):
    s = sizing(model_dir, "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
               "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
               policy=SpecflipPolicy(t_off=40, t_on=8, spec_cap=64))  # launch cap: SGLang's 48
    assert rules(check(s)) == {RUNNING_CAP}


@needs_sglang
def test_kv_reserve_by_current_state_breaks_kv_reserve(model_dir):
    """0.5.23 sizes the reserve by the largest state (passes above); the same ServerArgs with a reserve sized
    by the state current at prepare time (SGLang before PR #24055) fails."""
    s = sizing(model_dir, "--speculative-algorithm", "EAGLE", "--speculative-adaptive")
    current = attrs.evolve(s, states=tuple(attrs.evolve(st, alloc_len=max(st.steps, st.draft_tokens))
                                           for st in s.states))
    found = check(current)
    assert rules(found) == {KV_RESERVE}
    assert {f.state.split(" ")[0] for f in found} >= {"steps=7"}


@needs_sglang
def test_small_cap_default_tiers_fit_on_0_5_23(model_dir):
    s = sizing(model_dir, "--speculative-algorithm", "EAGLE", "--speculative-adaptive", "--max-running-requests", "4")
    assert check(s) == []  # 0.5.23 sizes the logits buffer for every tier


def test_0_5_16_default_tiers_at_launch_3_die_at_startup():
    """The start-up death seen on the H200 that lint had called fit: 0.5.16 captures every adaptive candidate at the
    whole capture list (its tier pruning never reaches the capture) into a logits buffer sized for the launch
    width, so steps 7 (8 tokens) at 48 requests needs 384 rows of 192; SGLang asserts during capture."""
    found = check(lint_0_5_16.sizing_from_values(adaptive=True, max_running_requests=48))
    assert rules(found) == {SHAPES}
    assert found[0].needed.startswith("384 logits rows") and found[0].sized == "192 rows"
    assert found[0].effect == STARTUP and predicted_outcome(found) == "dies-at-startup"
    assert "dies at start-up" in found[0].describe()
    # the same at a cap of 4, and for a candidate only a tier above the cap offers: it is built all the same
    small = check(lint_0_5_16.sizing_from_values(adaptive=True, max_running_requests=4))
    assert small[0].needed.startswith("32 logits rows") and small[0].sized == "16 rows"
    unreachable = lint_0_5_16.sizing_from_values(adaptive=True, steps=3, tiers=((1, (1, 3)), (8, (0, 7))),
                                                 max_running_requests=4)
    assert predicted_outcome(check(unreachable)) == "dies-at-startup"


def test_0_5_16_adaptive_fits_at_the_widest_launch_or_without_graphs():
    """What the H200 served: default tiers launched at steps 7 / 8 draft tokens; candidates all <= 3 at launch 3
    (adaptive_le3.json); and any tiers with CUDA graphs off."""
    assert check(lint_0_5_16.sizing_from_values(adaptive=True, steps=7, draft_tokens=8)) == []
    le3 = ((1, (1, 3)), (8, (0, 1, 3)), (32, (0, 1)))
    assert check(lint_0_5_16.sizing_from_values(adaptive=True, steps=3, tiers=le3)) == []
    assert check(lint_0_5_16.sizing_from_values(adaptive=True, capture_bs=[])) == []


def test_effects_decide_the_prediction_for_one_request():
    assert predicted_outcome([]) == "serves"
    later = check(lint_0_5_16.sizing_from_values(steps=3, draft_tokens=4, max_running_requests=16,
                                                 specflip=SpecflipPolicy(t_off=8, t_on=4, spec_cap=48)))
    assert rules(later) == {RUNNING_CAP} and predicted_outcome(later) == "serves"
    assert all(f.effect == LATER for f in later) and "serves; the fault comes later" in later[0].describe()
    both = later + check(lint_0_5_16.sizing_from_values(adaptive=True))
    assert predicted_outcome(both) == "dies-at-startup"


# ---- 0.5.12 (the v1 line) from resolved values; tests/test_lint_v1.py runs its CLI on real 0.5.12 --------------

def test_0_5_12_default_candidates_fit_each_runner_sized_for_its_state():
    s = lint_0_5_12.sizing_from_values(steps=3, draft_tokens=4, adaptive=True, cuda_graph_bs=[1, 2, 4, 8, 16, 64])
    assert [st.steps for st in s.states] == [1, 3, 7] and s.tiers == ((1, (1, 3, 7)),)
    assert s.states[0].graph_bs == (1, 2, 4, 8, 16, 48)  # clamped to the request pool, the pool size added
    assert check(s) == []


def test_0_5_12_v1_reserves_for_the_state_that_runs():
    """The v1 worker switches after a forward, so each prepare reserves for the state that then runs; the same
    sizing with the switch inside the forward (the v2 worker) has steps 7 write past a steps-1 reserve."""
    s = lint_0_5_12.sizing_from_values(steps=3, draft_tokens=4, adaptive=True, cuda_graph_bs=[1, 2, 4])
    assert not s.switch_after_reserve and check(s) == []
    found = check(attrs.evolve(s, switch_after_reserve=True))
    assert rules(found) == {KV_RESERVE} and {f.effect for f in found} == {LATER}


def test_0_5_12_single_candidate_dies_at_startup_and_tier_keys_are_ignored():
    single = check(lint_0_5_12.sizing_from_values(steps=3, draft_tokens=4, adaptive=True,
                                                  adaptive_config={"candidate_steps": [3]}))
    assert rules(single) == {SGLANG_REFUSES} and predicted_outcome(single) == "dies-at-startup"
    tiered = lint_0_5_12.sizing_from_values(steps=3, draft_tokens=4, adaptive=True,
                                            adaptive_config={"1": {"candidate_steps": [1, 3]}})
    found = check(tiered)
    assert rules(found) == {SGLANG_REFUSES} and predicted_outcome(found) == "serves"
    assert "ignores the tier keys ['1']" in found[0].message and [st.steps for st in tiered.states] == [1, 3, 7]
    for bad in ([1, 2], {"candidate_steps": "1,3"}, {"candidate_steps": [1, -1]}):
        with pytest.raises(LintInputError):
            lint_0_5_12.sizing_from_values(steps=3, draft_tokens=4, adaptive=True, adaptive_config=bad)


def test_0_5_12_a_steps_0_candidate_dies_at_startup():
    # the H200's 0.5.12 server with candidate_steps [0, 3] died building its draft backend (lint_matrix_0512,
    # adaptive_0_3); 0.5.16 builds steps 0 (its lint says serves: lint_matrix_0516, adaptive_0_1_launch1)
    zero = check(lint_0_5_12.sizing_from_values(steps=3, draft_tokens=4, adaptive=True,
                                                adaptive_config={"candidate_steps": [0, 3]}))
    assert rules(zero) == {SGLANG_REFUSES} and predicted_outcome(zero) == "dies-at-startup"
    assert "steps 0" in zero[0].message
    ok = check(lint_0_5_12.sizing_from_values(steps=3, draft_tokens=4, adaptive=True,
                                              adaptive_config={"candidate_steps": [1, 3]}))
    assert predicted_outcome(ok) == "serves"


# ---- the guard's entry point and the command line --------------------------------------------------------

@needs_sglang
def test_lint_server_args_leaves_the_published_spec_bag_alone(model_dir):
    from sglang.srt import runtime_context

    from specflip.lint.run import lint_server_args

    sa = sglang_23.build_server_args(["--model-path", model_dir, "--speculative-draft-model-path", model_dir,
                                      "--device", "cuda", "--speculative-algorithm",
                                      "EAGLE", "--speculative-adaptive"])
    runtime_context.publish(sa, role="scheduler")
    spec = runtime_context.get_spec()
    before = (spec.speculative_num_steps, spec.speculative_num_draft_tokens)
    assert lint_server_args(sa) == []
    assert (spec.speculative_num_steps, spec.speculative_num_draft_tokens) == before


@needs_sglang
def test_tokens_per_req_is_sglangs_resolve_num_tokens_per_req(model_dir):
    """The adapter reads the graph widths from what SGLang's `resolve_num_tokens_per_req` reads, without importing
    its module (seconds of a cold lint): in every state of a static, an adaptive and a tree launch the two agree,
    for EAGLE and for DFLASH-style hooks alike (the algorithm's own target-verify hook)."""
    from shim.releases.server_args import ensure_torchvision_importable

    ensure_torchvision_importable()  # spec_utils imports SGLang's configs, which import torchvision
    from sglang.srt import runtime_context
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_utils import resolve_num_tokens_per_req

    checked = 0
    for flags in (["--speculative-adaptive"], ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                                               "--speculative-num-draft-tokens", "8"]):
        sa = sglang_23.build_server_args(["--model-path", model_dir, "--speculative-draft-model-path", model_dir,
                                          "--device", "cuda", "--speculative-algorithm", "EAGLE", *flags])
        runtime_context.publish(sa, role="scheduler")
        ctx = runtime_context.get_context()
        for algo in SpeculativeAlgorithm:
            if algo.is_none():
                continue
            for draft in (1, 2, 4, 8):
                ctx.override("test", speculative_num_draft_tokens=draft)
                for phase in ("target_verify", "draft_extend"):
                    want = resolve_num_tokens_per_req(phase=phase, spec_algorithm=algo,
                                                      num_draft_tokens=draft if phase == "target_verify" else None)
                    assert tokens_per_req(phase, algo, draft) == want, (algo, draft, phase)
                    checked += 1
    assert checked >= 2 * 2 * 4 * 2


@needs_sglang
def test_cli_exit_codes_and_json(model_dir, capsys, monkeypatch, tmp_path):
    from specflip.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    base = ["lint", "--model-path", model_dir, "--speculative-draft-model-path", model_dir,
            "--speculative-algorithm", "EAGLE"]
    assert main([*base, "--speculative-adaptive"]) == 0
    assert capsys.readouterr().out.startswith("ok: sglang 0.5.23")
    assert main([*base, "--speculative-adaptive"]) == 0  # from the cache
    assert capsys.readouterr().out.startswith("ok: sglang 0.5.23")
    assert main([*base, "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", "4", "--max-running-requests", "128",
                 "--specflip-t-off", "100", "--specflip-t-on", "60", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert [f["rule"] for f in out["findings"]] == [RUNNING_CAP]
    assert main([*base, "--no-such-flag"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specflip lint:") and "--no-such-flag" in err and len(err.splitlines()) == 1
    assert main([*base, "--speculative-adaptive", "--speculative-adaptive-config", str(tmp_path / "missing.json")]) == 2
    assert "cannot read the adaptive config" in capsys.readouterr().err
    assert main([*base, "--specflip-t-off", "4", "--specflip-t-on", "8"]) == 2
    assert "t_on < t_off" in capsys.readouterr().err
    assert gc.isenabled()  # only the `specflip` script, which owns its process, turns the collector off


@needs_sglang
def test_script_exit_code_and_whole_output_survive_the_fast_exit(model_dir, tmp_path):
    """The `specflip` script leaves without interpreter teardown (os._exit): its exit code and all of its
    output must still arrive, cold (SGLang imported) and from the cache."""
    # `python -m specflip.cli` runs `main()` as the `specflip` script does (owning its process), on this checkout's
    # code (the script in the venv imports the tree it was installed from)
    script = [sys.executable, "-m", "specflip.cli"]
    # block-buffered stdout, as in a plain shell: output an os._exit would drop unless lint flushes it
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "XDG_CACHE_HOME": str(tmp_path),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    args = [*script, "lint", "--json", "--model-path", model_dir, "--speculative-algorithm", "EAGLE",
            "--speculative-draft-model-path", model_dir,
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
            "--max-running-requests", "128", "--specflip-t-off", "100", "--specflip-t-on", "60"]
    runs = [subprocess.run(args, env=env, capture_output=True, text=True, timeout=300) for _ in ("cold", "cached")]
    assert list(tmp_path.glob("specflip/lint/*.json"))  # the cold run wrote its cache entry before exiting
    for run in runs:
        assert run.returncode == 1, run.stderr
        out = json.loads(run.stdout)
        assert [f["rule"] for f in out["findings"]] == [RUNNING_CAP] and out["sizing"]["release"] == "0.5.23"
    assert runs[0].stdout == runs[1].stdout
    # the script's own process makes torch.compile a no-op (TORCHDYNAMO_DISABLE) while SGLang imports: what it
    # resolved and sized is what this process (torch.compile as it is) resolves and sizes
    from specflip.lint.run import lint_argv, specflip_policy, split_args

    own, rest = split_args(args[5:])
    in_process, _ = lint_argv(rest, specflip_policy(own), use_cache=False)
    assert "TORCHDYNAMO_DISABLE" not in os.environ
    assert json.loads(runs[0].stdout)["sizing"] == json.loads(json.dumps(in_process.to_json()))
    usage = subprocess.run([*args[:4], "--specflip-t-off", "4", "--specflip-t-on", "8", *args[5:9]], env=env,
                           capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and usage.stderr.startswith("specflip lint:") and usage.stdout == ""


def test_unsupported_release_is_a_usage_error(monkeypatch):
    import specflip.lint.run as lint

    monkeypatch.setattr(lint.importlib.metadata, "version", lambda name: "0.4.0")
    with pytest.raises(lint.LintUsageError, match="not a supported release"):
        lint.installed_release()
