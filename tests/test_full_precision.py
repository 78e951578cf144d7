"""Outputs keep float32 precision under bf16 autocast (issue 16, item 3).

The encoder may run in bf16; the heads run in float32 (autocast off), so STS
scores and the logits ensembles average are not rounded to bf16's 8 bits.
"""

from __future__ import annotations

import pytest
import torch

from tasks.evaluation.evaluator import predict_dataset
from tests.test_evaluate import make_dataset
from tests.test_model import make_model

pytestmark = pytest.mark.usefixtures("one_thread")


def _bf16_rounded(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


@pytest.mark.parametrize("arch", ["baseline", "b1"])
@pytest.mark.parametrize("pair_encoding", ["siamese", "cross"])
@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_logits_are_not_rounded_to_bf16(arch, pair_encoding, task):
    model = make_model(arch, pair_encoding=pair_encoding).eval()
    ds = make_dataset(task, n=23, mode=pair_encoding)
    out = predict_dataset(model, task, ds, autocast_dtype=torch.bfloat16).logits
    assert out.dtype == torch.float32
    # float32 values: bf16 can hold ~ 1 in 2^16 of them, so nearly every score differs from its bf16 rounding
    assert (out != _bf16_rounded(out)).float().mean() > 0.5, out


def test_sts_score_is_the_float32_head_on_the_bf16_encoder_output():
    model = make_model("b1", pair_encoding="cross").eval()
    ds = make_dataset("sts", n=8, mode="cross")
    batch = ds.collate(list(range(len(ds))))
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = model("sts", batch).logits
            e = model.embed(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        assert e.dtype == torch.bfloat16
        e = e.float()
        want = model.config.sts_scale * torch.sigmoid(model.sts_head(model._features("sts", e)).squeeze(-1))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
