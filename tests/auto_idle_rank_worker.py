"""One 'rank' of tests/test_switch_auto_idle.py's two-rank test of the idle time: the same decode batches (real
ScheduleBatch objects), its own clock, the learner fed through shim.switch.auto.AutoSwitch, a real gloo group
(torch.distributed on the CPU). A phase of 100 requests (plain, by the prior: above speculation's cap) ends, the
server idles, and 2 requests arrive; the ranks' clocks saw different idle times (rank 0 10 ms, rank 1 5 s), on either
side of where the idle time ends the hold. Writes its decisions per scheduling point as JSON.

usage: auto_idle_rank_worker.py RANK INIT_FILE AGREE(0|1) OUT_JSON
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
from statemodel import auto_policy as ap

IDLE_S = (0.010, 5.0)  # each rank's idle seconds between the phases


def main(rank: int, init_file: str, agree: bool, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    group = dist.new_group(backend="gloo")

    class SchedulerFields:  # the three Scheduler fields AutoSwitch reads
        tp_size = 2 if agree else 1
        tp_rank = rank
        tp_cpu_group = group

    rng = random.Random(100 + rank)
    now = [0.0]
    auto = auto_switch.AutoSwitch(spec_cap=48, window=8, clock=lambda: now[0])
    spec_on, decisions = True, []

    def point(running: int, waiting: int) -> None:
        nonlocal spec_on
        d = auto.decide(spec_on, running, waiting)
        if d.action is not None:
            spec_on = d.action == ap.FLIP_ON
        auto.commit(d)
        decisions.append((len(decisions), d.action, d.reason, d.load, auto.state.digest()))

    def step(running: int) -> None:
        batch = ScheduleBatch(reqs=[object()] * running, batch_is_full=False)
        batch.forward_mode = ForwardMode.DECODE
        batch.spec_algorithm = SpeculativeAlgorithm.EAGLE3 if spec_on else SpeculativeAlgorithm.NONE
        auto.on_run_batch(SchedulerFields, batch, auto.state.flips)
        base = (3e-3 + 0.2e-3 * running) if spec_on else (1e-3 + 0.12e-3 * running)
        now[0] += base * (1 + 0.08 * rng.random())

    for _ in range(200):  # the phase of 100 requests
        running = min(100, 48) if spec_on else 100
        point(running, 100 - running)
        step(running)
    point(0, 0)  # drained: an idle iteration
    auto.on_idle()
    now[0] += IDLE_S[rank]
    auto.before_decision(SchedulerFields, 2)  # 2 requests arrive at the emptied server
    point(0, 2)
    for _ in range(40):
        point(2, 0)
        step(2)
    dist.destroy_process_group()
    with open(out, "w") as fh:
        json.dump(decisions, fh)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", sys.argv[4])
