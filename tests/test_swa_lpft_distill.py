"""Tests for SWA (tasks/swa.py), LP-FT (tasks/lpft.py), distillation (tasks/objectives/distill.py),
``--predict-train`` and the KNN-BERT inference of the final evaluation (tasks/predict.py).

Math identities run on small tensors; the end-to-end tests train the tiny
random BERT of tests/test_train.py on its synthetic data, capped with
``limit`` so that an epoch is six steps.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from tasks import train as cli
from tasks.config import TrainConfig
from tasks.data import selection as splits
from tasks.evaluation.evaluator import evaluate_checkpoint, load_checkpoint_model
from tasks.evaluation.files import Predictions, read_logits, read_predictions, write_logits
from tasks.objectives.distill import Distill, DistillConfig, distill_loss, load_teachers, teacher_targets
from tasks.training import swa as swa_mod
from tasks.training.checkpoint import load_tensors
from tasks.training.run import run
from tasks.training.trainer import Hook, Trainer
from tests.test_train import tiny_env, tiny_train_config  # noqa: F401  (tiny_env: the session fixture)


def _cfg(env, out_dir: Path, **overrides):
    """The tiny config capped at 16 examples per split: 2 batches of 8 per task and epoch."""
    return tiny_train_config(env, out_dir, **{"limit": 16, "epochs": 1, **overrides})


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _encoder_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if k.startswith("encoder.")}


def _head_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("encoder.")}


# ---- SWA: the average ----------------------------------------------------------------------------------------


def _toy() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3), nn.Linear(3, 2))


def test_swa_of_identical_snapshots_returns_them():
    """Averaging N copies of the same weights gives those weights bit for bit, with n_averaged = N."""
    model = _toy()
    snapshot = copy.deepcopy(model.state_dict())
    averaged = swa_mod.average_snapshots(model, [snapshot] * 3)
    assert int(averaged.n_averaged) == 3
    for k, v in averaged.module.state_dict().items():
        assert torch.equal(v, snapshot[k]), k


def test_swa_of_two_snapshots_is_their_mean_as_torch_averaged_model():
    """Two snapshots average to their mean, exactly as torch's AveragedModel updated with each in turn."""
    a, b = _toy(), _toy()
    averaged = swa_mod.average_snapshots(a, [a.state_dict(), b.state_dict()])
    reference = AveragedModel(a)
    reference.update_parameters(a)
    reference.update_parameters(b)
    for (k, got), want in zip(averaged.module.named_parameters(), reference.module.parameters()):
        assert torch.equal(got, want), k
        assert torch.allclose(got, (a.state_dict()[k] + b.state_dict()[k]) / 2, atol=1e-7), k


def test_swa_replaces_the_best_epoch_only_with_a_strictly_higher_finite_score():
    """SWA wins on a higher score or when no epoch had one; a tie, a lower or an undefined score keeps the best."""
    assert swa_mod.swa_wins(0.71, 0.70) and swa_mod.swa_wins(0.5, None)
    assert not swa_mod.swa_wins(0.70, 0.70) and not swa_mod.swa_wins(0.6, 0.7)
    assert not swa_mod.swa_wins(math.nan, 0.7) and not swa_mod.swa_wins(math.nan, None)


def test_swa_phase_end_to_end(tiny_env, tmp_path, monkeypatch):
    """run() with swa_epochs=2: checkpoint "swa" is the mean of the two end-of-epoch snapshots, both scores are
    recorded, the predictions come from the winner, and the SWA checkpoint cannot be resumed."""
    snapshots = []
    original = AveragedModel.update_parameters

    def capture(self, model):
        snapshots.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return original(self, model)

    monkeypatch.setattr(AveragedModel, "update_parameters", capture)
    run_dir = tmp_path / "run"
    cfg = _cfg(tiny_env, run_dir, swa_epochs=2, swa_lr=1e-3)
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
        Trainer.from_config(cfg, resume_from=run_dir / "checkpoints" / "swa")


# ---- LP-FT ------------------------------------------------------------------------------------------------


