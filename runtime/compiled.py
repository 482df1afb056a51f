"""Run a schedule as two inductor-compiled graphs: its steps before the loss, and its steps after.

Why: the eager executor (executor.py) runs every node's aten ops one by one, as the profiler timed
them, while ``torch.compile`` fuses chains of pointwise ops into generated kernels (on this
project's CPU its step is up to a quarter shorter than eager: README). Compiling
each node's program apart gains nothing (benchmarks/compiled_nodes.py): the fusions that pay cross
node boundaries, a recomputed GELU into the backward op that reads it. So each phase of the schedule is inlined into
one fx graph (a node computed twice appears twice: that is the recomputation) and handed to
inductor as AOTAutograd would hand it a partitioned forward or backward.

Memory follows the schedule. A phase graph's inputs are the values the schedule carries into the
phase and its outputs the values it carries out, so a value the schedule frees is dead in the graph
from that step on, and inductor frees a buffer after its last use, no later than the schedule
does. Inputs are passed in a list that the compiled code empties (inductor's boxed calling
convention), so the backward releases a carried activation after its last read, as the eager
executor's free does. Fusion only removes intermediate buffers; the inductor choices that moved work
across the schedule's steps are turned off (:func:`_compiled`), and tests and benchmarks measure
the peak against the prediction rather than assume it.

Random ops: a random op's first run saves the generator state before it
(``torch._prims.rng_prims.run_and_save_rng_state``); the state is carried like an activation (a
few KB on CPU) and every recomputation replays it (``run_with_rng_state``, which leaves the
generator where it was). When the schedule first computes the random ops in trace order, as every
solver's schedules do, the forward draws the same masks as the original model.

Numerics: inductor fuses and reorders floating-point arithmetic, so gradients equal the original
model's to rounding, not to the bit (the eager executor's guarantee).
"""

from __future__ import annotations

import operator
import sys
import time
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

from profiler.costgraph import LOSS
from profiler.grouping import is_random
from solvers.schedule import COMPUTE

from .executor import Executor, apply_mutations, check_versions, held_label, placeholder_labels
from .programs import FIXED, Programs

Value = tuple[str, str]  # (cost-graph node holding it, value name); node FIXED for placeholders


@dataclass
class CarriedState:
    """What the compiled forward hands to the compiled backward: the values it carries, in order, and
    the version counters at the forward's end of the tensors the backward reads (the fixed ones it
    reads, then the carried ones: CompiledExecutor._watched)."""

    carried: list[torch.Tensor]
    versions: list[int]


@dataclass
class PhaseGraph:
    """One phase as a graph: ``module(*inputs)`` returns the values named by ``outputs``."""

    module: fx.GraphModule
    inputs: list[Value]
    outputs: list[Value]


