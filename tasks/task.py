"""The tasks, as data: entries, each a name, a kind, its files and columns, its classes or scale.

A **kind** owns everything that differs between kinds of task, so nothing outside this module asks a task's
name or what kind it is: the dataset it reads its examples into, the head it builds in a model (``Head``, for
the model's arch and pair encoding), its label tensors, loss and prediction rule (and a pair's in both orders),
the metrics it can be scored by, the columns of its logits files and the Predictor's rows and answers, how an
ensemble combines and fits its members. An objective names the kinds it takes (tasks/objectives). One text or a
pair, times classes or a score on the labels' own scale:

    sentence-classification   one text, C classes: C logits, softmax cross-entropy, argmax     (sst, cfimdb, cola)
    pair-classification       two texts, C classes: C logits, as above                        (NLI's three)
                              two classes: one logit, sigmoid BCE, logit > 0 (Quora's head)    (para, mrpc, rte)
    sentence-regression       one text, a score in [low, high]: low + span x sigmoid, MSE        (a 1-10 rating)
    pair-regression           two texts, a score in [low, high], as above                       (sts: [0, 5])

A **task** is an entry (``Task``): the CS224N project's three and CFIMDB declared by the files of tasks/cs224n/,
the GLUE tasks declared by the files of tasks/glue/ (their files in --data-dir/glue/), or a user's own declared by a
JSON file (tasks/task_file.py), whose classes are the sorted distinct labels (words, sparse or negative ids) and
whose kind is inferred from its labels nearly as HF's ``run_glue.py`` infers it (whole-valued floats such as 1.0
are classes here, a regression there). An entry holds everything a model of
it needs to predict, so a run's config.json keeps its user tasks' entries (``Task.to_dict``) and loads without
their files, and its GLUE tasks' too, so that a later package cannot change what it predicts.

A run resolves its tasks once (``Tasks``: the package's entries and its config's own, ``TrainConfig.entries``) and
hands them down to data, model, training, evaluation and ensembling; nothing declares a task process-wide, so a
config, a saved run or an ensemble of runs changes no global state.

Usage:
    task = get_task("sst")                     # the package's entry; get_task(task) gives an entry back
    tasks = Tasks([mine]); tasks["mine"]       # a run's: cfg.entries["mine"]
    task.kind.loss(logits, labels)             # the head's loss; task.kind.predict(logits), ...
    examples, report = task.read("dev", "data", limit=None)
    task.label_name(2)                         # the user's label of class 2 ("neutral"), "2" for SST

The model's heads: every model has the CS224N project's three (``MULTITASK``), so that each run of the
default project has one checkpoint layout whatever ``--tasks`` trains, and a head for every other task of
its run (``model_tasks``).
"""

from __future__ import annotations

import abc
import json
import logging
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tasks.data.datasets import PairDataset, SentenceDataset
from tasks.data.readers import (COURSE_FORMAT, Column, Example, FileFormat, ReadReport, blank, class_label,
                                log_report, read_examples)

logger = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")

STREAMS = ("nli", "phrases")  # the names of the training streams that are no task (tasks/model.py)


# ---- kinds ---------------------------------------------------------------------------------------------------


