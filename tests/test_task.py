"""Tests of tasks/task.py: the registry of tasks and their kinds, a user's task from a JSON file, and that nothing
outside the registry asks a task's name."""

from __future__ import annotations

import ast
import csv
import dataclasses
import json
import zipfile
from pathlib import Path

import pytest
import torch

from tasks.arguments import config_for
from tasks.predictions import read_logits, read_predictions
from tasks.evaluation.ensemble import EnsembleConfig, check_ensemble, make_ensemble
from tasks.evaluation.evaluator import Predictor, evaluate_checkpoint
from tasks.task import (BUILTIN, KINDS, MULTITASK, get_task, load_split, model_tasks, read_task_file, task_names,
                        unregister_task)
from tasks.training.run import run
from tests.helpers import tiny_train_config

ROOT = Path(__file__).resolve().parents[1]
WORDS = {0: "awful dull", 1: "fine okay", 2: "great moving"}  # a class is said by its words


@pytest.fixture
def user_tasks():
    """Drops the tasks a test declares from the (process-wide) registry afterwards."""
    yield
    for name in [t for t in task_names() if t not in BUILTIN]:
        unregister_task(name)


def write_csv(path: Path, header: list[str], rows: list[list], delimiter: str = ",") -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(header)
        w.writerows(rows)
    return path


def three_class_task(folder: Path, n: int = 48, name: str = "topic", labels=None) -> Path:
    """A user's three-class sentence CSV (comma-separated, no id column) and its task file."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, size in (("train", n), ("dev", n // 2), ("test", n // 4)):
        rows = [[f"the film was {WORDS[i % 3]} {i}"] + ([labels(i) if labels else i % 3] if split != "test" else [])
                for i in range(size)]
        write_csv(folder / f"{name}-{split}.csv", ["text"] + (["label"] if split != "test" else []), rows)
    spec = {"name": name, "train": f"{name}-train.csv", "dev": f"{name}-dev.csv", "test": f"{name}-test.csv",
            "text": "text", "label": "label"}
    (folder / f"{name}.json").write_text(json.dumps(spec))
    return folder / f"{name}.json"


def test_the_builtin_entries_and_their_kinds():
    """sst, para, sts and cfimdb are entries; each kind owns its metric and its logits' columns."""
    assert BUILTIN == ("sst", "para", "sts", "cfimdb") and MULTITASK == ("sst", "para", "sts")
    sst, para, sts, cfimdb = map(get_task, BUILTIN)
    assert (sst.kind, para.kind, sts.kind, cfimdb.kind) == (KINDS["sentence-classification"],
                                                            KINDS["pair-classification"], KINDS["pair-regression"],
                                                            KINDS["sentence-classification"])
    assert (sst.metric, para.metric, sts.metric, cfimdb.metric) == ("sst_acc", "para_acc", "sts_r", "cfimdb_acc")
    assert cfimdb.kind.logit_columns(cfimdb) == ["logit_0", "logit_1"] and sts.kind.logit_columns(sts) == ["score"]
    assert model_tasks(("cfimdb",)) == ("sst", "para", "sts", "cfimdb")  # the project's three heads stay
    with pytest.raises(ValueError, match="unknown task 'nope'.*--task-file"):
        get_task("nope")


def test_cfimdb_reads_its_files(tmp_path):
    """CFIMDB's entry reads the starter's files: long reviews, binary sentiment (the data copy, when linked)."""
    if not (ROOT / "data" / "ids-cfimdb-dev.csv").exists():
        pytest.skip("data/ not linked (bash setup.sh)")
    examples, report = load_split("cfimdb", "dev", ROOT / "data")
    assert len(examples) == 245 and {e.label for e in examples} == {0, 1} and report.clean


