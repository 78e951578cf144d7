"""Config fields that carry their own flag, and the one mechanism that turns them into a command's flags.

Every setting is a dataclass field written once with ``option``: its default, its help, and what
its flag needs that the type does not say (choices, the keys of a STREAM=VALUE map, a metavar, a
flag name of its own). ``add_options`` gives a parser (or an argument group) one flag per field of a
dataclass (transformers' ``HfArgumentParser`` for this project): the type comes from the field's
type hint, the help from ``option``, the default shown beside it from the field. Every command
builds its flags this way: the train command from TrainConfig, ModelConfig, each objective's Config
and its own ``Command`` fields (tasks/arguments.py), pretrain from PretrainConfig, the others and every
experiment and benchmark script from their own small dataclasses (the flags the experiments' sweeps
share from one, experiments.sweep.SweepOptions).

Type hints become flags so:
    bool                   --x (store_true); --x / --no-x when ``negatable`` (or the default is True or None)
    int, float, str        --x VALUE (a float flag refuses NaN and infinities: tasks.cli.Parser)
    Literal[...] / choices --x CHOICE
    tuple[T, ...], list[T] --x V [V ...] (``nargs``, default "*"), or --x V --x V (``repeat``)
    list[list[T]]          --x V [V ...] --x V [V ...] (``repeat`` with ``nargs``, default "+")
    dict[str, int|float|str]
                           --x KEY=VALUE [...], KEY one of ``keys`` (an int map's VALUE may be "all": the key
                           is removed), given once or more (``MergeItems``); the command merges the items into
                           the field's mapping. ``spelled`` adds a flag of its own for one key:
                           option(spelled={"--sst-prior": ("sst", HELP)}) makes --sst-prior W the item sst=W
                           (dest "<name>@sst": ``fold_spelled``)
    X | None               as X; a field whose default is not None takes the word "none" for None (how a
                           setting on by default is turned off, as transformers' ``--report_to none``)
    a dataclass            a nested config (TrainConfig's model, swa, ...): a flag per field of its own,
                           --<prefix><field> (``option(prefix=...)``), dest "<name>.<field>"
Another type is a TypeError naming the field (a flag that would silently do nothing is not made).

Usage:
    @dataclass
    class Config:
        lr: float = option(1e-4, "peak learning rate")
        tasks: tuple[str, ...] = option(("sst",), "tasks to train", choices=("sst", "para"), nargs="+")
        caps: dict[str, int] = option(help="per-stream caps", factory=dict, keys=("sst", "nli"))
    add_options(parser, Config)                       # --lr, --tasks, --caps
    args = parser.parse_args(argv); Config(**options_of(args, Config))
    help_text(Config, "lr")                           # "peak learning rate"
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import shlex
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

MISSING = dataclasses.MISSING


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, evaluated once per class: the annotations are strings (PEP 563), and a
    parser asks for them some 400 times."""
    return typing.get_type_hints(cls)


class AnyKey(tuple):
    """``option(keys=AnyKey())``: a KEY=VALUE map whose keys the command checks itself, after parsing (a run's
    streams: its own tasks are known once its task files are read)."""


def option(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | Any = MISSING,
           choices: Sequence[Any] | None = None, keys: Sequence[str] | None = None,
           metavar: str | tuple[str, ...] | None = None,
           nargs: str | int | None = None, flag: str | None = None, negatable: bool | None = None,
           positional: bool = False, repeat: bool = False, group: str | None = None, hidden: bool = False,
           prefix: str = "", spelled: Mapping[str, tuple[str, str]] | None = None) -> Any:
    """A dataclass field with a default (or a ``factory`` for mutable defaults), its help text, and what its flag
    needs beyond the type hint: ``choices``; ``keys`` of a STREAM=VALUE map; ``metavar`` (a tuple names each of a
    fixed number of values); ``nargs`` of a sequence (a count: exactly that many), or ``repeat`` (a list flag given
    once per value: --x A --x B; with ``nargs``, once per group of values: --x A B --x C); ``flag`` when its name is
    not the field's; ``negatable`` for a --no- form; ``positional``; the ``group`` of --help it is listed in; and
    ``hidden``, a flag left out of --help (one a program passes to its own child process). A field whose type is a
    dataclass (a nested config) gives one flag per field of its own, ``--<prefix><field>``. ``spelled``: a KEY=VALUE
    map's flags of one key each, {flag: (key, help)} (``fold_spelled``)."""
    meta = {"help": help, "choices": tuple(choices) if choices is not None else None,
            "keys": keys if isinstance(keys, AnyKey) else tuple(keys) if keys is not None else None, "metavar": metavar, "nargs": nargs, "flag": flag,
            "negatable": negatable, "positional": positional, "repeat": repeat, "group": group, "hidden": hidden,
            "prefix": prefix, "spelled": dict(spelled or {})}
    return dataclasses.field(default=default, default_factory=factory, metadata=meta)


