"""Process and device policy: seeding, malloc, device choice, autocast dtype, TF32, determinism, RNG state,
synchronization, pinning and peak memory.

Every decision that depends on the machine lives here, so the rest of the code
asks one function instead of testing ``device.type`` itself.

Resume guarantees. On CPU a resumed run repeats the interrupted one bit for bit
(tested). On CUDA it does only with ``--deterministic``
(``torch.use_deterministic_algorithms`` and a fixed cuBLAS workspace) and on the
same GPU model and count: without it, atomics in some backward kernels (index_add,
embedding backward, SDPA) sum in a varying order, so a resumed run drifts from the
uninterrupted one by rounding. The checkpoint keeps the training device's CUDA RNG
state only, so a run resumes on a machine with fewer visible GPUs.

Usage:
    configure_malloc()                          # first thing in a process (train_multitask.main does)
    seed_everything(0)
    device = resolve_device("auto")             # cuda when available, else cpu
    configure_device(device, deterministic=False)
    dtype = autocast_dtype(None, device)        # bf16 where it is native, fp16 on a GPU without it, else None (fp32)
    scaler = loss_scaler(device, dtype)         # torch.amp.GradScaler for fp16, else None
    with autocast(device, dtype):
        loss = model(...)
        with full_precision(device):            # fp32 and no TF32 for a precision-sensitive region
            sims = q.float() @ k.float().T
    state = rng_state(device); set_rng_state(state, device)   # JSON values, saved with every checkpoint
    reset_peak_memory(device); synchronize(device); peak_memory_bytes(device) - memory_bytes(device)
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import ctypes.util
import logging
import os
import random
import resource
import sys
from collections.abc import Iterator
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
    gradients, the word-embedding gradient and AdamW temporaries) is
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


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer (torchrun sets it)") from None


def torchrun_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) in a plain process."""
    rank, world, local = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1), _env_int("LOCAL_RANK", 0)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} and WORLD_SIZE={world} do not describe a process group")
    return rank, world, local


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


def cuda_bf16_native() -> bool:
    """Whether the current GPU multiplies bf16 in hardware (Ampere on). torch's plain ``is_bf16_supported()`` also
    counts emulation (V100, T4), where bf16 autocast is slower than fp32."""
    return torch.cuda.is_bf16_supported(including_emulation=False)


def autocast_dtype(bf16: bool | None, device: torch.device, cpu_default: bool = True,
                   fp16: bool = False) -> torch.dtype | None:
    """The autocast precision of a run: float16, bfloat16, or None (fp32).

    By default (``bf16`` None, ``fp16`` False): bf16 on GPUs and CPUs that multiply bf16 natively (Ampere on;
    AMX or AVX512_BF16); fp16 on a GPU without native bf16 (T4, V100: their tensor cores multiply fp16, and fp16
    needs dynamic loss scaling, which the training loop adds: ``loss_scaler``); fp32 on a CPU without native bf16
    (emulated bf16 or fp16 there is slower than fp32). ``cpu_default`` False keeps CPUs in fp32 unless asked
    (MLM pretraining, not measured in bf16 on CPU).

    ``bf16`` True or False asks for bf16 or fp32. An explicit ``bf16=True`` on a GPU that only emulates bf16 is
    allowed (it computes the same thing, slowly) with a warning; on a GPU with no bf16 at all it is an error.
    ``fp16`` True asks for fp16 anywhere (on a CPU torch emulates it: slower than fp32, but the very path a T4
    takes, loss scaling included); with ``bf16`` set too it is a ValueError (two precisions). Speed and scores of
    the precisions: benchmarks/README.md and experiments/RESULTS.md.
    """
    cuda = device.type == "cuda"
    if fp16:
        if bf16 is not None:
            raise ValueError(f"--fp16 and --{'' if bf16 else 'no-'}bf16 ask for two precisions: give one")
        return torch.float16
    if bf16 is None:
        if cuda and not cuda_bf16_native():
            return torch.float16
        bf16 = (cuda and cuda_bf16_native()) or (device.type == "cpu" and cpu_default and cpu_has_native_bf16())
    elif bf16 and cuda and not cuda_bf16_native():
        if not torch.cuda.is_bf16_supported(including_emulation=True):
            raise ValueError("bf16 autocast requested but this GPU does not support bfloat16")
        logger.warning("this GPU emulates bf16 (no native bf16 matmuls): bf16 autocast will be slower than fp32")
    return torch.bfloat16 if bf16 else None


