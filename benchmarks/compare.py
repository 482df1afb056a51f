"""Measure plan-checkpoints against what users pick today, on this machine, in one run per model.

    python benchmarks/compare.py --models gpt2,residual-mlp [--rounds 7] [--out docs/benchmarks]

For each model: no checkpointing; the baselines it supports (Hugging Face per-layer checkpointing,
checkpoint_sequential with sqrt(N) segments); torch.compile with activation_memory_budget 1.0, 0.5,
0.1 (compile time reported apart); our plans with every solver over a sweep of budgets, and our best
plan at the measured peak of each baseline, run eagerly (ours@...) and as two inductor-compiled
graphs (ours-compiled@..., planner.apply(..., compile=True); its first step, which compiles, timed
apart); these are traced plans. The native executor's plan (planner.plan's default) at 100% and at
each baseline's measured peak, eagerly (native@...) and under torch.compile (native-compiled@...),
priced on the eager step (baselines that measure the same peak share one plan and one row). The native plan priced on the compiled step (planner.plan(...,
compile=True)) at each baseline's measured peak, run as torch.compile(planner.apply(model, plan))
(compiled-native@...). --no-traced skips the traced plans, --no-compiled-native the last rows.
Peaks are measured by profiler.measure_step (the CPU allocator's events replayed;
max_memory_allocated on CUDA), step times are medians of --rounds timed steps after a warm-up, with
all methods interleaved round by round because these machines drift; ratios are to no
checkpointing in the same run, as the ratio of the medians and paired (the median over rounds of
the ratio within each round); `--cpu-time` times them by this process's CPU time on one torch
thread (on a machine shared with other jobs, their load adds to the wall clock, not to this). Writes a Markdown table and a PNG per model and the raw results as
JSON; `--redraw` rewrites the tables and plots from that JSON without measuring.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# The project's packages before this folder: benchmarks/solvers.py must not shadow the solvers package.
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import planner  # noqa: E402
from planner.api import profile_for  # noqa: E402
import profiler  # noqa: E402
from models import BENCHMARKS, Benchmark  # noqa: E402
from planner.files import write_atomic  # noqa: E402

MiB = 2**20
# Every compiled model of a run is a variant of the same forward code (the baselines', the plans'):
# past dynamo's default limit of 8 it would run the rest eagerly.
torch._dynamo.config.recompile_limit = 64
SOLVERS = ["chen-sqrtn", "chen-greedy", "revolve", "dp", "ilp", "cpsat"]
COMPILE_RATIOS = [1.0, 0.5, 0.1]


@dataclass
class Row:
    method: str
    kind: str  # "none", "baseline", "compile", "plan", "matched"
    budget_bytes: int | None = None
    budget_label: str = ""
    predicted_peak: int | None = None
    measured_peak: int | None = None
    predicted_seconds: float | None = None
    measured_seconds: float | None = None
    times: list[float] = field(default_factory=list)
    planning_seconds: float | None = None
    compile_seconds: float | None = None
    status: str = ""
    gap: float | None = None
    note: str = ""
    grouping: str = ""  # the cost graph a plan schedules (the planner may pick a finer one)


def training_step(module, inputs, loss_fn):
    for p in module.parameters():
        p.grad = None
    output = module(**inputs) if isinstance(inputs, dict) else module(*inputs)
    loss_fn(output).backward()


def timed_step(module, inputs, loss_fn, clock=time.perf_counter) -> float:
    """Seconds of one training step by ``clock`` (the wall clock, or ``time.process_time``: this
    process's CPU time, which other processes' load does not add to)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = clock()
    training_step(module, inputs, loss_fn)
    sync()
    return clock() - start


def _fresh(bench: Benchmark, base: torch.nn.Module) -> torch.nn.Module:
    """A copy with the same weights, for baselines that change the model they are given."""
    model = copy.deepcopy(base)
    model.train()
    return model


class WithMemoryBudget(torch.nn.Module):
    """torch.compile'd model whose every call runs under ``activation_memory_budget=ratio``: the
    partitioner reads it when the forward compiles, and a compile-priced plan's search resets
    torch._dynamo (planner/compiled.py), after which this model compiles again at its next call."""

    def __init__(self, compiled: torch.nn.Module, ratio: float):
        super().__init__()
        self.compiled = compiled
        self.ratio = ratio

    def forward(self, *args, **kwargs):
        with torch._functorch.config.patch(activation_memory_budget=self.ratio):
            return self.compiled(*args, **kwargs)


