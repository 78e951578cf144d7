"""Tests of experiments/ensemble_mixes.py: each draw scored as python -m tasks.ensemble would score it."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from tasks.evaluation.metrics import overall_score, task_metric
from tasks.task import MULTITASK


def test_ensemble_mixes_score_each_draw_as_the_ensemble_command_would(tmp_path, capsys):
    """A mix with one possible draw scores what python -m tasks.ensemble gives for those runs, std 0; a
    specialist joins SST only; a mix larger than its pool is refused (exit 2), one with no full member is a
    one-line error (exit 1)."""
    from experiments import ensemble_mixes
    from tasks.ensemble import main as ensemble_main
    from tests.helpers import make_runs, model_logits, write_run_logits

    runs = make_runs(tmp_path)
    labels = [int(line.split("\t")[3]) for line in (tmp_path / "data" / "ids-sst-dev.csv").read_text().splitlines()[1:]]
    special = tmp_path / "sst-only"
    write_run_logits(special, "predictions", "sst", "dev", [f"sst{i}" for i in range(60)],
                     model_logits("sst", torch.tensor(labels), 1, 77))
    write_run_logits(special, "predictions", "sst", "test", [f"t{i}" for i in range(7)], torch.randn(7, 5))
    (special / "config.json").write_text(json.dumps({"tasks": ["sst"]}))
    data = ["--data-dir", str(tmp_path / "data")]
    rows = ensemble_mixes.main(["--pool", "full", runs[0], runs[1], "--pool", "sst", str(special),
                                "--mix", "full=2", "--mix", "full=2,sst=1", "--mix", "full=1", "--draws", "20",
                                *data])["mixes"]
    for row, members in zip(rows, ([runs[0], runs[1]], [runs[0], runs[1], str(special)])):
        summary = ensemble_main([*members, "--out-dir", str(tmp_path / "ens"), *data])
        whole = overall_score({task_metric(t): r["ensemble_score"] for t, r in summary["tasks"].items()})
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


def test_paired_gains_are_the_ensemble_commands_scores_subtracted(tmp_path, capsys):
    """--paired A B: at k = n the change is B's whole ensemble minus A's as python -m tasks.ensemble scores them;
    at k = 1 the mean of the single runs' paired changes, with their range; pools of unequal size are refused."""
    from experiments import ensemble_mixes
    from tasks.ensemble import main as ensemble_main
    from tests.helpers import make_runs

    runs = make_runs(tmp_path)
    data = ["--data-dir", str(tmp_path / "data")]
    parent, change = [runs[2], runs[0]], [runs[1], runs[2]]  # seed 0: noise -> informative; seed 1 the reverse
    rows = ensemble_mixes.main(["--pool", "a", *parent, "--pool", "b", *change, "--paired", "a", "b", *data])["paired"]

    def whole(members, name):
        summary = ensemble_main([*members, "--out-dir", str(tmp_path / name), *data])
        scores = {task_metric(t): r["ensemble_score"] for t, r in summary["tasks"].items()}
        return {**scores, "overall": overall_score(scores)}

    single = [(whole([b], f"b{i}"), whole([a], f"a{i}")) for i, (a, b) in enumerate(zip(parent, change))]
    both = whole(change, "b"), whole(parent, "a")
    assert [row["k"] for row in rows] == [1, 2] and [row["subsets"] for row in rows] == [2, 1]
    for metric in (*(task_metric(t) for t in MULTITASK), "overall"):
        deltas = [b[metric] - a[metric] for b, a in single]
        assert rows[0][metric] == pytest.approx((sum(deltas) / 2, min(deltas), max(deltas)), abs=1e-12)
        assert rows[1][metric] == pytest.approx((both[0][metric] - both[1][metric],) * 3, abs=1e-12)
    assert min(d[0]["overall"] - d[1]["overall"] for d in single) < 0 < rows[0]["overall"][2]  # a range, not a point
    out = capsys.readouterr().out
    assert "| 2 | 1 |" in out and "| 2, SE | 400 seed resamples |" in out and rows[1]["se"]["overall"] > 0
    with pytest.raises(SystemExit) as e:
        ensemble_mixes.main(["--pool", "a", *parent, "--pool", "b", runs[1], "--paired", "a", "b", *data])
    assert e.value.code == 2 and "hold 2 and 1 runs" in capsys.readouterr().err


