"""The native executor in the training loops users write (issue: a faithful module in every loop).

Each test trains the planned model beside an unplanned copy from the same seeds and asserts equal
gradients and parameters after several optimizer steps, dropout on; or a clear refusal. Plans are
made once per model (module fixtures) at a budget that makes them checkpoint something.
"""

from __future__ import annotations

import copy
import io
import random

import pytest
import torch
from torch import nn

import planner
import profiler
from models import gpt2, gpt2_inputs, hf_loss, mlp
from runtime import PlanMismatch
from runtime.native import ShapeTooLarge, apply_native, input_shapes, native_regions, remove_native

STEPS = 3


def _inputs(batch: int = 256, width: int = 64, seed: int = 0):
    return (torch.randn(batch, width, generator=torch.Generator().manual_seed(seed)),)


def _loss(output):
    return output.pow(2).mean()


@pytest.fixture(scope="module")
def mlp_plan():
    model = mlp(width=64, depth=6, dropout=0.2)
    return planner.plan(model, _inputs(), budget="70%", loss_fn=_loss)


def _planned_pair(plan, build=lambda: mlp(width=64, depth=6, dropout=0.2)):
    reference = build()
    model = build()
    planned = planner.apply(model, plan)
    assert native_regions(planned), "the plan should checkpoint something at this budget"
    return reference, planned


def _train(model, batches, loss_fn=_loss, seed: int = 0, forward=None):
    """SGD steps from fixed seeds; returns the gradients of every step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history = []
    for step, batch in enumerate(batches):
        torch.manual_seed(seed + step)
        random.seed(seed + step)
        optimizer.zero_grad(set_to_none=True)
        if forward is None:
            loss_fn(model(*batch)).backward()
        else:
            forward(model, batch)
        named = getattr(model, "_orig_mod", model).named_parameters()  # torch.compile's wrapper: the model's names
        history.append({n: p.grad.clone() for n, p in named if p.grad is not None})
        optimizer.step()
    return history


def _assert_same(history_a, history_b, model_a, model_b):
    for a, b in zip(history_a, history_b, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), name
    for (name, p), (_, q) in zip(model_a.named_parameters(), model_b.named_parameters(), strict=True):
        assert torch.equal(p, q), name


def test_native_is_the_default_and_returns_the_model_itself(mlp_plan):
    assert isinstance(mlp_plan, planner.NativePlan) and mlp_plan.executor == "native"
    model = mlp(width=64, depth=6, dropout=0.2)
    keys = list(model.state_dict())
    assert planner.apply(model, mlp_plan) is model
    assert type(model) is nn.Sequential and list(model.state_dict()) == keys
    assert native_regions(model) == list(mlp_plan.regions)
    remove_native(model)
    assert native_regions(model) == [] and "forward" not in model.__dict__


def test_planning_leaves_the_model_as_it_was():
    """Planning measures a step: its gradients, RNG draws and buffer updates must not leak into the
    user's first step (a loop that zeroes gradients after the step would add them)."""
    model = mlp(width=64, depth=6, dropout=0.2)
    model[0].weight.grad = torch.ones_like(model[0].weight)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    planner.plan(model, _inputs(), budget="70%", loss_fn=_loss)
    assert torch.equal(model[0].weight.grad, torch.ones_like(model[0].weight))
    assert all(p.grad is None for name, p in model.named_parameters() if name != "0.weight")
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())
    assert "forward" not in model.__dict__ and not native_regions(model)


def test_measured_peak_within_the_budget_and_near_the_prediction(mlp_plan):
    model = planner.apply(mlp(width=64, depth=6, dropout=0.2), mlp_plan)
    measured = profiler.measure_step(model, _inputs(), loss_fn=_loss, repeats=1)
    assert measured.peak_bytes <= mlp_plan.budget_bytes
    assert abs(measured.peak_bytes - mlp_plan.predicted_peak_bytes) <= 0.02 * mlp_plan.predicted_peak_bytes
    assert mlp_plan.measured_peak_bytes <= mlp_plan.budget_bytes


