"""What the model's own program holds, op by op, while its forward runs: recorded during the first
trace (profiler/capture.py), for the native executor's recomputation (solvers/regions/early_stop.py).

A traced graph says when each value is last *read*; the program can hold it longer. Python
variables live until their function returns (nanoGPT's attention keeps ``q, k, v``, views of the
fused projection's output, to the end of its ``forward``), a composite op's C++ locals until it
returns (``scaled_dot_product_attention``'s math path keeps the scaled query through its last
``bmm``), an op's arguments until it runs. Eager autograd hides most of it in a full forward (the
values are saved anyway, or the peak is elsewhere), but ``torch.utils.checkpoint``'s non-reentrant
recomputation stops *inside* the region's forward, when the last tensor the region saved is packed
again (``_StopRecomputationError``, raised from the pack hook): what the program holds at that
moment is alive beside what the replay packed.

:class:`ForwardLifetimes`, a ``TorchDispatchMode`` around the model's forward inside ``make_fx``,
tags each op's graph nodes (their ``custom`` metadata, which the functionalizing second trace
copies) with

- ``forward_op`` (:data:`FORWARD_OP`): the op's ordinal in the forward;
- ``autograd_seq`` (:data:`AUTOGRAD_SEQ`): the sequence number of the autograd node the op created
  (the node whose backward reads what the op saved), when it created one;

and, once the forward has run, ``released_after`` (:data:`RELEASED_AFTER`): the ordinal of the last
op that ran while the op's result was still alive (watched through weak references to its output
tensors; a view keeps its base alive), or none when the result outlived the forward (an output, a
tensor autograd saved; no tag); and ``in_place_of`` (:data:`IN_PLACE_OF`) on an in-place op (its
result is the tensor it was given: dropout's ``bernoulli_`` and ``div_``), the ordinal of the op
that made the version it overwrote. Eager allocates nothing for it, where the functionalized graph
has a new value (solvers/in_place.py counts it once). The overwritten version is released after
that op, the new version when the tensor dies.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

FORWARD_OP = "forward_op"
AUTOGRAD_SEQ = "autograd_seq"
RELEASED_AFTER = "released_after"
IN_PLACE_OF = "in_place_of"
LIFETIME_TAGS = (FORWARD_OP, AUTOGRAD_SEQ, RELEASED_AFTER, IN_PLACE_OF)


@dataclass
class _Watch:
    """One output tensor watched: the ordinal of the latest op that returned it."""

    ordinal: int
    ref: weakref.ref | None = field(default=None, repr=False)


class ForwardLifetimes(TorchDispatchMode):
    """Records, for every op of the forward run under it, its ordinal, the autograd node it created
    and when its outputs die (see the module docstring). Enter it around the model's forward only:
    the ops after it (the loss, the backward) are not the region's program."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.released_after: dict[int, int] = {}
        self.outlived: set[int] = set()
        self.in_place_of: dict[int, int] = {}
        self._watches: dict[int, _Watch] = {}
        self._last_seq = torch.autograd._get_sequence_nr()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "prim":  # the tracer's queries (prim.device): no op of the graph
            return func(*args, **(kwargs or {}))
        ordinal = self.ops
        self.ops += 1
        previous = fx_traceback.current_meta.get("custom")
        tags = {**(previous or {}), FORWARD_OP: ordinal}
        # The autograd node of an op is made (and numbered) before the op reaches a dispatch mode.
        seq = torch.autograd._get_sequence_nr()
        if seq != self._last_seq:
            tags[AUTOGRAD_SEQ] = seq - 1
            self._last_seq = seq
        fx_traceback.current_meta["custom"] = tags
        try:
            out = func(*args, **(kwargs or {}))
        finally:
            fx_traceback.current_meta["custom"] = previous
        for tensor in pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._watch(tensor, ordinal)
        return out

    def _watch(self, tensor: torch.Tensor, ordinal: int) -> None:
        key = id(tensor)
        watch = self._watches.get(key)
        if watch is not None and watch.ref is not None and watch.ref() is tensor:  # in place: a new version
            self._release(watch.ordinal, ordinal)
            self.in_place_of[ordinal] = watch.ordinal
            watch.ordinal = ordinal
            return
        watch = _Watch(ordinal)
        watch.ref = weakref.ref(tensor, lambda _, key=key, watch=watch: self._died(key, watch))
        self._watches[key] = watch

    def _died(self, key: int, watch: _Watch) -> None:
        self._release(watch.ordinal, self.ops - 1)
        if self._watches.get(key) is watch:
            del self._watches[key]

    def _release(self, ordinal: int, after: int) -> None:
        self.released_after[ordinal] = max(after, self.released_after.get(ordinal, after))

    def finish(self) -> None:
        """Mark what is still alive when the forward has returned: it outlived the forward."""
        for watch in self._watches.values():
            if watch.ref is not None and watch.ref() is not None:
                self.outlived.add(watch.ordinal)

    def release_of(self, ordinal: int) -> int | None:
        """The ordinal of the last op during which op ``ordinal``'s results were alive; None when
        one of them outlived the forward."""
        if ordinal in self.outlived:
            return None
        return self.released_after.get(ordinal)


def tag_releases(graph_module: fx.GraphModule, lifetimes: ForwardLifetimes) -> None:
    """Add ``released_after`` and ``in_place_of`` to the ``custom`` tags of the first trace's
    forward nodes, before the second trace copies them (a node's tags are its own dict: fx copies
    them per node)."""
    for node in graph_module.graph.nodes:
        tags = node.meta.get("custom")
        if not tags or FORWARD_OP not in tags:
            continue
        ordinal = tags[FORWARD_OP]
        added = {}
        released = lifetimes.release_of(ordinal)
        if released is not None:  # none: the result outlived the forward
            added[RELEASED_AFTER] = released
        if ordinal in lifetimes.in_place_of:
            added[IN_PLACE_OF] = lifetimes.in_place_of[ordinal]
        node.meta["custom"] = {**tags, **added}
