"""What the default costs and what it buys: dev overall against minutes over the levers that set a run's size.

The default's wall time is its recipe's size (benchmarks/README.md: the training step is near the floors its parts
measure), so this sweep measures the levers that change what a run costs, each a point of the reference recipe
(``e3``: three epochs, the recipe the rule was set against) with one or a few flags changed, against the reference
itself, paired by seed:

  examples an epoch per stream (Quora pairs, SST phrases), epochs and the schedule's peak learning rate, the
  longest sequence, the encoder's dropout (off, or its masks from fewer generator draws), the layers trained (the
  embeddings and the lowest layers frozen), the Quora dev pairs scored between epochs, and combinations of them

Every point runs once per seed in ``<out-dir>/<point>/seed<k>`` (``--save-only-model``; a finished run is reused,
one cut short resumes: experiments/sweep.py); the same seed draws the same data slices and batch order in every
point, so a point's change of dev overall is measured on paired runs, with its 95% t interval (experiments/stats.py).

The rule for a new default (issue 71): the fastest point whose paired difference's 95% interval includes 0 and
whose mean difference is no more than ``TOLERANCE`` below the reference's; the table marks the points that
qualify, and the best point at about a third of the chosen default's minutes (what ``--preset quick`` should be).
Every point spells out its epochs, so a point is the same run whatever the default is.

Minutes are each run's own wall time (data to predictions) at the sweep's thread count: compare them within one
sweep on one machine, never across machines.

Usage:
    python -m experiments.front --out-dir runs/front --jobs 2 --threads 1 [--seeds 0 1 2] [--only POINT ...]
    python -m experiments.front --reference e2 ...   # points paired with today's default instead (a machine kind
                                                      # without e3 runs: the quick preset's choice)

Writes ``<out-dir>/front.json``, ``front.md`` (the table) and ``front.png`` (overall and its paired difference
against minutes, each point with its seeds' 95% interval).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tasks.cli import Parser
from tasks.options import add_options, option
from tasks.storage import atomic_file, write_text
from experiments.stats import cell, change_cell, interval, mean_std, t_quantile
from experiments.sweep import Sweep, add_sweep_options, fmt, markdown_table, open_sweep

REFERENCE = "e3"
TOLERANCE = 0.003  # a new default may cost at most this much dev overall on the mean of its paired seeds
QUICK_SHARE = 1 / 3  # --preset quick: the best point at about this share of the chosen default's minutes
COMMON = ["--save-only-model"]
KEYS = ("sst_acc", "para_acc", "sts_r", "overall")

# point -> (what it changes, its flags); every setting a point depends on spelled out, its epochs too
POINTS: dict[str, tuple[str, list[str]]] = {
    REFERENCE: ("the reference recipe: 3 epochs", ["--epochs", "3"]),
    "e2": ("2 epochs instead of 3 (today's default)", ["--epochs", "2"]),
    "e2-lr2": ("2 epochs, peak learning rate 2e-4", ["--epochs", "2", "--lr", "2e-4"]),
    "e1": ("1 epoch", ["--epochs", "1"]),
    "e1-lr2": ("1 epoch, peak learning rate 2e-4", ["--epochs", "1", "--lr", "2e-4"]),
    "para12k": ("12,000 Quora pairs an epoch instead of 23,000",
                ["--epochs", "3", "--max-train-examples", "para=12000"]),
    "phr8k": ("8,544 SST phrases an epoch instead of 17,088", ["--epochs", "3", "--sst-phrases-per-epoch", "8544"]),
    "nodrop": ("no dropout in the encoder", ["--epochs", "3", "--encoder-dropout", "0"]),
    "bytes": ("dropout masks from a third of the generator's draws", ["--epochs", "3", "--dropout-masks", "bytes"]),
    "len64": ("sequences cut at 64 tokens instead of 128", ["--epochs", "3", "--max-length", "64"]),
    "frz0": ("the word, position and type embeddings frozen", ["--epochs", "3", "--freeze-layers", "0"]),
    "frz2": ("the embeddings and the lowest 2 of 6 layers frozen", ["--epochs", "3", "--freeze-layers", "2"]),
    # two epochs (which qualifies on its own) with one more lever
    "e2-para12k": ("2 epochs of 12,000 Quora pairs", ["--epochs", "2", "--max-train-examples", "para=12000"]),
    "e2-phr8k": ("2 epochs of 8,544 SST phrases", ["--epochs", "2", "--sst-phrases-per-epoch", "8544"]),
    "e2-nodrop": ("2 epochs, no dropout in the encoder", ["--epochs", "2", "--encoder-dropout", "0"]),
    "e2-len64": ("2 epochs, sequences cut at 64 tokens", ["--epochs", "2", "--max-length", "64"]),
    "e2-frz2": ("2 epochs, the embeddings and the lowest 2 layers frozen", ["--epochs", "2", "--freeze-layers", "2"]),
    "e1-half": ("1 epoch of 12,000 Quora pairs and 8,544 SST phrases, 1,000 Quora dev pairs scored after it",
                ["--epochs", "1", "--max-train-examples", "para=12000", "--sst-phrases-per-epoch", "8544",
                 "--dev-max-examples", "para=1000"]),
    "e1-para6k": ("1 epoch of 6,000 Quora pairs and 8,544 SST phrases, 1,000 Quora dev pairs scored after it",
                  ["--epochs", "1", "--max-train-examples", "para=6000", "--sst-phrases-per-epoch", "8544",
                   "--dev-max-examples", "para=1000"]),
    "e2-dev1k": ("2 epochs, 1,000 Quora dev pairs scored between epochs instead of 3,000 (the final pass: all)",
                 ["--epochs", "2", "--dev-max-examples", "para=1000"]),
}


def collect(sweep: Sweep, names: Sequence[str], seeds: Sequence[int]) -> dict[str, dict[int, dict]]:
    """{point: {seed: {every dev metric, "wall_s"}}} of the finished runs."""
    return sweep.collect(names, seeds, lambda record: dict(record["dev"]))


def values(per_seed: dict[int, dict], key: str) -> dict[int, float]:
    return {s: v[key] for s, v in per_seed.items() if v.get(key) is not None}


def minutes(per_seed: dict[int, dict]) -> float:
    """The mean wall time of a point's runs, in minutes (nan when none has one)."""
    walls = [v["wall_s"] for v in per_seed.values() if v.get("wall_s") is not None]
    return statistics.fmean(walls) / 60 if walls else math.nan


