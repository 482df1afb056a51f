"""Checkpoint regions: the plans PyTorch's own activation checkpointing can run, and their peaks.

The native executor (runtime/native.py) realises a plan by wrapping chosen submodules of the
user's model in non-reentrant ``torch.utils.checkpoint``. This module is the planner's model of
what that does, on the op-level cost graph of the training step (every node one op's result, each
tagged with the ``module`` that issued it and its ``kind``: forward, loss, backward):

- **Forward.** Inside a checkpointed region autograd saves nothing: what the region's ops would
  save is dropped (a placeholder is kept instead) and only the region's inputs are held, by the
  checkpoint, until the region's backward is over. A result of the region that something *outside*
  it reads (the next module, or the backward of an op outside the region that saved it) is held as
  without checkpointing.
- **Backward.** When the backward first unpacks a tensor the region saved, the region's forward is
  run again, from its held inputs, with the random state of the first run, up to the op whose
  result is the last one the backward needs (PyTorch's early stop). The recomputed results are new
  tensors: the first run's result of an op may still be held (read by someone outside the region)
  while its recomputed twin exists. Each recomputed result is released after the last backward op
  that reads it.

:func:`region_graph` turns a set of regions into a graph with one *twin* node per recomputed op
(``"recompute:v"``) and :func:`region_schedule` into the one schedule that executes it: trace
order, the twins of a region inserted right before the first backward op that reads one of them,
every result freed after its last reader. ``solvers.simulate`` of that schedule on that graph is the
predicted peak and time. With no region it is the store-all schedule.

:func:`plan_regions` searches the regions: the fewest recomputations whose peak fits a budget.

Everything here is pure Python over networkx, like the rest of ``solvers``.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from collections.abc import Hashable, Iterable, Sequence

import networkx as nx

from .autograd_nodes import autograd_node_holds, first_of_node
from .extractions import count_extractions_once
from .errors import Infeasible
from .liveness import schedule_from_computes
from .schedule import Schedule, SolverInfo
from .simulate import Simulation, simulate

METHOD = "regions"
RECOMPUTE = "recompute"
# A buffer's new value (a batch norm's running statistics). The native executor runs a batch norm's
# recomputation on copies of its statistics (runtime/native.py), so a region may contain one, but
# the new values are computed once, by the first run: they get no twin.
MUTATION = "mutation"


def twin(node: Hashable) -> str:
    """The node id of ``node``'s recomputation in a region graph (a string, so that plan files keep it)."""
    return f"{RECOMPUTE}:{node}"


_SEGMENT = re.compile(r"^(?P<path>.*)\[(?P<start>\d+):(?P<stop>\d+)\]$")


@dataclass(frozen=True)
class SavePolicy:
    """A selective-checkpoint policy (``torch.utils.checkpoint.create_selective_checkpoint_contexts``):
    inside a region, the outputs of the aten ops named by ``ops`` (op-name prefixes, ``"aten.mm."``,
    so that this module needs no torch) are saved in the forward (MUST_SAVE); every other op of the
    region is recomputed. runtime/native.py saves the same ops, matched by the same prefixes.

    ``draws``: the random draws are saved too (:func:`draw_chains`): the recomputation does not draw
    again. Eager dropout on CPU is ``torch.empty_like(x).bernoulli_(1 - p).div_(1 - p)`` then a
    multiply, in place on one buffer: the run saves the allocation, the draw and the scaling (one
    buffer), and recomputes only the multiply."""

    ops: tuple[str, ...]
    draws: bool = False

    def saves(self, op: str) -> bool:
        """Whether the output of aten op ``op`` (``"aten.mm.default"``) is saved by name; a node of
        several ops (``op == ""``) is recomputed."""
        return bool(op) and op.startswith(self.ops)


_PROJECTIONS = ("aten.mm.", "aten.addmm.", "aten.convolution.", "aten._scaled_dot_product_")
_MATMULS = _PROJECTIONS + ("aten.bmm.", "aten.baddbmm.")
# New uninitialised tensors: under a policy with ``draws`` they are saved (the run cannot tell, when
# one is made, whether a draw will fill it; runtime/native.py).
ALLOCATIONS = ("aten.empty_like.", "aten.empty.", "aten.empty_strided.", "aten.new_empty.", "aten.new_empty_strided.")
# What scales a draw in place (dropout's ``noise.div_(1 - p)``), functionalized to ``div``/``mul`` of it.
_SCALINGS = ("aten.div.", "aten.mul.")

