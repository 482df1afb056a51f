"""Planning what does not fit, on a GPU made smaller (docs/profiler.md, "Planning what does not fit").

``torch.cuda.set_per_process_memory_fraction`` caps what the caching allocator may reserve: the
GPU's stand-in for a smaller device, as an address-space cap is the CPU's (tests/capped.py). Each
case runs in its own process (a fresh allocator):

- ``unplanned``: the GPT-2's un-checkpointed step and AdamW iteration, measured without a cap; the
  cap is then half the step's peak (the step needs twice the cap), the budget 80% of the cap;
- ``plan``: under the cap, ``planner.plan(..., budget, optimizer="adamw")`` with the device memory
  read from the allocator (the fraction's share); the saved plan, loaded and applied, trains three
  AdamW iterations (nanoGPT's groups) under the cap, their peak from ``max_memory_allocated``; the
  same step unplanned is then tried under the cap (it must run out of memory);
- ``max-batch``: under the cap, ``plan-checkpoints MODEL.py --max-batch --budget B``; the batch it
  finds trains three SGD steps under the cap, their peak against the budget;
- ``oom``: a cap below one op of the step: the command line says "out of memory on cuda", exit 3.

    python benchmarks/cuda_bounded.py [--out docs/benchmarks/cuda-bounded.md] [--device cpu]

``--device cpu`` is a smoke run of this script (small sizes, no cap: the device memory is given).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.append(os.path.join(ROOT, "tests"))  # tests/iterations.py: the nanoGPT-like loop the CPU tests train

import torch  # noqa: E402

from iterations import nanogpt_adamw  # noqa: E402

MiB = 2**20
# A GPT-2 whose activations dwarf its parameters (vocabulary 1000), with layers enough that one
# layer's activations are a small share of the step (the budget is 40% of it).
SIZES = {"cuda": dict(layers=8, width=256, heads=4, vocab=1000, tokens=1024, batch=16),
         "cpu": dict(layers=4, width=64, heads=2, vocab=1000, tokens=128, batch=16)}

MODEL_FILE = """
import sys
sys.path.insert(0, {root!r})
from examples import gpt2

def build_model():
    return gpt2.build_model(layers={layers}, width={width}, heads={heads}, vocab={vocab}, tokens={tokens})

def example_inputs():
    return gpt2.example_inputs(batch={batch}, tokens={tokens}, vocab={vocab})

def loss_fn(output):
    return output.loss
