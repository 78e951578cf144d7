"""The training loop, its hooks and the state they see: one module (as Hugging Face's ``Trainer`` with its
``TrainerCallback``, ``TrainerState`` and ``TrainerControl``).

``Loop``: epochs of planned steps, each a batch (``batches``: collated, sharded under torchrun, prefetched on CUDA)
and one optimizer step (``train_step``), and events for its hooks. A subclass says what it trains: the plan, the
batch, the loss, the learning rate, what an epoch's end does and what a checkpoint holds; the multitask
``Trainer`` (tasks/training/trainer.py) and MLM pretraining (tasks/training/pretraining.py) are two.

A ``Hook`` sees the loop through a ``TrainingState`` (plain, serialisable: the position, the stage, the best epoch
and the records) and steers it through its ``Control`` (``should_evaluate``, ``should_log``, ``should_save``,
``should_training_stop``). Events, each a no-op unless overridden, in the order a run meets them, each with
(state, control, ...):

    on_train_start                       fit() begins (a resumed loop stands at its checkpoint's position)
    on_epoch_start                       the steps of an epoch's plan from state.step on are about to train
    on_step_begin                        a step is about to run its batch
    on_pre_optimizer_step                its gradients are ready (averaged over the ranks, clipped)
    on_optimizer_step                    the optimizer has stepped
    on_step_end(step)                    the step was taken (a ``Step``); state.step and global_step count it
    on_log(values)                       a log line's values over its window of steps (``Loop.log_values``: the
                                         loss terms' means, lr, speed), every ``log_every`` steps or when asked
                                         (should_log)
    on_evaluate(evaluation)              scores (an ``Evaluation``): after each epoch, when asked (should_evaluate,
                                         scope "step"), of SWA's average, final
    on_save(checkpoint)                  a checkpoint directory was written
    on_record(record)                    a record for metrics.jsonl: an epoch's, SWA's, the final one
    on_epoch_end(record)                 the epoch ended: evaluated, its checkpoint written, recorded
    on_train_end                         fit() is done, SWA included
    close()                              the trainer is closed (``with trainer_for(cfg)``; run() does it), also
                                         after a failure: release files and writers

After every hook has seen a step the loop does what they asked: a log line (should_log), an evaluation
(should_evaluate), checkpoint ``last`` (should_save), the end of fit() (should_training_stop). A hook that keeps
state a resume needs returns it from ``state`` (JSON) and takes it back in ``load_state``: it is saved in the
checkpoint's state.json under its class name, as it is when the checkpoint is written. Under torchrun hooks run on
every rank (``state.main``: rank 0), and ask the same of the loop on every rank: a log line sums over the ranks, an
evaluation waits for rank 0's scores.

Usage:
    class EvaluateEvery(Hook):                      # dev scores every 100 steps, beside each epoch's
        def on_step_end(self, state, control, step):
            control.should_evaluate = state.global_step % 100 == 0
    run(TrainConfig(out_dir="runs/try"), hooks=[EvaluateEvery()])

Determinism: batches come from explicit generators (a pure function of seed and epoch), dropout from torch's global
RNG, whose state is saved with every checkpoint, so a resume continues bit for bit on CPU.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tasks.checkpoint import CHECKPOINT_FORMAT, load_training_state
from tasks.data.datasets import move_batch
from tasks.runtime import pin_and_prefetch, rng_state, seed_everything, set_rng_state
from tasks.training import distributed
from tasks.training.progress import RunningSums, progress_logging, sequences

logger = logging.getLogger(__name__)

# fp16: this many optimizer steps skipped in a row (the loss scale halved at each, 2**16 down to 2**-34) means no
# scale gives finite gradients: the run stops, saying so
MAX_SKIPPED_IN_A_ROW = 50


@dataclass(frozen=True)
class Step:
    """The step a loop just took, as ``Hook.on_step_end`` sees it."""

    index: int  # in the epoch's plan
    stream: str
    batch: dict | None  # this rank's batch on the device; None for an empty shard (a short last batch)
    share: float  # this rank's fraction of the global batch (1 in one process)
    terms: dict[str, torch.Tensor]  # detached loss terms and the weighted "loss", on the device: reading one syncs
    lr: float
    skipped: bool = False  # fp16's loss scaler skipped its optimizer step (gradients not finite): it did not train,
    #                        and its terms count in no mean


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
    """What hooks ask of the loop after a step (Hugging Face's ``TrainerControl``); the loop resets each flag once it
    has acted on it."""

    should_evaluate: bool = False  # score the model on dev now (an ``Evaluation`` of scope "step"; the best epoch
    #                                is still chosen among the epochs' own)
    should_log: bool = False  # a log line after this step, whatever ``log_every`` says
    should_save: bool = False  # write checkpoint ``last`` now
    should_training_stop: bool = False  # end fit() after the current step (its epoch does not end)


@dataclass(frozen=True)
class TrainingState:
    """Where a loop stands, plain and serialisable, as its hooks see it (Hugging Face's ``TrainerState``): a hook
    reads this, never the loop's internals.

    ``step`` is the next step of the epoch's plan (after ``on_step_end``: the steps taken in it), of
    ``steps_in_epoch``; ``epochs`` where fit() ends, ``training_epochs`` the epochs that are scored (the fine-tuning
    run's, SWA's after them); ``stage`` the stage training now; ``resumable``: a checkpoint now is a position to
    resume; ``saves_each_epoch``: the loop writes checkpoint ``last`` at every epoch's end; ``main``: this process
    writes (rank 0); ``resumed_from`` the checkpoint resumed; ``best`` and ``history`` the best epoch and the
    epochs' records so far; ``outlook``: what the training epochs ahead hold, for a clock (``costs``: each step's
    padded tokens; ``evaluations``, the ``dev_sequences`` each scores and the ``final_sequences`` predicted after),
    or None; ``skipped_steps``: the optimizer steps fp16's loss scaler skipped so far (gradients not finite)."""

    epoch: int
    step: int
    global_step: int
    steps_in_epoch: int
    epochs: int
    training_epochs: int
    stage: str
    epoch_title: str
    resumable: bool
    saves_each_epoch: bool
    main: bool
    device: str
    resumed_from: str | None = None
    best: dict | None = None
    history: Sequence[dict] = ()
    outlook: dict | None = None
    skipped_steps: int = 0


class Hook:
    """A callback on the training loop: override the events you need (the module docstring lists them). Each gets
    the loop's ``TrainingState`` and its ``Control`` first."""

    def on_train_start(self, state: TrainingState, control: Control) -> None: ...

    def on_epoch_start(self, state: TrainingState, control: Control) -> None: ...

    def on_step_begin(self, state: TrainingState, control: Control) -> None: ...

    def on_pre_optimizer_step(self, state: TrainingState, control: Control) -> None: ...

    def on_optimizer_step(self, state: TrainingState, control: Control) -> None: ...

    def on_step_end(self, state: TrainingState, control: Control, step: Step) -> None: ...

    def on_log(self, state: TrainingState, control: Control, values: dict[str, float]) -> None: ...

    def on_evaluate(self, state: TrainingState, control: Control, evaluation: Evaluation) -> None: ...

    def on_save(self, state: TrainingState, control: Control, checkpoint: Path) -> None: ...

    def on_record(self, state: TrainingState, control: Control, record: dict) -> None: ...

    def on_epoch_end(self, state: TrainingState, control: Control, record: dict) -> None: ...

    def on_train_end(self, state: TrainingState, control: Control) -> None: ...

    def close(self) -> None:
        """Release what the hook holds open (a writer, a file): the trainer calls it when it is closed, after a
        failed run too."""

    def state(self) -> dict | None:
        """What a resumed run needs of this hook (JSON values), saved with every checkpoint; None: nothing."""
        return None

    def load_state(self, state: dict) -> None:
        """Take back what ``state`` returned when the checkpoint being resumed was written."""



class Loop(ABC):
    """One training loop: epochs of planned steps, each a batch and an optimizer step, and events for its hooks.

    A subclass says what it trains: ``epoch_plan``, ``collate``, ``step_loss``, ``lr_at``, ``end_epoch`` (call
    ``next_epoch`` there), ``write_checkpoint_dir`` and the title of an epoch; it builds ``params``, ``param_names``
    and ``optimizer``, and sets ``epochs`` (where fit() ends; ``max_steps`` may end it sooner). A checkpoint holds
    the position (the next step is ``plan[step]`` of ``epoch``; ``global_step`` steps taken), the epoch's loss
    sums, every rank's RNG state and the hooks' states, so that a resume continues bit for bit.
    """

    # Collate the next batch in a background thread (``batches``); None = on CUDA only. False where collating draws
    # random numbers (MLM's masks): they must be drawn in step order.
    prefetch: bool | None = None
    saves_each_epoch = False  # whether ``end_epoch`` writes checkpoint ``last`` (then CheckpointEvery need not)
    stage = "train"  # what the steps do; the Trainer's: "lp", "ft", "swa"
    epochs = 0  # fit() trains epochs epoch..epochs-1
    log_every = 0  # steps of an epoch between log lines (0: only when a hook asks, ``Control.should_log``)

    def __init__(self, model: nn.Module, *, device: torch.device, hooks: Sequence[Hook] = (), grad_clip: float = 0.0,
                 seed: int = 0, checkpoints: Path | None = None, scaler: torch.amp.GradScaler | None = None,
                 accumulation: int = 1) -> None:
        if accumulation < 1:
            raise ValueError(f"gradient accumulation needs 1 or more micro-batches a step, got {accumulation}")
        self.model, self.device, self.hooks = model, device, list(hooks)
        self.grad_clip, self.seed, self.checkpoints = grad_clip, seed, checkpoints
        self.scaler, self.accumulation = scaler, accumulation  # fp16's loss scaler (runtime.loss_scaler), or None
        self.skipped_steps = 0  # optimizer steps skipped by the scaler (gradients not finite): the run's count
        self.skipped_in_a_row = 0
        self.skipped_last = False  # the last step's
        self.rank, self.world_size = distributed.rank(), distributed.world_size()
        self.control = Control()
        self.params: list[nn.Parameter] = []
        self.param_names: list[str] = []
        self.optimizer: torch.optim.Optimizer | None = None
        self.max_steps: int | None = None
        # Position: the next step to run is plan[step] of epoch; plan is the epoch's while it trains.
        self.epoch = 0
        self.step = 0
        self.global_step = 0
        self.plan: Sequence[tuple[str, list[int]]] = []
        self.epoch_sums = RunningSums()  # steps (under torchrun: this rank's shares of them)
        self.resumed_from: Path | None = None
        self.best: dict | None = None  # the best epoch's score, number, stage and scores (a loop that scores epochs)
        self.history: list[dict] = []  # the scored epochs' records
        self.outlook: dict | None = None  # the training epochs ahead, for a clock (``TrainingState.outlook``)
        self.window, self.window_seqs, self.t_window = RunningSums(), 0, 0.0  # the log line's window of steps
        self._rng_to_restore: dict | None = None

    # -- what a subclass trains --
    @abstractmethod
    def epoch_plan(self, epoch: int) -> Sequence[tuple[str, list[int]]]:
        ...

    @abstractmethod
    def collate(self, stream: str, indices: list[int]) -> dict:
        ...

    @abstractmethod
    def step_loss(self, stream: str, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(weighted total loss, unweighted named terms) of one batch of ``stream``."""
        ...

    @abstractmethod
    def lr_at(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        ...

    def end_epoch(self, lr: float, train_time: float) -> None:
        """After an epoch's last step (``lr`` its learning rate): at least ``next_epoch``."""
        self.next_epoch()

    @abstractmethod
    def write_checkpoint_dir(self, final: Path, state: dict) -> None:
        """Write checkpoint directory ``final`` (atomically) with ``state`` as its state.json."""
        ...

    @property
    def epoch_title(self) -> str:
        return f"epoch {self.epoch + 1}/{self.epochs}"

    @property
    def resumable(self) -> bool:
        """Whether the position is one a resume continues from (not in SWA's epochs)."""
        return True

    def after_optimizer_step(self) -> None:
        """After each optimizer step (objectives' momentum encoders)."""

    def evaluate_now(self) -> None:
        """Score the model because a hook asked (``Control.should_evaluate``): a subclass's evaluation, told to the
        hooks (``on_evaluate``, scope "step"); none by default."""

    def log_due(self, step: Step) -> bool:
        """Whether a log line follows ``step`` unasked: every ``log_every`` steps of an epoch's plan."""
        return self.log_every > 0 and (step.index + 1) % self.log_every == 0

    def add_to_window(self, step: Step) -> None:
        """Count ``step`` in the log line's window (its loss terms stay on the device; a skipped step's are not
        counted, its sequences are)."""
        if not step.skipped:
            self.window.add(step.terms, step.share)
        self.window_seqs += sequences(step.batch)

    def log_values(self, step: Step) -> dict[str, float]:
        """The values of a log line, and a new window: the window's mean loss terms (the one device sync per log
        line), the learning rate and the sequences a second over all ranks."""
        now = time.perf_counter()
        means = self.window.means()
        seqs = distributed.sum_over_ranks({"seqs": self.window_seqs})["seqs"]
        values = {**means, "lr": step.lr, "seq_per_s": seqs / max(now - self.t_window, 1e-9)}
        self.window, self.window_seqs, self.t_window = RunningSums(), 0, now
        return values

    @property
    def training_epochs(self) -> int:
        """The epochs that are scored (all of this loop's)."""
        return self.epochs

    # -- events --
    @property
    def training_state(self) -> TrainingState:
        """Where the loop stands, as its hooks see it."""
        return TrainingState(
            epoch=self.epoch, step=self.step, global_step=self.global_step, steps_in_epoch=len(self.plan),
            epochs=self.epochs, training_epochs=self.training_epochs, stage=self.stage, epoch_title=self.epoch_title,
            resumable=self.resumable, saves_each_epoch=self.saves_each_epoch, main=self.rank == 0,
            device=str(self.device), resumed_from=str(self.resumed_from) if self.resumed_from is not None else None,
            best=self.best, history=self.history, outlook=self.outlook, skipped_steps=self.skipped_steps)

    def emit(self, event: str, *args: Any) -> None:
        """Call ``event`` (a Hook method's name) of every hook, in order, with the loop's state and control."""
        if not self.hooks:
            return
        state = self.training_state
        for hook in self.hooks:
            getattr(hook, event)(state, self.control, *args)

    def record(self, record: dict) -> None:
        """A record of the run (an epoch's, SWA's, the final one) to every hook (``on_record``: metrics.jsonl)."""
        self.emit("on_record", record)

    # -- one step --
    def micro_batches(self, batch: dict) -> list[tuple[dict, float]]:
        """``batch`` cut into ``accumulation`` micro-batches of consecutive rows (as even as the rows allow; fewer
        when the batch has fewer rows), each with its fraction of the rows: [(batch, 1.0)] without accumulation.
        A tensor or list of one value per row is cut; anything else (a count) is the batch's and stays whole."""
        rows = len(batch["ids"]) if "ids" in batch else None
        if self.accumulation == 1 or rows is None or rows < 2:
            return [(batch, 1.0)]
        parts = min(self.accumulation, rows)
        bounds = [rows * k // parts for k in range(parts + 1)]
        out = []
        for a, b in zip(bounds, bounds[1:]):
            micro = {k: v[a:b] if isinstance(v, (torch.Tensor, list, tuple)) and len(v) == rows else v
                     for k, v in batch.items()}
            out.append((micro, (b - a) / rows))
        return out

    def train_step(self, stream: str, batch: dict | None, lr: float, share: float = 1) -> dict[str, torch.Tensor]:
        """One optimizer step on one batch; returns the detached terms plus the weighted total "loss".

        Under torchrun ``batch`` is this rank's shard of the global batch (None
        when the shard is empty: a partial last batch smaller than the world)
        and ``share`` its fraction of the global batch. The loss is scaled by
        share × world before backward, so the gradients averaged over the ranks
        (``distributed.all_reduce_gradients``) are those of the global batch's
        mean loss; clipping then acts on the averaged gradients, the same on every rank.

        Gradient accumulation (``accumulation`` N > 1): the batch runs as N micro-batches (``micro_batches``),
        each forward and backward alone with its loss scaled by its fraction of the rows as well, so the summed
        gradients are the whole batch's mean loss's (for losses that are means over the rows: objectives that
        couple a batch's rows, in-batch negatives or a queue, see a micro-batch); the gradients are averaged over
        the ranks once, after the last micro-batch, and the optimizer steps once. The terms returned are the
        micro-batches' weighted by their fractions.

        Under fp16 (``scaler``) each backward is of the scaled loss, the gradients are unscaled before clipping,
        and a step whose gradients are not finite is skipped, the scale halved (``skipped_steps``); a run whose
        every step is skipped (MAX_SKIPPED_IN_A_ROW of them in a row) stops with a ValueError saying so.
        """
        for g in self.optimizer.param_groups:
            g["lr"] = lr * g["lr_scale"] if "lr_scale" in g else lr
        detached: dict[str, torch.Tensor] = {}
        if batch is not None:
            micro = self.micro_batches(batch)
            for part, fraction in micro:
                loss, terms = self.step_loss(stream, part)
                scale = share * self.world_size * fraction
                scaled = loss if scale == 1 else loss * scale
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
                terms = {**{k: v.detach().float() for k, v in terms.items()}, "loss": loss.detach().float()}
                if len(micro) == 1:
                    detached = terms
                else:
                    for k, v in terms.items():
                        detached[k] = detached[k] + fraction * v if k in detached else fraction * v
        distributed.all_reduce_gradients(self.params)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # clipping acts on the true gradients
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.emit("on_pre_optimizer_step")
        stepped = self.optimizer_step()
        self.skipped_last = not stepped
        self.optimizer.zero_grad(set_to_none=True)
        if stepped:
            self.after_optimizer_step()
            self.emit("on_optimizer_step")
        return detached

    def optimizer_step(self) -> bool:
        """Step the optimizer (through the fp16 scaler, which skips a step whose gradients are not finite and
        halves its scale); whether it stepped. The scaler reads its finite check back to the host anyway (torch's
        ``GradScaler.step``), so comparing its scale before and after costs no further wait."""
        if self.scaler is None:
            self.optimizer.step()
            return True
        before = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.scaler.get_scale() >= before:
            self.skipped_in_a_row = 0
            return True
        self.skipped_steps += 1
        self.skipped_in_a_row += 1
        if self.skipped_in_a_row >= MAX_SKIPPED_IN_A_ROW:
            raise ValueError(f"fp16: the last {self.skipped_in_a_row} optimizer steps were all skipped, their "
                             f"gradients not finite at every loss scale down to {self.scaler.get_scale():.3g}: the "
                             "loss itself overflows or is nan in fp16 here; train in fp32 (--no-bf16) or, on a "
                             "GPU or CPU that multiplies it, bf16 (--bf16)")
        return False

    def batches(self, plan: Sequence[tuple[str, list[int]]], start: int = 0
                ) -> Iterator[tuple[str, dict | None, float]]:
        """(stream, batch on the device, share) for each step of ``plan[start:]``.

        One process: the whole batch, share 1. Under torchrun: this rank's
        shard ``indices[rank::world]`` (None when empty) and its fraction of
        the global batch. Where ``runtime.pin_and_prefetch`` says so (CUDA), the
        next step's batch is collated and pinned in a background thread while
        this one trains (unless collating draws random numbers: ``prefetch``), then
        copied with non_blocking=True; elsewhere in line (``prefetch`` overrides the choice).
        """
        pin = pin_and_prefetch(self.device)
        prefetch = pin if self.prefetch is None else self.prefetch

        def load(k: int) -> tuple[str, dict | None, float]:
            stream, indices = plan[k]
            mine = distributed.shard(indices) if self.world_size > 1 else indices
            if not mine:
                return stream, None, 0.0
            batch = self.collate(stream, mine)
            if pin:
                batch = {n: v.pin_memory() if isinstance(v, torch.Tensor) else v for n, v in batch.items()}
            return stream, batch, (len(mine) / len(indices) if self.world_size > 1 else 1)

        def on_device(item: tuple[str, dict | None, float]) -> tuple[str, dict | None, float]:
            stream, batch, share = item
            return stream, (move_batch(batch, self.device) if batch is not None else None), share

        if not prefetch:
            for k in range(start, len(plan)):
                yield on_device(load(k))
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="collate") as pool:
            pending = pool.submit(load, start) if start < len(plan) else None
            for k in range(start, len(plan)):
                item = pending.result()
                pending = pool.submit(load, k + 1) if k + 1 < len(plan) else None
                yield on_device(item)

    # -- the loop --
    def run_epoch(self) -> float:
        """Train the steps ``plan[step:]`` of the current epoch, moving the position and telling the hooks before
        and after each (``on_step_begin``, ``on_step_end``; and around its optimizer step), then doing what they
        asked (``control``: an evaluation, a checkpoint, a stop; ``max_steps`` stops too); returns the learning rate
        of the last step."""
        n = len(self.plan)
        lr = self.lr_at(self.epoch, self.step, n)
        for stream, batch, share in self.batches(self.plan, self.step):
            lr = self.lr_at(self.epoch, self.step, n)
            self.emit("on_step_begin")
            terms = self.train_step(stream, batch, lr, share)
            if not self.skipped_last:
                self.epoch_sums.add(terms, share)
            step = Step(self.step, stream, batch, share, terms, lr, self.skipped_last)
            self.add_to_window(step)
            self.step += 1
            self.global_step += 1
            if self.max_steps is not None and self.global_step >= self.max_steps:
                self.control.should_training_stop = True
            self.emit("on_step_end", step)
            if self.hooks and (self.control.should_log or self.log_due(step)):
                self.control.should_log = False
                self.emit("on_log", self.log_values(step))
            if self.control.should_evaluate:
                self.control.should_evaluate = False
                self.evaluate_now()
            if self.control.should_save:
                self.control.should_save = False
                self.save_checkpoint("last")
            if self.control.should_training_stop:
                break
        return lr

    def fit(self) -> dict:
        """Train from the current position to the end (``epochs``, or ``max_steps``, or a hook's stop); returns
        the summary."""
        self.control = Control(should_training_stop=self.max_steps is not None and self.global_step >= self.max_steps)
        self.emit("on_train_start")
        if self._rng_to_restore is not None:
            set_rng_state(self._rng_to_restore, self.device)  # last: nothing after it may draw from the global RNGs
            self._rng_to_restore = None
        self.begin()
        with progress_logging():
            while self.epoch < self.epochs and not self.control.should_training_stop:
                self.start_epoch()
                self.plan = self.epoch_plan(self.epoch)
                t0 = time.perf_counter()
                self.start_window()
                self.emit("on_epoch_start")
                lr = self.run_epoch()
                if self.step == len(self.plan):
                    self.end_epoch(lr, time.perf_counter() - t0)
        self.finish()
        self.emit("on_train_end")
        return self.summary()

    def begin(self) -> None:
        """After on_train_start, before the first step (the RNG states of a resume are back)."""

    def start_epoch(self) -> None:
        """Before an epoch's plan is drawn (a stage that starts with it)."""

    def start_window(self) -> None:
        """An epoch's steps start a new log window."""
        self.window, self.window_seqs, self.t_window = RunningSums(), 0, time.perf_counter()

    def finish(self) -> None:
        """After the last step, before on_train_end."""

    def summary(self) -> dict:
        return {"epochs": self.epoch, "global_step": self.global_step}

    def next_epoch(self) -> None:
        """The position moves to the next epoch's first step; its loss sums start from zero."""
        self.epoch += 1
        self.step = 0
        self.epoch_sums = RunningSums()

    # -- checkpoints --
    def state(self) -> dict:
        """state.json: the position, the epoch's loss sums, the RNG states, the hooks' states and, under fp16, the loss
        scaler's state and the steps it skipped (JSON values).

        Under torchrun every rank must call it (it gathers): the loss sums are
        those of all ranks, "rng" is rank 0's state and "rng_other_ranks" the others'.
        """
        sums = self.epoch_sums.totals()
        rngs = distributed.gather(rng_state(self.device))
        hooks = {type(h).__name__: s for h in self.hooks if (s := h.state()) is not None}
        scaler = ({"scaler": {**self.scaler.state_dict(), "skipped_steps": self.skipped_steps,
                              "skipped_in_a_row": self.skipped_in_a_row}} if self.scaler is not None else {})
        return {"format": CHECKPOINT_FORMAT, "epoch": self.epoch, "step": self.step, "global_step": self.global_step,
                "epoch_sums": {k: [s, c] for k, (s, c) in sums.items()}, **({"hooks": hooks} if hooks else {}),
                **scaler, "rng": rngs[0], **({"rng_other_ranks": rngs[1:]} if len(rngs) > 1 else {})}

    def save_checkpoint(self, name: str = "last", extra_state: dict | None = None) -> Path:
        """Write checkpoint ``name`` atomically under ``checkpoints`` (``write_checkpoint_dir``), ``extra_state``
        merged into state.json, then tell the hooks (``on_save``). Under torchrun every rank calls it."""
        if self.checkpoints is None:
            raise RuntimeError("this trainer has no run directory (built without tasks.training.run.build_trainer): "
                               "nothing to save to")
        final = self.checkpoints / name
        self.write_checkpoint_dir(final, {**self.state(), **(extra_state or {})})
        self.emit("on_save", final)
        return final

    def load_checkpoint(self, ckpt: Path, state: dict) -> None:
        """A checked checkpoint (``state``: its state.json) into this loop: weights, optimizer, position, loss sums,
        hooks' states; its RNG states are put back when fit() starts."""
        load_training_state(ckpt, model=self.model, optimizer=self.optimizer, param_names=self.param_names,
                            state=state, device=self.device)
        self.epoch, self.step, self.global_step = state["epoch"], state["step"], state["global_step"]
        # The saved sums are over all ranks: rank 0 carries them on, the others start from zero.
        saved_sums = state["epoch_sums"] if self.rank == 0 else {}
        self.epoch_sums = RunningSums({k: torch.tensor(v, dtype=torch.float32, device=self.device)
                                       for k, (v, _) in saved_sums.items()},
                                      {k: c for k, (_, c) in saved_sums.items()})
        if self.scaler is not None and "scaler" in state:  # fp16: the loss scale and its growth count go on
            saved = dict(state["scaler"])
            self.skipped_steps, self.skipped_in_a_row = saved.pop("skipped_steps"), saved.pop("skipped_in_a_row")
            self.scaler.load_state_dict(saved)
        saved_hooks = state.get("hooks", {})
        for hook in self.hooks:
            if type(hook).__name__ in saved_hooks:
                hook.load_state(saved_hooks[type(hook).__name__])
        self._rng_to_restore = self._rank_rng(state)
        self.resumed_from = ckpt

    def _rank_rng(self, state: dict) -> dict:
        """The RNG state this rank resumes from: its own when the checkpoint has one, else a fresh seeded one."""
        others = state.get("rng_other_ranks", [])
        if self.rank == 0:
            return state["rng"]
        if len(others) == self.world_size - 1:
            return others[self.rank - 1]
        logger.warning("rank %d: the checkpoint holds the RNG states of %d process(es), this run has %d: this rank "
                       "draws fresh dropout masks, so the run will not repeat the interrupted one bit for bit",
                       self.rank, len(others) + 1, self.world_size)
        seed_everything(distributed.rank_seed(self.seed, self.rank, state["global_step"]))
        return rng_state(self.device)
