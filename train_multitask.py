"""Train and evaluate the multitask BERT (SST-5, Quora paraphrase, STS): parse flags, build configs, run.

Usage:
    python train_multitask.py                                 # CPU recipe: embedded MiniLM, under 20 min on 2 cores
    python train_multitask.py --preset b1 --pretrained ~/bert-base-uncased --out-dir runs/b1   # the paper's best (GPU)
    python train_multitask.py --preset b3 --no-objective mnr  # an ablation ("B3 - MNR", paper Figure 2)
    python train_multitask.py --resume --out-dir runs/b1      # continue runs/b1/checkpoints/last exactly
    python train_multitask.py --eval-only --checkpoint runs/b1/checkpoints/best
    python train_multitask.py --lp-epochs 2 --swa-epochs 5 --predict-train --out-dir runs/t   # LP-FT §4.2, SWA §4.6
    python train_multitask.py --objective distill --distill-teachers runs/t/predictions --out-dir runs/s
    python train_multitask.py --limit 64 --epochs 1 --out-dir runs/smoke   # smoke run
    torchrun --nproc_per_node=2 train_multitask.py --batch-size 32   # 2 processes, 16 examples each per step

Flags map one to one onto TrainConfig / ModelConfig / objective Config fields
(tasks/train.py); ``--preset`` fills them with a paper configuration first and
explicit flags override it. Every registered objective's Config field is a
flag ``--<objective>-<field>``. Contradictory flags are refused before any
data is read. The run writes config.json, metrics.jsonl, training.png,
train.log, checkpoints/{last,best} and predictions/ under --out-dir.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import logging
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks import distributed
from tasks.checkpoint import read_json, resolve_checkpoint
from tasks.model import ARCHS, PAIR_ENCODINGS, POOLINGS, TASKS, ModelConfig
from tasks.sampling import SCHEDULES
from tasks.train import (
    LR_SCHEDULES,
    PRESETS,
    RESUME_MUTABLE,
    STREAMS,
    TrainConfig,
    apply_preset,
    configure_malloc,
    evaluate_checkpoint,
    registered_objectives,
    resolve_device,
    run,
)

logger = logging.getLogger("train_multitask")

# Fields --eval-only may set: they choose what to predict and where, never the model
# (KNN-BERT's K and φ act only at inference, tasks.train.KNNInference).
EVAL_MUTABLE = ("data_dir", "out_dir", "device", "bf16", "eval_batch_size", "limit", "tasks", "predict_train",
                "objectives.knn_bert.knn_k", "objectives.knn_bert.knn_phi", "objectives.match_tuning.inference",
                "final_dev", "dev_max_examples")
PAPER = "../shared/papers/minbert-downstream-generalization.txt"

MODEL_HELP = {
    "arch": "task heads: baseline (paper §4.1: linear heads, Siamese pairs) or b1 (§4.3: shared FCN layers, "
            "non-linear heads, the paraphrase structural change)",
    "pair_encoding": "siamese: each sentence encoded alone (paper §4.1); cross: '[CLS] a [SEP] b [SEP]' as one "
                     "sequence (not in the paper; cheaper and stronger on CPU)",
    "pooling": "the sentence embedding the heads read: pooler = pooled [CLS] (paper §4.1), cls = raw [CLS], "
               "mean = mean over tokens",
    "fcn_size": "size of the b1 FCN layers (paper: 256, §4.3/§5.4)",
    "baseline_proj_size": "Siamese intermediate embedding of the baseline heads (paper: 32, §4.1)",
    "head_dropout": "dropout before every head linear layer (paper: 0.3 in the baseline §4.1 and B3, none in "
                    "B1/B2 §5.4)",
    "sts_scale": "STS prediction = this x cosine (Siamese) or x sigmoid (cross) (paper: 5.0, §4.1)",
}
MODEL_CHOICES = {"arch": ARCHS, "pair_encoding": PAIR_ENCODINGS, "pooling": POOLINGS}
# Where an objective option acts outside its training loss (tasks.train.KNNInference), its help says so.
OBJECTIVE_NOTES = {
    "objectives.knn_bert.knn_k": "; used by the final evaluation and --eval-only (the 'knn' dev metrics)",
    "objectives.knn_bert.knn_phi": "; the final evaluation and --eval-only score phi and phi=1 (KNN only) as "
                                   "'knn' dev metrics, and with phi > 0 the SST / paraphrase leaderboard files hold "
                                   "the combined prediction (logits files stay the classifier's)",
}


@dataclass
class Command:
    """What to do with the config: the flags that are not config fields."""

    preset: str | None = None
    eval_only: bool = False
    resume: bool = False
    checkpoint: str | None = None
    overwrite: bool = False
    objective: list[str] = field(default_factory=list)  # --objective NAME (repeatable)
    no_objective: list[str] = field(default_factory=list)  # --no-objective NAME (repeatable)


@dataclass
class Invocation:
    """A parsed command line: the command, the config it runs, and the config paths set explicitly."""

    command: Command
    config: TrainConfig
    explicit: dict[str, Any]
    checkpoint: Path | None = None


# ---- the parser --------------------------------------------------------------------------------------------


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
            return key, value_type(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: {raw!r} is not a valid {value_type.__name__}") from None

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
    try:
        value = get_path(TrainConfig(), path)
    except KeyError:
        return ""
    if isinstance(value, dict):
        value = " ".join(f"{k}={v}" for k, v in value.items()) or "none"
    elif isinstance(value, tuple):
        value = " ".join(value)
    return f" (default: {value})"


def _objective_reference(cls: type) -> str:
    """An objective's citation: the 'Paper:' paragraph of its module docstring, else its first line."""
    doc = (sys.modules[cls.__module__].__doc__ or "").strip()
    paragraphs = [" ".join(ln.strip() for ln in para.splitlines()) for para in doc.split("\n\n")]
    cite = [para for para in paragraphs if para.startswith("Paper:")]
    text = cite[0] if cite else (paragraphs[0] if paragraphs else cls.__name__)
    return text if len(text) <= 300 else text[:297] + "..."


