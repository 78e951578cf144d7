"""GPU-only tests (marker ``gpu``; tests/conftest.py skips them where torch.cuda.is_available() is False).

On a GPU: a few training steps of the tiny model, with each objective, run under
``torch.cuda.set_sync_debug_mode("error")``, so any host synchronization in the hot
path (``.item()``, a blocking copy, boolean indexing) raises instead of stalling the
GPU. The two-process test on NCCL lives in tests/test_distributed.py.
"""

from __future__ import annotations

import pytest
import torch

from tasks.data.datasets import move_batch
from tasks.model import ModelConfig
from tasks.objectives import REGISTRY, import_all
from tasks.training.trainer import Trainer
from tests.test_device_faults import OBJECTIVE_SETTINGS
from tests.test_train import tiny_env, tiny_train_config  # noqa: F401  (tiny_env: the session fixture)

pytestmark = pytest.mark.gpu

import_all()
# distill needs teacher files written per test; its hot path is covered by tests/test_meta_and_syncs.py.
CASES = [None, *sorted(k for k, v in OBJECTIVE_SETTINGS.items() if v is not None)]


@pytest.mark.parametrize("objective", CASES)
@pytest.mark.parametrize("bf16", [False, True])
def test_training_steps_make_no_host_sync(tiny_env, tmp_path, objective, bf16):
    """Four training steps (after one outside, which may initialize lazily) raise no host synchronization."""
    if bf16 and not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip("this GPU has no native bf16")
    objectives = {} if objective is None else {objective: OBJECTIVE_SETTINGS[objective]}
    siamese = objective is not None and REGISTRY[objective].needs_siamese
    model = ModelConfig(arch="b1", pair_encoding="siamese" if siamese else "cross", fcn_size=16, head_dropout=0.1)
    cfg = tiny_train_config(tiny_env, tmp_path, device="cuda", bf16=bf16, objectives=objectives, epochs=1,
                            model=model)
    trainer = Trainer.from_config(cfg)
    trainer.model.train()
    plan = trainer.schedule.epoch_plan(0)[:5]
    batches = [(s, move_batch(trainer.train_sets[s].collate(idx), trainer.device)) for s, idx in plan]
    trainer.train_step(*batches[0], cfg.lr)
    torch.cuda.synchronize(trainer.device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for stream, batch in batches[1:]:
            trainer.train_step(stream, batch, cfg.lr)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize(trainer.device)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
