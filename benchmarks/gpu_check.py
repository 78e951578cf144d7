"""The GPU check: everything a lent GPU should show, in one call of at most 8 minutes, with a report written as it goes.

A GPU machine is lent to a session only by chance, for 15 minutes of device time, with no
package registry and at most 64 MiB of files travelling with a call (benchmarks/README.md,
"The GPU check", gives the call). So the check is prepared and tested here, and on the day a
GPU is lent it runs in one call. Its steps, in order, each in a child process with its own
time budget (seconds of ``--budget``, 480 by default):

  machine    GPU name, torch / CUDA versions, the measured bf16, TF32 and fp32 matmul peaks and the
             device-to-device copy bandwidth                                                   (30 s)
  tests      the gpu-marked tests: a few training steps of every objective with CUDA's sync debug mode
             at "error", fp32 and bf16 (no host sync inside a step)                               (80 s)
  default    the default recipe end to end (bf16 on CUDA): wall time, train seq/s, dev scores beside
             the CPU runs' mean over seeds (experiments/RESULTS.md); more seeds while its budget
             lasts                                                                              (160 s)
  resume     a --deterministic run killed (SIGKILL) mid-epoch and resumed, against the same run
             uninterrupted: predictions and best weights compared byte for byte                   (70 s)
  speed      our encoder against transformers.BertModel on the same weights, bf16 and fp32, forward
             and forward + backward, at MiniLM's shape and at bert-base's (random weights); the
             multitask training step's MFU against the bf16 peak, eager and compiled            (110 s)
  torchrun   a short run under torchrun, one process (the command a multi-GPU user types)           (30 s)

Every step appends its section to ``<report-dir>/report.md`` and its numbers to
``report.json`` when it ends, so a call cut short still returns what finished; a step that
fails or runs out of time is recorded as such and the next one starts. ``--only STEP ...``
reruns some steps, sharing ``--budget`` among them in proportion to their budgets above.

The machine lacks the embedded MiniLM and the data: ``python -m benchmarks.gpu_pack`` writes
them into ``.gpu/`` here (MiniLM in float16, the data gzip-compressed), which travels with the
call; gzip-compressed data files are unpacked into ``--work-dir`` first. Every training run is
given ``--pretrained``, ``--sts-prior-model`` and ``--sst-prior-model``: the packed encoder.

``--device cpu --tiny`` is the dry run: every step at tiny sizes on the CPU (the gpu-marked
tests are then skipped), writing the same report; tests/benchmarks/test_gpu_check.py runs it on
a tiny pack, so the script cannot rot between the days a GPU is lent.

Usage (benchmarks/README.md):
    python -m benchmarks.gpu_pack                                        # here, on the CPU machine: .gpu/
    PYTHONPATH=. python3 -m benchmarks.gpu_check --report-dir "$OUT"     # on the GPU machine
    python -m benchmarks.gpu_check --report-dir /tmp/r --device cpu --tiny --pack /tmp/tiny-pack   # the dry run
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STEPS = {"machine": 30, "tests": 80, "default": 160, "resume": 70, "speed": 110, "torchrun": 30}  # seconds
RESULTS = ROOT / "experiments" / "RESULTS.md"
DEFAULT_SEEDS = 3  # the default recipe's runs at most: seed 0, and 1 and 2 if time allows
# Training flags the dry run adds to fit the tiny model (64 positions) and run in seconds.
TINY_TRAIN = ["--limit", "64", "--epochs", "1", "--max-length", "32", "--batch-size", "8", "--eval-batch-size", "16",
              "--log-every", "2"]


# ---- the report --------------------------------------------------------------------------------------------------


class Report:
    """report.md (a section per step, appended) and report.json ({"steps": {name: result}}, rewritten)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.md, self.json = directory / "report.md", directory / "report.json"

    def read(self) -> dict:
        return json.loads(self.json.read_text()) if self.json.is_file() else {"steps": {}}

    def add(self, step: str, result: dict, text: str) -> None:
        data = self.read()
        data["steps"][step] = result
        self.json.write_text(json.dumps(data, indent=2, default=str) + "\n")
        with open(self.md, "a", encoding="utf-8") as f:
            f.write(f"\n## {step}: {result['status']} ({result['seconds']:.0f} s of {result['budget_s']:.0f})\n\n"
                    f"{text.strip()}\n")

    def header(self, args: argparse.Namespace) -> None:
        with open(self.md, "a", encoding="utf-8") as f:
            f.write(f"# GPU check, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
                    f"`python -m benchmarks.gpu_check {' '.join(args.argv)}` at commit {commit()}; "
                    f"device {args.device}{', tiny (dry run)' if args.tiny else ''}; budget {args.budget:.0f} s.\n")


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


