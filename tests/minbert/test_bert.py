"""Tests of minbert/bert.py, the encoder: parity with transformers.BertModel, and properties of its parts."""

from __future__ import annotations

import math

import pytest
import torch

from minbert import bert
from minbert.bert import BertModel, byte_drop_probability, dropout, dropout_add, dropout_mask
from minbert.config import BertConfig
from tests.helpers import read_column, tiny_config

ATOL = 1e-5


def _compare(ours, ref, batch):
    with torch.no_grad():
        a = ours(**batch)
        r = ref(**batch)
    real = batch["attention_mask"].bool()  # (B, T): compare at real tokens
    err_h = (a["last_hidden_state"] - r.last_hidden_state)[real].abs().max().item()
    err_p = (a["pooler_output"] - r.pooler_output).abs().max().item()
    return err_h, err_p


def test_parity_real_sentences_with_padding(minilm):
    """last_hidden_state and pooler_output equal transformers' within 1e-5 on real SST sentences of mixed lengths."""
    ours, tok, ref = minilm
    sents = [r[0] for r in read_column("ids-sst-dev.csv", ("sentence",), 64)]
    batch = tok(sents)
    assert (batch["attention_mask"] == 0).any(), "the batch should contain padding"
    err_h, err_p = _compare(ours, ref, batch)
    assert err_h < ATOL and err_p < ATOL, (err_h, err_p)


def test_parity_sentence_pairs_with_token_types(minilm):
    """Pairs (token types 0/1) from STS dev give transformers' outputs within 1e-5."""
    ours, tok, ref = minilm
    rows = read_column("sts-dev.csv", ("sentence1", "sentence2"), 48)
    batch = tok([a for a, _ in rows], [b for _, b in rows])
    assert batch["token_type_ids"].max() == 1
    err_h, err_p = _compare(ours, ref, batch)
    assert err_h < ATOL and err_p < ATOL, (err_h, err_p)


def test_parity_both_attention_paths(minilm):
    """The math path also matches the reference, on the same padded batch."""
    ours, tok, ref = minilm
    batch = tok(["a short one", "a considerably longer sentence with many more word pieces in it"])
    ours.set_attn_implementation("math")
    try:
        err_h, err_p = _compare(ours, ref, batch)
    finally:
        ours.set_attn_implementation("sdpa")
    assert err_h < ATOL and err_p < ATOL


