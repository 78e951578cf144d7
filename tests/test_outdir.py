"""Tests of tasks/outdir.py: every output directory says whose it is, and no command writes over another
command's output (checked through the commands themselves)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tasks import ensemble, pretrain
from tasks import train as cli
from tasks.outdir import ENSEMBLE, MLM, OWNER_FILE, PREDICTIONS, RUN, check_kind, kind_of, mark, replacing
from tests.helpers import make_runs, snapshot


@pytest.fixture(scope="module")
def finished_run(tiny_env, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("owned") / "run"
    cli.main(_train_flags(tiny_env, out))
    return out


def _train_flags(env, out: Path) -> list[str]:
    pretrained, data = env
    return ["--pretrained", str(pretrained), "--data-dir", str(data), "--out-dir", str(out), "--device", "cpu",
            "--no-bf16", "--batch-size", "8", "--eval-batch-size", "16", "--max-length", "32", "--fcn-size", "16",
            "--lr", "1e-3", "--epochs", "1", "--limit", "16"]


def _pretrain_flags(env, out: Path) -> list[str]:
    pretrained, data = env
    return ["--out-dir", str(out), "--pretrained", str(pretrained), "--data-dir", str(data), "--epochs", "1",
            "--batch-size", "8", "--max-length", "16", "--max-steps", "1", "--device", "cpu"]


def _copy(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run, tmp_path / "target")
    return tmp_path / "target"


def test_each_command_marks_its_output(finished_run, tiny_env, tmp_path):
    assert kind_of(finished_run) == RUN and (finished_run / OWNER_FILE).is_file()
    mlm = pretrain.main(_pretrain_flags(tiny_env, tmp_path / "mlm"))
    assert kind_of(mlm) == MLM and (mlm / OWNER_FILE).is_file()
    runs = make_runs(tmp_path)
    ensemble.main([*runs, "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "ens")])
    assert kind_of(tmp_path / "ens") == ENSEMBLE and (tmp_path / "ens" / OWNER_FILE).is_file()
    cli.main(["--eval-only", "--checkpoint", str(finished_run / "checkpoints" / "best"), "--out-dir",
              str(tmp_path / "eval")])
    assert kind_of(tmp_path / "eval") == PREDICTIONS


def test_pretraining_into_a_training_run_is_refused_and_the_run_kept(finished_run, tiny_env, tmp_path, capsys):
    """python -m tasks.pretrain --out-dir <a finished run> is refused (exit 2) and the run keeps every byte."""
    target = _copy(finished_run, tmp_path)
    before = snapshot(target)
    with pytest.raises(SystemExit) as e:
        pretrain.main(_pretrain_flags(tiny_env, target))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and f"--out-dir {target} holds a training run (written by train_multitask.py)" in err
    assert snapshot(target) == before
    out = pretrain.main([*_pretrain_flags(tiny_env, target), "--overwrite"])  # told to: replaced whole
    assert kind_of(out) == MLM and not (out / "checkpoints").exists()


def test_an_ensemble_into_a_training_run_is_refused_and_its_predictions_kept(finished_run, tmp_path, capsys):
    """python -m tasks.ensemble A B --out-dir <a run that is not an input> is refused (exit 2) and the run's
    predictions keep their bytes; --overwrite replaces it."""
    runs = make_runs(tmp_path)
    target = _copy(finished_run, tmp_path)
    before = snapshot(target)
    argv = [*runs, "--data-dir", str(tmp_path / "data"), "--out-dir", str(target)]
    with pytest.raises(SystemExit) as e:
        ensemble.main(argv)
    usage, err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and usage.startswith("usage: ") and "holds a training run" in err
    assert snapshot(target) == before
    ensemble.main([*argv, "--overwrite"])
    assert kind_of(target) == ENSEMBLE and not (target / "checkpoints").exists()
    ensemble.main(argv)  # its own kind: written again without --overwrite


def test_a_training_run_into_an_mlm_checkpoint_is_refused_and_its_config_kept(tiny_env, tmp_path, capsys):
    """train_multitask.py --out-dir <an MLM checkpoint> is refused and the checkpoint's config.json kept, so that
    --pretrained of it still loads the MLM encoder."""
    mlm = pretrain.main(_pretrain_flags(tiny_env, tmp_path / "mlm"))
    before = snapshot(mlm)
    with pytest.raises(SystemExit) as e:
        cli.main(_train_flags(tiny_env, mlm))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "holds an MLM checkpoint (written by python -m tasks.pretrain)" in err
    assert "--overwrite" in err and snapshot(mlm) == before
    cli.main([*_train_flags(tiny_env, mlm), "--overwrite"])  # told to: the MLM files go, the run is alone
    assert kind_of(mlm) == RUN and not (mlm / "model.safetensors").exists() and not (mlm / "vocab.txt").exists()


def test_eval_only_into_another_training_run_is_refused(finished_run, tmp_path, capsys):
    """--eval-only writes into its checkpoint's own run, or a directory of predictions; never into another run."""
    target = _copy(finished_run, tmp_path)
    before = snapshot(target)
    other = tmp_path / "other"
    shutil.copytree(finished_run, other)
    with pytest.raises(SystemExit) as e:
        cli.main(["--eval-only", "--checkpoint", str(other / "checkpoints" / "best"), "--out-dir", str(target)])
    err = capsys.readouterr().err
    # --eval-only takes no --overwrite: the refusal does not advise it
    assert e.value.code == 2 and "holds a training run" in err and "--overwrite" not in err, err
    assert "--eval-only never replaces another command's output" in err
    assert snapshot(target) == before
    cli.main(["--eval-only", "--out-dir", str(target)])  # its own run: re-predicted in place


