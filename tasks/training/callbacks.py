"""Hooks: how anything plugs into the training loop (tasks/training/trainer.py), and the ones a fine-tuning run uses.

The loop trains batches and tells its hooks what happened, as Hugging Face's ``Trainer`` tells its
``TrainerCallback``s; what a run does around its steps is a hook: the log lines and their clock (``LogLines``),
the progress bar (``ProgressBar``), checkpoints every N steps (``CheckpointEvery``), metrics.jsonl
(``MetricsFile``), training.png (``Plot``), TensorBoard (tasks/training/tensorboard.py), SWA's average
(tasks/training/stages.py), MLM pretraining's log (tasks/training/pretraining.py). A user's own hooks, passed to
``run(cfg, hooks=[...])`` or ``trainer_for``, see the same events after the run's own.

Events, each a no-op unless overridden, in the order a run meets them (``trainer``: the loop, with its model,
optimizer, config and position: ``stage``, ``epoch``, ``plan``, ``step`` (the next step of the plan),
``global_step``):

    on_train_start(trainer)               fit() begins (a resumed trainer stands at its checkpoint's position)
    on_epoch_start(trainer)               the steps trainer.plan[trainer.step:] of an epoch are about to train
    on_step_end(trainer, step)            a step was taken (a ``Step``); trainer.step and global_step count it
    on_log(trainer, values)               a log line's means over its window of steps (``Loop.log``)
    on_evaluate(trainer, evaluation)      dev scores (an ``Evaluation``): after each epoch, of SWA's average, final
    on_save(trainer, checkpoint)          a checkpoint directory was written
    on_record(trainer, record)            a record for metrics.jsonl: an epoch's, SWA's, the final one
    on_epoch_end(trainer, record)         the epoch ended: evaluated, its checkpoint written, recorded
    on_train_end(trainer)                 fit() is done, SWA included
    close()                               the trainer is closed (``with trainer_for(cfg)``; run() does it), also
                                          after a failure: release files and writers

A hook steers the loop through ``trainer.control`` (``should_save``: checkpoint ``last`` after this step;
``should_training_stop``: end fit() after it). A hook that keeps state a resume needs returns it from ``state``
(JSON) and takes it back in ``load_state``: it is saved in the checkpoint's state.json under its class name, as it
is when the checkpoint is written (after every hook's on_step_end of that step; at an epoch's end, before the
epoch's on_record and on_epoch_end). Under torchrun hooks run on every rank.

Usage:
    class Losses(Hook):
        def on_log(self, trainer, values):
            print(trainer.global_step, values["loss"])
    run(TrainConfig(out_dir="runs/try"), hooks=[Losses()])
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from tasks.training import distributed
from tasks.logs import count
from tasks.training.progress import RunClock, RunningSums, duration, plot_history, sequences
from tasks.training.rundir import RunDir
from tasks.runtime import busy_cpu_note, precision_note, synchronize
from tasks.evaluation.metrics import describe_selection
from tasks.task import get_task
from tasks.task_file import inferred_note

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    """The step a loop just took, as ``Hook.on_step_end`` sees it."""

    index: int  # in trainer.plan
    stream: str
    batch: dict | None  # this rank's batch on the device; None for an empty shard (a short last batch)
    share: float  # this rank's fraction of the global batch (1 in one process)
    terms: dict[str, torch.Tensor]  # detached loss terms and the weighted "loss", on the device: reading one syncs
    lr: float


@dataclass(frozen=True)
class Evaluation:
    """Scores of a model, as ``Hook.on_evaluate`` sees them."""

    scope: str  # "epoch" (dev after a training epoch), "swa" (SWA's average), "final" (the model that predicts),
    #             "held-out" (MLM pretraining's masked tokens)
    metrics: dict[str, Any]
    seconds: float
    sequences: int | None = None  # scored sequences, where the evaluation counted them


@dataclass
class Control:
    """What hooks ask of the loop after a step, once every hook has seen it (Hugging Face's ``TrainerControl``)."""

    should_save: bool = False  # write checkpoint ``last`` now (the loop resets it)
    should_training_stop: bool = False  # end fit() after the current step (its epoch does not end)


class Hook:
    """A callback on the training loop: override the events you need (the module docstring lists them)."""

    def on_train_start(self, trainer: Any) -> None: ...

    def on_epoch_start(self, trainer: Any) -> None: ...

    def on_step_end(self, trainer: Any, step: Step) -> None: ...

    def on_log(self, trainer: Any, values: dict[str, float]) -> None: ...

    def on_evaluate(self, trainer: Any, evaluation: Evaluation) -> None: ...

    def on_save(self, trainer: Any, checkpoint: Path) -> None: ...

    def on_record(self, trainer: Any, record: dict) -> None: ...

    def on_epoch_end(self, trainer: Any, record: dict) -> None: ...

    def on_train_end(self, trainer: Any) -> None: ...

    def close(self) -> None:
        """Release what the hook holds open (a writer, a file): the trainer calls it when it is closed, after a
        failed run too."""

    def state(self) -> dict | None:
        """What a resumed run needs of this hook (JSON values), saved with every checkpoint; None: nothing."""
        return None

    def load_state(self, state: dict) -> None:
        """Take back what ``state`` returned when the checkpoint being resumed was written."""


# ---- the hooks of a fine-tuning run ----


class ProgressBar(Hook):
    """A tqdm bar over each epoch's steps, on a terminal (stderr) and on rank 0 only."""

    def __init__(self) -> None:
        self.bar: tqdm | None = None

    def on_epoch_start(self, trainer: Any) -> None:
        self.bar = tqdm(total=len(trainer.plan), initial=trainer.step, desc=trainer.epoch_title,
                        dynamic_ncols=True, disable=not sys.stderr.isatty() or trainer.rank > 0, leave=False)

    def on_step_end(self, trainer: Any, step: Step) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if trainer.step == len(trainer.plan):
                self._close()

    def on_log(self, trainer: Any, values: dict[str, float]) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{values['loss']:.4f}")

    def on_train_end(self, trainer: Any) -> None:
        self._close()

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class LogLines(Hook):
    """The run's log: its plan first, then one line every ``log_every`` steps of an epoch with the window's mean
    loss terms, lr, throughput and (in the training epochs) the elapsed and remaining time, an estimate of the
    whole run after its first steps, and a line at each epoch's end. Each window's values go to the other hooks
    (``Loop.log``: TensorBoard, the progress bar).

    Losses stay on the device between log lines (one sync per ``log_every`` steps, ``RunningSums.means``); the
    clock (``RunClock``) waits for the device only where it reads the time.
    """

    def __init__(self, log_every: int) -> None:
        self.log_every = log_every
        self.clock: RunClock | None = None
        self.window = RunningSums()
        self.window_seqs = 0
        self.t_window = 0.0
        self.clock_steps, self.clock_seqs, self.t_clock = 0, 0, 0.0  # the steps not yet given to the clock

    def on_train_start(self, trainer: Any) -> None:
        self.clock = self._plan(trainer) if trainer.epoch < trainer.total_epochs else None

    @staticmethod
    def _plan(trainer: Any) -> RunClock:
        """Log what the run will do (device, precision and why, threads, the plan of steps and evaluations), and
        return the clock that times it."""
        cfg = trainer.cfg
        epochs = range(trainer.epoch, trainer.total_epochs)
        plans = {e: trainer.schedule.epoch_plan(e) for e in epochs}
        steps = sum(len(p) for p in plans.values()) - trainer.step
        per_task: dict[str, int] = {}
        for stream, idx in plans[trainer.epoch]:
            per_task[stream] = per_task.get(stream, 0) + len(idx)

        def scored(task: str, n: int) -> int:  # a pair scored in both orders is two sequences' work
            return n * (2 if cfg.symmetric_eval and get_task(task).kind.pair else 1)

        dev = {t: len(d) for t, d in trainer.dev_sets.items()}
        final = {(t, split): len(rows) for split, by_task in (trainer.final_examples or {}).items()
                 for t, rows in by_task.items() if rows is not None}
        logger.info("%s, %s, %s | plan: %s x %s steps (%d to go): %s examples an epoch; dev scores "
                    "after each epoch on %s; then the best epoch predicts the whole dev and test sets%s",
                    trainer.device, precision_note(cfg.bf16, trainer.device, trainer.amp_dtype),
                    count(torch.get_num_threads(), "thread"), count(len(plans), "epoch"),
                    "/".join(str(len(p)) for p in plans.values()), steps,
                    ", ".join(f"{t} {n}" for t, n in per_task.items()), ", ".join(f"{t} {n}" for t, n in dev.items()),
                    " (pairs in both orders)" if cfg.symmetric_eval and any(get_task(t).kind.pair for t in dev)
                    else "")
        if busy := busy_cpu_note(torch.get_num_threads(), trainer.device):
            logger.warning(busy)
        for task in cfg.tasks:  # what a user's task file made of the task
            entry = get_task(task)
            if entry.origin.get("file"):
                note = inferred_note(entry)
                logger.info("task %s%s", entry.describe(), f"; {note}" if note else "")
        logger.info("the best epoch is the one of the highest dev overall: %s%s", describe_selection(
            cfg.tasks, cfg.best_metric), "" if cfg.best_metric else " (--best-metric chooses another)")
        costs = [trainer.train_sets[stream].padded_tokens(idx) for e, p in plans.items()
                 for stream, idx in (p[trainer.step:] if e == trainer.epoch else p)]
        return RunClock(costs, len(plans), sum(scored(t, n) for t, n in dev.items()),
                        sum(scored(t, n) for (t, _), n in final.items()))

    def on_epoch_start(self, trainer: Any) -> None:
        self.window, self.window_seqs = RunningSums(), 0
        self.t_window = self.t_clock = time.perf_counter()
        self.clock_steps = self.clock_seqs = 0

    def on_step_end(self, trainer: Any, step: Step) -> None:
        self.window.add(step.terms, step.share)
        n = sequences(step.batch)
        self.window_seqs += n
        clock = self.clock if trainer.epoch < trainer.total_epochs else None  # its plan: the training epochs
        self.clock_steps, self.clock_seqs = self.clock_steps + 1, self.clock_seqs + n
        log_line = (step.index + 1) % self.log_every == 0
        epoch_done = trainer.step == len(trainer.plan)
        if clock is not None and (log_line or epoch_done or clock.estimate_due(self.clock_steps)):
            synchronize(trainer.device)  # the steps' device work is done: their time is real
            now = time.perf_counter()
            clock.trained(self.clock_steps, self.clock_seqs, now - self.t_clock)
            self.clock_steps, self.clock_seqs, self.t_clock = 0, 0, now
            if clock.estimate_due(0):
                clock.estimated = True
                logger.info("estimate after %s: the run takes ~%s in all, evaluations included (the steps "
                            "left timed by their padded tokens)", count(clock.steps_done, "step"),
                            duration(clock.total()))
        if log_line:
            now = time.perf_counter()
            means = self.window.means()  # the one device sync per log_every steps
            seqs = distributed.sum_over_ranks({"seqs": self.window_seqs})["seqs"]
            seq_per_s = seqs / max(now - self.t_window, 1e-9)
            logger.info("%s step %d/%d | lr %.2e | %s | %.1f seq/s%s", trainer.epoch_title, step.index + 1,
                        len(trainer.plan), step.lr, " | ".join(f"{name} {v:.4f}" for name, v in means.items()),
                        seq_per_s, f" | {clock.line()}" if clock is not None else "")
            trainer.log({**means, "lr": step.lr, "seq_per_s": seq_per_s})
            self.window, self.window_seqs, self.t_window = RunningSums(), 0, now

    def on_evaluate(self, trainer: Any, evaluation: Evaluation) -> None:
        if self.clock is not None and evaluation.scope == "epoch":
            self.clock.evaluated(evaluation.seconds)

    def on_epoch_end(self, trainer: Any, record: dict) -> None:
        terms = " ".join(f"{k} {v:.4f}" for k, v in record["train"].items())
        if "swa_epoch" in record:
            logger.info("SWA epoch %d done in %.0f s: %s", record["swa_epoch"], record["train_time_s"], terms)
            return
        logger.info("epoch %d done in %.0f s (+%.0f s dev): %s | dev %s%s", record["epoch"], record["train_time_s"],
                    record["eval_time_s"], terms,
                    " ".join(f"{k} {v:.4f}" if v is not None else f"{k} nan" for k, v in record["dev"].items()),
                    " (best so far)" if record["best"] else "")

    def on_train_end(self, trainer: Any) -> None:
        self.clock = None  # the final predictions run outside it


class CheckpointEvery(Hook):
    """Checkpoint ``last`` every ``every`` global steps inside an epoch (the training stages only: an SWA epoch is
    no position to resume), so that a crash loses at most ``every`` steps; where the loop saves at the epoch's end
    (``Loop.saves_each_epoch``) or stops after this step, it does not save again. The loop saves once every hook has
    seen the step (``Control.should_save``), so the hooks' states in the checkpoint count it."""

    def __init__(self, every: int) -> None:
        self.every = every

    def on_step_end(self, trainer: Any, step: Step) -> None:
        if not self.every or trainer.global_step % self.every or not trainer.resumable:
            return
        if trainer.control.should_training_stop or (trainer.saves_each_epoch and trainer.step == len(trainer.plan)):
            return
        trainer.control.should_save = True


class MetricsFile(Hook):
    """metrics.jsonl: every record the run makes (tasks/training/rundir.py); a resumed run's file continues from
    its checkpoint's records."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir

    def on_train_start(self, trainer: Any) -> None:
        if trainer.resumed_from is not None:
            self.run_dir.rewrite(trainer.history)

    def on_record(self, trainer: Any, record: dict) -> None:
        self.run_dir.append(record)


class Plot(Hook):
    """training.png: the epochs' mean loss terms and dev scores, drawn again after every evaluated epoch."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir

    def on_epoch_end(self, trainer: Any, record: dict) -> None:
        if self.run_dir.writer and "dev" in record:
            plot_history(trainer.history, self.run_dir.path / "training.png")