class Kind(abc.ABC):
    """What differs between kinds of task: each kind implements every abstract method (a kind that forgets one
    cannot be built), and the code outside this module asks its task's kind what to do, never what kind it is.
    Methods take the task where its entry matters (its classes, its scale)."""

    # What an entry's checks here read (its classes or scale); the modules that use a task call its kind's methods
    # instead (what some still read, and why: tests/test_task.py's KIND_QUESTIONS).
    classification: bool = True  # labels are classes; else scores
    binary: bool = False  # two classes scored by one logit (sigmoid); else C logits (softmax), or a score
    label_dtype: torch.dtype = torch.long  # of the label tensors of its datasets
    metrics: tuple[str, ...] = ()  # what it can be scored by (tasks/evaluation/metrics.py)
    # What an objective's message says a task of this kind is, beside its name (tasks/objectives: ``kind_rule``).
    about: str = ""

    def __init__(self, name: str, pair: bool) -> None:
        self.name = name
        self.pair = pair  # examples are two texts (a PairDataset); else one (a SentenceDataset)

    def __repr__(self) -> str:
        return f"<kind {self.name}{' (one logit)' if self.binary else ''}>"

    # A kind is what its class, name and texts are: a copy (a deep-copied config's) is the same kind.
    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and (other.name, other.pair) == (self.name, self.pair)

    def __hash__(self) -> int:
        return hash((type(self), self.name, self.pair))

    @abc.abstractmethod
    def default_metrics(self, task: Task) -> tuple[str, ...]:
        """A user's task's metrics when its file names none, the main one first."""

    # -- data --
    def dataset(self, examples: Sequence[Example], tokenizer: Any, max_length: int, pair_encoding: str
                ) -> SentenceDataset | PairDataset:
        """The tokenized dataset its examples are read into: a SentenceDataset (one text), or a PairDataset in the
        model's ``pair_encoding``; labels as its loss reads them (``label_dtype``: class ids, or float targets)."""
        if not self.pair:
            return SentenceDataset(examples, tokenizer, max_length=max_length, label_dtype=self.label_dtype)
        return PairDataset(examples, tokenizer, mode=pair_encoding, max_length=max_length,
                           label_dtype=self.label_dtype)

    def examples(self, task: Task, inputs: Sequence[str] | Sequence[tuple[str, str]]) -> list[Example]:
        """The Predictor's ``inputs`` as examples with ids "0".."N-1": sentences, or (a, b) pairs for a pair task; a
        ValueError naming the first input that is not one."""
        if self.pair:
            bad = next((i for i, x in enumerate(inputs) if isinstance(x, str) or len(x) != 2), None)
            if bad is not None:
                raise ValueError(f"{task.name} reads sentence pairs: input {bad} is {inputs[bad]!r}, not (a, b)")
            return [Example(str(i), a, b) for i, (a, b) in enumerate(inputs)]
        bad = next((i for i, x in enumerate(inputs) if not isinstance(x, str)), None)
        if bad is not None:
            raise ValueError(f"{task.name} reads one sentence each: input {bad} is {inputs[bad]!r}")
        return [Example(str(i), t) for i, t in enumerate(inputs)]

    def line_texts(self, task: Task, line: str, where: str) -> tuple[str] | tuple[str, str]:
        """The texts of one line of the predict command's input (tasks/predict.py): a sentence, or a pair's two
        sentences separated by one tab; a ValueError naming ``where`` (its file and line) for any other line."""
        if not self.pair:
            if "\t" in line:
                raise ValueError(f"{where} holds a tab: task {task.name} reads one sentence a line; two "
                                 "tab-separated sentences are a pair task's input (para, sts)")
            return (line.strip(),)
        parts = line.split("\t")
        if len(parts) != 2:
            tabs = len(parts) - 1
            raise ValueError(f"{where}: expected two sentences separated by one tab (task {task.name}), found "
                             + ("no tab" if not tabs else f"{tabs} tabs"))
        empty = next((which for which, x in zip(("first", "second"), parts) if blank(x)), None)
        if empty is not None:
            raise ValueError(f"{where}: the {empty} sentence of the pair is empty; task {task.name} reads two "
                             "sentences separated by one tab a line")
        return parts[0].strip(), parts[1].strip()

    def file_label(self, label: int | float) -> int | float:
        """A label as a data file of this kind writes it (tasks/perturb.py): as it is read."""
        return label

    # -- model --
    def head(self, task: Task, config: Any, hidden: int) -> Head:
        """The head it builds for ``task`` in a model of ``config`` (a tasks.model.ModelConfig: arch, pair encoding,
        sizes) over an encoder of width ``hidden``: one sequence for one text, or a pair read as one ("cross");
        else how it scores a pair whose sentences are encoded alone (``siamese_head``)."""
        if not self.pair or config.pair_encoding == "cross":
            return OneSequence(task, config, hidden)
        return self.siamese_head(task, config, hidden)

    @abc.abstractmethod
    def siamese_head(self, task: Task, config: Any, hidden: int) -> Head:
        """How a Siamese model (each sentence encoded alone) scores a pair of this kind, for ``config``'s arch."""

    @abc.abstractmethod
    def out_features(self, task: Task) -> int:
        """The head's last layer's width."""

    def span(self, task: Task, config: Any) -> float | None:
        """A regression head's high - low (``scaled``) under a model's ``config``; None for a kind without a scale."""
        return None

    @abc.abstractmethod
    def head_output(self, task: Task, z: torch.Tensor, span: float | None) -> torch.Tensor:
        """The logits from a head's last layer's output ``z`` (B, out_features): one sequence's, or a Siamese
        pair's classifier's; ``span``: the head's (``span``)."""

    @abc.abstractmethod
    def loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """The head's training loss on its logits (computed in float32)."""

    @abc.abstractmethod
    def predict(self, logits: torch.Tensor) -> torch.Tensor:
        """A model's predictions from its logits: class ids (long) or scores (float32)."""

    def both_orders(self, forward: torch.Tensor, reverse: torch.Tensor) -> torch.Tensor:
        """The logits of pairs scored in both orders (a task whose pairs have no order, ``Task.symmetric``), from
        its logits for (a, b) and for (b, a): their mean, in float32."""
        return (forward.float() + reverse.float()) / 2

    # -- scores --
    def one_class(self, preds: torch.Tensor, labels: torch.Tensor) -> int | None:
        """The class every prediction is while the labels hold several (a classifier collapsed to a constant: MCC
        0, F1 0 or undefined); None otherwise, and for a kind whose predictions are no classes."""
        return None

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

    # -- ensembles --
    @abc.abstractmethod
    def contributions(self, x: torch.Tensor) -> torch.Tensor:
        """Per-model quantities (M, N[, C]) whose mean decides the simple average's prediction."""

    @abc.abstractmethod
    def average(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The simple ensemble of models' logits ``x`` (M, N[, C]), float64: (its logits, its predictions)."""

    # the regression ensembler (tasks.evaluation.ensembling.fit_regression): logits Σ_m w_m x_m (+ b), fit by
    # ``fit`` (a classification: ``fit_loss`` by L-BFGS; a regression: least squares in closed form)
    fit_bias: bool = False
    fit_objective: str = "least squares"
    fit_unasked: bool = True  # the regression ensembler fits it unless told otherwise (a score's: only when asked)

    @abc.abstractmethod
    def combine(self, w: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Σ_m w_m x_m (+ b): the regression ensembler's logits."""

    @abc.abstractmethod
    def fit_loss(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The regression ensembler's data term on float64 logits ``z`` and labels ``y`` (a regression's, the squared
        error, is minimised in closed form by least squares)."""

    def fit(self, x: torch.Tensor, y: torch.Tensor, l2: float, max_iter: int) -> tuple[list[float], float | None]:
        """The regression ensembler's weights and bias (None: it has none) on models' float64 logits ``x``
        (M, N[, C]) and labels ``y``: ``fit_loss`` of ``combine`` plus ``l2`` · Σ w_m², minimised by L-BFGS (strong
        Wolfe line search) from w = 1/M, so that a useless model's weight goes to 0 rather than wandering."""
        n_models = x.shape[0]
        w = torch.full((n_models,), 1.0 / n_models, dtype=torch.float64, requires_grad=True)
        b = torch.zeros((), dtype=torch.float64, requires_grad=self.fit_bias)
        params = [w, b] if self.fit_bias else [w]
        opt = torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, tolerance_grad=1e-10, tolerance_change=1e-12,
                                history_size=20, line_search_fn="strong_wolfe")

        def objective() -> torch.Tensor:
            return self.fit_loss(self.combine(w, x, b), y) + l2 * (w * w).sum()

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = objective()
            loss.backward()
            return loss

        opt.step(closure)
        return w.detach().tolist(), float(b.detach()) if self.fit_bias else None

    # -- the Predictor and the predict command --
    @abc.abstractmethod
    def outputs(self, task: Task, logits: torch.Tensor) -> torch.Tensor:
        """What a user reads beside a prediction: class probabilities (N, C), P(its positive class) (N,) for one
        logit, or the score."""

    @abc.abstractmethod
    def answers(self, task: Task, preds: torch.Tensor, logits: torch.Tensor
                ) -> tuple[list[str], torch.Tensor] | torch.Tensor:
        """What the Predictor's ``predict`` gives for predictions ``preds`` and their ``logits``: a classification's
        (labels in the task's own words, ``outputs``), a regression's scores."""

    @abc.abstractmethod
    def row_columns(self, task: Task) -> list[str]:
        """The predict command's columns after ``id``: the label and its probabilities (a one-logit task's: of its
        positive class), or the score."""

    @abc.abstractmethod
    def row(self, task: Task, pred: torch.Tensor, output: torch.Tensor) -> list:
        """One example's values of ``row_columns``: the prediction in the user's label, then its outputs."""


class Classification(Kind):
    """What the kinds whose predictions are classes share: their metrics and scoring, their answers in the task's
    own labels."""

    metrics = ("acc", "f1", "macro_f1", "mcc")

    def one_class(self, preds, labels):
        classes = preds.long().unique()
        if len(classes) > 1 or len(labels.long().unique()) < 2:
            return None
        return int(classes[0])

    def answers(self, task, preds, logits):
        return [task.label_name(int(k)) for k in preds], self.outputs(task, logits)


class Classes(Classification):
    """C classes: C logits, softmax cross-entropy, argmax. A Siamese pair: Sentence-BERT's classifier on the
    sentences' projections (the baseline), or b1's products of their features."""

    about = "classes scored by C logits"

    def default_metrics(self, task):
        return ("acc", "f1", "mcc") if task.num_classes == 2 else ("acc", "macro_f1", "mcc")

    def siamese_head(self, task, config, hidden):
        return (PairClassifier if config.arch == "baseline" else Products)(task, config, hidden)

    def out_features(self, task):
        return task.num_classes

    def head_output(self, task, z, span):
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

    def outputs(self, task, logits):
        return torch.softmax(logits, dim=-1)

    def row_columns(self, task):
        return ["label"] + [task.probability_column(k) for k in range(task.num_classes)]

    def row(self, task, pred, output):
        return [task.label_name(int(pred)), *map(float, output)]


class Binary(Classification):
    """Two classes scored by one logit (Quora's head): sigmoid binary cross-entropy, prediction logit > 0. A
    Siamese pair: the dot product of the sentences' projections plus a learned offset (the baseline), or b1's
    products of their features."""

    binary = True
    label_dtype = torch.float32  # BCE's targets
    about = "two classes scored by one logit"

    def default_metrics(self, task):
        return ("acc", "f1", "mcc")

    def siamese_head(self, task, config, hidden):
        return (DotProduct if config.arch == "baseline" else Products)(task, config, hidden)

    def file_label(self, label):
        return float(label)  # 0.0 / 1.0, as Quora's files write them

    def out_features(self, task):
        return 1

    def head_output(self, task, z, span):
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

    def outputs(self, task, logits):
        p = torch.sigmoid(logits)  # P(class 1)
        return p if task.positive_class == 1 else 1.0 - p

    def row_columns(self, task):
        return ["label", task.probability_column(task.positive_class)]

    def row(self, task, pred, output):
        return [task.label_name(int(pred)), float(output)]


class Scores(Kind):
    """A score on the task's scale [low, high]: the head's low + span x sigmoid (a Siamese pair's: low + span x
    cosine of the sentences' embeddings), MSE; scored by correlations, which count as (c + 1) / 2 in the overall
    score."""

    classification = False
    label_dtype = torch.float32
    metrics = ("r", "spearman")
    about = "a score on a scale"
    fit_unasked = False  # the paper fit no regression ensembler for scores (STS)
    fit_bias = True  # ``fit``: least squares on [scores, 1]

    def default_metrics(self, task):
        return ("r", "spearman")

    def siamese_head(self, task, config, hidden):
        return Cosine(task, config, hidden)

    def out_features(self, task):
        return 1

    def span(self, task, config):
        """The ModelConfig's span of the task (``spans``: STS's --sts-scale, the paper's 5 x), else its range's
        high - low."""
        low, high = task.score_range
        return config.spans.get(task.name, high - low)

    def scaled(self, task: Task, unit: torch.Tensor, span: float) -> torch.Tensor:
        """low + span x ``unit`` (a sigmoid in [0, 1], or a cosine)."""
        out = span * unit
        low = task.score_range[0]
        return out + low if low else out  # a scale from 0 (STS's) adds nothing, not even to the sign of a zero

    def head_output(self, task, z, span):
        return self.scaled(task, torch.sigmoid(z.squeeze(-1)), span)  # (B,)

    def loss(self, logits, labels, reduction="mean"):
        return F.mse_loss(logits.float(), labels.float(), reduction=reduction)

    def predict(self, logits):
        return logits

    def logit_columns(self, task):
        return ["score"]

    def contributions(self, x):
        return x

    def average(self, x):
        mean = x.mean(0)  # (N,)
        return mean, mean

    def combine(self, w, x, b):
        return torch.einsum("m,mn->n", w, x) + b

    def fit_loss(self, z, y):
        return F.mse_loss(z, y)

    def fit(self, x, y, l2, max_iter):
        """Least squares of the labels on [scores, 1], in closed form (``l2`` and ``max_iter`` unused)."""
        n = x.shape[1]
        design = torch.cat([x.T, torch.ones(n, 1, dtype=torch.float64)], dim=1)  # (N, M + 1)
        sol = torch.linalg.lstsq(design, y.unsqueeze(1)).solution.squeeze(1)  # (M + 1,)
        return sol[:-1].tolist(), float(sol[-1])

    def outputs(self, task, logits):
        return logits

    def answers(self, task, preds, logits):
        return preds

    def row_columns(self, task):
        return ["score"]

    def row(self, task, pred, output):
        return [float(pred)]


# ---- heads: what a kind builds in a model (tasks/model.py's MultitaskBert) -------------------------------------


def mlp(sizes: list[int], dropout: float) -> nn.Sequential:
    """Linear layers with ReLU between them (none after the last), dropout before each linear."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Head(abc.ABC):
    """A task's head in a model, as its kind builds it (``Kind.head``) for the model's arch and pair encoding.

    ``parts`` makes its modules (and parameters), which the model registers as ``<task>_<part>`` in the order
    given: HF-style names its checkpoints keep, and the order their initial weights are drawn in. ``score`` turns
    the pooled embeddings (B, H) of the batch's ``sides`` (the batch-key suffixes it reads: "" for one sequence,
    "_1" and "_2" for a Siamese pair) into its logits and its ``features`` (what objectives read beside the
    pooled embeddings). ``model`` gives its parts (``model.part(task, name)``) and the arch's features of a pooled
    embedding (``model.sentence_features(task, e)``: b1's [shared, own], the baseline's the embedding itself). A
    head holds sizes only, never a module: the model's are moved, copied and loaded with it. Its sizes and ``span``
    are read from the ModelConfig once, when the model is built (a model's config does not change after).
    """

    sides: tuple[str, ...] = ("_1", "_2")
    features: tuple[str, ...] = ("head_input",)

    def __init__(self, task: Task, config: Any, hidden: int) -> None:
        self.arch = config.arch
        self.hidden, self.fcn, self.proj = hidden, config.fcn_size, config.baseline_proj_size  # H, F, P
        self.dropout = config.head_dropout
        self.width = task.kind.out_features(task)
        self.span = task.kind.span(task, config)

    @abc.abstractmethod
    def parts(self) -> dict[str, nn.Module | nn.Parameter]:
        """Its modules and parameters by part name, new (their construction draws from the global RNG)."""

    @abc.abstractmethod
    def score(self, model: Any, task: Task, pooled: list[torch.Tensor]
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(logits, features) from the pooled embeddings of its ``sides``, in float32."""

    def embeddings(self, model: Any, task: Task, e: torch.Tensor) -> torch.Tensor:
        """The embeddings (B, D) of pooled sentences ``e`` whose cosine scores a pair (MNR reads them)."""
        raise ValueError(f"{task.name}: its head scores no cosine of sentence embeddings")


class OneSequence(Head):
    """One sequence (a sentence, or a pair read as one: [CLS] a [SEP] b [SEP]) through the arch's features to the
    kind's last layer: the baseline's dropout + linear on the pooled embedding (the SST head, §4.1), b1's ReLU
    MLP on [shared, own] (§4.3)."""

    sides = ("",)

    def parts(self):
        sizes = [self.hidden, self.width] if self.arch == "baseline" else [2 * self.fcn, self.fcn, self.width]
        return {"head": mlp(sizes, self.dropout)}

    def score(self, model, task, pooled):
        x = model.sentence_features(task.name, pooled[0])
        return task.kind.head_output(task, model.part(task.name, "head")(x), self.span), {"head_input": x}


class DotProduct(Head):
    """The baseline's Siamese paraphrase head (§4.1): each sentence projected (linear, P), the dot product of the
    projections plus a learned offset (``bias``: at 0 the threshold is where any two similar sentences start out;
    MultitaskBert.init_offset says why it starts from data), one logit."""

    features = ()

    def parts(self):
        return {"head": mlp([self.hidden, self.proj], self.dropout), "bias": nn.Parameter(torch.zeros(()))}

    def score(self, model, task, pooled):
        head = model.part(task.name, "head")
        u, v = head(pooled[0]), head(pooled[1])  # (B, P)
        return (u * v).sum(-1) + model.part(task.name, "bias"), {}


class PairClassifier(Head):
    """The baseline's Siamese pair head of C classes: each sentence projected (linear, P), then Sentence-BERT's
    classifier on (u, v, |u - v|) (Reimers & Gurevych 2019, §3)."""

    def parts(self):
        return {"head": mlp([self.hidden, self.proj], self.dropout),
                "classifier": mlp([3 * self.proj, self.width], self.dropout)}

    def score(self, model, task, pooled):
        head = model.part(task.name, "head")
        u, v = head(pooled[0]), head(pooled[1])  # (B, P)
        x = torch.cat([u, v, (u - v).abs()], dim=-1)  # (B, 3P)
        return task.kind.head_output(task, model.part(task.name, "classifier")(x), self.span), {"head_input": x}


class Products(Head):
    """b1's Siamese pair classification (the paper's structural change, §4.3): the element-wise products of the
    sentences' [shared, own] features beside both raw pooled embeddings, through a ReLU MLP."""

    def parts(self):
        return {"head": mlp([2 * self.fcn + 2 * self.hidden, self.fcn, self.width], self.dropout)}

    def score(self, model, task, pooled):
        e1, e2 = pooled
        f1, f2 = model.sentence_features(task.name, e1), model.sentence_features(task.name, e2)  # (B, 2F)
        x = torch.cat([f1 * f2, e1, e2], dim=-1)  # (B, 2F + 2H)
        return task.kind.head_output(task, model.part(task.name, "head")(x), self.span), {"head_input": x}


class Cosine(Head):
    """A Siamese pair's score: low + span x the cosine of the sentences' embeddings (the STS head, §4.1): the
    baseline's projections (linear, P), b1's [shared, own] features."""

    features = ("cos_1", "cos_2")

    def parts(self):
        return {"head": mlp([self.hidden, self.proj], self.dropout) if self.arch == "baseline" else nn.Identity()}

    def embeddings(self, model, task, e):
        return model.part(task.name, "head")(model.sentence_features(task.name, e))

    def score(self, model, task, pooled):
        u, v = (self.embeddings(model, task, e) for e in pooled)
        return task.kind.scaled(task, F.cosine_similarity(u, v, dim=-1), self.span), {"cos_1": u, "cos_2": v}


# The kinds by the name a task file gives; a pair classification of two classes is scored by one logit, as
# Quora's head is (``kind_for``).
KINDS: dict[str, Kind] = {k.name: k for k in (
    Classes("sentence-classification", pair=False), Classes("pair-classification", pair=True),
    Scores("sentence-regression", pair=False), Scores("pair-regression", pair=True))}
PAIR_BINARY = Binary("pair-classification", pair=True)


def kind_for(name: str, num_classes: int | None = None) -> Kind:
    """The kind a task of kind ``name`` and ``num_classes`` classes has: KINDS[name], or PAIR_BINARY for a pair
    classification of two classes (one logit, the paraphrase head's)."""
    if name not in KINDS:
        raise ValueError(f"kind {name!r}; kinds are {', '.join(KINDS)}")
    return PAIR_BINARY if name == "pair-classification" and num_classes == 2 else KINDS[name]


# ---- entries -------------------------------------------------------------------------------------------------

NAME_LENGTH = 40  # a task's name is in its files' names ({name}-{split}-output.csv) and its flags' values

LABEL_CASES = ("exact", "fold")  # a task's labels matched as written, or in any case ("label_case")

LISTED = 10  # a message names this many classes at most: 300 word labels make no readable line


def listed(names: Sequence[Any], at_most: int = LISTED) -> str:
    """``names`` for a message: "a, b, c", the first ``at_most`` of more then "... and N more"."""
    shown = ", ".join(map(str, names[:at_most]))
    return shown + (f" ... and {len(names) - at_most} more" if len(names) > at_most else "")


@dataclass(frozen=True)
class Layout:
    """Where a file holds what a task reads: its text column(s), label and id columns (header names, or 0-based
    positions; id None: ids are the rows' file lines), and how it is split (``FileFormat``)."""

    text: tuple[Column, ...]
    label: Column | None
    id: Column | None = "id"
    fmt: FileFormat = COURSE_FORMAT

    def to_dict(self) -> dict[str, Any]:
        return {"text": list(self.text), "label": self.label, "id": self.id, "delimiter": self.fmt.delimiter,
                "quoting": self.fmt.quoting, "header": self.fmt.header, "line_ends": self.fmt.line_ends,
                "multiline": self.fmt.multiline}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Layout:
        return cls(tuple(d["text"]), d["label"], d["id"], FileFormat(d["delimiter"], d["quoting"], d["header"],
                                                                       d["line_ends"], d["multiline"]))


@dataclass(frozen=True)
class ExtraStream:
    """An extra labelled stream a task declares, trained through its head beside its own examples (SST's treebank
    phrases): its stream's name, its file (a name in --data-dir, or a path; read as the task's training file),
    the fewest words an example may have, where its batches go in an epoch ("mixed" among the others, or
    "first"), and how many an epoch in batches of how many (None: all of them, in batches of --batch-size). A run
    sets each where it names the stream: its file, fewest words and order (--stream-files, --stream-min-words,
    --stream-orders), its count, batch and loss weight as every stream's (--max-train-examples, --task-batch-size,
    --loss-weights); SST's phrases' flags --sst-phrases* are those settings' spellings."""

    name: str
    file: str | None
    min_words: int = 1
    order: str = "mixed"
    per_epoch: int | None = None
    batch_size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "file": self.file, "min_words": self.min_words, "order": self.order,
                "per_epoch": self.per_epoch, "batch_size": self.batch_size}


