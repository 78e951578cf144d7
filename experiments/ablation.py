"""The minBERT paper's ablation as one command: baseline, then each technique added in turn.

Paper: ../shared/papers/minbert-downstream-generalization.txt (§4.1 baseline,
§4.2 even batching / loss rescaling / AllNLI, §4.3 the B1 heads, §4.4 MNR,
SimCSE and SMART, §4.6 SWA, distillation and ensembling; Figure 2 is its table).

Rows (each a ``train_multitask.py`` run in ``<out-dir>/<row>``):

  baseline   §4.1: linear heads with dropout 0.3, Siamese pairs on the pooled [CLS], sequential schedule
  even       + even batching (§4.2)
  rescale    + loss rescaling, paraphrase x 0.1 (§4.2)
  heads      + the B1 heads: shared FCN 256, non-linear heads, the paraphrase structural change, no head dropout (§4.3)
  nli        + the AllNLI stream trained with MNR only (§4.2)
  mnr        + label-weighted MNR on STS (§4.4)
  simcse     + unsupervised SimCSE on STS, dot product (§4.4): this row is B1 at the chosen budget
  smart      + SMART on every task (§4.4), in fp32: its 1e-5 perturbation is below bf16's resolution
  swa        B1 (the simcse row) + SWA epochs at lr 1e-5 from its best checkpoint (§4.6)
  distill    B1 + distillation (weight 2/3) from the B1 run's own predictions on the training sets (§4.6)
  ensemble   simple and selective ensembles of the runs from ``heads`` on (§4.6)

SWA and distillation start from B1 rather than from the SMART row: the paper's
B1 leaves SMART out, and so does ours. ``swa`` copies the B1 run and resumes
it with ``--swa-epochs`` (its time is the B1 run's plus the SWA phase);
``distill`` first writes the B1 model's training-set logits
(``--eval-only --predict-train``, in ``<out-dir>/teacher``).

Budgets: ``cpu`` (the default) fits the 2-core machine: 1 epoch at lr 1e-4
with warmup and linear decay, batch 32, a fresh random slice of every
training stream per epoch (SST 4,000 sentences, Quora 3,000 pairs, STS 3,000
pairs, AllNLI 3,000 triplets; 6 to 53 minutes a row on one thread here,
with several runs sharing the 2 cores), 1 SWA
epoch, and Quora dev scored on a fixed random 2,000 of its 20,212 pairs, at
the end too (``--final-dev capped``: the whole set takes longer than a row's
training); SST and STS dev are whole. ``full`` is the paper's
(§5.3): 10 epochs, batch 16, lr 1e-5 (constant for the baseline rows,
-4e-7 per epoch from the B1 heads on), encoder dropout 0.3, all data, 5 SWA
epochs; it is a GPU budget.

Usage:
    python experiments/ablation.py --out-dir runs/ablation [--budget cpu|full] [--threads N] [--only ROW ...]

Writes ``<out-dir>/ablation.json`` and ``<out-dir>/ablation.md`` (the README table).
"""

from __future__ import annotations

import argparse
import json
import shutil

from experiments.sweep import Sweep, final_record, fmt, markdown_table

BASELINE = ["--arch", "baseline", "--pair-encoding", "siamese", "--pooling", "pooler", "--head-dropout", "0.3",
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
    ("smart", "+ SMART, fp32 (§4.4)", ["--objective", "smart", "--no-bf16"]),
]
B1_ROW = "simcse"
ENSEMBLE_MEMBERS = ["heads", "nli", "mnr", "simcse", "smart", "swa", "distill"]
ROWS = [name for name, _, _ in LADDER] + ["swa", "distill", "ensemble"]

