"""Hostile models and messages, second pass (issue 30): an eval-mode model planned as the training
step it will run, meta-device models and models under Hugging Face's gradient checkpointing refused
before anything runs, --max-batch's messages, time-outs that quote the user's budget. The command
line runs as a subprocess (tests/hostile.py), the API in-process.
"""

from __future__ import annotations

import warnings

import hostile
import pytest
from hostile import TINY, EXIT_USAGE, assert_refused, cli, snapshot

folder = hostile.folder


def _dropout_mlp():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.3), nn.Linear(64, 64), nn.GELU(), nn.Dropout(0.3),
                         nn.Linear(64, 4)), (torch.randn(256, 32),)


def test_an_eval_mode_model_is_planned_as_its_training_step():
    """Planned as it was, the dropout-free step: 18% over the budget once model.train() ran."""
    import torch

    import planner
    from planner import PlanWarning

    model, inputs = _dropout_mlp()
    trained = planner.plan(model, inputs, 10**6)
    model.eval()
    model[2].train()  # a submodule's own mode is put back as it was, too
    with pytest.warns(PlanWarning, match="was in eval mode: planned as its training step"):
        made = planner.plan(model, inputs, 10**6)
    assert not model.training and model[2].training and not model[5].training
    # The dropout masks are in the un-checkpointed step it predicts, as in the training-mode plan.
    assert made.unplanned_peak_bytes == trained.unplanned_peak_bytes
    assert "planned as its training step (model.train()" in made.schedule.info.message
    assert "planned as its training step" in made.summary()
    with pytest.warns(PlanWarning, match="eval mode"):
        traced = planner.plan(model.eval(), inputs, "100%", solver="dp")
    assert "planned as its training step" in traced.summary() and torch.is_grad_enabled()
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)  # a model in training mode: no word about it
        assert "eval mode" not in planner.plan(model, inputs, "100%", solver="dp").summary()


META = """
import torch
from torch import nn

def build_model():
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))

def example_inputs():
    return (torch.randn(8, 16),)
"""


def test_a_meta_model_is_refused_before_anything_runs(folder):
    """It was 'planned': a 131,088 B 'measured' peak beside an 8.08 MB prediction."""
    (folder / "meta.py").write_text(META)
    before = snapshot(folder)
    result = cli("meta.py", "--budget", "60%", "--out", "p.json", cwd=folder)
    assert_refused(result, EXIT_USAGE, "on the meta device", "materialise the model first", seconds=60)
    assert "Profiling" not in result.stderr or "Traceback" not in result.stderr
    assert snapshot(folder) == before


def test_the_api_refuses_meta_models_and_inputs():
    import torch
    from torch import nn

    import planner

    with torch.device("meta"):
        meta = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    for solver in ("auto", "dp"):
        with pytest.raises(planner.SolverError, match="0.weight, 0.bias, 2.weight and 1 more"):
            planner.plan(meta, (torch.randn(4, 8),), "60%", solver=solver)
    with pytest.raises(planner.SolverError, match="example inputs are on the meta device"):
        planner.plan(nn.Linear(8, 2), (torch.empty(4, 8, device="meta"),), "60%")


def test_a_model_under_hf_gradient_checkpointing_is_named_as_the_cause():
    """It fell back with a FakeTensor assertion's text."""
    import models

    import planner

    model = models.gpt2(layers=2, embd=32, heads=2, vocab=100, positions=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # newer transformers: "use activation_checkpointing_enable"
        model.gradient_checkpointing_enable()
    inputs = models.gpt2_inputs(2, 16, 100)
    with pytest.raises(planner.SolverError, match=r"already checkpoints its layers .*gradient_checkpointing_disable"):
        planner.plan(model, inputs, "60%", loss_fn=models.hf_loss)
    with pytest.raises(planner.SolverError, match="already checkpoints its layers"):
        planner.api.profile_for(model, inputs, loss_fn=models.hf_loss)  # what the command line profiles with


@pytest.mark.parametrize("options, phrases", [
    (["--budget", "1GB"], ["budget 1GB", "is simply large for this model", "a sample"]),
    (["--budget", "100%", "--solver", "regions"], ["--max-batch plans traced plans only"]),
    (["--budget", "100%", "--executor", "native"], ["--max-batch plans traced plans only"]),
])
def test_max_batch_says_what_is_wrong(folder, options, phrases):
    result = cli("model.py", "--max-batch", *options, "--out", "p.json", cwd=folder)
    assert_refused(result, EXIT_USAGE, *phrases, seconds=90)
    assert "does not seem to grow" not in result.stderr
    if "--max-batch plans traced plans only" in phrases:
        assert "Profiling" not in result.stderr  # refused before loading the model
    assert not (folder / "p.json").exists()


def test_a_time_out_quotes_the_users_budget_in_the_api(monkeypatch, tmp_path):
    import planner
    import planner.granularity
    from planner.cli.modelfile import load_model_file

    (tmp_path / "model.py").write_text(TINY)
    loaded = load_model_file(str(tmp_path / "model.py"))

    def out_of_time(graph, budget, method="auto", time_limit=None, **options):
        raise TimeoutError(f"ilp: no schedule within {budget} bytes found in the time limit")

    monkeypatch.setattr(planner.granularity, "solve", out_of_time)
    with pytest.raises(planner.PlanTimeout) as raised:  # above the least any plan needs (6056 B)
        planner.plan(loaded.model, loaded.example_inputs, "6150B", solver="ilp", time_limit=1)
    assert str(raised.value).startswith("no schedule within budget 6150B (6.01 KiB, 6150 bytes of the whole step)")
    assert "byte figures are of the activations alone, the step holding 2.90 KiB (2968 bytes)" in str(raised.value)
    assert isinstance(raised.value, TimeoutError)
