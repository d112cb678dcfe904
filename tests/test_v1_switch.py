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
from statemodel.actions import (  # noqa: E402
    ACTIONS_BY_NAME,
    Action,
    apply,
    enabled,
    prefill_action,
    prefill_adder_picks,
    single_steps,
)
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
        h.install_scheduler_loop_stand_in()
        sw.install_switch(HookRegistry, SwitchConfig(t_off=5, t_on=2, draft_while_off="sync"))
        # draft mode retract's hooks too (each hook passes through under the other mode's runtime)
        from sglang.srt.plugins.hook_registry import HookType

        HookRegistry.register(sw.T_NEXT_BATCH, sw._next_batch_around, HookType.AROUND)
        HookRegistry.register(sw.T_RUN_BATCH, sw._run_batch_around, HookType.AROUND)
        HookRegistry.register(sw.T_STREAM, sw._stream_output_around, HookType.AROUND)
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
    from shim.guard.trace import apply_delta, compact_state, state_from_json
    from specflip.explain import _with_arrivals
    from specflip.trace_reader import read_records

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
        if action.name == "prefill":
            # the guard's prefill names what SGLang's PrefillAdder picked: the model's PrefillAdder picks the same
            assert action == prefill_action(prefill_adder_picks(state, scope)), action
            action = Action("prefill")  # the checker's form of it
        for single in single_steps(action):  # a wave's arrivals (or finishes) in one guard step: each in turn
            allowed = enabled(state, design, scope)
            assert single in allowed, (single, [a.describe() for a in allowed])
            state = apply(state, single, design, scope)
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


def test_a_flip_off_clears_the_full_mark_admission_set_at_the_speculative_cap(server: Any) -> None:
    """Admission held at speculation's cap marks the running batch full; SGLang clears the mark only when the batch
    shrinks. A flip-off raises the cap, so it clears the mark too (as v2's does): else the waiting requests wait for
    a running one to finish."""
    switch(2, 1)
    server.admit(h.make_reqs("s", 2, max_new_tokens=20))
    server.running.batch_is_full = True  # what get_new_batch_prefill set when the cap stopped admission
    server.step()  # the flip-off happens here (2 running >= t_off 2), then the plain step; nothing finished
    assert len(server.running.reqs) == 2
    assert server.running.batch_is_full is False


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


# --- draft mode retract (design v1_plain_off_retract_catch_up, issue 22): SGLang's plain path while off ----------


@pytest.fixture(params=[False, True], ids=["radix_off", "radix_on"])
def loop(plugin: Any, tmp_path: Path, request: Any) -> Any:
    """A fresh V1LoopServer (the non-overlap scheduler loop on a real Scheduler object) and a fresh Guard whose
    reference is the retract design (what install_switch announces in that mode)."""
    import shim.switch.v1 as sw

    yield from _guarded(plugin, tmp_path, request.param, h.V1LoopServer, sw.RETRACT_DESIGN)


def _guarded(plugin: Any, tmp_path: Path, radix: bool, server: Any, design: str | None,
             chunk_cache: bool = False) -> Any:
    """A fresh `server` on fresh pools and a fresh Guard (assert mode, tracing to tmp_path) whose reference is `design`
    (what install_switch announces; None: the guard paused); afterwards the design the module's plugin fixture
    installed. `chunk_cache`: with the radix cache off, SGLang's ChunkCache (a server with chunked prefill)."""
    import shim.switch.v1 as sw
    from shim.guard import api as guard_api

    guard_api.announce_switch(design or sw.DESIGN, 48)
    plugin.reset()
    plugin.paused = design is None
    plugin.trace_template = str(tmp_path / "guard.jsonl")
    sa = h.make_server_args(h.write_tiny_model_config(tmp_path / "model"), num_steps=NUM_STEPS)
    srv = server(h.build_pools(sa, radix_cache=radix, chunk_cache=chunk_cache), num_steps=NUM_STEPS)
    srv.worker.accept_lens_cpu_stand_in = [2, 1, 4, 3]
    yield srv
    guard_api.announce_switch(sw.DESIGN, 48)
    plugin.reset()
    plugin.paused = False


def retract_switch(t_off: int, t_on: int, trace: Path | None = None, radix: str = "insert",
                   v1_loop: str = "normal") -> Any:
    import shim.switch.v1 as sw

    rt = sw.set_runtime(SwitchConfig(t_off=t_off, t_on=t_on, draft_while_off="retract",
                                     trace_dir=None if trace is None else str(trace), radix=radix, v1_loop=v1_loop))
    rt.recorded = []
    rt.plain_runner = h.CudaGraphRunnerCpuStandIn(num_tokens_per_bs=1)  # what capture_plain_decode_runner makes
    return rt


def _waves(srv: Any, rounds: int = 2) -> None:
    """A long request alone (speculating), then 5 more (demand 6: flip off), they finish (demand 1: flip on,
    the long one retracted and prefilled again with the draft); round 2 with prompts sharing a prefix."""
    for r in range(rounds):
        srv.add([h.make_req(f"r{r}long", [3, 4, 5, r], max_new_tokens=30)])
        for _ in range(3):
            srv.iteration()
        srv.add([h.make_req(f"r{r}s{i}", [*range(50, 58), 60 + i], max_new_tokens=5 + i) for i in range(5)])
        srv.run_until_idle()


