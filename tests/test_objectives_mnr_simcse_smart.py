"""MNR, SimCSE and SMART objectives: reference parity, math identities, gradients, end to end."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss  # test dependency
from torch import nn

from minbert.bert import BertModel
from tasks.model import ModelConfig, MultitaskBert, TaskOutput
from tasks.objectives import REGISTRY, build_objectives
from tasks.objectives.mnr import MNRConfig, MultipleNegativesRanking, masked_mnr_loss, mnr_loss, sts_label_weights
from tasks.objectives.simcse import SimCSEConfig, simcse_loss
from tasks.objectives.smart import (
    SMARTConfig,
    bernoulli_logits,
    smart_divergence,
    smart_penalty,
    smart_perturbation,
    symmetric_kl,
)
from tests.helpers import tiny_config

B, T = 6, 7


def tiny_model(arch: str = "b1", dropout: float = 0.1) -> MultitaskBert:
    torch.manual_seed(0)
    enc = BertModel(tiny_config(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))
    return MultitaskBert(enc, ModelConfig(arch=arch, fcn_size=16, head_dropout=0.0))


def _seq(suffix: str, g: torch.Generator, n: int = B) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 99, (n, T), generator=g)
    mask = torch.ones(n, T, dtype=torch.long)
    mask[0, 4:] = 0  # one padded row: masking is exercised
    ids[mask == 0] = 0
    return {"input_ids" + suffix: ids, "attention_mask" + suffix: mask,
            "token_type_ids" + suffix: torch.zeros(n, T, dtype=torch.long)}


def make_batch(task: str, seed: int = 0) -> dict:
    """A hand-made collated batch with the data module's keys."""
    g = torch.Generator().manual_seed(seed)
    ids = [str(i) for i in range(B)]
    if task == "sst":
        return {**_seq("", g), "labels": torch.randint(0, 5, (B,), generator=g), "ids": ids}
    if task == "para":
        return {**_seq("_1", g), **_seq("_2", g), "labels": torch.tensor([1., 0., 1., 1., 0., 0.]), "ids": ids}
    if task == "sts":
        return {**_seq("_1", g), **_seq("_2", g), "labels": torch.rand(B, generator=g) * 5, "ids": ids}
    if task == "nli":
        return {**_seq("_1", g), **_seq("_2", g), **_seq("_3", g), "ids": ids}
    raise ValueError(task)


# ---- registry -----------------------------------------------------------------------


def test_registry_contains_the_three_objectives():
    """Importing the modules registers "mnr", "simcse" and "smart"; build_objectives finds them by name."""
    for name in ("mnr", "simcse", "smart"):
        assert name in REGISTRY
    objs = build_objectives({"mnr": {}, "simcse": {}, "smart": {}}, None)
    assert [o.name for o in objs] == ["mnr", "simcse", "smart"]
    assert REGISTRY["mnr"].needs_siamese is True


def test_configs_refuse_contradictions():
    """Contradictory or unknown options raise with a reason instead of being ignored."""
    with pytest.raises(ValueError, match="para_positives"):
        MNRConfig(tasks=("sts", "para"))
    with pytest.raises(ValueError, match="para_positives"):
        MNRConfig(tasks=("sts",), para_positives=True)
    with pytest.raises(ValueError):
        MNRConfig(tasks=("sst",))
    with pytest.raises(ValueError):
        SimCSEConfig(similarity="l2")
    with pytest.raises(ValueError):
        SMARTConfig(tasks=("nli",))
    with pytest.raises(ValueError):
        build_objectives({"smart": {"radius": 1.0}}, None)


def test_mnr_default_tasks_follow_para_positives():
    """Empty tasks = ("sts", "nli"), plus "para" exactly when para_positives is set."""
    assert MultipleNegativesRanking(MNRConfig()).active_tasks() == ("sts", "nli")
    assert MultipleNegativesRanking(MNRConfig(para_positives=True)).active_tasks() == ("sts", "nli", "para")
    assert MultipleNegativesRanking(MNRConfig(tasks=("nli",))).active_tasks() == ("nli",)


# ---- MNR ----------------------------------------------------------------------------


@pytest.mark.parametrize("n_neg", [0, 1, 2])
def test_mnr_equals_sentence_transformers(n_neg):
    """mnr_loss equals sentence-transformers' MultipleNegativesRankingLoss (scale 20, cos_sim), hard negatives included."""
    g = torch.Generator().manual_seed(1)
    a, b, *negs = torch.randn(2 + n_neg, 8, 16, generator=g).unbind(0)
    ref = MultipleNegativesRankingLoss(nn.Identity(), scale=20.0).compute_loss_from_embeddings([a, b, *negs], None)
    ours = mnr_loss(a, b, negatives=negs or None, scale=20.0)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)


