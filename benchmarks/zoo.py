"""The model zoo: every architecture a user might bring, planned at 50% and 75% and checked.

Each case builds a model from a tiny configuration (Hugging Face ``transformers`` models from their
config classes, no weights) or from ``torch.nn``, with example inputs sized so that activations,
not parameters, make most of the step's peak, and dropout on (benchmarks/zoo_models.py).
:func:`run_case` plans it natively (planner.plan's default) or with the chain DP (``solver="dp"``,
the traced executor) at each budget, applies the plan, and measures:

- the step's peak from the allocator's events (``profiler.measure_step``), not the plan's figure;
- the predicted peak against it;
- the gradients against the unplanned model's from the same seed (which also compares every
  dropout mask: a different mask changes the gradients), the loss and the RNG state after the step.

A model the tracer cannot follow gets a native plan made from an eager step (planner/untraced.py),
checked as every native plan is, with either executor asked for (there is no trace to schedule).

``python benchmarks/zoo.py`` runs every case, prints the table and writes it to docs/zoo.md
(``--only NAME,NAME`` for some). tests/test_zoo.py runs the same cases as tests: a fast subset
by default, all of them with ``-m zoo``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import planner
import profiler
from runtime.hf_cache import cache_off_while_planning  # noqa: E402
from benchmarks.zoo_models import (  # noqa: E402
    _BERT_LIKE, _causal_lm, _clip, _control_flow, _image_classifier, _llama_like, _masked_lm, _moe, _recurrent,
    _seq2seq, _sparse_moe, _torch_vit, _transformer_encoder, _unet, _whisper,
)

BUDGETS = ("50%", "75%")
# The predicted peak may differ from the measured one by this fraction of the measured peak.
PREDICTION_TOLERANCE = 0.02
SEED = 1234


@dataclass(frozen=True)
class Case:
    """``build() -> (model, example_inputs, loss_fn)``; ``fast``: in the default test subset of the
    traced executor."""

    name: str
    kind: str  # decoder, encoder, encoder-decoder, vision, speech, multimodal, torch.nn
    build: Callable[[], tuple]
    fast: bool = False
    fast_native: bool = False  # in the default test subset of the native executor
    note: str = ""
    # The chain DP plans chains of stages; a model with long skip connections (a U-Net) is one
    # stage to it, so such a case names a solver that plans any graph.
    solver: str = "dp"
    time_limit: float | None = None
    # Budgets no plan reaches for this model, with why (measured): the planner must say so
    # (BudgetInfeasible), and a plan found one day fails the check, to be looked at.
    infeasible: tuple[tuple[str, str], ...] = ()
    # A known failure of the checks, with its reason: the test is marked xfail (not strict when the
    # failure depends on the machine's timings, which change the schedule).
    xfail: str = ""
    xfail_strict: bool = True
    # The native executor's (planner.plan's default): budgets it refuses for this model, with why
    # (measured). A refusal must be a BudgetInfeasible naming a least budget above the budget asked.
    native_infeasible: tuple[tuple[str, str], ...] = ()
    native_xfail: str = ""
    native_xfail_strict: bool = True


@dataclass
class Row:
    """One case at one budget. Bytes and seconds."""

    case: str
    budget_text: str
    traced: bool  # planned from a cost graph (a traced or a native plan), not by measuring whole blocks
    budget_bytes: int
    predicted_bytes: int
    measured_bytes: int
    unplanned_bytes: int
    grad_max_abs_diff: float
    grad_max_rel_diff: float
    same_loss: bool
    same_rng: bool
    seconds: float  # planning, applying and checking this budget (profiling counted in the first row)
    # Set for a budget the case declares out of reach: the reason, and the least budget the planner
    # reported (bytes); -1 when a plan was found after all.
    infeasible_reason: str = ""
    min_budget_bytes: int = 0
    executor: str = "traced"  # what ran the plan: "traced" (runtime/module.py) or "native" (runtime/native.py)
    regions: tuple[str, ...] = ()  # a native plan's checkpointed regions
    plan_measured_bytes: int | None = None  # a native plan's own measurement of its step, while planning
    refused: bool = False  # the planner raised BudgetInfeasible (min_budget_bytes: the least it named)
    native_plan: bool = False  # the plan was a NativePlan (in the traced table: a model the tracer cannot follow)

    @property
    def plan_kind(self) -> str:
        """``traced``, ``native`` or ``fallback`` (whole blocks, figures measured: rows of old runs)."""
        if self.native_plan:
            return "native"
        return self.executor if self.traced else "fallback"

    @property
    def prediction_error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


# -- the zoo -------------------------------------------------------------------------------------------
# Why the native executor refuses a budget (measured: docs/zoo.md). A native region is a module
# whose call the checkpoint recomputes; runtime/native.py and solvers/regions/ leave out modules
# that compute a model output or are called more than once.
# Decoders at their default config (use_cache on) are planned with the cache off in training, as
# gradient_checkpointing_enable() trains them (runtime/hf_cache.py); before, their attention blocks
# returned the cache as model outputs and no attention block was a candidate region.


# Measured by following the allocator's events step by step of a traced plan (docs/zoo.md).
_ENCODER_TRACED = ("the traced executor's prediction misses both ways, by the schedule the machine's timings lead the "
                   "DP to: over, the model output counted twice while its group is held (fw:layers.3.norm2#0, "
                   "34,816 B, and its extraction /model_output, 32,768 B, are the same tensor: +32,776 B at 50%); "
                   "under, each random group recomputed in the backward allocates the generator's state "
                   "(5,056 B on CPU, runtime/rng.py RngReplay.run's get_rng_state) that no node counts: a masked 50% "
                   "plan measured 4,672 B over its budget")
# MobileViT at 75%, measured (planner.plan's own measurements, spied): the first plan measured 3,052,008 B
# against a 2,900,046 B budget (predicted under it), and so did the second; the third fit (2,548,520 B).
# Stacked RNNs plan as their layers (runtime/rnn.py stages); the figures are one run's.
_LSTM_OVER = ("its plans are predicted up to 2.7% above their measured peaks (50%: 2.736 MiB predicted, 2.664 MiB "
              "measured; 75% +1.8%): over, so within the budget, but outside the zoo's 2%; not investigated")
_GRU_UNDER = ("the GRU's eager step measures 7.9% above its traced prediction without any checkpointing (3,121,416 B "
              "against 2,874,448), and its 75% plan 6.0% above (1.990 MiB against 1.870): nn.GRU on CPU traces to "
              "its time steps' ops, which eager autograd holds differently; the plan is within its budget (measured "
              "while planning)")
_GRU_LEAST = ("per-layer stages reach 50.6% of eager at least (predicted), just above the budget; time chunks "
              "(runtime/rnn.py install_rnn_stages(time_chunks=4), opt-in) reach 48.3%")


def _refused(reason: str, *budgets: str) -> tuple[tuple[str, str], ...]:
    return tuple((budget, reason) for budget in budgets)


CASES = [
    # decoders (causal LMs with labels)
    Case("gpt2", "decoder", _causal_lm("GPT2Config", n_layer=4, n_embd=32, n_head=4, n_positions=128,
                                       bos_token_id=0, eos_token_id=0), fast=True, fast_native=True,
         note="default config's features: use_cache on (off in training, as planned: runtime/hf_cache.py), dropouts 0.1"),
    Case("llama", "decoder", _llama_like("LlamaConfig")),
    Case("mistral", "decoder", _llama_like("MistralConfig")),
    Case("qwen2", "decoder", _llama_like("Qwen2Config")),
    Case("gemma", "decoder", _llama_like("GemmaConfig", head_dim=8)),
    Case("llama-no-cache", "decoder", _llama_like("LlamaConfig", use_cache=False),
         note="use_cache=False, as Hugging Face's gradient_checkpointing_enable() sets it for training"),
    Case("phi", "decoder", _causal_lm("PhiConfig", hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                      num_attention_heads=4, max_position_embeddings=128, resid_pdrop=0.1,
                                      embd_pdrop=0.1, attention_dropout=0.1, pad_token_id=0, bos_token_id=0,
                                      eos_token_id=0)),
    Case("gpt-neox", "decoder", _causal_lm("GPTNeoXConfig", hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=4, num_attention_heads=4, max_position_embeddings=128,
                                           hidden_dropout=0.1, attention_dropout=0.1, pad_token_id=0,
                                           bos_token_id=0, eos_token_id=0)),
    Case("opt", "decoder", _causal_lm("OPTConfig", hidden_size=32, ffn_dim=64, num_hidden_layers=4,
                                      num_attention_heads=4, max_position_embeddings=128, word_embed_proj_dim=32,
                                      dropout=0.1, attention_dropout=0.1, pad_token_id=0, bos_token_id=0,
                                      eos_token_id=0)),
    Case("bloom", "decoder", _causal_lm("BloomConfig", hidden_size=32, n_layer=4, n_head=4, hidden_dropout=0.1,
                                        attention_dropout=0.1, pad_token_id=0, bos_token_id=0, eos_token_id=0),
         native_infeasible=_refused("with the cache off in training the least set of regions reaches 56.5% of eager "
                                    "(3,726,216 B against 6,598,036 B, measured 2026-11-27); which tensors hold it "
                                    "was not investigated", "50%"),
         native_xfail=("75% with the cache off in training: predicted 4,868,040 B, measured 3,408,584 B (+42.8%, "
                       "over, so within the budget; 2026-11-27); not investigated"), native_xfail_strict=False),
    Case("falcon", "decoder", _causal_lm("FalconConfig", hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                         hidden_dropout=0.1, attention_dropout=0.1, pad_token_id=0, bos_token_id=0,
                                         eos_token_id=0)),
    # encoders (masked LMs with labels)
    Case("bert", "encoder", _masked_lm("BertConfig", **_BERT_LIKE)),
    Case("roberta", "encoder", _masked_lm("RobertaConfig", **{**_BERT_LIKE, "max_position_embeddings": 130})),
    Case("distilbert", "encoder", _masked_lm("DistilBertConfig", dim=32, n_layers=4, n_heads=4, hidden_dim=64,
                                             max_position_embeddings=128, dropout=0.1, attention_dropout=0.1,
                                             pad_token_id=0)),
    Case("albert", "encoder", _masked_lm("AlbertConfig", embedding_size=16, **_BERT_LIKE),
         native_infeasible=_refused("ALBERT shares one layer across its 4: that layer and every module in it are "
                                    "called 4 times a step, and a module called more than once is not a candidate "
                                    "region; only the embeddings and the head's dense layers are", "50%", "75%")),
    Case("electra", "encoder", _masked_lm("ElectraConfig", embedding_size=16, **_BERT_LIKE)),
    Case("deberta-v2", "encoder", _masked_lm("DebertaV2Config", **_BERT_LIKE),
         native_xfail=("a near miss at 50%: in one run the least set of regions was 0.03% above the budget (predicted, "
                       "and measured over it, so refused: 2,984,324 B least), in another a plan measured 2.816 MiB "
                       "within 2.845 MiB; which, depends on the measured op times"), native_xfail_strict=False),
    # encoder-decoders
    Case("t5", "encoder-decoder", _seq2seq("T5Config", d_model=32, d_kv=8, d_ff=256, num_layers=4, num_heads=4,
                                           dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0),
         note="labels: decoder inputs made by shifting them (a lifted constant)"),
    Case("bart", "encoder-decoder", _seq2seq("BartConfig", d_model=32, encoder_layers=4, decoder_layers=4,
                                             encoder_attention_heads=4, decoder_attention_heads=4,
                                             encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                                             dropout=0.1, attention_dropout=0.1, pad_token_id=0, bos_token_id=0,
                                             eos_token_id=0, decoder_start_token_id=0)),
    Case("whisper", "speech", _whisper),
    # vision
    Case("vit", "vision", _image_classifier("ViTConfig", hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                            intermediate_size=64, image_size=32, patch_size=4,
                                            hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)),
    Case("deit", "vision", _image_classifier("DeiTConfig", model_class="DeiTForImageClassification", hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                             intermediate_size=64, image_size=32, patch_size=4,
                                             hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)),
    Case("swin", "vision", _image_classifier("SwinConfig", image_size=32, patch_size=2, embed_dim=16, depths=[2, 2],
                                             num_heads=[2, 4], window_size=4, hidden_dropout_prob=0.1,
                                             attention_probs_dropout_prob=0.1, drop_path_rate=0.1)),
    Case("convnext", "vision", _image_classifier("ConvNextConfig", hidden_sizes=[16, 32], depths=[3, 3], num_stages=2,
                                                 drop_path_rate=0.1, image=64),
         note="64x64 images: at 32x32 its 7x7 depthwise convolutions' backward scratch (1.6 MiB) exceeded 50%"),
    Case("resnet", "vision", _image_classifier("ResNetConfig", embedding_size=16, hidden_sizes=[16, 32, 64],
                                               depths=[2, 2, 2], layer_type="basic", image=64, batch=16),
         infeasible=(("50%", "CP-SAT's lower bound: the stem BatchNorm's backward holds four 1 MiB tensors at once, "
                             "4.00 MiB of activations against 2.73 MiB allowed"),),
         native_infeasible=_refused("out of reach of every schedule at 50% (the traced executor's bound); at 75% no set "
                                    "of whole modules fits, where the traced DP, recomputing within blocks, does",
                                    "50%", "75%")),
    Case("mobilevit", "vision", _image_classifier("MobileViTConfig", image_size=32, patch_size=2,
                                                  hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                                                  num_attention_heads=2, hidden_dropout_prob=0.1,
                                                  attention_probs_dropout_prob=0.1),
         solver="cpsat", time_limit=20.0,
         note="CP-SAT: the chain DP's least budget is 76% (its convolution and transformer blocks do not form a chain)",
         infeasible=(("50%", "CP-SAT's lower bound: every schedule holds at least 1.79 MiB of activations, 1.38 MiB "
                             "allowed"),),
         native_infeasible=_refused("out of reach of every schedule (the traced executor's CP-SAT bound)", "50%")),
    Case("clip", "multimodal", _clip),
    # torch.nn
    Case("nn-transformer-encoder", "torch.nn", _transformer_encoder(causal=False),
         xfail=_ENCODER_TRACED,
         xfail_strict=False),
    Case("nn-transformer-encoder-mask", "torch.nn", _transformer_encoder(causal=True),
         note="a causal mask without is_causal", xfail=_ENCODER_TRACED,
         xfail_strict=False),
    Case("nn-vit", "torch.nn", _torch_vit, note="ViT on nn.TransformerEncoder(batch_first)"),
    Case("nn-lstm", "torch.nn", _recurrent(nn.LSTM), fast=True, native_xfail=_LSTM_OVER, native_xfail_strict=False),
    Case("nn-gru", "torch.nn", _recurrent(nn.GRU),
         infeasible=tuple((budget, "nn.GRU(num_layers=4) traces to 4003 ops in one module: one node at module "
                                   "granularity (CP-SAT: 2.60 MiB of activations at least, 2.17 MiB allowed at 75%); "
                                   "at op granularity the chain view makes each layer's 32 steps one stage, and dp's "
                                   "least budget is 80%. Recomputing across time steps is issue 16's third item")
                          for budget in ("50%", "75%")),
         native_infeasible=_refused(_GRU_LEAST, "50%"), native_xfail=_GRU_UNDER, native_xfail_strict=False),
    Case("nn-unet", "torch.nn", _unet, solver="cpsat", time_limit=20.0,
         note="CP-SAT: its skip connections cross every stage, so the chain DP sees one stage",
         native_infeasible=_refused("the skip connections are held whatever is checkpointed (docs/native.md: no "
                                    "native plan below 60% on the benchmark U-Net)", "50%")),
    Case("nn-moe-top2", "torch.nn", _moe, fast_native=True),
    Case("nn-moe-top2-sparse", "torch.nn", _sparse_moe,
         note="untraceable (each expert runs its routed tokens only): a native plan from an eager step"),
    Case("nn-control-flow", "torch.nn", _control_flow, note="untraceable: a native plan from an eager step"),
]
BY_NAME = {case.name: case for case in CASES}


# -- running a case ----------------------------------------------------------------------------------
def training_step(model: nn.Module, inputs, loss_fn, seed: int = SEED):
    """One step from a fixed seed: (loss, {name: grad}, RNG state after the step)."""
    torch.manual_seed(seed)
    for p in model.parameters():
        p.grad = None
    output = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    loss = loss_fn(output)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    for p in model.parameters():
        p.grad = None
    return loss.detach(), grads, torch.get_rng_state()


def gradient_difference(a: dict, b: dict) -> tuple[float, float]:
    """(max |a - b|, max over parameters of |a - b| / max |a|); inf when they name other parameters."""
    if a.keys() != b.keys():
        return float("inf"), float("inf")
    worst_abs = worst_rel = 0.0
    for name in a:
        diff = (a[name] - b[name]).abs().max().item()
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / (a[name].abs().max().item() or 1.0))
    return worst_abs, worst_rel


EXECUTORS = ("traced", "native")


def _profile(case: Case, model, inputs, loss_fn, executor: str):
    """The profile ``planner.plan`` makes for this executor, once for both budgets; None when the
    tracer cannot follow the model (the first plan's eager profile then serves the other budget)."""
    from planner.api import profile_for

    try:
        if executor == "native":  # the cross-entropy backward unfused, as eager autograd runs it
            return profile_for(model, inputs, loss_fn=loss_fn)
        return profiler.profile(model, inputs, loss_fn=loss_fn)
    except profiler.TraceError:
        return None


def _plan(case: Case, model, inputs, loss_fn, budget: str, profile, executor: str):
    """What a user gets: ``planner.plan``'s default (native; pinned, so that a budget only the traced
    executor reaches is the native column's refusal, not its fallback: planner/executor_choice.py) or
    the case's traced solver."""
    from planner.planfile import PlanWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)  # time figures under load: not checked here
        if executor == "native":
            return planner.plan(model, inputs, budget=budget, loss_fn=loss_fn, profile=profile, executor="native")
        return planner.plan(model, inputs, budget=budget, solver=case.solver, loss_fn=loss_fn, profile=profile,
                            time_limit=case.time_limit)


