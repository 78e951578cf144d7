"""Tests of tasks/evaluation/evaluator.py: predictions in dataset order, both-order pair scoring, module modes and
autocast kept, evaluation of a saved checkpoint from the checkpoint alone, and the Predictor API on a tiny finished
run."""

from __future__ import annotations

import shutil

import pytest
import torch

from tasks.data.datasets import PairDataset, length_bucketed_batches
from tasks.data.readers import Example
from tasks.checkpoint import load_model, resolve_checkpoint
from tasks.evaluation.evaluator import Evaluator, Predictor, evaluate, evaluate_checkpoint, predict_dataset
from tasks.predictions import read_logits
from tasks.evaluation.metrics import task_metric, overall_score, score
from minbert.bert import BertModel
from tasks.model import ModelConfig, MultitaskBert, TaskOutput
from tasks.task import MULTITASK, Tasks, get_task
from tasks.task_file import read_task_file
from tasks.predict import read_inputs
from tasks.training.run import run
from tests.helpers import TOK, make_dataset, make_model, sentences, tiny_config, tiny_train_config, user_task

pytestmark = pytest.mark.usefixtures("one_thread")


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


def test_a_pair_task_with_an_order_is_scored_in_its_files_order(tmp_path):
    """Both orders are for pairs without order (Quora's, STS's, MRPC's: ``symmetric``); an entailment pair (RTE,
    NLI: premise, then hypothesis), trained in its files' order, is scored in that order under both_orders too,
    and its entry says so from a task file without the key. The tiny cross model really is asymmetric."""
    rows = {"train": [["a man sleeps", "a man rests", "entailment"], ["a dog runs", "a cat sits", "neutral"]] * 4,
            "dev": [["a man sleeps", "a man rests", "entailment"], ["a dog runs", "a cat sits", "neutral"]]}
    spec = {"name": "entail", "text": ["premise", "hypothesis"], "label": "label"}
    entail = read_task_file(user_task(tmp_path / "e", spec, rows, ["premise", "hypothesis", "label"]))
    assert not entail.symmetric and get_task("para").symmetric and get_task("sts").symmetric
    assert get_task("mrpc").symmetric and not get_task("rte").symmetric and not get_task("wnli").symmetric
    paired = read_task_file(user_task(tmp_path / "p", {**spec, "name": "paired", "symmetric": True}, rows,
                                      ["premise", "hypothesis", "label"]))
    assert paired.symmetric
    torch.manual_seed(0)
    model = MultitaskBert(BertModel(tiny_config()), ModelConfig(arch="baseline", pair_encoding="cross", fcn_size=16,
                                                                pooling="mean"), MULTITASK + ("entail", "paired"),
                          Tasks([entail, paired]))
    with torch.no_grad():  # spread the heads as make_model does, so that the two orders' logits differ
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear) and not name.startswith("encoder."):
                m.weight.normal_(0.0, m.in_features ** -0.5)
                m.bias.normal_(0.0, 0.1)
    model.eval()
    for task in ("entail", "paired"):
        ds = PairDataset([Example(str(i), a, b, 0) for i, (a, b, _) in enumerate(rows["dev"] * 3)], TOK,
                         mode="cross", label_dtype=torch.long)
        one = predict_dataset(model, task, ds, batch_size=4)
        both = predict_dataset(model, task, ds, batch_size=4, both_orders=True)
        swapped = predict_dataset(model, task, PairDataset([Example(i, b, a, 0) for i, a, b in
                                                            zip(ds.ids, *ds.texts)], TOK, mode="cross",
                                                           label_dtype=torch.long), batch_size=4)
        assert float((one.logits - swapped.logits).abs().max()) > 1e-3
        expected = (one.logits + swapped.logits) / 2 if task == "paired" else one.logits
        torch.testing.assert_close(both.logits, expected, atol=1e-5, rtol=1e-5)


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
    assert set(metrics) == {*(task_metric(t) for t in datasets), "overall"}
    for task, ds in datasets.items():
        assert metrics[task_metric(task)] == pytest.approx(score(task, preds[task].preds, ds.labels))
    assert metrics["overall"] == pytest.approx(overall_score(metrics))
    metrics, preds = evaluate(model, {"sst": make_dataset("sst"), "sts": make_dataset("sts", labeled=False)})
    assert set(metrics) == {"sst_acc", "overall"} and set(preds) == {"sst", "sts"}
    assert metrics["overall"] == pytest.approx(metrics["sst_acc"])


# ---- a saved checkpoint ------------------------------------------------------------------------------


