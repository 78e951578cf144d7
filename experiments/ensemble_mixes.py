"""What would an ensemble of K members of each kind score? Resampled from finished runs, nothing trained.

Each ``--pool NAME RUN...`` is a set of finished runs of one recipe (run
directories with ``predictions/``); each ``--mix NAME=K,NAME=K`` is a
composition. A draw picks K runs of each named pool at random, without
replacement, and scores their simple-mean ensemble on dev as
``python -m tasks.ensemble`` would (tasks.evaluation.ensembling.average; a run
trained on some tasks only joins those tasks). The table gives each mix's
mean ± std over the draws and how often it reaches ``--target``: the spread
an ensemble of that composition has from its members' seeds alone. The
draws share runs, so this describes the pools; it is not a test.

``--paired A B`` asks what a change buys an ensemble rather than a single run: pools A and B hold the runs of a
parent and of its change seed by seed (the i-th run of each shares a seed), and for every ensemble size k it
scores, for every k of the seeds, B's k runs against A's k runs, and gives the change of each task's metric and
of the overall, mean and range over those subsets. k = 1 is the single runs' paired Δ; a gain that comes from
making runs agree shrinks as k grows. The whole ensembles' change (k = n) comes with its standard error, a bootstrap
over the seeds (``--draws`` resamples): the yardstick of a gain for an ensemble (its normal 95% interval, ±1.96 SE,
not a t interval). ``--beside NAME...`` puts every run of those pools into both arms' ensembles: what a change of
the SST specialists buys beside the same full members, as the leaderboard command mixes them.

Usage:
    python -m experiments.ensemble_mixes --pool default runs/leaderboard-new/seed{0..7} \\
        --pool sst runs/probe-sstonly-seed{0..7} --mix default=4 --mix default=4,sst=4 [--draws 400]
    python -m experiments.ensemble_mixes --pool base runs/full/base/seed{0..3} \\
        --pool phrases runs/full/n17k-b64/seed{0..3} --paired base phrases
    python -m experiments.ensemble_mixes --pool full runs/full/base/seed{0..3} --pool sst runs/base/seed{0..7} \\
        --pool sst-phrases runs/n17k/seed{0..7} --paired sst sst-phrases --beside full
"""

from __future__ import annotations

import itertools
import logging
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tasks.cli import Parser, user_errors
from tasks.predictions import load_task_logits, task_members, trained_tasks
from tasks.evaluation.ensembling import average, dev_labels
from tasks.evaluation.metrics import overall_score, score, task_metric
from tasks.options import add_options, option
from tasks.task import MULTITASK

TASKS = MULTITASK
METRICS = (*(task_metric(task) for task in TASKS), "overall")  # what Scorer.metrics gives


def parse_mix(text: str, pools: dict[str, list[str]]) -> dict[str, int]:
    """``"default=4,sst=4"`` -> {"default": 4, "sst": 4}; raises ValueError naming what is wrong."""
    mix: dict[str, int] = {}
    for part in text.split(","):
        name, eq, k = part.partition("=")
        if not eq or not k.isdigit() or int(k) < 1:
            raise ValueError(f"--mix {text!r}: give NAME=K parts, K at least 1, e.g. default=4,sst=4")
        if name not in pools:
            raise ValueError(f"--mix {text!r}: no --pool named {name!r} (pools: {', '.join(pools)})")
        if int(k) > len(pools[name]):
            raise ValueError(f"--mix {text!r}: {k} of pool {name!r}, which has {len(pools[name])} runs")
        mix[name] = int(k)
    return mix


class Scorer:
    """Every run's dev logits, read once; ``overall(runs)`` scores the simple mean of any subset."""

    def __init__(self, runs: Sequence[str], data_dir: str) -> None:
        self.logits: dict[str, dict[str, object]] = {}
        self.labels: dict[str, object] = {}
        trained = [trained_tasks(run) for run in runs]
        for task in TASKS:
            members = [runs[i] for i in task_members(trained, task)]
            dev = load_task_logits(members, task, "dev")
            if dev is None:
                raise ValueError(f"no run has {task}-dev-logits.csv: every mix needs all three tasks")
            self.labels[task] = dev_labels(task, dev.ids, data_dir, str(dev.files[0]))
            self.logits[task] = dict(zip(members, dev.logits))

    def metrics(self, runs: Sequence[str]) -> dict[str, float]:
        """Each task's metric of the runs' simple mean, and their ``overall``."""
        metrics = {}
        for task in TASKS:
            chosen = [self.logits[task][run] for run in runs if run in self.logits[task]]
            if not chosen:
                raise ValueError(f"a draw of {', '.join(runs)} has no run for {task}: add runs trained on it "
                                 "(for specialists under --paired: --beside a pool of full members)")
            metrics[task_metric(task)] = score(task, average(task, chosen)[1], self.labels[task])
        return {**metrics, "overall": overall_score(metrics)}

    def overall(self, runs: Sequence[str]) -> float:
        return self.metrics(runs)["overall"]


