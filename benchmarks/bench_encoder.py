"""Encoder speed: our BertModel vs transformers.BertModel on the same weights, same process.

Usage:
    python -m benchmarks.bench_encoder                       # embedded MiniLM, CPU fp32
    python -m benchmarks.bench_encoder --seq-lens 32 128 --batch-size 32 --repeats 10
    python -m benchmarks.bench_encoder --device cuda --dtype bf16

For each sequence length and mode (inference = forward under no_grad; train =
forward + backward of the summed outputs) both models run alternately, several
rounds, and the median time of each is reported as sequences/s with the ratio
ours / reference. Batches are full length (no padding), so both models do the
same arithmetic. ``--compile`` adds a row for our encoder under torch.compile
(the reference stays eager). Peak memory is measured per (model, mode, length) in a
fresh child process holding only that model: on CPU the growth of the child's
max resident set from before the model is built to after one step (weights,
gradients and activations), on CUDA the tensors the child allocated on the
device (tasks.runtime.peak_memory_bytes).
Nothing here is asserted; it prints a Markdown table for the README.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from dataclasses import dataclass

import torch

from minbert.pretrained import load_pretrained, resolve_model_dir
from tasks.cli import Parser
from tasks.options import add_options, option
from tasks.runtime import peak_memory_bytes, synchronize


def build_models(model_dir: str | None, device: str, dtype: torch.dtype):
    import transformers  # reference only

    ours, _ = load_pretrained(model_dir)
    d = resolve_model_dir(model_dir)
    ref = transformers.BertModel.from_pretrained(str(d), attn_implementation="sdpa")
    ours.to(device=device, dtype=dtype)
    ref.to(device=device, dtype=dtype)
    return ours, ref


def make_batch(vocab: int, batch: int, seq: int, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000 if vocab > 2000 else 5, vocab, (batch, seq), generator=g)  # past the special tokens
    ids[:, 0], ids[:, -1] = (101, 102) if vocab > 2000 else (2, 3)  # [CLS], [SEP] of BERT's vocabulary (a tiny one's)
    return {
        "input_ids": ids.to(device),
        "attention_mask": torch.ones(batch, seq, dtype=torch.long, device=device),
        "token_type_ids": torch.zeros(batch, seq, dtype=torch.long, device=device),
    }


def step_fn(model: torch.nn.Module, batch: dict, mode: str, is_ref: bool):
    def run():
        if mode == "infer":
            with torch.no_grad():
                out = model(**batch)
        else:
            out = model(**batch)
        h = out.last_hidden_state if is_ref else out["last_hidden_state"]
        p = out.pooler_output if is_ref else out["pooler_output"]
        if mode == "train":
            (h.float().sum() + p.float().sum()).backward()
    return run


def time_pair(fns: dict, device: torch.device, warmup: int, repeats: int, iters: int) -> dict[str, float]:
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):  # alternate so both see the same machine state
        for k, fn in fns.items():
            synchronize(device)
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            synchronize(device)
            times[k].append((time.perf_counter() - t0) / iters)
    return {k: statistics.median(v) for k, v in times.items()}


def _peak_child(q, which, mode, seq, args):
    # Only the measured model, randomly initialised from the checkpoint's config:
    # activation memory does not depend on weight values, and skipping the
    # checkpoint load keeps its transient copy out of the baseline.
    torch.set_num_threads(args.threads)
    from minbert.bert import BertModel
    from minbert.config import BertConfig

    d = resolve_model_dir(args.model)
    device = torch.device(args.device)
    base = peak_memory_bytes(device)  # after imports, before the model (0 on a fresh GPU)
    if which == "ref":
        import transformers
        model = transformers.BertModel(transformers.BertConfig.from_pretrained(str(d)))
        model.config._attn_implementation = "sdpa"
    else:
        model = BertModel(BertConfig.from_json_file(d / "config.json"))
    model.to(device=args.device, dtype=DTYPES[args.dtype]).train(mode == "train")
    batch = make_batch(model.config.vocab_size, args.batch_size, seq, args.device)
    fn = step_fn(model, batch, mode, which == "ref")
    fn()
    synchronize(device)
    q.put((peak_memory_bytes(device) - base) / 2**20)


def peak_mib(which: str, mode: str, seq: int, args) -> float:
    # spawn, not fork: a fork after OpenMP threads have run can deadlock the child
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_peak_child, args=(q, which, mode, seq, args))
    p.start()
    v = q.get()
    p.join()
    return v


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class EncoderBenchOptions:
    """The benchmark's flags."""

    model: str | None = option(None, "checkpoint dir (default: embedded MiniLM)", metavar="DIR")
    device: str = option("cpu", "the device both models run on (cpu, cuda, ...)", metavar="DEVICE")
    dtype: str = option("fp32", "the dtype both models run in", choices=list(DTYPES))
    batch_size: int = option(32, "sequences a batch")
    seq_lens: list[int] = option(help="sequence lengths, a row each", factory=lambda: [32, 128], nargs="+")
    modes: list[str] = option(help="infer: forward under no_grad; train: forward + backward",
                              factory=lambda: ["infer", "train"], choices=["infer", "train"], nargs="+")
    threads: int = option(os.cpu_count(), "torch.set_num_threads")
    repeats: int = option(7, "timed rounds (the median reported)")
    iters: int = option(3, "steps a timed round")
    warmup: int = option(2, "untimed steps of each model first")
    no_memory: bool = option(False, "skip the peak-memory children")
    compile: bool = option(False, "also time our encoder under torch.compile")


def build_parser() -> Parser:
    ap = Parser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n")[0])
    add_options(ap, EncoderBenchOptions)
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = build_parser()
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ours, ref = build_models(args.model, args.device, DTYPES[args.dtype])
    print(f"# torch {torch.__version__}, device {args.device}, {args.dtype}, threads {torch.get_num_threads()}, "
          f"batch {args.batch_size}, layers {ours.config.num_hidden_layers}, hidden {ours.config.hidden_size}")
    print("| mode | seq len | ours seq/s | transformers seq/s | ratio | ours peak MiB | transformers peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for mode in args.modes:
        # train mode keeps dropout on in both (as configured): that is the real training step
        ours.train(mode == "train")
        ref.train(mode == "train")
        for seq in args.seq_lens:
            batch = make_batch(ours.config.vocab_size, args.batch_size, seq, args.device)
            fns = {"ours": step_fn(ours, batch, mode, False), "ref": step_fn(ref, batch, mode, True)}
            if args.compile:
                fns["compiled"] = step_fn(torch.compile(ours, dynamic=False), batch, mode, False)
            t = time_pair(fns, torch.device(args.device), args.warmup, args.repeats, args.iters)
            ours.zero_grad(set_to_none=True)
            ref.zero_grad(set_to_none=True)
            so, sr = args.batch_size / t["ours"], args.batch_size / t["ref"]
            if args.no_memory:
                mo = mr = float("nan")
            else:
                mo, mr = peak_mib("ours", mode, seq, args), peak_mib("ref", mode, seq, args)
            print(f"| {mode} | {seq} | {so:.1f} | {sr:.1f} | {so / sr:.2f} | {mo:.0f} | {mr:.0f} |", flush=True)
            if args.compile:
                sc = args.batch_size / t["compiled"]
                print(f"| {mode} (ours compiled) | {seq} | {sc:.1f} | {sr:.1f} | {sc / sr:.2f} | | |", flush=True)


if __name__ == "__main__":
    main()
