"""The Trainer: one generic training loop for every task, schedule and objective.

Usage:
    trainer = trainer_for(TrainConfig(out_dir="runs/try"))   # tasks.training.run: checks, builds, run dir
    summary = trainer.fit()                                          # every epoch; checkpoints last / best
    trainer = Trainer(cfg, build_parts(cfg, device), device=device)  # no run directory (benchmarks, tests)

What ``fit`` does:
1. Every epoch, ``MultitaskSchedule.epoch_plan(epoch)`` lists (stream, batch)
   steps (sequential / round_robin / even). One step is one batch of one
   stream, and its loss is

       w_stream · (s · head_loss + Σ_objectives Σ_terms term_weight_o(term) · term)

   with w the stream's loss weight (§4.2 loss rescaling), s the product of the
   applying objectives' ``task_loss_scale`` (SCL's 1 − λ), and terms the
   unweighted named losses each applying objective returns (``term_weight``:
   its ``weight``, times RIFT's β or α). The "nli" stream has no head loss:
   only its objectives (MNR, §4.2) train on it. Every term is logged under
   ``<stream>/loss`` (the head) or ``<stream>/<objective>.<term>``, plus the
   weighted total ``loss``.
2. After every epoch: dev metrics (tasks.evaluation.evaluator), a JSONL record, the plot,
   and checkpoint ``last``; ``best`` when the overall dev score improved.

``run_epoch`` is the one loop over a plan's steps; the SWA phase (tasks/training/swa.py)
runs its epochs through it too. LP-FT (``lp_epochs``, tasks/training/lpft.py): the first
``lp_epochs`` epochs train the heads only (stage "lp", encoder frozen), then
``epochs`` of full fine-tuning follow with a fresh optimizer, in the same loop.

Determinism: batches come from explicit generators (a pure function of seed
and epoch); dropout draws from torch's global RNG, whose state is saved with
every checkpoint, so ``resume_from`` continues bit for bit on CPU.

Throughput: losses are accumulated as tensors on the device and read back
only at log time (one sync per ``log_every`` steps). On CUDA the next batch is
collated and pinned in a background thread while the current one trains, and
copied to the GPU with non_blocking=True.

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
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from minbert.optimizer import AdamW
from tasks.config import TrainConfig
from tasks.data.datasets import move_batch
from tasks.data.schedule import LossWeights, MultitaskSchedule
from tasks.evaluation.evaluator import Evaluator
from tasks.evaluation.metrics import jsonable
from tasks.model import PHRASES, MultitaskBert, head_of
from tasks.task import get_task, task_with
from tasks.objectives import Objective
from tasks.training import distributed, lpft
from tasks.checkpoint import (
    CHECKPOINT_FORMAT,
    ResumePoint,
    load_objectives_state,
    load_optimizer_state,
    resolve_checkpoint,
    write_checkpoint,
)
from tasks.storage import atomic_directory, load_tensors, read_json
from tasks.training.progress import RunClock, RunningSums, duration, progress_logging, sequences
from tasks.training.rundir import RunDir
from tasks.runtime import (
    autocast,
    pin_and_prefetch,
    precision_note,
    rng_state,
    seed_everything,
    set_rng_state,
    synchronize,
)

logger = logging.getLogger(__name__)


class Hook:
    """Callbacks around the loop (custom logging, early stops); override what you need.

    ``trainer`` gives access to the model, optimizer, config and position
    (``epoch``, ``step``, ``global_step``). Hooks run after the step's
    checkpoint; they do not run during the SWA phase.
    """

    def on_train_start(self, trainer: Trainer) -> None: ...

    def on_step_end(self, trainer: Trainer) -> None: ...

    def on_epoch_end(self, trainer: Trainer, record: dict) -> None: ...

    def on_train_end(self, trainer: Trainer) -> None: ...


def lr_scale(name: str, layers: int, layer_decay: float, head_scale: float) -> float:
    """The factor on the lr of the parameter ``name`` (as in ``Trainer.param_names``).

    Layer-wise decay (Sun et al. 2019, "How to Fine-Tune BERT for Text
    Classification" §5.3): encoder layer i of ``layers`` (0 = the lowest) at
    ``layer_decay^(layers-1-i)``, the embeddings at ``layer_decay^layers``, the
    pooler at 1. Everything outside the encoder (heads, objectives) at ``head_scale``.
    """
    prefix = "model.encoder."
    if not name.startswith(prefix):
        return head_scale
    rest = name[len(prefix):]
    if rest.startswith("embeddings."):
        return layer_decay ** layers
    if rest.startswith("encoder.layer."):
        return layer_decay ** (layers - 1 - int(rest.split(".")[2]))
    return 1.0


def parameter_groups(named: Sequence[tuple[str, nn.Parameter]], weight_decay: float,
                     lr_scale_of: Callable[[str], float] = lambda name: 1.0) -> tuple[list[dict], list[str]]:
    """AdamW's parameter groups of the trainable ``named`` parameters (a parameter shared under two names counts
    once), and the parameters' names in group order (a checkpoint's optimizer state names them).

    One group per (lr factor, decays or not): matrices decay, biases and LayerNorm weights (ndim < 2) do not, as
    in BERT; a group whose factor (``lr_scale_of(name)``) is not 1 carries it as ``lr_scale``, which multiplies the
    step's lr (``Trainer.train_step``). MLM pretraining (tasks/training/mlm.py) builds its groups here too.
    """
    seen: set[int] = set()
    unique = []
    for n, p in named:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            unique.append((n, p))
    by_key: dict[tuple[float, bool], list[tuple[str, nn.Parameter]]] = {}
    for decays in (True, False):
        for n, p in unique:
            if (p.ndim >= 2) == decays:
                by_key.setdefault((lr_scale_of(n), decays), []).append((n, p))
    groups = [{"params": [p for _, p in members], "weight_decay": weight_decay if decays else 0.0}
              | ({"lr_scale": scale} if scale != 1 else {}) for (scale, decays), members in by_key.items()]
    return groups, [n for members in by_key.values() for n, _ in members]


def warmup_linear(peak: float, t: int, total: int, warm: int, decay: bool = True) -> float:
    """The learning rate of step ``t`` (from 0) of ``total``: BERT's linear warm-up over the first ``warm`` steps
    to ``peak``, then a linear decay to 0 at ``total`` (``decay``) or ``peak`` on (MLM's "constant")."""
    if t < warm:
        return peak * (t + 1) / warm
    return peak * (total - t) / max(total - warm, 1) if decay else peak


def build_schedule(cfg: TrainConfig, train_sets: dict) -> MultitaskSchedule:
    """The run's epoch plans (tasks/data/schedule.py) over its tokenized training sets, as ``cfg`` says."""
    phrases = PHRASES in train_sets
    caps = {**cfg.max_train_examples, **({PHRASES: cfg.sst_phrases.per_epoch} if phrases else {})}
    return MultitaskSchedule({s: d.lengths for s, d in train_sets.items()}, cfg.batch_sizes(), cfg.schedule,
                             seed=cfg.seed, max_examples_per_epoch=caps, subsets=cfg.train_subsets,
                             swap={t: cfg.pair_swap for t in cfg.tasks if get_task(t).kind.pair and t in train_sets},
                             first=(PHRASES,) if phrases and cfg.sst_phrases.order == "first" else ())


class Trainer:
    """One training run over built parts; tasks.training.run builds them (``build_parts``) and its run directory.

    ``checkpoint`` (a checkpoint directory) restores model, objectives,
    optimizer, position (epoch, step), best score, history and RNG states.
    Under torchrun each process builds its own Trainer (``rank`` of
    ``world_size``); its collectives (gradient all-reduce, loss sums at log
    time, dev scores, checkpoint states) are entered by every rank at the same
    steps. Hooks run on every rank.
    """

    # Collate the next batch in a background thread (``batches``); None = on CUDA only.
    prefetch: bool | None = None

    def __init__(self, cfg: TrainConfig, parts: Parts, *, device: torch.device, hooks: Sequence[Hook] = (),
                 run_dir: RunDir | None = None, resume: ResumePoint | None = None) -> None:
        self.cfg, self.device, self.hooks, self.run_dir = cfg, device, list(hooks), run_dir
        self.model, self.objectives = parts.model, parts.objectives
        self.train_sets, self.dev_sets, self.data = parts.train_sets, parts.dev_sets, parts.data
        self.tokenizer, self.amp_dtype, self.final_examples = parts.tokenizer, parts.amp_dtype, parts.final_examples
        self.rank, self.world_size = distributed.rank(), distributed.world_size()
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
                           {s: b // self.world_size for s, b in cfg.batch_sizes().items()})
        # LP-FT: the stage of the position to start from decides which parameters the optimizer sees.
        self.stage = lpft.stage_at(cfg, resume.state["epoch"] if resume is not None else 0)
        lpft.set_stage(self.model, self.stage)
        self.params, self.param_names, self.optimizer = self._build_optimizer()
        self.schedule = build_schedule(cfg, self.train_sets)
        # the SST prior's probe is fitted on the sentences read already (of the task whose entry takes it)
        probe = self.train_sets.get(task_with(cfg.tasks, "probe_prior") or "")
        self.evaluator = Evaluator(cfg, self.objectives, self.device, self.amp_dtype,  # priors: at the first use
                                   probe_train=(probe.texts, probe.labels.tolist()) if probe is not None else None)
        self.weights = LossWeights(dict(cfg.loss_weights)
                                   | ({PHRASES: cfg.sst_phrases.weight} if PHRASES in self.train_sets else {}))

        # Position: the next step to run is plan(epoch)[step].
        self.epoch = 0
        self.step = 0
        self.global_step = 0
        self.best: dict | None = None
        self.history: list[dict] = []
        self.epoch_sums = RunningSums()  # steps (under torchrun: this rank's shares of them)
        self.elapsed = 0.0  # training seconds before this process (resumed runs)
        self._rng_to_restore = None
        self.clock: RunClock | None = None  # while fit() trains
        if resume is not None:
            self._load_checkpoint(resume.checkpoint, resume.state)
        elif self.rank > 0:
            seed_everything(distributed.rank_seed(cfg.seed, self.rank))  # this rank's own dropout masks
        if cfg.compile:
            self.model.encoder.compile()

    # -- building --
    def _build_optimizer(self) -> tuple[list[nn.Parameter], list[str], AdamW]:
        """AdamW over the model's and objectives' trainable parameters (``parameter_groups``)."""
        sources = [("model", self.model)] + [(f"objectives.{o.name}", o) for o in self.objectives]
        named = [(f"{prefix}.{n}", p) for prefix, module in sources for n, p in module.named_parameters()]
        layers = self.model.encoder.config.num_hidden_layers
        groups, names = parameter_groups(named, self.cfg.weight_decay, lambda n: lr_scale(
            n, layers, self.cfg.layer_lr_decay, self.cfg.head_lr_scale))
        fused = self.cfg.fused_adamw
        opt = AdamW(groups, lr=self.cfg.lr, decay="before", foreach=not fused, fused=fused)  # the fused kernel's order
        return [p for g in groups for p in g["params"]], names, opt

    def rebuild_optimizer(self) -> None:
        """A fresh AdamW (no moments) over the parameters trainable now: LP-FT stage 2, the SWA phase."""
        self.params, self.param_names, self.optimizer = self._build_optimizer()

    @property
    def total_epochs(self) -> int:
        """Epochs of the training loop: LP-FT's heads-only epochs, then ``epochs`` of fine-tuning."""
        return self.cfg.lpft.epochs + self.cfg.epochs

    # -- learning rate --
    def lr_at(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        """The learning rate of plan(epoch)[step] under ``lr_schedule``, run within epoch's LP-FT stage."""
        cfg = self.cfg
        first, n_epochs, peak = lpft.stage_span(cfg, epoch)
        epoch -= first
        if cfg.lr_schedule == "constant":
            return peak
        if cfg.lr_schedule == "epoch_decay":
            return peak - cfg.lr_decay * epoch
        total = n_epochs * steps_per_epoch
        return warmup_linear(peak, epoch * steps_per_epoch + step, total, round(cfg.warmup * total))

    # -- one step --
    def step_loss(self, stream: str, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(weighted total loss, unweighted named terms) of one batch of ``stream``."""
        applying = [o for o in self.objectives if o.applies_to(stream)]
        terms: dict[str, torch.Tensor] = {}
        total: torch.Tensor | float = 0.0
        out = None
        with autocast(self.device, self.amp_dtype):
            task = head_of(stream)
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

    def train_step(self, stream: str, batch: dict | None, lr: float, share: float = 1) -> dict[str, torch.Tensor]:
        """One optimizer step on one batch; returns the detached terms plus the weighted total "loss".

        Under torchrun ``batch`` is this rank's shard of the global batch (None
        when the shard is empty: a partial last batch smaller than the world)
        and ``share`` its fraction of the global batch. The loss is scaled by
        share × world before backward, so the gradients averaged over the ranks
        (``distributed.all_reduce_gradients``) are those of the global batch's
        mean loss; clipping then acts on the averaged gradients, the same on every rank.
        """
        for g in self.optimizer.param_groups:
            g["lr"] = lr * g["lr_scale"] if "lr_scale" in g else lr
        detached: dict[str, torch.Tensor] = {}
        if batch is not None:
            loss, terms = self.step_loss(stream, batch)
            scale = share * self.world_size
            (loss if scale == 1 else loss * scale).backward()
            detached = {k: v.detach().float() for k, v in terms.items()}
            detached["loss"] = loss.detach().float()
        distributed.all_reduce_gradients(self.params)
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        for o in self.objectives:
            o.on_step_end(self.model)
        return detached

    def batches(self, plan: Sequence[tuple[str, list[int]]], start: int = 0
                ) -> Iterator[tuple[str, dict | None, float]]:
        """(stream, batch on the device, share) for each step of ``plan[start:]``.

        One process: the whole batch, share 1. Under torchrun: this rank's
        shard ``indices[rank::world]`` (None when empty) and its fraction of
        the global batch. Where ``runtime.pin_and_prefetch`` says so (CUDA), the
        next step's batch is collated and pinned in a background thread while
        this one trains (collate draws no random numbers), then copied with
        non_blocking=True; elsewhere in line (``prefetch`` overrides the choice).
        """
        pin = pin_and_prefetch(self.device)
        prefetch = pin if self.prefetch is None else self.prefetch

        def load(k: int) -> tuple[str, dict | None, float]:
            stream, indices = plan[k]
            mine = distributed.shard(indices) if self.world_size > 1 else indices
            if not mine:
                return stream, None, 0.0
            batch = self.train_sets[stream].collate(mine)
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
    def run_epoch(self, plan: Sequence[tuple[str, list[int]]], lr_of: Callable[[int], float], sums: RunningSums, *,
                  desc: str, start: int = 0, after_step: Callable[[], None] | None = None,
                  on_log: Callable[[dict[str, float]], None] | None = None) -> float:
        """Train the steps ``plan[start:]`` at learning rate ``lr_of(step)``, adding their terms to ``sums``.

        A log line (window means, lr, seq/s) every ``log_every`` steps of the
        plan, also given to ``on_log``; ``after_step`` runs after each step
        (the training loop's moves the position; the SWA phase runs outside
        it). Returns the learning rate of the last step.
        """
        n = len(plan)
        window, window_seqs, window_steps, t_window = RunningSums(), 0, 0, time.perf_counter()
        clock_steps, clock_seqs, t_clock = 0, 0, t_window  # the steps not yet given to the run's clock
        bar = tqdm(total=n, initial=start, desc=desc, dynamic_ncols=True,
                   disable=not sys.stderr.isatty() or self.rank > 0, leave=False)
        lr = lr_of(start)
        try:
            for k, (stream, batch, share) in enumerate(self.batches(plan, start), start):
                lr = lr_of(k)
                terms = self.train_step(stream, batch, lr, share)
                sums.add(terms, share)
                window.add(terms, share)
                window_seqs += sequences(batch)
                window_steps += 1
                clock_steps, clock_seqs = clock_steps + 1, clock_seqs + sequences(batch)
                bar.update(1)
                log_line = (k + 1) % self.cfg.log_every == 0
                if self.clock is not None and (log_line or self.clock.estimate_due(clock_steps)):
                    synchronize(self.device)  # the steps' device work is done: their time is real
                    now = time.perf_counter()
                    self.clock.trained(clock_steps, clock_seqs, now - t_clock)
                    clock_steps, clock_seqs, t_clock = 0, 0, now
                    if self.clock.estimate_due(0):
                        self.clock.estimated = True
                        logger.info("estimate after %d steps: the run takes ~%s in all, evaluations included "
                                    "(the steps left timed by their padded tokens)", self.clock.steps_done,
                                    duration(self.clock.total()))
                if log_line:
                    now = time.perf_counter()
                    means = window.means()  # the one device sync per log_every steps
                    seqs = distributed.sum_over_ranks({"seqs": window_seqs})["seqs"]
                    seq_per_s = seqs / max(now - t_window, 1e-9)
                    logger.info("%s step %d/%d | lr %.2e | %s | %.1f seq/s%s", desc, k + 1, n, lr,
                                " | ".join(f"{name} {v:.4f}" for name, v in means.items()), seq_per_s,
                                f" | {self.clock.line()}" if self.clock is not None else "")
                    if on_log is not None:
                        on_log({**means, "lr": lr, "seq_per_s": seq_per_s})
                    bar.set_postfix(loss=f"{means['loss']:.4f}")
                    window, window_seqs, window_steps, t_window = RunningSums(), 0, 0, now
                if after_step is not None:
                    after_step()
        finally:
            bar.close()
        if self.clock is not None and clock_steps:  # the steps after the last log line
            synchronize(self.device)
            self.clock.trained(clock_steps, clock_seqs, time.perf_counter() - t_clock)
        return lr

    def fit(self) -> dict:
        """Train from the current position to ``epochs``; returns a summary (best epoch, its dev metrics)."""
        for h in self.hooks:
            h.on_train_start(self)
        if self._rng_to_restore is not None:
            set_rng_state(self._rng_to_restore, self.device)  # last: nothing after it may draw from the global RNGs
            self._rng_to_restore = None
        lpft.train_mode(self.model, self.stage)
        if self.epoch >= self.total_epochs:
            logger.info("nothing to train; what follows training runs again: %sthe best checkpoint's dev and test "
                        "predictions", "SWA from the best epoch, then " if self.cfg.swa.epochs else "")
        else:
            self.clock = self._plan()
            if self.cfg.freeze_encoder:
                logger.info("frozen encoder: heads only for every epoch (%d trainable tensors)", len(self.params))
            elif self.stage == lpft.LP:
                logger.info("LP-FT stage 1: heads only for epochs %d-%d (encoder frozen, %d trainable tensors), "
                            "then %d epochs of full fine-tuning", self.epoch + 1, self.cfg.lpft.epochs,
                            len(self.params), self.cfg.epochs)
        with progress_logging():
            while self.epoch < self.total_epochs:
                self._train_epoch()
        self.clock = None  # the SWA phase and the final predictions run outside it
        for h in self.hooks:
            h.on_train_end(self)
        return {"best": self.best, "epochs": self.epoch, "global_step": self.global_step}

    def _plan(self) -> RunClock:
        """Log what the run will do (device, precision and why, threads, the plan of steps and evaluations), and
        return the clock that times it."""
        cfg = self.cfg
        epochs = range(self.epoch, self.total_epochs)
        plans = {e: self.schedule.epoch_plan(e) for e in epochs}
        steps = sum(len(p) for p in plans.values()) - self.step
        per_task: dict[str, int] = {}
        for stream, idx in plans[self.epoch]:
            per_task[stream] = per_task.get(stream, 0) + len(idx)

        def scored(task: str, n: int) -> int:  # a pair scored in both orders is two sequences' work
            return n * (2 if cfg.symmetric_eval and get_task(task).kind.pair else 1)

        dev = {t: len(d) for t, d in self.dev_sets.items()}
        final = {(t, split): len(rows) for split, by_task in (self.final_examples or {}).items()
                 for t, rows in by_task.items() if rows is not None}
        logger.info("%s, %s, %d threads | plan: %d epoch%s x %s steps (%d to go): %s examples an epoch; dev scores "
                    "after each epoch on %s; then the best epoch predicts the whole dev and test sets%s",
                    self.device, precision_note(cfg.bf16, self.device, self.amp_dtype), torch.get_num_threads(),
                    len(plans), "s" if len(plans) > 1 else "", "/".join(str(len(p)) for p in plans.values()), steps,
                    ", ".join(f"{t} {n}" for t, n in per_task.items()), ", ".join(f"{t} {n}" for t, n in dev.items()),
                    " (pairs in both orders)" if cfg.symmetric_eval else "")
        costs = [self.train_sets[stream].padded_tokens(idx) for e, p in plans.items()
                 for stream, idx in (p[self.step:] if e == self.epoch else p)]
        return RunClock(costs, len(plans), sum(scored(t, n) for t, n in dev.items()),
                        sum(scored(t, n) for (t, _), n in final.items()))

    def _train_epoch(self) -> None:
        cfg = self.cfg
        plan = self.schedule.epoch_plan(self.epoch)
        n = len(plan)
        t_epoch = time.perf_counter()

        def after_step() -> None:
            self.step += 1
            self.global_step += 1
            if cfg.checkpoint_every and self.global_step % cfg.checkpoint_every == 0 and self.step < n:
                self.save_checkpoint("last")
            for h in self.hooks:
                h.on_step_end(self)

        def on_log(values: dict[str, float]) -> None:  # the step just taken; after_step has not counted it yet
            if self.run_dir is not None:
                self.run_dir.log_line(self.global_step + 1, values)

        epoch = self.epoch
        lr = self.run_epoch(plan, lambda k: self.lr_at(epoch, k, n), self.epoch_sums,
                            desc=f"epoch {epoch + 1}/{self.total_epochs}", start=self.step, after_step=after_step,
                            on_log=on_log)
        self._end_epoch(lr, time.perf_counter() - t_epoch)

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

    def _end_epoch(self, lr: float, train_time: float) -> None:
        t0 = time.perf_counter()
        means = self.epoch_sums.means()
        metrics = self.evaluate_dev()
        eval_time = time.perf_counter() - t0
        if self.clock is not None:
            self.clock.evaluated(eval_time)
        score = metrics.get("overall", math.nan)
        # The first epoch is the best so far even with an undefined score (a constant STS prediction has no r).
        improved = self.best is None or (math.isfinite(score) and (self.best["score"] is None
                                                                    or score > self.best["score"]))
        self.elapsed += train_time + eval_time
        record = {"epoch": self.epoch + 1, "stage": self.stage, "global_step": self.global_step, "lr": lr,
                  "train": means,
                  "dev": jsonable(metrics), "dev_examples": {t: len(d) for t, d in self.dev_sets.items()},
                  "train_time_s": round(train_time, 2), "eval_time_s": round(eval_time, 2),
                  "elapsed_s": round(self.elapsed, 2), "best": improved,
                  **({"data": self.data} if self.epoch == 0 and self.data else {})}  # every file's ReadReport
        self.history.append(record)
        logger.info("epoch %d done in %.0f s (+%.0f s dev): %s | dev %s%s", self.epoch + 1, train_time, eval_time,
                    " ".join(f"{k} {v:.4f}" for k, v in means.items()),
                    " ".join(f"{k} {v:.4f}" for k, v in metrics.items()), " (best so far)" if improved else "")
        if improved:
            self.best = {"score": score if math.isfinite(score) else None, "epoch": self.epoch + 1,
                         "stage": self.stage, "dev": jsonable(metrics)}
        self.epoch += 1
        self.step = 0
        self.epoch_sums = RunningSums()
        if self.epoch < self.total_epochs and lpft.stage_at(self.cfg, self.epoch) != self.stage:
            self._enter_stage(lpft.stage_at(self.cfg, self.epoch))  # before the checkpoint: it saves the new optimizer
        self.save_checkpoint("last")
        if self.rank == 0:
            self.run_dir.end_epoch(record, self.history, improved)  # best (when improved), the record, the plot
        for h in self.hooks:
            h.on_epoch_end(self, record)

    def _enter_stage(self, stage: str) -> None:
        """LP-FT stage switch at an epoch boundary: (un)freeze the encoder, then a fresh optimizer."""
        lpft.set_stage(self.model, stage)
        self.stage = stage
        self.rebuild_optimizer()
        logger.info("LP-FT stage 2 from epoch %d: full fine-tuning of %d tensors with a fresh optimizer",
                    self.epoch + 1, len(self.params))

    # -- checkpoints --
    def state(self) -> dict:
        """state.json: the position, best score, history and RNG states (JSON values only).

        Under torchrun every rank must call it (it gathers): the loss sums are
        those of all ranks, "rng" is rank 0's state and "rng_other_ranks" the others'.
        """
        sums = self.epoch_sums.totals()
        rngs = distributed.gather(rng_state(self.device))
        return {"format": CHECKPOINT_FORMAT, "epoch": self.epoch, "step": self.step, "global_step": self.global_step,
                "best": self.best, "history": self.history, "elapsed_s": self.elapsed,
                "epoch_sums": {k: [s, c] for k, (s, c) in sums.items()},
                "data_sha256": {name: report["sha256"] for name, report in (self.data or {}).items()},
                "rng": rngs[0], **({"rng_other_ranks": rngs[1:]} if len(rngs) > 1 else {})}

    def save_checkpoint(self, name: str = "last", extra_state: dict | None = None) -> Path:
        """Write checkpoint ``name`` atomically under ``<out_dir>/checkpoints/`` (tasks/checkpoint.py),
        ``extra_state`` merged into state.json (SWA's marks itself "swa"). Under torchrun every rank calls it;
        rank 0 writes, the others add their rank-local objective state."""
        if self.run_dir is None:
            raise RuntimeError("this Trainer has no run directory (built without tasks.training.run.build_trainer): nothing to save to")
        final, state = self.run_dir.checkpoints / name, {**self.state(), **(extra_state or {})}
        if self.rank > 0:
            distributed.save_rank_objectives(self.objectives, self.model, self.rank, self.world_size)
            return final
        with atomic_directory(final) as tmp, distributed.rank_objectives_saved(tmp, self.objectives, self.model,
                                                                               self.world_size):
            write_checkpoint(tmp, model=self.model, objectives=self.objectives, optimizer=self.optimizer,
                             param_names=self.param_names, state=state, config=self.cfg, tokenizer=self.tokenizer,
                             sst_prior=self.evaluator.priors.sst_state())
        self.run_dir.checkpoint_written()  # a run that --overwrite moved aside is deleted now
        return final

    def _load_checkpoint(self, ckpt: Path, state: dict) -> None:
        """The position ``resume_point`` checked (a training position of this format) into this trainer."""
        self.model.load_state_dict(load_tensors(ckpt / "model.safetensors", self.device))
        load_objectives_state(self.objectives, self.model, ckpt, self.device, self.rank)
        load_optimizer_state(self.optimizer, load_tensors(ckpt / "optimizer.safetensors", self.device),
                             read_json(ckpt / "optimizer.json"), self.param_names)
        self.epoch, self.step, self.global_step = state["epoch"], state["step"], state["global_step"]
        self.best, self.history, self.elapsed = state["best"], state["history"], state["elapsed_s"]
        # The saved sums are over all ranks: rank 0 carries them on, the others start from zero.
        saved_sums = state["epoch_sums"] if self.rank == 0 else {}
        self.epoch_sums = RunningSums({k: torch.tensor(v, dtype=torch.float32, device=self.device)
                                       for k, (v, _) in saved_sums.items()},
                                      {k: c for k, (_, c) in saved_sums.items()})
        self._rng_to_restore = self._rank_rng(state)
        self.evaluator.priors.checkpoint = ckpt  # its SST probe, not a new fit
        if self.run_dir is not None:
            self.run_dir.rewrite(self.history, self.global_step)  # metrics.jsonl continues from the checkpoint
        if self.epoch >= self.total_epochs:
            logger.info("resumed from %s: the run is finished (%d of %d epochs trained, global step %d)", ckpt,
                        self.epoch, self.total_epochs, self.global_step)
        else:
            logger.info("resumed from %s at epoch %d step %d (global step %d)", ckpt, self.epoch + 1, self.step,
                        self.global_step)

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
        seed_everything(distributed.rank_seed(self.cfg.seed, self.rank, state["global_step"]))
        return rng_state(self.device)

    # -- after training --
    def load_best(self) -> Path:
        """Load the best checkpoint's model and objectives weights into the live model."""
        distributed.barrier()  # under torchrun: rank 0 has finished writing it
        best = resolve_checkpoint(self.run_dir.checkpoints / "best")
        self.model.load_state_dict(load_tensors(best / "model.safetensors", self.device))
        load_objectives_state(self.objectives, self.model, best, self.device, self.rank)
        return best


# ---- what a Trainer trains ----


@dataclass
class Parts:
    """What a Trainer trains: built from a TrainConfig by ``build_parts``, or by hand in tests."""

    model: MultitaskBert
    objectives: list[Objective]
    train_sets: dict[str, Any]
    dev_sets: dict[str, Any]
    tokenizer: Any = None
    amp_dtype: torch.dtype | None = None
    data: dict[str, dict] | None = None  # ReadReport.to_dict() of every file read, by "<task> <split>"
    final_examples: dict[str, dict[str, Any]] | None = None  # RunData.final_examples: the dev and test files
