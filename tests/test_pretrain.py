"""Tests of tasks/pretrain.py, the MLM pretraining command (python -m tasks.pretrain): end to end on tiny data,
every flag reaching its config field, refusals and one-line errors. The loop itself: tests/training/test_masking.py."""

from __future__ import annotations

import json
import logging
import re

import pytest

from minbert.bert import BertModel
from minbert.pretrained import load_pretrained
from tasks.pretrain import build_parser, config_from_args, main
from tasks.training.pretraining import PretrainConfig
from tests.helpers import bad_data, tiny_config, write_hf_checkpoint


def test_cli_end_to_end(tmp_path, caplog):
    """python -m tasks.pretrain on tiny data files: sentences from all three tasks, a checkpoint that loads; the log
    says the device, precision, threads and plan first, the elapsed and remaining time on every progress line, an
    estimate of the whole after the first, and the wall time last."""
    caplog.set_level(logging.INFO)  # the level the command's own logging sets; alone, pytest's root is at WARNING
    cfg = tiny_config()
    ckpt = write_hf_checkpoint(tmp_path, BertModel(cfg).state_dict(), cfg)
    data = tmp_path / "data"
    data.mkdir()
    words = [f"w{i}" for i in range(90)]
    (data / "ids-sst-train.csv").write_text(
        "\tid\tsentence\tsentiment\n" + "".join(f"{i}\ts{i}\t{' '.join(words[i:i + 5])}\t{i % 5}\n" for i in range(20)))
    for name, col in (("quora-train.csv", "is_duplicate"), ("sts-train.csv", "similarity")):
        (data / name).write_text(f"\tid\tsentence1\tsentence2\t{col}\n" + "".join(
            f"{i}\tp{i}\t{' '.join(words[i:i + 4])}\t{' '.join(words[i + 40:i + 46])}\t{i % 2}\n" for i in range(20)))
    for name, header in (("ids-sst-dev.csv", "\tid\tsentence\tsentiment"),):
        (data / name).write_text(header + "\n0\td0\tw80 w81 w82\t1\n")
    (data / "quora-dev.csv").write_text("\tid\tsentence1\tsentence2\tis_duplicate\n0\tq0\tw70 w71\tw72 w73\t1\n")
    (data / "sts-dev.csv").write_text("\tid\tsentence1\tsentence2\tsimilarity\n0\tt0\tw60 w61\tw62 w63\t1.0\n")
    out = main(["--out-dir", str(tmp_path / "out"), "--pretrained", str(ckpt), "--data-dir", str(data),
                "--epochs", "1", "--batch-size", "8", "--max-length", "16", "--max-steps", "3",
                "--log-every", "1", "--device", "cpu", "--checkpoint-every", "1"])
    info = json.loads((out / "pretrain_config.json").read_text())
    assert info["distinct_train_sentences"] == 60 and info["mlm_head_from_checkpoint"] is False
    assert info["eval_sentences"] == 5
    lines = [json.loads(x) for x in (out / "pretrain_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == [1, 2, 3]
    load_pretrained(out)
    assert not (tmp_path / "out.partial").exists()  # the state for resuming goes once the checkpoint is written
    said = [r.getMessage() for r in caplog.records if r.name.startswith("tasks.")]
    (plan,) = [x for x in said if "| plan: " in x]
    assert re.fullmatch(r"cpu, fp32: the default of this command on a CPU \(--bf16 for bf16 autocast\), \d+ threads? "
                        r"\| plan: MLM pretraining on 60 sentences, 3 steps \(8 per epoch, batch 8\), lr 5e-05; "
                        r"held-out MLM scored before and after on 5 sentences", plan), plan
    progress = [x for x in said if x.startswith("step ")]
    assert len(progress) == 3 and all(re.search(r" tok/s \| elapsed \d+s, left ~\d+s$", x) for x in progress), progress
    assert said.index(plan) < said.index(progress[0]) < said.index(
        next(x for x in said if x.startswith("estimate after 1 steps: the pretraining takes ~")))
    assert re.fullmatch(r"done: wall time \d+s", said[-1]), said[-1]
    log = (out / "pretrain.log").read_text().splitlines()  # the command's log, moved in with the checkpoint
    assert " I tasks.data.readers: " in log[0] and any("| plan: " in x for x in log) and any(x.endswith(said[-1]) for x in log)


def test_an_out_dir_that_is_not_a_checkpoint_is_refused_before_training(tmp_path, capsys):
    """--out-dir naming a directory of other files, or a file, fails at once with exit status 2, not after the
    pretraining (when save_mlm_checkpoint would refuse it too); the files are untouched."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit) as e:
        main(["--out-dir", str(tmp_path / "work"), "--data-dir", str(tmp_path / "no-data")])
    assert e.value.code == 2 and "is not a checkpoint directory" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "work").iterdir()] == ["notes.txt"]
    with pytest.raises(SystemExit) as e:
        main(["--out-dir", str(tmp_path / "work" / "notes.txt"), "--data-dir", str(tmp_path / "no-data")])
    assert e.value.code == 2 and "notes.txt is a file; --out-dir must be a directory" in capsys.readouterr().err
    assert (tmp_path / "work" / "notes.txt").read_text() == "keep me"


def test_every_flag_reaches_its_config_field():
    """Each PretrainConfig field has a CLI flag, and a non-default value given there reaches the config."""
    from dataclasses import fields

    values = {"epochs": 2, "batch_size": 7, "lr": 1e-4, "weight_decay": 0.01, "warmup": 0.1,
              "lr_schedule": "constant", "grad_clip": 0.5, "max_length": 64, "mlm_probability": 0.2,
              "max_steps": 9, "seed": 3, "log_every": 4, "device": "cpu", "bf16": True}
    assert set(values) == {f.name for f in fields(PretrainConfig)}  # named as train_multitask.py names them
    argv = ["--out-dir", "x"] + [a for k, v in values.items() if k != "bf16"
                                 for a in (f"--{k.replace('_', '-')}", str(v))] + ["--bf16"]
    config = config_from_args(build_parser().parse_args(argv))
    assert {f.name: getattr(config, f.name) for f in fields(PretrainConfig)} == values
    assert PretrainConfig() == config_from_args(build_parser().parse_args(["--out-dir", "x"]))


def test_pretrain_reports_a_bad_data_file_in_one_line(tiny_env, tmp_path, monkeypatch, capsys):
    """python -m tasks.pretrain: a non-UTF-8 data file is one line and exit status 1, not a traceback."""
    from tasks import pretrain

    data = bad_data(tiny_env, tmp_path, "ids-sst-train.csv", lambda b: b.replace(b"good", b"g\xffod", 1))
    monkeypatch.delenv("MINBERT_VERBOSE", raising=False)
    with pytest.raises(SystemExit) as exc:
        pretrain.main(["--out-dir", str(tmp_path / "out"), "--pretrained", str(tiny_env[0]), "--data-dir", str(data),
                       "--epochs", "1", "--batch-size", "8", "--max-length", "16", "--max-steps", "1",
                       "--device", "cpu"])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and "Traceback" not in err
    assert re.search(r"tasks\.pretrain: error: .*ids-sst-train\.csv: line \d+: bytes that are not UTF-8",
                     err.strip().splitlines()[-1])
    # a failed run's log stays beside its state for resuming, its error the last line
    last = (tmp_path / "out.partial" / "pretrain.log").read_text().splitlines()[-1]
    assert re.search(r" E tasks: python -m tasks\.pretrain: error: .*ids-sst-train\.csv: line \d+", last), last


def test_a_second_pretrain_into_a_live_runs_folder_is_refused(tmp_path, tiny_env, capsys):
    """Two pretrains into one --out-dir: the second is refused in one line (exit status 2) while the first holds
    <out-dir>.partial, and the first's lock and state are untouched."""
    import subprocess
    import sys

    partial = tmp_path / "mlm.partial"
    partial.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import socket
        (partial / "run.lock").write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname()}))
        with pytest.raises(SystemExit) as e:
            main(["--out-dir", str(tmp_path / "mlm"), "--data-dir", str(tiny_env[1])])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "mlm.partial" in err and str(holder.pid) in err, err
        assert json.loads((partial / "run.lock").read_text())["pid"] == holder.pid
    finally:
        holder.kill()
