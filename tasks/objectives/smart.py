"""SMART: smoothness-inducing adversarial regularization in word-embedding space.

Paper: Jiang et al. 2020, "SMART: Robust and Efficient Fine-Tuning for
Pre-trained Natural Language Models through Principled Regularized
Optimization" (ACL), eq. 3 (the regularizer R_s) and Algorithm 1 (its
projected-ascent solver); used as in
../shared/papers/minbert-downstream-generalization.txt §4.4
("Smoothness-Inducing Adversarial Regularization"), for all three tasks.

    R_s(θ) = 1/n Σ_i  max_{‖x̃_i − x_i‖_∞ ≤ ε}  l_s(f(x̃_i; θ), f(x_i; θ))

x are the word embeddings e = ``model.encoder.embed_tokens(ids)`` (position and
token-type embeddings are added after, inside the encoder). The max is taken
approximately, as Algorithm 1:

    δ_0 ~ N(0, σ²) on real tokens                           (σ = 1e-5)
    repeat ``steps`` times (default 1):
        g = ∇_δ l_s(f(e + δ), f(e))                        clean output detached
        δ ← δ + η · g / ‖g‖_∞                              η = 1e-3, ‖·‖_∞ per example
        δ ← clamp(δ, −ε, ε)                                project to the L∞ ball, ε = 1e-5
    penalty = l_s(f(e + δ), f(e))                           weighted by λ_s = ``weight``

l_s, by the task's kind (``DIVERGENCES``; another kind is refused): symmetric KL, KL(P‖Q) + KL(Q‖P), for
classification (SST: softmax over 5 classes; paraphrase: the Bernoulli of the logit, i.e. a softmax over
[z, 0]); mean squared error for STS (its regression score). "Per example" for a Siamese
pair means the pair: one max over both sentences' gradients.

Choices made here:
- Gradient of the penalty: the paper's R_s depends on θ through both f(e + δ)
  and f(e), and we follow the paper: gradients flow through both passes (and
  into the word embeddings, whose detached copy is used only to find δ).
  SMART's public code (mt-dnn ``SymKlCriterion``) detaches the target
  distribution of each KL direction instead; the value is the same.
- Dropout: f(e) and f(e + δ) are computed with the *same* dropout masks (the
  RNG state is replayed before each pass), so the penalty measures the effect
  of δ and the ascent starts where l_s ≈ 0, as the algorithm assumes. With
  ``reuse_head_output`` the head's own forward is f(e) instead (mt-dnn's code:
  one forward cheaper, but its dropout mask differs from the perturbed pass,
  and with ε = 1e-5 the penalty then mostly measures dropout noise).
- Precision: a perturbation of 1e-5 is below the resolution of bf16 (8
  significant bits), fp16 and TF32 (11) at the scale of word-embedding components
  and would vanish in the first matmul, so the passes that compare f(e) with
  f(e + δ) run in true fp32 (runtime.full_precision: autocast and TF32 off)
  whatever the run's precision: SMART acts under bf16 and fp16 autocast too, at the price of
  fp32 speed for its passes. With ``reuse_head_output`` under bf16 the clean
  output is the head's bf16-encoder forward, so the penalty then also
  measures bf16 rounding; the default recomputes f(e) in fp32.

Cost per batch: one forward + backward for each ascent step, one forward for
the penalty, and one clean forward (none with ``reuse_head_output``).

Related: FreeLB / PGD adversarial training (maximize the task loss instead),
VAT (Miyato et al., the KL smoothness term SMART builds on), R-Drop (sym-KL
between two dropout passes, no δ), RIFT (``rift.py``, adversarial KL + InfoNCE).

Usage:
    penalty, delta = smart_penalty(model, "sst", batch)
    objs = build_objectives({"smart": {"epsilon": 1e-5}}, model)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tasks.objectives import Objective, ObjectiveConfig, kind_rule
from tasks.options import option
from tasks.runtime import device_rng_state, full_precision, set_device_rng_state
from tasks.task import MULTITASK, Binary, Classes, Scores, Task

SMART_TASKS = MULTITASK


# ---- divergences --------------------------------------------------------------------


def symmetric_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(P‖Q) + KL(Q‖P) of categorical distributions given by logits (B, C), mean over the batch."""
    lp = F.log_softmax(p_logits.float(), dim=-1)  # (B, C)
    lq = F.log_softmax(q_logits.float(), dim=-1)
    return ((lp.exp() - lq.exp()) * (lp - lq)).sum(-1).mean()  # Σ_c (p − q)(log p − log q) = both KLs


