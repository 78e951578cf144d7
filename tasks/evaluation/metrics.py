"""The task metrics, and the overall score that selects a run's best epoch.

A task names its metrics (its entry's ``metrics``; the first is its main one); each is computed here and goes
into a run's records as ``<task>_<metric>``:

    acc        accuracy of class ids                                        (sst_acc, para_acc)
    f1         F1 of a two-class task's positive class (its entry's         scikit-learn's f1_score(pos_label=...)
               ``positive_class``: MRPC's class 1; default the second)
    macro_f1   F1 averaged over the classes (imbalanced classes)            f1_score(average="macro")
    mcc        Matthews correlation, its multi-class form (CoLA's)          matthews_corrcoef
    r          Pearson correlation of scores (STS's)                        scipy.stats.pearsonr
    spearman   Spearman rank correlation of scores (STS-B's, SICK-R's)     scipy.stats.spearmanr

The overall score is the mean of the selected tasks' main metrics, each mapped to [0, 1] (a correlation c in
[-1, 1] counts as (c + 1) / 2). By default it is the CS224N project's,

    overall = (sst_acc + para_acc + (sts_r + 1) / 2) / 3

over the built-in tasks a run scores (a one-task run still gets a comparable [0, 1] number), and over a run's
own tasks only where it has no built-in one; ``select`` names the tasks (their main metric) or metrics
(``rte_f1``) to average instead (``--best-metric``, as HF's ``metric_for_best_model``).

Usage:
    acc = score("sst", preds, labels)                              # the task's main metric
    metrics = scores("mrpc", preds, labels)                        # {"mrpc_acc": ..., "mrpc_f1": ...}
    overall = overall_score({"sst_acc": acc, "sts_r": r})          # mean over the built-in tasks present
    overall = overall_score(metrics, select=("mrpc_f1",))          # what --best-metric mrpc_f1 selects by
    record = jsonable({"sts_r": float("nan")})                     # {"sts_r": None}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tasks.task import PACKAGE, Task, Tasks, get_task


# ---- the metrics --------------------------------------------------------------------------------------------


def _pair(preds: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return preds.detach().reshape(-1).cpu(), labels.detach().reshape(-1).cpu()


def accuracy(preds: torch.Tensor, labels: torch.Tensor) -> float:
    """The fraction of class ids equal to the labels (Quora's labels are floats 0.0 / 1.0: compared as ids)."""
    p, y = _pair(preds, labels)
    return (p.long() == y.long()).double().mean().item()


def _confusion(preds: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the classes present in either, in order; the confusion matrix C[true, predicted] over them, float64)."""
    p, y = (t.long() for t in _pair(preds, labels))
    classes = torch.unique(torch.cat([y, p]))  # sorted
    k = classes.numel()
    c = torch.zeros(k * k, dtype=torch.float64)
    c.index_add_(0, torch.searchsorted(classes, y) * k + torch.searchsorted(classes, p),
                 torch.ones(y.numel(), dtype=torch.float64))
    return classes, c.reshape(k, k)


def _f1_per_class(c: torch.Tensor) -> torch.Tensor:
    """F1 of each class of a confusion matrix, 0 where it is undefined (no true and no predicted example:
    scikit-learn's zero_division=0 default, with its warning left out)."""
    tp = c.diagonal()
    denom = c.sum(0) + c.sum(1)  # predicted + true = 2 tp + fp + fn
    return torch.where(denom > 0, 2 * tp / denom.clamp_min(1e-300), torch.zeros_like(tp))


def f1(preds: torch.Tensor, labels: torch.Tensor, pos_label: int = 1) -> float:
    """F1 of class ``pos_label``, the positive class of a two-class task (scikit-learn's f1_score(pos_label=...),
    0 where nothing is predicted or labelled positive)."""
    p, y = (t.long() for t in _pair(preds, labels))
    tp = float(((p == pos_label) & (y == pos_label)).sum())
    denom = float((p == pos_label).sum() + (y == pos_label).sum())
    return 2 * tp / denom if denom else 0.0


def macro_f1(preds: torch.Tensor, labels: torch.Tensor) -> float:
    """The mean of every class's F1, over the classes in the labels or the predictions (f1_score(average="macro"))."""
    _, c = _confusion(preds, labels)
    return _f1_per_class(c).mean().item()


def mcc(preds: torch.Tensor, labels: torch.Tensor) -> float:
    """Matthews correlation of class ids, in its multi-class form (Gorodkin 2004; scikit-learn's
    matthews_corrcoef): 0 where it is undefined (every prediction, or every label, one class)."""
    _, c = _confusion(preds, labels)
    n, correct = c.sum(), c.trace()
    t, p = c.sum(1), c.sum(0)  # true and predicted counts per class
    cov_tp = correct * n - t @ p
    cov_pp, cov_tt = n * n - p @ p, n * n - t @ t
    if cov_pp == 0 or cov_tt == 0:
        return 0.0
    return float(cov_tp / torch.sqrt(cov_tt * cov_pp))


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


def ranks(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks of a 1-D tensor, ties given their mean rank (scipy.stats.rankdata's "average"), float64."""
    x = x.detach().reshape(-1).to("cpu", torch.float64)
    values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
    last = counts.cumsum(0).double()  # the rank of each distinct value's last copy
    return (last - (counts.double() - 1) / 2)[inverse]


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman rank correlation: Pearson r of the ranks (ties averaged), as scipy.stats.spearmanr."""
    return pearson_r(ranks(x), ranks(y))


@dataclass(frozen=True)
class Metric:
    """A metric: how it is computed from (predictions, labels), whether it is a correlation in [-1, 1] (then it
    counts as (c + 1) / 2 in the overall score), and whether it scores one class (``positive``: ``fn`` takes the
    task's positive class as ``pos_label``)."""

    fn: Callable[..., float]
    correlation: bool = False
    positive: bool = False

    def of(self, task: Task, preds: torch.Tensor, labels: torch.Tensor) -> float:
        """Its value for ``task``'s predictions and labels."""
        return self.fn(preds, labels, pos_label=task.positive_class) if self.positive else self.fn(preds, labels)

    def normalized(self, value: float) -> float:
        """Its part of the overall score, in [0, 1]."""
        return (value + 1.0) / 2.0 if self.correlation else value


METRICS: dict[str, Metric] = {
    "acc": Metric(accuracy), "f1": Metric(f1, positive=True), "macro_f1": Metric(macro_f1),
    "mcc": Metric(mcc, correlation=True),
    "r": Metric(pearson_r, correlation=True), "spearman": Metric(spearman, correlation=True),
}


# ---- a task's metrics and the overall score ---------------------------------------------------------------------


def task_metric(task: str | Task) -> str:
    """The name of ``task``'s main metric in a run's records: sst_acc, para_acc, sts_r, ... (``task``: an entry, or
    the name of one this package declares)."""
    return get_task(task).metric


def jsonable(metrics: dict[str, float]) -> dict[str, float | None]:
    """Non-finite values (an undefined Pearson r) become null: JSON has no NaN."""
    return {k: (float(v) if math.isfinite(v) else None) for k, v in metrics.items()}


def _checked(task: Task, preds: torch.Tensor, labels: torch.Tensor) -> None:
    if preds.shape[0] != labels.shape[0]:
        raise ValueError(f"{task.name}: {preds.shape[0]} predictions but {labels.shape[0]} labels")
    if preds.shape[0] == 0:
        raise ValueError(f"{task.name}: cannot score an empty set")


def score(task: str | Task, preds: torch.Tensor, labels: torch.Tensor) -> float:
    """The task's main metric of predictions against labels: accuracy, Pearson r, ... (its entry's first)."""
    task = get_task(task)
    _checked(task, preds, labels)
    return METRICS[task.metrics[0]].of(task, preds, labels)


def scores(task: str | Task, preds: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Every metric of the task (its entry's ``metrics``) by its name in the records, the main one first."""
    task = get_task(task)
    _checked(task, preds, labels)
    return {f"{task.name}_{m}": METRICS[m].of(task, preds, labels) for m in task.metrics}


def _entries(tasks: Tasks | None) -> list[Task]:
    """The entries a record's keys are read against, in their order (the package's, then a run's own): ``tasks``
    (a run's: TrainConfig.entries), the package's when None."""
    return list((PACKAGE if tasks is None else tasks).values())


def _metric_of(key: str, tasks: list[Task]) -> tuple[Task, str] | None:
    """(the task, the metric's name) of a record's key "<task>_<metric>" of one of ``tasks``; None for any other
    key."""
    for task in tasks:
        if key.startswith(task.name + "_") and key[len(task.name) + 1:] in task.kind.metrics:
            return task, key[len(task.name) + 1:]
    return None


def selected_metrics(metrics: dict, select: Sequence[str] = (), tasks: Tasks | None = None) -> list[str]:
    """The keys of ``metrics`` the overall score averages: ``select``'s (a task: its main metric; or a metric's
    own key), else the main metrics of the tasks present that declare they count (``"overall": true``: the CS224N
    overall), else of every task present, in ``metrics``' order; the tasks are ``tasks`` (a run's entries; default:
    the package's). A selected metric that ``metrics`` lacks is a ValueError naming it."""
    entries = _entries(tasks)
    by_name = {t.name: t for t in entries}
    if select:
        keys = [by_name[s].metric if s in by_name else s for s in select]
        missing = [k for k in keys if k not in metrics]
        if missing:
            raise ValueError(f"the overall score selects {missing}, which the scores do not hold "
                             f"(they hold {sorted(k for k in metrics if _metric_of(k, entries))})")
        return keys
    order = list(metrics)  # as the scores were recorded (a run's --tasks order), whoever declared the task
    present = sorted((t for t in entries if t.metric in metrics), key=lambda t: order.index(t.metric))
    counted = [t for t in present if t.overall] or present
    return [t.metric for t in counted]


def describe_selection(tasks: Sequence[str], select: Sequence[str] = (), entries: Tasks | None = None) -> str:
    """The overall score of a run on ``tasks`` (of ``entries``, the run's: TrainConfig.entries; default: the
    package's) in words: "the mean of sst_acc, para_acc, (sts_r + 1) / 2"."""
    entries = PACKAGE if entries is None else entries
    keys = selected_metrics({k: 0.0 for t in tasks for k in entries[t].metric_keys}, select, entries)
    parts = [f"({k} + 1) / 2" if METRICS[_metric_of(k, _entries(entries))[1]].correlation else k for k in keys]
    return parts[0] if len(parts) == 1 else f"the mean of {', '.join(parts)}"


def overall_score(metrics: dict, select: Sequence[str] = (), tasks: Tasks | None = None) -> float:
    """The mean of the selected metrics (``selected_metrics``, of ``tasks``: a run's entries, default the
    package's) of ``metrics``, each mapped to [0, 1] (a correlation c as (c + 1) / 2). Other keys (losses,
    "overall" itself) are ignored. Raises when no task metric is present; a nan metric makes the result nan (never
    silently dropped)."""
    entries = _entries(tasks)
    keys = selected_metrics(metrics, select, tasks)
    if not keys:
        raise ValueError(f"no task metric in {sorted(metrics)}; expected some of {[t.metric for t in entries]}")
    parts = []
    for key in keys:
        found = _metric_of(key, entries)
        if found is None:
            raise ValueError(f"{key!r} is not a task's metric (<task>_<metric>: a metric of "
                             f"{', '.join(METRICS)})")
        parts.append(METRICS[found[1]].normalized(float(metrics[key])))
    return sum(parts) / len(parts)


__all__ = ("METRICS", "Metric", "accuracy", "describe_selection", "f1", "jsonable", "macro_f1", "mcc", "overall_score",
           "pearson_r", "ranks", "score", "scores", "selected_metrics", "spearman", "task_metric")
