"""Profile the models whose cost graphs benchmarks/solvers.py solves, and save the graphs as JSON.

    python benchmarks/make_graphs.py [--only gpt2-48]

The graphs (structure, measured costs on this machine, bytes) are committed under
benchmarks/graphs/ so that the solver benchmark needs no torch and solves the same graphs every time.
The jobs vgg16, vgg19, fcn8, segnet and vgg-unet are the CNNs of Checkmate's evaluation (Jain et al.,
MLSys 2020; benchmarks/mlsys_models.py) at one node per layer or block: 53-80 nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# The project's packages before this folder: benchmarks/solvers.py must not shadow the solvers package.
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import profiler  # noqa: E402
from mlsys_models import MLSYS_MODELS, images  # noqa: E402
from models import BENCHMARKS, UNet, image_batch  # noqa: E402
from planner.files import write_atomic  # noqa: E402
from planner.planfile import graph_to_dict  # noqa: E402


def gpt2(layers: int):
    """The benchmark GPT-2 (width 128, 4 heads, 2x128 tokens) with ``layers`` blocks: model, inputs, loss."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=128, n_head=4, vocab_size=2048, n_positions=128, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    ids = torch.randint(0, 2048, (2, 128))
    return model, {"input_ids": ids, "labels": ids}, lambda out: out.loss


# Checkmate's CNNs: batch of 32 images (32 pixels square) and the module depth that makes each graph
# 45-80 nodes (measured: vgg16 59, vgg19 68, fcn8 80 at one node per layer; segnet 53 and vgg-unet 56
# at one node per block of 2-3 layers, whose per-layer graphs, module:3, have 100 and 91).
MLSYS_BATCH = 32
MLSYS_GRANULARITY = "module:2"
# They are profiled on one thread: on this 2-core machine under other jobs' load, two-thread ops
# stalled for tens of milliseconds (the cross-entropy loss measured 24-88 ms, against 0.1-1.1 ms on
# one thread), which made the loss half of a graph's cost.
MLSYS_THREADS = 1


def mlsys(name: str):
    """One of Checkmate's CNNs (benchmarks/mlsys_models.py) with its inputs and loss."""
    build, loss = MLSYS_MODELS[name]
    return build(), images(MLSYS_BATCH), loss


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated job names (gpt2-12, gpt2-48, unet, resnet-mlp, "
                                                   "vgg16, vgg19, fcn8, segnet, vgg-unet)")
    args = parser.parse_args(argv)
    # name -> (model, inputs and loss; the granularities to save; torch threads while profiling, None: as set)
    jobs = {
        "gpt2-12": (lambda: gpt2(12), ["module", "module:3"], None),
        # "A 12-layer and a 48-layer GPT-2 module graph certified within 1%": four times deeper.
        "gpt2-48": (lambda: gpt2(48), ["module:3"], None),
        "unet": (lambda: (UNet(), image_batch(batch=4, size=64), BENCHMARKS["unet"].loss_fn), ["module"], None),
        "resnet-mlp": (lambda: (BENCHMARKS["residual-mlp"].build(), BENCHMARKS["residual-mlp"].inputs(),
                                BENCHMARKS["residual-mlp"].loss_fn), ["module"], None),
        **{name: (lambda name=name: mlsys(name), [MLSYS_GRANULARITY], MLSYS_THREADS) for name in MLSYS_MODELS},
    }
    only = [name for name in args.only.split(",") if name]
    unknown = sorted(set(only) - set(jobs))
    if unknown:
        parser.error(f"unknown job(s) {', '.join(unknown)}; the jobs are {', '.join(jobs)}")
    for name, (build, granularities, threads) in jobs.items():
        if only and name not in only:
            continue
        model, inputs, loss_fn = build()
        prof = profile_on(threads, model, inputs, loss_fn, granularities[0])
        for granularity in granularities:
            graph = prof.graph if granularity == granularities[0] else prof.regroup(granularity).graph
            label = graph.graph["granularity"].replace(":", "")
            path = os.path.join(HERE, "graphs", f"{name}-{label}.json")
            write_atomic(path, json.dumps(graph_to_dict(graph)))
            print(f"{path}: {graph.number_of_nodes()} nodes", flush=True)
    return 0


def profile_on(threads: int | None, model, inputs, loss_fn, granularity: str) -> profiler.Profile:
    """profiler.profile on ``threads`` torch threads (None: as set), the setting restored after."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return profiler.profile(model, inputs, loss_fn=loss_fn, granularity=granularity)
    finally:
        torch.set_num_threads(before)


if __name__ == "__main__":
    sys.exit(main())
