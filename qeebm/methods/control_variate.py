"""The leave-one-out score-function estimator with the QE's gradient as a control variate
(``qe_ebm.estimator: loo-cv``; docs/method.md, "Gradient estimators", has the derivation).

For K samples y_1..y_K of one source, drawn step by step from the translator's p_t(. | y_<t), and
f(y) the QE's score, the estimate of grad E_y f(y) is, per sample k (``surrogate``'s gradient)::

    sum_t [ A_kt grad log p_t(y_kt) + eta grad (gbar_kt . p_t) ]
    A_kt  = f(y_k) - b_k - eta sum_{t' <= t} (gbar_kt'[y_kt'] - gbar_kt' . p_t')

* b_k: the mean score of the other K - 1 samples (leave-one-out);
* gbar_kt [V]: the QE's gradient with respect to the one-hot token at step t, averaged over the
  other K - 1 samples of the source (``leave_one_out``), i.e. taken at points independent of y_k;
* eta: any weight fixed before y_k is drawn (``CvWeight``: fitted on the previous step).

Each step's control variate is linear in the one-hot of y_kt plus a function of the prefix, so its
expectation given the prefix is exactly ``grad (gbar_kt . p_t)``, the term added back: the estimate
stays unbiased for every eta, and the QE's gradient can only remove variance, never add bias.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


def leave_one_out(x: Tensor, k: int) -> Tensor:
    """Each row's mean over the other ``k - 1`` rows of its group; ``x`` is ``[R, ...]`` with the
    rows of one group (the K samples of a source) adjacent."""
    if k < 2 or x.shape[0] % k:
        raise ValueError(f"leave-one-out needs groups of k >= 2 rows; got {x.shape[0]} rows, k = {k}")
    groups = x.reshape(-1, k, *x.shape[1:])
    return ((groups.sum(1, keepdim=True) - groups) / (k - 1)).reshape(x.shape)


def control_terms(logits: Tensor, tokens: Tensor, content: Tensor, grads: Tensor, table: Tensor) -> tuple[Tensor, Tensor]:
    """``expected`` (gbar_t . p_t, differentiable in the logits) and ``taken`` (gbar_t[y_t]), both
    ``[R, T]``, for the policy's logits ``[R, T, V]`` (the sampler's distribution), the emitted
    ``tokens`` ``[R, T]``, the ``content`` steps the QE reads and the other samples' QE gradients
    ``grads`` ``[R, T, H]`` at each step's bridged embedding (``Energy.token_gradients``): with the
    bridge table ``B`` ``[V, H]``, gbar_t = B g_t, so gbar_t . p_t = (p_t @ B) . g_t and only the
    content rows are projected."""
    grads = grads.to(logits.dtype)
    rows = (torch.softmax(logits[content], dim=-1) @ table.to(logits.dtype) * grads[content]).sum(-1)  # [N]
    expected = torch.zeros(tokens.shape, dtype=logits.dtype, device=logits.device).masked_scatter(content, rows)
    taken = (table.to(logits.dtype)[tokens.clamp(0, table.shape[0] - 1)] * grads).sum(-1)
    return expected, taken


@dataclass
class Surrogate:
    """``value``: a scalar whose gradient is the estimate of ``grad sum_k f(y_k)`` (its value means
    nothing); ``centred``: ``[R]`` f - b; ``cv``: ``[R, T]`` the control variate's cumulative sum
    (0 off the action steps); the three sums that fit the weight (``CvWeight.add``)."""

    value: Tensor
    centred: Tensor
    cv: Tensor
    sums: Tensor  # [3]: sum a*s, sum s*s, sum a*a over action steps, a = f - b, s = cv


def surrogate(logp: Tensor, actions: Tensor, expected: Tensor, taken: Tensor, content: Tensor, f: Tensor,
              k: int, eta: float) -> Surrogate:
    """The estimator of the module docstring for R = N * K samples (a source's K rows adjacent).

    logp:     ``[R, T]`` log p_t(y_t) of each emitted token (differentiable; 0 off ``actions``).
    actions:  ``[R, T]`` bool, the policy's actions (every emitted token up to </s>).
    expected: ``[R, T]`` gbar_t . p_t (differentiable in p_t, gbar a constant).
    taken:    ``[R, T]`` gbar_t[y_t] (a constant).
    content:  ``[R, T]`` bool, the steps whose token the QE reads (gbar is 0 elsewhere).
    f:        ``[R]`` the samples' scores.
    """
    f = f.detach().to(logp.dtype)
    centred = f - leave_one_out(f, k)  # [R]
    step_cv = torch.where(content, taken.detach() - expected.detach(), torch.zeros_like(expected))
    cv = torch.where(actions, step_cv.cumsum(1), torch.zeros_like(step_cv))  # [R, T]
    advantage = torch.where(actions, centred[:, None] - eta * cv, torch.zeros_like(cv))
    value = (advantage.detach() * logp).sum() + eta * torch.where(content, expected, torch.zeros_like(expected)).sum()
    a = torch.where(actions, centred[:, None].expand_as(cv), torch.zeros_like(cv))
    sums = torch.stack([(a * cv).sum(), (cv * cv).sum(), (a * a).sum()]).detach().double()
    return Surrogate(value=value, centred=centred, cv=cv, sums=sums)


@dataclass
class CvWeight:
    """The control variate's weight. Fixed (``fixed`` not None), or fitted: the weight that
    minimises the squared advantages sum (f - b - eta s)^2 over the previous step's action steps,
    eta = sum a s / sum s^2, from sums over every micro-step and process (so every process uses the
    same weight), starting at ``initial``. Using the previous step's statistics keeps the weight
    independent of the samples it is applied to, which the estimator's unbiasedness needs."""

    fixed: float | None = None
    initial: float = 1.0
    value: float = field(init=False)
    #: the share of the previous step's squared advantages its fitted weight removes (0 to 1)
    explained_last: float = 0.0
    pending: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    pending_step: int = 0

    def __post_init__(self):
        self.value = self.fixed if self.fixed is not None else self.initial

    def current(self, step: int) -> float:
        """The weight for optimiser step ``step``: the previous step's fit once its sums are in."""
        if self.pending_step and step != self.pending_step:
            a_s, s_s, a_a = self.pending
            self.explained_last = a_s * a_s / (s_s * a_a) if s_s > 0 and a_a > 0 else 0.0
            if self.fixed is None and s_s > 0:
                self.value = a_s / s_s
            self.pending, self.pending_step = [0.0, 0.0, 0.0], 0
        return self.value

    def add(self, step: int, sums: Tensor) -> None:
        """Adds one micro-step's sums (already summed over processes) to step ``step``'s fit."""
        self.pending = [p + float(v) for p, v in zip(self.pending, sums.tolist())]
        self.pending_step = step

    def state_dict(self) -> dict:
        return {"value": self.value, "explained_last": self.explained_last, "pending": list(self.pending),
                "pending_step": self.pending_step}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.explained_last = state["value"], state["explained_last"]
        self.pending, self.pending_step = list(state["pending"]), state["pending_step"]
