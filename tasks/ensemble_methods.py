"""How an ensemble combines its models' logits: simple average, selective subset, regression weights.

The three methods of the minBERT paper §4.6 as functions of in-memory logits
(float64 tensors, one per model); tasks.ensemble reads the runs' files, applies
them per task and writes the leaderboard files.

Usage:
    logits, preds = average("sst", [run_a, run_b])                 # (N, 5), (N,)
    subset, dev_score = select_subset("sst", [run_a, run_b, run_c], dev_labels)
    fit = fit_regression("para", [run_a, run_b], labels); logits, preds = fit.apply([a_test, b_test])
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tasks.evaluate import score


def predict(task: str, logits: torch.Tensor) -> torch.Tensor:
    """A single model's predictions, the rule of tasks.model.MultitaskBert.predict."""
    if task == "sst":
        return logits.argmax(-1)
    if task == "para":
        return (logits > 0).long()
    return logits


def average(task: str, logits: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Simple ensemble of models' logits: (ensemble logits, predictions), in float64.

    SST: mean of softmax probabilities; logits = log of that mean; prediction its argmax.
    Paraphrase: mean of sigmoid probabilities, computed as the mean of
    tanh(x/2) = 2p - 1 so that its sign (p > 1/2) is exact even for tiny
    logits; logits = log(p̄ / (1 - p̄)), which has the prediction's sign.
    STS: mean score. One model, or identical models, give back that model's
    predictions exactly.
    """
    if not logits:
        raise ValueError("average of no models")
    x = torch.stack([t.double() for t in logits])  # (M, N[, 5])
    m = x.shape[0]
    if task == "sst":
        probs = x.softmax(-1).mean(0)  # (N, 5)
        ens = torch.logsumexp(x.log_softmax(-1), 0) - math.log(m)  # log mean p, finite
        return ens, probs.argmax(-1)
    if task == "para":
        centred = torch.tanh(x / 2).mean(0)  # (N,) = 2 p̄ - 1
        # log p̄ - log(1 - p̄): as 2 atanh(2p̄ - 1) near p̄ = 1/2 (keeps the sign of tiny logits),
        # through log-sigmoids elsewhere (finite where tanh has saturated to ±1)
        far = torch.logsumexp(F.logsigmoid(x), 0) - torch.logsumexp(F.logsigmoid(-x), 0)
        near = 2 * torch.atanh(centred.clamp(-0.5, 0.5))
        ens = torch.where(centred.abs() < 0.5, near, far)
        return ens, (centred > 0).long()
    mean = x.mean(0)  # (N,)
    return mean, mean


def _contributions(task: str, logits: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-model quantities whose mean decides the simple ensemble's prediction (for fast subset search)."""
    x = torch.stack([t.double() for t in logits])
    if task == "sst":
        return x.softmax(-1)
    if task == "para":
        return torch.tanh(x / 2)
    return x


def _safe(value: float) -> float:
    """nan scores (constant STS predictions) rank below everything."""
    return -math.inf if math.isnan(value) else value


def select_subset(task: str, logits: Sequence[torch.Tensor], labels: torch.Tensor,
                  max_exhaustive: int = 10) -> tuple[tuple[int, ...], float]:
    """The model subset whose simple average scores best on (``logits``, ``labels``), and that score.

    Every non-empty subset when there are at most ``max_exhaustive`` models
    (2^M - 1 of them), greedy forward selection otherwise (add the model that
    helps most, stop when none helps). Ties go to the smaller subset, then the
    earlier models.
    """
    contrib = _contributions(task, logits)  # (M, N[, 5])
    n_models = contrib.shape[0]

    def subset_score(subset: Sequence[int]) -> float:
        mean = contrib[list(subset)].mean(0)
        return _safe(score(task, predict(task, mean), labels))  # para: mean tanh(x/2) > 0 iff mean p > 1/2

    if n_models <= max_exhaustive:
        best, best_score = (), -math.inf
        for k in range(1, n_models + 1):
            for subset in itertools.combinations(range(n_models), k):
                s = subset_score(subset)
                if s > best_score:
                    best, best_score = subset, s
        return best, best_score
    chosen: list[int] = []
    best_score = -math.inf
    while len(chosen) < n_models:
        candidates = [(subset_score(chosen + [m]), -m) for m in range(n_models) if m not in chosen]
        s, neg_m = max(candidates)
        if s <= best_score:
            break
        chosen.append(-neg_m)
        best_score = s
    return tuple(sorted(chosen)), best_score


@dataclass
class RegressionFit:
    """Weights of the regression ensembler for one task: z = Σ_m w_m · logits_m (+ bias)."""

    task: str
    weights: list[float]
    bias: float | None
    n_fit: int
    objective: str

    def apply(self, logits: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ensemble logits, predictions); SST logits (N, 5), paraphrase logit / STS score (N,)."""
        x = torch.stack([t.double() for t in logits])  # (M, N[, 5])
        if x.shape[0] != len(self.weights):
            raise ValueError(f"{self.task}: fit on {len(self.weights)} models, applied to {x.shape[0]}")
        w = torch.tensor(self.weights, dtype=torch.float64).view(-1, *([1] * (x.dim() - 1)))
        z = (w * x).sum(0)
        if self.bias is not None:
            z = z + self.bias
        return z, predict(self.task, z)


def fit_regression(task: str, logits: Sequence[torch.Tensor], labels: torch.Tensor, l2: float = 1e-3,
                   max_iter: int = 300) -> RegressionFit:
    """Fit the regression ensembler's weights on (``logits``, ``labels``).

    SST: softmax(Σ w_m x_m), cross-entropy; paraphrase: sigmoid(Σ w_m x_m + b),
    binary cross-entropy; both minimised by L-BFGS (strong Wolfe line search)
    from w = 1/M, with ``l2`` · Σ w_m² added so that a useless model's weight
    goes to 0 rather than wandering. STS: least squares of the gold score on
    [scores, 1] (closed form; the paper did not ensemble STS this way).
    """
    x = torch.stack([t.double() for t in logits])  # (M, N[, 5])
    n_models, n = x.shape[0], x.shape[1]
    y = labels.double()
    if task == "sts":
        design = torch.cat([x.T, torch.ones(n, 1, dtype=torch.float64)], dim=1)  # (N, M + 1)
        sol = torch.linalg.lstsq(design, y.unsqueeze(1)).solution.squeeze(1)  # (M + 1,)
        return RegressionFit(task, sol[:-1].tolist(), float(sol[-1]), n, "least squares")
    w = torch.full((n_models,), 1.0 / n_models, dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=task == "para")
    params = [w, b] if task == "para" else [w]
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, tolerance_grad=1e-10, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def objective() -> torch.Tensor:
        if task == "sst":
            z = torch.einsum("m,mnc->nc", w, x)  # (N, 5)
            data = F.cross_entropy(z, y.long())
        else:
            z = torch.einsum("m,mn->n", w, x) + b  # (N,)
            data = F.binary_cross_entropy_with_logits(z, y)
        return data + l2 * (w * w).sum()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    opt.step(closure)
    return RegressionFit(task, w.detach().tolist(), float(b.detach()) if task == "para" else None, n,
                         "softmax cross-entropy" if task == "sst" else "sigmoid binary cross-entropy")


def split_halves(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded random split of range(n): (dev-train indices, dev-dev indices), sizes n//2 and n - n//2."""
    if n < 2:
        raise ValueError(f"cannot split {n} dev examples into two halves")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[: n // 2].sort().values, perm[n // 2:].sort().values
