"""One 'rank' of tests/test_switch_auto.py's two-rank test: the same decode batches (real ScheduleBatch objects), its
own clock (each rank's steps jitter differently), the learner fed through shim.switch.auto.AutoSwitch, a real gloo
group (torch.distributed on the CPU). Writes its decisions per scheduling point as JSON.

usage: auto_rank_worker.py RANK INIT_FILE AGREE(0|1) TRACE_DIR OUT_JSON
"""

from __future__ import annotations

import json
import random
import sys

import torch.distributed as dist
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from shim.switch import auto as auto_switch
from shim.timing.jsonl import JsonlTrace
from statemodel import auto_policy as ap


def main(rank: int, init_file: str, agree: bool, trace_dir: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    group = dist.new_group(backend="gloo")

    class SchedulerFields:  # the three Scheduler fields AutoSwitch reads
        tp_size = 2 if agree else 1
        tp_rank = rank
        tp_cpu_group = group

    trace = JsonlTrace(trace_dir, prefix=f"switch-rank{rank}")
    rng = random.Random(100 + rank)
    now = [0.0]
    auto = auto_switch.AutoSwitch(spec_cap=48, window=8, clock=lambda: now[0])
    spec_on, decisions = True, []
    demands = [d for d in (2, 6, 40, 64, 3, 30, 20, 100, 2) for _ in range(150)]
    for step, demand in enumerate(demands):
        running = min(demand, 48) if spec_on else demand
        d = auto.decide(spec_on, running, demand - running)
        if d.action is not None:
            spec_on = d.action == ap.FLIP_ON
            trace.event(d.action, running=running, waiting=demand - running, **auto.trace_fields())
        auto.commit(d)
        decisions.append((step, d.action, d.reason, auto.state.digest()))
        batch = ScheduleBatch(reqs=[object()] * running, batch_is_full=False)
        batch.forward_mode = ForwardMode.DECODE
        batch.spec_algorithm = SpeculativeAlgorithm.EAGLE3 if spec_on else SpeculativeAlgorithm.NONE
        auto.on_run_batch(SchedulerFields, batch, auto.state.flips, trace)
        base = (3e-3 + 0.2e-3 * running) if spec_on else (1e-3 + 0.12e-3 * running)
        now[0] += base * (1 + 0.08 * rng.random())
    dist.destroy_process_group()
    trace.drain(force=True)
    with open(out, "w") as fh:
        json.dump(decisions, fh)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", sys.argv[4], sys.argv[5])
