"""How a run shows its progress: loss sums for the log lines, tqdm-safe logging, and training.png.

``RunningSums`` keeps each loss term summed on the device and turns the sums
into means (over every torchrun rank) when a log line or an epoch record asks;
``RunClock`` (a run) and ``RunsClock`` (a series of runs) give the elapsed and
remaining time for the log lines;
``progress_logging`` routes log lines around a tqdm bar on a terminal;
``plot_history`` draws the per-epoch records of metrics.jsonl as the run
directory's training.png.

Usage:
    sums = RunningSums()
    sums.add(terms)                 # each step: tensors stay on the device
    sums.means()                    # one device sync: {"loss": ..., "sst/loss": ...}
    with progress_logging():        # log lines go through tqdm.write while a bar is shown
        ...
    plot_history(history, "runs/x/training.png")    # history: the epoch records
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt  # noqa: E402
import torch
from matplotlib.ticker import MaxNLocator  # noqa: E402

from tasks.storage import atomic_file
from tasks.training import distributed


# ---- loss sums and progress lines ----
class RunningSums:
    """Loss terms summed on the device (no sync per step); read back as means on demand.

    ``share`` is this rank's fraction of the global batch (1 in one process):
    terms and counts are weighted by it, so that sums and counts added over
    the ranks give the means of the global batches.
    """

    def __init__(self, sums: dict[str, torch.Tensor] | None = None, counts: dict[str, float] | None = None) -> None:
        self.sums = sums or {}
        self.counts = counts or {}

    def add(self, terms: dict[str, torch.Tensor], share: float = 1) -> None:
        for k, v in terms.items():
            if share != 1:
                v = v * share
            self.sums[k] = self.sums[k] + v if k in self.sums else v
            self.counts[k] = self.counts.get(k, 0) + share

    def totals(self) -> dict[str, tuple[float, float]]:
        """{term: (sum, count)} on the host: one stack, one transfer; under torchrun added over the ranks."""
        keys = list(self.sums)
        values = torch.stack([self.sums[k] for k in keys]).tolist() if keys else []
        local = {k: (v, self.counts[k]) for k, v in zip(keys, values)}
        if not distributed.is_distributed():
            return local
        total: dict[str, tuple[float, float]] = {}
        for part in distributed.gather(local):
            for k, (v, c) in part.items():
                s0, c0 = total.get(k, (0.0, 0))
                total[k] = (s0 + v, c0 + c)
        return total

    def means(self) -> dict[str, float]:
        """Means over all ranks, "loss" first. Non-finite losses stop the run."""
        totals = self.totals()
        if not totals:
            return {}
        keys = sorted(totals, key=lambda k: (k != "loss", k))
        means = {k: totals[k][0] / totals[k][1] for k in keys}
        bad = [k for k, v in means.items() if not math.isfinite(v)]
        if bad:
            raise FloatingPointError(f"non-finite training loss in {bad}: lower --lr, enable --grad-clip, or check "
                                     "the data")
        return means


def sequences(batch: dict | None) -> int:
    """Sequences the encoder reads for a batch: 1 per row, 2 for Siamese pairs, 2-3 for NLI triplets."""
    if batch is None:  # a rank's empty shard
        return 0
    rows = len(batch["ids"])
    return rows * sum(1 for k in batch if k.startswith("input_ids"))


@contextlib.contextmanager
def progress_logging() -> Iterator[None]:
    """Route log lines through tqdm.write while a progress bar may be on screen (terminal only)."""
    if sys.stderr.isatty():
        from tqdm.contrib.logging import logging_redirect_tqdm

        with logging_redirect_tqdm():
            yield
    else:
        yield


# ---- the run's clock: elapsed and remaining time on the log lines ----


def duration(seconds: float) -> str:
    """``1h02m``, ``12m05s`` or ``42s``."""
    seconds = max(0, round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


ESTIMATE_AFTER = 10  # training steps timed before the first estimate of the whole run


class RunClock:
    """Elapsed and remaining time of a run, for its log lines (the log file too, not only a terminal's bar).

    Each step left has a cost known from the plan (``step_costs``: the padded tokens of its batch,
    ``padded_tokens`` of tasks.data.datasets; or one step left per unit where a plan cannot say, as MLM
    pretraining's reshuffled epochs). Remaining = the cost of the steps left at the seconds per unit of cost
    measured so far (a batch of long pairs is not timed as a batch of short sentences), plus the evaluations
    still to come: each epoch's dev scores and the final predictions, in scored sequences, at the seconds per
    sequence of the last evaluation measured; before the first one, at a third of the training time per
    sequence (a forward pass without backward: an estimate, and said to be one).
    """

    def __init__(self, step_costs: int | Sequence[float], evals_left: int, eval_sequences: int,
                 final_sequences: int, now: Callable[[], float] | None = None) -> None:
        self._now = now  # the clock read (default: time.perf_counter); a test's fake
        self.start = self.now()
        costs = [1.0] * step_costs if isinstance(step_costs, int) else [float(c) for c in step_costs]
        self.left_costs = list(itertools.accumulate(reversed(costs)))[::-1] + [0.0]  # [i]: cost of steps i..end
        self.evals_left = evals_left
        self.eval_sequences, self.final_sequences = eval_sequences, final_sequences
        self.train_seconds, self.steps_done, self.sequences_done, self.cost_done = 0.0, 0, 0, 0.0
        self.seconds_per_eval_sequence: float | None = None
        self.estimate_after, self.estimated = min(ESTIMATE_AFTER, len(costs)), False

    def estimate_due(self, pending: int) -> bool:
        """True once the steps timed and ``pending`` (not yet timed) make the first estimate's sample, until the
        estimate is given (``estimated``)."""
        return not self.estimated and 0 < self.estimate_after <= self.steps_done + pending

    @property
    def steps_left(self) -> int:
        return len(self.left_costs) - 1 - self.steps_done

    def trained(self, steps: int, sequences: int, seconds: float) -> bool:
        """The next ``steps`` steps of the plan, ``sequences`` sequences, took ``seconds``; True for the first of
        them (the moment to log an estimate of the whole run, ``total``)."""
        first = not self.steps_done
        done = min(self.steps_done + steps, len(self.left_costs) - 1)
        self.cost_done += self.left_costs[self.steps_done] - self.left_costs[done]
        self.train_seconds += seconds
        self.steps_done = done
        self.sequences_done += sequences
        return first

    def evaluated(self, seconds: float, sequences: int | None = None) -> None:
        """An evaluation of ``sequences`` scored sequences (default: one of the evaluations counted at the start)
        took ``seconds``."""
        self.evals_left = max(0, self.evals_left - 1)
        sequences = self.eval_sequences if sequences is None else sequences
        if sequences:
            self.seconds_per_eval_sequence = seconds / sequences

    def remaining(self) -> float:
        if not self.steps_done or not self.cost_done:
            return math.nan
        per_eval = self.seconds_per_eval_sequence
        if per_eval is None:
            per_eval = self.train_seconds / max(self.sequences_done, 1) / 3
        return (self.left_costs[self.steps_done] * self.train_seconds / self.cost_done
                + per_eval * (self.evals_left * self.eval_sequences + self.final_sequences))

    def now(self) -> float:
        return (self._now or time.perf_counter)()

    def elapsed(self) -> float:
        return self.now() - self.start

    def total(self) -> float:
        """The whole run's time at the rates measured so far: elapsed + remaining."""
        return self.elapsed() + self.remaining()

    def line(self) -> str:
        """``elapsed 3m10s, left ~9m40s``: for a progress line."""
        left = self.remaining()
        return f"elapsed {duration(self.elapsed())}" + ("" if math.isnan(left) else f", left ~{duration(left)}")


class RunsClock:
    """Elapsed and remaining time of a series of runs (an experiment's sweep), for its progress lines.

    Remaining = the cost of the runs left at the wall seconds per unit of cost of the runs done so far; runs
    that were reused (finished before) cost no time and are left out. Costs are estimates of each run's time
    (e.g. ``Sweep.map``'s ``cost``; 1 each by default); with several runs at once the rate is theirs together.
    Thread-safe.
    """

    def __init__(self, costs: Sequence[float]) -> None:
        self.costs = list(costs)
        self.start = time.perf_counter()
        self.finished: set[int] = set()
        self.reused = 0
        self.ran_cost = 0.0
        self._lock = threading.Lock()

    def done(self, i: int, ran: bool) -> None:
        with self._lock:
            self.finished.add(i)
            if ran:
                self.ran_cost += self.costs[i]
            else:
                self.reused += 1

    def line(self) -> str:
        """``3/12 runs done (1 reused) | elapsed 12m05s, left ~40m10s``."""
        with self._lock:
            elapsed = time.perf_counter() - self.start
            left_cost = sum(c for i, c in enumerate(self.costs) if i not in self.finished)
            n, reused, ran_cost = len(self.finished), self.reused, self.ran_cost
        text = f"{n}/{len(self.costs)} runs done" + (f" ({reused} reused)" if reused else "")
        if n == len(self.costs):
            return f"{text} | wall time {duration(elapsed)}"
        return f"{text} | elapsed {duration(elapsed)}" + (
            f", left ~{duration(elapsed / ran_cost * left_cost)}" if ran_cost else "")


# ---- training.png: per-epoch loss terms and dev metrics ----
matplotlib.use("Agg")  # files only; never needs a display


def _value(v: float | None) -> float:
    """A plotted value: missing or null (an undefined metric) -> nan, drawn as a gap."""
    return math.nan if v is None else float(v)


def _normalized(values: list[float], higher_is_better: bool) -> list[float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return values
    lo, hi = min(finite), max(finite)
    if hi == lo:
        return [1.0 for _ in values]
    return [((v - lo) if higher_is_better else (hi - v)) / (hi - lo) for v in values]


def plot_history(history: list[dict], path: str | os.PathLike[str]) -> Path:
    """Write a PNG of per-epoch train loss terms and dev metrics; returns the path.

    Each record needs "epoch", "train" ({term: mean}) and "dev" ({metric: value}).
    The head losses ("<task>/loss") and the objectives' terms are drawn alike.
    """
    path = Path(path)
    epochs = [r["epoch"] for r in history]
    terms = sorted({k for r in history for k in r.get("train", {})})
    metrics = sorted({k for r in history for k in r.get("dev", {})})
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), constrained_layout=True)
    for term in terms:
        ys = [_value(r.get("train", {}).get(term)) for r in history]
        axes[0, 0].plot(epochs, ys, marker="o", label=term)
        axes[1, 0].plot(epochs, _normalized(ys, higher_is_better=False), marker="o", label=term)
    for metric in metrics:
        ys = [_value(r.get("dev", {}).get(metric)) for r in history]
        style = dict(marker="o", linewidth=2.5 if metric == "overall" else 1.5)
        axes[0, 1].plot(epochs, ys, label=metric, **style)
        axes[1, 1].plot(epochs, _normalized(ys, higher_is_better=True), label=metric, **style)
    if terms and all(v > 0 for r in history for v in map(_value, r.get("train", {}).values()) if math.isfinite(v)):
        axes[0, 0].set_yscale("log")
    axes[0, 0].set_title("train loss terms (epoch mean)")
    axes[0, 1].set_title("dev metrics")
    axes[1, 0].set_title("loss, normalized: worst epoch 0, best 1 (paper Fig. 4)")
    axes[1, 1].set_title("dev, normalized: worst epoch 0, best 1 (paper Fig. 5)")
    for ax in axes.flat:
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    try:
        with atomic_file(path) as tmp:
            fig.savefig(tmp, dpi=90, format="png")
    finally:
        plt.close(fig)
    return path

