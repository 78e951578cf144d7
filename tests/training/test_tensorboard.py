"""Tests of tasks/training/tensorboard.py (--report-to tensorboard): a tiny run's events read back with
TensorBoard's own reader equal its log lines and metrics.jsonl; a resumed run hides the events after its step;
without the package, one line says how to install it."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tasks import train as cli
from tasks.training.tensorboard import TensorBoard


def _read(directory) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _flags(env, out_dir) -> list[str]:
    pretrained, data = env
    return ["--pretrained", str(pretrained), "--data-dir", str(data), "--out-dir", str(out_dir), "--device", "cpu",
            "--no-bf16", "--batch-size", "8", "--eval-batch-size", "16", "--max-length", "32", "--fcn-size", "16",
            "--lr", "1e-3", "--log-every", "2", "--epochs", "2"]


def test_a_runs_events_are_its_log_lines_and_metrics(tiny_env, tmp_path, caplog):
    """Every log line's window means at its global step, every epoch's train means and dev scores at the epoch's
    last step, and the final dev scores: the values metrics.jsonl and train.log hold."""
    run_dir = tmp_path / "run"
    cli.main([*_flags(tiny_env, run_dir), "--report-to", "tensorboard"])
    scalars = _read(run_dir / "tensorboard")
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs, final = records[:-1], records[-1]
    assert [r["epoch"] for r in epochs] == [1, 2] and final["final"]
    for r in epochs:
        for name, value in r["train"].items():
            assert (r["global_step"], pytest.approx(value)) in scalars[f"epoch/{name}"]
        assert (r["global_step"], pytest.approx(r["dev"]["overall"])) in scalars["dev/overall"]
    assert scalars["final_dev/overall"] == [(epochs[-1]["global_step"], pytest.approx(final["dev"]["overall"]))]
    lines = [r.getMessage() for r in caplog.records if " step " in r.getMessage() and "seq/s" in r.getMessage()]
    steps = [s for s, _ in scalars["train/loss"]]
    assert len(steps) == len(lines) >= 2 and steps == sorted(steps) and steps[-1] <= epochs[-1]["global_step"]
    assert {"train/lr", "train/seq_per_s", "train/sst/loss"} <= set(scalars)
    for (_, loss), line in zip(scalars["train/loss"], lines):
        assert f"| loss {loss:.4f} |" in line


def test_a_resumed_run_replaces_the_events_after_its_checkpoint(tiny_env, tmp_path):
    """A run resumed from its epoch-1 checkpoint while its events already reach epoch 2 (a crash after they were
    written): the events after the checkpoint's step are hidden, and each step holds one value, the new run's."""
    first, crashed = tmp_path / "first", tmp_path / "crashed"
    cli.main([*_flags(tiny_env, first), "--epochs", "1", "--lr-schedule", "constant", "--report-to", "tensorboard"])
    shutil.copytree(first, crashed)
    cli.main(["--resume", "--out-dir", str(first), "--epochs", "2"])  # its events go on to epoch 2
    shutil.rmtree(crashed / "tensorboard")
    shutil.copytree(first / "tensorboard", crashed / "tensorboard")  # the epoch-1 checkpoint, the epoch-2 events
    cli.main(["--resume", "--out-dir", str(crashed), "--epochs", "2", "--log-every", "1"])
    scalars = _read(crashed / "tensorboard")
    end_of_1 = json.loads((crashed / "metrics.jsonl").read_text().splitlines()[0])["global_step"]
    steps = [s for s, _ in scalars["train/loss"]]
    assert steps == sorted(set(steps)), steps  # no step twice
    after = [s for s in steps if s > end_of_1]
    assert after == list(range(end_of_1 + 1, end_of_1 + 1 + len(after))) and after  # every step: --log-every 1


def test_a_run_with_swa_reports_to_tensorboard(tiny_env, tmp_path):
    """SWA's records, at no global step of training, are left out of the events (they stopped the run with a
    KeyError); its epoch's log lines are there, after the training's steps, and the final dev scores last."""
    run_dir = tmp_path / "run"
    cli.main([*_flags(tiny_env, run_dir), "--epochs", "1", "--swa-epochs", "1", "--report-to", "tensorboard"])
    scalars = _read(run_dir / "tensorboard")
    trained = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])["global_step"]
    steps = [s for s, _ in scalars["train/loss"]]
    assert steps == sorted(steps) and steps[-1] > trained and [s for s, _ in scalars["epoch/loss"]] == [trained]
    assert scalars["final_dev/overall"] == [(steps[-1], pytest.approx(scalars["final_dev/overall"][0][1]))]


def test_without_report_to_no_events_are_written(tiny_env, tmp_path):
    run_dir = tmp_path / "run"
    cli.main([*_flags(tiny_env, run_dir), "--epochs", "1"])
    assert not (run_dir / "tensorboard").exists()


def test_a_resumed_writer_hides_the_events_after_its_step(tmp_path):
    """The run went to step 4, its checkpoint is at step 2: the resumed process's events replace steps 3 on."""
    first = TensorBoard(tmp_path)
    for step in range(1, 5):
        first.log_line(step, {"loss": float(step)})
    first.close()
    resumed = TensorBoard(tmp_path, purge_step=3)
    resumed.log_line(3, {"loss": 30.0})
    resumed.close()
    assert _read(tmp_path)["train/loss"] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_without_the_package_one_line_says_how_to_install_it(tiny_env, tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(SystemExit) as exc:
        cli.main([*_flags(tiny_env, tmp_path / "run"), "--report-to", "tensorboard"])
    err = capsys.readouterr().err.strip().splitlines()  # argparse's usage line, then the error
    assert exc.value.code == 2 and err[-1].endswith("needs the tensorboard package, which is not installed: "
                                                    ".venv/bin/pip install tensorboard"), err
    assert not (tmp_path / "run").exists()


def test_a_trainer_closed_without_a_final_record_closes_its_writer(tiny_env, tmp_path, monkeypatch):
    """A trainer from Python (no final record) or a run that fails: closing the trainer closes the TensorBoard writer,
    so every log line's scalars are in the event file."""
    from tasks.training.run import trainer_for
    from tasks.training.tensorboard import ReportToTensorBoard
    from tests.helpers import tiny_train_config

    closed = []
    monkeypatch.setattr(TensorBoard, "close", lambda self: closed.append(self) or self.writer.close())
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1, report_to=("tensorboard",), log_every=1)
    with trainer_for(cfg) as trainer:
        trainer.fit()
        hook = next(h for h in trainer.hooks if isinstance(h, ReportToTensorBoard))
    assert len(closed) == 1 and hook.writer is None
    steps = [s for s, _ in _read(tmp_path / "run" / "tensorboard")["train/loss"]]
    assert steps == list(range(1, trainer.global_step + 1))