# ---- what the steps share ----------------------------------------------------------------------------------------


def python() -> list[str]:
    return [sys.executable]


def child_env() -> dict[str, str]:
    """The environment of every child: the project importable without an install, output unbuffered."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def run_logged(cmd: list[str], log: Path, timeout: float, cwd: Path = ROOT) -> tuple[int | None, float]:
    """Run ``cmd`` with its output in ``log``; (exit status or None when it ran out of ``timeout``, seconds)."""
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=child_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            stop(proc)
            code = None
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


def tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    return "\n".join(text.splitlines()[-lines:])


def train_flags(args: argparse.Namespace, out_dir: Path, *more: str) -> list[str]:
    """``train_multitask.py`` flags of a check run: the packed encoder everywhere, the unpacked data."""
    tiny = TINY_TRAIN if args.tiny else []
    return [str(ROOT / "train_multitask.py"), "--pretrained", args.pretrained, "--sts-prior-model", args.pretrained,
            "--sst-prior-model", args.pretrained, "--data-dir", args.data_dir, "--out-dir", str(out_dir),
            "--overwrite", "--device", args.train_device, *tiny, *more]


def final_record(run: Path) -> dict | None:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return None
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return next((r for r in reversed(records) if r.get("final")), None)


def seq_per_s(run: Path) -> float | None:
    """The median of the throughputs the run's progress lines logged (train.log)."""
    log = run / "train.log"
    values = [float(v) for v in re.findall(r"\| ([\d.]+) seq/s", log.read_text())] if log.is_file() else []
    return statistics.median(values) if values else None


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


# ---- the steps ---------------------------------------------------------------------------------------------------


