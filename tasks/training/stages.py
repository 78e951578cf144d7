"""The stages of a fine-tuning run: spans of epochs on the trainer's one loop, each with its own optimizer, learning
rate and trainable parameters, run in order (``stages_of``): LP-FT's linear probing, fine-tuning, SWA.

A ``Stage`` says what its epochs train (the heads alone on a frozen encoder, or everything), their learning rate (the
run's schedule over the stage's own epochs, or a constant), and whether each epoch is scored on dev and checkpointed
(``evaluates``: then the best epoch is chosen among them); the trainer (tasks/training/trainer.py) asks the stage of
an epoch and holds no stage's if-chain. A stage that needs more (SWA's average) is a subclass.

LP-FT (paper ../shared/papers/minbert-downstream-generalization.txt §4.2, after Kumar et al. 2022): "we first tune
just the task heads, and then fine-tune the full model after initializing it from these weights". Our heads are not
purely linear (b1's shared FCN and MLP heads), as in the paper.
- Epochs are numbered across both stages: epochs 1..lpft.epochs are stage "lp", the next ``epochs`` stage "ft".
  Every metrics.jsonl epoch record carries its ``"stage"`` ("ft" for every epoch of a run without LP-FT; "lp" for
  every epoch of one with ``freeze_encoder``, the starter's part-1 "pretrain": heads on a frozen encoder).
- Stage "lp": every encoder parameter has ``requires_grad`` False, so the optimizer, built over trainable parameters
  only, never sees one (no update, no weight decay, no moments), and backward stops at the heads. The encoder is
  kept in eval mode: its dropout is off, so the heads learn from the pretrained model's features as they are.
  Everything outside the encoder (heads, shared layers, objectives' own parameters) trains; objectives still run
  (KNN-BERT's key model follows the frozen encoder; SimCSE's two passes, now identical, train nothing).
- Stage "ft": the encoder is unfrozen and a *fresh* AdamW is built over all trainable parameters, starting from
  stage 1's weights (not the best epoch's: LP-FT continues from where probing ended).
- Learning rate: each stage runs ``lr_schedule`` on its own, over its own epochs (warmup_linear warms up and decays to
  0 within each stage; epoch_decay counts the stage's epochs), with peak ``lpft.lr`` (default ``lr``) in "lp".
- Resume: the stage is a function of the position (the epoch), and the switch happens before the checkpoint at the
  end of the last "lp" epoch is written, so every checkpoint's optimizer belongs to its position's stage.

SWA (paper §4.6, after Izmailov et al.: "a few epochs of SWA at the end of our model training ... for 5 epochs with
a learning rate of 1e−5, and implemented this with Pytorch's SWA modules"):
1. Starts from the best checkpoint (weights and objectives' state), loaded when the stage starts: SWA averages around
   the best point found, not around the last epoch, which may already be past it.
2. Trains ``swa.epochs`` more epochs of the run's own schedule and loss at the constant learning rate ``swa.lr``,
   every parameter trainable (also after LP-FT), with a fresh AdamW (the best checkpoint's moments may belong to the
   other LP-FT stage; Adam's bias correction makes a fresh start a well-scaled step). The epochs' batch orders are
   the schedule's plans for the epoch numbers after training (new and deterministic).
3. After each SWA epoch ``torch.optim.swa_utils.AveragedModel.update_parameters``: the equal average of the N
   end-of-epoch snapshots (the starting weights are not one, as in torch's recipe of averaging from swa_start on).
4. No batch-norm update: BERT and the heads use LayerNorm, which keeps no running statistics. Only parameters are
   averaged (``use_buffers=False``); the buffers are constants (position ids).
5. The average is scored on the dev sets the epochs were scored on, saved as checkpoint "swa" (its state.json carries
   the summary under "swa"; for --eval-only and ensembling, not --resume), and when its overall dev score is higher
   than the best epoch's it is the model whose predictions ``run`` writes; otherwise the best checkpoint is loaded
   back. metrics.jsonl: one record per SWA epoch ({"stage": "swa", "swa_epoch", "train", ...}) and one for the
   average ({"stage": "swa", "swa_model": true, "score", "best_score", "used", ...}); the final record repeats it.
An interrupted SWA stage is not resumed mid-way: its epochs write no checkpoint, so ``--resume`` of checkpoints/last
(whose training epochs are complete) runs the whole stage again. Under torchrun every rank trains the SWA epochs on
its shards and rank 0 scores and writes.

Usage:
    stages = stages_of(cfg)                          # [lp,] ft[, swa]: each with its epochs and first epoch
    stage.lr_at(cfg, epoch, step, steps_per_epoch)   # its learning rate at a step of its epochs
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn
from torch.optim.swa_utils import AveragedModel

from tasks.evaluation.metrics import jsonable
from tasks.logs import score_text
from tasks.training.loop import Evaluation
from tasks.training.optim import warmup_linear

logger = logging.getLogger(__name__)


LP, FT, SWA = "lp", "ft", "swa"  # the stages' names: the trainer's ``stage`` in their epochs, their records' "stage"


@dataclass
class Stage:
    """A span of epochs with its own optimizer: ``epochs`` of them from the run's epoch ``first``, their peak learning
    rate ``lr`` under ``schedule`` (the run's lr_schedule over the stage's own epochs, or "constant"), the heads alone
    on a frozen encoder in eval mode (not ``trains_encoder``) or everything, and whether each epoch is scored on dev
    and checkpointed (``evaluates``). ``from_best``: it starts from the best checkpoint. Such a stage, and any whose
    epochs are not scored, is entered at its first epoch's start (after the previous epoch's checkpoints); any other
    is entered at the previous epoch's end, before its checkpoint, so that the checkpoint holds this stage's
    optimizer. ``begins``/``enters``: its log line when a run
    starts in it / when it is entered ({epoch}: the 1-based epoch, {tensors}: the trainable tensors)."""

    name: str
    epochs: int
    lr: float
    schedule: str
    trains_encoder: bool = True
    frozen_layers: int | None = None  # where it trains the encoder: the embeddings and the lowest N layers stay
    evaluates: bool = True
    first: int = 0
    from_best: bool = False
    begins: str = ""
    enters: str = ""

    def lr_at(self, cfg: Any, epoch: int, step: int, steps_per_epoch: int) -> float:
        """The learning rate of step ``step`` of the run's epoch ``epoch`` (one of this stage's)."""
        epoch -= self.first
        if self.schedule == "constant":
            return self.lr
        if self.schedule == "epoch_decay":
            return self.lr - cfg.lr_decay * epoch
        total = self.epochs * steps_per_epoch
        return warmup_linear(self.lr, epoch * steps_per_epoch + step, total, round(cfg.warmup * total))

    def set_trainable(self, model: nn.Module) -> None:
        """Freeze the encoder or unfreeze it (but its embeddings and ``frozen_layers`` lowest layers, where set), then
        put the model in this stage's train mode."""
        model.encoder.requires_grad_(self.trains_encoder)
        if self.trains_encoder and self.frozen_layers is not None:
            model.encoder.freeze_bottom(self.frozen_layers)
        self.train_mode(model)

    def train_mode(self, model: nn.Module) -> None:
        """Everything trains, except a frozen encoder, which stays in eval mode (no dropout)."""
        model.train()
        if not self.trains_encoder:
            model.encoder.eval()

    def title(self, epoch: int, training_epochs: int) -> str:
        """An epoch's title in the log: "epoch 2/3" (of the evaluated epochs), "SWA epoch 1/2"."""
        if self.evaluates:
            return f"epoch {epoch + 1}/{training_epochs}"
        return f"{self.name.upper()} epoch {epoch - self.first + 1}/{self.epochs}"

    def enter(self, trainer: Any) -> None:
        """Make the model and the optimizer this stage's (a fresh one) at an epoch boundary."""
        self.set_trainable(trainer.model)
        trainer.rebuild_optimizer()
        if self.enters:
            logger.info(self.enters.format(epoch=trainer.epoch + 1, tensors=len(trainer.params)))

    def end_epoch(self, trainer: Any, record: dict) -> None:
        """After an epoch of this stage is recorded (a stage of its own work: SWA's average)."""

    def finish(self, trainer: Any) -> None:
        """When training ends in this stage, before the hooks' on_train_end (SWA: score and keep the average)."""

    def summary(self) -> dict | None:
        """What the run's summary says of the stage (SWA's), None: nothing."""
        return None

    def final_model(self, trainer: Any) -> Path:
        """When training ended in this stage: load the model that predicts into the trainer and give its checkpoint.
        The best scored epoch's (``Trainer.load_best``): a stage whose epochs are not scored has nothing to hold
        against it, so its training shapes no prediction unless it says otherwise (SWA's average)."""
        return trainer.load_best()


