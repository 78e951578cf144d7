"""One command for a leaderboard submission: train K ensemble members, ensemble them, write the submission zip.

Members (each a ``train_multitask.py`` run in ``<out-dir>/<member>``) are
seeds 0..K-1 (``--first-seed S``: S..S+K-1) of the default recipe at three
epochs and without the SST phrases (``--epochs 3 --sst-phrases none``: the
recipe the ensemble was measured with; ``-- --sst-phrases sst-phrases-train.csv`` trains them, refused with a
specialist of a task other than sst, which has no SST head to train them
through), plus the flags given after ``--`` for every member. ``--variants``
sets what the full members add: member k takes variant k mod V (a quoted flag string, "" for
none). The default, one variant ``--max-train-examples para=all``, trains
every member on all of Quora every epoch instead of the recipe's slice
(on a larger Quora file than this copy, cap it, e.g. ``para=48000``, to stay
within the 2-hour budget); ``--variants ""`` gives the plain recipe's
members. ``--specialists sst=16`` (the default) adds 16 members trained on SST
alone (``--tasks sst``, seeds 0..15 or S..S+15, each far cheaper than a full
member), which join the SST ensemble only: the minBERT paper (§5) reports
negative transfer to SST from joint training, and on the CPU they lift the
SST ensemble. The flags after ``--`` go to them too, so a flag for Quora or
STS alone belongs in ``--variants``, and one for the specialists alone in
``--specialist-flags`` (e.g. ``"--sst-phrases sst-phrases-train.csv"``: the
SST phrases for the specialists, none for the full members); ``--specialists``
with nothing after it for none. The time and dev scores of this default, on seeds never trained
before, are in experiments/RESULTS.md. The ensemble (tasks.ensemble,
``--method``; default ``simple``, the mean of all members, which beat the
selective subset on held-out dev halves: experiments/RESULTS.md) goes to
``<out-dir>/ensemble``: leaderboard files in the CS224N starter's format and
``cs224n_default_final_project_submission.zip``.

Honest scores: a subset (selective) or weights (regression) chosen on dev are
scored on dev examples they were not chosen on (selective: two folds, chosen
on one dev half and scored on the other, both ways; regression: fit on one
half, scored on the other). That number is ``holdout_overall``; the
whole-dev number of the same ensemble is printed beside it, labelled optimistic.
``simple`` chooses nothing on dev: its whole-dev score is already honest.
``honest_overall`` in leaderboard.json is whichever of the two is honest.

Long runs get interrupted: a member that finished (its final record written
with the same flags) is reused; a member interrupted mid-run continues from
its ``checkpoints/last`` with ``--resume`` (experiments/sweep.py); so running
the same command again continues where it stopped. A member directory made
with other settings is refused before anything starts, never trained over:
another recipe takes another ``--out-dir``. ``--jobs 2 --threads 1``
trains two members at a time, one core each; when variants differ in cost, the
members with the most training tokens start first, so that no long member runs
alone at the end.

Usage:
    python -m experiments.leaderboard --out-dir runs/leaderboard [--members 4] [--jobs 2 --threads 1]
        [--variants "" "--head-dropout 0.1"] [--specialists sst=16] [--first-seed S] [-- --epochs 4]
    python -m experiments.leaderboard --out-dir runs/lb-phrases --specialist-flags "--sst-phrases sst-phrases-train.csv"

A recipe chosen by looking at dev scores is tested on seeds it was not
chosen on: ``--first-seed 8 --out-dir runs/other`` trains seeds 8.. (an S at
or beyond the earlier S + the larger of K and N shares no run with it).

Writes ``<out-dir>/leaderboard.json`` (members, their dev scores and wall
times, the ensemble's honest and optimistic scores). What other compositions
of finished members would score: experiments/ensemble_mixes.py.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from experiments.sweep import add_sweep_options, changed_settings, open_sweep, say
from experiments.token_budget import recipe_tokens
from minbert.pretrained import load_pretrained
from tasks import arguments
from tasks.cli import Parser, describe
from tasks.evaluation.ensembling import EnsembleConfig, check_ensemble, make_ensemble, read_runs
from tasks.evaluation.ensembling import METHODS
from tasks.evaluation.metrics import overall_score, task_metric
from tasks.options import add_options, option
from tasks.storage import write_text
from tasks.task import MULTITASK, Tasks

DEFAULT_VARIANTS = ("--max-train-examples para=all",)  # every full member on all of Quora every epoch
DEFAULT_SPECIALISTS = ("sst=16",)  # chosen by measurement within the 2-hour budget: experiments/RESULTS.md
# The members' recipe as measured (experiments/RESULTS.md): the default recipe of three epochs (two since the
# time-versus-score front) before it took the SST phrases, which
# an ensemble mostly absorbs in full members and did not lift in the specialists (RESULTS.md, "The phrases in an
# ensemble" and "The leaderboard command's specialists with phrases"); ``-- --sst-phrases sst-phrases-train.csv``
# trains its members with them, ``--specialist-flags`` its specialists alone.
MEASURED_RECIPE = ("--epochs", "3", "--sst-phrases", "none")
COMMAND_FLAGS = {"--seed", "--out-dir", "--data-dir"}  # what the command sets for every member


def member_flags(seed: int, extra: Sequence[str], variant: str = "") -> list[str]:
    """The flags of member ``seed``: the measured recipe (MEASURED_RECIPE) with that seed, then ``extra``, then
    ``variant``'s flags."""
    return [*MEASURED_RECIPE, "--seed", str(seed), *extra, *shlex.split(variant)]


