"""The versions of a run's config.json, and the migrations that upgrade an old one to today's.

Every config.json a run or checkpoint writes records the version of its format (``config_version``) and the
versions of this package and of torch that wrote it, as transformers records ``transformers_version``. A saved
run's file is read by upgrading it one version at a time through MIGRATIONS, as fairseq upgrades old checkpoint
arguments: migration i turns a file of version i into one of version i + 1, and its docstring says what changed.
Version 0 is every file written before versions were recorded.

A file of some fields (``--config`` of one's own) is not a saved run: it records no version and lacks fields
that every saved run holds (UNVERSIONED_FIELDS); nothing is filled in for it, and the settings it leaves out take
today's defaults (TrainConfig.from_dict). It may name its settings as version 1 did or as today's: it goes through
the migrations after version 1, each of which leaves today's names as they are.

Usage:
    d = upgrade(read_json(path))          # today's names: a saved run upgraded, a file of some fields renamed only
    fields_of(TrainConfig) == MIGRATIONS[-1].fields   # tests/test_config_versions.py: a new field needs a version
    objective_options(REGISTRY) == MIGRATIONS[1].objective_options    # version 2's record of the objectives' options
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import importlib.metadata
import json
import math
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tasks.data.readers import FileFormat, decode_utf8, read_labels
from tasks.task import canonical_number

VERSION_KEY = "config_version"


SOFTWARE_KEYS = ("minbert_multitask_version", "torch_version")  # what wrote the file: recorded, never read back


def fields_of(cls: type, prefix: str = "") -> frozenset[str]:
    """Every field path of dataclass ``cls`` as config.json holds it: a nested config's fields dotted
    ("model.arch"), a mapping (objectives) one field."""
    hints = typing.get_type_hints(cls)
    out: set[str] = set()
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out |= fields_of(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.add(prefix + f.name)
    return frozenset(out)


def _paths(d: dict[str, Any]) -> set[str]:
    """The field paths of a JSON config: the keys of "model" (an object) dotted, every other key one path."""
    model = d.get("model")
    return (set(d) - {"model"}) | {f"model.{k}" for k in model} if isinstance(model, dict) else set(d)


# ---- version 0: the files written before versions were recorded ----

# The fields of the first TrainConfig's config.json: every run saved since holds them.
UNVERSIONED_FIELDS = frozenset((
    "batch_size", "bf16", "checkpoint_every", "compile", "data_dir", "dev_max_examples", "device", "encoder_dropout",
    "epochs", "eval_batch_size", "grad_clip", "limit", "log_every", "loss_weights", "lr", "lr_decay", "lr_schedule",
    "max_length", "max_train_examples", "nli", "objectives", "out_dir", "pretrained", "schedule", "seed",
    "task_batch_size", "tasks", "warmup", "weight_decay", "model.arch", "model.baseline_proj_size", "model.fcn_size",
    "model.head_dropout", "model.pair_encoding", "model.pooling", "model.sts_scale"))


# Each field added while versions were not recorded, with the value a run saved before it trained with: every one
# came in off, or set as the runs before it had it.
UNVERSIONED_ADDITIONS: dict[str, Any] = {
    "lp_epochs": 0, "lp_lr": None, "swa_epochs": 0, "swa_lr": 1e-5, "predict_train": False,  # LP-FT, SWA, logits
    "final_dev": "full", "fused_adamw": False, "gradient_checkpointing": False, "deterministic": False,
    "layer_lr_decay": 1.0, "head_lr_scale": 1.0,  # one learning rate for every layer, the heads' too
    "train_subsets": "fresh", "pair_swap": 0.0, "symmetric_eval": False, "sts_prior": 0.0, "sst_prior": 0.0,
    "sst_prior_model": None, "report_to": [], "sst_phrases": None, "sst_phrases_per_epoch": 8544,
    "sst_phrases_batch_size": None, "sst_phrases_min_words": 1, "sst_phrases_weight": 1.0,
    "sst_phrases_order": "mixed", "save_only_model": False, "reinit_layers": 0, "task_files": [],
    "freeze_encoder": False}


def from_unversioned(d: dict[str, Any]) -> dict[str, Any]:
    """Version 0 -> 1: a run saved before config.json recorded its version holds the first TrainConfig's fields
    and those added before it was written; each field added since takes the value the run trained with
    (UNVERSIONED_ADDITIONS), and the STS prior's encoder, which was --pretrained's before it had its own setting,
    takes ``pretrained``'s value."""
    return {**UNVERSIONED_ADDITIONS, "sts_prior_model": d.get("pretrained"), **d}


