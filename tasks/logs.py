"""The log of every command: one format, the console and the command's log file, its failure as its last line.

A command calls ``log_to()`` first: INFO lines go to stderr and are held
(``PendingLog``) until the command knows its output directory, where
``open_log`` writes them, and every later line, to its log file (``train.log`` of
a run, ``pretrain.log``, ``ensemble.log``). A command refused before its
directory is its own writes nothing there. The error that ends a command is the
last line of its log file (``log_failure``, called by ``tasks.cli.user_errors``).
Under torchrun only rank 0 logs; the other ranks print warnings and errors,
marked with their rank.

Training or evaluating from Python (``tasks.training.run.run``,
``evaluate_checkpoint``) logs where the command would: with no ``log_to``
pending, ``open_log`` adds a file handler for the run's duration (the package's
INFO lines included, whatever the root logger's level) and its ``close`` writes
the error that ended the run, if one did; what a run logged before its
directory existed (reading its data) is held (``held_records``) and written
into the file when it opens (``LogFile.replay``); the console shows what the
caller's own logging configuration lets through.

Usage:
    log_to()                                   # first thing in a command
    ...
    log = open_log(Path("runs/x"))             # the pending lines and every later one into runs/x/train.log
    ...
    log.close()                                # run() from Python: the file handler goes
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import sys
from collections.abc import Iterator
from pathlib import Path

from tasks.runtime import torchrun_env


FILE_ONLY = "file_only"  # a record's attribute: for the log file alone (the console printed it its own way)
PACKAGES = ("tasks", "minbert")  # the loggers whose INFO lines a run's log file holds


class Stderr(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when a record comes (a redirection made after the handler,
    pytest's capture), never to a stream that has been closed since; a record marked ``FILE_ONLY`` is not
    printed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, FILE_ONLY, False) and super().filter(record)

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


def log_to() -> None:
    """INFO lines to stderr and to a ``PendingLog`` for train.log (replacing the handlers of an
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
    for handler in [Stderr(), PendingLog()]:
        handler.setFormatter(LOG_FORMAT)
        handler._train_multitask = True
        root.addHandler(handler)


def score_text(score: float | None) -> str:
    """A score as the log prints it: 4 digits, "undefined" where there is none (a constant STS prediction)."""
    return "undefined" if score is None or score != score else f"{score:.4f}"


def size_text(size: int) -> str:
    """Bytes as the log prints them: ``713 MB``, ``1.4 GB``, ``12 kB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}" if unit == "GB" else f"{size / scale:.0f} {unit}"
    return f"{size} B"


LOG_FORMAT = logging.Formatter("%(asctime)s %(levelname).1s %(name)s: %(message)s", datefmt="%H:%M:%S")


class LogFile:
    """A log file ``open_log`` opened: for a command, its pending lines' target (the command's process owns it);
    from Python, handlers of its own, removed by ``close``, which first writes the error that ended the run."""

    def __init__(self, handlers: list[logging.Handler] | None = None, levels: dict[str, int] | None = None) -> None:
        self.handlers, self.levels = list(handlers or []), dict(levels or {})

    def close(self, error: BaseException | None = None) -> None:
        if error is not None and self.handlers:
            log_failure(f"failed: {failure_text(error)}")
        for handler in self.handlers:
            logging.getLogger().removeHandler(handler)
            handler.close()
        self.handlers = []
        for name, level in self.levels.items():
            logging.getLogger(name).setLevel(level)
        self.levels = {}

    def replay(self, records: list[logging.LogRecord]) -> None:
        """Write ``records``, logged before this file existed (``held_records``), into it: a run from Python reads
        its data before its run directory is made. A command's file took its pending records already."""
        for handler in self.handlers:
            if isinstance(handler, logging.FileHandler):
                for record in records:
                    if record.levelno >= handler.level:
                        handler.handle(record)

    def __enter__(self) -> "LogFile":
        return self

    def __exit__(self, kind, error, tb) -> None:
        self.close(None if isinstance(error, (SystemExit, GeneratorExit)) else error)


def open_log(out_dir: Path, name: str = "train.log") -> LogFile:
    """Write the pending log records (``log_to``) to ``<out_dir>/<name>``, and every later record. Where no
    ``log_to`` is pending (a run started from Python, or one of a command's several runs), a file handler of its
    own takes this package's records
    (INFO and up) and every warning until the returned ``LogFile`` is closed; where the root logger has no
    handler, warnings keep reaching stderr as they would without it (Python's last resort)."""
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler, PendingLog) and handler.target is None:
            handler.setTarget(_file_handler(out_dir / name))
            handler.flush()
            return LogFile()
    levels = {}
    for package in PACKAGES:
        logger = logging.getLogger(package)
        if logger.getEffectiveLevel() > logging.INFO:
            levels[package] = logger.level
            logger.setLevel(logging.INFO)
    file = _file_handler(out_dir / name)
    file.addFilter(lambda record: record.name.split(".")[0] in PACKAGES or record.levelno >= logging.WARNING)
    handlers: list[logging.Handler] = [file]
    if not root.handlers:
        console = Stderr()
        console.setLevel(logging.WARNING)
        console.setFormatter(LOG_FORMAT)
        handlers.append(console)
    for handler in handlers:
        root.addHandler(handler)
    return LogFile(handlers, levels)


class _Held(logging.Handler):
    """``held_records``' handler: keeps what a run's log file takes (the package's records, every warning); in a
    process with no logging set up, prints the warnings as Python's last resort would (it is not used while a
    handler exists)."""

    def __init__(self, bare: bool) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.bare = bare

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.split(".")[0] in PACKAGES or record.levelno >= logging.WARNING:
            self.records.append(record)
        if self.bare and record.levelno >= logging.lastResort.level:
            logging.lastResort.handle(record)


@contextlib.contextmanager
def held_records() -> Iterator[list[logging.LogRecord]]:
    """The records a run's log file will take (``LogFile.replay``), logged in the block before that file exists,
    at the levels ``open_log`` gives the package (the caller's loggers as they were after); nothing where a
    command's ``log_to`` holds its records already (its PendingLog), or under torchrun on a rank other than 0
    (which writes no log file)."""
    root = logging.getLogger()
    if torchrun_env()[0] > 0 or any(isinstance(h, PendingLog) and h.target is None for h in root.handlers):
        yield []
        return
    levels = {}
    for package in PACKAGES:
        logger = logging.getLogger(package)
        if logger.getEffectiveLevel() > logging.INFO:
            levels[package] = logger.level
            logger.setLevel(logging.INFO)
    held = _Held(bare=not root.handlers)
    root.addHandler(held)
    try:
        yield held.records
    finally:
        root.removeHandler(held)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _file_handler(path: Path) -> logging.FileHandler:
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(LOG_FORMAT)
    return handler


def log_failure(text: str) -> None:
    """The error that ends a command or a run, as the last line of its log file (the console prints it as the
    one-line error of ``tasks.cli.user_errors``, or the traceback). A command that keeps no log has no handler
    to take it, and Python's last resort would print it to the console a second time."""
    logger = logging.getLogger("tasks")
    if logger.hasHandlers():
        logger.error(text, extra={FILE_ONLY: True})


def failure_text(error: BaseException) -> str:
    """One line for an error that ends a command: its type and message."""
    if isinstance(error, KeyboardInterrupt):
        return "interrupted (KeyboardInterrupt)"
    return " ".join(f"{type(error).__name__}: {error}".split())


def count(n: int, noun: str) -> str:
    """``1 thread``, ``2 threads``: a number with its noun, for log lines."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
