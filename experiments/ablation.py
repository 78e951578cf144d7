"""The minBERT paper's ablation as one command: each technique added in turn, every row over several seeds.

Paper: ../shared/papers/minbert-downstream-generalization.txt (§4.1 baseline,
§4.2 even batching / loss rescaling / AllNLI, §4.3 the B1 heads, §4.4 MNR,
SimCSE and SMART, §4.6 SWA, distillation and ensembling; Figure 2 is its table).

Ladder rows (each a ``train_multitask.py`` run per seed, in ``<out-dir>/<row>/seed<k>``):

  baseline   §4.1: linear heads with dropout 0.3, Siamese pairs, sequential schedule
  even       + even batching (§4.2)
  rescale    + loss rescaling, paraphrase x 0.1 (§4.2)
  heads      + the B1 heads: shared FCN 256, non-linear heads, the paraphrase structural change, no head dropout (§4.3)
  nli        + the AllNLI stream trained with MNR only (§4.2)
  mnr        + label-weighted MNR on STS (§4.4)
  simcse     + unsupervised SimCSE on STS, dot product (§4.4): this row is B1 at the chosen budget
  smart      + SMART on every task (§4.4; its passes run in float32 inside bf16 autocast)
  swa        B1 (the simcse row) + SWA epochs at lr 1e-5 from its best checkpoint (§4.6)
  distill    B1 + distillation (weight 2/3) from the B1 run's own predictions on the training sets (§4.6)
  ensemble   simple and selective ensembles of each seed's runs from ``heads`` on (§4.6); the selective
             subset is chosen on one half of dev and scored on the other, both ways (an honest score)

Contrastive rows, at the same budget and seeds, each one objective on CE (the
default model: b1 heads, cross-encoded pairs, mean pooling, even batching):
scl, knn_bert (scored as its classifier alone, φ 0, and with the paper's
KNN vote, φ 0.25), match_tuning, rift.

Differences from the paper, all of them budget: every row pools by the mean
over tokens, not the pooled [CLS] of §4.1 (all-MiniLM-L6-v2 is trained as a
mean-pooled sentence encoder; its pooler is not, and on it the B1 heads'
SST and Siamese paraphrase outputs stayed constant at this budget:
experiments/RESULTS.md), and
the heads train at 10x the encoder's lr (``--head-lr-scale 10``): with one
epoch on a slice, the randomly initialized heads otherwise barely leave the
constant prediction before the lr has decayed.

Tables: mean ± std over the seeds per task and overall, and each row's change
against its parent (the row above; B1 for swa, distill, smart and the
ensembles; CE for the contrastive rows), paired by seed, as Δ and its 95% t
interval, starred where the interval excludes 0 (experiments/stats.py). A row with any seed
whose SST or Quora accuracy is below the majority class + 0.02 is flagged "at
the majority class" with those seeds: it has not learned that task there (a
constant prediction, or worse).
Plots: ``ablation.png`` and ``contrastive.png``, mean ± std and every seed.

Budgets: ``cpu`` (the default) fits the 2-core machine: 1 epoch at lr 1e-4
with warmup and linear decay, batch 32, a fresh random slice of every
training stream (see BUDGETS), 1 SWA epoch, and Quora dev scored on a fixed
random 2,000 of its 20,212 pairs (``--final-dev capped``); SST and STS dev are
whole. ``full`` is the paper's (§5.3): 10 epochs, batch 16, lr 1e-5 (constant
for the baseline rows, -4e-7 per epoch from the B1 heads on), encoder dropout
0.3, all data, 5 SWA epochs; it is a GPU budget.

Long sweeps get interrupted: a finished run is reused, a run cut short
resumes from its last checkpoint (experiments/sweep.py), so the same command
again continues where it stopped.

Usage:
    python -m experiments.ablation --out-dir runs/ablation --jobs 2 --threads 1 [--seeds 0 1 2] [--only ROW ...]

Writes ``<out-dir>/ablation.json``, ``ablation.md`` (the tables) and the two plots.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from experiments.stats import cell, change_cell, plot_rows
from experiments.sweep import Sweep, add_sweep_options, final_record, fmt, markdown_table, open_sweep
from tasks.cli import Parser
from tasks.options import add_options, option
from tasks.storage import write_text
from tasks.task import load_split
from tasks.evaluation.ensembling import EnsembleConfig, check_ensemble, make_ensemble
from tasks.evaluation.metrics import task_metric, overall_score

BASELINE = ["--arch", "baseline", "--pair-encoding", "siamese", "--pooling", "mean", "--head-dropout", "0.3",
            "--schedule", "sequential"]
# Each row: (name, what it adds, the flags it adds to the previous row).
LADDER = [
    ("baseline", "baseline (§4.1)", []),
    ("even", "+ even batching (§4.2)", ["--schedule", "even"]),
    ("rescale", "+ loss rescaling, para x 0.1 (§4.2)", ["--loss-weights", "para=0.1"]),
    ("heads", "+ B1 heads: shared FCN, non-linear heads, para structure (§4.3)",
     ["--arch", "b1", "--fcn-size", "256", "--head-dropout", "0.0"]),
    ("nli", "+ AllNLI trained with MNR (§4.2)",
     ["--nli", "--objective", "mnr", "--mnr-tasks", "nli", "--no-mnr-hard-negatives"]),
    ("mnr", "+ MNR on STS, label-weighted (§4.4)", ["--mnr-tasks", "sts", "nli"]),
    ("simcse", "+ unsupervised SimCSE on STS = B1 (§4.4)",
     ["--objective", "simcse", "--simcse-tasks", "sts", "--simcse-similarity", "dot", "--simcse-temperature", "1.0"]),
    ("smart", "+ SMART (§4.4)", ["--objective", "smart"]),
]
B1_ROW = "simcse"
ENSEMBLE_MEMBERS = ["heads", "nli", "mnr", "simcse", "smart", "swa", "distill"]
CE = ["--arch", "b1", "--pair-encoding", "cross", "--pooling", "mean", "--head-dropout", "0.0", "--schedule", "even"]
CONTRASTIVE = [
    ("scl", "CE + SCL (λ 0.1, τ 0.3)", ["--objective", "scl"]),
    ("knn_bert", "CE + KNN-BERT, classifier alone (φ 0)", ["--objective", "knn_bert"]),
    ("match_tuning", "CE + Match-Tuning (T 1)", ["--objective", "match_tuning"]),
    ("rift", "CE + RIFT (β 1, α 0.3)", ["--objective", "rift"]),
]
ROWS = [name for name, _, _ in LADDER] + ["swa", "distill", "ce"] + [name for name, _, _ in CONTRASTIVE]
LABELS = {name: label for name, label, _ in LADDER + CONTRASTIVE} | {
    "swa": "B1 + SWA, 1 epoch at 1e-5 (§4.6)", "distill": "B1 + distillation from B1, weight 2/3 (§4.6)",
    "ensemble-simple": "simple ensemble of heads … distill (§4.6)",
    "ensemble-selective": "selective ensemble, scored on held-out dev halves (§4.6)",
    "ce": "CE: b1 heads, cross-encoded pairs, mean pooling", "knn_bert_vote": "CE + KNN-BERT, φ 0.25 (eq. 1)"}
PARENTS = {name: prev for (name, _, _), (prev, _, _) in zip(LADDER[1:], LADDER)} | {
    "smart": B1_ROW, "swa": B1_ROW, "distill": B1_ROW, "ensemble-simple": B1_ROW, "ensemble-selective": B1_ROW,
    **{name: "ce" for name, _, _ in CONTRASTIVE}, "knn_bert_vote": "ce"}
METRICS = ("sst_acc", "para_acc", "sts_r", "overall")
LADDER_TABLE = [name for name, _, _ in LADDER] + ["swa", "distill", "ensemble-simple", "ensemble-selective"]
CONTRASTIVE_TABLE = ["ce", "scl", "knn_bert", "knn_bert_vote", "match_tuning", "rift"]

# The CPU default's additions that no paper has, off in every row: each row adds one paper technique.
PAPER_ONLY = ["--train-subsets", "fresh", "--no-symmetric-eval", "--sts-prior", "0", "--sst-prior", "0",
              "--sst-phrases", "none"]

BUDGETS = {
    "cpu": {"common": ["--epochs", "1", "--batch-size", "32", "--lr", "1e-4", "--lr-schedule", "warmup_linear",
                       "--head-lr-scale", "10", "--dev-max-examples", "para=2000", "--final-dev", "capped",
                       *PAPER_ONLY],
            "caps": {"sst": "2000", "para": "2000", "sts": "2000", "nli": "1500"}, "swa_epochs": "1",
            "heads_extra": []},
    "full": {"common": ["--epochs", "10", "--batch-size", "16", "--lr", "1e-5", "--lr-schedule", "constant",
                        "--encoder-dropout", "0.3", "--weight-decay", "0", "--grad-clip", "0",
                        "--dev-max-examples", "para=all", *PAPER_ONLY],
             "caps": {"sst": "all", "para": "all", "sts": "all", "nli": "all"}, "swa_epochs": "5",
             "heads_extra": ["--lr-schedule", "epoch_decay", "--lr-decay", "4e-7"]},
}


REPEATABLE = {"--objective"}  # flags that add rather than replace


def merge_flags(*parts: list[str]) -> list[str]:
    """Concatenate flag lists where a later flag replaces an earlier one (with all of its values)."""
    order: list[str] = []
    values: dict[str, list[str]] = {}
    for part in parts:
        i = 0
        while i < len(part):
            flag = part[i]
            j = i + 1
            while j < len(part) and not part[j].startswith("--"):
                j += 1
            if flag not in values:
                order.append(flag)
                values[flag] = []
            if flag in REPEATABLE:
                values[flag] += [v for v in part[i + 1:j] if v not in values[flag]]
            else:
                values[flag] = part[i + 1:j]
            i = j
    return [x for flag in order for x in ([y for v in values[flag] for y in (flag, v)] if flag in REPEATABLE
                                          else [flag, *values[flag]])]


def row_flags(budget: str) -> dict[str, list[str]]:
    """The full flag list of every row: the ladder (cumulative), then CE and the contrastive rows on CE."""
    b = BUDGETS[budget]

    def caps(streams: tuple[str, ...]) -> list[str]:  # one --max-train-examples flag: a later one replaces it whole
        return ["--max-train-examples", *(f"{s}={b['caps'][s]}" for s in streams)]

    flags = merge_flags(b["common"], BASELINE, caps(("sst", "para", "sts")))
    out = {}
    for name, _, added in LADDER:
        if name == "heads":
            added = added + b["heads_extra"]
        if name == "nli":
            added = added + caps(("sst", "para", "sts", "nli"))
        flags = merge_flags(flags, added)
        out[name] = flags
    ce = out["ce"] = merge_flags(b["common"], CE, caps(("sst", "para", "sts")))
    for name, _, added in CONTRASTIVE:
        out[name] = merge_flags(ce, added)
    return out


def scores(record: dict) -> dict:
    dev = record.get("dev", {})
    return {k: dev.get(k) for k in METRICS}


def knn_vote_scores(record: dict) -> dict:
    """KNN-BERT's eq. 1 scores at its φ (the classifier mixed with the KNN vote) on SST and Quora, STS as run."""
    dev = {**record.get("dev", {}), **{k: v for k, v in record.get("knn", {}).get("dev", {}).items()
                                         if v is not None}}
    dev["overall"] = overall_score({k: dev[k] for k in ("sst_acc", "para_acc", "sts_r")})
    return {k: dev.get(k) for k in METRICS}