def _compiled(bench: Benchmark, base, ratio: float, inputs):
    compiled = WithMemoryBudget(torch.compile(_fresh(bench, base)), ratio)
    started = time.perf_counter()
    training_step(compiled, inputs, bench.loss_fn)  # compiles forward and backward
    return compiled, time.perf_counter() - started


# What a solver may answer instead of a plan; the row records it and the benchmark goes on.
PLAN_FAILURES = (planner.BudgetInfeasible, planner.SolverError, TimeoutError)


def _failed_row(method: str, kind: str, budget: int | None, label: str, error: Exception) -> Row:
    if isinstance(error, planner.BudgetInfeasible):
        note = f"min {error.min_budget / MiB:.1f} MiB" if error.min_budget is not None else "no minimum known"
        return Row(method, kind, budget, label, status="infeasible", note=note)
    return Row(method, kind, budget, label, status="failed", note=str(error)[:120])


def _plan_row(method: str, kind: str, plan, label: str, planning: float) -> Row:
    info = plan.schedule.info
    return Row(method, kind, plan.budget_bytes, label, plan.predicted_peak_bytes, None, plan.predicted_seconds,
               planning_seconds=planning, status=info.status, gap=info.gap, note=info.message[:120],
               grouping=plan.granularity)


def _native_rows(bench: Benchmark, base, inputs, rows: dict, modules: dict, with_compiled: bool,
                 time_limit: float | None = None) -> None:
    """The native executor (planner.plan's default: torch.utils.checkpoint on the model's own modules)
    at 100% (nothing to recompute: the eager model itself) and at each baseline's measured peak, on
    its own copy of the model (it checkpoints in place), run eagerly (native@...) and under
    torch.compile (native-compiled@...; its first step, which compiles, timed apart).
    ``time_limit`` (seconds per search, the run's ``--time-limit``) bounds the exact method as it
    bounds the traced solvers: under planner.plan's own 30 s the residual MLP's plans stopped at
    gaps of 0.3-7.0% at a load of 4-5 (2026-11-28)."""
    profile = profile_for(base, inputs, loss_fn=bench.loss_fn)  # unfused: what eager runs
    # Baselines with the same measured peak (torch.compile's three, on CPU) share one plan and one
    # row, labelled with all of them, as in _compiled_native_rows.
    by_peak: dict[int, list[str]] = {}
    for key, r in list(rows.items()):
        if r.kind in ("baseline", "compile") and r.measured_peak:
            by_peak.setdefault(r.measured_peak, []).append(key)
    targets: dict[str, int | str] = {"100%": "100%"}
    targets.update({"/".join(labels): budget for budget, labels in by_peak.items()})
    for label, budget in targets.items():
        key = f"native@{label}"
        model = _fresh(bench, base)
        started = time.perf_counter()
        try:
            plan = planner.plan(model, inputs, budget=budget, loss_fn=bench.loss_fn, profile=profile,
                                time_limit=time_limit)
        except PLAN_FAILURES as error:
            rows[key] = _failed_row(key, "native", budget if isinstance(budget, int) else None, label, error)
            continue
        rows[key] = _plan_row(key, "native", plan, label, time.perf_counter() - started)
        rows[key].note = f"{len(plan.regions)} region(s): {', '.join(plan.regions)}"  # whole: the record of the plan
        modules[key] = planner.apply(model, plan)
        gc.collect()
        rows[key].measured_peak = profiler.measure_step(model, inputs, loss_fn=bench.loss_fn, repeats=1).peak_bytes
        if with_compiled and label != "100%":
            compiled_key = f"native-compiled@{label}"
            rows[compiled_key] = _plan_row(compiled_key, "native-compiled", plan, label, rows[key].planning_seconds)
            modules[compiled_key] = torch.compile(model)
            started = time.perf_counter()
            training_step(modules[compiled_key], inputs, bench.loss_fn)  # compiles forward and backward
            rows[compiled_key].compile_seconds = time.perf_counter() - started
            gc.collect()
            rows[compiled_key].measured_peak = profiler.measure_step(modules[compiled_key], inputs,
                                                                     loss_fn=bench.loss_fn, repeats=1).peak_bytes


