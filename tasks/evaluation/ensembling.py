"""Ensembles of saved runs: reading their logits, the three methods, the submission zip.

- The methods of the minBERT paper §4.6 as functions of in-memory logits
  (float64 tensors, one per model): ``average`` (simple), ``select_subset``
  (selective), ``fit_regression`` (the regression ensembler), and
  ``ensemble_task``, which runs one of them on a task's dev and test logits
  with its honest held-out score.
- Reading the runs: each run's ``{task}-{split}-logits.csv`` aligned by id
  and which tasks a run was trained on with the tasks the runs declare
  (tasks.predictions' ``load_task_logits``, ``read_runs``), and the dev labels (``dev_labels``).
- ``write_submission_zip``: the CS224N submission zip of the code and the
  leaderboard files.
- The ensemble the command makes: its options (``EnsembleConfig``), checked
  before anything is read (``check_ensemble``), then every task ensembled and
  the outputs written (``make_ensemble``).
The command around them is tasks.ensemble (python -m tasks.ensemble).

Usage:
    logits, preds = average("sst", [run_a, run_b])                 # (N, 5), (N,)
    subset, dev_score = select_subset("sst", [run_a, run_b, run_c], dev_labels)
    fit = fit_regression("para", [run_a, run_b], labels); logits, preds = fit.apply([a_test, b_test])
    dev = load_task_logits(["runs/a", "runs/b"], "sst", "dev")      # TaskLogits, or None when no run has it
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import stat
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tasks.predictions import (
    Predictions,
    TaskLogits,
    load_task_logits,
    saved_run,
    task_members,
    write_logits,
    write_predictions,
)
from tasks.data.readers import DataFileMissing
from tasks.storage import atomic_file, staged_files, write_text

logger = logging.getLogger(__name__)
from tasks.evaluation.metrics import task_metric, overall_score, score
from tasks.task import MULTITASK, PACKAGE, Task, Tasks, get_task, load_split
from tasks.options import option
from tasks.outdir import ENSEMBLE, check_kind, mark, replacing


# ---- the methods, on in-memory logits ----
def predict(task: str | Task, logits: torch.Tensor) -> torch.Tensor:
    """A single model's predictions, its kind's rule (as tasks.model.MultitaskBert.predict)."""
    return get_task(task).kind.predict(logits)


def average(task: str | Task, logits: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Simple ensemble of models' logits: (ensemble logits, predictions), in float64, by the task's kind.

    Classes: mean of softmax probabilities; logits = log of that mean; prediction its argmax.
    A pair classification: mean of sigmoid probabilities, computed as the mean of
    tanh(x/2) = 2p - 1 so that its sign (p > 1/2) is exact even for tiny
    logits; logits = log(p̄ / (1 - p̄)), which has the prediction's sign.
    A regression: mean score. One model, or identical models, give back that model's
    predictions exactly.
    """
    if not logits:
        raise ValueError("average of no models")
    return get_task(task).kind.average(torch.stack([t.double() for t in logits]))  # (M, N[, C])


