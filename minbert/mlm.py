"""BERT's masked-LM head and the Hugging Face ``BertForMaskedLM`` it makes with our encoder.

The MLM head (``BertMLMHead``) is BERT's (Devlin et al., 2019, §3.1; HF's
``BertOnlyMLMHead``): transform (dense H->H, activation, LayerNorm) and a
decoder whose weight is the word-embedding matrix (tied, same storage) plus an
output bias, under HF's names ``cls.predictions.*``. ``load_mlm`` loads it when
the checkpoint has one (bert-base-uncased does) and creates it fresh otherwise
(all-MiniLM-L6-v2, the embedded default, does not). ``checkpoint_state`` gives
the tensors of an HF ``BertForMaskedLM`` checkpoint (the tied decoder weight
stored once); ``load_pretrained(DIR)`` loads such a checkpoint's encoder (its
``cls.*`` head goes to the "other" tensors, which it does not use). Pretraining
with it: tasks/training/pretraining.py.

Usage:
    mlm, tokenizer, had_head = load_mlm()               # embedded MiniLM + a new head
    loss, logits, targets = mlm.masked_lm_loss(input_ids, attention_mask, labels)
"""

from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F
from torch import nn

from minbert.bert import BertModel, activation
from minbert.config import BertConfig
from minbert.pretrained import load_pretrained, map_hf_keys, read_state_dict, resolve_model_dir
from minbert.tokenizer import BertTokenizer

logger = logging.getLogger(__name__)


IGNORE_INDEX = -100


HEAD_PREFIX = "cls.predictions."


# Tensors a checkpoint must hold for its MLM head to be loaded (besides the tied decoder).
HEAD_KEYS = ("transform.dense.weight", "transform.dense.bias",
             "transform.LayerNorm.weight", "transform.LayerNorm.bias", "bias")


class BertPredictionHeadTransform(nn.Module):
    """dense H->H, the config's activation (GELU for BERT), LayerNorm: HF's names."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(h)))  # (..., H)


class BertMLMHead(nn.Module):
    """BERT's masked-LM head: transform, then decoder tied to the word embeddings, plus a bias.

    ``decoder.weight`` *is* the embedding matrix (the same Parameter), so the
    two are trained as one, as in BERT; ``bias`` is the output-only bias.
    """

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        if word_embeddings.weight.shape != (config.vocab_size, config.hidden_size):
            raise ValueError(f"word embeddings {tuple(word_embeddings.weight.shape)} do not match the config "
                             f"(vocab_size {config.vocab_size}, hidden_size {config.hidden_size})")
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied: one Parameter, one storage
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        std = config.initializer_range
        nn.init.normal_(self.transform.dense.weight, mean=0.0, std=std)
        nn.init.zeros_(self.transform.dense.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(h)) + self.bias  # (..., V)


class BertForMaskedLM(nn.Module):
    """Our encoder plus the MLM head; ``state_dict()`` has HF BertForMaskedLM names (``bert.*``, ``cls.*``)."""

    def __init__(self, bert: BertModel):
        super().__init__()
        self.bert = bert
        self.cls = nn.ModuleDict({"predictions": BertMLMHead(bert.config, bert.get_input_embeddings())})

    @property
    def head(self) -> BertMLMHead:
        return self.cls["predictions"]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Vocabulary logits at every position, (B, T, V)."""
        h = self.bert(input_ids, attention_mask, token_type_ids)["last_hidden_state"]  # (B, T, H)
        return self.head(h)

    def masked_lm_loss(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor,
                       positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss, logits at the masked positions (M, V), their targets (M,)).

        The head runs on the masked positions only; the loss equals
        ``mlm_loss(self(input_ids, ...), labels)``. ``positions``: their flat
        indices into (B·T), ``masked_positions(labels)`` computed where the labels
        were made (the CPU), so that M is known without reading the device; None
        computes them here from ``labels`` (a host read when labels live on an
        accelerator: a boolean-mask index has a data-dependent size).
        """
        h = self.bert(input_ids, attention_mask)["last_hidden_state"]  # (B, T, H)
        if positions is None:
            positions = masked_positions(labels)
        logits = self.head(h.flatten(0, 1).index_select(0, positions))  # (M, V)
        targets = labels.flatten().index_select(0, positions)  # (M,)
        return mlm_loss(logits, targets), logits, targets


def masked_positions(labels: torch.Tensor) -> torch.Tensor:
    """Flat indices (M,) into labels.flatten() of the positions whose label is not -100 (row-major order)."""
    return (labels.flatten() != IGNORE_INDEX).nonzero().squeeze(1)


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the positions whose label is not -100, in float32.

    logits (..., V), labels (...). Positions labelled -100 contribute nothing,
    whatever their logits. With no labelled position at all this is nan (as
    ``F.cross_entropy``), which ``mask_tokens`` never produces.
    """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX)


