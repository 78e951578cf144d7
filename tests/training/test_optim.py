"""Tests of tasks/training/optim.py: per-parameter lr factors, AdamW's parameter groups and the learning rate over
the steps (the trainer's use of them: tests/training/test_trainer.py)."""

from __future__ import annotations

import pytest

from minbert.bert import BertModel
from minbert.mlm import BertForMaskedLM
from tasks.training.optim import adamw, lr_scale, parameter_groups, warmup_linear
from tests.helpers import tiny_config


def test_lr_scale_decays_from_the_top_layer_down_to_the_embeddings():
    """Layer i of L at γ^(L-1-i), the embeddings at γ^L, pooler 1, everything outside the encoder at the head scale."""
    g = 0.5
    assert lr_scale("model.encoder.encoder.layer.5.output.dense.weight", 6, g, 3.0) == 1.0
    assert lr_scale("model.encoder.encoder.layer.0.attention.self.qkv.weight", 6, g, 3.0) == g ** 5
    assert lr_scale("model.encoder.embeddings.word_embeddings.weight", 6, g, 3.0) == g ** 6
    assert lr_scale("model.encoder.pooler.dense.bias", 6, g, 3.0) == 1.0
    assert lr_scale("model.sst_head.0.weight", 6, g, 3.0) == 3.0
    assert lr_scale("objectives.rift.proj.0.weight", 6, g, 3.0) == 3.0


def test_a_tied_parameter_is_one_parameter_and_only_matrices_decay():
    """The MLM head's decoder is the word embeddings (one Parameter under two names): it is in one group once, under
    its first name; matrices decay, vectors do not; frozen parameters are left out."""
    mlm = BertForMaskedLM(BertModel(tiny_config()))
    mlm.bert.pooler.requires_grad_(False)
    groups, names = parameter_groups(list(mlm.named_parameters()), weight_decay=0.01)
    params = [p for g in groups for p in g["params"]]
    assert len(params) == len({id(p) for p in params}) == len(names)
    assert "bert.embeddings.word_embeddings.weight" in names and "cls.predictions.decoder.weight" not in names
    assert not any(n.startswith("bert.pooler.") for n in names)
    for g in groups:
        assert all((p.ndim >= 2) == (g["weight_decay"] == 0.01) for p in g["params"])
    assert all("lr_scale" not in g for g in groups)  # every factor 1: no key, the step's lr as it is


def test_adamw_gives_each_group_its_lr_factor_and_names_in_group_order():
    mlm = BertForMaskedLM(BertModel(tiny_config()))
    params, names, opt = adamw(mlm.named_parameters(), lr=1e-3, weight_decay=0.0,
                               lr_scale_of=lambda n: 2.0 if n.startswith("cls.") else 1.0)
    assert params == [p for g in opt.param_groups for p in g["params"]]
    by_name = dict(mlm.named_parameters())
    assert [by_name[n] for n in names] == params
    assert {g.get("lr_scale", 1.0) for g in opt.param_groups} == {1.0, 2.0}


@pytest.mark.parametrize("decay", [True, False])
def test_warmup_linear_rises_to_the_peak_then_decays_to_zero_or_stays(decay):
    lrs = [warmup_linear(1.0, t, total=10, warm=4, decay=decay) for t in range(10)]
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    if decay:
        assert lrs[4:] == pytest.approx([1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6])
        assert warmup_linear(1.0, 10, total=10, warm=4) == 0.0
    else:
        assert lrs[4:] == [1.0] * 6


def test_pair_swap_shows_only_pairs_without_order_in_the_other_order():
    """--pair-swap is order augmentation: a pair whose relation has no order (Quora's, STS's, MRPC's: the entry's
    ``symmetric``) may be shown as (b, a); one with an order (RTE's premise and hypothesis) never is, as its
    evaluation never scores it so (``symmetric_eval``)."""
    from types import SimpleNamespace

    from tasks.train_config import TrainConfig
    from tasks.training.optim import build_schedule

    cfg = TrainConfig(tasks=("sst", "para", "sts", "mrpc", "rte"), pair_swap=0.5, max_train_examples={},
                      dev_max_examples={}, stream_files={"phrases": None})
    sets = {t: SimpleNamespace(lengths=[8] * 16) for t in cfg.tasks}
    assert build_schedule(cfg, cfg.resolve(), sets).swap == {"para": 0.5, "sts": 0.5, "mrpc": 0.5}
