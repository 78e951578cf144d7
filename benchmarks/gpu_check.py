"""The GPU check: everything a lent GPU should show, in one call of at most 8 minutes, with a report written as it goes.

A GPU machine is lent only by chance, for 15 minutes of device time, with no
package registry and at most 64 MiB of files travelling with a call (benchmarks/README.md,
"The GPU check", gives the call). So the check is prepared and tested here, and on the day a
GPU is lent it runs in one call whose first try must not be wasted. Its steps, in order, each
in a child process with a share of ``--budget`` (480 s by default; the seconds below are the
shares of 480):

  machine    versions (driver, CUDA, cuDNN, NCCL, Triton, Python, torch, transformers), a C compiler and
             Python.h present or not, the commit; the measured bf16, TF32 and fp32 matmul peaks and the
             device-to-device copy bandwidth                                                    (25 s)
  tests      the gpu-marked tests alone (their modules found by reading, none other imported): a few
             training steps of every objective with CUDA's sync debug mode at "error", fp32 and bf16  (60 s)
  encoder    our encoder against transformers.BertModel on the same weights, bf16 and fp32, forward and
             forward + backward, at MiniLM's shape and at bert-base's (random weights)              (40 s)
  default    the default recipe end to end (bf16 on CUDA): wall time, train seq/s, peak GPU memory, dev
             scores beside the CPU runs' mean over seeds (experiments/RESULTS.md); more seeds while its
             budget lasts                                                                       (120 s)
  fp16       a short run forced to fp16 with loss scaling (--fp16: what a T4 or V100 chooses) beside the same
             run in bf16: wall, train seq/s, the steps the scaler skipped, the final loss scale, dev scores  (45 s)
  accumulation  the short run at --batch-size 16 --gradient-accumulation-steps 2 beside --batch-size 32 (no
             dropout, so the two take the same steps up to rounding): dev scores, peak GPU memory    (35 s)
  resume     a --deterministic run killed (SIGKILL) at its first mid-epoch checkpoint and resumed, against
             the same run uninterrupted (which writes no mid-epoch checkpoint): predictions and best
             weights compared byte for byte                                                      (55 s)
  step       the multitask training step's throughput and MFU against the bf16 peak, eager, at MiniLM's
             and bert-base's shapes                                                              (30 s)
  torchrun   one process under torchrun: it joins an NCCL process group (world size 1) and all-reduces
             once (benchmarks/process_group.py), then a short training run                        (35 s)
  compile    torch.compile, last: a probe for the C compiler and Python.h that Triton's launcher needs
             (skipped with the reason when absent); a tiny encoder's cold compile, measured; MiniLM's
             forward + backward at one padded length, eager against compiled, only when the time left
             fits COMPILE_SCALE times that measurement                                          (50 s)

A step's share is taken from the time left when it starts, in proportion to the shares of the
steps still to run, so time a step leaves unused passes to the steps after it. report.json and
report.md in ``--report-dir`` are rewritten whole at every change: a step's section appears when
it starts and receives its progress lines as it goes (the last line of a training run every
few seconds), so a step or a whole call cut short still says how far it got. Each training
run's train.log is copied into ``<report-dir>/logs``, and each run's peak memory is read in its
own process (benchmarks/peak_memory.py). ``--only STEP ...`` reruns some steps.

The machine lacks the embedded MiniLM, the data and .git: ``python -m benchmarks.gpu_pack``
writes them into ``.gpu/`` here (MiniLM in float16, the data gzip-compressed, the commit), which
travels with the call; gzip-compressed data files are unpacked into ``--work-dir`` first. Every
training run is given ``--pretrained``, ``--sts-prior-model`` and ``--sst-prior-model``: the
packed encoder.

``--device cpu --tiny`` is the dry run: every step at tiny sizes on the CPU (the gpu-marked
tests are then skipped, compile is probed only), writing the same report;
tests/benchmarks/test_gpu_check.py runs it on a tiny pack, so the script cannot rot between the
days a GPU is lent. benchmarks/gpu_rehearsal.sh runs the device command itself with ``--device
cpu`` in a copy of the device's package set.

Usage (benchmarks/README.md):
    python -m benchmarks.gpu_pack                                        # here, on the CPU machine: .gpu/
    PYTHONPATH=. python3 -m benchmarks.gpu_check --report-dir "$OUT"     # on the GPU machine
    python -m benchmarks.gpu_check --report-dir /tmp/r --device cpu --tiny --pack /tmp/tiny-pack   # the dry run
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.options import add_options, option

if TYPE_CHECKING:
    from tasks.cli import Parser

ROOT = Path(__file__).resolve().parent.parent
STEPS = {"machine": 25, "tests": 50, "encoder": 35, "default": 120, "fp16": 45, "accumulation": 35, "resume": 55,
         "step": 30, "torchrun": 35, "compile": 50}  # each step's share of 480 s
SHORT_RUN = ["--limit", "3000", "--epochs", "1"]  # the fp16 and accumulation steps' runs: seconds on a GPU
RESULTS = ROOT / "experiments" / "RESULTS.md"
DEFAULT_SEEDS = 3  # the default recipe's runs at most: seed 0, and 1 and 2 if time allows
MIN_STEP_S = 5  # a step offered less is recorded as skipped (python and torch alone take seconds to start)
CHILD_MARGIN_S = 5  # a step's child stops its own work this long before the parent would stop the child
WATCH_EVERY_S = 10  # how often a running training run's last log line reaches the report
# Training flags the dry run adds to fit the tiny model (64 positions) and run in seconds.
TINY_TRAIN = ["--limit", "64", "--epochs", "1", "--max-length", "32", "--batch-size", "8", "--eval-batch-size", "16",
              "--log-every", "2"]
GPU_MARK = "pytest.mark.gpu"  # how a test module marks the tests the tests step runs
# The compile step starts only with this much left: a tiny encoder's cold compile (Inductor's imports, its first
# kernels and Triton's launcher built with the C compiler) must fit before anything is learnt.
COMPILE_START_S = 30
# MiniLM's cold compile is started only when the time left is this many times the tiny encoder's measured one:
# MiniLM has three times its layers, and a compile grows at most in proportion (identical layers share kernels).
COMPILE_SCALE = 3


# ---- the report --------------------------------------------------------------------------------------------------


class Report:
    """report.json ({"header": str, "steps": {name: entry}}) and report.md rendered from it, both rewritten whole
    (through a temporary file and a rename) at every change, so that a call cut short at any moment brings back
    a readable report. An entry holds a step's result, its section's text and its progress lines."""

    def __init__(self, directory: Path) -> None:
        self.dir, self.logs = directory, directory / "logs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.md, self.json = directory / "report.md", directory / "report.json"

    def read(self) -> dict:
        return json.loads(self.json.read_text()) if self.json.is_file() else {"header": "", "steps": {}}

    def write(self, data: dict) -> None:
        from tasks.storage import write_text

        write_text(self.json, json.dumps(data, indent=2, default=str) + "\n")
        write_text(self.md, render(data))

    def header(self, text: str) -> None:
        data = self.read()
        data["header"] = text
        self.write(data)

    def start(self, step: str, budget: float) -> None:
        data = self.read()
        data["steps"][step] = {"status": "running", "seconds": 0.0, "budget_s": budget, "text": "", "progress": []}
        self.write(data)

    def progress(self, step: str, line: str, latest: bool = False) -> None:
        """Add ``line`` to the step's progress, or with ``latest`` make it the step's one "last output" line."""
        data = self.read()
        entry = data["steps"].setdefault(step, {"status": "running", "seconds": 0.0, "budget_s": 0.0, "text": "",
                                                "progress": []})
        if latest:
            entry["latest"] = line
        else:
            entry.setdefault("progress", []).append(line)
        self.write(data)

    def add(self, step: str, result: dict, text: str) -> None:
        """The step's result and section text, keeping the progress it logged."""
        data = self.read()
        entry = data["steps"].setdefault(step, {"progress": []})
        entry.update(result, text=text)
        data["steps"][step] = entry
        self.write(data)


