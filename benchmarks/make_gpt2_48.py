"""Profile a 48-layer GPT-2 (the 12-layer benchmark model of make_graphs.py, four times deeper) and
save its module-level cost graph for benchmarks/solvers.py ("a 12-layer and a 48-layer
GPT-2 module graph certified within 1% of an order-free bound").

    python benchmarks/make_gpt2_48.py [--granularity module:3]

Writes benchmarks/graphs/gpt2-48-<granularity without the colon>.json (costs measured on this machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import profiler  # noqa: E402
from planner.files import write_atomic  # noqa: E402
from planner.planfile import graph_to_dict  # noqa: E402

LAYERS = 48


def gpt2(layers: int = LAYERS):
    """The benchmark GPT-2 (make_graphs.py's configuration) with ``layers`` blocks: model, inputs, loss."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=128, n_head=4, vocab_size=2048, n_positions=128, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    ids = torch.randint(0, 2048, (2, 128))
    return model, {"input_ids": ids, "labels": ids}, lambda out: out.loss


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--granularity", default="module:3")
    args = parser.parse_args(argv)
    model, inputs, loss_fn = gpt2()
    graph = profiler.profile(model, inputs, loss_fn=loss_fn, granularity=args.granularity).graph
    label = graph.graph["granularity"].replace(":", "")
    path = os.path.join(HERE, "graphs", f"gpt2-{LAYERS}-{label}.json")
    write_atomic(path, json.dumps(graph_to_dict(graph)))
    print(f"{path}: {graph.number_of_nodes()} nodes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
