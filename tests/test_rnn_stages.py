"""Stacked RNNs as stages (runtime/rnn.py): the native executor checkpoints an nn.LSTM's / nn.GRU's
layers one at a time, with the stacked module's results, parameters and state_dict."""

import copy
import io

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

import planner
import profiler
import runtime
from benchmarks.zoo_models import RecurrentLM, _ids, _mse
from runtime.rnn import StagedForward, install_for_regions, install_rnn_stages, remove_rnn_stages, stage_paths


def _step(model, args, seed=0):
    """Outputs (and final states) and parameter gradients of one forward and backward."""
    torch.manual_seed(seed)
    for p in model.parameters():
        p.grad = None
    output, hidden = model(*args)
    if isinstance(output, nn.utils.rnn.PackedSequence):
        output = output.data
    states = hidden if isinstance(hidden, tuple) else (hidden,)
    (output.pow(2).sum() + sum(s.sin().sum() for s in states)).backward()
    return [output.detach(), *(s.detach() for s in states), *(p.grad.clone() for p in model.parameters())]


CASES = [  # cell, batch_first, bidirectional, layers, proj_size, packed, given states
    (nn.LSTM, True, False, 3, 0, False, False),
    (nn.LSTM, False, True, 2, 0, False, True),
    (nn.LSTM, True, False, 2, 5, False, True),
    (nn.LSTM, False, False, 2, 0, True, False),
    (nn.GRU, True, True, 3, 0, False, True),
    (nn.GRU, False, False, 2, 0, True, True),
    (nn.RNN, True, False, 3, 0, False, False),
]


@pytest.mark.parametrize("cell,batch_first,bidirectional,layers,proj,packed,given", CASES)
def test_layer_stages_are_the_stacked_module_bit_for_bit(cell, batch_first, bidirectional, layers, proj, packed, given):
    torch.manual_seed(1)
    kw = {"proj_size": proj} if proj else {}
    rnn = cell(7, 11, num_layers=layers, batch_first=batch_first, dropout=0.3, bidirectional=bidirectional, **kw).train()
    x = torch.randn(4, 6, 7) if batch_first else torch.randn(6, 4, 7)
    if packed:
        x = pack_padded_sequence(x, torch.tensor([6, 5, 3, 2]), batch_first=batch_first, enforce_sorted=False)
    args = (x,)
    if given:
        rows = layers * (2 if bidirectional else 1)
        h = torch.randn(rows, 4, proj or 11)
        args = (x, (h, torch.randn(rows, 4, 11)) if cell is nn.LSTM else h)
    reference = _step(rnn, args)
    assert install_rnn_stages(rnn) == [""]
    assert stage_paths(rnn) == [f"stages.{i}" for i in range(layers)]
    staged = _step(rnn, args)
    remove_rnn_stages(rnn)
    assert all(torch.equal(a, b) for a, b in zip(reference, staged, strict=True))


def test_time_chunks_keep_the_dropout_masks_and_are_close():
    torch.manual_seed(1)
    rnn = nn.LSTM(7, 11, num_layers=3, batch_first=True, dropout=0.3).train()
    args = (torch.randn(4, 9, 7),)
    reference = _step(rnn, args)
    install_rnn_stages(rnn, time_chunks=4)
    assert "stages_t4.2.3" in stage_paths(rnn)
    chunked = _step(rnn, args)
    remove_rnn_stages(rnn)
    # Other dropout masks would differ by O(1); the chunked kernel calls only round differently.
    assert max((a - b).abs().max().item() for a, b in zip(reference, chunked, strict=True)) < 1e-4
    with pytest.raises(ValueError, match="bidirectional"):
        install_rnn_stages(nn.GRU(3, 4, num_layers=2, bidirectional=True), time_chunks=2)


def test_stages_keep_the_module_its_parameters_and_its_state_dict():
    torch.manual_seed(0)
    model = RecurrentLM(nn.GRU, layers=3).eval()  # no dropout: the copies are compared call for call
    keys, params = list(model.state_dict()), list(model.named_parameters())
    rnn = model.rnn
    install_rnn_stages(model)
    assert model.rnn is rnn and type(rnn) is nn.GRU and isinstance(rnn.__dict__["forward"], StagedForward)
    assert list(model.state_dict()) == keys
    assert [(n, id(p)) for n, p in model.named_parameters()] == [(n, id(p)) for n, p in params]
    ids = _ids(2, 5, 64)
    expected = model(ids)
    for copied in (copy.deepcopy(model), _reloaded(model)):
        assert isinstance(copied.rnn.__dict__["forward"], StagedForward) and copied.rnn.__dict__["forward"].module is copied.rnn
        assert torch.equal(copied(ids), expected)
    remove_rnn_stages(model)
    assert "forward" not in rnn.__dict__ and "stages" not in rnn._modules and list(model.state_dict()) == keys


