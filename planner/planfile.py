"""The Plan: a schedule with everything a user needs to decide on it and to apply it later.

A plan saves to JSON (never pickle: loading one runs no code) with the cost graph it was solved on,
the graph's fingerprint and the torch version, so that ``planner.apply`` can refuse a model or input
shape it was not made for.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import torch

from profiler.costgraph import fingerprint as graph_fingerprint
from profiler.inputs import TensorSpec
from solvers import Schedule, simulate
from solvers.schedule import COMPUTE

from .budget import format_bytes
from .files import write_atomic
from .planchecks import traced_figures_problem

FORMAT = "plan-checkpoints/1"


class PlanFileError(ValueError):
    """A plan file that cannot be read: not JSON, not a plan, or from an incompatible version."""


class PlanWarning(UserWarning):
    """A plan that loads but may not hold as it says: made with another torch version."""


MAX_BYTES = 2**60  # 1 EiB (planner/budget.py): a larger figure in a plan file is not a measurement
MAX_SECONDS = 1e9  # ~32 years: likewise for a time
MAX_PLAN_FILE_BYTES = 2**30  # a 10,000-node plan is a few MiB
STATUSES = ("optimal", "optimal-in-order", "feasible", "heuristic")  # solvers.schedule.STATUSES


def held_throughout(graph: nx.DiGraph) -> str:
    """What a plan's ``fixed_bytes`` are, in words: on CUDA they count cuBLAS's workspaces too
    (profiler/library_memory.py)."""
    if int(graph.graph.get("library_bytes", 0)):
        return "parameters, buffers, inputs, saved RNG states and cuBLAS's workspaces"
    return "parameters, buffers, inputs and saved RNG states"


@dataclass
class Plan:
    """A solved plan. Byte figures are of the whole training step (``fixed_bytes`` included:
    parameters, buffers, inputs and the runtime's saved RNG states, planner/footprint.py) unless
    their name says otherwise; times are seconds."""

    schedule: Schedule
    graph: nx.DiGraph
    budget_bytes: int
    budget_text: str
    fixed_bytes: int
    predicted_peak_bytes: int
    unplanned_peak_bytes: int
    predicted_seconds: float
    unplanned_seconds: float
    fingerprint: str
    granularity: str
    device: str
    torch_version: str
    tangent_outputs: tuple[int, ...]
    tangent_specs: tuple[TensorSpec, ...]
    inputs: list[str] = field(default_factory=list)
    model: str = ""
    profile_seconds: float = 0.0
    autocast: str = ""  # autocast state the step was traced under ("cpu:bfloat16"); "" for none
    # Why the planner chose this plan's executor where the caller did not (planner/executor_choice.py).
    executor_notice: str = ""
    # The order-free bound (seconds) on the same cost graph and budget, beside a native plan, or why
    # there is none (planner/unrestricted.py); absent from files written before it was recorded.
    unrestricted_seconds: float | None = None
    unrestricted_note: str = ""
    profile: Any = field(default=None, repr=False, compare=False)  # the in-memory Profile, not saved

    @property
    def predicted_overhead(self) -> float:
        """Predicted step time / un-checkpointed step time - 1."""
        return self.predicted_seconds / self.unplanned_seconds - 1.0 if self.unplanned_seconds > 0 else 0.0

    @property
    def method(self) -> str:
        return self.schedule.info.method

    @property
    def status(self) -> str:
        return self.schedule.info.status

    # -- what it does, in words ------------------------------------------------------------
    def recomputed(self) -> dict[str, int]:
        """Node -> number of extra computations, for nodes computed more than once."""
        counts = Counter(self.schedule.computes())
        return {node: count - 1 for node, count in counts.items() if count > 1}

    def kept_for_backward(self) -> list[str]:
        """Forward results held when the loss is computed: what the backward reads without recomputing."""
        held: set = set()
        for kind, node in self.schedule:
            if kind == COMPUTE and node == self.graph.graph.get("loss_node"):
                break
            if kind == COMPUTE:
                held.add(node)
            else:
                held.discard(node)
        return [n for n in self.graph.nodes if n in held and self.graph.nodes[n].get("kind") == "forward"]

    def summary(self) -> str:
        """What a user needs to decide: peak against the budget and against no checkpointing, the
        time it costs, and what is kept and what is recomputed."""
        info = self.schedule.info
        saving = 1 - self.predicted_peak_bytes / self.unplanned_peak_bytes if self.unplanned_peak_bytes else 0.0
        status = info.status if info.gap is None or info.status == "optimal" else f"{info.status}, proven gap {info.gap:.1%}"
        lines = [
            f"Model:             {self.model or '?'}; inputs {', '.join(self.inputs) or '?'}",
            f"Cost graph:        {self.graph.number_of_nodes()} nodes ({self.granularity}), profiled on {self.device}"
            + (f" in {self.profile_seconds:.1f} s" if self.profile_seconds else ""),
            f"Solver:            {info.method} ({status}) in {info.solve_seconds:.2f} s"
            + (f"; {info.message}" if info.message else ""),
            f"Budget:            {format_bytes(self.budget_bytes)} ({self.budget_text}) for the whole step; "
            f"{held_throughout(self.graph)} take {format_bytes(self.fixed_bytes)}",
            f"Predicted peak:    {format_bytes(self.predicted_peak_bytes)}, without checkpointing "
            f"{format_bytes(self.unplanned_peak_bytes)} ({saving:.1%} less)"
            if saving >= 0 else
            f"Predicted peak:    {format_bytes(self.predicted_peak_bytes)}, without checkpointing "
            f"{format_bytes(self.unplanned_peak_bytes)}",
            f"Predicted time:    {self.predicted_seconds * 1000:.1f} ms per step, {self.predicted_overhead:+.1%} "
            f"over {self.unplanned_seconds * 1000:.1f} ms without checkpointing",
        ]
        if self.autocast:
            lines.append(f"Autocast:          traced under torch.autocast ({self.autocast}); call the module under "
                         "the same autocast")
        if self.executor_notice:
            lines.insert(1, f"Executor:          traced, chosen by the planner: {self.executor_notice}")
        recomputed = self.recomputed()
        kept = self.kept_for_backward()
        kept_bytes = sum(self.graph.nodes[n]["mem"] for n in kept)
        lines.append(f"Kept for backward: {len(kept)} results, {format_bytes(kept_bytes)}")
        if recomputed:
            by_cost = sorted(recomputed, key=lambda n: -self.graph.nodes[n]["cost"] * recomputed[n])
            shown = ", ".join(f"{n}" + (f" x{recomputed[n]}" if recomputed[n] > 1 else "") for n in by_cost[:6])
            more = f" and {len(by_cost) - 6} more" if len(by_cost) > 6 else ""
            lines.append(f"Recomputed:        {len(recomputed)} nodes: {shown}{more}")
        else:
            lines.append("Recomputed:        nothing")
        return "\n".join(lines)

    # -- JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        graph = self.graph
        return {
            "format": FORMAT,
            "torch_version": self.torch_version,
            "model": self.model,
            "inputs": list(self.inputs),
            "device": self.device,
            "granularity": self.granularity,
            "fingerprint": self.fingerprint,
            "budget": {"text": self.budget_text, "bytes": self.budget_bytes},
            "fixed_bytes": self.fixed_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "unplanned_peak_bytes": self.unplanned_peak_bytes,
            "predicted_seconds": self.predicted_seconds,
            "unplanned_seconds": self.unplanned_seconds,
            "predicted_overhead": self.predicted_overhead,
            "profile_seconds": self.profile_seconds,
            "autocast": self.autocast,
            "tangent_outputs": list(self.tangent_outputs),
            "tangent_specs": [
                {"shape": list(s.shape), "dtype": str(s.dtype).replace("torch.", ""), "device": s.device}
                for s in self.tangent_specs
            ],
            "schedule": self.schedule.to_dict(),
            "graph": graph_to_dict(graph),
            **optional_fields(self),
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the plan as JSON, atomically: a reader never sees a half-written file."""
        write_atomic(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def from_dict(cls, data: dict, source: str = "plan", check_figures: bool = True) -> Plan:
        """The plan ``data`` holds (as :meth:`to_dict` writes it), checked: types and ranges, the graph
        against its fingerprint, the schedule by the simulator, and (``check_figures``: a traced
        plan's; the native and fallback plans check their own) every figure against what its
        schedule simulates to (planner/planchecks.py). Raises :class:`PlanFileError`."""
        try:
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                found = data.get("format") if isinstance(data, dict) else type(data).__name__
                raise PlanFileError(f"{source} is not a plan-checkpoints plan (format {found!r}, expected {FORMAT!r})")
            graph = graph_from_dict(data["graph"])
            schedule = Schedule.from_dict(_mapping(data["schedule"], "schedule"), graph)
            _check_info(schedule.info)
            specs = tuple(
                TensorSpec(tuple(_whole_list(s["shape"])), _dtype(s["dtype"]), _text(s["device"]), False)
                for s in (_mapping(spec, "tangent_specs[]") for spec in _list(data["tangent_specs"]))
            )
            # Strict types: a file whose values merely convert ("12" for 12, a string for a list of
            # indices) was not written by save(); refuse it rather than guess.
            plan = cls(
                schedule=schedule, graph=graph, budget_bytes=_whole(_mapping(data["budget"], "budget")["bytes"], "budget.bytes"),
                budget_text=_text(data["budget"]["text"]), fixed_bytes=_whole(data["fixed_bytes"], "fixed_bytes"),
                predicted_peak_bytes=_whole(data["predicted_peak_bytes"], "predicted_peak_bytes"),
                unplanned_peak_bytes=_whole(data["unplanned_peak_bytes"], "unplanned_peak_bytes"),
                predicted_seconds=_seconds(data["predicted_seconds"], "predicted_seconds"), unplanned_seconds=_seconds(data["unplanned_seconds"], "unplanned_seconds"),
                fingerprint=_text(data["fingerprint"]), granularity=_text(data["granularity"]), device=_text(data["device"]),
                torch_version=_text(data["torch_version"]), tangent_outputs=tuple(_whole_list(data["tangent_outputs"])),
                tangent_specs=specs, inputs=[_text(s) for s in _list(data.get("inputs", []))],
                model=_text(data.get("model", "")), profile_seconds=_seconds(data.get("profile_seconds", 0.0), "profile_seconds"),
                autocast=_text(data.get("autocast", "")),
                **optional_fields_from(data),
            )
        except PlanFileError:
            raise
        except KeyError as error:
            raise PlanFileError(f"{source} is not a valid plan: it has no {error} field (plan files are written by "
                                "plan-checkpoints; do not edit them)") from None
        except (TypeError, ValueError, AttributeError, OverflowError, RecursionError) as error:
            raise PlanFileError(f"{source} is not a valid plan: {error}") from None
        if len(plan.tangent_outputs) != len(plan.tangent_specs) or len(set(plan.tangent_outputs)) != len(plan.tangent_outputs):
            # Edited: the loss's outputs and their gradients' specs are written together, one each.
            raise PlanFileError(f"{source}: tangent_outputs {list(plan.tangent_outputs)} do not match its "
                                f"{len(plan.tangent_specs)} tangent_specs one to one (the file was edited)")
        if plan.unrestricted_seconds is not None and plan.unrestricted_seconds > plan.predicted_seconds * (1 + 1e-9):
            # A lower bound on every schedule's time, this plan's among them (planner/unrestricted.py).
            raise PlanFileError(f"{source}: its unrestricted bound ({plan.unrestricted_seconds} s) is above its own "
                                f"predicted time ({plan.predicted_seconds} s) (the file was edited)")
        if graph.graph.get("fingerprint") != graph_fingerprint(graph):
            # The runtime re-traces the model and checks the plan's fingerprint against it; a graph
            # edited by hand would let a schedule through that the real graph cannot run.
            raise PlanFileError(f"{source}: its cost graph does not match its fingerprint (the file was edited)")
        outcome = simulate(plan.graph, plan.schedule)
        if not outcome.valid:
            raise PlanFileError(f"{source}: its schedule is not valid for its own graph ({outcome.error})")
        problem = traced_figures_problem(plan, outcome) if check_figures else None
        if problem:
            raise PlanFileError(f"{source}: {problem} (the file was edited; plan again)")
        _warn_if_other_torch(plan.torch_version, source)
        return plan


def optional_fields(plan: Plan) -> dict:
    """The fields a plan file holds only where they are set (a file without them loads as before)."""
    data = {}
    if plan.executor_notice:
        data["executor_notice"] = plan.executor_notice
    if plan.unrestricted_seconds is not None or plan.unrestricted_note:
        data["unrestricted_seconds"] = plan.unrestricted_seconds
        data["unrestricted_note"] = plan.unrestricted_note
    return data


def optional_fields_from(data: dict) -> dict:
    """:func:`optional_fields` read back, their types checked; the defaults where absent."""
    bound = data.get("unrestricted_seconds")
    return {
        "executor_notice": _text(data.get("executor_notice", "")),
        "unrestricted_seconds": None if bound is None else _seconds(bound, "unrestricted_seconds"),
        "unrestricted_note": _text(data.get("unrestricted_note", "")),
    }


def profile_fields(profile, model) -> dict:
    """The :class:`Plan` fields that come from the profile a plan was solved on and the model's class
    (``model``: the model, or its class name where only a profile was given): what every kind of plan
    records about the step it was made for."""
    joint = profile.joint
    return {
        "device": profile.device,
        "torch_version": torch.__version__,
        "tangent_outputs": tuple(joint.loss.tangent_outputs),
        "tangent_specs": tuple(joint.loss.tangent_specs),
        "inputs": joint.layout.signature,
        "model": model if isinstance(model, str) else type(model).__name__,
        "profile_seconds": profile.seconds,
        "autocast": getattr(joint, "autocast", ""),
        "profile": profile,
    }


def _dtype(name: str) -> torch.dtype:
    # torch.__dict__, not getattr(torch, name): a name from a file must not reach the module's lazy
    # __getattr__, which imports submodules.
    dtype = torch.__dict__.get(name) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _text(value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _mapping(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise TypeError(f"{what} must be a JSON object, got {_kind(value)}")
    return value


def _kind(value) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _check_info(info) -> None:
    """The solver's report as save() writes it: the figures `show` prints are numbers in range."""
    for name in ("method", "message"):
        if not isinstance(getattr(info, name), str):
            raise TypeError(f"schedule.{name} must be a string, got {_kind(getattr(info, name))}")
    if info.status not in STATUSES:
        raise ValueError(f"schedule.status must be one of {', '.join(STATUSES)}, got {info.status!r}")
    _seconds(info.solve_seconds, "schedule.solve_seconds")
    if info.gap is not None:
        gap = info.gap
        if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not 0 <= gap <= 1e6:
            raise ValueError(f"schedule.gap must be a fraction >= 0 or null, got {gap!r}")
    for name in ("lower_bound", "compute_cost"):
        value = getattr(info, name)
        if value is not None:
            _seconds(value, f"schedule.{name}")
    for name in ("budget_bytes", "predicted_peak_bytes"):
        value = getattr(info, name)
        if value is not None:
            _whole(value, f"schedule.{name}")


def _list(value) -> list:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value


def _whole(value, what: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BYTES:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:24]}..."
        where = f"{what} must be" if what else "expected"
        raise ValueError(f"{where} a whole number from 0 to 2^60, got {shown}")
    return value


def _whole_list(value) -> list[int]:
    return [_whole(v) for v in _list(value)]


def _seconds(value, what: str = "") -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 <= value <= MAX_SECONDS):
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:24]}..."
        where = f"{what} must be" if what else "expected"
        raise ValueError(f"{where} seconds (a number from 0 to 1e9), got {shown}")
    return float(value)


