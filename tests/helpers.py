"""Test helpers: a tiny random config and real sentences from data/."""

from __future__ import annotations

import csv
import zlib
from pathlib import Path

import pytest
import torch

from minbert.config import BertConfig

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"


def tiny_config(**overrides) -> BertConfig:
    """HF's test-size BERT: hidden 32, 2 layers, 4 heads, vocab 99."""
    kw = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=37, max_position_embeddings=64, type_vocab_size=2)
    kw.update(overrides)
    return BertConfig(**kw)


def read_column(name: str, columns: tuple[str, ...], n: int) -> list[tuple[str, ...]]:
    """First n rows of a data/ file (tab-separated), or skip when setup.sh has not linked it."""
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{path} missing: run `bash setup.sh` to link the data files")
    with open(path, newline="", encoding="utf-8") as f:
        rows = [tuple(r[c].strip() for c in columns) for r in csv.DictReader(f, delimiter="\t")]
    return rows[:n]


class WordTokenizer:
    """Whitespace 'tokenizer' whose ids fit tiny_config's vocabulary of 99 (encode_ids / pad API)."""

    pad_token_id, cls_id, sep_id = 0, 2, 3

    def _words(self, text: str) -> list[int]:
        return [5 + zlib.crc32(w.encode()) % 90 for w in text.split()]

    def encode_ids(self, texts, pairs=None, max_length=None):
        all_ids, all_types = [], []
        for i, text in enumerate(texts):
            ids = [self.cls_id, *self._words(text), self.sep_id]
            types = [0] * len(ids)
            if pairs is not None:
                second = [*self._words(pairs[i]), self.sep_id]
                ids, types = ids + second, types + [1] * len(second)
            if max_length is not None:
                ids, types = ids[:max_length], types[:max_length]
            all_ids.append(ids)
            all_types.append(types)
        return all_ids, all_types

    def pad(self, ids, type_ids=None, pad_to=None):
        width = pad_to if pad_to is not None else max(len(x) for x in ids)
        out = {k: torch.zeros(len(ids), width, dtype=torch.long)
               for k in ("input_ids", "token_type_ids", "attention_mask")}
        for r, seq in enumerate(ids):
            out["input_ids"][r, : len(seq)] = torch.tensor(seq)
            out["attention_mask"][r, : len(seq)] = 1
            if type_ids is not None:
                out["token_type_ids"][r, : len(seq)] = torch.tensor(type_ids[r])
        return out
