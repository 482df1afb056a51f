"""The native problem as a MILP in HiGHS, its memory rows added as the incumbents break them.

Columns: ``x_c`` (binary, choice ``c`` of the menu taken) and the shared results' ``z`` (continuous in
[0, 1], solvers/native/peak_rows.py). Rows: at most one choice of each clique of overlapping choices;
the ``z`` rows; and a memory row per axis event, ``memory(e) <= budget`` (for a twin's event, only
when its choice is taken: a big-M on its ``x``). The rows of all events are exact but many (one per
op of the step, and per twin of every choice), and few of them bind, so they are added lazily: solve,
compute the incumbent's memory at every event (the same rows, evaluated), add the rows of the events
over the budget, solve again; an incumbent within every row is optimal among all plans, since every
row added holds for every plan (the rows solved are a relaxation of the exact problem).

Objective: seconds of recomputation, divided by the un-checkpointed step's seconds (HiGHS's
tolerances are then fractions of a step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import SolverUnavailable
from .peak_rows import PeakRows


@dataclass
class Outcome:
    """One MILP run: ``taken`` (choice indices) of its incumbent or None; ``proven``: optimal for the
    rows it had; ``bound``: its dual bound in seconds (None when it has none)."""

    taken: set[int] | None
    proven: bool
    infeasible: bool = False
    bound: float | None = None


@dataclass
class RegionMilp:
    """The HiGHS model of :class:`PeakRows` at ``budget`` bytes, rows added as :meth:`add_event` asks."""

    rows: PeakRows
    budget: int
    highs: object = field(repr=False, default=None)
    z_columns: list[list[int]] = field(default_factory=list)  # shared result -> breakpoint -> column
    events_added: set[int] = field(default_factory=set)

    def __post_init__(self):
        try:
            import highspy
        except ImportError as error:
            raise SolverUnavailable(f"the exact native method needs highspy (pip install highspy; {error})") from error
        highs = highspy.Highs()
        highs.setOptionValue("output_flag", False)
        highs.setOptionValue("mip_rel_gap", 0.0)
        highs.setOptionValue("mip_abs_gap", 1e-9)
        rows = self.rows
        choices = len(rows.menu.choices)
        scale = rows.base_cost if rows.base_cost > 0 else 1.0
        self._scale = scale
        shared_columns = sum(len(s.breaks) for s in rows.shared)
        objective = np.concatenate([rows.cost / scale, np.zeros(shared_columns)])
        lower = np.zeros(choices + shared_columns)
        upper = np.ones(choices + shared_columns)
        highs.addCols(len(objective), objective, lower, upper, 0, np.zeros(0, dtype=np.int32),
                      np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float64))
        integrality = np.array([1] * choices + [0] * shared_columns, dtype=np.uint8)
        highs.changeColsIntegrality(len(objective), np.arange(len(objective), dtype=np.int32), integrality)
        self.highs = highs
        column = choices
        for result in rows.shared:
            self.z_columns.append(list(range(column, column + len(result.breaks))))
            column += len(result.breaks)
        infinity = highspy.kHighsInf
        for clique in rows.menu.cliques:
            self._add_row({c: 1.0 for c in clique}, -infinity, 1.0)
        for index, result in enumerate(rows.shared):
            columns = self.z_columns[index]
            for j, needs in enumerate(result.needs):
                if j + 1 < len(columns):  # held at a later event: held at this one
                    self._add_row({columns[j]: 1.0, columns[j + 1]: -1.0}, 0.0, infinity)
                for kind, what in needs:
                    if kind == "added":
                        self._add_row({columns[j]: 1.0, what: -1.0}, 0.0, infinity)
                    else:  # read unless one of ``what`` (a clique: at most one is taken) removes the reader
                        self._add_row({columns[j]: 1.0, **{c: 1.0 for c in what}}, 1.0, infinity)

    def _add_row(self, terms: dict[int, float], lower: float, upper: float) -> None:
        indices = np.array(list(terms), dtype=np.int32)
        values = np.array(list(terms.values()), dtype=np.float64)
        self.highs.addRow(float(lower), float(upper), len(indices), indices, values)

    def add_event(self, event: int) -> None:
        """The memory row of axis event ``event``: its memory within the budget (a twin's event: when
        its choice is taken)."""
        if event in self.events_added:
            return
        self.events_added.add(event)
        import highspy

        owner = int(self.rows.owner[event])
        twin = self.rows.twin_row(event) if owner >= 0 else None
        if twin is not None:
            constant, per_choice, shared_terms, on_owner = twin
        else:
            (constant, per_choice, shared_terms), on_owner = self.rows.row(event), 0
        terms: dict[int, float] = {int(c): float(per_choice[c]) for c in np.flatnonzero(per_choice)}
        for index, j, amount in shared_terms:
            column = self.z_columns[index][j]
            terms[column] = terms.get(column, 0.0) + float(amount)
        limit = float(self.budget - constant)
        if twin is not None:
            terms[owner] = terms.get(owner, 0.0) + float(on_owner)
        elif owner >= 0:
            # Big-M: the event exists when its choice is taken; with it not taken the row must hold
            # whatever the rest.
            most = sum(a for c, a in terms.items() if a > 0 and c != owner) - limit
            if most <= 0:
                return
            terms[owner] = terms.get(owner, 0.0) + most
            limit += most
        # In units of the budget: HiGHS's tolerances and scaling then see coefficients near 1.
        unit = float(max(self.budget, 1))
        self._add_row({c: a / unit for c, a in terms.items() if a}, -highspy.kHighsInf, limit / unit)

    def exclude(self, taken: set[int]) -> None:
        """A no-good cut: the next incumbent differs from ``taken`` in some choice."""
        import highspy

        choices = len(self.rows.menu.choices)
        terms = {c: (-1.0 if c in taken else 1.0) for c in range(choices)}
        self._add_row(terms, 1.0 - len(taken), highspy.kHighsInf)

    def start(self, taken: set[int]) -> None:
        """A MIP start: the plan ``taken`` (its ``z`` at their least values)."""
        rows = self.rows
        values = np.zeros(len(rows.menu.choices) + sum(len(c) for c in self.z_columns))
        values[list(taken)] = 1.0
        for index, result in enumerate(rows.shared):
            last = result.alive_until(taken)
            for j, position in enumerate(result.breaks):
                values[self.z_columns[index][j]] = 1.0 if position <= last else 0.0
        self.highs.setSolution(len(values), np.arange(len(values), dtype=np.int32), values)

    def solve(self, seconds: float | None) -> Outcome:
        """Run HiGHS within ``seconds`` (None: no limit)."""
        import highspy

        from ..ilp.backends import run_interruptibly

        highs = self.highs
        highs.setOptionValue("time_limit", math.inf if seconds is None else max(0.01, float(seconds)))
        run_interruptibly(highs)
        status, info = highs.getModelStatus(), highs.getInfo()
        kinds = highspy.HighsModelStatus
        if status in (kinds.kInfeasible, kinds.kUnboundedOrInfeasible):
            return Outcome(None, proven=True, infeasible=True)
        bound = info.mip_dual_bound * self._scale if math.isfinite(info.mip_dual_bound) else None
        taken = None
        if info.primal_solution_status == 2:  # kSolutionStatusFeasible
            values = np.asarray(highs.getSolution().col_value)[: len(self.rows.menu.choices)]
            taken = {int(c) for c in np.flatnonzero(values > 0.5)}
        return Outcome(taken, proven=status == kinds.kOptimal, bound=bound)