def _refusal(case: Case, budget: str, error: Exception, executor: str) -> tuple[str, int] | None:
    """(reason, least budget in bytes, 0 when not proven) for a refusal the case declares, else None.

    A searching solver stopped by its time limit raises a TimeoutError even when its proven lower
    bound already puts the budget out of reach ("... is out of reach, but the least budget was not
    proven"): that proof is what a declared budget needs. A native refusal must name its least budget."""
    declared = dict(case.native_infeasible if executor == "native" else case.infeasible)
    if budget not in declared:
        return None
    if isinstance(error, planner.BudgetInfeasible):
        minimum = int(getattr(error, "min_budget", 0) or 0)
        if executor == "native" and minimum <= 0:
            return None
        return declared[budget], minimum
    if executor == "traced" and "is out of reach" in str(error):
        return declared[budget], 0
    return None


def run_case(case: Case, budgets=BUDGETS, executor: str = "traced") -> list[Row]:
    """Plan ``case`` at each budget for ``executor``, apply, measure, compare with the unplanned model.

    ``"traced"``: the case's solver (the chain DP unless it names another), run by the traced executor.
    ``"native"``: ``planner.plan``'s default, solver ``"auto"``: regions of the model under
    torch.utils.checkpoint, "N%" of the eager step's measured peak."""
    if executor not in EXECUTORS:
        raise ValueError(f"executor {executor!r} is not one of {', '.join(EXECUTORS)}")
    started = time.perf_counter()
    model, inputs, loss_fn = case.build()
    model.train()
    # A native plan trains a Hugging Face decoder with its cache off, as gradient_checkpointing_enable()
    # does (runtime/hf_cache.py): the reference is that step, called with use_cache=False (with the
    # cache on, gradients differ by rounding: 1.5e-8 on gpt2, 1.6e-8 on t5).
    without_cache = cache_off_while_planning(model) if executor == "native" else contextlib.nullcontext()
    with without_cache:
        reference = training_step(model, inputs, loss_fn)
    profile = _profile(case, model, inputs, loss_fn, executor)
    rows = []
    declared = dict(case.native_infeasible if executor == "native" else case.infeasible)
    for budget in budgets:
        try:
            plan = _plan(case, model, inputs, loss_fn, budget, profile, executor)
        except (planner.BudgetInfeasible, TimeoutError) as error:
            refusal = _refusal(case, budget, error, executor)
            if refusal is None and executor == "traced":
                raise
            if refusal is None:  # an undeclared native refusal: a failing row, the other budget still runs
                refusal = ("", int(getattr(error, "min_budget", 0) or 0))
            row = _infeasible_row(case, budget, profile is not None, *refusal, time.perf_counter() - started, executor)
            if executor == "native":  # the base of "N%", as the planner measured it: the least as a share of it
                with cache_off_while_planning(model):
                    row.unplanned_bytes = profiler.measure_step(model, inputs, loss_fn=loss_fn, repeats=1).peak_bytes
            rows.append(row)
            started = time.perf_counter()
            continue
        if profile is None and isinstance(plan, planner.NativePlan):
            profile = plan.profile  # an untraceable model's eager profile: recorded once for both budgets
        planned = planner.apply(model, plan)
        try:
            measured = profiler.measure_step(planned, inputs, loss_fn=loss_fn, repeats=1)
            loss, grads, rng = training_step(planned, inputs, loss_fn)
        finally:
            _undo(model, planned)
        abs_diff, rel_diff = gradient_difference(reference[1], grads)
        native = isinstance(plan, planner.NativePlan)
        rows.append(Row(
            case=case.name, budget_text=budget, traced=native or (executor == "traced" and profile is not None),
            budget_bytes=plan.budget_bytes,
            predicted_bytes=plan.predicted_peak_bytes, measured_bytes=measured.peak_bytes,
            unplanned_bytes=plan.unplanned_peak_bytes, grad_max_abs_diff=abs_diff, grad_max_rel_diff=rel_diff,
            same_loss=bool(torch.equal(loss, reference[0])), same_rng=bool(torch.equal(rng, reference[2])),
            seconds=time.perf_counter() - started,
            infeasible_reason=declared.get(budget, ""), min_budget_bytes=-1 if budget in declared else 0,
            executor=executor, regions=tuple(plan.regions) if native else (), native_plan=native,
            plan_measured_bytes=plan.measured_peak_bytes if native else None,
        ))
        started = time.perf_counter()
    return rows


