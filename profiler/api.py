"""``profile()``: trace, group, measure and build the cost graph of a training step."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from typing import Protocol
from collections.abc import Callable

import networkx as nx
import torch

from .capture import TANGENT, JointGraph, autocast_disabled, capture
from .costgraph import build_cost_graph
from .fusions import recompute_log_probs, recomputed_times
from .grouping import Grouping, group_graph
from .inputs import normalise_inputs
from .library_memory import step_library_bytes
from .measure import OpTimes, time_ops
from .oom import reported_out_of_memory

# "auto"/"module" granularity picks the finest module depth whose graph has at most this many nodes:
# exact solvers stay within a minute on graphs of a few hundred nodes.
AUTO_MAX_NODES = 300


@dataclass(frozen=True)
class CachedTimes:
    """What a profile measured and a cache keeps: the op times and the planning loss's time."""

    ops: OpTimes
    loss_seconds: float


class TimesCache(Protocol):
    """Keeps measured times between profiles of the same trace (planner.sweep.profilecache has one on
    disk). ``load`` returns None when it has nothing under ``key``."""

    def load(self, key: str) -> CachedTimes | None: ...

    def store(self, key: str, times: CachedTimes) -> None: ...


@dataclass
class Profile:
    """A profiled training step: the cost graph and what the runtime needs to execute its nodes."""

    graph: nx.DiGraph
    joint: JointGraph
    grouping: Grouping
    times: OpTimes
    granularity: str
    device: str
    seconds: float
    # What finer() returns: filled by its first call (the planner asks for the finer groupings more
    # than once per plan, and each is a new cost graph), or carried over by a profile rebuilt from
    # plain data without its trace (planner/sweep/tasks.py).
    finer_profiles: tuple[Profile, ...] | None = None
    # regroup()'s profiles by granularity: the native planner asks for the op-level graph several
    # times per plan (search, repairs, the plan's figures), and a 12-layer GPT-2's took 0.17 s each.
    # Callers treat the graphs as read-only (the solvers copy what they change).
    regrouped: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def fingerprint(self) -> str:
        return self.graph.graph["fingerprint"]

    def regroup(self, granularity) -> Profile:
        """The same measurements grouped at another granularity (no new measurement; the same
        profile for the same granularity: built once, then kept)."""
        key = parse_granularity(granularity)
        if key != "auto" and self.granularity == ("op" if key is None else f"module:{key}"):
            return self
        if key not in self.regrouped:
            grouping, label = choose_grouping(self.joint, granularity)
            graph = build_cost_graph(self.joint, grouping, self.times)
            _annotate(graph, self.device, label, self.times)
            self.regrouped[key] = Profile(graph, self.joint, grouping, self.times, label, self.device, self.seconds)
        return self.regrouped[key]

    def with_log_probs_recomputed(self) -> Profile | None:
        """The same measurements on the trace whose cross-entropy backward recomputes the
        log-probabilities from the logits (profiler/fusions.py): a logits' worth less held through
        the loss, a log-softmax's time more. None when the step has no such loss, or for a profile
        without its trace."""
        if self.joint is None or self.times is None or self.joint.log_probs_recomputed:
            return None
        joint = recompute_log_probs(self.joint)
        if joint is None:
            return None
        times = recomputed_times(joint, self.times)
        grouping, label = choose_grouping(joint, self.granularity)
        graph = build_cost_graph(joint, grouping, times)
        _annotate(graph, self.device, label, times)
        return Profile(graph, joint, grouping, times, label, self.device, self.seconds)

    def finer(self) -> list[Profile]:
        """The same measurements at every finer granularity (deeper module paths, then single ops),
        one profile per distinct graph, coarsest first; none for a profile without its trace."""
        if self.finer_profiles is not None:
            return list(self.finer_profiles)
        if self.times is None or self.granularity == "op":
            return []
        depth = int(self.granularity.split(":")[1])
        labels = [f"module:{d}" for d in range(depth + 1, _module_depth(self.joint) + 1)] + ["op"]
        seen = {self.fingerprint}
        profiles = []
        for label in labels:
            candidate = self.regroup(label)
            if candidate.fingerprint not in seen:
                seen.add(candidate.fingerprint)
                profiles.append(candidate)
        self.finer_profiles = tuple(profiles)
        return profiles


