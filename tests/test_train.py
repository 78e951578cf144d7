"""Tests of tasks/train.py, the train command (train_multitask.py calls it): refusals happen before any work, presets, --resume and --eval-only end to end, and every user-caused error ends
in one line with the right exit status and an untouched run directory.

The end-to-end tests run the real command on the tiny random BERT and synthetic
data of ``tiny_env`` (tests/conftest.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tasks import train as cli
from tasks.train_config import TrainConfig
from tasks import selection as splits
from tasks.evaluation import priors as prior_module
from tasks.evaluation import priors as priors_module
from tasks.evaluation.evaluator import Predictor
from tasks.checkpoint import prior_file
from tasks import checkpoint as ckpt_mod
from tasks.training import run as train_mod
from tasks.training import rundir as rundir_mod
from tests.helpers import ROOT, bad_data, snapshot

pytestmark = pytest.mark.usefixtures("one_thread")




REFUSED = [
    (["--eval-only", "--resume"], "choose one"),
    (["--checkpoint", "runs/x/checkpoints/best"], "--checkpoint"),
    (["--overwrite", "--resume"], "--overwrite"),
    (["--eval-only", "--epochs", "3"], "--epochs cannot change"),
    (["--eval-only", "--preset", "b1"], "--preset"),
    (["--limit", "4", "--batch-size", "8"], "limit=4"),
    (["--tasks", "nli"], "unknown task 'nli'; tasks are"),
    (["--loss-weights", "foo=1"], "loss_weights names ['foo'], which this run does not train"),
    (["--loss-weights", "para"], "STREAM=VALUE"),
    (["--tasks", "sst", "--loss-weights", "para=0.1"], "does not train"),
    (["--task-batch-size", "para=64"], "even"),
    (["--lr-decay", "1e-6"], "--lr-decay only acts"),
    (["--lr-schedule", "constant", "--warmup", "0.2"], "--warmup only acts"),
    (["--lr-schedule", "epoch_decay", "--lr", "1e-6", "--lr-decay", "1e-6", "--epochs", "3"], "not positive"),
    (["--dev-max-examples", "sst=1"], ">= 2"),
    (["--objective", "no_such_objective"], "not registered"),
    (["--no-objective", "mnr"], "no objective 'mnr'"),
    (["--mnr-scale", "10"], "add --objective mnr"),
    (["--objective", "mnr", "--pair-encoding", "cross"], "siamese"),
    (["--nli"], "nli stream"),
    (["--objective", "scl", "--tasks", "sts"], "none of which"),
    (["--head-dropout", "1.5"], "head_dropout"),
    (["--device", "tpu"], "device"),
    (["--max-train-examples", "para=0"], "--max-train-examples para=0: at least 1 example an epoch"),
    (["--eval-only", "--swa-epochs", "2"], "--swa-epochs cannot change"),
    (["--eval-only", "--lp-epochs", "2"], "--lp-epochs cannot change"),
    (["--swa-lr", "1e-4"], "--swa-lr only acts"),
    (["--lp-lr", "1e-3"], "lp_lr only acts with lp_epochs"),
    (["--data-changed"], "--data-changed lets --resume continue on changed data"),
    (["--trust-objective-modules"], "--trust-objective-modules lets --eval-only, --resume or --config import"),
    (["--lr", "inf"], "argument --lr: 'inf' is not a finite number"),
    (["--objective", "smart", "--smart-epsilon", "nan"], "argument --smart-epsilon: 'nan' is not a finite number"),
    (["--objective", "mnr", "--pair-encoding", "siamese", "--mnr-scale", "inf"],
     "argument --mnr-scale: 'inf' is not a finite number"),
    (["--loss-weights", "para=inf"], "'para=inf': 'inf' is not a finite number"),
    (["--swa-epochs", "-1"], "swa_epochs must be >= 0"),
    (["--lp-epochs", "-2"], "lp_epochs must be >= 0"),
    (["--objective", "distill"], "distill needs teachers"),
    (["--objective", "distill", "--distill-teachers"], "distill needs teachers"),
    (["--objective", "distill", "--distill-teachers", "no/such/run"], "--predict-train"),
    (["--objective", "distill", "--distill-teachers", "x", "--distill-temperature", "0"], "temperature"),
    (["--pair-swap", "1.5"], "pair_swap is a probability"),
    (["--eval-only", "--train-subsets", "cycle"], "--train-subsets cannot change"),
    (["--sts-prior", "2"], "--sts-prior: a weight in [0, 1], got 2.0"),
    (["--tasks", "sst", "para", "--sts-prior", "0.5"], "--sts-prior only acts on STS"),
    (["--sts-prior", "0", "--sts-prior-model", "x"], "--sts-prior-model only acts"),
    (["--tasks", "sst", "--sts-prior-model", "x"], "--sts-prior-model only acts"),
    (["--sts-prior-model", "no/such/dir"], "--sts-prior-model no/such/dir: no such checkpoint directory"),
    (["--sst-prior", "-0.1"], "--sst-prior: a weight in [0, 1], got -0.1"),
    (["--tasks", "para", "sts", "--sst-prior", "0.5"], "--sst-prior only acts on SST"),
    (["--sst-prior", "0", "--sst-prior-model", "x"], "--sst-prior-model only acts"),
    (["--sst-prior-model", "no/such/dir"], "--sst-prior-model no/such/dir: no such checkpoint directory"),
    (["--sts-prior", "0.3", "--prior-weights", "sts=0.4"], "--sts-prior and --prior-weights sts=... set one "
     "setting: give it once"),
    (["--sts-scale", "3", "--spans", "sts=4"], "--sts-scale and --spans sts=... set one setting"),
    (["--prior-weights", "para=0.3"], "--prior-weights para=...: para declares no prior (tasks that do: sst, sts)"),
    (["--spans", "para=3"], "--spans para=...: para is no regression (regressions: sts)"),
    (["--tasks", "para", "sts", "--sst-phrases", "sst-phrases-train.csv"], "--sst-phrases sets stream phrases, which "
     "trains the SST head, and --tasks para sts has no sst"),
    (["--sst-phrases", "none", "--sst-phrases-weight", "0.5"], "--sst-phrases-weight only acts on a run that trains "
     "stream phrases (--sst-phrases FILE on a run with sst; streams: sst, para, sts)"),
    (["--tasks", "para", "--sst-phrases-per-epoch", "100"], "--sst-phrases-per-epoch only acts on a run that trains "
     "stream phrases"),
    (["--stream-files", "words=w.csv"], "--stream-files words=... sets stream words, which no task declares (the "
     "tasks' extra streams: phrases)"),
    (["--sst-phrases-order", "last"], "argument --sst-phrases-order: invalid choice: 'last'"),
    # a message names the flag given: the map's, or the key's own (--sst-phrases-batch-size, above)
    (["--sst-phrases", "none", "--task-batch-size", "phrases=16"], "--task-batch-size phrases=... only acts on a run "
     "that trains stream phrases"),
    (["--stream-min-words", "phrases=0"], "--stream-min-words phrases=0: at least 1 word"),
    (["--prior-weights", "sst=1.5"], "--prior-weights sst=...: a weight in [0, 1], got 1.5"),
    (["--tasks", "para", "--prior-weights", "sts=0.3"], "--prior-weights sts=... only acts on STS's predictions"),
    (["--stream-orders", "phrases=last"], "'phrases=last': 'last' is not one of mixed, first"),
    (["--stream-min-words", "sst=2"], "--stream-min-words sst=...: sst is no extra stream a task declares (the tasks' "
     "extra streams: phrases)"),
    (["--sst-phrases-batch-size", "none", "--sst-phrases", "none"], "--sst-phrases-batch-size only acts on a run "
     "that trains stream phrases"),
    (["--sst-phrases-min-words", "0"], "--sst-phrases-min-words 0: at least 1 word"),
    (["--sst-phrases", "none", "--sst-phrases-batch-size", "64"], "--sst-phrases-batch-size only acts on a run that "
     "trains stream phrases"),
    (["--sst-phrases-batch-size", "0"], "--sst-phrases-batch-size 0: at least 1 example a batch"),
    (["--sst-phrases-per-epoch", "0"], "--sst-phrases-per-epoch 0: at least 1 example an epoch"),
    (["--knn-bert-knn-phi", "0.5"], "add --objective knn_bert"),
    (["--objective", "knn_bert", "--knn-bert-knn-phi", "1.5"], "knn_phi"),
    (["--objective", "knn_bert", "--limit", "64"], "lower --knn-bert-knn-k"),
]


@pytest.mark.parametrize("argv,message", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_refused_combinations_fail_before_any_work(argv, message, monkeypatch, capsys, tmp_path):
    """A contradictory or invalid command line exits with status 2 and a reason before data or model are touched."""

    def forbidden(*args, **kwargs):
        raise AssertionError("work started before the command line was checked")

    for module, name in ((train_mod, "load_pretrained"), (splits, "load_split"), (splits, "load_nli"),
                         (train_mod, "Trainer")):
        monkeypatch.setattr(module, name, forbidden)
    monkeypatch.setattr(cli, "run_plan", forbidden)
    monkeypatch.setattr(cli, "predict_checkpoint", forbidden)
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--out-dir", str(tmp_path / "nothing-here")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "nothing-here").exists()


def test_cuda_request_without_cuda_is_refused(monkeypatch, capsys):
    """--device cuda on a machine without CUDA exits with a reason instead of failing mid-run."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cli, "run_plan", lambda *a, **k: pytest.fail("run started"))
    with pytest.raises(SystemExit):
        cli.main(["--device", "cuda"])
    assert "cuda" in capsys.readouterr().err


