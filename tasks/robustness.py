"""Robustness evaluations, one command each: few-shot, label noise, minority class, attack.

Usage:
    python -m tasks.robustness few-shot --sizes 100 1000 --tasks sst para --seeds 0 1 2 --out-dir runs/robust/fs -- --epochs 3
    python -m tasks.robustness label-noise --rate 0.1 --seeds 0 1 --out-dir runs/robust/noise -- --objective scl
    python -m tasks.robustness minority --task sst --label 0 --keep 0.1 --out-dir runs/robust/min -- --epochs 3
    python -m tasks.robustness attack --checkpoint runs/default/checkpoints/best --norm linf --epsilon 0.01

The three training-set experiments write a perturbed copy of the training
files (tasks.perturb: exact counts, seeded) into ``<out-dir>/data-*`` — the
dev and test files are links to the originals — and run ``train_multitask.py``
on it with the flags after ``--`` (any train_multitask.py flags except
--data-dir, --out-dir, --seed and --tasks, which the experiment sets, and
--sst-phrases: it trains no phrases, whose labels the perturbations would not
touch), once per seed; they print and save
(``results.json``) dev scores as mean ± std over seeds. ``minority`` also
reports the accuracy on the reduced class.

A command only: the perturbations are tasks.perturb, the flags after ``--``
are read by the train command's parser (tasks.train) into one checked config,
each training run is tasks.training.run with that config, and the attack is
tasks.objectives.rift on a model from tasks.evaluation.evaluator.

``attack`` measures accuracy under an embedding-space attack on a trained
model: PGD on the word embeddings (per-token ε-balls, L2 or L∞) maximizing the
true label's loss (tasks.objectives.rift.pgd_attack). This is an approximation
of the word-substitution attacks of the RIFT/KNN-BERT papers: the adversarial
inputs are points in embedding space, not real words.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
from dataclasses import dataclass
import logging
import math
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from tasks import arguments
from tasks.cli import Parser, describe, user_errors
from tasks.options import add_options, option
from tasks.config import TrainConfig
from tasks.data.datasets import PairDataset, SentenceDataset, move_batch
from tasks.perturb import perturb, perturbed_data_dir
from tasks.data.readers import Example
from tasks.checkpoint import load_model, resolve_checkpoint
from tasks.predictions import read_predictions
from tasks.task import get_task, load_split, task_names

CLASSIFICATION = tuple(t for t in task_names() if get_task(t).kind.classification)  # the built-in ones
from tasks.objectives.rift import pgd_attack
from tasks.training.progress import RunsClock, duration
from tasks.training.run import dev_scores, run
from tasks.logs import log_to, open_log
from tasks.runtime import configure_malloc, resolve_device

log = logging.getLogger(__name__)


def _train(cfg: TrainConfig, data_dir: Path, out_dir: Path, seed: int) -> dict:
    """One training run of an experiment: ``cfg`` on ``data_dir`` with ``seed``, into ``out_dir`` (replaced)."""
    cfg = dataclasses.replace(copy.deepcopy(cfg), data_dir=str(data_dir), out_dir=str(out_dir), seed=seed)
    log.info("training %s: data %s, seed %d", out_dir, data_dir, seed)
    return run(cfg, overwrite=True)


def class_accuracy(pred_csv: Path, examples: Sequence[Example], label: int) -> float:
    """Accuracy on the dev examples of one class, from a leaderboard prediction file (ours or the starter's)."""
    ids, preds = read_predictions(pred_csv)
    pred = dict(zip(ids, preds.tolist()))
    of_class = [e for e in examples if e.label == label]
    return sum(pred[e.id] == label for e in of_class) / len(of_class)


def _summary(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values)}


def experiment_tasks(args: argparse.Namespace) -> list[str]:
    return [args.task] if args.command == "minority" else args.tasks


def train_experiment(args: argparse.Namespace, flags: list[str], cfg: TrainConfig) -> dict:
    """Every setting × seed of a training experiment: ``cfg`` (``flags``, checked) on each perturbed copy."""
    src = Path(args.data_dir)
    tasks = experiment_tasks(args)
    train = {t: load_split(t, "train", src)[0] for t in tasks}
    settings: list[tuple[str, dict]] = []
    if args.command == "few-shot":
        settings = [(f"n{n}", {"n": n}) for n in args.sizes]
    elif args.command == "label-noise":
        settings = [(f"p{args.rate:g}", {"rate": args.rate})]
    else:
        settings = [(f"{args.task}-label{args.label}-keep{args.keep:g}",
                     {"task": args.task, "label": args.label, "keep": args.keep})]
    results: dict = {"command": args.command, "flags": flags, "settings": {}}
    clock = RunsClock([1.0] * (len(settings) * len(args.seeds)))
    log.info("plan: %d training runs (%d settings x %d seeds), one after another", len(clock.costs),
             len(settings), len(args.seeds))
    for i, (name, s) in enumerate(settings):
        per_seed = []
        for j, seed in enumerate(args.seeds):
            changed = perturb(args.command, train, seed, **s)
            data = perturbed_data_dir(src, Path(args.out_dir) / f"data-{name}-seed{seed}", changed)
            run_dir = Path(args.out_dir) / f"{name}-seed{seed}"
            record = _train(cfg, data, run_dir, seed)
            clock.done(i * len(args.seeds) + j, ran=True)
            log.info("%s", clock.line())
            dev = dev_scores(record)
            if args.command == "minority":
                dev_ex = load_split(args.task, "dev", src)[0]
                dev[f"{args.task}_class{args.label}_acc"] = class_accuracy(
                    run_dir / "predictions" / f"{args.task}-dev-output.csv", dev_ex, args.label)
            per_seed.append(dev)
        keys = sorted({k for d in per_seed for k in d})
        results["settings"][name] = {k: _summary([d[k] for d in per_seed if k in d]) for k in keys}
        results["settings"][name]["per_seed"] = per_seed
    return results


