"""SWA: stochastic weight averaging after training, a post-training phase of ``tasks.training.run.run``.

Paper: ../shared/papers/minbert-downstream-generalization.txt §4.6 "Stochastic
Weight Averaging" (after Izmailov et al.): "a few epochs of SWA at the end of
our model training ... for 5 epochs with a learning rate of 1e−5, and
implemented this with Pytorch's SWA modules".

Usage:
    run(TrainConfig(swa=SwaConfig(epochs=5)))      # python train_multitask.py --swa-epochs 5 [--swa-lr 1e-5]
    summary = run_swa(trainer)                     # after trainer.fit() and trainer.load_best(); run() does this

The phase:
1. Starts from the best checkpoint (weights and objectives' state), which
   ``run`` has just loaded: SWA averages around the best point found, not
   around the last epoch, which may already be past it.
2. Trains ``swa_epochs`` more epochs of the run's own schedule and loss at the
   constant learning rate ``swa_lr``, every parameter trainable (also after
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

An interrupted SWA phase is not resumed mid-way: ``--resume`` of
checkpoints/last (whose training epochs are complete) runs the whole phase
again. Trainer hooks do not run during SWA. The epochs run through the trainer's
own loop (``Trainer.run_epoch``), outside its position. Under torchrun every
rank trains the SWA epochs on its shards (as in training) and rank 0 scores and writes.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

from torch.optim.swa_utils import AveragedModel

from tasks.evaluation.metrics import jsonable
from tasks.logs import score_text
from tasks.training import lpft
from tasks.training.progress import RunningSums, progress_logging

if TYPE_CHECKING:
    from tasks.training.trainer import Trainer


logger = logging.getLogger(__name__)


def swa_wins(swa_score: float, best_score: float | None) -> bool:
    """Whether the averaged model replaces the best epoch: a finite score strictly above the best (a tie keeps it)."""
    if not math.isfinite(swa_score):
        return False
    return best_score is None or swa_score > best_score


def swa_epoch(trainer: Trainer, epoch: int, index: int) -> dict:
    """One SWA epoch of the schedule's plan for 0-based ``epoch`` at constant swa_lr; returns its record."""
    cfg = trainer.cfg
    plan = trainer.schedule.epoch_plan(epoch)
    sums = RunningSums()
    t0 = time.perf_counter()
    lpft.train_mode(trainer.model, lpft.FT)
    with progress_logging():
        trainer.run_epoch(plan, lambda k: cfg.swa.lr, sums, desc=f"SWA epoch {index + 1}/{cfg.swa.epochs}")
    means = sums.means()
    train_time = time.perf_counter() - t0
    logger.info("SWA epoch %d done in %.0f s: %s", index + 1, train_time,
                " ".join(f"{n} {v:.4f}" for n, v in means.items()))
    return {"epoch": epoch + 1, "stage": "swa", "swa_epoch": index + 1, "steps": len(plan), "lr": cfg.swa.lr,
            "train": means, "train_time_s": round(train_time, 2)}


def run_swa(trainer: Trainer) -> dict:
    """The SWA phase on a trained ``trainer`` whose model holds the best checkpoint; returns its summary.

    Afterwards the model holds what should predict: the average when ``used``, else the best checkpoint.
    """
    cfg = trainer.cfg
    best = trainer.best or {"score": None, "epoch": None}
    lpft.set_stage(trainer.model, lpft.FT)
    trainer.rebuild_optimizer()
    averaged = AveragedModel(trainer.model)
    logger.info("SWA: %d epochs at constant lr %.1e from the best checkpoint (epoch %s, dev overall %s)",
                cfg.swa.epochs, cfg.swa.lr, best["epoch"], score_text(best["score"]))
    for i in range(cfg.swa.epochs):
        record = swa_epoch(trainer, trainer.total_epochs + i, i)
        averaged.update_parameters(trainer.model)
        trainer.run_dir.append(record)

    t0 = time.perf_counter()
    metrics = trainer.evaluate_dev(averaged.module)
    score = metrics.get("overall", math.nan)
    used = swa_wins(score, best["score"])
    summary = {"epochs": cfg.swa.epochs, "lr": cfg.swa.lr, "n_averaged": int(averaged.n_averaged),
               "dev": jsonable(metrics), "score": score if math.isfinite(score) else None,
               "best_score": best["score"], "best_epoch": best["epoch"], "used": used,
               "dev_examples": {t: len(d) for t, d in trainer.dev_sets.items()},
               "eval_time_s": round(time.perf_counter() - t0, 2)}
    trainer.model.load_state_dict(averaged.module.state_dict())
    del averaged
    summary["checkpoint"] = str(trainer.save_checkpoint("swa", extra_state={"swa": summary}))
    if not used:
        trainer.load_best()
    logger.info("SWA average of %d epochs: dev overall %s vs best epoch %s: %s | predictions from %s",
                summary["n_averaged"], score_text(summary["score"]), score_text(best["score"]),
                " ".join(f"{k} {v:.4f}" for k, v in metrics.items()), "SWA" if used else "the best epoch")
    trainer.run_dir.append({"stage": "swa", "swa_model": True, **summary})
    return summary

