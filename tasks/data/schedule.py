"""Multitask schedules (which task's batch comes next) and per-task loss weights.

Three schedules over the per-task batches of one epoch:
  sequential   all batches of the first task, then the next task, ... (the CS224N starter)
  round_robin  one batch of each task in turn; a task that runs out drops out
  even         every task's batches, one batch size, shuffled together: the
               paper's "even batching" (minbert-downstream-generalization §4.2)
Per-task batches are length-bucketed (tasks.data.datasets.length_bucketed_batches) and
every plan is a pure function of (seed, epoch), so ``--resume`` rebuilds the
same plan and skips the steps already done.

Usage:
    sched = MultitaskSchedule({"sst": sst.lengths, "para": para.lengths}, 32, "even", seed=0)
    for step, (task, indices) in enumerate(sched.epoch_plan(epoch)):
        batch = datasets[task].collate(indices)
        loss = LossWeights({"para": 0.1}).get(task) * task_loss(batch)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tasks.data.datasets import length_bucketed_batches

SCHEDULES = ("sequential", "round_robin", "even")


SUBSETS = ("fresh", "cycle")


def _generator(*key: object) -> torch.Generator:
    """A torch.Generator seeded from ``key`` through a stable hash.

    Python's hash() of a str changes between processes, and seed+epoch
    arithmetic makes (seed 0, epoch 1) collide with (seed 1, epoch 0); sha256
    of the key's repr has neither problem.
    """
    digest = hashlib.sha256(repr(key).encode()).digest()
    g = torch.Generator()
    g.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return g


class MultitaskSchedule:
    """The batches of every task for one epoch, in the order a schedule gives them.

    ``task_lengths`` maps each task to its per-example lengths (a dataset's
    ``.lengths``); task order is the dict's order. ``max_examples_per_epoch``
    caps a task's examples per epoch: each epoch draws a fresh seeded random
    subset of that size (so a CPU run can use a slice of Quora and still see
    different pairs each epoch); None or a missing task means all examples.
    ``bucket=False`` gives plain random batches.

    ``subsets="cycle"`` instead walks through one seeded shuffle of the task
    per pass: epoch e takes the next ``cap`` examples, so no example repeats
    before all were seen (independent "fresh" draws repeat some examples
    while others are never drawn). ``swap`` maps a pair task to the probability
    that a training pair is shown as (b, a): its index becomes ``i + N`` (see
    tasks.data.datasets.PairDataset), drawn per (seed, epoch, task).
    """

    def __init__(
        self,
        task_lengths: dict[str, list[int]],
        batch_size: int | dict[str, int],
        schedule: str = "even",
        seed: int = 0,
        max_examples_per_epoch: dict[str, int | None] | None = None,
        bucket: bool = True,
        bucket_batches: int = 50,
        subsets: str = "fresh",
        swap: dict[str, float] | None = None,
        first: Sequence[str] = (),
    ) -> None:
        # What a run's settings are (schedule and subsets names, equal batch sizes for even batching, positive
        # caps, probabilities) is TrainConfig.validate's to check: the schedule trusts them.
        swap = {t: p for t, p in (swap or {}).items() if p > 0}
        if not task_lengths:
            raise ValueError("a schedule needs at least one task")
        if set(first) - set(task_lengths):
            raise ValueError(f"first names {sorted(set(first) - set(task_lengths))}, which are not tasks of this "
                             "schedule")
        empty = [t for t, lengths in task_lengths.items() if len(lengths) == 0]
        if empty:
            raise ValueError(f"task(s) {empty} have no examples; leave them out of the schedule")
        tasks = list(task_lengths)
        batch_sizes = {t: batch_size for t in tasks} if isinstance(batch_size, int) else dict(batch_size)
        caps = dict(max_examples_per_epoch or {})
        unknown = set(caps) - set(tasks)
        if unknown:
            raise ValueError(f"max_examples_per_epoch names unknown task(s) {sorted(unknown)}; tasks are {tasks}")

        self.tasks = tasks
        self.task_lengths = {t: list(lengths) for t, lengths in task_lengths.items()}
        self.batch_sizes = batch_sizes
        self.schedule = schedule
        self.seed = seed
        # A cap at or above the task size is no cap at all.
        self.caps = {t: c for t, c in caps.items() if c is not None and c < len(task_lengths[t])}
        self.bucket_batches = bucket_batches if bucket else 1
        self.subsets = subsets
        self.swap = swap
        self.first = tuple(first)

    def examples_per_epoch(self, task: str) -> int:
        """How many of ``task``'s examples one epoch uses (its cap, or all)."""
        return self.caps.get(task, len(self.task_lengths[task]))

    def steps_per_epoch(self) -> int:
        """Number of batches in an epoch's plan (the same for every epoch)."""
        return sum(-(-self.examples_per_epoch(t) // self.batch_sizes[t]) for t in self.tasks)

    def task_batches(self, task: str, epoch: int) -> list[list[int]]:
        """``task``'s batches for ``epoch`` (indices into its dataset), before interleaving.

        Seeded per (seed, epoch, task) so adding or dropping another task does
        not change this task's batches.
        """
        g = _generator("task", self.seed, epoch, task)
        lengths = self.task_lengths[task]
        if task not in self.caps:
            subset = list(range(len(lengths)))
        elif self.subsets == "cycle":
            subset = self._cycled(task, epoch)
        else:
            subset = torch.randperm(len(lengths), generator=g)[: self.caps[task]].tolist()
        batches = length_bucketed_batches(
            [lengths[i] for i in subset], self.batch_sizes[task], True, g, self.bucket_batches
        )
        batches = [[subset[j] for j in b] for b in batches]
        if task in self.swap:
            n = len(lengths)
            flips = iter((torch.rand(sum(map(len, batches)), generator=_generator("swap", self.seed, epoch, task))
                          < self.swap[task]).tolist())
            batches = [[i + n if next(flips) else i for i in b] for b in batches]
        return batches

    def _cycled(self, task: str, epoch: int) -> list[int]:
        """Epoch ``epoch``'s ``cap`` examples: the next ones of consecutive seeded shuffles (passes)."""
        n, cap = len(self.task_lengths[task]), self.caps[task]
        start = epoch * cap
        subset: list[int] = []
        while len(subset) < cap:
            p, offset = divmod(start + len(subset), n)
            shuffle = torch.randperm(n, generator=_generator("pass", self.seed, task, p)).tolist()
            subset += shuffle[offset: offset + cap - len(subset)]
        return subset

    def epoch_plan(self, epoch: int) -> list[tuple[str, list[int]]]:
        """(task, indices) for every step of ``epoch``; a pure function of (seed, epoch).

        No global RNG is touched, so ``plan[k:]`` after a resume equals the
        rest of the interrupted epoch. The batches of the ``first`` tasks open
        the epoch (in their own shuffled order); the schedule orders the rest.
        """
        per_task = {t: self.task_batches(t, epoch) for t in self.tasks}
        if self.first:
            opening = [(t, b) for t in self.first for b in per_task.pop(t)]
            return opening + self._ordered(per_task, epoch)
        return self._ordered(per_task, epoch)

    def _ordered(self, per_task: dict[str, list[list[int]]], epoch: int) -> list[tuple[str, list[int]]]:
        """The steps of ``per_task``'s batches in the order the schedule gives them."""
        if self.schedule == "sequential":
            return [(t, b) for t in per_task for b in per_task[t]]
        if self.schedule == "round_robin":
            rounds = max(len(bs) for bs in per_task.values())
            return [(t, per_task[t][r]) for r in range(rounds) for t in per_task if r < len(per_task[t])]
        # even (§4.2): shuffle at the batch level across all tasks.
        steps = [(t, b) for t in per_task for b in per_task[t]]
        order = torch.randperm(len(steps), generator=_generator("order", self.seed, epoch)).tolist()
        return [steps[i] for i in order]


@dataclass
class LossWeights:
    """Per-stream loss multipliers; the trainer sums weight * loss over the streams of a step.

    §4.2 "loss rescaling" (``--loss-weights para=0.1``): Quora is many times larger
    than SST or STS, so its loss is multiplied by 0.1 to keep its pull on the
    shared encoder comparable while still seeing all its data. A stream never
    named (any task, "nli", "phrases") weighs 1.0.
    """

    weights: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = {t: w for t, w in self.weights.items() if not w >= 0.0}
        if bad:
            raise ValueError(f"loss weights must be non-negative numbers, got {bad}")

    def get(self, stream: str) -> float:
        """The weight of ``stream`` (1.0 for one never mentioned)."""
        return self.weights.get(stream, 1.0)

