"""Tests of tasks/objectives/scl.py: the loss equals Gunel et al.'s eq. 3 term by term and its direct formula
(which reads the device), and reaches the parameters it should through the trainer."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tasks.objectives import build_objectives
from tasks.objectives.match_tuning import match_transform, matching_matrix
from tasks.objectives import objective_config
from tasks.objectives.scl import SupervisedContrastive, scl_loss
from tasks.training.run import trainer_for
from tests.helpers import contrast_model as make_model
from tests.helpers import labeled_batch as make_batch
from tests.helpers import tiny_train_config


def _scl_direct(features: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """The loss written directly: a host-read branch for "no positive anywhere", a −inf self-mask."""
    n = features.shape[0]
    phi = F.normalize(features.float(), dim=-1)
    self_mask = torch.eye(n, dtype=torch.bool)
    positives = (labels.view(-1, 1) == labels.view(1, -1)) & ~self_mask
    n_pos = positives.sum(1)
    if not bool((n_pos > 0).any()):
        return (phi * 0.0).sum()
    logits = ((phi @ phi.T) / temperature).masked_fill(self_mask, float("-inf"))
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    pos_log_prob = torch.where(positives, log_prob, torch.zeros_like(log_prob)).sum(1)
    return (-pos_log_prob / n_pos.clamp_min(1)).sum()


@pytest.mark.parametrize("labels", [[0, 1, 0, 2, 1, 0, 3], [0, 1, 2, 3], [4], [1, 1]])
def test_scl_without_host_read_equals_the_direct_formula(labels):
    """scl_loss (no branch on the host, most-negative-float self-mask) equals the direct formula in value and
    gradient: with singleton classes, with no positive anywhere, for a batch of one and of one pair."""
    g = torch.Generator().manual_seed(len(labels))
    x = torch.randn(len(labels), 6, generator=g)
    ours, direct = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y = torch.tensor(labels)
    got, want = scl_loss(ours, y, 0.3), _scl_direct(direct, y, 0.3)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    got.backward()
    want.backward()
    assert torch.isfinite(ours.grad).all()
    torch.testing.assert_close(ours.grad, direct.grad, rtol=1e-5, atol=1e-7)


def scl_double_loop(features: torch.Tensor, labels: list[int], tau: float) -> float:
    """Gunel et al. eq. 3 written term by term, in float64."""
    phi = F.normalize(features.double(), dim=-1)
    n = len(labels)
    total = 0.0
    for i in range(n):
        n_same = sum(1 for j in range(n) if labels[j] == labels[i])
        if n_same - 1 == 0:
            continue
        denom = sum(math.exp(float(phi[i] @ phi[k]) / tau) for k in range(n) if k != i)
        inner = sum(math.log(math.exp(float(phi[i] @ phi[j]) / tau) / denom)
                    for j in range(n) if j != i and labels[j] == labels[i])
        total += -inner / (n_same - 1)
    return total


@pytest.mark.parametrize("tau", [0.1, 0.3, 0.7])
def test_scl_equals_double_loop_of_eq3(tau):
    """scl_loss equals eq. 3 computed term by term (sum over anchors; 'mean' = sum / N), singleton class included;
    its gradient is finite despite the −inf self-mask."""
    feats = torch.randn(9, 5, generator=torch.Generator().manual_seed(3)).requires_grad_()
    labels = [0, 1, 0, 2, 1, 0, 3, 2, 1]  # class 3 is a singleton: an anchor with no positive
    expected = scl_double_loop(feats.detach(), labels, tau)
    got = scl_loss(feats, torch.tensor(labels), tau)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(expected, rel=1e-5)
    got.backward()
    assert torch.isfinite(feats.grad).all() and feats.grad.abs().sum() > 0
    assert scl_loss(feats, torch.tensor(labels), tau, reduction="mean").item() == pytest.approx(expected / 9, rel=1e-5)


def test_scl_singleton_batch_is_zero_not_nan():
    """A batch of one example (no positive, and no k ≠ i in the denominator) gives 0 and a zero, finite gradient."""
    feats = torch.randn(1, 4, requires_grad=True)
    loss = scl_loss(feats, torch.tensor([2]), 0.3)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(feats.grad, torch.zeros_like(feats))


def test_scl_all_distinct_labels_is_zero():
    """Every anchor alone in its class: the loss is exactly 0 with a zero (not NaN) gradient."""
    feats = torch.randn(5, 4, requires_grad=True)
    loss = scl_loss(feats, torch.arange(5), 0.1)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(feats.grad, torch.zeros_like(feats))


def test_scl_singleton_anchor_adds_nothing_but_is_a_negative():
    """Adding a singleton-class example adds no anchor term, yet changes the others' denominators."""
    g = torch.Generator().manual_seed(4)
    feats = torch.randn(4, 3, generator=g)
    extra = torch.randn(1, 3, generator=g)
    labels = torch.tensor([0, 0, 1, 1])
    with_singleton = scl_loss(torch.cat([feats, extra]), torch.cat([labels, torch.tensor([7])]), 0.3)
    assert with_singleton.item() == pytest.approx(scl_double_loop(torch.cat([feats, extra]), [0, 0, 1, 1, 7], 0.3),
                                                  rel=1e-5)
    assert with_singleton.item() > scl_loss(feats, labels, 0.3).item()  # one more negative in every denominator


