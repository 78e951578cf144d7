"""Config fields that carry their own help text: written once, read by the CLI and the docs.

Usage:
    @dataclass
    class Config:
        lr: float = option(1e-4, "peak learning rate")
        caps: dict[str, int] = option(help="per-stream caps", factory=dict)
    help_text(Config, "lr")            # "peak learning rate"
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


def option(default: Any = dataclasses.MISSING, help: str = "", *,
           factory: Callable[[], Any] | Any = dataclasses.MISSING) -> Any:
    """A dataclass field with a default (or a ``factory`` for mutable defaults) and its help text."""
    return dataclasses.field(default=default, default_factory=factory, metadata={"help": help})


def help_text(cls: type, name: str) -> str:
    """The help text of field ``name`` of dataclass ``cls`` ("" when it has none)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.metadata.get("help", "")
    raise KeyError(f"{cls.__name__} has no field {name!r}")


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value, calling its factory when it has one."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
