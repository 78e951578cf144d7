"""``--report-to tensorboard``: a run's metrics as TensorBoard scalars, in ``<out-dir>/tensorboard/``.

What goes there, each at its global step (the optimizer steps taken):
    train/<term>, train/lr, train/seq_per_s   every log line: the means over its window of steps
    epoch/<term>                              every epoch record of metrics.jsonl: the epoch's mean loss terms
    dev/<metric>                              every epoch record: the dev scores between epochs
    final_dev/<metric>                        the final record: the best (or SWA) model on the whole dev sets

metrics.jsonl stays the run's record; these files are a view of it for ``tensorboard --logdir runs``, which
shows each run directory as one run. A resumed run purges the events written after its checkpoint's step,
as it drops those records from metrics.jsonl. TensorBoard is an optional dependency: ``check_available``
says how to install it.

``ReportToTensorBoard`` is the hook (tasks/training/loop.py) that writes them; ``TensorBoard`` the writer.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from tasks.training.loop import Control, Hook, TrainingState

INSTALL = ".venv/bin/pip install tensorboard"


def check_available(report_to: tuple[str, ...]) -> None:
    """ValueError naming what to install when a reporter in ``report_to`` has no package."""
    if "tensorboard" in report_to and importlib.util.find_spec("tensorboard") is None:
        raise ValueError(f"--report-to tensorboard needs the tensorboard package, which is not installed: {INSTALL}")


class TensorBoard:
    """Scalars written with torch's SummaryWriter (``torch.utils.tensorboard``) into ``directory``.

    ``purge_step``: events of an earlier process at this step or later are hidden (a resumed run's).
    """

    def __init__(self, directory: Path, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(directory), purge_step=purge_step)
        self.step = max(0, (purge_step or 1) - 1)  # the last step written to: the final record goes there

    def _scalars(self, prefix: str, values: dict, step: int) -> None:
        for name, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.writer.add_scalar(f"{prefix}/{name}", value, step)
        self.step = max(self.step, step)

    def log_line(self, step: int, values: dict[str, float]) -> None:
        """A training log line's window means (loss terms, lr, seq_per_s) at global step ``step``."""
        self._scalars("train", values, step)

    def record(self, record: dict) -> None:
        """A metrics.jsonl record: a training epoch's (train means, dev scores) or the final one (final dev
        scores); SWA's records, which are at no global step of training, are not drawn."""
        if record.get("final"):
            self._scalars("final_dev", record.get("dev", {}), self.step)
        elif "global_step" in record:
            step = record["global_step"]
            self._scalars("epoch", record.get("train", {}), step)
            self._scalars("dev", record.get("dev", {}), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class ReportToTensorBoard(Hook):
    """--report-to tensorboard: each log line's values and each record as scalars in ``directory``; the events of a
    resumed run after its checkpoint's step are hidden. The writer closes after the final record, the run's last, or when the trainer is closed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.writer: TensorBoard | None = None

    def on_train_start(self, state: TrainingState, control: Control) -> None:
        if self.writer is None:
            self.writer = TensorBoard(self.directory, purge_step=state.global_step + 1
                                      if state.resumed_from is not None else None)

    def on_log(self, state: TrainingState, control: Control, values: dict[str, float]) -> None:
        if self.writer is not None:
            self.writer.log_line(state.global_step, values)

    def on_record(self, state: TrainingState, control: Control, record: dict) -> None:
        if self.writer is not None:
            self.writer.record(record)
            if record.get("final"):
                self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
