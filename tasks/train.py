"""The train command (train_multitask.py calls ``main``): parse the flags, check, train or evaluate.

Usage:
    python train_multitask.py                                 # the CPU recipe (README "Training")
    python train_multitask.py --preset b1 --pretrained ~/bert-base-uncased --out-dir runs/b1   # the paper's best (GPU)
    python train_multitask.py --preset b3 --no-objective mnr  # an ablation ("B3 - MNR", paper Figure 2)
    python train_multitask.py --resume --out-dir runs/b1      # continue runs/b1/checkpoints/last exactly
    python train_multitask.py --eval-only --checkpoint runs/b1/checkpoints/best
    python train_multitask.py --lp-epochs 2 --swa-epochs 5 --predict-train --out-dir runs/t   # LP-FT §4.2, SWA §4.6
    python train_multitask.py --objective distill --distill-teachers runs/t/predictions --out-dir runs/s
    python train_multitask.py --limit 64 --epochs 1 --out-dir runs/smoke   # smoke run
    python train_multitask.py --config runs/b1/config.json --seed 2 --out-dir runs/b1-seed2   # re-run, one change
    python train_multitask.py --eval-only --out-dir runs/mine --objective-module my_loss.py  # its objective's file
    torchrun --nproc_per_node=2 train_multitask.py --batch-size 32   # 2 processes, 16 examples each per step

The flags and the configuration they give: tasks/arguments.py. What is checked (exit status 2) before a run
directory is made or written: tasks.training.run.prepare_run for training (the flags, then what the run reads: its
data files and encoder), tasks.evaluation.evaluator.prepare_eval for --eval-only. A saved run's objective files are
imported only when named again (--objective-module) or trusted (--trust-objective-modules). The run writes under
--out-dir (what a run directory holds: README "Training").
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.arguments import Command, applied, build_parser, check_command, config_from_flags, help_preset, parse
from tasks.checkpoint import best_of, resume_point, verify_checkpoint
from tasks.cli import Parser, describe, user_errors, verbose
from tasks.objectives import load_plugin, registered_objectives
from tasks.train_config import TrainConfig, eval_overrides, refuse_idle_settings, with_task_files
from tasks.evaluation.evaluator import EvalPlan, default_out_dir, predict_checkpoint, prepare_eval
from tasks.logs import log_to
from tasks.runtime import configure_malloc, torchrun_env
from tasks.training import distributed
from tasks.training.run import RunPlan, prepare_run, run_plan

logger = logging.getLogger("train_multitask")


@dataclass
class Invocation:
    """A checked command line: the command, and the checked training run or evaluation it makes."""

    command: Command
    plan: RunPlan | EvalPlan

    @property
    def config(self) -> TrainConfig:
        return self.plan.cfg if isinstance(self.plan, RunPlan) else self.plan.config


def build_invocation(command: Command, explicit: dict[str, Any]) -> Invocation:
    """The run or evaluation a command line asks for, checked (a ValueError / OSError naming the flag or file);
    a training run's data and encoder read (``prepare_run``)."""
    c = command
    trust = c.trust_objective_modules
    moved: tuple[str, ...] = ()
    if c.eval_only or c.resume:  # --objective-module: where the run's objective files are now (loaded by main)
        moved = tuple(explicit.get("objective_modules", ()))
        explicit = {k: v for k, v in explicit.items() if k != "objective_modules"}
    check_command(c, explicit, world=torchrun_env()[1])
    out_dir = Path(explicit.get("out_dir", TrainConfig().out_dir))
    if c.eval_only:
        ckpt, saved = verify_checkpoint(best_of(c.checkpoint) if c.checkpoint is not None else
                                        out_dir / "checkpoints" / "best", trust)  # its config read once, here
        saved = with_objective_modules(with_task_files(saved, explicit.get("task_files", ())), moved)
        explicit = {k: v for k, v in explicit.items() if k != "task_files"}
        changed = applied(saved, explicit)
        refuse_idle_settings(changed, explicit)  # e.g. --sts-prior on a run without STS
        return Invocation(c, prepare_eval(ckpt, eval_overrides(changed), explicit.get("out_dir"), saved=saved))
    if c.resume:
        resume = resume_point(c.checkpoint if c.checkpoint is not None else out_dir / "checkpoints" / "last",
                              c.data_changed, trust)  # a damaged last: last.old or best
        resume = dataclasses.replace(resume, config=with_objective_modules(resume.config, moved))
        if "out_dir" not in explicit:  # the run's own directory
            explicit = {**explicit, "out_dir": str(default_out_dir(resume.checkpoint, resume.config))}
        saved = with_task_files(resume.config, explicit.get("task_files", ()))  # a task file changed: refused
        cfg = applied(saved, {k: v for k, v in explicit.items() if k != "task_files"})
        refuse_idle_settings(cfg, explicit)
        return Invocation(c, prepare_run(cfg, resume))
    cfg = config_from_flags(c, explicit)
    refuse_idle_settings(cfg, explicit)
    return Invocation(c, prepare_run(cfg, overwrite=c.overwrite))


