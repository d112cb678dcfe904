"""Issue 18: the guard checks identities, not only counts, on real sglang 0.5.23 objects on CPU. Each class of bug
keeps the model's counts balanced; each test injects one (the switch's own fault injection, shim/switch/faults.py,
where the v2 switch can make it; a test-side bug otherwise), shows the guard names it, and shows that the same run
with the new check taken out (`without`) goes through unreported while the damage is real.

Classes: 1 slot identity (statemodel.identity.slots_freed_owned), 2 token content (committed_output_kept),
3 per-request draft coverage (shim.guard.sync._draft_covered_as_observed), 5 blame (the flip named and listed);
warn mode's held-back findings are logged, never silent."""

from __future__ import annotations

import copy
import importlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")
ol = importlib.import_module("overlap_loop")
sr = importlib.import_module("test_switch_retract")

import shim.guard.core  # noqa: E402
import shim.guard.identity  # noqa: E402
from shim.guard.core import Mode, SpecFlipViolation  # noqa: E402
from shim.switch import faults  # noqa: E402
from statemodel.designs import CATCH_UP, V2_SWITCH  # noqa: E402

pytestmark = pytest.mark.sglang


@pytest.fixture
def fault() -> Iterator[Any]:
    """Turn on shim/switch/faults.py's injection by name, as SPECFLIP_FAULT does; off again after the test."""
    def on(name: str) -> None:
        faults.install_from_env({faults.ENV_FAULT: name})
    yield on
    faults.install_from_env({})