PRIOR_KINDS = {"probe": "sentence-classification", "cosine": "pair-regression"}  # a prior's kind -> its task's


@dataclass(frozen=True)
class Prior:
    """A second opinion a task declares, blended into its predictions at evaluation (tasks/evaluation/priors.py):
    a "probe" (a sentence classification's: a linear probe on a frozen sentence encoder's embeddings of its
    training sentences, mixed into its class probabilities) or a "cosine" (a pair regression's: the encoder's
    cosine on the task's scale, mixed into its scores), with its weight (0: off) and the encoder (None: the
    embedded all-MiniLM-L6-v2). A run's ``prior_weights`` and ``prior_models`` set them instead where they name
    its task (tasks/train_config.py: --sst-prior W is sst's weight)."""

    kind: str
    weight: float = 0.5
    model: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "weight": self.weight, "model": self.model}


PART1 = ("", "also", "run")  # Output.part1: never; also under the part-1 names; and a run with the task writes them


@dataclass(frozen=True)
class Output:
    """How a task's prediction files (``{name}-{split}-output.csv``) are written and read back: the prediction's
    ``column``; ``starter``: in the CS224N starter's bytes (``id \t <column> \n``, then ``<id> , <value> \n``
    with class ids), else a plain CSV of each id and the user's label; ``also_read``: another spelling of the
    column a reader takes (the starter writes STS's misspelt: Predicted_Similiary); ``submission``: its files go
    into the submission zip; ``part1``: the minBERT starter's part 1 (``classifier.py``) also writes them as
    ``{finetune|pretrain}-{name}-{split}-out.csv`` ("also": on a run that writes those names, "run": and a run
    with this task writes them for each such task of it, as the part-1 task alone, CFIMDB, does)."""

    column: str
    starter: bool = False
    also_read: str = ""
    submission: bool = False
    part1: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column.strip() or self.part1 not in PART1:
            raise ValueError(f"an output is a column name and part1 one of {', '.join(map(json.dumps, PART1))}, got "
                             f"{self}")

    def to_dict(self) -> dict[str, Any]:
        return {"column": self.column, "starter": self.starter, "also_read": self.also_read,
                "submission": self.submission, "part1": self.part1}


