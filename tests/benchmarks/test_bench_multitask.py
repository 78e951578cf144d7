"""Tests of benchmarks/bench_multitask.py, smoke tests on the tiny model: it runs, and every number it reports is there.

No timing is asserted: only the shape of the result, positive rates, and the
FLOP count's arithmetic.
"""

from __future__ import annotations

import dataclasses
import math
import types
from pathlib import Path

import pytest
import torch

from benchmarks import bench_multitask as bench
from tasks.train_config import TrainConfig
from tests.helpers import tiny_config, tiny_train_config, write_tiny_data, write_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_cfg(tmp_path_factory) -> TrainConfig:
    root = tmp_path_factory.mktemp("bench")
    env = (write_tiny_model(root / "bert"), write_tiny_data(root / "data"))
    return tiny_train_config(env, root / "unused", batch_size=8, max_length=32, epochs=1)


EAGER_VARIANTS = [v for v in bench.VARIANTS if v != "compile"]  # compiling costs a minute: tested apart


def test_benchmark_reports_every_variant(tiny_cfg):
    """Every eager variant runs 2 steps x 2 rounds; rates, FLOPs, MFU and ratios are positive; the table renders."""
    res = bench.benchmark(tiny_cfg, EAGER_VARIANTS, steps=2, warmup=1, rounds=2, memory=False,
                          profile=True, square=64, peak_min_time=0.005, log=lambda s: None)
    assert set(res["variants"]) == set(EAGER_VARIANTS)
    for name, v in res["variants"].items():
        assert len(v["train_s_rounds"]) == 2 and len(v["infer_s_rounds"]) == 2
        for key in ("train_seq_s", "train_tok_s", "infer_seq_s", "infer_tok_s", "train_flop_s", "train_mfu",
                    "train_hfu", "infer_mfu"):
            assert v[key] > 0 and math.isfinite(v[key]), (name, key, v[key])
        assert v["sequences"] == 2 * tiny_cfg.batch_size
    fixed = res["variants"]["fixed"]
    assert fixed["padded_tokens"] == fixed["sequences"] * tiny_cfg.max_length  # padded to max_length
    assert fixed["pad_fraction"] > res["variants"]["ours"]["pad_fraction"]
    for name in ("hf", "foreach", "pad8"):  # the very same batches as ours
        assert res["variants"][name]["real_tokens"] == res["variants"]["ours"]["real_tokens"]
    assert res["variants"]["hf"]["padded_tokens"] == res["variants"]["ours"]["padded_tokens"]
    assert res["variants"]["pad8"]["padded_tokens"] % 8 == 0
    assert set(res["ratios"]) == set(EAGER_VARIANTS) - {"ours"}
    assert all(r["train_tok_s"] > 0 for r in res["ratios"].values())
    assert res["peak_flops"]["reference_dtype"] == "fp32"  # the tiny config trains without autocast
    assert set(res["profile"]["phase_ms_per_step"]) == set(bench.PHASES)
    assert abs(sum(res["profile"]["where_share"].values()) - 1) < 1e-6
    table = bench.markdown(res)
    assert table.count("\n| ") >= len(EAGER_VARIANTS) + 5 and "MFU" in table


def test_hf_variant_starts_from_the_same_model(tiny_cfg):
    """The transformers variant's MultitaskBert gives ours' outputs (eval mode) before any step: same weights."""
    base = bench.make_base_trainer(tiny_cfg)
    hf = bench.hf_multitask_model(base.model, tiny_cfg.pretrained).eval()
    base.model.eval()
    stream, idx = base.schedule.epoch_plan(0)[0]
    batch = base.train_sets[stream].collate(idx)
    with torch.no_grad():
        a, b = base.model(stream, batch).logits, hf(stream, batch).logits
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


