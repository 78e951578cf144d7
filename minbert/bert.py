"""A hand-written BERT encoder (Devlin et al., 2019): embeddings, post-LN layers, pooler.

Usage:
    from minbert.pretrained import load_pretrained
    model, tok = load_pretrained()            # the embedded all-MiniLM-L6-v2
    out = model(**tok(["a sentence", "another one"]))
    out["last_hidden_state"]                  # (B, T, H)
    out["pooler_output"]                      # (B, H)

This module is only the encoder: it knows nothing of tasks or losses.

Parameter names follow Hugging Face's ``BertModel`` so checkpoints load as they
are. One exception, for speed: each layer's query/key/value projections are
stored as one fused ``qkv`` Linear (one matmul instead of three). Hooks split it
into HF's ``query``/``key``/``value`` entries in ``state_dict()`` and fuse them
again in ``load_state_dict()``, so saved checkpoints are plain HF BERT weights.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from minbert.config import BertConfig

_UNIFORM_BITS = 24  # torch.rand's float32 uniform on CPU: the low 24 bits k of one 32-bit draw, as k * 2**-24


@functools.cache  # a handful of p per model, asked for by every dropout call
def keep_threshold(p: float) -> int:
    """The least k with ``k * 2**-24 >= p`` as torch compares them (p rounded to float32, as ``ge`` does)."""
    return math.ceil(float(torch.tensor(p, dtype=torch.float32)) * 2**_UNIFORM_BITS)


def byte_drop_probability(p: float) -> float:
    """The probability a "bytes" mask drops an element: p rounded up to a multiple of 1/256 (0.1 -> 26/256 =
    0.1016), since each element's uniform is one byte."""
    return math.ceil(p * 256) / 256


def dropout_mask(x: torch.Tensor, p: float, masks: str = "exact") -> torch.Tensor:
    """A {0, 1} mask keeping each element of ``x`` with probability 1 - p: ``torch.rand(x.shape) >= p``.

    Drawn as uniform(0, 1) >= p: on CPU this is faster than ``bernoulli_``
    (what ``F.dropout`` uses) and has the same distribution (benchmarks/README.md).
    The uniforms are float32 whatever ``x``'s dtype: under bf16 autocast that is
    faster than drawing bf16 uniforms, and keeps p exact to 2^-24 instead of
    rounding the threshold to bf16's 8-bit mantissa. So the mask is float32 for
    reduced-precision ``x`` (callers cast where the dtype matters).

    The float32 uniforms are not made: on torch's CPU generator each is
    ``k * 2**-24`` with k the low 24 bits of one 32-bit draw, and ``random_()``
    on int32 keeps the low 31 bits of one draw. So
    ``(bits & (2**24 - 1)) >= keep_threshold(p)`` is the same mask from the same
    draws, leaving the generator in the same state, without the conversion to
    float and the float compare (benchmarks/README.md; tests/minbert/test_bert.py
    checks both against ``torch.rand``). float64 ``x`` draws float64 uniforms
    (53 bits of a 64-bit draw), as ``torch.rand`` would. Used on CPU only
    (``dropout`` and ``dropout_add`` call ``F.dropout`` elsewhere).
    """
    if x.dtype == torch.float64:
        return torch.rand(x.shape, dtype=torch.float64, device=x.device).ge_(p)
    if masks == "bytes":
        return _byte_mask(x, p)
    bits = torch.empty(x.shape, dtype=torch.int32, device=x.device).random_()
    return bits.bitwise_and_(2**_UNIFORM_BITS - 1).ge_(keep_threshold(p)).to(torch.float32)


