"""The ensemble command: combine the saved predictions of several runs (minBERT paper §4.6).

A thin command over tasks.evaluation.ensembling (``check_ensemble``, then
``make_ensemble``: reading the logits, the three methods, the outputs written so
that a failure leaves --out-dir as it was, the submission zip): it parses the
flags (``EnsembleConfig``'s fields) and prints the tables.

Each run is a predictions directory holding the raw outputs that
``tasks.predictions.write_logits`` saves: ``{task}-{split}-logits.csv`` for the
dev and test splits (SST: id,logit_0..logit_4; paraphrase: id,logit; STS:
id,score). A run directory that holds them under ``predictions/`` works too.

Methods (../shared/papers/minbert-downstream-generalization.txt, §4.6; the math is in tasks.evaluation.ensembling):
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

Dev labels come from the task files (``tasks.task.load_split(task, "dev",
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

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from tasks.cli import Parser, describe, user_errors, verbose
from tasks.logs import log_to, open_log
from tasks.evaluation.ensembling import (
    SUBMISSION_ZIP,
    EnsembleConfig,
    TaskResult,
    check_ensemble,
    format_table,
    read_runs,
    make_ensemble,
    run_names,
)
from tasks.options import add_options, options_of

PROG = "python -m tasks.ensemble"
logger = logging.getLogger(__name__)


def build_parser() -> Parser:
    p = Parser(prog=PROG, description="Ensemble saved logits of several runs (minBERT paper §4.6) into leaderboard "
                                      "files.")
    add_options(p, EnsembleConfig, required=("out_dir",))
    return p


def main(argv: Sequence[str] | None = None) -> dict:
    """The command line: a refused flag or path is an argument error (exit status 2, before anything is read); a
    bad or missing input file, or a full disk, is one line and exit status 1 (tasks.cli.user_errors). Either way
    nothing was written: the out_dir is only ever written whole (make_ensemble)."""
    log_to()  # held until the ensemble is written, then <out-dir>/ensemble.log (tasks.logs)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = EnsembleConfig(**options_of(args, EnsembleConfig))
        check_ensemble(config)
    except (ValueError, OSError) as e:  # the flags and the paths they name
        if verbose():
            raise
        parser.error(describe(e))
    with user_errors(parser.prog):
        return _ensemble(config)


def _ensemble(config: EnsembleConfig) -> dict:
    runs = read_runs(config.runs)
    summary, results = make_ensemble(config, runs)
    open_log(Path(config.out_dir), "ensemble.log")
    names = run_names(config.runs, config.names)
    model_names = {t: r.model_names(names) for t, r in results.items()}
    out_dir = Path(config.out_dir)
    tasks = list(results)  # the tasks ensembled, in the order ensembled
    entries = runs[1]
    def per_run(values: Callable[[TaskResult], Sequence]) -> list[tuple[str, dict[str, float]]]:
        """A table row per input run: its value in each task it is a model of ("-" where a specialist is not)."""
        cells = {t: results[t].by_run(values(results[t])) for t in tasks}
        return [(name, {t: cells[t][i] for t in tasks if i in cells[t]}) for i, name in enumerate(names)]

    rows = per_run(lambda r: r.model_scores)
    rows.append(("ensemble: simple", {t: results[t].simple_score for t in tasks}))
    if config.method != "simple":
        rows.append((f"ensemble: {config.method}", {t: results[t].ensemble_score for t in tasks}))
    if config.method == "regression":
        rows[-1] = ("ensemble: regression*", rows[-1][1])
    sizes = ", ".join(f"{t} n={len(results[t].outputs['dev'])}" for t in tasks)
    print(f"dev scores ({sizes})")
    print(format_table(rows, tasks, entries))
    if config.method == "regression":
        print("  * on the whole dev set, including the half its weights were fit on; see the held-out table")
    for t in tasks:
        r = results[t]
        if config.method == "selective":
            print(f"  {t}: models {[model_names[t][m] for m in r.models]}; {r.note}")
        elif config.method == "regression":
            detail = ""
            if r.weights is not None:
                detail = "weights " + ", ".join(f"{n} {w:.3f}" for n, w in zip(model_names[t], r.weights))
                detail += f", bias {r.bias:.3f}; " if r.bias is not None else "; "
            print(f"  {t}: {detail}{r.note}")
    if config.method in ("regression", "selective"):
        hold_rows = per_run(lambda r: r.holdout["models"])
        hold_rows.append(("ensemble: simple", {t: results[t].holdout["simple"] for t in tasks}))
        hold_rows.append((f"ensemble: {config.method}", {t: results[t].holdout[config.method] for t in tasks}))
        print(("held-out dev half (the regression weights never saw it; " if config.method == "regression" else
               "two-fold dev (subset chosen on one half, scored on the other, both ways, mean; ")
              + ", ".join(f"{t} n={results[t].holdout['n_eval']}" for t in tasks) + ")")
        print(format_table(hold_rows, tasks, entries))

    written = sum(len(r.outputs) for r in results.values())
    logger.info("wrote %d leaderboard files to %s and %s%s", written, out_dir / "predictions",
                out_dir / SUBMISSION_ZIP, f"; skipped: {', '.join(summary['skipped'])}" if summary["skipped"] else "")
    return summary  # an incomplete submission was warned where it was written (make_ensemble)


if __name__ == "__main__":
    main()

