"""The robustness table of the contrastive / robust fine-tuning methods, as one command.

Methods (tasks/objectives/, each a plug-in objective on top of the same CE run):
  ce            the plain head losses (cross-entropy / BCE)
  scl           + supervised contrastive learning (scl-supervised-contrastive.txt eq. 1–3)
  knn_bert      + KNN-BERT's momentum contrast (knn-bert.txt §3); scored twice from one run:
                eq. 1 at φ = 0.25 and the KNN vote alone (φ = 1)
  match_tuning  Match-Tuning (match-tuning.txt eq. 2–4), identity at inference
  rift          + RIFT (rift-robust-informative-finetuning.txt §2, formulas in ../shared/DESIGN.md)

Conditions, on SST and the paraphrase task (``python -m tasks.robustness`` for each):
  clean         the training sets as they are
  attack        accuracy of the clean model under the embedding-space PGD attack
                (L∞ ball per token, an approximation of word substitution: the adversarial
                inputs are points in embedding space, not words); the classifier is attacked,
                so KNN-BERT's attack cell is on its "classifier alone (φ 0)" row (the vote
                needs the training-set store, which the attack does not build)
  fs100, fs1000 few-shot: N training examples per task, several seeds, mean ± std
  noise10       10% of the training labels flipped to another class

Budget ``cpu`` (the default): each epoch trains on a fresh random slice of
4,000 SST sentences and 3,000 Quora pairs, and every score on Quora dev is on
a fixed 2,000-pair subset (``--final-dev capped``); SST dev is whole. Clean
and noisy runs: 1 epoch at batch 32; few-shot: 6 epochs at batch 16 (N = 100,
2 seeds) and 2 epochs at batch 32 (N = 1,000, 1 seed): what one session's CPU
time allowed. Budget ``full``: 3 epochs, all of Quora, whole dev sets.

Usage:
    python experiments/robustness_table.py --out-dir runs/robustness [--threads N] [--methods ...] [--conditions ...]

Writes ``<out-dir>/robustness.json`` and ``<out-dir>/robustness.md`` after every step.
"""

from __future__ import annotations

import argparse
import json

from experiments.stats import cell
from experiments.sweep import Sweep, markdown_table

METHODS = {
    "ce": ("CE baseline", []),
    "scl": ("SCL (λ 0.1, τ 0.3)", ["--objective", "scl"]),
    "knn_bert": ("KNN-BERT", ["--objective", "knn_bert"]),
    "match_tuning": ("Match-Tuning (T 1)", ["--objective", "match_tuning"]),
    "rift": ("RIFT (β 1, α 0.3)", ["--objective", "rift"]),
}
CONDITIONS = ["clean", "attack", "noise10", "fs100", "fs1000"]
BUDGETS = {
    "cpu": {"common": ["--max-train-examples", "sst=4000", "para=3000", "--dev-max-examples", "para=2000",
                       "--final-dev", "capped"],
            "clean": ["--epochs", "1"], "fs100": ["--epochs", "6", "--batch-size", "16"],
            "fs1000": ["--epochs", "2"], "seeds": {"fs100": [0, 1], "fs1000": [0]},
            "attack": ["--limit", "500", "--steps", "3", "--step-size", "0.001", "--epsilon", "0.002"]},
    "full": {"common": ["--max-train-examples", "para=all", "--dev-max-examples", "para=all"],
             "clean": ["--epochs", "3"], "fs100": ["--epochs", "20", "--batch-size", "16"],
             "fs1000": ["--epochs", "5"], "seeds": {"fs100": [0, 1, 2, 3, 4], "fs1000": [0, 1, 2]},
             "attack": ["--steps", "10", "--step-size", "0.0025", "--epsilon", "0.01"]},
}
METRICS = {"sst": "sst_acc", "para": "para_acc"}


def score_rows(method: str, results: dict) -> list[tuple[str, dict[str, list[float]]]]:
    """(row label, {condition/task: per-seed values}) rows of one method: KNN-BERT gives three (φ 0, 0.25, 1)."""
    label = METHODS[method][0]
    variants = [("", label)]
    if method == "knn_bert":  # the run's own dev metrics are its classifier's (φ 0): the model the attack targets
        variants = [("", f"{label}, classifier alone (φ 0)"), ("knn_phi0.25.", f"{label}, φ 0.25"),
                    ("knn_phi1.", f"{label}, φ 1 (KNN only)")]
    rows = []
    for prefix, name in variants:
        row: dict[str, list[float]] = {}
        for cond, per_seed in results.get(method, {}).items():
            if cond == "attack":
                if not prefix:
                    for task, r in per_seed.items():
                        row[f"attack/{task}"] = [r["after_attack_acc"]]
                        row[f"attack_clean/{task}"] = [r["clean_acc"]]  # on the attacked subset, not all of dev
                continue
            if not isinstance(per_seed, list):
                continue
            for task, metric in METRICS.items():
                vals = [d[prefix + metric] for d in per_seed if prefix + metric in d]
                row[f"{cond}/{task}"] = vals
        rows.append((name, row))
    return rows