def _undo(model: nn.Module, planned: nn.Module) -> None:
    """Take a native plan off ``model`` before the next budget's: it checkpoints the model's own
    modules in place (traced plans are new modules sharing the parameters)."""
    import runtime

    if planned is model:
        runtime.remove_native(model)


def _infeasible_row(case: Case, budget: str, traced: bool, reason: str, minimum: int, seconds: float,
                    executor: str = "traced") -> Row:
    return Row(case=case.name, budget_text=budget, traced=traced, budget_bytes=0, predicted_bytes=0,
               measured_bytes=0, unplanned_bytes=0, grad_max_abs_diff=0.0, grad_max_rel_diff=0.0, same_loss=True,
               same_rng=True, seconds=seconds, infeasible_reason=reason, min_budget_bytes=minimum, executor=executor,
               refused=True)


def failures(row: Row) -> list[str]:
    """What is wrong with a row (empty when it passes)."""
    if row.refused and not row.infeasible_reason:
        least = f": least {row.min_budget_bytes} B" if row.min_budget_bytes > 0 else " without a least budget"
        return [f"refused{least}, a refusal the case does not declare"]
    if row.infeasible_reason:
        return ["planned within a budget declared out of reach: update the case"] if row.min_budget_bytes < 0 else []
    problems = []
    if row.measured_bytes > row.budget_bytes:
        problems.append(f"measured {row.measured_bytes} B over the budget {row.budget_bytes} B")
    if row.traced and abs(row.predicted_bytes - row.measured_bytes) > PREDICTION_TOLERANCE * row.measured_bytes:
        problems.append(f"predicted {row.predicted_bytes} B, measured {row.measured_bytes} B "
                        f"({100 * row.prediction_error:+.2f}%)")
    if row.grad_max_abs_diff != 0.0:
        problems.append(f"gradients differ from the unplanned model's (max |diff| {row.grad_max_abs_diff:.3g})")
    if not row.same_loss:
        problems.append("the loss differs from the unplanned model's")
    if not row.same_rng:
        problems.append("the RNG state after the step differs from the unplanned model's")
    return problems