def test_short_error_from_the_script():
    proc = subprocess.run([sys.executable, "train_multitask.py", "--epoch", "2"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["usage: train_multitask.py [options]  (--help for all of them)",
                                        "train_multitask.py: error: unrecognized argument --epoch: did you mean "
                                        "--epochs?"]


# ---- end to end ---------------------------------------------------------------------------------------------------


def _tiny_flags(env, out_dir: Path) -> list[str]:
    pretrained, data = env
    return ["--pretrained", str(pretrained), "--data-dir", str(data), "--out-dir", str(out_dir), "--device", "cpu",
            "--no-bf16",
            "--batch-size", "8", "--eval-batch-size", "16", "--max-length", "32", "--fcn-size", "16",
            "--lr", "1e-3", "--log-every", "2"]


def test_cli_train_limit_resume_and_eval_only(tiny_env, tmp_path, capsys):
    """--limit caps every split; --resume refuses a changed setting by name, accepts the original flags restated
    and continues to more epochs; --eval-only writes every prediction file."""
    run_dir = tmp_path / "run"
    cli.main([*_tiny_flags(tiny_env, run_dir), "--epochs", "1", "--limit", "16", "--lr-schedule", "constant"])
    pred = run_dir / "predictions"
    assert len((pred / "sst-dev-output.csv").read_text().splitlines()) == 1 + 16
    assert len((pred / "sts-test-output.csv").read_text().splitlines()) == 1 + 16
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["limit"] == 16 and saved["model"]["fcn_size"] == 16
    assert (run_dir / "train.log").read_text().count("seq/s") >= 1

    with pytest.raises(SystemExit) as refused:
        cli.main(["--resume", "--out-dir", str(run_dir), "--lr", "2e-3"])
    assert refused.value.code == 2 and "lr: checkpoint 0.001, now 0.002" in capsys.readouterr().err
    cli.main(["--resume", *_tiny_flags(tiny_env, run_dir), "--limit", "16", "--lr-schedule", "constant",
              "--epochs", "2"])
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("epoch") for r in records if not r.get("final")] == [1, 2]

    eval_dir = tmp_path / "eval"
    result = cli.main(["--eval-only", "--checkpoint", str(run_dir / "checkpoints" / "best"),
                       "--out-dir", str(eval_dir), "--limit", "8"])
    names = sorted(p.name for p in (eval_dir / "predictions").iterdir())
    assert names == sorted(f"{t}-{s}-{k}.csv" for t in ("sst", "para", "sts") for s in ("dev", "test")
                           for k in ("output", "logits") if (t, s) != ("para", "test"))
    header = (eval_dir / "predictions" / "para-dev-output.csv").read_text().splitlines()
    assert header[0] == "id \t Predicted_Is_Paraphrase " and len(header) == 1 + 8
    assert set(result["dev"]) == {"sst_acc", "para_acc", "sts_r", "overall"}


def test_cli_lp_ft_then_swa_on_resume_then_teacher_logits_and_distill(tiny_env, tmp_path):
    """--lp-epochs runs both stages in one command; --resume --swa-epochs adds SWA to the finished run;
    --eval-only --predict-train writes the training-set logits a --distill-teachers student then trains on."""
    run_dir = tmp_path / "run"
    common = ["--limit", "16", "--epochs", "1"]
    cli.main([*_tiny_flags(tiny_env, run_dir), *common, "--lp-epochs", "1", "--lp-lr", "2e-3"])
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["stage"]) for r in records if not r.get("final")] == [(1, "lp"), (2, "ft")]

    final = cli.main(["--resume", "--out-dir", str(run_dir), "--swa-epochs", "1", "--swa-lr", "1e-4"])
    assert final["swa"]["n_averaged"] == 1 and final["swa"]["lr"] == 1e-4
    assert (run_dir / "checkpoints" / "swa" / "model.safetensors").is_file()

    teacher = tmp_path / "teacher"
    result = cli.main(["--eval-only", "--checkpoint", str(run_dir / "checkpoints" / "swa"), "--out-dir",
                       str(teacher), "--predict-train"])
    assert set(result["train"]) == {"sst_acc", "para_acc", "sts_r", "overall"}
    for task in ("sst", "para", "sts"):
        rows = (teacher / "predictions" / f"{task}-train-logits.csv").read_text().splitlines()
        assert len(rows) == 1 + 16

    student = tmp_path / "student"
    cli.main([*_tiny_flags(tiny_env, student), *common, "--objective", "distill", "--distill-teachers",
              str(teacher / "predictions"), "--distill-tasks", "sst", "sts"])
    saved = json.loads((student / "config.json").read_text())
    assert saved["objectives"]["distill"]["teachers"] == [str(teacher / "predictions")]
    terms = json.loads((student / "metrics.jsonl").read_text().splitlines()[0])["train"]
    assert "sst/distill.loss" in terms and "sts/distill.loss" in terms and "para/distill.loss" not in terms


