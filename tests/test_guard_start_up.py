"""The guard is never silently absent when asked for: whether it checks a server is decided at the scheduler's
start-up (the 0.5.23 adapter's hook BEFORE SGLang's real `Scheduler.init_model_worker`, installed by SGLang's own
`load_plugins()` and HookRegistry), not at the first step. A configuration the model does not describe stops start-up
in assert mode with one line; in warn mode the server starts, with one line and `specflip_guard_checking{tp_rank} 0`
in the Prometheus registry SGLang's `/metrics` serves (shim/guard/metrics.py). The server arguments are real 0.5.23
ServerArgs; the model worker's build is a stand-in (it loads weights), named so, that records when it ran.

The hook reads the server arguments where SGLang has them at that point on every line: the Scheduler's own
(`Scheduler.__init__` sets `self.server_args` before `self.init_model_worker()`; each line's source is read below).
Nothing is published first: 0.5.12 ... 0.5.16 publish the global server arguments only inside the model worker's
build (0.5.16: ModelRunner.__init__, model_runner.py:311), so at this hook there are none (the H200 run of 0943833
with SGLang 0.5.16 and `--page-size 16`: assert mode served, the guard turned itself off only at the first step, and
/metrics had no specflip gauge, because the hook read the published ones). Each start-up here runs with SGLang's
published context cleared (`nothing_published`)."""

from __future__ import annotations

import importlib
import logging
import os
import re
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

h = importlib.import_module("sglang_cpu")

from shim.guard.core import Mode  # noqa: E402

pytestmark = pytest.mark.sglang
REPO = Path(__file__).resolve().parents[1]
CHECKING = "specflip_guard_checking"


class ModelWorkerBuilt(Exception):
    """Raised by the stand-in for the model worker's build: start-up went on past the guard's decision."""


class WithMetrics:
    """The real ServerArgs as `--enable-metrics` resolves it (0.5.23's record is read-only once resolved)."""

    def __init__(self, sa: Any) -> None:
        self._sa = sa
        self.enable_metrics = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sa, name)


@pytest.fixture()
def nothing_published() -> Iterator[None]:
    """SGLang's process-wide published config cleared, as a 0.5.12 ... 0.5.16 scheduler process has it before its
    model worker is built (the adapter's `server_args()` then reads nothing); put back as it was afterwards."""
    from sglang.srt.runtime_context import reset_context, restore_context, snapshot_context

    state = snapshot_context()
    reset_context()
    yield
    restore_context(state)


@pytest.fixture()
def fresh(runtime: Any, nothing_published: None) -> Iterator[Any]:
    """The installed runtime as a fresh scheduler process has it: nothing decided, no metrics, no guard built,
    nothing published."""
    def clear() -> None:
        runtime.reset()
        runtime.disabled_reason, runtime.decided, runtime.metrics, runtime.rank = None, False, None, None
    clear()
    yield runtime
    runtime.mode = Mode.ASSERT
    clear()


def start_up(runtime: Any, sa: Any) -> list[Any]:
    """SGLang's real `Scheduler.init_model_worker` (hooked) on a scheduler whose server arguments are `sa` (set as
    `Scheduler.__init__` sets them before it calls `init_model_worker`), up to the model worker's build (a stand-in
    that records the guard's state when it is reached, then stops start-up there). Returns what the stand-in
    recorded (empty: never reached)."""
    from sglang.srt.managers.scheduler import Scheduler

    seen: list[Any] = []

    def init_tp_model_worker_cpu_stand_in() -> None:
        seen.append((runtime.active, runtime.disabled_reason))
        raise ModelWorkerBuilt

    scheduler = Scheduler.__new__(Scheduler)
    scheduler.server_args = sa  # Scheduler.__init__'s `self.server_args = server_args`
    scheduler.init_tp_model_worker = init_tp_model_worker_cpu_stand_in
    with pytest.raises(ModelWorkerBuilt):
        scheduler.init_model_worker()
    return seen


def gauge(rank: str = "0") -> float | None:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(CHECKING, {"tp_rank": rank})


def gauge_at_1() -> None:
    """The rank-0 gauge set to 1 in the process-wide registry (an earlier test may have left it at 0), so a 0 read
    afterwards was written by the code under test."""
    from shim.guard.metrics import GuardMetrics

    GuardMetrics(0).set_checking(True)
    assert gauge() == 1


