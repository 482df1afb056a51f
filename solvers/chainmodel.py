"""The heterogeneous chain model of Beaumont et al. (rotor), as docs/contract.md ("The chain
model") fixes it.

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

from dataclasses import dataclass, replace
from collections.abc import Sequence

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


# -- the model's memory semantics ------------------------------------------------------------------
#
# Everything below executes a sequence exactly as the dynamic program in solvers/dp.py assumes it
# runs; the DP is tested against an exhaustive search over these moves.


@dataclass(frozen=True)
class ChainState:
    """What is held between two operations, as bit masks over stage indices (bit i = stage i).

    ``plain``: ``x_i`` held on its own (size ``x[i]``). ``full``: ``xbar_i`` held (size ``xbar[i]``;
    it contains ``x_i``, so ``x_i`` is then available without further bytes). ``grad``: ``y_i`` held
    (size ``x[i]``). ``done``: ``B_i`` (or the loss, bit L) has run, so ``gout[i]`` is held.
    ``kept``: the ``x_i`` held on their own that are checkpoints (a ``CF_i`` has read them, or
    ``x_0``): they stay held until ``B_i``.
    """

    plain: int = 1  # x_0, the input, is held from the start...
    full: int = 0
    grad: int = 0
    done: int = 0
    kept: int = 1  # ...until B_0

    def has_x(self, i: int) -> bool:
        return bool((self.plain | self.full) >> i & 1)

    def memory(self, chain: Chain) -> int:
        """Bytes (or units) held in this state."""
        total = 0
        for i in range(chain.length + 1):
            bit = 1 << i
            total += chain.x[i] * (bool(self.plain & bit) + bool(self.grad & bit))
            total += chain.xbar[i] * bool(self.full & bit) + chain.gout[i] * bool(self.done & bit)
        return total


class ChainMoveError(ValueError):
    """An operation whose inputs are not held (or whose result already is)."""


def op_time(chain: Chain, op: Op) -> float:
    return chain.fw[op.stage] if op.kind in ("CF", "Fn", "Fe") else chain.bw[op.stage]


def apply_op(chain: Chain, state: ChainState, op: Op) -> tuple[ChainState, int]:
    """Run ``op`` from ``state``: returns (state after, memory while ``op`` runs).

    Raises :class:`ChainMoveError` when ``op`` cannot run from ``state``. See
    :func:`simulate_chain` for the rules.
    """
    after, during, _ = step(chain, state, op, state.memory(chain))
    return after, during


def step(chain: Chain, state: ChainState, op: Op, held: int) -> tuple[ChainState, int, int]:
    """:func:`apply_op` given the memory ``held`` in ``state``: also returns the memory after
    ``op``, so that a whole sequence runs in time linear in its length."""
    i, length = op.stage, chain.length
    if not 0 <= i <= length or (op.kind == "L") != (i == length):
        raise ChainMoveError(f"{op}: no such operation on a chain of {length} stages")
    bit, nxt = 1 << i, 1 << (i + 1)
    if not state.has_x(i):
        raise ChainMoveError(f"{op} needs x_{i}, which is not held")
    if op.kind in ("CF", "Fn", "Fe"):
        if state.has_x(i + 1):
            raise ChainMoveError(f"{op} would compute x_{i + 1}, which is already held")
        if op.kind == "Fe":
            return replace(state, full=state.full | nxt), held + chain.xbar[i + 1] + chain.ftmp[i], held + chain.xbar[i + 1]
        during = held + chain.x[i + 1] + chain.ftmp[i]
        if op.kind == "CF":
            kept = state.kept | (state.plain & bit)
            return replace(state, plain=state.plain | nxt, kept=kept), during, held + chain.x[i + 1]
        if not state.plain & bit:
            raise ChainMoveError(f"{op} frees x_{i}, which is held only inside xbar_{i}: use CF_{i}")
        if state.kept & bit:
            raise ChainMoveError(f"{op} frees x_{i}, a checkpoint, which stays held until B_{i}")
        return replace(state, plain=(state.plain & ~bit) | nxt), during, held - chain.x[i] + chain.x[i + 1]
    if state.done & bit:
        raise ChainMoveError(f"{op} has already run")
    if op.kind == "B" and not (state.full & nxt and state.grad & nxt):
        raise ChainMoveError(f"{op} needs xbar_{i + 1} and y_{i + 1}")
    during = held + chain.x[i] + chain.gout[i] + chain.btmp[i]
    freed = chain.x[i] if state.plain & bit else 0
    if op.kind == "B":
        freed += chain.xbar[i + 1] + chain.x[i + 1]  # xbar_{i+1} and y_{i+1}
    after = ChainState(
        plain=state.plain & ~bit,
        full=state.full & ~nxt,
        grad=(state.grad & ~nxt) | bit,
        done=state.done | bit,
        kept=state.kept & ~bit,
    )
    return after, during, held - freed + chain.x[i] + chain.gout[i]


@dataclass(frozen=True)
class ChainSimulation:
    """Outcome of :func:`simulate_chain`: ``peak`` and ``makespan`` cover the operations run up to
    the first fault; ``error`` names it (None when ``valid``); ``final`` is the state at the end."""

    valid: bool
    peak: int
    makespan: float
    error: str | None = None
    final: ChainState | None = None

    def __bool__(self) -> bool:
        return self.valid


def simulate_chain(chain: Chain, sequence: Sequence[Op], budget: int | None = None) -> ChainSimulation:
    """Execute ``sequence`` under the chain model; return validity, peak memory and makespan.

    Memory accounting (sizes in the chain's unit, bytes or any integer unit):

    - Held values: ``x_i`` on its own (``x[i]``), ``xbar_i`` (``xbar[i]``, which contains ``x_i``),
      ``y_i`` (``x[i]``), and ``gout[i]`` for every ``B_i`` (or the loss) that has run. Memory at
      any moment is the sum over what is held. At the start only ``x_0`` is held, and it counts:
      the peak is at least ``x[0]``.
    - ``CF_i`` (i < L) reads ``x_i`` (on its own or inside ``xbar_i``) and produces ``x_{i+1}``;
      ``Fn_i`` does the same and then frees ``x_i`` (which must be held on its own); while either
      runs, memory is held + ``x[i+1] + ftmp[i]``.
    - Persistence: an ``x_i`` that ``CF_i`` has read is a checkpoint and stays held until ``B_i``
      (``Fn_i`` may not free it); so is ``x_0``. Beaumont et al.'s program is optimal among such
      sequences only: freeing a checkpoint during a later recomputation and recomputing it again
      can be cheaper on heterogeneous chains (tests/test_dp.py has an example).
    - ``Fe_i`` reads ``x_i`` and produces ``xbar_{i+1}``; while it runs: held + ``xbar[i+1] + ftmp[i]``.
      A forward never recomputes an ``x_{i+1}`` that is still held (alone or inside ``xbar_{i+1}``).
    - ``L`` reads ``x_L`` and produces ``y_L``; ``B_i`` (i < L) reads ``x_i``, ``xbar_{i+1}`` and
      ``y_{i+1}`` and produces ``y_i``. While either runs: held + ``x[i] + gout[i] + btmp[i]``
      (``y_i``, the bytes it leaves held for good, its scratch). Afterwards ``xbar_{i+1}`` and
      ``y_{i+1}`` are freed, ``x_i`` too if held on its own (inside ``xbar_i`` it stays, for
      ``B_{i-1}``), and ``gout[i]`` stays held to the end. Each backward runs once.
    - Valid when every operation finds its inputs and ``y_0`` is held at the end (so every backward
      ran), and, with a ``budget``, the peak is at most ``budget``. Makespan: the sum of ``fw[i]``
      over forwards and ``bw[i]`` over ``L`` and the ``B_i``.

    With ``gout`` all zero this is the model of Beaumont et al.: ``xbar_{i+1}`` is kept from
    ``Fe_i`` to ``B_i``, and during ``B_i`` memory holds ``x_i, xbar_{i+1}, y_{i+1}, y_i`` and
    ``btmp[i]``.
    """
    state = ChainState()
    peak = chain.x[0]
    makespan = 0.0

    def outcome(error: str | None) -> ChainSimulation:
        return ChainSimulation(error is None, peak, makespan, error, state)

    if budget is not None and peak > budget:
        return outcome(f"x_0 alone needs {peak}, over the budget {budget}")
    held = peak
    for position, op in enumerate(sequence):
        try:
            state, during, held = step(chain, state, op, held)
        except ChainMoveError as fault:
            return outcome(f"operation {position}: {fault}")
        peak = max(peak, during)
        makespan += op_time(chain, op)
        if budget is not None and during > budget:
            return outcome(f"operation {position} ({op}) needs {during}, over the budget {budget}")
    if not state.grad & 1:
        return outcome("the sequence ends before y_0 is computed")
    return outcome(None)
