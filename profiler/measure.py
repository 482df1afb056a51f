"""Measure what each op of the joint graph costs on the model's device.

The graph is run as a whole, op by op, with real tensors (a real training step each time, so caches
are as warm as in training): one warm-up run, then two timed runs (one if ``repeats`` is 1). Each
op's time is its least over its runs (another process's load only ever adds to an op's time, so
the least is the sample it disturbed least: with medians, two profiles of a 6-layer GPT-2 on a
loaded 2-core machine chose different regions at 2 of 3 budgets; with the least, the same at all
3), and then every op of one **signature** (the aten op and its arguments' shapes, strides, dtypes
and other values) gets the median of those: the ops of a model's repeated blocks are the same
computation, so the 12 layers of a transformer get one time, from 12 ops' samples. An op whose signature
would have fewer than ``repeats`` samples over two runs (an op of the model's head, seen once) is
called again in place in the first run (same inputs, result dropped) until it would, unless it
mutates its inputs or draws random numbers. A
third run (up to ``repeats`` runs in all) is made only when the second moved the step's total by
more than :data:`SETTLED` from the first.

On a GPU every op is bracketed by CUDA events; on CPU by the process's CPU time (one thread), after
blocks of its outputs' sizes have been written and freed (profiler/prefault.py: an op is timed on
memory already mapped wherever the allocator would reuse it, so that a memory-bounded run and a
whole one time it alike). The RNG is reset before
each run, so every run draws the same numbers, and restored afterwards. Buffer mutations (``copy_``
into a buffer) are not executed: measuring must not change the model.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .allocations import cpu_allocations, cpu_memory_profile, replay
from .prefault import large_blocks_land_fresh, prefault_sizes, prepare_outputs
from .rematerialize import BoundedRun, BoundedStats
from .state import cuda_devices, get_rng_state, set_rng_state


@dataclass(frozen=True)
class OpTimes:
    seconds: dict[str, float]  # fx node name -> seconds of one execution (its signature's: see the module docstring)
    runs: int  # timed runs of the whole graph
    step_seconds: float  # median wall time of a whole timed run of the graph (without in-place calls)
    # fx node name -> bytes the op's kernels allocate beyond its outputs while it runs (measured in
    # the warm-up run; ops without any are left out). CPU dropout's float noise tensor is one.
    scratch_bytes: dict[str, int] = field(default_factory=dict)
    # With a memory bound (time_ops(..., memory_bound=)): the most bytes the runs held at once
    # (profiler/rematerialize.py) and the op calls they made again for evicted values, over all runs;
    # both 0 for an unbounded profile.
    held_peak_bytes: int = 0
    recomputed_calls: int = 0
    # The most the bounded runs may hold (BoundedRun.settled_bound: the bound given, raised to what
    # the placeholders and one op need at once), the warm-up's with the largest scratch beside it
    # (its scratch was not known before it ran); and on CPU what the allocator's events say the
    # warm-up held at most, the placeholders included. 0 unbounded.
    held_bound_bytes: int = 0
    measured_held_bytes: int = 0
    # Bytes CUDA libraries keep allocated while the step trains (cuBLAS's workspaces:
    # profiler/library_memory.py), held like the parameters; 0 on CPU. Set by profiler.profile.
    library_bytes: int = 0


def _is_buffer_mutation(node: fx.Node) -> bool:
    return node.target is torch.ops.aten.copy_.default and node.args[0].op == "placeholder"


def _last_uses(graph: fx.Graph) -> dict[str, list[str]]:
    """For each node, the values whose last reader it is (freed right after it runs)."""
    last: dict[str, str] = {}
    for node in graph.nodes:
        for arg in node.all_input_nodes:
            last[arg.name] = node.name
    freed: dict[str, list[str]] = {}
    for value, reader in last.items():
        freed.setdefault(reader, []).append(value)
    return freed


# Names the record_function around each op of the warm-up run, to find its allocations.
SCRATCH_LABEL = "plan-checkpoints-op:"


def _scratch_from_events(profile) -> dict[str, int]:
    """Per ``record_function`` label, the peak of the CPU allocations inside it above what is still
    allocated when it ends (bytes): what its kernels used and released."""
    from torch._C._profiler import _EventType

    scratch: dict[str, int] = {}
    pending = list(profile.profiler.kineto_results.experimental_event_tree())
    while pending:
        event = pending.pop()
        if event.typed[0] == _EventType.TorchOp and event.name.startswith(SCRATCH_LABEL):
            peak, end = replay(cpu_allocations(event.children))
            if peak > end:
                scratch[event.name[len(SCRATCH_LABEL):]] = peak - max(end, 0)
        else:
            pending.extend(event.children)
    return scratch


# Timed runs stop after the second when it moved the sum of the op times by at most this much from
# the first (the region search treats plans within 2% of the step's time as equal).
SETTLED = 0.01


def time_ops(graph_module: fx.GraphModule, inputs: list, repeats: int = 3, memory_bound: int | None = None,
             tangents: tuple[str, ...] = ()) -> OpTimes:
    """Run the graph on ``inputs`` (placeholders in order) and time every op (the module docstring
    says how many runs and samples and which time each op gets).

    ``memory_bound`` (bytes, for every tensor the runs hold, ``inputs`` included): each run holds at
    most that, evicting values and recomputing them when read again (profiler/rematerialize.py);
    every op is still timed where the graph runs it. None: the whole step is held as it runs.
    ``tangents``: the placeholders' names that hold the loss's gradients (what the bounded run evicts
    last is derived from them).

    The warm-up run also measures each op's scratch memory (:attr:`OpTimes.scratch_bytes`): on CPU
    from the allocator's events (``torch.profiler`` with ``profile_memory``), on CUDA from
    ``max_memory_allocated`` around the op; and each op's signature."""
    graph = graph_module.graph
    devices = cuda_devices(inputs)
    use_events = bool(devices)
    frees = _last_uses(graph)
    signatures: dict[str, tuple] = {}
    scratch: dict[str, int] = {}
    step_times = []
    saved_rng = get_rng_state(devices)
    runs: list[dict[str, list[float]]] = []
    bounded = None if memory_bound is None else BoundedRun(graph_module, memory_bound, _is_buffer_mutation, tangents)
    held_peak = recomputed = 0
    bound_bytes = None  # the timed runs' (BoundedRun.settled_bound, with the ops' scratch reserved)
    try:
        # The memory profiler is entered and left by a context manager: an op that raises must not
        # leave torch.profiler enabled (the process then crashed at exit, rc 139, even when the
        # caller caught the error).
        recording = cpu_memory_profile() if not use_events else contextlib.nullcontext()
        with recording as memory_profile:  # the warm-up: lazy initialisation, allocator, scratch
            _, stats = _run_graph(graph_module, inputs, frees, _WarmUp(use_events, scratch, signatures), saved_rng,
                                  bounded, None, bounded.settled_bound() if bounded else None)
        if memory_profile is not None:
            scratch.update(_scratch_from_events(memory_profile))
        held_peak, recomputed = (stats.peak_bytes, stats.recomputed_calls) if stats else (0, 0)
        held_bound = measured_held = 0
        if stats:
            held_bound = stats.bound_bytes + max(scratch.values(), default=0)
            if memory_profile is not None:
                roots = memory_profile.profiler.kineto_results.experimental_event_tree()
                measured_held = stats.placeholder_bytes + replay(cpu_allocations(roots))[0]
        extra = _extra_calls(graph, signatures, repeats, runs=min(repeats, 2))
        while True:
            samples: dict[str, list[float]] = {}
            timing = _Timing(use_events, samples, extra if not runs else {})
            # Room for an op's scratch (its extra calls' results are dropped before its own is made).
            reserve = dict(scratch) if bounded else None
            if bounded and bound_bytes is None:
                bound_bytes = bounded.settled_bound(reserve)
            elapsed, stats = _run_graph(graph_module, inputs, frees, timing, saved_rng, bounded, reserve, bound_bytes)
            step_times.append(elapsed)
            if stats:
                held_peak, recomputed = max(held_peak, stats.peak_bytes), recomputed + stats.recomputed_calls
                held_bound = max(held_bound, stats.bound_bytes)
            runs.append(samples)
            if len(runs) >= repeats or (len(runs) >= 2 and _settled(runs, signatures)):
                break
    finally:
        set_rng_state(saved_rng)
    least = _least_by_signature(runs, signatures)
    seconds = {name: least[signatures.get(name, name)] for name in runs[0]}
    # The step's wall time from the runs without the in-place calls (all but the first).
    return OpTimes(seconds, len(runs), statistics.median(step_times[1:] or step_times), scratch, held_peak, recomputed,
                   held_bound, measured_held)


