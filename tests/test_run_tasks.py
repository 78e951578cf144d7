"""Tests of tasks/run_tasks.py: a run's tasks, streams and priors resolved once (TrainConfig.resolve) from its
config and its tasks' declarations, and handed down: nothing on the training or evaluation path resolves them
again."""

from __future__ import annotations

import pytest

from tasks.evaluation.evaluator import predict_checkpoint, prepare_eval
from tasks.train_config import TrainConfig
from tasks.training.run import prepare_run, run_plan
from tests.helpers import phrases, tiny_train_config


def test_a_runs_streams_and_priors_are_its_settings_over_its_tasks_declarations():
    """Each stream's batch, cap and weight, each extra stream's file and each prior's weight: the run's setting
    where it names the stream or task, else the declaration (SST's phrases: 64 a batch, 17,088 an epoch; a prior
    of weight 0.5), else the general setting; NLI's triplets are STS's where no task of the run declares others."""
    cfg = TrainConfig(stream_files={"phrases": "mine.csv"}, task_batch_size={"para": 16}, batch_size=32,
                      gradient_accumulation_steps=2, loss_weights={"para": 0.1}, prior_weights={"sst": 0.0},
                      prior_models={"sts": "enc"}, nli=True)
    run = cfg.resolve()
    assert run.streams == ("sst", "para", "sts", "phrases", "nli") and run.tasks == cfg.tasks
    assert run.entries is cfg.entries
    assert dict(run.batch_sizes) == {"sst": 32, "para": 16, "sts": 32, "phrases": 64, "nli": 32}
    assert run.step_batch_sizes == {s: 2 * b for s, b in run.batch_sizes.items()}
    assert run.caps["phrases"] == 17088 and run.caps["para"] == cfg.max_train_examples["para"]
    assert dict(run.weights) == {"para": 0.1}
    assert run.extra["phrases"].file == "mine.csv" and run.declared == ("phrases",) and run.idle == ()
    assert {t: (p.kind, p.weight, p.model) for t, p in run.priors.items()} == {"sts": ("cosine", 0.5, "enc")}
    assert run.nli and run.triplets.name == "sts"
    pairs = TrainConfig(tasks=("para", "sts")).resolve()
    assert pairs.streams == ("para", "sts") and pairs.declared == () and pairs.idle == ("phrases",)
    assert not pairs.nli and pairs.triplets is None


def test_a_stream_turned_off_is_no_stream_of_the_run_and_its_settings_are_idle():
    """--sst-phrases none: the phrases are declared (their settings may still be named) but not trained."""
    run = TrainConfig(stream_files={"phrases": None}).resolve()
    assert run.extra == {} and run.declared == ("phrases",) and run.idle == ("phrases",)
    assert "phrases" not in run.batch_sizes and "phrases" not in run.streams


@pytest.mark.parametrize("what", ["train", "eval"])
def test_a_run_and_an_evaluation_resolve_their_tasks_once_and_hand_them_down(what, tiny_env, tmp_path, monkeypatch):
    """A run's plan resolves its tasks once (its checks read the same resolution); the data, model, schedule,
    loss weights, priors and final files take it from there. So does an evaluation's plan, for --eval-only."""
    pretrained, _ = tiny_env
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1, prior_weights={"sst": 0.5, "sts": 0.5},
                            prior_models={"sst": str(pretrained), "sts": str(pretrained)}, **phrases())
    calls: list[str] = []
    real = TrainConfig.resolve
    monkeypatch.setattr(TrainConfig, "resolve", lambda self: calls.append(self.out_dir) or real(self))
    if what == "train":
        plan = prepare_run(cfg)
        assert calls == [cfg.out_dir]
        calls.clear()
        run_plan(plan)
    else:
        monkeypatch.setattr(TrainConfig, "resolve", real)
        run_plan(prepare_run(cfg))
        monkeypatch.setattr(TrainConfig, "resolve", lambda self: calls.append(self.out_dir) or real(self))
        plan = prepare_eval(tmp_path / "run" / "checkpoints" / "best", out_dir=tmp_path / "eval")
        assert len(calls) == 1
        calls.clear()
        predict_checkpoint(plan)
    assert calls == []
