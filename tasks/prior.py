"""A sentence encoder as a second opinion on STS (``--sts-prior W``; not in the papers).

all-MiniLM-L6-v2 was trained so that the cosine of two sentences' mean-pooled
embeddings scores their similarity (sentence-transformers' recipe). Multitask
fine-tuning of a cross-encoder gives up that geometry: the fine-tuned encoder's
own Siamese cosine scores STS dev at r 0.54 (the default recipe, seed 0). So the
prior is a frozen copy of a sentence encoder, used only at evaluation:

    STS score = (1 - W) x the head's score + W x 5 x cos(mean(a), mean(b))

Both terms are on the 0-5 scale, so W = 0.5 is the simple mean of two models'
scores, as tasks.ensemble's "simple" method would take it: nothing is fitted.
It costs one more encoder in memory and one pass over the STS sentences (cached
per dataset), no training.

The encoder is ``--sts-prior-model`` (default: the embedded all-MiniLM-L6-v2),
not ``--pretrained``: the encoder a run fine-tunes need not be a sentence
encoder (bert-base, an MLM checkpoint of tasks/pretrain.py, a fine-tuned run),
and its cosine can score similarity worse than the head it would be blended
with. Configs written before the option existed keep ``--pretrained``'s
(tasks/config.py, LEGACY_SAME_AS), so saved runs re-predict as they were scored.

Usage:
    prior = CosinePrior(None, 0.5, device, amp_dtype, batch_size=128, max_length=128)   # None: the embedded
    scores = prior.blend(sts_dataset, head_scores)      # (N,) in dataset order; prior(...) is the same
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minbert.pretrained import load_pretrained, resolve_model_dir
from tasks.data import SentenceDataset, length_bucketed_batches, move_batch
from tasks.readers import Example
from tasks.runtime import autocast

STS_SCALE = 5.0  # cosine -> the 0-5 STS scale (paper §4.1's 5 x cosine)


class CosinePrior:
    """5 x cosine of the pretrained encoder's mean-pooled embeddings, blended into STS scores with weight ``weight``."""

    def __init__(self, pretrained: str | None, weight: float, device: torch.device | str,
                 amp_dtype: torch.dtype | None = None, batch_size: int = 128, max_length: int | None = 128) -> None:
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"the prior's weight must be in (0, 1], got {weight}")
        # Building the modules draws their random init before the weights replace it: on a forked RNG, so a
        # run's dropout masks do not depend on when (or whether, after a resume) this process built its prior.
        with torch.random.fork_rng(devices=[]):
            self.encoder, self.tokenizer = load_pretrained(pretrained, add_pooling_layer=False)
        self.encoder.to(device).eval().requires_grad_(False)
        self.weight, self.device, self.amp = weight, torch.device(device), amp_dtype
        self.batch_size, self.max_length = batch_size, max_length
        self._cache: dict[int, tuple[object, torch.Tensor]] = {}  # id(dataset) -> (dataset, cosines), the latest

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

    def cosines(self, dataset) -> torch.Tensor:
        """(N,) cosine of each pair of a tasks.data.PairDataset (its ``texts``). Cached for the latest dataset
        only (a run's dev set is scored every epoch; a Predictor makes a new dataset per call)."""
        key = id(dataset)
        if key not in self._cache:
            a, b = dataset.texts
            self._cache = {key: (dataset, (self.embed(a) * self.embed(b)).sum(-1))}
        return self._cache[key][1]

    def blend(self, dataset, scores: torch.Tensor) -> torch.Tensor:
        """(1 - weight) x ``scores`` + weight x 5 x cosine, per pair of ``dataset`` (scores in dataset order)."""
        prior = STS_SCALE * self.cosines(dataset).to(scores.device, scores.dtype)
        return (1.0 - self.weight) * scores + self.weight * prior

    __call__ = blend  # the ``sts_prior(dataset, scores)`` that tasks.evaluate.predict_dataset takes


def sts_prior_of(cfg, device: torch.device | str, amp_dtype: torch.dtype | None) -> CosinePrior | None:
    """The run's prior (``cfg.sts_prior`` > 0, a tasks.config.TrainConfig), or None."""
    if cfg.sts_prior <= 0 or "sts" not in cfg.tasks:
        return None
    try:
        resolve_model_dir(cfg.sts_prior_model)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"the STS prior (sts_prior {cfg.sts_prior}) blends with the sentence encoder "
                                f"{cfg.sts_prior_model}, which is gone: restore it, name another with "
                                "--sts-prior-model, or pass --sts-prior 0") from None
    return CosinePrior(cfg.sts_prior_model, cfg.sts_prior, device, amp_dtype, cfg.eval_batch_size, cfg.max_length)