def _compiled_native_rows(bench: Benchmark, base, inputs, rows: dict, modules: dict) -> None:
    """The native executor priced on the compiled step (``planner.plan(..., compile=True)``,
    planner/compiled.py) at each baseline's and each torch.compile's measured peak, run as
    ``torch.compile(planner.apply(model, plan))`` (compiled-native@...; its first step, which
    compiles, timed apart; planning includes the search's own compiles). Baselines with the same
    measured peak (torch.compile's three, on CPU) share one plan and one row, labelled with all of them."""
    profile = profile_for(base, inputs, loss_fn=bench.loss_fn)  # unfused: what the eager regions model
    by_peak: dict[int, list[str]] = {}
    for key, r in list(rows.items()):
        if r.kind in ("baseline", "compile") and r.measured_peak:
            by_peak.setdefault(r.measured_peak, []).append(key)
    for budget, labels in by_peak.items():
        label = "/".join(labels)
        key = f"compiled-native@{label}"
        model = _fresh(bench, base)
        started = time.perf_counter()
        try:
            plan = planner.plan(model, inputs, budget=budget, loss_fn=bench.loss_fn, profile=profile, compile=True)
        except PLAN_FAILURES as error:
            rows[key] = _failed_row(key, "compiled-native", budget, label, error)
            rows[key].planning_seconds = time.perf_counter() - started  # its compiles included
            continue
        rows[key] = _plan_row(key, "compiled-native", plan, label, time.perf_counter() - started)
        rows[key].status = f"{plan.compiles} compiles in planning"
        rows[key].note = f"{len(plan.regions)} region(s): {', '.join(plan.regions)}"  # whole: the record of the plan
        modules[key] = torch.compile(planner.apply(model, plan))
        started = time.perf_counter()
        training_step(modules[key], inputs, bench.loss_fn)  # compiles forward and backward
        rows[key].compile_seconds = time.perf_counter() - started
        gc.collect()
        rows[key].measured_peak = profiler.measure_step(modules[key], inputs, loss_fn=bench.loss_fn,
                                                        repeats=1).peak_bytes


def run_model(name: str, rounds: int, fractions: list[float], solvers: list[str], time_limit: float,
              with_compile: bool, with_compiled_plans: bool = True, with_native: bool = True,
              with_traced: bool = True, with_compiled_native: bool = True, cpu_time: bool = False) -> dict:
    bench = BENCHMARKS[name]
    torch.manual_seed(0)
    base = bench.build()
    base.train()
    inputs = bench.inputs()
    modules: dict[str, torch.nn.Module] = {"none": base}
    rows: dict[str, Row] = {"none": Row("none", "none")}

    started = time.perf_counter()
    prof = profiler.profile(base, inputs, loss_fn=bench.loss_fn)
    profile_seconds = time.perf_counter() - started
    unplanned = planner.plan(base, inputs, budget="100%", solver="store-all", profile=prof, executor="traced")
    rows["none"].predicted_peak = unplanned.predicted_peak_bytes
    rows["none"].predicted_seconds = unplanned.predicted_seconds

    for baseline, make in bench.baselines.items():
        modules[baseline] = make(_fresh(bench, base))
        rows[baseline] = Row(baseline, "baseline")
    if with_compile:
        for ratio in COMPILE_RATIOS:
            key = f"compile-{ratio:g}"
            modules[key], seconds = _compiled(bench, base, ratio, inputs)
            rows[key] = Row(key, "compile", compile_seconds=seconds, note=f"activation_memory_budget={ratio:g}")

    for solver in solvers if with_traced else []:
        for fraction in fractions:
            key = f"{solver}@{fraction:.0%}"
            started = time.perf_counter()
            try:
                plan = planner.plan(base, inputs, budget=f"{fraction * 100:g}%", solver=solver,
                                    time_limit=time_limit, profile=prof, executor="traced")
            except PLAN_FAILURES as error:
                rows[key] = _failed_row(key, "plan", None, f"{fraction:.0%}", error)
                continue
            rows[key] = _plan_row(key, "plan", plan, f"{fraction:.0%}", time.perf_counter() - started)
            modules[key] = planner.apply(base, plan)

    # Measured peaks, one method at a time (the allocator's events, independent of any plan).
    for key, module in modules.items():
        gc.collect()
        rows[key].measured_peak = profiler.measure_step(module, inputs, loss_fn=bench.loss_fn, repeats=1).peak_bytes

    # Our best plan at each baseline's measured peak.
    best_solver = "auto"
    for key in [k for k, r in rows.items() if r.kind in ("baseline", "compile") and with_traced]:
        match = f"ours@{key}"
        budget = rows[key].measured_peak
        started = time.perf_counter()
        try:
            plan = planner.plan(base, inputs, budget=budget, solver=best_solver, time_limit=time_limit, profile=prof,
                                executor="traced")
        except PLAN_FAILURES as error:
            rows[match] = _failed_row(match, "matched", budget, key, error)
            continue
        rows[match] = _plan_row(match, "matched", plan, key, time.perf_counter() - started)
        modules[match] = planner.apply(base, plan)
        gc.collect()
        rows[match].measured_peak = profiler.measure_step(modules[match], inputs, loss_fn=bench.loss_fn,
                                                          repeats=1).peak_bytes
        if with_compiled_plans:  # the same plan, run as two inductor-compiled graphs
            compiled = f"ours-compiled@{key}"
            rows[compiled] = _plan_row(compiled, "matched-compiled", plan, key, rows[match].planning_seconds)
            modules[compiled] = planner.apply(base, plan, compile=True)
            started = time.perf_counter()
            training_step(modules[compiled], inputs, bench.loss_fn)  # compiles both phases
            rows[compiled].compile_seconds = time.perf_counter() - started
            gc.collect()
            rows[compiled].measured_peak = profiler.measure_step(modules[compiled], inputs, loss_fn=bench.loss_fn,
                                                                 repeats=1).peak_bytes

    if with_native:
        _native_rows(bench, base, inputs, rows, modules, with_compiled_plans, time_limit)
    if with_compiled_native:
        _compiled_native_rows(bench, base, inputs, rows, modules)

    # Step times: every method once per round, interleaved; the first round warms up.
    for round_index in range(rounds + 1):
        for key, module in modules.items():
            seconds = timed_step(module, inputs, bench.loss_fn, time.process_time if cpu_time else time.perf_counter)
            if round_index:
                rows[key].times.append(seconds)
    for row in rows.values():
        if row.times:
            row.measured_seconds = statistics.median(row.times)
    return {
        "model": name,
        "parameters": sum(p.numel() for p in base.parameters()),
        "nodes": prof.graph.number_of_nodes(),
        "granularity": prof.granularity,
        "profile_seconds": profile_seconds,
        "rounds": rounds,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "clock": "CPU time" if cpu_time else "wall clock",
        "rows": [asdict(r) for r in rows.values()],
    }