def test_several_steps_with_dropout_equal_the_unplanned_model(mlp_plan):
    reference, planned = _planned_pair(mlp_plan)
    batches = [_inputs(seed=s) for s in range(STEPS)]
    _assert_same(_train(reference, batches), _train(planned, batches), reference, planned)


def test_a_smaller_last_batch_runs_and_a_larger_one_is_refused(mlp_plan):
    reference, planned = _planned_pair(mlp_plan)
    batches = [_inputs(seed=0), _inputs(seed=1), _inputs(batch=7, seed=2)]
    _assert_same(_train(reference, batches), _train(planned, batches), reference, planned)
    with pytest.raises(ShapeTooLarge, match=r"larger than the \[256, 64\] the plan was made for"):
        planned(*_inputs(batch=512))
    with torch.no_grad():  # inference is not what the budget is about: any shape
        planned(*_inputs(batch=512))


@pytest.mark.parametrize("how", ["summed", "two backwards"])
def test_two_forwards_before_their_backwards(mlp_plan, how):
    """R-Drop / SimCSE: two forwards with different dropout masks, then the backward(s)."""

    def forward(model, batch):
        first, second = model(*batch), model(*batch)
        if how == "summed":
            (_loss(first) + _loss(second) + (first - second).pow(2).mean()).backward()
        else:
            _loss(first).backward()
            _loss(second).backward()

    reference, planned = _planned_pair(mlp_plan)
    batches = [_inputs(seed=s) for s in range(STEPS)]
    _assert_same(_train(reference, batches, forward=forward), _train(planned, batches, forward=forward),
                 reference, planned)


def test_hooks_added_later_and_flags_that_change_take_effect(mlp_plan):
    reference, planned = _planned_pair(mlp_plan)
    seen = {"reference": 0, "planned": 0}
    reference[0].register_forward_hook(lambda m, i, o: seen.__setitem__("reference", seen["reference"] + 1))
    planned[0].register_forward_hook(lambda m, i, o: seen.__setitem__("planned", seen["planned"] + 1))
    for model in (reference, planned):  # a flag read by the forward, changed after planning
        model[2].p = 0.5
    batches = [_inputs(seed=s) for s in range(STEPS)]
    _assert_same(_train(reference, batches), _train(planned, batches), reference, planned)
    # The hook fires at the forward and again at the recomputation (as with hand-written checkpointing).
    assert seen["reference"] == STEPS and seen["planned"] >= STEPS