@torch.no_grad()
def attack_experiment(args: argparse.Namespace) -> dict:
    device = resolve_device(args.device)
    model, _, tokenizer, cfg = load_model(resolve_checkpoint(args.checkpoint), device)
    model.eval()
    g = torch.Generator(device=device.type).manual_seed(args.seed)
    results: dict = {"checkpoint": str(args.checkpoint), "norm": args.norm, "epsilon": args.epsilon,
                     "steps": args.steps, "step_size": args.step_size, "tasks": {}}
    missing = [task for task in args.tasks if task not in cfg.tasks]
    if missing:
        raise ValueError(f"--tasks {' '.join(missing)}: the checkpoint was not trained on it (it has "
                         f"{' '.join(cfg.tasks)})")
    log.info("%s | plan: PGD attack (%s, epsilon %g, %d steps of %g) on the dev sets of %s", device, args.norm,
             args.epsilon, args.steps, args.step_size, ", ".join(args.tasks))
    for task in args.tasks:
        examples = load_split(task, "dev", args.data_dir, limit=args.limit)[0]
        if not get_task(task).kind.pair:
            ds = SentenceDataset(examples, tokenizer, max_length=cfg.max_length)
        else:
            ds = PairDataset(examples, tokenizer, mode=cfg.model.pair_encoding, max_length=cfg.max_length)
        clean_ok = adv_ok = 0
        order = list(range(len(ds)))
        t0 = last = time.perf_counter()
        for start in range(0, len(order), args.batch_size):
            batch = move_batch(ds.collate(order[start:start + args.batch_size]), device)
            y = batch["labels"].long()
            clean = model.predict(task, model(task, batch))
            adv = pgd_attack(model, task, batch, norm=args.norm, epsilon=args.epsilon, step_size=args.step_size,
                             steps=args.steps, objective="ce", generator=g)
            attacked = model.predict(task, model(task, batch, inputs_embeds=adv))
            clean_ok += int((clean == y).sum())
            adv_ok += int(((attacked == y) & (clean == y)).sum())
            done, now = min(start + args.batch_size, len(order)), time.perf_counter()
            if now - last >= PROGRESS_EVERY_S and done < len(order):
                last = now
                log.info("%s: %d of %d examples attacked (%s; ~%s left)", task, done, len(order),
                         duration(now - t0), duration((now - t0) / done * (len(order) - done)))
        n = len(ds)
        results["tasks"][task] = {"examples": n, "clean_acc": clean_ok / n, "after_attack_acc": adv_ok / n,
                                  "attack_success_rate": 1 - adv_ok / clean_ok if clean_ok else math.nan}
        log.info("%s: %d examples in %s: clean accuracy %.4f, after the attack %.4f", task, n,
                 duration(time.perf_counter() - t0), clean_ok / n, adv_ok / n)
    return results


PROGRESS_EVERY_S = 30  # a progress line of the attack at most this often


PASS_THROUGH = ("-- TRAIN_FLAGS: everything after -- goes to train_multitask.py for every seed (e.g. -- --epochs 3 "
                "--objective scl); --data-dir, --out-dir, --seed, --tasks and --sst-phrases are the experiment's own")


# The flags the experiment sets itself, each with why (said when one comes after --).
SET_BY_EXPERIMENT = {"--data-dir": "", "--out-dir": "", "--seed": "",
                     "--tasks": " (few-shot and label-noise take --tasks before --)",
                     "--sst-phrases": " (the phrases' labels escape the perturbation)"}


@dataclass
class ExperimentArgs:
    """Every training-set experiment's flags."""

    out_dir: str = option(help="where runs, perturbed data and results.json go", metavar="DIR", factory=str)
    data_dir: str = option("data", "the task CSV files", metavar="DIR")
    seeds: list[int] = option(help="one training run per seed", factory=lambda: [0], nargs="+")


@dataclass
class FewShotArgs(ExperimentArgs):
    """few-shot: train on N examples per task."""

    sizes: list[int] = option(help="training examples per task, one run each", factory=list, nargs="+")
    tasks: list[str] = option(help="tasks to subsample and train", factory=lambda: ["sst", "para"], choices=task_names(),
                              nargs="+")


