"""Robustness evaluations: accuracy under an embedding-space attack, and scores over seeds of models trained on
perturbed training sets (few-shot, label noise, a shrunken minority class).

``attack`` measures a trained model's accuracy on the dev sets under PGD on the
word embeddings (per-token ε-balls, L2 or L∞) maximizing the true label's loss
(tasks.objectives.rift.pgd_attack). It approximates the word-substitution
attacks of the RIFT/KNN-BERT papers: the adversarial inputs are points in
embedding space, not real words. An example counts after the attack when its
clean and attacked predictions are both right.

``perturbation_experiment`` runs every setting of one perturbation once per
seed: the perturbed training files (tasks.perturb: exact counts, seeded) in
``<out_dir>/data-<setting>-seed<k>`` (the dev and test files linked to the
originals), one training run on them into ``<out_dir>/<setting>-seed<k>``, and
the dev scores as mean ± std over the seeds; ``minority`` adds the accuracy on
the reduced class. The training run is the caller's ``train`` (the robustness
command's: tasks.training.run.run with the config it checked), which returns the
run's dev scores.

Usage:
    results = attack(AttackConfig(checkpoint="runs/x/checkpoints/best", tasks=["sst"], steps=3))
    results = perturbation_experiment("few-shot", [("n100", {"n": 100})], ["sst", "para"], [0, 1], Path("data"),
                                      Path("runs/fs"), train)   # train(data_dir, run_dir, seed) -> dev scores
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from tasks.checkpoint import load_model, resolve_checkpoint
from tasks.data.datasets import move_batch
from tasks.data.readers import Example
from tasks.objectives.rift import pgd_attack
from tasks.logs import count
from tasks.options import option
from tasks.perturb import perturb, perturbed_data_dir
from tasks.predictions import read_predictions
from tasks.runtime import resolve_device
from tasks.selection import make_dataset
from tasks.task import BUILTIN, get_task, load_split
from tasks.training.progress import RunsClock, duration

log = logging.getLogger(__name__)

CLASSIFICATION = tuple(t for t in BUILTIN if get_task(t).kind.classification)  # the course's ones
PROGRESS_EVERY_S = 30  # a progress line of the attack at most this often


@dataclass
class AttackConfig:
    """attack: accuracy under an embedding-space PGD attack."""

    checkpoint: str = option(help="a checkpoint directory (runs/x/checkpoints/best)", metavar="DIR", factory=str)
    data_dir: str = option("data", "the task CSV files (dev sets are attacked)", metavar="DIR")
    tasks: list[str] = option(help="tasks attacked", factory=lambda: ["sst", "para"], choices=CLASSIFICATION,
                              nargs="+")
    norm: str = option("linf", "the per-token ball", choices=("l2", "linf"))
    epsilon: float = option(0.01, "per-token ball radius in embedding space", metavar="EPS")
    step_size: float = option(0.0025, "PGD step", metavar="STEP")
    steps: int = option(10, "PGD steps", metavar="N")
    batch_size: int = option(64, "examples per forward pass", metavar="B")
    limit: int | None = option(None, "attack only the first N dev examples; default: all", metavar="N")
    device: str = option("auto", "auto (CUDA when present), cpu, cuda, ...", metavar="DEVICE")
    seed: int = option(0, "the attack's random start", metavar="SEED")


@torch.no_grad()
def attack(config: AttackConfig) -> dict:
    """{checkpoint, norm, epsilon, steps, step_size, tasks: {task: {examples, clean_acc, after_attack_acc,
    attack_success_rate}}}: the checkpoint's dev accuracy on each task before and under the attack. A task the
    checkpoint was not trained on is a ValueError naming --tasks."""
    c = config
    device = resolve_device(c.device)
    model, _, tokenizer, cfg = load_model(resolve_checkpoint(c.checkpoint), device)
    model.eval()
    g = torch.Generator(device=device.type).manual_seed(c.seed)
    results: dict = {"checkpoint": str(c.checkpoint), "norm": c.norm, "epsilon": c.epsilon,
                     "steps": c.steps, "step_size": c.step_size, "tasks": {}}
    missing = [task for task in c.tasks if task not in cfg.tasks]
    if missing:
        raise ValueError(f"--tasks {' '.join(missing)}: the checkpoint was not trained on it (it has "
                         f"{' '.join(cfg.tasks)})")
    log.info("%s | plan: PGD attack (%s, epsilon %g, %s of %g) on the dev sets of %s", device, c.norm,
             c.epsilon, count(c.steps, "step"), c.step_size, ", ".join(c.tasks))
    for task in c.tasks:
        ds = make_dataset(task, load_split(task, "dev", c.data_dir, limit=c.limit)[0], tokenizer, cfg)
        clean_ok = adv_ok = 0
        order = list(range(len(ds)))
        t0 = last = time.perf_counter()
        for start in range(0, len(order), c.batch_size):
            batch = move_batch(ds.collate(order[start:start + c.batch_size]), device)
            y = batch["labels"].long()
            clean = model.predict(task, model(task, batch))
            adv = pgd_attack(model, task, batch, norm=c.norm, epsilon=c.epsilon, step_size=c.step_size,
                             steps=c.steps, objective="ce", generator=g)
            attacked = model.predict(task, model(task, batch, inputs_embeds=adv))
            clean_ok += int((clean == y).sum())
            adv_ok += int(((attacked == y) & (clean == y)).sum())
            done, now = min(start + c.batch_size, len(order)), time.perf_counter()
            if now - last >= PROGRESS_EVERY_S and done < len(order):
                last = now
                log.info("%s: %d of %d examples attacked (%s; ~%s left)", task, done, len(order),
                         duration(now - t0), duration((now - t0) / done * (len(order) - done)))
        n = len(ds)
        results["tasks"][task] = {"examples": n, "clean_acc": clean_ok / n, "after_attack_acc": adv_ok / n,
                                  "attack_success_rate": 1 - adv_ok / clean_ok if clean_ok else math.nan}
        log.info("%s: %d examples in %s: clean accuracy %.4f, after the attack %.4f", task, n,
                 duration(time.perf_counter() - t0), clean_ok / n, adv_ok / n)
    return results


def class_accuracy(pred_csv: Path, examples: Sequence[Example], label: int) -> float:
    """Accuracy on the dev examples of one class, from a leaderboard prediction file (ours or the starter's): over
    those the file predicts (a run that read part of dev, --limit, predicts only those, and its dev scores are
    theirs); NaN when it predicts none of the class."""
    ids, preds = read_predictions(pred_csv)
    pred = dict(zip(ids, preds.tolist()))
    of_class = [e for e in examples if e.label == label and e.id in pred]
    return sum(pred[e.id] == label for e in of_class) / len(of_class) if of_class else math.nan


def _summary(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values)}


def perturbation_experiment(kind: str, settings: Sequence[tuple[str, dict]], tasks: Sequence[str],
                            seeds: Sequence[int], data_dir: Path, out_dir: Path,
                            train: Callable[[Path, Path, int], dict[str, float]]) -> dict[str, dict]:
    """{setting: {metric: {mean, std, n}, ..., "per_seed": [dev scores]}}: every setting × seed of the
    perturbation ``kind`` (tasks.perturb.perturb: few-shot, label-noise, minority; a setting is a name and its
    keyword arguments) of the training files of ``tasks`` in ``data_dir``. ``train(data, run_dir, seed)`` trains
    on the perturbed copy ``data`` into ``run_dir`` (replaced) and returns its dev scores; for ``minority`` the
    accuracy on the reduced class is read from the run's dev predictions."""
    train_sets = {t: load_split(t, "train", data_dir)[0] for t in tasks}
    results: dict[str, dict] = {}
    clock = RunsClock([1.0] * (len(settings) * len(seeds)))
    log.info("plan: %d training runs (%d settings x %d seeds), one after another", len(clock.costs),
             len(settings), len(seeds))
    for i, (name, s) in enumerate(settings):
        per_seed = []
        for j, seed in enumerate(seeds):
            changed = perturb(kind, train_sets, seed, **s)
            data = perturbed_data_dir(data_dir, out_dir / f"data-{name}-seed{seed}", changed)
            run_dir = out_dir / f"{name}-seed{seed}"
            dev = train(data, run_dir, seed)
            clock.done(i * len(seeds) + j, ran=True)
            log.info("%s", clock.line())
            if kind == "minority":
                dev_ex = load_split(s["task"], "dev", data_dir)[0]
                dev[f"{s['task']}_class{s['label']}_acc"] = class_accuracy(
                    run_dir / "predictions" / f"{s['task']}-dev-output.csv", dev_ex, s["label"])
            per_seed.append(dev)
        keys = sorted({k for d in per_seed for k in d})
        results[name] = {k: _summary([d[k] for d in per_seed if k in d]) for k in keys}
        results[name]["per_seed"] = per_seed
    return results