def test_eval_only_sets_inference_options_and_a_capped_final_dev(tiny_env, tmp_path):
    """--eval-only may switch Match-Tuning's inference and score the capped dev subset; the model is unchanged."""
    run_dir = tmp_path / "run"
    cli.main([*_tiny_flags(tiny_env, run_dir), "--epochs", "1", "--limit", "16", "--objective", "match_tuning"])
    best = str(run_dir / "checkpoints" / "best")
    identity = cli.main(["--eval-only", "--checkpoint", best, "--out-dir", str(tmp_path / "identity")])
    batch = cli.main(["--eval-only", "--checkpoint", best, "--out-dir", str(tmp_path / "batch"),
                      "--match-tuning-inference", "batch", "--final-dev", "capped", "--dev-max-examples", "para=8"])
    assert identity["dev"] == json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["dev"]
    rows = (tmp_path / "batch" / "predictions" / "para-dev-logits.csv").read_text().splitlines()
    assert len(rows) == 1 + 8
    sst = [(tmp_path / d / "predictions" / "sst-dev-logits.csv").read_text() for d in ("identity", "batch")]
    assert sst[0] != sst[1]  # batch matching mixes each eval batch's representations
    assert set(batch["dev"]) == {"sst_acc", "para_acc", "sts_r", "overall"}


def _whole_and_resumed(env, tmp_path: Path, flags: list[str], epochs: int) -> Path:
    """Train ``flags`` for ``epochs`` in one go and, in another directory, 1 epoch then --resume to ``epochs``;
    assert both end with the same dev logits files; return the uninterrupted run's directory."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    cli.main([*_tiny_flags(env, whole), *flags, "--epochs", str(epochs)])
    cli.main([*_tiny_flags(env, cut), *flags, "--epochs", "1"])
    cli.main(["--resume", "--out-dir", str(cut), "--epochs", str(epochs)])
    for name in ("sst-dev-logits.csv", "para-dev-logits.csv", "sts-dev-logits.csv"):
        assert (whole / "predictions" / name).read_bytes() == (cut / "predictions" / name).read_bytes(), name
    return whole


def test_a_resume_whose_phrases_file_is_gone_says_to_put_it_back(tiny_env, tmp_path, capsys):
    """A resumed run trains on the files it started with: a phrases file gone since is one line saying to put it
    back (or, a name in --data-dir, to point --data-dir at it), not to turn the phrases off, which --resume
    refuses as a change of the run."""
    own = tmp_path / "ph.csv"
    shutil.copy(tiny_env[1] / "sst-phrases-train.csv", own)
    run_dir = tmp_path / "run"
    cli.main([*_tiny_flags(tiny_env, run_dir), "--sst-phrases", str(own), "--epochs", "1", "--limit", "16",
              "--lr-schedule", "constant"])
    own.unlink()
    with pytest.raises(SystemExit) as refused:
        cli.main(["--resume", "--out-dir", str(run_dir), "--epochs", "2"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert refused.value.code == 2 and f"--sst-phrases {own}: no such file" in err
    assert "the resumed run trains on the data it started with: put the file back" in err and "none" not in err


def test_a_run_with_the_priors_resumes_to_the_uninterrupted_run(tiny_env, tmp_path):
    """The default's evaluation (both orders, the STS and SST priors, built at the first evaluation) does not
    change what training draws: a run cut after epoch 1 and resumed (which builds the STS prior again and takes
    the SST probe from its checkpoint at epoch 2, with epoch 3 still to train) ends with the uninterrupted run's
    files."""
    flags = ["--limit", "24", "--lr-schedule", "constant", "--symmetric-eval", "--sts-prior", "0.5",
             "--sst-prior", "0.5", "--encoder-dropout", "0.1", "--head-dropout", "0.1"]
    _whole_and_resumed(tiny_env, tmp_path, flags, 3)


def test_eval_only_symmetric_eval_and_sts_prior_rescore_pairs_of_a_saved_run(tiny_env, tmp_path):
    """A run trained with cycled subsets and swapped pairs resumes to the uninterrupted run's files; --eval-only
    --symmetric-eval re-scores its pairs (para and STS logits change, SST's do not), --sts-prior its STS scores."""
    flags = ["--limit", "24", "--max-train-examples", "para=16", "--train-subsets", "cycle", "--pair-swap", "0.5",
             "--lr-schedule", "constant", "--no-symmetric-eval", "--sts-prior", "0"]
    whole = _whole_and_resumed(tiny_env, tmp_path, flags, 2)
    sym = tmp_path / "sym"
    result = cli.main(["--eval-only", "--checkpoint", str(whole / "checkpoints" / "best"), "--out-dir", str(sym),
                       "--symmetric-eval"])
    logits = {name: [(d / "predictions" / f"{name}-dev-logits.csv").read_text() for d in (whole, sym)]
              for name in ("sst", "para", "sts")}
    assert logits["sst"][0] == logits["sst"][1]
    assert logits["para"][0] != logits["para"][1] and logits["sts"][0] != logits["sts"][1]
    assert set(result["dev"]) == {"sst_acc", "para_acc", "sts_r", "overall"}
    prior = tmp_path / "prior"  # --sts-prior: only the STS scores change
    cli.main(["--eval-only", "--checkpoint", str(whole / "checkpoints" / "best"), "--out-dir", str(prior),
              "--sts-prior", "0.5"])
    read = {name: (prior / "predictions" / f"{name}-dev-logits.csv").read_text() for name in ("sst", "para", "sts")}
    assert read["sst"] == logits["sst"][0] and read["para"] == logits["para"][0] and read["sts"] != logits["sts"][0]


def test_the_sst_probe_travels_with_the_checkpoint(tiny_env, tmp_path, monkeypatch):
    """Every checkpoint written after the first evaluation holds the SST prior's probe: --eval-only re-predicts
    the run's files byte for byte from a data directory without the SST training file; --sst-prior 0 changes
    the SST logits alone."""
    run = tmp_path / "run"
    cli.main([*_tiny_flags(tiny_env, run), "--limit", "24", "--lr-schedule", "constant", "--epochs", "1",
              "--sst-prior", "0.5"])
    best = run / "checkpoints" / "best"
    assert (best / prior_file("sst")).is_file() and (run / "checkpoints" / "last" / prior_file("sst")).is_file()
    data = tmp_path / "data-without-sst-train"
    shutil.copytree(tiny_env[1], data)
    (data / "ids-sst-train.csv").unlink()
    names = [f"{t}-dev-logits.csv" for t in ("sst", "para", "sts")]
    again, off = tmp_path / "again", tmp_path / "off"
    cli.main(["--eval-only", "--checkpoint", str(best), "--out-dir", str(again), "--data-dir", str(data)])
    for name in names:
        assert (again / "predictions" / name).read_bytes() == (run / "predictions" / name).read_bytes(), name
    cli.main(["--eval-only", "--checkpoint", str(best), "--out-dir", str(off), "--sst-prior", "0"])
    changed = [name for name in names
               if (off / "predictions" / name).read_bytes() != (run / "predictions" / name).read_bytes()]
    assert changed == ["sst-dev-logits.csv"]

    def no_data(*args, **kwargs):
        raise AssertionError("the Predictor fitted a new probe instead of reading the checkpoint's")

    monkeypatch.setattr(prior_module, "load_examples", no_data)
    labels, probs = Predictor.from_checkpoint(run).sentiment(["a gripping, funny film"])
    assert labels.shape == (1,) and probs.shape == (1, 5)


def test_eval_only_refuses_settings_that_would_do_nothing_on_its_tasks(tiny_env, tmp_path, capsys):
    """--eval-only of a run without STS (an SST specialist) with --sts-prior or --sts-prior-model, or a prior's
    weight for a task that declares none, would score exactly as without them: refused with exit status 2, as at
    training, instead of silently ignored."""
    run = tmp_path / "sst-only"
    cli.main([*_tiny_flags(tiny_env, run), "--tasks", "sst", "--limit", "16", "--epochs", "1"])
    best = str(run / "checkpoints" / "best")
    for flags, message in ((["--sts-prior", "0.3"], "--sts-prior only acts on STS"),
                           (["--sts-prior-model", str(tiny_env[0])], "--sts-prior-model only acts"),
                           (["--prior-weights", "para=0.2"], "--prior-weights para=...: para declares no prior"),
                           (["--sst-prior", "1.5"], "--sst-prior: a weight in [0, 1], got 1.5"),
                           (["--prior-weights", "sst=0.2", "--sst-prior", "0.1"], "set one setting: give it once")):
        with pytest.raises(SystemExit) as e:
            cli.main(["--eval-only", "--checkpoint", best, "--out-dir", str(tmp_path / "eval"), *flags])
        assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "eval").exists()


