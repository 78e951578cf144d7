"""Masked-LM pretraining's own pieces: BERT's masking, the masking collator and the MLM loss on the training loop.

The MLM head and the ``BertForMaskedLM`` model are the encoder's (minbert/mlm.py). Pretraining runs them on the
one training loop (tasks/training/trainer.py, assembled in tasks/training/pretraining.py), as Hugging Face's
run_mlm.py runs a masking collator on its ``Trainer``:

- BERT's masking (``mask_tokens``, Devlin et al. 2019 §3.1): 15% of the tokens
  chosen, never [CLS], [SEP], [PAD], [UNK] nor [MASK]; 80% of those become
  [MASK], 10% a random token, 10% stay;
- ``MaskingCollator``: the tokenized sentences, each epoch's length-bucketed
  batches in a fresh shuffle, and each batch padded and masked afresh as it is
  collated (dynamic masking); shuffles and masks come from one seeded generator,
  in step order, whose state a checkpoint keeps;
- the loss (``masked_lm_loss``): cross-entropy over the masked positions only,
  the vocabulary projection run on those positions alone;
- fixed held-out batches (``make_eval_batches``: the same masks before and after)
  and their loss and accuracy (``evaluate_mlm``).

Usage:
    collator = MaskingCollator(tokenizer, sentences, max_length=128, batch_size=32, mlm_probability=0.15, seed=0)
    for indices in collator.epoch_batches():
        loss = masked_lm_loss(mlm, move_batch(collator.collate(indices), device))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minbert.mlm import IGNORE_INDEX, BertForMaskedLM, masked_positions
from minbert.tokenizer import BertTokenizer
from tasks.data.datasets import length_bucketed_batches
from tasks.runtime import autocast, autocast_dtype, decode_state, encode_state


def never_masked_ids(tokenizer: BertTokenizer) -> list[int]:
    """[PAD], [CLS], [SEP], and [UNK] / [MASK] (HF's collator never masks special tokens either)."""
    return sorted({tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id,
                   tokenizer.unk_token_id, tokenizer.mask_token_id})


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    mask_token_id: int,
    vocab_size: int,
    special_ids: Sequence[int],
    generator: torch.Generator | None = None,
    mlm_probability: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: returns (masked input_ids, labels), both (B, T) long, on the input's device.

    Each token not in ``special_ids`` is chosen with probability
    ``mlm_probability``; a chosen token becomes [MASK] (80%), a random token
    that is not special (10%), or stays (10%). ``labels`` holds the original
    id at chosen positions and -100 elsewhere. When a batch would have no
    chosen token at all (a few very short sentences), one eligible token is
    chosen so the loss is defined. Random draws come from ``generator``
    (CPU), so a seed fixes the masks.
    """
    if not 0.0 < mlm_probability < 1.0:
        raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
    device = input_ids.device
    ids = input_ids.cpu()
    special = torch.tensor(list(special_ids), dtype=torch.long)
    eligible = ~torch.isin(ids, special)  # (B, T)
    chosen = (torch.rand(ids.shape, generator=generator) < mlm_probability) & eligible
    if not chosen.any() and eligible.any():
        flat = eligible.reshape(-1).nonzero().squeeze(1)
        pick = flat[torch.randint(len(flat), (1,), generator=generator)]
        chosen.view(-1)[pick] = True
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
    action = torch.rand(ids.shape, generator=generator)  # < 0.8 mask, < 0.9 random, else keep
    to_mask = chosen & (action < 0.8)
    to_random = chosen & (action >= 0.8) & (action < 0.9)
    masked = ids.clone()
    masked[to_mask] = mask_token_id
    n_random = int(to_random.sum())
    if n_random:
        allowed = torch.ones(vocab_size, dtype=torch.bool)
        allowed[special[special < vocab_size]] = False
        pool = allowed.nonzero().squeeze(1)  # (V',) non-special ids
        masked[to_random] = pool[torch.randint(len(pool), (n_random,), generator=generator)]
    return masked.to(device), labels.to(device)


class MaskingCollator:
    """The MLM's training data: tokenized sentences (``max_length`` tokens at most, [CLS]/[SEP] included), their
    batches of ``batch_size`` for each epoch (``epoch_batches``: length-bucketed, reshuffled), and each batch padded
    and masked as it is collated (``collate``).

    Shuffles and masks are drawn in turn from one generator seeded by ``seed``, so an epoch's batches depend on the
    masks of the epochs before: call ``epoch_batches`` once per epoch, in order, and collate in step order (no
    prefetching). ``state`` / ``load_state`` carry the generator through a checkpoint: after ``load_state`` the next
    ``epoch_batches`` draws the interrupted epoch's batches again, and the masks go on where they stopped.
    """

    def __init__(self, tokenizer: BertTokenizer, sentences: Sequence[str], *, max_length: int, batch_size: int,
                 mlm_probability: float, seed: int) -> None:
        self.tokenizer, self.batch_size, self.mlm_probability = tokenizer, batch_size, mlm_probability
        self.ids, _ = tokenizer.encode_ids(list(sentences), max_length=max_length)
        self.lengths = [len(x) for x in self.ids]
        self.special = never_masked_ids(tokenizer)
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch_start: torch.Tensor | None = None  # the generator's state when the current epoch was drawn
        self._redraw: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.ids) / self.batch_size)

    def epoch_batches(self) -> list[list[int]]:
        """The next epoch's batches of sentence indices (after ``load_state``: the interrupted epoch's again)."""
        g = self.generator
        if self._redraw is not None:
            now = g.get_state()
            g.set_state(self._redraw)
            batches = length_bucketed_batches(self.lengths, self.batch_size, shuffle=True, generator=g)
            g.set_state(now)
            self.epoch_start, self._redraw = self._redraw, None
            return batches
        self.epoch_start = g.get_state()
        return length_bucketed_batches(self.lengths, self.batch_size, shuffle=True, generator=g)

    def collate(self, indices: Sequence[int]) -> dict[str, object]:
        """The sentences ``indices`` padded and masked: input_ids (masked), attention_mask, labels (-100 where not
        masked), positions (the masked ones, flat: found here on the CPU, so the loss needs no host read) and
        tokens (the real tokens, for the log's speed)."""
        padded = self.tokenizer.pad([self.ids[j] for j in indices])
        inputs, labels = mask_tokens(padded["input_ids"], mask_token_id=self.tokenizer.mask_token_id,
                                     vocab_size=len(self.tokenizer), special_ids=self.special,
                                     generator=self.generator, mlm_probability=self.mlm_probability)
        return {"input_ids": inputs, "attention_mask": padded["attention_mask"], "labels": labels,
                "positions": masked_positions(labels), "tokens": int(padded["attention_mask"].sum())}

    def state(self) -> dict[str, str]:
        """The generator's state now and at the current epoch's start, as text for state.json."""
        now = self.generator.get_state()
        return {"generator": encode_state(now),
                "epoch_generator": encode_state(self.epoch_start if self.epoch_start is not None else now)}

    def load_state(self, state: dict[str, str]) -> None:
        self.generator.set_state(decode_state(state["generator"]))
        self._redraw = decode_state(state["epoch_generator"])


def masked_lm_loss(mlm: BertForMaskedLM, batch: dict) -> torch.Tensor:
    """The MLM loss of a collated batch (``MaskingCollator.collate``) on its device: mean cross-entropy over the
    masked positions (``BertForMaskedLM.masked_lm_loss``)."""
    loss, _, _ = mlm.masked_lm_loss(batch["input_ids"], batch["attention_mask"], batch["labels"], batch["positions"])
    return loss


@dataclass
class MaskedBatches:
    """Pre-tokenized, pre-masked batches: a fixed evaluation set (same masks before and after)."""

    batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # (input_ids, attention_mask, labels)
    n_sentences: int


def make_eval_batches(tokenizer: BertTokenizer, sentences: Sequence[str], max_length: int, batch_size: int,
                      seed: int, mlm_probability: float = 0.15) -> MaskedBatches:
    ids, _ = tokenizer.encode_ids(list(sentences), max_length=max_length)
    lengths = [len(x) for x in ids]
    g = torch.Generator().manual_seed(seed)
    special = never_masked_ids(tokenizer)
    batches = []
    for idx in length_bucketed_batches(lengths, batch_size, shuffle=False):
        padded = tokenizer.pad([ids[i] for i in idx])
        inputs, labels = mask_tokens(padded["input_ids"], mask_token_id=tokenizer.mask_token_id,
                                     vocab_size=len(tokenizer), special_ids=special, generator=g,
                                     mlm_probability=mlm_probability)
        batches.append((inputs, padded["attention_mask"], labels))
    return MaskedBatches(batches, len(sentences))


@torch.no_grad()
def evaluate_mlm(mlm: BertForMaskedLM, data: MaskedBatches, device: str | torch.device = "cpu") -> dict[str, float]:
    """Masked-token loss (mean over masked tokens) and top-1 accuracy, in eval mode (no dropout)."""
    device = torch.device(device)
    amp_dtype = autocast_dtype(None, device, cpu_default=False)  # as without --bf16: comparable losses
    was_training = mlm.training
    mlm.eval()
    total_loss, correct, count = 0.0, 0, 0
    try:
        for inputs, attention_mask, labels in data.batches:
            with autocast(device, amp_dtype):
                _, logits, targets = mlm.masked_lm_loss(inputs.to(device), attention_mask.to(device), labels.to(device),
                                                        masked_positions(labels).to(device))
            total_loss += float(F.cross_entropy(logits.float(), targets, reduction="sum"))
            correct += int((logits.argmax(-1) == targets).sum())
            count += targets.numel()
    finally:
        mlm.train(was_training)
    return {"loss": total_loss / max(count, 1), "accuracy": correct / max(count, 1), "masked_tokens": count}