class LayerDrop(nn.Module):
    """Blocks skipped on Python's random.random(), as Hugging Face's LayerDrop does."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Dropout(0.1)) for _ in range(6))
        self.head = nn.Linear(64, 4)
        self.layerdrop = 0.3

    def forward(self, x):
        for block in self.blocks:
            if self.training and random.random() < self.layerdrop:
                continue
            x = x + block(x)
        return self.head(x)


def test_python_control_flow_runs_at_every_call():
    example = _inputs()
    model = LayerDrop()
    model.layerdrop = 0.0  # plan the full depth: the largest step
    plan = planner.plan(model, example, budget="60%", loss_fn=_loss)
    reference = LayerDrop()
    planned = planner.apply(LayerDrop(), plan)
    assert native_regions(planned)
    batches = [_inputs(seed=s) for s in range(4)]
    _assert_same(_train(reference, batches), _train(planned, batches), reference, planned)


def test_deepcopy_and_torch_save_after_training(mlp_plan):
    reference, planned = _planned_pair(mlp_plan)
    batches = [_inputs(seed=s) for s in range(STEPS)]
    _train(reference, batches)
    _train(planned, batches)
    copied = copy.deepcopy(planned)
    assert native_regions(copied) == native_regions(planned)
    assert all(m.__dict__["forward"].module is m for m in copied.modules() if "forward" in m.__dict__)
    buffer = io.BytesIO()
    torch.save(planned, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    state = io.BytesIO()
    torch.save(planned.state_dict(), state)
    assert list(torch.load(io.BytesIO(state.getvalue())).keys()) == list(reference.state_dict())
    more = [_inputs(seed=10 + s) for s in range(2)]
    expected = _train(reference, more, seed=10)
    for model in (copied, loaded):  # each from the same start as the reference's second run
        _assert_same(expected, _train(model, more, seed=10), reference, model)


def test_torch_compile_compiles_the_planned_model(mlp_plan):
    graphs = []

    def counting_backend(graph_module, example_inputs):
        # aot_eager: autograd's graphs as torch.compile makes them for inductor, run without code
        # generation. (The "eager" backend, which skips them, replays dropout differently inside a
        # checkpoint in torch 2.13: gradients off by ~1e-6 on this model, planned or by hand.)
        graphs.append(graph_module)
        return torch._dynamo.lookup_backend("aot_eager")(graph_module, example_inputs)

    reference, planned = _planned_pair(mlp_plan)
    compiled = torch.compile(planned, backend=counting_backend)
    batches = [_inputs(seed=s) for s in range(2)]
    _assert_same(_train(reference, batches), _train(compiled, batches), reference, planned)
    assert graphs, "torch.compile captured no graph"
    assert any("checkpoint" in str(node.target) for g in graphs for node in g.graph.nodes), \
        "the checkpoint regions did not reach the compiled graph"


def _compiled_graphs(model):
    """``torch.compile(model)`` with aot_eager (see above), and the list its dynamo graphs go to."""
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return torch._dynamo.lookup_backend("aot_eager")(graph_module, example_inputs)

    return torch.compile(model, backend=counting_backend), graphs


def _checkpoints(graphs) -> int:
    return sum("checkpoint" in str(node.target) for g in graphs for node in g.graph.nodes)


@pytest.mark.parametrize("case", ["gpt2 kwargs + save policy", "batch norm segment"])
def test_torch_compile_captures_the_whole_planned_step_in_one_graph(case):
    """Every region in one dynamo graph: the shape guard's pytree walk, and the batch norm's
    graph-task query, once made dynamo skip the forward (7 graphs on a GPT-2 on an H100; none on a
    CNN with batch norms: its regions ran eagerly). Equal gradients and running statistics. The
    ``+draws`` policy saves dropout's draws by op name under torch.compile (runtime/save_policies.py):
    the compiled step must still draw the eager step's masks."""
    from models import cnn

    if case.startswith("gpt2"):
        build, regions = (lambda: gpt2(layers=2, embd=32, heads=2, vocab=64, positions=16)), \
            ["transformer.h.0@projections", "transformer.h.1.mlp@matmuls+draws"]
        batches = [((), gpt2_inputs(batch=2, tokens=16, vocab=64)) for _ in range(2)]
        loss_fn = hf_loss
    else:
        build, regions = cnn, ["[0:3]", "[3:6]"]
        batches = [((torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(s)),), {}) for s in range(2)]
        loss_fn = _loss
    reference, model = build(), build()
    args, kwargs = batches[0]
    apply_native(model, regions, input_shapes(args, kwargs))
    compiled, graphs = _compiled_graphs(model)

    def step(m, batch):
        loss_fn(m(*batch[0], **batch[1])).backward()

    _assert_same(_train(reference, batches, forward=step), _train(compiled, batches, forward=step), reference, model)
    assert len(graphs) == 1, f"{len(graphs)} graphs: the planned forward was split or skipped"
    assert _checkpoints(graphs) == len(regions)
    for (name, a), (_, b) in zip(reference.named_buffers(), model.named_buffers(), strict=True):
        assert torch.equal(a, b), name


