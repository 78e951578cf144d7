"""What would an ensemble of K members of each kind score? Resampled from finished runs, nothing trained.

Each ``--pool NAME RUN...`` is a set of finished runs of one recipe (run
directories with ``predictions/``); each ``--mix NAME=K,NAME=K`` is a
composition. A draw picks K runs of each named pool at random, without
replacement, and scores their simple-mean ensemble on dev as
``python -m tasks.ensemble`` would (tasks.evaluation.ensemble.average; a run
trained on some tasks only joins those tasks). The table gives each mix's
mean ± std over the draws and how often it reaches ``--target``: the spread
an ensemble of that composition has from its members' seeds alone. The
draws share runs, so this describes the pools; it is not a test.

Usage:
    python -m experiments.ensemble_mixes --pool default runs/leaderboard-new/seed{0..7} \\
        --pool sst runs/probe-sstonly-seed{0..7} --mix default=4 --mix default=4,sst=4 [--draws 400]
"""

from __future__ import annotations

import logging
import random
import statistics
from collections.abc import Sequence

from tasks.cli import Parser, user_errors
from tasks.data.predictions import load_task_logits, task_members, trained_tasks
from tasks.evaluation.ensemble import average, dev_labels
from tasks.evaluation.metrics import TASK_METRIC, overall_score, score

TASKS = tuple(TASK_METRIC)


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

    def overall(self, runs: Sequence[str]) -> float:
        metrics = {}
        for task in TASKS:
            chosen = [self.logits[task][run] for run in runs if run in self.logits[task]]
            if not chosen:
                raise ValueError(f"a draw of {', '.join(runs)} has no run for {task}: add full members to the mix")
            metrics[TASK_METRIC[task]] = score(task, average(task, chosen)[1], self.labels[task])
        return overall_score(metrics)


def draw_scores(scorer: Scorer, pools: dict[str, list[str]], mix: dict[str, int], draws: int,
                rng: random.Random) -> list[float]:
    return [scorer.overall([run for name, k in mix.items() for run in rng.sample(pools[name], k)])
            for _ in range(draws)]


def main(argv: Sequence[str] | None = None) -> list[dict]:
    ap = Parser(prog="ensemble_mixes.py", description=__doc__.split("\n")[0])
    ap.add_argument("--pool", nargs="+", action="append", required=True, metavar=("NAME", "RUN"),
                    help="a name, then the finished runs of one recipe")
    ap.add_argument("--mix", action="append", required=True, metavar="NAME=K,...", help="a composition (repeatable)")
    ap.add_argument("--draws", type=int, default=400, help="random draws per mix")
    ap.add_argument("--target", type=float, default=0.770, help="report how often a draw reaches this overall")
    ap.add_argument("--seed", type=int, default=0, help="the draws' random seed")
    ap.add_argument("--data-dir", default="data", help="the CS224N CSV files (dev labels)")
    args = ap.parse_args(argv)
    pools: dict[str, list[str]] = {}
    for name, *runs in args.pool:
        if not runs:
            ap.error(f"--pool {name}: give the pool's runs after its name")
        if name in pools:
            ap.error(f"--pool {name} is given twice")
        pools[name] = runs
    if args.draws < 1:
        ap.error(f"--draws {args.draws}: at least 1")
    try:
        mixes = [(text, parse_mix(text, pools)) for text in args.mix]
    except ValueError as e:
        ap.error(str(e))
    rows = []
    logging.disable(logging.WARNING)  # every run's data-file report, once per task, would bury the table
    try:
        with user_errors("ensemble_mixes.py"):
            scorer = Scorer(sorted({run for runs in pools.values() for run in runs}), args.data_dir)
            for text, mix in mixes:
                scores = draw_scores(scorer, pools, mix, args.draws, random.Random(args.seed))
                rows.append({"mix": text, "mean": statistics.mean(scores), "std": statistics.pstdev(scores),
                             "reach": sum(s >= args.target for s in scores) / len(scores)})
    finally:
        logging.disable(logging.NOTSET)  # called in-process (tests), logging must work again afterwards
    print(f"| mix | dev overall, mean ± std over {args.draws} draws | draws ≥ {args.target:.3f} |")
    print("|---|---|---|")
    for row in rows:
        print(f"| {row['mix']} | {row['mean']:.4f} ± {row['std']:.4f} | {row['reach']:.0%} |")
    return rows


if __name__ == "__main__":
    main()
