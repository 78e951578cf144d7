"""Tests of benchmarks/bench_phrases.py on the tiny model: it runs, and its model of an epoch is the arithmetic it
says. No timing is asserted."""

from __future__ import annotations

import pytest

from benchmarks import bench_phrases as bench
from tests.helpers import phrases, tiny_train_config

pytestmark = pytest.mark.usefixtures("one_thread")


def test_each_phrase_batch_size_is_timed_and_its_epoch_modelled(tiny_env, tmp_path):
    """Every task stream and the phrases at each batch size get a step time per round; an epoch's modelled
    seconds are its steps a stream x their medians, and more phrases a batch means fewer phrase steps."""
    cfg = tiny_train_config(tiny_env, tmp_path / "unused", **phrases(per_epoch=24))
    res = bench.benchmark(cfg, batch_sizes=(4, 8), steps=2, rounds=2, log=lambda s: None)
    assert set(res["step_s"]) == {"sst", "para", "sts", "phrases@4", "phrases@8"}
    assert all(len(v) == 2 and min(v) > 0 for v in res["step_s"].values())
    settings = res["settings"]
    assert settings["none"]["ratio"] == 1 and settings["4"]["steps"]["phrases@4"] == 6
    assert settings["8"]["steps"]["phrases@8"] == 3
    assert settings["8"]["steps"]["sst"] == settings["none"]["steps"]["sst"]
    for s in settings.values():
        assert s["train_s"] == pytest.approx(sum(n * res["step_s_median"][k] for k, n in s["steps"].items()))
    assert settings["4"]["ratio"] > 1 and "| phrases@8 |" in bench.markdown(res)


def test_the_modelled_epoch_takes_the_phrases_declared_cap_where_the_config_names_none(tiny_env, tmp_path):
    """A config that leaves the phrases' count an epoch to SST's entry (17,088) models that count, as its run
    trains it (the tiny file's 96 phrases, all of them)."""
    cfg = tiny_train_config(tiny_env, tmp_path / "unused", **phrases())
    res = bench.benchmark(cfg, batch_sizes=(32,), steps=1, rounds=1, log=lambda s: None)
    assert res["per_epoch"] == 17088 and res["settings"]["32"]["steps"]["phrases@32"] == 3


def test_the_sample_spans_the_batches_sizes():
    """A stratified sample takes batches from the smallest to the largest padded size, evenly spaced."""
    lengths = list(range(1, 11))
    batches = [[i] for i in range(10)]  # one example each: padded size = its length
    assert bench.stratified(batches, lengths, 5) == [[1], [3], [5], [7], [9]]
    assert bench.stratified(batches, lengths, 20) == sorted(batches)


def test_a_config_without_phrases_is_refused(tiny_env, tmp_path):
    with pytest.raises(ValueError, match="trains the SST phrases"):
        bench.benchmark(tiny_train_config(tiny_env, tmp_path / "unused"), log=lambda s: None)
