"""Multiple negatives ranking (MNR) loss: in-batch softmax over scaled cosine similarities.

Paper: Henderson et al. 2017, "Efficient natural language response suggestion
for Smart Reply"; used as in ../shared/papers/minbert-downstream-generalization.txt
§4.4 (L_MNR and its STS variant L_MNR-weighted) and §4.2 (AllNLI triplets
trained "purely with MNR loss" through the STS head).

For anchors a_i and positives b_i (i = 1..K), optionally hard negatives n_i::

    L = -1/K Σ_i w_i · log( e^{s·cos(a_i, b_i)} / (Σ_j e^{s·cos(a_i, b_j)} + Σ_j e^{s·cos(a_i, n_j)}) )

with scale s = 20 (temperature 0.05, sentence-transformers' default) and w_i = 1.
Every other positive (and every hard negative) of the batch is a negative for a_i;
hard negatives are extra columns of the similarity matrix.

STS variant (§4.4, L_MNR-weighted): STS pairs are not all positives, so pair i
is weighted by w_i = e^{label_i} / Σ_{j=0..5} e^j (label in [0, 5]) and the
weighted terms are averaged over the K pairs, exactly the paper's equation.
Note this is *not* normalized by Σ_i w_i: a batch of dissimilar pairs (all
labels near 0) contributes almost nothing instead of being pulled together at
full strength; with all labels equal to l the loss is the plain one times
e^l / Σ_j e^j.

Inputs (one objective, three task streams):
- ``sts``: the head's Siamese STS embeddings ``out.features["cos_1"/"cos_2"]``
  (the vectors whose cosine is the prediction); label weighting on by default.
- ``nli``: triplets (_1 anchor, _2 entailed positive, _3 contradiction) encoded
  here through the STS head (``model.pair_embeddings("sts", model.embed(...))``), the
  hard negative used when present and ``hard_negatives`` is on.
- ``para`` (opt-in, ``para_positives``): the pairs labelled paraphrase in the
  batch, on the pooled sentence embeddings (``masked_mnr_loss``: a mask, not an
  index, so the batch's positives are never counted on the host); a batch with
  fewer than 2 positives gives a term of exactly 0 (so the logged mean of
  ``para/mnr.loss`` counts those batches as 0).
- Precision: the similarities are cosines times the scale (20), within ±20 under any autocast (bf16, fp16), so
  they stay in autocast's precision; the softmax cross-entropy over them runs in float32 (autocast's rule for it).

Related losses: sentence-transformers ``MultipleNegativesRankingLoss`` (this,
unweighted, equals its default query_to_doc form; tests check it),
``CachedMultipleNegativesRankingLoss`` (same loss, larger batches), SimCSE
(``simcse.py``: MNR between two dropout views of the same sentences), SCL.

Usage:
    loss = mnr_loss(anchors, positives, negatives=hard_negs, scale=20.0)
    objs = build_objectives({"mnr": {"para_positives": True}}, model)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from tasks.model import NLI
from tasks.task import PACKAGE, Binary, Scores, Tasks, with_triplets
from tasks.objectives import Objective, ObjectiveConfig, kind_rule
from tasks.options import option

MNR_TASKS = ("sts", NLI, "para")
# Σ_{j=0..5} e^j: the §4.4 normaliser of the STS label weights.
_STS_WEIGHT_NORM = sum(math.exp(j) for j in range(6))


def mnr_loss(a: torch.Tensor, b: torch.Tensor,
             negatives: torch.Tensor | Sequence[torch.Tensor] | None = None,
             scale: float = 20.0, weights: torch.Tensor | None = None) -> torch.Tensor:
    """MNR loss of anchors ``a`` (K, D) against positives ``b`` (K, D).

    negatives: hard negatives, one (K, D) tensor or a sequence of them; each
    adds K columns to the similarity matrix (negative j is a candidate for
    every anchor, as in sentence-transformers).
    scale: multiplies the cosine similarities (1 / temperature).
    weights: (K,) per-pair factors; the result is mean_i(w_i · ℓ_i), so ones
    give the plain loss.
    Computed in float32 whatever the embeddings' dtype (logits up to ±scale).
    """
    if a.dim() != 2 or a.shape != b.shape:
        raise ValueError(f"mnr_loss expects anchors and positives of equal shape (K, D), got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    if negatives is None:
        negs: list[torch.Tensor] = []
    elif isinstance(negatives, torch.Tensor):
        negs = [negatives]
    else:
        negs = list(negatives)
    for n in negs:
        if n.dim() != 2 or n.shape[1] != a.shape[1]:
            raise ValueError(f"hard negatives must be (N, {a.shape[1]}), got {tuple(n.shape)}")
    candidates = torch.cat([b, *negs], dim=0).float()  # (K·(1+N), D): positives first, then each negative column
    sim = F.normalize(a.float(), dim=-1) @ F.normalize(candidates, dim=-1).T  # (K, K·(1+N)) cosine
    target = torch.arange(a.shape[0], device=a.device)  # anchor i's positive is column i
    per_pair = F.cross_entropy(scale * sim, target, reduction="none")  # (K,)
    if weights is None:
        return per_pair.mean()
    if weights.shape != per_pair.shape:
        raise ValueError(f"weights must be ({a.shape[0]},), got {tuple(weights.shape)}")
    return (weights.to(per_pair.dtype) * per_pair).mean()


def masked_mnr_loss(a: torch.Tensor, b: torch.Tensor, keep: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """``mnr_loss(a[keep], b[keep], scale=scale)`` with static shapes: ``keep`` (K,) bool is never read on the host.

    Pairs outside ``keep`` are neither anchors nor candidates: their columns are
    masked out of every row (each row keeps its own column, so every row stays
    finite) and their rows get weight 0; the mean is over the kept pairs. With
    fewer than two kept pairs the result is exactly 0 with a zero gradient (one
    pair alone has no negative; none has nothing to rank), where the indexed form
    would rank nothing. Boolean indexing would need the count of kept pairs on the
    host: one device sync per batch.
    """
    if a.dim() != 2 or a.shape != b.shape or keep.shape != a.shape[:1]:
        raise ValueError(f"masked_mnr_loss expects a, b (K, D) and keep (K,), got {tuple(a.shape)}, "
                         f"{tuple(b.shape)} and {tuple(keep.shape)}")
    k = a.shape[0]
    keep = keep.bool()
    sim = F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T  # (K, K) cosine
    own = torch.eye(k, dtype=torch.bool, device=a.device)  # (K, K)
    logits = (scale * sim).masked_fill(~(keep[None, :] | own), float("-inf"))  # (K, K): kept columns + own
    per_pair = F.cross_entropy(logits, torch.arange(k, device=a.device), reduction="none")  # (K,)
    w = keep.to(per_pair.dtype)  # (K,)
    return (w * per_pair).sum() / w.sum().clamp_min(1.0)


def sts_label_weights(labels: torch.Tensor) -> torch.Tensor:
    """§4.4 weights of STS pairs: e^{label} / Σ_{j=0..5} e^j (label 5 -> 0.634, label 0 -> 0.004)."""
    return torch.exp(labels.float()) / _STS_WEIGHT_NORM


def similar_pairs(cfg: MNRConfig, model: nn.Module, task: str, batch: dict, out) -> torch.Tensor:
    """A similarity's pairs: the embeddings its cosine scores, weighted by their labels (§4.4)."""
    a, b = _pair_features(model, task, batch, out, cosine=True)
    weights = None
    if cfg.sts_label_weighting:
        if "labels" not in batch:
            raise ValueError("mnr: sts_label_weighting needs the STS batch's labels")
        weights = sts_label_weights(batch["labels"])
    return mnr_loss(a, b, scale=cfg.scale, weights=weights)


