"""Tests of benchmarks/gpu_pack.py: the pack of the embedded MiniLM and the data fits what may travel to a GPU call,
and what it holds loads back as the original (the encoder in float16)."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from benchmarks.gpu_pack import LIMIT_MIB, folder_bytes, pack
from minbert.pretrained import load_pretrained
from tests.helpers import DATA


def test_the_pack_of_minilm_and_the_data_fits_under_its_limit_and_loads_back(tmp_path):
    """Under LIMIT_MIB (60) with every data file the check reads; each data file unzips to the original bytes; the
    float16 encoder loads into the float32 model and gives the original's embeddings within float16 rounding."""
    if not (DATA / "ids-sst-train.csv").exists():
        pytest.skip("data/ missing: run `bash setup.sh`")
    info = pack(tmp_path / "pack", None, DATA)
    assert folder_bytes(tmp_path / "pack") < LIMIT_MIB * 2**20
    assert json.loads((tmp_path / "pack" / "pack.json").read_text())["total_mib"] == info["total_mib"]
    assert {"ids-sst-train.csv", "quora-train.csv", "sts-test-student.csv", "nli-train.csv",
            "sst-phrases-train.csv"} <= set(info["data_files"])
    assert not any("cfimdb" in name for name in info["data_files"])
    for name in info["data_files"]:
        assert gzip.decompress((tmp_path / "pack" / "data" / f"{name}.gz").read_bytes()) == (DATA / name).read_bytes()
    packed, tok = load_pretrained(str(tmp_path / "pack" / "minilm"))
    original, _ = load_pretrained()
    assert all(p.dtype == torch.float32 for p in packed.parameters())
    batch = tok(["a gripping, funny film", "the plot is thin"])
    with torch.no_grad():
        a = packed.eval()(**batch)["last_hidden_state"]
        b = original.eval()(**batch)["last_hidden_state"]
    assert not torch.equal(a, b) and torch.allclose(a, b, atol=2e-2)


def test_a_pack_over_the_limit_is_refused(tmp_path, monkeypatch, tiny_env):
    import benchmarks.gpu_pack as gpu_pack

    monkeypatch.setattr(gpu_pack, "LIMIT_MIB", 0)
    with pytest.raises(ValueError, match="more than the 0 MiB"):
        pack(tmp_path / "pack", str(tiny_env[0]), tiny_env[1])
    with pytest.raises(FileNotFoundError, match="--data-dir"):
        pack(tmp_path / "pack", str(tiny_env[0]), tmp_path / "nowhere")
