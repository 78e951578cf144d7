"""Tests of experiments/sst_levers.py: every row is an SST specialist the train command accepts, the table pairs
each row with the base row by seed."""

from __future__ import annotations

import json

from experiments import sst_levers
from experiments.sst_levers import FLAGS, NAMES, collect, render
from experiments.sweep import Sweep
from tasks import arguments


def test_every_row_is_an_sst_specialist_scored_by_its_head_and_differs_from_base():
    configs = {name: arguments.config_for([*FLAGS[name], "--out-dir", "unused"]) for name in NAMES}
    for name, cfg in configs.items():
        assert cfg.tasks == ("sst",) and cfg.prior_weights.get("sst") == 0, name
        assert name == "base" or cfg.to_dict() != configs["base"].to_dict(), name
    assert "phrases" not in configs["base"].resolve().extra
    assert configs["phrases"].resolve().extra["phrases"].file == "sst-phrases-train.csv"
    assert configs["phrases"].resolve().caps["phrases"] == 8544
    assert configs["w0.25"].loss_weights["phrases"] == 0.25 and configs["n17k"].resolve().caps["phrases"] == 17088
    assert configs["min3"].resolve().extra["phrases"].min_words == 3
    assert configs["first"].resolve().extra["phrases"].order == "first"
    assert "phrases" not in configs["llrd"].resolve().extra and configs["llrd"].layer_lr_decay == 0.9


def test_the_table_pairs_each_row_with_base_by_seed(tmp_path):
    """Δ is the mean of the per-seed differences against base (± their SE), not the difference of the means."""
    sweep = Sweep(tmp_path)
    accs = {"base": [0.48, 0.47, 0.49], "phrases": [0.50, 0.48, 0.52]}
    for row, values in accs.items():
        for seed, acc in enumerate(values):
            run = tmp_path / row / f"seed{seed}"
            run.mkdir(parents=True)
            (run / "metrics.jsonl").write_text(json.dumps({"final": True, "dev": {"sst_acc": acc}}) + "\n")
            (run / "sweep.json").write_text(json.dumps({"wall_s": 100 + seed}))
    results = collect(sweep, [0, 1, 2])
    assert results["phrases"][2] == {"sst_acc": 0.52, "wall_s": 102}
    lines = {line.split("|")[1].strip().split(":")[0]: line for line in render(results).splitlines()[2:]}
    assert set(lines) == {"`base`", "`phrases`"}
    assert "0.480 ± 0.010" in lines["`base`"] and "101" in lines["`base`"]
    assert "+0.020 [-0.005, +0.045]" in lines["`phrases`"]  # differences 0.02, 0.01, 0.03: ± 4.303 x 0.0058
    assert sst_levers.PARENT == "base"


def test_a_full_arm_is_the_default_plus_the_rows_own_flags_and_n17k_b64_is_the_default():
    """--full ROW runs the whole recipe: the specialist's --tasks sst --sst-prior 0 left out, the row's flags kept;
    base's arm is the default without phrases, n17k-b64's the default itself (it was adopted)."""
    default = arguments.config_for(["--out-dir", "unused"])
    base = arguments.config_for([*sst_levers.full_flags("base"), "--out-dir", "unused"])
    n17k = arguments.config_for([*sst_levers.full_flags("n17k-b64"), "--out-dir", "unused"])
    assert n17k.acting() == default.acting()  # its --sst-phrases-per-epoch 17088 --sst-phrases-batch-size 64: SST's
    n17k = arguments.config_for([*sst_levers.full_flags("n17k"), "--out-dir", "unused"])
    assert n17k.resolve().batch_sizes["phrases"] == 32
    assert "phrases" not in base.resolve().extra and base.resolve().streams == ("sst", "para", "sts")
    assert {k: v for k, v in base.to_dict().items() if k != "stream_files"} == \
        {k: v for k, v in default.to_dict().items() if k != "stream_files"}


def test_full_runs_both_arms_seed_by_seed_at_the_epochs_given(tmp_path, capsys):
    sst_levers.main(["--out-dir", str(tmp_path), "--full", "w0.5", "--epochs", "1", "--seeds", "0", "1",
                      "--dry-run"])
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[full-e1/")]
    assert [c.split("]")[0][1:] for c in commands] == ["full-e1/base/seed0", "full-e1/w0.5/seed0",
                                                       "full-e1/base/seed1", "full-e1/w0.5/seed1"]
    assert all(" --epochs 1 " in c and "--epochs 3" not in c and "--preset" not in c for c in commands)
    assert "--sst-phrases-weight 0.5" in commands[1] and "--sst-phrases none --seed 0" in commands[0]
    assert "--tasks" not in " ".join(commands)


def test_the_full_table_pairs_every_metric_and_the_seconds_by_seed(tmp_path):
    sweep = Sweep(tmp_path)
    overall = {"base": [0.74, 0.75], "n17k": [0.75, 0.77]}
    for arm, values in overall.items():
        for seed, value in enumerate(values):
            run = tmp_path / "full" / arm / f"seed{seed}"
            run.mkdir(parents=True)
            dev = {"sst_acc": value - 0.25, "para_acc": 0.84, "sts_r": 0.87, "overall": value}
            (run / "metrics.jsonl").write_text(json.dumps({"final": True, "dev": dev}) + "\n")
            (run / "sweep.json").write_text(json.dumps({"wall_s": 100 + 20 * (arm == "n17k") + seed}))
    results = sst_levers.collect_full(sweep, "n17k", [0, 1])
    table = sst_levers.render_full(results, "n17k").splitlines()
    delta = next(line for line in table if line.startswith("| Δ"))
    assert delta.count("+0.015 [-0.049, +0.079]") == 2  # SST and overall: differences 0.01, 0.02 (t(1) = 12.7)
    assert "+0.000 [+0.000, +0.000] |" in delta and delta.rstrip(" |").endswith("+20 [+20, +20]*")
    assert "`base`: the recipe + --sst-phrases none" in table[2]
    assert ("the recipe + --sst-phrases sst-phrases-train.csv --sst-phrases-per-epoch 17088"
            " --sst-phrases-batch-size 32") in table[3]
