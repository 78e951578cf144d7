"""The pretrain command: additional masked-LM pretraining of the encoder on the task sentences.

A thin command over tasks.training.pretraining, which runs the masking
collator and the MLM loss (tasks/training/masking.py) on the training loop and
writes the checkpoint: this module parses the flags and picks the sentences.

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
projection runs on those positions only, not on every token.

The MLM head is minbert's (minbert/mlm.py). The result is a Hugging Face
``BertForMaskedLM`` checkpoint directory (``save_mlm_checkpoint``) plus
pretrain_config.json and pretrain_log.jsonl; ``train_multitask.py
--pretrained DIR`` loads its encoder.

A long run resumes: every ``--checkpoint-every`` steps the whole state goes
to ``<out-dir>.partial/checkpoints/last`` (atomically, a checkpoint of the
training loop), and the same command again continues from it to the
uninterrupted run's weights, bit for bit (other settings or data are refused). The log is ``<out-dir>.partial/pretrain.log`` while the run
runs (a failed run's ends with its error) and moves into the checkpoint with it;
``<out-dir>.partial`` is removed once the checkpoint is written. On a CPU the
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
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from minbert.mlm import load_mlm
from minbert.pretrained import resolve_model_dir
from tasks.cli import Parser, describe, program, user_errors
from tasks.logs import log_to, open_log
from tasks.data.readers import DataFileMissing
from tasks.task import MULTITASK, get_task, load_split, task_names
from tasks.options import add_options, option, options_of
from tasks.outdir import LOCK_FILE, take_lock
from tasks.training.masking import make_eval_batches
from tasks.training.pretraining import PretrainConfig, check_replaceable, pretrain, save_mlm_checkpoint
from tasks.training.progress import duration

log = logging.getLogger(__name__)
LOG_FILE = "pretrain.log"  # in <out-dir>.partial while the run runs, then in the checkpoint


@dataclass
class PretrainArgs:
    """The pretrain command's own flags: where it writes and what it reads (the run's settings: PretrainConfig)."""

    out_dir: str = option(help="the checkpoint directory to write (an MLM checkpoint there is replaced)",
                          metavar="DIR")
    overwrite: bool = option(False, "replace the output directory even when it holds another command's output "
                                    "(a training run, ...; never one a live process writes)")
    pretrained: str | None = option(None, "BERT checkpoint directory to start from; default: the embedded "
                                          "all-MiniLM-L6-v2", metavar="DIR")
    data_dir: str = option("data", "directory of the task CSV files", metavar="DIR")
    tasks: tuple[str, ...] = option(MULTITASK, "whose train sentences to use", choices=task_names(), nargs="+")
    max_sentences: int | None = option(None, "use only the first N sentences after the seeded shuffle (CPU "
                                             "budgets); default: all", metavar="N")
    eval_sentences: int = option(1000, "held-out dev sentences (not in the train set) scored before and after; "
                                       "0 = none", metavar="N")
    checkpoint_every: int = option(500, "write the state for resuming to <out-dir>.partial every N steps (0: "
                                        "never); the same command again continues from it", metavar="N")


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


def partial_dir(out_dir: str | os.PathLike[str]) -> Path:
    """Where a run writing ``out_dir`` keeps its log, lock and state for resuming (``<out-dir>.partial``)."""
    out = Path(out_dir)
    return out.with_name(out.name + ".partial")


def build_parser() -> Parser:
    p = Parser(
        prog="python -m tasks.pretrain", renamed={"--warmup-ratio": "--warmup", "--max-grad-norm": "--grad-clip",
                                                  "--schedule": "--lr-schedule"},
        description="Additional masked-LM pretraining on the SST / Quora / STS train sentences "
                    "(minBERT paper §4.2); writes an HF checkpoint directory for --pretrained.")
    add_options(p, PretrainArgs, required=("out_dir",))
    add_options(p.add_argument_group("pretraining"), PretrainConfig)
    return p


def config_from_args(args: argparse.Namespace) -> PretrainConfig:
    """Every PretrainConfig field from its flag (--max-steps -> max_steps, ...)."""
    return PretrainConfig(**options_of(args, PretrainConfig))


def main(argv: Sequence[str] | None = None) -> Path:
    """The command line; a user-caused error after argument checking is one line and exit status 1 (tasks.cli)."""
    log_to()  # held until <out-dir>.partial is this run's, then its pretrain.log (tasks.logs)
    with user_errors(program("python -m tasks.pretrain")):
        return _main(argv)


def _main(argv: Sequence[str] | None) -> Path:
    t0 = time.perf_counter()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_sentences is not None and args.max_sentences < 1:
        parser.error("--max-sentences must be at least 1")
    if args.eval_sentences < 0:
        parser.error("--eval-sentences must be 0 (off) or positive")
    if args.checkpoint_every < 0:
        parser.error("--checkpoint-every must be 0 (never) or positive")
    out_dir = Path(args.out_dir)
    try:
        check_replaceable(out_dir, args.overwrite)
        for task in args.tasks:  # the files the flags name, before any folder is made: an argument error
            for split in ("train", "dev") if args.eval_sentences else ("train",):
                path = get_task(task).path(split, args.data_dir)
                if path is not None and not path.is_file():
                    raise DataFileMissing(path, get_task(task).about)
        resolve_model_dir(args.pretrained)
    except (FileExistsError, ValueError, OSError) as e:
        parser.error(describe(e))
    config = config_from_args(args)
    partial = partial_dir(out_dir)
    partial.mkdir(parents=True, exist_ok=True)
    try:  # the run's folder is locked as a training run's is: a second pretrain into it is refused while it lives
        take_lock(partial / LOCK_FILE, f"{partial}")
    except FileExistsError as e:
        parser.error(str(e))
    open_log(partial, LOG_FILE)
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
    identity = {"source_checkpoint": source, "train_sentences_sha256": hashlib.sha256(
        "\n".join(train).encode()).hexdigest(), "eval_sentences": len(eval_sentences)}
    if args.checkpoint_every:
        log.info("state for resuming: %s, every %d steps (removed when done)", partial / "checkpoints" / "last",
                 args.checkpoint_every)
    records = pretrain(mlm, tokenizer, train, config, eval_data, run_dir=partial,
                       checkpoint_every=args.checkpoint_every, identity=identity)
    run_info = {"source_checkpoint": source, "mlm_head_from_checkpoint": had_head, "data_dir": args.data_dir,
                "tasks": args.tasks, "sentences": len(train), "distinct_train_sentences": n_distinct,
                "eval_sentences": len(eval_sentences), "config": asdict(config)}
    out = save_mlm_checkpoint(args.out_dir, mlm, tokenizer, extra_files={
        "pretrain_config.json": json.dumps(run_info, indent=2) + "\n",
        "pretrain_log.jsonl": "".join(json.dumps(r) + "\n" for r in records),
    }, overwrite=args.overwrite)
    # The open log file moves with its lines into the checkpoint (a rename: the handler writes on into it).
    os.replace(partial / LOG_FILE, out / LOG_FILE)
    shutil.rmtree(partial, ignore_errors=True)
    log.info("wrote %s (load it with --pretrained %s; its cls.predictions MLM head is not used by "
             "load_pretrained)", out, out)
    log.info("done: wall time %s", duration(time.perf_counter() - t0))
    return out


if __name__ == "__main__":
    main()

