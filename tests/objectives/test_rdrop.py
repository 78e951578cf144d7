"""tasks/objectives/rdrop.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tasks.model import PHRASES
from tasks.objectives import build_objectives
from tests.helpers import make_batch, make_model


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(P ‖ Q), mean over the batch, by torch's kl_div (the reference)."""
    return F.kl_div(q_logits.log_softmax(-1), p_logits.log_softmax(-1), log_target=True, reduction="batchmean")


@pytest.mark.parametrize("task", ["sst", "para"])
def test_the_terms_are_the_second_passs_loss_and_eq2_between_the_passes(task):
    """With dropout, ``ce`` is the loss of a second pass with fresh masks and ``kl`` eq. 2 between the two passes,
    replayed from the same generator state."""
    model = make_model("b1", "cross", dropout=0.2).train()
    obj = build_objectives({"rdrop": {"tasks": [task]}}, model)[0]
    batch = make_batch(task)
    torch.manual_seed(3)
    out = model(task, batch)
    terms = obj(model, task, batch, out)
    torch.manual_seed(3)
    first, second = model(task, batch).logits, model(task, batch).logits
    torch.testing.assert_close(out.logits, first)
    if task == "para":  # the Bernoulli of the logit
        first, second = (torch.stack([z, torch.zeros_like(z)], -1) for z in (first, second))
        assert terms["ce"].item() == pytest.approx(F.binary_cross_entropy_with_logits(
            second[:, 0], batch["labels"].float()).item(), rel=1e-6)
    else:
        assert terms["ce"].item() == pytest.approx(F.cross_entropy(second, batch["labels"]).item(), rel=1e-6)
    assert terms["kl"].item() > 0
    torch.testing.assert_close(terms["kl"], 0.5 * (kl(first, second) + kl(second, first)))


def test_without_dropout_the_whole_is_the_heads_loss_and_the_weights_halve_eq3():
    model = make_model("b1", "cross", dropout=0.0, head_dropout=0.0).train()
    obj = build_objectives({"rdrop": {"alpha": 0.6, "weight": 2.0}}, model)[0]
    batch = make_batch("sst")
    out = model("sst", batch)
    terms = obj(model, "sst", batch, out)
    head = model.task_loss("sst", out, batch)
    assert terms["kl"].item() == pytest.approx(0.0, abs=1e-7)
    assert (obj.task_loss_scale, obj.term_weight("ce"), obj.term_weight("kl")) == (0.5, 1.0, pytest.approx(0.6))
    torch.testing.assert_close(0.5 * head + 0.5 * terms["ce"], head)


def test_defaults_streams_and_refusals():
    model = make_model("b1", "cross")
    obj = build_objectives({"rdrop": {}}, model)[0]
    assert obj.active_tasks() == ("sst", PHRASES)
    with pytest.raises(ValueError, match="rdrop"):
        build_objectives({"rdrop": {"tasks": ["sts"]}}, model)
    with pytest.raises(ValueError, match="rdrop"):
        build_objectives({"rdrop": {"alpha": -1}}, model)
    batch = make_batch("sst")
    with pytest.raises(ValueError, match="training mode"):
        obj(model.eval(), "sst", batch, model("sst", batch))


def test_weight_zero_is_a_true_no_op():
    """--rdrop-weight 0 leaves the head's loss whole and runs no second pass (no dropout masks drawn), as
    label smoothing's ε = 0 does: a run with it is the run without the objective."""
    model = make_model("b1", "cross", dropout=0.2).train()
    obj = build_objectives({"rdrop": {"weight": 0.0}}, model)[0]
    batch = make_batch("sst")
    out = model("sst", batch)
    state = torch.random.get_rng_state()
    assert obj(model, "sst", batch, out) == {} and obj.task_loss_scale == 1.0
    assert torch.equal(torch.random.get_rng_state(), state)
