"""Tests of benchmarks/gpu_pack.py: the pack of the embedded MiniLM and the data fits, with the checkout's files, what
travels to a GPU call; it holds only what the check reads, and that loads back as the original (the encoder in
float16)."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from benchmarks.gpu_pack import LIMIT_MIB, MODEL_FILES, folder_bytes, pack, tracked_bytes
from minbert.pretrained import load_pretrained
from tests.helpers import DATA, ROOT


def test_the_pack_of_minilm_and_the_data_fits_beside_the_checkout_and_loads_back(tmp_path):
    """The checkout's travelling files and the pack together under LIMIT_MIB (64), with every data file the check
    reads and no other (no NLI, no cfimdb), the encoder's weights and the files our loader reads; the commit is
    recorded (.git does not travel); each data file unzips to the original bytes; the float16 encoder loads into
    the float32 model and gives the original's embeddings within float16 rounding."""
    if not (DATA / "ids-sst-train.csv").exists():
        pytest.skip("data/ missing: run `bash setup.sh`")
    info = pack(tmp_path / "pack", None, DATA)
    assert tracked_bytes(ROOT) + folder_bytes(tmp_path / "pack") < LIMIT_MIB * 2**20
    recorded = json.loads((tmp_path / "pack" / "pack.json").read_text())
    assert recorded["total_mib"] == info["total_mib"] and len(recorded["commit"]) == 40
    assert set(info["data_files"]) == {"ids-sst-train.csv", "ids-sst-dev.csv", "ids-sst-test-student.csv",
                                       "quora-train.csv", "quora-dev.csv", "sts-train.csv", "sts-dev.csv",
                                       "sts-test-student.csv", "sst-phrases-train.csv"} | {
        p.name for p in DATA.glob("quora-test*.csv")}
    assert sorted(p.name for p in (tmp_path / "pack" / "minilm").iterdir()) == sorted(
        [*MODEL_FILES, "model.safetensors"])
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