def test_retract_mode_is_exact_kv_clean_guard_clean_and_a_model_path(loop: Any, plugin: Any, tmp_path: Path) -> None:
    import shim.switch.v1 as sw
    from statemodel.designs import get_design

    rt = retract_switch(5, 2)
    drafts, extends = h.STAND_IN_CALLS.get("draft", 0), h.STAND_IN_CALLS.get("draft_extend", 0)
    _waves(loop)
    assert len(loop.finished) == 12
    assert all(req.output_ids == h.expected_output(req) for req in loop.finished)  # greedy, exact
    tree = loop.pools.tree_cache
    held_by_tree = tree.evictable_size() + tree.protected_size()
    assert loop.pools.allocator.available_size() + held_by_tree == loop.pools.allocator.size  # all came back
    assert rt.counters.get("flip_off") == 2 and rt.counters.get("flip_on") == 2, rt.counters
    assert [r.retraction_count for r in loop.finished if "long" in r.rid] == [1, 1]  # the catch-up, once each
    assert "plain" in loop.kinds and "spec" in loop.kinds
    # no draft work while off: a draft (and at most one draft-extend) per speculative step, none per plain step
    assert h.STAND_IN_CALLS.get("draft", 0) - drafts == loop.kinds.count("spec")
    assert 0 < h.STAND_IN_CALLS.get("draft_extend", 0) - extends <= loop.kinds.count("spec")

    plugin.guard.close()
    steps = _guard_steps(tmp_path / "guard.jsonl")
    design = attrs.evolve(get_design(sw.RETRACT_DESIGN), num_steps=NUM_STEPS)
    assert plugin.guard.config.design.name == sw.RETRACT_DESIGN
    scope = plugin.guard.config.scope
    size = loop.pools.allocator.size
    # every step the live objects took is one the model allows. This switch flips at the top of the iteration, on a
    # waiting queue the guard does not see (it learns of a request at its prefill), so a flip is checked where the
    # model puts it (the stage, a prefilled batch merged, no finished request in the batch) with thresholds that make
    # the demand due; the decisions themselves are the model's rule on the scheduler's counts (the policy test)
    # The guard sees the flip-on's retraction request by request (release_kv_cache), then the flip: the model's
    # flip_on is the whole of it, so it is checked from the state before the first of those retractions.
    due = {"flip_off": Thresholds(1, 0), "flip_on": Thresholds(10**6, 10**6 - 1)}
    names = [a.name for _, a in steps]
    group_start: State | None = None
    for i, (before, action) in enumerate(steps):
        after_retracts = next((n for n in names[i:] if n != "retract"), None)
        if action.name == "retract" and after_retracts == "flip_on":
            group_start = group_start or before
            continue
        if action.name == "flip_on" and group_start is not None:
            before, group_start = group_start, None
        state = attrs.evolve(before, thresholds=due[action.name]) if action.name in due else before
        if state.kv_pool_size == 0:
            state = attrs.evolve(state, kv_free=size, kv_pool_size=size)
        if action.name == "prefill":
            action = Action("prefill")  # the checker's form (the harness's admission is the model's PrefillAdder's)
        for single in single_steps(action):  # a wave's arrivals (or finishes) in one guard step: each in turn
            allowed = enabled(state, design, scope)
            assert single in allowed, (single, [a.describe() for a in allowed])
            state = apply(state, single, design, scope)
    assert rt.recorded == [a.name for _, a in steps if a.name in ("flip_off", "flip_on")]
    assert {"retract", "flip_off", "flip_on", "plain_decode", "verify", "draft_extend"} <= {a.name for _, a in steps}


def test_retract_mode_keeps_tokens_computed_without_the_draft_out_of_the_tree(loop: Any) -> None:
    """Issue 24 on the v1 line (design v1_plain_off_retract_catch_up_radix): every request run while off is marked
    skip_radix_cache_insert; the flip-on retraction gives the long request its own flag back. Opt-in
    (SPECFLIP_SWITCH_RADIX=keep_out): on 0.5.16 the same flag leaked KV slots under decode retraction
    (docs/prefix-cache.md); by default nothing is marked."""
    default = retract_switch(5, 2)
    assert default.config.radix == "insert"
    rt = retract_switch(5, 2, radix="keep_out")
    loop.add([h.make_req("long", [3, 4, 5], max_new_tokens=30)])
    for _ in range(3):
        loop.iteration()
    loop.add(h.make_reqs("s", 5, max_new_tokens=4))
    marked = {}
    for _ in range(200):
        loop.iteration()
        for req in loop.scheduler.running_batch.reqs:
            marked.setdefault(req.rid, []).append(bool(req.skip_radix_cache_insert))
        if rt.counters.get("flip_on"):
            break
    assert rt.counters.get("flip_off") == 1 and rt.counters.get("flip_on") == 1
    assert all(all(v) for rid, v in marked.items() if rid.startswith("s"))  # prefilled and decoded while off
    prefill = loop.scheduler.last_batch  # the flip-on's iteration: the retracted request prefilled with the draft
    assert prefill.forward_mode.is_extend() and not prefill.spec_algorithm.is_none()
    long = next(r for r in prefill.reqs if r.rid == "long")
    assert long.skip_radix_cache_insert is False and long.retraction_count == 1
    loop.run_until_idle()
    assert all(req.output_ids == h.expected_output(req) for req in loop.finished)


@pytest.mark.parametrize(("draft", "hidden", "recaptures"), [("retract", "NULL", 0), ("sync", "FULL", 1)])
def test_the_plain_runner_is_captured_in_the_mode_its_batches_ask_for(monkeypatch: Any, draft: str, hidden: str,
                                                                      recaptures: int) -> None:
    """SGLang's CudaGraphRunner.recapture_if_needed (real) recaptures every graph when a batch asks for another
    hidden-state mode than the one captured. The plain path's batches ask for none (NULL): captured FULL, as the
    draft sync needs, the runner would recapture at the first plain step (a stall of seconds on an 8B target)."""
    from types import SimpleNamespace

    from sglang.srt.model_executor import cuda_graph_runner as cgr
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    import shim.switch.v1 as sw

    captures: list[str] = []

    def init_cpu_stand_in(self: Any, model_runner: Any, attn_backend: Any = None) -> None:
        # CudaGraphRunner.__init__ for a non-speculative runner: hidden mode NULL, then capture (GPU work)
        self.model_runner, self.capture_hidden_mode, self.capture_bs = model_runner, CaptureHiddenMode.NULL, [1, 2]
        self.capture()

    monkeypatch.setattr(cgr.CudaGraphRunner, "__init__", init_cpu_stand_in)
    monkeypatch.setattr(cgr.CudaGraphRunner, "capture", lambda self: captures.append(self.capture_hidden_mode.name))
    rt = sw.set_runtime(SwitchConfig(t_off=5, t_on=2, draft_while_off=draft))
    mr = SimpleNamespace(spec_algorithm=None, graph_runner=object(), _get_attention_backend=lambda **_: "plain-backend",
                         server_args=SimpleNamespace(enable_return_hidden_states=False))
    sw.capture_plain_decode_runner(SimpleNamespace(target_worker=SimpleNamespace(model_runner=mr)), rt)
    assert captures == [hidden] and rt.plain_attn_backend == "plain-backend"
    plain_batch = SimpleNamespace(capture_hidden_mode=CaptureHiddenMode.NULL, spec_info=None)  # a plain path batch
    rt.plain_runner.recapture_if_needed(plain_batch)
    assert len(captures) - 1 == recaptures
    sw.set_runtime(None)


