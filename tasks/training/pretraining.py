"""A masked-LM pretraining run on the training loop: its settings (``PretrainConfig``), the ``MaskedLMTrainer``
(tasks/training/trainer.py's loop over the masking collator and the MLM loss of tasks/training/masking.py), its log
(``PretrainLog``), and the Hugging Face checkpoint it leaves (``save_mlm_checkpoint``).

The library behind python -m tasks.pretrain (the command reads its flags and picks the sentences). Its
parameter groups, AdamW and learning rate are fine-tuning's (tasks/training/optim.py), its resumable state is a
checkpoint of the loop (tasks/checkpoint.py: weights, optimizer, position, RNG states, and here the masking
generator, the log's records and the run's identity) in ``<run-dir>/checkpoints/last``, written every
``checkpoint_every`` steps, so that an interrupted run continues to the uninterrupted run's weights and records.

The result (``save_mlm_checkpoint``) is an HF ``BertForMaskedLM`` directory, written atomically: config.json,
model.safetensors (``bert.*`` encoder, pooler kept as loaded, ``cls.predictions.*`` head; the tied decoder weight
is not stored twice), vocab.txt and the tokenizer's files; ``load_pretrained(DIR)`` loads its encoder.

Usage:
    mlm, tokenizer, had_head = load_mlm()               # minbert.mlm: embedded MiniLM + a new head
    records = pretrain(mlm, tokenizer, sentences, PretrainConfig(epochs=1), run_dir=Path("ckpt/mlm.partial"),
                       checkpoint_every=500)
    save_mlm_checkpoint("ckpt/mlm", mlm, tokenizer)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from minbert.mlm import BertForMaskedLM, checkpoint_state, hf_config_dict
from minbert.tokenizer import BertTokenizer
from tasks.checkpoint import read_state, write_training_state
from tasks.logs import count
from tasks.options import option
from tasks.outdir import MLM, check_kind, mark
from tasks.runtime import autocast, autocast_dtype, foreach_default, loss_scaler, precision_note, resolve_device
from tasks.storage import atomic_directory, save_tensors
from tasks.training.hooks import CheckpointEvery, ProgressBar
from tasks.training.loop import Control, Evaluation, Hook, Loop, Step, TrainingState
from tasks.training.masking import MaskedBatches, MaskingCollator, evaluate_mlm, masked_lm_loss
from tasks.training.optim import adamw, warmup_linear
from tasks.training.progress import RunClock, duration

log = logging.getLogger(__name__)


@dataclass
class PretrainConfig:
    """Hyper-parameters of the MLM run; the defaults are the paper's (§4.2) where it gives them. Each field is a
    flag of python -m tasks.pretrain (tasks.options), named as the train command names the same setting.

    The schedule is linear decay to 0 without warmup: the default of the HF
    Trainer that sentence-transformers' train_mlm.py (the paper's code) used.
    """

    epochs: int = option(3, "passes over the sentences", metavar="N")
    batch_size: int = option(32, "sentences per optimizer step", metavar="B")
    lr: float = option(5e-5, "peak AdamW learning rate (paper §4.2: 5e-5)", metavar="LR")
    weight_decay: float = option(0.0, "AdamW weight decay, never on biases or LayerNorm", metavar="DECAY")
    warmup: float = option(0.0, "fraction of the steps with linear warm-up", metavar="FRACTION")
    lr_schedule: str = option("linear", "after warm-up: linear = decay to 0 (the HF Trainer's), constant",
                              choices=("linear", "constant"))
    grad_clip: float = option(1.0, "clip the global gradient norm to this, 0 = off", metavar="NORM")
    max_length: int = option(128, "tokens per sentence, [CLS]/[SEP] included", metavar="T")
    mlm_probability: float = option(0.15, "fraction of tokens masked (BERT §3.1: 15%)", metavar="P")
    max_steps: int | None = option(None, "stop after N optimizer steps (CPU budgets); default: whole epochs",
                                   metavar="N")
    seed: int = option(0, "shuffling, masking and a new head's init", metavar="SEED")
    log_every: int = option(50, "one log line every N steps", metavar="N")
    device: str = option("auto", "auto (cuda when available), cpu, cuda, cuda:N", metavar="DEVICE")
    bf16: bool | None = option(None, "bf16 autocast; default: on GPUs with native bf16, fp32 on CPUs (ask with "
                               "--bf16)")

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be at least 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not 0.0 <= self.warmup < 1.0:
            raise ValueError(f"warmup must be in [0, 1), got {self.warmup}")
        if self.lr_schedule not in ("linear", "constant"):
            raise ValueError(f"lr_schedule must be 'linear' or 'constant', got {self.lr_schedule!r}")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be at least 1 (or None for whole epochs), got {self.max_steps}")
        if self.max_length < 3:
            raise ValueError(f"max_length must be at least 3, got {self.max_length}")
        if self.log_every < 1:
            raise ValueError(f"log_every must be at least 1, got {self.log_every}")
        if self.grad_clip < 0:
            raise ValueError(f"grad_clip must be >= 0 (0 = off), got {self.grad_clip}")


class MaskedLMTrainer(Loop):
    """MLM pretraining on the loop: batches from a ``MaskingCollator``, the MLM loss, AdamW over ``parameter_groups``
    (no lr factors), BERT's warm-up then linear decay (or constant) over ``total`` steps, clipping at
    ``grad_clip``; the held-out batches scored before the first step (not on a resume) and after the last.

    Masks are drawn while collating, so batches are collated in line (``prefetch`` False) and a checkpoint keeps the
    collator's generator; none is written at an epoch's end (``CheckpointEvery`` saves every N steps).

    Its log window runs over global steps, across epochs: a line every ``log_every`` steps and after the last, with
    the window's mean MLM loss, the epoch reached, lr and real tokens a second; the open window travels with a
    checkpoint, so that a resumed run's lines are the uninterrupted run's."""

    prefetch = False
    stage = "mlm"

    def __init__(self, mlm: BertForMaskedLM, data: MaskingCollator, config: PretrainConfig, *, total: int,
                 device: torch.device, eval_data: MaskedBatches | None = None, identity: dict | None = None,
                 hooks: Sequence[Hook] = (), checkpoints: Path | None = None) -> None:
        amp_dtype = autocast_dtype(config.bf16, device, cpu_default=False)  # fp16 on a GPU without native bf16
        super().__init__(mlm, device=device, hooks=hooks, grad_clip=config.grad_clip, seed=config.seed,
                         checkpoints=checkpoints, scaler=loss_scaler(device, amp_dtype))
        self.data, self.config, self.eval_data, self.identity = data, config, eval_data, identity or {}
        self.amp_dtype = amp_dtype
        self.epochs, self.max_steps, self.warmup = config.epochs, total, int(config.warmup * total)
        self.log_every = config.log_every
        self.window_loss = torch.zeros((), device=device)
        self.window_steps = self.window_tokens = 0
        self.window_seconds = 0.0  # a resumed window's time before the cut
        self.window_start: float | None = None
        self.params, self.param_names, self.optimizer = adamw(mlm.named_parameters(), lr=config.lr,
                                                              weight_decay=config.weight_decay,
                                                              foreach=foreach_default(device))

    @property
    def epoch_title(self) -> str:
        return f"mlm epoch {self.epoch + 1}/{self.epochs}"

    def epoch_plan(self, epoch: int) -> list[tuple[str, list[int]]]:
        return [("mlm", batch) for batch in self.data.epoch_batches()]

    def collate(self, stream: str, indices: list[int]) -> dict:
        return self.data.collate(indices)

    def step_loss(self, stream: str, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        with autocast(self.device, self.amp_dtype):
            return masked_lm_loss(self.model, batch), {}

    def lr_at(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        config = self.config
        return warmup_linear(config.lr, self.global_step, self.max_steps, self.warmup,
                             decay=config.lr_schedule == "linear")

    def begin(self) -> None:
        if self.eval_data is not None and self.global_step == 0:
            self.evaluate_held_out()

    def finish(self) -> None:
        if self.eval_data is not None:
            self.evaluate_held_out()
        self.model.eval()

    # -- its log window --
    def start_window(self) -> None:
        if self.window_start is None:  # the steps' time: not the held-out scoring before them
            self.window_start = time.perf_counter() - self.window_seconds

    def add_to_window(self, step: Step) -> None:
        if not step.skipped:  # fp16's scaler skipped it: its loss may be inf
            self.window_loss += step.terms["loss"]
            self.window_steps += 1
        self.window_tokens += step.batch["tokens"]

    def log_due(self, step: Step) -> bool:
        return not self.global_step % self.log_every or self.global_step == self.max_steps

    def log_values(self, step: Step) -> dict[str, float]:
        elapsed = time.perf_counter() - self.window_start
        values = {"epoch": self.global_step / self.data.steps_per_epoch,
                  "loss": float(self.window_loss) / max(self.window_steps, 1), "lr": step.lr,
                  "tokens_per_s": self.window_tokens / max(elapsed, 1e-9)}
        self.window_loss.zero_()
        self.window_steps, self.window_tokens, self.window_start = 0, 0, time.perf_counter()
        return values

    def evaluate_held_out(self) -> dict[str, float]:
        """The held-out batches' masked-token loss and accuracy, for the hooks (``on_evaluate``)."""
        t0 = time.perf_counter()
        result = evaluate_mlm(self.model, self.eval_data, self.device)
        self.emit("on_evaluate", Evaluation("held-out", result, time.perf_counter() - t0,
                                            self.eval_data.n_sentences))
        return result

    def state(self) -> dict:
        """The loop's state.json, the masking generator's states, the run's identity (its settings and data) and
        the open log window."""
        seconds = time.perf_counter() - self.window_start if self.window_start is not None else self.window_seconds
        return {**super().state(), "masking": self.data.state(), "identity": self.identity,
                "log_window": {"loss": float(self.window_loss), "steps": self.window_steps,
                               "tokens": self.window_tokens, "seconds": seconds}}

    def load_checkpoint(self, ckpt: Path, state: dict) -> None:
        super().load_checkpoint(ckpt, state)
        self.data.load_state(state["masking"])
        # a checkpoint of an earlier version kept the window in its log hook's state, as window_<key>
        window = state.get("log_window") or {k.removeprefix("window_"): v for k, v in
                                             state.get("hooks", {}).get("PretrainLog", {}).items()
                                             if k.startswith("window_")}
        self.window_loss = torch.full((), float(window["loss"]), device=self.device)
        self.window_steps, self.window_tokens = window["steps"], window["tokens"]
        self.window_seconds = window["seconds"]
        self.window_start = None

    def write_checkpoint_dir(self, final: Path, state: dict) -> None:
        with atomic_directory(final) as tmp:
            write_training_state(tmp, model=self.model, optimizer=self.optimizer, param_names=self.param_names,
                                 state=state)


