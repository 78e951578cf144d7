"""GLUE as it ships, each task alone and trained beside others (MT-DNN's question), over seeds.

The five GLUE tasks of data/glue/ (tasks/glue/: CoLA, SST-2, MRPC, RTE, WNLI, their files as GLUE's download
script writes them) train from their task files with the default recipe at three epochs and the embedded 22M
MiniLM. MT-DNN (Liu et al. 2019, §4) trains GLUE's tasks on one shared BERT with a head per task and finds that
the small ones (RTE, MRPC, STS-B) gain most; its RTE gain comes with MNLI beside it. The rows:

  alone/<task>   each task alone (--tasks <task>); SST-2's 67k training phrases capped to 20,000 an epoch, the
                 next ones of one shuffled pass (--train-subsets cycle), so three epochs see most of them
  glue4          the four small tasks together (RTE, MRPC, CoLA, WNLI), the best epoch by their mean
  rte+nli        RTE beside NLI pairs made from data/nli-train.csv's triplets (premise with its entailed and its
                 contradicting sentence: "entailment" / "contradiction", 7,500 an epoch), the nearest thing to
                 MNLI here; the best epoch by RTE
  e1             the CS224N default in one epoch (--epochs 1)
  e1+glue4       the same with the four small tasks beside it (the best epoch by the CS224N overall, as always)

Each row runs once per seed in ``<out-dir>/<row>/seed<k>`` (``--save-only-model``); a finished run is reused and
one cut short resumes (experiments/sweep.py). The table gives each GLUE task's dev metrics alone, beside the
others (Δ against alone paired by seed with its 95% t interval, starred where it excludes 0), beside NLI (RTE) and beside the CS224N
tasks, with run_glue's published bert-base dev scores; and the CS224N side: ``e1`` against ``e1+glue4``
(overall, Δ, the wall-time ratio). ``--full`` runs the last pair on the whole default recipe instead
(``default``, ``default+glue4``: three epochs, about three times as long).

Usage:
    python -m experiments.glue --out-dir runs/glue --jobs 2 --threads 1 [--seeds 0 1 2] [--only ROW ...]

Writes ``<out-dir>/glue.json`` and ``glue.md`` (the tables).
"""

from __future__ import annotations

import csv
import io
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from tasks.cli import Parser
from tasks.data.readers import read_nli
from tasks.options import add_options, option
from tasks.storage import write_text
from experiments.stats import cell, change_cell
from experiments.sweep import Sweep, add_sweep_options, fmt, markdown_table, open_sweep

GLUE = ("cola", "sst2", "mrpc", "rte", "wnli")
SMALL = ("rte", "mrpc", "cola", "wnli")
CS224N = ("sst", "para", "sts")
# run_glue's README, bert-base-cased, one run each (the dev scores the issue compares with)
PUBLISHED = {"cola_mcc": 0.565, "sst2_acc": 0.923, "mrpc_f1": 0.889, "mrpc_acc": 0.841, "rte_acc": 0.657,
             "wnli_acc": 0.563}
COLUMNS = ("cola_mcc", "sst2_acc", "mrpc_f1", "mrpc_acc", "rte_acc", "wnli_acc")
SST2_CAP = ["--max-train-examples", "sst2=20000"]
NLI_PAIRS = "nlipairs"
NLI_DEV_TRIPLETS = 1000  # the last triplets of nli-train.csv: the NLI pairs' dev set
NLI_PER_EPOCH = 7500
COMMON = ["--save-only-model"]
EPOCHS = ["--epochs", "3"]  # the default recipe's epochs when the tables were measured (two since the front)