def run_seed_rows(sweep: Sweep, flags: dict[str, list[str]], seeds: list[int], wanted: set[str],
                  swa_epochs: str) -> None:
    """Every wanted row for every seed, seed by seed (an interrupted sweep has whole ladders for its first seeds)."""
    first = [(row, seed) for seed in seeds for row in flags if row in wanted]
    sweep.map(lambda rs: sweep.train(f"{rs[0]}/seed{rs[1]}", [*flags[rs[0]], "--seed", str(rs[1])]), first)
    second = [(row, seed) for seed in seeds for row in ("swa", "distill") if row in wanted]
    sweep.map(lambda rs: run_swa(sweep, rs[1], swa_epochs) if rs[0] == "swa" else
              run_distill(sweep, flags[B1_ROW], rs[1]), second)


def run_swa(sweep: Sweep, seed: int, swa_epochs: str) -> None:
    """B1 of this seed + SWA epochs: its run directory copied, then resumed with --swa-epochs (§4.6)."""
    b1_dir, swa_dir = sweep.root / B1_ROW / f"seed{seed}", sweep.root / "swa" / f"seed{seed}"
    if sweep.force or "swa" not in (final_record(swa_dir) or {}):
        shutil.rmtree(swa_dir, ignore_errors=True)
        if not sweep.dry_run:
            shutil.copytree(b1_dir, swa_dir, symlinks=True)
            (swa_dir / "sweep.json").unlink()
    # --resume takes the configuration saved in the copied checkpoint; only the SWA phase is added
    sweep.command(f"swa/seed{seed}", ["--resume", "--swa-epochs", swa_epochs, "--out-dir", str(swa_dir)])


