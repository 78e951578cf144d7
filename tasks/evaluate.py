"""Metrics, model predictions over whole datasets, and leaderboard prediction files.

The three tasks are scored as the CS224N default project scores them: SST and
paraphrase by accuracy, STS by the Pearson correlation r between predicted and
gold similarity. The overall score is

    overall = (sst_acc + para_acc + (sts_r + 1) / 2) / 3

i.e. the mean of the per-task scores mapped to [0, 1] (r is in [-1, 1]). When
only some tasks are evaluated, ``overall_score`` is the mean over the tasks
present, so a one-task run still gets a comparable [0, 1] number.

Predictions are made in length-sorted batches (little padding, fast) and put
back in dataset order, so row i of ``Predictions`` is ``dataset.ids[i]``.
Leaderboard files (``predictions/{sst,para,sts}-{dev,test}-output.csv``) hold
one row per input id in input order; raw logits go beside them
(``{task}-{split}-logits.csv``) for ensembling and distillation. Every writer
is atomic (temporary file + ``os.replace``) and leaves the mode the umask gives
(0644 typically); every reader names the file and line of a malformed row.

Usage:
    metrics, preds = evaluate(model, {"sst": sst_dev, "para": para_dev, "sts": sts_dev}, device=device)
    metrics   # {"sst_acc": ..., "para_acc": ..., "sts_r": ..., "overall": ...}
    for task, p in preds.items():
        write_predictions("predictions", task, "dev", p)
        write_logits("predictions", task, "dev", p)
    ids, logits = read_logits("predictions/sst-dev-logits.csv")   # (N, 5)
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from tasks.data import length_bucketed_batches, move_batch
from tasks.model import PAIR_TASKS, TaskOutput
from tasks.readers import csv_records
from tasks.runtime import autocast

TASK_METRIC = {"sst": "sst_acc", "para": "para_acc", "sts": "sts_r"}
# Column after "id" in the leaderboard files (CS224N default project names).
# Column after "id" in the leaderboard files: the CS224N starter's names (STS sic: its spelling), which we write;
# plain "id,Predicted_*" CSV files with "Predicted_Similarity" are read too.
STARTER_COLUMN = {"sst": "Predicted_Sentiment", "para": "Predicted_Is_Paraphrase", "sts": "Predicted_Similiary"}
PREDICTION_COLUMN = {"sst": "Predicted_Sentiment", "para": "Predicted_Is_Paraphrase", "sts": "Predicted_Similarity"}
NUM_SST_CLASSES = 5
SPLITS = ("train", "dev", "test")  # train: soft targets for distillation


# ---- metrics ------------------------------------------------------------------------


def jsonable(metrics: dict[str, float]) -> dict[str, float | None]:
    """Non-finite values (an undefined Pearson r) become null: JSON has no NaN."""
    return {k: (float(v) if math.isfinite(v) else None) for k, v in metrics.items()}


def overall_score(metrics: dict) -> float:
    """Mean of the normalized task scores present in ``metrics``.

    sst_acc and para_acc count as they are; sts_r counts as (r + 1) / 2, so with
    all three tasks this is (sst_acc + para_acc + (sts_r + 1) / 2) / 3. Other
    keys (losses, "overall" itself) are ignored. Raises when no task metric is
    present; a nan metric makes the result nan (never silently dropped).
    """
    parts = []
    for name in TASK_METRIC.values():
        if name in metrics:
            value = float(metrics[name])
            parts.append((value + 1.0) / 2.0 if name == "sts_r" else value)
    if not parts:
        raise ValueError(f"no task metric in {sorted(metrics)}; expected some of {list(TASK_METRIC.values())}")
    return sum(parts) / len(parts)


def pearson_r(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two 1-D tensors, computed in float64.

    nan when either side has zero variance (r is undefined there), like scipy.
    """
    x = x.detach().reshape(-1).to("cpu", torch.float64)
    y = y.detach().reshape(-1).to("cpu", torch.float64)
    if x.numel() != y.numel():
        raise ValueError(f"pearson_r: {x.numel()} predictions but {y.numel()} labels")
    if x.numel() < 2:
        raise ValueError(f"pearson_r needs at least 2 values, got {x.numel()}")
    xc, yc = x - x.mean(), y - y.mean()
    denom = math.sqrt(float((xc * xc).sum()) * float((yc * yc).sum()))
    if denom == 0.0:
        return math.nan
    return max(-1.0, min(1.0, float((xc * yc).sum()) / denom))


