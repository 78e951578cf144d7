"""The tasks, as data: one registry of entries, each a name, a kind, its files and columns and its classes.

A **kind** owns everything that differs between kinds of task, so nothing outside this module asks a task's
name: how its files are read and tokenized, its head and loss, its prediction rule, its metric and that
metric's place in the overall score, the columns of its prediction and logits files, how an ensemble
combines its members, and what the Predictor returns. Three kinds (the CS224N project's, as
sentence-transformers keeps an evaluator per kind of task):

    sentence-classification   one text, C classes: C logits, cross-entropy, argmax, accuracy     (sst, cfimdb)
    pair-classification       two texts, 2 classes: one logit, binary cross-entropy, > 0, accuracy  (para)
    pair-regression           two texts, a score in [0, 5]: MSE, Pearson r, (r + 1) / 2 overall     (sts)

A **task** is an entry (``Task``): the four built-in ones below, or a user's own declared by a JSON file
(``--task-file``, ``read_task_file``), its kind inferred from its labels when not given, as HF's
``run_glue.py`` does with ``--train_file`` (whole numbers: classification with as many classes; other
numbers: regression; a label the kind cannot take is refused naming the file and line).

Usage:
    task = get_task("sst")                     # the entry; get_task(task) gives it back
    task.kind.loss(logits, labels)             # the head's loss; task.kind.predict(logits), ...
    examples, report = task.read("dev", "data", limit=None)
    task = read_task_file("topic.json")        # a user's task, registered (register_task) under its name

The model's heads: every model has the CS224N project's three (``MULTITASK``), so that each run of the
default project has one checkpoint layout whatever ``--tasks`` trains, and a head for every other task of
its run (``model_tasks``).
"""

from __future__ import annotations

import abc
import contextlib
import csv
import io
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from tasks.data.readers import (DataFileMissing, Example, ReadReport, class_label, decode_utf8, log_report,
                                read_examples, similarity_label)

logger = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")


# ---- kinds ---------------------------------------------------------------------------------------------------