@dataclass(frozen=True)
class Verdict:
    """A point against the reference: its mean minutes, the paired Δ overall with its 95% interval, whether it
    qualifies as a new default (the interval includes 0 and Δ >= -TOLERANCE, two or more paired seeds)."""

    point: str
    minutes: float
    delta: float
    low: float
    high: float
    pairs: int

    @property
    def qualifies(self) -> bool:
        return self.pairs >= 2 and self.low <= 0 <= self.high and self.delta >= -TOLERANCE


def verdicts(results: dict[str, dict[int, dict]], reference: str = REFERENCE) -> list[Verdict]:
    """Every point with a paired seed against the reference, fastest first."""
    ref = values(results.get(reference, {}), "overall")
    out = []
    for point, per_seed in results.items():
        if point == reference:
            continue
        delta, low, high, n = interval(values(per_seed, "overall"), ref)
        if n:
            out.append(Verdict(point, minutes(per_seed), delta, low, high, n))
    return sorted(out, key=lambda v: v.minutes)


def choices(results: dict[str, dict[int, dict]], reference: str = REFERENCE) -> dict[str, str | None]:
    """{"default": the fastest qualifying point, "quick": the best point, by mean overall, at about a third of
    the default's minutes (at most 40% of them; the reference's when none qualifies)} (None where none is
    measured)."""
    found = verdicts(results, reference)
    ref_minutes = minutes(results.get(reference, {}))
    qualifying = [v for v in found if v.qualifies and v.minutes < ref_minutes]
    default_minutes = qualifying[0].minutes if qualifying else ref_minutes
    cheap = [v for v in found if v.minutes <= 1.2 * QUICK_SHARE * default_minutes]
    return {"default": qualifying[0].point if qualifying else None,
            "quick": max(cheap, key=lambda v: v.delta).point if cheap else None}


def render(results: dict[str, dict[int, dict]], reference: str = REFERENCE) -> str:
    """The front's table: each point's minutes, dev scores (mean ± std over seeds) and paired Δ overall with its
    95% t interval against ``reference``, fastest first; then the rule's choice."""
    ref = results.get(reference, {})
    ref_minutes = minutes(ref)
    found = {v.point: v for v in verdicts(results, reference)}
    order = sorted(results, key=lambda p: minutes(results[p]))
    lines = []
    for point in order:
        per = results[point]
        what = POINTS[point][0] if point in POINTS else point
        v = found.get(point)
        lines.append([f"`{point}`", what, str(len(per)), fmt(minutes(per), 1),
                      fmt(minutes(per) / ref_minutes, 2) if ref_minutes == ref_minutes else "–",
                      *(cell(list(values(per, k).values()), 4 if k == "overall" else 3) for k in KEYS),
                      "" if point == reference else change_cell(values(per, "overall"), values(ref, "overall"), 4),
                      "yes" if v is not None and v.qualifies else ""])
    table = markdown_table(["point", "change", "seeds", "min", f"× {reference}", "SST acc", "Para acc", "STS r",
                            "overall", "Δ overall [95% t interval], paired", "qualifies"], lines)
    chosen = choices(results, reference)
    rule = (f"Rule: the fastest point whose paired Δ overall has a 95% interval that includes 0 and a mean no more "
            f"than {TOLERANCE} below {reference}'s. Chosen: {chosen['default'] or f'none ({reference} stays)'}; "
            f"the best point at about a third of its minutes: {chosen['quick'] or 'none measured'}.")
    return table + "\n\n" + rule + "\n"