def test_retract_is_the_v1_default_and_names_its_design() -> None:
    import shim.switch.v1 as sw

    config = SwitchConfig.from_env({"SPECFLIP_SWITCH": "5:4"}, default_draft="retract")
    assert sw.design_for(sw.check_config(config)) == sw.RETRACT_DESIGN == "v1_plain_off_retract_catch_up"
    assert sw.design_for(SwitchConfig(t_off=5, t_on=4, draft_while_off="sync")) == sw.DESIGN == "seeds_final"
    with mock.patch.dict("os.environ", {"SPECFLIP_SWITCH": "5:4"}, clear=False):
        import os

        os.environ.pop("SPECFLIP_SWITCH_DRAFT", None)
        registered: list[str] = []
        registry = SimpleRegistry(registered)
        sw.install_switch(registry, SwitchConfig.from_env(default_draft="retract"))
    # no trace: no timer; the worker's start-up check (both processes), then the start-up warm-up's hook last
    # (shim/switch/warmup.py)
    assert registered == [*(t for t in sw.HOOKS_FOR_DRAFT_MODE["retract"] if t != sw.T_RUN_BATCH),
                          "sglang.srt.server_args.ServerArgs.check_server_args",
                          "sglang.srt.managers.scheduler.Scheduler.init_model_worker",
                          "sglang.srt.server_args.ServerArgs.check_server_args"]
    sw.set_runtime(None)


class SimpleRegistry:
    """Records what install_switch registers (SGLang's HookRegistry is process-wide)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def register(self, target: str, hook: Any, kind: Any) -> None:
        self.names.append(target)


def test_the_guard_catches_a_flip_off_that_leaves_the_draft_input(loop: Any, monkeypatch: Any) -> None:
    """The plain path's flip must take the draft input off the batch (the plain decode then runs with a speculative
    spec_info: the seeds' attempt 1 at the scheduler level); the guard in assert mode stops it."""
    from shim.guard.core import SpecFlipViolation
    from shim.switch import v1_plain_path

    real = v1_plain_path.to_plain_batch

    def keeps_draft_input(batch: Any, overlap: bool = False) -> None:
        spec_info = batch.spec_info
        real(batch, overlap)
        batch.spec_info = spec_info

    monkeypatch.setattr(v1_plain_path, "to_plain_batch", keeps_draft_input)
    rt = retract_switch(2, 1)
    loop.add(h.make_reqs("s", 1, max_new_tokens=20))
    for _ in range(3):  # prefill and two speculative steps
        loop.iteration()
    loop.add(h.make_reqs("s", 1, max_new_tokens=20, start=1))  # demand 2: flip off at the next iteration
    with pytest.raises(SpecFlipViolation) as caught:
        for _ in range(4):
            loop.iteration()
    assert rt.counters.get("flip_off") == 1
    assert caught.value.invariant in ("spec_info_matches_mode", "spec_info_matches_batch"), caught.value


def test_retract_mode_flips_off_on_an_idle_server_at_a_burst(loop: Any) -> None:
    """A burst of requests at an idle server (each concurrency phase of the GPU run starts so): flip-off with nothing
    running, every request prefilled and decoded plain, flip-on at the idle iteration after them."""
    rt = retract_switch(5, 2)
    loop.add(h.make_reqs("b", 6, max_new_tokens=7))
    loop.run_until_idle()  # its last iteration filters the finished requests: flip-on waits for that
    loop.iteration()
    assert rt.recorded == ["flip_off", "flip_on"]
    assert "spec" not in loop.kinds and loop.kinds.count("prefill") == 1
    assert all(req.output_ids == h.expected_output(req) for req in loop.finished) and len(loop.finished) == 6
    assert loop.scheduler.spec_algorithm.is_eagle() and loop.scheduler.model_worker is loop.worker
    assert not rt.spec_side  # everything the plain path swapped is back


def test_outputs_streamed_while_off_carry_the_speculative_counters(loop: Any) -> None:
    """The H200's 0.5.12 lint matrix (switch_1_0): with scheduler.spec_algorithm NONE on the plain path, 0.5.12's
    stream_output_generation sent no spec_verify_ct and its tokenizer manager's per-request index crashed the
    server at its first output. The real stream_output_generation, hooked, now sends one entry per request.
    Stand-ins: the detokenizer socket (captures what would be sent) and get_loads (a scheduler-metrics query)."""
    import shim.switch.v1 as sw

    retract_switch(5, 2)
    loop.add(h.make_reqs("s", 6, max_new_tokens=7))
    for _ in range(3):
        loop.iteration()
    s = loop.scheduler
    assert s.spec_algorithm.is_none() and "plain" in loop.kinds  # off, on the plain path
    sent: list[Any] = []
    s.send_to_detokenizer = mock.Mock(name="detokenizer_socket_stand_in",
                                      send_output=lambda out, *a, **k: sent.append(out))
    s.get_loads = mock.Mock(name="get_loads_stand_in", return_value=None)
    for attr, value in (("attn_tp_rank", 0), ("dp_rank", None), ("stream_interval", 1)):
        if not hasattr(s, attr):
            setattr(s, attr, value)
    reqs = list(s.running_batch.reqs)
    for req in reqs:
        req.stream = True
    s.stream_output_generation(reqs, False)
    assert sent and len(sent[0].spec_verify_ct) == len(sent[0].rids) == len(reqs)
    assert s.spec_algorithm.is_none()  # the plain path's NONE is back after the call
    sw.set_runtime(None)
    sent.clear()
    s.stream_output_generation(reqs, False)  # what 0.5.12 does without the hook: no counters, a crash downstream
    assert sent and len(sent[0].spec_verify_ct) == 0 < len(sent[0].rids)


