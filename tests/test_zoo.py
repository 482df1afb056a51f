"""The model zoo (benchmarks/zoo.py): every architecture planned at 50% and 75% of its peak.

Each case is built from a tiny configuration with dropout on, planned with the chain DP, applied
and run. The planned step's peak, measured from the allocator's events, must be within the budget
and within 2% of the prediction (a fallback plan's figures are measured, so only the budget
applies); its loss, gradients and RNG state after the step must equal the unplanned model's from
the same seed, bit for bit (so every dropout mask is the same).

A fast subset runs by default (``Case.fast``); the whole zoo, the subset included, with
``python -m pytest -m zoo tests/test_zoo.py`` (about 10 minutes on a 2-core CPU). ``python benchmarks/zoo.py`` writes the
table to docs/zoo.md.
"""

from __future__ import annotations

import pytest

from benchmarks.zoo import CASES, failures, run_case

FAST = [pytest.param(case, id=case.name) for case in CASES if case.fast]
# Every case, the fast ones again: ``-m zoo`` runs the whole zoo. A case with a known failure is
# marked xfail with its reason (benchmarks/zoo.py says what was measured).
EVERY = [pytest.param(case, id=case.name,
                      marks=[pytest.mark.zoo] + ([pytest.mark.xfail(reason=case.xfail, strict=case.xfail_strict)]
                                                 if case.xfail else []))
         for case in CASES]


def check(case):
    rows = run_case(case)
    assert [row.budget_text for row in rows] == ["50%", "75%"]
    problems = [f"{row.budget_text}: {problem}" for row in rows for problem in failures(row)]
    assert not problems, f"{case.name}: " + "; ".join(problems)
    return rows


# The subset is small to keep the default run within its time: the fallback path (nn-control-flow)
# is covered by tests/test_models.py, the dropout masks of a ViT on nn.TransformerEncoder (nn-vit)
# by tests/test_profiler.py's transposed-activation test; both run under -m zoo.
@pytest.mark.parametrize("case", FAST)
def test_fast_subset(case):
    rows = check(case)
    assert all(row.traced for row in rows)


@pytest.mark.parametrize("case", EVERY)
def test_zoo(case):
    check(case)


def test_the_fast_subset_has_no_known_failure():
    assert not [case.name for case in CASES if case.fast and (case.xfail or case.infeasible)]


def test_the_zoo_is_broad():
    """At least 25 transformers architectures and the torch.nn kinds the issue names."""
    hugging_face = [c for c in CASES if c.kind != "torch.nn"]
    assert len(hugging_face) >= 25
    assert {"decoder", "encoder", "encoder-decoder", "vision", "speech"} <= {c.kind for c in hugging_face}
    names = {c.name for c in CASES}
    assert {"nn-transformer-encoder", "nn-lstm", "nn-gru", "nn-unet", "nn-moe-top2", "nn-control-flow"} <= names