"""


# -- inside a case's process ------------------------------------------------------------------------
def _model_and_inputs(device: str, batch: int | None = None):
    from examples import gpt2

    sizes = dict(SIZES[device])
    batch = batch or sizes.pop("batch")
    sizes.pop("batch", None)
    model = gpt2.build_model(layers=sizes["layers"], width=sizes["width"], heads=sizes["heads"],
                             vocab=sizes["vocab"], tokens=sizes["tokens"]).to(device)
    inputs = gpt2.example_inputs(batch=batch, tokens=sizes["tokens"], vocab=sizes["vocab"])
    return model, {k: v.to(device) for k, v in inputs.items()}


def _cap(device: str, cap_bytes: int) -> int | None:
    """Cap the allocator at ``cap_bytes`` on CUDA (returns None: the planner reads it); on CPU the
    device memory to give the planner instead."""
    if device != "cuda":
        return cap_bytes
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(cap_bytes / total)
    return None


def _peak_of(fn, device: str, model=None, inputs=None):
    """(fn's result, the most bytes allocated while it ran, what was allocated before included)."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        result = fn()
        torch.cuda.synchronize()
        return result, torch.cuda.max_memory_allocated()
    from profiler.allocations import allocated_while
    from profiler.memory import resident_bytes

    result = []
    peak, _ = allocated_while(lambda: result.append(fn()))
    return result[0], resident_bytes(model, list(inputs.values())) + peak


def _iterations(model, optimizer, inputs, count: int = 3) -> list[float]:
    """``count`` iterations, the output dropped once its loss is read (as the published run did;
    tests/iterations.py's train_step holds it through the backward, as nanoGPT does)."""
    losses = []
    for _ in range(count):
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def case_unplanned(device: str, **_) -> dict:
    model, inputs = _model_and_inputs(device)
    _, step_peak = _peak_of(lambda: model(**inputs).loss.backward(), device, model, inputs)
    model.zero_grad(set_to_none=True)
    losses, iteration_peak = _peak_of(lambda: _iterations(model, nanogpt_adamw(model), inputs), device, model, inputs)
    return dict(step_peak=step_peak, iteration_peak=iteration_peak, losses=losses)


def case_plan(device: str, cap: int, budget: int, scratch: str, **_) -> dict:
    import planner
    from runtime.native import remove_native

    model, inputs = _model_and_inputs(device)
    given = _cap(device, cap)
    from planner.bounded import device_memory_of

    seen = device_memory_of(model, inputs, given)
    started = time.perf_counter()
    made, planning_peak = _peak_of(lambda: planner.plan(model, inputs, budget, loss_fn=lambda o: o.loss,
                                                        optimizer="adamw", device_memory=given), device, model, inputs)
    planning_seconds = time.perf_counter() - started
    path = os.path.join(scratch, "plan.json")
    made.save(path)
    summary = dict(predicted=made.predicted_peak_bytes, measured=made.measured_peak_bytes,
                   unplanned_peak=made.unplanned_peak_bytes, unplanned_predicted=made.unplanned_peak_predicted,
                   regions=len(made.regions), status=made.status)
    del made
    gc.collect()
    plan = planner.load(path)
    planner.apply(model, plan)
    losses, iteration_peak = _peak_of(lambda: _iterations(model, nanogpt_adamw(model), inputs), device, model, inputs)
    remove_native(model)
    try:
        model(**inputs).loss.backward()
        unplanned = "fits"
    except torch.OutOfMemoryError:
        unplanned = "out of memory"
    except RuntimeError as error:
        unplanned = "out of memory" if "can't allocate memory" in str(error) else str(error)[:200]
    return dict(summary, device_memory=seen, planning_seconds=planning_seconds, planning_peak=planning_peak,
                iteration_peak=iteration_peak, losses=losses, unplanned=unplanned)


def _model_file(scratch: str, device: str, batch: int) -> str:
    sizes = dict(SIZES[device], batch=batch)
    path = os.path.join(scratch, "model.py")
    with open(path, "w") as handle:
        handle.write(MODEL_FILE.format(root=ROOT, **sizes))
    return path


def _command_line(args: list[str]) -> tuple[int, str]:
    from planner.cli.command import main

    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        code = main(args)
    return code, errors.getvalue()


def case_max_batch(device: str, cap: int, budget: int, scratch: str, **_) -> dict:
    import planner

    path, out = _model_file(scratch, device, batch=8), os.path.join(scratch, "batch.json")
    given = _cap(device, cap)
    device_memory = [] if given is None else ["--device-memory", str(given)]
    started = time.perf_counter()
    code, errors = _command_line([path, "--budget", str(budget), "--max-batch", "--solver", "dp", "--device", device,
                                  "--out", out, "-q", *device_memory])
    planning_seconds = time.perf_counter() - started
    if code != 0:
        return dict(code=code, errors=errors[-2000:])
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    plan = planner.load(out)
    from planner.cli.maxbatch import scale_inputs

    batch = int(plan.inputs[0].split("[")[1].split(",")[0])
    model, inputs = _model_and_inputs(device, 8)
    inputs = scale_inputs(inputs, batch)  # as --max-batch made them (input_ids and labels no longer one tensor)
    planned = planner.apply(model, plan)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # no state: the iteration's peak is the step's
    losses, peak = _peak_of(lambda: _iterations(planned, optimizer, inputs), device, model, inputs)
    return dict(code=code, batch=batch, predicted=plan.predicted_peak_bytes, unplanned_peak=plan.unplanned_peak_bytes,
                planning_seconds=planning_seconds, peak=peak, losses=losses)


def case_oom(device: str, cap: int, budget: int, scratch: str, **_) -> dict:
    path, out = _model_file(scratch, device, batch=SIZES[device]["batch"]), os.path.join(scratch, "oom.json")
    given = _cap(device, cap)
    device_memory = [] if given is None else ["--device-memory", str(given)]
    code, errors = _command_line([path, "--budget", str(budget), "--device", device, "--out", out, "-q",
                                  *device_memory])
    lines = [line for line in errors.splitlines() if line.startswith("plan-checkpoints: error:")]
    return dict(code=code, errors=lines, traceback="Traceback" in errors, wrote=os.path.exists(out))


CASES = {"unplanned": case_unplanned, "plan": case_plan, "max-batch": case_max_batch, "oom": case_oom}


# -- the orchestrating process ----------------------------------------------------------------------
def run_case(name: str, device: str, scratch: str, cap: int = 0, budget: int = 0, timeout: float = 300) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, __file__, "--case", name, "--device", device, "--cap", str(cap),
                           "--budget", str(budget), "--scratch", scratch], capture_output=True, text=True,
                          timeout=timeout, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return dict(failed=done.returncode, stderr=done.stderr[-3000:])
    return json.loads(lines[-1][len("RESULT "):])


