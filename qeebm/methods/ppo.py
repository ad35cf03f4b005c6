"""PPO with a QE reward: the actor-critic baseline of the QE-EBM paper.

The paper ran seq2seq PPO with TRL's former defaults (docs/method.md): a value head,
adaptive KL to the initial model, GAE, clipped policy and value losses, 2 PPO epochs over
minibatches of each rollout. One optimiser step of the loop is one rollout here:

1. sample K translations of each source-only sentence, stopping at </s> (the reference code never
   stopped: it passed eos_token_id=-1), never drawing another special token;
2. score them with the QE and run the guards;
3. record the policy's log-probs and values and the reference policy's log-probs of the sampled
   tokens, all under the sampling distribution (temperature applied, suppressed tokens removed).
   The reference is the initial model: with LoRA the same network with its adapter disabled (no
   second copy), otherwise a frozen copy made before any update;
4. rewards: the QE score, guard hits penalised on the scale of the step's QE spread
   (``guards.penalty_unit``); per token -kl_coef * (logp - ref_logp), the reward added at the last;
5. adapt kl_coef to the step's mean KL (Ziegler et al. 2019), for the next step;
6. GAE(gamma, lambda); advantages whitened over the step's tokens;
7. plan the minibatches: per PPO epoch, a random partition of every micro-batch into M parts;
8. (called by the loop for each epoch and minibatch, one optimiser update each) clipped policy
   loss + value_coef * clipped value loss [+ alpha * CE on the labelled batch].

The critic (``ValueHead``) reads the decoder's last hidden states *detached* by default
(``ppo.critic: detached``): TRL's value head shares the trunk, so its loss trains the whole decoder,
and Adam makes ``value_coef`` nearly irrelevant: on the micro world the value loss alone moved the
translator about as far as full PPO. Its output layer starts at zero, so the first advantages are
reward-to-go rather than a random critic's noise; ``ppo.value_warmup_steps`` trains it alone first.

Steps 5-7 see the whole step (all processes and micro-steps) through ``gather``, so the updates do
not depend on how the step was split. Losses are token means over the minibatch (TRL's masked_mean)
written as contributions: summed over the minibatch's share in this micro-batch and divided by
the minibatch's global token count.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
from qeebm.methods.rl import (
    AdaptiveKLController,
    FixedKLController,
    explained_variance,
    gae,
    masked_moments,
    per_token_rewards,
    ppo_policy_loss,
    ppo_value_loss,
    sequence_kl,
    value_moments,
    whiten,
)
from qeebm.methods.sampling import Samples, mono_sources, replay, sample, sampling_config
from qeebm.translation.translator import eval_mode


@method_section("ppo", choices={"critic": ("detached", "shared")}, renamed={"alpha": "ce_weight"})
@dataclass
class PPOConfig:
    """PPO, the paper's actor-critic baseline (TRL's former seq2seq defaults, the values in
    qeebm/methods/rl.py). One optimiser step of the loop is one rollout of ``optim.batch_size`` source-only
    sentences x ``sampling.num_samples``, followed by ``epochs`` x ``minibatches`` optimiser updates over it;
    the published batch 20 / minibatch 4 / 2 epochs is ``optim.batch_size: 20``,
    ``ppo.minibatches: 5``, ``ppo.epochs: 2``. The learning-rate schedule advances once per rollout.

    Rollouts stop at </s>, ancestral sampling (TRL: top_k 0, top_p 1; other values are refused, a
    truncated sampler's probabilities are not the policy's), ``temperature`` applied to every
    log-prob. Reward: the QE score with guard hits penalised (``guards.penalty_unit``) at the last
    token, -kl_coef * (log p - log p_ref) at every token; the reference is the initial model (LoRA:
    the adapter disabled). ``adaptive_kl``: Ziegler et al.'s controller towards ``kl_target`` over
    ``kl_horizon`` samples, else kl_coef stays ``init_kl_coef``. Losses: clipped surrogate (``clip``)
    + ``value_coef`` * clipped value loss (``value_clip``) [+ ``ce_weight`` * CE on the labelled batch,
    off as published]. ``disable_dropout``: every PPO forward runs without dropout, so the first
    update's probability ratios are exactly 1.

    ``critic``: "detached" (default) trains the value head on the decoder's last hidden states with
    no gradient into the translator; "shared" is TRL's head, whose loss also trains the decoder. The
    head's output starts at 0. ``value_warmup_steps``: for the first so many optimiser steps only the
    value loss trains (the policy term has weight 0)."""

    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(num_samples=1))
    epochs: int = 2
    minibatches: int = 5
    critic: str = "detached"  # detached | shared
    value_warmup_steps: int = 0
    init_kl_coef: float = 0.2
    adaptive_kl: bool = True
    kl_target: float = 6.0
    kl_horizon: int = 10000
    gamma: float = 1.0
    lam: float = 0.95
    clip: float = 0.2
    value_clip: float = 0.2
    value_coef: float = 0.1
    whiten_advantages: bool = True
    disable_dropout: bool = True
    ce_weight: float = 0.0  # on the labelled batch
    guards: bool = True


@dataclass
class PPORollout:
    """One micro-batch's rollout: B = N * K samples (``samples``, methods/reinforce.py) of its N
    source-only sentences, and the labelled ``batch`` for the optional CE term.

    From ``rollout``: ``logp``, ``ref_logp``, ``values`` [B, T]: the policy's and the reference's
    log-probs of the sampled tokens and the value head's estimates, all 0 off ``samples.mask``;
    ``qe`` [B]: the QE's score; ``penalty`` [B]: the guards' penalty (0: no hit).
    From ``finish_rollouts``: ``scores`` [B], the reward model's score (QE with guard hits
    penalised); ``kl`` [B] (sum over tokens of logp - ref_logp), ``kl_coef``, ``token_rewards``,
    ``advantages``, ``returns`` [B, T] (0 off the mask); ``plan[e][m]``: the (sample rows, labelled
    rows) of minibatch m in PPO epoch e; ``norms`` [E, M, 3]: every minibatch's global (tokens,
    samples, label tokens); ``step_stats``: statistics of the whole step (explained variance of the
    critic, the spread of QE scores and rewards), logged as they are. ``terms``: each
    ``reward.terms`` term's scores [B] (empty without them).
    """

    batch: Batch
    samples: Samples
    logp: torch.Tensor
    ref_logp: torch.Tensor
    values: torch.Tensor
    qe: torch.Tensor
    penalty: torch.Tensor
    guards: GuardResult | None
    scores: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    kl_coef: float = 0.0
    token_rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    plan: list | None = None
    norms: torch.Tensor | None = None
    step_stats: dict[str, float] | None = None
    terms: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class PPOMinibatch:
    """This micro-batch's share of one minibatch: ``rows`` of ``rollout`` and ``labelled`` (a slice
    of the labelled batch whose ``global_tokens`` is the minibatch's, or None); ``tokens`` and
    ``samples``: the minibatch's global counts, the normalisers of its losses and metrics."""

    rollout: PPORollout
    rows: torch.Tensor
    labelled: Batch | None
    tokens: float
    samples: float


