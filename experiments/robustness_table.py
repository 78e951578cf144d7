"""The robustness table of the contrastive / robust fine-tuning methods: five conditions, every cell over seeds.

Methods (tasks/objectives/, each one plug-in objective on CE, the ablation's CE row:
b1 heads, cross-encoded pairs, mean pooling, even batching):
  ce            the plain head losses (cross-entropy / BCE)
  scl           + supervised contrastive learning (scl-supervised-contrastive.txt eq. 1–3)
  knn_bert      + KNN-BERT's momentum contrast (knn-bert.txt §3); scored three times from one run:
                its classifier alone (φ 0), eq. 1 at φ = 0.25, and the KNN vote alone (φ = 1);
                k = 100 neighbours, 10 at few-shot 100 (a vote over the whole store is its class prior)
  match_tuning  Match-Tuning (match-tuning.txt eq. 2–4), identity at inference
  rift          + RIFT (rift-robust-informative-finetuning.txt §2, formulas in ../shared/DESIGN.md)

Conditions, on SST and the paraphrase task trained together:
  clean         the training sets as they are
  fs100, fs1000 few-shot: N training examples per task (stratified, tasks.perturb)
  noise10       exactly 10% of each task's training-file labels flipped to another class
                (a run's random slice of the file holds that share in expectation)
  attack        accuracy of each seed's clean model under the embedding-space PGD attack
                (L∞ ball per token, an approximation of word substitution: the adversarial
                inputs are points in embedding space, not words); the classifier is attacked,
                so KNN-BERT's attack cell is on its classifier-alone (φ 0) row. An example
                counts when its clean and attacked predictions are both right.

Every cell is run once per seed (default 0 1 2): the seed draws the perturbed
training set (which examples, which labels flipped) and the run's own
randomness, so the methods of one seed see the same perturbed data. Cells
give mean ± std over the seeds; a second table gives each method's change
against CE in the same condition, paired by seed, starred past 2 standard
errors; "†" marks a cell with a seed below the majority-class accuracy
+ 0.02 (that seed has not learned the task). Plots: one per task, a panel
per condition, mean ± std and every seed.

Budget ``cpu`` (the default) is the ablation's (experiments/ablation.py): 1
epoch at lr 1e-4 with warmup and linear decay, heads at 10x, batch 32, a fresh
random slice of 2,000 SST sentences and 2,000 Quora pairs; few-shot 1,000
trains 2 epochs (the clean run's number of examples), few-shot 100 10 epochs
at batch 16. SST dev is whole, Quora dev a fixed random 2,000 of its pairs.
The attack: 3 steps of 0.001 in an ε = 0.002 ball on the first 500 dev
examples of each task. ``full`` is the ablation's GPU budget on all of the
data, with 20 few-shot-100 epochs and the paper-scale attack.

Each training cell is one ``train_multitask.py`` run in
``<out-dir>/<method>/<condition>/seed<k>`` on a copy of the data whose
changed train files are in ``<out-dir>/data/<condition>-seed<k>``
(tasks.perturb); a finished run is reused and one cut short resumes
from its last checkpoint (experiments/sweep.py), so the same command again
continues where it stopped.

Usage:
    python -m experiments.robustness_table --out-dir runs/robustness --jobs 2 --threads 1 [--seeds 0 1 2]
        [--methods ...] [--conditions ...] [--dry-run]

Writes ``<out-dir>/robustness.json``, ``robustness.md`` (the tables) and ``robustness-sst.png``,
``robustness-para.png``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from experiments.ablation import majority_accuracies, merge_flags, row_flags
from experiments.stats import cell, change_cell, plot_rows
from experiments.sweep import Sweep, add_sweep_options, final_record, markdown_table, open_sweep
from tasks.cli import Parser
from tasks.options import add_options, option
from tasks.perturb import perturb, perturbed_data_dir
from tasks.storage import write_text
from tasks.task import load_split
from tasks.training.run import dev_scores

METHODS = {
    "ce": ("CE baseline", []),
    "scl": ("SCL (λ 0.1, τ 0.3)", ["--objective", "scl"]),
    "knn_bert": ("KNN-BERT", ["--objective", "knn_bert"]),
    "match_tuning": ("Match-Tuning (T 1)", ["--objective", "match_tuning"]),
    "rift": ("RIFT (β 1, α 0.3)", ["--objective", "rift"]),
}
CONDITIONS = ["clean", "fs100", "fs1000", "noise10", "attack"]
TRAINED = [c for c in CONDITIONS if c != "attack"]
COLUMNS = {"clean": "clean", "fs100": "few-shot 100", "fs1000": "few-shot 1,000", "noise10": "10% label noise",
           "attack": "after attack / clean, attacked subset"}
PERTURBATIONS = {"fs100": ("few-shot", {"n": 100}), "fs1000": ("few-shot", {"n": 1000}),
                 "noise10": ("label-noise", {"rate": 0.1})}
TASKS = ("sst", "para")
SOURCE = "source.json"  # in a perturbed copy: the data directory it was made from
METRICS = {"sst": "sst_acc", "para": "para_acc"}
# KNN-BERT's vote over a store no larger than k is the store's class prior, whatever the query: at few-shot
# 100 its k is 10, the same tenth of the store as the paper's smallest k (100) at few-shot 1,000.
CELL_FLAGS = {("knn_bert", "fs100"): ["--knn-bert-knn-k", "10"]}
BUDGETS = {
    "cpu": {"caps": ["sst=2000", "para=2000"], "clean": [], "noise10": [], "fs1000": ["--epochs", "2"],
            "fs100": ["--epochs", "10", "--batch-size", "16"],
            "attack": ["--limit", "500", "--steps", "3", "--step-size", "0.001", "--epsilon", "0.002"]},
    "full": {"caps": ["sst=all", "para=all"], "clean": [], "noise10": [], "fs1000": [],
             "fs100": ["--epochs", "20"],
             "attack": ["--steps", "10", "--step-size", "0.0025", "--epsilon", "0.01"]},
}


def train_flags(budget: str, method: str, cond: str) -> list[str]:
    """The ``train_multitask.py`` flags of one cell: the ablation's CE row at this budget on SST and Quora."""
    b = BUDGETS[budget]
    return merge_flags(row_flags(budget)["ce"], ["--max-train-examples", *b["caps"], "--tasks", *TASKS], b[cond],
                       METHODS[method][1], CELL_FLAGS.get((method, cond), []))


