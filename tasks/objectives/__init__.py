"""Plug-in training objectives: one interface, a registry by name.

Usage:
    from tasks.objectives import build_objectives
    objectives = build_objectives({"mnr": {"scale": 20.0}}, model)
    for obj in objectives:
        if obj.applies_to(task):
            terms.update(obj(model, task, batch, out))   # named loss terms

An objective is an ``nn.Module`` subclass of :class:`Objective` in its own
file under tasks/objectives/ (imported by ``import_all``), with:
- ``name``: its registry key (a duplicate name raises at import);
- ``Config``: a dataclass of its hyper-parameters, subclassing :class:`ObjectiveConfig` (so ``weight``, the
  factor on its terms, and ``tasks`` always exist); each field, written with ``tasks.options.option`` (its
  default and help), becomes the train command's flag ``--<name>-<field>`` in kebab case (tasks/arguments.py:
  ``match_tuning``'s ``temperature`` is ``--match-tuning-temperature``);
- ``kinds``: the kinds of task it supports, by name (tasks/task.py): any task of those kinds, a user's too, may be
  named in its config, and so may any stream a task declares (a task file's ``"phrases"``: ``<name>_phrases``),
  by the kind of the task whose head it trains; ``tasks``: the built-in streams it can take (``"nli"`` is the NLI triplet stream,
  ``"phrases"`` the SST phrases), enforced here: a config naming another stream, or a task of another kind, is
  refused, naming both; ``default_tasks`` the ones it takes when its config names none (default: ``tasks``).
  What it computes from a head's outputs differs by kind: a table of its rules by the class of kind
  (``{Classes: ..., Binary: ..., Scores: ...}``), read through ``kind_rule``, which refuses a kind it has no
  rule for instead of treating it as another (a new kind is never trained as a regression);
- ``forward(model, task, batch, out) -> dict[str, Tensor]``: unweighted loss terms;
  ``out`` is the head's TaskOutput for this batch (None for the "nli" stream).

Everything else the training loop, the final evaluation or the CLI may ask of
an objective is declared on :class:`Objective` below with a default that does
nothing; an objective overrides what it needs. The loop never asks
``hasattr`` and nothing outside this package names a concrete objective.

The trainer multiplies each term by ``term_weight(term)`` (``config.weight``) and the
task's loss weight, sums, and logs every unweighted term under ``<task>/<objective>.<term>``.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol, TypeVar

import torch
from torch import nn

from tasks.options import json_value, option
from tasks.task import PACKAGE, Kind, Tasks

REGISTRY: dict[str, type["Objective"]] = {}

Rule = TypeVar("Rule")


def _defined_in(cls: type) -> str:
    """Where an objective class comes from, for a message: a built-in's file in the package, a plug-in's file, or
    the module that defined it (a script, a test)."""
    import sys

    module = sys.modules.get(cls.__module__)
    if cls.__module__.startswith(__name__ + "."):
        return f"the built-in objective of {cls.__module__.replace('.', '/')}.py"
    if cls.__module__.startswith(_PLUGIN_PACKAGE + ".") and getattr(module, "__file__", None):
        return f"the objective module {module.__file__}"
    return f"{cls.__module__}.{cls.__qualname__}"


class NameTaken(ValueError):
    """An objective whose name another registered objective has (fairseq's registries refuse it alike)."""

    def __init__(self, name: str, owner: type, new: type) -> None:
        self.name, self.owner = name, owner
        super().__init__(f"objective name {name!r} is taken by {_defined_in(owner)}, and {_defined_in(new)} defines "
                         "it again: give one of them another name")


@dataclass
class ObjectiveConfig:
    """The fields every objective's ``Config`` has; subclass it (``class MyConfig(ObjectiveConfig)``) and redeclare
    a field to change its default or help."""

    weight: float = option(1.0, "the factor the trainer puts on every term of the objective")
    tasks: tuple[str, ...] = option((), "the streams it applies to; empty = its default streams")

    def __post_init__(self) -> None:
        self.tasks = tuple(self.tasks)  # a list from JSON or the command line


class Inference(Protocol):
    """An objective's change to the final evaluation (``Objective.inference``); KNN-BERT's vote is one.

    ``classes`` gets one split's datasets and returns, for the tasks it changes, {variant: {task: predicted
    classes (N,)}}: variant "" is the objective's prediction, which the leaderboard files take when ``replaces``;
    the others are scored beside it. The evaluator scores every variant on a labelled split (the plain metrics
    with those tasks' scores replaced) into the final record's ``key`` block ("<split>" for "", "<split>_<variant>"
    for the others), with ``info``, and logs them under ``name``.
    """

    key: str
    name: str
    info: dict[str, Any]
    replaces: bool

    def classes(self, split: str, datasets: dict[str, Any]) -> dict[str, dict[str, torch.Tensor]]: ...


class Objective(nn.Module, abc.ABC):
    name: ClassVar[str] = ""
    Config: ClassVar[type] = ObjectiveConfig
    # The kinds of task it supports (tasks.task.KINDS): a config may name any task of these kinds.
    kinds: ClassVar[tuple[str, ...]] = ()
    # The built-in streams it can take: a config naming another stream, or a task of another kind, is refused
    # (``objective_config``).
    tasks: ClassVar[tuple[str, ...]] = ()
    # The streams it takes when its config names none; None: every one of ``tasks``.
    default_tasks: ClassVar[tuple[str, ...] | None] = None
    # True when the objective reads Siamese features (cos_1/cos_2, pooled_1/2): the
    # config check refuses it with pair_encoding cross before any work starts.
    needs_siamese: ClassVar[bool] = False
    # True when the loss couples the examples of a batch (in-batch negatives, batch mixing, a
    # queue filled from the batch). Under torchrun such an objective sees each rank's shard of
    # the global batch as its batch (tasks/training/distributed.py); the trainer warns.
    batch_coupled: ClassVar[bool] = False
    # Config fields that act only at inference, so --eval-only may change them.
    inference_options: ClassVar[tuple[str, ...]] = ()
    # The version of its options and their names at it. A saved run records each objective's version
    # (config.json's "objective_versions") and stores only the options it changed: an option added, renamed or
    # removed needs a new version and an ``upgrade_options`` step that gives an older run's options the values it
    # trained with. ``option_names`` (None: not declared) is what a test holds the Config's fields against.
    options_version: ClassVar[int] = 1
    option_names: ClassVar[frozenset[str] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.name:
            return  # an abstract helper base
        if not (isinstance(cls.Config, type) and issubclass(cls.Config, ObjectiveConfig)):
            raise TypeError(f"objective {cls.name!r}: its Config must subclass tasks.objectives.ObjectiveConfig "
                            "(which gives it weight and tasks)")
        if cls.name in REGISTRY:
            raise NameTaken(cls.name, REGISTRY[cls.name], cls)
        REGISTRY[cls.name] = cls

    def __init__(self, config: Any, model: nn.Module | None = None):
        super().__init__()
        self.config = config

    @classmethod
    def upgrade_options(cls, options: dict[str, Any], version: int) -> dict[str, Any]:
        """A saved run's options of this objective at ``version`` as today's version reads them (version 1, the
        first, as they are); a version newer than this code's is refused."""
        if version > cls.options_version:
            raise ValueError(f"objective {cls.name!r}: its options were saved at version {version}, and this code "
                             f"reads versions up to {cls.options_version}: update minbert-multitask (or the "
                             "objective's file)")
        return options

    def term_weight(self, term: str) -> float:
        """The factor the trainer puts on the unweighted term ``term``: ``weight``, times the term's own
        coefficient where the method has one per term (RIFT's β and α)."""
        return float(self.config.weight)

    @property
    def task_loss_scale(self) -> float:
        """The factor on the head's own loss for the tasks it applies to (SCL: 1 - λ); 1.0 when additive."""
        return 1.0

    @classmethod
    def tasks_of(cls, config: ObjectiveConfig) -> tuple[str, ...]:
        """The streams an objective with ``config`` applies to: its config's ``tasks`` when set, else
        ``default_tasks`` (else ``tasks``)."""
        return tuple(config.tasks) or (cls.default_tasks if cls.default_tasks is not None else cls.tasks)

    def active_tasks(self) -> tuple[str, ...]:
        return type(self).tasks_of(self.config)

    def applies_to(self, task: str) -> bool:
        return task in self.active_tasks()

    # ---- hooks: each a no-op by default ----------------------------------------------------------------

    @classmethod
    def check_run(cls, config: Any, run_config: Any) -> None:
        """Refuse a run this objective cannot serve (ValueError), before any data is read (distill: teacher files)."""

    def on_train_start(self, model: nn.Module, train_sets: dict[str, Any]) -> None:
        """Before the optimizer is built and a checkpoint loaded, with the run's training datasets by stream."""

    @abc.abstractmethod
    def forward(self, model: nn.Module, task: str, batch: dict, out) -> dict[str, torch.Tensor]:
        """The objective's unweighted loss terms for this batch (may be empty)."""

    def on_step_end(self, model: nn.Module) -> None:
        """After every optimizer step (momentum encoders, queues)."""

    def inference(self, model: nn.Module, tasks: Sequence[str], train_set: Callable[[str], Any], batch_size: int,
                  device: torch.device) -> Inference | None:
        """This objective's change to the final evaluation, or None (the model's predictions stand)."""
        return None


def kind_rule(objective: str, rules: Mapping[type[Kind], Rule], stream: str, kind: Kind | None) -> Rule:
    """``objective``'s rule (``rules``: one per class of kind it takes, tasks/task.py) for ``kind``, the kind of the
    head ``stream``'s batches train (tasks.model.MultitaskBert.kind_of; None: a stream without a head, NLI's); a
    kind it has no rule for is a ValueError naming the objective, the stream, its kind and the kinds it takes, never
    another kind's rule."""
    rule = rules.get(type(kind))
    if rule is None:
        what = "has no head" if kind is None else f"is a {kind.name}{f' ({kind.about})' if kind.about else ''}"
        takes = " or ".join(k.about or k.__name__ for k in rules)
        raise ValueError(f"objective {objective!r} does not take {stream!r}, which {what}: it takes tasks of {takes}")
    return rule


def objective_config(name: str, overrides: dict[str, Any], entries: Tasks | None = None
                     ) -> tuple[type[Objective], ObjectiveConfig]:
    """(the registered class, its checked Config) of objective ``name`` with ``overrides``, the tasks it names
    checked against ``entries`` (a run's tasks, TrainConfig.entries; default: the package's); a ValueError naming
    the objective for an unknown name, an unknown option or a value its Config refuses."""
    entries = entries if entries is not None else PACKAGE
    import_all()
    if name not in REGISTRY:
        raise ValueError(f"objective {name!r} is not registered: no module under tasks/objectives/, no "
                         f"--objective-module and no {PLUGINS_ENV} file defines it (registered: "
                         f"{', '.join(sorted(REGISTRY)) or 'none'})")
    cls = REGISTRY[name]
    known = {f.name for f in fields(cls.Config)}
    bad = set(overrides) - known
    if bad:
        raise ValueError(f"objective {name!r} has no option(s) {sorted(bad)}; options: {sorted(known)}")
    try:
        config = cls.Config(**overrides)
    except (TypeError, ValueError) as e:
        raise ValueError(f"objective {name!r}: {e}") from None
    for t in config.tasks:
        owner = entries.declaring(t)  # a task, or the task whose head a declared stream trains
        head = t if t in entries else owner.name if owner is not None else None
        if t in cls.tasks or (head is not None and entries[head].kind.name in cls.kinds):
            continue
        if head is not None:
            what = f"task {t!r} is" if head == t else f"stream {t!r} trains task {head!r}, which is"
            raise ValueError(f"objective {name!r} supports {' and '.join(cls.kinds)} tasks, and {what} a "
                             f"{entries[head].kind.name}")
        raise ValueError(f"objective {name!r} can take the streams {', '.join(cls.tasks)} (or a task of kind "
                         f"{' or '.join(cls.kinds)}), not {t}")
    return cls, config


def objective_values(settings: Any) -> dict[str, dict[str, Any]]:
    """Objectives' options from JSON (a ``--config`` file, a saved run): each value read as its flag reads it
    (``tasks.options.json_value``), kept in JSON's form (lists stay lists); a ValueError naming
    ``objectives.<name>.<option>``. Unknown names and options are ``objective_config``'s to refuse."""
    if not isinstance(settings, dict) or not all(isinstance(o, dict) for o in settings.values()):
        raise ValueError("objectives: an object of objective name -> its options (an object)")
    import_all()
    out = {}
    for name, options in settings.items():
        cls = REGISTRY.get(name)
        known = {f.name for f in fields(cls.Config)} if cls is not None else set()
        out[name] = {k: (_as_json(json_value(cls.Config, k, v, f"objectives.{name}.{k}")) if k in known else v)
                     for k, v in options.items()}
    return out


def _as_json(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def build_objectives(settings: dict[str, dict[str, Any]], model: nn.Module) -> list[Objective]:
    """Instantiate the named objectives with their config overrides (``objective_config``)."""
    objs = []
    entries = Tasks(getattr(model, "entries", {}).values())  # the model's own tasks (a MultitaskBert's)
    for name, overrides in settings.items():
        cls, config = objective_config(name, overrides, entries)
        objs.append(cls(config, model))
    return objs


def registered_objectives() -> dict[str, type[Objective]]:
    """Every objective under tasks/objectives/, imported so that each registers itself."""
    import_all()
    return dict(REGISTRY)


PLUGINS_ENV = "MINBERT_PLUGINS"  # objective files outside the package, loaded by every command (os.pathsep-separated)


RECORDED = "the run's objective module"  # load_plugin's named_by for a file a saved run recorded (objective_modules)


TRUST_FLAG = "--trust-objective-modules"  # the train command's flag that lets a saved run's recorded files import


def import_all() -> None:
    """Import every objective module so each registers itself: the package's, and the files MINBERT_PLUGINS
    names (an error names MINBERT_PLUGINS)."""
    _import_package()
    for path in filter(None, os.environ.get(PLUGINS_ENV, "").split(os.pathsep)):
        load_plugin(path, named_by=PLUGINS_ENV)


def _import_package() -> None:
    import importlib
    import pkgutil

    for m in pkgutil.iter_modules(__path__):
        if not m.name.startswith("_"):
            importlib.import_module(f"{__name__}.{m.name}")


class ObjectiveFileError(ValueError):
    """A user's objective file that is not there, fails to import, takes a registered name, or is a saved run's
    that the user has not named again nor trusted: a fault of that file or of what named it, never of a checkpoint
    being read (a resume does not fall back from it to another checkpoint)."""


_PLUGIN_PACKAGE = "minbert_plugins"  # the modules load_plugin makes: minbert_plugins.<stem>_<hash of the path>


_PLUGINS: dict[str, Any] = {}  # a plug-in file's resolved path -> its module, imported once


def load_plugin(path: str | os.PathLike[str], named_by: str = "--objective-module") -> None:
    """Import a user's objective file from anywhere (fairseq's --user-dir): the objectives it defines register
    themselves, nothing in the package changes; once per file. The package's objectives are registered first, so
    that a file reusing one of their names is the one refused. A missing file, one that fails to import or one
    that takes a registered name is an ObjectiveFileError naming the file and ``named_by``, who named it
    (--objective-module, MINBERT_PLUGINS, or ``RECORDED``: a saved run's config.json); what the file registered
    before it failed is unregistered."""
    import importlib.util
    import sys
    from pathlib import Path

    file = Path(path).expanduser().resolve()
    if str(file) in _PLUGINS:
        return
    where = f"{PLUGINS_ENV} names {path}" if named_by == PLUGINS_ENV else f"{named_by} {path}"
    if not file.is_file() or file.suffix != ".py":
        remedy = {PLUGINS_ENV: f": correct {PLUGINS_ENV} or unset it",
                  RECORDED: ": the run recorded it there; name where it is now with --objective-module FILE"}
        raise ObjectiveFileError(f"{where}: no such Python file{remedy.get(named_by, '')}")
    _import_package()
    name = f"{_PLUGIN_PACKAGE}.{file.stem}_{abs(hash(str(file))):x}"
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    before = set(REGISTRY)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's code: one line naming the file (MINBERT_VERBOSE=1 keeps the traceback)
        del sys.modules[name]
        for added in set(REGISTRY) - before:
            del REGISTRY[added]
        if isinstance(e, NameTaken):
            raise ObjectiveFileError(f"{where} defines objective {e.name!r}, a name {_defined_in(e.owner)} has: give "
                                     f"the objective in {file.name} another name") from e
        raise ObjectiveFileError(f"{where} failed to import: {type(e).__name__}: {e}") from e
    _PLUGINS[str(file)] = module


def recorded_modules(objectives: Any, modules: Any, trust: bool) -> None:
    """A saved run's own objective files (its config.json's ``objective_modules``), needed when an objective it
    names (``objectives``) is not registered: imported with ``trust`` (--trust-objective-modules, as HF's
    trust_remote_code), else an ObjectiveFileError saying which file and how to name it again. Reading a run imports
    nothing unasked: an objective registered already (its file named again by --objective-module or
    MINBERT_PLUGINS, wherever it now is) needs no file of the run's."""
    if not isinstance(objectives, dict) or not isinstance(modules, (list, tuple)) or not modules:
        return  # malformed values are the config's checks to refuse, naming the field
    missing = [name for name in objectives if name not in registered_objectives()]
    if not missing:
        return
    if trust:
        for module in modules:
            load_plugin(module, named_by=RECORDED)
        return
    from pathlib import Path

    files = ", ".join(str(m) for m in modules)
    there = [str(m) for m in modules if Path(str(m)).is_file()]
    if not there:
        raise ObjectiveFileError(f"objective {missing[0]!r} comes from the run's own file {files}, which is no "
                                 f"longer there: name where it is now with --objective-module FILE (or "
                                 f"{PLUGINS_ENV}=FILE)")
    raise ObjectiveFileError(f"objective {missing[0]!r} comes from the run's own file {files}, and reading a saved run "
                             f"imports no file unless you name it: pass --objective-module {there[0]} (or "
                             f"{PLUGINS_ENV}={there[0]}), or {TRUST_FLAG} to import the file(s) the run recorded")
