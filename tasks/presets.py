"""The paper's configurations (baseline, B1, B2, B3; minBERT paper §5.4) as data, applied to a TrainConfig.

Usage:
    cfg = apply_preset(TrainConfig(), "b1")      # python train_multitask.py --preset b1

From ../shared/papers/minbert-downstream-generalization.txt:
- common: 10 epochs (§5.3), batch size 16 (§4.4 "ours is just K = 16"),
  pairs scored in one order and STS by the head alone (the CPU default's
  --symmetric-eval and --sts-prior are not in the paper),
  lr 1e-5 (§4.1), encoder dropout 0.3 (§4.5 "keeping the main BERT
  model's dropout rate at 0.3"), every training and dev example (no caps),
  Siamese pairs on the pooled [CLS] (§4.1), no weight decay or gradient
  clipping (neither is used; §6 weight decay "did not work well").
- baseline (§4.1): linear heads with dropout 0.3, constant lr, the
  sequential schedule (one task's epoch after another).
- b3 (§5.4): the b1 architecture (shared FCN, non-linear heads, paraphrase
  structural change, FCN 256, §4.3) with head dropout 0.3, even batching
  and loss rescaling (para 0.1, §4.2), MNR on STS (label-weighted, §4.4) and
  unsupervised SimCSE on STS (dot product, §4.4), lr 1e-5 decayed by
  4e-7 per epoch (§4.5), no NLI.
- b2: b3 without head dropout. b1: b2 plus the AllNLI stream trained with
  MNR only (§4.2; pairs of entailed sentences, so no hard negatives).
Objectives a preset needs must be registered; ``TrainConfig.validate`` names any that is not.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from tasks.config import NLI, TrainConfig
from tasks.model import ModelConfig

# Settings every preset shares.
COMMON: dict[str, Any] = dict(epochs=10, batch_size=16, task_batch_size={}, lr=1e-5, encoder_dropout=0.3,
                              max_train_examples={}, dev_max_examples={}, weight_decay=0.0, grad_clip=0.0, nli=False,
                              loss_weights={}, objectives={}, symmetric_eval=False, sts_prior=0.0,
                              sst_prior=0.0)
_B_MODEL = dict(arch="b1", pair_encoding="siamese", pooling="pooler", fcn_size=256)
_B_COMMON: dict[str, Any] = dict(schedule="even", lr_schedule="epoch_decay", lr_decay=4e-7, loss_weights={"para": 0.1})
_SIMCSE = {"tasks": ["sts"], "similarity": "dot", "temperature": 1.0}

PRESETS: dict[str, dict[str, Any]] = {
    "baseline": dict(model=dict(arch="baseline", pair_encoding="siamese", pooling="pooler", head_dropout=0.3),
                     schedule="sequential", lr_schedule="constant"),
    "b1": dict(_B_COMMON, model=dict(_B_MODEL, head_dropout=0.0), nli=True,
               objectives={"mnr": {"tasks": ["sts", NLI], "hard_negatives": False}, "simcse": _SIMCSE}),
    "b2": dict(_B_COMMON, model=dict(_B_MODEL, head_dropout=0.0),
               objectives={"mnr": {"tasks": ["sts"], "hard_negatives": False}, "simcse": _SIMCSE}),
    "b3": dict(_B_COMMON, model=dict(_B_MODEL, head_dropout=0.3),
               objectives={"mnr": {"tasks": ["sts"], "hard_negatives": False}, "simcse": _SIMCSE}),
}


def apply_preset(cfg: TrainConfig, name: str) -> TrainConfig:
    """A copy of ``cfg`` with the paper's configuration ``name`` (baseline, b1, b2, b3)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    settings = copy.deepcopy({**COMMON, **PRESETS[name]})
    settings["model"] = ModelConfig(**settings["model"])
    return dataclasses.replace(cfg, **settings)
