"""Tests of tasks/arguments.py, the train command's flags: every flag comes from a config field and reaches it, the
help documents each with its default and paper section, presets, --config, the README's technique flags."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
from pathlib import Path

import pytest

from tasks import arguments
from tasks import train as cli
from tasks.train_config import TrainConfig
from tasks.config_versions import fields_of
from tasks.objectives import registered_objectives
from tests.helpers import unversioned, user_task


COMMAND_FIELDS = {f.name for f in dataclasses.fields(arguments.Command)}


def _default_at(path: str) -> object:
    """The value a config path has before any flag (objective fields: their Config default)."""
    if path.startswith("objectives."):
        _, name, key = path.split(".")
        f = {f.name: f for f in dataclasses.fields(registered_objectives()[name].Config)}[key]
        return f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return arguments.get_path(TrainConfig(), path)


def _non_default(action: argparse.Action) -> tuple[list[str], object]:
    """(argv, expected value at action.dest) that sets the flag to something other than its default."""
    flag = action.option_strings[0]
    if "@" in action.dest:  # a flag of one key's item of a KEY=VALUE map: --sst-prior W, --sst-phrases-batch-size B
        path, _, key = action.dest.partition("@")
        at = _default_at(path).get(key)
        kind = getattr(action.type, "__name__", None)  # an int map's is or_none(int): "none" removes the key
        value = 0.25 if action.type is float else 3 + (at or 0) if kind == "int" else \
            "first" if path == "stream_orders" else "enc"
        return [flag, str(value)], value
    if action.dest in ("prior_weights", "prior_models"):  # per task, merged into the default
        value = 0.25 if action.dest == "prior_weights" else "enc"
        return [flag, f"sts={value}"], {**_default_at(action.dest), "sts": value}
    if isinstance(action, argparse.BooleanOptionalAction):
        default = _default_at(action.dest)
        return ([f"--no-{flag[2:]}"], False) if default is True else ([flag], True)
    if isinstance(action, argparse._StoreTrueAction):
        return [flag], True
    if isinstance(action, argparse._AppendAction):
        return [flag, "mnr"], ["mnr"]
    if action.dest in COMMAND_FIELDS:  # --preset, --checkpoint
        value = action.choices[-1] if action.choices else "some/checkpoint"
        return [flag, value], value
    default = _default_at(action.dest)
    if action.nargs in ("+", "*"):
        if getattr(action.type, "__name__", "").endswith("pair"):  # STREAM=VALUE mappings, merged into the default
            value = 7 if action.type.__name__.startswith("int") else 0.5 if action.type.__name__.startswith(
                "float") else "first" if action.dest == "stream_orders" else "x.csv"
            return [flag, f"sts={value}"], {**default, "sts": value}
        if action.dest == "tasks":  # a subset that keeps para (whose default caps would otherwise go too)
            return [flag, "para", "sts"], ("para", "sts")
        choices = action.choices or ["sts"]
        value = [c for c in choices if c not in (default or ())][:1] or [choices[0]]
        return [flag, *value], value
    if action.choices:
        value = next(c for c in action.choices if c != default)
        return [flag, str(value)], value
    kind = getattr(action.type, "__name__", None)  # an "X | None" field's type is named as X (tasks.options.or_none)
    if kind == "int":
        value = (default or 0) + 3
    elif kind == "float":
        value = (default or 0.0) + 0.0625
    else:
        value = f"{action.dest}-value"
    return [flag, str(value)], value


def test_every_flag_reaches_its_config_field(tmp_path):
    """Each flag of the parser, given a non-default value, sets exactly its field of TrainConfig, of a config nested in
    it (ModelConfig, the priors', ...) or of an objective (--task-file: and adds its task to the run's tasks)."""
    parser = arguments.build_parser()
    actions = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    assert len(actions) > 40
    seen = set()
    task_file = tmp_path / "topic.json"
    (tmp_path / "t.csv").write_text("text,label\na,0\nb,1\n")
    task_file.write_text('{"name": "topic", "train": "t.csv", "dev": "t.csv", "text": "text", "label": "label"}')
    for action in actions:
        argv, expected = _non_default(action)
        if action.dest == "task_files":
            argv, expected = [action.option_strings[0], str(task_file)], (str(task_file.resolve()),)
        if action.dest == "objective_modules":  # a file of one's own (it may define no objective)
            (tmp_path / "mine.py").write_text("x = 1\n")
            argv, expected = [action.option_strings[0], str(tmp_path / "mine.py")], (str((tmp_path / "mine.py").resolve()),)
        command, explicit = arguments.parse(argv, parser)
        if action.dest in COMMAND_FIELDS:
            assert getattr(command, action.dest) == expected, action.option_strings
            assert not explicit
            continue
        path, _, key = action.dest.partition("@")  # --sst-prior: the item sst of prior_weights
        assert set(explicit) == {path}, (argv, explicit)
        if action.dest.startswith("objectives."):
            command.objective = [action.dest.split(".")[1]]
        cfg = arguments.config_from_flags(command, explicit)
        got, default = arguments.get_path(cfg, path), _default_at(path)
        if key:
            got, default = got.get(key), default.get(key)
        if isinstance(got, tuple) and isinstance(expected, list):  # TrainConfig keeps its sequences as tuples
            expected = tuple(expected)
        assert got == expected, (argv, got, expected)
        assert got != default, argv
        # and nothing else moved
        base = arguments.config_from_flags(dataclasses.replace(command), {})
        diff = {k for k, v in cfg.to_dict().items() if v != base.to_dict()[k]}
        top = path.split(".")[0]
        # (--tasks para sts: the phrases' default file follows it, as the Quora cap does)
        assert diff == ({top, "tasks", "user_tasks"} if top == "task_files" else
                        {top, "stream_files"} if top == "tasks" else
                        {top}), (argv, diff)
        seen.add(path)
    train_fields = fields_of(TrainConfig) - {"objectives", "user_tasks"}  # user_tasks: --task-file sets it; nested configs' fields dotted: "model.arch"
    assert train_fields <= seen, sorted(train_fields - seen)
    for name, cls in registered_objectives().items():
        assert {f"objectives.{name}.{f.name}" for f in dataclasses.fields(cls.Config)} <= seen, name


def test_help_documents_every_flag_with_paper_references(capsys):
    """--help lists every flag with text; the paper's hyper-parameters cite their section."""
    parser = arguments.build_parser()
    for action in parser._actions:
        assert action.help, action.option_strings
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = capsys.readouterr().out
    by_flag = {s: a for a in parser._actions for s in a.option_strings}
    for flag in ("--lr", "--lr-decay", "--schedule", "--loss-weights", "--head-dropout", "--fcn-size", "--arch",
                 "--encoder-dropout", "--batch-size", "--epochs", "--nli", "--preset", "--baseline-proj-size",
                 "--lp-epochs", "--lp-lr", "--swa-epochs", "--swa-lr", "--predict-train", "--distill-weight"):
        assert flag in text and "§" in by_flag[flag].help, flag


