"""The schedule: the one output format of every solver.

A schedule is a list of steps ``("compute", v)`` or ``("free", v)`` over a cost graph
(docs/schedule.md). :class:`Schedule` carries the steps and what the solver knows about them: which
method made it, whether it is proven optimal, the proven gap. It serialises to JSON with node ids
as strings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any
from collections.abc import Hashable, Iterable, Iterator, Sequence

COMPUTE = "compute"
FREE = "free"
STEP_KINDS = (COMPUTE, FREE)

Step = tuple[str, Hashable]

# A solver's status (SolverInfo.status).
OPTIMAL = "optimal"  # no valid schedule within the budget is cheaper, in any order of computation
# Optimal among the schedules with the method's fixed order of first computations (ilp), not
# proven over every order: a schedule in another order may be cheaper.
OPTIMAL_IN_ORDER = "optimal-in-order"
FEASIBLE = "feasible"  # valid and within the budget; gap and lower_bound say how far from optimal
HEURISTIC = "heuristic"  # valid and within the budget; the method makes no optimality claim
STATUSES = (OPTIMAL, OPTIMAL_IN_ORDER, FEASIBLE, HEURISTIC)


@dataclass(frozen=True)
class SolverInfo:
    """What a solver reports with its schedule.

    ``status`` is one of :data:`STATUSES`: ``"optimal"`` (proven: no schedule within the budget is
    cheaper, in any order of computation), ``"optimal-in-order"`` (proven only among the schedules
    with the method's fixed order of first computations: ``ilp``), ``"feasible"`` (a valid
    schedule, optimality not proven: see ``gap``) or ``"heuristic"`` (the method makes no optimality
    claim). ``lower_bound`` (seconds) is a cost no valid schedule within the budget goes below, in
    any order (``None`` when none is known), and ``gap`` the relative gap of the schedule's cost
    above it; a bound that holds only in a method's own order is never reported here.
    ``predicted_peak_bytes`` and ``compute_cost`` are what :func:`solvers.simulate` says of the
    schedule. ``message`` says anything a user should know (what ``auto`` chose and why, a time limit
    that was hit).
    """

    method: str = ""
    status: str = "heuristic"
    gap: float | None = None
    lower_bound: float | None = None
    solve_seconds: float = 0.0
    budget_bytes: int | None = None
    predicted_peak_bytes: int | None = None
    compute_cost: float | None = None
    message: str = ""

    @property
    def optimal(self) -> bool:
        """Proven optimal over every schedule (``optimal-in-order`` is not)."""
        return self.status == OPTIMAL


@dataclass(frozen=True)
class Schedule(Sequence):
    """An immutable sequence of ``(kind, node)`` steps plus the solver's report.

    It behaves as the list of steps (``len``, indexing, iteration), so code that expects a plain
    list of steps (docs/schedule.md) can use it as one.
    """

    steps: tuple[Step, ...]
    info: SolverInfo = field(default_factory=SolverInfo)

    def __init__(self, steps: Iterable[Sequence[Any]] = (), info: SolverInfo | None = None):
        normalised = []
        for step in steps:
            # A step that is not a pair (a number, a string from a file) is a ValueError like any other bad step.
            if not isinstance(step, (tuple, list)) or len(step) != 2 or step[0] not in STEP_KINDS:
                raise ValueError(f"a schedule step is ('compute', node) or ('free', node), got {step!r}")
            normalised.append((step[0], step[1]))
        object.__setattr__(self, "steps", tuple(normalised))
        object.__setattr__(self, "info", info if info is not None else SolverInfo())

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, item):
        return self.steps[item]

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def computes(self) -> list[Hashable]:
        """The nodes computed, in order, with repeats for recomputations."""
        return [node for kind, node in self.steps if kind == COMPUTE]

    def with_info(self, **changes) -> Schedule:
        return Schedule(self.steps, replace(self.info, **changes))

    # -- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        info = self.info
        return {
            "steps": [[kind, str(node)] for kind, node in self.steps],
            "method": info.method,
            "status": info.status,
            "gap": info.gap,
            "lower_bound": info.lower_bound,
            "solve_seconds": info.solve_seconds,
            "budget_bytes": info.budget_bytes,
            "predicted_peak_bytes": info.predicted_peak_bytes,
            "compute_cost": info.compute_cost,
            "message": info.message,
        }

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict, graph=None) -> Schedule:
        """Rebuild a schedule; with ``graph``, node names are mapped back to the graph's node ids."""
        if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
            raise ValueError('a schedule is a JSON object with a "steps" list')
        steps = data["steps"]
        for step in steps:
            if not (isinstance(step, list) and len(step) == 2 and step[0] in STEP_KINDS and isinstance(step[1], str)):
                raise ValueError(f'each schedule step is ["compute" or "free", "node"], got {step!r}')
        if graph is not None:
            from .graph import node_by_name

            table = node_by_name(graph, {name for _, name in steps})
            steps = [(kind, table[name]) for kind, name in steps]
        fields = {k: data[k] for k in SolverInfo.__dataclass_fields__ if k in data and data[k] is not None}
        return cls(steps, SolverInfo(**fields))

    @classmethod
    def from_json(cls, text: str, graph=None) -> Schedule:
        return cls.from_dict(json.loads(text), graph)