def test_a_task_file_infers_its_kind_from_the_labels(tmp_path, user_tasks):
    """Whole-number labels make a classification with max + 1 classes; a pair of text columns with fractional
    labels a pair regression; the ids are line numbers when the file has no id column."""
    task = read_task_file(three_class_task(tmp_path))
    assert task.kind is KINDS["sentence-classification"] and task.num_classes == 3
    assert task.id_column is None and task.delimiter == ","
    examples, _ = task.read("dev", ".")
    assert examples[0].id == "2" and examples[0].label == 0  # line 2: the first row after the header
    rows = [[i, f"a {i}", f"b {i}", i % 5 + 0.5] for i in range(6)]
    for split in ("train", "dev"):
        write_csv(tmp_path / f"sim-{split}.csv", ["id", "s1", "s2", "score"], rows, delimiter="\t")
    (tmp_path / "sim.json").write_text(json.dumps({"name": "sim", "train": "sim-train.csv", "dev": "sim-dev.csv",
                                                   "text": ["s1", "s2"], "label": "score"}))
    sim = read_task_file(tmp_path / "sim.json")
    assert sim.kind is KINDS["pair-regression"] and sim.delimiter == "\t" and sim.id_column == "id"


def test_float_labels_given_as_classification_are_refused_naming_the_file_and_row(tmp_path, user_tasks):
    """A fractional label in a task declared a classification: refused, naming the file and its line."""
    path = three_class_task(tmp_path, labels=lambda i: 2.5 if i == 7 else i % 3)
    spec = json.loads(path.read_text()) | {"kind": "sentence-classification"}
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=r"topic-train\.csv: line 9: label '2\.5' is not a class id"):
        read_task_file(path)
    assert "topic" not in task_names()
    # without a kind, fractional labels on one text column: no kind fits (no sentence regression)
    path.write_text(json.dumps({k: v for k, v in spec.items() if k != "kind"}))
    with pytest.raises(ValueError, match="no sentence regression kind"):
        read_task_file(path)


