"""Predictions of a trained model: the dev / test prediction and logits files of a run, and --eval-only.

Usage:
    result = evaluate_checkpoint("runs/try/checkpoints/best")      # dev metrics + predictions/ of a saved model
    model, objectives, tokenizer, cfg = load_checkpoint_model("runs/try/checkpoints/best")
    result = write_all_predictions(model, objectives, tokenizer, cfg, Path("runs/try/predictions"), device, None)

What is written, for every task of the config: ``{task}-{split}-output.csv``
(the leaderboard files) and ``{task}-{split}-logits.csv`` (raw outputs, for
ensembles and distillation) for dev and test (a missing test file is skipped
with a message), and with ``predict_train`` the training sets' logits
(distillation teachers). An objective may change the final evaluation through
its ``inference`` hook (KNN-BERT's vote: its metrics go to the record under
the inference's ``key``, and its predictions to the leaderboard files).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from minbert.bert import BertModel
from minbert.config import BertConfig
from minbert.tokenizer import BertTokenizer
from tasks import distributed
from tasks.checkpoint import load_objectives_state, load_tensors, read_json, resolve_checkpoint
from tasks.config import TrainConfig, eval_config
from tasks.evaluate import evaluate, jsonable, write_logits, write_predictions
from tasks.model import MultitaskBert
from tasks.objectives import Objective, build_objectives, transform_of
from tasks.runtime import autocast_dtype, resolve_device
from tasks.splits import capped_dev, load_examples, make_dataset

logger = logging.getLogger(__name__)


class EvalView(nn.Module):
    """The model as evaluation sees it: objectives' inference transforms (Match-Tuning "batch") applied."""

    def __init__(self, model: MultitaskBert, transforms: dict[str, Callable]):
        super().__init__()
        self.model = model
        self.transforms = transforms

    def forward(self, task: str, batch: dict):
        return self.model(task, batch, transform=self.transforms.get(task))

    def predict(self, task: str, out) -> torch.Tensor:
        return self.model.predict(task, out)


def eval_model(model: MultitaskBert, objectives: Sequence[Objective], tasks: Sequence[str]) -> nn.Module:
    """``model`` itself, or a view applying the objectives' evaluation transforms where they have one."""
    transforms = {}
    for task in tasks:
        fn = transform_of(objectives, task, training=False)
        if fn is not None:
            transforms[task] = fn
    return EvalView(model, transforms) if transforms else model


