"""The hooks of a run: what a fine-tuning (or pretraining) run does around its steps, each a ``Hook`` on the loop
(tasks/training/loop.py, which documents the events, the ``TrainingState`` a hook sees and the ``Control`` it
steers with): the log lines and their clock (``LogLines``), the progress bar (``ProgressBar``), checkpoints every N
steps (``CheckpointEvery``), early stopping (``EarlyStopping``), metrics.jsonl (``MetricsFile``), training.png
(``Plot``); TensorBoard's is in tasks/training/tensorboard.py, MLM pretraining's log in tasks/training/pretraining.py.
A user's own hooks, passed to ``run(cfg, hooks=[...])`` or ``trainer_for``, see the same events after the run's own.
"""

from __future__ import annotations

import logging
import sys
import time

import torch
from tqdm import tqdm

from tasks.logs import count
from tasks.runtime import synchronize
from tasks.training.loop import Control, Evaluation, Hook, Step, TrainingState
from tasks.training.progress import RunClock, duration, plot_history, sequences
from tasks.training.rundir import RunDir

logger = logging.getLogger(__name__)


class ProgressBar(Hook):
    """A tqdm bar over each epoch's steps, on a terminal (stderr) and on rank 0 only."""

    def __init__(self) -> None:
        self.bar: tqdm | None = None

    def on_epoch_start(self, state: TrainingState, control: Control) -> None:
        self.bar = tqdm(total=state.steps_in_epoch, initial=state.step, desc=state.epoch_title,
                        dynamic_ncols=True, disable=not sys.stderr.isatty() or not state.main, leave=False)

    def on_step_end(self, state: TrainingState, control: Control, step: Step) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if state.step == state.steps_in_epoch:
                self._close()

    def on_log(self, state: TrainingState, control: Control, values: dict[str, float]) -> None:
        if self.bar is not None and "loss" in values:
            self.bar.set_postfix(loss=f"{values['loss']:.4f}")

    def on_train_end(self, state: TrainingState, control: Control) -> None:
        self._close()

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class LogLines(Hook):
    """The run's log lines: each log line's values (the window's mean loss terms, lr, throughput: ``on_log``) with,
    in the training epochs, the elapsed and remaining time; an estimate of the whole run after its first steps; a
    line at each epoch's end and for each evaluation a hook asked for.

    The clock (``RunClock``) times the training epochs ahead (``TrainingState.outlook``: each step by its padded
    tokens, the evaluations by their sequences); it waits for the device only where it reads the time.
    """

    def __init__(self) -> None:
        self.clock: RunClock | None = None
        self.clock_steps, self.clock_seqs, self.t_clock = 0, 0, 0.0  # the steps not yet given to the clock

    def on_epoch_start(self, state: TrainingState, control: Control) -> None:
        if self.clock is None and state.outlook is not None and state.epoch < state.training_epochs:
            plan = state.outlook
            self.clock = RunClock(plan["costs"], plan["evaluations"], plan["dev_sequences"], plan["final_sequences"])
        self.t_clock = time.perf_counter()
        self.clock_steps = self.clock_seqs = 0

    def _timing(self, state: TrainingState) -> RunClock | None:
        return self.clock if state.epoch < state.training_epochs else None  # its plan: the training epochs

    def on_step_end(self, state: TrainingState, control: Control, step: Step) -> None:
        clock = self._timing(state)
        if clock is None:
            return
        self.clock_steps, self.clock_seqs = self.clock_steps + 1, self.clock_seqs + sequences(step.batch)
        if state.step == state.steps_in_epoch or clock.estimate_due(self.clock_steps):
            self._tick(state, clock)

    def _tick(self, state: TrainingState, clock: RunClock) -> None:
        """Give the steps since the last tick to the clock (their device work done: their time is real)."""
        synchronize(torch.device(state.device))
        now = time.perf_counter()
        clock.trained(self.clock_steps, self.clock_seqs, now - self.t_clock)
        self.clock_steps, self.clock_seqs, self.t_clock = 0, 0, now
        if clock.estimate_due(0):
            clock.estimated = True
            logger.info("estimate after %s: the run takes ~%s in all, evaluations included (the steps "
                        "left timed by their padded tokens)", count(clock.steps_done, "step"),
                        duration(clock.total()))

    def on_log(self, state: TrainingState, control: Control, values: dict[str, float]) -> None:
        clock = self._timing(state)
        if clock is not None and self.clock_steps:
            self._tick(state, clock)
        terms = {k: v for k, v in values.items() if k not in ("lr", "seq_per_s")}
        skipped = f" | fp16 steps skipped {state.skipped_steps}" if state.skipped_steps else ""
        logger.info("%s step %d/%d | lr %.2e | %s | %.1f seq/s%s%s", state.epoch_title, state.step,
                    state.steps_in_epoch, values["lr"], " | ".join(f"{name} {v:.4f}" for name, v in terms.items()),
                    values["seq_per_s"], skipped, f" | {clock.line()}" if clock is not None else "")

    def on_evaluate(self, state: TrainingState, control: Control, evaluation: Evaluation) -> None:
        if self.clock is not None and evaluation.scope == "epoch":
            self.clock.evaluated(evaluation.seconds)
        if evaluation.scope == "step":
            logger.info("%s step %d/%d: dev %s (%.0f s)", state.epoch_title, state.step, state.steps_in_epoch,
                        " ".join(f"{k} {v:.4f}" for k, v in evaluation.metrics.items()
                                 if isinstance(v, float)), evaluation.seconds)

    def on_epoch_end(self, state: TrainingState, control: Control, record: dict) -> None:
        terms = " ".join(f"{k} {v:.4f}" for k, v in record["train"].items())
        if "dev" not in record:  # a stage whose epochs are not scored (SWA's)
            stage = record.get("stage", "train")
            logger.info("%s epoch %d done in %.0f s (not scored): %s", stage.upper() if stage == "swa" else stage,
                        record.get(f"{stage}_epoch", record["epoch"]), record["train_time_s"], terms)
            return
        logger.info("epoch %d done in %.0f s (+%.0f s dev): %s | dev %s%s", record["epoch"], record["train_time_s"],
                    record["eval_time_s"], terms,
                    " ".join(f"{k} {v:.4f}" if v is not None else f"{k} nan" for k, v in record["dev"].items()),
                    " (best so far)" if record["best"] else "")

    def on_train_end(self, state: TrainingState, control: Control) -> None:
        self.clock = None  # the final predictions run outside it