def take_out_identity_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard as it was before issue 18: no position, token or per-request coverage check."""
    monkeypatch.setattr(shim.guard.identity, "slots_freed_owned", lambda *a, **k: [])
    monkeypatch.setattr(shim.guard.identity, "committed_output_kept", lambda *a, **k: [])
    monkeypatch.setattr(shim.guard.identity, "output_within_bound", lambda *a, **k: [])
    monkeypatch.setattr(shim.guard.core, "_draft_covered_as_observed", lambda before, after, covered: after)


# --- class 1: slot identity ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("without", [False, True], ids=["guard", "without_the_check"])
def test_reserve_freed_off_by_one_at_flip_off(runtime: Any, model_dir: Path, fault: Any,
                                              monkeypatch: pytest.MonkeyPatch, without: bool) -> None:
    """SPECFLIP_FAULT=reserve_off_by_one: flip-off frees req_to_token[row, committed+1 : allocated+1]. The count
    freed is right; the first reserved slot leaks and the stale entry past the allocation is freed. The guard stops it
    at the flip, naming the positions; without the check the run goes on and the free list ends up wrong."""
    fault("reserve_off_by_one")
    if without:
        take_out_identity_checks(monkeypatch)
    sr.configure(runtime)
    drv = sr.driver(model_dir)
    if without:
        try:
            sr.run_waves(drv)
        except SpecFlipViolation as exc:  # a count it unbalanced later, never at the flip, never the positions
            assert exc.invariant != "slots_freed_owned" and exc.action != "flip_off", exc
            return
        assert not sr.free_list_exact(drv.pools)
        return
    with pytest.raises(SpecFlipViolation) as caught:
        sr.run_waves(drv)
    exc = caught.value
    print(exc)
    assert exc.invariant == "slots_freed_owned" and exc.action == "flip_off"
    assert "(leaked)" in str(exc) and "double free" in str(exc) and len(exc.rids) == 1
    assert "flip_off" in str(exc).split("last transitions:")[1]


@pytest.mark.parametrize("without", [False, True], ids=["guard", "without_the_check"])
def test_flip_off_keeps_allocated_len_is_blamed_on_the_flip(runtime: Any, model_dir: Path, fault: Any,
                                                            monkeypatch: pytest.MonkeyPatch, without: bool) -> None:
    """SPECFLIP_FAULT=flip_keeps_allocated (class 5): the reserve is freed but kv_allocated_len kept. The guard blames
    the flip (the positions it freed are still allocated) and lists it among the last transitions."""
    fault("flip_keeps_allocated")
    if without:
        take_out_identity_checks(monkeypatch)
    sr.configure(runtime)
    drv = sr.driver(model_dir)
    with pytest.raises(SpecFlipViolation) as caught:
        sr.run_waves(drv)
    exc = caught.value
    print(exc)
    listed = str(exc).split("last transitions:")[1]
    if without:
        assert exc.invariant != "slots_freed_owned"
        return
    assert exc.invariant == "slots_freed_owned" and exc.action == "flip_off" and "flip_off" in listed
    assert "still holds or never held" in str(exc)


# --- class 2: token content ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("without", [False, True], ids=["guard", "without_the_check"])
def test_plain_token_appended_twice(runtime: Any, model_dir: Path, fault: Any, monkeypatch: pytest.MonkeyPatch,
                                    without: bool) -> None:
    """SPECFLIP_FAULT=plain_token_twice: after the flip-off, one request's newest token goes into its output twice.
    Every count the model keeps is untouched (KV, seq_lens); the output is one token longer than its steps
    committed. Without the identity checks the wrong token is streamed unreported; only later 0.5.23's
    `_reqs_finishing_inflight` leaves the request out of a step one token early (its output counts the extra token),
    which `requests_in_one_place` names."""
    fault("plain_token_twice")
    if without:
        take_out_identity_checks(monkeypatch)
    sr.configure(runtime)
    drv = sr.driver(model_dir)
    if without:
        with pytest.raises(SpecFlipViolation) as caught:
            sr.run_waves(drv)
        assert caught.value.invariant == "requests_in_one_place" and caught.value.action == "filter_batch", \
            str(caught.value)
        assert "committed_output_kept" not in str(caught.value)
        return
    with pytest.raises(SpecFlipViolation) as caught:
        sr.run_waves(drv)
    exc = caught.value
    print(exc)
    assert exc.invariant == "committed_output_kept" and "appended twice" in str(exc) and len(exc.rids) == 1


@pytest.mark.parametrize("without", [False, True], ids=["guard", "without_the_check"])
def test_retraction_drops_a_committed_token(runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                            without: bool) -> None:
    """While speculation is off, a retraction that drops the request's newest output token, then re-prefills it
    (a test-side bug: the v2 switch retracts only through SGLang's own retract). The guard finds the output shorter
    than it was at the re-prefill."""
    if without:
        take_out_identity_checks(monkeypatch)
    gf.configure_guard(runtime, V2_SWITCH)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), V2_SWITCH)
    drv.accepts = gf.accept_cycle([2, 4, 1, 3])
    reqs = gf.make_reqs("r", 3, max_new_tokens=24, shared_prefix=gf.SYSTEM_PROMPT)
    drv.add(reqs)
    for _ in range(3):
        drv.iteration()
    drv.iteration(flip="off")
    drv.iteration()
    drv.retract_next = True
    drv.iteration()
    victims = [r for r in reqs if str(r.rid) in {rid for _, rid in drv.retracted}]
    assert victims
    victims[0].output_ids.pop()  # the bug: the retraction lost a committed token
    if without:
        try:  # a later count may not fit (the re-prefill is a token short); the drop itself is never named
            drv.iteration(flip="on")
            drv.run_until_idle()
        except SpecFlipViolation as exc:
            assert exc.invariant != "committed_output_kept" and exc.action != "prefill", exc
        return
    with pytest.raises(SpecFlipViolation) as caught:
        drv.iteration(flip="on")
        drv.run_until_idle()
    exc = caught.value
    print(exc)
    assert exc.invariant == "committed_output_kept" and exc.action == "prefill" and "dropped" in str(exc)
    assert exc.rids == (str(victims[0].rid),)


# --- class 3: per-request draft coverage ---------------------------------------------------------------------------


def catch_up_on(drv: Any, covered: list[Any]) -> None:
    """flip_on of design plain_off_catch_up as DesignDriver.flip_on does it, except that the catch-up draft-extend
    runs on `covered` only; the draft input it leaves has a row for every request (padded), so every shape agrees."""
    from sglang.srt.managers.utils import GenerationBatchResult

    import shim.guard.api

    drv.spec_on = True
    drv.batch.spec_algorithm = drv._spec_algorithm(True)
    drv.batch.spec_info = h.make_eagle_draft_input(drv.batch)
    shim.guard.api.notify_flip(True, drv.batch)
    sub = copy.copy(drv.batch)
    sub.reqs = [r for r in drv.batch.reqs if r in covered]
    result = GenerationBatchResult(next_draft_input=h.make_eagle_draft_input(drv.batch))
    drv.worker.draft_worker._draft_extend_for_decode(sub, result)
    import torch

    full = h.make_eagle_draft_input(drv.batch)  # the bug's padding: rows for the requests it skipped too
    bs = len(drv.batch.reqs)
    full.topk_p = torch.ones((bs, 1), dtype=torch.float32)
    full.topk_index = torch.zeros((bs, 1), dtype=torch.int64)
    full.hidden_states = torch.zeros((bs, h.HIDDEN_SIZE), dtype=torch.float32)
    drv.batch.spec_info = full


def admitted_while_off(runtime: Any, model_dir: Path) -> tuple[Any, list[Any], list[Any]]:
    """Design plain_off_catch_up: three requests running at a flip off, two more admitted while off (each decoded
    once); returns the driver, the three and the two."""
    gf.configure_guard(runtime, CATCH_UP)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), CATCH_UP)
    first = gf.make_reqs("a", 3, max_new_tokens=60)
    drv.admit_all(first)
    drv.decode()
    drv.flip_off()
    drv.decode()
    late = gf.make_reqs("b", 2, max_new_tokens=30)
    drv.admit_all(late)
    drv.decode()
    return drv, first, late


@pytest.mark.parametrize("without", [False, True], ids=["guard", "without_the_check"])
def test_catch_up_skipping_requests_admitted_while_off(runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                       without: bool) -> None:
    """Design plain_off_catch_up: the catch-up at flip-on covers the requests running at flip-off, not the two
    admitted while off. The guard takes the catch-up's coverage from the batch it ran on, per request, and stops the
    catch-up itself, before its forward (issue 51), naming the two and the tokens their draft KV covers. Without the
    check at the catch-up (`draft_extend_leaves_behind`) the next draft step stops it; without either, nothing."""
    if without:
        take_out_identity_checks(monkeypatch)
    monkeypatch.setattr(shim.guard.core, "draft_extend_leaves_behind", lambda *a: [])
    drv, first, late = admitted_while_off(runtime, model_dir)
    catch_up_on(drv, first)
    if without:
        drv.decode()
        assert runtime.guard.found == []
        return
    with pytest.raises(SpecFlipViolation) as caught:
        drv.decode()
    exc = caught.value
    print(exc)
    assert exc.invariant == "draft_kv_covers_prefix" and exc.action == "draft"
    assert set(exc.rids) == {str(r.rid) for r in late}
    assert "draft_catch_up" in str(exc).split("last transitions:")[1]


def test_partial_catch_up_stopped_before_its_own_forward(runtime: Any, model_dir: Path) -> None:
    """Issue 51: the same partial catch-up, stopped at the catch-up's hook (`_draft_extend_for_decode` BEFORE): the
    draft-extend forward never runs, and the two requests it left out are named."""
    drv, first, late = admitted_while_off(runtime, model_dir)
    extends = gf.STAND_IN_CALLS.get("draft_extend", 0)
    with pytest.raises(SpecFlipViolation) as caught:
        catch_up_on(drv, first)
    exc = caught.value
    print(exc)
    assert exc.invariant == "draft_kv_covers_prefix" and exc.action == "draft_catch_up"
    assert set(exc.rids) == {str(r.rid) for r in late} and "runs the draft over 3 of 5 running requests" in str(exc)
    assert gf.STAND_IN_CALLS.get("draft_extend", 0) == extends  # stopped before the catch-up's forward


# --- warn mode: every finding reported --------------------------------------------------------------------------------


def test_warn_mode_logs_held_back_findings(runtime: Any, model_dir: Path, fault: Any,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """Flip-offs that each free off by one, in warn mode with a 30 s interval: the first is logged in full, those
    held back are logged with their count when the guard closes (or once the interval passes), never lost."""
    fault("reserve_off_by_one")
    gf.configure_guard(runtime, sr.RETRACT, mode=Mode.WARN)
    drv = sr.driver(model_dir)
    waves = {0: [6, 9, 14, 20, 50], 30: [5, 8, 12, 17], 50: [3, 7, 11, 16, 40], 70: [4, 6, 9, 12, 30]}
    monkeypatch_waves = pytest.MonkeyPatch()
    monkeypatch_waves.setattr(sr, "WAVES", waves)
    try:
        with caplog.at_level(logging.WARNING, logger="specflip.guard"):
            sr.run_waves(drv, iterations=100)
            guard = runtime.guard
            found = [v for _, vs in guard.found for v in vs if v.invariant == "slots_freed_owned"]
            runtime.reset()  # closes the guard: what is still held back is logged
    finally:
        monkeypatch_waves.undo()
    assert len(found) >= 2
    full = [r for r in caplog.records if r.getMessage().startswith("specflip: slots_freed_owned broken by flip_off")]
    held = [r for r in caplog.records if "more slots_freed_owned findings" in r.getMessage()]
    assert len(full) == 1 and held
    logged = len(full) + sum(int(r.getMessage().split("specflip: ")[1].split()[0]) for r in held)
    assert logged == len(found)


# --- class 1 / 4: the positions a verify writes, from the lengths it launches with -----------------------------------


@pytest.mark.parametrize("without", [False, True], ids=["guard", "without_the_check"])
def test_verify_launched_with_stale_seq_lens(runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                            without: bool) -> None:
    """A speculative step launched with seq_lens one behind the committed length (a stale copy from before the last
    result: the bug of a flip that rebuilds seq_lens from an old mirror): the verify writes [seq_len, seq_len + 4),
    over the newest committed token's KV slot. The guard stops the launch (positions from the launch's seq_lens_cpu,
    on the overlap path SGLang's own copy of the device lengths); without the check nothing is found before the
    forward writes there. (One ahead stays inside the 2 x (steps + 1) reserve: no slot it does not own.)"""
    if without:
        monkeypatch.setattr(shim.guard.identity, "writes_within_allocation", lambda *a, **k: [])
    gf.configure_guard(runtime, CATCH_UP)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), CATCH_UP)
    drv.admit_all(gf.make_reqs("a", 3, max_new_tokens=40))
    drv.decode()
    with h.patch_assign_req_to_token_pool():
        drv.batch.prepare_for_decode()
    drv.batch.seq_lens = drv.batch.seq_lens - 1
    drv.batch.seq_lens_cpu = drv.batch.seq_lens_cpu - 1
    drv.worker.accept_lens_cpu_stand_in = [2, 1, 4]
    verifies = gf.STAND_IN_CALLS.get("verify", 0)
    if without:
        drv.worker.forward_batch_generation(drv.batch)
        assert runtime.guard.found == [] and gf.STAND_IN_CALLS.get("verify", 0) == verifies + 1
        return
    with pytest.raises(SpecFlipViolation) as caught:
        drv.worker.forward_batch_generation(drv.batch)
    exc = caught.value
    print(exc)
    assert exc.invariant == "writes_within_allocation" and len(exc.rids) == 3
    assert gf.STAND_IN_CALLS.get("verify", 0) == verifies  # stopped before the verify forward


# --- no false positive: the tree's own frees inside a flip (seen live on the H200, 2026-12-01, 17aacf4) ------------


def test_tree_frees_during_a_flips_drain_are_not_the_flips(runtime: Any, model_dir: Path) -> None:
    """Radix cache on, flip-off while a speculative prefill of two requests sharing a new prompt prefix is in flight:
    the flip processes that prefill's result first, and the tree's checkpoint of the second request frees the slots
    that duplicate the first's. Those frees are the tree's (not judged), not the flip's: no finding, every slot
    back."""
    sr.configure(runtime)
    drv = sr.driver(model_dir, radix=True)
    drv.add([h.make_req("long", gf.SYSTEM_PROMPT + [300] * 5, max_new_tokens=40)])
    for _ in range(4):
        drv.iteration()
    shared = list(range(400, 420))
    drv.add([h.make_req(f"s{i}", shared + [500 + i] * 3, max_new_tokens=8) for i in range(2)])
    drv.iteration()  # demand 3: a speculative prefill of both launches, its result in flight
    pending = drv.last_batch
    assert pending.forward_mode.is_extend() and len(pending.reqs) == 2
    drv.add(gf.make_reqs("t", 2, max_new_tokens=6))
    drv.iteration()  # demand 5: flip-off, the prefill's result (and the tree's checkpoints) processed first
    assert sr.events(drv, "flip_off") and sr.events(drv, "flip_off")[0]["drained"]
    drv.run_until_idle()
    assert runtime.guard.found == [] and sr.free_list_exact(drv.pools) and gf.pool_accounted(drv.pools)


# --- device seq_lens against their host mirror on the plain path (issue 51) ------------------------------------------


@pytest.mark.parametrize("how", ["new_tensor", "in_place"])
@pytest.mark.parametrize("without", [False, True], ids=["guard", "without_the_check"])
def test_plain_launch_with_device_seq_lens_moved_alone(runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                       how: str, without: bool) -> None:
    """Speculation off (plain_off_catch_up): after the real prepare_for_decode, the device seq_lens advance once more
    (a new tensor, or in place) and the host mirror seq_lens_cpu does not. The guard reads only the mirror (no sync),
    which still agrees with the model; it stops the plain DECODE at its launch hook, before the target forward, from
    the tensors' identity and `_version`. Without the check the forward runs and nothing is found."""
    if without:
        monkeypatch.setattr(shim.guard.core, "device_seq_lens_unmirrored", lambda *a: [])
    gf.configure_guard(runtime, CATCH_UP)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), CATCH_UP)
    drv.admit_all(gf.make_reqs("a", 3, max_new_tokens=40))
    drv.decode()
    drv.flip_off()
    drv.decode()  # a clean plain step first: nothing found
    assert runtime.guard.found == []
    batch = drv.batch
    with h.patch_assign_req_to_token_pool():
        batch.prepare_for_decode()
    if how == "in_place":
        batch.seq_lens.add_(1)
    else:
        batch.seq_lens = batch.seq_lens + 1
    forwards = gf.STAND_IN_CALLS.get("target_forward", 0)
    if without:
        drv.worker.target_worker.forward_batch_generation(batch)
        assert runtime.guard.found == [] and gf.STAND_IN_CALLS.get("target_forward", 0) == forwards + 1
        return
    with pytest.raises(SpecFlipViolation) as caught:
        drv.worker.target_worker.forward_batch_generation(batch)
    exc = caught.value
    print(exc)
    assert exc.invariant == "seq_lens_mirrored" and exc.action == "plain_decode" and len(exc.rids) == 3
    assert "the plain DECODE at TpModelWorker.forward_batch_generation (plain DECODE) launches" in str(exc), str(exc)
    assert gf.STAND_IN_CALLS.get("target_forward", 0) == forwards  # stopped before the forward


