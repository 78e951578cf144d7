"""The robustness command: train on perturbed training sets, or attack a trained model; one subcommand each.

Usage:
    python -m tasks.robustness few-shot --sizes 100 1000 --tasks sst para --seeds 0 1 2 --out-dir runs/robust/fs -- --epochs 3
    python -m tasks.robustness label-noise --rate 0.1 --seeds 0 1 --out-dir runs/robust/noise -- --objective scl
    python -m tasks.robustness minority --task sst --label 0 --keep 0.1 --out-dir runs/robust/min -- --epochs 3
    python -m tasks.robustness attack --checkpoint runs/default/checkpoints/best --norm linf --epsilon 0.01

few-shot (N training examples per task), label-noise (a fraction of the
training labels flipped) and minority (a fraction of one class kept) each train
``train_multitask.py``'s configuration, given by the flags after ``--``, on
perturbed copies of the training files, once per setting and seed, and report
the dev scores as mean ± std over the seeds (minority: also the accuracy on the
reduced class). The experiment sets --data-dir, --out-dir, --seed and --tasks
itself, and --sst-phrases none: the phrases' labels would escape the
perturbation. attack reports a checkpoint's dev accuracy under an
embedding-space PGD attack. Each prints its results as JSON, and with --out-dir
writes them to ``results.json`` beside ``robustness.log`` (and the runs and
their perturbed data).

A command only: the flags after ``--`` are read by the train command's parser
(tasks.arguments) into one checked config before anything is written; the
experiment loop and the attack are tasks.training.attacks, each training
run tasks.training.run with that config.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from tasks import arguments
from tasks.checkpoint import verify_checkpoint
from tasks.cli import Parser, describe, user_errors
from tasks.train_config import TrainConfig
from tasks.logs import log_to, open_log
from tasks.options import add_options, option, options_of
from tasks.runtime import configure_malloc
from tasks.storage import write_text
from tasks.task import task_names
from tasks.training.attacks import CLASSIFICATION, AttackConfig, attack, perturbation_experiment
from tasks.training.run import dev_scores, run

log = logging.getLogger(__name__)


def _train(cfg: TrainConfig, data_dir: Path, out_dir: Path, seed: int) -> dict:
    """One training run of an experiment: ``cfg`` on ``data_dir`` with ``seed``, into ``out_dir`` (replaced)."""
    cfg = dataclasses.replace(copy.deepcopy(cfg), data_dir=str(data_dir), out_dir=str(out_dir), seed=seed)
    log.info("training %s: data %s, seed %d", out_dir, data_dir, seed)
    return run(cfg, overwrite=True)


def experiment_tasks(args: argparse.Namespace) -> list[str]:
    return [args.task] if args.command == "minority" else args.tasks


# subcommand -> its settings, each a name and tasks.perturb's keyword arguments: a training run per seed
SETTINGS = {
    "few-shot": lambda a: [(f"n{n}", {"n": n}) for n in a.sizes],
    "label-noise": lambda a: [(f"p{a.rate:g}", {"rate": a.rate})],
    "minority": lambda a: [(f"{a.task}-label{a.label}-keep{a.keep:g}",
                            {"task": a.task, "label": a.label, "keep": a.keep})],
}


def train_experiment(args: argparse.Namespace, flags: list[str], cfg: TrainConfig) -> dict:
    """Every setting × seed of a training experiment: ``cfg`` (``flags``, checked) on each perturbed copy."""
    def train(data: Path, run_dir: Path, seed: int) -> dict[str, float]:
        return dev_scores(_train(cfg, data, run_dir, seed))

    settings = perturbation_experiment(args.command, SETTINGS[args.command](args), experiment_tasks(args),
                                       args.seeds, Path(args.data_dir), Path(args.out_dir), train)
    return {"command": args.command, "flags": flags, "settings": settings}


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
class AttackArgs(AttackConfig):
    """attack: accuracy under an embedding-space PGD attack."""

    out_dir: str | None = option(None, "write results.json here (optional)", metavar="DIR")


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


def check_attack(args: argparse.Namespace, parser: Parser) -> None:
    """The checkpoint an attack names, and its tasks: an argument error (exit status 2), as every command's."""
    try:
        _, saved = verify_checkpoint(args.checkpoint)
    except (ValueError, OSError) as e:
        parser.error(describe(e))
    missing = [task for task in args.tasks if task not in saved.tasks]
    if missing:
        parser.error(f"--tasks {' '.join(missing)}: {args.checkpoint} was not trained on it (it has "
                     f"{' '.join(saved.tasks)})")


def main(argv: list[str] | None = None) -> dict:
    log_to()
    args, flags, cfg = split_argv(list(os.sys.argv[1:] if argv is None else argv))
    if cfg is None:
        check_attack(args, build_parser())
    configure_malloc()
    with user_errors(build_parser().prog):
        if args.out_dir:  # its own log first: each training run's train.log is the run's (tasks.logs.open_log)
            Path(args.out_dir).mkdir(parents=True, exist_ok=True)
            open_log(Path(args.out_dir), "robustness.log")
        if cfg is None:
            results = attack(AttackConfig(**options_of(args, AttackConfig)))
        else:
            results = train_experiment(args, flags, cfg)
        text = json.dumps(results, indent=2)
        print(text)
        if args.out_dir:
            write_text(Path(args.out_dir) / "results.json", text + "\n")
    return results


if __name__ == "__main__":
    main()

