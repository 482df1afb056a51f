"""The schedule: the one output format of every solver.

A schedule is a list of steps ``("compute", v)`` or ``("free", v)`` over a cost graph (SPEC.md,
"The schedule"). :class:`Schedule` carries the steps and what the solver knows about them: which
method made it, whether it is proven optimal, the proven gap. It serialises to JSON with node ids
as strings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Hashable, Iterable, Iterator, Sequence

COMPUTE = "compute"
FREE = "free"
STEP_KINDS = (COMPUTE, FREE)

Step = tuple[str, Hashable]


@dataclass(frozen=True)
class SolverInfo:
    """What a solver reports with its schedule.

    ``status`` is ``"optimal"`` (proven optimal for the method's model), ``"feasible"`` (a valid
    schedule, optimality not proven: see ``gap``) or ``"heuristic"`` (the method makes no optimality
    claim). ``gap`` is the relative gap between the schedule's cost and the best proven lower bound
    ``lower_bound`` (seconds), both in the solver's own model; ``None`` when not known.
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
        return self.status == "optimal"


@dataclass(frozen=True)
class Schedule(Sequence):
    """An immutable sequence of ``(kind, node)`` steps plus the solver's report.

    It behaves as the list of steps (``len``, indexing, iteration), so code that expects SPEC's
    "list of steps" can use it as one.
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

    def with_info(self, **changes) -> "Schedule":
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
    def from_dict(cls, data: dict, graph=None) -> "Schedule":
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
    def from_json(cls, text: str, graph=None) -> "Schedule":
        return cls.from_dict(json.loads(text), graph)