def draw_scores(scorer: Scorer, pools: dict[str, list[str]], mix: dict[str, int], draws: int,
                rng: random.Random) -> list[float]:
    return [scorer.overall([run for name, k in mix.items() for run in rng.sample(pools[name], k)])
            for _ in range(draws)]


def paired_change(scorer: Scorer, parent: Sequence[str], change: Sequence[str], seeds: Sequence[int],
                  beside: Sequence[str]) -> dict[str, float]:
    """Each metric of change's ensemble of ``seeds`` minus parent's, the runs ``beside`` in both."""
    a = scorer.metrics([*(parent[i] for i in seeds), *beside])
    b = scorer.metrics([*(change[i] for i in seeds), *beside])
    return {m: b[m] - a[m] for m in METRICS}


def paired_gains(scorer: Scorer, parent: Sequence[str], change: Sequence[str],
                 beside: Sequence[str] = ()) -> list[dict]:
    """For k = 1..n: {"k", "subsets", metric: (mean, min, max) of change's k-run ensemble minus parent's over every
    k of the n seeds}; run i of each list shares a seed, and the runs ``beside`` join both arms' ensembles."""
    rows = []
    for k in range(1, len(parent) + 1):
        deltas: dict[str, list[float]] = {m: [] for m in METRICS}
        for seeds in itertools.combinations(range(len(parent)), k):
            for m, delta in paired_change(scorer, parent, change, seeds, beside).items():
                deltas[m].append(delta)
        rows.append({"k": k, "subsets": len(deltas["overall"]),
                     **{m: (statistics.mean(d), min(d), max(d)) for m, d in deltas.items()}})
    return rows


def paired_se(scorer: Scorer, parent: Sequence[str], change: Sequence[str], beside: Sequence[str], draws: int,
              rng: random.Random) -> dict[str, float]:
    """Each metric's standard error of the whole ensembles' paired change (k = n), by a bootstrap over seeds: a
    draw takes n seeds with replacement (a seed drawn twice weighs double in both arms) and scores the change's
    runs of those seeds against the parent's, the runs ``beside`` in both and not resampled; the SE is the
    draws' standard deviation. It measures the spread that the specialists' seeds give, not the dev set's."""
    n = len(parent)
    deltas: dict[str, list[float]] = {m: [] for m in METRICS}
    for _ in range(draws):
        seeds = [rng.randrange(n) for _ in range(n)]
        for m, delta in paired_change(scorer, parent, change, seeds, beside).items():
            deltas[m].append(delta)
    return {m: statistics.stdev(d) if draws > 1 else 0.0 for m, d in deltas.items()}


def paired_table(rows: list[dict], parent: str, change: str, beside: Sequence[str] = ()) -> str:
    lines = [f"| members | seed subsets | {' | '.join(f'Δ {m}' for m in METRICS)} |",
             "|---|---|" + "---|" * len(METRICS)]
    for row in rows:
        cells = [f"{row[m][0]:+.4f} ({row[m][1]:+.4f} to {row[m][2]:+.4f})" for m in METRICS]
        lines.append(f"| {row['k']} | {row['subsets']} | {' | '.join(cells)} |")
        if "se" in row:
            cells = [f"± {row['se'][m]:.4f}" for m in METRICS]
            lines.append(f"| {row['k']}, SE | {row['draws']} seed resamples | {' | '.join(cells)} |")
    with_ = f", each beside every run of {' and '.join(beside)}" if beside else ""
    return f"{change} against {parent}, the simple mean of k runs each{with_}, paired by seed: mean (min to max)\n" + \
        "\n".join(lines)


@dataclass
class MixesOptions:
    """The command's flags."""

    pool: list[list[str]] = option(help="a name, then the finished runs of one recipe", factory=list, repeat=True,
                                   nargs="+", metavar=("NAME", "RUN"))
    mix: list[str] = option(help="a composition (repeatable)", factory=list, repeat=True, metavar="NAME=K,...")
    paired: tuple[str, str] | None = option(None, "two pools of runs paired by seed: the change's gain at every "
                                                  "ensemble size", nargs=2, metavar=("PARENT", "CHANGE"))
    beside: list[str] = option(help="with --paired: pools whose runs join both arms' ensembles (full members beside "
                                    "specialists)", factory=list, nargs="+", metavar="NAME")
    draws: int = option(400, "random draws per mix; with --paired, the seed resamples of the whole ensembles' SE")
    target: float = option(0.770, "report how often a draw reaches this overall")
    seed: int = option(0, "the draws' random seed")
    data_dir: str = option("data", "the CS224N CSV files (dev labels)", metavar="DIR")


