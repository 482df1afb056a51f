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
evicted. Values of the backward (derived from the loss's tangents) are never evicted: rebuilding
one replays the backward up to it and the forward under it, the whole step's activations.

An evicted input is rebuilt by replaying its missing ancestors in graph order, each value protected
only while a replayed op still reads it. What a run holds is known before it runs: every decision
depends on sizes alone, so :meth:`BoundedRun.dry_run` runs the same plan on the trace's fake values
and finds the same peak and recomputations. The bound a run keeps to
(:meth:`BoundedRun.settled_bound`) is the bound given, raised to the placeholders plus the most one
op needs at once (its computed inputs, its outputs, its scratch and the backward values alive across
it: evicting more could not make that op fit), then, where rebuilding an op's evicted inputs holds
more beside them, to what dry runs find it holds: a run given it never holds more.
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
    bound_bytes: int = 0  # the bound the run kept to: the one given, raised as BoundedRun.run says
    placeholder_bytes: int = 0  # of it, the placeholders' and constants' (never evicted)


def _tensor_leaves(value) -> list[torch.Tensor]:
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _storage_key(tensor: torch.Tensor):
    """A storage's identity, for real and fake tensors alike (the dry run holds the trace's fakes)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(tensor.untyped_storage())


def _aliases_an_input(node: fx.Node) -> bool:
    """Whether the op's outputs share storage with its inputs (a view; getitem of a tuple)."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return any(r.alias_info is not None for r in target._schema.returns)
    return True  # operator.getitem and the like: what they return is already held


def _mutates(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def output_storage_bytes(node: fx.Node) -> list[int]:
    """The bytes of each distinct storage the op allocates for its outputs (from its traced fake
    outputs); none for an op whose outputs alias its inputs."""
    if node.op != "call_function" or _aliases_an_input(node):
        return []
    storages = {_storage_key(t): storage_bytes(t) for t in _tensor_leaves(node.meta.get("val"))}
    return list(storages.values())


def fresh_bytes(node: fx.Node) -> int:
    """Bytes the op allocates for its outputs (distinct storages of its traced fake outputs), 0
    for an op whose outputs alias its inputs."""
    return sum(output_storage_bytes(node))


def _derived_from(nodes: list[fx.Node], sources: set[str]) -> set[str]:
    """The names of the nodes that read, directly or not, one of ``sources`` (nodes in graph order)."""
    derived = set(sources)
    for node in nodes:
        if any(a.name in derived for a in node.all_input_nodes):
            derived.add(node.name)
    return derived


class BoundedRun:
    """One graph's bounded execution plan: each value's readers (by position), what each op
    allocates, and what may never be evicted. :meth:`run` executes it once."""

    def __init__(self, graph_module: fx.GraphModule, bound_bytes: int, skipped=lambda node: False,
                 tangents: tuple[str, ...] = ()):
        self.graph_module = graph_module
        self.bound_bytes = int(bound_bytes)
        self.skipped = skipped  # nodes the run does not execute (buffer mutations)
        self.nodes = list(graph_module.graph.nodes)
        self.by_name = {n.name: n for n in self.nodes}
        self.position = {n.name: at for at, n in enumerate(self.nodes)}
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
        self.backward = _derived_from(self.nodes, set(tangents))
        # Per op, what it holds at once beside the placeholders: its computed inputs, its outputs and
        # the backward values alive across it (never evicted: make_room). A bound below the largest
        # (with the placeholders and the op's reserve) is raised to it (run): evicting more cannot make
        # that op fit, and would only make the ops after it recompute what was evicted.
        self.op_bytes = dict(self._op_bytes())
        # Position -> the computed values last read there (or made there and never read).
        self.last_read: dict[int, list[str]] = {}
        for position, node in enumerate(self.nodes):
            if node.name not in self.pinned:
                readers = self.readers[node.name]
                self.last_read.setdefault(readers[-1] if readers else position, []).append(node.name)

    def _op_bytes(self):
        """Per op the run executes, the bytes of the distinct storages it needs at once beside the
        pinned values: its inputs, its outputs and the backward values made before it and read after."""
        from torch.multiprocessing.reductions import StorageWeakRef

        def storages(node: fx.Node) -> dict:
            return {StorageWeakRef(t.untyped_storage()): storage_bytes(t) for t in _tensor_leaves(node.meta.get("val"))}

        alive: dict[str, fx.Node] = {}  # backward values made so far and read again later
        for position, node in enumerate(self.nodes):
            if node.op != "call_function" or self.skipped(node):
                continue
            held = {}
            for value in (*node.all_input_nodes, *alive.values()):
                if value.name not in self.pinned:
                    held.update(storages(value))
            if self.fresh[node.name]:
                held.update(storages(node))
            yield node.name, sum(held.values())
            for name in [n for n in alive if self.next_use(n, position + 1) is None]:
                del alive[name]
            if node.name in self.backward and node.name not in self.pinned and self.next_use(node.name, position + 1):
                alive[node.name] = node

    def next_use(self, name: str, position: int) -> int | None:
        """The position of the first reader of ``name`` at or after ``position``; None if none."""
        readers = self.readers[name]
        at = bisect.bisect_left(readers, position)
        return readers[at] if at < len(readers) else None

    def run(self, inputs: list, call, constant, reserve: dict[str, int] | None = None,
            recompute=None, bound_bytes: int | None = None) -> BoundedStats:
        """Execute the graph once: ``call(node, args, kwargs)`` for each op at its place (timed by the
        caller), ``recompute(node, args, kwargs)`` (default: ``node.target`` directly) for a
        recomputation; ``constant(node)`` for a get_attr. ``reserve``: bytes an op needs beyond its
        outputs (its scratch). ``bound_bytes``: the bound to keep to (default: the plan's), raised
        to the placeholders plus the most one op needs with its reserve (:attr:`op_bytes`)."""
        reserve = reserve or {}
        state = _State(self, reserve, recompute or (lambda node, args, kwargs: node.target(*args, **kwargs)))
        given = self.bound_bytes if bound_bytes is None else bound_bytes
        largest = max((need + reserve.get(name, 0) for name, need in self.op_bytes.items()), default=0)
        placeholders = iter(inputs)
        for position, node in enumerate(self.nodes):
            if node.op == "placeholder":
                state.hold(node.name, next(placeholders))
                state.bound_bytes = max(given, state.held_bytes + largest)
            elif node.op == "get_attr":
                state.hold(node.name, constant(node))
            elif node.op == "call_function" and not self.skipped(node):
                state.compute(node, position, call)
            state.drop_read_last(position)
            if node.op in ("placeholder", "get_attr"):
                state.stats.placeholder_bytes = state.held_bytes
        state.clear()
        state.stats.bound_bytes = state.bound_bytes
        return state.stats

    def settled_bound(self, reserve: dict[str, int] | None = None, tries: int = 4) -> int:
        """The bound a run keeps to (bytes): the plan's, raised to the placeholders plus the most
        one op needs (:meth:`run`), then to what rebuilding an op's evicted inputs holds beside
        them, found by dry runs (:meth:`dry_run`) until one stays within its bound. A run given it
        holds at most it. After ``tries`` dry runs above their bounds: the whole step held, nothing
        evicted (its dry run's peak, within any bound at least that)."""
        bound = self.bound_bytes
        for _ in range(tries):
            stats = self.dry_run(reserve, bound)
            if stats.peak_bytes <= stats.bound_bytes:
                return stats.bound_bytes
            bound = stats.peak_bytes
        return self.dry_run(reserve, 2**62).peak_bytes

    def dry_run(self, reserve: dict[str, int] | None = None, bound_bytes: int | None = None) -> BoundedStats:
        """What :meth:`run` will hold and recompute, from the trace alone: the same run on the traced
        fake values (every decision depends only on sizes), no op executed, nothing allocated."""

        def traced(node, args, kwargs):
            return node.meta["val"]

        def constant(node):  # a lifted constant (get_attr): the module's own tensor, as the real run holds
            value = self.graph_module
            for part in node.target.split("."):
                value = getattr(value, part)
            return value

        inputs = [n.meta["val"] for n in self.nodes if n.op == "placeholder"]
        return self.run(inputs, traced, constant, reserve, recompute=traced, bound_bytes=bound_bytes)


class _State:
    """The values one bounded run holds, their storages, and the eviction rule."""

    def __init__(self, plan: BoundedRun, reserve: dict[str, int], recompute):
        self.plan, self.reserve, self.recompute = plan, reserve, recompute
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
        """Evict storages until ``needed`` more bytes fit the bound: values of the forward only (a
        backward value, derived from the loss's tangents, is rebuilt only by replaying the backward
        up to it and the forward under it: evicting the residual gradient a block's backward reads
        at its end replayed a 6-block MLP's whole step, holding its every activation), the one read
        again furthest ahead first (Belady's rule), the largest on a tie."""
        plan = self.plan
        while self.held_bytes + needed > self.bound_bytes:
            victim, best = None, None
            for key, holders in self.holders.items():
                if any(h in plan.pinned or h in protected or h in plan.backward for h in holders):
                    continue
                uses = [plan.next_use(h, position) for h in holders]
                soonest = min((u for u in uses if u is not None), default=len(plan.nodes))
                rank = (soonest, self.sizes[key])
                if best is None or rank > best:
                    victim, best = key, rank
            if victim is None:
                return  # nothing evictable: the op runs above the bound (BoundedStats.peak_bytes)
            for name in list(self.holders[victim]):
                self.release(name)

    # -- computing ---------------------------------------------------------------------------------
    def _recomputation(self, node: fx.Node) -> list[fx.Node]:
        """The evicted values ``node`` reads and what rebuilding them needs that is not held, in graph
        order (the ancestors of its missing inputs, up to the values held)."""
        plan, needed, pending = self.plan, {}, [a for a in node.all_input_nodes if a.name not in self.env]
        while pending:
            current = pending.pop()
            if current.name in needed:
                continue
            needed[current.name] = current
            pending.extend(a for a in current.all_input_nodes if a.name not in self.env and a.name not in needed)
        return sorted(needed.values(), key=lambda n: plan.position[n.name])

    def compute(self, node: fx.Node, position: int, call) -> None:
        """Run ``node`` at its place, recomputing any evicted input first.

        The recomputation replays the evicted values' ancestors in graph order, as the forward ran
        them, each value protected from eviction only while a replayed op (or ``node``) still has to
        read it: a depth-first rebuild protected every pending op's inputs at once, which held a
        residual chain's every hidden activation (a 6-block MLP held 34 MiB of them against an
        8 MiB bound)."""
        plan = self.plan
        replay = self._recomputation(node)
        # Reads still to come within this call (the replayed ops' and ``node``'s), per value.
        unread: dict[str, int] = {}
        for current in (*replay, node):
            for arg in current.all_input_nodes:
                unread[arg.name] = unread.get(arg.name, 0) + 1
        protected = set(unread)
        for current in (*replay, node):
            needed = plan.fresh[current.name] + (self.reserve.get(current.name, 0) if current is node else 0)
            self.make_room(needed, position, protected)
            self.stats.peak_bytes = max(self.stats.peak_bytes, self.held_bytes + needed)
            args = fx.node.map_arg(current.args, lambda n: self.env[n.name])
            kwargs = fx.node.map_arg(current.kwargs, lambda n: self.env[n.name])
            if current is node:
                value = call(current, args, kwargs)
            else:
                value = self.recompute(current, args, kwargs)
                self.stats.recomputed_calls += 1
            del args, kwargs
            self.hold(current.name, value)
            del value
            self.stats.peak_bytes = max(self.stats.peak_bytes, self.held_bytes)
            for arg in current.all_input_nodes:
                unread[arg.name] -= 1
                if unread[arg.name] == 0:
                    protected.discard(arg.name)
                    # Nothing after this op reads it: released now, not held through the replay.
                    if arg.name in self.env and self._read_by_nothing_after(arg.name, position):
                        self.release(arg.name)

    def _read_by_nothing_after(self, name: str, position: int) -> bool:
        """Whether ``name`` is not pinned and no op after ``position`` reads it."""
        return name not in self.plan.pinned and self.plan.next_use(name, position + 1) is None
