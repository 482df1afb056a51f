"""One rank's peak under per-block FSDP2, exactly: the unsharded step's simulated memory, op by op,
with FSDP2's own buffers allocated and freed where FSDP2 (torch 2.13, CPU: no side streams)
allocates and frees them (torch/distributed/fsdp/_fully_shard: FSDPParamGroup.unshard,
wait_for_unshard, reshard, pre_backward, post_backward, foreach_all_gather, foreach_reduce).

Per group (a unit's parameters, or the root's: those in no unit), in bytes, ``world`` ranks, every
parameter's dim 0 padded to a multiple of ``world`` (planner/sharding.py ``shard_bytes``):
``gathered`` its parameters unsharded (padded), ``shard`` this rank's ``gathered / world``,
``whole`` its parameters as the unsharded step holds them, ``grads`` its trainable parameters'.

- Held all step: every parameter's shard (instead of the whole parameter), and the root's group
  gathered (the root does not reshard after forward).
- Forward: the root all-gathers first (its flat all-gather output beside the copied-out
  parameters). Each unit, before its first op, all-gathers into a flat output (the previous
  group's flat output still held: FSDP2 keeps it to overlap the copy-out with the next
  all-gather), frees the previous flat output, copies out into its unsharded parameters; after its
  last op it reshards (its flat output stays until the next unit's copy-out, the last one's until
  the root's post-forward, after the loss).
- Backward: the root's pre-backward prefetches the last unit (its flat output held); each unit's
  pre-backward copies out (flat output and parameters at once), frees the flat output and prefetches
  the unit before; its post-backward reshards, frees the previous unit's reduce-scatter input (one
  held at most: ``reduce_scatter_max_input_buffers=1``), allocates its own (``gathered`` bytes)
  while the whole gradients are still live, frees them and keeps the reduced shard (``shard``
  bytes). The root's group does the same after the last op (the final callback).
- A region spanning several units: the last unit's pre-backward fires (and prefetches the unit
  before) before the checkpoint recomputes them all; each earlier unit's recomputation runs its
  forward hooks, which copy it out (from the prefetched flat output, else all-gathered anew) and
  keep the flat output until the unit's post-forward frees it (it is the pass's forward root then);
  in backward that post-forward does not reshard, so the unit stays gathered to its own
  post-backward, and its own pre-backward only prefetches (checked on 2 gloo ranks by logging
  FSDPParamGroup's hooks).

The unsharded step's figures are the region schedule's simulation (solvers/simulate.py): what it
holds, op by op, including every parameter gradient once computed. Only a unit's whole gradients
are replaced (by its shard) after its post-backward; the root's stay whole to the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import torch

from solvers import simulate
from solvers.schedule import COMPUTE

from .sharding import FSDP2, shard_bytes, repeated_blocks

ROOT = ""  # the root's group: the parameters in no unit
BACKWARD_KINDS = ("backward", "recompute")


@dataclass(frozen=True)
class ShardedGroup:
    """One FSDP2 parameter group's sizes on one rank (bytes; the module docstring)."""

    gathered: int
    shard: int
    whole: int
    grads: int


def sharded_groups(model: torch.nn.Module, spec: FSDP2) -> dict[str, ShardedGroup]:
    """Unit path (``ROOT`` for the root's group) -> its :class:`ShardedGroup`, each parameter in the
    innermost unit holding it (as ``fully_shard`` assigns them: inner units first)."""
    units = repeated_blocks(model) if spec.units is None else tuple(spec.units)
    modules = dict(model.named_modules())
    owner: dict[int, str] = {}
    for unit in sorted(units, key=lambda u: u.count(".")):  # outer first: inner units claim theirs after
        for p in modules[unit].parameters():
            owner[id(p)] = unit
    sizes: dict[str, list[int]] = {unit: [0, 0, 0, 0] for unit in (*units, ROOT)}
    for p in {id(p): p for p in model.parameters()}.values():
        shard = shard_bytes(p, spec.world_size)
        whole = p.numel() * p.element_size()
        size = sizes[owner.get(id(p), ROOT)]
        size[0] += spec.world_size * shard
        size[1] += shard
        size[2] += whole
        size[3] += whole if p.requires_grad else 0
    return {unit: ShardedGroup(*size) for unit, size in sizes.items()}


