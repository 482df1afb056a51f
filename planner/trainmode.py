"""A model handed to the planner in eval mode is planned as the training step it will run.

A plan is for a training step: the native executor checkpoints only while ``model.training`` (and
grad) are on, and the traced executor replays its schedule only then. A model in eval mode
(``model.eval()``; Hugging Face's ``from_pretrained`` returns one) traces a different step: dropout
off, batch norm reading its running statistics. Planned as it was, such a plan measured 18% over its
budget once the user called ``model.train()`` (issue 30: 4,940,968 B against 4,185,602 B). So the
planner puts the model in training mode (``model.train()``, every submodule) while it profiles and
measures, puts every submodule's mode back afterwards, warns, and says so in the plan's message.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch

NOTE = ("the model was in eval mode: planned as its training step (model.train(): dropout on, batch norm "
        "updating its statistics); call model.train() before training with this plan")


@contextlib.contextmanager
def training_step(model: torch.nn.Module, warning: type[Warning]) -> Iterator[bool]:
    """Run the block with ``model`` in training mode; yields whether it was switched (the model was
    in eval mode: warns ``warning``). Every submodule's own mode is put back on exit, so that a
    module the user keeps in eval mode inside a training model stays so; a model already in training
    mode is left exactly as it is (its submodules' modes are the user's)."""
    if not isinstance(model, torch.nn.Module) or model.training:
        yield False
        return
    modes = [(module, module.training) for module in model.modules()]
    warnings.warn(f"{type(model).__name__}: {NOTE}", warning, stacklevel=4)
    model.train()
    try:
        yield True
    finally:
        for module, mode in modes:
            module.training = mode
