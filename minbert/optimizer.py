"""Hand-written AdamW, as the CS224N minBERT project specifies it.

This is the optimizer the multitask trainer fine-tunes BERT with. It follows
the AdamW of the original BERT code and of HF ``transformers`` (CS224N's
``optimizer.py``) in where ``eps`` enters (below), and by default the handout
in where weight decay enters; torch's order is one argument away.

Usage::

    opt = AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)          # the handout's update
    opt = AdamW(params, lr=1e-4, weight_decay=0.01, decay="before", fused=True)   # torch's, fused
    loss.backward(); opt.step(); opt.zero_grad()

The update of one parameter ``p`` with gradient ``g`` at step ``t`` (1-based)::

    m   <- beta1 * m + (1 - beta1) * g
    v   <- beta2 * v + (1 - beta2) * g**2
    a_t  = lr * sqrt(1 - beta2**t) / (1 - beta1**t)  # if correct_bias, else lr
    p   <- p - a_t * m / (sqrt(v) + eps)
    p   <- p - lr * weight_decay * p                   # decoupled weight decay, after the update

That is the handout's order (``decay="after"``, the default): weight decay comes
*after* the Adam update and decays the updated parameter, with the "efficient"
bias correction folded into ``a_t``. It reproduces the starters'
``optimizer_test.py`` reference weights (tests/minbert/test_optimizer.py), so
a student can take this optimizer into the assignment. ``decay="before"`` is
``torch.optim.AdamW``'s order, ``p <- p * (1 - lr * weight_decay)`` first, the
Adam step after, which is also what torch's fused kernel
``torch._fused_adamw_`` (our ``fused=True`` path) computes; the tests compare it
with ``torch.optim.AdamW``. The two orders differ by ``lr * weight_decay * u``
per step (``u`` the Adam step, ``|u| <~ lr``): O(lr² · weight_decay), at most
~1e-10 per step at lr 1e-4 and weight decay 0.01.

The multitask trainer and MLM pretraining use ``decay="before"``: it is the
order the fused kernel (the fastest path on CPU, benchmarks/README.md)
computes, so the trainer's fused and foreach paths share one definition, and
every result recorded in experiments/RESULTS.md was trained so; the default
recipe's numbers do not move.

Why ``eps`` sits where it does: folding both bias corrections into the scalar
``a_t`` (Kingma & Ba, end of section 2) saves two tensor divisions per step,
but leaves ``eps`` added to the *uncorrected* ``sqrt(v)``. Written with the
bias-corrected moments ``m_hat = m / (1 - beta1**t)`` and
``v_hat = v / (1 - beta2**t)``, the step is::

    lr * m_hat / (sqrt(v_hat) + eps / sqrt(1 - beta2**t))

whereas ``torch.optim.AdamW`` takes ``lr * m_hat / (sqrt(v_hat) + eps)``.
Ours therefore damps early steps a little more (at ``t = 1`` with
``beta2 = 0.999`` the effective eps is ``~31.6 * eps``); as ``eps -> 0`` the
two coincide. The default ``eps = 1e-6`` is the one BERT used.

State per parameter: ``step`` (0-dim int64 CPU tensor), ``exp_avg`` (m) and
``exp_avg_sq`` (v), all tensors, so ``state_dict()`` can be saved with
``torch.save`` and read back with ``torch.load(..., weights_only=True)``.

``foreach=True`` runs the same arithmetic through ``torch._foreach_*`` ops
(one kernel launch per op for a whole list of tensors on CUDA); on CPU it
gives bit-identical results to the per-parameter loop.

``fused=True`` runs the whole update in one pass over each tensor with
``torch._fused_adamw_``, the kernel of ``torch.optim.AdamW(fused=True)``,
given ``eps / sqrt(1 - beta2**t)`` as its eps: by the identity above that is
exactly our update (equal to the loop path up to float rounding, not bit for
bit). It reads and writes each parameter, gradient and moment once instead of
once per ``foreach`` op, which makes it the fastest path on CPU
(benchmarks/README.md). Needs ``correct_bias=True`` and ``decay="before"``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Optimizer

__all__ = ["AdamW", "adamw_bias_corrected_step_size"]


DECAY_ORDERS = ("after", "before")  # weight decay after the Adam update (the handout) or before it (torch)


def adamw_bias_corrected_step_size(lr: float, beta1: float, beta2: float, step: int) -> float:
    """Scalar step size ``lr * sqrt(1 - beta2**step) / (1 - beta1**step)``.

    Both Adam bias corrections folded into one number, so the tensor update
    is ``p -= step_size * m / (sqrt(v) + eps)``. ``step`` counts from 1.
    """
    if step < 1:
        raise ValueError(f"step counts from 1, got {step}")
    return lr * math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step)


class AdamW(Optimizer):
    """AdamW with decoupled weight decay and CS224N/HF-style bias correction.

    Args:
        params: parameters or parameter groups to optimize.
        lr: learning rate (>= 0).
        betas: decay rates ``(beta1, beta2)`` of the first and second moment
            averages, each in [0, 1).
        eps: added to ``sqrt(v)`` in the denominator (>= 0); see the module
            docstring for how this differs from ``torch.optim.AdamW``.
        weight_decay: decoupled weight decay coefficient (>= 0), scaled by lr.
        decay: "after" the Adam update (the CS224N handout, the default) or "before" it (torch.optim.AdamW).
        correct_bias: apply Adam's bias correction (BERT turned it off).
        foreach: use the ``torch._foreach_*`` fast path; same numbers.
        fused: one fused kernel per tensor list (``torch._fused_adamw_``); the
            same update up to float rounding, faster than foreach on CPU.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        decay: str = "after",
        correct_bias: bool = True,
        foreach: bool = False,
        fused: bool = False,
    ) -> None:
        _check_hyperparameters(lr, betas, eps, weight_decay)
        if decay not in DECAY_ORDERS:
            raise ValueError(f"decay must be one of {DECAY_ORDERS} (weight decay after or before the Adam update), "
                             f"got {decay!r}")
        if fused and foreach:
            raise ValueError("fused and foreach are two implementations of the same update: choose one")
        if fused and not correct_bias:
            raise ValueError("fused=True needs correct_bias=True (the fused kernel always corrects the bias)")
        if fused and decay != "before":
            raise ValueError('fused=True needs decay="before" (the fused kernel decays before the Adam update)')
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            decay=decay,
            correct_bias=correct_bias,
            foreach=foreach,
            fused=fused,
        )
        super().__init__(params, defaults)
        # Groups given as dicts may override the defaults; check those too.
        for group in self.param_groups:
            _check_hyperparameters(group["lr"], group["betas"], group["eps"], group["weight_decay"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict()``; ``step`` comes back as a 0-dim int64 CPU tensor.

        torch's ``Optimizer.load_state_dict`` moves the ``step`` of a group with
        ``fused=True`` to the parameter's device as float32 (what torch's own
        fused AdamW keeps); ours is read on the host every step, so there it
        would cost one device sync per parameter per step. A step that is not a
        tensor passes through torch's casting untouched, so it goes in as a
        python int and is made a CPU tensor again afterwards. ``state_dict`` is
        not modified.
        """
        state = {}
        for key, entry in state_dict["state"].items():
            if isinstance(entry, dict) and isinstance(entry.get("step"), torch.Tensor):
                entry = {**entry, "step": int(entry["step"])}  # once per load; int() reads a float32 step too
            state[key] = entry
        super().load_state_dict({**state_dict, "state": state})
        for entry in self.state.values():
            if isinstance(entry.get("step"), int):
                entry["step"] = torch.tensor(entry["step"], dtype=torch.int64)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("decay", "before")  # a state saved before the option existed was decayed before
            group.setdefault("correct_bias", True)
            group.setdefault("foreach", False)
            group.setdefault("fused", False)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """Take one optimization step; ``closure`` re-evaluates the loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, step_sizes, steps = [], [], [], [], [], []
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients")
                state = self.state[p]
                if len(state) == 0:
                    # step lives on the CPU: reading it never syncs a GPU.
                    state["step"] = torch.zeros((), dtype=torch.int64)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = int(state["step"])  # host-read: step is a CPU int64 tensor (load_state_dict keeps it there)
                if group["correct_bias"]:
                    step_size = adamw_bias_corrected_step_size(group["lr"], beta1, beta2, t)
                else:
                    step_size = group["lr"]
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                step_sizes.append(step_size)
                steps.append(t)

            if not params:
                continue
            if group["fused"]:
                if not group["correct_bias"]:
                    raise ValueError("fused=True needs correct_bias=True")
                _fused_update(params, grads, exp_avgs, exp_avg_sqs, steps, lr=group["lr"], beta1=beta1,
                              beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"])
                continue
            update = _foreach_update if group["foreach"] else _loop_update
            update(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                step_sizes,
                beta1=beta1,
                beta2=beta2,
                eps=group["eps"],
                decay=group["lr"] * group["weight_decay"],
                after=group["decay"] == "after",
            )
        return loss


def _check_hyperparameters(
    lr: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> None:
    if not lr >= 0.0:  # written so that NaN fails too
        raise ValueError(f"Invalid learning rate: {lr} (must be >= 0)")
    if len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta{i + 1}: {beta} (must be in [0, 1))")
    if not eps >= 0.0:
        raise ValueError(f"Invalid eps: {eps} (must be >= 0)")
    if not weight_decay >= 0.0:
        raise ValueError(f"Invalid weight_decay: {weight_decay} (must be >= 0)")


def _loop_update(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    step_sizes: list[float],
    *,
    beta1: float,
    beta2: float,
    eps: float,
    decay: float,
    after: bool,
) -> None:
    """The reference path: one parameter at a time, in place; weight decay ``after`` the Adam update or before."""
    for p, g, m, v, step_size in zip(params, grads, exp_avgs, exp_avg_sqs, step_sizes):
        if decay != 0.0 and not after:
            p.mul_(1.0 - decay)
        m.mul_(beta1).add_(g, alpha=1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        denom = v.sqrt().add_(eps)
        p.addcdiv_(m, denom, value=-step_size)
        if decay != 0.0 and after:
            p.add_(p, alpha=-decay)  # the handout's p.data.add_(p.data, alpha=-lr * weight_decay)


def _foreach_update(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    step_sizes: list[float],
    *,
    beta1: float,
    beta2: float,
    eps: float,
    decay: float,
    after: bool,
) -> None:
    """The same arithmetic as ``_loop_update``, op by op over tensor lists."""
    # _foreach_* kernels want one device and dtype per list.
    buckets: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, p in enumerate(params):
        buckets.setdefault((p.device, p.dtype), []).append(i)
    for idx in buckets.values():
        ps = [params[i] for i in idx]
        gs = [grads[i] for i in idx]
        ms = [exp_avgs[i] for i in idx]
        vs = [exp_avg_sqs[i] for i in idx]
        if decay != 0.0 and not after:
            torch._foreach_mul_(ps, 1.0 - decay)
        torch._foreach_mul_(ms, beta1)
        torch._foreach_add_(ms, gs, alpha=1.0 - beta1)
        torch._foreach_mul_(vs, beta2)
        torch._foreach_addcmul_(vs, gs, gs, value=1.0 - beta2)
        denoms = torch._foreach_sqrt(vs)
        torch._foreach_add_(denoms, eps)
        torch._foreach_addcdiv_(ps, ms, denoms, [-step_sizes[i] for i in idx])
        if decay != 0.0 and after:
            torch._foreach_add_(ps, ps, alpha=-decay)


def _fused_update(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[int],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
) -> None:
    """Our update through torch's fused AdamW kernel, one call per (device, dtype, step).

    The kernel computes ``p -= lr/(1 - beta1**t) * m / (sqrt(v)/sqrt(1 - beta2**t) + eps')``
    after ``p *= 1 - lr*weight_decay``; with ``eps' = eps/sqrt(1 - beta2**t)`` that is
    ``p -= lr*sqrt(1 - beta2**t)/(1 - beta1**t) * m / (sqrt(v) + eps)``, ours. Parameters
    whose step counts differ (a task head without a gradient on other tasks' steps) get
    separate calls, since eps' depends on t.
    """
    buckets: dict[tuple[torch.device, torch.dtype, int], list[int]] = {}
    for i, p in enumerate(params):
        buckets.setdefault((p.device, p.dtype, steps[i]), []).append(i)
    for (device, _, t), idx in buckets.items():
        # The kernel's bias corrections read t from a device tensor; torch.full fills it on the device (no host
        # to device copy, which torch.tensor(..., device=...) would make every step).
        step = torch.full((), t, dtype=torch.float32, device=device)
        torch._fused_adamw_(
            [params[i] for i in idx],
            [grads[i] for i in idx],
            [exp_avgs[i] for i in idx],
            [exp_avg_sqs[i] for i in idx],
            [],
            [step] * len(idx),
            lr=lr,
            beta1=beta1,
            beta2=beta2,
            weight_decay=weight_decay,
            eps=eps / math.sqrt(1.0 - beta2**t),
            amsgrad=False,
            maximize=False,
        )