def help_text(cls: type, name: str) -> str:
    """The help text of field ``name`` of dataclass ``cls`` ("" when it has none)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.metadata.get("help", "")
    raise KeyError(f"{cls.__name__} has no field {name!r}")


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value, calling its factory when it has one."""
    return f.default_factory() if f.default_factory is not MISSING else f.default


def flag_name(f: dataclasses.Field, prefix: str = "") -> str:
    """The flag of field ``f``: its own (``option(flag=...)``) or ``--<prefix><name>`` in kebab case."""
    return f.metadata.get("flag") or "--" + (prefix + f.name).replace("_", "-")


def nested_config(cls: type, f: dataclasses.Field) -> type | None:
    """The dataclass of field ``f`` of dataclass ``cls`` when the field is a nested config (as TrainConfig's
    ``model``), else None."""
    tp = type_hints(cls)[f.name]
    return tp if dataclasses.is_dataclass(tp) else None


def field_at(cls: type, path: str) -> tuple[type, dataclasses.Field, str]:
    """(the dataclass that holds it, the field, its flag prefix) of a dotted ``path`` of dataclass ``cls``: "lr",
    "model.arch", "swa.epochs" (a KeyError for a path that is not one)."""
    head, _, rest = path.partition(".")
    f = next((x for x in dataclasses.fields(cls) if x.name == head), None)
    inner = nested_config(cls, f) if f is not None else None
    if f is None or bool(rest) != (inner is not None):
        raise KeyError(f"{cls.__name__} has no setting {path!r}")
    if not rest:
        return cls, f, ""
    owner, field, prefix = field_at(inner, rest)
    return owner, field, f.metadata.get("prefix", "") + prefix


def flag_of_path(cls: type, path: str) -> str:
    """The flag of a dotted ``path`` of dataclass ``cls``: "swa.epochs" -> --swa-epochs, "model.arch" -> --arch."""
    _, f, prefix = field_at(cls, path)
    return flag_name(f, prefix)


def value_at(obj: Any, path: str) -> Any:
    """The value at a dotted ``path`` of a dataclass instance (nested configs' fields dotted: "swa.epochs")."""
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def replace_at(obj: Any, path: str, value: Any) -> Any:
    """A copy of dataclass instance ``obj`` with the value at dotted ``path`` replaced (nested configs copied)."""
    head, _, rest = path.partition(".")
    return dataclasses.replace(obj, **{head: replace_at(getattr(obj, head), rest, value) if rest else value})


def key_value(keys: Sequence[str], value_type: type, choices: Sequence[str] = ()) -> Callable[[str], tuple[str, Any]]:
    """argparse type for KEY=VALUE items, KEY one of ``keys``; VALUE "all" (an int map's) removes the key (REMOVED);
    "none" is the None of an ``X | None`` map's (a value it keeps: ``keeps_none``)."""
    optional = _unwrap(value_type) is not value_type
    value_type = _unwrap(value_type)

    def parse(text: str) -> tuple[str, Any]:
        key, sep, raw = text.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"expected STREAM=VALUE (e.g. para=0.1), got {text!r}")
        if not isinstance(keys, AnyKey) and key not in keys:
            raise argparse.ArgumentTypeError(f"{key!r} is not a stream; streams: {', '.join(keys)}")
        if raw == "all" and value_type is int:
            return key, REMOVED
        if raw == "none" and optional:
            return key, None
        try:
            value = value_type(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: {raw!r} is not a valid {value_type.__name__}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r}: {raw!r} is not a finite number")
        if choices and value not in choices:
            raise argparse.ArgumentTypeError(f"{text!r}: {raw!r} is not one of {', '.join(choices)}")
        return key, value

    parse.__name__ = f"{value_type.__name__} pair"
    return parse