class _PhaseBuilder:
    """Inlines node programs into one graph in the schedule's order."""

    def __init__(self, programs: Programs, source: dict[str, fx.Node], fixed_names: list[str],
                 carried_in: list[Value], saved_rng: set[str]):
        self.programs = programs
        self.source = source  # the joint graph's nodes by name, for the inputs' metadata
        self.graph = fx.Graph()
        self.root = torch.nn.Module()
        self.env: dict[Value, fx.Node] = {}
        self.held: dict[str, list[str]] = {}
        self.inputs: list[Value] = []
        self.saved_rng = saved_rng  # random ops whose generator state a phase has saved
        self.new_states: list[Value] = []  # generator states first saved in this phase
        for name in fixed_names:
            self._input((FIXED, name), name)
        for holder, value in carried_in:
            self._input((holder, value), value)
            self.held.setdefault(holder, []).append(value)

    def _input(self, key: Value, meta_from: str) -> None:
        node = self.graph.placeholder(f"in{len(self.inputs)}")
        node.meta = dict(self.source[meta_from].meta) if meta_from in self.source else {}
        self.env[key] = node
        self.inputs.append(key)

    def read(self, key: Value) -> fx.Node:
        return self.env[key]

    def run(self, steps) -> None:
        for kind, node in steps:
            if kind == COMPUTE:
                self.compute(node)
            else:
                for value in self.held.pop(node):
                    del self.env[(node, value)]

    def compute(self, node_id: str) -> None:
        program = self.programs.nodes[node_id]
        args = [self.read((source, value)) for source, value in program.reads]
        results = args if program.run is None else self.inline(node_id, program.run, args)
        for value, result in zip(program.values, results):
            self.env[(node_id, value)] = result
        self.held[node_id] = list(program.values)

    def inline(self, node_id: str, module: fx.GraphModule, args: list[fx.Node]) -> list[fx.Node]:
        env: dict[fx.Node, fx.Node] = {}
        placeholders = iter(args)
        for node in module.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(placeholders)
            elif node.op == "output":
                return list(fx.node.map_arg(node.args[0], lambda n: env[n]))
            elif node.op == "get_attr":
                name = f"_constant{len(self.root._buffers)}"
                self.root.register_buffer(name, getattr(module, node.target))
                env[node] = self.graph.get_attr(name)
                env[node].meta = dict(node.meta)
            elif node.op == "call_function" and is_random(node):
                env[node] = self._random(f"{node_id}/{node.name}", node, env)
            else:
                env[node] = self.graph.node_copy(node, lambda n: env[n])
        raise AssertionError("a node program without output")

    def _random(self, key: str, node: fx.Node, env: dict) -> fx.Node:
        """``node`` run from a saved generator state: saved on its first run, replayed after."""
        args = fx.node.map_arg(node.args, lambda n: env[n])
        kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
        state_key = (FIXED, f"rng:{key}")  # states live for the whole step: no node's, never freed
        if key not in self.saved_rng:
            both = self.graph.call_function(run_and_save_rng_state, (node.target, *args), kwargs)
            self.env[state_key] = self.graph.call_function(operator.getitem, (both, 0))
            self.saved_rng.add(key)
            self.new_states.append(state_key)
            return self.graph.call_function(operator.getitem, (both, 1))
        return self.graph.call_function(run_with_rng_state, (self.read(state_key), node.target, *args), kwargs)

    def finish(self, outputs: list[fx.Node], output_keys: list[Value]) -> PhaseGraph:
        self.graph.output(tuple(outputs))
        return PhaseGraph(fx.GraphModule(self.root, self.graph), self.inputs, output_keys)


def phase_graphs(programs: Programs, executor: Executor, source: dict[str, fx.Node],
                 fixed_names: list[str]) -> tuple[PhaseGraph, PhaseGraph]:
    """The schedule's forward and backward phases as graphs.

    Forward: fixed values -> model outputs, forward mutations, then the values held at the loss that
    the backward reads (the carried values, generator states included). Backward: fixed values,
    carried values and the loss's tangents -> parameter and input gradients, then backward mutations.
    """
    saved_rng: set[str] = set()
    forward = _PhaseBuilder(programs, source, fixed_names, [], saved_rng)
    forward.run(executor.forward_steps)
    held_at_loss = [(holder, value) for holder, values in forward.held.items() for value in values]
    held_at_loss += forward.new_states

    tangents = [(LOSS, value) for value in programs.nodes[LOSS].values]
    backward = _PhaseBuilder(programs, source, fixed_names, held_at_loss + tangents, saved_rng)
    backward.held.pop(FIXED, None)  # the generator states are no schedule node's to free
    backward.run(executor.backward_steps)
    gradients = backward.inline("<gradients>", programs.gradients,
                                [backward.read(key) for key in programs.gradient_reads])
    mutated = [backward.read((holder, value)) for _, holder, value in programs.backward_mutations]
    backward_graph = backward.finish(
        [*gradients, *mutated],
        [("<gradient>", str(i)) for i in range(len(gradients))]
        + [("<mutation>", p) for p, _, _ in programs.backward_mutations],
    )
    # A value held at the loss that the backward never reads (the schedule frees it as the backward
    # begins) is not carried: the compiled code would hold an unused input until it returns.
    carried = set(held_at_loss)
    for key, node in zip(list(backward_graph.inputs), list(backward_graph.module.graph.nodes)):
        if key in carried and not node.users:
            backward_graph.module.graph.erase_node(node)
            backward_graph.inputs.remove(key)
            carried.discard(key)
    backward_graph.module.recompile()

    model_outputs = forward.inline("<outputs>", programs.outputs,
                                   [forward.read(key) for key in programs.output_reads])
    mutated = [forward.read((holder, value)) for _, holder, value in programs.mutations]
    carried_in_order = [key for key in held_at_loss if key in carried]
    forward_graph = forward.finish(
        [*model_outputs, *mutated, *(forward.read(key) for key in carried_in_order)],
        [("<output>", str(i)) for i in range(len(model_outputs))]
        + [("<mutation>", p) for p, _, _ in programs.mutations] + carried_in_order,
    )
    return forward_graph, backward_graph


