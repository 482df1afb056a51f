"""The native executor: a plan realised by PyTorch's own activation checkpointing, in place.

A native plan names *regions* of the model (solvers/regions/): submodules (``"transformer.h.3"``)
and runs of an ``nn.Sequential``'s children (``"layers[2:5]"``, as ``checkpoint_sequential`` cuts
them), optionally with a save policy (``"transformer.h.3@matmuls"``: a selective checkpoint,
``torch.utils.checkpoint.create_selective_checkpoint_contexts``, that saves the matmuls' and
convolutions' outputs and recomputes the rest; ``@projections`` recomputes the attention's bmm
products too; the ``+draws`` variants keep dropout's random draws: solvers/regions/policies.py SAVE_POLICIES,
runtime/save_policies.py). :func:`apply_native` makes each region's call run under non-reentrant
``torch.utils.checkpoint.checkpoint(use_reentrant=False, preserve_rng_state=True)``, and changes
nothing else: the model is the same object, with the same class, parameters, buffers, hooks,
``state_dict`` keys and ``config``. Its Python forward runs at every call, so hooks added later, flags
that change an ``if``, other batch sizes, two forwards before a backward, ``deepcopy``,
``torch.save``, DDP, FSDP2 per block, ``torch.compile`` and the Hugging Face ``Trainer`` behave as
they do with hand-written checkpointing; autograd, RNG replay and version-counter checks are
PyTorch's.

How: a checkpointed module gets an instance attribute ``forward`` (a :class:`CheckpointedForward`,
picklable and deep-copyable) that calls the class's own ``forward`` through ``checkpoint``; a
Sequential with segment regions gets a :class:`SegmentedForward` that runs its children in order,
each segment as one checkpoint. :func:`remove_native` deletes them.

Besides the regions, :func:`apply_native_plan` adds two forward pre-hooks on the model, both
removed by :func:`remove_native`: the plan's autocast checked at each training call
(runtime/autocast_check.py: a mismatch warns once), and for a Hugging Face model with its config's
``use_cache`` on, ``use_cache=False`` in training calls, as ``gradient_checkpointing_enable()`` does
(runtime/hf_cache.py; :func:`apply_native` adds this one too).

Checkpointing applies whenever autograd records (``torch.is_grad_enabled()``); under ``no_grad`` the
forward runs as it is.

Shapes. The plan was made on example inputs; memory grows with them. A call whose tensor inputs are
larger in any dimension than the planned ones (matched by their position or keyword) is refused with
:class:`ShapeTooLarge` rather than run over the budget; smaller ones (a short last batch, shorter
sequences) run.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
import torch.utils.checkpoint as torch_checkpoint

from .fingerprint import module_fingerprint
from .module import PlanMismatch
from .autocast_check import install_autocast_check, remove_autocast_check
from .compile_notice import quiet_for_save_policies
from .guards import fsdp2_sharded
from .hf_cache import install_cache_off, remove_cache_off
from .hooks import remove_pre_hook
from .rnn import install_for_regions, remove_rnn_stages
from .save_policies import SavePolicy

_SEGMENT = re.compile(r"^(?P<path>.*)\[(?P<start>\d+):(?P<stop>\d+)\]$")
_GUARD = "_native_shape_guard"
PLAN_ATTRIBUTE = "_native_plan"  # the plan planner.apply applied (planner/attached.py); removed with the regions


class ShapeTooLarge(PlanMismatch):
    """A call's inputs are larger than those the native plan was made for."""


def _checkpoint(function, *args, policy: SavePolicy | None = None, **kwargs):
    if policy is None:
        return torch_checkpoint.checkpoint(function, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)
    call = policy.one_call()
    try:
        return torch_checkpoint.checkpoint(function, *args, use_reentrant=False, preserve_rng_state=True,
                                           context_fn=call.context_fn(), **kwargs)
    finally:
        call.close()