def test_kind_of_recognizes_outputs_written_before_the_marker(tmp_path):
    assert kind_of(tmp_path / "missing") is None and kind_of(tmp_path) is None
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "ens").mkdir()
    (tmp_path / "ens" / "ensemble.json").write_text("{}")
    (tmp_path / "mlm").mkdir()
    (tmp_path / "mlm" / "config.json").write_text("{}")
    (tmp_path / "mlm" / "model.safetensors").write_bytes(b"")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("x")
    assert [kind_of(tmp_path / n) for n in ("run", "ens", "mlm", "notes")] == [RUN, ENSEMBLE, MLM, None]
    mark(tmp_path / "notes", ENSEMBLE)  # the marker wins over the files
    assert kind_of(tmp_path / "notes") == ENSEMBLE


def test_replacing_puts_the_old_output_back_when_the_new_one_fails(tmp_path):
    old = tmp_path / "out"
    old.mkdir()
    mark(old, RUN)
    (old / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(FileExistsError, match="holds a training run"):
        check_kind(old, ENSEMBLE)
    with pytest.raises(RuntimeError), replacing(old, ENSEMBLE, overwrite=True):
        old.mkdir()
        (old / "half-written").write_text("x")
        raise RuntimeError("disk full")
    assert sorted(p.name for p in old.iterdir()) == ["metrics.jsonl", OWNER_FILE]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    with replacing(old, ENSEMBLE, overwrite=True):
        old.mkdir()
        mark(old, ENSEMBLE)
    assert kind_of(old) == ENSEMBLE and [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.fixture
def live_holder():
    """A live process other than this one: what holds a run directory's lock while it trains."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _held_by(run: Path, pid: int) -> None:
    (run / "run.lock").write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))


@pytest.mark.parametrize("command", ["ensemble", "pretrain", "train"])
def test_overwrite_never_moves_aside_a_directory_a_live_process_holds(finished_run, tiny_env, tmp_path, capsys,
                                                                     live_holder, command):
    """A directory whose run.lock a live process holds is refused by every command, --overwrite or not, exit 2,
    naming the process; not one byte of it changes."""
    target = _copy(finished_run, tmp_path)
    _held_by(target, live_holder)
    before = snapshot(target)
    argv = {"ensemble": lambda: [*make_runs(tmp_path), "--data-dir", str(tmp_path / "data"), "--out-dir",
                                 str(target)],
            "pretrain": lambda: _pretrain_flags(tiny_env, target),
            "train": lambda: _train_flags(tiny_env, target)}[command]() + ["--overwrite"]
    main = {"ensemble": ensemble.main, "pretrain": pretrain.main, "train": cli.main}[command]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2, err
    assert f"{target} is in use by process {live_holder} on {socket.gethostname()}" in err
    assert snapshot(target) == before