# ---- one path: each command checks and reads once ------------------------------------------------------------------


def test_a_training_command_validates_its_config_once(tiny_env, tmp_path, monkeypatch):
    """The command checks the config and its --out-dir before any work; the trainer and the run directory trust
    them (a fresh run and a resume alike)."""
    calls, dirs = [], []
    real = TrainConfig.validate
    monkeypatch.setattr(TrainConfig, "validate", lambda self: calls.append(self.out_dir) or real(self))
    real_dir_check = rundir_mod.check_writable_dir
    monkeypatch.setattr(rundir_mod, "check_writable_dir", lambda p, f: dirs.append(str(p)) or real_dir_check(p, f))
    run_dir = tmp_path / "run"
    cli.main([*_tiny_flags(tiny_env, run_dir), "--epochs", "1", "--limit", "8", "--lr-schedule", "constant"])
    assert calls == [str(run_dir)] and dirs == [str(run_dir)]
    calls.clear(), dirs.clear()
    cli.main(["--resume", "--out-dir", str(run_dir), "--epochs", "2"])
    assert calls == [str(run_dir)] and dirs == [str(run_dir)]


def test_eval_only_reads_the_checkpoints_config_once(tiny_env, tmp_path, monkeypatch):
    """--eval-only resolves its checkpoint and reads its config.json once, however many layers use it."""
    run_dir = tmp_path / "run"
    cli.main([*_tiny_flags(tiny_env, run_dir), "--epochs", "1", "--limit", "8"])
    config = run_dir / "checkpoints" / "best" / "config.json"
    reads, real_open = [], open

    def counting_open(file, *args, **kwargs):
        if Path(file) == config:
            reads.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    cli.main(["--eval-only", "--out-dir", str(run_dir), "--limit", "8"])
    assert len(reads) == 1


def test_a_resume_reads_the_checkpoints_state_and_config_once(tiny_env, tmp_path, monkeypatch):
    """--resume finds its checkpoint, then reads its state.json and config.json once each, however many layers
    (the command's check, the resume rule, the LP-FT stage, the trainer's restore) use them."""
    run_dir = tmp_path / "run"
    cli.main([*_tiny_flags(tiny_env, run_dir), "--epochs", "1", "--limit", "8", "--lr-schedule", "constant"])
    last = (run_dir / "checkpoints" / "last").resolve()
    reads, real_open = [], open

    def counting_open(file, *args, **kwargs):
        binary = "b" in (args[0] if args else kwargs.get("mode", "r"))  # a copy of the file (best), not a parse
        if isinstance(file, (str, os.PathLike)) and Path(file).resolve().parent == last and not binary:
            reads.append(Path(file).name)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    cli.main(["--resume", "--out-dir", str(run_dir), "--epochs", "2"])
    assert reads.count("state.json") == 1 and reads.count("config.json") == 1, reads


def test_a_run_builds_each_prior_once(tiny_env, tmp_path, monkeypatch):
    """The STS and SST priors are built at the first evaluation and serve every later one and the final files."""
    built = []
    real = priors_module.prior_of
    monkeypatch.setattr(priors_module, "prior_of", lambda task, *a, **k: built.append(task) or real(task, *a, **k))
    cli.main([*_tiny_flags(tiny_env, tmp_path / "run"), "--epochs", "2", "--limit", "8"])
    assert sorted(built) == ["para", "sst", "sts"]  # asked once each (para has none)


# ---- user errors: one line, the right exit status, the run directory untouched ----------------------------------
# One table: each case damages an input (a data file, a checkpoint file, a flag, the disk), runs the command
# (tasks.train.main in-process, or ``python train_multitask.py`` in a subprocess) against a copy of a finished
# run, and checks the exit status (2: found while checking the arguments or reading the data and the encoder, before
# the run directory is touched; 1: found at run time), that the last line of stderr is ``<program>: error: <message
# naming the file or flag>`` with no traceback, and that no file of the existing run directory changed (train.log
# may gain the lines of an attempt that got past the directory's checks, never lose any).


def _flags(env, out_dir: Path, data: Path | None = None) -> list[str]:
    pretrained, tiny_data = env
    return ["--pretrained", str(pretrained), "--data-dir", str(data or tiny_data), "--out-dir", str(out_dir),
            "--device", "cpu", "--no-bf16", "--batch-size", "8", "--eval-batch-size", "16", "--max-length", "32",
            "--fcn-size", "16", "--lr", "1e-3", "--log-every", "2", "--epochs", "1"]


