"""Tests of tasks/task_file.py: a user's task file checked value by value before any data is read, its kind and
classes inferred from its labels as run_glue infers them, every refusal naming the file, the line and the
declaration that would work, and a saved run's task held against its file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tasks.arguments import config_for
from tasks.data.readers import COURSE_FORMAT, DataFileMissing
import torch

from tasks.evaluation.metrics import selected_metrics
from tasks.predictions import Predictions, read_predictions, write_predictions
from tasks.task import (COURSE_DIR, KINDS, PAIR_BINARY, TASK_FILE_KEYS, from_declaration, get_task,
                        Tasks)
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
    the training labels' [min, max] (a dev label outside it: test_a_dev_or_test_label_outside_an_inferred_range_...)."""
    task = read_task_file(declare(tmp_path, [1.5, 3, 9.5, 4], dev=[1.5, 3]))
    assert task.kind is KINDS["sentence-regression"] and task.score_range == (1.5, 9.5) and not task.checks_range
    assert [e.label for e in task.read("dev", ".")[0]] == [1.5, 3.0]
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
    ({"title": ""}, "'title' is the task's name in tables"),
    ({"multiline": "no"}, "'multiline' is true or false"),
    ({"dev": {"file": "no.csv", "line_ends": 1}}, "dev's 'line_ends' is true or false"),
    ({"overall": "yes"}, "'overall' is true (its main metric counts in the default overall score"),
    ({"output": "Predicted_Mine"}, "'output' is how its prediction files read: an object with its \"column\""),
    ({"output": {"column": "y", "part1": "always"}}, "'output' is how its prediction files read"),
    ({"output": {"column": "y", "zip": True}}, "'output' is how its prediction files read"),
    ({"triplets": 3}, "'triplets' is a file of NLI triplets"),
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


# ---- the positive class, labels alike but for case, rare labels, many classes, ranges, headers ----------------------


def pairs(labels: list) -> list[list]:
    return [[f"a {i}", f"b {i}", y] for i, y in enumerate(labels)]


def declare_pair(tmp_path: Path, labels: list, dev: list | None = None, **spec) -> Path:
    rows = {"train": pairs(labels), "dev": pairs(dev if dev is not None else labels)}
    return user_task(tmp_path, {"name": "dup", "text": ["a", "b"], "label": "y", **spec}, rows, ["a", "b", "y"])


def test_positive_names_the_class_f1_is_scored_on(tmp_path):
    """"positive" names one of a two-class task's labels, matched as labels are (1.0 for 1); without it F1 is the
    second class's, and the run's log line (``describe``, ``inferred_note``) says which class F1 is on."""
    words = ["duplicate", "not_duplicate"] * 3
    task = read_task_file(declare_pair(tmp_path / "a", words, positive="duplicate"))
    assert task.positive_class == 0 and task.positive == "duplicate"
    assert "F1 of 'duplicate'" in task.describe() and "positive" not in inferred_note(task)
    plain = read_task_file(declare_pair(tmp_path / "b", words))
    assert plain.positive_class == 1 and "F1 of 'not_duplicate'" in plain.describe()
    assert "F1 is on the second class, 'not_duplicate' (\"positive\" names another)" in inferred_note(plain)
    numbers = read_task_file(declare_pair(tmp_path / "c", [0, 1, 1], positive="0.0"))
    assert numbers.positive_class == 0 and numbers.positive == "0"
    assert read_task_file(declare_pair(tmp_path / "d", [0, 1, 1], positive=1)).positive_class == 1


@pytest.mark.parametrize("labels, positive, message", [
    (["duplicate", "not_duplicate"], "paraphrase", "'positive' \"paraphrase\" names no class; the classes are "
                                                   "duplicate, not_duplicate"),
    (["a", "b", "c"], "a", "'positive' is a two-class task's \\(the class F1 is scored on\\), and it has 3 "
                           "classes: a, b, c"),
    ([1.5, 2.5, 3.5], "1.5", "'positive' is a two-class task's"),
])
def test_a_positive_that_names_no_class_of_a_two_class_task_is_refused(tmp_path, labels, positive, message):
    """"positive" naming no class, or on a task of more than two classes (or a regression), is one line naming
    the task file and the classes."""
    with pytest.raises(ValueError, match=f"task file .*dup.json: .*{message}") as refused:
        read_task_file(declare_pair(tmp_path, labels * 2, positive=positive))
    assert "\n" not in str(refused.value)