def precision_note(bf16: bool | None, device: torch.device, dtype: torch.dtype | None,
                   cpu_default: bool = True, fp16: bool = False) -> str:
    """What ``autocast_dtype`` (with the same ``cpu_default``) chose and why, for a run's first log line."""
    scaled = "fp16 autocast with dynamic loss scaling"
    if fp16:
        return f"{scaled} (--fp16" + ("; emulated on a CPU: slower than fp32)" if device.type == "cpu" else ")")
    if bf16 is not None:
        return "bf16 autocast (--bf16)" if dtype is not None else "fp32 (--no-bf16)"
    unit = "GPU" if device.type == "cuda" else "CPU"
    if device.type == "cpu" and not cpu_default:
        return "fp32: the default of this command on a CPU (--bf16 for bf16 autocast)"
    if dtype == torch.float16:
        return f"{scaled}: this GPU has no native bf16 and multiplies fp16 natively (--no-bf16 for fp32)"
    if dtype is not None:
        return f"bf16 autocast: this {unit} multiplies bf16 natively (--no-bf16 for fp32)"
    return f"fp32: this {unit} has no native bf16, and emulated bf16 would be slower"


def loss_scaler(device: torch.device, dtype: torch.dtype | None) -> torch.amp.GradScaler | None:
    """The dynamic loss scaler of a run in ``dtype``: torch.amp.GradScaler for fp16 (its 5-bit exponent underflows
    small gradients unless the loss is scaled up first; the scale halves and the step is skipped when a gradient
    overflows, and doubles after 2,000 clean steps), None for bf16 and fp32 (bf16 has fp32's exponent range)."""
    if dtype != torch.float16:
        return None
    return torch.amp.GradScaler(device.type)


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """torch.autocast on ``device`` in ``dtype``; a no-op context when ``dtype`` is None (full precision)."""
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


@contextlib.contextmanager
def no_tf32() -> Iterator[None]:
    """TF32 off (cuBLAS matmuls and cuDNN) inside, the flags as they were after: fp32 products stay fp32.

    ``configure_device`` turns TF32 on for CUDA runs, where an fp32 matmul then
    rounds its inputs to 10 mantissa bits. bf16 autocast regions are not affected
    (their products are bf16 either way). The flags are process-wide; they are set
    on every device (harmless where there is no CUDA), so the region means the
    same everywhere.
    """
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


@contextlib.contextmanager
def full_precision(device: torch.device) -> Iterator[None]:
    """A region computed in true fp32: autocast off and TF32 off (``no_tf32``), both restored after.

    For the places that leave autocast because rounding matters (similarities
    divided by a small temperature: SCL, KNN-BERT, RIFT, Match-Tuning; the
    distillation divergences).
    """
    with no_tf32(), torch.autocast(device.type, enabled=False):
        yield


def set_threads(n: int | None) -> int:
    """Compute on ``n`` CPU threads (None: torch's choice, one per core unless OMP_NUM_THREADS says otherwise);
    the count in use. A run's numbers depend on it (a sum split over other threads rounds otherwise)."""
    if n is not None:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def busy_cpu_note(threads: int, device: torch.device) -> str | None:
    """A warning when other work already keeps the CPU busy (its 1-minute load average), so that ``threads``
    compute threads on it (``device`` the CPU), waiting on each other, may go slower than one would; None otherwise
    (or unknown)."""
    if device.type != "cpu":
        return None
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this system
        return None
    cores = os.cpu_count() or 1
    if threads < 2 or load <= cores - threads + 0.75:
        return None
    return (f"other work keeps the CPU busy (load average {load:.1f} on {cores} cores): {threads} threads that wait "
            "on each other can then be slower than one; --threads 1 may help")


def configure_device(device: torch.device, deterministic: bool = False) -> None:
    """Process-wide math settings of ``device``: TF32 matmuls on CUDA; ``deterministic`` algorithms when asked.

    ``deterministic`` calls ``torch.use_deterministic_algorithms(True)`` (an op
    with no deterministic kernel then raises instead of running) and sets
    CUBLAS_WORKSPACE_CONFIG=:4096:8 when unset, which cuBLAS needs for
    reproducible results (it must be set before the first cuBLAS call, i.e. first
    thing in the process). See the module docstring for what it guarantees.
    """
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


def pin_and_prefetch(device: torch.device) -> bool:
    """Whether batches should be pinned and copied asynchronously by a background thread: on CUDA only (on CPU the
    thread would only compete with the compute threads)."""
    return device.type == "cuda"


def foreach_default(device: torch.device) -> bool:
    """Whether the non-fused AdamW should use the multi-tensor (foreach) path: on CUDA, where it saves launches."""
    return device.type == "cuda"