def test_batch_norms_under_a_save_policy_train_as_eager():
    """A batch norm inside a ``@matmuls`` region: its recomputation copies the running statistics,
    an op the forward did not run, which selective checkpointing refused in the backward (the zoo's
    U-Net at 75%: 'bottom@matmuls'). Gradients, parameters and running statistics equal to eager's."""
    from models import cnn

    reference, model = cnn(), cnn()
    apply_native(model, ["[0:3]@matmuls", "[3:6]"])
    batches = [(torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(s)),) for s in range(STEPS)]
    _assert_same(_train(reference, batches), _train(model, batches), reference, model)
    for (name, a), (_, b) in zip(reference.named_buffers(), model.named_buffers(), strict=True):
        assert torch.equal(a, b), name


# A decoder at its default config (use_cache=True) plans: tests/test_user_models.py.


def test_an_encoder_refusal_does_not_blame_the_cache():
    """BERT's config says use_cache=True too, but an encoder returns no cache: its refusal must not
    tell the user to turn the cache off (only a traced output holding a cache gets that hint)."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                       intermediate_size=64, vocab_size=64, max_position_embeddings=16))
    assert model.config.use_cache
    with pytest.raises(planner.BudgetInfeasible) as refused:
        planner.plan(model, gpt2_inputs(batch=2, tokens=16, vocab=64), budget="30%", loss_fn=hf_loss)
    assert refused.value.min_budget is not None and "use_cache" not in str(refused.value)


def test_a_refusals_least_budget_plans():
    """The least budget a refusal names counts the generator state each of the least plan's
    checkpoints saves: asking for exactly that many bytes plans, within them when measured (it named
    the activations' least plus the parameters and inputs only, and that budget was refused again)."""
    model = mlp(width=64, depth=6, dropout=0.2)
    with pytest.raises(planner.BudgetInfeasible) as refused:  # pinned: the traced executor reaches less
        planner.plan(model, _inputs(), budget="25%", loss_fn=_loss, executor="native")
    least = refused.value.min_budget
    assert least is not None
    plan = planner.plan(model, _inputs(), budget=int(least), loss_fn=_loss, executor="native")
    assert native_regions(planner.apply(mlp(width=64, depth=6, dropout=0.2), plan))
    assert plan.predicted_peak_bytes <= least and plan.measured_peak_bytes <= least


def test_a_plan_applied_to_another_model_is_refused(mlp_plan):
    with pytest.raises(PlanMismatch, match="different model"):
        planner.apply(mlp(width=32, depth=6), mlp_plan)


def test_saved_plans_load_and_apply(mlp_plan, tmp_path):
    mlp_plan.save(tmp_path / "plan.json")
    loaded = planner.load(tmp_path / "plan.json")
    assert isinstance(loaded, planner.NativePlan)
    assert loaded.regions == mlp_plan.regions and loaded.input_shapes == mlp_plan.input_shapes
    reference, planned = _planned_pair(loaded)
    batches = [_inputs(seed=s) for s in range(2)]
    _assert_same(_train(reference, batches), _train(planned, batches), reference, planned)


# -- Hugging Face: the same model object, its config untouched, the Trainer ---------------------------
@pytest.fixture(scope="module")
def gpt2_plan():
    model = gpt2(layers=3, embd=64, heads=4, vocab=256, positions=32)
    return planner.plan(model, gpt2_inputs(batch=4, tokens=32, vocab=256), budget="65%", loss_fn=hf_loss)


def test_hugging_face_model_keeps_its_class_config_and_gradients(gpt2_plan):
    def build():
        return gpt2(layers=3, embd=64, heads=4, vocab=256, positions=32)

    reference, model = build(), build()
    config = model.config.to_dict()
    planned = planner.apply(model, gpt2_plan)
    assert planned is model and type(model).__name__ == "GPT2LMHeadModel" and model.config.to_dict() == config
    batches = [gpt2_inputs(batch=4, tokens=32, vocab=256), gpt2_inputs(batch=2, tokens=16, vocab=256)]

    def forward(m, batch):
        m(**batch).loss.backward()

    _assert_same(_train(reference, [(b,) for b in batches], forward=lambda m, b: forward(m, b[0])),
                 _train(planned, [(b,) for b in batches], forward=lambda m, b: forward(m, b[0])), reference, planned)


def test_hugging_face_trainer_trains_evaluates_and_resumes(gpt2_plan, tmp_path):
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainingArguments

    class Tokens(Dataset):
        def __init__(self, count):
            self.ids = torch.randint(0, 256, (count, 32), generator=torch.Generator().manual_seed(count))

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    def build():
        return gpt2(layers=3, embd=64, heads=4, vocab=256, positions=32)

    model = planner.apply(build(), gpt2_plan)
    arguments = TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4,
                                  per_device_eval_batch_size=4, max_steps=3, save_steps=2, report_to=[],
                                  use_cpu=True, seed=0, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=arguments, train_dataset=Tokens(10), eval_dataset=Tokens(6))
    trainer.train()  # 10 rows in batches of 4: a smaller last batch
    metrics = trainer.evaluate()
    assert "eval_loss" in metrics and torch.isfinite(torch.tensor(metrics["eval_loss"]))
    resumed = Trainer(model=planner.apply(build(), gpt2_plan), args=arguments, train_dataset=Tokens(10),
                      eval_dataset=Tokens(6))
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    model.save_pretrained(tmp_path / "saved")
    import json

    assert json.loads((tmp_path / "saved" / "config.json").read_text())["architectures"] == ["GPT2LMHeadModel"]