def swa_wins(swa_score: float, best_score: float | None) -> bool:
    """Whether the averaged model replaces the best epoch: a finite score strictly above the best (a tie keeps it)."""
    if not math.isfinite(swa_score):
        return False
    return best_score is None or swa_score > best_score


class SwaStage(Stage):
    """SWA (the module's docstring): from the best checkpoint, the weights averaged at each epoch's end; when
    training ends the average is scored, saved as checkpoint "swa" and kept when it beats the best epoch."""

    def __init__(self, epochs: int, lr: float, first: int, frozen_layers: int | None = None) -> None:
        super().__init__(SWA, epochs, lr, "constant", trains_encoder=True, frozen_layers=frozen_layers,
                         evaluates=False, first=first, from_best=True)
        self.averaged: AveragedModel | None = None
        self.start: dict[str, int] = {}  # the training position the stage started from
        self._summary: dict | None = None

    def enter(self, trainer: Any) -> None:
        trainer.load_best()
        super().enter(trainer)
        cfg, best = trainer.cfg, trainer.best or {"score": None, "epoch": None}
        self.start = {"epoch": trainer.epoch, "step": trainer.step, "global_step": trainer.global_step}
        self.averaged = AveragedModel(trainer.model)
        logger.info("SWA: %d epochs at constant lr %.1e from the best checkpoint (epoch %s, dev overall %s)",
                    cfg.swa.epochs, cfg.swa.lr, best["epoch"], score_text(best["score"]))

    def end_epoch(self, trainer: Any, record: dict) -> None:
        if self.averaged is not None:
            self.averaged.update_parameters(trainer.model)

    def finish(self, trainer: Any) -> None:
        if self.averaged is None or not self.averaged.n_averaged:
            return
        cfg, averaged = trainer.cfg, self.averaged
        best = trainer.best or {"score": None, "epoch": None}
        t0 = time.perf_counter()
        metrics = trainer.evaluate_dev(averaged.module)
        eval_time = time.perf_counter() - t0
        trainer.emit("on_evaluate", Evaluation(SWA, metrics, eval_time))
        score = metrics.get("overall", math.nan)
        used = swa_wins(score, best["score"])
        summary = {"epochs": cfg.swa.epochs, "lr": cfg.swa.lr, "n_averaged": int(averaged.n_averaged),
                   "dev": jsonable(metrics), "score": score if math.isfinite(score) else None,
                   "best_score": best["score"], "best_epoch": best["epoch"], "used": used,
                   "dev_examples": {t: len(d) for t, d in trainer.dev_sets.items()},
                   "eval_time_s": round(eval_time, 2)}
        trainer.model.load_state_dict(averaged.module.state_dict())
        self.averaged = None
        # not a position to resume: its state.json holds the position training ended at, and the summary
        summary["checkpoint"] = str(trainer.save_checkpoint(SWA, extra_state={"swa": summary, **self.start}))
        logger.info("SWA average of %d epochs: dev overall %s vs best epoch %s: %s | predictions from %s",
                    summary["n_averaged"], score_text(summary["score"]), score_text(best["score"]),
                    " ".join(f"{k} {v:.4f}" for k, v in metrics.items()), "SWA" if used else "the best epoch")
        trainer.record({"stage": SWA, "swa_model": True, **summary})
        self._summary = summary

    def summary(self) -> dict | None:
        return self._summary

    def final_model(self, trainer: Any) -> Path:
        """The average where it scored higher than the best epoch (the model holds it since ``finish``), else the
        best epoch's."""
        if self._summary is not None and self._summary["used"]:
            return Path(self._summary["checkpoint"])
        return trainer.load_best()


