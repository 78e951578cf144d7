"""Whose an output directory is: a training run, an ensemble, an MLM checkpoint, or predictions.

Every command that writes a directory marks it (``owner.json``: ``{"kind": ...}``)
and, before it writes anything, refuses a directory of another kind unless
``--overwrite``: pretraining into a training run would replace the run, an
ensemble into a run would overwrite its predictions, a training run into an MLM
checkpoint would overwrite the config.json that ``--pretrained`` reads. With
``--overwrite`` the old directory is moved aside and deleted only once the new
output is complete, or put back when the command fails (``replacing``; the
training run does the same with its files, tasks/training/rundir.py).
Directories written before the marker existed are recognized by their files.

Usage:
    check_kind(Path("runs/ens"), ENSEMBLE)     # FileExistsError naming the kind it holds and what to do
    with replacing(Path("runs/ens"), ENSEMBLE, overwrite=True):   # an old output of another kind moved aside
        ...write...; mark(Path("runs/ens"), ENSEMBLE)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

OWNER_FILE = "owner.json"

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


def check_kind(path: Path, kind: str, flag: str = "--out-dir", overwrite: bool = False) -> str | None:
    """Refuse ``path`` when it holds an output of another kind than ``kind``, unless ``overwrite``: a
    FileExistsError in one line saying what it holds, which command wrote it, and what to do. Returns the kind
    it holds (None: nothing of ours)."""
    held = kind_of(path)
    if held is not None and held != kind and not overwrite:
        raise FileExistsError(f"{flag} {path} holds {NAMES[held]} (written by {COMMANDS[held]}), not {NAMES[kind]}: "
                              f"pick another {flag}, or pass --overwrite to replace it")
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