# ---- presets --------------------------------------------------------------------------------------------------


def _preset(name: str, *argv: str) -> TrainConfig:
    return arguments.config_for(["--preset", name, *argv])


def test_baseline_preset_is_paper_section_4_1():
    """baseline: §4.1 heads (Siamese, linear, dropout 0.3), lr 1e-5 constant, sequential schedule, all data."""
    cfg = _preset("baseline")
    m = cfg.model
    assert (m.arch, m.pair_encoding, m.pooling, m.head_dropout, m.baseline_proj_size, m.spans) == \
        ("baseline", "siamese", "pooler", 0.3, 32, {"sts": 5.0})
    assert (cfg.lr, cfg.lr_schedule, cfg.schedule, cfg.epochs, cfg.batch_size) == (1e-5, "constant", "sequential", 10, 16)
    assert cfg.objectives == {} and not cfg.nli and cfg.loss_weights == {}
    assert cfg.max_train_examples == {} and cfg.dev_max_examples == {} and cfg.encoder_dropout == 0.3
    assert cfg.stream_files == {"phrases": None} and cfg.task_batch_size == {}
    assert not any("phrases" in _preset(name).resolve().extra for name in ("b1", "b2", "b3"))
    assert _preset("b1", "--sst-phrases", "sst-phrases-train.csv").resolve().batch_sizes["phrases"] == 64  # as before