def distributed_backend(device: torch.device) -> str:
    """The torch.distributed backend of a device: nccl on CUDA, gloo on CPU; other devices are an error."""
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"distributed training runs on cpu (gloo) or cuda (nccl), not {device.type}")
    return "nccl" if device.type == "cuda" else "gloo"


def cuda_device_count() -> int:
    """Visible CUDA devices (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def bind_local_device(device: torch.device, local_rank: int) -> torch.device:
    """Under torchrun: a CUDA run's rank takes cuda:LOCAL_RANK (made current); a CPU run stays on cpu."""
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    return device


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (that device, not cuda:0); nothing to wait for on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_info(device: torch.device) -> dict[str, Any]:
    """What a report says of the training device: torch's version, and for CUDA the GPU's name, compute capability,
    multiprocessors and memory, the CUDA version torch was built with and the GPU count; for a CPU its thread count."""
    info: dict[str, Any] = {"device": str(device), "torch": torch.__version__}
    if device.type != "cuda":
        return {**info, "threads": torch.get_num_threads()}
    props = torch.cuda.get_device_properties(device)
    return {**info, "name": props.name, "capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count, "memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda, "gpus": torch.cuda.device_count(), "bf16_native": cuda_bf16_native()}


def fp32_matmul_precision(device: torch.device) -> str:
    """What an fp32 matmul on ``device`` computes in now: "tf32" on CUDA with TF32 on (``configure_device``),
    else "fp32"."""
    return "tf32" if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32 else "fp32"


def _proc_status_bytes(key: str) -> int | None:
    """A "VmRSS" / "VmHWM" line of /proc/self/status in bytes, None where there is no /proc."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_memory(device: torch.device) -> bool:
    """Start a new peak for ``peak_memory_bytes``: CUDA's allocator statistics of ``device``; on CPU the
    process's peak resident set (VmHWM, through /proc/self/clear_refs). False where it cannot be reset."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_bytes(device: torch.device) -> int:
    """Memory in use now: tensors allocated on a CUDA ``device``; on CPU the process's resident set."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    rss = _proc_status_bytes("VmRSS")
    return rss if rss is not None else peak_memory_bytes(device)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory since ``reset_peak_memory`` (or the process start): tensors allocated on a CUDA ``device``
    (not cuda:0's, not host RSS); on CPU the process's peak resident set (VmHWM, else ru_maxrss)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    hwm = _proc_status_bytes("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def encode_state(state: torch.Tensor) -> str:
    """An RNG state (``torch.Generator.get_state()``) as text for a JSON checkpoint; ``decode_state`` inverts it."""
    return base64.b64encode(state.cpu().numpy().tobytes()).decode("ascii")


def decode_state(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def device_rng_state(device: torch.device) -> torch.Tensor | None:
    """The RNG state of ``device`` itself (CUDA), None on CPU (whose state is torch.get_rng_state())."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def set_device_rng_state(state: torch.Tensor | None, device: torch.device) -> None:
    """Inverse of ``device_rng_state``."""
    if state is not None:
        torch.cuda.set_rng_state(state, device)


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """The global RNG states of torch (CPU and the training ``device``'s CUDA state), python and numpy, as JSON.

    Only the training device's CUDA state is kept (not one per visible GPU), so a
    checkpoint resumes on a machine with a different number of GPUs.
    """
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch": encode_state(torch.get_rng_state()),
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }
    if device is not None and device.type == "cuda" and torch.cuda.is_initialized():
        state["cuda"] = encode_state(torch.cuda.get_rng_state(device))
    return state


def set_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Inverse of ``rng_state``: the CUDA state goes to the training ``device``.

    A ``cuda`` entry may also be a list, one state per visible GPU (a checkpoint
    that saved every GPU's state): the entry of ``device``'s index is taken when
    present, else a warning says the dropout masks will differ.
    """
    torch.set_rng_state(decode_state(state["torch"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" not in state:
        return
    if device is None or device.type != "cuda":
        logger.warning("the checkpoint has a CUDA RNG state but this run is not on CUDA; dropout masks will differ")
        return
    saved = state["cuda"]
    if isinstance(saved, list):  # one state per visible GPU
        index = _cuda_index(device)
        if index >= len(saved):
            logger.warning("the checkpoint holds CUDA RNG states for %d GPU(s), none for %s; dropout masks will "
                           "differ", len(saved), device)
            return
        saved = saved[index]
    torch.cuda.set_rng_state(decode_state(saved), device)

