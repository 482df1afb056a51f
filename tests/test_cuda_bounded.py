"""Planning what does not fit on a GPU made smaller (torch.cuda.set_per_process_memory_fraction):
the capped tests of tests/test_bounded.py, on CUDA. Skipped without a GPU (CI has none); the same
cases print a table in benchmarks/cuda_bounded.py (docs/benchmarks/cuda-bounded.md)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from capped import ROOT

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _benchmark():
    """benchmarks/cuda_bounded.py, loaded by path: benchmarks/ on sys.path would shadow packages
    (its solvers.py) in this process and the processes it spawns."""
    spec = importlib.util.spec_from_file_location("cuda_bounded", ROOT / "benchmarks" / "cuda_bounded.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def limits(tmp_path_factory):
    scratch = str(tmp_path_factory.mktemp("cuda"))
    unplanned = _benchmark().run_case("unplanned", "cuda", scratch)
    cap = unplanned["step_peak"] // 2  # the un-checkpointed step needs twice the cap
    return scratch, cap, int(0.8 * cap)


def test_planned_under_a_fraction_and_its_adamw_iterations_run_within_the_budget(limits):
    scratch, cap, budget = limits
    found = _benchmark().run_case("plan", "cuda", scratch, cap, budget)
    assert "failed" not in found, found
    assert found["device_memory"] <= cap  # read from the fraction, not the GPU's free memory
    assert found["planning_peak"] <= cap
    assert found["predicted"] <= budget and found["iteration_peak"] <= budget
    assert found["unplanned"] == "out of memory"
    assert found["losses"][-1] < found["losses"][0]


def test_max_batch_under_a_fraction_trains_within_the_budget(limits):
    scratch, cap, budget = limits
    found = _benchmark().run_case("max-batch", "cuda", scratch, cap, budget)
    assert found.get("code") == 0, found
    assert found["unplanned_peak"] >= 2 * cap and found["peak"] <= budget


def test_an_allocation_the_fraction_refuses_is_out_of_memory_on_cuda(limits):
    bench = _benchmark()
    scratch, _, _ = limits
    found = bench.run_case("oom", "cuda", scratch, cap=48 * bench.MiB, budget=40 * bench.MiB)
    assert found["code"] == 3 and len(found["errors"]) == 1 and "out of memory on cuda: " in found["errors"][0], found
    assert not found["traceback"] and not found["wrote"]