def render(data: dict) -> str:
    """report.md: the header, then one section per step in the order they started."""
    parts = [data.get("header", "")]
    for step, e in data["steps"].items():
        head = (f"## {step}: running (budget {e.get('budget_s', 0):.0f} s)" if e["status"] == "running" else
                f"## {step}: {e['status']} ({e.get('seconds', 0):.0f} s of {e.get('budget_s', 0):.0f})")
        section = [head, e.get("text", "").strip()]
        if e.get("progress"):
            section.append("Progress (seconds into the step):\n\n```\n" + "\n".join(e["progress"]) + "\n```")
        if e.get("latest") and e["status"] != "ok":
            section.append(f"Last output line: `{e['latest']}`")
        parts.append("\n\n".join(p for p in section if p))
    return "\n\n".join(p for p in parts if p) + "\n"


class Progress:
    """A running step's deadline and its log: ``left()`` is the seconds to its deadline, ``log`` puts a line into
    its section at once, ``latest`` replaces the section's "last output line" (of a child process it watches)."""

    def __init__(self, report: Report, step: str, deadline: float) -> None:
        self.report, self.step, self.deadline, self.t0 = report, step, deadline, time.time()

    def left(self) -> float:
        return self.deadline - time.time()

    def log(self, line: str) -> None:
        print(f"[{self.step}] {line}", flush=True)
        self.report.progress(self.step, f"{time.time() - self.t0:5.0f}  {line}")

    def latest(self, line: str) -> None:
        self.report.progress(self.step, line[:300], latest=True)


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


# ---- what the machine is -----------------------------------------------------------------------------------------


def commit(pack: Path) -> str:
    """HEAD of this checkout ("+ changes" when tracked files differ from it); where .git did not travel, the
    commit the pack recorded when it was written (benchmarks/gpu_pack.py)."""
    with contextlib.suppress(OSError):
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                   capture_output=True, text=True).stdout.strip()
            return out.stdout.strip()[:12] + (" + changes" if dirty else "")
    with contextlib.suppress(OSError, ValueError, KeyError):
        packed = json.loads((pack / "pack.json").read_text())
        return (f"{packed['commit'][:12]}{' + changes' if packed.get('dirty') else ''} (recorded by the pack, "
                "no .git here)")
    return "unknown (no .git, and the pack recorded none)"


def toolchain() -> dict[str, str | None]:
    """What Inductor's Triton launcher is built with at its first launch: a C compiler ($CC, else cc, gcc or
    clang on PATH; its path and version line) and the Python headers (Python.h); None for what is missing."""
    compiler = None
    for name in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang")):
        path = shutil.which(name)
        if path:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                first = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
                compiler = f"{path} ({(first.splitlines() or ['no version'])[0]})"
            break
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return {"compiler": compiler, "python_h": str(header) if header.is_file() else None}


def driver_version() -> str | None:
    """The NVIDIA driver's version: from nvidia-smi, else /proc/driver/nvidia/version; None without either."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.splitlines()[0].strip()
    with contextlib.suppress(OSError):
        match = re.search(r"Kernel Module\s+([\d.]+)", Path("/proc/driver/nvidia/version").read_text())
        if match:
            return match.group(1)
    return None


def versions() -> dict[str, str | None]:
    """The versions a first GPU run must name (None: not there)."""
    import torch

    def package(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    # NCCL as the wheel torch's CUDA build loads it from (its version is the library's)
    nccl = package("nvidia-nccl-cu13") or package("nvidia-nccl-cu12")
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": str(cudnn) if cudnn else None, "nccl": nccl, "driver": driver_version(),
            "triton": package("triton"), "transformers": package("transformers")}


# ---- what the steps share ----------------------------------------------------------------------------------------


def python() -> list[str]:
    return [sys.executable]


def child_env() -> dict[str, str]:
    """The environment of every child: the project importable without an install, output unbuffered."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def run_logged(cmd: list[str], log: Path, timeout: float, cwd: Path = ROOT,
               watch: Callable[[], None] | None = None) -> tuple[int | None, float]:
    """Run ``cmd`` with its output in ``log``, calling ``watch`` every WATCH_EVERY_S while it runs; (exit status
    or None when it ran out of ``timeout``, seconds)."""
    t0 = time.perf_counter()
    end = t0 + max(timeout, 1)
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=child_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        while True:
            try:
                code = proc.wait(timeout=max(0.1, min(WATCH_EVERY_S, end - time.perf_counter())))
                break
            except subprocess.TimeoutExpired:
                if time.perf_counter() >= end:
                    stop(proc)
                    code = None
                    break
                if watch is not None:
                    watch()
    return code, time.perf_counter() - t0


def stop(proc: subprocess.Popen) -> None:
    """End ``proc`` and what it started: SIGTERM first (torchrun's agent passes it on to its workers, which run in
    sessions of their own), SIGKILL to its process group after 10 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def outcome(code: int | None) -> str:
    """A child's end as a progress line says it: its exit status, or that its time ran out."""
    return "out of time, stopped" if code is None else f"exit {code}"


def tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    return "\n".join(text.splitlines()[-lines:])


def watch_log(progress: Progress, name: str, log: Path) -> Callable[[], None]:
    """A ``run_logged`` watch that makes ``log``'s last line the step's last output line."""
    return lambda: progress.latest(f"{name}: {tail(log, 1)}")


def run_flags(args: argparse.Namespace, out_dir: Path, *more: str) -> list[str]:
    """``train_multitask.py`` and the flags of a check run: the packed encoder everywhere, the unpacked data."""
    tiny = TINY_TRAIN if args.tiny else []
    return [str(ROOT / "train_multitask.py"), "--pretrained", args.pretrained, "--sts-prior-model", args.pretrained,
            "--sst-prior-model", args.pretrained, "--data-dir", args.data_dir, "--out-dir", str(out_dir),
            "--overwrite", "--device", args.train_device, *tiny, *more]


