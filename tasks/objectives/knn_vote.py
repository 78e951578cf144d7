"""KNN-BERT's inference (Li et al., ../shared/papers/knn-bert.txt §3.1, eq. 1): a KNN vote over training representations.

``KNNClassifier`` stores the training-set representations; a query's KNN(q) is
the class distribution of its K cosine nearest neighbours, an unweighted vote
(the paper's "voted result"; the authors' code counts one-hot labels / K), and
eq. 1 combines it with the linear classifier: s = (1 − φ)·softmax(F(q)) + φ·KNN(q).
φ = 0 is the linear classifier, φ = 1 KNN only. The paraphrase head's single
logit z is the 2-class distribution [1 − σ(z), σ(z)]. The training objective
is in knn_bert.py; its ``inference`` hook returns a ``KNNInference``, which the
final evaluation (tasks/predict.py) runs.

Usage:
    probs = knn_predict(model, "sst", sst_train, sst_dev, k=100, phi=0.25)   # (N_dev, 5)
    knn = KNNClassifier(k=100, num_classes=5).fit(train_features, train_labels)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tasks.evaluate import TASK_METRIC, Predictions, jsonable, overall_score, score
from tasks.objectives import Objective

logger = logging.getLogger(__name__)

NUM_CLASSES = {"sst": 5, "para": 2}
REPRESENTATIONS = ("pooled", "head_input")


def unwrap(model: nn.Module) -> nn.Module:
    """The MultitaskBert inside DistributedDataParallel (.module) and/or torch.compile (._orig_mod)."""
    while True:
        inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


@contextmanager
def preserved_modes(model: nn.Module) -> Iterator[nn.Module]:
    """Restore the train/eval mode of every submodule of ``model`` on exit (also on an exception).

    ``model.train(was_training)`` would put *every* submodule in the top module's
    mode, turning dropout back on in an encoder that LP-FT keeps in eval mode
    under heads in train mode; this puts each one back as it was.
    """
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training


def follow_modes(copy_: nn.Module, original: nn.Module) -> None:
    """Give each submodule of ``copy_`` (a deep copy of ``original``) the train/eval mode of its original.

    Module by module, so a frozen encoder in eval mode under heads in train
    mode (LP-FT stage 1) is copied as such.
    """
    for m, o in zip(copy_.modules(), original.modules(), strict=True):
        m.training = o.training


def check_representation(model: nn.Module, task: str, representation: str) -> None:
    """Raise when ``model`` yields no single (B, D) ``representation`` for ``task`` (Siamese paraphrase)."""
    cfg = unwrap(model).config
    if task == "para" and cfg.pair_encoding == "siamese":
        if representation == "pooled":
            raise ValueError("knn_bert on 'para' with pair_encoding='siamese' has no single pooled embedding per "
                             "pair: use pair_encoding='cross', or representation='head_input' with arch='b1'")
        if cfg.arch != "b1":
            raise ValueError("knn_bert on 'para' with the Siamese baseline has no pair representation (it scores a "
                             "dot product): use pair_encoding='cross', or arch='b1' with representation='head_input'")


def class_probabilities(task: str, logits: torch.Tensor) -> torch.Tensor:
    """softmax(F(q)) of eq. 1, (B, C); the paraphrase logit z gives [1 − σ(z), σ(z)]."""
    logits = logits.float()
    if task == "para":
        p = torch.sigmoid(logits)  # (B,)
        return torch.stack([1.0 - p, p], dim=-1)  # (B, 2)
    return logits.softmax(dim=-1)


class KNNClassifier:
    """Cosine K-nearest-neighbour vote over stored (training) representations (KNN-BERT §3.1).

    Usage:
        knn = KNNClassifier(k=100, num_classes=5).fit(train_features, train_labels)
        probs = knn.predict_proba(dev_features, dev_logits, phi=0.25)   # eq. 1, (N, 5)
    """

    def __init__(self, k: int, num_classes: int, chunk_size: int = 1024):
        if k < 1 or num_classes < 2 or chunk_size < 1:
            raise ValueError(f"need k >= 1, num_classes >= 2, chunk_size >= 1; got {k}, {num_classes}, {chunk_size}")
        self.k, self.num_classes, self.chunk_size = k, num_classes, chunk_size
        self.keys: torch.Tensor | None = None
        self.labels: torch.Tensor | None = None

    def fit(self, features: torch.Tensor, labels: torch.Tensor) -> "KNNClassifier":
        """Store L2-normalized (N, D) features and their (N,) integer labels."""
        if features.ndim != 2 or labels.shape != features.shape[:1]:
            raise ValueError(f"features must be (N, D) and labels (N,), got {tuple(features.shape)} and "
                             f"{tuple(labels.shape)}")
        if self.k > features.shape[0]:
            raise ValueError(f"k={self.k} neighbours requested but only {features.shape[0]} stored examples")
        labels = labels.long()
        if bool(((labels < 0) | (labels >= self.num_classes)).any()):
            raise ValueError(f"labels must lie in 0..{self.num_classes - 1}")
        self.keys = F.normalize(features.detach().float(), dim=-1)
        self.labels = labels.detach().to(self.keys.device)
        return self

    @torch.no_grad()
    def vote(self, queries: torch.Tensor) -> torch.Tensor:
        """KNN(q), (Q, C): the fraction of each class among the K most cosine-similar stored examples."""
        if self.keys is None:
            raise RuntimeError("KNNClassifier.vote before fit")
        q = F.normalize(queries.detach().float(), dim=-1).to(self.keys.device)
        out = []
        for start in range(0, q.shape[0], self.chunk_size):
            sim = q[start:start + self.chunk_size] @ self.keys.T  # (c, N)
            idx = sim.topk(self.k, dim=1).indices  # (c, K)
            onehot = F.one_hot(self.labels[idx], self.num_classes)  # (c, K, C)
            out.append(onehot.sum(dim=1).float() / self.k)
        return torch.cat(out) if out else q.new_zeros(0, self.num_classes)

    def predict_proba(self, queries: torch.Tensor, probs: torch.Tensor, phi: float) -> torch.Tensor:
        """Eq. 1: s = (1 − φ)·probs + φ·KNN(q); ``probs`` is the linear classifier's softmax (Q, C)."""
        if not 0.0 <= phi <= 1.0:
            raise ValueError(f"phi must be in [0, 1], got {phi}")
        probs = probs.detach().float().to(self.keys.device if self.keys is not None else probs.device)
        if phi == 0.0:
            return probs  # exactly the linear classifier: no neighbour search
        return (1.0 - phi) * probs + phi * self.vote(queries)


