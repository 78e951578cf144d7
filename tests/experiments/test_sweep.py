"""Tests of experiments/sweep.py: the costliest items first, whole progress lines, run locks, reusing a finished
run only when its settings are today's, relative paths."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from experiments.sweep import Sweep, _run_lock, final_record
from tasks import arguments
from tests.helpers import unversioned


def test_final_record_is_the_last_final_line(tmp_path):
    assert final_record(tmp_path) is None
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"epoch": 1}, {"final": True, "dev": {"overall": 0.1}}, {"final": True, "dev": {"overall": 0.2}})) + "\n")
    assert final_record(tmp_path)["dev"]["overall"] == 0.2


def test_the_costliest_items_start_first_and_results_keep_their_order(tmp_path):
    """Longest first: with two jobs the two costliest items start together, the cheap ones after; one job runs
    them in cost order (ties in the items' order). Results come back in the items' order."""
    items = ["a", "bb", "c", "dddd", "ee"]
    started = []
    one = Sweep(tmp_path, jobs=1)
    assert one.map(str.upper, items) == ["A", "BB", "C", "DDDD", "EE"]
    assert one.map(lambda s: started.append(s) or s.upper(), items, cost=len) == ["A", "BB", "C", "DDDD", "EE"]
    assert started == ["dddd", "bb", "ee", "a", "c"]

    started.clear()
    both_started = threading.Barrier(2, timeout=30)  # the first two calls wait for each other: nothing else starts
    lock = threading.Lock()

    def run(item: str) -> str:
        with lock:
            started.append(item)
            first_two = len(started) <= 2
        if first_two:
            both_started.wait()
        return item.upper()

    assert Sweep(tmp_path, jobs=2).map(run, items, cost=len) == ["A", "BB", "C", "DDDD", "EE"]
    assert set(started[:2]) == {"dddd", "bb"} and set(started) == set(items)


def test_progress_lines_are_written_whole(tmp_path, monkeypatch):
    """Two jobs' threads print progress at once: each line goes out in one write, newline included, so lines
    cannot run into one another (print writes the text and its newline apart)."""
    writes = []

    class Recorder:
        def write(self, text):
            writes.append(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Recorder())
    sweep = Sweep(tmp_path, dry_run=True)
    sweep.command("row", ["--epochs", "1"])
    (tmp_path / "row").mkdir()
    (tmp_path / "row" / "sweep.json").write_text(json.dumps({"argv": ["--epochs", "1"], "module": None, "wall_s": 3}))
    sweep.command("row", ["--epochs", "1"])
    assert len(writes) == 2 and all(w.startswith("[row] ") and w.endswith("\n") for w in writes), writes


def test_progress_counts_go_out_in_order_when_two_jobs_finish_at_once(tmp_path, monkeypatch):
    """Two jobs' runs end together: the count a line says and the moment it is written belong together, so
    "1/2 runs done" never comes out after "2/2" (here the first line's write is slowed to let the other pass)."""
    import experiments.sweep as sweep_module

    lines = []
    lines_lock = threading.Lock()
    say = sweep_module.say

    def slow_first_count(line: str) -> None:
        if " 1/2 runs done" in line:
            threading.Event().wait(0.3)  # the other job's "2/2" would be written meanwhile
        with lines_lock:
            lines.append(line)
        say(line)

    monkeypatch.setattr(sweep_module, "say", slow_first_count)
    both_done = threading.Barrier(2, timeout=30)
    Sweep(tmp_path, jobs=2).map(lambda item: both_done.wait() and item, ["a", "b"])
    counts = [re.match(r"\[sweep\] (\d)/2 runs done", x) for x in lines]
    assert [int(m.group(1)) for m in counts if m] == [1, 2], lines


def test_a_run_directory_in_use_by_a_live_sweep_is_refused(tmp_path):
    """Two sweep processes must not run the same row (the second's --overwrite would wipe the first's files): a
    lock held by a live process refuses, one left by a dead process is taken over and removed after the run."""
    lock = tmp_path / "sweep.lock"
    lock.write_text(str(os.getpid()))  # a live owner
    with pytest.raises(SystemExit, match=rf"in use by process {os.getpid()}"):
        with _run_lock(tmp_path, "row"):
            pass
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(dead.stdout.strip())  # its owner has exited
    with _run_lock(tmp_path, "row"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()


def test_a_finished_run_made_with_other_defaults_is_trained_again(tmp_path, capsys):
    """A sweep reuses a finished run only when its config.json acts as the one its command gives with today's
    defaults: the same argv recorded before a default changed (here the STS prior) is trained again, and another
    argv that pins the old value (the experiment's table keeps its recipe) reuses it."""
    sweep = Sweep(tmp_path, dry_run=True)
    flags = ["--seed", "3", "--epochs", "2"]
    run = tmp_path / "member"
    run.mkdir()
    (run / "sweep.json").write_text(json.dumps({"argv": sweep.train_argv("member", flags), "module": None,
                                                "wall_s": 12.0}))
    (run / "metrics.jsonl").write_text(json.dumps({"final": True, "dev": {"overall": 0.5}}) + "\n")
    today = arguments.config_for(sweep.train_argv("member", flags)).to_dict()
    assert today["seed"] == 3 and today["epochs"] == 2 and today["out_dir"] == str(run)
    (run / "config.json").write_text(json.dumps(today))
    sweep.train("member", flags)
    assert "reusing the finished run" in capsys.readouterr().out
    changed = {**today, "prior_weights": {**today["prior_weights"], "sts": 0.25}}  # as if the default had been 0.25
    (run / "config.json").write_text(json.dumps(changed))
    sweep.train("member", flags)
    out = capsys.readouterr().out
    assert "reusing" not in out and "made with other settings (prior_weights)" in out and "python" in out
    older = {k: v for k, v in unversioned(today).items() if k != "sts_prior"}  # saved before it existed: legacy 0
    (run / "config.json").write_text(json.dumps(older))
    sweep.train("member", [*flags, "--sts-prior", "0"])  # the record's settings (legacy 0), spelled otherwise
    assert "reusing the finished run" in capsys.readouterr().out
    sweep.train("member", [*flags, "--sts-prior", "0", "--sts-prior-model", "x"])  # refused by the run: argv decides
    out = capsys.readouterr().out
    assert "reusing" not in out and "python" in out


def test_settings_that_act_on_nothing_do_not_make_another_run(tmp_path, capsys):
    """A run without phrases is the same run whatever its phrase settings say (TrainConfig.acting): one recorded
    before the default took the SST phrases is reused by a command that pins --sst-phrases none."""
    sweep = Sweep(tmp_path, dry_run=True)
    run = tmp_path / "member"
    run.mkdir()
    (run / "sweep.json").write_text(json.dumps({"argv": sweep.train_argv("member", ["--seed", "3"]), "module": None,
                                                "wall_s": 12.0}))
    (run / "metrics.jsonl").write_text(json.dumps({"final": True, "dev": {"overall": 0.5}}) + "\n")
    recorded = arguments.config_for(sweep.train_argv("member", ["--seed", "3", "--sst-phrases", "none"])).to_dict()
    older = {k: v for k, v in unversioned(recorded).items() if not k.startswith("sst_phrases")}  # saved before them
    (run / "config.json").write_text(json.dumps(older))
    sweep.train("member", ["--sst-phrases", "none", "--seed", "3"])
    assert "reusing the finished run" in capsys.readouterr().out
    sweep.train("member", ["--seed", "3"])  # today's default trains phrases: another run
    out = capsys.readouterr().out
    assert "made with other settings (loss_weights, max_train_examples, stream_files, stream_min_words, " \
        "stream_orders, task_batch_size)" in out and "python" in out


def test_a_finished_run_moved_to_the_directory_a_row_now_names_is_reused(tmp_path, capsys):
    """Where a run lives is not what it did: a finished run moved from <root>/default to <root>/base (an
    experiment renamed its arm) is reused there, not trained again (its config.json still names the old --out-dir)."""
    sweep = Sweep(tmp_path, dry_run=True)
    flags = ["--seed", "3", "--sst-phrases", "none"]
    old = arguments.config_for(sweep.train_argv("default", flags)).to_dict()
    run = tmp_path / "base"
    run.mkdir()
    (run / "sweep.json").write_text(json.dumps({"argv": sweep.train_argv("default", flags), "module": None,
                                                "wall_s": 12.0}))
    (run / "metrics.jsonl").write_text(json.dumps({"final": True, "dev": {"overall": 0.5}}) + "\n")
    (run / "config.json").write_text(json.dumps(old))
    sweep.train("base", flags)
    out = capsys.readouterr().out
    assert "reusing the finished run" in out and "made with other settings" not in out


def test_a_sweeps_relative_paths_mean_what_they_mean_where_it_was_started(tmp_path, monkeypatch):
    """A sweep started outside the project reads and writes its runs where its own relative paths point: the
    commands it runs (here python -m json.tool IN OUT) see the same relative paths, not the project's."""
    monkeypatch.chdir(tmp_path)
    Path("in.json").write_text('{"a": 1}')
    Sweep("runs").command("row", ["in.json", "runs/row/out.json"], module="json.tool")
    assert json.loads((tmp_path / "runs" / "row" / "out.json").read_text()) == {"a": 1}


@pytest.mark.parametrize("recorded_absolute", [False, True])
def test_a_finished_run_is_reused_however_its_directory_is_spelled(tmp_path, monkeypatch, capsys, recorded_absolute):
    """runs/x and /abs/runs/x are one directory: a second call of a command that spells --out-dir the other way
    reuses the finished run instead of training it again over it (which --overwrite would delete)."""
    monkeypatch.chdir(tmp_path)
    relative, absolute = Sweep("runs", dry_run=True), Sweep(tmp_path / "runs", dry_run=True)
    first, second = (absolute, relative) if recorded_absolute else (relative, absolute)
    flags = ["--seed", "3", "--sst-phrases", "none", "--data-dir", "data"]  # no phrase file in this directory
    run = tmp_path / "runs" / "member"
    run.mkdir(parents=True)
    (run / "sweep.json").write_text(json.dumps({"argv": first.train_argv("member", flags), "module": None,
                                                "wall_s": 12.0}))
    (run / "metrics.jsonl").write_text(json.dumps({"final": True, "dev": {"overall": 0.5}}) + "\n")
    (run / "config.json").write_text(json.dumps(arguments.config_for(first.train_argv("member", flags)).to_dict()))
    second.train("member", [*flags[:4], "--data-dir", str(tmp_path / "data")])
    out = capsys.readouterr().out
    assert "reusing the finished run" in out and "made with other settings" not in out
    second.train("member", [*flags[:4], "--data-dir", "other"])
    assert "made with other settings (data_dir)" in capsys.readouterr().out  # another directory is another run


def test_a_sweep_says_its_plan_and_after_each_run_how_far_it_is(tmp_path, capsys):
    """A sweep opens with its plan (runs, at a time, threads) and says after each run how many are done,
    the elapsed and the remaining time, and at the end its wall time; runs reused from an earlier sweep are
    counted apart and give no rate. (The commands: python -m json.tool --help, which exits 0 at once.)"""
    sweep = Sweep(tmp_path, threads=1)

    def run(name: str) -> dict:
        return sweep.command(name, ["--help"], module="json.tool")

    sweep.map(run, ["a", "b"])
    sweep.map(run, ["a", "b", "c"])  # a and b are reused
    out = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[sweep]")]
    expected = [r"plan: 2 runs, 1 at a time, 1 thread each",
                r"1/2 runs done \| elapsed \d+s, left ~\d+s",
                r"2/2 runs done \| wall time \d+s",
                r"plan: 3 runs, 1 at a time, 1 thread each",
                r"1/3 runs done \(1 reused\) \| elapsed \d+s",
                r"2/3 runs done \(2 reused\) \| elapsed \d+s",
                r"3/3 runs done \(2 reused\) \| wall time \d+s"]
    assert len(out) == len(expected) and all(re.fullmatch(r"\[sweep\] " + e, x) for e, x in zip(expected, out)), out


def test_a_failed_run_stops_the_sweep_with_a_line_of_its_own(tmp_path):
    """The failure's message ends with the run's log, whose last line is the run's own error; the sweep's line
    after it says that it stopped, how far it got and how to go on, and the runs after the failure do not start."""
    sweep = Sweep(tmp_path)
    with pytest.raises(SystemExit) as e:
        sweep.map(lambda name: sweep.command(name, ["--no-such-flag"] if name == "b" else ["--help"],
                                             module="json.tool"), ["a", "b", "c"])
    lines = str(e.value.code).splitlines()
    assert lines[0].startswith("[b] failed with exit status 2")
    assert "unrecognized arguments: --no-such-flag" in lines[-2]  # the run's own error, last in its log
    assert lines[-1].startswith("[sweep] stopped: 1/3 runs done, none started after the failure;")
    assert not (tmp_path / "c").exists()
    two = Sweep(tmp_path / "two", jobs=2)  # two at a time: the run beside the failed one finishes first
    with pytest.raises(SystemExit) as e:
        two.map(lambda name: two.command(name, ["--no-such-flag"] if name == "a" else ["--help"],
                                         module="json.tool"), ["a", "b", "c", "d"])
    assert re.fullmatch(r"\[sweep\] stopped: [1-3]/4 runs done, .*", str(e.value.code).splitlines()[-1])


def test_finished_reads_a_runs_final_record_and_wall_time_and_starts_nothing(tmp_path):
    """What the experiments' tables read: (final record, sweep.json's wall_s), None before a final record; a run
    that was cut short and resumed has no wall time (its sweep.json holds the resuming process's alone)."""
    sweep = Sweep(tmp_path)
    run = tmp_path / "row" / "seed0"
    run.mkdir(parents=True)
    assert sweep.finished("row/seed0") is None
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1}) + "\n")
    assert sweep.finished("row/seed0") is None  # an epoch record is not the end
    (run / "metrics.jsonl").write_text(json.dumps({"final": True, "dev": {"sst_acc": 0.5}}) + "\n")
    assert sweep.finished("row/seed0") == ({"final": True, "dev": {"sst_acc": 0.5}}, None)
    (run / "sweep.json").write_text(json.dumps({"argv": [], "wall_s": 12.5}))
    assert sweep.finished("row/seed0")[1] == 12.5
    (run / "sweep.json").write_text(json.dumps({"argv": [], "wall_s": 12.5, "resumed": True}))
    assert sweep.finished("row/seed0")[1] is None


def test_collect_reads_each_finished_run_through_the_experiments_reader(tmp_path):
    for name, final in (("a/seed0", True), ("a/seed1", False), ("b/seed0", True)):
        run = tmp_path / name
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps({"final": final, "dev": {"x": len(name)}}) + "\n")
    (tmp_path / "a/seed0/sweep.json").write_text(json.dumps({"wall_s": 5}))
    results = Sweep(tmp_path).collect(["a", "b", "c"], [0, 1], lambda record: {"x": record["dev"]["x"] * 2})
    assert results == {"a": {0: {"x": 14, "wall_s": 5}}, "b": {0: {"x": 14, "wall_s": None}}}
