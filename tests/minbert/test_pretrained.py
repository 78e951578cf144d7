"""Tests of minbert/pretrained.py, checkpoint loading: layouts we accept, and the errors a user sees for bad
directories."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from minbert.bert import BertModel
from minbert.pretrained import load_pretrained, map_hf_keys, resolve_model_dir
from tests.helpers import tiny_config


def _write_checkpoint(tmp_path, state, cfg, weights="model.safetensors"):
    d = tmp_path / "ckpt"
    d.mkdir()
    hf_cfg = {k: v for k, v in cfg.to_dict().items() if k not in ("extra", "attn_implementation")}
    (d / "config.json").write_text(json.dumps(hf_cfg))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"tok{i}" for i in range(cfg.vocab_size - 5)]
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    if weights.endswith(".safetensors"):
        save_file({k: v.contiguous() for k, v in state.items()}, str(d / weights))
    else:
        torch.save(state, d / weights)
    return d


def test_roundtrip_safetensors(tmp_path):
    """A tiny model saved as HF safetensors loads back with identical outputs."""
    cfg = tiny_config()
    m = BertModel(cfg).eval()
    d = _write_checkpoint(tmp_path, m.state_dict(), cfg)
    m2, tok = load_pretrained(d)
    ids = torch.randint(5, 99, (2, 6))
    assert torch.equal(m(ids)["pooler_output"], m2.eval()(ids)["pooler_output"])
    assert len(tok) == 99


def test_bin_with_bert_prefix_and_gamma_beta(tmp_path):
    """pytorch_model.bin in BertForPreTraining layout (bert. prefix, LayerNorm gamma/beta, cls.* head) loads."""
    cfg = tiny_config()
    m = BertModel(cfg).eval()
    state = {}
    for k, v in m.state_dict().items():
        k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        state["bert." + k] = v
    state["cls.predictions.bias"] = torch.zeros(cfg.vocab_size)
    d = _write_checkpoint(tmp_path, state, cfg, weights="pytorch_model.bin")
    m2, _ = load_pretrained(d)
    ids = torch.randint(5, 99, (2, 6))
    assert torch.equal(m(ids)["last_hidden_state"], m2.eval()(ids)["last_hidden_state"])
    enc, other = map_hf_keys(state)
    assert "cls.predictions.bias" in other and "embeddings.LayerNorm.weight" in enc


def test_checkpoint_without_pooler_warns(tmp_path, caplog):
    """An MLM-only checkpoint (no pooler) loads with a warning naming the missing pooler."""
    cfg = tiny_config()
    state = {k: v for k, v in BertModel(cfg).state_dict().items() if not k.startswith("pooler.")}
    d = _write_checkpoint(tmp_path, state, cfg)
    with caplog.at_level(logging.WARNING):
        load_pretrained(d)
    assert "no pooler" in caplog.text


def test_a_pooler_the_model_does_not_have_is_no_warning_an_unknown_key_is(tmp_path, caplog):
    """A checkpoint's pooler loaded into a model built without one is as intended (DEBUG, nothing a user can do);
    a key the encoder does not have (e.g. a layer beyond its depth) is still a warning naming it."""
    cfg = tiny_config()
    d = _write_checkpoint(tmp_path, BertModel(cfg).state_dict(), cfg)
    with caplog.at_level(logging.DEBUG):
        load_pretrained(d, add_pooling_layer=False)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "pooler's weights are not used" in caplog.text

    state = BertModel(cfg).state_dict()
    state["encoder.layer.7.output.dense.bias"] = torch.zeros(cfg.hidden_size)
    shutil.rmtree(d)
    d = _write_checkpoint(tmp_path, state, cfg)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        load_pretrained(d, add_pooling_layer=False)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{d}: ignored unexpected keys: encoder.layer.7.output.dense.bias"]


def test_missing_directory_is_clear():
    """A wrong path names the path and what a checkpoint directory holds."""
    with pytest.raises(FileNotFoundError, match="no checkpoint directory at .*does-not-exist"):
        resolve_model_dir("/tmp/does-not-exist")


def test_missing_weights_file_is_clear(tmp_path):
    """A directory without weights names the files it looked for."""
    cfg = tiny_config()
    d = _write_checkpoint(tmp_path, BertModel(cfg).state_dict(), cfg)
    (d / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors, pytorch_model.bin"):
        load_pretrained(d)


def test_shape_mismatch_is_clear(tmp_path):
    """Weights that do not fit config.json name the tensor and both shapes."""
    cfg = tiny_config()
    d = _write_checkpoint(tmp_path, BertModel(tiny_config(intermediate_size=40)).state_dict(), cfg)
    with pytest.raises(ValueError, match=r"shape mismatch for encoder\.layer\.0\.intermediate\.dense\.(weight|bias): checkpoint \(40"):
        load_pretrained(d)


def test_missing_layer_weights_are_an_error(tmp_path):
    """A checkpoint lacking encoder weights is refused with the missing names (not silently random)."""
    cfg = tiny_config()
    state = {k: v for k, v in BertModel(cfg).state_dict().items() if "layer.1." not in k}
    d = _write_checkpoint(tmp_path, state, cfg)
    with pytest.raises(ValueError, match=r"missing encoder weights: encoder\.layer\.1\."):
        load_pretrained(d)


def test_float16_copy_of_packaged_model_loads(tmp_path):
    """A float16 copy of the packaged model (what travels to a GPU box) loads into fp32 within fp16 rounding."""
    src = resolve_model_dir(None)
    d = tmp_path / "fp16"
    d.mkdir()
    for f in ("config.json", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(src / f, d / f)
    from safetensors.torch import load_file

    state = {k: v.half() if v.is_floating_point() else v for k, v in load_file(str(src / "model.safetensors")).items()}
    save_file(state, str(d / "model.safetensors"))
    m16, _ = load_pretrained(d)
    m32, _ = load_pretrained()
    w16 = m16.embeddings.word_embeddings.weight
    assert w16.dtype == torch.float32
    assert torch.allclose(w16, m32.embeddings.word_embeddings.weight, atol=1e-3)


# ---- Hugging Face model names, through the hub's cache ----------------------------------------------------------


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test: a name that is cached must load without the Hub."""
    import socket

    def refuse(*args, **kwargs):
        pytest.fail(f"a network connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def _write_hub_cache(hf_home, repo_id, state, cfg, revision="main", commit="0" * 39 + "1"):
    """``repo_id`` at ``commit`` in huggingface_hub's own cache layout under ``hf_home``: the files as blobs
    named by their hash, the snapshot's entries symlinks to them, ``refs/<revision>`` holding the commit."""
    import hashlib

    src = _write_checkpoint(hf_home, state, cfg) if not (hf_home / "ckpt").exists() else hf_home / "ckpt"
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for f in src.iterdir():
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy(f, blob)
        (snapshot / f.name).symlink_to(Path("..", "..", "blobs", blob.name))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return snapshot


def test_a_hub_name_loads_from_the_cache_offline(tmp_path, monkeypatch, no_network):
    """A model name loads from a cache in the hub's layout under HF_HOME (set after huggingface_hub was imported)
    with the same outputs as the weights written there, with HF_HUB_OFFLINE unset and any connection refused:
    the cache is read before the Hub is asked."""
    cfg = tiny_config()
    m = BertModel(cfg).eval()
    snapshot = _write_hub_cache(tmp_path, "tiny-org/tiny-bert", m.state_dict(), cfg)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)  # no local directory of that name
    assert resolve_model_dir("tiny-org/tiny-bert") == snapshot
    m2, tok = load_pretrained("tiny-org/tiny-bert")
    ids = torch.randint(5, 99, (2, 6))
    assert torch.equal(m(ids)["last_hidden_state"], m2.eval()(ids)["last_hidden_state"]) and len(tok) == 99
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model_dir("tiny-org/tiny-bert") == snapshot


