"""The train command's arguments: every flag of train_multitask.py, built from dataclass fields, and the
configuration a command line gives.

Flags come from fields, through tasks.options (the one mechanism): the command's own (``Command``: what
to do with the configuration), TrainConfig's and its nested configs' (ModelConfig, LP-FT's and
SWA's: tasks/train_config.py, tasks/model.py; dests dotted, "swa.epochs"; a KEY=VALUE map's spelled flags for
one key each, "prior_weights@sst", "stream_files@phrases"), and every
registered objective's Config as ``--<objective>-<field>`` (tasks/objectives/); their help texts,
choices and defaults are written there, once. Parsing keeps only the flags given (their defaults are
SUPPRESSed), so that ``--preset`` (``apply_preset``) and ``--config`` can fill the rest first and the
explicit flags win. The checks before a run or an evaluation are tasks.training.run.prepare_run and
tasks.evaluation.evaluator.prepare_eval; ``config_for`` checks a fresh run's flags as the command would.

Usage:
    cfg = config_for(["--preset", "b1", "--epochs", "2"])   # the TrainConfig train_multitask.py would train
    command, explicit = parse(argv)                          # the Command, and the flags given by dotted path
    cfg = config_from_flags(command, explicit)               # a fresh run's config, before its checks
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.cli import Parser
from tasks.config_versions import SCALE_5, took_scale
from tasks.train_config import NESTED, PRESETS, TrainConfig, apply_preset, check_eval_changes, refuse_idle_settings
from tasks.model import NLI, ModelConfig
from tasks.objectives import load_plugin, registered_objectives
from tasks.options import (REMOVED, add_options, flag_of_path, fold_spelled, keeps_none, option, spelled_flag,
                           spelled_flags, value_at)
from tasks.storage import read_json
from tasks.task_file import read_task_file
from tasks.training.run import check_run

PAPER = 'Venkateswaran, "Methods to Improve Downstream Generalization of minBERT" (Stanford CS224N)'


@dataclass
class Command:
    """What to do with the configuration: the flags of train_multitask.py that are not configuration fields."""

    preset: str | None = option(None, "a paper configuration (§5.4): baseline (§4.1), b1, b2, b3; or quick: the "
                                      "default recipe in one epoch of about half its Quora pairs and phrases, "
                                      "a third of its time (README 'Training'); explicit flags override it",
                                choices=tuple(PRESETS))
    eval_only: bool = option(False, "no training: load --checkpoint and write dev and test predictions")
    checkpoint: str | None = option(None, "checkpoint directory for --eval-only (default <out-dir>/checkpoints/best; a "
                                          "run directory: its best) or --resume (default <out-dir>/checkpoints/last)",
                                    metavar="PATH")
    resume: bool = option(False, "continue a run exactly where its checkpoint stopped (weights, optimizer, LR "
                                 "position, batch order, RNG states)")
    data_changed: bool = option(False, "with --resume: continue although the data files differ from those the run "
                                       "started with (without it such a resume is refused, naming the file)")
    overwrite: bool = option(False, "let a fresh run replace what --out-dir holds (a run a live process writes is "
                                    "never replaced)")
    config: str | None = option(None, "start from a saved run configuration (runs/x/config.json, or a file of some "
                                      "fields: the others are today's defaults) instead of the defaults; flags "
                                      "given with it override it (not with --preset, --resume or --eval-only)",
                                metavar="FILE")
    objective: list[str] = option(help="add a plug-in objective (repeatable)", factory=list, repeat=True,
                                  metavar="NAME")
    trust_objective_modules: bool = option(False, "let --eval-only, --resume or --config import the objective files "
                                                  "(--objective-module) the saved run recorded in its config.json; "
                                                  "without it reading a run runs no code of its files unless you "
                                                  "name them again (--objective-module FILE, MINBERT_PLUGINS), as "
                                                  "HF's trust_remote_code")
    no_objective: list[str] = option(help="remove an objective a preset added (the paper's ablations, e.g. "
                                          "'B3 - MNR', Figure 2)", factory=list, repeat=True, metavar="NAME")


GROUPS = {  # TrainConfig's option(group=...) -> the --help section it is listed in
    "data": "data", "model": "model", "optimization": "optimization",
    "stages": ("stages and post-training", "LP-FT (paper §4.2) and SWA (§4.6): tasks/training/stages.py; "
                                           "training-set logits for distillation (§4.6, "
                                           "tasks/objectives/distill.py)"),
    "runtime": "runtime"}


def objective_reference(cls: type) -> str:
    """An objective's citation: the 'Paper:' paragraph of its module docstring, else its first line."""
    doc = (sys.modules[cls.__module__].__doc__ or "").strip()
    paragraphs = [" ".join(ln.strip() for ln in para.splitlines()) for para in doc.split("\n\n")]
    cite = [para for para in paragraphs if para.startswith("Paper:")]
    text = cite[0] if cite else (paragraphs[0] if paragraphs else cls.__name__)
    # the docstrings cite the papers' copies beside this workplace's checkout, which a public clone lacks
    text = re.sub(r"\.\./shared/papers/minbert[\w-]*\.txt", "the minBERT paper", text)
    text = re.sub(r",? \.\./shared/papers/[\w-]+\.txt", "", text)
    return text if len(text) <= 300 else text[:297] + "..."


