"""Which examples a run reads: the task files under its limit, the fixed dev subsets, tokenized datasets.

Usage:
    run = cfg.resolve()                   # the run's tasks and streams (tasks.run_tasks.RunTasks)
    files = read_run_files(cfg, run)      # every file the run reads, read once, before its run directory is made
    data = tokenize_run_data(files, cfg, run, tokenizer)  # what the trainer trains and scores on, the final files
    data = load_run_data(cfg, tokenizer)  # the three at once
    examples = load_examples("sts", "test", cfg)             # None when the file is absent
    dataset = make_dataset("sts", examples, tokenizer, cfg)  # SentenceDataset or PairDataset
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tasks.train_config import TrainConfig
from tasks.data.datasets import TripletDataset
from tasks.data.readers import DataFileMissing, Example, Triplet, load_nli, log_report
from tasks.model import NLI
from tasks.options import own_flag, spelled_flag, value_at
from tasks.run_tasks import RunTasks
from tasks.task import ExtraStream, load_split

logger = logging.getLogger(__name__)


def make_dataset(task: str, examples: Sequence[Example], tokenizer: Any, cfg: TrainConfig):
    """The tokenized dataset of a task, as its kind reads its examples (``Kind.dataset``): a SentenceDataset (one
    text), or a PairDataset in the model's pair encoding; labels as its loss reads them."""
    return cfg.entries[task].kind.dataset(examples, tokenizer, cfg.max_length, cfg.model.pair_encoding)


def fixed_subset(examples: list[Example], n: int, seed: int) -> list[Example]:
    """A fixed random subset of ``n`` examples (same for every epoch), kept in file order."""
    if n >= len(examples):
        return examples
    g = torch.Generator().manual_seed(seed)
    keep = sorted(torch.randperm(len(examples), generator=g)[:n].tolist())
    return [examples[i] for i in keep]


def capped_dev(task: str, dev: list[Example], cfg: TrainConfig) -> list[Example]:
    """The dev examples scored between epochs: a fixed seeded subset where ``dev_max_examples`` caps the task."""
    n = cfg.dev_max_examples.get(task)
    if n is None or n >= len(dev):
        return dev
    logger.info("%s dev: a fixed random %d of %d examples between epochs%s", task, n, len(dev),
                " and at the end (final_dev capped)" if cfg.final_dev == "capped" else
                " (the final evaluation uses all)")
    return fixed_subset(dev, n, cfg.seed)


def load_examples(task: str, split: str, cfg: TrainConfig,
                  reports: dict[str, dict] | None = None) -> list[Example] | None:
    """The examples of one task file under ``cfg.limit``; None when the file is absent, an error when it is empty.

    ``reports`` receives the file's ``ReadReport.to_dict()`` under "<task> <split>".
    """
    loaded = load_split(cfg.entries[task], split, cfg.data_dir, limit=cfg.limit)
    if loaded is None:
        return None
    examples, report = loaded
    if reports is not None:
        reports[f"{task} {split}"] = report.to_dict()
    if not examples:
        raise ValueError(f"{task} {split}: no valid examples in {cfg.data_dir}")
    return examples


def _named(cfg: TrainConfig, stream: ExtraStream, value: Any, path: str = "stream_files") -> str:
    """How a user gave an extra stream's setting at ``path`` (its file, its fewest words) as ``value``: the run's flag
    where the run sets it (--sst-phrases FILE for the SST phrases' file, which the defaults set), else its task
    file's key."""
    if stream.name in value_at(cfg, path):
        return spelled_flag(TrainConfig, path, stream.name, value)
    key = {"stream_files": "", "stream_min_words": "'s \"min_words\""}[path]  # its task file's key
    return f"task file {cfg.entries.declaring(stream.name).origin.get('file')}'s \"phrases\"{key} {value}"


