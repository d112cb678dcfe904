"""Which CUDA graph the guard says a forward replays, read per release line from the target's model runner.

0.5.12 and 0.5.13 keep the target's decode runner in `ModelRunner.graph_runner`, a `CudaGraphRunner` whose `can_run`
ignores the tokens per request; 0.5.14 and later keep it in `decode_cuda_graph_runner`. A runner read from the wrong
attribute is None, and the guard then takes every forward for eager and never compares the graph's shape with the
step's (shapes_agree). The runners are CPU stand-ins (a CUDA graph cannot be captured on a CPU) with the host
attributes SGLang's `can_run` reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from shim.releases import v0_5_12, v0_5_13, v0_5_14


@dataclass
class CudaGraphRunnerCpuStandIn:
    """0.5.12 / 0.5.13 `model_executor.cuda_graph_runner.CudaGraphRunner`'s host attributes."""

    num_tokens_per_bs: int
    capture_bs: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    max_bs: int = 16


@dataclass
class ModelRunnerCpuStandIn:
    graph_runner: object = None
    decode_cuda_graph_runner: object = None


@pytest.mark.parametrize("adapter_class", [v0_5_12.Adapter, v0_5_13.Adapter], ids=["0.5.12", "0.5.13"])
def test_lines_with_graph_runner_read_it_and_ignore_the_step_width(adapter_class: type) -> None:
    verify_graphs = CudaGraphRunnerCpuStandIn(num_tokens_per_bs=4)
    runner = ModelRunnerCpuStandIn(graph_runner=verify_graphs)
    graph_for = adapter_class.graph_for
    # a plain step (spec_info None) of 3 requests on the verify graphs: SGLang replays the 4-request, 4-token graph
    assert graph_for(None, runner, 3, None) == (4, 4)
    assert graph_for(None, runner, 16, None) == (16, 4)
    assert graph_for(None, runner, 17, None) is None  # above max_bs: eager
    assert graph_for(None, ModelRunnerCpuStandIn(), 3, None) is None  # no graphs captured: eager


def test_lines_from_0_5_14_read_decode_cuda_graph_runner_not_graph_runner() -> None:
    runner = ModelRunnerCpuStandIn(graph_runner=CudaGraphRunnerCpuStandIn(num_tokens_per_bs=4))
    assert v0_5_14.Adapter.graph_for(None, runner, 3, None) is None


def test_each_line_reads_the_attribute_its_release_names() -> None:
    assert v0_5_13.Line.decode_graph_runner_attr == "graph_runner"
    assert v0_5_14.Line.decode_graph_runner_attr == "decode_cuda_graph_runner"