def nli_task_file(root: Path, data_dir: str) -> Path:
    """The NLI pairs task (``<root>/nlipairs/``): each triplet of data/nli-train.csv gives a pair labelled
    "entailment" and one "contradiction" (a triplet without its contradiction, the first alone); the last
    NLI_DEV_TRIPLETS triplets are its dev set. Written once, then reused."""
    folder = root / NLI_PAIRS
    task = folder / f"{NLI_PAIRS}.json"
    if task.is_file():
        return task
    triplets, _ = read_nli(Path(data_dir) / "nli-train.csv")
    splits = {"train": triplets[:-NLI_DEV_TRIPLETS], "dev": triplets[-NLI_DEV_TRIPLETS:]}
    for split, rows in splits.items():
        buf = io.StringIO()
        w = csv.writer(buf, delimiter="\t", lineterminator="\n")
        w.writerow(["premise", "hypothesis", "label"])
        for t in rows:
            w.writerow([t.anchor, t.positive, "entailment"])
            if t.negative:
                w.writerow([t.anchor, t.negative, "contradiction"])
        write_text(folder / f"{split}.tsv", buf.getvalue())
    write_text(task, json.dumps({"name": NLI_PAIRS, "train": "train.tsv", "dev": "dev.tsv",
                                 "text": ["premise", "hypothesis"], "label": "label"}, indent=1) + "\n")
    return task


def rows(root: Path, data_dir: str, full: bool) -> dict[str, tuple[str, list[str]]]:
    """{row: (what it is, its flags)}; every setting a row depends on spelled out."""
    recipe = EPOCHS if full else ["--epochs", "1"]
    cs = "default" if full else "e1"
    out = {f"alone/{t}": (f"{t} alone", [*EPOCHS, "--tasks", t, *(SST2_CAP if t == "sst2" else [])]) for t in GLUE}
    out["glue4"] = ("RTE, MRPC, CoLA, WNLI together", [*EPOCHS, "--tasks", *SMALL])
    out["rte+nli"] = ("RTE beside NLI pairs", [*EPOCHS, "--tasks", "rte", NLI_PAIRS, "--task-file",
                                               str(nli_task_file(root, data_dir)), "--best-metric", "rte",
                                               "--max-train-examples", f"{NLI_PAIRS}={NLI_PER_EPOCH}"])
    out[cs] = ("the CS224N recipe" + ("" if full else " in one epoch"), recipe)
    out[f"{cs}+glue4"] = ("the same with RTE, MRPC, CoLA, WNLI beside", [*recipe, "--tasks", *CS224N, *SMALL])
    return {name: (what, [*flags, *COMMON]) for name, (what, flags) in out.items()}


def collect(sweep: Sweep, names: list[str], seeds: list[int]) -> dict[str, dict[int, dict]]:
    """{row: {seed: {every dev metric, "wall_s"}}} of the finished runs."""
    return sweep.collect(names, seeds, lambda record: dict(record["dev"]))


def _values(per_seed: dict[int, dict], key: str) -> dict[int, float]:
    return {s: v[key] for s, v in per_seed.items() if v.get(key) is not None}


