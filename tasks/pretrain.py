"""Additional masked-LM pretraining of the encoder on the task sentences.

Sun et al. (2020), "How to fine-tune BERT for text classification?", further
pretrain on in-domain text before fine-tuning; the minBERT paper (§4.2,
../shared/papers/minbert-downstream-generalization.txt) does it on the
sentences of the three task datasets: the SST sentences and both sides of the
Quora and STS pairs (train files), combined, deduplicated and shuffled, trained
with the masked-LM objective only, AdamW, lr 5e-5, 3 epochs.

Masking is BERT's (Devlin et al., 2019, §3.1): 15% of the tokens are chosen
(never [CLS], [SEP], [PAD], nor [UNK] / [MASK], as Hugging Face's collator);
of those, 80% become [MASK], 10% a random vocabulary token, 10% stay. Masks are
drawn afresh for every batch (dynamic masking) from one seeded generator. The
loss is cross-entropy over the chosen positions only; the MLM head's vocabulary
projection runs on those positions only (about 7x fewer rows than all tokens).

The MLM head and its checkpoint format are in tasks/mlm.py. The result is a
Hugging Face ``BertForMaskedLM`` checkpoint directory (``save_mlm_checkpoint``)
plus pretrain_config.json and pretrain_log.jsonl; ``train_multitask.py
--pretrained DIR`` loads its encoder.

A long run resumes: every ``--checkpoint-every`` steps the whole state goes
to ``<out-dir>.partial`` (atomically), and the same command again continues
from it to the uninterrupted run's weights, bit for bit (other settings or
data are refused); it is removed once the checkpoint is written. On a CPU the
steps run in fp32 unless ``--bf16`` asks for autocast.

Usage:
    python -m tasks.pretrain --out-dir checkpoints/mlm-minilm                 # embedded MiniLM, 3 epochs (again: resumes)
    python -m tasks.pretrain --out-dir ckpt/mlm --max-sentences 5000 --epochs 1   # a CPU-sized run
    python train_multitask.py --pretrained checkpoints/mlm-minilm ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from minbert.optimizer import AdamW
from minbert.pretrained import resolve_model_dir
from minbert.tokenizer import BertTokenizer
from tasks.argparsing import Parser
from tasks.data import length_bucketed_batches
from tasks.errors import user_errors
from tasks.mlm import (IGNORE_INDEX, BertForMaskedLM, check_replaceable, load_mlm, masked_positions,
                       save_mlm_checkpoint)
from tasks.pretrain_resume import Progress, load_progress, partial_dir, save_progress
from tasks.readers import load_split
from tasks.runtime import autocast, autocast_dtype, foreach_default, resolve_device

log = logging.getLogger(__name__)

PRETRAIN_TASKS = ("sst", "para", "sts")


# ---- masking ---------------------------------------------------------------------------


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


# ---- data ----------------------------------------------------------------------------------


def collect_sentences(data_dir: str | os.PathLike[str], split: str = "train",
                      tasks: Sequence[str] = PRETRAIN_TASKS) -> list[str]:
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


# ---- training ------------------------------------------------------------------------------------


@dataclass
class PretrainConfig:
    """Hyper-parameters of the MLM run; the defaults are the paper's (§4.2) where it gives them.

    The schedule is linear decay to 0 without warmup: the default of the HF
    Trainer that sentence-transformers' train_mlm.py (the paper's code) used.
    """

    epochs: int = 3
    batch_size: int = 32
    lr: float = 5e-5
    weight_decay: float = 0.0
    warmup_ratio: float = 0.0
    schedule: str = "linear"
    max_grad_norm: float = 1.0
    max_length: int = 128
    mlm_probability: float = 0.15
    max_steps: int | None = None
    seed: int = 0
    log_every: int = 50
    device: str = "auto"
    bf16: bool | None = None  # None: bf16 autocast on GPUs with native bf16, fp32 on CPUs (ask with True)

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be at least 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.schedule not in ("linear", "constant"):
            raise ValueError(f"schedule must be 'linear' or 'constant', got {self.schedule!r}")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be at least 1 (or None for whole epochs), got {self.max_steps}")
        if self.max_length < 3:
            raise ValueError(f"max_length must be at least 3, got {self.max_length}")
        if self.log_every < 1:
            raise ValueError(f"log_every must be at least 1, got {self.log_every}")


def _param_groups(mlm: nn.Module, weight_decay: float) -> tuple[list[dict], list[str]]:
    """No decay for biases and LayerNorm weights (as BERT and the HF Trainer); also the parameters' names in
    group order (the optimizer state's file names them)."""
    decay, no_decay = [], []
    for name, p in mlm.named_parameters():  # shared (tied) parameters appear once
        if not p.requires_grad:
            continue
        (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append((name, p))
    groups = [{"params": [p for _, p in decay], "weight_decay": weight_decay},
              {"params": [p for _, p in no_decay], "weight_decay": 0.0}]
    return groups, [n for n, _ in decay + no_decay]


def _lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    return max(0.0, (total - step) / max(1, total - warmup))


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
    warmup = int(config.warmup_ratio * total)
    groups, names = _param_groups(mlm, config.weight_decay)
    opt = AdamW(groups, lr=config.lr, weight_decay=config.weight_decay, foreach=foreach_default(device))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, total, warmup, config.schedule))
    params = [p for group in opt.param_groups for p in group["params"]]
    g = torch.Generator().manual_seed(config.seed)
    special = never_masked_ids(tokenizer)
    identity = {**(identity or {}), "config": asdict(config), "sentences": len(ids)}
    state = Path(state_dir) if state_dir is not None else None
    log.info("MLM pretraining: %d sentences, %d steps (%d per epoch, batch %d), lr %g, device %s",
             len(ids), total, steps_per_epoch, config.batch_size, config.lr, device)
    if state is not None and (state / "state.json").is_file():
        where = load_progress(state, identity, mlm, opt, names, g)
        log.info("resuming from %s: step %d of %d", state, where.step, total)
    else:
        where = Progress()
        if eval_data is not None:
            before = evaluate_mlm(mlm, eval_data, device)
            where.records.append({"step": 0, "eval_loss": before["loss"], "eval_accuracy": before["accuracy"]})
            log.info("held-out MLM (%d sentences, %d masked tokens): loss %.4f, accuracy %.4f",
                     eval_data.n_sentences, before["masked_tokens"], before["loss"], before["accuracy"])
    sched.last_epoch = where.step  # LambdaLR's count of steps taken (the groups' lr came with the optimizer's state)
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
                if config.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
                lr = opt.param_groups[0]["lr"]
                opt.step()
                sched.step()
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
                    log.info("step %d/%d epoch %.2f mlm_loss %.4f lr %.2e %.0f tok/s", step, total, rec["epoch"],
                             rec["loss"], lr, rec["tokens_per_s"])
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


