"""Tests of tasks/evaluation/metrics.py: every metric against scikit-learn or scipy, and the overall score (the
CS224N one by default, what --best-metric names otherwise)."""

from __future__ import annotations

import pytest
import scipy.stats  # test dependencies: a missing reference fails instead of skipping
import sklearn.metrics
import torch

from tasks.evaluation.metrics import f1, macro_f1, mcc, overall_score, pearson_r, ranks, score, scores, spearman


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


def test_each_metric_equals_scikit_learn_or_scipy_on_random_data():
    """F1 (binary), macro-F1, Matthews correlation (binary and multi-class) against scikit-learn, Spearman's rank
    correlation (with ties) against scipy, on random predictions, including the degenerate ones (a constant
    prediction: Matthews 0, F1 0 where nothing is predicted positive)."""
    g = torch.Generator().manual_seed(0)
    for n, k in ((2, 2), (9, 2), (200, 2), (7, 3), (300, 5)):
        y = torch.randint(k, (n,), generator=g)
        for p in (torch.randint(k, (n,), generator=g), torch.zeros(n, dtype=torch.long), y.clone()):
            if k == 2:
                assert f1(p, y.float()) == pytest.approx(sklearn.metrics.f1_score(y, p, zero_division=0), abs=1e-12)
            assert macro_f1(p, y) == pytest.approx(
                sklearn.metrics.f1_score(y, p, average="macro", zero_division=0), abs=1e-12)
            assert mcc(p, y) == pytest.approx(sklearn.metrics.matthews_corrcoef(y, p), abs=1e-12)
    for n in (3, 50, 400):
        x = torch.randint(6, (n,), generator=g).double() / 2  # ties
        z = x + torch.randn(n, generator=g, dtype=torch.float64)
        assert spearman(z, x) == pytest.approx(float(scipy.stats.spearmanr(z.numpy(), x.numpy()).statistic),
                                               abs=1e-12)
        assert torch.equal(ranks(x), torch.from_numpy(scipy.stats.rankdata(x.numpy())))


def test_a_tasks_metrics_go_into_the_records_by_name_and_the_overall_selects_as_asked():
    """``scores`` gives every metric of a task under "<task>_<metric>", the main one first; the overall counts the
    built-in tasks by default, a correlation as (c + 1) / 2, and ``select`` a task's main metric or a named one."""
    preds, labels = torch.tensor([1, 0, 1, 1]), torch.tensor([1, 0, 0, 1])
    assert list(scores("mrpc", preds, labels)) == ["mrpc_f1", "mrpc_acc"]
    m = {"sst_acc": 0.5, "cola_mcc": 0.2, "cola_acc": 0.9}
    assert overall_score(m) == 0.5  # cola is not a CS224N task: it selects only when asked
    assert overall_score(m, select=("cola",)) == pytest.approx(0.6)  # (0.2 + 1) / 2
    assert overall_score(m, select=("sst", "cola_acc")) == pytest.approx(0.7)
    assert overall_score({"cola_mcc": 0.2, "cola_acc": 0.9}) == pytest.approx(0.6)  # no built-in task: its own
    with pytest.raises(ValueError, match=r"selects \['rte_acc'\], which the scores do not hold"):
        overall_score(m, select=("rte",))


def test_f1_is_the_f1_of_the_class_it_is_given():
    """``f1`` scores the class ``pos_label`` names, as scikit-learn's f1_score(pos_label=...): class 0's F1 is not
    class 1's."""
    g = torch.Generator().manual_seed(1)
    y, p = torch.randint(2, (50,), generator=g), torch.randint(2, (50,), generator=g)
    for k in (0, 1):
        assert f1(p, y.float(), pos_label=k) == pytest.approx(
            sklearn.metrics.f1_score(y, p, pos_label=k, zero_division=0), abs=1e-12)
    assert f1(p, y, pos_label=0) != f1(p, y, pos_label=1)


def test_a_word_label_pair_tasks_f1_is_its_positive_labels(tmp_path):
    """A two-class pair task labelled duplicate / not_duplicate whose task file says "positive": "duplicate" reports
    the F1 of duplicate (class 0 of the sorted labels), equal to scikit-learn's f1_score(pos_label="duplicate") on the
    same predictions in the user's words; without "positive" it is the second class's, not_duplicate's."""
    from tasks.task_file import read_task_file
    from tests.helpers import user_task

    words = ["duplicate", "not_duplicate"]
    rows = {s: [[f"a {i}", f"b {i}", words[i % 3 == 0]] for i in range(12)] for s in ("train", "dev")}
    task = read_task_file(user_task(tmp_path / "a", {"name": "dup", "text": ["a", "b"], "label": "y",
                                                     "positive": "duplicate"}, rows, ["a", "b", "y"]))
    assert task.classes == ("duplicate", "not_duplicate") and "f1" in task.metrics
    g = torch.Generator().manual_seed(2)
    labels, preds = torch.randint(2, (40,), generator=g).float(), torch.randint(2, (40,), generator=g)
    y, p = [words[int(k)] for k in labels], [words[int(k)] for k in preds]
    assert scores(task, preds, labels)["dup_f1"] == pytest.approx(
        sklearn.metrics.f1_score(y, p, pos_label="duplicate"), abs=1e-12)
    second = read_task_file(user_task(tmp_path / "b", {"name": "dup2", "text": ["a", "b"], "label": "y"}, rows,
                                      ["a", "b", "y"]))
    assert scores(second, preds, labels)["dup2_f1"] == pytest.approx(
        sklearn.metrics.f1_score(y, p, pos_label="not_duplicate"), abs=1e-12)
