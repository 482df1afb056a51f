"""The chain view of a cost graph: the stages that chain methods (chen, revolve, dp) plan over.

A training graph is a forward pass, a loss, and a backward pass that reads the forward's results.
The chain view cuts the forward pass where (almost) nothing but one result crosses, like Chen et al.'s
articulation points, and gives every backward node the stage whose forward results it reads. A
chain method then decides, per stage, when to run its forward (CF/Fn/Fe) and backward (B); this
module lowers that sequence back to a schedule of the full graph (:meth:`ChainView.lower`) and
measures the stages in the units of the heterogeneous chain model (:meth:`ChainView.chain`).

How the view is built (docs/costgraph.md, "Graph attributes"):

1. Forward part F = the loss node and its ancestors; backward part B = every other node. The loss is
   the graph's ``loss_node``, or else the node after which a store-all schedule holds the most.
2. *Reserved* nodes are computed once and held while anyone needs them: pinned forward nodes (the
   model's outputs, held by the caller anyway) and "persistent" small nodes that are read across
   many stages (attention masks, position ids), up to a share of the store-all peak in total (2%
   by default; :func:`chain_views` builds one view per share of :data:`PERSISTENT_SHARES`). Their
   bytes are set aside from the chain's budget; leaving them out is what lets a real transformer's
   blocks form a chain at all.
3. Stage boundaries are the forward positions after which only the node just computed crosses to a
   later forward node (reserved nodes aside), plus one right before the loss, which is stage L.
4. A backward node belongs to the latest stage among the forward nodes it reads, raised to that of
   any backward node that reads it (a node must run before its readers, and the backward runs
   from stage L down to 0), and, in the default view, raised to one below the lowest backward
   stage it reads from when its forward inputs allow (:func:`_follow_the_gradient`);
   :func:`chain_views` gives both placements.

The chain is conservative: every size it reports bounds what the lowered schedule really holds,
so a sequence that fits the chain model fits the graph; chain methods still check the lowered
schedule with :func:`solvers.simulate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Hashable, Iterable, Sequence

import networkx as nx

from .chainmodel import Chain, Op
from .graph import is_output, is_pinned, topological_order
from .liveness import schedule_from_computes
from .schedule import Schedule
from .simulate import simulate
from .store_all import store_all_schedule

Node = Hashable

# Persistent (reserved) small nodes may take at most this share of the store-all peak.
PERSISTENT_SHARE = 0.02
# The shares :func:`chain_views` tries. Holding a small result throughout buys finer stages but costs
# its bytes at every moment of the step, the peak included: GPT-2's residual streams (1 MiB each)
# split its blocks into attention and MLP halves at 2%, and at 0.5% only the 1.25 MiB position/mask
# tensor read by every block is held, which is what reaches per-layer checkpointing's peak.
PERSISTENT_SHARES = (0.02, 0.01, 0.005, 0.0025, 0.0)


@dataclass(frozen=True, eq=False)
class ChainView:
    """Stages of a cost graph. ``forward[i]``/``backward[i]`` list stage i's nodes in topological
    order; stage ``L = len(forward) - 1`` is the loss stage, whose forward is the loss node alone."""

    graph: nx.DiGraph
    loss: Node
    forward: tuple[tuple[Node, ...], ...]
    backward: tuple[tuple[Node, ...], ...]
    reserved: frozenset
    stage_of: dict

    @property
    def length(self) -> int:
        """L: the number of stages before the loss."""
        return len(self.forward) - 1

    @property
    def reserved_bytes(self) -> int:
        return sum(self.graph.nodes[v]["mem"] for v in self.reserved)

    # -- lowering ------------------------------------------------------------------------
    def computes(self, sequence: Iterable[Op], before: Sequence[Sequence[Node]] | None = None) -> list[Node]:
        """The graph computations of a chain sequence, reserved nodes computed only once;
        ``before[i]``: nodes computed right before the ``i``-th op's (a backward's recomputation of
        what its stage did not keep: solvers/hierarchical)."""
        done: set[Node] = set()
        order: list[Node] = []
        for position, op in enumerate(sequence):
            if op.kind in ("CF", "Fn", "Fe"):
                nodes = self.forward[op.stage]
            elif op.kind == "L":
                nodes = self.forward[self.length] + self.backward[self.length]
            else:
                nodes = self.backward[op.stage]
            if before is not None:
                nodes = [*before[position], *nodes]
            for node in nodes:
                if node in self.reserved and node in done:
                    continue
                done.add(node)
                order.append(node)
        return order

    def lower(self, sequence: Iterable[Op]) -> Schedule:
        """The schedule of the full graph that runs ``sequence``, each result freed after its last use.

        Whether a stage's intermediates survive (Fe) or not (CF/Fn) follows from what the rest of
        the sequence reads, so the three forward kinds lower to the same computations.
        """
        return schedule_from_computes(self.graph, self.computes(sequence))

    # -- the chain model -----------------------------------------------------------------
    def chain(self) -> Chain:
        """The stages as a heterogeneous chain (bytes, seconds), conservative for :meth:`lower`."""
        return _chain_sizes(self)


def _inferred_loss(graph, order: Sequence[Node]) -> Node:
    """The node after which a store-all schedule holds the most memory (latest on ties)."""
    schedule = store_all_schedule(graph)
    outcome = simulate(graph, schedule, record_memory=True)
    # Memory held after each compute and the frees that follow it.
    memory_after_compute: dict[Node, int] = {}
    current = None
    for (kind, node), memory in zip(schedule, outcome.memory):
        if kind == "compute":
            current = node
            memory_after_compute[node] = memory - graph.nodes[node].get("workspace", 0)
        else:
            memory_after_compute[current] = memory
    best_node, best_held = order[0], -1
    for node in order:
        if memory_after_compute[node] >= best_held:
            best_node, best_held = node, memory_after_compute[node]
    return best_node


def _persistent_nodes(graph, forward: Sequence[Node], position: dict, budget_bytes: float) -> set[Node]:
    """Small forward nodes whose results cross many stage boundaries (masks, position ids), chosen
    greedily by the number of boundaries each one unblocks, within ``budget_bytes`` in total.

    A position is a boundary when nothing but the node just computed crosses it; a node that is the
    only other crossing result at k positions unblocks k boundaries when it is held throughout.
    """
    last_reader = {}
    for node in forward:
        readers = [position[s] for s in graph.successors(node) if s in position]
        if readers and not is_pinned(graph, node):
            last_reader[node] = max(readers)
    crossing: list[list[Node]] = []  # crossing[p]: results made before p and read after p
    for p in range(len(forward)):
        crossing.append([u for u, last in last_reader.items() if position[u] < p < last])
    chosen: set[Node] = set()
    total = 0
    while True:
        gain: dict[Node, int] = {}
        for nodes in crossing:
            remaining = [u for u in nodes if u not in chosen]
            if len(remaining) == 1:
                gain[remaining[0]] = gain.get(remaining[0], 0) + 1
        affordable = [u for u in gain if total + graph.nodes[u]["mem"] <= budget_bytes]
        if not affordable:
            return chosen
        best = max(affordable, key=lambda u: (gain[u], -graph.nodes[u]["mem"], -position[u]))
        chosen.add(best)
        total += graph.nodes[best]["mem"]


def chain_view(graph, persistent_share: float = PERSISTENT_SHARE) -> ChainView:
    """Build the :class:`ChainView` of a cost graph (see the module docstring for the rules), its
    persistent nodes within ``persistent_share`` of the store-all peak (bytes)."""
    return chain_views(graph, (persistent_share,))[0]


def chain_views(graph, persistent_shares: Sequence[float] = PERSISTENT_SHARES) -> list[ChainView]:
    """The distinct chain views for each share of the store-all peak given to persistent nodes.

    Chain methods plan on each and keep the best lowered schedule: which share is best depends on
    the budget (finer stages against bytes held throughout), and the views cost milliseconds.
    """
    order = topological_order(graph)
    loss = graph.graph.get("loss_node")
    if loss is None:
        loss = _inferred_loss(graph, order)
    forward_set = nx.ancestors(graph, loss) | {loss}
    forward = [v for v in order if v in forward_set]
    backward = [v for v in order if v not in forward_set]
    position = {v: p for p, v in enumerate(forward)}
    pinned = {v for v in forward if is_pinned(graph, v)}
    store_all_peak = simulate(graph, store_all_schedule(graph)).peak_bytes
    views: dict[tuple, ChainView] = {}
    for share in persistent_shares:
        persistent = _persistent_nodes(graph, forward[:-1], position, share * store_all_peak)
        reserved = frozenset(persistent | pinned)
        # Each placement of the backward nodes (step 4) wins on some graphs: following the gradient
        # lowered GPT-2's least peak by 17 MiB and a Linear/Tanh chain's segment plans lost 10%.
        for follow in (True, False):
            view = _view(graph, loss, forward, backward, position, reserved, follow)
            views.setdefault((reserved, tuple(sorted(view.stage_of.items(), key=str))), view)
    return list(views.values())


def coarsened(view: ChainView, stages_per_group: int) -> ChainView:
    """``view`` with every ``stages_per_group`` consecutive stages merged into one (the loss stage
    kept apart): fewer, larger stages, for chain methods whose cost grows with the stage count.

    Still a chain view: a merged boundary is one of the original boundaries, and a merged stage's
    backward runs its stages' backwards from the highest down, the order gradients flow in.
    """
    if stages_per_group < 1:
        raise ValueError(f"stages_per_group must be >= 1, got {stages_per_group}")
    length = view.length
    groups = [range(start, min(start + stages_per_group, length)) for start in range(0, length, stages_per_group)]
    merged_stage = {stage: j for j, group in enumerate(groups) for stage in group}
    merged_stage[length] = len(groups)
    forward = tuple(tuple(v for stage in group for v in view.forward[stage]) for group in groups)
    backward = tuple(tuple(v for stage in reversed(group) for v in view.backward[stage]) for group in groups)
    return ChainView(
        graph=view.graph,
        loss=view.loss,
        forward=forward + (view.forward[length],),
        backward=backward + (view.backward[length],),
        reserved=view.reserved,
        stage_of={v: merged_stage[stage] for v, stage in view.stage_of.items()},
    )


def _view(graph, loss: Node, forward: list, backward: list, position: dict, reserved: frozenset,
          follow_the_gradient: bool = True) -> ChainView:

    # 3. Boundaries: after position p when no non-reserved node before p is read after p, except
    # the node at p itself. `reach` is the furthest forward reader of anything made so far.
    boundaries = []
    reach = -1
    for p, node in enumerate(forward[:-1]):
        readers = [position[s] for s in graph.successors(node) if s in position]
        crossing_before = reach > p  # something made before p is read after p
        if not crossing_before and p < len(forward) - 2:
            boundaries.append(p)
        if node not in reserved and readers:
            reach = max(reach, max(readers))
    boundaries.append(len(forward) - 2)  # the loss is a stage of its own
    boundaries = sorted(set(b for b in boundaries if b >= 0))

    stages: list[tuple[Node, ...]] = []
    start = 0
    for b in boundaries:
        stages.append(tuple(forward[start : b + 1]))
        start = b + 1
    stages.append(tuple(forward[start:]))  # the loss
    if len(forward) == 1:
        stages = [(loss,)]
    stage_of = {v: i for i, nodes in enumerate(stages) for v in nodes}

    # 4. Backward stages, in reverse topological order so readers are placed first.
    backward_stage: dict[Node, int] = {}
    loss_stage = len(stages) - 1
    for node in reversed(backward):
        # The loss does not place a node: one that reads the loss and stage i's results runs in B_i
        # (the first backward ops read both); only a node reading nothing else is the loss stage's.
        read = [stage_of[u] for u in graph.predecessors(node) if u in stage_of and u not in reserved]
        stage = max((s for s in read if s != loss_stage), default=loss_stage if read else -1)
        for reader in graph.successors(node):
            stage = max(stage, backward_stage.get(reader, -1))
        backward_stage[node] = max(stage, 0)
    if follow_the_gradient:
        _follow_the_gradient(graph, backward, backward_stage, stage_of, reserved)
    backward_stages = [[] for _ in stages]
    for node in backward:
        backward_stages[backward_stage[node]].append(node)
    stage_of.update(backward_stage)
    return ChainView(
        graph=graph,
        loss=loss,
        forward=tuple(stages),
        backward=tuple(tuple(nodes) for nodes in backward_stages),
        reserved=reserved,
        stage_of=stage_of,
    )


def _follow_the_gradient(graph, backward: Sequence[Node], backward_stage: dict, stage_of: dict,
                         reserved: frozenset) -> None:
    """Raise a backward node to one stage below the lowest backward stage it reads from.

    The rule "the latest stage among the forward results it reads" places the backward of an op
    that reads only its *input* (a linear layer's input gradient reads the weight and x_i, not its
    output) in stage i-1, the input's producer. When stage i's backward is otherwise empty (an
    output projection whose forward stage holds one op), the gradient from B_{i+1} then skips
    B_i and the chain model can only hold it as a result kept to the end (``gout``): GPT-2's
    32 MiB logits gradient was counted through the whole backward pass. In stage min-1 the node
    reads that gradient as y_i and its forward inputs as x_i, which the model holds during B_i.

    Raising a node keeps every constraint of the placement: it stays at or below each backward
    node it reads (min - 1 < min), and its readers, placed at or below it already, stay so.
    Nodes are visited in topological order so that a raised node lets its readers follow.
    """
    for node in backward:
        sources = [backward_stage[u] for u in graph.predecessors(node) if u in backward_stage]
        if not sources:
            continue
        target = min(sources) - 1
        forward_read = [stage_of[u] for u in graph.predecessors(node) if u in stage_of and u not in reserved]
        # Only where the forward results it reads are x_target or made by stage target itself: a
        # node reading older results would stretch their lifetime over more stages instead.
        if target > backward_stage[node] and all(stage >= target - 1 for stage in forward_read):
            backward_stage[node] = target


def _local_peak(graph, nodes: Sequence[Node], escaping: set[Node], reserved: frozenset) -> tuple[int, int]:
    """Run ``nodes`` alone (their outside inputs held and not counted), freeing each result after its
    last use among ``nodes`` unless it escapes. Returns (peak during any compute, bytes at the end)."""
    members = set(nodes)
    last_use = {}
    for p, node in enumerate(nodes):
        for u in graph.predecessors(node):
            if u in members:
                last_use[u] = p
    held = 0
    peak = 0
    frees_at: dict[int, list[Node]] = {}
    for p, node in enumerate(nodes):
        if node not in escaping:
            frees_at.setdefault(last_use.get(node, p), []).append(node)
    for p, node in enumerate(nodes):
        mem = 0 if node in reserved else graph.nodes[node]["mem"]
        peak = max(peak, held + mem + graph.nodes[node].get("workspace", 0))
        held += mem
        for freed in frees_at.get(p, ()):
            held -= 0 if freed in reserved else graph.nodes[freed]["mem"]
    return peak, held


def _bytes(graph, nodes: Iterable[Node]) -> int:
    return sum(graph.nodes[v]["mem"] for v in nodes)


def _chain_sizes(view: ChainView) -> Chain:
    graph, reserved, stage_of = view.graph, view.reserved, view.stage_of
    length = view.length
    backward_nodes = {v for nodes in view.backward for v in nodes}

    def crossing_forward(i: int) -> set[Node]:
        """x_i: forward results of stages < i that a node of stage >= i reads (forward or backward)."""
        crossing = set()
        for j in range(i):
            for u in view.forward[j]:
                if u in reserved:
                    continue
                if any(stage_of.get(s, -1) >= i for s in graph.successors(u)):
                    crossing.add(u)
        return crossing

    def crossing_backward(i: int) -> set[Node]:
        """y_i: results of B_i that B_{i-1} reads (the gradient flowing down the chain)."""
        return {b for b in view.backward[i] if any(s in backward_nodes and stage_of[s] == i - 1 for s in graph.successors(b))}

    def long_lived(i: int) -> set[Node]:
        """Results of B_i read further down than B_{i-1} (a tied weight's partial gradient): the
        chain model has no place for them but ``gout``, held to the end, which bounds them."""
        return {
            b for b in view.backward[i]
            if any(s in backward_nodes and stage_of[s] < i - 1 for s in graph.successors(b)) and not is_output(graph, b)
        }

    xs = [crossing_forward(i) for i in range(length + 1)]
    ys = [crossing_backward(i) for i in range(length + 1)]
    x = [max(_bytes(graph, xs[i]), _bytes(graph, ys[i])) for i in range(length + 1)]
    xbar = [0] * (length + 1)
    ftmp = [0] * length
    fw = [sum(graph.nodes[v]["cost"] for v in view.forward[i]) for i in range(length)]
    for i in range(length):
        saved = {u for u in view.forward[i] if u not in reserved
                 and any(stage_of.get(s, -1) == i and s in backward_nodes for s in graph.successors(u))}
        xbar_set = xs[i + 1] | saved
        xbar[i + 1] = max(x[i + 1], _bytes(graph, xbar_set))
        peak_grad, _ = _local_peak(graph, view.forward[i], xbar_set, reserved)
        peak_nograd, _ = _local_peak(graph, view.forward[i], xs[i + 1], reserved)
        ftmp[i] = max(0, peak_grad - xbar[i + 1], peak_nograd - x[i + 1])
    bw = [sum(graph.nodes[v]["cost"] for v in view.backward[i]) for i in range(length + 1)]
    bw[length] += sum(graph.nodes[v]["cost"] for v in view.forward[length])
    btmp = [0] * (length + 1)
    gout = [0] * (length + 1)
    for i in range(length + 1):
        nodes = view.backward[i] if i < length else view.forward[length] + view.backward[length]
        # Outputs that op runs stay held to the end; for op L that includes the loss node itself
        # when it is an output (reserved ones excepted: their bytes are set aside already).
        outputs = {b for b in nodes if is_output(graph, b) and b not in reserved} | long_lived(i)
        gout[i] = _bytes(graph, outputs)
        peak, _ = _local_peak(graph, nodes, ys[i] | outputs, reserved)
        btmp[i] = max(0, peak - x[i] - gout[i])
    return Chain(fw=fw, bw=bw, x=x, xbar=xbar, ftmp=ftmp, btmp=btmp, gout=gout)
