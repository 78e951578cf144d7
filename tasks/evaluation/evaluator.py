"""The one path from a model to predictions: the trainer's dev scores, a run's files, --eval-only, the Predictor.

Usage:
    evaluator = Evaluator(cfg, cfg.resolve(), objectives, device, amp_dtype)   # a run's: its RunTasks
    metrics, preds = evaluator.evaluate(model, {"sst": sst_dev, "sts": sts_dev})   # dev scores between epochs
    result = evaluator.write_all(model, tokenizer, Path("runs/try/predictions"))    # a run's prediction files

    result = evaluate_checkpoint("runs/try/checkpoints/best")      # dev metrics + predictions/ of a saved model
    model, objectives, tokenizer, cfg = load_model(resolve_checkpoint(path))   # tasks.checkpoint: the saved model

    p = Predictor.from_checkpoint("runs/try/checkpoints/best")           # device="auto": CUDA when present
    labels, probs = p.predict("nli", [("A dog runs.", "An animal moves.")])  # ["entailment"], (N, 3): its own labels
    labels, probs = p.sentiment(["a gripping film", "dull"])             # (N,) classes 0-4, (N, 5) probabilities
    labels, probs = p.paraphrase([("how do i cook rice", "how to cook rice")])   # (N,) 0/1, (N,) P(paraphrase)
    scores = p.similarity([("a cat sits", "a cat is sitting")])          # (N,) 0-5
    vectors = p.embed(["a gripping film"])                               # (N, H) what the heads read

What is written, for every task of the config: ``{task}-{split}-output.csv``
(the leaderboard files) and ``{task}-{split}-logits.csv`` (raw outputs, for
ensembles and distillation) for dev and test (a missing test file is skipped
with a message); on a run with a task of the minBERT starter's part 1 alone (cfimdb), also that part's
``{finetune|pretrain}-{task}-{split}-out.csv`` for each of its part-1 tasks (sst, cfimdb); and with ``predict_train`` the training sets' logits
(distillation teachers). An objective may change the final evaluation through
its ``inference`` hook (KNN-BERT's vote: its metrics go to the record under
the inference's ``key``, and its predictions to the leaderboard files).
Match-Tuning's matching is part of the model (``MultitaskBert.set_pooled_transform``),
so every path here applies it alike.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from minbert.tokenizer import BertTokenizer
from tasks.train_config import TrainConfig, eval_config
from tasks.data.datasets import SentenceDataset, length_bucketed_batches, move_batch
from tasks.data.readers import Example
from tasks.selection import capped_dev, load_examples, load_final_examples, make_dataset
from tasks.predictions import Predictions, write_logits, write_part1, write_predictions
from tasks.evaluation.metrics import jsonable, overall_score, scores, selected_metrics
from tasks.evaluation.priors import RunPriors, check_prior_models
from tasks.run_tasks import RunTasks
from tasks.model import MultitaskBert, TaskOutput
from tasks.task import PACKAGE, Task, Tasks, get_task
from tasks.objectives import Inference, Objective
from tasks.outdir import PREDICTIONS, RUN, check_kind, check_writable_dir, locked, mark
from tasks.checkpoint import best_of, check_encoder, load_model, verify_checkpoint
from tasks.logs import count, open_log
from tasks.runtime import autocast, autocast_dtype, busy_cpu_note, precision_note, resolve_device, set_threads

logger = logging.getLogger(__name__)


# ---- a model's predictions and metrics over datasets ----
PROGRESS_EVERY_S = 60.0  # a prediction longer than this logs how far it got, once a period


@torch.no_grad()
def predict_dataset(
    model: nn.Module,
    task: str,
    dataset: Dataset,
    batch_size: int = 128,
    device: str | torch.device = "cpu",
    autocast_dtype: torch.dtype | None = None,
    both_orders: bool = False,
    prior: Callable[[Dataset, torch.Tensor], torch.Tensor] | None = None,
) -> Predictions:
    """Run ``model`` over ``dataset`` and return its outputs in dataset order.

    ``dataset`` is a tasks.data.datasets SentenceDataset / PairDataset (``ids``,
    ``lengths``, ``collate(indices)``); its pair mode must match the model's
    ``pair_encoding``. The model must already be on ``device``. It runs in
    eval mode and every submodule gets back its previous train/eval mode
    afterwards (LP-FT keeps a frozen encoder in eval while heads train).
    Batches are length-sorted and unshuffled
    (``length_bucketed_batches(shuffle=False)``); results are scattered back to
    dataset order. ``autocast_dtype`` (e.g. torch.bfloat16) turns on autocast
    for the device's type; logits come back as float32. ``both_orders`` scores
    a pair of a task without order (``Task.symmetric``: Quora's, STS's) as the mean
    of its logits for (a, b) and (b, a) (the dataset's index ``i + N``,
    tasks.data.datasets.PairDataset), predictions from that mean.
    ``prior(dataset, logits)`` (the task's prior: tasks.evaluation.priors, STS's cosine, SST's probe) replaces
    the logits, in dataset order, with its blend of them, the predictions then its kind's rule on the blend.
    """
    kind = (entry := model.entry(task)).kind  # the entry of the task whose head it goes through
    device = torch.device(device)
    n = len(dataset)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    amp = autocast(device, autocast_dtype)
    order: list[int] = []
    logit_parts: list[torch.Tensor] = []
    pred_parts: list[torch.Tensor] = []
    try:
        t0 = said = time.monotonic()
        for indices in length_bucketed_batches(dataset.lengths, batch_size, shuffle=False):
            now = time.monotonic()
            if now - said >= PROGRESS_EVERY_S:  # long work says how far it got (no device sync)
                said = now
                logger.info("%s: %d of %d examples predicted in %.0f s", task, len(order), n, now - t0)
            batch = move_batch(dataset.collate(indices), device)
            with amp:
                out = model(task, batch)
            if both_orders and entry.symmetric:
                swapped = move_batch(dataset.collate([i + n for i in indices]), device)
                with amp:
                    reverse = model(task, swapped)
                out = TaskOutput(kind.both_orders(out.logits, reverse.logits))
            # Kept on the device until the end: one transfer instead of a sync per batch.
            logit_parts.append(out.logits.float())
            pred_parts.append(model.predict(task, out))
            order.extend(indices)
    finally:
        for m, was_training in modes:
            m.train(was_training)
    if n == 0:
        return Predictions([], torch.empty(kind.logits_shape(entry, 0)), torch.empty(0, dtype=kind.pred_dtype()))
    if sorted(order) != list(range(n)):
        raise RuntimeError(f"{task}: the evaluation batches did not cover each of the {n} examples exactly once")
    where = torch.tensor(order, dtype=torch.long)  # (N,) dataset index of each computed row
    logits_sorted = torch.cat(logit_parts).cpu()
    preds_sorted = torch.cat(pred_parts).cpu()
    logits = torch.empty_like(logits_sorted)
    preds = torch.empty_like(preds_sorted)
    logits[where] = logits_sorted
    preds[where] = preds_sorted
    if prior is not None:
        logits = prior(dataset, logits)
        preds = kind.predict(logits)
    return Predictions(list(dataset.ids), logits, preds.to(kind.pred_dtype()))


def evaluate(model: nn.Module, datasets: dict[str, Dataset], select: Sequence[str] = (),
             priors: Callable[[str], Callable | None] = lambda task: None, tasks: Tasks | None = None,
             **options: Any) -> tuple[dict[str, float], dict[str, Predictions]]:
    """Predict every dataset (keyed by task) and score the labeled ones; ``options`` are ``predict_dataset``'s,
    ``priors(task)`` each task's prior (its ``prior``), ``tasks`` the run's (TrainConfig.entries; default: the
    package's and the model's own), whose records the overall reads.

    Returns (metrics, predictions). metrics has every metric of each task (``scores``: its main one,
    task_metric(task), first) with labels (``dataset.labels is not None``) and "overall" (``overall_score``, of
    ``select``: what selects the best epoch) when at least one was scored; unlabeled datasets (test splits) only
    get predictions.
    """
    metrics: dict[str, float] = {}
    predictions: dict[str, Predictions] = {}
    tasks = tasks if tasks is not None else Tasks(getattr(model, "entries", {}).values())
    for task, dataset in datasets.items():
        p = predict_dataset(model, task, dataset, prior=priors(task), **options)
        predictions[task] = p
        if getattr(dataset, "labels", None) is not None:
            metrics.update(scores(model.entry(task), p.preds, dataset.labels))
    if metrics:
        metrics["overall"] = overall_score(metrics, select, tasks)
    return metrics, predictions


# ---- the evaluator: a model's predictions as training, --eval-only and the Predictor make them ----


class Evaluator:
    """How a model becomes predictions, one object for the trainer's dev scores, the final files, ``--eval-only``
    and the Predictor: both-order scoring of pairs (``symmetric_eval``), the
    tasks' priors (each built once, at its first use; a probe from ``checkpoint`` when it holds one) and
    an objective's inference-time vote (KNN-BERT) for the files (usage: the module's docstring).
    """

    def __init__(self, cfg: TrainConfig, run: RunTasks, objectives: Sequence[Objective], device: torch.device,
                 amp_dtype: torch.dtype | None, checkpoint: Path | None = None,
                 probe_train: dict[str, tuple[list[str], list[int]]] | None = None) -> None:
        self.cfg, self.objectives, self.device, self.amp_dtype = cfg, list(objectives), device, amp_dtype
        self.priors = RunPriors(cfg, run, device, amp_dtype, probe_train)
        self.priors.checkpoint = checkpoint

    def options(self, batch_size: int | None = None) -> dict[str, Any]:
        """``predict_dataset``'s keyword arguments for this run but the prior: its batch size, device, precision
        and pair orders."""
        return dict(batch_size=batch_size or self.cfg.eval_batch_size, device=self.device,
                    autocast_dtype=self.amp_dtype, both_orders=self.cfg.symmetric_eval)

    def predict(self, model: MultitaskBert, task: str, dataset: Dataset, batch_size: int | None = None
                ) -> Predictions:
        """One dataset's predictions in dataset order."""
        return predict_dataset(model, task, dataset, prior=self.priors.get(task), **self.options(batch_size))

    def evaluate(self, model: MultitaskBert, datasets: dict[str, Dataset]
                 ) -> tuple[dict[str, float], dict[str, Predictions]]:
        """Metrics and predictions of every dataset; "overall" is what selects the run's best epoch."""
        return evaluate(model, datasets, self.select(datasets), self.priors.get, self.cfg.entries, **self.options())

    def select(self, datasets: dict[str, Any]) -> tuple[str, ...]:
        """What the overall score of ``datasets`` averages: the run's ``best_metric`` where it scores them all
        (an evaluation of some tasks only, as ``--eval-only --tasks`` makes: the default rule)."""
        chosen = self.cfg.best_metric
        tasks = {t: self.cfg.entries[t] for t in datasets}
        held = set(tasks) | {k for t in tasks.values() for k in t.metric_keys}
        return chosen if set(chosen) <= held else ()

    def drop_partial_overall(self, split: str, metrics: dict[str, float]) -> str | None:
        """Removes "overall" from ``metrics`` where it lacks a metric the overall of the whole evaluation averages
        (a user's task whose dev file has gone): the mean of the rest is another score, not the run's. Returns
        what to warn of then, else None."""
        if "overall" not in metrics:
            return None
        entries = self.cfg.entries
        held = dict.fromkeys(k for t in self.cfg.tasks for k in entries[t].metric_keys)
        wanted = selected_metrics(held, self.select(dict.fromkeys(self.cfg.tasks)), entries)
        lacking = [k for k in wanted if k not in metrics]
        if not lacking:
            return None
        del metrics["overall"]
        tasks = [t for t in self.cfg.tasks if any(k in lacking for k in entries[t].metric_keys)]
        return (f"no {split} overall: it averages {' and '.join(wanted) if len(wanted) < 3 else ', '.join(wanted)}, "
                f"and {' and '.join(tasks)} {'has' if len(tasks) == 1 else 'have'} no {split} predictions")

    def write_all(self, model: MultitaskBert, tokenizer: Any, pred_dir: Path,
                  train_sets: dict[str, Any] | None = None,
                  examples: dict[str, dict[str, Any]] | None = None, reports: dict[str, dict] | None = None) -> dict:
        """Full dev metrics, and dev + test prediction and logit files for every task of the config.

        ``examples`` (``RunData.final_examples``: read when the run started) and their ``reports`` save reading the
        dev and test files again. A missing test file is skipped with a message; a test file with skipped rows
        makes the submission incomplete (its leaderboard file lacks their ids): a warning, and the record's
        "incomplete" says which. With ``predict_train``
        the whole training file of each task (no per-epoch caps) is predicted
        too: its logits go to ``{task}-train-logits.csv`` (distillation teachers,
        tasks/objectives/distill.py; no leaderboard file) and its metrics to
        "train". An objective's ``inference`` (KNN-BERT) scores dev under its
        key and may replace the leaderboard predictions. ``train_sets`` (a
        trainer's tokenized training sets) saves reading them again. Returns
        {"dev": metrics, "dev_rows": {task: rows scored}, "files": [paths], "skipped": [...],
        "rows_skipped": {file: n}, "incomplete": [...]}
        plus "train" and each inference's key when computed. A task without a dev file (a user's whose file has
        gone: --eval-only) has no dev metrics, and the dev "overall" is absent when it would average them; with no
        dev file left "dev" and "dev_rows" are empty. Dev predictions all of one class get a warning (a collapsed
        classifier: ``one_class_note``).
        """
        cfg, device = self.cfg, self.device
        train_sets = dict(train_sets or {})
        reports = dict(reports or {})
        if examples is None:
            examples = load_final_examples(cfg, reports)

        def train_set(task: str) -> Any:
            if task not in train_sets:
                rows = load_examples(task, "train", cfg)
                if rows is None:
                    raise FileNotFoundError(f"{task} train: no input file in {cfg.data_dir}; --predict-train and "
                                            "KNN-BERT inference need the training data")
                train_sets[task] = make_dataset(task, rows, tokenizer, cfg)
            return train_sets[task]

        # a run with a task of the starter's part 1 alone (cfimdb) also writes that part's files for each such task
        part1 = any(cfg.entries[t].output.part1 == "run" for t in cfg.tasks)
        inferences = [inf for o in self.objectives
                      if (inf := o.inference(model, cfg.tasks, train_set, cfg.eval_batch_size, device)) is not None]
        files: list[str] = []
        skipped: list[str] = []
        result: dict[str, Any] = {}
        for split in ("dev", "test") + (("train",) if cfg.predict_train else ()):
            datasets = {}
            for task in cfg.tasks:
                if split == "train":
                    datasets[task] = train_set(task)
                    continue
                rows = examples[split][task]
                if rows is not None and split == "dev" and cfg.final_dev == "capped":
                    rows = capped_dev(task, rows, cfg)
                if rows is None:
                    path = cfg.entries[task].path(split, cfg.data_dir)
                    msg = (f"{task} {split}: " + (f"no file at {path}" if path else "its task file names none")
                           + "; its predictions are skipped")
                    logger.debug(msg)  # the reader warned when the run read its data (tasks.data.readers)
                    skipped.append(msg)
                    continue
                datasets[task] = make_dataset(task, rows, tokenizer, cfg)
            if split == "dev":  # present, if empty, when no dev file is left (a user's moved: --eval-only)
                result["dev"], result["dev_rows"] = {}, {task: len(ds) for task, ds in datasets.items()}
            if not datasets:  # no task of the run has a file of this split (test files are optional)
                logger.info("no %s predictions: no task of the run has a %s file", split, split)
                continue
            t0 = time.perf_counter()
            metrics, preds = self.evaluate(model, datasets)
            partial = self.drop_partial_overall(split, metrics)
            logger.info("%s predictions for %s in %.0f s%s", split, ", ".join(preds), time.perf_counter() - t0,
                        (": " + " ".join(f"{k} {v:.4f}" for k, v in metrics.items())) if metrics else "")
            if partial:
                logger.warning(partial)
            leaderboard = preds
            if split != "train":  # a training example is its own nearest neighbour
                for inference in inferences:
                    leaderboard, scored = apply_inference(inference, split, datasets, leaderboard, metrics,
                                                          self.select(datasets), cfg.entries)
                    if scored:
                        result.setdefault(inference.key, dict(inference.info)).update(scored)
            for task, p in preds.items():
                if split != "train":
                    files.append(str(write_predictions(pred_dir, cfg.entries[task], split, leaderboard[task])))
                    if part1 and cfg.entries[task].output.part1:  # and in the starter part 1's names
                        files.append(str(write_part1(pred_dir, cfg.entries[task], split, leaderboard[task],
                                                     cfg.freeze_encoder)))
                files.append(str(write_logits(pred_dir, cfg.entries[task], split, p)))
            if split in ("dev", "train"):
                result[split] = jsonable(metrics)
            if split == "dev":
                for task, p in preds.items():
                    if note := one_class_note(cfg.entries[task], p.preds, getattr(datasets[task], "labels", None)):
                        logger.warning(note)
        result["files"] = files
        result["skipped"] = skipped
        result["rows_skipped"] = {r["file"]: r["skipped"] for r in reports.values() if r["skipped"]}
        result["incomplete"] = incomplete_submission(reports)
        for line in result["incomplete"]:
            logger.warning("SUBMISSION INCOMPLETE: %s", line)
        return result


