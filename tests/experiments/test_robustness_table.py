"""Tests of experiments/robustness_table.py: the robustness sweep's cells, data, commands and tables."""

from __future__ import annotations

import json

import matplotlib.image
import pytest

from experiments import robustness_table
from experiments.ablation import row_flags
from experiments.stats import cell
from experiments.sweep import Sweep
from tasks import arguments
from tasks import train as cli


def test_robustness_rows_cells_and_knn_variants(tmp_path):
    """Per-seed cells of every method row, KNN-BERT's three rows from one run, the attack on the classifier only,
    the majority mark and the change against CE paired by seed; the plots are written."""
    results = {"ce": {"clean": {0: {"sst_acc": 0.5, "para_acc": 0.8}, 1: {"sst_acc": 0.4, "para_acc": 0.8}},
                      "fs100": {0: {"sst_acc": 0.2, "para_acc": 0.6}, 1: {"sst_acc": 0.4, "para_acc": 0.7}},
                      "attack": {0: {"sst": {"after_attack_acc": 0.1, "clean_acc": 0.4},
                                     "para": {"after_attack_acc": 0.3, "clean_acc": 0.7}}}},
               "knn_bert": {"clean": {0: {"sst_acc": 0.55, "knn_phi0.25.sst_acc": 0.46, "knn_phi1.sst_acc": 0.47},
                                      1: {"sst_acc": 0.45, "knn_phi0.25.sst_acc": 0.46, "knn_phi1.sst_acc": 0.47}},
                            "attack": {0: {"sst": {"after_attack_acc": 0.2, "clean_acc": 0.45}}}}}
    ce = dict(robustness_table.score_rows("ce", results))["CE baseline"]
    assert ce["fs100/sst"] == {0: 0.2, 1: 0.4} and ce["attack/para"] == {0: 0.3}
    assert cell(list(ce["fs100/sst"].values())) == "0.300 ± 0.141"
    knn = dict(robustness_table.score_rows("knn_bert", results))
    assert knn["KNN-BERT, φ 0.25"]["clean/sst"] == {0: 0.46, 1: 0.46}
    assert knn["KNN-BERT, φ 1 (KNN only)"]["clean/sst"] == {0: 0.47, 1: 0.47}
    # the attack targets the classifier: its cell is on the φ 0 row, never on the rows that add the KNN vote
    classifier = knn["KNN-BERT, classifier alone (φ 0)"]
    assert classifier["clean/sst"] == {0: 0.55, 1: 0.45} and classifier["attack/sst"] == {0: 0.2}
    assert "attack/sst" not in knn["KNN-BERT, φ 0.25"] and "attack/sst" not in knn["KNN-BERT, φ 1 (KNN only)"]
    text = robustness_table.render(results, {"ce": {"clean": 12.0}}, {"sst_acc": 0.25, "para_acc": 0.55})
    lines = text.splitlines()
    # after / clean on the same subset; fs100's seed 0 (0.2 < 0.25 + 0.02) is marked as at the majority class
    assert "| CE baseline | 0.450 ± 0.071 | 0.300 ± 0.141 † | – | – | 0.100 / 0.400 |" in lines
    assert "| CE baseline | 0.800 ± 0.000 | 0.650 ± 0.071 | – | – | 0.300 / 0.700 |" in lines  # Quora: no mark
    # against CE, paired by seed: +0.05 on both seeds; φ 0.25 and the vote alone have no attack cell
    assert "| KNN-BERT, classifier alone (φ 0) | +0.050 [+0.050, +0.050]* | – | – | – | +0.100 |" in lines
    assert "| KNN-BERT, φ 0.25 | +0.010 [-0.625, +0.645] | – | – | – | – |" in lines
    assert not any(line.startswith("| SCL") for line in lines)  # a method with no finished cell has no row
    paths = robustness_table.plot(tmp_path, results, {"sst_acc": 0.25, "para_acc": 0.62}, "t")
    assert [p.name for p in paths] == ["robustness-sst.png", "robustness-para.png"]
    for p in paths:
        image = matplotlib.image.imread(p)
        assert image.shape[0] > 100 and image.shape[1] > 100 and image[..., :3].std() > 0.05  # drawn, not blank


def test_every_robustness_cell_is_the_ablation_ce_row_on_two_tasks():
    """Each cell's flags build a valid configuration: the ablation's CE row at its budget on SST and Quora, the
    method's objective, the condition's epochs."""
    ce = cli.build_invocation(*arguments.parse(row_flags("cpu")["ce"] + ["--out-dir", "u"], arguments.build_parser())).config
    for method in robustness_table.METHODS:
        for cond in robustness_table.TRAINED:
            flags = robustness_table.train_flags("cpu", method, cond)
            cfg = cli.build_invocation(*arguments.parse(flags + ["--out-dir", "u"], arguments.build_parser())).config
            assert cfg.tasks == ("sst", "para") and cfg.max_train_examples == {"sst": 2000, "para": 2000}
            assert list(cfg.objectives) == ([] if method == "ce" else [method])
            assert (cfg.epochs, cfg.batch_size) == {"fs100": (10, 16), "fs1000": (2, 32)}.get(cond, (1, 32))
            if method == "knn_bert":  # k below the few-shot store's 100 examples, else the vote is its prior
                assert cfg.objectives["knn_bert"].get("knn_k", 100) == (10 if cond == "fs100" else 100)
            assert (cfg.model, cfg.lr, cfg.head_lr_scale, cfg.schedule) == (ce.model, ce.lr, ce.head_lr_scale,
                                                                            ce.schedule)


