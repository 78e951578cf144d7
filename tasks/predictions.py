"""The Predictions container and the files it is written to (leaderboard predictions and raw logits), and the
logits of several runs read together (an ensemble's members, distillation's teachers).

``Predictions`` holds a model's outputs on a dataset in dataset order (row i is
``dataset.ids[i]``), as tasks.evaluation.evaluator makes them. Leaderboard
files (``predictions/{sst,para,sts}-{dev,test}-output.csv``) hold one row per
input id in input order, in the CS224N starter's format; raw logits go beside
them (``{task}-{split}-logits.csv``) for ensembling and distillation. Every
writer is atomic (tasks.storage.write_text); every reader names the file and
line of a malformed row. ``load_task_logits`` reads and aligns several runs'
logits of one task and split by id.

Usage:
    preds = Predictions(ids, logits, logits.argmax(-1))          # SST: (N, 5) logits, (N,) classes
    write_predictions("predictions", "sst", "dev", preds)         # predictions/sst-dev-output.csv
    write_logits("predictions", "sst", "dev", preds)              # predictions/sst-dev-logits.csv
    ids, logits = read_logits("predictions/sst-dev-logits.csv")   # (N, 5)
    ids, classes = read_predictions("predictions/sst-dev-output.csv")
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from tasks.data.readers import csv_records
from tasks.storage import write_text
from tasks.config_versions import upgrade
from tasks.task import PACKAGE, Task, Tasks, get_task

SPLITS = ("train", "dev", "test")  # train: soft targets for distillation


@dataclass
class Predictions:
    """A model's outputs on a dataset, in dataset order, on CPU.

    ids: the dataset's example ids. logits: float32, as the task's kind gives them: a sentence
    classification's (N, C) class logits (SST: C = 5), a pair classification's (N,) logit, a pair
    regression's (N,) predicted score. preds: class ids (N,) long, or (N,) float32 scores.
    """

    ids: list[str]
    logits: torch.Tensor
    preds: torch.Tensor

    def __post_init__(self) -> None:
        if not (len(self.ids) == self.logits.shape[0] == self.preds.shape[0]):
            raise ValueError(f"Predictions: {len(self.ids)} ids, {self.logits.shape[0]} logits rows, "
                             f"{self.preds.shape[0]} preds; they must match")

    def __len__(self) -> int:
        return len(self.ids)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; splits are {list(SPLITS)}")


def _atomic_write_csv(path: Path, header: list[str], rows: Iterable[list]) -> Path:
    """Write a comma-separated file through a temporary file in the same folder, then os.replace."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return _atomic_write_text(path, buf.getvalue())


def _check_finite(what: str, values: torch.Tensor) -> None:
    bad = (~torch.isfinite(values.float())).nonzero()
    if bad.numel():
        raise ValueError(f"{what}: {bad.shape[0]} non-finite values (first at row {int(bad[0, 0])})")


def write_predictions(pred_dir: str | os.PathLike[str], task: str | Task, split: str, preds: Predictions) -> Path:
    """Write the leaderboard file ``pred_dir/{task}-{split}-output.csv`` of ``task`` (its entry, or the name of one
    this package declares) and return its path.

    For the course's tasks byte for byte the CS224N starter's format (multitask_classifier.py, classifier.py),
    for which the leaderboard was built: a header ``id \t Predicted_Sentiment \n``
    (the task's ``output.column``: ``Predicted_Is_Paraphrase``; for STS the starter's spelling
    ``Predicted_Similiary``), then one row ``<id> , <value> \n`` per id in
    ``preds`` order; class ids (SST 0-4, paraphrase 0/1), or float scores
    (full precision). Any other task's is a plain CSV, ``id,label`` with each prediction as the task's files write
    its labels (RTE: entailment / not_entailment), or ``id,score``. ``read_predictions`` reads both back.
    """
    entry = get_task(task)
    return _write_output(Path(pred_dir) / f"{entry.name}-{split}-output.csv", entry, split, preds)


def part1_name(task: str, split: str, frozen: bool) -> str:
    """The minBERT starter part 1's name of a task's predictions (classifier.py's ``--option``):
    ``{pretrain|finetune}-{task}-{split}-out.csv``; pretrain is its frozen encoder."""
    return f"{'pretrain' if frozen else 'finetune'}-{task}-{split}-out.csv"


