"""The heterogeneous chain model of Beaumont et al. (rotor), as SPEC.md fixes it.

Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal checkpointing for heterogeneous chains:
how to train deep neural networks with limited memory" (2019). Stages ``F_0..F_{L-1}``, then the loss
as stage ``L``:

- ``fw[i]`` (i < L): forward time of stage i; ``bw[i]`` (i <= L): backward time, ``bw[L]`` the loss's.
- ``x[i]`` (i <= L): size of ``x_i``, the input of stage i (its gradient ``y_i`` has the same size).
- ``xbar[i]`` (1 <= i <= L): size of ``x_i`` with everything autograd keeps for the backward of
  stage i-1 (``xbar[0]`` is unused).
- ``ftmp[i]`` (i < L), ``btmp[i]`` (i <= L): transient memory while ``F_i`` and ``B_i`` run.
- ``gout[i]`` (i <= L), an extension (default 0): bytes that ``B_i`` leaves held until the end of
  the step, such as parameter gradients. Real models accumulate them over the backward pass.

A sequence is a list of :class:`Op`: ``CF_i`` (run F_i without grad, keep its input), ``Fn_i``
(without grad, free its input), ``Fe_i`` (with grad, keep ``xbar_{i+1}``), ``L`` (the loss),
``B_i`` (backward of stage i).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

OP_KINDS = ("CF", "Fn", "Fe", "L", "B")


@dataclass(frozen=True, order=True)
class Op:
    """One operation of a chain sequence: ``kind`` in CF, Fn, Fe, L, B and its stage index."""

    kind: str
    stage: int

    def __post_init__(self):
        if self.kind not in OP_KINDS:
            raise ValueError(f"chain op kind is one of {OP_KINDS}, got {self.kind!r}")

    def __str__(self) -> str:
        return "L" if self.kind == "L" else f"{self.kind}_{self.stage}"

    @classmethod
    def parse(cls, text: str, length: int) -> "Op":
        """``"CF_3"`` -> Op("CF", 3); ``"L"`` -> Op("L", length)."""
        if text == "L":
            return cls("L", length)
        kind, _, stage = text.partition("_")
        return cls(kind, int(stage))


@dataclass(frozen=True)
class Chain:
    """Sizes (bytes or any integer unit) and times (seconds or any unit) of a heterogeneous chain."""

    fw: Sequence[float]
    bw: Sequence[float]
    x: Sequence[int]
    xbar: Sequence[int]
    ftmp: Sequence[int]
    btmp: Sequence[int]
    gout: Sequence[int] | None = None

    def __post_init__(self):
        length = len(self.fw)
        expected = {"bw": length + 1, "x": length + 1, "xbar": length + 1, "ftmp": length, "btmp": length + 1}
        if self.gout is not None:
            expected["gout"] = length + 1
        for name, size in expected.items():
            values = getattr(self, name)
            if len(values) != size:
                raise ValueError(f"Chain.{name} has {len(values)} entries; a chain of {length} stages needs {size}")
        for name in ("fw", "bw", "x", "xbar", "ftmp", "btmp", "gout"):
            values = getattr(self, name)
            if values is not None and any(v < 0 for v in values):
                raise ValueError(f"Chain.{name} must be >= 0")
        # Store as tuples so a chain is hashable and cannot change under a solver.
        for name in ("fw", "bw", "x", "xbar", "ftmp", "btmp"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "gout", tuple(self.gout) if self.gout is not None else (0,) * (length + 1))

    @property
    def length(self) -> int:
        """L, the number of stages before the loss."""
        return len(self.fw)

    def makespan(self, sequence: Sequence[Op]) -> float:
        """Sum of the times of all operations of ``sequence``."""
        total = 0.0
        for op in sequence:
            if op.kind in ("CF", "Fn", "Fe"):
                total += self.fw[op.stage]
            else:
                total += self.bw[op.stage]
        return total
