"""Loss bookkeeping and progress display of the training loop.

Usage:
    sums = RunningSums()
    sums.add(terms)                 # each step: tensors stay on the device
    sums.means()                    # one device sync: {"loss": ..., "sst/loss": ...}
    with progress_logging():        # log lines go through tqdm.write while a bar is shown
        ...
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator

import torch

from tasks import distributed


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