def apply_inference(inference: Inference, split: str, datasets: dict[str, Dataset], preds: dict[str, Predictions],
                    metrics: dict[str, float], select: Sequence[str] = (), tasks: Tasks | None = None
                    ) -> tuple[dict[str, Predictions], dict[str, Any]]:
    """(the leaderboard's predictions, {record name: metrics}) of one split under an objective's ``inference``:
    its "" classes replace the model's where it ``replaces``; on a labelled split every variant is scored (the
    plain ``metrics`` with its tasks' scores replaced, overall recomputed) and logged. ``tasks``: the run's
    (TrainConfig.entries; default: the package's)."""
    tasks = tasks if tasks is not None else PACKAGE
    variants = inference.classes(split, datasets)
    leaderboard = dict(preds)
    if inference.replaces:
        for task, classes in variants.get("", {}).items():
            p = preds[task]
            leaderboard[task] = Predictions(p.ids, p.logits, classes)
    if not metrics:
        return leaderboard, {}
    scored = {}
    for variant, by_task in variants.items():
        m = dict(metrics)
        for task, classes in by_task.items():
            labels = getattr(datasets[task], "labels", None)
            if labels is not None:
                m.update(scores(tasks[task], classes, labels))
        if "overall" in metrics:  # absent where it cannot be computed (Evaluator.drop_partial_overall)
            m["overall"] = overall_score(m, select, tasks)
        scored[f"{split}_{variant}" if variant else split] = jsonable(m)
    logger.info("%s %s: %s", split, inference.name, " | ".join(
        f"{variant or 'its prediction'}: " + " ".join(f"{k} {v:.4f}" for k, v in m.items() if v is not None)
        for variant, m in zip(variants, scored.values())))
    return leaderboard, scored


