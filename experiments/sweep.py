"""What the experiment scripts share: run ``train_multitask.py`` once per row, reuse finished runs, print tables.

Each run is a subprocess (``python train_multitask.py <flags> --out-dir <root>/<name>``)
so that rows do not share memory or RNG state, with ``OMP_NUM_THREADS`` set
when ``--threads`` is given. A run whose directory already holds a final
record made with the same command is reused (``sweep.json`` keeps the
command and the wall time), and a training run cut short mid-way continues
from its ``checkpoints/last`` (``--resume``), so an interrupted sweep
continues where it stopped; ``--force`` reruns everything. Paths mean what
they mean where the sweep was started: each command runs in the sweep's own
working directory, and ``runs/x`` and ``/abs/path/runs/x`` name one run
(``--out-dir`` and ``--data-dir`` are compared as absolute paths). ``jobs`` > 1
runs that many commands at once (``Sweep.map``), e.g. two one-thread runs
side by side on a 2-core CPU (``--jobs 2 --threads 1``).

The flags every such experiment takes (``--out-dir``, ``--seeds``, ``--jobs``,
``--threads``, ``--data-dir``, ``--force``, ``--dry-run``) are ``SweepOptions``'
fields, declared once here: an experiment adds them with its own defaults
(``add_sweep_options``) and makes its Sweep from them (``open_sweep``).

Usage:
    add_sweep_options(parser, out_dir="runs/ablation", skip=("data_dir",))
    args = parser.parse_args(argv)
    sweep = open_sweep(parser, args)
    record, wall_s = sweep.train("baseline/seed0", ["--epochs", "1", "--seed", "0"])
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.cli import Parser
from tasks.options import add_options, option, options_of
from tasks.training.progress import RunsClock
from tasks.outdir import release_lock, take_lock
from tasks.storage import write_text

ROOT = Path(__file__).resolve().parent.parent
PATH_FLAGS = ("--out-dir", "--data-dir")  # the directories a sweep names; compared as absolute paths
PATH_FIELDS = tuple(f[2:].replace("-", "_") for f in PATH_FLAGS)  # the same, as TrainConfig fields


@dataclass
class SweepOptions:
    """The flags of an experiment that runs a sweep of training runs (a table's rows, each once per seed)."""

    out_dir: str = option("runs", "where the runs, the tables and the plots go", metavar="DIR")
    seeds: list[int] = option(help="every row (or cell) runs once per seed", factory=lambda: [0, 1, 2], nargs="+")
    jobs: int = option(1, "runs at the same time (2 on a 2-core CPU, with --threads 1)", metavar="N")
    threads: int | None = option(None, "OMP_NUM_THREADS of every run (default: torch's)", metavar="N")
    data_dir: str = option("data", "the CS224N CSV files", metavar="DIR")
    force: bool = option(False, "rerun what already finished (a finished run is reused otherwise)")
    dry_run: bool = option(False, "print the commands, run nothing")


def add_sweep_options(parser: Parser | Any, *, out_dir: str, seeds: Sequence[int] = (0, 1, 2),
                      skip: Sequence[str] = (), help_suffix: dict[str, str] | None = None) -> None:
    """``SweepOptions``' flags on ``parser`` (or an argument group), with an experiment's own defaults; ``skip``:
    the fields it does not take; ``help_suffix``: what a field means in it."""
    add_options(parser, SweepOptions, defaults=SweepOptions(out_dir=out_dir, seeds=list(seeds)), skip=skip,
                help_suffix=help_suffix)


def open_sweep(parser: Parser, args: Any, root: str | os.PathLike | None = None) -> Sweep:
    """The Sweep of an experiment's parsed flags, under ``root`` (default: --out-dir); a --jobs below 1 is an error
    of ``parser`` (exit status 2), raised before any folder is made."""
    options = SweepOptions(**options_of(args, SweepOptions))
    if options.jobs < 1:
        parser.error(f"--jobs {options.jobs}: at least 1")
    return Sweep(options.out_dir if root is None else root, threads=options.threads, force=options.force,
                 dry_run=options.dry_run, jobs=options.jobs)


def same_command(a: Sequence[str] | None, b: Sequence[str] | None) -> bool:
    """Whether two argvs are one command: equal but for how they spell the directories of ``PATH_FLAGS``."""
    return a is not None and b is not None and _canonical(a) == _canonical(b)


def _canonical(argv: Sequence[str]) -> list[str]:
    """``argv`` with the values of ``PATH_FLAGS`` (``--flag DIR`` and ``--flag=DIR``) made absolute."""
    out = list(argv)
    for i, arg in enumerate(out):
        flag, eq, value = arg.partition("=")
        if flag in PATH_FLAGS and eq:
            out[i] = f"{flag}={os.path.abspath(value)}"
        elif i > 0 and out[i - 1] in PATH_FLAGS:
            out[i] = os.path.abspath(arg)
    return out


def say(line: str) -> None:
    """One progress line on stdout in one write: print() writes the text and its newline apart, so lines from
    two jobs' threads could run into one another."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def final_record(run_dir: Path) -> dict | None:
    """The last ``"final": true`` record of a run's metrics.jsonl, or None when the run did not finish."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    final = None
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("final"):
            final = record
    return final


_thread = threading.local()  # per thread: the commands it ran (a reused run is none); RunsClock's rate counts only those


def _commands_run() -> int:
    return getattr(_thread, "commands_run", 0)


class Sweep:
    """Runs commands under ``root``, one directory per name, and remembers how long each took."""

    def __init__(self, root: str | os.PathLike, threads: int | None = None, force: bool = False,
                 dry_run: bool = False, jobs: int = 1) -> None:
        self.root = Path(root)
        self.threads, self.force, self.dry_run, self.jobs = threads, force, dry_run, jobs
        self.root.mkdir(parents=True, exist_ok=True)

    def map(self, fn: Callable, items: Iterable, cost: Callable | None = None) -> list:
        """``[fn(item) for item in items]``, ``jobs`` at a time (threads that each wait on one subprocess).

        ``cost(item)``, when given, is an estimate of an item's run time: the costliest items start first
        (ties in the items' order), so that with jobs > 1 a long item does not run alone at the end while
        the other cores idle (longest-processing-time-first). Results come in the items' order either way.
        """
        items = list(items)
        costs = [cost(item) for item in items] if cost else [1.0] * len(items)
        order = sorted(range(len(items)), key=lambda i: -costs[i]) if cost else list(range(len(items)))
        clock = RunsClock(costs)
        if not self.dry_run:
            say(f"[sweep] plan: {len(items)} runs, {min(self.jobs, len(items))} at a time"
                + (f", {self.threads} thread{'s' if self.threads > 1 else ''} each" if self.threads else ""))

        counted = threading.Lock()  # a run's count and its line go out together: "1/6" never after "2/6"

        def timed(i: int) -> Any:
            before = _commands_run()
            result = fn(items[i])
            with counted:
                clock.done(i, ran=_commands_run() > before)
                if not self.dry_run:
                    say(f"[sweep] {clock.line()}")
            return result

        try:
            if self.jobs <= 1 or len(items) <= 1:
                done = {i: timed(i) for i in order}
            else:
                with ThreadPoolExecutor(max_workers=self.jobs) as pool:  # its workers take items in submission order
                    done = dict(zip(order, pool.map(timed, order)))
        except SystemExit as stop:  # a run failed (its log's tail in the message); the runs under way have finished
            if not isinstance(stop.code, str):
                raise
            raise SystemExit(f"{stop.code.rstrip()}\n[sweep] stopped: {len(clock.finished)}/{len(items)} runs done, "
                             "none started after the failure; once it is mended, the same command again reuses "
                             "the finished runs") from None
        return [done[i] for i in range(len(items))]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.threads:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.threads)
        return env

    def command(self, name: str, argv: Sequence[str], *, module: str | None = None,
                resume: Sequence[str] | None = None, same_run: bool | None = None) -> dict:
        """Run ``python train_multitask.py argv`` (or ``python -m module argv``) once; returns {argv, wall_s}.

        The record lands in ``<root>/<name>/sweep.json``; a second call with the same
        argv returns it without running, unless ``force``. ``sweep.json`` is written
        (``wall_s`` null) before the run starts: when a call with the same argv finds
        it unfinished and ``<root>/<name>/checkpoints/last`` there, it runs ``resume``
        instead, so a training run cut short continues. The wall_s of a resumed run is
        that of the resuming process alone. ``same_run`` (a training run: its config.json
        against argv's config, ``train``) overrides the argv's verdict: True, what is there
        is argv's run however it was spelled; False, it was made with other settings (run
        afresh).
        """
        run_dir = self.root / name
        marker = run_dir / "sweep.json"
        prior = json.loads(marker.read_text()) if marker.is_file() and not self.force else {}
        same = (same_command(prior.get("argv"), argv) if same_run is None or not prior else same_run) \
            and prior.get("module") == module
        if same and prior.get("wall_s") is not None:
            say(f"[{name}] reusing the finished run ({prior['wall_s']:.0f} s)")
            return prior
        run = list(argv)
        if same and resume is not None and (run_dir / "checkpoints" / "last").is_dir():
            run = list(resume)  # the same run, cut short: continue from its last checkpoint
        cmd = [sys.executable] + (["-m", module] if module else [str(ROOT / "train_multitask.py")]) + run
        say(f"[{name}] {' '.join(shlex.quote(c) for c in ['python'] + cmd[1:])}")
        if self.dry_run:
            return {"argv": list(argv), "module": module, "wall_s": math.nan}
        run_dir.mkdir(parents=True, exist_ok=True)
        with _run_lock(run_dir, name):
            write_text(marker, json.dumps({"argv": list(argv), "module": module, "wall_s": None}, indent=2) + "\n")
            return self._run(name, cmd, argv, module, run_dir, marker, resumed=run != list(argv))

    def _run(self, name: str, cmd: list[str], argv: Sequence[str], module: str | None, run_dir: Path,
             marker: Path, resumed: bool) -> dict:
        t0 = time.perf_counter()
        with open(run_dir / "sweep.log", "a", encoding="utf-8") as log:
            proc = subprocess.run(cmd, env=self.env(), stdout=log, stderr=subprocess.STDOUT)  # in our cwd
        wall = time.perf_counter() - t0
        _thread.commands_run = _commands_run() + 1
        if proc.returncode != 0:
            tail = (run_dir / "sweep.log").read_text(encoding="utf-8", errors="replace")[-3000:]
            raise SystemExit(f"[{name}] failed with exit status {proc.returncode} after {wall:.0f} s; "
                             f"log {run_dir / 'sweep.log'}:\n{tail}")
        done = {"argv": list(argv), "module": module, "wall_s": round(wall, 1), "threads": self.threads,
                "resumed": resumed}
        write_text(marker, json.dumps(done, indent=2) + "\n")
        say(f"[{name}] done in {wall:.0f} s")
        return done

    def train_argv(self, name: str, flags: Sequence[str]) -> list[str]:
        """The command ``train(name, flags)`` runs and records in ``<root>/<name>/sweep.json``."""
        return list(flags) + ["--out-dir", str(self.root / name), "--overwrite"]

    def _same_run(self, name: str, argv: Sequence[str]) -> bool | None:
        """Whether ``<root>/<name>`` is the run ``argv`` gives today (``changed_settings``); None when it has no
        config.json to read."""
        changed = changed_settings(self.root / name, argv)
        if changed:
            say(f"[{name}] made with other settings ({', '.join(changed)}): training it again")
        return None if changed is None else not changed

    def finished(self, name: str) -> tuple[dict, float | None] | None:
        """(the final record, the wall seconds its ``sweep.json`` holds, or None) of the run ``<root>/<name>``;
        None while it has no final record. What an experiment's table reads, never starting anything. A run cut
        short and resumed has no wall time: its ``sweep.json`` holds the resuming process's alone."""
        run_dir = self.root / name
        record = final_record(run_dir)
        if record is None:
            return None
        marker = run_dir / "sweep.json"
        done = json.loads(marker.read_text()) if marker.is_file() else {}
        return record, None if done.get("resumed") else done.get("wall_s")

    def collect(self, rows: Iterable[str], seeds: Iterable[int],
                read: Callable[[dict], dict]) -> dict[str, dict[int, dict]]:
        """{row: {seed: {**read(final record), "wall_s": s}}} of the finished runs ``<root>/<row>/seed<k>``: an
        experiment's table, read without starting anything (a row or seed not finished is absent)."""
        results: dict[str, dict[int, dict]] = {}
        for row in rows:
            for seed in seeds:
                finished = self.finished(f"{row}/seed{seed}")
                if finished is not None:
                    record, wall = finished
                    results.setdefault(row, {})[seed] = {**read(record), "wall_s": wall}
        return results

    def train(self, name: str, flags: Sequence[str]) -> tuple[dict, float]:
        """One training run (fresh, ``--overwrite``; resumed when cut short); returns (its final record, wall s)."""
        run_dir = self.root / name
        argv = self.train_argv(name, flags)
        done = self.command(name, argv, resume=["--resume", "--out-dir", str(run_dir)],
                            same_run=self._same_run(name, argv))
        record = final_record(run_dir) if not self.dry_run else {"dev": {}}
        if record is None:
            raise SystemExit(f"[{name}] {run_dir}/metrics.jsonl has no final record")
        return record, done["wall_s"]


