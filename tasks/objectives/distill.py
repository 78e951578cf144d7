"""Knowledge distillation from saved predictions: soft targets of one teacher model or an ensemble.

Paper: ../shared/papers/minbert-downstream-generalization.txt §4.6 "Knowledge
Distillation": "we first train a model, and then attempt to use its
predictions as soft labels for training another model ... adding the loss
compared to the distillation soft labels as a separate term in all our tasks'
loss functions, weighting it as 2/3 of the main task's loss", with the soft
labels from one model or from an ensemble of models.

Teachers are prediction directories (or run directories holding
``predictions/``) with the *training-set* logits ``{task}-train-logits.csv``
that ``--predict-train`` writes (``Evaluator.write_all``, tasks/evaluation/evaluator.py; e.g.
``train_multitask.py --eval-only --predict-train --checkpoint runs/a/checkpoints/best``).
Soft targets, per training example id (batches carry ``"ids"``), averaged over
the teachers the way the simple ensemble (tasks/evaluation/ensembling.py) averages:

    SST   p_t = mean_m softmax(z_m / T)             (5 classes)
    Para  p_t = mean_m sigmoid(z_m / T)             (P(paraphrase))
    STS   s_t = mean_m s_m                          (predicted similarity)

and the terms, each a mean over the batch, computed in float32:

    SST   T² · KL(p_t ‖ softmax(z / T))
    Para  T² · BCE(sigmoid(z / T), p_t)             = H(p_t) + KL(p_t ‖ σ(z/T)): minimal, not 0, at σ(z/T) = p_t
    STS   (s − s_t)²

T = ``temperature`` (default 1, the paper's plain soft labels); the T² factor
(Hinton et al. 2015) keeps gradient sizes comparable across temperatures.
The trainer multiplies the term "loss" by ``weight`` (default 2/3) while the
head's own loss keeps factor 1: the distillation term weighs 2/3 of the main
task's loss, as the paper says.

The targets of a task are read to the CPU and moved to the training device at
the first step (one copy of the whole table); each step then sends only its
row numbers, without a blocking copy.

Checks: ``check_run`` (called by TrainConfig.validate, before any data is
read) requires every teacher to hold the train logits of every task the
objective trains; when training starts, every training id must be in the
teacher files (a missing id is an error naming the file; teachers may cover
more ids, e.g. a student run with ``--limit``). Teachers are read when
training starts, never when a checkpoint is loaded for evaluation, and their
targets are not part of the checkpoint (a resumed run reads them again).

Related: SMART / R-Drop (``smart.py``: KL between two predictions of the same
model), ensembling (``tasks/evaluation/ensembling.py``: the same averages at inference).

Usage:
    python train_multitask.py --objective distill --distill-teachers runs/a/predictions runs/b/predictions
    objs = build_objectives({"distill": {"teachers": ["runs/a/predictions"]}}, model)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tasks.predictions import load_task_logits, logits_path
from tasks.objectives import Objective, ObjectiveConfig, kind_rule
from tasks.options import option
from tasks.runtime import full_precision
from tasks.task import MULTITASK, Binary, Classes, Scores, Task

DISTILL_TASKS = MULTITASK

# By the kind of task (the kinds distillation takes): the soft target of teachers' float64 outputs x (M, N[, C]) at
# temperature T, and the term of a student's float32 outputs z against it
TARGETS = {
    Classes: lambda x, temperature: (x / temperature).softmax(-1).mean(0).float(),  # (N, C)
    Binary: lambda x, temperature: torch.sigmoid(x / temperature).mean(0).float(),  # (N,)
    Scores: lambda x, temperature: x.mean(0).float(),  # (N,): no temperature, a regression target
}
TERMS = {
    Classes: lambda z, t, temperature: temperature ** 2 * F.kl_div(F.log_softmax(z / temperature, dim=-1), t,
                                                                     reduction="batchmean"),
    Binary: lambda z, t, temperature: temperature ** 2 * F.binary_cross_entropy_with_logits(z / temperature, t),
    Scores: lambda z, t, temperature: F.mse_loss(z, t),
}


def teacher_targets(task: Task, logits: Sequence[torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
    """The (ensemble) soft target of each example from M teachers' raw outputs, float32.

    By the kind of ``task`` (its entry): classes (SST): mean of softmax(z/T), (N, C); a pair classification
    (paraphrase): mean of sigmoid(z/T), (N,); a regression (STS): mean score, (N,) (no temperature: a regression
    target).
    """
    if not logits:
        raise ValueError("teacher_targets of no teachers")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    x = torch.stack([t.double() for t in logits])  # (M, N[, C])
    return kind_rule("distill", TARGETS, task.name, task.kind)(x, temperature)


def distill_loss(task: Task, student: torch.Tensor, target: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The distillation term of a batch: student's raw outputs vs the teacher's soft targets (mean over the batch).

    Classes (SST): T²·KL(target ‖ softmax(student/T)) for student logits (B, C), target
    probabilities (B, C); a pair classification (paraphrase): T²·BCE(sigmoid(student/T), target) for
    logits (B,), target probabilities (B,); a regression (STS): MSE for scores (B,).
    """
    with full_precision(student.device):
        z, t = student.float(), target.float().to(student.device)
        if z.shape != t.shape:
            raise ValueError(f"{task.name}: student outputs {tuple(z.shape)} but teacher targets {tuple(t.shape)}")
        return kind_rule("distill", TERMS, task.name, task.kind)(z, t, temperature)