class EarlyStopping(Hook):
    """Stop training once the run's selection score (the dev overall that chooses the best epoch, --best-metric) has
    not improved for ``patience`` scored epochs in a row (Hugging Face's ``EarlyStoppingCallback``); the best epoch
    then predicts, as after the last epoch. The count is read from the epochs' records (``TrainingState.history``,
    saved in every checkpoint), so a resumed run counts on where it stopped, and a run that had stopped stays
    stopped. Stages that are not scored (SWA's) come after training: TrainConfig refuses them beside it."""

    def __init__(self, patience: int) -> None:
        if patience < 1:
            raise ValueError(f"early stopping needs a patience of 1 or more epochs, got {patience}")
        self.patience = patience

    def waited(self, state: TrainingState) -> int:
        """Scored epochs since the best one."""
        scored = [r for r in state.history if "dev" in r]
        best = max((i for i, r in enumerate(scored) if r.get("best")), default=-1)
        return len(scored) - 1 - best

    def on_train_start(self, state: TrainingState, control: Control) -> None:
        if state.history and self.waited(state) >= self.patience and state.epoch < state.training_epochs:
            control.should_training_stop = True  # a resume of a run that had stopped early
            logger.info("early stopping: the run stopped after epoch %d (patience %d); nothing more to train",
                        state.history[-1]["epoch"], self.patience)

    def on_epoch_end(self, state: TrainingState, control: Control, record: dict) -> None:
        if "dev" not in record or state.epoch >= state.training_epochs:
            return
        waited = self.waited(state)
        if waited >= self.patience:
            control.should_training_stop = True
            best = state.best or {}
            logger.info("early stopping: the dev overall has not improved for %s (patience %d; best: epoch %s, "
                        "%s): training stops after epoch %d of %d", count(waited, "epoch"), self.patience,
                        best.get("epoch"), f"{best['score']:.4f}" if best.get("score") is not None else "nan",
                        record["epoch"], state.training_epochs)


class CheckpointEvery(Hook):
    """Checkpoint ``last`` every ``every`` global steps inside an epoch (the training stages only: an SWA epoch is
    no position to resume), so that a crash loses at most ``every`` steps; where the loop saves at the epoch's end
    (``saves_each_epoch``) or stops after this step, it does not save again. The loop saves once every hook has
    seen the step (``Control.should_save``), so the hooks' states in the checkpoint count it."""

    def __init__(self, every: int) -> None:
        self.every = every

    def on_step_end(self, state: TrainingState, control: Control, step: Step) -> None:
        if not self.every or state.global_step % self.every or not state.resumable:
            return
        if control.should_training_stop or (state.saves_each_epoch and state.step == state.steps_in_epoch):
            return
        control.should_save = True


class MetricsFile(Hook):
    """metrics.jsonl: every record the run makes (tasks/training/rundir.py); a resumed run's file continues from
    its checkpoint's records."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir

    def on_train_start(self, state: TrainingState, control: Control) -> None:
        if state.resumed_from is not None:
            self.run_dir.rewrite(state.history)

    def on_record(self, state: TrainingState, control: Control, record: dict) -> None:
        self.run_dir.append(record)


class Plot(Hook):
    """training.png: the epochs' mean loss terms and dev scores, drawn again after every evaluated epoch."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir

    def on_epoch_end(self, state: TrainingState, control: Control, record: dict) -> None:
        if self.run_dir.writer and "dev" in record:
            plot_history(state.history, self.run_dir.path / "training.png")
