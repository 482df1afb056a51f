"""The traced executor (runtime/module.py) never returns a wrong number.

It replays one traced step, so everything a user's loop does that the trace did not see must either
be computed right or refused in words. Each test trains the planned module beside an unplanned twin
from the same seeds, dropout on and recomputed in the backward, and asserts bit-equal gradients and
parameters after several optimizer steps; or asserts the refusal and its message.
"""

from __future__ import annotations

import copy
import io
import random
import types

import pytest
import torch
from torch import nn

import planner
from runtime.native import native_regions
from runtime import InputMismatch, PlanMismatch, ShapeTooLarge
from schedules import recompute_everything, with_schedule

STEPS = 3
WIDTH = 32


def _build(activation=nn.GELU, dropout: float = 0.3) -> nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(3):
        layers += [nn.Linear(WIDTH, WIDTH), activation(), nn.Dropout(dropout)]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 4))


def _batch(batch: int = 16, seed: int = 0, requires_grad: bool = False) -> tuple[torch.Tensor]:
    x = torch.randn(batch, WIDTH, generator=torch.Generator().manual_seed(seed))
    return (x.requires_grad_(requires_grad),)


def _loss(output):
    return output.pow(2).mean()


def _tanh_gelu():
    """GELU's tanh approximation: the same sizes as GELU, so only the op-by-op check tells them apart."""
    return nn.GELU(approximate="tanh")


def _recomputing(plan):
    """The plan with a schedule that recomputes the whole forward, dropout included, in the
    backward: every random op is replayed from its saved RNG state."""
    return with_schedule(plan, recompute_everything(plan.graph))


@pytest.fixture(scope="module")
def gelu_plan():
    return _recomputing(planner.plan(_build(), _batch(), budget="100%", solver="store-all", loss_fn=_loss))


def _pair(plan, build=_build, compile: bool = False):
    """(unplanned twin, planned module): the same weights, trained from the same seeds."""
    return build(), planner.apply(build(), plan, compile=compile)


