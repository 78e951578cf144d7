"""Tests of tasks/logs.py: a command's lines are held until its directory is its own, then written there with
every later one; other torchrun ranks print only warnings, marked with their rank."""

from __future__ import annotations

import logging

from tasks.logs import log_to, open_log


def test_lines_wait_for_the_commands_directory_then_go_there_with_every_later_one(tmp_path, capsys):
    log = logging.getLogger("tasks.test")
    log_to()
    log.info("before the directory is the command's")
    assert not (tmp_path / "train.log").exists()
    open_log(tmp_path)
    log.info("after")
    log.debug("not for the user")
    text = (tmp_path / "train.log").read_text()
    assert "before the directory is the command's" in text and "after" in text and "not for the user" not in text
    assert "after" in capsys.readouterr().err


def test_another_rank_prints_warnings_marked_with_its_rank(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    log_to()
    logging.getLogger("tasks.test").info("rank 1's progress")
    logging.getLogger("tasks.test").warning("rank 1 draws fresh masks")
    err = capsys.readouterr().err
    assert "rank 1's progress" not in err and "[rank 1]" in err and "rank 1 draws fresh masks" in err


def test_a_commands_error_is_the_last_line_of_its_log_and_printed_once(tmp_path, capsys):
    """A user's error: one line on the console (not twice: the log's copy is for the file alone) and the log file's
    last line; a bug keeps its traceback and its log file says what ended the command."""
    import pytest

    from tasks.cli import user_errors

    log_to()
    open_log(tmp_path)
    logging.getLogger("tasks.test").info("working")
    with pytest.raises(SystemExit) as exit_:
        with user_errors("python -m tasks.x"):
            raise ValueError("data/x.csv line 3: no label: fix the file")
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.count("data/x.csv line 3") == 1
    last = (tmp_path / "train.log").read_text().splitlines()[-1]
    assert last.endswith("E tasks: python -m tasks.x: error: data/x.csv line 3: no label: fix the file")

    with pytest.raises(RuntimeError):
        with user_errors("python -m tasks.x"):
            raise RuntimeError("a bug")
    assert (tmp_path / "train.log").read_text().splitlines()[-1].endswith(
        "python -m tasks.x: failed: RuntimeError: a bug")


def test_a_command_without_a_log_file_prints_its_error_once(monkeypatch, capsys):
    """A command that keeps no log (ensemble_mixes.py, token_budget.py): with no handler on the root logger,
    Python's last resort would print the log file's copy of the error as a second line on the console."""
    import pytest

    from tasks.cli import user_errors

    for name in ("", "tasks"):  # as outside pytest, which adds its own; no other test's handler either
        monkeypatch.setattr(logging.getLogger(name), "handlers", [])
    with pytest.raises(SystemExit):
        with user_errors("ensemble_mixes.py"):
            raise ValueError("runs/x has no run for para: add runs trained on it")
    assert capsys.readouterr().err.count("no run for para") == 1


def test_from_python_a_run_log_takes_the_packages_info_lines_and_goes_when_closed(tmp_path, capsys, monkeypatch):
    """With no command's log pending (run() from Python), open_log adds a file of its own for INFO lines of tasks
    and minbert, whatever the root level; close writes the error that ended the run, then removes the handlers
    and puts the levels back. Python's last resort still shows warnings on the console meanwhile."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # a script that configured no logging (pytest's capture set aside)
    monkeypatch.setattr(root, "level", logging.WARNING)
    handlers, level = list(root.handlers), logging.getLogger("tasks").level
    log = open_log(tmp_path)
    logging.getLogger("tasks.test").info("a run's progress")
    logging.getLogger("other.library").info("not ours")
    logging.getLogger("tasks.test").warning("a warning")
    log.close(RuntimeError("stopped"))
    logging.getLogger("tasks.test").info("after the run")
    lines = (tmp_path / "train.log").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == [
        "I tasks.test: a run's progress", "W tasks.test: a warning", "E tasks: failed: RuntimeError: stopped"]
    assert "a warning" in capsys.readouterr().err
    assert root.handlers == handlers and logging.getLogger("tasks").level == level


def test_lines_logged_before_a_python_runs_log_file_are_held_for_it_and_a_commands_are_not(tmp_path, monkeypatch,
                                                                                           capsys):
    """From Python (no log_to), held_records keeps the package's INFO lines and every warning of its block (the
    warnings printed once at once where no logging is set up) and LogFile.replay writes them into the file opened
    after, before its own lines; under a command's log_to, or on another torchrun rank, nothing is held (the
    command's pending log has them)."""
    from tasks.logs import held_records

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # a bare script
    monkeypatch.setattr(root, "level", logging.WARNING)
    monkeypatch.setattr(logging.getLogger("tasks"), "level", logging.NOTSET)
    with held_records() as held:
        logging.getLogger("tasks.test").info("read before the directory")
        logging.getLogger("tasks.test").warning("a file skipped rows")
    assert logging.getLogger("tasks").level == logging.NOTSET and root.handlers == []
    assert capsys.readouterr().err.count("a file skipped rows") == 1
    log = open_log(tmp_path)
    log.replay(held)
    logging.getLogger("tasks.test").info("the run's own line")
    log.close()
    lines = (tmp_path / "train.log").read_text().splitlines()
    assert [x.split(": ", 1)[1] for x in lines] == ["read before the directory", "a file skipped rows",
                                                   "the run's own line"]
    assert capsys.readouterr().err.count("a file skipped rows") == 0  # printed once, above

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with held_records() as held:
        logging.getLogger("tasks.test").warning("rank 1's")
    assert held == []
    monkeypatch.delenv("RANK")
    log_to()
    with held_records() as held:
        logging.getLogger("tasks.test").info("a command's line")
    assert held == []