def score(task: str, preds: torch.Tensor, labels: torch.Tensor) -> float:
    """The task's metric: accuracy for sst / para (class ids vs labels), Pearson r for sts."""
    _check_task(task)
    if preds.shape[0] != labels.shape[0]:
        raise ValueError(f"{task}: {preds.shape[0]} predictions but {labels.shape[0]} labels")
    if preds.shape[0] == 0:
        raise ValueError(f"{task}: cannot score an empty set")
    if task == "sts":
        return pearson_r(preds, labels)
    # Quora labels are floats 0.0 / 1.0; compare as class ids.
    return (preds.detach().cpu().long() == labels.detach().cpu().long()).double().mean().item()


# ---- predictions -------------------------------------------------------------------------


@dataclass
class Predictions:
    """A model's outputs on a dataset, in dataset order, on CPU.

    ids: the dataset's example ids. logits: float32, SST (N, 5) class logits,
    paraphrase (N,) logit, STS (N,) predicted score. preds: SST / paraphrase
    class ids (N,) long, STS (N,) float32 scores.
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


def _check_task(task: str) -> None:
    if task not in TASK_METRIC:
        raise ValueError(f"unknown task {task!r}; tasks are {list(TASK_METRIC)}")


def _predict_fn(model: nn.Module) -> Callable:
    """model.predict, also through a DistributedDataParallel wrapper (torch.compile forwards attributes)."""
    fn = getattr(model, "predict", None)
    if fn is None and isinstance(getattr(model, "module", None), nn.Module):
        fn = getattr(model.module, "predict", None)
    if fn is None:
        raise TypeError(f"{type(model).__name__} has no predict(task, out) method")
    return fn


@torch.no_grad()
def predict_dataset(
    model: nn.Module,
    task: str,
    dataset: Dataset,
    batch_size: int = 128,
    device: str | torch.device = "cpu",
    autocast_dtype: torch.dtype | None = None,
    both_orders: bool = False,
    sts_prior: Callable[[Dataset, torch.Tensor], torch.Tensor] | None = None,
    sst_prior: Callable[[Dataset, torch.Tensor], torch.Tensor] | None = None,
) -> Predictions:
    """Run ``model`` over ``dataset`` and return its outputs in dataset order.

    ``dataset`` is a tasks.data SentenceDataset / PairDataset (``ids``,
    ``lengths``, ``collate(indices)``); its pair mode must match the model's
    ``pair_encoding``. The model must already be on ``device``. It runs in
    eval mode and every submodule gets back its previous train/eval mode
    afterwards (LP-FT keeps a frozen encoder in eval while heads train).
    Batches are length-sorted and unshuffled
    (``length_bucketed_batches(shuffle=False)``); results are scattered back to
    dataset order. ``autocast_dtype`` (e.g. torch.bfloat16) turns on autocast
    for the device's type; logits come back as float32. ``both_orders`` scores
    a pair task's pair as the mean of its logits for (a, b) and (b, a) (the
    dataset's index ``i + N``, tasks.data.PairDataset), predictions from that mean.
    ``sts_prior(dataset, scores)`` replaces STS scores, in dataset order, with
    its blend of them (tasks.prior.CosinePrior.blend); ``sst_prior(dataset,
    logits)`` SST logits with its blend (tasks.prior.SentimentPrior.blend), the
    predictions then its argmax.
    """
    _check_task(task)
    device = torch.device(device)
    n = len(dataset)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    predict = _predict_fn(model)
    amp = autocast(device, autocast_dtype)
    order: list[int] = []
    logit_parts: list[torch.Tensor] = []
    pred_parts: list[torch.Tensor] = []
    try:
        for indices in length_bucketed_batches(dataset.lengths, batch_size, shuffle=False):
            batch = move_batch(dataset.collate(indices), device)
            with amp:
                out = model(task, batch)
            if both_orders and task in PAIR_TASKS:
                swapped = move_batch(dataset.collate([i + n for i in indices]), device)
                with amp:
                    reverse = model(task, swapped)
                out = TaskOutput((out.logits.float() + reverse.logits.float()) / 2)
            # Kept on the device until the end: one transfer instead of a sync per batch.
            logit_parts.append(out.logits.float())
            pred_parts.append(predict(task, out))
            order.extend(indices)
    finally:
        for m, was_training in modes:
            m.train(was_training)
    if n == 0:
        shape = (0, NUM_SST_CLASSES) if task == "sst" else (0,)
        return Predictions([], torch.empty(shape), torch.empty(0, dtype=torch.float32 if task == "sts" else torch.long))
    if sorted(order) != list(range(n)):
        raise RuntimeError(f"{task}: the evaluation batches did not cover each of the {n} examples exactly once")
    where = torch.tensor(order, dtype=torch.long)  # (N,) dataset index of each computed row
    logits_sorted = torch.cat(logit_parts).cpu()
    preds_sorted = torch.cat(pred_parts).cpu()
    logits = torch.empty_like(logits_sorted)
    preds = torch.empty_like(preds_sorted)
    logits[where] = logits_sorted
    preds[where] = preds_sorted
    if task == "sts":
        if sts_prior is not None:
            logits = preds = sts_prior(dataset, logits)
        preds = preds.float()
    if task == "sst" and sst_prior is not None:
        logits = sst_prior(dataset, logits)
        preds = logits.argmax(-1)
    return Predictions(list(dataset.ids), logits, preds)


def evaluate(
    model: nn.Module,
    datasets: dict[str, Dataset],
    batch_size: int = 128,
    device: str | torch.device = "cpu",
    autocast_dtype: torch.dtype | None = None,
    both_orders: bool = False,
    sts_prior: Callable[[Dataset, torch.Tensor], torch.Tensor] | None = None,
    sst_prior: Callable[[Dataset, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[dict[str, float], dict[str, Predictions]]:
    """Predict every dataset (keyed by task) and score the labeled ones.

    Returns (metrics, predictions). metrics has TASK_METRIC[task] for each
    dataset with labels (``dataset.labels is not None``) and "overall" (see
    ``overall_score``) when at least one was scored; unlabeled datasets (test
    splits) only get predictions.
    """
    metrics: dict[str, float] = {}
    predictions: dict[str, Predictions] = {}
    for task, dataset in datasets.items():
        _check_task(task)
        p = predict_dataset(model, task, dataset, batch_size=batch_size, device=device, autocast_dtype=autocast_dtype,
                            both_orders=both_orders, sts_prior=sts_prior, sst_prior=sst_prior)
        predictions[task] = p
        if getattr(dataset, "labels", None) is not None:
            metrics[TASK_METRIC[task]] = score(task, p.preds, dataset.labels)
    if metrics:
        metrics["overall"] = overall_score(metrics)
    return metrics, predictions


# ---- files ----------------------------------------------------------------------------------


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; splits are {list(SPLITS)}")


def temp_file_beside(path: Path) -> tuple[int, Path]:
    """A new empty hidden file in ``path``'s folder, for an atomic write: (open fd, its path).

    Created with mode 0o666 so that the kernel applies the umask as for any
    file the user makes (0644 under umask 022): mkstemp's 0600 would make a
    shared results folder unreadable to others. No umask is read or changed,
    so other threads never see a umask of 0.
    """
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{path.parent}: no free temporary name for {path.name} after 100 tries")


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


def write_predictions(pred_dir: str | os.PathLike[str], task: str, split: str, preds: Predictions) -> Path:
    """Write the leaderboard file ``pred_dir/{task}-{split}-output.csv`` and return its path.

    Byte for byte the CS224N starter's format (multitask_classifier.py), for
    which the leaderboard was built: a header ``id \t Predicted_Sentiment \n``
    (``Predicted_Is_Paraphrase``; for STS the starter's spelling
    ``Predicted_Similiary``), then one row ``<id> , <value> \n`` per id in
    ``preds`` order; SST class ids 0-4, paraphrase 0/1, STS float scores
    (full precision). ``read_predictions`` reads it back.
    """
    _check_task(task)
    _check_split(split)
    p = preds.preds.detach().cpu().reshape(-1)
    if p.shape[0] != len(preds.ids):
        raise ValueError(f"{task}: {len(preds.ids)} ids but {p.shape[0]} predictions")
    if task == "sts":
        _check_finite(f"{task}-{split} predictions", p)
        values = [float(v) for v in p.double().tolist()]
    else:
        if p.is_floating_point() and not torch.equal(p, p.round()):
            raise ValueError(f"{task}-{split} predictions must be class ids, got non-integer values")
        values = [int(v) for v in p.long().tolist()]
        top = NUM_SST_CLASSES if task == "sst" else 2
        bad = [v for v in values if not 0 <= v < top]
        if bad:
            raise ValueError(f"{task}-{split} predictions must be in 0..{top - 1}, got {bad[0]} ({len(bad)} rows)")
    path = Path(pred_dir) / f"{task}-{split}-output.csv"
    lines = [f"id \t {STARTER_COLUMN[task]} \n"] + [f"{i} , {v} \n" for i, v in zip(preds.ids, values)]
    return _atomic_write_text(path, "".join(lines))


def _atomic_write_text(path: Path, text: str) -> Path:
    """Write ``text`` through a temporary file in the same folder, then os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_file_beside(path)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def _logit_columns(task: str) -> list[str]:
    if task == "sst":
        return [f"logit_{k}" for k in range(NUM_SST_CLASSES)]
    return ["logit"] if task == "para" else ["score"]


