"""Save policies of native plans at run time: which ops' outputs a region's selective checkpoint keeps.

A region ``"transformer.h.3@matmuls"`` runs under ``torch.utils.checkpoint.checkpoint`` with
``context_fn=create_selective_checkpoint_contexts(policy)``: PyTorch calls the policy after each op
of the region's first run (``ctx.op_output`` is the op's result), and each op it answers
``MUST_SAVE`` for is not run again by the recomputation, which gets the cached result instead. The
policies are solvers/regions/policies.py's ``SAVE_POLICIES``, one table for the prediction and the run: the
aten ops whose names match a policy's prefixes are saved.

A policy with ``draws`` also saves the random draws, so that the recomputation does not draw again
(on CPU a dropout's bernoulli draw is the costliest op of a transformer block). Eager CPU dropout
draws *in place*: ``noise = empty_like(x); noise.bernoulli_(1 - p); noise.div_(1 - p); x * noise``.
Selective checkpointing returns a saved in-place op's cached result, but the C++ code goes on with
its own ``noise``: had only ``bernoulli_`` and ``div_`` been saved, the recomputation's ``noise``
would be a new, uninitialised tensor (measured: wrong gradients, no error). So :class:`DrawTracker`
saves every allocation of the region (the recomputation then gets the first run's buffer, with its
final contents), saves an in-place draw into such a buffer and every later in-place op on it, and
recomputes everything else. Re-running an in-place op on a saved buffer is sound because an
allocation's first use overwrites it; skipping one is sound only while nothing has read the buffer
between the ops skipped: the tracker refuses (:class:`UnsafeSavePolicy`) an in-place op it can
neither skip nor repeat, and an in-place op on a saved matmul's output, which selective
checkpointing's own check (off for these policies: the cached buffer is mutated by design) would
have refused at the backward.
"""

from __future__ import annotations

import functools

import torch
import torch.utils._pytree as pytree
import torch.utils.checkpoint as torch_checkpoint

from solvers.regions.policies import ALLOCATIONS, SAVE_POLICIES

from .module import PlanMismatch

MUST_SAVE = torch_checkpoint.CheckpointPolicy.MUST_SAVE
PREFER_RECOMPUTE = torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE


class UnsafeSavePolicy(PlanMismatch):
    """A region's save policy met an in-place op that its checkpoint could not replay exactly."""


def _matching_ops(prefixes: tuple[str, ...]) -> frozenset:
    """The aten overload packets whose names match one of ``prefixes`` (``"aten.mm."`` is ``aten.mm``)."""
    aten = torch.ops.aten
    return frozenset(getattr(aten, n) for n in dir(aten) if f"aten.{n}.".startswith(prefixes))


def _mutates_first_argument(op) -> bool:
    schema = getattr(op, "_schema", None)
    if schema is None or not schema.arguments:
        return False
    alias = schema.arguments[0].alias_info
    return alias is not None and alias.is_write


def _is_random(op) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(op, "tags", ())