def test_labels_alike_but_for_case_are_refused_unless_the_file_says_how_to_read_them(tmp_path):
    """"Neutral", " NEUTRAL" and "neutral" beside two other labels are not five classes: refused in one line naming
    both spellings and a line of each; "label_case": "fold" reads them as one class (spelt as most rows spell it),
    a dev label in another case too; "exact" keeps them apart."""
    labels = ["positive", "neutral", "negative", "Neutral", "neutral", " NEUTRAL", "positive", "negative"]
    with pytest.raises(ValueError, match=r"mine-train.csv: line 5: label 'Neutral' and 'neutral' \(line 3\) differ "
                                         r"only in case: declare \"label_case\": \"fold\" .* or \"exact\"") as e:
        read_task_file(declare(tmp_path / "a", labels))
    assert "\n" not in str(e.value)
    folded = read_task_file(declare(tmp_path / "b", labels, dev=["NEUTRAL", "Positive", "negative"],
                                    label_case="fold"))
    assert folded.classes == ("negative", "neutral", "positive")
    assert [folded.label_name(e.label) for e in folded.read("dev", ".")[0]] == ["neutral", "positive", "negative"]
    exact = read_task_file(declare(tmp_path / "c", labels, label_case="exact"))
    assert exact.classes == ("NEUTRAL", "Neutral", "negative", "neutral", "positive")
    with pytest.raises(ValueError, match="'label_case' is \"fold\" .* or \"exact\""):
        read_task_file(declare(tmp_path / "d", labels, label_case="lower"))
    with pytest.raises(ValueError, match="'classes' names \" a\" with space around it"):
        read_task_file(declare(tmp_path / "e", ["a", "b"], classes=[" a", "b"]))


def test_a_label_on_a_few_training_rows_and_no_dev_row_is_a_warning_naming_it(tmp_path, caplog):
    """An inferred class with fewer than RARE_LABEL training rows and none on dev (a typo, "neutrl") is a warning
    naming the label, its count and its lines; declared classes are not warned about."""
    labels = ["good", "bad"] * 6 + ["neutrl"]
    with caplog.at_level("WARNING", logger="tasks.task_file"):
        read_task_file(declare(tmp_path / "a", labels, dev=["good", "bad"]))
    assert "label 'neutrl' is on 1 training row (" in caplog.text and "mine-train.csv:14" in caplog.text
    assert "and on no dev row" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tasks.task_file"):
        read_task_file(declare(tmp_path / "b", labels, dev=["good", "bad"], classes=["bad", "good", "neutrl"]))
        read_task_file(declare(tmp_path / "c", labels, dev=["good", "bad", "neutrl"]))
    assert "neutrl" not in caplog.text


def test_many_word_labels_are_refused_and_messages_list_a_few_classes(tmp_path):
    """300 distinct words are refused as 300 whole numbers are (MAX_CLASSES), saying what to declare; a dev label
    unknown to 300 declared classes is one short line that lists ten of them."""
    words = [f"w{k:03d}" for k in range(300)]
    with pytest.raises(ValueError, match="300 distinct labels would make 300 classes .*declare them \\(\"classes\""):
        read_task_file(declare(tmp_path / "a", words))
    with pytest.raises(ValueError, match=r"label 'zzz' is not one of the classes w000, w001, .*, w009 \.\.\. and "
                                         r"290 more") as e:
        read_task_file(declare(tmp_path / "b", words, dev=["zzz"], classes=words))
    assert len(str(e.value)) < 600


def test_a_dev_or_test_label_outside_an_inferred_range_is_refused(tmp_path):
    """A regression's range inferred from the training labels: a dev label outside it (the head cannot reach it) is
    refused naming the file, the line, the value and the range, and that declaring "range" accepts it; a labelled
    test file too; a declared range wins."""
    with pytest.raises(ValueError, match=r"mine-dev.csv: line 2: label 0.5 is outside \[1.5, 9.5\], the range of "
                                         r"the training labels, .*declare the scale "
                                         r"\(\"range\": \[low, high\]\) in task file .*mine.json to accept it") as e:
        read_task_file(declare(tmp_path / "a", [1.5, 3, 9.5, 4], dev=[0.5, 3]))
    assert "\n" not in str(e.value)
    path = declare(tmp_path / "b", [1.5, 3, 9.5, 4], dev=[2.5, 3])
    (path.parent / "mine-test.csv").write_text("text,y\na,3\nb,12\n")
    path.write_text(json.dumps({**json.loads(path.read_text()), "test": "mine-test.csv"}))
    with pytest.raises(ValueError, match=r"mine-test.csv: line 3: label 12 is outside \[1.5, 9.5\]"):
        read_task_file(path)
    assert read_task_file(declare(tmp_path / "c", [1.5, 3, 9.5, 4], dev=[0.5, 3], range=[0, 10])).checks_range


def test_columns_by_position_keep_the_header_unless_the_file_says_there_is_none(tmp_path):
    """Positions name columns in a file with a header as in one without: the header stays a header (its "label" no
    class), "header": false reads the first line as a row; a first line that reads as a row where the file says
    nothing of a header is refused, naming both declarations."""
    folder = tmp_path / "a"
    with_header = user_task(folder, {"name": "mine", "text": 0, "label": 1}, {"train": [["x", "a"], ["y", "b"]] * 2,
                                                                              "dev": [["z", "a"]]}, ["text", "y"])
    task = read_task_file(with_header)
    assert task.classes == ("a", "b") and task.layout.fmt.header
    assert [e.text_a for e in task.read("dev", ".")[0]] == ["z"]
    rows = {"train": [["x", "a"], ["y", "b"]] * 2, "dev": [["z", "a"], ["w", "b"]]}
    bare = read_task_file(user_task(tmp_path / "b", {"name": "mine", "text": 0, "label": 1, "header": False}, rows,
                                    None))
    assert [e.text_a for e in bare.read("dev", ".")[0]] == ["z", "w"]
    with pytest.raises(ValueError, match=r"mine-train.csv: line 1: .*'a' is one of its classes.* \"header\": false"
                                         r" .* \"header\": true"):
        read_task_file(user_task(tmp_path / "c", {"name": "mine", "text": 0, "label": 1}, rows, None))