def _unit_of(module: str, units: tuple[str, ...]) -> str:
    """The innermost unit ``module`` (a traced op's module path) runs in; ``ROOT`` outside all."""
    inside = [u for u in units if module == u or module.startswith(u + ".")]
    return max(inside, key=len) if inside else ROOT


@dataclass
class _Ranks:
    """FSDP2's buffers held at one moment (bytes)."""

    unsharded: dict[str, int]
    flat: int = 0  # an all-gather's flat output kept (forward) or prefetched (backward)
    kept: int = 0  # a flat output kept by a unit's pre-forward while recomputed in another's backward
    prefetched: str | None = None  # the unit whose flat output ``flat`` is, in backward

    def prefetch(self, unit: str | None, groups: dict[str, ShardedGroup]) -> None:
        """The backward prefetch of ``unit`` (None: nothing left to prefetch) into ``flat``."""
        self.flat, self.prefetched = (groups[unit].gathered, unit) if unit is not None else (0, None)
    reduce_input: int = 0  # the last reduce-scatter's input
    grads_replaced: int = 0  # reduced shards kept less the whole gradients they replaced

    def extra(self) -> int:
        return sum(self.unsharded.values()) + self.flat + self.kept + self.reduce_input + self.grads_replaced


def fsdp2_peak_bytes(graph: nx.DiGraph, schedule, model: torch.nn.Module, spec: FSDP2, held_bytes: int) -> int:
    """One rank's peak (bytes) when the step ``schedule`` runs on ``graph`` (a region plan's) under
    per-block FSDP2 ``spec``; ``held_bytes``: what the unsharded step holds besides its schedule
    (parameters whole, buffers, inputs, saved generator states). See the module docstring."""
    return _walk(graph, schedule, model, spec, held_bytes).peak_bytes


def fsdp2_buffers_by_op(graph: nx.DiGraph, schedule, model: torch.nn.Module, spec: FSDP2) -> dict:
    """Computed node -> FSDP2's own buffers held while it runs (bytes: the gathered units, the kept or
    prefetched flat all-gather output, the last reduce-scatter input; not the gradients' shards,
    which a graph holds as gradient nodes), when ``schedule`` runs on ``graph`` (its last
    computation, for a node computed twice)."""
    return _walk(graph, schedule, model, spec, 0).buffers_by_op


@dataclass(frozen=True)
class _Walk:
    """One rank's step under FSDP2: its ``peak_bytes`` (:func:`fsdp2_peak_bytes`) and FSDP2's own
    buffers at each computation (:func:`fsdp2_buffers_by_op`)."""

    peak_bytes: int
    buffers_by_op: dict


def _walk(graph: nx.DiGraph, schedule, model: torch.nn.Module, spec: FSDP2, held_bytes: int) -> _Walk:
    """The schedule run step by step with FSDP2's hooks (the module docstring): the rank's peak, and
    FSDP2's buffers at each computation (bytes)."""
    groups = sharded_groups(model, spec)
    steps = list(schedule)
    memory = simulate(graph, steps, record_memory=True).memory
    nodes = graph.nodes
    hooks = _hook_points(steps, nodes, tuple(u for u in groups if u != ROOT))
    root = groups[ROOT]
    fixed = held_bytes - sum(g.whole for g in groups.values()) + sum(g.shard for g in groups.values())

    def level_after(index: int) -> int:
        if index < 0:
            return 0
        action, node = steps[index]
        return memory[index] - (int(nodes[node].get("workspace", 0)) if action == COMPUTE else 0)

    state = _Ranks({ROOT: root.gathered})
    peak = fixed + 2 * root.gathered  # the root's all-gather: its flat output beside its parameters
    state.flat = root.gathered
    buffers = {}
    for index, (action, node) in enumerate(steps):
        before = fixed + level_after(index - 1)
        peak = max(peak, _hooks_before(index, hooks, state, groups, before))
        if action == COMPUTE:
            peak = max(peak, fixed + memory[index] + state.extra())
            buffers[node] = state.extra() - state.grads_replaced
        after = fixed + level_after(index)
        if index in hooks.ends:  # a unit's post-forward reshards
            state.unsharded[hooks.ends[index]] = 0
        if index in hooks.nested_ends:  # the recomputed unit's post-forward frees the flat output it kept
            state.kept = 0
        if index in hooks.backward_ends:
            name = hooks.backward_ends[index]
            peak = max(peak, _post_backward(state, name, groups[name], after))
    last = fixed + level_after(len(steps) - 1)
    return _Walk(max(peak, _post_backward(state, ROOT, root, last)), buffers)


