"""tasks/objectives/rift.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tasks.task import get_task
from tasks.objectives import rift as rift_mod
from tasks.objectives.rift import (
    RIFT,
    RIFTConfig,
    conditional_infonce,
    conditional_infonce_logits,
    kl_divergence,
    kl_per_example,
    pgd_attack,
    projection,
    same_class_mask,
)
from tests.helpers import make_batch, tiny_model


def _projections(n_classes: int, hidden: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    ps = torch.nn.ModuleList(projection(hidden, 16, 4) for _ in range(n_classes))
    pt = torch.nn.ModuleList(projection(hidden, 16, 4) for _ in range(n_classes))
    return ps, pt


def test_infonce_mask_allows_same_class_pairs_only():
    """The conditional InfoNCE scores pair (i, j) iff y_i == y_j: every other entry is −inf (never a negative)."""
    labels = torch.tensor([0, 1, 0, 2, 1, 0])
    expected = torch.tensor([[labels[i] == labels[j] for j in range(6)] for i in range(6)])
    assert torch.equal(same_class_mask(labels), expected)
    ps, pt = _projections(3)
    g = torch.Generator().manual_seed(0)
    logits = conditional_infonce_logits(torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g), labels,
                                        ps, pt, 0.2)
    assert torch.equal(torch.isfinite(logits), expected)


def test_conditional_infonce_equals_per_class_loop():
    """L_I equals the mean over classes of InfoNCE run on each class alone with that class's projections
    (g_c, h_c); a singleton class contributes nothing and its teacher feature is never used."""
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 1])
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(7, 8, generator=g), torch.randn(7, 8, generator=g)
    ps, pt = _projections(3)
    loss = conditional_infonce(s, t, labels, ps, pt, 0.2)
    per_class = []
    for c in (0, 1):  # class 2 has one example: no negative, skipped
        idx = (labels == c).nonzero().squeeze(1)
        zs = F.normalize(ps[c](s[idx]), dim=-1)
        zt = F.normalize(pt[c](t[idx]), dim=-1)
        per_class.append(F.cross_entropy(zs @ zt.T / 0.2, torch.arange(len(idx))))
    torch.testing.assert_close(loss, torch.stack(per_class).mean())
    t2 = t.clone()
    t2[3] = torch.randn(8, generator=g)  # the singleton's teacher feature
    torch.testing.assert_close(conditional_infonce(s, t2, labels, ps, pt, 0.2), loss)
    t2[1] = torch.randn(8, generator=g)  # a class-1 teacher feature matters
    assert not torch.allclose(conditional_infonce(s, t2, labels, ps, pt, 0.2), loss)
    # Only singletons: nothing to contrast, 0 with finite gradients.
    sg = s[:3].clone().requires_grad_(True)
    zero = conditional_infonce(sg, t[:3], torch.tensor([0, 1, 2]), ps, pt, 0.2)
    zero.backward()
    assert zero.item() == 0.0 and torch.isfinite(sg.grad).all()


def test_frozen_encoder_gets_no_gradient_and_stays_unchanged():
    """After backward + optimizer step over model and objective parameters the frozen pretrained encoder is
    unchanged, has no .grad, is in eval mode, and is neither in objective.parameters() nor its state_dict;
    the per-class projections train."""
    model = tiny_model().train()
    obj = RIFT(RIFTConfig(tasks=("sst",)), model).train()
    frozen = obj.frozen_encoder
    frozen_ids = {id(p) for p in frozen.parameters()}
    assert not frozen_ids & {id(p) for p in obj.parameters()}
    assert not frozen_ids & {id(p) for p in model.parameters()}
    assert all(k.startswith(("proj_student.", "proj_teacher.")) for k in obj.state_dict())
    assert not frozen.training and all(not p.requires_grad for p in frozen.parameters())
    before = {n: p.clone() for n, p in frozen.named_parameters()}

    opt = torch.optim.SGD([*model.parameters(), *obj.parameters()], lr=0.5)
    batch = make_batch("sst", n=10)  # labels 0..4 twice: every class has a negative
    out = model("sst", batch)
    terms = obj(model, "sst", batch, out)
    (model.task_loss("sst", out, batch) + sum(terms.values())).backward()
    opt.step()

    for n, p in frozen.named_parameters():
        assert p.grad is None and torch.equal(p, before[n]), n
    moved = model.encoder.embeddings.word_embeddings.weight
    assert not torch.equal(moved, frozen.embeddings.word_embeddings.weight)
    for c in range(5):
        for proj in (obj.proj_student["sst"][c], obj.proj_teacher["sst"][c]):
            assert float(proj[0].weight.grad.abs().sum()) > 0


@pytest.mark.parametrize("pooling", ["pooler", "cls", "mean"])
def test_teacher_features_equal_the_models_before_training(pooling):
    """At construction the frozen copy pools exactly as the model does: teacher features == model.embed."""
    model = tiny_model(pooling=pooling).eval()
    obj = RIFT(RIFTConfig(), model)
    batch = make_batch("sst")
    expected = model.embed(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    torch.testing.assert_close(obj.teacher_features(model, batch), expected, rtol=0, atol=0)


@pytest.mark.parametrize("norm", ["l2", "linf"])
@pytest.mark.parametrize("task,pair_encoding", [("sst", "cross"), ("para", "siamese")])
def test_pgd_perturbation_stays_in_its_ball(norm, task, pair_encoding):
    """Every token's δ lies in its ε-ball (‖δ_t‖₂ ≤ ε or |δ_t,h| ≤ ε), padding is never perturbed, the
    model's train mode comes back, and no parameter gradient is left behind (both Siamese sides attacked)."""
    model = tiny_model("baseline", pair_encoding, init=0.5).train()
    batch = make_batch(task, pair_encoding)
    eps = 0.05
    adv = pgd_attack(model, task, batch, norm=norm, epsilon=eps, step_size=0.04, steps=3)
    assert model.training and all(p.grad is None for p in model.parameters())
    with torch.no_grad():  # evaluation code may hold no_grad: the attack still works
        adv_ng = pgd_attack(model, task, batch, norm=norm, epsilon=eps, step_size=0.04, steps=3,
                            generator=torch.Generator().manual_seed(0))
    adv_g = pgd_attack(model, task, batch, norm=norm, epsilon=eps, step_size=0.04, steps=3,
                       generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(adv_ng[s], adv_g[s]) for s in adv_g)
    suffixes = ("",) if pair_encoding == "cross" else ("_1", "_2")
    assert set(adv) == set(suffixes)
    for s in suffixes:
        delta = adv[s] - model.encoder.embed_tokens(batch["input_ids" + s]).detach()
        pad = batch["attention_mask" + s] == 0
        assert torch.equal(delta[pad], torch.zeros_like(delta[pad]))
        size = delta.norm(dim=-1) if norm == "l2" else delta.abs().amax(dim=-1)  # (B, T)
        assert float(size.max()) <= eps * (1 + 1e-5)
        assert float(size.max()) > 0.5 * eps  # it did move


