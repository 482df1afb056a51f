"""Planning time without losing what the plan is: op timings shared by ops of one signature, the
measurements after profiling without warm-up steps, the op-level graph built once, the time check,
and the same plan for the same model planned twice."""

import types
import warnings

import pytest
import torch
import torch.fx as fx
from torch import nn

import planner
import profiler
from models import gpt2, gpt2_inputs, hf_loss
from planner.native import SLOW_FAST, _check_times, measure_native
from planner.planfile import PlanWarning
from profiler.measure import _extra_calls, _repeatable, _signature, time_ops


def test_a_signature_is_the_op_and_its_arguments_layouts():
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    mm = torch.ops.aten.mm.default
    assert _signature(mm, (a, b.t()), {}) == _signature(mm, (b, a.t()), {})
    assert _signature(mm, (a, b.t()), {}) != _signature(mm, (a, torch.randn(8, 3)), {})  # shape
    assert _signature(mm, (a, b.t()), {}) != _signature(mm, (a.double(), b.t().double()), {})  # dtype
    assert _signature(mm, (a, b.t()), {}) != _signature(mm, (a, b.t().contiguous()), {})  # strides
    add = torch.ops.aten.add.Tensor
    assert _signature(add, (a, b), {"alpha": 1}) != _signature(add, (a, b), {"alpha": 2})  # other arguments
    assert _signature(add, (a, b), {}) != _signature(torch.ops.aten.sub.Tensor, (a, b), {})  # the op


def test_only_ops_that_change_nothing_are_called_again_in_place():
    graph = fx.Graph()
    x = graph.placeholder("x")
    ops = {
        "add": torch.ops.aten.add.Tensor, "add_": torch.ops.aten.add_.Tensor,
        "bernoulli": torch.ops.aten.bernoulli.default, "dropout": torch.ops.aten.native_dropout.default,
    }
    nodes = {name: graph.call_function(op, (x, x)) for name, op in ops.items()}
    assert _repeatable(nodes["add"])
    assert not _repeatable(nodes["add_"])  # mutates its input
    assert not _repeatable(nodes["bernoulli"]) and not _repeatable(nodes["dropout"])  # draws


def test_signatures_with_fewer_samples_than_asked_get_calls_in_place_on_their_first_op():
    graph = fx.Graph()
    x = graph.placeholder("x")
    layer = [graph.call_function(torch.ops.aten.relu.default, (x,)) for _ in range(4)]
    head = graph.call_function(torch.ops.aten.sum.default, (layer[-1],))
    twice = [graph.call_function(torch.ops.aten.neg.default, (head,)) for _ in range(2)]
    signatures = {n.name: ("relu",) for n in layer} | {head.name: ("sum",)} | {n.name: ("neg",) for n in twice}
    assert _extra_calls(graph, signatures, repeats=3, runs=1) == {head.name: 2, twice[0].name: 1}
    assert _extra_calls(graph, signatures, repeats=3, runs=2) == {head.name: 1}  # 2 samples of each neg
    assert _extra_calls(graph, signatures, repeats=1, runs=1) == {}


def test_repeated_blocks_get_one_time_per_signature_and_every_op_is_timed():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(4)], nn.Linear(64, 1))
    prof = profiler.profile(model, (torch.randn(32, 64),), granularity="op")
    times = prof.times
    assert 2 <= times.runs <= 3
    gm = prof.joint.graph_module
    ops = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is not torch.ops.aten.copy_.default]
    assert set(times.seconds) == {n.name for n in ops}
    assert all(t > 0 for t in times.seconds.values())
    # The forward ReLUs of the four blocks take one signature, hence one time.
    relus = [n.name for n in ops if n.target is torch.ops.aten.relu.default]
    assert len(relus) == 4 and len({times.seconds[r] for r in relus}) == 1


def test_timing_leaves_the_generator_as_it_was():
    graph = fx.Graph()
    x = graph.placeholder("x")
    drawn = graph.call_function(torch.ops.aten.rand_like.default, (x,))
    added = graph.call_function(torch.ops.aten.add.Tensor, (x, drawn))
    graph.output(added)
    module = fx.GraphModule(nn.Module(), graph)
    torch.manual_seed(0)
    value = torch.randn(16)
    state = torch.get_rng_state()
    times = time_ops(module, [value], repeats=3)
    assert torch.equal(state, torch.get_rng_state())
    assert set(times.seconds) == {drawn.name, added.name} and 2 <= times.runs <= 3


def test_the_op_level_profile_is_built_once():
    prof = profiler.profile(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)), (torch.randn(4, 8),))
    assert prof.regroup("op") is prof.regroup("op")
    assert prof.regroup("op").regroup("op") is prof.regroup("op")  # an op-level profile is its own
    assert prof.regroup(prof.granularity) is prof


def test_a_step_measured_without_warm_up_after_profiling_peaks_as_with_it():
    model, inputs = gpt2(layers=2, embd=64), gpt2_inputs(batch=2, tokens=64)
    planner.profile_for(model, inputs, hf_loss)
    regions = ("transformer.h.0",)
    peaks = {}
    for checkpointed in ((), regions):
        cold = measure_native(model, checkpointed, inputs, hf_loss, warm_up=False)
        warm = measure_native(model, checkpointed, inputs, hf_loss, warm_up=True)
        assert cold.peak_bytes == warm.peak_bytes and cold.resident_bytes == warm.resident_bytes
        assert cold.runs == 1 and cold.seconds > 0
        peaks[checkpointed] = warm.peak_bytes
    assert peaks[regions] < peaks[()]
    peak_only = measure_native(model, (), inputs, hf_loss, repeats=0, warm_up=False)
    assert peak_only.runs == 0 and peak_only.peak_bytes == peaks[()]
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("ratio, warned", [(1 + SLOW_FAST + 0.05, True), (1 - SLOW_FAST - 0.05, True),
                                           (1 + SLOW_FAST - 0.05, False)])
def test_a_measured_step_far_from_the_predicted_one_is_warned_about(ratio, warned):
    plan = types.SimpleNamespace(predicted_seconds=0.5, measured_seconds=0.5 * ratio)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _check_times(plan)
    assert any(issubclass(w.category, PlanWarning) for w in caught) == warned


def test_the_same_model_planned_twice_gives_the_same_plan():
    model, inputs = gpt2(layers=4, embd=64), gpt2_inputs(batch=2, tokens=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)  # a loaded test machine moves the measured step
        first = planner.plan(model, inputs, "50%", loss_fn=hf_loss)
        second = planner.plan(model, inputs, "50%", loss_fn=hf_loss)
    assert first.regions and first.regions == second.regions
    assert first.predicted_peak_bytes == second.predicted_peak_bytes
    assert first.measured_peak_bytes == second.measured_peak_bytes <= first.budget_bytes == second.budget_bytes