class PretrainLog(Hook):
    """Pretraining's log and its records (pretrain_log.jsonl): the held-out scores before and after, and each log
    line's values (``MaskedLMTrainer``'s window: mean MLM loss, epoch reached, lr, real tokens a second) with the
    elapsed and remaining time; an estimate of the whole after the first line. The records travel with a checkpoint
    (``state``), so a resumed run's are the uninterrupted run's."""

    def __init__(self, total: int, batch_size: int, eval_sentences: int) -> None:
        self.total, self.batch_size, self.eval_sentences = total, batch_size, eval_sentences
        self.records: list[dict] = []
        self.clock: RunClock | None = None
        self.steps = 0  # since the last line, for the clock
        self.t_last: float | None = None

    def on_train_start(self, state: TrainingState, control: Control) -> None:
        self.clock = RunClock(self.total - state.global_step, evals_left=0, eval_sequences=0,
                              final_sequences=self.eval_sentences)
        self.t_last = None

    def on_epoch_start(self, state: TrainingState, control: Control) -> None:
        if self.t_last is None:  # the steps' time: not the held-out scoring before them
            self.t_last = time.perf_counter()

    def on_evaluate(self, state: TrainingState, control: Control, evaluation: Evaluation) -> None:
        result, step = evaluation.metrics, state.global_step
        before = next((r for r in self.records if "eval_loss" in r), None)
        self.records.append({"step": step, "eval_loss": result["loss"], "eval_accuracy": result["accuracy"]})
        if before is None:
            self.clock.evaluated(evaluation.seconds, evaluation.sequences)
            log.info("held-out MLM (%d sentences, %d masked tokens): loss %.4f, accuracy %.4f",
                     evaluation.sequences, result["masked_tokens"], result["loss"], result["accuracy"])
        else:
            log.info("held-out MLM after %d steps: loss %.4f (was %.4f), accuracy %.4f (was %.4f)", step,
                     result["loss"], before["eval_loss"], result["accuracy"], before["eval_accuracy"])

    def on_step_end(self, state: TrainingState, control: Control, step: Step) -> None:
        self.steps += 1

    def on_log(self, state: TrainingState, control: Control, values: dict[str, float]) -> None:
        record = {"step": state.global_step, **values}
        self.records.append(record)
        now = time.perf_counter()
        # its sentences counted as full batches: only the estimate of an evaluation not yet timed uses them
        first_window = self.clock.trained(self.steps, self.steps * self.batch_size, now - self.t_last)
        log.info("step %d/%d epoch %.2f mlm_loss %.4f lr %.2e %.0f tok/s | %s", state.global_step, self.total,
                 record["epoch"], record["loss"], record["lr"], record["tokens_per_s"], self.clock.line())
        if first_window:
            log.info("estimate after %d steps: the pretraining takes ~%s in all", self.steps,
                     duration(self.clock.total()))
        self.steps, self.t_last = 0, now

    def state(self) -> dict:
        return {"records": self.records}

    def load_state(self, state: dict) -> None:
        self.records = state["records"]


