"""Tests of tasks/cli.py, what every command shares: the ecosystem's CLI idiom: no
abbreviations, two-line errors, hints for flags from the CS224N starter and the HF Trainer, one name per concept,
every default in the help."""

from __future__ import annotations

import argparse
import sys

import pytest

from tasks import cli as cli_module
from tasks import ensemble, predict, pretrain, robustness
from tasks import arguments
from tasks import train as cli

COMMANDS = {"train": (cli.main, "train_multitask.py"), "pretrain": (pretrain.main, "python -m tasks.pretrain"),
            "ensemble": (ensemble.main, "python -m tasks.ensemble"),
            "robustness": (robustness.main, "python -m tasks.robustness"),
            "predict": (predict.main, "python -m tasks.predict")}
CASES = [  # (command, argv, what the error line must say)
    ("train", ["--use_gpu"], "the device is automatic (CUDA when present); to choose one pass --device cuda"),
    ("train", ["--output_dir", "runs/x"], "use --out-dir"),
    ("train", ["--learning_rate", "1e-5"], "use --lr"),
    ("train", ["--learning-rate", "1e-5"], "use --lr"),  # dashes or underscores alike
    ("train", ["--num-train-epochs", "3"], "use --epochs"),
    ("train", ["--num_train_epochs", "3"], "use --epochs"),
    ("train", ["--batch_size", "8"], "use --batch-size"),
    ("train", ["--option", "finetune"], "full fine-tuning is the default"),
    ("train", ["--option=pretrain"], "--freeze-encoder trains the heads alone on the frozen encoder"),
    ("train", ["--pretrained", "none"], "'none' is not a value of this setting: leave the flag out for its default"),
    ("train", ["--sst-prior-model", "none"], "'none' is not a value of this setting"),
    ("train", ["--report-to", "none"], "invalid choice: 'none'"),
    ("train", ["--epoch", "2"], "unrecognized argument --epoch: did you mean --epochs?"),  # not a default run
    ("train", ["--lr-sched", "constant"], "unrecognized argument --lr-sched"),
    ("train", ["--epochs", "two"], "argument --epochs: invalid int value: 'two'"),
    ("train", ["--resume", "--config", "x.json"], "--config starts a fresh run"),
    ("pretrain", ["--out-dir", "x", "--warmup-ratio", "0.1"], "--warmup-ratio is now --warmup"),
    ("pretrain", ["--out-dir", "x", "--max-grad-norm", "1"], "--max-grad-norm is now --grad-clip"),
    ("pretrain", ["--out-dir", "x", "--schedule", "linear"], "--schedule is now --lr-schedule"),
    ("pretrain", ["--out-dir", "x", "--learning_rate", "1e-4"], "use --lr"),
    ("pretrain", ["--out-dir", "x", "--epoch", "1"], "did you mean --epochs?"),
    ("ensemble", ["runs/a", "--output_dir", "x"], "use --out-dir"),
    ("ensemble", ["runs/a", "--out", "x"], "unrecognized argument --out"),
    ("robustness", ["few-shot", "--sizes", "10", "--output_dir", "x"], "use --out-dir"),
    ("robustness", ["few-shot", "--sizes", "10", "--out-dir", "x", "--", "--tasks", "sst"],
     "--tasks after -- is set by the experiment"),
    ("robustness", ["label-noise", "--rate", "0.1", "--out-dir", "x", "--", "--sst-phrases", "p.csv"],
     "--sst-phrases after -- is set by the experiment: remove it (the phrases' labels escape the perturbation)"),
    ("robustness", ["few-shot", "--sizes", "10", "--out-dir", "x", "--", "--seed=3"],
     "--seed after -- is set by the experiment: remove it"),
    ("robustness", ["label-noise", "--rate", "0.1", "--out-dir", "x", "--", "--epoch", "2"],
     "did you mean --epochs?"),
    ("predict", ["--checkpoint", "x", "--task", "sst", "--use_gpu"], "--device cuda"),
    ("predict", ["--checkpoint", "x", "--task", "sentiment"], "no checkpoint at x"),
]