def test_b_presets_are_paper_section_5_4():
    """b3 = b1 arch + even batching + para 0.1 + MNR + SimCSE on STS + lr 1e-5 − 4e-7/epoch + head dropout 0.3 + FCN 256;
    b2 = b3 without head dropout; b1 = b2 + the NLI stream trained by MNR."""
    b3, b2, b1 = _preset("b3"), _preset("b2"), _preset("b1")
    for cfg in (b1, b2, b3):
        assert (cfg.model.arch, cfg.model.fcn_size, cfg.model.pair_encoding) == ("b1", 256, "siamese")
        assert (cfg.schedule, cfg.loss_weights, cfg.lr, cfg.lr_schedule, cfg.lr_decay) == \
            ("even", {"para": 0.1}, 1e-5, "epoch_decay", 4e-7)
        assert set(cfg.objectives) == {"mnr", "simcse"} and cfg.objectives["simcse"]["tasks"] == ["sts"]
        assert cfg.encoder_dropout == 0.3 and cfg.max_train_examples == {}
    assert b3.model.head_dropout == 0.3 and b2.model.head_dropout == 0.0 and b1.model.head_dropout == 0.0
    assert not b3.nli and not b2.nli and b1.nli
    assert b3.objectives["mnr"]["tasks"] == ["sts"] and b1.objectives["mnr"]["tasks"] == ["sts", "nli"]
    assert dataclasses.replace(b2, model=b3.model) == b3
    assert dataclasses.replace(b1, nli=False, objectives=b2.objectives) == b2


def test_the_quick_preset_is_the_fronts_point_at_about_a_third_of_the_default():
    """quick: the time-versus-score front's e1-half (one epoch of fewer Quora pairs and phrases), every other
    setting the default's; flags override."""
    from experiments.front import POINTS

    quick, default = _preset("quick").to_dict(), TrainConfig().to_dict()
    assert quick == arguments.config_for(POINTS["e1-half"][1]).to_dict()
    assert {k for k in default if quick[k] != default[k]} == {
        "epochs", "max_train_examples", "dev_max_examples"}
    assert quick["epochs"] * 2 == default["epochs"]
    assert quick["max_train_examples"] == {"para": 12000, "phrases": 8544}
    assert _preset("quick", "--seed", "4").seed == 4


def test_explicit_flags_override_the_preset():
    """--preset b3 --lr 2e-5 --head-dropout 0.1 --mnr-scale 10: the flags win, the rest stays the paper's."""
    cfg = _preset("b3", "--lr", "2e-5", "--head-dropout", "0.1", "--mnr-scale", "10", "--loss-weights", "sst=2")
    assert cfg.lr == 2e-5 and cfg.model.head_dropout == 0.1 and cfg.objectives["mnr"]["scale"] == 10.0
    assert cfg.loss_weights == {"para": 0.1, "sst": 2.0} and cfg.schedule == "even"
    ablation = _preset("b3", "--no-objective", "mnr")
    assert set(ablation.objectives) == {"simcse"}


def test_preset_with_an_unregistered_objective_names_it(monkeypatch, capsys):
    """A preset whose objective is missing fails with a message naming it; it is never silently dropped."""
    registry = {k: v for k, v in registered_objectives().items() if k != "mnr"}
    monkeypatch.setattr(arguments, "registered_objectives", lambda: registry)
    monkeypatch.setattr(cli, "run_plan", lambda *a, **k: pytest.fail("run started"))
    with pytest.raises(SystemExit):
        cli.main(["--preset", "b3"])
    err = capsys.readouterr().err
    assert "preset b3 needs the objective(s) mnr" in err


def test_tasks_subset_drops_default_caps_of_untrained_tasks():
    """--tasks sst sts works with the default Quora caps (they follow the tasks); an explicit cap does not."""
    cfg = arguments.config_for(["--tasks", "sst", "sts"])
    assert cfg.tasks == ("sst", "sts") and "para" not in cfg.max_train_examples and "para" not in cfg.dev_max_examples


def test_default_config_is_the_measured_cpu_recipe():
    """No flags: the embedded MiniLM, cross-encoded pairs, a per-epoch Quora cap, on the automatic device."""
    cfg = arguments.config_for([])
    assert cfg == TrainConfig()
    assert cfg.pretrained is None and cfg.model.pair_encoding == "cross" and "para" in cfg.max_train_examples
    json.dumps(cfg.to_dict())  # plain JSON