def cell_name(method: str, cond: str, seed: int) -> str:
    """A cell's run directory under the sweep's root."""
    return f"{method}/{cond}/seed{seed}"


def data_path(src: Path, root: Path, cond: str, seed: int) -> Path:
    """Where a cell of this condition and seed reads its data: ``src`` when clean, else its perturbed copy."""
    return src if cond == "clean" else root / "data" / f"{cond}-seed{seed}"


def condition_data(src: Path, root: Path, cond: str, seed: int) -> Path:
    """``data_path``, written when it is a perturbed copy not there yet.

    The copy is deterministic in (condition, seed, ``src``), so one written before is reused,
    never rewritten under a run that reads it: each process writes its own temporary copy
    beside the final place and renames it into place (the first to finish wins). A copy
    records the data it was made from; one made from other data is refused.
    """
    dst = data_path(src, root, cond, seed)
    if cond == "clean":
        return dst
    if not dst.is_dir():
        command, setting = PERTURBATIONS[cond]
        train = {t: load_split(t, "train", src)[0] for t in TASKS}
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f"{dst.name}.partial-"))
        perturbed_data_dir(src, tmp, perturb(command, train, seed, **setting))
        write_text(tmp / SOURCE, json.dumps({"data_dir": str(src.resolve())}) + "\n")
        try:
            os.replace(tmp, dst)
        except OSError:  # another process renamed its copy into place first: the same files
            shutil.rmtree(tmp, ignore_errors=True)
    made_from = json.loads((dst / SOURCE).read_text())["data_dir"] if (dst / SOURCE).is_file() else None
    if made_from != str(src.resolve()):
        raise SystemExit(f"{dst} was made from {made_from or 'unknown data'}, not {src.resolve()}: use another "
                         f"--out-dir (or delete {dst} and the runs trained on it)")
    return dst


