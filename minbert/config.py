"""BertConfig: the encoder's hyper-parameters, read from a Hugging Face config.json.

Usage:
    cfg = BertConfig.from_json_file("path/to/config.json")
    tiny = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=37)

Keys we do not model are kept in ``extra`` (so a config round-trips), but a key
whose value would change the computation in a way this encoder does not
implement (a decoder, relative positions, ...) is an error, never a silent default.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
ATTN_IMPLEMENTATIONS = ("sdpa", "math")
# Ours, not HF's: how this process runs the encoder; left out of a HF config.json.
RUNTIME_FIELDS = ("attn_implementation", "gradient_checkpointing", "dropout_masks")
DROPOUT_MASKS = ("exact", "bytes")

# Keys of HF configs that describe training or bookkeeping only: kept in `extra`.
# Keys listed in _MUST_BE are accepted only with the value that our encoder computes.
_MUST_BE: dict[str, Any] = {
    "is_decoder": False,
    "add_cross_attention": False,
    "position_embedding_type": "absolute",
    "model_type": "bert",
}


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # Ours, not HF's: which attention kernel; both give the same numbers.
    attn_implementation: str = "sdpa"
    # Recompute each layer's activations in backward to save memory (bert-base on small GPUs).
    gradient_checkpointing: bool = False
    # How dropout masks are drawn on a CPU (minbert.bert.dropout_mask): "exact" (24 bits of one draw an element) or
    # "bytes" (three elements a draw: p rounded up to 1/256).
    dropout_masks: str = "exact"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; choose one of {ACTIVATIONS}")
        if self.dropout_masks not in DROPOUT_MASKS:
            raise ValueError(f"dropout_masks {self.dropout_masks!r} is not one of {DROPOUT_MASKS}")
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(
                f"attn_implementation {self.attn_implementation!r} is not one of {ATTN_IMPLEMENTATIONS}"
            )
        for name, p in (("hidden_dropout_prob", self.hidden_dropout_prob),
                        ("attention_probs_dropout_prob", self.attention_probs_dropout_prob)):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {p}")
        for key, want in _MUST_BE.items():
            if key in self.extra and self.extra[key] != want:
                raise ValueError(
                    f"config sets {key}={self.extra[key]!r}; this encoder only implements {key}={want!r}"
                )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BertConfig":
        known = {f.name for f in fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in d.items() if k in known}
        extra = dict(d.get("extra", {}))
        extra.update({k: v for k, v in d.items() if k not in known and k != "extra"})
        return cls(**kwargs, extra=extra)

    @classmethod
    def from_json_file(cls, path: str | Path) -> "BertConfig":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no BERT config at {path}")
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from e
        return cls.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_hf_dict(self, architectures: tuple[str, ...] = ("BertModel",)) -> dict[str, Any]:
        """A flat HF config.json (``extra`` keys at top level, our runtime fields left out) that
        ``transformers.AutoConfig`` reads as a BERT config declaring ``architectures``."""
        d = self.to_dict()
        extra = d.pop("extra")
        for k in RUNTIME_FIELDS:
            d.pop(k)
        out = {**extra, **d, "architectures": list(architectures), "model_type": "bert"}
        return dict(sorted(out.items()))

    def to_json_file(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
