"""KNN-BERT (Li et al., ../shared/papers/knn-bert.txt §3): supervised momentum contrast, and a KNN vote at inference.

Training (objective "knn_bert", SST and paraphrase). Every step:
1. the momentum *key model* encodes the batch (no gradient) and its L2-normalized
   keys go into a per-task FIFO queue together with their labels;
2. each query q (the model's own normalized representation, with gradient) is
   contrasted with the queue (eq. 3): among the queued keys of q's class it
   takes the M_m most similar and the M_l least similar ("hard") positives; the
   negatives are all queued keys of the other classes:

       L'_sc = 1/(M_m+M_l) Σ_{k_j ∈ {k_m, k_l}} −log( e^{q·k_j/τ} / Σ_{k_i ∈ {k_−, k_j}} e^{q·k_i/τ} )

3. total loss (eq. 6) (1 − λ)·CE + λ·L'_sc: ``task_loss_scale`` = 1 − λ scales
   the head's loss and the trainer multiplies the term "sc" by ``weight`` = λ;
4. after the optimizer step (``on_step_end``) the key model follows the model
   (eq. 5): θ_k ← m·θ_k + (1 − m)·θ_q.

Choices the paper leaves open, settled by the authors' code (LinyangLee/KNN-BERT):
the batch's keys are enqueued *before* the loss is computed (so a query's own
key is among its positives, as MoCo's positive key is), and the key model's
train/eval mode follows the model's (dropout in the keys during training),
module by module: under LP-FT stage 1 the key encoder runs without dropout,
as the frozen query encoder does.
Where the paper is silent and the code differs from the paper we follow the
paper: keys and queries are the plain [CLS]-side representation (no extra
projection head), and the queue starts empty rather than with random keys.
When a query has fewer than M_m + M_l positives all of them are used, each once
(the normalization is then the number used); a query with no positive in the
queue is left out of the mean.

Inference (separate, explicit): ``KNNClassifier`` stores the training-set
representations; a query's KNN(q) is the class distribution of its K cosine
nearest neighbours, an unweighted vote (the paper's "voted result"; the
authors' code counts one-hot labels / K), and eq. 1 combines it with the
linear classifier: s = (1 − φ)·softmax(F(q)) + φ·KNN(q). φ = 0 is the linear
classifier, φ = 1 KNN only. The paraphrase head's single logit z is the
2-class distribution [1 − σ(z), σ(z)].

The key model is a deep copy of the whole MultitaskBert (encoder + pooler +
heads, so "head_input" representations are produced exactly as the model
produces them). It never receives gradients and is *not* a registered
submodule: it is absent from ``.parameters()``, so an optimizer built from
``objective.parameters()`` cannot see it (this objective has no trainable
parameters at all). Its weights and the queues are nevertheless part of
``state_dict()`` (keys ``key_model.*`` and ``<task>_queue_*``), so a
checkpoint of the objective's state resumes the momentum encoder and queues
exactly; ``.to(device)`` moves it along with the queues.

Usage:
    obj = build_objectives({"knn_bert": {"m_most": 50, "m_least": 50}}, model)[0]
    obj.set_train_size(len(sst_train), "sst")    # queue = min(queue_size, train size)
    terms = obj(model, "sst", batch, model("sst", batch))   # {"sc": L'_sc}
    obj.on_step_end(model)                                   # after optimizer.step()
    train_feats, _ = compute_representations(model, "sst", sst_train)       # eq. 1 at evaluation:
    knn = KNNClassifier(k=100, num_classes=5).fit(train_feats, sst_train.labels)
    feats, logits = compute_representations(model, "sst", sst_dev)
    probs = knn.predict_proba(feats, class_probabilities(model.entry("sst"), logits), phi=0.25)   # (N_dev, 5)
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tasks.model import follow_modes, preserved_modes
from tasks.task import Binary, Classes, Task
from tasks.objectives import Objective, ObjectiveConfig, kind_rule
from tasks.options import option
from tasks.runtime import full_precision

# ---- inference: the KNN vote (§3.1, eq. 1) ----
logger = logging.getLogger(__name__)




REPRESENTATIONS = ("pooled", "head_input")


def check_representation(model: nn.Module, task: str, representation: str) -> None:
    """Raise when ``model`` yields no single (B, D) ``representation`` for ``task`` (a Siamese pair task's head
    gives each sentence's pooled embedding, and a pair vector only where it builds one: b1's "head_input")."""
    gives = model.feature_names(task)
    if representation not in gives:
        cfg = model.config
        raise ValueError(f"knn_bert on {task!r}: its head (arch={cfg.arch!r}, pair_encoding={cfg.pair_encoding!r}) "
                         f"has no single {representation!r} vector per example, only {', '.join(gives)}: use "
                         "pair_encoding='cross', or representation='head_input' with arch='b1'")


def _two_classes(z: torch.Tensor) -> torch.Tensor:
    p = torch.sigmoid(z)  # (B,)
    return torch.stack([1.0 - p, p], dim=-1)  # (B, 2)


# softmax(F(q)) of eq. 1 (B, C) from a head's float32 logits, by the kind of task (the kinds KNN-BERT takes): a
# softmax over C logits, or a binary logit z (paraphrase) as [1 − σ(z), σ(z)]
PROBABILITIES = {Classes: lambda z: z.softmax(dim=-1), Binary: _two_classes}


def class_probabilities(task: Task, logits: torch.Tensor) -> torch.Tensor:
    """softmax(F(q)) of eq. 1, (B, C), by the kind of ``task`` (an entry: ``model.entry``; ``PROBABILITIES``); a
    ValueError for another kind."""
    return kind_rule("knn_bert", PROBABILITIES, task.name, task.kind)(logits.float())


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
    examples (``knn_k``, ``knn_phi``), and the KNN vote alone (φ = 1), with the
    training representations computed once for every split and both φ. Cost: one forward pass over the
    training sets (all of Quora's on a full run) plus one more over each scored set.
    """

    key = "knn"

    def __init__(self, objective: Objective, model: nn.Module, tasks: Sequence[str],
                 train_set: Callable[[str], Any], batch_size: int, device: torch.device) -> None:
        self.config = objective.config
        self.model, self.train_set, self.batch_size, self.device = model, train_set, batch_size, device
        self.tasks = [t for t in tasks if objective.applies_to(t)]
        self.classifiers: dict[str, KNNClassifier] = {}
        self.info = {"k": self.config.knn_k, "phi": self.config.knn_phi,
                     "leaderboard": "knn" if self.config.knn_phi > 0 else "classifier"}
        self.name = f"KNN-BERT (k {self.config.knn_k}, phi {self.config.knn_phi:g})"

    def _features(self, task: str, dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return compute_representations(self.model, task, dataset, self.config.representation, self.batch_size,
                                       self.device)

    def probabilities(self, task: str, dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(eq. 1 probabilities at φ = knn_phi, KNN vote only (φ = 1)), each (N, C), in dataset order."""
        if task not in self.classifiers:
            t0 = time.perf_counter()
            train = self.train_set(task)
            feats, _ = self._features(task, train)
            knn = KNNClassifier(self.config.knn_k, self.model.entry(task).num_classes)
            self.classifiers[task] = knn.fit(feats, train.labels)
            logger.info("KNN-BERT: %d %s training representations in %.0f s", len(train), task,
                        time.perf_counter() - t0)
        knn = self.classifiers[task]
        queries, logits = self._features(task, dataset)
        probs = class_probabilities(self.model.entry(task), logits)
        return knn.predict_proba(queries, probs, self.config.knn_phi), knn.predict_proba(queries, probs, 1.0)

    @property
    def replaces(self) -> bool:
        """With phi > 0 the SST / paraphrase leaderboard files take the eq. 1 prediction (the logits files keep
        the classifier's raw outputs); at phi 0 it is the classifier's own."""
        return self.config.knn_phi > 0

    def classes(self, split: str, datasets: dict[str, Any]) -> dict[str, dict[str, torch.Tensor]]:
        """{"": eq. 1's classes at knn_phi, "knn_only": the vote's alone (phi 1)} of each KNN task of ``datasets``
        (an unlabelled split: only where they replace the classifier's)."""
        combined, vote = {}, {}
        for task in [t for t in self.tasks if t in datasets]:
            if getattr(datasets[task], "labels", None) is None and not self.replaces:
                continue  # unlabeled (test) and the classifier's prediction stands: nothing to compute
            at_phi, alone = self.probabilities(task, datasets[task])
            combined[task], vote[task] = at_phi.argmax(-1), alone.argmax(-1)
        return {"": combined, "knn_only": vote}


@torch.no_grad()
def compute_representations(model: nn.Module, task: str, dataset: Any, representation: str = "pooled",
                            batch_size: int = 64, device: torch.device | str | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(features (N, D), logits) of every example of ``dataset`` in dataset order, eval mode, on CPU.

    ``dataset`` is a tasks.data.datasets dataset (``collate(indices)``, ``lengths``);
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


# ---- training: supervised momentum contrast (eq. 3, 5, 6) ----
@dataclass
class KNNBertConfig(ObjectiveConfig):
    weight: float = option(0.1, "λ of eq. 6 (paper: 0.1); the head's own loss is scaled by 1 − λ")
    momentum: float = option(0.999, "m of eq. 5")
    temperature: float = option(0.07, "τ of eq. 3")
    queue_size: int = option(32000, "capped at the train size by set_train_size (paper: 32,000 or the whole train set)")
    m_most: int = option(50, "M_m most similar positives (paper searches {10, 50, 100, 200, 400})")
    m_least: int = option(50, "M_l least similar (\"hard\") positives")
    representation: str = option("pooled", "\"pooled\" = the [CLS]-side sentence embedding (paper); \"head_input\"")
    knn_k: int = option(100, "K neighbours for inference (paper searches {100, 200, 500, 1000}); used by the final evaluation and --eval-only (the 'knn' dev metrics)")
    knn_phi: float = option(0.25, "φ of eq. 1 for inference (paper: 0.25 typically); the final evaluation and --eval-only score phi and phi=1 (KNN only) as 'knn' dev metrics, and with phi > 0 the SST / paraphrase leaderboard files hold the combined prediction (logits files stay the classifier's)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.weight <= 1.0:
            raise ValueError(f"knn_bert weight is λ of (1−λ)·CE + λ·L'_sc and must be in [0, 1], "
                             f"got {self.weight}")
        if not 0.0 <= self.momentum <= 1.0:
            raise ValueError(f"momentum must be in [0, 1], got {self.momentum}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if self.queue_size < 1:
            raise ValueError(f"queue_size must be positive, got {self.queue_size}")
        if self.m_most < 0 or self.m_least < 0 or self.m_most + self.m_least < 1:
            raise ValueError(f"m_most and m_least must be >= 0 with at least one positive, "
                             f"got {self.m_most} and {self.m_least}")
        if self.representation not in REPRESENTATIONS:
            raise ValueError(f"representation must be one of {REPRESENTATIONS}, got {self.representation!r}")
        if self.knn_k < 1:
            raise ValueError(f"knn_k must be positive, got {self.knn_k}")
        if not 0.0 <= self.knn_phi <= 1.0:
            raise ValueError(f"knn_phi must be in [0, 1], got {self.knn_phi}")


def select_positives(sim: torch.Tensor, positive: torch.Tensor, m_most: int, m_least: int) -> torch.Tensor:
    """(B, N) bool: per row the ``m_most`` most and ``m_least`` least similar positives.

    Disjoint, so a row with at most m_most + m_least positives selects all of
    them once. Ties break by queue position (stable sort), which keeps it
    deterministic.
    """
    B, N = sim.shape
    ranked = sim.masked_fill(~positive, float("-inf"))
    order = ranked.argsort(dim=1, descending=True, stable=True)  # positives first, most similar first
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(N, device=sim.device).expand(B, N))  # rank[i, j]: position of key j in row i
    n_pos = positive.sum(dim=1, keepdim=True)  # (B, 1)
    return positive & ((rank < m_most) | (rank >= n_pos - m_least))


def supervised_moco_loss(q: torch.Tensor, labels: torch.Tensor, keys: torch.Tensor, key_labels: torch.Tensor,
                         m_most: int, m_least: int, temperature: float) -> torch.Tensor:
    """L'_sc of KNN-BERT eq. 3, averaged over the queries that have a positive.

    q: (B, D) L2-normalized queries (carry the gradient); keys: (N, D)
    L2-normalized queue keys; labels (B,), key_labels (N,) integer classes.
    For each selected positive k_j the denominator holds k_j and every
    other-class key; the per-query mean is over its selected positives.
    Related: SCL (Gunel et al.) contrasts in-batch examples instead of a queue.
    """
    with full_precision(q.device):  # τ = 0.07 magnifies bf16 (and TF32) rounding of q·k 14-fold
        sim = (q.float() @ keys.float().T) / temperature  # (B, N)
        positive = labels[:, None] == key_labels[None, :]  # (B, N)
        # A large finite fill, not -inf: a row without negatives would otherwise make
        # logsumexp's backward compute 0 * nan.
        very_negative = torch.finfo(sim.dtype).min
        neg_lse = torch.logsumexp(sim.masked_fill(positive, very_negative), dim=1, keepdim=True)  # (B, 1)
        pair_loss = torch.logaddexp(sim, neg_lse) - sim  # −log(e^s / (e^s + Σ_neg e^{s'})), (B, N)
    selected = select_positives(sim.detach(), positive, m_most, m_least)  # (B, N)
    n_selected = selected.sum(dim=1)  # (B,)
    per_query = (pair_loss * selected).sum(dim=1) / n_selected.clamp_min(1)  # (B,)
    has_positive = (n_selected > 0).float()  # (B,)
    # A masked mean, not indexing: no device sync, and 0 (graph intact) when no query has a positive.
    return (per_query * has_positive).sum() / has_positive.sum().clamp_min(1.0)


class KNNBert(Objective):
    """(1 − λ)·CE + λ·L'_sc with a MoCo key model and per-task label-aware queues (KNN-BERT eq. 3, 5, 6)."""

    name = "knn_bert"
    Config = KNNBertConfig
    option_names = frozenset((  # at options_version 1
        "weight", "tasks", "momentum", "temperature", "queue_size", "m_most", "m_least", "representation", "knn_k",
        "knn_phi"))
    kinds = ("sentence-classification", "pair-classification")
    tasks = ("sst", "para")
    batch_coupled = True  # the queue is filled from the batch (under torchrun: each rank's own queue)
    inference_options = ("knn_k", "knn_phi")

    def __init__(self, config: KNNBertConfig, model: nn.Module | None = None):
        super().__init__(config, model)
        if model is None:
            raise ValueError("knn_bert needs the model at construction: its key model is a copy of it")
        for task in self.active_tasks():
            check_representation(model, task, config.representation)
        key = copy.deepcopy(model)
        key.requires_grad_(False)
        key.zero_grad(set_to_none=True)
        # A plain list, not an attribute nn.Module would register: the key model must
        # stay out of .parameters() (and so out of any optimizer). state_dict, load and
        # .to() handle it explicitly below.
        self._key: list[nn.Module] = [key]
        self._capacity = {t: config.queue_size for t in self.active_tasks()}
        self._ptr = {t: 0 for t in self.active_tasks()}
        self._count = {t: 0 for t in self.active_tasks()}

    @property
    def key_model(self) -> nn.Module:
        return self._key[0]

    @property
    def task_loss_scale(self) -> float:
        return 1.0 - float(self.config.weight)

    # ---- hooks ------------------------------------------------------------------------------

    @classmethod
    def check_run(cls, config: KNNBertConfig, run_config: Any) -> None:
        """The final KNN vote needs knn_k training examples of every task it scores."""
        limit = run_config.limit
        if limit is not None and config.knn_k > limit:
            raise ValueError(f"knn_bert knn_k={config.knn_k} neighbours, but limit={limit} leaves at most "
                             f"{limit} training examples per task for the final KNN-BERT evaluation "
                             "(KNNInference); lower --knn-bert-knn-k")

    def on_train_start(self, model: nn.Module, train_sets: dict[str, Any]) -> None:
        """Queue = min(queue_size, train size) for every task this objective trains (the paper's rule)."""
        for task, dataset in train_sets.items():
            if self.applies_to(task):
                self.set_train_size(len(dataset), task)

    def inference(self, model: nn.Module, tasks: Sequence[str], train_set: Callable[[str], Any], batch_size: int,
                  device: torch.device) -> KNNInference:
        return KNNInference(self, model, tasks, train_set, batch_size, device)

    # ---- queue ------------------------------------------------------------------------------

    def set_train_size(self, n: int, task: str | None = None) -> None:
        """Cap the queue of ``task`` (all tasks when None) at ``n``: min(queue_size, n), the paper's rule.

        Call before training; changing the capacity of a queue that already holds keys raises.
        """
        if n < 1:
            raise ValueError(f"train size must be positive, got {n}")
        for t in (task,) if task is not None else self.active_tasks():
            if t not in self._capacity:
                raise ValueError(f"knn_bert is not active on task {t!r}; active: {self.active_tasks()}")
            capacity = min(self.config.queue_size, int(n))
            keys = self._buffer(t, "keys")
            if keys is not None and keys.shape[0] != capacity:
                if self._count[t] > 0:
                    raise ValueError(f"the {t} queue already holds {self._count[t]} keys; set the train size "
                                     "before training")
                for part in ("keys", "labels", "ptr", "count"):
                    delattr(self, f"{t}_queue_{part}")
            self._capacity[t] = capacity

    def capacity(self, task: str) -> int:
        return self._capacity[task]

    def _buffer(self, task: str, part: str) -> torch.Tensor | None:
        return self._buffers.get(f"{task}_queue_{part}")

    def _allocate(self, task: str, dim: int, device: torch.device) -> None:
        cap = self._capacity[task]
        self.register_buffer(f"{task}_queue_keys", torch.zeros(cap, dim, device=device))  # (L, D)
        self.register_buffer(f"{task}_queue_labels", torch.full((cap,), -1, dtype=torch.long, device=device))
        self.register_buffer(f"{task}_queue_ptr", torch.zeros((), dtype=torch.long, device=device))
        self.register_buffer(f"{task}_queue_count", torch.zeros((), dtype=torch.long, device=device))
        self._ptr[task] = self._count[task] = 0

    @torch.no_grad()
    def enqueue(self, task: str, keys: torch.Tensor, labels: torch.Tensor) -> None:
        """Push (B, D) keys and their (B,) labels; the oldest entries drop out once the queue is full."""
        if task not in self._capacity:
            raise ValueError(f"knn_bert is not active on task {task!r}; active: {self.active_tasks()}")
        keys, labels = keys.detach().float(), labels.detach().long()
        if self._buffer(task, "keys") is None:
            self._allocate(task, keys.shape[1], keys.device)
        store, store_labels = self._buffer(task, "keys"), self._buffer(task, "labels")
        if store.device != keys.device:
            keys, labels = keys.to(store.device), labels.to(store.device)
        cap = store.shape[0]
        if keys.shape[0] > cap:  # only the newest cap entries would survive anyway
            keys, labels = keys[-cap:], labels[-cap:]
        n, ptr = keys.shape[0], self._ptr[task]
        slots = torch.arange(ptr, ptr + n, device=store.device) % cap  # (n,) ring positions
        store[slots] = keys
        store_labels[slots] = labels
        self._ptr[task] = (ptr + n) % cap
        self._count[task] = min(self._count[task] + n, cap)
        # Python ints are the source of truth (no device sync per step); the buffers mirror them for state_dict.
        self._buffer(task, "ptr").fill_(self._ptr[task])
        self._buffer(task, "count").fill_(self._count[task])

    def queue(self, task: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The queued (keys (n, D), labels (n,)) of ``task``, oldest first."""
        store, store_labels = self._buffer(task, "keys"), self._buffer(task, "labels")
        if store is None:
            return torch.zeros(0, 0), torch.zeros(0, dtype=torch.long)
        count, ptr, cap = self._count[task], self._ptr[task], store.shape[0]
        if count < cap:
            return store[:count], store_labels[:count]
        order = torch.cat([torch.arange(ptr, cap), torch.arange(0, ptr)]).to(store.device)
        return store[order], store_labels[order]

    # ---- training ---------------------------------------------------------------------------

    @torch.no_grad()
    def encode_keys(self, model: nn.Module, task: str, batch: dict) -> torch.Tensor:
        """The key model's L2-normalized representations (B, D) of ``batch``; no gradient."""
        key = self.key_model
        device = batch["attention_mask" if "attention_mask" in batch else "attention_mask_1"].device
        if next(key.parameters()).device != device:
            key.to(device)
        follow_modes(key, model)
        out = key(task, batch)
        return F.normalize(out.features[self.config.representation].float(), dim=-1)

    def forward(self, model: nn.Module, task: str, batch: dict, out) -> dict[str, torch.Tensor]:
        rep = self.config.representation
        if rep not in out.features:
            check_representation(model, task, rep)  # raises with the reason
            raise ValueError(f"knn_bert: the {task} head output has no {rep!r} feature (has {sorted(out.features)})")
        labels = batch["labels"].long()  # paraphrase labels arrive as float 0/1 BCE targets
        q = F.normalize(out.features[rep].float(), dim=-1)  # (B, D)
        self.enqueue(task, self.encode_keys(model, task, batch), labels)
        count = self._count[task]
        keys, key_labels = self._buffer(task, "keys")[:count], self._buffer(task, "labels")[:count]
        cfg = self.config
        loss = supervised_moco_loss(q, labels, keys, key_labels, cfg.m_most, cfg.m_least, cfg.temperature)
        return {"sc": loss}

    @torch.no_grad()
    def on_step_end(self, model: nn.Module) -> None:
        """Momentum update (eq. 5) θ_k ← m·θ_k + (1 − m)·θ_q, after the optimizer step; buffers are copied."""
        m = float(self.config.momentum)
        query = dict(model.named_parameters())
        names = [n for n, _ in self.key_model.named_parameters()]
        missing = [n for n in names if n not in query]
        if missing:
            raise ValueError(f"knn_bert: the model lacks key-model parameters {missing[:3]}...; was it rebuilt?")
        keys = [p for _, p in self.key_model.named_parameters()]
        qs = [query[n].detach() for n in names]
        if keys and keys[0].device != qs[0].device:
            self.key_model.to(qs[0].device)
            keys = [p for _, p in self.key_model.named_parameters()]
        torch._foreach_mul_(keys, m)
        torch._foreach_add_(keys, qs, alpha=1.0 - m)
        query_buffers = dict(model.named_buffers())
        for n, b in self.key_model.named_buffers():
            if n in query_buffers:
                b.copy_(query_buffers[n])

    # ---- state: the hidden key model travels with .to() and state_dict ---------------------------

    def _apply(self, fn, *args, **kwargs):
        super()._apply(fn, *args, **kwargs)
        self.key_model._apply(fn, *args, **kwargs)
        return self

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, value in self.key_model.state_dict(keep_vars=keep_vars).items():
            destination[f"{prefix}key_model.{name}"] = value

    def _load_from_state_dict(self, state_dict: dict, prefix: str, local_metadata: dict, strict: bool,
                              missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
        device = next(self.key_model.parameters()).device
        for task in self.active_tasks():
            stored = state_dict.get(f"{prefix}{task}_queue_keys")
            if stored is not None:  # queues are allocated lazily: make room for the stored one
                self._capacity[task] = stored.shape[0]
                self._allocate(task, stored.shape[1], device)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        for task in self.active_tasks():
            if f"{prefix}{task}_queue_ptr" in state_dict:
                self._ptr[task] = int(state_dict[f"{prefix}{task}_queue_ptr"])
                self._count[task] = int(state_dict[f"{prefix}{task}_queue_count"])
        key_prefix = f"{prefix}key_model."
        sub = {k[len(key_prefix):]: v for k, v in state_dict.items() if k.startswith(key_prefix)}
        unexpected_keys[:] = [k for k in unexpected_keys if not k.startswith(key_prefix)]
        if sub:
            result = self.key_model.load_state_dict(sub, strict=strict)
            missing_keys.extend(key_prefix + k for k in result.missing_keys)
            unexpected_keys.extend(key_prefix + k for k in result.unexpected_keys)
        elif strict:
            missing_keys.append(f"{key_prefix}*")


__all__ = ("KNNBert", "KNNBertConfig", "KNNClassifier", "KNNInference", "class_probabilities",
           "compute_representations", "select_positives", "supervised_moco_loss")

