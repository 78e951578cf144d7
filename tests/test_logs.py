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