# The policies a region may take, by the names plan files keep (``"transformer.h.3@matmuls"``); the
# search takes the one with the cheapest predicted step that fits (the first listed on a tie). Which
# ones, and why not others, measured on GPT-2, BERT and Llama: docs/native.md, "Save policies".
SAVE_POLICIES: dict[str, SavePolicy] = {
    # The costly ops, whose outputs are cheap to hold next to the pointwise ops around them.
    "matmuls": SavePolicy(_MATMULS),
    # The same less bmm/baddbmm: in attention without a fused kernel (eager, or SDPA's math path
    # when attention dropout is on, on CPU) these are the score and context products, whose score
    # matrix is s^2 per head; recomputing them with the softmax and dropout around them holds no s^2
    # tensor, as Megatron's selective recompute of the attention core (Korthikanti et al. 2022,
    # "Reducing Activation Recomputation in Large Transformer Models"), and recomputes the pointwise
    # ops besides. The projections are mm/addmm in Hugging Face models (GPT-2's Conv1D, BERT's and
    # Llama's Linear), never bmm. With a fused attention kernel this saves what "matmuls" saves.
    "projections": SavePolicy(_PROJECTIONS),
    # Each of them with the random draws saved: on CPU a dropout's draw (bernoulli) is the costliest
    # op of a transformer block (GPT-2's attention dropout: 37.7 of the block's 84 ms forward), and
    # its mask is as large as the dropped tensor, so holding it trades bytes for time at about the
    # matmuls' rate (docs/native.md, "Save policies").
    "matmuls+draws": SavePolicy(_MATMULS, draws=True),
    "projections+draws": SavePolicy(_PROJECTIONS, draws=True),
}


def draw_chains(graph: nx.DiGraph, nodes: Sequence[Hashable]) -> tuple[set, set]:
    """The results of ``nodes`` (one region's forward ops) that a policy with ``draws`` saves besides
    its ops, and those of them that are one buffer with a later one (``aliased``: held through it).

    Saved: every allocation (:data:`ALLOCATIONS`) and every random op (node attribute ``random``).
    A draw that fills an allocation in place (read by one op only, a ``div``/``mul``: the
    functional form of dropout's ``div_``) is one buffer with that scaling, which is saved too; the
    allocation and the draw are then ``aliased``: the buffer is counted once, at the scaling."""
    members = set(nodes)
    saved: set = set()
    aliased: set = set()
    for v in nodes:
        data = graph.nodes[v]
        op = str(data.get("op", ""))
        if op.startswith(ALLOCATIONS):
            saved.add(v)
        if not data.get("random"):
            continue
        saved.add(v)
        filled = [p for p in graph.predecessors(v) if p in members and str(graph.nodes[p].get("op", "")).startswith(ALLOCATIONS)]
        aliased.update(filled)
        readers = list(graph.successors(v))
        if len(readers) == 1 and readers[0] in members and str(graph.nodes[readers[0]].get("op", "")).startswith(_SCALINGS):
            saved.add(readers[0])
            aliased.add(v)
    return saved, aliased


def split_policy(region: str) -> tuple[str, str | None]:
    """``"transformer.h.3@matmuls"`` -> ``("transformer.h.3", "matmuls")``; no ``@``: no policy."""
    base, _, policy = region.partition("@")
    if policy and policy not in SAVE_POLICIES:
        raise ValueError(f"unknown save policy {policy!r} in region {region!r}; known: {', '.join(SAVE_POLICIES)}")
    return base, policy or None


def saved_by_policy(op: str, policy: str | None) -> bool:
    """Whether ``policy`` saves the output of aten op ``op`` (its name, e.g. ``"aten.mm.default"``)."""
    return policy is not None and SAVE_POLICIES[policy].saves(op)


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


@dataclass(frozen=True)
class RegionCosts:
    """One region's parts, in trace order: its forward ``nodes``; those its policy ``saved``; those
    its recomputation runs again (``recomputed``: up to the last one a backward op of the region
    reads, PyTorch's early stop, less the saved); its ``backward`` ops; its ``inputs`` (results from
    outside that it reads, held by the checkpoint); ``seconds`` the region adds to the step: its
    recomputation and ``overhead_seconds``, what the checkpoint itself costs
    (:func:`checkpoint_overhead`); ``aliased``: saved results that are one buffer with a later saved
    one (:func:`draw_chains`), held through it."""

    region: str
    nodes: tuple[Hashable, ...]
    saved: tuple[Hashable, ...]
    recomputed: tuple[Hashable, ...]
    backward: tuple[Hashable, ...]
    inputs: tuple[Hashable, ...]
    seconds: float
    # The backward op at which the recomputation runs: the first that unpacks anything the region
    # packed (its forward results, recomputed or, under a policy, cached).
    trigger: Hashable | None = None
    aliased: tuple[Hashable, ...] = ()
    overhead_seconds: float = 0.0

    def held_to_the_end(self, graph: nx.DiGraph) -> list[Hashable]:
        """What the checkpoint holds until the region's last backward op: its inputs, and saved
        results no one reads again (the policy's cache keeps them while the recomputation stops
        before it reaches them), but for the ``aliased`` (their buffer is held as the later result)."""
        read_again = {p for v in self.recomputed for p in graph.predecessors(v)} | \
            {p for b in self.backward for p in graph.predecessors(b)}
        aliased = set(self.aliased)
        return [*self.inputs, *(v for v in self.saved if v not in read_again and v not in aliased)]


