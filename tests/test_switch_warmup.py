"""The switch's start-up warm-up (shim/switch/warmup.py): its two waves, run through SGLang 0.5.23's real scheduler
objects under the overlap loop with the real switch (tests/overlap_loop.py), do what its docstring says: speculative
decode at every batch size below t_off, a flip off, plain decode, a flip on with requests running, speculative decode
down to 1 again; its requests are SGLang's own GenerateReqInput; the hook names it in a real ServerArgs' --warmups;
and `auto` learns nothing from it."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")
ol = importlib.import_module("overlap_loop")
TimingEventCpuStandIn = importlib.import_module("timing_stand_in").TimingEventCpuStandIn

from shim.releases import release_line  # noqa: E402
from shim.switch import auto as auto_switch  # noqa: E402
from shim.switch import warmup  # noqa: E402
from shim.switch.config import SwitchConfig, SwitchConfigError  # noqa: E402
from statemodel.designs import RETRACT_CATCH_UP  # noqa: E402

pytestmark = pytest.mark.sglang

CONFIG = SwitchConfig(t_off=8, t_on=4, draft_while_off="retract", plain_graphs="decode")


class RecordingRegistry:
    """What `warmup.install` registers (SGLang's HookRegistry is process-wide)."""

    def __init__(self) -> None:
        self.hooks: list[tuple[str, Any, Any]] = []

    def register(self, target: str, fn: Any, kind: Any) -> None:
        self.hooks.append((target, fn, kind))


def _reqs(wave: list[warmup.WarmupRequest]) -> list[Any]:
    return [h.make_req(r.rid, list(range(10, 10 + r.prompt_len)), max_new_tokens=r.max_new_tokens) for r in wave]


def test_the_waves_run_every_speculative_batch_size_and_both_flips(runtime: Any, model_dir: Path) -> None:
    """Outputs greedy-exact, every slot back, the guard (assert mode) finds nothing."""
    gf.configure_guard(runtime, RETRACT_CATCH_UP)
    spec_wave, flip_wave = warmup.warmup_waves(CONFIG)
    assert len(spec_wave) == CONFIG.t_off - 1 and len(flip_wave) == CONFIG.t_off - 1 + 9
    drv = ol.OverlapDriver(ol.overlap_pools(model_dir, kv_size=4096), RETRACT_CATCH_UP, switch_config=CONFIG)
    reqs = _reqs(spec_wave)
    drv.add(reqs)
    drv.run_until_idle()
    assert drv.flips == []  # below t_off: speculation throughout
    assert {len(rids) for _, mode, rids in drv.launched if mode == "spec"} == set(range(1, CONFIG.t_off))
    first = len(drv.launched)
    reqs += _reqs(flip_wave)
    drv.add(reqs[len(spec_wave):])
    drv.run_until_idle()
    assert [action for _, action in drv.flips] == ["flip_off", "flip_on"]
    off_at, on_at = (it for it, _ in drv.flips)
    later = drv.launched[first:]
    plain = {len(rids) for it, mode, rids in later if mode == "plain"}
    assert max(plain) == len(flip_wave) and min(plain) >= CONFIG.t_on
    assert all(off_at <= it <= on_at for it, mode, _ in later if mode == "plain")
    # the flip on found requests running: it retracted them (their re-prefill is the draft's catch-up)
    assert [e["running"] for e in drv.switch.trace.events if e["action"] == "flip_on"] == [CONFIG.t_on]
    assert {len(rids) for it, mode, rids in later if mode == "spec" and it > on_at} == set(range(1, CONFIG.t_on + 1))
    assert runtime.guard.found == [] and gf.pool_accounted(drv.pools)
    assert all(r.finished() and list(r.output_ids) == ol.expected_output(r) for r in reqs)


def test_the_flip_wave_scales_with_the_server_and_keeps_its_plain_phase_short() -> None:
    spec_wave, flip_wave = warmup.warmup_waves(SwitchConfig(t_off=32, t_on=24), max_running=256)
    lengths = sorted(r.max_new_tokens for r in flip_wave)
    assert len(spec_wave) == 31 and [r.max_new_tokens for r in spec_wave] == list(range(4, 66, 2))
    assert len(flip_wave) == 256 and len({r.rid for r in flip_wave}) == 256
    tail = lengths[-24:]  # the requests left when the switch flips on: the longest, one finishing per spec step
    assert tail == list(range(lengths[-25] + warmup.TAIL_MARGIN, lengths[-25] + warmup.TAIL_MARGIN + 48, 2))
    assert lengths[-25] - lengths[0] < warmup.PLAIN_DRAIN_STEPS  # the plain phase: about 64 steps, not 232
    assert len(warmup.warmup_waves(SwitchConfig(t_off=32, t_on=24), max_running=4096)[1]) == warmup.MAX_FLIP_WAVE
    assert len(warmup.warmup_waves(SwitchConfig(t_off=32, t_on=24))[1]) == 40  # no --max-running-requests: t_off + 8
    auto_spec, auto_flip = warmup.warmup_waves(SwitchConfig(t_off=0, t_on=0, auto=True, spec_cap=48))
    assert len(auto_spec) == 48 and len(auto_flip) == 57  # auto: the cap, as its prior flips


def test_switch_warmup_setting() -> None:
    assert SwitchConfig.from_env({"SPECFLIP_SWITCH": "32:24"}).warmup
    assert not SwitchConfig.from_env({"SPECFLIP_SWITCH": "32:24", "SPECFLIP_SWITCH_WARMUP": "off"}).warmup
    with pytest.raises(SwitchConfigError, match="SPECFLIP_SWITCH_WARMUP='later': expected on or off"):
        SwitchConfig.from_env({"SPECFLIP_SWITCH": "32:24", "SPECFLIP_SWITCH_WARMUP": "later"})


def test_install_names_the_warmup_in_a_real_server_args_and_registers_it(model_dir: Path) -> None:
    from sglang.srt.entrypoints import warmup as sglang_warmup
    from sglang.srt.plugins.hook_registry import HookType

    reg = RecordingRegistry()
    assert not warmup.install(reg, SwitchConfig(t_off=32, t_on=24, warmup=False)) and reg.hooks == []
    assert warmup.install(reg, CONFIG)
    assert reg.hooks == [(release_line().warmup_hook_target, warmup.name_warmup, HookType.BEFORE)]
    assert warmup.WARMUP_NAME in sglang_warmup._warmup_registry
    sa = h.make_server_args(model_dir)
    assert sa.warmups is None
    warmup.name_warmup(sa)
    warmup.name_warmup(sa)
    assert sa.warmups == "specflip"
    sa.warmups = "voice_chat"
    warmup.name_warmup(sa)
    assert sa.warmups == "voice_chat,specflip"


def test_a_record_resolved_before_the_hook_starts_without_the_warmup(model_dir: Path, caplog: Any) -> None:
    """A ServerArgs resolved before specflip's hook ran (0.5.23: resolve_once seals it) cannot take the name: one
    warning, the record unchanged, no exception (the server starts; tests/test_release_conformance.py runs the
    launch where the hook does name it)."""
    sa = h.make_server_args(model_dir)
    sa.resolve_once()
    with caplog.at_level("WARNING", logger="specflip.switch"):
        warmup.name_warmup(sa)
    assert sa.warmups is None and "specflip warm-up not named" in caplog.text


def test_a_release_without_custom_warmups_keeps_the_switch(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    """No `sglang.srt.entrypoints.warmup`: one warning, nothing registered, no exception (the plugin goes on to
    install the guard)."""
    import sys

    monkeypatch.setitem(sys.modules, "sglang.srt.entrypoints.warmup", None)  # import fails as if absent
    reg = RecordingRegistry()
    with caplog.at_level("WARNING", logger="specflip.switch"):
        assert not warmup.install(reg, CONFIG)
    assert reg.hooks == [] and "specflip warm-up off: this SGLang has no custom warm-up registry" in caplog.text


class TokenizerManagerCpuStandIn:
    """What cannot run on a CPU here: the tokenizer manager's round trip to a scheduler process. It checks each request
    as SGLang's own normalisation does, and answers at once."""

    class model_config:  # noqa: N801 - the attribute the warm-up reads
        vocab_size = 256

    def __init__(self, refuse_after: int | None = None) -> None:
        self.requests: list[Any] = []
        self.refuse_after = refuse_after  # requests beyond this many are refused, as a full queue refuses them

    async def generate_request(self, obj: Any, request: Any = None) -> Any:
        obj.normalize_batch_and_arguments()
        if self.refuse_after is not None and len(self.requests) >= self.refuse_after:
            raise ValueError("The request queue is full.")
        self.requests.append(obj)
        yield {"meta_info": {"id": obj.rid}}


def test_run_waves_sends_sglangs_own_requests_wave_by_wave() -> None:
    from sglang.srt.managers.io_struct import GenerateReqInput

    tm = TokenizerManagerCpuStandIn()
    waves = warmup.warmup_waves(CONFIG)
    took, failed = asyncio.run(warmup.run_waves(waves, tm))
    assert len(took) == 2 and failed == [] and len(tm.requests) == sum(len(w) for w in waves)
    assert all(isinstance(r, GenerateReqInput) for r in tm.requests)
    assert [r.rid for r in tm.requests] == [r.rid for w in waves for r in w]
    for req, plan in zip(tm.requests, [r for w in waves for r in w], strict=True):
        assert len(req.input_ids) == plan.prompt_len and all(8 <= t < 256 for t in req.input_ids)
        assert req.sampling_params == {"temperature": 0.0, "max_new_tokens": plan.max_new_tokens, "ignore_eos": True}


def _batch(rid: str, mode: str, bs: int) -> Any:
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    batch = ScheduleBatch(reqs=[h.make_req(f"{rid}{i}", [10, 11]) for i in range(bs)], batch_is_full=False)
    batch.forward_mode = ForwardMode.EXTEND if mode == "prefill" else ForwardMode.DECODE
    batch.spec_algorithm = SpeculativeAlgorithm.EAGLE3 if mode == "spec" else SpeculativeAlgorithm.NONE
    return batch


@pytest.mark.parametrize("line", ["v2", "v1"])
def test_the_switch_trace_tags_the_warmups_records(line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record of the warm-up's steps says "warmup", a timing record written after the warm-up ended too (its
    CUDA events complete a step later); nothing after the warm-up does (bench/gpu/summarize.py leaves them out)."""
    import json
    from types import SimpleNamespace

    from shim.switch import v1 as switch_v1
    from shim.switch import v2 as switch_v2
    from shim.switch.policy import SwitchPolicy
    from shim.timing.jsonl import JsonlTrace

    trace = JsonlTrace(str(tmp_path))
    config = SwitchConfig(t_off=8, t_on=4, draft_while_off="retract", plain_graphs="decode", trace_dir=str(tmp_path))
    module = switch_v2 if line == "v2" else switch_v1
    rt = module.SwitchRuntime(config=config, policy=SwitchPolicy(config), trace=trace)
    monkeypatch.setattr(module, "_RUNTIME", rt)

    def forward_cpu_stand_in(scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        return SimpleNamespace(can_run_cuda_graph=False)

    def run_batch(batch: Any) -> None:
        if line == "v2":
            switch_v2._run_batch_around(forward_cpu_stand_in, object(), batch)
        else:
            switch_v1._run_batch_around(forward_cpu_stand_in, object(), batch)

    run_batch(_batch(warmup.WARMUP_RID_PREFIX, "prefill", 2))
    assert trace.tag == {"warmup": True}
    start, end = TimingEventCpuStandIn(), TimingEventCpuStandIn()
    start.record()
    trace.timed(start, end, {"kind": "spec", "bs": 2, "first_after_flip": False})  # the warm-up's step, in flight
    trace.event("flip_off")
    run_batch(_batch("user-", "prefill", 1))
    assert trace.tag == {}
    trace.event("flip_on")
    end.record()  # the step's events complete after the warm-up ended
    trace.drain(force=True)  # and the file flushed
    records = [json.loads(x) for x in Path(trace.path).read_text().splitlines()]
    tagged = [(r["action"], r.get("warmup", False)) for r in records]
    prefills = [("prefill", True), ("prefill", False)] if line == "v2" else []  # v1 traces decode steps only
    assert sorted(tagged) == sorted([*prefills, ("flip_off", True), ("flip_on", False), ("timing", True)])


def test_auto_learns_nothing_from_the_warmup_and_starts_afresh_after_it() -> None:
    """The warm-up's steps are timed with their kernel builds in them: the learner skips them, and what it decided
    on the way (the prior's flips) is forgotten at the first batch after the warm-up."""
    import torch

    t = [0.0]
    auto = auto_switch.AutoSwitch(spec_cap=48, window=2, clock=lambda: t[0])
    fresh = auto.state
    sched = object()
    auto.commit(auto.decide(True, 60, 0))  # the prior flips off above the cap, as in the flip wave
    assert auto.state != fresh
    for mode, bs in [("spec", 4), ("spec", 4), ("plain", 60), ("plain", 60)]:
        auto.on_run_batch(sched, _batch(warmup.WARMUP_RID_PREFIX, mode, bs), 0)
        auto.on_result(_batch(warmup.WARMUP_RID_PREFIX, mode, bs),
                       type("Result", (), {"accept_lens": torch.tensor([9] * bs)})())
        t[0] += 0.5  # a kernel build
    assert auto.warming and auto.pending == [] and auto.accept_rows == 0 and auto.agreements == 0
    auto.on_run_batch(sched, _batch("user-", "prefill", 1), 0)
    assert not auto.warming and auto.state == fresh
    for _ in range(2):
        auto.on_run_batch(sched, _batch("user-", "spec", 1), 0)
        t[0] += 0.006
    # the window (2 decodes) agreed: the one interval between the user's two steps, nothing of the warm-up
    assert auto.pending == [] and auto.agreements == 1 and auto.state.step == 1
    assert auto.state.params == fresh.params  # the defaults, with this switch's window (agree_window 2)


def test_refused_warmup_requests_are_one_warning_and_the_server_starts(caplog: Any) -> None:
    """A server whose admission refuses part of a wave (a small --max-queued-requests): the registered warm-up says
    so in one line and returns; it does not stop the start-up."""
    from sglang.srt.entrypoints import warmup as sglang_warmup

    assert warmup.install(RecordingRegistry(), CONFIG)
    registered = sglang_warmup._warmup_registry[warmup.WARMUP_NAME]
    tm = TokenizerManagerCpuStandIn(refuse_after=10)
    with caplog.at_level("INFO", logger="specflip.switch"):
        asyncio.run(registered("null", tm))
    lines = [r.getMessage() for r in caplog.records if r.name == "specflip.switch"]
    assert len(lines) == 1 and lines[0].startswith("specflip warm-up: 13 of 7 + 16 requests failed (the first: "
                                                   "ValueError: The request queue is full.)")
    caplog.clear()
    with caplog.at_level("INFO", logger="specflip.switch"):
        asyncio.run(registered("null", TokenizerManagerCpuStandIn()))
    assert [r.getMessage() for r in caplog.records][-1].startswith("specflip warm-up: 7 + 16 requests in ")


@pytest.mark.parametrize(("given", "flip_wave"), [(None, 48), (100, 100), (1000, warmup.MAX_FLIP_WAVE)])
def test_the_flip_wave_follows_the_running_cap_the_launch_resolved(model_dir: Path, given: int | None,
                                                                   flip_wave: int) -> None:
    """The registered warm-up sizes its flip wave from the server's running-request cap as the launch resolved it:
    without `--max-running-requests` SGLang's resolution of a speculative launch sets 48 (0.5.23 keeps it in its
    resolution view; the ServerArgs record keeps the operator's None), which the scheduler starts from. Read as the
    HTTP server holds it: the real ServerArgs after `resolve_once`, then published."""
    from sglang.srt.entrypoints import warmup as sglang_warmup

    sa = h.make_server_args(model_dir, speculative_algorithm="EAGLE", max_running_requests=given)
    sa.resolve_once()
    h.publish_server_args(sa)
    assert sa.max_running_requests == given  # the operator's input: None when not given
    assert warmup.install(RecordingRegistry(), CONFIG)
    tm = TokenizerManagerCpuStandIn()
    tm.server_args = sa
    asyncio.run(sglang_warmup._warmup_registry[warmup.WARMUP_NAME]("null", tm))
    spec_wave, flips = warmup.warmup_waves(CONFIG, warmup.launch_running_cap(sa))
    assert len(flips) == flip_wave and len(tm.requests) == len(spec_wave) + flip_wave