class Removed:
    """The value of a KEY=VALUE item that removes its key from the map (an int map's "all": the cap, or batch size,
    that the setting would have without it), where an ``X | None`` map's None is a value it keeps."""

    def __repr__(self) -> str:
        return "all"


REMOVED = Removed()


class MergeItems(argparse.Action):
    """A KEY=VALUE map's flag: each use adds its items to those of the uses before it (argparse's store keeps the
    last use alone: --x a=1 --x b=2 would drop a=1)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        before = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, (list(before) if isinstance(before, list) else []) + list(values))


def keeps_none(cls: type, path: str) -> bool:
    """Whether the KEY=VALUE map at dotted ``path`` of dataclass ``cls`` holds None as a value (an ``X | None`` map's
    "none": a stream turned off), where another map's None (an int map's "all") removes the key."""
    owner, f, _ = field_at(cls, path)
    args = typing.get_args(type_hints(owner)[f.name])
    return len(args) == 2 and _unwrap(args[1]) is not args[1]


def or_none(tp: type) -> Callable[[str], Any]:
    """argparse type of an ``X | None`` field whose default is not None: "none" gives None, anything else X's
    value (argparse names X in its error: "invalid int value")."""
    def parse(text: str) -> Any:
        return None if text == "none" else tp(text)
    parse.__name__ = tp.__name__
    return parse


def json_value(cls: type, name: str, value: Any, where: str = "") -> Any:
    """Field ``name`` of dataclass ``cls`` from a JSON value (a ``--config`` file, a saved run, an objective's
    options), read as its flag reads the same text: the one rule for every value whatever its source.

    A string is parsed by the flag's own type ("none" is None exactly where the flag takes ``none``: an ``X |
    None`` of a scalar whose default is not None); a number or boolean must be of the field's type (an int is a
    float's value; a boolean is no number, a number no boolean); null is the value of an ``X | None`` field only;
    a list is a sequence field's, each item read as the flag reads one; an object is a STREAM=VALUE map's (an int
    map's "all" or null removes the key, as STREAM=all does); a value outside ``choices`` is refused. A refusal is
    a ValueError naming ``where`` (default: the field).
    """
    f = next(x for x in dataclasses.fields(cls) if x.name == name)
    where = where or name
    hint = type_hints(cls)[name]
    tp = _unwrap(hint)
    optional = tp is not hint
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    choices = f.metadata.get("choices") or (args if origin is typing.Literal else None)
    shown = json.dumps(value) if not isinstance(value, str) else repr(value)

    def scalar(item_type: Any, raw: Any) -> Any:
        if item_type is bool:
            if isinstance(raw, bool):
                return raw
            raise ValueError(f"{where}: {shown} is not a boolean: write true or false"
                             + (" (or null for its default)" if optional else ""))
        if isinstance(raw, str):
            if item_type is str:
                return raw
            parse = or_none(item_type) if takes_none(cls, f) else item_type
            try:
                out = parse(raw)
            except ValueError:
                raise ValueError(f"{where}: {shown} is not {'an int' if item_type is int else 'a number'}"
                                 + (" (or none)" if takes_none(cls, f) else "")) from None
        elif isinstance(raw, bool) or not isinstance(raw, (int, float)) or item_type is str:
            raise ValueError(f"{where}: {shown} is not {_type_name(item_type)}")
        elif item_type is int and not (isinstance(raw, int) or float(raw).is_integer()):
            raise ValueError(f"{where}: {shown} is not an int")
        else:
            out = item_type(raw)
        if isinstance(out, float) and not math.isfinite(out):
            raise ValueError(f"{where}: {shown} is not a finite number")
        return out

    if value is None:
        if optional:
            return None
        raise ValueError(f"{where}: null is not a value of this setting ({_type_name(tp)})")
    if origin in (tuple, list):
        if not isinstance(value, list):
            raise ValueError(f"{where}: {shown} is not a list")
        item = args[0] if args and args[0] is not Ellipsis else str
        out = [scalar(item, v) for v in value]
        bad = [v for v in out if choices and v not in choices]
        if bad:
            raise ValueError(f"{where}: {bad[0]!r} is not one of {', '.join(map(str, choices))}")
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: {shown} is not a mapping (an object of STREAM: VALUE)")
        item = args[1] if len(args) == 2 else Any
        out = {}
        for k, v in value.items():
            base = _unwrap(item)
            if base is int and (v == "all" or v is None and base is item):
                continue  # STREAM=all: no cap of its own
            if base is not item and v in ("none", None):
                out[k] = None  # an X | None map's: a value (a stream off, the general batch size)
                continue
            out[k] = v if item is Any else scalar(base, v)
        return out
    if dataclasses.is_dataclass(tp) or tp is Any or origin is not None and origin is not typing.Literal:
        return value  # a nested config (ModelConfig) or a free mapping: read by its own rules
    if isinstance(value, str) and value == "none" and takes_none(cls, f):
        return None
    if isinstance(value, str) and value == "none" and optional and tp is str:
        raise ValueError(f"{where}: 'none' is not a value of this setting: leave it out for its default")
    item = type(args[0]) if origin is typing.Literal else tp
    out = scalar(item, value)
    if choices and out not in choices:
        raise ValueError(f"{where}: {out!r} is not one of {', '.join(map(str, choices))}")
    return out


def _type_name(tp: Any) -> str:
    return {bool: "a boolean", int: "an int", float: "a number", str: "a string"}.get(tp, str(tp))


def not_none(tp: type) -> Callable[[str], Any]:
    """argparse type of an ``X | None`` field whose default is None (a model path: the embedded one): "none" is
    refused (it would be read as a folder or model named none), anything else X's value."""
    def parse(text: str) -> Any:
        if text == "none":
            raise argparse.ArgumentTypeError("'none' is not a value of this setting: leave the flag out for its "
                                             "default")
        return tp(text)
    parse.__name__ = tp.__name__
    return parse


def _unwrap(tp: Any) -> Any:
    """``X`` of ``X | None``."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else tp
    return tp


def shown_default(value: Any) -> str:
    """A default as --help shows it: "" for None (the help says what None means), "none" for an empty one, a
    sequence's values as a command line would give them."""
    if value is None or value is MISSING:
        return ""
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items()) or "none"
    if isinstance(value, (tuple, list)):  # as a command line gives it: a value with a space in quotes
        return " ".join(shlex.quote(str(v)) for v in value) or "none"
    return str(value)


