"""The v1 switch (shim/switch/v1.py) and the 0.5.12 guard adapter on REAL sglang 0.5.12 objects on CPU.

Runs under .venv12 (scripts/setup-v1.sh); skipped where the installed sglang is not 0.5.12. Harness and
stand-ins: tests/sglang12_cpu.py. The switch's hooks and the guard (assert mode) go through SGLang's own
HookRegistry / load_plugins(), once per process.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any
from unittest import mock

import attrs
import pytest

try:
    _RELEASE = version("sglang")
except PackageNotFoundError:
    _RELEASE = None
# marked sglang_v1: in the .venv12 run (SPECFLIP_REQUIRE_SGLANG_V1=1) a skip fails it (tests/real_objects_required.py)
pytestmark = [pytest.mark.sglang_v1,
              pytest.mark.skipif(_RELEASE != "0.5.12", reason="needs sglang 0.5.12 (.venv12: scripts/setup-v1.sh)")]

if _RELEASE == "0.5.12":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import sglang12_cpu as h

from shim.switch.v2 import SwitchConfig, SwitchConfigError  # noqa: E402
from statemodel.actions import ACTIONS_BY_NAME, Action, enabled, prefill_action, prefill_adder_picks  # noqa: E402
from statemodel.designs import SEEDS_FINAL  # noqa: E402
from statemodel.state import SpecMode, State, Thresholds  # noqa: E402

NUM_STEPS = 3


@pytest.fixture(scope="module")
def plugin() -> Any:
    """Stand-ins on the classes, the switch registered, then SGLang's load_plugins() with SPECFLIP_MODE=assert
    (the project's entry point installs the guard with the 0.5.12 adapter). Returns the GuardRuntime."""
    import os

    import sglang.srt.plugins as plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    import shim.guard.runtime
    import shim.switch.v1 as sw

    if shim.guard.runtime.current() is None:
        assert not plugins._plugins_loaded, "load_plugins() already ran in this process without specflip"
        h.install_gpu_stand_ins()
        sw.install_switch(HookRegistry, SwitchConfig(t_off=5, t_on=2, draft_while_off="sync"))
        with mock.patch.dict(os.environ, {"SPECFLIP_MODE": "assert"}):
            plugins.load_plugins()
    runtime = shim.guard.runtime.current()
    assert runtime is not None and runtime.adapter.release == "0.5.12"
    return runtime


@pytest.fixture(params=[False, True], ids=["radix_off", "radix_on"])
def server(plugin: Any, tmp_path: Path, request: Any) -> Any:
    """Fresh pools, a fresh Guard (tracing to tmp_path) and a V1Server; with the radix cache disabled and
    enabled (a live server's default: finished requests go into the tree, releases inside a free group)."""
    plugin.reset()
    plugin.paused = False
    plugin.trace_template = str(tmp_path / "guard.jsonl")
    sa = h.make_server_args(h.write_tiny_model_config(tmp_path / "model"), num_steps=NUM_STEPS)
    srv = h.V1Server(h.build_pools(sa, radix_cache=request.param), num_steps=NUM_STEPS)
    srv.worker.accept_lens_cpu_stand_in = [2, 1, 4, 3]
    yield srv
    plugin.reset()
    plugin.paused = False


def switch(t_off: int, t_on: int) -> Any:
    import shim.switch.v1 as sw

    rt = sw.set_runtime(SwitchConfig(t_off=t_off, t_on=t_on, draft_while_off="sync"))
    rt.recorded = []
    return rt


# --- the switch's policy and names are the model's --------------------------------------------------------------


def test_switch_functions_are_named_after_model_actions() -> None:
    import shim.switch.v1 as sw

    for name in sw.SWITCH_ACTIONS:
        assert name in ACTIONS_BY_NAME, name
        assert callable(getattr(sw, name)), name


def test_policy_decisions_come_from_the_model() -> None:
    """The v1 switch decides with statemodel.policy.decide_flip under seeds_final, the model's own rule."""
    import shim.switch.v1 as sw

    def wants(spec_on: bool, running: int, waiting: int, chunked: int, spec_cap: int = 48) -> str | None:
        config = SwitchConfig(t_off=5, t_on=2, spec_cap=spec_cap, draft_while_off="sync")
        return sw.SwitchPolicy(config, spec_on=spec_on, design_name=sw.DESIGN).wants(running, waiting, chunked)

    assert wants(True, 5, 0, 0) == "flip_off"
    assert wants(True, 4, 1, 0) == "flip_off"  # demand counts waiting requests
    assert wants(True, 4, 0, 0) is None
    assert wants(False, 2, 0, 0) == "flip_on"
    assert wants(False, 3, 0, 0) is None  # hysteresis: between t_on and t_off
    assert wants(False, 2, 0, 0, spec_cap=1) is None  # clamped to speculation's running cap
    assert wants(False, 1, 3, 0) is None  # speculation stays off while requests wait
    rt = sw.set_runtime(SwitchConfig(t_off=5, t_on=2, draft_while_off="sync"))
    assert rt is not None and rt.policy.design_name == sw.DESIGN
    assert [rt.policy.decide(n, 0) for n in (4, 5, 4, 3, 2, 2)] == [None, "flip_off", None, None, "flip_on", None]
    sw.set_runtime(None)


def test_v1_switch_refuses_a_design_it_does_not_implement() -> None:
    import shim.switch.v1 as sw

    with pytest.raises(SwitchConfigError, match="seeds_final"):
        sw.check_config(SwitchConfig(t_off=5, t_on=2, draft_while_off="none"))


# --- a replay across the threshold on real objects --------------------------------------------------------------


def _guard_steps(trace: Path) -> list[tuple[State, Action]]:
    """(state before, action) for every step the guard recorded, rebuilt from its trace as `specflip explain`
    rebuilds them."""
    from shim.guard.explain import _with_arrivals
    from shim.guard.trace import apply_delta, compact_state, read_records, state_from_json

    steps = []
    state: State | None = None
    for _, record in read_records(trace):
        if record["kind"] == "header":
            state = state_from_json(record["state"])
        elif record["kind"] == "compact":
            state = compact_state(state, [int(i) for i in record["keep"]])
        elif record["kind"] == "step":
            state = _with_arrivals(state, record["delta"])
            steps.append((state, Action(record["action"], tuple(int(a) for a in record["args"]))))
            state = apply_delta(state, record["delta"])
        else:
            state = apply_delta(state, record["delta"])
    return steps


def _replay_across_threshold(srv: Any, rounds: int = 2) -> None:
    """Concurrency 1, then 6 (above t_off 5), falling back below t_on 2 as requests finish; `rounds` times."""
    for r in range(rounds):
        # a request done at its prefill (SGLang's health check: one new token): released at the prefill result
        # and filtered out of the prefilled batch before any merge
        srv.admit([h.make_req(f"r{r}hc", [1, 2, 3], max_new_tokens=1)])
        # two prompts with a common prefix in one prefill while nothing runs (the batch becomes the running
        # batch without a merge_batch call), then the next prefill: with the radix cache on, the second
        # prompt's copy of the prefix is freed as a duplicate when the tree takes the prompts, between the two
        # prefills (on the H200: "kv_conservation broken by prefill ... 7 slots freed twice")
        srv.admit([h.make_req(f"r{r}s{i}", [*range(50, 58), 60 + i], max_new_tokens=5) for i in range(2)])
        srv.admit(h.make_reqs(f"r{r}a", 1, max_new_tokens=9))
        for _ in range(2):
            srv.step()
        srv.admit(h.make_reqs(f"r{r}b", 5, max_new_tokens=7 + 3 * r))
        srv.admit([h.make_req(f"r{r}long", [3, 4, 5], max_new_tokens=40)])
        srv.run_until_done()


def test_replay_across_threshold_is_exact_guard_clean_and_a_model_path(server: Any, plugin: Any,
                                                                       tmp_path: Path) -> None:
    import shim.switch.v1 as sw

    rt = switch(5, 2)
    _replay_across_threshold(server)
    outputs = {req.rid: req.output_ids for req in server.finished}
    assert len(outputs) == 20
    assert all(req.output_ids == h.expected_output(req) for req in server.finished)  # greedy, exact
    tree = server.pools.tree_cache  # with the radix cache on, finished requests' slots stay in the tree
    held_by_tree = tree.evictable_size() + tree.protected_size()
    assert server.pools.allocator.available_size() + held_by_tree == server.pools.allocator.size  # all came back
    assert rt.counters.get("flip_off") == 2 and rt.counters.get("flip_on") == 2, rt.counters
    assert rt.counters["plain_decode"] == rt.counters["draft_sync"] > 0

    plugin.guard.close()
    steps = _guard_steps(tmp_path / "guard.jsonl")
    design = attrs.evolve(SEEDS_FINAL, num_steps=NUM_STEPS)
    scope = plugin.guard.config.scope
    # every step the live objects took is one the model's seeds_final allows, policy included
    size = server.pools.allocator.size
    for before, action in steps:
        state = attrs.evolve(before, thresholds=Thresholds(5, 2))
        if state.kv_pool_size == 0:  # the guard learns the pool at its first observation (the first prefill)
            state = attrs.evolve(state, kv_free=size, kv_pool_size=size)
        allowed = enabled(state, design, scope)
        if action.name == "prefill":
            # the guard's prefill names what SGLang's PrefillAdder picked: the model's PrefillAdder picks the same
            assert action == prefill_action(prefill_adder_picks(state, scope)), action
            action = Action("prefill")  # the checker's form of it
        assert action in allowed, (action, [a.describe() for a in allowed])
    # one-to-one: the switch's functions ran exactly where the model's path has their actions
    expected = [a.name for before, a in steps
                if a.name in ("flip_off", "flip_on", "plain_decode", "draft_sync")
                or (a.name == "prepare_for_decode" and before.spec_mode is SpecMode.OFF)]
    assert rt.recorded == expected
    assert set(sw.SWITCH_ACTIONS) <= set(rt.recorded)
    names = {a.name for _, a in steps}
    assert {"draft", "verify", "draft_extend", "finish", "filter_batch", "merge_batch"} <= names


def test_always_on_and_always_off_give_the_same_outputs(server: Any) -> None:
    import shim.switch.v1 as sw

    sw.set_runtime(None)  # speculation always on: the hooks pass through
    server.admit(h.make_reqs("on", 3, max_new_tokens=11))
    server.run_until_done()
    rt = switch(1, 0)  # speculation off from the first decode step on
    server.admit(h.make_reqs("off", 3, max_new_tokens=11))
    server.run_until_done()
    assert rt.counters["plain_decode"] >= 10 and "flip_on" not in rt.counters
    assert all(req.output_ids == h.expected_output(req) for req in server.finished)
    on = {r.rid[2:]: r.output_ids for r in server.finished if r.rid.startswith("on")}
    off = {r.rid[3:]: r.output_ids for r in server.finished if r.rid.startswith("off")}
    assert on == off and len(on) == 3


# --- the seeds' two crashes, as test-only patches --------------------------------------------------------------


def _seeds_attempt1_worker_copy(batch: Any) -> Any:
    """The seeds' attempt 1: the worker batch of the plain step keeps the draft input and spec_algorithm."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    mwb = batch.get_model_worker_batch()
    mwb.capture_hidden_mode = CaptureHiddenMode.FULL
    return mwb


def _seeds_attempt2_prepare(rt: Any, orig: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    """The seeds' attempt 2: v1's prepare_for_decode (early return), then the plugin's own slots,
    `out_cache_loc, _ = alloc_token_slots(...)`: a tensor unpacked as if it were (slots, state)."""
    import torch
    from sglang.srt.mem_cache.common import alloc_token_slots

    rt.record("prepare_for_decode")
    result = orig(batch, *args, **kwargs)
    out_cache_loc, _ = alloc_token_slots(batch.tree_cache, len(batch.reqs))
    batch.out_cache_loc = out_cache_loc
    batch.input_ids = batch.spec_info.bonus_tokens.to(torch.int64)
    for req in batch.reqs:
        req.kv_committed_len += 1
        req.kv_allocated_len += 1
    batch.seq_lens.add_(1)
    batch.seq_lens_cpu.add_(1)
    batch.seq_lens_sum += len(batch.reqs)
    return result


def _flip_off_with_two_running(server: Any) -> None:
    switch(2, 1)
    server.admit(h.make_reqs("s", 2, max_new_tokens=20))
    server.step()  # the flip happens here, then the plain step


@pytest.mark.parametrize("attempt, invariant, crash", [
    ("attempt1", "spec_info_matches_mode", "must match"),
    ("attempt2", "shapes_agree", "must match"),
])
def test_seeds_crashes_are_stopped_before_the_forward(server: Any, plugin: Any, monkeypatch: Any, attempt: str,
                                                      invariant: str, crash: str) -> None:
    import shim.switch.v1 as sw
    from shim.guard.core import SpecFlipViolation

    if attempt == "attempt1":
        monkeypatch.setattr(sw, "worker_copy_for_plain_step", _seeds_attempt1_worker_copy)
    else:
        monkeypatch.setattr(sw, "prepare_for_decode", _seeds_attempt2_prepare)
    forwards = h.STAND_IN_CALLS.get("target_forward", 0)
    with pytest.raises(SpecFlipViolation) as caught:
        _flip_off_with_two_running(server)
    assert caught.value.invariant == invariant and caught.value.action == "plain_decode"
    assert h.STAND_IN_CALLS.get("target_forward", 0) == forwards  # stopped before the (stand-in) forward
    assert "flip_off" in str(caught.value)


@pytest.mark.parametrize("attempt", ["attempt1", "attempt2"])
def test_without_the_guard_the_seeds_attempts_crash_in_the_forward(server: Any, plugin: Any, monkeypatch: Any,
                                                                   attempt: str) -> None:
    import shim.switch.v1 as sw

    if attempt == "attempt1":
        monkeypatch.setattr(sw, "worker_copy_for_plain_step", _seeds_attempt1_worker_copy)
    else:
        monkeypatch.setattr(sw, "prepare_for_decode", _seeds_attempt2_prepare)
    plugin.paused = True
    with pytest.raises(RuntimeError, match="must match"):
        _flip_off_with_two_running(server)


def test_the_guard_catches_a_plain_step_without_draft_sync(server: Any, plugin: Any, monkeypatch: Any) -> None:
    """Leaving the draft behind after a plain step breaks the model's path: seeds_final syncs every step."""
    import shim.switch.v1 as sw
    from shim.guard.core import SpecFlipViolation

    monkeypatch.setattr(sw, "draft_sync", lambda rt, worker, batch, result, tokens: None)
    with pytest.raises(SpecFlipViolation) as caught:
        _flip_off_with_two_running(server)
        server.step()
    assert caught.value.invariant == "legal_transition"