@dataclass(frozen=True)
class RegionPlan:
    """The chosen regions with the schedule that predicts them (see the module docstring)."""

    regions: tuple[str, ...]
    graph: nx.DiGraph = field(repr=False)
    schedule: Schedule = field(repr=False)
    outcome: Simulation = field(repr=False)


def as_eager_runs(graph: nx.DiGraph) -> nx.DiGraph:
    """The op graph's memory as eager autograd holds it (solvers/autograd_nodes.py,
    solvers/extractions.py): what the native executor runs."""
    return count_extractions_once(autograd_node_holds(graph))


def _trace_order(graph: nx.DiGraph) -> list[Hashable]:
    """The graph's nodes in trace order: the profiler adds them in the order the step ran them."""
    return list(graph.nodes)


@dataclass(frozen=True)
class ModuleNodes:
    """A graph's forward and backward nodes grouped by the module that ran them, each group in trace
    order: a region's nodes are gathered from the modules within it, not found by a scan of the
    whole graph per region (the search tries ~450 regions, policy variants included, of a 12-layer
    GPT-2's ~2,100 ops: the scans took 2 of its 5 s)."""

    position: dict[Hashable, int]
    forward: dict[str, list[Hashable]]
    backward: dict[str, list[Hashable]]

    @classmethod
    def of(cls, graph: nx.DiGraph) -> ModuleNodes:
        position, forward, backward = {}, {}, {}
        for i, (v, data) in enumerate(graph.nodes(data=True)):
            position[v] = i
            kind = data.get("kind")
            if kind in ("forward", "backward"):
                (forward if kind == "forward" else backward).setdefault(data.get("module", ""), []).append(v)
        return cls(position, forward, backward)

    def within(self, region: str, kind: str) -> list[Hashable]:
        """The ``kind`` ("forward" or "backward") nodes of the modules within ``region``, in trace order."""
        groups = self.forward if kind == "forward" else self.backward
        found = [v for module, nodes in groups.items() if within(module, region) for v in nodes]
        return sorted(found, key=self.position.__getitem__)


def _forward_nodes_of(graph: nx.DiGraph, region: str) -> list[Hashable]:
    return ModuleNodes.of(graph).within(region, "forward")


def region_costs(graph: nx.DiGraph, region: str, by_module: ModuleNodes | None = None) -> RegionCosts:
    """The parts of ``region`` (see :class:`RegionCosts`). ``by_module``: the graph's
    :class:`ModuleNodes`, when a caller asks for many regions of one graph."""
    base, policy = split_policy(region)
    by_module = by_module or ModuleNodes.of(graph)
    nodes = by_module.within(base, "forward")
    members = set(nodes)
    chained, aliased = draw_chains(graph, nodes) if policy and SAVE_POLICIES[policy].draws else (set(), set())
    saved = [v for v in nodes if v in chained or saved_by_policy(str(graph.nodes[v].get("op", "")), policy)]
    saved_set = set(saved)
    backward = by_module.within(base, "backward")
    read = {p for b in backward for p in graph.predecessors(b)}
    needed = [i for i, v in enumerate(nodes) if v in read and v not in saved_set]
    recomputed = tuple(v for v in nodes[: needed[-1] + 1]
                       if v not in saved_set and graph.nodes[v].get("value_class") != MUTATION) if needed else ()
    inputs = tuple(dict.fromkeys(p for v in nodes for p in graph.predecessors(v) if p not in members))
    trigger = next((b for b in backward if any(p in members for p in graph.predecessors(b))), None)
    if trigger is not None:  # the engine unpacks (and the checkpoint recomputes) as the node starts
        trigger = first_of_node(graph, trigger)
    passed = needed[-1] + 1 if needed else 0  # ops the recomputation passes, cached ones included
    overhead = checkpoint_overhead(graph, policy, len(nodes), passed, len(recomputed))
    seconds = sum(float(graph.nodes[v]["cost"]) for v in recomputed) + overhead
    return RegionCosts(region, tuple(nodes), tuple(saved), recomputed, tuple(backward), inputs, seconds, trigger,
                       tuple(v for v in nodes if v in aliased), overhead)