def test_a_revision_picks_its_snapshot_and_a_local_directory_comes_first(tmp_path, monkeypatch, no_network):
    """NAME@REVISION reads refs/REVISION (a tag) or a commit's snapshot; a directory named like the model wins."""
    cfg = tiny_config()
    main = _write_hub_cache(tmp_path, "tiny-org/tiny-bert", BertModel(cfg).state_dict(), cfg)
    tagged = _write_hub_cache(tmp_path, "tiny-org/tiny-bert", BertModel(cfg).state_dict(), cfg, revision="v1",
                              commit="f" * 40)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    assert resolve_model_dir("tiny-org/tiny-bert@v1") == tagged
    assert resolve_model_dir("tiny-org/tiny-bert@" + "f" * 40) == tagged
    assert resolve_model_dir("tiny-org/tiny-bert@main") == main
    shutil.copytree(tmp_path / "ckpt", tmp_path / "tiny-org" / "tiny-bert")
    assert resolve_model_dir("tiny-org/tiny-bert").resolve() == tmp_path / "tiny-org" / "tiny-bert"


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "no network"])
def test_a_name_not_cached_offline_says_how_to_get_it(tmp_path, monkeypatch, offline):
    """With HF_HUB_OFFLINE set, or the Hub unreachable (found in one try), a name that is not cached is one line
    naming the cache and the command that fetches it (and its revision)."""
    import socket

    def unreachable(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(socket.socket, "connect", unreachable)
    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(socket, "getaddrinfo", unreachable)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
    monkeypatch.chdir(tmp_path)
    tries = []
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: tries.append(a) or unreachable())
    with pytest.raises(FileNotFoundError) as e:
        load_pretrained("google-bert/bert-base-uncased@v2")
    assert len(tries) == (0 if offline else 1)  # one quick try, not the hub library's retries over half a minute
    message = str(e.value)
    assert "\n" not in message
    assert f"not in the cache {tmp_path / 'hub'}" in message
    assert "`hf download google-bert/bert-base-uncased --revision v2`" in message
    assert ("HF_HUB_OFFLINE is set" if offline else "the Hub could not be reached") in message


def test_a_path_is_not_taken_for_a_hub_name():
    """Paths a user spells as paths never reach the Hub; names with a revision do."""
    from minbert.pretrained import is_hub_name

    assert is_hub_name("bert-base-uncased") and is_hub_name("google-bert/bert-base-uncased@refs/pr/1")
    assert not any(map(is_hub_name, ("/tmp/x", "./x", "~/x", "../x", "a/b/c", "a--b", "")))


def test_a_bin_file_holding_code_is_refused_in_one_line_that_keeps_the_protection(tmp_path):
    """A pytorch_model.bin whose pickle names a function (code that loading would run) is refused: one ValueError
    naming the file and why, never torch's advice to turn weights_only off."""
    cfg = tiny_config()
    state = {**BertModel(cfg).state_dict(), "hook": print}  # a global a weights-only load must refuse
    d = _write_checkpoint(tmp_path, state, cfg, weights="pytorch_model.bin")
    with pytest.raises(ValueError, match="pytorch_model.bin holds code, not only tensors, and is refused") as refused:
        load_pretrained(d)
    assert "weights_only" not in str(refused.value)
