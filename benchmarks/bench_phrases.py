"""What the SST phrase stream (``--sst-phrases``) adds to the default's training time, by phrase batch size.

An epoch of the default is a fixed number of optimizer steps per stream (tasks.data.schedule); the phrases
add their stream's steps, ``ceil(per_epoch / batch size)`` of them. Whole runs side by side on a shared
2-core machine measure that cost with the host's drift and each core's neighbours in it. Here every
stream's step is timed in one process, the streams in turn, so a drift falls on all of them alike: per
stream, the median over rounds of the mean seconds of ``Trainer.train_step`` (tasks.training.trainer:
forward, loss, backward, clipping, the AdamW update) on batches of the epoch's own plan, drawn at evenly
spaced quantiles of their padded size. An epoch's
training seconds under a setting are then the sum over its streams of steps x that median, and their ratio
to the default without phrases is what the phrases add to the training steps. Reading the data,
evaluation and the final predictions cost the same with or without phrases, so a whole run's ratio is
closer to 1 than this one.

Usage:
    python -m benchmarks.bench_phrases --threads 1 [--batch-sizes 32 64 128] [--per-epoch 17088] [--rounds 5]
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.bench_multitask import machine_info, make_base_trainer, report
from tasks.cli import Parser
from tasks.options import add_options, option
from tasks.train_config import TrainConfig
from tasks.data.datasets import move_batch
from tasks.model import PHRASES
from tasks.runtime import configure_malloc, synchronize
from tasks.training.optim import build_schedule
from tasks.training.trainer import Trainer


def phrase_key(batch_size: int) -> str:
    return f"{PHRASES}@{batch_size}"


def stratified(batches: list[list[int]], lengths: Sequence[int], steps: int) -> list[list[int]]:
    """``steps`` of ``batches`` at evenly spaced quantiles of their padded size (examples x the longest), so
    that their mean step time stands for the epoch's: bucketed batches range from a few tokens to many."""
    ranked = sorted(batches, key=lambda idx: len(idx) * max(lengths[i] for i in idx))
    if steps >= len(ranked):
        return ranked
    return [ranked[int((k + 0.5) * len(ranked) / steps)] for k in range(steps)]


def sample_batches(trainer: Trainer, batch_sizes: Sequence[int], steps: int) -> dict[str, list[dict]]:
    """``steps`` collated batches of every task stream, and of the phrase stream at each batch size, drawn by
    padded size (``stratified``) from epoch 0's plan of a run with that phrase batch size."""
    cfg, sets, device = trainer.cfg, trainer.train_sets, trainer.device
    plans: dict[str, list[list[int]]] = {}
    for b in batch_sizes:
        at_b = dataclasses.replace(cfg, task_batch_size={**cfg.task_batch_size, PHRASES: b})
        for stream, idx in build_schedule(at_b, at_b.resolve(), sets).epoch_plan(0):
            key = phrase_key(b) if stream == PHRASES else stream
            if stream == PHRASES or b == batch_sizes[0]:
                plans.setdefault(key, []).append(idx)
    return {key: [move_batch(sets[key.split("@")[0]].collate(idx), device)
                  for idx in stratified(batches, sets[key.split("@")[0]].lengths, steps)]
            for key, batches in plans.items()}


def time_streams(trainer: Trainer, batches: dict[str, list[dict]], rounds: int,
                 log: Callable[[str], None]) -> dict[str, list[float]]:
    """Seconds per step of each stream in each round: the streams' batches in turn, one untimed pass first."""
    trainer.current.train_mode(trainer.model)
    lr = trainer.lr_at(0, 0, trainer.schedule.steps_per_epoch())  # a warm-up lr: the steps barely move the model
    per_step: dict[str, list[float]] = {key: [] for key in batches}
    for r in range(rounds + 1):
        for key, bs in batches.items():
            stream = key.split("@")[0]
            synchronize(trainer.device)
            t0 = time.perf_counter()
            for batch in bs:
                trainer.train_step(stream, batch, lr)
            synchronize(trainer.device)
            if r > 0:
                per_step[key].append((time.perf_counter() - t0) / len(bs))
        log(f"round {r}/{rounds}" + (" (warm-up, not counted)" if r == 0 else ""))
    return per_step


