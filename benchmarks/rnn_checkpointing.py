"""What checkpointing can do for a stacked LSTM language model, by hand: docs/zoo.md, "Recurrent networks".

The zoo's ``nn-lstm`` case (benchmarks/zoo.py ``RecurrentLM``: embedding, ``nn.LSTM(32, 64,
num_layers=4, dropout=0.1)``, dropout, head; 8 sequences of 32 tokens). The native executor refuses
it at 50% and 75%: the recurrent network is one module called once, and checkpointing it recomputes
every layer and time step at once in the backward. This script measures (``profiler.measure_step``:
the allocator's events) what the same parameters give when the LSTM is cut into pieces that
``torch.utils.checkpoint`` can recompute one at a time:

- ``layers``: four one-layer ``nn.LSTM`` sharing the stacked one's parameters, ``nn.Dropout`` between
  them (what ``nn.LSTM(num_layers=4, dropout=p)`` computes), each layer checkpointed;
- ``chunks-k``: the sequence cut into ``k`` chunks along time, each chunk through the four layers
  under one checkpoint, the states carried from chunk to chunk. The inter-layer dropout masks are
  then drawn per chunk: other masks than the stacked module's, so the gradients differ.

For each: the peak against the eager step's, the median step time (wall clock; unreliable on a
loaded machine), and the loss and gradients against the stacked module's from the same seed.

``python benchmarks/rnn_checkpointing.py``
"""

from __future__ import annotations

import os
import re
import sys

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import profiler
from benchmarks.zoo import RecurrentLM, _ids, _mse, gradient_difference, training_step


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


def main() -> int:
    torch.manual_seed(0)
    lm = RecurrentLM(nn.LSTM).train()
    inputs = (_ids(8, 32, 64),)
    reference = training_step(lm, inputs, _mse)
    eager = profiler.measure_step(lm, inputs, loss_fn=_mse, repeats=5)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.1f}")
    print("| model | peak B | of eager | step ms | vs eager | same loss | grad max abs diff |")
    print("|---|---:|---:|---:|---:|---|---:|")
    print(f"| eager nn.LSTM(num_layers=4) | {eager.peak_bytes} | 100.0% | {eager.seconds * 1000:.1f} | 1.00x | - | - |")
    for mode, chunks in [("plain", 1), ("layers", 1), ("chunks", 2), ("chunks", 4), ("chunks", 8)]:
        model = SplitLSTM(lm, mode, chunks).train()
        loss, gradients, _ = training_step(model, inputs, _mse)
        diff = gradient_difference(reference[1], stacked_names(gradients))[0]
        measured = profiler.measure_step(model, inputs, loss_fn=_mse, repeats=5)
        name = f"{mode}-{chunks}" if mode == "chunks" else mode
        print(f"| {name} | {measured.peak_bytes} | {measured.peak_bytes / eager.peak_bytes:.1%} | "
              f"{measured.seconds * 1000:.1f} | {measured.seconds / eager.seconds:.2f}x | "
              f"{bool(torch.equal(loss, reference[0]))} | {diff:.3g} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
