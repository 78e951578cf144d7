"""Tests of tasks/runtime.py: the device policy on machines this one is not: torch.cuda's probes and RNG
functions are monkeypatched, so the CUDA branches run with no GPU and record what they were asked.
"""

from __future__ import annotations

import logging
import mmap
import os

import pytest
import torch

from tasks import runtime

CUDA0, CUDA1 = torch.device("cuda", 0), torch.device("cuda", 1)


class FakeCuda:
    """torch.cuda's RNG functions for ``count`` visible GPUs: device i's state is a tensor filled with 10 + i;
    ``set_rng_state_all`` raises on more states than devices, as torch does."""

    def __init__(self, monkeypatch, count: int):
        self.count, self.set_calls, self.all_calls = count, [], 0
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_rng_state", self.get)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", self.get_all)
        monkeypatch.setattr(torch.cuda, "set_rng_state", self.set)
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", self.set_all)

    def _index(self, device) -> int:
        index = torch.device(device).index
        assert index is not None and index < self.count, f"no such GPU: {device}"
        return index

    def get(self, device="cuda"):
        return torch.full((16,), 10 + self._index(device), dtype=torch.uint8)

    def get_all(self):
        self.all_calls += 1
        return [self.get(torch.device("cuda", i)) for i in range(self.count)]

    def set(self, state, device="cuda"):
        self.set_calls.append((self._index(device), int(state[0])))

    def set_all(self, states):
        if len(states) > self.count:
            raise RuntimeError("invalid device ordinal")
        for i, s in enumerate(states):
            self.set(s, torch.device("cuda", i))


# ---- the training device's CUDA RNG state only ---------------------------------------------------------------


def test_rng_state_saves_the_training_devices_cuda_state_only(monkeypatch):
    """On a 4-GPU machine training on cuda:1, the checkpoint holds cuda:1's state, not one state per visible GPU."""
    fake = FakeCuda(monkeypatch, 4)
    state = runtime.rng_state(CUDA1)
    assert fake.all_calls == 0
    assert isinstance(state["cuda"], str) and runtime.decode_state(state["cuda"]).tolist() == [11] * 16


def test_resume_on_a_machine_with_fewer_gpus(monkeypatch):
    """A checkpoint saved on cuda:0 of a 4-GPU machine resumes on a 1-GPU machine: cuda:0 gets the saved state
    (torch.cuda.set_rng_state_all raised 'invalid device ordinal' here before)."""
    saved = runtime.rng_state(CUDA0) if FakeCuda(monkeypatch, 4) else None
    monkeypatch.undo()
    fake = FakeCuda(monkeypatch, 1)
    runtime.set_rng_state(saved, CUDA0)
    assert fake.set_calls == [(0, 10)]


def test_an_older_checkpoint_with_one_state_per_gpu_still_loads(monkeypatch, caplog):
    """The older format (a list, one per visible GPU): the training device's entry is restored; a device beyond
    the list warns and leaves the CUDA state alone."""
    fake = FakeCuda(monkeypatch, 4)
    old = runtime.rng_state(None)
    old["cuda"] = [runtime.encode_state(t) for t in fake.get_all()]
    runtime.set_rng_state(old, CUDA1)
    assert fake.set_calls == [(1, 11)]
    old["cuda"] = old["cuda"][:1]
    with caplog.at_level(logging.WARNING, logger="tasks.runtime"):
        runtime.set_rng_state(old, CUDA1)
    assert fake.set_calls == [(1, 11)] and "none for cuda:1" in caplog.text


def test_a_cuda_checkpoint_resumed_on_cpu_warns(monkeypatch, caplog):
    """CPU, python and numpy states are restored; the CUDA one cannot be and a warning says so."""
    fake = FakeCuda(monkeypatch, 1)
    state = runtime.rng_state(CUDA0)
    with caplog.at_level(logging.WARNING, logger="tasks.runtime"):
        runtime.set_rng_state(state, torch.device("cpu"))
    assert fake.set_calls == [] and "not on CUDA" in caplog.text


# ---- bf16 by default only where the device multiplies it natively -----------------------------------------------