def _fake_inputs(phase: PhaseGraph, fake_mode, known: dict[Value, torch.Tensor]) -> list[torch.Tensor]:
    """Fake tensors standing for the phase's inputs: from ``known`` (the forward's outputs) or
    from the traced joint graph's metadata."""
    result = []
    for key, node in zip(phase.inputs, (n for n in phase.module.graph.nodes if n.op == "placeholder")):
        value = known.get(key, node.meta.get("val"))
        if not isinstance(value, torch.Tensor):
            raise AssertionError(f"no example value for the phase input {key}")
        result.append(value if getattr(value, "fake_mode", None) is fake_mode else fake_mode.from_tensor(value))
    return result


def _decomposed(module: fx.GraphModule, fake_inputs: list[torch.Tensor], fake_mode) -> fx.GraphModule:
    """``module`` retraced into the ops inductor lowers (its decomposition table), as AOTAutograd
    retraces a graph before inductor sees it."""
    import torch._inductor.lowering  # noqa: F401  (some decompositions, max-pooling's, call into it)
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    with fake_mode:
        return make_fx(module, decomposition_table=select_decomp_table())(*fake_inputs)


def _compiled(module: fx.GraphModule, fake_inputs: list[torch.Tensor], fake_mode, is_backward: bool):
    """Inductor's code for ``module``: called with a list of tensors, which it empties.

    Three of inductor's choices are turned off because they break the schedule's memory:

    - horizontal fusion: inductor fuses kernels with no producer-consumer edge between them when
      they read the same data, which moves one of them across the schedule's steps. On the
      residual-MLP benchmark it ran the recomputations of three later blocks at the start of the
      backward, holding their 4 MiB activations at once: measured 306.5 MiB against 291.6 MiB
      predicted; without it 290.5 MiB (and the step 0.80 s instead of 1.00 s). Producer-consumer
      fusion, where the gain is, stays on.
    - layout optimization: in a graph with convolutions inductor converts activations to
      channels-last, and the U-Net benchmark's compiled plan then held both layouts: measured
      238.4 MiB against 147.9 MiB predicted; without it 145.9 MiB.
    - reordering for peak memory: inductor reorders a graph by its own estimate of the peak, which
      does not see what a custom op allocates; on the BERT benchmark it moved ten recomputations
      ahead of the loss's backward: measured 385.0 MiB against 332.8 MiB predicted; in the
      schedule's order 329.7 MiB.
    """
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx_inner

    with fake_mode, config.patch(score_fusion_memory_threshold=sys.maxsize, layout_optimization=False,
                                 reorder_for_peak_memory=False):
        return compile_fx_inner(module, fake_inputs, is_backward=is_backward)


