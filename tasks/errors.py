"""User-caused errors after argument checking: one line and exit status 1, instead of a traceback.

Argument errors stay argparse's (exit status 2, before any work). What goes
wrong later because of the user's files or disk (a data file that is not
UTF-8, a corrupted checkpoint, an --out-dir taken by another run, a full
disk) is printed as ``<program>: error: <message>``: the messages raised
in tasks/ name the file, flag or path and what to do. Set MINBERT_VERBOSE=1
to keep the traceback for a bug report.

Usage:
    with user_errors("train_multitask.py"):
        run(cfg)
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
from collections.abc import Iterator

from safetensors import SafetensorError

VERBOSE_ENV = "MINBERT_VERBOSE"

# What a user's input, files or machine cause; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, OSError, SafetensorError, json.JSONDecodeError, UnicodeDecodeError)


def verbose() -> bool:
    """MINBERT_VERBOSE=1: user errors keep their traceback."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def describe(error: BaseException) -> str:
    """One line for ``error``: its own message, with the path and a remedy where the OS gave only an errno."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        where = f" writing {error.filename}" if error.filename else ""
        return (f"disk full{where}: free space (a checkpoint takes 90-360 MB), then continue with --resume; "
                "the last complete checkpoint is intact")
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
def user_errors(program: str) -> Iterator[None]:
    """Turn a user-caused error raised inside into ``<program>: error: <one line>`` and exit status 1."""
    try:
        yield
    except USER_ERRORS as e:
        if verbose():
            raise
        print(f"{program}: error: {describe(e)} (set {VERBOSE_ENV}=1 for the traceback)", file=sys.stderr)
        raise SystemExit(1) from None