@dataclass(frozen=True)
class _HookPoints:
    """Where FSDP2's hooks run in a schedule, step index -> unit: pre-forward (``starts``),
    post-forward (``ends``), pre-backward, post-backward, and a unit recomputed inside another's
    backward (``nested_*``); ``backward_start``: the first backward step."""

    starts: dict[int, str]
    ends: dict[int, str]
    backward_starts: dict[int, str]
    backward_ends: dict[int, str]
    backward_order: list[str]
    backward_start: int | None
    nested_starts: dict[int, str]
    nested_ends: dict[int, str]


def _unit_steps(steps, nodes, units) -> tuple[dict[str, list[int]], dict[str, list[int]], int | None]:
    """Each unit's forward and backward (recompute included) step indices, and the first backward step."""
    forward: dict[str, list[int]] = {}
    backward: dict[str, list[int]] = {}
    backward_start = None
    for index, (action, node) in enumerate(steps):
        if action != COMPUTE:
            continue
        kind = nodes[node].get("kind")
        unit = _unit_of(str(nodes[node].get("module", "")), units)
        if kind in BACKWARD_KINDS and backward_start is None:
            backward_start = index
        if unit == ROOT:
            continue
        (backward if kind in BACKWARD_KINDS else forward).setdefault(unit, []).append(index)
    return forward, backward, backward_start


def _hook_points(steps, nodes, units) -> _HookPoints:
    fwd, bwd, backward_start = _unit_steps(steps, nodes, units)
    nested = _nested_recomputes(bwd, {i for i, (action, node) in enumerate(steps)
                                      if action == COMPUTE and nodes[node].get("kind") == "recompute"})
    bwd = {u: [i for i in indices if i not in nested.get(u, ())] for u, indices in bwd.items()}
    bwd = {u: indices for u, indices in bwd.items() if indices}
    forward_order = sorted(fwd, key=lambda u: fwd[u][0])
    backward_order = sorted(bwd, key=lambda u: bwd[u][0])
    return _HookPoints(
        starts={fwd[u][0]: u for u in forward_order},
        ends={fwd[u][-1]: u for u in forward_order},
        backward_starts={_pre_backward_index(bwd, nested, backward_order, u): u for u in backward_order},
        backward_ends={bwd[u][-1]: u for u in backward_order},
        backward_order=backward_order,
        backward_start=backward_start,
        nested_starts={indices[0]: u for u, indices in nested.items()},
        nested_ends={indices[-1]: u for u, indices in nested.items()},
    )


def _hooks_before(index: int, hooks: _HookPoints, state: _Ranks, groups, before: int) -> int:
    """The hooks that run before step ``index`` (``before``: the rank's bytes there, FSDP2's own
    buffers left out), applied to ``state``; the most bytes they hold at once."""
    peak = 0
    if index == hooks.backward_start:  # the root's post-forward freed the last flat output; its pre-backward prefetches
        state.prefetch(hooks.backward_order[0] if hooks.backward_order else None, groups)
    if index in hooks.starts:  # a unit's pre-forward: all-gather beside the kept flat output, then copy out
        unit = groups[hooks.starts[index]]
        peak = max(peak, before + state.extra() + unit.gathered)
        state.flat = unit.gathered
        state.unsharded[hooks.starts[index]] = unit.gathered
        peak = max(peak, before + state.extra())
    if index in hooks.backward_starts:
        peak = max(peak, _pre_backward(hooks.backward_starts[index], hooks, state, groups, before))
    if index in hooks.nested_starts:
        peak = max(peak, _nested_pre_forward(hooks.nested_starts[index], state, groups, before))
    return peak