def test_the_trainer_example_runs(tmp_path):
    """examples/trainer.py as a user runs it (small sizes): plans, trains with the Trainer, evaluates."""
    import subprocess
    import sys

    root = __file__.rsplit("/tests/", 1)[0]
    result = subprocess.run(
        [sys.executable, f"{root}/examples/trainer.py", "--steps", "3", "--layers", "2", "--tokens", "32",
         "--budget", "85%", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=600, cwd=root,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "checkpointed: transformer." in result.stdout and "eval_loss" in result.stdout, result.stdout


def test_batch_norm_inside_a_checkpoint_updates_its_statistics_once():
    """A recomputed batch norm runs on copies of its running statistics (runtime/native.py): after
    several steps the buffers equal the unplanned model's, num_batches_tracked included."""
    from models import cnn

    example = (torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)
    plan = planner.plan(cnn(), example, budget="90%", loss_fn=_loss)
    assert any("[" in r for r in plan.regions), plan.regions  # a segment holding convolutions and norms
    reference, planned = cnn(), planner.apply(cnn(), plan)
    batches = [(torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(s)),) for s in range(STEPS)]
    _assert_same(_train(reference, batches), _train(planned, batches), reference, planned)
    for (name, a), (_, b) in zip(reference.named_buffers(), planned.named_buffers(), strict=True):
        assert torch.equal(a, b), name


def test_the_predicted_step_time_is_coarsely_the_measured_one():
    """The plan's predicted step (the profiled op times summed over its schedule) against the step it
    measured (wall clock): at least a third of it, and at most 8 times it, coarse enough for a loaded
    2-core machine (load only lengthens the measured step: 3.4x at load 5 with other processes on
    both cores), tight enough to catch a unit error. On one thread: on two threads of a loaded
    2-core machine ops wait on each other's thread (measured steps 8-90x the prediction at load
    13-16; a cross-entropy 37-74 ms on two threads at load ~4, 0.7-1.7 ms on one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = mlp(width=256, depth=8, dropout=0.1)
        plan = planner.plan(model, (torch.randn(512, 256),), budget="70%", loss_fn=_loss)
    finally:
        torch.set_num_threads(threads)
    assert plan.measured_seconds is not None and plan.predicted_seconds > 0
    assert 1 / 3 < plan.measured_seconds / plan.predicted_seconds < 8, (plan.measured_seconds, plan.predicted_seconds)
