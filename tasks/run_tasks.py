"""A run's tasks resolved once: ``RunTasks``, what a run trains and blends as its configuration and its tasks'
declarations say together (``TrainConfig.resolve``).

It is resolved where a run or an evaluation starts (tasks.training.run.prepare_run, the evaluator of a checkpoint)
and handed down: to the data a run reads (tasks.selection), its model's heads (its entries), its schedule, batches
and loss weights (tasks.training), and its priors (tasks.evaluation.priors). Nothing downstream derives a stream's
setting again, and nothing looks a task up by name in a registry: a task's entry is ``entries[name]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tasks.model import NLI
from tasks.task import ExtraStream, Prior, Task, Tasks


@dataclass(frozen=True)
class RunTasks:
    """A run's tasks, its streams and its priors, each setting resolved (given by a flag, declared by a task file,
    or the general setting's).

    ``extra``: the extra labelled streams it trains (SST's phrases, a task file's ``<name>_phrases``) by name, each
    with the file, fewest words and order it trains with; ``batch_sizes``: examples per micro-batch by stream;
    ``caps``: training examples an epoch by capped stream (streams the run does not train may be named: idle);
    ``weights``: loss factors by stream named (any other weighs 1); ``priors``: the priors blended in at evaluation
    (weight above 0) by task; ``triplets``: the entry whose NLI triplets the run trains (--nli: the first of the
    model's tasks that declares them, STS's by default), None without; ``accumulation``: micro-batches an optimizer
    step."""

    tasks: tuple[str, ...]
    entries: Tasks
    extra: Mapping[str, ExtraStream]
    priors: Mapping[str, Prior]
    batch_sizes: Mapping[str, int]
    caps: Mapping[str, int]
    weights: Mapping[str, float]
    triplets: Task | None = None
    accumulation: int = 1

    @property
    def nli(self) -> bool:
        """Whether the run trains NLI triplets (--nli)."""
        return self.triplets is not None

    @property
    def streams(self) -> tuple[str, ...]:
        """The schedule's streams: the tasks, then their extra streams and "nli" when on."""
        return self.tasks + tuple(self.extra) + ((NLI,) if self.nli else ())

    @property
    def step_batch_sizes(self) -> dict[str, int]:
        """Examples per optimizer step, by stream: the micro-batch times ``accumulation``."""
        return {s: b * self.accumulation for s, b in self.batch_sizes.items()}

    @property
    def declared(self) -> tuple[str, ...]:
        """Every extra stream the run's tasks declare, trained or off."""
        return tuple(self.entries[t].stream.name for t in self.tasks if self.entries[t].stream is not None)

    @property
    def idle(self) -> tuple[str, ...]:
        """The extra streams the tasks known to the run declare (the package's and its own) that it does not train:
        their settings are idle here."""
        return tuple(e.stream.name for e in self.entries.values()
                     if e.stream is not None and e.stream.name not in self.extra)


__all__ = ("RunTasks",)
