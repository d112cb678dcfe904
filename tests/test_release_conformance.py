"""Release conformance: every SGLang line of scripts/sglang-lines.txt (0.5.12 ... 0.5.23), each on its own real objects
on the CPU, against its module of the release layer (shim/releases/).

One module, two roles:
* in the suite's run (`SPECFLIP_CONFORMANCE_LINE` unset), `test_line_conforms[X]` runs this same module once per line
  in a subprocess: the line's interpreter (.venv, or .venv12 for 0.5.12) with the line's folders of
  .cache/sglang-lines first on PYTHONPATH (scripts/setup-lines.sh installs them) and `SPECFLIP_CONFORMANCE_LINE=X`.
  The lines run two at a time (the machine's cores). A line not installed skips, which fails a CI run
  (marked `sglang`: tests/real_objects_required.py);
* in that subprocess, the checks below run on the line installed there:
  - the installed sglang is the line, and the registry gives its module;
  - every hook target the guard (its adapter's TARGETS), the v2 switch (where the line has the v2 worker), the v1
    switch (where it ships the v1 EAGLEWorker), the warm-up and the step timer register resolves as SGLang's
    HookRegistry resolves it (`pkgutil.resolve_name` of the owner, then `getattr`), and takes the positional
    arguments the hook body reads;
  - the line's module reads a real Req, its KV row and its batch as they are: a real ScheduleBatch over real pools,
    allocator and the tree cache the line's own factory builds, through the real prepare_for_extend and
    prepare_for_decode (plain decode: the speculative one launches a triton kernel, which has no CPU driver);
  - lint's module for the line resolves a real EAGLE launch's ServerArgs and reads its sizing.
No stand-in: nothing here needs a GPU.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from shim.settings import settings

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "scripts" / "sglang-lines.txt"
LINES_DIR = REPO / ".cache" / "sglang-lines"
STAND_INS = REPO / "stand_ins" / "cpu"  # torchvision, imported by SGLang's model configs (import-only stand-in)
ENV = settings.CONFORMANCE_LINE.name
ACTIVE = settings.CONFORMANCE_LINE.raw()


@dataclass(frozen=True)
class LineSetup:
    line: str
    venv: str
    extra: tuple[str, ...]  # name==version, each in .cache/sglang-lines/<name>-<version>

    def folders(self) -> list[Path]:
        return [LINES_DIR / req.replace("==", "-") for req in self.extra]

    def missing(self) -> list[str]:
        python = REPO / self.venv / "bin" / "python"
        script = "scripts/setup-v1.sh" if self.venv == ".venv12" else "scripts/setup.sh"
        gone = [] if python.exists() else [f"{self.venv} (bash {script})"]
        return gone + [f"{f.relative_to(REPO)} (bash scripts/setup-lines.sh)" for f in self.folders()
                       if not (f / ".specflip-installed").exists()]


def read_table() -> list[LineSetup]:
    rows = []
    for text in TABLE.read_text().splitlines():
        fields = text.split()
        if fields and not fields[0].startswith("#"):
            rows.append(LineSetup(fields[0], fields[1], tuple(f for f in fields[2:] if f != "-")))
    return rows


SETUPS = {s.line: s for s in read_table()}


# ------------------------------------------------------------------------------------------------------------------
# The suite's side: one subprocess per line

_RUNS: dict[str, Future[subprocess.CompletedProcess[str]]] = {}
_POOL_LOCK = threading.Lock()


def _run_line(setup: LineSetup) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **{ENV: setup.line})
    env["PYTHONPATH"] = os.pathsep.join([*map(str, setup.folders()), str(STAND_INS), str(REPO)])
    env.pop("SPECFLIP_REQUIRE_SGLANG_V1", None)
    cmd = [str(REPO / setup.venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
           "no:warnings", str(Path(__file__).relative_to(REPO))]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def line_runs(request: pytest.FixtureRequest) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """Starts the selected lines' subprocesses, as many at a time as the machine has cores."""
    selected = [item.callspec.params["line"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_line_conforms" and hasattr(item, "callspec")]
    runnable = [SETUPS[line] for line in selected if not SETUPS[line].missing()]
    with ThreadPoolExecutor(max_workers=max(1, min(len(runnable) or 1, os.cpu_count() or 1))) as pool:
        with _POOL_LOCK:
            for setup in runnable:
                _RUNS[setup.line] = pool.submit(_run_line, setup)
        yield _RUNS


if ACTIVE is None:
    @pytest.mark.sglang
    @pytest.mark.parametrize("line", list(SETUPS))
    def test_line_conforms(line: str, line_runs: dict[str, Future[subprocess.CompletedProcess[str]]]) -> None:
        missing = SETUPS[line].missing()
        if missing:
            pytest.skip(f"SGLang {line} is not installed: {', '.join(missing)}")
        done = line_runs[line].result()
        assert done.returncode == 0, \
            f"SGLang {line}'s conformance run failed:\n{done.stdout[-6000:]}{done.stderr[-3000:]}"


# ------------------------------------------------------------------------------------------------------------------
# The line's side: the checks, on the sglang installed in this process

def _resolve(target: str) -> Any:
    """What SGLang's HookRegistry._apply_target patches: the owner by pkgutil.resolve_name, then the attribute."""
    owner, attr = target.rsplit(".", 1)
    return getattr(pkgutil.resolve_name(owner), attr)


def _required_positionals(hook: Any, how: str) -> int:
    """The positional arguments a hook body reads off the target's call (AROUND's first is the original, AFTER's the
    result; the hook is a bound method or a function taking the target's arguments)."""
    params = [p for p in inspect.signature(hook).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    if params and params[0].name == "self":  # a hook class's method, unbound
        params = params[1:]
    return len(params) - (1 if how in ("AROUND", "AFTER") else 0)


def _takes_positionals(target: Any, count: int) -> bool:
    fn = target.__func__ if inspect.ismethod(target) else target
    try:
        inspect.signature(fn).bind_partial(*range(count))
    except TypeError:
        return False
    return True


def _check_targets(table: list[tuple[str, str, Any]]) -> list[str]:
    bad = []
    for target, how, hook in table:
        try:
            resolved = _resolve(target)
        except (ImportError, AttributeError) as exc:
            bad.append(f"{target}: does not resolve ({type(exc).__name__}: {exc})")
            continue
        if not callable(resolved) or isinstance(resolved, type):
            bad.append(f"{target}: not a function")
        elif hook is not None and not _takes_positionals(resolved, _required_positionals(hook, how)):
            bad.append(f"{target}: takes fewer positional arguments than {hook.__name__} reads")
    return bad


if ACTIVE is not None:
    sys.path.insert(0, str(STAND_INS))

    @pytest.fixture(scope="module")
    def line() -> Any:
        from shim.releases import base_line, installed_release, release_line

        sys.path.insert(0, str(REPO / "tests"))
        __import__("line_imports").import_tp_worker_or_stand_ins()

        installed = installed_release()
        assert base_line(installed or "") == ACTIVE, f"sglang {installed} is installed, not {ACTIVE}"
        return release_line()

    def test_the_registry_gives_the_line(line: Any) -> None:
        assert line.version == ACTIVE
        assert line.adapter().release == ACTIVE

    def test_guard_targets_resolve_with_their_call_shape(line: Any) -> None:
        adapter = line.adapter()
        table = [(t, how, getattr(adapter, hook)) for t, how, hook in adapter.TARGETS]
        assert _check_targets(table) == []

    def test_switch_warmup_and_step_timer_targets_resolve(line: Any) -> None:
        from shim.switch import v1, v2, warmup
        from shim.timing import step_timer

        table: list[tuple[str, str, Any]] = [(line.warmup_hook_target, "BEFORE", warmup.name_warmup),
                                             (step_timer.T_RUN_BATCH, "AROUND", step_timer.StepTimer.around_run_batch),
                                             (step_timer.T_ARRIVAL, "AROUND", step_timer.StepTimer.around_arrival)]
        switch = line.features()["switch"].split()[0]  # "v2", "v1" or "no:"
        if switch == "v2":  # the v2 switch, where the line's switch is it
            table += [(t, "AROUND", None) for t in (v2.T_FORWARD, line.plain_capture_target, v2.T_UPDATE_RUNNING,
                                                    v2.T_ALLOCATABLE, v2.T_NEXT_BATCH, v2.T_RUN_BATCH,
                                                    v2.T_PROCESS_RESULT,
                                                    v2.T_ACTIVATE_STEPS, v2.T_VERIFY_DONE)]
        assert (switch == "v1") == line.ships_v1_worker  # the v1 switch exactly where the v1 EAGLEWorker ships
        if line.ships_v1_worker:
            table += [(t, "AROUND", None) for t in v1.TARGETS]
        assert _check_targets(table) == []

    def test_the_plain_capture_hooks_after_sglang_built_and_captured_its_worker(line: Any, tmp_path: Path) -> None:
        """The v2 switch captures its plain decode graph runner AFTER the release's `plain_capture_target`. SGLang's
        own start-up (the real Scheduler.init_model_worker, the real EAGLEWorkerV2, SGLang's real HookRegistry) must
        reach that target exactly once, with the worker it built, whose target model runner holds its decode graph
        runner where the release says, and after every graph capture SGLang asked of its workers. Stand-ins: the
        target's and the draft's model load and graph capture (a GPU's work), named as such."""
        if line.features()["switch"].split()[0] != "v2":
            pytest.skip(f"SGLang {line.version}'s switch is not the v2 one")
        events = _start_up_with_the_capture_hook(line, tmp_path)
        hooked = [e for e in events if e[0] == "plain capture hook"]
        assert len(hooked) == 1, events
        _, worker, scheduler = hooked[0]
        assert worker is scheduler.draft_worker and type(worker).__name__ == "EAGLEWorkerV2"
        mr = worker.target_worker.model_runner
        assert mr is scheduler.tp_worker.model_runner and isinstance(mr, _model_runner_class())
        assert isinstance(getattr(mr, line.decode_graph_runner_attr), VerifyGraphRunnerCpuStandIn)
        at = events.index(hooked[0])
        # both workers were built (on lines that capture inside the constructors, 0.5.13, that is their capture), and
        # every capture SGLang asked of them afterwards (the scheduler's init_all_cuda_graphs from 0.5.14) came first
        assert {e[1] for e in events[:at] if e[0] == "built"} == {"target", "draft"}, events
        assert all(i < at for i, e in enumerate(events) if e[0] == "capture"), events

    def test_the_plain_path_decodes_on_the_runner_the_real_forward_replays(line: Any) -> None:
        """The switch's plain path (enter_plain_path) puts its plain decode runner where the release says; the line's
        real ModelRunner forward then replays it, not the target's verify graphs, and enter_spec_path puts those
        back. Stand-ins: the two graph runners (a CUDA graph's replay)."""
        if line.features()["switch"].split()[0] != "v2":
            pytest.skip(f"SGLang {line.version}'s switch is not the v2 one")
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        from shim.switch.v2 import JsonlTrace, SwitchConfig, SwitchPolicy, SwitchRuntime
        from shim.switch.v2_flip import enter_plain_path, enter_spec_path

        mr = _model_runner_class().__new__(_model_runner_class())  # the real class; its __init__ loads a model
        verify, plain = VerifyGraphRunnerCpuStandIn(), VerifyGraphRunnerCpuStandIn()
        mr.__dict__.update(device="cuda", attn_backend=object(), hisparse_coordinator=None,
                           spec_algorithm=SpeculativeAlgorithm.EAGLE3, init_new_workspace=False,
                           model=SimpleNamespace(shared_experts_config=None))  # the loaded model: a stand-in
        setattr(mr, line.decode_graph_runner_attr, verify)
        if line.prefill_graph_runner_attr is not None:
            setattr(mr, line.prefill_graph_runner_attr, None)
        fm = SimpleNamespace(spec_algo=SpeculativeAlgorithm.EAGLE3, need_topk=True, need_hidden_states=True,
                             _forward_buf_initialized=True)
        scheduler = SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.EAGLE3, model_worker=None, future_map=fm,
                                    tp_worker=SimpleNamespace(model_runner=mr))
        config = SwitchConfig(t_off=4, t_on=1, draft_while_off="retract", plain_graphs="decode")
        rt = SwitchRuntime(config=config, policy=SwitchPolicy(config), trace=JsonlTrace(None))
        rt.plain_runner = plain
        # a decode step's ForwardBatch, as far as the forward reads it before replaying a graph (a stand-in: a real one
        # holds the model runner's device buffers)
        decode = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=2, moe_num_token_non_padded=None)

        def replayed() -> Any:
            return mr._forward_raw(decode, None).logits_output

        assert replayed() is verify.output  # speculation on: SGLang's own runner
        enter_plain_path(rt, scheduler)
        assert replayed() is plain.output
        enter_spec_path(rt, scheduler)
        assert replayed() is verify.output and getattr(mr, line.decode_graph_runner_attr) is verify
        runner_class = pkgutil.resolve_name(line.decode_graph_runner_class)  # what the plain runner derives from
        assert isinstance(runner_class, type)
        inspect.signature(runner_class).bind(mr, attn_backend=object())

    def test_the_line_reads_a_real_batch(line: Any, tmp_path: Path) -> None:
        objs = _CpuObjects(tmp_path)
        adapter = line.adapter()
        reqs = [objs.req(f"r{i}", list(range(10 + i, 17 + 2 * i))) for i in range(3)]
        assert [line.kv_row(r)[0] for r in reqs] == [None] * 3  # no row before admission
        assert [adapter.req_kv_lens(r)[0] for r in reqs] == [False] * 3
        batch = objs.prefill(reqs)
        lens = [len(r.origin_input_ids) for r in reqs]
        _assert_readings(line, adapter, batch, committed=lens, allocated=lens)
        batch.prepare_for_decode()
        seq = [int(x) for x in batch.seq_lens.tolist()]
        assert seq == [n + 1 for n in lens]
        _assert_readings(line, adapter, batch, committed=None, allocated=seq)
        # the tree the guard hooks is the class this line's factory builds
        tree_hooks = [t for t, _, hook in adapter.TARGETS if hook in ("around_tree_cache_keep", "around_tree_insert")]
        assert tree_hooks and all(_resolve(t.rsplit(".", 1)[0]) in type(objs.tree_cache).__mro__ for t in tree_hooks), \
            (type(objs.tree_cache), tree_hooks)

    def test_the_trees_eviction_frees_inside_the_guards_eviction_target(line: Any, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
        """The guard holds the frees of the tree's eviction and judges them by one scan when its eviction target
        returns (`V2Adapter.around_tree_evict`): every free an eviction makes must happen inside that target. Real
        requests released into the line's own enabled tree (SGLang's release_kv_cache), then evicted through
        SGLang's own `evict_from_tree_cache`, as its alloc path calls it."""
        from sglang.srt.mem_cache import common

        adapter = line.adapter()
        evict = [t for t, how, hook in adapter.TARGETS if hook == "around_tree_evict"]
        if not evict:
            assert not [t for t in adapter.TARGETS if t[2] == "before_allocator_free"], "frees judged, no eviction hook"
            pytest.skip(f"SGLang {line.version}: the guard judges no free by value")
        assert [how for t, how, hook in adapter.TARGETS if hook == "around_tree_evict"] == ["AROUND"]
        objs = _CpuObjects(tmp_path, radix=True)
        owner, _, name = evict[0].rpartition(".")
        cls = _resolve(owner)
        assert cls in type(objs.tree_cache).__mro__, (type(objs.tree_cache), evict[0])
        reqs = [objs.req(f"e{i}", [100 + i, *range(300, 308)]) for i in range(4)]
        objs.prefill(reqs)
        release = common.release_kv_cache
        for req in reqs:
            release(req, objs.tree_cache, **({"checkpoint": True}
                                             if "checkpoint" in inspect.signature(release).parameters else {}))
        kept = int(objs.tree_cache.evictable_size())
        assert kept >= 4 * 8, kept
        inside = [0]
        frees: list[bool] = []
        original = getattr(cls, name)

        def evicting(self: Any, *args: Any, **kwargs: Any) -> Any:
            inside[0] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                inside[0] -= 1

        monkeypatch.setattr(cls, name, evicting)
        allocator_free = objs.allocator.free
        monkeypatch.setattr(objs.allocator, "free",
                            lambda index, *a, **k: (frees.append(inside[0] > 0), allocator_free(index, *a, **k))[1])
        common.evict_from_tree_cache(objs.tree_cache, objs.allocator.available_size() + kept)
        assert int(objs.tree_cache.evictable_size()) == 0
        assert len(frees) >= 4 and all(frees), frees

    def test_launch_with_specflip_names_its_warmup(line: Any, tmp_path: Path) -> None:
        """The launching process of `python -m sglang.launch_server` with specflip's features on (the switch where the
        line offers it, `auto` on the v2 one, `4:2` on the v1 one through the v1 kit's entry point as
        bench/gpu/v1_run.sh installs it; the guard in warn mode; the step timer), run by the line's own code as far as
        a CPU goes (tests/launch_probe.py: load_plugins() through the entry point, prepare_server_args, then
        Engine._launch_subprocesses with its check_server_args and its publication of the config, up to
        PortArgs.init_new): nothing specflip installed stops it, and with the switch on, its warm-up is in the list the
        line's HTTP server will read (as that server reads it: server_args.warmups, or the published config's)."""
        from shim.switch.warmup import WARMUP_NAME

        kind = line.features()["switch"].split()[0]
        switch = kind in ("v1", "v2")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECFLIP_")}
        env.update({settings.MODE.name: "warn", settings.STEP_TIMER.name: str(tmp_path / "steps")})
        # 0.5.16's strict harness: a bare assignment to its resolved ServerArgs raises (as always from 0.5.17 on)
        env["SGLANG_STRICT_CONFIG_MUTATION"] = "1"
        if switch:  # the v1 switch takes thresholds only
            env[settings.SWITCH.name] = "4:2" if kind == "v1" else "auto"
        if kind == "v1":  # bench/gpu/v1_run.sh's entry point, and the variable that selects the v1 EAGLEWorker
            dist = tmp_path / "site" / "specflip_v1-0.1.dist-info"
            dist.mkdir(parents=True)
            (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: specflip-v1\nVersion: 0.1\n")
            (dist / "entry_points.txt").write_text("[sglang.srt.plugins]\nspecflip_v1 = shim.plugin:register_v1\n")
            env.update(PYTHONPATH=os.pathsep.join([str(dist.parent), env.get("PYTHONPATH", "")]),
                       SGLANG_PLUGINS="specflip_v1", SGLANG_ENABLE_SPEC_V2="0")
        model = _CpuObjects.write_model(tmp_path)
        done = subprocess.run([sys.executable, str(REPO / "tests" / "launch_probe.py"), str(model)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=600)
        marked = [t for t in done.stdout.splitlines() if t.startswith("LAUNCH-PROBE ")]
        assert marked, f"the launch probe printed no result:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        result = json.loads(marked[-1].removeprefix("LAUNCH-PROBE "))
        assert "warmups" in result, f"SGLang {ACTIVE}'s launch with specflip did not get to PortArgs.init_new: " \
            + (result.get("error") or f"SystemExit {result.get('exit')}")
        names = (result["warmups"] or "").split(",")
        assert (WARMUP_NAME in names) == switch, (result, switch)

    def test_lint_resolves_a_real_launch(line: Any, tmp_path: Path) -> None:
        model = _CpuObjects.write_model(tmp_path)
        sa = line.build_server_args(["--model-path", str(model), "--speculative-draft-model-path", str(model),
                                     "--device", "cuda", "--speculative-algorithm", "EAGLE",
                                     "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                                     "--speculative-num-draft-tokens", "4", "--max-running-requests", "24"])
        assert [line.launch_value(sa, a) for a in ("speculative_algorithm", "speculative_num_steps",
                                                    "max_running_requests")] == ["EAGLE", 3, 24]
        sizing = line.read_sizing(sa)
        assert (sizing.release, sizing.launch_steps, sizing.launch_draft_tokens) == (ACTIVE, 3, 4)


class VerifyGraphRunnerCpuStandIn:
    """Stand-in for a captured CUDA graph runner (its replay runs CUDA graphs): every batch can run; a replay returns
    this runner's own output object (SGLang's runners answer `can_run`/`replay` up to 0.5.13, then
    `can_run_graph`/`execute`)."""

    def __init__(self) -> None:
        self.output = object()

    def can_run(self, forward_batch: Any) -> bool:
        return True

    can_run_graph = can_run

    def replay(self, forward_batch: Any, **kwargs: Any) -> Any:
        return self.output

    execute = replay


def _model_runner_class() -> type:
    from sglang.srt.model_executor.model_runner import ModelRunner

    return ModelRunner


@contextmanager
def _one_pipeline_stage() -> Iterator[None]:
    """A single pipeline stage, for the lines whose EAGLEWorkerV2 asks whether it is the last stage: a stand-in for
    the pipeline's process group (which needs torch.distributed), where the line reads it (parallel_state's group
    from 0.5.19, runtime_context's get_parallel() on 0.5.23)."""
    from sglang.srt.distributed import parallel_state

    group = SimpleNamespace(is_last_rank=True, is_first_rank=True, world_size=1, rank_in_group=0)
    with contextlib.ExitStack() as stack:
        if getattr(parallel_state, "_PP", False) is None:
            stack.enter_context(pytest.MonkeyPatch.context()).setattr(parallel_state, "_PP", group)
        try:
            from sglang.srt.runtime_context import get_parallel
        except ImportError:
            get_parallel = None
        if get_parallel is not None and hasattr(get_parallel(), "override"):
            stack.enter_context(get_parallel().override(pp_group=group))
        yield


def _recorded(events: list[tuple[Any, ...]], name: str) -> Any:
    """A stand-in's method: records its call (a graph capture when its name says so) and does nothing."""
    def call(*args: Any, **kwargs: Any) -> None:
        events.append(("capture" if "graph" in name else "called", name))
    return call


def _start_up_with_the_capture_hook(line: Any, tmp_path: Path) -> list[tuple[Any, ...]]:
    """SGLang's scheduler start-up, real from `Scheduler.init_model_worker` on, with a recording AFTER hook at the
    release's plain capture target applied by SGLang's own HookRegistry. Stand-ins (named *CpuStandIn) for what loads
    a model and captures CUDA graphs: the target's TpModelWorker and the EagleDraftWorker. Stops where the start-up
    goes on to read the built worker's sizes, or, once the hook has run, at the first thing the stand-ins do not hold
    (0.5.23 goes on to prewarm the sampling on the device). Returns the events in order."""
    import sglang.srt.managers.tp_worker as tp_worker_mod
    import sglang.srt.speculative.eagle_worker_v2 as worker_mod
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    events: list[tuple[Any, ...]] = []
    objs = _CpuObjects(tmp_path)

    class StartUpReadsSizes(Exception):
        """The start-up has built its model worker and goes on to read its sizes: the stand-ins end here."""

    class TargetTpWorkerCpuStandIn:
        """Stand-in for the target's TpModelWorker (loads the model; its ModelRunner captures the verify graphs). Its
        model runner is the real class, built without its __init__, holding a decode graph runner where the release
        says."""

        def __init__(self, **kwargs: Any) -> None:
            self.model_runner = _model_runner_class().__new__(_model_runner_class())
            self.model_runner.__dict__.update(  # its pools exist (lines that allocate them later see it so)
                model_config=objs.model_config, memory_pool_config=SimpleNamespace(),
                req_to_token_pool=objs.req_to_token_pool, token_to_kv_pool_allocator=objs.allocator,
                token_to_kv_pool=SimpleNamespace(post_capture_active=False), device="cpu",
                spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE3"), mtp_draft_device_pools=None)
            self.preloaded_weights_bytes = 0
            self.is_hybrid_swa = False
            setattr(self.model_runner, line.decode_graph_runner_attr, VerifyGraphRunnerCpuStandIn())
            self.model_config = objs.model_config
            events.append(("built", "target"))

        def get_memory_pool(self) -> tuple[Any, Any]:
            return objs.req_to_token_pool, objs.allocator

        def get_worker_info(self) -> Any:
            raise StartUpReadsSizes

        def __getattr__(self, name: str) -> Any:  # what a line's scheduler calls beyond these: recorded, a no-op
            return _recorded(events, f"target.{name}")

    class EagleDraftWorkerCpuStandIn:
        """Stand-in for SGLang's EagleDraftWorker (loads the draft model, captures its CUDA graphs)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.draft_runner = SimpleNamespace(tp_group=None)
            self.draft_attn_backend = self.draft_extend_attn_backend = None
            self.cuda_graph_runner = self.cuda_graph_runner_for_draft_extend = None
            self.preloaded_weights_bytes = 0
            self.draft_parallel_layout = self.hicache_draft_plan = None
            events.append(("built", "draft"))

        def __getattr__(self, name: str) -> Any:  # what a line's worker calls beyond these: recorded, a no-op
            return _recorded(events, f"draft.{name}")

    def probe(result: Any, worker: Any, *args: Any, **kwargs: Any) -> Any:
        events.append(("plain capture hook", worker, scheduler))
        return result

    sa = ServerArgs(model_path=str(_CpuObjects.write_model(tmp_path)), device="cpu", dtype="float32",
                    skip_tokenizer_init=True, speculative_algorithm="EAGLE3",
                    speculative_draft_model_path=str(tmp_path), speculative_num_steps=3,
                    speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    _publish(sa)  # the scheduler's process-wide server args: this EAGLE launch's
    scheduler = Scheduler.__new__(Scheduler)
    scheduler.__dict__.update(server_args=sa, spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE3"),
                              nccl_port=0, gpu_id=0, tp_rank=0, moe_ep_rank=0, pp_rank=0, dp_rank=None,
                              attn_cp_rank=0, moe_dp_rank=0, enable_unified_memory=False)
    scheduler.ps = SimpleNamespace(**{k: scheduler.__dict__[k] for k in (
        "gpu_id", "tp_rank", "moe_ep_rank", "pp_rank", "dp_rank", "attn_cp_rank", "moe_dp_rank")})
    saved = (dict(HookRegistry._hooks), set(HookRegistry._patched))
    owner_name, attr = line.plain_capture_target.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_name)
    original = owner.__dict__[attr]
    try:
        HookRegistry.reset()
        HookRegistry.register(line.plain_capture_target, probe, HookType.AFTER)
        HookRegistry.apply_hooks()
        assert line.plain_capture_target in HookRegistry._patched, "SGLang's HookRegistry did not apply the hook"
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(tp_worker_mod, "TpModelWorker", TargetTpWorkerCpuStandIn)
            mp.setattr(worker_mod, "EagleDraftWorker", EagleDraftWorkerCpuStandIn)
            try:
                with _one_pipeline_stage():
                    scheduler.init_model_worker()
            except StartUpReadsSizes:
                pass
            except Exception as exc:  # past the hook, the start-up reads what the stand-ins do not hold: stop there
                if not any(e[0] == "plain capture hook" for e in events):
                    raise
                events.append(("stopped past the hook", f"{type(exc).__name__}: {exc}"))
    finally:
        setattr(owner, attr, original)
        HookRegistry.reset()
        HookRegistry._hooks.update(saved[0])
        HookRegistry._patched.update(saved[1])
    return events


def _assert_readings(line: Any, adapter: Any, batch: Any, *, committed: list[int] | None,
                     allocated: list[int]) -> None:
    """The line's readings of each request against the batch: the row is the batch's req_pool_indices entry, the
    allocated length its seq_lens entry, the committed length at most that (and `committed` where given); the guard's
    adapter and the switches' kv_row read the same."""
    rows = [int(x) for x in batch.req_pool_indices.tolist()]
    for i, req in enumerate(batch.reqs):
        row, kv_committed, kv_allocated = line.kv_row(req)
        held, g_committed, g_allocated, protected = adapter.req_kv_lens(req)
        assert (row, kv_allocated) == (rows[i], allocated[i]), req.rid
        assert held and adapter.req_row(req) == rows[i] and (g_committed, g_allocated) == (kv_committed, kv_allocated)
        assert kv_committed <= kv_allocated and protected == 0
        if committed is not None:
            assert kv_committed == committed[i]


class _CpuObjects:
    """A scheduler's memory objects for a tiny llama, built with the installed line's own constructors (keyword
    arguments a line does not take are left out: the lines add fields over time)."""

    TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "torch_dtype": "float32"}

    @classmethod
    def write_model(cls, directory: Path) -> Path:
        (directory / "config.json").write_text(json.dumps(cls.TINY))
        return directory

    def __init__(self, tmp_path: Path, *, radix: bool = False) -> None:
        import torch
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        sa = ServerArgs(model_path=str(self.write_model(tmp_path)), device="cpu", dtype="float32",
                        attention_backend="torch_native", skip_tokenizer_init=True, disable_cuda_graph=True,
                        disable_overlap_schedule=True, disable_radix_cache=not radix, max_running_requests=8,
                        page_size=1, random_seed=0)
        _publish(sa)
        self.server_args = sa
        self.model_config = ModelConfig.from_server_args(sa)
        self.spec_algorithm = SpeculativeAlgorithm.from_string(None)
        self.req_to_token_pool = ReqToTokenPool(size=8, max_context_len=self.model_config.context_len + 32,
                                                device="cpu", enable_memory_saver=False)
        kv = MHATokenToKVPool(**_accepted(MHATokenToKVPool, size=256, page_size=1, dtype=torch.float32,
                                          head_num=self.model_config.get_num_kv_heads(1),
                                          head_dim=self.model_config.head_dim,
                                          layer_num=self.model_config.num_hidden_layers, device="cpu",
                                          enable_memory_saver=False))
        self.allocator = TokenToKVPoolAllocator(**_accepted(TokenToKVPoolAllocator, size=256, dtype=torch.float32,
                                                            device="cpu", kvcache=kv, need_sort=False))
        params = CacheInitParams(**_accepted(CacheInitParams, disable=not radix,
                                             req_to_token_pool=self.req_to_token_pool,
                                             token_to_kv_pool_allocator=self.allocator, page_size=1, is_eagle=False,
                                             chunked_prefill_size=sa.chunked_prefill_size))
        self.tree_cache = _tree_cache(sa, params, self.model_config)

    def req(self, rid: str, ids: list[int]) -> Any:
        from array import array

        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        params = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)
        params.normalize(None)
        params.verify(self.TINY["vocab_size"])
        req = Req(rid, "", list(ids), params, vocab_size=self.TINY["vocab_size"])
        if isinstance(req.output_ids, array):  # lines that keep token ids in arrays take the prompt as one too
            req = Req(rid, "", array("q", ids), params, vocab_size=self.TINY["vocab_size"])
        return req

    def prefill(self, reqs: list[Any]) -> Any:
        """PrefillAdder's admission of whole prompts (the tree match, the extend range where the line keeps one),
        ScheduleBatch.init_new and the real prepare_for_extend."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        for req in reqs:
            req.init_next_round_input(self.tree_cache)
            full = len(req.origin_input_ids)
            if hasattr(req, "set_extend_range"):  # PrefillAdder sets the range it admits
                req.set_extend_range(len(req.prefix_indices), full)
            elif hasattr(req, "extend_end"):
                req.extend_end = full
            elif hasattr(req, "fill_len"):  # 0.5.13, 0.5.14: PrefillAdder's fill_len
                req.fill_len = len(req.prefix_indices) + req.extend_input_len
        batch = ScheduleBatch.init_new(reqs, self.req_to_token_pool, self.allocator, self.tree_cache,
                                       self.model_config, enable_overlap=False, spec_algorithm=self.spec_algorithm)
        batch.prepare_for_extend()
        # the prefill's sampled token, as the result processing appends it
        for req in reqs:
            req.output_ids.append(1)
        batch.output_ids = __import__("torch").ones(len(reqs), dtype=__import__("torch").int64)
        return batch


def _accepted(cls: Any, **kwargs: Any) -> dict[str, Any]:
    names = inspect.signature(cls).parameters
    return {k: v for k, v in kwargs.items() if k in names}


def _publish(server_args: Any) -> None:
    """The scheduler's process-wide server args, where the line keeps them (runtime_context from 0.5.17)."""
    from sglang.srt import server_args as sa_mod

    try:
        from sglang.srt import runtime_context
    except ImportError:
        runtime_context = None
    if runtime_context is not None and hasattr(runtime_context, "publish"):
        runtime_context.publish(server_args, role="scheduler")
    else:
        sa_mod.set_global_server_args_for_scheduler(server_args)


def _tree_cache(server_args: Any, params: Any, model_config: Any) -> Any:
    """The tree class the line's own factory builds for a server with the radix cache on (mem_cache/registry, from
    0.5.13; else RadixCache), its content disabled (`params.disable`)."""
    try:
        from sglang.srt.mem_cache.registry import TreeCacheBuildContext, default_radix_cache_factory
    except ImportError:
        from sglang.srt.mem_cache.radix_cache import RadixCache

        return RadixCache(params)
    ctx = TreeCacheBuildContext(**_accepted(
        TreeCacheBuildContext, server_args=server_args, params=params, is_hybrid_swa=False, is_hybrid_ssm=False,
        enable_hierarchical_cache=False, disable_radix_cache=False, effective_chunked_prefill_size=None, tp_worker=None,
        model_config=model_config, tp_size=1, tp_rank=0, tp_group=None, full_tokens_per_layer=None, is_dsa=False))
    return default_radix_cache_factory(ctx)