@pytest.fixture(scope="module")
def finished_cli_run(tiny_env, tmp_path_factory):
    """A finished one-epoch run made by the CLI (copied by each case, never changed)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    cli.main(_flags(tiny_env, out))
    return out


def _damage(run: Path, names: list[str], edit) -> None:
    for name in names:
        path = run / "checkpoints" / name
        path.write_bytes(edit(path.read_bytes()))


def _truncate(b: bytes) -> bytes:
    return b[: len(b) // 2]


def _garbage(b: bytes) -> bytes:
    return b"\x00garbage" + b[10:]


def _truncated_model(env, tmp: Path) -> Path:
    model = tmp / "model"
    shutil.copytree(env[0], model)
    weights = model / "model.safetensors"
    weights.write_bytes(_truncate(weights.read_bytes()))
    return model


def _live_lock(run: Path) -> None:
    (run / "run.lock").write_text(json.dumps({"pid": os.getppid(), "host": __import__("socket").gethostname()}))


def _model_only(run: Path) -> None:
    """The run as --save-only-model leaves it: no last, best without its optimizer state."""
    shutil.rmtree(run / "checkpoints" / "last")
    ckpt_mod.keep_model_only(run / "checkpoints" / "best")


def _disk_full(monkeypatch) -> None:
    def full(path, tensors, metadata=None):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(ckpt_mod, "save_tensors", full)


# (id, setup(env, tmp, run, monkeypatch) -> argv, exit status, pattern of the message, via)
CASES = [
    ("non-utf8 data", lambda e, t, r, m: _flags(e, r, bad_data(e, t, "ids-sst-train.csv", lambda b: b.replace(
        b"good", b"g\xffod", 1))) + ["--overwrite"], 2, r"ids-sst-train\.csv: line \d+: bytes that are not UTF-8",
     "subprocess"),
    ("empty data file", lambda e, t, r, m: _flags(e, r, bad_data(e, t, "sts-train.csv", lambda b: b""))
     + ["--overwrite"], 2, r"sts-train\.csv: the file is empty", "main"),
    ("missing column", lambda e, t, r, m: _flags(e, r, bad_data(e, t, "quora-train.csv", lambda b: b.replace(
        b"is_duplicate", b"label", 1))) + ["--overwrite"], 2, r"quora-train\.csv: line 1: the header has no column",
     "main"),
    ("duplicate dev ids", lambda e, t, r, m: _flags(e, r, bad_data(e, t, "sts-dev.csv", lambda b: b.replace(
        b"\tsts-dev-1\t", b"\tsts-dev-0\t", 1))) + ["--overwrite"], 2,
     r"sts-dev\.csv: line 3: id sts-dev-0 also on line 2: .*give each row its own id", "main"),
    ("header-only file", lambda e, t, r, m: _flags(e, r, bad_data(e, t, "sts-dev.csv", lambda b: b.split(
        b"\n")[0] + b"\n")) + ["--overwrite"], 2, r"sts-dev\.csv: has a header but no rows", "main"),
    ("truncated model.safetensors, --resume", lambda e, t, r, m: _damage(
        r, ["last/model.safetensors", "best/model.safetensors"], _truncate) or ["--resume", "--out-dir", str(r)],
     2, r"last/model\.safetensors is truncated or corrupted.*neither last\.old nor best", "subprocess"),
    ("corrupted state.json, --resume", lambda e, t, r, m: _damage(
        r, ["last/state.json", "best/state.json"], _garbage) or ["--resume", "--out-dir", str(r)],
     2, r"last/state\.json is truncated or corrupted", "main"),
    ("state.json without step, --resume", lambda e, t, r, m: _damage(
        r, ["last/state.json", "best/state.json"], lambda b: b.replace(b'"step"', b'"stop"', 1)) or [
        "--resume", "--out-dir", str(r)], 2, r"last/state\.json lacks \['step'\]: the checkpoint is damaged", "main"),
    ("corrupted config.json, --resume", lambda e, t, r, m: _damage(
        r, ["last/config.json", "best/config.json"], _truncate) or ["--resume", "--out-dir", str(r)],
     2, r"last/config\.json is truncated or corrupted", "main"),
    ("--resume of a --save-only-model run", lambda e, t, r, m: _model_only(r) or ["--resume", "--out-dir", str(r)],
     2, r"run kept its model alone \(--save-only-model\), so it cannot be resumed: evaluate it with --eval-only "
     r"--out-dir .*/run, or train it again \(another --out-dir, or --overwrite\)", "main"),
    ("config.json {}, --resume", lambda e, t, r, m: _damage(
        r, ["last/config.json", "best/config.json"], lambda b: b"{}") or ["--resume", "--out-dir", str(r)],
     2, r"last/config\.json is not a complete run configuration: missing .*'data_dir'", "main"),
    ("config.json without a field, --eval-only", lambda e, t, r, m: _damage(
        r, ["best/config.json"], lambda b: b.replace(b'"epochs": 1,', b"")) or ["--eval-only", "--out-dir", str(r)],
     2, r"best/config\.json is not a complete run configuration: missing \['epochs'\]", "main"),
    ("truncated model.safetensors, --eval-only", lambda e, t, r, m: _damage(
        r, ["best/model.safetensors"], _truncate) or ["--eval-only", "--out-dir", str(r)],
     2, r"best/model\.safetensors is truncated or corrupted", "main"),
    ("corrupted state.json, --eval-only", lambda e, t, r, m: _damage(
        r, ["best/state.json"], _garbage) or ["--eval-only", "--out-dir", str(r)],
     2, r"best/state\.json is truncated or corrupted", "main"),
    ("corrupted config.json, --eval-only", lambda e, t, r, m: _damage(
        r, ["best/config.json"], _garbage) or ["--eval-only", "--out-dir", str(r)],
     2, r"best/config\.json is truncated or corrupted", "main"),
    ("--config holding a JSON list", lambda e, t, r, m: (t / "list.json").write_text("[1, 2]") and [
        *_flags(e, r), "--config", str(t / "list.json"), "--overwrite"], 2,
     r"--config .*list\.json: a run configuration is a JSON object, got a JSON list", "main"),
    ("--config holding Infinity", lambda e, t, r, m: (t / "inf.json").write_text(
        '{"loss_weights": {"para": Infinity}}') and [*_flags(e, r), "--config", str(t / "inf.json"), "--overwrite"],
     2, r"--config .*inf\.json: loss_weights\.para is Infinity, not a finite number", "main"),
    ("--resume on changed data", lambda e, t, r, m: ["--resume", "--out-dir", str(r), "--data-dir", str(bad_data(
        e, t, "ids-sst-train.csv", lambda b: b"\n".join(b.split(b"\n")[:-2]) + b"\n"))], 2,
     r"ids-sst-train\.csv: not the file the run started with \(sha256 .*\): resume on the run's data, or pass "
     r"--data-changed", "main"),
    ("--pretrained with a truncated model.safetensors", lambda e, t, r, m: [
        *_flags(e, r), "--pretrained", str(_truncated_model(e, t)), "--overwrite"], 2,
     r"--pretrained .*model: .*model\.safetensors is truncated or corrupted", "main"),
    ("--pretrained does not exist", lambda e, t, r, m: [*_flags(e, r), "--pretrained", str(t / "no-such-model"),
                                                        "--overwrite"], 2, r"no-such-model", "main"),
    ("--sst-phrases does not exist", lambda e, t, r, m: [*_flags(e, r), "--sst-phrases", "nope.csv",
                                                         "--overwrite"], 2,
     r"--sst-phrases nope\.csv: no such file .*nope\.csv \(a name in --data-dir .*, or a path\): point --data-dir",
     "main"),
    ("--sst-phrases without a label column", lambda e, t, r, m: [*_flags(e, r, bad_data(
        e, t, "sst-phrases-train.csv", lambda b: b.replace(b"sentiment", b"label", 1))), "--sst-phrases",
        "sst-phrases-train.csv", "--overwrite"], 2, r"sst-phrases-train\.csv: line 1: the header has no column "
     r"'sentiment'", "main"),
    ("--out-dir is a file", lambda e, t, r, m: _flags(e, r / "metrics.jsonl"), 2,
     r"--out-dir .*metrics\.jsonl is a file", "main"),
    ("--out-dir below a file", lambda e, t, r, m: _flags(e, r / "config.json" / "sub"), 2,
     r"config\.json is a file, so the directory cannot be created", "main"),
    ("--out-dir not writable", lambda e, t, r, m: m.setattr(ckpt_mod.os, "access", lambda *a, **k: False)
     or _flags(e, r) + ["--overwrite"], 2, r"--out-dir .* is not writable", "main"),
    ("--max-length above the positions", lambda e, t, r, m: [*_flags(e, r), "--max-length", "4096", "--overwrite"],
     2, r"--max-length 4096 is more than the 64 positions .*max_position_embeddings", "main"),
    ("finished run re-entered", lambda e, t, r, m: _flags(e, r), 2,
     r"holds an earlier run: resume it \(--resume\), pick another --out-dir, or pass --overwrite", "main"),
    ("run directory in use", lambda e, t, r, m: _live_lock(r) or _flags(e, r) + ["--overwrite"], 2,
     rf"in use by process {os.getppid()}", "main"),
    ("run directory in use, --eval-only", lambda e, t, r, m: _live_lock(r) or ["--eval-only", "--out-dir", str(r)],
     2, rf"in use by process {os.getppid()}", "main"),
    ("disk full", lambda e, t, r, m: _disk_full(m) or _flags(e, r) + ["--overwrite"], 1,
     r"disk full writing .*model\.safetensors: free space .*, then run the same command again \(this run wrote "
     r"no checkpoint\)", "main"),

]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_user_error_is_one_line_with_its_exit_status_and_changes_nothing(tiny_env, finished_cli_run, tmp_path,
                                                                         monkeypatch, capsys, case):
    """See the comment above _flags; each case names the file or flag at fault."""
    _, setup, status, pattern, via = case
    run_dir = tmp_path / "run"
    shutil.copytree(finished_cli_run, run_dir)
    argv = setup(tiny_env, tmp_path, run_dir, monkeypatch)
    before, log_before = snapshot(run_dir), (run_dir / "train.log").read_bytes()
    if via == "subprocess":
        proc = subprocess.run([sys.executable, str(ROOT / "train_multitask.py"), *argv], capture_output=True,
                              text=True, cwd=tmp_path, env={**os.environ, "MINBERT_VERBOSE": ""})
        code, err = proc.returncode, proc.stderr
    else:
        monkeypatch.delenv("MINBERT_VERBOSE", raising=False)
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        code, err = exc.value.code, capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert "Traceback" not in err, err
    assert code == status, err
    assert re.search(r"error: ", lines[-1]) and re.search(pattern, lines[-1]), lines[-1]
    after = snapshot(run_dir)
    assert {k: v for k, v in after.items() if k != "train.log"} == {k: v for k, v in before.items() if k != "train.log"}
    assert (run_dir / "train.log").read_bytes().startswith(log_before)  # at most the failed attempt, appended


@pytest.mark.parametrize("refusal", ["finished run re-entered", "run directory in use"])
def test_a_refused_run_writes_nothing_into_the_directory_it_refuses(tiny_env, finished_cli_run, tmp_path,
                                                                   monkeypatch, capsys, refusal):
    """A run refused at the run directory (an earlier run there, a live owner) writes nothing into it, not even to
    that run's train.log: its log is held until the directory is its own, so not one byte changes."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_cli_run, run_dir)
    argv = dict((c[0], c[1]) for c in CASES)[refusal](tiny_env, tmp_path, run_dir, monkeypatch)
    before = snapshot(run_dir)
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    after = snapshot(run_dir)
    if refusal == "run directory in use":
        del before["run.lock"], after["run.lock"]
    assert after == before


