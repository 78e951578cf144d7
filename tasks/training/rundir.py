"""The run directory (what it holds: README "Training"), and the lock that keeps it one run's.

A fresh run refuses a folder holding an earlier run's results unless
``--overwrite``, which moves the old run aside and deletes it only once the
new run has written its first checkpoint (or puts it back when the new run
fails before). ``run.lock`` (pid and host) refuses a second live run on the
same directory and is taken over from a dead owner. On resume, a ``best``
left stale by a crash between saving ``last`` and copying it to ``best`` is repaired
(tasks.checkpoint ``repair_best``). Only the main process writes.

Usage:
    run_dir = RunDir("runs/try")
    run_dir.start(cfg)                 # lock, refuse or move aside an earlier run
    run_dir.record(cfg, reports)       # config.json, owner.json, data.json: the data are read and checked
    run_dir.append(record)             # one metrics.jsonl record
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import os
import shutil
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tasks.logs import LogFile, open_log, size_text
from tasks.outdir import OWNER_FILE, RUN, check_kind, check_writable_dir, mark, process_alive, release_lock, take_lock
from tasks.training import distributed
from tasks.checkpoint import ResumePoint, keep_model_only, repair_best
from tasks.storage import OLD_SUFFIX, copy_directory, disk_use, remove_stale_temporaries, write_json

logger = logging.getLogger(__name__)


def check_out_dir(path: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse, before a run reads anything, an --out-dir it may not write (FileExistsError / OSError naming it):
    not a writable directory; written by a live process; another command's output (unless ``overwrite``); a
    fresh run's earlier results (unless ``overwrite``: a resume continues them)."""
    check_writable_dir(path, "--out-dir")
    check_kind(path, RUN, overwrite=overwrite and not resume)
    if resume or overwrite:
        return
    results = [p for p in (path / "checkpoints", path / "metrics.jsonl", path / "predictions") if _holds_results(p)]
    if results:
        raise FileExistsError(f"{results[0]} holds an earlier run: resume it (--resume), pick another --out-dir, or "
                              "pass --overwrite to replace it")


RUN_FILES = ("checkpoints", "metrics.jsonl", "predictions", "config.json", "data.json", "training.png", "tensorboard")


def _holds_results(path: Path) -> bool:
    """A non-empty file, or a folder with an entry that is not a hidden temporary."""
    if path.is_dir():
        return any(not p.name.startswith(".") for p in path.iterdir())
    return path.is_file() and path.stat().st_size > 0


