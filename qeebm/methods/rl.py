"""Policy-gradient pieces for the REINFORCE and PPO baselines: tensors in, a loss and detached
statistics out. No model code lives here, so each piece can be checked against hand arithmetic.

Shapes: B sequences, T target positions, V vocabulary; N sources with K samples each (B = N * K,
the samples of one source adjacent, as ``Translator.generate_ids`` lays them out).

Normalisation (docs/design.md): every loss is a SUM over this micro-batch's items divided by a
caller-given ``normaliser``, the global number of tokens (or samples) in the optimiser step. The loop
sums these contributions over micro-steps and processes, so the gradient is the full-batch mean's
whatever the split. Leaving ``normaliser=None`` divides by the local count: a plain mean. Statistics
follow the same rule, so the loop can add them up the same way.

The defaults below are the published PPO setup (TRL's classic PPOTrainer defaults, which the
QE-EBM paper used for its PPO baseline).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Published PPO setup (docs/method.md, "The baselines").
INIT_KL_COEF = 0.2
KL_TARGET = 6.0
KL_HORIZON = 10_000
GAMMA = 1.0
LAM = 0.95
CLIP = 0.2
VALUE_CLIP = 0.2
VALUE_COEF = 0.1  # the caller's weight on ppo_value_loss in pg_loss + VALUE_COEF * vf_loss

REWARD_SCALINGS = ("none", "whiten", "max_abs")


def _normaliser(normaliser: float | int | torch.Tensor | None, local_count: torch.Tensor | int) -> torch.Tensor | float:
    # An empty micro-batch (e.g. every sample masked out) contributes 0, not NaN.
    if normaliser is None:
        if isinstance(local_count, torch.Tensor):
            return local_count.clamp(min=1)
        return max(int(local_count), 1)
    return normaliser


# ----------------------------------------------------------------------------------------------
# Sequences


def eos_mask(tokens: torch.Tensor, eos_id: int, pad_id: int, n_forced: int = 0) -> torch.Tensor:
    """Which positions of ``tokens`` [B, T] belong to the translation: everything up to and including
    the first ``eos_id``; for a row without one (cut off by ``max_new_tokens``) every non-pad token.
    Returns a bool mask [B, T].

    ``tokens`` are the emitted tokens without the decoder start (``generate_ids(...)[:, 1:]``, the
    labels ``Translator.teacher_forcing`` builds). ``n_forced`` leading positions are dropped too:
    the target-language code is forced at generation, not sampled, so it is no action of the policy.
    """
    is_eos = tokens == eos_id  # [B, T]
    # Number of EOS strictly before each position: 0 up to and including the first EOS.
    eos_before = is_eos.long().cumsum(dim=1) - is_eos.long()  # [B, T]
    mask = (eos_before == 0) & ((tokens != pad_id) | is_eos)
    if n_forced:
        mask[:, :n_forced] = False
    return mask


def policy_logits(logits: torch.Tensor, temperature: float = 1.0, suppress: torch.Tensor | None = None) -> torch.Tensor:
    """The logits of the distribution the sampler actually draws from: ``logits`` [B, T, V] in fp32,
    divided by the sampling ``temperature``, with the ``suppress``-ed token ids (``Translator.
    suppressed_ids``: special tokens other than </s>, which sampling never emits) at -inf. Log-probs
    taken from these are the sampling distribution's, so PPO's ratios and KL and REINFORCE's score
    function refer to the policy that produced the samples."""
    # fp32 for the normaliser: a bf16 logsumexp over 256k entries loses the small differences that
    # PPO ratios are made of.
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if suppress is not None and suppress.numel():
        # out of place: the caller's logits may be needed for backward
        logits = logits.index_fill(-1, suppress.to(logits.device), float("-inf"))
    return logits


def sequence_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of ``tokens`` [B, T] under ``logits`` [B, T, V] (pass them through
    ``policy_logits`` first when sampling used a temperature or suppressed tokens).

    Returns ``token_logp`` [B, T] (exactly 0 where ``mask`` is 0) and ``seq_logp`` [B], their sum.
    Masked positions contribute neither value nor gradient, so whatever the model predicts after EOS
    or on padding (and whatever id sits there, -100 included) cannot leak into the loss.
    """
    mask = mask.bool()
    logits = logits.float()
    safe_tokens = tokens.masked_fill(~mask, 0)  # [B, T]; -100 labels would break gather
    picked = logits.gather(-1, safe_tokens.unsqueeze(-1)).squeeze(-1)  # [B, T]
    # gather - logsumexp rather than log_softmax: log_softmax keeps a second [B, T, V] tensor for
    # backward, which at V = 256k is the largest activation of the step.
    token_logp = picked - torch.logsumexp(logits, dim=-1)  # [B, T]
    # where, not multiply: a -inf or NaN at a masked position times 0 would still be NaN.
    token_logp = torch.where(mask, token_logp, torch.zeros_like(token_logp))
    return token_logp, token_logp.sum(dim=1)


