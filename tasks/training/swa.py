"""SWA: stochastic weight averaging, the stage after training on the trainer's loop, and the hook that averages.

Paper: ../shared/papers/minbert-downstream-generalization.txt §4.6 "Stochastic
Weight Averaging" (after Izmailov et al.): "a few epochs of SWA at the end of
our model training ... for 5 epochs with a learning rate of 1e−5, and
implemented this with Pytorch's SWA modules".

Usage:
    run(TrainConfig(swa=SwaConfig(epochs=5)))      # python train_multitask.py --swa-epochs 5 [--swa-lr 1e-5]
    summary = trainer.fit()["swa"]                 # the Trainer runs the stage, with this module's ``Averaging`` hook

The stage:
1. Starts from the best checkpoint (weights and objectives' state), which
   the trainer loads when the stage starts: SWA averages around the best point found, not
   around the last epoch, which may already be past it.
2. Trains ``swa.epochs`` more epochs of the run's own schedule and loss at the
   constant learning rate ``swa.lr``, every parameter trainable (also after
   LP-FT), with a fresh AdamW: the best checkpoint's moments may belong to the
   other LP-FT stage, and Adam's bias correction makes a fresh start a
   well-scaled step of size ~lr. The epochs' batch orders are the schedule's
   plans for the epoch numbers after training (new and deterministic).
3. After each SWA epoch, ``torch.optim.swa_utils.AveragedModel.update_parameters``:
   the default equal average, so after N epochs the model is the mean of the
   N end-of-epoch snapshots (``n_averaged`` = N; the starting weights are not
   a snapshot, as in torch's recipe of averaging from swa_start on).
4. No batch-norm update: BERT and the heads use LayerNorm, which keeps no
   running statistics, so ``torch.optim.swa_utils.update_bn`` has nothing to
   do. Only parameters are averaged (``use_buffers=False``); the buffers are
   constants (position ids).
5. The averaged model is scored on the dev sets the epochs were scored on
   (so its score compares with the best epoch's), saved as checkpoint "swa"
   (its state.json carries the summary under "swa"; it is for --eval-only and
   ensembling, not --resume), and when its overall dev score is higher than the
   best epoch's it is the model whose predictions ``run`` writes; otherwise the
   best checkpoint is loaded back. Both scores are logged.
6. metrics.jsonl: one record per SWA epoch ({"stage": "swa", "swa_epoch", "train", ...})
   and one for the averaged model ({"stage": "swa", "swa_model": true, "score",
   "best_score", "used", ...}); the final record repeats it under "swa".

An interrupted SWA stage is not resumed mid-way: its epochs write no
checkpoint, so ``--resume`` of checkpoints/last (whose training epochs are
complete) runs the whole stage again. The stage runs on the trainer's loop
(tasks/training/trainer.py: its epochs, lr and records are the trainer's; hooks
see its steps and records as every epoch's); this hook adds the average, its
score and its checkpoint. Under torchrun every rank trains the SWA epochs on its
shards (as in training) and rank 0 scores and writes.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from torch.optim.swa_utils import AveragedModel

from tasks.evaluation.metrics import jsonable
from tasks.logs import score_text
from tasks.training.callbacks import Evaluation, Hook

logger = logging.getLogger(__name__)


SWA = "swa"  # the stage's name: the Trainer's ``stage`` in its epochs, their records' "stage"


def swa_wins(swa_score: float, best_score: float | None) -> bool:
    """Whether the averaged model replaces the best epoch: a finite score strictly above the best (a tie keeps it)."""
    if not math.isfinite(swa_score):
        return False
    return best_score is None or swa_score > best_score


class Averaging(Hook):
    """The SWA stage's own part, as a hook of its trainer: average the weights at the end of each SWA epoch; when
    training ends, score the average, save it as checkpoint "swa" and leave in the model what predicts (the
    average when ``used``, else the best checkpoint). ``summary`` is the stage's summary (None before)."""

    def __init__(self) -> None:
        self.averaged: AveragedModel | None = None
        self.start: dict[str, int] = {}  # the training position the stage started from
        self.summary: dict | None = None

    def on_epoch_start(self, trainer: Any) -> None:
        if trainer.stage != SWA or self.averaged is not None:
            return
        cfg, best = trainer.cfg, trainer.best or {"score": None, "epoch": None}
        self.start = {"epoch": trainer.epoch, "step": trainer.step, "global_step": trainer.global_step}
        self.averaged = AveragedModel(trainer.model)
        logger.info("SWA: %d epochs at constant lr %.1e from the best checkpoint (epoch %s, dev overall %s)",
                    cfg.swa.epochs, cfg.swa.lr, best["epoch"], score_text(best["score"]))

    def on_epoch_end(self, trainer: Any, record: dict) -> None:
        if self.averaged is not None and record["stage"] == SWA:
            self.averaged.update_parameters(trainer.model)

    def on_train_end(self, trainer: Any) -> None:
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
        if not used:
            trainer.load_best()
        logger.info("SWA average of %d epochs: dev overall %s vs best epoch %s: %s | predictions from %s",
                    summary["n_averaged"], score_text(summary["score"]), score_text(best["score"]),
                    " ".join(f"{k} {v:.4f}" for k, v in metrics.items()), "SWA" if used else "the best epoch")
        trainer.record({"stage": SWA, "swa_model": True, **summary})
        self.summary = summary
