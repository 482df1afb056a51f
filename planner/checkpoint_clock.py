"""The native planner's clock: what ``torch.utils.checkpoint`` itself costs, put on the op graph.

solvers/regions/costs.py prices a region as its recomputed ops plus :func:`solvers.regions.checkpoint_overhead`,
at the rates in ``graph.graph["checkpoint_costs"]``. This module measures those rates on the
model's device (profiler/checkpoint_cost.py) and writes them there: the synthetic figures once per
process and device (cached), then, when the planner may measure, the per-op rates fitted to one of
the model's own regions, the largest candidate holding at most half of the forward's ops (a
transformer's block, a U-Net's stage), stepped plain, checkpointed and under each save policy.
The policies are timed through the runtime's own (runtime/save_policies.py): the figures are
those of what a plan runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import networkx as nx
import torch

from profiler.checkpoint_cost import (CheckpointCosts, RegionShape, capture_region_inputs, fit_to_region,
                                      measure_checkpoint_costs, measure_cold_region_seconds, measure_region_steps)
from runtime.save_policies import SavePolicy
from solvers.regions import candidate_regions, parse_segment, region_costs

KEY = "checkpoint_costs"


def _policy_contexts(policies: Sequence[str]) -> dict[str, Callable[[], Callable]]:
    """Save-policy name -> a function making the ``context_fn`` of one checkpointed call, as
    runtime/native.py makes it."""
    made = {name: SavePolicy(name) for name in policies}
    return {name: functools.partial(lambda policy: policy.one_call().context_fn(), policy)
            for name, policy in made.items()}


@functools.lru_cache(maxsize=8)
def synthetic_costs(device: str, policies: tuple[str, ...]) -> CheckpointCosts:
    """:func:`profiler.checkpoint_cost.measure_checkpoint_costs` on ``device`` for ``policies``,
    measured once per process (~0.2 s on a CPU, and the cold per-call figure once per device)."""
    return measure_checkpoint_costs(device, _policy_contexts(policies), cold_region_seconds=cold_region_seconds(device))


@functools.lru_cache(maxsize=4)
def cold_region_seconds(device: str) -> float | None:
    """:func:`profiler.checkpoint_cost.measure_cold_region_seconds` on ``device``, once per process
    (~0.7 s on a CPU with a 32 MiB last-level cache)."""
    return measure_cold_region_seconds(device)


def model_device(model: torch.nn.Module) -> str:
    """The device of the model's first parameter (or buffer), ``"cpu"`` for a model without any."""
    for tensor in (*model.parameters(), *model.buffers()):
        return str(tensor.device)
    return "cpu"


def calibration_region(model: torch.nn.Module, graph: nx.DiGraph) -> str | None:
    """The module region the rates are fitted to: of the candidates that are called (not a
    ``ModuleList``) and hold at most half of the forward's ops, the one with the most ops."""
    forward_ops = sum(1 for _, data in graph.nodes(data=True) if data.get("kind") == "forward")
    best, most = None, 0
    for region in candidate_regions(graph):
        if parse_segment(region) is not None:
            continue
        try:
            module = model.get_submodule(region)
        except AttributeError:
            continue
        if isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            continue
        ops = len(region_costs(graph, region).nodes)
        if most < ops <= forward_ops // 2:
            best, most = region, ops
    return best


def _shape(graph: nx.DiGraph, region: str) -> RegionShape:
    costs = region_costs(graph, region)
    passed = costs.nodes.index(costs.recomputed[-1]) + 1 if costs.recomputed else 0
    forward = sum(float(graph.nodes[v]["cost"]) for v in costs.nodes)
    recomputed = costs.seconds - costs.overhead_seconds
    return RegionShape(len(costs.nodes), passed, len(costs.recomputed), recomputed / forward if forward > 0 else 0.0,
                       forward)


def measure_costs(model: torch.nn.Module, example_inputs, graph: nx.DiGraph, policies: Sequence[str],
                  fit: bool = True) -> CheckpointCosts:
    """The checkpoint's costs for ``model`` on its device: the synthetic figures, with ``fit`` their
    per-op rates fitted to :func:`calibration_region` of ``model`` (on ``example_inputs``)."""
    policies = tuple(policies)
    costs = synthetic_costs(model_device(model), policies)
    region = calibration_region(model, graph) if fit else None
    if region is None:
        return costs
    try:
        args, kwargs = capture_region_inputs(model, region, example_inputs)
        steps = measure_region_steps(model.get_submodule(region), args, kwargs, _policy_contexts(policies))
    except Exception:  # noqa: BLE001 - a region that cannot be run alone: its model is priced by the synthetic figures
        return costs
    shapes = {"checkpoint": _shape(graph, region)}
    shapes.update({f"policy:{name}": _shape(graph, f"{region}@{name}") for name in policies})
    # Stepped on one CPU thread (profiler/checkpoint_cost.py): on the profile's clock where its ops ran on one too.
    on_one_thread = costs.device.startswith("cuda") or torch.get_num_threads() == 1
    return fit_to_region(costs, steps, shapes, source=region, rescale=on_one_thread)


def annotate(graph: nx.DiGraph, costs: CheckpointCosts) -> None:
    """Put ``costs`` where solvers/regions/costs.py reads them."""
    graph.graph[KEY] = costs.as_graph_data()


def price(graph: nx.DiGraph, model: torch.nn.Module, example_inputs, policies: Sequence[str], fit: bool = True) -> None:
    """:func:`annotate` ``graph`` with :func:`measure_costs`, unless it holds figures for every one
    of ``policies`` already (measured once per profile: the planner's repairs and a sweep's budgets
    share them)."""
    known = graph.graph.get(KEY)
    if known is not None and set(policies) <= set(known["policy_op_seconds"]) and (known["source"] != "synthetic" or not fit):
        return
    annotate(graph, measure_costs(model, example_inputs, graph, policies, fit=fit))


__all__ = ["KEY", "annotate", "price", "calibration_region", "cold_region_seconds", "measure_costs", "model_device",
           "synthetic_costs"]
