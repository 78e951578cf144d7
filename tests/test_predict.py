"""Tests of tasks/predict.py, python -m tasks.predict: predictions on new text end to end on a tiny finished run,
and its one-line errors. The Predictor it calls is tested in tests/evaluation/test_evaluator.py."""

from __future__ import annotations

import csv
import io
import subprocess
import sys

import pytest

from tasks import predict as predict_mod
from tasks.predict import main
from tests.helpers import ROOT

pytestmark = pytest.mark.usefixtures("one_thread")


def _csv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_predict_command_in_process(finished, tmp_path, capsys, caplog):
    (tmp_path / "in.txt").write_text("the movie was great .\n\na dull and boring film\n\x00\x00\n")
    main(["--checkpoint", str(finished / "checkpoints" / "best"), "--task", "sst", "--input", str(tmp_path / "in.txt")])
    rows = _csv(capsys.readouterr().out)
    assert rows[0] == ["id", "label", "p0", "p1", "p2", "p3", "p4"]
    assert [r[0] for r in rows[1:]] == ["1", "3"]  # line numbers; the blank line and the NUL bytes are skipped
    assert all(abs(sum(map(float, r[2:])) - 1) < 1e-5 for r in rows[1:])
    (tmp_path / "pairs.txt").write_text("how do i cook rice ?\thow to cook rice ?\n")
    with caplog.at_level("INFO"):
        main(["--checkpoint", str(finished), "--task", "para", "--input", str(tmp_path / "pairs.txt"),
              "--output", str(tmp_path / "out.csv")])
    assert f"wrote 1 rows of para predictions to {tmp_path / 'out.csv'}" in caplog.text  # the file it wrote
    rows = _csv((tmp_path / "out.csv").read_text())
    assert rows[0] == ["id", "label", "p1"] and rows[1][0] == "1" and rows[1][1] in ("0", "1")