def measured(peak: Path, script_and_flags: list[str]) -> list[str]:
    """The command that runs a script (train_multitask.py and its flags) and writes its peak memory to ``peak``."""
    return [*python(), "-m", "benchmarks.peak_memory", str(peak), *script_and_flags]


def peak_text(peak: Path) -> str:
    """A run's peak memory as the report shows it: CUDA's allocated bytes, else the peak resident set."""
    try:
        p = json.loads(peak.read_text())
    except (OSError, ValueError):
        return "–"
    if p.get("cuda_max_allocated_bytes") is not None:
        return f"{p['cuda_max_allocated_bytes'] / 2**30:.2f} GiB on the GPU"
    return f"RSS {p['max_rss_bytes'] / 2**30:.2f} GiB"


def read_peak(peak: Path) -> dict | None:
    with contextlib.suppress(OSError, ValueError):
        return json.loads(peak.read_text())
    return None


def records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def final_record(run: Path) -> dict | None:
    return next((r for r in reversed(records(run)) if r.get("final")), None)


def seq_per_s(run: Path) -> float | None:
    """The median of the throughputs the run's progress lines logged (train.log)."""
    log = run / "train.log"
    values = [float(v) for v in re.findall(r"\| ([\d.]+) seq/s", log.read_text())] if log.is_file() else []
    return statistics.median(values) if values else None


def copy_train_logs(work: Path, logs: Path) -> list[str]:
    """Every run's train.log under ``work`` into ``logs`` as <run>.train.log (replacing earlier copies)."""
    copied = []
    for log in sorted(work.glob("*/train.log")):
        logs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, logs / f"{log.parent.name}.train.log")
        copied.append(log.parent.name)
    return copied


# The recipe of the CPU reference (RESULTS.md's default run), which the default runs of the check repeat on the
# GPU: the default before it took the SST phrases (the resume step trains phrases on the GPU).
CPU_REFERENCE_RECIPE = ("--sst-phrases", "none")


def cpu_reference() -> dict[str, str]:
    """The CPU default's mean ± std over seeds, read from RESULTS.md's table of the default run (not copied here)."""
    header: list[str] | None = None
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.is_file() else ""
    section = text[text.find("\n## The default run"):] if "\n## The default run" in text else ""
    for line in section.splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == "run" and "overall" in cells:
            header = cells
        elif header and cells and "mean ± std" in cells[0] and len(cells) == len(header):
            return {"row": cells[0], **{h: c for h, c in zip(header, cells) if h in (
                "SST acc", "Para acc", "STS r", "overall")}}
        elif not line.strip():
            header = None
    return {}


def random_checkpoint(directory: Path, vocab: Path, **shape: int) -> Path:
    """A BERT checkpoint directory with random weights of ``shape`` (bert-base's by default) and ``vocab``; an
    earlier step's is reused."""
    if (directory / "model.safetensors").is_file():
        return directory
    import torch
    from safetensors.torch import save_file

    from minbert.bert import BertModel
    from minbert.config import BertConfig

    words = len(vocab.read_text(encoding="utf-8").splitlines())
    config = BertConfig(**{"vocab_size": words, "hidden_size": 768, "num_hidden_layers": 12,
                           "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 512,
                           "type_vocab_size": 2, **shape})
    torch.manual_seed(0)
    model = BertModel(config)
    directory.mkdir(parents=True, exist_ok=True)
    config.to_json_file(directory / "config.json")
    shutil.copy2(vocab, directory / "vocab.txt")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    return directory


def shapes(args: argparse.Namespace) -> dict[str, str]:
    """The encoders the speed steps time: the packed MiniLM and a bert-base-shaped one (a tiny one in the dry
    run) with random weights."""
    tiny = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
            "max_position_embeddings": 64} if args.tiny else {}
    return {"MiniLM": args.pretrained,
            "bert-base": str(random_checkpoint(args.work / "bert-base-random", Path(args.pretrained) / "vocab.txt",
                                               **tiny))}


# ---- the steps ---------------------------------------------------------------------------------------------------