@dataclass(frozen=True)
class Task:
    """One task: its name, kind, files (by split: a name in the data directory, or a path), where they hold its
    columns, and its classes (names by class id) or its scale.

    ``layout``: the columns and format of its files, ``split_layouts`` a split's own where it differs (CoLA's
    test file has a header, its train file none). ``classes``: a classification's labels as its files write
    them, by class id (SST: "0".."4"; RTE: "entailment", "not_entailment"). ``score_range``: a regression's
    (low, high), its head's range; ``checks_range``: labels outside it are refused (STS's 0-5), else taken as
    they are. ``metrics``: what it is scored by, the main one first (tasks/evaluation/metrics.py); default: its
    kind's. ``overall``: it counts in the default overall score (the CS224N tasks and CFIMDB, and a task file that
    says so; another task's metric selects only when asked, ``--best-metric``). A regression head's span is its
    range's width unless the run's ModelConfig ``spans`` name the task (STS: --sts-scale, the paper's 5 ×).

    How its predictions read: ``title`` (tables), ``output`` (``Output``: the files' column and format; default:
    a plain CSV of id and the user's label, ``label``, or ``score``). ``positive``: a two-class task's label of the
    class its F1 is scored on and whose probability the predict command's ``p_<label>`` column of a one-logit task
    gives (``positive_class``; default: the second class); ``label_case``: "exact", its labels are matched as
    written, or "fold", in any case (a task file's "label_case"); ``symmetric``: a pair task whose relation has no
    order (paraphrase, similarity: Quora's, STS's), scored as the mean of both orders under ``--symmetric-eval``; a
    pair task with an order (entailment: premise, then hypothesis) is scored in its files' order, as it trained.
    What some tasks have beside their own files, any task may declare: ``stream``, an extra labelled stream
    through its head (``ExtraStream``: SST's treebank phrases, ``--sst-phrases``); ``prior``, a second opinion at
    evaluation (``Prior``: SST's probe, ``--sst-prior``, and STS's cosine, ``--sts-prior``); ``triplets``, a file
    of NLI triplets (anchor, entailed, contradicted) that ``--nli`` streams through its head's sentence embeddings
    (STS's: the paper's AllNLI data, §4.2, trained by MNR).
    ``origin``: a user's task's file and the declaration it read there (tasks/task_file.py), or the package's file
    of a GLUE task; not part of what the task is.
    """

    name: str
    kind: Kind
    files: Mapping[str, str] = field(compare=False)  # where they are is not what the task is (a run may move)
    layout: Layout
    classes: tuple[str, ...] | None = None
    score_range: tuple[float, float] | None = None
    checks_range: bool = False
    metrics: tuple[str, ...] = ()
    split_layouts: Mapping[str, Layout] = field(default_factory=dict)
    title: str = ""
    output: Output | None = None
    positive: str = ""
    label_case: str = "exact"
    symmetric: bool = False
    overall: bool = False
    stream: ExtraStream | None = None
    prior: Prior | None = None
    triplets: str | None = None
    origin: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        where = f"task {self.name!r}"
        if not isinstance(self.name, str) or not self.name.isidentifier() or len(self.name) > NAME_LENGTH \
                or self.name in STREAMS:
            raise ValueError(f"task name {self.name!r}: use up to {NAME_LENGTH} letters, digits and _, not starting "
                             f"with a digit (not {' or '.join(STREAMS)}, the streams' names)")
        for split, layout in {"": self.layout, **self.split_layouts}.items():
            if len(layout.text) != (2 if self.kind.pair else 1):
                raise ValueError(f"{where}: a {self.kind.name} task reads {2 if self.kind.pair else 1} text "
                                 f"column(s), got {list(layout.text)}" + (f" in its {split} file" if split else ""))
        if self.label_case not in LABEL_CASES:
            raise ValueError(f"{where}: 'label_case' is {' or '.join(map(json.dumps, LABEL_CASES))}, got "
                             f"{json.dumps(self.label_case)}")
        if self.kind.classification:
            if self.classes is None or len(self.classes) < 2 or len(set(self.classes)) != len(self.classes):
                raise ValueError(f"{where}: a classification needs two or more distinct classes, got "
                                 f"{listed(self.classes or ())}")
            if self.kind.binary and len(self.classes) != 2:
                raise ValueError(f"{where}: a one-logit classification has two classes, got {len(self.classes)}")
            if self.label_case == "fold":
                first: dict[str, str] = {}
                for c in self.classes:
                    if first.setdefault(c.casefold(), c) != c:
                        raise ValueError(f"{where}: classes {first[c.casefold()]!r} and {c!r} are one class where "
                                         "\"label_case\" is \"fold\"")
        elif not (self.score_range is not None and self.score_range[0] < self.score_range[1]):
            raise ValueError(f"{where}: a regression needs a scale (low, high) with low < high, got "
                             f"{self.score_range}")
        if self.positive:
            if not self.kind.classification or len(self.classes) != 2:
                raise ValueError(f"{where}: 'positive' is a two-class task's (the class F1 is scored on), and it "
                                 + (f"has {len(self.classes)} classes: {listed(self.classes)}"
                                    if self.kind.classification else f"is a {self.kind.name}"))
            k = self.class_of(self.positive)
            if k is None:
                raise ValueError(f"{where}: 'positive' {json.dumps(self.positive)} names no class; the classes are "
                                 f"{listed(self.classes)}")
            object.__setattr__(self, "positive", self.classes[k])  # as the class is written: "1" for 1.0
        if self.prior is not None and PRIOR_KINDS.get(self.prior.kind) != self.kind.name:
            raise ValueError(f"{where}: a prior is a probe of a sentence classification or a cosine of a pair "
                             f"regression, and the task is a {self.kind.name}")
        if self.stream is not None and (self.stream.name in ("nli", self.name) or self.stream.order not in
                                        ("mixed", "first") or self.stream.min_words < 1):
            raise ValueError(f"{where}: its stream {self.stream} needs a name of its own, min_words >= 1 and an "
                             "order of mixed or first")
        if self.symmetric and not self.kind.pair:
            raise ValueError(f"{where}: 'symmetric' is a pair task's (its pairs have no order); a "
                             f"{self.kind.name} has one text")
        if self.output is None:  # a plain CSV of each id and its prediction: the user's label, or the score
            object.__setattr__(self, "output", Output("label" if self.kind.classification else "score"))
        if self.triplets is not None and not (isinstance(self.kind, Scores) and self.kind.pair):
            raise ValueError(f"{where}: NLI triplets train the sentence embeddings whose cosine a pair regression "
                             f"scores, and the task is a {self.kind.name}")
        if not self.metrics:
            object.__setattr__(self, "metrics", self.kind.default_metrics(self))
        bad = [m for m in self.metrics if m not in self.kind.metrics or (m == "f1" and self.num_classes != 2)]
        if bad:
            can = [m for m in self.kind.metrics if m != "f1" or self.num_classes == 2]
            of = f" of {self.num_classes} classes" if self.classes else ""
            raise ValueError(f"{where}: a {self.kind.name} task{of} is not scored by {bad[0]!r}; its metrics are "
                             f"{', '.join(can)}")

    @property
    def text_columns(self) -> tuple[Column, ...]:
        return self.layout.text

    @property
    def num_classes(self) -> int | None:
        """How many classes its predictions range over (None: scores)."""
        return len(self.classes) if self.classes is not None else None

    @property
    def metric(self) -> str:
        """Its main metric's name in a run's records: sst_acc, para_acc, sts_r, ..."""
        return f"{self.name}_{self.metrics[0]}"

    @property
    def metric_keys(self) -> tuple[str, ...]:
        """Every metric's name in a run's records, the main one first."""
        return tuple(f"{self.name}_{m}" for m in self.metrics)

    @property
    def table_title(self) -> str:
        """Its column in tables: "SST acc", "STS r"."""
        return f"{self.title or self.name} {self.metrics[0]}"

    def label_name(self, class_id: int) -> str:
        """The label its files write for class ``class_id``."""
        return self.classes[class_id]

    def probability_column(self, class_id: int) -> str:
        """The predict command's column of P(class): p0..p4 for classes named by their ids (SST), else p_<label>."""
        name = self.label_name(class_id)
        return f"p{name}" if name == str(class_id) else f"p_{name}"

    @property
    def positive_class(self) -> int | None:
        """The class a two-class task's F1 is scored on and a one-logit task's probability column gives: its
        ``positive``, else the second class (class 1); None for other tasks."""
        if not self.kind.classification or len(self.classes) != 2:
            return None
        return self.class_of(self.positive) if self.positive else 1

    def class_of(self, raw: str) -> int | None:
        """The class whose label ``raw`` is, matched as its files' labels are: without the space around it, as
        written or, a whole number, as written otherwise (1.0 for 1), in any case where ``label_case`` is "fold";
        None where it is no class."""
        key = str.casefold if self.label_case == "fold" else str
        index = {key(c): k for k, c in enumerate(self.classes)}
        raw = raw.strip()
        whole = canonical_number(raw)
        for form in (raw, whole) if whole is not None else (raw,):
            if key(form) in index:
                return index[key(form)]
        return None

    @property
    def ids_are_labels(self) -> bool:
        """Its classes are named 0, 1, ..., C - 1 in its files (the course's tasks)."""
        return self.classes == tuple(str(k) for k in range(len(self.classes or ())))

    def parse_label(self, raw: str, problems: list[str]) -> int | float | None:
        """A label cell as this task reads it: a class id (``class_of``: its label among ``classes``), or a score;
        else None with the reason appended to ``problems``."""
        raw = raw.strip()
        if self.kind.classification:
            if self.ids_are_labels:
                return class_label(raw, len(self.classes), problems)
            if not raw:
                problems.append("empty label")
                return None
            k = self.class_of(raw)
            if k is None:
                problems.append(f"label {raw!r} is not one of the classes {listed(self.classes)}")
            return k
        if not raw:
            problems.append("empty label")
            return None
        try:
            value = float(raw)
        except ValueError:
            problems.append(f"label {raw!r} is not a number")
            return None
        low, high = self.score_range
        if self.checks_range and not low <= value <= high:  # also refuses nan
            problems.append(f"label {raw!r} out of range [{low:g}, {high:g}]")
            return None
        if not math.isfinite(value):
            problems.append(f"label {raw!r} is not a finite number")
            return None
        return value

    def layout_of(self, split: str) -> Layout:
        """The columns and format of the split's file."""
        return self.split_layouts.get(split, self.layout)

    def path(self, split: str, data_dir: str | os.PathLike[str]) -> Path | None:
        """The file of ``split`` (a name in ``data_dir``, or a user's path), None where the task has none."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
        return Path(data_dir) / self.files[split] if split in self.files else None

    @property
    def about(self) -> str | None:
        """What a reader says of this task's files: a user's task file names them, or GLUE's task file of this
        package (its files under --data-dir, as GLUE's download script writes them); None: the course's files."""
        if self.origin.get("file"):
            return f"task file {self.origin['file']} names it"
        if self.origin.get("package"):
            return (f"GLUE's {self.name} task reads it ({self.origin['package']}), under --data-dir as GLUE's download "
                    "script writes it; data/README.md names the files")
        return None

    def read(self, split: str, data_dir: str | os.PathLike[str], limit: int | None = None, *,
             path: str | os.PathLike[str] | None = None) -> tuple[list[Example], ReadReport]:
        """The examples of one split's file (``path`` instead of the entry's file), and its ReadReport; a test
        file is read unlabelled."""
        layout = self.layout_of(split)
        labeled = split != "test"
        return read_examples(path if path is not None else self.path(split, data_dir), layout.text,
                             layout.label if labeled else None, self.parse_label if labeled else None,
                             id_column=layout.id, fmt=layout.fmt, limit=limit, about=self.about)

    def describe(self) -> str:
        """One line of what the task is: its kind, classes or scale, and metrics (F1: of which class)."""
        if self.kind.classification:
            what = f"{self.num_classes} classes ({listed(self.classes)})" + (
                ", one logit" if self.kind.binary else "")
        else:
            what = f"a score in [{self.score_range[0]:g}, {self.score_range[1]:g}]"
        f1 = f"; F1 of {self.label_name(self.positive_class)!r}" if "f1" in self.metrics else ""
        return (f"{self.name}: {self.kind.name}, {what}; metrics {', '.join(self.metrics)} ({self.metrics[0]} the "
                f"main){f1}")

    # -- a task as plain JSON (a run's config.json keeps its user and GLUE tasks: tasks/train_config.py) --
    def to_dict(self) -> dict[str, Any]:
        """What the task is, as plain JSON at ENTRY_FORMAT: everything a model of it needs to predict, its files and
        where it was declared (``from_dict`` reads it back, and every earlier format: ``upgrade_entry``)."""
        return {"format": ENTRY_FORMAT, "name": self.name, "kind": self.kind.name,
                "classes": list(self.classes) if self.classes else None,
                "score_range": list(self.score_range) if self.score_range else None,
                "checks_range": self.checks_range, "metrics": list(self.metrics), "files": dict(self.files),
                "layout": self.layout.to_dict(),
                "split_layouts": {s: lay.to_dict() for s, lay in self.split_layouts.items()},
                "title": self.title, "output": self.output.to_dict(), "overall": self.overall,
                "positive": self.positive, "label_case": self.label_case, "symmetric": self.symmetric,
                "stream": self.stream.to_dict() if self.stream else None,
                "prior": self.prior.to_dict() if self.prior else None, "triplets": self.triplets,
                "origin": dict(self.origin)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Task:
        """Inverse of ``to_dict``, of an entry at any format (``upgrade_entry``); a ValueError naming what is wrong
        with ``d``."""
        d = upgrade_entry(d)
        classes = tuple(d["classes"]) if d["classes"] is not None else None
        return cls(d["name"], kind_for(d["kind"], len(classes) if classes else None), dict(d["files"]),
                   Layout.from_dict(d["layout"]), classes=classes,
                   score_range=tuple(d["score_range"]) if d["score_range"] is not None else None,
                   checks_range=d["checks_range"], metrics=tuple(d["metrics"]),
                   split_layouts={s: Layout.from_dict(v) for s, v in d["split_layouts"].items()},
                   title=d["title"], output=Output(**d["output"]), overall=d["overall"], positive=d["positive"],
                   label_case=d["label_case"], symmetric=d["symmetric"],
                   stream=ExtraStream(**d["stream"]) if d["stream"] else None,
                   prior=Prior(**d["prior"]) if d["prior"] else None, triplets=d["triplets"],
                   origin=dict(d["origin"]))


# ---- the entry's saved format: its versions and the migration from each to the next ------------------------------

# An entry's keys at each format (``Task.to_dict``). Format 1, unnumbered: a run's config.json from config version
# 3 (a user's tasks) to 5 (tasks/config_versions.py migrates older runs' to it). Format 2: the predictions' file
# format declared as one object (``output``), a table title, ``overall``, and NLI triplets as the file a task
# declares. Format 3: no ``span_option`` and a prior without ``settings`` (a run's per-task settings set every
# task's span and prior alike: tasks/config_versions.py moves what they pointed to). Format 4: a stream without
# ``settings`` and with its own count an epoch and batch size (a run's per-stream settings set every stream's
# alike).
# tests/saved_entries/ holds an entry saved at each.
ENTRY_KEYS: dict[int, tuple[str, ...]] = {
    1: ("name", "kind", "classes", "score_range", "checks_range", "metrics", "files", "layout", "split_layouts",
        "output_column", "starter_format", "positive", "label_case", "symmetric", "span_option", "stream", "prior",
        "origin"),
    2: ("format", "name", "kind", "classes", "score_range", "checks_range", "metrics", "files", "layout",
        "split_layouts", "title", "output", "overall", "positive", "label_case", "symmetric", "span_option",
        "stream", "prior", "triplets", "origin"),
}
ENTRY_KEYS[3] = tuple(k for k in ENTRY_KEYS[2] if k != "span_option")
ENTRY_KEYS[4] = ENTRY_KEYS[3]  # its "stream" without "settings", with "per_epoch" and "batch_size"
ENTRY_FORMAT = max(ENTRY_KEYS)


def _entry_1_to_2(d: dict[str, Any]) -> dict[str, Any]:
    """Its output column and starter flag as one ``output``; a title, ``overall`` and ``triplets`` it had none of
    (a format-1 entry is a user's or a GLUE task's: neither counted in the overall score nor took NLI)."""
    rest = {k: v for k, v in d.items() if k not in ("output_column", "starter_format")}
    return {"format": 2, **rest, "title": "", "overall": False, "triplets": None,
            "output": Output(d["output_column"], starter=d["starter_format"]).to_dict()}


def _entry_2_to_3(d: dict[str, Any]) -> dict[str, Any]:
    """Without ``span_option`` and its prior without ``settings``: where they pointed into a run's config, the run's
    per-task settings hold the value since (tasks/config_versions.py, ``per_task_settings``: a user's regression
    task saved at config version 2 took STS's --sts-scale)."""
    prior = d["prior"]
    return {**{k: v for k, v in d.items() if k != "span_option"}, "format": 3,
            "prior": {k: v for k, v in prior.items() if k != "settings"} if prior else prior}


def _entry_3_to_4(d: dict[str, Any]) -> dict[str, Any]:
    """Its stream without ``settings`` and with a count an epoch and a batch size of its own, none (all of it, in
    batches of --batch-size, as a user's stream trained): where ``settings`` pointed into a run's config (the SST
    entry's "sst_phrases", never a user's), the run's per-stream settings hold the value since
    (tasks/config_versions.py, ``per_stream_settings``)."""
    stream = d["stream"]
    return {**d, "format": 4, "stream": {**{k: v for k, v in stream.items() if k != "settings"}, "per_epoch": None,
                                         "batch_size": None} if stream else stream}


_MIGRATIONS = {1: _entry_1_to_2, 2: _entry_2_to_3, 3: _entry_3_to_4}  # format -> the step to the next


def upgrade_entry(d: Any) -> dict[str, Any]:
    """A saved entry at ENTRY_FORMAT: migrated from its own (unnumbered: 1) step by step; a ValueError naming what
    is wrong with it."""
    if not isinstance(d, Mapping):
        raise ValueError(f"a task entry is a JSON object, got {json.dumps(d)}")
    at = d.get("format", 1)
    if at not in ENTRY_KEYS:
        raise ValueError(f"task entry {d.get('name')!r}: format {json.dumps(at)} is not one this package reads "
                         f"(1 to {ENTRY_FORMAT}): a run saved by a newer package predicts with that package")
    wrong = sorted(set(d) ^ set(ENTRY_KEYS[at]))
    if wrong:
        raise ValueError(f"task entry {d.get('name')!r}: keys {wrong} are unknown or missing (format {at})")
    d = dict(d)
    for step in range(at, ENTRY_FORMAT):
        d = _MIGRATIONS[step](d)
    return d


def canonical_number(raw: str) -> str | None:
    """A whole number as its digits ("1.0" -> "1", "-2" -> "-2"); None for anything else."""
    try:
        value = float(raw)
    except ValueError:
        return None
    return str(int(value)) if math.isfinite(value) and value == int(value) else None


# ---- the registry --------------------------------------------------------------------------------------------

_REGISTRY: dict[str, Task] = {}  # the package's entries (tasks/cs224n/, tasks/glue/) by name, fixed at import


def _declared_by(task: Task) -> str:
    """Where ``task`` was declared, for a message: its task file, the package's file, or nothing known."""
    by, package = task.origin.get("file"), task.origin.get("package")
    if by or package:
        return f" (by {by})" if by else f" (by this package's {package})"
    return " (a task this package declares)" if _REGISTRY.get(task.name) is task else ""


def _difference(a: Task, b: Task) -> str:
    """What differs between two entries of one name, for the message (a long list cut to its first LISTED)."""
    def shown(value: Any) -> str:
        if isinstance(value, list) and len(value) > LISTED:
            return json.dumps(value[:LISTED])[:-1] + f", ... and {len(value) - LISTED} more]"
        return json.dumps(value)

    da, db = a.to_dict(), b.to_dict()
    keys = [k for k in da if k not in ("files", "origin") and da[k] != db[k]]
    return "; ".join(f"{k} {shown(da[k])} there, {shown(db[k])} here" for k in keys) or "other settings"


def get_task(task: str | Task) -> Task:
    """The entry this package declares of the task named ``task`` (an entry is given back as it is); a ValueError
    naming the package's tasks. A run's own tasks are its config's (TrainConfig.entries), never looked up here."""
    return PACKAGE[task]


class UnknownTask(KeyError, ValueError):
    """A name no entry has: a KeyError to a Mapping's protocol (``in`` on items, ``get``), a ValueError (one line
    naming the known tasks) to a command's user errors."""

    def __str__(self) -> str:
        return str(self.args[0])


class Tasks(Mapping[str, Task]):
    """A run's tasks resolved once, by name: every entry this package declares (the course's, GLUE's) and the run's
    own (a config's ``user_tasks``: its task files' tasks, a saved run's GLUE entries), in the package's place
    where one is the same task but for its files. A config builds it (``TrainConfig.entries``) and hands it down
    to data, model, training, evaluation and ensembling, which read a task's entry here, never from a global:
    building one changes nothing else, so two runs in one process may each declare a task of one name.

    ``tasks[name]`` is the entry (an entry given back as it is); an unknown name is an ``UnknownTask`` (a KeyError
    and a ValueError) naming the known ones. An entry of the run's under a name the package declares otherwise is
    a ValueError saying what differs (a run that kept its GLUE task as an older package declared it predicts with
    that package or not at all)."""

    def __init__(self, own: Iterable[Task] = ()) -> None:
        entries = dict(_REGISTRY)
        for task in own:
            old = entries.get(task.name)
            if old is not None and old != task:
                raise ValueError(f"task {task.name!r} is already declared otherwise{_declared_by(old)}: "
                                 f"{_difference(old, task)}"
                                 + ("; a run that kept it so predicts with the package that trained it"
                                    if old.origin.get("package") else ""))
            entries[task.name] = task
        self._entries = entries

    def __getitem__(self, task: str | Task) -> Task:
        if isinstance(task, Task):
            return task
        if task not in self._entries:
            raise UnknownTask(f"unknown task {task!r}; tasks are {list(self._entries)} (declare your own with "
                              "--task-file)")
        return self._entries[task]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str, default: Any = None) -> Any:
        return self._entries.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tasks) and self._entries == other._entries

    def __repr__(self) -> str:
        return f"Tasks({', '.join(self._entries)})"

    def __deepcopy__(self, memo: dict) -> Tasks:
        return self  # its entries are frozen: a deep-copied config shares them

    def declaring(self, stream: str) -> Task | None:
        """The entry that declares the extra stream ``stream`` (its ``ExtraStream``: SST's phrases), or None."""
        return next((e for e in self._entries.values() if e.stream and e.stream.name == stream), None)