@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_pgd_does_not_decrease_the_kl(norm):
    """KL(p(x) ‖ p(x')) after PGD is, per example, at least the KL of its random start (same RNG), above the
    0 of the unperturbed input, and in total above the best of 30 random points on the ball's surface
    (the steps ascend)."""
    model = tiny_model(init=0.5).eval()
    batch = make_batch("sst")
    eps = 0.3 if norm == "l2" else 0.3 / math.sqrt(32)
    kwargs = dict(norm=norm, epsilon=eps, step_size=eps / 2)
    start = pgd_attack(model, "sst", batch, steps=0, generator=torch.Generator().manual_seed(3), **kwargs)
    final = pgd_attack(model, "sst", batch, steps=4, generator=torch.Generator().manual_seed(3), **kwargs)
    with torch.no_grad():
        clean = model("sst", batch).logits
        zero = model("sst", batch, inputs_embeds={"": model.encoder.embed_tokens(batch["input_ids"])}).logits
        kl_zero = kl_per_example(get_task("sst"), clean, zero)
        kl_start = kl_per_example(get_task("sst"), clean, model("sst", batch, inputs_embeds=start).logits)
        kl_final = kl_per_example(get_task("sst"), clean, model("sst", batch, inputs_embeds=final).logits)
        embeds, keep = model.encoder.embed_tokens(batch["input_ids"]), batch["attention_mask"].unsqueeze(-1)
        g = torch.Generator().manual_seed(0)
        random_kl = []
        for _ in range(30):
            d = torch.randn(embeds.shape, generator=g)
            d = d / d.norm(dim=-1, keepdim=True) * eps if norm == "l2" else d.sign() * eps
            logits = model("sst", batch, inputs_embeds={"": embeds + d * keep}).logits
            random_kl.append(kl_per_example(get_task("sst"), clean, logits))
        best_random = torch.stack(random_kl).amax(0)
    assert float(kl_zero.abs().max()) < 1e-6
    assert bool((kl_final >= kl_start).all())
    assert float(kl_final.sum()) > float(best_random.sum()) > float(kl_start.sum()) > 0