def build_parser(preset: str | None = None) -> Parser:
    """train_multitask.py's flags, every one from a dataclass field (tasks.options.add_options). Defaults are
    SUPPRESSed: the namespace holds only the flags given, so presets and --config can fill the rest. With
    ``preset``, --help shows that preset's values as the defaults (what ``--preset X`` trains)."""
    base = apply_preset(TrainConfig(), preset) if preset in PRESETS else TrainConfig()
    shown = (f"Defaults shown are --preset {preset}'s (the flags given with it override them)." if preset in PRESETS
             else "Defaults are the CPU recipe (README 'Training'; measured in experiments/RESULTS.md); --preset "
                  "gives the paper's GPU configurations (--preset X --help shows its values).")
    p = Parser(prog="train_multitask.py", description="Train and evaluate the multitask BERT (SST-5, Quora "
               f"paraphrase, STS).\nPaper: {PAPER} (section numbers below).", epilog=shown)
    registry = registered_objectives()
    add_options(p.add_argument_group("what to run"), Command, suppress=True,
                help_suffix={"objective": f": {', '.join(sorted(registry))}"})
    groups = {key: p.add_argument_group(*((name,) if isinstance(name, str) else name))
              for key, name in GROUPS.items()}
    add_options(p, TrainConfig, suppress=True, skip=("model", "objectives", "user_tasks"), groups=groups, defaults=base)
    add_options(groups["model"], ModelConfig, dest_prefix="model.", suppress=True, defaults=base.model)
    p.add_argument_group("objectives", "plug-in objectives (tasks/objectives/, one file each); an objective's "
                         "options --<objective>-<option> need --objective <objective> (or a preset that adds it)")
    for name, cls in sorted(registry.items()):
        tasks = f"; it can take {' '.join(cls.tasks)}" + (
            f", and takes {' '.join(cls.default_tasks)} when none is named" if cls.default_tasks is not None else "")
        add_options(p.add_argument_group(f"objective {name}", objective_reference(cls)), cls.Config,
                    prefix=f"{name}-", dest_prefix=f"objectives.{name}.", suppress=True, help_suffix={"tasks": tasks})
    return p


def get_path(cfg: TrainConfig, path: str) -> Any:
    """The value at a dotted config path: "lr", "model.arch", "swa.epochs", "objectives.mnr.scale"."""
    head, _, rest = path.partition(".")
    if head == "objectives":
        name, _, key = rest.partition(".")
        return cfg.objectives[name][key]
    return value_at(cfg, path)


