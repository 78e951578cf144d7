"""A frozen sentence encoder as a second opinion at evaluation: the prior a task declares (its entry's ``prior``),
at the weight a run gives it (``--prior-weights TASK=W``; the SST and STS priors': ``--sst-prior W``, ``--sts-prior
W``; not in the papers).

all-MiniLM-L6-v2 was trained so that the cosine of two sentences' mean-pooled
embeddings scores their similarity (sentence-transformers' recipe). Multitask
fine-tuning of a cross-encoder gives up that geometry: the fine-tuned encoder's
own Siamese cosine scores STS dev far below the original's (experiments/RESULTS.md,
"The STS prior's encoder"). So the prior is a frozen copy of a sentence encoder,
used only at evaluation. A pair regression's is its cosine on the task's scale [low, high]:

    score = (1 - W) x the head's score + W x (low + (high - low) x cos(mean(a), mean(b)))   (STS: 5 x cos)

Both terms are on the task's scale, so W = 0.5 is the simple mean of two models'
scores, as the "simple" ensemble (tasks.evaluation.ensembling) takes it: nothing is fitted.
It costs one more encoder in memory (one copy for every prior) and one pass
over the task's sentences (cached for the latest sentences), no training.

A sentence classification's is a probe (ProbePrior): a multinomial logistic regression on the frozen
encoder's embeddings of the task's training sentences (a linear probe: C x H weights, fitted by L-BFGS),
mixed with the head's class probabilities:

    p(class) = (1 - W) x softmax(head logits) + W x softmax(probe(mean(sentence)))

Joint training costs SST's head accuracy (the minBERT paper's negative
transfer, §5; here too a model trained on SST alone scores higher:
experiments/RESULTS.md, "SST specialists"), and the frozen encoder's view of
the sentence has not paid it. The probe's L2 strength was chosen by
cross-validation on SST train (PROBE_C); W = 0.5 is the simple mean, as for STS.
A task's probe is saved in every checkpoint (``<task>_prior.safetensors``), so a
checkpoint predicts without the training data; where a checkpoint has none,
it is fitted again from the task's training file (the fit is deterministic).

The encoder is the prior's own (``--sts-prior-model`` / ``--sst-prior-model``; default: the
embedded all-MiniLM-L6-v2), not ``--pretrained``: the encoder a run fine-tunes
need not be a sentence encoder (bert-base, an MLM checkpoint of tasks/pretrain.py,
a fine-tuned run), and its view can be worse than the head it would be blended
with. A config.json written before these options is read with the values it was
scored with (tasks/config_versions.py), so saved runs re-predict as they were scored.

Usage:
    prior = CosinePrior("sts", None, 0.5, device, amp_dtype, batch_size=128, max_length=128)   # None: the embedded
    scores = prior.blend(sts_dataset, head_scores)      # (N,) in dataset order; prior(...) is the same
    probe = ProbePrior("sst", None, 0.5, device, train=(sentences, labels))   # or state=load_tensors(probe_file)
    logits = probe.blend(sst_dataset, head_logits)      # (N, 5) log of the mixed probabilities
    priors = RunPriors(cfg, run, device, amp_dtype)      # a run's (run: cfg.resolve()), each built at its first use
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from minbert.pretrained import holds_model, load_pretrained, resolve_model_dir
from tasks.options import spelled_flag
from tasks.data.datasets import SentenceDataset, length_bucketed_batches, move_batch
from tasks.data.readers import DataFileMissing, Example
from tasks.run_tasks import RunTasks
from tasks.selection import load_examples
from tasks.task import Task, get_task
from tasks.checkpoint import prior_file
from tasks.storage import load_tensors
from tasks.runtime import autocast

# A probe's inverse L2 strength, in scikit-learn's convention (C x the summed loss + ||W||^2 / 2): the
# best of C in 0.03, 0.1, 0.2, 0.3, 0.5 by 5-fold cross-validation on SST train (the embedded MiniLM's embeddings;
# experiments/RESULTS.md, "Design choices measured once").
PROBE_C = 0.2


logger = logging.getLogger(__name__)


_LOADED: dict[tuple[str, str], tuple[torch.nn.Module, object]] = {}  # the latest frozen encoder, by (dir, device)


def frozen_encoder(pretrained: str | None, device: torch.device | str) -> tuple[torch.nn.Module, object]:
    """(encoder, tokenizer) of ``pretrained`` in eval mode without gradients, on ``device``. The latest one is
    kept: the STS and SST priors of a run (both the embedded MiniLM by default) share one copy."""
    key = (str(resolve_model_dir(pretrained)), str(torch.device(device)))
    if key not in _LOADED:
        # Building the modules draws their random init before the weights replace it: on a forked RNG, so a
        # run's dropout masks do not depend on when (or whether, after a resume) this process built its prior.
        with torch.random.fork_rng(devices=[]):
            encoder, tokenizer = load_pretrained(pretrained, add_pooling_layer=False)
        _LOADED.clear()
        _LOADED[key] = (encoder.to(device).eval().requires_grad_(False), tokenizer)
    return _LOADED[key]


class FrozenEncoder:
    """A sentence encoder used as it is: unit-length mean-pooled embeddings, no gradients, its own tokenizer."""

    def __init__(self, pretrained: str | None, weight: float, device: torch.device | str,
                 amp_dtype: torch.dtype | None = None, batch_size: int = 128, max_length: int | None = 128) -> None:
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"the prior's weight must be in (0, 1], got {weight}")
        self.encoder, self.tokenizer = frozen_encoder(pretrained, device)
        self.weight, self.device, self.amp = weight, torch.device(device), amp_dtype
        self.batch_size, self.max_length = batch_size, max_length
        self._cache: dict[tuple, torch.Tensor] = {}  # the latest dataset's sentences -> its values

    def _latest(self, sentences: tuple, compute) -> torch.Tensor:
        """``compute()``, the values of ``sentences``, cached for the latest sentences only: a run's dev sets are
        scored every epoch and again, as new datasets of the same sentences, by its final predictions; a Predictor
        makes a new dataset per call and must not grow a cache without bound."""
        if sentences not in self._cache:
            self._cache = {sentences: compute()}
        return self._cache[sentences]

    @torch.no_grad()
    def embed(self, texts: list[str]) -> torch.Tensor:
        """Unit-length mean-pooled embeddings (N, H), float32 on the CPU, in input order."""
        ds = SentenceDataset([Example(str(i), t) for i, t in enumerate(texts)], self.tokenizer,
                             max_length=self.max_length)
        out = torch.empty(len(ds), self.encoder.config.hidden_size)
        for indices in length_bucketed_batches(ds.lengths, self.batch_size, shuffle=False):
            batch = move_batch(ds.collate(indices), self.device)
            with autocast(self.device, self.amp):
                h = self.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                 token_type_ids=batch["token_type_ids"])["last_hidden_state"]
            m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)  # (B, T, 1)
            out[indices] = F.normalize(((h * m).sum(1) / m.sum(1).clamp_min(1.0)).float(), dim=-1).cpu()
        return out


class CosinePrior(FrozenEncoder):
    """The frozen encoder's cosine on a pair regression's scale (STS: 5 x cosine), blended into its scores with weight
    ``weight``."""

    def __init__(self, task: str | Task, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.task = get_task(task)

    def cosines(self, dataset) -> torch.Tensor:
        """(N,) cosine of each pair of a tasks.data.datasets.PairDataset (its ``texts``); cached for the latest
        dataset."""
        a, b = dataset.texts
        return self._latest((tuple(a), tuple(b)), lambda: (self.embed(a) * self.embed(b)).sum(-1))

    def blend(self, dataset, scores: torch.Tensor) -> torch.Tensor:
        """(1 - weight) x ``scores`` + weight x the cosine on the task's scale, per pair of ``dataset`` (scores in
        dataset order)."""
        low, high = self.task.score_range
        cosines = self.cosines(dataset).to(scores.device, scores.dtype)
        prior = self.task.kind.scaled(self.task, cosines, high - low)
        return (1.0 - self.weight) * scores + self.weight * prior

    __call__ = blend  # the ``prior(dataset, scores)`` that tasks.evaluation.evaluator.predict_dataset takes


def check_prior_models(cfg, run: RunTasks) -> None:
    """The sentence encoders of the priors a run or an evaluation uses (``cfg``: a tasks.train_config.TrainConfig;
    ``run``: its resolution) exist: refused before any work, naming what sets them, not found missing at the
    first evaluation."""
    for task, prior in run.priors.items():
        if prior.model is None:
            continue
        where = _where(cfg, run.entries[task], "model", prior.model)
        try:
            found = resolve_model_dir(prior.model)
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(f"{where}: no such checkpoint directory (a sentence encoder: config.json, weights, "
                                    f"vocab.txt): name another, or {_off(run.entries[task])}") from None
        if not holds_model(found):
            raise FileNotFoundError(f"{where}: {found} holds no sentence encoder (config.json, weights, vocab.txt): "
                                    f"name another, or {_off(run.entries[task])}")


def _where(cfg, task: Task, what: str, value: object) -> str:
    """What set a task's prior's ``what`` ("weight", "model") to ``value``: the run's per-task setting (its flag:
    --sst-prior 0.5, --prior-weights mood=0.5) where it names the task or no task file declares it, else the task
    file."""
    from tasks.train_config import TrainConfig  # the flag of a setting (the config imports this module's callers)
    path = {"weight": "prior_weights", "model": "prior_models"}[what]
    if task.name in getattr(cfg, path) or not task.origin.get("file"):
        return spelled_flag(TrainConfig, path, task.name, str(value))
    return f"task file {task.origin['file']}'s \"prior\" {what} {value}"


def _off(task: Task) -> str:
    from tasks.train_config import TrainConfig
    return f"pass {spelled_flag(TrainConfig, 'prior_weights', task.name, '0')}"


def fit_logistic_regression(x: torch.Tensor, y: torch.Tensor, num_classes: int, c: float = PROBE_C,
                            sample_weight: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Multinomial logistic regression with scikit-learn's objective, C x sum of cross-entropies + ||W||^2 / 2
    (the bias not penalized), minimized by full-batch L-BFGS in float64 (deterministic on the CPU).

    x (N, H) features, y (N,) class indices; ``sample_weight`` (N,) multiplies each example's cross-entropy, as
    scikit-learn's. Returns {"weight": (num_classes, H), "bias": (num_classes,)}, float32 on the CPU.
    """
    x = x.detach().to("cpu", torch.float64)
    y = y.detach().to("cpu", torch.long)
    w = None if sample_weight is None else sample_weight.detach().to("cpu", torch.float64)
    weight = torch.zeros(num_classes, x.shape[1], dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
    # The objective divided by C x N (the same minimizer, better scaled): mean cross-entropy + ||W||^2 / (2 C N);
    # with sample weights, N is their sum.
    penalty = 1.0 / (2.0 * c * (len(x) if w is None else w.sum().item()))
    opt = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=1000, history_size=20, tolerance_grad=1e-9,
                            tolerance_change=1e-12, line_search_fn="strong_wolfe")

    def cross_entropy(logits: torch.Tensor) -> torch.Tensor:
        if w is None:
            return F.cross_entropy(logits, y)
        return (F.cross_entropy(logits, y, reduction="none") * w).sum() / w.sum()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = cross_entropy(x @ weight.T + bias) + penalty * weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return {"weight": weight.detach().float(), "bias": bias.detach().float()}