def step_machine(args: argparse.Namespace, progress: Progress) -> tuple[dict, str]:
    import torch

    from benchmarks.bench_multitask import matmul_flops_per_s
    from tasks.runtime import (
        configure_device,
        device_info,
        fp32_matmul_precision,
        no_tf32,
        resolve_device,
        synchronize,
    )

    found = {**versions(), **toolchain(), "commit": commit(Path(args.pack))}
    progress.log(", ".join(f"{k} {v or '–'}" for k, v in found.items()))
    device = resolve_device(args.device)
    info = device_info(device)
    progress.log(f"device: {info.get('name', info['device'])}")
    # sides a device multiplies in well under a second: a GPU's peak needs large matrices, a CPU's does not
    n = 512 if args.tiny else 8192 if args.train_device == "cuda" else 2048
    min_time = 0.05 if args.tiny else 0.3
    peaks = {"bf16": matmul_flops_per_s((n, n, n), torch.bfloat16, device, min_time)}
    progress.log(f"bf16 matmul peak: {peaks['bf16'] / 1e12:.3f} TFLOP/s")
    configure_device(device)  # what a training run sets: TF32 on CUDA
    configured = f"fp32 as trained ({fp32_matmul_precision(device)})"
    peaks[configured] = matmul_flops_per_s((n, n, n), torch.float32, device, min_time)
    with no_tf32():
        peaks["fp32"] = matmul_flops_per_s((n // 2, n // 2, n // 2), torch.float32, device, min_time)
    progress.log(f"fp32 matmul peaks: {peaks[configured] / 1e12:.3f} and {peaks['fp32'] / 1e12:.3f} TFLOP/s")
    numel = 2**20 if args.tiny else 2**28 if args.train_device == "cuda" else 2**24  # 1 GiB of float32 on a GPU
    src = torch.ones(numel, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    synchronize(device)
    repeats = 20
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    synchronize(device)
    copy = 2 * 4 * numel * repeats / (time.perf_counter() - t0)  # bytes read and written
    result = {**info, **found, "matmul_tflop_s": {k: v / 1e12 for k, v in peaks.items()},
              "matmul_side": {"bf16": n, configured: n, "fp32": n // 2}, "copy_tb_s": copy / 1e12}
    rows = [[k, f"{v / 1e12:.1f}" if v > 1e12 else f"{v / 1e12:.3f}"] for k, v in peaks.items()]
    text = (f"{info.get('name', info['device'])}"
            + (f", {info['multiprocessors']} SMs, {info['memory_gib']} GiB, compute capability {info['capability']}"
               if "name" in info else "") + "\n\n"
            + table(["", "version"], [[k, v or "–"] for k, v in found.items()]) + "\n\n"
            + table(["matmul (square, side as in report.json)", "TFLOP/s"], rows)
            + f"\n\nDevice-to-device copy: {copy / 1e12:.2f} TB/s (bytes read + written).")
    return result, text


def gpu_test_files(root: Path = ROOT) -> list[str]:
    """The test modules that hold gpu-marked tests, found by reading them: importing every module to let pytest
    select would need what the GPU machine lacks (the embedded MiniLM's package, ../shared)."""
    return sorted(p.relative_to(root).as_posix() for p in (root / "tests").rglob("test_*.py")
                  if GPU_MARK in p.read_text(encoding="utf-8"))


def tests_command() -> list[str]:
    """The tests step's pytest call, run in the repository root: the gpu-marked tests of their own modules."""
    return [*python(), "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rs", *gpu_test_files()]


def pytest_summary(output: str) -> tuple[str, dict[str, int]]:
    """pytest's closing line ("2 failed, 40 passed, 1 error in 9.1s") and its counts by word ("errors" counted
    as "error", "warnings" as "warning"); ("", {}) when there is none."""
    words = r"passed|failed|skipped|deselected|xfailed|xpassed|errors?|warnings?"
    line = next((ln for ln in reversed(output.splitlines()) if re.search(rf"\d+ ({words})\b", ln)), "")
    counts: dict[str, int] = {}
    for value, word in re.findall(rf"(\d+) ({words})\b", line):
        counts[word.removesuffix("s") if word in ("errors", "warnings") else word] = int(value)
    return line.strip("= "), counts


def step_tests(args: argparse.Namespace, progress: Progress) -> tuple[dict, str]:
    files = gpu_test_files()
    if not files:
        return {"status": "failed"}, f"No test module under tests/ holds `{GPU_MARK}`."
    cmd = tests_command()
    progress.log(f"pytest -m gpu {' '.join(files)}")
    log = args.work / "tests.log"
    code, seconds = run_logged(cmd, log, progress.left(), watch=watch_log(progress, "pytest", log))
    summary, counts = pytest_summary(tail(log, 40))
    status = ("timeout" if code is None else "ok" if code == 0 and not counts.get("error") and not counts.get("failed")
              else "failed")
    result = {"status": status, "exit": code, "counts": counts, "summary": summary, "files": files}
    return result, f"`pytest -m gpu {' '.join(files)}`: {summary or 'no summary'}\n\n```\n{tail(log)}\n```"


def step_encoder(args: argparse.Namespace, progress: Progress) -> tuple[dict, str]:
    import torch

    from benchmarks.bench_encoder import build_models, make_batch, step_fn, time_pair
    from tasks.runtime import resolve_device

    device = resolve_device(args.device)
    batch, seq = (4, 16) if args.tiny else (32, 128)
    repeats, iters = (2, 1) if args.tiny else (5, 3)
    rows, encoder, longest, cut = [], {}, 0.0, None
    for shape, model_dir in shapes(args).items():
        for dtype_name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            if longest and progress.left() < 1.5 * longest:  # the next model would not fit: keep what is measured
                cut = f"{shape} {dtype_name}"
                break
            t_block = time.perf_counter()
            progress.log(f"{shape} {dtype_name}: building both models, then timing forward and forward + backward")
            ours, ref = build_models(model_dir, str(device), dtype)
            for mode in ("infer", "train"):
                ours.train(mode == "train")
                ref.train(mode == "train")
                data = make_batch(ours.config.vocab_size, batch, seq, str(device))
                t = time_pair({"ours": step_fn(ours, data, mode, False), "ref": step_fn(ref, data, mode, True)},
                              device, 1, repeats, iters)
                ours.zero_grad(set_to_none=True)
                ref.zero_grad(set_to_none=True)
                key = f"{shape} {dtype_name} {mode}"
                encoder[key] = {"ours_seq_s": batch / t["ours"], "ref_seq_s": batch / t["ref"],
                                "ratio": t["ref"] / t["ours"]}
                rows.append([shape, dtype_name, "forward" if mode == "infer" else "forward + backward",
                             f"{batch / t['ours']:,.0f}", f"{batch / t['ref']:,.0f}", f"{t['ref'] / t['ours']:.2f}"])
                progress.log(f"{key}: ours {batch / t['ours']:,.0f} seq/s, transformers {batch / t['ref']:,.0f} "
                             f"({t['ref'] / t['ours']:.2f}x)")
            del ours, ref
            longest = max(longest, time.perf_counter() - t_block)
        if cut:
            break
    text = (f"Encoder alone, batch {batch} × {seq} tokens, ours and transformers.BertModel (sdpa) on the same "
            "weights, alternating:\n\n"
            + table(["shape", "dtype", "pass", "ours seq/s", "transformers seq/s", "ours ÷ transformers"], rows)
            + (f"\n\nNot run, out of time: from {cut} on." if cut else ""))
    return {"status": "partial" if cut else "ok", "encoder": encoder, "not_run_from": cut}, text


def step_default(args: argparse.Namespace, progress: Progress) -> tuple[dict, str]:
    runs, rows = [], []
    for seed in range(2 if args.tiny else DEFAULT_SEEDS):  # the first, then more while the budget lasts
        left = progress.left()
        if runs and left < 1.15 * runs[0]["wall_s"]:
            progress.log(f"seed {seed}: not started ({left:.0f} s left, a run took {runs[0]['wall_s']:.0f} s)")
            break
        name = f"default-seed{seed}"
        out, peak = args.work / name, args.work / f"{name}.peak.json"
        progress.log(f"seed {seed}: started with {left:.0f} s left")
        code, wall = run_logged(measured(peak, run_flags(args, out, *CPU_REFERENCE_RECIPE, "--seed", str(seed))),
                                args.work / f"{name}.log", left, watch=watch_log(progress, name, out / "train.log"))
        record = final_record(out) or {}
        dev = record.get("dev", {})
        run = {"seed": seed, "exit": code, "wall_s": round(wall, 1), "train_seq_s": seq_per_s(out), "dev": dev,
               "peak": read_peak(peak)}
        runs.append(run)
        progress.log(f"seed {seed}: {outcome(code)} after {wall:.0f} s, dev overall "
                     f"{dev.get('overall', math.nan):.4f}, peak memory {peak_text(peak)}")
        rows.append([seed, f"{wall:.0f}", f"{run['train_seq_s']:.0f}" if run["train_seq_s"] else "–", peak_text(peak),
                     *(f"{dev[k]:.4f}" if dev.get(k) is not None else "–" for k in ("sst_acc", "para_acc", "sts_r",
                                                                                    "overall"))])
        if code != 0:
            break
    cpu = cpu_reference()
    if cpu:
        rows.append([f"CPU: {cpu['row']} (experiments/RESULTS.md)", "", "", "", cpu.get("SST acc", ""),
                     cpu.get("Para acc", ""), cpu.get("STS r", ""), cpu.get("overall", "")])
    ok = bool(runs) and runs[0]["exit"] == 0
    status = "ok" if ok else "timeout" if runs and runs[0]["exit"] is None else "failed"
    recipe = "tiny flags: " + " ".join(TINY_TRAIN) if args.tiny else "the default recipe"
    text = (f"`python train_multitask.py {' '.join(CPU_REFERENCE_RECIPE)} --seed K` with the packed encoder "
            f"({recipe}); peak memory of the training process (benchmarks/peak_memory.py):\n\n"
            + table(["seed", "wall s", "train seq/s", "peak memory", "SST acc", "Para acc", "STS r", "overall"], rows))
    if not ok:
        text += f"\n\n```\n{tail(args.work / 'default-seed0.log')}\n```"
    return {"status": status, "runs": runs, "cpu_reference": cpu}, text


def short_runs(args: argparse.Namespace, progress: Progress, arms: dict[str, list[str]]) -> dict[str, dict]:
    """Each arm's short run (SHORT_RUN; the tiny flags in the dry run), in turn while time lasts: {arm: its exit,
    wall, train seq/s, final dev scores, epoch records, peak memory}. Under ``<work>/short``: their train.log files
    stay out of the report's logs (at most 8 files come back from the machine)."""
    out = {}
    for arm, flags in arms.items():
        run, peak = args.work / "short" / arm, args.work / f"{arm}.peak.json"
        progress.log(f"{arm}: started with {progress.left():.0f} s left")
        code, wall = run_logged(measured(peak, run_flags(args, run, *([] if args.tiny else SHORT_RUN), *flags,
                                                         "--seed", "0")),
                                args.work / f"{arm}.log", progress.left(), watch=watch_log(progress, arm,
                                                                                           run / "train.log"))
        record = final_record(run) or {}
        out[arm] = {"exit": code, "wall_s": round(wall, 1), "train_seq_s": seq_per_s(run), "dev": record.get("dev"),
                    "epochs": [r for r in records(run) if "dev" in r and not r.get("final")], "peak": read_peak(peak),
                    "peak_text": peak_text(peak)}
        progress.log(f"{arm}: {outcome(code)} after {wall:.0f} s, dev overall "
                     f"{(record.get('dev') or {}).get('overall', math.nan):.4f}, peak memory {peak_text(peak)}")
        if code != 0:
            break
    return out


def _arm_row(arm: str, run: dict, *more: str) -> list[str]:
    dev = run.get("dev") or {}
    return [arm, f"{run['wall_s']:.0f}", f"{run['train_seq_s']:.0f}" if run.get("train_seq_s") else "–",
            run["peak_text"], *more,
            *(f"{dev[k]:.4f}" if dev.get(k) is not None else "–" for k in ("sst_acc", "para_acc", "sts_r", "overall"))]


def step_fp16(args: argparse.Namespace, progress: Progress) -> tuple[dict, str]:
    runs = short_runs(args, progress, {"fp16": ["--fp16"], "bf16": ["--bf16"] if args.train_device == "cuda" else
                                       ["--no-bf16"]})
    fp16 = runs.get("fp16", {})
    last = (fp16.get("epochs") or [{}])[-1]
    skipped = last.get("skipped_steps")
    rows = [_arm_row(arm, run, str(run["epochs"][-1].get("skipped_steps", "–")) if run.get("epochs") else "–")
            for arm, run in runs.items()]
    ok = fp16.get("exit") == 0 and bool(fp16.get("dev")) and skipped is not None and \
        skipped < (last.get("global_step") or 0)
    log = tail(args.work / "short" / "fp16" / "train.log", 400)
    chose = next((ln for ln in log.splitlines() if "fp16 autocast" in ln), "")
    text = (f"`train_multitask.py {' '.join([] if args.tiny else SHORT_RUN)} --fp16` (a T4's precision, forced) beside "
            f"the same run in {'bf16' if args.train_device == 'cuda' else 'fp32'}; the log's choice: "
            f"`{chose.split('| plan')[0].strip()[-140:]}`\n\n"
            + table(["run", "wall s", "train seq/s", "peak memory", "fp16 steps skipped", "SST acc", "Para acc",
                     "STS r", "overall"], rows))
    if fp16.get("exit") != 0:
        text += f"\n\n```\n{tail(args.work / 'fp16.log')}\n```"
    return {"status": "ok" if ok else "timeout" if fp16.get("exit", 1) is None else "failed", "runs": runs}, text


def step_accumulation(args: argparse.Namespace, progress: Progress) -> tuple[dict, str]:
    plain = ["--encoder-dropout", "0", "--sst-phrases-batch-size", "32"]  # no dropout: the same steps up to rounding
    runs = short_runs(args, progress, {"batch32": [*plain, "--batch-size", "32"],
                                       "batch16x2": [*plain, "--batch-size", "16", "--sst-phrases-batch-size", "16",
                                                     "--gradient-accumulation-steps", "2"]})
    a, b = (runs.get(arm, {}).get("dev") or {} for arm in ("batch32", "batch16x2"))
    diff = abs(a["overall"] - b["overall"]) if a.get("overall") is not None and b.get("overall") is not None else None
    ok = all(r.get("exit") == 0 for r in runs.values()) and len(runs) == 2 and diff is not None
    rows = [_arm_row(arm, run) for arm, run in runs.items()]
    text = (f"`train_multitask.py {' '.join([] if args.tiny else SHORT_RUN)} {' '.join(plain)}` at `--batch-size 32` "
            "and at `--batch-size 16 --gradient-accumulation-steps 2` (the phrases' batch halved likewise): the same "
            "optimizer steps over the same examples, so the dev scores differ by rounding only"
            + (f" (|Δ overall| {diff:.4f})" if diff is not None else "") + "; peak memory is the micro-batch's:\n\n"
            + table(["run", "wall s", "train seq/s", "peak memory", "SST acc", "Para acc", "STS r", "overall"], rows))
    out_of_time = any(run.get("exit", 1) is None for run in runs.values())  # the step's budget stopped a run
    return {"status": "ok" if ok else "timeout" if out_of_time else "failed", "runs": runs,
            "overall_difference": diff}, text


def step_resume(args: argparse.Namespace, progress: Progress) -> tuple[dict, str]:
    size = (["--limit", "256", "--epochs", "2"] if args.tiny else ["--limit", "3000", "--epochs", "2"])
    flags = [*size, "--deterministic", "--seed", "0"]  # after the tiny flags: these sizes replace theirs
    whole, cut = args.work / "resume-whole", args.work / "resume-cut"
    progress.log("uninterrupted run started (no mid-epoch checkpoint)")
    code, wall = run_logged(measured(args.work / "resume-whole.peak.json", run_flags(args, whole, *flags)),
                            args.work / "resume-whole.log", progress.left(),
                            watch=watch_log(progress, "uninterrupted", whole / "train.log"))
    if code != 0:
        return {"status": "timeout" if code is None else "failed", "stage": "uninterrupted run"}, \
            f"The uninterrupted run did not finish:\n\n```\n{tail(args.work / 'resume-whole.log')}\n```"
    per_epoch = records(whole)[0]["global_step"]
    every = max(1, per_epoch // 2)  # one mid-epoch checkpoint an epoch (two where the epoch has an odd count)
    progress.log(f"uninterrupted run: {wall:.0f} s, {per_epoch} steps an epoch; the cut run checkpoints every "
                 f"{every} steps")
    killed_at = kill_mid_epoch(measured(args.work / "resume-cut.peak.json",
                                        run_flags(args, cut, *flags, "--checkpoint-every", str(every))),
                               cut, args.work / "resume-cut.log", progress.left())
    progress.log(f"cut run: killed at {killed_at}" if killed_at else "cut run: ended before its first checkpoint")
    code, _ = run_logged(measured(args.work / "resume-resumed.peak.json",
                                  [str(ROOT / "train_multitask.py"), "--resume", "--out-dir", str(cut)]),
                         args.work / "resume-resumed.log", progress.left(),
                         watch=watch_log(progress, "resumed", cut / "train.log"))
    if code != 0:
        return {"status": "timeout" if code is None else "failed", "stage": "resumed run", "killed_at": killed_at}, \
            f"The resumed run did not finish:\n\n```\n{tail(args.work / 'resume-resumed.log')}\n```"
    progress.log("resumed run finished")
    files = sorted(p.relative_to(whole).as_posix() for p in (whole / "predictions").iterdir()) + [
        "checkpoints/best/model.safetensors"]
    same = {f: (whole / f).read_bytes() == (cut / f).read_bytes() for f in files}
    ok = all(same.values()) and killed_at is not None
    text = (f"`--deterministic {' '.join(size)}`, the cut run with `--checkpoint-every {every}` ({per_epoch} steps an "
            f"epoch): killed with SIGKILL at {killed_at or 'no checkpoint (not killed)'}, then `--resume`; "
            f"{sum(same.values())} of {len(same)} files byte-identical to the uninterrupted run's"
            + ("" if all(same.values()) else ": differ: " + ", ".join(f for f, s in same.items() if not s)) + ". "
            f"Peak memory: uninterrupted {peak_text(args.work / 'resume-whole.peak.json')}, resumed "
            f"{peak_text(args.work / 'resume-resumed.peak.json')}.")
    return {"status": "ok" if ok else "failed", "killed_at": killed_at, "identical": same, "steps_per_epoch": per_epoch,
            "checkpoint_every": every, "peak": read_peak(args.work / "resume-whole.peak.json")}, text


def kill_mid_epoch(cmd: list[str], run: Path, log: Path, timeout: float) -> str | None:
    """Start ``cmd`` and SIGKILL it once its first mid-epoch checkpoint is written; "epoch E step S" of that
    checkpoint, or None when the run ended (or ran out of ``timeout``) first."""
    state = run / "checkpoints" / "last" / "state.json"
    deadline = time.perf_counter() + timeout
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            while proc.poll() is None and time.perf_counter() < deadline:
                with contextlib.suppress(OSError, ValueError):
                    saved = json.loads(state.read_text())
                    if saved["step"] > 0:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        return f"epoch {saved['epoch'] + 1} step {saved['step']}"
                time.sleep(0.02)
        finally:
            if proc.poll() is None:
                stop(proc)
    return None


def step_step(args: argparse.Namespace, progress: Progress) -> tuple[dict, str]:
    from benchmarks.bench_multitask import benchmark
    from tasks.model import PHRASES
    from tasks.train_config import TrainConfig

    steps, warmup, rounds = (2, 1, 1) if args.tiny else (16, 3, 2)
    square = 512 if args.tiny else 8192 if args.train_device == "cuda" else 2048
    rows, step, longest, cut = [], {}, 0.0, None
    for shape, model_dir in shapes(args).items():
        if longest and progress.left() < 1.5 * longest:
            cut = shape
            break
        t_shape = time.perf_counter()
        progress.log(f"{shape}: building the trainer and timing {rounds} × {steps} steps")
        cfg = TrainConfig(data_dir=args.data_dir, pretrained=model_dir, device=args.train_device,
                          max_length=32 if args.tiny else 128, stream_files={PHRASES: None})  # as bench_multitask
        res = benchmark(cfg, ["ours"], steps=steps, warmup=warmup, rounds=rounds, memory=False, square=square,
                        peak_min_time=0.05 if args.tiny else 0.2, log=lambda s: None)
        peak, v = res["peak_flops"], res["variants"]["ours"]
        step[shape] = {"train_seq_s": v["train_seq_s"], "train_mfu": v["train_mfu"],
                       "peak_dtype": peak["reference_dtype"], "peak_tflop_s": peak["reference_flop_s"] / 1e12}
        rows.append([shape, f"{v['train_seq_s']:,.0f}", f"{100 * v['train_mfu']:.1f}%",
                     f"{peak['reference_dtype']} {peak['reference_flop_s'] / 1e12:.1f} TFLOP/s"])
        progress.log(f"{shape}: {v['train_seq_s']:,.0f} seq/s, MFU {100 * v['train_mfu']:.1f}%")
        longest = max(longest, (time.perf_counter() - t_shape) * (6 if shape == "MiniLM" else 1))  # bert-base ~6x
    text = ("The multitask training step, eager (Trainer.train_step on the default recipe's batches, "
            "benchmarks/bench_multitask.py), MFU on real tokens against the peak measured in the same process; "
            "compiled: the compile step:\n\n"
            + table(["shape", "train seq/s", "MFU", "peak"], rows)
            + (f"\n\nNot run, out of time: {cut}." if cut else ""))
    return {"status": "partial" if cut else "ok", "step": step, "not_run": cut}, text


def step_torchrun(args: argparse.Namespace, progress: Progress) -> tuple[dict, str]:
    torchrun = [*python(), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
    backend = "nccl" if args.train_device == "cuda" else "gloo"
    progress.log(f"process group ({backend}, one process) started")
    log = args.work / "torchrun-group.log"
    code, wall = run_logged([*torchrun, "-m", "benchmarks.process_group", "--device", args.train_device], log,
                            progress.left())
    group = next((json.loads(ln) for ln in reversed(tail(log, 40).splitlines()) if ln.startswith("{")), None)
    progress.log(f"process group: {outcome(code)} after {wall:.0f} s: {json.dumps(group) if group else 'no result'}")
    group_text = (f"`torchrun --nproc_per_node=1 -m benchmarks.process_group`: {group['backend']} process group of "
                  f"world size {group['world_size']}, one all-reduce gave {group['all_reduce']:g} (expected "
                  f"{group['expected']:g}); init {group['init_s']} s, all-reduce {group['all_reduce_s']} s"
                  + "." if group and code == 0 else
                  f"`torchrun --nproc_per_node=1 -m benchmarks.process_group`: {outcome(code)}\n\n```\n{tail(log)}"
                  "\n```")
    size = [] if args.tiny else ["--limit", "500", "--epochs", "1"]  # seconds of training on a GPU
    out, peak = args.work / "torchrun", args.work / "torchrun.peak.json"
    progress.log(f"training run started with {progress.left():.0f} s left")
    code_run, wall_run = run_logged([*torchrun, "-m", "benchmarks.peak_memory", str(peak),
                                     *run_flags(args, out, *size)], args.work / "torchrun.log", progress.left(),
                                    watch=watch_log(progress, "torchrun", out / "train.log"))
    record = final_record(out) or {}
    progress.log(f"training run: {outcome(code_run)} after {wall_run:.0f} s")
    run_ok = code_run == 0 and bool(record)
    status = ("ok" if run_ok and code == 0 and group and group["all_reduce"] == group["expected"] else
              "timeout" if None in (code, code_run) else "failed")
    text = (group_text + "\n\n"
            f"`torchrun --nproc_per_node=1 train_multitask.py {' '.join(size)}`: {outcome(code_run)} after "
            f"{wall_run:.0f} s, "
            f"dev overall {record.get('dev', {}).get('overall', math.nan):.4f}, peak memory {peak_text(peak)} (a "
            "training run with one process starts no process group: tasks/training/distributed.py starts one for 2 "
            "or more).")
    if not run_ok:  # torchrun's own summary of a failed worker follows the worker's traceback: show both
        text += f"\n\n```\n{tail(args.work / 'torchrun.log', 45)}\n```"
    return {"status": status, "process_group": group, "exit": code_run, "wall_s": round(wall_run, 1),
            "dev": record.get("dev"), "peak": read_peak(peak)}, text


def compile_fits(tiny_seconds: float, left: float) -> bool:
    """Whether MiniLM's cold compile, estimated from the tiny encoder's measured one, fits the time left."""
    return left >= COMPILE_SCALE * tiny_seconds


def step_compile(args: argparse.Namespace, progress: Progress) -> tuple[dict, str]:
    tools = toolchain()
    progress.log(f"C compiler: {tools['compiler'] or 'none'}; Python.h: {tools['python_h'] or 'none'}")
    missing = [what for what, key in (("a C compiler (cc, gcc or clang on PATH, or $CC)", "compiler"),
                                      ("the Python headers (Python.h)", "python_h")) if not tools[key]]
    if missing:
        reason = "no " + " and no ".join(missing)
        return {"status": "skipped", "reason": reason, **tools}, (
            f"Skipped: {reason}. Inductor builds Triton's launcher with them at its first kernel launch, so "
            "torch.compile cannot run here.")
    if args.tiny:
        return {"status": "skipped", "reason": "the dry run", **tools}, (
            "Skipped in the dry run: a CPU compile takes minutes (tests/benchmarks/test_bench_multitask.py runs the "
            "compile variant).")
    if progress.left() < COMPILE_START_S:
        reason = f"{progress.left():.0f} s left, under the {COMPILE_START_S} s a first compile needs"
        return {"status": "skipped", "reason": reason, **tools}, f"Skipped: {reason}."
    import torch

    from benchmarks.bench_encoder import make_batch, step_fn, time_pair
    from minbert.bert import BertModel
    from minbert.config import BertConfig
    from minbert.pretrained import load_pretrained
    from tasks.runtime import resolve_device, synchronize

    device = resolve_device(args.device)
    dtype = torch.bfloat16 if args.train_device == "cuda" else torch.float32  # each device's training precision
    result: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch."), **tools}
    stage = "the tiny encoder's cold compile"

    def first_step(model: torch.nn.Module, data: dict) -> float:
        synchronize(device)
        t0 = time.perf_counter()
        step_fn(model, data, "train", False)()
        synchronize(device)
        return time.perf_counter() - t0

    try:
        # one padded length and dynamic=False: one graph, no recompile for the next length
        tiny = BertModel(BertConfig(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=128, max_position_embeddings=64)).to(device=device, dtype=dtype)
        result["tiny_cold_s"] = first_step(torch.compile(tiny, dynamic=False), make_batch(99, 4, 16, str(device)))
        progress.log(f"tiny encoder: cold compile and first forward + backward in {result['tiny_cold_s']:.1f} s")
        if not compile_fits(result["tiny_cold_s"], progress.left()):
            return {"status": "partial", **result}, (
                f"The tiny encoder compiled and ran ({result['tiny_cold_s']:.1f} s cold); MiniLM's compile, estimated "
                f"at {COMPILE_SCALE} times that, does not fit the {progress.left():.0f} s left.")
        stage = "MiniLM's cold compile"
        ours = load_pretrained(args.pretrained)[0].to(device=device, dtype=dtype).train()
        batch, seq = 32, 128
        data = make_batch(ours.config.vocab_size, batch, seq, str(device))
        compiled = torch.compile(ours, dynamic=False)
        result["minilm_cold_s"] = first_step(compiled, data)
        progress.log(f"MiniLM: cold compile and first forward + backward in {result['minilm_cold_s']:.1f} s")
        stage = "timing eager against compiled"
        eager_s = first_step(ours, data)
        # as many alternating calls of both as fit most of the time left: 16 each on a GPU, fewer on a slow device
        calls = int(0.8 * progress.left() / (2 * eager_s))
        if calls < 2:
            return {"status": "partial", **result}, (
                f"MiniLM compiled and ran ({result['minilm_cold_s']:.1f} s cold, the tiny encoder "
                f"{result['tiny_cold_s']:.1f} s); one eager step takes {eager_s:.1f} s, too long to time both in the "
                f"{progress.left():.0f} s left.")
        iters = 3 if calls >= 16 else 1
        repeats = min(5, max(1, (calls - 1) // iters))
        progress.log(f"timing eager against compiled: {repeats} × {iters} calls each (one eager call: "
                     f"{eager_s:.2f} s)")
        t = time_pair({"eager": step_fn(ours, data, "train", False), "compiled": step_fn(compiled, data, "train",
                                                                                          False)},
                      device, 1, repeats, iters)
        result.update(eager_seq_s=batch / t["eager"], compiled_seq_s=batch / t["compiled"],
                      speedup=t["eager"] / t["compiled"])
        progress.log(f"MiniLM forward + backward: eager {batch / t['eager']:,.0f} seq/s, compiled "
                     f"{batch / t['compiled']:,.0f} seq/s")
    except Exception as e:  # what a first compile on a new machine meets is the finding, not a crash
        return {"status": "failed", "stage": stage, "error": f"{type(e).__name__}: {e}"[:500], **result}, (
            f"torch.compile failed at {stage}:\n\n```\n{traceback.format_exc(limit=6)[-3000:]}\n```")
    text = (f"Our MiniLM encoder, forward + backward on {batch} × {seq} tokens in {result['dtype']}, "
            f"`torch.compile(dynamic=False)` at that one padded length: cold compile and first step "
            f"{result['minilm_cold_s']:.1f} s (the tiny encoder's: {result['tiny_cold_s']:.1f} s); then eager "
            f"{result['eager_seq_s']:,.0f} seq/s, compiled {result['compiled_seq_s']:,.0f} seq/s "
            f"({result['speedup']:.2f}x).")
    return {"status": "ok", **result}, text


STEP_FUNCTIONS: dict[str, Callable[[argparse.Namespace, Progress], tuple[dict, str]]] = {
    "machine": step_machine, "tests": step_tests, "encoder": step_encoder, "default": step_default,
    "fp16": step_fp16, "accumulation": step_accumulation, "resume": step_resume, "step": step_step,
    "torchrun": step_torchrun, "compile": step_compile}


# ---- running the steps -------------------------------------------------------------------------------------------


def unpack_data(data_dir: Path, work: Path) -> Path:
    """``data_dir`` itself when it holds plain CSV files; else its *.csv.gz unpacked into ``work``/data."""
    packed = sorted(data_dir.glob("*.csv.gz"))
    if not packed:
        return data_dir
    out = work / "data"
    out.mkdir(parents=True, exist_ok=True)
    for f in packed:
        (out / f.name[:-3]).write_bytes(gzip.decompress(f.read_bytes()))
    return out


def share(step: str, still_to_run: list[str], left: float) -> float:
    """``step``'s seconds: its part of the time ``left`` in proportion to STEPS among ``still_to_run`` (itself
    included), so that what earlier steps left unused is shared by the steps after them."""
    return left * STEPS[step] / sum(STEPS[s] for s in still_to_run)


def run_step(args: argparse.Namespace, step: str, deadline: float, budget: float) -> None:
    """One step in this process (the child): its result and section into the report, also when it fails."""
    report = Report(args.report_dir)
    progress = Progress(report, step, deadline)
    t0 = time.perf_counter()
    try:
        result, text = STEP_FUNCTIONS[step](args, progress)
        result.setdefault("status", "ok")
    except Exception:  # a failing step is a result to report, and the next step still runs
        result, text = {"status": "failed"}, f"```\n{traceback.format_exc(limit=8)}\n```"
    result.update(seconds=time.perf_counter() - t0, budget_s=budget)
    report.add(step, result, text)


@contextlib.contextmanager
def work_dir(path: str | None) -> Iterator[Path]:
    if path:
        Path(path).mkdir(parents=True, exist_ok=True)
        yield Path(path)
    else:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            yield Path(tmp)


@dataclass
class CheckOptions:
    """The check's flags; the last three are the ones the check passes to each step's own process."""

    report_dir: str = option(help="where report.md, report.json and logs/ go ($OUT on the GPU machine)",
                             factory=str, metavar="DIR")
    pack: str = option(".gpu", "the folder python -m benchmarks.gpu_pack wrote", metavar="DIR")
    pretrained: str | None = option(None, "the encoder (default: <pack>/minilm)", metavar="DIR")
    data_dir: str | None = option(None, "the task files, plain or *.csv.gz (default: <pack>/data)", metavar="DIR")
    device: str = option("cuda", "cuda for the check, cpu for the dry run", metavar="DEVICE")
    tiny: bool = option(False, "every step at tiny sizes (the dry run)")
    only: list[str] | None = option(None, "run these steps only", choices=list(STEPS), nargs="+")
    budget: float = option(480.0, "seconds for all the steps together", metavar="SECONDS")
    work_dir: str | None = option(None, "runs and logs (default: a temporary directory)", metavar="DIR")
    step: str | None = option(None, "a child's one step", choices=list(STEPS), hidden=True)
    step_deadline: float | None = option(None, "time.time() for the step to end by", hidden=True)
    step_budget: float | None = option(None, "the step's share of the budget, for the report", hidden=True)


def build_parser() -> Parser:
    from tasks.cli import Parser

    p = Parser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    add_options(p, CheckOptions, required=("report_dir",))
    return p


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.budget <= 0:
        p.error(f"--budget {args.budget:g}: the steps need a positive number of seconds (480 fills a device call)")
    args.report_dir = Path(args.report_dir)
    try:
        args.report_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=args.report_dir):
            pass
    except OSError as e:
        p.error(f"--report-dir {args.report_dir}: cannot write there ({e.strerror or e})")
    args.pretrained = str(Path(args.pretrained or Path(args.pack) / "minilm").resolve())
    args.data_dir = str(Path(args.data_dir or Path(args.pack) / "data").resolve())
    args.train_device = "cuda" if args.device.startswith("cuda") else args.device
    if not (Path(args.pretrained) / "config.json").is_file():
        p.error(f"no encoder at {args.pretrained}: run python -m benchmarks.gpu_pack first, or pass --pretrained")
    if not Path(args.data_dir).is_dir():
        p.error(f"no data at {args.data_dir}: run python -m benchmarks.gpu_pack first, or pass --data-dir")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    if args.step is not None:  # a child: one step, the data already unpacked by the parent
        args.work = Path(args.work_dir)
        run_step(args, args.step, args.step_deadline, args.step_budget)
        return Report(args.report_dir).read()
    deadline = time.time() + args.budget
    report = Report(args.report_dir)
    report.header(f"# GPU check, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
                  f"`python -m benchmarks.gpu_check {' '.join(args.argv)}` at commit {commit(Path(args.pack))}; "
                  f"device {args.device}{', tiny (dry run)' if args.tiny else ''}; budget {args.budget:.0f} s.")
    with work_dir(args.work_dir) as work:
        data = unpack_data(Path(args.data_dir), work)
        selected = args.only or list(STEPS)
        for i, step in enumerate(selected):
            budget = share(step, selected[i:], deadline - time.time())
            if budget < MIN_STEP_S:
                report.add(step, {"status": "skipped", "seconds": 0.0, "budget_s": max(budget, 0.0)},
                           "No time left for this step: rerun it with --only.")
                continue
            report.start(step, budget)
            cmd = [*python(), "-m", "benchmarks.gpu_check", *args.argv, "--step", step, "--step-budget",
                   f"{budget:.1f}", "--step-deadline", f"{time.time() + budget - CHILD_MARGIN_S:.3f}",
                   "--work-dir", str(work), "--data-dir", str(data)]
            print(f"[gpu_check] {step}: up to {budget:.0f} s", flush=True)
            code, seconds = run_logged(cmd, work / f"step-{step}.log", budget)
            if report.read()["steps"][step]["status"] == "running":  # the child died or ran out of time
                report.add(step, {"status": "timeout" if code is None else "failed", "exit": code,
                                  "seconds": seconds, "budget_s": budget},
                           "The step ended without a result; its progress below says how far it got. Its output "
                           f"ends:\n\n```\n{tail(work / f'step-{step}.log')}\n```")
            copy_train_logs(work, report.logs)
            print(f"[gpu_check] {step}: {report.read()['steps'][step]['status']} in {seconds:.0f} s", flush=True)
    data = report.read()
    print(report.md.read_text(encoding="utf-8"))
    return data


if __name__ == "__main__":
    main()