def test_train_log_holds_what_was_logged_before_the_run_directory_was_ready(tiny_env, tmp_path):
    """train.log opens with the command, and holds the warnings printed while the command line was checked (a
    damaged last, resumed from best instead)."""
    run_dir = tmp_path / "run"
    cli.main([*_flags(tiny_env, run_dir), "--epochs", "2"])
    last = run_dir / "checkpoints" / "last" / "model.safetensors"
    head = last.read_bytes()[:100]
    last.unlink()
    last.write_bytes(head)
    (run_dir / "train.log").unlink()
    cli.main(["--resume", "--out-dir", str(run_dir)])
    log = (run_dir / "train.log").read_text()
    assert "is truncated or corrupted" in log and "resuming from" in log


def test_a_resume_on_changed_data_goes_on_when_told_and_records_the_new_data(tiny_env, tmp_path, caplog):
    """--data-changed lets --resume continue on changed files (with a warning naming each); the checkpoints it
    writes then record the new files, so the next resume on them needs no flag. A checkpoint that records no
    fingerprints (written before they were) is resumed with a warning."""
    run_dir = tmp_path / "run"
    cli.main([*_flags(tiny_env, run_dir), "--epochs", "1", "--lr-schedule", "constant"])
    state_file = run_dir / "checkpoints" / "last" / "state.json"
    state = json.loads(state_file.read_text())
    del state["data_sha256"]
    state_file.write_text(json.dumps(state))
    cli.main(["--resume", "--out-dir", str(run_dir), "--epochs", "2"])
    assert "records no fingerprints of its data" in caplog.text
    changed = bad_data(tiny_env, tmp_path, "sts-train.csv", lambda b: b.replace(b"\t1.0\n", b"\t2.0\n", 1))
    with pytest.raises(SystemExit):
        cli.main(["--resume", "--out-dir", str(run_dir), "--epochs", "3", "--data-dir", str(changed)])
    result = cli.main(["--resume", "--out-dir", str(run_dir), "--epochs", "3", "--data-dir", str(changed),
                       "--data-changed"])
    assert result["best_epoch"] is not None and f"--data-changed: {changed / 'sts-train.csv'} differs" in caplog.text
    saved = json.loads(state_file.read_text())["data_sha256"]
    assert saved["sts train"] == hashlib.sha256((changed / "sts-train.csv").read_bytes()).hexdigest()
    cli.main(["--resume", "--out-dir", str(run_dir), "--epochs", "4", "--data-dir", str(changed)])  # its data now


def test_disk_full_advises_resume_only_where_there_is_a_checkpoint_to_resume(tiny_env, finished_cli_run, tmp_path,
                                                                           monkeypatch, capsys):
    """A full disk advises --resume only where a checkpoint exists: not before the first one (the table above),
    but a resume that fills the disk (here in its SWA phase) has one, so it advises --resume."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_cli_run, run_dir)
    _disk_full(monkeypatch)
    monkeypatch.delenv("MINBERT_VERBOSE", raising=False)
    with pytest.raises(SystemExit) as exc:
        cli.main(["--resume", "--out-dir", str(run_dir), "--swa-epochs", "1"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 1 and "then continue with --resume: the last complete checkpoint is intact" in line


def test_the_log_file_says_what_the_run_will_do_how_long_it_takes_and_took(tiny_env, tmp_path):
    """A run read from its log file (nohup, a scheduler: no terminal, no progress bar) opens with the
    device, precision and why, threads and plan; estimates the whole run after its first steps; gives elapsed and
    remaining time on every progress line; and ends with the wall time."""
    run_dir = tmp_path / "run"
    cli.main([*_flags(tiny_env, run_dir), "--epochs", "2", "--log-every", "2"])
    lines = (run_dir / "train.log").read_text().splitlines()
    (plan,) = [x for x in lines if "| plan: " in x]
    assert re.search(r"cpu, fp32 \(--no-bf16\), \d+ threads? \| plan: 2 epochs x (\d+)/\1 steps \(\d+ to go\): .*sst "
                     r"\d+.* examples an epoch; dev scores after each epoch on .*; then the best epoch predicts the whole "
                     r"dev and test sets", plan), plan
    progress = [x for x in lines if re.search(r"epoch \d/2 step \d+/\d+ \|", x)]
    assert progress and all(re.search(r"\| elapsed \d+s, left ~\d+s$", x) for x in progress), progress
    assert lines.index(plan) < lines.index(progress[0])
    assert sum("estimate after 10 steps: the run takes ~" in x for x in lines) == 1  # 2 epochs of 8 steps
    assert re.search(r"done: wall time \d+s \(this process: \d+ s\)$", lines[-1]), lines[-1]


def test_verbose_keeps_the_traceback(tiny_env, finished_cli_run, tmp_path, monkeypatch):
    """MINBERT_VERBOSE=1 lets the exception through for a bug report."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_cli_run, run_dir)
    monkeypatch.setenv("MINBERT_VERBOSE", "1")
    with pytest.raises(FileExistsError, match="holds an earlier run"):
        cli.main(_flags(tiny_env, run_dir))