def test_the_default_trains_the_sst_phrases_and_none_turns_them_off(tmp_path):
    """The default recipe trains 17,088 of the treebank's phrases an epoch through the SST head, in
    batches of 64; a run without sst has no phrase stream (and needs no phrase file); ``--sst-phrases none`` turns
    them off."""
    default = arguments.config_for([])
    assert default.stream_files == {"phrases": "sst-phrases-train.csv"} and default.resolve().caps["phrases"] == 17088
    assert default.resolve().batch_sizes == {"sst": 32, "para": 32, "sts": 32, "phrases": 64}
    assert "phrases" in default.resolve().extra and default.resolve().streams == ("sst", "para", "sts", "phrases")
    pairs = arguments.config_for(["--tasks", "para", "sts"])
    assert "phrases" not in pairs.resolve().extra and pairs.resolve().streams == ("para", "sts")
    assert "phrases" not in {**pairs.stream_files, **pairs.max_train_examples, **pairs.task_batch_size}
    off = arguments.config_for(["--sst-phrases", "none"])
    assert off.stream_files == {"phrases": None} and "phrases" not in off.resolve().extra
    assert off.resolve().streams == ("sst", "para", "sts")
    assert "phrases" not in {**off.max_train_examples, **off.task_batch_size}  # what acts on them alone goes too
    mine = tmp_path / "mine.csv"
    mine.write_text("id\tsentence\tsentiment\n")
    assert arguments.config_for(["--sst-phrases", str(mine)]).resolve().extra["phrases"].file == str(mine)


def test_config_reruns_a_saved_config_with_flags_overriding_it(tmp_path):
    saved = TrainConfig(lr=3e-5, epochs=4, seed=7, tasks=("sst", "sts"), max_train_examples={"sst": 10})
    (tmp_path / "config.json").write_text(json.dumps(saved.to_dict()))
    cfg = arguments.config_for(["--config", str(tmp_path / "config.json"), "--seed", "2"])
    assert cfg.lr == 3e-5 and cfg.epochs == 4 and cfg.tasks == ("sst", "sts") and cfg.seed == 2
    assert cfg.max_train_examples == {"sst": 10}
    for bad, message in ((tmp_path, "is a directory"), (tmp_path / "none.json", "no such file")):
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            arguments.config_for(["--config", str(bad)])