# --- a committed token dropped between two looks (issue 51) ----------------------------------------------------------


@pytest.mark.parametrize("without", [False, True], ids=["guard", "without_the_check"])
def test_token_committed_since_the_last_look_dropped(runtime: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                     without: bool) -> None:
    """A speculative round commits 4 tokens to each request; one of them (not the last) is dropped from a request's
    output_ids before the next step (the output trimmed by it). The length is still at least what an earlier look saw
    and the token at that look's last position is unchanged, so the token check alone passes it; the guard compares
    the output's length with the model's committed count at prepare_for_decode (normal loop: every result processed)
    and stops the step there, before the draft forward. Without it the run finishes with the token lost."""
    if without:
        monkeypatch.setattr(shim.guard.identity, "output_not_dropped", lambda *a, **k: [])
    gf.configure_guard(runtime, CATCH_UP)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), CATCH_UP)
    drv.admit_all(gf.make_reqs("a", 3, max_new_tokens=40))
    drv.decode(accepts=[4, 4, 4])
    drv.decode(accepts=[4, 4, 4])
    victim = drv.batch.reqs[1]
    del victim.output_ids[-2]  # the bug: a committed token dropped
    drafts = gf.STAND_IN_CALLS.get("draft", 0)
    if without:
        drv.run_to_completion()
        assert runtime.guard.found == [] and victim.finished()
        return
    with pytest.raises(SpecFlipViolation) as caught:
        drv.decode(accepts=[4, 4, 4])
    exc = caught.value
    print(exc)
    assert exc.invariant == "committed_output_kept" and exc.action == "prepare_for_decode" and "(dropped)" in str(exc)
    assert exc.rids == (str(victim.rid),)
    assert gf.STAND_IN_CALLS.get("draft", 0) == drafts  # stopped before the draft forward
