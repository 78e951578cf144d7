"""The multitask training loop: one generic loop for every task, schedule and objective.

Usage:
    from tasks.train import TrainConfig, run, evaluate_checkpoint
    summary = run(TrainConfig(out_dir="runs/try"))        # train, keep the best epoch, write predictions
    summary = run(cfg, resume_from="runs/try/checkpoints/last")
    evaluate_checkpoint("runs/try/checkpoints/best")       # predictions from a saved model
    cfg = apply_preset(TrainConfig(), "b1")                # the paper's configurations (§5.4)

What a run does (``TrainConfig`` documents every knob):
1. ``seed_everything(seed)``; each task's train and dev files are read and
   tokenized once (tasks.data); the "nli" stream (nli-train.csv triplets) when
   ``nli`` is on.
2. The encoder (``pretrained``; ``encoder_dropout`` goes into its BertConfig),
   ``MultitaskBert(encoder, model)``, the objectives (tasks.objectives registry),
   our AdamW with no weight decay on biases and LayerNorm weights.
3. Every epoch, ``MultitaskSchedule.epoch_plan(epoch)`` lists (stream, batch)
   steps (sequential / round_robin / even). One step is one batch of one
   stream, and its loss is

       w_stream · (s · head_loss + Σ_objectives weight_o · Σ terms_o)

   with w the stream's loss weight (§4.2 loss rescaling), s the product of the
   applying objectives' ``task_loss_scale`` (SCL's 1 − λ), and terms the named
   losses each applying objective returns. The "nli" stream has no head loss:
   only its objectives (MNR, §4.2) train on it. Every term is logged under
   ``<stream>/loss`` (the head) or ``<stream>/<objective>.<term>``, plus the
   weighted total ``loss``.
4. After every epoch: dev metrics (tasks.evaluate), a JSONL record, the plot,
   and checkpoint ``last``; ``best`` when the overall dev score improved.
5. After the last epoch: the best checkpoint is loaded; with ``swa_epochs``
   the SWA phase runs from it (tasks/swa.py, paper §4.6) and its averaged
   model replaces the best one when it scores higher on dev; then dev and test
   predictions and logits are written for every task (a missing test file is
   skipped with a message), training-set logits too with ``predict_train``
   (teachers for the "distill" objective), and with the knn_bert objective the
   KNN-BERT inference scores (``write_all_predictions``).

LP-FT (``lp_epochs``, paper §4.2, tasks/lpft.py): the first ``lp_epochs``
epochs train the heads only (stage "lp", encoder frozen), then ``epochs`` of
full fine-tuning follow with a fresh optimizer (stage "ft"), in the same loop.

Determinism: batches come from explicit generators (a pure function of seed
and epoch); dropout draws from torch's global RNG, whose state is saved with
every checkpoint, so ``resume_from`` continues bit for bit on CPU.

Throughput: losses are accumulated as tensors on the device and read back
only at log time (one sync per ``log_every`` steps). On CUDA the next batch is
collated and pinned in a background thread while the current one trains, and
copied to the GPU with non_blocking=True.

Several processes (``torchrun --nproc_per_node=N train_multitask.py ...``,
tasks/distributed.py): ``batch_size`` is the global batch, rank r trains on
every N-th example of each global batch (same schedule and seed on every rank)
and gradients are averaged over the ranks after backward, so N processes take
the steps one process would take with the same batch size (tested: equal
losses and weights within float rounding, without dropout). Only rank 0
evaluates and writes files (checkpoints, metrics.jsonl, training.png,
predictions); the other ranks wait for its dev scores between epochs and stop
after training (and SWA). Each rank draws its own dropout masks; checkpoints
keep every rank's RNG state, so a resume with the same N continues bit for bit.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import json
import logging
import math
import os
import random
import shutil
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from minbert.bert import BertModel
from minbert.config import BertConfig
from minbert.optimizer import AdamW
from minbert.pretrained import load_pretrained, resolve_model_dir
from minbert.tokenizer import BertTokenizer
from tasks import distributed, lpft
from tasks import objectives as objectives_pkg
from tasks.checkpoint import (
    CHECKPOINT_FORMAT,
    atomic_directory,
    link_or_copy_directory,
    load_optimizer_state,
    load_tensors,
    optimizer_state,
    read_json,
    resolve_checkpoint,
    rng_state,
    save_tensors,
    set_rng_state,
    write_json,
)
from tasks.data import (
    Example,
    PairDataset,
    SentenceDataset,
    TripletDataset,
    load_nli,
    load_split,
    move_batch,
)
from tasks.evaluate import TASK_METRIC, Predictions, evaluate, overall_score, score, write_logits, write_predictions
from tasks.model import TASKS, ModelConfig, MultitaskBert
from tasks.objectives import REGISTRY, Objective, build_objectives
from tasks.objectives.knn_bert import NUM_CLASSES as KNN_CLASSES
from tasks.objectives.knn_bert import KNNClassifier, class_probabilities, compute_representations
from tasks.sampling import SCHEDULES, LossWeights, MultitaskSchedule

logger = logging.getLogger(__name__)

NLI = "nli"
STREAMS = TASKS + (NLI,)
LR_SCHEDULES = ("constant", "epoch_decay", "warmup_linear")
# Config fields that may change when a run is resumed: none of them changes the
# arithmetic of the steps already taken or the batches still to come.
# SWA and train-set predictions come after the training steps, so they may change too
# (resuming a finished run with --swa-epochs adds the SWA phase to it).
RESUME_MUTABLE = ("epochs", "device", "bf16", "compile", "gradient_checkpointing", "log_every", "checkpoint_every",
                  "eval_batch_size", "out_dir", "data_dir", "swa_epochs", "swa_lr", "predict_train")
PRESETS = ("baseline", "b1", "b2", "b3")


# ---- configuration ------------------------------------------------------------------------------


@dataclass
class TrainConfig:
    """Everything one training run needs; saved as plain JSON (config.json) with every checkpoint.

    The defaults are the CPU recipe of ``python train_multitask.py`` (embedded
    MiniLM, at most 20 minutes on 2 cores), chosen by measurement on one-epoch
    runs (6k Quora pairs; dev overall on the full dev sets): cross-encoded
    pairs (one sequence per pair, half the encoder work of Siamese); mean
    pooling, 0.702 vs 0.660 for the pooler (all-MiniLM-L6-v2 was trained with
    mean pooling); lr 1e-4 with warmup and linear decay, 0.714 vs 0.702 at
    5e-5; bf16 autocast on CPUs with native bf16, AMX or AVX512_BF16 (1.4x
    faster on the Xeon with AMX, same scores); the fused AdamW kernel; then 3 epochs
    with Quora capped at a fresh 16k pairs per epoch and scored on a fixed 3k
    dev subset between epochs. ``apply_preset`` gives the paper's GPU configurations.
    """

    # -- data --
    data_dir: str = "data"  # the CS224N CSV files (data/README.md)
    out_dir: str = "runs/default"  # run directory: checkpoints/, metrics.jsonl, training.png, predictions/, train.log
    tasks: tuple[str, ...] = TASKS  # tasks trained and evaluated (subset of sst, para, sts)
    nli: bool = False  # add the nli-train.csv triplet stream (paper §4.2 "Additional AllNLI data"); needs an objective on "nli"
    limit: int | None = None  # read at most N examples of every split of every task (and NLI): smoke runs
    max_length: int = 128  # tokens per sequence (a cross-encoded pair counts as one sequence); longer ones are truncated
    # Per-stream cap on training examples per epoch: a fresh seeded random subset each
    # epoch (Quora is ~6x SST; on CPU the whole of it does not fit the time budget).
    max_train_examples: dict[str, int] = field(default_factory=lambda: {"para": 16000})
    # Per-task cap on dev examples scored between epochs: a fixed seeded random subset
    # (Quora dev has 20k pairs). The final evaluation always uses the whole dev set.
    dev_max_examples: dict[str, int] = field(default_factory=lambda: {"para": 3000})
    # "full": the final evaluation scores the whole dev sets; "capped": the same fixed
    # subsets as between epochs (cheap sweeps such as the robustness table; not for
    # numbers compared with the paper's).
    final_dev: str = "full"

    # -- model --
    pretrained: str | None = None  # HF BERT checkpoint directory; None = the embedded all-MiniLM-L6-v2
    encoder_dropout: float | None = None  # encoder hidden + attention dropout (§4.5 keeps 0.3); None = the checkpoint's own
    model: ModelConfig = field(default_factory=lambda: ModelConfig(arch="b1", pair_encoding="cross", pooling="mean",
                                                                   head_dropout=0.0))
    objectives: dict[str, dict[str, Any]] = field(default_factory=dict)  # objective name -> its Config overrides

    # -- optimization --
    epochs: int = 3  # passes over the (capped) training streams
    batch_size: int = 32  # examples per batch, every stream; under torchrun the global batch, split over the ranks
    task_batch_size: dict[str, int] = field(default_factory=dict)  # per-stream batch size overrides (not with schedule even)
    eval_batch_size: int = 128  # examples per batch at evaluation
    schedule: str = "even"  # sequential | round_robin | even (§4.2 even batching)
    loss_weights: dict[str, float] = field(default_factory=dict)  # per-stream loss factor, missing = 1 (§4.2: para 0.1)
    lr: float = 1e-4  # peak learning rate of AdamW
    lr_schedule: str = "warmup_linear"  # constant | epoch_decay (lr - lr_decay·epoch, §4.5) | warmup_linear (to 0 over all steps)
    lr_decay: float = 4e-7  # epoch_decay only: subtracted from lr once per epoch (§4.5: 4e-7)
    warmup: float = 0.1  # warmup_linear only: fraction of all steps with a linear warmup from 0
    weight_decay: float = 0.01  # AdamW decoupled weight decay; never on biases and LayerNorm weights
    grad_clip: float = 1.0  # clip the global gradient norm to this; 0 = no clipping
    seed: int = 0  # seeds python, numpy and torch once; batches use generators derived from it

    # -- stages and post-training (tasks/lpft.py, tasks/swa.py) --
    lp_epochs: int = 0  # LP-FT (§4.2): heads-only epochs (encoder frozen) before the `epochs` of fine-tuning; 0 = off
    lp_lr: float | None = None  # LP-FT stage 1 peak learning rate; None = lr
    swa_epochs: int = 0  # SWA (§4.6, the paper ran 5): epochs at constant swa_lr from the best checkpoint; 0 = off
    swa_lr: float = 1e-5  # SWA constant learning rate (§4.6: 1e-5)
    predict_train: bool = False  # also write {task}-train-logits.csv of the training sets (distillation, §4.6)

    # -- runtime --
    device: str = "auto"  # auto (cuda when available, else cpu) | cpu | cuda | cuda:N
    # bf16 autocast; None = on for CUDA (with bf16) and for CPUs with AMX or AVX512_BF16, else off
    bf16: bool | None = None
    compile: bool = False  # torch.compile the encoder
    # recompute each encoder layer's activations in backward instead of keeping them (memory for compute:
    # bert-base-sized models on small GPUs); the same losses and gradients
    gradient_checkpointing: bool = False
    # our AdamW through torch's fused kernel (the same update up to rounding, a ~3x faster optimizer step);
    # False: the foreach path
    fused_adamw: bool = True
    log_every: int = 50  # one log line every N steps (the only time losses are read back from the device)
    checkpoint_every: int = 0  # also write checkpoint "last" every N steps mid-epoch; 0 = at epoch ends only

    def __post_init__(self) -> None:
        self.tasks = tuple(self.tasks)
        if isinstance(self.model, dict):
            self.model = ModelConfig(**self.model)

    # -- JSON --
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tasks"] = list(self.tasks)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Inverse of ``to_dict``; an unknown key is an error (a config from another version must not half-load)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig field(s) {unknown}; known: {sorted(known)}")
        d = dict(d)
        if "model" in d:
            model_known = {f.name for f in dataclasses.fields(ModelConfig)}
            bad = sorted(set(d["model"]) - model_known)
            if bad:
                raise ValueError(f"unknown ModelConfig field(s) {bad}; known: {sorted(model_known)}")
            d["model"] = ModelConfig(**d["model"])
        return cls(**d)

    # -- checks --
    def streams(self) -> tuple[str, ...]:
        """The schedule's streams: the tasks, then "nli" when on."""
        return self.tasks + ((NLI,) if self.nli else ())

    def batch_sizes(self) -> dict[str, int]:
        return {s: self.task_batch_size.get(s, self.batch_size) for s in self.streams()}

    def validate(self) -> None:
        """Raise ValueError with a sentence saying why when fields contradict each other or are out of range."""
        if not self.tasks:
            raise ValueError("tasks is empty: train at least one of sst, para, sts")
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}: the tasks are {', '.join(TASKS)}")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks {list(self.tasks)} names a task twice")
        streams = self.streams()
        for name, mapping in (("max_train_examples", self.max_train_examples), ("loss_weights", self.loss_weights),
                              ("task_batch_size", self.task_batch_size)):
            extra = sorted(set(mapping) - set(streams))
            if extra:
                hint = " (add --nli for the nli stream)" if NLI in extra and not self.nli else ""
                raise ValueError(f"{name} names {extra}, which this run does not train (streams: {list(streams)}){hint}")
        extra = sorted(set(self.dev_max_examples) - set(self.tasks))
        if extra:
            raise ValueError(f"dev_max_examples names {extra}, which this run does not evaluate (tasks: {list(self.tasks)})")
        _positive_ints("max_train_examples", self.max_train_examples, 1)
        _positive_ints("dev_max_examples", self.dev_max_examples, 2)  # Pearson r needs two points
        if self.final_dev not in ("full", "capped"):
            raise ValueError(f"final_dev must be 'full' or 'capped', got {self.final_dev!r}")
        _positive_ints("task_batch_size", self.task_batch_size, 1)
        bad = {s: w for s, w in self.loss_weights.items() if not (isinstance(w, (int, float)) and w >= 0)}
        if bad:
            raise ValueError(f"loss weights must be non-negative numbers, got {bad}")
        for name in ("epochs", "batch_size", "eval_batch_size", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("lp_epochs", "swa_epochs"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = off), got {getattr(self, name)}")
        if self.lp_lr is not None and not self.lp_lr > 0:
            raise ValueError(f"lp_lr must be positive, got {self.lp_lr}")
        if self.lp_lr is not None and self.lp_epochs == 0:
            raise ValueError("lp_lr is the learning rate of LP-FT stage 1, but lp_epochs is 0: it would do nothing")
        if not self.swa_lr > 0:
            raise ValueError(f"swa_lr must be positive, got {self.swa_lr}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0 (0 = epoch ends only), got {self.checkpoint_every}")
        if self.max_length < 3:
            raise ValueError(f"max_length={self.max_length} leaves no room for text ([CLS] a [SEP] b [SEP] needs 3 tokens)")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; schedules: {', '.join(SCHEDULES)}")
        sizes = self.batch_sizes()
        if self.schedule == "even" and len(set(sizes.values())) > 1:
            raise ValueError(f"schedule 'even' (paper §4.2) splits every task into batches of one size, "
                             f"but the batch sizes differ: {sizes}")
        if self.limit is not None:
            if self.limit < max(sizes.values()):
                raise ValueError(f"limit={self.limit} is smaller than the batch size {max(sizes.values())}: "
                                 "every batch would be partial; lower --batch-size or raise --limit")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"unknown lr_schedule {self.lr_schedule!r}; choose one of {', '.join(LR_SCHEDULES)}")
        if not self.lr_decay >= 0:
            raise ValueError(f"lr_decay must be >= 0, got {self.lr_decay}")
        if self.lr_schedule == "epoch_decay" and not self.lr - self.lr_decay * (self.epochs - 1) > 0:
            raise ValueError(f"lr_schedule epoch_decay: lr {self.lr} - lr_decay {self.lr_decay} x {self.epochs - 1} "
                             "epochs is not positive; the last epochs would not train")
        lp_peak = self.lp_lr if self.lp_lr is not None else self.lr
        if (self.lr_schedule == "epoch_decay" and self.lp_epochs
                and not lp_peak - self.lr_decay * (self.lp_epochs - 1) > 0):
            raise ValueError(f"lr_schedule epoch_decay: LP-FT stage 1 lr {lp_peak} - lr_decay {self.lr_decay} x "
                             f"{self.lp_epochs - 1} epochs is not positive; its last epochs would not train")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup is a fraction of all steps in [0, 1), got {self.warmup}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not self.grad_clip >= 0:
            raise ValueError(f"grad_clip must be >= 0 (0 = off), got {self.grad_clip}")
        if self.encoder_dropout is not None and not 0 <= self.encoder_dropout < 1:
            raise ValueError(f"encoder_dropout must be in [0, 1), got {self.encoder_dropout}")
        _check_device_string(self.device)
        self.model.__post_init__()  # a ModelConfig edited after construction is re-checked
        check_objectives(self)