class ProbePrior(FrozenEncoder):
    """A linear probe on the frozen encoder's sentence embeddings, mixed into a sentence classification's class
    probabilities with weight ``weight``. Built from ``train`` = (sentences, labels 0..C-1), fitting the probe, or
    from ``state`` (a saved probe: ``state_dict()``, ``prior_file(task)``)."""

    def __init__(self, task: str | Task, pretrained: str | None, weight: float, device: torch.device | str,
                 amp_dtype: torch.dtype | None = None, batch_size: int = 128, max_length: int | None = 128, *,
                 train: tuple[list[str], list[int]] | None = None, state: dict[str, torch.Tensor] | None = None
                 ) -> None:
        if (train is None) == (state is None):
            raise ValueError("a ProbePrior is built from its training sentences or from a saved probe: give exactly "
                             "one of train and state")
        super().__init__(pretrained, weight, device, amp_dtype, batch_size, max_length)
        self.task = get_task(task)
        num_classes = self.task.num_classes
        if state is None:
            texts, labels = train
            state = fit_logistic_regression(self.embed(list(texts)), torch.as_tensor(labels), num_classes)
        hidden = self.encoder.config.hidden_size
        if set(state) != {"weight", "bias"} or tuple(state["weight"].shape) != (num_classes, hidden) \
                or tuple(state["bias"].shape) != (num_classes,):
            raise ValueError(f"the {self.task.name} prior's probe must be weight ({num_classes}, {hidden}) and bias "
                             f"({num_classes},) for this encoder, got "
                             + ", ".join(f"{k} {tuple(v.shape)}" for k, v in state.items()))
        self.probe = {k: v.detach().to("cpu", torch.float32) for k, v in state.items()}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.probe)

    def probabilities(self, dataset) -> torch.Tensor:
        """(N, C) the probe's class probabilities for each sentence of a tasks.data.datasets.SentenceDataset (its
        ``texts``); cached for the latest dataset."""
        texts = dataset.texts
        return self._latest(tuple(texts), lambda: (self.embed(texts) @ self.probe["weight"].T
                                                   + self.probe["bias"]).softmax(-1))

    def blend(self, dataset, logits: torch.Tensor) -> torch.Tensor:
        """log((1 - weight) x softmax(``logits``) + weight x the probe's probabilities), (N, C) in dataset order:
        logits whose softmax is the mixture (tasks.evaluation.ensembling averages members' softmax, so an ensemble of
        blended members is the mixture of their mean and the probe)."""
        prior = self.probabilities(dataset).to(logits.device, torch.float32)
        return torch.log((1.0 - self.weight) * logits.float().softmax(-1) + self.weight * prior)

    __call__ = blend  # the ``prior(dataset, logits)`` that tasks.evaluation.evaluator.predict_dataset takes