def plot(path: Path, results: dict[str, dict[int, dict]], reference: str = REFERENCE) -> None:
    """Two panels against minutes: dev overall (mean with its seeds' 95% t interval) and Δ overall paired with the
    reference (with its 95% t interval); each point labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ref = values(results.get(reference, {}), "overall")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for point, per in results.items():
        x = minutes(per)
        overall = list(values(per, "overall").values())
        if not overall or x != x:
            continue
        m, s = mean_std(overall)
        half = t_quantile(0.95, len(overall) - 1) * s / math.sqrt(len(overall)) if len(overall) > 1 else 0.0
        color = "tab:red" if point == reference else "tab:blue"
        axes[0].errorbar([x], [m], yerr=[half], fmt="o", color=color, capsize=3)
        axes[0].annotate(point, (x, m), fontsize=7, xytext=(4, 3), textcoords="offset points")
        if point != reference:
            delta, low, high, n = interval(values(per, "overall"), ref)
            if n:
                err = [[delta - low], [high - delta]] if n > 1 else None
                axes[1].errorbar([x], [delta], yerr=err, fmt="o", color=color, capsize=3)
                axes[1].annotate(point, (x, delta), fontsize=7, xytext=(4, 3), textcoords="offset points")
    axes[0].set_ylabel("dev overall (mean, 95% t interval of the seeds)")
    axes[1].set_ylabel(f"Δ overall vs {reference}, paired by seed (95% t interval)")
    axes[1].axhline(0, color="tab:red", lw=1)
    axes[1].axhline(-TOLERANCE, color="tab:red", lw=1, ls="--")
    for ax in axes:
        ax.set_xlabel("minutes per run (the sweep's threads)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        with atomic_file(Path(path)) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)


@dataclass
class FrontOptions:
    """The experiment's own flags (beside the sweep's, experiments.sweep.SweepOptions)."""

    only: list[str] | None = option(None, "run these points only (--reference is always run: the others pair "
                                          "with it)", nargs="+", metavar="POINT")
    reference: str = option(REFERENCE, "the point every other is paired with and judged against by the rule: "
                                       f"{REFERENCE}, the recipe the rule was set against, or today's default (e2) "
                                       "on a machine kind whose e3 runs are not measured", metavar="POINT")
    table_only: bool = option(False, "run nothing: the table, the plot and front.json of the runs finished under "
                                     "--out-dir, each point with the seeds it has (of --seeds)")


def build_parser() -> Parser:
    ap = Parser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n")[0])
    add_options(ap, FrontOptions)
    add_sweep_options(ap, out_dir="runs/front")
    return ap


def main(argv: list[str] | None = None) -> dict:
    ap = build_parser()
    args = ap.parse_args(argv)
    unknown = sorted((set(args.only or ()) | {args.reference}) - set(POINTS))
    if unknown:
        ap.error(f"--only {' '.join(unknown)}: points are {', '.join(POINTS)}")
    sweep = open_sweep(ap, args)
    wanted = [p for p in POINTS if args.only is None or p in args.only or p == args.reference]
    t0 = time.perf_counter()
    runs = [(point, seed) for seed in args.seeds for point in wanted]  # seed by seed: an early stop has whole pairs
    if not args.table_only:
        sweep.map(lambda ps: sweep.train(f"{ps[0]}/seed{ps[1]}", [*POINTS[ps[0]][1], *COMMON, "--data-dir",
                                                                  args.data_dir, "--seed", str(ps[1])]), runs)
    if args.dry_run:
        return {}
    results = collect(sweep, list(POINTS), args.seeds)
    text = render(results, args.reference)
    summary = {"seeds": args.seeds, "jobs": args.jobs, "threads": args.threads,
               "wall_s": round(time.perf_counter() - t0, 1), "flags": {p: f for p, (_, f) in POINTS.items()},
               "reference": args.reference, "choices": choices(results, args.reference),
               "points": {p: {str(s): v for s, v in per.items()} for p, per in results.items()}}
    write_text(sweep.root / "front.json", json.dumps(summary, indent=2) + "\n")
    write_text(sweep.root / "front.md", text)
    plot(sweep.root / "front.png", results, args.reference)
    print(text)
    return results


if __name__ == "__main__":
    main()
