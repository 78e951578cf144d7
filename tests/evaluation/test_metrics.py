"""Tests of tasks/evaluation/metrics.py: accuracy, Pearson r (against scipy) and the CS224N overall score."""

from __future__ import annotations

import pytest
import scipy.stats  # test dependency: a missing reference fails instead of skipping
import torch

from tasks.evaluation.metrics import overall_score, pearson_r, score


def test_overall_score_formula_on_hand_values():
    """overall = (sst_acc + para_acc + (sts_r + 1) / 2) / 3, and the mean over the tasks present otherwise."""
    m = {"sst_acc": 0.5, "para_acc": 0.8, "sts_r": 0.6, "loss": 9.0}
    assert overall_score(m) == pytest.approx((0.5 + 0.8 + 0.8) / 3)
    assert overall_score({"sts_r": -1.0}) == 0.0
    assert overall_score({"sst_acc": 0.5, "sts_r": 0.0}) == pytest.approx(0.5)
    assert overall_score({**m, "overall": 123.0}) == pytest.approx(0.7)  # "overall" itself is ignored
    with pytest.raises(ValueError):
        overall_score({"loss": 1.0})


def test_pearson_equals_scipy_on_random_data():
    """Our float64 Pearson r equals scipy.stats.pearsonr on random, correlated and anti-correlated data."""
    g = torch.Generator().manual_seed(0)
    for n in (2, 7, 500):
        x = torch.randn(n, generator=g)
        for y in (torch.randn(n, generator=g), 3 * x + 0.1 * torch.randn(n, generator=g) + 2, -x):
            want = scipy.stats.pearsonr(x.double().numpy(), y.double().numpy()).statistic
            assert pearson_r(x, y) == pytest.approx(float(want), abs=1e-12)
            assert score("sts", x, y) == pytest.approx(float(want), abs=1e-12)


def test_pearson_undefined_for_constant_input():
    """Zero variance gives nan (r is undefined), which then makes overall nan rather than a fake number."""
    r = pearson_r(torch.ones(5), torch.arange(5.0))
    assert r != r
    assert overall_score({"sst_acc": 1.0, "sts_r": r}) != overall_score({"sst_acc": 1.0, "sts_r": r})


def test_accuracy_for_class_tasks():
    """sst / para scores are the fraction of class ids equal to the labels (para labels are 0.0/1.0 floats)."""
    assert score("sst", torch.tensor([0, 1, 2, 3, 4]), torch.tensor([0, 1, 2, 0, 0])) == pytest.approx(0.6)
    assert score("para", torch.tensor([1, 0, 1, 1]), torch.tensor([1.0, 0.0, 0.0, 0.0])) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        score("sst", torch.tensor([0, 1]), torch.tensor([0]))
    with pytest.raises(ValueError):
        score("nli", torch.tensor([0]), torch.tensor([0]))