def prior_of(task: str, cfg, run: RunTasks, device: torch.device | str, amp_dtype: torch.dtype | None,
             checkpoint: str | Path | None = None, train: tuple[list[str], list[int]] | None = None
             ) -> CosinePrior | ProbePrior | None:
    """``task``'s prior in ``run`` (its resolution: ``RunTasks.priors``; ``cfg``: its evaluation's batch size and
    length, its data), or None when it has none (or weight 0). A probe: the one saved in ``checkpoint`` when that
    holds one, else fitted on the task's training sentences: ``train`` (sentences, labels) when the caller has read
    them, else read from its training file."""
    prior = run.priors.get(task)
    if prior is None:
        return None
    entry = run.entries[task]
    args = (prior.model, prior.weight, device, amp_dtype, cfg.eval_batch_size, cfg.max_length)
    if prior.kind == "cosine":
        return CosinePrior(entry, *args)
    saved = Path(checkpoint) / prior_file(task) if checkpoint is not None else None
    if saved is not None and saved.is_file():
        return ProbePrior(entry, *args, state=load_tensors(saved))
    if train is None:
        try:
            examples = load_examples(task, "train", cfg)
        except DataFileMissing as e:
            raise FileNotFoundError(f"the {task} prior ({_where(cfg, entry, 'weight', prior.weight)}) is a "
                                    f"probe fitted on {task}'s training sentences, and there is no training file at "
                                    f"{e.path}: point --data-dir at the data, or {_off(entry)}") from None
        train = ([e.text_a for e in examples], [int(e.label) for e in examples])
    t0 = time.perf_counter()
    probe = ProbePrior(entry, *args, train=train)
    logger.info("%s prior: a probe on %s fitted to %d training sentences in %.0f s", task, prior.model or
                "the embedded all-MiniLM-L6-v2", len(train[0]), time.perf_counter() - t0)
    return probe


