"""Multitask training-step speed on the real data: ours vs fixed padding vs transformers, with an MFU estimate.

Usage:
    python -m benchmarks.bench_multitask                               # defaults: 40 steps, 5 rounds, all cores
    python -m benchmarks.bench_multitask --steps 24 --rounds 5 --threads 2 --json runs/bench_multitask.json
    python -m benchmarks.bench_multitask --variants ours hf --no-bf16 --no-memory --profile

What is timed is the Trainer's own ``train_step`` (tasks.training.trainer): forward of
the task head + loss under autocast, backward, gradient clipping and our AdamW
step, on batches of the real training files in the default configuration
(``TrainConfig()``: b1 heads, cross-encoded pairs, mean pooling, batch 32, the
even schedule with length bucketing, max length 128, bf16 autocast on CPUs
with AMX or AVX512_BF16, AdamW through the fused kernel), the three tasks'
batches without the SST phrases' (``--sst-phrases none``). Inference is the
same model's forward under ``no_grad`` in eval mode on the same batches. The
sample is steps ``warmup .. warmup + steps`` of epoch 0's plan, collated once
before timing (collation is not part of a step; its cost is in the JSON).
Each variant first trains on the ``warmup`` steps, then makes one untimed pass
over the sample: oneDNN builds its kernels once per shape (per padded length),
which a real epoch amortizes over its many steps and a short sample would not.

Variants (``--variants``):
    ours      the default run: length-bucketed batches, each padded to its longest sequence
    fixed     plain random batches (MultitaskSchedule(bucket=False)), every batch padded to max_length
    nobucket  plain random batches, padded to their longest (what bucketing alone adds)
    hf        ours, with transformers.BertModel (sdpa, the same weights) in place of our encoder
    foreach   ours, with our AdamW's foreach path (--no-fused-adamw) in place of the fused kernel
    pad8      ours, each batch padded to a multiple of 8 tokens (pad_to_multiple_of=8: fewer distinct shapes)
    compile   ours, with the encoder under torch.compile (--compile; compiled during the untimed pass)
    randmask  ours, with the CPU dropout masks drawn as ``torch.rand(shape) >= p`` (float32 uniforms, compared as
              floats) in place of minbert.bert.dropout_mask's integer compare of the same draws: the same masks
              and numbers, the mask's cost before and after
    nodrop    ours without dropout in the encoder (--encoder-dropout 0), its attention as minbert.bert.use_sdpa
              takes it (on a CPU written out, as with dropout); ``nodrop-sdpa`` the same through
              F.scaled_dot_product_attention (what a GPU and inference take)
"ours", "hf", "foreach", "pad8", "compile", "randmask", "bytemask", "frozen2", "nodrop" and "nodrop-sdpa" run the
very same examples in the very same batches.
"fixed" and "nobucket" run the same steps of the unbucketed plan: the same task of every
step and the same number of sequences, drawn from the same epoch subset, but
other examples (a random batch, not a length bucket). So every ratio is one
of real (non-pad) tokens/s, the throughput that stays comparable across
samples, and the samples' mean real lengths are printed beside the epoch's.

Every round times every variant once (training, then inference) and the
dense-matmul peak once, in a rotating order, so that all of them see the same
machine load; the tables report medians over rounds, and each ratio is the
median over rounds of that round's ratio (robust to a machine whose load
changes between rounds). Peak memory of a
variant's training steps is measured in a fresh spawned child per variant:
the growth of the child's peak resident set (VmHWM, reset through
/proc/self/clear_refs once the data and model are built) over its resident
set before the first step, i.e. gradients, AdamW moments, autocast weight
copies and activations of the largest batch; on CUDA the same growth of the
tensors allocated on the training device (the CUDA allocator's peak of
that device, through tasks.runtime). The matmul peak times batches of calls
with one synchronization each, so a GPU's launch queue stays full.

MFU (model FLOPs utilization) counts only useful work, on real tokens:

    forward FLOPs of a batch = Σ_sequences [ 2·P·L_i + 4·n_layers·H·L_i² + 2·P_head ]

with L_i the real length of sequence i, P = n_layers·(4H² + 2H·I) the
encoder's matmul weights (fused QKV 3H², attention output H², FFN 2H·I; the
embedding lookups, LayerNorms, and the pooler, which mean pooling does not
use, are left out), 4·n_layers·H·L_i² the attention scores QKᵀ and the
weighted sum AV (2·L²·H each per layer), and P_head the task head's matmul
weights (counted once per sequence with forward hooks). A training step is
3× its forward (backward ≈ 2× forward). Achieved FLOP/s = FLOPs / measured
step time; MFU = achieved / the best dense matmul FLOP/s this process
measured in the training dtype (bf16 under autocast; fp32 otherwise), on
matmuls the model's shapes ((B·T)×H @ H×I and friends) and one square one.
HFU ("hardware" utilization) is the same with the padded length T in place
of L_i: what the kernels were asked to compute, padding included.

With ``--profile`` it also gives floors of the step's parts, each from this machine's own rates
(``step_floors``): the matmuls at the measured peak, the fused AdamW's and the clipping's passes over the
parameters' bytes at the measured memory bandwidth, and the step's dropout draws from the generator (on CPU
torch's serial one), timed alone; beside them, the step time that DESIGN.md's target (``TARGET_MFU`` of the
peak) would need.

Nothing is asserted; it prints Markdown tables for the README.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import math
import multiprocessing as mp
import os
import platform
import queue
import statistics
import sys
import time
import unittest.mock
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, record_function

from minbert import bert
from minbert.config import BertConfig
from minbert.pretrained import resolve_model_dir
from tasks.cli import Parser
from tasks.options import add_options, option
from tasks.storage import write_text
from tasks.train_config import TrainConfig
from tasks.data.datasets import move_batch
from tasks.data.schedule import MultitaskSchedule
from tasks.model import PHRASES, MultitaskBert
from tasks.runtime import (
    autocast,
    configure_malloc,
    memory_bytes,
    peak_memory_bytes,
    reset_peak_memory,
    resolve_device,
    synchronize,
)
from tasks.training.run import build_parts
from tasks.training.trainer import Trainer
from tasks.training.loop import Control, Hook, TrainingState

VARIANTS = {
    "ours": "ours: length buckets, padded to the batch's longest",
    "fixed": "fixed padding: random batches padded to max_length",
    "nobucket": "no buckets: random batches padded to their longest",
    "hf": "transformers.BertModel encoder, ours otherwise",
    "foreach": "ours with the foreach AdamW (--no-fused-adamw)",
    "pad8": "ours, lengths padded to a multiple of 8",
    "compile": "ours with the encoder under torch.compile (--compile)",
    "randmask": "ours with dropout masks from float32 uniforms (torch.rand >= p)",
    "bytemask": "ours with dropout masks from bytes, three a draw (--dropout-masks bytes)",
    "frozen2": "ours with the embeddings and the lowest 2 layers frozen (--freeze-layers 2)",
    "nodrop": "ours without dropout in the encoder (--encoder-dropout 0), attention as use_sdpa takes it",
    "nodrop-sdpa": "ours without dropout in the encoder, attention through SDPA",
}
DEFAULT_VARIANTS = ("ours", "fixed", "hf")
PHASES = ("forward + loss", "backward + grad clip", "optimizer step")  # of Trainer.train_step, as _Phases marks them


class _Phases(Hook):
    """Marks the phases of the trainer's own ``train_step`` (no copy of it): a profiler range and a time stamp
    where each begins, at its ``step_loss`` (forward + loss; the backward begins as it returns), at the hooks'
    event before the optimizer step (the gradients reduced and clipped) and at the one after it (the AdamW step,
    zero_grad and the objectives' momentum updates done)."""

    def __init__(self, trainer: Trainer) -> None:
        self.stamps: list[float] = []
        self.range: Any = None
        step_loss = trainer.step_loss

        def marked(stream: str, batch: dict) -> Any:
            out = step_loss(stream, batch)
            self.begin(1)
            return out
        trainer.step_loss = marked

    def begin(self, phase: int) -> None:
        self.end()
        self.stamps.append(time.perf_counter())
        self.range = record_function(PHASES[phase])
        self.range.__enter__()

    def end(self) -> None:
        if self.range is not None:
            self.range.__exit__(None, None, None)
            self.range = None
            if len(self.stamps) == len(PHASES):
                self.stamps.append(time.perf_counter())

    def on_pre_optimizer_step(self, state: TrainingState, control: Control) -> None:
        self.begin(2)


# ---- variants ---------------------------------------------------------------------------------------------------


class HFEncoder(nn.Module):
    """transformers.BertModel behind our encoder's interface: what MultitaskBert reads from an encoder.

    MultitaskBert uses ``config`` (hidden_size, initializer_range), ``pooler``
    and ``forward(...)["last_hidden_state" / "pooler_output"]``.
    """

    def __init__(self, hf: nn.Module, config: BertConfig) -> None:
        super().__init__()
        self.hf = hf
        self.config = config
        self.pooler = hf.pooler

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        out = self.hf(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                      inputs_embeds=inputs_embeds)
        return {"last_hidden_state": out.last_hidden_state, "pooler_output": out.pooler_output}


def hf_multitask_model(base: MultitaskBert, pretrained: str | None) -> MultitaskBert:
    """``base`` with transformers.BertModel (sdpa, weights from ``pretrained``) as encoder and base's head weights."""
    import transformers  # a test dependency: only this variant needs it

    ours_cfg = base.encoder.config
    hf = transformers.BertModel.from_pretrained(
        str(resolve_model_dir(pretrained)), attn_implementation="sdpa",
        hidden_dropout_prob=ours_cfg.hidden_dropout_prob,
        attention_probs_dropout_prob=ours_cfg.attention_probs_dropout_prob)
    model = MultitaskBert(HFEncoder(hf, ours_cfg), base.config)
    heads = {k: v for k, v in base.state_dict().items() if not k.startswith("encoder.")}
    result = model.load_state_dict(heads, strict=False)
    stray = [k for k in result.missing_keys if not k.startswith("encoder.")]
    if stray or result.unexpected_keys:
        raise RuntimeError(f"head weights do not fit the transformers variant: missing {stray}, "
                           f"unexpected {result.unexpected_keys}")
    return model.to(next(base.parameters()).device)


def clone_trainer(base: Trainer, model: MultitaskBert, **cfg_changes: Any) -> Trainer:
    """A Trainer sharing ``base``'s data and config (with ``cfg_changes``), training ``model`` with a fresh AdamW
    built the Trainer's way."""
    if base.objectives:
        raise ValueError("variants other than 'ours' do not support objectives (they hold the base model)")
    t = copy.copy(base)
    t.model = model
    if cfg_changes:
        t.cfg = dataclasses.replace(base.cfg, **cfg_changes)
    t.rebuild_optimizer()
    return t


@dataclass
class Variant:
    """One compared configuration: its trainer and the collated batches it runs."""

    name: str
    trainer: Trainer
    warmup: list[tuple[str, dict]]
    sample: list[tuple[str, dict]]
    collate_s: float  # seconds to collate + move the sample's batches (not part of a step)
    patch: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext  # around its steps


def _rand_mask(x: torch.Tensor, p: float, masks: str = "exact") -> torch.Tensor:
    """The dropout mask as float32 uniforms compared with p: what minbert.bert.dropout_mask computes, the slow way."""
    dtype = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
    return torch.rand(x.shape, dtype=dtype, device=x.device).ge_(p)


def _padded_to(datasets: dict[str, Any], multiple: int) -> dict[str, Any]:
    """Shallow copies of the datasets (token lists shared) whose collate pads to a multiple of ``multiple``.

    With ``multiple`` = max_length no sequence is longer, so every batch is padded to exactly max_length.
    """
    out = {}
    for s, d in datasets.items():
        c = copy.copy(d)
        c.pad_to_multiple_of = multiple
        out[s] = c
    return out


def build_variant(base: Trainer, name: str, warmup: int, steps: int) -> Variant:
    """The variant ``name`` of the base (ours) trainer, with its warm-up and timed batches collated."""
    cfg = base.cfg
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; variants: {', '.join(VARIANTS)}")
    datasets, schedule, trainer, patch = base.train_sets, base.schedule, base, contextlib.nullcontext
    if name in ("fixed", "nobucket"):
        schedule = MultitaskSchedule({s: d.lengths for s, d in base.train_sets.items()}, dict(base.run.batch_sizes),
                                     cfg.schedule, seed=cfg.seed, max_examples_per_epoch=cfg.max_train_examples,
                                     bucket=False)
        trainer = clone_trainer(base, copy.deepcopy(base.model))
        if name == "fixed":
            datasets = _padded_to(base.train_sets, cfg.max_length)
    elif name == "hf":
        trainer = clone_trainer(base, hf_multitask_model(base.model, cfg.pretrained))
    elif name == "pad8":
        trainer = clone_trainer(base, copy.deepcopy(base.model))
        datasets = _padded_to(base.train_sets, 8)
    elif name == "compile":
        trainer = clone_trainer(base, copy.deepcopy(base.model))
        trainer.model.encoder.compile()
    elif name == "foreach":
        trainer = clone_trainer(base, copy.deepcopy(base.model), fused_adamw=False)
    elif name == "randmask":
        trainer = clone_trainer(base, copy.deepcopy(base.model))
        patch = functools.partial(unittest.mock.patch.object, bert, "dropout_mask", _rand_mask)
    elif name == "bytemask":
        trainer = clone_trainer(base, copy.deepcopy(base.model))
        for module in trainer.model.encoder.modules():
            if hasattr(module, "masks"):
                module.masks = "bytes"
    elif name in ("nodrop", "nodrop-sdpa"):
        trainer = clone_trainer(base, copy.deepcopy(base.model), encoder_dropout=0.0)
        encoder = trainer.model.encoder  # what --encoder-dropout 0 builds (tasks/training/run.py), on the copy
        encoder.config.hidden_dropout_prob = encoder.config.attention_probs_dropout_prob = 0.0
        for module in encoder.modules():
            if hasattr(module, "dropout_p"):
                module.dropout_p = 0.0
        if name == "nodrop-sdpa":  # SDPA in training too, as on a GPU
            patch = functools.partial(unittest.mock.patch.object, bert, "use_sdpa",
                                      lambda impl, training, device: impl == "sdpa")
    elif name == "frozen2":
        model = copy.deepcopy(base.model)
        model.encoder.freeze_bottom(2)  # before the optimizer is built: it takes the trainable parameters
        trainer = clone_trainer(base, model, freeze_layers=2)
    plan = schedule.epoch_plan(0)
    if len(plan) < warmup + steps:
        raise ValueError(f"epoch 0 has {len(plan)} steps, fewer than warmup {warmup} + steps {steps}")
    t0 = time.perf_counter()
    batches = [(s, move_batch(datasets[s].collate(idx), base.device)) for s, idx in plan[: warmup + steps]]
    collate_s = (time.perf_counter() - t0) * steps / (warmup + steps)
    return Variant(name, trainer, batches[:warmup], batches[warmup:], collate_s, patch)


# ---- steps --------------------------------------------------------------------------------------------------------


def train_steps(v: Variant, batches: Sequence[tuple[str, dict]], lrs: Sequence[float]) -> float:
    """Seconds for Trainer.train_step over ``batches`` (train mode, as fit() sets it)."""
    tr = v.trainer
    tr.current.train_mode(tr.model)
    with v.patch():
        synchronize(tr.device)
        t0 = time.perf_counter()
        for (stream, batch), lr in zip(batches, lrs):
            tr.train_step(stream, batch, lr)
        synchronize(tr.device)
        return time.perf_counter() - t0


def infer_steps(v: Variant, batches: Sequence[tuple[str, dict]]) -> float:
    """Seconds for the task heads' forward over ``batches`` in eval mode, no_grad, the trainer's autocast."""
    tr = v.trainer
    tr.model.eval()
    amp = tr.amp_dtype
    synchronize(tr.device)
    t0 = time.perf_counter()
    with torch.no_grad(), autocast(tr.device, amp), v.patch():
        for stream, batch in batches:
            tr.model(tr.model.head_of(stream), batch)
    synchronize(tr.device)
    elapsed = time.perf_counter() - t0
    tr.current.train_mode(tr.model)
    return elapsed


# ---- FLOPs ----------------------------------------------------------------------------------------------------------


def encoder_matmul_params(config: BertConfig) -> int:
    """Weights the encoder multiplies every token by: per layer fused QKV 3H², attention output H², FFN 2·H·I."""
    H, inter = config.hidden_size, config.intermediate_size
    return config.num_hidden_layers * (4 * H * H + 2 * H * inter)


def head_flops_per_sequence(model: MultitaskBert, stream: str, batch: dict) -> float:
    """Forward FLOPs of the task head for one sequence: 2·in·out of every non-encoder Linear it applies."""
    flops = [0.0]

    def hook(module: nn.Linear, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        rows = inputs[0].numel() // module.in_features
        flops[0] += 2.0 * rows * module.in_features * module.out_features

    handles = [m.register_forward_hook(hook) for n, m in model.named_modules()
               if isinstance(m, nn.Linear) and not n.startswith("encoder.")]
    one = {k: v[:1] for k, v in batch.items()}  # tensors and the list of ids alike
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(model.head_of(stream), one)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return flops[0]


def batch_flops(batch: dict, config: BertConfig, head_per_seq: float, padded: bool) -> float:
    """Forward FLOPs of one batch (module docstring): real lengths L_i, or the padded T when ``padded``."""
    mask = batch["attention_mask"]  # (B, T)
    B, T = mask.shape
    lengths = torch.full((B,), float(T)) if padded else mask.sum(1).double().cpu()  # (B,)
    P = encoder_matmul_params(config)
    attn = 4.0 * config.num_hidden_layers * config.hidden_size * float((lengths ** 2).sum())
    return 2.0 * P * float(lengths.sum()) + attn + head_per_seq * B


@dataclass
class SampleStats:
    sequences: int
    real_tokens: int
    padded_tokens: int
    train_flops: float  # model FLOPs (real tokens), forward + backward
    infer_flops: float
    train_flops_padded: float
    infer_flops_padded: float
    steps_per_task: dict[str, int]


def sample_stats(v: Variant, head_per_seq: dict[str, float]) -> SampleStats:
    cfg = v.trainer.model.encoder.config
    seqs = real = padded = 0
    fwd = fwd_pad = 0.0
    per_task: dict[str, int] = {}
    for stream, batch in v.sample:
        mask = batch["attention_mask"]
        seqs += mask.shape[0]
        real += int(mask.sum())
        padded += mask.numel()
        fwd += batch_flops(batch, cfg, head_per_seq[stream], padded=False)
        fwd_pad += batch_flops(batch, cfg, head_per_seq[stream], padded=True)
        per_task[stream] = per_task.get(stream, 0) + 1
    return SampleStats(seqs, real, padded, 3 * fwd, fwd, 3 * fwd_pad, fwd_pad, per_task)


# ---- dense matmul peak ----------------------------------------------------------------------------------------------


def matmul_shapes(config: BertConfig, rows: int, square: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of F.linear(x (M, K), W (N, K)): the encoder's four matmuls at ``rows`` tokens, and one square."""
    H, inter = config.hidden_size, config.intermediate_size
    shapes = [(rows, H, 3 * H), (rows, H, H), (rows, H, inter), (rows, inter, H)]
    if square:
        shapes.append((square, square, square))
    return shapes


def matmul_flops_per_s(shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device,
                       min_time: float = 0.2) -> float:
    """Dense FLOP/s of F.linear at ``shape`` in ``dtype``, after one warm-up: batches of 1, 2, 4, ... calls, each
    timed with one synchronization at its end, until a batch lasts ``min_time`` s (a sync after every call
    would add its latency to every call on a GPU, underestimating the peak and overstating MFU)."""
    M, K, N = shape
    g = torch.Generator().manual_seed(0)
    x = torch.randn(M, K, generator=g).to(device=device, dtype=dtype)
    w = torch.randn(N, K, generator=g).to(device=device, dtype=dtype)
    F.linear(x, w)
    n = 1
    while True:
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(n):
            F.linear(x, w)
        synchronize(device)
        elapsed = time.perf_counter() - t0
        if elapsed >= min_time:
            return 2.0 * M * K * N * n / elapsed
        n *= 2


# ---- peak memory (spawned children) -------------------------------------------------------------------------------


def _memory_child(q: Any, cfg_dict: dict, name: str, warmup: int, steps: int, threads: int) -> None:
    try:
        configure_malloc()
        torch.set_num_threads(threads)
        base = make_base_trainer(TrainConfig.from_dict(cfg_dict))
        v = build_variant(base, name, warmup, steps)
        lrs = [base.cfg.lr] * (warmup + steps)
        # A new peak from here: the data and model are resident, their building transients forgotten.
        device = base.device
        if not reset_peak_memory(device):
            q.put(math.nan)
            return
        before = memory_bytes(device)
        train_steps(v, v.warmup + v.sample, lrs)
        q.put((peak_memory_bytes(device) - before) / 2**20)
    except Exception as e:  # the parent reports it instead of waiting forever
        q.put(f"{type(e).__name__}: {e}")


def peak_train_mib(cfg: TrainConfig, name: str, warmup: int, steps: int, threads: int) -> float:
    """Peak memory of ``name``'s training steps in a fresh process over what it held before the first (MiB):
    on CPU its resident set, on CUDA the tensors on the training device (tasks.runtime.peak_memory_bytes);
    nan where the peak cannot be reset."""
    ctx = mp.get_context("spawn")  # not fork: a fork after OpenMP threads have run can deadlock
    q = ctx.Queue()
    p = ctx.Process(target=_memory_child, args=(q, cfg.to_dict(), name, warmup, steps, threads))
    p.start()
    while True:
        try:
            v = q.get(timeout=1.0)
            break
        except queue.Empty:
            if not p.is_alive():  # died before reporting (killed for memory, or failed to start)
                raise RuntimeError(f"peak-memory child for {name!r} exited with code {p.exitcode} "
                                   "without a result") from None
    p.join()
    if isinstance(v, str):
        raise RuntimeError(f"peak-memory child for {name!r} failed: {v}")
    return v


# ---- profile ------------------------------------------------------------------------------------------------------


OP_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("matmul (mm, addmm, bmm)", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv", "aten::mv",
                                 "aten::_addmm_activation")),
    ("attention softmax / sdpa", ("aten::_softmax", "aten::_softmax_backward_data",
                                  "aten::_scaled_dot_product_flash_attention_for_cpu",
                                  "aten::_scaled_dot_product_flash_attention_for_cpu_backward")),
    ("dropout masks (random bits, compare)", ("aten::random_", "aten::bitwise_and_", "aten::uniform_",
                                              "aten::rand_like", "aten::ge_", "aten::ge", "aten::bernoulli_",
                                              "aten::native_dropout", "aten::native_dropout_backward")),
    ("LayerNorm", ("aten::native_layer_norm", "aten::native_layer_norm_backward")),
    ("GELU", ("aten::gelu", "aten::gelu_backward")),
    ("embeddings (lookup, backward)", ("aten::embedding", "aten::embedding_dense_backward", "aten::index_select",
                                       "aten::index_add_", "aten::index_put_", "aten::_index_put_impl_",
                                       "aten::embedding_backward", "aten::sort", "aten::scatter_add_")),
    ("_foreach (AdamW, grad clip)", ("aten::_foreach_",)),
    ("dtype casts and copies", ("aten::_to_copy", "aten::copy_", "aten::to", "aten::_copy_from",
                                "aten::clone", "aten::contiguous")),
    ("fill / zero / alloc", ("aten::zero_", "aten::fill_", "aten::zeros", "aten::zeros_like", "aten::empty",
                             "aten::empty_like", "aten::empty_strided", "aten::full", "aten::ones_like",
                             "aten::new_zeros", "aten::new_empty_strided")),
    ("elementwise / reductions", ("aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::addcmul",
                                  "aten::div", "aten::div_", "aten::sub", "aten::rsub", "aten::sum", "aten::mean",
                                  "aten::tanh", "aten::tanh_backward", "aten::relu", "aten::threshold_backward",
                                  "aten::sigmoid", "aten::sigmoid_backward", "aten::clamp_min", "aten::neg",
                                  "aten::where", "aten::masked_fill", "aten::linalg_vector_norm", "aten::norm",
                                  "aten::stack", "aten::cat", "aten::reciprocal", "aten::clamp",
                                  "aten::mse_loss", "aten::mse_loss_backward", "aten::log_softmax",
                                  "aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::nll_loss",
                                  "aten::nll_loss_forward", "aten::nll_loss_backward",
                                  "aten::binary_cross_entropy_with_logits", "aten::expand", "aten::sqrt")),
)


def _category(op: str) -> str:
    for cat, names in OP_CATEGORIES:
        if any(op == n or (n.endswith("_") and op.startswith(n)) for n in names):
            return cat
    return "other"


def _phase_of(event: Any) -> str | None:
    """The PHASES range an event runs inside (walking up its parents), or None."""
    e = event
    while e is not None:
        if e.name in PHASES:
            return e.name
        e = e.cpu_parent
    return None


def profile_variant(v: Variant, lrs: Sequence[float]) -> dict[str, Any]:
    """Where a training step's time goes: the phases of Trainer.train_step, and its ops by category.

    The trainer's own step runs, its phases marked where the loop shows them (``_Phases``: its ``step_loss``,
    then the hooks' events before and after the optimizer step), each in a profiler range: a first pass is
    timed with perf_counter alone, a second runs under torch.profiler, whose self CPU time of each op is
    charged to its phase and, within forward and backward, to an op category (the profiler's own overhead
    inflates small ops a little).
    """
    from torch.profiler import profile

    tr = v.trainer
    tr.current.train_mode(tr.model)
    marks = _Phases(tr)
    tr.hooks.append(marks)

    def one_step(stream: str, batch: dict, lr: float, stamps: list[float]) -> None:
        marks.stamps = stamps
        marks.begin(0)
        tr.train_step(stream, batch, lr)
        marks.end()

    try:
        n = len(v.sample)
        phases = dict.fromkeys(PHASES, 0.0)
        for (stream, batch), lr in zip(v.sample, lrs):
            stamps: list[float] = []
            one_step(stream, batch, lr, stamps)
            for name, a, b in zip(PHASES, stamps, stamps[1:]):
                phases[name] += b - a
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for (stream, batch), lr in zip(v.sample, lrs):
                one_step(stream, batch, lr, [])
    finally:
        tr.hooks.remove(marks)
        del tr.step_loss  # the class's again
    where: dict[str, float] = {}
    ops: dict[str, float] = {}
    for e in prof.events():
        us = e.self_cpu_time_total
        phase = _phase_of(e)
        if us <= 0 or phase is None:
            continue
        key = f"{phase}: {_category(e.name)}" if phase in PHASES[:2] else phase
        where[key] = where.get(key, 0.0) + us
        ops[e.name] = ops.get(e.name, 0.0) + us
    total = sum(where.values())
    top = sorted(ops.items(), key=lambda kv: -kv[1])[:15]
    return {"phase_ms_per_step": {k: 1e3 * t / n for k, t in phases.items()},
            "where_ms_per_step": {k: us / 1e3 / n for k, us in sorted(where.items(), key=lambda kv: -kv[1])},
            "where_share": {k: us / total for k, us in sorted(where.items(), key=lambda kv: -kv[1])},
            "top_ops_ms_per_step": {k: us / 1e3 / n for k, us in top}}


TARGET_MFU = 0.6  # DESIGN.md's target for the training step: this share of the measured dense-matmul peak


def _median_time(fn: Callable[[], Any], device: torch.device, repeats: int = 5) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after one warm-up, each ended by a device sync."""
    fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def memory_bandwidth(device: torch.device, mib: int = 64) -> float:
    """Bytes/s of ``a.add_(b)`` on two float32 tensors of ``mib`` MiB each (reads both, writes one): what an
    elementwise pass over tensors far larger than the caches can move on ``device``."""
    n = mib * 2**20 // 4
    a, b = torch.ones(n, device=device), torch.ones(n, device=device)
    return 3 * 4 * n / _median_time(lambda: a.add_(b), device)


def step_floors(v: Variant, lrs: Sequence[float], flops_per_step: float, peak_flop_s: float) -> dict[str, Any]:
    """Lower bounds on parts of ours' step, each from this machine's own rates, against the TARGET_MFU budget.

    - matmuls: the step's model FLOPs at the measured dense-matmul peak;
    - AdamW: the fused kernel reads each parameter, gradient and both moments and writes the parameter and
      moments back (7 passes over the parameters' bytes), at ``memory_bandwidth``;
    - clipping: the norm reads every gradient, the scaling reads and writes it (3 passes);
    - dropout masks: the step's mask elements (counted over the sample), one 32-bit draw each from the
      device's generator, timed alone (on CPU torch's generator is serial: this is what the masks wait on).
    Each is a floor of that part as PyTorch computes it: none can run faster than the rate it is bounded by.
    """
    tr, device = v.trainer, v.trainer.device
    draws = 0

    def count(x: torch.Tensor, p: float, training: bool) -> None:
        nonlocal draws
        draws += x.numel() if training and p > 0 else 0

    def counted_dropout(x: torch.Tensor, p: float, training: bool, masks: str = "exact") -> torch.Tensor:
        count(x, p, training)
        return real_dropout(x, p, training, masks)

    def counted_dropout_add(x: torch.Tensor, residual: torch.Tensor, p: float, training: bool,
                            masks: str = "exact") -> torch.Tensor:
        count(x, p, training)
        return real_dropout_add(x, residual, p, training, masks)

    real_dropout, real_dropout_add = bert.dropout, bert.dropout_add
    with (unittest.mock.patch.object(bert, "dropout", counted_dropout),
          unittest.mock.patch.object(bert, "dropout_add", counted_dropout_add)):
        train_steps(v, v.sample, lrs)
    draws_per_step = round(draws / len(v.sample))
    bits = torch.empty(draws_per_step, dtype=torch.int32, device=device)
    param_bytes = sum(p.numel() * p.element_size() for p in tr.params)
    bandwidth = memory_bandwidth(device)
    floors_ms = {
        "matmuls at the measured peak": 1e3 * flops_per_step / peak_flop_s,
        "AdamW: 7 passes over the parameters' bytes": 1e3 * 7 * param_bytes / bandwidth,
        "gradient clipping: 3 passes over the gradients": 1e3 * 3 * param_bytes / bandwidth,
        "dropout masks: the generator's draws alone": 1e3 * _median_time(lambda: bits.random_(), device),
    }
    return {"floors_ms_per_step": floors_ms, "sum_ms_per_step": sum(floors_ms.values()),
            "target_mfu": TARGET_MFU, "target_ms_per_step": 1e3 * flops_per_step / (TARGET_MFU * peak_flop_s),
            "dropout_draws_per_step": draws_per_step, "parameter_bytes": param_bytes,
            "memory_bandwidth_bytes_s": bandwidth}


# ---- the benchmark ---------------------------------------------------------------------------------------------------


def make_base_trainer(cfg: TrainConfig) -> Trainer:
    """The run's Trainer, built as a run builds it but without a run directory (nothing is written)."""
    cfg.validate()
    device = resolve_device(cfg.device)
    return Trainer(cfg, build_parts(cfg, device), device=device)


def machine_info(threads: int) -> dict[str, Any]:
    """CPU model and vector features (from /proc/cpuinfo where there is one), cores, threads, torch, load."""
    cpu, flags = "", set()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not cpu:
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    cpu = cpu or platform.processor() or platform.machine()
    features = [n for n, f in (("AVX-512", "avx512f"), ("AVX512-BF16", "avx512_bf16"), ("AMX-BF16", "amx_bf16"))
                if f in flags]
    return {"cpu": cpu, "features": features, "cores": os.cpu_count(), "threads": threads,
            "torch": torch.__version__, "load_avg": list(os.getloadavg())}


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def benchmark(cfg: TrainConfig, variants: Sequence[str] = DEFAULT_VARIANTS, steps: int = 40, warmup: int = 3,
              rounds: int = 5, memory: bool = True, profile: bool = False, threads: int | None = None,
              square: int = 2048, peak_min_time: float = 0.2,
              log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict[str, Any]:
    """Time ``variants`` of the default training step on the real data; returns every number as a dict.

    ``cfg`` is the run's TrainConfig (TrainConfig() for the default recipe);
    every variant trains ``steps`` batches per round after ``warmup`` batches,
    ``rounds`` rounds, medians reported. Keys: machine, config, sample,
    peak_flops, variants (per-variant medians, FLOPs, MFU, memory), ratios,
    profile (with ``profile``).
    """
    if "ours" not in variants:
        raise ValueError("variants must include 'ours': every ratio is relative to it")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; variants: {', '.join(VARIANTS)}")
    if steps < 1 or warmup < 0 or rounds < 1:
        raise ValueError(f"need steps >= 1, warmup >= 0, rounds >= 1 (got {steps}, {warmup}, {rounds})")
    variants = ["ours"] + [v for v in dict.fromkeys(variants) if v != "ours"]
    if threads is not None:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    info = machine_info(threads)
    log("building the trainer (data, model) ...")
    base = make_base_trainer(cfg)
    amp = base.amp_dtype
    train_dtype = amp or torch.float32
    built = {name: build_variant(base, name, warmup, steps) for name in variants}  # clones before any step
    n_plan = base.schedule.steps_per_epoch()
    lrs = [base.lr_at(0, warmup + i, n_plan) for i in range(steps)]
    warm_lrs = [base.lr_at(0, i, n_plan) for i in range(warmup)]
    ours = built["ours"]
    head: dict[str, float] = {}
    for v in built.values():
        for s, b in v.sample:
            if s not in head:
                head[s] = head_flops_per_sequence(base.model, s, b)
    stats = {name: sample_stats(v, head) for name, v in built.items()}
    enc_cfg = base.model.encoder.config
    epoch_lengths = [base.train_sets[s].lengths[i] for s, idx in base.schedule.epoch_plan(0) for i in idx]
    rows = base.cfg.batch_size * round(stats["ours"].padded_tokens / stats["ours"].sequences)
    shapes = matmul_shapes(enc_cfg, rows, square)
    peak_dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}

    for name, v in built.items():
        # The warm-up batches, then one untimed pass over the sample: oneDNN builds its kernels once per
        # shape (per padded length), which a real epoch amortizes over its many steps and a short sample would not.
        log(f"warm-up: {name}")
        if v.warmup:
            train_steps(v, v.warmup, warm_lrs)
        train_steps(v, v.sample, lrs)
        infer_steps(v, v.sample)
    times: dict[str, dict[str, list[float]]] = {n: {"train": [], "infer": []} for n in variants}
    peaks: dict[str, dict[str, list[float]]] = {d: {str(s): [] for s in shapes} for d in peak_dtypes}
    for r in range(rounds):
        order = variants[r % len(variants):] + variants[: r % len(variants)]  # rotate: no variant always first
        for name in order:
            times[name]["train"].append(train_steps(built[name], built[name].sample, lrs))
            times[name]["infer"].append(infer_steps(built[name], built[name].sample))
        for d, dtype in peak_dtypes.items():
            for s in shapes:
                peaks[d][str(s)].append(matmul_flops_per_s(s, dtype, base.device, peak_min_time))
        log(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {times[n]['train'][-1]:.2f} s" for n in variants))

    peak = {d: {s: _median(v) for s, v in by_shape.items()} for d, by_shape in peaks.items()}
    best = {d: max(by_shape.items(), key=lambda kv: kv[1]) for d, by_shape in peak.items()}
    ref_dtype = "bf16" if train_dtype == torch.bfloat16 else "fp32"
    peak_ref = best[ref_dtype][1] if ref_dtype in best else math.nan
    results: dict[str, Any] = {}
    for name in variants:
        st, t_train, t_infer = stats[name], _median(times[name]["train"]), _median(times[name]["infer"])
        results[name] = {
            "description": VARIANTS[name],
            "train_s": t_train, "infer_s": t_infer,
            "train_s_rounds": times[name]["train"], "infer_s_rounds": times[name]["infer"],
            "train_seq_s": st.sequences / t_train, "train_tok_s": st.real_tokens / t_train,
            "infer_seq_s": st.sequences / t_infer, "infer_tok_s": st.real_tokens / t_infer,
            "sequences": st.sequences, "real_tokens": st.real_tokens, "padded_tokens": st.padded_tokens,
            "pad_fraction": 1 - st.real_tokens / st.padded_tokens,
            "steps_per_task": st.steps_per_task,
            "collate_ms_per_step": 1e3 * built[name].collate_s / steps,
            "train_flops": st.train_flops, "infer_flops": st.infer_flops,
            "train_flop_s": st.train_flops / t_train, "infer_flop_s": st.infer_flops / t_infer,
            "train_mfu": st.train_flops / t_train / peak_ref, "infer_mfu": st.infer_flops / t_infer / peak_ref,
            "train_hfu": st.train_flops_padded / t_train / peak_ref,
            "infer_hfu": st.infer_flops_padded / t_infer / peak_ref,
        }
    # Ratios of real tokens/s, ours over the variant, taken within each round (both ran under the same load)
    # and then the median over rounds.
    ratios = {}
    for name in variants[1:]:
        tokens = stats["ours"].real_tokens / stats[name].real_tokens
        ratios[name] = {}
        for mode in ("train", "infer"):
            per_round = [tv / to * tokens for to, tv in zip(times["ours"][mode], times[name][mode])]
            ratios[name][f"{mode}_tok_s"] = _median(per_round)
            ratios[name][f"{mode}_tok_s_rounds"] = per_round
    if memory:
        for name in variants:
            log(f"peak memory: {name} (spawned child)")
            results[name]["train_peak_mib"] = peak_train_mib(base.cfg, name, warmup, steps, threads)
    out = {
        "machine": {**info, "load_avg_end": list(os.getloadavg())},
        "config": {"train": {k: v for k, v in base.cfg.to_dict().items() if k != "out_dir"},
                   "autocast": str(amp).replace("torch.", "") if amp else None, "device": str(base.device),
                   "steps": steps, "warmup": warmup, "rounds": rounds,
                   "sample_steps": [warmup, warmup + steps], "epoch_steps": n_plan},
        "model": {"encoder_matmul_params": encoder_matmul_params(enc_cfg), "layers": enc_cfg.num_hidden_layers,
                  "hidden": enc_cfg.hidden_size, "intermediate": enc_cfg.intermediate_size,
                  "head_flops_per_sequence": head},
        "sample": {"epoch_mean_real_length": statistics.mean(epoch_lengths),
                   "mean_real_length": {n: stats[n].real_tokens / stats[n].sequences for n in variants}},
        "peak_flops": {"per_shape": peak, "best": {d: {"shape": s, "flop_s": f} for d, (s, f) in best.items()},
                       "reference_dtype": ref_dtype, "reference_flop_s": peak_ref},
        "variants": results,
        "ratios": ratios,
    }
    if profile:
        log("profiling: ours")
        out["profile"] = profile_variant(ours, lrs)
        out["floors"] = step_floors(ours, lrs, stats["ours"].train_flops / steps, peak_ref)
    return out


# ---- report -------------------------------------------------------------------------------------------------------


def _g(x: float) -> str:
    """FLOP/s as GFLOP/s, three significant digits at least."""
    g = x / 1e9
    return f"{g:,.0f}" if g >= 100 else f"{g:.3g}"


def markdown(res: dict[str, Any]) -> str:
    """The README tables of a ``benchmark`` result."""
    m, c, s = res["machine"], res["config"], res["sample"]
    tr = c["train"]
    model = tr["model"]
    lines = [
        f"Machine: {m['cpu']} ({', '.join(m['features']) or 'no AVX-512/AMX'}), {m['cores']} cores, "
        f"{m['threads']} torch thread{'s' if m['threads'] != 1 else ''}, torch {m['torch']}, load average {m['load_avg'][0]:.1f} at start, "
        f"{m['load_avg_end'][0]:.1f} at end.",
        f"Step: Trainer.train_step, {model['arch']} heads, {model['pair_encoding']} pairs, {model['pooling']} "
        f"pooling, batch {tr['batch_size']}, {tr['schedule']} schedule, max length {tr['max_length']}, "
        f"autocast {c['autocast'] or 'off (fp32)'}, device {c['device']}. Sample: steps "
        f"{c['sample_steps'][0]}-{c['sample_steps'][1] - 1} of epoch 0's plan ({c['epoch_steps']} steps), "
        f"median of {c['rounds']} rounds; mean real length {s['mean_real_length']['ours']:.1f} tokens "
        f"(whole epoch {s['epoch_mean_real_length']:.1f}).",
        "",
        "| variant | padding | train seq/s | train real tok/s | ours ÷ it | GFLOP/s | MFU | HFU | infer seq/s "
        "| infer real tok/s | ours ÷ it | train peak MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, v in res["variants"].items():
        r = res["ratios"].get(name)
        train_ratio = "" if r is None else f"{r['train_tok_s']:.2f}"
        infer_ratio = "" if r is None else f"{r['infer_tok_s']:.2f}"
        mem = v.get("train_peak_mib", math.nan)
        mem_txt = "" if math.isnan(mem) else f"{mem:,.0f}"
        lines.append(
            f"| {v['description']} | {100 * v['pad_fraction']:.0f}% | {v['train_seq_s']:.1f} | "
            f"{v['train_tok_s']:,.0f} | {train_ratio} | {_g(v['train_flop_s'])} | {100 * v['train_mfu']:.1f}% | "
            f"{100 * v['train_hfu']:.1f}% | {v['infer_seq_s']:.1f} | {v['infer_tok_s']:,.0f} | {infer_ratio} | "
            f"{mem_txt} |")
    pf = res["peak_flops"]
    peak_txt = "; ".join(f"{d} {_g(b['flop_s'])} GFLOP/s at (M, K, N) = {b['shape']}" for d, b in pf["best"].items())
    lines += ["", f"Dense matmul peak measured in the same process (best shape, median over rounds): {peak_txt}. "
                  f"MFU and HFU are relative to the {pf['reference_dtype']} peak."]
    if "profile" in res:
        p = res["profile"]
        total = sum(p["phase_ms_per_step"].values())
        lines += ["", "| phase of train_step (ours) | ms/step | share |", "|---|---|---|"]
        lines += [f"| {k} | {ms:.1f} | {100 * ms / total:.0f}% |" for k, ms in p["phase_ms_per_step"].items()]
        lines += ["", "| where (profiler, self CPU time; forward and backward by op) | ms/step | share |",
                  "|---|---|---|"]
        lines += [f"| {k} | {p['where_ms_per_step'][k]:.1f} | {100 * sh:.1f}% |" for k, sh in p["where_share"].items()]
    if "floors" in res:
        fl, ours = res["floors"], res["variants"]["ours"]
        step_ms = 1e3 * ours["train_s"] / res["config"]["steps"]
        lines += ["", "| floor of a part of the step (this machine's rates) | ms/step |", "|---|---|"]
        lines += [f"| {k} | {ms:.1f} |" for k, ms in fl["floors_ms_per_step"].items()]
        budget = (f"{100 * fl['target_mfu']:.0f}% of the peak needs a step of {fl['target_ms_per_step']:.1f} ms; "
                  f"the timed step took {step_ms:.1f} ms. {fl['dropout_draws_per_step']:,} dropout draws a step; "
                  f"{fl['parameter_bytes'] / 2**20:,.0f} MiB of parameters; "
                  f"memory bandwidth {fl['memory_bandwidth_bytes_s'] / 1e9:.1f} GB/s (a.add_(b)).")
        lines += [f"| sum | {fl['sum_ms_per_step']:.1f} |", "", budget]
    return "\n".join(lines)


@dataclass
class MultitaskBenchOptions:
    """The benchmark's flags."""

    steps: int = option(40, "timed batches per variant and round")
    warmup: int = option(3, "batches before the timed ones (run once per variant)")
    rounds: int = option(5, "rounds; each times every variant once; medians reported")
    threads: int = option(os.cpu_count(), "torch.set_num_threads")
    bf16: bool | None = option(None, "bf16 autocast (default: the trainer's, on for CPUs with AMX or AVX512_BF16)")
    variants: list[str] = option(help="compared variants (module docstring); 'ours' is required, every ratio is "
                                      "against it", factory=lambda: list(DEFAULT_VARIANTS), choices=list(VARIANTS),
                                 nargs="+")
    data_dir: str = option("data", "the CS224N CSV files", metavar="DIR")
    pretrained: str | None = option(None, "checkpoint dir (default: embedded MiniLM)", metavar="DIR")
    square: int = option(2048, "side of the square matmul of the peak (0: none)")
    no_memory: bool = option(False, "skip the peak-memory children")
    profile: bool = option(False, "also break ours' step down by phase and op category")
    json: str | None = option(None, "write every number to this JSON file", metavar="OUT")


def build_parser() -> Parser:
    ap = Parser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n")[0])
    add_options(ap, MultitaskBenchOptions)
    return ap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = build_parser()
    args = ap.parse_args(argv)

    configure_malloc()  # as train_multitask.main does: the step is timed as training runs it
    # The tasks' batches, as benchmarks/README.md's tables measured them: the default's SST phrase batches (short,
    # the SST head's) are left out.
    cfg = TrainConfig(data_dir=args.data_dir, pretrained=args.pretrained, bf16=args.bf16,
                      stream_files={PHRASES: None})
    res = benchmark(cfg, args.variants, steps=args.steps, warmup=args.warmup, rounds=args.rounds,
                    memory=not args.no_memory, profile=args.profile, threads=args.threads, square=args.square)
    return report(res, "benchmarks.bench_multitask", argv, markdown, args.json)


def report(res: dict[str, Any], module: str, argv: Sequence[str] | None, render: Callable[[dict], str],
           json_out: str | None) -> dict[str, Any]:
    """A benchmark's end: its command into ``res``, the rendered table on stdout, every number to ``json_out``."""
    res["command"] = f"python -m {module} " + " ".join(sys.argv[1:] if argv is None else argv)
    print(render(res))
    if json_out:
        write_text(Path(json_out), json.dumps(res, indent=1, default=str))
    return res


if __name__ == "__main__":
    main()