# ---- version 2: settings of one feature nested, as the heads' are ----

# Version 1's flat fields -> (the nested config, its field) of version 2; the flags keep the flat names.
NESTED_SETTINGS = {
    "sts_prior": ("priors", "sts_weight"), "sts_prior_model": ("priors", "sts_model"),
    "sst_prior": ("priors", "sst_weight"), "sst_prior_model": ("priors", "sst_model"),
    "sst_phrases": ("sst_phrases", "file"), "sst_phrases_per_epoch": ("sst_phrases", "per_epoch"),
    "sst_phrases_batch_size": ("sst_phrases", "batch_size"), "sst_phrases_min_words": ("sst_phrases", "min_words"),
    "sst_phrases_weight": ("sst_phrases", "weight"), "sst_phrases_order": ("sst_phrases", "order"),
    "lp_epochs": ("lpft", "epochs"), "lp_lr": ("lpft", "lr"), "swa_epochs": ("swa", "epochs"), "swa_lr": ("swa", "lr")}


def nest_settings(d: dict[str, Any]) -> dict[str, Any]:
    """Version 1 -> 2: the settings of the priors, the SST phrases, LP-FT and SWA move from flat fields into a
    nested config each, as ``model`` holds the heads': "sts_prior" -> "priors": {"sts_weight"}, "sst_phrases"
    (the file) and "sst_phrases_<x>" -> "sst_phrases": {"file", "<x>"}, "lp_<x>" -> "lpft": {"<x>"}, "swa_<x>" ->
    "swa": {"<x>"} (NESTED_SETTINGS). A setting already nested stays (a file of some fields may be written either
    way); one given both ways is a ValueError naming both."""
    out = {k: v for k, v in d.items() if k not in NESTED_SETTINGS or isinstance(v, dict)}
    for flat, (name, field) in NESTED_SETTINGS.items():
        if flat not in d or isinstance(d[flat], dict):
            continue
        nested = out.get(name, {})
        if not isinstance(nested, dict):
            raise ValueError(f"{name}: {nested!r} is not an object of its settings")
        if field in nested:
            raise ValueError(f"{flat} and {name}.{field} are one setting: give it once")
        out[name] = {**nested, field: d[flat]}
    return out


# ---- version 3: a run keeps its own tasks' entries, and says what selects its best epoch ----


def _task_of_version_2(path: str) -> dict[str, Any]:
    """The task a task file declared to a run of version 2, by that version's rules (the entry
    ``Task.to_dict`` writes): the delimiter of the training file's header line for every file, CSV quoting, a
    header, a last line without a line end taken for cut; without "kind", whole-number labels a classification (a sentence one of as many classes as the
    largest label + 1, a pair one of two, scored by one logit) and other numbers a pair regression on STS's
    head (0-5, sts_scale); accuracy or Pearson r; predictions in the course's file format."""
    file = Path(path)
    where = f"{file}, the task file of a run saved before version 3 (it keeps its task in config.json since)"
    try:
        spec = json.loads(file.read_text(encoding="utf-8"))
    except OSError:
        raise ValueError(f"{where}: not found; the run reads its task there: put the file back to load it") from None
    folder = file.resolve().parent
    files = {s: str(folder / spec[s]) for s in ("train", "dev", "test") if spec.get(s)}
    text = [spec["text"]] if isinstance(spec["text"], str) else list(spec["text"])
    first = decode_utf8(files["train"], Path(files["train"]).read_bytes()).split("\n", 1)[0]
    delimiter = spec.get("delimiter") or ("\t" if "\t" in first else ",")
    header = [h.strip() for h in next(csv.reader([first.rstrip("\r")], delimiter=delimiter))]
    fmt = FileFormat(delimiter, quoting=True, line_ends=True)
    labels = [raw for _, raw in read_labels(files["train"], spec["label"], fmt=fmt)[0]]
    kind = spec.get("kind")
    if kind is None:
        whole = all(canonical_number(raw) is not None for raw in labels)
        kind = ("pair-classification" if len(text) == 2 else "sentence-classification") if whole else "pair-regression"
    classes = None
    if kind == "pair-classification":
        classes = ["0", "1"]
    elif kind == "sentence-classification":
        n = spec.get("num_classes") or int(max(float(raw) for raw in labels)) + 1
        classes = [str(k) for k in range(n)]
    regression = kind == "pair-regression"
    layout = {"text": text, "label": spec["label"], "id": spec["id"] if "id" in spec else "id" if "id" in header
              else None, "delimiter": delimiter, "quoting": True, "header": True, "line_ends": True}
    return {"name": spec["name"], "kind": kind, "classes": classes, "score_range": [0.0, 5.0] if regression else None,
            "checks_range": regression, "metrics": ["r" if regression else "acc"], "files": files, "layout": layout,
            "split_layouts": {}, "output_column": f"Predicted_{spec['name']}", "starter_format": True,
            "positive": "", "symmetric": kind.startswith("pair"), "span_option": "sts_scale" if regression else "",
            "stream": None, "prior": None,
            "origin": {"file": str(file), "declaration": spec, "inferred": []}}


