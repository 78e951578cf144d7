"""The ensemble command: combine the saved predictions of several runs (minBERT paper §4.6).

A thin command over tasks.evaluation.ensemble (reading the logits, the three
methods, the submission zip): it parses the flags, checks the paths, and writes
the outputs so that a failure leaves --out-dir as it was.

Each run is a predictions directory holding the raw outputs that
``tasks.data.predictions.write_logits`` saves: ``{task}-{split}-logits.csv`` for the
dev and test splits (SST: id,logit_0..logit_4; paraphrase: id,logit; STS:
id,score). A run directory that holds them under ``predictions/`` works too.

Methods (../shared/papers/minbert-downstream-generalization.txt, §4.6; the math is in tasks.evaluation.ensemble):
  simple      the average prediction of all models: SST averages the softmax
              probabilities, paraphrase the sigmoid probabilities, STS the scores.
  selective   per task, the subset of models whose simple average scores best
              on dev (every subset for up to --max-exhaustive models, greedy
              forward selection above), then applied to test. Its dev score is
              optimistic: the subset was chosen on that same dev set; the honest
              number is two-fold (chosen on one dev half, scored on the other,
              both ways, averaged: "holdout" in ensemble.json).
  regression  the paper's "regression-based ensembler": dev split in two halves
              (seeded); on dev-train, a logistic model learns one weight per
              model that multiplies the model's logits before they are summed and
              go through the task's activation (SST softmax, no bias; paraphrase
              sigmoid, plus a bias), fit by L-BFGS with a small L2 penalty; it
              is scored on dev-dev, the honest number. The paper did not do STS:
              STS falls back to the simple average unless --regression-sts, which
              fits per-model linear weights and a bias by least squares.

Dev labels come from the task files (``tasks.data.readers.load_split(task, "dev",
data_dir)``), matched by id. Every run must hold the same ids for a task and
split (a mismatch names the file). A training run trained on some of the tasks
only (``train_multitask.py --tasks sst``: its ``config.json`` says which) is a
specialist: it joins the ensembles of its own tasks and no other; every other
run must have every task's files. Outputs in --out-dir:
predictions/{sst,para,sts}-{dev,test}-output.csv (leaderboard files),
predictions/{task}-{split}-logits.csv (the ensemble's logits: SST log of the
averaged probabilities, paraphrase logit of the averaged probability, STS the
score, so an ensemble can itself be ensembled), cs224n_default_final_project_submission.zip with the
leaderboard files, and ensemble.json (runs, chosen subsets or weights, scores).
A test split no run has (there is no quora-test-student.csv in the shared data)
is skipped with a message. --out-dir may not be an input run or inside a
folder holding an input's logits (exit status 2); every input is read and
checked before anything is written, and the outputs are staged and moved into
place at the end, so a bad file (a NaN logit) leaves --out-dir as it was.

Usage:
    python -m tasks.ensemble runs/a/predictions runs/b/predictions runs/c/predictions \\
        --method selective --data-dir data --out-dir runs/ensemble
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from tasks.cli import Parser, user_errors
from tasks.evaluation.ensemble import (
    METHODS,
    SUBMISSION_ZIP,
    TaskResult,
    dev_labels,
    ensemble_task,
    format_table,
    missing_test_ids,
    write_submission_zip,
)
from tasks.data.predictions import load_task_logits, task_members, trained_tasks, write_logits, write_predictions
from tasks.evaluation.metrics import TASK_METRIC, overall_score
from tasks.model import TASKS
from tasks.outdir import ENSEMBLE, check_kind, mark, replacing

log = logging.getLogger(__name__)




def _named_holdout(result: TaskResult, model_names: Sequence[str]) -> dict | None:
    """``result.holdout`` for ensemble.json: the selective folds' subsets as run names (their per-model
    scores, ``models``, follow the task's ``runs``)."""
    if not result.holdout or "subsets" not in result.holdout:
        return result.holdout
    return {**result.holdout, "subsets": [[model_names[m] for m in subset] for subset in result.holdout["subsets"]]}


def run_names(run_dirs: Sequence[str], names: Sequence[str] | None) -> list[str]:
    if names:
        return list(names)
    short = [Path(d).resolve().name for d in run_dirs]
    if any(n == "predictions" for n in short):  # runs/<name>/predictions: the run's name is the parent
        short = [Path(d).resolve().parent.name if n == "predictions" else n for d, n in zip(run_dirs, short)]
    return short if len(set(short)) == len(short) else [str(d) for d in run_dirs]


PROG = "python -m tasks.ensemble"