def run_distill(sweep: Sweep, b1_flags: list[str], seed: int) -> None:
    """B1 + distillation from this seed's B1 model's own training-set predictions (§4.6)."""
    teacher = sweep.root / "teacher" / f"seed{seed}"
    sweep.command(f"teacher/seed{seed}", ["--eval-only", "--predict-train", "--checkpoint",
                                          str(sweep.root / B1_ROW / f"seed{seed}" / "checkpoints" / "best"),
                                          "--out-dir", str(teacher)])
    sweep.train(f"distill/seed{seed}", [*b1_flags, "--seed", str(seed), "--objective", "distill",
                                        "--distill-teachers", str(teacher / "predictions")])


def ensemble_scores(sweep: Sweep, seed: int) -> dict[str, dict]:
    """Simple and selective ensembles of this seed's rows from ``heads`` on (§4.6); selective scored two-fold."""
    members = [m for m in ENSEMBLE_MEMBERS if final_record(sweep.root / m / f"seed{seed}") is not None]
    if len(members) < 2:
        return {}
    out = {}
    for method in ("simple", "selective"):
        config = EnsembleConfig(runs=[str(sweep.root / m / f"seed{seed}" / "predictions") for m in members],
                                names=list(members), method=method,
                                out_dir=str(sweep.root / f"ensemble-{method}" / f"seed{seed}"))
        check_ensemble(config)
        summary, _ = make_ensemble(config)
        # selective: the subset is chosen on one dev half and scored on the other, both ways (honest)
        task_scores = {t: r["holdout"][method] if method == "selective" else r["simple_score"]
                       for t, r in summary["tasks"].items()}
        out[f"ensemble-{method}"] = {"sst_acc": task_scores["sst"], "para_acc": task_scores["para"],
                                     "sts_r": task_scores["sts"],
                                     "overall": overall_score({task_metric(t): v for t, v in task_scores.items()})}
    return out