def test_how_its_predictions_read_is_declared_as_the_course_tasks_are(tmp_path):
    """A user's file declares what the course's task files do (tasks/cs224n/): a title for tables, its files'
    column in the CS224N starter's bytes, and a place in the default overall score."""
    task = read_task_file(declare(tmp_path, ["pos", "neg"] * 4, title="Mood", overall=True,
                                  output={"column": "Predicted_Mood", "starter": True}))
    assert task.table_title == "Mood acc" and task.overall
    assert (task.output.column, task.output.starter, task.output.submission) == ("Predicted_Mood", True, False)
    entries = Tasks([task])
    preds = Predictions(["a", "b"], torch.zeros(2, 2), torch.tensor([1, 0]))
    path = write_predictions(tmp_path / "p", task, "dev", preds)
    assert path.read_text() == "id \t Predicted_Mood \na , 1 \nb , 0 \n"  # class ids, as the starter writes
    assert read_predictions(path, tasks=entries)[1].tolist() == [1, 0]  # known by its column
    assert selected_metrics({"sst_acc": 0.5, "mine_acc": 0.7, "cola_mcc": 0.1}, tasks=entries) == ["sst_acc",
                                                                                                  "mine_acc"]
    plain = read_task_file(declare(tmp_path / "plain", ["pos", "neg"] * 4))
    assert (plain.output.column, plain.output.starter, plain.title, plain.overall) == ("label", False, "", False)
    assert (plain.layout.fmt.line_ends, plain.layout.fmt.multiline) == (False, True)  # and the course's, declared:
    strict = read_task_file(declare(tmp_path / "strict", ["pos", "neg"] * 4, line_ends=True, multiline=False,
                                    quoting=True))
    assert strict.layout.fmt == dataclasses.replace(COURSE_FORMAT, delimiter=None)  # the course's files': a tab


def test_the_course_tasks_are_declared_by_the_packages_task_files():
    """SST, Quora, STS and CFIMDB are the entries their files in tasks/cs224n/ declare, read as GLUE's are."""
    for name in ("sst", "para", "sts", "cfimdb"):
        spec = json.loads((COURSE_DIR / f"{name}.json").read_text())
        assert from_declaration(spec) == get_task(name) and spec["name"] == name
    assert set().union(*(json.loads(p.read_text()) for p in COURSE_DIR.glob("*.json"))) <= set(TASK_FILE_KEYS)


def test_a_task_file_moved_with_its_phrases_and_triplets_takes_them_where_it_is_now(tmp_path):
    """--task-file on --resume or --eval-only tells where a run's task file is now: its splits', its phrases' and its
    NLI triplets' files are taken beside it, and the run resumes as the same run (where files are is not what it
    does); a sentence regression declares no triplets (they train the embeddings whose cosine a pair scores)."""
    import shutil

    from tasks.train_config import TrainConfig, check_resume_config

    rows = {s: [[f"a film {i}", f"the film {i % 3}", i % 6] for i in range(12)] for s in ("train", "dev")}
    task_file = user_task(tmp_path / "t", {"name": "relate", "text": ["a", "b"], "label": "score", "range": [0, 5],
                                           "phrases": "relate-phrases.csv", "triplets": "relate-nli.csv"},
                          rows, ["a", "b", "score"])
    (task_file.parent / "relate-phrases.csv").write_text("a,b,score\nx,y,1\n")
    (task_file.parent / "relate-nli.csv").write_text("sent0,sent1,hard_neg\nx,y,z\n")
    saved = read_task_file(task_file)
    moved = shutil.copytree(task_file.parent, tmp_path / "moved")
    shutil.rmtree(task_file.parent)
    now = check_unchanged(saved, moved / "relate.json")
    assert (now.files["train"], now.stream.file, now.triplets) == tuple(
        str(moved / f"relate-{x}.csv") for x in ("train", "phrases", "nli"))
    check_resume_config(TrainConfig(tasks=("sts", "relate"), user_tasks=[saved]),
                        TrainConfig(tasks=("sts", "relate"), user_tasks=[now]))
    (moved / "s.json").write_text(json.dumps({"name": "s", "train": "relate-train.csv", "dev": "relate-dev.csv",
                                              "text": "a", "label": "score", "kind": "sentence-regression",
                                              "triplets": "relate-nli.csv"}))
    with pytest.raises(ValueError, match="NLI triplets train the sentence embeddings whose cosine a pair regression "
                                         "scores, and the task is a sentence-regression"):
        read_task_file(moved / "s.json")