def test_mnr_weighted_is_plain_when_labels_are_equal():
    """Unit weights give the plain loss; equal labels l give it times e^l / Σ_{j=0..5} e^j (§4.4 equation)."""
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(2, 8, 16, generator=g).unbind(0)
    plain = mnr_loss(a, b)
    torch.testing.assert_close(mnr_loss(a, b, weights=torch.ones(8)), plain)
    for label in (0.0, 3.0, 5.0):
        w = sts_label_weights(torch.full((8,), label))
        common = math.exp(label) / sum(math.exp(j) for j in range(6))
        torch.testing.assert_close(mnr_loss(a, b, weights=w), common * plain)


def test_mnr_weighted_matches_paper_equation():
    """The STS variant equals -1/K Σ_i w_i log softmax_i(20·cos) written as explicit loops."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 5, 4, generator=g).unbind(0)
    labels = torch.tensor([0.0, 1.5, 5.0, 3.2, 4.0])
    norm = sum(math.exp(j) for j in range(6))
    total = 0.0
    for i in range(5):
        s = [20.0 * F.cosine_similarity(a[i], b[j], dim=0).item() for j in range(5)]
        log_p = s[i] - math.log(sum(math.exp(x) for x in s))
        total += math.exp(labels[i].item()) / norm * log_p
    expected = -total / 5
    assert mnr_loss(a, b, weights=sts_label_weights(labels)).item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("hard_negatives", [True, False])
def test_mnr_nli_uses_sts_head_and_hard_negative_column(hard_negatives):
    """NLI triplets go through sts_embeddings; the stacked pass equals separate passes; _3 is a column iff enabled."""
    model = tiny_model().eval()
    batch = make_batch("nli")
    for key in ("input_ids_2", "attention_mask_2", "token_type_ids_2"):
        batch[key] = batch[key][:, :5]  # sides of different lengths: the stacked pass pads them
    obj = MultipleNegativesRanking(MNRConfig(hard_negatives=hard_negatives))
    got = obj(model, "nli", batch, None)["loss"]
    z = [model.sts_embeddings(model.embed(batch["input_ids" + s], batch["attention_mask" + s],
                                          batch["token_type_ids" + s])) for s in ("_1", "_2", "_3")]
    expected = mnr_loss(z[0], z[1], negatives=z[2] if hard_negatives else None)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_mnr_sts_uses_head_features_and_label_weights():
    """On STS, MNR reads out.features sts_1/sts_2 and weights by the batch labels (on by default)."""
    model = tiny_model().eval()
    batch = make_batch("sts")
    out = model("sts", batch)
    got = MultipleNegativesRanking(MNRConfig())(model, "sts", batch, out)["loss"]
    expected = mnr_loss(out.features["sts_1"], out.features["sts_2"], weights=sts_label_weights(batch["labels"]))
    torch.testing.assert_close(got, expected)
    plain = MultipleNegativesRanking(MNRConfig(sts_label_weighting=False))(model, "sts", batch, out)["loss"]
    torch.testing.assert_close(plain, mnr_loss(out.features["sts_1"], out.features["sts_2"]))


def test_mnr_para_positives_only_and_zero_below_two():
    """Para MNR ranks only the label-1 pairs on pooled embeddings (equal to mnr_loss of the indexed positives, the
    formula the mask replaced); fewer than 2 positives gives exactly 0 with a zero gradient."""
    model = tiny_model().eval()
    batch = make_batch("para")
    out = model("para", batch)
    obj = MultipleNegativesRanking(MNRConfig(para_positives=True))
    pos = batch["labels"] > 0.5
    expected = mnr_loss(out.features["pooled_1"][pos], out.features["pooled_2"][pos])
    torch.testing.assert_close(obj(model, "para", batch, out)["loss"], expected, rtol=1e-6, atol=1e-6)
    for labels in ([1., 0., 0., 0., 0., 0.], [0.] * 6):
        batch["labels"] = torch.tensor(labels)
        a = out.features["pooled_1"].detach().requires_grad_(True)
        loss = masked_mnr_loss(a, out.features["pooled_2"].detach(), batch["labels"] > 0.5)
        loss.backward()
        assert loss.item() == 0.0 and torch.count_nonzero(a.grad) == 0
        assert obj(model, "para", batch, out)["loss"].item() == 0.0


@pytest.mark.parametrize("seed", range(4))
def test_masked_mnr_equals_mnr_of_the_kept_pairs(seed):
    """masked_mnr_loss(a, b, keep) = mnr_loss(a[keep], b[keep]) for random masks (2 or more kept pairs), value and
    gradient: the rewrite without boolean indexing computes the same numbers."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(2, 10, 8, generator=g).unbind(0)
    keep = torch.rand(10, generator=g) < 0.6
    keep[:2] = True
    a1, a2 = a.clone().requires_grad_(True), a.clone().requires_grad_(True)
    masked = masked_mnr_loss(a1, b, keep, scale=20.0)
    indexed = mnr_loss(a2[keep], b[keep], scale=20.0)
    torch.testing.assert_close(masked, indexed, rtol=1e-6, atol=1e-6)
    masked.backward()
    indexed.backward()
    torch.testing.assert_close(a1.grad, a2.grad, rtol=1e-5, atol=1e-7)


