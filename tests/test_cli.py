"""Tests of tasks/cli.py, what every command shares: the ecosystem's CLI idiom (issue 16, item 4): no
abbreviations, two-line errors, hints for flags from the CS224N starter and the HF Trainer, one name per concept,
every default in the help."""

from __future__ import annotations

import pytest

from tasks import ensemble, predict, pretrain, robustness
from tasks import train as cli

COMMANDS = {"train": (cli.main, "train_multitask.py"), "pretrain": (pretrain.main, "python -m tasks.pretrain"),
            "ensemble": (ensemble.main, "python -m tasks.ensemble"),
            "robustness": (robustness.main, "python -m tasks.robustness"),
            "predict": (predict.main, "python -m tasks.predict")}
CASES = [  # (command, argv, what the error line must say)
    ("train", ["--use_gpu"], "the device is automatic (CUDA when present); to choose one pass --device cuda"),
    ("train", ["--output_dir", "runs/x"], "use --out-dir"),
    ("train", ["--learning_rate", "1e-5"], "use --lr"),
    ("train", ["--num_train_epochs", "3"], "use --epochs"),
    ("train", ["--batch_size", "8"], "use --batch-size"),
    ("train", ["--option", "finetune"], "full fine-tuning is the default"),
    ("train", ["--option=pretrain"], "--lp-epochs N trains the heads only"),
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
    ("robustness", ["label-noise", "--rate", "0.1", "--out-dir", "x", "--", "--epoch", "2"],
     "did you mean --epochs?"),
    ("predict", ["--checkpoint", "x", "--task", "sst", "--use_gpu"], "--device cuda"),
    ("predict", ["--checkpoint", "x", "--task", "sentiment"], "invalid choice: 'sentiment'"),
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


def test_every_help_shows_defaults():
    for parser in (cli.build_parser(), pretrain.build_parser(), ensemble.build_parser(), predict.build_parser()):
        text = parser.format_help()
        assert "(default: " in text
    assert "(default: 3)" in pretrain.build_parser().format_help()  # --epochs
    assert "(default: 0.06)" in pretrain.build_parser().format_help() or "--warmup FRACTION" in \
        pretrain.build_parser().format_help()