_SAVED_RUN = ("tasks", "task_files", "seed", "epochs", "data_dir", "out_dir", "model", "objectives")  # every run's


def keep_tasks(d: dict[str, Any]) -> dict[str, Any]:
    """Version 2 -> 3: a saved run keeps its task files' tasks in "user_tasks" (the task files were read again by
    every command that loaded the run; this reads them once more, by version 2's rules: ``_task_of_version_2``),
    and "best_metric" says what selected its best epoch: in version 2 the overall over every task of the run,
    a user's too; "threads" (--threads) is torch's choice and "objective_modules" (--objective-module) none, as
    they were. A file of some fields (``--config`` of
    one's own) gets none of them: a fresh run reads its task files itself, and selects as today's runs do."""
    if "user_tasks" in d or not set(_SAVED_RUN) <= set(d):
        return d
    entries = [_task_of_version_2(f) for f in d.get("task_files") or ()]
    own = [e["name"] for e in entries if e["name"] in d["tasks"]]
    builtin = [t for t in ("sst", "para", "sts", "cfimdb") if t in d["tasks"]]
    return {**d, "user_tasks": {e["name"]: e for e in entries}, "best_metric": builtin + own if own else [],
            "threads": None, "objective_modules": []}


# ---- version 4: a saved task says which class its F1 is on and how its labels and files are read ----


def read_as_version_3(d: dict[str, Any]) -> dict[str, Any]:
    """Version 3 -> 4: in a saved task entry ("user_tasks"), "positive" was a word for what class 1 of a one-logit
    task means, and F1 was always class 1's; it names the class F1 is scored on since: a word that names no class of
    a two-class task (or any on another task) goes, so that F1 stays the second class's, class 1's; labels were
    matched as written ("label_case": "exact"), and no field of its files spanned lines ("multiline": false in each
    layout: a record over several lines is an unbalanced quote). A GLUE task's entry is kept since; a run of
    version 3 kept none, and predicts with the package's (tasks.train_config.TrainConfig)."""
    if not isinstance(d.get("user_tasks"), dict):
        return d
    entries = {}
    for name, e in d["user_tasks"].items():
        classes = e.get("classes") or []
        positive = e.get("positive") or ""
        names_class = positive in classes or canonical_number(positive) in classes
        two = e.get("kind", "").endswith("classification") and len(classes) == 2
        layouts = {"layout": {**e["layout"], "multiline": False},
                   "split_layouts": {s: {**lay, "multiline": False} for s, lay in e["split_layouts"].items()}}
        entries[name] = {**e, **layouts, "positive": positive if two and names_class else "", "label_case": "exact"}
    return {**d, "user_tasks": entries}


# ---- fp16, gradient accumulation, early stopping, frozen layers, dropout masks ----

# Each field this version adds, with the value every run before it trained with.
TRAINING_CONTROLS = {"fp16": False, "gradient_accumulation_steps": 1, "early_stopping_patience": 0,
                     "freeze_layers": None, "dropout_masks": "exact"}


def add_training_controls(d: dict[str, Any]) -> dict[str, Any]:
    """fp16 with loss scaling (--fp16), gradient accumulation, early stopping, frozen lower layers and the dropout
    masks' generator come in, off (or as they were drawn) as every run before trained (TRAINING_CONTROLS). A file of
    some fields gets none of them: it takes today's defaults, which are the same."""
    if not set(_SAVED_RUN) <= set(d):
        return d
    return {**TRAINING_CONTROLS, **d}