def pretrain(mlm: BertForMaskedLM, tokenizer: BertTokenizer, sentences: Sequence[str], config: PretrainConfig,
             eval_data: MaskedBatches | None = None, run_dir: str | os.PathLike[str] | None = None,
             checkpoint_every: int = 0, identity: dict | None = None, hooks: Sequence[Hook] = ()) -> list[dict]:
    """Train ``mlm`` in place on ``sentences``; returns the log records (also logged as lines).

    Batches are length-bucketed and reshuffled every epoch, masks redrawn for
    every batch; both come from one generator seeded by ``config.seed``.
    Dropout uses torch's global RNG (seed it before calling for a repeatable run).

    With ``run_dir`` (``<out-dir>.partial``), every ``checkpoint_every`` steps the whole state is written to its
    checkpoints/last, and a call that finds one continues from it: the result is the uninterrupted run's, bit for
    bit. ``identity`` (the settings and data; the config is added) must equal the saved one, or the call refuses to
    mix two runs. ``hooks`` see the loop's events after the run's own.
    """
    if not sentences:
        raise ValueError("no sentences to pretrain on")
    device = resolve_device(config.device)
    mlm.to(device).train()
    data = MaskingCollator(tokenizer, sentences, max_length=config.max_length, batch_size=config.batch_size,
                           mlm_probability=config.mlm_probability, seed=config.seed)
    total = config.epochs * data.steps_per_epoch
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    identity = {**(identity or {}), "config": asdict(config), "sentences": len(data)}
    log_hook = PretrainLog(total, config.batch_size, eval_data.n_sentences if eval_data is not None else 0)
    checkpoints = Path(run_dir) / "checkpoints" if run_dir is not None else None
    trainer = MaskedLMTrainer(mlm, data, config, total=total, device=device, eval_data=eval_data, identity=identity,
                              hooks=[log_hook, ProgressBar(), CheckpointEvery(checkpoint_every), *hooks],
                              checkpoints=checkpoints)
    log.info("%s, %s, %s | plan: MLM pretraining on %d sentences, %s (%d per epoch, batch %d), "
             "lr %g%s", device, precision_note(config.bf16, device, trainer.amp_dtype, cpu_default=False),
             count(torch.get_num_threads(), "thread"), len(data), count(total, "step"), data.steps_per_epoch,
             config.batch_size, config.lr,
             f"; held-out MLM scored before and after on {eval_data.n_sentences} sentences" if eval_data else "")
    if run_dir is not None:
        resume_from(trainer, Path(run_dir), total)
    trainer.fit()
    return log_hook.records


