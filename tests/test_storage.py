"""Tests of tasks/storage.py: files and directories written whole or not at all, with the umask's mode; JSON
finite only; a full disk named as one."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat

import pytest

from tasks import storage
from tasks.train_config import TrainConfig
from tasks.storage import atomic_directory, atomic_file, temporary_prefix
from tasks.training.rundir import RunDir
from tests.helpers import dead_pid


def test_atomic_file_replaces_whole_or_not_at_all_with_the_umasks_mode(tmp_path):
    """A file written through atomic_file appears whole, with the mode the umask gives a new file (not mkstemp's
    0600); a failure inside leaves the previous file and no temporary behind."""
    path = tmp_path / "out" / "sst-dev-output.csv"
    with atomic_file(path) as tmp:
        tmp.write_text("old\n")
    before = os.umask(0o022)
    os.umask(before)
    assert path.read_text() == "old\n" and stat.S_IMODE(path.stat().st_mode) == 0o666 & ~before
    with pytest.raises(RuntimeError), atomic_file(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert path.read_text() == "old\n" and [p.name for p in path.parent.iterdir()] == [path.name]


def test_write_text_writes_a_whole_file_through_atomic_file(tmp_path, monkeypatch):
    """write_text replaces a file in one step, exactly the text given (no newline translation, UTF-8), its folder
    made; a failed write leaves the previous file."""
    path = tmp_path / "out" / "results.json"
    storage.write_text(path, "{\n  \"σ\": 1\n}\n")
    assert path.read_bytes() == "{\n  \"σ\": 1\n}\n".encode()

    def failing_replace(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))
    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        storage.write_text(path, "half")
    assert path.read_text(encoding="utf-8") == "{\n  \"σ\": 1\n}\n" and len(list(path.parent.iterdir())) == 1


def test_staged_files_move_in_together_or_not_at_all_keeping_the_folders_other_files(tmp_path, monkeypatch):
    """Files written into staged_files' temporary land in the folder on success (a file of the same name replaced,
    the folder's other files kept, the umask's modes); an exception inside leaves the folder as it was, and a
    folder the block created is removed again; a stage left by a writer that died is deleted by the next one."""
    out = tmp_path / "ens"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "ensemble.json").write_text("old")
    dead = out / (temporary_prefix("staged", pid=dead_pid()) + "x")
    dead.mkdir()
    with storage.staged_files(out) as stage:
        (stage / "predictions").mkdir()
        (stage / "predictions" / "sst-dev-output.csv").write_text("id\n")
        (stage / "ensemble.json").write_text("new")
    before = os.umask(0o022)
    os.umask(before)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "ensemble.json", "notes.txt", "predictions", "predictions/sst-dev-output.csv"]
    assert (out / "ensemble.json").read_text() == "new" and (out / "notes.txt").read_text() == "mine"
    assert stat.S_IMODE((out / "ensemble.json").stat().st_mode) == 0o666 & ~before
    with pytest.raises(RuntimeError), storage.staged_files(out) as stage:
        (stage / "ensemble.json").write_text("half")
        raise RuntimeError("a NaN logit")
    assert (out / "ensemble.json").read_text() == "new" and len(list(out.iterdir())) == 3
    with pytest.raises(RuntimeError), storage.staged_files(tmp_path / "fresh" / "ens") as stage:
        raise RuntimeError("a NaN logit")
    assert not (tmp_path / "fresh" / "ens").exists()


def test_atomic_directory_leaves_no_partial_checkpoint(tmp_path):
    """A failure while writing leaves the previous checkpoint untouched and no stray temporary directory."""
    final = tmp_path / "checkpoints" / "last"
    with atomic_directory(final) as tmp:
        (tmp / "a.json").write_text('{"v": 1}')
    with pytest.raises(RuntimeError):
        with atomic_directory(final) as tmp:
            (tmp / "a.json").write_text('{"v": 2}')
            raise RuntimeError("disk full")
    assert json.loads((final / "a.json").read_text()) == {"v": 1}
    assert sorted(p.name for p in final.parent.iterdir()) == ["last"]
    fresh = tmp_path / "checkpoints" / "best"
    with pytest.raises(RuntimeError):
        with atomic_directory(fresh) as tmp:
            raise RuntimeError("killed")
    assert not fresh.exists() and sorted(p.name for p in final.parent.iterdir()) == ["last"]


def test_stale_temporary_checkpoints_of_dead_writers_are_removed(tmp_path):
    """A crash mid-write leaves a temporary sibling named after its writer (pid@host); the next save, and the
    next start of a run, delete those of dead writers and keep a live writer's."""
    checkpoints = tmp_path / "run" / "checkpoints"
    with atomic_directory(checkpoints / "last") as tmp:
        assert tmp.name.startswith(temporary_prefix("last")) and str(os.getpid()) in tmp.name
    dead = checkpoints / (temporary_prefix("last", dead_pid()) + "abc123")
    live = checkpoints / (temporary_prefix("best", os.getppid()) + "def456")
    for d in (dead, live):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x" * 100)
    with atomic_directory(checkpoints / "last") as tmp:
        pass
    assert sorted(p.name for p in checkpoints.iterdir()) == sorted(["last", live.name])
    dead.mkdir()
    shutil.rmtree(checkpoints / "last")  # temporaries alone do not make the folder a run's: a fresh start is allowed
    RunDir(tmp_path / "run").start(TrainConfig(out_dir=str(tmp_path / "run")))
    assert not dead.exists() and live.exists()


