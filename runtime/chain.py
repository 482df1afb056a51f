"""Checkpoint whole blocks with ``torch.utils.checkpoint``: the runtime of a module-chain plan.

A module-chain plan (planner/fallback.py) is what ``planner.plan`` makes when the tracer cannot
follow the model's forward (Python control flow on tensor values): it names blocks of the model's
chain of repeated blocks to checkpoint. Each named block runs under
``torch.utils.checkpoint.checkpoint(use_reentrant=False, preserve_rng_state=True)``, which keeps
only the block's inputs and recomputes the block in the backward, replaying its random draws, so
gradients equal the original's. Eager PyTorch runs everything, so any control flow works.

``apply_module_chain`` returns a copy of the model that shares every parameter, buffer and
unchanged submodule with it. The containers on the path to a checkpointed block are shallow copies
with their own table of children, and the block itself is a shallow copy whose class derives from
its own with a checkpointing ``forward``: the original model is not modified.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from typing import Iterable

import torch
import torch.utils.checkpoint as torch_checkpoint

from .module import PlanMismatch


def module_fingerprint(model: torch.nn.Module, blocks: Iterable[str]) -> str:
    """A hash of what a module-chain plan depends on: the model's class, its parameters' and
    buffers' names, shapes and dtypes, and the block paths. Two builds of the same architecture
    have the same fingerprint; another architecture or a renamed block does not."""
    state = [
        [name, list(t.shape), str(t.dtype)]
        for name, t in [*model.named_parameters(), *model.named_buffers()]
    ]
    text = json.dumps({"class": type(model).__name__, "state": state, "blocks": list(blocks)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _checkpointed_forward(self, *args, **kwargs):
    original = functools.partial(type(self)._checkpoint_original.forward, self)
    if not (self.training and torch.is_grad_enabled()):
        return original(*args, **kwargs)
    return torch_checkpoint.checkpoint(original, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)


@functools.lru_cache(maxsize=None)
def _checkpointed_class(cls: type) -> type:
    """``Checkpointed<Block>``: the block's class, its forward run under torch.utils.checkpoint."""
    return type(
        f"Checkpointed{cls.__name__}", (cls,),
        {"forward": _checkpointed_forward, "__module__": cls.__module__, "_checkpoint_original": cls},
    )


def _own_children(module: torch.nn.Module) -> torch.nn.Module:
    """A shallow copy with its own table of children, so replacing a child leaves ``module`` as it is."""
    clone = copy.copy(module)
    clone.__dict__["_modules"] = dict(module._modules)
    return clone


def _checkpointed(block: torch.nn.Module) -> torch.nn.Module:
    base = getattr(type(block), "_checkpoint_original", type(block))
    clone = copy.copy(block)
    clone.__class__ = _checkpointed_class(base)
    return clone


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
    return planned


def checkpoint_blocks(model: torch.nn.Module, paths: Iterable[str]) -> torch.nn.Module:
    """A module sharing ``model``'s parameters whose submodules at ``paths`` run under
    torch.utils.checkpoint in training (no checks: planner/fallback.py measures candidates with it)."""
    planned = _own_children(model)
    copies: dict[str, torch.nn.Module] = {"": planned}  # path -> the planned module's copy at that path

    def copy_at(path: str) -> torch.nn.Module:
        if path not in copies:
            parent, _, name = path.rpartition(".")
            holder = copy_at(parent)
            copies[path] = _own_children(holder._modules[name])
            holder._modules[name] = copies[path]
        return copies[path]

    for path in paths:
        parent, _, name = path.rpartition(".")
        holder = copy_at(parent)
        holder._modules[name] = _checkpointed(holder._modules[name])
    return planned


__all__ = ["apply_module_chain", "checkpoint_blocks", "module_fingerprint"]
