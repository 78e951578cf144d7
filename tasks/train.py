"""Train and evaluate the multitask BERT (SST-5, Quora paraphrase, STS): parse flags, build configs, run.

The command line of train_multitask.py (a thin script that calls ``main``).

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
    torchrun --nproc_per_node=2 train_multitask.py --batch-size 32   # 2 processes, 16 examples each per step

Flags map one to one onto TrainConfig / ModelConfig / objective Config fields
(tasks/config.py, tasks/model.py, tasks/objectives/), whose help texts and
defaults are written there; ``--preset`` (``apply_preset``, tasks/config.py)
fills them with a paper configuration first and explicit flags override it.
Every registered objective's Config field is a flag ``--<objective>-<field>``.
Contradictory flags are refused before any data is read. The run writes under
--out-dir (what a run directory holds: README "Training").
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import logging
import math
import re
import sys
import time
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minbert.config import BertConfig
from minbert.pretrained import check_weights, resolve_model_dir
from tasks.cli import Parser, describe, user_errors, verbose
from tasks.config import (
    FINAL_DEV,
    LR_SCHEDULES,
    PHRASE_ORDERS,
    PRESETS,
    STREAMS,
    TrainConfig,
    apply_preset,
    eval_config,
    eval_mutable,
    eval_overrides,
    refuse_idle_settings,
)
from tasks.data.schedule import SCHEDULES, SUBSETS
from tasks.evaluation.evaluator import default_out_dir, predict_checkpoint
from tasks.model import ARCHS, PAIR_ENCODINGS, POOLINGS, TASKS, ModelConfig
from tasks.objectives import registered_objectives
from tasks.options import default_of, help_text
from tasks.training import distributed
from tasks.checkpoint import verify_checkpoint
from tasks.storage import read_json
from tasks.training.run import run_plan
from tasks.logs import log_to
from tasks.training.rundir import check_writable_dir
from tasks.runtime import configure_malloc, resolve_device, torchrun_env
from tasks.training.tensorboard import REPORTERS
from tasks.training.trainer import RunPlan, prepare_run, resume_point

logger = logging.getLogger("train_multitask")


PAPER = "../shared/papers/minbert-downstream-generalization.txt"


MODEL_CHOICES = {"arch": ARCHS, "pair_encoding": PAIR_ENCODINGS, "pooling": POOLINGS}


@dataclass
class Command:
    """What to do with the config: the flags that are not config fields."""

    preset: str | None = None
    eval_only: bool = False
    resume: bool = False
    data_changed: bool = False  # --data-changed: a resume may read data that differ from the run's
    checkpoint: str | None = None
    overwrite: bool = False
    config: str | None = None  # --config FILE: a saved TrainConfig to start from
    objective: list[str] = field(default_factory=list)  # --objective NAME (repeatable)
    no_objective: list[str] = field(default_factory=list)  # --no-objective NAME (repeatable)


@dataclass
class Invocation:
    """A checked command line: the command, the config it runs, the checkpoint it evaluates or continues, and
    for training the checked run (``prepare_run``)."""

    command: Command
    config: TrainConfig
    checkpoint: Path | None = None
    plan: RunPlan | None = None


def _kv(value_type: type) -> typing.Callable[[str], tuple[str, Any]]:
    """argparse type for STREAM=VALUE items; VALUE 'all' (caps only) removes the entry."""

    def parse(text: str) -> tuple[str, Any]:
        key, sep, raw = text.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"expected STREAM=VALUE (e.g. para=0.1), got {text!r}")
        if key not in STREAMS:
            raise argparse.ArgumentTypeError(f"{key!r} is not a stream; streams: {', '.join(STREAMS)}")
        if raw == "all" and value_type is int:
            return key, None
        try:
            value = value_type(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: {raw!r} is not a valid {value_type.__name__}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r}: {raw!r} is not a finite number")
        return key, value

    parse.__name__ = f"{value_type.__name__} pair"
    return parse


def get_path(cfg: TrainConfig, path: str) -> Any:
    """The value at a dotted config path: "lr", "model.arch", "objectives.mnr.scale"."""
    head, _, rest = path.partition(".")
    if head == "model":
        return getattr(cfg.model, rest)
    if head == "objectives":
        name, _, key = rest.partition(".")
        return cfg.objectives[name][key]
    return getattr(cfg, path)


def _default_text(path: str) -> str:
    """" (default: ...)" for a config path; "" where the default is None (its help says what None means)."""
    try:
        value = get_path(TrainConfig(), path)
    except KeyError:
        return ""
    if value is None:
        return ""
    if isinstance(value, dict):
        value = " ".join(f"{k}={v}" for k, v in value.items()) or "none"
    elif isinstance(value, tuple):
        value = " ".join(value) or "none"
    return f" (default: {value})"


def _objective_reference(cls: type) -> str:
    """An objective's citation: the 'Paper:' paragraph of its module docstring, else its first line."""
    doc = (sys.modules[cls.__module__].__doc__ or "").strip()
    paragraphs = [" ".join(ln.strip() for ln in para.splitlines()) for para in doc.split("\n\n")]
    cite = [para for para in paragraphs if para.startswith("Paper:")]
    text = cite[0] if cite else (paragraphs[0] if paragraphs else cls.__name__)
    return text if len(text) <= 300 else text[:297] + "..."


