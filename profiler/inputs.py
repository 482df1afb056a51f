"""Example inputs as the user gives them (a tuple of positional arguments or a dict of keyword
arguments) and as the traced graph takes them (a flat list of tensors)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree


class InputMismatch(ValueError):
    """The inputs given to a planned module are not the ones its plan was made for."""


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str
    requires_grad: bool

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSpec:
        return cls(tuple(tensor.shape), tensor.dtype, str(tensor.device), tensor.requires_grad)

    def describe(self) -> str:
        return f"{str(self.dtype).replace('torch.', '')}{list(self.shape)} on {self.device}"


@dataclass(frozen=True)
class InputLayout:
    """How ``(args, kwargs)`` flatten: which leaves are tensors (graph inputs) and the rest (constants)."""

    spec: pytree.TreeSpec
    tensor_positions: tuple[int, ...]
    tensor_specs: tuple[TensorSpec, ...]
    constants: tuple[tuple[int, Any], ...]

    @property
    def signature(self) -> list[str]:
        return [s.describe() for s in self.tensor_specs]

    def flatten(self, args: tuple, kwargs: dict) -> list[torch.Tensor]:
        """The tensor leaves of a call, checked against the plan's example inputs."""
        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        if spec != self.spec:
            raise InputMismatch(
                "the inputs do not have the structure the plan was made for: expected "
                f"{_describe_structure(self.spec)}, got {_describe_structure(spec)}"
            )
        for position, value in self.constants:
            if not _same_constant(leaves[position], value):
                raise InputMismatch(
                    f"non-tensor input #{position} is {leaves[position]!r}; the plan was made with {value!r}"
                )
        tensors = [leaves[p] for p in self.tensor_positions]
        for index, (tensor, expected) in enumerate(zip(tensors, self.tensor_specs)):
            if not isinstance(tensor, torch.Tensor):
                raise InputMismatch(f"input #{index} should be a tensor {expected.describe()}, got {type(tensor).__name__}")
            got = TensorSpec.of(tensor)
            if (got.shape, got.dtype, got.device) != (expected.shape, expected.dtype, expected.device):
                raise InputMismatch(
                    f"input #{index} is {got.describe()}; the plan was made for {expected.describe()}. "
                    "Plans are made for fixed shapes: re-plan for these inputs."
                )
        return tensors

    def unflatten(self, tensors: list) -> tuple[tuple, dict]:
        leaves: list[Any] = [None] * (len(self.tensor_positions) + len(self.constants))
        for position, tensor in zip(self.tensor_positions, tensors):
            leaves[position] = tensor
        for position, value in self.constants:
            leaves[position] = value
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return args, kwargs


def _same_constant(a, b) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # objects whose == is not a bool (numpy arrays...)
        return a is b


def _describe_structure(spec: pytree.TreeSpec) -> str:
    text = str(spec).replace("\n", " ")
    return text if len(text) < 200 else text[:200] + "..."


def normalise_inputs(example_inputs) -> tuple[tuple, dict]:
    """A tuple of positional arguments, or a dict of keyword arguments (docs/contract.md, "The
    Python API"); a lone tensor is taken as the only positional argument, a list as a tuple."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, tuple):
        return example_inputs, {}
    if isinstance(example_inputs, list):
        return tuple(example_inputs), {}
    if isinstance(example_inputs, dict):
        if not all(isinstance(k, str) for k in example_inputs):
            raise TypeError("example_inputs as a dict must map keyword-argument names (str) to values")
        return (), dict(example_inputs)
    raise TypeError(
        "example_inputs must be a tuple of positional arguments, a dict of keyword arguments, or a "
        f"tensor; got {type(example_inputs).__name__}"
    )


def input_layout(args: tuple, kwargs: dict) -> InputLayout:
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    positions = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor))
    constants = tuple((i, leaf) for i, leaf in enumerate(leaves) if not isinstance(leaf, torch.Tensor))
    return InputLayout(spec, positions, tuple(TensorSpec.of(leaves[i]) for i in positions), constants)
