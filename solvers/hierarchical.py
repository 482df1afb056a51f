"""``hierarchical``: repeated blocks found once, a menu of options per distinct block, a chain
program over blocks with several options per stage (Rockmate's generalisation of Beaumont et
al.'s program), and the order-free relaxation's bound (solvers/orderfree) to certify the result.

Blocks
------
The blocks are the stages of the graph's chain views (solvers/chain.py: the forward cut where only
one result crosses, like articulation points, each backward node with the stage whose results it
reads). Two stages are the same block when their sub-graphs (forward and backward nodes, the
edges between them, and the edges from outside labelled by what the outside node is to the stage:
its input ``x_i``, the incoming gradient, a reserved node) are isomorphic with equal bytes,
workspace, output and pinned flags, and equal module paths once layer numbers are dropped
(``transformer.h.7.attn`` and ``transformer.h.8.attn`` match) where the graph carries them.
Costs are *not* compared: profiled layers never take exactly the same time. Every transformer
layer of a GPT-2 module graph is then one class (:func:`block_classes`).

Menus
-----
A block's options are what its forward run with grad keeps for its backward: every subset ``S``
of the forward nodes its backward reads that do not cross to a later stage anyway (those are
``x_{i+1}``, held in any case); with ``S`` kept, the backward first recomputes the others it
needs (and their ancestors in the block) from ``x_i``, ``S`` and the reserved nodes, then runs
(:class:`Option`). Up to :data:`MAX_SUBSET_NODES` candidates every subset is tried, else the
nested subsets that drop candidates cheapest to recompute per byte first. The menu is computed
once per class, on its first member, and is the Pareto front of (bytes kept, forward scratch,
backward scratch, recomputation time); each member's times are its own (its own costs, the
class's node mapping). Option "keep everything" is what ``dp`` does, so with one option per
stage the program below is ``dp``'s (tests/test_hierarchical.py checks it equals
``solvers.dp.solve_chain`` on random chains).

The program
-----------
``C(i, l, m)`` as in solvers/dp.py (the least time to turn ``x_i`` and ``y_{l+1}`` into ``y_i``
within memory ``m``, which counts ``x_i``, ``y_{l+1}`` and the parameter gradients of the stages
after ``l``), with option (b) taken over the block's options ``k``:
``fw[i] + bw_k[i] + C(i+1, l, m - x[i] - xbar_k[i+1] + x[i+1])`` when
``m >= x[i] + x[l+1] + G[l+1] + xbar_k[i+1] + ftmp_k[i]`` (the forward with grad while
``y_{l+1}`` is live) and ``m >= 2 x[i] + xbar_k[i+1] + x[i+1] + G[i] + btmp_k[i]`` (the
backward, its recomputations included in ``btmp_k``). Forwards without grad use the scratch of a
run that keeps nothing (``ftmp`` of no grad), not the larger of the two as ``dp`` does. Memory is
a grid of :data:`LEVELS` levels, sizes rounded up (a plan fits the model at the budget it was
planned for). The program is solved once for every memory level; each distinct plan (one per
level at which the optimum changes) is lowered to a schedule of the full graph and checked with
:func:`solvers.simulate`, cheapest first: the first one within the budget wins (the chain model
over-counts what the graph holds, so plans made for more memory than the budget often fit).

The bound and what is proven
----------------------------
A schedule from the program is optimal in the chain model at best, so the method reports the
order-free relaxation's bound (solvers/orderfree, proven there: the optimum of a MILP of which
every valid schedule within the budget, in any order of computation, gives a feasible point of no
greater cost; its LP value and its solver's dual bound are therefore lower bounds too), never
below the cost of computing every node once. With :data:`BOUND_SHARE` of the time left after
planning, the relaxation is built, its LP solved, then its MILP started from the cheapest schedule
in hand (this method's or ``dp``'s); where the MILP's own incumbent, laid out, fits the budget and
is cheaper, it is taken, and where it found nothing cheaper than its start, the window search of
solvers/orderfree/windows.py runs with what is left. The status is ``optimal`` only when the cost
meets that bound; otherwise ``feasible`` with the gap. ``info.message`` names the bound.
"""

from __future__ import annotations

import itertools
import logging
import math
import re
import time
from dataclasses import dataclass

import networkx as nx
import numpy as np