def positive_pairs(cfg: MNRConfig, model: nn.Module, task: str, batch: dict, out) -> torch.Tensor:
    """A one-logit pair classification's positive pairs (paraphrases), by their pooled embeddings; 0 with fewer than
    two positives."""
    positive = batch["labels"] > 0.5  # (B,) bool
    a, b = _pair_features(model, task, batch, out, cosine=False)
    return masked_mnr_loss(a, b, positive, scale=cfg.scale)


# What MNR ranks of a pair task's batch, by its kind (the kinds MNR takes); a pair classification of more than two
# classes has no positive pairs to rank (``check_run``)
PAIRS = {Scores: similar_pairs, Binary: positive_pairs}


@dataclass
class MNRConfig(ObjectiveConfig):
    """Options of the "mnr" objective (CLI: ``--mnr-<field>``)."""

    scale: float = option(20.0, "multiplies cosine similarities; 1 / temperature (20 = 0.05)")
    sts_label_weighting: bool = option(True, "STS pairs weighted by e^label / Σ_{j=0..5} e^j (§4.4); off = plain MNR")
    hard_negatives: bool = option(True, "NLI: use the contradiction (_3) as an extra column when the batch has it")
    para_positives: bool = option(False, "also MNR over the paraphrase-labelled Quora pairs (pooled embeddings)")
    tasks: tuple[str, ...] = option((), "task streams; empty = (\"sts\", \"nli\") plus \"para\" with para_positives")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.scale > 0:
            raise ValueError(f"mnr scale must be positive, got {self.scale}")
        package = PACKAGE  # a config naming the package's streams alone is judged now; one naming a run's: check_run
        if all(t in package or t == NLI for t in self.tasks):
            self.check_positives(package)

    def check_positives(self, entries: Tasks) -> None:
        """A pair classification among ``tasks`` (of ``entries``) and ``para_positives`` must agree."""
        if self.tasks and any(t in entries and PAIRS.get(type(entries[t].kind)) is positive_pairs
                              for t in self.tasks) != self.para_positives:
            raise ValueError("mnr: a pair classification ('para') in tasks and para_positives must agree "
                             "(para_positives chooses MNR over its positive pairs); set both or neither")