STREAM_MAPPINGS = ("max_train_examples", "dev_max_examples", "loss_weights", "task_batch_size", "stream_files",
                   "stream_min_words", "stream_orders")  # STREAM=VALUE
MAPPINGS = (*STREAM_MAPPINGS, "prior_weights", "prior_models", "model.spans")  # and the TASK=VALUE fields


def set_path(cfg: TrainConfig, path: str, value: Any) -> None:
    """Set one explicit flag's value in ``cfg`` (mappings are updated, never replaced)."""
    head, _, rest = path.partition(".")
    if path in MAPPINGS:
        mapping = dict(get_path(cfg, path))
        for key, v in value:
            if v is REMOVED or v is None and not keeps_none(TrainConfig, path):  # "all"; an X | None map keeps None
                mapping.pop(key, None)
            else:
                mapping[key] = v
        if rest:  # a nested config's (model.spans)
            setattr(getattr(cfg, head), rest, mapping)
        else:
            setattr(cfg, path, mapping)
    elif head in NESTED:
        setattr(getattr(cfg, head), rest, value)
    elif head == "objectives":
        name, _, key = rest.partition(".")
        if name not in cfg.objectives:
            flag = f"--{name}-{key}".replace("_", "-")
            raise ValueError(f"{flag} sets an option of objective {name!r}, which this run does not use: "
                             f"add --objective {name}")
        cfg.objectives[name][key] = list(value) if isinstance(value, tuple) else value
    elif path == "tasks":
        cfg.tasks = tuple(value)
    else:
        setattr(cfg, path, value)