def one_class_note(task: str | Task, preds: torch.Tensor, labels: torch.Tensor | None) -> str | None:
    """A warning when a classifier of ``task`` (an entry, or a package task's name) predicts one class for every
    labelled example while the labels hold several (a collapsed classifier: MCC 0, F1 0 or undefined); None
    otherwise, and for a regression."""
    entry = get_task(task)
    task = entry.name
    if labels is None or len(preds) < 2:
        return None
    k = entry.kind.one_class(preds, labels)
    if k is None:
        return None
    share = float((labels.long() == k).float().mean())
    return (f"{task}: all {len(preds)} dev predictions are one class, {entry.label_name(k)} ({share:.0%} of the dev "
            "labels): the classifier collapsed to a constant, as after too few steps (--epochs, --limit), at a "
            "learning rate too high or too low (--lr), or on a task one class dominates")


def incomplete_submission(reports: dict[str, dict]) -> list[str]:
    """For each test file with skipped rows, what its leaderboard file lacks and what to do."""
    lines = []
    for name, r in reports.items():
        task, split = name.split()
        if split == "test" and r["skipped"]:
            why = "; ".join(f"line {x['line']}: {x['reason']}" for x in r["first_skipped"][:3])
            lines.append(f"{task}-test-output.csv lacks the ids of {r['skipped']} of the {r['rows']} rows of "
                         f"{r['file']} ({why}); fix the file and predict again (--eval-only)")
    return lines


