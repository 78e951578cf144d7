"""experiments/sst_prior_phrases.py: a run's head comes back from its saved mixture, and a refit probe scores as
the prior would have with it."""

from __future__ import annotations

import json

import torch

from experiments.sst_prior_phrases import (
    OWN,
    fit_probes,
    head_probabilities,
    probe_probabilities,
    run_config,
    score_run,
)
from tasks.checkpoint import prior_file
from tasks.train_config import TrainConfig
from tasks.predictions import Predictions, write_logits
from tasks.evaluation.priors import fit_logistic_regression
from tasks.storage import save_tensors


def fake_run(tmp_path, head: torch.Tensor, probe: dict[str, torch.Tensor], x: torch.Tensor, weight: float):
    """A run directory as a finished run leaves it: config.json, the dev SST logits (log of the mixture of
    ``head`` and ``probe`` on ``x``) and the probe in the best checkpoint."""
    run = tmp_path / "arm" / "seed0"
    (run / "checkpoints" / "best").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(TrainConfig(prior_weights={"sst": weight, "sts": 0.5}).to_dict()))
    mixed = (1 - weight) * head.softmax(-1) + weight * probe_probabilities(probe, x)
    ids = [f"s{i}" for i in range(len(x))]
    write_logits(run / "predictions", "sst", "dev", Predictions(ids, mixed.log(), mixed.argmax(-1)))
    save_tensors(run / "checkpoints" / "best" / prior_file("sst"), probe)
    return run, ids


def test_head_comes_back_and_a_refit_probe_scores_as_the_prior_would():
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(40, 6, generator=g), dim=-1)
    y = torch.randint(0, 5, (40,), generator=g)
    head = 3 * torch.randn(40, 5, generator=g)
    probe = fit_logistic_regression(x, y, 5)
    p = probe_probabilities(probe, x)
    saved = (0.6 * head.softmax(-1) + 0.4 * p).log()
    torch.testing.assert_close(head_probabilities(saved, p, 0.4), head.softmax(-1), atol=1e-6, rtol=0)


def test_score_run_keeps_its_own_score_with_its_own_probe_and_changes_with_another(tmp_path):
    g = torch.Generator().manual_seed(1)
    x = torch.nn.functional.normalize(torch.randn(60, 6, generator=g), dim=-1)
    y = torch.randint(0, 5, (60,), generator=g)
    head = torch.randn(60, 5, generator=g)
    own = fit_logistic_regression(x, y, 5)
    other = {"weight": -own["weight"], "bias": own["bias"]}  # a probe that disagrees
    run, ids = fake_run(tmp_path, head, own, x, 0.5)
    dev = {i: (x[k], int(y[k])) for k, i in enumerate(ids)}
    scores = score_run(run, run_config(run), dev, {0.0: own, 1.0: other})
    mixed = 0.5 * head.softmax(-1) + 0.5 * probe_probabilities(own, x)
    assert scores[OWN] == scores["0.0"] == (mixed.argmax(-1) == y).float().mean().item()
    want = ((0.5 * head.softmax(-1) + 0.5 * probe_probabilities(other, x)).argmax(-1) == y).float().mean().item()
    assert scores["1.0"] == want != scores[OWN]


def test_fit_probes_weights_the_phrases():
    """w = 0 fits the sentences alone; w = 1 is the probe of sentences and phrases pooled."""
    g = torch.Generator().manual_seed(2)
    xs, xp = torch.randn(50, 4, generator=g), torch.randn(30, 4, generator=g)
    ys, yp = torch.randint(0, 5, (50,), generator=g), torch.randint(0, 5, (30,), generator=g)
    probes = fit_probes(xs, ys, xp, yp, [0.0, 1.0])
    torch.testing.assert_close(probes[0.0]["weight"], fit_logistic_regression(xs, ys, 5)["weight"])
    pooled = fit_logistic_regression(torch.cat([xs, xp]), torch.cat([ys, yp]), 5)
    torch.testing.assert_close(probes[1.0]["weight"], pooled["weight"], atol=1e-4, rtol=0)