def test_mnr_refuses_cross_encoded_pairs():
    """Without Siamese features (pair_encoding='cross') MNR raises instead of guessing."""
    torch.manual_seed(0)
    model = MultitaskBert(BertModel(tiny_config()), ModelConfig(arch="b1", fcn_size=16, pair_encoding="cross")).eval()
    g = torch.Generator().manual_seed(0)
    batch = {**_seq("", g), "labels": torch.rand(B) * 5}
    with pytest.raises(ValueError, match="Siamese"):
        MultipleNegativesRanking(MNRConfig())(model, "sts", batch, model("sts", batch))


# ---- SimCSE -------------------------------------------------------------------------


def _simcse_loops(z1: torch.Tensor, z2: torch.Tensor, temperature: float, similarity: str) -> float:
    n = z1.shape[0]

    def sim(u, v):
        d = float(u @ v)
        return d / (float(u.norm()) * float(v.norm())) if similarity == "cos" else d

    total = 0.0
    for i in range(n):
        logits = [sim(z1[i], z2[j]) / temperature for j in range(n)]
        m = max(logits)
        total += -(logits[i] - m - math.log(sum(math.exp(x - m) for x in logits)))
    return total / n


@pytest.mark.parametrize("similarity,temperature", [("cos", 0.05), ("dot", 1.0), ("dot", 0.5)])
def test_simcse_matches_explicit_loops(similarity, temperature):
    """simcse_loss equals the InfoNCE written with loops, for cosine and dot product."""
    g = torch.Generator().manual_seed(4)
    z1, z2 = torch.randn(2, 6, 8, generator=g, dtype=torch.float64).unbind(0)
    got = simcse_loss(z1, z2, temperature, similarity).item()
    assert got == pytest.approx(_simcse_loops(z1, z2, temperature, similarity), rel=1e-5)


def test_simcse_identical_views_small_temperature_is_zero():
    """Identical views of distinct sentences at a tiny temperature: the positive dominates, loss ~ 0."""
    z = torch.randn(8, 16, generator=torch.Generator().manual_seed(5))
    assert simcse_loss(z, z.clone(), temperature=1e-3).item() < 1e-6


def test_simcse_objective_encodes_each_side_twice():
    """The objective's views differ by dropout in train mode and coincide in eval mode (per side, averaged)."""
    model = tiny_model(dropout=0.1)
    batch = make_batch("sts")
    obj = build_objectives({"simcse": {}}, model)[0]
    model.eval()
    expected = torch.stack([
        simcse_loss(*(2 * [model.embed(batch["input_ids" + s], batch["attention_mask" + s],
                                       batch["token_type_ids" + s])]))
        for s in ("_1", "_2")]).mean()
    torch.testing.assert_close(obj(model, "sts", batch, None)["loss"], expected, rtol=1e-5, atol=1e-5)
    model.train()
    assert not torch.allclose(obj(model, "sts", batch, None)["loss"], expected)