class RunPriors:
    """A run's priors by task, each built the first time it is asked for (rank 0, at the first evaluation; None
    when the task has none). A probe comes from ``checkpoint`` when that holds one (a resumed run: set it to the
    checkpoint resumed from), else it is fitted, on ``probe_train[task]`` (the task's training sentences and
    labels) when given; ``states`` puts it in every checkpoint written after that."""

    def __init__(self, cfg, run: RunTasks, device: torch.device | str, amp_dtype: torch.dtype | None,
                 probe_train: dict[str, tuple[list[str], list[int]]] | None = None) -> None:
        self.run, self.cfg, self.device, self.amp = run, cfg, device, amp_dtype
        self.probe_train = dict(probe_train or {})
        self.checkpoint: Path | None = None
        self._built: dict[str, CosinePrior | ProbePrior | None] = {}

    def get(self, task: str) -> CosinePrior | ProbePrior | None:
        """``task``'s prior, built at the first ask."""
        if task not in self._built:
            self._built[task] = prior_of(task, self.cfg, self.run, self.device, self.amp, self.checkpoint,
                                         self.probe_train.get(task))
        return self._built[task]

    def build(self) -> None:
        """Every task's prior now (otherwise each is built at its first use)."""
        for task in self.run.tasks:
            self.get(task)

    def states(self) -> dict[str, dict[str, torch.Tensor]]:
        """The probes' tensors once each exists, by task (a checkpoint saves them: tasks/checkpoint.py)."""
        return {task: p.state_dict() for task, p in self._built.items() if isinstance(p, ProbePrior)}
