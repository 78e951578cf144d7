"""Tests of tasks/training/stages.py: LP-FT's first stage leaves the frozen encoder frozen and untrained with every
objective and resumes exactly across the switch; SWA's average and stage (minbert §4.2, §4.6)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from tasks.evaluation.evaluator import evaluate_checkpoint
from tasks.model import ModelConfig
from tasks.objectives import REGISTRY
from tasks.objectives.knn_bert import KNNBert
from tasks.predictions import Predictions, write_logits
from tasks.storage import load_tensors
from tasks.training import stages
from tasks.training.loop import Hook
from tasks.training.run import run, trainer_for
from tests.helpers import OBJECTIVE_SETTINGS, tiny_train_config


pytestmark = pytest.mark.usefixtures("one_thread")


def _write_teachers(directory: Path, n: int = 48) -> str:
    """Teacher logits for every training id of the tiny data (tests/helpers.write_tiny_data)."""
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

    def _watched(self) -> dict[str, nn.Module]:
        watched = {"encoder": self.trainer.model.encoder}
        for o in self.trainer.objectives:
            if isinstance(o, KNNBert):
                watched["key_model.encoder"] = o.key_model.encoder
        return watched

    def on_train_start(self, state, control):
        self.start = {k: v.clone() for k, v in self.trainer.model.encoder.state_dict().items()}
        for prefix, root in self._watched().items():
            for name, m in root.named_modules():
                def record(module, args, name=f"{prefix}.{name}"):
                    if self.trainer.stage == "lp" and module.training:
                        self.train_mode_forwards.add(name)
                m.register_forward_pre_hook(record)

    def on_step_end(self, state, control, step):
        assert state.stage == "lp"
        self.steps += 1
        for prefix, root in self._watched().items():
            self.train_mode_after_step |= {f"{prefix}.{n}" for n, m in root.named_modules() if m.training}

    def on_epoch_end(self, state, control, record):
        self.after_lp = {k: v.clone() for k, v in self.trainer.model.encoder.state_dict().items()}
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
    cfg = tiny_train_config(tiny_env, tmp_path / "run", limit=16, epochs=1, lpft={"epochs": 1}, model=model,
                            objectives={name: settings})
    watch = _WatchFrozen()
    trainer = watch.trainer = trainer_for(cfg, hooks=[watch])
    assert trainer.model.encoder.config.hidden_dropout_prob > 0  # dropout exists: the mode matters
    with pytest.raises(_Stop):
        trainer.fit()
    assert watch.steps == 6
    assert watch.train_mode_forwards == set(), f"train-mode forwards in stage 1: {sorted(watch.train_mode_forwards)[:5]}"
    assert watch.train_mode_after_step == set(), f"left in train mode: {sorted(watch.train_mode_after_step)[:5]}"
    assert watch.after_lp.keys() == watch.start.keys()
    for k, v in watch.start.items():
        assert torch.equal(watch.after_lp[k], v), f"stage 1 changed encoder.{k}"


def _cfg(env, out_dir: Path, **overrides):
    """The tiny config capped at 16 examples per split: 2 batches of 8 per task and epoch."""
    return tiny_train_config(env, out_dir, **{"limit": 16, "epochs": 1, **overrides})


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _encoder_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if k.startswith("encoder.")}


def _head_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("encoder.")}


class _Watch(Hook):
    """Records what LP-FT must guarantee at each point of the run."""

    def __init__(self):
        self.start_encoder = self.start_heads = None
        self.lp_param_names: list[str] = []
        self.lp_encoder_training: set[bool] = set()
        self.after_lp = None

    def on_train_start(self, state, control):
        trainer = self.trainer
        self.start_encoder, self.start_heads = _encoder_state(trainer.model), _head_state(trainer.model)
        self.lp_param_names = list(trainer.param_names)

    def on_step_end(self, state, control, step):
        if state.stage == "lp":
            self.lp_encoder_training.add(self.trainer.model.encoder.training)
            assert all(p.grad is None for p in self.trainer.model.encoder.parameters())

    def on_epoch_end(self, state, control, record):
        trainer = self.trainer
        if record["stage"] == "lp":
            self.after_lp = {"encoder": _encoder_state(trainer.model), "heads": _head_state(trainer.model),
                             "optimizer_state": len(trainer.optimizer.state), "names": list(trainer.param_names)}


def test_lp_ft_freezes_the_encoder_then_fine_tunes_all_and_resumes_exactly(tiny_env, tmp_path):
    """Stage 1 leaves every encoder tensor bit-identical (the optimizer never sees one, the encoder runs in eval mode)
    while the heads change; stage 2 starts a fresh optimizer over everything and changes the encoder; records carry
    the stage; a run interrupted at the stage boundary and resumed ends bit-identical."""
    watch = _Watch()
    full = watch.trainer = trainer_for(_cfg(tiny_env, tmp_path / "full", lpft={"epochs": 1}, epochs=1), hooks=[watch])
    full.fit()
    assert watch.lp_param_names and not any(n.startswith("model.encoder.") for n in watch.lp_param_names)
    assert watch.lp_encoder_training == {False}
    for k, v in watch.start_encoder.items():
        assert torch.equal(watch.after_lp["encoder"][k], v), f"stage 1 changed {k}"
    assert any(not torch.equal(watch.after_lp["heads"][k], v) for k, v in watch.start_heads.items())
    assert watch.after_lp["optimizer_state"] == 0  # the stage-2 optimizer is fresh
    assert any(n.startswith("model.encoder.") for n in watch.after_lp["names"])
    end = _encoder_state(full.model)
    assert any(not torch.equal(end[k], v) for k, v in watch.after_lp["encoder"].items())
    assert full.model.encoder.training and all(p.requires_grad for p in full.model.encoder.parameters())
    assert [(r["epoch"], r["stage"]) for r in _records(tmp_path / "full")] == [(1, "lp"), (2, "ft")]

    class Stop(Exception):
        pass

    class StopAfterLP(Hook):
        def on_epoch_end(self, state, control, record):
            raise Stop

    cut = _cfg(tiny_env, tmp_path / "cut", lpft={"epochs": 1}, epochs=1)
    with pytest.raises(Stop):
        trainer_for(cut, hooks=[StopAfterLP()]).fit()
    resumed = trainer_for(cut, resume_from=tmp_path / "cut" / "checkpoints" / "last")
    assert resumed.stage == "ft" and resumed.epoch == 1
    resumed.fit()
    a, b = full.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_lp_ft_learning_rate_restarts_per_stage(tiny_env, tmp_path):
    """Each stage runs the schedule over its own epochs: stage 1 peaks at lp_lr, stage 2 at lr."""
    t = trainer_for(_cfg(tiny_env, tmp_path / "r", lpft={"epochs": 2, "lr": 1e-2}, epochs=2, lr=1e-3,
                     lr_schedule="epoch_decay", lr_decay=1e-4))
    assert t.stage == "lp" and t.training_epochs == 4
    assert [t.lr_at(e, 0, 5) for e in range(4)] == pytest.approx([1e-2, 1e-2 - 1e-4, 1e-3, 1e-3 - 1e-4])


def _cfg(env, out_dir: Path, **overrides):
    """The tiny config capped at 16 examples per split: 2 batches of 8 per task and epoch."""
    return tiny_train_config(env, out_dir, **{"limit": 16, "epochs": 1, **overrides})


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_swa_replaces_the_best_epoch_only_with_a_strictly_higher_finite_score():
    """SWA wins on a higher score or when no epoch had one; a tie, a lower or an undefined score keeps the best."""
    assert stages.swa_wins(0.71, 0.70) and stages.swa_wins(0.5, None)
    assert not stages.swa_wins(0.70, 0.70) and not stages.swa_wins(0.6, 0.7)
    assert not stages.swa_wins(math.nan, 0.7) and not stages.swa_wins(math.nan, None)


def test_swa_phase_end_to_end(tiny_env, tmp_path, monkeypatch):
    """run() with swa.epochs=2: checkpoint "swa" is the mean of the two end-of-epoch snapshots, both scores are
    recorded, the predictions come from the winner, and the SWA checkpoint cannot be resumed."""
    snapshots = []
    original = AveragedModel.update_parameters

    def capture(self, model):
        snapshots.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return original(self, model)

    monkeypatch.setattr(AveragedModel, "update_parameters", capture)
    run_dir = tmp_path / "run"
    cfg = _cfg(tiny_env, run_dir, swa={"epochs": 2, "lr": 1e-3})
    final = run(cfg)
    assert len(snapshots) == 2
    saved = load_tensors(run_dir / "checkpoints" / "swa" / "model.safetensors")
    for k, v in saved.items():
        if v.is_floating_point() and not k.endswith("position_ids"):
            assert torch.allclose(v, (snapshots[0][k] + snapshots[1][k]) / 2, atol=1e-6), k

    records = _records(run_dir)
    swa_epochs = [r for r in records if r.get("stage") == "swa" and "swa_epoch" in r]
    assert [r["swa_epoch"] for r in swa_epochs] == [1, 2] and all(r["lr"] == 1e-3 for r in swa_epochs)
    assert all("loss" in r["train"] for r in swa_epochs)
    summary = next(r for r in records if r.get("swa_model"))
    assert summary["n_averaged"] == 2 and summary["best_epoch"] == 1
    assert summary["score"] is not None and summary["best_score"] is not None
    assert summary["used"] == stages.swa_wins(summary["score"], summary["best_score"])
    assert final["swa"]["used"] == summary["used"] and final["final"]
    chosen = run_dir / "checkpoints" / ("swa" if summary["used"] else "best")
    assert final["predictions_from"] == str(chosen)
    again = evaluate_checkpoint(chosen, out_dir=tmp_path / "again")
    assert again["dev"] == final["dev"]  # the written predictions are the chosen model's
    with pytest.raises(ValueError, match="SWA-averaged"):
        trainer_for(cfg, resume_from=run_dir / "checkpoints" / "swa")


def test_frozen_layers_stay_as_they_were_and_the_rest_trains(tiny_env, tmp_path):
    """--freeze-layers 1: after an epoch the embeddings and the lowest encoder layer are bit for bit the pretrained
    ones and hold no gradient or optimizer state, every other encoder layer has moved; 0 freezes the embeddings
    alone; LP-FT's second stage and SWA keep them frozen too."""
    for n, extra in ((1, {}), (0, {"lpft": {"epochs": 1}, "swa": {"epochs": 1}})):
        trainer = trainer_for(tiny_train_config(tiny_env, tmp_path / f"run{n}", epochs=1, freeze_layers=n, **extra))
        before = {k: v.clone() for k, v in trainer.model.encoder.state_dict().items()}
        trainer.fit()
        after = trainer.model.encoder.state_dict()
        frozen = [k for k in before if k.startswith("embeddings.") or
                  any(k.startswith(f"encoder.layer.{i}.") for i in range(n))]
        moving = [k for k in before if k.startswith(f"encoder.layer.{n}.")]
        assert frozen and moving
        assert all(torch.equal(before[k], after[k]) for k in frozen), n
        assert all(not torch.equal(before[k], after[k]) for k in moving if not k.endswith("LayerNorm.bias")), n
        names = set(trainer.param_names)
        assert not any(name.startswith("model.encoder.embeddings.") for name in names)
        with pytest.raises(ValueError, match="cannot freeze 7 layers of an encoder of 2"):
            trainer.model.encoder.freeze_bottom(7)


