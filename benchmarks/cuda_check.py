"""The CUDA path, checked on a GPU: profiling with CUDA events, plans' predicted peaks against
``torch.cuda.max_memory_allocated``, gradients and step times of both executors, torch.compile.

For each model and budget: the plan (native by default, traced with ``dp``), then an independent
measurement of the planned step (profiler.measure_step: a warm-up step, then the peak of one step
from the allocator's high-water mark, parameters and inputs included) and the gradients of one
step against the un-planned model's on the same RNG seed (dropout on).

    python benchmarks/cuda_check.py [--out docs/benchmarks/cuda.md] [--quick]

Needs a CUDA device; prints a table and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import planner  # noqa: E402
import profiler  # noqa: E402
from profiler.capture import default_loss  # noqa: E402
from profiler.inputs import normalise_inputs  # noqa: E402
from profiler.memory import measure_step  # noqa: E402
from runtime.native import remove_native  # noqa: E402
from tables import markdown_table, publish  # noqa: E402

MiB = 2**20


def _gpt2(layers, width, heads, vocab, tokens, batch):
    from examples import gpt2

    def build():
        return gpt2.build_model(layers=layers, width=width, heads=heads, vocab=vocab, tokens=tokens)

    def inputs():
        return gpt2.example_inputs(batch=batch, tokens=tokens, vocab=vocab)

    return build, inputs, gpt2.loss_fn


def _example(name):
    module = __import__(f"examples.{name}", fromlist=["build_model"])
    return module.build_model, module.example_inputs, getattr(module, "loss_fn", None)


def cases(quick: bool):
    found = [
        ("bundled GPT-2 (6x256, batch 4x128)", _example("gpt2"), ["100%", "60%", "45%"]),
        ("MLP example", _example("mlp"), ["60%"]),
        ("CNN example (batch norm)", _example("cnn"), ["75%"]),
    ]
    if not quick:
        found.append(("GPT-2 small (12x768, batch 8x512)", _gpt2(12, 768, 12, 50257, 512, 8), ["100%", "60%", "40%"]))
    return found


def _to(value, device):
    return torch.utils._pytree.tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, value)


def _loss(loss_fn, output):
    return loss_fn(output) if loss_fn else default_loss(output)


def gradients(model, inputs, loss_fn, seed=0) -> dict[str, torch.Tensor]:
    """One step's gradients on RNG seed ``seed`` (dropout masks repeat across calls)."""
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    args, kwargs = normalise_inputs(inputs)
    _loss(loss_fn, model(*args, **kwargs)).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    for p in model.parameters():
        p.grad = None
    return grads


def max_relative_difference(a: dict, b: dict) -> float:
    worst = 0.0
    for name, g in a.items():
        scale = g.abs().max().item() or 1.0
        worst = max(worst, (g - b[name]).abs().max().item() / scale)
    return worst


def compiled_step_seconds(model, inputs, loss_fn, repeats=10) -> tuple[float, int]:
    """Median step time of ``torch.compile(model)`` and the number of graphs dynamo compiled."""
    import torch._dynamo

    torch._dynamo.reset()
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        from torch._inductor.compile_fx import compile_fx
        return compile_fx(gm, example_inputs)

    compiled = torch.compile(model, backend=counting_backend)
    measured = measure_step(compiled, inputs, loss_fn, repeats=repeats)
    return measured.seconds, len(graphs)