def _class_forward(module: torch.nn.Module):
    """``module``'s class forward bound to it. A partial, not ``forward.__get__(module)``: dynamo in
    torch 2.11 cannot trace the descriptor call and skipped every region (7 graphs, regions eager,
    on a GPT-2 on an H100)."""
    return functools.partial(type(module).forward, module)


class CheckpointedForward:
    """A module's ``forward`` run under non-reentrant ``torch.utils.checkpoint``.

    Stored as the module's instance attribute ``forward``; it calls ``type(module).forward``, so the
    module's own code runs at every call. A plain object rather than a closure so that ``deepcopy``
    and ``torch.save`` of the model copy it with the model.
    """

    def __init__(self, module: torch.nn.Module, policy: SavePolicy | None = None):
        self.module = module
        self.policy = policy

    def __call__(self, *args, **kwargs):
        module = self.module
        original = _class_forward(module)
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        return _checkpoint(original, *args, policy=self.policy, **kwargs)


class SegmentedForward:
    """An ``nn.Sequential``'s forward with runs of its children, ``segments`` as ``(start, stop)``
    index pairs, each run as one checkpoint (``torch.utils.checkpoint.checkpoint_sequential``'s
    semantics, with runs of any lengths)."""

    def __init__(self, module: torch.nn.Sequential, segments: list[tuple[int, int, SavePolicy | None]]):
        self.module = module
        self.segments = sorted(segments, key=lambda segment: segment[0])

    def __call__(self, input):
        children = list(self.module)
        starts = {start: (stop, policy) for start, stop, policy in self.segments}
        index = 0
        while index < len(children):
            stop, policy = starts.get(index, (None, None))
            if stop is not None and torch.is_grad_enabled():
                input = _checkpoint(_RunChildren(children[index:stop]), input, policy=policy)
                index = stop
            else:
                input = children[index](input)
                index += 1
        return input


class _RunChildren:
    def __init__(self, children: list[torch.nn.Module]):
        self.children = children

    def __call__(self, input):
        for child in self.children:
            input = child(input)
        return input