def checkpoint_overhead(graph: nx.DiGraph, policy: str | None, forward_ops: int, passed_ops: int,
                        recomputed_ops: int) -> float:
    """Seconds ``torch.utils.checkpoint`` itself adds for one region, beyond its ops run again: per
    call, per op recomputed, and under ``policy`` per op of the forward and of the recomputation's
    pass (``passed_ops``, cached ones included), at the rates measured on the model's device
    (profiler/checkpoint_cost.py) that the planner puts in ``graph.graph["checkpoint_costs"]``.
    0 for a graph without them: then only the ops are priced."""
    rates = graph.graph.get("checkpoint_costs")
    if not rates:
        return 0.0
    seconds = float(rates["region_seconds"]) + float(rates["recomputed_op_seconds"]) * recomputed_ops
    if policy is not None:
        seconds += float(rates["policy_region_seconds"].get(policy, 0.0))
        seconds += float(rates["policy_op_seconds"].get(policy, 0.0)) * (forward_ops + passed_ops)
    return seconds


def checkpointable(graph: nx.DiGraph, region: str) -> str | None:
    """Why ``region`` cannot be a checkpoint region of this graph, or None when it can.

    A region must be called once (its forward ops one contiguous run in trace order: a module called
    twice would be checkpointed at both calls, which the graph does not say how to split), and must
    not compute a model output (the caller holds it: recomputing it saves nothing)."""
    try:
        base, _ = split_policy(region)
    except ValueError as error:
        return str(error)
    if not base:
        return "the model itself is not a region: checkpointing it would recompute the whole forward"
    nodes = _forward_nodes_of(graph, base)
    if not nodes:
        return f"module {region!r} runs no forward op in the trace"
    forward = [v for v in _trace_order(graph) if graph.nodes[v].get("kind") == "forward"]
    first, last = forward.index(nodes[0]), forward.index(nodes[-1])
    if last - first + 1 != len(nodes):
        return f"module {region!r} is called more than once in the step, or interleaved with other modules"
    for v in nodes:
        data = graph.nodes[v]
        if data.get("value_class") == MUTATION:
            continue  # recomputed on copies of the buffers (runtime/native.py): updated once
        if data.get("pinned") or data.get("output"):
            return f"module {region!r} computes a model output, which the caller holds anyway"
    return None


def _check_disjoint(graph: nx.DiGraph, regions: Sequence[str]) -> None:
    owner: dict[Hashable, str] = {}
    for region in regions:
        for v in _forward_nodes_of(graph, region):
            if v in owner:
                raise ValueError(f"checkpoint regions {owner[v]!r} and {region!r} overlap; nested checkpoints are "
                                 "not planned: give one of them")
            owner[v] = region


def region_graph(graph: nx.DiGraph, regions: Iterable[str]) -> nx.DiGraph:
    """``graph`` with the recomputations of ``regions`` as twin nodes (see the module docstring).

    A twin ``"recompute:v"`` costs and holds what ``v`` does and reads the twins of its
    predecessors inside the recomputed prefix, the originals otherwise (the region's held inputs,
    the results its policy saved). Backward ops of the region read twins instead of the originals.
    Liveness edges (``hold=True``, not data) to the region's last backward op keep what the
    checkpoint holds until then: the region's inputs, and saved results no one reads again (the
    policy's cache keeps them while the recomputation stops before it reaches them)."""
    regions = list(regions)
    _check_disjoint(graph, regions)
    graph = as_eager_runs(graph)
    result = graph.copy()
    for region in regions:
        reason = checkpointable(graph, region)
        if reason is not None:
            raise ValueError(reason)
        parts = region_costs(graph, region)
        recomputed = set(parts.recomputed)
        backward = set(parts.backward)
        if parts.overhead_seconds:  # what the checkpoint itself costs, on the op that enters it
            entry = result.nodes[parts.nodes[0]]
            entry["cost"] = float(entry["cost"]) + parts.overhead_seconds
            entry["checkpoint_overhead"] = parts.overhead_seconds
        for v in parts.recomputed:
            data = dict(graph.nodes[v])
            data.update(kind=RECOMPUTE, recomputes=v)
            data.pop("pinned", None)
            data.pop("output", None)
            result.add_node(twin(v), **data)
            for p in graph.predecessors(v):
                result.add_edge(twin(p) if p in recomputed else p, twin(v))
            for s in list(graph.successors(v)):
                if s in backward:
                    data = result.edges[v, s]
                    result.remove_edge(v, s)
                    result.add_edge(twin(v), s, **data)
        if not parts.backward:
            continue
        last = parts.backward[-1]
        for p in parts.held_to_the_end(graph):
            if not result.has_edge(p, last):
                result.add_edge(p, last, hold=True)
    return result