def with_triplets(entries: Mapping[str, Task], tasks: Sequence[str]) -> Task | None:
    """The entry whose NLI triplets (``Task.triplets``) a model of ``tasks`` (``model_tasks``) trains on with --nli:
    the first of its tasks beyond the project's three that declares some (a task file's "triplets"), else STS's,
    which every model has (paper §4.2); None when none does."""
    mine = [t for t in tasks if t not in MULTITASK]
    return next((entries[t] for t in (*mine, *MULTITASK) if t in tasks and entries[t].triplets), None)


def task_names() -> tuple[str, ...]:
    """The names of the tasks this package declares."""
    return tuple(_REGISTRY)






def model_tasks(tasks: Sequence[str]) -> tuple[str, ...]:
    """The tasks a model of a run on ``tasks`` has heads for: the project's three, then the run's others."""
    return MULTITASK + tuple(t for t in tasks if t not in MULTITASK)


MULTITASK = ("sst", "para", "sts")  # the CS224N multitask project's tasks: the default --tasks, in every model


# ---- declarations: a task file's keys (a user's is checked, and what it leaves out inferred: tasks/task_file.py) --

TASK_FILE_KEYS = ("name", "kind", "train", "dev", "test", "text", "label", "id", "classes", "num_classes", "range",
                  "metric", "delimiter", "quoting", "header", "line_ends", "multiline", "positive", "label_case",
                  "symmetric", "phrases", "prior", "triplets", "title", "overall", "output")
