"""Ensembles of saved predictions: simple, selective and regression (minBERT paper §4.6).

Each run is a predictions directory holding the raw outputs that
``tasks.evaluate.write_logits`` saves: ``{task}-{split}-logits.csv`` for the
dev and test splits (SST: id,logit_0..logit_4; paraphrase: id,logit; STS:
id,score). A run directory that holds them under ``predictions/`` works too.

Methods (../shared/papers/minbert-downstream-generalization.txt, §4.6; the math is in tasks.ensemble_methods):
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

Dev labels come from the task files (``tasks.readers.load_split(task, "dev",
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
import stat
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import torch

from tasks.argparsing import Parser
from tasks.ensemble_methods import average, fit_regression, predict, select_subset, split_halves
from tasks.errors import user_errors
from tasks.evaluate import (
    NUM_SST_CLASSES,
    TASK_METRIC,
    Predictions,
    overall_score,
    read_logits,
    score,
    temp_file_beside,
    write_logits,
    write_predictions,
)
from tasks.readers import load_split

log = logging.getLogger(__name__)

TASKS = ("sst", "para", "sts")
METHODS = ("simple", "selective", "regression")
TASK_LABELS = {"sst": "SST acc", "para": "Para acc", "sts": "STS r"}


# ---- reading runs ---------------------------------------------------------------------


def logits_path(run_dir: str | os.PathLike[str], task: str, split: str) -> Path:
    """``run_dir/{task}-{split}-logits.csv``, or under ``run_dir/predictions/`` when only that exists."""
    run_dir = Path(run_dir)
    name = f"{task}-{split}-logits.csv"
    direct = run_dir / name
    nested = run_dir / "predictions" / name
    if not direct.is_file() and nested.is_file():
        return nested
    return direct


def trained_tasks(run_dir: str | os.PathLike[str]) -> tuple[str, ...] | None:
    """The tasks a training run was trained on (its ``config.json``, beside or above ``predictions/``); None
    for a folder of logits with no training config (an ensemble's output): it is taken to have every task."""
    run_dir = Path(run_dir)
    for folder in (run_dir, run_dir.parent) if run_dir.name == "predictions" else (run_dir,):
        config = folder / "config.json"
        if config.is_file():
            try:
                tasks = json.loads(config.read_text(encoding="utf-8"))["tasks"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{config}: no list of tasks in it ({e}); "
                                 "is it a training run's config.json?") from None
            if not isinstance(tasks, list) or not set(tasks) <= set(TASKS):
                raise ValueError(f"{config}: 'tasks' is {tasks!r}, not a list of {', '.join(TASKS)}")
            return tuple(tasks)
    return None


def task_members(trained: Sequence[tuple[str, ...] | None], task: str) -> list[int]:
    """Indices of the runs (their ``trained_tasks``) that are models of ``task``: its specialists and every
    run that is not one."""
    return [i for i, own in enumerate(trained) if own is None or task in own]


@dataclass
class TaskLogits:
    """All runs' outputs for one task and split, aligned to ``ids`` (the first run's order).

    logits[m]: float64, SST (N, 5), paraphrase / STS (N,). files[m]: where run m's came from.
    """

    task: str
    split: str
    ids: list[str]
    logits: list[torch.Tensor]
    files: list[Path]


def load_task_logits(run_dirs: Sequence[str | os.PathLike[str]], task: str, split: str) -> TaskLogits | None:
    """Read and align every run's ``{task}-{split}-logits.csv``; None when no run has the file.

    A file missing from some runs only, a file with a repeated id, a wrong
    shape, or ids that differ from the first run's raise, naming the file.
    """
    paths = [logits_path(d, task, split) for d in run_dirs]
    present = [p.is_file() for p in paths]
    if not any(present):
        return None
    if not all(present):
        missing = [str(p) for p, ok in zip(paths, present) if not ok]
        raise FileNotFoundError(f"{task}-{split}: {len(missing)} of {len(paths)} runs lack their logits file: "
                                f"{', '.join(missing)}; every run of an ensemble needs the same files (a run "
                                "trained on some tasks only is known by the config.json beside its predictions/)")
    ref_ids: list[str] | None = None
    aligned: list[torch.Tensor] = []
    for path in paths:
        ids, values = read_logits(path)
        want = (len(ids), NUM_SST_CLASSES) if task == "sst" else (len(ids),)
        if tuple(values.shape) != want:
            raise ValueError(f"{path}: logits of shape {tuple(values.shape)}; {task} needs {want}")
        position = {i: n for n, i in enumerate(ids)}
        if len(position) != len(ids):
            dup = next(i for n, i in enumerate(ids) if position[i] != n)
            raise ValueError(f"{path}: id {dup!r} appears more than once")
        if ref_ids is None:
            ref_ids, ref_path = ids, path
            aligned.append(values.double())
            continue
        if set(ids) != set(ref_ids):
            missing = [i for i in ref_ids if i not in position]
            extra = sorted(set(ids) - set(ref_ids))
            raise ValueError(
                f"{path}: its ids differ from {ref_path}'s: {len(missing)} missing (e.g. {missing[:3]}), "
                f"{len(extra)} extra (e.g. {extra[:3]}); were the runs made on the same data files?")
        order = torch.tensor([position[i] for i in ref_ids], dtype=torch.long)
        aligned.append(values.double()[order])
    return TaskLogits(task, split, list(ref_ids), aligned, paths)


def dev_labels(task: str, ids: Sequence[str], data_dir: str | os.PathLike[str], source: str) -> torch.Tensor:
    """The dev labels for ``ids`` from ``data_dir``'s dev file, in the order of ``ids``.

    Ids the data file lacks are an error naming ``source`` (the logits file);
    data-file ids the logits lack (a run made with --limit) are allowed with a warning.
    """
    examples, report = load_split(task, "dev", data_dir)
    label = {e.id: e.label for e in examples}
    unknown = [i for i in ids if i not in label]
    if unknown:
        raise ValueError(f"{source}: {len(unknown)} ids are not in {report.path} (e.g. {unknown[:3]}); "
                         "is --data-dir the data these predictions were made on?")
    if len(label) > len(ids):
        log.warning("%s: covers %d of the %d ids in %s; scoring on those", source, len(ids), len(label), report.path)
    return torch.tensor([label[i] for i in ids], dtype=torch.float64)


# ---- the whole ensemble ------------------------------------------------------------------


@dataclass
class TaskResult:
    task: str
    model_scores: list[float]  # full dev, per model
    simple_score: float  # full dev
    ensemble_score: float  # full dev (selective: optimistic; regression: includes the fit half)
    models: list[int]  # models used
    weights: list[float] | None = None
    bias: float | None = None
    note: str = ""
    # held-out scores: regression {"n_eval", "models", "simple", "regression"} on the half it was not fit on;
    # selective {"n_eval", "models", "simple", "selective", "subsets"}: two folds, chosen on one half, scored on the other
    holdout: dict | None = None
    outputs: dict[str, Predictions] = field(default_factory=dict)  # split -> ensemble predictions
    runs: list[int] = field(default_factory=list)  # model m is input run runs[m] (specialists join their tasks only)

    def by_run(self, per_model: Sequence) -> dict[int, object]:
        """{input run index: value} of a per-model list (model scores, weights)."""
        return {self.runs[m]: v for m, v in enumerate(per_model)}

    def model_names(self, names: Sequence[str]) -> list[str]:
        """The name of each of this task's models, from the input runs' ``names``."""
        return [names[i] for i in self.runs]


def ensemble_task(task: str, dev: TaskLogits, labels: torch.Tensor, test: TaskLogits | None, method: str, *,
                  max_exhaustive: int = 10, seed: int = 0, regression_sts: bool = False, l2: float = 1e-3,
                  max_iter: int = 300) -> TaskResult:
    """Run ``method`` on one task: choose on dev, apply to dev and test; scores on dev."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; methods: {METHODS}")
    n_models = len(dev.logits)
    if test is not None and len(test.logits) != n_models:
        raise ValueError(f"{task}: {n_models} runs have dev logits but {len(test.logits)} have test logits")
    model_scores = [score(task, predict(task, x), labels) for x in dev.logits]
    simple_dev = average(task, dev.logits)
    simple_score = score(task, simple_dev[1], labels)
    result = TaskResult(task, model_scores, simple_score, simple_score, list(range(n_models)),
                        runs=list(range(n_models)))  # ensemble_runs maps them to its input runs

    def finish(dev_out: tuple[torch.Tensor, torch.Tensor], test_fn) -> TaskResult:
        result.outputs["dev"] = Predictions(dev.ids, dev_out[0].float(), _pred_dtype(task, dev_out[1]))
        if test is not None:
            z, p = test_fn(test.logits)
            result.outputs["test"] = Predictions(test.ids, z.float(), _pred_dtype(task, p))
        return result

    if method == "simple":
        return finish(simple_dev, lambda xs: average(task, xs))
    if method == "selective":
        subset, best = select_subset(task, dev.logits, labels, max_exhaustive)
        result.models, result.ensemble_score = list(subset), best
        result.holdout = selective_two_fold(task, dev.logits, labels, max_exhaustive, seed)
        result.note = (f"subset chosen on this dev set (optimistic); chosen on one half and scored on the other, "
                       f"both ways: {result.holdout['selective']:.4f}")
        pick = lambda xs: [xs[m] for m in subset]  # noqa: E731
        return finish(average(task, pick(dev.logits)), lambda xs: average(task, pick(xs)))
    # regression
    fit_idx, eval_idx = split_halves(len(dev.ids), seed)
    half = lambda xs, idx: [x[idx] for x in xs]  # noqa: E731
    held_x, held_y = half(dev.logits, eval_idx), labels[eval_idx]
    holdout = {"n_fit": len(fit_idx), "n_eval": len(eval_idx),
               "models": [score(task, predict(task, x), held_y) for x in held_x],
               "simple": score(task, average(task, held_x)[1], held_y)}
    if task == "sts" and not regression_sts:
        result.note = ("the paper fit no regression ensembler for STS: simple average "
                       "(--regression-sts fits least-squares weights)")
        holdout["regression"] = holdout["simple"]
        result.holdout = holdout
        return finish(simple_dev, lambda xs: average(task, xs))
    fit = fit_regression(task, half(dev.logits, fit_idx), labels[fit_idx], l2=l2, max_iter=max_iter)
    holdout["regression"] = score(task, fit.apply(held_x)[1], held_y)
    result.weights, result.bias, result.holdout = fit.weights, fit.bias, holdout
    dev_out = fit.apply(dev.logits)
    result.ensemble_score = score(task, dev_out[1], labels)
    result.note = f"weights fit on {len(fit_idx)} dev examples ({fit.objective}); honest score on the other {len(eval_idx)}"
    return finish(dev_out, fit.apply)


def selective_two_fold(task: str, logits: list[torch.Tensor], labels: torch.Tensor, max_exhaustive: int,
                       seed: int) -> dict:
    """The selective ensemble scored honestly: a subset chosen on one dev half is scored on the other, both ways.

    Returns {"n_eval", "models", "simple", "selective"} like the regression's
    held-out record: each score the mean over the two folds (each fold scored
    on its own half, so ``selective`` never saw the examples it is scored on).
    """
    a, b = split_halves(len(labels), seed)
    per_fold: list[dict[str, object]] = []
    for fit_idx, eval_idx in ((a, b), (b, a)):
        subset, _ = select_subset(task, [x[fit_idx] for x in logits], labels[fit_idx], max_exhaustive)
        held = [x[eval_idx] for x in logits]
        per_fold.append({"models": [score(task, predict(task, x), labels[eval_idx]) for x in held],
                         "simple": score(task, average(task, held)[1], labels[eval_idx]),
                         "selective": score(task, average(task, [held[m] for m in subset])[1], labels[eval_idx]),
                         "subset": list(subset)})
    mean = lambda k: sum(f[k] for f in per_fold) / 2  # noqa: E731
    return {"n_eval": len(labels), "models": [sum(f["models"][m] for f in per_fold) / 2 for m in range(len(logits))],
            "simple": mean("simple"), "selective": mean("selective"), "subsets": [f["subset"] for f in per_fold]}


def _named_holdout(result: TaskResult, model_names: Sequence[str]) -> dict | None:
    """``result.holdout`` for ensemble.json: the selective folds' subsets as run names (their per-model
    scores, ``models``, follow the task's ``runs``)."""
    if not result.holdout or "subsets" not in result.holdout:
        return result.holdout
    return {**result.holdout, "subsets": [[model_names[m] for m in subset] for subset in result.holdout["subsets"]]}


def _pred_dtype(task: str, preds: torch.Tensor) -> torch.Tensor:
    return preds.float() if task == "sts" else preds.long()


# ---- output ---------------------------------------------------------------------------------


def format_table(rows: list[tuple[str, dict[str, float]]], tasks: Sequence[str]) -> str:
    """A fixed-width table: name, one column per task metric, overall."""
    width = max([len(name) for name, _ in rows] + [10])
    header = f"{'':<{width}}  " + "  ".join(f"{TASK_LABELS[t]:>8}" for t in tasks) + f"  {'overall':>8}"
    lines = [header]
    for name, scores in rows:
        cells = [f"{scores[t]:>8.4f}" if t in scores else f"{'-':>8}" for t in tasks]
        metrics = {TASK_METRIC[t]: v for t, v in scores.items()}
        whole = metrics and all(t in scores for t in tasks)  # a specialist's row has no overall
        overall = f"{overall_score(metrics):>8.4f}" if whole else f"{'-':>8}"
        lines.append(f"{name:<{width}}  " + "  ".join(cells) + f"  {overall}")
    return "\n".join(lines)


SUBMISSION_ZIP = "cs224n_default_final_project_submission.zip"
ZIP_ENTRY_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip entry can hold: entries carry no file times


def project_sources() -> list[tuple[Path, str]]:
    """(file, path in the zip) of the project's code: train_multitask.py, minbert/ and tasks/ (.py files)."""
    root = Path(__file__).resolve().parents[1]
    files = [root / "train_multitask.py"] + sorted((root / "minbert").rglob("*.py")) + sorted(
        (root / "tasks").rglob("*.py"))
    return [(f, f.relative_to(root).as_posix()) for f in files if f.is_file()]


def write_submission_zip(out_dir: Path, written: list[Path]) -> Path:
    """``out_dir/cs224n_default_final_project_submission.zip`` in the starter's layout, written atomically.

    As the CS224N starter's prepare_submit.py zips its folder (it writes
    ``./<file>``, which zipfile stores as ``<file>``): the code as ``<path>.py``
    and the leaderboard files as ``predictions/<name>``. Entries carry a fixed
    date and mode instead of the files' own, so the same files give the same
    bytes (a rerun that reuses every member writes the same zip).
    """
    path = out_dir / SUBMISSION_ZIP
    fd, tmp = temp_file_beside(path)  # the umask's mode (0644), not mkstemp's 0600
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for f, arcname in [*project_sources(), *((f, f"predictions/{f.name}") for f in written)]:
                entry = zipfile.ZipInfo(arcname, date_time=ZIP_ENTRY_DATE)
                entry.compress_type = zipfile.ZIP_DEFLATED
                entry.external_attr = (stat.S_IFREG | 0o644) << 16  # a regular file, rw-r--r--
                z.writestr(entry, f.read_bytes())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def run_names(run_dirs: Sequence[str], names: Sequence[str] | None) -> list[str]:
    if names:
        if len(names) != len(run_dirs):
            raise ValueError(f"--names gives {len(names)} names for {len(run_dirs)} runs")
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


def check_paths(run_dirs: Sequence[str], out_dir: str) -> None:
    """Every run is a directory, and --out-dir cannot overwrite a run: it is not an input, nor its predictions
    folder, nor inside a folder that holds an input's logits (compared after resolving links and '..')."""
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


def ensemble_runs(args: argparse.Namespace) -> tuple[dict[str, TaskResult], list[str]]:
    """Read every task's logits and labels and ensemble them; nothing is written (a bad file stops it all)."""
    results: dict[str, TaskResult] = {}
    skipped: list[str] = []
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
        results[task] = ensemble_task(task, dev, labels, test, args.method, max_exhaustive=args.max_exhaustive,
                                      seed=args.seed, regression_sts=args.regression_sts, l2=args.regression_l2,
                                      max_iter=args.regression_iters)
        results[task].runs = runs
    return results, skipped


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
    """The command line; a user-caused error after argument checking is one line and exit status 1 (tasks/errors.py)."""
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
    check_paths(args.runs, args.out_dir)
    if args.names and len(args.names) != len(args.runs):
        _fail(f"--names gives {len(args.names)} names for {len(args.runs)} runs; give one per run", 2)
    names = run_names(args.runs, args.names)
    out_dir = Path(args.out_dir)
    try:
        results, skipped = ensemble_runs(args)
    except (ValueError, FileNotFoundError) as e:  # a bad or missing input file, named in the message
        _fail(str(e), 1)
    if not results:
        _fail(f"no task had dev logits in {', '.join(args.runs)}; nothing to ensemble", 1)

    model_names = {t: r.model_names(names) for t, r in results.items()}  # specialists are models of their tasks
    summary = {
        "method": args.method, "runs": [str(r) for r in args.runs], "names": names, "data_dir": args.data_dir,
        "seed": args.seed, "skipped": skipped, "submission": str(out_dir / SUBMISSION_ZIP),
        "tasks": {t: {"model_scores": r.model_scores, "simple_score": r.simple_score,
                      "ensemble_score": r.ensemble_score, "models": [model_names[t][m] for m in r.models],
                      "runs": model_names[t], "weights": r.weights, "bias": r.bias,
                      "holdout": _named_holdout(r, model_names[t]), "note": r.note}
                  for t, r in results.items()},
    }
    if args.method in ("regression", "selective"):  # the honest overall: every task scored on held-out dev
        summary["holdout_overall"] = overall_score(
            {TASK_METRIC[t]: r.holdout[args.method] for t, r in results.items()})
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
    return summary


if __name__ == "__main__":
    main()
