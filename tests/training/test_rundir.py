"""Tests of tasks/training/rundir.py, the run directory: one run at a time, --overwrite that can fail
safely.

Two processes must never train into one --out-dir (their metrics interleave
and one predicts from the other's checkpoint): the directory is locked by a
file naming its owner. --overwrite moves the old run aside and deletes it only
once the new run has written its first checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
from pathlib import Path

import pytest

from tasks.train_config import TrainConfig
from tasks.training.run import run, trainer_for
from tasks.training.rundir import RunDir, check_out_dir
from tasks.training.loop import Hook
from tests.helpers import dead_pid, snapshot, tiny_train_config

pytestmark = pytest.mark.usefixtures("one_thread")


def _write_lock(run_dir: Path, pid: int) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir / "run.lock"
    lock.write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
    return lock


def test_a_live_owner_of_the_run_directory_is_refused(tmp_path):
    """A second run into a directory whose lock names a live process fails with its pid and the lock's path,
    and changes nothing there."""
    out = tmp_path / "run"
    lock = _write_lock(out, os.getppid())
    (out / "metrics.jsonl").write_text('{"epoch": 1}\n')
    before = snapshot(out)
    with pytest.raises(FileExistsError, match=rf"process {os.getppid()} .*{lock}"):
        RunDir(out).start(TrainConfig(out_dir=str(out)), overwrite=True)
    assert snapshot(out) == before


def test_a_stale_lock_is_taken_over_and_released(tmp_path, caplog):
    """A lock left by a dead process is taken over with a warning; close() removes it; a non-writer rank
    (torchrun rank > 0) never takes one."""
    out = tmp_path / "run"
    lock = _write_lock(out, dead_pid())
    run_dir = RunDir(out)
    with caplog.at_level(logging.WARNING):
        run_dir.start(TrainConfig(out_dir=str(out)))
    assert "taking over" in caplog.text
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    run_dir.close()
    assert not lock.exists()
    RunDir(tmp_path / "other", writer=False).start(TrainConfig(out_dir=str(tmp_path / "other")))
    assert not (tmp_path / "other" / "run.lock").exists()


def test_a_fresh_run_refuses_a_folder_with_metrics_but_no_checkpoints(tmp_path):
    """metrics.jsonl of an earlier run is not deleted silently: a fresh run without --overwrite names it (checked
    before the run reads anything); a resume and an --overwrite pass."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"epoch": 1}\n')
    before = snapshot(out)
    with pytest.raises(FileExistsError, match="metrics.jsonl.*--overwrite"):
        check_out_dir(out, resume=False, overwrite=False)
    check_out_dir(out, resume=True, overwrite=False)
    check_out_dir(out, resume=False, overwrite=True)
    assert snapshot(out) == before


class _Boom(Exception):
    pass


class _FailFirstStep(Hook):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_step_end(self, state, control, step) -> None:
        aside = list(self.out.glob(".replaced-*"))
        assert len(aside) == 1 and (aside[0] / "checkpoints" / "best").is_dir(), "the old run is kept aside"
        raise _Boom


def test_overwrite_keeps_the_old_run_until_the_new_one_has_a_checkpoint(tiny_env, tmp_path):
    """--overwrite that fails on bad data (refused before the run directory is touched: not even its train.log
    changes), or in training before its first checkpoint, leaves the old run as it was; one that succeeds replaces
    it and leaves nothing aside; no lock stays behind."""
    out = tmp_path / "run"
    run(tiny_train_config(tiny_env, out, epochs=1))
    before = snapshot(out)
    bad = tmp_path / "bad-data"
    shutil.copytree(tiny_env[1], bad)
    (bad / "sts-train.csv").write_text("")
    log = (out / "train.log").read_text()

    def unchanged_but_the_log(failure: str) -> bool:  # train.log keeps its lines; the attempt's are appended
        text, after = (out / "train.log").read_text(), snapshot(out)
        before.pop("train.log", None), after.pop("train.log", None)
        return after == before and text.startswith(log) and text.splitlines()[-1].endswith(failure)

    with pytest.raises(ValueError, match="the file is empty; copy the CS224N file there again"):
        run(tiny_train_config(tiny_env, out, epochs=1, data_dir=str(bad)), overwrite=True)
    assert snapshot(out) == before
    with pytest.raises(_Boom):
        run(tiny_train_config(tiny_env, out, epochs=1, lr=2e-3), overwrite=True, hooks=[_FailFirstStep(out)])
    assert unchanged_but_the_log("failed: _Boom:")
    run(tiny_train_config(tiny_env, out, epochs=1, lr=2e-3), overwrite=True)
    after = snapshot(out)
    assert after["checkpoints/best/model.safetensors"] != before["checkpoints/best/model.safetensors"]
    assert not list(out.glob(".replaced-*")) and "run.lock" not in after


def test_skip_counts_of_every_file_read_are_in_metrics_and_data_json(tiny_env, tmp_path):
    """The ReadReport of every file read (train, dev, test) is in metrics.jsonl's first epoch record ("data") and in
    data.json beside config.json (which TrainConfig.from_dict still loads); a resumed run keeps it."""
    data = tmp_path / "data"
    shutil.copytree(tiny_env[1], data)
    with open(data / "sts-train.csv", "a") as f:
        f.write("999\tsts-train-999\tthe cat\tthe dog\tnot-a-number\n")
    out = tmp_path / "run"
    cfg = tiny_train_config(tiny_env, out, data_dir=str(data))
    run(cfg)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    reports = records[0]["data"]
    assert set(reports) == {f"{t} {s}" for t in ("sst", "para", "sts") for s in ("train", "dev")} | {
        "sst test", "sts test"}  # the tiny data have no Quora test file
    assert reports["sts train"]["skipped"] == 1 and reports["sts train"]["file"].endswith("sts-train.csv")
    assert reports["sst dev"]["kept"] == reports["sst dev"]["rows"] > 0
    assert all("data" not in r for r in records[1:])
    assert json.loads((out / "data.json").read_text())["files"] == reports
    assert TrainConfig.from_dict(json.loads((out / "config.json").read_text())) == cfg
    trainer_for(cfg, resume_from=out / "checkpoints" / "last")  # rewrites metrics.jsonl from the checkpoint
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["data"] == reports


def test_an_overwrite_killed_before_its_first_checkpoint_is_pointed_out(tmp_path, caplog):
    """A process killed mid-overwrite cannot put the old run back: the next start names the folder holding it."""
    out = tmp_path / "run"
    aside = out / f".replaced-20260101-000000-{dead_pid()}"
    (aside / "checkpoints" / "best").mkdir(parents=True)
    run_dir = RunDir(out)
    with caplog.at_level(logging.WARNING):
        run_dir.start(TrainConfig(out_dir=str(out)))
    run_dir.close()  # its lock and its train.log go, as at a run's end
    assert str(aside) in caplog.text and "killed" in caplog.text
    assert aside.is_dir()
