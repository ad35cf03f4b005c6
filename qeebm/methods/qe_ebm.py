"""QE-EBM: a quality estimator's negated score as an energy loss on the translator's own samples.

The method (docs/method.md; Yoo & Lee, arXiv 2410.10228), per micro-batch:

1. rollout, no gradient: K samples per source of the source-only batch (``Batch.mono``) with
   ``Translator.generate_ids``. The emitted tokens are the translations; nothing re-takes an argmax
   (the reference code scored the teacher-forced argmax, which can differ from the sample).
2. loss: the teacher-forced logits of the model being trained on those samples go through the
   relaxation into CometKiwi (``KiwiEnergy``), E(x, y_k) = -QE(x, y_k); with the labelled batch's
   label-smoothed cross-entropy, L = alpha * CE + beta * mean_k E (``schedule``).

``qe_ebm.estimator`` says how the energy's gradient is formed (docs/method.md, "Gradient
estimators"): a relaxation's backward pass through the QE (st, softmax, gumbel-st, reinmax), or
"loo-cv", the unbiased score-function estimator whose control variate is the QE's gradient at the
source's other samples (``qeebm.methods.control_variate``). Under loo-cv the rollout takes each
sample's exact score and the QE's gradient with respect to its tokens (one QE forward and backward
per sample, as straight-through spends), and the loss replays the samples without dropout, as they
were drawn; the energy's value is the same mean of -QE in every case.

QE-dynamic also trains the QE (``qeebm.qe.dynamic.DynamicQE``): once per optimiser step, before its
micro-steps (``before_step``), one update of the selected QE parts with the translator frozen, on the
step's labelled batch: the reference against K fresh samples, NCE with the translator as noise
distribution or a margin ranking. The QE never
gets a gradient from the translator's loss: its parameters require grad only inside that update, and
they are in no optimiser but the method's own. Each update logs how often the reference beats its
samples (by the loss's logit and by the QE score), and with ``qe.heldout_path`` the QE's correlation
with the true quality of judged held-out rows is logged every ``qe.heldout_every`` updates: a falling
loss alone can mean the QE learnt "everything is noise", not quality.

Normalisation (docs/design.md): each returned loss and metric is this micro-batch's contribution to
the step's global mean: CE over the step's label tokens, energies and sample statistics over the
step's global_mono * K samples, the QE loss over its terms in the whole step.

Several processes: the loop wraps the translator in DDP; the QE is not wrapped. Its gradients are
summed over processes with the ``all_reduce`` the loop hands to ``before_step`` (every process's loss
is its contribution to the global mean, so the sum is the full-batch gradient), and every process
starts from the same QE (the checkpoint, and LoRA adapters drawn from ``cfg.seed`` in a forked RNG),
so all processes apply the same update and hold the same QE after every step.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F

from qeebm.config import Config, SamplingConfig, method_section
from qeebm.errors import QeebmError
from qeebm.guards import check, hit_rates
from qeebm.methods.base import Batch, Method, StepOutput
from qeebm.methods.common import label_smoothed_ce, mono_references, upcast
from qeebm.methods.control_variate import CvWeight, control_terms, leave_one_out, surrogate
from qeebm.methods.diagnostics import grad_dot, grad_norm, gradient_stats, term_gradients, with_known_gradient
from qeebm.methods.rl import policy_logits, sequence_logprobs
from qeebm.methods.sampling import mono_sources, sample, sampling_config
from qeebm.qe.dynamic import DynamicQE, heldout_path
from qeebm.qe.dynamic import check_config as check_qe_config
from qeebm.qe.energy import load_energy
from qeebm.translation.translator import eval_mode, output_rows


@method_section("qe_ebm", choices={"estimator": ("st", "softmax", "gumbel-st", "reinmax", "loo-cv"),
                                  "weighting": ("absolute", "relative")},
                renamed={"relaxation": "estimator", "beta_max": "energy_weight", "beta_ramp_steps": "energy_ramp_steps",
                         "alpha_coupling": "ce_coupling", "alpha": "ce_weight"})
@dataclass
class QeEbmConfig:
    """QE-EBM on the translator: loss = alpha * CE(labelled) + beta * mean_k E(x, y_k) over a
    source-only batch (``data.mono``, the same global size as ``optim.batch_size``), E = -QE.

    ``sampling``: K samples per source (``sampling.num_samples``), ancestral by default.
    ``estimator``: how the QE's gradient reaches the translator (docs/method.md, "Gradient
    estimators"): through a relaxation of the sampled tokens, "st" (straight-through), "softmax"
    (expected embedding), "gumbel-st" (straight-through Gumbel-softmax at ``tau``) or "reinmax"
    (straight-through's forward with ReinMax's second-order backward at ``tau``, Liu et al. 2023);
    or "loo-cv": the unbiased score-function estimator with a leave-one-out baseline and the QE's
    gradient at the source's other samples as a control variate, weighted by ``cv_weight`` (None:
    the variance-minimising weight fitted on the previous step, starting at 1). The old key name
    ``relaxation`` still works.
    ``weighting: absolute`` (the published schedule) at optimiser step s (counted from 1):
    beta = ``energy_weight`` * min(1, s / ``energy_ramp_steps``) (``energy_ramp_steps`` 0: the full weight
    throughout); alpha = ``ce_weight`` when set, else max(0, 1 - ``ce_coupling`` * beta). alpha and
    beta are the paper's names, logged as ``qe-ebm/alpha`` and ``qe-ebm/beta``. The defaults are the
    published ramp: beta reaches 0.001 at step 4000, alpha ends at 0.99.

    ``weighting: relative``: beta is chosen so that the energy's gradient is ``rho`` times the CE's,
    ramped the same way: beta = rho * min(1, s / energy_ramp_steps) * alpha * |grad CE| / |grad E|, with
    alpha = ``ce_weight`` when set, else 1. The two gradient norms (over the trainable parameters) are
    measured on the first micro-batch of every ``rho_every``-th step (1: every step, the exact ratio
    when there is one micro-batch and one process; averaged over processes) and reused in between.
    rho = 0.1 means "the energy moves the model a tenth as hard as the supervised loss", whatever
    the QE's score scale. A measurement costs no extra backward pass: the step's backward reuses the
    two measured gradients (``diagnostics.with_known_gradient``).

    ``guards`` (off by default, as published): samples that trip a reward-hacking guard
    (``guards``, qeebm/guards.py: empty, source copy, length ratio, repetition, script) carry no
    energy, so the gradient cannot follow a QE that overrates them; their rate is logged as
    ``guard/*``. The RL baselines rank such samples last; a guard has no gradient, so dropping them
    is what QE-EBM can do with the same test."""

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    estimator: str = "st"  # st | softmax | gumbel-st | reinmax | loo-cv
    tau: float = 1.0
    cv_weight: Optional[float] = None
    energy_weight: float = 0.001
    energy_ramp_steps: int = 4000
    ce_weight: Optional[float] = None
    ce_coupling: float = 10.0
    weighting: str = "absolute"  # absolute | relative
    rho: float = 0.1
    rho_every: int = 1
    guards: bool = False

if TYPE_CHECKING:
    from qeebm.qe.bridge import Alignment

log = logging.getLogger(__name__)



def ramp(step: int, c: QeEbmConfig) -> float:
    """The energy weight's warm-up factor at optimiser step ``step`` (counted from 1), in [0, 1]."""
    return min(1.0, step / c.energy_ramp_steps) if c.energy_ramp_steps > 0 else 1.0


def schedule(step: int, c: QeEbmConfig) -> tuple[float, float]:
    """(alpha, beta) at optimiser step ``step`` under ``weighting: absolute``. Under ``relative`` the
    alpha is the same rule's and beta is chosen in ``QeEbm.loss`` from measured gradient norms."""
    if c.weighting == "relative":
        return (c.ce_weight if c.ce_weight is not None else 1.0), 0.0
    # Reference code: beta = min(1, step / 4000) * 0.001, alpha = 1 - 10 * beta, floored at 0 as the
    # reference floors it (without the floor, energy_weight > 1 / ce_coupling maximises the CE).
    beta = c.energy_weight * ramp(step, c)
    alpha = c.ce_weight if c.ce_weight is not None else max(0.0, 1.0 - c.ce_coupling * beta)
    return alpha, beta


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()


@dataclass
class QeEbmRollout:
    """What ``loss`` needs. M source-only sentences with K samples each, rows of one source adjacent.

    batch:             the labelled micro-batch (the CE term).
    src:               M*K source strings (each repeated K times).
    input_ids, attention_mask: ``[M*K, S]`` the sources, repeated.
    decoder_input_ids: ``[M*K, T]`` teacher-forcing inputs replaying the samples (``</s>``, code, ...).
    mt_ids:            ``[M*K, T]`` the emitted tokens (code, tokens, ``</s>``, padding).
    mt_mask:           ``[M*K, T]`` True up to and including the first ``</s>``.
    alpha, beta:       this step's weights (beta is set in ``loss`` under relative weighting).
    normaliser:        samples in the whole step, ``global_mono * K``.
    stats:             sample statistics, already contributions.
    alignment:         the bridge's alignment of (mt_ids, mt_mask), reused by the energy.
    scores:            ``[M*K]`` exact QE scores of the samples when the estimator's forward value is
                       not (softmax, gumbel-st, loo-cv); None under st and reinmax, whose energy is the
                       exact score.
    keep:              ``[M*K]`` 1.0 for the samples whose energy counts, 0.0 for guard hits
                       (``qe_ebm.guards``); None without guards.
    ref:               M*K references (each repeated K times) for a reference-based energy, else None.
    actions:           ``[M*K, T]`` the policy's actions (``Samples.mask``); loo-cv only.
    temperature, suppress: what the sampler did to the logits (``Samples``); loo-cv only.
    token_grads:       ``[M*K, T, H]`` the QE's gradient with respect to each step's bridged embedding,
                       averaged over the source's other samples (guard hits count as 0); loo-cv only.
    """

    batch: Batch
    src: list[str]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    decoder_input_ids: torch.Tensor
    mt_ids: torch.Tensor
    mt_mask: torch.Tensor
    alpha: float
    beta: float
    normaliser: int
    stats: dict[str, float]
    alignment: Alignment | None = None
    scores: torch.Tensor | None = None
    keep: torch.Tensor | None = None
    ref: list[str] | None = None
    actions: torch.Tensor | None = None
    temperature: float = 1.0
    suppress: torch.Tensor | None = None
    token_grads: torch.Tensor | None = None


class QeEbm(Method):
    name = "qe-ebm"
    section = "qe_ebm"
    needs_mono = True

    def __init__(self, cfg: Config, translator, model: torch.nn.Module):
        # check_config ran in the loop before anything was loaded.
        self.c, self.q = cfg.qe_ebm, cfg.qe
        self.translator, self.model = translator, model
        self.label_smoothing = cfg.optim.label_smoothing
        self.guards, self.langs = cfg.guards, (cfg.model.src_lang, cfg.model.tgt_lang)
        self.k = self.c.sampling.num_samples
        # top_k 0 / top_p 1 / temperature 1: pure ancestral sampling, as the reference code sampled.
        self.gen = sampling_config(self.c.sampling)
        self.dynamic = self.q.mode == "dynamic"
        self.energy = load_energy(self.q.path, translator, freeze=not self.dynamic,
                                  gradient_checkpointing=self.q.gradient_checkpointing)
        self.qe = self.energy.qe
        # A reference-based energy (COMET, XCOMET) reads each pool sentence's reference.
        self.needs_reference = self.energy.needs_reference
        # QE-dynamic: the QE's own training (qe/dynamic.py); its parts exist before the move to the device.
        self.dynamic_qe = DynamicQE(self.qe, self.q, cfg.seed, cfg.logging.every) if self.dynamic else None
        self.energy.to(translator.device)
        # Relative weighting: |grad CE| / |grad E| of the last measurement, and its step.
        self.grad_ratio: float | None = None
        self.ratio_step = 0
        # loo-cv: the control variate's weight, fitted on the previous step unless fixed.
        self.cv = CvWeight(fixed=self.c.cv_weight) if self.c.estimator == "loo-cv" else None
        if heldout_path(self.q) and not self.dynamic:
            log.warning("qe.heldout_path is only measured with qe.mode=dynamic (a static QE does not change)")
        c = self.c
        if c.weighting == "absolute" and c.ce_weight is None and c.ce_coupling * c.energy_weight > 1:
            floor = math.ceil(c.energy_ramp_steps / (c.ce_coupling * c.energy_weight)) if c.energy_ramp_steps else 1
            log.warning("qe_ebm: alpha = 1 - %g * beta reaches 0 at step %d and stays there (energy_weight %g): "
                        "the CE term is off from then on", c.ce_coupling, floor, c.energy_weight)
        log.info("QE %s (%s): %d trainable parameters%s", self.q.path, self.q.mode,
                 sum(p.numel() for p in self.dynamic_qe.params.values()) if self.dynamic else 0,
                 f" ({', '.join(self.q.train_parts)}; updated every {self.q.interval} step(s) after step {self.q.warmup_steps})"
                 if self.dynamic else "")

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        c, q = cfg.qe_ebm, cfg.qe
        for key, value, low in (("qe_ebm.sampling.num_samples", c.sampling.num_samples, 1),
                                ("qe_ebm.sampling.max_new_tokens", c.sampling.max_new_tokens, 1),
                                ("qe_ebm.energy_ramp_steps", c.energy_ramp_steps, 0)):
            if value < low:
                raise QeebmError(f"config key '{key}' must be >= {low}; got {value}")
        if c.tau <= 0:
            raise QeebmError(f"config key 'qe_ebm.tau' must be > 0; got {c.tau}")
        if c.estimator == "loo-cv":
            s = c.sampling
            if s.num_samples < 2:
                raise QeebmError("qe_ebm.estimator=loo-cv leaves one sample out: it needs "
                                 f"qe_ebm.sampling.num_samples >= 2; got {s.num_samples}")
            if s.top_k != 0 or s.top_p != 1.0:
                raise QeebmError("qe_ebm.estimator=loo-cv is unbiased for the distribution the samples are "
                                 "drawn from; a truncated sampler (qe_ebm.sampling.top_k / top_p) is not the "
                                 f"translator's distribution: set top_k 0 and top_p 1 (got {s.top_k}, {s.top_p})")
        if q.path == "chrf":
            raise QeebmError("qe.path 'chrf' is a reward without a gradient; QE-EBM backpropagates through a QE model "
                             "(a CometKiwi, or a reference-based COMET or XCOMET)")
        terms = cfg.reward.terms
        if len(terms) > 1 or (terms and (terms[0].path != q.path or terms[0].weight != 1.0)):
            raise QeebmError("config key 'reward.terms': QE-EBM's energy is a gradient through one QE, qe.path; a "
                             "composite reward is for reinforce, ppo, grpo, dpo, cpo and qe-finetune (one term may only "
                             f"restate qe.path with weight 1; got {len(terms)} term(s))")
        if c.weighting == "relative":
            if c.rho < 0 or c.rho_every < 1:
                raise QeebmError(f"qe_ebm.weighting=relative needs qe_ebm.rho >= 0 and qe_ebm.rho_every >= 1; "
                                 f"got {c.rho} and {c.rho_every}")
            if c.ce_weight is not None and c.ce_weight <= 0:
                raise QeebmError("qe_ebm.weighting=relative sets the energy's weight relative to the CE term's "
                                 f"gradient, so qe_ebm.ce_weight must be > 0; got {c.ce_weight} (for energy only, use "
                                 "weighting=absolute with alpha=0)")
        check_qe_config(q)

    # ------------------------------------------------------------------------------ NMT phase
    @torch.no_grad()
    def rollout(self, batch: Batch) -> QeEbmRollout:
        if batch.labels is None:
            raise QeebmError("method 'qe-ebm' needs target sentences for its CE term; the training corpus has none")
        mono = mono_sources(batch)
        tr, k = self.translator, self.k
        alpha, beta = schedule(batch.step, self.c)
        drawn = sample(tr, mono, k, self.gen, decode=False)  # M*K rows, the K samples of a source adjacent
        # The QE reads every emitted token up to the first </s>, the forced language code included.
        mt_ids, mt_mask = drawn.tokens, tr.teacher_forcing(drawn.sequences)["labels"] != -100  # [M*K, T]
        src, ref = drawn.src, mono_references(batch, k) if self.needs_reference else None
        # Aligned once: the texts, the sample score and the energy's forward (but gumbel-st's) share it.
        alignment = self.energy.align(mt_ids, mt_mask)
        texts = alignment.texts
        norm = batch.global_mono * k
        stats = {
            "qe-ebm/len_ratio": sum(len(t) / max(1, len(s)) for t, s in zip(texts, src)) / norm,
            "qe-ebm/empty_rate": sum(not t.strip() for t in texts) / norm,
            "qe-ebm/copy_rate": sum(bool(t.strip()) and _same_text(t, s) for t, s in zip(texts, src)) / norm,
        }
        keep = None
        if self.c.guards:
            hits = check(list(src), list(texts), self.guards, tgt_lang=self.langs[1], src_lang=self.langs[0],
                         count_tokens=tr.num_tokens)
            stats |= hit_rates(hits, normaliser=norm)
            keep = torch.tensor([0.0 if hit else 1.0 for hit in hits.any_hit], device=mt_ids.device)
        r = QeEbmRollout(batch=batch, src=src, input_ids=drawn.input_ids, attention_mask=drawn.attention_mask,
                         decoder_input_ids=drawn.decoder_input_ids, mt_ids=mt_ids, mt_mask=mt_mask,
                         alpha=alpha, beta=beta, normaliser=norm, stats=stats, alignment=alignment, keep=keep, ref=ref)
        estimator = self.c.estimator
        if estimator == "loo-cv":
            r.scores, grads = self.energy.token_gradients(src, mt_ids, mt_mask, alignment=alignment, ref=ref)
            if keep is not None:
                grads = grads * keep[:, None, None].to(grads.dtype)
            r.token_grads = leave_one_out(grads, k)
            r.actions, r.temperature, r.suppress = drawn.mask, drawn.temperature, drawn.suppress
        elif estimator not in ("st", "reinmax"):
            # Only the straight-through forward value is the exact score of the emitted text.
            r.scores = self.energy.score_ids(src, mt_ids, mt_mask, alignment=alignment, ref=ref)
        return r

    def loss(self, r: QeEbmRollout) -> StepOutput:
        b = r.batch
        values = {}
        if self.cv is not None:
            energy, e, values = self.control_variate_energy(r)
        else:
            # decoder_input_ids replay the samples; labels alone would make mBART rotate a cut-off row.
            # Projected onto the vocabulary only at the steps the energy reads.
            content = self.energy.bridge.content_mask(r.mt_ids, r.mt_mask)
            with output_rows(self.translator.model, content):
                tf_logits = self.model(input_ids=r.input_ids, attention_mask=r.attention_mask,
                                       decoder_input_ids=r.decoder_input_ids).logits  # [N, V]
            energy = self.energy(r.src, r.mt_ids, r.mt_mask, upcast(tf_logits), relaxation=self.c.estimator,
                                 tau=self.c.tau, alignment=r.alignment, ref=r.ref)  # [M*K]
            e = (energy if r.keep is None else energy * r.keep).sum() / r.normaliser
        alpha, beta = r.alpha, r.beta
        terms = {}
        metrics = {"qe-ebm/energy": e.item(), **r.stats}
        measured = stats = None
        if alpha > 0:
            # The CE term exactly as method 'sft' computes it, so beta = 0 is SFT bit for bit.
            ce, _ = label_smoothed_ce(self.model, b, self.label_smoothing, upcast=upcast)
            metrics["qe-ebm/ce"] = ce.item()
            if self.c.weighting == "relative":
                beta, measured = self.relative_beta(b.step, alpha, ce, e)
            terms["ce"] = alpha * ce
        terms["energy"] = beta * e
        loss = sum(terms.values())
        if measured is not None:
            # Both terms' gradients are in hand: the step's backward takes their weighted sum, not a
            # second pass through the QE and the translator.
            params, g_ce, g_e, ce_norm, e_norm = measured
            # The loop's gradient diagnostics of the weighted terms, from the same gradients (before
            # they are combined): only their dot product is new.
            stats = gradient_stats({"ce": alpha * ce_norm, "energy": beta * e_norm},
                                   {"energy": alpha * beta * grad_dot(g_e, g_ce)})
            for a, g in zip(g_ce, g_e):
                a.mul_(alpha).add_(g, alpha=beta)
            loss = with_known_gradient(loss, params, g_ce)
        # The samples' exact QE scores: their mean, and their spread within a source (the signal a
        # gradient or a leave-one-out baseline can use), a mean over the step's sources.
        scores = (-energy.detach() if r.scores is None else r.scores).double().view(-1, self.k)  # [M, K]
        metrics["qe-ebm/sample_score"] = scores.sum().item() / r.normaliser
        if self.k > 1:
            metrics["qe-ebm/score_spread"] = scores.std(dim=1).sum().item() * self.k / r.normaliser
        return StepOutput(loss=loss, metrics=metrics, terms=terms,
                          values={"qe-ebm/alpha": alpha, "qe-ebm/beta": beta, **values}, gradient_stats=stats)

    def control_variate_energy(self, r: QeEbmRollout) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """loo-cv: the energies ``[M*K]`` (-QE, constants), this micro-batch's contribution to the
        mean energy, whose value is the exact one and whose gradient is the control-variate
        estimate of grad E[-QE] (``control_variate.surrogate``), and the step's values."""
        step = r.batch.step
        eta = self.cv.current(step)
        # Dropout off and the sampler's own distribution (temperature, suppressed ids): the score
        # function must be that of the distribution the samples came from.
        with eval_mode(self.model):
            logits = self.model(input_ids=r.input_ids, attention_mask=r.attention_mask,
                                decoder_input_ids=r.decoder_input_ids).logits  # [R, T, V]
        logits = policy_logits(upcast(logits), r.temperature, r.suppress)
        logp, _ = sequence_logprobs(logits, r.mt_ids, r.actions)  # [R, T]
        content = self.energy.bridge.content_mask(r.mt_ids, r.mt_mask) & r.actions.bool()
        with torch.no_grad():
            table = self.energy.bridge_table()  # [V, H]
        expected, taken = control_terms(logits, r.mt_ids, content, r.token_grads, table)  # [R, T]
        f = -self.energy_of(r)
        s = surrogate(logp, r.actions.bool(), expected, taken, content, f, self.k, eta)
        sums = s.sums
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # Every process fits the next weight on the whole step's sums (and saves the same state).
            sums = sums.to(logits.device)
            torch.distributed.all_reduce(sums)
        self.cv.add(step, sums.cpu())
        e = (-f.sum() - s.value + s.value.detach()) / r.normaliser
        return -f, e, {"qe-ebm/cv_weight": eta, "qe-ebm/cv_explained": self.cv.explained_last}

    @staticmethod
    def energy_of(r: QeEbmRollout) -> torch.Tensor:
        """``[M*K]`` the exact energies of the samples, guard hits 0 (loo-cv's f is minus these)."""
        energy = -r.scores.float()
        return energy if r.keep is None else energy * r.keep.to(energy.dtype)

    def relative_beta(self, step: int, alpha: float, ce: torch.Tensor, e: torch.Tensor):
        """beta = rho * ramp * alpha * |grad CE| / |grad E| (``weighting: relative``), the norms
        measured on this micro-batch when a measurement is due, else the last measurement's.

        Returns beta and, when it measured, ``(params, grad CE, grad E, |grad CE|, |grad E|)`` (this
        process's gradients and norms; graphs kept, ``.grad`` untouched), else None."""
        c = self.c
        due = self.grad_ratio is None or (step != self.ratio_step and (step - 1) % c.rho_every == 0)
        measured = None
        if due:
            params = [p for p in self.model.parameters() if p.requires_grad]
            grads = term_gradients({"ce": ce, "energy": e}, params)
            local = [grad_norm(grads["ce"]), grad_norm(grads["energy"])]
            measured = (params, grads["ce"], grads["energy"], *local)
            norms = torch.tensor(local, dtype=torch.float64)
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                # Every process must use the same beta (and save the same state).
                torch.distributed.all_reduce(norms)
            ce_norm, e_norm = norms.tolist()
            self.grad_ratio = ce_norm / e_norm if e_norm > 0 else 0.0
            self.ratio_step = step
        return c.rho * ramp(step, c) * alpha * self.grad_ratio, measured

    # ------------------------------------------------------------------------------- QE phase
    def before_step(self, batches: list[Batch], all_reduce) -> dict[str, float]:
        """QE-dynamic: one QE update on the step's labelled micro-batches, translator frozen; then,
        when due, the updated QE's correlation with the held-out rows' true quality.

        Gradients of every micro-batch are summed, then over processes by ``all_reduce``, so the
        update is the full-batch one and the same on every process."""
        if not batches or not self.dynamic:
            return {}
        step, dqe = batches[0].step, self.dynamic_qe
        metrics = dqe.update((self.qe_loss(b) for b in batches), all_reduce) if dqe.update_due(step) else {}
        if dqe.heldout_due(step):
            metrics |= dqe.measure_heldout(step)
        return metrics

    def qe_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """This micro-batch's contribution to the QE loss of the step: its references against K
        fresh samples, with the translator's log-probabilities of both as NCE's noise term."""
        if batch.labels is None or batch.tgt is None:
            raise QeebmError("qe.mode=dynamic trains the QE on references; the training corpus has none")
        tr = self.translator
        with torch.no_grad():
            drawn = sample(tr, batch.src, self.k, self.gen, decode=False,
                           enc={"input_ids": batch.input_ids, "attention_mask": batch.attention_mask})  # N*K rows
            tf = tr.teacher_forcing(drawn.sequences)
            samples = self.energy.texts(drawn.tokens, tf["labels"] != -100)  # the texts the QE sees
            # log pbar: the noise distribution's (translator's) smoothed mean token log-probability.
            logp_ref = self.mean_logprob(batch.input_ids, batch.attention_mask, batch.labels, batch.decoder_input_ids)  # [N]
            logp_smp = self.mean_logprob(drawn.input_ids, drawn.attention_mask, tf["labels"], tf["decoder_input_ids"])  # [N*K]
        return self.dynamic_qe.loss(list(batch.src), list(batch.tgt), drawn.src, samples, logp_ref, logp_smp,
                                    self.k, batch.global_examples)

    def mean_logprob(self, input_ids, attention_mask, labels, decoder_input_ids) -> torch.Tensor:
        """``[B]`` label-smoothed mean token log-probability of ``labels`` under the translator (eval
        mode, like the sampler)."""
        with eval_mode(self.translator.model) as model:
            logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        nll = F.cross_entropy(upcast(logits).transpose(1, 2), labels, ignore_index=-100,
                              label_smoothing=self.q.label_smoothing, reduction="none")  # [B, T]
        return -nll.sum(1) / (labels != -100).sum(1).clamp(min=1)

    # ------------------------------------------------------------------------------- helpers
    def frozen_qes(self) -> dict[str, torch.nn.Module]:
        """QE-static's energy QE (QE-dynamic's changes, so validation loads the checkpoint's)."""
        return {} if self.dynamic else {self.q.path: self.qe}

    def state_dict(self) -> dict:
        """The last gradient-norm ratio (relative weighting); QE-dynamic: the trainable QE parameters
        and the QE optimiser."""
        state = {"grad_ratio": self.grad_ratio, "ratio_step": self.ratio_step}
        if self.cv is not None:
            state["cv_weight"] = self.cv.state_dict()
        return (state | self.dynamic_qe.state_dict()) if self.dynamic else state

    def step_snapshot(self):
        # QE-dynamic's step starts with the QE's own update: putting it back would copy the QE and
        # its optimiser at every step, so its steps run to their end.
        return None if self.dynamic else super().step_snapshot()

    def load_state_dict(self, state: dict) -> None:
        self.grad_ratio, self.ratio_step = state.get("grad_ratio"), state.get("ratio_step", 0)
        if self.cv is not None and "cv_weight" in state:
            self.cv.load_state_dict(state["cv_weight"])
        if self.dynamic:
            self.dynamic_qe.load_state_dict(state)
