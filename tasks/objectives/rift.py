"""RIFT, Robust Informative Fine-Tuning (Dong et al., ../shared/papers/rift-robust-informative-finetuning.txt §2).

The paper's formulas were lost in our copy; ../shared/DESIGN.md (row RIFT) states
them and the authors' code (dongxinshuai/RIFT-NeurIPS2021) settles the details.
For a batch of SST or paraphrase examples x with labels y:

1. adversarial x' (eq. 8): PGD in *word-embedding* space (the embeddings
   ``model.encoder.embed_tokens`` gives, i.e. what ``inputs_embeds`` takes),
   maximizing KL(p(y|x) ‖ p(y|x')) with the clean prediction fixed (no labels:
   avoids label leaking). Random start, ``steps`` ascent steps of size
   ``step_size``, each followed by projection onto the ε-ball; the ball is per
   token (‖δ_t‖₂ ≤ ε, or |δ_t,h| ≤ ε for "linf") because a word substitution
   moves each word on its own; padding is never perturbed. The attack runs with
   dropout off and returns, per example, the iterate with the largest KL.
2. L_v (eq. 9) = CE(x) + β·KL(p(y|x) ‖ p(y|x')); the gradient flows through both
   distributions (TRADES; the authors' code), and x' = x + δ with δ detached and
   x the live word embeddings, so the gradient through p(y|x') reaches the
   word embeddings too (as SMART's does). CE is the head's own loss, which
   the trainer adds; this objective returns β·KL as "adv_kl".
3. L_I (eq. 10): InfoNCE between the fine-tuned model's features on x' and the
   features of a *frozen copy of the pretrained encoder* on clean x, conditioned
   on the label: for anchor i the positive is the frozen feature of i and the
   negatives are the frozen features of the other examples j of the same class
   (y_j = y_i), which estimates I(S; T | Y). The score function is indexed by the
   class (Lemma 1): per class c two projection MLPs H → 512 → ReLU → 256, g_c for
   the fine-tuned features and h_c for the frozen ones; score(i, j) =
   g_c(s_i)·h_c(t_j) / τ on L2-normalized outputs, τ = 0.2. The loss is the mean
   over classes of the mean over that class's anchors, as the authors' code
   averages per class; a class with a single example in the batch has no
   negative and is skipped. Returned as "info" = α·L_I.
4. total (eq. 11): L_v + α·L_I.

The trainer multiplies every term by ``config.weight`` only, so β and α are
applied here: the terms come back already weighted and ``weight`` should stay
1.0 (any other value scales both).

Features: the sentence embedding the heads read (``model.config.pooling``; the
paper uses the pooled [CLS] of the last layer). Paraphrase: with
pair_encoding="cross" the pair is one sequence; Siamese pairs perturb both
sentences and L_I is the mean over the two sides (each side's features against
its own frozen features, conditioned on the pair label). The paraphrase logit z
is the 2-class distribution [1 − σ(z), σ(z)] for the KL.

The frozen encoder is a deep copy of ``model.encoder`` taken when the objective
is built, so build it from the *pretrained* model, before any fine-tuning or
resumed weights are loaded. It is held outside the module tree: it is in eval
mode, requires no gradient, is absent from ``.parameters()`` (no optimizer can
see it) and from ``state_dict()`` (checkpoints do not store it; rebuilding the
objective from the pretrained checkpoint recreates it). ``.to(device)`` moves
it. The per-class projections *are* this objective's trainable parameters and
its state_dict: the optimizer must include ``objective.parameters()``.

Usage:
    obj = build_objectives({"rift": {"beta": 1.0, "alpha": 0.3}}, model)[0]    # model = pretrained
    optimizer = AdamW([*model.parameters(), *obj.parameters()], lr=...)
    out = model("sst", batch)
    terms = obj(model, "sst", batch, out)          # {"adv_kl": β·KL, "info": α·L_I}
    adv = pgd_attack(model, "sst", batch, objective="ce")   # robustness check
    acc_under_attack = (model.predict("sst", model("sst", batch, inputs_embeds=adv)) == batch["labels"]).float().mean()
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tasks.model import preserved_modes
from tasks.task import Binary, Classes, Task
from tasks.objectives import Objective, ObjectiveConfig, kind_rule
from tasks.options import option
from tasks.runtime import full_precision

NORMS = ("l2", "linf")
ATTACK_OBJECTIVES = ("kl", "ce")


@dataclass
class RIFTConfig(ObjectiveConfig):
    beta: float = option(1.0, "β on KL(p(x) ‖ p(x')) (authors' scripts: 10 IMDB, 5 SNLI, for a word-substitution attack)")
    alpha: float = option(0.3, "α on L_I (paper: 0.1 IMDB, 0.7 SNLI)")
    temperature: float = option(0.2, "τ of the InfoNCE score")
    norm: str = option("l2", "\"l2\" | \"linf\": the per-token ball of the embedding perturbation")
    epsilon: float = option(0.1, "ball radius per token (well inside the L2 distance from a word to its nearest other word)")
    step_size: float = option(0.1, "PGD step (L2: along the normalized gradient; L∞: along its sign)")
    steps: int = option(2, "PGD ascent steps (0 = random perturbation in the ball only)")
    proj_hidden: int = option(512, "per-class projection H -> proj_hidden -> ReLU -> proj_dim")
    proj_dim: int = option(256, "")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        for name in ("epsilon", "step_size", "temperature"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.beta < 0 or self.alpha < 0:
            raise ValueError(f"beta and alpha must be >= 0, got {self.beta} and {self.alpha}")
        if self.proj_hidden < 1 or self.proj_dim < 1:
            raise ValueError("proj_hidden and proj_dim must be positive")


# ---- distributions and the KL ------------------------------------------------------------------


# log p(y|x) (B, C) of a head's float32 logits, by the kind of task (the kinds RIFT takes): a softmax over C
# logits, or a binary logit z (paraphrase) as the distribution [1 − σ(z), σ(z)]
LOG_PROBS = {
    Classes: lambda z: z.log_softmax(dim=-1),
    Binary: lambda z: torch.stack([F.logsigmoid(-z), F.logsigmoid(z)], dim=-1),  # (B, 2)
}


def class_log_probs(task: Task, logits: torch.Tensor) -> torch.Tensor:
    """log p(y|x), (B, C), by the kind of ``task`` (an entry: ``model.entry``; ``LOG_PROBS``); a ValueError for a
    kind RIFT does not take."""
    return kind_rule("rift", LOG_PROBS, task.name, task.kind)(logits.float())


def kl_per_example(task: Task, p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) per example, (B,): Σ_c p_c (log p_c − log q_c)."""
    log_p, log_q = class_log_probs(task, p_logits), class_log_probs(task, q_logits)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def kl_divergence(task: Task, p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """Batch mean of KL(p ‖ q)."""
    return kl_per_example(task, p_logits, q_logits).mean()


# ---- the embedding-space attack -----------------------------------------------------------------


def input_suffixes(model: nn.Module, task: str, batch: dict) -> tuple[str, ...]:
    """The batch-key suffixes the head reads for ``task`` (``MultitaskBert.sides``): ("",) for one sequence,
    ("_1", "_2") for Siamese pairs; a ValueError where the batch lacks one."""
    sides = model.sides(task)
    if any("input_ids" + s not in batch for s in sides):
        raise ValueError(f"{task}: expected keys {', '.join('input_ids' + s for s in sides)}, batch has "
                         f"{sorted(batch)}")
    return sides


def _token_norm(x: torch.Tensor) -> torch.Tensor:
    return x.norm(dim=-1, keepdim=True)  # (B, T, 1)


def project_to_ball(delta: torch.Tensor, norm: str, epsilon: float) -> torch.Tensor:
    """Per-token projection onto {‖δ_t‖₂ ≤ ε} or {|δ_t,h| ≤ ε}; δ is (B, T, H)."""
    if norm == "linf":
        return delta.clamp(-epsilon, epsilon)
    scale = (epsilon / _token_norm(delta).clamp_min(1e-12)).clamp(max=1.0)  # (B, T, 1)
    return delta * scale


def random_start(shape: torch.Size, norm: str, epsilon: float, device: torch.device,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """A random δ in the ball: L∞ uniform in [−ε, ε]; L2 a random direction with radius uniform in [0, ε]."""
    if norm == "linf":
        return (torch.rand(shape, device=device, generator=generator) * 2.0 - 1.0) * epsilon
    direction = torch.randn(shape, device=device, generator=generator)
    direction = direction / _token_norm(direction).clamp_min(1e-12)
    radius = torch.rand((*shape[:-1], 1), device=device, generator=generator) * epsilon  # (B, T, 1)
    return direction * radius


def _attack_loss(task: Task, logits: torch.Tensor, clean_logits: torch.Tensor, labels: torch.Tensor | None,
                 objective: str) -> torch.Tensor:
    """(B,) what the attack maximizes: KL(p(x) ‖ p(x')) or the label's cross-entropy."""
    if objective == "kl":
        return kl_per_example(task, clean_logits, logits)
    if labels is None:
        raise ValueError("objective='ce' needs batch['labels']")
    return task.kind.loss(logits, labels, reduction="none")


def pgd_attack(model: nn.Module, task: str, batch: dict, *, norm: str = "l2", epsilon: float = 0.1,
               step_size: float = 0.1, steps: int = 2, random_init: bool = True, objective: str = "kl",
               generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Adversarial word embeddings {suffix: (B, T, H)} for ``model(task, batch, inputs_embeds=...)``, detached.

    The clean word embeddings plus ``pgd_perturbation``'s δ (same arguments);
    for evaluation under attack. Training wants x' = x + δ with the gradient
    path to the embeddings kept, as ``RIFT.forward`` builds it.
    """
    base = model
    delta = pgd_perturbation(model, task, batch, norm=norm, epsilon=epsilon, step_size=step_size, steps=steps,
                             random_init=random_init, objective=objective, generator=generator)
    with torch.no_grad():
        return {s: base.encoder.embed_tokens(batch["input_ids" + s]).float() + d for s, d in delta.items()}


def pgd_perturbation(model: nn.Module, task: str, batch: dict, *, norm: str = "l2", epsilon: float = 0.1,
                     step_size: float = 0.1, steps: int = 2, random_init: bool = True, objective: str = "kl",
                     generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """The adversarial perturbation δ {suffix: (B, T, H)} of the word embeddings, detached (zero on padding).

    PGD with per-token ε-balls (see the module docstring) maximizing, per
    example, ``objective``: "kl" = KL(p(y|x) ‖ p(y|x')) against the clean
    prediction, fixed (RIFT eq. 8; label-free), or "ce" = the true label's loss
    (the usual attack for accuracy under attack). Runs with dropout off (the
    model's mode is restored) and returns, per example, the iterate with the
    largest loss among the start and all steps, so the result never scores
    below the starting point. KL's gradient is zero at δ = 0, so the KL attack
    needs ``random_init``. No parameter's ``.grad`` is touched.
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    if objective not in ATTACK_OBJECTIVES:
        raise ValueError(f"objective must be one of {ATTACK_OBJECTIVES}, got {objective!r}")
    if epsilon <= 0 or step_size <= 0 or steps < 0:
        raise ValueError(f"need epsilon > 0, step_size > 0, steps >= 0; got {epsilon}, {step_size}, {steps}")
    if torch.is_inference_mode_enabled():
        raise RuntimeError("pgd_perturbation needs autograd for δ: call it under torch.no_grad() (allowed), "
                           "not torch.inference_mode()")
    base = model  # no gradient sync needed: only δ gets gradients
    suffixes = input_suffixes(base, task, batch)
    labels = batch.get("labels")
    with preserved_modes(base):  # each submodule's own mode back: LP-FT's frozen encoder stays in eval
        base.eval()
        with torch.no_grad():
            clean = {s: base.encoder.embed_tokens(batch["input_ids" + s]).float() for s in suffixes}  # (B, T, H)
            keep = {s: batch["attention_mask" + s].unsqueeze(-1).float() for s in suffixes}  # (B, T, 1)
            clean_logits = base(task, batch).logits.float()
        delta = {}
        for s in suffixes:
            d = random_start(clean[s].shape, norm, epsilon, clean[s].device, generator) if random_init \
                else torch.zeros_like(clean[s])
            delta[s] = d * keep[s]

        def loss_of(d: dict[str, torch.Tensor]) -> torch.Tensor:
            logits = base(task, batch, inputs_embeds={s: clean[s] + d[s] for s in suffixes}).logits
            return _attack_loss(base.entry(task), logits, clean_logits, labels, objective)  # (B,)

        best = {s: delta[s].clone() for s in suffixes}
        best_loss: torch.Tensor | None = None
        for step in range(steps + 1):
            d = {s: delta[s].detach().requires_grad_(step < steps) for s in suffixes}
            with torch.enable_grad() if step < steps else torch.no_grad():
                loss = loss_of(d)  # (B,)
                grads = torch.autograd.grad(loss.sum(), [d[s] for s in suffixes]) if step < steps else None
            loss = loss.detach()
            better = torch.ones_like(loss, dtype=torch.bool) if best_loss is None else loss > best_loss
            best_loss = loss if best_loss is None else torch.where(better, loss, best_loss)
            for s in suffixes:
                best[s] = torch.where(better[:, None, None], d[s].detach(), best[s])
            if grads is None:
                break
            for s, g in zip(suffixes, grads):
                direction = g.sign() if norm == "linf" else g / _token_norm(g).clamp_min(1e-12)
                delta[s] = project_to_ball(d[s].detach() + step_size * direction, norm, epsilon) * keep[s]
        return {s: best[s].detach() for s in suffixes}


# ---- the conditional InfoNCE --------------------------------------------------------------------


def projection(hidden: int, proj_hidden: int = 512, proj_dim: int = 256) -> nn.Sequential:
    """The score function's non-linear projection (authors' code: Linear, ReLU, Linear)."""
    return nn.Sequential(nn.Linear(hidden, proj_hidden), nn.ReLU(), nn.Linear(proj_hidden, proj_dim))


def same_class_mask(labels: torch.Tensor) -> torch.Tensor:
    """(B, B) bool: pair (i, j) may enter anchor i's InfoNCE iff y_i == y_j (the diagonal is the positive)."""
    return labels[:, None] == labels[None, :]


def conditional_infonce_logits(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor,
                               proj_student: nn.ModuleList, proj_teacher: nn.ModuleList,
                               temperature: float) -> torch.Tensor:
    """(B, B) scores g_{y_i}(s_i)·h_{y_i}(t_j)/τ on L2-normalized projections; −inf where y_j ≠ y_i.

    student, teacher: (B, H) features; proj_*: one projection per class.
    """
    labels = labels.long()
    with full_precision(student.device):  # small MLPs; scores / τ want fp32
        s = torch.stack([F.normalize(g(student.float()), dim=-1) for g in proj_student])  # (C, B, P)
        t = torch.stack([F.normalize(h(teacher.float()), dim=-1) for h in proj_teacher])  # (C, B, P)
        rows = torch.arange(labels.shape[0], device=labels.device)
        s_own = s[labels, rows]  # (B, P): anchor i through its class's projection
        by_class = torch.einsum("ip,cjp->icj", s_own, t)  # (B, C, B): anchor i vs teacher j under class c's h_c
        logits = by_class[rows, labels] / temperature  # (B, B): h of the anchor's class
    return logits.masked_fill(~same_class_mask(labels), float("-inf"))


def conditional_infonce(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor,
                        proj_student: nn.ModuleList, proj_teacher: nn.ModuleList,
                        temperature: float) -> torch.Tensor:
    """L_I: the mean over classes (with >= 2 examples in the batch) of the mean over their anchors of
    −log( e^{score(i,i)} / Σ_{j: y_j = y_i} e^{score(i,j)} ). Zero (graph kept) when no class has two examples."""
    logits = conditional_infonce_logits(student, teacher, labels, proj_student, proj_teacher, temperature)
    nll = torch.logsumexp(logits, dim=1) - logits.diagonal()  # (B,); the diagonal keeps every row finite
    class_size = same_class_mask(labels).sum(dim=1).float()  # (B,) n_{y_i}
    usable = (class_size >= 2).float()  # (B,)
    n_classes = (usable / class_size).sum()  # Σ_i 1/n_{y_i} = the number of usable classes
    # No device sync, and 0 (graph intact) when no class has two examples.
    return (nll * usable / class_size).sum() / n_classes.clamp_min(1.0)


# ---- the objective -------------------------------------------------------------------------------


def pool(encoder_out: dict[str, torch.Tensor], attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """The sentence embedding (B, H) of an encoder output, as MultitaskBert.embed pools it."""
    if pooling == "pooler":
        return encoder_out["pooler_output"]
    h = encoder_out["last_hidden_state"]  # (B, T, H)
    if pooling == "cls":
        return h[:, 0]
    m = attention_mask.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
    return (h * m).sum(1) / m.sum(1).clamp_min(1.0)


class RIFT(Objective):
    """β·KL(p(x) ‖ p(x')) + α·L_I with a frozen pretrained encoder and per-class projections (RIFT eq. 8–11)."""

    name = "rift"
    Config = RIFTConfig
    option_names = frozenset((  # at options_version 1
        "weight", "tasks", "beta", "alpha", "temperature", "norm", "epsilon", "step_size", "steps", "proj_hidden",
        "proj_dim"))
    kinds = ("sentence-classification", "pair-classification")
    tasks = ("sst", "para")
    batch_coupled = True  # L_I's negatives are the batch's other examples of the class

    def __init__(self, config: RIFTConfig, model: nn.Module | None = None):
        super().__init__(config, model)
        if model is None:
            raise ValueError("rift needs the model at construction: it freezes a copy of its pretrained encoder")
        base = model
        frozen = copy.deepcopy(base.encoder)
        frozen.requires_grad_(False)
        frozen.zero_grad(set_to_none=True)
        frozen.eval()
        # A plain list keeps the frozen encoder out of .parameters(), state_dict() and train():
        # nothing may train it or save it, and it always runs without dropout.
        self._frozen: list[nn.Module] = [frozen]
        hidden = base.encoder.config.hidden_size
        self.proj_student = nn.ModuleDict()
        self.proj_teacher = nn.ModuleDict()
        for task in self.active_tasks():
            n = base.entry(task).num_classes  # a declared stream: its task's classes
            self.proj_student[task] = nn.ModuleList(
                projection(hidden, config.proj_hidden, config.proj_dim) for _ in range(n))
            self.proj_teacher[task] = nn.ModuleList(
                projection(hidden, config.proj_hidden, config.proj_dim) for _ in range(n))

    @property
    def frozen_encoder(self) -> nn.Module:
        return self._frozen[0]

    def _apply(self, fn, *args, **kwargs):
        super()._apply(fn, *args, **kwargs)
        self.frozen_encoder._apply(fn, *args, **kwargs)
        return self

    @torch.no_grad()
    def teacher_features(self, model: nn.Module, batch: dict, suffix: str = "") -> torch.Tensor:
        """The frozen pretrained encoder's sentence embedding (B, H) of the clean inputs, pooled as the model pools."""
        frozen = self.frozen_encoder
        ids = batch["input_ids" + suffix]
        if next(frozen.parameters()).device != ids.device:
            frozen.to(ids.device)
        mask = batch["attention_mask" + suffix]
        out = frozen(input_ids=ids, attention_mask=mask, token_type_ids=batch.get("token_type_ids" + suffix))
        return pool(out, mask, model.config.pooling)

    def forward(self, model: nn.Module, task: str, batch: dict, out) -> dict[str, torch.Tensor]:
        cfg = self.config
        if task not in self.proj_student:
            raise ValueError(f"rift is not active on task {task!r}; active: {self.active_tasks()}")
        if out is None:
            raise ValueError("rift needs the head's clean output (out) for KL(p(x) ‖ p(x'))")
        labels = batch["labels"].long()  # paraphrase labels arrive as float 0/1 BCE targets
        delta = pgd_perturbation(model, task, batch, norm=cfg.norm, epsilon=cfg.epsilon, step_size=cfg.step_size,
                                 steps=cfg.steps, objective="kl")
        # x' = x + δ with δ detached and x the live word embeddings (eq. 8-10: the loss is a function of the
        # parameters through x' too), so the KL and L_I terms train the word embeddings, as SMART's penalty does.
        embed = model.encoder.embed_tokens
        adv = {s: embed(batch["input_ids" + s]) + d for s, d in delta.items()}  # (B, T, H) each
        adv_out = model(task, batch, inputs_embeds=adv)  # the model's mode: dropout on while training
        kl = kl_divergence(model.entry(task), out.logits, adv_out.logits)
        sides = input_suffixes(model, task, batch)
        info = torch.stack([
            conditional_infonce(adv_out.features["pooled" + s], self.teacher_features(model, batch, s), labels,
                                self.proj_student[task], self.proj_teacher[task], cfg.temperature)
            for s in sides]).mean()
        return {"adv_kl": kl, "info": info}

    def term_weight(self, term: str) -> float:
        """β on the KL term, α on L_I (eq. 11), times ``weight``."""
        coefficient = {"adv_kl": self.config.beta, "info": self.config.alpha}[term]
        return float(self.config.weight) * coefficient


__all__ = ("RIFT", "RIFTConfig", "class_log_probs", "conditional_infonce", "conditional_infonce_logits",
           "kl_divergence", "kl_per_example", "pgd_attack", "pgd_perturbation", "project_to_ball", "same_class_mask")
