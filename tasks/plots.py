"""Training curves from the per-epoch history: losses and dev scores (paper Figures 4 and 5).

The paper (../shared/papers/minbert-downstream-generalization.txt, Appendix)
plots each task's log-loss and dev accuracy per epoch, min-max normalized so
the worst epoch is 0 and the best 1. ``plot_history`` draws both the raw
values (top row: what happened) and the normalized ones (bottom row: the
paper's view, where overfitting shows as a peak that falls away).

Usage:
    plot_history(history, "runs/x/training.png")   # history: the list of metrics.jsonl epoch records
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def _value(v: float | None) -> float:
    """A plotted value: missing or null (an undefined metric) -> nan, drawn as a gap."""
    return math.nan if v is None else float(v)


def _normalized(values: list[float], higher_is_better: bool) -> list[float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return values
    lo, hi = min(finite), max(finite)
    if hi == lo:
        return [1.0 for _ in values]
    return [((v - lo) if higher_is_better else (hi - v)) / (hi - lo) for v in values]


def plot_history(history: list[dict], path: str | os.PathLike[str]) -> Path:
    """Write a PNG of per-epoch train loss terms and dev metrics; returns the path.

    Each record needs "epoch", "train" ({term: mean}) and "dev" ({metric: value}).
    The head losses ("<task>/loss") and the objectives' terms are drawn alike.
    """
    path = Path(path)
    epochs = [r["epoch"] for r in history]
    terms = sorted({k for r in history for k in r.get("train", {})})
    metrics = sorted({k for r in history for k in r.get("dev", {})})
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), constrained_layout=True)
    for term in terms:
        ys = [_value(r.get("train", {}).get(term)) for r in history]
        axes[0, 0].plot(epochs, ys, marker="o", label=term)
        axes[1, 0].plot(epochs, _normalized(ys, higher_is_better=False), marker="o", label=term)
    for metric in metrics:
        ys = [_value(r.get("dev", {}).get(metric)) for r in history]
        style = dict(marker="o", linewidth=2.5 if metric == "overall" else 1.5)
        axes[0, 1].plot(epochs, ys, label=metric, **style)
        axes[1, 1].plot(epochs, _normalized(ys, higher_is_better=True), label=metric, **style)
    if terms and all(v > 0 for r in history for v in map(_value, r.get("train", {}).values()) if math.isfinite(v)):
        axes[0, 0].set_yscale("log")
    axes[0, 0].set_title("train loss terms (epoch mean)")
    axes[0, 1].set_title("dev metrics")
    axes[1, 0].set_title("loss, normalized: worst epoch 0, best 1 (paper Fig. 4)")
    axes[1, 1].set_title("dev, normalized: worst epoch 0, best 1 (paper Fig. 5)")
    for ax in axes.flat:
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)
    return path
