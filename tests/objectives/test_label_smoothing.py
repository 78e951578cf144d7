"""tasks/objectives/label_smoothing.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tasks.model import PHRASES
from tasks.objectives import build_objectives
from tasks.objectives.label_smoothing import smoothing_distribution, smoothing_loss
from tests.helpers import make_batch, make_model


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.35])
def test_uniform_smoothing_through_the_trainers_sum_equals_torchs_label_smoothing(eps):
    """task_loss_scale x the head's CE + term_weight x the term: torch's cross_entropy(label_smoothing=ε)."""
    model = make_model("b1", "cross")
    obj = build_objectives({"label_smoothing": {"weight": eps}}, model)[0]
    batch = make_batch("sst")
    out = model("sst", batch)
    terms = obj(model, "sst", batch, out)
    total = obj.task_loss_scale * model.task_loss("sst", out, batch) + obj.term_weight("smooth") * terms["smooth"]
    torch.testing.assert_close(total, F.cross_entropy(out.logits, batch["labels"], label_smoothing=eps))


def test_neighbours_put_the_mass_next_to_the_gold_class_and_sum_to_one():
    u = smoothing_distribution(torch.tensor([0, 2, 4, 1]), 5, "neighbours")
    expected = torch.tensor([[0, 1, 0, 0, 0], [0, .5, 0, .5, 0], [0, 0, 0, 1, 0], [.5, 0, .5, 0, 0]])
    torch.testing.assert_close(u, expected)
    logits = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(smoothing_loss(logits, torch.tensor([0, 2, 4, 1]), "neighbours"),
                               -(expected * logits.log_softmax(-1)).sum(-1).mean())


def test_it_smooths_the_sst_heads_streams_and_refuses_others_and_bad_values():
    model = make_model("b1", "cross")
    obj = build_objectives({"label_smoothing": {}}, model)[0]
    assert obj.applies_to("sst") and obj.applies_to(PHRASES) and not obj.applies_to("para")
    for bad in ({"weight": 1.0}, {"weight": -0.1}, {"to": "far"}, {"tasks": ["para"]}):
        with pytest.raises(ValueError, match="label_smoothing"):
            build_objectives({"label_smoothing": bad}, model)
