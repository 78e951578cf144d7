"""Label smoothing of the SST head's cross-entropy (not in the papers; a standard small-data lever).

Paper: Szegedy, Vanhoucke, Ioffe, Shlens and Wojna, "Rethinking the Inception Architecture for Computer
Vision" (CVPR 2016), §7 ("Model Regularization via Label Smoothing"): train against the mixture
q'(k) = (1 − ε)·δ(k, y) + ε·u(k) instead of the one-hot label, so that the cross-entropy

    H(q', p) = (1 − ε)·H(δ_y, p) + ε·H(u, p)

is the head's own loss scaled by 1 − ε plus ε times the cross-entropy against u.

How it maps onto the objective interface (as SCL's eq. 1): ``weight`` is ε; the trainer scales the head's
cross-entropy by ``task_loss_scale`` = 1 − ε and adds ε × the term ``smooth`` = H(u, p), a mean over the
batch. With ``to="uniform"`` (the paper's u = 1/K) the sum equals ``F.cross_entropy(..., label_smoothing=ε)``
(the test checks it against torch).

SST-5's classes are ordinal (very negative ... very positive), so ``to="neighbours"`` is offered too: u puts
the smoothing mass on the classes next to y (half on each side; all of it on the one neighbour of an end
class), the confusions a rater makes, rather than on the far end of the scale. Not in Szegedy et al.

Tasks: the SST head's streams, "sst" and the treebank's phrases (``--sst-phrases``).

Usage:
    objs = build_objectives({"label_smoothing": {"weight": 0.1, "to": "neighbours"}}, model)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tasks.model import PHRASES
from tasks.objectives import Objective, ObjectiveConfig
from tasks.options import option

SMOOTHING_TASKS = ("sst", PHRASES)
TARGETS = ("uniform", "neighbours")


def smoothing_distribution(labels: torch.Tensor, num_classes: int, to: str) -> torch.Tensor:
    """u(· | y) for each label, (B, K): 1/K everywhere ("uniform"), or the classes y − 1 and y + 1 that exist,
    equally ("neighbours")."""
    if to == "uniform":
        return torch.full((len(labels), num_classes), 1.0 / num_classes, device=labels.device)
    if to == "neighbours":
        eye = torch.eye(num_classes + 2, device=labels.device)[:, 1:-1]  # row c + 1: class c, rows 0, K + 1: none
        u = eye[labels] + eye[labels + 2]  # y − 1 and y + 1 (shifted by the padding row)
        return u / u.sum(-1, keepdim=True)
    raise ValueError(f"label_smoothing to must be one of {TARGETS}, got {to!r}")


def smoothing_loss(logits: torch.Tensor, labels: torch.Tensor, to: str = "uniform") -> torch.Tensor:
    """H(u, p): the cross-entropy of softmax(``logits``) (B, K) against u(· | ``labels``), mean over the batch,
    in float32."""
    logp = logits.float().log_softmax(-1)
    return -(smoothing_distribution(labels.long(), logits.shape[-1], to) * logp).sum(-1).mean()


@dataclass
class LabelSmoothingConfig(ObjectiveConfig):
    """Options of the "label_smoothing" objective (CLI: ``--label-smoothing-<field>``)."""

    weight: float = option(0.1, "ε, the label mass moved off the gold class (the head's loss gets 1 − ε)")
    to: str = option("uniform", "where it goes: uniform (every class, Szegedy et al. §7) or neighbours (the "
                     "classes next to the gold one on SST's ordinal scale)", choices=TARGETS)
    tasks: tuple[str, ...] = option(SMOOTHING_TASKS, "the SST head's streams it smooths")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.weight < 1:
            raise ValueError(f"label_smoothing weight (ε) must be in [0, 1), got {self.weight}")
        if self.to not in TARGETS:
            raise ValueError(f"label_smoothing to must be one of {TARGETS}, got {self.to!r}")


class LabelSmoothing(Objective):
    """(1 − ε)·the SST head's cross-entropy + ε·the cross-entropy against the smoothing distribution."""

    name = "label_smoothing"
    Config = LabelSmoothingConfig
    option_names = frozenset(("weight", "tasks", "to"))  # at options_version 1
    kinds = ("sentence-classification",)
    tasks = SMOOTHING_TASKS

    @property
    def task_loss_scale(self) -> float:
        return 1.0 - float(self.config.weight)

    def forward(self, model: nn.Module, task: str, batch: dict, out) -> dict[str, torch.Tensor]:
        if out is None or out.logits.dim() != 2:
            raise ValueError(f"label_smoothing needs a classification head's class logits for the {task} batch")
        return {"smooth": smoothing_loss(out.logits, batch["labels"], self.config.to)}