def test_predict_command_subprocess_reads_stdin(finished):
    proc = subprocess.run([sys.executable, "-m", "tasks.predict", "--checkpoint", str(finished), "--task", "sts"],
                          input="a cat sits on the mat\ta cat runs in the park\n", capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = _csv(proc.stdout)
    assert rows[0] == ["id", "score"] and len(rows) == 2 and 0 <= float(rows[1][1]) <= 5


@pytest.mark.parametrize("argv, text, message", [
    (["--task", "sts"], "no tab here\n", "stdin: line 1: expected two sentences separated by one tab (task sts), "
                                        "found no tab"),
    (["--task", "sts"], "a cat sits\ta cat sat\na\tb\tc\n", "stdin: line 2: expected two sentences separated by one "
                                                             "tab (task sts), found 2 tabs"),
    (["--task", "para"], "a cat sits\ta cat sat\n\na sentence\t\n", "stdin: line 3: the second sentence of the pair "
                                                                     "is empty; task para reads two sentences "
                                                                     "separated by one tab a line"),
    (["--task", "para"], " \ta cat sat\n", "stdin: line 1: the first sentence of the pair is empty; task para reads "
                                            "two sentences separated by one tab a line"),
    (["--task", "sst", "--input", "missing.txt"], "", "--input missing.txt: no such file"),
])
def test_predict_command_errors_are_one_line(finished, tmp_path, capsys, monkeypatch, argv, text, message):
    """A malformed input line is refused in one line naming stdin's line and what is wrong with it (a pair line
    without its tab, with two, or with an empty sentence), and a missing --input names the file: exit status 2."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", str(finished)] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 2 and err[0].startswith("usage: python -m tasks.predict")
    assert message in err[1]


@pytest.mark.parametrize("argv, stdin, message", [
    (["--task", "sst", "--output", "no/such/dir/x.csv"], b"a fine film\n",
     "--output no/such/dir/x.csv: no such directory no/such/dir; create it or name another file"),
    (["--task", "sst", "--output", "."], b"a fine film\n", "--output . is a directory: name a file in it"),
    (["--task", "sst"], b"a fine film\nun film tr\xe8s dr\xf4le\n",
     "stdin: line 2: bytes that are not UTF-8 (byte 0xe8 at column 11); save the text as UTF-8"),
    (["--task", "sst", "--input", "latin1.txt"], b"",
     "--input latin1.txt: line 2: bytes that are not UTF-8 (byte 0xe8 at column 11); save the text as UTF-8"),
    (["--task", "sst", "--batch-size", "0"], b"a fine film\n", "--batch-size must be at least 1, got 0"),
])
def test_predict_refuses_bad_paths_and_bytes_before_predicting(finished, tmp_path, capsys, monkeypatch, argv, stdin,
                                                               message):
    """Each of these is refused before any prediction is computed, in one line naming the flag, file or stdin
    line, exit status 2: no traceback, and no value silently replaced (--batch-size 0)."""
    (tmp_path / "latin1.txt").write_bytes(b"a fine film\nun film tr\xe8s dr\xf4le\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8",
                                                       errors="surrogateescape"))
    monkeypatch.chdir(tmp_path)
    computed = []
    monkeypatch.setattr(predict_mod, "prediction_rows", lambda *a: computed.append(a) or (["id"], []))
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", str(finished)] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 2 and "Traceback" not in err[-1], err
    assert message in err[1] and not computed


def test_a_damaged_checkpoint_is_refused_as_an_argument_with_exit_status_2(finished, tmp_path, capsys, monkeypatch):
    """A checkpoint whose weights file is cut short is checked with the arguments, before any work, as the train
    command's --eval-only checks it: one line naming the file, exit status 2, no traceback."""
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(finished / "checkpoints" / "best" if (finished / "checkpoints").is_dir() else finished, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    monkeypatch.setattr(sys, "stdin", io.StringIO("a fine film\n"))
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", str(damaged), "--task", "sst"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 2 and "model.safetensors is truncated or corrupted" in err[1], err


def test_a_task_the_checkpoint_lacks_is_refused_naming_the_checkpoints_tasks(finished, capsys):
    """--task of a task the checkpoint was not trained on names the tasks it was (not the built-in list, not
    --task-file, which predict does not take)."""
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", str(finished), "--task", "topic"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "--task topic: " in err and "was trained on sst, para, sts; name one of them" in err
    assert "--task-file" not in err


def test_text_input_is_a_file_of_lines(tmp_path):
    """Only \\n and \\r\\n end a line: U+2028, U+0085 and U+001E stay inside the sentence, so the ids are the file's
    line numbers; a pair line split by a hidden separator is still one line."""
    path = tmp_path / "in.txt"
    path.write_bytes("one\u2028sentence\r\ntwo\x85more\n\nthree\x1ethree\n".encode())
    got = predict_mod.read_inputs("sst", str(path))
    assert [(e.id, e.text_a) for e in got] == [("1", "one\u2028sentence"), ("2", "two\x85more"),
                                                ("4", "three\x1ethree")]
    path.write_bytes("a cat\u2028sits\ta cat is sitting\n".encode())
    assert [(e.text_a, e.text_b) for e in predict_mod.read_inputs("sts", str(path))] == [("a cat\u2028sits",
                                                                                          "a cat is sitting")]


def test_a_sentence_task_fed_tab_separated_pairs_is_refused_naming_the_line(tmp_path):
    """predict --task sst on lines of two tab-separated sentences would score each whole line as one sentence: it is
    refused, naming the first such line and the pair tasks."""
    path = tmp_path / "pairs.txt"
    path.write_text("a fine film\na cat sits\ta cat is sitting\n")
    with pytest.raises(ValueError, match=r"--input .*pairs.txt: line 2 holds a tab: task sst reads one sentence a "
                                         r"line.*para, sts"):
        predict_mod.read_inputs("sst", str(path))


def test_threads_sets_the_cpu_threads_as_train_does(finished, capsys, monkeypatch):
    """--threads N computes on N CPU threads (tasks.runtime.set_threads, as the train command's --threads) and the
    log says so; --threads 0 is refused as the train command refuses it, before anything is predicted."""
    import torch

    monkeypatch.setattr(sys, "stdin", io.StringIO("a fine film\n"))
    main(["--checkpoint", str(finished), "--task", "sst", "--threads", "2", "--device", "cpu"])
    assert torch.get_num_threads() == 2
    assert "on cpu, fp32" in capsys.readouterr().err  # the Predictor's line, with the threads
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", str(finished), "--task", "sst", "--threads", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1].endswith("error: --threads must be at least 1, got 0"), err
