"""Supervised contrastive learning (SCL) term for fine-tuning classifiers.

Paper: Gunel, Du, Conneau and Stoyanov, "Supervised Contrastive Learning for
Pre-trained Language Model Fine-tuning" (ICLR 2021),
../shared/papers/scl-supervised-contrastive.txt §2, eq. 1–3::

    L       = (1 − λ)·L_CE + λ·L_SCL                                        (1)
    L_SCL   = Σ_{i=1..N} −1/(N_{y_i} − 1) Σ_{j≠i, y_j=y_i}
                  log( exp(Φ_i·Φ_j / τ) / Σ_{k≠i} exp(Φ_i·Φ_k / τ) )        (3)

Φ is the l2-normalized embedding before the classifier ([CLS] in the paper),
N the batch size, N_{y_i} the number of examples in the batch labelled y_i.

How the pieces map onto the objective interface:
- ``weight`` is λ. The trainer multiplies the returned ``"loss"`` term by
  ``weight`` = λ, and the head's own loss (cross-entropy for SST, BCE for
  paraphrase; eq. 2, a mean over the batch) by ``task_loss_scale`` = 1 − λ.
  λ must lie in [0, 1]; λ = 1 turns the head's loss off.
- Normalization: eq. 3 *sums* over the N anchors; unlike eq. 2's CE it has no
  1/N. ``reduction="sum"`` (default) is eq. 3 exactly, so the term grows with
  the batch size and λ must be re-tuned when it changes (the paper: batch 16).
  ``reduction="mean"`` divides that sum by N (every example, not only anchors
  with positives), which puts it on the scale of the mean CE and makes λ
  batch-size independent.
- An anchor alone in its class (N_{y_i} − 1 = 0) has no positive; eq. 3's term
  would be 0/0, and it contributes 0 (it still appears as a negative, k ≠ i,
  for the others). A batch with no same-label pair gives exactly 0, with a
  gradient of zeros (not NaN).
- Φ: ``embedding="pooled"`` (default) is the sentence embedding the heads read
  (``ModelConfig.pooling``: BERT pooler over [CLS] by default, the paper's
  choice; "cls" raw [CLS]; "mean"); ``"head_input"`` is the head's input
  (B1's [shared, own] features). With Match-Tuning active both are the
  matched embeddings z, since the model stores what the head read.
- Tasks: SST (5 classes) and paraphrase (labels 0/1 from ``batch["labels"]``), as classes by the task's kind
  (``CLASSES``). A paraphrase example must have ONE vector, as in the paper's
  [CLS] a [SEP] b [SEP] setup: ``pair_encoding="cross"`` (either embedding),
  or ``arch="b1"`` Siamese with ``embedding="head_input"`` (the products-plus-
  raw-embeddings pair vector). The baseline Siamese paraphrase head has no pair vector
  (only the two sentences' embeddings, whose label is a property of the pair,
  not of either sentence), so SCL on "para" there raises at construction: what a head gives is the model's
  ``feature_names``. STS (regression) has no classes and is refused.
- Computed in float32 with autocast off: logits Φ·Φ/τ reach ±1/τ, and bf16
  (8 significant bits) would round them by up to 1/32 near 1/τ = 10; fp16
  (11 bits, a 5-bit exponent) by 1/256, and its exp() would overflow past 11.

Related losses: SupConLoss of Khosla et al. (the vision form: mean over anchors
with positives), KNN-BERT's L'_sc (same loss against a MoCo queue), MNR and
SimCSE (``mnr.py``, ``simcse.py``: one positive per anchor).

Usage:
    loss = scl_loss(features, labels, temperature=0.3)
    objs = build_objectives({"scl": {"weight": 0.1, "temperature": 0.3}}, model)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tasks.objectives import Objective, ObjectiveConfig, kind_rule
from tasks.options import option
from tasks.runtime import full_precision
from tasks.task import Binary, Classes

SCL_TASKS = ("sst", "para")
EMBEDDINGS = ("pooled", "head_input")
REDUCTIONS = ("sum", "mean")


def scl_loss(features: torch.Tensor, labels: torch.Tensor, temperature: float = 0.3,
             reduction: str = "sum") -> torch.Tensor:
    """Gunel et al. eq. 3 on ``features`` (N, D) with class ids ``labels`` (N,).

    features are l2-normalized here. reduction: "sum" over anchors (eq. 3) or
    "mean" (that sum / N). Anchors without a same-label partner contribute 0.
    Returns a float32 scalar.
    """
    if features.dim() != 2 or labels.shape != features.shape[:1]:
        raise ValueError(f"scl_loss expects features (N, D) and labels (N,), got {tuple(features.shape)} "
                         f"and {tuple(labels.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    n = features.shape[0]
    with full_precision(features.device):
        phi = F.normalize(features.float(), dim=-1)  # (N, D)
        self_mask = torch.eye(n, dtype=torch.bool, device=features.device)  # (N, N)
        positives = (labels.view(-1, 1) == labels.view(1, -1)) & ~self_mask  # (N, N): j ≠ i, y_j = y_i
        n_pos = positives.sum(1)  # (N,) N_{y_i} − 1
        logits = (phi @ phi.T) / temperature  # (N, N)
        # k ≠ i in the denominator. The most negative float rather than −inf: e^{min − max} is exactly 0 all the
        # same, and a batch of one (a row with nothing but its own masked entry) keeps a finite logsumexp, so
        # "no anchor has a positive" needs no branch (no host read): it falls out as 0 with a zero gradient.
        logits = logits.masked_fill(self_mask, torch.finfo(logits.dtype).min)
        log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)  # (N, N); diagonal hugely negative
        pos_log_prob = torch.where(positives, log_prob, torch.zeros_like(log_prob)).sum(1)  # (N,)
        per_anchor = -pos_log_prob / n_pos.clamp_min(1)  # (N,); 0 where n_pos = 0
        total = per_anchor.sum()
        return total / n if reduction == "mean" else total


@dataclass
class SCLConfig(ObjectiveConfig):
    """Options of the "scl" objective (CLI: ``--scl-<field>``)."""

    weight: float = option(0.1, "λ of eq. 1: the SCL term gets λ, the head's CE/BCE gets 1 − λ")
    temperature: float = option(0.3, "τ of eq. 3 (paper: lower = harder negatives; try 0.1–0.7)")
    embedding: str = option("pooled", "Φ: \"pooled\" sentence/pair embedding ([CLS] pooler by default) or \"head_input\"")
    reduction: str = option("sum", "\"sum\" over anchors = eq. 3 exactly; \"mean\" = sum / batch size")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.weight <= 1.0:
            raise ValueError(f"scl weight is λ of (1 − λ)·CE + λ·SCL and must be in [0, 1], got {self.weight}")
        if not self.temperature > 0:
            raise ValueError(f"scl temperature must be positive, got {self.temperature}")
        if self.embedding not in EMBEDDINGS:
            raise ValueError(f"scl embedding must be one of {EMBEDDINGS}, got {self.embedding!r}")
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"scl reduction must be one of {REDUCTIONS}, got {self.reduction!r}")


# A batch's labels as class ids, by the kind of task (the kinds SCL takes): a one-logit head's 0./1. BCE targets
# rounded
CLASSES = {Classes: lambda labels: labels.long(), Binary: lambda labels: labels.round().long()}


def feature_problem(model: nn.Module, task: str, embedding: str) -> str | None:
    """Why ``task``'s head in ``model`` gives no single vector per example for ``embedding`` (a Siamese pair head
    gives each sentence's, and a pair vector only where it builds one); None if it gives one."""
    gives = model.feature_names(task)
    if embedding in gives:
        return None
    cfg = model.config
    return (f"scl on {task!r} needs one vector per sentence pair, but pair_encoding={cfg.pair_encoding!r} with "
            f"arch={cfg.arch!r} and embedding={embedding!r} has none (its head gives {', '.join(gives)}). Use "
            f"pair_encoding='cross', or arch='b1' with embedding='head_input', or restrict scl's tasks")