def test_resume_from_last_old_keeps_it_until_it_is_loaded(tiny_env, finished_cli_run, tmp_path, caplog):
    """A last.old left beside last (a kill before its removal) is the fallback when last is damaged: the run
    directory's clean-up of finished swaps does not delete it before the resume has read it."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_cli_run, run_dir)
    shutil.copytree(run_dir / "checkpoints" / "last", run_dir / "checkpoints" / "last.old")
    _damage(run_dir, ["last/model.safetensors"], _truncate)
    result = cli.main(["--resume", "--out-dir", str(run_dir)])
    assert str(run_dir / "checkpoints" / "last.old") in caplog.text and result["final"]


@pytest.mark.parametrize("damaged", ["model.safetensors", "config.json"])
def test_resume_falls_back_from_a_damaged_last_to_best_with_a_warning(tiny_env, finished_cli_run, tmp_path, caplog,
                                                                     damaged):
    """--resume with a truncated last/model.safetensors or last/config.json resumes from the intact best and says
    so (the config too is read after the fallback)."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_cli_run, run_dir)
    _damage(run_dir, [f"last/{damaged}"], _truncate)
    result = cli.main(["--resume", "--out-dir", str(run_dir)])
    assert "resuming from" in caplog.text and str(run_dir / "checkpoints" / "best") in caplog.text
    assert result["final"] and result["best_epoch"] == 1
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("epoch") for r in records if not r.get("final")] == [1]


# ---- objective files of one's own: a saved run imports none unless named again or trusted -----------------------