def _reloaded(model):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_regions_install_the_stages_they_name():
    model = RecurrentLM(nn.LSTM)
    assert install_for_regions(model, ["embed", "rnn"]) == [] and "stages" not in model.rnn._modules
    assert install_for_regions(model, ["rnn.stages_t2.1.0@matmuls"]) == ["rnn"]
    assert "stages_t2" in model.rnn._modules
    runtime.apply_native(model, ["rnn.stages.0", "rnn.stages.2@matmuls"])
    assert "stages" in model.rnn._modules and "stages_t2" not in model.rnn._modules
    assert runtime.native.native_regions(model) == ["rnn.stages.0", "rnn.stages.2@matmuls"]
    runtime.remove_native(model)
    assert not stage_paths(model) and "forward" not in model.rnn.__dict__
    elsewhere = RecurrentLM(nn.GRU).to("meta")  # not on the CPU (as on CUDA, whose cuDNN draws other masks)
    assert install_rnn_stages(elsewhere) == []
    with pytest.raises(runtime.PlanMismatch, match="CPU RNNs only"):
        runtime.apply_native(elsewhere, ["rnn.stages.1"])


# -- planned: the zoo's LSTM language model, and a GRU one small enough to profile quickly ------------
def _lstm():
    torch.manual_seed(0)
    return RecurrentLM(nn.LSTM), (_ids(8, 32, 64),)


def _gru():
    torch.manual_seed(0)
    return RecurrentLM(nn.GRU, width=16, hidden=32, layers=3), (_ids(64, 6, 64),)


@pytest.fixture(scope="module", params=[_lstm, _gru], ids=["lstm", "gru"])
def planned(request):
    """The model, its inputs, an unplanned copy, and its plans at 50% (planner.plan, which installs
    the stages to profile) and at 75% (the same profile)."""
    model, inputs = request.param()
    unplanned = copy.deepcopy(model)
    plans = {"50%": planner.plan(model, inputs, "50%", loss_fn=_mse)}
    plans["75%"] = planner.plan(model, inputs, "75%", loss_fn=_mse, profile=plans["50%"].profile)
    return model, inputs, unplanned, plans


@pytest.mark.parametrize("budget", ["50%", "75%"])
def test_a_planned_rnn_fits_and_trains_as_the_unplanned_one(planned, budget):
    model, inputs, unplanned, plans = planned
    plan = plans[budget]
    assert "stages" not in model.rnn._modules  # planning leaves the model as it was
    assert plan.regions and all(r.startswith("rnn.stages.") for r in plan.regions), plan.regions
    assert plan.measured_peak_bytes <= plan.budget_bytes
    keys = list(model.state_dict())
    trained, reference = copy.deepcopy(model), copy.deepcopy(unplanned)
    assert planner.apply(trained, plan) is trained
    assert list(trained.state_dict()) == keys and runtime.native.native_regions(trained) == list(plan.regions)
    measured = profiler.measure_step(trained, inputs, loss_fn=_mse, repeats=1)
    assert measured.peak_bytes <= plan.budget_bytes, (measured.peak_bytes, plan.budget_bytes)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (trained, reference)]
    for step in range(3):  # dropout on: the stages and their recomputation draw the stacked module's masks
        grads = []
        for m, optimizer in zip((trained, reference), optimizers):
            m.train()
            torch.manual_seed(step)
            optimizer.zero_grad()
            _mse(m(*inputs)).backward()
            grads.append([p.grad.clone() for p in m.parameters()])
            optimizer.step()
        assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True)), f"step {step}"
    assert all(torch.equal(a, b) for a, b in zip(trained.state_dict().values(), reference.state_dict().values()))
    runtime.remove_native(trained)
    assert "forward" not in trained.rnn.__dict__ and not stage_paths(trained) and list(trained.state_dict()) == keys
    torch.manual_seed(5)
    after = trained(*inputs)
    torch.manual_seed(5)
    assert torch.equal(after, reference(*inputs))
