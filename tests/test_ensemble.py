"""Ensembles of saved logits (tasks/ensemble.py, tasks/ensemble_methods.py): identities, selection,
regression weights, id checks, the CLI."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import stat
import zipfile
from pathlib import Path

import pytest
import torch

from tasks.ensemble import build_parser, main
from tasks.evaluation.ensemble import (
    TaskLogits,
    average,
    dev_labels,
    ensemble_task,
    fit_regression,
    load_task_logits,
    predict,
    select_subset,
    write_submission_zip,
)
from tasks.evaluation.files import Predictions, read_logits, read_predictions, write_logits
from tasks.evaluation.metrics import score

N = 400


def _labels(task, n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    if task == "sst":
        return torch.randint(0, 5, (n,), generator=g).double()
    if task == "para":
        return torch.randint(0, 2, (n,), generator=g).double()
    return torch.rand(n, generator=g, dtype=torch.float64) * 5


def _model(task, labels, quality, seed):
    """quality 1: informative logits with noise; 0: pure noise."""
    g = torch.Generator().manual_seed(seed)
    n = labels.shape[0]
    if task == "sst":
        return quality * 2.0 * torch.nn.functional.one_hot(labels.long(), 5).double() + torch.randn(
            n, 5, generator=g, dtype=torch.float64) * (1.0 if quality else 3.0)
    if task == "para":
        return quality * 2.0 * (2 * labels - 1) + torch.randn(n, generator=g, dtype=torch.float64) * (1.0 if quality else 3.0)
    return quality * labels + torch.randn(n, generator=g, dtype=torch.float64) * (0.7 if quality else 2.0) + 2.5 * (1 - quality)


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_one_model_reproduces_its_predictions(task):
    """An ensemble of one model gives exactly that model's predictions (ties and tiny logits included)."""
    x = _model(task, _labels(task), 1, seed=1).float().double()  # float32 values, as read from a file
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
    x = _model(task, _labels(task), 1, seed=2)
    one = average(task, [x])
    two = average(task, [x, x.clone()])
    assert torch.equal(two[1], one[1])
    torch.testing.assert_close(two[0], one[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
@pytest.mark.parametrize("max_exhaustive", [10, 1])  # exhaustive search, and greedy forward selection
def test_selective_picks_the_better_model(task, max_exhaustive):
    """Given noise, a good model and more noise, selective ensembling keeps only the good model."""
    y = _labels(task)
    models = [_model(task, y, 0, seed=3), _model(task, y, 1, seed=4), _model(task, y, 0, seed=5)]
    subset, best = select_subset(task, models, y, max_exhaustive=max_exhaustive)
    assert subset == (1,)
    assert best == score(task, predict(task, models[1]), y)


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_regression_gives_a_noise_model_about_zero_weight(task):
    """Fit on a good model and a pure-noise model, the regression ensembler weights the noise ~0."""
    y = _labels(task, n=2000)
    good, noise = _model(task, y, 1, seed=6), _model(task, y, 0, seed=7)
    fit = fit_regression(task, [good, noise], y)
    assert fit.weights[0] > 0.5
    assert abs(fit.weights[1]) < 0.05 * fit.weights[0], fit.weights
    assert (fit.bias is None) == (task == "sst")


def test_regression_scores_the_held_out_half():
    """Regression reports the dev-dev half: the models' and ensemble's scores there, on n - n//2 examples."""
    y = _labels("para")
    dev = _task_logits("para", y, [_model("para", y, 1, 8), _model("para", y, 0, 9)])
    res = ensemble_task("para", dev, y, None, "regression", seed=0)
    assert res.holdout["n_fit"] == N // 2 and res.holdout["n_eval"] == N - N // 2
    assert res.holdout["regression"] >= res.holdout["simple"]
    sts = ensemble_task("sts", _task_logits("sts", _labels("sts"), [_model("sts", _labels("sts"), 1, 1)] * 2),
                        _labels("sts"), None, "regression")
    assert sts.weights is None and "simple average" in sts.note  # the paper did not do STS


def _task_logits(task, y, models):
    from tasks.evaluation.ensemble import TaskLogits

    return TaskLogits(task, "dev", [str(i) for i in range(y.shape[0])], models, [])


def _write_run(root, name, task, split, ids, logits):
    d = root / name
    preds = predict(task, logits)
    write_logits(d, task, split, Predictions(list(ids), logits.float(), preds.float() if task == "sts" else preds))
    return d


def test_id_mismatch_names_the_file(tmp_path):
    """Runs whose ids differ (or a run lacking the file) raise an error that names the offending file."""
    x = torch.randn(4, 5)
    a = _write_run(tmp_path, "a", "sst", "dev", ["s1", "s2", "s3", "s4"], x)
    b = _write_run(tmp_path, "b", "sst", "dev", ["s1", "s2", "s3", "s9"], x)
    with pytest.raises(ValueError, match=r"b/sst-dev-logits\.csv: its ids differ .*'s9'"):
        load_task_logits([a, b], "sst", "dev")
    c = _write_run(tmp_path, "c", "sst", "dev", ["s4", "s3", "s2", "s1"], x)  # same ids, other order: aligned
    loaded = load_task_logits([a, c], "sst", "dev")
    assert torch.equal(loaded.logits[1], x.double().flip(0))
    (tmp_path / "d").mkdir()
    with pytest.raises(FileNotFoundError, match=r"d/sst-dev-logits\.csv"):
        load_task_logits([a, tmp_path / "d"], "sst", "dev")
    assert load_task_logits([a, c], "sst", "test") is None


def _write_dev_files(data, labels):
    data.mkdir()
    rows = "".join(f"{i}\tsst{i}\ta sentence\t{int(v)}\n" for i, v in enumerate(labels["sst"].tolist()))
    (data / "ids-sst-dev.csv").write_text("\tid\tsentence\tsentiment\n" + rows)
    rows = "".join(f"{i}\tpara{i}\ta\tb\t{float(v)}\n" for i, v in enumerate(labels["para"].tolist()))
    (data / "quora-dev.csv").write_text("\tid\tsentence1\tsentence2\tis_duplicate\n" + rows)
    rows = "".join(f"{i}\tsts{i}\ta\tb\t{v:.3f}\n" for i, v in enumerate(labels["sts"].tolist()))
    (data / "sts-dev.csv").write_text("\tid\tsentence1\tsentence2\tsimilarity\n" + rows)


def _make_runs(tmp_path, nested=False):
    """Three runs (two informative, one noise) with dev logits for every task and test logits but para's;
    ``nested``: as a training run lays them out, under run/predictions/."""
    labels = {t: _labels(t, n=60, seed=10 + k) for k, t in enumerate(("sst", "para", "sts"))}
    labels["sts"] = (labels["sts"] * 1000).round() / 1000  # as written to the data file
    _write_dev_files(tmp_path / "data", labels)
    runs = []
    for r, quality in enumerate((1, 1, 0)):
        name = f"run{r}/predictions" if nested else f"run{r}"
        for task in ("sst", "para", "sts"):
            ids = [f"{task}{i}" for i in range(60)]
            x = _model(task, labels[task], quality, seed=100 * r + len(task))
            if r == 1:  # another row order: aligned by id
                ids, x = ids[::-1], x.flip(0)
            _write_run(tmp_path, name, task, "dev", ids, x)
            if task != "para":  # no quora test file in the shared data
                _write_run(tmp_path, name, task, "test", [f"t{i}" for i in range(7)], x[:7])
        runs.append(str(tmp_path / f"run{r}"))
    return runs


def test_cli_end_to_end(tmp_path, capsys):
    """python -m tasks.ensemble: leaderboard files, ensemble logits, a zip without the absent para test, a table."""
    runs = _make_runs(tmp_path)
    out = tmp_path / "ens"
    summary = main([*runs, "--method", "selective", "--data-dir", str(tmp_path / "data"), "--out-dir", str(out)])
    captured = capsys.readouterr()
    assert "SST acc" in captured.out and "ensemble: selective" in captured.out and "run2" in captured.out
    assert "para-test-output.csv skipped" in captured.err
    names = zipfile.ZipFile(out / "cs224n_default_final_project_submission.zip").namelist()
    assert sorted(n for n in names if n.startswith("predictions/")) == sorted(
        f"predictions/{t}-{s}-output.csv" for t in ("sst", "para", "sts") for s in ("dev", "test")
        if (t, s) != ("para", "test"))
    # the starter's prepare_submit.py layout: the code beside predictions/
    assert {"train_multitask.py", "tasks/ensemble.py", "minbert/bert.py"} <= set(names)
    ids, preds = read_predictions(out / "predictions" / "sst-dev-output.csv")
    assert ids == [f"sst{i}" for i in range(60)] and preds.dtype == torch.long
    assert (out / "predictions" / "sts-test-logits.csv").is_file()
    assert "run2" not in summary["tasks"]["sst"]["models"]  # the noise run is left out
    # regression on the same runs prints the held-out half table
    main([*runs, "--method", "regression", "--data-dir", str(tmp_path / "data"), "--out-dir", str(out)])
    captured = capsys.readouterr()
    assert "held-out dev half" in captured.out and "ensemble: regression" in captured.out
    # the ensemble's own output directory is itself a run
    main([str(out / "predictions"), "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "again")])


def test_a_run_trained_on_one_task_joins_that_tasks_ensemble_only(tmp_path, capsys):
    """A specialist (config.json tasks ["sst"], SST logits only) is averaged into SST and nowhere else; its
    table row shows "-" for the other tasks; the summary names each task's runs. A run whose config.json lists
    a task it has no logits for is still an error naming the file (exit status 1)."""
    runs = _make_runs(tmp_path, nested=True)
    labels = torch.tensor([int(line.split("\t")[3]) for line in
                           (tmp_path / "data" / "ids-sst-dev.csv").read_text().splitlines()[1:]])
    special = tmp_path / "sst-only"
    _write_run(special, "predictions", "sst", "dev", [f"sst{i}" for i in range(60)], _model("sst", labels, 1, 77))
    _write_run(special, "predictions", "sst", "test", [f"t{i}" for i in range(7)], torch.randn(7, 5))
    (special / "config.json").write_text(json.dumps({"tasks": ["sst"], "seed": 0}))
    out = tmp_path / "ens"
    summary = main([str(special), *runs, "--data-dir", str(tmp_path / "data"), "--out-dir", str(out)])
    assert summary["tasks"]["sst"]["runs"] == ["sst-only", "run0", "run1", "run2"]
    assert summary["tasks"]["para"]["runs"] == summary["tasks"]["sts"]["runs"] == ["run0", "run1", "run2"]
    for task, members in (("sst", [str(special), *runs]), ("para", runs)):
        dev = load_task_logits(members, task, "dev")
        ids, ens = read_logits(out / "predictions" / f"{task}-dev-logits.csv")
        assert ids == dev.ids and torch.allclose(ens.double(), average(task, dev.logits)[0], atol=1e-6)
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("sst-only"))
    assert row.split()[2:] == ["-", "-", "-"]  # SST acc, then no Para, STS or overall

    # selective and regression name each task's models by input run, not by their place in that task's list
    summary = main([str(special), *runs, "--method", "selective", "--data-dir", str(tmp_path / "data"),
                    "--out-dir", str(out)])
    text = capsys.readouterr().out
    para = load_task_logits(runs, "para", "dev")
    chosen, _ = select_subset("para", para.logits, dev_labels("para", para.ids, tmp_path / "data", "x"), 10)
    assert summary["tasks"]["para"]["models"] == [f"run{m}" for m in chosen] and 2 not in chosen
    assert f"para: models {[f'run{m}' for m in chosen]}" in text
    for subset in summary["tasks"]["para"]["holdout"]["subsets"]:  # chosen on each dev half, by name
        assert subset and set(subset) <= {"run0", "run1", "run2"}
    held = text.split("two-fold dev")[1]
    assert next(line for line in held.splitlines() if line.startswith("sst-only")).split()[2:] == ["-", "-", "-"]
    main([str(special), *runs, "--method", "regression", "--data-dir", str(tmp_path / "data"), "--out-dir", str(out)])
    text = capsys.readouterr().out
    para_weights = next(line for line in text.splitlines() if line.strip().startswith("para: weights"))
    assert "run2" in para_weights and "sst-only" not in para_weights

    (special / "config.json").write_text(json.dumps({"tasks": ["sst", "para"]}))
    with pytest.raises(SystemExit) as e:
        main([*runs, str(special), "--data-dir", str(tmp_path / "data"), "--out-dir", str(out)])
    assert e.value.code == 1 and "sst-only/para-dev-logits.csv" in capsys.readouterr().err


def _snapshot(folder):
    """Every file under ``folder`` with its bytes ({} when the folder does not exist)."""
    root = Path(folder)
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("nested", [True, False])
def test_out_dir_that_is_an_input_is_refused_and_nothing_changes(tmp_path, capsys, nested):
    """--out-dir naming an input run (or its predictions folder, or a folder inside it; any spelling that resolves
    there) exits 2 with one line, and the input run's files keep their bytes."""
    runs = _make_runs(tmp_path, nested=nested)
    data = str(tmp_path / "data")
    before = _snapshot(tmp_path / "run0")
    outs = [runs[0], f"{tmp_path}/run1/../run0", f"{runs[0]}/predictions", f"{runs[0]}/predictions/ens"]
    if not nested:
        outs.append(f"{runs[0]}/sub")  # the run folder holds its logits itself: nothing may go inside it
    (tmp_path / "link").symlink_to(runs[0])
    outs.append(str(tmp_path / "link"))
    for out in outs:
        with pytest.raises(SystemExit) as err:
            main([*runs, "--data-dir", data, "--out-dir", out])
        assert err.value.code == 2, out
        message = capsys.readouterr().err.strip()
        assert "\n" not in message and "--out-dir" in message and runs[0] in message, message
        assert _snapshot(tmp_path / "run0") == before, out
    if nested:  # the run's predictions folder given as the input, its run folder as the output
        with pytest.raises(SystemExit) as err:
            main([f"{runs[0]}/predictions", runs[1], "--data-dir", data, "--out-dir", runs[0]])
        assert err.value.code == 2 and _snapshot(tmp_path / "run0") == before
        main([*runs, "--data-dir", data, "--out-dir", f"{runs[0]}/ensemble"])  # beside predictions/: allowed


def test_nan_in_a_logits_file_leaves_no_partial_outputs(tmp_path, capsys):
    """A non-finite logit in one run's para file (read after sst's) stops the ensemble before anything is written:
    a fresh --out-dir is not created, and an earlier ensemble's files keep their bytes. One line names the file."""
    runs = _make_runs(tmp_path)
    data = str(tmp_path / "data")
    out = tmp_path / "ens"
    main([*runs, "--data-dir", data, "--out-dir", str(out)])
    before = _snapshot(out)
    bad = Path(runs[1]) / "para-dev-logits.csv"
    lines = bad.read_text().splitlines()
    lines[5] = lines[5].split(",")[0] + ",nan"
    bad.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    for target in (out, tmp_path / "fresh"):
        with pytest.raises(SystemExit) as err:
            main([*runs, "--method", "selective", "--data-dir", data, "--out-dir", str(target)])
        assert err.value.code == 1
        message = capsys.readouterr().err.strip()
        assert "\n" not in message and str(bad) in message and "line 6" in message, message
    assert _snapshot(out) == before
    assert not (tmp_path / "fresh").exists()


def test_mistyped_run_path_says_no_such_directory(tmp_path, capsys):
    """A run path that does not exist exits 2 with 'no such directory: PATH', before reading anything."""
    runs = _make_runs(tmp_path)
    typo = str(tmp_path / "rnu1")
    with pytest.raises(SystemExit) as err:
        main([runs[0], typo, "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "ens")])
    assert err.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"no such directory: {typo}")
    assert not (tmp_path / "ens").exists()


def test_help_shows_every_default_and_abbreviations_are_refused(capsys):
    """--help states the default of every option that has one; '--meth' is not taken as '--method'."""
    parser = build_parser()
    text = " ".join(parser.format_help().split())
    for action in parser._actions:
        if not action.option_strings or action.default in (None, argparse.SUPPRESS) or action.required:
            continue
        option = action.option_strings[-1]
        start = text.index(f" {option} ", text.index("options:"))
        following = text[start + len(option) + 2:]
        nxt = re.search(r" --[a-z]", following)
        assert "(default:" in following[: nxt.start() if nxt else None], option
    with pytest.raises(SystemExit) as err:
        parser.parse_args(["runs/a", "--out-dir", "x", "--meth", "selective"])
    assert err.value.code == 2 and "unrecognized argument --meth: did you mean --method?" in capsys.readouterr().err


def test_a_write_failing_midway_leaves_the_out_dir_as_it_was(tmp_path, monkeypatch, capsys):
    """Outputs are staged and moved into place only when all are written: a failure on the third file (a full
    disk, say) leaves an earlier ensemble's files with their bytes and no staging folder behind."""
    import tasks.ensemble as ens

    runs = _make_runs(tmp_path)
    out = tmp_path / "ens"
    main([*runs, "--data-dir", str(tmp_path / "data"), "--out-dir", str(out)])
    before = _snapshot(out)
    calls = []

    def failing_write_logits(*args, **kwargs):
        calls.append(args)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return write_logits(*args, **kwargs)

    monkeypatch.setattr(ens, "write_logits", failing_write_logits)
    monkeypatch.delenv("MINBERT_VERBOSE", raising=False)
    with pytest.raises(SystemExit) as exc:  # one line, exit status 1 (tasks/errors.py), not a traceback
        main([*runs, "--method", "selective", "--data-dir", str(tmp_path / "data"), "--out-dir", str(out)])
    assert exc.value.code == 1 and "error: disk full" in capsys.readouterr().err.strip().splitlines()[-1]
    assert _snapshot(out) == before and sorted(p.name for p in out.iterdir()) == sorted(
        ["cs224n_default_final_project_submission.zip", "ensemble.json", "predictions"])


def test_submission_zip_and_outputs_follow_the_umask(tmp_path):
    """The submission zip and the ensemble's files are 0644 under umask 022, not the temporary-file default 0600."""
    runs = _make_runs(tmp_path)
    old = os.umask(0o022)
    try:
        main([*runs, "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "ens")])
    finally:
        os.umask(old)
    files = [f for f in (tmp_path / "ens").rglob("*") if f.is_file()]
    assert (tmp_path / "ens" / "cs224n_default_final_project_submission.zip") in files
    assert {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in files} == {f.name: "0o644" for f in files}


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
    y = _labels(task, n=300, seed=1)
    dev_x = [_model(task, y, 0, 30), _model(task, y, 1, 31), _model(task, y, 1, 32), _model(task, y, 0, 33)]
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
    y = _labels(task, n=n, seed=2)
    dev_x = [_model(task, y, 1, 40), _model(task, y, 0, 41), _model(task, y, 1, 42)]
    g = torch.Generator().manual_seed(6)
    test_x = [torch.randn((30, 5) if task == "sst" else (30,), generator=g, dtype=torch.float64) for _ in range(3)]
    res = ensemble_task(task, _task_logits(task, y, dev_x), y,
                        TaskLogits(task, "test", [f"t{i}" for i in range(30)], test_x, []), "regression",
                        seed=seed, regression_sts=True)

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
    from tasks.evaluation.ensemble import selective_two_fold, split_halves

    y = _labels("para")
    models = [_model("para", y, 0, seed=20 + i) for i in range(6)]  # noise only
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
