"""The two engines that evaluate the recurrence of :mod:`solvers.dp` (its docstring has the
recurrence and the model): sizes and keys in exact integer units, the *grid* (``C(i, l, .)`` as an
array over memory levels, vectorised over the split) and the *fronts* (``C(i, l, .)`` as its exact
step function of memory), and the unfolding of a plan into its chain sequence."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .chainmodel import Chain, Op


# -- sizes and keys ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sizes:
    """The chain's sizes as integers in one unit, and the memory thresholds of the recurrence.

    ``x`` has ``L + 2`` entries (``x[L+1] = 0``); ``G[k] = gout[k] + ... + gout[L]`` (``G[L+1] = 0``).
    """

    length: int
    x: np.ndarray
    xbar: np.ndarray
    ftmp: np.ndarray
    btmp: np.ndarray
    gout: np.ndarray
    G: np.ndarray

    @property
    def loss_need(self) -> int:
        """Memory for op L: x_L, y_L, gout[L] and btmp[L] (no backward has run before it)."""
        length = self.length
        return int(2 * self.x[length] + self.G[length] + self.btmp[length])

    def shift_b(self, i: int) -> int:
        """What option (b) sets aside from its child's memory: x_i and xbar_{i+1} minus x_{i+1}."""
        return int(self.x[i] + self.xbar[i + 1] - self.x[i + 1])

    def backward_need(self, i: int) -> int:
        """Memory while B_i runs: x_i, xbar_{i+1}, y_{i+1}, y_i, G[i] (gout[i] included), btmp[i]."""
        return int(2 * self.x[i] + self.xbar[i + 1] + self.x[i + 1] + self.G[i] + self.btmp[i])