def render(results: dict, times: dict) -> str:
    parts = []
    for task, title in (("sst", "SST-5 dev accuracy"), ("para", "Quora paraphrase dev accuracy")):
        header = ["method", "clean", "few-shot 100", "few-shot 1,000", "10% label noise",
                  "after attack / clean, attacked subset"]
        body = []
        for method in METHODS:
            if method not in results:
                continue
            for name, row in score_rows(method, results):
                attack = cell(row.get(f"attack/{task}", []))
                if row.get(f"attack_clean/{task}"):
                    attack += f" / {cell(row[f'attack_clean/{task}'])}"
                body.append([name] + [cell(row.get(f"{c}/{task}", [])) for c in
                                      ("clean", "fs100", "fs1000", "noise10")] + [attack])
        parts.append(f"**{title}**\n\n" + markdown_table(header, body))
    header = ["method"] + CONDITIONS
    body = [[METHODS[m][0]] + [f"{times.get(m, {}).get(c, float('nan')):.0f}" if c in times.get(m, {}) else "–"
                               for c in CONDITIONS] for m in METHODS if m in times]
    parts.append("**wall time (s) per condition, all seeds**\n\n" + markdown_table(header, body))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default="runs/robustness")
    ap.add_argument("--budget", choices=sorted(BUDGETS), default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    ap.add_argument("--conditions", nargs="+", choices=CONDITIONS, default=CONDITIONS,
                    help="which conditions, run in this order (clean first whenever attack is asked for)")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    b = BUDGETS[args.budget]
    sweep = Sweep(args.out_dir, threads=args.threads, force=args.force, dry_run=args.dry_run)
    summary_path = sweep.root / "robustness.json"
    saved = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    results: dict = saved.get("results", {})
    times: dict = saved.get("times", {})

    def save() -> None:
        if args.dry_run:
            return
        summary_path.write_text(json.dumps({"budget": args.budget, "threads": args.threads, "results": results,
                                            "times": times}, indent=2) + "\n")
        (sweep.root / "robustness.md").write_text(render(results, times) + "\n")

    def train_flags(method: str, cond: str) -> list[str]:
        return b["common"] + b[cond] + METHODS[method][1]

    # Clean runs first (the attack needs them), then the cheaper perturbed conditions.
    order = (["clean"] if "attack" in args.conditions or "clean" in args.conditions else []) + [
        c for c in args.conditions if c != "clean"]  # in the order given
    for cond in order:
        for method in args.methods:
            res, tim = results.setdefault(method, {}), times.setdefault(method, {})
            name = f"{method}-{cond}"
            if cond == "clean":
                record, wall = sweep.train(name, ["--tasks", "sst", "para"] + train_flags(method, "clean"))
                dev = {k: v for k, v in record.get("dev", {}).items() if v is not None}
                knn = record.get("knn", {})
                for prefix, key in ((f"knn_phi{knn.get('phi', 0):g}", "dev"), ("knn_phi1", "dev_knn_only")):
                    dev.update({f"{prefix}.{k}": v for k, v in knn.get(key, {}).items() if v is not None})
                res["clean"], tim["clean"] = [dev], wall
            elif cond == "attack":
                out = sweep.root / name
                done = sweep.command(name, ["attack", "--checkpoint", str(sweep.root / f"{method}-clean" / "checkpoints"
                                                                       / "best"), "--out-dir", str(out)] + b["attack"],
                                     module="tasks.robustness")
                if not args.dry_run:
                    res["attack"] = json.loads((out / "results.json").read_text())["tasks"]
                tim["attack"] = done["wall_s"]
            else:
                out = sweep.root / name
                if cond == "noise10":
                    exp = ["label-noise", "--rate", "0.1", "--seeds", "0"]
                    flags = train_flags(method, "clean")
                else:
                    n = cond[2:]
                    exp = ["few-shot", "--sizes", n, "--seeds", *map(str, b["seeds"][cond])]
                    flags = train_flags(method, cond)
                done = sweep.command(name, exp + ["--out-dir", str(out), "--"] + flags, module="tasks.robustness")
                if not args.dry_run:
                    settings = json.loads((out / "results.json").read_text())["settings"]
                    res[cond] = next(iter(settings.values()))["per_seed"]
                tim[cond] = done["wall_s"]
            save()
    table = render(results, times)
    print(table)
    return results


if __name__ == "__main__":
    main()
