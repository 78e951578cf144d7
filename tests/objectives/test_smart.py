"""tasks/objectives/smart.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minbert.bert import BertModel
from tasks.task import get_task
from tasks.model import TaskOutput
from tasks.objectives.smart import (
    bernoulli_logits,
    smart_divergence,
    smart_penalty,
    smart_perturbation,
    symmetric_kl,
)
from tests.helpers import OBJECTIVE_B as B
from tests.helpers import OBJECTIVE_T as T
from tests.helpers import siamese_batch as make_batch
from tests.helpers import siamese_model as tiny_model
from tests.helpers import tiny_config


def test_symmetric_kl_identity_and_formula():
    """sym-KL of identical distributions is 0; otherwise it equals KL(P‖Q)+KL(Q‖P) and is symmetric."""
    g = torch.Generator().manual_seed(6)
    p, q = torch.randn(2, 4, 5, generator=g).unbind(0)
    assert symmetric_kl(p, p.clone()).item() == pytest.approx(0.0, abs=1e-7)
    lp, lq = p.log_softmax(-1), q.log_softmax(-1)
    expected = ((lp.exp() * (lp - lq)).sum(-1) + (lq.exp() * (lq - lp)).sum(-1)).mean()
    torch.testing.assert_close(symmetric_kl(p, q), expected)
    torch.testing.assert_close(symmetric_kl(q, p), expected)
    z = torch.randn(4, generator=g)
    torch.testing.assert_close(bernoulli_logits(z).softmax(-1)[:, 0], torch.sigmoid(z))
    assert smart_divergence(get_task("para"), z, z.clone()).item() == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_smart_perturbation_stays_in_the_ball(task):
    """After the ascent step δ lies in the L∞ ball of radius ε (and reaches it: the step is ≫ ε)."""
    model = tiny_model().train()
    eps = 1e-5
    _, delta = smart_penalty(model, task, make_batch(task), epsilon=eps, step_size=1e-3)
    assert set(delta) == ({""} if task == "sst" else {"_1", "_2"})
    for d in delta.values():
        assert d.abs().max().item() <= eps
        assert d.abs().max().item() == pytest.approx(eps)


class _LinearPairScore(nn.Module):
    """An STS "model" linear in the word embeddings: f(e) = Σ_{t,h} A_1 ⊙ e_1 + Σ_{t,h} A_2 ⊙ e_2 per example, so
    l_s = MSE(f(e + δ), f(e)) = mean_b r_b² with r_b = Σ A_s ⊙ δ_s[b] and ∇_{δ_s[b]} l_s = (2/B)·r_b·A_s."""

    def __init__(self, a1: torch.Tensor, a2: torch.Tensor):
        super().__init__()
        self.a = {"_1": a1, "_2": a2}
        self.encoder = BertModel(tiny_config())

    def entry(self, task):
        return get_task("sts")

    def forward(self, task, batch, inputs_embeds=None, transform=None):
        e = inputs_embeds or {s: self.encoder.embed_tokens(batch["input_ids" + s]) for s in self.a}
        return TaskOutput(sum((e[s] * self.a[s]).sum(dim=(1, 2)) for s in self.a))


@pytest.mark.parametrize("epsilon", [1.0, 2e-4])
def test_smart_ascent_step_is_the_per_example_linf_normalized_gradient(epsilon):
    """Algorithm 1's step computed by hand on a model whose gradient is known: δ_1 = δ_0 + η·g/‖g‖_∞ with ‖g‖_∞ the
    max over one example's tokens of both sentences, i.e. δ_0[b] + η·sign(r_b)·A_s / max(‖A_1‖_∞, ‖A_2‖_∞), then
    clamped to [−ε, ε]. ε = 1 leaves the step unclamped: its direction and size are checked before projection.
    A sign step, an L2 normalization or one norm over the whole batch would each give other numbers."""
    g = torch.Generator().manual_seed(9)
    a1 = torch.randn(T, 32, generator=g)
    a2 = torch.randn(T, 32, generator=g) * 0.5
    model = _LinearPairScore(a1, a2)
    batch = make_batch("sts")
    embeds = {s: model.encoder.embed_tokens(batch["input_ids" + s]).detach() for s in ("_1", "_2")}
    delta0 = {s: 1e-3 * torch.randn(B, T, 32, generator=g) for s in ("_1", "_2")}
    eta = 1e-3
    clean = model("sts", batch, inputs_embeds=embeds).logits
    got = smart_perturbation(model, "sts", batch, embeds, clean, delta0, step_size=eta, epsilon=epsilon, steps=1)

    r = sum((delta0[s] * model.a[s]).sum(dim=(1, 2)) for s in ("_1", "_2"))  # (B,) f(e + δ_0) − f(e)
    assert bool((r.abs() > 1e-4).all())  # every example has a gradient
    a_inf = max(float(a1.abs().max()), float(a2.abs().max()))
    for s in ("_1", "_2"):
        step = eta * torch.sign(r)[:, None, None] * model.a[s] / a_inf  # (B, T, H)
        expected = (delta0[s] + step).clamp(-epsilon, epsilon)
        torch.testing.assert_close(got[s], expected, rtol=1e-5, atol=1e-9)
    if epsilon == 1.0:  # unclamped: each example moved by exactly η in ‖·‖_∞ over both sentences
        moved = torch.stack([(got[s] - delta0[s]).abs().amax(dim=(1, 2)) for s in ("_1", "_2")]).amax(0)
        torch.testing.assert_close(moved, torch.full((B,), eta), rtol=1e-5, atol=0.0)


def test_smart_ascent_beats_random_sign_perturbation():
    """The ascent direction raises l_s more than a random ±ε perturbation of the same L∞ radius."""
    model = tiny_model().eval()
    batch = make_batch("sst")
    eps = 1e-2
    penalty, _ = smart_penalty(model, "sst", batch, epsilon=eps, step_size=1.0, sigma=1e-3)
    e = model.encoder.embed_tokens(batch["input_ids"])
    rand = eps * torch.randint(0, 2, e.shape, generator=torch.Generator().manual_seed(7)).float().mul(2).sub(1)
    random_pen = smart_divergence(get_task("sst"), model("sst", batch, inputs_embeds={"": e + rand}).logits,
                                  model("sst", batch).logits)
    assert penalty.item() > random_pen.item()


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_smart_penalty_zero_when_epsilon_zero(task):
    """ε = 0 leaves no perturbation: with replayed dropout masks the penalty is 0 even in train mode."""
    model = tiny_model(dropout=0.3).train()
    penalty, delta = smart_penalty(model, task, make_batch(task), epsilon=0.0)
    assert all(d.abs().max().item() == 0.0 for d in delta.values())
    assert penalty.item() == pytest.approx(0.0, abs=1e-10)


class _ConstantModel(nn.Module):
    """A model whose outputs ignore its input embeddings (they stay in the graph with zero gradient)."""

    def __init__(self):
        super().__init__()
        self.encoder = BertModel(tiny_config())
        self.logits = nn.Parameter(torch.randn(B, 5))

    def sides(self, task):
        return ("",)  # one sequence, as SST's head reads

    def entry(self, task):
        return get_task("sts")

    def forward(self, task, batch, inputs_embeds=None, transform=None):
        e = inputs_embeds[""] if inputs_embeds else self.encoder.embed_tokens(batch["input_ids"])
        return TaskOutput(self.logits + 0.0 * e.sum())


def test_smart_penalty_zero_for_constant_model():
    """A constant model is perfectly smooth: zero gradient, zero step, zero penalty, no NaN."""
    penalty, delta = smart_penalty(_ConstantModel(), "sst", make_batch("sst"))
    assert penalty.item() == 0.0
    assert all(torch.isfinite(d).all() for d in delta.values())


def test_smart_reuse_head_output_matches_eval_mode():
    """With no dropout, reusing the head's forward as f(e) gives the same penalty as the replayed clean pass."""
    model = tiny_model().eval()
    batch = make_batch("para")
    torch.manual_seed(8)
    own, _ = smart_penalty(model, "para", batch, epsilon=1e-2, step_size=1.0)
    torch.manual_seed(8)
    reused, _ = smart_penalty(model, "para", batch, out=model("para", batch), epsilon=1e-2, step_size=1.0,
                              reuse_head_output=True)
    torch.testing.assert_close(own, reused, rtol=1e-5, atol=1e-9)
