"""Tests of tasks/task.py: the tasks' entries and their kinds, and a run's resolved once; users' tasks of every
kind trained, evaluated, predicted and ensembled from task files alone; a run that needs none of its task's files;
and that nothing outside the entries asks a task's name. (A task file's checks and inference:
tests/test_task_file.py.)"""

from __future__ import annotations

import ast
import csv
import dataclasses
import io
import json
import shutil
import zipfile
from pathlib import Path

import pytest
import sklearn.metrics  # test dependency: a missing reference fails instead of skipping
import torch

from minbert.bert import BertModel
from tasks import train as cli
from tasks.arguments import config_for
from tasks.ensemble import main as ensemble_main
from tasks.predict import main as predict_main
from tasks.predictions import read_logits, read_predictions
from tasks.evaluation.ensembling import EnsembleConfig, check_ensemble, make_ensemble
from tasks.evaluation.evaluator import Predictor, evaluate_checkpoint
from tasks.model import ModelConfig, MultitaskBert
from tasks.task import (BUILTIN, GLUE, KINDS, MULTITASK, PAIR_BINARY, Binary, Head, Layout, Task, get_task, load_split,
                        layout_from, mlp, model_tasks)
from tasks.training.run import run
from tests.helpers import (CLASS_WORDS, run_tasks, three_class_task, tiny_config, tiny_flags, tiny_train_config, user_task,
                           write_csv, write_tiny_model)

ROOT = Path(__file__).resolve().parents[1]


def test_the_builtin_entries_and_their_kinds():
    """sst, para, sts and cfimdb are entries; each kind owns its metric and its logits' columns."""
    assert BUILTIN == ("sst", "para", "sts", "cfimdb") and MULTITASK == ("sst", "para", "sts")
    sst, para, sts, cfimdb = map(get_task, BUILTIN)
    assert (sst.kind, para.kind, sts.kind, cfimdb.kind) == (KINDS["sentence-classification"], PAIR_BINARY,
                                                            KINDS["pair-regression"], KINDS["sentence-classification"])
    assert sst.classes == ("0", "1", "2", "3", "4") and para.kind.name == "pair-classification"
    assert sts.score_range == (0.0, 5.0) and sts.checks_range
    assert (sst.metric, para.metric, sts.metric, cfimdb.metric) == ("sst_acc", "para_acc", "sts_r", "cfimdb_acc")
    assert cfimdb.kind.logit_columns(cfimdb) == ["logit_0", "logit_1"] and sts.kind.logit_columns(sts) == ["score"]
    assert model_tasks(("cfimdb",)) == ("sst", "para", "sts", "cfimdb")  # the project's three heads stay
    with pytest.raises(ValueError, match="unknown task 'nope'.*--task-file"):
        get_task("nope")


def test_a_one_logit_tasks_probability_column_is_its_positive_labels():
    """The predict command's p_<label> column of a one-logit task is P(that label): P(class 1) from the sigmoid where
    the positive class is class 1, 1 - P(class 1) where it is class 0; GLUE's and Para's positive is class 1 ("1"),
    so that their F1 is class 1's as it always was."""
    def entry(positive: str) -> Task:
        return Task("dup", PAIR_BINARY, files={}, layout=Layout(("a", "b"), "y"),
                    classes=("duplicate", "not_duplicate"), positive=positive)
    first, second = entry("duplicate"), entry("")
    assert (first.positive_class, second.positive_class) == (0, 1)
    assert first.kind.row_columns(first) == ["label", "p_duplicate"]
    assert second.kind.row_columns(second) == ["label", "p_not_duplicate"]
    logit = torch.tensor(1.5)
    p1 = float(torch.sigmoid(logit))
    assert float(PAIR_BINARY.outputs(second, logit)) == p1
    assert first.kind.row(first, PAIR_BINARY.predict(logit), PAIR_BINARY.outputs(first, logit)) == \
        ["not_duplicate", pytest.approx(1 - p1, abs=1e-7)]
    assert second.kind.row(second, PAIR_BINARY.predict(logit), PAIR_BINARY.outputs(second, logit)) == \
        ["not_duplicate", p1]
    assert get_task("para").kind.row_columns(get_task("para")) == ["label", "p1"]  # as SST's p0..p4
    for name in ("mrpc", "wnli", "cola", "sst2", "para"):
        assert get_task(name).positive_class == 1 and get_task(name).positive == "1", name
    assert get_task("rte").positive_class == 1 and get_task("sst").positive_class is None


def test_cfimdb_reads_its_files(tmp_path):
    """CFIMDB's entry reads the starter's files: long reviews, binary sentiment (the data copy, when linked)."""
    if not (ROOT / "data" / "ids-cfimdb-dev.csv").exists():
        pytest.skip("data/ not linked (bash setup.sh)")
    examples, report = load_split("cfimdb", "dev", ROOT / "data")
    assert len(examples) == 245 and {e.label for e in examples} == {0, 1} and report.clean


def test_an_objective_asked_for_a_kind_it_does_not_support_is_refused_before_any_data(tmp_path,
                                                                                       tiny_env):
    """MNR on a sentence classification: refused by the config's check (no data read), naming both."""
    task_file = three_class_task(tmp_path / "t")
    cfg = tiny_train_config(tiny_env, tmp_path / "run", tasks=("topic",), task_files=(str(task_file),),
                            objectives={"mnr": {"tasks": ["topic"]}}, model=tiny_train_config(
                                tiny_env, tmp_path).model.__class__(pair_encoding="siamese"))
    with pytest.raises(ValueError, match="objective 'mnr' supports pair-regression and pair-classification tasks, "
                                         "and task 'topic' is a sentence-classification"):
        cfg.validate()
    assert not (tmp_path / "run").exists()


def test_a_task_files_task_joins_the_command_lines_tasks_once_and_can_be_left_out_after(tmp_path):
    """--task-file's task joins --tasks where the command line is read; a config built from it again (an
    --eval-only of some tasks, dataclasses.replace) keeps the tasks it is given: the user's task can be left out."""
    from tasks.train_config import eval_config

    task_file = three_class_task(tmp_path / "t")
    cfg = config_for(["--task-file", str(task_file), "--tasks", "sst"])
    assert cfg.tasks == ("sst", "topic")
    assert eval_config(cfg, {"tasks": ("sst",)}).tasks == ("sst",)
    assert dataclasses.replace(cfg, tasks=("sst",)).tasks == ("sst",)