def _fmt(value, scale=1.0, digits=1, suffix=""):
    return "" if value is None else f"{value / scale:.{digits}f}{suffix}"


def paired_ratio(row: dict, none: dict) -> float | None:
    """The median over rounds of the row's step time over no checkpointing's in the same round.

    The machines drift by tens of percent within a run; two methods timed in the same round see the
    same drift, so this ratio varies less between runs than the ratio of the two medians does."""
    if not row["times"] or len(row["times"]) != len(none["times"]):
        return None
    return statistics.median(a / b for a, b in zip(row["times"], none["times"]))


def markdown(result: dict) -> str:
    rows = result["rows"]
    none = next(r for r in rows if r["kind"] == "none")
    lines = [
        f"### {result['model']}",
        "",
        f"{result['parameters'] / 1e6:.1f}M parameters; profiled cost graph of {result['nodes']} nodes ({result['granularity']}; plans may schedule a finer grouping, column graph), "
        f"profiled in {result['profile_seconds']:.0f} s; step times are medians of {result['rounds']} interleaved "
        f"rounds on {result['threads']} threads ({result.get('clock', 'wall clock')}), torch {result['torch']}; "
        "paired: the median over rounds of "
        "the step's time over no checkpointing's in the same round.",
        "",
        "| method | budget | predicted peak (MiB) | measured peak (MiB) | peak vs none | predicted step (s) "
        "| measured step (s) | step vs none | paired | planning (s) | graph | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peak_ratio = _fmt(r["measured_peak"] / none["measured_peak"] if r["measured_peak"] else None, 1, 2, "x")
        time_ratio = _fmt(r["measured_seconds"] / none["measured_seconds"] if r["measured_seconds"] else None, 1, 2, "x")
        budget = r["budget_label"] or ""
        if r["budget_bytes"]:
            budget = f"{budget} ({r['budget_bytes'] / MiB:.1f} MiB)" if budget else f"{r['budget_bytes'] / MiB:.1f} MiB"
        status = r["status"] + (f", gap {r['gap']:.1%}" if r["gap"] else "")
        if r["compile_seconds"]:
            status = f"compile {r['compile_seconds']:.0f} s" if r["kind"] == "compile" else \
                f"{status}; compile {r['compile_seconds']:.0f} s"
        if r["note"] and r["status"] in ("infeasible", "failed"):
            status += f" ({r['note']})"
        lines.append(
            f"| {r['method']} | {budget} | {_fmt(r['predicted_peak'], MiB)} | {_fmt(r['measured_peak'], MiB)} | {peak_ratio} "
            f"| {_fmt(r['predicted_seconds'], 1, 3)} | {_fmt(r['measured_seconds'], 1, 3)} | {time_ratio} "
            f"| {_fmt(paired_ratio(r, none), 1, 2, 'x')} | {_fmt(r['planning_seconds'], 1, 1)} "
            f"| {r.get('grouping', '')} | {status} |"
        )
    return "\n".join(lines) + "\n"


def _paired(a: dict, b: dict) -> float | None:
    """The median over rounds of a's step time over b's in the same round."""
    if not a.get("times") or len(a["times"]) != len(b.get("times") or []):
        return None
    return statistics.median(x / y for x, y in zip(a["times"], b["times"]))


def _ours_at(rows: list[dict], prefix: str, baseline: str) -> dict | None:
    """Our row of kind ``prefix`` (native, native-compiled, compiled-native) planned at ``baseline``'s
    peak: its label lists every baseline that measured that peak."""
    return next((r for r in rows if r["method"].startswith(prefix + "@")
                 and baseline in r["method"].split("@", 1)[1].split("/")), None)


def summary(result: dict) -> str:
    """Per baseline of one model: its peak and overhead (step / no checkpointing - 1, paired), ours at
    its peak, and the targets: at an eager baseline's peak, ours within it with at most half its
    overhead; at torch.compile's, ours compiled at least as fast (paired against it); with nothing
    to recompute (native@100%; a compile-priced plan of no region), within 2% of eager or torch.compile."""
    rows = result["rows"]
    none = next(r for r in rows if r["kind"] == "none")

    def overhead(r):
        ratio = _paired(r, none)
        return None if ratio is None else ratio - 1

    def cell(r, against=None):
        if r is None:
            return "not run"
        if r["status"] in ("infeasible", "failed"):
            return f"{r['status']} ({r['note']})"
        text = f"{_fmt(r['measured_peak'], MiB)} MiB, {_fmt(overhead(r), 0.01, 1, '%')}"
        if against is not None:
            text += f", {_fmt(_paired(r, against), 1, 3, 'x')} its step"
        return text

    lines = [f"#### {result['model']}", "",
             "| baseline | its peak, overhead | native (eager) | native, compiled | compiled-native | targets |",
             "|---|---|---|---|---|---|"]
    for b in (r for r in rows if r["kind"] in ("baseline", "compile")):
        ours = {k: _ours_at(rows, k, b["method"]) for k in ("native", "native-compiled", "compiled-native")}
        verdicts = []
        for kind, r in ours.items():
            if r is None:
                continue
            if not r["measured_peak"]:
                verdicts.append(f"{kind}: refused")
                continue
            within = r["measured_peak"] <= b["measured_peak"]
            if b["kind"] == "baseline":
                ok = within and overhead(r) is not None and overhead(r) <= overhead(b) / 2
                verdicts.append(f"{kind}: {'met' if ok else 'missed'}")
            elif kind != "native":
                ratio = _paired(r, b)
                ok = within and ratio is not None and ratio <= 1.0
                verdicts.append(f"{kind}: {'met' if ok else 'missed'}")
        against = b if b["kind"] == "compile" else None
        lines.append(f"| {b['method']} | {cell(b)} | {cell(ours['native'], against)} "
                     f"| {cell(ours['native-compiled'], against)} | {cell(ours['compiled-native'], against)} "
                     f"| {'; '.join(verdicts)} |")
    full = next((r for r in rows if r["method"] == "native@100%"), None)
    if full is not None and full["times"]:
        ratio = _paired(full, none)
        lines += ["", f"Nothing to recompute, eager: native@100% ({full['note']}) {_fmt(ratio, 1, 3, 'x')} "
                  f"no checkpointing's step, paired: {'met' if ratio <= 1.02 else 'missed'} (within 2%)."]
    compile_1 = next((r for r in rows if r["method"] == "compile-1"), None)
    for r in rows:
        if r["kind"] == "compiled-native" and r["note"].startswith("0 region") and compile_1 and r["times"]:
            ratio = _paired(r, compile_1)
            lines += ["", f"Nothing to recompute, compiled: {r['method']} (0 regions) {_fmt(ratio, 1, 3, 'x')} "
                      f"compile-1's step, paired: {'met' if ratio <= 1.02 else 'missed'} (within 2%)."]
    spread = [(r["method"], _paired(r, compile_1)) for r in rows
              if compile_1 and r["kind"] == "compile" and r is not compile_1 and r["measured_peak"] == compile_1["measured_peak"]]
    if spread and all(ratio is not None for _, ratio in spread):
        lines += ["", "Noise floor: " + ", ".join(f"{m} {ratio:.3f}x" for m, ratio in spread)
                  + " compile-1's step, paired (the same measured peak)."]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["measured_peak"] and r["measured_seconds"]]
    none = next(r for r in rows if r["kind"] == "none")
    figure, axes = plt.subplots(figsize=(7, 4.5))
    solvers = sorted({r["method"].split("@")[0] for r in rows if r["kind"] == "plan"})
    for solver in solvers:
        points = sorted((r["measured_peak"] / MiB, 100 * (r["measured_seconds"] / none["measured_seconds"] - 1))
                        for r in rows if r["kind"] == "plan" and r["method"].startswith(solver + "@"))
        axes.plot(*zip(*points), marker="o", label=f"ours: {solver}")
    for r in rows:
        if r["kind"] in ("none", "baseline", "compile", "matched-compiled", "native-compiled", "compiled-native"):
            marker = {"compile": "^", "matched-compiled": "*", "native-compiled": "v",
                      "compiled-native": "P"}.get(r["kind"], "s")
            axes.scatter(r["measured_peak"] / MiB, 100 * (r["measured_seconds"] / none["measured_seconds"] - 1),
                         marker=marker, s=60, label=r["method"], zorder=3)
    axes.set_xlabel("measured peak of the training step (MiB)")
    axes.set_ylabel("step time over no checkpointing (%)")
    axes.set_title(f"{result['model']}: time against memory (one run, CPU)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    temporary = path + ".tmp.png"
    figure.savefig(temporary, dpi=110)
    plt.close(figure)
    os.replace(temporary, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(BENCHMARKS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--budgets", default="0.4,0.55,0.7,0.85", help="fractions of the un-checkpointed peak")
    parser.add_argument("--solvers", default=",".join(SOLVERS))
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="seconds each plan's search may take (the traced solvers' and the native exact method's)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    parser.add_argument("--no-native", action="store_true", help="skip the native executor's rows (native@...)")
    parser.add_argument("--no-compiled-plans", action="store_true",
                        help="skip our matched plans run compiled (planner.apply(..., compile=True))")
    parser.add_argument("--no-traced", action="store_true",
                        help="skip the traced plans (the --solvers sweep and ours@...)")
    parser.add_argument("--no-compiled-native", action="store_true",
                        help="skip the native plans priced on the compiled step (compiled-native@...)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time steps by this process's CPU time on one torch thread (a machine shared with other "
                             "jobs: their load adds to the wall clock, not to this)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "docs", "benchmarks"))
    parser.add_argument("--summary", action="store_true",
                        help="measure nothing: print each model's baselines against our plans at their peaks, "
                             "and the targets, from its JSON in --out")
    parser.add_argument("--redraw", action="store_true",
                        help="measure nothing: rewrite each model's table and plot from its JSON in --out")
    args = parser.parse_args(argv)
    if args.summary or args.redraw:
        missing = [name for name in args.models.split(",")
                   if not os.path.isfile(os.path.join(args.out, f"{name}.json"))]
        if missing:
            parser.error(f"--summary and --redraw read a model's results from --out: no "
                         f"{', '.join(f'{name}.json' for name in missing)} in {args.out} (run the models first, "
                         "with the same --out)")
    os.makedirs(args.out, exist_ok=True)
    fractions = [float(f) for f in args.budgets.split(",")]
    if args.cpu_time:
        torch.set_num_threads(1)
    for name in args.models.split(","):
        if args.summary:
            with open(os.path.join(args.out, f"{name}.json")) as file:
                print(summary(json.load(file)), flush=True)
            continue
        if args.redraw:
            with open(os.path.join(args.out, f"{name}.json")) as file:
                result = json.load(file)
        else:
            result = run_model(name, args.rounds, fractions, args.solvers.split(","), args.time_limit,
                               not args.no_compile, not args.no_compiled_plans, not args.no_native,
                               not args.no_traced, not args.no_compiled_native, args.cpu_time)
        table = markdown(result)
        print(table, flush=True)
        write_atomic(os.path.join(args.out, f"{name}.md"), table)
        write_atomic(os.path.join(args.out, f"{name}.json"), json.dumps(result, indent=1))
        plot(result, os.path.join(args.out, f"{name}.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
