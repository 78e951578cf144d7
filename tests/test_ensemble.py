"""Tests of tasks/ensemble.py, python -m tasks.ensemble: leaderboard files, ensemble logits and the submission zip
from saved runs, specialists, refusals that change nothing, one-line errors. The methods themselves:
tests/evaluation/test_ensembling.py."""

from __future__ import annotations

import json
import os
import stat
import zipfile
from pathlib import Path

import pytest
import torch

from tasks.ensemble import build_parser, main
from tasks.predictions import load_task_logits
from tasks.evaluation.ensembling import average, dev_labels, select_subset
from tasks.predictions import read_logits, read_predictions, write_logits
from tests.helpers import make_runs, model_logits, write_run_logits


def test_cli_end_to_end(tmp_path, capsys):
    """python -m tasks.ensemble: leaderboard files, ensemble logits, a zip without the absent para test, a table."""
    runs = make_runs(tmp_path)
    out = tmp_path / "ens"
    summary = main([*runs, "--method", "selective", "--data-dir", str(tmp_path / "data"), "--out-dir", str(out)])
    captured = capsys.readouterr()
    assert "SST acc" in captured.out and "ensemble: selective" in captured.out and "run2" in captured.out
    assert "skipped: para-test" in captured.err  # the log: the console and the out dir's ensemble.log
    log = (out / "ensemble.log").read_text()
    assert "kept 60 of 60 rows" in log and log.splitlines()[-1].endswith("; skipped: para-test")
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
    runs = make_runs(tmp_path, nested=True)
    labels = torch.tensor([int(line.split("\t")[3]) for line in
                           (tmp_path / "data" / "ids-sst-dev.csv").read_text().splitlines()[1:]])
    special = tmp_path / "sst-only"
    write_run_logits(special, "predictions", "sst", "dev", [f"sst{i}" for i in range(60)],
                     model_logits("sst", labels, 1, 77))
    write_run_logits(special, "predictions", "sst", "test", [f"t{i}" for i in range(7)], torch.randn(7, 5))
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
    there) is an argument error: exit status 2, the usage line and one error line, and the input run's files keep
    their bytes."""
    runs = make_runs(tmp_path, nested=nested)
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
        usage, message = capsys.readouterr().err.strip().splitlines()
        assert usage.startswith("usage: python -m tasks.ensemble ") and message.startswith(
            "python -m tasks.ensemble: error: --out-dir") and runs[0] in message, message
        assert _snapshot(tmp_path / "run0") == before, out
    if nested:  # the run's predictions folder given as the input, its run folder as the output
        with pytest.raises(SystemExit) as err:
            main([f"{runs[0]}/predictions", runs[1], "--data-dir", data, "--out-dir", runs[0]])
        assert err.value.code == 2 and _snapshot(tmp_path / "run0") == before
        main([*runs, "--data-dir", data, "--out-dir", f"{runs[0]}/ensemble"])  # beside predictions/: allowed


def test_nan_in_a_logits_file_leaves_no_partial_outputs(tmp_path, capsys):
    """A non-finite logit in one run's para file (read after sst's) stops the ensemble before anything is written:
    a fresh --out-dir is not created, and an earlier ensemble's files keep their bytes. One line names the file."""
    runs = make_runs(tmp_path)
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
        message = capsys.readouterr().err.strip().splitlines()[-1]  # after the log's lines, the error's
        assert message.startswith("python -m tasks.ensemble: error: "), message
        assert str(bad) in message and "line 6" in message, message
    assert _snapshot(out) == before
    assert not (tmp_path / "fresh").exists()


