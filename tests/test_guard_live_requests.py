"""A live request dropped from a batch without being finished, retracted or aborted (issue 51: found by the mutants of
shim/guard/core.py, docs/mutation.md `filter` 30): with nothing running, the prefilled batch filtered with a request it
should keep, `filter_batch(keep_indices=[0])`, then assigned as the running batch. The dropped request keeps its KV,
so `kv_conservation` holds; the model's `requests_in_one_place` names it at the hook where the guard first sees the
assignment, before any forward runs on that batch. Real SGLang 0.5.23 objects on the CPU (tests/guard_fixtures.py);
and the drops SGLang makes on purpose stay clean."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")

from shim.guard.core import Mode, SpecFlipViolation  # noqa: E402
from statemodel.designs import CATCH_UP, V2_SWITCH  # noqa: E402

pytestmark = pytest.mark.sglang

ASSIGNED = "scheduler (running batch := prefilled batch)"


def _prefilled_pair(drv: Any) -> Any:
    """Two requests prefilled, the second then dropped by the prefilled batch's own filter (SGLang's
    `last_batch.filter_batch`, here with the wrong rows kept) and the batch assigned as the running batch."""
    batch = drv.prefill(gf.make_reqs("d", 2, max_new_tokens=40, shared_prefix=gf.SYSTEM_PROMPT))
    batch.filter_batch(keep_indices=[0])
    batch.forward_mode = batch.forward_mode.DECODE  # Scheduler: the prefilled batch turns decode
    drv.batch = batch  # running_batch = last_batch: no hook of its own
    return batch


def _after_a_wave(runtime: Any, model_dir: Path, design: Any = CATCH_UP, mode: Mode | None = None) -> Any:
    """A first wave run to its end: the scheduler's running batch is empty but there (the adapter's running batch),
    so the prefilled batch's filter is not the running batch's and the guard sees the assignment at the next hook on
    the running batch (as on a server: `last_batch.filter_batch` runs before `running_batch = last_batch`)."""
    gf.configure_guard(runtime, design, mode=mode)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), design)
    drv.admit(gf.make_reqs("w", 2, max_new_tokens=4, shared_prefix=gf.SYSTEM_PROMPT))
    drv.run_to_completion()
    assert not drv.batch.reqs
    return drv


def _assert_names_the_dropped_request(exc: SpecFlipViolation) -> None:
    assert exc.invariant == "requests_in_one_place", str(exc)
    assert exc.action == "merge_batch", str(exc)  # the assignment dropped it, not the step that saw it
    assert "request 'd1' is running" in str(exc) and "in neither the running batch nor the prefilled batch" \
        in str(exc), str(exc)
    assert f"merge_batch [{ASSIGNED}]" in str(exc), str(exc)


def test_a_live_request_dropped_from_the_prefilled_batch_is_found_at_its_filter(runtime: Any,
                                                                               model_dir: Path) -> None:
    """Nothing ran yet: the prefilled batch's filter is the first look at the batch that becomes the running one."""
    gf.configure_guard(runtime, CATCH_UP)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir), CATCH_UP)
    batch = drv.prefill(gf.make_reqs("d", 2, max_new_tokens=40, shared_prefix=gf.SYSTEM_PROMPT))
    with pytest.raises(SpecFlipViolation) as excinfo:
        batch.filter_batch(keep_indices=[0])
    assert "around_filter_batch" in {entry.name for entry in excinfo.traceback}, str(excinfo.value)
    _assert_names_the_dropped_request(excinfo.value)


def test_a_live_request_dropped_from_the_prefilled_batch_is_found_at_prepare_for_decode(runtime: Any,
                                                                                       model_dir: Path) -> None:
    """A wave ran before: the first hook on the assigned batch is `prepare_for_decode`, before its forward."""
    drv = _after_a_wave(runtime, model_dir)
    batch = _prefilled_pair(drv)
    with pytest.raises(SpecFlipViolation) as excinfo, h.patch_assign_req_to_token_pool():
        batch.prepare_for_decode()
    assert "after_prepare_for_decode" in {entry.name for entry in excinfo.traceback}, str(excinfo.value)
    _assert_names_the_dropped_request(excinfo.value)


def test_a_live_request_dropped_from_the_prefilled_batch_is_found_at_a_flip(runtime: Any, model_dir: Path) -> None:
    """The switch flips on the assigned batch before anything else looks at it: the flip's look names the drop as the
    assignment's."""
    drv = _after_a_wave(runtime, model_dir, V2_SWITCH)
    _prefilled_pair(drv)
    with pytest.raises(SpecFlipViolation) as excinfo:
        drv.flip_off()
    assert "on_flip" in {entry.name for entry in excinfo.traceback}, str(excinfo.value)
    _assert_names_the_dropped_request(excinfo.value)


