"""Tests of tasks/training/loop.py: the hooks' events as a user's hook sees them through run() (every step and its
optimizer step, log window, evaluation, checkpoint and record, SWA's epochs included) with the state it is given,
a hook that stops the loop, asks for a log line or an evaluation every N steps through its control, a hook whose
state travels with a checkpoint, and checkpoints every N steps; fp16's loss scaling (a skipped step, a run whose
every step overflows, clipping after unscaling, an exact resume) and gradient accumulation."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from tasks.training import loop as loop_module
from tasks.training.loop import Hook
from tasks.training.run import run, trainer_for
from tasks.training.trainer import Trainer
from tests.helpers import Interrupt, StopAt, tiny_train_config

pytestmark = pytest.mark.usefixtures("one_thread")


class Recorder(Hook):
    """Every event, with what the hook sees of the loop at that moment (its ``TrainingState``)."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.states: list = []

    def on_train_start(self, state, control):
        self.states.append(state)
        self.events.append(("train_start",))

    def on_epoch_start(self, state, control):
        self.events.append(("epoch_start", state.stage, state.epoch, state.step, state.steps_in_epoch))

    def on_step_begin(self, state, control):
        self.events.append(("step_begin", state.global_step))

    def on_pre_optimizer_step(self, state, control):
        self.events.append(("pre_optimizer_step", state.global_step))

    def on_optimizer_step(self, state, control):
        self.events.append(("optimizer_step", state.global_step))

    def on_step_end(self, state, control, step):
        self.events.append(("step", state.stage, state.epoch, step.index, state.global_step, step.stream,
                            float(step.terms["loss"]), step.lr))

    def on_log(self, state, control, values):
        self.events.append(("log", state.global_step, values))

    def on_evaluate(self, state, control, evaluation):
        self.events.append(("evaluate", evaluation.scope, evaluation.metrics))

    def on_save(self, state, control, checkpoint):
        self.events.append(("save", checkpoint.name, state.global_step))

    def on_record(self, state, control, record):
        self.events.append(("record", record))

    def on_epoch_end(self, state, control, record):
        self.states.append(state)
        self.events.append(("epoch_end", record))

    def on_train_end(self, state, control):
        self.events.append(("train_end",))

    def of(self, kind: str) -> list[tuple]:
        return [e for e in self.events if e[0] == kind]


def _plans(cfg, out_dir):
    """The epochs' plans of steps (streams) the run of ``cfg`` trains, from a trainer of its own."""
    with trainer_for(dataclasses.replace(cfg, out_dir=str(out_dir))) as other:
        return {e: [s for s, _ in other.schedule.epoch_plan(e)] for e in range(other.epochs)}


def test_a_hook_given_to_run_sees_every_step_evaluation_and_record_swa_included(tiny_env, tmp_path):
    """run(cfg, hooks=[h]) with one training epoch and one SWA epoch: h sees each step of both epochs' plans in order
    (their stage, index, stream, loss and lr; the global step counting on), before and after each optimizer step,
    each log window, the dev scores after the epoch, of SWA's average and of the final model, each checkpoint
    written, and each record of metrics.jsonl, in the order they happen; the epochs' mean losses are the means of
    the steps' losses. The state it is given is plain data: it serialises as JSON."""
    rec = Recorder()
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1, swa={"epochs": 1, "lr": 1e-4}, limit=16, log_every=1,
                            checkpoint_every=2)
    final = run(cfg, hooks=[rec])
    plans = _plans(cfg, tmp_path / "other")
    starts = rec.of("epoch_start")
    assert starts == [("epoch_start", "ft", 0, 0, len(plans[0])), ("epoch_start", "swa", 1, 0, len(plans[1]))]
    steps = rec.of("step")
    assert [(stage, epoch, index, stream) for _, stage, epoch, index, _, stream, _, _ in steps] == [
        ("ft" if e == 0 else "swa", e, i, s) for e in (0, 1) for i, s in enumerate(plans[e])]
    assert [g for *_, g, _, _, _ in steps] == list(range(1, len(steps) + 1))
    assert {lr for _, stage, *_, lr in steps if stage == "swa"} == {1e-4}
    around = [e for e in rec.events if e[0] in ("step_begin", "pre_optimizer_step", "optimizer_step", "step")]
    assert [e[0] for e in around] == ["step_begin", "pre_optimizer_step", "optimizer_step", "step"] * len(steps)
    assert [e[1] for e in around if e[0] != "step"] == [g for g in range(len(steps)) for _ in range(3)]

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

    start, after_epoch, _ = rec.states  # at the start, after the epoch, after SWA's epoch
    assert (start.epoch, start.global_step, start.training_epochs, start.epochs, start.best) == (0, 0, 1, 2, None)
    assert after_epoch.history == [epoch] and after_epoch.best["epoch"] == 1 and after_epoch.main
    assert json.loads(json.dumps(dataclasses.asdict(after_epoch)))["history"] == [epoch]


