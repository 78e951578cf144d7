"""Unsupervised SimCSE: InfoNCE between two dropout views of the same sentences.

Paper: Gao, Yao and Chen, "SimCSE: Simple Contrastive Learning of Sentence
Embeddings" (EMNLP 2021), eq. 1 with dropout as the only augmentation; used as
in ../shared/papers/minbert-downstream-generalization.txt §4.4 ("Unsupervised
SimCSE", the STS task of B1, §5.4). The minbert paper swaps cosine for the dot
product; both are here (``similarity``).

Each sentence x_i is encoded twice in train mode, z_i and z'_i differ only by
their dropout masks, and every other sentence of the batch is a negative::

    L = -1/N Σ_i log( e^{sim(z_i, z'_i)/τ} / Σ_j e^{sim(z_i, z'_j)/τ} )

sim = cosine (default, τ = 0.05) or dot product. τ divides either similarity;
with ``similarity="dot"`` set τ near 1 (unnormalized dot products of pooled
BERT vectors are large; sentence-transformers likewise recommends scale 1 for dot).

Choices made here:
- Two fresh ``model.embed`` passes, not the head's own pooled embedding as the
  first view: the head's features may have been transformed (Match-Tuning) or
  computed without dropout, and reusing them would silently change the
  objective. Both views come from one encoder pass over the batch stacked with
  itself (2B rows; dropout masks are drawn per row, so the views are independent).
- The embedding is the pooled sentence embedding the heads read
  (``ModelConfig.pooling``; Gao et al. use [CLS] with an MLP, which the BERT pooler is).
- Pair batches (Siamese keys _1/_2, NLI _1/_2/_3): each side is its own SimCSE
  batch and the sides' losses are averaged. Concatenating the sides would make a
  sentence's partner (often a paraphrase, STS label 5, or an entailment) a negative.
- In eval mode (no dropout) the two views are identical; the loss then only
  pushes different sentences apart. Train mode is where it is meant to run.
- Precision: cosine similarities over τ = 0.05 are within ±20, inside fp16's range under fp16 autocast (a GPU
  without native bf16); so are the dot products of the B presets' form (τ 1, the pooler's output, whose tanh bounds
  a dot by H: 384 for MiniLM, 768 for bert-base). The cross-entropy over them runs in float32 (autocast's rule).

Related losses: ``mnr.py`` (the same InfoNCE between paired sentences; SimCSE
with cosine is MNR with scale 1/τ between the two views), sentence-transformers
``MultipleNegativesRankingLoss`` used with duplicated sentences, SCL, RIFT's InfoNCE.

Usage:
    loss = simcse_loss(z1, z2, temperature=0.05, similarity="cos")
    objs = build_objectives({"simcse": {"similarity": "dot", "temperature": 1.0}}, model)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tasks.model import NLI
from tasks.task import MULTITASK
from tasks.objectives import Objective, ObjectiveConfig
from tasks.options import option

logger = logging.getLogger(__name__)

SIMILARITIES = ("cos", "dot")
SIMCSE_TASKS = (*MULTITASK, NLI)


def simcse_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.05,
                similarity: str = "cos") -> torch.Tensor:
    """InfoNCE of views ``z1`` (N, D) against ``z2`` (N, D): row i's positive is z2[i], the rest negatives.

    similarity: "cos" (cosine) or "dot" (dot product); both divided by ``temperature``.
    Computed in float32 whatever the embeddings' dtype.
    """
    if z1.dim() != 2 or z1.shape != z2.shape:
        raise ValueError(f"simcse_loss expects two views of equal shape (N, D), got {tuple(z1.shape)} "
                         f"and {tuple(z2.shape)}")
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
    z1, z2 = z1.float(), z2.float()
    if similarity == "cos":
        z1, z2 = F.normalize(z1, dim=-1), F.normalize(z2, dim=-1)
    logits = (z1 @ z2.T) / temperature  # (N, N)
    return F.cross_entropy(logits, torch.arange(z1.shape[0], device=z1.device))


@dataclass
class SimCSEConfig(ObjectiveConfig):
    """Options of the "simcse" objective (CLI: ``--simcse-<field>``)."""

    temperature: float = option(0.05, "τ dividing the similarities (Gao et al.: 0.05 with cosine)")
    similarity: str = option("cos", "\"cos\" (Gao et al.) or \"dot\" (the minbert paper's choice; use τ ≈ 1)")
    tasks: tuple[str, ...] = option(("sts",), "which task batches' sentences to use (paper B1: STS)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"simcse similarity must be one of {SIMILARITIES}, got {self.similarity!r}")
        if not self.temperature > 0:
            raise ValueError(f"simcse temperature must be positive, got {self.temperature}")


class SimCSE(Objective):
    """Unsupervised SimCSE on the sentences of the chosen task batches."""

    name = "simcse"
    Config = SimCSEConfig
    option_names = frozenset(("weight", "tasks", "temperature", "similarity"))  # at options_version 1
    # any kind's sentences: it reads a batch's token ids, never its labels nor a head's outputs
    kinds = ("sentence-classification", "pair-classification", "sentence-regression", "pair-regression")
    tasks = SIMCSE_TASKS
    default_tasks = ("sts",)
    batch_coupled = True  # in-batch negatives

    def __init__(self, config: SimCSEConfig, model: nn.Module | None = None):
        super().__init__(config, model)
        enc_cfg = getattr(getattr(model, "encoder", None), "config", None)
        if enc_cfg is not None and enc_cfg.hidden_dropout_prob == 0 and enc_cfg.attention_probs_dropout_prob == 0:
            logger.warning("simcse: the encoder has no dropout, so both views are identical and SimCSE only "
                           "pushes different sentences apart")

    def forward(self, model: nn.Module, task: str, batch: dict, out) -> dict[str, torch.Tensor]:
        sides = [s for s in ("", "_1", "_2", "_3") if "input_ids" + s in batch]
        if not sides:
            raise ValueError(f"simcse: no input_ids in the {task} batch (keys {sorted(batch)})")
        losses = []
        for s in sides:
            ids, mask = batch["input_ids" + s], batch["attention_mask" + s]
            types = batch.get("token_type_ids" + s)
            z = model.embed(_twice(ids), _twice(mask), _twice(types))  # (2B, H), independent dropout per row
            z1, z2 = z.chunk(2)  # the two views, (B, H) each
            losses.append(simcse_loss(z1, z2, self.config.temperature, self.config.similarity))
        return {"loss": torch.stack(losses).mean()}


def _twice(x: torch.Tensor | None) -> torch.Tensor | None:
    """The batch stacked on itself, (2B, T): every sentence twice."""
    return None if x is None else torch.cat([x, x])
