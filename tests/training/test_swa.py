"""tasks/training/swa.py: the SWA average and phase (minbert §4.6)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch.optim.swa_utils import AveragedModel

from tasks.evaluation.evaluator import evaluate_checkpoint
from tasks.training import swa as swa_mod
from tasks.storage import load_tensors
from tasks.training.run import run, trainer_for
from tests.helpers import tiny_train_config


def _cfg(env, out_dir: Path, **overrides):
    """The tiny config capped at 16 examples per split: 2 batches of 8 per task and epoch."""
    return tiny_train_config(env, out_dir, **{"limit": 16, "epochs": 1, **overrides})


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_swa_replaces_the_best_epoch_only_with_a_strictly_higher_finite_score():
    """SWA wins on a higher score or when no epoch had one; a tie, a lower or an undefined score keeps the best."""
    assert swa_mod.swa_wins(0.71, 0.70) and swa_mod.swa_wins(0.5, None)
    assert not swa_mod.swa_wins(0.70, 0.70) and not swa_mod.swa_wins(0.6, 0.7)
    assert not swa_mod.swa_wins(math.nan, 0.7) and not swa_mod.swa_wins(math.nan, None)


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
    assert summary["used"] == swa_mod.swa_wins(summary["score"], summary["best_score"])
    assert final["swa"]["used"] == summary["used"] and final["final"]
    chosen = run_dir / "checkpoints" / ("swa" if summary["used"] else "best")
    assert final["predictions_from"] == str(chosen)
    again = evaluate_checkpoint(chosen, out_dir=tmp_path / "again")
    assert again["dev"] == final["dev"]  # the written predictions are the chosen model's
    with pytest.raises(ValueError, match="SWA-averaged"):
        trainer_for(cfg, resume_from=run_dir / "checkpoints" / "swa")