def region_computes(graph: nx.DiGraph, regions: Iterable[str]) -> list[Hashable]:
    """The order native checkpointing computes ``region_graph(graph, regions)``'s nodes in: trace
    order, each region's twins right before its trigger (the first backward op that unpacks
    something the region packed)."""
    triggers: dict[Hashable, list[Hashable]] = {}
    for region in regions:
        parts = region_costs(graph, region)
        if parts.trigger is not None and parts.recomputed:
            triggers.setdefault(parts.trigger, []).extend(twin(v) for v in parts.recomputed)
    computes: list[Hashable] = []
    for v in _trace_order(graph):
        computes.extend(triggers.get(v, ()))
        computes.append(v)
    return computes


def region_schedule(graph: nx.DiGraph, regions: Iterable[str]) -> tuple[nx.DiGraph, Schedule]:
    """The region graph and the schedule native checkpointing of ``regions`` executes on it."""
    regions = list(regions)
    augmented = region_graph(graph, regions)
    return augmented, schedule_from_computes(augmented, region_computes(graph, regions))


def evaluate(graph: nx.DiGraph, regions: Iterable[str]) -> RegionPlan:
    """Simulate native checkpointing of ``regions``: peak (bytes, the schedule's part) and time."""
    regions = tuple(regions)
    augmented, schedule = region_schedule(graph, regions)
    outcome = simulate(augmented, schedule)
    if not outcome.valid:  # a bug in this module: the region graph is built to be executable
        raise AssertionError(f"region schedule is not executable: {outcome.error}")
    return RegionPlan(regions, augmented, schedule, outcome)


def candidate_regions(graph: nx.DiGraph) -> list[str]:
    """Every module path (and every prefix of one) that :func:`checkpointable` accepts, in trace
    order of their first op."""
    seen: dict[str, None] = {}
    for _, data in graph.nodes(data=True):
        if data.get("kind") != "forward":
            continue
        parts = str(data.get("module", "")).split(".") if data.get("module") else []
        for depth in range(1, len(parts) + 1):
            seen.setdefault(".".join(parts[:depth]), None)
    return [r for r in seen if checkpointable(graph, r) is None]


def segmentations(graph: nx.DiGraph, sequentials: dict[str, int]) -> list[list[str]]:
    """For each ``nn.Sequential`` in ``sequentials`` (path -> number of children, named ``0..n-1``)
    and each length ``L`` from 2 to ``n - 1``: its children cut into runs of ``L`` (the last may be
    shorter), the runs that :func:`checkpointable` accepts."""
    result = []
    for path, count in sequentials.items():
        for length in range(2, count):
            runs = [segment(path, start, min(start + length, count)) for start in range(0, count, length)]
            runs = [r for r in runs if checkpointable(graph, r) is None]
            if runs:
                result.append(runs)
    return result


def _children(region: str, candidates: Sequence[str]) -> list[str]:
    """The module candidates directly below ``region`` (the shallowest module candidates inside it),
    under ``region``'s policy. Plain candidates only are looked at: a module is inside its own policy
    variants (``within("h.5.attn", "h.5.attn@matmuls")``), so that with the variants among the
    candidates the children of ``"h.5"`` were ``"h.5.attn@matmuls"`` and those of
    ``"h.5@projections"`` ``"h.5"`` itself."""
    base, policy = split_policy(region)
    inside = [c for c in candidates if "@" not in c and c != base and parse_segment(c) is None and within(c, base)]
    children = [c for c in inside if not any(o != c and within(c, o) for o in inside)]
    return [c if policy is None else f"{c}@{policy}" for c in children]


def _by_depth(modules: Sequence[str]) -> list[list[str]]:
    """The module candidates of each depth, shallowest first."""
    return [[c for c in modules if c.count(".") == depth] for depth in sorted({c.count(".") for c in modules})]


