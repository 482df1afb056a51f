"""Forward pre-hooks the runtime adds to a planned model, removed by identity.

No handle is kept: a RemovableHandle holds a weak reference, and ``torch.save`` of the whole model
would fail on it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def remove_pre_hook(model: torch.nn.Module, hook: Callable) -> None:
    """Remove every forward pre-hook of ``model`` that is ``hook`` (with or without kwargs)."""
    for key, registered in list(model._forward_pre_hooks.items()):
        if registered is hook:
            del model._forward_pre_hooks[key]
            model._forward_pre_hooks_with_kwargs.pop(key, None)