class KNNInference:
    """KNN-BERT inference (§3.1, eq. 1) at the final evaluation: what ``KNNBert.inference`` returns.

    For each task the objective trains (SST, paraphrase): the whole training
    file's representations under the final model (``representation``) are
    stored once, then every evaluated example gets
    s = (1 − φ)·softmax(F(q)) + φ·KNN(q) with its K cosine-nearest training
    examples (``knn_k``, ``knn_phi``), and the KNN vote alone (φ = 1). The
    same computation as ``knn_predict``, with the training representations
    computed once for every split and both φ. Cost: one forward pass over the
    training sets (all of Quora's on a full run) plus one more over each scored set.
    """

    key = "knn"

    def __init__(self, objective: Objective, model: nn.Module, tasks: Sequence[str],
                 train_set: Callable[[str], Any], batch_size: int, device: torch.device) -> None:
        self.config = objective.config
        self.model, self.train_set, self.batch_size, self.device = model, train_set, batch_size, device
        self.tasks = [t for t in tasks if t in NUM_CLASSES and objective.applies_to(t)]
        self.classifiers: dict[str, KNNClassifier] = {}
        self.info = {"k": self.config.knn_k, "phi": self.config.knn_phi,
                     "leaderboard": "knn" if self.config.knn_phi > 0 else "classifier"}

    def _features(self, task: str, dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return compute_representations(self.model, task, dataset, self.config.representation, self.batch_size,
                                       self.device)

    def probabilities(self, task: str, dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(eq. 1 probabilities at φ = knn_phi, KNN vote only (φ = 1)), each (N, C), in dataset order."""
        if task not in self.classifiers:
            t0 = time.perf_counter()
            train = self.train_set(task)
            feats, _ = self._features(task, train)
            self.classifiers[task] = KNNClassifier(self.config.knn_k, NUM_CLASSES[task]).fit(feats, train.labels)
            logger.info("KNN-BERT: %d %s training representations in %.0f s", len(train), task,
                        time.perf_counter() - t0)
        knn = self.classifiers[task]
        queries, logits = self._features(task, dataset)
        probs = class_probabilities(task, logits)
        return knn.predict_proba(queries, probs, self.config.knn_phi), knn.predict_proba(queries, probs, 1.0)

    def score(self, split: str, datasets: dict[str, Any], preds: dict[str, Predictions], metrics: dict[str, float]
              ) -> tuple[dict[str, Predictions], dict[str, Any]]:
        """(leaderboard predictions, KNN metrics) of one split.

        The leaderboard files take the eq. 1 prediction when knn_phi > 0 (their
        logits files keep the classifier's raw outputs). Metrics are the plain
        ones with each KNN task's score replaced, overall recomputed.
        """
        phi = self.config.knn_phi
        combined_metrics, vote_metrics = dict(metrics), dict(metrics)
        leaderboard = dict(preds)
        for task in [t for t in self.tasks if t in datasets]:
            labels = getattr(datasets[task], "labels", None)
            if labels is None and phi == 0:
                continue  # unlabeled (test) and the classifier's prediction stands: nothing to compute
            combined, vote = self.probabilities(task, datasets[task])
            if phi > 0:
                p = preds[task]
                leaderboard[task] = Predictions(p.ids, p.logits, combined.argmax(-1))
            if labels is not None:
                combined_metrics[TASK_METRIC[task]] = score(task, combined.argmax(-1), labels)
                vote_metrics[TASK_METRIC[task]] = score(task, vote.argmax(-1), labels)
        if not metrics:
            return leaderboard, {}
        for m in (combined_metrics, vote_metrics):
            m["overall"] = overall_score(m)
        logger.info("%s KNN-BERT (k %d, phi %g): %s | KNN vote only (phi 1): %s", split, self.config.knn_k, phi,
                    " ".join(f"{k} {v:.4f}" for k, v in combined_metrics.items()),
                    " ".join(f"{k} {v:.4f}" for k, v in vote_metrics.items()))
        return leaderboard, {split: jsonable(combined_metrics), f"{split}_knn_only": jsonable(vote_metrics)}


@torch.no_grad()
def compute_representations(model: nn.Module, task: str, dataset: Any, representation: str = "pooled",
                            batch_size: int = 64, device: torch.device | str | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(features (N, D), logits) of every example of ``dataset`` in dataset order, eval mode, on CPU.

    ``dataset`` is a tasks.data dataset (``collate(indices)``, ``lengths``);
    batches are length-sorted for little padding and put back in order.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    check_representation(model, task, representation)
    if device is None:
        device = next(model.parameters()).device
    n = len(dataset)
    order = sorted(range(n), key=lambda i: dataset.lengths[i])
    feats: list[torch.Tensor] = []
    logits: list[torch.Tensor] = []
    with preserved_modes(model):
        model.eval()
        for start in range(0, n, batch_size):
            batch = dataset.collate(order[start:start + batch_size])
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            out = model(task, batch)
            feats.append(out.features[representation].float().cpu())
            logits.append(out.logits.float().cpu())
    if not feats:
        raise ValueError(f"{task}: empty dataset")
    inverse = torch.empty(n, dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(n)
    return torch.cat(feats)[inverse], torch.cat(logits)[inverse]


def knn_predict(model: nn.Module, task: str, train_dataset: Any, eval_dataset: Any, k: int = 100,
                phi: float = 0.25, batch_size: int = 64, device: torch.device | str | None = None,
                representation: str = "pooled") -> torch.Tensor:
    """KNN-BERT eq. 1 class probabilities (N_eval, C) for ``eval_dataset``, in its order.

    The neighbours are the labeled ``train_dataset``'s representations under
    the current model. φ = 0 gives the linear classifier's softmax, φ = 1 the
    KNN vote only. Paraphrase: C = 2, class 1 = paraphrase, so
    ``probs.argmax(-1)`` is the prediction for every task.
    """
    if task not in NUM_CLASSES:
        raise ValueError(f"knn_predict applies to {tuple(NUM_CLASSES)}, got {task!r}")
    if getattr(train_dataset, "labels", None) is None:
        raise ValueError("knn_predict needs a labeled train_dataset")
    train_feats, _ = compute_representations(model, task, train_dataset, representation, batch_size, device)
    eval_feats, eval_logits = compute_representations(model, task, eval_dataset, representation, batch_size, device)
    knn = KNNClassifier(k, NUM_CLASSES[task]).fit(train_feats, train_dataset.labels)
    return knn.predict_proba(eval_feats, class_probabilities(task, eval_logits), phi)


__all__ = ("NUM_CLASSES", "REPRESENTATIONS", "KNNClassifier", "KNNInference", "check_representation", "class_probabilities",
           "compute_representations", "follow_modes", "knn_predict", "preserved_modes", "unwrap")