class _Watch(Hook):
    """Records what LP-FT must guarantee at each point of the run."""

    def __init__(self):
        self.start_encoder = self.start_heads = None
        self.lp_param_names: list[str] = []
        self.lp_encoder_training: set[bool] = set()
        self.after_lp = None

    def on_train_start(self, trainer):
        self.start_encoder, self.start_heads = _encoder_state(trainer.model), _head_state(trainer.model)
        self.lp_param_names = list(trainer.param_names)

    def on_step_end(self, trainer):
        if trainer.stage == "lp":
            self.lp_encoder_training.add(trainer.model.encoder.training)
            assert all(p.grad is None for p in trainer.model.encoder.parameters())

    def on_epoch_end(self, trainer, record):
        if record["stage"] == "lp":
            self.after_lp = {"encoder": _encoder_state(trainer.model), "heads": _head_state(trainer.model),
                             "optimizer_state": len(trainer.optimizer.state), "names": list(trainer.param_names)}


def test_lp_ft_freezes_the_encoder_then_fine_tunes_all_and_resumes_exactly(tiny_env, tmp_path):
    """Stage 1 leaves every encoder tensor bit-identical (the optimizer never sees one, the encoder runs in eval mode)
    while the heads change; stage 2 starts a fresh optimizer over everything and changes the encoder; records carry
    the stage; a run interrupted at the stage boundary and resumed ends bit-identical."""
    watch = _Watch()
    full = Trainer.from_config(_cfg(tiny_env, tmp_path / "full", lp_epochs=1, epochs=1), hooks=[watch])
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
        def on_epoch_end(self, trainer, record):
            raise Stop

    cut = _cfg(tiny_env, tmp_path / "cut", lp_epochs=1, epochs=1)
    with pytest.raises(Stop):
        Trainer.from_config(cut, hooks=[StopAfterLP()]).fit()
    resumed = Trainer.from_config(cut, resume_from=tmp_path / "cut" / "checkpoints" / "last")
    assert resumed.stage == "ft" and resumed.epoch == 1
    resumed.fit()
    a, b = full.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_lp_ft_learning_rate_restarts_per_stage(tiny_env, tmp_path):
    """Each stage runs the schedule over its own epochs: stage 1 peaks at lp_lr, stage 2 at lr."""
    t = Trainer.from_config(_cfg(tiny_env, tmp_path / "r", lp_epochs=2, epochs=2, lp_lr=1e-2, lr=1e-3,
                     lr_schedule="epoch_decay", lr_decay=1e-4))
    assert t.stage == "lp" and t.total_epochs == 4
    assert [t.lr_at(e, 0, 5) for e in range(4)] == pytest.approx([1e-2, 1e-2 - 1e-4, 1e-3, 1e-3 - 1e-4])


# ---- distillation: the losses and the teachers ----------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_distill_kl_is_zero_when_the_student_is_the_teacher(temperature):
    """SST: KL(teacher ‖ student) of a student with the teacher's own logits is 0, at any temperature."""
    z = torch.randn(6, 5) * 3
    loss = distill_loss("sst", z, teacher_targets("sst", [z], temperature), temperature)
    assert abs(loss.item()) < 1e-6
    other = distill_loss("sst", z.flip(0), teacher_targets("sst", [z], temperature), temperature)
    assert other.item() > 1e-3


def _softmax(z: list[float], t: float) -> list[float]:
    m = max(z)
    e = [math.exp((v - m) / t) for v in z]
    return [v / sum(e) for v in e]


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
def test_distill_sst_is_t_squared_kl_teacher_to_student_by_hand(temperature):
    """SST term = T² · mean_n Σ_c p_c (log p_c − log q_c), p = softmax(z_teacher / T), q = softmax(z_student / T),
    computed by hand: not the reverse KL(q ‖ p), and not without the T² factor (the logits tell them apart)."""
    zt = [[2.0, 0.5, -1.0, 0.0, 1.0], [-0.5, 3.0, 0.0, 0.2, -2.0], [0.0, 0.0, 4.0, -1.0, 0.5]]
    zs = [[0.0, 1.0, 0.0, -0.5, 2.0], [1.0, 0.0, -1.0, 2.0, 0.0], [0.3, -0.3, 1.0, 0.0, 0.0]]
    t = temperature
    forward = reverse = 0.0
    for a, b in zip(zt, zs):
        p, q = _softmax(a, t), _softmax(b, t)
        forward += sum(pc * (math.log(pc) - math.log(qc)) for pc, qc in zip(p, q))
        reverse += sum(qc * (math.log(qc) - math.log(pc)) for pc, qc in zip(p, q))
    expected = t * t * forward / len(zt)
    got = distill_loss("sst", torch.tensor(zs), teacher_targets("sst", [torch.tensor(zt)], t), t).item()
    assert got == pytest.approx(expected, rel=1e-5)
    assert abs(got - t * t * reverse / len(zt)) > 1e-2
    if t != 1.0:
        assert abs(got - forward / len(zt)) > 1e-2


