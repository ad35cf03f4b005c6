"""REINFORCE with a QE reward: the policy-gradient baseline of the QE-EBM paper.

Per optimiser step (docs/method.md, "The baselines"; docs/rl_baselines.md for what qeebm changed):
1. sample K translations of each source-only sentence (nucleus p=0.9 as published), never a
   special token other than </s>;
2. reward = QE score of (source, sample), guard hits penalised (qeebm/guards.py; by default on the
   scale of the step's QE spread, ``guards.penalty_unit``);
3. advantage = reward - baseline (leave-one-out over the K samples of the same source by default;
   the published running mean of earlier rewards, or none), then scaled (by default divided by the
   step's standard deviation; published: the centred reward scaled to [-1, 1]); baseline and scale
   come from the whole step, all processes and micro-steps, so the update does not depend on the split;
4. loss = alpha * CE(labelled batch) + pg_weight * policy gradient, a token mean over the step's
   samples (the CE is a token mean too, so pg_weight weighs like with like). The sequence log-probability of a
   sample counts its tokens up to and including </s>, never the forced language code, under the
   distribution it was sampled from (temperature, suppressed tokens), with dropout off as when it
   was sampled.
No KL term, as published.

The reward (``methods.common.QEReward``) and the sampler (``methods.sampling``) are shared with PPO.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from qeebm.config import Config, SamplingConfig, method_section
from qeebm.errors import QeebmError
from qeebm.guards import GuardResult, hit_rates
from qeebm.methods.base import Batch, Method, StepOutput
from qeebm.methods.common import QEReward, check_static_qe, label_smoothed_ce, mono_references, step_rewards
from qeebm.methods.rl import RunningMeanBaseline, normalise_rewards, policy_gradient_loss, rloo_baseline
from qeebm.methods.sampling import Samples, mono_sources, replay, sample, sampling_config
from qeebm.translation.translator import eval_mode


@method_section("reinforce", choices={"baseline": ("rloo", "running_mean", "none"),
                                     "reward_scaling": ("whiten", "max_abs", "none")},
                renamed={"beta": "pg_weight", "alpha": "ce_weight"})
@dataclass
class ReinforceConfig:
    """REINFORCE, the paper's policy-gradient baseline: ``sampling.num_samples`` (K) samples of each
    source-only sentence (``data.mono``, global size ``optim.batch_size``), nucleus p=0.9 as
    published; reward = QE score (``qe.path``, or ``reward.terms``) with the hits of the ``guards`` penalised (when
    ``guards`` is true; ``guards.penalty_unit``); loss = ce_weight * CE(labelled batch) + pg_weight *
    policy gradient, both token means over the step; no KL term.

    ``baseline``: "rloo" (default: the mean of the other K-1 samples of the same source, Kool et al.
    2019, which compares translations of one source with each other), "running_mean" (published: the
    mean of every earlier step's rewards, shared by every source) or "none". ``reward_scaling``:
    "whiten" (default: divided by the step's standard deviation, so pg_weight does not depend on the QE's
    score scale), "max_abs" (published "centred reward scaled to [-1, 1]": divided by the step's
    largest |reward - baseline|, usually one guard hit's) or "none". Both use the whole optimiser
    step. The paper does not give the policy gradient's weight. The log-probabilities are taken under the sampling
    temperature; top_k/top_p truncate the sampler only (the published nucleus estimator)."""

    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(top_p=0.9))
    baseline: str = "rloo"  # rloo | running_mean | none
    reward_scaling: str = "whiten"  # whiten | max_abs | none
    ce_weight: float = 1.0  # 0 skips the labelled forward pass
    pg_weight: float = 0.1  # policy-gradient weight
    guards: bool = True


@dataclass
class ReinforceRollout:
    """One micro-batch: the labelled ``batch`` (CE term) and K samples of each of its N source-only
    sentences. ``scores`` (QE alone), ``penalty`` (the guards', 0: no hit): [N, K]. Set by
    ``finish_rollouts``: ``rewards``, ``advantages``, ``baselines`` [N, K], ``global_tokens`` (the
    policy's actions in the whole optimiser step: the policy gradient's normaliser) and
    ``step_stats`` (the step's reward and advantage spread, logged as they are).
    ``global_samples``: samples in the whole optimiser step. ``terms``: each ``reward.terms`` term's
    scores [N * K] (empty without them)."""

    batch: Batch
    samples: Samples
    scores: torch.Tensor
    penalty: torch.Tensor
    guards: GuardResult | None
    global_samples: int
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    baselines: torch.Tensor | None = None
    global_tokens: float = 0.0
    step_stats: dict[str, float] | None = None


class Reinforce(Method):
    name = "reinforce"
    section = "reinforce"
    needs_mono = True

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        check_static_qe(cfg)
        c = cfg.reinforce
        if c.sampling.num_samples < 1:
            raise QeebmError(f"reinforce.sampling.num_samples must be at least 1; got {c.sampling.num_samples}")
        if c.baseline == "rloo" and c.sampling.num_samples < 2:
            raise QeebmError("reinforce.baseline=rloo leaves one sample out: it needs reinforce.sampling.num_samples >= 2")

    def __init__(self, cfg: Config, translator, model: torch.nn.Module):
        self.cfg, self.c = cfg, cfg.reinforce
        self.translator, self.model = translator, model
        self.gen = sampling_config(self.c.sampling)
        self.reward = QEReward(cfg, translator, self.c.guards)
        self.needs_reference = self.reward.needs_reference
        self.running = RunningMeanBaseline()
        self.label_smoothing = cfg.optim.label_smoothing  # of the CE term (alpha > 0), as SFT's

    def frozen_qes(self) -> dict[str, torch.nn.Module]:
        return self.reward.frozen_qes()

    # State a resume must restore: the running mean of past rewards.
    def state_dict(self) -> dict:
        return {"running_mean": self.running.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.running.load_state_dict(state["running_mean"])

    @torch.no_grad()
    def rollout(self, batch: Batch) -> ReinforceRollout:
        # 1. Sample K translations of every source-only sentence.
        k = self.c.sampling.num_samples
        samples = sample(self.translator, mono_sources(batch), k, self.gen)
        # 2. What the reward is made of: the QE's score and the guards' penalty.
        scores, penalty, guards, terms = self.reward(samples.src, samples.hyps, mono_references(batch, k))
        device = samples.tokens.device
        return ReinforceRollout(batch=batch, samples=samples, scores=scores.view(-1, k).to(device),
                                penalty=penalty.view(-1, k).to(device), guards=guards,
                                global_samples=batch.global_mono * k, terms=terms)

    def finish_rollouts(self, rollouts: list[ReinforceRollout], gather) -> list[ReinforceRollout]:
        """2-3. Rewards and advantages from the whole step. ``gather(t)`` concatenates a 1-d tensor
        over processes, so every process computes the same rewards, baseline and scale."""
        penalised, step_scores = step_rewards([r.scores for r in rollouts], [r.penalty for r in rollouts],
                                              self.cfg.guards.penalty_unit, gather)
        for r, w in zip(rollouts, penalised):
            r.rewards = w
        rewards = torch.cat([r.rewards.flatten() for r in rollouts])  # [n_local * K]
        every = gather(rewards)  # [global samples]
        if self.c.baseline == "running_mean":
            # The mean of earlier steps' rewards (this step's own mean on the first step), then
            # this step joins the running mean for the next one.
            past = self.running(every)[0]
            self.running.update(every)
            baselines = [torch.full_like(r.rewards, past.item()) for r in rollouts]
        elif self.c.baseline == "rloo":
            baselines = [rloo_baseline(r.rewards) for r in rollouts]
        else:
            baselines = [torch.zeros_like(r.rewards) for r in rollouts]
        centred = [r.rewards - b for r, b in zip(rollouts, baselines)]
        scaling = self.c.reward_scaling
        if scaling != "none":
            # The scale (largest |centred reward|, or the moments) is the whole step's.
            everything = gather(torch.cat([c.flatten() for c in centred]))
            centred = [normalise_rewards(c, scaling=scaling, stats=everything) for c in centred]
        tokens = gather(torch.stack([r.samples.mask.sum() for r in rollouts]).sum().view(1).double()).sum().item()
        advantages = gather(torch.cat([a.flatten() for a in centred]))
        stats = {"reinforce/reward_std": every.std().item() if every.numel() > 1 else 0.0,
                 "reinforce/score_std": step_scores.std().item() if step_scores.numel() > 1 else 0.0,
                 "reinforce/advantage_std": advantages.std().item() if advantages.numel() > 1 else 0.0,
                 **self.reward.step_means([r.terms for r in rollouts], gather)}
        for r, b, a in zip(rollouts, baselines, centred):
            r.baselines, r.advantages, r.global_tokens, r.step_stats = b, a, tokens, stats
        return rollouts

    def loss(self, r: ReinforceRollout) -> StepOutput:
        s, n = r.samples, r.global_samples
        # 4. Policy gradient: -A * log p(sample), a token mean over the step's samples. Dropout off,
        #    as the samples were drawn; the log-probs are those of the sampling distribution.
        with eval_mode(self.model):
            logp, _, _ = replay(self.model, s)  # [B, T]
        seq_logp = logp.sum(dim=1)  # [B]
        pg = policy_gradient_loss(seq_logp, r.advantages.flatten(), normaliser=max(r.global_tokens, 1.0))
        terms = {"pg": self.c.pg_weight * pg}
        metrics = {
            "reinforce/pg_loss": pg.item(),
            "reinforce/reward": r.rewards.sum().item() / n,
            "reinforce/score": r.scores.sum().item() / n,
            "reinforce/guard_penalty": (r.scores - r.rewards).sum().item() / n,
            "reinforce/baseline": r.baselines.sum().item() / n,
            "reinforce/advantage": r.advantages.sum().item() / n,
            "reinforce/sample_len": s.mask.sum().item() / n,
            "reinforce/logp": seq_logp.detach().sum().item() / n,
        }
        # The supervised term on the labelled batch, as SFT computes it.
        if self.c.ce_weight > 0:
            ce, nll = label_smoothed_ce(self.model, r.batch, self.label_smoothing, with_nll=True)
            terms["ce"] = self.c.ce_weight * ce
            metrics |= {"reinforce/ce": ce.item(), "reinforce/nll": nll.item()}
        if r.guards is not None:
            metrics |= hit_rates(r.guards, normaliser=n)
        return StepOutput(loss=sum(terms.values()), metrics=metrics, terms=terms, values=r.step_stats)