@pytest.mark.parametrize("task,arch,pair_encoding", [
    ("sst", "baseline", "cross"),
    ("para", "b1", "cross"),
    ("para", "baseline", "siamese"),
])
def test_rift_forward_backward_end_to_end(task, arch, pair_encoding):
    """On a tiny MultitaskBert, RIFT returns finite {"adv_kl", "info"}, and their gradient reaches the encoder
    and exactly the projections of the classes with at least two examples in the batch."""
    model = tiny_model(arch, pair_encoding, init=0.5).train()
    obj = RIFT(RIFTConfig(), model).train()
    batch = make_batch(task, pair_encoding)
    out = model(task, batch)
    terms = obj(model, task, batch, out)
    assert set(terms) == {"adv_kl", "info"}
    assert all(torch.isfinite(v) and v.ndim == 0 for v in terms.values())
    assert terms["adv_kl"].item() >= 0 and terms["info"].item() > 0
    sum(terms.values()).backward()
    assert float(model.encoder.encoder.layer[0].attention.self.qkv.weight.grad.abs().sum()) > 0
    labels = batch["labels"].long()
    for c in range(len(obj.proj_student[task])):
        grad = obj.proj_student[task][c][0].weight.grad
        trained = grad is not None and float(grad.abs().sum()) > 0
        assert trained == (int((labels == c).sum()) >= 2), c  # a singleton class has no negative: no signal


def test_rift_terms_are_unweighted_and_term_weight_carries_beta_and_alpha():
    """The returned terms do not depend on β and α; term_weight gives weight·β for "adv_kl" and weight·α for
    "info" (eq. 11), so the trainer's total is β·KL + α·L_I."""
    model = tiny_model(init=0.5).train()
    batch = make_batch("sst", n=10)
    results, objs = [], []
    for weight, beta, alpha in ((1.0, 1.0, 1.0), (3.0, 2.0, 0.5)):
        torch.manual_seed(0)
        obj = RIFT(RIFTConfig(weight=weight, beta=beta, alpha=alpha, tasks=("sst",)), model)
        torch.manual_seed(1)
        results.append(obj(model, "sst", batch, model("sst", batch)))
        objs.append(obj)
    assert results[0]["info"].item() > 0
    torch.testing.assert_close(results[1]["adv_kl"], results[0]["adv_kl"], rtol=0, atol=0)
    torch.testing.assert_close(results[1]["info"], results[0]["info"], rtol=0, atol=0)
    assert objs[0].term_weight("adv_kl") == 1.0 and objs[0].term_weight("info") == 1.0
    assert objs[1].term_weight("adv_kl") == 6.0 and objs[1].term_weight("info") == 1.5


@pytest.mark.parametrize("task,pair_encoding", [("sst", "cross"), ("para", "siamese")])
def test_rift_kl_term_reaches_the_word_embeddings_through_x_adv(task, pair_encoding):
    """RIFT eq. 9: x' = x + δ with δ detached, so KL(p(x) ‖ p(x')) alone (α = 0, no CE, the clean side
    detached) sends gradient to the word embeddings through x', as SMART's penalty does."""
    model = tiny_model("baseline", pair_encoding, init=0.5).train()
    obj = RIFT(RIFTConfig(beta=1.0, alpha=0.0), model)
    batch = make_batch(task, pair_encoding)
    out = model(task, batch)
    out.logits = out.logits.detach()  # only the x' side may carry gradient
    obj(model, task, batch, out)["adv_kl"].backward()
    grad = model.encoder.embeddings.word_embeddings.weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0