def test_paired_specialists_beside_the_same_full_members(tmp_path, capsys):
    """--beside: the full members join both arms' ensembles, so a change of the SST specialists is scored as the
    leaderboard command mixes them; specialists alone have no Quora run, and --beside needs --paired."""
    from experiments import ensemble_mixes
    from tasks.ensemble import main as ensemble_main
    from tests.helpers import make_runs, model_logits, write_run_logits

    runs = make_runs(tmp_path)
    labels = torch.tensor([int(line.split("\t")[3])
                           for line in (tmp_path / "data" / "ids-sst-dev.csv").read_text().splitlines()[1:]])
    specialists = []
    for name, quality in (("noise", 0), ("informed", 1)):
        run = tmp_path / name
        write_run_logits(run, "predictions", "sst", "dev", [f"sst{i}" for i in range(60)],
                         model_logits("sst", labels, quality, 5))
        write_run_logits(run, "predictions", "sst", "test", [f"t{i}" for i in range(7)], torch.randn(7, 5))
        (run / "config.json").write_text(json.dumps({"tasks": ["sst"]}))
        specialists.append(str(run))
    data = ["--data-dir", str(tmp_path / "data")]
    rows = ensemble_mixes.main(["--pool", "full", runs[0], runs[2], "--pool", "a", specialists[0],
                                "--pool", "b", specialists[1], "--paired", "a", "b", "--beside", "full",
                                *data])["paired"]
    whole = {}
    for arm, specialist in zip("ab", specialists):
        summary = ensemble_main([runs[0], runs[2], specialist, "--out-dir", str(tmp_path / arm), *data])
        whole[arm] = {task_metric(t): r["ensemble_score"] for t, r in summary["tasks"].items()}
    gain = whole["b"]["sst_acc"] - whole["a"]["sst_acc"]
    assert gain > 0 and rows[0]["sst_acc"] == pytest.approx((gain,) * 3, abs=1e-12)
    assert rows[0]["para_acc"] == (0, 0, 0)  # the specialists join SST only
    assert rows[0]["overall"][0] == pytest.approx(gain / 3, abs=1e-12)
    assert "each beside every run of full" in capsys.readouterr().out
    for argv, message in ((["--paired", "a", "b"], "has no run for para"),
                          (["--mix", "a=1", "--beside", "full"], "give --paired PARENT CHANGE too"),
                          (["--paired", "a", "b", "--beside", "a"], "--beside a: name a --pool other than"),
                          (["--paired", "a", "b", "--beside", "full", "full"], "pool 'a' with --beside full full holds a run twice")):
        with pytest.raises(SystemExit):
            ensemble_mixes.main(["--pool", "full", runs[0], "--pool", "a", specialists[0],
                                 "--pool", "b", specialists[1], *argv, *data])
        assert message in capsys.readouterr().err


def test_paired_se_is_a_bootstrap_over_the_seeds():
    """The whole ensembles' SE under --paired: seeds drawn with replacement, the same seeds in both arms, the runs
    beside in every draw. On a scorer whose ensemble scores the mean of its runs' values, the change of a draw is the
    mean of its seeds' paired differences, so the SE is the bootstrap's SE of a mean (about std/√n) and 0 where every
    seed's difference is the same; the full members beside move nothing."""
    import random
    import statistics

    from experiments import ensemble_mixes

    class MeanScorer:
        def __init__(self, values):
            self.values = values

        def metrics(self, runs):
            mean = statistics.mean(self.values[run] for run in runs)
            return {m: mean for m in ensemble_mixes.METRICS}

    parent, change = [f"a{i}" for i in range(8)], [f"b{i}" for i in range(8)]
    diffs = [0.01, -0.02, 0.03, 0.0, 0.05, -0.01, 0.02, 0.04]
    values = {**{a: 0.5 for a in parent}, **{b: 0.5 + d for b, d in zip(change, diffs)}}
    se = ensemble_mixes.paired_se(MeanScorer(values), parent, change, [], 4000, random.Random(0))
    expected = statistics.pstdev(diffs) / len(diffs) ** 0.5  # the bootstrap's SE of a mean
    assert se["overall"] == pytest.approx(expected, rel=0.05)
    same = {**values, **{b: 0.53 for b in change}}
    assert ensemble_mixes.paired_se(MeanScorer(same), parent, change, [], 200, random.Random(0))["overall"] == 0
    beside = {**values, "full": 0.9}  # a run in both arms of every draw dilutes the change by n/(n+1), no more
    with_full = ensemble_mixes.paired_se(MeanScorer(beside), parent, change, ["full"], 4000, random.Random(0))
    assert with_full["overall"] == pytest.approx(se["overall"] * 8 / 9, rel=1e-9)


@pytest.mark.parametrize("argv, message", [
    (["--pool", "p", "r1", "./r1", "--mix", "p=2"], "--pool p holds run r1 twice (./r1)"),
    (["--pool", "p", "r1", "--pool", "q", "r1/", "--mix", "p=1,q=1"], "--mix p=1,q=1: pools p and q share run r1"),
    (["--pool", "full", "r1", "--pool", "a", "./r1", "--pool", "b", "r2", "--paired", "a", "b", "--beside", "full"],
     "pool 'a' with --beside full holds a run twice"),
])
def test_a_run_is_one_run_however_its_path_is_spelt(tmp_path, monkeypatch, capsys, argv, message):
    """An ensemble holds each run once: the same run named twice (./r1, r1/) in a pool or in two pools of one mix
    is refused before anything is read, instead of averaged twice."""
    from experiments import ensemble_mixes
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r1").mkdir()
    (tmp_path / "r2").mkdir()
    with pytest.raises(SystemExit) as e:
        ensemble_mixes.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
