"""Tests of experiments/ablation.py: cumulative flags of the ablation ladder, its tables, reading its runs back."""

from __future__ import annotations

import json

import matplotlib.image
import pytest

from experiments import ablation
from experiments.ablation import CONTRASTIVE, LADDER, ROWS, collect, merge_flags, render, row_flags
from experiments.stats import plot_rows
from experiments.sweep import Sweep
from tasks import arguments
from tasks import train as cli
from tasks.evaluation.metrics import overall_score


def test_merge_flags_replaces_values_and_accumulates_objectives():
    merged = merge_flags(["--schedule", "sequential", "--objective", "mnr", "--mnr-tasks", "nli"],
                         ["--schedule", "even", "--objective", "simcse", "--mnr-tasks", "sts", "nli"])
    assert merged == ["--schedule", "even", "--objective", "mnr", "--objective", "simcse", "--mnr-tasks", "sts", "nli"]


def test_every_ablation_row_parses_and_adds_to_the_row_above():
    """Each row's flags build a valid configuration (refusals would exit 2) that differs from the previous row's."""
    rows = row_flags("cpu")
    assert list(rows) == [name for name, _, _ in LADDER] + ["ce"] + [name for name, _, _ in CONTRASTIVE]
    previous = None
    configs = {}
    for name, flags in rows.items():
        parser = arguments.build_parser()
        command, explicit = arguments.parse(flags + ["--out-dir", "unused"], parser)
        cfg = configs[name] = cli.build_invocation(command, explicit).config
        assert cfg.epochs == 1 and cfg.max_train_examples["para"] == 2000 and cfg.max_train_examples["sst"] == 2000
        assert cfg.model.pooling == "mean" and cfg.head_lr_scale == 10
        assert "phrases" not in cfg.resolve().extra and not cfg.resolve().priors  # no additions of the CPU default's
        if previous is not None and name in dict((n, 0) for n, _, _ in LADDER):
            assert cfg.to_dict() != previous.to_dict(), name
        previous = cfg
    smart = configs["smart"]
    assert set(smart.objectives) == {"mnr", "simcse", "smart"} and smart.bf16 is None
    assert smart.nli and smart.model.arch == "b1" and smart.loss_weights == {"para": 0.1}
    assert smart.max_train_examples == {"sst": 2000, "para": 2000, "sts": 2000, "nli": 1500}
    assert configs["ce"].objectives == {} and configs["ce"].model.pair_encoding == "cross"
    for name, _, _ in CONTRASTIVE:  # one objective on the cross-encoded CE model, nothing of the ladder
        assert list(configs[name].objectives) == [name] and configs[name].model.pair_encoding == "cross"
        assert not configs[name].nli and configs[name].loss_weights == {}


def test_ablation_tables_flag_collapse_and_mark_changes(tmp_path):
    """The rendered tables: mean ± std per row, the paired change against the parent, rows with a seed at the majority class flagged;
    the plots are written."""
    seeds = {0: 0.0, 1: 0.01, 2: -0.01}
    results = {
        "baseline": {s: {"sst_acc": 0.40 + d, "para_acc": 0.70 + d, "sts_r": 0.70, "overall": 0.6, "wall_s": 10}
                     for s, d in seeds.items()},
        "even": {s: {"sst_acc": 0.45 + d, "para_acc": 0.64, "sts_r": 0.71, "overall": 0.62 + d, "wall_s": 12}
                 for s, d in seeds.items()},
        "ce": {s: {"sst_acc": 0.45, "para_acc": 0.75, "sts_r": 0.8, "overall": 0.7, "wall_s": 9} for s in seeds},
    }
    results["ce"][1]["para_acc"] = 0.64  # one seed collapsed, the mean still above the majority class
    ladder, contrastive = render(results, {"sst_acc": 0.25, "para_acc": 0.633})
    lines = ladder.splitlines()
    base = next(x for x in lines if x.startswith("| baseline"))
    assert "| 3 | 0.400 ± 0.010 | 0.700 ± 0.010 |" in base and "majority" not in base
    even = next(x for x in lines if x.startswith("| + even"))
    assert "(at the majority class: para, seeds 0 1 2)" in even and "+0.020 ± 0.000" not in even
    assert "+0.050 [+0.050, +0.050]*" in even  # SST: the same +0.05 on every seed
    assert "CE: b1 heads, cross-encoded pairs, mean pooling (at the majority class: para, seeds 1) |" in contrastive
    plot_rows(tmp_path / "p.png", ["a", "b"], {"overall": [[0.5, 0.6], [0.7]]}, "t", {"overall": 0.55})
    image = matplotlib.image.imread(tmp_path / "p.png")
    assert image.shape[0] > 100 and image.shape[1] > 100 and image[..., :3].std() > 0.05  # drawn, not blank


def test_collect_reads_every_row_and_seed(tmp_path, monkeypatch):
    """Every row of the sweep (the CE parent of the contrastive rows too) is read back, per seed."""
    monkeypatch.setattr(ablation, "ensemble_scores", lambda sweep, seed: {})  # these runs wrote no predictions
    for row in ROWS:
        for seed in (0, 1):
            run = tmp_path / row / f"seed{seed}"
            run.mkdir(parents=True)
            dev = {"sst_acc": 0.4, "para_acc": 0.7, "sts_r": 0.8, "overall": 0.6 + seed / 100}
            (run / "metrics.jsonl").write_text(json.dumps({"final": True, "dev": dev}) + "\n")
    results = collect(Sweep(tmp_path), [0, 1])
    assert set(ROWS) <= set(results) and results["ce"][1]["overall"] == 0.61


def test_collect_adds_knn_berts_vote_for_the_seeds_whose_run_recorded_one(tmp_path, monkeypatch):
    """KNN-BERT's run is a row as it is (φ 0) and, where it recorded eq. 1's vote, a second row scored with it."""
    monkeypatch.setattr(ablation, "ensemble_scores", lambda sweep, seed: {})
    dev = {"sst_acc": 0.4, "para_acc": 0.7, "sts_r": 0.8, "overall": 0.6}
    for seed, knn in ((0, {"dev": {"sst_acc": 0.5, "para_acc": None}}), (1, None)):
        run = tmp_path / "knn_bert" / f"seed{seed}"
        run.mkdir(parents=True)
        record = {"final": True, "dev": dev, **({"knn": knn} if knn else {})}
        (run / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        (run / "sweep.json").write_text(json.dumps({"wall_s": 10 + seed}))
    results = collect(Sweep(tmp_path), [0, 1])
    assert results["knn_bert"][1] == {**dev, "wall_s": 11}
    vote = results["knn_bert_vote"]
    assert list(vote) == [0] and vote[0]["sst_acc"] == 0.5 and vote[0]["para_acc"] == 0.7 and vote[0]["wall_s"] == 10
    assert vote[0]["overall"] == pytest.approx(overall_score({"sst_acc": 0.5, "para_acc": 0.7, "sts_r": 0.8}))