def test_an_objective_asked_for_a_kind_it_does_not_support_is_refused_before_any_data(tmp_path, user_tasks,
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


def test_a_task_files_task_joins_the_command_lines_tasks_once_and_can_be_left_out_after(tmp_path, user_tasks):
    """--task-file's task joins --tasks where the command line is read; a config built from it again (an
    --eval-only of some tasks, dataclasses.replace) keeps the tasks it is given: the user's task can be left out."""
    from tasks.config import eval_config

    task_file = three_class_task(tmp_path / "t")
    cfg = config_for(["--task-file", str(task_file), "--tasks", "sst"])
    assert cfg.tasks == ("sst", "topic")
    assert eval_config(cfg, {"tasks": ("sst",)}).tasks == ("sst",)
    assert dataclasses.replace(cfg, tasks=("sst",)).tasks == ("sst",)


def test_a_users_three_class_csv_trains_predicts_and_ensembles_with_no_code(tmp_path, user_tasks, tiny_env,
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
    ids, classes = read_predictions(pred / "topic-dev-output.csv")
    gold = {e.id: e.label for e in get_task("topic").read("dev", ".")[0]}
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
    assert labels.shape == (2,) and probs.shape == (2, 3) and torch.allclose(probs.sum(-1), torch.ones(2))
    with pytest.raises(ValueError, match="one sentence each"):
        p.predict("topic", [("a", "b")])

    ens = EnsembleConfig(runs=[str(r) for r in runs], out_dir=str(tmp_path / "ens"), data_dir=str(tiny_env[1]))
    check_ensemble(ens)
    summary, results = make_ensemble(ens)
    assert set(summary["tasks"]) == {"sst", "topic"}
    ids, classes = read_predictions(tmp_path / "ens" / "predictions" / "topic-dev-output.csv")
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


def test_cfimdb_with_a_frozen_encoder_writes_the_starters_part1_files(tmp_path, tiny_env, one_thread):
    """--tasks sst cfimdb --freeze-encoder (the starter's --option pretrain): the encoder's weights do not move,
    and the run writes pretrain-{sst,cfimdb}-{dev,test}-out.csv in the starter's format beside its own files."""
    pretrained, tiny = tiny_env
    data = tmp_path / "data"
    data.mkdir()
    for f in tiny.iterdir():
        (data / f.name).symlink_to(f)
    for split, n in (("train", 32), ("dev", 16), ("test", 8)):
        rows = [[i, f"cf-{split}-{i}", f"the film was {WORDS[2 * (i % 2)]}"] + ([i % 2] if split != "test" else [])
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


def test_a_users_pair_tasks_train_as_their_kinds(tmp_path, user_tasks, tiny_env, one_thread):
    """A pair classification (two classes) and a pair regression from a user's files train beside each other: each
    gets its kind's head, loss, metric and files (one logit; a 0-5 score), and the Predictor reads pairs."""
    folder = tmp_path / "t"
    folder.mkdir()
    for split, n in (("train", 32), ("dev", 16)):
        write_csv(folder / f"dup-{split}.csv", ["a", "b", "same"],
                  [[f"the film was {WORDS[i % 3]}", f"the film was {WORDS[(i // 2) % 3]}", int(i % 3 == (i // 2) % 3)]
                   for i in range(n)])
        write_csv(folder / f"sim-{split}.csv", ["a", "b", "score"],
                  [[f"the film was {WORDS[i % 3]}", f"the film was {WORDS[(i // 2) % 3]}", (i % 5) + 0.5]
                   for i in range(n)])
    for name in ("dup", "sim"):
        label = "same" if name == "dup" else "score"
        (folder / f"{name}.json").write_text(json.dumps({"name": name, "train": f"{name}-train.csv", "dev":
                                                         f"{name}-dev.csv", "text": ["a", "b"], "label": label}))
    files = (str(folder / "dup.json"), str(folder / "sim.json"))
    cfg = tiny_train_config(tiny_env, tmp_path / "run", tasks=("dup", "sim"), task_files=files, epochs=1)
    assert cfg.tasks == ("dup", "sim")
    assert (get_task("dup").kind, get_task("sim").kind) == (KINDS["pair-classification"], KINDS["pair-regression"])
    summary = run(cfg)
    assert set(summary["dev"]) == {"dup_acc", "sim_r", "overall"}
    assert read_logits(tmp_path / "run" / "predictions" / "dup-dev-logits.csv")[1].shape == (16,)
    ids, scores = read_predictions(tmp_path / "run" / "predictions" / "sim-dev-output.csv")
    assert scores.dtype == torch.float32 and len(ids) == 16
    p = Predictor.from_checkpoint(tmp_path / "run", device="cpu")
    labels, prob = p.predict("dup", [("the film was great moving", "the film was great moving")])
    score, same = p.predict("sim", [("a", "b")])
    assert labels.shape == prob.shape == score.shape == (1,) and torch.equal(score, same)
    with pytest.raises(ValueError, match="reads sentence pairs"):
        p.predict("sim", ["one sentence"])


def test_a_task_file_is_read_once_until_it_or_its_data_change(tmp_path, user_tasks, monkeypatch):
    """Every config naming a task file declares it again (a saved run, an ensemble's members): the files are read
    once while they stay as they were, and again once one changes."""
    import os

    from tasks import task as task_mod
    path = three_class_task(tmp_path)
    reads = []
    real = task_mod._read_task_file
    monkeypatch.setattr(task_mod, "_read_task_file", lambda p: reads.append(p) or real(p))
    first = read_task_file(path)
    assert read_task_file(path) is first and len(reads) == 1
    train = tmp_path / "topic-train.csv"
    train.write_text(train.read_text() + "the film was great moving 99,2\n")
    os.utime(train, ns=(os.stat(train).st_atime_ns, os.stat(train).st_mtime_ns + 10**9))
    unregister_task("topic")  # the changed file declares the task anew
    assert read_task_file(path).num_classes == 3 and len(reads) == 2
