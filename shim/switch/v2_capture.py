"""The v2 switch's plain side, made at start-up: a plain DECODE graph runner (and attention backend) for the
target beside its verify graphs, and the view that lets the plain path's prefills replay the target's prefill
graphs."""

from __future__ import annotations

import time
from typing import Any

from shim.releases.registry import installed_line
from shim.switch import core
from shim.switch.v2_runtime import SwitchRuntime


def capture_plain_decode_runner(worker: Any, rt: SwitchRuntime) -> None:
    """Capture a plain DECODE graph runner (1 token per request) for the target, beside its verify graphs.

    A speculative target captures TARGET_VERIFY graphs only and `can_run_graph` ignores forward_mode, so a
    plain batch would replay a verify graph: plain steps must run on their own runner (or eager).
    """
    import pkgutil

    import torch  # noqa: F401 - CUDA must be initialised here already

    line = installed_line()  # where the target keeps its graph runners, and their class (shim/releases/)
    mr = worker.target_worker.model_runner
    tic = time.perf_counter()
    runner_class = pkgutil.resolve_name(line.decode_graph_runner_class)
    core.capture_plain_decode(rt, mr, line.decode_graph_runner_attr, runner_class,
                              keep_workspace_flag=line.model_runner_has_workspace_flag)
    warmed = warm_replay(rt.plain_runner) if rt.plain_runner is not None else 0
    if rt.plain_path and rt.config.plain_prefill == "graphs" and line.prefill_graph_runner_attr is not None:
        rt.plain_prefill_runner = plain_prefill_view(getattr(mr, line.prefill_graph_runner_attr))
    rt.trace.event("capture_plain_runner", seconds=round(time.perf_counter() - tic, 3),
                   graphs=rt.plain_runner is not None, prefill_graphs=rt.plain_prefill_runner is not None,
                   warmed=warmed,
                   capture_bs=list(getattr(rt.plain_runner, "capture_bs", []) or []))


def warm_replay(runner: Any) -> int:
    """Replay each CUDA graph of `runner` once, now, at start-up; returns how many.

    A graph's first launch uploads it to the device, which costs a large graph about a millisecond; without this the
    first plain step at each batch size (after the server's first flip-off) paid it. The replay runs the captured
    kernels over the static buffers as the capture left them, as the capture's own warm-up forwards did (padding
    slot writes, in-range reads). SGLang's runners keep their graphs in `runner.backend._graphs` (the full and
    breakable backends); a runner without them is left as it is (0).
    """
    import torch

    graphs = getattr(getattr(runner, "backend", None), "_graphs", None)
    if not isinstance(graphs, dict) or not graphs:
        return 0
    for graph in graphs.values():
        graph.replay()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return len(graphs)


class PlainPrefillOnTargetGraphs:
    """The target's prefill CUDA graphs, offered to the plain path's prefills.

    An EAGLE-3 target captures its prefill graphs (breakable: the transformer body only) with hidden-state capture
    FULL, and `PrefillCudaGraphRunner.can_run_graph` turns away any batch whose mode differs: every prefill on the
    plain path (mode NULL) ran eager, many kernel launches of host time per prefill, which a plain server does not
    pay. The captured body is the same in both modes (the EAGLE-3 auxiliary hidden states are a model attribute, not
    the mode); the mode only steers the logits processor, which runs eagerly on the live batch after the body. So a
    NULL-mode batch is checked as if the graphs had been captured for it, and everything else goes to the runner.
    """

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    def can_run_graph(self, forward_batch: Any) -> bool:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        runner = self.runner
        if forward_batch.capture_hidden_mode != CaptureHiddenMode.NULL:
            return bool(runner.can_run_graph(forward_batch))
        captured = runner.capture_hidden_mode
        runner.capture_hidden_mode = CaptureHiddenMode.NULL
        try:
            return bool(runner.can_run_graph(forward_batch))
        finally:
            runner.capture_hidden_mode = captured

    def __getattr__(self, name: str) -> Any:  # execute(), and whatever else the model runner reads
        return getattr(self.runner, name)


def plain_prefill_view(runner: Any) -> PlainPrefillOnTargetGraphs | None:
    """The view over the target's prefill graph runner, or None where there are no graphs to offer."""
    if runner is None or not hasattr(runner, "can_run_graph") or not hasattr(runner, "capture_hidden_mode"):
        return None  # None or SGLang's EagerRunner (prefill graphs off): the plain path runs eager anyway
    return PlainPrefillOnTargetGraphs(runner)
