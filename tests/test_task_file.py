"""Tests of tasks/task_file.py: a user's task file checked value by value before any data is read, its kind and
classes inferred from its labels as run_glue infers them, every refusal naming the file, the line and the
declaration that would work, and a saved run's task held against its file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.arguments import config_for
from tasks.data.readers import DataFileMissing
from tasks.task import KINDS, PAIR_BINARY
from tasks.task_file import check_unchanged, inferred_note, read_task_file
from tests.helpers import three_class_task, user_task


def sentences(labels: list) -> list[list]:
    return [[f"the film {i}", y] for i, y in enumerate(labels)]


def declare(tmp_path: Path, labels: list, dev: list | None = None, **spec) -> Path:
    """A sentence task whose training labels are ``labels`` (dev: ``dev``, default the same)."""
    rows = {"train": sentences(labels), "dev": sentences(dev if dev is not None else labels)}
    return user_task(tmp_path, {"name": "mine", "text": "text", "label": "y", **spec}, rows, ["text", "y"])


@pytest.mark.parametrize("labels, kind, classes", [
    (["pos", "neg", "neutral", "neg"], "sentence-classification", ("neg", "neutral", "pos")),  # words, sorted
    ([1, 2, 5, 2, 1], "sentence-classification", ("1", "2", "5")),  # sparse ids: three classes, not six
    ([-1, 0, 1, 1], "sentence-classification", ("-1", "0", "1")),  # negative ids
    (list(range(1, 11)) * 2, "sentence-classification", tuple(str(k) for k in range(1, 11))),  # 1-10: ten classes
    (["1.0", "2.0", "2"], "sentence-classification", ("1", "2")),  # whole numbers written as floats
])
def test_classes_are_the_distinct_labels_sorted(tmp_path, labels, kind, classes):
    """Whole numbers or words make a classification whose classes are the distinct training labels, sorted (numbers
    by value), as run_glue's label_list; predictions come back in them (``label_name``)."""
    task = read_task_file(declare(tmp_path, labels))
    assert task.kind is KINDS[kind] and task.classes == classes
    examples, _ = task.read("dev", ".")
    assert [task.label_name(e.label) for e in examples] == [str(y).removesuffix(".0") for y in labels]
    assert "classes inferred from its training labels" in inferred_note(task)


def test_fractional_labels_make_a_regression_on_their_own_scale(tmp_path):
    """Numbers that are not all whole make a regression (a sentence one: one text column) whose head's range is
    the training labels' [min, max]; a dev label outside it is taken as it is (the range was not declared)."""
    task = read_task_file(declare(tmp_path, [1.5, 3, 9.5, 4], dev=[0.5, 3]))
    assert task.kind is KINDS["sentence-regression"] and task.score_range == (1.5, 9.5) and not task.checks_range
    assert [e.label for e in task.read("dev", ".")[0]] == [0.5, 3.0]
    assert task.metrics == ("r", "spearman")


def test_a_pair_task_of_two_classes_is_scored_by_one_logit_and_of_three_by_softmax(tmp_path):
    """Two text columns: a pair task; two classes keep Quora's one-logit head, three a softmax over three."""
    rows = {s: [[f"a {i}", f"b {i}", ["no", "yes", "maybe"][i % n]] for i in range(9)]
            for s, n in (("train", 2), ("dev", 2))}
    two = read_task_file(user_task(tmp_path / "two", {"name": "two", "text": ["a", "b"], "label": "y"}, rows,
                                   ["a", "b", "y"]))
    assert two.kind is PAIR_BINARY and two.classes == ("no", "yes") and two.metrics == ("acc", "f1", "mcc")
    rows = {s: [[f"a {i}", f"b {i}", ["no", "yes", "maybe"][i % 3]] for i in range(9)] for s in ("train", "dev")}
    three = read_task_file(user_task(tmp_path / "three", {"name": "three", "text": ["a", "b"], "label": "y"}, rows,
                                     ["a", "b", "y"]))
    assert three.kind is KINDS["pair-classification"] and not three.kind.binary and three.num_classes == 3


def test_declarations_override_the_inference(tmp_path):
    """``kind``, ``classes``, ``num_classes``, ``range`` and ``metric`` say what the labels would not: ratings
    read as a score, classes the training file lacks, a scale wider than the labels (then enforced)."""
    scores = read_task_file(declare(tmp_path / "a", [1, 5, 3], kind="sentence-regression", range=[0, 10]))
    assert scores.score_range == (0, 10) and scores.checks_range and scores.kind.name == "sentence-regression"
    assert read_task_file(declare(tmp_path / "b", ["a", "b"], dev=["a", "c"], classes=["a", "b", "c"])).classes == \
        ("a", "b", "c")
    assert read_task_file(declare(tmp_path / "c", [0, 1], num_classes=4)).classes == ("0", "1", "2", "3")
    assert read_task_file(declare(tmp_path / "d", [0, 1, 1], metric=["f1", "accuracy"])).metrics == ("f1", "acc")


