"""Save policies at tight budgets: native plans with every policy against plans with ``matmuls`` only.

For the benchmark GPT-2 (benchmarks/models.py ``gpt2``), BERT (``bert``) and a small Llama
(``LlamaForCausalLM``: 4 layers, hidden 256, 8 heads, intermediate 688, vocab 8192, its default
``attention_dropout=0.0``), each with the attention implementation it gets by default on CPU
(``sdpa``) and with ``attn_implementation="eager"``, on ``token_batch()`` (4 x 256 tokens), at 40%,
50% and 60% (the Llama at 70% and 80% too): the native planner (``planner.native.plan_native``, what
``planner.plan`` runs) once with every policy of solvers/regions/policies.py ``SAVE_POLICIES`` and once with
``matmuls`` alone (``policies=("matmuls",)``). Both on one profile per model (``planner.profile_for``).

Reported: the regions; the predicted and measured peak (the plan's own measurement,
``profiler.measure_step`` of one step); the predicted step over the predicted un-checkpointed step;
the measured step over eager's: CPU time (``time.process_time``, one torch thread: the machine is
shared and wall-clock times of one step vary by several times under load), each configuration
stepped in turn, the median of ``--rounds`` rounds.

``python benchmarks/policies.py [--rounds 3] [--out docs/benchmarks/policies.md]``
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]  # the repository first: benchmarks/solvers.py is not the solvers package

import torch  # noqa: E402

import planner  # noqa: E402
from planner.budget import parse_budget  # noqa: E402
from planner.native import plan_native  # noqa: E402
from planner.files import write_atomic  # noqa: E402
from runtime.native import apply_native, remove_native  # noqa: E402
from solvers import Infeasible  # noqa: E402
from solvers.regions import SAVE_POLICIES  # noqa: E402

import models  # noqa: E402  (benchmarks/models.py)

BUDGETS = ("40%", "50%", "60%")
# The Llama's least is at 60% (eager attention) and 67% (sdpa) of its eager peak: 70% and 80% too.
MORE_BUDGETS = {"llama": ("70%", "80%")}
SHORT = {"transformer.": "", "bert.encoder.layer.": "layer.", "model.layers.": "layers."}


def _loss(output):
    return output.loss


def gpt2(attention: str | None):
    model = models.gpt2()
    if attention:
        model.set_attn_implementation(attention)
    return model


def bert(attention: str | None):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=6, hidden_size=256, num_attention_heads=8, intermediate_size=1024,
                        vocab_size=8192, max_position_embeddings=256,
                        **({"attn_implementation": attention} if attention else {}))
    return BertForMaskedLM(config)


def llama(attention: str | None):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=8, num_key_value_heads=8,
                         intermediate_size=688, vocab_size=8192, max_position_embeddings=256, use_cache=False,
                         **({"attn_implementation": attention} if attention else {}))
    model = LlamaForCausalLM(config)
    model.loss_type = "ForCausalLM"
    return model


CASES = [(name, build, attention) for name, build in (("gpt2", gpt2), ("bert", bert), ("llama", llama))
         for attention in (None, "eager")]


def short(region: str) -> str:
    """``"transformer.h.3@projections"`` -> ``"h.3@P"``."""
    for prefix, replacement in SHORT.items():
        if region.startswith(prefix):
            region = replacement + region[len(prefix):]
    return region.replace("@projections", "@P").replace("@matmuls", "@M")


def plan(model, inputs, budget: str, profile, policies: tuple[str, ...] | None):
    """The native planner (planner.native.plan_native, as planner.plan calls it), with only
    ``policies`` offered to the search when given (None: all); a refusal is returned."""
    try:
        return plan_native(model, inputs, parse_budget(budget), loss_fn=_loss, profile=profile,
                           policies=tuple(SAVE_POLICIES) if policies is None else policies)
    except Infeasible as error:
        return error


def cpu_step(model, inputs) -> float:
    """CPU seconds of one training step (gradients dropped first)."""
    for parameter in model.parameters():
        parameter.grad = None
    started = time.process_time()
    _loss(model(**inputs)).backward()
    return time.process_time() - started


def step_ratios(model, inputs, configurations: list[tuple[str, ...]], rounds: int) -> dict:
    """Median over ``rounds`` of each configuration's CPU step over eager's (the configurations and
    eager stepped in turn, each round)."""
    ratios: dict[tuple[str, ...], list[float]] = {c: [] for c in configurations}
    cpu_step(model, inputs)  # warm-up
    for _ in range(rounds):
        eager = cpu_step(model, inputs)
        for regions in configurations:
            apply_native(model, regions)
            try:
                ratios[regions].append(cpu_step(model, inputs) / eager)
            finally:
                remove_native(model)
    for parameter in model.parameters():
        parameter.grad = None
    return {c: statistics.median(r) for c, r in ratios.items()}


def run_case(name: str, build, attention: str | None, rounds: int) -> list[dict]:
    model = build(attention).train()
    inputs = models.token_batch()
    used = model.config._attn_implementation
    profile = planner.profile_for(model, inputs, loss_fn=_loss)
    rows = []
    for budget in BUDGETS + MORE_BUDGETS.get(name, ()):
        for label, policies in (("all", None), ("matmuls", ("matmuls",))):
            made = plan(model, inputs, budget, profile, policies)
            rows.append({"model": name, "attention": used, "budget": budget, "policies": label, "plan": made})
            print(f"{name} {used} {budget} {label}: {_describe(made)}", flush=True)
    configurations = list(dict.fromkeys(tuple(r["plan"].regions) for r in rows
                                        if not isinstance(r["plan"], Exception) and r["plan"].regions))
    ratios = step_ratios(model, inputs, configurations, rounds)
    for row in rows:
        made = row["plan"]
        if not isinstance(made, Exception):
            row["measured_ratio"] = ratios.get(tuple(made.regions), 1.0)
    return rows


def _describe(made) -> str:
    if isinstance(made, Exception):
        return f"refused ({made})"
    return f"{len(made.regions)} regions {', '.join(short(r) for r in made.regions)}"


def _mib(value: int | None) -> str:
    return "" if value is None else f"{value / 2**20:.1f}"


def table(rows: list[dict]) -> list[str]:
    lines = ["| model | attention | budget (MiB) | policies | regions | predicted peak (MiB) | measured peak (MiB) "
             "| predicted step (x un-checkpointed) | measured step (x eager, CPU) |",
             "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for row in rows:
        made = row["plan"]
        head = f"| {row['model']} | {row['attention']} | {row['budget']}"
        if isinstance(made, Exception):
            least = getattr(made, "min_budget", None)
            lines.append(f"{head} | {row['policies']} | refused (least predicted {_mib(least)} MiB) | | | | |")
            continue
        regions = ", ".join(short(r) for r in made.regions) or "none"
        lines.append(
            f"{head} ({_mib(made.budget_bytes)}) | {row['policies']} | {regions} | {_mib(made.predicted_peak_bytes)} | "
            f"{_mib(made.measured_peak_bytes)} | {made.predicted_seconds / made.unplanned_seconds:.3f} | "
            f"{row['measured_ratio']:.3f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="*", default=["gpt2", "bert", "llama"])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks", "policies.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # step times are CPU times (step_ratios); the op times of the profile too
    started_load = os.getloadavg()
    print(f"torch {torch.__version__}, 1 thread; policies {', '.join(SAVE_POLICIES)}; load average "
          f"{started_load[0]:.1f}", flush=True)
    rows = []
    for name, build, attention in CASES:
        if name in args.models:
            rows += run_case(name, build, attention, args.rounds)
    lines = table(rows)
    print("\n".join(lines))
    ended_load = os.getloadavg()
    header = [
        "# Save policies at tight budgets",
        "",
        f"`python benchmarks/policies.py --rounds {args.rounds}` ({datetime.date.today()}, torch {torch.__version__}, "
        f"one thread, load average {started_load[0]:.1f} at the start and {ended_load[0]:.1f} at the end, 2 cores "
        "shared with other jobs). Each model planned with every save policy (`all`) and with `matmuls` alone, on one "
        "profile; budgets as `planner.plan`'s `\"N%\"`, of the eager step's measured peak. Regions: `h.3` a "
        "block checkpointed whole, `@M` under `matmuls`, `@P` under `projections`, `+draws` keeping dropout's "
        "random draws as well (solvers/regions/policies.py "
        "SAVE_POLICIES; docs/native.md, \"Save policies\"). Measured peak: the plan's own measurement (one step, "
        "the allocator's events). Measured step: CPU time over eager's, stepped in turn, median of the rounds.",
        "",
    ]
    if args.out:
        write_atomic(args.out, "\n".join(header + lines) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