@pytest.mark.parametrize("command, argv, message", CASES)
def test_errors_are_two_lines_with_a_hint(command, argv, message, capsys):
    main, prog = COMMANDS[command]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2
    prog_in_error = err[-1].split(": error: ")[0]
    assert len(err) == 2, err
    assert err[0].startswith(f"usage: {prog_in_error} [options]") and prog_in_error.startswith(prog.split(" [")[0])
    assert message in err[1], err[1]


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


@pytest.mark.parametrize("command", [pretrain, ensemble, predict, robustness], ids=lambda m: m.__name__)
def test_every_option_with_a_default_shows_it_in_its_help(command):
    """Each flag's --help entry (subcommands' too) ends with its default, unless it has none or its help
    already names it (DefaultsHelp)."""
    checked = 0
    for parser in _parsers(command.build_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if not action.option_strings or action.default in (None, argparse.SUPPRESS):
                continue
            text = formatter._expand_help(action)
            assert "default" in text, (parser.prog, action.option_strings, text)
            if "default" not in (action.help or ""):
                assert f"(default: {action.default})" in text, (parser.prog, action.option_strings, text)
            checked += 1
    assert checked >= 3


def test_every_training_flag_shows_its_config_default():
    """train_multitask.py's flags leave argparse defaults unset (a preset fills what is not given), so the help
    states each config field's default itself: every scalar field of TrainConfig, ModelConfig and each objective's
    Config, as a default-built config holds it."""
    import dataclasses

    from tasks.train_config import TrainConfig
    from tasks.objectives import registered_objectives

    cfg = TrainConfig()
    expected = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    expected |= {f"model.{f.name}": getattr(cfg.model, f.name) for f in dataclasses.fields(cfg.model)}
    for name, cls in registered_objectives().items():
        expected |= {f"objectives.{name}.{f.name}": f.default for f in dataclasses.fields(cls.Config)}
    parser = arguments.build_parser()
    formatter = parser._get_formatter()
    checked = 0
    for action in parser._actions:
        value = expected.get(action.dest, dataclasses.MISSING)
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            continue  # None, switches, factories (dicts, tuples): their help says it in words
        assert f"(default: {value})" in formatter._expand_help(action), action.option_strings
        checked += 1
    assert checked >= 40


def test_an_empty_default_reads_none():
    """A flag whose default is an empty collection (--report-to) says "(default: none)", not "(default: )"."""
    parser = arguments.build_parser()
    helps = [parser._get_formatter()._expand_help(a) for a in parser._actions if a.help]
    assert not [h for h in helps if "(default: )" in h]
    (report,) = [h for h in helps if "event files in <out-dir>/tensorboard" in h]
    assert report.endswith("(default: none)")




@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_installed_command_names_itself_in_its_usage_and_errors(command, monkeypatch, capsys):
    """Started as its console script (minbert-train, ...), a command's usage line and error name the script, not
    train_multitask.py or python -m tasks.X, which a pip user does not run."""
    main, prog = COMMANDS[command]
    script = cli_module.INSTALLED[prog]
    monkeypatch.setattr(sys, "argv", [f"/venv/bin/{script}"])
    with pytest.raises(SystemExit) as e:
        main(["--no-such-flag"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[0].startswith(f"usage: {script} [options]") and \
        err[-1].startswith(f"{script}: error: ")


@pytest.mark.parametrize("command, argv", [
    ("train", ["--eval-only", "--checkpoint", "{missing}"]),
    ("train", ["--resume", "--out-dir", "{missing}"]),
    ("predict", ["--checkpoint", "{missing}", "--task", "sst"]),
    ("ensemble", ["{missing}", "--out-dir", "{tmp}/ens"]),
    ("robustness", ["attack", "--checkpoint", "{missing}"]),
    ("pretrain", ["--out-dir", "{tmp}/mlm", "--data-dir", "{missing}"]),
])
def test_a_missing_path_is_an_argument_error_in_every_command(command, argv, tmp_path, capsys):
    """One exit rule for every command: a path the user named that is not there is refused with the arguments,
    exit status 2, one line naming it, nothing written."""
    main, _ = COMMANDS[command]
    missing = tmp_path / "missing"
    with pytest.raises(SystemExit) as e:
        main([a.format(missing=missing, tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 2 and str(missing) in err[1] and "Traceback" not in err[1], err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
