"""The multitask ``Trainer``: fine-tuning on the training loop (tasks/training/loop.py, where MLM pretraining runs
too: tasks/training/pretraining.py).

Usage:
    with trainer_for(TrainConfig(out_dir="runs/try")) as trainer:  # tasks.training.run: checks, builds, run dir
        summary = trainer.fit()                                    # every epoch; checkpoints last / best
    trainer = Trainer(cfg, build_parts(cfg, device), device=device)  # no run directory (benchmarks, tests)

The loop trains every epoch's plan of steps and tells its hooks (log lines and their clock, the progress bar,
checkpoints every N steps, metrics.jsonl, training.png, TensorBoard: tasks/training/hooks.py) what happened; the
Trainer says what it trains: the plan, the batch, the loss, the learning rate, what an epoch's end does and what a
checkpoint holds.

The ``Trainer`` (multitask fine-tuning):
1. ``MultitaskSchedule.epoch_plan(epoch)`` lists (stream, batch) steps
   (sequential / round_robin / even). One step is one batch of one stream,
   and its loss is

       w_stream · (s · head_loss + Σ_objectives Σ_terms term_weight_o(term) · term)

   with w the stream's loss weight (§4.2 loss rescaling), s the product of the
   applying objectives' ``task_loss_scale`` (SCL's 1 − λ), and terms the
   unweighted named losses each applying objective returns (``term_weight``:
   its ``weight``, times RIFT's β or α). The "nli" stream has no head loss:
   only its objectives (MNR, §4.2) train on it. Every term is logged under
   ``<stream>/loss`` (the head) or ``<stream>/<objective>.<term>``, plus the
   weighted total ``loss``.
2. After every epoch: dev metrics (tasks.evaluation.evaluator), checkpoint
   ``last``, ``best`` when the overall dev score improved, and the epoch's
   record for the hooks (metrics.jsonl, the plot).
3. Stages (tasks/training/stages.py), by epoch: LP-FT's heads-only epochs
   (``lpft.epochs``, stage "lp"), then ``epochs`` of full fine-tuning (stage "ft")
   with a fresh optimizer; then, with ``swa.epochs``, the SWA stage: from the
   best checkpoint, every parameter trainable, a fresh optimizer at constant ``swa.lr``, epochs that are not
   evaluated nor checkpointed, whose average SWA's hook scores at the end.

Determinism: the Trainer's batches come from explicit generators (a pure
function of seed and epoch; MLM's collator keeps its generator's state in the
checkpoint); dropout draws from torch's global RNG, whose state is saved with
every checkpoint, so ``resume_from`` continues bit for bit on CPU.

Throughput: losses stay tensors on the device; the loop reads them back for a log line
once per ``log_every`` steps. On CUDA the next batch is collated and pinned in
a background thread while the current one trains, and copied to the GPU with
non_blocking=True.

Several processes (``torchrun``, tasks/training/distributed.py): ``batch_size`` is the
global batch, rank r trains on every N-th example of each global batch (same
schedule and seed on every rank) and gradients are averaged over the ranks
after backward, so N processes take the steps one process would take with the
same batch size. Only rank 0 evaluates and writes files; the other ranks wait
for its dev scores between epochs. Each rank draws its own dropout masks;
checkpoints keep every rank's RNG state, so a resume with the same N
continues bit for bit.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tasks.train_config import TrainConfig
from tasks.data.schedule import LossWeights
from tasks.evaluation.evaluator import Evaluator
from tasks.evaluation.metrics import jsonable
from tasks.model import MultitaskBert
from tasks.objectives import Objective
from tasks.run_tasks import RunTasks
from tasks.training import distributed
from tasks.training.stages import Stage, check_stages, stages_of
from tasks.checkpoint import (
    ResumePoint,
    load_objectives_state,
    load_weights,
    resolve_checkpoint,
    write_checkpoint,
)
from tasks.storage import atomic_directory
from tasks.training.loop import Evaluation, Hook, Loop
from tasks.training.optim import adamw, build_schedule, lr_scale
from tasks.training.rundir import RunDir
from tasks.runtime import autocast, busy_cpu_note, loss_scaler, precision_note, seed_everything
from tasks.evaluation.metrics import describe_selection
from tasks.logs import count
from tasks.task_file import inferred_note

logger = logging.getLogger(__name__)


class Trainer(Loop):
    """Multitask fine-tuning on the loop: one run over built parts; tasks.training.run builds them (``build_parts``),
    its run directory and its hooks.

    ``resume`` (a checkpoint checked by ``resume_point``) restores model,
    objectives, optimizer, position (epoch, step), best score, history and RNG
    states. Under torchrun each process builds its own Trainer (``rank`` of
    ``world_size``); its collectives (gradient all-reduce, loss sums at log
    time, dev scores, checkpoint states) are entered by every rank at the same
    steps. Hooks run on every rank. Its stages (tasks/training/stages.py: LP-FT's, fine-tuning, SWA's; ``stages``
    given, or the config's) are run in order by epoch; the trainer asks the stage of an epoch what to train and at
    what learning rate, and the stage training ends in which model predicts.
    """

    saves_each_epoch = True

    def __init__(self, cfg: TrainConfig, parts: Parts, *, device: torch.device, hooks: Sequence[Hook] = (),
                 run_dir: RunDir | None = None, resume: ResumePoint | None = None,
                 stages: Sequence[Stage] | None = None) -> None:
        super().__init__(parts.model, device=device, hooks=hooks, grad_clip=cfg.grad_clip, seed=cfg.seed,
                         checkpoints=run_dir.checkpoints if run_dir is not None else None,
                         scaler=loss_scaler(device, parts.amp_dtype), accumulation=parts.run.accumulation)
        self.stages = list(stages) if stages is not None else stages_of(cfg)
        check_stages(self.stages)
        self.cfg, self.run_dir, self.run = cfg, run_dir, parts.run
        self.objectives = parts.objectives
        self.train_sets, self.dev_sets, self.data = parts.train_sets, parts.dev_sets, parts.data
        self.tokenizer, self.amp_dtype, self.final_examples = parts.tokenizer, parts.amp_dtype, parts.final_examples
        for o in self.objectives:
            o.to(device)
            # Before the optimizer (an objective may add parameters) and before a checkpoint is
            # loaded (whatever this sets up, the checkpoint's state then overwrites).
            o.on_train_start(self.model, self.train_sets)
        coupled = [o.name for o in self.objectives if o.batch_coupled]
        if coupled and self.world_size > 1 and self.rank == 0:
            logger.warning("%d processes: objective(s) %s couple the examples of a batch and see each rank's shard "
                           "(%s) as their batch, not the global one (fewer in-batch negatives, per-rank KNN "
                           "queues): this run is not the one a single process with the same batch size would make",
                           self.world_size, ", ".join(coupled),
                           {s: b // self.world_size for s, b in self.run.batch_sizes.items()})
        if coupled and self.accumulation > 1 and self.rank == 0:
            logger.info("gradient accumulation: objective(s) %s couple the examples of a batch and see each "
                        "micro-batch (%s) as their batch, not the optimizer step's %s", ", ".join(coupled),
                        {s: b // self.world_size for s, b in self.run.batch_sizes.items()},
                        self.run.step_batch_sizes)
        # The stage of the position to start from decides which parameters the optimizer sees (one that starts from
        # the best checkpoint, SWA's, is entered when its first epoch starts: the run stands in the stage before).
        self.current = self.stage_at(min(resume.state["epoch"] if resume is not None else 0, self.training_epochs - 1))
        self.current.set_trainable(self.model)
        self.rebuild_optimizer()
        self.schedule = build_schedule(cfg, self.run, self.train_sets)
        # a task's prior probe is fitted on its training sentences, read already
        probes = {t: self.train_sets[t] for t, p in self.run.priors.items()
                  if p.kind == "probe" and t in self.train_sets}
        self.evaluator = Evaluator(cfg, self.run, self.objectives, self.device, self.amp_dtype,  # priors: at first use
                                   probe_train={t: (d.texts, d.labels.tolist()) for t, d in probes.items()})
        self.weights = LossWeights(dict(self.run.weights))
        self.log_every = cfg.log_every
        self.elapsed = 0.0  # training seconds before this process (resumed runs)
        if resume is not None:
            self.load_checkpoint(resume.checkpoint, resume.state)
        elif self.rank > 0:
            seed_everything(distributed.rank_seed(cfg.seed, self.rank))  # this rank's own dropout masks
        if cfg.compile:
            self.model.encoder.compile()

    # -- building --
    def rebuild_optimizer(self) -> None:
        """A fresh AdamW (no moments) over the model's and objectives' parameters trainable now (at the start, LP-FT
        stage 2, the SWA stage), each at its lr factor (``lr_scale``)."""
        sources = [("model", self.model)] + [(f"objectives.{o.name}", o) for o in self.objectives]
        named = [(f"{prefix}.{n}", p) for prefix, module in sources for n, p in module.named_parameters()]
        layers = self.model.encoder.config.num_hidden_layers
        fused = self.cfg.fused_adamw
        self.params, self.param_names, self.optimizer = adamw(
            named, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay, foreach=not fused, fused=fused,
            lr_scale_of=lambda n: lr_scale(n, layers, self.cfg.layer_lr_decay, self.cfg.head_lr_scale))

    @property
    def training_epochs(self) -> int:
        """The epochs that train and are scored: the stages that evaluate (LP-FT's, fine-tuning); SWA's come after."""
        return sum(st.epochs for st in self.stages if st.evaluates)

    @property
    def epochs(self) -> int:
        return sum(st.epochs for st in self.stages)

    @property
    def stage(self) -> str:
        """The name of the stage training now ("lp", "ft", "swa": tasks/training/stages.py)."""
        return self.current.name

    def stage_at(self, epoch: int) -> Stage:
        """The stage of 0-based ``epoch``."""
        return next((st for st in self.stages if st.first <= epoch < st.first + st.epochs), self.stages[-1])

    @property
    def epoch_title(self) -> str:
        return self.stage_at(self.epoch).title(self.epoch, self.training_epochs)

    @property
    def resumable(self) -> bool:
        return self.current.evaluates

    # -- what it trains --
    def epoch_plan(self, epoch: int) -> Sequence[tuple[str, list[int]]]:
        return self.schedule.epoch_plan(epoch)

    def collate(self, stream: str, indices: list[int]) -> dict:
        return self.train_sets[stream].collate(indices)

    def lr_at(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        """The learning rate of plan(epoch)[step]: its stage's (the run's lr_schedule over the stage's own epochs,
        SWA's constant ``swa.lr``)."""
        return self.stage_at(epoch).lr_at(self.cfg, epoch, step, steps_per_epoch)

    def step_loss(self, stream: str, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(weighted total loss, unweighted named terms) of one batch of ``stream``."""
        applying = [o for o in self.objectives if o.applies_to(stream)]
        terms: dict[str, torch.Tensor] = {}
        total: torch.Tensor | float = 0.0
        out = None
        with autocast(self.device, self.amp_dtype):
            task = self.model.head_of(stream)
            if task is not None:
                out = self.model(task, batch)
                head = self.model.task_loss(task, out, batch)
                terms[f"{stream}/loss"] = head
                total = math.prod(o.task_loss_scale for o in applying) * head
            for o in applying:
                for name, value in o(self.model, stream, batch, out).items():
                    terms[f"{stream}/{o.name}.{name}"] = value
                    total = total + o.term_weight(name) * value
        if not isinstance(total, torch.Tensor):
            raise RuntimeError(f"the {stream} batch produced no loss term (objectives here: "
                               f"{[o.name for o in applying]})")
        return self.weights.get(stream) * total, terms

    def after_optimizer_step(self) -> None:
        for o in self.objectives:
            o.on_step_end(self.model)

    # -- stages and epochs --
    def begin(self) -> None:
        self.current.train_mode(self.model)
        if self.epoch < self.training_epochs:
            self.outlook = self.log_plan()
        if self.epoch >= self.training_epochs:
            logger.info("nothing to train; what follows training runs again: %sthe best checkpoint's dev and test "
                        "predictions", "SWA from the best epoch, then " if self.stages[-1].from_best else "")
        elif self.current.begins:
            logger.info(self.current.begins.format(epoch=self.epoch + 1, tensors=len(self.params)))

    def log_plan(self) -> dict:
        """Log what the run will do (device, precision and why, threads, the plan of steps and evaluations, what a
        user's task file made of a task, how the best epoch is chosen); return its outlook for a clock
        (``TrainingState.outlook``)."""
        cfg = self.cfg
        epochs = range(self.epoch, self.training_epochs)
        plans = {e: self.schedule.epoch_plan(e) for e in epochs}
        steps = sum(len(p) for p in plans.values()) - self.step
        per_task: dict[str, int] = {}
        for stream, idx in plans[self.epoch]:
            per_task[stream] = per_task.get(stream, 0) + len(idx)

        def scored(task: str, n: int) -> int:  # a pair scored in both orders is two sequences' work
            return n * (2 if cfg.symmetric_eval and cfg.entries[task].symmetric else 1)

        dev = {t: len(d) for t, d in self.dev_sets.items()}
        final = {(t, split): len(rows) for split, by_task in (self.final_examples or {}).items()
                 for t, rows in by_task.items() if rows is not None}
        if self.rank == 0:
            logger.info("%s, %s, %s | plan: %s x %s steps (%d to go): %s examples an epoch; dev scores "
                        "after each epoch on %s; then the best epoch predicts the whole dev and test sets%s",
                        self.device, precision_note(cfg.bf16, self.device, self.amp_dtype, fp16=cfg.fp16),
                        count(torch.get_num_threads(), "thread"), count(len(plans), "epoch"),
                        "/".join(str(len(p)) for p in plans.values()), steps,
                        ", ".join(f"{t} {n}" for t, n in per_task.items()),
                        ", ".join(f"{t} {n}" for t, n in dev.items()),
                        " (pairs in both orders)" if cfg.symmetric_eval and any(cfg.entries[t].symmetric for t in dev)
                        else "")
            if cfg.freeze_layers is not None and self.current.trains_encoder:
                trainable = sum(p.numel() for p in self.params)
                total = sum(p.numel() for p in self.model.parameters())
                logger.info("frozen: the encoder's embeddings%s (%.1fM of the model's %.1fM parameters train)",
                            f" and its lowest {count(cfg.freeze_layers, 'layer')}" if cfg.freeze_layers else "",
                            trainable / 1e6, total / 1e6)
            if self.accumulation > 1:
                logger.info("gradient accumulation: each optimizer step takes %d micro-batches (%s examples a "
                            "step, in micro-batches of %s); the learning rate schedule and the step counts count "
                            "optimizer steps", self.accumulation, self.run.step_batch_sizes, dict(self.run.batch_sizes))
            if busy := busy_cpu_note(torch.get_num_threads(), self.device):
                logger.warning(busy)
            for task in cfg.tasks:  # what a user's task file made of the task
                entry = cfg.entries[task]
                if entry.origin.get("file"):
                    note = inferred_note(entry)
                    logger.info("task %s%s", entry.describe(), f"; {note}" if note else "")
            logger.info("the best epoch is the one of the highest dev overall: %s%s", describe_selection(
                cfg.tasks, cfg.best_metric, cfg.entries), "" if cfg.best_metric else " (--best-metric chooses another)")
        costs = [self.train_sets[stream].padded_tokens(idx) for e, p in plans.items()
                 for stream, idx in (p[self.step:] if e == self.epoch else p)]
        return {"costs": costs, "evaluations": len(plans), "dev_sequences": sum(scored(t, n) for t, n in dev.items()),
                "final_sequences": sum(scored(t, n) for (t, _), n in final.items())}

    def evaluate_now(self) -> None:
        """Dev scores between epochs, because a hook asked (``Control.should_evaluate``): told to the hooks (an
        ``Evaluation`` of scope "step"); the best epoch is still chosen among the epochs' own scores."""
        t0 = time.perf_counter()
        metrics = self.evaluate_dev()
        self.emit("on_evaluate", Evaluation("step", metrics, time.perf_counter() - t0))

    def start_epoch(self) -> None:
        stage = self.stage_at(self.epoch)
        # A stage whose epochs are not scored (SWA's, from the best checkpoint) comes after the scored ones and is
        # entered as its first epoch starts: the last scored epoch's checkpoints are the position a resume takes.
        if stage is not self.current and (stage.from_best or not stage.evaluates):
            self._enter(stage)

    def _enter(self, stage: Stage) -> None:
        """A stage switch at an epoch boundary (``Stage.enter``: its trainable parameters, a fresh optimizer, and
        whatever else the stage starts with: SWA's best checkpoint)."""
        self.current = stage
        stage.enter(self)

    def end_epoch(self, lr: float, train_time: float) -> None:
        """An epoch of a stage that evaluates: dev scores, the record, the best score, the next epoch's stage,
        checkpoint ``last`` (and ``best`` when it improved). Of one that does not (SWA's): its record only (its
        weights are not a position), and the stage's own end of an epoch."""
        stage = self.current
        if not stage.evaluates:
            record = {"epoch": self.epoch + 1, "stage": stage.name, f"{stage.name}_epoch": self.epoch - stage.first + 1,
                      "steps": len(self.plan), "lr": lr, "train": self.epoch_sums.means(),
                      "train_time_s": round(train_time, 2)}
            self.next_epoch()
            self.record(record)
            stage.end_epoch(self, record)
            self.emit("on_epoch_end", record)
            return
        t0 = time.perf_counter()
        means = self.epoch_sums.means()
        metrics = self.evaluate_dev()
        eval_time = time.perf_counter() - t0
        self.emit("on_evaluate", Evaluation("epoch", metrics, eval_time))
        score = metrics.get("overall", math.nan)
        # The first epoch is the best so far even with an undefined score (a constant STS prediction has no r).
        improved = self.best is None or (math.isfinite(score) and (self.best["score"] is None
                                                                    or score > self.best["score"]))
        self.elapsed += train_time + eval_time
        record = {"epoch": self.epoch + 1, "stage": stage.name, "global_step": self.global_step, "lr": lr,
                  "train": means,
                  "dev": jsonable(metrics), "dev_examples": {t: len(d) for t, d in self.dev_sets.items()},
                  "train_time_s": round(train_time, 2), "eval_time_s": round(eval_time, 2),
                  "elapsed_s": round(self.elapsed, 2), "best": improved,
                  **({"skipped_steps": self.skipped_steps} if self.scaler is not None else {}),  # fp16's
                  **({"data": self.data} if self.epoch == 0 and self.data else {})}  # every file's ReadReport
        self.history.append(record)
        if improved:
            self.best = {"score": score if math.isfinite(score) else None, "epoch": self.epoch + 1,
                         "stage": stage.name, "dev": jsonable(metrics)}
        self.next_epoch()
        following = self.stage_at(self.epoch)
        if self.epoch < self.training_epochs and following is not stage and not following.from_best:
            self._enter(following)  # before the checkpoint: it saves the new stage's optimizer
        self.save_checkpoint("last")
        if improved and self.rank == 0:
            self.run_dir.keep_best()
        self.record(record)
        self.emit("on_epoch_end", record)

    def finish(self) -> None:
        self.current.finish(self)  # a stage's own end (SWA: score and keep the average), before on_train_end

    def summary(self) -> dict:
        stages = {st.name: own for st in self.stages if (own := st.summary()) is not None}  # SWA's
        return {"best": self.best, "epochs": self.epoch, "global_step": self.global_step, **stages}

    def evaluate_dev(self, model: nn.Module | None = None) -> dict[str, float]:
        """Dev metrics of ``model`` (default: the trained one) on the run's dev sets.

        Under torchrun rank 0 evaluates and the other ranks wait for its scores
        (one process evaluates: simple, and cheap next to an epoch of training
        with the capped dev sets).
        """
        metrics: dict[str, float] = {}
        if self.rank == 0:
            metrics, _ = self.evaluator.evaluate(model or self.model, self.dev_sets)
        return distributed.broadcast_from_main(metrics)

    # -- checkpoints --
    def state(self) -> dict:
        """state.json (tasks/checkpoint.py): the loop's (position, loss sums, RNG states), the best score, the
        history, the training time and the data files' fingerprints."""
        return {**super().state(), "best": self.best, "history": self.history, "elapsed_s": self.elapsed,
                "data_sha256": {name: report["sha256"] for name, report in (self.data or {}).items()}}

    def write_checkpoint_dir(self, final: Path, state: dict) -> None:
        """tasks/checkpoint.py's files; under torchrun rank 0 writes them, the others add their rank-local objective
        state."""
        if self.rank > 0:
            distributed.save_rank_objectives(self.objectives, self.model, self.rank, self.world_size)
            return
        with atomic_directory(final) as tmp, distributed.rank_objectives_saved(tmp, self.objectives, self.model,
                                                                               self.world_size):
            write_checkpoint(tmp, model=self.model, objectives=self.objectives, optimizer=self.optimizer,
                             param_names=self.param_names, state=state, config=self.cfg, tokenizer=self.tokenizer,
                             priors=self.evaluator.priors.states())
        self.run_dir.checkpoint_written()  # a run that --overwrite moved aside is deleted now

    def load_checkpoint(self, ckpt: Path, state: dict) -> None:
        """The position ``resume_point`` checked (a training position of this format) into this trainer."""
        super().load_checkpoint(ckpt, state)
        load_objectives_state(self.objectives, self.model, ckpt, self.device, self.rank)
        self.best, self.history, self.elapsed = state["best"], state["history"], state["elapsed_s"]
        self.evaluator.priors.checkpoint = ckpt  # its probes, not new fits
        if self.epoch >= self.training_epochs:
            logger.info("resumed from %s: the run is finished (%d of %d epochs trained, global step %d)", ckpt,
                        self.epoch, self.training_epochs, self.global_step)
        else:
            logger.info("resumed from %s at epoch %d step %d (global step %d)", ckpt, self.epoch + 1, self.step,
                        self.global_step)

    # -- after training --
    def load_best(self) -> Path:
        """Load the best checkpoint's model and objectives weights into the live model."""
        distributed.barrier()  # under torchrun: rank 0 has finished writing it
        best = resolve_checkpoint(self.checkpoints / "best")
        load_weights(self.model, best, self.device)
        load_objectives_state(self.objectives, self.model, best, self.device, self.rank)
        return best

    # -- closing --
    def close(self, error: BaseException | None = None) -> None:
        """Close every hook (Hook.close: writers, files), then release the run directory (its lock; from Python,
        its train.log and the logging it set up), where the trainer has one; ``error``: the one that ended the
        run (RunDir.close)."""
        for hook in self.hooks:
            hook.close()
        if self.run_dir is not None:
            self.run_dir.close(error)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: Any) -> None:
        self.close(error)


# ---- what a Trainer trains ----


@dataclass
class Parts:
    """What a Trainer trains: built from a TrainConfig by ``build_parts``, or by hand in tests."""

    model: MultitaskBert
    objectives: list[Objective]
    train_sets: dict[str, Any]
    dev_sets: dict[str, Any]
    run: RunTasks  # the run's tasks, streams and priors resolved (TrainConfig.resolve)
    tokenizer: Any = None
    amp_dtype: torch.dtype | None = None
    data: dict[str, dict] | None = None  # ReadReport.to_dict() of every file read, by "<task> <split>"
    final_examples: dict[str, dict[str, Any]] | None = None  # RunData.final_examples: the dev and test files
