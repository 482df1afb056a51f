"""Checkpoint regions: the plans PyTorch's own activation checkpointing can run, and their peaks.

The native executor (runtime/native.py) realises a plan by wrapping chosen submodules of the
user's model in non-reentrant ``torch.utils.checkpoint``. This package is the planner's model of
what that does, on the op-level cost graph of the training step (every node one op's result, each
tagged with the ``module`` that issued it and its ``kind``: forward, loss, backward):

- **Forward.** Inside a checkpointed region autograd saves nothing: what the region's ops would
  save is dropped (a placeholder is kept instead) and only the region's inputs are held, by the
  checkpoint, until the region's backward is over. A result of the region that something *outside*
  it reads (the next module, or the backward of an op outside the region that saved it) is held as
  without checkpointing.
- **Backward.** When the backward first unpacks a tensor the region saved, the region's forward is
  run again, from its held inputs, with the random state of the first run, up to the op that
  packs the last tensor the region saved (PyTorch's early stop; early_stop.py). The recomputed
  results are new tensors: the first run's result of an op may still be held (read by someone
  outside the region) while its recomputed twin exists. Each recomputed result is released after
  the last backward op that reads it, or after the op through which the region's program holds it.

:func:`region_graph` (prediction.py) turns a set of regions into a graph with one *twin* node per recomputed op
(``"recompute:v"``) and :func:`region_schedule` into the one schedule that executes it: trace
order, the twins of a region inserted right before the first backward op that reads one of them,
every result freed after its last reader. ``solvers.simulate`` of that schedule on that graph is the
predicted peak and time. With no region it is the store-all schedule.

:func:`plan_regions` (search.py) searches the regions: the fewest recomputations whose peak fits a
budget; the exact method is solvers/native/.

One concept a module:

- policies.py: the save policies (``SAVE_POLICIES``) and the random draws a policy keeps;
- names.py: region names (modules, ``nn.Sequential`` segments, ``@policy``) and recomputation twins;
- members.py: which ops of the graph a region runs;
- candidates.py: the regions a graph offers (:func:`checkpointable`) and how they nest;
- early_stop.py: where the recomputation stops and what the program holds there;
- costs.py: one region's parts and seconds (:func:`region_costs`, :func:`checkpoint_overhead`);
- prediction.py: a set of regions' graph, schedule and simulated peak and time (:func:`evaluate`);
- region_model.py: :class:`RegionModel`, the same peak and time without building graphs;
- search.py: the heuristic search (:func:`plan_regions`).

Everything here is pure Python over networkx, like the rest of ``solvers``.
"""

from .candidates import candidate_regions, checkpointable, segmentations
from .costs import RegionCosts, checkpoint_overhead, region_costs
from .members import MUTATION, ModuleNodes
from .names import RECOMPUTE, parse_segment, segment, twin, within
from .policies import ALLOCATIONS, SAVE_POLICIES, SavePolicy, draw_chains, saved_by_policy, split_policy
from .prediction import RegionPlan, as_eager_runs, evaluate, region_computes, region_graph, region_schedule
from .region_model import RegionModel
from .search import METHOD, plan_regions

__all__ = [
    "ALLOCATIONS", "METHOD", "MUTATION", "RECOMPUTE", "SAVE_POLICIES", "ModuleNodes", "RegionCosts", "RegionModel",
    "RegionPlan", "SavePolicy", "as_eager_runs", "candidate_regions", "checkpoint_overhead", "checkpointable",
    "draw_chains", "evaluate", "parse_segment", "plan_regions", "region_computes", "region_costs", "region_graph",
    "region_schedule", "saved_by_policy", "segment", "segmentations", "split_policy", "twin", "within",
]