# ---- SMART --------------------------------------------------------------------------


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
    assert smart_divergence("para", z, z.clone()).item() == pytest.approx(0.0, abs=1e-7)


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
    random_pen = smart_divergence("sst", model("sst", batch, inputs_embeds={"": e + rand}).logits,
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


# ---- gradients and end to end -------------------------------------------------------

CASES = [("mnr", {}, "sts"), ("mnr", {}, "nli"), ("mnr", {"para_positives": True}, "para"),
         ("simcse", {"tasks": ("sst", "para", "sts", "nli")}, "sst"), ("simcse", {}, "sts"),
         ("smart", {"epsilon": 1e-3}, "sst"), ("smart", {"epsilon": 1e-3}, "para"),
         ("smart", {"epsilon": 1e-3}, "sts")]


@pytest.mark.parametrize("name,overrides,task", CASES)
def test_objective_gradients_reach_the_encoder(name, overrides, task):
    """Each objective's term back-propagates into the encoder's layers and word embeddings."""
    model = tiny_model().train()
    batch = make_batch(task)
    obj = build_objectives({name: overrides}, model)[0]
    assert obj.applies_to(task)
    out = None if task == "nli" else model(task, batch)
    terms = obj(model, task, batch, out)
    assert terms
    sum(terms.values()).backward()
    for pname in ("embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.qkv.weight"):
        grad = model.encoder.get_parameter(pname).grad
        assert grad is not None and grad.abs().sum() > 0, pname


def _expected_term(model, name: str, task: str, batch: dict, out, seed: int) -> torch.Tensor:
    """The term of objective ``name`` on ``batch`` computed from the model's passes, not through the objective
    (eval mode: no dropout, so every pass is the same function)."""
    def embed(s):
        return model.embed(batch["input_ids" + s], batch["attention_mask" + s], batch["token_type_ids" + s])

    if name == "mnr":
        if task == "sts":
            return mnr_loss(out.features["sts_1"], out.features["sts_2"], weights=sts_label_weights(batch["labels"]))
        if task == "nli":
            z = [model.sts_embeddings(embed(s)) for s in ("_1", "_2", "_3")]
            return mnr_loss(z[0], z[1], negatives=z[2])
        pos = batch["labels"] > 0.5
        return mnr_loss(out.features["pooled_1"][pos], out.features["pooled_2"][pos])
    if name == "simcse":  # eval mode: the two views coincide
        sides = [s for s in ("", "_1", "_2", "_3") if "input_ids" + s in batch]
        return torch.stack([simcse_loss(embed(s), embed(s)) for s in sides]).mean()
    torch.manual_seed(seed)  # the objective drew δ_0 from this seed: the same δ
    _, delta = smart_penalty(model, task, batch, sigma=0.1, step_size=2.0, epsilon=1.0)
    sides = list(delta)
    e = {s: model.encoder.embed_tokens(batch["input_ids" + s]) for s in sides}
    adv = model(task, batch, inputs_embeds={s: e[s] + delta[s] for s in sides}).logits
    return smart_divergence(task, adv, model(task, batch).logits)


@pytest.mark.parametrize("arch", ["baseline", "b1"])
def test_objectives_end_to_end_terms_equal_independent_computations(arch):
    """All three objectives on a tiny MultitaskBert, every task stream they apply to: each term equals the same
    quantity computed from the model's own passes (MNR and SimCSE from embeddings, SMART's l_s at the δ it drew),
    and the summed loss back-propagates."""
    model = tiny_model(arch).eval()
    with torch.no_grad():  # heads at init (std 0.02) give near-constant logits; spread them so l_s is not ~0
        for name, m in model.named_modules():
            if isinstance(m, nn.Linear) and not name.startswith("encoder."):
                m.weight.normal_(0.0, m.in_features ** -0.5)
    smart = {"sigma": 0.1, "step_size": 2.0, "epsilon": 1.0}  # a penalty far above rounding
    objs = build_objectives({"mnr": {"para_positives": True}, "simcse": {"tasks": ("sst", "para", "sts", "nli")},
                             "smart": smart}, model)
    seen = set()
    for k, task in enumerate(("sst", "para", "sts", "nli")):
        batch = make_batch(task)
        out = None if task == "nli" else model(task, batch)
        total = model.task_loss(task, out, batch) if out is not None else 0.0
        for obj in objs:
            if obj.applies_to(task):
                seed = 100 + k
                torch.manual_seed(seed)
                terms = obj(model, task, batch, out)
                assert set(terms) == {"loss" if obj.name != "smart" else "penalty"}
                for value in terms.values():
                    expected = _expected_term(model, obj.name, task, batch, out, seed)
                    assert expected.item() > 1e-4, (obj.name, task)  # not 0 = 0
                    torch.testing.assert_close(value, expected, rtol=1e-4, atol=0.0, msg=f"{obj.name} {task}")
                    total = total + obj.weight * value
                    seen.add((obj.name, task))
        total.backward()
    assert seen == {("mnr", "sts"), ("mnr", "nli"), ("mnr", "para"), ("simcse", "sst"), ("simcse", "para"),
                    ("simcse", "sts"), ("simcse", "nli"), ("smart", "sst"), ("smart", "para"), ("smart", "sts")}


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_smart_acts_under_bf16_autocast(task):
    """Under the default bf16 autocast SMART's δ of 1e-5 still changes the output (its passes run in fp32): the
    penalty is nonzero and equals the penalty computed with autocast off (same δ0, no dropout)."""
    model = tiny_model().eval()
    batch = make_batch(task)
    torch.manual_seed(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_bf16, _ = smart_penalty(model, task, batch)
    torch.manual_seed(3)
    fp32, _ = smart_penalty(model, task, batch)
    assert under_bf16.item() > 0
    torch.testing.assert_close(under_bf16, fp32, rtol=1e-4, atol=0)