# ---- CLI ----------------------------------------------------------------------------------------


def build_parser() -> Parser:
    d = PretrainConfig()
    p = Parser(
        prog="python -m tasks.pretrain",
        renamed={"--warmup-ratio": "--warmup", "--max-grad-norm": "--grad-clip", "--schedule": "--lr-schedule"},
        description="Additional masked-LM pretraining on the SST / Quora / STS train sentences "
                    "(minBERT paper §4.2); writes an HF checkpoint directory for --pretrained.")
    p.add_argument("--out-dir", required=True, help="checkpoint directory to write (replaced if it is one)")
    p.add_argument("--pretrained", default=None,
                   help="BERT checkpoint directory to start from (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--data-dir", default="data", help="directory with the task CSV files (default: data)")
    p.add_argument("--tasks", nargs="+", default=list(PRETRAIN_TASKS), choices=PRETRAIN_TASKS,
                   help="whose train sentences to use (default: all three)")
    p.add_argument("--epochs", type=int, default=d.epochs, help="passes over the sentences")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sentences per optimizer step")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (AdamW)")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW weight decay")
    p.add_argument("--warmup", dest="warmup_ratio", type=float, default=d.warmup_ratio, metavar="FRACTION",
                   help="fraction of the steps with linear warmup")
    p.add_argument("--lr-schedule", dest="schedule", choices=("linear", "constant"), default=d.schedule,
                   help="lr schedule after warmup (linear: decay to 0, the HF Trainer's)")
    p.add_argument("--grad-clip", dest="max_grad_norm", type=float, default=d.max_grad_norm, metavar="NORM",
                   help="gradient norm clipping; 0 disables it")
    p.add_argument("--max-length", type=int, default=d.max_length, help="tokens per sentence, [CLS]/[SEP] included")
    p.add_argument("--mlm-probability", type=float, default=d.mlm_probability, help="fraction of tokens masked")
    p.add_argument("--max-sentences", type=int, default=None,
                   help="use only the first N sentences after the seeded shuffle (CPU budgets)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after N optimizer steps (CPU budgets)")
    p.add_argument("--eval-sentences", type=int, default=1000,
                   help="held-out dev sentences (not in the train set) scored before and after; 0 disables")
    p.add_argument("--seed", type=int, default=d.seed, help="shuffling, masking and a new head's init")
    p.add_argument("--log-every", type=int, default=d.log_every, help="one log line every N steps")
    p.add_argument("--device", default=d.device, help="auto (CUDA if present), cpu, cuda, cuda:1, ...")
    p.add_argument("--checkpoint-every", type=int, default=500, metavar="STEPS",
                   help="write the state for resuming to <out-dir>.partial every STEPS steps (0: never); "
                        "the same command again continues from it")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=d.bf16,
                   help="bf16 autocast (default: on GPUs with native bf16; CPUs stay in fp32 unless asked)")
    return p