def test_mistyped_run_path_says_no_such_directory(tmp_path, capsys):
    """A run path that does not exist exits 2 with 'no such directory: PATH', before reading anything."""
    runs = make_runs(tmp_path)
    typo = str(tmp_path / "rnu1")
    with pytest.raises(SystemExit) as err:
        main([runs[0], typo, "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "ens")])
    assert err.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"no such directory: {typo}")
    assert not (tmp_path / "ens").exists()


def test_abbreviations_are_refused(capsys):
    """'--meth' is not taken as '--method' (every default in --help: tests/test_cli.py)."""
    parser = build_parser()
    with pytest.raises(SystemExit) as err:
        parser.parse_args(["runs/a", "--out-dir", "x", "--meth", "selective"])
    assert err.value.code == 2 and "unrecognized argument --meth: did you mean --method?" in capsys.readouterr().err


def test_a_write_failing_midway_leaves_the_out_dir_as_it_was(tmp_path, monkeypatch, capsys):
    """Outputs are staged and moved into place only when all are written: a failure on the third file (a full
    disk, say) leaves an earlier ensemble's files with their bytes and no staging folder behind."""
    import tasks.evaluation.ensembling as ens

    runs = make_runs(tmp_path)
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
    with pytest.raises(SystemExit) as exc:  # one line, exit status 1 (tasks.cli.user_errors), not a traceback
        main([*runs, "--method", "selective", "--data-dir", str(tmp_path / "data"), "--out-dir", str(out)])
    assert exc.value.code == 1 and "error: disk full" in capsys.readouterr().err.strip().splitlines()[-1]
    assert _snapshot(out) == before and sorted(p.name for p in out.iterdir()) == sorted(
        ["cs224n_default_final_project_submission.zip", "ensemble.json", "ensemble.log", "owner.json", "predictions"])


def test_submission_zip_and_outputs_follow_the_umask(tmp_path):
    """The submission zip and the ensemble's files are 0644 under umask 022, not the temporary-file default 0600."""
    runs = make_runs(tmp_path)
    old = os.umask(0o022)
    try:
        main([*runs, "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "ens")])
    finally:
        os.umask(old)
    files = [f for f in (tmp_path / "ens").rglob("*") if f.is_file()]
    assert (tmp_path / "ens" / "cs224n_default_final_project_submission.zip") in files
    assert {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in files} == {f.name: "0o644" for f in files}


def test_a_test_id_no_member_predicted_marks_the_submission_incomplete(tmp_path, capsys):
    """The ensemble checks every test file it writes against the ids of the task's test input file: an id no
    member predicted is a SUBMISSION INCOMPLETE line on stderr and an "incomplete" entry in ensemble.json, not a
    silent zip with an id fewer; complete tasks say nothing."""
    runs = make_runs(tmp_path)
    data = tmp_path / "data"
    (data / "sts-test-student.csv").write_text("\tid\tsentence1\tsentence2\n"
                                               + "".join(f"{i}\tt{i}\ta\tb\n" for i in range(8)))
    (data / "ids-sst-test-student.csv").write_text("0\t\tid\tsentence\n"
                                                   + "".join(f"{i}\t{i}.0\tt{i}\ta\n" for i in range(7)))
    summary = main([*runs, "--data-dir", str(data), "--out-dir", str(tmp_path / "ens")])
    err = capsys.readouterr().err
    line = ("SUBMISSION INCOMPLETE: sts-test-output.csv lacks 1 of the 8 ids of "
            f"{data / 'sts-test-student.csv'} (t7)")
    assert line in err and "sst-test-output.csv lacks" not in err
    assert summary["incomplete"] == [next(x for x in err.splitlines() if line in x).split("SUBMISSION INCOMPLETE: ")[1]]
    assert json.loads((tmp_path / "ens" / "ensemble.json").read_text())["incomplete"] == summary["incomplete"]
    complete = main([*runs, "--data-dir", str(data), "--out-dir", str(tmp_path / "ens2"), "--tasks", "sst"])
    assert "incomplete" not in complete and "INCOMPLETE" not in capsys.readouterr().err


def test_an_ensemble_runs_no_code_of_the_files_its_runs_recorded(tmp_path, capsys):
    """A run whose config.json records an objective file of its own (objective_modules) joins an ensemble as any
    run does, and that file is never imported: an ensemble reads the runs' logits and tasks, no objective."""
    runs = make_runs(tmp_path, nested=True)
    marker, plugin = tmp_path / "imported", tmp_path / "mine" / "my_loss.py"
    plugin.parent.mkdir()
    plugin.write_text(f"open({str(marker)!r}, 'w').close()\n")
    run_dir = Path(runs[0]).parent if Path(runs[0]).name == "predictions" else Path(runs[0])
    (run_dir / "config.json").write_text(json.dumps({"tasks": ["sst"], "objectives": {"my_loss": {}},
                                                     "objective_modules": [str(plugin)]}))
    summary = main([*runs, "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "ens")])
    assert summary["tasks"]["para"]["runs"] == ["run1", "run2"]  # its config.json was read: an SST specialist
    assert not marker.exists()
