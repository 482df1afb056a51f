"""Profile a model built on the meta device (``with torch.device("meta")``): one too large for the
process's memory, planned for sharding (planner/sharded.py). Nothing of the whole step is ever real.

- **Sizes** come from the trace, which never needed real values: the parameters and buffers are
  swapped for fake tensors (``FakeTensorMode``) on the example inputs' device for the time of the
  trace, so the joint graph is exactly the one a materialised model traces to.
- **The loss** is run for real on random outputs of the traced outputs' sizes (its time, the
  workspace it allocates, the value the caller holds: profiler/loss.py), which outputs it
  differentiates learnt from the same forward on fake tensors.
- **Op times** are measured one op at a time on random values of the traced sizes
  (profiler/opwise.py): only one op's inputs, weights included, are real at once, and the ops of
  identical blocks share one measurement.

The model is left as it was: its parameters stay on the meta device.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import torch
import torch.utils._pytree as pytree
from torch.nn.utils.stateless import _reparametrize_module

from .api import Profile, _annotate, choose_grouping, parse_granularity
from .capture import capture
from .costgraph import build_cost_graph
from .errors import CaptureError, ModelCallError, first_line
from .inputs import normalise_inputs
from .library_memory import step_library_bytes
from .loss import LossInfo, default_loss, run_planning_loss
from .opwise import real_like, time_ops_one_at_a_time


def is_meta_model(model: torch.nn.Module) -> bool:
    """Whether any of ``model``'s parameters or buffers is on the meta device."""
    return any(t.device.type == "meta" for t in (*model.parameters(), *model.buffers()))


def inputs_device(example_inputs) -> torch.device:
    """The device of the example inputs' first tensor (CPU without any): where the model will run."""
    leaves = pytree.tree_leaves(example_inputs)
    return next((leaf.device for leaf in leaves if isinstance(leaf, torch.Tensor)), torch.device("cpu"))


@contextlib.contextmanager
def fake_state(model: torch.nn.Module, device: torch.device) -> Iterator[FakeState]:
    """``model``'s parameters and buffers swapped for fake tensors of the same shapes, strides and
    dtypes on ``device`` (tied weights stay tied), put back on exit."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    made: dict[int, torch.Tensor] = {}
    state = {}
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        if id(tensor) not in made:
            with mode:
                fake = torch.empty_strided(tuple(tensor.shape), tensor.stride(), dtype=tensor.dtype, device=device)
            made[id(tensor)] = fake.requires_grad_(tensor.requires_grad)
        state[name] = made[id(tensor)]
    with _reparametrize_module(model, state, tie_weights=True):
        yield FakeState(mode, state)


class FakeState:
    """The fake mode and the fake tensors :func:`fake_state` swapped in, by name."""

    def __init__(self, mode, tensors: dict[str, torch.Tensor]):
        self.mode, self.tensors = mode, tensors


def _fake_outputs(model: torch.nn.Module, args, kwargs, state: FakeState) -> list:
    """The output leaves of the model's forward on fake tensors, autograd on."""
    fake_args, fake_kwargs = pytree.tree_map_only(torch.Tensor, state.mode.from_tensor, (tuple(args), dict(kwargs)))
    try:
        with state.mode:
            return pytree.tree_flatten(model.forward(*fake_args, **fake_kwargs))
    except Exception as error:  # a user's mistake (inputs that do not fit the model), not ours
        raise ModelCallError(f"the model raised on the example inputs (run on fake tensors: its parameters are on "
                             f"the meta device): {first_line(error)}") from error


class _Outputs(torch.nn.Module):
    """A stand-in whose forward returns given outputs: profiler/loss.py's planning loss run on them."""

    def __init__(self, leaves: list, spec):
        super().__init__()
        self.leaves, self.spec = leaves, spec

    def forward(self):
        return pytree.tree_unflatten(self.leaves, self.spec)


def meta_loss(model: torch.nn.Module, args, kwargs, loss_fn: Callable, state: FakeState) -> LossInfo:
    """The planning loss (profiler/loss.py :class:`LossInfo`) for a model on the meta device: its
    outputs' sizes and which require grad from a forward on fake tensors; the loss run for real on
    random outputs of those sizes (its time, workspace and value)."""
    leaves, spec = _fake_outputs(model, args, kwargs, state)
    real = [real_like(leaf).detach().requires_grad_(leaf.requires_grad) if isinstance(leaf, torch.Tensor) else leaf
            for leaf in leaves]
    if not any(isinstance(leaf, torch.Tensor) and leaf.requires_grad for leaf in real):
        raise CaptureError("no output of the model requires grad: there is nothing to differentiate")
    info, _ = run_planning_loss(_Outputs(real, spec), (), {}, loss_fn)
    return info


def meta_profile(model: torch.nn.Module, example_inputs, loss_fn: Callable | None = None, granularity="op",
                 repeats: int = 3) -> Profile:
    """The :class:`profiler.Profile` of ``model``'s training step (parameters on the meta device)
    on ``example_inputs`` (real tensors: the batch of one rank), as :func:`profiler.profile` makes
    it with ``fuse_loss=False`` (the eager cross-entropy backward), measured without the model:
    see the module docstring. ``profile.times.held_peak_bytes``: the most the op timing held."""
    started = time.perf_counter()
    parse_granularity(granularity)
    args, kwargs = normalise_inputs(example_inputs)
    device = inputs_device((args, kwargs))
    with fake_state(model, device) as state:
        loss = meta_loss(model, args, kwargs, loss_fn or default_loss, state)
        joint, _ = capture(model, args, kwargs, loss=loss, fuse_loss=False)
    grouping, label = choose_grouping(joint, granularity)
    times = time_ops_one_at_a_time(joint.graph_module, repeats=repeats)
    times = replace(times, library_bytes=step_library_bytes(joint.graph_module, device))
    graph = build_cost_graph(joint, grouping, times)
    _annotate(graph, str(device), label, times)
    return Profile(graph, joint, grouping, times, label, str(device), time.perf_counter() - started)


__all__ = ["fake_state", "inputs_device", "is_meta_model", "meta_loss", "meta_profile"]