@dataclass
class TaskTargets:
    """One task's soft targets: row ``index[id]`` of ``targets`` (SST (N, 5), else (N,)); ``files`` they came from.

    ``targets`` is read on the CPU and moved to the training device once (``to``);
    rows are then picked there, so a step copies only its (B,) row numbers.
    """

    index: dict[str, int]
    targets: torch.Tensor
    files: list[Path]

    def rows(self, task: str, ids: Sequence[str]) -> torch.Tensor:
        """The (B,) int64 CPU row numbers of ``ids``; an id without a teacher prediction is an error."""
        missing = [i for i in ids if i not in self.index]
        if missing:
            raise ValueError(f"distill: {len(missing)} {task} training id(s) have no teacher prediction in "
                             f"{', '.join(map(str, self.files))} (e.g. {missing[:3]}); were the teachers' "
                             "--predict-train logits written on the same training data?")
        return torch.tensor([self.index[i] for i in ids], dtype=torch.long)

    def lookup(self, task: str, ids: Sequence[str]) -> torch.Tensor:
        """The soft targets of ``ids``, on the device ``targets`` lives on."""
        return self.targets[self.rows(task, ids).to(self.targets.device, non_blocking=True)]

    def to(self, device: torch.device) -> None:
        """Keep ``targets`` on ``device`` from now on (one copy of the whole table)."""
        if self.targets.device != device:
            self.targets = self.targets.to(device)


def load_teachers(teachers: Sequence[str], task: Task, temperature: float = 1.0) -> TaskTargets:
    """Read ``{task}-train-logits.csv`` of every teacher directory and average them into soft targets (by the kind
    of ``task``, its entry)."""
    found = load_task_logits(list(teachers), task, "train")  # aligned by id; mismatched files raise, naming them
    if found is None:
        raise FileNotFoundError(f"distill: no {task.name}-train-logits.csv in {', '.join(teachers)}; write it with "
                                "--predict-train (also with --eval-only --predict-train --checkpoint ...)")
    targets = teacher_targets(task, found.logits, temperature)
    return TaskTargets({i: n for n, i in enumerate(found.ids)}, targets, found.files)


@dataclass
class DistillConfig(ObjectiveConfig):
    """Options of the "distill" objective (CLI: ``--distill-<field>``)."""

    weight: float = option(2 / 3, "factor on the distillation term, the head's loss keeps 1 (§4.6: 2/3 of the main loss)")
    teachers: tuple[str, ...] = option((), "prediction dirs with {task}-train-logits.csv (--predict-train); several: ensemble")
    temperature: float = option(1.0, "T: SST / para targets softmax(z/T) / sigmoid(z/T), terms x T²; 1 = plain soft labels")

    def __post_init__(self) -> None:
        self.teachers = tuple(str(t) for t in self.teachers)
        super().__post_init__()
        if not self.teachers:
            raise ValueError("distill needs teachers: --distill-teachers DIR [DIR ...], prediction directories "
                             "holding {task}-train-logits.csv (written by --predict-train)")
        if not (self.weight >= 0 and math.isfinite(self.weight)):
            raise ValueError(f"distill weight must be a finite number >= 0, got {self.weight}")
        if not self.temperature > 0:
            raise ValueError(f"distill temperature must be positive, got {self.temperature}")


class Distill(Objective):
    """Soft-target loss against saved teacher predictions on the training data (paper §4.6)."""

    name = "distill"
    Config = DistillConfig
    option_names = frozenset(("weight", "tasks", "teachers", "temperature"))  # at options_version 1
    kinds = ("sentence-classification", "pair-classification", "sentence-regression", "pair-regression")
    tasks = DISTILL_TASKS

    def __init__(self, config: DistillConfig, model: nn.Module | None = None):
        super().__init__(config, model)
        # Plain attribute, not buffers: teacher targets are inputs, not state to checkpoint.
        self.targets: dict[str, TaskTargets] = {}

    @classmethod
    def check_run(cls, config: DistillConfig, cfg: Any) -> None:
        """Before any work: every teacher holds the train logits of every task this objective trains in ``cfg``."""
        tasks = [t for t in (config.tasks or cls.tasks) if t in cfg.tasks]
        missing = [str(logits_path(d, t, "train")) for d in config.teachers for t in tasks
                   if not logits_path(d, t, "train").is_file()]
        if missing:
            raise ValueError(f"distill teacher file(s) missing: {', '.join(missing)}; write a teacher's training-set "
                             "logits with --predict-train (or --eval-only --predict-train --checkpoint ...)")

    def targets_for(self, model: nn.Module, task: str) -> TaskTargets:
        if task not in self.targets:
            self.targets[task] = load_teachers(self.config.teachers, model.entry(task), self.config.temperature)
        return self.targets[task]

    def on_train_start(self, model: nn.Module, train_sets: dict[str, Any]) -> None:
        """Read the teachers and check that they cover every training example, before the first step."""
        for task, dataset in train_sets.items():
            if self.applies_to(task):
                self.targets_for(model, task).lookup(task, dataset.ids)

    def forward(self, model: nn.Module, task: str, batch: dict, out) -> dict[str, torch.Tensor]:
        targets = self.targets_for(model, task)
        targets.to(out.logits.device)  # the first step copies the table; later steps find it there
        # The row numbers come from the host (ids are strings); non_blocking: a copy from pageable memory is
        # staged at once and never waits for the device, where a blocking copy would synchronize with it.
        return {"loss": distill_loss(model.entry(task), out.logits, targets.lookup(task, batch["ids"]),
                                     self.config.temperature)}


__all__ = ("Distill", "DistillConfig", "TaskTargets", "distill_loss", "load_teachers", "teacher_targets")