def with_objective_modules(saved: TrainConfig, moved: tuple[str, ...]) -> TrainConfig:
    """A saved run's config (``--resume``, ``--eval-only``) recording where its objective files are now, when
    ``--objective-module`` names them (``moved``): what a resumed run's checkpoints then record."""
    return dataclasses.replace(saved, objective_modules=moved) if moved else saved


def objective_modules(argv: list[str]) -> list[str]:
    """The files of ``--objective-module FILE`` (or ``=FILE``) in ``argv``, before the parser that needs them."""
    found = []
    for i, token in enumerate(argv):
        if token == "--":
            break
        if token == "--objective-module" and i + 1 < len(argv):
            found.append(argv[i + 1])
        elif token.startswith("--objective-module="):
            found.append(token.split("=", 1)[1])
    return found


def main(argv: list[str] | None = None) -> dict:
    """Parse, refuse contradictions and unusable files (exit status 2, before a run directory is written), then train
    or evaluate."""
    log_to()  # held until the run directory is this command's, then train.log (tasks.logs.open_log)
    configure_malloc()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:  # a user's objective files first: their options are flags of the parser (tasks.objectives.load_plugin)
        for module in objective_modules(argv):
            load_plugin(module)
        registered_objectives()  # and MINBERT_PLUGINS' files
    except ValueError as e:
        if verbose():
            raise
        Parser(prog="train_multitask.py").error(describe(e))
    parser = build_parser(help_preset(argv))  # --preset X --help: X's values
    command, explicit = parse(argv, parser)
    try:
        inv = build_invocation(command, explicit)
    except (ValueError, OSError) as e:  # also a data file, --pretrained's weights or a checkpoint file, named
        if verbose():
            raise
        parser.error(describe(e))
    cfg = inv.config
    # After the checks and reads above, what the user's files or disk cause is one line, exit status 1 (tasks/cli.py).
    started = time.time()

    def after_disk_full() -> str:
        """--resume only where this command has a checkpoint to continue: its own, or the one it resumed."""
        last = Path(cfg.out_dir) / "checkpoints" / "last"
        if command.resume or (not command.eval_only and last.is_dir() and last.stat().st_mtime >= started):
            return "then continue with --resume: the last complete checkpoint is intact"
        return "then run the same command again (this run wrote no checkpoint)"

    with user_errors(parser.prog, then=after_disk_full):
        world = distributed.world_size()
        if world > 1:
            batches = inv.plan.run.batch_sizes
            logger.info("torchrun: %d processes, global batch %s = %s per process", world, dict(batches),
                        {s: b // world for s, b in batches.items()})
        try:
            result = predict_checkpoint(inv.plan) if command.eval_only else run_plan(inv.plan)
        finally:
            distributed.cleanup()  # leave torchrun's process group (no-op in one process)
    return result