def check_stages(stages: list[Stage]) -> None:
    """Stages a trainer can run, in order: one or more, each starting where the ones before it end (``first``), the
    scored ones first (the best epoch is chosen among them before any stage that is not scored). A ValueError
    naming the stage otherwise."""
    if not stages:
        raise ValueError("a trainer runs one stage or more")
    start, unscored = 0, None
    for stage in stages:
        if stage.first != start:
            raise ValueError(f"stage {stage.name!r} starts at epoch {stage.first + 1}; after the stages before it, it "
                             f"starts at epoch {start + 1} (first={start})")
        if stage.evaluates and unscored is not None:
            raise ValueError(f"stage {stage.name!r} is scored and comes after {unscored!r}, which is not: the best "
                             "epoch is chosen among the scored stages, which come first")
        if not stage.evaluates:
            unscored = stage.name
        start += stage.epochs


def stages_of(cfg: Any) -> list[Stage]:
    """The stages of a run with config ``cfg``, in order, each with its first epoch: with ``freeze_encoder`` one
    heads-only stage "lp" for every epoch; else LP-FT's "lp" for ``lpft.epochs`` (when on), then "ft" for ``epochs``;
    then with ``swa.epochs`` SWA's. Those that train the encoder keep ``freeze_layers`` frozen."""
    if cfg.freeze_encoder:
        stages: list[Stage] = [Stage(LP, cfg.epochs, cfg.lr, cfg.lr_schedule, trains_encoder=False,
                                     begins="frozen encoder: heads only for every epoch ({tensors} trainable "
                                            "tensors)")]
    else:
        stages = []
        if cfg.lpft.epochs:
            stages.append(Stage(LP, cfg.lpft.epochs, cfg.lpft.lr if cfg.lpft.lr is not None else cfg.lr,
                                cfg.lr_schedule, trains_encoder=False,
                                begins="LP-FT stage 1: heads only for epochs {epoch}-" + str(cfg.lpft.epochs)
                                       + " (encoder frozen, {tensors} trainable tensors), then " + str(cfg.epochs)
                                       + " epochs of full fine-tuning"))
        stages.append(Stage(FT, cfg.epochs, cfg.lr, cfg.lr_schedule, frozen_layers=cfg.freeze_layers,
                            first=cfg.lpft.epochs,
                            enters="LP-FT stage 2 from epoch {epoch}: full fine-tuning of {tensors} tensors with a "
                                   "fresh optimizer" if cfg.lpft.epochs else ""))
    if cfg.swa.epochs:
        stages.append(SwaStage(cfg.swa.epochs, cfg.swa.lr, sum(s.epochs for s in stages), cfg.freeze_layers))
    return stages


__all__ = ("FT", "LP", "SWA", "Stage", "SwaStage", "check_stages", "stages_of", "swa_wins")
