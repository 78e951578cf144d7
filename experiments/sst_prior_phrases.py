"""The SST prior's probe fitted with the treebank's phrases too, scored on finished runs.

The SST prior (tasks/evaluation/priors.py) mixes a run's SST head with a linear probe on the frozen MiniLM's
embeddings of the 8,544 training sentences:

    p(class) = (1 − W) × softmax(head logits) + W × p_probe(class)

Here the probe is fitted again on the sentences plus the phrases of the phrase file (data/sst-phrases-train.csv,
every one of them), each phrase at a sample weight w (a sentence at 1), and each run's dev SST accuracy is scored
with it in place of the run's own probe. Nothing is retrained: a run's head probabilities come back from its
saved dev logits (the log of the mixture) and the probe saved in its best checkpoint,

    softmax(head logits) = (exp(saved logits) − W × p_saved) / (1 − W),

so "w = 0" (the sentences alone, fitted again) scores what the run scored, up to the refit's last bits.

Runs are grouped by their parent directory (an arm: ``runs/sst-phrases/full/<arm>/seed<k>``). The table gives
each arm's dev SST accuracy, mean ± std over its runs, with the run's own probe and with each refit probe, and
the change paired by run (Δ [95% t interval], starred where it excludes 0; experiments/stats.py), and each probe's own dev
accuracy (its argmax alone).

Usage:
    python -m experiments.sst_prior_phrases --out-dir runs/sst-prior-phrases \\
        --runs runs/sst-phrases/full/base/seed* runs/sst-phrases/full/n17k-b64/seed* [--weights 0.1 0.3 1]

Writes ``<out-dir>/sst_prior_phrases.json`` and ``sst_prior_phrases.md`` (the table).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from experiments.stats import cell, change_cell
from experiments.sweep import markdown_table
from tasks.checkpoint import prior_file
from tasks.cli import Parser
from tasks.options import add_options, option
from tasks.model import PHRASES
from tasks.train_config import TrainConfig
from tasks.predictions import read_logits
from tasks.evaluation.priors import FrozenEncoder, fit_logistic_regression
from tasks.task import get_task
from tasks.selection import load_examples, load_stream
from tasks.storage import load_tensors, write_text

OWN = "own"  # the column of the run's own probe


def probe_probabilities(probe: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """(N, 5) class probabilities of a probe ({"weight", "bias"}) on embeddings ``x`` (N, H)."""
    return (x @ probe["weight"].T + probe["bias"]).softmax(-1)


def head_probabilities(saved_logits: torch.Tensor, saved_probe: torch.Tensor, weight: float) -> torch.Tensor:
    """softmax(head logits) of a run from its saved SST logits (log of the mixture) and its probe's probabilities
    (both (N, 5)), the prior's weight W: (exp(logits) − W p) / (1 − W), clamped at 0 (rounding)."""
    return ((saved_logits.exp() - weight * saved_probe) / (1.0 - weight)).clamp_min(0.0)


def fit_probes(sentences: torch.Tensor, labels: torch.Tensor, phrases: torch.Tensor, phrase_labels: torch.Tensor,
               weights: list[float]) -> dict[float, dict[str, torch.Tensor]]:
    """{w: the probe fitted on the sentences (weight 1) and the phrases at sample weight w}; w = 0: sentences
    alone."""
    probes = {}
    for w in weights:
        if w == 0:
            probes[w] = fit_logistic_regression(sentences, labels, get_task("sst").num_classes)
            continue
        sample_weight = torch.cat([torch.ones(len(sentences)), torch.full((len(phrases),), float(w))])
        probes[w] = fit_logistic_regression(torch.cat([sentences, phrases]), torch.cat([labels, phrase_labels]),
                                            get_task("sst").num_classes, sample_weight=sample_weight)
    return probes


def run_config(run: Path) -> TrainConfig:
    """The configuration a finished run was trained with (its config.json)."""
    return TrainConfig.from_dict(json.loads((run / "config.json").read_text(encoding="utf-8")))


def score_run(run: Path, cfg: TrainConfig, dev: dict[str, tuple[torch.Tensor, int]],
              probes: dict[float, dict[str, torch.Tensor]]) -> dict[str, float]:
    """{OWN: the run's dev SST accuracy as saved, "w": with probe w in place of its own} for one run directory
    and its configuration ``cfg``."""
    prior = cfg.resolve().priors.get("sst")
    if prior is None:
        raise SystemExit(f"{run}: the run has no SST prior (weight {cfg.prior_weights.get('sst')}, tasks "
                         f"{list(cfg.tasks)})")
    ids, saved = read_logits(run / "predictions" / "sst-dev-logits.csv")
    try:
        x = torch.stack([dev[i][0] for i in ids])
    except KeyError as e:
        raise SystemExit(f"{run}: dev id {e} is not in the SST dev file") from None
    y = torch.tensor([dev[i][1] for i in ids])
    own = probe_probabilities(load_tensors(run / "checkpoints" / "best" / prior_file("sst")), x)
    head = head_probabilities(saved, own, prior.weight)
    scores = {OWN: (saved.argmax(-1) == y).float().mean().item()}
    for w, probe in probes.items():
        mixed = (1 - prior.weight) * head + prior.weight * probe_probabilities(probe, x)
        scores[str(w)] = (mixed.argmax(-1) == y).float().mean().item()
    return scores


