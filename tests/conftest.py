"""Shared fixtures: the packaged MiniLM loaded once; deterministic seeds."""

from __future__ import annotations

import pytest
import torch
import transformers


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped where CUDA is not available (the only skips this suite should show)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu: needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def minilm():
    """(our model, our tokenizer, transformers' model) on the packaged MiniLM weights, eval mode."""
    from minbert.pretrained import load_pretrained, resolve_model_dir

    ours, tok = load_pretrained()
    ref = transformers.BertModel.from_pretrained(str(resolve_model_dir(None)), attn_implementation="eager")
    return ours.eval(), tok, ref.eval()


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """One intra-op thread for tiny-model tests: two threads cost more in synchronization than
    they save, and on a shared 2-core machine two spinning OpenMP threads run ~5x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
