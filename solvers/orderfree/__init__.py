"""``orderfree``: a lower bound over every schedule in every order, and a solver built on it.

The relaxation (a MILP, built directly with highspy's array API)
----------------------------------------------------------------
Take a chain of *milestones* ``x_1 .. x_M``, each an ancestor of the next (a longest path of the
graph, or every k-th node of it on large graphs). Every valid schedule first-computes them in that
order, at steps ``t_1 < .. < t_M`` (``x_j`` needs ``x_{j-1}`` held, so computed before). They cut
the schedule into intervals: interval 0 is the steps before ``t_1``, interval ``i`` the steps
``t_i <= s < t_{i+1}`` (interval ``M`` runs to the end). Binaries:

- ``c[i,v]``: ``v`` is computed at least once in interval ``i``;
- ``h[j,v]``: ``v`` is held while ``x_j`` is first computed (during step ``t_j``).

Rows (one function each below): ``x_j``'s inputs are held at ``t_j``; the memory at ``t_j``
(held bytes, plus ``x_j``'s result and workspace) is within the budget; a result held at ``t_j``
was computed in interval ``j-1`` or held at ``t_{j-1}``; a node computed in interval ``i`` finds
each input computed in interval ``i`` or held at ``t_i``; every node is computed at least once,
sinks and pinned nodes exactly once; a pinned node is held from its computation on; an output is
held at ``t_M`` or computed in interval ``M``; and (on models of at most
``INTERVAL_ROWS_MAX_COLUMNS`` columns) the memory inside each interval: ``z[i,u]`` (held
throughout interval ``i``) >= ``h[i,u] + h[i+1,u] - c[i,u] - 1``, a continuous ``w[i] >= 0`` at
least what a computation there adds to those (``w[i] >= own[v] c[i,v] - sum of v's inputs' bytes
z[i,u]``, ``own[v]`` its result, workspace and inputs), and ``sum mem[u] z[i,u] + w[i] <= budget``.
Fixings: ``c[i,v] = 0`` where ``v`` is
``x_{i+1}`` or one of its descendants (first computed after ``t_{i+1}``), ``h[j,v] = 0`` where
``v`` is ``x_j`` or a descendant, ``c[j, x_j] = 1``. Objective: ``sum cost[v] * c[i,v]`` (seconds).

Why its optimum bounds every schedule (the bound's validity)
-------------------------------------------------------------
Take an optimal schedule ``Y`` within the budget. Drop every computation of a sink but the last
(nobody reads the earlier ones; the cost and memory at every step do not grow): ``Y`` stays valid,
optimal and within the budget, and computes each sink once (a pinned node is computed once by the
simulator's rules). Read off ``c`` and ``h`` from ``Y`` as defined above. Each row holds:
``x_j``'s inputs are held at its computation and the memory during that step is held bytes plus
its result and workspace, at most the budget; a result held at ``t_j`` was either held at
``t_{j-1}`` and kept, or computed after ``t_{j-1}`` and before ``t_j`` (interval ``j-1``); a
computation in interval ``i`` reads inputs held at that step, each held since ``t_i`` or
computed after ``t_i``, in the same interval; a result held at ``t_i`` and ``t_{i+1}`` and
not computed between is held throughout, so at each computation in the interval the memory is at
least those bytes plus the computation's own (its inputs counted once), which ``w[i]`` (the
largest such excess, or 0) and the interval's row say; the fixings hold because a descendant is first
computed after its ancestor; an output is held at the end, so from its last computation on.
The objective counts each (interval, node) pair once, while ``Y`` pays every computation, and
costs are >= 0: the point costs at most ``cost(Y)``. So the MILP optimum, its solver's dual bound,
and the LP relaxation's value are lower bounds on the cost of every schedule within the budget, in
any order. It drops what happens between milestones (the memory of the other computations, their
order), which makes it a relaxation, not a restriction: it is exact where the memory peaks at
milestones, and weak on wide graphs whose longest path covers few nodes (there it falls to
"compute everything once").

The method
----------
Its optimum laid out interval by interval (``x_i``, then interval ``i``'s other computations in
topological order, frees at last use) is a valid schedule; it usually fits the budget. When it
overshoots by ``d`` bytes, the MILP is solved again at the budget minus ``d`` (a few times). The
re-solves are other solutions at the budget (no-good cuts), then smaller budgets; on models above
130k columns only smaller budgets, 1.25x the overshoot below (``LARGE_REPAIR``). The status is
``optimal`` only when the schedule's cost meets the bound of the true budget; otherwise
the best of the layout and the fast heuristics (dp, chen-greedy) is returned, ``feasible``, with the
bound's gap. An infeasible relaxation proves that no schedule fits the budget.
"""

from .method import solve_orderfree
from .model import (METHOD, ORDER_FREE_SECONDS, OrderFreeModel, Relaxation, choose_milestones, longest_path,
                    order_free_bound)

__all__ = ["METHOD", "ORDER_FREE_SECONDS", "OrderFreeModel", "Relaxation", "choose_milestones", "longest_path",
           "order_free_bound", "solve_orderfree"]