def _signature(target, args, kwargs) -> tuple:
    """What an op's time depends on, as far as it can be seen without its values: the op, and each
    argument's shape, strides, storage offset, dtype and device (tensors) or value (the rest)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    described = tuple(
        ("tensor", tuple(leaf.shape), leaf.stride(), leaf.storage_offset(), leaf.dtype, leaf.device.type)
        if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided
        else ("tensor", id(leaf)) if isinstance(leaf, torch.Tensor)  # sparse, nested: never shared
        else (type(leaf).__name__, repr(leaf))
        for leaf in leaves
    )
    return (str(target), str(spec), described)


def _repeatable(node: fx.Node) -> bool:
    """Whether calling ``node``'s op again on the same inputs changes nothing: an aten op that
    neither mutates an argument nor draws from a generator."""
    target = node.target
    return (isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable
            and torch.Tag.nondeterministic_seeded not in target.tags)


def _extra_calls(graph: fx.Graph, signatures: dict[str, tuple], repeats: int, runs: int) -> dict[str, int]:
    """fx name -> calls in place beyond its own in the first timed run: for the first op of each
    repeatable signature with fewer than ``repeats`` samples over ``runs`` timed runs, the calls
    that bring it to ``repeats``."""
    count: dict[tuple, int] = {}
    for signature in signatures.values():
        count[signature] = count.get(signature, 0) + 1
    extra, given = {}, set()
    for node in graph.nodes:
        signature = signatures.get(node.name)
        if signature is None or signature in given or count[signature] * runs >= repeats or not _repeatable(node):
            continue
        given.add(signature)
        extra[node.name] = repeats - count[signature] * runs
    return extra


def _least_by_signature(runs: list[dict[str, list[float]]], signatures: dict[str, tuple]) -> dict:
    """Signature (or fx name, for an op without one) -> its time: each op's least over its own
    samples in ``runs``, then the median of those over the ops of the signature (the least over all
    of them came out 17-27% under the measured step of a 12-layer GPT-2, the median 6-9% like the
    per-op least did)."""
    per_op: dict[str, float] = {}
    for samples in runs:
        for name, times in samples.items():
            per_op[name] = min(per_op.get(name, float("inf")), *times)
    grouped: dict = {}
    for name, least in per_op.items():
        grouped.setdefault(signatures.get(name, name), []).append(least)
    return {key: statistics.median(values) for key, values in grouped.items()}


def _settled(runs: list[dict[str, list[float]]], signatures: dict[str, tuple]) -> bool:
    """Whether the last run moved the sum of the op times (each its signature's least) by at most
    :data:`SETTLED` from the runs before it."""
    before = _least_by_signature(runs[:-1], signatures)
    after = _least_by_signature(runs, signatures)
    names = list(runs[0])
    total_before = sum(before[signatures.get(n, n)] for n in names)
    total_after = sum(after[signatures.get(n, n)] for n in names)
    return total_before <= 0 or (total_before - total_after) <= SETTLED * total_before


def constant_value(graph_module: fx.GraphModule, target: str):
    """The tensor a ``get_attr`` node names (a lifted constant such as ``_tensor_constant0``:
    ``ids[:, 0] = start_id`` in Hugging Face's T5 and BART), by its dotted attribute path."""
    value = graph_module
    for part in target.split("."):
        value = getattr(value, part)
    return value


class _WarmUp:
    """The untimed first run: each op's scratch memory (labelled for the CPU memory profiler, or
    from the CUDA allocator's statistics into ``scratch``) and its signature."""

    def __init__(self, use_events: bool, scratch: dict[str, int], signatures: dict[str, tuple]):
        self.use_events, self.scratch, self.signatures = use_events, scratch, signatures

    def call(self, node: fx.Node, args, kwargs):
        self.signatures[node.name] = _signature(node.target, args, kwargs)
        if self.use_events:
            return _cuda_with_scratch(node, args, kwargs, self.scratch)
        with torch.profiler.record_function(SCRATCH_LABEL + node.name):
            return node.target(*args, **kwargs)

    def finish(self) -> None:
        pass


def _cpu_op_clock():
    """The clock a CPU op is timed by: with one torch thread, the process's CPU time, which another
    process's load does not stretch (the wall-clock least of two runs of a 6-layer GPT-2 summed to
    509-906 ms at load 12 on 2 cores, its eager step to 300-311 ms of CPU: the head's large ops,
    sampled twice, were stretched most); with several, the wall clock (CPU time would add up the
    threads of one op)."""
    return time.process_time if torch.get_num_threads() == 1 else time.perf_counter


class _Timing:
    """A timed run: each op's seconds appended to ``samples``, and ``extra[name]`` more calls of an
    op in place, timed and their results dropped."""

    def __init__(self, use_events: bool, samples: dict[str, list[float]], extra: dict[str, int]):
        self.use_events, self.samples, self.extra = use_events, samples, extra
        self.events = []
        self.prefault: dict[str, tuple[int, ...]] = {}  # CPU: per op, its outputs' sizes (profiler/prefault.py)
        # CPU: whether this process's malloc puts a large output on fresh pages (as of this run: a
        # caller may have changed malloc's settings since the last).
        self.large_fresh = use_events or large_blocks_land_fresh()

    def call(self, node: fx.Node, args, kwargs):
        # The extra calls first, each result dropped before the next call: the op never holds two
        # outputs at once, so a bounded run needs no room for them beyond the op's own.
        for _ in range(self.extra.get(node.name, 0)):
            self._timed(node, args, kwargs)
        return self._timed(node, args, kwargs)

    def _timed(self, node: fx.Node, args, kwargs):
        if self.use_events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = node.target(*args, **kwargs)
            end.record()
            self.events.append((node.name, start, end))
            return result
        sizes = self.prefault.get(node.name)
        if sizes is None:
            sizes = self.prefault[node.name] = prefault_sizes(node)
        if sizes:
            prepare_outputs(sizes, self.large_fresh)  # on the pages a whole run gives them, bounded runs too
        clock = _cpu_op_clock()
        start_time = clock()
        result = node.target(*args, **kwargs)
        self.samples.setdefault(node.name, []).append(clock() - start_time)
        return result

    def finish(self) -> None:
        for name, start, end in self.events:
            self.samples.setdefault(name, []).append(start.elapsed_time(end) / 1000.0)


def _run_graph(graph_module: fx.GraphModule, inputs: list, frees: dict[str, list[str]], mode: _WarmUp | _Timing,
               saved_rng, bounded: BoundedRun | None = None, reserve: dict[str, int] | None = None,
               bound_bytes: int | None = None) -> tuple[float, BoundedStats | None]:
    """One run of the whole graph, op by op, from ``saved_rng``, each op called through ``mode``;
    within ``bounded``'s memory bound when given (``reserve``: bytes an op needs beyond its
    outputs). Returns the run's wall time in seconds and the bounded run's figures (None unbounded)."""
    set_rng_state(saved_rng)
    env: dict[str, object] = {}
    placeholders = iter(inputs)
    if mode.use_events:
        torch.cuda.synchronize()
    run_start = time.perf_counter()
    if bounded is not None:
        with torch.no_grad():
            stats = bounded.run(inputs, mode.call, lambda node: constant_value(graph_module, node.target), reserve,
                                bound_bytes=bound_bytes)
        if mode.use_events:
            torch.cuda.synchronize()
        mode.finish()
        return time.perf_counter() - run_start, stats
    with torch.no_grad():
        for node in graph_module.graph.nodes:
            if node.op == "placeholder":
                env[node.name] = next(placeholders)
            elif node.op == "get_attr":
                env[node.name] = constant_value(graph_module, node.target)
            elif node.op == "call_function" and not _is_buffer_mutation(node):
                args = fx.node.map_arg(node.args, lambda n: env[n.name])
                kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n.name])
                env[node.name] = mode.call(node, args, kwargs)
            for value in frees.get(node.name, ()):
                env.pop(value, None)
    if mode.use_events:
        torch.cuda.synchronize()
    mode.finish()
    elapsed = time.perf_counter() - run_start
    env.clear()  # release the run's tensors before the next one
    return elapsed, None


def _cuda_with_scratch(node: fx.Node, args, kwargs, scratch: dict[str, int]):
    """Run one op on CUDA and record the bytes it allocated above what it still holds after."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    result = node.target(*args, **kwargs)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
    if extra > 0:
        scratch[node.name] = int(extra)
    return result