class RegionModel:
    """:func:`evaluate`'s peak and time without building graphs: the graph's numbers indexed once,
    each region's parts cached, so that a search can try thousands of region sets. Equal to
    :func:`evaluate` (tests/test_regions.py checks it)."""

    def __init__(self, graph: nx.DiGraph):
        graph = as_eager_runs(graph)
        self.graph = graph
        self.order = _trace_order(graph)
        self.index = {v: i for i, v in enumerate(self.order)}
        nodes = graph.nodes
        self.mem = [int(nodes[v]["mem"]) for v in self.order]
        self.workspace = [int(nodes[v].get("workspace", 0)) for v in self.order]
        self.cost = [float(nodes[v]["cost"]) for v in self.order]
        self.kept = [bool(nodes[v].get("output") or nodes[v].get("pinned")) for v in self.order]
        self.preds = [[self.index[p] for p in graph.predecessors(v)] for v in self.order]
        self._parts: dict[str, tuple] = {}
        self._by_module = ModuleNodes.of(graph)

    def parts(self, region: str) -> tuple:
        """(recomputed indices, backward indices, trigger index or None, held-until-last indices, the
        checkpoint's own seconds)."""
        if region not in self._parts:
            costs = region_costs(self.graph, region, self._by_module)
            index = self.index
            held = [index[v] for v in costs.held_to_the_end(self.graph)]
            self._parts[region] = (
                [index[v] for v in costs.recomputed], [index[b] for b in costs.backward],
                None if costs.trigger is None else index[costs.trigger], held, costs.overhead_seconds,
            )
        return self._parts[region]

    def peak_and_cost(self, regions: Iterable[str]) -> tuple[int, float]:
        """(peak bytes of the schedule's part, compute seconds) of checkpointing ``regions``."""
        n = len(self.order)
        twin_base: list[int] = []  # instance n + k is the twin of base node twin_base[k]
        twin_of: dict[tuple[int, int], int] = {}  # (region number, base index) -> twin instance
        backward_region: dict[int, int] = {}
        trigger: dict[int, list[int]] = {}
        hold: dict[int, list[int]] = {}
        parts = [self.parts(r) for r in regions]
        for number, (recomputed, backward, first, held, _) in enumerate(parts):
            for b in backward:
                backward_region[b] = number
            if backward:
                hold.setdefault(backward[-1], []).extend(held)
            if first is None or not recomputed:
                continue
            instances = []
            for i in recomputed:
                twin_of[(number, i)] = n + len(twin_base)
                instances.append(n + len(twin_base))
                twin_base.append(i)
            trigger.setdefault(first, []).extend(instances)

        def reads(instance: int) -> list[int]:
            if instance >= n:
                base = twin_base[instance - n]
                return [twin_of.get((twin_region[instance], p), p) for p in self.preds[base]]
            number = backward_region.get(instance)
            result = self.preds[instance] if number is None else \
                [twin_of.get((number, p), p) for p in self.preds[instance]]
            return result + hold.get(instance, [])

        twin_region = {t: k for (k, _), t in twin_of.items()}
        sequence: list[int] = []
        for i in range(n):
            sequence.extend(trigger.get(i, ()))
            sequence.append(i)
        last_use = {}
        read_lists = []
        for position, instance in enumerate(sequence):
            read = reads(instance)
            read_lists.append(read)
            for r in read:
                last_use[r] = position
            last_use.setdefault(instance, position)
        frees_after: dict[int, list[int]] = {}
        for instance, position in last_use.items():
            base = instance if instance < n else twin_base[instance - n]
            if instance < n and self.kept[base]:
                continue
            frees_after.setdefault(position, []).append(instance)
        held = peak = 0
        cost = sum(part[4] for part in parts)  # what the checkpoints themselves cost
        for position, instance in enumerate(sequence):
            base = instance if instance < n else twin_base[instance - n]
            peak = max(peak, held + self.mem[base] + self.workspace[base])
            held += self.mem[base]
            cost += self.cost[base]
            for freed in frees_after.get(position, ()):
                held -= self.mem[freed if freed < n else twin_base[freed - n]]
        return peak, cost


