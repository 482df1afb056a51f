"""Whose failure a tracing error is (profiler/blame.py): the model's, a TraceError and the fallback
plan; or ours, raised as it is, since a fallback plan would hide a bug of the profiler."""

import pytest
import torch
from torch import nn

import profiler
import profiler.capture
from profiler.blame import our_frame
from profiler.capture import capture
from profiler.grouping import analyse


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        return y if y.sum() > 0 else -y  # Python control flow on a tensor's value


class ReadsData(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        scale = float(x.abs().max().tolist())  # the data of a fake tensor
        return self.linear(x) * scale


def bn_model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


INPUTS = (torch.randn(3, 4, generator=torch.Generator().manual_seed(0)),)


@pytest.mark.parametrize("model", [DataDependent(), ReadsData()], ids=["control-flow", "reads-data"])
def test_a_model_the_tracer_cannot_follow_is_a_trace_error(model):
    with pytest.raises(profiler.TraceError) as raised:
        capture(model, INPUTS, {})
    assert raised.value.reason and "\n" not in raised.value.reason


def test_a_bug_in_our_decomposition_is_raised_as_it_is(monkeypatch):
    """A decomposition of ours that breaks on what the tracer hands it (here a function of ours that
    takes an fx node, given the relu's tensor) is not the model's failure: no TraceError."""
    monkeypatch.setitem(profiler.capture._DECOMPOSITIONS, torch.ops.aten.relu.default, profiler.capture.is_buffer_mutation)
    with pytest.raises(AttributeError) as raised:
        capture(bn_model(), INPUTS, {})
    assert not isinstance(raised.value, profiler.CaptureError)
    notes = "".join(getattr(raised.value, "__notes__", []))
    assert "profiler/capture.py" in notes and "is_buffer_mutation" in notes and "bug of plan-checkpoints" in notes


def test_a_bug_in_our_pass_between_the_traces_is_raised_as_it_is(monkeypatch):
    # analyse wants an fx.Graph; handed the GraphModule it raises inside profiler/grouping.py
    monkeypatch.setattr(profiler.capture, "draw_in_place_masks_like_eager", analyse)
    with pytest.raises(AttributeError) as raised:
        capture(bn_model(), INPUTS, {})
    assert "profiler/grouping.py" in "".join(raised.value.__notes__)


def test_without_the_bug_the_same_model_traces():
    joint, _ = capture(bn_model(), INPUTS, {})
    assert joint.mutations  # batch norm's running statistics, through our decomposition


def test_the_planner_surfaces_our_bug_instead_of_falling_back(monkeypatch):
    import planner

    monkeypatch.setitem(profiler.capture._DECOMPOSITIONS, torch.ops.aten.relu.default, profiler.capture.is_buffer_mutation)
    with pytest.raises(AttributeError):
        planner.plan(bn_model(), INPUTS, budget="90%")


def _raise_in_test_code():
    raise ValueError("the model's own error")


def test_our_frame_names_our_code_and_not_anyone_elses():
    with pytest.raises(AttributeError) as ours:
        analyse(None)
    assert str(our_frame(ours.value)).startswith("profiler/grouping.py:")
    with pytest.raises(ValueError) as theirs:
        _raise_in_test_code()
    assert our_frame(theirs.value) is None
    # Raised in torch, called from our code: ours (we called it wrongly), unless the caller is a
    # driver, which only hands the model to the tracer: then the tracer's failure.
    with pytest.raises(AttributeError) as from_torch:
        profiler.capture._replay(None)()
    assert our_frame(from_torch.value).function == "_replay.<locals>.run"
    assert our_frame(from_torch.value, profiler.capture._DRIVERS) is None


def test_our_frame_follows_the_error_an_error_was_raised_from():
    try:
        try:
            analyse(None)
        except AttributeError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert str(our_frame(outer)).startswith("profiler/grouping.py:")
