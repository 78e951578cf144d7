"""Layer-wise lr decay and the heads' lr scale (--layer-lr-decay, --head-lr-scale): the lr each parameter trains at."""

from __future__ import annotations

import pytest

from tasks.training.trainer import Trainer, lr_scale
from tests.test_train import run_whole_and_cut, tiny_env, tiny_train_config  # noqa: F401,F811


def test_lr_scale_decays_from_the_top_layer_down_to_the_embeddings():
    """Layer i of L at γ^(L-1-i), the embeddings at γ^L, pooler 1, everything outside the encoder at the head scale."""
    g = 0.5
    assert lr_scale("model.encoder.encoder.layer.5.output.dense.weight", 6, g, 3.0) == 1.0
    assert lr_scale("model.encoder.encoder.layer.0.attention.self.qkv.weight", 6, g, 3.0) == g ** 5
    assert lr_scale("model.encoder.embeddings.word_embeddings.weight", 6, g, 3.0) == g ** 6
    assert lr_scale("model.encoder.pooler.dense.bias", 6, g, 3.0) == 1.0
    assert lr_scale("model.sst_head.0.weight", 6, g, 3.0) == 3.0
    assert lr_scale("objectives.rift.proj.0.weight", 6, g, 3.0) == 3.0


def test_default_keeps_two_groups_at_one_lr(tiny_env, tmp_path):
    """Both factors at 1: the two weight-decay groups of before, no lr_scale key (the default's numbers unchanged)."""
    t = Trainer.from_config(tiny_train_config(tiny_env, tmp_path / "r"))
    assert len(t.optimizer.param_groups) == 2
    assert all("lr_scale" not in g for g in t.optimizer.param_groups)


def test_every_parameter_takes_its_scaled_lr_in_a_step(tiny_env, tmp_path):
    """After a step each parameter's group has lr × its scale, weight decay still only on matrices, none left out."""
    t = Trainer.from_config(tiny_train_config(tiny_env, tmp_path / "r", layer_lr_decay=0.5, head_lr_scale=4.0,
                                              weight_decay=0.05))
    layers = t.model.encoder.config.num_hidden_layers
    t.train_step("sst", t.train_sets["sst"].collate(list(range(8))), lr=1e-3)
    group_of = {id(p): g for g in t.optimizer.param_groups for p in g["params"]}
    assert len(group_of) == len(t.params) == sum(1 for p in t.model.parameters() if p.requires_grad)
    seen = set()
    for name, p in zip(t.param_names, t.params):
        g = group_of[id(p)]
        assert g["lr"] == pytest.approx(1e-3 * lr_scale(name, layers, 0.5, 4.0)), name
        assert g["weight_decay"] == (0.05 if p.ndim >= 2 else 0.0), name
        seen.add(g["lr"])
    assert min(seen) == pytest.approx(1e-3 * 0.5 ** layers) and max(seen) == pytest.approx(4e-3)


def test_frozen_lower_layers_move_less(tiny_env, tmp_path):
    """A tiny layer decay barely moves the embeddings while the top layer trains as without decay."""
    runs = {}
    for decay in (1.0, 1e-4):
        t = Trainer.from_config(tiny_train_config(tiny_env, tmp_path / str(decay), layer_lr_decay=decay, epochs=1))
        before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
        t.fit()
        runs[decay] = {n: (p.detach() - before[n]).abs().max().item() for n, p in t.model.named_parameters()}
    emb = "encoder.embeddings.word_embeddings.weight"
    assert runs[1e-4][emb] < 1e-3 * runs[1.0][emb]
    top = [n for n in runs[1.0] if n.startswith("encoder.encoder.layer.1.")]
    assert all(runs[1e-4][n] > 0 for n in top)


def test_resume_with_lr_groups_is_bit_identical(tiny_env, tmp_path):
    """The groups' lr scales survive a checkpoint: a cut and resumed run ends exactly where the whole run does."""
    full, resumed = run_whole_and_cut(tiny_env, tmp_path, 9, layer_lr_decay=0.7, head_lr_scale=2.0,
                                      checkpoint_every=4)
    scales = [[g.get("lr_scale", 1.0) for g in t.optimizer.param_groups] for t in (full, resumed)]
    assert scales[0] == scales[1] and len(set(scales[0])) > 1


@pytest.mark.parametrize("field, value", [("layer_lr_decay", 0.0), ("layer_lr_decay", 1.5), ("head_lr_scale", 0.0)])
def test_bad_factors_are_refused(tiny_env, tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        tiny_train_config(tiny_env, tmp_path / "r", **{field: value}).validate()

