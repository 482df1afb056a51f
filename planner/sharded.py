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
from profiler.state import rng_state_bytes
from runtime.hf_cache import cache_off_while_planning
from runtime.rnn import staged_for_trace
from solvers import Infeasible
from solvers.regions import SAVE_POLICIES, evaluate

from . import checkpoint_clock
from .bounded import check_within_device
from .budget import Budget, format_bytes
from .fsdp2_timeline import fsdp2_peak_bytes
from .native import plan_native
from .native_plan import NativePlan
from .sharding import resolve_fsdp2, wrapper_bytes


REPAIRS = 3  # re-solves after the exact per-rank peak came out over the budget
LEAST_SLACK = 1000  # the bound's least plan is searched for at its least plus this fraction of it


def plan_sharded(model: torch.nn.Module, example_inputs, budget: Budget, loss_fn=None, time_limit: float | None = None,
                 distributed="fsdp2", policies: Sequence[str] = tuple(SAVE_POLICIES),
                 device_memory: int | None = None) -> NativePlan:
    """The native plan of ``model`` (on the meta device) for one rank's step on ``example_inputs``
    (real tensors: one rank's batch) under per-block FSDP2 (``distributed``: ``"fsdp2"`` or an
    :class:`FSDP2`), ``budget`` per rank. The module docstring says how it is made and what is not
    measured.

    The search counts FSDP2 by its upper bound (planner/sharding.py ``fsdp2_bytes``); each plan it
    finds is then priced exactly (planner/fsdp2_timeline.py), and the search asked again with the
    budget moved by what the bound over-counted, or by what the exact peak is over (at most
    :data:`REPAIRS` times; a plan within the budget by the bound is within it exactly). The plan's
    figures are the exact ones: ``wrapper_bytes`` is what FSDP2 changes at the step's peak."""
    spec = resolve_fsdp2(model, distributed)
    with staged_for_trace(model), cache_off_while_planning(model):
        profile = meta_profile(model, example_inputs, loss_fn, granularity="op")
    # The checkpoint's own costs from the synthetic figures on the inputs' device: fitting them to
    # one of the model's regions would run it (planner/checkpoint_clock.py).
    op_graph = profile.regroup("op").graph
    checkpoint_clock.annotate(op_graph, checkpoint_clock.synthetic_costs(profile.device, tuple(policies)))
    held = int(op_graph.graph["fixed_bytes"]) + int(op_graph.graph.get("loss_value_bytes", 0))
    unplanned = evaluate(op_graph, ())
    unplanned_peak = fsdp2_peak_bytes(unplanned.graph, unplanned.schedule, model, spec, held)
    budget_bytes = budget.resolve(unplanned_peak)
    check_within_device(budget, budget_bytes, device_memory)
    over_counted = held + wrapper_bytes(model, spec) + unplanned.outcome.peak_bytes - unplanned_peak
    target = budget_bytes + max(over_counted, 0)
    least = None  # the exact peak of the least plan by the bound, once tried
    for _ in range(REPAIRS + 2):
        try:
            plan = plan_native(model, example_inputs, Budget(bytes=target), loss_fn=loss_fn, time_limit=time_limit,
                               profile=profile, measure=False, distributed=spec, policies=policies)
        except Infeasible as error:
            if least is not None:  # the least plan by the bound was tried already
                raise _below_least(budget, budget_bytes, None) from None
            if error.min_budget is not None:  # the bound's least plan: priced exactly below
                # A hair above: at exactly its own least the search refused a 16-layer Llama again.
                target, least = error.min_budget + error.min_budget // LEAST_SLACK, 0
            elif target > budget_bytes:  # no least named: the user's budget by the bound, whose plans fit exactly
                target = budget_bytes
            else:
                raise _below_least(budget, budget_bytes, None) from None
            continue
        exact = fsdp2_peak_bytes(plan.graph, plan.schedule, model, spec, held + _rng_bytes(plan.regions))
        if exact <= budget_bytes:
            return _with_exact_figures(plan, budget, budget_bytes, unplanned_peak, exact)
        if least == 0:  # the least plan is over the budget exactly too
            raise _below_least(budget, budget_bytes, exact)
        target -= exact - budget_bytes
    raise Infeasible(f"budget {budget} ({format_bytes(budget_bytes)} per rank): the plans the search found within "
                     "it by FSDP2's upper bound came out over it exactly; try a larger budget",
                     min_budget=None, method="regions")


def _below_least(budget: Budget, budget_bytes: int, least: int | None) -> Infeasible:
    """The refusal of a budget below the least plan's exact per-rank peak (``least``, when known)."""
    return Infeasible(f"budget {budget} ({format_bytes(budget_bytes)} per rank) is below the least that checkpointing "
                      "the model's modules reaches under FSDP2"
                      + (f": {format_bytes(least)} ({least} bytes) per rank" if least else ""),
                      min_budget=least or None, method="regions")


def _rng_bytes(regions) -> int:
    """The generator states torch.utils.checkpoint saves on CPU: one per region, one more while one
    recomputes (planner/native.py)."""
    return (len(regions) + 1) * rng_state_bytes() if regions else 0


def _with_exact_figures(plan: NativePlan, budget: Budget, budget_bytes: int, unplanned_peak: int,
                        exact: int) -> NativePlan:
    """``plan`` (solved for another byte budget) with the user's budget and the exact per-rank
    figures: FSDP2's bytes at the peak as ``wrapper_bytes``, so that the predicted peak stays the
    bytes held besides the schedule plus its simulated peak (what a loaded plan is checked by)."""
    activations = plan.predicted_peak_bytes - plan.fixed_bytes
    unwrapped = plan.fixed_bytes - plan.wrapper_bytes
    plan.wrapper_bytes = exact - unwrapped - activations
    plan.fixed_bytes = unwrapped + plan.wrapper_bytes
    plan.predicted_peak_bytes = exact
    plan.budget_bytes, plan.budget_text, plan.unplanned_peak_bytes = budget_bytes, str(budget), unplanned_peak
    plan.schedule = plan.schedule.with_info(budget_bytes=budget_bytes - plan.fixed_bytes)
    plan.unplanned_peak_predicted = True  # nothing was run: every peak is predicted
    return plan


__all__ = ["is_meta_model", "plan_sharded"]