@dataclass
class LabelNoiseArgs(ExperimentArgs):
    """label-noise: flip a fraction of the training labels."""

    rate: float = option(0.0, "fraction of training labels flipped", metavar="P")
    tasks: list[str] = option(help="tasks whose labels are flipped", factory=lambda: ["sst", "para"],
                              choices=CLASSIFICATION, nargs="+")


@dataclass
class MinorityArgs(ExperimentArgs):
    """minority: keep a fraction of one class."""

    task: str = option("sst", "the task to unbalance", choices=CLASSIFICATION)
    label: int = option(0, "the class to reduce", metavar="CLASS")
    keep: float = option(0.0, "fraction of that class kept", metavar="FRACTION")


@dataclass
class AttackArgs:
    """attack: accuracy under an embedding-space PGD attack."""

    checkpoint: str = option(help="a checkpoint directory (runs/x/checkpoints/best)", metavar="DIR", factory=str)
    data_dir: str = option("data", "the task CSV files (dev sets are attacked)", metavar="DIR")
    out_dir: str | None = option(None, "write results.json here (optional)", metavar="DIR")
    tasks: list[str] = option(help="tasks attacked", factory=lambda: ["sst", "para"], choices=CLASSIFICATION,
                              nargs="+")
    norm: str = option("linf", "the per-token ball", choices=("l2", "linf"))
    epsilon: float = option(0.01, "per-token ball radius in embedding space", metavar="EPS")
    step_size: float = option(0.0025, "PGD step", metavar="STEP")
    steps: int = option(10, "PGD steps", metavar="N")
    batch_size: int = option(64, "examples per forward pass", metavar="B")
    limit: int | None = option(None, "attack only the first N dev examples; default: all", metavar="N")
    device: str = option("auto", "auto (CUDA when present), cpu, cuda, ...", metavar="DEVICE")
    seed: int = option(0, "the attack's random start", metavar="SEED")


# subcommand -> (its flags, the ones a command line must give, its help)
SUBCOMMANDS = {"few-shot": (FewShotArgs, ("out_dir", "sizes"), "train on N examples per task"),
               "label-noise": (LabelNoiseArgs, ("out_dir", "rate"), "flip p of the training labels"),
               "minority": (MinorityArgs, ("out_dir", "label", "keep"), "keep r of one class"),
               "attack": (AttackArgs, ("checkpoint",), "accuracy under an embedding-space PGD attack")}


def build_parser() -> Parser:
    ap = Parser(prog="python -m tasks.robustness", description=__doc__.split("\n")[0],
                usage="%(prog)s {few-shot,label-noise,minority,attack} [options] [-- TRAIN_FLAGS ...]",
                epilog=PASS_THROUGH + ". Examples:\n" + __doc__.split("Usage:\n")[1].split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name, (cls, required, text) in SUBCOMMANDS.items():
        kw = {} if name == "attack" else {"epilog": PASS_THROUGH, "usage": "%(prog)s [options] [-- TRAIN_FLAGS ...]"}
        add_options(sub.add_parser(name, help=text, **kw), cls, required=required)
    return ap


def split_argv(argv: list[str]) -> tuple[argparse.Namespace, list[str], TrainConfig | None]:
    """(the experiment's arguments, the train_multitask.py flags after ``--``, the training config they give with
    the experiment's tasks and data), all checked before any data is written; exits 2 on an error."""
    flags: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, flags = argv[:i], argv[i + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    for bad, why in SET_BY_EXPERIMENT.items():
        if any(flag == bad or flag.startswith(bad + "=") for flag in flags):
            parser.error(f"{bad} after -- is set by the experiment: remove it{why}")
    if args.command == "attack":
        if flags:
            parser.error("attack takes no training flags after --")
        return args, flags, None
    train_parser = arguments.build_parser()
    train_parser.prog = f"{parser.prog} {args.command} --"
    try:
        cfg = arguments.config_for(flags + ["--tasks", *experiment_tasks(args), "--data-dir", args.data_dir,
                                            "--sst-phrases", "none"],
                                       train_parser)
    except (ValueError, OSError) as e:
        parser.error(f"the training flags after --: {describe(e)}")
    return args, flags, cfg


def main(argv: list[str] | None = None) -> dict:
    log_to()
    args, flags, cfg = split_argv(list(os.sys.argv[1:] if argv is None else argv))
    configure_malloc()
    with user_errors(build_parser().prog):
        if args.out_dir:  # its own log first: each training run's train.log is the run's (tasks.logs.open_log)
            Path(args.out_dir).mkdir(parents=True, exist_ok=True)
            open_log(Path(args.out_dir), "robustness.log")
        results = attack_experiment(args) if cfg is None else train_experiment(args, flags, cfg)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out_dir:
        Path(args.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.out_dir) / "results.json").write_text(text + "\n")
    return results


if __name__ == "__main__":
    main()