def _field_help(config_cls: type) -> dict[str, str]:
    """Each field's help: its ``tasks.options.option`` text, else the '# ...' comment on or above it in the source
    of the class that declares it last (a Config redeclaring ``weight`` has its own help; others the base's)."""
    found = {f.name: f.metadata["help"] for f in dataclasses.fields(config_cls) if f.metadata.get("help")}
    commented: dict[str, str] = {}
    for klass in reversed(config_cls.__mro__):  # the base first: a subclass's comment replaces it
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        above: list[str] = []
        for line in source.splitlines():
            comment = re.match(r"\s+#\s*(.+)$", line)
            if comment:
                above.append(comment.group(1).strip())
                continue
            m = re.match(r"\s+(\w+)\s*:[^=#]+=[^#]*(?:#\s*(.+))?$", line)
            if m and (m.group(2) or above):
                commented[m.group(1)] = (m.group(2) or " ".join(above)).strip()
            above = []
    return {**commented, **found}


def _objective_field_kwargs(cls: type, f: dataclasses.Field) -> dict[str, Any]:
    """argparse kwargs for one objective Config field, from its type annotation."""
    hints = typing.get_type_hints(cls.Config)
    tp = hints.get(f.name, str)
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        tp = next(a for a in args if a is not type(None))
        args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if tp is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin is typing.Literal:
        return {"choices": list(args), "type": type(args[0])}
    if origin in (tuple, list):
        return {"nargs": "*", "type": args[0] if args and args[0] is not Ellipsis else str}
    if tp in (int, float, str):
        return {"type": tp}
    raise TypeError(f"objective {cls.name!r} field {f.name!r} has type {tp!r}, which has no CLI form")


