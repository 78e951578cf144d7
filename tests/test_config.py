"""Tests of tasks/config.py: TrainConfig's checks, and configs saved by earlier versions loading as they ran."""

from __future__ import annotations

import pytest

from tasks.config import TrainConfig
from tests.helpers import tiny_train_config


def test_configs_written_before_a_field_existed_load_with_its_legacy_value():
    """A config.json without train_subsets, pair_swap, symmetric_eval, sts_prior, sst_prior or report_to (written
    before they existed) loads with the values that reproduce it, whatever today's defaults; a config that has them
    keeps its own."""
    from tasks import config as config_module
    saved = TrainConfig().to_dict()
    for key in config_module.LEGACY_VALUES:
        del saved[key]
    loaded = TrainConfig.from_dict(saved)
    assert {k: getattr(loaded, k) for k in config_module.LEGACY_VALUES} == {
        "train_subsets": "fresh", "pair_swap": 0.0, "symmetric_eval": False, "sts_prior": 0.0, "sst_prior": 0.0,
        "report_to": (), "sst_phrases": None, "sst_phrases_per_epoch": 8544, "sst_phrases_batch_size": None,
        "sst_phrases_min_words": 1,
        "sst_phrases_weight": 1.0, "sst_phrases_order": "mixed", "save_only_model": False, "reinit_layers": 0,
        "task_files": (), "freeze_encoder": False}
    own = TrainConfig(train_subsets="cycle", pair_swap=0.25, symmetric_eval=True, sts_prior=0.5, sst_prior=0.25,
                      report_to=("tensorboard",))
    assert TrainConfig.from_dict(own.to_dict()) == own
    prior_of_pretrained = TrainConfig(pretrained="ckpt/mlm", sts_prior=0.5).to_dict()
    del prior_of_pretrained["sts_prior_model"]  # the prior was --pretrained's encoder before it had its own option
    assert TrainConfig.from_dict(prior_of_pretrained).sts_prior_model == "ckpt/mlm"
    own = TrainConfig(pretrained="ckpt/mlm", sts_prior_model=None)
    assert TrainConfig.from_dict(own.to_dict()).sts_prior_model is None


@pytest.mark.parametrize("field, value", [("layer_lr_decay", 0.0), ("layer_lr_decay", 1.5), ("head_lr_scale", 0.0),
                                          ("reinit_layers", -1)])
def test_bad_factors_are_refused(tiny_env, tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        tiny_train_config(tiny_env, tmp_path / "r", **{field: value}).validate()


def test_a_limit_below_a_tasks_batch_is_refused_but_not_below_the_phrases_batch():
    """--limit under the batch size leaves every batch of a task partial: refused. The phrases' own larger batch
    (--sst-phrases-batch-size) is not checked: a smoke run (--limit 32) of a recipe with phrases takes them in
    one partial batch."""
    with pytest.raises(ValueError, match="limit=16 is smaller than the batch size 32"):
        TrainConfig(limit=16).validate()
    TrainConfig(limit=32, sst_phrases="p.csv", sst_phrases_batch_size=64).validate()
