"""Tests of tasks/training/progress.py: loss sums turned into means for the log lines, sequence counts, and the
run directory's training.png."""

from __future__ import annotations

import math

import matplotlib.image
import matplotlib.pyplot as plt
import pytest
import torch

from tasks.training import progress
from tasks.training.progress import RunningSums, plot_history, sequences


def test_running_sums_give_each_terms_mean_over_its_own_steps_loss_first():
    """A term is averaged over the steps that reported it (weighted by the rank's share of the batch), not over
    every step; "loss" comes first, the other terms in name order."""
    sums = RunningSums()
    sums.add({"sts/loss": torch.tensor(3.0), "loss": torch.tensor(1.0)})
    sums.add({"loss": torch.tensor(3.0), "para/loss": torch.tensor(5.0)})
    means = sums.means()
    assert list(means) == ["loss", "para/loss", "sts/loss"]
    assert means == {"loss": 2.0, "para/loss": 5.0, "sts/loss": 3.0}
    shared = RunningSums()
    shared.add({"loss": torch.tensor(2.0)}, share=0.5)
    shared.add({"loss": torch.tensor(6.0)}, share=0.25)
    assert shared.means()["loss"] == pytest.approx((2.0 * 0.5 + 6.0 * 0.25) / 0.75)
    assert RunningSums().means() == {}


def test_a_non_finite_mean_stops_the_run_naming_the_term():
    sums = RunningSums()
    sums.add({"loss": torch.tensor(1.0), "para/loss": torch.tensor(math.inf)})
    with pytest.raises(FloatingPointError, match=r"\['para/loss'\]"):
        sums.means()


def test_sequences_counts_each_side_of_a_pair_and_an_empty_shard_as_none():
    ids = torch.zeros(4, 7, dtype=torch.long)
    assert sequences({"ids": ["a", "b", "c", "d"], "input_ids": ids, "labels": ids[:, 0]}) == 4
    assert sequences({"ids": ["a", "b", "c", "d"], "input_ids_1": ids, "input_ids_2": ids}) == 8
    assert sequences(None) == 0


def test_plot_history_writes_a_png_in_place_of_the_old_one(tmp_path):
    """training.png is a PNG (an undefined metric, null in metrics.jsonl, is a gap, not an error), replaced whole:
    no temporary file is left beside it."""
    history = [{"epoch": e, "train": {"loss": 1.0 / e, "sst/loss": 2.0 / e}, "dev": {"sst_acc": 0.2 * e, "sts_r": None}}
               for e in (1, 2, 3)]
    path = tmp_path / "run" / "training.png"
    path.parent.mkdir()
    path.write_bytes(b"old")
    assert plot_history(history, path) == path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(path).shape[:2] == (675, 990)  # 11 x 7.5 inches at 90 dpi
    assert [p.name for p in path.parent.iterdir()] == ["training.png"]