# ---- version 6: a task's prior and a regression's span set per task, as every task's are ----

# Version 5's "priors" object (its defaults, today's too) -> the per-task map and task of version 6
PRIORS_5 = {"sts_weight": 0.5, "sts_model": None, "sst_weight": 0.5, "sst_model": None}
PER_TASK_PRIORS = {"sts_weight": ("prior_weights", "sts"), "sts_model": ("prior_models", "sts"),
                   "sst_weight": ("prior_weights", "sst"), "sst_model": ("prior_models", "sst")}
SCALE_5 = ("sts_scale", "sts")  # version 5's "model": {"sts_scale"} (a span_option's target too): the task it spans


def per_task_settings(d: dict[str, Any]) -> dict[str, Any]:
    """Version 5 -> 6: what the STS and SST entries pointed to becomes per-task settings that every task reads.

    The priors ("priors": {"sts_weight", "sts_model", "sst_weight", "sst_model"}) become "prior_weights": {"sts": W,
    "sst": W} and "prior_models": {"sts": DIR, ...} (an encoder of None left out: the task's declared one, the
    embedded MiniLM); STS's span ("model": {"sts_scale"}) becomes "model": {"spans": {"sts": S}}, and so does that of
    a user's regression task saved at version 2, which took STS's (its entry's "span_option"). A file of some fields
    gives what it names over version 5's defaults (today's); one without them is left as it is. A setting given
    both ways is a ValueError."""
    model = d.get("model")
    field, task = SCALE_5
    if isinstance(model, dict) and field in model:
        if "spans" in model:
            raise ValueError(f"model.{field} and model.spans set the same span: give it once")
        scale = _checked(f"model.{field}", model[field], number=True)
        spans = {task: scale, **{n: scale for n in took_scale(d)}}
        d = {**d, "model": {**{k: v for k, v in model.items() if k != field}, "spans": spans}}
    if "priors" not in d:
        return d
    priors = _settings_object(d, "priors", PRIORS_5)
    if "prior_weights" in d or "prior_models" in d:
        raise ValueError("priors and prior_weights / prior_models set the same priors: give them one way")
    out = {k: v for k, v in d.items() if k != "priors"} | {"prior_weights": {}, "prior_models": {}}
    for key, value in {**PRIORS_5, **priors}.items():
        name, task = PER_TASK_PRIORS[key]
        if _checked(f"priors.{key}", value, number=key.endswith("_weight")) is not None:
            out[name][task] = value
    return out


def _settings_object(d: dict[str, Any], name: str, known: Iterable[str]) -> dict[str, Any]:
    """An old version's nested settings ``d[name]`` (version 5's "priors", version 6's "sst_phrases"): an object of
    the ``known`` keys alone, else a ValueError naming the key."""
    value = d[name]
    if not isinstance(value, dict):
        raise ValueError(f"{name}: {json.dumps(value)} is not an object of its settings")
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"{name}.{unknown[0]} is not a setting ({name}: {', '.join(known)})")
    return value


def took_scale(d: dict[str, Any]) -> list[str]:
    """The user tasks of a saved run's config.json (before version 6) whose span was STS's (a regression declared
    at version 2: its entry's "span_option")."""
    return [n for n, e in (d.get("user_tasks") or {}).items() if isinstance(e, dict)
            and e.get("span_option") == SCALE_5[0]]


def _checked(where: str, value: Any, number: bool) -> Any:
    """A version-5 setting's value as its field read it then: a number, or an encoder's directory or null; a
    ValueError naming ``where`` (the file's own key) otherwise."""
    shown = repr(value) if isinstance(value, str) else json.dumps(value)
    if number:
        try:
            ok = not isinstance(value, bool) and isinstance(value, (int, float, str)) and math.isfinite(float(value))
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"{where}: {shown} is not a number")
    elif value == "none":
        raise ValueError(f"{where}: 'none' is not a value of this setting: leave it out for its default")
    elif value is not None and not isinstance(value, str):
        raise ValueError(f"{where}: {shown} is not a string")
    return value


# ---- version 7: an extra stream's file, fewest words and order set per stream, as every stream's cap is ----

