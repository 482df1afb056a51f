"""Execute a schedule: compute and free the cost graph's nodes in the schedule's order.

The schedule is split at ``compute loss``: the steps before it run in the forward (inside the
autograd Function's ``forward``), the steps after it in the backward. What is held when the forward
ends is kept for the backward; nothing else survives. Freeing a node drops the executor's references
to its values, which releases their memory: no group ever holds a view of another group's storage
(profiler/grouping.py), so what the schedule frees is really freed.

Everything one call needs between its forward and its backward lives in the :class:`PhaseState`
that the forward returns (the held values, the call's RNG states, the version counters to check),
never on the executor: a loop may run several forwards before their backwards.

Tensors changed in place between the forward and the backward: eager autograd refuses to
differentiate through a saved tensor whose version counter moved, and so does this executor, for
every placeholder (parameter, buffer, input) and every held value (a model output the caller may
change in place is one) that its backward reads as the forward left it. Without the check the
backward would compute from the changed value and return a wrong gradient without a word.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from profiler.costgraph import LOSS
from solvers.schedule import COMPUTE, Schedule

from .programs import FIXED, Programs
from .rng import RngReplay, first_computations_in_order

# The key under which a call's RNG states travel in its held values: no cost-graph node has it.
RNG_STATES = "<rng states>"


class ScheduleError(ValueError):
    """The schedule cannot be executed on this model (it does not fit the profiled graph)."""


@dataclass
class PhaseState:
    """What the schedule holds: node id -> {value name -> tensor} (and, under ``RNG_STATES``, the
    call's :class:`CallStates`); ``versions``: the version counters, at the forward's end, of the
    tensors the backward reads as the forward left it. Versions, not the tensors: a reference here
    would keep alive what the schedule frees."""

    held: dict
    versions: list[int]  # of Executor.watched(...)'s tensors at the forward's end, in its order


def placeholder_labels(joint) -> dict[str, str]:
    """Placeholder name -> how an error message names it."""
    labels = {}
    for p in joint.placeholders:
        if p.role in ("param", "frozen"):
            labels[p.name] = f"parameter {p.key!r}"
        elif p.role == "buffer":
            labels[p.name] = f"buffer {p.key!r}"
        elif p.role == "input":
            labels[p.name] = f"input #{p.key}"
    return labels


def check_versions(entries, versions: list[int]) -> None:
    """Raise as autograd does when a tensor the backward reads was changed in place since the forward:
    ``entries`` are (what, tensor) in the order ``versions`` recorded them at the forward's end."""
    for (what, tensor), version in zip(entries, versions):
        if tensor._version != version:
            kind = f"{str(tensor.dtype).replace('torch.', '')}{list(tensor.shape)}"
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: {what} ({kind}) is at version {tensor._version}; expected version {version} instead. "
                "The planned module's backward reads it as its forward left it: do not change it in place between "
                "the forward and the backward (clone it, or change it after backward())."
            )


def held_label(node: str, value: str) -> str:
    return (f"a value the plan holds for the backward ({value} of node {node!r}: the model's output, or a view of "
            "it, if you changed that)")