def _positive_ints(name: str, mapping: dict[str, int], low: int) -> None:
    bad = {k: v for k, v in mapping.items() if not (isinstance(v, int) and v >= low)}
    if bad:
        raise ValueError(f"{name} values must be integers >= {low}, got {bad}")


def _check_device_string(device: str) -> None:
    if device in ("auto", "cpu", "cuda", "mps") or (device.startswith("cuda:") and device[5:].isdigit()):
        return
    raise ValueError(f"device {device!r} is not one of auto, cpu, cuda, cuda:N, mps")


def _active_tasks(cls: type[Objective], config: Any) -> tuple[str, ...]:
    """The streams an objective of class ``cls`` with ``config`` applies to, without building it (no model needed)."""
    return tuple(cls.active_tasks(types.SimpleNamespace(config=config, tasks=cls.tasks)))


def registered_objectives() -> dict[str, type[Objective]]:
    """Every objective under tasks/objectives/, imported so that each registers itself."""
    objectives_pkg.import_all()
    return dict(REGISTRY)


def check_objectives(cfg: TrainConfig) -> None:
    """Refuse objectives that are not registered, cannot be configured so, or would do nothing in this run."""
    registry = registered_objectives()
    streams = cfg.streams()
    on_nli = []
    for name, overrides in cfg.objectives.items():
        if name not in registry:
            raise ValueError(f"objective {name!r} is not registered: no module under tasks/objectives/ defines it "
                             f"(registered: {', '.join(sorted(registry)) or 'none'})")
        cls = registry[name]
        try:
            config = cls.Config(**overrides)
        except (TypeError, ValueError) as e:
            raise ValueError(f"objective {name!r}: {e}") from None
        applies = [s for s in _active_tasks(cls, config) if s in streams]
        if not applies:
            raise ValueError(f"objective {name!r} applies to {list(_active_tasks(cls, config))}, none of which this "
                             f"run trains (streams: {list(streams)})")
        if getattr(cls, "needs_siamese", False) and cfg.model.pair_encoding == "cross":
            raise ValueError(f"objective {name!r} compares separately encoded sentences and needs "
                             "pair_encoding 'siamese', but the run uses 'cross'")
        if NLI in applies:
            on_nli.append(name)
        if hasattr(cls, "check_run"):  # checks of the run's files (distill: the teachers' logits), before any work
            cls.check_run(config, cfg)
        if name == "knn_bert" and cfg.limit is not None and config.knn_k > cfg.limit:
            raise ValueError(f"knn_bert knn_k={config.knn_k} neighbours, but limit={cfg.limit} leaves at most "
                             f"{cfg.limit} training examples per task for the final KNN-BERT evaluation "
                             "(KNNInference); lower --knn-bert-knn-k")
    if cfg.nli and not on_nli:
        raise ValueError("the nli stream has no head loss and no objective here applies to it, so it would "
                         "train nothing: add an objective for nli (the paper uses --objective mnr, §4.2)")