def takes_none(cls: type, f: dataclasses.Field) -> bool:
    """Whether field ``f`` of dataclass ``cls`` takes the word "none" for None: an ``X | None`` of a scalar X whose
    default is not None (``--sst-phrases none``), on the command line and in a ``--config`` file alike."""
    hint = type_hints(cls)[f.name]
    tp = _unwrap(hint)
    return tp in (int, float, str) and tp is not hint and default_of(f) is not None


def flag_kwargs(cls: type, f: dataclasses.Field) -> dict[str, Any]:
    """argparse ``add_argument`` keywords of field ``f`` of dataclass ``cls`` (type, action, nargs, choices,
    metavar), from its type hint and ``option`` metadata."""
    meta = f.metadata
    tp = _unwrap(type_hints(cls)[f.name])
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    default = default_of(f)
    kw: dict[str, Any] = {}
    if tp is bool:
        negatable = meta.get("negatable")
        if negatable is None:
            negatable = default is not False
        return {"action": argparse.BooleanOptionalAction if negatable else "store_true"}
    if origin is typing.Literal:
        kw = {"choices": list(args), "type": type(args[0])}
    elif origin in (tuple, list) and meta.get("repeat"):
        item = args[0] if args else str
        if typing.get_origin(item) in (tuple, list):  # --x A B --x C: a list of groups
            kw = {"action": "append", "nargs": meta.get("nargs") or "+", "type": (typing.get_args(item) or (str,))[0]}
        else:
            kw = {"action": "append", "type": item}
    elif origin in (tuple, list):
        item = args[0] if args and args[0] is not Ellipsis else str
        kw = {"nargs": meta.get("nargs") or "*", "type": item}
    elif origin is dict:
        if not meta.get("keys") and not isinstance(meta.get("keys"), AnyKey):
            raise TypeError(f"{cls.__name__}.{f.name}: a dict field needs option(keys=...) to become a flag")
        kw = {"nargs": meta.get("nargs") or "+", "type": key_value(meta["keys"], args[1], meta.get("choices") or ()),
              "action": MergeItems, "metavar": meta.get("metavar") or "STREAM=VALUE"}
    elif tp in (int, float, str):
        optional_str = tp is str and tp is not type_hints(cls)[f.name] and default is None
        kw = {"type": or_none(tp) if takes_none(cls, f) else not_none(tp) if optional_str else tp}
    else:
        raise TypeError(f"{cls.__name__}.{f.name} has type {tp!r}, which has no flag form")
    if meta.get("choices") and origin is not dict:  # a map's are its values' (key_value)
        kw["choices"] = list(meta["choices"])
    if "choices" not in kw and "metavar" not in kw:
        kw["metavar"] = meta.get("metavar") or f.name.split("_")[-1].upper()
    elif meta.get("metavar"):
        kw["metavar"] = meta["metavar"]
    return kw