def test_a_plot_that_fails_to_render_leaves_the_old_one_and_no_temporary(tmp_path, monkeypatch):
    """The plot is written as every file is (tasks.storage.atomic_file): a failure mid-write (a full disk) leaves
    the previous training.png whole and nothing beside it, and the figure is closed."""
    path = tmp_path / "training.png"
    history = [{"epoch": 0, "train": {"sst/loss": 1.0}, "dev": {"overall": 0.5}}]
    plot_history(history, path)
    before = path.read_bytes()

    def full_disk(self, fname, **kwargs):
        with open(fname, "wb") as f:
            f.write(b"\x89PNG half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(plt.Figure, "savefig", full_disk)
    with pytest.raises(OSError):
        plot_history(history, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["training.png"]
    assert plt.get_fignums() == []


def test_plot_history_draws_every_term_and_metric_raw_and_normalized(tmp_path, monkeypatch):
    """The four panels hold each loss term and dev metric per epoch, and the same normalized so that the worst
    epoch is 0 and the best 1 (a loss falls, a metric rises); a null metric is drawn as gaps."""
    figures = []
    monkeypatch.setattr(progress.plt, "close", figures.append)
    history = [{"epoch": e, "train": {"loss": 1.0 / e, "sst/loss": 2.0 / e}, "dev": {"sst_acc": 0.2 * e, "sts_r": None}}
               for e in (1, 2, 4)]
    plot_history(history, tmp_path / "training.png")
    (fig,) = figures
    axes = fig.axes
    monkeypatch.undo()
    plt.close(fig)
    lines = [{ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.lines} for ax in axes]
    assert lines[0]["sst/loss"] == ([1, 2, 4], [2.0, 1.0, 0.5]) and axes[0].get_yscale() == "log"
    assert lines[1]["sst_acc"][1] == pytest.approx([0.2, 0.4, 0.8])
    assert all(math.isnan(v) for v in lines[1]["sts_r"][1])
    assert lines[2]["loss"][1] == pytest.approx([0.0, 2 / 3, 1.0])  # 1/e: worst 1.0 -> 0, best 0.25 -> 1
    assert lines[3]["sst_acc"][1] == pytest.approx([0.0, 1 / 3, 1.0])


def test_duration_reads_as_a_person_would():
    assert [progress.duration(x) for x in (0.4, 42, 725, 3725, 90000)] == ["0s", "42s", "12m05s", "1h02m", "25h00m"]


def test_run_clock_adds_the_steps_and_evaluations_left(monkeypatch):
    """Remaining = steps left at the measured time per step + the evaluations still to come at the measured time
    per scored sequence (before one is measured: a third of the training time per sequence)."""
    clock = progress.RunClock(100, evals_left=2, eval_sequences=50, final_sequences=200)  # 100 steps alike
    assert math.isnan(clock.remaining()) and "left" not in clock.line()
    clock.trained(steps=10, sequences=300, seconds=20.0)  # 2 s a step, 1/15 s a sequence
    assert clock.remaining() == pytest.approx(90 * 2.0 + (2 * 50 + 200) * (20.0 / 300 / 3))
    clock.evaluated(10.0)  # 50 sequences in 10 s
    assert clock.remaining() == pytest.approx(90 * 2.0 + (1 * 50 + 200) * 0.2)
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock.start + 65)
    assert clock.line() == "elapsed 1m05s, left ~3m50s"


def test_run_clock_times_the_steps_left_by_their_cost_and_estimates_after_ten():
    """The first steps are no fair sample of batches whose lengths vary, so each step left is timed by its cost
    (padded tokens, known from the plan): a run of 10 short then 90 long steps is estimated right after the first
    10; timed per step it would be 5x off.
    The first estimate is due after ESTIMATE_AFTER steps (or all of them, in a shorter run), once."""
    costs = [100.0] * 10 + [500.0] * 90
    now = [0.0]
    clock = progress.RunClock(costs, evals_left=0, eval_sequences=0, final_sequences=0, now=lambda: now[0])
    assert not clock.estimate_due(9) and clock.estimate_due(10) and progress.ESTIMATE_AFTER == 10
    now[0] = 10 * 0.01 * 100  # 0.01 s a token
    clock.trained(10, 320, now[0])
    assert clock.total() == pytest.approx(sum(costs) * 0.01)
    assert clock.total() != pytest.approx(100 * now[0] / 10, rel=0.5)  # what a time per step would say
    clock.estimated = True
    assert not clock.estimate_due(1)
    assert progress.RunClock([1.0] * 4, 0, 0, 0).estimate_after == 4


def test_runs_clock_learns_its_rate_from_the_runs_it_ran_and_weighs_them_by_cost(monkeypatch):
    """A series of runs: remaining = the cost left at the seconds per unit of cost of the runs that ran; a reused
    run costs no time; the last line gives the wall time."""
    now = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    clock = progress.RunsClock([1.0, 2.0, 1.0, 4.0])
    clock.done(0, ran=False)  # reused: no rate yet
    assert clock.line() == "1/4 runs done (1 reused) | elapsed 0s"
    now[0] = 60.0
    clock.done(1, ran=True)  # cost 2 in 60 s: 30 s per unit
    assert clock.line() == "2/4 runs done (1 reused) | elapsed 1m00s, left ~2m30s"  # (1 + 4) x 30 s
    now[0] = 100.0
    clock.done(3, ran=True)
    clock.done(2, ran=True)
    assert clock.line() == "4/4 runs done (1 reused) | wall time 1m40s"
