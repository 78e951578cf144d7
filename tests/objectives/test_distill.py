"""Tests of tasks/objectives/distill.py: the loss by hand at each task and temperature, targets moved to the device
once and indexed there equal to a per-step lookup of CPU rows, and teachers' files checked against training."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tasks.task import get_task
from tasks.train_config import TrainConfig
from tasks.predictions import Predictions, read_logits, write_logits
from tasks.model import TaskOutput
from tasks.objectives.distill import Distill, DistillConfig, TaskTargets, distill_loss, load_teachers, teacher_targets
from tasks.training.run import run, trainer_for
from tests.helpers import tiny_model, tiny_train_config


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_distill_targets_on_device_equal_a_per_step_lookup(task):
    """Distill's term with the target table moved to the device once and indexed there equals the term on a
    per-step lookup (CPU rows copied to the student's device), over repeated batches in another order."""
    g = torch.Generator().manual_seed(2)
    n = 12
    table = {"sst": torch.rand(n, 5, generator=g).softmax(-1), "para": torch.rand(n, generator=g),
             "sts": torch.rand(n, generator=g) * 5}[task]
    ids = [f"x{i}" for i in range(n)]
    obj = Distill(DistillConfig(teachers=("unused",), temperature=2.0))
    obj.targets = {task: TaskTargets({i: k for k, i in enumerate(ids)}, table.clone(), [])}
    for batch_ids in (ids[3:9], ids[::-2]):
        shape = (len(batch_ids), 5) if task == "sst" else (len(batch_ids),)
        logits = torch.randn(shape, generator=g)
        got = obj(tiny_model(), task, {"ids": batch_ids}, TaskOutput(logits))["loss"]
        looked_up = table[torch.tensor([ids.index(i) for i in batch_ids])].to(logits.device)
        assert torch.equal(got, distill_loss(get_task(task), logits, looked_up, 2.0))


def _cfg(env, out_dir: Path, **overrides):
    """The tiny config capped at 16 examples per split: 2 batches of 8 per task and epoch."""
    return tiny_train_config(env, out_dir, **{"limit": 16, "epochs": 1, **overrides})


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_distill_kl_is_zero_when_the_student_is_the_teacher(temperature):
    """SST: KL(teacher ‖ student) of a student with the teacher's own logits is 0, at any temperature."""
    z = torch.randn(6, 5) * 3
    loss = distill_loss(get_task("sst"), z, teacher_targets(get_task("sst"), [z], temperature), temperature)
    assert abs(loss.item()) < 1e-6
    other = distill_loss(get_task("sst"), z.flip(0), teacher_targets(get_task("sst"), [z], temperature), temperature)
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
    sst = get_task("sst")
    got = distill_loss(sst, torch.tensor(zs), teacher_targets(sst, [torch.tensor(zt)], t), t).item()
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
    para = get_task("para")
    got = distill_loss(para, torch.tensor(zs), teacher_targets(para, [torch.tensor(zt)], t), t).item()
    assert got == pytest.approx(t * t * total / len(zt), rel=1e-5)


def test_distill_bce_is_minimal_at_the_teacher_and_equals_its_entropy():
    """Paraphrase: BCE(p, p) = H(p) (the minimum over students), with zero gradient there."""
    z = torch.randn(8) * 2
    p = teacher_targets(get_task("para"), [z])
    student = z.clone().requires_grad_(True)
    loss = distill_loss(get_task("para"), student, p)
    entropy = -(p * p.log() + (1 - p) * (1 - p).log()).mean()
    assert loss.item() == pytest.approx(entropy.item(), abs=1e-6)
    loss.backward()
    assert student.grad.abs().max().item() < 1e-7
    assert distill_loss(get_task("para"), z + 0.5, p).item() > loss.item()


def test_distill_mse_is_zero_for_identical_scores():
    """STS: MSE against the teacher's score is 0 for the same scores (and the temperature does not touch it)."""
    s = torch.rand(7) * 5
    assert distill_loss(get_task("sts"), s, teacher_targets(get_task("sts"), [s], 3.0), 3.0).item() == 0.0


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
        teachers = load_teachers([str(tmp_path / "a"), str(tmp_path / "b")], get_task(task))
        got = teachers.lookup(task, ids)
        assert torch.allclose(got, expected.float(), atol=1e-6), task


def test_a_users_task_is_distilled_from_its_teachers_logits(tmp_path):
    """A user's task (its entry, as a run resolves it) reads its teachers' {name}-train-logits.csv as SST does."""
    from tasks.task import Layout, Task

    mine = Task("mine", get_task("sst").kind, {}, Layout(("t",), "y"), classes=("a", "b", "c"))
    ids = ["x", "y"]
    logits = torch.tensor([[1.0, 0.0, -1.0], [0.0, 2.0, 0.0]])
    write_logits(tmp_path / "t", mine, "train", Predictions(ids, logits, logits.argmax(-1)))
    got = load_teachers([str(tmp_path / "t")], mine).lookup("mine", ["y", "x"])
    assert torch.allclose(got, logits.softmax(-1)[[1, 0]])


def test_missing_teacher_ids_and_files_are_errors_naming_the_file(tmp_path):
    """An id absent from the teacher file, a teacher without train logits, or no teacher at all is refused."""
    _write_teacher(tmp_path / "t", ["a", "b"], 0)
    teachers = load_teachers([str(tmp_path / "t")], get_task("sst"))
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
    trainer = trainer_for(_cfg(tiny_env, tmp_path / "student", objectives={"distill": {"teachers": [str(pred)]}}))
    for task in ("sst", "para", "sts"):
        ids, _ = read_logits(pred / f"{task}-train-logits.csv")
        assert ids == trainer.train_sets[task].ids
    trainer.fit()
    terms = trainer.history[0]["train"]
    assert {"sst/distill.loss", "para/distill.loss", "sts/distill.loss"} <= set(terms)

    path = pred / "para-train-logits.csv"
    path.write_text("\n".join(path.read_text().splitlines()[:-1]) + "\n")  # drop the last id
    with pytest.raises(ValueError, match=r"para-train-logits\.csv"):
        trainer_for(_cfg(tiny_env, tmp_path / "student2", objectives={"distill": {"teachers": [str(pred)]}}))
