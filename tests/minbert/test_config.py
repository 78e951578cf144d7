"""Tests of minbert/config.py: BertConfig reads a Hugging Face config.json as transformers reads it, writes one
transformers accepts, and refuses what the encoder does not compute."""

from __future__ import annotations

import dataclasses
import json

import pytest
import transformers

from minbert.config import RUNTIME_FIELDS, BertConfig
from minbert.pretrained import resolve_model_dir
from tests.helpers import tiny_config

MODELLED = [f.name for f in dataclasses.fields(BertConfig) if f.name not in ("extra", *RUNTIME_FIELDS)]


def test_config_rejects_unsupported_keys():
    """A config asking for something the encoder does not compute is an error, not ignored."""
    with pytest.raises(ValueError, match="position_embedding_type"):
        BertConfig.from_dict({"position_embedding_type": "relative_key"})
    with pytest.raises(ValueError, match="multiple"):
        BertConfig(hidden_size=30, num_attention_heads=4)
    cfg = BertConfig.from_dict({"hidden_size": 64, "num_attention_heads": 4, "some_bookkeeping": 1})
    assert cfg.extra == {"some_bookkeeping": 1}


def test_the_packaged_config_json_reads_as_transformers_reads_it():
    """Every hyper-parameter we model has the value transformers.BertConfig reads from the same file."""
    path = resolve_model_dir(None) / "config.json"
    ours, theirs = BertConfig.from_json_file(path), transformers.BertConfig.from_json_file(str(path))
    assert {k: getattr(ours, k) for k in MODELLED} == {k: getattr(theirs, k) for k in MODELLED}
    assert ours.hidden_size == json.loads(path.read_text())["hidden_size"] != BertConfig().hidden_size


def test_the_hf_dict_is_a_bert_config_for_transformers_and_reads_back(tmp_path):
    """to_hf_dict: transformers' AutoConfig reads it as the same BERT (our runtime fields left out, extra keys kept
    at the top level), and BertConfig.from_dict of it gives the same hyper-parameters back."""
    cfg = tiny_config(attn_implementation="math", extra={"note": "kept"})
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(hf) is transformers.BertConfig and hf.architectures == ["BertModel"] and hf.note == "kept"
    assert {k: getattr(hf, k) for k in MODELLED} == {k: getattr(cfg, k) for k in MODELLED}
    assert not set(RUNTIME_FIELDS) & set(cfg.to_hf_dict())
    back = BertConfig.from_dict(cfg.to_hf_dict())
    assert {k: getattr(back, k) for k in MODELLED} == {k: getattr(cfg, k) for k in MODELLED}
    assert back.extra["note"] == "kept"


def test_a_missing_or_unreadable_config_file_names_its_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no BERT config at .*none.json"):
        BertConfig.from_json_file(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text('{"hidden_size": ')
    with pytest.raises(ValueError, match="bad.json: not valid JSON"):
        BertConfig.from_json_file(tmp_path / "bad.json")