def test_a_directory_in_a_users_folder_is_replaced_without_touching_its_siblings(tmp_path):
    """user_folder: the user's own "mlm.old" and a dead writer's temporary beside "mlm" stay; "mlm" is replaced
    whole; nothing of the write is left beside it; an error inside the block leaves the previous "mlm" as it was."""
    mine = [tmp_path / "mlm.old", tmp_path / (temporary_prefix("mlm", dead_pid()) + "abc123")]
    for d in mine:
        d.mkdir()
        (d / "keep.txt").write_text("the user's")
    (tmp_path / "mlm").mkdir()
    (tmp_path / "mlm" / "old.txt").write_text("previous")
    with atomic_directory(tmp_path / "mlm", user_folder=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in (tmp_path / "mlm").iterdir()] == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["mlm", *(d.name for d in mine)])
    assert all((d / "keep.txt").read_text() == "the user's" for d in mine)
    with pytest.raises(RuntimeError), atomic_directory(tmp_path / "mlm", user_folder=True) as tmp:
        (tmp / "half.txt").write_text("half")
        raise RuntimeError
    assert [p.name for p in (tmp_path / "mlm").iterdir()] == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["mlm", *(d.name for d in mine)])


def test_a_full_disk_while_writing_tensors_is_reported_as_a_full_disk(tmp_path, monkeypatch):
    """safetensors reports a failed write as a SafetensorError, not an OSError: it must still read "disk full
    writing <file>", not "truncated or corrupted: use another checkpoint" (what a full disk printed before)."""
    import torch
    from safetensors import SafetensorError

    from tasks.cli import describe

    def full(tensors, filename, metadata=None):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(storage, "save_file", full)
    path = tmp_path / "model.safetensors"
    with pytest.raises(OSError) as exc:
        storage.save_tensors(path, {"w": torch.zeros(2)})
    assert exc.value.errno == errno.ENOSPC and exc.value.filename == str(path)
    assert describe(exc.value).startswith(f"disk full writing {path}: free space")


def test_a_full_disk_while_copying_names_the_copy_not_its_source(tmp_path, monkeypatch):
    """shutil's copy reports a full disk with the file it read as ``filename`` and the one it wrote as
    ``filename2``: copying ``last`` to ``best`` on a full disk printed "disk full writing .../last/...", as if the
    intact ``last`` were the file that failed."""
    from tasks.cli import describe

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    src = tmp_path / "checkpoints" / "last"
    (src / "encoder").mkdir(parents=True)
    (src / "encoder" / "model.safetensors").write_bytes(b"x" * 64)
    monkeypatch.setattr(os, "sendfile", full)
    monkeypatch.setattr(os, "copy_file_range", full, raising=False)  # shutil's first try from Python 3.14
    with pytest.raises(OSError) as exc:
        storage.copy_directory(src, tmp_path / "checkpoints" / "best")
    line = describe(exc.value)
    assert line.startswith("disk full writing ") and str(src) not in line, line
    assert line.split(" writing ")[1].startswith(str(tmp_path / "checkpoints")) and "model.safetensors" in line, line
    assert not (tmp_path / "checkpoints" / "best").exists() and (src / "encoder" / "model.safetensors").is_file()


def test_write_json_refuses_a_non_finite_value_without_writing_a_byte(tmp_path):
    """A non-finite value (`--lr inf`) is refused before a byte is written: the file keeps its old content rather
    than the fields json.dump would write before reaching it."""
    path = tmp_path / "config.json"
    path.write_text('{"kept": 1}\n')
    with pytest.raises(ValueError, match="not JSON compliant"):
        storage.write_json(path, {"a": 1.0, "lr": float("inf")})
    assert path.read_text() == '{"kept": 1}\n'