def collect(sweep: Sweep, seeds: list[int]) -> dict[str, dict[int, dict]]:
    """{row: {seed: {metric: value, "wall_s": s}}} of every finished run under the sweep's root."""
    results = sweep.collect(ROWS, seeds, lambda record: {  # KNN-BERT's runs also hold eq. 1's vote
        **scores(record), "vote": knn_vote_scores(record) if record.get("knn") else None})
    votes = {}
    for per_seed in results.values():
        for seed, values in per_seed.items():
            if (vote := values.pop("vote")) is not None:
                votes[seed] = {**vote, "wall_s": values["wall_s"]}
    if votes:
        results["knn_bert_vote"] = votes
    for seed in seeds:
        for row, values in ensemble_scores(sweep, seed).items():
            results.setdefault(row, {})[seed] = {**values, "wall_s": None}
    return results


def majority_accuracies(data_dir: str) -> dict[str, float]:
    """The dev accuracy of always predicting the most frequent class: where a collapsed row sits."""
    out = {}
    for task, metric in (("sst", "sst_acc"), ("para", "para_acc")):
        labels = [ex.label for ex in load_split(task, "dev", data_dir)[0]]
        out[metric] = max(labels.count(c) for c in set(labels)) / len(labels)
    return out


def render(results: dict[str, dict[int, dict]], majority: dict[str, float]) -> tuple[str, str]:
    """(ladder table, contrastive table): mean ± std over seeds, Δ overall against the parent row (paired)."""
    def low(values: dict, metric: str) -> bool:
        return values[metric] < majority[metric] + 0.02

    def table(rows: list[str]) -> str:
        lines = []
        for row in rows:
            if row not in results:
                continue
            per_seed = results[row]
            col = {m: [v[m] for v in per_seed.values()] for m in METRICS}
            parent = PARENTS.get(row)
            delta = {m: change_cell({s: v[m] for s, v in per_seed.items()},
                                    {s: v[m] for s, v in results.get(parent, {}).items()}) for m in METRICS}
            # a seed within 0.02 of always predicting the majority class has not learned that task
            at_majority = [f"{m.split('_')[0]}, seeds {' '.join(str(s) for s, v in per_seed.items() if low(v, m))}"
                           for m in majority if any(low(v, m) for v in per_seed.values())]
            walls = [v["wall_s"] for v in per_seed.values() if v.get("wall_s") is not None]
            lines.append([LABELS[row] + (f" (at the majority class: {'; '.join(at_majority)})" if at_majority else ""),
                          len(per_seed), *(cell(col[m]) for m in METRICS),
                          delta["overall"] if parent else "", " / ".join(delta[m] for m in METRICS[:3]) if parent
                          else "", fmt(statistics.fmean(walls), 0) if walls else "–"])
        return markdown_table(["row", "seeds", "SST acc", "Para acc", "STS r", "overall",
                               "Δ overall vs parent", "Δ SST / Para / STS", "s per run"], lines)
    return table(LADDER_TABLE), table(CONTRASTIVE_TABLE)