def parse_granularity(granularity) -> int | None | str:
    """'op' -> None (one node per op); 'module'/'auto' -> 'auto'; an int or 'module:N' -> depth N."""
    if isinstance(granularity, bool):
        raise ValueError("granularity is 'op', 'module', 'auto', 'module:N' or an int depth")
    if isinstance(granularity, int):
        if granularity < 1:
            raise ValueError(f"a module depth is >= 1, got {granularity}")
        return granularity
    if granularity == "op":
        return None
    if granularity in ("module", "auto"):
        return "auto"
    if isinstance(granularity, str) and granularity.startswith("module:") and granularity[7:].isdigit():
        return parse_granularity(int(granularity[7:]))
    raise ValueError(f"granularity is 'op', 'module', 'auto', 'module:N' or an int depth; got {granularity!r}")


def choose_grouping(joint: JointGraph, granularity) -> tuple[Grouping, str]:
    depth = parse_granularity(granularity)
    if depth != "auto":
        return group_graph(joint, depth), "op" if depth is None else f"module:{depth}"
    best = None
    for depth in range(_module_depth(joint), 0, -1):
        grouping = group_graph(joint, depth)
        size = len(grouping.groups) + len(grouping.extractions) + 1
        if best is None or size < best[0]:
            best = (size, grouping, depth)
        if size <= AUTO_MAX_NODES:
            return grouping, f"module:{depth}"
    return best[1], f"module:{best[2]}"


def _module_depth(joint: JointGraph) -> int:
    """The deepest module path among the traced ops (1 for a model without submodules)."""
    return max(
        (len((n.meta.get("custom") or {}).get("module", "").split(".")) for n in joint.graph_module.graph.nodes),
        default=1,
    )


def _annotate(graph: nx.DiGraph, device: str, granularity: str, times: OpTimes) -> None:
    # The libraries' workspaces are held throughout, like the parameters (the fingerprint leaves
    # them out: the runtime computes it again from a trace, without any measurement).
    graph.graph["library_bytes"] = int(times.library_bytes)
    graph.graph["fixed_bytes"] = int(graph.graph["fixed_bytes"]) + int(times.library_bytes)
    graph.graph["device"] = device
    graph.graph["granularity"] = granularity
    graph.graph["torch_version"] = torch.__version__


def least_times(profiles: list[Profile]) -> Profile:
    """The first of ``profiles`` (profiles of one trace: the same ops) with each op's time the least
    over them, seconds: another process's load only adds to an op's time, so the least over a few
    rounds converges on the op's own (two profiles of one step on a loaded 2-core machine summed
    their op times 13% apart). Compares profiles taken in turn (tests/test_bounded.py,
    benchmarks/bounded.py)."""
    first = profiles[0]
    seconds = {name: min(p.times.seconds[name] for p in profiles) for name in first.times.seconds}
    times = replace(first.times, seconds=seconds)
    graph = build_cost_graph(first.joint, first.grouping, times)
    _annotate(graph, first.device, first.granularity, times)
    return Profile(graph, first.joint, first.grouping, times, first.granularity, first.device, first.seconds)