def test_scl_is_scale_invariant_and_known_at_perfect_separation():
    """Φ is l2-normalized (rescaling rows changes nothing); identical same-class rows, orthogonal classes and a
    small τ give each anchor log(N_y − 1), the uniform split over its positives."""
    g = torch.Generator().manual_seed(5)
    feats, labels = torch.randn(7, 6, generator=g), torch.tensor([0, 1, 0, 1, 2, 0, 1])
    scales = torch.tensor([[0.1], [3.0], [7.0], [1.0], [0.5], [20.0], [2.0]])
    assert scl_loss(feats * scales, labels, 0.3).item() == pytest.approx(scl_loss(feats, labels, 0.3).item(), rel=1e-5)
    sep = torch.eye(6)[[0, 1, 0, 1, 2, 0, 1]]  # class c -> basis vector e_c
    expected = 3 * math.log(2) + 3 * math.log(2)  # classes 0 and 1: 3 anchors each with 2 positives; class 2 alone
    assert scl_loss(sep, labels, 0.01).item() == pytest.approx(expected, abs=1e-4)


def test_scl_and_matching_computed_in_float32_under_autocast():
    """bf16 inputs or a bf16 autocast region give the float32 result (both compute in float32, autocast off)."""
    feats = torch.randn(6, 8).bfloat16()
    labels = torch.tensor([0, 1, 0, 1, 2, 2])
    ref = scl_loss(feats.float(), labels, 0.1).item()
    assert scl_loss(feats, labels, 0.1).item() == pytest.approx(ref, rel=1e-6)
    h = 3.0 * torch.randn(6, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert scl_loss(feats.float(), labels, 0.1).item() == pytest.approx(ref, rel=1e-6)
        m = matching_matrix(h, 1.0)
        z = match_transform(h, 1.0)
    assert m.dtype == torch.float32 and torch.allclose(m, torch.softmax(h @ h.T, -1), atol=1e-6)
    assert z.dtype == torch.float32 and torch.allclose(z, torch.softmax(h @ h.T, -1) @ h, atol=1e-5)


def test_scl_config_refuses_lambda_outside_unit_interval_and_sts():
    """λ outside [0, 1], STS (no classes) and an unknown embedding are refused."""
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        SupervisedContrastive.Config(weight=1.5)
    with pytest.raises(ValueError, match="objective 'scl' supports sentence-classification and pair-classification tasks, and task 'sts' is a pair-regression"):
        objective_config("scl", {"tasks": ["sts"]})  # the base class enforces the streams an objective takes
    with pytest.raises(ValueError, match="embedding"):
        SupervisedContrastive.Config(embedding="tokens")


def test_scl_objective_on_sst_matches_loss_and_reaches_encoder():
    """On a tiny model's SST batch the term equals scl_loss of the pooled features and its gradient reaches the
    encoder (and not the SST classifier, which SCL does not read)."""
    model = make_model()
    obj = build_objectives({"scl": {"temperature": 0.3, "tasks": ["sst"]}}, model)[0]
    batch = make_batch("sst")
    out = model("sst", batch)
    terms = obj(model, "sst", batch, out)
    assert set(terms) == {"loss"}
    assert terms["loss"].item() == pytest.approx(scl_loss(out.features["pooled"], batch["labels"], 0.3).item())
    terms["loss"].backward()
    emb = model.encoder.embeddings.word_embeddings.weight.grad
    assert emb is not None and emb.abs().sum() > 0
    assert all(p.grad is None for p in model.sst_head.parameters())


@pytest.mark.parametrize("arch,embedding", [("baseline", "pooled"), ("b1", "pooled"), ("b1", "head_input")])
def test_scl_para_cross_uses_the_pair_vector(arch, embedding):
    """Cross-encoded paraphrase pairs: SCL runs on the pair's vector with the 0./1. float labels as classes."""
    model = make_model(arch, "cross")
    obj = build_objectives({"scl": {"embedding": embedding}}, model)[0]
    batch = make_batch("para", "cross")
    out = model("para", batch)
    loss = obj(model, "para", batch, out)["loss"]
    expected = scl_double_loop(out.features[embedding].detach(), [0, 1, 1, 0, 1, 0], 0.3)
    assert loss.item() == pytest.approx(expected, rel=1e-4)


def test_scl_para_siamese_b1_head_input_and_baseline_refused():
    """Siamese B1 + head_input uses the pair vector (eq. 3 by hand on [f1 ⊙ f2, e1, e2] with the 0./1. labels as
    classes); Siamese pairs without one are refused at construction."""
    model = make_model("b1", "siamese")
    obj = build_objectives({"scl": {"embedding": "head_input"}}, model)[0]
    batch = make_batch("para")
    out = model("para", batch)
    expected = scl_double_loop(out.features["head_input"].detach(), [0, 1, 1, 0, 1, 0], 0.3)
    assert obj(model, "para", batch, out)["loss"].item() == pytest.approx(expected, rel=1e-4)
    with pytest.raises(ValueError, match="one vector per sentence pair"):
        build_objectives({"scl": {}}, model)  # embedding="pooled": two sentence vectors, no pair vector
    with pytest.raises(ValueError, match="one vector per sentence pair"):
        build_objectives({"scl": {"embedding": "head_input"}}, make_model("baseline", "siamese"))
    sst_only = build_objectives({"scl": {"tasks": ["sst"]}}, make_model("baseline", "siamese"))[0]
    assert sst_only.applies_to("sst") and not sst_only.applies_to("para")
    unchecked = SupervisedContrastive(objective_config("scl", {})[1])  # built without the model: no check
    with pytest.raises(ValueError, match="^scl on 'para' needs one vector per sentence pair, but pair_encoding="
                                         "'siamese' with arch='b1' and embedding='pooled' has none"):
        unchecked(model, "para", batch, out)  # the reason, as at construction, not just the missing key


@pytest.mark.parametrize("name,settings,term", [
    ("scl", {"weight": 0.25}, "loss"),
    ("knn_bert", {"weight": 0.25, "m_most": 2, "m_least": 2, "queue_size": 20, "knn_k": 5}, "sc"),
])
def test_step_loss_is_loss_weight_times_one_minus_lambda_ce_plus_lambda_term(tiny_env, tmp_path, name, settings,
                                                                              term):
    """SCL eq. 1 and KNN-BERT eq. 6 in the trainer's step: loss = w_task · ((1 − λ)·CE + λ·term) with λ = 0.25 and
    the task's loss weight w = 2, where CE is the head's loss recomputed here from the model's own pass."""
    trainer = trainer_for(tiny_train_config(tiny_env, tmp_path, limit=16, loss_weights={"sst": 2.0},
                                        objectives={name: settings}))
    trainer.model.eval()  # no dropout: the recomputed pass is the step's
    batch = trainer.train_sets["sst"].collate(list(range(8)))
    loss, terms = trainer.step_loss("sst", batch)
    ce = trainer.model.task_loss("sst", trainer.model("sst", batch), batch)
    torch.testing.assert_close(terms["sst/loss"], ce)
    value = terms[f"sst/{name}.{term}"]
    assert value.item() > 1e-3  # the term is not 0: λ is visible
    torch.testing.assert_close(loss, 2.0 * (0.75 * ce + 0.25 * value), rtol=1e-6, atol=1e-7)
