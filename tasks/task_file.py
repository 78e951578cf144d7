"""A user's task from a JSON file: every value checked before any data is read, what the file leaves out inferred
from its labels nearly as HF's ``run_glue.py`` infers it (whole-valued floats aside: ``kind`` below), and a run's
task checked against its file again later.

A task file (README "Adding a task"; the GLUE ones of tasks/glue/ are examples) names the task, its files and
columns; the rest is inferred from the training file's labels unless declared:

    {"name": "entail", "train": "entail-train.tsv", "dev": "entail-dev.tsv", "text": ["premise", "hypothesis"],
     "label": "label"}

- ``kind``: numbers that are not all whole make a regression (on the labels' own scale, ``range`` [min, max]);
  whole numbers or words make a classification whose ``classes`` are the distinct labels, sorted (numbers by
  value: 1, 2, 5, 10): labels 1-10 are ten classes, not eleven. One text column is a sentence task, two a pair.
  ``run_glue.py`` differs on whole-valued floats: it makes a regression of any label column its loader types as
  floats, so 1.0, 2.0, 3.0 are a score there and three classes here (where 1.0 and 1 are one); declaring ``kind``
  settles it.
  A label is read without the space around it.
- a refusal names the file, the line and the declaration that would work: a label that is no class of a
  classification, a column of numbers with a stray word in it, a label far outside the others (a typo, not a
  class), more classes than a classification plausibly has (MAX_CLASSES, words or numbers), two labels alike but
  for their case ("Neutral", "neutral"), a dev (or labelled test) label outside an inferred ``range`` (the head
  cannot reach it). A class on fewer than RARE_LABEL training rows and no dev row is a warning (a typo?).
- ``label_case``: "fold" reads labels alike but for their case as one class, spelt as most training rows spell
  it (ties: the first); "exact" keeps them apart; without it such labels are refused.
- ``positive``: the label of the class a two-class task's F1 is scored on (matched as labels are: 1.0 for 1),
  and whose probability a one-logit task's predictions give (``p_<label>``); default: the second class.
- ``id``: the ids of a file's rows, default ``id`` where the file's header has that column, else the rows' file
  lines; files are relative to the task file's folder, tab- or comma-separated by their first line, with a
  header whether columns are named or 0-based positions, unless ``"header": false``; a quoted field may span
  lines, as CSV's standard allows, unless ``"multiline": false`` (a record over lines is then an unbalanced
  quote); ``"line_ends": true`` cuts a last record without a line end (a file cut short), as the course's files
  are read.
- what SST has any task may declare: ``phrases``, a file of extra labelled examples (the train file's layout)
  trained through its head as a stream of its own, ``<name>_phrases`` (or an object with its ``file``,
  ``min_words``, ``order``, ``per_epoch`` and ``batch_size``); ``prior``, a second opinion at evaluation (its
  weight, or an object with its ``weight`` and ``model``): a probe for a sentence classification, the cosine for a
  pair regression. What STS has a pair regression may declare: ``triplets``, a file of NLI triplets (as
  data/nli-train.csv) that ``--nli`` trains its sentence embeddings on (a model's own task's before STS's).
- how its predictions read: ``title``, its name in tables; ``output``, its files' column and format (an object:
  ``column``; as the CS224N starter's files: ``starter``, ``also_read``, ``submission``, ``part1``; tasks.task.Output);
  default: a plain CSV of each id and its label (``label``) or score (``score``). ``overall``: true, its main metric
  counts in the default overall score that selects the best epoch, as the course's tasks' do.
  The course's own tasks are declared so (tasks/cs224n/), with these keys alone (and, in SST's ``phrases``, the
  stream's own ``name``).
- ``symmetric``: true for a pair task whose pairs have no order (paraphrase, similarity), scored as the mean of
  both orders (``--symmetric-eval``, as Quora and STS); by default a pair is scored in its files' order, the one
  it trained in (entailment: premise, then hypothesis).

Usage:
    task = read_task_file("entail.json")              # the Task (tasks/task.py): a run's own (TrainConfig.entries)
    task = check_unchanged(saved, given=None)          # --resume / --eval-only: a ValueError naming what changed
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tasks.data.readers import DataFileMissing, FileFormat, decode_utf8, read_labels, sniff_delimiter
from tasks.task import (KINDS, LABEL_CASES, LAYOUT_KEYS, NAME_LENGTH, OUTPUT_KEYS, PART1, PRIOR_KINDS, SPLITS, STREAMS,
                        TASK_FILE_KEYS, Kind, Task, canonical_number, from_declaration, layout_from)

logger = logging.getLogger(__name__)

# A metric's other spellings a task file may use (tasks/evaluation/metrics.py names each by the first).
METRIC_NAMES = {"acc": ("accuracy",), "f1": (), "macro_f1": ("macro-f1", "f1_macro"), "mcc": ("matthews",),
                "r": ("pearson", "pearson_r"), "spearman": ("spearman_r",)}
MAX_CLASSES = 100  # inferred from whole numbers or words: more is most likely a score, free text, or a column of ids
OUTLIER_GAP = 10  # a label further from the others than this many times their span is most likely a typo
# An inferred class on fewer training rows than this, and on no dev row, is most likely a typo ("neutrl"): a class
# the model can barely learn and the dev set never scores. Two rows may be a typo made twice; three is a pattern.
RARE_LABEL = 3


def _fail(where: str, message: str) -> ValueError:
    return ValueError(f"{where}: {message}")


# ---- checking a declaration ------------------------------------------------------------------------------------


def _column(value: Any) -> bool:
    return (isinstance(value, str) and value != "") or (isinstance(value, int) and not isinstance(value, bool)
                                                        and value >= 0)


COLUMN = "a column's header name (a string) or its 0-based position in a file without a header (a number)"


def _check_layout(where: str, spec: Mapping[str, Any], own: str = "") -> None:
    """The LAYOUT_KEYS of ``spec`` (a task file, or one split's object: ``own`` names it)."""
    at = f"{own}'s " if own else ""
    if "text" in spec:
        text = spec["text"]
        columns = [text] if not isinstance(text, list) else text
        if not 1 <= len(columns) <= 2 or not all(_column(c) for c in columns):
            raise _fail(where, f"{at}'text' is one column (a sentence task) or a list of two (a pair task), each "
                               f"{COLUMN}; got {json.dumps(text)}")
    for key in ("label", "id"):
        if key in spec and not (_column(spec[key]) or (key == "id" and spec[key] is None)):
            raise _fail(where, f"{at}{key!r} is {COLUMN}" + (", or null (ids are the rows' file lines)"
                                                            if key == "id" else "") + f"; got {json.dumps(spec[key])}")
    if "delimiter" in spec:
        try:
            FileFormat(spec["delimiter"])
        except (ValueError, TypeError):
            raise _fail(where, f"{at}'delimiter' is one character, \"\\t\" or \",\" say; got "
                               f"{json.dumps(spec['delimiter'])}") from None
    for key in ("quoting", "header", "line_ends", "multiline"):
        if key in spec and not isinstance(spec[key], bool):
            raise _fail(where, f"{at}{key!r} is true or false; got {json.dumps(spec[key])}")


def _metric(where: str, name: Any) -> str:
    for canonical, others in METRIC_NAMES.items():
        if name == canonical or name in others:
            return canonical
    raise _fail(where, f"'metric' {json.dumps(name)}: metrics are {', '.join(METRIC_NAMES)}")


def check_declaration(spec: Any, where: str) -> dict[str, Any]:
    """A task file's JSON checked value by value, before any data is read: a ValueError naming the key; returns
    it with its metrics spelt as tasks/evaluation/metrics.py names them."""
    if not isinstance(spec, dict):
        raise _fail(where, f"a task file is a JSON object with keys {', '.join(TASK_FILE_KEYS)}")
    unknown = sorted(set(spec) - set(TASK_FILE_KEYS))
    if unknown:
        raise _fail(where, f"unknown key(s) {unknown}; a task file has {', '.join(TASK_FILE_KEYS)}")
    for key in ("name", "train", "dev", "text", "label"):
        if key not in spec:
            raise _fail(where, f"no {key!r}; a task file names its name, train and dev files, text column(s) and "
                               "label column (README 'Adding a task')")
    name = spec["name"]
    if not isinstance(name, str) or not name.isidentifier() or len(name) > NAME_LENGTH or name in STREAMS:
        raise _fail(where, f"'name' {json.dumps(name)}: up to {NAME_LENGTH} letters, digits and _, not starting with "
                           f"a digit (it names the task's flags and files; not {' or '.join(STREAMS)})")
    _check_layout(where, spec)
    for split in SPLITS:
        value = spec.get(split)
        if value is None:
            continue
        if isinstance(value, dict):
            bad = sorted(set(value) - {"file", *LAYOUT_KEYS})
            if "file" not in value or bad:
                raise _fail(where, f"{split!r} is a file name, or an object with its \"file\" and where that file "
                                   f"differs, of {', '.join(LAYOUT_KEYS)}; got {json.dumps(value)}")
            _check_layout(where, value, split)
            value = value["file"]
        if not isinstance(value, str) or not value:
            raise _fail(where, f"{split!r} is a file name (relative to the task file's folder); got {json.dumps(value)}")
        own = spec[split] if isinstance(spec[split], dict) else {}
        merged = {**spec, **own}
        if merged.get("header") is False:
            names = [f"{key} {json.dumps(c)}" for key in ("text", "label", "id")
                     for c in (merged[key] if isinstance(merged.get(key), list) else [merged.get(key)])
                     if isinstance(c, str)]
            if names:
                raise _fail(where, f"{split!r}: a file without a header (\"header\": false) names its columns by "
                                   f"0-based position, and its {names[0]} is a name" + (
                                       "" if "header" in own else f"; give {split!r} \"header\": true of its own"))
    if "kind" in spec and spec["kind"] not in KINDS:
        raise _fail(where, f"'kind' {json.dumps(spec['kind'])}; kinds are {', '.join(KINDS)}")
    if "num_classes" in spec:
        n = spec["num_classes"]
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= 10_000:
            raise _fail(where, f"'num_classes' is a whole number of classes, 2 or more (classes 0 .. n-1); got "
                               f"{json.dumps(n)}")
    if "classes" in spec:
        c = spec["classes"]
        if not isinstance(c, list) or len(c) < 2 or not all(isinstance(x, str) or (isinstance(x, int) and not
                                                                                     isinstance(x, bool)) for x in c):
            raise _fail(where, f"'classes' is a list of the labels, two or more, as the files write them (class 0 "
                               f"first); got {json.dumps(c)}")
        names = [str(x) for x in c]
        if len(set(names)) != len(names):
            raise _fail(where, f"'classes' names a class twice: {json.dumps(c)}")
        spaced = next((x for x in names if x != x.strip() or not x), None)
        if spaced is not None:
            raise _fail(where, f"'classes' names {json.dumps(spaced)} with space around it (or none at all); a "
                               f"label is read without the space around it: write {json.dumps(spaced.strip())}")
        spec = {**spec, "classes": names}
    if "classes" in spec and "num_classes" in spec:
        raise _fail(where, "give 'classes' (the labels) or 'num_classes' (classes 0 .. n-1), not both")
    if "range" in spec:
        r = spec["range"]
        if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                            and math.isfinite(x) for x in r) and r[0] < r[1]):
            raise _fail(where, f"'range' is [low, high] of a regression's scores, low < high; got {json.dumps(r)}")
    kind = spec.get("kind")
    if kind is not None and (("classes" in spec or "num_classes" in spec) and not KINDS[kind].classification
                             or "range" in spec and KINDS[kind].classification):
        raise _fail(where, f"a {kind} task has " + ("no classes; drop 'classes' and 'num_classes'"
                                                    if not KINDS[kind].classification else "no range; drop 'range'"))
    if "range" in spec and ("classes" in spec or "num_classes" in spec):
        raise _fail(where, "'range' is a regression's, 'classes' and 'num_classes' a classification's: give one")
    if "metric" in spec:
        m = spec["metric"]
        names = [m] if isinstance(m, str) else m
        if not isinstance(names, list) or not names:
            raise _fail(where, f"'metric' is a metric or a list of them (the first selects); got {json.dumps(m)}")
        spec = {**spec, "metric": [_metric(where, x) for x in names]}
    if "phrases" in spec:
        value = spec["phrases"]
        own = value if isinstance(value, dict) else {"file": value}
        counts = [own.get(k, 1) for k in ("min_words", "per_epoch", "batch_size")]
        if not isinstance(own.get("file"), str) or set(own) - {"file", "min_words", "order", "per_epoch",
                                                                 "batch_size"} or \
                not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts) or \
                own.get("order", "mixed") not in ("mixed", "first"):
            raise _fail(where, "'phrases' is a file of extra labelled examples (its train file's layout), or an object "
                               "with its \"file\", \"min_words\" (1 or more), \"order\" (mixed or first), "
                               "\"per_epoch\" and \"batch_size\" (1 or more; default: all, in batches of "
                               f"--batch-size); got {json.dumps(value)}")
    if "triplets" in spec and not (isinstance(spec["triplets"], str) and spec["triplets"].strip()):
        raise _fail(where, "'triplets' is a file of NLI triplets (an anchor, an entailed and a contradicted sentence "
                           "a row, as data/nli-train.csv's sent0, sent1, hard_neg) that --nli trains the task's "
                           f"sentence embeddings on (a pair regression's, as STS's); got {json.dumps(spec['triplets'])}")
    if "prior" in spec:
        value = spec["prior"]
        own = value if isinstance(value, dict) else {"weight": value}
        weight, model = own.get("weight", 0.5), own.get("model")
        if set(own) - {"weight", "model"} or isinstance(weight, bool) or not isinstance(weight, (int, float)) \
                or not 0 <= weight <= 1 or not (model is None or isinstance(model, str)):
            raise _fail(where, "'prior' is its weight in [0, 1], or an object with its \"weight\" and \"model\" (a "
                               f"sentence encoder's directory); got {json.dumps(value)}")
    if "symmetric" in spec and not isinstance(spec["symmetric"], bool):
        raise _fail(where, f"'symmetric' is true (its pairs have no order: paraphrase, similarity) or false; got "
                           f"{json.dumps(spec['symmetric'])}")
    if spec.get("symmetric") and isinstance(spec.get("text"), (str, int)):
        raise _fail(where, "'symmetric' is a pair task's (two text columns): drop it")
    if "positive" in spec:
        value = spec["positive"]
        if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
            raise _fail(where, f"'positive' is the label of the class a two-class task's F1 is scored on (one of its "
                               f"labels as the files write them); got {json.dumps(value)}")
    if "title" in spec and not (isinstance(spec["title"], str) and spec["title"].strip()):
        raise _fail(where, f"'title' is the task's name in tables (\"Entail\"); got {json.dumps(spec['title'])}")
    if "overall" in spec and not isinstance(spec["overall"], bool):
        raise _fail(where, f"'overall' is true (its main metric counts in the default overall score, as the course's "
                           f"tasks' do) or false; got {json.dumps(spec['overall'])}")
    if "output" in spec:
        value = spec["output"]
        ok = (isinstance(value, dict) and isinstance(value.get("column"), str) and value["column"].strip()
              and not set(value) - set(OUTPUT_KEYS) and isinstance(value.get("also_read", ""), str)
              and all(isinstance(value.get(k, False), bool) for k in ("starter", "submission"))
              and value.get("part1", "") in PART1)
        if not ok:
            raise _fail(where, "'output' is how its prediction files read: an object with its \"column\" (their "
                               "header's name for the prediction) and, as the CS224N starter's files, \"starter\" "
                               "(true: its bytes, class ids), \"also_read\" (another spelling of the column), "
                               f"\"submission\" (true or false) and \"part1\" ({' or '.join(map(json.dumps, PART1))}); "
                               f"got {json.dumps(value)}")
    if "label_case" in spec and spec["label_case"] not in LABEL_CASES:
        raise _fail(where, f"'label_case' is \"fold\" (labels alike but for their case are one class) or \"exact\" "
                           f"(they are classes of their own); got {json.dumps(spec['label_case'])}")
    return spec