OUTPUT_KEYS = ("column", "starter", "also_read", "submission", "part1")  # of a task file's "output" (``Output``)
# what a split's own object may set too
LAYOUT_KEYS = ("text", "label", "id", "delimiter", "quoting", "header", "line_ends", "multiline")


def layout_from(spec: Mapping[str, Any]) -> Layout:
    """The Layout a declaration's keys give: a header unless it says ``"header": false`` (columns by name or by
    position alike), and fields that may span lines as CSV's standard allows."""
    text = (spec["text"],) if isinstance(spec["text"], (str, int)) else tuple(spec["text"])
    header = spec.get("header")
    return Layout(text, spec.get("label"), spec.get("id"), FileFormat(spec.get("delimiter"), spec.get("quoting"),
                                                                        True if header is None else header,
                                                                        spec.get("line_ends", False),
                                                                        spec.get("multiline", True)))


def from_declaration(spec: Mapping[str, Any], folder: Path | None = None,
                     origin: Mapping[str, Any] | None = None, checks_range: bool = True) -> Task:
    """The task a complete declaration gives (TASK_FILE_KEYS, with ``kind`` and ``classes`` or ``range`` given:
    tasks/task_file.py checks a user's file and fills them in). A split is a file name, or an object with its
    ``file`` and the LAYOUT_KEYS where its file differs. Files are relative to ``folder`` (a task file's), or
    names in --data-dir (None: the packaged GLUE files). ``checks_range``: a label outside ``range`` is refused
    (a range the file declares; one inferred from the training labels is not)."""
    files, split_layouts = {}, {}
    for split in SPLITS:
        value = spec.get(split)
        if value is None:
            continue
        own = value if isinstance(value, Mapping) else {"file": value}
        files[split] = str(folder / own["file"]) if folder is not None else own["file"]
        if set(own) - {"file"}:
            split_layouts[split] = layout_from({**spec, **{k: v for k, v in own.items() if k != "file"}})
    classes = tuple(spec["classes"]) if spec.get("classes") is not None else None
    metric = spec.get("metric") or ()
    stream = spec.get("phrases")
    if stream is not None:  # an extra labelled stream through its head: "<name>_phrases"
        own = stream if isinstance(stream, Mapping) else {"file": stream}
        stream = ExtraStream(own.get("name", f"{spec['name']}_phrases"),
                             str(folder / own["file"]) if folder else own["file"], own.get("min_words", 1),
                             own.get("order", "mixed"), own.get("per_epoch"), own.get("batch_size"))
    prior = spec.get("prior")
    if prior is not None:  # a probe of a sentence classification, the cosine of a pair regression
        own = prior if isinstance(prior, Mapping) else {"weight": prior}
        prior = Prior(next(k for k, v in PRIOR_KINDS.items() if v == spec["kind"]), own.get("weight", 0.5),
                      own.get("model"))
    return Task(spec["name"], kind_for(spec["kind"], len(classes) if classes else None), files, layout_from(spec),
                classes=classes, score_range=tuple(spec["range"]) if spec.get("range") is not None else None,
                checks_range=spec.get("range") is not None and checks_range,
                metrics=(metric,) if isinstance(metric, str) else tuple(metric), split_layouts=split_layouts,
                title=spec.get("title", ""), output=Output(**spec["output"]) if spec.get("output") else None,
                overall=bool(spec.get("overall")),
                positive=str(spec["positive"]) if spec.get("positive") is not None else "",
                label_case=spec.get("label_case") or "exact", symmetric=bool(spec.get("symmetric")), stream=stream,
                prior=prior, triplets=str(folder / spec["triplets"]) if folder and spec.get("triplets") else
                spec.get("triplets"),
                origin=dict(origin or {}))