def _storage_key(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage (a subclass): not tracked
        return None


ALLOCATED, DRAWN, READ, SAVED = "allocated", "drawn", "drawn and read", "saved"


class DrawTracker:
    """What a ``draws`` policy has saved of one region's first run, by storage (module docstring).

    It lives for that run only (:meth:`SavePolicy.one_call`): it holds the tensors it tracks, which
    selective checkpointing caches anyway, so that a storage address cannot be reused by another
    tensor while its entry stands (a weak reference does not do: the result PyTorch hands the
    policy is a Python object of its own, gone when the policy returns)."""

    def __init__(self):
        self._states: dict[int, tuple[torch.Tensor, str]] = {}

    def state(self, tensor) -> str | None:
        key = _storage_key(tensor) if isinstance(tensor, torch.Tensor) else None
        entry = self._states.get(key) if key is not None else None
        return None if entry is None else entry[1]

    def mark(self, tensors, state: str) -> None:
        for tensor in pytree.tree_leaves(tensors):
            key = _storage_key(tensor) if isinstance(tensor, torch.Tensor) else None
            if key is not None:
                self._states[key] = (tensor, state)

    def clear(self) -> None:
        self._states.clear()

    def decide(self, op, args, output, saved_by_name: bool, policy: str):
        """MUST_SAVE or PREFER_RECOMPUTE for ``op`` (its ``args`` and ``output``), in a region whose
        policy saves it by name or not (``saved_by_name``)."""
        packet = getattr(op, "overloadpacket", op)
        name = f"aten.{getattr(packet, '__name__', '')}."
        if name.startswith(ALLOCATIONS):
            self.mark(output, ALLOCATED)
            return MUST_SAVE
        target = args[0] if args and _mutates_first_argument(op) else None
        if isinstance(target, torch.Tensor):
            return self._in_place(op, target, policy)
        if saved_by_name or _is_random(op):
            self.mark(output, SAVED)
            return MUST_SAVE
        for tensor in pytree.tree_leaves((args,)):
            if isinstance(tensor, torch.Tensor) and self.state(tensor) == DRAWN:
                self.mark(tensor, READ)
        return PREFER_RECOMPUTE

    def _in_place(self, op, target: torch.Tensor, policy: str):
        state = self.state(target)
        if state is None:
            return PREFER_RECOMPUTE  # a tensor the recomputation makes anew: the op is run again on it
        if state == ALLOCATED:
            if _is_random(op):
                self.mark(target, DRAWN)
                return MUST_SAVE
            return PREFER_RECOMPUTE  # run again on the saved buffer: it rewrites what it wrote
        if state == DRAWN:
            return MUST_SAVE
        raise UnsafeSavePolicy(
            f"save policy {policy!r}: {op} writes in place into a tensor the policy saved "
            f"({'a random draw that was read before' if state == READ else 'a saved result'}); its recomputation "
            "could not give the first run's values. Plan without the '+draws' save policies "
            "(planner.native.plan_native(..., policies=('matmuls', 'projections')))")


class SavePolicy:
    """A selective-checkpoint policy of solvers/regions/policies.py's table, by ``name``. Picklable (a name),
    so that the model stays deep-copyable. A region's call runs under :meth:`one_call`'s policy,
    whose :meth:`context_fn` is the checkpoint's ``context_fn``; :meth:`close` after the call."""

    def __init__(self, name: str, tracker: DrawTracker | None = None):
        spec = SAVE_POLICIES.get(name)
        if spec is None:
            raise PlanMismatch(f"unknown save policy {name!r} in the plan (known: {', '.join(SAVE_POLICIES)}): made "
                               "by a newer plan-checkpoints?")
        self.name = name
        self.draws = spec.draws
        self.ops = _matching_ops(spec.ops)
        self.tracker = tracker

    def __getstate__(self):
        return {"name": self.name}

    def __setstate__(self, state):
        self.__init__(state["name"])

    def one_call(self) -> SavePolicy:
        """The policy for one call of the region: with ``draws``, a copy with a tracker of its own.
        Under torch.compile the policy itself: the partitioner decides there (:meth:`__call__`), and
        dynamo takes a ``context_fn``'s policy only as a constant it can guard, not an object made
        while tracing (measured: each region with a copy fell back to eager, 5 graphs for 1)."""
        if not self.draws or torch.compiler.is_compiling():
            return self
        call = object.__new__(SavePolicy)
        call.name, call.draws, call.ops, call.tracker = self.name, self.draws, self.ops, DrawTracker()
        return call

    def close(self) -> None:
        """The region's first run is over (the policy is asked nothing more): drop what it tracked."""
        if self.tracker is not None:
            self.tracker.clear()

    def __call__(self, ctx, op, *args, **kwargs):
        saved = getattr(op, "overloadpacket", op) in self.ops
        # Under torch.compile the partitioner decides (inductor saves random draws itself); without
        # the op's result (a torch older than the context's op_output) the draws cannot be tracked:
        # the policy saves by name only, which recomputes more and holds less than planned.
        if self.tracker is None or torch.compiler.is_compiling() or not hasattr(ctx, "op_output"):
            return MUST_SAVE if saved else PREFER_RECOMPUTE
        return self.tracker.decide(op, args, ctx.op_output, saved, self.name)

    def context_fn(self):
        # A partial of PyTorch's own function, the form torch.compile recognises as a context_fn.
        # With draws the cached buffers are mutated after caching by design (the draw, the scaling):
        # selective checkpointing's check of that is off, the tracker's stands in for it.
        return functools.partial(torch_checkpoint.create_selective_checkpoint_contexts, self,
                                 **({"allow_cache_entry_mutation": True} if self.draws else {}))