class PPO(Method):
    name = "ppo"
    section = "ppo"
    needs_mono = True

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        check_static_qe(cfg)
        c, s = cfg.ppo, cfg.ppo.sampling
        for key, value in (("sampling.num_samples", s.num_samples), ("epochs", c.epochs), ("minibatches", c.minibatches)):
            if value < 1:
                raise QeebmError(f"ppo.{key} must be at least 1; got {value}")
        if s.top_k != 0 or s.top_p != 1.0:
            # Ratios and the KL penalty need the probability the sampler drew each token with; a
            # truncated distribution's is not the policy's (TRL refuses these settings too).
            raise QeebmError(f"ppo samples from the full policy: ppo.sampling.top_k must be 0 and ppo.sampling.top_p "
                             f"1.0 (got {s.top_k} and {s.top_p}); ppo.sampling.temperature is applied to the log-probs")
        if s.temperature <= 0:
            raise QeebmError(f"ppo.sampling.temperature must be > 0; got {s.temperature}")
        if c.value_warmup_steps < 0:
            raise QeebmError(f"ppo.value_warmup_steps must be >= 0; got {c.value_warmup_steps}")

    @classmethod
    def check_micro_batch(cls, cfg: Config, size: int) -> None:
        # Step 7 partitions every micro-batch's samples into the minibatches: each needs one at least.
        samples = size * cfg.ppo.sampling.num_samples
        if samples < cfg.ppo.minibatches:
            raise QeebmError(f"ppo.minibatches={cfg.ppo.minibatches} partition each process's micro-batch, which "
                             f"would hold {samples} samples (optim.batch_size={cfg.optim.batch_size} / (processes x "
                             f"optim.grad_accum) sources x ppo.sampling.num_samples={cfg.ppo.sampling.num_samples})")

    def __init__(self, cfg: Config, translator, model: torch.nn.Module):
        self.cfg, self.c = cfg, cfg.ppo
        self.translator, self.model = translator, model
        # The loop runs epochs x minibatches optimiser updates over each rollout.
        self.epochs, self.minibatches = self.c.epochs, self.c.minibatches
        self.gen = sampling_config(self.c.sampling)
        self.reward = QEReward(cfg, translator, self.c.guards)
        self.needs_reference = self.reward.needs_reference
        self.label_smoothing = cfg.optim.label_smoothing  # of the CE term (alpha > 0), as SFT's
        # Value head: V(s_t) from the decoder's last hidden state at position t, which has seen the
        # tokens before t; trained by the loop's optimiser (extra_parameters), saved in state_dict.
        self.value_head = ValueHead(translator.model.config.d_model).to(translator.device)
        self.detach_critic = self.c.critic == "detached"
        c = self.c
        self.kl_ctl = (AdaptiveKLController(c.init_kl_coef, c.kl_target, c.kl_horizon) if c.adaptive_kl
                       else FixedKLController(c.init_kl_coef))
        # The initial model (common.InitialPolicy): with a fresh LoRA adapter, no copy.
        self.initial = InitialPolicy(translator)
        self.reference = self.initial.copy

    def extra_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.value_head.parameters())

    def frozen_qes(self) -> dict[str, torch.nn.Module]:
        return self.reward.frozen_qes()

    def state_dict(self) -> dict:
        return {"value_head": {k: v.detach().cpu() for k, v in self.value_head.state_dict().items()},
                "kl_ctl": self.kl_ctl.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        # In place: the optimiser holds these very parameters.
        self.value_head.load_state_dict(state["value_head"])
        self.kl_ctl.load_state_dict(state["kl_ctl"])

    # ------------------------------------------------------------------------------------------
    # Forward passes

    def reference_policy(self):
        """The initial policy, always without dropout: with LoRA the same module with its adapter
        disabled (peft), so the reference costs no memory; otherwise the frozen copy."""
        return self.initial()

    @contextlib.contextmanager
    def policy_mode(self, module):
        """Dropout off for every PPO forward (as TRL does), so old and new log-probs come from the same
        function and the first update's ratios are exactly 1."""
        with eval_mode(module, enabled=self.c.disable_dropout):
            yield

    def forward(self, module, s: Samples, rows=None, values: bool = True, entropy: bool = False):
        """Token log-probs [b, T] under the sampling distribution, values [b, T] (None if not asked)
        and, when asked, the policy's token entropy [b, T] (detached); all 0 off the mask."""
        logp, ent, out = replay(module, s, rows, hidden_states=values, entropy=entropy)
        if not values:
            return logp, None, ent
        mask = s.mask if rows is None else s.mask[rows]
        hidden = out.decoder_hidden_states[-1].float()
        v = self.value_head(hidden.detach() if self.detach_critic else hidden)  # [b, T]
        return logp, torch.where(mask, v, torch.zeros_like(v)), ent

    # ------------------------------------------------------------------------------------------
    # Rollout (no gradient)

    @torch.no_grad()
    def rollout(self, batch: Batch) -> PPORollout:
        # 1. Sample, stopping at </s>.
        s = sample(self.translator, mono_sources(batch), self.c.sampling.num_samples, self.gen)
        # 2. Score and guard.
        qe, penalty, guards, terms = self.reward(s.src, s.hyps, mono_references(batch, self.c.sampling.num_samples))
        # 3. Old log-probs and values of the policy (the unwrapped module: no gradient, no DDP);
        #    log-probs of the reference.
        policy = self.translator.model
        with self.policy_mode(policy):
            logp, values, _ = self.forward(policy, s)
        with self.reference_policy() as ref:
            ref_logp, _, _ = self.forward(ref, s, values=False)
        device = s.tokens.device
        return PPORollout(batch=batch, samples=s, logp=logp, ref_logp=ref_logp, values=values,
                          qe=qe.to(device), penalty=penalty.to(device), guards=guards, terms=terms)

    def finish_rollouts(self, rollouts: list[PPORollout], gather) -> list[PPORollout]:
        """Steps 4-7 over the whole step; ``gather(t)`` concatenates a 1-d tensor over processes."""
        c = self.c
        # 4. Rewards (guard hits penalised with the step's statistics), then per-token rewards with
        #    this step's KL coefficient.
        scores, step_qe = step_rewards([r.qe for r in rollouts], [r.penalty for r in rollouts],
                                       self.cfg.guards.penalty_unit, gather)
        for r, score in zip(rollouts, scores):
            r.scores = score
        step_scores = gather(torch.cat([r.scores for r in rollouts]))
        kl_coef = self.kl_ctl.value
        for r in rollouts:
            mask = r.samples.mask
            r.kl_coef = kl_coef
            r.kl = sequence_kl(r.logp, r.ref_logp, mask)  # [B]
            r.token_rewards = per_token_rewards(r.scores, r.logp, r.ref_logp, mask, kl_coef)  # [B, T]
        # 5. The controller sees the step's mean KL over all its samples (TRL passes the batch size).
        kl_all = gather(torch.cat([r.kl for r in rollouts]))
        self.kl_ctl.update(kl_all.mean().item(), kl_all.numel())
        # 6. GAE, then advantages whitened with the step's moments.
        for r in rollouts:
            r.advantages, r.returns = gae(r.token_rewards, r.values, r.samples.mask, c.gamma, c.lam)
        # How much of the returns the critic's values (as they were at the rollout) predict.
        moments = gather(torch.stack([value_moments(r.values, r.returns, r.samples.mask) for r in rollouts]).sum(0))
        step_stats = {"ppo/value_explained_var": explained_variance(moments.view(-1, 5).sum(0)),
                      "ppo/qe_std": step_qe.std().item() if step_qe.numel() > 1 else 0.0,
                      "ppo/reward_std": step_scores.std().item() if step_scores.numel() > 1 else 0.0,
                      **self.reward.step_means([r.terms for r in rollouts], gather)}
        for r in rollouts:
            r.step_stats = step_stats
        if c.whiten_advantages:
            local = torch.stack([masked_moments(r.advantages, r.samples.mask) for r in rollouts]).sum(0)  # [3]
            moments = gather(local).view(-1, 3).sum(0)
            for r in rollouts:
                r.advantages = whiten(r.advantages, r.samples.mask, moments=moments)
        # 7. Minibatch plan, and every minibatch's global token / sample / label-token counts.
        e_, m_ = self.epochs, self.minibatches
        device = rollouts[0].samples.tokens.device
        counts = torch.zeros(e_, m_, 3, dtype=torch.float64, device=device)
        for r in rollouts:
            b = r.samples.tokens.shape[0]
            if b < m_:
                raise QeebmError(f"ppo.minibatches={m_} but a micro-batch holds only {b} samples; lower "
                                 "ppo.minibatches or raise optim.batch_size (or ppo.sampling.num_samples)")
            labels = r.batch.labels if c.ce_weight > 0 else None
            r.plan = []
            for e in range(e_):
                rows = torch.randperm(b).to(device).tensor_split(m_)
                lab = (torch.randperm(labels.shape[0]).to(device).tensor_split(m_) if labels is not None
                       else [None] * m_)
                r.plan.append(list(zip(rows, lab)))
                for m, (rw, lb) in enumerate(r.plan[-1]):
                    counts[e, m, 0] += r.samples.mask[rw].sum()
                    counts[e, m, 1] += len(rw)
                    if lb is not None:
                        counts[e, m, 2] += (labels[lb] != -100).sum()
        norms = gather(counts.flatten()).view(-1, e_, m_, 3).sum(0)
        for r in rollouts:
            r.norms = norms
        return rollouts

    def minibatch(self, r: PPORollout, epoch: int, index: int) -> PPOMinibatch:
        rows, lab = r.plan[epoch][index]
        tokens, samples, label_tokens = r.norms[epoch, index].tolist()
        labelled = None
        if lab is not None and len(lab) > 0:
            b, keep = r.batch, lab.tolist()
            labelled = dataclasses.replace(
                b, src=[b.src[i] for i in keep], tgt=[b.tgt[i] for i in keep] if b.tgt is not None else None,
                input_ids=b.input_ids[lab], attention_mask=b.attention_mask[lab], labels=b.labels[lab],
                decoder_input_ids=b.decoder_input_ids[lab],
                global_tokens=int(label_tokens))
        return PPOMinibatch(rollout=r, rows=rows, labelled=labelled, tokens=tokens, samples=samples)

    # ------------------------------------------------------------------------------------------
    # Loss of one minibatch share

    def loss(self, mb: PPOMinibatch) -> StepOutput:
        c, r, rows = self.c, mb.rollout, mb.rows
        mask = r.samples.mask[rows]  # [b, T]
        # 8. Clipped surrogate and clipped value loss, token means over the minibatch. While the
        #    critic warms up (ppo.value_warmup_steps), the policy term is kept at weight 0.
        with self.policy_mode(self.model):
            logp, values, entropy = self.forward(self.model, r.samples, rows, entropy=True)
        pg, stats = ppo_policy_loss(logp, r.logp[rows], r.advantages[rows], mask, c.clip, normaliser=mb.tokens)
        vf, vstats = ppo_value_loss(values, r.values[rows], r.returns[rows], mask, c.value_clip, normaliser=mb.tokens)
        policy_weight = 0.0 if r.batch.step <= c.value_warmup_steps else 1.0
        terms = {"policy": policy_weight * pg, "value": c.value_coef * vf}
        n = mb.samples
        kl = r.kl[rows]
        metrics = {
            "ppo/policy_loss": pg.item(),
            "ppo/value_loss": vf.item(),
            "ppo/clipfrac": stats["clipfrac"].item(),
            "ppo/approx_kl": stats["approx_kl"].item(),
            "ppo/ratio": stats["ratio_mean"].item(),
            "ppo/vf_clipfrac": vstats["vf_clipfrac"].item(),
            "ppo/entropy": entropy.sum().item() / mb.tokens,
            # Rollout statistics (per sample): the same in every epoch.
            "ppo/kl": kl.sum().item() / n,
            "ppo/score": r.scores[rows].sum().item() / n,
            "ppo/qe": r.qe[rows].sum().item() / n,
            "ppo/guard_penalty": (r.qe[rows] - r.scores[rows]).sum().item() / n,
            "ppo/reward": (r.scores[rows] - r.kl_coef * kl).sum().item() / n,
            "ppo/sample_len": mask.sum().item() / n,
        }
        if mb.labelled is not None:
            ce, nll = label_smoothed_ce(self.model, mb.labelled, self.label_smoothing, with_nll=True)
            terms["ce"] = c.ce_weight * ce
            metrics |= {"ppo/ce": ce.item(), "ppo/nll": nll.item()}
        if r.guards is not None:
            keep = rows.tolist()
            part = GuardResult(penalty=[r.guards.penalty[i] for i in keep],
                               hits={k: [v[i] for i in keep] for k, v in r.guards.hits.items()})
            metrics |= hit_rates(part, normaliser=n)
        return StepOutput(loss=sum(terms.values()), metrics=metrics, terms=terms,
                          values={"ppo/kl_coef": r.kl_coef, **r.step_stats})


class ValueHead(torch.nn.Module):
    """V(s_t) [b, T] from decoder states [b, T, d]: a one-hidden-layer MLP whose output layer starts
    at zero, so every first estimate is 0 and the first advantages are the rewards' own."""

    def __init__(self, d_model: int):
        super().__init__()
        self.hidden = torch.nn.Linear(d_model, d_model)
        self.out = torch.nn.Linear(d_model, 1)
        torch.nn.init.zeros_(self.out.weight)
        torch.nn.init.zeros_(self.out.bias)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(states))).squeeze(-1)