# ---- presets (paper §5.4) ---------------------------------------------------------------------------


def apply_preset(cfg: TrainConfig, name: str) -> TrainConfig:
    """A copy of ``cfg`` with the paper's configuration ``name`` (baseline, b1, b2, b3).

    From ../shared/papers/minbert-downstream-generalization.txt:
    - common: 10 epochs (§5.3), batch size 16 (§4.4 "ours is just K = 16"),
      lr 1e-5 (§4.1), encoder dropout 0.3 (§4.5 "keeping the main BERT
      model's dropout rate at 0.3"), every training and dev example (no caps),
      Siamese pairs on the pooled [CLS] (§4.1), no weight decay or gradient
      clipping (neither is used; §6 weight decay "did not work well").
    - baseline (§4.1): linear heads with dropout 0.3, constant lr, the
      sequential schedule (one task's epoch after another).
    - b3 (§5.4): the b1 architecture (shared FCN, non-linear heads, paraphrase
      structural change, FCN 256, §4.3) with head dropout 0.3, even batching
      and loss rescaling (para 0.1, §4.2), MNR on STS (label-weighted, §4.4) and
      unsupervised SimCSE on STS (dot product, §4.4), lr 1e-5 decayed by
      4e-7 per epoch (§4.5), no NLI.
    - b2: b3 without head dropout. b1: b2 plus the AllNLI stream trained with
      MNR only (§4.2; pairs of entailed sentences, so no hard negatives).
    Objectives a preset needs must be registered; ``validate`` names any that is not.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    common = dict(epochs=10, batch_size=16, task_batch_size={}, lr=1e-5, encoder_dropout=0.3,
                  max_train_examples={}, dev_max_examples={}, weight_decay=0.0, grad_clip=0.0, nli=False,
                  loss_weights={}, objectives={})
    if name == "baseline":
        model = ModelConfig(arch="baseline", pair_encoding="siamese", pooling="pooler", head_dropout=0.3)
        return dataclasses.replace(cfg, **common, model=model, schedule="sequential", lr_schedule="constant")
    head_dropout = 0.3 if name == "b3" else 0.0
    model = ModelConfig(arch="b1", pair_encoding="siamese", pooling="pooler", fcn_size=256, head_dropout=head_dropout)
    mnr_streams = ["sts", NLI] if name == "b1" else ["sts"]
    objectives = {"mnr": {"tasks": mnr_streams, "hard_negatives": False},
                  "simcse": {"tasks": ["sts"], "similarity": "dot", "temperature": 1.0}}
    return dataclasses.replace(cfg, **{**common, "objectives": objectives, "loss_weights": {"para": 0.1},
                                       "nli": name == "b1"},
                               model=model, schedule="even", lr_schedule="epoch_decay", lr_decay=4e-7)


# ---- process-level setup ------------------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA): the one place global RNGs are seeded."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc mallopt parameters (malloc.h)


def configure_malloc() -> bool:
    """Make glibc keep freed memory for reuse instead of returning it to the OS each step.

    Without this, every large tensor of a CPU training step (activations,
    gradients, the 47 MB word-embedding gradient and AdamW temporaries) is
    mmapped and unmapped again, and the pages are zero-filled on each fault.
    M_MMAP_MAX=0 serves all allocations from the heap; M_TRIM_THRESHOLD at
    its maximum stops the heap from being trimmed. (Raising M_MMAP_THRESHOLD,
    or MALLOC_MMAP_THRESHOLD_ in the environment, cannot do this: glibc caps
    it at 32 MiB, below the embedding gradient.) Measured on the 2-core Xeon,
    default recipe, 60-80 real training steps, fp32: 79-84 -> 86-87 seq/s
    (+3-8%) and 40% fewer minor page faults; the environment variables gave
    83-85 seq/s. Call it first thing in a process (train_multitask.main does).
    Returns False where glibc's mallopt is not available.
    """
    name = ctypes.util.find_library("c")
    if sys.platform != "linux" or name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(_M_MMAP_MAX, 0) == 1
    ok = (mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1) and ok
    return ok


def resolve_device(name: str) -> torch.device:
    """"auto" -> cuda when available else cpu; an unavailable device is an error."""
    _check_device_string(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but torch.cuda.is_available() is False")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device 'mps' requested but torch.backends.mps.is_available() is False")
    return device


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively: AMX tiles (Intel Sapphire Rapids on) or AVX512_BF16 (e.g. AMD Zen 4).

    On both, oneDNN's bf16 matmuls beat fp32 several times over (measured on the
    2-core machines of this project: 1,292 vs 165 GFLOP/s on one thread of a Xeon
    with AMX, 817 vs 193 GFLOP/s on two threads of an EPYC with AVX512_BF16).
    The probes are torch's private ones, hence the guards.
    """
    probes = (getattr(torch.cpu, "_is_amx_tile_supported", None), getattr(torch.cpu, "_is_avx512_bf16_supported", None))
    return any(probe is not None and probe() for probe in probes)


def autocast_dtype(bf16: bool | None, device: torch.device) -> torch.dtype | None:
    """bfloat16 when autocast is on: explicitly, or by default on CUDA with bf16 support and on CPUs with native bf16.

    Measured on the 2-core Xeon with AMX (default recipe, one epoch with a 6k Quora
    cap): bf16 autocast trains at 125 vs 87 seq/s and evaluates ~2.3x faster, with
    the same dev scores (overall 0.7021 bf16 vs 0.7029 fp32). On the 2-core EPYC
    with AVX512_BF16 (no AMX) the multitask training step runs 2.0x faster in bf16
    (benchmarks/bench_multitask.py: 140 vs 70 seq/s) and the default recipe 2.2x
    (606 vs 1,337 s; overall 0.751 vs 0.749). Without either, bf16 on
    CPU is emulated and slower, so it stays off unless asked for.
    """
    if bf16 is None:
        bf16 = ((device.type == "cuda" and torch.cuda.is_bf16_supported())
                or (device.type == "cpu" and cpu_has_native_bf16()))
    if bf16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("bf16 autocast requested but this GPU does not support bfloat16")
    return torch.bfloat16 if bf16 else None


# ---- data --------------------------------------------------------------------------------------------------------


def make_dataset(task: str, examples: Sequence[Example], tokenizer: Any, cfg: TrainConfig):
    """The tokenized dataset of a task: SentenceDataset (sst) or PairDataset in the model's pair encoding."""
    if task == "sst":
        return SentenceDataset(examples, tokenizer, max_length=cfg.max_length)
    return PairDataset(examples, tokenizer, mode=cfg.model.pair_encoding, max_length=cfg.max_length)


def fixed_subset(examples: list[Example], n: int, seed: int) -> list[Example]:
    """A fixed random subset of ``n`` examples (same for every epoch), kept in file order."""
    if n >= len(examples):
        return examples
    g = torch.Generator().manual_seed(seed)
    keep = sorted(torch.randperm(len(examples), generator=g)[:n].tolist())
    return [examples[i] for i in keep]


def capped_dev(task: str, dev: list[Example], cfg: TrainConfig) -> list[Example]:
    """The dev examples scored between epochs: a fixed seeded subset where ``dev_max_examples`` caps the task."""
    n = cfg.dev_max_examples.get(task)
    if n is None or n >= len(dev):
        return dev
    logger.info("%s dev: a fixed random %d of %d examples between epochs%s", task, n, len(dev),
                " and at the end (final_dev capped)" if cfg.final_dev == "capped" else
                " (the final evaluation uses all)")
    return fixed_subset(dev, n, cfg.seed)


