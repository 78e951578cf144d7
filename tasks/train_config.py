"""TrainConfig: every setting of a training run, and all of its validation, in one place.

Usage:
    cfg = TrainConfig(out_dir="runs/try", epochs=2)
    cfg.validate()                                   # ValueError with a sentence saying why
    cfg = TrainConfig.from_dict(read_json(path))     # config.json of a run or checkpoint
    check_resume_config(saved, cfg)                  # --resume: only RESUME_MUTABLE fields may change
    cfg = eval_config(saved, {"tasks": ("sst",)})    # --eval-only: only eval_mutable() fields may change

Every field carries its help text (``tasks.options.option``); the train command
(tasks/arguments.py, through tasks.options) turns each field into a flag with that help and the default
written here. ``apply_preset`` (PRESETS, at the bottom of this module) fills
the fields with the paper's configurations, or changes the defaults into a
recipe of ours (quick).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.config_versions import CONFIG_VERSION, VERSION_KEY, software_versions, upgrade
from tasks.data.schedule import SCHEDULES, SUBSETS
from tasks.model import NLI, PHRASES, ModelConfig
from tasks.objectives import objective_config, objective_values, recorded_modules, registered_objectives
from tasks.options import (REMOVED, AnyKey, given_flag, json_value, nested_config, option, replace_at,
                           spelled_flag, value_at)
from tasks.run_tasks import RunTasks
from tasks.task import GLUE, MULTITASK, PACKAGE, Task, Tasks, get_task, model_tasks, with_triplets
from tasks.task_file import check_unchanged, read_declaration
from minbert.config import DROPOUT_MASKS
from tasks.runtime import check_device_string

LR_SCHEDULES = ("constant", "epoch_decay", "warmup_linear")


FINAL_DEV = ("full", "capped")


PHRASE_ORDERS = ("mixed", "first")


REPORTERS = ("tensorboard",)  # --report-to (tasks/training/tensorboard.py)


MODEL_TYPE = "minbert-multitask"  # config.json's marker: HF's Auto classes refuse it (see TrainConfig.to_dict)


OBJECTIVE_VERSIONS = "objective_versions"  # config.json: each objective's version of its options, as it wrote them


# Config fields that may change when a run is resumed: none of them changes the
# arithmetic of the steps already taken or the batches still to come.
# SWA and train-set predictions come after the training steps, so they may change too
# (resuming a finished run with --swa-epochs adds the SWA phase to it).
RESUME_MUTABLE = ("epochs", "device", "threads", "bf16", "fp16", "compile", "gradient_checkpointing", "log_every",
                  "checkpoint_every", "eval_batch_size", "out_dir", "data_dir", "swa.epochs", "swa.lr", "predict_train",
                  "report_to", "save_only_model", "task_files", "early_stopping_patience")


# Settings (dotted paths) --eval-only may set: they choose what to predict and where, never the model. Objectives
# add the options that act only at inference (``Objective.inference_options``), see eval_mutable().
EVAL_MUTABLE = ("data_dir", "out_dir", "device", "threads", "bf16", "fp16", "eval_batch_size", "limit", "tasks",
                "predict_train", "final_dev", "dev_max_examples", "symmetric_eval", "prior_weights", "prior_models",
                "task_files")


@dataclass
class LpftConfig:
    """LP-FT's first stage (tasks/training/stages.py): --lp-epochs, --lp-lr."""

    epochs: int = option(0, "LP-FT (paper §4.2): N epochs training only the heads (encoder frozen and in eval "
                         "mode, so no dropout; the optimizer never sees it), then --epochs of full fine-tuning "
                         "from those weights with a fresh optimizer, in one run; records carry stage lp / ft; "
                         "0 = off", group="stages", metavar="N")
    lr: float | None = option(None, "peak learning rate of LP-FT stage 1 (paper §4.2 gives none; needs "
                              "--lp-epochs); default: --lr", group="stages", metavar="LR")


@dataclass
class SwaConfig:
    """The SWA phase after training (tasks/training/stages.py): --swa-epochs, --swa-lr."""

    epochs: int = option(0, "SWA (paper §4.6: 5 epochs at lr 1e-5, PyTorch's SWA modules): after training, N "
                         "more epochs at constant --swa-lr from the best checkpoint, averaging the weights at "
                         "each epoch end (torch.optim.swa_utils.AveragedModel; LayerNorm only, so no BN "
                         "update); saved as checkpoints/swa and used for the predictions when its dev score "
                         "beats the best epoch's; 0 = off", group="stages", metavar="N")
    lr: float = option(1e-5, "constant learning rate of the SWA epochs (paper §4.6: 1e-5); needs --swa-epochs",
                       group="stages", metavar="LR")


