"""Data-parallel training across processes started by torchrun: the process group and its collectives.

Usage:
    torchrun --nproc_per_node=2 train_multitask.py --batch-size 32 ...   # 2 ranks, 16 examples each per step

    from tasks.training import distributed
    device = distributed.setup(resolve_device("auto"))   # joins the group when WORLD_SIZE > 1; cuda -> cuda:LOCAL_RANK
    mine = distributed.shard(indices)                     # this rank's share of a global batch
    loss.backward(); distributed.all_reduce_gradients(params)   # gradients averaged over ranks
    if distributed.is_main(): write_files()
    distributed.cleanup()

The rank, world size and local rank come from torchrun's environment
variables RANK, WORLD_SIZE and LOCAL_RANK; without them (a plain ``python``
process) everything here is a no-op for one process. The backend is NCCL when
the device is CUDA and gloo on CPU. Host-side values (which gradients exist,
the logged loss sums, RNG states, evaluation results) travel over a separate
gloo group, so under NCCL they never wait on the GPU.

Semantics (the Trainer, tasks.training.trainer, builds on them):
- ``batch_size`` is the global batch: every rank builds the same schedule from
  the same seed (which stream comes next, which indices form each global
  batch), and rank r trains on ``indices[r::world]``. Every batch size must be
  a multiple of the world size (``check_config``), so full batches split into
  equal shards; a partial last batch may split unequally, even leave a rank
  with nothing, and the trainer weights each rank's loss by its share.
- Gradients are averaged with an explicit all-reduce after ``backward()``
  (``all_reduce_gradients``), not by DistributedDataParallel: a step trains
  one task's head (the others get no gradient), objectives run the model
  several times per step (SMART, SimCSE, RIFT's attack) and own parameters
  outside it (RIFT's projections), and the set of parameters that receive a
  gradient can differ between ranks (RIFT's per-class projections, a rank
  with an empty shard). One all-reduce over every trainable parameter after
  backward handles all of these; the price is that communication does not
  overlap with the backward pass as DDP's bucketed hooks do.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tasks.checkpoint import objectives_state, rank_objectives_file
from tasks.runtime import bind_local_device, cuda_device_count, distributed_backend, torchrun_env
from tasks.storage import save_tensors

# Long enough for rank 0's dev evaluation between epochs (the other ranks wait in a collective meanwhile).
TIMEOUT = datetime.timedelta(hours=1)


# Gradients are all-reduced in flat buckets of at most this many elements (64 MiB in fp32).
BUCKET_NUMEL = 1 << 24


_cpu_group: Any = None  # gloo group for host-side values; the default group itself on CPU


def is_distributed() -> bool:
    """Whether this process is one rank of several (the process group is up)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else torchrun_env()[1]


def rank() -> int:
    return dist.get_rank() if is_distributed() else torchrun_env()[0]


def is_main() -> bool:
    """Rank 0: the one process that logs, evaluates and writes files."""
    return rank() == 0


def check_config(batch_sizes: dict[str, int], device: str, world: int | None = None) -> None:
    """Refuse, with a sentence, what cannot run on ``world`` ranks (default: the environment's). Reads no data."""
    world = torchrun_env()[1] if world is None else world
    if world == 1:
        return
    if not dist.is_available():
        raise ValueError(f"WORLD_SIZE={world}, but this torch build has no torch.distributed")
    bad = {s: b for s, b in batch_sizes.items() if b % world}
    if bad:
        raise ValueError(f"batch sizes {bad} are not multiples of the {world} processes: --batch-size is the global "
                         f"batch, split evenly over the ranks (rank r takes every {world}th example); use a multiple "
                         f"of {world}")
    if device.startswith("cuda:"):
        raise ValueError(f"--device {device} names one GPU for all {world} processes; use --device cuda (or auto): "
                         "each rank takes cuda:LOCAL_RANK")
    if device == "mps":
        raise ValueError("distributed training runs on cpu (gloo) or cuda (nccl), not mps")
    gpus = cuda_device_count()
    if device == "cuda" or (device == "auto" and gpus):
        local = torchrun_env()[2]
        if local >= gpus:
            raise ValueError(f"LOCAL_RANK={local}, but this machine has {gpus} CUDA device(s): "
                             "start at most one process per GPU (--nproc_per_node)")