from .chain import ChainView, _bytes, _chain_sizes, _local_peak, chain_views
from .chainmodel import Chain, Op
from .clock import Clock
from .errors import Infeasible, SolverTimeout, SolverUnavailable
from .graph import is_output, node_costs
from .liveness import drop_redundant_computes, schedule_from_computes
from .options import schedule_from, time_limit_or_default
from .schedule import FEASIBLE, OPTIMAL, Schedule
from .simulate import simulate
from .store_all import store_all_schedule

METHOD = "hierarchical"
log = logging.getLogger(__name__)
# Candidates (forward nodes a block's backward reads) up to which every subset is an option.
MAX_SUBSET_NODES = 8
# Memory levels of the program's grid (sizes rounded up to top / LEVELS bytes).
LEVELS = 1500
# Plans above the one the bisection finds that are lowered and checked too (peaks are not monotone).
SEARCH_ABOVE = 24
# Share of the time left after planning given to the order-free relaxation (its LP, its MILP and
# the window search); the rest is slack for laying out and checking.
BOUND_SHARE = 0.95
# Shares of the relaxation's time: its LP (a bound even where the MILP's root does not end), then
# the window search from the cheapest schedule in hand, then the MILP (of what is left each time).
LP_SHARE = 0.4
WINDOWS_SHARE = 0.2
FIRST_SOLVE_SHARE = 0.8
# dp's schedule joins the MILP's starts only where every chain view has at most this many stages
# (solvers/orderfree/method.py's QUICK_DP_STAGES: dp then plans in about a second).
QUICK_DP_STAGES = 100
# A class with at least this many members, of blocks of at least MIN_BLOCK_NODES nodes, makes a
# graph one "with repeated blocks" (auto).
REPEATED_MEMBERS = 3
MIN_BLOCK_NODES = 4
# A cost within this relative distance of the bound is proven optimal (the solvers' tolerance).
OPTIMALITY_TOLERANCE = 1e-7


# -- blocks ---------------------------------------------------------------------------------------

def _module_pattern(data) -> str:
    """A node's module path with layer numbers dropped (``transformer.h.7.attn`` -> ``transformer.h.#.attn``)."""
    return re.sub(r"\.\d+(?=\.|$)", ".#", str(data.get("module", "")))


def _block_graph(view: ChainView, stage: int) -> nx.DiGraph:
    """Stage ``stage``'s forward and backward nodes with their edges, plus one node per outside
    input labelled by its role; node attribute ``label`` is what isomorphism must preserve."""
    graph, stage_of, reserved = view.graph, view.stage_of, view.reserved
    forward, backward = view.forward[stage], view.backward[stage]
    members = set(forward) | set(backward)
    block = nx.DiGraph()
    for role, nodes in (("f", forward), ("b", backward)):
        for v in nodes:
            data = graph.nodes[v]
            escapes = any(s not in members for s in graph.successors(v))
            block.add_node(v, label=(role, int(data["mem"]), int(data.get("workspace", 0)), bool(data.get("output")),
                                     bool(data.get("pinned")), escapes, v in reserved, _module_pattern(data)))
    for v in members:
        for u in graph.predecessors(v):
            if u not in members:
                where = stage_of.get(u, -1)
                if u in reserved:
                    role = "reserved"
                elif where >= 0 and u in view.forward[where]:
                    role = "x" if where < stage else "later-forward"
                else:
                    role = "gradient"
                key = ("__outside__", u)
                offset = where - stage if role in ("gradient", "later-forward") else 0  # the next stage's gradient
                block.add_node(key, label=("in", role, int(graph.nodes[u]["mem"]), offset))
                block.add_edge(key, v)
            else:
                block.add_edge(u, v)
    return block


