"""The v1 switch's spec-off decode step on the host, seeds_final (SPECFLIP_SWITCH_DRAFT=sync) against the plain
path (retract, issue 22) and against a plain server (no switch, no speculation), side by side in one run on real
sglang 0.5.12 objects (CPU, tests/sglang12_cpu.py), the three interleaved per repeat.

A plain-step iteration of each: sync runs the spec-v1 scheduler step (`update_running_batch` with v1's early
return, then `EAGLEWorker.forward_batch_generation` hooked: the plugin's plain prepare, the worker copy, the target
forward, Python bookkeeping per request, an EagleDraftExtendInput and the draft-extend call); retract runs SGLang's
plain step (`update_running_batch` -> the plain `prepare_for_decode`, `get_model_worker_batch`, the target
worker). Every GPU forward is a stand-in (the target's and the draft-extend's cost nothing here), so the figures
are the host work around them; on the GPU host the draft sync adds a draft-model forward, its ForwardBatch and two
host syncs (`.item()`) on top. No guard (SPECFLIP_MODE unset). Fastest of --repeat runs per cell.

    SPECFLIP_SWITCH= PYTHONPATH=. .venv12/bin/python bench/bench_v1_plain_step.py [--sizes 1,5,10,32] [--steps 200]
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))
os.environ.pop("SPECFLIP_MODE", None)
os.environ.pop("SPECFLIP_SWITCH", None)

import sglang12_cpu as h  # noqa: E402

from specflip.cli_args import OneLineParser, int_list, non_negative_int, positive_int  # noqa: E402


def setup() -> None:
    import sglang.srt.plugins as plugins
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    import shim.switch.v1 as sw
    from shim.switch.config import SwitchConfig

    h.install_gpu_stand_ins()
    h.install_scheduler_loop_stand_in()
    sw.install_switch(HookRegistry, SwitchConfig(t_off=1, t_on=0, draft_while_off="sync"))
    HookRegistry.register(sw.T_NEXT_BATCH, sw._next_batch_around, HookType.AROUND)
    plugins.load_plugins()


def sync_steps(bs: int, steps: int, model_dir: Path) -> float:
    """Seconds per plain decode step of seeds_final (V1Server: update_running_batch + the hooked worker call)."""
    import shim.switch.v1 as sw
    from shim.switch.config import SwitchConfig

    srv = h.V1Server(h.build_pools(h.make_server_args(model_dir), kv_size=bs * (steps + 64) + 64, max_reqs=bs + 8))
    sw.set_runtime(SwitchConfig(t_off=1, t_on=0, draft_while_off="sync"))
    srv.admit(h.make_reqs("r", bs, max_new_tokens=steps + 8))
    srv.step()  # the flip
    tic = time.perf_counter()
    for _ in range(steps):
        srv.step()
    return (time.perf_counter() - tic) / steps


def retract_steps(bs: int, steps: int, model_dir: Path) -> float:
    """Seconds per plain decode iteration of the plain path (V1LoopServer: get_next_batch_to_run + run + process)."""
    import shim.switch.v1 as sw
    from shim.switch.config import SwitchConfig

    srv = h.V1LoopServer(h.build_pools(h.make_server_args(model_dir), kv_size=bs * (steps + 64) + 64,
                                       max_reqs=bs + 8))
    rt = sw.set_runtime(SwitchConfig(t_off=1, t_on=0, draft_while_off="retract"))
    rt.plain_runner = h.CudaGraphRunnerCpuStandIn(num_tokens_per_bs=1)
    srv.add(h.make_reqs("r", bs, max_new_tokens=steps + 8))
    srv.iteration()  # the flip, the (plain) prefill
    srv.iteration()
    tic = time.perf_counter()
    for _ in range(steps):
        srv.iteration()
    return (time.perf_counter() - tic) / steps


def plain_server_steps(bs: int, steps: int, model_dir: Path) -> float:
    """Seconds per decode iteration of a plain server: the same loop with no switch (its hooks pass through, as
    they do with SPECFLIP_SWITCH unset), the scheduler's spec_algorithm NONE and the target worker as the model
    worker from the start, the target's runner a DECODE one; everything prefilled and decoded plain."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    import shim.switch.v1 as sw

    srv = h.V1LoopServer(h.build_pools(h.make_server_args(model_dir), kv_size=bs * (steps + 64) + 64,
                                       max_reqs=bs + 8))
    sw._RUNTIME = None  # no switch: the v1 plugin's hooks call SGLang's methods straight through
    target = srv.worker.target_worker
    target.model_runner.graph_runner = h.CudaGraphRunnerCpuStandIn(num_tokens_per_bs=1)
    s = srv.scheduler
    s.spec_algorithm = SpeculativeAlgorithm.NONE
    s.model_worker = target
    s.running_batch.spec_algorithm = SpeculativeAlgorithm.NONE
    srv.add(h.make_reqs("r", bs, max_new_tokens=steps + 8))
    srv.iteration()  # the prefill
    srv.iteration()
    tic = time.perf_counter()
    for _ in range(steps):
        srv.iteration()
    assert srv.kinds[-1] == "plain", srv.kinds[-3:]
    return (time.perf_counter() - tic) / steps


def main() -> int:
    ap = OneLineParser(prog="bench_v1_plain_step")
    ap.add_argument("--sizes", type=int_list(1), default="1,5,10,32")
    ap.add_argument("--steps", type=positive_int, default=200)
    ap.add_argument("--repeat", type=positive_int, default=3)
    ap.add_argument("--profile", type=non_negative_int, default=0,
                    help="print the top N functions of a sync step (cProfile)")
    args = ap.parse_args()
    setup()
    model_dir = h.write_tiny_model_config(Path(tempfile.mkdtemp(prefix="specflip-bench12-")))
    print("| batch size | sync (seeds_final) us/step | retract (plain path) us/step | plain server us/step | "
          "retract / sync | retract / plain server |")
    print("|---|---|---|---|---|---|")
    for bs in args.sizes:
        sync, plain, server = [], [], []
        for _ in range(args.repeat):  # interleaved, so that each sees the same load
            sync.append(sync_steps(bs, args.steps, model_dir))
            plain.append(retract_steps(bs, args.steps, model_dir))
            server.append(plain_server_steps(bs, args.steps, model_dir))
        best_sync, best_plain, best_server = min(sync), min(plain), min(server)
        print(f"| {bs} | {best_sync * 1e6:,.0f} | {best_plain * 1e6:,.0f} | {best_server * 1e6:,.0f} | "
              f"{best_plain / best_sync:.2f} | {best_plain / best_server:.2f} |", flush=True)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        sync_steps(10, args.steps, model_dir)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
