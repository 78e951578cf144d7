"""A training run, from its checks to its final record: prepare_run -> build_trainer -> fit (SWA included) ->
predictions.

Usage:
    from tasks.train_config import TrainConfig
    from tasks.training.run import run
    summary = run(TrainConfig(out_dir="runs/try"))        # check, train, keep the best epoch, write predictions
    summary = run(cfg, resume_from="runs/try/checkpoints/last")
    plan = prepare_run(cfg); trainer = build_trainer(plan)   # the same steps one by one (a trainer to drive)
    summary = run(cfg, hooks=[MyHook()])                  # your own hooks see every step, record and evaluation

What a run does (``tasks.train_config.TrainConfig`` documents every setting):
1. ``prepare_run``: every check, before any data is read (the command line's,
   ``run`` and ``trainer_for`` alike): the config, the devices and processes,
   --out-dir, the encoder (--pretrained readable, --max-length within its
   positions), the priors' encoders and the phrase file, and for a resume the
   checkpoint (read once) and what may differ from it; then, still before the
   run directory is made, what the run reads (``read_inputs``): the encoder,
   seeded, and each task's train, dev and test files, its phrases and NLI
   (tasks/selection.py), a resume's checked against its checkpoint's.
2. ``build_trainer``: lock the run directory, tokenize the data, build
   the ``MultitaskBert`` heads (tasks/model.py), the objectives
   (tasks/objectives/) and our AdamW (``build_parts``), and the run's hooks
   (``run_hooks``: log lines, progress bar, checkpoints every N steps,
   metrics.jsonl, training.png, TensorBoard), the caller's after them.
3. ``Trainer.fit``: every epoch of the schedule, dev metrics after each, a
   JSONL record, the plot, checkpoint ``last``, and ``best`` when the overall
   dev score improved; the stages in order (tasks/training/stages.py: LP-FT's,
   fine-tuning, with ``swa.epochs`` SWA's from the best checkpoint, paper §4.6,
   whose averaged model replaces the best
   one when it scores higher on dev.
4. Without SWA, the best checkpoint is loaded.
5. Dev and test predictions and logits for every task (``Evaluator.write_all``),
   training-set logits too with ``predict_train``, and the final record in
   metrics.jsonl.

What a run directory holds after it: README "Training".

Under torchrun every rank trains (and runs SWA); the ranks other than 0 then
return a short summary and rank 0 writes the predictions.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from minbert.pretrained import load_pretrained, resolve_model_dir
from tasks.checkpoint import ResumePoint, check_encoder, check_same_data, resume_point
from tasks.train_config import TrainConfig, check_resume_config
from tasks.data.datasets import move_batch
from tasks.evaluation.priors import check_prior_models
from tasks.logs import held_records, score_text, size_text
from tasks.model import MultitaskBert
from tasks.objectives import build_objectives
from tasks.runtime import (autocast_dtype, configure_device, resolve_device, rng_state, seed_everything, set_rng_state,
                           set_threads, torchrun_env)
from tasks.run_tasks import RunTasks
from tasks.selection import RunFiles, read_run_files, stream_file, tokenize_run_data, triplets_file
from tasks.training import distributed
from tasks.training.progress import duration
from tasks.training.rundir import RunDir, check_out_dir
from tasks.training.hooks import CheckpointEvery, EarlyStopping, LogLines, MetricsFile, Plot, ProgressBar
from tasks.training.loop import Evaluation, Hook
from tasks.training.tensorboard import ReportToTensorBoard, check_available
from tasks.task import MULTITASK
from tasks.training.stages import Stage
from tasks.training.trainer import Parts, Trainer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunInputs:
    """What a run reads, read once before its run directory is made (``read_inputs``): its tasks resolved
    (``TrainConfig.resolve``: what it reads, trains and blends), the pretrained encoder and its tokenizer, the global
    RNG states right after the encoder was built on the run's seed (where ``build_parts`` goes on from, so the heads
    start as they would have), and every data file (tasks/selection.py)."""

    run: RunTasks
    encoder: torch.nn.Module
    tokenizer: Any
    rng: dict[str, Any]
    files: RunFiles
    log: list[logging.LogRecord]  # what the reading logged, for a run from Python's train.log (tasks.logs)


@dataclass(frozen=True)
class RunPlan:
    """A training run checked and its inputs read before any work (``prepare_run``): the config, validated once,
    what it reads, for a resume the checkpoint it continues, and whether it may replace what its --out-dir holds
    (``overwrite``). A plan builds one trainer: its encoder is the one that trains."""

    cfg: TrainConfig
    inputs: RunInputs
    resume: ResumePoint | None = None
    overwrite: bool = False

    @property
    def checkpoint(self) -> Path | None:
        return self.resume.checkpoint if self.resume is not None else None

    @property
    def run(self) -> RunTasks:
        """The run's tasks resolved (``RunInputs.run``), as an evaluation's plan holds its own."""
        return self.inputs.run


def prepare_run(cfg: TrainConfig, resume: ResumePoint | None = None, overwrite: bool = False) -> RunPlan:
    """Every check of a training run, once, and every read, before its run directory is made, whoever starts it
    (the command line, ``run``, ``trainer_for``): ``check_run``; its --out-dir (``check_out_dir``: writable, not
    another live process's, another command's output or an earlier run only with ``overwrite``); for a ``resume``
    (``resume_point``: its checkpoint, read once) the one resume rule (``check_resume_config``: only
    RESUME_MUTABLE fields may differ from the checkpoint's); then what the run reads (``read_inputs``), so that a
    data file or encoder it cannot use is refused with nothing written (the command: exit status 2)."""
    if overwrite and resume is not None:
        raise ValueError("--overwrite is for a fresh training run; --resume never replaces checkpoints")
    resolved = check_run(cfg, resume.checkpoint if resume is not None else None)
    if torchrun_env()[0] == 0:  # rank 0 alone owns the directory (RunDir)
        check_out_dir(Path(cfg.out_dir), resume=resume is not None, overwrite=overwrite)
    if resume is not None:
        check_resume_config(resume.config, cfg)
    with held_records() as log:  # a run from Python: for its train.log, which does not exist yet
        inputs = read_inputs(cfg, resolved, resume)
    return RunPlan(cfg, dataclasses.replace(inputs, log=log), resume, overwrite)


def read_inputs(cfg: TrainConfig, resolved: RunTasks, resume: ResumePoint | None = None) -> RunInputs:
    """The encoder of --pretrained, built on the run's seed (its random parts, a pooler it lacks, are a function of
    the seed), and every data file the run reads (tasks.selection.read_run_files, as ``resolved``, its tasks
    resolved, says); a resume's files checked to be those its run started with (``check_same_data``). Weights that
    do not fit the encoder (or hold code) are a ValueError naming --pretrained."""
    set_threads(cfg.threads)
    seed_everything(cfg.seed)
    overrides: dict[str, Any] = {"gradient_checkpointing": cfg.gradient_checkpointing,
                                 "dropout_masks": cfg.dropout_masks}
    if cfg.encoder_dropout is not None:
        overrides |= {"hidden_dropout_prob": cfg.encoder_dropout, "attention_probs_dropout_prob": cfg.encoder_dropout}
    try:
        encoder, tokenizer = load_pretrained(cfg.pretrained, config_overrides=overrides)
    except ValueError as e:
        if cfg.pretrained is None:  # the embedded encoder: not the user's file
            raise
        text = str(e).removeprefix(f"{resolve_model_dir(cfg.pretrained)}: ")  # its directory, named once
        raise ValueError(f"--pretrained {cfg.pretrained}: {text}") from None
    rng = rng_state()
    files = read_run_files(cfg, resolved)
    if resume is not None:
        check_same_data(resume, files.reports)
    return RunInputs(resolved, encoder, tokenizer, rng, files, [])


def check_run(cfg: TrainConfig, checkpoint: Path | None = None) -> RunTasks:
    """What a training config needs besides its directory, checked without reading data: the config itself
    (``TrainConfig.validate``), its per-process batches under torchrun, its device, its extra streams' files, a
    task file's NLI triplets and reporters, its encoder (``check_encoder``: ``checkpoint``'s when it resumes one)
    and the priors' (``check_prior_models``). Returns the run's tasks resolved (``TrainConfig.resolve``), what the
    run hands down. tasks.arguments.config_for checks an experiment's flags with it."""
    resolved = cfg.validate()
    distributed.check_config(resolved.batch_sizes, cfg.device)
    resolve_device(cfg.device)
    for spec in resolved.extra.values():
        stream_file(cfg, spec, resuming=checkpoint is not None)
    triplets_file(resolved, resuming=checkpoint is not None)
    check_available(cfg.report_to)
    check_encoder(cfg, checkpoint)
    check_prior_models(cfg, resolved)
    return resolved