def block_classes(view: ChainView) -> tuple[list[int], list[dict]]:
    """For each stage, its class (the first stage of the class); and for each stage, the mapping
    of the class's first stage's nodes onto its own (identity for the first)."""
    hashes, blocks = [], []
    for stage in range(view.length + 1):
        block = _block_graph(view, stage)
        blocks.append(block)
        relabelled = nx.DiGraph()
        relabelled.add_nodes_from((n, {"l": str(d["label"])}) for n, d in block.nodes(data=True))
        relabelled.add_edges_from(block.edges)
        hashes.append(nx.weisfeiler_lehman_graph_hash(relabelled, node_attr="l", iterations=3))
    classes: list[int] = []
    mappings: list[dict] = []
    firsts: dict[str, list[int]] = {}
    for stage, block in enumerate(blocks):
        found = None
        for first in firsts.get(hashes[stage], []):
            matcher = nx.algorithms.isomorphism.DiGraphMatcher(
                blocks[first], block, node_match=lambda a, b: a["label"] == b["label"])
            if matcher.is_isomorphic():
                own = set(view.forward[first]) | set(view.backward[first])
                found = (first, {k: v for k, v in matcher.mapping.items() if k in own})
                break
        if found is None:
            firsts.setdefault(hashes[stage], []).append(stage)
            found = (stage, {v: v for v in view.forward[stage] + view.backward[stage]})
        classes.append(found[0])
        mappings.append(found[1])
    return classes, mappings


def repeated_blocks(graph) -> int:
    """The most members any class of blocks of at least :data:`MIN_BLOCK_NODES` nodes has in the
    graph's first chain view (0: no such block; 1: none repeats). A stage of one forward node and
    its gradient (Checkmate's linear graphs) is no layer: its menu has one option."""
    view = chain_views(graph)[0]
    classes, _ = block_classes(view)
    big = [c for c in classes if len(view.forward[c]) + len(view.backward[c]) >= MIN_BLOCK_NODES]
    return max((big.count(c) for c in set(big)), default=0)


# -- menus ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    """One way to run stage i: keep ``saved`` (forward nodes, besides ``x_{i+1}``) from its forward
    with grad to its backward, which first recomputes ``recompute`` (in this order). Sizes in bytes:
    ``xbar`` what the forward leaves held (``x_{i+1}`` included), ``ftmp`` the forward's scratch
    above it, ``btmp`` the backward's scratch above ``x_i`` and its parameter gradients; ``bw`` the
    backward's seconds, recomputations included."""

    saved: frozenset
    recompute: tuple
    xbar: int
    ftmp: int
    btmp: int
    bw: float


@dataclass(frozen=True)
class OptionChain:
    """A chain (solvers/chainmodel.py) whose stages each have several options, ``fwd_tmp`` the
    scratch of a forward without grad (above ``x[i+1]``)."""

    chain: Chain
    options: tuple  # options[i]: tuple of Option for stage i < L
    fwd_tmp: tuple


def _candidates(view: ChainView, stage: int, crossing: set) -> list:
    """Forward nodes of ``stage`` its backward reads that are not held anyway (not crossing on)."""
    graph, forward = view.graph, view.forward[stage]
    backward = set(view.backward[stage])
    return [u for u in forward if u not in view.reserved and u not in crossing
            and any(s in backward for s in graph.successors(u))]


def _recompute(view: ChainView, stage: int, kept: set) -> tuple:
    """The forward nodes of ``stage`` its backward needs that are not ``kept``, with their
    ancestors in the stage that are not kept, in topological order."""
    graph, forward = view.graph, view.forward[stage]
    inside = set(forward)
    backward = view.backward[stage]
    need = {u for b in backward for u in graph.predecessors(b) if u in inside and u not in kept}
    stack = list(need)
    while stack:
        v = stack.pop()
        for u in graph.predecessors(v):
            if u in inside and u not in kept and u not in need and u not in view.reserved:
                need.add(u)
                stack.append(u)
    return tuple(v for v in forward if v in need)


def _option(view: ChainView, stage: int, saved: frozenset, crossing: set, x_next: int, x_here: int,
            outputs: set, gout: int, y: set) -> Option:
    graph, reserved = view.graph, view.reserved
    forward, backward = view.forward[stage], view.backward[stage]
    kept = crossing | set(saved)
    xbar = max(x_next, _bytes(graph, kept - reserved))
    peak, _ = _local_peak(graph, forward, kept, reserved)
    recompute = _recompute(view, stage, kept | reserved)
    bpeak, _ = _local_peak(graph, recompute + tuple(backward), y | outputs, reserved)
    bw = sum(graph.nodes[v]["cost"] for v in recompute + tuple(backward))
    return Option(frozenset(saved), recompute, xbar, max(0, peak - xbar), max(0, bpeak - x_here - gout), bw)


