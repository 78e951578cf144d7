"""Test helpers: a tiny random config and real sentences from data/."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
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
