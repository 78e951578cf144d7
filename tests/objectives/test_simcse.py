"""tasks/objectives/simcse.py."""

from __future__ import annotations

import math

import pytest
import torch

from tasks.objectives import build_objectives
from tasks.objectives.simcse import simcse_loss
from tests.helpers import siamese_batch as make_batch
from tests.helpers import siamese_model as tiny_model


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
