"""Tests of tasks/training/run.py: a whole run (train, reload the best checkpoint, write every prediction file),
and its crash windows: a failure injected at each checkpoint phase, then a resume.

Every crash-window test kills a run at one exact point (a monkeypatched function
raises, as the resume tests of tests/training/test_trainer.py do) and checks
that resuming it ends where an uninterrupted run ends: the same best weights,
the same metrics.jsonl records (timing fields aside) and the same prediction files.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tasks.train_config import TrainConfig
from tasks.evaluation.evaluator import Evaluator
from tasks.predictions import read_predictions
from tasks import checkpoint as ckpt_mod
from tasks import storage
from tasks.training import rundir as rundir_mod
from tasks.training import trainer as trainer_mod
from tasks.storage import read_json
from tasks.training.run import run, trainer_for
from tasks.training.loop import Hook
from tests.helpers import tiny_train_config

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- what a run writes -----------------------------------------------------------------------------------


def _rows(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_run_writes_dev_and_test_predictions_and_skips_missing_test(tiny_env, tmp_path, caplog):
    """run() reloads the best checkpoint and writes every task's dev and test files; the missing Quora test is skipped."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1)
    caplog.set_level("INFO")
    summary = run(cfg)
    pred = tmp_path / "run" / "predictions"
    names = sorted(p.name for p in pred.iterdir())
    assert names == sorted(f"{t}-{s}-{kind}.csv" for t in ("sst", "para", "sts") for s in ("dev", "test")
                           for kind in ("output", "logits") if not (t == "para" and s == "test"))
    assert _rows(pred / "sst-dev-output.csv")[0] == "id \t Predicted_Sentiment "
    assert len(_rows(pred / "sst-test-output.csv")) == 1 + 16
    assert _rows(pred / "sts-dev-output.csv")[0] == "id \t Predicted_Similiary "  # sic, the CS224N starter's
    assert any("para test" in s for s in summary["skipped"])
    assert "quora-test-student.csv" in caplog.text
    assert len([r for r in caplog.records if "para" in r.getMessage() and "test" in r.getMessage()
                and r.levelno >= logging.WARNING]) == 1  # warned once
    assert re.search(r"best epoch 1 \(dev overall (\d\.\d{4}|undefined)\)", caplog.text)
    assert not re.findall(r"\d\.\d{5,}", caplog.text)  # scores and times with 4 digits at most
    final = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["final"] and set(final["dev"]) == {"sst_acc", "para_acc", "sts_r", "overall"}