def _field_comments(config_cls: type) -> dict[str, str]:
    """The trailing '# ...' comment of each field in a Config dataclass's source: its help text."""
    try:
        source = inspect.getsource(config_cls)
    except (OSError, TypeError):
        return {}
    found = {}
    for line in source.splitlines():
        m = re.match(r"\s+(\w+)\s*:[^=#]+=[^#]*#\s*(.+)$", line)
        if m:
            found[m.group(1)] = m.group(2).strip()
    return found


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


def build_parser() -> argparse.ArgumentParser:
    """The CLI. Defaults are SUPPRESSed: the namespace holds only the flags given, so presets can fill the rest."""
    p = argparse.ArgumentParser(
        prog="train_multitask.py", argument_default=argparse.SUPPRESS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0] + f"\nPaper: {PAPER} (section numbers below).",
        epilog="Defaults are the CPU recipe (measured on 2 cores); --preset gives the paper's GPU configurations.")

    def add(group, flag: str, dest: str, help: str, **kw: Any) -> None:
        group.add_argument(flag, dest=dest, help=help + ("" if kw.get("action") in ("store_true", "append")
                                                          else _default_text(dest)), **kw)

    g = p.add_argument_group("what to run")
    g.add_argument("--preset", dest="preset", choices=PRESETS,
                   help="a paper configuration (§5.4): baseline (§4.1), b1, b2, b3; explicit flags override it")
    g.add_argument("--eval-only", dest="eval_only", action="store_true",
                   help="no training: load --checkpoint and write dev and test predictions")
    g.add_argument("--checkpoint", dest="checkpoint", metavar="PATH",
                   help="checkpoint directory for --eval-only (default <out-dir>/checkpoints/best) or --resume "
                        "(default <out-dir>/checkpoints/last)")
    g.add_argument("--resume", dest="resume", action="store_true",
                   help="continue a run exactly where its checkpoint stopped (weights, optimizer, LR position, "
                        "batch order, RNG states)")
    g.add_argument("--overwrite", dest="overwrite", action="store_true",
                   help="let a fresh run replace the checkpoints already in --out-dir")

    g = p.add_argument_group("data")
    add(g, "--data-dir", "data_dir", "directory of the CS224N CSV files (data/README.md)", metavar="DIR")
    add(g, "--out-dir", "out_dir", "run directory: config.json, metrics.jsonl, training.png, train.log, "
        "checkpoints/{last,best}, predictions/", metavar="DIR")
    add(g, "--tasks", "tasks", "tasks to train and evaluate (paper §4.1: all three)", nargs="+", choices=TASKS)
    add(g, "--nli", "nli", "add the nli-train.csv triplet stream (paper §4.2 'Additional AllNLI data'); it has no "
        "head loss, only its objectives train on it (B1: MNR)", action=argparse.BooleanOptionalAction)
    add(g, "--limit", "limit", "read at most N examples of every split of every task and NLI (smoke runs); "
        "at least the batch size", type=int, metavar="N")
    add(g, "--max-length", "max_length", "tokens per sequence, longer ones truncated (a cross-encoded pair is one "
        "sequence)", type=int, metavar="T")
    add(g, "--max-train-examples", "max_train_examples", "per-stream cap on training examples per epoch, a fresh "
        "random subset each epoch; STREAM=N or STREAM=all (the paper sees all data, §4.2)", nargs="+",
        type=_kv(int), metavar="STREAM=N")
    add(g, "--dev-max-examples", "dev_max_examples", "per-task cap on dev examples scored between epochs (a fixed "
        "random subset; the final evaluation always uses the whole dev set); TASK=N or TASK=all", nargs="+",
        type=_kv(int), metavar="TASK=N")
    add(g, "--final-dev", "final_dev", "full: the final evaluation scores the whole dev sets; capped: the "
        "--dev-max-examples subsets again (cheap sweeps, e.g. the robustness table)", choices=("full", "capped"))

    g = p.add_argument_group("model")
    add(g, "--pretrained", "pretrained", "HF BERT checkpoint directory (config.json, model.safetensors or "
        "pytorch_model.bin, vocab.txt), e.g. bert-base-uncased as in the paper §4.1; default: the embedded "
        "all-MiniLM-L6-v2", metavar="DIR")
    add(g, "--encoder-dropout", "encoder_dropout", "dropout inside the encoder (hidden and attention "
        "probabilities), set in its BertConfig (paper §4.5 keeps 0.3); default: the checkpoint's own",
        type=float, metavar="P")
    for f in dataclasses.fields(ModelConfig):
        flag = "--" + f.name.replace("_", "-")
        kw: dict[str, Any] = {"choices": MODEL_CHOICES[f.name]} if f.name in MODEL_CHOICES else {
            "type": type(f.default), "metavar": f.name.split("_")[-1].upper()}
        add(g, flag, f"model.{f.name}", MODEL_HELP.get(f.name, f"ModelConfig.{f.name} (tasks/model.py)"), **kw)

    g = p.add_argument_group("optimization")
    add(g, "--epochs", "epochs", "training epochs (paper: 10 for ablations, 20 for the final models, §5.3)",
        type=int, metavar="N")
    add(g, "--batch-size", "batch_size", "examples per batch in every stream (paper: 16, §4.4); under torchrun the "
        "global batch, split evenly over the processes (a multiple of their number)", type=int, metavar="B")
    add(g, "--task-batch-size", "task_batch_size", "per-stream batch size overrides (not with --schedule even, "
        "whose batches are all one size, §4.2)", nargs="+", type=_kv(int), metavar="STREAM=B")
    add(g, "--eval-batch-size", "eval_batch_size", "examples per batch at evaluation", type=int, metavar="B")
    add(g, "--schedule", "schedule", "which stream's batch comes next: sequential (the CS224N starter, the paper's "
        "baseline §4.1), round_robin, even (§4.2 even batching: all batches shuffled together)", choices=SCHEDULES)
    add(g, "--loss-weights", "loss_weights", "per-stream loss factors (paper §4.2 loss rescaling: para=0.1); "
        "updates the preset's", nargs="+", type=_kv(float), metavar="STREAM=W")
    add(g, "--lr", "lr", "peak AdamW learning rate (paper: 1e-5, §4.1 and §4.5)", type=float)
    add(g, "--lr-schedule", "lr_schedule", "constant; epoch_decay = lr - lr_decay x epoch (paper §4.5); "
        "warmup_linear = linear warmup, then linear decay to 0 over all steps (BERT's)", choices=LR_SCHEDULES)
    add(g, "--lr-decay", "lr_decay", "with --lr-schedule epoch_decay: subtracted from the lr each epoch "
        "(paper: 4e-7, §4.5)", type=float)
    add(g, "--warmup", "warmup", "with --lr-schedule warmup_linear: fraction of all steps spent warming up",
        type=float, metavar="FRACTION")
    add(g, "--weight-decay", "weight_decay", "AdamW decoupled weight decay, never on biases or LayerNorm "
        "(paper §6: it did not help; presets use 0)", type=float)
    add(g, "--grad-clip", "grad_clip", "clip the global gradient norm to this, 0 = off (not in the paper)",
        type=float, metavar="NORM")
    add(g, "--seed", "seed", "seed of python, numpy and torch and of the batch order", type=int)

    g = p.add_argument_group("stages and post-training", "LP-FT (paper §4.2, tasks/lpft.py), SWA (§4.6, "
                             "tasks/swa.py), training-set logits for distillation (§4.6, tasks/objectives/distill.py)")
    add(g, "--lp-epochs", "lp_epochs", "LP-FT (paper §4.2): N epochs training only the heads (encoder frozen and in "
        "eval mode, so no dropout; the optimizer never sees it), then --epochs of full fine-tuning from those weights "
        "with a fresh optimizer, in one run; records carry stage lp / ft; 0 = off", type=int, metavar="N")
    g.add_argument("--lp-lr", dest="lp_lr", type=float, metavar="LR",
                   help="peak learning rate of LP-FT stage 1 (paper §4.2 gives none; needs --lp-epochs; "
                        "default: --lr)")
    add(g, "--swa-epochs", "swa_epochs", "SWA (paper §4.6: 5 epochs at lr 1e-5, PyTorch's SWA modules): after "
        "training, N more epochs at constant --swa-lr from the best checkpoint, averaging the weights at each epoch "
        "end (torch.optim.swa_utils.AveragedModel; LayerNorm only, so no BN update); saved as checkpoints/swa and "
        "used for the predictions when its dev score beats the best epoch's; 0 = off", type=int, metavar="N")
    add(g, "--swa-lr", "swa_lr", "constant learning rate of the SWA epochs (paper §4.6: 1e-5); needs --swa-epochs",
        type=float, metavar="LR")
    add(g, "--predict-train", "predict_train", "also write predictions/{task}-train-logits.csv on the whole "
        "training sets: the soft targets that --distill-teachers reads (paper §4.6 knowledge distillation); "
        "with --eval-only, from a saved model", action="store_true")

    g = p.add_argument_group("runtime")
    add(g, "--device", "device", "auto (cuda when available), cpu, cuda, cuda:N", metavar="DEVICE")
    add(g, "--bf16", "bf16", "bf16 autocast (default: on for CUDA with bf16 and on CPUs with native bf16, AMX or "
        "AVX512_BF16, where it measured 1.4-2.2x faster training at the same dev scores; off elsewhere)",
        action=argparse.BooleanOptionalAction)
    add(g, "--fused-adamw", "fused_adamw", "run our AdamW update through torch's fused kernel "
        "(minbert/optimizer.py; the same update up to float rounding, not bit for bit, as the foreach path that "
        "--no-fused-adamw selects; measured 1.14-1.31x faster training step on the 2-core CPUs, "
        "benchmarks/bench_multitask.py)", action=argparse.BooleanOptionalAction)
    add(g, "--compile", "compile", "torch.compile the encoder", action="store_true")
    add(g, "--gradient-checkpointing", "gradient_checkpointing", "activation checkpointing: keep only each encoder "
        "layer's input and recompute the layer in backward (less memory for about one more forward pass: "
        "bert-base-sized models on small GPUs); the same losses and gradients", action="store_true")
    add(g, "--log-every", "log_every", "one log line (every loss term, lr, seq/s) every N steps", type=int,
        metavar="N")
    add(g, "--checkpoint-every", "checkpoint_every", "also write checkpoints/last every N steps mid-epoch "
        "(0 = epoch ends only)", type=int, metavar="N")

    registry = registered_objectives()
    g = p.add_argument_group("objectives", "plug-in objectives (tasks/objectives/, one file each); an objective's "
                             "options --<objective>-<option> need --objective <objective> (or a preset that adds it)")
    g.add_argument("--objective", dest="objective", action="append", metavar="NAME",
                   help=f"add a plug-in objective (repeatable): {', '.join(sorted(registry))}")
    g.add_argument("--no-objective", dest="no_objective", action="append", metavar="NAME",
                   help="remove an objective a preset added (the paper's ablations, e.g. 'B3 - MNR', Figure 2)")
    for name, cls in sorted(registry.items()):
        g = p.add_argument_group(f"objective {name}", _objective_reference(cls))
        comments = _field_comments(cls.Config)
        for f in dataclasses.fields(cls.Config):
            flag = f"--{name}-{f.name}".replace("_", "-")
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            if isinstance(default, tuple):
                default = " ".join(default) or "()"
            dest = f"objectives.{name}.{f.name}"
            g.add_argument(flag, dest=dest, metavar=f.name.upper(), **_objective_field_kwargs(cls, f),
                           help=f"{comments.get(f.name, f.name)}{OBJECTIVE_NOTES.get(dest, '')} (default: {default})")
    return p


