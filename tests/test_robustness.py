"""Tests of tasks/robustness.py, the robustness experiments command: its documented examples parse, each experiment
trains on its perturbed copy of the data, and the attack logs beside its results."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from tasks import robustness
from tasks.training import attacks as experiments


def test_robustness_docstring_examples_parse():
    examples = [ln.strip() for ln in robustness.__doc__.split("Usage:\n")[1].split("\n\n")[0].splitlines()]
    assert len(examples) == 4
    for line in examples:
        args, flags, cfg = robustness.split_argv(line.split()[3:])
        assert args.command == line.split()[3]
        assert (cfg is None) == (args.command == "attack")
    assert "-- TRAIN_FLAGS" in robustness.build_parser().format_help()


@pytest.mark.parametrize("command, extra, changed", [
    ("few-shot", ["--sizes", "10"], {"ids-sst-train.csv": 10, "quora-train.csv": 10}),
    ("label-noise", ["--rate", "0.25"], {"ids-sst-train.csv": 48, "quora-train.csv": 48}),
    ("minority", ["--task", "sst", "--label", "1", "--keep", "0.5"], {"ids-sst-train.csv": 48 - 5}),
])
def test_every_training_experiment_trains_on_its_perturbed_copy(tmp_path, monkeypatch, caplog, command, extra,
                                                                changed):
    """Each experiment writes its changed train files, trains on them once per seed and reports its scores;
    ``minority`` trains its one task and scores the reduced class from the run's prediction file; none trains the
    SST phrases (their labels would escape the perturbation). The log says
    the plan first and after each run how far it is."""
    from tests.helpers import write_tiny_data

    caplog.set_level(logging.INFO)  # the command's level; alone, pytest's root logger is at WARNING
    data = write_tiny_data(tmp_path / "data")
    calls = []

    def fake_train(cfg, data_dir, out_dir, seed):
        calls.append((cfg, Path(data_dir), seed))
        (out_dir / "predictions").mkdir(parents=True)
        rows = [f"sst-dev-{i} , {i % 5} " for i in range(24)]
        (out_dir / "predictions" / "sst-dev-output.csv").write_text(" id \t Predicted_Sentiment \n" + "\n".join(rows))
        return {"dev": {"sst_acc": 0.4 + seed / 10, "para_acc": None}}

    monkeypatch.setattr(robustness, "_train", fake_train)
    out = tmp_path / "out"
    res = robustness.main([command, *extra, "--seeds", "0", "1", "--data-dir", str(data), "--out-dir", str(out),
                           "--", "--epochs", "1"])
    assert [seed for _, _, seed in calls] == [0, 1]
    said = [r.getMessage() for r in caplog.records if r.name == experiments.log.name]
    assert "plan: 2 training runs (1 settings x 2 seeds), one after another" in said
    assert any(re.fullmatch(r"1/2 runs done \| elapsed \d+s, left ~\d+s", x) for x in said), said
    assert any(re.fullmatch(r"2/2 runs done \| wall time \d+s", x) for x in said), said
    assert "plan: 2 training runs" in (out / "robustness.log").read_text()  # the command's log, beside its runs
    cfg, used, _ = calls[0]
    assert cfg.epochs == 1 and cfg.tasks == (("sst",) if command == "minority" else ("sst", "para"))
    assert "phrases" not in cfg.resolve().extra  # the phrases' labels are not perturbed: the experiment trains none
    for name, rows in changed.items():  # rewritten files with the perturbed number of rows, the rest linked
        assert not (used / name).is_symlink() and len((used / name).read_text().splitlines()) == rows + 1
    assert (used / "sts-train.csv").is_symlink() and (used / "ids-sst-dev.csv").is_symlink()
    (setting,) = res["settings"].values()
    assert setting["sst_acc"]["mean"] == pytest.approx(0.45) and "para_acc" not in setting
    if command == "minority":
        assert setting["sst_class1_acc"]["mean"] == 1.0  # the fake predicts every class-1 dev sentence right


def test_attack_says_its_plan_progress_and_result_and_logs_beside_results(tiny_env, tmp_path, monkeypatch, caplog,
                                                                          capsys):
    """``attack`` logs the plan, a progress line with the time
    left (at most every PROGRESS_EVERY_S), each task's result, and with --out-dir keeps robustness.log beside
    results.json. A task the checkpoint was not trained on is refused naming the flag."""
    from tasks.training.run import run
    from tests.helpers import tiny_train_config

    caplog.set_level(logging.INFO)
    run(tiny_train_config(tiny_env, tmp_path / "run", epochs=1, tasks=("sst",)))
    monkeypatch.setattr(experiments, "PROGRESS_EVERY_S", 0)
    out = tmp_path / "attack"
    args = ["attack", "--checkpoint", str(tmp_path / "run" / "checkpoints" / "best"), "--data-dir", str(tiny_env[1]),
            "--tasks", "sst", "--steps", "1", "--batch-size", "8", "--device", "cpu"]
    res = robustness.main([*args, "--out-dir", str(out)])
    said = [r.getMessage() for r in caplog.records if r.name == experiments.log.name]
    assert said[0] == "cpu | plan: PGD attack (linf, epsilon 0.01, 1 step of 0.0025) on the dev sets of sst"
    assert any(re.fullmatch(r"sst: 8 of \d+ examples attacked \(\d+s; ~\d+s left\)", x) for x in said), said
    n = res["tasks"]["sst"]["examples"]
    assert re.fullmatch(rf"sst: {n} examples in \d+s: clean accuracy \d\.\d{{4}}, after the attack \d\.\d{{4}}", said[-1])
    assert (out / "results.json").is_file() and said[-1] in (out / "robustness.log").read_text()
    with pytest.raises(SystemExit) as exit_:
        robustness.main([*args[:5], "--tasks", "para", "--steps", "1", "--device", "cpu"])
    assert exit_.value.code == 2  # a task the checkpoint lacks: refused with the arguments, as every command's
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("python -m tasks.robustness: error: --tasks para: ") and \
        err.endswith("was not trained on it (it has sst)")