# -- the table -----------------------------------------------------------------------------------------
def _mib(n: int) -> str:
    return f"{n / 2**20:.3f}"


def _regions(row: Row) -> str:
    """A native plan's checkpointed regions, shortened for the table: how many, and the first two."""
    if not row.regions:
        return "none"
    shown = ", ".join(f"`{r}`" for r in row.regions[:2])
    return f"{len(row.regions)}: {shown}" + (", ..." if len(row.regions) > 2 else "")


def table(rows: list[Row]) -> str:
    """The markdown table of ``rows`` (one executor's); a native table says what it checkpointed."""
    native = any(row.executor == "native" for row in rows)
    base = "eager MiB" if native else "unplanned MiB"
    extra_head, extra_rule = (" checkpointed |", "---|") if native else ("", "")
    lines = [
        "| model | plan | budget | budget MiB | predicted MiB | measured MiB | predicted vs measured | "
        f"{base} |{extra_head} grad max abs diff | time s | result |",
        f"|---|---|---|---:|---:|---:|---:|---:|{extra_rule}---:|---:|---|",
    ]
    for row in rows:
        problems = failures(row)
        blank = " |" if native else ""
        if row.refused:
            least = f"least {_mib(row.min_budget_bytes)}" if row.min_budget_bytes > 0 else "proven by a bound"
            if row.min_budget_bytes > 0 and row.unplanned_bytes > 0:
                least += f" ({row.min_budget_bytes / row.unplanned_bytes:.1%} of eager)"
            base = _mib(row.unplanned_bytes) if row.unplanned_bytes > 0 else ""
            verdict = "refused" if row.executor == "native" else "infeasible"
            verdict = f"{verdict} (expected): {row.infeasible_reason}" if not problems else "FAIL: " + "; ".join(problems)
            lines.append(f"| {row.case} | {row.plan_kind} | {row.budget_text} | "
                         f"out of reach: {least} | | | | {base} |{blank} | {row.seconds:.1f} | {verdict} |")
            continue
        checkpointed = f" {_regions(row)} |" if native else ""
        lines.append(
            f"| {row.case} | {row.plan_kind} | {row.budget_text} | "
            f"{_mib(row.budget_bytes)} | {_mib(row.predicted_bytes)} | {_mib(row.measured_bytes)} | "
            f"{100 * row.prediction_error:+.2f}% | {_mib(row.unplanned_bytes)} |{checkpointed} "
            f"{row.grad_max_abs_diff:.3g} | {row.seconds:.1f} | "
            f"{'pass' if not problems else 'FAIL: ' + '; '.join(problems)} |"
        )
    return "\n".join(lines)


