"""Run a Python script as ``__main__`` and write the process's peak memory to a JSON file when it ends.

The GPU check (benchmarks/gpu_check.py) trains through ``train_multitask.py``, which reports no memory; a first
GPU run must say how much of the card a training run takes. Wrapping the script keeps the training code as users
run it: the peak is read in the same process after the script returns (or exits), from CUDA's allocator
(``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``, when the script used CUDA) and the kernel's peak
resident set. A run killed by a signal writes nothing.

Under torchrun every rank writes its own file: ``OUT`` for rank 0, ``OUT.rankR`` for the others.

Usage:
    python -m benchmarks.peak_memory OUT.json train_multitask.py --epochs 1
    python -m torch.distributed.run --nproc_per_node 1 -m benchmarks.peak_memory OUT.json train_multitask.py
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import sys
from pathlib import Path


def peak() -> dict[str, int | None]:
    """This process's peaks so far: CUDA's allocated and reserved bytes (None where CUDA was not used), and the
    resident set's (``ru_maxrss``, kilobytes on Linux)."""
    torch = sys.modules.get("torch")
    used_cuda = torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
    return {"cuda_max_allocated_bytes": torch.cuda.max_memory_allocated() if used_cuda else None,
            "cuda_max_reserved_bytes": torch.cuda.max_memory_reserved() if used_cuda else None,
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


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
        path.write_text(json.dumps(peak()) + "\n")


if __name__ == "__main__":
    main()