def plan_regions(graph: nx.DiGraph, budget_bytes: int, candidates: Sequence[str] | None = None,
                 sequentials: dict[str, int] | None = None, time_limit: float | None = None,
                 policies: Sequence[str] = tuple(SAVE_POLICIES)) -> RegionPlan:
    """The checkpoint regions with the least recomputation that the search finds within
    ``budget_bytes`` (the schedule's peak, ``fixed_bytes`` excluded, as for :func:`solvers.solve`).

    ``candidates`` are module regions (default :func:`candidate_regions`); ``sequentials`` names the
    ``nn.Sequential`` containers whose children may also be checkpointed in runs (:func:`segmentations`).

    A heuristic, not an optimum: start from each of these checkpointed: every module candidate at one
    depth, every segmentation of a Sequential; then, latest region
    first (the backward reaches it first, when least is held behind it), drop a region when the rest
    still fits, or else replace it by the modules directly inside it and drop as many of those as
    fit. Latest first because a region kept whole holds its activations through the recomputation
    of every earlier region. Last, latest first again, each region takes the save policy of
    ``policies`` (:data:`SAVE_POLICIES`, by name) that makes the predicted step cheapest where the
    peak still fits, and none when none makes it strictly cheaper. The cheapest plan over all starts
    wins. Raises :class:`Infeasible` with the least peak seen when nothing fits.
    """
    started = time.perf_counter()
    if candidates is None:
        candidates = candidate_regions(graph)
    starts = _by_depth(list(candidates)) + segmentations(graph, sequentials or {})
    candidates = list(candidates) + [r for start in starts for r in start if parse_segment(r) is not None]
    candidates += [f"{r}@{policy}" for policy in (policies or ()) for r in candidates]
    model = RegionModel(graph)
    cache: dict[frozenset, tuple[int, float]] = {}

    def run(regions) -> tuple[int, float]:
        key = frozenset(regions)
        if key not in cache:
            cache[key] = model.peak_and_cost([c for c in candidates if c in key])
        return cache[key]

    def fits(regions) -> bool:
        return run(regions)[0] <= budget_bytes

    def out_of_time() -> bool:
        return time_limit is not None and time.perf_counter() - started > time_limit

    if fits(()):
        return evaluate(graph, ())
    base_cost = run(())[1]
    best: list[str] | None = None
    least = run(())[0]
    # Each start also with every region under each policy: at a tight budget every block under a
    # policy that recomputes the attention's products can hold less, and cost less, than some blocks
    # checkpointed whole and the others not at all (the benchmark GPT-2 with eager attention: all six
    # blocks "@projections" at 42.2% of the un-checkpointed activations for +21.8% of its step; the
    # plain starts gave +25.0% at 50%), a plan that dropping plain regions, then adding policies, misses.
    starts += [[f"{r}@{policy}" for r in start] for policy in (policies or ()) for start in starts]
    for chosen in starts:
        least = min(least, run(chosen)[0])
        if not fits(chosen):
            chosen = _tighten(chosen, policies or (), run, budget_bytes) if _saves_draws(chosen) else None
            if chosen is None:
                continue
        relaxed = _relax(chosen, candidates, fits, out_of_time)
        relaxed = _with_policies(relaxed, policies or (), run, budget_bytes)
        if best is None or _better(run(relaxed)[1], relaxed, run(best)[1], best, base_cost * TIE):
            best = relaxed
        if out_of_time():
            break
    if best is None:
        raise Infeasible(
            f"no set of checkpointed modules fits {budget_bytes} bytes of activations; the least found holds "
            f"{least}", min_budget=least, method=METHOD)
    return evaluate(graph, [c for c in candidates if c in set(best)])


# Plans whose predicted steps differ by at most this fraction of the un-checkpointed step are taken
# as equal and the fewer regions win (then the names): measured op times vary with the machine's
# load, and the same model planned twice should get the same plan. A threshold on the difference,
# not rounding to buckets of this width: two costs a hair apart on either side of a bucket's edge
# were "different" (a 12-layer GPT-2 at 60% got 8 regions from one profile, 16 from the next). 2%,
# not 1%: with 1% three profiles of that model on a loaded machine still gave two plans at 60% and
# 75% (whole blocks, or their attention and MLP apart: near-equal costs); with 2%, one plan at each
# of 45%, 60% and 75% (benchmarks/plan_stability.py). The price: a plan up to 2% of a step slower.
TIE = 0.02


def _better(cost: float, regions: Sequence[str], incumbent_cost: float, incumbent: Sequence[str],
            tolerance: float) -> bool:
    """Whether ``regions`` (predicted step ``cost``, seconds) should replace ``incumbent``: cheaper by
    more than ``tolerance`` seconds, or as cheap within it and simpler (fewer regions, then names)."""
    if abs(cost - incumbent_cost) > tolerance:
        return cost < incumbent_cost
    return (len(regions), sorted(regions)) < (len(incumbent), sorted(incumbent))


