"""Checkpoint whole blocks with ``torch.utils.checkpoint``: the runtime of a module-chain plan.

A module-chain plan (planner/fallback.py) is what ``planner.plan`` made, before such models got
native plans (planner/untraced.py), when the tracer could not follow the model's forward (Python
control flow on tensor values); its plan files still load and run here. It names blocks of the
model's chain of repeated blocks to checkpoint. Each named block runs under
``torch.utils.checkpoint.checkpoint(use_reentrant=False, preserve_rng_state=True)``, which keeps
only the block's inputs and recomputes the block in the backward, replaying its random draws, so
gradients equal the original's. Eager PyTorch runs everything, so any control flow works.

``apply_module_chain`` returns a copy of the model's module tree (runtime.module.copy_module_tree)
that shares every module's tables of parameters and buffers with it but no module: each module of
the copy has its own ``training`` flag, hook tables and table of children, so a hook on the copy
never fires on the original and ``planned.eval()`` leaves the original in training mode.
Each checkpointed block's class in the copy derives from its own with a checkpointing ``forward``:
the original model is not modified.

Shapes: the plan's peak was measured on its example inputs, and memory grows with them. A training
call with a tensor input larger in any dimension than the planned one is refused
(``runtime.native.ShapeTooLarge``) rather than run over the budget; smaller ones run.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

import torch
import torch.utils._pytree as pytree
import torch.utils.checkpoint as torch_checkpoint

from .fingerprint import module_fingerprint
from .module import PlanMismatch, copy_module_tree
from .native import ShapeTooLarge


def _checkpointed_forward(self, *args, **kwargs):
    original = functools.partial(type(self)._checkpoint_original.forward, self)
    if not (self.training and torch.is_grad_enabled()):
        return original(*args, **kwargs)
    return torch_checkpoint.checkpoint(original, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)


def _restore_checkpointed(base: type) -> torch.nn.Module:
    """An empty checkpointed block of ``base``'s class; pickle then sets its state."""
    return object.__new__(_checkpointed_class(base))


def _checkpointed_reduce_ex(self, protocol):
    # The class is made at run time and has no importable name: pickle it by its base.
    return _restore_checkpointed, (type(self)._checkpoint_original,), self.__getstate__()


@functools.cache
def _checkpointed_class(cls: type) -> type:
    """``Checkpointed<Block>``: the block's class, its forward run under torch.utils.checkpoint."""
    return type(
        f"Checkpointed{cls.__name__}", (cls,),
        {"forward": _checkpointed_forward, "__module__": cls.__module__, "_checkpoint_original": cls,
         "__reduce_ex__": _checkpointed_reduce_ex},
    )


def _resolve(model: torch.nn.Module, path: str) -> torch.nn.Module:
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise PlanMismatch(
            f"this plan checkpoints block {path!r}, which this model does not have; it was made for another model"
        ) from None


def apply_module_chain(model: torch.nn.Module, plan) -> torch.nn.Module:
    """A module sharing ``model``'s parameters whose blocks ``plan.chain.checkpointed`` run under
    torch.utils.checkpoint in training. Refuses (PlanMismatch) a model the plan was not made for."""
    chain = plan.chain
    for path in chain.block_paths:
        _resolve(model, path)
    found = module_fingerprint(model, chain.block_paths)
    if found != plan.fingerprint:
        raise PlanMismatch(
            f"this plan was made for a different model (fingerprint {plan.fingerprint}, this model gives {found}: "
            "other parameter names, shapes or dtypes); make a new plan for it"
        )
    planned = checkpoint_blocks(model, chain.checkpointed)
    planned.__dict__["plan"] = plan
    shapes = planned_shapes(getattr(plan, "inputs", None) or [])
    if shapes is not None:
        planned.__dict__[_SHAPES] = shapes
        planned.register_forward_pre_hook(_check_shapes, with_kwargs=True)  # the copy's own hook table
    return planned


_SHAPES = "_chain_planned_shapes"
_SIGNATURE = re.compile(r"^\w+\[(?P<dims>[\d, ]*)\] on ")


def planned_shapes(signature: list[str]) -> tuple[tuple[int, ...], ...] | None:
    """The shapes of a plan's tensor inputs, from its ``inputs`` (``"float32[64, 64] on cpu"``);
    None when one cannot be read (then nothing is checked: a plan file of another version)."""
    shapes = []
    for text in signature:
        match = _SIGNATURE.match(text)
        if match is None:
            return None
        dims = match["dims"].strip()
        shapes.append(tuple(int(d) for d in dims.split(",")) if dims else ())
    return tuple(shapes)


def _check_shapes(module: torch.nn.Module, args: tuple, kwargs: dict):
    """Refuse a training call larger than the example inputs the plan's peak was measured on."""
    planned = module.__dict__.get(_SHAPES)
    if planned is None or not (module.training and torch.is_grad_enabled()):
        return None  # no checkpointing runs, and no plan's figures apply
    tensors = [leaf for leaf in pytree.tree_leaves((tuple(args), dict(kwargs))) if isinstance(leaf, torch.Tensor)]
    if len(tensors) != len(planned):
        raise ShapeTooLarge(
            f"this call has {len(tensors)} tensor inputs; the fallback plan's peak was measured with {len(planned)} "
            f"({', '.join(str(list(s)) for s in planned)}) and says nothing of these: make a plan for these inputs"
        )
    for index, (tensor, expected) in enumerate(zip(tensors, planned)):
        shape = tuple(tensor.shape)
        if len(shape) != len(expected) or any(got > limit for got, limit in zip(shape, expected)):
            raise ShapeTooLarge(
                f"input #{index} has shape {list(shape)}, larger than the {list(expected)} the fallback plan's peak was "
                "measured with; a plan serves inputs up to the shapes it was made with: plan with the largest "
                "batch and sequence you will train on"
            )
    return None


def checkpoint_blocks(model: torch.nn.Module, paths: Iterable[str]) -> torch.nn.Module:
    """A copy of ``model``'s module tree (sharing its parameter and buffer tables) whose submodules at
    ``paths`` run under torch.utils.checkpoint in training (no checks: :func:`apply_module_chain`
    checks the plan first)."""
    planned, _ = copy_module_tree(model)
    for path in paths:
        block = planned.get_submodule(path) if path else planned
        base = getattr(type(block), "_checkpoint_original", type(block))
        block.__class__ = _checkpointed_class(base)
    return planned


__all__ = ["apply_module_chain", "checkpoint_blocks", "module_fingerprint", "planned_shapes"]
