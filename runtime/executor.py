"""Execute a schedule: compute and free the cost graph's nodes in the schedule's order.

The schedule is split at ``compute loss``: the steps before it run in the forward (inside the
autograd Function's ``forward``), the steps after it in the backward. What is held when the forward
ends is kept for the backward; nothing else survives. Freeing a node drops the executor's references
to its values, which releases their memory: no group ever holds a view of another group's storage
(profiler/grouping.py), so what the schedule frees is really freed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from profiler.costgraph import LOSS
from solvers.schedule import COMPUTE, Schedule

from .programs import FIXED, Programs
from .rng import RngReplay, first_computations_in_order


class ScheduleError(ValueError):
    """The schedule cannot be executed on this model (it does not fit the profiled graph)."""


@dataclass
class PhaseState:
    """What the schedule holds: node id -> {value name -> tensor}."""

    held: dict[str, dict[str, torch.Tensor]]


class Executor:
    def __init__(self, programs: Programs, schedule: Schedule, graph, devices: list[int]):
        self.programs = programs
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
            results = self.rng.run(node, program.run, *args)
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
        held: dict[str, dict[str, torch.Tensor]] = {}
        self.rng.start_step()
        self._run_steps(self.forward_steps, held, fixed)
        with torch.no_grad():
            outputs = self.programs.outputs(*self._read(self.programs.output_reads, held, fixed))
            mutated = [held[holder][value] for _, holder, value in self.programs.mutations]
            apply_mutations(self.programs.mutations, mutated, fixed, self.keep_before_mutation)
        return list(outputs), PhaseState(held)

    def backward(self, state: PhaseState, tangents: list[torch.Tensor], fixed: dict) -> list[torch.Tensor]:
        """Run the steps after the loss with ``tangents`` (gradients of the outputs) and return the
        parameter and input gradients in the joint graph's order."""
        held = state.held
        held[LOSS] = dict(zip(self.programs.nodes[LOSS].values, tangents))
        self._run_steps(self.backward_steps, held, fixed)
        with torch.no_grad():
            gradients = self.programs.gradients(*self._read(self.programs.gradient_reads, held, fixed))
            mutated = [held[holder][value] for _, holder, value in self.programs.backward_mutations]
            apply_mutations(self.programs.backward_mutations, mutated, fixed, set())
        held.clear()
        return list(gradients)


def apply_mutations(mutations: list[tuple[str, str, str]], new_values: list[torch.Tensor], fixed: dict,
                    keep_before: set[str]) -> None:
    """Copy each mutated buffer's new value into it (BatchNorm statistics, once a phase ends). A
    placeholder in ``keep_before`` is read again later: ``fixed`` then keeps a copy of the old value."""
    for (placeholder, _, _), new_value in zip(mutations, new_values):
        before = fixed[placeholder].clone() if placeholder in keep_before else None
        fixed[placeholder].copy_(new_value)
        if before is not None:
            fixed[placeholder] = before