def trainer_for(cfg: TrainConfig, *, hooks: Sequence[Hook] = (), resume_from: str | os.PathLike | None = None,
                overwrite: bool = False, stages: Sequence[Stage] | None = None) -> Trainer:
    """``build_trainer`` of ``cfg`` checked by ``prepare_run`` (with ``resume_from``: the checkpoint found there). The
    trainer holds its run directory's lock and log until closed: ``with trainer_for(cfg) as trainer: ...``.
    ``stages``: the stages it runs instead of the config's (tasks/training/stages.py)."""
    resume = resume_point(resume_from) if resume_from is not None else None
    return build_trainer(prepare_run(cfg, resume, overwrite), hooks=hooks, stages=stages)


def build_trainer(plan: RunPlan, *, hooks: Sequence[Hook] = (), stages: Sequence[Stage] | None = None) -> Trainer:
    """Prepare and lock the run directory (RunDir.start), build the parts from what the plan read, record the run
    (RunDir.record) and, for a resume, restore the plan's checkpoint. The plan is trusted: nothing is checked or
    read again. ``stages``: the Trainer's (default: the config's, ``stages_of``)."""
    cfg = plan.cfg
    # Under torchrun: join the process group (cuda -> cuda:LOCAL_RANK); only rank 0 touches out_dir.
    device = distributed.setup(resolve_device(cfg.device))
    run_dir = RunDir(cfg.out_dir, writer=distributed.rank() == 0)
    run_dir.start(cfg, resume=plan.resume, overwrite=plan.overwrite)  # locks it; a resume repairs a stale best
    run_dir.log.replay(plan.inputs.log)
    try:
        parts = build_parts(cfg, device, plan.inputs)
        run_dir.record(cfg, parts.data)
        return Trainer(cfg, parts, device=device, hooks=[*run_hooks(cfg, run_dir), *hooks], run_dir=run_dir,
                       resume=plan.resume, stages=stages)
    except BaseException as e:
        run_dir.close(e)  # bad data: the lock is freed and a run moved aside by overwrite comes back
        raise