def parse(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> tuple[Command, dict]:
    """(command, explicit config values by dotted path) of a command line; no checks across flags yet."""
    parser = parser or build_parser(help_preset(argv if argv is not None else sys.argv[1:]))
    ns = vars(parser.parse_args(argv))
    command_fields = {f.name for f in dataclasses.fields(Command)}
    command = Command(**{k: v for k, v in ns.items() if k in command_fields})
    try:
        explicit = fold_spelled(TrainConfig, {k: v for k, v in ns.items() if k not in command_fields})
    except ValueError as e:  # a key set by its own flag and by its map's
        parser.error(str(e))
    return command, explicit


def help_preset(argv: list[str]) -> str | None:
    """The preset of a command line that asks for --help (whose defaults --help then shows), else None."""
    if not {"-h", "--help"} & set(argv):
        return None
    for i, a in enumerate(argv):
        if a == "--preset" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--preset="):
            return a.split("=", 1)[1]
    return None


def flag_of(path: str) -> str:
    """The flag of a dotted config path: "model.arch" -> --arch, "swa.epochs" -> --swa-epochs,
    "objectives.mnr.scale" -> --mnr-scale."""
    if path.startswith("objectives."):
        return "--" + path[len("objectives."):].replace(".", "-").replace("_", "-")
    own = spelled_flags(TrainConfig, path)
    return flag_of_path(TrainConfig, path) + (f" ({', '.join(own)})" if own else "")


def check_command(c: Command, explicit: dict[str, Any], world: int = 1) -> None:
    """Refuse flags that contradict each other (a ValueError with a sentence saying why); reads nothing."""
    if c.eval_only and world > 1:
        raise ValueError("--eval-only runs in one process: start it with python, not torchrun")
    if c.eval_only and c.resume:
        raise ValueError("--eval-only evaluates a saved model and --resume continues training it; choose one")
    if c.checkpoint is not None and not (c.eval_only or c.resume):
        raise ValueError("--checkpoint names a saved model for --eval-only or --resume; without either it "
                         "would be ignored")
    if c.data_changed and not c.resume:
        raise ValueError("--data-changed lets --resume continue on changed data; without --resume it means nothing")
    if c.trust_objective_modules and not (c.eval_only or c.resume or c.config is not None):
        raise ValueError("--trust-objective-modules lets --eval-only, --resume or --config import the objective files "
                         "a saved run recorded; a fresh run imports only the files --objective-module names")
    if c.overwrite and (c.eval_only or c.resume):
        raise ValueError("--overwrite is for a fresh training run; --eval-only and --resume never replace "
                         "checkpoints")
    if c.config is not None and (c.eval_only or c.resume or c.preset):
        raise ValueError("--config starts a fresh run from a saved configuration; --resume and --eval-only use "
                         "the checkpoint's own, and --preset would replace it: drop one")
    if (c.eval_only or c.resume) and (c.preset or c.objective or c.no_objective):
        raise ValueError(f"{'--eval-only' if c.eval_only else '--resume'} uses the checkpoint's own configuration; "
                         "--preset, --objective and --no-objective cannot change it")
    if c.eval_only:
        check_eval_changes(explicit, name=flag_of)  # the rule of tasks.train_config, in the command line's words


def saved_config(path: str, trust_modules: bool = False, spans: dict[str, float] | None = None) -> TrainConfig:
    """The TrainConfig of ``--config FILE``: a run's config.json, or a file of some fields, the others today's
    defaults (a field it does not know is an error); the objective files it recorded are imported only with
    ``trust_modules`` (--trust-objective-modules, ``TrainConfig.from_dict``). ``spans``: the ones the command line
    sets (``refuse_unlinked_spans``)."""
    f = Path(path).expanduser()
    if f.is_dir():
        raise ValueError(f"--config {path} is a directory: pass its config.json")
    if not f.is_file():
        raise FileNotFoundError(f"--config {path}: no such file")
    registered_objectives()  # the package's and MINBERT_PLUGINS' objectives first: an error of theirs is not the file's
    d = read_json(f)
    refuse_unlinked_spans(path, d, spans or {})
    try:
        return TrainConfig.from_dict(d, trust_modules=trust_modules)
    except (ValueError, TypeError) as e:
        raise ValueError(f"--config {path}: {e}") from None


def refuse_unlinked_spans(path: str, saved: dict[str, Any], given: dict[str, float]) -> None:
    """A run saved at config version 2 with a regression task of a user's took STS's span (--sts-scale) for it too;
    spans are one setting per task since (version 6 gives that task the span it was saved with). --config of such
    a run (``saved``) with STS's span changed (``given``) would once have changed the user's too: refused unless
    --spans names it."""
    if SCALE_5[1] not in given:
        return
    took = [n for n in took_scale(saved) if n not in given]
    if took:
        raise ValueError(f"--config {path}: its task {took[0]} took STS's span when it was saved, and each task's "
                         f"span is its own since: give {spelled_flag(TrainConfig, 'model.spans', took[0], 'S')} too")


def config_from_flags(command: Command, explicit: dict[str, Any]) -> TrainConfig:
    """The training config of a fresh run: defaults (or --config's), then the preset, objectives, explicit
    flags. Not validated (tasks.training.run.prepare_run does)."""
    c = command
    cfg = TrainConfig() if c.config is None else saved_config(c.config, c.trust_objective_modules,
                                                              dict(explicit.get("model.spans") or ()))
    if c.preset:
        cfg = apply_preset(cfg, c.preset)
        registry = registered_objectives()
        missing = [n for n in cfg.objectives if n not in registry and n not in c.no_objective]
        if missing:
            raise ValueError(f"preset {c.preset} needs the objective(s) {', '.join(missing)}, which are not "
                             f"registered (no module under tasks/objectives/ defines them; registered: "
                             f"{', '.join(sorted(registry)) or 'none'}); a preset never silently drops one")
    # Own copies: flags below edit them in place.
    cfg = dataclasses.replace(cfg, objectives=copy.deepcopy(cfg.objectives),
                              **{name: copy.deepcopy(getattr(cfg, name)) for name in NESTED})
    for name in c.objective:
        cfg.objectives.setdefault(name, {})
    for name in c.no_objective:
        if name not in cfg.objectives:
            raise ValueError(f"--no-objective {name}: the run has no objective {name!r} to remove "
                             f"(it has: {', '.join(cfg.objectives) or 'none'})")
        del cfg.objectives[name]
    for path, value in explicit.items():
        set_path(cfg, path, value)
    # The files the user named (train_multitask.py loaded them before parsing); --config's saved ones were imported
    # by saved_config with --trust-objective-modules, or not at all.
    for module in explicit.get("objective_modules", ()):
        load_plugin(module)
    # A fresh run reads its task files once, here: each declares a task that joins --tasks, its entry kept in the
    # config (what the run predicts with later, the files gone or not). A task of --config's saved run stays as
    # that run declared it, unless --task-file names its file again.
    given = {str(Path(f).expanduser().resolve()) for f in explicit.get("task_files", ())}
    kept = {n: e for n, e in cfg.user_tasks.items() if e["origin"].get("file") not in given}
    declared = [read_task_file(f) for f in cfg.task_files
                if f in given or not any(e["origin"].get("file") == f for e in kept.values())]
    names = [t.name for t in declared]
    twice = next((n for n in names if names.count(n) > 1 or n in kept), None)
    if twice is not None:
        raise ValueError(f"two --task-file files declare task {twice!r}: give each task one name")
    # a task declared again keeps its place among the run's own (the order its config.json lists them in)
    again = {t.name: t.to_dict() for t in declared}
    user_tasks = {n: again.pop(n) if n in again else e for n, e in cfg.user_tasks.items() if n in kept or n in again}
    cfg = dataclasses.replace(cfg, user_tasks={**user_tasks, **again},
                              tasks=(*cfg.tasks, *(n for n in names if n not in cfg.tasks)))
    # Per-stream settings that come from the defaults or the preset follow --tasks / --no-nli
    # (the default Quora cap must not make "--tasks sst sts" an error); explicit ones are checked. A prior's setting
    # of a task the run leaves out is idle, as before (TrainConfig.validate).
    # A declared stream's file (on, or off: none) follows the tasks that declare it.
    # A --config file's item of no task or stream at all (a typo) is refused, not dropped.
    run = cfg.resolve()
    streams, declared = set(run.streams), set(run.declared)
    known = (*cfg.entries, *(e.stream.name for e in cfg.entries.values() if e.stream is not None), NLI)
    for path in STREAM_MAPPINGS:
        given = {k for k, _ in explicit.get(path, ())}
        kept = declared if path == "stream_files" else streams
        unknown = [k for k in getattr(cfg, path) if k not in known and k not in given]
        if unknown:
            raise ValueError(f"--config {c.config}: {path} names {unknown[0]!r}, which is no task or stream (tasks: "
                             f"{', '.join(cfg.entries)}; streams: {', '.join(known[len(cfg.entries):])})")
        setattr(cfg, path, {k: v for k, v in getattr(cfg, path).items() if k in kept or k in given})
    return cfg


def applied(saved: TrainConfig, explicit: dict[str, Any]) -> TrainConfig:
    """A copy of a checkpoint's config with the explicit flags of --resume or --eval-only set."""
    cfg = copy.deepcopy(saved)
    for path, value in explicit.items():
        set_path(cfg, path, value)
    return cfg


def config_for(argv: list[str], parser: argparse.ArgumentParser | None = None) -> TrainConfig:
    """The TrainConfig that ``train_multitask.py argv`` would train with today's defaults, checked as the command
    checks a fresh run's but for its --out-dir (``tasks.training.run.check_run``; nothing is read or run): an
    experiment's member flags, a sweep's rows."""
    command, explicit = parse(list(argv), parser)
    check_command(command, explicit)
    if command.eval_only or command.resume:
        raise ValueError("config_for is for the flags of a fresh run, not --eval-only or --resume")
    cfg = config_from_flags(command, explicit)
    refuse_idle_settings(cfg, explicit)
    check_run(cfg)
    return cfg
