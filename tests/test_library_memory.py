"""What CUDA libraries keep beside a step's tensors (profiler/library_memory.py): found in the trace,
added to what the cost graph holds throughout, and none on a CPU. The CUDA measurement itself is
checked where a GPU is present (tests/test_cuda_bounded.py)."""

from dataclasses import replace

import pytest
import torch
from torch import nn

import planner
import profiler
from profiler.api import least_times
from profiler.library_memory import cublas_workspace_bytes, uses_cublas
from profiler.memory import measure_step
from tests.models import mlp


def _profile(model, inputs):
    return profiler.profile(model, (inputs,), granularity="op", repeats=1)


def test_a_matrix_product_is_found_in_the_trace_and_a_convolution_is_not():
    linear = _profile(mlp(width=16, depth=2), torch.randn(4, 16))
    conv = _profile(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), torch.randn(2, 3, 8, 8))
    assert uses_cublas(linear.joint.graph_module)
    assert not uses_cublas(conv.joint.graph_module)


def test_none_on_a_cpu():
    model, inputs = mlp(width=16, depth=2), torch.randn(4, 16)
    made = _profile(model, inputs)
    assert cublas_workspace_bytes("cpu") == 0
    assert made.times.library_bytes == 0 and made.graph.graph["library_bytes"] == 0
    assert measure_step(model, (inputs,), repeats=0).library_bytes == 0


def test_the_libraries_bytes_are_held_throughout_in_every_grouping_and_not_in_the_fingerprint():
    made = _profile(mlp(width=16, depth=2), torch.randn(4, 16))
    workspaces = 65 * 2**20
    with_workspaces = replace(made, times=replace(made.times, library_bytes=workspaces))
    rebuilt = least_times([with_workspaces])  # the graph built again from the times, as every grouping is
    assert rebuilt.graph.graph["fixed_bytes"] == made.graph.graph["fixed_bytes"] + workspaces
    assert rebuilt.graph.graph["library_bytes"] == workspaces
    # The runtime computes the fingerprint again without any measurement: it must not move.
    assert rebuilt.fingerprint == made.fingerprint
    coarser = rebuilt.regroup("module")
    assert coarser.graph.graph["fixed_bytes"] == made.regroup("module").graph.graph["fixed_bytes"] + workspaces


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_profile_counts_the_workspaces_the_measured_step_holds():
    model, inputs = mlp(width=256, depth=4).cuda(), torch.randn(64, 256, device="cuda")
    made = _profile(model, inputs)
    workspaces = made.graph.graph["library_bytes"]
    assert workspaces > 0
    measured = measure_step(model, (inputs,), repeats=0)
    assert measured.library_bytes == workspaces
    assert measured.peak_bytes == measured.resident_bytes + workspaces + measured.step_peak_bytes


def test_a_plan_whose_graph_counts_workspaces_is_saved_loaded_and_applied(tmp_path):
    model, inputs = mlp(), torch.randn(128, 64)
    made = _profile(model, inputs)
    with_workspaces = least_times([replace(made, times=replace(made.times, library_bytes=4096))])
    plan = planner.plan_from_profile(with_workspaces, "70%", solver="dp")
    assert plan.fixed_bytes >= made.graph.graph["fixed_bytes"] + 4096
    assert "cuBLAS's workspaces" in plan.summary()
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = planner.load(path)  # its fingerprint leaves the measured workspaces out
    planned = planner.apply(model, loaded)
    planned(inputs).sum().backward()
