"""Run a Python script as ``__main__`` and write the process's peak memory to a JSON file when it ends.

The GPU check (benchmarks/gpu_check.py) trains through ``train_multitask.py``, which reports no memory; a first
GPU run must say how much of the card a training run takes. Wrapping the script keeps the training code as users
run it: the peak is read in the same process after the script returns (or exits), through tasks.runtime: the
tensors CUDA's allocator held at most on the current GPU (None when the script used no GPU) and the peak resident
set. A run killed by a signal writes nothing.

Under torchrun every rank writes its own file: ``OUT`` for rank 0, ``OUT.rankR`` for the others.

Usage:
    python -m benchmarks.peak_memory OUT.json train_multitask.py --epochs 1
    python -m torch.distributed.run --nproc_per_node 1 -m benchmarks.peak_memory OUT.json train_multitask.py
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import sys
from pathlib import Path


def peak() -> dict[str, int | None]:
    """This process's peaks so far: bytes allocated on the current GPU (None where no GPU was used: the allocator
    then reports 0) and the resident set's."""
    import torch

    from tasks.runtime import cuda_device_count, peak_memory_bytes

    gpu = peak_memory_bytes(torch.device("cuda")) if cuda_device_count() else 0
    return {"cuda_max_allocated_bytes": gpu or None, "max_rss_bytes": peak_memory_bytes(torch.device("cpu"))}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        sys.exit("usage: python -m benchmarks.peak_memory OUT.json SCRIPT [ARGS...]")
    out, script, *rest = argv
    rank = int(os.environ.get("RANK", "0"))
    path = Path(out if rank == 0 else f"{out}.rank{rank}")
    sys.argv = [script, *rest]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        # a record that cannot be made (the script broke its own imports, say) must not hide the script's error
        with contextlib.suppress(Exception):
            from tasks.storage import write_text

            write_text(path, json.dumps(peak()) + "\n")


if __name__ == "__main__":
    main()
