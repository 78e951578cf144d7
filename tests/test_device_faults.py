"""Faults that a combination of features or another device would hit (issue 13): module modes under LP-FT,
KNN-BERT's key model mode, RIFT's gradient path to the word embeddings.

The LP-FT tests train the tiny random BERT of tests/test_train.py on its synthetic data, capped with
``limit`` so that an epoch is six steps, and stop at the end of stage 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tasks.evaluation.files import Predictions, write_logits
from tasks.model import ModelConfig, preserved_modes
from tasks.objectives import REGISTRY, import_all
from tasks.objectives.knn_bert import KNNBert, KNNBertConfig
from tasks.training.trainer import Hook, Trainer
from tests.test_objectives_knn_rift import make_batch, tiny_model
from tests.test_train import tiny_env, tiny_train_config  # noqa: F401  (tiny_env: the session fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- the mode helper -------------------------------------------------------------------------------------------


def test_preserved_modes_restores_every_submodule():
    """A model with a submodule in eval mode (LP-FT's frozen encoder) comes back with that submodule in eval,
    not with the top module's mode spread over all of them as ``model.train(was_training)`` would."""
    model = tiny_model()
    model.train()
    model.encoder.eval()
    before = {n: m.training for n, m in model.named_modules()}
    with preserved_modes(model):
        model.eval()
        assert not any(m.training for m in model.modules())
    assert {n: m.training for n, m in model.named_modules()} == before
    with pytest.raises(RuntimeError), preserved_modes(model):  # restored on an exception too
        model.train()
        raise RuntimeError
    assert {n: m.training for n, m in model.named_modules()} == before


# ---- fault 1: LP-FT with every objective leaves the frozen encoder frozen and in eval mode -----------------------

# Options that let each registered objective run on the tiny data (16 examples per task); {} = its defaults.
OBJECTIVE_SETTINGS = {
    "distill": None,  # teachers written per test (below)
    "knn_bert": {"m_most": 2, "m_least": 2, "queue_size": 20, "knn_k": 5},
    "match_tuning": {},
    "mnr": {},
    "rift": {},
    "scl": {},
    "simcse": {},
    "smart": {},
}


def test_every_registered_objective_has_an_lp_ft_case():
    """A newly registered objective must join the LP-FT mode test below."""
    import_all()
    assert set(REGISTRY) == set(OBJECTIVE_SETTINGS)


def _write_teachers(directory: Path, n: int = 48) -> str:
    """Teacher logits for every training id of the tiny data (tests/test_train.write_tiny_data)."""
    g = torch.Generator().manual_seed(0)
    for task, shape in (("sst", (n, 5)), ("para", (n,)), ("sts", (n,))):
        ids = [f"{task}-train-{i}" for i in range(n)]
        x = torch.randn(shape, generator=g) if task != "sts" else torch.rand(shape, generator=g) * 5
        write_logits(directory, task, "train", Predictions(ids, x, torch.zeros(n)))
    return str(directory)


class _Stop(Exception):
    pass


class _WatchFrozen(Hook):
    """Records, during stage "lp", every forward of a module of the frozen encoder (and of KNN-BERT's key encoder,
    which must follow it) that runs in train mode, and the modes left at each step's end."""

    def __init__(self):
        self.train_mode_forwards: set[str] = set()
        self.train_mode_after_step: set[str] = set()
        self.start: dict[str, torch.Tensor] = {}
        self.after_lp: dict[str, torch.Tensor] = {}
        self.steps = 0

    def _watched(self, trainer) -> dict[str, nn.Module]:
        watched = {"encoder": trainer.model.encoder}
        for o in trainer.objectives:
            if isinstance(o, KNNBert):
                watched["key_model.encoder"] = o.key_model.encoder
        return watched

    def on_train_start(self, trainer):
        self.start = {k: v.clone() for k, v in trainer.model.encoder.state_dict().items()}
        for prefix, root in self._watched(trainer).items():
            for name, m in root.named_modules():
                def record(module, args, name=f"{prefix}.{name}"):
                    if trainer.stage == "lp" and module.training:
                        self.train_mode_forwards.add(name)
                m.register_forward_pre_hook(record)

    def on_step_end(self, trainer):
        assert trainer.stage == "lp"
        self.steps += 1
        for prefix, root in self._watched(trainer).items():
            self.train_mode_after_step |= {f"{prefix}.{n}" for n, m in root.named_modules() if m.training}

    def on_epoch_end(self, trainer, record):
        self.after_lp = {k: v.clone() for k, v in trainer.model.encoder.state_dict().items()}
        raise _Stop


@pytest.mark.parametrize("name", sorted(OBJECTIVE_SETTINGS))
def test_lp_stage_keeps_the_frozen_encoder_in_eval_mode_with_every_objective(tiny_env, tmp_path, name):
    """--lp-epochs 1 with each objective: through stage 1 no module of the frozen encoder (nor of KNN-BERT's key
    encoder) runs a forward in train mode or is left in train mode after a step, and the encoder's weights are
    bit-identical at the end of the stage. Siamese-only objectives run with pair_encoding 'siamese'."""
    settings = OBJECTIVE_SETTINGS[name]
    if name == "distill":
        settings = {"teachers": [_write_teachers(tmp_path / "teacher")]}
    model = ModelConfig(arch="b1", pair_encoding="siamese" if REGISTRY[name].needs_siamese else "cross",
                        fcn_size=16, head_dropout=0.1)
    cfg = tiny_train_config(tiny_env, tmp_path / "run", limit=16, epochs=1, lp_epochs=1, model=model,
                            objectives={name: settings})
    watch = _WatchFrozen()
    trainer = Trainer.from_config(cfg, hooks=[watch])
    assert trainer.model.encoder.config.hidden_dropout_prob > 0  # dropout exists: the mode matters
    with pytest.raises(_Stop):
        trainer.fit()
    assert watch.steps == 6
    assert watch.train_mode_forwards == set(), f"train-mode forwards in stage 1: {sorted(watch.train_mode_forwards)[:5]}"
    assert watch.train_mode_after_step == set(), f"left in train mode: {sorted(watch.train_mode_after_step)[:5]}"
    assert watch.after_lp.keys() == watch.start.keys()
    for k, v in watch.start.items():
        assert torch.equal(watch.after_lp[k], v), f"stage 1 changed encoder.{k}"


# ---- fault 2: KNN-BERT's key model follows the query model's mode, module by module --------------------------------


def test_knn_key_model_follows_the_query_models_mode_per_module():
    """With the query encoder frozen in eval (LP stage 1) and the heads in train mode, the key model encodes with
    its encoder in eval and its heads in train mode; in full training both are in train mode."""
    model = tiny_model()
    obj = KNNBert(KNNBertConfig(m_most=2, m_least=2), model)
    seen: dict[str, bool] = {}
    for n, m in obj.key_model.named_modules():
        m.register_forward_pre_hook(lambda module, args, n=n: seen.__setitem__(n, module.training))
    batch = make_batch("sst")
    for encoder_frozen in (True, False):
        model.train()
        if encoder_frozen:
            model.encoder.eval()
        seen.clear()
        obj(model, "sst", batch, model("sst", batch))
        want = dict(model.named_modules())
        assert seen and all(v == want[n].training for n, v in seen.items()), encoder_frozen
        assert seen["encoder"] is (not encoder_frozen)
