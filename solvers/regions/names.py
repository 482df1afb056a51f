"""Region names: a module path (``"transformer.h.3"``), a run of an ``nn.Sequential``'s children
(``"layers[2:5]"``), either with a save policy (``"@matmuls"``); and the node ids of recomputations
(``"recompute:v"``) in a region graph. Names are what plan files keep.
"""

from __future__ import annotations

import re
from collections.abc import Hashable

from .policies import split_policy

RECOMPUTE = "recompute"


def twin(node: Hashable) -> str:
    """The node id of ``node``'s recomputation in a region graph (a string, so that plan files keep it)."""
    return f"{RECOMPUTE}:{node}"


_SEGMENT = re.compile(r"^(?P<path>.*)\[(?P<start>\d+):(?P<stop>\d+)\]$")


def segment(path: str, start: int, stop: int) -> str:
    """The region of children ``start`` to ``stop - 1`` of the ``nn.Sequential`` at ``path``, run as
    one checkpoint (as ``torch.utils.checkpoint.checkpoint_sequential`` does): ``"layers[2:5]"``."""
    return f"{path}[{start}:{stop}]"


def parse_segment(region: str) -> tuple[str, int, int] | None:
    """``(path, start, stop)`` of a segment region, None for a module region."""
    match = _SEGMENT.match(region)
    if match is None:
        return None
    return match["path"], int(match["start"]), int(match["stop"])


def within(module: str, region: str) -> bool:
    """``module`` (a dotted module path) runs inside ``region``: a module region is the module and its
    submodules; a segment region the children of its ``nn.Sequential`` in its range, and theirs."""
    region, _ = split_policy(region)
    parsed = parse_segment(region)
    if parsed is None:
        return module == region or module.startswith(region + ".")
    path, start, stop = parsed
    prefix = path + "." if path else ""
    if not module.startswith(prefix):
        return False
    child = module[len(prefix):].split(".", 1)[0]
    return child.isdigit() and start <= int(child) < stop
