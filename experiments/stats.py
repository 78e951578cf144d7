"""Seeds into table cells and plots: mean ± std, a change against a parent row with its standard error.

A row is run once per seed; the seeds of a row and of its parent are the
same (same data slices and batch order per seed), so a change is measured on
paired runs: Δ = mean over seeds of (row − parent), SE = std(differences) / √n,
and its 95% interval Δ ± t · SE with Student's t at n − 1 degrees of freedom
(t = 4.30 for 3 seeds, 2.36 for 8): with few seeds, ± 2 SE would be far too
narrow. A change is marked (``*``) when that interval excludes 0.

Usage:
    cell([0.47, 0.48, 0.46])                  # "0.470 ± 0.010"
    change([0.47, 0.48], [0.45, 0.47])        # (Δ, SE, n) over the seeds both have
    interval(row, parent)                     # (Δ, low, high, n): the paired 95% t interval
    change_cell(row, parent)                  # "+0.012 [+0.004, +0.020]*"
    plot_rows(path, rows, metrics, title)     # one panel per metric, mean with std error bars
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from tasks.storage import atomic_file


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample standard deviation); the std of one value is 0."""
    values = [v for v in values if v is not None]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def cell(values: Sequence[float], digits: int = 3) -> str:
    """"mean ± std" of the seeds ("mean" alone for one seed, "–" for none)."""
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    m, s = mean_std(values)
    return f"{m:.{digits}f}" if len(values) == 1 else f"{m:.{digits}f} ± {s:.{digits}f}"


def change(row: dict[int, float], parent: dict[int, float]) -> tuple[float, float, int]:
    """(Δ, SE, n): the mean paired difference over the seeds both rows have, its standard error, the pair count."""
    seeds = sorted(s for s in row if s in parent and row[s] is not None and parent[s] is not None)
    diffs = [row[s] - parent[s] for s in seeds]
    if not diffs:
        return math.nan, math.nan, 0
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    return statistics.fmean(diffs), se, len(diffs)


def t_quantile(level: float, df: int) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom (4.303 for 0.95 and 2)."""
    from scipy.stats import t  # scipy comes with the test extra, which setup.sh installs for experiments/

    return float(t.ppf(0.5 + level / 2, df))


def interval(row: dict[int, float], parent: dict[int, float], level: float = 0.95) -> tuple[float, float, float, int]:
    """(Δ, low, high, n): the mean paired difference and its ``level`` t interval, Δ ± t(n − 1) · SE; the
    interval is nan with fewer than two pairs (one seed has no spread to measure)."""
    delta, se, n = change(row, parent)
    if n < 2:
        return delta, math.nan, math.nan, n
    half = t_quantile(level, n - 1) * se
    return delta, delta - half, delta + half, n


def change_cell(row: dict[int, float], parent: dict[int, float], digits: int = 3) -> str:
    """"+0.012 [+0.004, +0.020]*": Δ and its paired 95% t interval, starred when the interval excludes 0
    (needs two or more paired seeds; one seed: Δ alone)."""
    delta, low, high, n = interval(row, parent)
    if n == 0:
        return "–"
    if n == 1:
        return f"{delta:+.{digits}f}"
    return f"{delta:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]" + ("*" if low > 0 or high < 0 else "")


def plot_rows(path: Path, labels: Sequence[str], values: dict[str, Sequence[Sequence[float]]], title: str,
              references: dict[str, float] | None = None) -> None:
    """One panel per metric: each row's mean over seeds with a ±std error bar, the seeds as dots.

    ``values[metric][i]`` holds row i's per-seed values; ``references[metric]`` draws a
    dashed line (e.g. the majority-class accuracy a collapsed row would sit on).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(values)
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics) + 2.5, 0.38 * len(labels) + 1.4),
                             sharey=True, squeeze=False)
    ys = list(range(len(labels)))[::-1]
    for ax, metric in zip(axes[0], metrics):
        stats = [mean_std(v) for v in values[metric]]
        ax.errorbar([m for m, _ in stats], ys, xerr=[s for _, s in stats], fmt="o", color="tab:blue", capsize=3)
        for y, seeds in zip(ys, values[metric]):
            ax.plot([v for v in seeds if v is not None], [y] * sum(v is not None for v in seeds), ".",
                    color="tab:gray", alpha=0.6)
        if references and metric in references:
            ax.axvline(references[metric], ls="--", color="tab:red", lw=1, label="majority class")
            ax.legend(loc="best", fontsize=7)  # "best": off the points, wherever they are
        ax.set_title(metric, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0][0].set_yticks(ys)
    axes[0][0].set_yticklabels(labels, fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    try:
        with atomic_file(Path(path)) as tmp:
            fig.savefig(tmp, dpi=110, format=Path(path).suffix[1:] or "png")
    finally:
        plt.close(fig)