@torch.no_grad()
def token_entropy(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Entropy [B, T] of softmax(``logits``) at every position (0 where ``mask`` is 0), detached: the
    policy's spread, which PPO users watch collapse. -inf logits (suppressed tokens) count as 0."""
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    plogp = torch.where(torch.isfinite(logp), logp.exp() * logp, torch.zeros_like(logp))
    ent = -plogp.sum(-1)
    return torch.where(mask.bool(), ent, torch.zeros_like(ent))


def value_moments(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[sum r, sum r^2, sum (r - v), sum (r - v)^2, count] over the valid tokens, float64 [5]: summed
    over processes, ``explained_variance`` turns them into 1 - Var(returns - values) / Var(returns),
    how much of the return the critic predicts (1: all, 0: no better than a constant, < 0: worse)."""
    m = mask.to(torch.float64)
    r, v = returns.detach().double(), values.detach().double()
    d = r - v
    return torch.stack([(r * m).sum(), (r * r * m).sum(), (d * m).sum(), (d * d * m).sum(), m.sum()])


def explained_variance(moments: torch.Tensor) -> float:
    sr, srr, sd, sdd, n = moments.tolist()
    if n < 2:
        return 0.0
    var_r = srr / n - (sr / n) ** 2
    var_d = sdd / n - (sd / n) ** 2
    return 1.0 - var_d / var_r if var_r > 1e-12 else 0.0


# ----------------------------------------------------------------------------------------------
# REINFORCE


class RunningMeanBaseline:
    """The published REINFORCE baseline: the mean of every reward seen in earlier steps.

    Call it for this step's baseline, then ``update`` with this step's rewards, so a sample never
    sits in its own baseline. Before any update there is no past; the batch's own mean is used
    then, so the very first step is not all-positive (Kiwi scores are mostly > 0).

    Every process must hold the same baseline: pass ``update`` the rewards of the whole optimiser
    step (gathered over processes and micro-steps), or the sum and count of them. The state is a
    float64 sum and an integer count, so a resumed run continues bit-for-bit.
    """

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    @property
    def value(self) -> float | None:
        return self.total / self.count if self.count else None

    def __call__(self, rewards: torch.Tensor) -> torch.Tensor:
        """Baseline for ``rewards`` (any shape), same shape and dtype."""
        if self.count == 0:
            return torch.full_like(rewards, rewards.float().mean().item())
        return torch.full_like(rewards, self.value)

    def update(
        self, rewards: torch.Tensor | None = None, *, total: float | None = None, count: int | None = None
    ) -> None:
        if rewards is not None:
            total, count = rewards.detach().double().sum().item(), rewards.numel()
        if total is None or count is None:
            raise ValueError("update needs rewards, or both total and count")
        self.total += float(total)
        self.count += int(count)

    def state_dict(self) -> dict:
        return {"total": self.total, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.total = float(state["total"])
        self.count = int(state["count"])


def rloo_baseline(rewards: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline [N, K]: for sample k of source n, the mean reward of the other K-1
    samples of that source (Kool et al. 2019), which keeps the estimator unbiased."""
    if rewards.dim() != 2:
        raise ValueError(f"rloo_baseline expects rewards [N, K], got shape {tuple(rewards.shape)}")
    k = rewards.shape[1]
    if k < 2:
        raise ValueError("RLOO needs at least 2 samples per source (K >= 2)")
    return (rewards.sum(dim=1, keepdim=True) - rewards) / (k - 1)


def penalised_rewards(scores: torch.Tensor, penalty: torch.Tensor, unit: str, step_scores: torch.Tensor,
                      step_penalty: torch.Tensor) -> torch.Tensor:
    """Rewards [B] of outputs with QE ``scores`` [B] and guard ``penalty`` [B] (0 = no hit), for
    ``GuardConfig.penalty_unit`` (qeebm/guards.py). ``step_scores`` / ``step_penalty`` are those of the whole
    optimiser step (every process and micro-step), so the rewards do not depend on how it was split.

    "reward": scores - penalty. "spread": an unflagged output keeps its score; a flagged one gets
    min(score, floor - penalty * std), floor being the lowest score of the step's unflagged outputs
    (of all its outputs when every one is flagged) and std the standard deviation of all its scores.
    """
    if unit == "reward":
        return scores - penalty
    hit = step_penalty > 0
    floor = (step_scores[~hit] if (~hit).any() else step_scores).min()
    std = step_scores.std() if step_scores.numel() > 1 else torch.zeros((), dtype=step_scores.dtype)
    return torch.where(penalty > 0, torch.minimum(scores, floor - penalty * std), scores)


def normalise_rewards(
    rewards: torch.Tensor,
    baseline: torch.Tensor | float | None = None,
    scaling: str = "none",
    eps: float = 1e-8,
    stats: torch.Tensor | None = None,
) -> torch.Tensor:
    """Advantages from rewards [B] (or [N, K]): ``rewards - baseline``, then scaled.

    ``scaling``:
      - "none": the centred rewards as they are;
      - "whiten": zero mean, unit variance over the batch (this re-centres on the batch mean, so a
        baseline makes no difference here);
      - "max_abs": the published "centred reward scaled to [-1, 1]". The paper does not say how it
        scales; dividing by the batch's largest |centred reward| is the reading that lands in
        [-1, 1] and keeps both the sign (better or worse than the baseline) and the ratios.

    The statistics are over the tensor passed in: give it the whole step's rewards (gathered over
    processes) if a result should not depend on how the step was split, or pass those centred
    rewards as ``stats`` (1-d) to scale just this part of the step by the whole step's statistics.
    """
    if scaling not in REWARD_SCALINGS:
        raise ValueError(f"unknown reward scaling {scaling!r}; expected one of {', '.join(REWARD_SCALINGS)}")
    adv = rewards.detach().float()
    if baseline is not None:
        adv = adv - baseline
    if stats is None:
        stats = adv
    if scaling == "whiten":
        return whiten(adv, moments=masked_moments(stats), eps=eps)
    if scaling == "max_abs":
        return adv / stats.abs().max().clamp(min=eps)
    return adv


def policy_gradient_loss(
    seq_logp: torch.Tensor, advantages: torch.Tensor, normaliser: float | int | torch.Tensor | None = None
) -> torch.Tensor:
    """REINFORCE: -sum_b A_b * log p(y_b | x_b) / normaliser. seq_logp [B] carries the graph;
    advantages [B] are detached so the reward never receives gradient."""
    total = -(advantages.detach().to(seq_logp.dtype) * seq_logp).sum()
    return total / _normaliser(normaliser, seq_logp.numel())


# ----------------------------------------------------------------------------------------------
# PPO (seq2seq, one action per target token)


def masked_moments(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """[sum, sum of squares, count] of the valid entries of ``x``, as one float64 tensor [3]. Summing
    these over processes (all_reduce) before ``whiten`` gives statistics of the whole step."""
    x = x.detach().double()
    m = torch.ones_like(x) if mask is None else mask.to(x.dtype)
    return torch.stack([(x * m).sum(), (x * x * m).sum(), m.sum()])


def whiten(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    shift_mean: bool = True,
    moments: torch.Tensor | None = None,
    eps: float = 1e-8,
) -> torch.Tensor:
    """(x - mean) / std over the valid entries (unbiased variance, as TRL's classic PPO). With
    ``shift_mean=False`` the mean is added back (only the scale changes, e.g. for rewards). Masked
    entries come out 0. ``moments`` (from ``masked_moments``, possibly all-reduced) replace the local
    statistics."""
    if moments is None:
        moments = masked_moments(x, mask)
    total, total_sq, n = moments.tolist()
    if n == 0:
        return torch.zeros_like(x)
    mean = total / n
    # Bessel's correction n/(n-1); one valid entry has no spread to correct.
    var = max(total_sq / n - mean * mean, 0.0) * (n / (n - 1) if n > 1 else 1.0)
    out = (x - mean) / math.sqrt(var + eps)
    if not shift_mean:
        out = out + mean
    if mask is not None:
        out = torch.where(mask.bool(), out, torch.zeros_like(out))
    return out


def sequence_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence KL to the reference [B]: the k1 estimate sum_t (logp_t - ref_logp_t) over valid
    tokens of sampled sequences. Its batch mean is what ``AdaptiveKLController.update`` takes."""
    diff = (logp - ref_logp).detach()
    return torch.where(mask.bool(), diff, torch.zeros_like(diff)).sum(dim=1)


def per_token_rewards(
    score: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> torch.Tensor:
    """PPO rewards [B, T]: -kl_coef * (logp_t - ref_logp_t) at every valid token, plus the sequence
    score [B] at the last valid token; 0 on masked positions.

    The KL term is the k1 estimator (log-ratio of the sampled token), as TRL's classic PPO: unbiased
    for KL(policy || ref) in expectation over samples, though single tokens can be negative.
    A row with no valid token gets no score.
    """
    mask = mask.bool()
    kl = (logp - ref_logp).detach()  # [B, T]
    rewards = torch.where(mask, -kl_coef * kl, torch.zeros_like(kl))
    t = mask.shape[1]
    positions = torch.arange(t, device=mask.device).expand_as(mask)  # [B, T]
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=1).values  # [B]
    has_any = last >= 0
    rows = torch.arange(mask.shape[0], device=mask.device)[has_any]
    rewards[rows, last[has_any]] += score.detach().to(rewards.dtype)[has_any]
    return rewards


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = GAMMA, lam: float = LAM
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over target tokens.

    rewards, values, mask: [B, T]. Returns advantages and returns [B, T] (returns = advantages +
    values), both 0 where ``mask`` is 0. Masked positions are skipped, not treated as steps: after
    the last valid token the next value is 0 (the episode ended), and a masked position in front of
    or between valid ones (e.g. the forced language code) passes the recursion through unchanged.
    """
    mask = mask.bool()
    rewards = rewards.detach().float()
    values = values.detach().float()
    b, t = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(b, device=rewards.device)  # V of the next valid position, 0 past the end
    next_adv = torch.zeros(b, device=rewards.device)
    for i in reversed(range(t)):
        m = mask[:, i]
        delta = rewards[:, i] + gamma * next_value - values[:, i]  # TD error
        adv = delta + gamma * lam * next_adv
        advantages[:, i] = torch.where(m, adv, torch.zeros_like(adv))
        next_value = torch.where(m, values[:, i], next_value)
        next_adv = torch.where(m, adv, next_adv)
    returns = torch.where(mask, advantages + values, torch.zeros_like(values))
    return advantages, returns


def ppo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float = CLIP,
    normaliser: float | int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate (Schulman et al. 2017), per token.

    logp (with graph), old_logp, advantages, mask: [B, T]. Loss = sum over valid tokens of
    max(-A * r, -A * clip(r, 1 - clip, 1 + clip)) / normaliser, r = exp(logp - old_logp).
    Stats (detached, same normalisation): ``clipfrac`` (share of tokens where the clipped term won),
    ``approx_kl`` (k3 estimate (r - 1) - log r of KL(old || new), as cleanrl: never negative),
    ``ratio_mean``.
    """
    m = mask.to(logp.dtype)
    s = clipped_surrogate(logp, old_logp, advantages, clip)
    norm = _normaliser(normaliser, m.sum())
    loss = (s.loss * m).sum() / norm
    with torch.no_grad():
        stats = {
            "clipfrac": (s.clipped.to(m.dtype) * m).sum() / norm,
            "approx_kl": (((s.ratio - 1) - s.log_ratio) * m).sum() / norm,
            "ratio_mean": (s.ratio * m).sum() / norm,
        }
    return loss, stats


@dataclass
class Surrogate:
    """``clipped_surrogate``'s per-token results [B, T], unmasked: ``loss`` carries the graph;
    ``ratio``, ``log_ratio`` and ``clipped`` (where the clipped term won) are detached."""

    loss: torch.Tensor
    ratio: torch.Tensor
    log_ratio: torch.Tensor
    clipped: torch.Tensor


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip: float) -> Surrogate:
    """PPO's clipped objective per token, as a loss: max(-A * r, -A * clip(r, 1 - clip, 1 + clip)),
    r = exp(logp - old_logp). logp [B, T] carries the graph; ``advantages`` broadcast against it
    ([B, T] per token, [B, 1] per sequence) and are detached, as is ``old_logp``. Shared by PPO and
    GRPO, which differ only in how they weigh and sum it."""
    log_ratio = logp - old_logp.detach()
    ratio = torch.exp(log_ratio)
    adv = advantages.detach().to(logp.dtype)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
    return Surrogate(loss=torch.maximum(unclipped, clipped), ratio=ratio.detach(), log_ratio=log_ratio.detach(),
                     clipped=(clipped > unclipped).detach())


def ppo_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float = VALUE_CLIP,
    normaliser: float | int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss of classic PPO: 0.5 * max((V - R)^2, (V_clip - R)^2) summed over valid
    tokens / normaliser, with V_clip = old_V + clip(V - old_V, -clip, clip). values [B, T] carry
    the graph. Stat ``vf_clipfrac``: share of tokens where the clipped term won."""
    m = mask.to(values.dtype)
    old_values = old_values.detach().to(values.dtype)
    returns = returns.detach().to(values.dtype)
    v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    loss_unclipped = (values - returns) ** 2
    loss_clipped = (v_clipped - returns) ** 2
    norm = _normaliser(normaliser, m.sum())
    loss = 0.5 * (torch.maximum(loss_unclipped, loss_clipped) * m).sum() / norm
    with torch.no_grad():
        stats = {"vf_clipfrac": ((loss_clipped > loss_unclipped).to(m.dtype) * m).sum() / norm}
    return loss, stats


class AdaptiveKLController:
    """Proportional KL controller of Ziegler et al. 2019 ("Fine-Tuning Language Models from Human
    Preferences", eq. 2): e = clip(KL / target - 1, -0.2, 0.2); kl_coef <- kl_coef * (1 + e * n_steps /
    horizon). ``current_kl`` is the batch mean of ``sequence_kl``; ``n_steps`` the number of
    sequences in that batch (what TRL's classic PPO passes)."""

    def __init__(self, init_kl_coef: float = INIT_KL_COEF, target: float = KL_TARGET, horizon: int = KL_HORIZON):
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict:
        # target and horizon come from the config, so a resumed run may change them on purpose.
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class FixedKLController:
    """A constant KL coefficient; ``update`` does nothing."""

    def __init__(self, kl_coef: float = INIT_KL_COEF):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


# ----------------------------------------------------------------------------------------------
# GRPO (Shao et al. 2024): the group of one source's samples as the baseline, no critic

# What divides a group's centred rewards (``grpo.scale_rewards``; TRL's names): the group's own
# standard deviation (published), the whole step's ("Lite PPO", arXiv 2508.08221), or nothing
# (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783: a group's std weighs sources by how much their
# samples happen to differ).
GRPO_SCALINGS = ("group", "batch", "none")
# How the per-token losses become one number (``grpo.loss_type``; TRL's names): "grpo", each
# sequence's token mean, then the mean over sequences (published); "dapo", the mean over every
# token of the step (DAPO, arXiv 2503.14476; TRL's "bnpo" is the same over one micro-batch, which
# would make the update depend on how the step is split); "dr_grpo", the token sum over sequences x
# max_new_tokens (Dr. GRPO: without length normalisation a long sample's tokens weigh as much as a
# short one's).
GRPO_LOSS_TYPES = ("grpo", "dapo", "dr_grpo")
# Added to the std, as TRL: a group whose samples all scored the same gets advantages 0, not NaN.
GRPO_STD_EPS = 1e-4


def group_advantages(rewards: torch.Tensor, scale: str = "group", batch_std: float | torch.Tensor | None = None,
                     eps: float = GRPO_STD_EPS) -> torch.Tensor:
    """GRPO's advantages [N, G] from ``rewards`` [N, G] (G samples of each of N sources): each
    reward minus its group's mean, divided by (std + ``eps``) for ``scale`` "group" (the group's
    unbiased std) or "batch" (``batch_std``: the whole step's, which the caller gathers), or
    not divided ("none")."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"group_advantages expects rewards [N, G] with G >= 2, got shape {tuple(rewards.shape)}")
    if scale not in GRPO_SCALINGS:
        raise ValueError(f"unknown scale {scale!r}; expected one of {', '.join(GRPO_SCALINGS)}")
    rewards = rewards.detach().float()
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if scale == "group":
        return centred / (rewards.std(dim=1, keepdim=True) + eps)
    if scale == "batch":
        if batch_std is None:
            raise ValueError("scale='batch' needs the step's batch_std")
        return centred / (float(batch_std) + eps)
    return centred


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token KL(policy || ref) [B, T] by Schulman's k3 estimator on tokens sampled from the
    policy: exp(ref - logp) - (ref - logp) - 1, never negative, 0 where the two agree and off
    ``mask``. Unlike PPO's k1 reward penalty it is a loss term: the gradient flows through ``logp``."""
    d = ref_logp.detach() - logp
    kl = torch.exp(d) - d - 1
    return torch.where(mask.bool(), kl, torch.zeros_like(kl))


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              clip: float = CLIP, ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0,
              loss_type: str = "grpo", normaliser: float | int | torch.Tensor | None = None,
              max_len: int | None = None) -> tuple[torch.Tensor, Surrogate, torch.Tensor | None]:
    """GRPO's loss: per token the clipped surrogate (``clipped_surrogate``) with each sequence's
    advantage (``advantages`` [B]) plus ``kl_coef`` x the k3 KL to ``ref_logp`` (needed when
    ``kl_coef`` > 0), summed as ``loss_type`` says (``GRPO_LOSS_TYPES``) and divided by
    ``normaliser``: the step's sequences ("grpo"), its tokens ("dapo") or its sequences x
    ``max_len`` ("dr_grpo"); None takes this batch's own count.

    Returns the loss, the surrogate's per-token parts and the per-token KL (detached; None without
    a reference)."""
    if loss_type not in GRPO_LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {', '.join(GRPO_LOSS_TYPES)}")
    m = mask.to(logp.dtype)
    s = clipped_surrogate(logp, old_logp, advantages.unsqueeze(1), clip)
    per_token, kl = s.loss, None
    if kl_coef != 0.0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp")
        kl = k3_kl(logp, ref_logp, mask)
        per_token = per_token + kl_coef * kl
        kl = kl.detach()
    if loss_type == "grpo":
        total = ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).sum()
        local = logp.shape[0]
    else:
        total = (per_token * m).sum()
        if loss_type == "dapo":
            local = m.sum()
        else:
            if normaliser is None and max_len is None:
                raise ValueError("loss_type='dr_grpo' needs max_len or a normaliser")
            local = logp.shape[0] * (max_len or 1)
    return total / _normaliser(normaliser, local), s, kl