def plot(path: Path, results: dict[str, dict[int, dict]], rows: list[str], majority: dict[str, float],
         title: str) -> None:
    rows = [r for r in rows if r in results]
    plot_rows(path, [LABELS[r] for r in rows],
              {m: [[v[m] for v in results[r].values()] for r in rows] for m in METRICS}, title, majority)


@dataclass
class AblationOptions:
    """The ablation's own flags (beside the sweep's, experiments.sweep.SweepOptions)."""

    budget: str = option("cpu", "the rows' training: cpu (one epoch on 2,000 examples of each task) or full (the "
                                "paper's: 10 epochs on all of them)", choices=sorted(BUDGETS))
    only: list[str] | None = option(None, "run these rows (and what they need) only; the tables show every finished "
                                          "row", choices=ROWS, nargs="+")


def build_parser() -> Parser:
    ap = Parser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n")[0])
    add_options(ap, AblationOptions)
    add_sweep_options(ap, out_dir="runs/ablation", help_suffix={"data_dir": " (majority-class accuracies)"})
    return ap


def main(argv: list[str] | None = None) -> dict:
    ap = build_parser()
    args = ap.parse_args(argv)
    sweep = open_sweep(ap, args)
    flags = row_flags(args.budget)
    wanted = set(args.only or ROWS)
    if wanted & {"swa", "distill"}:
        wanted.add(B1_ROW)
    if wanted & {name for name, _, _ in CONTRASTIVE}:
        wanted.add("ce")
    t0 = time.perf_counter()
    run_seed_rows(sweep, flags, args.seeds, wanted, BUDGETS[args.budget]["swa_epochs"])
    if args.dry_run:
        return {}
    results = collect(sweep, args.seeds)
    majority = majority_accuracies(args.data_dir)
    ladder, contrastive = render(results, majority)
    plot(sweep.root / "ablation.png", results, LADDER_TABLE, majority,
         f"ablation ladder, {args.budget} budget, mean ± std over seeds {args.seeds}")
    plot(sweep.root / "contrastive.png", results, CONTRASTIVE_TABLE, majority,
         f"contrastive and robust objectives on CE, {args.budget} budget, seeds {args.seeds}")
    summary = {"budget": args.budget, "seeds": args.seeds, "jobs": args.jobs, "threads": args.threads,
               "wall_s": round(time.perf_counter() - t0, 1), "majority": majority,
               "rows": {r: {str(s): v for s, v in per.items()} for r, per in results.items()}, "flags": flags}
    write_text(sweep.root / "ablation.json", json.dumps(summary, indent=2) + "\n")
    text = f"{ladder}\n\n{contrastive}\n"
    write_text(sweep.root / "ablation.md", text)
    print(text)
    return results


if __name__ == "__main__":
    main()
