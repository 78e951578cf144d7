"""The log of every command: one format, the console and the command's log file, its failure as its last line.

A command calls ``log_to()`` first: INFO lines go to stderr and are held
(``PendingLog``) until the command knows its output directory, where
``open_log`` writes them, and every later line, to its log file (``train.log`` of
a run). A command refused before its directory is its own writes nothing there.
Under torchrun only rank 0 logs; the other ranks print warnings and errors,
marked with their rank.

Usage:
    log_to()                          # first thing in a command
    ...
    open_log(Path("runs/x"))          # the pending lines and every later one into runs/x/train.log
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path

from tasks.runtime import torchrun_env


class Stderr(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when a record comes (a redirection made after the handler,
    pytest's capture), never to a stream that has been closed since."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class PendingLog(logging.handlers.MemoryHandler):
    """The command's log records, held until its run directory is its own (``open_log``), then written to
    ``train.log`` with every later one: a command refused at the directory writes nothing into it, and what it
    logged before (argument warnings, malloc) is in the file too."""

    def __init__(self) -> None:
        super().__init__(capacity=2**31, flushLevel=logging.CRITICAL + 1)

    def shouldFlush(self, record: logging.LogRecord) -> bool:
        return self.target is not None


def log_to(console: bool = True) -> None:
    """INFO lines to stderr (with ``console``) and to a ``PendingLog`` for train.log (replacing the handlers of an
    earlier call). Under torchrun only rank 0 does this; the other ranks print warnings and errors to stderr,
    marked with their rank."""
    rank = torchrun_env()[0]
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_train_multitask", False)]:
        root.removeHandler(handler)
        handler.close()
    if rank > 0:
        handler = Stderr()
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname).1s [rank {rank}] %(name)s: %(message)s",
                                               datefmt="%H:%M:%S"))
        handler._train_multitask = True
        root.setLevel(logging.WARNING)
        root.addHandler(handler)
        return
    root.setLevel(logging.INFO)
    handlers = [Stderr()] if console else []
    for handler in [*handlers, PendingLog()]:
        handler.setFormatter(LOG_FORMAT)
        handler._train_multitask = True
        root.addHandler(handler)


LOG_FORMAT = logging.Formatter("%(asctime)s %(levelname).1s %(name)s: %(message)s", datefmt="%H:%M:%S")


def open_log(out_dir: Path) -> None:
    """Write the pending log records (``log_to``) to ``<out_dir>/train.log``, and every later record; nothing
    where no ``log_to`` is pending (a run started from Python logs as its caller set up)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, PendingLog) and handler.target is None:
            file = logging.FileHandler(out_dir / "train.log", encoding="utf-8")
            file.setFormatter(LOG_FORMAT)
            handler.setTarget(file)
            handler.flush()
