"""The experiment scripts' own logic: cumulative flags of the ablation ladder, tables of the robustness sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from experiments.ablation import LADDER, merge_flags, row_flags
from experiments.robustness_table import cell, render, score_rows
from experiments.sweep import _run_lock, final_record
from tasks import cli


def test_merge_flags_replaces_values_and_accumulates_objectives():
    merged = merge_flags(["--schedule", "sequential", "--objective", "mnr", "--mnr-tasks", "nli"],
                         ["--schedule", "even", "--objective", "simcse", "--mnr-tasks", "sts", "nli"])
    assert merged == ["--schedule", "even", "--objective", "mnr", "--objective", "simcse", "--mnr-tasks", "sts", "nli"]


def test_every_ablation_row_parses_and_adds_to_the_row_above():
    """Each row's flags build a valid configuration (refusals would exit 2) that differs from the previous row's."""
    rows = row_flags("cpu")
    assert list(rows) == [name for name, _, _ in LADDER]
    previous = None
    for name, flags in rows.items():
        parser = cli.build_parser()
        command, explicit = cli.parse(flags + ["--out-dir", "unused"], parser)
        cfg = cli.build_invocation(command, explicit).config
        assert cfg.epochs == 1 and cfg.max_train_examples["para"] == 3000 and cfg.max_train_examples["sst"] == 4000
        if previous is not None:
            assert cfg.to_dict() != previous.to_dict(), name
        previous = cfg
    assert set(previous.objectives) == {"mnr", "simcse", "smart"} and previous.bf16 is False
    assert previous.nli and previous.model.arch == "b1" and previous.loss_weights == {"para": 0.1}
    assert previous.max_train_examples == {"sst": 4000, "para": 3000, "sts": 3000, "nli": 3000}


def test_robustness_rows_cells_and_knn_variants():
    results = {"ce": {"clean": [{"sst_acc": 0.5, "para_acc": 0.8}],
                      "fs100": [{"sst_acc": 0.2, "para_acc": 0.6}, {"sst_acc": 0.4, "para_acc": 0.7}],
                      "attack": {"sst": {"after_attack_acc": 0.1, "clean_acc": 0.4},
                                 "para": {"after_attack_acc": 0.3, "clean_acc": 0.7}}},
               "knn_bert": {"clean": [{"sst_acc": 0.45, "knn_phi0.25.sst_acc": 0.46, "knn_phi1.sst_acc": 0.47}],
                            "attack": {"sst": {"after_attack_acc": 0.2, "clean_acc": 0.45}}}}
    ce = dict(score_rows("ce", results))["CE baseline"]
    assert ce["fs100/sst"] == [0.2, 0.4] and ce["attack/para"] == [0.3]
    assert cell(ce["fs100/sst"]) == "0.300 ± 0.141" and cell([]) == "–"
    knn = dict(score_rows("knn_bert", results))
    assert knn["KNN-BERT, φ 0.25"]["clean/sst"] == [0.46] and knn["KNN-BERT, φ 1 (KNN only)"]["clean/sst"] == [0.47]
    # the attack targets the classifier: its cell is on the φ 0 row, never on the rows that add the KNN vote
    classifier = knn["KNN-BERT, classifier alone (φ 0)"]
    assert classifier["clean/sst"] == [0.45] and classifier["attack/sst"] == [0.2]
    assert "attack/sst" not in knn["KNN-BERT, φ 0.25"] and "attack/sst" not in knn["KNN-BERT, φ 1 (KNN only)"]
    text = render(results, {"ce": {"clean": 12.0}})
    assert "| CE baseline | 0.500 | 0.300 ± 0.141 | – | – | 0.100 / 0.400 |" in text  # after / clean on the same subset


def test_final_record_is_the_last_final_line(tmp_path):
    assert final_record(tmp_path) is None
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"epoch": 1}, {"final": True, "dev": {"overall": 0.1}}, {"final": True, "dev": {"overall": 0.2}})) + "\n")
    assert final_record(tmp_path)["dev"]["overall"] == 0.2


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