def write_logits(pred_dir: str | os.PathLike[str], task: str, split: str, preds: Predictions) -> Path:
    """Write the raw outputs to ``pred_dir/{task}-{split}-logits.csv`` and return its path.

    Header id,logit_0..logit_4 (SST class logits) / id,logit (paraphrase logit)
    / id,score (STS predicted score). Values are written with Python's
    shortest round-trip repr, so ``read_logits`` gives back the same float32s.
    """
    _check_task(task)
    _check_split(split)
    columns = _logit_columns(task)
    logits = preds.logits.detach().cpu().float()
    want = (len(preds.ids), len(columns)) if task == "sst" else (len(preds.ids),)
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


def read_predictions(path: str | os.PathLike[str]) -> tuple[list[str], torch.Tensor]:
    """Inverse of ``write_predictions``: (ids, (N,) long class ids for SST / paraphrase, float32 for STS).

    Also reads the CS224N starter's files: header ``id \t Predicted_Sentiment ``
    (``Predicted_Is_Paraphrase``, ``Predicted_Similiary`` sic), rows ``<id> , <value> ``.
    """
    column_task = {c: t for t, c in PREDICTION_COLUMN.items()} | {c: t for t, c in STARTER_COLUMN.items()}
    found: dict[str, str] = {}

    def parse_header(header: list[str]) -> str | None:
        if len(header) == 2 and header[0] == "id" and header[1] in column_task:
            found["task"] = column_task[header[1]]
            return None
        return f"header {header} is not id,<{'|'.join(PREDICTION_COLUMN.values())}> (a write_predictions file)"

    def parse_value(raw: str) -> float | int:
        if found["task"] == "sts":
            return _finite_float(raw)
        v = _finite_float(raw)  # accepts "3" and "3.0"
        if v != int(v):
            raise ValueError(f"{raw!r} is not a class id")
        top = NUM_SST_CLASSES if found["task"] == "sst" else 2
        if not 0 <= v < top:
            raise ValueError(f"{raw!r} is out of range 0..{top - 1}")
        return int(v)

    ids, values = _read_id_value_csv(path, parse_header, parse_value)
    dtype = torch.float32 if found["task"] == "sts" else torch.long
    return ids, torch.tensor([v[0] for v in values], dtype=dtype)