def members_of(k: int, variants: Sequence[str], specialists: dict[str, int] | None = None, first_seed: int = 0,
               specialist_flags: str = "") -> dict[str, tuple[int, str]]:
    """{member name: (seed, variant)}: seeds first_seed..first_seed+k-1, variants in turn from the first; names
    say both ("seed3", "v1-seed3"); then ``specialists[task]`` members trained on that task alone, seeds from
    first_seed too ("sst-only-seed1", variant "--tasks sst" and ``specialist_flags``)."""
    seeds = range(first_seed, first_seed + k)
    if not variants or list(variants) == [""]:
        plan = {f"seed{seed}": (seed, "") for seed in seeds}
    else:
        plan = {f"v{i % len(variants)}-seed{seed}": (seed, variants[i % len(variants)]) for i, seed in enumerate(seeds)}
    for task, n in (specialists or {}).items():
        plan.update({f"{task}-only-seed{seed}": (seed, f"--tasks {task} {specialist_flags}".strip())
                     for seed in range(first_seed, first_seed + n)})
    return plan


def specialist_counts(values: Sequence[str]) -> dict[str, int]:
    """``["sst=4"]`` -> {"sst": 4}; raises ValueError naming what is wrong."""
    counts: dict[str, int] = {}
    for value in values:
        task, eq, n = value.partition("=")
        if not eq or task not in MULTITASK or not n.isdigit():
            raise ValueError(f"{value!r}: give TASK=N with TASK one of {', '.join(MULTITASK)} and N a count")
        counts[task] = int(n)
    return {task: n for task, n in counts.items() if n}


def first_seeds(plan: dict[str, tuple[int, str]]) -> dict[str, int]:
    """{variant: the seed of its first member}, in plan order."""
    firsts: dict[str, int] = {}
    for seed, variant in plan.values():
        firsts.setdefault(variant, seed)
    return firsts


def variant_tokens(plan: dict[str, tuple[int, str]], extra: Sequence[str]) -> dict[str, int]:
    """{variant: training tokens of its first member} (experiments/token_budget.py, counted with the embedded
    model's tokenizer: they only rank the members), when the plan's variants differ: the sweep starts the
    costliest members first. {} for one variant, or when the data cannot be read: the members are then
    trained in plan order and say what is wrong themselves."""
    firsts = first_seeds(plan)
    if len(firsts) < 2:
        return {}
    try:
        _, tokenizer = load_pretrained(None, add_pooling_layer=False)
        return {variant: sum(recipe_tokens(member_flags(seed, extra, variant), tokenizer).values())
                for variant, seed in firsts.items()}
    except (ValueError, OSError) as e:  # a missing or unreadable data file (UnicodeDecodeError is a ValueError)
        say(f"members in plan order: their training tokens could not be counted ({describe(e)})")
        return {}