def cell_flags(budget: str, root: Path, src: Path, method: str, cond: str, seed: int) -> list[str]:
    """What one cell runs: the training flags (with its data and seed), or the attack's arguments."""
    if cond == "attack":
        return ["attack", "--checkpoint", str(root / cell_name(method, "clean", seed) / "checkpoints" / "best"),
                "--data-dir", str(src), "--seed", str(seed), "--out-dir", str(root / cell_name(method, cond, seed)),
                *BUDGETS[budget]["attack"]]
    return [*train_flags(budget, method, cond), "--data-dir", str(data_path(src, root, cond, seed)),
            "--seed", str(seed)]


def recorded_argv(budget: str, sweep: Sweep, src: Path, method: str, cond: str, seed: int) -> list[str]:
    """The command a finished cell's ``sweep.json`` holds (what ``collect`` checks before reading the cell)."""
    flags = cell_flags(budget, sweep.root, src, method, cond, seed)
    return flags if cond == "attack" else sweep.train_argv(cell_name(method, cond, seed), flags)


def run_cells(sweep: Sweep, budget: str, methods: list[str], conditions: list[str], seeds: list[int],
              src: Path) -> None:
    """Every training cell (seed by seed, so an interrupted sweep has whole seeds first), then the attacks.

    An attack whose clean model was retrained after it ran is run again."""
    trained = [c for c in TRAINED if c in conditions or (c == "clean" and "attack" in conditions)]
    if not sweep.dry_run:
        for c in trained:
            for s in seeds:
                condition_data(src, sweep.root, c, s)
    sweep.map(lambda cell: sweep.train(cell_name(*cell), cell_flags(budget, sweep.root, src, *cell)),
              [(m, c, s) for s in seeds for c in trained for m in methods])
    if "attack" not in conditions:
        return
    attacks = [(m, "attack", s) for s in seeds for m in methods]
    for m, _, s in attacks:
        clean, attack = sweep.root / cell_name(m, "clean", s), sweep.root / cell_name(m, "attack", s)
        if ((attack / "results.json").is_file() and (clean / "metrics.jsonl").is_file() and
                (clean / "metrics.jsonl").stat().st_mtime > (attack / "results.json").stat().st_mtime):
            (attack / "sweep.json").unlink(missing_ok=True)
    sweep.map(lambda cell: sweep.command(cell_name(*cell), cell_flags(budget, sweep.root, src, *cell),
                                         module="tasks.robustness"), attacks)


def collect(root: Path, seeds: list[int], expected: Callable[[str, str, int], list[str]] | None = None
            ) -> tuple[dict, dict]:
    """({method: {condition: {seed: scores}}}, {method: {condition: wall s, all seeds}}) of every finished cell.

    With ``expected`` (method, condition, seed -> command), a cell counts only when its
    ``sweep.json`` records that command: runs of another budget or data in the same
    directory are left out, never mixed in.
    """
    results: dict = {}
    times: dict = {}
    for method in METHODS:
        for cond in CONDITIONS:
            for seed in seeds:
                run_dir = root / cell_name(method, cond, seed)
                marker = run_dir / "sweep.json"
                done = json.loads(marker.read_text()) if marker.is_file() else {}
                if expected is not None and done.get("argv") != expected(method, cond, seed):
                    continue
                if cond == "attack":
                    path = run_dir / "results.json"
                    scores = json.loads(path.read_text())["tasks"] if path.is_file() else None
                else:
                    record = final_record(run_dir)
                    scores = dev_scores(record) if record else None
                if scores is None:
                    continue
                results.setdefault(method, {}).setdefault(cond, {})[seed] = scores
                if done.get("wall_s") is not None:
                    times.setdefault(method, {})[cond] = times.get(method, {}).get(cond, 0.0) + done["wall_s"]
    return results, times