def setup(device: torch.device) -> torch.device:
    """Join torchrun's process group (once per process) and return this rank's device.

    With one process: ``device`` unchanged, nothing initialized. With several:
    CUDA becomes cuda:LOCAL_RANK (NCCL), CPU stays cpu (gloo).
    """
    global _cpu_group
    rank_, world, local = torchrun_env()
    if world == 1:
        return device
    backend = distributed_backend(device)  # raises for a device type torchrun cannot use
    device = bind_local_device(device, local)
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank_, world_size=world, timeout=TIMEOUT)
        _cpu_group = dist.new_group(backend="gloo", timeout=TIMEOUT) if backend == "nccl" else dist.group.WORLD
    elif _cpu_group is None:  # a group someone else started
        _cpu_group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo",
                                                                                           timeout=TIMEOUT)
    if dist.get_world_size() != world or dist.get_rank() != rank_:
        raise RuntimeError(f"the process group ({dist.get_rank()} of {dist.get_world_size()}) does not match "
                           f"RANK={rank_} WORLD_SIZE={world}")
    return device


def cleanup() -> None:
    """Leave the process group (end of a torchrun process); a no-op without one."""
    global _cpu_group
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _cpu_group = None


def barrier() -> None:
    if is_distributed():
        dist.barrier(group=_cpu_group)


def shard(indices: Sequence[int]) -> list[int]:
    """This rank's examples of a global batch: every world-th one from position rank (balanced lengths)."""
    return list(indices[rank()::world_size()])


def rank_seed(seed: int, rank_: int, *more: int) -> int:
    """A seed for rank ``rank_`` > 0's own dropout stream, from the run seed (and ``more``) by a stable hash."""
    digest = hashlib.sha256(repr(("rank", seed, rank_, *more)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def all_reduce_gradients(params: Sequence[nn.Parameter], bucket_numel: int = BUCKET_NUMEL) -> None:
    """Replace every ``.grad`` by its mean over the ranks.

    A parameter without a gradient on some rank counts as zeros there; one
    without a gradient on every rank keeps ``grad = None`` (AdamW then skips it,
    exactly as in one process). Which parameters have gradients is agreed on
    the host (gloo), the gradients themselves are summed in flat buckets.
    """
    if not is_distributed():
        return
    world = dist.get_world_size()
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)
    dist.all_reduce(has, group=_cpu_group)
    live = [p for p, n in zip(params, has.tolist()) if n]
    for p in live:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in live]
    buckets: dict[tuple, list[list[torch.Tensor]]] = {}  # (dtype, device) -> buckets of at most bucket_numel
    sizes: dict[tuple, int] = {}
    for g in grads:
        key = (g.dtype, g.device)
        chain = buckets.setdefault(key, [[]])
        if chain[-1] and sizes[key] + g.numel() > bucket_numel:
            chain.append([])
            sizes[key] = 0
        chain[-1].append(g)
        sizes[key] = sizes.get(key, 0) + g.numel()
    for chain in buckets.values():
        for bucket in chain:
            flat = torch.cat([g.reshape(-1) for g in bucket])  # (Σ numel,)
            dist.all_reduce(flat)
            flat.div_(world)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()


def sum_over_ranks(values: dict[Any, float]) -> dict[Any, float]:
    """Key-wise sums of host-side numbers over the ranks; keys missing on a rank count as 0."""
    if not is_distributed():
        return dict(values)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, values, group=_cpu_group)
    out: dict[Any, float] = {}
    for part in gathered:
        for k, v in part.items():
            out[k] = out.get(k, 0) + v
    return out


def gather(value: Any) -> list[Any]:
    """Every rank's ``value`` (picklable), in rank order, on every rank."""
    if not is_distributed():
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value, group=_cpu_group)
    return gathered


def broadcast_from_main(value: Any) -> Any:
    """Rank 0's ``value`` (picklable) on every rank; the other ranks wait here until rank 0 sends it."""
    if not is_distributed():
        return value
    box = [value if is_main() else None]
    dist.broadcast_object_list(box, src=0, group=_cpu_group)
    return box[0]


# ---- a checkpoint's rank-local files (tasks/checkpoint.py: objectives.rank<r>.safetensors) ----


def save_rank_objectives(objectives: Sequence[nn.Module], model: nn.Module, rank: int, world: int) -> None:
    """Rank r ≥ 1's part of a checkpoint: its rank-local objective state, written into rank 0's temporary
    directory (whose path rank 0 sends) before rank 0 swaps it in. Nothing without rank-local state."""
    own = objectives_state(objectives, model, rank_local_only=True) if world > 1 else {}
    if own:
        tmp = Path(broadcast_from_main(None))
        save_tensors(tmp / rank_objectives_file(rank), own)
        barrier()


@contextlib.contextmanager
def rank_objectives_saved(tmp: Path, objectives: Sequence[nn.Module], model: nn.Module, world: int) -> Iterator[None]:
    """Rank 0's side of ``save_rank_objectives``: send ``tmp``, and end the block only once every rank has
    written its file there, so that ``atomic_directory`` fsyncs and swaps in all ranks' files at once."""
    needed = world > 1 and bool(objectives_state(objectives, model, rank_local_only=True))
    if needed:
        broadcast_from_main(str(tmp))
    yield
    if needed:
        barrier()
