"""A whole training run: fit -> best checkpoint -> SWA -> predictions -> final record.

Usage:
    from tasks.config import TrainConfig
    from tasks.training.run import run
    summary = run(TrainConfig(out_dir="runs/try"))        # train, keep the best epoch, write predictions
    summary = run(cfg, resume_from="runs/try/checkpoints/last")

What a run does (``tasks.config.TrainConfig`` documents every setting):
1. ``Trainer.from_plan`` (tasks/training/trainer.py): seed, read and tokenize each
   task's train and dev files (tasks/data/selection.py), build the encoder, the
   ``MultitaskBert`` heads (tasks/model.py), the objectives
   (tasks/objectives/) and our AdamW.
2. ``fit``: every epoch of the schedule, dev metrics after each, a JSONL
   record, the plot, checkpoint ``last``, and ``best`` when the overall dev
   score improved (LP-FT's stages inside the loop, tasks/training/lpft.py).
3. The best checkpoint is loaded; with ``swa_epochs`` the SWA phase runs from
   it (tasks/training/swa.py, paper §4.6) and its averaged model replaces the best one
   when it scores higher on dev.
4. Dev and test predictions and logits for every task (``Evaluator.write_all``),
   training-set logits too with ``predict_train``, and the final record in
   metrics.jsonl.

What a run directory holds after it: README "Training".

Under torchrun every rank trains (and runs SWA); the ranks other than 0 then
return a short summary and rank 0 writes the predictions.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from tasks.config import TrainConfig
from tasks.training.progress import duration
from tasks.training.swa import run_swa
from tasks.training.trainer import Hook, RunPlan, Trainer, prepare_run, resume_point

logger = logging.getLogger(__name__)


def run(cfg: TrainConfig, *, resume_from: str | os.PathLike | None = None, overwrite: bool = False,
        hooks: Sequence[Hook] = ()) -> dict:
    """Check ``cfg`` (``prepare_run``; with ``resume_from``, against the checkpoint found there), then ``run_plan``.

    Returns the final summary, also appended to metrics.jsonl.
    """
    resume = resume_point(resume_from) if resume_from is not None else None
    return run_plan(prepare_run(cfg, resume, overwrite), hooks=hooks)


def run_plan(plan: RunPlan, *, hooks: Sequence[Hook] = ()) -> dict:
    """Train a checked run, keep the best checkpoint (or SWA's average, when it scores higher), write predictions.

    Returns the final summary, also appended to metrics.jsonl.
    """
    t0 = time.perf_counter()
    trainer = Trainer.from_plan(plan, hooks=hooks)
    try:
        return _train_and_predict(trainer, t0)
    except BaseException:
        trainer.run_dir.close(failed=True)  # before a first checkpoint: a run moved aside by overwrite comes back
        raise
    finally:
        trainer.run_dir.close()  # the lock


def _train_and_predict(trainer: Trainer, t0: float) -> dict:
    cfg = trainer.cfg
    summary = trainer.fit()
    source = trainer.load_best()
    logger.info("best epoch %s (dev overall %s)", summary["best"]["epoch"], summary["best"]["score"])
    swa = None
    if cfg.swa_epochs:
        swa = run_swa(trainer)  # leaves in the model what predicts: the SWA average when it scored higher
        source = Path(swa["checkpoint"]) if swa["used"] else source
    if trainer.rank > 0:  # under torchrun rank 0 alone writes the predictions
        return {"final": True, "rank": trainer.rank, "best_epoch": summary["best"]["epoch"],
                "predictions_from": str(source)}
    logger.info("writing predictions from %s", source)
    final = trainer.evaluator.write_all(trainer.model, trainer.tokenizer, trainer.run_dir.path / "predictions",
                                        train_sets=trainer.train_sets, examples=trainer.final_examples,
                                        reports=trainer.data)
    own = ("dev", "files", "skipped", "rows_skipped", "incomplete")
    extra = sorted((k for k in final if k not in own), key=lambda k: k != "train")
    record = {"final": True, "best_epoch": summary["best"]["epoch"], "predictions_from": str(source),
              "dev": final["dev"], **{k: final[k] for k in extra},  # training-set metrics, objectives' inference
              **({"swa": swa} if swa else {}),
              "process_time_s": round(time.perf_counter() - t0, 1), "predictions": final["files"],
              "skipped": final["skipped"], "rows_skipped": final["rows_skipped"],
              **({"incomplete": final["incomplete"]} if final["incomplete"] else {})}
    trainer.run_dir.append(record)
    logger.info("final dev (%s): %s", final_dev_scope(cfg),
                " ".join(f"{k} {v:.4f}" for k, v in final["dev"].items() if v is not None))
    logger.info("done: wall time %s (this process: %.0f s)", duration(record["process_time_s"]),
                record["process_time_s"])
    return record


def final_dev_scope(cfg: TrainConfig) -> str:
    """What the final dev metrics were computed on, for the log: whole sets, the capped subsets, or --limit rows."""
    if cfg.limit is not None:
        return f"the first {cfg.limit} rows of each dev file (--limit)"
    return "full sets" if cfg.final_dev == "full" else "capped subsets"