def build_parser() -> Parser:
    p = Parser(
        prog=PROG,
        description="Ensemble saved logits of several runs (minBERT paper §4.6) into leaderboard files.")
    p.add_argument("runs", nargs="+", help="run or predictions directories holding {task}-{dev,test}-logits.csv")
    p.add_argument("--method", choices=METHODS, default="simple", help="how the runs are combined")
    p.add_argument("--out-dir", required=True,
                   help="where predictions/, the submission zip and ensemble.json go; not an input run")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the output directory even when it holds another command's output "
                        "(a training run, ...)")
    p.add_argument("--data-dir", default="data", help="task CSV files, for the dev labels")
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS),
                   help=f"tasks to ensemble (default: {' '.join(TASKS)})")
    p.add_argument("--names", nargs="+", default=None, help="a name per run for the table (default: directory names)")
    p.add_argument("--max-exhaustive", type=int, default=10,
                   help="selective: try every subset up to this many models, greedy selection above")
    p.add_argument("--seed", type=int, default=0, help="regression: the dev split into halves")
    p.add_argument("--regression-sts", action="store_true",
                   help="regression: also fit STS (least squares); the paper did not, so STS is simply averaged")
    p.add_argument("--regression-l2", type=float, default=1e-3, help="regression: L2 penalty on the weights")
    p.add_argument("--regression-iters", type=int, default=300, help="regression: L-BFGS iterations")
    return p


def _fail(message: str, status: int) -> NoReturn:
    """A user's error: one line on stderr, exit status 2 (arguments) or 1 (the files they name)."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(status)


def check_paths(run_dirs: Sequence[str], out_dir: str, overwrite: bool = False) -> None:
    """Every run is a directory, and --out-dir cannot overwrite a run: it is not an input, nor its predictions
    folder, nor inside a folder that holds an input's logits (compared after resolving links and '..'), nor
    another command's output unless ``overwrite`` (tasks.outdir)."""
    for d in run_dirs:
        if not Path(d).is_dir():
            _fail(f"{'not a directory' if Path(d).exists() else 'no such directory'}: {d}", 2)
    out = Path(out_dir).resolve()
    for d in run_dirs:
        run = Path(d).resolve()
        holds_logits = [run / "predictions"] + ([run] if any(run.glob("*-logits.csv")) else [])
        if out == run or any(x.is_relative_to(f) for x in (out, out / "predictions") for f in holds_logits):
            _fail(f"--out-dir {out_dir} would overwrite the input run {d}; give the ensemble a folder of its own", 2)
    if out.exists() and not out.is_dir():
        _fail(f"--out-dir {out_dir} is a file; give a folder", 2)
    try:
        check_kind(Path(out_dir), ENSEMBLE, overwrite=overwrite)
    except FileExistsError as e:
        _fail(str(e), 2)


def ensemble_runs(args: argparse.Namespace) -> tuple[dict[str, TaskResult], list[str], list[str]]:
    """Read every task's logits and labels and ensemble them; nothing is written (a bad file stops it all).
    Returns (results, skipped outputs, what the submission lacks: ``missing_test_ids``)."""
    results: dict[str, TaskResult] = {}
    skipped: list[str] = []
    incomplete: list[str] = []
    trained = [trained_tasks(d) for d in args.runs]
    for task in args.tasks:
        runs = task_members(trained, task)
        run_dirs = [args.runs[i] for i in runs]
        dev = load_task_logits(run_dirs, task, "dev")
        if dev is None:
            print(f"{task}: no run has {task}-dev-logits.csv; task skipped", file=sys.stderr)
            skipped.extend([f"{task}-dev", f"{task}-test"])
            continue
        labels = dev_labels(task, dev.ids, args.data_dir, str(dev.files[0]))
        test = load_task_logits(run_dirs, task, "test")
        if test is None:
            print(f"{task}: no run has {task}-test-logits.csv (no {task} test file?); "
                  f"{task}-test-output.csv skipped", file=sys.stderr)
            skipped.append(f"{task}-test")
        elif (line := missing_test_ids(task, test.ids, args.data_dir)) is not None:
            incomplete.append(line)
        results[task] = ensemble_task(task, dev, labels, test, args.method, max_exhaustive=args.max_exhaustive,
                                      seed=args.seed, regression_sts=args.regression_sts, l2=args.regression_l2,
                                      max_iter=args.regression_iters)
        results[task].runs = runs
    return results, skipped, incomplete


def write_outputs(out_dir: Path, results: dict[str, TaskResult], summary: dict) -> list[Path]:
    """Write every output into a staging folder inside ``out_dir``, then move each into place, so that an
    error (a value a writer refuses, a full disk) leaves ``out_dir`` as it was. Returns the leaderboard files."""
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".ensemble-", dir=out_dir))
    try:
        staged = []
        for task, res in results.items():
            for split, preds in res.outputs.items():
                staged.append(write_predictions(stage / "predictions", task, split, preds))
                write_logits(stage / "predictions", task, split, preds)
        write_submission_zip(stage, staged)
        (stage / "ensemble.json").write_text(json.dumps(summary, indent=2) + "\n")
        mark(stage, ENSEMBLE)
        (out_dir / "predictions").mkdir(exist_ok=True)
        for f in sorted(stage.rglob("*")):
            if f.is_file():
                os.replace(f, out_dir / f.relative_to(stage))
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                shutil.rmtree(out_dir)
        raise
    shutil.rmtree(stage)
    return [out_dir / "predictions" / f.name for f in staged]


