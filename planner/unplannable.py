"""Models the planner refuses before anything runs, each with its cause and what to do (issue 30).

- **Parameters, buffers or inputs on the meta device** (``torch.device("meta")``, or a Hugging Face
  model built with ``init_empty_weights`` and never loaded): a meta tensor has a shape and no
  data, so the step cannot be measured. Profiled anyway, such a model was "planned" with a
  131,088 B "measured" peak beside an 8.08 MB prediction, returned as fitting. Accepted with
  ``distributed="fsdp2"`` or an ``FSDP2(world_size=N)``: a model that only fits sharded is planned
  for per-block FSDP2 from shapes alone (planner/sharded.py); otherwise materialise it first.
- **A Hugging Face model under ``gradient_checkpointing_enable()``** (``activation_checkpointing_enable()``): its layers already run under
  torch.utils.checkpoint, which the profiler's trace cannot see through (it failed with a
  FakeTensor assertion's text, then fell back); the plan decides what to checkpoint, so the
  model's own checkpointing has to be off.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from .sharding import FSDP2


def unplannable_reason(model: torch.nn.Module, example_inputs=None, distributed=None) -> str | None:
    """Why ``model`` (with ``example_inputs``, planned with ``distributed``) cannot be planned as it
    is, and what to do; None when it can."""
    meta = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if meta and not (distributed == "fsdp2" or isinstance(distributed, FSDP2)):
        shown = ", ".join(meta[:3]) + (f" and {len(meta) - 3} more" if len(meta) > 3 else "")
        return (f"{type(model).__name__}'s parameters or buffers are on the meta device ({shown}): they have "
                "shapes but no data, and a plan is measured on a real training step; materialise the model first "
                "(model.to_empty(device=...) and load or initialise its weights, or build it without "
                "torch.device('meta') / init_empty_weights) and plan again; or, for a model that only fits sharded, "
                "plan it for per-block FSDP2 without its weights: distributed=planner.native.FSDP2(world_size=N) "
                "(docs/native.md, 'A model that only fits sharded')")
    leaves = pytree.tree_leaves(example_inputs) if example_inputs is not None else []
    if any(isinstance(leaf, torch.Tensor) and leaf.device.type == "meta" for leaf in leaves):
        return ("the example inputs are on the meta device: they have shapes but no data, and a plan is measured on a "
                "real training step; give real tensors (torch.randn, a batch of your data) on the model's device")
    checkpointing = [name or type(model).__name__ for name, module in model.named_modules()
                     if getattr(module, "gradient_checkpointing", False) is True]
    if checkpointing:
        return (f"{type(model).__name__} already checkpoints its layers (Hugging Face's gradient_checkpointing_enable() "
                f"or activation_checkpointing_enable(): {', '.join(checkpointing[:2])}"
                f"{' and more' if len(checkpointing) > 2 else ''}): the plan decides what to checkpoint; call "
                "model.gradient_checkpointing_disable() (activation_checkpointing_disable() in newer transformers) "
                "before planning, and apply the plan instead")
    return None