# ---- from flags to a config -------------------------------------------------------------------------------------


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
    if c.eval_only and distributed.env()[1] > 1:
        raise ValueError("--eval-only runs in one process: start it with python, not torchrun")
    if c.eval_only and c.resume:
        raise ValueError("--eval-only evaluates a saved model and --resume continues training it; choose one")
    if c.checkpoint is not None and not (c.eval_only or c.resume):
        raise ValueError("--checkpoint names a saved model for --eval-only or --resume; without either it "
                         "would be ignored")
    if c.overwrite and (c.eval_only or c.resume):
        raise ValueError("--overwrite is for a fresh training run; --eval-only and --resume never replace "
                         "checkpoints")
    if c.eval_only or c.resume:
        what = "--eval-only" if c.eval_only else "--resume"
        mutable = EVAL_MUTABLE if c.eval_only else RESUME_MUTABLE
        if c.preset or c.objective or c.no_objective:
            raise ValueError(f"{what} uses the checkpoint's own configuration; --preset, --objective and "
                             "--no-objective cannot change it")
        fixed = [_flag(p) for p in explicit if p not in mutable]
        if fixed:
            raise ValueError(f"{what} uses the configuration saved in the checkpoint, so {', '.join(fixed)} "
                             f"cannot change (allowed: {', '.join(_flag(p) for p in mutable)})")
        out_dir = Path(explicit.get("out_dir", TrainConfig().out_dir))
        default = out_dir / "checkpoints" / ("best" if c.eval_only else "last")
        ckpt = resolve_checkpoint(c.checkpoint if c.checkpoint is not None else default)
        cfg = TrainConfig.from_dict(read_json(ckpt / "config.json"))
        trained = cfg.tasks
        if "out_dir" not in explicit:
            explicit = {**explicit, "out_dir": str(ckpt.parent.parent) if ckpt.parent.name == "checkpoints"
                        else cfg.out_dir}
        for path, value in explicit.items():
            set_path(cfg, path, value)
        if c.eval_only:
            extra = sorted(set(cfg.tasks) - set(trained))
            if extra:
                raise ValueError(f"--tasks {' '.join(extra)}: the checkpoint was not trained on {extra}")
        else:
            _refuse_idle_flags(cfg, explicit)
            cfg.validate()
            distributed.check_config(cfg.batch_sizes(), cfg.device)
        resolve_device(cfg.device)
        return Invocation(c, cfg, explicit, ckpt)

    cfg = config_from_flags(c, explicit)
    if "lr_decay" in explicit and cfg.lr_schedule != "epoch_decay":
        raise ValueError(f"--lr-decay only acts with --lr-schedule epoch_decay (the run uses {cfg.lr_schedule})")
    if "warmup" in explicit and cfg.lr_schedule != "warmup_linear":
        raise ValueError(f"--warmup only acts with --lr-schedule warmup_linear (the run uses {cfg.lr_schedule})")
    _refuse_idle_flags(cfg, explicit)
    cfg.validate()
    distributed.check_config(cfg.batch_sizes(), cfg.device)
    resolve_device(cfg.device)
    return Invocation(c, cfg, explicit)