def changed_settings(run_dir: Path, argv: Sequence[str]) -> list[str] | None:
    """The settings in which ``run_dir``'s config.json differs from what ``argv`` gives today (TrainConfig.acting:
    however the flags spell it, settings that act on nothing left out); [] for the same run, None when there is
    no config.json to read or the flags do not parse. The same flags recorded before a default changed are
    another run (a --resume of it would be refused); other flags that pin what a default has become since are
    the same run. Its --out-dir is not compared: the run is the directory it is read from, wherever it was made
    (an experiment that renames a row finds its runs moved)."""
    saved_path = run_dir / "config.json"
    if not saved_path.is_file():
        return None
    from tasks.train_config import TrainConfig  # from_dict fills the fields a config written before them lacks
    from tasks.arguments import config_for  # flags mean what they mean to train_multitask.py

    try:
        saved = TrainConfig.from_dict(json.loads(saved_path.read_text(encoding="utf-8"))).acting()
        today = config_for(list(argv)).acting()
    except (ValueError, OSError, SystemExit):  # unreadable, or flags the run itself will refuse and explain
        return None
    for config in (saved, today):
        config.pop("out_dir")  # it is the run <root>/<name> wherever it was made (a moved run is the same run)
        config.update({k: os.path.abspath(config[k]) for k in PATH_FIELDS if config.get(k)})  # runs/x = /a/runs/x
    return sorted(k for k in set(saved) | set(today) if saved.get(k) != today.get(k))


@contextlib.contextmanager
def _run_lock(run_dir: Path, name: str):
    """Refuse to start a run whose directory another live sweep process is running (its --overwrite would
    wipe that run's files); a lock left by a dead process is taken over (tasks.outdir.take_lock)."""
    lock = run_dir / "sweep.lock"
    try:
        take_lock(lock, f"[{name}] {run_dir}", reentrant=False)
    except FileExistsError as e:
        raise SystemExit(f"{e} (or run other rows: --only / --methods / --conditions)") from None
    try:
        yield
    finally:
        release_lock(lock)


def fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