@pytest.fixture
def emulating_gpu(monkeypatch):
    """A GPU that emulates bf16 (V100, T4): is_bf16_supported() is True only when emulation counts."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)


def test_an_emulating_gpu_defaults_to_fp16(emulating_gpu, caplog):
    """The default is fp16 with loss scaling there (a T4, a V100); an explicit --bf16 is allowed (the same numbers,
    slowly) with a warning."""
    cuda = torch.device("cuda")
    assert runtime.autocast_dtype(None, cuda) is torch.float16
    with caplog.at_level(logging.WARNING, logger="tasks.runtime"):
        assert runtime.autocast_dtype(True, cuda) is torch.bfloat16
    assert "emulates bf16" in caplog.text


def test_a_native_bf16_gpu_defaults_to_bf16_and_a_gpu_without_bf16_refuses_it(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert runtime.autocast_dtype(None, cuda) is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert runtime.autocast_dtype(None, cuda) is torch.float16  # fp16 with loss scaling, as a T4 multiplies
    with pytest.raises(ValueError, match="does not support bfloat16"):
        runtime.autocast_dtype(True, cuda)


def test_a_gpu_without_native_bf16_trains_in_fp16_with_loss_scaling(monkeypatch):
    """A simulated T4 or V100 (bf16 only emulated): the default precision is fp16, with a loss scaler, said in the
    log's first line with the reason; --no-bf16 is fp32 there, --bf16 emulated bf16 (a warning); an Ampere GPU and
    a bf16 CPU keep bf16 and no scaler."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    dtype = runtime.autocast_dtype(None, cuda)
    assert dtype is torch.float16 and isinstance(runtime.loss_scaler(cpu, dtype), torch.amp.GradScaler)
    assert runtime.precision_note(None, cuda, dtype) == ("fp16 autocast with dynamic loss scaling: this GPU has no "
                                                         "native bf16 and multiplies fp16 natively (--no-bf16 for fp32)")
    assert runtime.autocast_dtype(False, cuda) is None and runtime.autocast_dtype(True, cuda) is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert runtime.autocast_dtype(None, cuda) is torch.bfloat16 and runtime.loss_scaler(cpu, torch.bfloat16) is None
    assert runtime.loss_scaler(cpu, None) is None


def test_fp16_is_asked_for_anywhere_and_never_beside_bf16():
    """--fp16 gives fp16 on a CPU too (emulated: the T4's path, said in the note); with --bf16 or --no-bf16 it is a
    contradiction, refused naming both."""
    cpu = torch.device("cpu")
    assert runtime.autocast_dtype(None, cpu, fp16=True) is torch.float16
    assert runtime.precision_note(None, cpu, torch.float16, fp16=True) == (
        "fp16 autocast with dynamic loss scaling (--fp16; emulated on a CPU: slower than fp32)")
    for bf16, flag in ((True, "--bf16"), (False, "--no-bf16")):
        with pytest.raises(ValueError, match=f"--fp16 and {flag} ask for two precisions"):
            runtime.autocast_dtype(bf16, cpu, fp16=True)


@pytest.mark.parametrize("amx, avx512_bf16, expected", [
    (True, False, torch.bfloat16), (False, True, torch.bfloat16), (False, False, None)])
def test_bf16_is_the_cpu_default_where_the_cpu_multiplies_bf16_natively(monkeypatch, amx, avx512_bf16, expected):
    """bf16=None: autocast on CPUs with AMX or AVX512_BF16 (both measured faster), off where bf16 is emulated;
    an explicit choice always wins."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    cpu = torch.device("cpu")
    assert runtime.autocast_dtype(None, cpu) is expected
    assert runtime.autocast_dtype(True, cpu) is torch.bfloat16
    assert runtime.autocast_dtype(False, cpu) is None


# ---- full-precision regions turn TF32 off too -------------------------------------------------------------------


def test_full_precision_turns_autocast_and_tf32_off_inside_and_restores_them():
    """Inside: no autocast, both TF32 flags off; after (also after an exception): the flags as they were."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # configure_device on CUDA
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with runtime.full_precision(torch.device("cpu")):
                assert not torch.is_autocast_enabled("cpu")
                assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
                assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
            assert torch.is_autocast_enabled("cpu")
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        with pytest.raises(KeyError), runtime.full_precision(torch.device("cpu")):
            raise KeyError
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


# ---- --deterministic reaches torch -------------------------------------------------------------------------------