def test_eval_only_rebuilds_the_model_from_the_checkpoint_alone(tiny_env, tmp_path, caplog):
    """evaluate_checkpoint needs no pretrained directory (deleted here) and reproduces the run's final dev metrics;
    its log says the device and precision first and where it wrote last (a training run's: where its predictions
    are and where the recipe's scores are to compare with); only the STS prior reads one (its
    sentence encoder's, when that is this one), and without it says so and how to go on."""
    pretrained = shutil.copytree(tiny_env[0], tmp_path / "bert")
    with caplog.at_level("INFO"):
        summary = run(tiny_train_config((pretrained, tiny_env[1]), tmp_path / "run", epochs=1,
                                          prior_weights={"sts": 0.0, "sst": 0.0}))
    last = [r.getMessage() for r in caplog.records if r.name == "tasks.training.run"][-2:]
    assert last[0].startswith(f"predictions: {tmp_path / 'run' / 'predictions'} (") and "RESULTS.md" in last[0]
    assert last[1].startswith("done: wall time")
    shutil.rmtree(pretrained)
    caplog.clear()
    with caplog.at_level("INFO"):
        result = evaluate_checkpoint(tmp_path / "run" / "checkpoints" / "best", out_dir=tmp_path / "eval")
    assert result["dev"] == summary["dev"]
    lines = [r.getMessage() for r in caplog.records if r.name == "tasks.evaluation.evaluator"]
    assert lines[0].startswith(f"evaluating {tmp_path / 'run' / 'checkpoints' / 'best'} on cpu, fp32")
    assert lines[-1].startswith(f"wrote {len(result['files'])} files to {tmp_path / 'eval' / 'predictions'} in ")
    assert (tmp_path / "eval" / "predictions" / "sts-test-output.csv").is_file()
    with pytest.raises(FileNotFoundError, match="--sts-prior-model .*: no such checkpoint directory .*name another, or pass --sts-prior 0"):
        evaluate_checkpoint(tmp_path / "run" / "checkpoints" / "best", out_dir=tmp_path / "eval2",
                            overrides={"prior_weights": {"sts": 0.5, "sst": 0.0},
                                       "prior_models": {"sts": str(pretrained)}})


# ---- the Predictor, on a tiny finished run (the ``finished`` fixture, tests/conftest.py) --------------------


DEV_FILES = {"sst": "ids-sst-dev.csv", "para": "quora-dev.csv", "sts": "sts-dev.csv"}


def test_predictor_equals_the_runs_own_dev_predictions(finished, tiny_env):
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
    model, _, tok, _ = load_model(resolve_checkpoint(finished / "checkpoints" / "best"))
    model.eval()
    with torch.no_grad():
        for i, t in enumerate(texts):
            b = tok([t], max_length=32)
            torch.testing.assert_close(got[i], model.embed(b["input_ids"], b["attention_mask"],
                                                           b["token_type_ids"])[0], atol=1e-5, rtol=0)
    assert p.embed([]).shape == (0, got.shape[1])
    assert not any(m.training for m in p.model.modules())


def test_a_long_prediction_says_how_far_it_got(monkeypatch, caplog):
    """Predicting a large set logs its progress once a period (a clock that moves 61 s a look, here), not
    nothing for minutes; the predictions are the same."""
    from tasks.evaluation import evaluator as evaluator_mod
    model = make_model("b1").eval()
    ds = make_dataset("sst", n=12)
    quiet = predict_dataset(model, "sst", ds, batch_size=4)
    clock = iter(range(0, 10_000, 61))
    monkeypatch.setattr(evaluator_mod.time, "monotonic", lambda: float(next(clock)))
    with caplog.at_level("INFO", logger="tasks.evaluation.evaluator"):
        loud = predict_dataset(model, "sst", ds, batch_size=4)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:2] == ["sst: 0 of 12 examples predicted in 61 s", "sst: 4 of 12 examples predicted in 122 s"]
    assert torch.equal(loud.logits, quiet.logits)


# ---- a run with a user's task of word labels -----------------------------------------------------------------------


MOOD_WORDS = {"happy": ["good", "great", "fun", "superb", "lovely"], "sad": ["bad", "awful", "dull", "boring", "poor"]}


@pytest.fixture(scope="module")
def mood_run(tiny_env, tmp_path_factory):
    """(run directory, task folder) of a finished tiny run on SST and a user's sentence task "mood" whose labels are
    words (happy, sad), its best epoch picked by the mean of both tasks' metrics."""
    folder = tmp_path_factory.mktemp("mood")
    rows = {split: [[i, f"the film was {MOOD_WORDS[label][i % 5]} .", label]
                    for i, label in enumerate(["happy", "sad"] * n)] for split, n in (("train", 12), ("dev", 5),
                                                                                       ("test", 3))}
    task_file = user_task(folder, {"name": "mood", "text": "text", "label": "label"}, rows, ["id", "text", "label"])
    out = folder / "run"
    run(tiny_train_config(tiny_env, out, tasks=("sst", "mood"), task_files=(str(task_file),), epochs=1,
                          best_metric=("sst", "mood")))
    return out, folder


