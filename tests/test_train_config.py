"""Tests of tasks/train_config.py: TrainConfig's checks (configs saved by earlier versions: tests/test_config_versions.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tasks.train_config import NESTED, TrainConfig, eval_config
from tests.helpers import tiny_train_config


@pytest.mark.parametrize("field, value", [("layer_lr_decay", 0.0), ("layer_lr_decay", 1.5), ("head_lr_scale", 0.0),
                                          ("reinit_layers", -1)])
def test_bad_factors_are_refused(tiny_env, tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        tiny_train_config(tiny_env, tmp_path / "r", **{field: value}).validate()


def test_a_limit_below_a_tasks_batch_is_refused_but_not_below_the_phrases_batch():
    """--limit under the batch size leaves every batch of a task partial: refused. The phrases' own larger batch
    (--sst-phrases-batch-size) is not checked: a smoke run (--limit 32) of a recipe with phrases takes them in
    one partial batch."""
    with pytest.raises(ValueError, match="limit=16 is smaller than the batch size 32"):
        TrainConfig(limit=16).validate()
    TrainConfig(limit=32, stream_files={"phrases": "p.csv"}, task_batch_size={"phrases": 64}).validate()


def _outcome(argv: list[str]):
    """The config value a command line gives at ``dest``, or "refused" (an argument error, exit status 2)."""
    from tasks.arguments import config_for
    try:
        return config_for(argv)
    except (ValueError, OSError):
        return "refused"
    except SystemExit as e:
        assert e.code == 2
        return "refused"


def test_none_reads_alike_from_a_config_file_and_the_command_line(tmp_path, capsys):
    """Every field of every config (TrainConfig, ModelConfig, each objective's) given "none" in a --config file and
    on the command line: the same value, or refused both ways, never a traceback ("none" is None exactly where the
    flag takes none)."""
    import argparse

    from tasks.arguments import build_parser, get_path
    parser = build_parser()
    checked = 0
    for action in parser._actions:
        head, _, rest = action.dest.partition(".")
        if not hasattr(action, "field") or head not in (*NESTED, "objectives") and action.field[0] is not TrainConfig:
            continue
        flag, dest = action.option_strings[0], action.dest
        extra = ["--objective", dest.split(".")[1]] if dest.startswith("objectives.") else []
        name = rest.partition(".")[0]
        dest, _, key = dest.partition("@")  # a spelled flag (--sst-phrases: stream_files' phrases) sets its map's key
        head, _, rest = dest.partition(".")
        value = {key: "none"} if key else "none"
        doc = {"objectives": {name: {rest.partition(".")[2]: "none"}}} if head == "objectives" else \
            {head: {rest: value}} if rest else {dest: value}
        path = tmp_path / f"{dest}.json"
        path.write_text(json.dumps(doc))
        from_file = _outcome(["--config", str(path)] + ([] if head != "objectives" else []))
        on_line = _outcome([flag, "none"] + extra) if not isinstance(
            action, (argparse._StoreTrueAction, argparse.BooleanOptionalAction)) else "refused"
        if from_file != "refused" and on_line != "refused":
            if key:  # (a file's map replaces the default's; a flag's item updates it)
                assert get_path(from_file, dest).get(key, "-") == get_path(on_line, dest).get(key, "-"), (dest, key)
            else:
                assert get_path(from_file, dest) == get_path(on_line, dest), dest
        else:
            assert from_file == on_line == "refused", (dest, from_file if from_file == "refused" else
                                                       get_path(from_file, dest))
        checked += 1
    capsys.readouterr()
    assert checked > 100


def test_a_phrase_setting_given_both_ways_is_refused_and_either_spelling_is_one_run(capsys):
    """--loss-weights phrases=W is --sst-phrases-weight W (and so for the phrases' file, batch size, count an epoch,
    fewest words and order): either spelling makes the same config, both at once are refused."""
    from tasks.arguments import config_for
    with pytest.raises(SystemExit):
        config_for(["--loss-weights", "phrases=0.5", "--sst-phrases-weight", "2"])
    assert "--sst-phrases-weight and --loss-weights phrases=... set one setting" in capsys.readouterr().err
    for general, own in ((["--loss-weights", "phrases=0.5"], ["--sst-phrases-weight", "0.5"]),
                         (["--max-train-examples", "phrases=100"], ["--sst-phrases-per-epoch", "100"]),
                         (["--task-batch-size", "phrases=8"], ["--sst-phrases-batch-size", "8"]),
                         (["--stream-files", "phrases=data/sst-phrases-train.csv"],
                          ["--sst-phrases", "data/sst-phrases-train.csv"]),
                         (["--stream-files", "phrases=none"], ["--sst-phrases", "none"]),
                         (["--stream-min-words", "phrases=3"], ["--sst-phrases-min-words", "3"]),
                         (["--stream-orders", "phrases=first"], ["--sst-phrases-order", "first"])):
        assert config_for(general) == config_for(own) != config_for([]), general


def test_the_phrases_take_ssts_declared_cap_and_batch_wherever_the_maps_leave_them_out(tmp_path):
    """SST's phrases train 17,088 an epoch in batches of 64 as SST's entry declares (tasks/cs224n/sst.json) unless a
    per-stream map names them: a --config file or a TrainConfig that gives a map without them (a file's map
    replaces the default's) keeps those, and a run saved with the phrases off and read again with --sst-phrases
    FILE trains them so; equal settings spelt otherwise (the batch size as --batch-size's, a weight of 1) are one
    run (``acting``)."""
    from tasks.arguments import config_for
    for doc in ({"task_batch_size": {"sst": 16}, "schedule": "round_robin"}, {"max_train_examples": {"para": 100}}):
        (tmp_path / "some.json").write_text(json.dumps(doc))
        for cfg in (config_for(["--config", str(tmp_path / "some.json")]), TrainConfig(**doc)):
            assert (cfg.resolve().caps["phrases"], cfg.resolve().batch_sizes["phrases"]) == (17088, 64), doc
    for off in (["--sst-phrases", "none"], ["--preset", "baseline"], ["--tasks", "sts", "para"]):
        (tmp_path / "off.json").write_text(json.dumps(config_for(off).to_dict()))
        on = config_for(["--config", str(tmp_path / "off.json"), "--tasks", "sst", "para", "sts", "--sst-phrases",
                         "sst-phrases-train.csv"])
        assert (on.resolve().caps["phrases"], on.resolve().batch_sizes["phrases"]) == (17088, 64), off
    assert config_for(["--sst-phrases-batch-size", "none"]).resolve().batch_sizes["phrases"] == 32
    assert config_for(["--sst-phrases-batch-size", "none"]).acting() == \
        config_for(["--sst-phrases-batch-size", "32"]).acting()
    assert config_for(["--sst-phrases-weight", "1"]).acting() == config_for([]).acting() == \
        config_for(["--task-batch-size", "phrases=64", "--max-train-examples", "phrases=17088"]).acting()
    assert config_for(["--max-train-examples", "phrases=all"]).resolve().caps["phrases"] == 17088  # as before
    assert config_for(["--task-batch-size", "phrases=all"]).resolve().batch_sizes["phrases"] == 64  # as before: its own


def test_a_run_of_a_glue_task_keeps_its_entry_and_loads_it_back():
    """A run on a GLUE task keeps the task's entry in config.json ("user_tasks", as a task file's), so that a later
    package cannot change what it predicts: the entry loads back equal to the package's; one that differs from the
    package's is refused naming what differs; a run saved before it kept one (none in its file) takes the
    package's."""
    from tasks.task import get_task

    cfg = TrainConfig(tasks=("sst", "rte"))
    saved = cfg.to_dict()
    assert saved["user_tasks"] == {"rte": get_task("rte").to_dict()}
    assert TrainConfig.from_dict(saved) == cfg
    other = {**saved["user_tasks"]["rte"], "classes": ["not_entailment", "entailment"]}
    with pytest.raises(ValueError, match=r"task 'rte' is already declared otherwise \(by this package's "
                                         r"tasks/glue/rte.json\): classes .* there, .* here"):
        TrainConfig.from_dict({**saved, "user_tasks": {"rte": other}})
    before = TrainConfig.from_dict({**saved, "user_tasks": {}})
    assert before.user_tasks == saved["user_tasks"]


def test_an_evaluation_refuses_a_thread_count_below_one_as_training_does():
    """--eval-only --threads 0 is refused in one sentence by eval_config, as validate refuses it for training,
    instead of reaching torch.set_num_threads (a RuntimeError)."""
    saved = TrainConfig(out_dir="unused")
    with pytest.raises(ValueError, match="threads must be at least 1"):
        eval_config(saved, {"threads": 0})
    with pytest.raises(ValueError, match="threads must be at least 1"):
        dataclasses.replace(saved, threads=0).validate()
    assert eval_config(saved, {"threads": 2}).threads == 2


def test_a_config_resolves_its_tasks_in_itself_and_declares_none_in_the_process(tmp_path):
    """A config's tasks are its own (TrainConfig.entries: the package's and its task files'): building one declares
    nothing process-wide, so two configs whose task files declare one name otherwise live side by side, each
    resolving its own, and a third without it does not know the name."""
    from tasks.task import task_names
    from tasks.task_file import read_task_file
    from tests.helpers import three_class_task

    before = task_names()
    three = read_task_file(three_class_task(tmp_path / "a"))
    two = read_task_file(three_class_task(tmp_path / "b", labels=lambda i: ("pos", "neg")[i % 2]))
    assert (three.name, two.name) == ("topic", "topic") and three != two
    a = TrainConfig(tasks=("sst", "topic"), user_tasks=[three], max_train_examples={},
                    dev_max_examples={})
    b = dataclasses.replace(a, user_tasks=[two])
    a.validate()
    b.validate()
    assert a.entries["topic"].num_classes == 3 and b.entries["topic"].num_classes == 2
    assert a.entries["sst"] is b.entries["sst"]  # the package's, shared
    assert task_names() == before and "topic" not in TrainConfig().entries
    with pytest.raises(ValueError, match=r"unknown task\(s\) \['topic'\]"):
        TrainConfig(tasks=("sst", "topic"), max_train_examples={}, dev_max_examples={}).validate()


def test_a_runs_tasks_are_a_mapping_whose_unknown_name_is_one_line():
    """TrainConfig.entries behaves as a Mapping (``in`` on its items, ``dict()``), and an unknown name is one line
    naming the known tasks, caught as a ValueError as a config's other refusals are."""
    entries = TrainConfig().entries
    sst = entries["sst"]
    assert ("sst", sst) in entries.items() and ("nope", sst) not in entries.items()
    assert dict(entries)["sst"] is sst and entries.get("nope") is None
    with pytest.raises(ValueError) as refused:
        entries["nope"]
    assert str(refused.value).startswith("unknown task 'nope'; tasks are ['sst', 'para', 'sts'")
    with pytest.raises(KeyError):
        entries["nope"]
