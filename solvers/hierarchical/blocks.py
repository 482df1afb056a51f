"""Blocks and their menus (the package docstring says what they are): the chain view's stages in
isomorphism classes, and per class the options of what a block's forward keeps for its backward."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace

import networkx as nx

from ..chain import ChainView, _bytes, _chain_sizes, _local_peak, chain_views
from ..chainmodel import Chain
from ..graph import is_output

# Candidates (forward nodes a block's backward reads) up to which every subset is an option.
MAX_SUBSET_NODES = 8
# A class with at least this many members, of blocks of at least MIN_BLOCK_NODES nodes, makes a
# graph one "with repeated blocks" (auto).
REPEATED_MEMBERS = 3
MIN_BLOCK_NODES = 4


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


def repeated_choices(graph) -> tuple[int, int]:
    """(the most members a class of blocks of at least :data:`MIN_BLOCK_NODES` nodes has, the most
    options the menu of such a class with at least :data:`REPEATED_MEMBERS` members has), on the
    graph's first chain view. ``auto`` runs ``hierarchical`` where both are large enough: where
    every repeated block has one option the program is dp's and the time is better spent on
    orderfree's own search (gpt2-12-module3, docs/solvers.md)."""
    view = chain_views(graph)[0]
    oc, classes = option_chain(view)
    big = [c for c in classes if len(view.forward[c]) + len(view.backward[c]) >= MIN_BLOCK_NODES]
    members = max((big.count(c) for c in set(big)), default=0)
    repeated = {c for c in set(big) if big.count(c) >= REPEATED_MEMBERS}
    choices = max((len(oc.options[i]) for i, c in enumerate(classes[:view.length]) if c in repeated), default=0)
    return members, choices


# -- menus ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    """One way to run stage i: keep ``saved`` (forward nodes, besides ``x_{i+1}``) from its forward
    with grad to its backward, which first recomputes ``recompute`` (in this order). Sizes in bytes:
    ``xbar`` what the forward leaves held (``x_{i+1}`` included), ``ftmp`` the forward's scratch
    above it, ``btmp`` the backward's scratch above ``y_i`` and its parameter gradients; ``bw`` the
    backward's seconds, recomputations included."""

    saved: frozenset
    recompute: tuple
    xbar: int
    ftmp: int
    btmp: int
    bw: float


@dataclass(frozen=True)
class OptionChain:
    """A chain (solvers/chainmodel.py: its ``fw``, ``bw`` and ``gout``) whose stages each have
    several options; ``fwd_tmp`` the scratch of a forward without grad (above ``x[i+1]``); ``x``
    and ``y`` the sizes of the activations ``x_i`` and of the gradients ``y_i`` (i <= L), which
    the chain model takes equal (dp counts the larger for both: on a GPT-2 module graph a layer's
    output with its saved tensors, 5.5 MB, for a 130 kB gradient); ``btmp_loss`` the loss op's
    scratch above ``y_L`` and its outputs."""

    chain: Chain
    options: tuple  # options[i]: tuple of Option for stage i < L
    fwd_tmp: tuple
    x: tuple
    y: tuple
    btmp_loss: int


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


def _option(view: ChainView, stage: int, saved: frozenset, crossing: set, outputs: set, gout: int, y: set) -> Option:
    graph, reserved = view.graph, view.reserved
    forward, backward = view.forward[stage], view.backward[stage]
    kept = crossing | set(saved)
    xbar = _bytes(graph, kept - reserved)
    peak, _ = _local_peak(graph, forward, kept, reserved)
    recompute = _recompute(view, stage, kept | reserved)
    bpeak, _ = _local_peak(graph, recompute + tuple(backward), y | outputs, reserved)
    bw = sum(graph.nodes[v]["cost"] for v in recompute + tuple(backward))
    return Option(frozenset(saved), recompute, xbar, max(0, peak - xbar), max(0, bpeak - _bytes(graph, y) - gout), bw)


def _subsets(view: ChainView, stage: int, candidates: list) -> list[frozenset]:
    if len(candidates) <= MAX_SUBSET_NODES:
        return [frozenset(c) for r in range(len(candidates) + 1) for c in itertools.combinations(candidates, r)]
    nodes = view.graph.nodes
    # Drop first what is cheapest to recompute per byte it frees.
    order = sorted(candidates, key=lambda u: nodes[u]["cost"] / max(1, nodes[u]["mem"]))
    return [frozenset(order[k:]) for k in range(len(order) + 1)]


