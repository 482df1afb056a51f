"""Where the native recomputation stops, measured (docs/native.md, "Where the recomputation stops").

nanoGPT (benchmarks/nanogpt.py, one thread, CPU), one region at a time: the predicted peak with the
trace's lifetime tags (profiler/lifetimes.py: the replay ends at the op that packs the last saved
tensor and holds what the program holds there; in-place ops counted once), the prediction the same
graph gives without them (the rule before: the replay ends at the last value a backward op reads),
and the measured peak of one training step (runtime/native.py, allocator events). Also a variant
whose attention deletes ``q, k, v`` after the attention call, so that its replay peaks inside
``scaled_dot_product_attention``'s math path (what its C++ locals hold).

    python benchmarks/native_early_stop.py [--out docs/benchmarks/native-early-stop.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import nanogpt  # noqa: E402
import profiler  # noqa: E402
from planner.files import write_atomic  # noqa: E402
from planner.native_measure import measure_native  # noqa: E402
from planner.native_solve import fixed_bytes, rng_bytes  # noqa: E402
from profiler.lifetimes import LIFETIME_TAGS  # noqa: E402
from solvers.regions import evaluate  # noqa: E402

REGIONS = ("transformer.h.5.attn", "transformer.h.4.attn", "transformer.h.0.attn", "transformer.h.5",
           "transformer.h.5.attn@projections", "transformer.h.5.mlp")


class AttentionReleasingQKV(nanogpt.CausalSelfAttention):
    """nanoGPT's attention with ``del q, k, v`` after the attention call: the fused projection's
    output is released there, and the last block's replay peaks inside SDPA's math path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(batch, tokens, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        del q, k, v
        y = y.transpose(1, 2).contiguous().view(batch, tokens, width)
        return self.resid_dropout(self.c_proj(y))


def releasing_qkv() -> nanogpt.GPT:
    model = nanogpt.nanogpt()
    for block in model.transformer.h:
        released = AttentionReleasingQKV(nanogpt.WIDTH, nanogpt.HEADS, nanogpt.DROPOUT)
        released.load_state_dict(block.attn.state_dict())
        block.attn = released
    return model


def without_lifetimes(graph):
    """The graph as the rule before read it: no lifetime tags."""
    graph = graph.copy()
    for _, data in graph.nodes(data=True):
        for tag in LIFETIME_TAGS:
            data.pop(tag, None)
    return graph


def run() -> list[tuple]:
    torch.set_num_threads(1)
    rows = []
    for name, build, regions in (("nanoGPT", nanogpt.nanogpt, REGIONS),
                                 ("nanoGPT, del q, k, v", releasing_qkv, REGIONS[:2])):
        model, inputs = build(), nanogpt.char_batch()
        graph = profiler.profile(model, inputs, loss_fn=nanogpt.loss, fuse_loss=False).regroup("op").graph
        before = without_lifetimes(graph)
        for region in regions:
            extra = fixed_bytes(graph) + rng_bytes((region,), [])
            predicted = extra + evaluate(graph, (region,)).outcome.peak_bytes
            predicted_before = extra + evaluate(before, (region,)).outcome.peak_bytes
            measured = measure_native(model, (region,), inputs, nanogpt.loss).peak_bytes
            row = (name, region, predicted_before, predicted, measured)
            print(_line(row), flush=True)
            rows.append(row)
    return rows


def _line(row) -> str:
    name, region, before, predicted, measured = row
    return (f"| {name} | {region} | {before:,} | {measured - before:+,} | {predicted:,} | {measured:,} | "
            f"{measured - predicted:+,} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join("docs", "benchmarks", "native-early-stop.md"))
    args = parser.parse_args()
    rows = run()
    header = ("| model | region | predicted before (B) | measured - before | predicted (B) | measured (B) | "
              "measured - predicted |\n|---|---|---|---|---|---|---|\n")
    write_atomic(args.out, "# Where the native recomputation stops: predicted against measured peaks\n\n"
                 f"`python benchmarks/native_early_stop.py`, {datetime.date.today()}, torch {torch.__version__}, "
                 "one thread. One generator state is 5,056 B: a prediction over by that much counts it for "
                 "the whole step (planner/native_solve.py, rng_bytes).\n\n"
                 + header + "".join(_line(row) + "\n" for row in rows))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
