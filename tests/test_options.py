"""Tests of tasks/options.py: a config field carries its default and its help text, written once."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from tasks.config import TrainConfig
from tasks.model import ModelConfig
from tasks.options import default_of, help_text, option


@dataclass
class _Config:
    lr: float = option(1e-4, "peak learning rate")
    caps: dict[str, int] = option(help="per-stream caps", factory=dict)
    plain: int = dataclasses.field(default=1)


def test_option_carries_its_help_and_default_and_a_factory_gives_fresh_objects():
    """help_text reads the help an option was given ("" for a plain field); default_of gives the default, calling a
    factory for each call, so two configs never share one mutable default."""
    fields = {f.name: f for f in dataclasses.fields(_Config)}
    assert help_text(_Config, "lr") == "peak learning rate" and help_text(_Config, "caps") == "per-stream caps"
    assert help_text(_Config, "plain") == ""
    assert default_of(fields["lr"]) == 1e-4 and default_of(fields["plain"]) == 1
    first, second = default_of(fields["caps"]), default_of(fields["caps"])
    assert first == {} and first is not second
    assert _Config().caps is not _Config().caps
    with pytest.raises(KeyError, match="_Config has no field 'nope'"):
        help_text(_Config, "nope")


@pytest.mark.parametrize("cls", [TrainConfig, ModelConfig])
def test_every_config_field_has_its_help_text(cls):
    """Every field of the training and model configs says what it does: the CLI's --help reads it from here."""
    assert [f.name for f in dataclasses.fields(cls) if not help_text(cls, f.name).strip()] == []
