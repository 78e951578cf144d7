"""Match-Tuning: each pooled embedding is replaced by a softmax-weighted mix of the batch's.

Paper: Tong, Dong, Dai, Song, Liu, Chang and Sui, "Robust Fine-tuning via
Perturbation and Interpolation from In-batch Instances" (IJCAI 2022),
../shared/papers/match-tuning.txt §3.1, eq. 2–4, and Appendix B::

    M_ij = exp(h_i·h_j / T) / Σ_{k=1..n} exp(h_i·h_k / T)        (2; T from App. B)
    z_i  = Σ_j M_ij h_j           i.e. z = M h                     (3)
    g'   = 1/n ∇ Σ_i L(f(z_i), y_i)                                 (4)

What the paper fixes, and what we follow:
- h is the PLM output the classifier reads, NOT normalized: a raw dot product
  (the authors' released snippet: h = dense(h_[CLS]), then h hᵀ / temperature).
  Here h is the pooled embedding (B, H) the heads read (``ModelConfig.pooling``:
  the BERT pooler tanh(W h_[CLS]) by default, or raw [CLS], or mean).
- The sum over k includes k = i: M keeps its diagonal (the paper's Fig. 1/3
  track the "target (self)" weight), so each row of M is a distribution over
  the whole batch including the example itself, and z_i is a convex
  combination of the batch's h.
- Gradients flow through both M and h (nothing is detached).
- T: eq. 2 has no temperature, Appendix B grid-searches T ∈ {1, ..., 6}
  without reporting a best value. Default T = 1, the grid's sharpest: the
  embedded MiniLM's pooler outputs have small norms, so even T = 1 gives a
  nearly uniform M and larger T only flattens it further; raw [CLS]
  (``pooling="cls"``) has far larger norms, where M is nearly the identity at
  T = 1 and T decides how much is mixed. Larger T = more in-batch mixing
  ("perturbation").
- Pairs: with ``pair_encoding="cross"`` a pair is one sequence and one h. With
  Siamese pairs the model applies the transform to each side separately, so
  sentence-1 embeddings are matched among the batch's sentence-1s and
  sentence-2s among sentence-2s.
- Per device: under DistributedDataParallel the "batch" is the local batch.

Inference: the paper does not say. Eq. 4 defines only the training gradient,
and its experiments report no evaluation batch setup; the released code is a
5-line fragment with no train/eval branch. ``inference`` chooses:
- ``"identity"`` (default): no matching at evaluation, z = h. A prediction then
  depends only on its own input, not on which examples share its evaluation
  batch, the evaluation batch size or the order (evaluation batches are length
  sorted); it is also what the same transform does on a batch of one.
- ``"batch"``: the same matching over each evaluation batch, so the head sees
  inputs distributed as in training. Predictions then depend on the batch: use
  the training batch size for evaluation (M's diagonal shrinks as the batch
  grows) and expect the short last batch to be matched over fewer examples.
Chosen on dev, as ../shared/DESIGN.md asks: one checkpoint of a CPU-budget run
scored both ways, where batch matching at evaluation was no better than
identity and changed only a handful of predictions (experiments/RESULTS.md,
"Design choices measured once"). Hence identity: as good, and batch-independent.

Not an additive loss: the objective returns no terms. It changes the model:
building it installs ``BatchMatching`` as the model's pooled transform for its
tasks (``MultitaskBert.set_pooled_transform``), so every forward of the model
in training mode reads z = M h (the trainer's, and the extra passes other
objectives make), and evaluation applies it only with ``inference="batch"``.

Related: mixup (fixed random interpolation weights, mixes labels too);
SCL (``scl.py``: pulls same-label examples together with a loss rather than
by mixing); SMART/R3F (input/parameter noise instead of in-batch noise).

Usage:
    z = match_transform(h, temperature=1.0)       # (B, H) -> (B, H)
    build_objectives({"match_tuning": {"temperature": 2.0}}, model)   # installs the matching on model
    out = model(task, batch)                       # the head reads z = M h (train mode)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tasks.objectives import Objective, ObjectiveConfig
from tasks.options import option
from tasks.runtime import full_precision
from tasks.task import MULTITASK

MATCH_TASKS = MULTITASK
INFERENCE_MODES = ("identity", "batch")


def matching_matrix(h: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Eq. 2: M = softmax(h hᵀ / T) row-wise, diagonal included; (B, H) -> (B, B) float32."""
    if h.dim() != 2:
        raise ValueError(f"matching_matrix expects h of shape (B, H), got {tuple(h.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    with full_precision(h.device):
        hf = h.float()
        return torch.softmax((hf @ hf.T) / temperature, dim=-1)  # (B, B), rows sum to 1


def match_transform(h: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Eq. 2–3: z = softmax(h hᵀ / T) h, each z_i a convex combination of the rows of h; (B, H) -> (B, H).

    h is used as is (no normalization). Computed in float32 with autocast off
    (‖h‖² can be large and bf16 logits would be rounded), returned in h's dtype.
    """
    m = matching_matrix(h, temperature)  # (B, B)
    with full_precision(h.device):
        return (m @ h.float()).to(h.dtype)  # (B, H)


@dataclass
class MatchTuningConfig(ObjectiveConfig):
    """Options of the "match_tuning" objective (CLI: ``--match-tuning-<field>``)."""

    weight: float = option(1.0, "interface field only: Match-Tuning adds no loss term, so it must stay 1")
    temperature: float = option(1.0, "T dividing h hᵀ (paper App. B grid: 1–6)")
    inference: str = option("identity", "at evaluation: \"identity\" (z = h) or \"batch\" (match each eval batch)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.weight != 1.0:
            raise ValueError("match_tuning adds no loss term (it changes the forward), so its weight does "
                             f"nothing; leave it at 1, got {self.weight}")
        if not self.temperature > 0:
            raise ValueError(f"match_tuning temperature must be positive, got {self.temperature}")
        if self.inference not in INFERENCE_MODES:
            raise ValueError(f"match_tuning inference must be one of {INFERENCE_MODES}, got {self.inference!r}")


class BatchMatching(nn.Module):
    """z = M h in training; in evaluation the same matching over each evaluation batch ("batch") or z = h
    ("identity"). No parameters: it follows the model's train()/eval()."""

    def __init__(self, temperature: float, at_inference: bool) -> None:
        super().__init__()
        self.temperature, self.at_inference = temperature, at_inference

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return match_transform(h, self.temperature) if self.training or self.at_inference else h


class MatchTuning(Objective):
    """Match-Tuning: the model's heads read z = M h (``BatchMatching``, installed on the model); no loss terms."""

    name = "match_tuning"
    Config = MatchTuningConfig
    option_names = frozenset(("weight", "tasks", "temperature", "inference"))  # at options_version 1
    # every kind whose head reads pooled embeddings, as each kind's does: it changes them, never a head's outputs
    kinds = ("sentence-classification", "pair-classification", "sentence-regression", "pair-regression")
    tasks = MATCH_TASKS
    batch_coupled = True  # mixes the embeddings of the batch
    inference_options = ("inference",)

    def __init__(self, config: MatchTuningConfig, model: nn.Module | None = None) -> None:
        super().__init__(config, model)
        if model is not None:
            for head in dict.fromkeys(map(model.head_task, self.active_tasks())):  # SST's for sst and phrases
                model.set_pooled_transform(head, BatchMatching(config.temperature, config.inference == "batch"))

    def forward(self, model: nn.Module, task: str, batch: dict, out) -> dict[str, torch.Tensor]:
        return {}  # the effect is in the model's forward (its pooled transform), not in a loss term