def test_sdpa_equals_math_path_tiny():
    """SDPA and the written-out softmax(QKᵀ/√d + mask)V give the same outputs and gradients (in eval mode: a CPU
    writes out the attention of a model in training mode, below)."""
    torch.manual_seed(0)
    cfg = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    m = BertModel(cfg).eval()
    ids = torch.randint(1, 99, (3, 11))
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    outs, grads = [], []
    for impl in ("sdpa", "math"):
        m.set_attn_implementation(impl)
        m.zero_grad()
        h = m(ids, mask)["last_hidden_state"]
        (h * mask[..., None]).sum().backward()
        outs.append(h.detach())
        grads.append(m.encoder.layer[0].attention.self.qkv.weight.grad.clone())
    assert torch.allclose(outs[0], outs[1], atol=1e-6)
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_cpu_writes_out_the_attention_it_trains_and_infers_through_sdpa(dropout, monkeypatch):
    """On a CPU, attention in training mode is written out with or without dropout (with it SDPA falls back to its
    own math path; without, its backward is slower in bf16: benchmarks/README.md, "Attention without dropout");
    in eval mode it goes through SDPA. The math implementation never calls SDPA."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(bert.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    m = BertModel(tiny_config(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))
    ids = torch.randint(1, 99, (2, 7))
    layers = m.config.num_hidden_layers
    for impl, training, expected in (("sdpa", True, 0), ("sdpa", False, layers), ("math", False, 0)):
        m.set_attn_implementation(impl)
        m.train(training)
        calls.clear()
        m(ids, torch.ones(2, 7, dtype=torch.long))["last_hidden_state"].sum().backward()
        assert len(calls) == expected, (impl, training)
    assert bert.use_sdpa("sdpa", True, torch.device("cuda"))  # a GPU trains through SDPA's fused kernels


def test_padding_does_not_change_real_token_outputs():
    """Appending padding to a sequence leaves its real-token outputs and pooled output unchanged."""
    m = BertModel(tiny_config()).eval()
    ids = torch.randint(1, 99, (1, 9))
    short = m(ids, torch.ones(1, 9, dtype=torch.long))
    padded_ids = torch.cat([ids, torch.zeros(1, 6, dtype=torch.long)], dim=1)
    padded_mask = torch.cat([torch.ones(1, 9), torch.zeros(1, 6)], dim=1).long()
    long = m(padded_ids, padded_mask)
    assert torch.allclose(short["last_hidden_state"], long["last_hidden_state"][:, :9], atol=1e-6)
    assert torch.allclose(short["pooler_output"], long["pooler_output"], atol=1e-6)


def test_eval_mode_is_deterministic_and_train_mode_is_not():
    """eval() gives identical repeats; train() applies dropout (outputs differ)."""
    m = BertModel(tiny_config())
    ids = torch.randint(1, 99, (2, 8))
    m.eval()
    assert torch.equal(m(ids)["last_hidden_state"], m(ids)["last_hidden_state"])
    m.train()
    assert not torch.equal(m(ids)["last_hidden_state"], m(ids)["last_hidden_state"])


def test_inputs_embeds_equals_input_ids():
    """Starting from word embeddings (embed_tokens) is the same as starting from ids."""
    m = BertModel(tiny_config()).eval()
    ids = torch.randint(1, 99, (2, 8))
    tt = torch.randint(0, 2, (2, 8))
    a = m(ids, token_type_ids=tt, output_embeddings=True)
    b = m(inputs_embeds=m.embed_tokens(ids), token_type_ids=tt, output_embeddings=True)
    assert torch.equal(a["last_hidden_state"], b["last_hidden_state"])
    assert a["embedding_output"].shape == (2, 8, 32)


def test_hidden_states_count_and_last():
    """output_hidden_states returns embeddings + one tensor per layer, the last equal to last_hidden_state."""
    m = BertModel(tiny_config()).eval()
    out = m(torch.randint(1, 99, (2, 5)), output_hidden_states=True)
    assert len(out["hidden_states"]) == 3
    assert torch.equal(out["hidden_states"][-1], out["last_hidden_state"])


def test_state_dict_uses_hf_names_and_round_trips():
    """state_dict() holds HF query/key/value names (no fused qkv) and loads back exactly."""
    m = BertModel(tiny_config())
    sd = m.state_dict()
    assert "encoder.layer.0.attention.self.query.weight" in sd
    assert not any(".qkv." in k for k in sd)
    m2 = BertModel(tiny_config())
    m2.load_state_dict(sd)
    for (k, a), b in zip(m.state_dict().items(), m2.state_dict().values()):
        assert torch.equal(a, b), k


def test_gradient_checkpointing_same_loss_and_grads():
    """Activation checkpointing changes memory, not numbers: same loss and gradients."""
    torch.manual_seed(1)
    cfg = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    a = BertModel(cfg)
    b = BertModel(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                              gradient_checkpointing=True))
    b.load_state_dict(a.state_dict())
    ids = torch.randint(1, 99, (2, 7))
    for m in (a, b):
        m.train()
        m(ids)["pooler_output"].pow(2).sum().backward()
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_dropout_keeps_1_minus_p_scales_the_kept_and_keeps_the_dtype(dtype):
    """Our CPU dropout (float32 uniforms >= p, whatever the input dtype): keep rate 1 - p, kept values x / (1 - p),
    dropped values 0, the input's dtype; in eval mode the identity."""
    p = 0.1
    torch.manual_seed(0)
    x = torch.rand(1000, 1000, dtype=dtype) + 0.5  # nonzero, so zeros mark dropped elements
    y = dropout(x, p, True)
    assert y.dtype == dtype
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 2e-3  # std of the rate over 1e6 draws: 3e-4
    expected = (x * torch.tensor(1 / (1 - p), dtype=dtype))[kept]
    torch.testing.assert_close(y[kept], expected, atol=0, rtol=0)
    assert dropout(x, p, False) is x


@pytest.mark.parametrize("x_dtype, res_dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.float32),
                                                (torch.bfloat16, torch.bfloat16)])