def _subsets(view: ChainView, stage: int, candidates: list) -> list[frozenset]:
    if len(candidates) <= MAX_SUBSET_NODES:
        return [frozenset(c) for r in range(len(candidates) + 1) for c in itertools.combinations(candidates, r)]
    nodes = view.graph.nodes
    # Drop first what is cheapest to recompute per byte it frees.
    order = sorted(candidates, key=lambda u: nodes[u]["cost"] / max(1, nodes[u]["mem"]))
    return [frozenset(order[k:]) for k in range(len(order) + 1)]


def option_chain(view: ChainView) -> tuple[OptionChain, list[int]]:
    """The view's chain with a menu per stage, computed once per block class (:func:`block_classes`)
    and mapped onto each member; also each stage's class."""
    chain = _chain_sizes(view)
    graph, length, reserved = view.graph, view.length, view.reserved
    classes, mappings = block_classes(view)
    stage_of = view.stage_of
    backward_nodes = {v for nodes in view.backward for v in nodes}
    crossing_next = []  # x_{i+1}'s nodes: forward results of stages <= i read at stages > i
    for i in range(length):
        crossing_next.append({u for j in range(i + 1) for u in view.forward[j] if u not in reserved
                              and any(stage_of.get(s, -1) > i for s in graph.successors(u))})
    menus: dict[int, list[frozenset]] = {}
    options, fwd_tmp = [], []
    for i in range(length):
        peak_nograd, _ = _local_peak(graph, view.forward[i], crossing_next[i], reserved)
        fwd_tmp.append(max(0, peak_nograd - chain.x[i + 1]))
        outputs = {b for b in view.backward[i] if is_output(graph, b) and b not in reserved}
        outputs |= {b for b in view.backward[i] if not is_output(graph, b)
                    and any(s in backward_nodes and stage_of[s] < i - 1 for s in graph.successors(b))}
        y = {b for b in view.backward[i] if any(s in backward_nodes and stage_of[s] == i - 1
                                                 for s in graph.successors(b))}
        first = classes[i]
        if first not in menus:  # the class's menu: saved sets on its first member's nodes
            menus[first] = _subsets(view, first, _candidates(view, first, crossing_next[first]))
        mapping = mappings[i]
        made = [_option(view, i, frozenset(mapping[u] for u in saved), crossing_next[i], chain.x[i + 1],
                        chain.x[i], outputs, chain.gout[i], y) for saved in menus[first]]
        options.append(tuple(_pareto(made)))
    return OptionChain(chain, tuple(options), tuple(fwd_tmp)), classes


def _pareto(options: list[Option]) -> list[Option]:
    """The options no other beats or ties on every size and the backward's time (first kept on ties)."""
    keys = [(o.xbar, o.ftmp, o.btmp, o.bw) for o in options]
    kept = []
    for a, ka in enumerate(keys):
        dominated = any(all(q <= p for q, p in zip(kb, ka)) and (kb != ka or b < a) for b, kb in enumerate(keys) if b != a)
        if not dominated:
            kept.append(options[a])
    return kept


# -- the program ----------------------------------------------------------------------------------

@dataclass
class _Units:
    """The option chain's sizes in whole units of the grid (rounded up), per stage and option."""

    x: list
    xbar: list  # xbar[i][k]: stage i's option k
    ftmp: list
    btmp: list
    fwd_tmp: list
    G: list
    gout: list


@dataclass
class Program:
    """``C(i, l, .)`` over memory levels ``0..M`` of ``unit`` bytes, and the choices: ``-1`` none,
    ``j > i`` option (a) with split ``j``, ``-(k + 2)`` option (b) with the stage's option ``k``."""

    oc: OptionChain
    unit: int
    levels: int
    value: dict
    choice: dict
    sizes: _Units

    def makespan(self, level: int) -> float:
        return float(self.value[0, self.oc.chain.length][level])

    def sequence(self, level: int) -> list[tuple[Op, int]]:
        """The ops of the plan at ``level`` with each forward-with-grad's option (``-1`` otherwise)."""
        out: list[tuple[Op, int]] = []
        self._unfold(0, self.oc.chain.length, level, out)
        return out

    def _unfold(self, i: int, l: int, m: int, out: list) -> None:
        length = self.oc.chain.length
        if i == length:
            out.append((Op("L", length), -1))
            return
        if i > l:
            return
        c = int(self.choice[i, l][m])
        if c == -1:
            raise AssertionError("hierarchical: unfolding an infeasible cell")
        u = self.sizes
        if c <= -2:
            k = -c - 2
            out.append((Op("Fe", i), k))
            self._unfold(i + 1, l, m - u.x[i] - u.xbar[i][k] + u.x[i + 1], out)
            out.append((Op("B", i), k))
            return
        out.append((Op("CF", i), -1))
        for s in range(i + 1, c):
            out.append((Op("Fn", s), -1))
        self._unfold(c, l, m - u.x[i], out)
        self._unfold(i, c - 1, m, out)