def _mib(value) -> str:
    return "-" if value is None else f"{value / MiB:.1f}"


def rows_of(results: dict, cap: int, budget: int) -> list[tuple]:
    unplanned, plan, batch, oom = (results[k] for k in ("unplanned", "plan", "max-batch", "oom"))
    rows = [("un-checkpointed step / AdamW iteration (no cap)", "-", _mib(unplanned["step_peak"]) + " / "
             + _mib(unplanned["iteration_peak"]), "-", "-")]
    if "failed" in plan:
        rows.append(("plan under the cap, AdamW", _mib(budget), "failed", plan["stderr"][-300:], "-"))
    else:
        rows.append(("plan under the cap, AdamW (planning's own peak)", _mib(budget), _mib(plan["planning_peak"]),
                     f"predicted {_mib(plan['predicted'])}, the planner measured {_mib(plan['measured'])}",
                     f"planned in {plan['planning_seconds']:.1f} s; device memory read {_mib(plan['device_memory'])}"))
        rows.append(("the saved plan: 3 AdamW iterations under the cap", _mib(budget), _mib(plan["iteration_peak"]),
                     f"losses {', '.join(f'{x:.3f}' for x in plan['losses'])}",
                     f"unplanned under the cap: {plan['unplanned']}"))
    if batch.get("code") == 0:
        rows.append((f"--max-batch under the cap: batch {batch['batch']}, 3 SGD steps", _mib(budget),
                     _mib(batch["peak"]), f"predicted {_mib(batch['predicted'])}; un-checkpointed "
                     f"{_mib(batch['unplanned_peak'])}", f"planned in {batch['planning_seconds']:.1f} s"))
    else:
        rows.append(("--max-batch under the cap", _mib(budget), "failed", str(batch)[-300:], "-"))
    rows.append(("a cap below one op", "-", "-", f"exit {oom.get('code')}: {' '.join(oom.get('errors', []))[:300]}",
                 f"traceback: {oom.get('traceback')}, plan written: {oom.get('wrote')}"))
    return rows


HEADER = ("case", "budget MiB", "peak MiB", "figures", "notes")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--cap", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("cuda_bounded: no CUDA device", file=sys.stderr)
        return 2
    if args.case:
        torch.set_num_threads(1) if args.device == "cpu" else None
        print("RESULT " + json.dumps(CASES[args.case](args.device, cap=args.cap, budget=args.budget,
                                                      scratch=args.scratch)), flush=True)
        return 0
    from tables import markdown_table, publish

    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    with tempfile.TemporaryDirectory() as scratch:
        results = {"unplanned": run_case("unplanned", args.device, scratch)}
        print("unplanned:", results["unplanned"], flush=True)
        cap = results["unplanned"]["step_peak"] // 2
        budget = int(0.8 * cap)
        for name in ("plan", "max-batch"):
            results[name] = run_case(name, args.device, scratch, cap, budget)
            print(f"{name}:", results[name], flush=True)
        results["oom"] = run_case("oom", args.device, scratch, cap=48 * MiB, budget=40 * MiB)
        print("oom:", results["oom"], flush=True)
    sizes = SIZES[args.device]
    text = (f"Device: {device_name}, torch {torch.__version__}. Command: `python benchmarks/cuda_bounded.py`. "
            f"GPT-2 ({sizes['layers']} layers, width {sizes['width']}, vocabulary {sizes['vocab']}, batch "
            f"{sizes['batch']} x {sizes['tokens']} tokens, dropout on); cap {_mib(cap)} MiB (half the "
            f"un-checkpointed step's peak), budget {_mib(budget)} MiB.\n\n"
            f"{markdown_table(HEADER, rows_of(results, cap, budget))}\n")
    publish(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
