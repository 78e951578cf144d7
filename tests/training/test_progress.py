"""Tests of tasks/training/progress.py: loss sums turned into means for the log lines, sequence counts, and the
run directory's training.png."""

from __future__ import annotations

import math

import pytest
import torch

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
    assert [p.name for p in path.parent.iterdir()] == ["training.png"]
