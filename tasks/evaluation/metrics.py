"""The task metrics and the overall score, as the CS224N default project scores them.

SST and paraphrase are scored by accuracy, STS by the Pearson correlation r
between predicted and gold similarity. The overall score is

    overall = (sst_acc + para_acc + (sts_r + 1) / 2) / 3

i.e. the mean of the per-task scores mapped to [0, 1] (r is in [-1, 1]). When
only some tasks are evaluated, ``overall_score`` is the mean over the tasks
present, so a one-task run still gets a comparable [0, 1] number.

Usage:
    acc = score("sst", preds, labels)                              # accuracy; "sts": Pearson r
    overall = overall_score({"sst_acc": acc, "sts_r": r})          # mean over the tasks present
    record = jsonable({"sts_r": float("nan")})                     # {"sts_r": None}
"""

from __future__ import annotations

import math

import torch

from tasks.model import check_task

TASK_METRIC = {"sst": "sst_acc", "para": "para_acc", "sts": "sts_r"}


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
    check_task(task)
    if preds.shape[0] != labels.shape[0]:
        raise ValueError(f"{task}: {preds.shape[0]} predictions but {labels.shape[0]} labels")
    if preds.shape[0] == 0:
        raise ValueError(f"{task}: cannot score an empty set")
    if task == "sts":
        return pearson_r(preds, labels)
    # Quora labels are floats 0.0 / 1.0; compare as class ids.
    return (preds.detach().cpu().long() == labels.detach().cpu().long()).double().mean().item()