def test_every_flag_of_the_readme_techniques_table_is_accepted():
    """The README's technique table is what a newcomer copies: each flag cell must be a command line that
    train_multitask.py accepts on top of the defaults (placeholders N and P filled in; cells naming a DIR need
    one and are left out). It once showed `--objective mnr`, which the default cross-encoder refuses."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("## Techniques", 1)[1].split("\n## ", 1)[0]
    cells = [cell for row in table.splitlines() if row.startswith("|")
             for cell in re.findall(r"`(--[^`]+)`", row.rsplit("|", 2)[-2])]
    assert len(cells) >= 15, cells
    for cell in cells:
        if "DIR" in cell:
            continue
        argv = shlex.split(re.sub(r"\bN\b", "1", re.sub(r"\bP\b", "0.5", cell)))
        try:
            arguments.config_for(argv)
        except (SystemExit, ValueError) as e:
            pytest.fail(f"README technique flags {cell!r} are refused: {e}")


def test_a_config_file_of_some_fields_takes_todays_defaults_for_the_others(tmp_path):
    """A --config file of some fields ({"epochs": 1}) gives today's default recipe but for them (symmetric_eval,
    the priors and train_subsets at their defaults too); a run's saved config.json lacking an option still loads
    with the value it ran with."""
    (tmp_path / "one.json").write_text('{"epochs": 1, "model": {"fcn_size": 128}}')
    cfg = arguments.config_for(["--config", str(tmp_path / "one.json")])
    default = TrainConfig()
    assert cfg.epochs == 1 and cfg.model.fcn_size == 128
    assert dataclasses.replace(cfg, epochs=default.epochs, model=default.model) == default
    assert cfg.model == dataclasses.replace(default.model, fcn_size=128)
    saved = {k: v for k, v in unversioned(default.to_dict()).items() if k != "sst_prior"}  # saved before --sst-prior
    (tmp_path / "saved.json").write_text(json.dumps(saved))
    assert arguments.config_for(["--config", str(tmp_path / "saved.json")]).prior_weights["sst"] == 0.0


def test_a_config_files_stream_setting_of_no_task_or_stream_is_refused_naming_the_file(tmp_path):
    """A --config file's per-stream item for a stream of no task (a typo: "phrasez") is refused naming the file and
    its key, not dropped as the items of a task the run leaves out are (those follow --tasks)."""
    (tmp_path / "typo.json").write_text('{"loss_weights": {"phrasez": 0.5}, "max_train_examples": {"para": 100}}')
    with pytest.raises(ValueError, match=r"--config .*typo\.json: loss_weights names 'phrasez', which is no task or "
                                         r"stream \(tasks: sst, para, sts, .*; streams: .*phrases.*nli\)"):
        arguments.config_for(["--config", str(tmp_path / "typo.json")])
    (tmp_path / "other.json").write_text('{"loss_weights": {"para": 0.5, "phrases": 2.0}}')
    assert arguments.config_for(["--config", str(tmp_path / "other.json"), "--tasks", "sts"]).loss_weights == {}


def test_a_map_flag_given_twice_sets_every_item_it_names():
    """--max-train-examples para=100 --max-train-examples sst=50 sets both caps (the second use does not drop the
    first's, as argparse's store would); a spelled key and another key of its map combine the same way."""
    cfg = arguments.config_for(["--max-train-examples", "para=100", "--max-train-examples", "sst=50"])
    assert cfg.max_train_examples == {"para": 100, "sst": 50}
    cfg = arguments.config_for(["--prior-weights", "sts=0.2", "--prior-weights", "sst=0.1"])
    assert cfg.prior_weights == {"sts": 0.2, "sst": 0.1}
    assert arguments.config_for(["--prior-weights", "sts=0.2", "--sst-prior", "0.1"]).prior_weights == \
        cfg.prior_weights


def test_a_config_whose_user_regression_took_stss_span_asks_for_its_span_with_sts_scale(tmp_path):
    """A user's regression saved at config version 2 took STS's span (its entry's span_option); --config of that run
    with --sts-scale S changed both then. Spans are per task since: it is refused in one line unless --spans names
    the task too; without --sts-scale the task keeps the span it was saved with."""
    rows = {s: [[f"film {i}", 1 + i % 9] for i in range(8)] for s in ("train", "dev")}
    task_file = user_task(tmp_path / "t", {"name": "rating", "text": "review", "label": "stars",
                                           "kind": "sentence-regression"}, rows, ["review", "stars"])
    d = arguments.config_for(["--task-file", str(task_file), "--tasks", "sts", "rating", "--sts-scale", "4"]).to_dict()
    entry = d["user_tasks"]["rating"]  # as version 5 kept a task that version 2 saved: format 2, STS's span
    d["user_tasks"]["rating"] = {**entry, "format": 2, "span_option": "sts_scale"}
    d["model"] = {**{k: v for k, v in d["model"].items() if k != "spans"}, "sts_scale": 4.0}
    weights, models = d.pop("prior_weights"), d.pop("prior_models")
    d["priors"] = {**{f"{t}_weight": weights[t] for t in ("sst", "sts")}, **{f"{t}_model": models.get(t)
                                                                            for t in ("sst", "sts")}}
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps({**d, "config_version": 5}))
    assert arguments.config_for(["--config", str(saved)]).model.spans == {"sts": 4.0, "rating": 4.0}
    with pytest.raises(ValueError, match=r"--config .*config.json: its task rating took STS's span when it was "
                                         r"saved, .* give --spans rating=S too"):
        arguments.config_for(["--config", str(saved), "--sts-scale", "3"])
    assert arguments.config_for(["--config", str(saved), "--sts-scale", "3", "--spans", "rating=3"]).model.spans == \
        {"sts": 3.0, "rating": 3.0}


def test_none_in_a_config_file_turns_an_option_off_as_on_the_command_line(tmp_path):
    """An option whose default is on takes "none" for off on the command line (--sst-phrases none); a --config
    file saying "none" for it means the same (not a file named "none"); null stays off too."""
    for doc in ('{"sst_phrases": "none"}', '{"stream_files": {"phrases": "none"}}'):
        (tmp_path / "off.json").write_text(doc)
        from_file = arguments.config_for(["--config", str(tmp_path / "off.json")])
        assert from_file == arguments.config_for(["--sst-phrases", "none"])
        assert "phrases" not in from_file.resolve().extra
    (tmp_path / "batch.json").write_text('{"sst_phrases_batch_size": "none"}')
    from_file = arguments.config_for(["--config", str(tmp_path / "batch.json")])
    assert from_file == arguments.config_for(["--sst-phrases-batch-size", "none"])
    assert from_file.resolve().batch_sizes["phrases"] == from_file.batch_size and "phrases" in from_file.resolve().extra
    for doc in ('{"sst_phrases": null}', '{"stream_files": {"phrases": null}}'):
        (tmp_path / "null.json").write_text(doc)
        assert "phrases" not in arguments.config_for(["--config", str(tmp_path / "null.json")]).resolve().extra


def test_preset_help_shows_the_presets_values(capsys):
    """--preset b1 --help shows what --preset b1 trains (10 epochs, lr 1e-05, Siamese pairs) as the defaults; plain
    --help shows the CPU recipe's."""
    from tasks.train import main
    for argv, epochs, lr, pairs in ((["--preset", "b1", "--help"], "10", "1e-05", "siamese"),
                                    (["--help"], "2", "0.0001", "cross")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        text = " ".join(capsys.readouterr().out.split())
        assert e.value.code == 0
        assert f"§5.3) (default: {epochs})" in text and f"§4.1 and §4.5) (default: {lr})" in text
        assert f"(default: {pairs})" in text


def test_the_nested_settings_keep_their_flags():
    """The settings nested in a config of their own (the SST phrases, LP-FT, SWA) or set per task since (the SST
    and STS priors) keep the flags of the fields they were (version 1 of config.json): each flag sets its setting
    (a prior's, its task's item of a per-task map)."""
    from tasks.config_versions import NESTED_SETTINGS, PER_STREAM_PHRASES, PER_TASK_PRIORS

    parser = arguments.build_parser()
    flags = {a.option_strings[0]: a.dest for a in parser._actions if a.option_strings}
    for flat, (name, field) in NESTED_SETTINGS.items():
        dest = "@".join(PER_TASK_PRIORS[field]) if name == "priors" else \
            f"{PER_STREAM_PHRASES[field]}@phrases" if name == "sst_phrases" else f"{name}.{field}"
        assert flags["--" + flat.replace("_", "-")] == dest, flat
    command, explicit = arguments.parse(["--sts-prior", "0.25", "--sst-prior-model", "enc", "--sst-phrases-weight",
                                         "2", "--sst-phrases-order", "first", "--lp-epochs", "1", "--lp-lr", "1e-3",
                                         "--swa-epochs", "2", "--swa-lr", "1e-4"], parser)
    cfg = arguments.config_from_flags(command, explicit)
    assert (cfg.prior_weights, cfg.prior_models, cfg.loss_weights, cfg.stream_orders) == \
        ({"sst": 0.5, "sts": 0.25}, {"sst": "enc"}, {"phrases": 2.0}, {"phrases": "first"})
    assert (cfg.lpft.epochs, cfg.lpft.lr, cfg.swa.epochs, cfg.swa.lr) == (1, 1e-3, 2, 1e-4)


def test_a_per_stream_setting_for_a_run_without_the_defaults_streams_keeps_only_what_acts():
    """--max-train-examples sst2=N on a run without para: the default's para cap (a stream the run does not train)
    is left out rather than refused; the explicit entry stays, and one for an untrained stream is refused."""
    cfg = arguments.config_for(["--tasks", "sst", "--max-train-examples", "sst=100"])
    assert cfg.max_train_examples == {"sst": 100}
    assert arguments.config_for(["--max-train-examples", "sst=100"]).max_train_examples == {"para": 23000, "sst": 100}
    with pytest.raises(ValueError, match=r"max_train_examples names \['para'\], which this run does not train"):
        arguments.config_for(["--tasks", "sst", "--max-train-examples", "para=100"])


def test_a_saved_runs_task_named_again_keeps_its_place_among_the_runs_tasks(tmp_path):
    """--config of a run with two task files' tasks, one of the files named again (--task-file): the task is read
    again and keeps its place, the order in which the run's scores are averaged."""
    from tests.helpers import three_class_task

    first, second = (three_class_task(tmp_path / n, name=n) for n in ("first", "second"))
    saved = arguments.config_for(["--task-file", str(first), "--task-file", str(second), "--tasks", "sst"])
    assert list(saved.user_tasks) == ["first", "second"]
    (tmp_path / "config.json").write_text(json.dumps(saved.to_dict()))
    cfg = arguments.config_for(["--config", str(tmp_path / "config.json"), "--task-file", str(first)])
    assert list(cfg.user_tasks) == ["first", "second"] and list(cfg.entries)[-2:] == ["first", "second"]
    assert cfg.tasks == ("sst", "first", "second")
