"""Tests of experiments/leaderboard.py: members trained, ensembled with an honest held-out score, the submission
zip; a second call reuses finished members and resumes one cut short."""

from __future__ import annotations

import json
import threading
import zipfile

import pytest

from experiments import leaderboard
from experiments.sweep import Sweep
from tasks import arguments
from tasks import train as cli
from tasks.training.loop import Hook
from tasks.training.run import trainer_for


class _Cut(Exception):
    pass


class _StopAfterEpoch1(Hook):
    def on_epoch_end(self, state, control, record: dict) -> None:
        raise _Cut  # after checkpoints/last of epoch 1 of 2


def _tiny_flags(env) -> list[str]:
    pretrained, data = env
    return ["--pretrained", str(pretrained), "--epochs", "2", "--batch-size", "8", "--eval-batch-size", "16",
            "--max-length", "32", "--max-train-examples", "para=all", "--dev-max-examples", "para=all",
            "--lr", "1e-3", "--log-every", "5", "--device", "cpu", "--no-bf16", "--fcn-size", "16"]


def test_leaderboard_trains_ensembles_and_resumes(tiny_env, tmp_path, capsys):
    """Two members, the selective ensemble scored on held-out dev halves, the starter-format zip; member seed1,
    cut mid-run before the command ran, is resumed from its last checkpoint, not retrained."""
    out = tmp_path / "lb"
    flags = [*_tiny_flags(tiny_env), "--data-dir", str(tiny_env[1])]
    # seed1 was cut short by an earlier call of the command: its marker and a mid-run checkpoint exist
    member = out / "seed1"
    member.mkdir(parents=True)
    argv = [*leaderboard.member_flags(1, flags), "--out-dir", str(member), "--overwrite"]
    (member / "sweep.json").write_text(json.dumps({"argv": argv, "module": None, "wall_s": None}))
    inv = cli.build_invocation(*arguments.parse([*leaderboard.member_flags(1, flags), "--out-dir", str(member)]))
    trainer = trainer_for(inv.config, hooks=[_StopAfterEpoch1()])
    with pytest.raises(_Cut):
        trainer.fit()
    trainer.run_dir.close()  # the cut process is gone: its run.lock with it

    result = leaderboard.main(["--out-dir", str(out), "--members", "2", "--data-dir", str(tiny_env[1]),
                               "--threads", "1", "--jobs", "2", "--method", "selective", "--specialists", "sst=1",
                               "--variants", "",
                               "--", *_tiny_flags(tiny_env)])
    assert list(result["members"]) == ["seed0", "seed1", "sst-only-seed0"]
    assert list(result["members"]["sst-only-seed0"]["dev"]) == ["sst_acc", "overall"]
    assert "resumed from" in (member / "train.log").read_text()
    records = [json.loads(line) for line in (member / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if "epoch" in r and not r.get("final")] == [1, 2] and records[-1]["final"]
    summary = json.loads((out / "ensemble" / "ensemble.json").read_text())
    assert summary["tasks"]["sst"]["runs"] == ["seed0", "seed1", "sst-only-seed0"]  # the specialist: SST only
    assert summary["tasks"]["para"]["runs"] == summary["tasks"]["sts"]["runs"] == ["seed0", "seed1"]
    assert result["holdout_overall"] == summary["holdout_overall"] and 0 < result["holdout_overall"] < 1
    assert result["honest_overall"] == result["holdout_overall"]
    names = zipfile.ZipFile(out / "ensemble" / "cs224n_default_final_project_submission.zip").namelist()
    assert "predictions/sst-test-output.csv" in names
    assert "held out" in capsys.readouterr().out

    again = leaderboard.main(["--out-dir", str(out), "--members", "2", "--data-dir", str(tiny_env[1]),
                              "--threads", "1", "--specialists", "sst=1", "--variants", "", "--",
                              *_tiny_flags(tiny_env)])
    out_text = capsys.readouterr().out  # the default method, simple, on the same members: none retrained
    assert out_text.count("reusing the finished run") == 3 and "nothing chosen on dev: honest" in out_text
    assert again["method"] == "simple" and again["honest_overall"] == again["whole_dev_overall"]
    assert again["members"] == result["members"]


def test_variants_make_members_diverse():
    """Member k takes seed k (first seed 0) and variant k mod V; no variants keeps the seed-only names of earlier runs;
    specialists come after them, trained on their task alone."""
    assert leaderboard.members_of(2, [], {"sst": 2}) == {
        "seed0": (0, ""), "seed1": (1, ""), "sst-only-seed0": (0, "--tasks sst"), "sst-only-seed1": (1, "--tasks sst")}
    assert leaderboard.specialist_counts(["sst=4", "sts=0"]) == {"sst": 4}
    assert leaderboard.members_of(2, []) == {"seed0": (0, ""), "seed1": (1, "")}
    plan = leaderboard.members_of(3, ["", "--epochs 4 --head-dropout 0.1"])
    assert plan == {"v0-seed0": (0, ""), "v1-seed1": (1, "--epochs 4 --head-dropout 0.1"), "v0-seed2": (2, "")}
    assert leaderboard.member_flags(1, ["--data-dir", "d"], plan["v1-seed1"][1]) == [
        "--epochs", "3", "--sst-phrases", "none", "--seed", "1", "--data-dir", "d", "--epochs", "4", "--head-dropout",
        "0.1"]  # the variant's epochs come later: they win


def test_members_train_the_measured_recipe_and_flags_after_the_dashes_win():
    """The members are the recipe the ensemble was measured with: the default of three epochs without the SST
    phrases (the default trains them, in two epochs; the ensemble was measured without them, in three);
    ``-- --sst-phrases FILE`` trains them."""
    members = arguments.config_for([*leaderboard.member_flags(0, []), "--out-dir", "unused"])
    assert "phrases" not in members.resolve().extra and members.epochs == 3
    phrases = ("stream_files", "max_train_examples", "task_batch_size", "epochs")  # the phrases' file, cap and batch
    assert {k: v for k, v in members.to_dict().items() if k not in phrases} == \
        {k: v for k, v in arguments.config_for(["--out-dir", "unused"]).to_dict().items() if k not in phrases}
    assert members.max_train_examples == {"para": 23000} and members.task_batch_size == {}
    on = arguments.config_for([*leaderboard.member_flags(0, ["--sst-phrases", "sst-phrases-train.csv"]),
                               "--out-dir", "unused"])
    assert "phrases" in on.resolve().extra


def test_specialist_flags_reach_the_specialists_alone(tmp_path, capsys, monkeypatch):
    """--specialist-flags: the SST phrases for the specialists and none for the full members (what RESULTS.md
    measured beside them); the flags reach the specialists' checked flags in main; a flag also given after --,
    or a --tasks of their own, is refused."""
    plan = leaderboard.members_of(1, [""], {"sst": 1}, specialist_flags="--sst-phrases sst-phrases-train.csv")
    assert plan == {"seed0": (0, ""), "sst-only-seed0": (0, "--tasks sst --sst-phrases sst-phrases-train.csv")}
    configs = {name: arguments.config_for([*leaderboard.member_flags(seed, [], variant), "--out-dir", "unused"])
               for name, (seed, variant) in plan.items()}
    assert "phrases" in configs["sst-only-seed0"].resolve().extra and "phrases" not in configs["seed0"].resolve().extra

    def no_training(*args, **kwargs):
        raise AssertionError("the command got past its checks: it would train the members")
    monkeypatch.setattr(leaderboard, "open_sweep", no_training)
    for argv, message in (
            (["--specialist-flags=--no-such-flag"],  # one flag alone takes the =, as argparse asks of any value
             "member flags --epochs 3 --sst-phrases none --seed 0 --data-dir data --tasks sst --no-such-flag"
             " (see above)"),
            (["--specialist-flags", "--epochs 4", "--", "--epochs", "2"],
             "--epochs is given after -- and by --specialist-flags '--epochs 4'"),
            (["--specialist-flags", "--tasks sts"], "--tasks is set by the command (--specialists TASK=N"),
            (["--variants", "--seed 3"], "--seed is set by the command"),
            (["--specialists", "--specialist-flags", "--lr 1e-4"], "there are no specialists"),
            (["--specialist-flags", "--lr 1e-4", "--", "--loss-weights", "para=2"],  # a full member's flag
             "(a specialist takes the flags after --, then --specialist-flags: what only the full members take "
             "goes in --variants)")):
        with pytest.raises(SystemExit) as e:
            leaderboard.main(["--out-dir", str(tmp_path / "lb"), *argv])
        assert e.value.code == 2 and message in capsys.readouterr().err
        assert not (tmp_path / "lb").exists()


def test_a_member_made_with_other_settings_is_refused_not_trained_over(tmp_path, capsys, monkeypatch):
    """Run again, the command continues its members; with other flags in the same --out-dir it would have
    trained over them (an hour of specialists gone): it stops before anything starts, the member intact."""
    class Started(Exception):
        pass

    def started(*args, **kwargs):
        raise Started
    monkeypatch.setattr(leaderboard, "open_sweep", started)
    member = tmp_path / "lb" / "sst-only-seed0"
    member.mkdir(parents=True)
    flags = leaderboard.member_flags(0, ["--data-dir", "data"], "--tasks sst")
    saved = json.dumps(arguments.config_for([*flags, "--out-dir", str(member)]).to_dict())
    (member / "config.json").write_text(saved)
    argv = ["--out-dir", str(tmp_path / "lb"), "--specialists", "sst=1"]
    with pytest.raises(Started):  # the same settings: the command goes on to reuse it
        leaderboard.main(argv)
    with pytest.raises(SystemExit) as e:
        leaderboard.main([*argv, "--specialist-flags", "--sst-phrases sst-phrases-train.csv"])
    assert e.value.code == 2 and f"{member} is a member made with other settings (loss_weights, max_train_examples, stream_files" in \
        capsys.readouterr().err
    assert (member / "config.json").read_text() == saved


def test_first_seed_gives_an_independent_ensemble():
    """--first-seed S: seeds S.. for the members and the specialists, variants still in turn from the first
    member, so a second ensemble of the same recipe shares no run with the first."""
    assert leaderboard.members_of(2, [], {"sst": 2}, first_seed=4) == {
        "seed4": (4, ""), "seed5": (5, ""), "sst-only-seed4": (4, "--tasks sst"), "sst-only-seed5": (5, "--tasks sst")}
    assert leaderboard.members_of(3, ["a", "b"], first_seed=5) == {
        "v0-seed5": (5, "a"), "v1-seed6": (6, "b"), "v0-seed7": (7, "a")}


def test_first_seed_reaches_the_members_flags(tmp_path, capsys):
    """main passes --first-seed on: the first member's flags (checked before anything trains) carry seed 4."""
    with pytest.raises(SystemExit) as e:
        leaderboard.main(["--out-dir", str(tmp_path / "lb"), "--first-seed", "4", "--specialists", "--",
                          "--no-such-flag"])
    assert e.value.code == 2 and "member flags --epochs 3 --sst-phrases none --seed 4 " in capsys.readouterr().err


def test_by_default_the_full_members_train_on_all_of_quora(tmp_path, capsys):
    """The command's default members (experiments/RESULTS.md) are the measured recipe (three epochs) on all of
    Quora every epoch; --variants "" gives the plain three-epoch recipe's members."""
    member = "member flags --epochs 3 --sst-phrases none --seed 0 --no-such-flag --data-dir data"  # the measured recipe
    for argv, flags in ((["--"], f"{member} --max-train-examples para=all"), (["--variants", "", "--"], f"{member} (see")):
        with pytest.raises(SystemExit) as e:
            leaderboard.main(["--out-dir", str(tmp_path / "lb"), "--specialists", *argv, "--no-such-flag"])
        assert e.value.code == 2 and flags in capsys.readouterr().err


def test_a_negative_first_seed_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        leaderboard.main(["--out-dir", str(tmp_path / "lb"), "--first-seed", "-1"])
    assert e.value.code == 2 and "--first-seed -1: a seed is at least 0" in capsys.readouterr().err
    assert not (tmp_path / "lb").exists()


def test_an_unbalanced_variant_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        leaderboard.main(["--out-dir", str(tmp_path / "lb"), "--variants", "--lr '1e-4"])
    assert e.value.code == 2 and "No closing quotation" in capsys.readouterr().err


def test_a_member_flag_a_variant_would_replace_is_refused(tmp_path, capsys, monkeypatch):
    """The variant's flags come last: a flag after -- that a variant also sets would be silently dropped."""
    def no_training(*args, **kwargs):
        raise AssertionError("the command got past its checks: it would train the members")
    monkeypatch.setattr(leaderboard, "open_sweep", no_training)
    with pytest.raises(SystemExit) as e:
        leaderboard.main(["--out-dir", str(tmp_path / "lb"), "--variants", "", "--epochs=4 --lr 2e-5",
                          "--", "--max-train-examples", "para=1000", "--epochs", "2"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--epochs is given after -- and by --variants '--epochs=4 --lr 2e-5'" in err
    assert not (tmp_path / "lb").exists()
    with pytest.raises(SystemExit) as e:  # variants that set other flags get past the check
        leaderboard.main(["--out-dir", str(tmp_path / "lb"), "--variants", "", "--lr 2e-5", "--members", "1",
                          "--", "--max-train-examples", "para=1000", "--epochs", "2"])
    assert e.value.code == 2 and "needs at least 2" in capsys.readouterr().err


def test_the_costliest_members_train_first(tiny_env, tmp_path, monkeypatch):
    """With two jobs and variants of unequal cost, the members with the most training tokens start first (the
    two 3-epoch members of four), so no long member runs alone at the end; the result lists them in plan order."""
    started, lock, both_started = [], threading.Lock(), threading.Barrier(2, timeout=60)

    def train(self, name, flags):
        with lock:
            started.append(name)
            first_two = len(started) <= 2
        if first_two:  # the first two calls wait for each other: no third member starts before them
            both_started.wait()
        return {"dev": {"overall": 0.5}}, 1.0

    monkeypatch.setattr(Sweep, "train", train)
    monkeypatch.setattr(leaderboard, "check_ensemble", lambda config: None)
    monkeypatch.setattr(leaderboard, "make_ensemble", lambda config, runs=None: ({
        "tasks": {task: {"ensemble_score": 0.5} for task in leaderboard.MULTITASK}, "submission": "s.zip"}, {}))
    flags = [f for f in _tiny_flags(tiny_env) if f not in ("--epochs", "2")]
    result = leaderboard.main(["--out-dir", str(tmp_path / "lb"), "--members", "4", "--data-dir", str(tiny_env[1]),
                               "--jobs", "2", "--variants", "--epochs 1", "--epochs 3", "--specialists", "--",
                               *flags])
    assert set(started[:2]) == {"v1-seed1", "v1-seed3"} and set(started[2:]) == {"v0-seed0", "v0-seed2"}
    assert list(result["members"]) == ["v0-seed0", "v1-seed1", "v0-seed2", "v1-seed3"]


def test_a_member_flag_train_multitask_refuses_is_refused_before_anything_starts(tmp_path, capsys, monkeypatch):
    """A typo after -- or in a variant ends with exit status 2 naming the member flags, before any directory."""
    def no_training(*args, **kwargs):
        raise AssertionError("the command got past its checks: it would train the members")
    monkeypatch.setattr(leaderboard, "open_sweep", no_training)
    for argv in (["--", "--epochz", "2"], ["--variants", "", "--lr x"], ["--", "--loss-weights", "para=2"],
                 ["--specialists", "sst"], ["--specialists", "nli=2"], ["--", "--pretrained", str(tmp_path / "no")],
                 ["--", "--config", str(tmp_path / "no.json")]):
        with pytest.raises(SystemExit) as e:
            leaderboard.main(["--out-dir", str(tmp_path / "lb"), *argv])
        err = capsys.readouterr().err
        assert e.value.code == 2 and ("python -m experiments.leaderboard: error: member flags" in err
                                      or "python -m experiments.leaderboard: error: --specialists" in err), err
        assert not (tmp_path / "lb").exists()