def _train(model, forward, steps: int = STEPS, seed: int = 0) -> list[dict]:
    """SGD steps; ``forward(model, step)`` computes and backpropagates the step's loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history = []
    for step in range(steps):
        torch.manual_seed(seed + step)
        optimizer.zero_grad(set_to_none=True)
        forward(model, step)
        history.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        optimizer.step()
    return history


def _assert_same(history_a, history_b, model_a, model_b, exact: bool = True):
    assert len(history_a) == len(history_b)
    for a, b in zip(history_a, history_b):
        assert a.keys() == b.keys() and a
        for name in a:
            if exact:
                assert torch.equal(a[name], b[name]), name
            else:
                torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)
    for (name, p), (_, q) in zip(model_a.named_parameters(), model_b.named_parameters()):
        assert torch.equal(p, q) if exact else torch.allclose(p, q, rtol=1e-5, atol=1e-6), name


def _plain_step(model, step):
    _loss(model(*_batch(seed=step))).backward()


# -- 1. RNG states per call ------------------------------------------------------------------------------------
def _r_drop(model, step):
    x = _batch(seed=step)
    (_loss(model(*x)) + _loss(model(*x))).backward()  # two dropout masks, one backward


def _two_backwards(model, step):
    x = _batch(seed=step)
    first, second = _loss(model(*x)), _loss(model(*x))
    first.backward()
    second.backward()


def _backwards_in_reverse(model, step):
    first, second = _loss(model(*_batch(seed=step))), _loss(model(*_batch(seed=step + 10)))
    second.backward()
    first.backward()


@pytest.mark.parametrize("forward", [_r_drop, _two_backwards, _backwards_in_reverse])
def test_two_forwards_before_their_backwards_replay_their_own_dropout(gelu_plan, forward):
    reference, planned = _pair(gelu_plan)
    _assert_same(_train(reference, forward), _train(planned, forward), reference, planned)


def test_two_forwards_and_retain_graph_compiled(gelu_plan):
    """The compiled executor carries each call's generator states with that call's values, and
    keeps them for a second backward under retain_graph=True."""
    reference, planned = _pair(gelu_plan, compile=True)
    _assert_same(_train(reference, _r_drop, steps=2), _train(planned, _r_drop, steps=2), reference, planned,
                 exact=False)
    _assert_same(_train(reference, _retained, steps=2), _train(planned, _retained, steps=2), reference, planned,
                 exact=False)


def test_a_pre_pass_schedule_keeps_its_states_per_call():
    """Random groups first computed out of trace order: a pre-pass records the states, per call."""
    import networkx as nx

    from models import TwoBranches
    from solvers import schedule_from_computes
    from solvers.graph import topological_order

    def build():
        torch.manual_seed(0)
        return TwoBranches()

    x = (torch.randn(8, 32),)
    plan = planner.plan(build(), x, budget="100%", solver="store-all", loss_fn=_loss)
    g = plan.graph
    order = topological_order(g)
    first, second = [n for n in order if g.nodes[n].get("random")]
    moved = [n for n in order if n in nx.ancestors(g, second) | {second} and order.index(n) > order.index(first)]
    reordered = [n for n in order if n not in moved]
    reordered[reordered.index(first):reordered.index(first)] = moved  # the second branch's dropout first
    loss = g.graph["loss_node"]
    before = nx.ancestors(g, loss)
    forward = [n for n in reordered if n in before]
    again = [n for n in forward if not g.nodes[n].get("pinned")]  # both dropouts replayed in the backward
    computes = forward + [loss] + again + [n for n in reordered if n not in before and n != loss]
    plan = with_schedule(plan, schedule_from_computes(g, computes))
    reference, planned = build(), planner.apply(build(), plan)

    def forward(m, step):
        (_loss(m(*x)) + _loss(m(*x))).backward()

    _assert_same(_train(reference, forward), _train(planned, forward), reference, planned)
    assert planned._planned_bound.executor.rng.prepass


# -- 2. the plan is bound to the model and its Python state -------------------------------------------------------
@pytest.mark.parametrize("activation, phrase", [
    (nn.ReLU, r"different model.*graph fingerprint.*native executor"),  # relu saves other tensors: other sizes
    # the same sizes, another argument: only the op-by-op comparison sees it
    (_tanh_gelu, r"differs from this model's at op #\d+.*gelu.*tanh.*native executor"),
])
def test_an_in_memory_plan_for_another_activation_is_refused(gelu_plan, activation, phrase):
    other = planner.apply(_build(activation=activation), gelu_plan)  # the same parameters, other ops
    with pytest.raises(PlanMismatch, match=phrase):
        _plain_step(other, 0)


def test_a_saved_plan_runs_this_models_own_step_or_refuses(gelu_plan, tmp_path):
    """A plan file has no trace to compare ops with: the model's own trace runs (its fingerprint and
    the schedule's validity checked), so the numbers are the tanh-GELU model's, never the GELU model's."""
    gelu_plan.save(tmp_path / "plan.json")
    loaded = planner.load(tmp_path / "plan.json")
    reference, planned = _pair(loaded, build=lambda: _build(activation=_tanh_gelu))  # the same fingerprint
    _assert_same(_train(reference, _plain_step), _train(planned, _plain_step), reference, planned)


class Scaled(nn.Module):
    """Reads Python floats and a flag in its forward (one in a settings object): the trace bakes
    them in."""

    def __init__(self, scale: float = 0.5):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Dropout(0.3))
        self.head = nn.Linear(WIDTH, 4)
        self.scale = scale
        self.body[0].shift = True
        self.options = types.SimpleNamespace(offset=1.0)

    def forward(self, x):
        h = self.body(x) * self.scale
        if self.body[0].shift:
            h = h + self.options.offset
        return self.head(h)


@pytest.fixture(scope="module")
def scaled_plan():
    return _recomputing(planner.plan(Scaled(), _batch(), budget="100%", solver="store-all", loss_fn=_loss))