def _integral(values: Sequence, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
        raise ValueError(f"Chain.{name} must be whole numbers (bytes or another integer unit)")
    return array.astype(np.int64)


def _sizes(chain: Chain, unit: int = 1, down: bool = False) -> _Sizes:
    """Sizes in ``unit``, rounded up (a plan that fits in units fits in the chain's unit), or with
    ``down`` rounded down (every sequence that fits in the chain's unit fits in units: a relaxation,
    whose optimum bounds the exact one from below)."""
    length = chain.length

    def rounded(values, name):
        exact = _integral(values, name)
        return exact // unit if down else -(-exact // unit)

    x = np.append(rounded(chain.x, "x"), 0)
    xbar = rounded(chain.xbar, "xbar")
    if np.any(xbar[1:] < x[1 : length + 1]):
        raise ValueError("Chain.xbar[i] includes x_i, so it must be >= x[i] (i >= 1)")
    xbar[0] = 0
    gout = rounded(chain.gout, "gout")
    G = np.append(np.cumsum(gout[::-1])[::-1], 0)
    return _Sizes(length, x, xbar, rounded(chain.ftmp, "ftmp"), rounded(chain.btmp, "btmp"), gout, G)


def _need_table(sz: _Sizes) -> np.ndarray:
    """need[i, l] (l > i): memory below which sub-chain (i, l) is infeasible, because one run of
    each of F_i .. F_{l-1} happens while x_i and y_{l+1} (and G[l+1]) are held."""
    length = sz.length
    need = np.zeros((length + 1, length + 1), dtype=np.int64)
    run = sz.x[:length] + sz.x[1 : length + 1] + sz.ftmp  # F_k between x_k and x_{k+1}, k < L
    for i in range(length):
        # Widest forward among F_i (its input x_i is counted apart) and F_{i+1} .. F_{l-1}.
        widest = np.maximum.accumulate(np.concatenate(([sz.x[i + 1] + sz.ftmp[i]], run[i + 1 : length])))
        need[i, i + 1 :] = sz.x[i] + sz.x[i + 2 :] + sz.G[i + 2 :] + widest
    return need


def _option_b_table(sz: _Sizes, need: np.ndarray) -> np.ndarray:
    """need_b[i, l]: memory below which option (b) of sub-chain (i, l) is infeasible (i < L)."""
    length = sz.length
    need_b = np.zeros((length + 1, length + 1), dtype=np.int64)
    for i in range(length):
        grad_forward = sz.x[i] + sz.x[i + 1 :] + sz.G[i + 1 :] + sz.xbar[i + 1] + sz.ftmp[i]  # l = i..L
        need_b[i, i:] = np.maximum(np.maximum(grad_forward, sz.backward_need(i)), need[i, i:])
    return need_b


@dataclass(frozen=True)
class _Bounds:
    """Per sub-chain memory bounds, in the sizes' unit.

    ``need``/``need_b``: below them the sub-chain / its option (b) is infeasible (local checks);
    ``least``: the exact least memory of the sub-chain (the recurrence in (min, max));
    ``full``: the memory of its plan without recomputation (Fe everywhere), from which on the
    sub-chain's value is that plan's key, the least of all.
    """

    need: np.ndarray
    need_b: np.ndarray
    least: np.ndarray
    full: np.ndarray

    @property
    def stride(self) -> int:
        """More than any memory a front holds plus any shift (fronts stop at ``full``)."""
        return 2 * int(self.full.max()) + 1


def _bounds(sz: _Sizes) -> _Bounds:
    length = sz.length
    need = _need_table(sz)
    need_b = _option_b_table(sz, need)
    # Scalars as Python ints (numpy scalar arithmetic is slow); option (a)'s rows as numpy arrays.
    need_list, need_b_list, x = need.tolist(), need_b.tolist(), sz.x.tolist()
    shift_b = [sz.shift_b(i) for i in range(length)]
    least = np.zeros_like(need)  # [i, l]
    least_by_end = np.zeros_like(need)  # [l, j] = least[j, l], so option (a)'s rows are contiguous
    full = [[0] * (length + 1) for _ in range(length + 1)]
    for l in range(length + 1):
        least_i = least_by_end[l]
        for i in range(l, -1, -1):
            if i == length:
                value = full[i][l] = sz.loss_need
            elif i == l:
                value = full[i][l] = need_b_list[i][l]
            else:
                full[i][l] = max(need_b_list[i][l], full[i + 1][l] + shift_b[i])
                split = int(np.maximum(least_i[i + 1 : l + 1] + x[i], least[i, i:l]).min())
                value = min(max(need_b_list[i][l], int(least_i[i + 1]) + shift_b[i]), max(need_list[i][l], split))
            least[i, l] = least_i[i] = value
    return _Bounds(need, need_b, least, np.array(full, dtype=np.int64))


@dataclass(frozen=True)
class _Keys:
    """Integer-valued float64 keys: ``ticks(time) * count_base + forward ops`` per operation."""

    fw: np.ndarray
    bw: np.ndarray
    prefix: np.ndarray  # prefix[k] = fw keys of stages 0..k-1
    count_base: int
    bw_prefix: np.ndarray  # bw_prefix[k] = bw keys of stages 0..k-1

    def no_recomputation(self, i: int, l: int) -> float:
        """Key of sub-chain (i, l) run with every forward once: F_i .. F_{min(l, L-1)}, B_i .. B_l."""
        forwards = self.prefix[min(l + 1, len(self.fw))] - self.prefix[i]
        return float(forwards + self.bw_prefix[l + 1] - self.bw_prefix[i])


def _keys(chain: Chain) -> _Keys:
    length = chain.length
    fw = np.asarray(chain.fw, dtype=float)
    bw = np.asarray(chain.bw, dtype=float)
    most_forwards = length * (length + 1) // 2 + length + 1
    count_base = 1 << most_forwards.bit_length()
    # A DP sequence runs each forward at most L+1 times: bound its makespan, then pick a power-of-two
    # tick so that every key stays below 2**52 (exact in float64, with room for one sum).
    worst = float(bw.sum() + (length + 1) * fw.sum())
    ticks_available = 2.0**52 / count_base
    tick = 2.0 ** math.ceil(math.log2(worst / ticks_available)) if worst > 0 else 1.0
    fw_key = np.round(fw / tick) * count_base + 1
    bw_key = np.round(bw / tick) * count_base
    prefix = np.concatenate(([0.0], np.cumsum(fw_key)))
    return _Keys(fw_key, bw_key, prefix, count_base, np.concatenate(([0.0], np.cumsum(bw_key))))


# -- the grid engine ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Grid:
    """``value[i, l, m] = C(i, l, m) + prefix[i]`` for m = 0..levels, as keys (inf: infeasible).

    Adding ``prefix[i]`` (the forward keys of stages 0..i-1) folds option (a)'s forward run into
    the table: ``prefix[j] - prefix[i] + C(j, l) + C(i, j-1) = value[j, l] + value[i, j-1] -
    prefix[i]``, and option (b) becomes ``value[i+1, l] + bw[i]``. One table, one add per split.
    The choices are not stored: :meth:`choice_at` re-evaluates the few cells a plan visits.
    """

    value: np.ndarray  # [i, l, m]
    levels: int
    sizes: _Sizes
    keys: _Keys
    need_b: np.ndarray

    def choice_at(self, i: int, l: int, m: int) -> int:
        """The option the fill took at (i, l, m): i for (b) (and the loss), j for (a), -1 if none."""
        m = min(m, self.levels)
        best = self.value[i, l, m]
        if not np.isfinite(best):
            return -1
        sz = self.sizes
        if i == sz.length or i == l:
            return i
        shift = sz.shift_b(i)
        if m >= max(int(self.need_b[i, l]), shift) and self.value[i + 1, l, m - shift] + self.keys.bw[i] == best:
            return i  # the fill keeps (b) on ties
        shift = int(sz.x[i])
        candidates = self.value[i + 1 : l + 1, l, m - shift] + self.value[i, i:l, m]
        return i + 1 + int(np.argmin(candidates))


def _grid_tables(sz: _Sizes, keys: _Keys, levels: int, bounds: _Bounds) -> _Grid:
    """Fill the table for all sub-chains: l up, and for each l, i down, so that the children
    (j, l), j > i, and (i, l'), l' < l, come first, and the rows (., l) that option (a) reads for
    every i stay in cache. Each row is computed only between the sub-chain's least memory (inf
    below) and the memory of its plan without recomputation (constant above)."""
    length, top = sz.length, levels + 1
    value = np.empty((length + 1, length + 1, top))  # every row used is written in full below
    scratch = np.empty((length, top))
    for l in range(length + 1):
        for i in range(l, -1, -1):
            row = value[i, l]
            low, high = min(int(bounds.least[i, l]), top), min(int(bounds.full[i, l]), top)
            row[:low] = np.inf
            row[high:] = keys.no_recomputation(i, l) + keys.prefix[i]
            if low < high:
                row[low:high] = np.inf
                _grid_option_b(sz, keys, bounds.need_b, value, i, l, row, low, high)
                if l > i:
                    _grid_option_a(sz, keys, value, scratch, i, l, row, low, high)
    return _Grid(value, levels, sz, keys, bounds.need_b)


def _grid_option_b(sz, keys, need_b, value, i, l, row, low, high) -> None:
    """Fe_i, (i+1, l), B_i, written into ``row[low:high]`` where it is feasible."""
    shift = sz.shift_b(i)
    start = max(int(need_b[i, l]), shift, low)
    if start >= high:
        return
    if l == i:
        row[start:high] = keys.prefix[i] + keys.fw[i] + keys.bw[i]
    else:
        np.add(value[i + 1, l, start - shift : high - shift], keys.bw[i], out=row[start:high])


def _grid_option_a(sz, keys, value, scratch, i, l, row, low, high) -> None:
    """min over j of CF_i Fn_{i+1..j-1}, (j, l), (i, j-1), where it beats ``row[low:high]``."""
    shift = int(sz.x[i])  # low >= need[i, l] >= x[i]
    candidates = scratch[: l - i, : high - low]
    np.add(value[i + 1 : l + 1, l, low - shift : high - shift], value[i, i:l, low:high], out=candidates)
    best = np.minimum.reduce(candidates, axis=0)
    best -= keys.prefix[i]
    np.minimum(row[low:high], best, out=row[low:high])


# -- the exact engine: step functions of memory ---------------------------------------------------


@dataclass(frozen=True)
class _Front:
    """A non-increasing step function of memory: value ``key[p]`` on ``[mem[p], mem[p+1])``, inf
    below ``mem[0]``; ``choice[p]`` is the option that achieves it (as in :class:`_Grid`)."""

    mem: np.ndarray  # int64, strictly increasing
    key: np.ndarray  # float64, strictly decreasing
    choice: np.ndarray  # int32

    def at(self, m: np.ndarray) -> np.ndarray:
        if len(self.mem) == 0:  # infeasible at every memory considered
            return np.full(np.shape(m), np.inf)
        position = np.searchsorted(self.mem, m, side="right") - 1
        return np.where(position >= 0, self.key[np.maximum(position, 0)], np.inf)

    def index(self, m: int) -> int:
        return int(np.searchsorted(self.mem, m, side="right")) - 1


_EMPTY_CHILD = _Front(np.zeros(1, dtype=np.int64), np.zeros(1), np.zeros(1, dtype=np.int32))


def _lower_envelope(mems: list, keys: list, choices: list, top: int | None) -> _Front:
    """The pointwise min of step functions given by their points: a point (m, k) means "value k from
    m on", so the min at m is the least key among points at or below m (a running min). Points
    above ``top`` are dropped: sub-chains are only ever read at memories up to the budget."""
    mem = np.concatenate(mems)
    key = np.concatenate(keys)
    choice = np.concatenate(choices)
    finite = np.isfinite(key) if top is None else np.isfinite(key) & (mem <= top)
    mem, key, choice = mem[finite], key[finite], choice[finite]
    order = np.lexsort((key, mem))
    mem, key, choice = mem[order], key[order], choice[order]
    running = np.minimum.accumulate(key)
    keep = np.ones(len(key), dtype=bool)
    keep[1:] = key[1:] < running[:-1]  # strictly better than everything at or below its memory
    return _Front(mem[keep], key[keep], choice[keep].astype(np.int32))


def _front_cell(sz: _Sizes, keys: _Keys, bounds: _Bounds, fronts: dict, i: int, l: int, top: int | None) -> _Front:
    length = sz.length
    if i == length:
        return _Front(np.array([sz.loss_need], dtype=np.int64), np.array([keys.bw[length]]), np.array([length], dtype=np.int32))
    mems, values, choices = [], [], []
    # (b) Fe_i, (i+1, l), B_i: the child's steps shifted, and nothing below (b)'s own needs.
    child = fronts[i + 1, l] if l > i else _EMPTY_CHILD
    mems.append(np.maximum(child.mem + sz.shift_b(i), int(bounds.need_b[i, l])))
    values.append(child.key + (keys.fw[i] + keys.bw[i]))
    choices.append(np.full(len(child.mem), i, dtype=np.int32))
    if l > i:
        steps, value, split = _option_a_points(sz, keys, bounds, fronts, i, l)
        mems.append(steps)
        values.append(value)
        choices.append(split)
    return _lower_envelope(mems, values, choices, top)


def _option_a_points(sz: _Sizes, keys: _Keys, bounds: _Bounds, fronts: dict, i: int, l: int):
    """Option (a) for every split j at once: C(j, l, m - x_i) + C(i, j-1, m) + the prefix's key,
    at every step of either summand (a step of the sum is a step of one of them).

    The splits' fronts are laid end to end with ``segment * stride`` added to their memories, so
    that one ``searchsorted`` evaluates every split's summands at its own points.
    """
    shift, floor = int(sz.x[i]), int(bounds.need[i, l])
    splits = range(i + 1, l + 1)
    tails = [fronts[j, l] for j in splits]
    heads = [fronts[i, j - 1] for j in splits]
    tail_sizes = np.array([len(f.mem) for f in tails])
    head_sizes = np.array([len(f.mem) for f in heads])
    stride = np.int64(bounds.stride)
    segments = np.arange(len(tails), dtype=np.int64)
    tail_at = np.concatenate([f.mem for f in tails]) + shift + np.repeat(segments, tail_sizes) * stride
    head_at = np.concatenate([f.mem for f in heads]) + np.repeat(segments, head_sizes) * stride
    tail_key = np.concatenate([f.key for f in tails])
    head_key = np.concatenate([f.key for f in heads])
    # Query points: every step of both summands, raised to the sub-chain's floor.
    query_segment = np.concatenate((np.repeat(segments, tail_sizes), np.repeat(segments, head_sizes)))
    base = query_segment * stride
    query = base + np.maximum(np.concatenate((tail_at, head_at)) - base, floor)
    value = _segment_lookup(tail_at, tail_key, query, base) + _segment_lookup(head_at, head_key, query, base)
    value += (keys.prefix[i + 1 : l + 1] - keys.prefix[i])[query_segment]
    return query - base, value, (query_segment + i + 1).astype(np.int32)


def _segment_lookup(at: np.ndarray, key: np.ndarray, query: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Value of the step function whose points are ``at`` (segment-encoded) at each query, inf where
    the query's segment has no point at or below it."""
    if len(at) == 0:
        return np.full(len(query), np.inf)
    position = np.searchsorted(at, query, side="right") - 1
    safe = np.maximum(position, 0)
    return np.where((position >= 0) & (at[safe] >= base), key[safe], np.inf)


@dataclass(frozen=True)
class _Fronts:
    fronts: dict

    def choice_at(self, i: int, l: int, m: int) -> int:
        front = self.fronts[i, l]
        position = front.index(m)
        return int(front.choice[position]) if position >= 0 else -1


def _front_tables(sz: _Sizes, keys: _Keys, bounds: _Bounds, top: int | None = None) -> _Fronts:
    """Every sub-chain's step function, exact; only up to memory ``top`` when given (cheaper)."""
    fronts: dict = {}
    for i in range(sz.length, -1, -1):
        for l in range(i, sz.length + 1):
            fronts[i, l] = _front_cell(sz, keys, bounds, fronts, i, l, top)
    return _Fronts(fronts)


# -- sequences --------------------------------------------------------------------------------------


def _sequence(choice_at: Callable[[int, int, int], int], sz: _Sizes, memory: int) -> list[Op]:
    """Unfold the choices of sub-chain (0, L) at ``memory`` into operations (iteratively: chains
    can be deeper than Python's recursion limit)."""
    length = sz.length
    ops: list[Op] = []
    pending: list = [(0, length, memory)]  # a stack: sub-problems to unfold and ops to emit
    while pending:
        item = pending.pop()
        if isinstance(item, Op):
            ops.append(item)
            continue
        i, l, m = item
        j = choice_at(i, l, m)
        if j < 0:
            raise AssertionError(f"dp: sub-chain ({i}, {l}) has no plan at memory {m}")
        if i == length:
            ops.append(Op("L", length))
        elif j == i:
            ops.append(Op("Fe", i))
            pending.append(Op("B", i))
            if l > i:
                pending.append((i + 1, l, m - sz.shift_b(i)))
        else:
            ops.append(Op("CF", i))
            ops.extend(Op("Fn", k) for k in range(i + 1, j))
            pending.append((i, j - 1, m))
            pending.append((j, l, m - int(sz.x[i])))
    return ops