def stream_file(cfg: TrainConfig, spec: ExtraStream, resuming: bool = False) -> Path:
    """The file of an extra stream of the run (``spec``: as resolved, ``RunTasks.extra``; the SST phrases'
    ``--sst-phrases``: a bare name is in --data-dir, a path with a folder in it is that path); a FileNotFoundError
    naming where it was named when it is not there (checked before a run reads anything:
    tasks.training.run.prepare_run), saying what to do: for a run ``resuming`` another, put it back (it trains on
    the data it started with: --resume refuses the flag that turns the stream off)."""
    stream = spec.name
    given = Path(spec.file).expanduser()
    bare = given.name == str(given)
    path = Path(cfg.data_dir) / given if bare else given
    if not path.is_file():
        flag = own_flag(TrainConfig, "stream_files", stream)  # the SST phrases' --sst-phrases
        declared = flag is None or stream not in cfg.stream_files  # by a task file, not by a flag
        if resuming:
            raise FileNotFoundError(f"{_named(cfg, spec, spec.file)}: no such file {path}: {resumed_data(bare)}"
                                    + (", or name the task file where it is now, its files beside it (--task-file)"
                                       if declared else ""))
        if declared:
            raise FileNotFoundError(f"{_named(cfg, spec, spec.file)}: no such file: put it there or correct the "
                                    f"path, or train without the stream: --stream-files {stream}=none")
        raise FileNotFoundError(f"{_named(cfg, spec, spec.file)}: no such file {path} (a name in --data-dir "
                                f"{cfg.data_dir}, or a path): point --data-dir at the folder of the data files, build "
                                f"it from the treebank's trees (python -m tasks.sst_phrases TREES --out {path}, "
                                f"data/README.md), or train without phrases: {flag} none")
    return path


def resumed_data(bare: bool = False) -> str:
    """What to do about a file a resumed run cannot find: put it back (a ``bare`` name, in --data-dir: or point
    --data-dir at it, which --resume may change)."""
    return "the resumed run trains on the data it started with: put the file back" + (
        ", or point --data-dir at the folder that holds it" if bare else "")


def triplets_file(run: RunTasks, resuming: bool = False) -> Path | None:
    """The NLI triplets a task file declares that a run with --nli trains on (``RunTasks.triplets``), a
    FileNotFoundError naming its key when it is not there (``resuming``: saying to put it back, as ``stream_file``);
    None for STS's (data/nli-train.csv: a data file in --data-dir, which its reader names so)."""
    entry = run.triplets
    if entry is None or not entry.origin.get("file"):
        return None
    path = Path(entry.triplets)
    if not path.is_file():
        where = f"task file {entry.origin['file']}'s \"triplets\" {path}: no such file: "
        raise FileNotFoundError(where + (f"{resumed_data()}, or name the task file where it is now, its files beside "
                                         "it (--task-file)" if resuming else
                                         "put it there or correct the path, or train without them: --no-nli"))
    return path


def load_stream(cfg: TrainConfig, spec: ExtraStream) -> tuple[list[Example], dict]:
    """The examples of an extra stream of the run (``spec``: as resolved, ``RunTasks.extra``; read as its task's
    training file, under ``cfg.limit``) with at least its ``min_words`` words, and the file's report with the
    examples left out for their length counted."""
    path = stream_file(cfg, spec)
    where = _named(cfg, spec, path)
    rows, report = cfg.entries.declaring(spec.name).read("train", cfg.data_dir, cfg.limit, path=path)
    if not rows:
        raise ValueError(f"{where}: no valid row ({report.summary()})")
    kept = [p for p in rows if len(p.text_a.split()) >= spec.min_words]
    if not kept:
        raise ValueError(f"{where}: no phrase of {spec.min_words} or more words to train on (of {len(rows)} valid "
                         "rows)")
    log_report(report)
    if len(kept) < len(rows):
        logger.info("%s: %d of %d phrases have %d or more words (%s)", path, len(kept), len(rows), spec.min_words,
                    _named(cfg, spec, spec.min_words, "stream_min_words"))
    return kept, {**report.to_dict(), "shorter_than_min_words": len(rows) - len(kept)}


FINAL_SPLITS = ("dev", "test")


@dataclass
class RunFiles:
    """Every file a run reads, read once (``read_run_files``), not yet tokenized."""

    train: dict[str, list[Example]]  # by stream: each task's training examples, then its extra streams' (phrases)
    nli: list[Triplet] | None  # the NLI triplets, on a run with --nli
    final_examples: dict[str, dict[str, list[Example] | None]]  # {"dev"/"test": {task: examples, None: no file}}
    reports: dict[str, dict]  # ReadReport.to_dict() of every file read, by "<task> <split>" ("nli train" too)
    seconds: float  # the time the reading took