def _refuse_idle_flags(cfg: TrainConfig, explicit: dict[str, Any]) -> None:
    """Flags that only act with another setting: refused when that setting is off."""
    if "swa_lr" in explicit and cfg.swa_epochs == 0:
        raise ValueError("--swa-lr only acts with --swa-epochs N > 0 (the SWA phase, paper §4.6)")
    if "lp_lr" in explicit and cfg.lp_epochs == 0:
        raise ValueError("--lp-lr only acts with --lp-epochs N > 0 (LP-FT stage 1, paper §4.2)")


def config_from_flags(command: Command, explicit: dict[str, Any]) -> TrainConfig:
    """The training config of a fresh run: defaults, then the preset, objectives, explicit flags. Not validated."""
    c = command
    cfg = TrainConfig()
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


# ---- main ---------------------------------------------------------------------------------------------------------


def _setup_logging(out_dir: Path) -> None:
    """INFO lines to stderr and to <out_dir>/train.log (replacing the handlers of an earlier main() call).

    Under torchrun only rank 0 does this; the other ranks print warnings and errors to stderr, marked with their rank.
    """
    rank = distributed.env()[0]
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_train_multitask", False)]:
        root.removeHandler(handler)
        handler.close()
    if rank > 0:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname).1s [rank {rank}] %(name)s: %(message)s",
                                               datefmt="%H:%M:%S"))
        handler._train_multitask = True
        root.setLevel(logging.WARNING)
        root.addHandler(handler)
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname).1s %(name)s: %(message)s", datefmt="%H:%M:%S")
    root.setLevel(logging.INFO)
    for handler in (logging.StreamHandler(), logging.FileHandler(out_dir / "train.log", encoding="utf-8")):
        handler.setFormatter(fmt)
        handler._train_multitask = True
        root.addHandler(handler)