@pytest.mark.parametrize("temperature", [1.0, 3.0])
def test_distill_para_is_t_squared_bce_by_hand(temperature):
    """Paraphrase term = T² · mean_n −[p log q + (1 − p) log(1 − q)], p = σ(z_teacher / T), q = σ(z_student / T)."""
    zt, zs = [1.5, -2.0, 0.3, 4.0], [0.0, -1.0, 2.0, 1.0]
    t = temperature
    sig = lambda x: 1.0 / (1.0 + math.exp(-x))  # noqa: E731
    total = 0.0
    for a, b in zip(zt, zs):
        p, q = sig(a / t), sig(b / t)
        total += -(p * math.log(q) + (1 - p) * math.log(1 - q))
    got = distill_loss("para", torch.tensor(zs), teacher_targets("para", [torch.tensor(zt)], t), t).item()
    assert got == pytest.approx(t * t * total / len(zt), rel=1e-5)


def test_distill_bce_is_minimal_at_the_teacher_and_equals_its_entropy():
    """Paraphrase: BCE(p, p) = H(p) (the minimum over students), with zero gradient there."""
    z = torch.randn(8) * 2
    p = teacher_targets("para", [z])
    student = z.clone().requires_grad_(True)
    loss = distill_loss("para", student, p)
    entropy = -(p * p.log() + (1 - p) * (1 - p).log()).mean()
    assert loss.item() == pytest.approx(entropy.item(), abs=1e-6)
    loss.backward()
    assert student.grad.abs().max().item() < 1e-7
    assert distill_loss("para", z + 0.5, p).item() > loss.item()


def test_distill_mse_is_zero_for_identical_scores():
    """STS: MSE against the teacher's score is 0 for the same scores (and the temperature does not touch it)."""
    s = torch.rand(7) * 5
    assert distill_loss("sts", s, teacher_targets("sts", [s], 3.0), 3.0).item() == 0.0