def main(argv: Sequence[str] | None = None) -> dict:
    """The command line; a user-caused error after argument checking is one line and exit status 1 (tasks.cli)."""
    with user_errors(PROG):
        return _main(argv)


def _main(argv: Sequence[str] | None) -> dict:
    args = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.max_exhaustive < 1:
        _fail("--max-exhaustive must be at least 1", 2)
    if args.regression_sts and args.method != "regression":
        _fail("--regression-sts only applies to --method regression", 2)
    check_paths(args.runs, args.out_dir, args.overwrite)
    if args.names and len(args.names) != len(args.runs):
        _fail(f"--names gives {len(args.names)} names for {len(args.runs)} runs; give one per run", 2)
    names = run_names(args.runs, args.names)
    out_dir = Path(args.out_dir)
    try:
        results, skipped, incomplete = ensemble_runs(args)
    except (ValueError, FileNotFoundError) as e:  # a bad or missing input file, named in the message
        _fail(str(e), 1)
    if not results:
        _fail(f"no task had dev logits in {', '.join(args.runs)}; nothing to ensemble", 1)

    model_names = {t: r.model_names(names) for t, r in results.items()}  # specialists are models of their tasks
    summary = {
        "method": args.method, "runs": [str(r) for r in args.runs], "names": names, "data_dir": args.data_dir,
        "seed": args.seed, "skipped": skipped, "submission": str(out_dir / SUBMISSION_ZIP),
        **({"incomplete": incomplete} if incomplete else {}),
        "tasks": {t: {"model_scores": r.model_scores, "simple_score": r.simple_score,
                      "ensemble_score": r.ensemble_score, "models": [model_names[t][m] for m in r.models],
                      "runs": model_names[t], "weights": r.weights, "bias": r.bias,
                      "holdout": _named_holdout(r, model_names[t]), "note": r.note}
                  for t, r in results.items()},
    }
    if args.method in ("regression", "selective"):  # the honest overall: every task scored on held-out dev
        summary["holdout_overall"] = overall_score(
            {TASK_METRIC[t]: r.holdout[args.method] for t, r in results.items()})
    with replacing(out_dir, ENSEMBLE, overwrite=args.overwrite):  # another command's output: aside until done
        written = write_outputs(out_dir, results, summary)

    tasks = [t for t in args.tasks if t in results]
    def per_run(values: Callable[[TaskResult], Sequence]) -> list[tuple[str, dict[str, float]]]:
        """A table row per input run: its value in each task it is a model of ("-" where a specialist is not)."""
        cells = {t: results[t].by_run(values(results[t])) for t in tasks}
        return [(name, {t: cells[t][i] for t in tasks if i in cells[t]}) for i, name in enumerate(names)]

    rows = per_run(lambda r: r.model_scores)
    rows.append(("ensemble: simple", {t: results[t].simple_score for t in tasks}))
    if args.method != "simple":
        rows.append((f"ensemble: {args.method}", {t: results[t].ensemble_score for t in tasks}))
    if args.method == "regression":
        rows[-1] = ("ensemble: regression*", rows[-1][1])
    sizes = ", ".join(f"{t} n={len(results[t].outputs['dev'])}" for t in tasks)
    print(f"dev scores ({sizes})")
    print(format_table(rows, tasks))
    if args.method == "regression":
        print("  * on the whole dev set, including the half its weights were fit on; see the held-out table")
    for t in tasks:
        r = results[t]
        if args.method == "selective":
            print(f"  {t}: models {[model_names[t][m] for m in r.models]}; {r.note}")
        elif args.method == "regression":
            detail = ""
            if r.weights is not None:
                detail = "weights " + ", ".join(f"{n} {w:.3f}" for n, w in zip(model_names[t], r.weights))
                detail += f", bias {r.bias:.3f}; " if r.bias is not None else "; "
            print(f"  {t}: {detail}{r.note}")
    if args.method in ("regression", "selective"):
        hold_rows = per_run(lambda r: r.holdout["models"])
        hold_rows.append(("ensemble: simple", {t: results[t].holdout["simple"] for t in tasks}))
        hold_rows.append((f"ensemble: {args.method}", {t: results[t].holdout[args.method] for t in tasks}))
        print(("held-out dev half (the regression weights never saw it; " if args.method == "regression" else
               "two-fold dev (subset chosen on one half, scored on the other, both ways, mean; ")
              + ", ".join(f"{t} n={results[t].holdout['n_eval']}" for t in tasks) + ")")
        print(format_table(hold_rows, tasks))

    print(f"wrote {len(written)} leaderboard files to {out_dir / 'predictions'} and {out_dir / SUBMISSION_ZIP}"
          + (f"; skipped: {', '.join(skipped)}" if skipped else ""))
    for line in incomplete:
        print(f"SUBMISSION INCOMPLETE: {line}", file=sys.stderr)
    return summary


if __name__ == "__main__":
    main()

