"""The chain program over blocks with several options per stage, and its plans lowered to the graph
(the package docstring has the recurrence)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..chain import ChainView
from ..chainmodel import Op
from .blocks import OptionChain

# Memory levels of the program's grid (sizes rounded up to top / LEVELS bytes).
LEVELS = 1500


# -- the program ----------------------------------------------------------------------------------

@dataclass
class _Units:
    """The option chain's sizes in whole units of the grid (rounded up), per stage and option."""

    x: list
    y: list
    xbar: list  # xbar[i][k]: stage i's option k
    ftmp: list
    btmp: list
    fwd_tmp: list
    G: list
    gout: list


@dataclass
class Program:
    """``C(i, l, .)`` over memory levels ``0..M`` of ``unit`` bytes, and the choices: ``-1`` none,
    ``j > i`` option (a) with split ``j``, ``-(k + 2)`` option (b) with the stage's option ``k``."""

    oc: OptionChain
    unit: int
    levels: int
    value: dict
    choice: dict
    sizes: _Units

    def makespan(self, level: int) -> float:
        return float(self.value[0, self.oc.chain.length][level])

    def sequence(self, level: int) -> list[tuple[Op, int]]:
        """The ops of the plan at ``level`` with each forward-with-grad's option (``-1`` otherwise)."""
        out: list[tuple[Op, int]] = []
        self._unfold(0, self.oc.chain.length, level, out)
        return out

    def _unfold(self, i: int, l: int, m: int, out: list) -> None:
        length = self.oc.chain.length
        if i > l:  # C(l+1, l): nothing to do (y_{l+1} is held); before the loss's test: (L, L-1) is empty too
            return
        if i == length:
            out.append((Op("L", length), -1))
            return
        c = int(self.choice[i, l][m])
        if c == -1:
            raise AssertionError("hierarchical: unfolding an infeasible cell")
        u = self.sizes
        if c <= -2:
            k = -c - 2
            out.append((Op("Fe", i), k))
            self._unfold(i + 1, l, m - u.x[i] - u.xbar[i][k] + u.x[i + 1], out)
            out.append((Op("B", i), k))
            return
        out.append((Op("CF", i), -1))
        for s in range(i + 1, c):
            out.append((Op("Fn", s), -1))
        self._unfold(c, l, m - u.x[i], out)
        self._unfold(i, c - 1, m, out)


def _units(oc: OptionChain, unit: int) -> _Units:
    up = lambda b: -(-int(b) // unit)  # noqa: E731 (sizes rounded up: plans fit in bytes)
    chain, length = oc.chain, oc.chain.length
    x = [up(v) for v in oc.x] + [0]
    y = [up(v) for v in oc.y] + [0]
    gout = [up(v) for v in chain.gout]
    G = [0] * (length + 2)
    for i in range(length, -1, -1):
        G[i] = G[i + 1] + gout[i]
    return _Units(x, y, [[up(o.xbar) for o in oc.options[i]] for i in range(length)],
                  [[up(o.ftmp) for o in oc.options[i]] for i in range(length)],
                  [[up(o.btmp) for o in oc.options[i]] for i in range(length)] + [[up(oc.btmp_loss)]],
                  [up(v) for v in oc.fwd_tmp], G, gout)


def solve_program(oc: OptionChain, top: int, levels: int = LEVELS, unit: int | None = None) -> Program:
    """``C(i, l, m)`` for every level up to ``top`` bytes (module docstring), vectorised over ``m``."""
    chain, length = oc.chain, oc.chain.length
    unit = unit if unit is not None else max(1, -(-int(top) // levels))
    M = int(top) // unit
    u = _units(oc, unit)
    fw = list(chain.fw)
    bws = [[o.bw for o in oc.options[i]] for i in range(length)] + [[chain.bw[length]]]
    value: dict = {}
    choice: dict = {}
    inf = math.inf

    def shifted(array: np.ndarray, shift: int) -> np.ndarray:
        """array[m - shift] for every m (inf where out of range)."""
        out = np.full(M + 1, inf)
        if shift >= 0:
            if shift <= M:
                out[shift:] = array[: M + 1 - shift]
        else:
            out[: M + 1 + shift] = array[-shift:]
        return out

    zero = np.zeros(M + 1)
    for span in range(0, length + 1):
        for i in range(length - span, -1, -1):
            l = i + span
            if l > length:
                continue
            best = np.full(M + 1, inf)
            pick = np.full(M + 1, -1, dtype=np.int32)
            if i == length:  # the loss
                need = u.x[length] + u.y[length] + u.G[length] + u.btmp[length][0]
                best[need:] = chain.bw[length]
                pick[need:] = -2
                value[i, l], choice[i, l] = best, pick
                continue
            tail = u.y[l + 1] + u.G[l + 1]  # y_{l+1} and the gradients left by the stages after l
            for k in range(len(oc.options[i])):  # (b) the stage's option k
                xbar, ftmp, btmp = u.xbar[i][k], u.ftmp[i][k], u.btmp[i][k]
                need = max(u.x[i] + tail + xbar + ftmp, u.x[i] + xbar + u.y[i + 1] + u.y[i] + u.G[i] + btmp)
                rest = zero if i + 1 > l else value[i + 1, l]
                candidate = fw[i] + bws[i][k] + shifted(rest, u.x[i] + xbar - u.x[i + 1])
                candidate[: min(need, M + 1)] = inf
                better = candidate < best
                best[better] = candidate[better]
                pick[better] = -(k + 2)
            forward = 0.0  # (a) checkpoint x_i, forwards without grad to x_j
            scratch = u.x[i] + tail + u.x[i + 1] + u.fwd_tmp[i]
            for j in range(i + 1, l + 1):
                forward += fw[j - 1]
                if j - 1 > i:
                    scratch = max(scratch, u.x[i] + tail + u.x[j - 1] + u.x[j] + u.fwd_tmp[j - 1])
                candidate = forward + shifted(value[j, l], u.x[i]) + value[i, j - 1]
                candidate[: min(scratch, M + 1)] = inf
                better = candidate < best
                best[better] = candidate[better]
                pick[better] = j
            value[i, l], choice[i, l] = best, pick
    return Program(oc, unit, M, value, choice, u)


# -- lowering -------------------------------------------------------------------------------------

def lower(view: ChainView, oc: OptionChain, sequence: list[tuple[Op, int]]) -> list:
    """The graph computations of a sequence with options: a backward with option ``k`` first
    recomputes that option's nodes (the forward's other results are freed at their last use)."""
    before = [[] if op.kind in ("CF", "Fn", "Fe", "L") else oc.options[op.stage][k].recompute for op, k in sequence]
    return view.computes([op for op, _ in sequence], before)