def render(results: dict[str, dict[int, dict]], full: bool) -> str:
    """The GLUE table (a column per metric: alone, beside the others, Δ paired) and the CS224N side."""
    cs = "default" if full else "e1"
    alone = {key: _values(results.get(f"alone/{key.split('_')[0]}", {}), key) for key in COLUMNS}
    lines = [["bert-base, run_glue (published, 1 run)", "", *(f"{PUBLISHED[k]:.3f}" for k in COLUMNS), ""]]
    walls = {row: [v["wall_s"] for v in per.values() if v.get("wall_s") is not None] for row, per in results.items()}

    def line(label: str, row: str, paired: bool) -> list[str]:
        per = results.get(row, {})
        cells = []
        for k in COLUMNS:
            got = _values(per, k)
            cells.append("" if not got else cell(list(got.values())) + (
                f" ({change_cell(got, alone[k])})" if paired and alone[k] else ""))
        return [label, str(len(per)), *cells, fmt(statistics.fmean(walls[row]), 0) if walls.get(row) else "–"]

    lines.append(["each task alone (MiniLM, 22M)", "", *(cell(list(alone[k].values())) if alone[k] else ""
                                                         for k in COLUMNS),
                  " / ".join(fmt(statistics.fmean(walls[f"alone/{t}"]), 0) if walls.get(f"alone/{t}") else "–"
                             for t in GLUE)])
    lines.append(line("the four small ones together (Δ vs alone)", "glue4", True))
    lines.append(line("RTE beside NLI pairs (Δ vs alone)", "rte+nli", True))
    lines.append(line(f"beside the CS224N tasks, {cs} (Δ vs alone)", f"{cs}+glue4", True))
    glue = markdown_table(["", "seeds", "CoLA mcc", "SST-2 acc", "MRPC F1", "MRPC acc", "RTE acc", "WNLI acc",
                           "s per run"], lines)
    side = []
    for row in (cs, f"{cs}+glue4"):
        per = results.get(row, {})
        side.append([f"`{row}`", str(len(per)), *(cell(list(_values(per, k).values())) for k in
                                                  ("sst_acc", "para_acc", "sts_r", "overall")),
                     fmt(statistics.fmean(walls[row]), 0) if walls.get(row) else "–"])
    base, plus = results.get(cs, {}), results.get(f"{cs}+glue4", {})
    if base and plus:
        ratio = [plus[s]["wall_s"] / base[s]["wall_s"] for s in set(base) & set(plus)
                 if plus[s].get("wall_s") and base[s].get("wall_s")]
        side.append([f"Δ `{cs}+glue4` − `{cs}`, paired", str(len(set(base) & set(plus))),
                     *(change_cell(_values(plus, k), _values(base, k)) for k in ("sst_acc", "para_acc", "sts_r",
                                                                                 "overall")),
                     f"× {statistics.fmean(ratio):.2f}" if ratio else "–"])
    cs_table = markdown_table(["CS224N dev", "seeds", "SST acc", "Para acc", "STS r", "overall", "s per run"], side)
    return glue + "\n\n" + cs_table + "\n"


@dataclass
class GlueOptions:
    """The experiment's own flags (beside the sweep's, experiments.sweep.SweepOptions)."""

    only: list[str] | None = option(None, "run these rows only (e.g. alone/rte glue4)", nargs="+", metavar="ROW")
    full: bool = option(False, "the CS224N side on the whole default recipe (default, default+glue4) instead of "
                               "one epoch (e1, e1+glue4)")


def build_parser() -> Parser:
    ap = Parser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n")[0])
    add_options(ap, GlueOptions)
    add_sweep_options(ap, out_dir="runs/glue", help_suffix={"data_dir": " and data/glue/ (bash setup.sh links them)"})
    return ap


def main(argv: list[str] | None = None) -> dict:
    ap = build_parser()
    args = ap.parse_args(argv)
    sweep = open_sweep(ap, args)
    table = rows(sweep.root, args.data_dir, args.full)
    unknown = sorted(set(args.only or ()) - set(table))
    if unknown:
        ap.error(f"--only {' '.join(unknown)}: rows are {', '.join(table)}")
    wanted = [r for r in table if args.only is None or r in args.only]
    t0 = time.perf_counter()
    runs = [(row, seed) for seed in args.seeds for row in wanted]  # seed by seed: an early stop has whole seeds
    sweep.map(lambda rs: sweep.train(f"{rs[0]}/seed{rs[1]}", [*table[rs[0]][1], "--data-dir", args.data_dir,
                                                              "--seed", str(rs[1])]), runs)
    if args.dry_run:
        return {}
    results = collect(sweep, list(table), args.seeds)
    text = render(results, args.full)
    summary = {"seeds": args.seeds, "jobs": args.jobs, "threads": args.threads, "full": args.full,
               "wall_s": round(time.perf_counter() - t0, 1), "flags": {r: f for r, (_, f) in table.items()},
               "rows": {r: {str(s): v for s, v in per.items()} for r, per in results.items()}}
    write_text(sweep.root / "glue.json", json.dumps(summary, indent=2) + "\n")
    write_text(sweep.root / "glue.md", text)
    print(text)
    return results


if __name__ == "__main__":
    main()