def test_a_users_three_class_csv_trains_predicts_and_ensembles_with_no_code(tmp_path, tiny_env,
                                                                             one_thread):
    """--task-file topic.json (a CSV of its own columns) joins --tasks; the run trains it beside SST with its own
    loss weight, scores it on dev, writes its predictions and logits (classes 0-2), --eval-only and the Predictor
    predict it, and an ensemble of two runs combines it, leaving it out of the CS224N zip."""
    task_file = three_class_task(tmp_path / "t")
    argv = ["--task-file", str(task_file), "--tasks", "sst", "--loss-weights", "topic=0.5"]
    cfg = config_for(argv)
    assert cfg.tasks == ("sst", "topic") and cfg.loss_weights == {"topic": 0.5}
    runs = []
    for seed in (0, 1):
        run_cfg = tiny_train_config(tiny_env, tmp_path / f"run{seed}", tasks=cfg.tasks, task_files=cfg.task_files,
                                    loss_weights=cfg.loss_weights, epochs=1, seed=seed)
        summary = run(run_cfg)
        runs.append(tmp_path / f"run{seed}")
        assert "topic_acc" in summary["dev"] and "sst_acc" in summary["dev"]
    pred = runs[0] / "predictions"
    ids, classes = read_predictions(pred / "topic-dev-output.csv", tasks=cfg.entries)
    gold = {e.id: e.label for e in cfg.entries["topic"].read("dev", ".")[0]}
    assert ids == list(gold) and set(classes.tolist()) <= {0, 1, 2}
    assert read_logits(pred / "topic-dev-logits.csv")[1].shape == (len(gold), 3)
    assert (pred / "topic-test-output.csv").is_file()
    accuracy = sum(int(c) == gold[i] for i, c in zip(ids, classes)) / len(ids)
    assert accuracy == pytest.approx(json.loads((runs[0] / "metrics.jsonl").read_text().splitlines()[-1])["dev"]
                                     ["topic_acc"])

    again = evaluate_checkpoint(runs[0] / "checkpoints" / "best", out_dir=tmp_path / "eval")
    assert again["dev"]["topic_acc"] == pytest.approx(accuracy)

    p = Predictor.from_checkpoint(runs[0], device="cpu")
    labels, probs = p.predict("topic", ["the film was great moving", "the film was awful dull"])
    assert len(labels) == 2 and set(labels) <= set(cfg.entries["topic"].classes)  # its own labels
    assert probs.shape == (2, 3) and torch.allclose(probs.sum(-1), torch.ones(2))
    with pytest.raises(ValueError, match="one sentence each"):
        p.predict("topic", [("a", "b")])

    ens = EnsembleConfig(runs=[str(r) for r in runs], out_dir=str(tmp_path / "ens"), data_dir=str(tiny_env[1]))
    check_ensemble(ens)
    summary, results = make_ensemble(ens)
    assert set(summary["tasks"]) == {"sst", "topic"}
    ids, classes = read_predictions(tmp_path / "ens" / "predictions" / "topic-dev-output.csv", tasks=cfg.entries)
    assert set(classes.tolist()) <= {0, 1, 2} and len(ids) == len(gold)
    with zipfile.ZipFile(tmp_path / "ens" / "cs224n_default_final_project_submission.zip") as z:
        names = [n for n in z.namelist() if n.startswith("predictions/")]
    assert names and all("topic" not in n for n in names)


def test_no_module_outside_the_registry_compares_a_task_name():
    """The task names are data: no ``==`` / ``!=`` / ``in`` against a built-in task's name in the package, except
    in tasks/task.py (the entries themselves)."""
    names = set(BUILTIN)
    found = []
    for path in sorted((ROOT / "tasks").rglob("*.py")):
        if path.name == "task.py" and path.parent.name == "tasks":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                    for v in values:
                        if isinstance(v, ast.Constant) and v.value in names:
                            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"task names compared outside tasks/task.py: {found}"


# Where a module outside tasks/task.py may still ask what a kind is, and what: how many texts a task reads
# (``pair``) where lines are read as one sentence or two and where a pair's sides are swapped; a task file's
# declaration (its kind's text columns, its classes or range); and the modules not moved onto the kinds' methods
# yet (issue 69).
KIND_QUESTIONS = {
    "tasks/task_file.py": {"pair", "classification"},
    "tasks/perturb.py": {"classification"},
    "tasks/training/attacks.py": {"classification"},
}


def test_no_module_outside_the_kinds_asks_what_kind_a_task_is():
    """A kind is an object that is asked what to do: outside tasks/task.py no module reads a kind's
    ``classification``, ``binary``, ``siamese`` or ``pair`` to choose what to do, but where KIND_QUESTIONS says
    why (the model, the datasets, evaluation, ensembles and the objectives ask their kinds)."""
    asked = {}
    for path in sorted((ROOT / "tasks").rglob("*.py")):
        name = str(path.relative_to(ROOT))
        if name == "tasks/task.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("classification", "binary", "siamese", "pair") \
                    and node.attr not in KIND_QUESTIONS.get(name, ()):
                asked.setdefault(name, []).append(f"{node.lineno}: .{node.attr}")
    assert not asked, f"what kind a task is, asked outside tasks/task.py: {asked}"


def test_cfimdb_with_a_frozen_encoder_writes_the_starters_part1_files(tmp_path, tiny_env, one_thread):
    """--tasks sst cfimdb --freeze-encoder (the starter's --option pretrain): the encoder's weights do not move,
    and the run writes pretrain-{sst,cfimdb}-{dev,test}-out.csv in the starter's format beside its own files."""
    pretrained, tiny = tiny_env
    data = tmp_path / "data"
    data.mkdir()
    for f in tiny.iterdir():
        (data / f.name).symlink_to(f)
    for split, n in (("train", 32), ("dev", 16), ("test", 8)):
        rows = [[i, f"cf-{split}-{i}", f"the film was {CLASS_WORDS[2 * (i % 2)]}"] + ([i % 2] if split != "test" else [])
                for i in range(n)]
        name = f"ids-cfimdb-{split}.csv" if split != "test" else "ids-cfimdb-test-student.csv"
        write_csv(data / name, ["", "id", "sentence"] + (["sentiment"] if split != "test" else []), rows, "\t")
    cfg = tiny_train_config((pretrained, data), tmp_path / "run", tasks=("sst", "cfimdb"), freeze_encoder=True,
                            epochs=1)
    run(cfg)
    from safetensors.torch import load_file
    before = load_file(str(pretrained / "model.safetensors"))
    after = load_file(str(tmp_path / "run" / "checkpoints" / "best" / "encoder" / "model.safetensors"))
    common = [k for k in before if k in after]
    assert len(common) == len(before) and all(torch.equal(after[k], before[k]) for k in common)
    pred = tmp_path / "run" / "predictions"
    for task in ("sst", "cfimdb"):
        for split in ("dev", "test"):
            part1 = (pred / f"pretrain-{task}-{split}-out.csv").read_text()
            assert part1 == (pred / f"{task}-{split}-output.csv").read_text()
            assert part1.startswith("id \t Predicted_Sentiment \n")
    assert not list(pred.glob("finetune-*"))
    ids, classes = read_predictions(pred / "pretrain-cfimdb-dev-out.csv")
    assert len(ids) == 16 and set(classes.tolist()) <= {0, 1}