@pytest.mark.parametrize(("setting", "kwargs", "named"), [
    ("page size", {"page_size": 16}, "page_size 16 (--page-size;"),
    ("topk", {"topk": 2, "num_draft_tokens": 6}, "speculative_eagle_topk 2 (--speculative-eagle-topk;"),
])
def test_assert_mode_stops_start_up_before_the_model_loads_with_one_line(
        fresh: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch, setting: str, kwargs: dict[str, Any],
        named: str) -> None:
    sa = h.make_server_args(model_dir, speculative_algorithm="EAGLE", **kwargs)
    monkeypatch.delenv("SPECFLIP_ON_BAD_CONFIG", raising=False)
    with pytest.raises(SystemExit) as stop:
        start_up(fresh, sa)
    line = str(stop.value.code)
    assert "\n" not in line and line.startswith("specflip: SPECFLIP_MODE=assert asks for a guard that stops faults, "
                                                "but the guard does not check this server: sglang 0.5.23: ")
    assert named in line  # the setting at fault, and what to do
    assert "Change that setting, or set SPECFLIP_MODE=warn to serve without the guard's checks, or " \
           "SPECFLIP_MODE=off" in line


def test_the_scheduler_decides_on_what_resolution_chose(fresh: Any, model_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """EAGLE3 without the `--speculative-*` flags: 0.5.23's resolution picks an EAGLE tree (topk > 1) and keeps it
    beside the record, which still reads the flags as unset; the Scheduler's arguments arrive so (pickled, the
    resolution with them). The start-up hook decides on the resolved values (`V2Adapter.launch_view`)."""
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(model_path=str(model_dir), device="cpu", dtype="float32", attention_backend="torch_native",
                    skip_tokenizer_init=True, speculative_algorithm="EAGLE3",
                    speculative_draft_model_path=str(model_dir))
    sa.resolve_once()  # what Engine._launch_subprocesses runs first
    topk = resolving_view(sa).speculative_eagle_topk
    assert sa.speculative_eagle_topk is None and topk > 1  # the record unset, resolution's choice a tree
    monkeypatch.delenv("SPECFLIP_ON_BAD_CONFIG", raising=False)
    with pytest.raises(SystemExit) as stop:
        start_up(fresh, sa)
    assert f"sglang 0.5.23: speculative_eagle_topk {topk} (--speculative-eagle-topk;" in str(stop.value.code)


def test_assert_mode_with_on_bad_config_warn_serves_without_the_guard(
        fresh: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """SPECFLIP_ON_BAD_CONFIG=warn, the opt-out of every start-up stop, holds here too: one error line, then the
    guard is off (decided before the model worker is built) and serving goes on."""
    monkeypatch.setenv("SPECFLIP_ON_BAD_CONFIG", "warn")
    sa = h.make_server_args(model_dir, speculative_algorithm="EAGLE", page_size=16)
    with caplog.at_level(logging.WARNING, logger="specflip.guard"):
        seen = start_up(fresh, sa)
    assert seen == [(False, "sglang 0.5.23: page_size 16 (--page-size; the model counts KV in single slots; "
                            "supported: 1)")]
    ours = [r for r in caplog.records if r.name == "specflip.guard"]
    assert len(ours) == 1 and ours[0].levelno == logging.ERROR  # one line: the opt-out's, not a second warning
    assert ours[0].getMessage().startswith("specflip guard off: SPECFLIP_MODE=assert asks for a guard")


def test_warn_mode_serves_on_with_one_line_and_the_gauge_at_0(
        fresh: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    fresh.mode = Mode.WARN
    sa = WithMetrics(h.make_server_args(model_dir, speculative_algorithm="EAGLE", page_size=16))
    gauge_at_1()
    with caplog.at_level(logging.WARNING, logger="specflip.guard"):
        seen = start_up(fresh, sa)
    assert seen and seen[0][0] is False  # off before the model worker was built: decided at start-up
    lines = [r.getMessage() for r in caplog.records if "specflip guard off" in r.getMessage()]
    assert lines == ["specflip guard off on TP rank 0: sglang 0.5.23: page_size 16 (--page-size; the model counts KV "
                     "in single slots; supported: 1) (SPECFLIP_MODE=warn: serving goes on without the guard's "
                     f"checks; /metrics: {CHECKING} 0)"]
    assert gauge() == 0
    # the first step's hooks pass through: no guard is built, no second line
    assert fresh.adapter.guard() is None and fresh.guard is None


def test_a_supported_server_exports_checking_1_until_the_guard_turns_itself_off(
        fresh: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh.mode = Mode.WARN
    sa = WithMetrics(h.make_server_args(model_dir, speculative_algorithm="EAGLE"))
    seen = start_up(fresh, sa)
    assert seen == [(True, None)] and gauge() == 1
    monkeypatch.setattr(fresh.adapter, "server_args", published_by_the_model_worker_cpu_stand_in(sa))
    guard = fresh.adapter.guard()  # built at the first step: it counts into the same rank's metrics
    assert guard is not None and guard.metrics is fresh.metrics
    fresh.disable("internal error (logged above)")  # what GuardRuntime.run does with an error inside the guard
    assert gauge() == 0


def published_by_the_model_worker_cpu_stand_in(sa: Any) -> Any:
    """The adapter's `server_args()` once the model worker's build (weights, a GPU's: skipped here) has published
    `sa` (0.5.12 ... 0.5.16 publish in ModelRunner.__init__); `sa` carries --enable-metrics, which 0.5.23's read-only
    record cannot take after resolution, so it is not published through SGLang's own `publish` here."""
    return lambda: sa


@pytest.mark.parametrize("mode", [Mode.ASSERT, Mode.WARN])
def test_the_first_step_turns_the_guard_off_with_the_gauge_at_0_where_start_up_decided_nothing(
        fresh: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        mode: Mode) -> None:
    """The fallback where the start-up hook decided nothing in this process (it did not run: a guard installed after
    the scheduler was built, batches driven directly): the first step meets the unsupported configuration, turns the
    guard off with one line that says serving goes on (assert mode included: start-up is over) and, with
    --enable-metrics, exports `specflip_guard_checking 0` (before: no gauge at all)."""
    fresh.mode = mode
    sa = WithMetrics(h.make_server_args(model_dir, speculative_algorithm="EAGLE", page_size=16))
    monkeypatch.setattr(fresh.adapter, "server_args", published_by_the_model_worker_cpu_stand_in(sa))
    gauge_at_1()
    with caplog.at_level(logging.WARNING, logger="specflip.guard"):
        assert fresh.adapter.guard() is None and fresh.guard is None
    lines = [r.getMessage() for r in caplog.records if r.name == "specflip.guard"]
    assert lines == ["specflip guard off on TP rank 0: sglang 0.5.23: page_size 16 (--page-size; the model counts KV "
                     f"in single slots; supported: 1) (SPECFLIP_MODE={mode.value}: serving goes on without the "
                     f"guard's checks; /metrics: {CHECKING} 0)"]
    assert gauge() == 0 and not fresh.active


def published_resolved(model_dir: Path, **spec: Any) -> Any:
    """A real 0.5.23 ServerArgs for an EAGLE launch with `spec`, resolved (`resolve_once`, what
    Engine._launch_subprocesses runs first) and published through SGLang's own `runtime_context.publish`, as the
    scheduler process does before it builds the Scheduler (0.5.17 on): what the adapter's `server_args()` reads at the
    first step."""
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(model_path=str(model_dir), device="cpu", dtype="float32", attention_backend="torch_native",
                    skip_tokenizer_init=True, speculative_draft_model_path=str(model_dir), **spec)
    sa.resolve_once()
    h.publish_server_args(sa)
    assert runtime_context.get_server_args() is sa  # the record, not resolution's view
    return sa


def test_the_first_step_scopes_the_guard_by_the_server_args_as_sglang_resolved_them(
        fresh: Any, model_dir: Path) -> None:
    """No --max-running-requests, no --chunked-prefill-size, a CPU launch: 0.5.23's record keeps them as given (None,
    None, the overlap schedule on) and its resolution's view says 48 requests, 4096-token chunks and the normal loop
    (the overlap schedule is not implemented for speculation on the CPU). The guard built at the first step read the
    record: no cap, unbounded chunks and the overlap loop's design, a guard of another server."""
    from sglang.srt import runtime_context
    from sglang.srt.arg_groups.overrides import resolving_view

    sa = published_resolved(model_dir, speculative_algorithm="EAGLE", speculative_num_steps=3,
                            speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    view = resolving_view(sa)
    assert (sa.max_running_requests, sa.chunked_prefill_size, sa.disable_overlap_schedule) == (None, None, False)
    assert (view.max_running_requests, view.chunked_prefill_size, view.disable_overlap_schedule) == (48, 4096, True)
    guard = fresh.adapter.guard()
    assert guard is not None
    scope = guard.config.scope
    assert (scope.plain_cap, scope.chunk_size, scope.overlap) == (48, 4096, False)
    schedule = runtime_context.get_schedule()  # what the Scheduler reads (`enable_overlap`, its chunk and its cap)
    assert (schedule.max_running_requests, schedule.chunked_prefill_size, schedule.disable_overlap_schedule) == \
        (48, 4096, True)
    assert scope.spec_cap <= 48 and not guard.config.design.name.endswith("_overlap")


def test_the_first_step_turns_the_guard_off_for_what_resolution_chose(
        fresh: Any, model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """EAGLE3 without the chain's flags, where the start-up hook did not run: resolution's EAGLE tree (topk > 1) turns
    the guard off at the first step with one line; reading the record (topk unset), the guard was built for it."""
    from sglang.srt.arg_groups.overrides import resolving_view

    sa = published_resolved(model_dir, speculative_algorithm="EAGLE3")
    topk = resolving_view(sa).speculative_eagle_topk
    assert sa.speculative_eagle_topk is None and topk > 1
    with caplog.at_level(logging.WARNING, logger="specflip.guard"):
        assert fresh.adapter.guard() is None and fresh.guard is None
    lines = [r.getMessage() for r in caplog.records if r.name == "specflip.guard"]
    assert len(lines) == 1 and f"sglang 0.5.23: speculative_eagle_topk {topk} (--speculative-eagle-topk;" in lines[0]


def _line_scheduler_source(line: str) -> Path | None:
    """SGLang `line`'s managers/scheduler.py as the release conformance run installs the line
    (scripts/sglang-lines.txt: its own folder of .cache/sglang-lines, else its venv's sglang); None: not installed."""
    from test_release_conformance import SETUPS

    setup = SETUPS[line]
    roots = [f for f in setup.folders() if f.name.startswith("sglang-")] or \
        sorted((REPO / setup.venv / "lib").glob("python3*/site-packages"))
    for root in roots:
        path = root / "sglang" / "srt" / "managers" / "scheduler.py"
        if path.exists():
            return path
    return None


def _lines() -> list[str]:
    from test_release_conformance import SETUPS

    return list(SETUPS)


@pytest.mark.parametrize("line", _lines())
def test_every_lines_scheduler_has_its_server_args_before_the_start_up_hook(line: str) -> None:
    """What the start-up hook reads (`V2Adapter.scheduler_server_args`): in each line's `Scheduler.__init__`,
    `self.server_args = server_args` runs unconditionally before `self.init_model_worker()` (the hooked call)."""
    import ast

    path = _line_scheduler_source(line)
    if path is None:
        pytest.skip(f"SGLang {line} is not installed (bash scripts/setup-lines.sh)")
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    sets = [st.lineno for st in init.body if isinstance(st, ast.Assign) and ast.unparse(st) ==
            "self.server_args = server_args"]  # a statement of __init__'s own body: not inside a branch
    calls = [n.lineno for n in ast.walk(init) if isinstance(n, ast.Call) and ast.unparse(n.func) ==
             "self.init_model_worker"]
    assert sets and calls and sets[0] < min(calls), (path, sets, calls)


def test_hook_targets_missing_stop_start_up_in_assert_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """A guard asked to stop faults that cannot be installed (a hook target this SGLang lacks) stops start-up at
    `load_plugins()` with one line, instead of one warning and a server without it."""
    import shim.guard.runtime as runtime_mod
    from shim import plugin
    from shim.releases import release_line

    adapter_class = type(release_line().adapter())
    monkeypatch.setattr(runtime_mod, "_RUNTIME", None)  # a fresh process: no guard registered yet
    monkeypatch.setattr(adapter_class, "TARGETS",
                        (("sglang.srt.managers.scheduler.Scheduler.no_such_method", "BEFORE", "before_draft"),))
    monkeypatch.setenv("SPECFLIP_MODE", "assert")
    monkeypatch.delenv("SPECFLIP_ON_BAD_CONFIG", raising=False)
    with pytest.raises(SystemExit) as stop:
        plugin.register_guard()
    line = str(stop.value.code)
    assert "\n" not in line and "SPECFLIP_MODE=assert asks for the guard, which cannot be installed: sglang 0.5.23: " \
        "hook targets not found: sglang.srt.managers.scheduler.Scheduler.no_such_method (AttributeError)" in line
    assert "Set SPECFLIP_MODE=warn to serve without the guard's checks, or SPECFLIP_MODE=off" in line
    assert runtime_mod.current() is None
    monkeypatch.setenv("SPECFLIP_MODE", "warn")  # warn mode: one warning, no guard, start-up goes on
    plugin.register_guard()
    assert runtime_mod.current() is None


SCHEDULER_SCRIPT = textwrap.dedent("""
    import multiprocessing, os, sys, tempfile
    from pathlib import Path
    sys.path[:0] = ["tests", "stand_ins/cpu"]
    import importlib
    import sglang.srt.plugins as plugins
    gf = importlib.import_module("guard_fixtures")
    import sglang_cpu as h
    gf._install_gpu_stand_ins()
    plugins.load_plugins()  # the guard through SGLang's entry point, its mode from SPECFLIP_MODE
    import shim.guard.runtime as r
    from sglang.srt.managers.scheduler import Scheduler
    from prometheus_client import REGISTRY

    class WithMetrics:  # the real ServerArgs as --enable-metrics resolves it (0.5.23's is read-only once resolved)
        def __init__(self, sa):
            self._sa, self.enable_metrics = sa, True

        def __getattr__(self, name):
            return getattr(self._sa, name)

    sa = WithMetrics(h.make_server_args(h.write_tiny_model_config(Path(tempfile.mkdtemp())),
                                        speculative_algorithm="EAGLE", page_size=16))
    # nothing published, as 0.5.12 ... 0.5.16 have it here (they publish inside the model worker's build)
    print("PUBLISHED", r.current().adapter.server_args(), flush=True)

    def model_worker_cpu_stand_in():
        print("MODEL WORKER BUILT", r.current().active,
              REGISTRY.get_sample_value("specflip_guard_checking", {"tp_rank": "0"}), flush=True)
        sys.exit(0)

    scheduler = Scheduler.__new__(Scheduler)
    scheduler.server_args = sa  # Scheduler.__init__'s, before it calls init_model_worker
    scheduler.init_tp_model_worker = model_worker_cpu_stand_in
    # a scheduler process as SGLang starts one (multiprocessing), its start-up up to the model worker's build
    proc = multiprocessing.get_context("fork").Process(target=scheduler.init_model_worker)
    proc.start()
    proc.join()
    print("EXIT", proc.exitcode, flush=True)
""")


def run_scheduler_process(line: str, mode: str, script: str = SCHEDULER_SCRIPT, args: tuple[str, ...] = (),
                          env: dict[str, str] | None = None,
                          path: tuple[Path, ...] = ()) -> subprocess.CompletedProcess[str]:
    """`script` (default SCHEDULER_SCRIPT) with `args` on SGLang `line` as the release conformance run installs it
    (its interpreter, its folders of .cache/sglang-lines first on PYTHONPATH, after `path`), the guard in `mode`, and
    `env` besides; skips where the line is not installed."""
    from test_release_conformance import SETUPS, STAND_INS

    setup = SETUPS[line]
    if setup.missing():
        pytest.skip(f"SGLang {line} is not installed: {', '.join(setup.missing())}")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SPECFLIP_")}, "SPECFLIP_MODE": mode,
           "PYTHONPATH": os.pathsep.join([*map(str, path), *map(str, setup.folders()), str(STAND_INS), str(REPO)]),
           **(env or {})}
    return subprocess.run([str(REPO / setup.venv / "bin" / "python"), "-c", script, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


# 0.5.16: the GPU host's line, which publishes its server arguments only inside the model worker's build; 0.5.23: the
# development venv's, which publishes them before the Scheduler is built (not done here: the same order as 0.5.16)
@pytest.mark.parametrize("line", ["0.5.16", "0.5.23"])
def test_the_scheduler_process_ends_with_the_one_line_and_no_traceback(line: str) -> None:
    """In a scheduler process (a multiprocessing child, as SGLang starts one) on the line's real (hooked)
    `Scheduler.init_model_worker`, nothing published: the stop is a SystemExit that SGLang's `run_scheduler_process`
    does not catch (it catches Exception): the process writes the one line and exits 1 (its launcher then reports
    the scheduler died during initialization), before the model worker is built."""
    out = run_scheduler_process(line, "assert")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "PUBLISHED None" in out.stdout, out.stdout
    assert "EXIT 1" in out.stdout and "MODEL WORKER BUILT" not in out.stdout, out.stdout
    ours = [line for line in out.stderr.splitlines() if "specflip" in line and "guard on" not in line]
    assert len(ours) == 1 and ours[0].startswith("specflip: SPECFLIP_MODE=assert asks for a guard that stops faults")
    assert f"sglang {line}: page_size 16" in ours[0] and "Traceback" not in out.stderr


@pytest.mark.parametrize("line", ["0.5.16", "0.5.23"])
def test_the_scheduler_process_in_warn_mode_starts_with_the_gauge_at_0(line: str) -> None:
    """Warn mode with --enable-metrics, the same scheduler process: the model worker is built (start-up goes on),
    the guard is already off then, and prometheus_client's registry (what SGLang's /metrics serves) has
    `specflip_guard_checking{tp_rank="0"} 0`; one line, no traceback."""
    out = run_scheduler_process(line, "warn")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "PUBLISHED None" in out.stdout and "EXIT 0" in out.stdout, out.stdout
    assert "MODEL WORKER BUILT False 0.0" in out.stdout, out.stdout
    assert "Traceback" not in out.stderr, out.stderr[-3000:]


# --- the launching process: the stop before any scheduler process starts ------------------------------------------

LAUNCH_SCRIPT = textwrap.dedent("""
    import os, sys, tempfile
    from pathlib import Path
    sys.path[:0] = ["tests", "stand_ins/cpu"]
    __import__("line_imports").import_tp_worker_or_stand_ins()
    import sglang_cpu as h
    from sglang.srt.plugins import load_plugins
    load_plugins()  # what launch_server.py's main, `sglang serve` and Engine.__init__ do first
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.server_args import prepare_server_args

    def scheduler_processes_cpu_stand_in(*args, **kwargs):  # a GPU's model load: the launch got this far
        print("SCHEDULER PROCESSES STARTED", flush=True)
        os._exit(0)

    Engine._launch_scheduler_processes = classmethod(scheduler_processes_cpu_stand_in)
    model = str(h.write_tiny_model_config(Path(tempfile.mkdtemp())))
    server_args = prepare_server_args(["--model-path", model, "--device", "cpu", "--dtype", "float32",
                                       "--attention-backend", "torch_native", "--skip-tokenizer-init",
                                       "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", model,
                                       *sys.argv[1:]])  # launch_server.py: prepare_server_args(sys.argv[1:])
    # http_server.launch_server's call (its module's imports need more than the CPU venvs hold): SGLang's launch up to
    # its scheduler processes, check_server_args included
    Engine._launch_subprocesses(server_args, None, None, None)
    print("LAUNCH RETURNED", flush=True)
""")
CHAIN = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")


def launch(line: str, mode: str, *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """SGLang's launching process on `line` (LAUNCH_SCRIPT) with EAGLE3 and `args`, the guard in `mode`: the
    process and its specflip lines (the one-line stop, a guard-off line)."""
    out = run_scheduler_process(line, mode, LAUNCH_SCRIPT, args)
    ours = [t for t in out.stderr.splitlines() if t.startswith("specflip") or "specflip guard off" in t]
    return out, ours


# every line loads the plugins in its launching process and calls check_server_args there before it starts a
# scheduler process (0.5.12 ... 0.5.23's engine.py `_launch_subprocesses`); 0.5.12 (.venv12, the v1 worker),
# 0.5.16 (the GPU host's line: the H200 run of d1c0dcc stopped in its scheduler process, then SGLang's launcher
# printed an EOFError's and a RuntimeError's tracebacks) and 0.5.23 (resolution's view of the record)
@pytest.mark.parametrize("line", ["0.5.12", "0.5.16", "0.5.23"])
def test_assert_mode_stops_the_launch_before_any_scheduler_process_with_one_line(line: str) -> None:
    out, ours = launch(line, "assert", *CHAIN, "--page-size", "16")
    assert out.returncode == 1, (out.stdout, out.stderr[-3000:])
    assert "SCHEDULER PROCESSES STARTED" not in out.stdout and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert len(ours) == 1, ours
    assert ours[0].startswith("specflip: SPECFLIP_MODE=assert asks for a guard that stops faults, but the guard does "
                              f"not check this server: sglang {line}: page_size 16 (--page-size;"), ours


def test_assert_mode_decides_on_what_resolution_chose() -> None:
    """0.5.23 keeps what resolution chose beside the record (`resolving_view`): EAGLE3 without the chain's flags gets
    a tree SGLang chose (topk > 1), which the record still reads as unset."""
    out, ours = launch("0.5.23", "assert")
    assert out.returncode == 1 and "SCHEDULER PROCESSES STARTED" not in out.stdout, out.stderr[-3000:]
    found = re.search(r"sglang 0\.5\.23: speculative_eagle_topk (\d+) \(--speculative-eagle-topk;", "".join(ours))
    assert len(ours) == 1 and found and int(found.group(1)) > 1, ours


@pytest.mark.parametrize("line", ["0.5.12", "0.5.23"])
@pytest.mark.parametrize(("mode", "page_size"), [("warn", "16"), ("assert", "1")])
def test_warn_mode_or_a_checked_server_launches_its_scheduler_processes(line: str, mode: str, page_size: str) -> None:
    """Warn mode (each scheduler process says its one line and sets its gauge, not the launching process) and a
    configuration the guard checks: the launch goes on to the scheduler processes, no specflip line here."""
    out, ours = launch(line, mode, *CHAIN, "--page-size", page_size)
    assert out.returncode == 0 and "SCHEDULER PROCESSES STARTED" in out.stdout, (out.stdout, out.stderr[-3000:])
    assert ours == [] and "Traceback" not in out.stderr, ours


def test_the_launching_process_stops_only_in_assert_mode_and_records_nothing(
        fresh: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The launching process's hook body on a real ServerArgs with `--page-size 16`: SPECFLIP_ON_BAD_CONFIG=warn and
    warn mode say nothing there and record nothing (each scheduler process decides and says its one line, and sets
    its gauge); assert mode stops with the one line."""
    sa = h.make_server_args(model_dir, speculative_algorithm="EAGLE", page_size=16)
    monkeypatch.setenv("SPECFLIP_ON_BAD_CONFIG", "warn")
    with caplog.at_level(logging.DEBUG, logger="specflip.guard"):
        fresh.adapter.after_check_server_args(None, sa)  # assert mode, opted out
        fresh.mode = Mode.WARN
        fresh.adapter.after_check_server_args(None, sa)
    assert [r.getMessage() for r in caplog.records if r.name == "specflip.guard"] == []
    assert not fresh.decided and fresh.disabled_reason is None and fresh.rank is None
    fresh.mode = Mode.ASSERT
    monkeypatch.delenv("SPECFLIP_ON_BAD_CONFIG")
    with pytest.raises(SystemExit) as stop:
        fresh.adapter.after_check_server_args(None, sa)
    assert str(stop.value.code).startswith("specflip: SPECFLIP_MODE=assert asks for a guard that stops faults, but the "
                                           "guard does not check this server: sglang 0.5.23: page_size 16 ")


# --- the v1 kit's switch: the worker SGLang builds, decided once the launch resolved its arguments ------------------

def launch_v1_kit(tmp_path: Path, mode: str, env: dict[str, str], *args: str,
                  line: str = "0.5.12") -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """SGLang `line`'s launching process (LAUNCH_SCRIPT, EAGLE3 with the chain and `args`) with only the v1 kit's entry
    point (`specflip_v1 = shim.plugin:register_v1`, the dist-info bench/gpu/v1_run.sh writes), SPECFLIP_SWITCH=5:2,
    the guard in `mode` and `env`: the process and its specflip lines."""
    dist = tmp_path / "site" / "specflip_v1-0.1.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: specflip-v1\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[sglang.srt.plugins]\nspecflip_v1 = shim.plugin:register_v1\n")
    out = run_scheduler_process(line, mode, LAUNCH_SCRIPT, (*CHAIN, *args), path=(dist.parent,),
                                env={"SGLANG_PLUGINS": "specflip_v1", "SPECFLIP_SWITCH": "5:2", **env})
    ours = [t for t in out.stderr.splitlines() if t.startswith("specflip") or "specflip switch off" in t]
    return out, ours


# "1": the overlap schedule on, as unset is on 0.5.12 (environ.py: EnvBool(True)); spelled out, because the CPU
# harness the launch imports (line_imports -> sglang12_cpu) defaults the variable to 0
OVERLAP_ON = {"SGLANG_ENABLE_SPEC_V2": "1"}


@pytest.mark.parametrize("mode", ["off", "assert"])
def test_the_v1_kit_stops_the_launch_where_sglang_builds_the_v2_worker(tmp_path: Path, mode: str) -> None:
    """0.5.12 with the overlap schedule on builds EAGLEWorkerV2; the v1 kit installed its switch at plugin load, when
    only SGLANG_ENABLE_SPEC_V2 can be read, and its flips (get_next_batch_to_run) would have run on the v2 worker's
    batches. The launch now stops once SGLang resolved its arguments, before any scheduler process starts: one line,
    no traceback (with the guard in assert mode too, which stops for the v2 worker as well: still one line)."""
    out, ours = launch_v1_kit(tmp_path, mode, OVERLAP_ON)
    assert out.returncode == 1, (out.stdout, out.stderr[-3000:])
    assert "SCHEDULER PROCESSES STARTED" not in out.stdout and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert len(ours) == 1, ours
    if mode == "off":
        assert ours[0].startswith("specflip: SPECFLIP_SWITCH=5:2 asks for the v1 kit's switch, which runs on SGLang's "
                                  "v1 EAGLEWorker, but sglang 0.5.12 runs EAGLEWorkerV2 for this server (its resolved "
                                  "server arguments leave the overlap schedule on)"), ours
        assert "Launch the v1 worker (SGLANG_ENABLE_SPEC_V2=0 or --disable-overlap-schedule), or set " \
               "SPECFLIP_ON_BAD_CONFIG=warn to serve without the switch" in ours[0], ours


# SGLANG_ENABLE_SPEC_V2=0 (the v1 worker by the variable): tests/test_release_conformance.py's 0.5.12 launch with the
# v1 kit gets through the same launch path
@pytest.mark.parametrize(("env", "args"), [(OVERLAP_ON, ("--disable-overlap-schedule",)),
                                           ({**OVERLAP_ON, "SPECFLIP_ON_BAD_CONFIG": "warn"}, ())],
                         ids=["disable_overlap_schedule", "on_bad_config_warn"])
def test_the_v1_kit_launches_where_sglang_builds_the_v1_worker(tmp_path: Path, env: dict[str, str],
                                                              args: tuple[str, ...]) -> None:
    """The v1 worker selected by --disable-overlap-schedule alone (the variable saying v2): the launch goes on to its
    scheduler processes with no specflip line. SPECFLIP_ON_BAD_CONFIG=warn with the v2 worker: the launching process
    says nothing either (each scheduler process says its line and turns its switch off: tests/test_v1_switch.py)."""
    out, ours = launch_v1_kit(tmp_path, "off", env, *args)
    assert out.returncode == 0 and "SCHEDULER PROCESSES STARTED" in out.stdout, (out.stdout, out.stderr[-3000:])
    assert ours == [] and "Traceback" not in out.stderr, ours


@pytest.mark.parametrize("on_bad_config", ["stop", "warn"])
def test_the_v1_kit_stops_at_plugin_load_on_a_line_without_the_v1_worker(tmp_path: Path, on_bad_config: str) -> None:
    """0.5.16 (the GPU host's line) ships no v1 EAGLEWorker: the v1 kit installed its switch all the same, SGLang's
    HookRegistry logged a traceback for the missing EAGLEWorker target, and the rest of its hooks (the flips at
    get_next_batch_to_run) ran on EAGLEWorkerV2. Now start-up stops at plugin load with one line naming specflip's own
    entry point; SPECFLIP_ON_BAD_CONFIG=warn: one error line, and the launch goes on without the switch."""
    out, ours = launch_v1_kit(tmp_path, "off", {"SPECFLIP_ON_BAD_CONFIG": on_bad_config}, line="0.5.16")
    assert "Traceback" not in out.stderr and "Failed to apply hooks" not in out.stderr, out.stderr[-3000:]
    assert len(ours) == 1, (ours, out.stderr[-3000:])
    assert "SPECFLIP_SWITCH=5:2 asks for the v1 kit's switch, which runs on SGLang's v1 EAGLEWorker, but sglang " \
           "0.5.16 ships no v1 EAGLEWorker (every server runs EAGLEWorkerV2)" in ours[0], ours
    if on_bad_config == "stop":
        assert out.returncode == 1 and "SCHEDULER PROCESSES STARTED" not in out.stdout, out.stdout
        assert ours[0].startswith("specflip: ") and "Use specflip's own entry point (shim.plugin:register" in ours[0]
    else:
        assert out.returncode == 0 and "SCHEDULER PROCESSES STARTED" in out.stdout, (out.stdout, out.stderr[-3000:])
        assert "specflip switch off: " in ours[0]
