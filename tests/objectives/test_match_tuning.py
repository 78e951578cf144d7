"""tasks/objectives/match_tuning.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tasks.objectives import REGISTRY, build_objectives
from tasks.objectives.match_tuning import MatchTuning, match_transform, matching_matrix
from tasks.objectives.scl import SupervisedContrastive
from tests.helpers import contrast_model as make_model
from tests.helpers import labeled_batch as make_batch


def test_match_transform_is_row_stochastic_mixing():
    """M is nonnegative with rows summing to 1, includes the diagonal, and z = M h as eq. 3 term by term."""
    h = torch.randn(5, 4, generator=torch.Generator().manual_seed(6))
    m = matching_matrix(h, temperature=2.0)
    assert (m >= 0).all() and torch.allclose(m.sum(1), torch.ones(5))
    for i in range(5):  # eq. 2 directly, k running over the whole batch (self included), no normalization of h
        denom = sum(math.exp(float(h[i] @ h[k]) / 2.0) for k in range(5))
        for j in range(5):
            assert m[i, j].item() == pytest.approx(math.exp(float(h[i] @ h[j]) / 2.0) / denom, rel=1e-5)
    z = match_transform(h, 2.0)
    assert torch.allclose(z, m @ h, atol=1e-6)
    # convex hull: each coordinate of z_i lies between the batch's min and max of that coordinate
    assert (z <= h.max(0).values + 1e-6).all() and (z >= h.min(0).values - 1e-6).all()


def test_match_transform_small_temperature_is_identity():
    """Distinct rows of equal (large) norm make h_i·h_i the row maximum, so T -> 0 gives M -> I and z -> h."""
    h = 10.0 * F.normalize(torch.randn(6, 8, generator=torch.Generator().manual_seed(7)), dim=-1)
    assert torch.allclose(matching_matrix(h, 1e-3), torch.eye(6), atol=1e-6)
    assert torch.allclose(match_transform(h, 1e-3), h, atol=1e-5)


def test_match_transform_large_temperature_is_batch_mean():
    """T -> ∞ makes M uniform: every z_i is the batch mean."""
    h = torch.randn(6, 8, generator=torch.Generator().manual_seed(8))
    z = match_transform(h, 1e7)
    assert torch.allclose(z, h.mean(0, keepdim=True).expand_as(h), atol=1e-5)


def test_match_transform_batch_of_one_and_permutation():
    """A batch of one is unchanged (M = [1]); permuting the batch permutes z the same way."""
    h = torch.randn(1, 4)
    assert torch.equal(match_transform(h, 1.0), h)
    h = torch.randn(6, 4)
    perm = torch.randperm(6)
    assert torch.allclose(match_transform(h[perm], 3.0), match_transform(h, 3.0)[perm], atol=1e-6)


def test_match_tuning_config_and_what_it_installs_on_the_model():
    """weight must stay 1 (no term); forward returns {}; building it installs the matching on the chosen tasks
    only: z = M h in training, at evaluation z = h for inference='identity' and the matching for 'batch'."""
    with pytest.raises(ValueError, match="no loss term"):
        MatchTuning.Config(weight=0.5)
    with pytest.raises(ValueError, match="inference"):
        MatchTuning.Config(inference="knn")
    with pytest.raises(ValueError, match="positive"):
        MatchTuning.Config(temperature=0.0)
    h = torch.randn(4, 3)
    for inference, at_eval in (("identity", h), ("batch", match_transform(h, 2.0))):
        model = make_model("b1", "siamese")
        mt = build_objectives({"match_tuning": {"temperature": 2.0, "tasks": ["sst", "sts"],
                                                "inference": inference}}, model)[0]
        assert mt.task_loss_scale == 1.0 and mt(None, "sst", {}, None) == {}
        assert sorted(model.pooled_transforms) == ["sst", "sts"]
        matching = model.pooled_transforms["sst"]
        assert torch.allclose(matching.train()(h), match_transform(h, 2.0))
        assert torch.allclose(matching.eval()(h), at_eval)


@pytest.mark.parametrize("arch,pair_encoding", [("baseline", "siamese"), ("b1", "siamese"), ("b1", "cross")])
@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_match_tuning_runs_through_the_model(task, arch, pair_encoding):
    """With Match-Tuning built on the model, its training forward reads z = M h of the plain model's
    embeddings, and the loss's gradient reaches the encoder."""
    model = make_model(arch, pair_encoding).eval()  # no dropout: the two passes see the same h
    plain = model(task, make_batch(task, pair_encoding))
    build_objectives({"match_tuning": {"temperature": 1.0}}, model)
    for matching in model.pooled_transforms.values():
        matching.train()  # the matching's training behaviour, without dropout for the comparison
    batch = make_batch(task, pair_encoding)
    out = model(task, batch)
    keys = ["pooled"] if "pooled" in plain.features else ["pooled_1", "pooled_2"]
    for k in keys:
        assert torch.allclose(out.features[k], match_transform(plain.features[k], 1.0), atol=1e-6)
    assert out.logits.shape == plain.logits.shape and not torch.equal(out.logits, plain.logits)
    model.task_loss(task, out, batch).backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0


def test_registry_has_scl_and_match_tuning():
    """Both objectives are registered under their names and build from settings dicts."""
    objs = build_objectives({"scl": {"weight": 0.3}, "match_tuning": {"inference": "batch"}}, None)
    assert REGISTRY["scl"] is SupervisedContrastive and REGISTRY["match_tuning"] is MatchTuning
    assert [type(o) for o in objs] == [SupervisedContrastive, MatchTuning]
    with pytest.raises(ValueError, match="no option"):
        build_objectives({"scl": {"lambda_": 0.3}}, None)