def _byte_mask(x: torch.Tensor, p: float) -> torch.Tensor:
    """A mask of ``masks="bytes"``: three elements' uniforms from each 32-bit draw of torch's serial CPU generator
    (the low three bytes of an int32 ``random_()``, whose top bit is always 0), an element kept where its byte is
    at least 256 · ``byte_drop_probability(p)``. A third of the draws of an exact mask, so a third of the time the
    generator takes (benchmarks/README.md); the drop probability is p rounded up to 1/256, and the masks are
    other draws than the exact ones: a run's numbers change."""
    n = x.numel()
    words = torch.empty((n + 2) // 3, dtype=torch.int32, device=x.device).random_()
    uniforms = words.view(torch.uint8).view(-1, 4)[:, :3].reshape(-1)[:n]  # little-endian: the low three bytes
    return uniforms.ge_(round(byte_drop_probability(p) * 256)).view(x.shape).to(torch.float32)


def _kept(p: float, masks: str) -> float:
    """The probability a mask keeps an element: 1 - p, or 1 - p rounded (``byte_drop_probability``) for bytes."""
    return 1.0 - (byte_drop_probability(p) if masks == "bytes" else p)


def dropout(x: torch.Tensor, p: float, training: bool, masks: str = "exact") -> torch.Tensor:
    """Inverted dropout, as ``F.dropout``; the fast mask on CPU (``masks``: ``dropout_mask``), PyTorch's kernel
    elsewhere."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    return x * dropout_mask(x, p, masks).mul_(1.0 / _kept(p, masks)).to(x.dtype)


def dropout_add(x: torch.Tensor, residual: torch.Tensor, p: float, training: bool,
                masks: str = "exact") -> torch.Tensor:
    """``residual + dropout(x)`` in one pass (addcmul) instead of two on CPU.

    Under autocast ``x`` (a linear layer's output) is bf16 and ``residual`` (a
    LayerNorm's output) float32, so the sum is float32 with either mask dtype.
    """
    if not training or p == 0.0:
        return x + residual
    if x.device.type != "cpu":
        return F.dropout(x, p, True) + residual
    mask = dropout_mask(x, p, masks).to(torch.promote_types(x.dtype, residual.dtype))  # the dtype of x + residual
    return torch.addcmul(residual, x, mask, value=1.0 / _kept(p, masks))


def activation(name: str):
    if name == "gelu":
        return F.gelu  # exact (erf) GELU, as BERT and HF's "gelu"
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    raise ValueError(f"unknown activation {name!r}")


class BertEmbeddings(nn.Module):
    """word + position + token-type embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size,
                                            padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout_p, self.masks = config.hidden_dropout_prob, config.dropout_masks
        self.max_positions = config.max_position_embeddings

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # inputs_embeds are *word* embeddings (HF semantics): objectives that perturb
        # the input (SMART, RIFT) perturb these, positions and types are added here.
        if inputs_embeds is None:
            if input_ids is None:
                raise ValueError("pass input_ids or inputs_embeds")
            inputs_embeds = self.word_embeddings(input_ids)  # (B, T, H)
        B, T, _ = inputs_embeds.shape
        if T > self.max_positions:
            raise ValueError(f"sequence length {T} exceeds max_position_embeddings {self.max_positions}")
        if token_type_ids is None:
            token_type_ids = torch.zeros((B, T), dtype=torch.long, device=inputs_embeds.device)
        pos = self.position_embeddings.weight[:T]  # (T, H), broadcast over B
        x = inputs_embeds + self.token_type_embeddings(token_type_ids) + pos
        return dropout(self.LayerNorm(x), self.dropout_p, self.training, self.masks)


def use_sdpa(impl: str, training: bool, device: torch.device) -> bool:
    """Whether attention calls ``F.scaled_dot_product_attention``: under ``attn_implementation="sdpa"``, except
    in training mode on a CPU. There, with attention dropout, SDPA itself falls back to the math path, which ours
    is with the cheaper dropout mask; without it, SDPA's training step is no faster in fp32 and slower in bf16
    (benchmarks/README.md, "Attention without dropout"). Inference goes through SDPA on every device."""
    return impl == "sdpa" and not (training and device.type == "cpu")


class BertSelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection.

    ``attn_implementation="sdpa"`` calls ``F.scaled_dot_product_attention``;
    ``"math"`` writes the same computation out (softmax(QKᵀ/√d + mask) V) and is
    the readable reference; tests check the two agree.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.n_head = config.num_attention_heads
        self.head_dim = config.head_dim
        self.hidden_size = config.hidden_size
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.dropout_p, self.masks = config.attention_probs_dropout_prob, config.dropout_masks
        self.impl = config.attn_implementation
        self._register_state_dict_hook(_split_qkv)
        self._register_load_state_dict_pre_hook(_fuse_qkv, with_module=True)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, T, H = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim)  # (B, T, 3, nh, hs)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, nh, T, hs)
        p = self.dropout_p if self.training else 0.0
        if use_sdpa(self.impl, self.training, x.device):
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # (B, nh, T, T)
            if mask is not None:
                att = att + mask
            att = dropout(att.softmax(dim=-1), p, self.training, self.masks)
            y = att @ v  # (B, nh, T, hs)
        return y.transpose(1, 2).reshape(B, T, H)  # (B, T, H)


def _split_qkv(module: nn.Module, state_dict: dict, prefix: str, local_metadata) -> None:
    """state_dict hook: write the fused projection as HF's query/key/value entries."""
    for kind in ("weight", "bias"):
        fused = state_dict.pop(prefix + "qkv." + kind)
        for name, part in zip(("query", "key", "value"), fused.chunk(3, dim=0)):
            # clone: safetensors refuses tensors that share storage
            state_dict[f"{prefix}{name}.{kind}"] = part.clone() if not part.requires_grad else part


def _fuse_qkv(module: nn.Module, state_dict: dict, prefix: str, local_metadata, strict,
              missing_keys, unexpected_keys, error_msgs) -> None:
    """load_state_dict pre-hook: accept HF's query/key/value and fuse them into qkv."""
    for kind in ("weight", "bias"):
        names = [f"{prefix}{n}.{kind}" for n in ("query", "key", "value")]
        if all(n in state_dict for n in names):
            parts = [state_dict.pop(n) for n in names]
            if len({tuple(p.shape) for p in parts}) != 1:
                error_msgs.append(f"{prefix}: query/key/value {kind} shapes differ: {[tuple(p.shape) for p in parts]}")
                continue
            state_dict[prefix + "qkv." + kind] = torch.cat(parts, dim=0)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout_p, self.masks = config.hidden_dropout_prob, config.dropout_masks

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        # post-LN
        return self.LayerNorm(dropout_add(self.dense(h), residual, self.dropout_p, self.training, self.masks))


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))  # (B, T, I)


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout_p, self.masks = config.hidden_dropout_prob, config.dropout_masks

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(dropout_add(self.dense(h), residual, self.dropout_p, self.training, self.masks))


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        a = self.attention(x, mask)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(config) for _ in range(config.num_hidden_layers)])
        self.gradient_checkpointing = config.gradient_checkpointing

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None,
                output_hidden_states: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        hidden = [x] if output_hidden_states else []
        for layer in self.layer:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, mask, use_reentrant=False)
            else:
                x = layer(x, mask)
            if output_hidden_states:
                hidden.append(x)
        return x, hidden