BUDGETS = {
    "cpu": {"common": ["--epochs", "1", "--batch-size", "32", "--lr", "1e-4", "--lr-schedule", "warmup_linear",
                       "--dev-max-examples", "para=2000", "--final-dev", "capped"],
            "caps": {"sst": "4000", "para": "3000", "sts": "3000", "nli": "3000"}, "swa_epochs": "1",
            "heads_extra": []},
    "full": {"common": ["--epochs", "10", "--batch-size", "16", "--lr", "1e-5", "--lr-schedule", "constant",
                        "--encoder-dropout", "0.3", "--weight-decay", "0", "--grad-clip", "0",
                        "--dev-max-examples", "para=all"],
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
    """The full flag list of every ladder row (cumulative)."""
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
    return out


def scores(record: dict) -> dict:
    dev = record.get("dev", {})
    return {k: dev.get(k) for k in ("sst_acc", "para_acc", "sts_r", "overall")}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default="runs/ablation")
    ap.add_argument("--budget", choices=sorted(BUDGETS), default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of every run (default: torch's)")
    ap.add_argument("--only", nargs="+", choices=ROWS, default=None,
                    help="run these rows (and what they need) only; the table shows every finished row")
    ap.add_argument("--force", action="store_true", help="rerun rows that already finished")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args(argv)
    sweep = Sweep(args.out_dir, threads=args.threads, force=args.force, dry_run=args.dry_run)
    flags = row_flags(args.budget)
    wanted = set(args.only or ROWS)
    if wanted & {"swa", "distill"}:
        wanted.add(B1_ROW)
    results: dict[str, dict] = {}

    labels = {name: label for name, label, _ in LADDER}
    for name, _, _ in LADDER:
        if name == "smart":
            continue  # the slowest row runs after the B1-based ones
        if name in wanted:
            record, wall = sweep.train(name, flags[name])
            results[name] = {"label": labels[name], **scores(record), "wall_s": wall}

    if "swa" in wanted:
        b1_dir, swa_dir = sweep.root / B1_ROW, sweep.root / "swa"
        if args.force or final_record(swa_dir) is None or "swa" not in final_record(swa_dir):
            shutil.rmtree(swa_dir, ignore_errors=True)
            if not args.dry_run:
                shutil.copytree(b1_dir, swa_dir, symlinks=True)
                (swa_dir / "sweep.json").unlink()
        # --resume takes the configuration saved in the copied checkpoint; only the SWA phase is added
        done = sweep.command("swa", ["--resume", "--swa-epochs", BUDGETS[args.budget]["swa_epochs"],
                                     "--out-dir", str(swa_dir)])
        record = final_record(swa_dir) or {"dev": {}}
        swa = record.get("swa", {})
        results["swa"] = {"label": f"B1 + SWA, {BUDGETS[args.budget]['swa_epochs']} epoch(s) at 1e-5 (§4.6)"
                          + ("" if swa.get("used", True) else "; SWA lost on dev, best epoch kept"),
                          **scores(record), "wall_s": results[B1_ROW]["wall_s"] + done["wall_s"],
                          "swa_dev": swa.get("dev")}

    if "distill" in wanted:
        teacher = sweep.root / "teacher"
        t = sweep.command("teacher", ["--eval-only", "--predict-train", "--checkpoint",
                                      str(sweep.root / B1_ROW / "checkpoints" / "best"), "--out-dir", str(teacher)])
        record, wall = sweep.train("distill", flags[B1_ROW] + ["--objective", "distill", "--distill-teachers",
                                                               str(teacher / "predictions")])
        results["distill"] = {"label": "B1 + distillation from B1's predictions, weight 2/3 (§4.6)",
                              **scores(record), "wall_s": wall + t["wall_s"]}

    if "smart" in wanted:
        record, wall = sweep.train("smart", flags["smart"])
        results["smart"] = {"label": labels["smart"], **scores(record), "wall_s": wall}

    if "ensemble" in wanted and not args.dry_run:
        from tasks.ensemble import main as ensemble_main
        from tasks.evaluate import TASK_METRIC, overall_score

        members = [m for m in ENSEMBLE_MEMBERS if final_record(sweep.root / m) is not None]
        for method in ("simple", "selective"):
            out = sweep.root / f"ensemble-{method}"
            summary = ensemble_main([str(sweep.root / m / "predictions") for m in members] + [
                "--names", *members, "--method", method, "--out-dir", str(out)])
            task_scores = {t: (r["simple_score"] if method == "simple" else r["ensemble_score"])
                           for t, r in summary["tasks"].items()}
            overall = overall_score({TASK_METRIC[t]: v for t, v in task_scores.items()})
            chosen = "" if method == "simple" else "; subsets chosen on dev, so optimistic: " + ", ".join(
                f"{t} {'+'.join(r['models'])}" for t, r in summary["tasks"].items())
            results[f"ensemble-{method}"] = {
                "label": f"{method} ensemble of {', '.join(members)} (§4.6){chosen}",
                "sst_acc": task_scores["sst"], "para_acc": task_scores["para"], "sts_r": task_scores["sts"],
                "overall": overall, "wall_s": None}

    summary_path = sweep.root / "ablation.json"
    previous = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    merged = {**previous.get("rows", {}), **results}
    order = [n for n in ROWS[:-1] + ["ensemble-simple", "ensemble-selective"] if n in merged]
    table = markdown_table(
        ["run", "dev SST acc", "dev Para acc", "dev STS r", "overall", "time (s)"],
        [[merged[n]["label"], fmt(merged[n]["sst_acc"]), fmt(merged[n]["para_acc"]), fmt(merged[n]["sts_r"]),
          fmt(merged[n]["overall"]), fmt(merged[n]["wall_s"], 0)] for n in order])
    if not args.dry_run:
        summary_path.write_text(json.dumps({"budget": args.budget, "threads": args.threads, "rows": merged,
                                            "flags": flags}, indent=2) + "\n")
        (sweep.root / "ablation.md").write_text(table + "\n")
    print(table)
    return merged


if __name__ == "__main__":
    main()
