"""Tests of tasks/predictions.py: prediction files in the CS224N starter's format and logits files, written
atomically with the user's file mode, read back exactly, malformed ones refused with file and line."""

from __future__ import annotations

import csv
import os
import stat

import pytest
import torch

from tasks.predictions import Predictions, read_logits, read_predictions, write_logits, write_predictions


def fake_predictions(task: str, n: int = 9) -> Predictions:
    g = torch.Generator().manual_seed(3)
    ids = [f"id{(i * 5) % n:03d}" for i in range(n)]  # not sorted: order must follow the input
    if task == "sst":
        logits = torch.randn(n, 5, generator=g)
        return Predictions(ids, logits, logits.argmax(-1))
    if task == "para":
        logits = torch.randn(n, generator=g)
        return Predictions(ids, logits, (logits > 0).long())
    scores = 5 * torch.rand(n, generator=g)
    return Predictions(ids, scores, scores.clone())


@pytest.mark.parametrize("task,column", [("sst", "Predicted_Sentiment"), ("para", "Predicted_Is_Paraphrase"),
                                         ("sts", "Predicted_Similiary")])
def test_prediction_files_every_id_once_in_input_order(tmp_path, task, column):
    """{task}-{split}-output.csv in the CS224N starter's bytes: 'id \\t <column> ' header (STS sic), '<id> , <v> '
    rows, each id once in input order, ints / floats as the task wants."""
    p = fake_predictions(task)
    path = write_predictions(tmp_path / "predictions", task, "dev", p)
    assert path == tmp_path / "predictions" / f"{task}-dev-output.csv"
    raw = path.read_bytes().decode("utf-8")
    lines = raw.split("\n")
    assert lines[0] == f"id \t {column} " and lines[-1] == "" and raw.endswith(" \n")
    rows = [line.split(" , ") for line in lines[1:-1]]
    assert all(len(r) == 2 and r[1].endswith(" ") for r in rows)
    assert [r[0] for r in rows] == p.ids and len(set(p.ids)) == len(p.ids)
    values = [r[1].strip() for r in rows]
    if task == "sts":
        assert torch.equal(torch.tensor([float(v) for v in values]), p.preds)
    else:
        assert [int(v) for v in values] == p.preds.tolist()  # plain ints, no "1.0"
    ids, back = read_predictions(path)
    assert ids == p.ids and torch.equal(back, p.preds)
    assert back.dtype == (torch.float32 if task == "sts" else torch.long)
    assert [f.name for f in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def test_write_predictions_rejects_invalid_values(tmp_path):
    """Out-of-range class ids, non-finite scores and unknown splits raise instead of writing a bad file."""
    with pytest.raises(ValueError, match="0..1"):
        write_predictions(tmp_path, "para", "dev", Predictions(["a"], torch.zeros(1), torch.tensor([2])))
    with pytest.raises(ValueError, match="non-finite"):
        write_predictions(tmp_path, "sts", "test", Predictions(["a"], torch.zeros(1), torch.tensor([float("nan")])))
    with pytest.raises(ValueError, match="split"):
        write_predictions(tmp_path, "sst", "valid", fake_predictions("sst"))
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("task,header", [("sst", ["id"] + [f"logit_{k}" for k in range(5)]),
                                         ("para", ["id", "logit"]), ("sts", ["id", "score"])])
def test_logits_round_trip(tmp_path, task, header):
    """read_logits(write_logits(p)) gives back the same ids and bit-identical float32 logits."""
    p = fake_predictions(task)
    path = write_logits(tmp_path, task, "test", p)
    assert path.name == f"{task}-test-logits.csv"
    with open(path, newline="") as f:
        assert next(csv.reader(f)) == header
    ids, logits = read_logits(path)
    assert ids == p.ids
    assert logits.dtype == torch.float32 and torch.equal(logits, p.logits)


@pytest.mark.parametrize("bad_line,problem", [("id002,0.5,oops,1,2,3", "not a number"),
                                              ("id002,0.5,1", "expected 6 fields"),
                                              ("id002,0.5,inf,1,2,3", "not finite")])
def test_malformed_logits_file_error_names_file_and_line(tmp_path, bad_line, problem):
    """A malformed row raises ValueError naming the file and its 1-based line."""
    path = write_logits(tmp_path, "sst", "dev", fake_predictions("sst", n=4))
    lines = path.read_text().splitlines()
    lines[2] = bad_line  # file line 3
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as err:
        read_logits(path)
    assert str(path) in str(err.value) and "line 3" in str(err.value) and problem in str(err.value)
    path.write_text("id,prob\nx,0.1\n")
    with pytest.raises(ValueError, match=r"line 1: header"):
        read_logits(path)


@pytest.fixture
def umask():
    """Set the process umask for one test, and put the old one back."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o027, 0o640)])
def test_prediction_and_logits_files_follow_the_umask(tmp_path, umask, mask, mode):
    """Leaderboard and logits files get the mode any new file of the user gets (0644 under umask 022), not the
    temporary-file default 0600 that hides a shared results folder from others."""
    umask(mask)
    preds = fake_predictions("sts")
    for path in (write_predictions(tmp_path, "sts", "dev", preds), write_logits(tmp_path, "sts", "dev", preds)):
        assert stat.S_IMODE(path.stat().st_mode) == mode, path


STARTER_COLUMN = {"sst": "Predicted_Sentiment", "para": "Predicted_Is_Paraphrase", "sts": "Predicted_Similiary"}  # sic


@pytest.mark.parametrize("task,values,expected", [
    ("sst", ["3", "0"], torch.tensor([3, 0])),
    ("para", ["1.0", "0.0"], torch.tensor([1, 0])),  # the starter writes numpy floats
    ("sts", ["3.1415927", "0.25"], torch.tensor([3.1415927, 0.25])),
])
def test_read_predictions_accepts_the_cs224n_starter_format(tmp_path, task, values, expected):
    """The starter's leaderboard files ('id \\t Predicted_Sentiment ' header, '<id> , <value> ' rows, STS's
    'Predicted_Similiary') read like our plain 'id,Predicted_*' files."""
    ids = ["b757", "d17a"]
    starter = tmp_path / f"starter-{task}.csv"
    with open(starter, "w") as f:  # as the starter's multitask_classifier.py writes them
        f.write(f"id \t {STARTER_COLUMN[task]} \n")
        for i, v in zip(ids, values):
            f.write(f"{i} , {v} \n")
    got_ids, got = read_predictions(starter)
    assert got_ids == ids and got.dtype == expected.dtype and torch.equal(got, expected)
    plain = write_predictions(tmp_path / "ours", task, "dev", Predictions(ids, expected.float(), expected))
    assert read_predictions(plain)[0] == ids and torch.equal(read_predictions(plain)[1], expected)
    starter.write_text("id \t Predicted_Nothing \nb757 , 1 \n")
    with pytest.raises(ValueError, match="line 1: header"):
        read_predictions(starter)