# ---- inferring what a declaration leaves out --------------------------------------------------------------------


def _first_line_fields(path: Path, fmt: FileFormat, about: str) -> list[str]:
    """The fields of a file's first line (its header), stripped; an empty file is a ValueError naming it."""
    text = decode_utf8(path, path.read_bytes())
    if not text.strip():
        raise ValueError(f"{path}: the file is empty; put the task's rows there ({about})")
    delimiter = fmt.delimiter or sniff_delimiter(text)
    return [f.strip() for f in text.split("\n", 1)[0].rstrip("\r").split(delimiter)]


def _number(raw: str) -> float | None:
    try:
        return float(raw)
    except ValueError:
        return None


def _suggest(spec: Mapping[str, Any], regression: bool) -> str:
    pair = "pair" if len([spec["text"]] if not isinstance(spec["text"], list) else spec["text"]) == 2 else "sentence"
    return f'"kind": "{pair}-{"regression" if regression else "classification"}"'


def _classes_of(train: Path, labels: list[tuple[int, str]], spec: Mapping[str, Any], where: str,
                declared: bool) -> list[str]:
    """The classes of a classification whose file declares none: its training labels' distinct values, sorted
    (whole numbers by value); refused where they look like something else (``declared``: the file says it is a
    classification)."""
    numbers = {raw: _number(raw) for _, raw in labels}
    words = [(line, raw) for line, raw in labels if numbers[raw] is None]
    if words and 2 * len(words) < len(labels) and not declared:
        line, raw = words[0]
        raise _fail(f"{train}: line {line}", f"label {raw!r} is not a number, while most labels are; fix it, or "
                    f"declare the classes (\"classes\": [...]) in {where}")
    if words:
        names = _word_classes(train, labels, spec, where)
        if len(names) > MAX_CLASSES:
            raise _fail(train.as_posix(), f"{len(names)} distinct labels would make {len(names)} classes (more than "
                        f"{MAX_CLASSES}): is {json.dumps(spec['label'])} the label column? If they are classes, "
                        f"declare them (\"classes\": [...]) in {where}")
        return names
    bad = next(((line, raw) for line, raw in labels if canonical_number(raw) is None), None)
    if bad is not None:
        raise _fail(f"{train}: line {bad[0]}", f"label {bad[1]!r} is not a whole number, and task {spec['name']!r} "
                    f"is a classification; give whole-number or word classes, or {_suggest(spec, True)} in {where}")
    first: dict[int, int] = {}
    for line, raw in labels:
        first.setdefault(int(float(raw)), line)
    values = sorted(first)
    if len(values) >= 3:
        for outlier, rest in ((values[-1], values[:-1]), (values[0], values[1:])):
            gap = min(abs(outlier - rest[0]), abs(outlier - rest[-1]))
            if gap > OUTLIER_GAP * (rest[-1] - rest[0] + 1):
                listed = [str(v) for v in values[:6]] + (["..."] if len(values) > 6 else [])
                raise _fail(f"{train}: line {first[outlier]}", f"label {outlier} is far outside the others "
                            f"({rest[0]} to {rest[-1]}): a typo? Fix it, or declare every class (\"classes\": "
                            f"{json.dumps(listed)}) in {where}")
    names = [str(v) for v in values]
    if len(names) < 2:
        raise _fail(train.as_posix(), f"every label in column {json.dumps(spec['label'])} is {names[0]!r}: a "
                    "classification needs two classes or more (is 'label' the right column?)")
    if len(names) > MAX_CLASSES:
        raise _fail(train.as_posix(), f"{len(names)} distinct labels would make {len(names)} classes; if they are "
                    f"scores, declare {_suggest(spec, True)}; if classes, declare them (\"classes\") in {where}")
    return names