class MultipleNegativesRanking(Objective):
    """MNR on STS pairs (label-weighted), NLI triplets and optionally paraphrase positives."""

    name = "mnr"
    Config = MNRConfig
    option_names = frozenset((  # at options_version 1
        "weight", "tasks", "scale", "sts_label_weighting", "hard_negatives", "para_positives"))
    kinds = ("pair-regression", "pair-classification")  # sentence pairs
    tasks = MNR_TASKS
    default_tasks = ("sts", NLI)  # and "para" with para_positives
    batch_coupled = True  # in-batch negatives
    needs_siamese: ClassVar[bool] = True  # compares separately encoded sentences: refused with --pair-encoding cross

    @classmethod
    def tasks_of(cls, config: MNRConfig) -> tuple[str, ...]:
        if config.tasks:
            return tuple(config.tasks)
        return cls.default_tasks + (("para",) if config.para_positives else ())

    @classmethod
    def check_run(cls, config: MNRConfig, run_config: Any) -> None:
        """A pair classification of more than two classes has no positive pairs to rank: refused (its kind, the
        only one of ``kinds`` that MNR has no rule for)."""
        entries = run_config.entries
        config.check_positives(entries)
        many = [t for t in cls.tasks_of(config) if t in run_config.tasks and type(entries[t].kind) not in PAIRS]
        if many:
            raise ValueError(f"mnr ranks a pair classification's positive pairs, which needs two classes, and task "
                             f"{many[0]!r} has {entries[many[0]].num_classes}")

    def forward(self, model: nn.Module, task: str, batch: dict, out) -> dict[str, torch.Tensor]:
        cfg = self.config
        if task == NLI:  # through the embeddings of the head whose entry declares the triplets (STS's: paper §4.2)
            sides = ["_1", "_2"] + (["_3"] if cfg.hard_negatives and "input_ids_3" in batch else [])
            pooled = _embed_sides(model, batch, sides)
            head = with_triplets(model.entries, model.tasks)
            if head is None:
                raise ValueError(f"mnr: no task of the model ({', '.join(model.tasks)}) declares NLI triplets")
            z = [model.pair_embeddings(head.name, e) for e in pooled]  # each (B, D)
            return {"loss": mnr_loss(z[0], z[1], negatives=z[2:] or None, scale=cfg.scale)}
        return {"loss": kind_rule("mnr", PAIRS, task, model.kind_of(task))(cfg, model, task, batch, out)}


def _pair_features(model: nn.Module, task: str, batch: dict, out, *, cosine: bool
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Siamese features of the head's pass (computed here when ``out`` is None): with ``cosine`` the embeddings
    whose cosine scores ``task`` (features ``cos_1``/``cos_2``), else the pooled sentences (``pooled_1``/``_2``)."""
    name = "cos" if cosine else "pooled"
    if out is not None:
        if f"{name}_1" not in out.features:
            raise ValueError(f"mnr needs Siamese features '{name}_1'/'{name}_2' (pair_encoding='siamese'); "
                             f"the head gave {sorted(out.features)}")
        return out.features[f"{name}_1"], out.features[f"{name}_2"]
    e1, e2 = _embed_sides(model, batch, ["_1", "_2"])
    if cosine:
        return model.pair_embeddings(task, e1), model.pair_embeddings(task, e2)
    return e1, e2


def _embed_sides(model: nn.Module, batch: dict, sides: list[str]) -> list[torch.Tensor]:
    """Pooled embeddings (B, H) of several sequence keys in one encoder pass.

    The sides are padded to a common length and stacked (one (S·B, T) batch: bigger
    matmuls, one launch per layer); padding is masked, so each row's embedding is
    what a separate pass would give.
    """
    T = max(batch["input_ids" + s].shape[1] for s in sides)

    def padded(key: str, s: str) -> torch.Tensor:
        x = batch.get(key + s)
        if x is None:  # token types absent: all zeros
            x = torch.zeros_like(batch["input_ids" + s])
        return F.pad(x, (0, T - x.shape[1]))  # (B, T), pad value 0 (masked)

    ids = torch.cat([padded("input_ids", s) for s in sides])  # (S·B, T)
    mask = torch.cat([padded("attention_mask", s) for s in sides])
    types = torch.cat([padded("token_type_ids", s) for s in sides])
    return list(model.embed(ids, mask, types).chunk(len(sides)))  # S × (B, H)