def build_parser() -> Parser:
    """The CLI. Defaults are SUPPRESSed: the namespace holds only the flags given, so presets can fill the rest."""
    p = Parser(
        prog="train_multitask.py", argument_default=argparse.SUPPRESS,
        description=__doc__.split("\n\n")[0] + f"\nPaper: {PAPER} (section numbers below).",
        epilog="Defaults are the CPU recipe (README 'Training'; measured in experiments/RESULTS.md); --preset gives "
               "the paper's GPU configurations.")

    def add(group, path: str, **kw: Any) -> None:
        """A flag for config field ``path`` ("lr", "model.arch"): help and default from where the field is written."""
        owner, name = (ModelConfig, path[6:]) if path.startswith("model.") else (TrainConfig, path)
        shown = "" if kw.get("action") in ("store_true", "append") else _default_text(path)
        group.add_argument("--" + name.replace("_", "-"), dest=path, help=help_text(owner, name) + shown, **kw)

    g = p.add_argument_group("what to run")
    g.add_argument("--preset", dest="preset", choices=tuple(PRESETS),
                   help="a paper configuration (§5.4): baseline (§4.1), b1, b2, b3; or quick: the default recipe in one "
                        "epoch, a third of its training (README 'Training'); explicit flags override it")
    g.add_argument("--eval-only", dest="eval_only", action="store_true",
                   help="no training: load --checkpoint and write dev and test predictions")
    g.add_argument("--checkpoint", dest="checkpoint", metavar="PATH",
                   help="checkpoint directory for --eval-only (default <out-dir>/checkpoints/best) or --resume "
                        "(default <out-dir>/checkpoints/last)")
    g.add_argument("--resume", dest="resume", action="store_true",
                   help="continue a run exactly where its checkpoint stopped (weights, optimizer, LR position, "
                        "batch order, RNG states)")
    g.add_argument("--data-changed", dest="data_changed", action="store_true",
                   help="with --resume: continue although the data files differ from those the run started with "
                        "(without it such a resume is refused, naming the file)")
    g.add_argument("--overwrite", dest="overwrite", action="store_true",
                   help="let a fresh run replace the checkpoints already in --out-dir")
    g.add_argument("--config", dest="config", metavar="FILE",
                   help="start from a saved run configuration (runs/x/config.json) instead of the defaults; "
                        "flags given with it override it (not with --preset, --resume or --eval-only)")

    g = p.add_argument_group("data")
    add(g, "data_dir", metavar="DIR")
    add(g, "out_dir", metavar="DIR")
    add(g, "tasks", nargs="+", choices=TASKS)
    add(g, "nli", action=argparse.BooleanOptionalAction)
    add(g, "limit", type=int, metavar="N")
    add(g, "max_length", type=int, metavar="T")
    add(g, "max_train_examples", nargs="+", type=_kv(int), metavar="STREAM=N")
    add(g, "dev_max_examples", nargs="+", type=_kv(int), metavar="TASK=N")
    add(g, "train_subsets", choices=SUBSETS)
    add(g, "pair_swap", type=float, metavar="P")
    add(g, "symmetric_eval", action=argparse.BooleanOptionalAction)
    add(g, "sts_prior", type=float, metavar="W")
    add(g, "sts_prior_model", metavar="DIR")
    add(g, "sst_prior", type=float, metavar="W")
    add(g, "sst_prior_model", metavar="DIR")
    add(g, "final_dev", choices=FINAL_DEV)
    add(g, "sst_phrases", metavar="FILE")
    add(g, "sst_phrases_per_epoch", type=int, metavar="N")
    add(g, "sst_phrases_min_words", type=int, metavar="N")
    add(g, "sst_phrases_weight", type=float, metavar="W")
    add(g, "sst_phrases_order", choices=PHRASE_ORDERS)

    g = p.add_argument_group("model")
    add(g, "pretrained", metavar="DIR")
    add(g, "encoder_dropout", type=float, metavar="P")
    for f in dataclasses.fields(ModelConfig):
        kw: dict[str, Any] = {"choices": MODEL_CHOICES[f.name]} if f.name in MODEL_CHOICES else {
            "type": type(f.default), "metavar": f.name.split("_")[-1].upper()}
        add(g, f"model.{f.name}", **kw)

    g = p.add_argument_group("optimization")
    add(g, "epochs", type=int, metavar="N")
    add(g, "batch_size", type=int, metavar="B")
    add(g, "task_batch_size", nargs="+", type=_kv(int), metavar="STREAM=B")
    add(g, "eval_batch_size", type=int, metavar="B")
    add(g, "schedule", choices=SCHEDULES)
    add(g, "loss_weights", nargs="+", type=_kv(float), metavar="STREAM=W")
    add(g, "lr", type=float)
    add(g, "lr_schedule", choices=LR_SCHEDULES)
    add(g, "lr_decay", type=float)
    add(g, "warmup", type=float, metavar="FRACTION")
    add(g, "weight_decay", type=float)
    add(g, "layer_lr_decay", type=float, metavar="FACTOR")
    add(g, "head_lr_scale", type=float, metavar="FACTOR")
    add(g, "grad_clip", type=float, metavar="NORM")
    add(g, "seed", type=int)

    g = p.add_argument_group("stages and post-training", "LP-FT (paper §4.2, tasks/training/lpft.py), SWA "
                             "(§4.6, tasks/training/swa.py), training-set logits for distillation (§4.6, "
                             "tasks/objectives/distill.py)")
    add(g, "lp_epochs", type=int, metavar="N")
    add(g, "lp_lr", type=float, metavar="LR")
    add(g, "swa_epochs", type=int, metavar="N")
    add(g, "swa_lr", type=float, metavar="LR")
    add(g, "predict_train", action="store_true")

    g = p.add_argument_group("runtime")
    add(g, "device", metavar="DEVICE")
    add(g, "bf16", action=argparse.BooleanOptionalAction)
    add(g, "fused_adamw", action=argparse.BooleanOptionalAction)
    add(g, "compile", action="store_true")
    add(g, "report_to", nargs="+", choices=REPORTERS)
    add(g, "deterministic", action="store_true")
    add(g, "gradient_checkpointing", action="store_true")
    add(g, "log_every", type=int, metavar="N")
    add(g, "checkpoint_every", type=int, metavar="N")

    registry = registered_objectives()
    g = p.add_argument_group("objectives", "plug-in objectives (tasks/objectives/, one file each); an objective's "
                             "options --<objective>-<option> need --objective <objective> (or a preset that adds it)")
    g.add_argument("--objective", dest="objective", action="append", metavar="NAME",
                   help=f"add a plug-in objective (repeatable): {', '.join(sorted(registry))}")
    g.add_argument("--no-objective", dest="no_objective", action="append", metavar="NAME",
                   help="remove an objective a preset added (the paper's ablations, e.g. 'B3 - MNR', Figure 2)")
    for name, cls in sorted(registry.items()):
        g = p.add_argument_group(f"objective {name}", _objective_reference(cls))
        helps = _field_help(cls.Config)
        for f in dataclasses.fields(cls.Config):
            flag = f"--{name}-{f.name}".replace("_", "-")
            default = default_of(f)
            if isinstance(default, tuple):
                default = " ".join(default) or "()"
            text = helps.get(f.name, f.name) + (f"; it can take {' '.join(cls.tasks)}" if f.name == "tasks" else "")
            g.add_argument(flag, dest=f"objectives.{name}.{f.name}", metavar=f.name.upper(),
                           **_objective_field_kwargs(cls, f), help=f"{text} (default: {default})")
    return p