def test_run_from_python_writes_train_log_as_the_command_does(tiny_env, tmp_path, monkeypatch, capsys):
    """run() from Python writes train.log as the command does, the progress and results included though the
    root logger is at WARNING (a script that set up no logging), and what it logged while reading the data, before
    its run directory existed (the warnings printed then, once); the error that ended a failed run is its last
    line; the caller's logging is as it was after either."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # pytest's capture set aside: a bare script
    monkeypatch.setattr(root, "level", logging.WARNING)
    monkeypatch.setattr(logging.getLogger("tasks"), "level", logging.NOTSET)
    run(tiny_train_config(tiny_env, tmp_path / "run", epochs=1))
    text = (tmp_path / "run" / "train.log").read_text()
    assert " I tasks.training.hooks: epoch 1 done" in text and "I tasks.training.run: done: wall time" in text
    lines = text.splitlines()
    first = [n for n, x in enumerate(lines) if "I tasks.data.readers: " in x and "ids-sst-train.csv: kept" in x]
    assert first and first[0] < min(n for n, x in enumerate(lines) if "I tasks.selection: data: " in x), text
    assert sum(" W tasks.task: no test file for task 'para'" in x for x in lines) == 1
    assert capsys.readouterr().err.count("no test file for task 'para'") == 1
    assert root.handlers == [] and logging.getLogger("tasks").level == logging.NOTSET

    class Broken(Hook):
        def on_epoch_end(self, state, control, record):
            raise RuntimeError("a hook's bug")

    with pytest.raises(RuntimeError):
        run(tiny_train_config(tiny_env, tmp_path / "failed", epochs=1), hooks=[Broken()])
    last = (tmp_path / "failed" / "train.log").read_text().splitlines()[-1]
    assert last.endswith("E tasks: failed: RuntimeError: a hook's bug")
    assert root.handlers == [] and logging.getLogger("tasks").level == logging.NOTSET


def test_a_trainer_from_python_closes_as_a_context_manager(tiny_env, tmp_path, monkeypatch):
    """``with trainer_for(cfg) as trainer``: on leaving the block the run's train.log is closed (a later run's lines
    stay out of it), the package loggers' levels and the root's handlers are as they were, and the run directory's
    lock is free: the same process may resume it."""
    root, package = logging.getLogger(), logging.getLogger("tasks")
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(package, "level", logging.NOTSET)
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1)
    with trainer_for(cfg) as trainer:
        trainer.fit()
    assert root.handlers == [] and package.level == logging.NOTSET
    size = (tmp_path / "run" / "train.log").stat().st_size
    with trainer_for(tiny_train_config(tiny_env, tmp_path / "other", epochs=1)) as other:
        other.fit()
    assert (tmp_path / "run" / "train.log").stat().st_size == size
    with trainer_for(cfg, resume_from=tmp_path / "run" / "checkpoints" / "last") as resumed:
        assert resumed.epoch == 1


def test_save_only_model_keeps_the_model_alone_and_the_log_says_the_disk_use(tiny_env, tmp_path, caplog):
    """The log ends with the run's disk use (best and last, each with weights and optimizer state);
    --save-only-model deletes last and the optimizer state at the end, the best model still evaluates to the same
    predictions, and a resume is refused naming why."""
    from tasks.evaluation.evaluator import evaluate_checkpoint

    caplog.set_level("INFO")
    full = tmp_path / "full"
    run(tiny_train_config(tiny_env, full, epochs=1))
    disk = [r.getMessage() for r in caplog.records if r.getMessage().startswith("disk: ")]
    assert re.fullmatch(rf"disk: {full} holds \d+ [kM]B \(checkpoints/best \d+ [kM]B, checkpoints/last \d+ [kM]B\); "
                        r"--save-only-model keeps the model alone", disk[-1]), disk
    lean = tmp_path / "lean"
    run(tiny_train_config(tiny_env, lean, epochs=1, save_only_model=True))
    assert sorted(p.name for p in (lean / "checkpoints").iterdir()) == ["best"]
    assert not list((lean / "checkpoints" / "best").glob("optimizer*"))
    said = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(r"--save-only-model: checkpoints/last and the optimizer state deleted \(\d+ [kM]B freed\); "
                        r"the run can be evaluated \(--eval-only\), no longer resumed", said[-4]), said[-4]
    assert re.fullmatch(rf"disk: {lean} holds \d+ [kM]B \(checkpoints/best \d+ [kM]B\)", said[-3]), said[-3]
    for name in ("sst-dev-logits.csv", "sts-test-output.csv"):
        assert (lean / "predictions" / name).read_bytes() == (full / "predictions" / name).read_bytes()
    shutil.rmtree(lean / "predictions")
    evaluate_checkpoint(lean / "checkpoints" / "best")
    assert (lean / "predictions" / "sst-dev-logits.csv").read_bytes() == (
        full / "predictions" / "sst-dev-logits.csv").read_bytes()
    with pytest.raises(ValueError, match=r"kept its model alone \(--save-only-model\), so it cannot be resumed"):
        run(tiny_train_config(tiny_env, lean, epochs=2), resume_from=lean / "checkpoints" / "last")


def test_the_estimate_from_the_plans_tokens_meets_the_runs_time_on_a_fake_clock(tiny_env, tmp_path, monkeypatch,
                                                                               caplog):
    """The estimate comes early (a smoke run gets one too) and times each step by its tokens. On a clock
    where a training step takes 0.1 s a padded token and an evaluation 0.02 s a scored example, the estimate
    given after 10 steps (before the first progress line, log_every being 50; epochs of 9 steps, so the first
    dev evaluation is timed by then) is the run's actual time."""
    from tasks.evaluation.evaluator import Evaluator

    now = [1000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    step, evaluate = trainer_mod.Trainer.train_step, Evaluator.evaluate

    def timed_step(self, stream, batch, lr, share=1):
        now[0] += 0.1 * sum(v.numel() for k, v in batch.items() if k.startswith("input_ids"))
        return step(self, stream, batch, lr, share)

    def timed_evaluate(self, model, datasets):
        now[0] += 0.02 * sum(len(d) for d in datasets.values())
        return evaluate(self, model, datasets)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", timed_step)
    monkeypatch.setattr(Evaluator, "evaluate", timed_evaluate)
    caplog.set_level("INFO")
    start = now[0]
    run(tiny_train_config(tiny_env, tmp_path / "run", epochs=3, log_every=50, symmetric_eval=False, limit=24))
    actual = now[0] - start
    said = [r.getMessage() for r in caplog.records]
    (estimate,) = [x for x in said if x.startswith("estimate after ")]
    first_progress = next((i for i, x in enumerate(said) if " step " in x and " | lr " in x), len(said))
    assert said.index(estimate) < first_progress
    seconds = re.fullmatch(r"estimate after 10 steps: the run takes ~(\d+)m(\d\d)s in all, evaluations included "
                           r"\(the steps left timed by their padded tokens\)", estimate)
    assert seconds, estimate
    assert int(seconds[1]) * 60 + int(seconds[2]) == pytest.approx(actual, abs=1.0), (estimate, actual)


@pytest.mark.parametrize("final_dev", ["full", "capped"])
def test_final_dev_full_or_capped(tiny_env, tmp_path, final_dev):
    """final_dev capped scores the between-epoch subset at the end too (the same ids); full reads every row."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1, dev_max_examples={"para": 8}, final_dev=final_dev)
    run(cfg)
    ids, _ = read_predictions(tmp_path / "run" / "predictions" / "para-dev-output.csv")
    if final_dev == "capped":
        assert sorted(ids) == sorted(trainer_for(cfg, overwrite=True).dev_sets["para"].ids)
    else:
        assert len(ids) == 24


def test_final_log_line_says_what_dev_was_scored_on():
    """Under --limit the final line must not claim the full dev sets, nor 64 rows of a 40-row file: it names the
    rows each task scored."""
    from tasks.training.run import final_dev_scope

    rows = {"sst": 40, "para": 64}
    assert final_dev_scope(TrainConfig(), rows) == "full sets"
    assert final_dev_scope(TrainConfig(final_dev="capped"), rows) == "capped subsets: sst 40, para 64 rows"
    assert final_dev_scope(TrainConfig(limit=64), rows) == "--limit 64: sst 40, para 64 rows"


# ---- crash windows ---------------------------------------------------------------------------------------


TIMING = {"train_time_s", "eval_time_s", "elapsed_s", "process_time_s"}


class Killed(Exception):
    """Stands for the process dying at the injected point."""


def _records(run_dir: Path) -> list[dict]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = {k: v for k, v in json.loads(line).items() if k not in TIMING}
        r.pop("predictions_from", None)  # the path differs between the two run directories
        r.pop("predictions", None)
        out.append(r)
    return out


def _predictions(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run_dir / "predictions").iterdir())}


def _assert_same_run(a: Path, b: Path) -> None:
    wa = load_file(str(a / "checkpoints" / "best" / "model.safetensors"))
    wb = load_file(str(b / "checkpoints" / "best" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa), "best weights differ"
    assert _records(a) == _records(b)
    pa, pb = _predictions(a), _predictions(b)
    assert pa.keys() == pb.keys() and pa
    assert [n for n in pa if pa[n] != pb[n]] == []


# Two tiny 2-epoch runs: epoch 1 stays the best, or every epoch improves (checked by ``uninterrupted``).
SETTINGS = {"best-1": ({}, [True, False]), "best-2": ({"lr": 5e-3}, [True, True])}


@pytest.fixture(scope="module")
def uninterrupted(tiny_env, tmp_path_factory):
    """run_dir_of(setting): the directory of an uninterrupted run with that setting (made once)."""
    made: dict[str, Path] = {}

    def run_dir_of(setting: str) -> Path:
        if setting not in made:
            overrides, improving = SETTINGS[setting]
            out = tmp_path_factory.mktemp(setting) / "run"
            run(tiny_train_config(tiny_env, out, **overrides))
            history = read_json(out / "checkpoints" / "last" / "state.json")["history"]
            assert [r["best"] for r in history] == improving, f"setting {setting} no longer improves as assumed"
            made[setting] = out
        return made[setting]

    return run_dir_of


@pytest.mark.parametrize("setting,epoch", [("best-1", 1), ("best-2", 2)])
def test_crash_between_last_and_best_is_repaired_on_resume(tiny_env, tmp_path, monkeypatch, uninterrupted, setting,
                                                          epoch):
    """Killed after `last` is written but before `best` is linked (epoch 1: best is missing; the last epoch: best
    is stale and would give the predictions): resume re-links best."""
    calls = []
    real = rundir_mod.copy_directory

    def dies(src, final):
        calls.append(final)
        if len(calls) == epoch:
            raise Killed
        real(src, final)

    cfg = tiny_train_config(tiny_env, tmp_path / "run", **SETTINGS[setting][0])
    monkeypatch.setattr(rundir_mod, "copy_directory", dies)
    with pytest.raises(Killed):
        run(cfg)
    monkeypatch.setattr(rundir_mod, "copy_directory", real)
    run(cfg, resume_from=tmp_path / "run" / "checkpoints" / "last")
    _assert_same_run(uninterrupted(setting), tmp_path / "run")


def _dies_on_call(monkeypatch, owner, name: str, n: int, when=lambda *a, **k: True) -> None:
    """Make ``owner.name`` raise Killed on its ``n``-th call for which ``when(*args)`` holds."""
    real, seen = getattr(owner, name), []

    def wrapper(*args, **kwargs):
        if when(*args, **kwargs):
            seen.append(args)
            if len(seen) == n:
                raise Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


# Where the second (last) epoch's end is killed, in the order the phases happen. Setting best-2: both
# epochs improve, so the first epoch wrote last and linked best, and the second one does both again.
PHASES = {
    "before writing last": lambda mp: _dies_on_call(mp, trainer_mod, "atomic_directory", 2),
    "during writing last": lambda mp: _dies_on_call(mp, ckpt_mod, "save_tensors", 5),  # 2nd: model, optimizer
    "between the renames of last": lambda mp: _dies_on_call(
        mp, storage.os, "replace", 2, when=lambda src, dst: Path(dst).name == "last"),
    "after last, before best": lambda mp: _dies_on_call(mp, rundir_mod, "copy_directory", 2),
    "between the renames of best": lambda mp: _dies_on_call(
        mp, storage.os, "replace", 2, when=lambda src, dst: Path(dst).name == "best"),
    "after the renames of best, before best.old goes": lambda mp: _dies_on_call(
        mp, storage.shutil, "rmtree", 1, when=lambda path, *a, **k: Path(path).name == "best.old"),
    "after best, before the metrics record": lambda mp: _dies_on_call(mp, rundir_mod.RunDir, "append", 2),
    "after the epoch, before predictions": lambda mp: _dies_on_call(mp, Evaluator, "write_all", 1),
}


@pytest.mark.parametrize("phase", PHASES)
def test_a_run_killed_at_any_checkpoint_phase_resumes_to_the_uninterrupted_result(
        tiny_env, tmp_path, monkeypatch, uninterrupted, phase):
    """Killed at each phase of the last epoch's checkpoint, ``run(cfg, resume_from=last)`` ends with the best
    weights, metrics.jsonl records (timing aside) and prediction files of the uninterrupted run."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", **SETTINGS["best-2"][0])
    with monkeypatch.context() as mp:
        PHASES[phase](mp)
        with pytest.raises(Killed):
            run(cfg)
    run(cfg, resume_from=tmp_path / "run" / "checkpoints" / "last")
    _assert_same_run(uninterrupted("best-2"), tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["best", "last"]  # no .old


def test_a_test_file_with_a_skipped_row_is_read_first_and_makes_the_submission_loudly_incomplete(
        tiny_env, tmp_path, caplog):
    """A cut row in sts-test-student.csv leaves its leaderboard file an id short, and that is said loudly: the test
    files are read before training (data.json has them at once), and the final record and a warning say which
    leaderboard file lacks ids and why."""
    data = tmp_path / "data"
    shutil.copytree(tiny_env[1], data)
    test_file = data / "sts-test-student.csv"
    test_file.write_bytes(test_file.read_bytes().rstrip(b"\n")[:-3])  # the last record cut: no line end
    out = tmp_path / "run"
    with pytest.raises(Killed):
        run(tiny_train_config(tiny_env, out, data_dir=str(data), epochs=1), hooks=[_KilledAtStart()])
    reports = json.loads((out / "data.json").read_text())["files"]
    assert reports["sts test"]["skipped"] == 1  # recorded before the first step
    final = run(tiny_train_config(tiny_env, out, data_dir=str(data), epochs=1), overwrite=True)
    ids = (out / "predictions" / "sts-test-output.csv").read_text().splitlines()[1:]
    assert len(ids) == reports["sts test"]["rows"] - 1
    assert final["rows_skipped"] == {str(test_file): 1}
    (line,) = final["incomplete"]
    assert line.startswith(f"sts-test-output.csv lacks the ids of 1 of the {reports['sts test']['rows']} rows of "
                           f"{test_file}") and "cut" in line
    assert "SUBMISSION INCOMPLETE: sts-test-output.csv" in caplog.text


class _KilledAtStart(Hook):
    def on_train_start(self, state, control) -> None:
        raise Killed


def test_run_from_python_refuses_what_the_command_line_refuses(tiny_env, tmp_path, monkeypatch):
    """run(cfg) and trainer_for pass the same checks as the train command (prepare_run): --max-length beyond the
    encoder's positions and a damaged --pretrained are refused before any data is read, naming the setting."""
    from tasks.training import run as run_mod

    monkeypatch.setattr(run_mod, "build_trainer", lambda *a, **k: pytest.fail("the run got past its checks"))
    with pytest.raises(ValueError, match="--max-length 100 is more than the 64 positions"):
        run(tiny_train_config(tiny_env, tmp_path / "a", max_length=100))
    damaged = tmp_path / "model"
    shutil.copytree(tiny_env[0], damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"--pretrained .*model: .*truncated or corrupted"):
        run(tiny_train_config(tiny_env, tmp_path / "b", pretrained=str(damaged)))
    with pytest.raises(ValueError, match="--max-length 100"):
        run_mod.trainer_for(tiny_train_config(tiny_env, tmp_path / "c", max_length=100))


def test_resuming_a_finished_run_says_it_is_finished_and_what_it_redoes(tiny_env, tmp_path, caplog):
    """--resume of a run whose epochs are all trained: one line says it is finished (not 'at epoch 2' of 1), the
    next what runs again (the best checkpoint's predictions), and the predictions come out the same."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1)
    run(cfg)
    before = (tmp_path / "run" / "predictions" / "sst-dev-logits.csv").read_bytes()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        run(cfg, resume_from=tmp_path / "run" / "checkpoints" / "last")
    lines = [r.getMessage() for r in caplog.records if r.name == "tasks.training.trainer"]
    assert any(re.match(r"resumed from .*last: the run is finished \(1 of 1 epochs trained, global step \d+\)$", x)
               for x in lines), lines
    assert "nothing to train; what follows training runs again: the best checkpoint's dev and test predictions" \
        in lines
    assert (tmp_path / "run" / "predictions" / "sst-dev-logits.csv").read_bytes() == before
