"""What an optimizer step acts on and how far it goes: AdamW's parameter groups, per-parameter learning-rate factors,
the learning rate over the steps, and a fine-tuning run's plan of batches.

One rule for every loop: fine-tuning (tasks/training/trainer.py), MLM pretraining (tasks/training/pretraining.py)
and the benchmarks build their AdamW with ``adamw`` and their learning rate with ``warmup_linear``.

Usage:
    params, names, opt = adamw(model.named_parameters(), lr=2e-5, weight_decay=0.01,
                               lr_scale_of=lambda n: lr_scale(n, layers=6, layer_decay=0.9, head_scale=10))
    lr = warmup_linear(2e-5, t=step, total=1000, warm=100)
    schedule = build_schedule(cfg, cfg.resolve(), train_sets)   # the epochs' (stream, batch) steps
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from torch import nn

from minbert.optimizer import AdamW
from tasks.train_config import TrainConfig
from tasks.data.schedule import MultitaskSchedule
from tasks.run_tasks import RunTasks


def lr_scale(name: str, layers: int, layer_decay: float, head_scale: float) -> float:
    """The factor on the lr of the parameter ``name`` (as in ``Trainer.param_names``).

    Layer-wise decay (Sun et al. 2019, "How to Fine-Tune BERT for Text
    Classification" §5.3): encoder layer i of ``layers`` (0 = the lowest) at
    ``layer_decay^(layers-1-i)``, the embeddings at ``layer_decay^layers``, the
    pooler at 1. Everything outside the encoder (heads, objectives) at ``head_scale``.
    """
    prefix = "model.encoder."
    if not name.startswith(prefix):
        return head_scale
    rest = name[len(prefix):]
    if rest.startswith("embeddings."):
        return layer_decay ** layers
    if rest.startswith("encoder.layer."):
        return layer_decay ** (layers - 1 - int(rest.split(".")[2]))
    return 1.0


def parameter_groups(named: Sequence[tuple[str, nn.Parameter]], weight_decay: float,
                     lr_scale_of: Callable[[str], float] = lambda name: 1.0) -> tuple[list[dict], list[str]]:
    """AdamW's parameter groups of the trainable ``named`` parameters (a parameter shared under two names counts
    once), and the parameters' names in group order (a checkpoint's optimizer state names them).

    One group per (lr factor, decays or not): matrices decay, biases and LayerNorm weights (ndim < 2) do not, as
    in BERT; a group whose factor (``lr_scale_of(name)``) is not 1 carries it as ``lr_scale``, which multiplies the
    step's lr (``Loop.train_step``).
    """
    seen: set[int] = set()
    unique = []
    for n, p in named:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            unique.append((n, p))
    by_key: dict[tuple[float, bool], list[tuple[str, nn.Parameter]]] = {}
    for decays in (True, False):
        for n, p in unique:
            if (p.ndim >= 2) == decays:
                by_key.setdefault((lr_scale_of(n), decays), []).append((n, p))
    groups = [{"params": [p for _, p in members], "weight_decay": weight_decay if decays else 0.0}
              | ({"lr_scale": scale} if scale != 1 else {}) for (scale, decays), members in by_key.items()]
    return groups, [n for members in by_key.values() for n, _ in members]


def adamw(named: Iterable[tuple[str, nn.Parameter]], *, lr: float, weight_decay: float,
          lr_scale_of: Callable[[str], float] = lambda name: 1.0, foreach: bool = False,
          fused: bool = False) -> tuple[list[nn.Parameter], list[str], AdamW]:
    """(the parameters in group order, their names, our AdamW over ``parameter_groups``) with torch's order of
    decay and update (``decay="before"``, which the fused kernel implements)."""
    groups, names = parameter_groups(list(named), weight_decay, lr_scale_of)
    opt = AdamW(groups, lr=lr, decay="before", foreach=foreach, fused=fused)
    return [p for g in groups for p in g["params"]], names, opt


def warmup_linear(peak: float, t: int, total: int, warm: int, decay: bool = True) -> float:
    """The learning rate of step ``t`` (from 0) of ``total``: BERT's linear warm-up over the first ``warm`` steps
    to ``peak``, then a linear decay to 0 at ``total`` (``decay``) or ``peak`` on (MLM's "constant")."""
    if t < warm:
        return peak * (t + 1) / warm
    return peak * (total - t) / max(total - warm, 1) if decay else peak


def build_schedule(cfg: TrainConfig, run: RunTasks, train_sets: dict) -> MultitaskSchedule:
    """The run's epoch plans (tasks/data/schedule.py) over its tokenized training sets, as ``cfg`` says and ``run``
    (its tasks and streams resolved: ``TrainConfig.resolve``) batches and caps them."""
    first = tuple(name for name, stream in run.extra.items() if stream.order == "first" and name in train_sets)
    return MultitaskSchedule({s: d.lengths for s, d in train_sets.items()}, run.step_batch_sizes, cfg.schedule,
                             seed=cfg.seed, subsets=cfg.train_subsets,
                             max_examples_per_epoch={s: n for s, n in run.caps.items() if s in train_sets},
                             swap={t: cfg.pair_swap for t in run.tasks if run.entries[t].symmetric and t in train_sets},
                             first=first)