def render(results: dict[str, dict[str, dict[str, float]]], alone: dict[float, float]) -> str:
    """One line per arm and probe: accuracy mean ± std over the arm's runs, Δ against the runs' own probes, and
    the probe's own dev accuracy (``alone``, by weight)."""
    lines = []
    for arm, runs in results.items():
        own = {run: s[OWN] for run, s in runs.items()}
        lines.append([f"`{arm}`", "its own (sentences)", len(runs), cell(list(own.values()), 4), "", ""])
        for w, acc in alone.items():
            col = {run: s[str(w)] for run, s in runs.items()}
            what = "sentences, fitted again" if w == 0 else f"sentences + phrases at weight {w:g}"
            lines.append([f"`{arm}`", what, len(runs), cell(list(col.values()), 4), change_cell(col, own, 4),
                          f"{acc:.4f}"])
    return markdown_table(["arm", "probe", "runs", "SST acc", "Δ vs its own, paired", "the probe alone"], lines)


@dataclass
class PriorPhrasesOptions:
    """The command's flags."""

    out_dir: str = option("runs/sst-prior-phrases", "where the table and its JSON go", metavar="DIR")
    runs: list[str] = option(help="finished runs with an SST prior (their parent directory names the arm)",
                             factory=list, nargs="+", metavar="DIR")
    weights: list[float] = option(help="the phrases' sample weights, each a probe (0: the sentences alone, fitted "
                                       "again)", factory=lambda: [0.0, 0.1, 0.3, 1.0], nargs="+")
    phrases: str = option("sst-phrases-train.csv", "the phrase file (--sst-phrases's)", metavar="FILE")
    threads: int | None = option(None, "torch threads (default: torch's)", metavar="N")


def build_parser() -> Parser:
    ap = Parser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n")[0])
    add_options(ap, PriorPhrasesOptions, required=("runs",))
    return ap


def main(argv: list[str] | None = None) -> dict:
    ap = build_parser()
    args = ap.parse_args(argv)
    runs = [Path(r) for r in args.runs]
    for r in runs:
        if not (r / "predictions" / "sst-dev-logits.csv").is_file():
            ap.error(f"--runs {r}: no predictions/sst-dev-logits.csv (a finished run with sst?)")
    if any(w < 0 for w in args.weights):
        ap.error(f"--weights {args.weights}: a sample weight is >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    configs = {r: run_config(r) for r in runs}
    models = {cfg.prior_models.get("sst") for cfg in configs.values()}
    if len(models) != 1:
        ap.error(f"--runs: their SST priors use different encoders ({sorted(map(str, models))}); one at a time")
    cfg = TrainConfig(stream_files={PHRASES: args.phrases})  # today's data: the SST files and the phrases
    train, dev = load_examples("sst", "train", cfg), load_examples("sst", "dev", cfg)
    phrases, _ = load_stream(cfg, cfg.resolve().extra[PHRASES])
    encoder = FrozenEncoder(models.pop(), 0.5, "cpu")
    x_train, x_phrases, x_dev = (encoder.embed([e.text_a for e in ex]) for ex in (train, phrases, dev))

    def labels(examples):
        return torch.tensor([int(e.label) for e in examples])

    probes = fit_probes(x_train, labels(train), x_phrases, labels(phrases), args.weights)
    alone = {w: (probe_probabilities(p, x_dev).argmax(-1) == labels(dev)).float().mean().item()
             for w, p in probes.items()}
    by_id = {e.id: (x, int(e.label)) for e, x in zip(dev, x_dev)}
    results: dict[str, dict[str, dict[str, float]]] = {}
    for r in runs:
        results.setdefault(r.parent.name, {})[r.name] = score_run(r, configs[r], by_id, probes)
    text = render(results, alone) + "\n"
    out = Path(args.out_dir)
    summary = {"runs": [str(r) for r in runs], "weights": args.weights, "phrases": args.phrases,
               "sentences": len(train), "phrase_count": len(phrases), "probe_alone": {str(w): a for w, a in alone.items()},
               "results": results}
    write_text(out / "sst_prior_phrases.json", json.dumps(summary, indent=2) + "\n")
    write_text(out / "sst_prior_phrases.md", text)
    print(text)
    return results


if __name__ == "__main__":
    main()
