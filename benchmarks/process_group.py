"""Join torchrun's process group and all-reduce once: NCCL on CUDA, gloo on CPU, with any number of processes.

A training run under ``torchrun --nproc_per_node 1`` starts no process group (tasks/training/distributed.py needs
two processes or more), so on a machine with one GPU it never touches NCCL. The GPU check
(benchmarks/gpu_check.py) runs this under torchrun with one process to learn that NCCL initialises and reduces
there, and how long that takes. Rank 0 prints one JSON line: backend, world size, the reduced value and the one
expected (1 + 2 + ... + world size), seconds to initialise and to reduce. Exit status 1 when the value is wrong.

Usage:
    python -m torch.distributed.run --standalone --nproc_per_node 1 -m benchmarks.process_group --device cuda
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tasks.cli import Parser
from tasks.options import add_options, option


@dataclass
class GroupOptions:
    """The command's flag."""

    device: str = option("cuda", "cuda: NCCL; cpu: gloo", choices=["cuda", "cpu"])


def build_parser() -> Parser:
    p = Parser(prog="python -m benchmarks.process_group", description=__doc__.split("\n\n")[0])
    add_options(p, GroupOptions)
    return p


def main(argv: list[str] | None = None) -> dict:
    from tasks.runtime import bind_local_device, distributed_backend, synchronize

    p = build_parser()
    args = p.parse_args(argv)
    if "RANK" not in os.environ:
        p.error("run it under torchrun (python -m torch.distributed.run ... -m benchmarks.process_group)")
    device = bind_local_device(torch.device(args.device), int(os.environ.get("LOCAL_RANK", "0")))
    t0 = time.perf_counter()
    dist.init_process_group(distributed_backend(device))
    t1 = time.perf_counter()
    value = torch.full((1,), float(dist.get_rank() + 1), device=device)
    dist.all_reduce(value)
    synchronize(device)
    t2 = time.perf_counter()
    world = dist.get_world_size()
    result = {"backend": dist.get_backend(), "world_size": world, "all_reduce": value.item(),
              "expected": world * (world + 1) / 2, "init_s": round(t1 - t0, 2), "all_reduce_s": round(t2 - t1, 3)}
    dist.destroy_process_group()
    if int(os.environ["RANK"]) == 0:
        print(json.dumps(result), flush=True)
    if result["all_reduce"] != result["expected"]:
        sys.exit(1)
    return result


if __name__ == "__main__":
    main()
