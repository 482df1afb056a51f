"""``hierarchical``: repeated blocks found once, a menu of options per distinct block, a chain
program over blocks with several options per stage (Rockmate's generalisation of Beaumont et
al.'s program), and the order-free relaxation's bound (solvers/orderfree) to certify the result.

Blocks
------
The blocks are the stages of the graph's chain views (solvers/chain.py: the forward cut where only
one result crosses, like articulation points, each backward node with the stage whose results it
reads). Two stages are the same block when their sub-graphs (forward and backward nodes, the
edges between them, and the edges from outside labelled by what the outside node is to the stage:
its input ``x_i``, the incoming gradient, a reserved node) are isomorphic with equal bytes,
workspace, output and pinned flags, and equal module paths once layer numbers are dropped
(``transformer.h.7.attn`` and ``transformer.h.8.attn`` match) where the graph carries them.
Costs are *not* compared: profiled layers never take exactly the same time. The inner transformer
layers of a GPT-2 module graph are then one class (:func:`block_classes`).

Menus
-----
A block's options are what its forward run with grad keeps for its backward: every subset ``S``
of the forward nodes its backward reads that do not cross to a later stage anyway (those are
``x_{i+1}``, held in any case); with ``S`` kept, the backward first recomputes the others it
needs (and their ancestors in the block) from ``x_i``, ``S`` and the reserved nodes, then runs
(:class:`Option`). Up to :data:`MAX_SUBSET_NODES` candidates every subset is tried, else the
nested subsets that drop candidates cheapest to recompute per byte first. The menu (its saved
sets) is computed once per class, on its first member, and carried onto each member by the
isomorphism's node mapping; each member's options are then measured with its own costs and kept
where Pareto-optimal in (bytes kept, forward scratch, backward scratch, backward time). Option "keep everything" is what ``dp`` does, so with one option per
stage the program below is ``dp``'s (tests/test_hierarchical.py checks it equals
``solvers.dp.solve_chain`` on random chains).

The program
-----------
``C(i, l, m)`` as in solvers/dp.py (the least time to turn ``x_i`` and ``y_{l+1}`` into ``y_i``
within memory ``m``, which counts ``x_i``, ``y_{l+1}`` and the parameter gradients ``G[l+1]`` of
the stages after ``l``), with option (b) taken over the block's options ``k``:
``fw[i] + bw_k[i] + C(i+1, l, m - x[i] - xbar_k[i+1] + x[i+1])`` when
``m >= x[i] + y[l+1] + G[l+1] + xbar_k[i+1] + ftmp_k[i]`` (the forward with grad while
``y_{l+1}`` is live) and ``m >= x[i] + xbar_k[i+1] + y[i+1] + y[i] + G[i] + btmp_k[i]`` (the
backward, its recomputations included in ``btmp_k``); option (a) and the loss as in dp.py with
``y`` for the gradients. Gradients have their own sizes ``y`` (dp takes ``y_i`` as large as
``x_i``); each view is planned with those sizes and with dp's (:func:`blocks.dp_accounting`), the
cheaper lowered plan kept: with ``y = x`` and one option per stage this is dp's program exactly
(tests/test_hierarchical.py). Forwards without grad use the scratch of a run that keeps nothing,
not the larger of the two as ``dp`` does. Memory is a grid of :data:`LEVELS` levels, sizes rounded
up (a plan fits the model at the budget it was planned for). The program is solved once for every
level; the plans at the levels where the optimum changes are lowered to schedules of the full graph
and checked with :func:`solvers.simulate` (the least-memory plan, a bisection on "fits the budget",
the plans just above the one found); the cheapest within the budget wins.

The bound and what is proven
----------------------------
A schedule from the program is optimal in the chain model at best, so the method reports the
order-free relaxation's bound (solvers/orderfree, proven there: the optimum of a MILP of which
every valid schedule within the budget, in any order of computation, gives a feasible point of no
greater cost; its LP value and its solver's dual bound are therefore lower bounds on the cost of
every such schedule), never below the cost of computing every node once (a schedule computes every
node at least once; costs are >= 0). So ``lower_bound <= cost(Y)`` for every valid ``Y`` within the
budget, whatever its order: the bound does not depend on the blocks, the menus or the program,
which only produce the schedule. With most of the time left after planning (method.py's shares):
the relaxation's LP; where the block program's plan is cheaper than the other schedules in hand
(dp's, or those given as ``starts=``), the window search of solvers/orderfree/windows.py from it;
the MILP started from the cheapest schedule so far, its incumbent laid out; the window search
again. Every laid-out schedule is checked by the simulator; the windows' restricted solves give
schedules only, never bounds. The status is ``optimal`` only when the cheapest cost meets the bound
(within 1e-7); otherwise ``feasible`` with the gap. ``info.message`` says which schedule won and
names the bound.
"""

from .blocks import (MAX_SUBSET_NODES, MIN_BLOCK_NODES, REPEATED_MEMBERS, Option, OptionChain, block_classes,
                     option_chain, repeated_blocks, repeated_choices)
from .method import METHOD, solve_hierarchical
from .program import LEVELS, Program, lower, solve_program

__all__ = ["LEVELS", "MAX_SUBSET_NODES", "METHOD", "MIN_BLOCK_NODES", "Option", "OptionChain", "Program",
           "REPEATED_MEMBERS", "block_classes", "lower", "option_chain", "repeated_blocks", "repeated_choices",
           "solve_hierarchical",
           "solve_program"]
