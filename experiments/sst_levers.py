"""SST-5 from the treebank's phrase labels, and the small-data levers, screened on SST specialists over seeds.

The Stanford Sentiment Treebank labels every phrase of every parse tree, and the classic SST-5 results train
on all of them (Socher et al. 2013); the CS224N files keep only the 8,544 whole training sentences.
``--sst-phrases FILE`` trains the training trees' phrases (data/sst-phrases-train.csv, data/README.md)
through the SST head as a stream of their own. Every row here is an SST specialist (``--tasks sst``, the
default recipe at three epochs on SST alone, a few minutes on 2 cores) scored by its head alone
(``--sst-prior 0``), so a row's change is the training's, not the prior's:

  base         the specialist without phrases (the parent of every row)
  phrases      + 8,544 phrases an epoch (as many as sentences), weight 1, mixed among the sentence batches
  w0.5, w0.25  ... at loss weight 0.5, 0.25
  n4k, n17k    ... 4,272 or 17,088 phrases an epoch
  n17k-b64, n17k-b128  ... 17,088 an epoch in batches of 64 or 128 phrases (fewer optimizer steps)
  min2, min3   ... only phrases of 2 or 3 words and more (18k of the 150k phrases are single words)
  first        ... each epoch trains its phrase batches first, then the sentences
  llrd         no phrases; layer-wise lr decay 0.9 (Sun et al. 2019 §5.3)
  ls, ls-nb    no phrases; label smoothing ε = 0.1 to every class, or to the neighbouring classes of SST's
               ordinal scale (tasks/objectives/label_smoothing.py)
  rdrop        no phrases; R-Drop, α = 1 (tasks/objectives/rdrop.py)
  reinit1, reinit2  no phrases; the top 1 or 2 of MiniLM's 6 layers re-initialised (--reinit-layers, Zhang et
               al. 2021 §5)
  n17k-b64-reinit2  the default's phrases (n17k-b64) and the top 2 layers re-initialised: for ``--full``

Each row runs once per seed in ``<out-dir>/<row>/seed<k>``; the table gives SST dev accuracy, mean ± std
over the seeds, its change against ``base`` paired by seed (Δ [95% t interval], starred where
it excludes 0; experiments/stats.py) and the mean wall seconds of a run. A finished run is reused and a run cut short
resumes (experiments/sweep.py), so the same command again continues where it stopped.

``--full ROW`` then confirms a row on the whole recipe: the default multitask run at three epochs plus ``base``'s
``--sst-phrases none`` (the default recipe before it took the n17k-b64 row's phrases) against the default plus the
row's own flags (the specialist's ``--tasks sst --sst-prior 0`` left out), seed by seed in
``<out-dir>/full/<arm>/seed<k>``, with the dev scores of the three tasks and their overall, the change of each
paired by seed, and the wall seconds of a run. With ``--jobs 2`` the two arms of a seed run side by side, so
their seconds are measured under the same load.

Usage:
    python -m experiments.sst_levers --out-dir runs/sst-phrases --jobs 2 --threads 1 [--seeds 0 1 ...] [--only ROW ...]
    python -m experiments.sst_levers --out-dir runs/sst-phrases --jobs 2 --threads 1 --seeds 0 1 2 3 --full w0.5

``--epochs 1`` runs both arms as the default in one epoch (``<out-dir>/full-e1/...``).

Writes ``<out-dir>/sst_phrases.json`` and ``sst_phrases.md`` (the table); with ``--full``, ``full.json`` and
``full.md`` (``full-e<epochs>.*``).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass

from tasks.cli import Parser
from tasks.options import add_options, option
from tasks.storage import write_text
from experiments.stats import cell, change_cell
from experiments.sweep import Sweep, add_sweep_options, fmt, markdown_table, open_sweep

EPOCHS = ["--epochs", "3"]  # the default recipe's epochs when these tables were measured (two since the front)
SPECIALIST = [*EPOCHS, "--tasks", "sst", "--sst-prior", "0"]
NO_PHRASES = ["--sst-phrases", "none"]


def phrases(per_epoch: int = 8544, *more: str, batch_size: int = 32) -> list[str]:
    """A specialist with the phrase file, ``per_epoch`` phrases an epoch (8,544: as many as sentences) in batches
    of ``batch_size`` (32: the sentences'), and more."""
    return [*SPECIALIST, "--sst-phrases", "sst-phrases-train.csv", "--sst-phrases-per-epoch", str(per_epoch),
            "--sst-phrases-batch-size", str(batch_size), *more]


def no_phrases(*more: str) -> list[str]:
    """A specialist without the phrase file, and more."""
    return [*SPECIALIST, *NO_PHRASES, *more]


# (row, what it is, its flags): every setting a row depends on is spelled out, so a row means the same whatever
# today's defaults (the default recipe took the n17k-b64 row's phrases after this table)
ROWS = [
    ("base", "SST specialist, no phrases", no_phrases()),
    ("phrases", "+ phrases: 8,544 an epoch, weight 1, mixed", phrases()),
    ("w0.5", "+ phrases, weight 0.5", phrases(8544, "--sst-phrases-weight", "0.5")),
    ("w0.25", "+ phrases, weight 0.25", phrases(8544, "--sst-phrases-weight", "0.25")),
    ("n4k", "+ phrases, 4,272 an epoch", phrases(4272)),
    ("n17k", "+ phrases, 17,088 an epoch", phrases(17088)),
    ("n17k-b64", "+ phrases, 17,088 an epoch in batches of 64", phrases(17088, batch_size=64)),
    ("n17k-b128", "+ phrases, 17,088 an epoch in batches of 128", phrases(17088, batch_size=128)),
    ("min2", "+ phrases of 2 words or more", phrases(8544, "--sst-phrases-min-words", "2")),
    ("min3", "+ phrases of 3 words or more", phrases(8544, "--sst-phrases-min-words", "3")),
    ("first", "+ phrases, each epoch's phrase batches first", phrases(8544, "--sst-phrases-order", "first")),
    ("llrd", "no phrases, layer-wise lr decay 0.9", no_phrases("--layer-lr-decay", "0.9")),
    ("ls", "no phrases, label smoothing 0.1 to every class",
     no_phrases("--objective", "label_smoothing", "--label-smoothing-weight", "0.1", "--label-smoothing-to",
                "uniform")),
    ("ls-nb", "no phrases, label smoothing 0.1 to the neighbouring classes",
     no_phrases("--objective", "label_smoothing", "--label-smoothing-weight", "0.1", "--label-smoothing-to",
                "neighbours")),
    ("rdrop", "no phrases, R-Drop, alpha 1", no_phrases("--objective", "rdrop", "--rdrop-alpha", "1")),
    ("reinit1", "no phrases, the top encoder layer re-initialised", no_phrases("--reinit-layers", "1")),
    ("reinit2", "no phrases, the top 2 encoder layers re-initialised", no_phrases("--reinit-layers", "2")),
    ("n17k-b64-reinit2", "+ phrases, 17,088 an epoch in batches of 64, the top 2 encoder layers re-initialised",
     phrases(17088, "--reinit-layers", "2", batch_size=64)),
]
NAMES = [name for name, _, _ in ROWS]
METRICS = ("sst_acc", "para_acc", "sts_r", "overall")
LABELS = {name: label for name, label, _ in ROWS}
FLAGS = {name: flags for name, _, flags in ROWS}
PARENT = "base"


def collect(sweep: Sweep, seeds: list[int]) -> dict[str, dict[int, dict]]:
    """{row: {seed: {"sst_acc", "wall_s"}}} of every finished run under the sweep's root."""
    return sweep.collect(NAMES, seeds, lambda record: {"sst_acc": record["dev"]["sst_acc"]})


def render(results: dict[str, dict[int, dict]]) -> str:
    """The table: SST acc mean ± std, Δ against base paired by seed, seconds per run."""
    lines = []
    parent = {s: v["sst_acc"] for s, v in results.get(PARENT, {}).items()}
    for row in NAMES:
        if row not in results:
            continue
        per_seed = results[row]
        acc = {s: v["sst_acc"] for s, v in per_seed.items()}
        walls = [v["wall_s"] for v in per_seed.values() if v.get("wall_s") is not None]
        lines.append([f"`{row}`: {LABELS[row]}", len(per_seed), cell(list(acc.values())),
                      change_cell(acc, parent) if row != PARENT else "",
                      fmt(statistics.fmean(walls), 0) if walls else "–"])
    return markdown_table(["row", "seeds", "SST acc", f"Δ vs {PARENT}, paired", "s per run"], lines)


def full_flags(row: str) -> list[str]:
    """The row's own flags on the whole recipe: its flags without the specialist's (``--sst-phrases none`` for
    ``base``)."""
    flags = FLAGS[row]
    assert flags[:len(SPECIALIST)] == SPECIALIST, f"{row}'s flags do not start with the specialist's {SPECIALIST}"
    return flags[len(SPECIALIST):]


def full_root(epochs: int | None) -> str:
    """The confirmation runs' folder under the sweep's root: ``full`` for three epochs, ``full-e<epochs>``."""
    return "full" if epochs is None else f"full-e{epochs}"


def run_full(sweep: Sweep, row: str, seeds: list[int], epochs: int | None = None) -> None:
    """The recipe (the default's at three epochs, or at ``epochs``) + ``base``'s flags, and the same + ``row``'s,
    over the seeds, a seed's two arms one after the other (next to each other with --jobs 2)."""
    recipe = EPOCHS if epochs is None else ["--epochs", str(epochs)]
    root = full_root(epochs)
    runs = [(arm, seed) for seed in seeds for arm in (PARENT, row)]
    sweep.map(lambda rs: sweep.train(f"{root}/{rs[0]}/seed{rs[1]}", [*recipe, *full_flags(rs[0]), "--seed",
                                                                     str(rs[1])]), runs)


def collect_full(sweep: Sweep, row: str, seeds: list[int], epochs: int | None = None) -> dict[str, dict[int, dict]]:
    """{arm: {seed: {metric: value, "wall_s"}}} of the finished runs of ``run_full``."""
    root = full_root(epochs)
    arms = sweep.collect([f"{root}/{PARENT}", f"{root}/{row}"], seeds,
                         lambda record: {k: record["dev"][k] for k in METRICS})
    return {name.split("/", 1)[1]: per_seed for name, per_seed in arms.items()}


def render_full(results: dict[str, dict[int, dict]], row: str) -> str:
    """One line per arm: each metric's mean ± std, then the row's changes paired by seed and the seconds."""
    lines = []
    for arm, per_seed in results.items():
        walls = [v["wall_s"] for v in per_seed.values() if v.get("wall_s") is not None]
        lines.append([f"`{arm}`: the recipe + {' '.join(full_flags(arm))}",
                      len(per_seed), *(cell([v[k] for v in per_seed.values()]) for k in METRICS),
                      fmt(statistics.fmean(walls), 0) if walls else "–"])
    if PARENT in results and row in results:
        parent, child = results[PARENT], results[row]
        lines.append([f"Δ `{row}` − `{PARENT}`, paired", len(set(parent) & set(child)),
                      *(change_cell({s: v[k] for s, v in child.items()}, {s: v[k] for s, v in parent.items()})
                        for k in METRICS),
                      change_cell({s: v["wall_s"] for s, v in child.items() if v["wall_s"] is not None},
                                  {s: v["wall_s"] for s, v in parent.items() if v["wall_s"] is not None}, 0)])
    return markdown_table(["arm", "seeds", "SST acc", "Para acc", "STS r", "overall", "s per run"], lines)


def write_report(sweep: Sweep, stem: str, summary: dict, text: str) -> None:
    """``<root>/<stem>.json`` (the summary) and ``<stem>.md`` (the table), and the table on stdout."""
    write_text(sweep.root / f"{stem}.json", json.dumps(summary, indent=2) + "\n")
    write_text(sweep.root / f"{stem}.md", text)
    print(text)


@dataclass
class PhrasesOptions:
    """The screen's own flags (beside the sweep's, experiments.sweep.SweepOptions)."""

    only: list[str] | None = option(None, "run these rows only (base always)", choices=NAMES, nargs="+")
    full: str | None = option(None, "run this row on the whole default recipe against base's (no phrases), seed by "
                                    "seed", choices=[r for r in NAMES if r != PARENT], metavar="ROW")
    epochs: int | None = option(None, "with --full: both arms train this many epochs instead of three (1: the "
                                      "default in one epoch)")


def build_parser() -> Parser:
    ap = Parser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n")[0])
    add_options(ap, PhrasesOptions)
    add_sweep_options(ap, out_dir="runs/sst-phrases", seeds=range(8), skip=("data_dir",))
    return ap


def main(argv: list[str] | None = None) -> dict:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.epochs is not None and args.full is None:
        ap.error("--epochs acts with --full ROW only (the screening rows are SST specialists)")
    sweep = open_sweep(ap, args)
    if args.full is not None:
        t0 = time.perf_counter()
        run_full(sweep, args.full, args.seeds, args.epochs)
        if args.dry_run:
            return {}
        full = collect_full(sweep, args.full, args.seeds, args.epochs)
        text = render_full(full, args.full) + "\n"
        summary = {"seeds": args.seeds, "jobs": args.jobs, "threads": args.threads, "row": args.full,
                   "epochs": args.epochs,
                   "wall_s": round(time.perf_counter() - t0, 1), "flags": full_flags(args.full),
                   "arms": {a: {str(s): v for s, v in per.items()} for a, per in full.items()}}
        write_report(sweep, full_root(args.epochs), summary, text)
        return full
    wanted = [r for r in NAMES if args.only is None or r in args.only or r == PARENT]
    t0 = time.perf_counter()
    runs = [(row, seed) for seed in args.seeds for row in wanted]  # seed by seed: an early stop has whole seeds
    sweep.map(lambda rs: sweep.train(f"{rs[0]}/seed{rs[1]}", [*FLAGS[rs[0]], "--seed", str(rs[1])]), runs)
    if args.dry_run:
        return {}
    results = collect(sweep, args.seeds)
    text = render(results) + "\n"
    summary = {"seeds": args.seeds, "jobs": args.jobs, "threads": args.threads,
               "wall_s": round(time.perf_counter() - t0, 1), "flags": FLAGS,
               "rows": {r: {str(s): v for s, v in per.items()} for r, per in results.items()}}
    write_report(sweep, "sst_phrases", summary, text)
    return results


if __name__ == "__main__":
    main()
