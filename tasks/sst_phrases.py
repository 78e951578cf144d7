"""The sst-phrases command: build the SST phrase file that the default run trains on, from the treebank's trees.

Usage:
    # trainDevTestTrees_PTB.zip from https://nlp.stanford.edu/sentiment/, unzipped: trees/{train,dev,test}.txt
    python -m tasks.sst_phrases trainDevTestTrees_PTB/trees            # writes data/sst-phrases-train.csv

A thin command over tasks.data.sst_trees, which says what is kept and left out: the training trees' labelled
phrases, without whole sentences and without any phrase equal to a dev or test sentence (ignoring case and
spacing), so no dev or test tree contributes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tasks.cli import Parser, user_errors
from tasks.data.sst_trees import TREE_FILES, PhraseReport, build_phrases, held_out_sentences, read_trees, write_phrases
from tasks.logs import log_to
from tasks.options import add_options, option

logger = logging.getLogger(__name__)
PROG = "python -m tasks.sst_phrases"


@dataclass
class SstPhrasesArgs:
    """The sst-phrases command's flags."""

    trees: str = option(help=f"the treebank's trees/ folder (trainDevTestTrees_PTB.zip from "
                             f"https://nlp.stanford.edu/sentiment/): {', '.join(TREE_FILES)}", metavar="DIR",
                        positional=True)
    out: str = option("data/sst-phrases-train.csv", "the phrase file to write (--sst-phrases reads a name in "
                                                     "--data-dir)", metavar="FILE")
    overwrite: bool = option(False, "replace an existing file (a link there is replaced, its target left alone)")


def build_parser() -> Parser:
    p = Parser(prog=PROG, description="Build the SST phrase file of --sst-phrases from the Stanford Sentiment "
                                      "Treebank's trees: every labelled phrase of the training trees, without "
                                      "whole sentences or any phrase equal to a dev or test sentence.")
    add_options(p, SstPhrasesArgs)
    return p


def main(argv: Sequence[str] | None = None) -> PhraseReport:
    """The command line; a bad argument is exit status 2, a malformed tree file one line and exit status 1."""
    log_to()  # the console only: the command writes one file
    parser = build_parser()
    args = parser.parse_args(argv)
    trees, out = Path(args.trees), Path(args.out)
    missing = [name for name in TREE_FILES if not (trees / name).is_file()]
    if missing:
        parser.error(f"{trees}: no {', '.join(missing)} there; pass the treebank's trees/ folder (unzipped "
                     f"trainDevTestTrees_PTB.zip)")
    if (out.exists() or out.is_symlink()) and not args.overwrite:
        parser.error(f"--out {out} exists; pass --overwrite to replace it")
    with user_errors(parser.prog):
        held_out = held_out_sentences([trees / "dev.txt", trees / "test.txt"])
        phrases, report = build_phrases(read_trees(trees / "train.txt"), held_out)
        write_phrases(out, phrases)
    logger.info("wrote %s: %d phrases of %d training trees (labels 0-4: %s); left out %d whole sentences and %d "
                "equal to a dev or test sentence; %d labelled differently in two trees kept their most frequent "
                "label", out, report.phrases, report.trees, " / ".join(map(str, report.labels)), report.sentences,
                report.held_out, report.relabelled)
    return report


if __name__ == "__main__":
    main()
