"""The Stanford Sentiment Treebank's trees, and the file of labelled phrases that ``--sst-phrases`` reads.

The treebank (Socher et al. 2013) labels every node of every sentence's parse tree 0-4 (very negative,
negative, neutral, positive, very positive), and its public release ``trainDevTestTrees_PTB.zip``
(https://nlp.stanford.edu/sentiment/) holds the trees as one PTB bracketing a line, ``(3 (2 It) (4 (2 's)
...))``, in ``trees/train.txt``, ``dev.txt`` and ``test.txt``. The CS224N SST files are those trees' sentences
(their roots), with the trees' tokens (``-LRB-``, ````` `` `````, ``\\/``).

The phrase file is built from the training trees only: every labelled phrase (a subtree's words, single
tokens included) once, with its label. Left out: whole sentences (they are the rows of ids-sst-train.csv)
and any phrase equal to a dev or test sentence ignoring case and spacing (the tokenizer lowercases; the
model would have trained on a sentence it is scored on). Its format is the CS224N SST one, which
SST's task entry reads (tasks/task.py): tab-separated, an unnamed index column, ``id`` (the first 25
hex digits of the phrase's SHA-1: stable across builds), ``sentence``, ``sentiment``; rows sorted by phrase.

Usage:
    phrases, report = build_phrases(read_trees("trees/train.txt"), held_out_sentences(["trees/dev.txt",
                                                                                        "trees/test.txt"]))
    write_phrases(Path("data/sst-phrases-train.csv"), phrases)
"""

from __future__ import annotations

import csv
import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tasks.storage import atomic_file

TREE_FILES = ("train.txt", "dev.txt", "test.txt")  # the names in the release's trees/ folder
NUM_LABELS = 5
_TOKEN = re.compile(r"\(|\)|[^\s()]+")


@dataclass(frozen=True)
class Node:
    """One labelled node of a tree: its words joined by single spaces, and its label 0-4."""

    text: str
    label: int


def parse_tree(line: str, where: str = "tree") -> list[Node]:
    """Every node of one PTB bracketing, the root first (then in the order their brackets close); a malformed
    line is a ValueError naming ``where``."""
    tokens = _TOKEN.findall(line)
    stack: list[tuple[int, list[str]]] = []  # (label, words so far) of each open bracket
    closed: list[Node] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "(":
            if i + 1 >= len(tokens) or not tokens[i + 1].isdigit() or not 0 <= int(tokens[i + 1]) < NUM_LABELS:
                raise ValueError(f"{where}: a bracket must open with a label 0-{NUM_LABELS - 1}, got "
                                 f"{tokens[i + 1] if i + 1 < len(tokens) else 'the end of the line'!r}")
            stack.append((int(tokens[i + 1]), []))
            i += 2
            continue
        if not stack:
            raise ValueError(f"{where}: {token!r} outside any bracket")
        if token == ")":
            label, words = stack.pop()
            if not words:
                raise ValueError(f"{where}: a node without words")
            closed.append(Node(" ".join(words), label))
            if stack:
                stack[-1][1].extend(words)
            elif i + 1 < len(tokens):
                raise ValueError(f"{where}: text after the tree's last bracket")
        else:
            stack[-1][1].append(token)
        i += 1
    if stack or not closed:
        raise ValueError(f"{where}: {'unbalanced brackets' if stack else 'no tree'}")
    return [closed[-1], *closed[:-1]]


def read_trees(path: str | Path) -> list[list[Node]]:
    """The trees of one of the treebank's files, one a line (blank lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no tree file {path}: the treebank's trees/ folder holds {', '.join(TREE_FILES)}")
    lines = path.read_text(encoding="utf-8").splitlines()
    return [parse_tree(line, f"{path} line {n}") for n, line in enumerate(lines, 1) if line.strip()]


def normalized(text: str) -> str:
    """A sentence as the model sees it for the comparison with dev and test: lowercased (the uncased tokenizer
    lowercases), white space collapsed."""
    return " ".join(text.lower().split())


def held_out_sentences(paths: Iterable[str | Path]) -> set[str]:
    """The dev and test sentences (the roots of their trees), normalized."""
    return {normalized(tree[0].text) for path in paths for tree in read_trees(path)}


@dataclass
class PhraseReport:
    """What a build kept and left out, for the command's summary."""

    trees: int = 0
    nodes: int = 0
    sentences: int = 0          # nodes that are a whole training sentence
    held_out: int = 0           # nodes equal to a dev or test sentence (ignoring case and spacing)
    phrases: int = 0            # distinct phrases written
    relabelled: int = 0         # phrases labelled differently in two trees: the most frequent label kept
    labels: tuple[int, ...] = ()


def build_phrases(train_trees: Sequence[list[Node]], held_out: set[str]) -> tuple[list[Node], PhraseReport]:
    """The distinct labelled phrases of ``train_trees``, sorted, without whole training sentences and without
    phrases equal to a ``held_out`` sentence (normalized); a phrase labelled differently in two places keeps its
    most frequent label (the first seen among equals)."""
    report = PhraseReport(trees=len(train_trees))
    sentences = {tree[0].text for tree in train_trees}
    labels: dict[str, Counter[int]] = {}
    for tree in train_trees:
        for node in tree:
            report.nodes += 1
            if node.text in sentences:
                report.sentences += 1
            elif normalized(node.text) in held_out:
                report.held_out += 1
            else:
                labels.setdefault(node.text, Counter())[node.label] += 1
    phrases = [Node(text, counts.most_common(1)[0][0]) for text, counts in sorted(labels.items())]
    report.phrases = len(phrases)
    report.relabelled = sum(len(counts) > 1 for counts in labels.values())
    report.labels = tuple(sum(p.label == k for p in phrases) for k in range(NUM_LABELS))
    return phrases, report


def phrase_id(text: str) -> str:
    """A phrase's id: the first 25 hex digits of its SHA-1 (the length of the CS224N files' ids)."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:25]


def write_phrases(path: Path, phrases: Sequence[Node]) -> None:
    """The phrase file in the CS224N SST format, written atomically: a link at ``path`` (setup.sh links the data
    files) is replaced by the new file, never written through."""
    with atomic_file(path) as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, delimiter="\t", lineterminator="\n")
            writer.writerow(["", "id", "sentence", "sentiment"])
            writer.writerows([i, phrase_id(p.text), p.text, p.label] for i, p in enumerate(phrases))
