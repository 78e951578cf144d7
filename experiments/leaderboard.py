"""One command for a leaderboard submission: train K ensemble members, ensemble them, write the submission zip.

Members (each a ``train_multitask.py`` run in ``<out-dir>/<member>``) are the
default recipe with seeds 0..K-1, plus the flags given after ``--`` for every
member. The ensemble (tasks/ensemble.py, ``--method``; default ``selective``)
goes to ``<out-dir>/ensemble``: leaderboard files in the CS224N starter's
format and ``cs224n_default_final_project_submission.zip``.

Honest scores: a subset (selective) or weights (regression) chosen on dev are
scored on dev examples they were not chosen on (selective: two folds, chosen
on one dev half and scored on the other, both ways; regression: fit on one
half, scored on the other). That number is ``holdout_overall``; the
whole-dev number of the same ensemble is printed beside it, labelled optimistic.

Long runs get interrupted: a member that finished (its final record written
with the same flags) is reused; a member interrupted mid-run continues from
its ``checkpoints/last`` with ``--resume``; so running the same command again
continues where it stopped.

Usage:
    python experiments/leaderboard.py --out-dir runs/leaderboard [--members 4] [--threads N] [-- --epochs 4]

Writes ``<out-dir>/leaderboard.json`` (members, their dev scores and wall
times, the ensemble's honest and optimistic scores).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from experiments.sweep import Sweep, final_record
from tasks.ensemble import METHODS
from tasks.ensemble import main as ensemble_main
from tasks.evaluate import TASK_METRIC, overall_score


def member_flags(seed: int, extra: Sequence[str]) -> list[str]:
    """The flags of member ``seed``: the default recipe with that seed, then ``extra``."""
    return ["--seed", str(seed), *extra]


def train_member(sweep: Sweep, name: str, flags: Sequence[str]) -> tuple[dict, float]:
    """(final record, wall seconds) of one member: reused when finished with ``flags``, resumed when cut short."""
    run_dir = sweep.root / name
    marker = run_dir / "member.json"
    if marker.is_file() and final_record(run_dir) is not None:
        done = json.loads(marker.read_text())
        if done["flags"] == list(flags):
            print(f"[{name}] reusing the finished member ({done['wall_s']:.0f} s)", flush=True)
            return final_record(run_dir), done["wall_s"]
    resumable = (run_dir / "checkpoints" / "last").is_dir() and marker.is_file() and \
        json.loads(marker.read_text())["flags"] == list(flags)
    if resumable:  # same member, interrupted: continue from its last checkpoint
        argv = ["--resume", "--out-dir", str(run_dir)]
    else:
        argv = [*flags, "--out-dir", str(run_dir), "--overwrite"]
        run_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"flags": list(flags), "wall_s": None}, indent=2) + "\n")
    done = sweep.command(name, argv)
    record = final_record(run_dir)
    if record is None:
        raise SystemExit(f"[{name}] {run_dir}/metrics.jsonl has no final record")
    # wall_s of a resumed member is the resumed process's alone (the run's training time is in its records)
    marker.write_text(json.dumps({"flags": list(flags), "wall_s": done["wall_s"]}, indent=2) + "\n")
    return record, done["wall_s"]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                 epilog="Flags after -- go to every member's train_multitask.py.")
    ap.add_argument("--out-dir", default="runs/leaderboard", help="members, the ensemble and leaderboard.json")
    ap.add_argument("--members", type=int, default=4, help="number of members (seeds 0..K-1)")
    ap.add_argument("--method", choices=METHODS, default="selective", help="the ensemble (tasks/ensemble.py)")
    ap.add_argument("--data-dir", default="data", help="the CS224N CSV files (dev labels for the ensemble)")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of every member (default: torch's)")
    args, extra = ap.parse_known_args(argv)
    if extra and extra[0] == "--":
        extra = extra[1:]
    elif extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)} (member flags go after --)")
    if args.members < 2:
        ap.error(f"--members {args.members}: an ensemble needs at least 2")
    if "--data-dir" not in extra:
        extra = [*extra, "--data-dir", args.data_dir]
    sweep = Sweep(args.out_dir, threads=args.threads)
    members = {}
    for seed in range(args.members):
        name = f"seed{seed}"
        record, wall = train_member(sweep, name, member_flags(seed, extra))
        members[name] = {"dev": record["dev"], "wall_s": wall}
    ens_dir = Path(args.out_dir) / "ensemble"
    summary = ensemble_main([*(str(sweep.root / m) for m in members), "--method", args.method,
                             "--data-dir", args.data_dir, "--out-dir", str(ens_dir)])
    result = {"members": members, "method": args.method, "extra_flags": extra,
              "holdout_overall": summary.get("holdout_overall"),
              "optimistic_overall": _overall(summary), "submission": summary["submission"],
              "wall_s": round(sum(m["wall_s"] for m in members.values()), 1)}
    (Path(args.out_dir) / "leaderboard.json").write_text(json.dumps(result, indent=2) + "\n")
    honest = result["holdout_overall"]
    print(f"ensemble of {len(members)} ({args.method}): dev overall "
          + (f"{honest:.4f} held out, " if honest is not None else "")
          + f"{result['optimistic_overall']:.4f} on the dev set it was chosen on"
          + (" (optimistic)" if args.method != "simple" else "") + f"; submission {result['submission']}")
    return result


def _overall(summary: dict) -> float:
    """The ensemble's overall dev score on the whole dev set (for selective / regression: optimistic)."""
    return overall_score({TASK_METRIC[t]: r["ensemble_score"] for t, r in summary["tasks"].items()})


if __name__ == "__main__":
    main()