def resume_from(trainer: MaskedLMTrainer, run_dir: Path, total: int) -> None:
    """Continue the pretraining interrupted in ``run_dir`` when it left a checkpoint there; refuse one of other
    settings or data, naming what differs, and the resumable state of an earlier version of this command."""
    if (run_dir / "state" / "state.json").is_file():
        raise ValueError(f"{run_dir / 'state'} holds a pretraining interrupted under an earlier version of this "
                         f"command, which this one cannot continue: delete {run_dir} to start afresh")
    ckpt = trainer.checkpoints / "last"
    saved = read_state(ckpt)
    if saved is None:
        return
    if saved["identity"] != trainer.identity:
        mine, theirs = _flat(trainer.identity), _flat(saved["identity"])
        differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        raise ValueError(f"{ckpt} holds an interrupted pretraining with other settings or data ("
                         + ", ".join(f"{k}: {theirs.get(k)!r} there, {mine.get(k)!r} now" for k in differ[:4])
                         + "): run its command again to continue it, or pretrain into another --out-dir")
    trainer.load_checkpoint(ckpt, saved)
    log.info("resuming from %s: step %d of %d", ckpt, trainer.global_step, total)


def _flat(d: dict, prefix: str = "") -> dict:
    """{"a.b": value} of nested dicts, for naming what differs."""
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