def _write_teacher(directory: Path, ids: list[str], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = {"sst": torch.randn(len(ids), 5, generator=g), "para": torch.randn(len(ids), generator=g),
              "sts": torch.rand(len(ids), generator=g) * 5}
    for task, x in logits.items():
        write_logits(directory, task, "train", Predictions(ids, x, torch.zeros(len(ids))))
    return logits


def test_ensemble_teacher_averages_probabilities_and_scores(tmp_path):
    """Two teachers (ids in different orders): SST mean softmax, paraphrase mean sigmoid, STS mean score, by id."""
    ids = [f"id{i}" for i in range(5)]
    a = _write_teacher(tmp_path / "a", ids, 0)
    perm = [3, 0, 4, 1, 2]
    b = _write_teacher(tmp_path / "b", [ids[i] for i in perm], 1)
    back = torch.tensor(perm).argsort()  # row of ids[i] in b's file
    want = {"sst": (a["sst"].softmax(-1) + b["sst"][back].softmax(-1)) / 2,
            "para": (torch.sigmoid(a["para"]) + torch.sigmoid(b["para"][back])) / 2,
            "sts": (a["sts"] + b["sts"][back]) / 2}
    for task, expected in want.items():
        teachers = load_teachers([str(tmp_path / "a"), str(tmp_path / "b")], task)
        got = teachers.lookup(task, ids)
        assert torch.allclose(got, expected.float(), atol=1e-6), task


def test_missing_teacher_ids_and_files_are_errors_naming_the_file(tmp_path):
    """An id absent from the teacher file, a teacher without train logits, or no teacher at all is refused."""
    _write_teacher(tmp_path / "t", ["a", "b"], 0)
    teachers = load_teachers([str(tmp_path / "t")], "sst")
    with pytest.raises(ValueError, match=r"sst-train-logits\.csv.*'c'"):
        teachers.lookup("sst", ["a", "c"])
    cfg = TrainConfig(tasks=("sst", "sts"))
    Distill.check_run(DistillConfig(teachers=(str(tmp_path / "t"),)), cfg)
    with pytest.raises(ValueError, match=r"empty.*sts-train-logits\.csv.*--predict-train"):
        Distill.check_run(DistillConfig(teachers=(str(tmp_path / "empty"),)), cfg)
    with pytest.raises(ValueError, match="needs teachers"):
        DistillConfig()


def test_predict_train_then_distill_from_it(tiny_env, tmp_path):
    """--predict-train writes every training example's logits; a student distills from them (logged per task);
    a teacher file lacking a training id stops the student before its first step, naming the file."""
    teacher = run(_cfg(tiny_env, tmp_path / "teacher", predict_train=True))
    pred = tmp_path / "teacher" / "predictions"
    assert set(teacher["train"]) == {"sst_acc", "para_acc", "sts_r", "overall"}
    assert not (pred / "sst-train-output.csv").exists()
    trainer = Trainer.from_config(_cfg(tiny_env, tmp_path / "student", objectives={"distill": {"teachers": [str(pred)]}}))
    for task in ("sst", "para", "sts"):
        ids, _ = read_logits(pred / f"{task}-train-logits.csv")
        assert ids == trainer.train_sets[task].ids
    trainer.fit()
    terms = trainer.history[0]["train"]
    assert {"sst/distill.loss", "para/distill.loss", "sts/distill.loss"} <= set(terms)

    path = pred / "para-train-logits.csv"
    path.write_text("\n".join(path.read_text().splitlines()[:-1]) + "\n")  # drop the last id
    with pytest.raises(ValueError, match=r"para-train-logits\.csv"):
        Trainer.from_config(_cfg(tiny_env, tmp_path / "student2", objectives={"distill": {"teachers": [str(pred)]}}))


# ---- KNN-BERT inference at the final evaluation ----------------------------------------------------------------


def test_knn_inference_metrics_and_leaderboard(tiny_env, tmp_path):
    """The final record has KNN-BERT dev metrics (at φ and φ = 1); φ = 0 equals the plain classifier; with φ > 0
    (set by --eval-only --knn-bert-knn-phi) the leaderboard files hold the eq. 1 prediction of KNNBert.knn_predict."""
    knn = {"m_most": 2, "m_least": 2, "queue_size": 20, "knn_k": 5, "knn_phi": 0.0}
    final = run(_cfg(tiny_env, tmp_path / "run", objectives={"knn_bert": knn}))
    assert final["knn"]["dev"] == final["dev"] and final["knn"]["leaderboard"] == "classifier"
    assert {"sst_acc", "para_acc", "sts_r", "overall"} == set(final["knn"]["dev_knn_only"])
    assert final["knn"]["dev_knn_only"]["sts_r"] == final["dev"]["sts_r"]
    assert _records(tmp_path / "run")[-1]["knn"] == final["knn"]

    best = tmp_path / "run" / "checkpoints" / "best"
    result = cli.main(["--eval-only", "--checkpoint", str(best), "--out-dir", str(tmp_path / "eval"),
                       "--knn-bert-knn-phi", "0.5"])
    assert result["knn"]["phi"] == 0.5 and result["knn"]["leaderboard"] == "knn"
    model, objectives, tokenizer, cfg = load_checkpoint_model(best)
    obj = objectives[0]
    obj.config = type(obj.config)(**{**knn, "knn_phi": 0.5})
    for task in ("sst", "para"):
        train = splits.make_dataset(task, splits.load_examples(task, "train", cfg), tokenizer, cfg)
        dev = splits.make_dataset(task, splits.load_examples(task, "dev", cfg), tokenizer, cfg)
        want = obj.knn_predict(model, task, train, dev).argmax(-1)
        ids, written = read_predictions(tmp_path / "eval" / "predictions" / f"{task}-dev-output.csv")
        assert ids == dev.ids and torch.equal(written, want), task
        metric = {"sst": "sst_acc", "para": "para_acc"}[task]
        assert result["knn"]["dev"][metric] == pytest.approx((want == dev.labels.long()).double().mean().item())
