"""Shared fixtures: the packaged MiniLM loaded once; deterministic seeds."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def minilm():
    """(our model, our tokenizer, transformers' model) on the packaged MiniLM weights, eval mode."""
    transformers = pytest.importorskip("transformers")
    from minbert.pretrained import load_pretrained, resolve_model_dir

    ours, tok = load_pretrained()
    ref = transformers.BertModel.from_pretrained(str(resolve_model_dir(None)), attn_implementation="eager")
    return ours.eval(), tok, ref.eval()


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