def test_every_hook_of_a_v1_worker_call_reads_the_requests_afresh(server: Any, plugin: Any) -> None:
    """0.5.12's verify appends the accepted tokens to `output_ids` (and frees the rejected slots) inside the worker
    call, so a later hook of the same call must read them anew. The v2 adapter's shared worker-call reading (its
    worker writes nothing a reading takes) would hand that hook the call's first reading: the check below fails
    on it."""
    from shim.releases.guard_hooks import V2Adapter

    adapter = plugin.adapter
    server.admit(h.make_reqs("fresh", 2, max_new_tokens=8))
    batch = server.running
    first = adapter.observe_requests_in_worker_call(batch)
    batch.reqs[0].output_ids.append(7)  # what v1's verify does between the draft's hook and the draft-extend's
    later = adapter.observe_requests_in_worker_call(batch)
    assert later[0].output_len == first[0].output_len + 1
    # the v2 worker's reuse on the same call misses such an append: why the 0.5.12 adapter does not use it
    shared = V2Adapter.observe_requests_in_worker_call(adapter, batch)
    batch.reqs[0].output_ids.append(8)
    stale = V2Adapter.observe_requests_in_worker_call(adapter, batch)
    assert stale[0].output_len == shared[0].output_len == later[0].output_len
    adapter._worker_reading = None


def test_the_start_up_warmup_runs_every_path_a_flip_takes_on_the_v1_loop(loop: Any, plugin: Any) -> None:
    """The switch's start-up warm-up (shim/switch/warmup.py), its two waves through 0.5.12's non-overlap loop with the
    v1 switch (retract) and the guard in assert mode: speculation at every batch size below t_off, one flip off,
    plain decode, one flip on that retracts t_on running requests, speculation down to 1 again; outputs greedy-exact,
    every slot back, no finding. The 2026-12-02 (297d221) run's first-flip stall on the H200 was kernels first built
    after a flip: these are the paths the warm-up makes the server build before it listens."""
    from shim.switch import warmup

    config = SwitchConfig(t_off=8, t_on=4, draft_while_off="retract")
    rt = retract_switch(config.t_off, config.t_on)
    loop.worker.accept_lens_cpu_stand_in = [2]  # the counter draft's accept length on the H200 (2.0 at every step)
    spec_wave, flip_wave = warmup.warmup_waves(config, max_running=48)
    sizes: list[tuple[str, int]] = []
    spec_decode, plain_decode = loop._spec_decode, loop._plain_decode

    def spec(batch: Any) -> None:
        sizes.append(("spec", len(batch.reqs)))
        spec_decode(batch)

    def plain(batch: Any) -> None:
        sizes.append(("plain", len(batch.reqs)))
        plain_decode(batch)

    loop._spec_decode, loop._plain_decode = spec, plain

    def reqs(wave: list[warmup.WarmupRequest]) -> list[Any]:
        return [h.make_req(r.rid, list(range(10, 10 + r.prompt_len)), max_new_tokens=r.max_new_tokens) for r in wave]

    first = reqs(spec_wave)
    loop.add(first)
    loop.run_until_idle()
    assert rt.counters.get("flip_off") is None and {n for kind, n in sizes if kind == "spec"} == set(range(1, 8))
    spec_only = len(sizes)
    second = reqs(flip_wave)
    loop.add(second)
    loop.run_until_idle()
    assert rt.counters.get("flip_off") == 1 and rt.counters.get("flip_on") == 1, rt.counters
    later = sizes[spec_only:]
    plain_at = [i for i, (kind, _) in enumerate(later) if kind == "plain"]
    assert plain_at and max(n for kind, n in later if kind == "plain") == len(flip_wave)
    after_on = later[plain_at[-1] + 1:]
    assert after_on and all(kind == "spec" for kind, _ in after_on)
    assert {n for _, n in after_on} == set(range(1, config.t_on + 1))  # the retracted t_on, down to 1
    assert sum(r.retraction_count for r in second) == config.t_on  # the flip on retracted what was running
    done = first + second
    assert all(r.finished() and r.output_ids == h.expected_output(r) for r in done)
    tree = loop.pools.tree_cache
    assert loop.pools.allocator.available_size() + tree.evictable_size() + tree.protected_size() \
        == loop.pools.allocator.size
    assert warmup.is_warmup_batch(type("Batch", (), {"reqs": second})())
    assert plugin.guard is not None and plugin.guard.found == []  # assert mode: a finding would have raised


# --- SPECFLIP_V1_LOOP=overlap: plain iterations in the overlap loop's order (shim/switch/v1_loop.py) ---------------


@pytest.fixture(params=[False, True], ids=["radix_off", "radix_on"])
def overlap_loop(plugin: Any, tmp_path: Path, request: Any) -> Any:
    """A fresh V1OverlapLoopServer: v1_loop.iteration on a real Scheduler object with 0.5.12's real FutureMap. The
    guard is paused: these tests are the loop's own (the guard's are below)."""
    yield from _guarded(plugin, tmp_path, request.param, h.V1OverlapLoopServer, None)


def test_overlap_loop_overlaps_plain_steps_only_and_is_exact_and_kv_clean(overlap_loop: Any) -> None:
    """Two waves across the threshold: every output greedy-exact (the stand-in model reads the launched positions and
    the tokens relayed through the real future map), every slot back, plain steps launched while the step before was
    unprocessed, speculative steps never (their result is processed before the next step is prepared), and each
    flip-on found nothing in flight."""
    import shim.switch.v1 as sw

    rt = retract_switch(5, 2, v1_loop="overlap")
    assert sw.design_for(rt.config) == "v1_plain_off_retract_catch_up_overlap_plain"
    s = overlap_loop.scheduler
    in_flight_at_flip: list[int] = []
    flip = sw.v1_plain_path.plain_path_flip

    def watched_flip(rt: Any, scheduler: Any) -> Any:
        queued = len(scheduler.result_queue)
        action = flip(rt, scheduler)
        if action is not None:
            in_flight_at_flip.append(queued)
        return action

    with mock.patch.object(sw.v1_plain_path, "plain_path_flip", watched_flip):
        _waves(overlap_loop)
    assert not s.result_queue
    assert len(overlap_loop.finished) == 12
    assert all(req.output_ids == h.expected_output(req) for req in overlap_loop.finished)  # greedy, exact
    tree = overlap_loop.pools.tree_cache
    held_by_tree = tree.evictable_size() + tree.protected_size()
    assert overlap_loop.pools.allocator.available_size() + held_by_tree == overlap_loop.pools.allocator.size
    assert rt.counters.get("flip_off") == 2 and rt.counters.get("flip_on") == 2, rt.counters
    assert in_flight_at_flip == [0, 0, 0, 0]
    assert overlap_loop.kinds.count("plain") >= 8 and "spec" in overlap_loop.kinds
    assert overlap_loop.overlapped >= overlap_loop.kinds.count("plain") - 4  # all but each wave's first few
    assert s.spec_algorithm.is_eagle() and not s.enable_overlap and not rt.spec_side  # back on the spec side


