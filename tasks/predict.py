"""The predict command: a trained model's predictions on new text, as CSV.

Usage:
    python -m tasks.predict --checkpoint runs/try/checkpoints/best --task sst --input sentences.txt
    printf 'a cat sits\ta cat is sitting\n' | python -m tasks.predict --checkpoint runs/try --task sts

A thin command over ``tasks.evaluation.evaluator.Predictor``, which gives the
same predictions from Python (``predict``: any task's, in its own labels; ``sentiment``, ``paraphrase``,
``similarity`` in the course's numbers; ``embed``). A run's prediction files and ``--eval-only`` are
``Evaluator.write_all`` and ``evaluate_checkpoint`` in that module.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import os
import sys
from dataclasses import dataclass
from collections.abc import Sequence
from pathlib import Path

from tasks.cli import Parser, describe, user_errors, verbose
from tasks.logs import log_to
from tasks.objectives import load_plugin
from tasks.options import add_options, help_text, option
from tasks.data.readers import Example, blank, decode_utf8
from tasks.evaluation.evaluator import Predictor
from tasks.runtime import set_threads
from tasks.task import Task, get_task
from tasks.train_config import TrainConfig

logger = logging.getLogger(__name__)


def read_inputs(task: str | Task, source: str) -> list[Example]:
    """Examples from ``source`` (a path, or "-" for stdin): one sentence (a sentence task: sst) or one
    tab-separated pair (a pair task) per line, ids = line numbers (blank lines, and lines of control characters
    alone, skipped); a .csv file is read as the task's test file (its columns, the CS224N format). ``task``: its
    entry (a run's: TrainConfig.entries), or the name of one this package declares."""
    entry = get_task(task)
    task = entry.name
    if source != "-" and not Path(source).is_file():
        raise FileNotFoundError(f"--input {source}: no such file")
    if source.endswith(".csv"):
        return entry.read("test", ".", path=source)[0]
    stdin = getattr(sys.stdin, "buffer", None)
    if source == "-" and stdin is None:  # a text stream without bytes beneath (an embedding program's)
        text = sys.stdin.read()
    else:
        data = stdin.read() if source == "-" else Path(source).read_bytes()
        text = decode_utf8("stdin" if source == "-" else f"--input {source}", data)
    # A file of lines: only \n (and \r\n) ends one; str.splitlines would also split at U+2028, U+0085, U+001E,
    # ..., inside a sentence, and the ids (line numbers) would no longer match the file.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    where = "stdin" if source == "-" else f"--input {source}"
    examples = []
    for n, line in enumerate(lines, 1):
        if blank(line):  # white space or control characters alone
            continue
        texts = entry.kind.line_texts(entry, line, f"{where}: line {n}")  # a sentence, or a tab-separated pair
        examples.append(Example(str(n), *texts))
    return examples


def prediction_rows(predictor: Predictor, task: str, examples: list[Example]) -> tuple[list[str], list[list]]:
    """(CSV header, rows) of the predictions for ``examples``: its kind's columns (the prediction in the task's own
    labels, then the class probabilities; or the score)."""
    entry = predictor.cfg.entries[task]
    predicted = predictor.predict_examples(task, examples)
    outputs = entry.kind.outputs(entry, predicted.logits)
    return (["id", *entry.kind.row_columns(entry)],
            [[e.id, *entry.kind.row(entry, p, o)] for e, p, o in zip(examples, predicted.preds, outputs)])


def check_output(output: str) -> None:
    """--output names a file that can be written: its folder exists and it is not a folder itself."""
    if output == "-":
        return
    path = Path(output)
    if path.is_dir():
        raise ValueError(f"--output {output} is a directory: name a file in it")
    folder = path.parent
    if not folder.is_dir():
        raise ValueError(f"--output {output}: no such directory {folder}; create it or name another file")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"--output {output}: {folder} is not writable; name another file")


@dataclass
class PredictArgs:
    """The predict command's flags."""

    checkpoint: str = option(help="a checkpoint directory (runs/x/checkpoints/best) or a run directory (its best "
                                  "checkpoint)", metavar="DIR")
    task: str = option(help="what to predict: a task the checkpoint was trained on (sst, para, sts, cfimdb, or a "
                            "task of its own --task-file)", metavar="TASK")
    input: str = option("-", "one sentence (a sentence task: sst) or two tab-separated sentences (a pair task: "
                             "para, sts) per line; a .csv file in the task's format; - reads stdin", metavar="FILE")
    output: str = option("-", "CSV file to write; - writes stdout", metavar="FILE")
    device: str = option("auto", "auto (CUDA when present), cpu, cuda, cuda:1, ...", metavar="DEVICE")
    batch_size: int | None = option(None, "sentences per forward pass (default: the run's eval batch size)",
                                    metavar="B")
    bf16: bool | None = option(None, "bf16 autocast; default: the run's rule (on where the GPU or CPU multiplies "
                                     "bf16 natively); --no-bf16 computes in fp32")
    threads: int | None = option(None, help_text(TrainConfig, "threads"), metavar="N")
    objective_modules: list[str] = option(help="where an objective file of the run is now (repeatable): reading a "
                                               "run imports no file it recorded unless named again, or trusted",
                                          factory=list, flag="--objective-module", repeat=True, metavar="FILE")
    trust_objective_modules: bool = option(False, "import the objective files (--objective-module) the run "
                                                  "recorded in its config.json, as HF's trust_remote_code")


def build_parser() -> Parser:
    p = Parser(prog="python -m tasks.predict",
               description="Predict on new text with a trained checkpoint: CSV of id,label,probabilities "
                           "(sst: p0..p4; para: p1, P(paraphrase)) or id,score (sts).")
    add_options(p, PredictArgs, required=("checkpoint", "task"))
    return p


def main(argv: Sequence[str] | None = None) -> list[list]:
    log_to()  # the console only: predict writes no directory
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, value in (("--batch-size", args.batch_size), ("--threads", args.threads)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    try:  # what the user named: the checkpoint, its task, --input and --output (an argument error, exit status 2)
        check_output(args.output)
        for module in args.objective_modules:  # a run's objective file, named where it is now
            load_plugin(module)
        plan = Predictor.plan(args.checkpoint, device=args.device, bf16=args.bf16, threads=args.threads,
                              trust_modules=args.trust_objective_modules)
        if args.task not in plan.config.tasks:
            raise ValueError(f"--task {args.task}: {plan.checkpoint} was trained on "
                             f"{', '.join(plan.config.tasks)}; name one of them")
        examples = read_inputs(plan.config.entries[args.task], args.input)
    except (ValueError, OSError) as e:
        if verbose():
            raise
        parser.error(describe(e))
    set_threads(plan.config.threads)  # the run's count unless --threads: as --eval-only computes
    with user_errors(parser.prog):  # what loading and predicting meet (damaged weights): one line, exit status 1
        predictor = Predictor.from_plan(plan, batch_size=args.batch_size)
        header, rows = prediction_rows(predictor, args.task, examples)
    with (contextlib.nullcontext(sys.stdout) if args.output == "-"
          else open(args.output, "w", newline="", encoding="utf-8")) as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    if args.output != "-":
        logger.info("wrote %d rows of %s predictions to %s", len(rows), args.task, args.output)
    return rows


if __name__ == "__main__":
    main()