@dataclass
class TrainConfig:
    """Everything one training run needs; saved as plain JSON (config.json) with every checkpoint.

    The defaults are the CPU recipe (README "Training"; each choice measured in
    experiments/RESULTS.md). ``apply_preset`` below gives the paper's GPU configurations.
    """

    # -- data --
    data_dir: str = option("data", "directory of the CS224N CSV files (data/README.md)", group="data", metavar="DIR")
    out_dir: str = option("runs/default", "the run directory (what it holds: README 'Training')", group="data",
                          metavar="DIR")
    tasks: tuple[str, ...] = option(MULTITASK, "tasks to train and evaluate (paper §4.1: all three): sst, para, sts, "
                                    "cfimdb (the starter's part 1) or a task of --task-file", group="data",
                                    nargs="+", metavar="TASK")
    task_files: tuple[str, ...] = option((), "declare a task of your own by a JSON file (repeatable; README 'Adding a "
                                         "task': its train/dev/test files, text and label columns; the kind and "
                                         "classes inferred from the labels); it joins --tasks. With --resume or "
                                         "--eval-only: where a run's task file now is (it must declare the task as "
                                         "it did)", group="data", flag="--task-file", repeat=True, metavar="FILE")
    user_tasks: dict[str, dict[str, Any]] = option(
        help="the tasks the task files declared, as the run read them, and the run's GLUE tasks as the package "
             "declared them (tasks.task.Task.to_dict): what a saved run predicts with, its files gone or the package "
             "changed or not; set by --task-file and --tasks", factory=dict)
    best_metric: tuple[str, ...] = option((), "what selects the best epoch (and SWA over it): the mean of these tasks' "
                                          "main metrics or of these metrics (rte_f1), each in [0, 1] (a correlation c "
                                          "as (c + 1) / 2); default: the CS224N overall, over the run's built-in "
                                          "tasks (a run of only your own tasks: over them)", group="data", nargs="+",
                                          metavar="TASK|METRIC")
    freeze_encoder: bool = option(False, "train the heads alone on a frozen encoder (in eval mode) every epoch: the "
                                  "minBERT starter's part-1 '--option pretrain' (its predictions are named "
                                  "pretrain-*; fine-tuning's finetune-*)", group="data")
    nli: bool = option(False, "add the NLI triplet stream (paper §4.2 'Additional AllNLI data': STS's nli-train.csv, "
                       "or a task file's \"triplets\"); it has no head loss, only its objectives train on it (B1: "
                       "MNR)", group="data", negatable=True)
    limit: int | None = option(None, "read at most N examples of every split of every task and NLI (smoke runs); "
                               "at least the batch size", group="data", metavar="N")
    max_length: int = option(128, "tokens per sequence, longer ones truncated (a cross-encoded pair is one sequence)",
                             group="data", metavar="T")
    max_train_examples: dict[str, int] = option(
        help="per-stream cap on training examples per epoch, chosen per --train-subsets (Quora is the largest "
             "set; all of it every epoch does not fit the CPU budget: experiments/RESULTS.md); STREAM=N or "
             "STREAM=all (the paper sees all data, §4.2; an extra stream: its declared cap, SST's phrases' 17088)",
        factory=lambda: {"para": 23000}, group="data", keys=AnyKey(), metavar="STREAM=N", spelled={
            "--sst-phrases-per-epoch": (PHRASES, "with --sst-phrases: phrases trained an epoch, the next ones of a "
                                                 "seeded shuffle of the file (as --train-subsets says; "
                                                 "default: SST's entry's, tasks/cs224n/sst.json)")})
    dev_max_examples: dict[str, int] = option(
        help="per-task cap on dev examples scored between epochs (a fixed random subset; Quora dev has 20k pairs; "
             "the final evaluation uses the whole dev set unless --final-dev capped); TASK=N or TASK=all",
        factory=lambda: {"para": 3000}, group="data", keys=AnyKey(), metavar="TASK=N")
    train_subsets: str = option("cycle", "how a capped stream's examples are chosen each epoch: fresh = a new "
                                "random subset every epoch (examples may repeat before all were seen); cycle = the "
                                "next examples of one shuffled pass, so none repeats before all were seen",
                                group="data", choices=SUBSETS)
    pair_swap: float = option(0.0, "probability that a training pair of a task without order (Quora, STS; a task "
                              "file's \"symmetric\") is shown as (b, a) instead of (a, b): order augmentation, not "
                              "in the paper; a pair with an order (RTE's premise, hypothesis) never is; 0 = off",
                              group="data", metavar="P")
    symmetric_eval: bool = option(True, "score every pair of a task without order (Quora, STS; a task file's "
                                  "\"symmetric\") as the mean of its logits for (a, b) and (b, a) at evaluation "
                                  "and prediction: a cross-encoder is not symmetric; not in the paper",
                                  group="data")
    prior_weights: dict[str, float] = option(
        help="per-task weight W of the prior its task declares (SST's probe, STS's cosine, a task file's \"prior\"), "
             "blended into its predictions at evaluation only (tasks/evaluation/priors.py): (1 - W) x the head's + W "
             "x the prior's; not in the papers; TASK=W, 0 = off; a task left out takes its declared weight",
        factory=lambda: {t.name: t.prior.weight for t in PACKAGE.values() if t.prior is not None}, group="data",
        keys=AnyKey(), metavar="TASK=W", spelled={
            "--sts-prior": ("sts", "STS score = (1 - W) x the head's + W x 5 x the cosine of a sentence encoder's "
                                   "mean-pooled embeddings (--sts-prior-model, frozen); 0 = off"),
            "--sst-prior": ("sst", "SST class probabilities = (1 - W) x the head's + W x those of a logistic "
                                   "regression on a frozen sentence encoder's embeddings of the SST training "
                                   "sentences (--sst-prior-model; fitted at the first evaluation, saved in the "
                                   "checkpoints); 0 = off")})
    prior_models: dict[str, str] = option(
        help="per-task sentence encoder of its prior (a checkpoint directory); TASK=DIR; a task left out takes its "
             "declared one, else the embedded all-MiniLM-L6-v2, whatever --pretrained is", factory=dict,
        group="data", keys=AnyKey(), metavar="TASK=DIR", spelled={
            "--sts-prior-model": ("sts", "the sentence encoder of --sts-prior, whose mean-pooled cosine scores "
                                         "similarity (default: the embedded all-MiniLM-L6-v2)"),
            "--sst-prior-model": ("sst", "the sentence encoder of --sst-prior (default: the embedded "
                                         "all-MiniLM-L6-v2)")})
    stream_files: dict[str, str | None] = option(
        help="per-stream file of an extra labelled stream a task of the run declares (a task file's \"phrases\"), "
             "trained through its task's head beside its examples; a name in --data-dir or a path; STREAM=FILE, "
             "none = off; a stream left out takes its declared file",
        factory=lambda: {t.stream.name: t.stream.file for t in PACKAGE.values() if t.stream is not None},
        group="data", keys=AnyKey(), metavar="STREAM=FILE", spelled={
            "--sst-phrases": (PHRASES, "a file of labelled SST phrases in the SST training file's format "
                                       "(data/sst-phrases-train.csv: the treebank's sub-sentence phrases of the "
                                       "training trees; a name in --data-dir or a path), trained through the SST head "
                                       "as a stream of their own beside the sentences on a run with sst (Socher et al. "
                                       "2013 train on every phrase); not in the minBERT paper; none = off")})
    stream_min_words: dict[str, int] = option(
        help="per-stream fewest words of an extra stream's examples, shorter ones left out (reported); STREAM=N; a "
             "stream left out takes its declared (1)", factory=dict, group="data", keys=AnyKey(), metavar="STREAM=N",
        spelled={"--sst-phrases-min-words": (PHRASES, "with --sst-phrases: leave out phrases of fewer words "
                                                      "(reported; default: 1)")})
    stream_orders: dict[str, str] = option(
        help="per-stream place of an extra stream's batches in an epoch: mixed = shuffled among the epoch's other "
             "batches (as --schedule says); first = each epoch trains them first, then the rest, so it ends on "
             "the task's own examples; STREAM=ORDER; a stream left out takes its declared (mixed)", factory=dict,
        group="data", keys=AnyKey(), metavar="STREAM=ORDER", choices=PHRASE_ORDERS,
        spelled={"--sst-phrases-order": (PHRASES, "with --sst-phrases: mixed (default) or first, as "
                                                  "--stream-orders says")})
    final_dev: str = option("full", "full: the final evaluation scores the whole dev sets; capped: the "
                            "--dev-max-examples subsets again (cheap sweeps, e.g. the robustness table; not for "
                            "numbers compared with the paper's)", group="data", choices=FINAL_DEV)

    # -- model --
    pretrained: str | None = option(None, "HF BERT checkpoint directory (config.json, model.safetensors or "
                                    "pytorch_model.bin, vocab.txt) or Hugging Face model NAME[@REVISION] (its cache "
                                    "first, HF_HOME; downloaded when online), e.g. google-bert/bert-base-uncased as in "
                                    "the paper §4.1; default: the embedded all-MiniLM-L6-v2", group="model",
                                    metavar="DIR|NAME")
    encoder_dropout: float | None = option(None, "dropout inside the encoder (hidden and attention probabilities), "
                                           "set in its BertConfig (paper §4.5 keeps 0.3); default: the checkpoint's "
                                           "own", group="model", metavar="P")
    dropout_masks: str = option("exact", "how a CPU draws the encoder's dropout masks from torch's serial generator: "
                                "exact = one draw an element (p exact to 2^-24); bytes = three elements a draw, p "
                                "rounded up to 1/256 (0.1 -> 0.1016), a third of the draws (other masks: other "
                                "numbers); a GPU draws its own", group="model", choices=DROPOUT_MASKS)
    freeze_layers: int | None = option(None, "train no more the encoder's embeddings and its lowest N layers (0: the "
                                       "embeddings alone; backward stops above them, and the optimizer skips them); "
                                       "none = every layer trains", group="model", metavar="N")
    model: ModelConfig = option(help="the heads (tasks/model.py)", factory=lambda: ModelConfig(
        arch="b1", pair_encoding="cross", pooling="mean", head_dropout=0.0))
    objectives: dict[str, dict[str, Any]] = option(help="objective name -> its Config overrides", factory=dict)
    objective_modules: tuple[str, ...] = option((), "load objectives from a Python file of your own (repeatable; "
                                                "README 'Adding an objective': it registers what it defines, and "
                                                "--objective NAME uses it); the run records it, and reading the run "
                                                "later (--eval-only, --resume, --config) imports it only when named "
                                                "again (--objective-module FILE: where it is now) or with "
                                                "--trust-objective-modules; MINBERT_PLUGINS=FILE[:FILE] loads files "
                                                "for every command", group="model", flag="--objective-module",
                                                repeat=True, metavar="FILE")

    # -- optimization --
    epochs: int = option(2, "training epochs (paper: 10 for ablations, 20 for the final models, §5.3)",
                         group="optimization", metavar="N")
    batch_size: int = option(32, "examples per batch in every stream (paper: 16, §4.4); under torchrun the global "
                             "batch, split evenly over the processes (a multiple of their number)",
                             group="optimization", metavar="B")
    task_batch_size: dict[str, int | None] = option(
        help="per-stream batch size overrides (not with --schedule even, whose batches are all one size, §4.2); an "
             "extra stream left out takes its declared one (SST's phrases: 64), none: --batch-size",
        factory=dict, group="optimization", keys=AnyKey(), metavar="STREAM=B", spelled={
            "--sst-phrases-batch-size": (PHRASES, "with --sst-phrases: phrases per batch (none: --batch-size; "
                                                  "default: SST's entry's); phrases are short, so a larger batch "
                                                  "trains the same phrases in fewer, fuller optimizer steps (even "
                                                  "batching keeps one size for the tasks)")})
    eval_batch_size: int = option(128, "examples per batch at evaluation", group="optimization", metavar="B")
    schedule: str = option("even", "which stream's batch comes next: sequential (the CS224N starter, the paper's "
                           "baseline §4.1), round_robin, even (§4.2 even batching: all batches shuffled together)",
                           group="optimization", choices=SCHEDULES)
    loss_weights: dict[str, float] = option(
        help="per-stream loss factors, missing = 1 (paper §4.2 loss rescaling: para=0.1); updates the preset's",
        factory=dict, group="optimization", keys=AnyKey(), metavar="STREAM=W", spelled={
            "--sst-phrases-weight": (PHRASES, "with --sst-phrases: the factor on the phrases' SST loss (default: "
                                              "1)")})
    lr: float = option(1e-4, "peak AdamW learning rate (paper: 1e-5, §4.1 and §4.5)", group="optimization",
                       metavar="LR")
    lr_schedule: str = option("warmup_linear", "constant; epoch_decay = lr - lr_decay x epoch (paper §4.5); "
                              "warmup_linear = linear warmup, then linear decay to 0 over all steps (BERT's)",
                              group="optimization", choices=LR_SCHEDULES)
    lr_decay: float = option(4e-7, "with --lr-schedule epoch_decay: subtracted from the lr each epoch "
                             "(paper: 4e-7, §4.5)", group="optimization", metavar="DECAY")
    warmup: float = option(0.1, "with --lr-schedule warmup_linear: fraction of all steps spent warming up",
                           group="optimization", metavar="FRACTION")
    weight_decay: float = option(0.01, "AdamW decoupled weight decay, never on biases or LayerNorm "
                                 "(paper §6: it did not help; presets use 0)", group="optimization", metavar="DECAY")
    layer_lr_decay: float = option(1.0, "layer-wise lr decay (not in the paper; Sun et al. 2019 §5.3, ULMFiT's "
                                   "discriminative fine-tuning): encoder layer i of L (0 = the lowest) trains at "
                                   "lr x this^(L-1-i), the embeddings at lr x this^L; 1 = one lr for all",
                                   group="optimization", metavar="FACTOR")
    reinit_layers: int = option(0, "re-initialise the top N encoder layers (and the pooler, where the heads read "
                                "it) with BERT's initialization before fine-tuning (not in the paper; Zhang et al. "
                                "2021, Revisiting few-sample BERT fine-tuning, §5); 0 = keep every pretrained layer",
                                group="optimization", metavar="N")
    head_lr_scale: float = option(1.0, "the heads (and objectives' own parameters) train at lr x this; the "
                                  "encoder at lr", group="optimization", metavar="FACTOR")
    grad_clip: float = option(1.0, "clip the global gradient norm to this, 0 = off (not in the paper)",
                              group="optimization", metavar="NORM")
    gradient_accumulation_steps: int = option(1, "N micro-batches an optimizer step: every stream's batch (--batch-size, "
                                              "--task-batch-size, the phrases') is a micro-batch, a step takes N of "
                                              "them (N x the examples, the memory of one); the learning rate "
                                              "schedule and the step counts count optimizer steps (HF's "
                                              "gradient_accumulation_steps)", group="optimization", metavar="N")
    early_stopping_patience: int = option(0, "stop training once the dev overall that chooses the best epoch has "
                                          "not improved for N scored epochs (HF's EarlyStoppingCallback); the best "
                                          "epoch then predicts; 0 = off", group="optimization", metavar="N")
    seed: int = option(0, "seed of python, numpy and torch and of the batch order", group="optimization",
                       metavar="SEED")

    # -- stages and post-training (tasks/training/stages.py) --
    lpft: LpftConfig = option(help="LP-FT's first stage (tasks/training/stages.py)", factory=LpftConfig, prefix="lp_")
    swa: SwaConfig = option(help="the SWA phase (tasks/training/stages.py)", factory=SwaConfig, prefix="swa_")
    predict_train: bool = option(False, "also write predictions/{task}-train-logits.csv on the whole training sets: "
                                 "the soft targets that --distill-teachers reads (paper §4.6 knowledge "
                                 "distillation); with --eval-only, from a saved model", group="stages")

    # -- runtime --
    device: str = option("auto", "auto (cuda when available), cpu, cuda, cuda:N", group="runtime", metavar="DEVICE")
    bf16: bool | None = option(None, "bf16 autocast (--no-bf16: fp32); default: bf16 on GPUs and CPUs that multiply "
                               "it natively (Ampere on; AMX or AVX512_BF16), fp16 with loss scaling on a GPU without "
                               "it (T4, V100), fp32 on other CPUs (docs/precision.md; speed and scores: "
                               "benchmarks/README.md)", group="runtime")
    fp16: bool = option(False, "fp16 autocast with dynamic loss scaling (torch.amp.GradScaler: a step whose gradients "
                        "overflow is skipped and the scale halved), as a GPU without native bf16 (T4, V100) trains by "
                        "default; on a CPU it is emulated, slower than fp32: the T4's path, for tests",
                        group="runtime")
    threads: int | None = option(None, "CPU threads to compute with (torch.set_num_threads); default: torch's, one "
                                 "per core (OMP_NUM_THREADS sets it too); a run's scores depend on it (a sum split "
                                 "otherwise rounds otherwise), and beside other work one thread can be the faster",
                                 group="runtime", metavar="N")
    compile: bool = option(False, "torch.compile the encoder", group="runtime")
    deterministic: bool = option(False, "torch.use_deterministic_algorithms(True) (and CUBLAS_WORKSPACE_CONFIG="
                                 ":4096:8 when unset): on CUDA, what makes --resume repeat a run bit for bit (same "
                                 "GPU model and count); an op with no deterministic kernel then raises; CPU runs "
                                 "are bit-exact without it", group="runtime")
    gradient_checkpointing: bool = option(False, "activation checkpointing: keep only each encoder layer's input and "
                                          "recompute the layer in backward (less memory for about one more forward "
                                          "pass: bert-base-sized models on small GPUs); the same losses and "
                                          "gradients", group="runtime")
    fused_adamw: bool = option(True, "run our AdamW update through torch's fused kernel (minbert/optimizer.py; the "
                               "same update up to float rounding, not bit for bit, as the foreach path that "
                               "--no-fused-adamw selects)", group="runtime")
    report_to: tuple[str, ...] = option((), "also write the log lines' and epochs' metrics for: tensorboard "
                                        "(event files in <out-dir>/tensorboard; pip install tensorboard)",
                                        group="runtime", choices=REPORTERS, nargs="+")
    log_every: int = option(50, "one log line (every loss term, lr, seq/s) every N steps (the only time losses are "
                            "read back from the device)", group="runtime", metavar="N")
    checkpoint_every: int = option(0, "also write checkpoints/last every N steps mid-epoch (0 = epoch ends only)",
                                   group="runtime", metavar="N")
    save_only_model: bool = option(False, "at the end of the run keep the model alone: checkpoints/last and every "
                                   "optimizer state are deleted (most of a run's disk: the run's log says how "
                                   "much), so the run can be evaluated but no longer resumed (HF's "
                                   "save_only_model)", group="runtime")

    def __post_init__(self) -> None:
        # The tasks its task files declared (read once, where the command line is read: tasks.arguments) are the
        # run's own entries, beside the package's (``entries``): a saved run predicts with them as they were.
        if not isinstance(self.user_tasks, dict):  # Tasks from Python (tasks.task_file.read_task_file)
            self.user_tasks = {t.name: t for t in self.user_tasks}
        # Each kept at today's entry format (a saved run's at its own: tasks.task.upgrade_entry), so that a run and
        # its resumption compare one format.
        entries = {name: e if isinstance(e, Task) else Task.from_dict(e) for name, e in self.user_tasks.items()}
        self._entries = Tasks(entries.values())
        self.user_tasks = {name: e.to_dict() for name, e in entries.items()}
        # A GLUE task's entry too, as the package declares it now: a later package cannot change what the run
        # predicts (one that declares it otherwise is refused above); a run saved before kept none: the package's.
        self.user_tasks.update({t: get_task(t).to_dict() for t in self.tasks
                                if t in GLUE and t not in self.user_tasks})
        self.task_files = tuple(str(Path(f).expanduser().resolve()) for f in self.task_files)
        self.objective_modules = tuple(str(Path(f).expanduser().resolve()) for f in self.objective_modules)
        self.tasks = tuple(self.tasks)
        self.best_metric = tuple(self.best_metric)
        self.report_to = tuple(self.report_to)
        for name, cls in NESTED.items():  # a nested config given as a mapping (a preset's, a saved run's)
            if isinstance(getattr(self, name), dict):
                setattr(self, name, cls(**getattr(self, name)))

    # -- JSON --
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON, marked with ``model_type`` MODEL_TYPE so that transformers' Auto classes pointed at a
        run or checkpoint directory refuse it ("unrecognized model type") instead of building a random BERT, and
        with the version of its format and of the software that wrote it (tasks/config_versions.py)."""
        d = dataclasses.asdict(self)
        d["tasks"], d["report_to"], d["task_files"] = list(self.tasks), list(self.report_to), list(self.task_files)
        d["best_metric"], d["objective_modules"] = list(self.best_metric), list(self.objective_modules)
        versions = {name: registered_objectives()[name].options_version for name in self.objectives
                    if name in registered_objectives()}
        return {"model_type": MODEL_TYPE, VERSION_KEY: CONFIG_VERSION, **software_versions(),
                OBJECTIVE_VERSIONS: versions, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any], complete: bool = False, trust_modules: bool = False) -> TrainConfig:
        """Inverse of ``to_dict``; an unknown key is an error (a config from another version must not half-load),
        and so is a number that is not finite (JSON's ``Infinity``, ``NaN``), named by its field.

        Reading a config executes no code of its files: an objective it names that is not registered (its file not
        named again by --objective-module or MINBERT_PLUGINS) is a ValueError naming the file it recorded
        (``objective_modules``), which ``trust_modules`` (--trust-objective-modules) imports instead.

        A run's saved configuration (one that records its version, or one saved before versions were) is first
        upgraded to today's fields by the migrations of tasks/config_versions.py, so that it loads as it ran,
        whatever today's defaults. A file of some fields (``--config`` of one's own) takes today's defaults for the
        others. ``complete``: ``d`` must be a run's saved configuration (a checkpoint's): a field missing after the
        upgrade is an error naming it.
        """
        if not isinstance(d, dict):
            raise ValueError(f"a run configuration is a JSON object, got a JSON {type(d).__name__}")
        for where, value in _numbers(d):
            if not math.isfinite(value):
                raise ValueError(f"{where} is {json.dumps(value)}, not a finite number")
        d = dict(d)
        model_type = d.pop("model_type", MODEL_TYPE)  # the first runs' files lack the marker
        if model_type != MODEL_TYPE:
            raise ValueError(f"not a {MODEL_TYPE} config: model_type is {model_type!r}")
        versions = d.pop(OBJECTIVE_VERSIONS, None) or {}  # each objective's own (Objective.options_version)
        if not isinstance(versions, dict) or not all(isinstance(v, int) and v >= 1 for v in versions.values()):
            raise ValueError(f"{OBJECTIVE_VERSIONS}: {json.dumps(versions)} is not an object of objective -> version")
        d = upgrade(d)
        # a run's own objective files, before their options: imported only with ``trust_modules``, where an
        # objective it names is not registered otherwise (tasks.objectives.recorded_modules)
        recorded_modules(d.get("objectives"), d.get("objective_modules"), trust=trust_modules)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig field(s) {unknown}; known: {sorted(known)}")
        # every value read as its flag reads it (tasks.options.json_value): "none", null, types, choices
        d = {k: v if k in NESTED or k in ("objectives", "user_tasks") else json_value(cls, k, v) for k, v in d.items()}
        missing = sorted(known - set(d))
        for name, nested in NESTED.items():
            if name not in d:
                continue
            if not isinstance(d[name], dict):
                raise ValueError(f"{name}: {json.dumps(d[name])} is not an object of {nested.__name__}'s settings")
            nested_known = {f.name for f in dataclasses.fields(nested)}
            bad = sorted(set(d[name]) - nested_known)
            if bad:
                raise ValueError(f"unknown {nested.__name__} field(s) {bad}; known: {sorted(nested_known)}")
            d[name] = {k: json_value(nested, k, v, f"{name}.{k}") for k, v in d[name].items()}
            missing += [f"{name}.{k}" for k in sorted(nested_known - set(d[name]))]
        if "objectives" in d:
            d["objectives"] = objective_values(d["objectives"])
            registry = registered_objectives()
            d["objectives"] = {name: registry[name].upgrade_options(options, versions.get(name, 1))
                               if name in registry else options for name, options in d["objectives"].items()}
        if complete and missing:
            raise ValueError(f"not a complete run configuration: missing {missing}")
        default = cls()
        for name in NESTED:  # a partial one: today's others
            if name in d:
                d[name] = dataclasses.replace(getattr(default, name), **d[name])
        return cls(**d)

    # -- derived --
    @property
    def entries(self) -> Tasks:
        """The run's tasks resolved once (tasks.task.Tasks): the package's and its own, by name; what every part of
        the run reads a task's entry from."""
        return self._entries

    def resolve(self) -> RunTasks:
        """The run's tasks, streams and priors, each setting resolved once (tasks.run_tasks.RunTasks), what the run
        hands down to its data, model, training and evaluation.

        An extra stream is one a task of the run declares (its entry's ``stream``: SST's phrases) with the file,
        fewest words and order that ``stream_files``, ``stream_min_words`` and ``stream_orders`` give where they name
        it (--sst-phrases FILE is the phrases' file), else as declared; one without a file (STREAM=none) is off. A
        prior is one a task of the run declares (its entry's ``prior``) with the weight and encoder that
        ``prior_weights`` and ``prior_models`` give where they name the task (--sst-prior W is sst's weight), else as
        declared; a weight of 0 is off. Every stream takes its item of ``task_batch_size``, ``max_train_examples``
        and ``loss_weights`` where one is given (--sst-phrases-<x>: the phrases' item); an extra stream they leave
        out, its declared batch size and cap (SST's phrases: 64, 17088); a batch size of None, --batch-size."""
        extra, priors = {}, {}
        for task in self.tasks:
            entry = self.entries[task]
            if entry.stream is not None:
                s = entry.stream
                s = dataclasses.replace(s, file=self.stream_files.get(s.name, s.file),
                                        min_words=self.stream_min_words.get(s.name, s.min_words),
                                        order=self.stream_orders.get(s.name, s.order))
                if s.file is not None:
                    extra[s.name] = s
            if entry.prior is not None:
                p = dataclasses.replace(entry.prior, weight=self.prior_weights.get(task, entry.prior.weight),
                                        model=self.prior_models.get(task, entry.prior.model))
                if p.weight > 0:
                    priors[task] = p
        triplets = with_triplets(self.entries, model_tasks(self.tasks)) if self.nli else None
        streams = self.tasks + tuple(extra) + ((NLI,) if triplets is not None else ())  # RunTasks.streams
        own = {s: self.task_batch_size.get(s, extra[s].batch_size if s in extra else None) for s in streams}
        caps = dict(self.max_train_examples)
        for stream, spec in extra.items():
            if spec.per_epoch is not None:
                caps.setdefault(stream, spec.per_epoch)
        return RunTasks(self.tasks, self.entries, extra, priors,
                        {s: self.batch_size if b is None else b for s, b in own.items()}, caps,
                        dict(self.loss_weights), triplets, self.gradient_accumulation_steps)

    def settings(self) -> dict[str, Any]:
        """``to_dict()`` with each nested config's fields by dotted path ("swa.epochs"): one entry a setting."""
        d = self.to_dict()
        for name in NESTED:
            d.update({f"{name}.{k}": v for k, v in d.pop(name).items()})
        return d

    def acting(self) -> dict[str, Any]:
        """``settings()`` as the run acts on them: each stream's batch size, cap and loss weight, file, fewest words
        and order as resolved (given either way, declared, or the general setting's), none of a stream it does not
        train (the phrases' of a run without sst, or with --sst-phrases none). Two configs with equal ``acting()``
        make one run, however spelled."""
        d = self.settings()
        run = self.resolve()
        d["task_batch_size"] = dict(run.batch_sizes)
        d["max_train_examples"] = {s: n for s, n in run.caps.items() if s in run.streams}
        d["loss_weights"] = {s: run.weights.get(s, 1.0) for s in run.streams}
        d["stream_files"] = {s: run.extra[s].file if s in run.extra else None for s in run.declared}
        d["stream_min_words"] = {s: e.min_words for s, e in run.extra.items()}
        d["stream_orders"] = {s: e.order for s, e in run.extra.items()}
        return d

    # -- checks --
    def validate(self) -> RunTasks:
        """Raise ValueError with a sentence saying why when fields contradict each other or are out of range;
        return the run's tasks resolved (``resolve``), which the checks read: what a checked run hands down."""
        if not self.tasks:
            raise ValueError("tasks is empty: train at least one of sst, para, sts")
        unknown = [t for t in self.tasks if t not in self.entries]
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}: the tasks are {', '.join(self.entries)} (declare your own "
                             "with --task-file)")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks {list(self.tasks)} names a task twice")
        keys = {k: t for t in self.tasks for k in self.entries[t].metric_keys}
        bad = [m for m in self.best_metric if m not in self.tasks and m not in keys]
        if bad:
            raise ValueError(f"best_metric {bad[0]!r} is neither a task of this run nor one of their metrics; it can "
                             f"be {', '.join(self.tasks)} or {', '.join(keys)}")
        # a stream another run trains (one a task declares: SST's phrases on a run without sst or with them off) is
        # idle here, as a prior's weight of a task the run leaves out; a command line naming it is refused
        # (refuse_idle_settings); a name that is no stream at all is an error
        run = self.resolve()
        for name in (*PER_STREAM, "stream_files"):
            extra = sorted(set(getattr(self, name)) - stream_keys(name, run))
            if extra and name in EXTRA_STREAM_SETTINGS:
                raise ValueError(f"{name} names {extra}, which no task of the run declares as an extra stream "
                                 f"(the tasks' extra streams: {', '.join(run.declared) or 'none'})")
            if extra:
                hint = " (add --nli for the nli stream)" if NLI in extra and not self.nli else ""
                raise ValueError(f"{name} names {extra}, which this run does not train (streams: "
                                 f"{list(run.streams)}){hint}")
        bad = {s: f for s, f in self.stream_files.items() if not (f is None or isinstance(f, str) and f.strip())}
        if bad:
            raise ValueError(f"stream_files values are files (none: off), got {bad}")
        extra = sorted(set(self.dev_max_examples) - set(self.tasks))
        if extra:
            raise ValueError(f"dev_max_examples names {extra}, which this run does not evaluate (tasks: {list(self.tasks)})")
        check_per_stream({path: getattr(self, path) for path in PER_STREAM}, lambda path, s, v: f"{path} {s}={v!r}")
        _positive_ints("dev_max_examples", self.dev_max_examples, 2)  # Pearson r needs two points
        if self.train_subsets not in SUBSETS:
            raise ValueError(f"train_subsets must be one of {', '.join(SUBSETS)}, got {self.train_subsets!r}")
        if not 0.0 <= self.pair_swap <= 1.0:
            raise ValueError(f"pair_swap is a probability in [0, 1], got {self.pair_swap}")
        # a task of another run's is idle there, as an unused flag; one that cannot take the setting is refused
        check_per_task(self, {path: value_at(self, path) for path in PER_TASK}, lambda path, task: f"{path} {task}")
        if self.final_dev not in FINAL_DEV:
            raise ValueError(f"final_dev must be 'full' or 'capped', got {self.final_dev!r}")
        for name in ("epochs", "batch_size", "eval_batch_size", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name, epochs in (("lp_epochs", self.lpft.epochs), ("swa_epochs", self.swa.epochs)):
            if epochs < 0:
                raise ValueError(f"{name} must be >= 0 (0 = off), got {epochs}")
        if self.lpft.lr is not None and not self.lpft.lr > 0:
            raise ValueError(f"lp_lr must be positive, got {self.lpft.lr}")
        if self.freeze_encoder and self.lpft.epochs:
            raise ValueError("freeze_encoder trains the heads alone every epoch; LP-FT's lp_epochs (heads alone, then "
                             "everything) contradicts it: choose one")
        if self.lpft.lr is not None and self.lpft.epochs == 0:
            raise ValueError("lp_lr only acts with lp_epochs N > 0 (LP-FT stage 1, paper §4.2): it would do nothing")
        if not self.swa.lr > 0:
            raise ValueError(f"swa_lr must be positive, got {self.swa.lr}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0 (0 = epoch ends only), got {self.checkpoint_every}")
        unknown = [r for r in self.report_to if r not in REPORTERS]
        if unknown:
            raise ValueError(f"report_to: unknown {unknown}; it can be {', '.join(REPORTERS)}")
        if self.max_length < 3:
            raise ValueError(f"max_length={self.max_length} leaves no room for text ([CLS] a [SEP] b [SEP] needs 3 tokens)")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; schedules: {', '.join(SCHEDULES)}")
        # An extra stream (SST's phrases: short auxiliary examples) is batched by its own size.
        task_sizes = {s: b for s, b in run.batch_sizes.items() if s not in run.extra}
        if self.schedule == "even" and len(set(task_sizes.values())) > 1:
            raise ValueError(f"schedule 'even' (paper §4.2) splits every task into batches of one size, "
                             f"but the batch sizes differ: {task_sizes}")
        if self.limit is not None and self.limit < max(task_sizes.values()):
            raise ValueError(f"limit={self.limit} is smaller than the batch size {max(task_sizes.values())}: "
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
        lp_peak = self.lpft.lr if self.lpft.lr is not None else self.lr
        if (self.lr_schedule == "epoch_decay" and self.lpft.epochs
                and not lp_peak - self.lr_decay * (self.lpft.epochs - 1) > 0):
            raise ValueError(f"lr_schedule epoch_decay: LP-FT stage 1 lr {lp_peak} - lr_decay {self.lr_decay} x "
                             f"{self.lpft.epochs - 1} epochs is not positive; its last epochs would not train")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup is a fraction of all steps in [0, 1), got {self.warmup}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.reinit_layers < 0:
            raise ValueError(f"reinit_layers must be >= 0, got {self.reinit_layers}")
        if not 0 < self.layer_lr_decay <= 1:
            raise ValueError(f"layer_lr_decay must be in (0, 1], got {self.layer_lr_decay}")
        if not self.head_lr_scale > 0:
            raise ValueError(f"head_lr_scale must be positive, got {self.head_lr_scale}")
        if not self.grad_clip >= 0:
            raise ValueError(f"grad_clip must be >= 0 (0 = off), got {self.grad_clip}")
        if self.gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be at least 1 (1 = none), got "
                             f"{self.gradient_accumulation_steps}")
        if self.early_stopping_patience < 0:
            raise ValueError(f"early_stopping_patience must be >= 0 (0 = off), got {self.early_stopping_patience}")
        if self.early_stopping_patience and self.swa.epochs:
            raise ValueError("early_stopping_patience ends the run when the dev overall stops improving, and SWA's "
                             "epochs come after the scored ones: choose one")
        if self.fp16 and self.bf16 is not None:
            raise ValueError(f"--fp16 and --{'' if self.bf16 else 'no-'}bf16 ask for two precisions: give one")
        if self.encoder_dropout is not None and not 0 <= self.encoder_dropout < 1:
            raise ValueError(f"encoder_dropout must be in [0, 1), got {self.encoder_dropout}")
        if self.freeze_layers is not None and self.freeze_layers < 0:
            raise ValueError(f"freeze_layers is a number of layers, 0 or more (0: the embeddings alone), got "
                             f"{self.freeze_layers}")
        if self.freeze_layers is not None and self.freeze_encoder:
            raise ValueError("freeze_encoder freezes the whole encoder; freeze_layers its lowest layers: choose one")
        check_runtime(self)
        self.model.__post_init__()  # a ModelConfig edited after construction is re-checked
        check_objectives(self, run)
        return run


def _numbers(value: Any, where: str = "") -> Iterator[tuple[str, float]]:
    """(dotted path, value) of every float in a JSON value: NaN and infinities parse (``Infinity``) but mean
    nothing a run can do."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _numbers(item, f"{where}[{i}]")
    elif isinstance(value, float):
        yield where, value


def _positive_ints(name: str, mapping: dict[str, int], low: int) -> None:
    bad = {k: v for k, v in mapping.items() if not (isinstance(v, int) and v >= low)}
    if bad:
        raise ValueError(f"{name} values must be integers >= {low}, got {bad}")


# The per-task settings (TASK=VALUE maps), by dotted path: which tasks can take one, and what the others are not
PER_TASK: dict[str, tuple[Callable[[Task], bool], str, str]] = {
    "prior_weights": (lambda e: e.prior is not None, "declares no prior", "tasks that do"),
    "prior_models": (lambda e: e.prior is not None, "declares no prior", "tasks that do"),
    "model.spans": (lambda e: e.score_range is not None, "is no regression", "regressions")}


def _count(low: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


# The per-stream settings' values (STREAM=VALUE maps but the files), by path: what each must be, in words
PER_STREAM: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_train_examples": (_count(1), "at least 1 example an epoch (all: every one)"),
    "task_batch_size": (lambda v: v is None or _count(1)(v), "at least 1 example a batch (none: --batch-size)"),
    "loss_weights": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0,
                     "a factor of 0 or more"),
    "stream_min_words": (_count(1), "at least 1 word"),
    "stream_orders": (lambda v: v in PHRASE_ORDERS, f"one of {', '.join(PHRASE_ORDERS)}")}


def check_per_stream(given: Mapping[str, Mapping[str, Any]], name: Callable[[str, str, Any], str]) -> None:
    """Refuse a per-stream setting (``given``: {stream: value} by PER_STREAM path) out of its range: a ValueError
    naming it as ``name(path, stream, value)`` says (a field, or a flag)."""
    for path, values in given.items():
        ok, what = PER_STREAM[path]
        for stream, value in values.items():
            if not ok(value):
                raise ValueError(f"{name(path, stream, value)}: {what}")


def check_per_task(cfg: TrainConfig, given: Mapping[str, Mapping[str, Any]], name: Callable[[str, str], str]) -> None:
    """Refuse a per-task setting (``given``: {task: value} by PER_TASK path) of a task that cannot take it (an
    unknown name, a prior for a task that declares none, a span for a classification) or a prior's weight outside
    [0, 1]: a ValueError that says so, the setting named as ``name(path, task)`` says (a field, or a flag)."""
    for path, values in given.items():
        takes, what, which = PER_TASK[path]
        for task, value in values.items():
            if task not in cfg.entries or not takes(cfg.entries[task]):
                raise ValueError(f"{name(path, task)}: {task} {what} ({which}: "
                                 f"{', '.join(t for t in cfg.entries if takes(cfg.entries[t])) or 'none'})")
            if path == "prior_weights" and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name(path, task)}: a weight in [0, 1], got {value}")


def refuse_idle_settings(cfg: TrainConfig, explicit: set[str] | dict[str, Any]) -> None:
    """Settings given explicitly (dotted paths) that only act with another setting: refused when that setting is
    off."""
    if "lr_decay" in explicit and cfg.lr_schedule != "epoch_decay":
        raise ValueError(f"--lr-decay only acts with --lr-schedule epoch_decay (the run uses {cfg.lr_schedule})")
    if "warmup" in explicit and cfg.lr_schedule != "warmup_linear":
        raise ValueError(f"--warmup only acts with --lr-schedule warmup_linear (the run uses {cfg.lr_schedule})")
    if "swa.lr" in explicit and cfg.swa.epochs == 0:
        raise ValueError("--swa-lr only acts with --swa-epochs N > 0 (the SWA phase, paper §4.6)")
    given = explicit if isinstance(explicit, dict) else {}
    # the flags' own, named as given: here for --eval-only too, which validates no config
    check_per_task(cfg, {path: dict(given[path]) for path in PER_TASK if given.get(path)},
                   lambda path, task: given_flag(TrainConfig, given, path, task))
    for task, weight in dict(given.get("prior_weights") or ()).items():
        if weight > 0 and task not in cfg.tasks:
            entry = cfg.entries.get(task)
            raise ValueError(f"{given_flag(TrainConfig, given, 'prior_weights', task)} only acts on "
                             f"{entry.title if entry is not None and entry.title else task}'s predictions, and --tasks "
                             f"{' '.join(cfg.tasks)} has no {task}")
    run = cfg.resolve()
    for task in dict(given.get("prior_models") or ()):
        if task not in run.priors:
            raise ValueError(f"{given_flag(TrainConfig, given, 'prior_models', task)} only acts on a run with {task} "
                             f"and its prior's weight above 0 ({spelled_flag(TrainConfig, 'prior_weights', task)})")
    check_per_stream({path: {s: v for s, v in given[path] if v is not None and v is not REMOVED}  # STREAM=all, none
                      for path in PER_STREAM if given.get(path)},
                     lambda path, stream, value: given_flag(TrainConfig, given, path, stream, value))
    declared = run.declared
    for stream, file in dict(given.get("stream_files") or ()).items():
        if stream not in declared and file is not None:  # (--sst-phrases none on a run without sst: nothing to do)
            by = cfg.entries.declaring(stream)
            raise ValueError(f"{given_flag(TrainConfig, given, 'stream_files', stream)} sets stream {stream}, which "
                             + (f"trains the {by.title or by.name} head, and --tasks {' '.join(cfg.tasks)} has no "
                                f"{by.name}" if by is not None else
                                f"no task declares (the tasks' extra streams: {', '.join(declared) or 'none'})"))
    for path in PER_STREAM:
        for stream in dict(given.get(path) or ()):
            if path in EXTRA_STREAM_SETTINGS and stream not in stream_keys(path, run):
                raise ValueError(f"{given_flag(TrainConfig, given, path, stream)}: {stream} is no extra stream a task "
                                 f"declares (the tasks' extra streams: {', '.join(declared) or 'none'})")
            if stream in run.idle:
                raise ValueError(f"{given_flag(TrainConfig, given, path, stream)} only acts on a run that trains stream "
                                 f"{stream} ({spelled_flag(TrainConfig, 'stream_files', stream, 'FILE')} on a run "
                                 f"with {cfg.entries.declaring(stream).name}; streams: {', '.join(run.streams)})")


def stream_keys(path: str, run: RunTasks) -> set[str]:
    """The streams the per-stream map at ``path`` may name in ``run`` (a config's resolution): a stream of the run
    (an extra stream's own settings, EXTRA_STREAM_SETTINGS: one its tasks declare, on or off), or one another run
    trains (``RunTasks.idle``)."""
    return {*(run.declared if path in EXTRA_STREAM_SETTINGS else run.streams), *run.idle}


def check_objectives(cfg: TrainConfig, run: RunTasks) -> None:
    """Refuse objectives that are not registered, cannot be configured so, or would do nothing in this run (``run``:
    its resolution)."""
    streams = run.streams
    on_nli = []
    for name, overrides in cfg.objectives.items():
        cls, config = objective_config(name, overrides, cfg.entries)
        active = cls.tasks_of(config)
        applies = [s for s in active if s in streams]
        if not applies:
            raise ValueError(f"objective {name!r} applies to {list(active)}, none of which this "
                             f"run trains (streams: {list(streams)})")
        if cls.needs_siamese and cfg.model.pair_encoding == "cross":
            raise ValueError(f"objective {name!r} compares separately encoded sentences and needs "
                             "pair_encoding 'siamese', but the run uses 'cross'")
        if NLI in applies:
            on_nli.append(name)
        cls.check_run(config, cfg)  # the objective's own checks of the run, before any work
    if cfg.nli and not on_nli:
        raise ValueError("the nli stream has no head loss and no objective here applies to it, so it would "
                         "train nothing: add an objective for nli (the paper uses --objective mnr, §4.2)")


def _what_tasks_are(d: dict[str, Any]) -> dict[str, Any]:
    """``settings()`` with its user tasks' entries apart from where their files are (a run may move): its splits',
    its stream's and its NLI triplets'."""
    def what(e: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in e.items() if k not in ("files", "origin")} | {"triplets": bool(e.get("triplets"))}
        return {**out, "stream": {k: v for k, v in e["stream"].items() if k != "file"}} if e.get("stream") else out
    return {**d, "user_tasks": {name: what(e) for name, e in d["user_tasks"].items()}}


def check_resume_config(saved: TrainConfig, cfg: TrainConfig) -> None:
    """A resumed run must be the same run: only RESUME_MUTABLE settings may differ."""
    a, b = _what_tasks_are(saved.settings()), _what_tasks_are(cfg.settings())
    changed = sorted(k for k in a if a[k] != b.get(k) and k not in RESUME_MUTABLE)
    if changed:
        details = "; ".join(f"{k}: checkpoint {a[k]!r}, now {b[k]!r}" for k in changed)
        raise ValueError(f"cannot resume with a different configuration ({details}); only "
                         f"{', '.join(RESUME_MUTABLE)} may change")
    if a["epochs"] != b["epochs"] and cfg.lr_schedule == "warmup_linear":
        raise ValueError("epochs cannot change on resume with lr_schedule warmup_linear: the decay is spread over "
                         "all steps, so the steps already taken would have had other learning rates")


def with_task_files(saved: TrainConfig, given: Iterable[str] = ()) -> TrainConfig:
    """A saved run's config (``--resume``, ``--eval-only``) with its tasks checked against their task files
    (tasks.task_file.check_unchanged: a file that changed since the run is refused, naming what changed; one that
    is gone leaves the saved task as it is) and relocated where ``given`` (``--task-file``) says a file now is."""
    given = [str(Path(f).expanduser().resolve()) for f in given]
    by_name = {}
    for path in given:
        declaration = read_declaration(Path(path), f"--task-file {path}")
        name = declaration.get("name") if isinstance(declaration, dict) else None
        own = [n for n, e in saved.user_tasks.items() if e["origin"].get("file")]  # not its GLUE tasks'
        if name not in own:
            raise ValueError(f"--task-file {path} declares task {name!r}, which the run has not (its own tasks: "
                             f"{', '.join(own) or 'none'}): with --resume or --eval-only it names "
                             "where a run's task file now is")
        by_name[name] = path
    entries = {name: check_unchanged(Task.from_dict(e), by_name.get(name)).to_dict()
               for name, e in saved.user_tasks.items()}
    files = tuple(e["origin"].get("file") for e in entries.values() if e["origin"].get("file"))
    return dataclasses.replace(saved, user_tasks=entries, task_files=files) if given or entries != saved.user_tasks \
        else saved


def eval_mutable() -> tuple[str, ...]:
    """Config paths --eval-only may change: EVAL_MUTABLE and every objective's inference options."""
    extra = tuple(f"objectives.{name}.{option_name}" for name, cls in sorted(registered_objectives().items())
                  for option_name in cls.inference_options)
    return EVAL_MUTABLE + extra


def eval_overrides(cfg: TrainConfig) -> dict[str, Any]:
    """The settings of ``cfg`` that evaluation may take over a checkpoint's config (see ``eval_config``)."""
    return {**{k: value_at(cfg, k) for k in EVAL_MUTABLE}, "objectives": cfg.objectives}


def check_eval_changes(paths: Iterable[str], name: Callable[[str], str] = lambda path: path) -> None:
    """The one rule of evaluating a saved model: only eval_mutable() settings (dotted paths) may change; a
    ValueError naming the others (``name``: how the caller spells a path: a field, or a flag)."""
    allowed = eval_mutable()
    fixed = [name(p) for p in paths if p not in allowed]
    if fixed:
        raise ValueError(f"evaluation uses the configuration saved in the checkpoint, so {', '.join(fixed)} cannot "
                         f"change (allowed: {', '.join(name(p) for p in allowed)})")


def eval_config(saved: TrainConfig, overrides: dict[str, Any]) -> TrainConfig:
    """The config that evaluates a checkpoint trained with ``saved``: only eval_mutable() fields change
    (``check_eval_changes``).

    ``overrides`` holds settings by dotted path ("limit", "prior_weights") and, under "objectives", options of
    the saved objectives (those equal to the saved ones count as no change); the tasks must be a subset of the
    trained ones.
    """
    objectives = {name: dict(options) for name, options in saved.objectives.items()}
    changed = [k for k in overrides if k != "objectives"]
    for name, options in overrides.get("objectives", {}).items():
        if name not in objectives:
            raise ValueError(f"the checkpoint was trained without objective {name!r}")
        changed += [f"objectives.{name}.{k}" for k, v in options.items() if objectives[name].get(k) != v]
        objectives[name].update(options)
    check_eval_changes(changed)
    cfg = dataclasses.replace(saved, objectives=objectives)
    for path, value in overrides.items():
        if path != "objectives":
            cfg = replace_at(cfg, path, value)
    extra = sorted(set(cfg.tasks) - set(saved.tasks))
    if extra:
        raise ValueError(f"--tasks {' '.join(extra)}: the checkpoint was trained on {list(saved.tasks)}, not on "
                         f"{extra}")
    check_runtime(cfg)
    return cfg


def check_runtime(cfg: TrainConfig) -> None:
    """The settings of how a config computes, which an evaluation may change too (``eval_config``): the device's
    name and the CPU threads; a ValueError saying why."""
    check_device_string(cfg.device)
    if cfg.threads is not None and cfg.threads < 1:
        raise ValueError(f"threads must be at least 1 (default: torch's, one per core), got {cfg.threads}")


# The per-stream settings that only an extra stream a task declares takes (its file: on, or none; its fewest words
# and order); the others (a cap, a batch size, a loss weight) every stream takes
EXTRA_STREAM_SETTINGS = ("stream_files", "stream_min_words", "stream_orders")


# TrainConfig's nested configs by field name (a field of a dataclass type: its settings are "<name>.<field>")
NESTED: dict[str, type] = {f.name: nested_config(TrainConfig, f) for f in dataclasses.fields(TrainConfig)
                           if nested_config(TrainConfig, f) is not None}


__all__ = ("EVAL_MUTABLE", "LR_SCHEDULES", "NLI", "RESUME_MUTABLE", "TrainConfig", "check_eval_changes",
           "check_objectives", "check_resume_config", "eval_config", "eval_mutable", "eval_overrides",
           "refuse_idle_settings", "with_task_files")


# ---- presets ----
# The paper's configurations (minbert §4.1, §4.3; Figure 2) start from the settings they all share (COMMON),
# whatever the defaults; a recipe of this project's starts from the defaults (the CPU recipe) and changes only
# what it names.
COMMON: dict[str, Any] = dict(epochs=10, batch_size=16, task_batch_size={}, lr=1e-5, encoder_dropout=0.3,
                              max_train_examples={}, dev_max_examples={}, weight_decay=0.0, grad_clip=0.0, nli=False,
                              loss_weights={}, objectives={}, symmetric_eval=False,
                              prior_weights={"sts": 0.0, "sst": 0.0}, stream_files={PHRASES: None})


_B_MODEL = dict(arch="b1", pair_encoding="siamese", pooling="pooler", fcn_size=256)


_B_COMMON: dict[str, Any] = dict(schedule="even", lr_schedule="epoch_decay", lr_decay=4e-7, loss_weights={"para": 0.1})


_SIMCSE = {"tasks": ["sts"], "similarity": "dot", "temperature": 1.0}


PAPER_PRESETS: dict[str, dict[str, Any]] = {
    "baseline": dict(model=dict(arch="baseline", pair_encoding="siamese", pooling="pooler", head_dropout=0.3),
                     schedule="sequential", lr_schedule="constant"),
    "b1": dict(_B_COMMON, model=dict(_B_MODEL, head_dropout=0.0), nli=True,
               objectives={"mnr": {"tasks": ["sts", NLI], "hard_negatives": False}, "simcse": _SIMCSE}),
    "b2": dict(_B_COMMON, model=dict(_B_MODEL, head_dropout=0.0),
               objectives={"mnr": {"tasks": ["sts"], "hard_negatives": False}, "simcse": _SIMCSE}),
    "b3": dict(_B_COMMON, model=dict(_B_MODEL, head_dropout=0.3),
               objectives={"mnr": {"tasks": ["sts"], "hard_negatives": False}, "simcse": _SIMCSE}),
}


# quick: the time-versus-score front's best point at about a third of the default's minutes (experiments/front.py,
# point e1-half; its score beside the default's: experiments/RESULTS.md), for a slow machine or for trying a
# change: one epoch instead of two, of 12,000 Quora pairs and 8,544 SST phrases instead of 23,000 and 17,088, its
# one evaluation on 1,000 Quora dev pairs (the final predictions still score all of dev). The learning rate still
# warms up and decays to 0 over the run's steps.
RECIPES: dict[str, dict[str, Any]] = {"quick": dict(epochs=1, max_train_examples={"para": 12000, PHRASES: 8544},
                                                    dev_max_examples={"para": 1000})}


PRESETS: dict[str, dict[str, Any]] = {**{name: {**COMMON, **settings} for name, settings in PAPER_PRESETS.items()},
                                      **RECIPES}


def apply_preset(cfg: TrainConfig, name: str) -> TrainConfig:
    """A copy of ``cfg`` with preset ``name``'s settings: a paper configuration (baseline, b1, b2, b3) or a
    recipe (quick). A nested config's mapping (model, swa, ...) sets the fields it names."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    settings = copy.deepcopy(PRESETS[name])
    for field in NESTED:
        if field in settings:
            settings[field] = dataclasses.replace(getattr(cfg, field), **settings[field])
    return dataclasses.replace(cfg, **settings)
