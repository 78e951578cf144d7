"""Resuming an interrupted MLM pretraining (tasks/pretrain.py) where it stopped, to the same weights.

Every ``--checkpoint-every`` steps ``pretrain`` writes its whole state to
``<out-dir>.partial`` (``partial_dir``), replaced atomically
(tasks/checkpoint.atomic_directory: a kill mid-write keeps the previous one):

    model.safetensors      the MLM's weights (encoder and head)
    optimizer.safetensors  AdamW's moments (tasks/checkpoint.optimizer_state: no pickle)
    rng.safetensors        torch's global RNG (dropout), the batch/mask generator, and that
                           generator's state when the current epoch's batch order was drawn
    state.json             the position (step, epoch, batches done in it), the log records and
                           the open log window's sums and time, the optimizer's groups, and the identity
                           (settings and a hash of the sentences) a resumed call must match

A resumed call draws the epoch's batch order again from its saved start
state, skips the batches done, and goes on with the saved generator: the same
masks, dropout and updates as without the interruption.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from torch import nn

from tasks.checkpoint import (atomic_directory, load_optimizer_state, load_tensors, optimizer_state, read_json,
                              save_tensors, write_json)


@dataclass
class Progress:
    """Where a pretraining run stands: ``step`` steps taken, ``done_in_epoch`` batches of epoch ``epoch`` done,
    whose batch order was drawn from ``epoch_rng`` (the generator's state at the epoch's start)."""

    step: int = 0
    epoch: int = 0
    done_in_epoch: int = 0
    epoch_rng: torch.Tensor | None = None
    records: list[dict] = field(default_factory=list)
    window_loss: float = 0.0  # the log window's running sums, so the next log line is the uninterrupted one's
    window_steps: int = 0
    window_tokens: int = 0
    window_seconds: float = 0.0  # and its training time so far, so its speed is not taken over the resumed part


def partial_dir(out_dir: str | os.PathLike[str]) -> Path:
    """Where a run writing ``out_dir`` keeps its state for resuming (``<out-dir>.partial``)."""
    out = Path(out_dir)
    return out.with_name(out.name + ".partial")


def save_progress(state: Path, identity: dict, mlm: nn.Module, opt: torch.optim.Optimizer, names: list[str],
                  g: torch.Generator, where: Progress) -> None:
    """Everything a resumed call needs, in ``state`` (replaced atomically: a kill mid-write keeps the last)."""
    tensors, meta = optimizer_state(opt, names)
    with atomic_directory(state) as tmp:
        save_tensors(tmp / "model.safetensors", mlm.state_dict())
        save_tensors(tmp / "optimizer.safetensors", tensors)
        save_tensors(tmp / "rng.safetensors", {"torch": torch.get_rng_state(), "generator": g.get_state(),
                                               "epoch_generator": where.epoch_rng})
        write_json(tmp / "state.json", {"identity": identity, "optimizer": meta,
                                        **{f.name: getattr(where, f.name) for f in fields(Progress)
                                           if f.name != "epoch_rng"}})


def load_progress(state: Path, identity: dict, mlm: nn.Module, opt: torch.optim.Optimizer, names: list[str],
                  g: torch.Generator) -> Progress:
    """The saved run's weights, optimizer and RNG states put back; its position returned. A run with other
    settings or data is refused, naming what differs."""
    saved = read_json(state / "state.json")
    if saved["identity"] != identity:
        mine, theirs = _flat(identity), _flat(saved["identity"])
        differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        raise ValueError(f"{state} holds an interrupted pretraining with other settings or data ("
                         + ", ".join(f"{k}: {theirs.get(k)!r} there, {mine.get(k)!r} now" for k in differ[:4])
                         + f"): run its command again to continue it, or delete {state} to start afresh")
    mlm.load_state_dict(load_tensors(state / "model.safetensors"))
    load_optimizer_state(opt, load_tensors(state / "optimizer.safetensors"), saved["optimizer"], names)
    rng = load_tensors(state / "rng.safetensors")
    torch.set_rng_state(rng["torch"])
    g.set_state(rng["generator"])
    saved.setdefault("window_seconds", 0.0)  # a state saved before the window's time was kept
    return Progress(epoch_rng=rng["epoch_generator"],
                    **{f.name: saved[f.name] for f in fields(Progress) if f.name != "epoch_rng"})


def _flat(d: dict, prefix: str = "") -> dict:
    """{"a.b": value} of nested dicts, for naming what differs."""
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out
