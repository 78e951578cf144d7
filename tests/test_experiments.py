"""The experiment scripts' own logic: cumulative flags of the ablation ladder, tables of the robustness sweep."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from experiments import ablation, robustness_table
from experiments.ablation import CONTRASTIVE, LADDER, ROWS, collect, merge_flags, render, row_flags
from experiments.stats import cell, change, change_cell, plot_rows
from experiments.sweep import Sweep, _run_lock, final_record
from tasks import train as cli
from tasks.evaluation.metrics import TASK_METRIC, overall_score


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
        parser = cli.build_parser()
        command, explicit = cli.parse(flags + ["--out-dir", "unused"], parser)
        cfg = configs[name] = cli.build_invocation(command, explicit).config
        assert cfg.epochs == 1 and cfg.max_train_examples["para"] == 2000 and cfg.max_train_examples["sst"] == 2000
        assert cfg.model.pooling == "mean" and cfg.head_lr_scale == 10
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


def test_stats_cells_and_paired_changes():
    assert cell([0.47, 0.48, 0.46]) == "0.470 ± 0.010" and cell([0.5]) == "0.500" and cell([]) == "–"
    row, parent = {0: 0.50, 1: 0.52, 2: 0.51, 3: 0.9}, {0: 0.40, 1: 0.43, 2: 0.41}
    delta, se, n = change(row, parent)  # seed 3 has no parent run: left out of the pairs
    assert n == 3 and delta == pytest.approx(0.0966667, abs=1e-6) and se == pytest.approx(0.0033333, abs=1e-6)
    assert change_cell(row, parent) == "+0.097 ± 0.003*"
    assert change_cell({0: 0.50, 1: 0.40}, {0: 0.45, 1: 0.44}).endswith("± 0.045")  # |Δ| < 2 SE: no star
    assert change_cell({0: 0.5}, {}) == "–"


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
    assert "+0.050 ± 0.000*" in even  # SST: the same +0.05 on every seed
    assert "CE: b1 heads, cross-encoded pairs, mean pooling (at the majority class: para, seeds 1) |" in contrastive
    plot_rows(tmp_path / "p.png", ["a", "b"], {"overall": [[0.5, 0.6], [0.7]]}, "t", {"overall": 0.55})
    assert (tmp_path / "p.png").stat().st_size > 1000


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
    assert "| KNN-BERT, classifier alone (φ 0) | +0.050 ± 0.000* | – | – | – | +0.100 |" in lines
    assert "| KNN-BERT, φ 0.25 | +0.010 ± 0.050 | – | – | – | – |" in lines
    assert not any(line.startswith("| SCL") for line in lines)  # a method with no finished cell has no row
    paths = robustness_table.plot(tmp_path, results, {"sst_acc": 0.25, "para_acc": 0.62}, "t")
    assert [p.name for p in paths] == ["robustness-sst.png", "robustness-para.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_every_robustness_cell_is_the_ablation_ce_row_on_two_tasks():
    """Each cell's flags build a valid configuration: the ablation's CE row at its budget on SST and Quora, the
    method's objective, the condition's epochs."""
    ce = cli.build_invocation(*cli.parse(row_flags("cpu")["ce"] + ["--out-dir", "u"], cli.build_parser())).config
    for method in robustness_table.METHODS:
        for cond in robustness_table.TRAINED:
            flags = robustness_table.train_flags("cpu", method, cond)
            cfg = cli.build_invocation(*cli.parse(flags + ["--out-dir", "u"], cli.build_parser())).config
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
    from tasks.data.readers import load_split
    from tests.test_train import write_tiny_data

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


def test_final_record_is_the_last_final_line(tmp_path):
    assert final_record(tmp_path) is None
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"epoch": 1}, {"final": True, "dev": {"overall": 0.1}}, {"final": True, "dev": {"overall": 0.2}})) + "\n")
    assert final_record(tmp_path)["dev"]["overall"] == 0.2


def test_the_costliest_items_start_first_and_results_keep_their_order(tmp_path):
    """Longest first: with two jobs the two costliest items start together, the cheap ones after; one job runs
    them in cost order (ties in the items' order). Results come back in the items' order."""
    items = ["a", "bb", "c", "dddd", "ee"]
    started = []
    one = Sweep(tmp_path, jobs=1)
    assert one.map(str.upper, items) == ["A", "BB", "C", "DDDD", "EE"]
    assert one.map(lambda s: started.append(s) or s.upper(), items, cost=len) == ["A", "BB", "C", "DDDD", "EE"]
    assert started == ["dddd", "bb", "ee", "a", "c"]

    started.clear()
    both_started = threading.Barrier(2, timeout=30)  # the first two calls wait for each other: nothing else starts
    lock = threading.Lock()

    def run(item: str) -> str:
        with lock:
            started.append(item)
            first_two = len(started) <= 2
        if first_two:
            both_started.wait()
        return item.upper()

    assert Sweep(tmp_path, jobs=2).map(run, items, cost=len) == ["A", "BB", "C", "DDDD", "EE"]
    assert set(started[:2]) == {"dddd", "bb"} and set(started) == set(items)


def test_progress_lines_are_written_whole(tmp_path, monkeypatch):
    """Two jobs' threads print progress at once: each line goes out in one write, newline included, so lines
    cannot run into one another (print writes the text and its newline apart)."""
    writes = []

    class Recorder:
        def write(self, text):
            writes.append(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Recorder())
    sweep = Sweep(tmp_path, dry_run=True)
    sweep.command("row", ["--epochs", "1"])
    (tmp_path / "row").mkdir()
    (tmp_path / "row" / "sweep.json").write_text(json.dumps({"argv": ["--epochs", "1"], "module": None, "wall_s": 3}))
    sweep.command("row", ["--epochs", "1"])
    assert len(writes) == 2 and all(w.startswith("[row] ") and w.endswith("\n") for w in writes), writes


def test_a_run_directory_in_use_by_a_live_sweep_is_refused(tmp_path):
    """Two sweep processes must not run the same row (the second's --overwrite would wipe the first's files): a
    lock held by a live process refuses, one left by a dead process is taken over and removed after the run."""
    lock = tmp_path / "sweep.lock"
    lock.write_text(str(os.getpid()))  # a live owner
    with pytest.raises(SystemExit, match=rf"in use by process {os.getpid()}"):
        with _run_lock(tmp_path, "row"):
            pass
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(dead.stdout.strip())  # its owner has exited
    with _run_lock(tmp_path, "row"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()


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


def test_a_finished_run_made_with_other_defaults_is_trained_again(tmp_path, capsys):
    """A sweep reuses a finished run only when its config.json is the one its command gives with today's
    defaults: the same argv recorded before a default changed (here the STS prior) is trained again."""
    sweep = Sweep(tmp_path, dry_run=True)
    flags = ["--seed", "3", "--epochs", "2"]
    run = tmp_path / "member"
    run.mkdir()
    (run / "sweep.json").write_text(json.dumps({"argv": sweep.train_argv("member", flags), "module": None,
                                                "wall_s": 12.0}))
    (run / "metrics.jsonl").write_text(json.dumps({"final": True, "dev": {"overall": 0.5}}) + "\n")
    today = cli.config_for(sweep.train_argv("member", flags)).to_dict()
    assert today["seed"] == 3 and today["epochs"] == 2 and today["out_dir"] == str(run)
    (run / "config.json").write_text(json.dumps(today))
    sweep.train("member", flags)
    assert "reusing the finished run" in capsys.readouterr().out
    (run / "config.json").write_text(json.dumps({**today, "sts_prior": 0.25}))  # as if the default had been 0.25
    sweep.train("member", flags)
    out = capsys.readouterr().out
    assert "reusing" not in out and "made with other settings (sts_prior)" in out and "python" in out
    older = {k: v for k, v in today.items() if k != "sts_prior"}  # written before the field existed: its legacy 0
    (run / "config.json").write_text(json.dumps(older))
    sweep.train("member", [*flags, "--sts-prior", "0"])
    out = capsys.readouterr().out  # the same settings as the record's (legacy 0), but another argv: it runs
    assert "made with other settings" not in out and "reusing" not in out and "python" in out
    (run / "sweep.json").write_text(json.dumps({"argv": sweep.train_argv("member", [*flags, "--sts-prior", "0"]),
                                                "module": None, "wall_s": 12.0}))
    sweep.train("member", [*flags, "--sts-prior", "0"])
    assert "reusing the finished run" in capsys.readouterr().out


def test_training_tokens_count_every_planned_example_once_per_appearance():
    """token_budget counts the real tokens of each planned example: an uncapped epoch is every example once,
    Siamese pairs count both sides, a swapped pair (index i + N) counts as pair i, SWA epochs are included."""
    from experiments.token_budget import example_tokens, training_tokens
    from tasks.config import TrainConfig
    from tasks.data.datasets import PairDataset, SentenceDataset
    from tasks.data.readers import Example
    from tests.helpers import WordTokenizer

    tok = WordTokenizer()
    sst = SentenceDataset([Example(f"s{i}", "w " * (i + 1)) for i in range(10)], tok)
    pairs = [Example(f"p{i}", "a " * (i + 1), "b " * (2 * i + 1), 1.0) for i in range(12)]
    cross, siamese = PairDataset(pairs, tok, mode="cross"), PairDataset(pairs, tok, mode="siamese")
    assert example_tokens(sst) == [i + 3 for i in range(10)]  # [CLS] w.. [SEP]: i + 1 words + 2
    assert example_tokens(cross) == [3 * i + 5 for i in range(12)]  # [CLS] a [SEP] b [SEP]
    assert example_tokens(siamese) == [3 * i + 6 for i in range(12)]  # [CLS] a [SEP], [CLS] b [SEP]
    cfg = TrainConfig(tasks=("sst", "para"), batch_size=4, epochs=2, max_train_examples={}, pair_swap=0.5)
    totals = training_tokens(cfg, {"sst": sst, "para": cross})
    assert totals == {"sst": 2 * sum(example_tokens(sst)), "para": 2 * sum(example_tokens(cross))}
    capped = TrainConfig(tasks=("sst", "para"), batch_size=4, epochs=1, swa_epochs=2, max_train_examples={"para": 4},
                         train_subsets="cycle")
    assert training_tokens(capped, {"sst": sst, "para": siamese})["para"] == sum(example_tokens(siamese))  # 3 x 4


def test_token_budget_refuses_bad_flags_and_missing_data_in_one_line(tmp_path, capsys):
    """A flag train_multitask.py refuses ends with exit status 2, a data file that is not there with exit status
    1; both name the recipe and neither is a traceback."""
    from experiments import token_budget

    with pytest.raises(SystemExit) as e:
        token_budget.main(["--candidate=--bogus"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "unrecognized argument --bogus" in err and "candidate '--bogus'" in err
    with pytest.raises(SystemExit) as e:
        token_budget.main([f"--candidate=--pretrained {tmp_path / 'no'}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"no checkpoint directory at {tmp_path / 'no'}" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as e:
        token_budget.main([f"--candidate=--data-dir {tmp_path}"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and f"{tmp_path}/ids-sst-train.csv" in err and "Traceback" not in err
    assert err.startswith("token_budget.py: error: ") and len(err.strip().splitlines()) == 1


def test_a_sweeps_relative_paths_mean_what_they_mean_where_it_was_started(tmp_path, monkeypatch):
    """A sweep started outside the project reads and writes its runs where its own relative paths point: the
    commands it runs (here python -m json.tool IN OUT) see the same relative paths, not the project's."""
    monkeypatch.chdir(tmp_path)
    Path("in.json").write_text('{"a": 1}')
    Sweep("runs").command("row", ["in.json", "runs/row/out.json"], module="json.tool")
    assert json.loads((tmp_path / "runs" / "row" / "out.json").read_text()) == {"a": 1}


@pytest.mark.parametrize("recorded_absolute", [False, True])
def test_a_finished_run_is_reused_however_its_directory_is_spelled(tmp_path, monkeypatch, capsys, recorded_absolute):
    """runs/x and /abs/runs/x are one directory: a second call of a command that spells --out-dir the other way
    reuses the finished run instead of training it again over it (which --overwrite would delete)."""
    monkeypatch.chdir(tmp_path)
    relative, absolute = Sweep("runs", dry_run=True), Sweep(tmp_path / "runs", dry_run=True)
    first, second = (absolute, relative) if recorded_absolute else (relative, absolute)
    flags = ["--seed", "3", "--data-dir", "data"]
    run = tmp_path / "runs" / "member"
    run.mkdir(parents=True)
    (run / "sweep.json").write_text(json.dumps({"argv": first.train_argv("member", flags), "module": None,
                                                "wall_s": 12.0}))
    (run / "metrics.jsonl").write_text(json.dumps({"final": True, "dev": {"overall": 0.5}}) + "\n")
    (run / "config.json").write_text(json.dumps(cli.config_for(first.train_argv("member", flags)).to_dict()))
    second.train("member", [*flags[:2], "--data-dir", str(tmp_path / "data")])
    out = capsys.readouterr().out
    assert "reusing the finished run" in out and "made with other settings" not in out
    second.train("member", [*flags[:2], "--data-dir", "other"])
    assert "made with other settings (data_dir)" in capsys.readouterr().out  # another directory is another run


def test_ensemble_mixes_score_each_draw_as_the_ensemble_command_would(tmp_path, capsys):
    """A mix with one possible draw scores what python -m tasks.ensemble gives for those runs, std 0; a
    specialist joins SST only; a mix larger than its pool is refused (exit 2), one with no full member is a
    one-line error (exit 1)."""
    from experiments import ensemble_mixes
    from tasks.ensemble import main as ensemble_main
    from tests.test_ensemble import _make_runs, _model, _write_run

    runs = _make_runs(tmp_path)
    labels = [int(line.split("\t")[3]) for line in (tmp_path / "data" / "ids-sst-dev.csv").read_text().splitlines()[1:]]
    special = tmp_path / "sst-only"
    _write_run(special, "predictions", "sst", "dev", [f"sst{i}" for i in range(60)],
               _model("sst", torch.tensor(labels), 1, 77))
    _write_run(special, "predictions", "sst", "test", [f"t{i}" for i in range(7)], torch.randn(7, 5))
    (special / "config.json").write_text(json.dumps({"tasks": ["sst"]}))
    data = ["--data-dir", str(tmp_path / "data")]
    rows = ensemble_mixes.main(["--pool", "full", runs[0], runs[1], "--pool", "sst", str(special),
                                "--mix", "full=2", "--mix", "full=2,sst=1", "--mix", "full=1", "--draws", "20", *data])
    for row, members in zip(rows, ([runs[0], runs[1]], [runs[0], runs[1], str(special)])):
        summary = ensemble_main([*members, "--out-dir", str(tmp_path / "ens"), *data])
        whole = overall_score({TASK_METRIC[t]: r["ensemble_score"] for t, r in summary["tasks"].items()})
        assert row["std"] == 0 and row["mean"] == pytest.approx(whole, abs=1e-12)
    assert rows[1]["mean"] != rows[0]["mean"] and rows[2]["std"] > 0  # full=1: either run, both drawn
    assert "| full=2,sst=1 |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        ensemble_mixes.main(["--pool", "full", runs[0], "--mix", "full=2", *data])
    assert e.value.code == 2 and "which has 1 runs" in capsys.readouterr().err
    for pools, message in ((["--pool", "full", runs[0], "--pool", "sst", str(special)], "has no run for para"),
                           (["--pool", "sst", str(special)], "no run has para-dev-logits.csv")):
        with pytest.raises(SystemExit) as e:
            ensemble_mixes.main([*pools, "--mix", "sst=1", *data])
        err = capsys.readouterr().err
        assert e.value.code == 1 and message in err and len(err.strip().splitlines()) == 1, err
    assert logging.root.manager.disable == logging.NOTSET  # the script's quiet spell ends with it