def test_an_in_memory_plan_for_another_float_attribute_is_refused(scaled_plan):
    with pytest.raises(PlanMismatch, match=r"differs from this model's at op.*0\.5.*0\.7"):
        _plain_step(planner.apply(Scaled(scale=0.7), scaled_plan), 0)
    reference, planned = _pair(scaled_plan, build=Scaled)  # the same value: trains as the original
    _assert_same(_train(reference, _plain_step), _train(planned, _plain_step), reference, planned)


@pytest.mark.parametrize("change, phrase", [
    (lambda m: setattr(m, "scale", 0.9), r"attribute 'scale' is 0\.9 now and was 0\.5"),
    (lambda m: setattr(m.body[0], "shift", False), r"attribute 'body\.0\.shift' is False now and was True"),
    (lambda m: setattr(m.options, "offset", 2.0), r"attribute 'options\.offset' is 2\.0 now and was 1\.0"),
    (lambda m: m.body.eval(), r"submodule 'body' is in eval mode now and was in training mode"),
    (lambda m: m.body[1].register_forward_hook(lambda *a: None), r"hooks were added to or removed from submodule 'body\.1'"),
    (lambda m: m.head.register_forward_pre_hook(lambda *a: None), r"hooks were added to or removed from submodule 'head'"),
    (lambda m: m.body.register_full_backward_hook(lambda *a: None), r"hooks .* submodule 'body'"),
    (lambda m: m.body.__setitem__(1, nn.Identity()), r"submodule 'body\.1' is a Identity now, a Dropout"),
    (lambda m: setattr(m, "extra", 3), r"attribute 'extra' was added"),
])
def test_python_state_changed_after_the_first_step_is_refused(scaled_plan, change, phrase):
    reference, planned = _pair(scaled_plan, build=Scaled)
    _assert_same(_train(reference, _plain_step, steps=1), _train(planned, _plain_step, steps=1), reference, planned)
    change(planned)
    with pytest.raises(PlanMismatch, match=phrase + r".*(make a new plan|Make a new plan).*native executor"):
        _plain_step(planned, 1)


def test_a_hook_added_between_apply_and_the_first_step_is_refused(scaled_plan):
    planned = planner.apply(Scaled(), scaled_plan)
    calls = []
    planned.body.register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(PlanMismatch, match="hooks were added to or removed from submodule 'body'"):
        _plain_step(planned, 0)
    assert not calls  # refused before tracing: the hook did not run once and then never again


def test_a_global_module_hook_added_later_is_refused(scaled_plan):
    planned = planner.apply(Scaled(), scaled_plan)
    _plain_step(planned, 0)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        with pytest.raises(PlanMismatch, match="global module hooks"):
            _plain_step(planned, 1)
    finally:
        handle.remove()
    _plain_step(planned, 2)  # removed: the state is the traced one again


def test_hooks_on_the_planned_module_itself_run_at_every_step(scaled_plan):
    """Root hooks are not traced: the planned module's __call__ runs them around its forward."""
    reference, planned = _pair(scaled_plan, build=Scaled)
    seen = []
    for module in (reference, planned):
        module.register_forward_hook(lambda m, args, out: seen.append(out.detach().clone()))
    _assert_same(_train(reference, _plain_step), _train(planned, _plain_step), reference, planned)
    assert len(seen) == 2 * STEPS
    for a, b in zip(seen[:STEPS], seen[STEPS:]):
        assert torch.equal(a, b)


class PythonEffects(nn.Module):
    """A forward with Python side effects: ``mode`` "layer drop" skips a layer on random.random(),
    "counter" counts its calls and scales by it, "lazy" sets a flag at its first call only."""

    def __init__(self, mode: str):
        super().__init__()
        torch.manual_seed(0)
        self.mode, self.calls, self.ready = mode, 0, False
        self.first, self.second = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Dropout(0.3)), nn.Linear(WIDTH, 4)

    def forward(self, x):
        h = self.first(x)
        if self.mode == "layer drop" and random.random() < 0.5:
            h = h * 0
        if self.mode == "counter":
            self.calls += 1
            h = h * (1 + 0.1 * min(self.calls, 5))  # a warm-up read from the counter
        if self.mode == "lazy" and not self.ready:
            self.ready = True
        return self.second(h)


