"""Tests of tasks/options.py: a config field carries its default and its help text, written once."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import pytest

from tasks.cli import Parser
from tasks.train_config import LpftConfig, SwaConfig, TrainConfig
from tasks.model import ModelConfig
from tasks.options import (add_options, default_of, flag_of_path, help_text, option, options_of, replace_at,
                           shown_default, value_at)


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


@pytest.mark.parametrize("cls", [TrainConfig, ModelConfig, LpftConfig, SwaConfig])
def test_every_config_field_has_its_help_text(cls):
    """Every field of the training and model configs says what it does: the CLI's --help reads it from here."""
    assert [f.name for f in dataclasses.fields(cls) if not help_text(cls, f.name).strip()] == []


@dataclass
class _Optional:
    file: str | None = option("a.csv", "a file on by default")
    model: str | None = option(None, "a directory, off by default")
    size: int | None = option(64, "a number, 'none' for another's", metavar="N")


@dataclass
class _Stage:
    epochs: int = option(0, "epochs of the stage", metavar="N")
    lr: float = option(1e-5, "its learning rate", metavar="LR")
    name: str = option("x", "its own flag", flag="--stage-title")


@dataclass
class _Run:
    lr: float = option(1e-4, "peak learning rate")
    stage: _Stage = option(help="a nested config", factory=_Stage, prefix="st_")


def test_a_nested_config_gives_its_fields_flags_with_its_prefix_and_dotted_dests():
    """A field whose type is a dataclass gives one flag per field of its own, ``--<prefix><field>`` (or the field's
    own flag), in its place, the dest dotted; the defaults shown are the instance's given as ``defaults``."""
    parser = argparse.ArgumentParser()
    dests = add_options(parser, _Run, defaults=_Run(stage=_Stage(epochs=2)))
    assert dests == ["lr", "stage.epochs", "stage.lr", "stage.name"]
    flags = [a.option_strings[0] for a in parser._actions if a.option_strings and a.dest != "help"]
    assert flags == ["--lr", "--st-epochs", "--st-lr", "--stage-title"]
    ns = vars(parser.parse_args(["--st-epochs", "3", "--stage-title", "y"]))
    assert ns == {"lr": 1e-4, "stage.epochs": 3, "stage.lr": 1e-5, "stage.name": "y"}
    assert "(default: 2)" in parser.format_help()
    assert [flag_of_path(_Run, p) for p in dests] == flags
    run = _Run()
    assert value_at(replace_at(run, "stage.lr", 0.5), "stage.lr") == 0.5 and run.stage.lr == 1e-5
    with pytest.raises(KeyError, match="_Stage has no setting 'nope'"):
        flag_of_path(_Run, "stage.nope")
    with pytest.raises(KeyError, match="_Run has no setting 'stage'"):
        flag_of_path(_Run, "stage")


def test_none_turns_off_a_setting_that_is_on_by_default():
    """``X | None`` with a default: the word "none" gives None; a path whose default is None (the embedded model)
    refuses it rather than read it as a folder named none."""
    parser = argparse.ArgumentParser()
    add_options(parser, _Optional)
    assert options_of(parser.parse_args([]), _Optional) == {"file": "a.csv", "model": None, "size": 64}
    assert options_of(parser.parse_args(["--file", "none", "--size", "none"]), _Optional) == \
        {"file": None, "model": None, "size": None}
    with pytest.raises(SystemExit):
        parser.parse_args(["--model", "none"])
    assert options_of(parser.parse_args(["--file", "b.csv", "--size", "8"]), _Optional) == \
        {"file": "b.csv", "model": None, "size": 8}
    with pytest.raises(SystemExit):
        parser.parse_args(["--size", "eight"])


@dataclass
class _Shapes:
    pool: list[list[str]] = option(help="a name, then its runs (repeatable)", factory=list, repeat=True, nargs="+",
                                   metavar=("NAME", "RUN"))
    paired: tuple[str, str] | None = option(None, "two names", nargs=2, metavar=("PARENT", "CHANGE"))
    step: str | None = option(None, "a child's own flag", hidden=True)


def test_a_repeated_flag_takes_several_values_each_time_and_a_fixed_count_takes_exactly_that_many():
    """``repeat`` with ``nargs``: --pool A r1 r2 --pool B r3 is [[A, r1, r2], [B, r3]]; ``nargs=2`` takes two values,
    no more, no fewer; a tuple of metavars names each value in --help."""
    parser = Parser(prog="x")
    add_options(parser, _Shapes)
    args = parser.parse_args(["--pool", "a", "r1", "r2", "--pool", "b", "r3", "--paired", "a", "b"])
    assert options_of(args, _Shapes) == {"pool": [["a", "r1", "r2"], ["b", "r3"]], "paired": ["a", "b"],
                                         "step": None}
    assert "--pool NAME [RUN ...]" in parser.format_help() and "--paired PARENT CHANGE" in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--paired", "a"])


def test_a_hidden_flag_parses_but_is_not_listed_in_help():
    """``hidden``: a flag a program passes to its own child process, absent from --help, still made from a field
    (its type and default written once)."""
    parser = Parser(prog="x")
    add_options(parser, _Shapes)
    assert parser.parse_args(["--step", "train"]).step == "train"
    assert "--step" not in parser.format_help()
    assert all(getattr(a, "field", None) for a in parser._actions if a.dest != "help")


def test_a_sequences_default_is_shown_as_a_command_line_gives_it():
    """--help shows a list default as the values one would type: one with a space quoted, an empty one as ''."""
    assert shown_default(["--max-train-examples para=all", ""]) == "'--max-train-examples para=all' ''"
    assert shown_default(("sst", "para")) == "sst para" and shown_default([]) == "none"
