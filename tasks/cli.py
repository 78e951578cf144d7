"""What every command shares: its argument parser, and user errors as one line.

The commands (train, pretrain, ensemble, robustness, predict) and the experiment
and benchmark scripts build their flags on ``Parser`` (from dataclass fields:
tasks.options) and run their work inside ``user_errors``, so a bad flag or a
user-caused error reads the same whichever command met it.

Usage:
    p = Parser(prog="python -m tasks.predict", description="...")
    add_options(p, PredictOptions)   # one flag per field (tasks.options)
    args = p.parse_args(argv)
    with user_errors(p.prog):
        run(args)          # a ValueError/OSError/... prints "<prog>: error: <one line>", exit status 1

What it adds to argparse.ArgumentParser:
- no abbreviations (``allow_abbrev=False``): ``--epoch 2`` is an error naming
  ``--epochs``, never a run with the default of something else;
- short errors: ``usage: <prog> [options]`` and the error line (``--help``
  still prints everything), exit status 2;
- a hint for flags people bring from the CS224N starter and the HF Trainer
  (``--use_gpu``, ``--output_dir``, ``--learning_rate``, ``--num_train_epochs``,
  ``--batch_size``, ``--option finetune|pretrain``), spelt with underscores or
  dashes alike, for snake_case spellings of our kebab-case flags, and close
  matches for typos;
- started as an installed command (``minbert-train``), its usage lines and errors name it so;
- every option's default at the end of its help (``DefaultsHelp``);
- NaN and infinities refused for every float flag, naming it (``finite_float``).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn

from safetensors import SafetensorError

from tasks.logs import failure_text, log_failure

# ---- the parser: foreign flags, no abbreviations, short errors ----
# foreign flag -> (our flag the hint names, or None, hint); a renamed flag is hinted only where the command has it
FOREIGN_FLAGS: dict[str, tuple[str | None, str]] = {
    "--use_gpu": ("--device", "the device is automatic (CUDA when present); to choose one pass --device cuda"),
    "--use-gpu": ("--device", "the device is automatic (CUDA when present); to choose one pass --device cuda"),
    "--output_dir": ("--out-dir", "use --out-dir DIR"),
    "--learning_rate": ("--lr", "use --lr"),
    "--num_train_epochs": ("--epochs", "use --epochs"),
    "--per_device_train_batch_size": ("--batch-size", "use --batch-size (the global batch)"),
    "--warmup_ratio": ("--warmup", "use --warmup FRACTION"),
    "--max_grad_norm": ("--grad-clip", "use --grad-clip NORM"),
    "--model_name_or_path": ("--pretrained", "use --pretrained DIR or NAME (a Hugging Face model name)"),
}


OPTION_VALUES = {  # the CS224N starter's --option
    "finetune": "full fine-tuning is the default: drop --option",
    "pretrain": "--freeze-encoder trains the heads alone on the frozen encoder (its files are named pretrain-*); "
                "--lp-epochs N does so for N epochs, then fine-tunes everything",
}


class DefaultsHelp(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, except where there is none or the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default == argparse.SUPPRESS or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every flag of ``parser`` and of its subcommands."""
    found = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _option_strings(sub)
    return found


def foreign_flag_hint(argv: Sequence[str], known: set[str], renamed: dict[str, str] | None = None) -> str | None:
    """The error for the first flag in ``argv`` (before ``--``) that is not ours, with what to use instead.

    ``renamed``: flag names a command no longer accepts -> the current ones (refused with the new name, never
    half-accepted).
    """
    for i, token in enumerate(argv):
        if token == "--":
            return None
        if not token.startswith("--") or any(c.isspace() for c in token):  # a value (quoted flags of a recipe)
            continue
        flag = token.split("=", 1)[0]
        if flag in known:
            continue
        if flag in (renamed or {}):
            return f"{flag} is now {renamed[flag]} (one name per concept across the commands)"
        if flag == "--option":
            value = token.split("=", 1)[1] if "=" in token else (argv[i + 1] if i + 1 < len(argv) else "")
            return f"--option is the CS224N starter's flag; {OPTION_VALUES.get(value, OPTION_VALUES['finetune'])}"
        target, hint = FOREIGN_FLAGS.get(flag) or FOREIGN_FLAGS.get("--" + flag[2:].replace("-", "_"), (None, ""))
        if hint and (target is None or target in known):
            return f"unrecognized argument {flag}: {hint}"
        kebab = flag.replace("_", "-")
        if kebab in known:
            return f"unrecognized argument {flag}: use {kebab}"
        close = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.75)
        if close:
            return f"unrecognized argument {flag}: did you mean {close[0]}?"
        return f"unrecognized argument {flag} (--help lists the options)"
    return None