def run_case(name, build, make_inputs, loss_fn, budgets, device, rows, compile_check, executors):
    model = build().to(device)
    inputs = _to(make_inputs(), device)
    eager = measure_step(model, inputs, loss_fn, repeats=10)
    reference = gradients(model, inputs, loss_fn)
    started = time.perf_counter()
    profile = profiler.profile(model, inputs, loss_fn=loss_fn, fuse_loss=False)
    profile_seconds = time.perf_counter() - started
    predicted_store_all = profile.graph.graph.get("fixed_bytes", 0)
    print(f"{name}: eager peak {eager.peak_bytes / MiB:.1f} MiB, step {eager.seconds * 1e3:.2f} ms; "
          f"profiled in {profile_seconds:.1f} s ({profile.graph.number_of_nodes()} nodes, fixed "
          f"{predicted_store_all / MiB:.1f} MiB)", flush=True)
    rows.append((name, "eager", "-", "-", f"{eager.peak_bytes / MiB:.1f}", "-", f"{eager.seconds * 1e3:.2f}",
                 "1.000", "-", "-"))
    for budget in budgets:
        for executor, solver in executors:
            try:
                started = time.perf_counter()
                plan = planner.plan(model, inputs, budget, solver=solver, loss_fn=loss_fn, executor=executor)
                plan_seconds = time.perf_counter() - started
            except Exception as error:  # a refusal is a result too
                rows.append((name, executor, budget, f"refused: {type(error).__name__}", "-", "-", "-", "-", "-", "-"))
                print(f"  {executor} {budget}: {type(error).__name__}: {str(error)[:200]}", flush=True)
                continue
            planned = planner.apply(model, plan)
            try:
                measured = measure_step(planned, inputs, loss_fn, repeats=10)
                diff = max_relative_difference(reference, gradients(planned, inputs, loss_fn))
                compiled = ""
                if compile_check and executor == "native":
                    seconds, graphs = compiled_step_seconds(planned, inputs, loss_fn)
                    compiled = f"{seconds * 1e3:.2f} ms, {graphs} graphs"
            finally:
                if executor == "native":
                    remove_native(model)
            error_pct = (measured.peak_bytes - plan.predicted_peak_bytes) / plan.predicted_peak_bytes
            over = measured.peak_bytes - plan.budget_bytes
            rows.append((name, executor, budget, f"{plan.predicted_peak_bytes / MiB:.1f}",
                         f"{measured.peak_bytes / MiB:.1f}", f"{error_pct:+.2%}",
                         f"{measured.seconds * 1e3:.2f}", f"{measured.seconds / eager.seconds:.3f}",
                         f"{diff:.1e}", compiled or f"planned in {plan_seconds:.1f} s"))
            print(f"  {executor} {budget}: budget {plan.budget_bytes / MiB:.1f} MiB, predicted "
                  f"{plan.predicted_peak_bytes / MiB:.1f}, measured {measured.peak_bytes / MiB:.1f} ({error_pct:+.2%}; "
                  f"{'within' if over <= 0 else 'OVER'} budget), step {measured.seconds * 1e3:.2f} ms "
                  f"({measured.seconds / eager.seconds:.3f}x eager), grad diff {diff:.1e}, {compiled} "
                  f"planned in {plan_seconds:.1f} s", flush=True)
    if compile_check:
        seconds, graphs = compiled_step_seconds(model, inputs, loss_fn)
        rows.append((name, "eager, torch.compile", "-", "-", "-", "-", f"{seconds * 1e3:.2f}",
                     f"{seconds / eager.seconds:.3f}", "-", f"{graphs} graphs"))
        print(f"  eager compiled: {seconds * 1e3:.2f} ms, {graphs} graphs", flush=True)


HEADER = ("model", "executor", "budget", "predicted MiB", "measured MiB", "measured vs predicted",
          "step ms", "step / eager", "max rel. grad diff", "notes")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true", help="skip GPT-2 small")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--executors", default="native,traced", help="native (solver auto), traced (solver dp)")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of this script itself")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("cuda_check: no CUDA device", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    device_name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    print(f"{device_name}, torch {torch.__version__}", flush=True)
    rows: list[tuple] = []
    for name, (build, make_inputs, loss_fn), budgets in cases(args.quick):
        executors = [(e, {"native": "auto", "traced": "dp"}[e]) for e in args.executors.split(",")]
        run_case(name, build, make_inputs, loss_fn, budgets, device, rows, not args.no_compile, executors)
    text = (f"Device: {device_name}, torch {torch.__version__}. Command: "
            f"`python benchmarks/cuda_check.py`.\n\n{markdown_table(HEADER, rows)}\n")
    publish(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
