"""Tests of minbert/pretrained.py, checkpoint loading: layouts we accept, and the errors a user sees for bad
directories."""

from __future__ import annotations

import json
import logging
import shutil

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


def test_pretrained_hub_name_gets_an_offline_hint():
    with pytest.raises(FileNotFoundError, match="huggingface-cli download bert-base-uncased --local-dir DIR"):
        load_pretrained("bert-base-uncased")