def test_a_users_pair_tasks_train_as_their_kinds(tmp_path, tiny_env, one_thread):
    """A pair classification (two classes) and a pair regression from a user's files train beside each other: each
    gets its kind's head, loss, metrics and files (one logit; a score on its labels' scale), and the Predictor
    reads pairs."""
    folder = tmp_path / "t"
    folder.mkdir()
    for split, n in (("train", 32), ("dev", 16)):
        write_csv(folder / f"dup-{split}.csv", ["a", "b", "same"],
                  [[f"the film was {CLASS_WORDS[i % 3]}", f"the film was {CLASS_WORDS[(i // 2) % 3]}", int(i % 3 == (i // 2) % 3)]
                   for i in range(n)])
        write_csv(folder / f"sim-{split}.csv", ["a", "b", "score"],
                  [[f"the film was {CLASS_WORDS[i % 3]}", f"the film was {CLASS_WORDS[(i // 2) % 3]}", (i % 5) + 0.5]
                   for i in range(n)])
    for name in ("dup", "sim"):
        label = "same" if name == "dup" else "score"
        (folder / f"{name}.json").write_text(json.dumps({"name": name, "train": f"{name}-train.csv", "dev":
                                                         f"{name}-dev.csv", "text": ["a", "b"], "label": label}))
    files = (str(folder / "dup.json"), str(folder / "sim.json"))
    cfg = tiny_train_config(tiny_env, tmp_path / "run", tasks=("dup", "sim"), task_files=files, epochs=1)
    assert cfg.tasks == ("dup", "sim")
    assert (cfg.entries["dup"].kind, cfg.entries["sim"].kind) == (PAIR_BINARY, KINDS["pair-regression"])
    assert cfg.entries["sim"].score_range == (0.5, 4.5)  # the training labels' own scale
    summary = run(cfg)
    assert set(summary["dev"]) == {"dup_acc", "dup_f1", "dup_mcc", "sim_r", "sim_spearman", "overall"}
    assert read_logits(tmp_path / "run" / "predictions" / "dup-dev-logits.csv")[1].shape == (16,)
    ids, scores = read_predictions(tmp_path / "run" / "predictions" / "sim-dev-output.csv", tasks=cfg.entries)
    assert scores.dtype == torch.float32 and len(ids) == 16
    p = Predictor.from_checkpoint(tmp_path / "run", device="cpu")
    labels, prob = p.predict("dup", [("the film was great moving", "the film was great moving")])
    score = p.predict("sim", [("a", "b")])  # a regression: its scores alone
    assert len(labels) == 1 and prob.shape == score.shape == (1,)
    with pytest.raises(ValueError, match="reads sentence pairs"):
        p.predict("sim", ["one sentence"])


class Distance(Head):
    """A Siamese pair head no kind of the package builds: a learned threshold minus the distance between the two
    sentences' projections, one logit."""

    features = ("distance",)

    def parts(self):
        return {"head": mlp([self.hidden, self.proj], self.dropout), "threshold": torch.nn.Parameter(torch.ones(()))}

    def score(self, model, task, pooled):
        head = model.part(task.name, "head")
        d = (head(pooled[0]) - head(pooled[1])).norm(dim=-1)  # (B,)
        return model.part(task.name, "threshold") - d, {"distance": d}


class Near(Binary):
    """A kind the package does not have: two classes by one logit, as Quora's head, trained by a hinge loss, and
    a Siamese pair scored by its own head (``Distance``)."""

    about = "near or far pairs"

    def siamese_head(self, task, config, hidden):
        return Distance(task, config, hidden)

    def loss(self, logits, labels, reduction="mean"):
        per = torch.relu(1 - (2 * labels.float() - 1) * logits.float())  # (B,)
        return per.mean() if reduction == "mean" else per.sum() if reduction == "sum" else per


def test_a_new_kind_builds_its_own_head_and_trains_predicts_and_reloads_with_no_caller_changed(
        tmp_path, tiny_env, one_thread, monkeypatch):
    """A kind object the package does not have (``Near``), declared by its name, is all a new kind of task takes:
    its Siamese head's parts become the model's ``near_head`` and ``near_threshold``, its loss trains them beside
    SST, the run scores it by its metrics, writes its predictions and logits, and the saved run reads its entry
    back by the kind's name and predicts it; read as one sequence (cross), it gets the one-sequence head."""
    near = Near("pair-near", pair=True)
    monkeypatch.setitem(KINDS, "pair-near", near)  # where kind_for finds it by the name a saved run records
    folder = tmp_path / "near"
    folder.mkdir()
    files = {}
    for split, n in (("train", 32), ("dev", 16)):
        files[split] = str(write_csv(folder / f"{split}.csv", ["a", "b", "y"], [
            [f"the film was {CLASS_WORDS[i % 3]}", f"a film {CLASS_WORDS[(i // 2) % 3]}", int(i % 3 == (i // 2) % 3)]
            for i in range(n)]))
    task = Task("near", near, files, layout_from({"text": ["a", "b"], "label": "y"}), classes=("0", "1"),
                symmetric=True)
    cfg = tiny_train_config(tiny_env, tmp_path / "run", tasks=("sst", "near"), user_tasks=[task], epochs=1,
                            model={"pair_encoding": "siamese"})
    summary = run(cfg)
    assert {"near_acc", "near_f1", "near_mcc"} <= set(summary["dev"])
    ids, logits = read_logits(tmp_path / "run" / "predictions" / "near-dev-logits.csv")
    assert len(ids) == 16 and logits.shape == (16,)
    ids, classes = read_predictions(tmp_path / "run" / "predictions" / "near-dev-output.csv", "near", cfg.entries)
    assert len(ids) == 16 and set(classes.tolist()) <= {0, 1}
    p = Predictor.from_checkpoint(tmp_path / "run", device="cpu")
    assert p.cfg.entries["near"].kind is near and isinstance(p.model.heads["near"], Distance)
    assert float(p.model.near_threshold.detach()) != 1.0  # trained by the kind's loss through its own head
    labels, prob = p.predict("near", [("the film was fine okay", "a film fine okay")])
    assert labels[0] in ("0", "1") and prob.shape == (1,)
    cross = MultitaskBert(BertModel(tiny_config()), ModelConfig(pair_encoding="cross", fcn_size=16), ("near",),
                          cfg.entries)
    assert type(cross.heads["near"]).__name__ == "OneSequence" and not hasattr(cross, "near_threshold")


# ---- users' tasks of every kind, from task files alone ------------------------------------------------------------

NLI_LABELS = ("entailment", "neutral", "contradiction")


def nli_task(folder: Path) -> Path:
    """An NLI-style task as it comes: tab-separated premise/hypothesis pairs labelled with words, no id column."""
    def rows(n: int, labelled: bool = True) -> list[list]:
        return [[f"the film was {CLASS_WORDS[i % 3]}", f"a film {CLASS_WORDS[(i + i // 3) % 3]} {i}"]
                + ([NLI_LABELS[(i // 3) % 3]] if labelled else []) for i in range(n)]
    task = user_task(folder, {"name": "nli3", "text": ["premise", "hypothesis"], "label": "gold"},
                     {"train": rows(48), "dev": rows(24)}, ["premise", "hypothesis", "gold"], "\t", "tsv")
    (folder / "nli3-test.tsv").write_text("premise\thypothesis\n" + "".join(f"{a}\t{b}\n" for a, b in rows(8, False)))
    spec = json.loads(task.read_text())
    task.write_text(json.dumps({**spec, "test": "nli3-test.tsv"}))
    return task


def _train(env, out: Path, task_file: Path, *flags: str, seed: int = 0) -> dict:
    return cli.main([*tiny_flags(env, out), "--task-file", str(task_file), "--seed", str(seed), *flags])


def _predict(run: Path, task: str, lines: str, capsys) -> list[list[str]]:
    source = run.parent / f"{task}-input.txt"
    source.write_text(lines)
    capsys.readouterr()
    predict_main(["--checkpoint", str(run), "--task", task, "--input", str(source), "--device", "cpu"])
    return list(csv.reader(io.StringIO(capsys.readouterr().out)))


def _eval_again(run: Path, out: Path, *flags: str) -> Path:
    cli.main(["--eval-only", "--checkpoint", str(run / "checkpoints" / "best"), "--out-dir", str(out), *flags])
    return out / "predictions"


def test_a_three_class_pair_task_with_word_labels_trains_predicts_and_ensembles_in_its_words(
        tmp_path, tiny_env, one_thread, capsys):
    """NLI as it comes (premise, hypothesis, a word): its classes are the sorted words, its head softmax over three;
    the run scores it, writes its predictions as the words, --eval-only re-predicts them byte for byte, predict
    prints a word and each class's probability, and an ensemble of two seeds writes words too."""
    task_file = nli_task(tmp_path / "nli")
    runs = [tmp_path / f"run{seed}" for seed in (0, 1)]
    for seed, out in enumerate(runs):
        summary = _train(tiny_env, out, task_file, "--tasks", "nli3", seed=seed)
    task = run_tasks(runs[0])["nli3"]
    assert task.kind is KINDS["pair-classification"] and task.classes == ("contradiction", "entailment", "neutral")
    assert set(summary["dev"]) == {"nli3_acc", "nli3_macro_f1", "nli3_mcc", "overall"}
    assert summary["dev"]["overall"] == summary["dev"]["nli3_acc"]  # a run of one's own tasks only: selected by them
    pred = runs[0] / "predictions"
    rows = list(csv.reader((pred / "nli3-dev-output.csv").open()))
    assert rows[0] == ["id", "label"] and len(rows) == 25 and {r[1] for r in rows[1:]} <= set(NLI_LABELS)
    assert read_logits(pred / "nli3-dev-logits.csv")[1].shape == (24, 3)
    assert len(list(csv.reader((pred / "nli3-test-output.csv").open()))) == 9
    again = _eval_again(runs[0], tmp_path / "eval")
    for name in ("nli3-dev-output.csv", "nli3-dev-logits.csv", "nli3-test-output.csv"):
        assert (again / name).read_bytes() == (pred / name).read_bytes(), name

    printed = _predict(runs[0], "nli3", "the film was great moving\ta film great moving\n", capsys)
    assert printed[0] == ["id", "label", "p_contradiction", "p_entailment", "p_neutral"]
    assert printed[1][1] in NLI_LABELS and sum(map(float, printed[1][2:])) == pytest.approx(1.0, abs=1e-5)

    ensemble_main([*map(str, runs), "--out-dir", str(tmp_path / "ens"), "--data-dir", str(tiny_env[1])])
    ens = list(csv.reader((tmp_path / "ens" / "predictions" / "nli3-dev-output.csv").open()))
    assert [r[0] for r in ens] == [r[0] for r in rows] and {r[1] for r in ens[1:]} <= set(NLI_LABELS)


def test_a_run_of_a_users_task_looks_no_task_up_by_name(tmp_path, tiny_env, one_thread, capsys, monkeypatch):
    """A run resolves its tasks once (TrainConfig.entries) and hands the entries down: training a user's task beside
    SST with an objective on both, --eval-only, predict and an ensemble of two runs ask the package for no task by
    name (``get_task`` of a name, wherever a module imported it, would fail the test)."""
    import sys

    import tasks.task as task_module

    asked: list[str] = []
    package_entry = task_module.get_task

    def by_entry_only(task):
        if isinstance(task, str):
            asked.append(task)
        return package_entry(task)

    for module in [m for name, m in sys.modules.items() if name.startswith("tasks")]:
        if getattr(module, "get_task", None) is package_entry:
            monkeypatch.setattr(module, "get_task", by_entry_only)
    task_file = nli_task(tmp_path / "nli")
    runs = [tmp_path / f"run{seed}" for seed in (0, 1)]
    for seed, out in enumerate(runs):
        _train(tiny_env, out, task_file, "--tasks", "sst", "nli3", "--objective", "rdrop", seed=seed)
    _eval_again(runs[0], tmp_path / "eval")
    assert _predict(runs[0], "nli3", "the film was great\ta film great\n", capsys)[1][1] in NLI_LABELS
    ensemble_main([*map(str, runs), "--out-dir", str(tmp_path / "ens"), "--data-dir", str(tiny_env[1]), "--method",
                   "regression"])
    assert asked == []


def test_a_sentence_regression_on_a_1_to_10_scale_trains_predicts_and_ensembles(tmp_path, tiny_env, one_thread,
                                                                                  capsys):
    """Whole-number ratings 1-10 declared a sentence regression: a score on the labels' own scale (the head's
    range [1, 10]), scored by Pearson and Spearman r; predictions, predict and the ensemble give scores in it."""
    def rows(n: int) -> list[list]:
        return [[f"the film was {CLASS_WORDS[i % 3]} {i}", 1 + (i % 3) * 4 + i % 2] for i in range(n)]
    task_file = user_task(tmp_path / "t", {"name": "rating", "text": "review", "label": "stars",
                                           "kind": "sentence-regression"},
                          {"train": rows(48), "dev": rows(24)}, ["review", "stars"])
    runs = [tmp_path / f"run{seed}" for seed in (0, 1)]
    for seed, out in enumerate(runs):
        summary = _train(tiny_env, out, task_file, "--tasks", "rating", seed=seed)
    entries = run_tasks(runs[0])
    task = entries["rating"]
    assert task.kind is KINDS["sentence-regression"] and task.score_range == (1.0, 10.0)
    assert set(summary["dev"]) == {"rating_r", "rating_spearman", "overall"}
    ids, scores = read_predictions(runs[0] / "predictions" / "rating-dev-output.csv", tasks=entries)
    assert len(ids) == 24 and scores.dtype == torch.float32 and bool(((scores >= 1) & (scores <= 10)).all())
    printed = _predict(runs[0], "rating", "a great moving film\n", capsys)
    assert printed[0] == ["id", "score"] and 1 <= float(printed[1][1]) <= 10
    again = _eval_again(runs[0], tmp_path / "eval")
    assert (again / "rating-dev-output.csv").read_bytes() == (runs[0] / "predictions" / "rating-dev-output.csv").read_bytes()
    ensemble_main([*map(str, runs), "--out-dir", str(tmp_path / "ens"), "--data-dir", str(tiny_env[1])])
    ids, scores = read_predictions(tmp_path / "ens" / "predictions" / "rating-dev-output.csv", tasks=entries)
    assert len(ids) == 24 and bool(((scores >= 1) & (scores <= 10)).all())


def test_a_regressions_span_is_its_ranges_width_unless_the_run_sets_it_as_stss(tmp_path):
    """A regression head's span is one setting per task, STS's as a user's: --sts-scale S is --spans sts=S, and a
    user's 1-10 rating spans its range's 9 unless --spans rating=S says otherwise; a classification has none."""
    rows = {s: [[f"the film was {CLASS_WORDS[i % 3]} {i}", 1 + (i % 3) * 4 + i % 2] for i in range(12)]
            for s in ("train", "dev")}
    task_file = user_task(tmp_path / "t", {"name": "rating", "text": "review", "label": "stars",
                                           "kind": "sentence-regression"}, rows, ["review", "stars"])
    run = ["--task-file", str(task_file), "--tasks", "sts", "rating"]

    def spans(cfg) -> dict[str, float]:
        return {t: cfg.entries[t].kind.head(cfg.entries[t], cfg.model, 8).span for t in cfg.tasks}

    assert spans(config_for(run)) == {"sts": 5.0, "rating": 9.0}
    assert spans(config_for([*run, "--sts-scale", "4", "--spans", "rating=2"])) == {"sts": 4.0, "rating": 2.0}
    with pytest.raises(ValueError, match=r"--spans para=\.\.\.: para is no regression \(regressions: sts, "
                                         r"rating\)"):
        config_for([*run, "--spans", "para=2"])


def test_a_header_less_tsv_is_read_by_column_position(tmp_path, tiny_env, one_thread, capsys):
    """A CoLA-shaped file (no header, "header": false; source, label, mark, sentence; a lone quote in the text)
    declared by column positions, its test file with a header of its own; its chosen metric (Matthews correlation)
    selects and equals scikit-learn's on the written predictions."""
    folder = tmp_path / "acc"
    def rows(n: int) -> list[list]:
        return [["src", i % 2, "" if i % 2 else "*", f'the film " was {CLASS_WORDS[2 * (i % 2)]} {i}'] for i in range(n)]
    task_file = user_task(folder, {"name": "accept", "text": 3, "label": 1, "header": False, "metric": "matthews",
                                   "test": {"file": "accept-test.tsv", "text": "sentence", "id": "index",
                                            "header": True}},
                          {"train": rows(48), "dev": rows(24)}, None, "\t", "tsv")
    (folder / "accept-test.tsv").write_text("index\tsentence\n" + "".join(f"{i}\tthe film {i}\n" for i in range(6)))
    runs = [tmp_path / f"run{seed}" for seed in (0, 1)]
    for seed, out in enumerate(runs):
        summary = _train(tiny_env, out, task_file, "--tasks", "accept", seed=seed)
    entries = run_tasks(runs[0])
    task = entries["accept"]
    assert task.metrics == ("mcc",) and task.layout.fmt.header is False and task.layout.text == (3,)
    examples, report = task.read("dev", ".")
    assert len(examples) == 24 and report.clean and examples[0].text_a == 'the film " was awful dull 0'
    assert examples[0].id == "1"  # no id column: the file line
    ids, preds = read_predictions(runs[0] / "predictions" / "accept-dev-output.csv", tasks=entries)
    gold = [e.label for e in examples]
    assert summary["dev"]["accept_mcc"] == pytest.approx(sklearn.metrics.matthews_corrcoef(gold, preds.tolist()))
    test_ids, _ = read_predictions(runs[0] / "predictions" / "accept-test-output.csv", tasks=entries)
    assert test_ids == [str(i) for i in range(6)]
    assert _predict(runs[0], "accept", "a great film\n", capsys)[0] == ["id", "label", "p0", "p1"]
    ensemble_main([*map(str, runs), "--out-dir", str(tmp_path / "ens"), "--data-dir", str(tiny_env[1])])
    assert len(read_predictions(tmp_path / "ens" / "predictions" / "accept-dev-output.csv", tasks=entries)[0]) == 24


def test_a_run_needs_none_of_its_tasks_files_to_predict_and_moves_with_them(tmp_path, tiny_env, one_thread, capsys):
    """A run keeps its task's entry: with the task file and its CSVs moved away, predict gives the user's task
    and SST, --eval-only predicts SST (the task's files skipped with a warning) and, told where the task file is
    now (--task-file), the task's files byte for byte as the run wrote them; an ensemble of it and a run of the
    same task from another folder combines them, and one of two runs whose task files are both gone averages
    the task's predictions without scoring them."""
    task_file = nli_task(tmp_path / "nli")
    run = tmp_path / "run"
    _train(tiny_env, run, task_file, "--tasks", "sst", "nli3")
    copy = shutil.copytree(tmp_path / "nli", tmp_path / "elsewhere")
    _train(tiny_env, tmp_path / "run-b", copy / "nli3.json", "--tasks", "sst", "nli3", seed=1)
    moved = (tmp_path / "nli").rename(tmp_path / "moved")

    assert _predict(run, "nli3", "a\tb\n", capsys)[1][1] in NLI_LABELS
    assert len(_predict(run, "sst", "a great film\n", capsys)) == 2
    eval_dir = _eval_again(run, tmp_path / "eval")
    assert "its dev file" in (tmp_path / "eval" / "train.log").read_text() and not (eval_dir / "nli3-dev-output.csv").exists()
    assert (eval_dir / "sst-dev-output.csv").read_bytes() == (run / "predictions" / "sst-dev-output.csv").read_bytes()
    eval_dir = _eval_again(run, tmp_path / "eval2", "--task-file", str(moved / "nli3.json"))
    for name in ("nli3-dev-output.csv", "nli3-dev-logits.csv", "nli3-test-output.csv"):
        assert (eval_dir / name).read_bytes() == (run / "predictions" / name).read_bytes(), name

    ensemble_main([str(run), str(tmp_path / "run-b"), "--out-dir", str(tmp_path / "ens"), "--data-dir",
                   str(tiny_env[1])])
    assert {r[1] for r in csv.reader((tmp_path / "ens" / "predictions" / "nli3-dev-output.csv").open())} \
        <= {"label", *NLI_LABELS}
    shutil.copytree(run, tmp_path / "run-copy")  # two runs whose task files are both gone: averaged, not scored
    summary = ensemble_main([str(run), str(tmp_path / "run-copy"), "--out-dir", str(tmp_path / "ens2"),
                             "--data-dir", str(tiny_env[1])])
    assert summary["tasks"]["nli3"]["simple_score"] is None and summary["tasks"]["sst"]["simple_score"] is not None
    assert (tmp_path / "ens2" / "predictions" / "nli3-dev-output.csv").is_file()


def test_a_task_file_changed_since_the_run_is_refused_by_eval_only_and_resume(tmp_path, tiny_env, one_thread,
                                                                               capsys):
    """--eval-only and --resume read a run's task as it was declared: a task file that since names another text
    column or other classes is refused, naming each change and what to do (exit status 2), never silently
    predicted or trained on; put back, it is taken again."""
    task_file = three_class_task(tmp_path / "t")
    run = tmp_path / "run"
    _train(tiny_env, run, task_file, "--tasks", "topic")
    spec = json.loads(task_file.read_text())
    task_file.write_text(json.dumps({**spec, "num_classes": 4}))
    for argv in (["--eval-only", "--out-dir", str(run)], ["--resume", "--out-dir", str(run), "--epochs", "2"]):
        with pytest.raises(SystemExit) as refused:
            cli.main(argv)
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert refused.value.code == 2 and "changed since the run was trained ('num_classes' was null, is 4)" in err
    task_file.write_text(json.dumps(spec))
    cli.main(["--eval-only", "--out-dir", str(run)])


def test_a_users_task_selects_the_best_epoch_only_when_asked(tmp_path, tiny_env, one_thread):
    """Beside the built-in tasks a user's task is scored but does not pick the best epoch (nor the checkpoint
    that writes the CS224N files): the overall is SST's alone; --best-metric topic makes it the task's."""
    task_file = three_class_task(tmp_path / "t")
    plain = _train(tiny_env, tmp_path / "run", task_file, "--tasks", "sst")
    assert plain["dev"]["overall"] == plain["dev"]["sst_acc"] != plain["dev"]["topic_acc"]
    chosen = _train(tiny_env, tmp_path / "chosen", task_file, "--tasks", "sst", "--best-metric", "topic_macro_f1")
    assert chosen["dev"]["overall"] == chosen["dev"]["topic_macro_f1"]
    log = (tmp_path / "chosen" / "train.log").read_text()
    assert "the best epoch is the one of the highest dev overall: topic_macro_f1" in log
    assert "task topic: sentence-classification, 3 classes (0, 1, 2)" in log


GLUE_ROWS = {"cola": (8551, 1043, 1063), "sst2": (67349, 872, 1821), "mrpc": (3667, 408, 1725),
             "rte": (2490, 277, 3000), "wnli": (635, 71, 146)}


@pytest.mark.parametrize("name", GLUE)
def test_each_glue_task_reads_its_files_as_glue_ships_them(name):
    """The task files of tasks/glue/ read GLUE's own files (data/glue, linked by setup.sh) with every row kept:
    CoLA's header-less train and dev by position (its dev file's last line without a line end) and its test by
    header, MRPC's BOM and lone quotes, RTE's words."""
    if not (ROOT / "data" / "glue").exists():
        pytest.skip("data/glue not linked (bash setup.sh)")
    task = get_task(name)
    for split, n in zip(("train", "dev", "test"), GLUE_ROWS[name]):
        examples, report = load_split(name, split, ROOT / "data")
        assert len(examples) == n and report.clean, report.summary()
        if split != "test":
            assert {task.label_name(e.label) for e in examples} == set(task.classes)
    assert examples[0].id == "0"  # the test files' index column


def test_a_users_task_run_logs_what_it_did_in_its_own_words(tmp_path, tiny_env, one_thread):
    """A run of a user's sentence task without a test file: no empty "test predictions for  in 0 s", no "pairs in
    both orders" where there are no pairs, counts in the singular where they are one, no pointer to RESULTS.md
    (which measures the CS224N tasks alone)."""
    rows = {s: [[f"the film was {CLASS_WORDS[i % 3]} {i}", ["bad", "ok", "good"][i % 3]] for i in range(24)]
            for s in ("train", "dev")}
    task_file = user_task(tmp_path / "t", {"name": "tone", "text": "text", "label": "y"}, rows, ["text", "y"])
    _train(tiny_env, tmp_path / "run", task_file, "--tasks", "tone")
    log = (tmp_path / "run" / "train.log").read_text()
    assert "1 thread |" in log and "plan: 1 epoch x" in log and "estimate after 3 steps" in log
    assert "no test predictions: no task of the run has a test file" in log
    assert "test predictions for  in" not in log and "pairs in both orders" not in log and "RESULTS.md" not in log
    assert "task tone: sentence-classification, 3 classes (bad, good, ok)" in log


def test_a_users_sentiment_task_declares_phrases_and_a_prior_beside_sst(tmp_path, tiny_env, one_thread):
    """What SST has (an extra stream of labelled phrases through its head, a probe prior at evaluation) any task may
    declare: a user's three-class sentiment task with "phrases" and "prior" trains its phrases as a stream of its
    own beside SST's, blends its own probe, saved per task in the checkpoint, and re-predicts from it."""
    folder = tmp_path / "t"
    rows = {s: [[f"the film was {CLASS_WORDS[i % 3]} {i}", i % 3] for i in range(48 if s == "train" else 24)]
            for s in ("train", "dev")}
    task_file = user_task(folder, {"name": "mood", "text": "text", "label": "y", "phrases": "mood-phrases.csv",
                                   "prior": 0.5}, rows, ["text", "y"])
    (folder / "mood-phrases.csv").write_text("text,y\n" + "".join(f"{CLASS_WORDS[i % 3]} {i},{i % 3}\n"
                                                                   for i in range(40)))
    run = tmp_path / "run"
    tiny = tiny_flags(tiny_env, run)
    flags = [f for i, f in enumerate(tiny) if f not in ("--sst-prior", "--sst-phrases")
             and tiny[i - 1] not in ("--sst-prior", "--sst-phrases")]  # the SST entry's own, set below
    summary = cli.main([*flags, "--task-file", str(task_file), "--tasks", "sst", "mood", "--sst-prior", "0.5",
                        "--sst-phrases", "sst-phrases-train.csv", "--max-train-examples", "mood_phrases=16",
                        "--task-batch-size", "mood_phrases=8"])
    cfg = config_for([*flags, "--task-file", str(task_file), "--tasks", "sst", "mood", "--sst-phrases",
                      "sst-phrases-train.csv"])
    assert list(cfg.resolve().extra) == ["phrases", "mood_phrases"] and set(cfg.resolve().priors) == {"sst", "mood"}
    assert cfg.resolve().priors["mood"].kind == "probe"
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert "mood_phrases/loss" in records[0]["train"] and "phrases/loss" in records[0]["train"]
    assert records[0]["data"]["mood mood_phrases"]["kept"] == 40
    best = run / "checkpoints" / "best"
    assert (best / "sst_prior.safetensors").is_file() and (best / "mood_prior.safetensors").is_file()
    assert "mood_acc" in summary["dev"]
    again = _eval_again(run, tmp_path / "eval")
    for name in ("mood-dev-output.csv", "mood-dev-logits.csv", "sst-dev-logits.csv"):
        assert (again / name).read_bytes() == (run / "predictions" / name).read_bytes(), name


def test_a_users_prior_is_set_per_task_as_ssts_and_stss_are(tmp_path):
    """The course's priors and a user's are one setting per task: --sst-prior W is --prior-weights sst=W, and a
    user's declared prior takes --prior-weights mood=W (0: off) and --prior-models mood=DIR as SST's does; a task
    without a prior, a key given both ways and an encoder of a prior that is off are refused naming the flags."""
    rows = {s: [[f"the film was {CLASS_WORDS[i % 3]} {i}", i % 3] for i in range(12)] for s in ("train", "dev")}
    task_file = user_task(tmp_path / "t", {"name": "mood", "text": "text", "label": "y", "prior": 0.3}, rows,
                          ["text", "y"])
    run = ["--task-file", str(task_file), "--tasks", "sst", "mood"]
    declared = config_for(run)
    assert {t: (p.weight, p.model) for t, p in declared.resolve().priors.items()} == {"sst": (0.5, None),
                                                                                 "mood": (0.3, None)}
    enc = str(write_tiny_model(tmp_path / "enc"))
    set_so = config_for([*run, "--sst-prior", "0.2", "--prior-weights", "mood=0.8", "--prior-models", f"mood={enc}"])
    assert {t: (p.weight, p.model) for t, p in set_so.resolve().priors.items()} == {"sst": (0.2, None),
                                                                               "mood": (0.8, enc)}
    assert set_so == config_for([*run, "--prior-weights", "sst=0.2", "mood=0.8", "--prior-models", f"mood={enc}"])
    with pytest.raises(FileNotFoundError, match=r"--prior-models mood=.*gone: no such checkpoint directory .* name "
                                                r"another, or pass --prior-weights mood=0"):
        config_for([*run, "--prior-models", f"mood={tmp_path / 'gone'}"])
    assert set(config_for([*run, "--prior-weights", "mood=0"]).resolve().priors) == {"sst"}
    with pytest.raises(SystemExit):  # the command's one line (tests/test_train.py: REFUSED)
        config_for([*run, "--sst-prior", "0.2", "--prior-weights", "sst=0.1"])
    with pytest.raises(ValueError, match=r"--prior-weights para=\.\.\.: para declares no prior \(tasks that do: "
                                         r"sst, sts, mood\)"):
        config_for(["--task-file", str(task_file), "--tasks", "sst", "para", "mood", "--prior-weights", "para=0.3"])
    with pytest.raises(ValueError, match=r"--sts-prior only acts on STS's predictions, and --tasks sst mood has no "
                                         r"sts"):
        config_for([*run, "--sts-prior", "0.3"])
    with pytest.raises(ValueError, match=r"--prior-models mood=\.\.\. only acts on a run with mood and its prior's "
                                         r"weight above 0 \(--prior-weights mood=\.\.\.\)"):
        config_for([*run, "--prior-weights", "mood=0", "--prior-models", "mood=enc"])


def _mood(tmp_path) -> Path:
    """A user's three-class sentiment task file declaring a stream of labelled phrases (``mood_phrases``)."""
    folder = tmp_path / "t"
    rows = {s: [[f"the film was {CLASS_WORDS[i % 3]} {i}", i % 3] for i in range(48 if s == "train" else 24)]
            for s in ("train", "dev")}
    task_file = user_task(folder, {"name": "mood", "text": "text", "label": "y", "phrases": "mood-phrases.csv"},
                          rows, ["text", "y"])
    (folder / "mood-phrases.csv").write_text("text,y\n" + "".join(f"{CLASS_WORDS[i % 3]} {i},{i % 3}\n"
                                                                   for i in range(40)))
    return task_file


def test_a_users_stream_is_set_per_stream_as_the_sst_phrases_are(tmp_path):
    """The course's extra stream and a user's are one setting per stream: --sst-phrases FILE is --stream-files
    phrases=FILE, and a user's declared stream takes --stream-files mood_phrases=FILE (none: off),
    --stream-min-words and --stream-orders as SST's phrases do; a stream no task of the run declares, and a setting
    of a stream the run does not train, are refused naming the flag."""
    task_file = _mood(tmp_path)
    run = ["--task-file", str(task_file), "--tasks", "sst", "mood"]
    declared = config_for(run).resolve().extra
    assert declared["mood_phrases"].file == str(task_file.parent / "mood-phrases.csv")
    assert (declared["mood_phrases"].min_words, declared["mood_phrases"].order) == (1, "mixed")
    other = tmp_path / "other.csv"
    other.write_text((task_file.parent / "mood-phrases.csv").read_text())
    set_so = config_for([*run, "--stream-files", f"mood_phrases={other}", "--stream-min-words", "mood_phrases=2",
                         "--stream-orders", "mood_phrases=first", "--sst-phrases-min-words", "3"])
    mood, sst = set_so.resolve().extra["mood_phrases"], set_so.resolve().extra["phrases"]
    assert (mood.file, mood.min_words, mood.order, sst.min_words) == (str(other), 2, "first", 3)
    assert set_so == config_for([*run, "--stream-files", f"mood_phrases={other}", "--stream-orders",
                                 "mood_phrases=first", "--stream-min-words", "mood_phrases=2", "phrases=3"])
    off = config_for([*run, "--stream-files", "mood_phrases=none"])
    assert list(off.resolve().extra) == ["phrases"] and off.resolve().streams == ("sst", "mood", "phrases")
    with pytest.raises(ValueError, match=r"--stream-min-words mood_phrases=\.\.\. only acts on a run that trains "
                                         r"stream mood_phrases \(--stream-files mood_phrases=FILE on a run with mood"):
        config_for([*run, "--stream-files", "mood_phrases=none", "--stream-min-words", "mood_phrases=2"])
    (task_file.parent / "mood-phrases.csv").unlink()  # a declared stream's file gone: the stream may be turned off
    assert list(config_for([*run, "--stream-files", "mood_phrases=none"]).resolve().extra) == ["phrases"]
    with pytest.raises(FileNotFoundError, match=r"task file .*mood\.json's \"phrases\" .*mood-phrases\.csv: no such "
                                                r"file: put it there or correct the path, or train without the stream: "
                                                r"--stream-files mood_phrases=none"):
        config_for(run)
    from tasks.selection import stream_file
    resumed = config_for([*run, "--stream-files", "mood_phrases=none"])
    resumed.stream_files = {}  # the run as it started, its stream on: a resume says to put the file back
    with pytest.raises(FileNotFoundError, match=r"mood-phrases\.csv: no such file .*: the resumed run trains on the "
                                                r"data it started with: put the file back, or name the task file "
                                                r"where it is now, its files beside it \(--task-file\)$"):
        stream_file(resumed, resumed.resolve().extra["mood_phrases"], resuming=True)
    with pytest.raises(ValueError, match=r"--stream-files mood_phrases=\.\.\. sets stream mood_phrases, which no "
                                         r"task declares \(the tasks' extra streams: phrases\)"):
        config_for(["--stream-files", f"mood_phrases={other}"])


def test_a_users_pair_regression_declares_nli_triplets_as_sts_does(tmp_path, tiny_env, one_thread, capsys):
    """What STS has (NLI triplets that --nli streams through its sentence embeddings, paper §4.2) a user's pair
    regression may declare: "triplets", a file beside its task file; a run of it with --nli and MNR trains on its
    own triplets through its own head, before STS's (which every model has), and a run that declares none trains
    on STS's."""
    from tasks.task import model_tasks, with_triplets

    def rows(n: int) -> list[list]:
        return [[f"the film was {CLASS_WORDS[i % 3]}", f"a film {CLASS_WORDS[(i // 2) % 3]} {i}", i % 6]
                for i in range(n)]
    folder = tmp_path / "t"
    task_file = user_task(folder, {"name": "relate", "text": ["a", "b"], "label": "score", "range": [0, 5],
                                   "triplets": "relate-nli.csv"}, {"train": rows(32), "dev": rows(16)},
                          ["a", "b", "score"])
    (folder / "relate-nli.csv").write_text("sent0,sent1,hard_neg\n" + "".join(
        f"the film was {CLASS_WORDS[i % 3]} {i},a {CLASS_WORDS[i % 3]} film,the film was not {CLASS_WORDS[i % 3]}\n"
        for i in range(21)))  # 21 triplets: not the tiny data's nli-train.csv
    flags = ["--task-file", str(task_file), "--tasks", "sst", "relate", "--nli", "--pair-encoding", "siamese",
             "--objective", "mnr"]
    cfg = config_for(flags)
    assert with_triplets(cfg.entries, model_tasks(cfg.tasks)).name == "relate"
    assert with_triplets(cfg.entries, model_tasks(("sst", "para"))).name == "sts"
    run = tmp_path / "run"
    cli.main([*tiny_flags(tiny_env, run), *flags])
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    nli = records[0]["data"]["nli train"]
    assert (nli["file"], nli["kept"]) == (str(folder / "relate-nli.csv"), 21)
    assert "nli/mnr.loss" in records[0]["train"], sorted(records[0]["train"])
    (folder / "relate-nli.csv").unlink()
    with pytest.raises(FileNotFoundError, match=r"task file .*relate\.json's \"triplets\" .*relate-nli\.csv: no such "
                                                r"file: put it there or correct the path, or train without them"):
        config_for(flags)
    with pytest.raises(SystemExit) as refused:  # a resume trains on its own triplets: put back, never --no-nli
        cli.main(["--resume", "--out-dir", str(run), "--epochs", "2"])
    assert refused.value.code == 2 and capsys.readouterr().err.rstrip().endswith(
        "relate-nli.csv: no such file: the resumed run trains on the data it started with: put the file back, or name "
        "the task file where it is now, its files beside it (--task-file)")


@pytest.mark.parametrize("objective", ["rdrop", "smart", "rift", "knn_bert", "scl", "match_tuning",
                                       "label_smoothing", "simcse"])
def test_an_objective_takes_a_users_declared_stream_by_its_tasks_kind(objective, tmp_path, tiny_env, one_thread):
    """Any declared stream can be taken by an objective (issue 69, item 4), as SST's phrases are: a user task's
    ``<name>_phrases`` stream trains its task's head, so every objective that takes sentence classifications
    takes it by that kind and trains on it through that head (its terms in the stream's log; match-tuning's
    transform on the head's pooled embeddings)."""
    run = tmp_path / "run"
    cli.main([*tiny_flags(tiny_env, run), "--task-file", str(_mood(tmp_path)), "--tasks", "sst", "mood",
              "--max-train-examples", "mood_phrases=16", "--task-batch-size", "mood_phrases=8",
              "--objective", objective, f"--{objective.replace('_', '-')}-tasks", "mood_phrases"])
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    terms = [k for k in records[0]["train"] if k.startswith("mood_phrases/") and k != "mood_phrases/loss"]
    # match-tuning has no term of its own: it transforms the pooled embeddings of the stream's head (mood's)
    assert terms or objective == "match_tuning", sorted(records[0]["train"])
    assert "mood_acc" in records[-1]["dev"]


def test_a_declared_stream_of_a_kind_an_objective_does_not_take_is_refused_naming_it(tmp_path, tiny_env, capsys):
    """A stream whose task is of a kind the objective does not take is refused in one line naming the stream and
    its task."""
    with pytest.raises(SystemExit):
        cli.main([*tiny_flags(tiny_env, tmp_path / "refused"), "--task-file", str(_mood(tmp_path)), "--tasks", "sst",
                  "mood", "--objective", "mnr", "--mnr-tasks", "mood_phrases"])
    assert "objective 'mnr' supports pair-regression and pair-classification tasks, and stream 'mood_phrases' " \
           "trains task 'mood', which is a sentence-classification" in capsys.readouterr().err


# ---- the course's tasks are their files: a renamed copy trains to the same predictions ---------------------------


def _renamed_copy(task: str, name: str, data: Path) -> Path:
    """The shipped task file of ``task`` (tasks/cs224n/) as a user's ``name``, beside its data files (``data``, a
    folder of links to the tiny data): every key as shipped but its name and its extra stream's name (which the copy
    takes from its own: ``<name>_phrases``)."""
    spec = json.loads((ROOT / "tasks" / "cs224n" / f"{task}.json").read_text(encoding="utf-8"))
    spec["name"] = name
    if "phrases" in spec:
        del spec["phrases"]["name"]
    path = data / f"{name}.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


def _same_start(monkeypatch, renamed: dict[str, str]):
    """A model's heads start, and its run's task-keyed draws are made, as if each copy in ``renamed`` (copy ->
    shipped task, streams too) were the shipped task. Two things of a run are a function of a task's name by design:
    a model draws the project's three heads before the run's others (tasks.task.model_tasks), and a stream's
    shuffles and subsets are seeded by its name (tasks.data.schedule). The first run records its heads' initial
    weights and the RNG state after drawing them; the second starts from them (a copy's parts from its shipped
    task's) and keys its streams' seeds by the shipped names. Records the first run; the function it returns
    readies the second."""
    from tasks.data import schedule

    drawn = MultitaskBert._init_heads
    start: dict = {}

    def record(model):
        drawn(model)
        start["heads"] = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("encoder.")}
        start["rng"] = torch.get_rng_state()

    def replay(model):
        drawn(model)
        state = model.state_dict()
        for key, value in start["heads"].items():
            state[key].copy_(value)
            for copy, task in renamed.items():
                if key.startswith(f"{task}_"):
                    state[copy + key[len(task):]].copy_(value)
        torch.set_rng_state(start["rng"])

    seeded = schedule._generator

    def as_shipped(*key):
        return seeded(*(renamed.get(k, k) if isinstance(k, str) else k for k in key))

    def second_run():
        monkeypatch.setattr(MultitaskBert, "_init_heads", replay)
        monkeypatch.setattr(schedule, "_generator", as_shipped)

    monkeypatch.setattr(MultitaskBert, "_init_heads", record)
    return second_run


TIMES = ("time_s", "elapsed_s", "per_s")  # metrics.jsonl's keys of seconds and speeds


def _outputs(run_dir: Path, renamed: dict[str, str]) -> dict[str, bytes]:
    """A run's predictions (every file under predictions/) and its metrics.jsonl without times, its folder's name
    or its keys' order, a copy's (``renamed``) under its shipped task's name."""
    def shipped(name: str) -> str:
        for copy in sorted(renamed, key=len, reverse=True):  # my_sst_phrases before my_sst
            name = name.replace(copy, renamed[copy])
        return name
    out = {shipped(p.name): p.read_bytes() for p in sorted((run_dir / "predictions").iterdir())}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timeless = [{k: v for k, v in r.items() if not k.endswith(TIMES)} for r in records]
    named = shipped(json.dumps(timeless).replace(str(run_dir), "RUN"))
    out["metrics.jsonl"] = json.dumps(json.loads(named), sort_keys=True, indent=0).encode()
    return out


@pytest.mark.parametrize("task, extras", [
    ("sst", {"prior_weights": {"sst": 0.5, "sts": 0.0}, "stream_files": {"phrases": "sst-phrases-train.csv"}}),
    ("sts", {"prior_weights": {"sst": 0.0, "sts": 0.5}}),
])
def test_a_renamed_copy_of_a_shipped_task_file_trains_beside_the_others_to_its_predictions(
        task, extras, tmp_path, tiny_env, one_thread, monkeypatch):
    """The course's tasks are their task files: SST's (its phrases and probe prior) or STS's (its cosine prior,
    its 0-5 span) copied under another name trains beside the other two to the shipped task's predictions, logits and
    dev scores byte for byte, from the same start (``_same_start``: heads and name-seeded draws)."""
    pretrained, tiny = tiny_env
    data = tmp_path / "data"
    data.mkdir()
    for f in tiny.iterdir():
        (data / f.name).symlink_to(f)
    copy = f"my_{task}"
    renamed = {copy: task} | ({f"{copy}_phrases": "phrases"} if task == "sst" else {})
    task_file = _renamed_copy(task, copy, data)
    second_run = _same_start(monkeypatch, renamed)
    settings = dict(data_dir=str(data), stream_files={"phrases": None}, prior_models={task: str(pretrained)}) | extras
    shipped = tiny_train_config(tiny_env, tmp_path / "shipped", **settings)
    run(shipped)
    second_run()
    own = {k: ({copy if s == task else s: v for s, v in m.items()} if k.startswith("prior_") else m)
           for k, m in settings.items() if k != "stream_files"}
    copied = tiny_train_config(tiny_env, tmp_path / "copy", task_files=[str(task_file)],
                               tasks=tuple(copy if t == task else t for t in MULTITASK), **own)
    run(copied)
    a, b = _outputs(tmp_path / "shipped", {}), _outputs(tmp_path / "copy", renamed)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].decode().splitlines() == b[name].decode().splitlines(), name