@dataclass
class LeaderboardOptions:
    """The leaderboard command's own flags (beside the sweep's, experiments.sweep.SweepOptions)."""

    members: int = option(4, "number of members (seeds S..S+K-1)", metavar="K")
    first_seed: int = option(0, "seed of the first member and of each task's first specialist; for a second ensemble "
                                "on unseen seeds give S past the first one's seeds, and its own --out-dir", metavar="S")
    method: str = option("simple", "the ensemble (python -m tasks.ensemble)", choices=METHODS)
    variants: list[str] = option(help='member k adds variant k mod V to its flags: quoted flag strings, "" for none '
                                      "(the plain three-epoch recipe's members)",
                                 factory=lambda: list(DEFAULT_VARIANTS),
                                 nargs="+", metavar="FLAGS")
    specialists: list[str] = option(help="N more members trained on TASK alone (--tasks TASK), in that task's "
                                         "ensemble only; --specialists with nothing after it for none",
                                    factory=lambda: list(DEFAULT_SPECIALISTS), nargs="*", metavar="TASK=N")
    specialist_flags: str = option("", 'a quoted flag string the specialists alone add, as --variants is for the full '
                                       'members (one flag alone: --specialist-flags="--no-bf16")', metavar="FLAGS")


def build_parser() -> Parser:
    ap = Parser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n")[0],
                epilog="Flags after -- go to every member's train_multitask.py.")
    add_options(ap, LeaderboardOptions)
    add_sweep_options(ap, out_dir="runs/leaderboard", skip=("seeds", "force", "dry_run"),
                      help_suffix={"out_dir": ": the members, the ensemble and leaderboard.json",
                                   "data_dir": " (dev labels for the ensemble)"})
    return ap


