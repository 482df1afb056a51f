"""``--max-batch``: the largest batch size whose plan fits the budget (within an overhead), found on
interpolated profiles and verified on a real one."""

import json

import networkx as nx
import pytest
import torch

import planner
from planner.cli.maxbatch import MaxBatchError, batch_size_of, largest_fitting, predict_graph, scale_inputs

from test_cli import model_file, run

MODEL = """
import torch
from torch import nn

def build_model():
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [nn.Linear(32, 32), nn.Tanh()]
    return nn.Sequential(*layers)

def example_inputs():
    return (torch.randn(64, 32, generator=torch.Generator().manual_seed(0)),)
"""
BUDGET = 400_000


def _model():
    namespace = {}
    exec(MODEL, namespace)
    return namespace["build_model"](), namespace["example_inputs"]()


def _fits(model, inputs, batch, max_overhead=None):
    """Whether a real profile and plan at ``batch`` fit BUDGET (within max_overhead)."""
    try:
        made = planner.plan(model, scale_inputs(inputs, batch), BUDGET, solver="chen-greedy")
    except planner.BudgetInfeasible:
        return False
    return max_overhead is None or made.predicted_overhead <= max_overhead


@pytest.mark.parametrize("overhead", [None, "0"])
def test_max_batch_is_the_largest_that_fits(tmp_path, overhead):
    out = tmp_path / "plan.json"
    extra = ["--max-overhead", overhead] if overhead is not None else []
    result = run(model_file(tmp_path, MODEL), "--budget", BUDGET, "--solver", "chen-greedy", "--max-batch", *extra,
                 "--out", out, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    batch = summary["batch_size"]
    assert summary["example_batch_size"] == 64 and batch > 64
    plan = planner.load(out)
    assert plan.inputs == [f"float32[{batch}, 32] on cpu"]  # the plan is for the batch it reports
    assert plan.predicted_peak_bytes <= BUDGET
    if overhead == "0":  # no recomputation allowed: the un-checkpointed step must fit
        assert plan.predicted_overhead == 0.0 and plan.unplanned_peak_bytes <= BUDGET
    # ... and one more row does not fit (memory is exactly linear in the batch for this model).
    model, inputs = _model()
    assert not _fits(model, inputs, batch + 1, 0.0 if overhead == "0" else None)


def test_max_overhead_needs_max_batch(tmp_path, capsys):
    from planner.cli import main

    assert main([str(model_file(tmp_path, MODEL)), "--budget", str(BUDGET), "--max-overhead", "0.3"]) == 2
    assert capsys.readouterr().err == "plan-checkpoints: error: --max-overhead goes with --max-batch (the overhead the largest batch may cost)\n"


def test_inputs_scale_along_dimension_zero():
    inputs = {"x": torch.arange(6.0).reshape(3, 2), "y": torch.tensor([1, 2, 3]), "flag": True}
    assert batch_size_of(inputs) == 3
    grown = scale_inputs(inputs, 7)
    assert grown["x"].shape == (7, 2) and grown["y"].tolist() == [1, 2, 3, 1, 2, 3, 1] and grown["flag"] is True
    shrunk = scale_inputs(inputs, 2)
    assert shrunk["x"].untyped_storage().nbytes() == 2 * 2 * 4  # its own storage, not a view of all rows
    with pytest.raises(MaxBatchError, match="differ"):
        batch_size_of((torch.zeros(3, 2), torch.zeros(4)))
    with pytest.raises(MaxBatchError, match="scalar"):
        batch_size_of((torch.zeros(3, 2), torch.tensor(1.0)))


def test_predicted_graph_is_linear_in_the_batch():
    def graph(batch):
        g = nx.DiGraph(fixed_bytes=1000 + 10 * batch)
        g.add_node("a", cost=1.0 + 0.5 * batch, mem=100 * batch, workspace=8)
        g.add_node("b", cost=2.0, mem=7 + 3 * batch, workspace=4 * batch)
        g.add_edge("a", "b")
        return g

    predicted = predict_graph({4: graph(4), 8: graph(8)}, 20)
    expected = graph(20)
    assert predicted.graph["fixed_bytes"] == expected.graph["fixed_bytes"]
    for node in expected:
        for key in ("cost", "mem", "workspace"):
            assert predicted.nodes[node][key] == pytest.approx(expected.nodes[node][key])


def test_search_finds_the_boundary_of_a_monotone_predicate():
    for limit in (1, 2, 63, 64, 65, 1000, 12345):
        calls = []
        found = largest_fitting(lambda b, calls=calls, limit=limit: calls.append(b) or b <= limit, 64)
        assert found == limit and len(calls) < 40
    assert largest_fitting(lambda b: False, 64) == 0
    assert largest_fitting(lambda b: b <= 100, 64, below=90) == 89
    with pytest.raises(MaxBatchError, match="does not seem to grow"):
        largest_fitting(lambda b: True, 8)


SEQUENCE_FIRST = """
import torch
from torch import nn

def build_model():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(8)])

def example_inputs():
    return (torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(0)),)  # (time, batch, features)

def inputs_at(batch):
    return (torch.randn(4, batch, 32, generator=torch.Generator().manual_seed(0)),)

def loss_fn(output):
    return output.pow(2).mean()
"""

FIXED_LABELS = MODEL + """
LABELS = torch.zeros(64, dtype=torch.long)

def loss_fn(output):
    return torch.nn.functional.cross_entropy(output, LABELS)
"""


def test_a_loss_with_fixed_size_targets_is_named_as_what_stopped_it(tmp_path):
    result = run(model_file(tmp_path, FIXED_LABELS), "--budget", BUDGET, "--solver", "chen-greedy", "--max-batch",
                 "--out", tmp_path / "plan.json")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "at batch size 32 (dimension 0 of every tensor input scaled from 64 to 32) the step failed: the loss" \
        in result.stderr, result.stderr
    assert "loss_fn whose targets are sized from the output" in result.stderr
    assert not (tmp_path / "plan.json").exists()


def test_inputs_at_builds_the_inputs_at_each_batch(tmp_path):
    """Dimension 0 is time here: scaling it would change the sequence, not the batch."""
    out = tmp_path / "plan.json"
    result = run(model_file(tmp_path, SEQUENCE_FIRST), "--budget", 200_000, "--solver", "chen-greedy",
                 "--max-batch", "--out", out, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    batch = summary["batch_size"]
    assert summary["example_batch_size"] == 4 or batch != 16  # the search ran over the real batch dimension
    assert planner.load(out).inputs == [f"float32[4, {batch}, 32] on cpu"]


def test_the_plan_found_is_measured_with_the_users_loss(monkeypatch):
    """On CUDA the traced plan --max-batch settles on is measured and repaired
    (planner.api.repaired_on_measurement): that step must take the user's loss_fn (a Hugging Face
    model's loss, output #0), not the default over every output. The measurement, run on CPU here."""
    import planner.api as api
    from planner.cli.maxbatch import find_max_batch

    from models import gpt2, gpt2_inputs, hf_loss

    measured = []
    real_measure = api._measure_traced

    def measuring(*args, **kwargs):
        measured.append(real_measure(*args, **kwargs))
        return measured[-1]

    monkeypatch.setattr(api, "cuda_devices", lambda tensors: [torch.device("cpu")])  # take the CUDA path
    monkeypatch.setattr(api, "_measure_traced", measuring)
    model, inputs = gpt2(layers=2, embd=32, heads=2, vocab=100, positions=32), gpt2_inputs(batch=4, tokens=32, vocab=100)
    found = find_max_batch(model, inputs, "6MB", solver="dp", loss_fn=hf_loss)
    assert found.batch_size > 4 and measured and found.plan.budget_bytes == 6_000_000
