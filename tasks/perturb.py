"""Perturbed training sets for the robustness evaluations the papers report.

Three perturbations of one task's training examples (few-shot subsets, label
noise, a shrunken minority class), ``perturb`` to apply one experiment to every
task it changes, and ``perturbed_data_dir`` to write the result as a data
directory a training run reads like the original (python -m tasks.robustness,
experiments/robustness_table.py).

Usage:
    few = few_shot(examples, n=100, seed=0)                        # N examples, class-stratified
    noisy, flipped = label_noise(examples, rate=0.1, num_classes=5, seed=0)
    skewed = minority(examples, label=0, keep=0.1, seed=0)         # keep 10% of class 0
    changed = perturb("label-noise", train, seed=0, rate=0.1)      # {task: examples}
    perturbed_data_dir(Path("data"), Path("runs/noise/data-0"), changed)

Every function is deterministic in its seed (an explicit generator, never the
global RNG) and hits the requested count exactly: rates are turned into counts
with round(), and tests check the counts.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import torch

from tasks.data.readers import Example
from tasks.storage import write_text
from tasks.task import PACKAGE, Task, Tasks, get_task


# ---- perturbations of one task's training examples ----
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def few_shot(examples: Sequence[Example], n: int, seed: int) -> list[Example]:
    """``n`` training examples drawn without replacement, stratified by label for classes.

    Classification labels (ints) get per-class quotas proportional to the class
    frequencies (largest remainders), so rare classes are not lost by chance;
    float labels (STS) are drawn uniformly. ``n`` ≥ len(examples) returns all.
    """
    if n <= 0:
        raise ValueError(f"few-shot size must be positive, got {n}")
    if n >= len(examples):
        return list(examples)
    g = _gen(seed)
    if not all(isinstance(e.label, int) for e in examples):
        idx = torch.randperm(len(examples), generator=g)[:n].sort().values
        return [examples[i] for i in idx.tolist()]
    by_class: dict[int, list[int]] = defaultdict(list)
    for i, e in enumerate(examples):
        by_class[e.label].append(i)
    classes = sorted(by_class)
    exact = {c: n * len(by_class[c]) / len(examples) for c in classes}
    quota = {c: int(exact[c]) for c in classes}
    for c in sorted(classes, key=lambda c: exact[c] - quota[c], reverse=True)[: n - sum(quota.values())]:
        quota[c] += 1
    chosen: list[int] = []
    for c in classes:
        pool = by_class[c]
        pick = torch.randperm(len(pool), generator=g)[: quota[c]].tolist()
        chosen.extend(pool[i] for i in pick)
    return [examples[i] for i in sorted(chosen)]


def label_noise(examples: Sequence[Example], rate: float, num_classes: int, seed: int
                ) -> tuple[list[Example], list[int]]:
    """Flip exactly round(rate · N) labels, each to a different class chosen uniformly.

    Returns the new examples and the indices that were flipped.
    """
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"label-noise rate must be in [0, 1], got {rate}")
    if num_classes < 2:
        raise ValueError("label noise needs at least two classes")
    g = _gen(seed)
    k = round(rate * len(examples))
    flip = torch.randperm(len(examples), generator=g)[:k].sort().values.tolist()
    out = list(examples)
    for i in flip:
        y = int(out[i].label)
        offset = int(torch.randint(1, num_classes, (1,), generator=g))
        out[i] = dataclasses.replace(out[i], label=(y + offset) % num_classes)
    return out, flip


def minority(examples: Sequence[Example], label: int, keep: float, seed: int) -> list[Example]:
    """Keep round(keep · n_label) examples of class ``label`` and every other example."""
    if not 0.0 <= keep <= 1.0:
        raise ValueError(f"minority keep rate must be in [0, 1], got {keep}")
    of_class = [i for i, e in enumerate(examples) if e.label == label]
    if not of_class:
        raise ValueError(f"no training example has label {label}")
    g = _gen(seed)
    k = round(keep * len(of_class))
    kept = {of_class[i] for i in torch.randperm(len(of_class), generator=g)[:k].tolist()}
    return [e for i, e in enumerate(examples) if e.label != label or i in kept]

# ---- one experiment's perturbed training sets, written as a data directory ----


def write_task_file(path: Path, task: str | Task, examples: Sequence[Example]) -> None:
    """Write examples in the format the task's entry reads (the CS224N files: tab-separated, index column first;
    a pair classification's labels as Quora writes them, 0.0 / 1.0), whole or not at all."""
    entry = get_task(task)
    layout = entry.layout
    buf = io.StringIO()
    w = csv.writer(buf, delimiter=layout.fmt.delimiter or "\t")
    w.writerow(["", layout.id or "id", *layout.text, layout.label])
    for i, e in enumerate(examples):
        texts = (e.text_a, e.text_b)[:len(layout.text)]  # the file's text columns: one, or a pair's two
        w.writerow([i, e.id, *texts, entry.kind.file_label(e.label)])
    write_text(path, buf.getvalue())


def perturbed_data_dir(src: Path, dst: Path, changed: dict[str, list[Example]], tasks: Tasks | None = None) -> Path:
    """A data directory whose train files for ``changed`` tasks (of ``tasks``; default: the package's) are
    rewritten; everything else is linked. A task whose train file is not a name in the data directory (a user's
    task reads its own files) is a ValueError."""
    tasks = tasks if tasks is not None else PACKAGE
    own = [t for t in changed if Path(tasks[t].files["train"]).name != tasks[t].files["train"]]
    if own:
        raise ValueError(f"task {own[0]!r} reads its own train file ({tasks[own[0]].files['train']}), not one in "
                         "--data-dir: a perturbed copy cannot stand in for it; perturbation experiments take the "
                         "built-in tasks")
    dst.mkdir(parents=True, exist_ok=True)
    rewritten = {tasks[t].files["train"] for t in changed}
    for f in sorted(src.iterdir()):
        if f.suffix == ".csv" and f.name not in rewritten:
            link = dst / f.name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(f.resolve())
    for task, examples in changed.items():
        write_task_file(dst / tasks[task].files["train"], tasks[task], examples)
    return dst


def perturb(command: str, train: dict[str, list[Example]], seed: int, *, n: int = 0, rate: float = 0.0,
            task: str = "sst", label: int = 0, keep: float = 1.0) -> dict[str, list[Example]]:
    """The training sets one experiment changes, for one seed (exact counts, seeded: see above).

    few-shot: ``n`` examples of every task in ``train``; label-noise: ``rate`` of every
    classification task's labels flipped to another class; minority: ``keep`` of class
    ``label`` of ``task``.
    """
    if command == "few-shot":
        return {t: few_shot(train[t], n, seed) for t in train}
    if command == "label-noise":
        return {t: label_noise(train[t], rate, get_task(t).num_classes, seed)[0] for t in train
                if get_task(t).kind.classification}
    if command == "minority":
        return {task: minority(train[task], label, keep, seed)}
    raise ValueError(f"unknown experiment {command!r}")