def _contributions(task: str | Task, logits: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-model quantities whose mean decides the simple ensemble's prediction (for fast subset search)."""
    return get_task(task).kind.contributions(torch.stack([t.double() for t in logits]))


def _safe(value: float) -> float:
    """nan scores (constant STS predictions) rank below everything."""
    return -math.inf if math.isnan(value) else value


def select_subset(task: str | Task, logits: Sequence[torch.Tensor], labels: torch.Tensor,
                  max_exhaustive: int = 10) -> tuple[tuple[int, ...], float]:
    """The model subset whose simple average scores best on (``logits``, ``labels``), and that score.

    Every non-empty subset when there are at most ``max_exhaustive`` models
    (2^M - 1 of them), greedy forward selection otherwise (add the model that
    helps most, stop when none helps). Ties go to the smaller subset, then the
    earlier models.
    """
    contrib = _contributions(task, logits)  # (M, N[, 5])
    n_models = contrib.shape[0]

    def subset_score(subset: Sequence[int]) -> float:
        mean = contrib[list(subset)].mean(0)
        return _safe(score(task, predict(task, mean), labels))  # para: mean tanh(x/2) > 0 iff mean p > 1/2

    if n_models <= max_exhaustive:
        best, best_score = (), -math.inf
        for k in range(1, n_models + 1):
            for subset in itertools.combinations(range(n_models), k):
                s = subset_score(subset)
                if s > best_score:
                    best, best_score = subset, s
        return best, best_score
    chosen: list[int] = []
    best_score = -math.inf
    while len(chosen) < n_models:
        candidates = [(subset_score(chosen + [m]), -m) for m in range(n_models) if m not in chosen]
        s, neg_m = max(candidates)
        if s <= best_score:
            break
        chosen.append(-neg_m)
        best_score = s
    return tuple(sorted(chosen)), best_score


@dataclass
class RegressionFit:
    """Weights of the regression ensembler for one task (its entry): z = Σ_m w_m · logits_m (+ bias)."""

    task: Task
    weights: list[float]
    bias: float | None
    n_fit: int
    objective: str

    def apply(self, logits: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ensemble logits, predictions); SST logits (N, 5), paraphrase logit / STS score (N,)."""
        x = torch.stack([t.double() for t in logits])  # (M, N[, 5])
        if x.shape[0] != len(self.weights):
            raise ValueError(f"{self.task.name}: fit on {len(self.weights)} models, applied to {x.shape[0]}")
        w = torch.tensor(self.weights, dtype=torch.float64).view(-1, *([1] * (x.dim() - 1)))
        z = (w * x).sum(0)
        if self.bias is not None:
            z = z + self.bias
        return z, predict(self.task, z)


def fit_regression(task: str | Task, logits: Sequence[torch.Tensor], labels: torch.Tensor, l2: float = 1e-3,
                   max_iter: int = 300) -> RegressionFit:
    """Fit the regression ensembler's weights on (``logits``, ``labels``), by the task's kind (``Kind.fit``).

    Classes (SST): softmax(Σ w_m x_m), cross-entropy; a pair classification (paraphrase): sigmoid(Σ w_m x_m + b),
    binary cross-entropy; both minimised by L-BFGS (strong Wolfe line search)
    from w = 1/M, with ``l2`` · Σ w_m² added so that a useless model's weight
    goes to 0 rather than wandering. A regression (STS): least squares of the gold score on
    [scores, 1] (closed form; the paper did not ensemble STS this way).
    """
    task = get_task(task)
    kind = task.kind
    x = torch.stack([t.double() for t in logits])  # (M, N[, C])
    weights, bias = kind.fit(x, labels.double(), l2, max_iter)
    return RegressionFit(task, weights, bias, x.shape[1], kind.fit_objective)


def split_halves(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded random split of range(n): (dev-train indices, dev-dev indices), sizes n//2 and n - n//2."""
    if n < 2:
        raise ValueError(f"cannot split {n} dev examples into two halves")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[: n // 2].sort().values, perm[n // 2:].sort().values

# ---- reading the runs' logits and labels; one task's ensemble ----
log = logging.getLogger(__name__)


METHODS = ("simple", "selective", "regression")


def missing_test_ids(task: str | Task, ids: Sequence[str], data_dir: str | os.PathLike[str]) -> str | None:
    """What a task's test output with ``ids`` lacks against the ids of its test input file in ``data_dir``: the
    line of a SUBMISSION INCOMPLETE, or None when it lacks nothing (or there is no input file to check against)."""
    loaded = load_split(task, "test", data_dir)
    task = get_task(task).name
    if loaded is None:
        return None
    expected, report = [e.id for e in loaded[0]], loaded[1]
    have = set(ids)
    missing = [i for i in expected if i not in have]
    if not missing:
        return None
    shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
    return (f"{task}-test-output.csv lacks {len(missing)} of the {len(expected)} ids of {report.path} ({shown}): no "
            f"member predicted them; predict them again (train_multitask.py --eval-only on each member) and ensemble "
            "again")


def dev_labels(task: str | Task, ids: Sequence[str], data_dir: str | os.PathLike[str], source: str) -> torch.Tensor:
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


@dataclass
class TaskResult:
    task: Task  # its entry
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


def ensemble_task(task: str | Task, dev: TaskLogits, labels: torch.Tensor | None, test: TaskLogits | None,
                  method: str, *, max_exhaustive: int = 10, seed: int = 0, fit_scores: bool = False, l2: float = 1e-3,
                  max_iter: int = 300) -> TaskResult:
    """Run ``method`` on one task (its entry, or the name of one this package declares): choose on dev, apply to
    dev and test; scores on dev (``labels`` None: the simple average, every score nan)."""
    task = get_task(task)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; methods: {METHODS}")
    if labels is None and method != "simple":
        raise ValueError(f"{task.name}: the {method} ensemble chooses on dev labels, and there are none")
    n_models = len(dev.logits)
    if test is not None and len(test.logits) != n_models:
        raise ValueError(f"{task.name}: {n_models} runs have dev logits but {len(test.logits)} have test logits")
    scored = (lambda preds: score(task, preds, labels)) if labels is not None else (lambda preds: math.nan)
    model_scores = [scored(predict(task, x)) for x in dev.logits]
    simple_dev = average(task, dev.logits)
    simple_score = scored(simple_dev[1])
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
    if not get_task(task).kind.fit_unasked and not fit_scores:
        result.note = ("the paper fit no regression ensembler for scores (STS): simple average "
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


def selective_two_fold(task: str | Task, logits: list[torch.Tensor], labels: torch.Tensor, max_exhaustive: int,
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


def _pred_dtype(task: str | Task, preds: torch.Tensor) -> torch.Tensor:
    return preds.to(get_task(task).kind.pred_dtype())


def format_table(rows: list[tuple[str, dict[str, float]]], tasks: Sequence[str], entries: Tasks | None = None) -> str:
    """A fixed-width table: name, one column per task metric (of ``entries``: the runs'; default: the package's),
    overall."""
    entries = entries if entries is not None else PACKAGE
    width = max([len(name) for name, _ in rows] + [10])
    header = f"{'':<{width}}  " + "  ".join(f"{entries[t].table_title:>8}" for t in tasks) + f"  {'overall':>8}"
    lines = [header]
    for name, scores in rows:
        cells = [f"{scores[t]:>8.4f}" if t in scores else f"{'-':>8}" for t in tasks]
        metrics = {task_metric(entries[t]): v for t, v in scores.items()}
        whole = metrics and all(t in scores for t in tasks)  # a specialist's row has no overall
        overall = f"{overall_score(metrics, tasks=entries):>8.4f}" if whole else f"{'-':>8}"
        lines.append(f"{name:<{width}}  " + "  ".join(cells) + f"  {overall}")
    return "\n".join(lines)


# ---- the submission zip ----
SUBMISSION_ZIP = "cs224n_default_final_project_submission.zip"


ZIP_ENTRY_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip entry can hold: entries carry no file times


def project_sources() -> list[tuple[Path, str]]:
    """(file, path in the zip) of the project's code: train_multitask.py, minbert/ and tasks/ (.py files)."""
    root = Path(__file__).resolve().parents[2]
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
    with atomic_file(path) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for f, arcname in [*project_sources(), *((f, f"predictions/{f.name}") for f in written)]:
            entry = zipfile.ZipInfo(arcname, date_time=ZIP_ENTRY_DATE)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = (stat.S_IFREG | 0o644) << 16  # a regular file, rw-r--r--
            z.writestr(entry, f.read_bytes())
    return path


# ---- an ensemble of runs, from their directories to its own ----


@dataclass
class EnsembleConfig:
    """What an ensemble combines and how (each field is a flag of python -m tasks.ensemble)."""

    runs: list[str] = option(help="run or predictions directories holding {task}-{dev,test}-logits.csv",
                             factory=list, positional=True, nargs="+")
    method: str = option("simple", "how the runs are combined", choices=METHODS)
    out_dir: str = option(help="where predictions/, the submission zip and ensemble.json go; not an input run",
                          metavar="DIR", factory=str)
    overwrite: bool = option(False, "replace the output directory even when it holds another command's output "
                                    "(a training run, ...; never one a live process writes)")
    data_dir: str = option("data", "task CSV files, for the dev labels and the test ids", metavar="DIR")
    tasks: list[str] = option(help="tasks to ensemble (default: every task a run was trained on; sst para sts for "
                                   "runs without a training config)", factory=list, nargs="+")
    names: list[str] | None = option(None, "a name per run for the table (default: directory names)", nargs="+")
    max_exhaustive: int = option(10, "selective: try every subset up to this many models, greedy selection above",
                                 metavar="N")
    seed: int = option(0, "regression: the dev split into halves", metavar="SEED")
    fit_scores: bool = option(False, "regression: also fit the regression tasks' weights (STS: least squares); "
                                     "the paper did not, so scores are simply averaged", flag="--regression-sts")
    regression_l2: float = option(1e-3, "regression: L2 penalty on the weights", metavar="L2")
    regression_iters: int = option(300, "regression: L-BFGS iterations", metavar="N")

    def __post_init__(self) -> None:
        if not self.runs:
            raise ValueError("an ensemble needs runs: name their directories")
        if self.max_exhaustive < 1:
            raise ValueError("--max-exhaustive must be at least 1")
        if self.fit_scores and self.method != "regression":
            raise ValueError("--regression-sts only applies to --method regression")
        if self.names and len(self.names) != len(self.runs):
            raise ValueError(f"--names gives {len(self.names)} names for {len(self.runs)} runs; give one per run")


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


def check_ensemble(config: EnsembleConfig) -> None:
    """Every check of an ensemble before anything is read (a ValueError / OSError naming the path): every run is
    a directory, and --out-dir cannot overwrite a run: it is not an input, nor its predictions folder, nor inside
    a folder that holds an input's logits (compared after resolving links and '..'), nor another command's output
    unless ``overwrite``, nor a directory a live process writes (tasks.outdir)."""
    run_dirs, out_dir = config.runs, config.out_dir
    for d in run_dirs:
        if not Path(d).is_dir():
            raise NotADirectoryError(f"{'not a directory' if Path(d).exists() else 'no such directory'}: {d}")
    out = Path(out_dir).resolve()
    for d in run_dirs:
        run = Path(d).resolve()
        holds_logits = [run / "predictions"] + ([run] if any(run.glob("*-logits.csv")) else [])
        if out == run or any(x.is_relative_to(f) for x in (out, out / "predictions") for f in holds_logits):
            raise ValueError(f"--out-dir {out_dir} would overwrite the input run {d}; give the ensemble a folder of "
                             "its own")
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out-dir {out_dir} is a file; give a folder")
    check_kind(Path(out_dir), ENSEMBLE, overwrite=config.overwrite)


def runs_tasks(trained: Sequence[tuple[str, ...] | None], entries: Tasks) -> list[str]:
    """Every task of the runs (the tasks each was trained on, ``read_runs``; a run without a training config: the project's three), in
    the order of their ``entries`` (``runs_entries``)."""
    have = {t for own in trained for t in (own if own is not None else MULTITASK)}
    return [t for t in entries if t in have]


Runs = tuple[list[tuple[str, ...] | None], Tasks]  # what ``read_runs`` gives


def read_runs(run_dirs: Sequence[str | os.PathLike[str]]) -> Runs:
    """Each run's config.json read once (``saved_run``): the tasks each run was trained on (None: a folder of
    logits alone, taken to have every task), and the runs' tasks resolved once (the package's and each run's own,
    as it saved them); a run that declares a name otherwise than the runs before it is a ValueError naming the run
    and what differs."""
    trained: list[tuple[str, ...] | None] = []
    own: list[Task] = []
    for run_dir in run_dirs:
        saved = saved_run(run_dir)
        theirs = saved[1] if saved is not None else []
        try:
            Tasks([*own, *theirs])
        except ValueError as e:
            raise ValueError(f"{run_dir}: {e}") from None
        own += theirs
        trained.append(saved[0] if saved is not None else None)
    return trained, Tasks(own)


def runs_entries(run_dirs: Sequence[str | os.PathLike[str]]) -> Tasks:
    """The runs' tasks resolved once (``read_runs``)."""
    return read_runs(run_dirs)[1]


def ensemble_runs(args: EnsembleConfig, runs: Runs | None = None
                  ) -> tuple[dict[str, TaskResult], list[str], list[str]]:
    """Read every task's logits and labels and ensemble them; nothing is written (a bad file stops it all).
    ``runs``: ``read_runs`` of ``args.runs`` (read when None). Returns (results, skipped outputs, what the
    submission lacks: ``missing_test_ids``)."""
    results: dict[str, TaskResult] = {}
    skipped: list[str] = []
    incomplete: list[str] = []
    trained, entries = runs if runs is not None else read_runs(args.runs)
    for task in args.tasks or runs_tasks(trained, entries):
        entry = entries[task]  # an unknown name: one line naming the known tasks
        runs = task_members(trained, task)
        run_dirs = [args.runs[i] for i in runs]
        dev = load_task_logits(run_dirs, entry, "dev")
        if dev is None:
            logger.warning("%s: no run has %s-dev-logits.csv; task skipped", task, task)
            skipped.extend([f"{task}-dev", f"{task}-test"])
            continue
        try:
            labels = dev_labels(entry, dev.ids, args.data_dir, str(dev.files[0]))
        except DataFileMissing as e:  # a user's task whose files are gone: its runs' predictions, not scored
            if not entry.origin.get("file"):
                raise
            log.warning("%s: its dev file %s is not there, so its runs' predictions are averaged (simple) and "
                           "not scored", task, e.path)
            labels = None
        test = load_task_logits(run_dirs, entry, "test")
        if test is None:
            logger.warning("%s: no run has %s-test-logits.csv (no %s test file?); %s-test-output.csv skipped", task,
                           task, task, task)
            skipped.append(f"{task}-test")
        elif (line := missing_test_ids(entry, test.ids, args.data_dir)) is not None:
            incomplete.append(line)
        results[task] = ensemble_task(entry, dev, labels, test, args.method if labels is not None else "simple",
                                      max_exhaustive=args.max_exhaustive,
                                      seed=args.seed, fit_scores=args.fit_scores, l2=args.regression_l2,
                                      max_iter=args.regression_iters)
        results[task].runs = runs
    return results, skipped, incomplete


def write_outputs(out_dir: Path, results: dict[str, TaskResult], summary: dict) -> list[Path]:
    """Write every output into ``out_dir`` together (tasks.storage.staged_files), so that an error (a value a
    writer refuses, a full disk) leaves ``out_dir`` as it was. Returns the leaderboard files."""
    with staged_files(out_dir) as stage:
        staged = []
        for task, res in results.items():
            for split, preds in res.outputs.items():
                written = write_predictions(stage / "predictions", res.task, split, preds)
                if res.task.output.submission:  # the CS224N zip holds exactly the starter's files
                    staged.append(written)
                write_logits(stage / "predictions", res.task, split, preds)
        write_submission_zip(stage, staged)
        write_text(stage / "ensemble.json", json.dumps(summary, indent=2) + "\n")
        mark(stage, ENSEMBLE)
    return [out_dir / "predictions" / f.name for f in staged]


def _json_score(value: float) -> float | None:
    """A score as JSON holds it: null where there is none (a task whose dev labels are gone)."""
    return value if math.isfinite(value) else None


def make_ensemble(config: EnsembleConfig, runs: Runs | None = None) -> tuple[dict, dict[str, TaskResult]]:
    """Ensemble the runs of a checked ``config`` (``check_ensemble``; ``runs``: their ``read_runs``, read when None)
    into its out_dir: predictions/, the submission zip and ensemble.json, written so that a failure leaves out_dir
    as it was. Returns (the summary, also
    ensemble.json; every task's TaskResult). A bad or missing input file is a ValueError / FileNotFoundError
    naming it; what the submission lacks is a SUBMISSION INCOMPLETE warning and the summary's "incomplete"."""
    names = run_names(config.runs, config.names)
    out_dir = Path(config.out_dir)
    runs = runs if runs is not None else read_runs(config.runs)
    entries = runs[1]
    results, skipped, incomplete = ensemble_runs(config, runs)
    if not results:
        raise ValueError(f"no task had dev logits in {', '.join(config.runs)}; nothing to ensemble")
    model_names = {t: r.model_names(names) for t, r in results.items()}  # specialists are models of their tasks
    summary = {
        "method": config.method, "runs": [str(r) for r in config.runs], "names": names, "data_dir": config.data_dir,
        "seed": config.seed, "skipped": skipped, "submission": str(out_dir / SUBMISSION_ZIP),
        **({"incomplete": incomplete} if incomplete else {}),
        "tasks": {t: {"model_scores": [_json_score(x) for x in r.model_scores],
                      "simple_score": _json_score(r.simple_score), "ensemble_score": _json_score(r.ensemble_score),
                      "models": [model_names[t][m] for m in r.models],
                      "runs": model_names[t], "weights": r.weights, "bias": r.bias,
                      "holdout": _named_holdout(r, model_names[t]), "note": r.note}
                  for t, r in results.items()},
    }
    if config.method in ("regression", "selective"):  # the honest overall: every task scored on held-out dev
        summary["holdout_overall"] = overall_score(
            {task_metric(r.task): r.holdout[config.method] for r in results.values()}, tasks=entries)
    with replacing(out_dir, ENSEMBLE, overwrite=config.overwrite):  # another command's output: aside until done
        write_outputs(out_dir, results, summary)
    for line in incomplete:
        logger.warning("SUBMISSION INCOMPLETE: %s", line)
    return summary, results