class SupervisedContrastive(Objective):
    """SCL (Gunel et al.): (1 − λ)·head loss + λ·L_SCL on SST and paraphrase batches."""

    name = "scl"
    Config = SCLConfig
    option_names = frozenset(("weight", "tasks", "temperature", "embedding", "reduction"))  # at options_version 1
    kinds = ("sentence-classification", "pair-classification")
    tasks = SCL_TASKS
    batch_coupled = True  # contrasts the batch's examples

    def __init__(self, config: SCLConfig, model: nn.Module | None = None):
        super().__init__(config, model)
        if hasattr(model, "feature_names"):  # built with the model it trains, not for a config's check
            for t in self.active_tasks():
                trains_a_head = t in model.tasks or t in model.stream_heads
                problem = feature_problem(model, t, config.embedding) if trains_a_head else None
                if problem:
                    raise ValueError(problem)

    @property
    def task_loss_scale(self) -> float:
        return 1.0 - float(self.config.weight)

    def forward(self, model: nn.Module, task: str, batch: dict, out) -> dict[str, torch.Tensor]:
        # it contrasts the classes of a classification
        as_classes = kind_rule("scl", CLASSES, task, model.kind_of(task))
        if out is None:
            raise ValueError("scl needs the head's output (its features) for the batch")
        if "labels" not in batch:
            raise ValueError(f"scl needs labels in the {task} batch")
        key = self.config.embedding
        if key not in out.features:
            problem = feature_problem(model, task, key) if hasattr(model, "feature_names") else None
            raise ValueError(problem or f"scl: the {task} head gave no {key!r} features ({sorted(out.features)})")
        loss = scl_loss(out.features[key], as_classes(batch["labels"]), self.config.temperature,
                        self.config.reduction)
        return {"loss": loss}