class RecomputedBatchNorm:
    """A batch norm's ``forward`` inside a checkpointed region: when the checkpoint recomputes it
    (inside the backward, where autograd's engine runs a graph task), it normalises as the first run
    did, from the batch's statistics, but updates copies of the running statistics, so that they are
    updated once per step as without checkpointing. The first run updates them as usual."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def __call__(self, *args, **kwargs):
        module = self.module
        original = _class_forward(module)
        # Under torch.compile the checkpoint is a higher-order op: AOTAutograd applies the running
        # statistics' update once, in the forward graph, and its recomputation never repeats it
        # (and dynamo cannot trace the graph-task query below: it broke every compiled region).
        if torch.compiler.is_compiling() or not (module.training and module.track_running_stats):
            return original(*args, **kwargs)
        if torch._C._current_graph_task_id() == -1:
            return original(*args, **kwargs)
        names = [n for n in ("running_mean", "running_var", "num_batches_tracked") if getattr(module, n) is not None]
        kept = {n: getattr(module, n) for n in names}
        try:
            # The copies are made outside the dispatch modes: under a save policy the recomputation
            # runs inside selective checkpointing's mode, which refuses an op the forward did not run
            # ("aten.clone.default encountered during backward but not found in storage").
            with _no_dispatch_modes():
                copies = {name: tensor.clone() for name, tensor in kept.items()}
            for name, tensor in copies.items():
                setattr(module, name, tensor)
            return original(*args, **kwargs)
        finally:
            for name, tensor in kept.items():
                setattr(module, name, tensor)


def _no_dispatch_modes():
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


def _batch_norms(modules) -> list[torch.nn.Module]:
    from torch.nn.modules.batchnorm import _BatchNorm

    return [m for top in modules for m in top.modules() if isinstance(m, _BatchNorm)]


def parse_region(region: str) -> tuple[str, tuple[int, int] | None, str | None]:
    """``(module path, None, policy)`` for a module region, ``(Sequential path, (start, stop),
    policy)`` for a segment; ``policy`` is the name after ``@`` (``"h.3@matmuls"``) or None."""
    region, _, policy = region.partition("@")
    match = _SEGMENT.match(region)
    if match is None:
        return region, None, policy or None
    return match["path"], (int(match["start"]), int(match["stop"])), policy or None


def _submodule(model: torch.nn.Module, path: str) -> torch.nn.Module:
    try:
        return model.get_submodule(path) if path else model
    except AttributeError:
        raise PlanMismatch(f"the plan checkpoints module {path!r}, which this model does not have: "
                           "this plan was made for a different model") from None


def apply_native(model: torch.nn.Module, regions, planned_shapes: dict | None = None) -> torch.nn.Module:
    """Checkpoint ``regions`` of ``model`` in place and return ``model`` itself.

    ``planned_shapes``: :func:`input_shapes` of the example inputs the plan was made for; a call
    with a larger tensor input is refused (:class:`ShapeTooLarge`). Applying again replaces what an
    earlier :func:`apply_native` did.
    """
    remove_native(model)
    # A region inside a stacked RNN's stages ("rnn.stages.2", runtime/rnn.py) needs the stages installed.
    install_for_regions(model, regions)
    resolved: list[tuple[torch.nn.Module, tuple[int, int] | None, SavePolicy | None]] = []
    for region in regions:
        path, span, policy_name = parse_region(region)
        module = _submodule(model, path)
        if span is not None and not isinstance(module, torch.nn.Sequential):
            raise PlanMismatch(f"the plan checkpoints children {span[0]}..{span[1] - 1} of {path or 'the model'!r} "
                               f"as one segment, but it is a {type(module).__name__}, not an nn.Sequential")
        if span is not None and span[1] > len(module):
            raise PlanMismatch(f"the plan checkpoints children {span[0]}..{span[1] - 1} of {path or 'the model'!r}, "
                               f"which has {len(module)}: this plan was made for a different model")
        resolved.append((module, span, None if policy_name is None else SavePolicy(policy_name)))
    if any(policy is not None for _, _, policy in resolved):
        quiet_for_save_policies()  # dynamo's context_fn notice is about regions the user wrote
    segments: dict[int, tuple[torch.nn.Module, list]] = {}
    for module, span, policy in resolved:
        if span is None:
            module.__dict__["forward"] = CheckpointedForward(module, policy)
        else:
            segments.setdefault(id(module), (module, []))[1].append((*span, policy))
    for module, spans in segments.values():
        module.__dict__["forward"] = SegmentedForward(module, spans)
    inside = [m for m, span, _ in resolved if span is None]
    inside += [child for m, span, _ in resolved if span is not None for child in list(m)[span[0]:span[1]]]
    for norm in _batch_norms(inside):
        norm.__dict__["forward"] = RecomputedBatchNorm(norm)
    install_cache_off(model)  # a Hugging Face decoder's cache off in training, as HF checkpointing does
    if planned_shapes:
        model.__dict__[_GUARD] = ShapeGuard(tuple((k, tuple(v)) for k, v in planned_shapes.items()))
        model.register_forward_pre_hook(_check_shapes, with_kwargs=True)
    return model


def apply_native_plan(model: torch.nn.Module, plan) -> torch.nn.Module:
    """:func:`apply_native` of a native plan (``regions``, ``input_shapes``, ``fingerprint``), after
    checking that ``model`` is the planned architecture: the same class, parameter and buffer names,
    shapes and dtypes (runtime.fingerprint.module_fingerprint). Returns ``model``."""
    remove_native(model)
    sharded = fsdp2_sharded(model)
    if sharded:
        raise PlanMismatch(
            f"this model is already sharded by FSDP2 (fully_shard on {sharded[0] or 'the root'!r}): apply the plan to the "
            "unsharded model first, then call fully_shard on its blocks and its root (docs/native.md, 'Several processes')")
    if module_fingerprint(model, plan.regions) != plan.fingerprint:
        raise PlanMismatch(
            f"this plan was made for a different model ({plan.model or 'unknown class'}; this is "
            f"{type(model).__name__}, or its parameters or buffers differ in names, shapes or dtypes): make a new plan")
    apply_native(model, plan.regions, plan.input_shapes)
    install_autocast_check(model, getattr(plan, "autocast", ""), _figures(plan))
    return model


def _figures(plan) -> str:
    """The plan's budget and peaks, in MiB, for the autocast check's warning."""
    def mib(n) -> str:
        return f"{n / 2**20:.2f} MiB"

    measured = getattr(plan, "measured_peak_bytes", None)
    return (f"budget {mib(plan.budget_bytes)}, predicted peak {mib(plan.predicted_peak_bytes)}"
            + (f", measured {mib(measured)} while planning" if measured is not None else ""))


def remove_native(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`apply_native`: every module's forward is its class's again (a stacked RNN's
    stages, runtime/rnn.py, are removed too)."""
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), (CheckpointedForward, SegmentedForward, RecomputedBatchNorm)):
            del module.__dict__["forward"]
    remove_rnn_stages(model)
    remove_cache_off(model)
    remove_autocast_check(model)
    remove_pre_hook(model, _check_shapes)
    model.__dict__.pop(_GUARD, None)
    model.__dict__.pop(PLAN_ATTRIBUTE, None)
    return model


