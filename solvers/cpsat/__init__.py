"""``cpsat``: the optimal schedule over all computation orders, on OR-tools CP-SAT.

The formulation is Moccasin's retention intervals (Bartan et al., "Moccasin: Efficient Tensor
Rematerialization for Neural Networks", ICML 2023), written for this project's memory model
(docs/schedule.md, docs/costgraph.md) and strengthened with dominance constraints and with
combinatorial lower bounds.

The model (:func:`build_model`)
-------------------------------
Time is a sequence of compute steps ``0 .. K-1``, one computation per step. Node ``v`` gets ``C_v``
optional *instances* ``k = 0 .. C_v-1``: instance ``k`` is computed at step ``start[v,k]`` and its
result is held during the steps ``start .. stop-1`` (its *retention interval*, ``stop`` exclusive).

- *presence*: instance 0 is present (every node is computed at least once); the presence literals
  are ordered, ``present[v,k] >= present[v,k+1]``, and present instances are disjoint and in time
  order (a node is never held when it is recomputed). Instances are numbered by time: no symmetry.
- *one computation per step*: the compute intervals ``[start, start+1)`` do not overlap, and the
  ``K = sum(present)`` computations fill the steps ``0 .. K-1`` (no idle steps: one assignment per
  compute order, not one per placement of idle steps).
- *memory*: one cumulative constraint, capacity = the budget, over the retention intervals (demand
  ``mem[v]``) and the compute intervals (demand ``workspace[v]``). Memory during step ``t`` is then
  ``held + mem[v] + workspace[v]``, what ``simulate`` measures: a result read for the last time at
  ``t`` is freed after step ``t``, so it still counts during it.
- *reads*: for every edge ``u -> v`` and present instance ``j`` of ``v``, exactly one literal
  ``cover[u,i,v,j]`` holds, placing ``start[u,i] < start[v,j] < stop[u,i]``: an instance of ``u``
  is held when ``v`` is computed.
- *frees*: exactly one reader of an instance is its *last* reader, and the instance is freed right
  after it (``stop = start[last reader] + 1``); the last instance of an output is held to the end
  (``stop = K``); a non-output sink is freed at once. These are the frees of
  ``schedule_from_computes``, the least memory for a compute order; they leave the search no slack
  in ``stop`` and imply "every instance is read, but an output's last".
- objective: the total cost of the present instances (phase 2), or the capacity (phase 1).

Redundant constraints, for propagation only: an instance starts after the first instance of each
input; a node's first instance comes after its ancestors' and leaves room for its descendants';
the covering instance of ``u`` is monotone in ``v``'s instance number; the number of computations
is at most what the best known cost allows; the cost is at least the backward bound (below).

How many intervals per node
---------------------------
Among the optimal schedules take one, ``Y``, with the fewest computations, with the frees of
``schedule_from_computes`` (no more memory at any step, so still within the budget). In ``Y``

1. every instance of ``v`` is read by some computation, except possibly the last instance of an
   output: an unread instance that is not the node's only one could be dropped, which keeps the
   schedule valid, raises memory at no step and the cost not at all (costs are >= 0), and removes
   a computation;
2. a computation reads one instance of each input, so distinct instances of ``v`` are read by
   distinct computations of its successors:
   ``count(v) <= max(1, sum over successors w of count(w) + [v is an output])``; a sink, and a
   pinned node, is computed once;
3. each recomputation of ``v`` costs ``cost[v]`` on top of the un-checkpointed cost ``T``, so, with
   ``U`` the cost of any known schedule: ``count(v) <= 1 + (U - T) / cost[v]``.

``C_v = min(rule 2 over the successors' C_w, rule 3)``, in reverse topological order, gives by
induction ``count_Y(v) <= C_v`` for every ``v``: the model contains ``Y`` (it meets every
constraint above), so its optimum is the true optimum. The same holds for the minimum peak (rules
1-2, ``Y`` a minimum-peak schedule with the fewest computations).

Rule 2 grows with depth (a forward node ``d`` steps before the loss of a training graph gets about
``d``), so on large graphs some ``C_v`` are *capped* below it. A weaker argument then still bounds
the optimum: if ``Y`` does not fit the capped counts, take the last node ``v`` in topological order
with ``count_Y(v) > C_v``; its successors fit, so its cap is below its rule 2-3 value (else
``count_Y(v) <= C_v``), and ``cost(Y) >= T + C_v * cost[v]``. Hence the true optimum is at least
``min(bound of the capped model, min over capped v of T + C_v * cost[v])``, part of
``info.lower_bound``; the status is ``optimal`` when the lower bound meets the schedule's cost.
While time allows, the caps whose term is below the best cost are raised and the model solved
again, hinted with the best schedule. Where that does not close, ``info.message`` says "optimal
with up to C intervals per node" (or "searched with ...") and the status is ``feasible``.

Lower bounds (:class:`Backward`)
--------------------------------
The first moment a schedule holds all of a set ``S`` of results follows the computation of some
``x`` in ``S``, during which ``S - {x}``, ``x`` and its inputs are held, and before which
``S - {x} + inputs(x)`` was held. Unrolled over ``x``, this bounds the peak of every schedule, and
the cost of every schedule within a budget (reaching the outputs, or a node with its inputs, plus
one computation of every node outside their ancestry). Read backwards, such an unrolling *is* a
schedule, so on small graphs both bounds are usually exact: phase 1 then proves the minimum budget
as soon as it meets the peak bound, and phase 2 stops as soon as CP-SAT meets the cost bound. On
large graphs the recursion is cut off (each set then gets a trivial bound) and CP-SAT's own bound
does the work.

Phases
------
Store-all, when it fits, is optimal. Otherwise the quick methods (store-all, chen-greedy, dp) and two
heuristics of this module give hints within the budget (``hints=True``). Phase 1 (only when none
fits) minimises the peak, floored at the budget: it finds a first schedule, or proves the budget
infeasible and gives ``Infeasible.min_budget`` (proven when it meets the peak bound; the message
says when not). Phase 2 minimises the cost, restarting with smaller counts when a better schedule
shrinks them (rule 3).

Numbers
-------
Memory is divided by the gcd of all sizes (exact; coarser, rounded up, only against int64
overflow, and then only the trivial cost bound is claimed). Costs become integers: by a power of
ten when that makes every cost whole (within 1e-9), otherwise rounded *down* at a scale where the
largest objective is ~1e12; the model's bound then still bounds every schedule's true cost from
below, so ``lower_bound`` stays honest and ``gap`` covers the rounding (``optimal`` needs a
relative gap <= 1e-9).
"""

from ..bounds import Backward
from .counts import Counts, capped_lower_bound, counts_of, interval_counts, max_computations, uniform_cap
from .heuristics import Checked, checked, essential_computes, evicting_order, greedy_schedules, keeping_order
from .model import METHOD, Instance, RetentionModel, build_model
from .phases import cost_phase, min_peak_phase, solve_cpsat
from .scales import CostScale, MemoryScale, scale_costs, scale_memory
from .solving import Outcome, add_hint, place, read_computes, run_solver, solve_interruptibly

__all__ = [
    "METHOD", "Backward", "Checked", "CostScale", "Counts", "Instance", "MemoryScale", "Outcome", "RetentionModel",
    "add_hint", "build_model", "capped_lower_bound", "checked", "cost_phase", "counts_of", "essential_computes",
    "evicting_order", "greedy_schedules", "interval_counts", "keeping_order", "max_computations", "min_peak_phase",
    "place", "read_computes", "run_solver", "scale_costs", "scale_memory", "solve_cpsat", "solve_interruptibly",
    "uniform_cap",
]
