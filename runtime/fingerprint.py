"""What a plan of the model's own modules is bound to: its architecture and the paths it names."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

import torch


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