def score_rows(method: str, results: dict) -> list[tuple[str, dict[str, dict[int, float]]]]:
    """(row label, {"condition/task": {seed: accuracy}}) rows of one method: KNN-BERT gives three (φ 0, 0.25, 1).

    The attack's rows: ``attack/<task>`` (accuracy after the attack) and ``attack_clean/<task>``
    (before it, on the same subset); they sit on the classifier's row only.
    """
    label = METHODS[method][0]
    variants = [("", label)]
    if method == "knn_bert":  # the run's own dev metrics are its classifier's (φ 0): the model the attack targets
        phis = sorted({k.rsplit(".", 1)[0][len("knn_phi"):] for per_seed in results.get(method, {}).values()
                       for d in per_seed.values() for k in d if k.startswith("knn_phi")} - {"1"}, key=float)
        variants = [("", f"{label}, classifier alone (φ 0)"), *((f"knn_phi{p}.", f"{label}, φ {p}") for p in phis),
                    ("knn_phi1.", f"{label}, φ 1 (KNN only)")]
    rows = []
    for prefix, name in variants:
        row: dict[str, dict[int, float]] = {}
        for cond, per_seed in results.get(method, {}).items():
            for task, metric in METRICS.items():
                if cond == "attack":
                    if not prefix:
                        row[f"attack/{task}"] = {s: r[task]["after_attack_acc"] for s, r in per_seed.items()
                                                 if task in r}
                        row[f"attack_clean/{task}"] = {s: r[task]["clean_acc"] for s, r in per_seed.items()
                                                       if task in r}
                    continue
                row[f"{cond}/{task}"] = {s: d[prefix + metric] for s, d in per_seed.items() if prefix + metric in d}
        rows.append((name, row))
    return rows


def render(results: dict, times: dict, majority: dict[str, float]) -> str:
    """Per task: the scores (mean ± std, † at the majority class), the change against CE; then the wall times."""
    ce = dict(score_rows("ce", results)).get(METHODS["ce"][0], {})
    parts = []
    for task, title in (("sst", "SST-5 dev accuracy"), ("para", "Quora paraphrase dev accuracy")):
        floor = majority[METRICS[task]] + 0.02
        scores, changes = [], []
        for method in (m for m in METHODS if m in results):
            for name, row in score_rows(method, results):
                line = [name]
                for cond in TRAINED:
                    vals = row.get(f"{cond}/{task}", {})
                    line.append(cell(list(vals.values())) + (" †" if any(v < floor for v in vals.values()) else ""))
                attack = cell(list(row.get(f"attack/{task}", {}).values()))
                if row.get(f"attack_clean/{task}"):
                    attack += f" / {cell(list(row[f'attack_clean/{task}'].values()))}"
                scores.append(line + [attack])
                if method != "ce":
                    changes.append([name] + [change_cell(row.get(f"{c}/{task}", {}), ce.get(f"{c}/{task}", {}))
                                             for c in CONDITIONS])
        parts.append(f"**{title}** (mean ± std over seeds; † a seed below {floor:.3f}, the majority class "
                     f"{majority[METRICS[task]]:.3f} + 0.02)\n\n" + markdown_table(["method"] + [COLUMNS[c] for c in
                                                                                     CONDITIONS], scores))
        parts.append(f"**{title}: change against CE in the same condition** (paired by seed, Δ [95% t interval], "
                     "* where it excludes 0; attack: accuracy after it)\n\n" +
                     markdown_table(["method"] + [COLUMNS[c].split(" / ")[0] for c in CONDITIONS], changes))
    body = [[METHODS[m][0]] + [f"{times[m][c]:.0f}" if c in times.get(m, {}) else "–" for c in CONDITIONS]
            for m in METHODS if m in times]
    parts.append("**wall time (s) per condition, all seeds**\n\n" + markdown_table(["method"] + CONDITIONS, body))
    return "\n\n".join(parts)


