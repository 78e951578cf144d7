"""Training tokens of a recipe: how much text its training steps read, against a reference recipe.

Compute on a CPU grows with the tokens a run pushes through the encoder, so
recipes are compared by their training tokens: the real (unpadded) tokens of
every example in every training step of every epoch (SWA epochs too), read
from the run's own epoch plans (tasks.data.schedule), not estimated. A Siamese
pair counts both sentences, a triplet all three. Evaluation is not counted.

Usage:
    python -m experiments.token_budget --reference "--max-train-examples para=16000" --candidate ""
    python -m experiments.token_budget --candidate "--epochs 4" --candidate "--max-train-examples para=23000"

Each recipe is the default plus the quoted flags (as given to train_multitask.py).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from minbert.pretrained import load_pretrained
from tasks import arguments
from tasks.cli import Parser, describe, user_errors
from tasks.train_config import TrainConfig
from tasks.options import add_options, option
from tasks.selection import load_run_data
from tasks.training.optim import build_schedule


def example_tokens(dataset) -> list[int]:
    """Real tokens of each example of a tasks.data.datasets dataset (every sequence it feeds the encoder)."""
    sides = [name for name in ("input_ids", "input_ids_1", "input_ids_2", "input_ids_3") if hasattr(dataset, name)]
    return [sum(len(getattr(dataset, side)[i]) for side in sides) for i in range(len(dataset))]


def training_tokens(cfg: TrainConfig, train_sets: dict) -> dict[str, int]:
    """Tokens per stream over all of ``cfg``'s training epochs (and SWA epochs), from its epoch plans."""
    schedule = build_schedule(cfg, cfg.resolve(), train_sets)  # the plans the Trainer itself follows
    per_example = {s: example_tokens(d) for s, d in train_sets.items()}
    totals = dict.fromkeys(train_sets, 0)
    for epoch in range(cfg.epochs + cfg.swa.epochs):
        for stream, indices in schedule.epoch_plan(epoch):
            n = len(per_example[stream])
            totals[stream] += sum(per_example[stream][i % n] for i in indices)  # i + n: the same pair, swapped
    return totals


def recipe_tokens(argv: Sequence[str], tokenizer) -> dict[str, int]:
    """Training tokens per stream of ``train_multitask.py argv`` (its data read and tokenized here; nothing trains).

    Raises SystemExit, ValueError or OSError for flags train_multitask.py would refuse (OSError: a --config or
    --pretrained that is not there) and OSError or ValueError for data it cannot read."""
    cfg = arguments.config_for(list(argv))
    return training_tokens(cfg, load_run_data(cfg, tokenizer).train_sets)


@dataclass
class BudgetOptions:
    """The command's flags: recipes, each a quoted string of train_multitask.py flags."""

    reference: str = option("", "flags of the reference recipe (default: the default recipe)", metavar="FLAGS")
    candidate: list[str] = option(help="flags of a recipe to compare (repeatable)", factory=list, repeat=True,
                                  metavar="FLAGS")


def build_parser() -> Parser:
    ap = Parser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n\n")[0])
    add_options(ap, BudgetOptions)
    return ap


def main(argv: Sequence[str] | None = None) -> list[dict]:
    ap = build_parser()
    args = ap.parse_args(argv)
    rows = []
    recipes = []  # (flags as given, as an argv)
    for label, flags in [("reference", args.reference)] + [("candidate", f) for f in args.candidate]:
        try:  # every recipe's flags before any work: train_multitask.py's parser names what it refuses
            recipes.append((flags, shlex.split(flags)))
            arguments.config_for(recipes[-1][1])
        except SystemExit:  # train_multitask.py's parser has said why
            ap.error(f"{label} {flags!r} (see above)")
        except (ValueError, OSError) as e:  # OSError: a --config or --pretrained that is not there
            ap.error(f"{label} {flags!r}: {describe(e)}")
    with user_errors(f"python -m {__spec__.name}"):  # a data file that is missing or unreadable: one line, exit status 1
        _, tokenizer = load_pretrained(None, add_pooling_layer=False)
        for flags, recipe in recipes:
            tokens = recipe_tokens(recipe, tokenizer)
            rows.append({"recipe": flags or "(the default)", "tokens": tokens, "total": sum(tokens.values())})
    ref = rows[0]["total"]
    for row in rows:
        per = ", ".join(f"{s} {t / 1e6:.2f}M" for s, t in row["tokens"].items())
        print(f"{row['total'] / 1e6:7.3f}M tokens  {row['total'] / ref:5.3f}x  ({per})  {row['recipe']}")
    return rows


if __name__ == "__main__":
    main()