def test_in_warn_mode_the_dropped_request_is_counted_and_serving_goes_on(runtime: Any, model_dir: Path) -> None:
    """Warn mode: the drop is counted once, across flips, and the batch that lacks it decodes on."""
    drv = _after_a_wave(runtime, model_dir, mode=Mode.WARN)
    _prefilled_pair(drv)
    for _ in range(3):
        drv.decode()
    drv.flip_off()  # a flip that finds it again ends no episode of it
    drv.decode()
    drv.flip_on()
    drv.decode()
    # one dropped request, one finding: every later step finds it again (an episode, shim/guard/report.py)
    assert runtime.guard.finding_counts == {"requests_in_one_place": 1}
    assert runtime.guard.repeat_counts["requests_in_one_place"] > 0
    gf.configure_guard(runtime, CATCH_UP)


@pytest.mark.parametrize("radix", [False, True], ids=["no_radix", "radix"])
def test_requests_leaving_a_batch_on_purpose_run_clean(runtime: Any, model_dir: Path, radix: bool) -> None:
    """With nothing running, a prefilled batch that leaves out a request done at its prefill (max_new_tokens 1) and
    one whose chunked prefill goes on becomes the running batch; then a request is aborted (finished short of
    max_new_tokens) and one retracted: every one of them leaves a batch live-looking, none is a finding."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    gf.configure_guard(runtime, V2_SWITCH)
    drv = gf.DesignDriver(gf.eagle_pools(model_dir, radix_cache=radix), V2_SWITCH)
    prompt = gf.SYSTEM_PROMPT
    once = h.make_req("once", [*prompt, 301, 302], max_new_tokens=1)
    long = h.make_req("long", [*prompt, *range(400, 460)], max_new_tokens=8)
    reqs = [*gf.make_reqs("k", 3, max_new_tokens=30, shared_prefix=prompt), once, long]
    budget = sum(len(r.origin_input_ids) for r in reqs) - 20  # the last request's prefill is chunked
    drv.admit(reqs, chunk_size=budget)
    assert drv.chunked_req is long and once.finished() and [str(r.rid) for r in drv.batch.reqs] == ["k0", "k1", "k2"]
    drv.decode()
    drv.admit_all([], chunk_size=budget)  # the rest of the chunked request joins the running batch
    assert long in drv.batch.reqs
    reqs[1].to_finish = FINISH_ABORT("aborted by the client")
    drv.decode()
    drv.finish_and_filter()
    assert reqs[1].finished() and reqs[1] not in drv.batch.reqs
    with h.patch_assign_req_to_token_pool():
        retracted, _, aborted = drv.batch.retract_decode()
    assert retracted and not aborted
    drv.decode()
    drv.admit(retracted)
    drv.run_to_completion(60)
    covered = runtime.guard.covered
    assert covered["retract"] == len(retracted) and covered["finish"] == len(reqs)
    assert not runtime.guard.finding_counts and not drv.batch.reqs and gf.pool_accounted(drv.pools)


def test_a_prefill_batch_of_a_middle_chunk_is_not_taken_for_the_running_batch(runtime: Any, model_dir: Path) -> None:
    """SGLang 0.5.23's overlap loop (tests/overlap_loop.py): a wave ends, and the next wave's prefilled batch is
    assigned in place of the emptied running batch, whose object SGLang then drops; the guard's adapter has lost
    track of the running batch. The next prefill runs a middle chunk of a long request only; the iteration after
    filters that prefill batch (its chunked request left out: empty). It held none of the running requests, so it is
    not the running batch dropping them (the guard once took it for that: silently, before `requests_in_one_place`)."""
    ol = importlib.import_module("overlap_loop")
    gf.configure_guard(runtime, V2_SWITCH)
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir), V2_SWITCH)
    drv.add(gf.make_reqs("a", 1, max_new_tokens=3, shared_prefix=gf.SYSTEM_PROMPT))
    drv.run_until_idle()
    drv.chunk_size = 40
    short = gf.make_reqs("c", 1, max_new_tokens=8, shared_prefix=gf.SYSTEM_PROMPT)[0]
    long = h.make_req("long", [*gf.SYSTEM_PROMPT, *range(400, 500)], max_new_tokens=4)
    drv.add([short, long])
    drv.run_until_idle()
    assert short.finished() and long.finished()
    assert not runtime.guard.finding_counts and gf.pool_accounted(drv.pools)
