"""GRPO with a QE reward (Shao et al. 2024, DeepSeekMath): PPO's clipped surrogate without a
critic, the G samples of one source being each other's baseline.

Per optimiser step (docs/rl_baselines.md, "GRPO", for how it differs from REINFORCE and PPO here):

1. sample G translations of each source-only sentence from the full policy, stopping at </s>,
   never drawing another special token (``methods.sampling``, as REINFORCE and PPO);
2. score them with the QE and run the guards; rewards: guard hits penalised on the scale of the
   step's QE spread (``guards.penalty_unit``), from the whole step;
3. record, without gradient and without dropout, the policy's log-probs of the sampled tokens (only
   with ``epochs`` > 1: otherwise the update's own, detached, are the same numbers) and, with
   ``kl_coef`` > 0, the initial model's (``common.InitialPolicy``: with a fresh LoRA adapter the
   same network with the adapter disabled), all under the sampling distribution;
4. advantages: each reward minus its group's mean, divided by the group's std (or the step's, or
   not at all: ``grpo.scale_rewards``), one per sample and the same for all its tokens;
5. (called by the loop ``epochs`` times, one optimiser update each, all over the whole rollout)
   pg_weight x (clipped surrogate + kl_coef x k3 KL to the initial model, per token, summed as
   ``grpo.loss_type`` says) [+ alpha x CE on the labelled batch].

The loss's normalisers (the step's samples, tokens, or samples x max_new_tokens) are gathered over
processes and micro-steps, so the update does not depend on how the step was split.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from qeebm.config import Config, SamplingConfig, method_section
from qeebm.errors import QeebmError
from qeebm.guards import GuardResult, hit_rates
from qeebm.methods.base import Batch, Method, StepOutput
from qeebm.methods.common import (
    InitialPolicy,
    QEReward,
    check_static_qe,
    label_smoothed_ce,
    mono_references,
    step_rewards,
)
from qeebm.methods.rl import group_advantages, grpo_loss
from qeebm.methods.sampling import Samples, mono_sources, replay, sample, sampling_config
from qeebm.translation.translator import eval_mode


@method_section("grpo", choices={"scale_rewards": ("group", "batch", "none"), "loss_type": ("grpo", "dapo", "dr_grpo")},
                renamed={"alpha": "ce_weight"}, added=True)
@dataclass
class GRPOConfig:
    """GRPO (Shao et al. 2024, DeepSeekMath), a critic-free PPO: ``sampling.num_samples`` (G) samples
    of each source-only sentence (ancestral; top-k/top-p are refused, as PPO's, since the ratios and
    the KL need the probabilities the sampler drew with; ``temperature`` applied to every log-prob),
    reward = QE score with guard hits penalised (``guards.penalty_unit``), and each sample's advantage
    its reward minus its group's mean, divided by (std + 1e-4) of the group (``scale_rewards:
    group``, published), of the whole step (``batch``) or by nothing (``none``). Then ``epochs``
    optimiser updates over the rollout, each on pg_weight x (clipped surrogate (``clip``) with the
    probability ratio against the rollout's log-probs + ``kl_coef`` x the k3 KL estimate to the
    initial model, per token) [+ ``ce_weight`` x CE on the labelled batch]. With ``epochs: 1`` the ratio
    is exactly 1 and the update is the policy gradient; ``kl_coef: 0`` loads no reference. Every
    forward runs without dropout.

    ``loss_type`` sums the per-token losses (qeebm/methods/rl.py, ``GRPO_LOSS_TYPES``): ``grpo`` (each
    sample's token mean, then the mean over the step's samples, published), ``dapo`` (the mean over
    the step's tokens) or ``dr_grpo`` (the sum over the step's samples x ``sampling.max_new_tokens``).
    Dr. GRPO is ``loss_type: dr_grpo`` with ``scale_rewards: none``."""

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    epochs: int = 1
    clip: float = 0.2
    kl_coef: float = 0.04
    scale_rewards: str = "group"  # group | batch | none
    loss_type: str = "grpo"  # grpo | dapo | dr_grpo
    ce_weight: float = 1.0  # on the labelled batch; 0 skips its forward pass
    pg_weight: float = 1.0  # weight of the GRPO loss (surrogate and KL together)
    guards: bool = True


@dataclass
class GRPORollout:
    """One micro-batch: the labelled ``batch`` (CE term) and G samples of each of its N source-only
    sentences (``samples``, B = N * G rows, a source's samples adjacent).

    From ``rollout``: ``scores`` (the QE's), ``penalty`` (the guards', 0: no hit) [N, G];
    ``old_logp`` [B, T], the sampling policy's token log-probs (None with one epoch); ``ref_logp``
    [B, T], the initial model's (None without a KL term); both 0 off ``samples.mask``.
    From ``finish_rollouts``: ``rewards``, ``advantages`` [N, G]; ``normaliser``, the loss's
    divisor for the whole step (``grpo.loss_type``); ``tokens``, the step's sampled tokens (the
    per-token metrics' divisor); ``step_stats``, statistics of the whole step, logged as they are.
    ``global_samples``: samples in the whole step. ``terms``: each ``reward.terms`` term's scores
    [B] (empty without them)."""

    batch: Batch
    samples: Samples
    scores: torch.Tensor
    penalty: torch.Tensor
    guards: GuardResult | None
    global_samples: int
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    normaliser: float = 1.0
    tokens: float = 1.0
    step_stats: dict[str, float] | None = None


class GRPO(Method):
    name = "grpo"
    section = "grpo"
    needs_mono = True

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        check_static_qe(cfg)
        c, s = cfg.grpo, cfg.grpo.sampling
        if s.num_samples < 2:
            raise QeebmError(f"grpo.sampling.num_samples must be at least 2 (a group's samples are each other's "
                             f"baseline); got {s.num_samples}")
        if c.epochs < 1:
            raise QeebmError(f"grpo.epochs must be at least 1; got {c.epochs}")
        if s.top_k != 0 or s.top_p != 1.0:
            # The ratio and the KL need the probability the sampler drew each token with.
            raise QeebmError(f"grpo samples from the full policy: grpo.sampling.top_k must be 0 and "
                             f"grpo.sampling.top_p 1.0 (got {s.top_k} and {s.top_p}); grpo.sampling.temperature is "
                             "applied to the log-probs")
        if s.temperature <= 0:
            raise QeebmError(f"grpo.sampling.temperature must be > 0; got {s.temperature}")
        if c.clip <= 0:
            raise QeebmError(f"grpo.clip must be > 0; got {c.clip}")
        if c.kl_coef < 0:
            raise QeebmError(f"grpo.kl_coef must be >= 0; got {c.kl_coef}")

    def __init__(self, cfg: Config, translator, model: torch.nn.Module):
        self.cfg, self.c = cfg, cfg.grpo
        self.translator, self.model = translator, model
        self.epochs = self.c.epochs
        self.gen = sampling_config(self.c.sampling)
        self.reward = QEReward(cfg, translator, self.c.guards)
        self.needs_reference = self.reward.needs_reference
        self.label_smoothing = cfg.optim.label_smoothing  # of the CE term (alpha > 0), as SFT's
        # Without a KL term nothing reads the initial model: no copy of it is kept.
        self.initial = InitialPolicy(translator) if self.c.kl_coef > 0 else None

    def frozen_qes(self) -> dict[str, torch.nn.Module]:
        return self.reward.frozen_qes()

    @torch.no_grad()
    def rollout(self, batch: Batch) -> GRPORollout:
        # 1-2. Sample G translations of every source-only sentence; score and guard them.
        g = self.c.sampling.num_samples
        s = sample(self.translator, mono_sources(batch), g, self.gen)
        scores, penalty, guards, terms = self.reward(s.src, s.hyps, mono_references(batch, g))
        # 3. Log-probs of the sampling policy (the unwrapped module: no gradient, no DDP) when a later
        #    epoch's ratio needs them, and of the initial model when the KL term does.
        old_logp = ref_logp = None
        if self.epochs > 1:
            with eval_mode(self.translator.model) as policy:
                old_logp, _, _ = replay(policy, s)
        if self.initial is not None:
            with self.initial() as ref:
                ref_logp, _, _ = replay(ref, s)
        device = s.tokens.device
        return GRPORollout(batch=batch, samples=s, scores=scores.view(-1, g).to(device),
                           penalty=penalty.view(-1, g).to(device), guards=guards, global_samples=batch.global_mono * g,
                           old_logp=old_logp, ref_logp=ref_logp, terms=terms)

    def finish_rollouts(self, rollouts: list[GRPORollout], gather) -> list[GRPORollout]:
        """2 and 4 with the whole step's statistics; ``gather(t)`` concatenates a 1-d tensor over
        processes, so every process computes the same rewards, scale and normalisers."""
        c = self.c
        penalised, step_scores = step_rewards([r.scores for r in rollouts], [r.penalty for r in rollouts],
                                              self.cfg.guards.penalty_unit, gather)
        for r, w in zip(rollouts, penalised):
            r.rewards = w
        every = gather(torch.cat([r.rewards.flatten() for r in rollouts]))  # [global samples]
        reward_std = every.std().item() if every.numel() > 1 else 0.0
        for r in rollouts:
            r.advantages = group_advantages(r.rewards, c.scale_rewards, batch_std=reward_std)
        local = torch.stack([r.samples.mask.sum() for r in rollouts]).sum().view(1).double()
        tokens = gather(local).sum().item()
        samples = float(rollouts[0].global_samples)
        normaliser = {"grpo": samples, "dapo": tokens, "dr_grpo": samples * c.sampling.max_new_tokens}[c.loss_type]
        g = every.view(-1, c.sampling.num_samples)
        advantages = gather(torch.cat([r.advantages.flatten() for r in rollouts]))
        stats = {"grpo/reward_std": reward_std,
                 "grpo/score_std": step_scores.std().item() if step_scores.numel() > 1 else 0.0,
                 "grpo/advantage_std": advantages.std().item() if advantages.numel() > 1 else 0.0,
                 # Groups whose samples all got the same reward carry no signal at all.
                 "grpo/flat_groups": (g == g[:, :1]).all(dim=1).double().mean().item(),
                 **self.reward.step_means([r.terms for r in rollouts], gather)}
        for r in rollouts:
            r.normaliser, r.tokens, r.step_stats = max(normaliser, 1.0), max(tokens, 1.0), stats
        return rollouts

    def loss(self, r: GRPORollout) -> StepOutput:
        c, s, n = self.c, r.samples, r.global_samples
        # 5. Dropout off, as when the samples and the old log-probs were taken: the first epoch's
        #    ratios are exactly 1.
        with eval_mode(self.model):
            logp, entropy, _ = replay(self.model, s, entropy=True)  # [B, T]
        old = r.old_logp if r.old_logp is not None else logp.detach()
        pg, surrogate, kl = grpo_loss(logp, old, r.advantages.flatten(), s.mask, c.clip, ref_logp=r.ref_logp,
                                      kl_coef=c.kl_coef, loss_type=c.loss_type, normaliser=r.normaliser)
        terms = {"pg": c.pg_weight * pg}
        m = s.mask.to(logp.dtype)

        def per_token(t: torch.Tensor) -> float:
            return (t.to(m.dtype) * m).sum().item() / r.tokens

        metrics = {
            "grpo/pg_loss": pg.item(),
            "grpo/ratio": per_token(surrogate.ratio),
            "grpo/clipfrac": per_token(surrogate.clipped),
            "grpo/entropy": per_token(entropy),
            "grpo/reward": r.rewards.sum().item() / n,
            "grpo/score": r.scores.sum().item() / n,
            "grpo/guard_penalty": (r.scores - r.rewards).sum().item() / n,
            "grpo/advantage_abs": r.advantages.abs().sum().item() / n,
            "grpo/sample_len": s.mask.sum().item() / n,
        }
        if kl is not None:
            metrics["grpo/kl"] = per_token(kl)
        if c.ce_weight > 0:
            ce, nll = label_smoothed_ce(self.model, r.batch, self.label_smoothing, with_nll=True)
            terms["ce"] = c.ce_weight * ce
            metrics |= {"grpo/ce": ce.item(), "grpo/nll": nll.item()}
        if r.guards is not None:
            metrics |= hit_rates(r.guards, normaliser=n)
        return StepOutput(loss=sum(terms.values()), metrics=metrics, terms=terms, values=r.step_stats)
