"""Plug-in training objectives: one interface, a registry by name.

Usage:
    from tasks.objectives import REGISTRY, build_objectives
    objectives = build_objectives({"mnr": {"scale": 20.0}}, model)
    for obj in objectives:
        if obj.applies_to(task):
            terms.update(obj(model, task, batch, out))   # named loss terms

An objective is an ``nn.Module`` subclass of :class:`Objective` with:
- ``name``: its registry key (a duplicate name raises at import);
- ``Config``: a dataclass of its hyper-parameters; every field becomes a CLI flag
  ``--<name>-<field>`` and ``weight`` always exists (the factor on its terms);
- ``tasks``: the tasks it applies to (``"nli"`` is the NLI triplet stream);
- ``needs_siamese``: True when it reads per-sentence pair features;
- ``batch_coupled``: True when its loss couples the batch's examples (under
  torchrun it then sees the rank's shard, not the global batch);
- ``task_loss_scale``: the factor it puts on the head's own loss for those tasks
  (e.g. 1 - λ for SCL's (1 - λ)·CE + λ·L_SCL); 1.0 for additive objectives;
- ``forward(model, task, batch, out) -> dict[str, Tensor]``: unweighted loss terms;
  ``out`` is the head's TaskOutput for this batch (None for the "nli" stream);
- optional hooks ``on_step_end(model)`` (after the optimizer step: momentum
  encoders, queues) and ``on_train_start(model, trainer)``.

The trainer multiplies each term by ``config.weight`` and the task's loss weight,
sums, and logs every term under ``<task>/<objective>.<term>``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
from torch import nn

REGISTRY: dict[str, type["Objective"]] = {}


@dataclass
class ObjectiveConfig:
    weight: float = 1.0


class Objective(nn.Module, abc.ABC):
    name: ClassVar[str] = ""
    Config: ClassVar[type] = ObjectiveConfig
    tasks: ClassVar[tuple[str, ...]] = ()
    # True when the objective reads Siamese features (sts_1/sts_2, pooled_1/2): the
    # CLI refuses it with --pair-encoding cross before any work starts.
    needs_siamese: ClassVar[bool] = False
    # True when the loss couples the examples of a batch (in-batch negatives, batch mixing, a
    # queue filled from the batch). Under torchrun such an objective sees each rank's shard of
    # the global batch as its batch (tasks/distributed.py); the trainer warns.
    batch_coupled: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.name:
            return  # an abstract helper base
        if cls.name in REGISTRY:
            raise ValueError(f"objective name {cls.name!r} registered twice "
                             f"({REGISTRY[cls.name].__module__} and {cls.__module__})")
        REGISTRY[cls.name] = cls

    def __init__(self, config: Any, model: nn.Module | None = None):
        super().__init__()
        self.config = config

    @property
    def weight(self) -> float:
        return float(self.config.weight)

    @property
    def task_loss_scale(self) -> float:
        return 1.0

    def applies_to(self, task: str) -> bool:
        return task in self.active_tasks()

    def active_tasks(self) -> tuple[str, ...]:
        chosen = getattr(self.config, "tasks", None)
        return tuple(chosen) if chosen else self.tasks

    @abc.abstractmethod
    def forward(self, model: nn.Module, task: str, batch: dict, out) -> dict[str, torch.Tensor]:
        """The objective's unweighted loss terms for this batch (may be empty)."""

    def on_step_end(self, model: nn.Module) -> None:
        pass


def check_tasks(objective: str, chosen, allowed: tuple[str, ...], why: str = "") -> None:
    """Refuse task names an objective cannot use, with the allowed ones (and why) in the message."""
    bad = sorted(set(chosen) - set(allowed))
    if bad:
        raise ValueError(f"{objective} tasks must be among {allowed}{why}, got {bad}")


def config_fields(name: str) -> list:
    return list(fields(REGISTRY[name].Config))


def build_objectives(settings: dict[str, dict[str, Any]], model: nn.Module) -> list[Objective]:
    """Instantiate the named objectives with their config overrides; unknown names/fields raise."""
    import_all()
    objs = []
    for name, overrides in settings.items():
        if name not in REGISTRY:
            raise ValueError(f"unknown objective {name!r}; known: {sorted(REGISTRY)}")
        cls = REGISTRY[name]
        known = {f.name for f in fields(cls.Config)}
        bad = set(overrides) - known
        if bad:
            raise ValueError(f"objective {name!r} has no option(s) {sorted(bad)}; options: {sorted(known)}")
        objs.append(cls(cls.Config(**overrides), model))
    return objs


def import_all() -> None:
    """Import every objective module so each registers itself."""
    import importlib
    import pkgutil

    for m in pkgutil.iter_modules(__path__):
        if not m.name.startswith("_"):
            importlib.import_module(f"{__name__}.{m.name}")