def finite_float(text: str) -> float:
    """A float flag's value: NaN and infinities are refused here, naming the flag (argparse adds it), not later
    by a check that cannot name it."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


# The commands and the console scripts that run them (pyproject.toml): started as one, a command's usage lines and
# errors name it so.
INSTALLED = {"train_multitask.py": "minbert-train", "python -m tasks.predict": "minbert-predict",
             "python -m tasks.ensemble": "minbert-ensemble", "python -m tasks.pretrain": "minbert-pretrain",
             "python -m tasks.robustness": "minbert-robustness", "python -m tasks.sst_phrases": "minbert-sst-phrases"}


def program(prog: str) -> str:
    """How the user started the command ``prog``: its console script's name when started as one, else ``prog``."""
    started = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return started if INSTALLED.get(prog) == started else prog


class Parser(argparse.ArgumentParser):
    """argparse.ArgumentParser with this project's conventions (see the module docstring)."""

    def __init__(self, *args, renamed: dict[str, str] | None = None, **kwargs) -> None:
        if kwargs.get("prog") is not None:
            kwargs["prog"] = program(kwargs["prog"])
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", DefaultsHelp)
        super().__init__(*args, **kwargs)
        self.renamed = dict(renamed or {})
        self.register("type", float, finite_float)  # every type=float flag, in groups and subcommands too

    def parse_known_args(self, args: Sequence[str] | None = None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        hint = foreign_flag_hint(argv, _option_strings(self), self.renamed)
        if hint:
            self.error(hint)
        return super().parse_known_args(argv, namespace)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"usage: {self.prog} [options]  (--help for all of them)\n{self.prog}: error: {message}\n")

# ---- user errors: one line and exit status 1 ----
VERBOSE_ENV = "MINBERT_VERBOSE"


# What a user's input, files or machine cause; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, OSError, SafetensorError, json.JSONDecodeError, UnicodeDecodeError)


def verbose() -> bool:
    """MINBERT_VERBOSE=1: user errors keep their traceback."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def describe(error: BaseException, then: str = "then run the same command again") -> str:
    """One line for ``error``: its own message, with the path and a remedy where the OS gave only an errno
    (``then``: what to do once space is freed, which the command knows)."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        written = error.filename2 or error.filename  # a copy (shutil) names what it read first, what it wrote second
        where = f" writing {written}" if written else ""
        return f"disk full{where}: free space (a checkpoint holds the model and optimizer state), {then}"
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        text = f"{error.filename}: {error.strerror}"
        if isinstance(error, PermissionError):
            text += ": fix its permissions or pick another path"
        elif isinstance(error, (FileNotFoundError, NotADirectoryError)):
            text += ": check the path"
    elif isinstance(error, UnicodeDecodeError):
        text = f"a file is not UTF-8 text ({error}): re-save it as UTF-8"
    elif isinstance(error, SafetensorError):
        text = f"a safetensors file is truncated or corrupted ({error}): use another checkpoint"
    else:
        text = str(error) or type(error).__name__
    return " ".join(text.split())  # one line


@contextlib.contextmanager
def user_errors(program: str, then: Callable[[], str] | None = None) -> Iterator[None]:
    """Turn a user-caused error raised inside into ``<program>: error: <one line>`` and exit status 1; ``then``
    gives the remedy after a full disk (``describe``). Whatever ends the command, that line (or, for a bug, the
    exception's) is the last line of its log file (``tasks.logs.log_failure``)."""
    try:
        yield
    except USER_ERRORS as e:
        text = describe(e, then()) if then is not None else describe(e)
        log_failure(f"{program}: error: {text}")
        if verbose():
            raise
        print(f"{program}: error: {text} (set {VERBOSE_ENV}=1 for the traceback)", file=sys.stderr)
        raise SystemExit(1) from None
    except (Exception, KeyboardInterrupt) as e:  # a bug (its traceback follows on the console) or Ctrl-C
        log_failure(f"{program}: failed: {failure_text(e)}")
        raise

