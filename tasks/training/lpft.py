"""LP-FT: linear probing, then full fine-tuning, as two stages of one training run.

Paper: ../shared/papers/minbert-downstream-generalization.txt §4.2 "LP-FT"
(after Kumar et al. 2022): "we first tune just the task heads, and then
fine-tune the full model after initializing it from these weights". Our heads
are not purely linear (b1's shared FCN and MLP heads), as in the paper.

Usage:
    run(TrainConfig(lpft=LpftConfig(epochs=2), epochs=3))   # 2 epochs heads only, then 3 of full fine-tuning
    python train_multitask.py --lp-epochs 2 --epochs 3

How the stages map onto the training loop (tasks/training/trainer.py):
- Epochs are numbered across both stages: epochs 1..lpft.epochs are stage "lp",
  the next ``epochs`` are stage "ft". Every metrics.jsonl epoch record carries
  its ``"stage"`` ("ft" for every epoch of a run without LP-FT).
- Stage "lp": every encoder parameter has ``requires_grad`` False, so the
  optimizer, built over trainable parameters only, never sees one (no update,
  no weight decay, no moments), and backward stops at the heads. The encoder
  is also kept in eval mode: its dropout is off, so the heads learn from the
  pretrained model's features as they are (linear probing uses fixed features;
  dropout in a frozen encoder would only add noise to the heads' inputs).
  Everything outside the encoder (heads, shared layers, objectives' own
  parameters) trains. Objectives still run: e.g. KNN-BERT's key model follows
  the (frozen) encoder; terms that act only through the encoder (SimCSE's
  two dropout passes, which are now identical) train nothing in this stage.
- Stage "ft": the encoder is unfrozen and a *fresh* AdamW is built over all
  trainable parameters, starting from stage 1's weights (not the best epoch's:
  LP-FT continues from where probing ended).
- Learning rate: each stage runs ``lr_schedule`` on its own, over its own
  epochs (warmup_linear warms up and decays to 0 within each stage;
  epoch_decay counts the stage's epochs), with peak ``lpft.lr`` (default
  ``lr``) in stage "lp" and ``lr`` in stage "ft".
- Best checkpoint: chosen on the dev score over all epochs of both stages
  (the project's one rule); the record of the best epoch names its stage.
- Resume: the stage is a function of the position (the epoch), and the
  switch happens before the checkpoint at the end of the last "lp" epoch is
  written, so every checkpoint's optimizer belongs to its position's stage:
  ``--resume`` continues exactly anywhere, mid-stage included. ``lpft.epochs``
  and ``lpft.lr`` may not change on resume (they decide what was trained).
"""

from __future__ import annotations

from typing import Any

from torch import nn

LP, FT = "lp", "ft"


def stage_at(cfg: Any, epoch: int) -> str:
    """The stage of 0-based ``epoch`` of a run with config ``cfg`` ("lp" or "ft"); every epoch of a run with
    ``freeze_encoder`` (the starter's part-1 "pretrain": heads on a frozen encoder) is stage "lp"."""
    return LP if epoch < cfg.lpft.epochs or cfg.freeze_encoder else FT


def stage_span(cfg: Any, epoch: int) -> tuple[int, int, float]:
    """(first epoch of the stage, number of epochs in it, its peak learning rate) for 0-based ``epoch``."""
    if cfg.freeze_encoder:
        return 0, cfg.epochs, cfg.lr
    if stage_at(cfg, epoch) == LP:
        return 0, cfg.lpft.epochs, cfg.lpft.lr if cfg.lpft.lr is not None else cfg.lr
    return cfg.lpft.epochs, cfg.epochs, cfg.lr


def set_stage(model: nn.Module, stage: str) -> None:
    """Freeze the encoder for stage "lp", unfreeze it for "ft"; then put the model in that stage's train mode."""
    if stage not in (LP, FT):
        raise ValueError(f"unknown LP-FT stage {stage!r}; stages are {LP!r} and {FT!r}")
    model.encoder.requires_grad_(stage == FT)
    train_mode(model, stage)


def train_mode(model: nn.Module, stage: str) -> None:
    """Training mode for ``stage``: everything trains, except a frozen encoder, which stays in eval (no dropout)."""
    model.train()
    if stage == LP:
        model.encoder.eval()