def test_cpu_dropout_add_is_residual_plus_dropout_in_the_sums_dtype(x_dtype, res_dtype):
    """dropout_add(x, r) = r + mask·x/(1 - p) in one pass, with the dtype x + r would have (bf16 linear output +
    float32 LayerNorm output under autocast: float32), and the same mask as dropout() draws from the same seed."""
    p = 0.25
    x = torch.randn(300, 400).to(x_dtype)
    r = torch.randn(300, 400).to(res_dtype)
    torch.manual_seed(1)
    got = dropout_add(x, r, p, True)
    torch.manual_seed(1)
    ref = r + dropout(x.to(torch.promote_types(x_dtype, res_dtype)), p, True)  # same shape: the same mask
    assert got.dtype == torch.promote_types(x_dtype, res_dtype)
    assert abs((got == r).float().mean().item() - p) < 0.01  # the dropped elements leave r unchanged
    tol = 1e-6 if got.dtype == torch.float32 else 4e-2  # bf16: ref rounds twice (|values| < 6, ulp <= 2^-5)
    torch.testing.assert_close(got, ref, atol=tol, rtol=tol)
    assert torch.equal(dropout_add(x, r, p, False), x + r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("p", [0.1, 0.25, 1 / 3, 0.5, 0.9, 1e-7])
def test_the_cpu_dropout_mask_is_rand_ge_p_bit_for_bit_and_leaves_the_generator_where_rand_does(dtype, p):
    """dropout_mask(x, p) is exactly ``torch.rand(x.shape) >= p`` (float32 uniforms; float64 for float64 x) from the
    same generator state, and consumes the same draws: runs are the same numbers whichever way it is computed."""
    x = torch.zeros(64, 12, 33, 33, dtype=dtype)
    uniform = torch.float64 if dtype == torch.float64 else torch.float32
    torch.manual_seed(3)
    ref = torch.rand(x.shape, dtype=uniform) >= p
    after_ref = torch.get_rng_state()
    torch.manual_seed(3)
    got = dropout_mask(x, p)
    assert torch.equal(torch.get_rng_state(), after_ref)
    assert got.dtype == uniform
    assert torch.equal(got, ref.to(uniform))


@pytest.mark.parametrize("p", [0.1, 0.2, 0.3, 1 / 3, 0.5, 0.7, 2**-24, 1 - 2**-24, 0.123456789])
def test_the_dropout_threshold_splits_the_uniforms_where_ge_p_does(p):
    """The integer threshold t of the mask: of torch.rand's float32 uniforms k·2^-24, k = t - 1 is < p and k = t
    is >= p, under torch's own comparison (the boundary a random test would rarely hit)."""
    t = bert.keep_threshold(p)
    u = torch.tensor([(t - 1) * 2**-24, t * 2**-24], dtype=torch.float32)
    assert (u >= p).tolist() == [False, True]


@pytest.mark.parametrize("n", [1, 2])
def test_reinit_top_layers_draws_what_transformers_init_draws_and_keeps_the_rest(n):
    """reinit_top_layers(n) gives the top n layers and the pooler the weights transformers' own initialization
    draws for them from the same generator state (Zhang et al. 2021 §5), and leaves every other weight as it was."""
    import transformers

    ours = BertModel(tiny_config(num_hidden_layers=3))
    ref = transformers.BertModel(transformers.BertConfig(**ours.config.to_hf_dict()))
    ref.load_state_dict(ours.state_dict())
    torch.manual_seed(7)
    ours.reinit_top_layers(n)
    torch.manual_seed(7)
    for module in [*ref.encoder.layer[3 - n:], ref.pooler]:
        module.apply(ref._init_weights)
    for key, value in ours.state_dict().items():  # ref's other weights are those both started from
        assert torch.equal(value, ref.state_dict()[key]), key
    with pytest.raises(ValueError, match="4 layers of an encoder of 3"):
        ours.reinit_top_layers(4)


@pytest.mark.parametrize("p", [0.1, 0.25, 0.5])
def test_byte_masks_drop_p_rounded_to_a_byte_from_a_third_of_the_draws(p):
    """masks="bytes": an element is dropped with probability ceil(256 p) / 256 (0.1 -> 26/256), the kept ones scaled
    by 1 / (1 - that), each element's uniform one of the low three bytes of an int32 draw: the generator advances as
    ceil(n / 3) draws would move it; "exact" (the default) is unchanged."""
    x = torch.rand(600, 1000) + 0.5
    n = x.numel()
    torch.manual_seed(5)
    y = dropout(x, p, True, masks="bytes")
    after = torch.get_rng_state()
    torch.manual_seed(5)
    torch.empty((n + 2) // 3, dtype=torch.int32).random_()
    assert torch.equal(torch.get_rng_state(), after)
    q = byte_drop_probability(p)
    assert q == math.ceil(256 * p) / 256 and q >= p
    kept = y != 0
    assert abs(1 - kept.float().mean().item() - q) < 2e-3
    torch.testing.assert_close(y[kept], x[kept] / (1 - q), atol=0, rtol=1e-6)
    torch.manual_seed(5)
    exact = dropout(x, p, True)
    torch.manual_seed(5)
    assert torch.equal(dropout(x, p, True, masks="exact"), exact)
    with pytest.raises(ValueError, match="dropout_masks 'fast' is not one of"):
        BertConfig(dropout_masks="fast")
