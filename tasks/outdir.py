"""Whose an output directory is: a training run, an ensemble, an MLM checkpoint, or predictions; and who is
writing it now (its lock).

Every command that writes a directory marks it (``owner.json``: ``{"kind": ...}``)
and, before it writes anything, refuses a directory of another kind unless
``--overwrite``: pretraining into a training run would replace the run, an
ensemble into a run would overwrite its predictions, a training run into an MLM
checkpoint would overwrite the config.json that ``--pretrained`` reads. With
``--overwrite`` the old directory is moved aside and deleted only once the new
output is complete, or put back when the command fails (``replacing``; the
training run does the same with its files, tasks/training/rundir.py).
Directories written before the marker existed are recognized by their files.

A directory being written is locked (``run.lock``: pid and host of the writer,
``take_lock``): a second live writer is refused, a dead writer's lock is taken
over. No command writes into, or moves aside, a directory a live process holds,
``--overwrite`` or not (``check_kind``, ``check_not_in_use``).

Usage:
    check_kind(Path("runs/ens"), ENSEMBLE)     # FileExistsError naming the kind it holds (or its live writer)
    with replacing(Path("runs/ens"), ENSEMBLE, overwrite=True):   # an old output of another kind moved aside
        ...write...; mark(Path("runs/ens"), ENSEMBLE)
    with locked(Path("runs/x")): ...           # run.lock held for the block
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

OWNER_FILE = "owner.json"
LOCK_FILE = "run.lock"

RUN = "training run"  # train_multitask.py: checkpoints/, metrics.jsonl, predictions/
ENSEMBLE = "ensemble"  # python -m tasks.ensemble: predictions/, ensemble.json, the submission zip
MLM = "MLM checkpoint"  # python -m tasks.pretrain: an HF BertForMaskedLM directory
PREDICTIONS = "predictions"  # train_multitask.py --eval-only into a directory of its own

COMMANDS = {RUN: "train_multitask.py", ENSEMBLE: "python -m tasks.ensemble", MLM: "python -m tasks.pretrain",
            PREDICTIONS: "train_multitask.py --eval-only"}
NAMES = {RUN: "a training run", ENSEMBLE: "an ensemble", MLM: "an MLM checkpoint",
         PREDICTIONS: "the predictions of a checkpoint"}


def kind_of(path: Path) -> str | None:
    """The kind of output ``path`` holds: its ``owner.json``, else what its files show; None when it is missing,
    empty or holds none of these outputs."""
    if not path.is_dir():
        return None
    try:
        kind = json.loads((path / OWNER_FILE).read_text(encoding="utf-8"))["kind"]
    except (OSError, ValueError, KeyError, TypeError):
        kind = None
    if kind in COMMANDS:
        return kind
    if (path / "checkpoints").is_dir() or (path / "metrics.jsonl").is_file():
        return RUN
    if (path / "ensemble.json").is_file():
        return ENSEMBLE
    if (path / "config.json").is_file() and any((path / w).is_file() for w in ("model.safetensors",
                                                                               "pytorch_model.bin")):
        return MLM
    if (path / "predictions").is_dir():
        return PREDICTIONS
    return None


def check_writable_dir(path: Path, flag: str) -> None:
    """``path`` is, or can be made, a writable directory (NotADirectoryError / PermissionError naming ``flag``)."""
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{flag} {path} is a file: pass a directory (it is created when missing)")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise NotADirectoryError(f"{flag} {path}: {existing} is a file, so the directory cannot be created")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"{flag} {path} is not writable ({existing} is not): fix its permissions or pick "
                              "another directory")


def check_kind(path: Path, kind: str, flag: str = "--out-dir", overwrite: bool = False,
               replaces: str = ", or pass --overwrite to replace it") -> str | None:
    """Refuse ``path`` when a live process other than this one is writing it (``check_not_in_use``), or when it
    holds an output of another kind than ``kind`` unless ``overwrite``: a FileExistsError in one line saying what
    it holds, which command wrote it, and what to do (``replaces``: how this command replaces it, or that it
    never does). Returns the kind it holds (None: nothing of ours)."""
    check_not_in_use(path, flag)
    held = kind_of(path)
    if held is not None and held != kind and not overwrite:
        raise FileExistsError(f"{flag} {path} holds {NAMES[held]} (written by {COMMANDS[held]}), not {NAMES[kind]}: "
                              f"pick another {flag}{replaces}")
    return held


def mark(path: Path, kind: str) -> None:
    """Write ``path``'s ``owner.json``: ``path`` holds an output of ``kind``."""
    (path / OWNER_FILE).write_text(json.dumps({"kind": kind, "written_by": COMMANDS[kind]}) + "\n",
                                   encoding="utf-8")


