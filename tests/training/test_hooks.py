"""Tests of tasks/training/hooks.py, each hook on the states a loop hands it: checkpoints every N steps (and
where they are not taken), the log lines and their clock, and metrics.jsonl continued by a resumed run. Their
events through a whole run: tests/training/test_loop.py."""

from __future__ import annotations

import dataclasses
import logging

import torch

from tasks.training.hooks import CheckpointEvery, EarlyStopping, LogLines, MetricsFile
from tasks.training.loop import Control, Evaluation, Step, TrainingState


def state(**changes) -> TrainingState:
    """A fine-tuning loop's state at step 4 of 10 of its first epoch (of 2), global step 4."""
    base = TrainingState(epoch=0, step=4, global_step=4, steps_in_epoch=10, epochs=2, training_epochs=2,
                         stage="ft", epoch_title="epoch 1/2", resumable=True, saves_each_epoch=True, main=True,
                         device="cpu", outlook={"costs": [10] * 20, "evaluations": 2, "dev_sequences": 8,
                                                "final_sequences": 16})
    return dataclasses.replace(base, **changes)


def step(index: int) -> Step:
    return Step(index, "sst", {"ids": list(range(8)), "input_ids": torch.zeros(8, 5, dtype=torch.long)}, 1.0,
                {"loss": torch.tensor(1.5)}, 1e-3)


def test_checkpoint_every_asks_for_a_save_every_n_global_steps_of_a_resumable_stage_only():
    """every=4: a save after global steps 4 and 8; none at other steps, none in a stage that is no position to
    resume (SWA's), none where the loop saves anyway (its epoch's last step) or stops after this step."""
    hook = CheckpointEvery(4)

    def asks(**changes) -> bool:
        control = Control(should_training_stop=changes.pop("stopping", False))
        hook.on_step_end(state(**changes), control, step(0))
        return control.should_save

    assert asks(global_step=4) and asks(global_step=8, step=8)
    assert not asks(global_step=5, step=5) and not asks(global_step=4, resumable=False)
    assert not asks(global_step=12, step=10) and asks(global_step=12, step=10, saves_each_epoch=False)
    assert not asks(global_step=4, stopping=True)
    control = Control()
    CheckpointEvery(0).on_step_end(state(), control, step(0))
    assert not control.should_save  # 0: off


def test_log_lines_print_each_log_with_its_clock_and_an_evaluation_a_hook_asked_for(caplog):
    """A log line names the epoch, the step of its plan, lr, each loss term and the speed, with the clock's
    elapsed and remaining time in the training epochs (the outlook's 20 steps); a "step" evaluation is a line of
    its own; an epoch's record ends the epoch with its dev scores."""
    hook = LogLines()
    caplog.set_level(logging.INFO, logger="tasks.training.hooks")
    hook.on_epoch_start(state(step=0, global_step=0), Control())
    for k in range(4):
        hook.on_step_end(state(step=k + 1, global_step=k + 1), Control(), step(k))
    hook.on_log(state(), Control(), {"loss": 1.5, "sst/loss": 1.5, "lr": 1e-3, "seq_per_s": 80.0})
    hook.on_evaluate(state(), Control(), Evaluation("step", {"sst_acc": 0.25, "overall": 0.25}, 2.0))
    line, evaluation = caplog.messages[-2:]
    assert line.startswith("epoch 1/2 step 4/10 | lr 1.00e-03 | loss 1.5000 | sst/loss 1.5000 | 80.0 seq/s | "
                           "elapsed ") and ", left ~" in line
    assert evaluation == "epoch 1/2 step 4/10: dev sst_acc 0.2500 overall 0.2500 (2 s)"
    assert hook.clock is not None and hook.clock.steps_done == 4

    hook.on_log(state(epoch=2, training_epochs=2, stage="swa", epoch_title="SWA epoch 1/1"), Control(),
                {"loss": 1.0, "lr": 1e-4, "seq_per_s": 10.0})
    assert caplog.messages[-1] == "SWA epoch 1/1 step 4/10 | lr 1.00e-04 | loss 1.0000 | 10.0 seq/s"  # no clock
    record = {"epoch": 1, "train": {"loss": 1.5}, "dev": {"overall": 0.5}, "train_time_s": 3.0,
              "eval_time_s": 1.0, "best": True}
    hook.on_epoch_end(state(epoch=1), Control(), record)
    assert caplog.messages[-1] == "epoch 1 done in 3 s (+1 s dev): loss 1.5000 | dev overall 0.5000 (best so far)"


def test_metrics_file_continues_a_resumed_runs_records(tmp_path):
    """A resumed run's metrics.jsonl is its checkpoint's history again (what came after the checkpoint is
    dropped), then the new records."""
    from tasks.training.rundir import RunDir

    run_dir = RunDir.__new__(RunDir)
    written: list = []
    run_dir.rewrite = lambda records: written.__setitem__(slice(None), list(records))
    run_dir.append = written.append
    hook = MetricsFile(run_dir)
    history = [{"epoch": 1}]
    hook.on_train_start(state(resumed_from=str(tmp_path / "last"), history=history), Control())
    hook.on_record(state(), Control(), {"epoch": 2})
    assert written == [{"epoch": 1}, {"epoch": 2}]
    hook.on_train_start(state(history=history), Control())  # a fresh run: nothing rewritten
    assert written == [{"epoch": 1}, {"epoch": 2}]


def test_early_stopping_stops_after_patience_epochs_without_a_better_score_and_stays_stopped(caplog):
    """patience 2: an epoch that improves resets the count; two scored epochs in a row without a better overall stop
    training (the count read from the records, so a resumed run counts on); a run resumed after it stopped stops
    before training; SWA's unscored epochs count nothing."""
    hook = EarlyStopping(2)
    records = []

    def end(epoch: int, best: bool, **changes) -> bool:
        records.append({"epoch": epoch, "dev": {"overall": 0.5}, "best": best})
        control = Control()
        hook.on_epoch_end(state(epoch=epoch, history=list(records), training_epochs=10, epochs=10,
                                best={"epoch": 1, "score": 0.5}, **changes), control, records[-1])
        return control.should_training_stop

    with caplog.at_level(logging.INFO, logger="tasks.training.hooks"):
        assert not end(1, True) and not end(2, False) and not end(3, True) and not end(4, False)
        assert end(5, False)
    assert "early stopping: the dev overall has not improved for 2 epochs (patience 2; best: epoch 1, 0.5000): " \
           "training stops after epoch 5 of 10" in caplog.messages[-1]
    control = Control()
    hook.on_train_start(state(epoch=5, history=list(records), training_epochs=10, epochs=10), control)
    assert control.should_training_stop  # resumed after stopping
    control = Control()
    hook.on_train_start(state(epoch=4, history=records[:4], training_epochs=10, epochs=10), control)
    assert not control.should_training_stop  # resumed before: it counts on (one epoch without a better score)
    unscored = Control()
    hook.on_epoch_end(state(epoch=11, history=list(records), training_epochs=10, epochs=11), unscored,
                      {"epoch": 11, "stage": "swa", "train": {}})
    assert not unscored.should_training_stop
