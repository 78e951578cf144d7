"""Tests of experiments/sst_phrases.py: every row is an SST specialist the train command accepts, the table pairs
each row with the base row by seed."""

from __future__ import annotations

import json

from experiments import sst_phrases
from experiments.sst_phrases import FLAGS, NAMES, collect, render
from experiments.sweep import Sweep
from tasks import arguments


def test_every_row_is_an_sst_specialist_scored_by_its_head_and_differs_from_base():
    configs = {name: arguments.config_for([*FLAGS[name], "--out-dir", "unused"]) for name in NAMES}
    for name, cfg in configs.items():
        assert cfg.tasks == ("sst",) and cfg.sst_prior == 0, name
        assert name == "base" or cfg.to_dict() != configs["base"].to_dict(), name
    assert configs["phrases"].sst_phrases == "sst-phrases-train.csv"
    assert configs["w0.25"].sst_phrases_weight == 0.25 and configs["n17k"].sst_phrases_per_epoch == 17088
    assert configs["min3"].sst_phrases_min_words == 3 and configs["first"].sst_phrases_order == "first"
    assert configs["llrd"].sst_phrases is None and configs["llrd"].layer_lr_decay == 0.9


def test_the_table_pairs_each_row_with_base_by_seed(tmp_path):
    """Δ is the mean of the per-seed differences against base (± their SE), not the difference of the means."""
    sweep = Sweep(tmp_path)
    accs = {"base": [0.48, 0.47, 0.49], "phrases": [0.50, 0.48, 0.52]}
    for row, values in accs.items():
        for seed, acc in enumerate(values):
            run = tmp_path / row / f"seed{seed}"
            run.mkdir(parents=True)
            (run / "metrics.jsonl").write_text(json.dumps({"final": True, "dev": {"sst_acc": acc}}) + "\n")
            (run / "sweep.json").write_text(json.dumps({"wall_s": 100 + seed}))
    results = collect(sweep, [0, 1, 2])
    assert results["phrases"][2] == {"sst_acc": 0.52, "wall_s": 102}
    lines = {line.split("|")[1].strip().split(":")[0]: line for line in render(results).splitlines()[2:]}
    assert set(lines) == {"`base`", "`phrases`"}
    assert "0.480 ± 0.010" in lines["`base`"] and "101" in lines["`base`"]
    assert "+0.020 ± 0.006*" in lines["`phrases`"]  # differences 0.02, 0.01, 0.03
    assert sst_phrases.PARENT == "base"
