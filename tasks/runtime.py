"""Process and device policy: seeding, malloc, device choice, autocast dtype, global RNG state.

Every decision that depends on the machine lives here, so the rest of the code
asks one function instead of testing ``device.type`` itself.

Usage:
    configure_malloc()                          # first thing in a process (train_multitask.main does)
    seed_everything(0)
    device = resolve_device("auto")             # cuda when available, else cpu
    dtype = autocast_dtype(None, device)        # bf16 where it is native, else None (fp32)
    with autocast(device, dtype):
        loss = model(...)
    state = rng_state(); set_rng_state(state)   # JSON values, saved with every checkpoint
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import ctypes.util
import logging
import random
import sys
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

DEVICES = ("auto", "cpu", "cuda", "cuda:N", "mps")
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc mallopt parameters (malloc.h)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA): the one place global RNGs are seeded."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def configure_malloc() -> bool:
    """Make glibc keep freed memory for reuse instead of returning it to the OS each step.

    Without this, every large tensor of a CPU training step (activations,
    gradients, the 47 MB word-embedding gradient and AdamW temporaries) is
    mmapped and unmapped again, and the pages are zero-filled on each fault.
    M_MMAP_MAX=0 serves all allocations from the heap; M_TRIM_THRESHOLD at
    its maximum stops the heap from being trimmed. (Raising M_MMAP_THRESHOLD,
    or MALLOC_MMAP_THRESHOLD_ in the environment, cannot do this: glibc caps
    it at 32 MiB, below the embedding gradient.) The gain is measured in
    benchmarks/README.md. Call it first thing in a process. Returns False
    where glibc's mallopt is not available.
    """
    name = ctypes.util.find_library("c")
    if sys.platform != "linux" or name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(_M_MMAP_MAX, 0) == 1
    ok = (mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1) and ok
    return ok


def check_device_string(device: str) -> None:
    """Refuse a device name that is not one of auto, cpu, cuda, cuda:N, mps (no hardware is probed)."""
    if device in ("auto", "cpu", "cuda", "mps") or (device.startswith("cuda:") and device[5:].isdigit()):
        return
    raise ValueError(f"device {device!r} is not one of {', '.join(DEVICES)}")


def resolve_device(name: str) -> torch.device:
    """"auto" -> cuda when available else cpu; an unavailable device is an error."""
    check_device_string(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but torch.cuda.is_available() is False")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device 'mps' requested but torch.backends.mps.is_available() is False")
    return device


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively: AMX tiles (Intel Sapphire Rapids on) or AVX512_BF16 (e.g. AMD Zen 4).

    On both, oneDNN's bf16 matmuls beat fp32 several times over
    (benchmarks/README.md). The probes are torch's private ones, hence the guards.
    """
    probes = (getattr(torch.cpu, "_is_amx_tile_supported", None), getattr(torch.cpu, "_is_avx512_bf16_supported", None))
    return any(probe is not None and probe() for probe in probes)


def autocast_dtype(bf16: bool | None, device: torch.device, cpu_default: bool = True) -> torch.dtype | None:
    """bfloat16 when autocast is on: explicitly, or by default on CUDA with bf16 support and on CPUs with native bf16.

    ``cpu_default`` False keeps CPUs in fp32 unless asked (MLM pretraining, not measured in bf16 on CPU).

    Without native bf16 a CPU emulates it, slower than fp32, so it stays off
    unless asked for. Speed and scores of both precisions: benchmarks/README.md
    and experiments/RESULTS.md.
    """
    if bf16 is None:
        bf16 = ((device.type == "cuda" and torch.cuda.is_bf16_supported())
                or (device.type == "cpu" and cpu_default and cpu_has_native_bf16()))
    if bf16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("bf16 autocast requested but this GPU does not support bfloat16")
    return torch.bfloat16 if bf16 else None


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """torch.autocast on ``device`` in ``dtype``; a no-op context when ``dtype`` is None (full precision)."""
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def configure_device(device: torch.device) -> None:
    """Process-wide math settings of ``device``: TF32 matmuls on CUDA."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


# ---- global RNG state ------------------------------------------------------------------------------------------


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def rng_state() -> dict[str, Any]:
    """The global RNG states of torch (CPU and every CUDA device), python and numpy, as JSON values."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch": _b64(torch.get_rng_state()),
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of ``rng_state``. CUDA states are restored when saved and CUDA is available."""
    torch.set_rng_state(_unb64(state["torch"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state:
        if torch.cuda.is_available():
            torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])
        else:
            logger.warning("the checkpoint has CUDA RNG states but CUDA is not available; dropout masks will differ")