def _split_head(other: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ``cls.predictions.*`` tensors, prefix removed, old TF gamma/beta names mapped."""
    head = {}
    for key, t in other.items():
        if key.startswith(HEAD_PREFIX):
            k = key[len(HEAD_PREFIX):]
            if k.endswith(".gamma"):
                k = k[: -len("gamma")] + "weight"
            elif k.endswith(".beta"):
                k = k[: -len("beta")] + "bias"
            head[k] = t
    return head


def load_mlm(
    path: str | os.PathLike[str] | None = None, *, attn_implementation: str = "sdpa"
) -> tuple[BertForMaskedLM, BertTokenizer, bool]:
    """(model with MLM head, tokenizer, whether the head came from the checkpoint).

    ``path=None`` is the embedded all-MiniLM-L6-v2 (no MLM head: a new one is
    created). A partial head (some cls.predictions tensors missing) is an error.
    """
    d = resolve_model_dir(path)
    bert, tokenizer = load_pretrained(d, attn_implementation=attn_implementation)
    mlm = BertForMaskedLM(bert)
    _, other = map_hf_keys(read_state_dict(d))
    head = _split_head(other)
    if not head:
        logger.info("%s has no MLM head (cls.predictions.*): created a new one (transform random, "
                 "decoder tied to the word embeddings, zero bias)", d)
        return mlm, tokenizer, False
    if "bias" not in head and "decoder.bias" in head:  # some exports keep only the decoder's copy
        head["bias"] = head["decoder.bias"]
    missing = [HEAD_PREFIX + k for k in HEAD_KEYS if k not in head]
    if missing:
        raise ValueError(f"{d}: the checkpoint has a partial MLM head; missing {', '.join(missing)}")
    own = mlm.head.state_dict()
    for k in HEAD_KEYS:
        if head[k].shape != own[k].shape:
            raise ValueError(f"{d}: {HEAD_PREFIX}{k} has shape {tuple(head[k].shape)}, "
                             f"the model expects {tuple(own[k].shape)}")
    decoder = head.get("decoder.weight")
    if decoder is not None and not torch.equal(decoder.to(bert.embeddings.word_embeddings.weight.dtype),
                                               bert.embeddings.word_embeddings.weight.detach()):
        logger.warning("%s: %sdecoder.weight differs from the word embeddings; BERT ties them, "
                    "so the word embeddings are used", d, HEAD_PREFIX)
    with torch.no_grad():
        for k in HEAD_KEYS:
            own[k].copy_(head[k].to(own[k].dtype))
    logger.info("%s: loaded its MLM head (cls.predictions.*)", d)
    return mlm, tokenizer, True


def hf_config_dict(config: BertConfig) -> dict:
    """A flat HF config.json for ``config`` (extra keys kept), declaring BertForMaskedLM."""
    return config.to_hf_dict(("BertForMaskedLM",))


def checkpoint_state(mlm: BertForMaskedLM) -> dict[str, torch.Tensor]:
    """HF BertForMaskedLM tensors, contiguous, on CPU; the tied decoder weight left out (as HF saves it)."""
    state = mlm.state_dict()
    state.pop(HEAD_PREFIX + "decoder.weight")
    # clone: safetensors refuses tensors that share storage or are views
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
