"""Predict on new text: the Predictor API and python -m tasks.predict, end to end on a tiny run (issue 16, item 2)."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tasks.evaluation.evaluator import Predictor, load_checkpoint_model
from tasks.evaluation.files import read_logits
from tasks.model import ModelConfig
from tasks.predict import main, read_inputs
from tasks.training.run import run
from tests.test_train import tiny_env, tiny_train_config  # noqa: F401  (tiny_env is a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
DEV_FILES = {"sst": "ids-sst-dev.csv", "para": "quora-dev.csv", "sts": "sts-dev.csv"}


@pytest.fixture(scope="module", params=["cross", "siamese"])
def finished(request, tiny_env, tmp_path_factory) -> Path:  # noqa: F811
    """A finished tiny run directory, cross or Siamese pairs (baseline heads on mean pooling: the tiny model's
    b1 heads and pooler give nearly the same output for every sentence, too alike to test equality)."""
    out = tmp_path_factory.mktemp("predict") / "run"
    run(tiny_train_config(tiny_env, out, epochs=1,
                          model=ModelConfig(arch="baseline", pair_encoding=request.param, pooling="mean")))
    return out


def test_predictor_equals_the_runs_own_dev_predictions(finished, tiny_env):  # noqa: F811
    """Same numbers as predictions/*-dev-logits.csv, compared as logits to 1e-6 (outputs differ across examples by
    more than 1e-3, so a wrong sentence order or pairing fails)."""
    p = Predictor.from_checkpoint(finished / "checkpoints" / "best", device="cpu", batch_size=5)
    for task, name in DEV_FILES.items():
        examples = read_inputs(task, str(tiny_env[1] / name))  # the CS224N CSV format
        ids, saved = read_logits(finished / "predictions" / f"{task}-dev-logits.csv")
        assert [e.id for e in examples] == ids
        assert (saved.max(0).values - saved.min(0).values).min() > 1e-3, "outputs too alike to test anything"
        if task == "sst":
            labels, probs = p.sentiment([e.text_a for e in examples])
            assert torch.equal(labels, saved.argmax(-1))
            got, saved = probs.double().log(), saved.double()
            got, saved = got - got.mean(-1, keepdim=True), saved - saved.mean(-1, keepdim=True)
        elif task == "para":
            labels, probs = p.paraphrase([(e.text_a, e.text_b) for e in examples])
            assert torch.equal(labels, (saved > 0).long())
            got = torch.logit(probs.double())
        else:
            got = p.similarity([(e.text_a, e.text_b) for e in examples])
        torch.testing.assert_close(got, saved.to(got.dtype), atol=1e-6, rtol=0)


def test_embed_is_what_the_heads_read_in_input_order(finished):
    p = Predictor.from_checkpoint(finished, device="auto", batch_size=2)  # a run directory: its best checkpoint
    texts = ["the movie was great .", "a dull film", "how do i learn python fast ?"]
    got = p.embed(texts)
    model, _, tok, _ = load_checkpoint_model(finished / "checkpoints" / "best")
    model.eval()
    with torch.no_grad():
        for i, t in enumerate(texts):
            b = tok([t], max_length=32)
            torch.testing.assert_close(got[i], model.embed(b["input_ids"], b["attention_mask"],
                                                           b["token_type_ids"])[0], atol=1e-5, rtol=0)
    assert p.embed([]).shape == (0, got.shape[1])
    assert not any(m.training for m in p.model.modules())


def _csv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_predict_command_in_process(finished, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("the movie was great .\n\na dull and boring film\n")
    main(["--checkpoint", str(finished / "checkpoints" / "best"), "--task", "sst", "--input", str(tmp_path / "in.txt")])
    rows = _csv(capsys.readouterr().out)
    assert rows[0] == ["id", "label", "p0", "p1", "p2", "p3", "p4"]
    assert [r[0] for r in rows[1:]] == ["1", "3"]  # line numbers; the blank line is skipped
    assert all(abs(sum(map(float, r[2:])) - 1) < 1e-5 for r in rows[1:])
    (tmp_path / "pairs.txt").write_text("how do i cook rice ?\thow to cook rice ?\n")
    main(["--checkpoint", str(finished), "--task", "para", "--input", str(tmp_path / "pairs.txt"),
          "--output", str(tmp_path / "out.csv")])
    rows = _csv((tmp_path / "out.csv").read_text())
    assert rows[0] == ["id", "label", "p_paraphrase"] and rows[1][0] == "1" and rows[1][1] in ("0", "1")


def test_predict_command_subprocess_reads_stdin(finished):
    proc = subprocess.run([sys.executable, "-m", "tasks.predict", "--checkpoint", str(finished), "--task", "sts"],
                          input="a cat sits on the mat\ta cat runs in the park\n", capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = _csv(proc.stdout)
    assert rows[0] == ["id", "score"] and len(rows) == 2 and 0 <= float(rows[1][1]) <= 5


@pytest.mark.parametrize("argv, text, message", [
    (["--task", "sts"], "no tab here\n", "line 1: expected two sentences separated by one tab"),
    (["--task", "sst", "--input", "missing.txt"], "", "--input missing.txt: no such file"),
])
def test_predict_command_errors_are_one_line(finished, tmp_path, capsys, monkeypatch, argv, text, message):
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", str(finished)] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 2 and err[0].startswith("usage: python -m tasks.predict")
    assert message in err[1]


def test_a_damaged_checkpoint_is_one_line_with_exit_status_1(finished, tmp_path, capsys, monkeypatch):
    """A checkpoint whose weights file is cut short: one line naming the problem, exit status 1 (a run-time error,
    not an argument error), no traceback."""
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(finished / "checkpoints" / "best" if (finished / "checkpoints").is_dir() else finished, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    monkeypatch.setattr(sys, "stdin", io.StringIO("a fine film\n"))
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", str(damaged), "--task", "sst"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(err) == 1 and "Traceback" not in err[0], err
