"""The eager recording of a model the tracer cannot follow, within the device's memory
(profiler/eager_bound.py): refused before an op would take the step past the device, said as out of
memory on the device, never as the allocator's failure or the model's."""

from __future__ import annotations

import pytest
import torch

import planner
from benchmarks.zoo_models import SparseMoEModel, _mse
from profiler.eager import record
from profiler.eager_bound import StepBound
from profiler.memory import resident_bytes
from profiler.oom import OutOfMemory

from capped import run_capped

MIB = 2**20


def _moe():
    """A top-2 MoE (data-dependent shapes: the tracer cannot follow it) whose un-checkpointed step
    holds about 95 MiB, dropout on."""
    torch.manual_seed(0)
    model = SparseMoEModel(layers=4, width=128)
    return model, (torch.randn(16, 256, 16, generator=torch.Generator().manual_seed(1)),)


def test_an_eager_step_above_the_device_is_refused_before_it_passes_it():
    model, inputs = _moe()
    bound = StepBound(40 * MIB, resident_bytes(model, list(inputs)), "cpu")
    with pytest.raises(OutOfMemory, match=r"^out of memory on cpu: \d+ bytes asked, \d+ free"):
        record(model, inputs, {}, _mse, repeats=2, bound=bound)
    # Refused before the allocation: what the step held never passed the bound.
    assert 30 * MIB < bound.peak_bytes <= bound.bound_bytes
    assert all(p.grad is None for p in model.parameters())  # the model as it was
    with pytest.raises(OutOfMemory, match="recording the un-checkpointed step eagerly") as refused:
        planner.plan(model, inputs, "50%", loss_fn=_mse, device_memory=40 * MIB)
    assert "the model raised" not in str(refused.value)
    assert "plan it on a device that holds its un-checkpointed step" in str(refused.value)


def test_an_eager_step_within_the_device_is_recorded_as_without_a_bound():
    torch.manual_seed(0)
    model = SparseMoEModel(layers=2, width=64)
    inputs = (torch.randn(8, 128, 16, generator=torch.Generator().manual_seed(1)),)
    resident = resident_bytes(model, list(inputs))
    bound = StepBound(400 * MIB, resident, "cpu")
    bounded = record(model, inputs, {}, _mse, repeats=2, bound=bound)
    plain = record(model, inputs, {}, _mse, repeats=2)
    assert [(op.name, op.made) for op in bounded.ops] == [(op.name, op.made) for op in plain.ops]
    # The bound's count of what the step held is the recording's own, op by op: what each op made,
    # less what was freed before it (a storage's last op alive).
    sizes = {serial: size for op in plain.ops for serial, size in op.made}
    freed_after = {}
    for serial, last in plain.last_alive.items():
        freed_after[last] = freed_after.get(last, 0) + sizes[serial]
    live = peak = 0
    for index, op in enumerate(plain.ops):
        live += sum(size for _, size in op.made)
        peak = max(peak, live)
        live -= freed_after.get(index, 0)
    assert bound.peak_bytes == resident + peak > resident


UNDER_THE_CAP = """
sys.path.insert(0, {root!r})
from benchmarks.zoo_models import SparseMoEModel, _mse
from profiler.oom import OutOfMemory
torch.manual_seed(0)
model = SparseMoEModel(layers=4, width=128)
inputs = (torch.randn(16, 256, 16, generator=torch.Generator().manual_seed(1)),)
cap({cap})
try:
    planner.plan(model, inputs, "50%", loss_fn=_mse)
    result(outcome="planned")
except OutOfMemory as error:
    result(outcome="out of memory", message=str(error))
"""


def test_under_a_cap_the_eager_step_is_refused_by_the_bound_not_the_allocator():
    """The device memory is what the address-space cap leaves (planner/bounded.py): the step (95 MiB)
    does not fit 50 MB, and the refusal comes from the bound, before the allocator would refuse."""
    from capped import ROOT

    figures, done = run_capped(UNDER_THE_CAP.format(root=str(ROOT), cap=50_000_000))
    assert figures is not None, done.stderr[-3000:]
    assert figures["outcome"] == "out of memory", figures
    assert "while recording the un-checkpointed step eagerly" in figures["message"], figures["message"]
    assert "can't allocate" not in done.stderr and "Traceback" not in done.stderr


def test_an_untraceable_moe_plans_the_whole_adamw_iteration_and_trains_within_it():
    """optimizer= for a model the tracer cannot follow: the eager step lists the parameters its
    backward gave a gradient, and AdamW's state and step are counted as for a traced step; three
    AdamW iterations of the plan measure (allocator events, resident bytes included) within the
    budget of 60% of the un-checkpointed iteration."""
    from benchmarks.zoo_models import _sparse_moe
    from profiler.allocations import allocated_while

    model, inputs, loss_fn = _sparse_moe()
    made = planner.plan(model, inputs, "60%", loss_fn=loss_fn, optimizer="adamw")
    assert "profiled from an eager step" in made.schedule.info.message
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert made.optimizer.startswith("adamw") and made.optimizer_state_bytes >= 2 * parameter_bytes
    assert made.predicted_peak_bytes <= made.budget_bytes
    planner.apply(model, made)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []

    def iterations():
        for _ in range(3):
            loss = loss_fn(model(*inputs))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())

    peak, _ = allocated_while(iterations)
    measured = resident_bytes(model, list(inputs)) + peak
    assert measured <= made.budget_bytes, (measured, made.budget_bytes, made.predicted_peak_bytes)
    assert losses[2] < losses[0]  # it trains
