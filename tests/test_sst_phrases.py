"""Tests of tasks/sst_phrases.py, the command that builds the SST phrase file from the treebank's trees: it
writes the file --sst-phrases reads, refuses what would lose a file, and says in one line what is wrong."""

from __future__ import annotations

import pytest

from tasks import sst_phrases
from tasks.task import get_task

TREES = {"train.txt": "(3 (2 (2 The) (2 film)) (3 good))\n(4 (4 (2 a) (4 gripping)) (2 story))\n",
         "dev.txt": "(2 (2 The) (2 Film))\n", "test.txt": "(1 (1 dull) (2 .))\n"}


@pytest.fixture
def trees(tmp_path):
    folder = tmp_path / "trees"
    folder.mkdir()
    for name, text in TREES.items():
        (folder / name).write_text(text)
    return folder


def test_it_writes_the_phrase_file_the_training_reads(trees, tmp_path):
    """The training trees' phrases, without sentences and without "The film" (a dev sentence, in other case)."""
    out = tmp_path / "data" / "sst-phrases-train.csv"
    report = sst_phrases.main([str(trees), "--out", str(out)])
    examples, _ = get_task("sst").read("train", ".", path=out)
    assert [(e.text_a, e.label) for e in examples] == [
        ("The", 2), ("a", 2), ("a gripping", 4), ("film", 2), ("good", 3), ("gripping", 4), ("story", 2)]
    assert (report.sentences, report.held_out) == (2, 1)


def test_an_existing_file_or_link_is_kept_unless_asked_and_a_link_target_never_written(trees, tmp_path, capsys):
    """setup.sh links data files from elsewhere: --overwrite replaces the link, the file it pointed to stays."""
    target = tmp_path / "shared.csv"
    target.write_text("the shared copy\n")
    out = tmp_path / "sst-phrases-train.csv"
    out.symlink_to(target)
    with pytest.raises(SystemExit) as e:
        sst_phrases.main([str(trees), "--out", str(out)])
    assert e.value.code == 2 and "exists; pass --overwrite" in capsys.readouterr().err
    sst_phrases.main([str(trees), "--out", str(out), "--overwrite"])
    assert not out.is_symlink() and target.read_text() == "the shared copy\n"


@pytest.mark.parametrize("broken, code, message", [
    ("dev.txt", 2, "no dev.txt there; pass the treebank's trees/ folder"),
    ("train.txt", 1, "train.txt line 1: a bracket must open with a label"),
])
def test_a_missing_or_malformed_tree_file_is_one_line(trees, tmp_path, capsys, broken, code, message):
    if code == 2:
        (trees / broken).unlink()
    else:
        (trees / broken).write_text("(x (2 a))\n")
    with pytest.raises(SystemExit) as e:
        sst_phrases.main([str(trees), "--out", str(tmp_path / "p.csv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == code and message in err[-1] and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "p.csv").exists()
