"""An objective needs only name, Config, tasks and forward: every other hook the loop calls has a no-op default.

A probe objective defined here, with nothing but those four, trains through
the whole run (loop, checkpoint, final predictions), and its terms are logged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from tasks.objectives import REGISTRY, Objective, ObjectiveConfig
from tasks.training.run import run
from tests.test_train import tiny_env, tiny_train_config  # noqa: F401  (tiny_env: the session fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass
class ProbeConfig(ObjectiveConfig):
    weight: float = 0.5


def test_a_config_that_is_not_an_objective_config_is_refused_at_registration():
    """Every Config has weight and tasks because it subclasses ObjectiveConfig: a plain dataclass is refused by
    name when its objective class is defined, not found missing mid-run."""

    @dataclass
    class Plain:
        weight: float = 1.0

    with pytest.raises(TypeError, match="'probe_plain': its Config must subclass"):
        class PlainProbe(Objective):
            name = "probe_plain"
            Config = Plain

            def forward(self, model, task, batch, out):
                return {}
    assert "probe_plain" not in REGISTRY


@pytest.fixture
def probe():
    """A minimal objective, registered for this test only (the registry is global)."""

    class Probe(Objective):
        name = "probe_minimal"
        Config = ProbeConfig
        tasks = ("sst",)

        def forward(self, model, task, batch, out):
            return {"logit_norm": out.logits.float().pow(2).mean()}

    yield Probe
    del REGISTRY["probe_minimal"]


def test_a_minimal_objective_runs_through_a_whole_run(probe, tiny_env, tmp_path):
    """name + Config + tasks + forward suffice: the run trains, checkpoints and predicts, and logs the term."""
    summary = run(tiny_train_config(tiny_env, tmp_path / "run", epochs=1, objectives={"probe_minimal": {}}))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["train"]["sst/probe_minimal.logit_norm"] > 0
    assert "para/probe_minimal.logit_norm" not in records[0]["train"]  # tasks = ("sst",)
    assert summary["final"] and (tmp_path / "run" / "predictions" / "sst-dev-output.csv").is_file()


def test_the_probe_term_enters_the_loss_with_its_weight(probe, tiny_env, tmp_path):
    """The trainer adds weight x term to the step's loss (checked against the head loss alone)."""
    from tasks.training.trainer import Trainer

    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1, objectives={"probe_minimal": {"weight": 0.5}})
    trainer = Trainer.from_config(cfg)
    trainer.model.eval()  # no dropout: the two losses see the same forward
    batch = trainer.train_sets["sst"].collate(list(range(8)))
    loss, terms = trainer.step_loss("sst", batch)
    torch.testing.assert_close(loss, terms["sst/loss"] + 0.5 * terms["sst/probe_minimal.logit_norm"])