def _register_file(path: Path, origin: Mapping[str, Any] | None = None) -> str:
    """Declare the task a task file of this package declares (their files are in --data-dir); its name."""
    task = from_declaration(json.loads(path.read_text(encoding="utf-8")), origin=origin)
    _REGISTRY[task.name] = task
    return task.name


# The CS224N project's tasks and CFIMDB (the minBERT starter's part 1), declared by the files of tasks/cs224n/ (their
# files: data/README.md), in this order: a run's heads are drawn in it (``model_tasks``).
COURSE_DIR = Path(__file__).resolve().parent / "cs224n"
BUILTIN = tuple(_register_file(COURSE_DIR / f"{name}.json") for name in ("sst", "para", "sts", "cfimdb"))

GLUE_DIR = Path(__file__).resolve().parent / "glue"  # a task file per GLUE task
GLUE = tuple(_register_file(f, {"package": f"tasks/glue/{f.name}"}) for f in sorted(GLUE_DIR.glob("*.json")))

PACKAGE = Tasks()  # the package's tasks alone, resolved once: get_task's, and the default of a run's own


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


__all__ = ("BUILTIN", "ENTRY_FORMAT", "GLUE", "KINDS", "LABEL_CASES", "LAYOUT_KEYS", "MULTITASK",
           "OUTPUT_KEYS", "PACKAGE", "PAIR_BINARY", "PART1", "PRIOR_KINDS", "SPLITS", "TASK_FILE_KEYS", "Binary",
           "Classes", "Classification", "Cosine", "DotProduct", "ExtraStream", "Head", "Kind", "Layout", "OneSequence",
           "Output", "PairClassifier", "Prior", "Products", "Scores", "Task", "Tasks", "UnknownTask",
           "canonical_number", "from_declaration", "get_task", "kind_for", "layout_from", "listed", "load_split", "mlp",
           "model_tasks", "task_names", "upgrade_entry", "with_triplets")