def write_all_predictions(model: MultitaskBert, objectives: Sequence[Objective], tokenizer: Any, cfg: TrainConfig,
                          pred_dir: Path, device: torch.device, amp_dtype: torch.dtype | None,
                          train_sets: dict[str, Any] | None = None) -> dict:
    """Full dev metrics, and dev + test prediction and logit files for every task of ``cfg``.

    A missing test file (there is no quora-test-student.csv in the shared data)
    is skipped with a message. With ``cfg.predict_train`` the whole training
    file of each task (no per-epoch caps) is predicted too: its logits go to
    ``{task}-train-logits.csv`` (distillation teachers, tasks/objectives/distill.py;
    no leaderboard file) and its metrics to "train". An objective's
    ``inference`` (KNN-BERT) scores dev under its key and may replace the
    leaderboard predictions. ``train_sets`` (a trainer's tokenized training
    sets) saves reading them again. Returns {"dev": metrics, "files": [paths],
    "skipped": [...]} plus "train" and each inference's key when computed.
    """
    view = eval_model(model, objectives, cfg.tasks)
    train_sets = dict(train_sets or {})

    def train_set(task: str) -> Any:
        if task not in train_sets:
            examples = load_examples(task, "train", cfg)
            if examples is None:
                raise FileNotFoundError(f"{task} train: no input file in {cfg.data_dir}; --predict-train and "
                                        "KNN-BERT inference need the training data")
            train_sets[task] = make_dataset(task, examples, tokenizer, cfg)
        return train_sets[task]

    inferences = [inf for o in objectives
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
            examples = load_examples(task, split, cfg)
            if examples is not None and split == "dev" and cfg.final_dev == "capped":
                examples = capped_dev(task, examples, cfg)
            if examples is None:
                msg = f"{task} {split}: no input file in {cfg.data_dir}; its predictions are skipped"
                logger.warning(msg)
                skipped.append(msg)
                continue
            datasets[task] = make_dataset(task, examples, tokenizer, cfg)
        t0 = time.perf_counter()
        metrics, preds = evaluate(view, datasets, batch_size=cfg.eval_batch_size, device=device,
                                  autocast_dtype=amp_dtype)
        logger.info("%s predictions for %s in %.0f s%s", split, ", ".join(preds), time.perf_counter() - t0,
                    (": " + " ".join(f"{k} {v:.4f}" for k, v in metrics.items())) if metrics else "")
        leaderboard = preds
        if split != "train":  # a training example is its own nearest neighbour
            for inference in inferences:
                leaderboard, extra_metrics = inference.score(split, datasets, leaderboard, metrics)
                if extra_metrics:
                    result.setdefault(inference.key, dict(inference.info)).update(extra_metrics)
        for task, p in preds.items():
            if split != "train":
                files.append(str(write_predictions(pred_dir, task, split, leaderboard[task])))
            files.append(str(write_logits(pred_dir, task, split, p)))
        if split in ("dev", "train"):
            result[split] = jsonable(metrics)
    result["files"] = files
    result["skipped"] = skipped
    return result


def load_checkpoint_model(path: str | os.PathLike, device: torch.device | str = "cpu"
                          ) -> tuple[MultitaskBert, list[Objective], BertTokenizer, TrainConfig]:
    """Rebuild (model, objectives, tokenizer, config) from a checkpoint directory alone."""
    ckpt = resolve_checkpoint(path)
    cfg = TrainConfig.from_dict(read_json(ckpt / "config.json"))
    enc_dir = ckpt / "encoder"
    encoder = BertModel(BertConfig.from_json_file(enc_dir / "config.json"))
    tokenizer = BertTokenizer.from_pretrained(enc_dir)
    model = MultitaskBert(encoder, cfg.model)
    model.load_state_dict(load_tensors(ckpt / "model.safetensors"))
    model.to(device)
    objectives = build_objectives(cfg.objectives, model)
    for o in objectives:
        o.to(device)
    load_objectives_state(objectives, model, ckpt, torch.device(device))
    return model, objectives, tokenizer, cfg


def evaluate_checkpoint(path: str | os.PathLike, *, out_dir: str | os.PathLike | None = None,
                        overrides: dict[str, Any] | None = None) -> dict:
    """--eval-only: dev metrics and dev + test predictions of a saved model.

    ``overrides`` may set the fields ``tasks.config.eval_mutable()`` lists
    (data_dir, device, bf16, eval_batch_size, limit, ... and the objectives'
    inference options, e.g. knn_bert's knn_k and knn_phi): an objective whose
    options differ from the saved ones gets a new Config (checked as at training).
    Files go to ``<out_dir>/predictions`` (default: the run directory holding the checkpoint).
    """
    if distributed.env()[1] > 1:
        raise ValueError("evaluation runs in one process: start --eval-only with python, not torchrun")
    ckpt = resolve_checkpoint(path)
    saved = TrainConfig.from_dict(read_json(ckpt / "config.json"))
    cfg = eval_config(saved, dict(overrides or {}))
    device = resolve_device(cfg.device)
    amp = autocast_dtype(cfg.bf16, device)
    model, objectives, tokenizer, _ = load_checkpoint_model(ckpt, device)
    for o in objectives:
        changed = cfg.objectives.get(o.name)
        if changed is not None and changed != saved.objectives.get(o.name):
            o.config = type(o.config)(**{**dataclasses.asdict(o.config), **changed})
    if out_dir is None:
        # runs/<name>/checkpoints/best -> runs/<name>; a checkpoint copied elsewhere -> its saved out_dir
        out_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else saved.out_dir
    result = write_all_predictions(model, objectives, tokenizer, cfg, Path(out_dir) / "predictions", device, amp)
    result["checkpoint"] = str(ckpt)
    return result