def test_a_stage_handed_to_the_trainer_that_is_not_scored_runs_and_logs(tiny_env, tmp_path, caplog):
    """run(cfg, stages=[...]): fine-tuning for an epoch, then a stage of one epoch at a constant small lr whose
    epochs are not scored (a cool-down): it trains (its weights move), logs its epoch line and records it; the best
    scored epoch then predicts (an unscored stage's final_model); stages that do not follow each other, or a scored
    stage after an unscored one, are refused naming the stage."""
    from tasks.training.stages import FT, Stage, check_stages

    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1)
    stages = [Stage(FT, 1, cfg.lr, cfg.lr_schedule), Stage("cool", 1, 1e-4, "constant", evaluates=False, first=1)]
    moved = []

    class Watch(Hook):
        def on_epoch_end(self, state, control, record):
            moved.append((record.get("stage"), "dev" in record))

    with caplog.at_level("INFO", logger="tasks"):
        record = run(cfg, stages=stages, hooks=[Watch()])
    assert moved == [("ft", True), ("cool", False)]
    assert any(m.startswith("cool epoch 1 done in") and "(not scored)" in m for m in caplog.messages)
    assert record["best_epoch"] == 1 and record["predictions_from"].endswith("best")
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("stage") for r in records if not r.get("final")] == ["ft", "cool"]
    with pytest.raises(ValueError, match="stage 'cool' starts at epoch 1; after the stages before it, it starts at "
                                         "epoch 2"):
        check_stages([stages[0], Stage("cool", 1, 1e-4, "constant", evaluates=False, first=0)])
    with pytest.raises(ValueError, match="stage 'ft' is scored and comes after 'cool'"):
        check_stages([Stage("cool", 1, 1e-4, "constant", evaluates=False), Stage(FT, 1, 1e-3, "constant", first=1)])