def main(argv: list[str] | None = None) -> dict:
    """Parse, refuse contradictions (exit status 2, before any data is read), then train or evaluate."""
    malloc_tuned = configure_malloc()
    parser = build_parser()
    command, explicit = parse(argv, parser)
    try:
        inv = build_invocation(command, explicit)
    except (ValueError, FileNotFoundError, NotADirectoryError) as e:
        parser.error(str(e))
    cfg = inv.config
    _setup_logging(Path(cfg.out_dir))
    logger.info("glibc malloc tuned for reuse: %s", malloc_tuned)
    world = distributed.world_size()
    if world > 1:
        logger.info("torchrun: %d processes, global batch %s = %s per process", world, cfg.batch_sizes(),
                    {s: b // world for s, b in cfg.batch_sizes().items()})
    try:
        if command.eval_only:
            overrides = {k: getattr(cfg, k) for k in EVAL_MUTABLE if "." not in k}
            overrides["objectives"] = cfg.objectives  # with the inference options given (knn_bert's K and φ)
            result = evaluate_checkpoint(inv.checkpoint, out_dir=cfg.out_dir, overrides=overrides)
        elif command.resume:
            result = run(cfg, resume_from=inv.checkpoint)
        else:
            result = run(cfg, overwrite=command.overwrite)
    finally:
        distributed.cleanup()  # leave torchrun's process group (no-op in one process)
    return result


if __name__ == "__main__":
    main()