def _load(task: str, split: str, cfg: TrainConfig):
    loaded = load_split(task, split, cfg.data_dir, limit=cfg.limit)
    if loaded is None:
        return None
    examples, _ = loaded
    if not examples:
        raise ValueError(f"{task} {split}: no valid examples in {cfg.data_dir}")
    return examples


# ---- the trainer -------------------------------------------------------------------------------------------------


class Hook:
    """Callbacks around the loop (custom logging, early stops); override what you need.

    LP-FT stages are part of the loop (tasks/lpft.py: the optimizer changes at
    the stage boundary, before that epoch's checkpoint) and SWA is a phase of
    ``run`` after it (tasks/swa.py); hooks do not run during SWA.

    ``trainer`` gives access to the model, optimizer, config and position
    (``epoch``, ``step``, ``global_step``). Hooks run after the step's checkpoint.
    """

    def on_train_start(self, trainer: Trainer) -> None: ...

    def on_step_end(self, trainer: Trainer) -> None: ...

    def on_epoch_end(self, trainer: Trainer, record: dict) -> None: ...

    def on_train_end(self, trainer: Trainer) -> None: ...


class _EvalView(nn.Module):
    """The model as evaluation sees it: objectives' inference transforms (Match-Tuning "batch") applied."""

    def __init__(self, model: MultitaskBert, transforms: dict[str, Callable]):
        super().__init__()
        self.model = model
        self.transforms = transforms

    def forward(self, task: str, batch: dict):
        return self.model(task, batch, transform=self.transforms.get(task))

    def predict(self, task: str, out) -> torch.Tensor:
        return self.model.predict(task, out)


def _compose(fns: list[Callable]) -> Callable | None:
    if not fns:
        return None
    if len(fns) == 1:
        return fns[0]

    def composed(h: torch.Tensor) -> torch.Tensor:
        for f in fns:
            h = f(h)
        return h

    return composed


def eval_model(model: MultitaskBert, objectives: Sequence[Objective], tasks: Sequence[str]) -> nn.Module:
    """``model`` itself, or a view applying the objectives' evaluation transforms where they have one."""
    transforms = {}
    for task in tasks:
        fns = [o.transform_for(task, False) for o in objectives if hasattr(o, "transform_for")]
        fn = _compose([f for f in fns if f is not None])
        if fn is not None:
            transforms[task] = fn
    return _EvalView(model, transforms) if transforms else model


def _jsonable(metrics: dict[str, float]) -> dict[str, float | None]:
    """Non-finite values (an undefined Pearson r) become null: JSON has no NaN."""
    return {k: (float(v) if math.isfinite(v) else None) for k, v in metrics.items()}


def _sequences(batch: dict | None) -> int:
    """Sequences the encoder reads for a batch: 1 per row, 2 for Siamese pairs, 2-3 for NLI triplets."""
    if batch is None:  # a rank's empty shard
        return 0
    rows = len(batch["ids"])
    return rows * sum(1 for k in batch if k.startswith("input_ids"))