class RunDir:
    """A run directory (the module docstring). Only the main process writes.

    ``start`` locks it (``run.lock``: pid and host of the owner) until ``close``.
    ``--overwrite`` moves the previous run's files into ``.replaced-<time>-<pid>/``;
    ``checkpoint_written`` deletes them once the new run has its first
    checkpoint, and ``close(error)`` before that puts them back.
    """

    def __init__(self, path: str | os.PathLike, writer: bool = True) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.metrics = self.path / "metrics.jsonl"
        self.lock = self.path / "run.lock"
        self.writer = writer
        self.replaced: Path | None = None
        self.log = LogFile()  # train.log: the command's (tasks.logs.log_to), or this run's own from Python

    def start(self, cfg: Any, *, resume: ResumePoint | None = None, overwrite: bool = False) -> None:
        """Lock the directory; a fresh run refuses an earlier run's files (or another command's output) unless
        ``overwrite``; the log opens. Nothing the run says about itself is written before ``record``.

        A resume from ``resume`` (its checkpoint) first repairs ``best`` when a crash
        came between writing that checkpoint and copying it to best (``repair_best``).
        Under torchrun rank 0 checks and locks; every rank raises, or none.
        """
        error: OSError | None = None
        if self.writer:
            try:
                self._prepare(resume, overwrite)
            except OSError as e:
                error = e
        message = distributed.broadcast_from_main(None if error is None else str(error))
        if error is not None:
            raise error
        if message is not None:
            raise FileExistsError(message)
        if self.writer:
            self.log = open_log(self.path)

    def _prepare(self, resume: ResumePoint | None, overwrite: bool) -> None:
        held = check_kind(self.path, RUN, overwrite=overwrite and resume is None)
        self.path.mkdir(parents=True, exist_ok=True)
        take_lock(self.lock, f"run directory {self.path}")
        atexit.register(release_lock, self.lock)
        try:
            remove_stale_temporaries(self.checkpoints, keep=resume.checkpoint if resume is not None else None)
            for aside in self.path.glob(".replaced-*-*"):
                pid = aside.name.rsplit("-", 1)[1]
                if pid.isdigit() and not process_alive(int(pid), socket.gethostname()):
                    logger.warning("%s holds a run that an --overwrite killed before its first checkpoint moved "
                                   "aside: move its files back into %s, or delete it", aside, self.path)
            if resume is not None:
                repair_best(resume, self.checkpoints / "best")
                return
            results = [p for p in (self.checkpoints, self.metrics, self.path / "predictions") if _holds_results(p)]
            if held not in (None, RUN):  # another command's output, replaced whole (check_kind: --overwrite)
                present = [p for p in self.path.iterdir() if p != self.lock and not p.name.startswith(".")]
            else:
                present = [self.path / n for n in (*RUN_FILES, OWNER_FILE) if (self.path / n).exists()]
            if overwrite and (results or held not in (None, RUN)):
                self.replaced = self.path / f".replaced-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
                self.replaced.mkdir()
                for p in present:
                    os.replace(p, self.replaced / p.name)
                logger.info("--overwrite: the previous run waits in %s until this one writes its first checkpoint",
                            self.replaced)
            else:
                self.metrics.unlink(missing_ok=True)  # an empty file of a run that never finished an epoch
        except BaseException:
            release_lock(self.lock)
            raise

    def record(self, cfg: Any, data: dict[str, dict] | None) -> None:
        """Once the run's data are read and checked: config.json, owner.json, and data.json
        (``{"files": {"<task> <split>": ReadReport.to_dict()}}`` of the files this process read)."""
        if self.writer:
            write_json(self.path / "config.json", cfg.to_dict())
            mark(self.path, RUN)
            if data is not None:
                write_json(self.path / "data.json", {"files": data})

    def checkpoint_written(self) -> None:
        """The new run has its first checkpoint: the run that --overwrite moved aside is deleted."""
        if self.replaced is not None:
            shutil.rmtree(self.replaced, ignore_errors=True)
            logger.info("--overwrite: the previous run (%s) is deleted", self.replaced)
            self.replaced = None

    def close(self, error: BaseException | None = None) -> None:
        """Release the lock; a run that failed (``error``) before its first checkpoint puts an overwritten run back.
        A run started from Python closes its train.log, the ``error`` its last line."""
        if not self.writer:
            return
        failed = error is not None
        if failed and self.replaced is not None:
            for name in (*RUN_FILES, OWNER_FILE):
                new = self.path / name
                if new.is_dir():
                    shutil.rmtree(new)
                else:
                    new.unlink(missing_ok=True)
            for p in self.replaced.iterdir():
                os.replace(p, self.path / p.name)
            self.replaced.rmdir()
            logger.warning("the new run failed before its first checkpoint: the previous run is back in %s",
                           self.path)
            self.replaced = None
        release_lock(self.lock)
        self.log.close(error)

    def keep_model_only(self) -> int:
        """--save-only-model, once the run is done: ``last`` (and a ``last.old``) deleted, the optimizer state of
        every other checkpoint too (tasks.checkpoint.keep_model_only). Returns the bytes freed."""
        freed = 0
        for name in ("last", "last" + OLD_SUFFIX):
            if (self.checkpoints / name).is_dir():
                freed += disk_use(self.checkpoints / name)
                shutil.rmtree(self.checkpoints / name)
        for ckpt in sorted(p for p in self.checkpoints.iterdir() if p.is_dir() and (p / "state.json").is_file()):
            freed += keep_model_only(ckpt)
        return freed

    def disk_line(self) -> str:
        """What the run holds on disk, for its last lines: the whole directory and each checkpoint."""
        parts = [f"{p.relative_to(self.path)} {size_text(disk_use(p))}" for p in sorted(self.checkpoints.iterdir())
                 if p.is_dir()] if self.checkpoints.is_dir() else []
        return f"{self.path} holds {size_text(disk_use(self.path))}" + (f" ({', '.join(parts)})" if parts else "")

    def keep_best(self) -> None:
        """The epoch just saved as ``last`` improved the dev score: ``best`` becomes a copy of it."""
        copy_directory(self.checkpoints / "last", self.checkpoints / "best")

    def append(self, record: dict) -> None:
        """One record more in metrics.jsonl."""
        if self.writer:
            with open(self.metrics, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, allow_nan=False) + "\n")

    def rewrite(self, records: Sequence[dict]) -> None:
        """metrics.jsonl holding exactly ``records``: a resumed run drops the records after its checkpoint."""
        if self.writer:
            with open(self.metrics, "w", encoding="utf-8") as f:
                for record in records:
                    f.write(json.dumps(record, allow_nan=False) + "\n")
