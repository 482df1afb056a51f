"""``ilp``: Checkmate's MILP (Jain et al., MLSys 2020) on the whole DAG, built as sparse arrays and
solved with HiGHS (highspy), or CBC through PuLP.

Checkmate (§4 of the paper) fixes the order of *first* computations to one topological order
(here the cheapest warm start's, else :func:`solvers.graph.topological_order`; nodes renamed
``0..n-1`` in it) and splits the schedule into ``n`` stages: stage ``t`` recomputes some earlier
nodes in ascending index order and ends with the first computation of node ``t``
("frontier-advancing" stages). Its variables:

- ``R[t,i]`` (binary): node ``i`` is computed in stage ``t``; the objective is the sum of
  ``cost[i] * R[t,i]``;
- ``S[t,i]`` (binary): ``i``'s result is held when stage ``t`` begins (a checkpoint);
- ``FREE[t,i,k]`` (binary): ``i`` is freed right after ``k`` is computed in stage ``t``, for every
  edge ``i -> k`` and, so that a result nobody reads in the stage can go too, for ``k = i``;
- ``U[t,k]`` (continuous): memory held just after computing ``k`` in stage ``t``.

The constraint families (one function each in :mod:`solvers.ilp.model`): R[t,t] = 1 and the
lower-triangular structure (fixed values, not variables); dependencies ``R[t,k] <= R[t,i] +
S[t,i]``; conservation (a result present in a stage is kept into the next or freed once); frees
only after the last reader in the stage; the memory recursion and the budget. The paper's
equation numbers are not cited here: this was written from the summary of the model in
docs/algorithms.md ("Checkmate"), not from the paper's text. Where this model departs from that summary it says why:

- memory while computing ``k`` is ``held + mem[k] + workspace[k]`` (docs/costgraph.md);
- ``compute k`` while ``k`` is held is not allowed (docs/schedule.md): ``R[t,i] + S[t,i] <= 1``;
- ``pinned`` nodes are computed once and held from then on (``S`` fixed to 1, no ``FREE``, no
  ``R`` after their stage), and ``output`` nodes are held at the end (a fixed ``S[n,i] = 1``);
- the paper's product definition of ``FREE`` is written as upper bounds only (the memory budget
  is the only thing that wants frees, so the solver sets ``FREE`` to 1 wherever allowed and it
  helps), aggregated per reader, with no ``FREE`` after a stage's last computation (it changes no
  memory the model counts); ``U`` is bounded below by the recursion instead of equal to it, and
  above by the budget (implied by the budget rows; it keeps every column bounded, so that any row
  duals give a finite bound by weak duality, :func:`solvers.ilp.backends.dual_bound`, which is
  the LP bound the method uses).

The model is built as sparse arrays, stage by stage (:mod:`solvers.ilp.model`), and passed to
HiGHS in one call; docs/solvers-lp.md measures it against the PuLP model it replaced (a 1001-node
training graph built and loaded in ~8 s wall, 2 s CPU, against ~10 minutes wall, 2 minutes CPU).

The extracted schedule is the compute order read off ``R`` (stage by stage, ascending within a
stage) with the frees of :func:`solvers.liveness.schedule_from_computes`, which frees every result
at least as early as the model's ``FREE`` does; so its true peak is never above the model's. It is
checked with :func:`solvers.simulate`, in bytes, before it is returned; should the solver's
tolerances let it overshoot, the MILP is re-solved with a tighter budget.

How ``mode="exact"`` solves it: the heuristic methods (store-all, chen-greedy, dp) and the LP
relaxation's roundings (§5 of the paper) give candidate schedules; when the cheapest the model can
express meets the LP bound it is returned as proven optimal, otherwise it warm-starts the MILP
(HiGHS spends most of its time looking for a first incumbent on these models).
``mode="lp-rounding"`` stops after the roundings: for graphs too large to solve exactly.

What the model cannot do (docs/algorithms.md, "Checkmate", traps 1 and 2): other first-computation
orders, recomputing a node twice in one stage or out of index order, and computing anything after
the last node's first computation (so an output that is not a sink is held, or recomputed, while
the last node is computed). Its optimum can therefore
be above the true optimum (``exhaustive``/``cpsat``), and some budgets that other schedules meet
are infeasible here. ``Infeasible.min_budget`` is the smallest budget *this model* can meet.

Errors: :class:`~solvers.errors.Infeasible` when the model cannot meet the budget (proven by the
solver or by a counting bound), with ``min_budget`` (its message says when that minimum is not
proven, e.g. when the time ran out: it is then the least budget found that the model meets);
``TimeoutError`` when the time limit passes before any schedule within the budget is known and
infeasibility is not proven either (``Infeasible`` would claim too much); ``ValueError`` for an
unknown ``backend``/``mode``; :class:`~solvers.errors.SolverUnavailable` when the backend is
missing.
"""

from .backends import BACKENDS, Outcome, as_pulp, check_backend, load_highs, run_backend
from .candidates import WARM_START_METHODS, Candidate, warm_start_candidates
from .candidates import _candidate as _candidate  # noqa: F401 - tests check candidates with it
from .exact import MAX_NODES, MODES, solve_ilp
from .minimum import MinimumBudget, minimum_budget, model_lower_bound
from .model import BUILD_SECONDS_PER_COLUMN, CheckmateModel, Scales, build_model, estimated_columns
from .rounding import DEFAULT_ROUNDING_SAMPLES, Rounded, lp_rounding
from .values import _check_values as _check_values  # noqa: F401 - tests check warm starts with it
from .values import (compute_order, expressible, first_computation_order, least_recomputation,
                     model_values, schedule_of_order, stages_of_order)

__all__ = [
    "BACKENDS", "BUILD_SECONDS_PER_COLUMN", "DEFAULT_ROUNDING_SAMPLES", "MAX_NODES", "MODES", "WARM_START_METHODS", "Candidate",
    "CheckmateModel", "MinimumBudget", "Outcome", "Rounded", "Scales", "as_pulp", "build_model", "check_backend",
    "compute_order", "estimated_columns", "expressible", "first_computation_order", "least_recomputation", "load_highs",
    "lp_rounding", "minimum_budget", "model_lower_bound", "model_values", "run_backend", "schedule_of_order",
    "solve_ilp", "stages_of_order", "warm_start_candidates",
]