@pytest.mark.parametrize("mode, phrase", [
    ("layer drop", r"draws from Python's random module.*path of the one call it traced.*native executor"),
    ("counter", r"changes its Python state at every call: after a second call, attribute 'calls' is \d+ now and "
                r"was \d+ before the call.*native executor"),
])
def test_a_forward_with_python_effects_at_every_call_is_refused(mode, phrase):
    plan = planner.plan(PythonEffects(mode), _batch(), budget="100%", solver="store-all", loss_fn=_loss)
    planned = planner.apply(PythonEffects(mode), plan)
    with pytest.raises(PlanMismatch, match=phrase):
        _plain_step(planned, 0)


def test_a_flag_a_first_call_sets_once_is_not_a_refusal():
    plan = _recomputing(planner.plan(PythonEffects("lazy"), _batch(), budget="100%", solver="store-all",
                                     loss_fn=_loss))
    reference, planned = _pair(plan, build=lambda: PythonEffects("lazy"))
    assert not planned.ready
    _assert_same(_train(reference, _plain_step), _train(planned, _plain_step), reference, planned)
    assert planned.ready


# -- 3. tensors changed in place between the forward and the backward ---------------------------------------------
def _refuses_like_eager(model, planned, change):
    """``change(model, inputs, output)`` between the forward and the backward: eager autograd
    raises; so must the planned module, with autograd's words."""
    for module in (model, planned):
        torch.manual_seed(0)
        x = _batch()
        output = module(*x)
        change(module, x, output)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            _loss(output).backward()


def test_an_input_changed_in_place_before_the_backward_is_refused(gelu_plan):
    model, planned = _pair(gelu_plan)
    _refuses_like_eager(model, planned, lambda m, x, out: x[0].mul_(2))


def test_a_parameter_changed_in_place_before_the_backward_is_refused(gelu_plan):
    model, planned = _pair(gelu_plan)
    _refuses_like_eager(model, planned, lambda m, x, out: _step_parameters(m))


def _step_parameters(module):
    with torch.no_grad():
        for p in module.parameters():
            p.add_(1e-3)  # what optimizer.step() does between two backwards


@pytest.mark.parametrize("compile", [False, True])
def test_an_output_the_backward_reads_changed_in_place_is_refused(compile):
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Dropout(0.3), nn.Linear(WIDTH, 4), nn.Tanh())

    plan = _recomputing(planner.plan(build(), _batch(), budget="100%", solver="store-all", loss_fn=_loss))
    model, planned = build(), planner.apply(build(), plan, compile=compile)
    _refuses_like_eager(model, planned, lambda m, x, out: out.mul_(2))  # tanh's backward reads its output
    with pytest.raises(RuntimeError, match="a value the plan holds for the backward"):
        output = planned(*_batch())
        output.mul_(2)
        _loss(output).backward()


def test_an_output_the_backward_does_not_read_may_change_in_place(gelu_plan):
    reference, planned = _pair(gelu_plan)

    def forward(model, step):
        output = model(*_batch(seed=step))
        output.mul_(2)  # the last Linear's output: no backward reads it, eager allows it
        _loss(output).backward()

    _assert_same(_train(reference, forward), _train(planned, forward), reference, planned)


def test_compiled_refuses_an_input_changed_in_place(gelu_plan):
    model, planned = _pair(gelu_plan, compile=True)
    _refuses_like_eager(model, planned, lambda m, x, out: x[0].mul_(2))


# -- 4. inputs that require grad ------------------------------------------------------------------------------
def test_an_input_that_requires_grad_where_the_plan_had_none_is_refused(gelu_plan):
    planned = planner.apply(_build(), gelu_plan)
    with pytest.raises(InputMismatch, match=r"input #0 requires grad.*\.grad would stay empty.*native executor"):
        planned(*_batch(requires_grad=True))
    _plain_step(planned, 0)  # bound now: the per-call check refuses too
    with pytest.raises(InputMismatch, match="input #0 requires grad"):
        planned(*_batch(requires_grad=True))