def test_robustness_condition_data_is_written_once_and_perturbed_exactly(tmp_path):
    """clean trains on the data itself; a perturbed copy has exactly its rate / size, is the same for the same
    seed, and is reused as it is (never rewritten under a run that reads it)."""
    from tasks.task import load_split
    from tests.helpers import write_tiny_data

    src = write_tiny_data(tmp_path / "data", n_train=150)
    root = tmp_path / "sweep"
    assert robustness_table.condition_data(src, root, "clean", 0) == src
    noisy = robustness_table.condition_data(src, root, "noise10", 1)
    clean_sst, noisy_sst = load_split("sst", "train", src)[0], load_split("sst", "train", noisy)[0]
    assert sum(a.label != b.label for a, b in zip(clean_sst, noisy_sst)) == 15  # 10% of 150
    assert (noisy / "sts-train.csv").is_symlink() and not list(root.joinpath("data").glob("*.partial"))
    stamp = (noisy / "ids-sst-train.csv").stat().st_mtime_ns
    assert robustness_table.condition_data(src, root, "noise10", 1) == noisy
    assert (noisy / "ids-sst-train.csv").stat().st_mtime_ns == stamp
    other = robustness_table.condition_data(src, root, "noise10", 2)
    assert load_split("sst", "train", other)[0] != noisy_sst  # another seed flips other labels
    few = robustness_table.condition_data(src, root, "fs100", 0)
    assert len(load_split("para", "train", few)[0]) == 100 and len(load_split("sst", "train", few)[0]) == 100
    other_data = write_tiny_data(tmp_path / "other", n_train=150)
    with pytest.raises(SystemExit, match="was made from .*/data, not .*/other: use another --out-dir"):
        robustness_table.condition_data(other_data, root, "noise10", 1)  # never reused for other data


def test_robustness_cells_pair_each_seed_with_its_data_and_checkpoint(tmp_path, capsys):
    """The commands of a dry run: each training cell gets its condition's copy for its seed, and --seed that
    seed; each attack the clean checkpoint of its own method and seed."""
    sweep = Sweep(tmp_path, dry_run=True)
    src = tmp_path / "data"
    robustness_table.run_cells(sweep, "cpu", ["ce", "rift"], ["fs100", "attack"], [1, 2], src)
    lines = capsys.readouterr().out.splitlines()
    names = [line.split("]")[0][1:] for line in lines]
    assert names == [f"{m}/{c}/seed{s}" for s in (1, 2) for c in ("clean", "fs100") for m in ("ce", "rift")] + [
        f"{m}/attack/seed{s}" for s in (1, 2) for m in ("ce", "rift")]
    for name, line in zip(names, lines):
        method, cond, seed = name.split("/")
        seed = seed[4:]
        args = line.split()
        if cond == "attack":
            assert args[args.index("--checkpoint") + 1] == str(tmp_path / method / "clean" / f"seed{seed}" /
                                                              "checkpoints" / "best")
            assert args[args.index("--data-dir") + 1] == str(src)
        else:
            data = src if cond == "clean" else tmp_path / "data" / f"{cond}-seed{seed}"
            assert args[args.index("--data-dir") + 1] == str(data)
            assert args[args.index("--out-dir") + 1] == str(tmp_path / name)
            assert ("--objective" in args) == (method == "rift")
        assert args[args.index("--seed") + 1] == seed
    assert not (tmp_path / "data").exists()  # a dry run writes no data


def test_robustness_collect_reads_finished_cells_and_attacks(tmp_path):
    """Finished training cells (their final record, KNN-BERT's φ variants) and attack results, per seed; an
    unfinished cell is left out; wall times add up over seeds."""
    for seed in (0, 1):
        run = tmp_path / "knn_bert" / "noise10" / f"seed{seed}"
        run.mkdir(parents=True)
        record = {"final": True, "dev": {"sst_acc": 0.4 + seed / 10, "para_acc": 0.7, "sts_r": None},
                  "knn": {"phi": 0.25, "dev": {"sst_acc": 0.5}, "dev_knn_only": {"sst_acc": 0.6}}}
        (run / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        (run / "sweep.json").write_text(json.dumps({"wall_s": 10.0}))
    (tmp_path / "ce" / "clean" / "seed0").mkdir(parents=True)  # started, not finished
    attack = tmp_path / "ce" / "attack" / "seed0"
    attack.mkdir(parents=True)
    (attack / "results.json").write_text(json.dumps({"tasks": {"sst": {"after_attack_acc": 0.3, "clean_acc": 0.4}}}))
    results, times = robustness_table.collect(tmp_path, [0, 1])
    assert results["knn_bert"]["noise10"][1] == {"sst_acc": 0.5, "para_acc": 0.7, "knn_phi0.25.sst_acc": 0.5,
                                                 "knn_phi1.sst_acc": 0.6}
    assert results["ce"] == {"attack": {0: {"sst": {"after_attack_acc": 0.3, "clean_acc": 0.4}}}}
    assert times == {"knn_bert": {"noise10": 20.0}}
    # a cell recorded with another command (another budget, other data) is left out, not mixed in
    (tmp_path / "knn_bert" / "noise10" / "seed0" / "sweep.json").write_text(json.dumps({"argv": ["a"], "wall_s": 1}))
    results, _ = robustness_table.collect(tmp_path, [0, 1], lambda m, c, s: ["a"])
    assert list(results) == ["knn_bert"] and list(results["knn_bert"]["noise10"]) == [0]