PHRASES_STREAM = "phrases"  # the SST entry's stream, which version 6's "sst_phrases" set
# Version 6's "sst_phrases" object (its defaults, today's too) -> the per-stream map of version 7 that holds it
PHRASES_6 = {"file": "sst-phrases-train.csv", "per_epoch": 17088, "batch_size": 64, "min_words": 1, "weight": 1.0,
             "order": "mixed"}
PER_STREAM_PHRASES = {"file": "stream_files", "per_epoch": "max_train_examples", "batch_size": "task_batch_size",
                      "min_words": "stream_min_words", "weight": "loss_weights", "order": "stream_orders"}
MAPS_6 = {"max_train_examples": {"para": 23000}}  # version 6's defaults of the maps it joins (the others': none)


def per_stream_settings(d: dict[str, Any]) -> dict[str, Any]:
    """Version 6 -> 7: what the SST entry's stream pointed to becomes per-stream settings that every stream reads.

    SST's phrases ("sst_phrases": {"file", "per_epoch", "batch_size", "min_words", "weight", "order"}) become the
    "phrases" items of "stream_files" (a file, or null: off), "max_train_examples", "task_batch_size" (null:
    --batch-size's), "stream_min_words", "loss_weights" and "stream_orders", each where it is not what SST's entry
    declares today or the general setting's (PHRASES_6: its defaults then): as a run of today writes them. An item
    a map already names stays (version 6 read it first). A file of some fields gives what it names over version 6's
    defaults of the maps (MAPS_6, today's); one without "sst_phrases" is left as it is."""
    if "sst_phrases" not in d:
        return d
    phrases = _settings_object(d, "sst_phrases", PHRASES_6)
    out = {k: v for k, v in d.items() if k != "sst_phrases"}
    for key, value in phrases.items():
        name = PER_STREAM_PHRASES[key]
        mapping = out.get(name, MAPS_6.get(name, {}))
        if not isinstance(mapping, dict):
            raise ValueError(f"{name}: {json.dumps(mapping)} is not a mapping (an object of STREAM: VALUE)")
        if key in ("file", "batch_size") and value == "none":
            value = None  # as version 6's flag read it
        mapping = dict(mapping)
        if key == "file" or value != PHRASES_6[key]:
            mapping.setdefault(PHRASES_STREAM, value)
        out[name] = mapping
    return out


def _renamed(fields: frozenset[str], names: dict[str, tuple[str, str]]) -> frozenset[str]:
    return frozenset(".".join(names[f]) if f in names else f for f in fields)


# ---- the table ----

@dataclass(frozen=True)
class Migration:
    """One step of config.json's format: ``upgrade`` turns a file of the version before into one of this
    version, whose field paths are ``fields`` and whose built-in objectives' options are ``objective_options``
    ("<objective>.<option>"; empty where the version did not record them). An objective's option added in a new
    version is filled in by its ``upgrade`` (in each objective of ``objectives`` that lacks it) with the value
    the runs before it trained with."""

    upgrade: Callable[[dict[str, Any]], dict[str, Any]]
    fields: frozenset[str]
    objective_options: frozenset[str] = frozenset()


def objective_options(objectives: dict[str, type]) -> frozenset[str]:
    """"<objective>.<option>" of every option of each objective class's ``Config`` (tasks.objectives.REGISTRY)."""
    return frozenset(f"{name}.{f.name}" for name, cls in objectives.items() for f in dataclasses.fields(cls.Config))


# The built-in objectives' options when versions began to record them (version 2): a run saved since reads each
# option it leaves out at its default, so an option added later needs a version that fills in the old value.
_OBJECTIVE_OPTIONS_2 = frozenset(f"{name}.{option}" for name, options in {
    "distill": ("weight", "tasks", "teachers", "temperature"),
    "knn_bert": ("weight", "tasks", "momentum", "temperature", "queue_size", "m_most", "m_least", "representation",
                 "knn_k", "knn_phi"),
    "label_smoothing": ("weight", "tasks", "to"),
    "match_tuning": ("weight", "tasks", "temperature", "inference"),
    "mnr": ("weight", "tasks", "scale", "sts_label_weighting", "hard_negatives", "para_positives"),
    "rdrop": ("weight", "tasks", "alpha"),
    "rift": ("weight", "tasks", "beta", "alpha", "temperature", "norm", "epsilon", "step_size", "steps",
             "proj_hidden", "proj_dim"),
    "scl": ("weight", "tasks", "temperature", "embedding", "reduction"),
    "simcse": ("weight", "tasks", "temperature", "similarity"),
    "smart": ("weight", "tasks", "sigma", "step_size", "epsilon", "steps", "reuse_head_output"),
}.items() for option in options)