def test_an_input_planned_with_requires_grad_gets_its_gradient():
    plan = _recomputing(planner.plan(_build(), _batch(requires_grad=True), budget="100%", solver="store-all",
                                     loss_fn=_loss))
    reference, planned = _pair(plan)
    grads = []

    def forward(model, step):
        x = _batch(seed=step, requires_grad=True)
        _loss(model(*x)).backward()
        grads.append(x[0].grad)

    _assert_same(_train(reference, forward), _train(planned, forward), reference, planned)
    for a, b in zip(grads[:STEPS], grads[STEPS:]):
        assert a is not None and torch.equal(a, b)
    _plain_step(planned, 0)  # an input without grad: its gradient is computed and dropped


# -- 5. a second backward, retain_graph, double backward -------------------------------------------------------
def test_a_second_backward_is_refused_as_eager_autograd_refuses_it(gelu_plan):
    for module in _pair(gelu_plan):
        loss = module(*_batch()).sum()  # sum's backward saves nothing: the second backward reaches the module
        loss.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.backward()


def _retained(model, step):
    loss = _loss(model(*_batch(seed=step)))
    loss.backward(retain_graph=True)
    loss.backward()  # the gradients accumulate: twice the first, with the same dropout masks


def test_retain_graph_runs_the_backward_again_with_the_same_masks(gelu_plan):
    reference, planned = _pair(gelu_plan)
    _assert_same(_train(reference, _retained), _train(planned, _retained), reference, planned)


def test_double_backward_is_refused(gelu_plan):
    planned = planner.apply(_build(), gelu_plan)
    loss = _loss(planned(*_batch()))
    with pytest.raises(RuntimeError, match=r"double backward \(create_graph=True"):
        torch.autograd.grad(loss, list(planned.parameters()), create_graph=True)


# -- 6. what the planned module shares with the model ---------------------------------------------------------
def test_hooks_and_train_eval_are_the_planned_modules_own(gelu_plan):
    model = _build()
    planned = planner.apply(model, gelu_plan)
    fired = []
    planned.register_forward_hook(lambda *a: fired.append("planned"))
    planned[0].register_forward_pre_hook(lambda *a: fired.append("planned[0]"))
    with torch.no_grad():
        model(*_batch())
    assert fired == [] and not model._forward_hooks and not model[0]._forward_pre_hooks
    planned.eval()
    assert model.training and all(m.training for m in model.modules())  # the model is left as it was
    assert not any(m.training for m in planned.modules())
    with torch.no_grad():
        assert torch.equal(planned(*_batch()), model.eval()(*_batch()))
    assert fired == ["planned[0]", "planned"]
    assert all(a is b for a, b in zip(model.parameters(), planned.parameters()))
    model[3].bias = nn.Parameter(torch.zeros(WIDTH))  # the parameter tables are shared: reassigned in both
    assert planned[3].bias is model[3].bias
    first = model[0]
    planned[0] = nn.Linear(WIDTH, WIDTH)  # replacing a child of the copy leaves the model's
    assert model[0] is first and planned[0].weight is not first.weight


def test_deepcopy_after_training_trains_as_a_copy_of_the_model(gelu_plan):
    reference, planned = _pair(gelu_plan)
    _assert_same(_train(reference, _plain_step), _train(planned, _plain_step), reference, planned)
    reference_copy, planned_copy = copy.deepcopy(reference), copy.deepcopy(planned)
    assert type(planned_copy) is type(planned) and "_planned_bound" not in planned_copy.__dict__
    assert not any(a is b for a, b in zip(planned_copy.parameters(), planned.parameters()))
    _assert_same(_train(reference_copy, _r_drop, seed=5), _train(planned_copy, _r_drop, seed=5),
                 reference_copy, planned_copy)
    with pytest.raises(PlanMismatch, match="differs from this model's"):  # the copy keeps the op check
        copy.deepcopy(planner.apply(_build(activation=_tanh_gelu), gelu_plan))(*_batch())


