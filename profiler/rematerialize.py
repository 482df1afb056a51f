"""Run the joint graph op by op within a memory bound, evicting values and recomputing them on demand.

What lets the profiler time a step that does not fit (profiler/measure.py, ``time_ops(...,
memory_bound=)``): every op still runs once at its place in the graph, with real tensors, but the
values it would hold are bounded. Before an op runs, the bytes it will allocate (its outputs' sizes,
exact from the fake trace's ``meta["val"]``, plus its measured scratch) are made room for by
evicting held values: whole storages, the one whose next reader is furthest ahead first (Belady's
rule; eviction and on-demand recomputation as in Dynamic Tensor Rematerialization, Kirisame et al.,
ICLR 2021). A reader that finds a value evicted recomputes it from the values that are held
(recursively, down to the placeholders, which are never evicted). Values nothing reads any more are
dropped at once, graph outputs (the gradients) included: profiling needs their time, not their value.

Recomputations are not timed (the op's time is taken where the graph runs it). Random ops recompute
with other draws (the generator has moved on): their time is the same, and no value of the step
is used beyond timing. Ops that mutate an argument are never recomputed, nor are their arguments
evicted.

A bound below the placeholders plus the most one op holds at once (its computed inputs and its
outputs, from the trace) is raised to that: evicting more could not make that op fit. When nothing
can be evicted (every held value is read by an op being computed, or pinned), the op runs anyway,
and :attr:`BoundedStats.peak_bytes` says how far above the bound the run went.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .storage import storage_bytes


@dataclass
class BoundedStats:
    """What one bounded run held and redid. ``peak_bytes``: the most bytes of distinct storages held
    at once by the run's values (placeholders included), counted before each op as what was held
    plus what the op allocates; ``recomputed_calls``: op calls made again for an evicted value."""

    peak_bytes: int = 0
    recomputed_calls: int = 0


def _tensor_leaves(value) -> list[torch.Tensor]:
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _storage_key(tensor: torch.Tensor) -> tuple:
    return (tensor.device, tensor.untyped_storage().data_ptr())


def _aliases_an_input(node: fx.Node) -> bool:
    """Whether the op's outputs share storage with its inputs (a view; getitem of a tuple)."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return any(r.alias_info is not None for r in target._schema.returns)
    return True  # operator.getitem and the like: what they return is already held