def _word_classes(train: Path, labels: list[tuple[int, str]], spec: Mapping[str, Any], where: str) -> list[str]:
    """The distinct labels of a column of words, sorted; labels alike but for their case are refused unless the
    file's "label_case" says how to read them ("fold": one class, spelt as most rows spell it, ties the first)."""
    first: dict[str, int] = {}  # each spelling's first line
    spellings: dict[str, Counter[str]] = {}  # each label's spellings and their rows, by its case-folded form
    for line, raw in labels:
        first.setdefault(raw, line)
        spellings.setdefault(raw.casefold(), Counter())[raw] += 1
    case = spec.get("label_case")
    if case == "exact":
        return sorted(first)
    kept = {key: max(forms, key=lambda f: (forms[f], -first[f])) for key, forms in spellings.items()}
    if case is None:
        for key, forms in spellings.items():
            if len(forms) > 1:
                a, b = sorted(forms, key=first.__getitem__)[:2]
                raise _fail(f"{train}: line {first[b]}", f"label {b!r} and {a!r} (line {first[a]}) differ only in "
                            f"case: declare \"label_case\": \"fold\" to read them as one class ({kept[key]!r}, as "
                            f"most rows write it) or \"exact\" to keep them apart, in {where}")
    return sorted(kept.values())


