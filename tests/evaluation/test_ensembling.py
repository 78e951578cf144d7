"""Tests of tasks/evaluation/ensembling.py, ensembles of saved logits: identities, selection, regression weights,
held-out scores, id checks, the submission zip. The command (python -m tasks.ensemble): tests/test_ensemble.py."""

from __future__ import annotations

import itertools
import os
import zipfile

import pytest
import torch

from tasks.predictions import TaskLogits, load_task_logits
from tasks.evaluation.ensembling import (
    average,
    ensemble_task,
    fit_regression,
    predict,
    runs_entries,
    select_subset,
    write_submission_zip,
)
from tasks.evaluation.metrics import score
from tasks.task import get_task
from tests.helpers import ENSEMBLE_N, ensemble_labels, model_logits, write_run_logits

N = ENSEMBLE_N


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_one_model_reproduces_its_predictions(task):
    """An ensemble of one model gives exactly that model's predictions (ties and tiny logits included)."""
    x = model_logits(task, ensemble_labels(task), 1, seed=1).float().double()  # float32 values, as read from a file
    if task == "sst":
        x[0] = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0])  # a tie: the first class, as argmax
    elif task == "para":
        x[:3] = torch.tensor([1e-30, -1e-30, 0.0])  # sigmoid(x) rounds to 0.5 here, the sign does not
    logits, preds = average(task, [x])
    assert torch.equal(preds, predict(task, x))
    if task == "sts":
        assert torch.equal(logits, x)
    else:
        assert torch.equal(predict(task, logits), preds)  # the written logits agree with the predictions
    if task == "para":
        torch.testing.assert_close(logits, x, rtol=1e-9, atol=1e-12)  # log(p / (1 - p)) of sigmoid(x) is x


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_two_identical_models_equal_either(task):
    """The simple average of two identical models equals either one (predictions exactly, logits to 1e-12)."""
    x = model_logits(task, ensemble_labels(task), 1, seed=2)
    one = average(task, [x])
    two = average(task, [x, x.clone()])
    assert torch.equal(two[1], one[1])
    torch.testing.assert_close(two[0], one[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
@pytest.mark.parametrize("max_exhaustive", [10, 1])  # exhaustive search, and greedy forward selection
def test_selective_picks_the_better_model(task, max_exhaustive):
    """Given noise, a good model and more noise, selective ensembling keeps only the good model."""
    y = ensemble_labels(task)
    models = [model_logits(task, y, 0, seed=3), model_logits(task, y, 1, seed=4), model_logits(task, y, 0, seed=5)]
    subset, best = select_subset(task, models, y, max_exhaustive=max_exhaustive)
    assert subset == (1,)
    assert best == score(task, predict(task, models[1]), y)


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_regression_gives_a_noise_model_about_zero_weight(task):
    """Fit on a good model and a pure-noise model, the regression ensembler weights the noise ~0."""
    y = ensemble_labels(task, n=2000)
    good, noise = model_logits(task, y, 1, seed=6), model_logits(task, y, 0, seed=7)
    fit = fit_regression(task, [good, noise], y)
    assert fit.weights[0] > 0.5
    assert abs(fit.weights[1]) < 0.05 * fit.weights[0], fit.weights
    assert (fit.bias is None) == (task == "sst")


def test_regression_scores_the_held_out_half():
    """Regression reports the dev-dev half: the models' and ensemble's scores there, on n - n//2 examples."""
    y = ensemble_labels("para")
    dev = _task_logits("para", y, [model_logits("para", y, 1, 8), model_logits("para", y, 0, 9)])
    res = ensemble_task("para", dev, y, None, "regression", seed=0)
    assert res.holdout["n_fit"] == N // 2 and res.holdout["n_eval"] == N - N // 2
    assert res.holdout["regression"] >= res.holdout["simple"]
    sts = ensemble_task("sts", _task_logits("sts", ensemble_labels("sts"),
                                            [model_logits("sts", ensemble_labels("sts"), 1, 1)] * 2),
                        ensemble_labels("sts"), None, "regression")
    assert sts.weights is None and "simple average" in sts.note  # the paper did not do STS


def _task_logits(task, y, models):
    return TaskLogits(task, "dev", [str(i) for i in range(y.shape[0])], models, [])


def test_id_mismatch_names_the_file(tmp_path):
    """Runs whose ids differ (or a run lacking the file) raise an error that names the offending file."""
    x = torch.randn(4, 5)
    a = write_run_logits(tmp_path, "a", "sst", "dev", ["s1", "s2", "s3", "s4"], x)
    b = write_run_logits(tmp_path, "b", "sst", "dev", ["s1", "s2", "s3", "s9"], x)
    with pytest.raises(ValueError, match=r"b/sst-dev-logits\.csv: its ids differ .*'s9'"):
        load_task_logits([a, b], "sst", "dev")
    c = write_run_logits(tmp_path, "c", "sst", "dev", ["s4", "s3", "s2", "s1"], x)  # same ids, other order: aligned
    loaded = load_task_logits([a, c], "sst", "dev")
    assert torch.equal(loaded.logits[1], x.double().flip(0))
    (tmp_path / "d").mkdir()
    with pytest.raises(FileNotFoundError, match=r"d/sst-dev-logits\.csv"):
        load_task_logits([a, tmp_path / "d"], "sst", "dev")
    assert load_task_logits([a, c], "sst", "test") is None


def test_submission_zip_depends_on_the_files_contents_not_their_times(tmp_path):
    """The same predictions zipped again give the same bytes, whenever their files were written: a leaderboard
    command run again (every member reused) once wrote a zip that differed from the first in its entry times."""
    preds = tmp_path / "predictions"
    preds.mkdir()
    written = []
    for name, text in (("sst-dev-output.csv", "id \t Predicted_Sentiment \na , 1 \n"),
                       ("sts-dev-output.csv", "id \t Predicted_Similiary \nb , 2.5 \n")):
        (preds / name).write_text(text)
        written.append(preds / name)
    zips = []
    for k, when in enumerate((1_700_000_000, 1_800_000_000)):
        for f in written:
            os.utime(f, (when, when))
        (tmp_path / f"out{k}").mkdir()
        zips.append(write_submission_zip(tmp_path / f"out{k}", written).read_bytes())
    assert zips[0] == zips[1]
    z = zipfile.ZipFile(tmp_path / "out0" / "cs224n_default_final_project_submission.zip")
    assert z.read("predictions/sts-dev-output.csv") == (preds / "sts-dev-output.csv").read_bytes()
    assert "tasks/ensemble.py" in z.namelist()


def _hand_average(task, xs):
    """The simple average written out: SST mean softmax (its log, argmax), paraphrase mean sigmoid (its logit,
    p > 1/2), STS mean score."""
    x = torch.stack([t.double() for t in xs])
    if task == "sst":
        p = x.softmax(-1).mean(0)
        return p.log(), p.argmax(-1)
    if task == "para":
        p = torch.sigmoid(x).mean(0)
        return (p / (1 - p)).log(), (p > 0.5).long()
    return x.mean(0), x.mean(0)


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_selective_test_outputs_average_the_subset_chosen_on_dev(task):
    """Selective ensembling applies to test the subset that scores best on dev (found here by trying every subset
    of hand-made averages): the test outputs are that subset's average of the test logits, not all models'."""
    y = ensemble_labels(task, n=300, seed=1)
    dev_x = [model_logits(task, y, 0, 30), model_logits(task, y, 1, 31), model_logits(task, y, 1, 32),
             model_logits(task, y, 0, 33)]
    g = torch.Generator().manual_seed(5)
    test_x = [torch.randn((40, 5) if task == "sst" else (40,), generator=g, dtype=torch.float64) * (k + 1)
              for k in range(4)]
    dev = _task_logits(task, y, dev_x)
    test = TaskLogits(task, "test", [f"t{i}" for i in range(40)], test_x, [])
    res = ensemble_task(task, dev, y, test, "selective")

    scores = {s: score(task, _hand_average(task, [dev_x[m] for m in s])[1], y)
              for k in range(1, 5) for s in itertools.combinations(range(4), k)}
    best = max(scores.values())
    assert scores[tuple(res.models)] == pytest.approx(best) and set(res.models) <= {1, 2}
    z, preds = _hand_average(task, [test_x[m] for m in res.models])
    out = res.outputs["test"]
    assert out.ids == test.ids
    torch.testing.assert_close(out.logits.double(), z, rtol=1e-5, atol=1e-5)
    if task == "sts":
        torch.testing.assert_close(out.preds.double(), preds, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(out.preds.long(), preds.long())
    everyone = _hand_average(task, test_x)[0]
    assert not torch.allclose(out.logits.double(), everyone, atol=1e-3)  # the subset is what made the difference


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_regression_test_outputs_use_the_weights_fit_on_the_dev_half(task):
    """Regression ensembling fits its weights on the seeded dev-train half (split here by hand) and applies them to
    test: test logits = Σ_m w_m x_m (+ b for paraphrase and STS) with those weights, not weights fit on all of dev."""
    seed, n = 3, 400
    y = ensemble_labels(task, n=n, seed=2)
    dev_x = [model_logits(task, y, 1, 40), model_logits(task, y, 0, 41), model_logits(task, y, 1, 42)]
    g = torch.Generator().manual_seed(6)
    test_x = [torch.randn((30, 5) if task == "sst" else (30,), generator=g, dtype=torch.float64) for _ in range(3)]
    res = ensemble_task(task, _task_logits(task, y, dev_x), y,
                        TaskLogits(task, "test", [f"t{i}" for i in range(30)], test_x, []), "regression",
                        seed=seed, fit_scores=True)

    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    fit_idx = perm[: n // 2].sort().values
    fit = fit_regression(task, [x[fit_idx] for x in dev_x], y[fit_idx])
    assert res.weights == pytest.approx(fit.weights, rel=1e-6, abs=1e-9)
    z = sum(w * x for w, x in zip(fit.weights, test_x))
    if task != "sst":
        z = z + fit.bias
    out = res.outputs["test"]
    torch.testing.assert_close(out.logits.double(), z, rtol=1e-5, atol=1e-5)
    want = z.argmax(-1) if task == "sst" else (z > 0).long() if task == "para" else z
    torch.testing.assert_close(out.preds.double(), want.double(), rtol=1e-5, atol=1e-5)
    full = fit_regression(task, dev_x, y)  # weights fit on all of dev would give other test outputs
    z_full = sum(w * x for w, x in zip(full.weights, test_x)) + (full.bias or 0.0)
    assert not torch.allclose(z_full, z, atol=1e-4)


def test_selective_two_fold_score_is_computed_on_the_half_the_subset_never_saw():
    """The honest selective score: each fold's subset is chosen on one half and scored on the other (computed by
    hand here), the two folds averaged; ensemble_task reports it beside the optimistic whole-dev score."""
    from tasks.evaluation.ensembling import selective_two_fold, split_halves

    y = ensemble_labels("para")
    models = [model_logits("para", y, 0, seed=20 + i) for i in range(6)]  # noise only
    res = selective_two_fold("para", models, y, max_exhaustive=10, seed=0)
    a, b = split_halves(len(y), 0)
    expected = []
    for fit, held in ((a, b), (b, a)):
        subset, _ = select_subset("para", [x[fit] for x in models], y[fit], 10)
        expected.append(score("para", average("para", [models[m][held] for m in subset])[1], y[held]))
    assert res["selective"] == pytest.approx(sum(expected) / 2)
    dev = _task_logits("para", y, models)
    full = ensemble_task("para", dev, y, None, "selective", seed=0)
    assert full.holdout["selective"] == res["selective"]


def test_runs_that_declare_one_task_otherwise_are_refused_naming_the_run(tmp_path):
    """The runs of an ensemble resolve their tasks together (runs_entries: each run's own, as its config.json saved
    them); a run whose task of a name another run declares differs (other classes) is named in one line, with what
    differs, before anything is read or written."""
    import json

    from tasks.task import Layout, Task
    from tasks.train_config import TrainConfig

    def saved_run(folder, classes):
        task = Task("x", get_task("sst").kind, {}, Layout(("t",), "y"), classes=classes)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(TrainConfig(tasks=("sst", "x"), user_tasks=[task]).to_dict()))
        return folder

    a, b = saved_run(tmp_path / "a", ("n", "p")), saved_run(tmp_path / "b", ("n", "o", "p"))
    assert runs_entries([a, a])["x"].classes == ("n", "p")
    with pytest.raises(ValueError, match=rf"^{b}: task 'x' is already declared otherwise.*classes \["):
        runs_entries([a, b])
