"""Compile the nodes of a cost graph into code the executor can run.

Each group becomes a small ``fx.GraphModule`` holding its ops (and the alias ops it reads, which
cost nothing and are recomputed wherever they are needed): it takes the base values it reads
from other nodes and returns the values it exports. Extraction nodes and the loss run no code: they
hold references to values computed elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.fx as fx

from profiler.capture import JointGraph
from profiler.costgraph import LOSS
from profiler.grouping import GRADIENT, MODEL_OUTPUT, MUTATION, Grouping, is_random

FIXED = "<fixed>"


@dataclass
class NodeProgram:
    """How to compute one cost-graph node: ``run(*args)`` returns its ``values`` in order, where
    arg k is value ``reads[k][1]`` held by node ``reads[k][0]`` (``FIXED`` for placeholders)."""

    id: str
    reads: list[tuple[str, str]]
    values: list[str]
    run: object = None  # fx.GraphModule; None for extraction nodes and the loss
    random_ops: list = field(default_factory=list)  # (op, args with fake tensors) to replay the RNG draws


@dataclass
class Programs:
    nodes: dict[str, NodeProgram]
    random_order: list[str]  # random groups in trace order
    outputs: fx.GraphModule  # model output tensors from their bases
    output_reads: list[tuple[str, str]]
    gradients: fx.GraphModule  # parameter and input gradients from their bases
    gradient_reads: list[tuple[str, str]]
    mutations: list[tuple[str, str, str]]  # (placeholder, holder node, value) applied after the forward
    backward_mutations: list[tuple[str, str, str]]


def subgraph(joint: JointGraph, nodes: list[str], inputs: list[str], outputs: list[str]) -> fx.GraphModule:
    """A GraphModule running ``nodes`` (in the joint graph's order) on ``inputs``, returning ``outputs``."""
    source = {n.name: n for n in joint.graph_module.graph.nodes}
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    for name in inputs:
        env[name] = graph.placeholder(name)
        env[name].meta = dict(source[name].meta)
    for name in nodes:
        if name in env:
            continue
        env[name] = graph.node_copy(source[name], lambda n: env[n.name])
    graph.output(tuple(env[name] for name in outputs))
    graph.eliminate_dead_code()
    return fx.GraphModule(joint.graph_module, graph)


def _alias_closure(joint: JointGraph, grouping: Grouping, values: list[str]) -> tuple[list[str], list[str]]:
    """The alias ops needed to compute ``values`` from their bases, and those bases."""
    source = {n.name: n for n in joint.graph_module.graph.nodes}
    needed: set[str] = set()
    bases: list[str] = []
    for value in values:
        stack = [value]
        while stack:
            name = stack.pop()
            base = grouping.base_of.get(name, name)
            if name == base:
                if base not in bases:
                    bases.append(base)
                continue
            needed.add(name)
            stack.extend(a.name for a in source[name].all_input_nodes)
    order = [n.name for n in joint.graph_module.graph.nodes if n.name in needed]
    return order, bases


def _holder(graph, grouping: Grouping, base: str, value_class: str) -> tuple[str, str]:
    """Which node holds ``base`` when a value of ``value_class`` is read at the end of a phase."""
    if base in grouping.fixed:
        return FIXED, base
    owner = grouping.value_owner[base]
    extraction = f"{owner}/{value_class}"
    return (extraction if extraction in graph else owner), base


def _random_ops(joint: JointGraph, nodes: list[str]) -> list:
    source = {n.name: n for n in joint.graph_module.graph.nodes}
    ops = []
    for name in nodes:
        node = source[name]
        if node.op == "call_function" and is_random(node):
            ops.append((node.target, fx.node.map_arg(node.args, lambda n: n.meta.get("val")),
                        fx.node.map_arg(node.kwargs, lambda n: n.meta.get("val"))))
    return ops


def compile_programs(joint: JointGraph, grouping: Grouping, graph) -> Programs:
    """Code for every node of ``graph`` (the cost graph built from ``grouping``)."""
    nodes: dict[str, NodeProgram] = {}

    def source_of(base: str, phase: str) -> str:
        if base in grouping.fixed:
            return FIXED
        if base in grouping.tangents:
            return LOSS
        return grouping.source_for(base, phase)

    for group in grouping.groups:
        reads = [(source_of(b, group.phase), b) for b in group.inputs]
        program = NodeProgram(group.id, reads, list(group.exports))
        program.run = subgraph(joint, group.nodes, group.inputs, group.exports)
        program.random_ops = _random_ops(joint, group.nodes)
        nodes[group.id] = program
    for extraction in grouping.extractions:
        nodes[extraction.id] = NodeProgram(
            extraction.id, [(extraction.source, v) for v in extraction.values], list(extraction.values)
        )
    tangent_names = [p.name for p in joint.placeholders if p.role == "tangent"]
    nodes[LOSS] = NodeProgram(LOSS, [], tangent_names)

    output_values = [v for v in joint.model_outputs]
    alias_nodes, bases = _alias_closure(joint, grouping, output_values)
    outputs = subgraph(joint, alias_nodes, bases, output_values)
    output_reads = [_holder(graph, grouping, b, MODEL_OUTPUT) for b in bases]

    gradient_values = [v for _, v in joint.grad_params] + [v for _, v in joint.grad_inputs]
    alias_nodes, bases = _alias_closure(joint, grouping, gradient_values)
    gradients = subgraph(joint, alias_nodes, bases, gradient_values)
    gradient_reads = [_holder(graph, grouping, b, GRADIENT) for b in bases]

    mutations, backward_mutations = [], []
    for placeholder, value in joint.mutations:
        base = grouping.base_of[value]
        holder, _ = _holder(graph, grouping, base, MUTATION)
        entry = (placeholder, holder, value)
        (backward_mutations if graph.nodes[holder].get("output") else mutations).append(entry)
        if base != value:
            raise NotImplementedError(f"buffer mutation through a view ({value}) is not supported")
    random_order = [g.id for g in grouping.groups if nodes[g.id].random_ops]
    return Programs(nodes, random_order, outputs, output_reads, gradients, gradient_reads, mutations,
                    backward_mutations)