def _backward_sets(view: ChainView, stage: int) -> tuple[set, set]:
    """(results op ``B_stage`` leaves held to the end, ``y_stage``'s nodes), as solvers/chain.py
    counts them: outputs and gradients read further down than the next stage; those the next
    stage's backward reads."""
    graph, stage_of, reserved = view.graph, view.stage_of, view.reserved
    backward_nodes = {v for nodes in view.backward for v in nodes}
    nodes = view.backward[stage] if stage < view.length else view.forward[stage] + view.backward[stage]
    kept = {b for b in nodes if is_output(graph, b) and b not in reserved}
    kept |= {b for b in view.backward[stage] if not is_output(graph, b)
             and any(s in backward_nodes and stage_of[s] < stage - 1 for s in graph.successors(b))}
    y = {b for b in view.backward[stage] if any(s in backward_nodes and stage_of[s] == stage - 1
                                                for s in graph.successors(b))}
    return kept, y


def option_chain(view: ChainView) -> tuple[OptionChain, list[int]]:
    """The view's chain with a menu per stage, computed once per block class (:func:`block_classes`)
    and mapped onto each member; also each stage's class."""
    chain = _chain_sizes(view)
    graph, length, reserved = view.graph, view.length, view.reserved
    classes, mappings = block_classes(view)
    stage_of = view.stage_of
    crossing_next = []  # x_{i+1}'s nodes: forward results of stages <= i read at stages > i
    for i in range(length):
        crossing_next.append({u for j in range(i + 1) for u in view.forward[j] if u not in reserved
                              and any(stage_of.get(s, -1) > i for s in graph.successors(u))})
    x = [0] + [_bytes(graph, nodes) for nodes in crossing_next]
    sets = [_backward_sets(view, i) for i in range(length + 1)]
    y = [_bytes(graph, ys) for _, ys in sets]
    menus: dict[int, list[frozenset]] = {}
    options, fwd_tmp = [], []
    for i in range(length):
        peak_nograd, _ = _local_peak(graph, view.forward[i], crossing_next[i], reserved)
        fwd_tmp.append(max(0, peak_nograd - x[i + 1]))
        first = classes[i]
        if first not in menus:  # the class's menu: saved sets on its first member's nodes
            menus[first] = _subsets(view, first, _candidates(view, first, crossing_next[first]))
        mapping = mappings[i]
        outputs, ys = sets[i]
        made = [_option(view, i, frozenset(mapping[u] for u in saved), crossing_next[i], outputs, chain.gout[i], ys)
                for saved in menus[first]]
        options.append(tuple(_pareto(made)))
    outputs, ys = sets[length]
    peak, _ = _local_peak(graph, view.forward[length] + view.backward[length], ys | outputs, reserved)
    loss_tmp = max(0, peak - y[length] - chain.gout[length])
    return OptionChain(chain, tuple(options), tuple(fwd_tmp), tuple(x), tuple(y), loss_tmp), classes


def dp_accounting(oc: OptionChain) -> OptionChain:
    """``oc`` with dp's sizes: an activation and a gradient each counted as the larger of the two
    (xbar at least x_{i+1}), the scratch left as the same peak above them. The program plans on
    both: exact gradient sizes find cheaper plans on the GPT-2 module graphs (a 130 kB gradient
    counted as a 5.5 MB layer output), dp's on some of Checkmate's linear graphs, where the lowered
    plans of the exact sizes overshot and cost up to 65% more than dp's at the same budget."""
    x = tuple(max(a, b) for a, b in zip(oc.x, oc.y))
    options = []
    for i, stage in enumerate(oc.options):
        made = []
        for o in stage:
            xbar = max(o.xbar, x[i + 1])
            made.append(replace(o, xbar=xbar, ftmp=max(0, o.ftmp + o.xbar - xbar),
                                btmp=max(0, o.btmp + oc.y[i] - x[i])))
        options.append(tuple(made))
    length = len(oc.options)
    fwd_tmp = tuple(max(0, t + oc.x[i + 1] - x[i + 1]) for i, t in enumerate(oc.fwd_tmp))
    return replace(oc, options=tuple(options), fwd_tmp=fwd_tmp, x=x, y=x,
                   btmp_loss=max(0, oc.btmp_loss + oc.y[length] - x[length]))


def _pareto(options: list[Option]) -> list[Option]:
    """The options no other beats or ties on every size and the backward's time (first kept on ties)."""
    keys = [(o.xbar, o.ftmp, o.btmp, o.bw) for o in options]
    kept = []
    for a, ka in enumerate(keys):
        dominated = any(all(q <= p for q, p in zip(kb, ka)) and (kb != ka or b < a) for b, kb in enumerate(keys) if b != a)
        if not dominated:
            kept.append(options[a])
    return kept