def plot(root: Path, results: dict, majority: dict[str, float], title: str) -> list[Path]:
    """``robustness-<task>.png``: a panel per condition, each row's mean ± std over seeds and every seed.

    The attack's panel is the accuracy after it; it has points on the classifier rows only."""
    rows = [r for m in METHODS if m in results for r in score_rows(m, results)]
    paths = []
    for task in TASKS:
        values = {COLUMNS[c].split(" / ")[0]: [list(row.get(f"{c}/{task}", {}).values()) for _, row in rows]
                  for c in CONDITIONS}
        values = {k: v for k, v in values.items() if any(v)}
        if values:
            refs = {COLUMNS[c]: majority[METRICS[task]] for c in TRAINED}
            plot_rows(root / f"robustness-{task}.png", [name for name, _ in rows], values,
                      f"{title}: {task} dev accuracy", refs)
            paths.append(root / f"robustness-{task}.png")
    return paths


@dataclass
class TableOptions:
    """The table's own flags (beside the sweep's, experiments.sweep.SweepOptions)."""

    budget: str = option("cpu", "the cells' training and attack: cpu (the ablation's CPU budget, 2,000 examples of "
                                "each task; a light attack on 500 dev examples) or full (the ablation's full budget "
                                "on every example; the full attack)",
                         choices=sorted(BUDGETS))
    methods: list[str] = option(help="which methods (rows)", factory=lambda: list(METHODS), choices=list(METHODS),
                                nargs="+")
    conditions: list[str] = option(help="which conditions (attack runs the clean cells it attacks)",
                                   factory=lambda: list(CONDITIONS), choices=CONDITIONS, nargs="+")


def build_parser() -> Parser:
    ap = Parser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n")[0])
    add_options(ap, TableOptions)
    add_sweep_options(ap, out_dir="runs/robustness")
    return ap


def main(argv: list[str] | None = None) -> dict:
    ap = build_parser()
    args = ap.parse_args(argv)
    src = Path(args.data_dir).resolve()  # runs start in the repository root: paths must not depend on the caller's
    if not src.is_dir():
        ap.error(f"--data-dir {src}: no such directory (run setup.sh, or point it at the CS224N CSV files)")
    sweep = open_sweep(ap, args, root=Path(args.out_dir).resolve())
    t0 = time.perf_counter()
    run_cells(sweep, args.budget, args.methods, args.conditions, args.seeds, src)
    if args.dry_run:
        return {}
    results, times = collect(sweep.root, args.seeds,
                             lambda m, c, s: recorded_argv(args.budget, sweep, src, m, c, s))
    majority = majority_accuracies(str(src))
    text = render(results, times, majority)
    plot(sweep.root, results, majority, f"{args.budget} budget, seeds {args.seeds}")
    flags = {m: {c: train_flags(args.budget, m, c) for c in TRAINED} for m in METHODS}
    summary = {"budget": args.budget, "seeds": args.seeds, "jobs": args.jobs, "threads": args.threads,
               "wall_s": round(time.perf_counter() - t0, 1), "majority": majority, "flags": flags,
               "results": {m: {c: {str(s): v for s, v in per.items()} for c, per in conds.items()}
                           for m, conds in results.items()}, "times": times}
    write_text(sweep.root / "robustness.json", json.dumps(summary, indent=2) + "\n")
    write_text(sweep.root / "robustness.md", text + "\n")
    print(text)
    return results


if __name__ == "__main__":
    main()