class StopAfter(Hook):
    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_step_end(self, state, control, step):
        if state.global_step == self.steps:
            control.should_training_stop = True


def test_a_hook_stops_the_loop_through_its_control(tiny_env, tmp_path):
    """should_training_stop ends fit() after the step that asked: no epoch end, no record."""
    rec = Recorder()
    trainer = trainer_for(tiny_train_config(tiny_env, tmp_path / "run"), hooks=[StopAfter(3), rec])
    summary = trainer.fit()
    assert summary["global_step"] == trainer.global_step == 3 and trainer.epoch == 0 and trainer.step == 3
    assert not rec.of("epoch_end") and not rec.of("record") and rec.events[-1] == ("train_end",)


class EvaluateEvery(Hook):
    """The README's hook: dev scores every ``n`` global steps, beside each epoch's; and a log line at each."""

    def __init__(self, n: int) -> None:
        self.n = n

    def on_step_end(self, state, control, step):
        control.should_evaluate = control.should_log = state.global_step % self.n == 0


def test_a_hook_adds_an_evaluation_every_n_steps_without_changing_the_run(tiny_env, tmp_path):
    """control.should_evaluate every 4 global steps: the hooks get dev scores of scope "step" after those steps
    (inside and across the epochs, and a log line there, whatever log_every says), while the epochs' records,
    the best epoch, the predictions and the weights are those of the run without it: an evaluation between steps
    changes no number."""
    plain = tiny_train_config(tiny_env, tmp_path / "plain", log_every=100)
    run(plain)
    rec = Recorder()
    cfg = tiny_train_config(tiny_env, tmp_path / "every", log_every=100)
    run(cfg, hooks=[EvaluateEvery(4), rec])
    total = len(rec.of("step"))
    steps_then = [rec.events[i - 1] for i, e in enumerate(rec.events) if e[0] == "evaluate" and e[1] == "step"]
    assert [e[0] for e in steps_then] == ["log"] * (total // 4)  # after the step's log line
    assert [e[1] for e in steps_then] == list(range(4, total + 1, 4))
    assert all("overall" in m for _, scope, m in rec.of("evaluate") if scope == "step")
    assert [e[1] for e in rec.of("evaluate")].count("epoch") == 2

    def metrics(run_dir):  # the records, but for times and paths
        text = (run_dir / "metrics.jsonl").read_text().replace(str(run_dir), "RUN")
        return [{k: v for k, v in json.loads(line).items() if not k.endswith("_s")} for line in text.splitlines()]
    assert metrics(tmp_path / "every") == metrics(tmp_path / "plain")
    for name in ("best", "last"):
        a, b = (load_file(str(d / "checkpoints" / name / "model.safetensors")) for d in (tmp_path / "plain",
                                                                                        tmp_path / "every"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    for f in (tmp_path / "plain" / "predictions").iterdir():
        assert (tmp_path / "every" / "predictions" / f.name).read_bytes() == f.read_bytes(), f.name


class Counter(Hook):
    """A hook with state: the steps it has seen, over a run cut and resumed."""

    def __init__(self) -> None:
        self.steps = 0

    def on_step_end(self, state, control, step):
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


# ---- fp16 with loss scaling, gradient accumulation (issue: the GPUs people have) ------------------------------


def _fp16(env, out_dir, **overrides):
    """The tiny run in fp16 with loss scaling on the CPU: torch's CPU autocast in float16 and GradScaler("cpu"), the
    path a T4 takes."""
    return tiny_train_config(env, out_dir, bf16=None, fp16=True, **overrides)


def overflow(trainer, at: set[int]) -> None:
    """Make the loss of the steps at global steps ``at`` infinite (an fp16 overflow), through ``step_loss``."""
    real = trainer.step_loss

    def step_loss(stream, batch):
        loss, terms = real(stream, batch)
        return (loss * float("inf"), terms) if trainer.global_step in at else (loss, terms)

    trainer.step_loss = step_loss


def test_an_fp16_overflow_skips_the_step_and_halves_the_scale(tiny_env, tmp_path, caplog):
    """A step whose fp16 gradients are not finite leaves every weight as it was, halves the loss scale and is
    counted (the trainer's, the log line's and the epoch record's skipped steps); the next step trains again."""
    trainer = trainer_for(_fp16(tiny_env, tmp_path / "run", epochs=1, log_every=4))
    assert trainer.scaler is not None and trainer.amp_dtype == torch.float16
    overflow(trainer, at={3})
    seen = []

    class Watch(Hook):
        def on_step_begin(self, state, control):
            seen.append(({k: v.clone() for k, v in trainer.model.state_dict().items()}, trainer.scaler.get_scale()))

    trainer.hooks.append(Watch())
    with caplog.at_level("INFO", logger="tasks"):
        trainer.fit()
    (before, scale_3), (after, scale_4) = seen[3], seen[4]
    assert all(torch.equal(before[k], after[k]) for k in before)  # step 4 (global step 3) was skipped
    assert scale_4 == scale_3 / 2
    assert any(not torch.equal(a, b) for a, b in zip(seen[4][0].values(), seen[5][0].values()))  # the next trains
    assert trainer.skipped_steps == 1 and trainer.history[-1]["skipped_steps"] == 1
    assert any("fp16 steps skipped 1" in m for m in caplog.messages)
    assert any("fp16 autocast with dynamic loss scaling (--fp16; emulated on a CPU" in m for m in caplog.messages)


def test_an_fp16_run_whose_every_step_overflows_stops_saying_so(tiny_env, tmp_path, monkeypatch):
    """Every step skipped (the loss itself not finite in fp16): after MAX_SKIPPED_IN_A_ROW of them the run stops
    with a ValueError (one line, exit status 1 from the command) that says what to do."""
    monkeypatch.setattr(loop_module, "MAX_SKIPPED_IN_A_ROW", 4)
    trainer = trainer_for(_fp16(tiny_env, tmp_path / "run", epochs=1))
    overflow(trainer, at=set(range(100)))
    with pytest.raises(ValueError, match=r"fp16: the last 4 optimizer steps were all skipped.*--no-bf16"):
        trainer.fit()
    assert trainer.global_step == 3  # the fourth skipped step raised


def test_fp16_clips_the_unscaled_gradients(tiny_env, tmp_path):
    """Clipping acts on the true gradients: the gradients the optimizer gets under fp16 are unscaled before the
    clipping (a clip of 100 that the true norm never reaches leaves them as fp32's, within fp16's rounding); clipped
    while still scaled by 65,536 they would be cut to the clip's norm."""
    norms = {}
    for name, cfg in (("fp32", tiny_train_config(tiny_env, tmp_path / "a", epochs=1, grad_clip=100.0)),
                      ("fp16", _fp16(tiny_env, tmp_path / "b", epochs=1, grad_clip=100.0))):
        trainer = trainer_for(cfg)

        class Norm(Hook):
            def on_pre_optimizer_step(self, state, control):
                if state.global_step == 0:
                    norms[name] = float(torch.linalg.vector_norm(
                        torch.stack([torch.linalg.vector_norm(p.grad) for p in trainer.params if p.grad is not None])))
                    control.should_training_stop = True

        trainer.hooks.append(Norm())
        trainer.fit()
    assert 1e-3 < norms["fp32"] < 10
    assert norms["fp16"] == pytest.approx(norms["fp32"], rel=0.05)


def test_an_fp16_run_cut_and_resumed_ends_as_the_whole_run(tiny_env, tmp_path):
    """fp16 with loss scaling resumes exactly: the scaler's scale and growth count travel in the checkpoint, so a
    run cut mid-epoch (after a skipped step) ends with the whole run's weights, optimizer and scale, bit for bit,
    and the same dev predictions."""
    runs = {}
    for name in ("full", "cut"):
        cfg = _fp16(tiny_env, tmp_path / name, checkpoint_every=4)
        trainer = trainer_for(cfg, hooks=[StopAt(step=9)] if name == "cut" else [])
        overflow(trainer, at={2})
        if name == "cut":
            with pytest.raises(Interrupt):
                trainer.fit()
            state = json.loads((tmp_path / "cut" / "checkpoints" / "last" / "state.json").read_text())
            assert state["scaler"]["skipped_steps"] == 1 and state["scaler"]["scale"] == 2.0 ** 15
            trainer = trainer_for(cfg, resume_from=tmp_path / "cut" / "checkpoints" / "last")
        trainer.fit()
        runs[name] = trainer
    full, resumed = runs["full"], runs["cut"]
    assert resumed.scaler.state_dict() == full.scaler.state_dict() and resumed.skipped_steps == 1
    for k, v in full.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k
    assert [r["dev"] for r in resumed.history] == [r["dev"] for r in full.history]


def _grads_of_first_step(env, out_dir, **overrides):
    """(the gradients of the first optimizer step, the batches step_loss saw, all-reduce calls) of a tiny run
    without dropout (the masks of two micro-batches are other draws than one batch's)."""
    trainer = trainer_for(tiny_train_config(env, out_dir, epochs=1, encoder_dropout=0.0,
                                            model={"head_dropout": 0.0}, **overrides))
    rows, calls, grads = [], [], {}
    real_loss = trainer.step_loss

    def step_loss(stream, batch):
        rows.append(len(batch["ids"]))
        return real_loss(stream, batch)

    trainer.step_loss = step_loss

    class Grab(Hook):
        def on_pre_optimizer_step(self, state, control):
            if state.global_step == 0:
                grads.update({n: p.grad.clone() for n, p in zip(trainer.param_names, trainer.params)
                              if p.grad is not None})
                control.should_training_stop = True

    trainer.hooks.append(Grab())
    real_reduce = loop_module.distributed.all_reduce_gradients
    loop_module.distributed.all_reduce_gradients = lambda params: (calls.append(1), real_reduce(params))
    try:
        trainer.fit()
    finally:
        loop_module.distributed.all_reduce_gradients = real_reduce
    return grads, rows, calls, trainer


def test_gradient_accumulation_gives_the_large_batchs_gradients(tiny_env, tmp_path):
    """--batch-size 4 --gradient-accumulation-steps 2 plans the same steps as --batch-size 8 (the schedule counts
    optimizer steps) and takes each as two micro-batches of 4 rows, whose summed gradients are the batch of 8's
    within fp32 rounding; the gradients are reduced once a step (under torchrun: no sync between micro-batches)."""
    big, big_rows, big_calls, a = _grads_of_first_step(tiny_env, tmp_path / "big", batch_size=8)
    acc, acc_rows, acc_calls, b = _grads_of_first_step(tiny_env, tmp_path / "acc", batch_size=4,
                                                       gradient_accumulation_steps=2)
    assert [len(p) for p in a.schedule.epoch_plan(0)] == [len(p) for p in b.schedule.epoch_plan(0)]
    assert a.schedule.epoch_plan(0) == b.schedule.epoch_plan(0)
    assert big_rows == [8] and acc_rows == [4, 4] and big_calls == acc_calls == [1]
    assert big.keys() == acc.keys() and big
    for name in big:
        torch.testing.assert_close(acc[name], big[name], rtol=1e-4, atol=1e-6, msg=name)


def test_early_stopping_ends_a_run_whose_dev_score_stops_improving_and_a_resume_keeps_it(tiny_env, tmp_path,
                                                                                        monkeypatch):
    """--early-stopping-patience 1 on a 4-epoch run whose dev overall is best after epoch 1: training stops after
    epoch 2, the best epoch (1) predicts the dev and test sets as after a full run, and --resume trains nothing
    more (the count is in the checkpoint's records)."""
    scores = iter([0.6, 0.5, 0.7, 0.8] * 2)

    def evaluate_dev(self, model=None):
        return {"overall": next(scores), "sst_acc": 0.5}

    monkeypatch.setattr(Trainer, "evaluate_dev", evaluate_dev)
    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=4, early_stopping_patience=1)
    record = run(cfg)
    assert record["stopped_early"] == 2 and record["best_epoch"] == 1
    assert (tmp_path / "run" / "predictions" / "sst-dev-output.csv").is_file()
    resumed = trainer_for(cfg, resume_from=tmp_path / "run" / "checkpoints" / "last")
    resumed.fit()
    assert resumed.epoch == 2 and len(resumed.history) == 2