def profile(
    model: torch.nn.Module,
    example_inputs,
    loss_fn: Callable | None = None,
    granularity="module",
    repeats: int = 3,
    times_cache: TimesCache | None = None,
    fuse_loss: bool = True,
    memory_bound: int | None = None,
) -> Profile:
    """Trace ``model``'s training step on ``example_inputs`` and measure it into a cost graph.

    ``example_inputs`` is a tuple of positional arguments or a dict of keyword arguments
    (docs/contract.md, "The Python API"); ``loss_fn(output) -> scalar`` is the loss to plan for
    (default: the sum of the output's floating-point tensors). ``granularity``: ``"module"``
    (default: the finest module depth giving at most ~300 nodes), ``"module:N"`` or ``N`` (module
    paths cut at N levels), or ``"op"``.
    Costs are the least of ``repeats`` measured runs (robust to load), after one warm-up run. Model, buffers and RNG are
    left as they were.

    ``fuse_loss=False`` profiles the cross-entropy backward as eager autograd runs it (see
    :func:`profiler.capture.capture`), for the native executor.

    ``times_cache`` (optional) skips the timing, the expensive part, for a trace measured before:
    times are looked up under :func:`times_key` once the step is traced and grouped, and stored there
    after measuring.

    ``memory_bound`` (bytes; None: no bound) bounds what profiling holds, parameters, buffers and
    inputs included: the loss's eager forward runs without autograd, and the op timing evicts and
    recomputes values to stay within it (profiler/rematerialize.py), never below what the largest
    single op needs (``profile.times.held_peak_bytes`` says what was held). An allocation the device
    refuses raises :class:`profiler.oom.OutOfMemory`.
    """
    started = time.perf_counter()
    parse_granularity(granularity)  # reject a bad value before any work
    args, kwargs = normalise_inputs(example_inputs)
    with reported_out_of_memory("profiling the step"):
        joint, tangents = capture(model, args, kwargs, loss_fn, fuse_loss=fuse_loss,
                                  hold_activations=memory_bound is None)
    grouping, label = choose_grouping(joint, granularity)
    device = str(next((p.device for p in model.parameters()), torch.device("cpu")))
    key = times_key(joint, grouping, device, repeats) if times_cache is not None else None
    cached = times_cache.load(key) if times_cache is not None else None
    if cached is not None:
        times = cached.ops
        joint.loss = replace(joint.loss, seconds=cached.loss_seconds)  # the measured profile, exactly
    else:
        values = _placeholder_values(model, joint, args, kwargs, tangents)
        # the trace holds autocast's casts; autocast again would re-cast
        with autocast_disabled(), reported_out_of_memory("timing the step's ops"):
            tangent_names = tuple(p.name for p in joint.placeholders if p.role == TANGENT)
            times = time_ops(joint.graph_module, values, repeats=repeats, memory_bound=memory_bound,
                             tangents=tangent_names)
        del values
        if times_cache is not None:
            times_cache.store(key, CachedTimes(times, float(joint.loss.seconds)))
    del tangents
    # Measured each time (cheap), not cached: what the libraries keep depends on the process's GPU.
    times = replace(times, library_bytes=step_library_bytes(joint.graph_module, device))
    graph = build_cost_graph(joint, grouping, times)
    _annotate(graph, device, label, times)
    return Profile(graph, joint, grouping, times, label, device, time.perf_counter() - started)


def times_key(joint: JointGraph, grouping: Grouping, device: str, repeats: int) -> str:
    """The cache key of a trace's measured times: the cost graph's fingerprint (structure and sizes,
    known before timing), the traced ops by fx name (the names the times are keyed by; the same for
    the same model and inputs), the device, the torch version and the number of timed runs."""
    structure = build_cost_graph(joint, grouping, OpTimes({}, 0, 0.0)).graph["fingerprint"]
    ops = [[n.name, str(n.target)] for n in joint.graph_module.graph.nodes]
    text = json.dumps([structure, ops, device, torch.__version__, repeats])
    return f"{structure}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _placeholder_values(model, joint: JointGraph, args, kwargs, tangents: list) -> list:
    """Real values of the joint graph's placeholders, in order."""
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    inputs = joint.layout.flatten(args, kwargs)
    values = []
    for placeholder in joint.placeholders:
        if placeholder.role in ("param", "frozen"):
            values.append(params[placeholder.key])
        elif placeholder.role == "buffer":
            values.append(buffers[placeholder.key])
        elif placeholder.role == "input":
            values.append(inputs[placeholder.key])
        else:
            values.append(tangents[joint.loss.tangent_outputs.index(placeholder.key)])
    return [v.detach() if isinstance(v, torch.Tensor) else v for v in values]
