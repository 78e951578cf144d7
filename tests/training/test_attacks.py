"""Tests of tasks/training/attacks.py, the robustness evaluations: an experiment's scores over seeds from the
runs it trains on perturbed copies, and the minority-class accuracy from any prediction file format."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tasks.data.readers import Example
from tasks.predictions import Predictions, write_predictions
from tasks.training.attacks import class_accuracy, perturbation_experiment


def test_minority_class_accuracy_reads_starter_files(tmp_path):
    """class_accuracy scores a starter-format prediction file by id, as it does our own."""
    examples = [Example("b757", "x", label=1), Example("d17a", "y", label=1), Example("e3", "z", label=0)]
    starter = tmp_path / "sst-dev-output.csv"
    starter.write_text("id \t Predicted_Sentiment \nb757 , 1 \nd17a , 4 \ne3 , 0 \n")
    assert class_accuracy(starter, examples, 1) == 0.5
    ours = write_predictions(tmp_path / "ours", "sst", "dev",
                             Predictions(["b757", "d17a", "e3"], torch.zeros(3, 5), torch.tensor([1, 4, 0])))
    assert class_accuracy(ours, examples, 1) == 0.5


def test_minority_class_accuracy_is_over_the_examples_the_run_predicted(tmp_path):
    """A run that read part of dev (--limit, a capped dev set) predicts only those examples: the class is scored
    over them, as the run's own dev scores are, and a class it has no example of scores NaN (no KeyError)."""
    examples = [Example("a", "x", label=1), Example("b", "y", label=1), Example("c", "z", label=0)]
    part = tmp_path / "sst-dev-output.csv"
    part.write_text("id \t Predicted_Sentiment \na , 1 \nc , 0 \n")
    assert class_accuracy(part, examples, 1) == 1.0 and class_accuracy(part, examples, 0) == 1.0
    assert math.isnan(class_accuracy(part, examples, 3))


def test_an_experiment_trains_each_setting_once_per_seed_and_summarises_its_dev_scores(tmp_path):
    """Every setting x seed trains once on its own perturbed copy (a changed train file, the rest linked), in
    setting order; each metric is mean, sample std and count over the seeds that report it."""
    from tests.helpers import write_tiny_data

    data = write_tiny_data(tmp_path / "data")
    calls = []

    def train(data_dir: Path, run_dir: Path, seed: int) -> dict[str, float]:
        calls.append((data_dir.name, run_dir.name, seed, len((data_dir / "ids-sst-train.csv").read_text().splitlines())))
        return {"sst_acc": 0.5 + seed / 10, **({"overall": 0.25} if seed else {})}

    results = perturbation_experiment("few-shot", [("n5", {"n": 5}), ("n10", {"n": 10})], ["sst"], [0, 1], data,
                                      tmp_path / "out", train)
    assert calls == [("data-n5-seed0", "n5-seed0", 0, 6), ("data-n5-seed1", "n5-seed1", 1, 6),
                     ("data-n10-seed0", "n10-seed0", 0, 11), ("data-n10-seed1", "n10-seed1", 1, 11)]
    assert (tmp_path / "out" / "data-n5-seed0" / "quora-train.csv").is_symlink()
    n5 = results["n5"]
    assert list(results) == ["n5", "n10"] and n5["overall"] == {"mean": 0.25, "std": 0.0, "n": 1}
    assert n5["sst_acc"]["mean"] == pytest.approx(0.55) and n5["sst_acc"]["std"] == pytest.approx(0.0707, abs=1e-4)
    assert n5["per_seed"] == [{"sst_acc": 0.5}, {"sst_acc": 0.6, "overall": 0.25}]