def pearson_r(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two 1-D tensors, computed in float64.

    nan when either side has zero variance (r is undefined there), like scipy.
    """
    x = x.detach().reshape(-1).to("cpu", torch.float64)
    y = y.detach().reshape(-1).to("cpu", torch.float64)
    if x.numel() != y.numel():
        raise ValueError(f"pearson_r: {x.numel()} predictions but {y.numel()} labels")
    if x.numel() < 2:
        raise ValueError(f"pearson_r needs at least 2 values, got {x.numel()}")
    xc, yc = x - x.mean(), y - y.mean()
    denom = math.sqrt(float((xc * xc).sum()) * float((yc * yc).sum()))
    if denom == 0.0:
        return math.nan
    return max(-1.0, min(1.0, float((xc * yc).sum()) / denom))


class Kind(abc.ABC):
    """What differs between kinds of task: each kind implements every abstract method (a kind that forgets one
    cannot be built). Methods take the task where its entry matters (its classes)."""

    name: str = ""
    pair: bool = False  # examples are two texts (a PairDataset); else one (a SentenceDataset)
    classification: bool = True  # labels are class ids (long); else scores (float)
    binary: bool = False  # two classes scored by one logit (sigmoid); else C logits (softmax), or a score
    metric: str = "acc"  # the metric's suffix: "<task>_acc", "<task>_r"

    # -- data --
    @abc.abstractmethod
    def parse_label(self, task: Task, raw: str, problems: list[str]) -> int | float | None:
        """A label cell as this kind reads it, or None with the reason appended to ``problems``."""

    # -- model --
    @abc.abstractmethod
    def out_features(self, task: Task) -> int:
        """The head's last layer's width."""

    @abc.abstractmethod
    def head_output(self, task: Task, z: torch.Tensor, sts_scale: float) -> torch.Tensor:
        """The logits of a head that scored one sequence, from its last layer's output ``z`` (B, out_features)."""

    @abc.abstractmethod
    def loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """The head's training loss on its logits (computed in float32)."""

    @abc.abstractmethod
    def predict(self, logits: torch.Tensor) -> torch.Tensor:
        """A model's predictions from its logits: class ids (long) or scores (float32)."""

    # -- files --
    @abc.abstractmethod
    def logit_columns(self, task: Task) -> list[str]:
        """The columns after ``id`` of ``{task}-{split}-logits.csv``."""

    def logits_shape(self, task: Task, n: int) -> tuple[int, ...]:
        """A set of ``n`` examples' logits: (n, C) for several columns, (n,) for one."""
        width = len(self.logit_columns(task))
        return (n, width) if width > 1 else (n,)

    def pred_dtype(self) -> torch.dtype:
        return torch.long if self.classification else torch.float32

    # -- metric --
    def score(self, preds: torch.Tensor, labels: torch.Tensor) -> float:
        """Accuracy of class ids against labels (Quora's are floats 0.0 / 1.0: compared as class ids)."""
        return (preds.detach().cpu().long() == labels.detach().cpu().long()).double().mean().item()

    def normalized(self, value: float) -> float:
        """The metric's part of the overall score, in [0, 1]."""
        return value

    # -- ensembles --
    @abc.abstractmethod
    def contributions(self, x: torch.Tensor) -> torch.Tensor:
        """Per-model quantities (M, N[, C]) whose mean decides the simple average's prediction."""

    @abc.abstractmethod
    def average(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The simple ensemble of models' logits ``x`` (M, N[, C]), float64: (its logits, its predictions)."""

    # the regression ensembler (tasks.evaluation.ensemble.fit_regression): logits Σ_m w_m x_m (+ b), fit by
    # ``fit_loss`` (a classification; a regression: least squares in closed form)
    fit_bias: bool = False
    fit_objective: str = "least squares"

    @abc.abstractmethod
    def combine(self, w: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Σ_m w_m x_m (+ b): the regression ensembler's logits."""

    @abc.abstractmethod
    def fit_loss(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The regression ensembler's data term on float64 logits ``z`` and labels ``y`` (a regression's, the squared
        error, is minimised in closed form by least squares)."""

    # -- the Predictor --
    @abc.abstractmethod
    def outputs(self, logits: torch.Tensor) -> torch.Tensor:
        """What a user reads beside a prediction: class probabilities (N, C), P(class 1) (N,), or the score."""


class SentenceClassification(Kind):
    """One text, ``num_classes`` classes: C logits, softmax cross-entropy, argmax, accuracy."""

    name = "sentence-classification"

    def parse_label(self, task, raw, problems):
        return class_label(raw, task.num_classes, problems)

    def out_features(self, task):
        return task.num_classes

    def head_output(self, task, z, sts_scale):
        return z  # (B, C)

    def loss(self, logits, labels, reduction="mean"):
        return F.cross_entropy(logits.float(), labels.long(), reduction=reduction)

    def predict(self, logits):
        return logits.argmax(-1)

    def logit_columns(self, task):
        return [f"logit_{k}" for k in range(task.num_classes)]

    def contributions(self, x):
        return x.softmax(-1)

    def average(self, x):
        m = x.shape[0]
        probs = x.softmax(-1).mean(0)  # (N, C)
        ens = torch.logsumexp(x.log_softmax(-1), 0) - math.log(m)  # log mean p, finite
        return ens, probs.argmax(-1)

    fit_objective = "softmax cross-entropy"

    def combine(self, w, x, b):
        return torch.einsum("m,mnc->nc", w, x)  # (N, C)

    def fit_loss(self, z, y):
        return F.cross_entropy(z, y.long())

    def outputs(self, logits):
        return torch.softmax(logits, dim=-1)


class PairClassification(Kind):
    """Two texts, two classes: one logit, sigmoid binary cross-entropy, prediction logit > 0, accuracy."""

    name = "pair-classification"
    pair = True
    binary = True

    def parse_label(self, task, raw, problems):
        return class_label(raw, 2, problems)

    def out_features(self, task):
        return 1

    def head_output(self, task, z, sts_scale):
        return z.squeeze(-1)  # (B,)

    def loss(self, logits, labels, reduction="mean"):
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction=reduction)

    def predict(self, logits):
        return (logits > 0).long()

    def logit_columns(self, task):
        return ["logit"]

    def contributions(self, x):
        return torch.tanh(x / 2)

    def average(self, x):
        # the mean of sigmoid probabilities as the mean of tanh(x/2) = 2p - 1, so that its sign (p > 1/2) is
        # exact even for tiny logits; logits log(p̄ / (1 - p̄)), with the prediction's sign
        centred = torch.tanh(x / 2).mean(0)  # (N,) = 2 p̄ - 1
        # log p̄ - log(1 - p̄): as 2 atanh(2p̄ - 1) near p̄ = 1/2 (keeps the sign of tiny logits),
        # through log-sigmoids elsewhere (finite where tanh has saturated to ±1)
        far = torch.logsumexp(F.logsigmoid(x), 0) - torch.logsumexp(F.logsigmoid(-x), 0)
        near = 2 * torch.atanh(centred.clamp(-0.5, 0.5))
        ens = torch.where(centred.abs() < 0.5, near, far)
        return ens, (centred > 0).long()

    fit_bias = True
    fit_objective = "sigmoid binary cross-entropy"

    def combine(self, w, x, b):
        return torch.einsum("m,mn->n", w, x) + b  # (N,)

    def fit_loss(self, z, y):
        return F.binary_cross_entropy_with_logits(z, y)

    def outputs(self, logits):
        return torch.sigmoid(logits)


class PairRegression(Kind):
    """Two texts, a similarity score in [0, 5]: the score itself, MSE, Pearson r; (r + 1) / 2 in the overall."""

    name = "pair-regression"
    pair = True
    classification = False
    metric = "r"

    def parse_label(self, task, raw, problems):
        return similarity_label(raw, problems)

    def out_features(self, task):
        return 1

    def head_output(self, task, z, sts_scale):
        return sts_scale * torch.sigmoid(z.squeeze(-1))  # (B,)

    def loss(self, logits, labels, reduction="mean"):
        return F.mse_loss(logits.float(), labels.float(), reduction=reduction)

    def predict(self, logits):
        return logits

    def logit_columns(self, task):
        return ["score"]

    def score(self, preds, labels):
        return pearson_r(preds, labels)

    def normalized(self, value):
        return (value + 1.0) / 2.0

    def contributions(self, x):
        return x

    def average(self, x):
        mean = x.mean(0)  # (N,)
        return mean, mean

    def combine(self, w, x, b):
        return torch.einsum("m,mn->n", w, x) + b

    def fit_loss(self, z, y):
        return F.mse_loss(z, y)

    def outputs(self, logits):
        return logits


KINDS: dict[str, Kind] = {k.name: k for k in (SentenceClassification(), PairClassification(), PairRegression())}


# ---- entries -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One task: its name, kind, files (by split: a name in the data directory, or a path) and columns.

    ``title``: how tables name it; ``output_column``: the column of its leaderboard file
    (``{name}-{split}-output.csv``, the CS224N starter's format); ``also_read``: another spelling of that column
    a reader takes; ``submission``: its files go into the CS224N submission zip; ``part1``: the minBERT starter's
    part 1 (``classifier.py``) also writes it as ``{finetune|pretrain}-{name}-{split}-out.csv``;
    ``part1_only``: a run with it writes those files for each of its part-1 tasks; ``positive``: what class 1 of
    a pair classification means (the Predictor's ``p_<positive>`` column). The SST head's helpers attach
    through the entry: ``phrases`` (the treebank's phrase stream, ``--sst-phrases``), ``probe_prior``
    (``--sst-prior``) and ``cosine_prior`` (``--sts-prior``); and STS's, ``nli``: the head whose embeddings MNR
    trains on the NLI triplets (``--nli``).
    """

    name: str
    kind: Kind
    files: Mapping[str, str]
    text_columns: tuple[str, ...]
    label_column: str
    num_classes: int | None = None
    id_column: str | None = "id"
    delimiter: str = "\t"
    title: str = ""
    output_column: str = ""
    also_read: str = ""
    submission: bool = False
    part1: bool = False
    part1_only: bool = False
    positive: str = "1"
    phrases: bool = False
    probe_prior: bool = False
    cosine_prior: bool = False
    nli: bool = False
    spec: Mapping[str, Any] = field(default_factory=dict, compare=False)  # a user's task: the file it came from

    def __post_init__(self) -> None:
        if len(self.text_columns) != (2 if self.kind.pair else 1):
            raise ValueError(f"task {self.name!r}: a {self.kind.name} task reads {2 if self.kind.pair else 1} "
                             f"text column(s), got {list(self.text_columns)}")
        if self.kind.classification and not self.kind.pair and not (self.num_classes or 0) >= 2:
            raise ValueError(f"task {self.name!r}: a classification task needs num_classes >= 2")

    @property
    def metric(self) -> str:
        """Its metric's name in a run's records: sst_acc, para_acc, sts_r, ..."""
        return f"{self.name}_{self.kind.metric}"

    @property
    def table_title(self) -> str:
        """Its column in tables: "SST acc", "STS r"."""
        return f"{self.title or self.name} {self.kind.metric}"

    @property
    def classes(self) -> int | None:
        """How many classes its predictions range over (None: scores)."""
        return (self.num_classes or 2) if self.kind.classification else None

    def path(self, split: str, data_dir: str | os.PathLike[str]) -> Path | None:
        """The file of ``split`` (a name in ``data_dir``, or a user's path), None where the task has none."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
        return Path(data_dir) / self.files[split] if split in self.files else None

    def read(self, split: str, data_dir: str | os.PathLike[str], limit: int | None = None, *,
             path: str | os.PathLike[str] | None = None) -> tuple[list[Example], ReadReport]:
        """The examples of one split's file (``path`` instead of the entry's file), and its ReadReport; a test
        file is read unlabelled."""
        labeled = split != "test"
        parse = (lambda raw, problems: self.kind.parse_label(self, raw, problems)) if labeled else None
        return read_examples(path if path is not None else self.path(split, data_dir), self.text_columns,
                             self.label_column if labeled else None, parse, id_column=self.id_column,
                             delimiter=self.delimiter, limit=limit)


# ---- the registry --------------------------------------------------------------------------------------------

_REGISTRY: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Add ``task``; the same entry again is a no-op, another entry under a taken name a ValueError."""
    if not task.name.isidentifier() or task.name in ("nli", "phrases"):
        raise ValueError(f"task name {task.name!r}: use letters, digits and _ (not nli or phrases, the streams' "
                         "names)")
    old = _REGISTRY.get(task.name)
    if old is not None and old != task:
        raise ValueError(f"task {task.name!r} is already declared otherwise"
                         + (f" (by {old.spec.get('file')})" if old.spec.get("file") else " (a built-in task)"))
    _REGISTRY.setdefault(task.name, task)
    return _REGISTRY[task.name]


def unregister_task(name: str) -> None:
    """Drop a user's task (tests); the built-in ones stay."""
    if name in BUILTIN:
        raise ValueError(f"{name!r} is a built-in task")
    _REGISTRY.pop(name, None)


def get_task(task: str | Task) -> Task:
    """The entry of ``task`` (a name, or an entry: given back); a ValueError naming the known ones."""
    if isinstance(task, Task):
        return task
    if task not in _REGISTRY:
        raise ValueError(f"unknown task {task!r}; tasks are {list(_REGISTRY)} (declare your own with --task-file)")
    return _REGISTRY[task]


def task_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def task_with(tasks: Sequence[str], feature: str) -> str | None:
    """The first of ``tasks`` whose entry has ``feature`` (``phrases``, ``probe_prior``, ``cosine_prior``), or None."""
    return next((t for t in tasks if getattr(get_task(t), feature)), None)


def model_tasks(tasks: Sequence[str]) -> tuple[str, ...]:
    """The tasks a model of a run on ``tasks`` has heads for: the project's three, then the run's others."""
    return MULTITASK + tuple(t for t in tasks if t not in MULTITASK)


_SENTIMENT = dict(kind=KINDS["sentence-classification"], text_columns=("sentence",), label_column="sentiment",
                  output_column="Predicted_Sentiment", part1=True)
BUILTIN = tuple(register_task(t).name for t in (
    Task("sst", files={"train": "ids-sst-train.csv", "dev": "ids-sst-dev.csv", "test": "ids-sst-test-student.csv"},
         num_classes=5, title="SST", submission=True, phrases=True, probe_prior=True, **_SENTIMENT),
    Task("para", KINDS["pair-classification"],
         files={"train": "quora-train.csv", "dev": "quora-dev.csv", "test": "quora-test-student.csv"},
         text_columns=("sentence1", "sentence2"), label_column="is_duplicate", title="Para",
         output_column="Predicted_Is_Paraphrase", submission=True, positive="paraphrase"),
    # the starter writes STS's column misspelt (Predicted_Similiary): we write it so and also read it spelt right
    Task("sts", KINDS["pair-regression"],
         files={"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test-student.csv"},
         text_columns=("sentence1", "sentence2"), label_column="similarity", title="STS",
         output_column="Predicted_Similiary", also_read="Predicted_Similarity", submission=True, cosine_prior=True,
         nli=True),
    Task("cfimdb", files={"train": "ids-cfimdb-train.csv", "dev": "ids-cfimdb-dev.csv",
                          "test": "ids-cfimdb-test-student.csv"},
         num_classes=2, title="CFIMDB", part1_only=True, **_SENTIMENT),
))
MULTITASK = ("sst", "para", "sts")  # the CS224N multitask project's tasks: the default --tasks, in every model


def load_split(task: str | Task, split: str, data_dir: str | os.PathLike[str], limit: int | None = None
               ) -> tuple[list[Example], ReadReport] | None:
    """Read one task split from ``data_dir`` (a user's task: its own files) and log its ReadReport.

    Test files are unlabeled (``*-test-student.csv``). A dev or test file that repeats an id is a ValueError
    naming the lines (their predictions are keyed by id). A missing train/dev file raises DataFileMissing; a
    missing test file returns None after a warning, so that writing predictions skips that task instead of
    crashing (there is no quora-test-student.csv in the shared data). ``limit`` keeps the first N valid rows,
    for smoke runs.
    """
    task = get_task(task)
    path = task.path(split, data_dir)
    if path is None and split != "test":
        raise ValueError(f"task {task.name!r} declares no {split} file")
    if split == "test" and (path is None or not path.is_file()):
        logger.warning("no test file for task %r%s; its test predictions will be skipped", task.name,
                       f" at {path}" if path is not None else " (its task file names none)")
        return None
    result = task.read(split, data_dir, limit)
    report = result[1]
    if split != "train" and report.duplicate_ids:  # its predictions are keyed by id: one row per id
        line, reason = report.duplicate_ids[0]
        more = f" (and {len(report.duplicate_ids) - 1} more)" if len(report.duplicate_ids) > 1 else ""
        raise ValueError(f"{path}: line {line}: {reason}{more}: its predictions are written and read by id; give "
                         "each row its own id")
    log_report(report)
    return result


# ---- a user's task from a JSON file --------------------------------------------------------------------------

TASK_FILE_KEYS = ("name", "kind", "train", "dev", "test", "text", "label", "id", "num_classes", "delimiter")


def _labelled_rows(path: Path, label: str, delimiter: str | None) -> tuple[str, list[str], list[tuple[int, str]]]:
    """(delimiter, header, (line, raw label) of every row) of a task's training or dev file, read once, for
    inferring and checking its kind; the delimiter, when not given, is a tab where the header holds one (the
    CS224N files, .tsv), else a comma."""
    text = decode_utf8(path, path.read_bytes())
    delimiter = delimiter or ("\t" if "\t" in text.split("\n", 1)[0] else ",")
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    header = [h.strip() for h in next(reader, [])]
    if label not in header:
        raise ValueError(f"{path}: line 1: no label column {label!r} (the header has {header})")
    k = header.index(label)
    return delimiter, header, [(reader.line_num, row[k].strip()) for row in reader if len(row) > k and row[k].strip()]


def _whole(raw: str) -> bool:
    try:
        v = float(raw)
    except ValueError:
        return False
    return math.isfinite(v) and v == int(v)


_DECLARED: dict[Path, tuple[tuple, Task]] = {}  # a task file's task, while neither it nor its files changed


def _stamp(paths: Sequence[str | os.PathLike[str]]) -> tuple:
    return tuple((os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in paths)


def read_task_file(path: str | os.PathLike[str]) -> Task:
    """The task a JSON file declares, registered; a ValueError naming the file (and the data file and line).
    Read once while neither the file nor its data files change: every config naming it (the command line, a
    saved run, an ensemble's members) asks again.

    Keys: ``name``; ``train``, ``dev`` and optionally ``test`` (CSV files, relative to the JSON file's folder,
    tab- or comma-separated as their header line shows, or ``delimiter``); ``text``: one column (a sentence task)
    or two (a pair task); ``label``; optional ``id`` (the id column; null: ids are line numbers; default "id" when
    the header has one); optional ``kind`` (sentence-classification, pair-classification, pair-regression) and
    ``num_classes``. Without ``kind``, whole-number labels make a classification task with as many classes as
    the largest label + 1 (pair tasks: two), other numbers a pair regression.
    """
    path = Path(path)
    known = _DECLARED.get(path.resolve())
    if known is not None:
        with contextlib.suppress(OSError):
            if _stamp([path, *known[1].files.values()]) == known[0]:
                return register_task(known[1])
    task = _read_task_file(path)
    _DECLARED[path.resolve()] = (_stamp([path, *task.files.values()]), task)
    return register_task(task)


def _read_task_file(path: Path) -> Task:
    where = f"--task-file {path}"
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{where}: no such file") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: not a JSON file ({e})") from None
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: a task file is a JSON object with keys {', '.join(TASK_FILE_KEYS)}")
    unknown = sorted(set(spec) - set(TASK_FILE_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; a task file has {', '.join(TASK_FILE_KEYS)}")
    for key in ("name", "train", "dev", "text", "label"):
        if key not in spec:
            raise ValueError(f"{where}: no {key!r}; a task file names its name, train and dev files, text "
                             "column(s) and label column")
    folder = path.resolve().parent
    files = {s: str(folder / spec[s]) for s in SPLITS if spec.get(s)}
    for split, f in files.items():
        if not Path(f).is_file():
            raise DataFileMissing(f)
    text = (spec["text"],) if isinstance(spec["text"], str) else tuple(spec["text"])
    if len(text) not in (1, 2) or not all(isinstance(c, str) for c in text):
        raise ValueError(f"{where}: 'text' is one column name or a list of two (a sentence pair), got {spec['text']!r}")
    train = Path(files["train"])
    delimiter, header, labels = _labelled_rows(train, spec["label"], spec.get("delimiter"))
    if not labels:
        raise ValueError(f"{train}: no labels in column {spec['label']!r}")
    kind_name = spec.get("kind")
    if kind_name is not None and kind_name not in KINDS:
        raise ValueError(f"{where}: kind {kind_name!r}; kinds are {', '.join(KINDS)}")
    fractional = next(((line, raw) for line, raw in labels if not _whole(raw)), None)
    if kind_name is None:
        classification = fractional is None
        kind_name = ("pair-classification" if len(text) == 2 else "sentence-classification") if classification \
            else "pair-regression"
    kind = KINDS[kind_name]
    if kind.pair != (len(text) == 2):
        raise ValueError(f"{where}: a {kind.name} task reads {2 if kind.pair else 1} text column(s), 'text' names "
                         f"{len(text)}" + ("; there is no sentence regression kind" if not kind.classification else ""))
    if kind.classification and fractional is not None:
        line, raw = fractional
        raise ValueError(f"{train}: line {line}: label {raw!r} is not a class id, and task {spec['name']!r} is "
                         f"{kind.name}" + ("" if spec.get("kind") else " (its text columns make it one)")
                         + "; give whole-number classes 0, 1, ... or \"kind\": \"pair-regression\"")
    num_classes = spec.get("num_classes")
    if kind.classification and not kind.pair and num_classes is None:
        num_classes = int(max(float(raw) for _, raw in labels)) + 1
    if kind.pair and kind.classification and num_classes not in (None, 2):
        raise ValueError(f"{where}: a pair-classification task has two classes (one logit, as Quora's), got "
                         f"num_classes {num_classes}")
    if kind.pair and kind.classification:
        num_classes = 2
    id_column = spec["id"] if "id" in spec else "id" if "id" in header else None
    task = Task(spec["name"], kind, files=files, text_columns=text, label_column=spec["label"],
                num_classes=num_classes, id_column=id_column, delimiter=delimiter,
                output_column=f"Predicted_{spec['name']}", spec={"file": str(path)})
    # every label the kind cannot take, named with its line (the readers would skip it and carry on)
    for split in ("train", "dev"):
        problems_at = []
        for line, raw in (labels if split == "train" else
                          _labelled_rows(Path(files[split]), spec["label"], delimiter)[2]):
            problems: list[str] = []
            kind.parse_label(task, raw, problems)
            if problems:
                problems_at.append((line, problems[0]))
        if problems_at:
            line, problem = problems_at[0]
            raise ValueError(f"{files[split]}: line {line}: {problem} for task {task.name!r} ({kind.name}"
                             + (f", {num_classes} classes" if num_classes else "") + ")"
                             + (f"; and {len(problems_at) - 1} more rows" if len(problems_at) > 1 else ""))
    return task


__all__ = ("BUILTIN", "KINDS", "MULTITASK", "SPLITS", "Kind", "PairClassification", "PairRegression",
           "SentenceClassification", "Task", "get_task", "load_split", "model_tasks", "pearson_r",
           "read_task_file", "register_task", "task_names", "task_with", "unregister_task")