DOC_HEADER = """# The model zoo

Every architecture below is built from a tiny configuration (no weights), with dropout on (train
mode), and planned at 50% and 75% of its un-checkpointed peak by both executors. Generated by
`python benchmarks/zoo.py` (the same cases as `python -m pytest -m zoo tests/test_zoo.py`; a fast
subset runs in the default test run).

- **measured**: the planned step's peak from the CPU allocator's events (`profiler.measure_step`):
  parameters, buffers and inputs plus the most the step allocated, independent of the plan;
- **predicted vs measured**: (predicted - measured) / measured; the tests allow 2%;
- **grad max abs diff**: against the unplanned model's gradients from the same seed (so also every
  dropout mask); the tests require 0, the same loss and the same RNG state after the step;
- **time**: building, profiling (in the first row of a model), planning, applying and checking, in
  seconds.

"""

SECTIONS = {
    "native": """## The native executor (`planner.plan`'s default)

`planner.plan(model, inputs, budget, loss_fn=...)` with nothing else: `solver="auto"`, regions of the
model under `torch.utils.checkpoint` (docs/native.md), `"N%"` of the eager step's measured peak
(**eager MiB**: the un-checkpointed step, output held through the backward, measured before planning).

- **plan**: `native` (regions of the model's own modules, **checkpointed**: how many and the first
  two); a model the tracer cannot follow is planned the same way on its step recorded eagerly
  (planner/untraced.py);
- **refused**: `planner.BudgetInfeasible` with the least budget the native executor reaches
  (whole-step bytes); each such budget is declared in benchmarks/zoo.py with its cause.
""",
    "traced": """## The traced executor (`solver="dp"`)

Each case planned with the chain DP (`solver="dp"`, or the solver the case names) and run by the
traced executor (runtime/module.py); `"N%"` of the planner's predicted un-checkpointed peak
(**unplanned MiB**).

- **plan**: `traced` (the schedule runs the traced step) or `native` (the tracer cannot follow the
  model: no trace to schedule, so the plan is the native one made from its step recorded eagerly).
""",
}
_BEGIN, _END = "<!-- zoo:{} begins: written by benchmarks/zoo.py -->", "<!-- zoo:{} ends -->"