def test_eval_only_without_a_user_tasks_dev_file_predicts_the_rest(mood_run, tmp_path, caplog):
    """--eval-only of a run whose user task's dev file has gone predicts what it still can (the other tasks' dev,
    every test file), the log naming the file it skipped; the scores it cannot compute are absent, not zero: the
    task's, and the overall that averages it (not silently an overall of the rest). Evaluated alone, the task has
    no dev predictions at all, and the evaluation still ends, with no dev scores."""
    run_dir, folder = mood_run
    dev = folder / "mood-dev.csv"
    moved = dev.rename(folder / "moved.csv")
    try:
        with caplog.at_level("INFO"):
            result = evaluate_checkpoint(run_dir / "checkpoints" / "best", out_dir=tmp_path / "eval")
            alone = evaluate_checkpoint(run_dir / "checkpoints" / "best", out_dir=tmp_path / "alone",
                                        overrides={"tasks": ("mood",)})
    finally:
        moved.rename(dev)
    assert set(result["dev"]) == set(get_task("sst").metric_keys) and result["dev_rows"] == {"sst": 24}
    written = {f.rsplit("/", 1)[-1] for f in result["files"]}
    assert {"sst-dev-output.csv", "mood-test-output.csv", "sst-test-output.csv"} <= written
    assert "mood-dev-output.csv" not in written
    assert f"task mood: its dev file {dev} is not there: its dev predictions are skipped" in caplog.text
    assert "no dev overall: it averages sst_acc and mood_acc, and mood has no dev predictions" in caplog.text
    assert alone["dev"] == {} and alone["dev_rows"] == {}
    assert [f.rsplit("/", 1)[-1] for f in alone["files"]] == ["mood-test-output.csv", "mood-test-logits.csv"]


def test_predict_gives_a_tasks_own_labels_and_a_regressions_scores(mood_run, finished):
    """Predictor.predict speaks each task's own labels, the strings its files write (a user's words; SST's "0".."4"),
    with the probabilities of its classes in class order, and gives a regression's scores as one array;
    the course's helpers keep their class numbers, and every form agrees with the others."""
    p = Predictor.from_checkpoint(mood_run[0], device="cpu")
    texts = ["the film was great .", "the film was dull ."]
    labels, probs = p.predict("mood", texts)
    assert set(labels) <= {"happy", "sad"} and len(labels) == 2 and probs.shape == (2, 2)
    assert labels == [p.cfg.entries["mood"].classes[int(k)] for k in probs.argmax(-1)]
    labels, probs = p.predict("sst", texts)
    numbers, same = p.sentiment(texts)
    assert labels == [str(int(k)) for k in numbers] and torch.equal(probs, same)
    p = Predictor.from_checkpoint(finished, device="cpu")
    pairs = [("a cat sits", "a cat is sitting"), ("a dog runs", "how do i cook rice ?")]
    scores = p.predict("sts", pairs)
    assert isinstance(scores, torch.Tensor) and scores.shape == (2,) and torch.equal(scores, p.similarity(pairs))
    labels, prob = p.predict("para", pairs)
    numbers, same = p.paraphrase(pairs)
    assert labels == [str(int(k)) for k in numbers] and prob.shape == (2,) and torch.equal(prob, same)


def test_dev_predictions_of_one_class_are_warned_about_once_at_the_final_evaluation(tiny_env, tmp_path, caplog):
    """A classifier whose whole dev set is predicted as one class (short CoLA runs: MCC 0) gets one warning at the
    final evaluation naming the task, the class, the dev examples and the usual causes; the trainer's evaluations
    between epochs say nothing of it, and a model that predicts several classes (or dev labels of one class) none."""
    cfg = tiny_train_config(tiny_env, tmp_path / "run", tasks=("sst",))
    model = make_model("baseline", pooling="mean").eval()
    evaluator = Evaluator(cfg, cfg.resolve(), [], torch.device("cpu"), None)
    rows = [Example(f"x{i}", text, None, i % 5) for i, text in enumerate(sentences(10, 3))]
    examples = {"dev": {"sst": rows}, "test": {"sst": None}}
    with caplog.at_level("WARNING", logger="tasks.evaluation.evaluator"):
        evaluator.write_all(model, TOK, tmp_path / "varied", examples=examples)
    assert "collapsed" not in caplog.text
    (*_, last) = (m for m in model.sst_head.modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad():
        last.bias.copy_(torch.tensor([0.0, 0.0, 100.0, 0.0, 0.0]))
    caplog.clear()
    with caplog.at_level("WARNING", logger="tasks.evaluation.evaluator"):
        evaluator.evaluate(model, {"sst": make_dataset("sst")})  # between epochs
        assert not caplog.records
        evaluator.write_all(model, TOK, tmp_path / "one", examples=examples)
    warned = [r.getMessage() for r in caplog.records if "collapsed" in r.getMessage()]
    assert warned == ["sst: all 10 dev predictions are one class, 2 (20% of the dev labels): the classifier "
                      "collapsed to a constant, as after too few steps (--epochs, --limit), at a learning rate too "
                      "high or too low (--lr), or on a task one class dominates"]
    caplog.clear()
    same = {"dev": {"sst": [Example(e.id, e.text_a, None, 2) for e in rows]}, "test": {"sst": None}}
    with caplog.at_level("WARNING", logger="tasks.evaluation.evaluator"):
        evaluator.write_all(model, TOK, tmp_path / "same", examples=same)
    assert "collapsed" not in caplog.text
