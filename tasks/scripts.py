"""The installed commands: the console scripts of pyproject.toml, each one command run as a program.

Usage (after ``pip install .``, or in the checkout's .venv):
    minbert-train --preset quick                    # = python train_multitask.py --preset quick
    minbert-predict --checkpoint runs/default --task sst --input sentences.txt
    minbert-ensemble runs/a runs/b --out-dir runs/ens
    minbert-pretrain --out-dir runs/mlm
    minbert-robustness few-shot --sizes 100 --out-dir runs/fs
    minbert-sst-phrases trainDevTestTrees_PTB/trees --out data/sst-phrases-train.csv

A command's ``main`` returns its result to a Python caller (the run's metrics, the predictions), and a console
script hands what its function returns to ``sys.exit``, which prints any value that is not a number and exits 1.
So each script here runs its command and returns nothing: exit status 0, or the one the command raised (2 for
an argument, 1 at run time), as ``python -m tasks.X`` gives. Each imports its command when called, so that one
command does not load the others' modules.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def _command(module: str) -> Callable[[], None]:
    """The console script of the command ``module`` (its ``main``): imported when called, nothing returned."""

    def script() -> None:
        importlib.import_module(module).main()

    script.__doc__ = f"python -m {module}"
    return script


train = _command("tasks.train")  # minbert-train: train_multitask.py
predict = _command("tasks.predict")
ensemble = _command("tasks.ensemble")
pretrain = _command("tasks.pretrain")
robustness = _command("tasks.robustness")
sst_phrases = _command("tasks.sst_phrases")
