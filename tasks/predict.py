"""Predictions of a trained model: new text (command and Predictor API), the files of a run, --eval-only.

Usage:
    python -m tasks.predict --checkpoint runs/try/checkpoints/best --task sst --input sentences.txt
    printf 'a cat sits\ta cat is sitting\n' | python -m tasks.predict --checkpoint runs/try --task sts

    p = Predictor.from_checkpoint("runs/try/checkpoints/best")           # device="auto": CUDA when present
    labels, probs = p.sentiment(["a gripping film", "dull"])             # (N,) classes 0-4, (N, 5) probabilities
    labels, probs = p.paraphrase([("how do i cook rice", "how to cook rice")])   # (N,) 0/1, (N,) P(paraphrase)
    scores = p.similarity([("a cat sits", "a cat is sitting")])          # (N,) 0-5
    vectors = p.embed(["a gripping film"])                               # (N, H) what the heads read

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

import contextlib
import csv
import dataclasses
import logging
import os
import sys
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
from tasks.argparsing import Parser
from tasks.checkpoint import (
    load_objectives_state,
    load_tensors,
    read_json,
    resolve_checkpoint,
)
from tasks.config import TrainConfig, eval_config
from tasks.data import SentenceDataset, move_batch
from tasks.errors import user_errors
from tasks.evaluate import (
    Predictions,
    evaluate,
    jsonable,
    predict_dataset,
    write_logits,
    write_predictions,
)
from tasks.model import MultitaskBert
from tasks.prior import CosinePrior, SentimentPrior, sst_prior_of, sts_prior_of
from tasks.objectives import Objective, build_objectives, transform_of
from tasks.readers import Example, read_pairs, read_sentences
from tasks.runtime import autocast, autocast_dtype, resolve_device
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
                          train_sets: dict[str, Any] | None = None, sts_prior: CosinePrior | None = None,
                          sst_prior: SentimentPrior | None = None, checkpoint: Path | None = None) -> dict:
    """Full dev metrics, and dev + test prediction and logit files for every task of ``cfg``.

    A missing test file (there is no quora-test-student.csv in the shared data)
    is skipped with a message. With ``cfg.predict_train`` the whole training
    file of each task (no per-epoch caps) is predicted too: its logits go to
    ``{task}-train-logits.csv`` (distillation teachers, tasks/objectives/distill.py;
    no leaderboard file) and its metrics to "train". An objective's
    ``inference`` (KNN-BERT) scores dev under its key and may replace the
    leaderboard predictions. ``train_sets`` (a trainer's tokenized training
    sets) saves reading them again, ``sts_prior`` and ``sst_prior`` (a trainer's)
    loading the priors' encoder again; without an ``sst_prior``, the probe
    saved in ``checkpoint`` is used, or one fitted on SST train. Returns
    {"dev": metrics, "files": [paths], "skipped": [...]} plus "train" and each
    inference's key when computed.
    """
    view = eval_model(model, objectives, cfg.tasks)
    sts_prior = sts_prior if sts_prior is not None else sts_prior_of(cfg, device, amp_dtype)
    sst_prior = sst_prior if sst_prior is not None else sst_prior_of(cfg, device, amp_dtype, checkpoint)
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
                                  autocast_dtype=amp_dtype, both_orders=cfg.symmetric_eval,
                                  sts_prior=sts_prior, sst_prior=sst_prior)
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
    result = write_all_predictions(model, objectives, tokenizer, cfg, Path(out_dir) / "predictions", device, amp,
                                   checkpoint=ckpt)
    result["checkpoint"] = str(ckpt)
    return result


# ---- new text: the Predictor API and python -m tasks.predict ------------------------------------------------------


class Predictor:
    """A trained model's predictions on new sentences, batched, in eval mode, under torch.no_grad().

    Objectives' evaluation transforms apply as in the run's own dev predictions
    (Match-Tuning's batch matching); KNN-BERT's vote needs the training set and
    is not applied (``--eval-only`` applies it). Outputs are float32 CPU tensors.
    """

    def __init__(self, model: MultitaskBert, objectives: Sequence[Objective], tokenizer: BertTokenizer,
                 cfg: TrainConfig, device: torch.device, batch_size: int | None = None,
                 checkpoint: str | os.PathLike | None = None) -> None:
        self.model, self.tokenizer, self.cfg, self.device = model.eval(), tokenizer, cfg, device
        self.view = eval_model(model, objectives, cfg.tasks)
        self.amp = autocast_dtype(cfg.bf16, device)
        self.batch_size = batch_size or cfg.eval_batch_size
        self.sts_prior = sts_prior_of(cfg, device, self.amp)
        self.sst_prior = sst_prior_of(cfg, device, self.amp, checkpoint)  # the checkpoint's probe: no data needed

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, device: str = "auto", batch_size: int | None = None
                        ) -> Predictor:
        """A checkpoint directory (or a run directory: its checkpoints/best) on ``device`` (auto: CUDA if present)."""
        run_best = Path(path) / "checkpoints" / "best"
        dev = resolve_device(device)
        ckpt = run_best if run_best.is_dir() else Path(path)
        model, objectives, tokenizer, cfg = load_checkpoint_model(ckpt, dev)
        return cls(model, objectives, tokenizer, cfg, dev, batch_size, checkpoint=resolve_checkpoint(ckpt))

    def _predict(self, task: str, examples: list[Example]) -> Predictions:
        if task not in self.cfg.tasks:
            raise ValueError(f"this checkpoint was trained on {', '.join(self.cfg.tasks)}, not {task}")
        return predict_dataset(self.view, task, make_dataset(task, examples, self.tokenizer, self.cfg),
                               batch_size=self.batch_size, device=self.device, autocast_dtype=self.amp,
                               both_orders=self.cfg.symmetric_eval,
                               sts_prior=self.sts_prior, sst_prior=self.sst_prior)

    @staticmethod
    def _pairs(pairs: Sequence[tuple[str, str]]) -> list[Example]:
        return [Example(str(i), a, b) for i, (a, b) in enumerate(pairs)]

    def sentiment(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(labels (N,) in 0-4, probabilities (N, 5)) of SST-5 sentiment."""
        out = self._predict("sst", [Example(str(i), t) for i, t in enumerate(texts)])
        return out.preds, torch.softmax(out.logits, dim=-1)

    def paraphrase(self, pairs: Sequence[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(labels (N,) 1 = paraphrase, P(paraphrase) (N,)) of sentence pairs."""
        out = self._predict("para", self._pairs(pairs))
        return out.preds, torch.sigmoid(out.logits)

    def similarity(self, pairs: Sequence[tuple[str, str]]) -> torch.Tensor:
        """STS similarity scores (N,) of sentence pairs (0-5; the baseline's Siamese cosine head: -5 to 5)."""
        return self._predict("sts", self._pairs(pairs)).preds

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


def read_inputs(task: str, source: str) -> list[Example]:
    """Examples from ``source`` (a path, or "-" for stdin): one sentence (sst) or one tab-separated pair per
    line, ids = line numbers (blank lines skipped); a .csv file is read in the task's CS224N format."""
    if source != "-" and not Path(source).is_file():
        raise FileNotFoundError(f"--input {source}: no such file")
    if source.endswith(".csv"):
        return read_sentences(source, False, 5)[0] if task == "sst" else read_pairs(source, None)[0]
    lines = sys.stdin.read().splitlines() if source == "-" else Path(source).read_text(encoding="utf-8").splitlines()
    examples = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if task == "sst":
            examples.append(Example(str(n), line.strip()))
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not all(x.strip() for x in parts):
            raise ValueError(f"{'stdin' if source == '-' else source} line {n}: expected two sentences separated "
                             f"by one tab (task {task}), got {len(parts)} field(s)")
        examples.append(Example(str(n), parts[0].strip(), parts[1].strip()))
    return examples


def prediction_rows(predictor: Predictor, task: str, examples: list[Example]) -> tuple[list[str], list[list]]:
    """(CSV header, rows) of the predictions for ``examples``."""
    ids = [e.id for e in examples]
    if task == "sts":
        scores = predictor.similarity([(e.text_a, e.text_b) for e in examples])
        return ["id", "score"], [[i, float(s)] for i, s in zip(ids, scores)]
    if task == "sst":
        labels, probs = predictor.sentiment([e.text_a for e in examples])
        return (["id", "label"] + [f"p{k}" for k in range(probs.shape[1])],
                [[i, int(y), *map(float, p)] for i, y, p in zip(ids, labels, probs)])
    labels, probs = predictor.paraphrase([(e.text_a, e.text_b) for e in examples])
    return ["id", "label", "p_paraphrase"], [[i, int(y), float(p)] for i, y, p in zip(ids, labels, probs)]


def build_parser() -> Parser:
    p = Parser(prog="python -m tasks.predict",
               description="Predict on new text with a trained checkpoint: CSV of id,label,probabilities "
                           "(sst: p0..p4; para: p_paraphrase) or id,score (sts).")
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="a checkpoint directory (runs/x/checkpoints/best) or a run directory (its best checkpoint)")
    p.add_argument("--task", required=True, choices=("sst", "para", "sts"))
    p.add_argument("--input", default="-", metavar="FILE",
                   help="one sentence (sst) or two tab-separated sentences (para, sts) per line; a .csv file in "
                        "the task's CS224N format; - reads stdin")
    p.add_argument("--output", default="-", metavar="FILE", help="CSV file to write; - writes stdout")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:1, ...")
    p.add_argument("--batch-size", type=int, default=None, metavar="B",
                   help="sentences per forward pass (default: the run's eval batch size)")
    return p


def main(argv: Sequence[str] | None = None) -> list[list]:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        examples = read_inputs(args.task, args.input)
    except (ValueError, FileNotFoundError) as e:
        parser.error(str(e))  # the --input the user gave: an argument error (exit status 2)
    with user_errors(parser.prog):  # a damaged checkpoint, a task it was not trained on: one line, exit status 1
        predictor = Predictor.from_checkpoint(args.checkpoint, device=args.device, batch_size=args.batch_size)
        header, rows = prediction_rows(predictor, args.task, examples)
    with (contextlib.nullcontext(sys.stdout) if args.output == "-"
          else open(args.output, "w", newline="", encoding="utf-8")) as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    return rows


if __name__ == "__main__":
    main()