class CompiledExecutor:
    """The :class:`Executor` interface (``forward``, ``backward``) with each phase of the schedule
    run as one inductor-compiled graph. Compiles when constructed (``compile_seconds``)."""

    def __init__(self, executor: Executor, joint):
        from torch._guards import detect_fake_mode
        from torch._subclasses.fake_tensor import FakeTensorMode

        started = time.perf_counter()
        self.programs = executor.programs
        self.keep_before_mutation = executor.keep_before_mutation
        self.fixed_names = [p.name for p in joint.placeholders if p.role != "tangent"]
        source = {n.name: n for n in joint.graph_module.graph.nodes}
        forward, backward = phase_graphs(self.programs, executor, source, self.fixed_names)
        placeholder_values = [n.meta.get("val") for n in joint.graph_module.graph.nodes if n.op == "placeholder"]
        fake_mode = detect_fake_mode(placeholder_values) or FakeTensorMode(allow_non_fake_inputs=True)

        forward_inputs = _fake_inputs(forward, fake_mode, {})
        forward_module = _decomposed(forward.module, forward_inputs, fake_mode)
        output_node = next(n for n in forward_module.graph.nodes if n.op == "output")
        forward_values = {key: node.meta["val"] for key, node in zip(forward.outputs, output_node.args[0])}
        backward_inputs = _fake_inputs(backward, fake_mode, forward_values)
        backward_module = _decomposed(backward.module, backward_inputs, fake_mode)

        self.forward_layouts = [(tuple(v.shape), tuple(v.stride())) for v in forward_inputs]
        self.backward_layouts = [(tuple(v.shape), tuple(v.stride())) for v in backward_inputs]
        self._forward = _compiled(forward_module, forward_inputs, fake_mode, is_backward=False)
        self._backward = _compiled(backward_module, backward_inputs, fake_mode, is_backward=True)
        # Placeholders the compiled backward reads: their version counters are checked before it runs.
        backward_placeholders = [n for n in backward.module.graph.nodes if n.op == "placeholder"]
        read = {key[1] for key, node in zip(backward.inputs, backward_placeholders) if key[0] == FIXED and node.users}
        labels = placeholder_labels(joint)
        self.fixed_read_later = [(labels.get(name, f"placeholder {name!r}"), name) for name in self.fixed_names
                                 if name in read]
        tangent_count = len(self.programs.nodes[LOSS].values)
        # The backward's inputs: the fixed values, the carried ones (the forward's last outputs, in
        # the same order, generator states included), the tangents.
        self.carried_keys = backward.inputs[len(self.fixed_names) : len(backward.inputs) - tangent_count]
        self.output_count = sum(1 for holder, _ in forward.outputs if holder == "<output>")
        self.mutation_count = len(self.programs.mutations)
        self.compile_seconds = time.perf_counter() - started

    def forward(self, fixed: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], CarriedState]:
        with torch.no_grad():
            results = list(self._forward(_in_layouts([fixed[name] for name in self.fixed_names],
                                                     self.forward_layouts)))
        outputs = results[: self.output_count]
        mutated = results[self.output_count : self.output_count + self.mutation_count]
        with torch.no_grad():
            apply_mutations(self.programs.mutations, mutated, fixed, self.keep_before_mutation)
        carried = results[self.output_count + self.mutation_count :]
        return outputs, CarriedState(carried, [tensor._version for _, tensor in self._watched(carried, fixed)])

    def _watched(self, carried: list[torch.Tensor], fixed: dict):
        for what, name in self.fixed_read_later:
            yield what, fixed[name]
        for (node, value), tensor in zip(self.carried_keys, carried):
            yield held_label(node, value), tensor

    def backward(self, state: CarriedState, tangents: list[torch.Tensor], fixed: dict,
                 keep: bool = False) -> list[torch.Tensor]:
        """``keep`` (``retain_graph=True``): leave ``state`` as it is for a later backward, which then
        holds the carried values until the graph is released."""
        check_versions(self._watched(state.carried, fixed), state.versions)
        if keep:
            carried = list(state.carried)
        else:
            carried, state.carried = state.carried, []  # the compiled code's list must be the only reference
        arguments = _in_layouts([fixed[name] for name in self.fixed_names] + carried + list(tangents),
                                self.backward_layouts)
        del carried
        with torch.no_grad():
            results = list(self._backward(arguments))  # empties ``arguments``: carried values die at last use
        gradient_count = len(results) - len(self.programs.backward_mutations)
        with torch.no_grad():
            apply_mutations(self.programs.backward_mutations, results[gradient_count:], fixed, set())
        return results[:gradient_count]


def _in_layouts(tensors: list[torch.Tensor], layouts: list[tuple[tuple, tuple]]) -> list[torch.Tensor]:
    """``tensors`` with the strides the code was compiled for (it asserts them): a gradient autograd
    passes in may be an expanded view (stride 0), an input may be a transposed view."""
    result = []
    for tensor, (shape, stride) in zip(tensors, layouts):
        if any(size > 1 and a != b for size, a, b in zip(shape, tensor.stride(), stride)):
            copy = torch.empty_strided(shape, stride, dtype=tensor.dtype, device=tensor.device)
            copy.copy_(tensor)
            tensor = copy
        result.append(tensor)
    return result
