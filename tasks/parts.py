"""What a Trainer trains: the model, objectives and datasets of a run, built from its TrainConfig.

Usage:
    parts = build_parts(cfg, device)           # seeded: the same initial weights for the same cfg.seed
    trainer = Trainer(cfg, parts, device=device)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from minbert.pretrained import load_pretrained, resolve_model_dir
from tasks.config import TrainConfig
from tasks.data import move_batch
from tasks.model import MultitaskBert
from tasks.objectives import Objective, build_objectives
from tasks.runtime import autocast_dtype, configure_device, seed_everything
from tasks.splits import load_run_data

OFFSET_INIT_PAIRS = 256  # training pairs (in file order) that start the baseline's paraphrase offset


@dataclass
class Parts:
    """What a Trainer trains: built from a TrainConfig by ``build_parts``, or by hand in tests."""

    model: MultitaskBert
    objectives: list[Objective]
    train_sets: dict[str, Any]
    dev_sets: dict[str, Any]
    tokenizer: Any = None
    encoder_dir: Path | None = None  # the pretrained directory: its tokenizer files go into every checkpoint
    amp_dtype: torch.dtype | None = None
    data: dict[str, dict] | None = None  # ReadReport.to_dict() of every file read, by "<task> <split>"


def build_parts(cfg: TrainConfig, device: torch.device) -> Parts:
    """Seed, then load the encoder, read and tokenize the data, build the model and objectives on ``device``.

    Seeding first makes the initial weights a function of ``cfg.seed`` alone (the same on every rank).
    """
    seed_everything(cfg.seed)
    amp_dtype = autocast_dtype(cfg.bf16, device)
    configure_device(device, cfg.deterministic)
    overrides: dict[str, Any] = {"gradient_checkpointing": cfg.gradient_checkpointing}
    if cfg.encoder_dropout is not None:
        overrides |= {"hidden_dropout_prob": cfg.encoder_dropout, "attention_probs_dropout_prob": cfg.encoder_dropout}
    encoder, tokenizer = load_pretrained(cfg.pretrained, config_overrides=overrides)
    encoder_dir = resolve_model_dir(cfg.pretrained)
    train_sets, dev_sets, data = load_run_data(cfg, tokenizer)
    model = MultitaskBert(encoder, cfg.model).to(device)
    if hasattr(model, "para_bias") and "para" in train_sets:  # the baseline's Siamese paraphrase offset
        pairs = train_sets["para"]
        model.init_para_offset(move_batch(pairs.collate(range(min(OFFSET_INIT_PAIRS, len(pairs)))), device))
    objectives = build_objectives(cfg.objectives, model)
    return Parts(model, objectives, train_sets, dev_sets, tokenizer, encoder_dir, amp_dtype, data)