# checkpoint_overhead: the part of a native region's entry op's cost that is torch.utils.checkpoint's
# own (solvers/regions/prediction.py region_graph), kept so that the plan's un-checkpointed time can be checked.
_NODE_FIELDS = ("cost", "mem", "workspace", "structural_workspace", "output", "pinned", "kind", "module", "ops", "random",
                "value_class", "checkpoint_overhead")


def graph_to_dict(graph: nx.DiGraph) -> dict:
    return {
        "attributes": {k: v for k, v in graph.graph.items() if isinstance(v, (str, int, float, bool))},
        "nodes": [{"id": str(n), **{k: d[k] for k in _NODE_FIELDS if k in d}} for n, d in graph.nodes(data=True)],
        "edges": [[str(u), str(v)] for u, v in graph.edges],
    }


def graph_from_dict(data: dict) -> nx.DiGraph:
    _mapping(data, "graph")
    graph = nx.DiGraph(**dict(_mapping(data.get("attributes", {}), "graph.attributes")))
    for node in _list(data["nodes"]):
        _mapping(node, "each of graph.nodes")
        attributes = {k: node[k] for k in _NODE_FIELDS if k in node}
        graph.add_node(_text(node["id"]), **attributes)
    for edge in _list(data["edges"]):
        if not (isinstance(edge, list) and len(edge) == 2 and all(isinstance(n, str) for n in edge)):
            raise ValueError(f"each of graph.edges must be a pair of node names, got {edge!r:.60}")
        u, v = edge
        if u not in graph or v not in graph:
            raise ValueError(f"edge {u} -> {v} names a node that is not in the graph")
        graph.add_edge(str(u), str(v))
    from solvers import validate

    validate(graph)
    # Read by the fingerprint and the planner only, so not checked by validate.
    for node, attributes in graph.nodes(data=True):
        for name in ("mem", "workspace", "structural_workspace"):
            if name in attributes:
                _whole(attributes[name], f"node {node!r:.40} {name}")
        for name in ("cost", "checkpoint_overhead"):
            if name in attributes:
                _seconds(attributes[name], f"node {node!r:.40} {name}")
    for name in ("loss_value_bytes", "fixed_bytes", "library_bytes"):
        if name in graph.graph:
            _whole(graph.graph[name], f"graph.attributes.{name}")
    return graph


