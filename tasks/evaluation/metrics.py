"""The task metrics and the overall score, as the CS224N default project scores them.

SST and paraphrase are scored by accuracy, STS by the Pearson correlation r
between predicted and gold similarity. The overall score is

    overall = (sst_acc + para_acc + (sts_r + 1) / 2) / 3

i.e. the mean of the per-task scores mapped to [0, 1] (r is in [-1, 1]). When
only some tasks are evaluated, ``overall_score`` is the mean over the tasks
present, so a one-task run still gets a comparable [0, 1] number.

Usage:
    acc = score("sst", preds, labels)                              # accuracy; "sts": Pearson r (the task's kind)
    overall = overall_score({"sst_acc": acc, "sts_r": r})          # mean over the tasks present
    record = jsonable({"sts_r": float("nan")})                     # {"sts_r": None}
"""

from __future__ import annotations

import math

import torch

from tasks.task import get_task, pearson_r, task_names


def task_metric(task: str) -> str:
    """The name of ``task``'s metric in a run's records: sst_acc, para_acc, sts_r, ..."""
    return get_task(task).metric


def jsonable(metrics: dict[str, float]) -> dict[str, float | None]:
    """Non-finite values (an undefined Pearson r) become null: JSON has no NaN."""
    return {k: (float(v) if math.isfinite(v) else None) for k, v in metrics.items()}


def overall_score(metrics: dict) -> float:
    """Mean of the normalized task scores present in ``metrics``.

    Accuracies count as they are; a Pearson r counts as (r + 1) / 2 (its kind's ``normalized``), so with the
    three tasks this is (sst_acc + para_acc + (sts_r + 1) / 2) / 3. Other keys (losses, "overall" itself) are
    ignored. Raises when no task metric is present; a nan metric makes the result nan (never silently dropped).
    """
    parts = []
    for task in map(get_task, task_names()):
        if task.metric in metrics:
            parts.append(task.kind.normalized(float(metrics[task.metric])))
    if not parts:
        raise ValueError(f"no task metric in {sorted(metrics)}; expected some of "
                         f"{[get_task(t).metric for t in task_names()]}")
    return sum(parts) / len(parts)


def score(task: str, preds: torch.Tensor, labels: torch.Tensor) -> float:
    """The task's metric: accuracy of class ids against the labels, or Pearson r of scores (its kind's)."""
    kind = get_task(task).kind
    if preds.shape[0] != labels.shape[0]:
        raise ValueError(f"{task}: {preds.shape[0]} predictions but {labels.shape[0]} labels")
    if preds.shape[0] == 0:
        raise ValueError(f"{task}: cannot score an empty set")
    return kind.score(preds, labels)


__all__ = ("jsonable", "overall_score", "pearson_r", "score", "task_metric")