def epoch_steps(trainer: Trainer, batch_size: int | None) -> dict[str, int]:
    """Steps an epoch per stream: the tasks', and the phrases' at ``batch_size`` (None: no phrases)."""
    schedule = trainer.schedule
    steps = {s: -(-schedule.examples_per_epoch(s) // schedule.batch_sizes[s]) for s in schedule.tasks
             if s != PHRASES}
    if batch_size is not None:
        steps[phrase_key(batch_size)] = -(-schedule.examples_per_epoch(PHRASES) // batch_size)
    return steps


def benchmark(cfg: TrainConfig, batch_sizes: Sequence[int] = (32, 64, 128), steps: int = 12, rounds: int = 5,
              log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict[str, Any]:
    """Per-stream step seconds (medians over ``rounds``) and each phrase batch size's modelled epoch against
    no phrases; ``cfg`` must train phrases (its per-epoch count is the one modelled)."""
    if PHRASES not in cfg.resolve().extra:
        raise ValueError("the benchmark needs a config that trains the SST phrases (--sst-phrases FILE, sst)")
    if steps < 1 or rounds < 1 or not batch_sizes or min(batch_sizes) < 1:
        raise ValueError(f"need steps >= 1, rounds >= 1 and batch sizes >= 1 (got {steps}, {rounds}, "
                         f"{list(batch_sizes)})")
    log("building the trainer (data, model) ...")
    trainer = make_base_trainer(cfg)
    batches = sample_batches(trainer, batch_sizes, steps)
    per_step = time_streams(trainer, batches, rounds, log)
    median = {key: statistics.median(v) for key, v in per_step.items()}
    settings: dict[str, dict[str, Any]] = {}
    for b in (None, *batch_sizes):
        n = epoch_steps(trainer, b)
        settings["none" if b is None else str(b)] = {"steps": n, "train_s": sum(n[k] * median[k] for k in n)}
    base = settings["none"]["train_s"]
    for s in settings.values():
        s["ratio"] = s["train_s"] / base
    return {"machine": machine_info(torch.get_num_threads()), "per_epoch": trainer.run.caps[PHRASES],
            "steps_timed": steps, "rounds": rounds, "step_s": per_step, "step_s_median": median,
            "settings": settings}


def markdown(res: dict[str, Any]) -> str:
    rows = ["| stream | s per step (median) | min–max over rounds |", "|---|---|---|"]
    for key, v in res["step_s"].items():
        rows.append(f"| {key} | {res['step_s_median'][key]:.3f} | {min(v):.3f}–{max(v):.3f} |")
    rows += ["", f"| phrases a batch ({res['per_epoch']:,} an epoch) | steps an epoch | training s an epoch "
                 "(modelled) | × no phrases |", "|---|---|---|---|"]
    for name, s in res["settings"].items():
        rows.append(f"| {name} | {sum(s['steps'].values()):,} | {s['train_s']:.0f} | {s['ratio']:.3f} |")
    return "\n".join(rows)


@dataclass
class PhrasesBenchOptions:
    """The benchmark's flags."""

    batch_sizes: list[int] = option(help="phrase batch sizes", factory=lambda: [32, 64, 128], nargs="+")
    per_epoch: int = option(17088, "phrases an epoch (--sst-phrases-per-epoch)", metavar="N")
    steps: int = option(12, "batches of each stream timed a round, drawn by size")
    rounds: int = option(5, "timed rounds (medians reported), after one untimed")
    threads: int | None = option(None, "torch.set_num_threads (the runs compared: 1)")
    data_dir: str = option("data", "the CS224N CSV files and sst-phrases-train.csv", metavar="DIR")
    json: str | None = option(None, "write every number to this JSON file", metavar="OUT")


def build_parser() -> Parser:
    ap = Parser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n\n")[0])
    add_options(ap, PhrasesBenchOptions)
    return ap


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    configure_malloc()  # as train_multitask.main does
    cfg = TrainConfig(data_dir=args.data_dir, stream_files={PHRASES: "sst-phrases-train.csv"},
                      max_train_examples={**TrainConfig().max_train_examples, PHRASES: args.per_epoch})
    try:
        res = benchmark(cfg, args.batch_sizes, steps=args.steps, rounds=args.rounds)
    except (ValueError, OSError) as e:
        ap.error(str(e))
    return report(res, "benchmarks.bench_phrases", argv, markdown, args.json)


if __name__ == "__main__":
    main()
