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
  without reporting a best value. Default T = 1, the grid's sharpest: on the
  embedded MiniLM the pooler outputs are small (‖h‖² ≈ 1.6, hidden 384; measured
  on 16 SST train sentences), so even T = 1 gives a near-uniform M (diagonal ≈
  0.11 at batch 16) and larger T only flattens it further. Raw [CLS]
  (``pooling="cls"``, ‖h‖² ≈ 55) gives diagonals 0.999 / 0.90 / 0.54 at
  T = 1 / 3 / 6. Larger T = more in-batch mixing ("perturbation").
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
Chosen on dev (DESIGN.md): one CPU-budget run (experiments/robustness_table.py,
SST + Quora, 1 epoch, mean pooling, T = 1, where M's diagonal averages 0.51 on
SST and 0.67 on Quora in a batch of 32), scored both ways from the same
checkpoint: identity 0.3996 SST / 0.7360 Quora (2,000-pair dev subset),
batch at evaluation batch 32 0.3996 / 0.7340; 2 of 1,101 SST and 6 of 2,000
Quora predictions changed. Hence identity: as good, and batch-independent.

Not an additive loss: the objective returns no terms. It changes the forward:
the trainer passes ``transform_for(task, training=True)`` as ``transform=`` to
the model's main forward for the batch (once: no second pass), and evaluation
passes ``transform_for(task, training=False)`` (``eval_transform()``: None for
"identity").

Related: mixup (fixed random interpolation weights, mixes labels too);
SCL (``scl.py``: pulls same-label examples together with a loss rather than
by mixing); SMART/R3F (input/parameter noise instead of in-batch noise).

Usage:
    z = match_transform(h, temperature=1.0)       # (B, H) -> (B, H)
    mt = build_objectives({"match_tuning": {"temperature": 2.0}}, model)[0]
    out = model(task, batch, transform=mt.transform_for(task, training=True))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from tasks.objectives import Objective, ObjectiveConfig, check_tasks
from tasks.training.runtime import full_precision

MATCH_TASKS = ("sst", "para", "sts")
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
    """Options of the "match_tuning" objective (CLI: ``--match_tuning-<field>``)."""

    weight: float = 1.0  # interface field only: Match-Tuning adds no loss term, so it must stay 1
    temperature: float = 1.0  # T dividing h hᵀ (paper App. B grid: 1–6)
    inference: str = "identity"  # at evaluation: "identity" (z = h) or "batch" (match each eval batch)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.weight != 1.0:
            raise ValueError("match_tuning adds no loss term (it changes the forward), so its weight does "
                             f"nothing; leave it at 1, got {self.weight}")
        if not self.temperature > 0:
            raise ValueError(f"match_tuning temperature must be positive, got {self.temperature}")
        if self.inference not in INFERENCE_MODES:
            raise ValueError(f"match_tuning inference must be one of {INFERENCE_MODES}, got {self.inference!r}")
        check_tasks("match_tuning", self.tasks, MATCH_TASKS)


class MatchTuning(Objective):
    """Match-Tuning: the trainer runs the head on z = M h (see ``transform_for``); no loss terms."""

    name = "match_tuning"
    Config = MatchTuningConfig
    tasks = MATCH_TASKS
    batch_coupled = True  # mixes the embeddings of the batch
    inference_options = ("inference",)
    train_transform: ClassVar[bool] = True  # the trainer must pass transform_for(task, True) to model(...)

    def transform(self, h: torch.Tensor) -> torch.Tensor:
        """z = M h for a batch of pooled embeddings h (B, H)."""
        return match_transform(h, self.config.temperature)

    def eval_transform(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """What evaluation passes as ``transform=``: None ("identity") or the matching ("batch")."""
        return self.transform if self.config.inference == "batch" else None

    def transform_for(self, task: str, training: bool) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The ``transform=`` for ``task``'s forward: the matching in training, ``eval_transform()`` in evaluation."""
        if not self.applies_to(task):
            return None
        return self.transform if training else self.eval_transform()

    def forward(self, model: nn.Module, task: str, batch: dict, out) -> dict[str, torch.Tensor]:
        return {}  # the effect is in the head's forward (transform=), not in a loss term