# ---- a saved checkpoint: the model, and its predictions (--eval-only) ----


@dataclass(frozen=True)
class EvalPlan:
    """An evaluation of a saved model checked before any data is read (``prepare_eval``): the checkpoint, the
    config it is evaluated with (its own with the evaluation's changes), its tasks resolved (``run``:
    ``TrainConfig.resolve``) and where its predictions go (None: it writes none, the Predictor)."""

    checkpoint: Path
    config: TrainConfig
    run: RunTasks
    out_dir: Path | None


def prepare_eval(path: str | os.PathLike, overrides: dict[str, Any] | None = None,
                 out_dir: str | os.PathLike | None = None, *, writes: bool = True,
                 saved: TrainConfig | None = None, trust_modules: bool = False) -> EvalPlan:
    """Every check of an evaluation of a saved model, once, before any data is read, whoever asks (--eval-only,
    ``evaluate_checkpoint``, ``Predictor.from_checkpoint``): the checkpoint resolved and verified with its config
    read once (``verify_checkpoint``; ``saved``: the caller has, and ``path`` is that checkpoint), the evaluation's
    changes (``overrides``, ``tasks.train_config.eval_config``), the device, the encoder's positions, the priors'
    encoders, and with ``writes`` the output directory (default: the checkpoint's own run): the checkpoint's own
    run or a directory of predictions, writable, not another live process's. ``trust_modules``: the objective
    files the run recorded may be imported (``verify_checkpoint``; otherwise only those registered already)."""
    ckpt, saved = (Path(path), saved) if saved is not None else verify_checkpoint(path, trust_modules)
    cfg = eval_config(saved, dict(overrides or {}))
    run = cfg.resolve()
    resolve_device(cfg.device)
    check_encoder(cfg, ckpt, eval_only=True)
    check_prior_models(cfg, run)
    if not writes:
        return EvalPlan(ckpt, cfg, run, None)
    out = Path(out_dir) if out_dir is not None else default_out_dir(ckpt, saved)
    check_writable_dir(out, "--out-dir")
    check_kind(out, _kind(ckpt, out), replaces=" (--eval-only never replaces another command's output)")
    return EvalPlan(ckpt, dataclasses.replace(cfg, out_dir=str(out)), run, out)