def infer(spec: dict[str, Any], files: dict[str, Path], where: str, labels: list[tuple[int, str]]
          ) -> tuple[dict[str, Any], list[str]]:
    """``spec`` completed from its training file's labels (``labels``: their lines and cells): ``kind`` and
    ``classes`` or ``range`` (and the id column of each file); returns it and the keys inferred."""
    spec = dict(spec)
    inferred: list[str] = []
    layout = layout_from(spec)
    train = files["train"]
    pair = len(layout.text) == 2
    kind_name = spec.get("kind")
    if kind_name is None:
        if "range" in spec:
            kind_name = f"{'pair' if pair else 'sentence'}-regression"
        elif "classes" in spec or "num_classes" in spec:
            kind_name = f"{'pair' if pair else 'sentence'}-classification"
        else:
            numbers = [(line, raw, _number(raw)) for line, raw in labels]
            bad = next(((line, raw) for line, raw, v in numbers if v is not None and not math.isfinite(v)), None)
            if bad is not None:
                raise _fail(f"{train}: line {bad[0]}", f"label {bad[1]!r} is not a finite number; fix the row")
            fractional = all(v is not None for _, _, v in numbers) and any(v != int(v) for _, _, v in numbers)
            kind_name = f"{'pair' if pair else 'sentence'}-{'regression' if fractional else 'classification'}"
        inferred.append("kind")
    kind: Kind = KINDS[kind_name]
    if kind.pair != pair:
        raise _fail(where, f"a {kind.name} task reads {2 if kind.pair else 1} text column(s), 'text' names "
                           f"{len(layout.text)}; declare {_suggest(spec, not kind.classification)}")
    spec["kind"] = kind.name
    if kind.classification:
        if "num_classes" in spec:
            spec["classes"] = [str(k) for k in range(spec.pop("num_classes"))]
        elif "classes" not in spec:
            spec["classes"] = _classes_of(train, labels, spec, where, declared="kind" not in inferred)
            inferred.append("classes")
    elif "range" not in spec:
        values = []
        for line, raw in labels:
            v = _number(raw)
            if v is None or not math.isfinite(v):
                raise _fail(f"{train}: line {line}", f"label {raw!r} is not a number, and task {spec['name']!r} is a "
                            f"{kind.name}; fix the row" + ("" if "kind" in inferred else
                                                            f", or declare {_suggest(spec, False)}"))
            values.append(v)
        if min(values) == max(values):
            raise _fail(train.as_posix(), f"every label is {labels[0][1]}: a regression needs scores that differ "
                        "(is 'label' the right column?)")
        spec["range"] = [min(values), max(values)]
        inferred.append("range")
    if "id" not in spec:  # each file's own: "id" where its header has one
        for split, path in files.items():
            own = spec.get(split) if isinstance(spec.get(split), dict) else None
            lay = layout_from({**spec, **(own or {})})
            if own is not None and "id" in own or not lay.fmt.header:
                continue
            has_id = "id" in _first_line_fields(path, lay.fmt, f"{where} names it")
            if split == "train":
                spec["id"] = "id" if has_id else None
            elif has_id != (spec.get("id") == "id"):
                spec[split] = {**(own or {"file": spec[split]}), "id": "id" if has_id else None}
        spec.setdefault("id", None)
    return spec, inferred


