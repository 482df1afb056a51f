"""The joint graph's cross-entropy backward, fused (profiler/fusions.py): same bits, less memory."""

import pytest
import torch
import torch.nn.functional as F

import planner
import profiler
from profiler.capture import capture
from profiler.fusions import cross_entropy_backward

aten = torch.ops.aten


def unfused(grad_output, log_probs, target, weight, reduction, ignore_index, total_weight):
    dense = aten.nll_loss_backward(grad_output, log_probs, target, weight, reduction, ignore_index, total_weight)
    return aten._log_softmax_backward_data(dense, log_probs, 1, log_probs.dtype)


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("chunk_bytes, max_chunks", [(3 * 100 * 4, 64), (1, 4)])
def test_fused_backward_is_torchs_to_the_bit(reduction, weighted, chunk_bytes, max_chunks, monkeypatch):
    # Chunks of 3 rows (by bytes) or of 10 (at most 4 chunks), neither dividing the 37 rows.
    monkeypatch.setattr("profiler.fusions.CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr("profiler.fusions.MAX_CHUNKS", max_chunks)
    generator = torch.Generator().manual_seed(reduction)
    log_probs = torch.log_softmax(torch.randn(37, 100, generator=generator), 1)
    target = torch.randint(0, 100, (37,), generator=generator)
    target[::5] = -100  # ignored rows
    weight = torch.rand(100, generator=generator) if weighted else None
    grad_output = torch.randn(37, generator=generator) if reduction == 0 else torch.tensor(0.7)
    kept = target != -100
    total_weight = (weight[target[kept]].sum() if weighted else kept.sum().float()).reshape(())
    args = (grad_output, log_probs, target, weight, reduction, -100, total_weight)
    assert torch.equal(cross_entropy_backward(*args), unfused(*args))


class TinyLanguageModel(torch.nn.Module):
    """Embedding, one hidden layer, a wide vocabulary head and the loss inside forward, as Hugging
    Face's language models compute it (with labels)."""

    def __init__(self, vocab: int = 4096, width: int = 64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.hidden = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids, labels):
        logits = self.head(torch.relu(self.hidden(self.embed(ids))))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)


def language_batch(vocab: int = 4096, rows: int = 512):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows,), generator=generator)
    labels = ids.roll(-1).clone()
    labels[::7] = -100
    return {"ids": ids, "labels": labels}


def same_gradients(model, planned_module, batch, loss) -> bool:
    """Whether one step of each leaves the same parameter gradients, to the bit."""

    def gradients(module):
        model.zero_grad(set_to_none=True)
        loss(module(**batch)).backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    expected, got = gradients(model), gradients(planned_module)
    return all(torch.equal(expected[name], got[name]) for name in expected)


def test_the_cross_entropy_in_the_graph_is_fused():
    torch.manual_seed(0)
    model, batch = TinyLanguageModel(), language_batch()
    joint, _ = capture(model, (), batch, loss_fn=lambda loss: loss)
    targets = {node.target for node in joint.graph_module.graph.nodes}
    assert torch.ops.plan_checkpoints.cross_entropy_backward.default in targets
    assert aten.nll_loss_backward.default not in targets
    assert aten._log_softmax_backward_data.default not in targets


def test_the_fused_step_peaks_a_logits_lower_than_eager_with_the_same_gradients():
    """Eager holds the log-probabilities, the dense gradient nll_loss_backward makes and the logits'
    gradient at once (3 x 8 MiB here); the planned step never holds the dense one whole."""
    torch.manual_seed(0)
    model, batch = TinyLanguageModel(), language_batch()
    logits_bytes = 512 * 4096 * 4
    loss = lambda out: out  # noqa: E731
    eager = profiler.measure_step(model, batch, loss_fn=loss, repeats=1).peak_bytes
    plan = planner.plan(model, batch, budget="100%", solver="store-all", loss_fn=loss)
    planned_module = planner.apply(model, plan)
    planned = profiler.measure_step(planned_module, batch, loss_fn=loss, repeats=1).peak_bytes
    assert planned <= eager - 0.85 * logits_bytes
    assert abs(planned - plan.predicted_peak_bytes) <= 0.01 * planned
    assert same_gradients(model, planned_module, batch, loss)


class LanguageModelReturningLogits(TinyLanguageModel):
    """As Hugging Face's: the loss and the logits, which the caller then holds to the end."""

    def forward(self, ids, labels):
        logits = self.head(torch.relu(self.hidden(self.embed(ids))))
        return F.cross_entropy(logits, labels, ignore_index=-100), logits


def test_a_budget_only_recomputed_log_probabilities_meet_is_planned_on_them(tmp_path):
    """With the logits held as an output, the loss's moment holds logits, log-probabilities and the
    logits' gradient (3 x 8 MiB here) whatever is recomputed; reading the logits again instead of
    holding the log-probabilities makes it 2 x 8 MiB and two chunks. At a budget only that meets,
    the plan is made on that trace; at 100% it is not."""
    torch.manual_seed(0)
    model, batch = LanguageModelReturningLogits(), language_batch()
    loss = lambda out: out[0]  # noqa: E731
    profile = profiler.profile(model, batch, loss_fn=loss)
    recomputed = profile.with_log_probs_recomputed()
    assert recomputed.graph.graph["log_probs_recomputed"]
    assert recomputed.fingerprint != profile.fingerprint
    budget = planner.plan(model, batch, budget="100%", solver="store-all", profile=recomputed).predicted_peak_bytes
    assert budget <= planner.plan(model, batch, budget="100%", profile=profile, executor="traced").predicted_peak_bytes - 6 * 2**20

    plan = planner.plan(model, batch, budget=budget, loss_fn=loss, profile=profile, executor="traced")
    assert plan.graph.graph.get("log_probs_recomputed")
    assert "recomputes its log-probabilities" in plan.schedule.info.message
    plan.save(tmp_path / "plan.json")
    planned_module = planner.apply(model, planner.load(tmp_path / "plan.json"))
    measured = profiler.measure_step(planned_module, batch, loss_fn=loss, repeats=1).peak_bytes
    assert measured <= budget
    assert abs(measured - plan.predicted_peak_bytes) <= 0.01 * measured
    assert same_gradients(model, planned_module, batch, loss)
    assert not planner.plan(model, batch, budget="100%", profile=profile, executor="traced").graph.graph.get("log_probs_recomputed")