def set_path(cfg: TrainConfig, path: str, value: Any) -> None:
    """Set one explicit flag's value in ``cfg`` (mappings are updated, never replaced)."""
    head, _, rest = path.partition(".")
    if head == "model":
        setattr(cfg.model, rest, value)
    elif head == "objectives":
        name, _, key = rest.partition(".")
        if name not in cfg.objectives:
            flag = f"--{name}-{key}".replace("_", "-")
            raise ValueError(f"{flag} sets an option of objective {name!r}, which this run does not use: "
                             f"add --objective {name}")
        cfg.objectives[name][key] = list(value) if isinstance(value, tuple) else value
    elif path in ("max_train_examples", "dev_max_examples", "loss_weights", "task_batch_size"):
        mapping = dict(getattr(cfg, path))
        for key, v in value:
            if v is None:
                mapping.pop(key, None)
            else:
                mapping[key] = v
        setattr(cfg, path, mapping)
    elif path == "tasks":
        cfg.tasks = tuple(value)
    else:
        setattr(cfg, path, value)


def parse(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> tuple[Command, dict]:
    """(command, explicit config values by dotted path) of a command line; no checks across flags yet."""
    parser = parser or build_parser()
    ns = vars(parser.parse_args(argv))
    command_fields = {f.name for f in dataclasses.fields(Command)}
    command = Command(**{k: v for k, v in ns.items() if k in command_fields})
    explicit = {k: v for k, v in ns.items() if k not in command_fields}
    return command, explicit


def _flag(path: str) -> str:
    return "--" + path.split(".")[-1].replace("_", "-") if not path.startswith("objectives.") else \
        "--" + path[len("objectives."):].replace(".", "-").replace("_", "-")


def build_invocation(command: Command, explicit: dict[str, Any]) -> Invocation:
    """Apply preset, objectives and explicit flags; refuse contradictions with a sentence. Reads no data."""
    c = command
    if c.eval_only and torchrun_env()[1] > 1:
        raise ValueError("--eval-only runs in one process: start it with python, not torchrun")
    if c.eval_only and c.resume:
        raise ValueError("--eval-only evaluates a saved model and --resume continues training it; choose one")
    if c.checkpoint is not None and not (c.eval_only or c.resume):
        raise ValueError("--checkpoint names a saved model for --eval-only or --resume; without either it "
                         "would be ignored")
    if c.data_changed and not c.resume:
        raise ValueError("--data-changed lets --resume continue on changed data; without --resume it means nothing")
    if c.overwrite and (c.eval_only or c.resume):
        raise ValueError("--overwrite is for a fresh training run; --eval-only and --resume never replace "
                         "checkpoints")
    if c.config is not None and (c.eval_only or c.resume or c.preset):
        raise ValueError("--config starts a fresh run from a saved configuration; --resume and --eval-only use "
                         "the checkpoint's own, and --preset would replace it: drop one")
    if c.eval_only or c.resume:
        what = "--eval-only" if c.eval_only else "--resume"
        if c.preset or c.objective or c.no_objective:
            raise ValueError(f"{what} uses the checkpoint's own configuration; --preset, --objective and "
                             "--no-objective cannot change it")
        out_dir = Path(explicit.get("out_dir", TrainConfig().out_dir))
        default = out_dir / "checkpoints" / ("best" if c.eval_only else "last")
        where = c.checkpoint if c.checkpoint is not None else default
        if c.eval_only and (fixed := [_flag(p) for p in explicit if p not in eval_mutable()]):
            raise ValueError(f"--eval-only uses the configuration saved in the checkpoint, so {', '.join(fixed)} "
                             f"cannot change (allowed: {', '.join(_flag(p) for p in eval_mutable())})")
        resume = resume_point(where, c.data_changed) if c.resume else None  # a damaged last: last.old or best
        ckpt, saved = (resume.checkpoint, resume.config) if resume else verify_checkpoint(where)
        cfg = copy.deepcopy(saved)
        if "out_dir" not in explicit:
            explicit = {**explicit, "out_dir": str(default_out_dir(ckpt, saved))}
        for path, value in explicit.items():
            set_path(cfg, path, value)
        if c.eval_only:
            cfg = eval_config(saved, eval_overrides(cfg))
            resolve_device(cfg.device)
            check_writable_dir(Path(cfg.out_dir), "--out-dir")  # a training run's: prepare_run
        refuse_idle_settings(cfg, explicit)  # --resume and --eval-only alike: e.g. --sts-prior on a run without STS
        check_encoder(cfg, ckpt, eval_only=c.eval_only)
        check_prior_model(cfg, explicit)
        plan = None if c.eval_only else prepare_run(cfg, resume)  # the one resume rule
        return Invocation(c, cfg, ckpt, plan)

    cfg = config_from_flags(c, explicit)
    refuse_idle_settings(cfg, explicit)
    check_encoder(cfg)
    check_prior_model(cfg, explicit)
    return Invocation(c, cfg, plan=prepare_run(cfg, overwrite=c.overwrite))


def config_for(argv: list[str], parser: argparse.ArgumentParser | None = None) -> TrainConfig:
    """The TrainConfig that ``train_multitask.py argv`` would train, with today's defaults (checked; nothing runs)."""
    return build_invocation(*parse(list(argv), parser)).config


def check_encoder(cfg: TrainConfig, ckpt: Path | None = None, eval_only: bool = False) -> None:
    """The encoder a command starts from, checked without loading it: a training run's --pretrained weights read
    (its header: a truncated file is named now, not at model building), and --max-length fits the position
    embeddings (config.json of the checkpoint's encoder/ when there is one, else of --pretrained)."""
    if not eval_only:  # training loads --pretrained first (a resume then overwrites it with the checkpoint's)
        try:
            check_weights(resolve_model_dir(cfg.pretrained))
        except ValueError as e:
            raise ValueError(f"--pretrained {cfg.pretrained}: {e}: use an intact checkpoint directory") from None
    own = ckpt / "encoder" if ckpt is not None else None
    source = own if own is not None and (own / "config.json").is_file() else resolve_model_dir(cfg.pretrained)
    positions = BertConfig.from_json_file(source / "config.json").max_position_embeddings
    if cfg.max_length > positions:
        raise ValueError(f"--max-length {cfg.max_length} is more than the {positions} positions of the encoder in "
                         f"{source} (max_position_embeddings): pass --max-length {positions} or less")


def check_prior_model(cfg: TrainConfig, explicit: dict[str, Any]) -> None:
    """An --sts-prior-model or --sst-prior-model given on the command line must be a checkpoint directory:
    refused before training, not found missing at the first evaluation. (A saved run's that has gone since is
    reported there.)"""
    for name in ("sts_prior_model", "sst_prior_model"):
        if name in explicit and getattr(cfg, name) is not None:
            try:
                resolve_model_dir(getattr(cfg, name))
            except (FileNotFoundError, NotADirectoryError):
                raise FileNotFoundError(f"--{name.replace('_', '-')} {getattr(cfg, name)}: no such checkpoint "
                                        "directory (a sentence encoder: config.json, weights, vocab.txt)") from None


def saved_config(path: str) -> TrainConfig:
    """The TrainConfig in a config.json written by a run (``--config``)."""
    f = Path(path).expanduser()
    if f.is_dir():
        raise ValueError(f"--config {path} is a directory: pass its config.json")
    if not f.is_file():
        raise FileNotFoundError(f"--config {path}: no such file")
    try:
        return TrainConfig.from_dict(read_json(f))
    except (ValueError, TypeError) as e:
        raise ValueError(f"--config {path}: {e}") from None


def config_from_flags(command: Command, explicit: dict[str, Any]) -> TrainConfig:
    """The training config of a fresh run: defaults (or --config's saved config), then the preset, objectives,
    explicit flags. Not validated."""
    c = command
    cfg = TrainConfig() if c.config is None else saved_config(c.config)
    if c.preset:
        cfg = apply_preset(cfg, c.preset)
        registry = registered_objectives()
        missing = [n for n in cfg.objectives if n not in registry and n not in c.no_objective]
        if missing:
            raise ValueError(f"preset {c.preset} needs the objective(s) {', '.join(missing)}, which are not "
                             f"registered (no module under tasks/objectives/ defines them; registered: "
                             f"{', '.join(sorted(registry)) or 'none'}); a preset never silently drops one")
    # Own copies: flags below edit them in place.
    cfg = dataclasses.replace(cfg, model=copy.deepcopy(cfg.model), objectives=copy.deepcopy(cfg.objectives))
    for name in c.objective:
        cfg.objectives.setdefault(name, {})
    for name in c.no_objective:
        if name not in cfg.objectives:
            raise ValueError(f"--no-objective {name}: the run has no objective {name!r} to remove "
                             f"(it has: {', '.join(cfg.objectives) or 'none'})")
        del cfg.objectives[name]
    for path, value in explicit.items():
        set_path(cfg, path, value)
    # Per-stream settings that come from the defaults or the preset follow --tasks / --no-nli
    # (the default Quora cap must not make "--tasks sst sts" an error); explicit ones are checked.
    streams = set(cfg.streams())
    for path in ("max_train_examples", "dev_max_examples", "loss_weights", "task_batch_size"):
        if path not in explicit:
            setattr(cfg, path, {k: v for k, v in getattr(cfg, path).items() if k in streams})
    return cfg


def main(argv: list[str] | None = None) -> dict:
    """Parse, refuse contradictions (exit status 2, before any data is read), then train or evaluate."""
    log_to()  # held until the run directory is this command's, then train.log (tasks.logs.open_log)
    malloc_tuned = configure_malloc()
    parser = build_parser()
    command, explicit = parse(argv, parser)
    try:
        inv = build_invocation(command, explicit)
    except (ValueError, OSError) as e:  # also a checkpoint's or --pretrained's damaged files, named
        if verbose():
            raise
        parser.error(describe(e))
    cfg = inv.config
    # After argument checking, what the user's files or disk cause is one line and exit status 1 (tasks/cli.py).
    started = time.time()

    def after_disk_full() -> str:
        """--resume only where this command has a checkpoint to continue: its own, or the one it resumed."""
        last = Path(cfg.out_dir) / "checkpoints" / "last"
        if command.resume or (not command.eval_only and last.is_dir() and last.stat().st_mtime >= started):
            return "then continue with --resume: the last complete checkpoint is intact"
        return "then run the same command again (this run wrote no checkpoint)"

    with user_errors(parser.prog, then=after_disk_full):
        logger.info("glibc malloc tuned for reuse: %s", malloc_tuned)
        world = distributed.world_size()
        if world > 1:
            logger.info("torchrun: %d processes, global batch %s = %s per process", world, cfg.batch_sizes(),
                        {s: b // world for s, b in cfg.batch_sizes().items()})
        try:
            if command.eval_only:
                result = predict_checkpoint(inv.checkpoint, cfg, cfg.out_dir)
            else:
                result = run_plan(inv.plan)
        finally:
            distributed.cleanup()  # leave torchrun's process group (no-op in one process)
    return result