def _kind(ckpt: Path, out: Path) -> str:
    """What an evaluation's output directory is: the checkpoint's own run, or a directory of predictions."""
    return RUN if ckpt.resolve().is_relative_to(out.resolve()) else PREDICTIONS


def predict_checkpoint(plan: EvalPlan) -> dict:
    """Dev metrics and dev + test predictions of the model saved in the plan's checkpoint, evaluated with its
    config, into ``<out_dir>/predictions``, the directory locked while it is written."""
    out = plan.out_dir
    out.mkdir(parents=True, exist_ok=True)
    with locked(out), open_log(out):
        if _kind(plan.checkpoint, out) == PREDICTIONS:
            mark(out, PREDICTIONS)
        cfg = plan.config
        device = resolve_device(cfg.device)
        amp = autocast_dtype(cfg.bf16, device, fp16=cfg.fp16)
        threads = set_threads(cfg.threads)
        t0 = time.perf_counter()
        logger.info("evaluating %s on %s, %s, %s: dev and test predictions of %s", plan.checkpoint, device,
                    precision_note(cfg.bf16, device, amp, fp16=cfg.fp16), count(threads, "thread"),
                    ", ".join(cfg.tasks))
        if busy := busy_cpu_note(threads, device):
            logger.warning(busy)
        model, objectives, tokenizer, _ = load_model(plan.checkpoint, device, cfg)
        evaluator = Evaluator(cfg, plan.run, objectives, device, amp, checkpoint=plan.checkpoint)
        result = evaluator.write_all(model, tokenizer, out / "predictions")
        logger.info("wrote %d files to %s in %.0f s%s", len(result["files"]), out / "predictions",
                    time.perf_counter() - t0, f" (dev overall {result['dev']['overall']:.4f})"
                    if result["dev"].get("overall") is not None else "" if result["dev"] else " (no dev scores)")
    result["checkpoint"] = str(plan.checkpoint)
    return result