@pytest.fixture(params=[False, True], ids=["radix_off", "radix_on"])
def guarded_overlap_loop(plugin: Any, tmp_path: Path, request: Any) -> Any:
    """The overlap loop's server with the guard on in assert mode, its reference the design the v1 switch announces
    with SPECFLIP_V1_LOOP=overlap (checked under the overlap scope: the 0.5.12 adapter then follows that scope)."""
    import shim.switch.v1 as sw

    yield from _guarded(plugin, tmp_path, request.param, h.V1OverlapLoopServer, sw.OVERLAP_LOOP_DESIGN)


def test_the_guard_follows_the_overlap_loop(guarded_overlap_loop: Any, plugin: Any, tmp_path: Path) -> None:
    """Two waves across the threshold with the guard in assert mode: no finding, every output exact, and the guard's
    steps are the overlap scope's (a plain step's result processed after the next step launched, a speculative
    step's right after its own), each one the reference design allows (the guard checks legal_transition itself)."""
    import shim.switch.v1 as sw

    rt = retract_switch(5, 2, v1_loop="overlap")
    _waves(guarded_overlap_loop)
    srv = guarded_overlap_loop
    assert len(srv.finished) == 12 and all(req.output_ids == h.expected_output(req) for req in srv.finished)
    assert rt.counters.get("flip_off") == 2 and rt.counters.get("flip_on") == 2, rt.counters
    assert plugin.guard.config.design.name == sw.OVERLAP_LOOP_DESIGN and plugin.guard.config.scope.overlap
    plugin.guard.close()
    steps = _guard_steps(tmp_path / "guard.jsonl")
    names = [a.name for _, a in steps]
    assert {"verify", "draft_extend", "plain_decode", "process_result", "flip_off", "flip_on"} <= set(names)
    # a speculative step's result is processed right after its draft-extend; a plain one after the next launch
    assert all(names[i + 1] == "process_result" for i, n in enumerate(names) if n == "draft_extend")
    launches = [i for i, n in enumerate(names) if n == "plain_decode"]
    assert any("plain_decode" in names[i + 1:names.index("process_result", i)] for i in launches[:-1])


def test_the_guard_stops_a_flip_with_a_plain_step_in_flight(guarded_overlap_loop: Any, monkeypatch: Any) -> None:
    """The overlap loop without its drain before a flip (v1_loop.iteration asks flip_due first): flip-on retracts with
    a plain step's result unprocessed, and 0.5.12 skips a retracted request's result only while `enable_overlap` is
    set, which the flip has cleared: the re-prefilled request gets that step's token a second time (the checker's
    known-bad `v1_overlap_flip_on_in_flight`, `result_not_after_reprefill`). The guard stops the flip itself: its
    design flips only once the results in flight are processed (statemodel.actions.flip_waits)."""
    from shim.guard.core import SpecFlipViolation
    from shim.switch import v1_loop

    retract_switch(5, 2, v1_loop="overlap")
    monkeypatch.setattr(v1_loop, "flip_due", lambda rt, scheduler: None)  # no drain; the flip itself stays
    with pytest.raises(SpecFlipViolation) as caught:
        _waves(guarded_overlap_loop, rounds=1)
    assert caught.value.invariant == "legal_transition" and "flip_on with 1 launched step(s) unprocessed" in \
        str(caught.value), caught.value


def test_overlap_loop_relay_is_what_makes_it_exact(overlap_loop: Any, monkeypatch: Any) -> None:
    """The same waves with the future map's relay broken (resolve_future leaves the placeholders): the stand-in model
    then returns wrong tokens, so the exactness check above can fail."""
    rt = retract_switch(5, 2, v1_loop="overlap")
    monkeypatch.setattr(overlap_loop.scheduler.future_map, "resolve_future", lambda mwb: None)
    _waves(overlap_loop, rounds=1)
    assert rt.counters.get("flip_off") == 1
    assert any(req.output_ids != h.expected_output(req) for req in overlap_loop.finished)


def test_overlap_loop_config_errors() -> None:
    """SPECFLIP_V1_LOOP: one line for a bad value or for overlap with the seeds' sync mode."""
    with pytest.raises(SwitchConfigError, match="SPECFLIP_V1_LOOP='fast': expected one of normal, overlap"):
        SwitchConfig.from_env({"SPECFLIP_SWITCH": "5:2", "SPECFLIP_V1_LOOP": "fast"})
    with pytest.raises(SwitchConfigError, match="SPECFLIP_SWITCH_DRAFT=retract"):
        SwitchConfig.from_env({"SPECFLIP_SWITCH": "5:2", "SPECFLIP_V1_LOOP": "overlap",
                               "SPECFLIP_SWITCH_DRAFT": "sync"})
    assert SwitchConfig.from_env({"SPECFLIP_SWITCH": "5:2", "SPECFLIP_V1_LOOP": "overlap"}).v1_loop == "overlap"


def test_the_v1_loop_defaults_to_overlap_unless_the_guard_is_asked_for() -> None:
    """SPECFLIP_V1_LOOP unset: the overlap loop (the speed of a plain server above the threshold), with the guard or
    without (it followed that loop live, 2026-12-03, fea0197); an explicit value is kept; the seeds' sync mode stays in
    the normal loop. The design announced follows the loop, and the hook list gains the loop's."""
    import shim.switch.v1 as sw

    loop = {}
    for name, env in {"unset": {}, "guard": {"SPECFLIP_MODE": "assert"}, "guard_off": {"SPECFLIP_MODE": "off"},
                      "explicit": {"SPECFLIP_V1_LOOP": "normal"},
                      "sync": {"SPECFLIP_SWITCH_DRAFT": "sync"}}.items():
        config = sw.config_from_env({"SPECFLIP_SWITCH": "5:2", **env})
        loop[name] = (config.v1_loop, sw.design_for(config))
    overlap = ("overlap", sw.OVERLAP_LOOP_DESIGN)
    assert loop == {"unset": overlap, "guard": overlap, "guard_off": overlap,
                    "explicit": ("normal", sw.RETRACT_DESIGN), "sync": ("normal", sw.DESIGN)}
    assert sw.config_from_env({}) is None
    registered: list[str] = []
    sw.install_switch(SimpleRegistry(registered), sw.config_from_env({"SPECFLIP_SWITCH": "5:2"}))
    assert sw.T_LOOP in registered
    sw.set_runtime(None)