def config_from_args(args: argparse.Namespace) -> PretrainConfig:
    """Every PretrainConfig field from its flag (--max-steps -> max_steps, ...)."""
    return PretrainConfig(**{f.name: getattr(args, f.name) for f in fields(PretrainConfig)})


def main(argv: Sequence[str] | None = None) -> Path:
    """The command line; a user-caused error after argument checking is one line and exit status 1 (tasks/errors.py)."""
    with user_errors("python -m tasks.pretrain"):
        return _main(argv)


def _main(argv: Sequence[str] | None) -> Path:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.max_sentences is not None and args.max_sentences < 1:
        parser.error("--max-sentences must be at least 1")
    if args.eval_sentences < 0:
        parser.error("--eval-sentences must be 0 (off) or positive")
    if args.checkpoint_every < 0:
        parser.error("--checkpoint-every must be 0 (never) or positive")
    out_dir = Path(args.out_dir)
    try:
        check_replaceable(out_dir)
    except FileExistsError as e:
        parser.error(str(e))
    config = config_from_args(args)
    torch.manual_seed(config.seed)  # a new head's initialisation and dropout

    train = collect_sentences(args.data_dir, "train", args.tasks)
    n_distinct = len(train)
    train = shuffled(train, config.seed)
    if args.max_sentences is not None:
        train = train[: args.max_sentences]
    log.info("%d distinct train sentences from %s; using %d", n_distinct, ", ".join(args.tasks), len(train))
    eval_sentences: list[str] = []
    if args.eval_sentences:
        # dev sentences never trained on, so the before/after loss is a held-out number
        in_train = set(train)
        held_out = [s for s in collect_sentences(args.data_dir, "dev", args.tasks) if s not in in_train]
        eval_sentences = shuffled(held_out, config.seed + 1)[: args.eval_sentences]

    mlm, tokenizer, had_head = load_mlm(args.pretrained)
    eval_data = None
    if eval_sentences:
        eval_data = make_eval_batches(tokenizer, eval_sentences, config.max_length, 64, config.seed + 1,
                                      config.mlm_probability)
    source = str(resolve_model_dir(args.pretrained))
    state = partial_dir(out_dir)
    identity = {"source_checkpoint": source, "train_sentences_sha256": hashlib.sha256(
        "\n".join(train).encode()).hexdigest(), "eval_sentences": len(eval_sentences)}
    if args.checkpoint_every:
        log.info("state for resuming: %s, every %d steps (removed when done)", state, args.checkpoint_every)
    records = pretrain(mlm, tokenizer, train, config, eval_data, state_dir=state,
                       checkpoint_every=args.checkpoint_every, identity=identity)
    run_info = {"source_checkpoint": source, "mlm_head_from_checkpoint": had_head, "data_dir": args.data_dir,
                "tasks": args.tasks, "sentences": len(train), "distinct_train_sentences": n_distinct,
                "eval_sentences": len(eval_sentences), "config": asdict(config)}
    out = save_mlm_checkpoint(args.out_dir, mlm, tokenizer, extra_files={
        "pretrain_config.json": json.dumps(run_info, indent=2) + "\n",
        "pretrain_log.jsonl": "".join(json.dumps(r) + "\n" for r in records),
    })
    shutil.rmtree(state, ignore_errors=True)
    log.info("wrote %s (load it with --pretrained %s; its cls.predictions MLM head is not used by "
             "load_pretrained)", out, out)
    return out


if __name__ == "__main__":
    main()