def native_regions(model: torch.nn.Module) -> list[str]:
    """The regions checkpointed in ``model`` by :func:`apply_native`, module paths and segments."""
    found = []
    for path, module in model.named_modules():
        forward = module.__dict__.get("forward")
        if isinstance(forward, CheckpointedForward):
            found.append(path + _suffix(forward.policy))
        elif isinstance(forward, SegmentedForward):
            found.extend(f"{path}[{a}:{b}]{_suffix(policy)}" for a, b, policy in forward.segments)
    return found


def _suffix(policy: SavePolicy | None) -> str:
    return "" if policy is None else f"@{policy.name}"


@dataclass(frozen=True)
class ShapeGuard:
    """The planned shape of each tensor input, by its place in ``(args, kwargs)``."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...]

    def check(self, args: tuple, kwargs: dict) -> None:
        planned = dict(self.shapes)
        for key, shape in input_shapes(args, kwargs).items():
            expected = planned.get(key)
            if expected is None or len(expected) != len(shape):
                continue  # an input the plan did not see (labels added by a Trainer): not sized by it
            if any(got > limit for got, limit in zip(shape, expected, strict=True)):
                raise ShapeTooLarge(
                    f"input {key} has shape {list(shape)}, larger than the {list(expected)} the plan was made for; "
                    "a plan serves inputs up to the shapes it was made with: plan with the largest batch and "
                    "sequence you will train on"
                )


def input_shapes(args: tuple, kwargs: dict) -> dict[str, tuple[int, ...]]:
    """Each tensor input's shape, keyed by its place in the call (``"[1]['input_ids']"``)."""
    leaves, _ = pytree.tree_flatten_with_path((tuple(args), dict(kwargs)))
    return {pytree.keystr(path): tuple(leaf.shape) for path, leaf in leaves if isinstance(leaf, torch.Tensor)}


# Run eagerly under torch.compile: dynamo cannot trace pytree's path iteration, and a failed trace of
# this hook made it skip the model's whole forward (7 graphs and eager regions on a GPT-2 instead of
# one graph). Disabled, the check is one graph break before the forward and runs on every call.
@torch.compiler.disable
def _check_shapes(module: torch.nn.Module, args: tuple, kwargs: dict):
    guard = module.__dict__.get(_GUARD)
    if guard is not None and torch.is_grad_enabled():
        guard.check(args, kwargs)
    return None


__all__ = ["PLAN_ATTRIBUTE", "CheckpointedForward", "SegmentedForward", "ShapeGuard", "ShapeTooLarge", "apply_native", "apply_native_plan",
           "input_shapes", "native_regions", "parse_region", "remove_native"]
