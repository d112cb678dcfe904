"""shim/switch/v2_capture.py's capture_plain_decode_runner puts the target's model runner back as it found it.

The capture itself needs CUDA; the model runner here is a stand-in (`ModelRunnerCpuStandIn`) that records what it
saw while the plain attention backend was made. SpeculativeAlgorithm and CaptureHiddenMode are SGLang's own.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stand_ins" / "cpu"))  # torchvision stand-in

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("torch")
    pytest.importorskip("sglang.srt.speculative.spec_info")

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from shim.switch.v2 import JsonlTrace, SwitchConfig, SwitchPolicy, SwitchRuntime, capture_plain_decode_runner  # noqa: E402

pytestmark = pytest.mark.sglang


class ModelRunnerCpuStandIn:
    """The attributes capture_plain_decode_runner reads and swaps; making an attention backend flips the runner's
    workspace flag, as a backend that initialises a new workspace may."""

    def __init__(self, fail: bool = False) -> None:
        self.spec_algorithm = SpeculativeAlgorithm.EAGLE
        self.init_new_workspace = False
        self.decode_cuda_graph_runner = None  # graphs off: no decode runner to capture beside
        self.prefill_cuda_graph_runner = None
        self.seen: list[Any] = []
        self.fail = fail

    def _get_attention_backend(self, init_new_workspace: bool = False) -> object:
        self.seen.append(self.spec_algorithm)
        self.init_new_workspace = init_new_workspace
        if self.fail:
            raise RuntimeError("backend init failed")
        return object()


def _runtime() -> SwitchRuntime:
    config = SwitchConfig(t_off=4, t_on=1, draft_while_off="sync", plain_graphs="decode")
    return SwitchRuntime(config=config, policy=SwitchPolicy(config), trace=JsonlTrace(None))


@pytest.mark.parametrize("fail", [False, True])
def test_capture_puts_the_model_runner_back(fail: bool) -> None:
    mr = ModelRunnerCpuStandIn(fail=fail)
    worker = SimpleNamespace(target_worker=SimpleNamespace(model_runner=mr))
    rt = _runtime()
    if fail:
        with pytest.raises(RuntimeError):
            capture_plain_decode_runner(worker, rt)
    else:
        capture_plain_decode_runner(worker, rt)
        assert rt.plain_attn_backend is not None and rt.plain_runner is None
    assert mr.seen == [SpeculativeAlgorithm.NONE]  # the plain backend is made for a plain runner
    assert mr.spec_algorithm == SpeculativeAlgorithm.EAGLE
    assert mr.init_new_workspace is False


class CudaGraphCpuStandIn:
    """A captured graph's replay(), counted (a CUDA graph cannot run on the CPU)."""

    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


def test_warm_replay_launches_every_graph_once_at_start_up() -> None:
    """Issue 17: the first launch of a graph uploads it; warm_replay pays that at start-up for each graph the plain
    path will replay (SGLang 0.5.16 keeps them in runner.backend._graphs), and leaves a runner without graphs."""
    from shim.switch.v2_capture import warm_replay

    graphs = {(bs, 0, None): CudaGraphCpuStandIn() for bs in (1, 2, 4, 8)}
    runner = SimpleNamespace(backend=SimpleNamespace(_graphs=graphs))
    assert warm_replay(runner) == 4
    assert [g.replays for g in graphs.values()] == [1, 1, 1, 1]
    assert warm_replay(SimpleNamespace(backend=SimpleNamespace(_graphs={}))) == 0
    assert warm_replay(SimpleNamespace()) == 0