def _pre_backward(name: str, hooks: _HookPoints, state: _Ranks, groups, before: int) -> int:
    """A unit's pre-backward: copy out beside the prefetched flat output, then prefetch the next."""
    peak = 0
    unit = groups[name]
    if name not in set(hooks.nested_starts.values()):  # else gathered by its recomputation already: nothing to do
        if state.prefetched != name:  # not prefetched: all-gathered now
            state.flat = unit.gathered
        state.unsharded[name] = unit.gathered
        peak = before + state.extra()
    position = hooks.backward_order.index(name)
    state.prefetch(hooks.backward_order[position + 1] if position + 1 < len(hooks.backward_order) else None, groups)
    return peak


def _nested_pre_forward(name: str, state: _Ranks, groups, before: int) -> int:
    """A unit recomputed in another unit's backward: its pre-forward gathers it."""
    peak = 0
    unit = groups[name]
    if state.prefetched != name:  # all-gathered now, beside the flat output kept before
        peak = before + state.extra() + unit.gathered
        kept = unit.gathered
    else:
        kept, state.flat, state.prefetched = state.flat, 0, None
    # In forward state: the flat output kept before is freed at the copy-out, this one kept
    # (FSDP2's all_gather_state) until its post-forward, which frees it (the unit is the
    # pass's forward root then) but does not reshard (in backward): it stays gathered
    # through its own backward, whose pre-backward only prefetches.
    state.kept = kept
    state.unsharded[name] = unit.gathered
    return max(peak, before + state.extra())


def _nested_recomputes(backward: dict[str, list[int]], recomputed: set[int]) -> dict[str, list[int]]:
    """Unit -> the indices of its ops recomputed inside another unit's backward (a region spanning
    several units: its checkpoint recomputes them all when the last unit's backward first unpacks).
    ``backward``: each unit's backward and recompute indices. A unit's own pre-backward has fired
    only once the unit after it (in forward order) has begun its own backward; before that, its
    recomputation runs its forward hooks: FSDP2 gathers it, and reshards after."""
    own = {u: [i for i in indices if i not in recomputed] for u, indices in backward.items()}
    order = sorted((u for u in own if own[u]), key=lambda u: own[u][0])
    nested = {}
    for before, unit in zip(order, order[1:]):
        inside = [i for i in backward[unit] if i in recomputed and i < own[before][0]]
        if inside:
            nested[unit] = inside
    return nested


def _pre_backward_index(backward: dict[str, list[int]], nested: dict[str, list[int]], order: list[str],
                        unit: str) -> int:
    """Where ``unit``'s pre-backward runs: at its first backward (or recompute) op, or earlier, at the
    recomputation of units before it that its backward triggers (a region spanning them: the hook on
    its output fires before the checkpoint unpacks and recomputes)."""
    position = order.index(unit)
    previous_end = backward[order[position - 1]][-1] if position else -1
    first = backward[unit][0]
    return min([first, *(i[0] for i in nested.values() if previous_end < i[0] < first)])


def _post_backward(state: _Ranks, name: str, group: ShardedGroup, level: int) -> int:
    """A group's post-backward on ``state`` (changed), at ``level`` bytes held by the step: reshard,
    free the previous reduce-scatter input, allocate this one beside the whole gradients, free them,
    keep the reduced shard. Returns the most held meanwhile."""
    state.unsharded[name] = 0
    state.reduce_input = group.gathered
    most = level + state.extra()
    state.grads_replaced += group.shard - group.grads
    return max(most, level + state.extra())


__all__ = ["ShardedGroup", "fsdp2_buffers_by_op", "fsdp2_peak_bytes", "sharded_groups"]