def _kl_by_hand(task: str, p_logits: list, q_logits: list) -> float:
    """Mean over examples of KL(p ‖ q) = Σ_c p_c (log p_c − log q_c), in python floats; para: [1 − σ(z), σ(z)]."""
    def softplus(x):
        return max(x, 0.0) + math.log1p(math.exp(-abs(x)))

    def log_dist(z):
        if task == "para":
            return [-softplus(z), -softplus(-z)]  # log(1 − σ(z)), log σ(z)
        m = max(z)
        lse = m + math.log(sum(math.exp(v - m) for v in z))
        return [v - lse for v in z]

    total = 0.0
    for zp, zq in zip(p_logits, q_logits):
        lp, lq = log_dist(zp), log_dist(zq)
        total += sum(math.exp(a) * (a - b) for a, b in zip(lp, lq))
    return total / len(p_logits)


def test_kl_divergence_equals_hand_computation_and_its_direction():
    """kl_divergence(task, p, q) is the batch mean of KL(p ‖ q) computed by hand for fixed logits (SST softmax,
    paraphrase Bernoulli), and not the reverse KL(q ‖ p) (the values are chosen to tell them apart)."""
    p = [[2.0, 0.0, -1.0, 0.5, 0.0], [0.0, 3.0, 0.0, 0.0, -2.0]]
    q = [[0.0, 0.0, 0.0, 0.0, 0.0], [1.0, -1.0, 0.5, 2.0, 0.0]]
    got = kl_divergence(get_task("sst"), torch.tensor(p), torch.tensor(q)).item()
    assert got == pytest.approx(_kl_by_hand("sst", p, q), rel=1e-6)
    assert abs(got - _kl_by_hand("sst", q, p)) > 1e-2
    zp, zq = [2.0, -0.5, 0.0], [-1.0, 1.5, 3.0]
    got = kl_divergence(get_task("para"), torch.tensor(zp), torch.tensor(zq)).item()
    assert got == pytest.approx(_kl_by_hand("para", zp, zq), rel=1e-6)
    assert abs(got - _kl_by_hand("para", zq, zp)) > 1e-2


@pytest.mark.parametrize("task,pair_encoding", [("sst", "cross"), ("para", "cross"), ("para", "siamese")])
def test_rift_adv_kl_is_hand_kl_at_x_plus_delta(task, pair_encoding, monkeypatch):
    """With the attack's δ fixed, "adv_kl" = KL(p(x) ‖ p(x + δ)) computed by hand from the model's logits, and
    its gradient on the word embeddings is that of the same expression built independently from embed(ids) + δ."""
    # No dropout anywhere: passes are comparable. The Siamese dot product saturates σ at init 0.5: 0.1 there.
    model = tiny_model("baseline", pair_encoding, init=0.1 if pair_encoding == "siamese" else 0.5).eval()
    batch = make_batch(task, pair_encoding)
    sides = ("",) if pair_encoding == "cross" else ("_1", "_2")
    g = torch.Generator().manual_seed(4)
    delta = {s: 0.3 * torch.randn(*batch["input_ids" + s].shape, 32, generator=g)
             * batch["attention_mask" + s].unsqueeze(-1) for s in sides}
    monkeypatch.setattr(rift_mod, "pgd_perturbation", lambda *a, **k: {s: d.clone() for s, d in delta.items()})
    beta = 2.5
    obj = RIFT(RIFTConfig(beta=beta, alpha=0.0), model)
    out = model(task, batch)
    term = obj(model, task, batch, out)["adv_kl"]
    (obj.term_weight("adv_kl") * term).backward()
    got_grad = model.encoder.embeddings.word_embeddings.weight.grad.clone()

    model.zero_grad(set_to_none=True)
    embed = model.encoder.embed_tokens
    clean = model(task, batch).logits
    adv = model(task, batch, inputs_embeds={s: embed(batch["input_ids" + s]) + delta[s] for s in sides}).logits
    expected = _kl_by_hand(task, clean.tolist(), adv.tolist())
    assert expected > 1e-4  # δ moved the prediction: the comparison is not 0 = 0
    assert term.item() == pytest.approx(expected, rel=1e-5)
    (beta * kl_divergence(get_task(task), clean, adv)).backward()
    torch.testing.assert_close(got_grad, model.encoder.embeddings.word_embeddings.weight.grad, rtol=1e-5, atol=1e-8)