# ---- reading a task file -----------------------------------------------------------------------------------------


def read_declaration(path: Path, where: str) -> Any:
    """The JSON of a task file; a FileNotFoundError or ValueError naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{where} is a directory: name the task's JSON file") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: not a JSON file ({e})") from None


def read_task_file(path: str | os.PathLike[str]) -> Task:
    """The task a JSON file declares (an entry a run keeps as its own); a ValueError naming the file, or the data file and line.

    Every value is checked before any data is read; the files are relative to the JSON file's folder; what it
    does not declare is inferred from the training file's labels (the module's docstring), and every dev label
    must then be one the task can take.
    """
    path = Path(path).expanduser().resolve()
    where = f"task file {path}"
    declaration = read_declaration(path, where)
    spec = check_declaration(declaration, where)
    about = f"{where} names it"
    files = {}
    for split in SPLITS:
        if spec.get(split) is not None:
            name = spec[split]["file"] if isinstance(spec[split], dict) else spec[split]
            files[split] = path.parent / name
            if not files[split].is_file():
                raise DataFileMissing(files[split], f"{about} as {split!r}, relative to its own folder")
    layouts = {split: layout_from({**spec, **{k: v for k, v in (spec[split] if isinstance(spec[split], dict) else {})
                                              .items() if k != "file"}}) for split in files}  # each file's own
    for split, file in files.items():  # every column the task file names by name, in the file it names it for
        own = spec[split] if isinstance(spec[split], dict) else {}
        lay = layouts[split]
        if lay.fmt.header:
            header = _first_line_fields(file, lay.fmt, f"{where} names it")
            for key, column in [*(("text", c) for c in lay.text), ("label", lay.label), ("id", lay.id)]:
                if isinstance(column, str) and column not in header and not (split == "test" and key == "label") \
                        and not (key == "id" and "id" not in spec and "id" not in own):
                    raise _fail(f"{file}: line 1", f"the header has no column {column!r} (it has {header}); {where} "
                                f"names it as the {key} column" + (f" of its {split} file" if own else ""))
    labels, report = read_labels(files["train"], layouts["train"].label, fmt=layouts["train"].fmt, about=about)
    if not labels:
        raise _fail(files["train"].as_posix(), f"no labels in column {json.dumps(spec['label'])} "
                                               f"({report.summary(3)})")
    spec, inferred = infer(spec, files, where, labels)
    if "prior" in spec and spec["kind"] not in PRIOR_KINDS.values():
        raise _fail(where, f"'prior': a prior is a probe of a sentence classification or the cosine of a pair "
                           f"regression, and the task is a {spec['kind']}")
    # (its "phrases" file is looked for where a run trains them: a run may set another, or none, per stream)
    try:
        task = from_declaration(spec, path.parent, {"file": str(path), "declaration": declaration,
                                                    "inferred": inferred}, checks_range="range" not in inferred)
    except ValueError as e:  # what only the classes tell: a "positive" that names none of them, ...
        raise _fail(where, str(e)) from None
    for split in ("train", "dev"):
        _check_first_line(task, spec, split, files[split], where)
    # every dev label the task cannot take, named with its line (the reader would skip it and carry on)
    dev_layout = task.layout_of("dev")
    problems_at = []
    dev_classes = set()
    for line, raw in read_labels(files["dev"], dev_layout.label, fmt=dev_layout.fmt, about=about)[0]:
        problems: list[str] = []
        dev_classes.add(task.parse_label(raw, problems))
        if problems:
            problems_at.append((line, raw, problems[0]))
    if problems_at:
        line, raw, problem = problems_at[0]
        other_case = next((c for c in task.classes or () if c.casefold() == raw.strip().casefold()), None)
        hint = (f" (class {other_case!r} in another case: \"label_case\": \"fold\" in the task file reads it so)"
                if other_case is not None else
                " (a class the training file lacks: declare every class, \"classes\", in the task file)"
                if "classes" in inferred else "")
        raise _fail(f"{files['dev']}: line {line}", f"{problem} for task {task.name!r} ({task.kind.name}"
                    + (f", {task.num_classes} classes" if task.classes else "") + ")" + hint
                    + (f"; and {len(problems_at) - 1} more rows" if len(problems_at) > 1 else ""))
    if "range" in inferred:
        _check_range(task, files, where)
    if "classes" in inferred:
        _warn_rare(task, labels, dev_classes, files["train"], where)
    return task


def _check_first_line(task: Task, spec: Mapping[str, Any], split: str, file: Path, where: str) -> None:
    """A file whose columns the task file names by position alone and whose header it does not declare: its first
    line is taken for a header, so one that reads as a row (its label a class, or a score) is refused, naming both
    declarations (a row would be lost, or a header trained on)."""
    own = spec[split] if isinstance(spec[split], dict) else {}
    if "header" in own or "header" in spec:
        return
    lay = task.layout_of(split)
    if not all(isinstance(c, int) for c in (*lay.text, lay.label, lay.id) if c is not None):
        return
    fields = _first_line_fields(file, lay.fmt, f"{where} names it")
    cell = fields[lay.label].strip() if lay.label < len(fields) else ""
    value = _number(cell)
    if task.kind.classification and task.class_of(cell) is not None:
        why = f"its label {cell!r} is one of its classes"
    elif not task.kind.classification and value is not None and math.isfinite(value):
        why = f"its label {cell!r} is a score"
    else:
        return
    raise _fail(f"{file}: line 1", f"{where} names the columns by position and says nothing of a header, and line 1, "
                f"taken for the header, reads as a row ({why}): declare \"header\": false to read it as a row, or "
                f"\"header\": true to keep it the header")


def _check_range(task: Task, files: Mapping[str, Path], where: str) -> None:
    """A regression's range inferred from the training labels: a dev label outside it, or a test file's where it
    has labels (a header naming the label column), is refused: its head's output never leaves the range."""
    low, high = task.score_range
    for split in ("dev", "test"):
        lay = task.layout_of(split)
        if split not in files or lay.label is None or (split == "test" and not (
                lay.fmt.header and lay.label in _first_line_fields(files[split], lay.fmt, f"{where} names it"))):
            continue
        for line, raw in read_labels(files[split], lay.label, fmt=lay.fmt, about=f"{where} names it")[0]:
            value = _number(raw)
            if value is not None and not low <= value <= high:
                raise _fail(f"{files[split]}: line {line}", f"label {raw} is outside [{low:g}, {high:g}], the range "
                            f"of the training labels, which the head's scores never leave: fix it, or declare the "
                            f"scale (\"range\": [low, high]) in {where} to accept it")