def run_hooks(cfg: TrainConfig, run_dir: RunDir) -> list[Hook]:
    """The hooks of a run with a run directory, in their order: the log and the progress bar, checkpoints every N
    steps, early stopping with --early-stopping-patience, metrics.jsonl, training.png, and TensorBoard with
    --report-to tensorboard (rank 0)."""
    hooks: list[Hook] = [LogLines(), ProgressBar(), CheckpointEvery(cfg.checkpoint_every),
                         *([EarlyStopping(cfg.early_stopping_patience)] if cfg.early_stopping_patience else []),
                         MetricsFile(run_dir), Plot(run_dir)]
    if "tensorboard" in cfg.report_to and run_dir.writer:
        hooks.append(ReportToTensorBoard(run_dir.path / "tensorboard"))
    return hooks


OFFSET_INIT_PAIRS = 256  # training pairs (in file order) that start the baseline's paraphrase offset


def build_parts(cfg: TrainConfig, device: torch.device, inputs: RunInputs | None = None) -> Parts:
    """The encoder and data the run read (``inputs``, else ``read_inputs`` now), the data tokenized, the model and
    objectives built on ``device``.

    The global RNGs go on from where building the encoder on ``cfg.seed`` left them (``RunInputs.rng``): the heads'
    initial weights are a function of the seed alone (the same on every rank).
    """
    inputs = inputs if inputs is not None else read_inputs(cfg, cfg.resolve())
    set_threads(cfg.threads)
    set_rng_state(inputs.rng)
    amp_dtype = autocast_dtype(cfg.bf16, device, fp16=cfg.fp16)
    configure_device(device, cfg.deterministic)
    tokenizer = inputs.tokenizer
    data = tokenize_run_data(inputs.files, cfg, inputs.run, tokenizer)
    model = MultitaskBert(inputs.encoder, cfg.model, inputs.run.tasks, inputs.run.entries)
    if cfg.reinit_layers:  # on the CPU's generator, so the weights are the same on every device
        model.encoder.reinit_top_layers(cfg.reinit_layers, pooler=cfg.model.pooling == "pooler")
    model = model.to(device)
    for task in model.offsets():  # the baseline's Siamese paraphrase offset (tasks.model.MultitaskBert.init_offset)
        if task in data.train_sets:
            pairs = data.train_sets[task]
            model.init_offset(task, move_batch(pairs.collate(range(min(OFFSET_INIT_PAIRS, len(pairs)))), device))
    objectives = build_objectives(cfg.objectives, model)
    return Parts(model, objectives, data.train_sets, data.dev_sets, inputs.run, tokenizer, amp_dtype, data.reports,
                 data.final_examples)


def run(cfg: TrainConfig, *, resume_from: str | os.PathLike | None = None, overwrite: bool = False,
        hooks: Sequence[Hook] = (), stages: Sequence[Stage] | None = None) -> dict:
    """Check ``cfg`` (``prepare_run``; with ``resume_from``, against the checkpoint found there), then ``run_plan``.

    Returns the final summary, also appended to metrics.jsonl.
    """
    resume = resume_point(resume_from) if resume_from is not None else None
    return run_plan(prepare_run(cfg, resume, overwrite), hooks=hooks, stages=stages)