def bernoulli_logits(z: torch.Tensor) -> torch.Tensor:
    """Logits (B, 2) whose softmax is [σ(z), 1 − σ(z)]: the Bernoulli of a binary logit z (B,)."""
    return torch.stack([z, torch.zeros_like(z)], dim=-1)


# l_s between perturbed and clean head outputs, by the kind of task: the kinds SMART takes
DIVERGENCES = {
    Classes: symmetric_kl,  # sst: the 5 classes' softmax
    Binary: lambda adv, clean: symmetric_kl(bernoulli_logits(adv), bernoulli_logits(clean)),  # para's Bernoulli
    Scores: lambda adv, clean: F.mse_loss(adv.float(), clean.float()),  # sts: its scores
}


def smart_divergence(task: Task, adv: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """l_s between perturbed and clean outputs of ``task``'s head (its entry: ``model.entry``), by its kind
    (``DIVERGENCES``): sym-KL of the class distributions (sst; para's Bernoulli) or MSE of scores (sts); a
    ValueError for a kind SMART does not take."""
    return kind_rule("smart", DIVERGENCES, task.name, task.kind)(adv, clean)


# ---- the perturbation ---------------------------------------------------------------


class _DropoutReplay:
    """Restores the RNG state captured at construction, so each pass draws the same dropout masks."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cpu = torch.get_rng_state()
        self.own = device_rng_state(device)  # the CUDA generator's, None on CPU

    def __call__(self) -> None:
        torch.set_rng_state(self.cpu)
        set_device_rng_state(self.own, self.device)


def smart_perturbation(model: nn.Module, task: str, batch: dict, embeds: dict[str, torch.Tensor],
                       clean_logits: torch.Tensor, delta0: dict[str, torch.Tensor], *,
                       step_size: float = 1e-3, epsilon: float = 1e-5, steps: int = 1,
                       replay: _DropoutReplay | None = None) -> dict[str, torch.Tensor]:
    """Algorithm 1's projected ascent: the final δ per sequence suffix, each (B, T, H), ‖δ‖_∞ ≤ ε.

    embeds: clean word embeddings per suffix (detached here); clean_logits: f(e)
    (detached here); delta0: the starting noise; replay: called before each pass
    (same dropout masks as the clean pass), or None.
    """
    e = {s: x.detach() for s, x in embeds.items()}
    clean = clean_logits.detach()
    delta = {s: d.detach() for s, d in delta0.items()}
    for _ in range(steps):
        d = {s: x.requires_grad_() for s, x in delta.items()}
        if replay is not None:
            replay()
        with torch.enable_grad():
            adv = model(task, batch, inputs_embeds={s: e[s] + d[s] for s in e}).logits
            div = smart_divergence(model.entry(task), adv, clean)
            grads = torch.autograd.grad(div, list(d.values()), allow_unused=True)
        g = {s: torch.zeros_like(d[s]) if gs is None else gs.float() for s, gs in zip(d, grads)}
        # ‖g‖_∞ per example, over all tokens (and both sentences of a pair): (B,)
        g_inf = torch.stack([x.abs().amax(dim=(1, 2)) for x in g.values()]).amax(0)
        g_inf = g_inf.clamp_min(torch.finfo(torch.float32).tiny)[:, None, None]  # zero gradient -> zero step
        delta = {s: (d[s].detach() + step_size * g[s].to(d[s].dtype) / g_inf).clamp(-epsilon, epsilon)
                 for s in d}
    return delta


def smart_penalty(model: nn.Module, task: str, batch: dict, out=None, *, sigma: float = 1e-5,
                  step_size: float = 1e-3, epsilon: float = 1e-5, steps: int = 1,
                  reuse_head_output: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The SMART penalty l_s(f(e + δ), f(e)) for one task batch, and the δ it used (per suffix).

    out: the head's TaskOutput for this batch; needed only with ``reuse_head_output``.
    """
    sides = model.sides(task)  # the sequences its head reads: one, or a Siamese pair's two
    embeds = {s: model.encoder.embed_tokens(batch["input_ids" + s]) for s in sides}  # (B, T, H) each
    delta0 = {}
    for s, x in embeds.items():
        real = batch["attention_mask" + s].unsqueeze(-1).to(x.dtype)  # (B, T, 1): no noise on padding
        delta0[s] = sigma * torch.randn_like(x) * real
    # True fp32 for the passes that compare f(e) with f(e + δ): bf16 autocast or TF32 would round e and drop
    # a δ of 1e-5 (see "Precision" above).
    with full_precision(embeds[sides[0]].device):
        if reuse_head_output:
            if out is None:
                raise ValueError("smart: reuse_head_output needs the head's output for this batch")
            clean, replay = out.logits, None
        else:
            replay = _DropoutReplay(embeds[sides[0]].device) if model.training else None
            clean = model(task, batch, inputs_embeds=embeds).logits
        delta = smart_perturbation(model, task, batch, embeds, clean, delta0, step_size=step_size,
                                   epsilon=epsilon, steps=steps, replay=replay)
        if replay is not None:
            replay()
        adv = model(task, batch, inputs_embeds={s: embeds[s] + delta[s] for s in sides}).logits
    return smart_divergence(model.entry(task), adv, clean), delta


# ---- the objective ------------------------------------------------------------------


@dataclass
class SMARTConfig(ObjectiveConfig):
    """Options of the "smart" objective (CLI: ``--smart-<field>``)."""

    weight: float = option(1.0, "λ_s, the factor on the penalty")
    sigma: float = option(1e-5, "std of the initial noise δ_0")
    step_size: float = option(1e-3, "η of the normalized ascent step")
    epsilon: float = option(1e-5, "radius of the L∞ ball δ is projected onto")
    steps: int = option(1, "ascent steps (each one forward + backward)")
    reuse_head_output: bool = option(False, "f(e) = the head's own forward (mt-dnn; cheaper, other dropout mask)")
    tasks: tuple[str, ...] = option(SMART_TASKS, "the tasks it regularizes")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sigma < 0 or self.step_size < 0 or self.epsilon < 0:
            raise ValueError(f"smart sigma, step_size and epsilon must be >= 0, got "
                             f"{self.sigma}, {self.step_size}, {self.epsilon}")
        if self.steps < 1:
            raise ValueError(f"smart steps must be >= 1, got {self.steps}")


class SMART(Objective):
    """SMART's smoothness penalty on each regularized task batch."""

    name = "smart"
    Config = SMARTConfig
    option_names = frozenset((  # at options_version 1
        "weight", "tasks", "sigma", "step_size", "epsilon", "steps", "reuse_head_output"))
    kinds = ("sentence-classification", "pair-classification", "sentence-regression", "pair-regression")
    tasks = SMART_TASKS

    def forward(self, model: nn.Module, task: str, batch: dict, out) -> dict[str, torch.Tensor]:
        c = self.config
        penalty, _ = smart_penalty(model, task, batch, out, sigma=c.sigma, step_size=c.step_size,
                                   epsilon=c.epsilon, steps=c.steps, reuse_head_output=c.reuse_head_output)
        return {"penalty": penalty}