def _warn_rare(task: Task, labels: list[tuple[int, str]], dev_classes: set, train: Path, where: str) -> None:
    """A warning for each inferred class on fewer than RARE_LABEL training rows and no dev row (a typo?)."""
    lines: dict[int, list[int]] = {}
    for line, raw in labels:
        lines.setdefault(task.class_of(raw), []).append(line)
    for k, at in lines.items():
        if k is not None and len(at) < RARE_LABEL and k not in dev_classes:
            logger.warning("%s: label %r is on %d training row%s (%s) and on no dev row: a typo? Fix it, or declare "
                           "every class (\"classes\") if it is one", where, task.label_name(k), len(at),
                           "" if len(at) == 1 else "s", ", ".join(f"{train}:{line}" for line in at))


def inferred_note(task: Task) -> str:
    """What of ``task`` its file left to its labels or to the defaults, and the declaration that says otherwise
    (for the run's log)."""
    inferred = task.origin.get("inferred") or []
    notes = []
    if inferred:
        numbers = not task.kind.classification or all(canonical_number(c) is not None for c in task.classes)
        other = ("" if not numbers or "kind" not in inferred else
                 f" (to read them as a score: \"kind\": \"{task.kind.name.replace('classification', 'regression')}\")"
                 if task.kind.classification else
                 f" (to read them as classes: \"kind\": \"{task.kind.name.replace('regression', 'classification')}\")")
        notes.append(f"{' and '.join(inferred)} inferred from its training labels{other}")
    if "f1" in task.metrics and "positive" not in (task.origin.get("declaration") or {}):
        notes.append(f"F1 is on the second class, {task.label_name(task.positive_class)!r} (\"positive\" names "
                     "another)")
    return "; ".join(notes)