_VERSION_1 = UNVERSIONED_FIELDS | {"sts_prior_model", *UNVERSIONED_ADDITIONS}


_VERSION_2 = _renamed(_VERSION_1, NESTED_SETTINGS)


_VERSION_5 = _VERSION_2 | {"user_tasks", "best_metric", "threads", "objective_modules", *TRAINING_CONTROLS}


_VERSION_6 = _VERSION_5 - {f"priors.{k}" for k in PRIORS_5} - {"model.sts_scale"} | {"prior_weights", "prior_models",
                                                                                      "model.spans"}


MIGRATIONS: tuple[Migration, ...] = (
    Migration(from_unversioned, _VERSION_1),
    Migration(nest_settings, _VERSION_2, _OBJECTIVE_OPTIONS_2),
    # since version 3 each objective versions its own options (Objective.options_version; config.json's
    # "objective_versions"): the built-in ones' version 1 is _OBJECTIVE_OPTIONS_2
    Migration(keep_tasks, _VERSION_2 | {"user_tasks", "best_metric", "threads", "objective_modules"}),
    Migration(read_as_version_3, _VERSION_2 | {"user_tasks", "best_metric", "threads", "objective_modules"}),
    Migration(add_training_controls, _VERSION_5),
    Migration(per_task_settings, _VERSION_6),
    Migration(per_stream_settings, _VERSION_6 - {f"sst_phrases.{k}" for k in PHRASES_6}
              | {"stream_files", "stream_min_words", "stream_orders"}),
)


CONFIG_VERSION = len(MIGRATIONS)  # the version today's TrainConfig writes


@functools.cache
def software_versions() -> dict[str, str]:
    """The versions of this package and of torch, as config.json records them (the package's where installed)."""
    out = {}
    try:
        out["minbert_multitask_version"] = importlib.metadata.version("minbert-multitask")
    except importlib.metadata.PackageNotFoundError:
        pass  # a checkout on PYTHONPATH: no installed metadata to name
    out["torch_version"] = torch.__version__
    return out


def upgrade(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` with today's fields.

    A file that records its version is a saved run of that version; one without it is a run saved before versions
    were recorded (version 0) when it holds every UNVERSIONED_FIELDS path, else a file of some fields, read from
    version 1 on (nothing filled in). It goes through every migration from its version on. The version keys are
    removed; a version this code does not know is a ValueError saying which it reads.
    """
    d = dict(d)
    for key in SOFTWARE_KEYS:
        d.pop(key, None)
    if VERSION_KEY not in d:
        # every saved run holds the first fields (version 6 STS's span per task: model.spans, not model.sts_scale)
        paths = _paths(d) | ({"model.sts_scale"} if "model.spans" in _paths(d) else set())
        version = 0 if UNVERSIONED_FIELDS <= paths else 1
        nested = sorted({name for name, _ in NESTED_SETTINGS.values() if isinstance(d.get(name), dict)})
        if version == 0 and nested:  # a saved run of version 2 or later that lost its version: not version 0's
            entries = d.get("user_tasks")
            # version 4's task entries say how their labels are matched; one without entries reads alike as 3
            was = 7 if "stream_files" in d else 6 if "prior_weights" in d else \
                5 if set(TRAINING_CONTROLS) <= set(d) else \
                4 if isinstance(entries, dict) and any("label_case" in e for e in entries.values()) else \
                3 if "user_tasks" in d else 2
            raise ValueError(f"{VERSION_KEY} is missing, and the file holds every setting of a saved run with "
                             f"{', '.join(nested)} nested, as version {was} writes them: put back "
                             f'"{VERSION_KEY}": {was}')
    else:
        version = d.pop(VERSION_KEY)
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"{VERSION_KEY}: {version!r} is not a version (a whole number, 0 to {CONFIG_VERSION})")
        if version > CONFIG_VERSION:
            raise ValueError(f"{VERSION_KEY} {version} was written by a newer minbert-multitask, which this one "
                             f"(config versions 0 to {CONFIG_VERSION}) cannot read: upgrade it to load this run")
    for migration in MIGRATIONS[version:]:
        d = migration.upgrade(d)
    return d