def step_machine(args: argparse.Namespace, budget: float) -> tuple[dict, str]:
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

    device = resolve_device(args.device)
    info = device_info(device)
    import transformers
    info["transformers"] = transformers.__version__
    n = 512 if args.tiny else 8192
    min_time = 0.05 if args.tiny else 0.3
    peaks = {"bf16": matmul_flops_per_s((n, n, n), torch.bfloat16, device, min_time)}
    configure_device(device)  # what a training run sets: TF32 on CUDA
    configured = f"fp32 as trained ({fp32_matmul_precision(device)})"
    peaks[configured] = matmul_flops_per_s((n, n, n), torch.float32, device, min_time)
    with no_tf32():
        peaks["fp32"] = matmul_flops_per_s((n // 2, n // 2, n // 2), torch.float32, device, min_time)
    numel = (2**20 if args.tiny else 2**28)  # 1 GiB of float32 on a GPU
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
    result = {**info, "matmul_tflop_s": {k: v / 1e12 for k, v in peaks.items()},
              "matmul_side": {"bf16": n, configured: n, "fp32": n // 2},
              "copy_tb_s": copy / 1e12}
    rows = [[k, f"{v / 1e12:.1f}" if v > 1e12 else f"{v / 1e12:.3f}"] for k, v in peaks.items()]
    text = (f"{info.get('name', info['device'])}, torch {info['torch']}, CUDA {info.get('cuda', '-')}, "
            f"transformers {info['transformers']}"
            + (f", {info['multiprocessors']} SMs, {info['memory_gib']} GiB, compute capability {info['capability']}"
               if "name" in info else "") + "\n\n"
            + table(["matmul (square, side as in report.json)", "TFLOP/s"], rows)
            + f"\n\nDevice-to-device copy: {copy / 1e12:.2f} TB/s (bytes read + written).")
    return result, text


def tests_command() -> list[str]:
    """The tests step's pytest call, run in the repository root."""
    return [*python(), "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rs", "tests"]


def step_tests(args: argparse.Namespace, budget: float) -> tuple[dict, str]:
    log = args.work / "tests.log"
    code, seconds = run_logged(tests_command(), log, budget)
    summary = next((ln for ln in reversed(tail(log, 40).splitlines()) if re.search(r"\d+ (passed|skipped|failed)",
                                                                                   ln)), "")
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors|deselected)", summary)}
    status = "timeout" if code is None else "ok" if code == 0 else "failed"
    result = {"status": status, "exit": code, "counts": counts, "summary": summary.strip("= ")}
    return result, f"`pytest -m gpu tests`: {summary.strip('= ') or 'no summary'}\n\n```\n{tail(log)}\n```"


def step_default(args: argparse.Namespace, budget: float) -> tuple[dict, str]:
    deadline = time.perf_counter() + budget
    runs, rows = [], []
    for seed in range(2 if args.tiny else DEFAULT_SEEDS):  # the first, then more while the budget lasts
        left = deadline - time.perf_counter()
        if runs and left < 1.15 * runs[0]["wall_s"]:
            break
        out = args.work / f"default-seed{seed}"
        code, wall = run_logged([*python(), *train_flags(args, out, *CPU_REFERENCE_RECIPE, "--seed", str(seed))],
                                args.work /
                                f"default-seed{seed}.log", left)
        record = final_record(out) or {}
        dev = record.get("dev", {})
        run = {"seed": seed, "exit": code, "wall_s": round(wall, 1), "train_seq_s": seq_per_s(out), "dev": dev}
        runs.append(run)
        rows.append([seed, f"{wall:.0f}", f"{run['train_seq_s']:.0f}" if run["train_seq_s"] else "–",
                     *(f"{dev[k]:.4f}" if dev.get(k) is not None else "–" for k in ("sst_acc", "para_acc", "sts_r",
                                                                                    "overall"))])
        if code != 0:
            break
    cpu = cpu_reference()
    if cpu:
        rows.append([f"CPU: {cpu['row']} (experiments/RESULTS.md)", "", "", cpu.get("SST acc", ""),
                     cpu.get("Para acc", ""), cpu.get("STS r", ""), cpu.get("overall", "")])
    ok = bool(runs) and runs[0]["exit"] == 0
    status = "ok" if ok else "timeout" if runs and runs[0]["exit"] is None else "failed"
    text = (f"`python train_multitask.py {' '.join(CPU_REFERENCE_RECIPE)} --seed K` with the packed encoder ({'tiny flags: ' + ' '.join(TINY_TRAIN) if args.tiny else 'the default recipe'}):\n\n"
            + table(["seed", "wall s", "train seq/s", "SST acc", "Para acc", "STS r", "overall"], rows))
    if not ok:
        text += f"\n\n```\n{tail(args.work / 'default-seed0.log')}\n```"
    return {"status": status, "runs": runs, "cpu_reference": cpu}, text


def step_resume(args: argparse.Namespace, budget: float) -> tuple[dict, str]:
    deadline = time.perf_counter() + budget
    size = (["--limit", "256", "--epochs", "2", "--checkpoint-every", "2"] if args.tiny else
            ["--limit", "3000", "--epochs", "2", "--checkpoint-every", "20"])
    flags = [*size, "--deterministic", "--seed", "0"]  # after the tiny flags: these sizes replace theirs
    whole, cut = args.work / "resume-whole", args.work / "resume-cut"
    code, _ = run_logged([*python(), *train_flags(args, whole, *flags)], args.work / "resume-whole.log",
                         deadline - time.perf_counter())
    if code != 0:
        return {"status": "timeout" if code is None else "failed", "stage": "uninterrupted run"}, \
            f"The uninterrupted run did not finish:\n\n```\n{tail(args.work / 'resume-whole.log')}\n```"
    killed_at = kill_mid_epoch([*python(), *train_flags(args, cut, *flags)], cut, args.work / "resume-cut.log",
                               deadline - time.perf_counter())
    code, _ = run_logged([*python(), str(ROOT / "train_multitask.py"), "--resume", "--out-dir", str(cut)],
                         args.work / "resume-resumed.log", deadline - time.perf_counter())
    if code != 0:
        return {"status": "timeout" if code is None else "failed", "stage": "resumed run", "killed_at": killed_at}, \
            f"The resumed run did not finish:\n\n```\n{tail(args.work / 'resume-resumed.log')}\n```"
    files = sorted(p.relative_to(whole).as_posix() for p in (whole / "predictions").iterdir()) + [
        "checkpoints/best/model.safetensors"]
    same = {f: (whole / f).read_bytes() == (cut / f).read_bytes() for f in files}
    ok = all(same.values()) and killed_at is not None
    text = (f"`--deterministic {' '.join(size)}`: killed with SIGKILL at {killed_at or 'no checkpoint (not killed)'}, "
            f"then `--resume`; {sum(same.values())} of {len(same)} files byte-identical to the uninterrupted run's"
            + ("" if all(same.values()) else ": differ: " + ", ".join(f for f, s in same.items() if not s)) + ".")
    return {"status": "ok" if ok else "failed", "killed_at": killed_at, "identical": same}, text


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


def random_checkpoint(directory: Path, vocab: Path, **shape: int) -> Path:
    """A BERT checkpoint directory with random weights of ``shape`` (bert-base's by default) and ``vocab``."""
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
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    config.to_json_file(directory / "config.json")
    shutil.copy2(vocab, directory / "vocab.txt")
    return directory


def step_speed(args: argparse.Namespace, budget: float) -> tuple[dict, str]:
    import torch

    from benchmarks.bench_encoder import build_models, make_batch, step_fn, time_pair
    from benchmarks.bench_multitask import benchmark
    from tasks.config import TrainConfig
    from tasks.runtime import resolve_device

    deadline = time.perf_counter() + budget
    device = resolve_device(args.device)
    vocab = Path(args.pretrained) / "vocab.txt"
    big = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
           "max_position_embeddings": 64} if args.tiny else {}
    shapes = {"MiniLM": args.pretrained,
              "bert-base": str(random_checkpoint(args.work / "bert-base-random", vocab, **big))}
    batch, seq = (4, 16) if args.tiny else (32, 128)
    repeats, iters = (2, 1) if args.tiny else (5, 3)
    encoder_rows, encoder = [], {}
    for shape, model_dir in shapes.items():
        for dtype_name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
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
                encoder_rows.append([shape, dtype_name, "forward" if mode == "infer" else "forward + backward",
                                     f"{batch / t['ours']:,.0f}", f"{batch / t['ref']:,.0f}",
                                     f"{t['ref'] / t['ours']:.2f}"])
            del ours, ref
    steps, warmup, rounds = (2, 1, 1) if args.tiny else (16, 3, 2)
    step_rows, step = [], {}
    for shape, model_dir in shapes.items():
        left = deadline - time.perf_counter()
        # compiling costs about a minute on a GPU: only where that much is left (eager alone needs far less); the
        # dry run leaves it out (a CPU compile of each model takes minutes; tests/benchmarks/test_bench_multitask.py
        # runs the compile variant)
        variants = ["ours", "compile"] if left > 60 and not args.tiny else ["ours"] if left > 10 else []
        if "compile" not in variants:
            why = "not in the dry run" if args.tiny else "not run: out of time"
            step_rows.append([shape, "torch.compile" if variants else "eager and torch.compile", why, "", ""])
        if not variants:
            continue
        cfg = TrainConfig(data_dir=args.data_dir, pretrained=model_dir, device=args.train_device,
                          max_length=32 if args.tiny else 128, sst_phrases=None)  # as bench_multitask's main
        res = benchmark(cfg, variants, steps=steps, warmup=warmup, rounds=rounds, memory=False,
                        square=512 if args.tiny else 8192, peak_min_time=0.05 if args.tiny else 0.2,
                        log=lambda s: None)
        peak = res["peak_flops"]
        for name, v in res["variants"].items():
            step.setdefault(shape, {})[name] = {"train_seq_s": v["train_seq_s"], "train_mfu": v["train_mfu"],
                                                "peak_dtype": peak["reference_dtype"],
                                                "peak_tflop_s": peak["reference_flop_s"] / 1e12}
            step_rows.append([shape, "eager" if name == "ours" else "torch.compile", f"{v['train_seq_s']:,.0f}",
                              f"{100 * v['train_mfu']:.1f}%",
                              f"{peak['reference_dtype']} {peak['reference_flop_s'] / 1e12:.1f} TFLOP/s"])
    text = (f"Encoder alone, batch {batch} × {seq} tokens, ours and transformers.BertModel (sdpa) on the same "
            "weights, alternating:\n\n"
            + table(["shape", "dtype", "pass", "ours seq/s", "transformers seq/s", "ours ÷ transformers"],
                    encoder_rows)
            + "\n\nThe multitask training step (Trainer.train_step on the default recipe's batches, "
              "benchmarks/bench_multitask.py), MFU on real tokens against the peak measured in the same process:\n\n"
            + table(["shape", "step", "train seq/s", "MFU", "peak"], step_rows))
    return {"encoder": encoder, "step": step}, text


def step_torchrun(args: argparse.Namespace, budget: float) -> tuple[dict, str]:
    out = args.work / "torchrun"
    size = [] if args.tiny else ["--limit", "2000", "--epochs", "1"]
    cmd = [*python(), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
           *train_flags(args, out, *size)]
    code, wall = run_logged(cmd, args.work / "torchrun.log", budget)
    record = final_record(out) or {}
    status = "ok" if code == 0 and record else "timeout" if code is None else "failed"
    text = (f"`torchrun --nproc_per_node=1 train_multitask.py {' '.join(size)}`: exit {code}, {wall:.0f} s, "
            f"dev overall {record.get('dev', {}).get('overall', math.nan):.4f}. With one process the run takes torchrun's "
            "environment but starts no process group (tasks/training/distributed.py starts NCCL for 2 or more "
            "processes, which needs 2 GPUs).")
    if status != "ok":
        text += f"\n\n```\n{tail(args.work / 'torchrun.log')}\n```"
    return {"status": status, "exit": code, "wall_s": round(wall, 1), "dev": record.get("dev")}, text


STEP_FUNCTIONS: dict[str, Callable[[argparse.Namespace, float], tuple[dict, str]]] = {
    "machine": step_machine, "tests": step_tests, "default": step_default, "resume": step_resume,
    "speed": step_speed, "torchrun": step_torchrun}


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


def budgets(selected: list[str], total: float) -> dict[str, float]:
    """Each selected step's seconds: its share of ``total`` in proportion to STEPS."""
    weight = sum(STEPS[s] for s in selected)
    return {s: total * STEPS[s] / weight for s in selected}


def run_step(args: argparse.Namespace, step: str, budget: float) -> None:
    """One step in this process (the child): its result and section into the report, also when it fails."""
    report = Report(args.report_dir)
    t0 = time.perf_counter()
    try:
        result, text = STEP_FUNCTIONS[step](args, budget)
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


def parse(argv: list[str] | None) -> argparse.Namespace:
    from tasks.cli import Parser

    p = Parser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--report-dir", required=True, help="where report.md and report.json go ($OUT on the GPU machine)")
    p.add_argument("--pack", default=".gpu", help="the folder python -m benchmarks.gpu_pack wrote")
    p.add_argument("--pretrained", default=None, help="the encoder (default: <pack>/minilm)")
    p.add_argument("--data-dir", default=None, help="the task files, plain or *.csv.gz (default: <pack>/data)")
    p.add_argument("--device", default="cuda", help="cuda for the check, cpu for the dry run")
    p.add_argument("--tiny", action="store_true", help="every step at tiny sizes (the dry run)")
    p.add_argument("--only", nargs="+", choices=list(STEPS), default=None, help="run these steps only")
    p.add_argument("--budget", type=float, default=480.0, help="seconds for all the steps together")
    p.add_argument("--work-dir", default=None, help="runs and logs (default: a temporary directory)")
    p.add_argument("--step", choices=list(STEPS), default=None, help=argparse.SUPPRESS)  # a child's one step
    p.add_argument("--step-budget", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.report_dir = Path(args.report_dir)
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
        run_step(args, args.step, args.step_budget)
        return Report(args.report_dir).read()
    report = Report(args.report_dir)
    report.header(args)
    t_start = time.perf_counter()
    with work_dir(args.work_dir) as work:
        data = unpack_data(Path(args.data_dir), work)
        for step, budget in budgets(args.only or list(STEPS), args.budget).items():
            left = args.budget - (time.perf_counter() - t_start)
            budget = min(budget, left)
            if budget < 5:
                report.add(step, {"status": "skipped", "seconds": 0.0, "budget_s": budget},
                           "No time left for this step: rerun it with --only.")
                continue
            # the child gets its budget less its own start-up; the parent stops it a little after
            cmd = [*python(), "-m", "benchmarks.gpu_check", *args.argv, "--step", step, "--step-budget",
                   str(max(budget - 8, 1)), "--work-dir", str(work), "--data-dir", str(data)]
            print(f"[gpu_check] {step}: up to {budget:.0f} s", flush=True)
            code, seconds = run_logged(cmd, work / f"step-{step}.log", budget + 10)
            if step not in Report(args.report_dir).read()["steps"]:  # the child died or ran out of time
                report.add(step, {"status": "timeout" if code is None else "failed", "exit": code,
                                  "seconds": seconds, "budget_s": budget},
                           f"The step ended without a result:\n\n```\n{tail(work / f'step-{step}.log')}\n```")
            print(f"[gpu_check] {step}: {Report(args.report_dir).read()['steps'][step]['status']} in {seconds:.0f} s",
                  flush=True)
    data = Report(args.report_dir).read()
    print((args.report_dir / "report.md").read_text(encoding="utf-8"))
    return data


if __name__ == "__main__":
    main()