def test_torch_save_and_load_of_the_planned_module_after_training(gelu_plan):
    reference, planned = _pair(gelu_plan)
    _assert_same(_train(reference, _plain_step), _train(planned, _plain_step), reference, planned)
    buffer = io.BytesIO()
    torch.save(planned, buffer)
    state = io.BytesIO()
    torch.save(planned.state_dict(), state)
    buffer.seek(0)
    state.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded).__name__ == type(planned).__name__ and loaded.plan.profile is None
    assert list(torch.load(state).keys()) == list(reference.state_dict().keys())
    _assert_same(_train(reference, _plain_step, seed=7), _train(loaded, _plain_step, seed=7), reference, loaded)
    other = planner.apply(_build(activation=_tanh_gelu), gelu_plan)  # the op check survives the file
    buffer = io.BytesIO()
    torch.save(other, buffer)
    buffer.seek(0)
    with pytest.raises(PlanMismatch, match="differs from this model's"):
        torch.load(buffer, weights_only=False)(*_batch())


# -- 7. shapes -------------------------------------------------------------------------------------------------
def test_another_batch_size_is_refused_with_what_serves_it(gelu_plan):
    planned = planner.apply(_build(), gelu_plan)
    _plain_step(planned, 0)
    with pytest.raises(InputMismatch, match=r"float32\[8, 32\].*drop_last=True.*native executor"):
        planned(*_batch(batch=8))
    fresh = planner.apply(_build(), gelu_plan)  # refused before the first trace too
    with pytest.raises(InputMismatch, match=r"float32\[8, 32\].*native executor"):
        fresh(*_batch(batch=8))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.drop = nn.Linear(WIDTH, WIDTH), nn.Dropout(0.2)

    def forward(self, x):
        h = self.drop(torch.tanh(self.linear(x)))
        if h.mean() > 0:  # data-dependent: the tracer cannot follow it, so the plan falls back
            h = h * 2
        return x + h


class Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.fixture(scope="module")
def untraced_plan():
    """A native plan from an eager step (planner/untraced.py): the tracer cannot follow the model."""
    plan = planner.plan(Untraceable(), _batch(batch=64), budget="90%", loss_fn=_loss)
    assert isinstance(plan, planner.NativePlan) and plan.regions
    return plan


def test_an_untraced_plan_refuses_a_larger_batch_and_trains_a_smaller_one(untraced_plan, tmp_path):
    reference, planned = Untraceable(), planner.apply(Untraceable(), untraced_plan)
    with pytest.raises(ShapeTooLarge, match=r"input \[0\]\[0\] has shape \[128, 32\], larger than the \[64, 32\]"):
        _loss(planned(*_batch(batch=128))).backward()
    with torch.no_grad():
        planned(*_batch(batch=128))  # no training step, no plan: any shape

    def forward(model, step):
        _loss(model(*_batch(batch=64 if step == 0 else 40, seed=step))).backward()

    _assert_same(_train(reference, forward), _train(planned, forward), reference, planned)
    untraced_plan.save(tmp_path / "plan.json")  # a plan file keeps the planned shapes
    loaded = planner.apply(Untraceable(), planner.load(tmp_path / "plan.json"))
    with pytest.raises(ShapeTooLarge):
        loaded(*_batch(batch=65))


def test_an_untraced_plans_model_pickles_and_copies_with_its_checkpoints(untraced_plan):
    model = planner.apply(Untraceable(), untraced_plan)
    buffer = io.BytesIO()
    torch.save(model, buffer)  # the checkpointed forwards pickle with the model
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert sorted(native_regions(loaded)) == sorted(untraced_plan.regions)
    with pytest.raises(ShapeTooLarge):  # the shape guard is loaded with it
        _loss(loaded(*_batch(batch=65))).backward()
    copied = copy.deepcopy(model)
    assert copied.blocks[0] is not model.blocks[0] and sorted(native_regions(copied)) == sorted(untraced_plan.regions)