def run_plan(plan: RunPlan, *, hooks: Sequence[Hook] = (), stages: Sequence[Stage] | None = None) -> dict:
    """Train a checked run, load the model its last stage chooses to predict (the best epoch's, or SWA's average
    when it scores higher: ``Stage.final_model``), write predictions.

    Returns the final summary, also appended to metrics.jsonl.
    """
    t0 = time.perf_counter()
    with build_trainer(plan, hooks=hooks, stages=stages) as trainer:  # closed with the error that ended it, if any:
        return _train_and_predict(trainer, t0)  # a run that --overwrite moved aside comes back before a first checkpoint


def _train_and_predict(trainer: Trainer, t0: float) -> dict:
    cfg = trainer.cfg
    summary = trainer.fit()
    swa = summary.get("swa")
    source = trainer.current.final_model(trainer)  # the stage training ended in loads what predicts
    logger.info("best epoch %s (dev overall %s)", summary["best"]["epoch"], score_text(summary["best"]["score"]))
    if trainer.rank > 0:  # under torchrun rank 0 alone writes the predictions
        return {"final": True, "rank": trainer.rank, "best_epoch": summary["best"]["epoch"],
                "predictions_from": str(source)}
    logger.info("writing predictions from %s", source)
    t_final = time.perf_counter()
    final = trainer.evaluator.write_all(trainer.model, trainer.tokenizer, trainer.run_dir.path / "predictions",
                                        train_sets=trainer.train_sets, examples=trainer.final_examples,
                                        reports=trainer.data)
    trainer.emit("on_evaluate", Evaluation("final", final["dev"], time.perf_counter() - t_final))
    own = ("dev", "dev_rows", "files", "skipped", "rows_skipped", "incomplete")
    extra = sorted((k for k in final if k not in own), key=lambda k: k != "train")
    record = {"final": True, "best_epoch": summary["best"]["epoch"], "predictions_from": str(source),
              "dev": final["dev"], **{k: final[k] for k in extra},  # training-set metrics, objectives' inference
              **({"swa": swa} if swa else {}),
              **({"stopped_early": summary["epochs"]} if summary["epochs"] < trainer.training_epochs else {}),
              "process_time_s": round(time.perf_counter() - t0, 1), "predictions": final["files"],
              "skipped": final["skipped"], "rows_skipped": final["rows_skipped"],
              **({"incomplete": final["incomplete"]} if final["incomplete"] else {})}
    trainer.record(record)
    logger.info("final dev (%s): %s", final_dev_scope(cfg, final["dev_rows"]),
                " ".join(f"{k} {v:.4f}" for k, v in final["dev"].items() if v is not None))
    if cfg.save_only_model:
        freed = trainer.run_dir.keep_model_only()
        logger.info("--save-only-model: checkpoints/last and the optimizer state deleted (%s freed); the run can be "
                    "evaluated (--eval-only), no longer resumed", size_text(freed))
    logger.info("disk: %s%s", trainer.run_dir.disk_line(), "" if cfg.save_only_model else
                "; --save-only-model keeps the model alone")
    measured = set(cfg.tasks) <= set(MULTITASK)  # RESULTS.md holds the recipe's scores of the CS224N tasks
    logger.info("predictions: %s (leaderboard files and logits%s)", trainer.run_dir.path / "predictions",
                "; the recipe's measured scores over seeds, to compare with: experiments/RESULTS.md" if measured
                else "")
    logger.info("done: wall time %s (this process: %.0f s)", duration(record["process_time_s"]),
                record["process_time_s"])
    return record


def dev_scores(record: dict) -> dict[str, float]:
    """A run's final dev metrics, from its final record (metrics.jsonl); a knn_bert run adds eq. 1 at its φ (``knn_phi<φ>.``) and the vote alone (``knn_phi1.``)."""
    dev = {k: v for k, v in record["dev"].items() if v is not None}
    knn = record.get("knn", {})
    for prefix, key in ((f"knn_phi{knn.get('phi', 0):g}", "dev"), ("knn_phi1", "dev_knn_only")):
        dev.update({f"{prefix}.{k}": v for k, v in knn.get(key, {}).items() if v is not None})
    return dev


def final_dev_scope(cfg: TrainConfig, rows: dict[str, int]) -> str:
    """What the final dev metrics were computed on, for the log: whole sets, or the rows of each task scored (the
    capped subsets, or what --limit read: a file shorter than the limit is read whole)."""
    counts = ", ".join(f"{task} {n}" for task, n in rows.items())
    if cfg.limit is not None:
        return f"--limit {cfg.limit}: {counts} rows"
    return "full sets" if cfg.final_dev == "full" else f"capped subsets: {counts} rows"