# ---- a saved run's task against its file -----------------------------------------------------------------------


def check_unchanged(saved: Task, given: str | os.PathLike[str] | None = None) -> Task:
    """A saved run's task (``--resume``, ``--eval-only``) against its task file: the file it was declared by (or
    ``given``, where the user moved it) must declare it as it did then (a ValueError naming each change); a file
    that is gone leaves the saved task as it is. Returns the task with its files where the file now says."""
    origin = saved.origin.get("file")
    if origin is None:
        return saved
    path = Path(given).expanduser().resolve() if given is not None else Path(origin)
    where = f"task file {path}"
    if given is None and not path.is_file():
        return saved
    now = read_declaration(path, where)
    then = saved.origin.get("declaration")
    if now != then:
        if not isinstance(now, dict):
            raise ValueError(f"{where} no longer declares task {saved.name!r} (it is not a JSON object)")
        keys = sorted(set(now) | set(then or {}), key=lambda k: TASK_FILE_KEYS.index(k) if k in TASK_FILE_KEYS
                      else len(TASK_FILE_KEYS))
        changes = [f"{k!r} was {json.dumps((then or {}).get(k))}, is {json.dumps(now.get(k))}" for k in keys
                   if (then or {}).get(k) != now.get(k)]
        raise ValueError(f"{where} changed since the run was trained ({'; '.join(changes)}): the run's task is "
                         "what the file declared then; restore it, or train a new run on the file as it is")
    if given is None:
        return saved
    def moved(f: str) -> str:
        return os.path.normpath(path.parent / os.path.relpath(f, Path(origin).parent))
    d = saved.to_dict()
    stream, triplets = d["stream"], d["triplets"]  # its phrases' and NLI triplets' files move with it too
    return Task.from_dict({**d, "files": {s: moved(f) for s, f in saved.files.items()},
                           "stream": {**stream, "file": moved(stream["file"])} if stream else stream,
                           "triplets": moved(triplets) if triplets else triplets,
                           "origin": {**saved.origin, "file": str(path)}})


__all__ = ("METRIC_NAMES", "check_declaration", "check_unchanged", "infer", "inferred_note", "read_task_file")