def add_options(parser: argparse.ArgumentParser | Any, cls: type, *, prefix: str = "", dest_prefix: str = "",
                suppress: bool = False, skip: Sequence[str] = (), required: Sequence[str] = (),
                defaults: Any = None, help_suffix: dict[str, str] | None = None,
                groups: dict[str, Any] | None = None) -> list[str]:
    """One flag per field of dataclass ``cls`` on ``parser`` (or an argument group), in field order; returns their
    dests (``dest_prefix`` + the field's name).

    ``suppress``: the namespace holds only the flags given (argparse.SUPPRESS defaults), so that a caller can
    lay them over a preset or a saved config; --help still shows each field's default. ``skip``: fields that
    are not flags; ``required``: flags a command line must give (fields without a default). ``help_suffix``:
    text added to a field's help. ``groups``: argument groups by the name a field's ``option(group=...)`` gives
    (fields without one go to ``parser``). ``defaults``: an instance whose values are the defaults, else each
    field's own. A nested config's fields become flags in its place (``option(prefix=...)`` before their names,
    dests dotted: "swa.epochs").
    """
    dests = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = getattr(defaults, f.name) if defaults is not None else default_of(f)
        inner = nested_config(cls, f)
        if inner is not None:  # a nested config: its fields' flags, in its place
            dests += add_options(parser, inner, prefix=prefix + f.metadata.get("prefix", ""),
                                 dest_prefix=f"{dest_prefix}{f.name}.", suppress=suppress, defaults=default,
                                 groups=groups)
            continue
        kw = flag_kwargs(cls, f)
        text = f.metadata.get("help", "") + (help_suffix or {}).get(f.name, "")
        shown = shown_default(default)
        if shown and kw.get("action") not in ("store_true", "append") and f.name not in required:
            text += f" (default: {shown})"
        text = argparse.SUPPRESS if f.metadata.get("hidden") else text.replace("%", "%%")  # argparse formats with %
        target = (groups or {}).get(f.metadata.get("group"), parser)
        dest = dest_prefix + f.name
        if f.metadata.get("positional"):
            action = target.add_argument(dest, help=text, **kw)
        elif f.name in required:
            action = target.add_argument(flag_name(f, prefix), dest=dest, help=text, required=True, **kw)
        else:
            action = target.add_argument(flag_name(f, prefix), dest=dest, help=text,
                                         default=argparse.SUPPRESS if suppress else default, **kw)
        action.field = (cls, f.name)  # the field it was made from (tests/test_layout.py checks every flag has one)
        dests.append(dest)
        for flag, (key, about) in f.metadata.get("spelled", {}).items():  # a flag of one key of a KEY=VALUE map
            value_type = typing.get_args(type_hints(cls)[f.name])[1]
            at = shown_default((default or {}).get(key))
            # its value as the map's: "none" is an X | None map's None (a stream off, the general batch size)
            kind = (or_none(_unwrap(value_type)) if _unwrap(value_type) is not value_type else
                    not_none(str) if value_type is str else value_type)
            action = target.add_argument(flag, dest=f"{dest}@{key}", default=argparse.SUPPRESS if suppress else None,
                                         type=kind, choices=f.metadata.get("choices"),
                                         metavar=kw["metavar"].split("=")[-1],
                                         help=(f"{about} (= {flag_name(f, prefix)} {key}=...)"
                                               + (f" (default: {at})" if at else "")).replace("%", "%%"))
            action.field = (cls, f.name)
    return dests