def _mutates(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def fresh_bytes(node: fx.Node) -> int:
    """Bytes the op allocates for its outputs (distinct storages of its traced fake outputs), 0
    for an op whose outputs alias its inputs."""
    if node.op != "call_function" or _aliases_an_input(node):
        return 0
    from torch.multiprocessing.reductions import StorageWeakRef

    storages = {StorageWeakRef(t.untyped_storage()): storage_bytes(t) for t in _tensor_leaves(node.meta.get("val"))}
    return sum(storages.values())


class BoundedRun:
    """One graph's bounded execution plan: each value's readers (by position), what each op
    allocates, and what may never be evicted. :meth:`run` executes it once."""

    def __init__(self, graph_module: fx.GraphModule, bound_bytes: int, skipped=lambda node: False):
        self.graph_module = graph_module
        self.bound_bytes = int(bound_bytes)
        self.skipped = skipped  # nodes the run does not execute (buffer mutations)
        self.nodes = list(graph_module.graph.nodes)
        self.by_name = {n.name: n for n in self.nodes}
        self.readers: dict[str, list[int]] = {n.name: [] for n in self.nodes}
        self.pinned: set[str] = set()
        for position, node in enumerate(self.nodes):
            if node.op in ("placeholder", "get_attr"):
                self.pinned.add(node.name)
            if node.op != "call_function" or skipped(node):
                continue
            for arg in node.all_input_nodes:
                self.readers[arg.name].append(position)
            if _mutates(node):
                self.pinned.add(node.name)
                self.pinned.update(a.name for a in node.all_input_nodes)
        self.fresh = {n.name: fresh_bytes(n) for n in self.nodes}
        # The most one op holds at once beside the placeholders: its computed inputs and its outputs.
        # A bound below that (with the placeholders) is raised to it: evicting more cannot make the op
        # fit, and would only make the ops after it recompute what was evicted.
        self.largest_op_bytes = max((self._inputs_bytes(n) + self.fresh[n.name] for n in self.nodes
                                     if n.op == "call_function" and not skipped(n)), default=0)
        # Position -> the computed values last read there (or made there and never read).
        self.last_read: dict[int, list[str]] = {}
        for position, node in enumerate(self.nodes):
            if node.name not in self.pinned:
                readers = self.readers[node.name]
                self.last_read.setdefault(readers[-1] if readers else position, []).append(node.name)

    def _inputs_bytes(self, node: fx.Node) -> int:
        from torch.multiprocessing.reductions import StorageWeakRef

        storages = {}
        for arg in node.all_input_nodes:
            if arg.name not in self.pinned:
                for t in _tensor_leaves(arg.meta.get("val")):
                    storages[StorageWeakRef(t.untyped_storage())] = storage_bytes(t)
        return sum(storages.values())

    def next_use(self, name: str, position: int) -> int | None:
        """The position of the first reader of ``name`` at or after ``position``; None if none."""
        readers = self.readers[name]
        at = bisect.bisect_left(readers, position)
        return readers[at] if at < len(readers) else None

    def run(self, inputs: list, call, constant, reserve: dict[str, int] | None = None) -> BoundedStats:
        """Execute the graph once: ``call(node, args, kwargs)`` for each op at its place (timed by the
        caller), ``node.target`` directly for recomputations; ``constant(node)`` for a get_attr.
        ``reserve``: bytes an op needs beyond its outputs (its scratch, its extra timed calls)."""
        state = _State(self, reserve or {})
        placeholders = iter(inputs)
        for position, node in enumerate(self.nodes):
            if node.op == "placeholder":
                state.hold(node.name, next(placeholders))
                state.bound_bytes = max(self.bound_bytes, state.held_bytes + self.largest_op_bytes)
            elif node.op == "get_attr":
                state.hold(node.name, constant(node))
            elif node.op == "call_function" and not self.skipped(node):
                state.compute(node, position, call)
            state.drop_read_last(position)
        state.clear()
        return state.stats


class _State:
    """The values one bounded run holds, their storages, and the eviction rule."""

    def __init__(self, plan: BoundedRun, reserve: dict[str, int]):
        self.plan, self.reserve = plan, reserve
        self.env: dict[str, object] = {}
        self.keys: dict[str, list[tuple]] = {}  # value -> its storages
        self.holders: dict[tuple, set[str]] = {}  # storage -> values holding it
        self.sizes: dict[tuple, int] = {}
        self.held_bytes = 0
        self.bound_bytes = plan.bound_bytes  # raised to the placeholders and the largest op (BoundedRun.run)
        self.stats = BoundedStats()

    # -- holding and releasing ---------------------------------------------------------------------
    def hold(self, name: str, value) -> None:
        self.env[name] = value
        keys = []
        for tensor in _tensor_leaves(value):
            key = _storage_key(tensor)
            if key not in self.holders:
                self.holders[key] = set()
                self.sizes[key] = storage_bytes(tensor)
                self.held_bytes += self.sizes[key]
            self.holders[key].add(name)
            keys.append(key)
        self.keys[name] = keys

    def release(self, name: str) -> None:
        self.env.pop(name, None)
        for key in self.keys.pop(name, ()):
            holders = self.holders.get(key)
            if holders is None:
                continue
            holders.discard(name)
            if not holders:
                del self.holders[key]
                self.held_bytes -= self.sizes.pop(key)

    def clear(self) -> None:
        for name in list(self.env):
            self.release(name)

    def drop_read_last(self, position: int) -> None:
        """Release the values whose last reader is the op at ``position`` (a value recomputed for a
        reader before it is released in :meth:`compute`)."""
        for name in self.plan.last_read.get(position, ()):
            if name in self.env:
                self.release(name)

    # -- making room -------------------------------------------------------------------------------
    def make_room(self, needed: int, position: int, protected: set[str]) -> None:
        """Evict storages (furthest next reader first) until ``needed`` more bytes fit the bound."""
        plan = self.plan
        while self.held_bytes + needed > self.bound_bytes:
            victim, furthest = None, -1
            for key, holders in self.holders.items():
                if any(h in plan.pinned or h in protected for h in holders):
                    continue
                uses = [plan.next_use(h, position) for h in holders]
                soonest = min((u for u in uses if u is not None), default=len(plan.nodes))
                if soonest > furthest or (soonest == furthest and self.sizes[key] > self.sizes[victim]):
                    victim, furthest = key, soonest
            if victim is None:
                return  # nothing evictable: the op runs above the bound (BoundedStats.peak_bytes)
            for name in list(self.holders[victim]):
                self.release(name)

    # -- computing ---------------------------------------------------------------------------------
    def compute(self, node: fx.Node, position: int, call) -> None:
        """Run ``node`` at its place, recomputing any evicted input first."""
        plan = self.plan
        stack, recomputed = [node], []
        while stack:
            current = stack[-1]
            # An input already lower on the stack is pushed again: the graph is acyclic, and the copy
            # lower down finds it computed.
            missing = [a for a in current.all_input_nodes if a.name not in self.env]
            if missing:
                stack.extend(dict.fromkeys(missing))
                continue
            stack.pop()
            if current.name in self.env:
                continue
            protected = {a.name for pending in (*stack, current) for a in pending.all_input_nodes}
            needed = plan.fresh[current.name] + (self.reserve.get(current.name, 0) if current is node else 0)
            self.make_room(needed, position, protected)
            self.stats.peak_bytes = max(self.stats.peak_bytes, self.held_bytes + needed)
            args = fx.node.map_arg(current.args, lambda n: self.env[n.name])
            kwargs = fx.node.map_arg(current.kwargs, lambda n: self.env[n.name])
            if current is node:
                value = call(current, args, kwargs)
            else:
                value = current.target(*args, **kwargs)
                self.stats.recomputed_calls += 1
            del args, kwargs
            self.hold(current.name, value)
            if current is not node:
                recomputed.append(current.name)
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.held_bytes)
        # What was recomputed only to rebuild another value goes once nothing from here on reads it.
        for name in recomputed:
            if name in self.env and plan.next_use(name, position) is None:
                self.release(name)