def build_parser() -> Parser:
    ap = Parser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n")[0])
    add_options(ap, MixesOptions, required=("pool",))
    return ap


def main(argv: Sequence[str] | None = None) -> dict[str, list[dict]]:
    """{"mixes": a row per --mix, "paired": a row per ensemble size of --paired}; prints them as tables."""
    ap = build_parser()
    args = ap.parse_args(argv)
    pools: dict[str, list[str]] = {}
    for name, *runs in args.pool:
        if not runs:
            ap.error(f"--pool {name}: give the pool's runs after its name")
        if name in pools:
            ap.error(f"--pool {name} is given twice")
        seen: dict[Path, str] = {}
        for run in runs:  # one run however its path is spelt (./r, r/, a link): averaged twice otherwise
            if (key := Path(run).resolve()) in seen:
                ap.error(f"--pool {name} holds run {seen[key]} twice ({run})")
            seen[key] = run
        pools[name] = runs
    if args.draws < 1:
        ap.error(f"--draws {args.draws}: at least 1")
    if args.beside and not args.paired:
        ap.error("--beside joins the ensembles of --paired: give --paired PARENT CHANGE too")
    if not args.mix and not args.paired:
        ap.error("give --mix NAME=K,... or --paired PARENT CHANGE")
    beside: list[str] = []  # the runs of the --beside pools, in both arms' ensembles
    if args.paired:
        for name in args.paired:
            if name not in pools:
                ap.error(f"--paired {' '.join(args.paired)}: no --pool named {name!r} (pools: {', '.join(pools)})")
        for name in args.beside:
            if name not in pools or name in args.paired:
                ap.error(f"--beside {name}: name a --pool other than the two of --paired (pools: {', '.join(pools)})")
        beside = [run for name in args.beside for run in pools[name]]
        for name in args.paired:  # a run twice in one arm's ensemble would weigh double
            if len({Path(r).resolve() for r in pools[name] + beside}) < len(pools[name] + beside):
                with_ = f" with --beside {' '.join(args.beside)}" if args.beside else ""
                ap.error(f"--paired: pool {name!r}{with_} holds a run twice; give each run once")
        sizes = [len(pools[name]) for name in args.paired]
        if sizes[0] != sizes[1]:
            ap.error(f"--paired {' '.join(args.paired)}: the pools hold {sizes[0]} and {sizes[1]} runs; "
                     "give each the same seeds in the same order")
    try:
        mixes = [(text, parse_mix(text, pools)) for text in args.mix]
    except ValueError as e:
        ap.error(str(e))
    for text, mix in mixes:  # two pools of one mix that share a run would draw it twice into an ensemble
        for i, a in enumerate(mix):
            for b in list(mix)[i + 1:]:
                shared = {Path(r).resolve() for r in pools[a]} & {Path(r).resolve() for r in pools[b]}
                if shared:
                    run = next(r for r in pools[a] if Path(r).resolve() in shared)
                    ap.error(f"--mix {text}: pools {a} and {b} share run {run}; an ensemble holds a run once")
    rows = []
    logging.disable(logging.WARNING)  # every run's data-file report, once per task, would bury the table
    try:
        with user_errors(f"python -m {__spec__.name}"):
            scorer = Scorer(sorted({run for runs in pools.values() for run in runs}), args.data_dir)
            for text, mix in mixes:
                scores = draw_scores(scorer, pools, mix, args.draws, random.Random(args.seed))
                rows.append({"mix": text, "mean": statistics.mean(scores), "std": statistics.pstdev(scores),
                             "reach": sum(s >= args.target for s in scores) / len(scores)})
            gains = paired_gains(scorer, *(pools[name] for name in args.paired), beside) if args.paired else []
            if gains:
                gains[-1].update(se=paired_se(scorer, *(pools[name] for name in args.paired), beside, args.draws,
                                              random.Random(args.seed)), draws=args.draws)
    finally:
        logging.disable(logging.NOTSET)  # called in-process (tests), logging must work again afterwards
    if rows:
        print(f"| mix | dev overall, mean ± std over {args.draws} draws | draws ≥ {args.target:.3f} |")
        print("|---|---|---|")
        for row in rows:
            print(f"| {row['mix']} | {row['mean']:.4f} ± {row['std']:.4f} | {row['reach']:.0%} |")
    if gains:
        print(paired_table(gains, *args.paired, args.beside))
    return {"mixes": rows, "paired": gains}


if __name__ == "__main__":
    main()
