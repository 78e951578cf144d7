"""Tests of tasks/data/sst_trees.py: the treebank's trees read, and the phrase file built from them (what is kept,
what is left out, and its format as ``--sst-phrases`` reads it)."""

from __future__ import annotations

import pytest

from tasks.task import get_task
from tasks.data.sst_trees import (Node, build_phrases, held_out_sentences, parse_tree, phrase_id, read_trees,
                                  write_phrases)

# A tiny treebank in the release's format. The second training tree holds "a gripping story", which the dev set
# has as a whole sentence with other capitals; the third holds "the film", labelled 2 in the first and 3 there;
# the fourth is the first tree's subtree "is good !" as a sentence of its own; the fifth labels "film" 2 again.
TRAIN = """(3 (2 (2 The) (2 film)) (3 (3 (2 is) (3 good)) (2 !)))
(4 (4 (2 a) (4 (4 gripping) (2 story))) (2 .))
(3 (3 the) (3 film))

(3 (3 (2 is) (3 good)) (2 !))
(2 (2 film) (2 ,))
"""
DEV = "(4 (4 (2 A) (4 (4 Gripping) (2 Story))) (2 .))\n(4 (4 (2 A) (4 (4 Gripping) (2 Story))))\n"
TEST = "(1 (1 (2 A) (1 bore)) (2 .))\n"


@pytest.fixture
def trees(tmp_path):
    for name, text in (("train.txt", TRAIN), ("dev.txt", DEV), ("test.txt", TEST)):
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


def test_a_tree_gives_every_node_root_first():
    """Each bracket is a node: its words joined by spaces and its label; the root (the sentence) comes first."""
    nodes = parse_tree("(3 (2 (2 The) (2 film)) (4 good))")
    assert nodes[0] == Node("The film good", 3)
    assert sorted(nodes[1:], key=lambda n: n.text) == [Node("The", 2), Node("The film", 2), Node("film", 2),
                                                       Node("good", 4)]


@pytest.mark.parametrize("line, message", [("(3 (2 a)", "unbalanced"), ("(7 a)", "label 0-4"), ("a", "outside"),
                                           ("(2 a) (2 b)", "after the tree"), ("(2 )", "without words")])
def test_a_malformed_tree_names_its_line(tmp_path, line, message):
    (tmp_path / "train.txt").write_text(f"(2 ok)\n{line}\n")
    with pytest.raises(ValueError, match=f"train.txt line 2: .*{message}"):
        read_trees(tmp_path / "train.txt")


def test_phrases_of_the_training_trees_without_sentences_or_held_out_ones(trees):
    """Every labelled phrase of the training trees once, sorted; whole training sentences left out (also where
    one is another tree's subtree), and a phrase equal to a dev or test sentence ignoring case ("a gripping story"
    against the dev sentence "A Gripping Story") left out; a phrase labelled two ways keeps the more frequent."""
    held_out = held_out_sentences([trees / "dev.txt", trees / "test.txt"])
    phrases, report = build_phrases(read_trees(trees / "train.txt"), held_out)
    texts = [p.text for p in phrases]
    assert texts == sorted(texts) and len(set(texts)) == len(texts)
    assert "a gripping story" not in texts and "a gripping story ." not in texts
    assert "is good !" not in texts and "The film is good !" not in texts and "the film" not in texts
    assert {"gripping story", "The film", "film", "is good", "!", "."} <= set(texts)
    assert dict((p.text, p.label) for p in phrases)["film"] == 2  # 2 twice, 3 once
    assert (report.trees, report.sentences, report.held_out, report.relabelled) == (5, 6, 1, 1)
    assert sum(report.labels) == report.phrases == len(phrases)
    assert held_out == {"a gripping story .", "a gripping story", "a bore ."}


def test_the_file_is_the_cs224n_sst_format_and_reads_back(tmp_path):
    """Tab-separated with an unnamed index column, id = SHA-1's first 25 hex digits (the shared file's row for
    "!" is this one), and read back by the SST reader as labelled examples."""
    path = tmp_path / "phrases.csv"
    film = "a `` fine '' film"
    write_phrases(path, [Node("!", 2), Node(film, 4)])
    assert path.read_text(encoding="utf-8") == ("\tid\tsentence\tsentiment\n0\t0ab8318acaf6e678dd02e2b5c\t!\t2\n"
                                                f"1\t{phrase_id(film)}\t{film}\t4\n")
    examples, report = get_task("sst").read("train", ".", path=path)
    assert [(e.text_a, e.label) for e in examples] == [("!", 2), (film, 4)]
    assert report.to_dict()["skipped"] == 0