class Executor:
    def __init__(self, programs: Programs, schedule: Schedule, graph, devices: list[int],
                 labels: dict[str, str] | None = None):
        self.programs = programs
        self.labels = labels or {}  # placeholder name -> how messages name it
        self.graph = graph
        steps = list(schedule)
        unknown = [node for _, node in steps if node not in programs.nodes]
        if unknown:
            raise ScheduleError(f"the schedule names nodes this model's graph does not have, e.g. {unknown[0]!r}")
        loss_steps = [i for i, step in enumerate(steps) if step == (COMPUTE, LOSS)]
        if len(loss_steps) != 1:
            raise ScheduleError("the schedule must compute the loss node exactly once")
        self.loss_position = loss_steps[0]
        self.forward_steps = steps[: self.loss_position]
        self.backward_steps = steps[self.loss_position + 1 :]
        # Placeholders the backward reads that the forward mutates (an input changed in place): the
        # backward's recomputations must read the value from before the step, as the trace did.
        read_later = {value for kind, node in self.backward_steps if kind == COMPUTE
                      for source, value in programs.nodes[node].reads if source == FIXED}
        read_later |= {value for source, value in programs.gradient_reads if source == FIXED}
        self.keep_before_mutation = {placeholder for placeholder, _, _ in programs.mutations} & read_later
        self.fixed_read_later = sorted(read_later)
        self.held_read_later = _held_read_later(programs, self.forward_steps, self.backward_steps)
        random_ops = {g: programs.nodes[g].random_ops for g in programs.random_order}
        prepass = not first_computations_in_order(steps, programs.random_order, self.loss_position)
        self.rng = RngReplay(devices, programs.random_order, random_ops, prepass)

    # -- running nodes ----------------------------------------------------------------------------
    def _compute(self, node: str, held: dict, fixed: dict) -> dict[str, torch.Tensor]:
        program = self.programs.nodes[node]
        args = [fixed[value] if source == FIXED else held[source][value] for source, value in program.reads]
        if program.run is None:  # extraction: hold references to some of the source's values
            return dict(zip(program.values, args))
        if program.random_ops:
            results = self.rng.run(held[RNG_STATES], node, program.run, *args)
        else:
            results = program.run(*args)
        return dict(zip(program.values, results))

    def _run_steps(self, steps, held: dict, fixed: dict) -> None:
        with torch.no_grad():
            for kind, node in steps:
                if kind == COMPUTE:
                    held[node] = self._compute(node, held, fixed)
                else:
                    del held[node]

    @staticmethod
    def _read(reads, held: dict, fixed: dict) -> list[torch.Tensor]:
        return [fixed[value] if source == FIXED else held[source][value] for source, value in reads]

    # -- the two phases -------------------------------------------------------------------------
    def forward(self, fixed: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], PhaseState]:
        """Run the steps before the loss. ``fixed`` maps placeholder names to parameters, buffers and
        inputs. Returns the model's output tensors and the state to hand to :meth:`backward`."""
        held: dict = {RNG_STATES: self.rng.start_step()}
        self._run_steps(self.forward_steps, held, fixed)
        with torch.no_grad():
            outputs = self.programs.outputs(*self._read(self.programs.output_reads, held, fixed))
            mutated = [held[holder][value] for _, holder, value in self.programs.mutations]
            apply_mutations(self.programs.mutations, mutated, fixed, self.keep_before_mutation)
        versions = [tensor._version for _, tensor in self._watched(held, fixed)]
        return list(outputs), PhaseState(held, versions)

    def _watched(self, held: dict, fixed: dict):
        """(what, tensor) of each tensor the backward reads as the forward left it."""
        for name in self.fixed_read_later:
            yield self.labels.get(name, f"placeholder {name!r}"), fixed[name]
        for node, value in self.held_read_later:
            yield held_label(node, value), held[node][value]

    def backward(self, state: PhaseState, tangents: list[torch.Tensor], fixed: dict,
                 keep: bool = False) -> list[torch.Tensor]:
        """Run the steps after the loss with ``tangents`` (gradients of the outputs) and return the
        parameter and input gradients in the joint graph's order. ``keep`` (``retain_graph=True``):
        leave ``state`` as it is, so that a later backward can run from it again."""
        check_versions(self._watched(state.held, fixed), state.versions)
        held = dict(state.held) if keep else state.held  # the steps below free from ``held``
        held[LOSS] = dict(zip(self.programs.nodes[LOSS].values, tangents))
        self._run_steps(self.backward_steps, held, fixed)
        with torch.no_grad():
            gradients = self.programs.gradients(*self._read(self.programs.gradient_reads, held, fixed))
            mutated = [held[holder][value] for _, holder, value in self.programs.backward_mutations]
            apply_mutations(self.programs.backward_mutations, mutated, fixed, set())
        held.clear()
        return list(gradients)


def _held_read_later(programs: Programs, forward_steps, backward_steps) -> list[tuple[str, str]]:
    """(node, value) of each value held at the loss that the backward reads before freeing it: the
    ones whose version counter the backward checks."""
    held = set()
    for kind, node in forward_steps:
        (held.add if kind == COMPUTE else held.discard)(node)
    read: dict[tuple[str, str], None] = {}
    for kind, node in backward_steps:
        if kind == COMPUTE:
            read.update(dict.fromkeys(r for r in programs.nodes[node].reads if r[0] in held))
        else:
            held.discard(node)
    final = [*programs.gradient_reads, *((holder, value) for _, holder, value in programs.backward_mutations)]
    read.update(dict.fromkeys(r for r in final if r[0] in held))
    return list(read)



def apply_mutations(mutations: list[tuple[str, str, str]], new_values: list[torch.Tensor], fixed: dict,
                    keep_before: set[str]) -> None:
    """Copy each mutated buffer's new value into it (BatchNorm statistics, once a phase ends). A
    placeholder in ``keep_before`` is read again later: ``fixed`` then keeps a copy of the old value."""
    for (placeholder, _, _), new_value in zip(mutations, new_values):
        before = fixed[placeholder].clone() if placeholder in keep_before else None
        fixed[placeholder].copy_(new_value)
        if before is not None:
            fixed[placeholder] = before
