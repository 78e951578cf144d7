"""R-Drop: two dropout passes of every batch, pulled together (not in the papers; a standard small-data lever).

Paper: Liang, Wu, Li, Wang, Meng, Qin, Chen, Zhang and Liu, "R-Drop: Regularized Dropout for Neural
Networks" (NeurIPS 2021), §2.1, eq. 1–3: each example goes through the model twice, each pass with its own
dropout masks (P1, P2), and

    L_NLL = −log P1(y | x) − log P2(y | x)                                          (1)
    L_KL  = ½ (KL(P1 ‖ P2) + KL(P2 ‖ P1))                                           (2)
    L     = L_NLL + α · L_KL                                                         (3)

How it maps onto the objective interface: the head's own forward is P1; the objective runs the second pass.
The whole is eq. 3 halved, so that its cross-entropy part is the mean of the two passes' and keeps the scale
(and learning rate) of a run without it: the trainer scales the head's loss by ``task_loss_scale`` = ½ and
adds ½ × the term ``ce`` (the second pass's loss, the model's own ``task_loss``) and α/2 × the term ``kl``
(eq. 2's L_KL, the symmetric KL of smart.py halved); ``weight`` multiplies both terms (1: eq. 3 halved; 0:
off, the head's loss whole and no second pass).
Gradients flow through both passes and both directions of the KL, as in the paper.

Tasks: the classification heads' streams: SST (5 classes), the SST phrases, and paraphrase (the Bernoulli
of its logit, as SMART's divergence). SST and its phrases by default.

Cost: a second forward and backward of every batch it applies to.

Related: SMART (smart.py: the same divergence between a clean and an adversarially perturbed pass, with the
same dropout masks), SimCSE (simcse.py: two dropout passes as a contrastive pair).

Usage:
    objs = build_objectives({"rdrop": {"alpha": 1.0}}, model)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tasks.model import PHRASES
from tasks.objectives import Objective, ObjectiveConfig, kind_rule
from tasks.objectives.smart import bernoulli_logits, symmetric_kl
from tasks.options import option
from tasks.task import Binary, Classes, Task

RDROP_TASKS = ("sst", PHRASES, "para")

# The logits whose softmax is a head's class distribution, by the kind of task (the kinds R-Drop takes): its own C
# logits, or the Bernoulli of a one-logit head
CATEGORICAL = {Classes: lambda z: z, Binary: bernoulli_logits}


def rdrop_divergence(task: Task, p1: torch.Tensor, p2: torch.Tensor) -> torch.Tensor:
    """Eq. 2's L_KL between two passes' outputs of a classification's head (``task``, its entry: ``model.entry``;
    their class distributions: ``CATEGORICAL``, by its kind), mean over the batch."""
    categorical = kind_rule("rdrop", CATEGORICAL, task.name, task.kind)
    return 0.5 * symmetric_kl(categorical(p1), categorical(p2))


@dataclass
class RDropConfig(ObjectiveConfig):
    """Options of the "rdrop" objective (CLI: ``--rdrop-<field>``)."""

    weight: float = option(1.0, "the factor on both terms (1: the paper's eq. 3, halved)")
    alpha: float = option(1.0, "α of eq. 3, the factor on the KL between the two passes")
    tasks: tuple[str, ...] = option((), "the streams it applies to (sst, phrases, para); empty = SST and its "
                                    "phrases")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.alpha < 0 or self.weight < 0:
            raise ValueError(f"rdrop weight and alpha must be >= 0, got {self.weight}, {self.alpha}")


class RDrop(Objective):
    """R-Drop: the head's loss halved, the second pass's loss halved, and α/2 × the KL between the passes."""

    name = "rdrop"
    Config = RDropConfig
    option_names = frozenset(("weight", "tasks", "alpha"))  # at options_version 1
    kinds = ("sentence-classification", "pair-classification")
    tasks = RDROP_TASKS
    default_tasks = ("sst", PHRASES)

    @property
    def task_loss_scale(self) -> float:
        return 0.5 if self.config.weight > 0 else 1.0  # weight 0: off, the head's loss whole (no second pass)

    def term_weight(self, term: str) -> float:
        return float(self.config.weight) * (0.5 if term == "ce" else 0.5 * float(self.config.alpha))

    def forward(self, model: nn.Module, task: str, batch: dict, out) -> dict[str, torch.Tensor]:
        if self.config.weight == 0:
            return {}  # off: no second pass, so no dropout masks are drawn and the run is the one without it
        if out is None:
            raise ValueError(f"rdrop needs the head's output for the {task} batch (its first pass)")
        if not model.training:
            raise ValueError("rdrop compares two dropout passes: the model must be in training mode")
        second = model(task, batch)  # fresh dropout masks
        return {"ce": model.task_loss(task, second, batch), "kl": rdrop_divergence(model.entry(task), out.logits,
                                                                                     second.logits)}
