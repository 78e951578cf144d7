"""Tests of tasks/training/callbacks.py: the hooks' events as a user's hook sees them through run() (every step,
log window, evaluation, checkpoint and record, SWA's epochs included), a hook that stops the loop, a hook whose
state travels with a checkpoint, and checkpoints every N steps."""

from __future__ import annotations

import json

import pytest

from tasks.training.callbacks import Hook
from tasks.training.run import run, trainer_for
from tests.helpers import Interrupt, StopAt, tiny_train_config

pytestmark = pytest.mark.usefixtures("one_thread")


class Recorder(Hook):
    """Every event, with what the hook can see of the trainer at that moment."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.trainer = None

    def on_train_start(self, trainer):
        self.trainer = trainer
        self.events.append(("train_start",))

    def on_epoch_start(self, trainer):
        self.events.append(("epoch_start", trainer.stage, trainer.epoch, [s for s, _ in trainer.plan]))

    def on_step_end(self, trainer, step):
        self.events.append(("step", trainer.stage, trainer.epoch, step.index, trainer.global_step, step.stream,
                            float(step.terms["loss"]), step.lr))

    def on_log(self, trainer, values):
        self.events.append(("log", trainer.global_step, values))

    def on_evaluate(self, trainer, evaluation):
        self.events.append(("evaluate", evaluation.scope, evaluation.metrics))

    def on_save(self, trainer, checkpoint):
        self.events.append(("save", checkpoint.name, trainer.global_step))

    def on_record(self, trainer, record):
        self.events.append(("record", record))

    def on_epoch_end(self, trainer, record):
        self.events.append(("epoch_end", record))

    def on_train_end(self, trainer):
        self.events.append(("train_end",))

    def of(self, kind: str) -> list[tuple]:
        return [e for e in self.events if e[0] == kind]


def test_a_hook_given_to_run_sees_every_step_evaluation_and_record_swa_included(tiny_env, tmp_path):
    """run(cfg, hooks=[h]) with one training epoch and one SWA epoch: h sees each step of both epochs' plans in order
    (their stage, index, stream, loss and lr; the global step counting on), each log window, the dev scores after
    the epoch, of SWA's average and of the final model, each checkpoint written, and each record of metrics.jsonl,
    in the order they happen; the epochs' mean losses are the means of the steps' losses."""
    rec = Recorder()
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1, swa={"epochs": 1, "lr": 1e-4}, limit=16, log_every=1,
                            checkpoint_every=2)
    final = run(cfg, hooks=[rec])
    trainer = rec.trainer
    plans = {e: trainer.schedule.epoch_plan(e) for e in (0, 1)}
    starts = rec.of("epoch_start")
    assert [(stage, epoch) for _, stage, epoch, _ in starts] == [("ft", 0), ("swa", 1)]
    assert [streams for *_, streams in starts] == [[s for s, _ in plans[e]] for e in (0, 1)]
    steps = rec.of("step")
    assert [(stage, epoch, index, stream) for _, stage, epoch, index, _, stream, _, _ in steps] == [
        ("ft" if e == 0 else "swa", e, i, s) for e in (0, 1) for i, (s, _) in enumerate(plans[e])]
    assert [g for *_, g, _, _, _ in steps] == list(range(1, len(steps) + 1))
    assert {lr for _, stage, *_, lr in steps if stage == "swa"} == {1e-4}

    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r for _, r in rec.of("record")] == records  # metrics.jsonl is what the hooks were given
    epoch, swa_epoch, swa_model, last = records
    assert [r for _, r in rec.of("epoch_end")] == [epoch, swa_epoch]
    for record, stage in ((epoch, "ft"), (swa_epoch, "swa")):
        losses = [loss for _, s, *_, loss, _ in steps if s == stage]
        assert record["train"]["loss"] == pytest.approx(sum(losses) / len(losses))
    assert [values["loss"] for _, _, values in rec.of("log")] == pytest.approx([loss for *_, loss, _ in steps])

    evaluations = rec.of("evaluate")
    assert [scope for _, scope, _ in evaluations] == ["epoch", "swa", "final"]
    assert evaluations[0][2]["overall"] == pytest.approx(epoch["dev"]["overall"])
    assert evaluations[1][2]["overall"] == pytest.approx(swa_model["score"])
    assert evaluations[2][2] == last["dev"] == final["dev"]

    n = len(plans[0])
    mid = [("save", "last", g) for g in range(2, n, 2)]  # every 2 steps inside the training epoch, none in SWA's
    assert rec.of("save") == [*mid, ("save", "last", n), ("save", "swa", len(steps))]
    end = rec.events.index(("train_end",))  # after SWA's average, before the final predictions
    assert rec.events[0] == ("train_start",) and rec.events.index(("record", swa_model)) < end
    assert end < rec.events.index(evaluations[2]) < rec.events.index(("record", last)) == len(rec.events) - 1


class StopAfter(Hook):
    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_step_end(self, trainer, step):
        if trainer.global_step == self.steps:
            trainer.control.should_training_stop = True


def test_a_hook_stops_the_loop_through_its_control(tiny_env, tmp_path):
    """should_training_stop ends fit() after the step that asked: no epoch end, no record."""
    rec = Recorder()
    trainer = trainer_for(tiny_train_config(tiny_env, tmp_path / "run"), hooks=[StopAfter(3), rec])
    summary = trainer.fit()
    assert summary["global_step"] == trainer.global_step == 3 and trainer.epoch == 0 and trainer.step == 3
    assert not rec.of("epoch_end") and not rec.of("record") and rec.events[-1] == ("train_end",)


class Counter(Hook):
    """A hook with state: the steps it has seen, over a run cut and resumed."""

    def __init__(self) -> None:
        self.steps = 0

    def on_step_end(self, trainer, step):
        self.steps += 1

    def state(self):
        return {"steps": self.steps}

    def load_state(self, state):
        self.steps = state["steps"]


def test_a_hooks_state_travels_with_the_checkpoint(tiny_env, tmp_path):
    """Cut after step 9 (its last checkpoint at step 8) and resumed: the hook's count, saved in state.json under its
    class name and given back, ends where the uninterrupted run's does."""
    whole = Counter()
    trainer_for(tiny_train_config(tiny_env, tmp_path / "full", checkpoint_every=4), hooks=[whole]).fit()
    cfg = tiny_train_config(tiny_env, tmp_path / "cut", checkpoint_every=4)
    with pytest.raises(Interrupt):
        trainer_for(cfg, hooks=[Counter(), StopAt(step=9)]).fit()
    assert json.loads((tmp_path / "cut" / "checkpoints" / "last" / "state.json").read_text())["hooks"] == {
        "Counter": {"steps": 8}}
    resumed = Counter()
    trainer_for(cfg, hooks=[resumed], resume_from=tmp_path / "cut" / "checkpoints" / "last").fit()
    assert resumed.steps == whole.steps > 9
