"""Tests for tasks/evaluate.py: metrics, dataset-order predictions, prediction and logits files."""

from __future__ import annotations

import csv
import os
import stat

import pytest
import scipy.stats  # test dependency: a missing reference fails instead of skipping
import torch

from tasks.data.datasets import PairDataset, SentenceDataset, length_bucketed_batches
from tasks.data.readers import Example
from tasks.evaluation.evaluator import evaluate, predict_dataset
from tasks.evaluation.files import Predictions, read_logits, read_predictions, write_logits, write_predictions
from tasks.evaluation.metrics import TASK_METRIC, overall_score, pearson_r, score
from tasks.model import TaskOutput
from tests.helpers import WordTokenizer
from tests.test_model import make_model

TOK = WordTokenizer()
WORDS = "good bad film plot actor slow funny dull script scene music long short great awful".split()


pytestmark = pytest.mark.usefixtures("one_thread")


def sentences(n: int, seed: int) -> list[str]:
    """n random sentences of 1..20 words, so that length-sorting reorders them."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 21, (n,), generator=g).tolist()
    return [" ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (k,), generator=g)) for k in lengths]


def make_dataset(task: str, n: int = 23, labeled: bool = True, mode: str = "siamese"):
    """A tiny tokenized dataset for ``task`` with ids 'x0'..'x{n-1}' in order."""
    a, b = sentences(n, 1), sentences(n, 2)
    if task == "sst":
        return SentenceDataset([Example(f"x{i}", a[i], None, i % 5 if labeled else None) for i in range(n)], TOK)
    label = (lambda i: float(i % 2)) if task == "para" else (lambda i: (i * 7 % 11) / 2.0)
    ex = [Example(f"x{i}", a[i], b[i], label(i) if labeled else None) for i in range(n)]
    return PairDataset(ex, TOK, mode=mode)


# ---- metrics ------------------------------------------------------------------------


def test_overall_score_formula_on_hand_values():
    """overall = (sst_acc + para_acc + (sts_r + 1) / 2) / 3, and the mean over the tasks present otherwise."""
    m = {"sst_acc": 0.5, "para_acc": 0.8, "sts_r": 0.6, "loss": 9.0}
    assert overall_score(m) == pytest.approx((0.5 + 0.8 + 0.8) / 3)
    assert overall_score({"sts_r": -1.0}) == 0.0
    assert overall_score({"sst_acc": 0.5, "sts_r": 0.0}) == pytest.approx(0.5)
    assert overall_score({**m, "overall": 123.0}) == pytest.approx(0.7)  # "overall" itself is ignored
    with pytest.raises(ValueError):
        overall_score({"loss": 1.0})


def test_pearson_equals_scipy_on_random_data():
    """Our float64 Pearson r equals scipy.stats.pearsonr on random, correlated and anti-correlated data."""
    g = torch.Generator().manual_seed(0)
    for n in (2, 7, 500):
        x = torch.randn(n, generator=g)
        for y in (torch.randn(n, generator=g), 3 * x + 0.1 * torch.randn(n, generator=g) + 2, -x):
            want = scipy.stats.pearsonr(x.double().numpy(), y.double().numpy()).statistic
            assert pearson_r(x, y) == pytest.approx(float(want), abs=1e-12)
            assert score("sts", x, y) == pytest.approx(float(want), abs=1e-12)


def test_pearson_undefined_for_constant_input():
    """Zero variance gives nan (r is undefined), which then makes overall nan rather than a fake number."""
    r = pearson_r(torch.ones(5), torch.arange(5.0))
    assert r != r
    assert overall_score({"sst_acc": 1.0, "sts_r": r}) != overall_score({"sst_acc": 1.0, "sts_r": r})


def test_accuracy_for_class_tasks():
    """sst / para scores are the fraction of class ids equal to the labels (para labels are 0.0/1.0 floats)."""
    assert score("sst", torch.tensor([0, 1, 2, 3, 4]), torch.tensor([0, 1, 2, 0, 0])) == pytest.approx(0.6)
    assert score("para", torch.tensor([1, 0, 1, 1]), torch.tensor([1.0, 0.0, 0.0, 0.0])) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        score("sst", torch.tensor([0, 1]), torch.tensor([0]))
    with pytest.raises(ValueError):
        score("nli", torch.tensor([0]), torch.tensor([0]))


# ---- predict_dataset / evaluate ------------------------------------------------------------


@pytest.mark.parametrize("task,mode", [("sst", "siamese"), ("para", "siamese"), ("sts", "siamese"),
                                       ("para", "cross"), ("sts", "cross")])
def test_predict_dataset_in_dataset_order_equals_per_example(task, mode):
    """Length-sorted batches are put back in dataset order: row i equals running example i alone."""
    # Mean pooling: a random pooler's output barely depends on the input, mean pooling does.
    model = make_model("b1" if mode == "siamese" else "baseline", mode, pooling="mean").eval()
    ds = make_dataset(task, mode=mode)
    if task != "sts":  # center the last layer's output so class predictions vary across examples
        (*_, last) = (m for m in getattr(model, f"{task}_head").modules() if isinstance(m, torch.nn.Linear))
        with torch.no_grad():
            last.bias -= model(task, ds.collate(range(len(ds)))).logits.mean(0)
    batches = length_bucketed_batches(ds.lengths, 4, shuffle=False)
    assert [i for b in batches for i in b] != list(range(len(ds)))  # the batching really reorders
    p = predict_dataset(model, task, ds, batch_size=4)
    assert p.ids == ds.ids
    # Examples differ, so a wrong order cannot pass.
    assert float(p.logits.std(0).min()) > 1e-3 and len(set(p.preds.tolist())) > 1
    assert p.logits.dtype == torch.float32 and p.logits.device.type == "cpu"
    assert p.logits.shape == ((len(ds), 5) if task == "sst" else (len(ds),))
    with torch.no_grad():
        for i in range(len(ds)):
            out = model(task, ds.collate([i]))
            torch.testing.assert_close(p.logits[i : i + 1], out.logits, atol=1e-5, rtol=1e-5)
            if task != "sts":  # class ids; for STS preds are the scores just checked
                assert torch.equal(p.preds[i : i + 1], model.predict(task, out))
    if task == "sts":
        assert torch.equal(p.preds, p.logits)


@pytest.mark.parametrize("task,mode", [("para", "cross"), ("sts", "cross"), ("para", "siamese")])
def test_both_orders_scores_the_mean_of_a_pair_and_its_swap(task, mode):
    """both_orders=True: a pair's logit is the mean of its (a, b) and (b, a) logits (each computed alone),
    its prediction that mean's; the cross model really is asymmetric, so a one-order score cannot pass."""
    model = make_model("baseline", mode, pooling="mean").eval()
    ds = make_dataset(task, mode=mode)
    swapped = PairDataset([Example(i, b, a, y) for i, a, b, y in zip(ds.ids, *ds.texts, ds.labels.tolist())],
                          TOK, mode=mode)
    one, other = (predict_dataset(model, task, d, batch_size=4) for d in (ds, swapped))
    both = predict_dataset(model, task, ds, batch_size=4, both_orders=True)
    if mode == "cross":
        assert float((one.logits - other.logits).abs().max()) > 1e-3
    torch.testing.assert_close(both.logits, (one.logits + other.logits) / 2, atol=1e-5, rtol=1e-5)
    assert torch.equal(both.preds, model.predict(task, TaskOutput(both.logits)))
    sst = make_dataset("sst")
    assert torch.equal(predict_dataset(model, "sst", sst, both_orders=True).logits,
                       predict_dataset(model, "sst", sst).logits)