def _units(oc: OptionChain, unit: int) -> _Units:
    up = lambda b: -(-int(b) // unit)  # noqa: E731 (sizes rounded up: plans fit in bytes)
    chain, length = oc.chain, oc.chain.length
    x = [up(v) for v in chain.x] + [0]
    gout = [up(v) for v in chain.gout]
    G = [0] * (length + 2)
    for i in range(length, -1, -1):
        G[i] = G[i + 1] + gout[i]
    return _Units(x, [[up(o.xbar) for o in oc.options[i]] for i in range(length)],
                  [[up(o.ftmp) for o in oc.options[i]] for i in range(length)],
                  [[up(o.btmp) for o in oc.options[i]] for i in range(length)] + [[up(chain.btmp[length])]],
                  [up(v) for v in oc.fwd_tmp], G, gout)


def solve_program(oc: OptionChain, top: int, levels: int = LEVELS, unit: int | None = None) -> Program:
    """``C(i, l, m)`` for every level up to ``top`` bytes (module docstring), vectorised over ``m``."""
    chain, length = oc.chain, oc.chain.length
    unit = unit if unit is not None else max(1, -(-int(top) // levels))
    M = int(top) // unit
    u = _units(oc, unit)
    fw = list(chain.fw)
    bws = [[o.bw for o in oc.options[i]] for i in range(length)] + [[chain.bw[length]]]
    value: dict = {}
    choice: dict = {}
    inf = math.inf

    def shifted(array: np.ndarray, shift: int) -> np.ndarray:
        """array[m - shift] for every m (inf where out of range)."""
        out = np.full(M + 1, inf)
        if shift >= 0:
            if shift <= M:
                out[shift:] = array[: M + 1 - shift]
        else:
            out[: M + 1 + shift] = array[-shift:]
        return out

    zero = np.zeros(M + 1)
    for span in range(0, length + 1):
        for i in range(length - span, -1, -1):
            l = i + span
            if l > length:
                continue
            best = np.full(M + 1, inf)
            pick = np.full(M + 1, -1, dtype=np.int32)
            if i == length:  # the loss
                need = 2 * u.x[length] + u.G[length] + u.btmp[length][0]
                best[need:] = chain.bw[length]
                pick[need:] = -2
                value[i, l], choice[i, l] = best, pick
                continue
            tail = u.x[l + 1] + u.G[l + 1]
            for k in range(len(oc.options[i])):  # (b) the stage's option k
                xbar, ftmp, btmp = u.xbar[i][k], u.ftmp[i][k], u.btmp[i][k]
                need = max(u.x[i] + tail + xbar + ftmp, 2 * u.x[i] + xbar + u.x[i + 1] + u.G[i] + btmp)
                rest = zero if i + 1 > l else value[i + 1, l]
                candidate = fw[i] + bws[i][k] + shifted(rest, u.x[i] + xbar - u.x[i + 1])
                candidate[: min(need, M + 1)] = inf
                better = candidate < best
                best[better] = candidate[better]
                pick[better] = -(k + 2)
            forward = 0.0  # (a) checkpoint x_i, forwards without grad to x_j
            scratch = u.x[i] + tail + u.x[i + 1] + u.fwd_tmp[i]
            for j in range(i + 1, l + 1):
                forward += fw[j - 1]
                if j - 1 > i:
                    scratch = max(scratch, u.x[i] + tail + u.x[j - 1] + u.x[j] + u.fwd_tmp[j - 1])
                candidate = forward + shifted(value[j, l], u.x[i]) + value[i, j - 1]
                candidate[: min(scratch, M + 1)] = inf
                better = candidate < best
                best[better] = candidate[better]
                pick[better] = j
            value[i, l], choice[i, l] = best, pick
    return Program(oc, unit, M, value, choice, u)


# -- lowering -------------------------------------------------------------------------------------

def lower(view: ChainView, oc: OptionChain, sequence: list[tuple[Op, int]]) -> list:
    """The graph computations of a sequence with options: a backward with option ``k`` first
    recomputes that option's nodes (the forward's other results are freed at their last use)."""
    done: set = set()
    order: list = []
    length = view.length
    for op, k in sequence:
        if op.kind in ("CF", "Fn", "Fe"):
            nodes = view.forward[op.stage]
        elif op.kind == "L":
            nodes = view.forward[length] + view.backward[length]
        else:
            nodes = oc.options[op.stage][k].recompute + view.backward[op.stage]
        for node in nodes:
            if node in view.reserved and node in done:
                continue
            done.add(node)
            order.append(node)
    return order


# -- the method -----------------------------------------------------------------------------------

@dataclass
class _Plan:
    cost: float
    peak: int
    schedule: Schedule
    source: str


def _plans(graph, budget: int, clock: Clock) -> tuple[_Plan | None, int, list[str]]:
    """The cheapest lowered plan within ``budget`` over the chain views; the least peak seen; notes."""
    best: _Plan | None = None
    least = math.inf
    notes: list[str] = []
    for number, view in enumerate(chain_views(graph)):
        if number and clock.expired():
            break
        oc, classes = option_chain(view)
        chain = oc.chain
        top = sum(chain.x) + sum(max(o.xbar for o in opts) for opts in oc.options) + sum(chain.gout) \
            + max([o.btmp for opts in oc.options for o in opts] + [chain.btmp[-1]] + list(oc.fwd_tmp)) + 1
        program = solve_program(oc, top)
        row = program.value[0, chain.length]
        finite = np.flatnonzero(np.isfinite(row))
        if not len(finite):
            continue
        lowered = _search(graph, view, oc, program, [int(m) for m in finite if m == finite[0] or row[m] != row[m - 1]],
                          budget)
        least = min(least, min(peak for _, peak, _ in lowered.values()))
        fits = [item for item in lowered.values() if item[1] <= budget]
        if fits:
            cost, peak, schedule = min(fits, key=lambda item: (item[0], item[1]))
            if best is None or (cost, peak) < (best.cost, best.peak):
                best = _Plan(cost, peak, schedule,
                             f"the block program's plan ({view.length} stages in {len(set(classes))} block classes, "
                             f"{sum(len(o) for o in oc.options)} options, {program.levels} memory levels)")
        notes.append(f"view {number}: {view.length} stages")
    return best, int(least) if math.isfinite(least) else None, notes


def _search(graph, view: ChainView, oc: OptionChain, program: Program, changes: list[int], budget: int) -> dict:
    """The plans at the levels ``changes`` (where the optimum changes, dearer upwards) lowered and
    simulated, as ``index -> (cost, peak, schedule)``: the least-memory plan (its peak is this
    view's least), a bisection on "fits the budget" over the levels (peaks mostly grow with the
    level), then the next :data:`SEARCH_ABOVE` plans above the one found (they do not always)."""
    lowered: dict[int, tuple] = {}

    def fitting(index: int) -> bool:
        if index not in lowered:
            sequence = program.sequence(changes[index])
            schedule = schedule_from_computes(graph, drop_redundant_computes(graph, lower(view, oc, sequence)))
            outcome = simulate(graph, schedule)
            if not outcome.valid:
                raise AssertionError(f"hierarchical: a lowered plan is invalid: {outcome.error}")
            lowered[index] = (outcome.compute_cost, outcome.peak_bytes, schedule)
        return lowered[index][1] <= budget

    if fitting(0):
        low, high = 0, len(changes) - 1
        while low < high:
            middle = (low + high + 1) // 2
            if fitting(middle):
                low = middle
            else:
                high = middle - 1
        for index in range(low + 1, min(len(changes), low + 1 + SEARCH_ABOVE)):
            fitting(index)
    return lowered


def _fits(graph, computes_positions, costs, budget: int) -> _Plan | None:
    nodes = drop_redundant_computes(graph, [costs.order[v] for v in computes_positions])
    try:
        schedule = schedule_from_computes(graph, nodes)
    except ValueError:
        return None
    outcome = simulate(graph, schedule)
    if not outcome.valid or outcome.peak_bytes > budget:
        return None
    return _Plan(outcome.compute_cost, outcome.peak_bytes, schedule, "the order-free relaxation's solution, laid out")


def _bound(graph, budget: int, found: list[_Plan], clock: Clock) -> tuple[float | None, list[_Plan], str]:
    """The order-free relaxation's bound (seconds; ``None`` when none came in time), the schedules
    laid out from its solutions within the budget, and a note naming the bound.

    Its LP first (the bound, even where the MILP's root does not end); then, on models small enough
    for MIP starts, the window search of solvers/orderfree/windows.py from the cheapest schedule in
    hand (:data:`WINDOWS_SHARE` of the time); then the MILP started from the cheapest schedule so
    far (its dual bound, and its incumbent laid out); then the window search again with what is
    left. The windows' restricted solves bound nothing: only the LP's and the MILP's bounds count."""
    from .orderfree import OrderFreeModel, choose_milestones
    from .orderfree.method import START_MAX_COLUMNS, schedule_point, start_from
    from .orderfree.model import Relaxation

    costs = node_costs(graph)
    seconds = Clock(clock.share(BOUND_SHARE))
    laid: list[_Plan] = []
    try:
        model = OrderFreeModel(costs, budget, choose_milestones(costs)).build(seconds)
        small = len(model.integrality) <= START_MAX_COLUMNS  # as orderfree: no start on large models
        # On large models the LP first: a bound even where the MILP's root does not end in time. On
        # small ones the MILP's own root gives it (the LP alone took 8 s of a 60 s call on the
        # 163-node GPT-2 graph at a load average of 8); the LP runs after it only where it gave none.
        lp = Relaxation(None) if small else model.solve(seconds.share(LP_SHARE), integral=False)
        if lp.infeasible:
            return math.inf, [], "the order-free relaxation is infeasible"

        def cheapest() -> _Plan | None:
            return min(found + laid, key=lambda p: (p.cost, p.peak), default=None)

        log.debug("hierarchical: LP %s after %.1f s", lp.bound, clock.elapsed())
        if small and cheapest() is not None:
            laid += _windows(graph, model, cheapest(), costs, budget, Clock(seconds.share(WINDOWS_SHARE)),
                             schedule_point)
            log.debug("hierarchical: windows %s after %.1f s", cheapest().cost, clock.elapsed())
            # A fresh model for the MILP: a window solve cancelled at its time limit can leave the
            # HiGHS instance stopping the next run at once (measured: the MILP then returned in
            # 1.7 s of its 26 s with no dual bound).
            model = OrderFreeModel(costs, budget, model.marks).build(seconds)
        if small and cheapest() is not None:
            start_from(model, [(kind, costs.index[v]) for kind, v in cheapest().schedule])
        first = model.solve(seconds.share(FIRST_SOLVE_SHARE))
        log.debug("hierarchical: MILP bound %s objective %s after %.1f s", first.bound, first.objective, clock.elapsed())
    except (SolverTimeout, SolverUnavailable) as error:
        return None, laid, str(error)
    if first.infeasible:
        return math.inf, [], "the order-free relaxation is infeasible"
    if first.bound is None and lp.bound is None and not seconds.expired():
        try:
            lp = model.solve(seconds.left(), integral=False)
        except (SolverTimeout, SolverUnavailable):
            pass
    bounds = [b for b in (lp.bound, first.bound) if b is not None and math.isfinite(b)]
    for computes in first.layouts:
        plan = _fits(graph, computes, costs, budget)
        if plan is not None:
            laid.append(plan)
    if small and cheapest() is not None and not seconds.expired():
        laid += _windows(graph, model, cheapest(), costs, budget, seconds, schedule_point)
        log.debug("hierarchical: windows %s after %.1f s", cheapest().cost, clock.elapsed())
    note = f"the order-free relaxation's bound ({len(model.marks)} milestones)"
    return (max(bounds) if bounds else None), laid, note


def _windows(graph, model, start: _Plan, costs, budget: int, clock: Clock, schedule_point) -> list[_Plan]:
    """Passes of the window search (solvers/orderfree/windows.py) from ``start``'s point in the
    model, while a pass finds a cheaper laid-out schedule and ``clock`` has time."""
    from .orderfree.model import Relaxation
    from .orderfree.windows import improve_by_windows

    point = schedule_point(model, [(kind, costs.index[v]) for kind, v in start.schedule])
    if point is None:
        return []
    values = np.zeros(len(model.integrality))
    for column, value in point.items():
        values[column] = value
    objective = float(np.dot(model.highs.getLp().col_cost_, values))
    incumbent = Relaxation(None, values=list(values), objective=objective)
    found: list[_Plan] = []
    while not clock.expired():
        improved = improve_by_windows(model, incumbent, clock, lambda r: _fits_any(graph, r, costs, budget))
        if not improved:
            break
        found += improved
        best = min(improved, key=lambda p: (p.cost, p.peak))
        point = schedule_point(model, [(kind, costs.index[v]) for kind, v in best.schedule])
        if point is None:
            break
        values = np.zeros(len(model.integrality))
        for column, value in point.items():
            values[column] = value
        incumbent = Relaxation(None, values=list(values), objective=float(np.dot(model.highs.getLp().col_cost_, values)))
    return found


def _fits_any(graph, result, costs, budget: int) -> _Plan | None:
    plans = [p for p in (_fits(graph, c, costs, budget) for c in result.layouts) if p is not None]
    if not plans:
        return None
    best = min(plans, key=lambda p: (p.cost, p.peak))
    return _Plan(best.cost, best.peak, best.schedule, "the window search's solution, laid out")


def solve_hierarchical(graph, budget: int, time_limit: float | None = None, bound: bool = True,
                       starts: list | None = None) -> Schedule:
    """The ``hierarchical`` method (module docstring). ``bound=False`` skips the order-free
    relaxation (the plan alone, status ``feasible`` against the bound of computing everything
    once). ``starts``: other schedules of ``graph`` (``auto`` passes dp's and chen-greedy's) that
    the relaxation may start from and that are returned when cheapest; without them dp's own
    schedule is computed where dp is quick. Raises :class:`Infeasible` (``min_budget``: the least lowered peak of the plans
    and store-all's, which this method then meets) when no plan fits."""
    clock = Clock(time_limit_or_default(time_limit))
    store_all = store_all_schedule(graph)
    outcome = simulate(graph, store_all)
    once = outcome.compute_cost
    if outcome.peak_bytes <= budget:
        return store_all.with_info(method=METHOD, status=OPTIMAL, gap=0.0, lower_bound=once,
                                   message="hierarchical: store-all fits the budget")
    started = time.perf_counter()
    plan, least, _ = _plans(graph, budget, clock)
    planning = time.perf_counter() - started
    found = [plan] if plan is not None else []
    for other in starts or []:
        given = simulate(graph, other)
        if given.valid and given.peak_bytes <= budget:
            name = other.info.method or "a given"
            found.append(_Plan(given.compute_cost, given.peak_bytes, Schedule(other.steps), f"{name}'s schedule"))
    if not found:
        least = outcome.peak_bytes if least is None else min(least, outcome.peak_bytes)
        raise Infeasible(f"hierarchical: no block plan fits {budget} bytes; the least peak of its plans is "
                         f"{least} bytes", min_budget=least, method=METHOD)
    value, note = None, "computing every node once"
    if bound and starts is None and not clock.expired():
        quick = all(view.length <= QUICK_DP_STAGES for view in chain_views(graph))
        dp = schedule_from(graph, budget, "dp", clock.share(0.2)) if quick else None
        if dp is not None:
            found.append(_Plan(dp.info.compute_cost, dp.info.predicted_peak_bytes, dp, "dp's schedule"))
    if bound and not clock.expired():
        value, laid, note = _bound(graph, budget, found, clock)
        found += laid
        if value is not None and math.isinf(value):
            raise AssertionError("hierarchical: the order-free relaxation says no schedule fits, yet one does")
    best = min(found, key=lambda p: (p.cost, p.peak))
    lower = once if value is None else max(once, value)
    lower = min(lower, best.cost)
    gap = 0.0 if best.cost <= 0 else (best.cost - lower) / best.cost
    status = OPTIMAL if gap <= OPTIMALITY_TOLERANCE else FEASIBLE
    if status == OPTIMAL:
        lower, gap = best.cost, 0.0
    words = (f"{best.source} (planned in {planning:.1f} s); " +
             (f"proven optimal by {note}" if status == OPTIMAL else f"within {gap:.2%} of {note}"))
    return best.schedule.with_info(method=METHOD, status=status, gap=gap, lower_bound=lower, budget_bytes=budget,
                                   compute_cost=best.cost, predicted_peak_bytes=best.peak, message=words)