class Trainer:
    """One training run: builds data, model, objectives and optimizer from a TrainConfig, then ``fit()``.

    ``resume_from`` (a checkpoint directory) restores model, objectives,
    optimizer, position (epoch, step), best score, history and RNG states;
    its config.json must equal ``cfg`` except for RESUME_MUTABLE fields.
    A fresh run refuses an ``out_dir`` that already holds checkpoints unless
    ``overwrite`` is set. Under torchrun each process builds its own Trainer
    (``self.rank`` of ``self.world_size``); its collectives (gradient
    all-reduce, loss sums at log time, dev scores, checkpoint states) are
    entered by every rank at the same steps. Hooks run on every rank.
    """

    # Collate the next batch in a background thread (``batches``); None = on CUDA only.
    prefetch: bool | None = None

    def __init__(self, cfg: TrainConfig, hooks: Sequence[Hook] = (), resume_from: str | os.PathLike | None = None,
                 overwrite: bool = False) -> None:
        cfg.validate()
        distributed.check_config(cfg.batch_sizes(), cfg.device)
        self.cfg = cfg
        self.hooks = list(hooks)
        self.out_dir = Path(cfg.out_dir)
        self.ckpt_root = self.out_dir / "checkpoints"
        self.metrics_path = self.out_dir / "metrics.jsonl"
        # Under torchrun: join the process group (cuda -> cuda:LOCAL_RANK); only rank 0 touches out_dir.
        self.device = distributed.setup(resolve_device(cfg.device))
        self.rank, self.world_size = distributed.rank(), distributed.world_size()
        main = self.rank == 0
        ckpt = None
        if resume_from is not None:
            ckpt = resolve_checkpoint(resume_from)
            check_resume_config(TrainConfig.from_dict(read_json(ckpt / "config.json")), cfg)
        else:
            occupied = main and self.ckpt_root.exists() and any(self.ckpt_root.iterdir())
            if distributed.broadcast_from_main(occupied and not overwrite):  # every rank raises, or none
                raise FileExistsError(f"{self.ckpt_root} already holds checkpoints: resume them (--resume), "
                                      "pick another --out-dir, or pass --overwrite to replace them")
            if occupied:
                shutil.rmtree(self.ckpt_root)
        if main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if ckpt is None:
                self.metrics_path.unlink(missing_ok=True)  # a fresh run starts a fresh metrics file
            write_json(self.out_dir / "config.json", cfg.to_dict())

        seed_everything(cfg.seed)  # the same on every rank: identical initial weights
        self.amp_dtype = autocast_dtype(cfg.bf16, self.device)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        t0 = time.perf_counter()
        overrides: dict[str, Any] = {"gradient_checkpointing": cfg.gradient_checkpointing}
        if cfg.encoder_dropout is not None:
            overrides |= {"hidden_dropout_prob": cfg.encoder_dropout, "attention_probs_dropout_prob": cfg.encoder_dropout}
        encoder, self.tokenizer = load_pretrained(cfg.pretrained, config_overrides=overrides)
        self.encoder_dir = resolve_model_dir(cfg.pretrained)
        self.train_sets: dict[str, Any] = {}
        self.dev_sets: dict[str, Any] = {}
        for task in cfg.tasks:
            self.train_sets[task] = make_dataset(task, _load(task, "train", cfg), self.tokenizer, cfg)
            self.dev_sets[task] = make_dataset(task, capped_dev(task, _load(task, "dev", cfg), cfg), self.tokenizer, cfg)
        if cfg.nli:
            triplets, _ = load_nli(cfg.data_dir, limit=cfg.limit)
            self.train_sets[NLI] = TripletDataset(triplets, self.tokenizer, max_length=cfg.max_length)
        logger.info("data: %s (read and tokenized in %.1f s)",
                    ", ".join(f"{s} {len(d)} train" for s, d in self.train_sets.items()), time.perf_counter() - t0)

        self.model = MultitaskBert(encoder, cfg.model).to(self.device)
        self.objectives = build_objectives(cfg.objectives, self.model)
        for o in self.objectives:
            o.to(self.device)
            # Before the optimizer (an objective may add parameters) and before a checkpoint is
            # loaded (whatever this sets up, the checkpoint's state then overwrites).
            if hasattr(o, "set_train_size"):  # KNN-BERT: queue = min(queue_size, train size)
                for task in cfg.tasks:
                    if o.applies_to(task):
                        o.set_train_size(len(self.train_sets[task]), task)
            if hasattr(o, "on_train_start"):
                o.on_train_start(self.model, self)
        coupled = [o.name for o in self.objectives if o.batch_coupled]
        if coupled and self.world_size > 1 and self.rank == 0:
            logger.warning("%d processes: objective(s) %s couple the examples of a batch and see each rank's shard "
                           "(%s) as their batch, not the global one (fewer in-batch negatives, per-rank KNN "
                           "queues): this run is not the one a single process with the same batch size would make",
                           self.world_size, ", ".join(coupled),
                           {s: b // self.world_size for s, b in cfg.batch_sizes().items()})
        # LP-FT: the stage of the position to start from decides which parameters the optimizer sees.
        self.stage = lpft.stage_at(cfg, read_json(ckpt / "state.json")["epoch"] if ckpt is not None else 0)
        lpft.set_stage(self.model, self.stage)
        self.params, self.param_names, self.optimizer = self._build_optimizer()
        self.schedule = MultitaskSchedule({s: d.lengths for s, d in self.train_sets.items()}, cfg.batch_sizes(),
                                          cfg.schedule, seed=cfg.seed, max_examples_per_epoch=cfg.max_train_examples)
        self.weights = LossWeights(**{t: cfg.loss_weights[t] for t in TASKS if t in cfg.loss_weights},
                                   extra={s: w for s, w in cfg.loss_weights.items() if s not in TASKS})

        # Position: the next step to run is plan(epoch)[step].
        self.epoch = 0
        self.step = 0
        self.global_step = 0
        self.best: dict | None = None
        self.history: list[dict] = []
        self.epoch_sums: dict[str, torch.Tensor] = {}
        self.epoch_counts: dict[str, float] = {}  # steps (under torchrun: this rank's shares of them)
        self.elapsed = 0.0  # training seconds before this process (resumed runs)
        self._rng_to_restore = None
        if ckpt is not None:
            self._load_checkpoint(ckpt)
        elif self.rank > 0:
            seed_everything(distributed.rank_seed(cfg.seed, self.rank))  # this rank's own dropout masks
        if cfg.compile:
            self.model.encoder.compile()

    # -- building --
    def _build_optimizer(self) -> tuple[list[nn.Parameter], list[str], AdamW]:
        """AdamW over the model's and objectives' trainable parameters; no decay on biases / LayerNorm (ndim < 2)."""
        named: list[tuple[str, nn.Parameter]] = []
        seen: set[int] = set()
        sources = [("model", self.model)] + [(f"objectives.{o.name}", o) for o in self.objectives]
        for prefix, module in sources:
            for n, p in module.named_parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    named.append((f"{prefix}.{n}", p))
        decay = [(n, p) for n, p in named if p.ndim >= 2]
        no_decay = [(n, p) for n, p in named if p.ndim < 2]
        groups = [{"params": [p for _, p in decay], "weight_decay": self.cfg.weight_decay},
                  {"params": [p for _, p in no_decay], "weight_decay": 0.0}]
        fused = self.cfg.fused_adamw
        opt = AdamW(groups, lr=self.cfg.lr, foreach=not fused, fused=fused)
        ordered = decay + no_decay
        return [p for _, p in ordered], [n for n, _ in ordered], opt

    def rebuild_optimizer(self) -> None:
        """A fresh AdamW (no moments) over the parameters trainable now: LP-FT stage 2, the SWA phase."""
        self.params, self.param_names, self.optimizer = self._build_optimizer()

    @property
    def total_epochs(self) -> int:
        """Epochs of the training loop: LP-FT's heads-only epochs, then ``epochs`` of fine-tuning."""
        return self.cfg.lp_epochs + self.cfg.epochs

    # -- learning rate --
    def lr_at(self, epoch: int, step: int, steps_per_epoch: int) -> float:
        """The learning rate of plan(epoch)[step] under ``lr_schedule``, run within epoch's LP-FT stage."""
        cfg = self.cfg
        first, n_epochs, peak = lpft.stage_span(cfg, epoch)
        epoch -= first
        if cfg.lr_schedule == "constant":
            return peak
        if cfg.lr_schedule == "epoch_decay":
            return peak - cfg.lr_decay * epoch
        total = n_epochs * steps_per_epoch
        t = epoch * steps_per_epoch + step
        warm = round(cfg.warmup * total)
        if t < warm:
            return peak * (t + 1) / warm
        return peak * (total - t) / max(total - warm, 1)

    # -- one step --
    def step_loss(self, stream: str, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(weighted total loss, unweighted named terms) of one batch of ``stream``."""
        applying = [o for o in self.objectives if o.applies_to(stream)]
        terms: dict[str, torch.Tensor] = {}
        total: torch.Tensor | float = 0.0
        out = None
        with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.bfloat16,
                            enabled=self.amp_dtype is not None):
            if stream != NLI:
                fns = [o.transform_for(stream, True) for o in applying if hasattr(o, "transform_for")]
                out = self.model(stream, batch, transform=_compose([f for f in fns if f is not None]))
                head = self.model.task_loss(stream, out, batch)
                terms[f"{stream}/loss"] = head
                total = math.prod(o.task_loss_scale for o in applying) * head
            for o in applying:
                for name, value in o(self.model, stream, batch, out).items():
                    terms[f"{stream}/{o.name}.{name}"] = value
                    total = total + o.weight * value
        if not isinstance(total, torch.Tensor):
            raise RuntimeError(f"the {stream} batch produced no loss term (objectives here: "
                               f"{[o.name for o in applying]})")
        return self.weights.get(stream) * total, terms

    def train_step(self, stream: str, batch: dict | None, lr: float, share: float = 1) -> dict[str, torch.Tensor]:
        """One optimizer step on one batch; returns the detached terms plus the weighted total "loss".

        Under torchrun ``batch`` is this rank's shard of the global batch (None
        when the shard is empty: a partial last batch smaller than the world)
        and ``share`` its fraction of the global batch. The loss is scaled by
        share × world before backward, so the gradients averaged over the ranks
        (``distributed.all_reduce_gradients``) are those of the global batch's
        mean loss; clipping then acts on the averaged gradients, the same on every rank.
        """
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        detached: dict[str, torch.Tensor] = {}
        if batch is not None:
            loss, terms = self.step_loss(stream, batch)
            scale = share * self.world_size
            (loss if scale == 1 else loss * scale).backward()
            detached = {k: v.detach().float() for k, v in terms.items()}
            detached["loss"] = loss.detach().float()
        distributed.all_reduce_gradients(self.params)
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        for o in self.objectives:
            o.on_step_end(self.model)
        return detached

    def batches(self, plan: Sequence[tuple[str, list[int]]], start: int = 0
                ) -> Iterator[tuple[str, dict | None, float]]:
        """(stream, batch on the device, share) for each step of ``plan[start:]``.

        One process: the whole batch, share 1. Under torchrun: this rank's
        shard ``indices[rank::world]`` (None when empty) and its fraction of
        the global batch. On CUDA the next step's batch is collated and pinned
        in a background thread while this one trains (collate draws no random
        numbers, so the order of work does not matter), then copied with
        non_blocking=True; on CPU the thread would only compete with the
        compute threads, so batches are collated in line (``prefetch``
        overrides the choice).
        """
        cuda = self.device.type == "cuda"
        prefetch = cuda if self.prefetch is None else self.prefetch

        def load(k: int) -> tuple[str, dict | None, float]:
            stream, indices = plan[k]
            mine = distributed.shard(indices) if self.world_size > 1 else indices
            if not mine:
                return stream, None, 0.0
            batch = self.train_sets[stream].collate(mine)
            if cuda:
                batch = {n: v.pin_memory() if isinstance(v, torch.Tensor) else v for n, v in batch.items()}
            return stream, batch, (len(mine) / len(indices) if self.world_size > 1 else 1)

        def on_device(item: tuple[str, dict | None, float]) -> tuple[str, dict | None, float]:
            stream, batch, share = item
            return stream, (move_batch(batch, self.device) if batch is not None else None), share

        if not prefetch:
            for k in range(start, len(plan)):
                yield on_device(load(k))
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="collate") as pool:
            pending = pool.submit(load, start) if start < len(plan) else None
            for k in range(start, len(plan)):
                item = pending.result()
                pending = pool.submit(load, k + 1) if k + 1 < len(plan) else None
                yield on_device(item)

    # -- the loop --
    def fit(self) -> dict:
        """Train from the current position to ``epochs``; returns a summary (best epoch, its dev metrics)."""
        for h in self.hooks:
            h.on_train_start(self)
        if self._rng_to_restore is not None:
            set_rng_state(self._rng_to_restore)  # last: nothing after it may draw from the global RNGs
            self._rng_to_restore = None
        lpft.train_mode(self.model, self.stage)
        if self.epoch >= self.total_epochs:
            logger.info("nothing to train: the checkpoint is at epoch %d of %d", self.epoch, self.total_epochs)
        elif self.stage == lpft.LP:
            logger.info("LP-FT stage 1: heads only for epochs %d-%d (encoder frozen, %d trainable tensors), then "
                        "%d epochs of full fine-tuning", self.epoch + 1, self.cfg.lp_epochs, len(self.params),
                        self.cfg.epochs)
        with _logging_redirect():
            while self.epoch < self.total_epochs:
                self._train_epoch()
        for h in self.hooks:
            h.on_train_end(self)
        return {"best": self.best, "epochs": self.epoch, "global_step": self.global_step}

    def _train_epoch(self) -> None:
        cfg = self.cfg
        plan = self.schedule.epoch_plan(self.epoch)
        n = len(plan)
        t_epoch = time.perf_counter()
        window: dict[str, torch.Tensor] = {}
        window_counts: dict[str, float] = {}
        window_seqs, t_window = 0, time.perf_counter()
        bar = tqdm(total=n, initial=self.step, desc=f"epoch {self.epoch + 1}/{self.total_epochs}", dynamic_ncols=True,
                   disable=not sys.stderr.isatty() or self.rank > 0, leave=False)
        lr = self.lr_at(self.epoch, self.step, n)
        try:
            for stream, batch, share in self.batches(plan, self.step):
                lr = self.lr_at(self.epoch, self.step, n)
                terms = self.train_step(stream, batch, lr, share)
                _accumulate(self.epoch_sums, self.epoch_counts, terms, share)
                _accumulate(window, window_counts, terms, share)
                window_seqs += _sequences(batch)
                self.step += 1
                self.global_step += 1
                bar.update(1)
                if self.global_step % cfg.log_every == 0:
                    now = time.perf_counter()
                    means = _means(window, window_counts)  # the one device sync per log_every steps
                    seqs = distributed.sum_over_ranks({"seqs": window_seqs})["seqs"]
                    logger.info("epoch %d/%d step %d/%d | lr %.2e | %s | %.1f seq/s", self.epoch + 1, self.total_epochs,
                                self.step, n, lr, " | ".join(f"{k} {v:.4f}" for k, v in means.items()),
                                seqs / max(now - t_window, 1e-9))
                    bar.set_postfix(loss=f"{means['loss']:.4f}")
                    window, window_counts, window_seqs, t_window = {}, {}, 0, now
                if cfg.checkpoint_every and self.global_step % cfg.checkpoint_every == 0 and self.step < n:
                    self.save_checkpoint("last")
                for h in self.hooks:
                    h.on_step_end(self)
        finally:
            bar.close()
        train_time = time.perf_counter() - t_epoch
        self._end_epoch(lr, train_time)

    def _end_epoch(self, lr: float, train_time: float) -> None:
        t0 = time.perf_counter()
        means = _means(self.epoch_sums, self.epoch_counts)
        metrics: dict[str, float] = {}
        if self.rank == 0:  # the other ranks wait for rank 0's scores (one process evaluates: simple, and cheap
            # next to an epoch of training with the capped dev sets)
            metrics, _ = evaluate(eval_model(self.model, self.objectives, self.cfg.tasks), self.dev_sets,
                                  batch_size=self.cfg.eval_batch_size, device=self.device,
                                  autocast_dtype=self.amp_dtype)
        metrics = distributed.broadcast_from_main(metrics)
        eval_time = time.perf_counter() - t0
        score = metrics.get("overall", math.nan)
        # The first epoch is the best so far even with an undefined score (a constant STS prediction has no r).
        improved = self.best is None or (math.isfinite(score) and (self.best["score"] is None
                                                                    or score > self.best["score"]))
        self.elapsed += train_time + eval_time
        record = {"epoch": self.epoch + 1, "stage": self.stage, "global_step": self.global_step, "lr": lr,
                  "train": means,
                  "dev": _jsonable(metrics), "dev_examples": {t: len(d) for t, d in self.dev_sets.items()},
                  "train_time_s": round(train_time, 2), "eval_time_s": round(eval_time, 2),
                  "elapsed_s": round(self.elapsed, 2), "best": improved}
        self.history.append(record)
        logger.info("epoch %d done in %.0f s (+%.0f s dev): %s | dev %s%s", self.epoch + 1, train_time, eval_time,
                    " ".join(f"{k} {v:.4f}" for k, v in means.items()),
                    " ".join(f"{k} {v:.4f}" for k, v in metrics.items()), " (best so far)" if improved else "")
        if improved:
            self.best = {"score": score if math.isfinite(score) else None, "epoch": self.epoch + 1,
                         "stage": self.stage, "dev": _jsonable(metrics)}
        self.epoch += 1
        self.step = 0
        self.epoch_sums, self.epoch_counts = {}, {}
        if self.epoch < self.total_epochs and lpft.stage_at(self.cfg, self.epoch) != self.stage:
            self._enter_stage(lpft.stage_at(self.cfg, self.epoch))  # before the checkpoint: it saves the new optimizer
        self.save_checkpoint("last")
        if self.rank == 0:
            if improved:
                link_or_copy_directory(self.ckpt_root / "last", self.ckpt_root / "best")
            with open(self.metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, allow_nan=False) + "\n")
            from tasks.plots import plot_history  # matplotlib loads only when a run reaches its first plot

            plot_history(self.history, self.out_dir / "training.png")
        for h in self.hooks:
            h.on_epoch_end(self, record)

    def _enter_stage(self, stage: str) -> None:
        """LP-FT stage switch at an epoch boundary: (un)freeze the encoder, then a fresh optimizer."""
        lpft.set_stage(self.model, stage)
        self.stage = stage
        self.rebuild_optimizer()
        logger.info("LP-FT stage 2 from epoch %d: full fine-tuning of %d tensors with a fresh optimizer",
                    self.epoch + 1, len(self.params))

    # -- checkpoints --
    def state(self) -> dict:
        """state.json: the position, best score, history and RNG states (JSON values only).

        Under torchrun every rank must call it (it gathers): the loss sums are
        those of all ranks, "rng" is rank 0's state and "rng_other_ranks" the others'.
        """
        sums = _host_sums(self.epoch_sums, self.epoch_counts)
        rngs = distributed.gather(rng_state())
        return {"format": CHECKPOINT_FORMAT, "epoch": self.epoch, "step": self.step, "global_step": self.global_step,
                "best": self.best, "history": self.history, "elapsed_s": self.elapsed,
                "epoch_sums": {k: [s, c] for k, (s, c) in sums.items()},
                "rng": rngs[0], **({"rng_other_ranks": rngs[1:]} if len(rngs) > 1 else {})}

    def save_checkpoint(self, name: str = "last", extra_state: dict | None = None) -> Path:
        """Write checkpoint ``name`` atomically under ``<out_dir>/checkpoints/`` (layout: tasks/checkpoint.py).

        ``extra_state`` is merged into state.json (the SWA checkpoint marks itself with "swa").
        Under torchrun every rank calls it and rank 0 writes (the ranks' weights are identical).
        """
        final = self.ckpt_root / name
        state = {**self.state(), **(extra_state or {})}
        if self.rank > 0:
            return final
        with atomic_directory(final) as tmp:
            save_tensors(tmp / "model.safetensors", self.model.state_dict())
            obj_state = objectives_state(self.objectives, self.model)
            if obj_state:
                save_tensors(tmp / "objectives.safetensors", obj_state)
            tensors, meta = optimizer_state(self.optimizer, self.param_names)
            save_tensors(tmp / "optimizer.safetensors", tensors)
            write_json(tmp / "optimizer.json", meta)
            write_json(tmp / "state.json", state)
            write_json(tmp / "config.json", self.cfg.to_dict())
            save_encoder_files(tmp / "encoder", self.model.encoder.config, self.encoder_dir)
        return final

    def _load_checkpoint(self, ckpt: Path) -> None:
        if "swa" in read_json(ckpt / "state.json"):
            raise ValueError(f"{ckpt} holds SWA-averaged weights, not a training position: evaluate it with "
                             "--eval-only, or resume checkpoints/last (with --swa-epochs to redo the SWA phase)")
        self.model.load_state_dict(load_tensors(ckpt / "model.safetensors", self.device))
        load_objectives_state(self.objectives, self.model, ckpt, self.device)
        load_optimizer_state(self.optimizer, load_tensors(ckpt / "optimizer.safetensors", self.device),
                             read_json(ckpt / "optimizer.json"), self.param_names)
        state = read_json(ckpt / "state.json")
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{ckpt}: checkpoint format {state.get('format')} is not {CHECKPOINT_FORMAT}")
        self.epoch, self.step, self.global_step = state["epoch"], state["step"], state["global_step"]
        self.best, self.history, self.elapsed = state["best"], state["history"], state["elapsed_s"]
        # The saved sums are over all ranks: rank 0 carries them on, the others start from zero.
        saved_sums = state["epoch_sums"] if self.rank == 0 else {}
        self.epoch_sums = {k: torch.tensor(v, dtype=torch.float32, device=self.device)
                           for k, (v, _) in saved_sums.items()}
        self.epoch_counts = {k: c for k, (_, c) in saved_sums.items()}
        self._rng_to_restore = self._rank_rng(state)
        if self.rank == 0:
            # metrics.jsonl continues from the checkpoint: records of epochs after it are dropped.
            with open(self.metrics_path, "w", encoding="utf-8") as f:
                for record in self.history:
                    f.write(json.dumps(record, allow_nan=False) + "\n")
        logger.info("resumed from %s at epoch %d step %d (global step %d)", ckpt, self.epoch + 1, self.step,
                    self.global_step)

    def _rank_rng(self, state: dict) -> dict:
        """The RNG state this rank resumes from: its own when the checkpoint has one, else a fresh seeded one."""
        others = state.get("rng_other_ranks", [])
        if self.rank == 0:
            return state["rng"]
        if len(others) == self.world_size - 1:
            return others[self.rank - 1]
        logger.warning("rank %d: the checkpoint holds the RNG states of %d process(es), this run has %d: this rank "
                       "draws fresh dropout masks, so the run will not repeat the interrupted one bit for bit",
                       self.rank, len(others) + 1, self.world_size)
        seed_everything(distributed.rank_seed(self.cfg.seed, self.rank, state["global_step"]))
        return rng_state()

    # -- after training --
    def load_best(self) -> Path:
        """Load the best checkpoint's model and objectives weights into the live model."""
        distributed.barrier()  # under torchrun: rank 0 has finished writing it
        best = resolve_checkpoint(self.ckpt_root / "best")
        self.model.load_state_dict(load_tensors(best / "model.safetensors", self.device))
        load_objectives_state(self.objectives, self.model, best, self.device)
        return best


def _accumulate(sums: dict[str, torch.Tensor], counts: dict[str, float], terms: dict[str, torch.Tensor],
                share: float = 1) -> None:
    """Add one step's terms to running sums on the device (no sync).

    ``share`` is this rank's fraction of the global batch (1 in one process):
    terms and counts are weighted by it, so that sums and counts added over
    the ranks give the means of the global batches.
    """
    for k, v in terms.items():
        if share != 1:
            v = v * share
        sums[k] = sums[k] + v if k in sums else v
        counts[k] = counts.get(k, 0) + share


def _host_sums(sums: dict[str, torch.Tensor], counts: dict[str, float]) -> dict[str, tuple[float, float]]:
    """{term: (sum, count)} on the host: one stack, one transfer; under torchrun added over the ranks (collective)."""
    keys = list(sums)
    values = torch.stack([sums[k] for k in keys]).tolist() if keys else []
    local = {k: (v, counts[k]) for k, v in zip(keys, values)}
    if not distributed.is_distributed():
        return local
    total: dict[str, tuple[float, float]] = {}
    for part in distributed.gather(local):
        for k, (v, c) in part.items():
            s0, c0 = total.get(k, (0.0, 0))
            total[k] = (s0 + v, c0 + c)
    return total


def _means(sums: dict[str, torch.Tensor], counts: dict[str, float]) -> dict[str, float]:
    """Means of accumulated device tensors (over all ranks under torchrun). Non-finite losses stop the run."""
    totals = _host_sums(sums, counts)
    if not totals:
        return {}
    keys = sorted(totals, key=lambda k: (k != "loss", k))
    means = {k: totals[k][0] / totals[k][1] for k in keys}
    bad = [k for k, v in means.items() if not math.isfinite(v)]
    if bad:
        raise FloatingPointError(f"non-finite training loss in {bad}: lower --lr, enable --grad-clip, or check the data")
    return means


@contextlib.contextmanager
def _logging_redirect():
    """Route log lines through tqdm.write while a progress bar may be on screen (terminal only)."""
    if sys.stderr.isatty():
        from tqdm.contrib.logging import logging_redirect_tqdm

        with logging_redirect_tqdm():
            yield
    else:
        yield


def _storages(module: nn.Module) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}


def objectives_state(objectives: Sequence[Objective], model: nn.Module) -> dict[str, torch.Tensor]:
    """Objectives' own tensors (queues, momentum encoders) keyed "<name>.<key>".

    Tensors that live in the model (an objective holding a reference to the
    encoder) are left out: model.safetensors has them.
    """
    shared = _storages(model)
    out: dict[str, torch.Tensor] = {}
    for o in objectives:
        for k, v in o.state_dict(keep_vars=True).items():
            if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() not in shared:
                out[f"{o.name}.{k}"] = v.detach()
    return out


def load_objectives_state(objectives: Sequence[Objective], model: nn.Module, ckpt: Path,
                          device: torch.device) -> None:
    """Inverse of ``objectives_state``. Missing tensors (other than the model's own) and extra ones are errors."""
    path = ckpt / "objectives.safetensors"
    saved = load_tensors(path, device) if path.is_file() else {}
    names = {o.name for o in objectives}
    stray = sorted(k for k in saved if k.split(".", 1)[0] not in names)
    if stray:
        raise ValueError(f"{ckpt}: objectives.safetensors holds state of objectives this config does not use: "
                         f"{stray[:5]}")
    shared = _storages(model)
    for o in objectives:
        mine = {k[len(o.name) + 1:]: v for k, v in saved.items() if k.startswith(o.name + ".")}
        result = o.load_state_dict(mine, strict=False)  # not strict: tensors of the model are not in the file
        in_model = {k for k, v in o.state_dict(keep_vars=True).items()
                    if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() in shared}
        missing = sorted(set(result.missing_keys) - in_model)
        if missing or result.unexpected_keys:
            raise ValueError(f"{ckpt}: objective {o.name!r} state does not match: missing {missing[:5]}, "
                             f"unexpected {sorted(result.unexpected_keys)[:5]}")


def save_encoder_files(directory: Path, config: BertConfig, source_dir: Path) -> None:
    """The encoder's BertConfig and tokenizer files: enough to rebuild both without the pretrained directory."""
    directory.mkdir(parents=True, exist_ok=True)
    config.to_json_file(directory / "config.json")
    for name in ("vocab.txt", "tokenizer_config.json"):
        if (source_dir / name).is_file():
            shutil.copyfile(source_dir / name, directory / name)


def check_resume_config(saved: TrainConfig, cfg: TrainConfig) -> None:
    """A resumed run must be the same run: only RESUME_MUTABLE fields may differ."""
    a, b = saved.to_dict(), cfg.to_dict()
    changed = sorted(k for k in a if a[k] != b.get(k) and k not in RESUME_MUTABLE)
    if changed:
        details = "; ".join(f"{k}: checkpoint {a[k]!r}, now {b[k]!r}" for k in changed)
        raise ValueError(f"cannot resume with a different configuration ({details}); only "
                         f"{', '.join(RESUME_MUTABLE)} may change")
    if a["epochs"] != b["epochs"] and cfg.lr_schedule == "warmup_linear":
        raise ValueError("epochs cannot change on resume with lr_schedule warmup_linear: the decay is spread over "
                         "all steps, so the steps already taken would have had other learning rates")


# ---- predictions ------------------------------------------------------------------------------------------------


class KNNInference:
    """KNN-BERT inference (../shared/papers/knn-bert.txt §3.1, eq. 1) at the final evaluation.

    For each task the knn_bert objective trains (SST, paraphrase): the whole
    training file's representations under the final model (``representation``
    of the objective) are stored once, then every evaluated example gets
    s = (1 − φ)·softmax(F(q)) + φ·KNN(q) with its K cosine-nearest training
    examples (``knn_k``, ``knn_phi``), and the KNN vote alone (φ = 1). The
    same computation as ``KNNBert.knn_predict``, with the training
    representations computed once for every split and both φ. Cost: one
    forward pass over the training sets (all of Quora's on a full run) plus
    one more over each scored set.
    """

    def __init__(self, objective: Objective, model: MultitaskBert, tasks: Sequence[str],
                 train_set: Callable[[str], Any], batch_size: int, device: torch.device) -> None:
        self.config = objective.config
        self.model, self.train_set, self.batch_size, self.device = model, train_set, batch_size, device
        self.tasks = [t for t in tasks if t in KNN_CLASSES and objective.applies_to(t)]
        self.classifiers: dict[str, Any] = {}

    @classmethod
    def of(cls, objectives: Sequence[Objective], *args: Any) -> KNNInference | None:
        """The inference of the run's knn_bert objective, or None when the run has none."""
        found = [o for o in objectives if o.name == "knn_bert"]
        return cls(found[0], *args) if found else None

    def _features(self, task: str, dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return compute_representations(self.model, task, dataset, self.config.representation, self.batch_size,
                                       self.device)

    def probabilities(self, task: str, dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(eq. 1 probabilities at φ = knn_phi, KNN vote only (φ = 1)), each (N, C), in dataset order."""
        if task not in self.classifiers:
            t0 = time.perf_counter()
            train = self.train_set(task)
            feats, _ = self._features(task, train)
            self.classifiers[task] = KNNClassifier(self.config.knn_k, KNN_CLASSES[task]).fit(feats, train.labels)
            logger.info("KNN-BERT: %d %s training representations in %.0f s", len(train), task,
                        time.perf_counter() - t0)
        knn = self.classifiers[task]
        queries, logits = self._features(task, dataset)
        probs = class_probabilities(task, logits)
        return knn.predict_proba(queries, probs, self.config.knn_phi), knn.predict_proba(queries, probs, 1.0)

    def score(self, split: str, datasets: dict[str, Any], preds: dict[str, Predictions], metrics: dict[str, float]
              ) -> tuple[dict[str, Predictions], dict[str, Any]]:
        """(leaderboard predictions, KNN metrics) of one split.

        The leaderboard files take the eq. 1 prediction when knn_phi > 0 (their
        logits files keep the classifier's raw outputs). Metrics are the plain
        ones with each KNN task's score replaced, overall recomputed.
        """
        phi = self.config.knn_phi
        combined_metrics, vote_metrics = dict(metrics), dict(metrics)
        leaderboard = dict(preds)
        for task in [t for t in self.tasks if t in datasets]:
            labels = getattr(datasets[task], "labels", None)
            if labels is None and phi == 0:
                continue  # unlabeled (test) and the classifier's prediction stands: nothing to compute
            combined, vote = self.probabilities(task, datasets[task])
            if phi > 0:
                p = preds[task]
                leaderboard[task] = Predictions(p.ids, p.logits, combined.argmax(-1))
            if labels is not None:
                combined_metrics[TASK_METRIC[task]] = score(task, combined.argmax(-1), labels)
                vote_metrics[TASK_METRIC[task]] = score(task, vote.argmax(-1), labels)
        if not metrics:
            return leaderboard, {}
        for m in (combined_metrics, vote_metrics):
            m["overall"] = overall_score(m)
        logger.info("%s KNN-BERT (k %d, phi %g): %s | KNN vote only (phi 1): %s", split, self.config.knn_k, phi,
                    " ".join(f"{k} {v:.4f}" for k, v in combined_metrics.items()),
                    " ".join(f"{k} {v:.4f}" for k, v in vote_metrics.items()))
        return leaderboard, {split: _jsonable(combined_metrics), f"{split}_knn_only": _jsonable(vote_metrics)}


def write_all_predictions(model: MultitaskBert, objectives: Sequence[Objective], tokenizer: Any, cfg: TrainConfig,
                          pred_dir: Path, device: torch.device, amp_dtype: torch.dtype | None,
                          train_sets: dict[str, Any] | None = None) -> dict:
    """Full dev metrics, and dev + test prediction and logit files for every task of ``cfg``.

    A missing test file (there is no quora-test-student.csv in the shared data)
    is skipped with a message. With ``cfg.predict_train`` the whole training
    file of each task (no per-epoch caps) is predicted too: its logits go to
    ``{task}-train-logits.csv`` (distillation teachers, tasks/objectives/distill.py;
    no leaderboard file) and its metrics to "train". With the knn_bert
    objective, ``KNNInference`` scores dev under "knn" (at knn_phi and φ = 1)
    and, when knn_phi > 0, the SST / paraphrase leaderboard files hold its
    eq. 1 prediction. ``train_sets`` (a trainer's tokenized training sets)
    saves reading them again. Returns {"dev": metrics, "files": [paths],
    "skipped": [...]} plus "train" and "knn" when computed.
    """
    view = eval_model(model, objectives, cfg.tasks)
    train_sets = dict(train_sets or {})

    def train_set(task: str) -> Any:
        if task not in train_sets:
            examples = _load(task, "train", cfg)
            if examples is None:
                raise FileNotFoundError(f"{task} train: no input file in {cfg.data_dir}; --predict-train and "
                                        "KNN-BERT inference need the training data")
            train_sets[task] = make_dataset(task, examples, tokenizer, cfg)
        return train_sets[task]

    knn = KNNInference.of(objectives, model, cfg.tasks, train_set, cfg.eval_batch_size, device)
    files: list[str] = []
    skipped: list[str] = []
    result: dict[str, Any] = {}
    for split in ("dev", "test") + (("train",) if cfg.predict_train else ()):
        datasets = {}
        for task in cfg.tasks:
            if split == "train":
                datasets[task] = train_set(task)
                continue
            examples = _load(task, split, cfg)
            if examples is not None and split == "dev" and cfg.final_dev == "capped":
                examples = capped_dev(task, examples, cfg)
            if examples is None:
                msg = f"{task} {split}: no input file in {cfg.data_dir}; its predictions are skipped"
                logger.warning(msg)
                skipped.append(msg)
                continue
            datasets[task] = make_dataset(task, examples, tokenizer, cfg)
        t0 = time.perf_counter()
        metrics, preds = evaluate(view, datasets, batch_size=cfg.eval_batch_size, device=device,
                                  autocast_dtype=amp_dtype)
        logger.info("%s predictions for %s in %.0f s%s", split, ", ".join(preds), time.perf_counter() - t0,
                    (": " + " ".join(f"{k} {v:.4f}" for k, v in metrics.items())) if metrics else "")
        leaderboard = preds
        if knn is not None and split != "train":  # a training example is its own nearest neighbour
            leaderboard, knn_metrics = knn.score(split, datasets, preds, metrics)
            if knn_metrics:
                result.setdefault("knn", {"k": knn.config.knn_k, "phi": knn.config.knn_phi,
                                          "leaderboard": "knn" if knn.config.knn_phi > 0 else "classifier"})
                result["knn"].update(knn_metrics)
        for task, p in preds.items():
            if split != "train":
                files.append(str(write_predictions(pred_dir, task, split, leaderboard[task])))
            files.append(str(write_logits(pred_dir, task, split, p)))
        if split in ("dev", "train"):
            result[split] = _jsonable(metrics)
    result["files"] = files
    result["skipped"] = skipped
    return result


def run(cfg: TrainConfig, *, resume_from: str | os.PathLike | None = None, overwrite: bool = False,
        hooks: Sequence[Hook] = ()) -> dict:
    """Train, keep the best checkpoint (or SWA's average, when it scores higher), write predictions.

    Returns the final summary, also appended to metrics.jsonl. Under torchrun
    every rank trains (and runs SWA); the ranks other than 0 then return a short
    summary and rank 0 writes the predictions.
    """
    t0 = time.perf_counter()
    trainer = Trainer(cfg, hooks=hooks, resume_from=resume_from, overwrite=overwrite)
    summary = trainer.fit()
    source = trainer.load_best()
    logger.info("best epoch %s (dev overall %s)", summary["best"]["epoch"], summary["best"]["score"])
    swa = None
    if cfg.swa_epochs:
        from tasks.swa import run_swa  # tasks.swa builds on this module

        swa = run_swa(trainer)  # leaves in the model what predicts: the SWA average when it scored higher
        source = Path(swa["checkpoint"]) if swa["used"] else source
    if trainer.rank > 0:  # under torchrun rank 0 alone writes the predictions
        return {"final": True, "rank": trainer.rank, "best_epoch": summary["best"]["epoch"],
                "predictions_from": str(source)}
    logger.info("writing predictions from %s", source)
    final = write_all_predictions(trainer.model, trainer.objectives, trainer.tokenizer, cfg,
                                  trainer.out_dir / "predictions", trainer.device, trainer.amp_dtype,
                                  train_sets=trainer.train_sets)
    record = {"final": True, "best_epoch": summary["best"]["epoch"], "predictions_from": str(source),
              "dev": final["dev"], **{k: final[k] for k in ("train", "knn") if k in final},
              **({"swa": swa} if swa else {}),
              "process_time_s": round(time.perf_counter() - t0, 1), "predictions": final["files"],
              "skipped": final["skipped"]}
    with open(trainer.metrics_path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, allow_nan=False) + "\n")
    logger.info("final dev (%s): %s | %.0f s in this process",
                "full sets" if cfg.final_dev == "full" else "capped subsets",
                " ".join(f"{k} {v:.4f}" for k, v in final["dev"].items() if v is not None), record["process_time_s"])
    return record


def load_checkpoint_model(path: str | os.PathLike, device: torch.device | str = "cpu"
                          ) -> tuple[MultitaskBert, list[Objective], BertTokenizer, TrainConfig]:
    """Rebuild (model, objectives, tokenizer, config) from a checkpoint directory alone."""
    ckpt = resolve_checkpoint(path)
    cfg = TrainConfig.from_dict(read_json(ckpt / "config.json"))
    enc_dir = ckpt / "encoder"
    encoder = BertModel(BertConfig.from_json_file(enc_dir / "config.json"))
    tokenizer = BertTokenizer.from_pretrained(enc_dir)
    model = MultitaskBert(encoder, cfg.model)
    model.load_state_dict(load_tensors(ckpt / "model.safetensors"))
    model.to(device)
    objectives = build_objectives(cfg.objectives, model)
    for o in objectives:
        o.to(device)
    load_objectives_state(objectives, model, ckpt, torch.device(device))
    return model, objectives, tokenizer, cfg


def evaluate_checkpoint(path: str | os.PathLike, *, out_dir: str | os.PathLike | None = None,
                        overrides: dict[str, Any] | None = None) -> dict:
    """--eval-only: dev metrics and dev + test predictions of a saved model.

    ``overrides`` may set data_dir, device, bf16, eval_batch_size, limit,
    max_length, predict_train, final_dev, dev_max_examples or tasks (a subset
    of the trained tasks) of the saved config, and ``objectives`` options that
    act at inference (knn_bert's knn_k and knn_phi, match_tuning's inference): an objective whose options differ from the saved ones
    gets a new Config (checked as at training).
    Files go to ``<out_dir>/predictions`` (default: the run directory holding the checkpoint).
    """
    if distributed.env()[1] > 1:
        raise ValueError("evaluation runs in one process: start --eval-only with python, not torchrun")
    ckpt = resolve_checkpoint(path)
    saved = TrainConfig.from_dict(read_json(ckpt / "config.json"))
    cfg = dataclasses.replace(saved, **(overrides or {}))
    extra = sorted(set(cfg.tasks) - set(saved.tasks))
    if extra:
        raise ValueError(f"the checkpoint was trained on {list(saved.tasks)}, not {extra}")
    device = resolve_device(cfg.device)
    amp = autocast_dtype(cfg.bf16, device)
    model, objectives, tokenizer, _ = load_checkpoint_model(ckpt, device)
    for o in objectives:
        changed = cfg.objectives.get(o.name)
        if changed is not None and changed != saved.objectives.get(o.name):
            o.config = type(o.config)(**{**dataclasses.asdict(o.config), **changed})
    if out_dir is None:
        # runs/<name>/checkpoints/best -> runs/<name>; a checkpoint copied elsewhere -> its saved out_dir
        out_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else saved.out_dir
    run_dir = Path(out_dir)
    result = write_all_predictions(model, objectives, tokenizer, cfg, run_dir / "predictions", device, amp)
    result["checkpoint"] = str(ckpt)
    return result
