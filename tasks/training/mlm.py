"""Masked-LM pretraining: the training loop, BERT's masking, the MLM checkpoint, the resumable state.

The library behind python -m tasks.pretrain (the command reads its flags and picks
the sentences; everything it runs is here). The MLM head and the ``BertForMaskedLM``
model are the encoder's (minbert/mlm.py); this module trains them:

- BERT's masking (``mask_tokens``), the task sentences (``collect_sentences``),
  ``PretrainConfig`` and the loop itself (``pretrain``, ``evaluate_mlm``), whose
  parameter groups and learning rate are the trainer's (``parameter_groups``,
  ``warmup_linear`` in tasks/training/trainer.py): one rule for both loops;
- the checkpoint (``save_mlm_checkpoint``): an HF ``BertForMaskedLM`` directory,
  written atomically: config.json, model.safetensors (``bert.*`` encoder, pooler
  kept as loaded, ``cls.predictions.*`` head; the tied decoder weight is not
  stored twice), vocab.txt and tokenizer files. ``load_pretrained(DIR)`` loads
  its encoder;
- the resumable state of a run (``Progress``, ``save_progress`` /
  ``load_progress`` in ``<out-dir>.partial``), so that an interrupted run
  continues to the uninterrupted run's weights.

Usage:
    mlm, tokenizer, had_head = load_mlm()               # minbert.mlm: embedded MiniLM + a new head
    records = pretrain(mlm, tokenizer, collect_sentences("data"), PretrainConfig(epochs=1),
                       state_dir=partial_dir("checkpoints/mlm"), checkpoint_every=500)
    save_mlm_checkpoint("checkpoints/mlm", mlm, tokenizer)
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from minbert.mlm import IGNORE_INDEX, BertForMaskedLM, checkpoint_state, hf_config_dict, masked_positions
from minbert.optimizer import AdamW
from minbert.tokenizer import BertTokenizer
from tasks.data.datasets import length_bucketed_batches
from tasks.task import MULTITASK, load_split
from tasks.outdir import MLM, check_kind, mark
from tasks.checkpoint import load_optimizer_state, optimizer_state
from tasks.storage import atomic_directory, load_tensors, read_json, save_tensors, write_json
from tasks.options import option
from tasks.training.progress import RunClock, duration
from tasks.training.optim import parameter_groups, warmup_linear
from tasks.runtime import autocast, autocast_dtype, foreach_default, precision_note, resolve_device

log = logging.getLogger(__name__)


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
    """Write an HF checkpoint directory atomically (a temporary sibling, then os.replace).

    Holds config.json, model.safetensors, vocab.txt and the tokenizer's
    tokenizer_config.json / special_tokens_map.json / tokenizer.json when its
    directory has them (a minimal tokenizer_config.json otherwise), plus
    ``extra_files`` (name -> text) and its owner.json (tasks.outdir). What
    ``check_replaceable`` allows at ``out_dir`` is replaced whole.
    """
    out = Path(out_dir)
    check_replaceable(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
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
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp (and safetensors) make files private
        for f in tmp.iterdir():
            os.chmod(f, 0o666 & ~umask)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.replace(out, old / out.name)
            os.replace(tmp, out)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# ---- the resumable state of a pretraining run ----
@dataclass
class Progress:
    """Where a pretraining run stands: ``step`` steps taken, ``done_in_epoch`` batches of epoch ``epoch`` done,
    whose batch order was drawn from ``epoch_rng`` (the generator's state at the epoch's start)."""

    step: int = 0
    epoch: int = 0
    done_in_epoch: int = 0
    epoch_rng: torch.Tensor | None = None
    records: list[dict] = field(default_factory=list)
    window_loss: float = 0.0  # the log window's running sums, so the next log line is the uninterrupted one's
    window_steps: int = 0
    window_tokens: int = 0
    window_seconds: float = 0.0  # and its training time so far, so its speed is not taken over the resumed part


def partial_dir(out_dir: str | os.PathLike[str]) -> Path:
    """Where a run writing ``out_dir`` keeps its state for resuming (``<out-dir>.partial``)."""
    out = Path(out_dir)
    return out.with_name(out.name + ".partial")


def save_progress(state: Path, identity: dict, mlm: nn.Module, opt: torch.optim.Optimizer, names: list[str],
                  g: torch.Generator, where: Progress) -> None:
    """Everything a resumed call needs, in ``state`` (replaced atomically: a kill mid-write keeps the last)."""
    tensors, meta = optimizer_state(opt, names)
    with atomic_directory(state) as tmp:
        save_tensors(tmp / "model.safetensors", mlm.state_dict())
        save_tensors(tmp / "optimizer.safetensors", tensors)
        save_tensors(tmp / "rng.safetensors", {"torch": torch.get_rng_state(), "generator": g.get_state(),
                                               "epoch_generator": where.epoch_rng})
        write_json(tmp / "state.json", {"identity": identity, "optimizer": meta,
                                        **{f.name: getattr(where, f.name) for f in fields(Progress)
                                           if f.name != "epoch_rng"}})


def load_progress(state: Path, identity: dict, mlm: nn.Module, opt: torch.optim.Optimizer, names: list[str],
                  g: torch.Generator) -> Progress:
    """The saved run's weights, optimizer and RNG states put back; its position returned. A run with other
    settings or data is refused, naming what differs."""
    saved = read_json(state / "state.json")
    if saved["identity"] != identity:
        mine, theirs = _flat(identity), _flat(saved["identity"])
        differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        raise ValueError(f"{state} holds an interrupted pretraining with other settings or data ("
                         + ", ".join(f"{k}: {theirs.get(k)!r} there, {mine.get(k)!r} now" for k in differ[:4])
                         + f"): run its command again to continue it, or delete {state} to start afresh")
    mlm.load_state_dict(load_tensors(state / "model.safetensors"))
    load_optimizer_state(opt, load_tensors(state / "optimizer.safetensors"), saved["optimizer"], names)
    rng = load_tensors(state / "rng.safetensors")
    torch.set_rng_state(rng["torch"])
    g.set_state(rng["generator"])
    saved.setdefault("window_seconds", 0.0)  # a state.json without it resumes its log window's time from 0
    return Progress(epoch_rng=rng["epoch_generator"],
                    **{f.name: saved[f.name] for f in fields(Progress) if f.name != "epoch_rng"})


def _flat(d: dict, prefix: str = "") -> dict:
    """{"a.b": value} of nested dicts, for naming what differs."""
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


# ---- masking, the task sentences, and the pretraining loop ----


def never_masked_ids(tokenizer: BertTokenizer) -> list[int]:
    """[PAD], [CLS], [SEP], and [UNK] / [MASK] (HF's collator never masks special tokens either)."""
    return sorted({tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id,
                   tokenizer.unk_token_id, tokenizer.mask_token_id})


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    mask_token_id: int,
    vocab_size: int,
    special_ids: Sequence[int],
    generator: torch.Generator | None = None,
    mlm_probability: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: returns (masked input_ids, labels), both (B, T) long, on the input's device.

    Each token not in ``special_ids`` is chosen with probability
    ``mlm_probability``; a chosen token becomes [MASK] (80%), a random token
    that is not special (10%), or stays (10%). ``labels`` holds the original
    id at chosen positions and -100 elsewhere. When a batch would have no
    chosen token at all (a few very short sentences), one eligible token is
    chosen so the loss is defined. Random draws come from ``generator``
    (CPU), so a seed fixes the masks.
    """
    if not 0.0 < mlm_probability < 1.0:
        raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
    device = input_ids.device
    ids = input_ids.cpu()
    special = torch.tensor(list(special_ids), dtype=torch.long)
    eligible = ~torch.isin(ids, special)  # (B, T)
    chosen = (torch.rand(ids.shape, generator=generator) < mlm_probability) & eligible
    if not chosen.any() and eligible.any():
        flat = eligible.reshape(-1).nonzero().squeeze(1)
        pick = flat[torch.randint(len(flat), (1,), generator=generator)]
        chosen.view(-1)[pick] = True
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
    action = torch.rand(ids.shape, generator=generator)  # < 0.8 mask, < 0.9 random, else keep
    to_mask = chosen & (action < 0.8)
    to_random = chosen & (action >= 0.8) & (action < 0.9)
    masked = ids.clone()
    masked[to_mask] = mask_token_id
    n_random = int(to_random.sum())
    if n_random:
        allowed = torch.ones(vocab_size, dtype=torch.bool)
        allowed[special[special < vocab_size]] = False
        pool = allowed.nonzero().squeeze(1)  # (V',) non-special ids
        masked[to_random] = pool[torch.randint(len(pool), (n_random,), generator=generator)]
    return masked.to(device), labels.to(device)


def collect_sentences(data_dir: str | os.PathLike[str], split: str = "train",
                      tasks: Sequence[str] = MULTITASK) -> list[str]:
    """Every distinct sentence of the tasks' ``split`` files (SST sentences, both sides of pairs), first-seen order."""
    seen: dict[str, None] = {}
    for task in tasks:
        loaded = load_split(task, split, data_dir)
        if loaded is None:  # only a test split can be absent
            continue
        for ex in loaded[0]:
            for text in (ex.text_a, ex.text_b):
                if text:
                    seen.setdefault(text, None)
    return list(seen)


def shuffled(items: Sequence[str], seed: int) -> list[str]:
    """A seeded permutation of ``items`` (torch's generator: the same on every platform)."""
    g = torch.Generator().manual_seed(seed)
    return [items[i] for i in torch.randperm(len(items), generator=g).tolist()]


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


@dataclass
class MaskedBatches:
    """Pre-tokenized, pre-masked batches: a fixed evaluation set (same masks before and after)."""

    batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # (input_ids, attention_mask, labels)
    n_sentences: int


def make_eval_batches(tokenizer: BertTokenizer, sentences: Sequence[str], max_length: int, batch_size: int,
                      seed: int, mlm_probability: float = 0.15) -> MaskedBatches:
    ids, _ = tokenizer.encode_ids(list(sentences), max_length=max_length)
    lengths = [len(x) for x in ids]
    g = torch.Generator().manual_seed(seed)
    special = never_masked_ids(tokenizer)
    batches = []
    for idx in length_bucketed_batches(lengths, batch_size, shuffle=False):
        padded = tokenizer.pad([ids[i] for i in idx])
        inputs, labels = mask_tokens(padded["input_ids"], mask_token_id=tokenizer.mask_token_id,
                                     vocab_size=len(tokenizer), special_ids=special, generator=g,
                                     mlm_probability=mlm_probability)
        batches.append((inputs, padded["attention_mask"], labels))
    return MaskedBatches(batches, len(sentences))


@torch.no_grad()
def evaluate_mlm(mlm: BertForMaskedLM, data: MaskedBatches, device: str | torch.device = "cpu") -> dict[str, float]:
    """Masked-token loss (mean over masked tokens) and top-1 accuracy, in eval mode (no dropout)."""
    device = torch.device(device)
    amp_dtype = autocast_dtype(None, device, cpu_default=False)  # as without --bf16: comparable losses
    was_training = mlm.training
    mlm.eval()
    total_loss, correct, count = 0.0, 0, 0
    try:
        for inputs, attention_mask, labels in data.batches:
            with autocast(device, amp_dtype):
                _, logits, targets = mlm.masked_lm_loss(inputs.to(device), attention_mask.to(device), labels.to(device),
                                                        masked_positions(labels).to(device))
            total_loss += float(F.cross_entropy(logits.float(), targets, reduction="sum"))
            correct += int((logits.argmax(-1) == targets).sum())
            count += targets.numel()
    finally:
        mlm.train(was_training)
    return {"loss": total_loss / max(count, 1), "accuracy": correct / max(count, 1), "masked_tokens": count}


def pretrain(
    mlm: BertForMaskedLM,
    tokenizer: BertTokenizer,
    sentences: Sequence[str],
    config: PretrainConfig,
    eval_data: MaskedBatches | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    checkpoint_every: int = 0,
    identity: dict | None = None,
) -> list[dict]:
    """Train ``mlm`` in place on ``sentences``; returns the log records (also logged as lines).

    Batches are length-bucketed and reshuffled every epoch, masks redrawn for
    every batch; both come from one generator seeded by ``config.seed``.
    Dropout uses torch's global RNG (seed it before calling for a repeatable run).

    With ``state_dir``, every ``checkpoint_every`` steps the whole state (weights, optimizer, both RNGs, the
    position in the epoch, the records) is written there atomically, and a call that finds one continues from
    it: the result is the uninterrupted run's, bit for bit. ``identity`` (the settings and data; the config is
    added) must equal the saved one, or the call refuses to mix two runs.
    """
    if not sentences:
        raise ValueError("no sentences to pretrain on")
    device = resolve_device(config.device)
    amp_dtype = autocast_dtype(config.bf16, device, cpu_default=False)
    mlm.to(device).train()
    ids, _ = tokenizer.encode_ids(list(sentences), max_length=config.max_length)
    lengths = [len(x) for x in ids]
    steps_per_epoch = math.ceil(len(ids) / config.batch_size)
    total = config.epochs * steps_per_epoch
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    warmup = int(config.warmup * total)
    groups, names = parameter_groups(list(mlm.named_parameters()), config.weight_decay)  # the trainer's rule
    opt = AdamW(groups, lr=config.lr, weight_decay=config.weight_decay, decay="before",  # the trainer's order
                foreach=foreach_default(device))
    params = [p for group in opt.param_groups for p in group["params"]]
    g = torch.Generator().manual_seed(config.seed)
    special = never_masked_ids(tokenizer)
    identity = {**(identity or {}), "config": asdict(config), "sentences": len(ids)}
    state = Path(state_dir) if state_dir is not None else None
    log.info("%s, %s, %d threads | plan: MLM pretraining on %d sentences, %d steps (%d per epoch, batch %d), "
             "lr %g%s", device, precision_note(config.bf16, device, amp_dtype, cpu_default=False),
             torch.get_num_threads(), len(ids), total, steps_per_epoch, config.batch_size, config.lr,
             f"; held-out MLM scored before and after on {eval_data.n_sentences} sentences" if eval_data else "")
    resumed = state is not None and (state / "state.json").is_file()
    if resumed:
        where = load_progress(state, identity, mlm, opt, names, g)
        log.info("resuming from %s: step %d of %d", state, where.step, total)
    else:
        where = Progress()
    clock = RunClock(total - where.step, evals_left=0, eval_sequences=0,
                     final_sequences=eval_data.n_sentences if eval_data is not None else 0)
    if eval_data is not None and not resumed:
        t0 = time.perf_counter()
        before = evaluate_mlm(mlm, eval_data, device)
        clock.evaluated(time.perf_counter() - t0, eval_data.n_sentences)
        where.records.append({"step": 0, "eval_loss": before["loss"], "eval_accuracy": before["accuracy"]})
        log.info("held-out MLM (%d sentences, %d masked tokens): loss %.4f, accuracy %.4f",
                 eval_data.n_sentences, before["masked_tokens"], before["loss"], before["accuracy"])
    progress = None
    if sys.stderr.isatty():
        from tqdm import tqdm
        progress = tqdm(total=total, initial=where.step, desc="mlm", unit="step")
    step, records = where.step, where.records
    window_loss = torch.full((), where.window_loss, device=device)
    window_steps, window_tokens = where.window_steps, where.window_tokens
    window_start = time.perf_counter() - where.window_seconds
    try:
        for epoch in range(where.epoch, config.epochs):
            if step >= total:
                break
            if where.epoch_rng is not None:  # resumed inside this epoch: its batches, drawn again, then on
                now = g.get_state()
                g.set_state(where.epoch_rng)
                batches = length_bucketed_batches(lengths, config.batch_size, shuffle=True, generator=g)
                g.set_state(now)
                epoch_rng, first, where.epoch_rng = where.epoch_rng, where.done_in_epoch, None
            else:
                epoch_rng, first = g.get_state(), 0
                batches = length_bucketed_batches(lengths, config.batch_size, shuffle=True, generator=g)
            for i in range(first, len(batches)):
                if step >= total:
                    break
                padded = tokenizer.pad([ids[j] for j in batches[i]])
                inputs, labels = mask_tokens(padded["input_ids"], mask_token_id=tokenizer.mask_token_id,
                                             vocab_size=len(tokenizer), special_ids=special, generator=g,
                                             mlm_probability=config.mlm_probability)
                attention_mask = padded["attention_mask"]
                window_tokens += int(attention_mask.sum())
                positions = masked_positions(labels).to(device, non_blocking=True)  # on the CPU, where labels are
                inputs = inputs.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
                attention_mask = attention_mask.to(device, non_blocking=True)
                with autocast(device, amp_dtype):
                    loss, _, _ = mlm.masked_lm_loss(inputs, attention_mask, labels, positions)
                loss.backward()
                if config.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
                lr = warmup_linear(config.lr, step, total, warmup, decay=config.lr_schedule == "linear")
                for group in opt.param_groups:
                    group["lr"] = lr
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                window_loss += loss.detach()
                window_steps += 1
                if progress is not None:
                    progress.update(1)
                if step % config.log_every == 0 or step == total:
                    elapsed = time.perf_counter() - window_start
                    rec = {"step": step, "epoch": step / steps_per_epoch,
                           "loss": float(window_loss) / window_steps, "lr": lr,
                           "tokens_per_s": window_tokens / max(elapsed, 1e-9)}
                    records.append(rec)
                    # the window's seconds (a resumed window's include the time before the cut); its sentences
                    # counted as full batches: only the estimate of an evaluation not yet timed uses them
                    first_window = clock.trained(window_steps, window_steps * config.batch_size, elapsed)
                    log.info("step %d/%d epoch %.2f mlm_loss %.4f lr %.2e %.0f tok/s | %s", step, total,
                             rec["epoch"], rec["loss"], lr, rec["tokens_per_s"], clock.line())
                    if first_window:
                        log.info("estimate after %d steps: the pretraining takes ~%s in all", window_steps,
                                 duration(clock.total()))
                    window_loss.zero_()
                    window_steps, window_tokens, window_start = 0, 0, time.perf_counter()
                if state is not None and checkpoint_every and step % checkpoint_every == 0 and step < total:
                    save_progress(state, identity, mlm, opt, names, g, Progress(
                        step=step, epoch=epoch, done_in_epoch=i + 1, epoch_rng=epoch_rng, records=records,
                        window_loss=float(window_loss), window_steps=window_steps, window_tokens=window_tokens,
                        window_seconds=time.perf_counter() - window_start))
    finally:
        if progress is not None:
            progress.close()
    if eval_data is not None:
        after = evaluate_mlm(mlm, eval_data, device)
        records.append({"step": step, "eval_loss": after["loss"], "eval_accuracy": after["accuracy"]})
        log.info("held-out MLM after %d steps: loss %.4f (was %.4f), accuracy %.4f (was %.4f)", step,
                 after["loss"], records[0]["eval_loss"], after["accuracy"], records[0]["eval_accuracy"])
    mlm.eval()
    return records