def _with_policies(chosen: list[str], policies: Sequence[str], run, budget_bytes: int) -> list[str]:
    """Latest region first: the region plain or under one of ``policies``, whichever makes the plan
    cheapest within ``budget_bytes`` (``run`` gives a region set's predicted peak and seconds); the
    region as it is unless another is strictly cheaper. Strictly: a policy that saves nothing in a
    region (an LSTM stage, one oneDNN op) predicts the same step as the plain checkpoint, yet its
    selective-checkpoint mode costs time at run time (the LSTM model's three stages at 50%: the same
    peak, and 2.12x eager's step with ``@matmuls``, 1.55x plain: docs/native.md)."""
    current = list(chosen)
    for region in reversed(list(chosen)):
        base, _ = split_policy(region)
        best, best_cost = current, run(current)[1]
        for option in [base, *(f"{base}@{policy}" for policy in policies)]:
            replaced = [option if r == region else r for r in current]
            peak, cost = run(replaced)
            if peak <= budget_bytes and cost < best_cost:
                best, best_cost = replaced, cost
        current = best
    return current


def _saves_draws(regions: Sequence[str]) -> bool:
    """Whether any of ``regions`` is under a policy that saves the random draws."""
    return any(policy is not None and SAVE_POLICIES[policy].draws for policy in (split_policy(r)[1] for r in regions))


def _tighten(chosen: list[str], policies: Sequence[str], run, budget_bytes: int) -> list[str] | None:
    """``chosen`` made to fit ``budget_bytes``, or None: each region's other options (another policy,
    or none) priced once against ``chosen`` (predicted peak freed, step added), then applied in order
    of seconds added per byte freed, at most one per region, until the peak fits. A start with every
    block under a policy that saves the random draws holds a little more than the budget at the peak
    of every block under "matmuls" (the benchmark GPT-2: 252.0 MiB against 246.0, for +5.6% of the
    step against +20.6%): a few blocks under a tighter policy make it fit, where dropping regions
    (:func:`_relax`) only adds bytes. Priced once, not greedily re-priced after each change: the
    greedy search took 20-49 s on the 6-layer GPT-2 and BERT (loaded machine)."""
    if run([split_policy(r)[0] for r in chosen])[0] > budget_bytes:
        return None  # a region holds the least with no policy: then no mix of policies fits either
    peak, cost = run(chosen)
    changes: list[tuple[float, int, str]] = []
    for position, region in enumerate(chosen):
        base, _ = split_policy(region)
        for option in [base, *(f"{base}@{policy}" for policy in policies)]:
            if option == region:
                continue
            trial_peak, trial_cost = run(chosen[:position] + [option] + chosen[position + 1:])
            if trial_peak < peak:
                changes.append(((trial_cost - cost) / (peak - trial_peak), position, option))
    current = list(chosen)
    changed: set[int] = set()
    for _, position, option in sorted(changes):
        if position in changed:
            continue
        trial = current[:position] + [option] + current[position + 1:]
        if run(trial)[0] < run(current)[0]:
            current = trial
            changed.add(position)
            if run(current)[0] <= budget_bytes:
                return current
    return None


def _relax(chosen: list[str], candidates: Sequence[str], fits, out_of_time) -> list[str]:
    """Latest region first: drop it if the rest fits, else try its children in its place."""
    current = list(chosen)
    for region in reversed(list(chosen)):
        if out_of_time():
            break
        without = [r for r in current if r != region]
        if fits(without):
            current = without
            continue
        children = _children(region, candidates)
        if not children:
            continue
        replaced = without + children
        if not fits(replaced):
            continue
        current = _relax_children(replaced, children, fits)
    return current


def _relax_children(current: list[str], children: list[str], fits) -> list[str]:
    for child in reversed(children):
        without = [r for r in current if r != child]
        if fits(without):
            current = without
    return current


def solve_regions(graph: nx.DiGraph, budget_bytes: int, time_limit: float | None = None) -> RegionPlan:
    """:func:`plan_regions` with the solver's report on the schedule (status ``heuristic``)."""
    started = time.perf_counter()
    plan = plan_regions(graph, budget_bytes, time_limit=time_limit)
    info = SolverInfo(
        method=METHOD, status="heuristic", solve_seconds=time.perf_counter() - started, budget_bytes=budget_bytes,
        predicted_peak_bytes=plan.outcome.peak_bytes, compute_cost=plan.outcome.compute_cost,
        message=f"checkpoint {len(plan.regions)} module(s) with torch.utils.checkpoint" if plan.regions
        else "nothing to checkpoint: the step fits as it is",
    )
    return RegionPlan(plan.regions, plan.graph, plan.schedule.with_info(**info.__dict__), plan.outcome)


__all__ = [
    "METHOD", "RegionCosts", "RegionPlan", "candidate_regions", "checkpoint_overhead", "checkpointable", "evaluate",
    "plan_regions",
    "region_computes", "region_costs", "region_graph", "region_schedule", "solve_regions", "twin", "within",
]
