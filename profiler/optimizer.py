"""What an optimizer holds and allocates (bytes), measured by running its ``step()`` on fake tensors.

A training iteration holds the optimizer's state (Adam's two moments and step counts, SGD's momentum
buffers) from its first ``step()`` on, through every later forward and backward; and ``step()``
itself allocates temporaries while the parameters' gradients are held (a for-loop Adam's
``exp_avg_sq.sqrt() / bias_correction`` is two of the largest parameter's size at once, a foreach
Adam's ``_foreach_sqrt`` one of every parameter in its group). These sizes follow from the
optimizer's class, its hyper-parameters (``foreach``, ``fused``, ``momentum``, ``amsgrad``,
``weight_decay``), its param groups and the parameters' shapes, dtypes and devices; they are
measured here, not estimated: a twin of the optimizer over fake twins of the parameters
(``FakeTensorMode``: shapes, no data) runs ``step()`` twice under :class:`LiveStorages`, a
``TorchDispatchMode`` that follows every storage the step creates until it is garbage (the technique
of ``torch.distributed._tools.mem_tracker``). Nothing is allocated for real, and the user's optimizer
and parameters are not touched.

What the dispatch mode cannot see, it adds by rule, so that the figures equal the CPU allocator's
events (tests/test_optimizer.py compares them byte for byte): a Python number passed where an op
takes a tensor (``exp_avg_sq.mul_(beta2)``) is wrapped in an 8-byte 0-d tensor on the CPU, and the
kernel casts it to the operand's dtype; a ``_foreach_`` op given a Python scalar wraps it once per
tensor, in turn. On CUDA every storage is counted as the caching allocator rounds it (512-byte
blocks) and the scalars are kernel arguments, never allocations.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .storage import allocated_bytes


class OptimizerError(ValueError):
    """The optimizer cannot be measured: its class cannot be rebuilt over stand-in parameters, or its
    step does not run on fake tensors. The message says which and what to do."""


@dataclass(frozen=True)
class OptimizerMemory:
    """Bytes an optimizer adds to a training iteration, on the parameters' device.

    ``state_bytes``: what ``step()`` leaves held for good (its state), from the first step on.
    ``first_step_bytes``: the most the first ``step()`` allocates above what is live when it starts
    (its state, created then, and its temporaries). ``later_step_bytes``: the same for a later
    ``step()``, the state already held (its temporaries only)."""

    state_bytes: int
    first_step_bytes: int
    later_step_bytes: int

    def step_peak_bytes(self, held_before_step: int) -> int:
        """The most live during ``step()`` on any iteration, when ``held_before_step`` bytes (the
        parameters, their gradients and whatever else the loop holds, the state apart) are live as
        it starts."""
        return held_before_step + max(self.first_step_bytes, self.state_bytes + self.later_step_bytes)


@dataclass(frozen=True)
class OptimizerRecipe:
    """How to build an optimizer over other tensors: its class, the keyword arguments its constructor
    takes, and its param groups as (the parameters, the group's hyper-parameters)."""

    cls: type
    kwargs: dict
    groups: tuple[tuple[tuple[torch.Tensor, ...], dict], ...]

    @classmethod
    def of(cls, optimizer: torch.optim.Optimizer) -> OptimizerRecipe:
        """The recipe of an existing optimizer: its class, its ``defaults`` that its constructor
        accepts by name, and its param groups (hyper-parameters as each group holds them)."""
        accepted = inspect.signature(type(optimizer).__init__).parameters
        kwargs = {k: v for k, v in optimizer.defaults.items() if k in accepted and k != "params"}
        groups = tuple((tuple(g["params"]), {k: v for k, v in g.items() if k != "params"})
                       for g in optimizer.param_groups)
        return cls(type(optimizer), kwargs, groups)


class LiveStorages(TorchDispatchMode):
    """Bytes of the storages alive, and their most at once, over the ops run under this mode.

    Only storages on ``device`` count, when one is given. A storage counts from the op that returned
    it (or from :meth:`track`) until Python collects it (a weak reference's callback). ``peak_bytes`` is read after every op, while the op's inputs and
    outputs are both alive, plus the wrapped scalars it holds meanwhile (module docstring). Use it
    inside a ``FakeTensorMode``: it also answers ``.item()`` on a fake tensor (an optimizer's step
    count, NAdam's running product) with 1, or 0.5 for a float: values no size depends
    on, and none that makes a bias correction divide by zero."""

    def __init__(self, device: torch.device | None = None):
        super().__init__()
        self.device = device  # only storages on this device count (None: all)
        self.live_bytes = 0
        self.peak_bytes = 0
        self._sizes: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}

    def track(self, tensor: torch.Tensor) -> None:
        """Count ``tensor``'s storage as live (once, however many tensors view it)."""
        if self.device is not None and tensor.device != self.device:
            return  # a CUDA optimizer's step counts live on the CPU (torch's default, not capturable)
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._sizes:
            return
        self._sizes[key] = allocated_bytes(storage.nbytes(), tensor.device)
        self.live_bytes += self._sizes[key]
        self._refs[key] = weakref.ref(storage, lambda _, key=key: self._collected(key))

    def _collected(self, key: int) -> None:
        self.live_bytes -= self._sizes.pop(key)
        self._refs.pop(key, None)

    def restart_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            return True if args[0].dtype == torch.bool else 0.5 if args[0].is_floating_point() else 1
        out = func(*args, **kwargs)
        for tensor in pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self.track(tensor)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes + _wrapped_scalar_bytes(func, args, kwargs))
        return out