class Spelled(tuple):
    """A KEY=VALUE item that its key's own flag gave (--sst-prior W: the item sst=W of --prior-weights), so that a
    message names the flag the command line used (``given_flag``)."""


def fold_spelled(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """Parsed flags of dataclass ``cls`` by dest, each spelled flag's value (dest "<path>@<key>":
    ``option(spelled=...)``) made an item of its map's ("<path>": [(key, value), ...]); a key given both ways is a
    ValueError naming both flags."""
    out = {k: v for k, v in values.items() if "@" not in k}
    for dest, value in values.items():
        if "@" in dest:
            path, key = dest.split("@", 1)
            items = list(out.get(path) or ())
            if key in dict(items):
                raise ValueError(f"{spelled_flag(cls, path, key)} and {flag_of_path(cls, path)} {key}=... set one "
                                 "setting: give it once")
            out[path] = items + [Spelled((key, value))]
    return out


def spelled_flags(cls: type, path: str) -> list[str]:
    """The flags of single keys (``option(spelled=...)``) of the KEY=VALUE map at ``path`` of dataclass ``cls``."""
    return list(field_at(cls, path)[1].metadata.get("spelled", {}))


def given_flag(cls: type, given: Mapping[str, Any], path: str, key: str, value: Any = None) -> str:
    """How a command line's flags (``given``: parsed, by dotted path) set ``key`` of the KEY=VALUE map at ``path``
    (to ``value``): by its own flag where an item came so (``Spelled``: --sst-phrases-batch-size 0), else by the
    map's (--task-batch-size phrases=0)."""
    own = any(isinstance(item, Spelled) and item[0] == key for item in given.get(path) or ())
    return spelled_flag(cls, path, key, value) if own else map_flag(cls, path, key, value)


def spelled_flag(cls: type, path: str, key: str, value: str | None = None) -> str:
    """How a command line sets ``key`` of the KEY=VALUE map at ``path`` of dataclass ``cls`` (to ``value``): its own
    flag (``option(spelled=...)``: --sst-prior, --sst-prior 0), else the map's flag with the key (--prior-weights
    mood=..., --prior-weights mood=0)."""
    own = own_flag(cls, path, key)
    if own:
        return own if value is None else f"{own} {value}"
    return map_flag(cls, path, key, value)


def map_flag(cls: type, path: str, key: str, value: Any = None) -> str:
    """The KEY=VALUE map's flag at ``path`` of dataclass ``cls`` with the item ``key`` (= ``value``): --prior-weights
    mood=..., --task-batch-size phrases=16."""
    _, f, prefix = field_at(cls, path)
    return f"{flag_name(f, prefix)} {key}={'...' if value is None else value}"


def own_flag(cls: type, path: str, key: str) -> str | None:
    """The flag of its own (``option(spelled=...)``) that sets ``key`` of the KEY=VALUE map at ``path`` of dataclass
    ``cls`` (--sst-prior for prior_weights' sst), or None."""
    _, f, _ = field_at(cls, path)
    return next((flag for flag, (k, _) in f.metadata.get("spelled", {}).items() if k == key), None)


def options_of(namespace: argparse.Namespace, cls: type, dest_prefix: str = "") -> dict[str, Any]:
    """The values of ``cls``'s fields in a parsed namespace (those present: with ``suppress``, the flags given),
    key=value items turned into the field's mapping."""
    values = vars(namespace)
    out = {}
    for f in dataclasses.fields(cls):
        dest = dest_prefix + f.name
        if dest not in values:
            continue
        value = values[dest]
        if isinstance(value, list) and value and isinstance(value[0], tuple):  # key=value items
            value = {k: v for k, v in value if v is not None}
        out[f.name] = value
    return out
