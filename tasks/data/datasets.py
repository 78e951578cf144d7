"""Tokenized datasets for the multitask tasks, dynamic-padding collate, length buckets.

Datasets tokenize once up front; ``collate(indices)`` only pads, to the
longest sequence of the batch. The CSV readers live in tasks.data.readers.

Usage:
    examples, report = load_split("sst", "train", "data")   # tasks.task
    ds = SentenceDataset(examples, tokenizer, max_length=128)
    for indices in length_bucketed_batches(ds.lengths, 32, shuffle=True, generator=g):
        batch = move_batch(ds.collate(indices), device)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

import torch

from tasks.data.readers import Example, Triplet


class TokenizerLike(Protocol):
    """The part of minbert.tokenizer.BertTokenizer the datasets use."""

    pad_token_id: int

    def encode_ids(
        self, texts: list[str], pairs: list[str] | None = None, max_length: int | None = None
    ) -> tuple[list[list[int]], list[list[int]]]: ...

    def pad(
        self, ids: list[list[int]], type_ids: list[list[int]] | None = None, pad_to: int | None = None
    ) -> dict[str, torch.Tensor]: ...


def _labels_tensor(labels: Sequence[int | float | None], dtype: torch.dtype) -> torch.Tensor | None:
    present = [y is not None for y in labels]
    if not any(present):
        return None
    if not all(present):
        # Half-labeled data would silently train on a subset; a reader never produces it.
        raise ValueError(f"{present.count(False)} of {len(labels)} examples lack a label; label all or none")
    return torch.tensor(labels, dtype=dtype)  # (N,)


class _TokenizedDataset(torch.utils.data.Dataset):
    """Common parts: example ids, labels, lengths, padding.

    Items are their own indices, so ``DataLoader(ds, batch_sampler=batches,
    collate_fn=ds.collate)`` works; the token ids live in the dataset and
    ``collate`` only pads.
    """

    ids: list[str]
    lengths: list[int]
    labels: torch.Tensor | None
    sequences_per_example = 1  # encoded sequences an example costs (a siamese pair 2, a triplet 3)

    def __init__(self, tokenizer: TokenizerLike, pad_to_multiple_of: int | None) -> None:
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be positive or None, got {pad_to_multiple_of}")
        self.tokenizer = tokenizer
        self.pad_to_multiple_of = pad_to_multiple_of

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> int:
        return index

    def padded_tokens(self, indices: Sequence[int]) -> int:
        """The tokens a batch of ``indices`` feeds the encoder, padding included (each sequence at the longest
        length): what a step costs, known before it runs (the run's time estimate, tasks.training.progress)."""
        n = len(self.lengths)  # a pair's index + n is the pair swapped (PairDataset.collate): the same length
        return len(indices) * max((self.lengths[i % n] for i in indices), default=0) * self.sequences_per_example

    def _pad(self, ids: list[list[int]], type_ids: list[list[int]], suffix: str = "") -> dict[str, torch.Tensor]:
        pad_to = None
        if self.pad_to_multiple_of is not None:
            # Tensor cores like widths that are multiples of 8; costs a few pad tokens.
            longest = max(len(x) for x in ids)
            pad_to = -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of
        padded = self.tokenizer.pad(ids, type_ids, pad_to=pad_to)
        return {f"{k}{suffix}": v for k, v in padded.items()}

    def _start_batch(self, indices: Sequence[int]) -> tuple[list[int], dict[str, object]]:
        idx = [int(i) for i in indices]
        if not idx:
            raise ValueError("collate got an empty batch")
        batch: dict[str, object] = {"ids": [self.ids[i] for i in idx]}
        if self.labels is not None:
            batch["labels"] = self.labels[idx]  # (B,)
        return idx, batch


class SentenceDataset(_TokenizedDataset):
    """Single sentences (SST, CFIMDB), tokenized once.

    Batch keys: ids (list[str]), input_ids, attention_mask, token_type_ids
    (B, T) long, labels (B,) of ``label_dtype`` (absent when unlabeled).
    """

    def __init__(
        self,
        examples: Sequence[Example],
        tokenizer: TokenizerLike,
        max_length: int | None = None,
        label_dtype: torch.dtype = torch.long,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        super().__init__(tokenizer, pad_to_multiple_of)
        self.ids = [e.id for e in examples]
        self.texts = [e.text_a for e in examples]  # the raw sentences (a sentence encoder's prior reads them)
        self.input_ids, self.type_ids = tokenizer.encode_ids(self.texts, max_length=max_length)
        self.labels = _labels_tensor([e.label for e in examples], label_dtype)
        self.lengths = [len(x) for x in self.input_ids]

    def collate(self, indices: Sequence[int]) -> dict[str, object]:
        idx, batch = self._start_batch(indices)
        batch.update(self._pad([self.input_ids[i] for i in idx], [self.type_ids[i] for i in idx]))
        return batch


class PairDataset(_TokenizedDataset):
    """Sentence pairs (Quora, STS), tokenized once.

    mode="siamese": each side encoded alone; batch keys input_ids_1,
    attention_mask_1, token_type_ids_1 and the same with _2.
    mode="cross": one "[CLS] a [SEP] b [SEP]" encoding with token types 0/1;
    batch keys input_ids, attention_mask, token_type_ids.
    Both add ids and labels (float by default: BCE targets for Quora, scores
    for STS). ``lengths`` is the longer side for siamese, the pair for cross.

    Index ``i + len(ds)`` is pair ``i`` with its sentences swapped, (b, a):
    the schedule's order augmentation and evaluation's both-orders score use
    it (Quora and STS labels do not depend on the order). A cross dataset
    tokenizes the swapped sequences the first time one is asked for.
    """

    def __init__(
        self,
        examples: Sequence[Example],
        tokenizer: TokenizerLike,
        mode: Literal["siamese", "cross"] = "siamese",
        max_length: int | None = None,
        label_dtype: torch.dtype = torch.float32,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        if mode not in ("siamese", "cross"):
            raise ValueError(f"mode must be 'siamese' or 'cross', got {mode!r}")
        no_pair = [e.id for e in examples if e.text_b is None]
        if no_pair:
            raise ValueError(f"{len(no_pair)} examples have no second sentence (first: {no_pair[0]!r})")
        super().__init__(tokenizer, pad_to_multiple_of)
        self.mode = mode
        self.sequences_per_example = 2 if mode == "siamese" else 1
        self.max_length = max_length
        self.ids = [e.id for e in examples]
        self.texts = a, b = [e.text_a for e in examples], [e.text_b for e in examples]
        self._swapped: tuple[list[list[int]], list[list[int]]] | None = None
        if mode == "siamese":
            self.input_ids_1, self.type_ids_1 = tokenizer.encode_ids(a, max_length=max_length)
            self.input_ids_2, self.type_ids_2 = tokenizer.encode_ids(b, max_length=max_length)
            self.lengths = [max(len(x), len(y)) for x, y in zip(self.input_ids_1, self.input_ids_2)]
        else:
            self.input_ids, self.type_ids = tokenizer.encode_ids(a, pairs=b, max_length=max_length)
            self.lengths = [len(x) for x in self.input_ids]
        self.labels = _labels_tensor([e.label for e in examples], label_dtype)

    def collate(self, indices: Sequence[int]) -> dict[str, object]:
        n = len(self.ids)
        idx = [int(i) for i in indices]
        bad = [i for i in idx if not 0 <= i < 2 * n]
        if bad:
            raise IndexError(f"pair index {bad[0]} out of range: {n} pairs, {2 * n} with the swapped ones")
        pairs, batch = self._start_batch([i % n for i in idx])
        swapped = [i >= n for i in idx]
        if self.mode == "siamese":
            sides = ((self.input_ids_1, self.type_ids_1), (self.input_ids_2, self.type_ids_2))
            for k, suffix in enumerate(("_1", "_2")):
                chosen = [sides[k ^ s] for s in swapped]  # side k, or the other side of a swapped pair
                batch.update(self._pad([ids[i] for (ids, _), i in zip(chosen, pairs)],
                                       [types[i] for (_, types), i in zip(chosen, pairs)], suffix))
        else:
            rev_ids, rev_types = self._swapped_cross() if any(swapped) else ([], [])
            batch.update(self._pad([(rev_ids if s else self.input_ids)[i] for s, i in zip(swapped, pairs)],
                                   [(rev_types if s else self.type_ids)[i] for s, i in zip(swapped, pairs)]))
        return batch

    def _swapped_cross(self) -> tuple[list[list[int]], list[list[int]]]:
        """Token and type ids of every "[CLS] b [SEP] a [SEP]", tokenized on first use."""
        if self._swapped is None:
            a, b = self.texts
            self._swapped = self.tokenizer.encode_ids(b, pairs=a, max_length=self.max_length)
        return self._swapped


class TripletDataset(_TokenizedDataset):
    """NLI triplets, tokenized once: _1 anchor, _2 positive, _3 hard negative.

    The _3 keys appear only when every triplet of the batch has a negative, so
    an objective can rely on them being complete. ids are the row positions.
    """

    def __init__(
        self,
        triplets: Sequence[Triplet],
        tokenizer: TokenizerLike,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        super().__init__(tokenizer, pad_to_multiple_of)
        self.ids = [str(i) for i in range(len(triplets))]
        self.labels = None
        self.sequences_per_example = 3
        self.input_ids_1, self.type_ids_1 = tokenizer.encode_ids([t.anchor for t in triplets], max_length=max_length)
        self.input_ids_2, self.type_ids_2 = tokenizer.encode_ids([t.positive for t in triplets], max_length=max_length)
        have_neg = [i for i, t in enumerate(triplets) if t.negative is not None]
        neg_ids, neg_types = tokenizer.encode_ids([triplets[i].negative for i in have_neg], max_length=max_length)
        self.input_ids_3: list[list[int] | None] = [None] * len(triplets)
        self.type_ids_3: list[list[int] | None] = [None] * len(triplets)
        for i, ids, types in zip(have_neg, neg_ids, neg_types):
            self.input_ids_3[i], self.type_ids_3[i] = ids, types
        self.lengths = [
            max(len(a), len(p), len(n) if n is not None else 0)
            for a, p, n in zip(self.input_ids_1, self.input_ids_2, self.input_ids_3)
        ]

    def collate(self, indices: Sequence[int]) -> dict[str, object]:
        idx, batch = self._start_batch(indices)
        batch.update(self._pad([self.input_ids_1[i] for i in idx], [self.type_ids_1[i] for i in idx], "_1"))
        batch.update(self._pad([self.input_ids_2[i] for i in idx], [self.type_ids_2[i] for i in idx], "_2"))
        if all(self.input_ids_3[i] is not None for i in idx):
            batch.update(self._pad([self.input_ids_3[i] for i in idx], [self.type_ids_3[i] for i in idx], "_3"))
        return batch


def move_batch(batch: dict[str, object], device: torch.device | str) -> dict[str, object]:
    """Tensors to ``device`` (non_blocking, overlaps with compute from pinned memory); other values as they are."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def length_bucketed_batches(
    lengths: Sequence[int],
    batch_size: int,
    shuffle: bool,
    generator: torch.Generator | None = None,
    bucket_batches: int = 50,
) -> list[list[int]]:
    """Batches of indices in which examples of similar length share a batch.

    shuffle=True (training): random permutation; within each chunk of
    ``bucket_batches * batch_size`` examples sort by length and cut into
    batches; then shuffle the batch order. The batches stay random in
    composition across chunks and epochs but carry far less padding.
    ``bucket_batches=1`` is plain random batching. ``generator=None`` uses
    torch's global RNG.

    shuffle=False (evaluation): all indices sorted by length, longest first
    (ties by index, so deterministic); callers restore the file order through
    the batch "ids". Every index appears exactly once either way.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if bucket_batches < 1:
        raise ValueError(f"bucket_batches must be at least 1 (1 = no bucketing), got {bucket_batches}")
    n = len(lengths)
    if not shuffle:
        order = sorted(range(n), key=lambda i: (-lengths[i], i))
        return [order[s : s + batch_size] for s in range(0, n, batch_size)]
    perm = torch.randperm(n, generator=generator).tolist()
    chunk = bucket_batches * batch_size
    batches: list[list[int]] = []
    for c in range(0, n, chunk):
        # Chunks are a whole number of batches, so only the very last batch can be short.
        part = sorted(perm[c : c + chunk], key=lambda i: lengths[i]) if bucket_batches > 1 else perm[c : c + chunk]
        batches.extend(part[s : s + batch_size] for s in range(0, len(part), batch_size))
    order = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in order]