def test_predict_dataset_restores_every_module_mode():
    """predict runs the model in eval mode and gives each submodule back its own previous mode."""
    model = make_model("b1").train()
    model.encoder.eval()  # mixed modes, as with a frozen encoder during LP-FT
    before = {name: m.training for name, m in model.named_modules()}
    seen = []
    handle = model.register_forward_pre_hook(lambda m, args: seen.append(any(x.training for x in m.modules())))
    predict_dataset(model, "sst", make_dataset("sst", n=5), batch_size=2)
    handle.remove()
    assert seen and not any(seen)
    assert {name: m.training for name, m in model.named_modules()} == before
    model.eval()
    predict_dataset(model, "sst", make_dataset("sst", n=5))
    assert not any(m.training for m in model.modules())


def test_predict_dataset_autocast_bf16_on_cpu():
    """autocast_dtype=bfloat16 runs under CPU autocast and still returns float32 logits close to fp32."""
    model = make_model("baseline").eval()
    ds = make_dataset("sst", n=6)
    fp32 = predict_dataset(model, "sst", ds)
    bf16 = predict_dataset(model, "sst", ds, autocast_dtype=torch.bfloat16)
    assert bf16.logits.dtype == torch.float32
    torch.testing.assert_close(bf16.logits, fp32.logits, atol=5e-2, rtol=5e-2)


def test_evaluate_scores_labeled_and_skips_unlabeled():
    """evaluate returns each labeled task's metric and 'overall'; unlabeled datasets get predictions only."""
    model = make_model("b1").eval()
    datasets = {"sst": make_dataset("sst"), "para": make_dataset("para"), "sts": make_dataset("sts")}
    metrics, preds = evaluate(model, datasets, batch_size=8)
    assert set(metrics) == {*TASK_METRIC.values(), "overall"}
    for task, ds in datasets.items():
        assert metrics[TASK_METRIC[task]] == pytest.approx(score(task, preds[task].preds, ds.labels))
    assert metrics["overall"] == pytest.approx(overall_score(metrics))
    metrics, preds = evaluate(model, {"sst": make_dataset("sst"), "sts": make_dataset("sts", labeled=False)})
    assert set(metrics) == {"sst_acc", "overall"} and set(preds) == {"sst", "sts"}
    assert metrics["overall"] == pytest.approx(metrics["sst_acc"])


# ---- files ------------------------------------------------------------------------------


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


def test_minority_class_accuracy_reads_starter_files(tmp_path):
    """tasks.robustness.class_accuracy scores a starter-format prediction file by id, as it does our own."""
    from tasks.robustness import class_accuracy

    examples = [Example("b757", "x", label=1), Example("d17a", "y", label=1), Example("e3", "z", label=0)]
    starter = tmp_path / "sst-dev-output.csv"
    starter.write_text("id \t Predicted_Sentiment \nb757 , 1 \nd17a , 4 \ne3 , 0 \n")
    assert class_accuracy(starter, examples, 1) == 0.5
    ours = write_predictions(tmp_path / "ours", "sst", "dev",
                             Predictions(["b757", "d17a", "e3"], torch.zeros(3, 5), torch.tensor([1, 4, 0])))
    assert class_accuracy(ours, examples, 1) == 0.5