def main(argv: list[str] | None = None) -> dict:
    ap = build_parser()
    args, extra = ap.parse_known_args(argv)
    if extra and extra[0] == "--":
        extra = extra[1:]
    elif extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)} (member flags go after --)")
    given = _flag_names(extra)
    for flag_option, flags in [*(("--variants", variant) for variant in args.variants),
                          ("--specialist-flags", args.specialist_flags)]:
        try:
            names = _flag_names(shlex.split(flags))
        except ValueError as e:
            ap.error(f"{flag_option} {flags!r}: {e}")
        if given & names:  # the variant's flags come last, so they would silently replace the member flags after --
            ap.error(f"{', '.join(sorted(given & names))} is given after -- and by {flag_option} {flags!r}; "
                     "set it in one place")
        own = names & (COMMAND_FLAGS | ({"--tasks"} if flag_option == "--specialist-flags" else set()))
        if own:
            ap.error(f"{flag_option} {flags!r}: {', '.join(sorted(own))} is set by the command "
                     "(--specialists TASK=N, --first-seed, --out-dir, --data-dir)")
    try:
        specialists = specialist_counts(args.specialists)
    except ValueError as e:
        ap.error(f"--specialists {e}")
    if args.specialist_flags and not specialists:
        ap.error(f"--specialist-flags {args.specialist_flags!r}: there are no specialists (--specialists TASK=N)")
    if args.members < 2:
        ap.error(f"--members {args.members}: an ensemble needs at least 2")
    if "--data-dir" not in extra:
        extra = [*extra, "--data-dir", args.data_dir]
    if args.first_seed < 0:
        ap.error(f"--first-seed {args.first_seed}: a seed is at least 0")
    plan = members_of(args.members, args.variants, specialists, args.first_seed, args.specialist_flags)
    for variant, seed in first_seeds(plan).items():  # a typo fails here, not in a member after the directories
        flags = member_flags(seed, extra, variant)
        hint = (" (a specialist takes the flags after --, then --specialist-flags: what only the full members take "
                "goes in --variants)") if variant.startswith("--tasks ") else ""
        try:
            arguments.config_for(flags)
        except SystemExit:  # train_multitask.py's parser has said why
            ap.error(f"member flags {shlex.join(flags)} (see above){hint}")
        except (ValueError, OSError) as e:  # OSError: a --config or --pretrained that is not there
            ap.error(f"member flags {shlex.join(flags)}: {describe(e)}{hint}")
    for name, (seed, variant) in plan.items():  # the same command continues its members; another never replaces them
        member_dir = Path(args.out_dir) / name
        changed = changed_settings(member_dir, [*member_flags(seed, extra, variant), "--out-dir", str(member_dir)])
        if changed:
            ap.error(f"{member_dir} is a member made with other settings ({', '.join(changed)}); "
                     "give this recipe another --out-dir")
    sweep = open_sweep(ap, args)
    t0 = time.perf_counter()
    tokens = variant_tokens(plan, extra) if args.jobs > 1 else {}
    trained = sweep.map(lambda item: sweep.train(item[0], member_flags(item[1][0], extra, item[1][1])),
                        list(plan.items()), cost=(lambda item: tokens[item[1][1]]) if tokens else None)
    members = {name: {"dev": record["dev"], "wall_s": wall, "variant": plan[name][1]}
               for name, (record, wall) in zip(plan, trained)}
    ens_dir = Path(args.out_dir) / "ensemble"
    config = EnsembleConfig(runs=[str(sweep.root / m) for m in members], method=args.method,
                            data_dir=args.data_dir, out_dir=str(ens_dir))
    check_ensemble(config)
    runs = read_runs(config.runs)
    summary, _ = make_ensemble(config, runs)
    whole = _overall(summary, runs[1])
    result = {"members": members, "method": args.method, "extra_flags": extra, "first_seed": args.first_seed,
              "honest_overall": whole if args.method == "simple" else summary.get("holdout_overall"),
              "holdout_overall": summary.get("holdout_overall"),
              "whole_dev_overall": whole, "submission": summary["submission"],
              **({"incomplete": summary["incomplete"]} if "incomplete" in summary else {}),
              "members_wall_s": round(sum(m["wall_s"] for m in members.values()), 1),
              "wall_s": round(time.perf_counter() - t0, 1), "jobs": args.jobs, "threads": args.threads}
    write_text(Path(args.out_dir) / "leaderboard.json", json.dumps(result, indent=2) + "\n")
    if args.method == "simple":
        scores = f"{whole:.4f} (nothing chosen on dev: honest)"
    else:
        scores = (f"{result['holdout_overall']:.4f} held out, {whole:.4f} on the dev set it was chosen on "
                  "(optimistic)")
    kinds = ", ".join(f"{n} {task}-only" for task, n in specialists.items())
    print(f"ensemble of {len(members) - sum(specialists.values())} members" + (f" and {kinds}" if kinds else "")
          + f" ({args.method}): dev overall {scores}; submission {result['submission']}"
          + (" (SUBMISSION INCOMPLETE: leaderboard.json says what it lacks)" if "incomplete" in result else ""))
    return result


def _flag_names(argv: Sequence[str]) -> set[str]:
    """The ``--flag`` names of an argv (``--flag=value`` counts as ``--flag``)."""
    return {arg.partition("=")[0] for arg in argv if arg.startswith("--")}


def _overall(summary: dict, entries: Tasks) -> float:
    """The ensemble's overall score on the whole dev set (for selective / regression: optimistic), of its runs'
    tasks (``entries``: a member's --task-file task too)."""
    return overall_score({task_metric(entries[t]): r["ensemble_score"] for t, r in summary["tasks"].items()},
                         tasks=entries)


if __name__ == "__main__":
    main()