def read_plan_data(path: str | os.PathLike):
    """The JSON value of the plan file at ``path`` (planner/loading.py makes the plan of it). Raises
    :class:`PlanFileError` with the reason when it cannot be read or is not JSON."""
    path = os.fspath(path)
    try:
        if os.path.exists(path) and not os.path.isfile(path):  # a FIFO blocks, /dev/zero never ends
            kind = "a folder" if os.path.isdir(path) else "not a regular file (a device or a pipe)"
            raise PlanFileError(f"cannot read plan file {path}: it is {kind}; a plan file is a JSON file "
                                "written by plan-checkpoints")
        if os.path.getsize(path) > MAX_PLAN_FILE_BYTES:
            raise PlanFileError(f"plan file {path} is {format_bytes(os.path.getsize(path))}; a plan file is a JSON "
                                f"file written by plan-checkpoints, at most {format_bytes(MAX_PLAN_FILE_BYTES)}")
        with open(path, "rb") as file:
            raw = file.read()
    except PlanFileError:
        raise
    except (OSError, ValueError) as error:  # ValueError: a NUL in the path
        shown = path if path.isprintable() else repr(path)
        raise PlanFileError(f"cannot read plan file {shown}: {getattr(error, 'strerror', None) or error}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as error:
        raise PlanFileError(f"{path} is not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})") from None
    except (UnicodeDecodeError, RecursionError) as error:  # binary junk; absurdly nested arrays
        raise PlanFileError(f"{path} is not a JSON plan ({type(error).__name__})") from None
    return data


def _warn_if_other_torch(made_with: str, path: str) -> None:
    """A plan's costs and op names were measured with one torch; another may trace the model to other
    ops (planner.apply then refuses it, PlanMismatch) or run them at other speeds."""
    import warnings

    if made_with != torch.__version__:
        shown = made_with if len(made_with) <= 40 and made_with.isprintable() else repr(made_with[:40])
        warnings.warn(f"{path} was made with torch {shown}, this is torch {torch.__version__}: its predicted "
                      "figures may not hold, and applying it fails if the model traces differently; plan again "
                      "with this torch to be sure", PlanWarning, stacklevel=4)
