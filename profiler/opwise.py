"""Time a traced step one op at a time, on random values of the sizes the trace gives, never the
whole step: the timing of a model too large to run (profiler/meta.py).

Each op of the joint graph is called alone, its inputs made afresh (random floating-point values,
zeros for integers and booleans, so that an index is in range) in the exact shapes, strides,
storage offsets and dtypes of the trace's fake tensors, and freed after it. Only one op's inputs and
outputs are live at a time, so timing holds at most the largest op's footprint
(:attr:`OpTimes.held_peak_bytes`). Ops of one **signature** (the aten op and its arguments' shapes,
strides, dtypes and other values: profiler/measure.py) are timed once: the repeated blocks of a
transformer share every signature, so only the first block's ops, the head's and the loss's are
called. Each signature's time is the least of ``repeats`` calls after a warm-up call, on the CPU
op clock profiler/measure.py uses (process time with one thread). An op's scratch (what its kernels
allocate beyond its outputs) is measured in the warm-up call from the allocator's events, as
profiler/measure.py does in its warm-up run.

What this does not see: an op's time that depends on its values (a sparse gather, a NaN path), and
the caches a whole run keeps warm between ops (profiler/measure.py runs the step as a whole).
"""

from __future__ import annotations

import warnings

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .measure import (SCRATCH_LABEL, OpTimes, _cpu_op_clock, _is_buffer_mutation, _scratch_from_events, _signature,
                      constant_value)
from .allocations import cpu_memory_profile
from .state import get_rng_state, set_rng_state
from .storage import storage_bytes


def real_like(value, seed: int = 0):
    """A real tensor (on ``value``'s device) with ``value``'s (a fake tensor's) shape, strides, storage offset and dtype,
    over a storage as large as ``value``'s: standard normal values for floating-point dtypes, zeros
    for the rest (an index, a mask). Anything but a tensor is returned as it is."""
    if not isinstance(value, torch.Tensor):
        return value
    elements = max(value.untyped_storage().nbytes() // value.element_size(),
                   value.storage_offset() + _extent(value))
    base = torch.zeros(elements, dtype=value.dtype, device=value.device)
    if value.is_floating_point() or value.is_complex():
        base.normal_(generator=torch.Generator().manual_seed(seed))
    return base.as_strided(tuple(value.shape), value.stride(), value.storage_offset())


def _extent(value: torch.Tensor) -> int:
    """Elements a strided view reaches past its offset (0 for an empty tensor)."""
    if value.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(value.shape, value.stride()))


def _traced_value(node: fx.Node, graph_module: fx.GraphModule):
    """What the trace says ``node`` holds: its fake value, or a lifted constant (``get_attr``) itself."""
    if node.op == "get_attr":
        return constant_value(graph_module, node.target)
    return node.meta.get("val")


def _timed_op(node: fx.Node) -> bool:
    """Whether ``node`` runs a kernel worth timing: an aten op (a ``getitem`` of a multi-output op,
    a placeholder, a buffer's update are not)."""
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and not _is_buffer_mutation(node))


def _inputs_of(node: fx.Node, graph_module: fx.GraphModule) -> tuple[tuple, dict]:
    """``node``'s arguments as real tensors (:func:`real_like` of each input's fake value)."""
    def real(n: fx.Node):
        return pytree.tree_map_only(torch.Tensor, real_like, _traced_value(n, graph_module))

    return fx.node.map_arg(node.args, real), fx.node.map_arg(node.kwargs, real)


def _bytes(value) -> int:
    return sum(storage_bytes(t) for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor))


def time_ops_one_at_a_time(graph_module: fx.GraphModule, repeats: int = 3) -> OpTimes:
    """Seconds of every op of ``graph_module`` (a joint graph traced with fake tensors), each
    signature timed alone on random inputs of its traced sizes (the module docstring). Ops that are
    not kernels (``getitem``) take 0 s; an op whose signature is timed already takes that time.
    ``step_seconds`` is the sum of the op times; ``held_peak_bytes`` the most one op's inputs,
    outputs and scratch held at once; ``runs`` the calls per signature. An op that raises on random
    values (none in the models tested) counts 0 s, with a ``RuntimeWarning`` naming it."""
    signatures: dict[str, tuple] = {}
    first_of: dict[tuple, fx.Node] = {}
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or _is_buffer_mutation(node):
            continue
        if not _timed_op(node):
            signatures[node.name] = ("untimed", node.name)
            continue
        args = fx.node.map_arg(node.args, lambda n: _traced_value(n, graph_module))
        kwargs = fx.node.map_arg(node.kwargs, lambda n: _traced_value(n, graph_module))
        signature = _signature(node.target, args, kwargs)
        signatures[node.name] = signature
        first_of.setdefault(signature, node)
    saved_rng = get_rng_state()
    failed: dict[tuple, str] = {}
    least: dict[tuple, float] = {}
    held_peak = 0
    clock = _cpu_op_clock()
    try:
        # Scratch first, each signature called once under the allocator's events; timed apart, as
        # the profiler's recording slows every call it sees.
        with cpu_memory_profile() as memory_profile, torch.no_grad():
            for signature, node in first_of.items():
                args, kwargs = _inputs_of(node, graph_module)
                try:
                    with torch.profiler.record_function(SCRATCH_LABEL + node.name):
                        result = node.target(*args, **kwargs)
                except Exception as error:  # noqa: BLE001 - an op random values do not suit (reported below)
                    failed[signature] = f"{node.target}: {type(error).__name__}"
                    continue
                held_peak = max(held_peak, _bytes((args, kwargs)) + _bytes(result))
                del result, args, kwargs
        scratch_by_first = _scratch_from_events(memory_profile)
        with torch.no_grad():
            for signature, node in first_of.items():
                if signature in failed:
                    continue
                args, kwargs = _inputs_of(node, graph_module)
                node.target(*args, **kwargs)  # warm-up: lazy initialisation, the allocator's cache
                times = []
                for _ in range(max(repeats, 1)):
                    started = clock()
                    result = node.target(*args, **kwargs)
                    times.append(clock() - started)
                    del result
                least[signature] = min(times)
                del args, kwargs
    finally:
        set_rng_state(saved_rng)
    if failed:
        warnings.warn(f"{len(failed)} op(s) of the step could not run on random values of their traced sizes and "
                      f"count no time in the plan ({', '.join(list(failed.values())[:3])}"
                      f"{' and more' if len(failed) > 3 else ''})", RuntimeWarning, stacklevel=2)
    scratch_of = {signatures[node.name]: scratch_by_first[node.name]
                  for node in first_of.values() if node.name in scratch_by_first}
    seconds = {name: least.get(signature, 0.0) for name, signature in signatures.items()}
    scratch = {name: scratch_of[signature] for name, signature in signatures.items() if signature in scratch_of}
    held_peak += max(scratch.values(), default=0)
    return OpTimes(seconds, max(repeats, 1), sum(seconds.values()), scratch, held_peak, 0)

__all__ = ["real_like", "time_ops_one_at_a_time"]