@pytest.mark.parametrize("spec, message", [
    ({"name": 7}, "'name' 7: up to 40 letters"),
    ({"name": "x" * 300}, "'name' \"xxxx"),
    ({"name": "my task"}, "'name' \"my task\""),
    ({"text": {"a": 1}}, "'text' is one column (a sentence task) or a list of two"),
    ({"text": ["a", "b", "c"]}, "'text' is one column"),
    ({"num_classes": "3"}, "'num_classes' is a whole number of classes, 2 or more"),
    ({"num_classes": 3.5}, "'num_classes' is a whole number"),
    ({"num_classes": True}, "'num_classes' is a whole number"),
    ({"delimiter": ";;"}, "'delimiter' is one character"),
    ({"kind": "regression"}, "'kind' \"regression\"; kinds are sentence-classification, pair-classification, "
                             "sentence-regression, pair-regression"),
    ({"classes": ["a", "a"]}, "'classes' names a class twice"),
    ({"classes": ["a"], "num_classes": 2}, "'classes' is a list of the labels, two or more"),
    ({"classes": ["a", "b"], "num_classes": 2}, "give 'classes' (the labels) or 'num_classes'"),
    ({"range": [5, 1]}, "'range' is [low, high]"),
    ({"kind": "sentence-regression", "classes": ["a", "b"]}, "a sentence-regression task has no classes"),
    ({"metric": "auc"}, "'metric' \"auc\": metrics are acc, f1, macro_f1, mcc, r, spearman"),
    ({"quoting": "no"}, "'quoting' is true or false"),
    ({"test": {"path": "x.csv"}}, "'test' is a file name, or an object with its \"file\""),
    ({"colour": "red"}, "unknown key(s) ['colour']"),
    ({"symmetric": "yes"}, "'symmetric' is true (its pairs have no order"),
    ({"symmetric": True}, "'symmetric' is a pair task's (two text columns): drop it"),
])
def test_every_value_is_checked_before_any_data_is_read(tmp_path, spec, message):
    """A wrong type or value in a task file is one ValueError naming the key and what it may be, raised before a
    data file is opened (these name files that do not exist)."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"name": "mine", "train": "no.csv", "dev": "no.csv", "text": "text", "label": "y",
                                **spec}))
    with pytest.raises(ValueError, match=f"task file {path}: .*" + message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        read_task_file(path)


def test_a_metric_the_kind_cannot_give_is_refused(tmp_path):
    with pytest.raises(ValueError, match="a sentence-classification task of 3 classes is not scored by 'f1'; its "
                                         "metrics are acc, macro_f1, mcc"):
        read_task_file(declare(tmp_path, [0, 1, 2], metric="f1"))


@pytest.mark.parametrize("labels, line, message", [
    ([0, 1, 2, 3, 4, 20000, 1], 7, "label 20000 is far outside the others \\(0 to 4\\): a typo\\? .*\"classes\""),
    ([1, 2, "x", 3, 1, 2], 4, "label 'x' is not a number, while most labels are; .*\"classes\""),
    ([1.5, 2, "nan", 3], 4, "label 'nan' is not a finite number"),
    ([1.5, 2, "inf", 3], 4, "label 'inf' is not a finite number"),
])
def test_labels_that_look_like_typos_are_refused_naming_their_line(tmp_path, labels, line, message):
    """A label far outside the others (one typed 20000 would make 20001 classes of logits), a word in a column of
    numbers, NaN or infinity: refused naming the training file, the line and the declaration that would work."""
    path = declare(tmp_path, labels)
    with pytest.raises(ValueError, match=f"mine-train.csv: line {line}: {message}"):
        read_task_file(path)


def test_one_label_or_too_many_are_refused_saying_why(tmp_path):
    with pytest.raises(ValueError, match="every label in column \"y\" is '0': a classification needs two classes"):
        read_task_file(declare(tmp_path / "a", [0, 0, 0]))
    with pytest.raises(ValueError, match="150 distinct labels would make 150 classes; if they are scores, declare "
                                         "\"kind\": \"sentence-regression\""):
        read_task_file(declare(tmp_path / "b", list(range(150))))
    with pytest.raises(ValueError, match="label '2.5' is not a whole number, and task 'mine' is a classification; .*"
                                         "\"kind\": \"sentence-regression\""):
        read_task_file(declare(tmp_path / "c", [1, 2.5, 3], kind="sentence-classification"))


def test_a_dev_label_the_task_cannot_take_is_refused_naming_its_line(tmp_path):
    """Classes come from the training labels; a dev label outside them is refused naming the dev file's line and
    the declaration that keeps it (every class, ``classes``)."""
    with pytest.raises(ValueError, match=r"mine-dev.csv: line 3: label 'c' is not one of the classes a, b for task "
                                         r"'mine' \(sentence-classification, 2 classes\) \(a class the training "
                                         r"file lacks: declare every class"):
        read_task_file(declare(tmp_path, ["a", "b"], dev=["a", "c"]))


def test_files_as_they_come(tmp_path):
    """Each file's delimiter from its own first line (a comma train file, a tab dev file), a BOM, a tab-separated
    file whose quotes do not pair up read as plain text (MRPC's lone \"), an id column taken where a file has one."""
    folder = tmp_path / "t"
    user_task(folder, {"name": "mine", "text": "s", "label": "y"}, {"train": [["a", 0], ["b", 1]]}, ["s", "y"])
    (folder / "mine-dev.tsv").write_bytes('\ufeffid\ts\ty\n7\the said " no\t1\n8\tyes "\t0\n'.encode())
    spec = json.loads((folder / "mine.json").read_text())
    (folder / "mine.json").write_text(json.dumps({**spec, "dev": "mine-dev.tsv"}))
    task = read_task_file(folder / "mine.json")
    examples, report = task.read("dev", ".")
    assert [(e.id, e.text_a, e.label) for e in examples] == [("7", 'he said " no', 1), ("8", 'yes "', 0)]
    assert report.clean and task.layout.id is None and task.layout_of("dev").id == "id"


def test_messages_about_a_users_files_name_the_task_file_not_the_course(tmp_path):
    """A missing file, an empty one and a mistyped column are named with the task file that names them; none sends
    the user to the CS224N data or setup.sh."""
    path = three_class_task(tmp_path)
    (tmp_path / "topic-dev.csv").unlink()
    with pytest.raises(DataFileMissing) as missing:
        read_task_file(path)
    assert f"task file {path}" in str(missing.value) and "CS224N" not in str(missing.value)
    (tmp_path / "topic-dev.csv").write_text("")
    with pytest.raises(ValueError, match=f"the file is empty; put the task's rows there \\(task file {path} names "
                                         "it\\)") as empty:
        read_task_file(path)
    assert "setup.sh" not in str(empty.value)
    (tmp_path / "topic-dev.csv").write_text((tmp_path / "topic-train.csv").read_text())
    path.write_text(json.dumps({**json.loads(path.read_text()), "text": "txt"}))
    with pytest.raises(ValueError, match=r"line 1: the header has no column 'txt' .*; task file .* names it as the "
                                         r"text column") as col:
        read_task_file(path)
    assert "CS224N" not in str(col.value)


def test_two_files_declaring_one_task_name_are_refused(tmp_path):
    a, b = three_class_task(tmp_path / "a"), three_class_task(tmp_path / "b")
    with pytest.raises(ValueError, match="two --task-file files declare task 'topic'"):
        config_for(["--task-file", str(a), "--task-file", str(b), "--tasks", "sst"])


def test_a_saved_task_is_held_against_its_file(tmp_path):
    """check_unchanged: the file as it was gives the saved task back; a changed key is named, its value then and
    now; a file that is gone leaves the saved task; a file moved elsewhere (``given``) moves the task's files."""
    path = three_class_task(tmp_path / "t")
    saved = read_task_file(path)
    assert check_unchanged(saved) is saved
    spec = json.loads(path.read_text())
    path.write_text(json.dumps({**spec, "text": "other", "kind": "sentence-regression"}))
    with pytest.raises(ValueError, match="changed since the run was trained \\('kind' was null, is "
                                         "\"sentence-regression\"; 'text' was \"text\", is \"other\"\\)"):
        check_unchanged(saved)
    moved = (tmp_path / "t").rename(tmp_path / "moved")
    assert check_unchanged(saved) is saved
    (moved / "topic.json").write_text(json.dumps(spec))
    here = check_unchanged(saved, moved / "topic.json")
    assert here == saved and here.files["train"] == str(moved / "topic-train.csv")