@dataclass
class RunData:
    """What a run trains and scores on (``tokenize_run_data``): its files' examples tokenized."""

    train_sets: dict[str, Any]  # tokenized, by stream
    dev_sets: dict[str, Any]  # tokenized, by task, capped (dev_max_examples): the per-epoch scores
    final_examples: dict[str, dict[str, list[Example] | None]]  # {"dev"/"test": {task: examples, None: no file}}
    reports: dict[str, dict]  # ReadReport.to_dict() of every file read, by "<task> <split>" ("nli train" too)


def load_final_examples(cfg: TrainConfig, reports: dict[str, dict] | None = None
                        ) -> dict[str, dict[str, list[Example] | None]]:
    """The whole dev and the test examples final predictions are made of (``RunData.final_examples``), for a
    command that trains nothing (--eval-only). A user's task whose files are gone (the run moved, or its task
    folder) is skipped with a warning: the run predicts its other tasks."""
    final: dict[str, dict[str, list[Example] | None]] = {split: {} for split in FINAL_SPLITS}
    for task in cfg.tasks:
        entry = cfg.entries[task]
        for split in FINAL_SPLITS:
            try:
                final[split][task] = load_examples(task, split, cfg, reports)
            except DataFileMissing as e:
                if not entry.origin.get("file"):
                    raise
                logger.warning("task %s: its %s file %s is not there: its %s predictions are skipped (where its "
                               "task file is now: --task-file PATH)", task, split, e.path, split)
                final[split][task] = None
    return final


def read_run_files(cfg: TrainConfig, run: RunTasks) -> RunFiles:
    """Every file a run reads (each task's train, dev and test files, its extra streams' as ``run`` resolves them,
    NLI's), read once, before its run directory is made (tasks.training.run.prepare_run): a file the run cannot
    use, a test file too, is refused before anything is written."""
    reports: dict[str, dict] = {}
    t0 = time.perf_counter()
    train: dict[str, list[Example]] = {}
    final: dict[str, dict[str, list[Example] | None]] = {split: {} for split in FINAL_SPLITS}
    for task in run.tasks:
        train[task] = load_examples(task, "train", cfg, reports)
        final["dev"][task] = load_examples(task, "dev", cfg, reports)
        final["test"][task] = load_examples(task, "test", cfg, reports)
    for stream, spec in run.extra.items():  # a task's extra labelled stream (SST's phrases), through its head
        train[stream], reports[f"{run.entries.declaring(stream).name} {stream}"] = load_stream(cfg, spec)
    nli = None
    if run.triplets is not None:
        nli, report = load_nli(cfg.data_dir, limit=cfg.limit, file=run.triplets.triplets)
        reports["nli train"] = report.to_dict()
    return RunFiles(train, nli, final, reports, time.perf_counter() - t0)


def tokenize_run_data(files: RunFiles, cfg: TrainConfig, run: RunTasks, tokenizer: Any) -> RunData:
    """The training and per-epoch dev sets of a run's files (``read_run_files``), tokenized."""
    t0 = time.perf_counter()
    train_sets: dict[str, Any] = {}
    dev_sets: dict[str, Any] = {}
    for task in run.tasks:
        train_sets[task] = make_dataset(task, files.train[task], tokenizer, cfg)
        dev_sets[task] = make_dataset(task, capped_dev(task, files.final_examples["dev"][task], cfg), tokenizer, cfg)
    for stream in run.extra:
        train_sets[stream] = make_dataset(run.entries.declaring(stream).name, files.train[stream], tokenizer, cfg)
    if files.nli is not None:
        train_sets[NLI] = TripletDataset(files.nli, tokenizer, max_length=cfg.max_length)
    logger.info("data: %s (read in %.1f s, tokenized in %.1f s)",
                ", ".join(f"{s} {len(d)} train" for s, d in train_sets.items()), files.seconds,
                time.perf_counter() - t0)
    return RunData(train_sets, dev_sets, files.final_examples, files.reports)


def load_run_data(cfg: TrainConfig, tokenizer: Any) -> RunData:
    """Every file a run reads, read and tokenized once (``read_run_files``, ``tokenize_run_data``), its tasks
    resolved once (``TrainConfig.resolve``)."""
    run = cfg.resolve()
    return tokenize_run_data(read_run_files(cfg, run), cfg, run, tokenizer)
