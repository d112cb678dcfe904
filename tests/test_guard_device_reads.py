"""The guard's steps read no device tensor's values (issue 52: the guard's cost on the speculative path).

On a GPU server a value read of a CUDA tensor (`.tolist()`, `.item()`, `bool(t)`, `int(t)`, `.cpu()`, iterating it)
is a host-device synchronisation: under SGLang's overlap schedule it waits for the forward in flight, and on spec v2
(whose schedule stream the WAR barrier chains behind the previous forward) for that one too. On a CPU every tensor is
a host tensor, so torch's sync debug mode (SPECFLIP_COUNT_SYNCS, tests/test_sync_counter.py) sees nothing here.
`DeviceReadCounterCpuStandIn` stands in for it: a torch function mode, active only inside the guard's steps (the
runtime's sync-counter slot, as SPECFLIP_COUNT_SYNCS installs `SyncCounter`), that counts every value read of a tensor
by hook and call site. The one place allowed to read tensor values is `guard_reading.host_ints`, which refuses a
device tensor itself (SGLang's `*_cpu` mirrors and the result's host copies); its reads are counted apart, as host
reads. Everything else counted would be a sync on a GPU.

Driven on SGLang 0.5.23's overlap loop (tests/overlap_loop.py: real ScheduleBatch, allocators, FutureMap and
`EAGLEWorkerV2.forward_batch_generation`, the GPU forwards stood in), speculative and plain steps at batch 2 and 8,
the guard in assert mode with slot values on the path a GPU server takes in assert mode (STOP: a device assert, no
answer read).
"""

from __future__ import annotations

import importlib
import os
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from real_sglang_cpu import require_sglang_cpu

require_sglang_cpu()

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

gf = importlib.import_module("guard_fixtures")
h = importlib.import_module("sglang_cpu")
ol = importlib.import_module("overlap_loop")

from shim.guard.clock import hook_name  # noqa: E402
from shim.switch.config import SwitchConfig  # noqa: E402
from statemodel.designs import RETRACT_CATCH_UP  # noqa: E402

pytestmark = pytest.mark.sglang

# Tensor methods that hand a tensor's values to the host (a sync for a CUDA tensor); `unbind` is iteration's
VALUE_READS = frozenset({"tolist", "item", "__bool__", "__int__", "__index__", "__float__", "cpu", "numpy", "unbind",
                         "__array__", "nonzero"})
HOST_READER = ("guard_reading.py", "host_ints")  # refuses a device tensor: its reads are host reads


class DeviceReadCounterCpuStandIn(TorchFunctionMode):
    """Stands in for torch's CUDA sync debug mode on a CPU: inside each guard step (installed in the runtime's
    sync-counter slot: `run(fn, *args)`), every tensor value read is counted by hook and site; reads made by
    `host_ints` (host mirrors only) are counted as host reads, every other one as a device read."""

    def __init__(self) -> None:
        super().__init__()
        self.device_reads: Counter[tuple[str, str]] = Counter()  # (hook, "file:line func method") -> reads
        self.host_reads: Counter[str] = Counter()  # hook -> host_ints reads
        self._hook = ""

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._hook = hook_name(fn, args)
        with self:
            fn(*args, **kwargs)

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in VALUE_READS:
            frames = [f for f in traceback.extract_stack(limit=16)[:-1] if "torch" not in f.filename.split(os.sep)]
            if any((os.path.basename(f.filename), f.name) == HOST_READER for f in frames):
                self.host_reads[self._hook] += 1
            else:
                where = frames[-1] if frames else None
                site = f"{os.path.basename(where.filename)}:{where.lineno} {where.name}" if where else "?"
                self.device_reads[(self._hook, f"{site} .{name}")] += 1
        return func(*args, **(kwargs or {}))

    def clear(self) -> None:
        self.device_reads.clear()
        self.host_reads.clear()


def counted_steps(runtime: Any, model_dir: Path, size: int, kind: str, steps: int) -> DeviceReadCounterCpuStandIn:
    """`steps` overlap-loop iterations of `size` running requests, all speculative ("spec": the retract switch's
    t_off above the batch) or all plain (t_off 1), counted after the warm-up."""
    gf.configure_guard(runtime, RETRACT_CATCH_UP)
    # the path a GPU server takes in assert mode (auto there): no answer read; the runtime is the process's one, so
    # the setting goes back after (the later test files take the host's own path)
    slot_values, runtime.slot_values = runtime.slot_values, "assert"
    counter = DeviceReadCounterCpuStandIn()
    runtime.sync_counter = counter
    try:
        sa = h.make_server_args(model_dir, speculative_algorithm="EAGLE", num_steps=3, topk=1, num_draft_tokens=4,
                                max_running_requests=size + 1)
        pools = h.build_pools(sa, kv_size=size * 200 + 64, max_reqs=size + 1, overlap_schedule=True)
        config = SwitchConfig(t_off=1 if kind == "plain" else size + 1, t_on=0)
        drv = ol.OverlapDriver(pools, RETRACT_CATCH_UP, switch_config=config)
        drv.add(gf.make_reqs("d", size, max_new_tokens=10 * steps + 20))
        for _ in range(5):  # prefill, merge, the first decode steps (and the flip off for "plain")
            drv.iteration()
        assert drv.launched[-1][1] == kind
        counter.clear()
        for _ in range(steps):
            drv.iteration()
        assert all(mode == kind for _, mode, _ in drv.launched[-steps:])
        assert runtime.guard is not None and runtime.guard.slot_values.path == "stop"
        assert runtime.guard.slot_values.allocs > 0  # the slot-value checks ran (on the device path)
    finally:
        runtime.sync_counter = None
        runtime.slot_values = slot_values
    return counter


@pytest.mark.parametrize("kind", ["spec", "plain"])
@pytest.mark.parametrize("size", [2, 8])
def test_no_guard_step_reads_a_device_tensor(runtime: Any, model_dir: Path, size: int, kind: str) -> None:
    steps = 6
    counter = counted_steps(runtime, model_dir, size, kind, steps)
    assert not counter.device_reads, (
        f"{kind} steps at batch {size}: value reads of tensors other than host mirrors (a host-device sync each on a "
        f"GPU), per step: " + ", ".join(f"{hook} at {site} x{n / steps:g}"
                                        for (hook, site), n in counter.device_reads.most_common()))
    # the readings do read values: the host mirrors (seq_lens_cpu; on the spec path the result's accept_lens too)
    assert sum(counter.host_reads.values()) >= steps


def test_the_counter_counts_a_device_read_by_hook_and_site_and_host_ints_apart() -> None:
    """The stand-in itself: a value read outside host_ints is a device read named by its hook and line; host_ints'
    is a host read; shape and metadata are no reads."""
    from shim.releases.guard_reading import host_ints, tensor_width

    counter = DeviceReadCounterCpuStandIn()
    seq_lens = torch.arange(4)

    def step() -> None:
        tensor_width(seq_lens)
        seq_lens.numel()
        host_ints(seq_lens)
        seq_lens.tolist()
        bool(seq_lens[0])

    counter.run(step)
    line = step.__code__.co_firstlineno
    assert dict(counter.host_reads) == {hook_name(step, ()): 1}
    assert dict(counter.device_reads) == {
        (hook_name(step, ()), f"test_guard_device_reads.py:{line + 4} step .tolist"): 1,
        (hook_name(step, ()), f"test_guard_device_reads.py:{line + 5} step .__bool__"): 1,
    }
