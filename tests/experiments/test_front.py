"""Tests of experiments/front.py: every point spells out its recipe, the table pairs each point with the reference
by seed, and the rule picks the fastest point whose paired interval includes 0 within the tolerance."""

from __future__ import annotations

import json

import pytest

from experiments import front
from experiments import sweep as sweep_module
from experiments.front import POINTS, REFERENCE, Verdict, choices, collect, render
from experiments.sweep import Sweep
from tasks import arguments


def test_every_point_is_a_run_the_train_command_accepts_and_names_its_epochs():
    """Each point's flags parse into a TrainConfig other than the reference's, and name their epochs: a point is
    the same run whatever the default's epochs (e2, the default, is the default with its flags)."""
    reference = arguments.config_for([*POINTS[REFERENCE][1], "--out-dir", "unused"]).to_dict()
    for point, (_, flags) in POINTS.items():
        cfg = arguments.config_for([*flags, "--out-dir", "unused"]).to_dict()
        assert point == REFERENCE or cfg != reference, point
        assert "--epochs" in flags, point
    default = arguments.config_for(["--out-dir", "unused"]).to_dict()
    assert arguments.config_for([*POINTS["e2"][1], "--out-dir", "unused"]).to_dict() == default


def _runs(tmp_path, overall: dict[str, list[float]], walls: dict[str, float]) -> dict:
    for point, per_seed in overall.items():
        for seed, value in enumerate(per_seed):
            run = tmp_path / point / f"seed{seed}"
            run.mkdir(parents=True)
            dev = {"sst_acc": 0.5, "para_acc": 0.86, "sts_r": 0.88, "overall": value}
            (run / "metrics.jsonl").write_text(json.dumps({"final": True, "dev": dev}) + "\n")
            (run / "sweep.json").write_text(json.dumps({"wall_s": walls[point] * 60}))
    return collect(Sweep(tmp_path), list(overall), [0, 1, 2])


def test_the_rule_takes_the_fastest_point_within_the_tolerance_whose_interval_includes_zero(tmp_path):
    """e1 is fastest but loses 0.02 on every seed (its interval excludes 0); e2 loses 0.001 on the mean with an
    interval holding 0: chosen over the slower nodrop; a point 0.004 below on the mean does not qualify however
    wide its interval. Quick is the best point at about a third of the chosen default's minutes (e1, at 7 of
    e2's 20), not of the reference's 30 (which would also admit e1-lr2)."""
    results = _runs(tmp_path, {REFERENCE: [0.770, 0.765, 0.768], "e1": [0.750, 0.745, 0.748],
                               "e1-lr2": [0.760, 0.755, 0.758], "e2": [0.770, 0.763, 0.767],
                               "nodrop": [0.771, 0.766, 0.768], "len64": [0.770, 0.755, 0.766]},
                    {REFERENCE: 30, "e1": 7, "e1-lr2": 11, "e2": 20, "nodrop": 27, "len64": 18})
    verdict = {v.point: v for v in front.verdicts(results)}
    assert not verdict["e1"].qualifies and verdict["e1"].high < 0
    assert verdict["e2"].qualifies and verdict["nodrop"].qualifies
    assert verdict["len64"].delta == pytest.approx(-0.004) and not verdict["len64"].qualifies
    assert choices(results) == {"default": "e2", "quick": "e1"}
    text = render(results)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()[2:] if line.startswith("|")}
    assert "yes" in rows["`e2`"] and "yes" not in rows["`e1`"] and "-0.0200 [" in rows["`e1`"]
    assert "Chosen: e2" in text
    assert [r for r in rows] == ["`e1`", "`e1-lr2`", "`len64`", "`e2`", "`nodrop`", f"`{REFERENCE}`"]  # fastest first


def test_one_seed_never_qualifies():
    """A single pair has no spread: it is an anecdote, never a new default."""
    assert not Verdict("e2", 20.0, 0.0, float("nan"), float("nan"), 1).qualifies


def test_the_sweep_runs_every_point_seed_by_seed_with_the_reference_always(tmp_path, capsys):
    front.main(["--out-dir", str(tmp_path), "--only", "e2", "--seeds", "0", "1", "--dry-run"])
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert [c.split("]")[0][1:] for c in commands] == ["e3/seed0", "e2/seed0", "e3/seed1", "e2/seed1"]
    assert "--epochs 2" in commands[1] and "--epochs 3" in commands[0]
    assert "--save-only-model" in commands[0] and "--seed 1" in commands[2]


def test_table_only_runs_nothing_and_renders_the_finished_runs(tmp_path, capsys, monkeypatch):
    """--table-only reads what is finished (each point with the seeds it has) and starts no run."""
    def started(*args, **kwargs):
        raise AssertionError(f"--table-only started a run: {args}")

    monkeypatch.setattr(sweep_module.subprocess, "run", started)
    _runs(tmp_path, {REFERENCE: [0.770, 0.765, 0.768], "e2": [0.770, 0.763]}, {REFERENCE: 30, "e2": 20})
    results = front.main(["--out-dir", str(tmp_path), "--table-only", "--seeds", "0", "1", "2"])
    assert {p: sorted(v) for p, v in results.items()} == {REFERENCE: [0, 1, 2], "e2": [0, 1]}
    assert "python" not in capsys.readouterr().out.split("| point")[0]  # no command was started
    assert (tmp_path / "front.md").is_file() and (tmp_path / "front.png").is_file()


def test_today_s_default_can_be_the_reference_and_quick_is_judged_against_its_minutes(tmp_path, capsys):
    """--reference e2: every point is paired with today's default, which is always run; the rule keeps e2 where no
    faster point qualifies, and quick is the best point at about a third of e2's minutes."""
    results = _runs(tmp_path, {"e2": [0.767, 0.764, 0.766], "e1": [0.755, 0.752, 0.754],
                               "e1-half": [0.746, 0.744, 0.745], "e1-para6k": [0.741, 0.737, 0.740]},
                    {"e2": 18, "e1": 10, "e1-half": 7, "e1-para6k": 6})
    assert choices(results, "e2") == {"default": None, "quick": "e1-half"}
    text = render(results, "e2")
    assert "× e2" in text and "none (e2 stays)" in text and "-0.0207 [" in text
    front.main(["--out-dir", str(tmp_path / "sweep"), "--reference", "e2", "--only", "e1-half", "--seeds", "0",
                "--dry-run"])
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert [c.split("]")[0][1:] for c in commands] == ["e2/seed0", "e1-half/seed0"]