# --- the guard's start-up decision on 0.5.12 (shim/guard/runtime.py decide_at_start_up) ----------------------------


class ModelWorkerBuilt(Exception):
    """Raised by the stand-in for the model worker's build: start-up went on past the guard's decision."""


@pytest.mark.parametrize("mode", ["assert", "warn"])
def test_the_v2_worker_on_0_5_12_is_decided_at_start_up(plugin: Any, tmp_path: Path, mode: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """0.5.12 under the overlap schedule runs EAGLEWorkerV2, which its adapter does not cover: through SGLang's real
    (hooked) `Scheduler.init_model_worker`, assert mode stops start-up with one line before the model worker is
    built; warn mode turns the guard off there, with one line, and start-up goes on."""
    import os

    from sglang.srt.managers.scheduler import Scheduler

    from shim.guard.core import Mode

    sa = h.make_server_args(h.write_tiny_model_config(tmp_path / "model"), num_steps=NUM_STEPS)
    sa.disable_overlap_schedule = False  # the overlap schedule, as a GPU launch resolves it
    reached: list[bool] = []

    def init_tp_model_worker_cpu_stand_in() -> None:
        reached.append(plugin.active)
        raise ModelWorkerBuilt

    scheduler = Scheduler.__new__(Scheduler)
    scheduler.tp_rank = 0
    scheduler.init_tp_model_worker = init_tp_model_worker_cpu_stand_in
    plugin.reset()
    plugin.paused, plugin.mode, plugin.decided, plugin.disabled_reason = False, Mode(mode), False, None
    try:
        with mock.patch.dict(os.environ, {}), caplog.at_level("WARNING", logger="specflip.guard"):
            os.environ.pop("SPECFLIP_ON_BAD_CONFIG", None)
            if mode == "assert":
                with pytest.raises(SystemExit) as stop:
                    scheduler.init_model_worker()
                line = str(stop.value.code)
                assert "\n" not in line and reached == []
                assert line.startswith("specflip: SPECFLIP_MODE=assert asks for a guard that stops faults, but the "
                                       "guard does not check this server: sglang 0.5.12: the overlap schedule runs "
                                       "EAGLEWorkerV2 on 0.5.12")
            else:
                with pytest.raises(ModelWorkerBuilt):
                    scheduler.init_model_worker()
                assert reached == [False]
                off = [r.getMessage() for r in caplog.records if "specflip guard off" in r.getMessage()]
                assert len(off) == 1 and "the overlap schedule runs EAGLEWorkerV2 on 0.5.12" in off[0]
    finally:
        plugin.mode, plugin.decided, plugin.disabled_reason, plugin.rank = Mode.ASSERT, False, None, None
        plugin.reset()


@pytest.mark.parametrize("on_bad_config", ["stop", "warn"])
def test_the_v1_switch_decides_on_the_worker_at_the_schedulers_start_up(plugin: Any, tmp_path: Path,
                                                                        on_bad_config: str,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The v1 switch, installed at plugin load where only SGLANG_ENABLE_SPEC_V2 can be read, checks the worker SGLang
    builds on the Scheduler's own resolved server arguments, through SGLang's real (hooked)
    `Scheduler.init_model_worker` (shim/switch/v1.py check_worker): the overlap schedule off
    (--disable-overlap-schedule, the variable saying v2): the v1 worker, the switch stays; on: EAGLEWorkerV2, whose
    batches the switch's flips (get_next_batch_to_run) would have met: start-up stops with one line before the model
    worker is built; SPECFLIP_ON_BAD_CONFIG=warn: one error line, and the switch is off when the model worker is built
    (its hooks pass through; no design announced to the guard)."""
    import logging
    import os

    from sglang.srt.managers.scheduler import Scheduler

    import shim.switch.v1 as sw
    from shim.guard import api as guard_api

    sa = h.make_server_args(h.write_tiny_model_config(tmp_path / "model"), num_steps=NUM_STEPS)
    reached: list[tuple[bool, Any]] = []

    def init_tp_model_worker_cpu_stand_in() -> None:
        reached.append((sw.runtime() is not None, guard_api.announced_switch()))
        raise ModelWorkerBuilt

    scheduler = Scheduler.__new__(Scheduler)
    scheduler.tp_rank = 0
    scheduler.server_args = sa  # Scheduler.__init__'s, before it calls init_model_worker
    scheduler.init_tp_model_worker = init_tp_model_worker_cpu_stand_in
    announced, paused = guard_api.announced_switch(), plugin.paused
    plugin.paused = True  # the guard's own start-up decision (test above) left out: the switch's alone
    env = {"SPECFLIP_SWITCH": "5:2", "SGLANG_ENABLE_SPEC_V2": "1", "SPECFLIP_ON_BAD_CONFIG": on_bad_config}
    try:
        with mock.patch.dict(os.environ, env), caplog.at_level(logging.WARNING):
            sw.install_switch(SimpleRegistry([]), sw.config_from_env())  # the runtime and the announcement
            design = guard_api.announced_switch()
            assert design is not None and design.design_name == sw.OVERLAP_LOOP_DESIGN
            sa.disable_overlap_schedule = True  # --disable-overlap-schedule: the v1 worker
            with pytest.raises(ModelWorkerBuilt):
                scheduler.init_model_worker()
            assert reached == [(True, design)]
            sa.disable_overlap_schedule = False  # the overlap schedule, as a GPU launch resolves it: EAGLEWorkerV2
            if on_bad_config == "stop":
                with pytest.raises(SystemExit) as stop:
                    scheduler.init_model_worker()
                line = str(stop.value.code)
                assert "\n" not in line and len(reached) == 1
                assert line.startswith("specflip: SPECFLIP_SWITCH=5:2 asks for the v1 kit's switch, which runs on "
                                       "SGLang's v1 EAGLEWorker, but sglang 0.5.12 runs EAGLEWorkerV2 for this server")
            else:
                with pytest.raises(ModelWorkerBuilt):
                    scheduler.init_model_worker()
                assert reached[1:] == [(False, None)]
                off = [r.getMessage() for r in caplog.records if "specflip switch off" in r.getMessage()]
                assert len(off) == 1 and "sglang 0.5.12 runs EAGLEWorkerV2 for this server" in off[0], off
    finally:
        plugin.paused = paused
        sw.set_runtime(None)
        guard_api.announce_switch(announced.design_name if announced else None,
                                  announced.spec_cap if announced else 0)


# --- long clean runs (issue 51): both v1 candidates, 2,000 iterations with flips -----------------------------------

# the candidate designs these runs cover (tests/test_guard_long_run.py checks that every shipped and candidate design
# has a long run somewhere): v1_plain_off_retract_catch_up with the radix cache off; with it on, its radix twin
# v1_plain_off_retract_catch_up_radix, which is the same switch with keep_out (SPECFLIP_SWITCH_RADIX's default) on a
# server with the tree. The guard's reference is what the switch announces (shim/switch/v1.py, design_for: the
# retract design in the normal loop, whatever the tree; the overlap loop's own design there), its tree check
# (shim/guard/tree_draft.py) beside it, as a live server has them.
V1_LONG_RUN = {False: "v1_plain_off_retract_catch_up", True: "v1_plain_off_retract_catch_up_radix"}
LONG_RUN_CHUNK = 16  # the prefill budget in every other phase of 250 iterations (the prompts are 24-34 tokens)


def _long_run_v1(srv: Any, rt: Any, *, steps: int, seed: int = 0) -> list[Any]:
    """`steps` loop iterations of `srv` (the real switch's flips at t_off 5, t_on 2): demand in phases of 15-60
    iterations, 0-1 requests and 4-9 in turn; each request a shared 20-token prefix and a suffix of its own whose
    first token no other request's has (so no request hits a prompt cached while off, which the checker refutes for
    the tree as SGLang has it: tests/test_prefix_cache.py), 4-40 new tokens; chunked prefill (16 tokens) in the odd
    phases of 250 iterations. Returns every request."""
    import random

    rng = random.Random(seed)
    made: list[Any] = []
    level, until, high = 0, 0, False
    for it in range(steps):
        srv.scheduler.chunk_size_cpu_stand_in = LONG_RUN_CHUNK if (it // 250) % 2 else None
        if it >= until:
            high = not high
            level, until = rng.randint(*((4, 9) if high else (0, 1))), it + rng.randrange(15, 61)
        live = sum(1 for r in made if not r.finished())
        if live < level:
            wave = []
            for _ in range(level - live):
                n = len(made) + len(wave)
                suffix = [400 + n % 500, 900 + n // 500] + [rng.randrange(20, 400) for _ in range(rng.randrange(2, 12))]
                wave.append(h.make_req(f"L{n}", [5] * 20 + suffix, max_new_tokens=rng.randrange(4, 41)))
            made += wave
            srv.add(wave)
        srv.iteration()
    srv.scheduler.chunk_size_cpu_stand_in = None
    srv.run_until_idle(limit=2000)
    return made


LONG_RUN_CASES = [(radix, loop_kind) for loop_kind in ("normal", "overlap") for radix in (False, True)]


def _long_run_design(radix: bool, loop_kind: str) -> str:
    import shim.switch.v1 as sw

    return sw.design_for(SwitchConfig(t_off=5, t_on=2, draft_while_off="retract", radix="keep_out" if radix else
                                      "insert", v1_loop=loop_kind))


@pytest.fixture(params=LONG_RUN_CASES, ids=[f"{k}-radix_{'on' if r else 'off'}" for r, k in LONG_RUN_CASES])
def long_loop(plugin: Any, tmp_path: Path, request: Any) -> Any:
    """A fresh server of the loop (normal: V1LoopServer; overlap: V1OverlapLoopServer) and a fresh Guard in assert
    mode, its reference the design the case runs."""
    radix, loop_kind = request.param
    server = h.V1OverlapLoopServer if loop_kind == "overlap" else h.V1LoopServer
    for srv in _guarded(plugin, tmp_path, radix, server, _long_run_design(radix, loop_kind), chunk_cache=True):
        plugin.trace_template = None  # a trace of 2,000 iterations: not needed here
        yield srv, radix, loop_kind


@pytest.mark.long_run
def test_long_run_is_clean_v1(plugin: Any, long_loop: Any) -> None:
    """2,000 iterations of the v1 switch (draft mode retract) on real 0.5.12 objects, in the normal loop and in
    specflip's v1 overlap loop (SPECFLIP_V1_LOOP=overlap, the default), the radix cache off and on (keep_out),
    chunked prefill on and off in turn (radix off: SGLang's ChunkCache, as such a server has), the guard in assert
    mode with the design the switch announces as reference (v1_plain_off_retract_catch_up; in the overlap loop
    v1_plain_off_retract_catch_up_overlap_plain): no finding, every output greedy-exact, every slot back,
    dozens of flips, chunked prefills both while on and while off."""
    from shim.settings import settings

    srv, radix, loop_kind = long_loop
    steps = settings.LONG_RUN_STEPS.get()
    rt = retract_switch(5, 2, radix="keep_out" if radix else "insert", v1_loop=loop_kind)
    chunked: list[bool] = []  # per chunked prefill: speculation on
    orig = h._chunked_prefill_batch

    def watched(scheduler: Any, chunk_size: int) -> Any:
        batch = orig(scheduler, chunk_size)
        if batch is not None and scheduler.chunked_req is not None:
            chunked.append(not batch.spec_algorithm.is_none())
        return batch

    with mock.patch.object(h, "_chunked_prefill_batch", watched):
        made = _long_run_v1(srv, rt, steps=steps)
    assert plugin.guard.config.design.name == _long_run_design(radix, loop_kind) and plugin.guard.found == []
    assert [r.rid for r in made if not r.finished() or r.output_ids != h.expected_output(r)] == []
    tree = srv.pools.tree_cache
    assert srv.pools.allocator.available_size() + tree.evictable_size() + tree.protected_size() == \
        srv.pools.allocator.size
    offs, ons = rt.counters.get("flip_off", 0), rt.counters.get("flip_on", 0)
    assert offs + ons >= steps // 60 and min(offs, ons) >= steps // 200, rt.counters
    assert True in chunked and False in chunked  # chunked prefills on both sides of the flips


# --- the v1 kit's entry point through SGLang's real load_plugins, in a fresh process (as a server starts) -----------

_V1_KIT_LOAD = ("import sys; sys.path.insert(0, 'tests'); import sglang12_cpu;"
                "import sglang.srt.plugins as p; p.load_plugins();"
                "import shim.guard.runtime as r, shim.switch.v1 as s, shim.switch.v2 as s2;"
                "print('serving, guard:', r.current() is not None, 'switch:', s.runtime() is not None, "
                "'v2 switch:', s2.runtime() is not None)")


def _start_v1_kit(tmp_path: Path, env: dict[str, str]) -> Any:
    """SGLang 0.5.12's load_plugins() with only the v1 kit's entry point (bench/gpu/v1_run.sh writes the same
    dist-info) and the v1 EAGLEWorker selected, in a fresh interpreter. `env` may name another plugin
    (SGLANG_PLUGINS=specflip: specflip's own entry point) or unset SGLANG_ENABLE_SPEC_V2 (an empty value)."""
    import os
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    dist = tmp_path / "site" / "specflip_v1-0.1.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: specflip-v1\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[sglang.srt.plugins]\nspecflip_v1 = shim.plugin:register_v1\n")
    full = {k: v for k, v in os.environ.items() if not k.startswith("SPECFLIP_")}
    full.update(PYTHONPATH=os.pathsep.join([str(dist.parent), str(repo)]), SGLANG_PLUGINS="specflip_v1",
                SGLANG_ENABLE_SPEC_V2="0", SPECFLIP_MODE="assert")
    full.update(env)
    full = {k: v for k, v in full.items() if v}
    return subprocess.run([sys.executable, "-c", _V1_KIT_LOAD], cwd=repo, env=full, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("env", [{"SPECFLIP_SWITCH": "auto"}, {"SPECFLIP_SWITCH": "5:2", "SPECFLIP_TIERS": "3,4:2,1"}],
                         ids=["auto", "tiers"])
def test_the_v1_kit_stops_start_up_on_what_the_v1_switch_cannot_run(tmp_path: Path, env: dict[str, str]) -> None:
    """SPECFLIP_SWITCH=auto (or SPECFLIP_TIERS) on the v1 kit: the settings check passed, then the v1 switch refused it
    inside register_v1, SGLang logged "Failed to execute general plugin" and served with neither the switch nor the
    guard. Now the settings check finds it: start-up stops with one line naming what the v1 switch takes; with
    SPECFLIP_ON_BAD_CONFIG=warn, one error line, the switch off and the guard on."""
    import shim.switch.v1 as sw

    done = _start_v1_kit(tmp_path, env)
    assert done.returncode != 0 and "serving" not in done.stdout, done.stdout + done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("specflip: SPECFLIP_") and sw.V1_TAKES in lines[-1], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Failed to execute" not in done.stderr
    done = _start_v1_kit(tmp_path, {**env, "SPECFLIP_ON_BAD_CONFIG": "warn"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "serving, guard: True switch: False" in done.stdout, done.stdout + done.stderr[-3000:]
    off = [line for line in done.stderr.splitlines() if "specflip switch off: SPECFLIP_" in line]
    assert len(off) == 1 and sw.V1_TAKES in off[0], done.stderr[-3000:]
    assert "Failed to execute" not in done.stderr


def test_the_v1_kit_serves_with_its_switch_and_guard_on_thresholds(tmp_path: Path) -> None:
    """The same start-up with thresholds: both installed (so that the stops above are the settings, not the start)."""
    done = _start_v1_kit(tmp_path, {"SPECFLIP_SWITCH": "5:2"})
    assert done.returncode == 0 and "serving, guard: True switch: True" in done.stdout, done.stderr[-3000:]


# "1": the v2 worker, as unset is on 0.5.12 (environ.py: EnvBool(True)); spelled out, because the CPU harness the
# probe imports (sglang12_cpu) defaults the variable to 0
@pytest.mark.parametrize("spec_v2", ["1", "0"], ids=["v2_worker", "v1_worker"])
def test_specflips_own_entry_point_stops_where_0_5_12_offers_no_v2_switch(tmp_path: Path, spec_v2: str) -> None:
    """0.5.12 through specflip's own entry point (`specflip = shim.plugin:register`): with the v2 worker the v2 switch
    was offered although 0.5.12's EAGLEWorkerV2 lacks its hook points (init_cuda_graphs, activate_step_by_batch) and
    the module retract_all its flip-on calls; with SGLANG_ENABLE_SPEC_V2=0 it declined with an info line and no
    switch ran. Either way now: start-up stops with one line that says how to get the v1 switch (the v1 kit); with
    SPECFLIP_ON_BAD_CONFIG=warn, one error line, no switch, the guard as asked."""
    env = {"SGLANG_PLUGINS": "specflip", "SGLANG_ENABLE_SPEC_V2": spec_v2, "SPECFLIP_SWITCH": "5:2"}
    done = _start_v1_kit(tmp_path, env)
    assert done.returncode != 0 and "serving" not in done.stdout, done.stdout + done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("specflip: SPECFLIP_SWITCH=5:2 asks for the switch, which sglang 0.5.12 does not "
                                "offer through specflip's entry point"), done.stderr[-3000:]
    assert "shim.plugin:register_v1" in lines[-1] and "SGLANG_ENABLE_SPEC_V2=0" in lines[-1]
    done = _start_v1_kit(tmp_path, {**env, "SPECFLIP_ON_BAD_CONFIG": "warn"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "serving, guard: True switch: False v2 switch: False" in done.stdout, done.stdout + done.stderr[-3000:]
    assert len([line for line in done.stderr.splitlines() if "specflip switch off: " in line]) == 1
