"""Plan a model that only fits sharded: built on the meta device, planned for per-block FSDP2 on N
ranks, in one process that never holds the model (docs/native.md, "A model that only fits sharded").

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    plan = planner.plan(model, one_ranks_batch, budget="2GB", distributed=FSDP2(world_size=4))

The profile is made without the model (profiler/meta.py): sizes from the fake trace, op times one op
at a time on random values of the traced sizes, the ops of identical blocks timed once. The native
search then runs as for any model (planner/native.py), with the wrapper's per-rank bytes
(planner/sharding.py) in the budget and the prediction. Nothing is measured: the un-checkpointed step
is never run (a ``"N%"`` budget is of its predicted per-rank peak), and the plan's step is not
measured either (``measured_peak_bytes`` is None); apply the plan on each rank to the model built for
real, then ``fully_shard`` each block and the root (planner/sharding.py's ``FSDP2``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from profiler.meta import is_meta_model, meta_profile
from runtime.hf_cache import cache_off_while_planning
from runtime.rnn import staged_for_trace
from solvers.regions import SAVE_POLICIES

from . import checkpoint_clock
from .budget import Budget
from .fsdp2_exact import exact_fsdp2_plan
from .native_plan import NativePlan
from .sharding import resolve_fsdp2


def plan_sharded(model: torch.nn.Module, example_inputs, budget: Budget, loss_fn=None, time_limit: float | None = None,
                 distributed="fsdp2", policies: Sequence[str] = tuple(SAVE_POLICIES),
                 device_memory: int | None = None) -> NativePlan:
    """The native plan of ``model`` (on the meta device) for one rank's step on ``example_inputs``
    (real tensors: one rank's batch) under per-block FSDP2 (``distributed``: ``"fsdp2"`` or an
    :class:`FSDP2`), ``budget`` per rank. The module docstring says how it is made and what is not
    measured.

    Its per-rank peak is exact (planner/fsdp2_exact.py: the search by FSDP2's upper bound, each plan
    priced by planner/fsdp2_timeline.py, the search re-asked when over)."""
    spec = resolve_fsdp2(model, distributed)
    with staged_for_trace(model), cache_off_while_planning(model):
        profile = meta_profile(model, example_inputs, loss_fn, granularity="op")
    # The checkpoint's own costs from the synthetic figures on the inputs' device: fitting them to
    # one of the model's regions would run it (planner/checkpoint_clock.py).
    op_graph = profile.regroup("op").graph
    checkpoint_clock.annotate(op_graph, checkpoint_clock.synthetic_costs(profile.device, tuple(policies)))
    return exact_fsdp2_plan(model, example_inputs, budget, profile, spec, loss_fn, time_limit, policies,
                            device_memory)


__all__ = ["is_meta_model", "plan_sharded"]