def write_part1(pred_dir: str | os.PathLike[str], task: str | Task, split: str, preds: Predictions,
                frozen: bool) -> Path:
    """The starter part 1's file of ``preds`` (``part1_name``), in the leaderboard files' format."""
    entry = get_task(task)
    return _write_output(Path(pred_dir) / part1_name(entry.name, split, frozen), entry, split, preds)


def _write_output(path: Path, entry: Task, split: str, preds: Predictions) -> Path:
    task = entry.name
    _check_split(split)
    p = preds.preds.detach().cpu().reshape(-1)
    if p.shape[0] != len(preds.ids):
        raise ValueError(f"{task}: {len(preds.ids)} ids but {p.shape[0]} predictions")
    if entry.classes is None:
        _check_finite(f"{task}-{split} predictions", p)
        values = [float(v) for v in p.double().tolist()]
    else:
        if p.is_floating_point() and not torch.equal(p, p.round()):
            raise ValueError(f"{task}-{split} predictions must be class ids, got non-integer values")
        values = [int(v) for v in p.long().tolist()]
        top = entry.num_classes
        bad = [v for v in values if not 0 <= v < top]
        if bad:
            raise ValueError(f"{task}-{split} predictions must be in 0..{top - 1}, got {bad[0]} ({len(bad)} rows)")
    if entry.output.starter:
        lines = [f"id \t {entry.output.column} \n"] + [f"{i} , {v} \n" for i, v in zip(preds.ids, values)]
        return _atomic_write_text(path, "".join(lines))
    # a user's task: a plain CSV of each id and its prediction in the task's own labels
    labels = values if entry.classes is None else [entry.label_name(v) for v in values]
    return _atomic_write_csv(path, ["id", entry.output.column], ([i, v] for i, v in zip(preds.ids, labels)))


def _atomic_write_text(path: Path, text: str) -> Path:
    """Write ``text`` whole or not at all (tasks.storage.write_text); returns ``path``."""
    write_text(path, text)
    return path


def write_logits(pred_dir: str | os.PathLike[str], task: str | Task, split: str, preds: Predictions) -> Path:
    """Write the raw outputs of ``task`` (its entry, or the name of one this package declares) to
    ``pred_dir/{task}-{split}-logits.csv`` and return its path.

    Header id,logit_0..logit_{C-1} (class logits: SST's five) / id,logit (a pair classification's logit)
    / id,score (a pair regression's score): the kind's ``logit_columns``. Values are written with Python's
    shortest round-trip repr, so ``read_logits`` gives back the same float32s.
    """
    entry = get_task(task)
    task = entry.name
    _check_split(split)
    columns = entry.kind.logit_columns(entry)
    logits = preds.logits.detach().cpu().float()
    want = entry.kind.logits_shape(entry, len(preds.ids))
    if tuple(logits.shape) != want:
        raise ValueError(f"{task}: logits have shape {tuple(logits.shape)}, expected {want}")
    _check_finite(f"{task}-{split} logits", logits)
    rows2d = logits.reshape(len(preds.ids), len(columns)).double().tolist()  # (N, K)
    path = Path(pred_dir) / f"{task}-{split}-logits.csv"
    return _atomic_write_csv(path, ["id", *columns], ([i, *map(float, r)] for i, r in zip(preds.ids, rows2d)))


def _read_id_value_csv(path: str | os.PathLike[str], parse_header: Callable[[list[str]], str | None],
                       parse_value: Callable[[str], float | int]) -> tuple[list[str], list[list]]:
    """Shared reader: header check, then rows of id + values; errors name the file and the 1-based line."""
    path = Path(path)
    ids: list[str] = []
    values: list[list] = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise ValueError(f"{path}: the file is empty; expected a header row") from None
        except csv.Error as e:
            raise ValueError(f"{path}: line 1: unparseable CSV ({e})") from None
        if len(header) == 1 and "\t" in header[0]:  # the CS224N starter: "id \t Predicted_X ", rows "<id> , <v> "
            header = [h.strip() for h in header[0].split("\t")]
        problem = parse_header(header)
        if problem:
            raise ValueError(f"{path}: line 1: {problem}")
        for line, row, error, _ in csv_records(reader):
            if error is not None:
                raise ValueError(f"{path}: line {line}: unparseable CSV ({error})")
            if not row:
                continue  # a blank line holds no row (an editor's trailing newline)
            if len(row) != len(header):
                raise ValueError(f"{path}: line {line}: expected {len(header)} fields ({','.join(header)}), "
                                 f"found {len(row)}: {row!r}")
            if not row[0].strip():
                raise ValueError(f"{path}: line {line}: empty id")
            parsed = []
            for name, raw in zip(header[1:], row[1:]):
                try:
                    parsed.append(parse_value(raw.strip()))
                except ValueError as e:
                    raise ValueError(f"{path}: line {line}: column {name}: {e}") from None
            ids.append(row[0].strip())
            values.append(parsed)
    return ids, values


