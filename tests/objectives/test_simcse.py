"""tasks/objectives/simcse.py."""

from __future__ import annotations

import math

import pytest
import torch

from minbert.bert import BertModel
from tasks.model import ModelConfig, MultitaskBert
from tasks.objectives import build_objectives
from tasks.objectives.simcse import simcse_loss
from tests.helpers import tiny_config

B, T = 6, 7

def tiny_model(arch: str = "b1", dropout: float = 0.1) -> MultitaskBert:
    torch.manual_seed(0)
    enc = BertModel(tiny_config(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))
    return MultitaskBert(enc, ModelConfig(arch=arch, fcn_size=16, head_dropout=0.0))

def _seq(suffix: str, g: torch.Generator, n: int = B) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 99, (n, T), generator=g)
    mask = torch.ones(n, T, dtype=torch.long)
    mask[0, 4:] = 0  # one padded row: masking is exercised
    ids[mask == 0] = 0
    return {"input_ids" + suffix: ids, "attention_mask" + suffix: mask,
            "token_type_ids" + suffix: torch.zeros(n, T, dtype=torch.long)}

def make_batch(task: str, seed: int = 0) -> dict:
    """A hand-made collated batch with the data module's keys."""
    g = torch.Generator().manual_seed(seed)
    ids = [str(i) for i in range(B)]
    if task == "sst":
        return {**_seq("", g), "labels": torch.randint(0, 5, (B,), generator=g), "ids": ids}
    if task == "para":
        return {**_seq("_1", g), **_seq("_2", g), "labels": torch.tensor([1., 0., 1., 1., 0., 0.]), "ids": ids}
    if task == "sts":
        return {**_seq("_1", g), **_seq("_2", g), "labels": torch.rand(B, generator=g) * 5, "ids": ids}
    if task == "nli":
        return {**_seq("_1", g), **_seq("_2", g), **_seq("_3", g), "ids": ids}
    raise ValueError(task)

def _simcse_loops(z1: torch.Tensor, z2: torch.Tensor, temperature: float, similarity: str) -> float:
    n = z1.shape[0]

    def sim(u, v):
        d = float(u @ v)
        return d / (float(u.norm()) * float(v.norm())) if similarity == "cos" else d

    total = 0.0
    for i in range(n):
        logits = [sim(z1[i], z2[j]) / temperature for j in range(n)]
        m = max(logits)
        total += -(logits[i] - m - math.log(sum(math.exp(x - m) for x in logits)))
    return total / n

@pytest.mark.parametrize("similarity,temperature", [("cos", 0.05), ("dot", 1.0), ("dot", 0.5)])
def test_simcse_matches_explicit_loops(similarity, temperature):
    """simcse_loss equals the InfoNCE written with loops, for cosine and dot product."""
    g = torch.Generator().manual_seed(4)
    z1, z2 = torch.randn(2, 6, 8, generator=g, dtype=torch.float64).unbind(0)
    got = simcse_loss(z1, z2, temperature, similarity).item()
    assert got == pytest.approx(_simcse_loops(z1, z2, temperature, similarity), rel=1e-5)

def test_simcse_identical_views_small_temperature_is_zero():
    """Identical views of distinct sentences at a tiny temperature: the positive dominates, loss ~ 0."""
    z = torch.randn(8, 16, generator=torch.Generator().manual_seed(5))
    assert simcse_loss(z, z.clone(), temperature=1e-3).item() < 1e-6

def test_simcse_objective_encodes_each_side_twice():
    """The objective's views differ by dropout in train mode and coincide in eval mode (per side, averaged)."""
    model = tiny_model(dropout=0.1)
    batch = make_batch("sts")
    obj = build_objectives({"simcse": {}}, model)[0]
    model.eval()
    expected = torch.stack([
        simcse_loss(*(2 * [model.embed(batch["input_ids" + s], batch["attention_mask" + s],
                                       batch["token_type_ids" + s])]))
        for s in ("_1", "_2")]).mean()
    torch.testing.assert_close(obj(model, "sts", batch, None)["loss"], expected, rtol=1e-5, atol=1e-5)
    model.train()
    assert not torch.allclose(obj(model, "sts", batch, None)["loss"], expected)