def test_flop_count_identities():
    """A batch without padding has equal real and padded FLOPs; the count is 2·P·tokens + 4·L·H·ΣT² + heads."""
    cfg = tiny_config()
    B, T = 3, 5
    full = {"attention_mask": torch.ones(B, T, dtype=torch.long)}
    P = bench.encoder_matmul_params(cfg)
    assert P == cfg.num_hidden_layers * (4 * 32 * 32 + 2 * 32 * 37)
    expected = 2 * P * B * T + 4 * cfg.num_hidden_layers * 32 * B * T * T + 10.0 * B
    assert bench.batch_flops(full, cfg, 10.0, padded=False) == pytest.approx(expected)
    assert bench.batch_flops(full, cfg, 10.0, padded=True) == pytest.approx(expected)
    half = {"attention_mask": torch.tensor([[1, 1, 1, 0, 0]] * B)}
    assert bench.batch_flops(half, cfg, 0.0, padded=False) < bench.batch_flops(half, cfg, 0.0, padded=True)


def test_peak_memory_child(tiny_cfg):
    """The spawned child measures a growth of the peak RSS over one variant's training steps (the measure itself:
    tests/training/test_runtime.py), and a child that fails is reported with its error, not waited for."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux /proc")
    mib = bench.peak_train_mib(tiny_cfg, "ours", warmup=1, steps=1, threads=1)
    assert 0 < mib < 1024  # a 2-layer, 32-wide model's steps: well under a GiB
    broken = dataclasses.replace(tiny_cfg, pretrained=str(Path(tiny_cfg.out_dir) / "no-such-model"))
    with pytest.raises(RuntimeError, match=r"peak-memory child for 'ours' failed: .*no-such-model"):
        bench.peak_train_mib(broken, "ours", warmup=1, steps=1, threads=1)


def test_matmul_peak_synchronizes_once_per_batch_of_calls(monkeypatch):
    """The matmul peak times batches of calls with one synchronization at each end (a sync after every call
    adds its latency to every call on a GPU): far fewer syncs than calls, all on the given device."""
    calls, syncs = [], []
    linear = bench.F.linear
    clock = [0.0]  # each call takes 0.1 ms of a clock of the test's own: a loaded machine cannot change the count

    def timed_linear(x, w):
        calls.append(1)
        clock[0] += 1e-4
        return linear(x, w)

    monkeypatch.setattr(bench.F, "linear", timed_linear)
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(bench, "synchronize", lambda device: syncs.append(device))
    cpu = torch.device("cpu")
    assert bench.matmul_flops_per_s((8, 8, 8), torch.float32, cpu, min_time=0.02) > 0
    assert len(calls) > 100 and len(syncs) <= 2 * len(calls).bit_length() + 2, (len(calls), len(syncs))
    assert set(syncs) == {cpu}


def test_peak_memory_is_read_on_the_training_device(tiny_cfg, monkeypatch):
    """The memory child resets, reads and peaks the memory of the trainer's device through tasks.runtime
    (CUDA: that device's allocator, not host RSS and not cuda:0); run in this process to watch the calls."""
    import queue

    seen = []
    monkeypatch.setattr(bench, "reset_peak_memory", lambda d: seen.append(("reset", d)) or True)
    monkeypatch.setattr(bench, "memory_bytes", lambda d: seen.append(("now", d)) or 2**20)
    monkeypatch.setattr(bench, "peak_memory_bytes", lambda d: seen.append(("peak", d)) or 5 * 2**20)
    monkeypatch.setattr(bench, "configure_malloc", lambda: None)
    q = queue.Queue()
    bench._memory_child(q, tiny_cfg.to_dict(), "ours", 1, 1, 1)
    assert q.get_nowait() == 4.0
    cpu = torch.device("cpu")
    assert seen == [("reset", cpu), ("now", cpu), ("peak", cpu)]


def test_cli_flags_reach_the_benchmark(monkeypatch):
    """Every flag of main() reaches benchmark() or the TrainConfig it is given."""
    seen = {}

    def fake(cfg, variants, **kw):
        seen.update(cfg=cfg, variants=variants, **kw)
        raise SystemExit(0)

    monkeypatch.setattr(bench, "benchmark", fake)
    monkeypatch.setattr(bench, "configure_malloc", lambda: True)  # leave this process's malloc alone
    with pytest.raises(SystemExit):
        bench.main(["--steps", "7", "--warmup", "2", "--rounds", "3", "--threads", "1", "--no-bf16",
                    "--variants", "ours", "hf", "--data-dir", "d", "--pretrained", "p", "--square", "0",
                    "--no-memory", "--profile"])
    assert seen["variants"] == ["ours", "hf"]
    assert (seen["steps"], seen["warmup"], seen["rounds"], seen["threads"], seen["square"]) == (7, 2, 3, 1, 0)
    assert seen["memory"] is False and seen["profile"] is True
    cfg = seen["cfg"]
    assert (cfg.bf16, cfg.data_dir, cfg.pretrained) == (False, "d", "p")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # importing torch._dynamo touches torch.jit's deprecated API
def test_compile_variant_compiles_the_encoder_of_a_copy_on_ours_batches(tiny_cfg):
    """The 'compile' variant trains a compiled copy of the encoder (the base stays eager) on ours' very batches
    (building it compiles nothing yet: compilation happens in the untimed pass; trains the same as eager is
    tests/test_train.py's compile test)."""
    base = bench.make_base_trainer(tiny_cfg)
    ours = bench.build_variant(base, "ours", warmup=1, steps=2)
    comp = bench.build_variant(base, "compile", warmup=1, steps=2)
    assert comp.trainer.model is not base.model
    assert getattr(comp.trainer.model.encoder, "_compiled_call_impl", None) is not None
    assert getattr(base.model.encoder, "_compiled_call_impl", None) is None
    for (s1, b1), (s2, b2) in zip(ours.sample, comp.sample):
        assert s1 == s2 and torch.equal(b1["input_ids"], b2["input_ids"])


def test_foreach_variant_is_the_trainers_own_foreach_path(tiny_cfg):
    """'foreach' builds its AdamW through the Trainer (fused_adamw=False), not by hand; the base keeps the fused kernel."""
    base = bench.make_base_trainer(tiny_cfg)
    v = bench.build_variant(base, "foreach", warmup=1, steps=2)
    assert v.trainer.cfg.fused_adamw is False and base.cfg.fused_adamw is True
    assert all(g["foreach"] and not g["fused"] for g in v.trainer.optimizer.param_groups)
    assert all(g["fused"] for g in base.optimizer.param_groups)
    assert {id(p) for p in v.trainer.params}.isdisjoint(id(p) for p in base.params)  # its own model copy


def test_randmask_variant_is_ours_with_the_float_mask_and_trains_to_the_same_weights(tiny_cfg, monkeypatch):
    """'randmask' draws its dropout masks as torch.rand >= p (the patch is live only around its steps) and, from the
    same generator state on the same batches, trains to ours' weights bit for bit: the two masks are one."""
    base = bench.make_base_trainer(tiny_cfg)
    ours = bench.build_variant(base, "ours", warmup=0, steps=3)
    calls = []
    monkeypatch.setattr(bench, "_rand_mask", lambda x, p, masks="exact": calls.append(p) or torch.rand(x.shape).ge_(p))
    rand = bench.build_variant(base, "randmask", warmup=0, steps=3)  # the spy in its patch
    lrs = [1e-3] * 3
    torch.manual_seed(5)
    bench.train_steps(rand, rand.sample, lrs)
    assert calls and bench.bert.dropout_mask is not bench._rand_mask  # used inside, restored after
    torch.manual_seed(5)
    bench.train_steps(ours, ours.sample, lrs)
    for (name, a), b in zip(ours.trainer.model.named_parameters(), rand.trainer.model.parameters()):
        assert torch.equal(a, b), name


def test_nodrop_variants_train_without_encoder_dropout_through_their_attention(tiny_cfg, monkeypatch):
    """'nodrop' and 'nodrop-sdpa' train the encoder without dropout (its config says so too); only 'nodrop-sdpa'
    calls SDPA in its training steps (its patch is live only around them; a CPU writes out the attention it
    trains), and from the same generator state the two train to the same weights within float rounding: one
    computation, two implementations."""
    base = bench.make_base_trainer(tiny_cfg)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(bench.bert.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    trained = {}
    for name in ("nodrop", "nodrop-sdpa"):
        v = bench.build_variant(base, name, warmup=0, steps=3)
        encoder = v.trainer.model.encoder
        assert v.trainer.cfg.encoder_dropout == 0.0
        assert encoder.config.hidden_dropout_prob == encoder.config.attention_probs_dropout_prob == 0.0
        assert all(m.dropout_p == 0.0 for m in encoder.modules() if hasattr(m, "dropout_p"))
        calls.clear()
        torch.manual_seed(5)
        bench.train_steps(v, v.sample, [1e-3] * 3)
        trained[name] = (len(calls), v.trainer.model)
    assert trained["nodrop"][0] == 0 and trained["nodrop-sdpa"][0] > 0
    assert not bench.bert.use_sdpa("sdpa", True, torch.device("cpu"))  # the patch is gone after the steps
    assert base.model.encoder.config.hidden_dropout_prob > 0  # base untouched
    assert any(m.dropout_p > 0 for m in base.model.encoder.modules() if hasattr(m, "dropout_p"))
    for (name, a), b in zip(trained["nodrop"][1].named_parameters(), trained["nodrop-sdpa"][1].parameters()):
        assert torch.allclose(a, b, atol=1e-5), name


def test_the_floors_of_a_step_add_up_and_count_the_steps_dropout_draws(tiny_cfg):
    """With --profile: four floors whose sum is given, the TARGET_MFU budget from the step's FLOPs and the
    peak, the parameters' bytes, and the dropout draws a step (the tiny model's masks, counted by hand here)."""
    res = bench.benchmark(tiny_cfg, ["ours"], steps=2, warmup=1, rounds=1, memory=False, profile=True, square=64,
                          peak_min_time=0.005, log=lambda s: None)
    fl = res["floors"]
    assert len(fl["floors_ms_per_step"]) == 4 and all(ms > 0 for ms in fl["floors_ms_per_step"].values())
    assert fl["sum_ms_per_step"] == pytest.approx(sum(fl["floors_ms_per_step"].values()))
    flops = res["variants"]["ours"]["train_flops"] / 2
    assert fl["target_ms_per_step"] == pytest.approx(1e3 * flops / (0.6 * res["peak_flops"]["reference_flop_s"]))
    base = bench.make_base_trainer(tiny_cfg)
    assert fl["parameter_bytes"] == sum(4 * p.numel() for p in base.params)
    enc = base.model.encoder.config
    heads = enc.num_attention_heads
    draws = 0
    for _, batch in bench.build_variant(base, "ours", warmup=1, steps=2).sample:
        b, t = batch["input_ids"].shape
        draws += enc.num_hidden_layers * (2 * b * t * enc.hidden_size + b * heads * t * t) + b * t * enc.hidden_size
    assert fl["dropout_draws_per_step"] == round(draws / 2)
    assert "floor of a part of the step" in bench.markdown(res)


def test_the_profile_times_the_trainers_own_step(tiny_cfg):
    """--profile runs Trainer.train_step itself, its phases marked from outside (a copy of the step once drifted
    from it: every parameter group at the base lr, the heads' 10x factor lost), and leaves the trainer as it was."""
    cfg = dataclasses.replace(tiny_cfg, head_lr_scale=10.0)
    device = torch.device("cpu")
    base = bench.Trainer(cfg, bench.build_parts(cfg, device), device=device)
    variant = bench.build_variant(base, "ours", warmup=1, steps=2)
    prof = bench.profile_variant(variant, [1e-3, 1e-3])
    assert sorted({g["lr"] for g in base.optimizer.param_groups}) == pytest.approx([1e-3, 1e-2])
    assert list(prof["phase_ms_per_step"]) == list(bench.PHASES) and all(
        ms > 0 for ms in prof["phase_ms_per_step"].values())
    assert base.hooks == [] and "step_loss" not in vars(base)