def test_deterministic_reaches_torch_and_sets_the_cublas_workspace(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda mode, **kw: calls.append(mode))
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    runtime.configure_device(torch.device("cpu"))
    assert calls == [] and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    runtime.configure_device(torch.device("cpu"), deterministic=True)
    assert calls == [True] and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # a user's own setting is kept
    runtime.configure_device(torch.device("cpu"), deterministic=True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


# ---- synchronization and peak memory act on the device they are given ------------------------------------------


def test_sync_and_peak_memory_act_on_the_given_gpu(monkeypatch):
    """cuda:1, not cuda:0 (what synchronize() / max_memory_allocated() without a device act on)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("sync", device)))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: calls.append(("peak", device)) or 7)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: calls.append(("now", device)) or 3)
    assert runtime.reset_peak_memory(CUDA1)
    assert runtime.memory_bytes(CUDA1) == 3
    runtime.synchronize(CUDA1)
    assert runtime.peak_memory_bytes(CUDA1) == 7
    assert calls == [("reset", CUDA1), ("now", CUDA1), ("sync", CUDA1), ("peak", CUDA1)]
    calls.clear()
    cpu = torch.device("cpu")
    runtime.synchronize(cpu)
    runtime.reset_peak_memory(cpu)
    assert runtime.peak_memory_bytes(cpu) >= runtime.memory_bytes(cpu) > 0 and calls == []


def test_cpu_peak_memory_sees_a_large_allocation():
    """On CPU the peak is the process's resident set: 64 MiB of fresh pages touched and released raise it by about
    that much (an anonymous mmap: memory the allocator's free lists, warm from earlier tests, cannot serve)."""
    cpu = torch.device("cpu")
    if not runtime.reset_peak_memory(cpu):
        pytest.skip("no /proc/self/clear_refs: the CPU peak cannot be reset here")
    before = runtime.memory_bytes(cpu)
    with mmap.mmap(-1, 64 * 2**20) as pages:
        for i in range(0, len(pages), 4096):
            pages[i] = 1
    assert runtime.peak_memory_bytes(cpu) - before >= 60 * 2**20


class MatmulFlags(torch.overrides.TorchFunctionMode):
    """Records, at every matrix product, whether TF32 is allowed and whether autocast is on (CPU)."""

    PRODUCTS = frozenset({torch.matmul, torch.mm, torch.bmm, torch.einsum, torch.Tensor.__matmul__,
                          torch.Tensor.matmul, torch.Tensor.mm, torch.nn.functional.linear})

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[bool, bool]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.PRODUCTS:
            self.seen.append((torch.backends.cuda.matmul.allow_tf32, torch.is_autocast_enabled("cpu")))
        return func(*args, **(kwargs or {}))


def _precision_regions():
    """Each region that leaves autocast for precision, as a call on small inputs."""
    from tasks.objectives.knn_bert import supervised_moco_loss
    from tasks.objectives.match_tuning import match_transform
    from tasks.objectives.rift import conditional_infonce_logits
    from tasks.objectives.scl import scl_loss

    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(4, 8, generator=g), dim=-1)
    y = torch.tensor([0, 1, 0, 1])
    proj = torch.nn.ModuleList([torch.nn.Linear(8, 4) for _ in range(2)])
    return {
        "scl": lambda: scl_loss(x, y, 0.1),
        "knn_bert": lambda: supervised_moco_loss(x, y, x, y, 1, 1, 0.07),
        "match_tuning": lambda: match_transform(x, 1.0),
        "rift": lambda: conditional_infonce_logits(x, x, y, proj, proj, 0.2),
    }


@pytest.mark.parametrize("name", ["scl", "knn_bert", "match_tuning", "rift"])
def test_precision_regions_multiply_without_tf32(name):
    """Under bf16 autocast with TF32 on (a CUDA run), the products of each float32 region run with autocast off
    and TF32 off; the flag is back on after."""
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        region = _precision_regions()[name]
        with torch.autocast("cpu", dtype=torch.bfloat16), MatmulFlags() as mode:
            region()
        inside = [s for s in mode.seen if not s[1]]  # the products with autocast off: the region's own
        assert inside and all(tf32 is False for tf32, _ in inside), mode.seen
        assert torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_smart_passes_run_without_tf32_in_an_fp32_run():
    """SMART in an fp32 run (--no-bf16, TF32 on as on CUDA): the clean, ascent and perturbed passes multiply
    with TF32 off, which would otherwise round a δ of 1e-5 away; the flag is back on after."""
    from tasks.objectives.smart import smart_penalty
    from tests.helpers import make_batch, tiny_model

    model, batch = tiny_model().train(), make_batch("sst")
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        with MatmulFlags() as mode:
            smart_penalty(model, "sst", batch)
        assert len(mode.seen) > 3 and all(tf32 is False for tf32, _ in mode.seen), mode.seen
        assert torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


# ---- the other device decisions, asked of runtime by the trainer, pretraining and torchrun -------------------------


def test_device_choices_of_the_loop_pretraining_and_torchrun(monkeypatch):
    """CUDA: pinned, prefetched batches, foreach AdamW, NCCL, cuda:LOCAL_RANK made current; CPU: none of these;
    other devices cannot run under torchrun."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert runtime.pin_and_prefetch(cuda) and not runtime.pin_and_prefetch(cpu)
    assert runtime.foreach_default(cuda) and not runtime.foreach_default(cpu)
    assert (runtime.distributed_backend(cuda), runtime.distributed_backend(cpu)) == ("nccl", "gloo")
    with pytest.raises(ValueError, match="not mps"):
        runtime.distributed_backend(torch.device("mps"))
    current = []
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    assert runtime.bind_local_device(cuda, 1) == CUDA1 and current == [CUDA1]
    assert runtime.bind_local_device(cpu, 1) == cpu and current == [CUDA1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert runtime.cuda_device_count() == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert runtime.cuda_device_count() == 3


def test_smart_dropout_replay_restores_the_training_devices_generator(monkeypatch):
    """SMART's replay of the dropout masks restores the CUDA generator of the device it was made on."""
    from tasks.objectives.smart import _DropoutReplay

    fake = FakeCuda(monkeypatch, 2)
    _DropoutReplay(CUDA1)()
    assert fake.set_calls == [(1, 11)]


def test_the_precision_note_says_what_was_chosen_and_why(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert runtime.precision_note(None, cpu, None) == "fp32: this CPU has no native bf16, and emulated bf16 would be slower"
    assert runtime.precision_note(None, cpu, torch.bfloat16).startswith("bf16 autocast: this CPU multiplies bf16 natively")
    assert runtime.precision_note(None, cuda, None).startswith("fp32: this GPU has no native bf16")
    assert runtime.precision_note(False, cpu, None) == "fp32 (--no-bf16)"
    assert runtime.precision_note(True, cpu, torch.bfloat16) == "bf16 autocast (--bf16)"


def test_device_info_names_the_gpu_and_a_cpu_its_threads(monkeypatch):
    """The GPU check's first lines: on CUDA the GPU's properties (probes monkeypatched), on a CPU the threads."""
    assert runtime.device_info(torch.device("cpu")) == {"device": "cpu", "torch": torch.__version__,
                                                        "threads": torch.get_num_threads()}
    props = type("Props", (), {"name": "NVIDIA H100 80GB HBM3", "major": 9, "minor": 0, "multi_processor_count": 132,
                               "total_memory": 80 * 2**30})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    info = runtime.device_info(CUDA0)
    assert info["name"] == "NVIDIA H100 80GB HBM3" and info["capability"] == "9.0" and info["memory_gib"] == 80.0
    assert info["multiprocessors"] == 132 and info["gpus"] == 1 and info["bf16_native"] is True


def test_fp32_matmuls_are_tf32_on_cuda_only_while_the_flag_is_on():
    with runtime.no_tf32():  # the flags as they were, after
        torch.backends.cuda.matmul.allow_tf32 = True
        assert runtime.fp32_matmul_precision(CUDA0) == "tf32"
        assert runtime.fp32_matmul_precision(torch.device("cpu")) == "fp32"
        with runtime.no_tf32():
            assert runtime.fp32_matmul_precision(CUDA0) == "fp32"


def test_threads_sets_torchs_count_and_a_busy_cpu_is_said(monkeypatch):
    """--threads N sets torch's thread count (None leaves torch's); a CPU other work keeps busy is one warning for
    a run of several threads, and none for one thread or an idle CPU."""
    from tasks import runtime

    before = torch.get_num_threads()
    try:
        assert runtime.set_threads(1) == 1 == torch.get_num_threads()
        assert runtime.set_threads(None) == 1
    finally:
        torch.set_num_threads(before)
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (1.9, 1.0, 1.0))
    cpu = torch.device("cpu")
    assert "(load average 1.9 on 2 cores): 2 threads" in runtime.busy_cpu_note(2, cpu)
    assert runtime.busy_cpu_note(1, cpu) is None and runtime.busy_cpu_note(2, torch.device("cuda")) is None
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (0.3, 1.0, 1.0))
    assert runtime.busy_cpu_note(2, cpu) is None