class BertPooler(nn.Module):
    """tanh(W h_[CLS] + b): BERT's next-sentence-prediction pooler."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(h[:, 0]))  # (B, H)


def extended_attention_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) with 1 = real token -> additive (B, 1, 1, T) mask: 0 where attended, dtype-min at padding."""
    m = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - m) * torch.finfo(dtype).min


class BertModel(nn.Module):
    """The BERT encoder. Returns a dict, the CS224N starter's contract:

    ``last_hidden_state`` (B, T, H), ``pooler_output`` (B, H) (absent without a pooler),
    and on request ``embedding_output`` (B, T, H) and ``hidden_states`` (L+1 tensors).
    """

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def freeze_bottom(self, n: int) -> None:
        """Train no more the embeddings and the lowest ``n`` layers (``requires_grad`` False): backward then stops at
        the lowest layer that trains, and the optimizer and gradient clipping skip the frozen weights (the word
        embeddings are half of MiniLM's)."""
        layers = self.encoder.layer
        if not 0 <= n <= len(layers):
            raise ValueError(f"cannot freeze {n} layers of an encoder of {len(layers)}")
        self.embeddings.requires_grad_(False)
        for layer in layers[:n]:
            layer.requires_grad_(False)

    def reinit_top_layers(self, n: int, pooler: bool = True) -> None:
        """Re-initialise the top ``n`` encoder layers (and the pooler, with ``pooler``) as a fresh model's, from
        torch's generator: Zhang et al. 2021, "Revisiting Few-sample BERT Fine-tuning" (ICLR), §5 (the top
        layers' pretrained weights specialise to the pretraining task and can hurt fine-tuning on little data)."""
        layers = self.encoder.layer
        if not 0 <= n <= len(layers):
            raise ValueError(f"cannot re-initialise {n} layers of an encoder of {len(layers)}")
        for layer in layers[len(layers) - n:]:
            layer.apply(self._init_weights)
        if pooler and n and self.pooler is not None:
            self.pooler.apply(self._init_weights)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Word embeddings only, (B, T, H): what ``inputs_embeds`` expects."""
        return self.embeddings.word_embeddings(input_ids)

    def set_attn_implementation(self, impl: str) -> None:
        self.config.attn_implementation = impl
        for layer in self.encoder.layer:
            layer.attention.self.impl = impl

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_embeddings: bool = False,
    ) -> dict[str, torch.Tensor]:
        emb = self.embeddings(input_ids, token_type_ids, inputs_embeds)  # (B, T, H)
        mask = None
        if attention_mask is not None:
            # On CPU a batch without padding skips the mask: SDPA then takes its
            # unmasked fast path. On CUDA we never ask (it would sync the device).
            if emb.device.type != "cpu" or not bool(attention_mask.all()):
                mask = extended_attention_mask(attention_mask, emb.dtype)
        h, hidden = self.encoder(emb, mask, output_hidden_states)
        out = {"last_hidden_state": h}
        if self.pooler is not None:
            out["pooler_output"] = self.pooler(h)
        if output_embeddings:
            out["embedding_output"] = emb
        if output_hidden_states:
            out["hidden_states"] = hidden
        return out
