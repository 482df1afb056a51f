"""A budget no plan can meet, refused at once with the least budget as a figure (traced plans).

Below what the step holds besides its activations (parameters, buffers, inputs, saved RNG states,
the loss value: planner/footprint.py), or below that plus the activations every schedule needs
(solvers/bounds.py, ``Backward.peak``), no solver can plan: an exact solver asked anyway searched
for its proven minimum until its time limit (cpsat, 274 s, then "no schedule within the time
limit", exit 4, where the budget was simply out of reach). The refusal names two figures: the
proven floor, and the least budget a fast planner reaches (``min_budget``: asking for it plans).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from solvers import Infeasible
from solvers.bounds import Backward
from solvers.graph import node_costs

from .budget import format_bytes
from .granularity import CHAIN_METHODS, STORE_ALL

# Seconds the activation floor may take: it decides a refusal, not a plan, and it runs before every
# recomputing plan of the searching solvers (a 4-layer GPT-2's graphs, 139 and 382 nodes, use all of
# it; cut short, the bound stays valid, only less tight).
FLOOR_SECONDS = 0.2
# Solvers whose own least budget comes back in about a second: the refusal quotes theirs.
QUICK_SOLVERS = (STORE_ALL, *CHAIN_METHODS)


def activation_floor(graph) -> int:
    """Bytes of activations that every schedule of ``graph`` holds at its peak, in any order
    (a lower bound: solvers/bounds.py, cut short after :data:`FLOOR_SECONDS`)."""
    return Backward(node_costs(graph), seconds=FLOOR_SECONDS).peak()


def refusal_below_floor(graph, budget_text: str, budget_bytes: int, fixed_bytes: int, unplanned_peak: int,
                        solver: str, least_for: Callable[[str], int | None], finer: Sequence = ()) -> Infeasible | None:
    """The refusal (an :class:`Infeasible`, ``min_budget`` in whole-step bytes) when ``budget_bytes``
    is below ``fixed_bytes`` plus :func:`activation_floor`, else None.

    ``least_for(method)``: the least whole-step budget ``method`` reaches on this profile (None when
    it cannot tell); asked of ``solver`` itself when it is quick (:data:`QUICK_SOLVERS`), else of
    dp and chen-greedy, so that no search runs. ``unplanned_peak`` (store-all's) is the figure when
    none answers: it always plans. ``finer``: the graphs of the finer groupings the solver also plans
    (planner/granularity.py); the floor is the least over them too (a model whose ops all sit in its
    root's forward is a few large nodes at module grouping: the floor there was above the least dp
    reached at op grouping, and budgets dp reaches were refused). ``fixed_bytes`` (``graph``'s, the coarsest) is the least held besides:
    a finer grouping has as many random nodes or more, each holding a generator state."""
    if budget_bytes >= unplanned_peak:
        return None  # store-all fits
    if budget_bytes >= fixed_bytes and solver in QUICK_SOLVERS:
        return None  # the quick solver's own refusal is as fast, and exact for it
    floor = fixed_bytes + min(activation_floor(g) for g in (graph, *finer))
    if budget_bytes >= floor:
        return None
    asked = (solver,) if solver in QUICK_SOLVERS else ("dp", "chen-greedy")
    reached = {method: least_for(method) for method in asked}
    reached = {method: least for method, least in reached.items() if least is not None}
    method, least = min(reached.items(), key=lambda item: item[1], default=(STORE_ALL, unplanned_peak))
    held = (f"the step holds {format_bytes(fixed_bytes)} ({fixed_bytes} bytes: parameters, buffers, inputs and "
            "saved RNG states) besides its activations")
    why = f"{held}, more than the budget" if budget_bytes < fixed_bytes else \
        f"{held}, and every schedule adds at least {format_bytes(floor - fixed_bytes)} of activations"
    return Infeasible(
        f"budget {budget_text} ({format_bytes(budget_bytes)}) is below the minimum any plan of this model needs: {why}, "
        f"so no budget under {format_bytes(floor)} ({floor} bytes) plans; the least budget {method} reaches is "
        f"{format_bytes(least)} ({least} bytes)" + ("" if method == solver else f" ({solver} may reach a little less)"),
        min_budget=least, method=solver)