# ---- the checkpoint a pretraining leaves ----

# Tokenizer files copied into a checkpoint when the source directory has them.
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "tokenizer.json")


def check_replaceable(out: Path, overwrite: bool = False) -> None:
    """``out`` may become an MLM checkpoint directory: absent, empty or an MLM checkpoint (replaced); another
    command's output or a directory of other files only with ``overwrite`` (replaced whole); a file never.
    A FileExistsError otherwise (checked before pretraining, and again when saving)."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} is a file; --out-dir must be a directory")
    if check_kind(out, MLM, overwrite=overwrite) is None and out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} exists and is not a checkpoint directory; refusing to replace it: choose "
                              "another --out-dir, or pass --overwrite")


def save_mlm_checkpoint(out_dir: str | os.PathLike[str], mlm: BertForMaskedLM, tokenizer: BertTokenizer,
                        extra_files: dict[str, str] | None = None, overwrite: bool = False) -> Path:
    """Write an HF checkpoint directory atomically (tasks.storage.atomic_directory, in the user's folder).

    Holds config.json, model.safetensors, vocab.txt and the tokenizer's
    tokenizer_config.json / special_tokens_map.json / tokenizer.json when its
    directory has them (a minimal tokenizer_config.json otherwise), plus
    ``extra_files`` (name -> text) and its owner.json (tasks.outdir). What
    ``check_replaceable`` allows at ``out_dir`` is replaced whole.
    """
    out = Path(out_dir)
    check_replaceable(out, overwrite)
    with atomic_directory(out, user_folder=True) as tmp:
        (tmp / "config.json").write_text(json.dumps(hf_config_dict(mlm.bert.config), indent=2) + "\n")
        save_tensors(tmp / "model.safetensors", checkpoint_state(mlm), metadata={"format": "pt"})
        src = Path(tokenizer.vocab_file)
        shutil.copyfile(src, tmp / "vocab.txt")
        for name in TOKENIZER_FILES:
            if (src.parent / name).is_file():
                shutil.copyfile(src.parent / name, tmp / name)
        if not (tmp / "tokenizer_config.json").is_file():
            (tmp / "tokenizer_config.json").write_text(json.dumps({
                "do_lower_case": tokenizer.do_lower_case, "strip_accents": tokenizer.strip_accents,
                "tokenize_chinese_chars": tokenizer.tokenize_chinese_chars,
                "model_max_length": tokenizer.model_max_length, "tokenizer_class": "BertTokenizer"}, indent=2) + "\n")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        mark(tmp, MLM)
    return out