def _finite_float(raw: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not a number") from None
    if not math.isfinite(v):
        raise ValueError(f"{raw!r} is not finite")
    return v


def read_logits(path: str | os.PathLike[str]) -> tuple[list[str], torch.Tensor]:
    """Inverse of ``write_logits``: (ids, float32 logits (N, K) for id,logit_0..logit_{K-1}, else (N,)).

    A malformed row (wrong field count, empty id, a value that is not a finite
    number) raises ValueError naming the file and its line.
    """
    kind: dict[str, int] = {}  # "width": K for a (N, K) file, 0 for a (N,) file

    def parse_header(header: list[str]) -> str | None:
        cols = header[1:]
        if header[:1] == ["id"] and cols in (["logit"], ["score"]):
            kind["width"] = 0
            return None
        if header[:1] == ["id"] and cols and cols == [f"logit_{k}" for k in range(len(cols))]:
            kind["width"] = len(cols)
            return None
        return f"header {header} is not id,logit_0..logit_K / id,logit / id,score (a write_logits file)"

    ids, values = _read_id_value_csv(path, parse_header, _finite_float)
    logits = torch.tensor(values, dtype=torch.float32)
    if kind["width"]:
        return ids, logits.reshape(len(ids), kind["width"])  # (N, K)
    return ids, logits.reshape(len(ids))  # (N,)


def read_predictions(path: str | os.PathLike[str], task: str | None = None, tasks: Tasks | None = None
                     ) -> tuple[list[str], torch.Tensor]:
    """Inverse of ``write_predictions``: (ids, (N,) long class ids, or float32 scores).

    The task, one of ``tasks`` (a run's: TrainConfig.entries; default: the package's), is ``task``, else known by
    the file's column (the CS224N starter's files: header ``id \t Predicted_Sentiment `` (``Predicted_Is_Paraphrase``,
    ``Predicted_Similiary`` sic), rows ``<id> , <value> ``; tasks that share a column, SST and CFIMDB's
    ``Predicted_Sentiment``, are read as the first declared), else by the file's name (``{task}-{split}-output.csv``:
    another task's ``id,label`` file, its labels read back to class ids). A class id is checked against the task's
    classes.
    """
    tasks = tasks if tasks is not None else PACKAGE
    entries = list(tasks.values())
    column_task: dict[str, object] = {}
    for t in entries:  # a column two tasks share is read as the first declared's (SST before CFIMDB)
        for c in (t.output.column, t.output.also_read):
            if c and t.output.starter:
                column_task.setdefault(c, t)
    named = task or Path(path).name.rsplit("-", 2)[0]
    found: dict[str, object] = {}

    def parse_header(header: list[str]) -> str | None:
        if task is None and len(header) == 2 and header[0] == "id" and header[1] in column_task:
            found["task"] = column_task[header[1]]
            return None
        if named in tasks and header == ["id", tasks[named].output.column]:
            found["task"] = tasks[named]
            return None
        return f"header {header} is not id,<{'|'.join(column_task)}> (a write_predictions file)"

    def parse_value(raw: str) -> float | int:
        entry = found["task"]
        if entry.classes is not None and not entry.output.starter:
            problems: list[str] = []
            v = entry.parse_label(raw, problems)
            if problems:
                raise ValueError(problems[0])
            return v
        v = _finite_float(raw)  # accepts "3" and "3.0"
        if entry.classes is None:
            return v
        if v != int(v):
            raise ValueError(f"{raw!r} is not a class id")
        top = entry.num_classes
        if not 0 <= v < top:
            raise ValueError(f"{raw!r} is out of range 0..{top - 1}")
        return int(v)

    ids, values = _read_id_value_csv(path, parse_header, parse_value)
    dtype = found["task"].kind.pred_dtype()
    return ids, torch.tensor([v[0] for v in values], dtype=dtype)


# ---- the logits of several runs: an ensemble's members, distillation's teachers ----


def logits_path(run_dir: str | os.PathLike[str], task: str, split: str) -> Path:
    """``run_dir/{task}-{split}-logits.csv``, or under ``run_dir/predictions/`` when only that exists."""
    run_dir = Path(run_dir)
    name = f"{task}-{split}-logits.csv"
    direct = run_dir / name
    nested = run_dir / "predictions" / name
    if not direct.is_file() and nested.is_file():
        return nested
    return direct


def saved_run(run_dir: str | os.PathLike[str]) -> tuple[tuple[str, ...], list[Task]] | None:
    """(the tasks a training run was trained on, its own entries as it saved them: its task files' tasks, its
    GLUE tasks') of its ``config.json`` beside or above ``predictions/``; None for a folder of logits with no
    training config (an ensemble's output)."""
    run_dir = Path(run_dir)
    for folder in (run_dir, run_dir.parent) if run_dir.name == "predictions" else (run_dir,):
        config = folder / "config.json"
        if config.is_file():
            try:
                saved = upgrade(json.loads(config.read_text(encoding="utf-8")))
                tasks = saved["tasks"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{config}: no list of tasks in it ({e}); "
                                 "is it a training run's config.json?") from None
            own = [Task.from_dict(e) for e in (saved.get("user_tasks") or {}).values()]
            known = Tasks(own)
            if not isinstance(tasks, list) or not set(tasks) <= set(known):
                raise ValueError(f"{config}: 'tasks' is {tasks!r}, not a list of {', '.join(known)}")
            return tuple(tasks), own
    return None


def trained_tasks(run_dir: str | os.PathLike[str]) -> tuple[str, ...] | None:
    """The tasks a training run was trained on (its ``config.json``, beside or above ``predictions/``); None
    for a folder of logits with no training config (an ensemble's output): it is taken to have every task."""
    saved = saved_run(run_dir)
    return saved[0] if saved is not None else None


def task_members(trained: Sequence[tuple[str, ...] | None], task: str) -> list[int]:
    """Indices of the runs (their ``trained_tasks``) that are models of ``task``: its specialists and every
    run that is not one."""
    return [i for i, own in enumerate(trained) if own is None or task in own]


@dataclass
class TaskLogits:
    """All runs' outputs for one task and split, aligned to ``ids`` (the first run's order).

    logits[m]: float64, (N, C) class logits or (N,) (the kind's shape). files[m]: where run m's came from.
    """

    task: str
    split: str
    ids: list[str]
    logits: list[torch.Tensor]
    files: list[Path]


def load_task_logits(run_dirs: Sequence[str | os.PathLike[str]], task: str | Task, split: str) -> TaskLogits | None:
    """Read and align every run's ``{task}-{split}-logits.csv`` (``task``: its entry, or the name of one this
    package declares); None when no run has the file.

    A file missing from some runs only, a file with a repeated id, a wrong
    shape, or ids that differ from the first run's raise, naming the file.
    """
    entry = get_task(task)
    task = entry.name
    paths = [logits_path(d, task, split) for d in run_dirs]
    present = [p.is_file() for p in paths]
    if not any(present):
        return None
    if not all(present):
        missing = [str(p) for p, ok in zip(paths, present) if not ok]
        raise FileNotFoundError(f"{task}-{split}: {len(missing)} of {len(paths)} runs lack their logits file: "
                                f"{', '.join(missing)}; every run of an ensemble needs the same files (a run "
                                "trained on some tasks only is known by the config.json beside its predictions/)")
    ref_ids: list[str] | None = None
    aligned: list[torch.Tensor] = []
    for path in paths:
        ids, values = read_logits(path)
        want = entry.kind.logits_shape(entry, len(ids))
        if tuple(values.shape) != want:
            raise ValueError(f"{path}: logits of shape {tuple(values.shape)}; {task} needs {want}")
        position = {i: n for n, i in enumerate(ids)}
        if len(position) != len(ids):
            dup = next(i for n, i in enumerate(ids) if position[i] != n)
            raise ValueError(f"{path}: id {dup!r} appears more than once")
        if ref_ids is None:
            ref_ids, ref_path = ids, path
            aligned.append(values.double())
            continue
        if set(ids) != set(ref_ids):
            missing = [i for i in ref_ids if i not in position]
            extra = sorted(set(ids) - set(ref_ids))
            raise ValueError(
                f"{path}: its ids differ from {ref_path}'s: {len(missing)} missing (e.g. {missing[:3]}), "
                f"{len(extra)} extra (e.g. {extra[:3]}); were the runs made on the same data files?")
        order = torch.tensor([position[i] for i in ref_ids], dtype=torch.long)
        aligned.append(values.double()[order])
    return TaskLogits(task, split, list(ref_ids), aligned, paths)