def default_out_dir(ckpt: Path, saved: TrainConfig) -> Path:
    """Where a checkpoint's predictions go: runs/<name>/checkpoints/best -> runs/<name>; a checkpoint copied
    elsewhere -> its saved out_dir."""
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else Path(saved.out_dir)


def evaluate_checkpoint(path: str | os.PathLike, *, out_dir: str | os.PathLike | None = None,
                        overrides: dict[str, Any] | None = None) -> dict:
    """Dev metrics and dev + test predictions of a saved model (the Python form of --eval-only).

    ``overrides`` may set the fields ``tasks.train_config.eval_mutable()`` lists
    (data_dir, device, bf16, eval_batch_size, limit, ... and the objectives'
    inference options, e.g. knn_bert's knn_k and knn_phi), checked by ``eval_config``.
    Files go to ``<out_dir>/predictions`` (default: the run directory holding the checkpoint).
    """
    return predict_checkpoint(prepare_eval(path, overrides, out_dir))


class Predictor:
    """A trained model's predictions on new sentences, batched, in eval mode, under torch.no_grad().

    The model's pooled transforms act as in the run's own dev predictions
    (Match-Tuning's matching); KNN-BERT's vote needs the training set and
    is not applied (``--eval-only`` applies it). Outputs are float32 CPU tensors (and ``predict``'s labels, strings).

    Precision is the run's rule (``TrainConfig.bf16``): bf16 autocast on a GPU or CPU that multiplies bf16
    natively, which moves an embedding by ~1e-2 of its scale; ``bf16=False`` computes in fp32, where the encoder
    equals ``transformers`` and sentence-transformers to 1e-5. The choice is logged when the model loads.
    """

    def __init__(self, model: MultitaskBert, objectives: Sequence[Objective], tokenizer: BertTokenizer,
                 cfg: TrainConfig, run: RunTasks, device: torch.device, batch_size: int | None = None,
                 checkpoint: str | os.PathLike | None = None) -> None:
        self.model, self.tokenizer, self.cfg, self.device = model.eval(), tokenizer, cfg, device
        self.amp = autocast_dtype(cfg.bf16, device, fp16=cfg.fp16)
        logger.info("predicting with %s on %s, %s, %s", checkpoint or "a model", device,
                    precision_note(cfg.bf16, device, self.amp, fp16=cfg.fp16), count(torch.get_num_threads(), "thread"))
        self.batch_size = batch_size or cfg.eval_batch_size
        # the checkpoint's probes: no data needed; every prior built now, so a missing encoder fails here
        self.evaluator = Evaluator(cfg, run, objectives, device, self.amp,
                                   checkpoint=Path(checkpoint) if checkpoint is not None else None)
        self.evaluator.priors.build()

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, device: str = "auto", batch_size: int | None = None,
                        bf16: bool | None = None, trust_modules: bool = False) -> Predictor:
        """A checkpoint directory (or a run directory: its checkpoints/best) on ``device`` (auto: CUDA if present);
        ``bf16`` True or False overrides the run's precision rule (False: fp32); ``trust_modules``: import the
        objective files the run recorded (``plan``)."""
        return cls.from_plan(cls.plan(path, device, bf16, trust_modules=trust_modules), batch_size)

    @staticmethod
    def plan(path: str | os.PathLike, device: str = "auto", bf16: bool | None = None,
             threads: int | None = None, trust_modules: bool = False) -> EvalPlan:
        """Every check of ``from_checkpoint`` (the checkpoint, its config, the device, the priors' encoders),
        before any weights are loaded: what the predict command checks as its arguments. ``threads`` replaces the
        run's CPU thread count in the plan's config (the caller sets it: ``tasks.runtime.set_threads``);
        ``trust_modules``: import the objective files the run recorded (else a run whose objectives come from a
        file of its own loads only once that file is loaded: ``tasks.objectives.load_plugin``)."""
        overrides = {"device": device, **({"bf16": bf16} if bf16 is not None else {}),
                     **({"threads": threads} if threads is not None else {})}
        return prepare_eval(best_of(path), overrides, writes=False, trust_modules=trust_modules)

    @classmethod
    def from_plan(cls, plan: EvalPlan, batch_size: int | None = None) -> Predictor:
        """The Predictor of a checked checkpoint (``plan``): its model loaded."""
        dev = resolve_device(plan.config.device)
        model, objectives, tokenizer, cfg = load_model(plan.checkpoint, dev, plan.config)
        return cls(model, objectives, tokenizer, cfg, plan.run, dev, batch_size, checkpoint=plan.checkpoint)

    def predictions(self, task: str, inputs: Sequence[str] | Sequence[tuple[str, str]]) -> Predictions:
        """The model's ``Predictions`` of ``inputs`` (sentences, or (a, b) pairs for a pair task) in input order:
        ids "0".."N-1", the logits as a run's logits files hold them, and class ids (N,) or scores (N,)."""
        entry = self.cfg.entries[task]
        return self.predict_examples(task, entry.kind.examples(entry, inputs))

    def predict_examples(self, task: str, examples: Sequence[Example]) -> Predictions:
        """The model's ``Predictions`` of ``examples`` of ``task`` (read from a file: tasks/predict.py), keyed by
        their ids, in their order."""
        if task not in self.cfg.tasks:
            raise ValueError(f"this checkpoint was trained on {', '.join(self.cfg.tasks)}, not {task}")
        return self.evaluator.predict(self.model, task, make_dataset(task, examples, self.tokenizer, self.cfg),
                                      batch_size=self.batch_size)

    def predict(self, task: str, inputs: Sequence[str] | Sequence[tuple[str, str]]
                ) -> tuple[list[str], torch.Tensor] | torch.Tensor:
        """Any task of the checkpoint (a user's too): ``inputs`` are sentences, or (a, b) pairs for a pair task.

        A classification gives (labels, probabilities): labels, a list of N strings, each prediction in the task's
        own labels as its files write them (a user's "entailment"; SST's "0".."4", para's "0"/"1"); probabilities,
        float32, (N, C) over its classes in their order (its entry's ``classes``), or for a pair task of two
        classes (one logit: para, MRPC, RTE) P(its second class) (N,). A regression gives its scores alone, float32
        (N,), on the task's scale (STS 0-5). ``sentiment``, ``paraphrase`` and ``similarity`` give the course's
        tasks as class numbers."""
        entry = self.cfg.entries[task]
        out = self.predictions(task, inputs)
        return entry.kind.answers(entry, out.preds, out.logits)

    def sentiment(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(labels (N,) in 0-4, probabilities (N, 5)) of SST-5 sentiment."""
        out = self.predictions("sst", texts)
        entry = self.cfg.entries["sst"]
        return out.preds, entry.kind.outputs(entry, out.logits)

    def paraphrase(self, pairs: Sequence[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(labels (N,) 1 = paraphrase, P(paraphrase) (N,)) of sentence pairs."""
        out = self.predictions("para", pairs)
        entry = self.cfg.entries["para"]
        return out.preds, entry.kind.outputs(entry, out.logits)

    def similarity(self, pairs: Sequence[tuple[str, str]]) -> torch.Tensor:
        """STS similarity scores (N,) of sentence pairs (0-5; the baseline's Siamese cosine head: -5 to 5)."""
        return self.predictions("sts", pairs).preds

    @torch.no_grad()
    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """The pooled sentence embeddings (N, H) the heads read (per the run's pooling), float32, in input order."""
        ds = SentenceDataset([Example(str(i), t) for i, t in enumerate(texts)], self.tokenizer,
                             max_length=self.cfg.max_length)
        parts = []
        for start in range(0, len(ds), self.batch_size):
            batch = move_batch(ds.collate(list(range(start, min(start + self.batch_size, len(ds))))), self.device)
            with autocast(self.device, self.amp):
                parts.append(self.model.embed(batch["input_ids"], batch["attention_mask"],
                                              batch.get("token_type_ids")).float())
        return torch.cat(parts).cpu() if parts else torch.empty(0, self.model.encoder.config.hidden_size)