def _objective_file(path: Path, marker: Path) -> Path:
    """README's example objective (my_loss) written to ``path``; each import of it appends a line to ``marker``."""
    code = re.search(r"## Adding an objective.*?```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"with open({str(marker)!r}, 'a') as _f:\n    _f.write('imported\\n')\n" + code)
    return path


def _predictions(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.csv"))}


def _refused(argv: list[str], capsys) -> str:
    """The one line a refused command line prints (exit status 2)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


@pytest.fixture
def plugin_run(tiny_env, tmp_path, plugin_registry, monkeypatch) -> tuple[Path, Path, Path]:
    """(run, its objective file, the file counting that file's imports): a finished run of README's objective from a
    file of its own, the registry then as a new process finds it."""
    monkeypatch.delenv("MINBERT_VERBOSE", raising=False)
    marker = tmp_path / "imports.txt"
    plugin = _objective_file(tmp_path / "mine" / "my_loss.py", marker)
    run_dir = tmp_path / "run"
    cli.main([*_flags(tiny_env, run_dir), "--tasks", "sst", "--objective-module", str(plugin), "--objective",
              "my_loss", "--epochs", "1", "--lr-schedule", "constant"])
    plugin_registry()
    return run_dir, plugin, marker


def test_reading_a_run_imports_its_objective_file_only_when_named_again_or_trusted(plugin_run, plugin_registry,
                                                                                  tmp_path, capsys):
    """--eval-only, --resume and --config of a run whose objective came from a file of its own import that file
    only when the user names it again (--objective-module) or trusts the run (--trust-objective-modules): without
    either, one line (exit status 2) names the file and what to type (a resume does not take it for a damaged
    checkpoint), and the file's code never ran. Trusted, the run re-predicts its own predictions byte for byte."""
    run_dir, plugin, marker = plugin_run
    best = run_dir / "checkpoints" / "best"
    line = _refused(["--eval-only", "--out-dir", str(run_dir)], capsys)
    assert line == (f"train_multitask.py: error: {best / 'config.json'}: objective 'my_loss' comes from the run's own "
                    f"file {plugin}, and reading a saved run imports no file unless you name it: pass "
                    f"--objective-module {plugin} (or MINBERT_PLUGINS={plugin}), or --trust-objective-modules to "
                    "import the file(s) the run recorded")
    last = run_dir / "checkpoints" / "last" / "config.json"
    assert _refused(["--resume", "--out-dir", str(run_dir), "--epochs", "2"], capsys) == line.replace(
        str(best / "config.json"), str(last))  # the same line: not a damaged last to resume around
    line = _refused(["--config", str(run_dir / "config.json"), "--out-dir", str(tmp_path / "again")], capsys)
    assert line.startswith(f"train_multitask.py: error: --config {run_dir / 'config.json'}: objective 'my_loss'")
    assert marker.read_text() == "imported\n" and not (tmp_path / "again").exists()  # the training run's import only

    cli.main(["--eval-only", "--checkpoint", str(best), "--out-dir", str(tmp_path / "trusted"),
              "--trust-objective-modules"])
    assert marker.read_text() == "imported\n" * 2
    assert _predictions(tmp_path / "trusted" / "predictions") == _predictions(run_dir / "predictions")


def test_a_model_only_run_of_an_objective_file_says_which_file_on_resume(tiny_env, tmp_path, plugin_registry,
                                                                        capsys, monkeypatch):
    """A --save-only-model run (no last, best alone) whose objective came from a file of its own: --resume without
    naming the file says which file and what to type, as for a run that kept its last (not "mend the file it names",
    which named none); named again, it says the run kept its model alone."""
    monkeypatch.delenv("MINBERT_VERBOSE", raising=False)
    plugin = _objective_file(tmp_path / "mine" / "my_loss.py", tmp_path / "imports.txt")
    run_dir = tmp_path / "run"
    cli.main([*_flags(tiny_env, run_dir), "--tasks", "sst", "--objective-module", str(plugin), "--objective",
              "my_loss", "--epochs", "1", "--lr-schedule", "constant", "--save-only-model"])
    plugin_registry()
    best = run_dir / "checkpoints" / "best"
    assert _refused(["--resume", "--out-dir", str(run_dir), "--epochs", "2"], capsys) == (
        f"train_multitask.py: error: {best / 'config.json'}: objective 'my_loss' comes from the run's own file "
        f"{plugin}, and reading a saved run imports no file unless you name it: pass --objective-module {plugin} (or "
        f"MINBERT_PLUGINS={plugin}), or --trust-objective-modules to import the file(s) the run recorded")
    assert "kept its model alone (--save-only-model)" in _refused(
        ["--resume", "--out-dir", str(run_dir), "--epochs", "2", "--objective-module", str(plugin)], capsys)


def test_a_run_whose_objective_file_moved_loads_from_where_the_file_is_named_now(plugin_run, plugin_registry, tmp_path,
                                                                               capsys, monkeypatch):
    """The objective file moved: reading the run says the recorded file is gone and how to name the new place
    (trusted too); --eval-only --objective-module NEW and MINBERT_PLUGINS=NEW load the run and re-predict its
    predictions byte for byte; --resume --objective-module NEW continues it and its checkpoints record NEW."""
    run_dir, plugin, marker = plugin_run
    moved = tmp_path / "moved" / "my_loss.py"
    moved.parent.mkdir()
    plugin.rename(moved)
    best = run_dir / "checkpoints" / "best"
    assert _refused(["--eval-only", "--out-dir", str(run_dir)], capsys).endswith(
        f"objective 'my_loss' comes from the run's own file {plugin}, which is no longer there: name where it is now "
        "with --objective-module FILE (or MINBERT_PLUGINS=FILE)")
    assert _refused(["--eval-only", "--out-dir", str(run_dir), "--trust-objective-modules"], capsys).endswith(
        f"the run's objective module {plugin}: no such Python file: the run recorded it there; name where it is now "
        "with --objective-module FILE")
    cli.main(["--eval-only", "--checkpoint", str(best), "--out-dir", str(tmp_path / "named"), "--objective-module",
              str(moved)])
    assert _predictions(tmp_path / "named" / "predictions") == _predictions(run_dir / "predictions")
    plugin_registry()
    monkeypatch.setenv("MINBERT_PLUGINS", str(moved))
    cli.main(["--eval-only", "--checkpoint", str(best), "--out-dir", str(tmp_path / "env")])
    assert _predictions(tmp_path / "env" / "predictions") == _predictions(run_dir / "predictions")
    monkeypatch.delenv("MINBERT_PLUGINS")
    plugin_registry()
    result = cli.main(["--resume", "--out-dir", str(run_dir), "--epochs", "2", "--objective-module", str(moved)])
    assert result["final"] and marker.read_text() == "imported\n" * 4
    for config in (run_dir / "config.json", run_dir / "checkpoints" / "last" / "config.json"):
        assert json.loads(config.read_text())["objective_modules"] == [str(moved)]


def test_the_predict_command_reads_such_a_run_by_the_same_rule(plugin_run, plugin_registry, tmp_path, capsys):
    """python -m tasks.predict on a run whose objective came from a file of its own: refused in one line (exit 2)
    until the file is named again (--objective-module, here where it moved) or the run trusted
    (--trust-objective-modules); then it predicts, and the file ran only when named or trusted."""
    from tasks import predict

    run_dir, plugin, marker = plugin_run
    imported = marker.read_text()
    text = tmp_path / "in.txt"
    text.write_text("a gripping, funny film\n")
    argv = ["--checkpoint", str(run_dir), "--task", "sst", "--input", str(text), "--output", "-", "--device", "cpu"]
    with pytest.raises(SystemExit) as stop:
        predict.main(argv)
    assert stop.value.code == 2 and "--trust-objective-modules" in capsys.readouterr().err.strip().splitlines()[-1]
    assert marker.read_text() == imported  # the file never ran
    assert len(predict.main([*argv, "--trust-objective-modules"])) == 1
    moved = tmp_path / "moved" / "my_loss.py"
    moved.parent.mkdir()
    plugin.rename(moved)
    plugin_registry()
    assert len(predict.main([*argv, "--objective-module", str(moved)])) == 1


# ---- what a run reads is read before its directory is made ---------------------------------------------------------


def _pretrained_with(env, tmp: Path, weights) -> Path:
    """A copy of the tiny model whose weights ``weights(state dict, directory)`` writes instead."""
    model = tmp / "model"
    shutil.copytree(env[0], model)
    state = load_file(str(model / "model.safetensors"))
    (model / "model.safetensors").unlink()
    weights(state, model)
    return model


class _Code:
    """An object whose unpickling would call a function: what a pytorch_model.bin holding code holds."""

    def __reduce__(self):
        return (os.getcwd, ())


# (id, flags(env, tmp) beyond _flags, pattern of the one line naming the file or flag)
BEFORE_THE_RUN_DIRECTORY = [
    ("duplicate test id", lambda e, t: ["--data-dir", str(bad_data(e, t, "ids-sst-test-student.csv", lambda b: (
        b.replace(b"\tsst-test-1\t", b"\tsst-test-0\t", 1))))],
     r"ids-sst-test-student\.csv: line 3: id sst-test-0 also on line 2"),
    ("empty test file", lambda e, t: ["--data-dir", str(bad_data(e, t, "sts-test-student.csv", lambda b: b.split(
        b"\n")[0] + b"\n"))], r"sts-test-student\.csv: has a header but no rows"),
    ("bad phrases file", lambda e, t: ["--data-dir", str(bad_data(e, t, "sst-phrases-train.csv", lambda b: b.replace(
        b"sentiment", b"label", 1))), "--sst-phrases", "sst-phrases-train.csv"],
     r"sst-phrases-train\.csv: line 1: the header has no column 'sentiment'"),
    ("missing GLUE file", lambda e, t: ["--tasks", "rte"], r"data file not found: .*/glue/RTE/train\.tsv"),
    ("--pretrained holding code", lambda e, t: ["--pretrained", str(_pretrained_with(e, t, lambda s, d: torch.save(
        {**s, "code": _Code()}, d / "pytorch_model.bin")))],
     r"--pretrained .*/model: .*pytorch_model\.bin holds code, not only tensors, and is refused"),
    ("--pretrained missing weights", lambda e, t: ["--pretrained", str(_pretrained_with(e, t, lambda s, d: save_file(
        {k: v for k, v in s.items() if ".layer.0." not in k}, str(d / "model.safetensors"))))],
     r"--pretrained .*/model: missing encoder weights: encoder\.layer\.0\."),
]


@pytest.mark.parametrize("case", BEFORE_THE_RUN_DIRECTORY, ids=[c[0] for c in BEFORE_THE_RUN_DIRECTORY])
def test_what_the_run_reads_is_refused_before_its_directory_is_made(tiny_env, tmp_path, monkeypatch, capsys, case):
    """A data file or --pretrained's weights that the run cannot use (found where they are read: the data files,
    the test files and the phrases, the encoder's weights) is an argument error: exit status 2, one line naming the
    file or flag, and no run directory made, as a task file's problems are."""
    _, flags, pattern = case
    run_dir = tmp_path / "run"
    monkeypatch.delenv("MINBERT_VERBOSE", raising=False)
    line = _refused([*_flags(tiny_env, run_dir), *flags(tiny_env, tmp_path)], capsys)
    assert re.search(rf"^train_multitask\.py: error: .*{pattern}", line), line
    assert not run_dir.exists()


def test_a_bad_minbert_plugins_entry_is_one_line_naming_minbert_plugins(plugin_registry, tmp_path, monkeypatch,
                                                                       capsys):
    """A MINBERT_PLUGINS file that is not there stops any train command first, in one line (exit status 2) that
    names MINBERT_PLUGINS as what named it, not a checkpoint's config.json."""
    monkeypatch.delenv("MINBERT_VERBOSE", raising=False)
    monkeypatch.setenv("MINBERT_PLUGINS", str(tmp_path / "nope.py"))
    for argv in (["--eval-only", "--out-dir", str(tmp_path / "run")], ["--out-dir", str(tmp_path / "fresh")]):
        assert _refused(argv, capsys) == (f"train_multitask.py: error: MINBERT_PLUGINS names {tmp_path / 'nope.py'}: "
                                          "no such Python file: correct MINBERT_PLUGINS or unset it")


def test_eval_only_takes_a_run_directory_as_its_checkpoint_as_predict_does(tiny_env, tmp_path):
    """--eval-only --checkpoint RUN reads the run's best checkpoint, as the predict command and
    Predictor.from_checkpoint take a run (README: "a run or a checkpoint"), and re-predicts its files byte for
    byte; it was refused as "not a complete checkpoint"."""
    run_dir = tmp_path / "run"
    cli.main([*_flags(tiny_env, run_dir), "--tasks", "sst"])
    cli.main(["--eval-only", "--checkpoint", str(run_dir), "--out-dir", str(tmp_path / "again")])
    assert _predictions(tmp_path / "again" / "predictions") == _predictions(run_dir / "predictions")