@contextlib.contextmanager
def replacing(path: Path, kind: str, flag: str = "--out-dir", overwrite: bool = False) -> Iterator[None]:
    """``check_kind``; when ``path`` holds another kind (and ``overwrite``), it is moved to a hidden sibling for
    the block, deleted when the block ends and put back when it raises."""
    held = check_kind(path, kind, flag, overwrite)
    if held is None or held == kind:
        yield
        return
    aside = path.with_name(f".{path.name}.replaced-{os.getpid()}")
    os.replace(path, aside)
    try:
        yield
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        os.replace(aside, path)
        raise
    shutil.rmtree(aside)



# ---- the lock: who is writing a directory now ----


def process_alive(pid: int, host: str) -> bool:
    """Whether process ``pid`` on ``host`` may be running (another host's processes cannot be checked: yes)."""
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def lock_owner(lock: Path) -> dict | None:
    """{"pid", "host"} of ``lock``'s owner; None when it cannot be read (gone, or garbled: stale)."""
    try:
        text = lock.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        owner = json.loads(text)
        return {"pid": int(owner["pid"]), "host": str(owner["host"])}
    except (ValueError, KeyError, TypeError):
        return {"pid": int(text), "host": socket.gethostname()} if text.strip().isdigit() else None  # bare pid


def _me() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _in_use(what: str, owner: dict, lock: Path, flag: str) -> FileExistsError:
    return FileExistsError(f"{what} is in use by process {owner['pid']} on {owner['host']} ({lock}): wait for it to "
                           f"finish or pick another {flag}; if that process is gone, delete {lock}")


def check_not_in_use(path: Path, flag: str = "--out-dir") -> None:
    """A FileExistsError naming the process when a live process other than this one holds ``path``'s lock."""
    lock = path / LOCK_FILE
    owner = lock_owner(lock)
    if owner is not None and owner != _me() and process_alive(owner["pid"], owner["host"]):
        raise _in_use(str(path), owner, lock, flag)


def take_lock(lock: Path, what: str, *, reentrant: bool = True, flag: str = "--out-dir") -> None:
    """Create ``lock`` naming this process (pid, host). A live owner is refused (FileExistsError, one line);
    a lock of a dead process is taken over with a warning; this process's own lock is kept when ``reentrant``
    (a Trainer built twice in one process, as tests and notebooks do), refused otherwise."""
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = lock_owner(lock)
            if owner == _me() and reentrant:
                return
            if owner is not None and process_alive(owner["pid"], owner["host"]):
                raise _in_use(what, owner, lock, flag) from None
            logger.warning("taking over %s left by %s (no longer running)", lock, owner or "an unreadable owner")
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(_me(), f)
        return
    raise FileExistsError(f"could not take {lock}: another process keeps creating it; pick another {flag}")


def release_lock(lock: Path) -> None:
    """Remove ``lock`` if this process owns it."""
    if lock_owner(lock) == _me():
        lock.unlink(missing_ok=True)


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """``directory``'s ``run.lock`` held for the block (refused while a live process holds it, ``take_lock``)."""
    lock = directory / LOCK_FILE
    take_lock(lock, f"{directory}")
    try:
        yield
    finally:
        release_lock(lock)