def section(executor: str, text: str, machine: str) -> str:
    """One executor's part of docs/zoo.md, between markers that :func:`merge` replaces."""
    return (f"{_BEGIN.format(executor)}\n{SECTIONS[executor]}\nRun on {machine}.\n\n{text}\n"
            f"{_END.format(executor)}")


def merge(document: str, executor: str, part: str) -> str:
    """``document`` with ``executor``'s marked section replaced by ``part`` (appended after the
    other generated sections when it has none). What is outside the markers, notes written by hand
    below the tables, is kept; an empty document gets the header."""
    begin, end = _BEGIN.format(executor), _END.format(executor)
    if begin in document and end in document:
        head, rest = document.split(begin, 1)
        return head + part + rest.split(end, 1)[1]
    if not document.strip():
        return DOC_HEADER + part + "\n"
    ends = [document.index(_END.format(e)) + len(_END.format(e)) for e in EXECUTORS if _END.format(e) in document]
    cut = max(ends) if ends else len(document)
    return document[:cut] + "\n\n" + part + document[cut:]


def run_executor(names: list[str], executor: str) -> tuple[list[Row], list[str]]:
    """Every named case for ``executor``: its rows, and a table line for each case that raised
    (a case that raises is a row of the bug list, not the end of the run)."""
    rows: list[Row] = []
    errors: list[str] = []
    for name in names:
        try:
            case_rows = run_case(BY_NAME[name], executor=executor)
        except Exception as error:
            errors.append(f"| {name} | {type(error).__name__}: {str(error).splitlines()[0][:200]} |")
            print(f"{executor} {name}: {errors[-1]}", flush=True)
            continue
        rows.extend(case_rows)
        for line in table(case_rows).splitlines()[2:]:
            print(f"{executor} {line}", flush=True)
    return rows, errors


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated case names (default: every case)")
    parser.add_argument("--executor", default="both", choices=[*EXECUTORS, "both"],
                        help="which executor's table to make (default: both); the other's section is kept")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "zoo.md"), help="the markdown file to write")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or [c.name for c in CASES]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown cases: {', '.join(unknown)} (known: {', '.join(BY_NAME)})")
    machine = f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores"
    document = open(args.out).read() if os.path.exists(args.out) else ""
    failed = False
    for executor in EXECUTORS if args.executor == "both" else (args.executor,):
        rows, errors = run_executor(names, executor)
        text = table(rows)
        if errors:
            text += "\n\nCases that raised:\n\n| model | error |\n|---|---|\n" + "\n".join(errors)
        print(text)
        document = merge(document, executor, section(executor, text, machine))
        with open(args.out, "w") as out:  # after each executor: a long run keeps what it finished
            out.write(document)
        failed = failed or bool(errors) or any(failures(r) for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