def _wrapped_scalar_bytes(func, args, kwargs) -> int:
    """Bytes a CPU op allocates for the Python numbers it is given, beside its tensors (measured in
    the CPU allocator's events): an 8-byte 0-d tensor per number passed as a ``Tensor`` argument
    (``exp_avg_sq.mul_(beta2)``: the dispatcher hands the mode the number back); for a ``_foreach_``
    binary op given a number (or a list of them) as its second argument (``_foreach_add_(steps, 1)``,
    ``_foreach_div_(denominators, bias_corrections)``), one at a time, as its CPU loop calls the
    per-tensor op, which wraps it; plus, either way, the kernel's cast of one to the operand's dtype
    when that differs. The numbers the schema takes as ``Scalar`` (``alpha``, ``value``, ``weight``)
    are passed as numbers, never allocated."""
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if not tensors or tensors[0].device.type != "cpu":
        return 0
    schema = func._schema.arguments
    values = list(args) + [kwargs[a.name] for a in schema[len(args):] if a.name in kwargs]
    if func.__name__.startswith("_foreach_"):
        second = values[1] if len(values) > 1 else None
        numbers = second if isinstance(second, (list, tuple)) else [second]
        wrapped = numbers[:1] if numbers and all(_is_number(v) for v in numbers) else []
    else:
        wrapped = [v for argument, v in zip(schema, values) if _is_number(v) and str(argument.type) == "Tensor"]
    total = 0
    for number in wrapped:
        dtype = torch.bool if isinstance(number, bool) else torch.int64 if isinstance(number, int) else torch.float64
        total += dtype.itemsize
        if dtype != tensors[0].dtype:
            total += tensors[0].dtype.itemsize
    return total


def _is_number(value) -> bool:
    return isinstance(value, (bool, int, float))


@contextlib.contextmanager
def _fake_mode() -> Iterator:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        yield mode


def measure_optimizer(recipe: OptimizerRecipe, with_gradient: Callable[[torch.Tensor], bool]) -> OptimizerMemory:
    """Run a twin of ``recipe``'s optimizer twice over fake twins of its parameters, those for which
    ``with_gradient(parameter)`` holds given a gradient of their shape and dtype (the others get
    none, as a parameter the step does not reach: optimizers skip them), and measure what each
    ``step()`` allocates and what it leaves held. Raises :class:`OptimizerError` when the class
    cannot be rebuilt that way or its step does not run on fake tensors."""
    name = recipe.cls.__name__
    with _fake_mode() as mode:
        twins: dict[int, torch.Tensor] = {}

        def twin(tensor: torch.Tensor) -> torch.Tensor:
            if id(tensor) not in twins:
                fake = mode.from_tensor(tensor)
                if isinstance(tensor, torch.nn.Parameter):
                    fake = torch.nn.Parameter(fake, requires_grad=tensor.requires_grad)
                twins[id(tensor)] = fake
            return twins[id(tensor)]

        groups = [{**{k: twin(v) if isinstance(v, torch.Tensor) else v for k, v in options.items()},
                   "params": [twin(p) for p in params]} for params, options in recipe.groups]
        devices = [p.device for params, _ in recipe.groups for p in params]
        tracker = LiveStorages(devices[0] if devices else None)  # the parameters' device: the budget's
        for params, _ in recipe.groups:
            for p in params:
                fake = twin(p)
                tracker.track(fake)
                if with_gradient(p):
                    fake.grad = torch.empty_like(fake)
                    tracker.track(fake.grad)
        for fake in twins.values():
            tracker.track(fake)
        before = tracker.live_bytes
        tracker.restart_peak()
        with tracker:  # some constructors make the state (Adagrad's sums): counted with the first step
            try:
                twin_optimizer = recipe.cls(groups, **recipe.kwargs)
            except Exception as error:  # a constructor we do not know: say so, in the user's terms
                raise OptimizerError(
                    f"cannot rebuild {name} over stand-in parameters to measure it ({type(error).__name__}: "
                    f"{error}); pass a torch.optim optimizer, or one whose constructor takes (params, **its "
                    "defaults)") from None
            try:
                twin_optimizer.step()
                first = tracker.peak_bytes - before
                state = tracker.live_bytes - before
                tracker.restart_peak()
                twin_optimizer.step()
                later = tracker.peak_bytes - tracker.live_bytes
            except Exception as error:
                raise OptimizerError(f"{name}.step() does not run on fake tensors, so its memory cannot be measured "
                                     f"without running it ({type(error).__name__}: {str(error)[:200]})") from None
    return OptimizerMemory(state_bytes=state, first_step_bytes=first, later_step_bytes=later)


def optimizer_memory(optimizer: torch.optim.Optimizer | OptimizerRecipe,
                     with_gradient: Callable[[torch.Tensor], bool] | None = None) -> OptimizerMemory:
    """:func:`measure_optimizer` of an optimizer (or a recipe), every parameter that requires grad
    given a gradient unless ``with_gradient`` says otherwise."""
    recipe = optimizer if isinstance(optimizer, OptimizerRecipe) else OptimizerRecipe.of(optimizer)
    return measure_optimizer(recipe, with_gradient or (lambda p: p.requires_grad))


__all__ = ["LiveStorages", "OptimizerError", "OptimizerMemory", "OptimizerRecipe", "measure_optimizer",
           "optimizer_memory"]

