"""What checkpointing can do for a stacked recurrent language model: docs/zoo.md, "Recurrent networks".

The zoo's ``nn-lstm`` and ``nn-gru`` cases (benchmarks/zoo_models.py ``RecurrentLM``: embedding,
``nn.LSTM(32, 64, num_layers=4, dropout=0.1)`` or the same ``nn.GRU``, dropout, head; 8 sequences of
32 tokens). A stacked RNN is one module called once, and checkpointing it whole recomputes every
layer and time step at once in the backward. Measured (``profiler.measure_step``: the allocator's
events) for each way of cutting it:

- by hand (LSTM only), ``layers``: four one-layer ``nn.LSTM`` sharing the stacked one's parameters,
  ``nn.Dropout`` between them, each layer checkpointed; ``chunks-k``: the sequence cut into ``k``
  chunks along time, each chunk through the four layers under one checkpoint, the states carried.
  The inter-layer dropout masks are then drawn per chunk: other masks than the stacked module's, so
  the gradients differ;
- ``native``: ``planner.plan`` (its stacked RNN run as per-layer stages, runtime/rnn.py) at 50%,
  75% and at the least budget its search names, applied with ``planner.apply``; and with the opt-in
  time chunks (``install_rnn_stages(model, time_chunks=k)`` before ``planner.profile_for``) at their
  least.

For each: the peak against the eager step's; the median CPU time of a training step (one thread)
and, stepped alternately with the eager model, the median ratio to it (CPU time, because wall-clock
times on a machine other jobs load varied by 2-10x between runs); the loss and gradients against the
stacked module's from the same seed.

``python benchmarks/rnn_checkpointing.py [--cell lstm|gru|both]``
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
import re
import sys

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import profiler
from benchmarks.zoo import gradient_difference, training_step
from benchmarks.zoo_models import RecurrentLM, _ids, _mse


class SplitLSTM(nn.Module):
    """``lm`` with its stacked LSTM run as one-layer LSTMs on the same parameters.

    ``mode``: ``"plain"`` (no checkpoint: the split alone), ``"layers"`` (each layer checkpointed)
    or ``"chunks"`` (``chunks`` pieces of the sequence, each through every layer as one checkpoint)."""

    def __init__(self, lm: RecurrentLM, mode: str, chunks: int = 1):
        super().__init__()
        if mode not in ("plain", "layers", "chunks"):
            raise ValueError(f"mode {mode!r} is not plain, layers or chunks")
        self.embed, self.drop, self.head = lm.embed, lm.drop, lm.head
        rnn = lm.rnn
        self.layers = nn.ModuleList()
        for i in range(rnn.num_layers):
            layer = nn.LSTM(rnn.input_size if i == 0 else rnn.hidden_size, rnn.hidden_size, batch_first=True)
            for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                setattr(layer, f"{kind}_l0", getattr(rnn, f"{kind}_l{i}"))  # shared, not copied
            self.layers.append(layer)
        self.between = nn.Dropout(rnn.dropout)
        self.mode, self.chunks = mode, chunks

    def _stack(self, x, states):
        new_states = []
        for i, layer in enumerate(self.layers):
            if i:
                x = self.between(x)
            x, state = layer(x, states[i] if states else None)
            new_states.append(state)
        return x, new_states

    def _chunk(self, part, *flat):
        states = [(flat[2 * i], flat[2 * i + 1]) for i in range(len(self.layers))] if flat else None
        y, new_states = self._stack(part, states)
        return (y, *[t for pair in new_states for t in pair])

    def forward(self, ids):
        x = self.embed(ids)
        if self.mode == "plain":
            x = self._stack(x, None)[0]
        elif self.mode == "layers":
            for i, layer in enumerate(self.layers):
                if i:
                    x = self.between(x)
                x = checkpoint(lambda t, lstm=layer: lstm(t)[0], x, use_reentrant=False)
        else:
            outputs, flat = [], ()
            for part in x.chunk(self.chunks, dim=1):
                y, *flat = checkpoint(self._chunk, part, *flat, use_reentrant=False)
                outputs.append(y)
            x = torch.cat(outputs, dim=1)
        return self.head(self.drop(x))


def stacked_names(gradients: dict) -> dict:
    """``layers.i.weight_ih_l0`` -> ``rnn.weight_ih_li``: the split model's gradients by the stacked one's names."""
    return {re.sub(r"^layers\.(\d+)\.(\w+)_l0$", r"rnn.\2_l\1", name): g for name, g in gradients.items()}


def paired_ratio(model: nn.Module, eager: nn.Module, inputs, rounds: int = 9) -> tuple[float, float]:
    """(median CPU seconds of a training step of ``model``, median over rounds of its CPU time /
    ``eager``'s), the two stepped alternately. CPU time of the process (``time.process_time``; run
    with one thread, ``main`` sets it): on a machine other jobs load, wall-clock times of the same
    step varied by 2-10x between runs, CPU time much less."""
    def step(m):
        for p in m.parameters():
            p.grad = None
        started = time.process_time()
        _mse(m(*inputs)).backward()
        return time.process_time() - started

    step(model), step(eager)  # warm-up
    times, ratios = [], []
    for _ in range(rounds):
        mine, theirs = step(model), step(eager)
        times.append(mine)
        ratios.append(mine / theirs)
    for m in (model, eager):
        for p in m.parameters():
            p.grad = None
    return statistics.median(times), statistics.median(ratios)


def native_rows(lm: nn.Module, inputs, reference, eager, cell: str) -> list[tuple]:
    """The native executor's plans of ``lm`` (its stacked RNN as per-layer stages, runtime/rnn.py): at
    50% and 75%, at the least budget it reaches, and with the opt-in time chunks at theirs. Each:
    (name, regions, measured peak, step seconds, same loss, max |grad diff| against ``reference``)."""
    import planner
    from runtime.rnn import install_rnn_stages

    rows = []
    for chunks in (1, 4, 8):
        target = copy.deepcopy(lm)  # the plans are applied to copies: lm stays the stacked reference
        install_rnn_stages(target, time_chunks=chunks)  # what plan() does for chunks=1, profiled once here
        profile = planner.profile_for(target, inputs, loss_fn=_mse)
        budgets = ["50%", "75%", None] if chunks == 1 else [None]
        for budget in budgets:
            if budget is None:  # the least: the search's least predicted peak, planned for and measured
                for low in ("10%", "20%", "30%", "40%"):  # below the parameters alone: no least is named
                    try:
                        planner.plan(target, inputs, low, loss_fn=_mse, profile=profile)
                        raise AssertionError(f"{low} of eager planned")
                    except planner.BudgetInfeasible as error:
                        budget = error.min_budget
                    if budget is not None:
                        break
            # The least named by a refusal leaves out the generator states the checkpoints save: a
            # little more is asked when it is refused.
            asked = [budget] if isinstance(budget, str) else [int(budget * f) for f in (1.0, 1.02, 1.05, 1.1, 1.15)]
            plan = None
            for budget in asked:
                try:
                    plan = planner.plan(target, inputs, budget, loss_fn=_mse, profile=profile)
                    break
                except planner.BudgetInfeasible as error:
                    refusal = str(error)
            if plan is None:
                rows.append((f"native {budget}{f', {chunks} time chunks' if chunks > 1 else ''}",
                             "refused: " + refusal[:100], None, None, None, None, None))
                continue
            model = copy.deepcopy(lm)
            planner.apply(model, plan)
            loss, gradients, _ = training_step(model, inputs, _mse)
            diff = gradient_difference(reference[1], gradients)[0]
            measured = profiler.measure_step(model, inputs, loss_fn=_mse, repeats=1)
            name = budget if isinstance(budget, str) else f"least ({budget} B asked)"
            rows.append((f"native {name}{f', {chunks} time chunks' if chunks > 1 else ''}",
                         ", ".join(plan.regions), measured.peak_bytes, *paired_ratio(model, lm, inputs),
                         bool(torch.equal(loss, reference[0])), diff))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", choices=("lstm", "gru", "both"), default="both")
    args = parser.parse_args(argv)
    cells = ["lstm", "gru"] if args.cell == "both" else [args.cell]
    torch.set_num_threads(1)  # step times are CPU times (paired_ratio)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread; load average {os.getloadavg()[0]:.1f}")
    for cell in cells:
        torch.manual_seed(0)
        lm = RecurrentLM(nn.LSTM if cell == "lstm" else nn.GRU).train()
        inputs = (_ids(8, 32, 64),)
        reference = training_step(lm, inputs, _mse)
        eager = profiler.measure_step(lm, inputs, loss_fn=_mse, repeats=1)
        name = "nn.LSTM" if cell == "lstm" else "nn.GRU"
        print(f"\n{name}(32, 64, num_layers=4, dropout=0.1), 8 x 32 tokens\n")
        print("| model | checkpointed | peak B | of eager | step CPU ms | vs eager | same loss | grad max abs diff |")
        print("|---|---|---:|---:|---:|---:|---|---:|")
        print(f"| eager {name}(num_layers=4) | - | {eager.peak_bytes} | 100.0% | "
              f"{paired_ratio(lm, lm, inputs)[0] * 1000:.1f} | 1.00x | - | - |", flush=True)
        rows = []
        if cell == "lstm":  # by hand: the stacked LSTM split into one-layer LSTMs
            for mode, chunks in [("plain", 1), ("layers", 1), ("chunks", 2), ("chunks", 4), ("chunks", 8)]:
                model = SplitLSTM(lm, mode, chunks).train()
                loss, gradients, _ = training_step(model, inputs, _mse)
                diff = gradient_difference(reference[1], stacked_names(gradients))[0]
                measured = profiler.measure_step(model, inputs, loss_fn=_mse, repeats=1)
                label = f"by hand: {mode}-{chunks}" if mode == "chunks" else f"by hand: {mode}"
                rows.append((label, "see above", measured.peak_bytes, *paired_ratio(model, lm, inputs),
                             bool(torch.equal(loss, reference[0])), diff))
        rows += native_rows(lm, inputs, reference, eager, cell)
        for label, regions, peak, seconds, ratio, same, diff in rows:
            if peak is None:
                print(f"| {label} | {regions} | | | | | | |", flush=True)
                continue
            print(f"| {label} | {regions} | {peak} | {peak / eager.peak_bytes:.1%} | {seconds * 1000:.1f} | "
                  f"{ratio:.2f}x | {same} | {diff:.3g} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
