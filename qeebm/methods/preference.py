"""Preference optimisation on QE-ranked candidates: DPO (Rafailov et al. 2023, "Direct Preference
Optimization") and CPO (Xu et al. 2024, "Contrastive Preference Optimization", the ALMA-R recipe).

Let a QE pick the best and the worst of a source's translations and train on the pair: since ALMA-R
the QE-driven training MT users reach for first. DPO and CPO share everything here but the loss,
and run in the loop, budget and protocol of every other method. Per optimiser step:

1. (``before_step``) the teacher (``common.Teacher``, as QE finetuning's) is refreshed every
   ``preference.refresh_every`` steps; with 0 it stays the initial model: offline preference data;
2. (``rollout``) the teacher translates every source of ``preference.pool`` into N candidates (beam
   N-best or samples); with ``include_reference`` a labelled source's reference joins them (CPO's
   triplets). The reward (``common.QEReward``: ``qe.path`` or ``reward.terms``) scores them and the
   guards check them.
   Chosen = the best candidate that trips no guard; rejected = the worst, a guard-tripping one
   ranking below every clean one (``preference_pair``). A source without a preference (every
   candidate trips a guard; or chosen and rejected are the same text, or score the same and
   neither trips) keeps its rows in the forward passes with weight 0, so every process runs the same
   graph, and trains nothing; it is counted (``<method>/skipped_guarded``, ``skipped_tie`` and the
   run's ``skipped_total``). DPO also takes the reference model's log-probs of both: the initial
   translator (``common.InitialPolicy``: a frozen copy, or with LoRA the adapter disabled), or with
   ``preference.reference: teacher`` the teacher (iterative DPO);
3. (``finish_rollouts``) the step's pair and chosen-token counts over every micro-batch and process,
   the normalisers of the means in 4;
4. (``loss``) alpha * CE(labelled batch) + the preference loss, a mean over the step's pairs
   [+ nll_weight * NLL of the chosen translations, a token mean: CPO's term].

A sequence's log-prob is the translator's own distribution (no temperature, no suppressed tokens:
a reference or a beam candidate was never sampled) summed over the target's tokens up to and
including </s>, without the forced language code, with dropout off (TRL's ``disable_dropout``
default): at the first step a DPO policy equals its reference exactly and each pair's loss is log 2.
Pairs are texts, tokenised as a target (as TRL's are): a candidate cut off at ``max_new_tokens``
gains the </s> its generation never emitted.

DPO: -log sigmoid(beta * ((log pi(c) - log pi(r)) - (log pi_ref(c) - log pi_ref(r)))), implicit
reward beta * (log pi - log pi_ref). CPO: -log sigmoid(beta * (log pi(c) - log pi(r))), implicit
reward beta * log pi. Both are TRL's sigmoid losses (tests/integration/test_preference.py checks them against
TRL 0.23.1). docs/method.md says what differs from TRL and ALMA-R.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from qeebm.config import Config, GenerationConfig, method_section
from qeebm.errors import QeebmError
from qeebm.guards import GuardResult, hit_rates
from qeebm.methods.base import Batch, Method, StepOutput
from qeebm.methods.common import CandidatesConfig, InitialPolicy, QEReward, Teacher, check_static_qe, label_smoothed_ce
from qeebm.methods.rl import sequence_logprobs
from qeebm.methods.sampling import mono_sources
from qeebm.translation.qad import candidate_generation
from qeebm.translation.translator import eval_mode


@method_section("preference", choices={"pool": ("mono", "labelled", "both"), "candidates": ("beam", "sample"),
                                      "reference": ("initial", "teacher")},
                renamed={"alpha": "ce_weight"})
@dataclass
class PreferenceConfig(CandidatesConfig):
    """Preference optimisation on QE-ranked candidates, ``method: dpo`` (Rafailov et al. 2023) or
    ``method: cpo`` (Xu et al. 2024, ALMA-R): loss = ce_weight * CE(labelled batch) + the preference loss
    (a mean over the step's pairs) + nll_weight * NLL(chosen translations) (a token mean).

    Each source of the ``pool`` ("mono": the source-only pool, ``data.mono``, as the other QE-trained
    methods; "labelled": the labelled batch's sources; "both") gets ``num_candidates`` translations by
    the *teacher*, the translator as it was at the latest refresh, every ``refresh_every`` steps (0:
    never: the initial model, offline preference data, as DPO and ALMA-R use). ``candidates``: "beam"
    (the N best of a beam of max(``num_beams``, N)) or "sample" (``temperature``, ``top_k``, ``top_p``,
    ``epsilon``). ``include_reference``: a labelled source's reference joins its candidates (CPO's
    triplets: reference and system outputs ranked together). The QE at ``qe.path`` (or
    ``reward.terms``) scores every candidate; chosen = the best that trips no guard (``guards``,
    qeebm/guards.py, when ``guards`` is true), rejected = the worst, a guard-tripping candidate
    ranking below every clean one.

    ``beta``: DPO's and CPO's own name for the scale of the implicit reward inside the sigmoid, loss
    = -log sigmoid(beta * margin), margin = the chosen's minus the rejected's log pi/pi_ref (DPO) or
    log pi (CPO), summed over tokens. It is not a loss weight: the loss flattens once beta * margin is
    a few units, so a larger beta stops the translator nearer its reference model (DPO: the KL
    coefficient of the objective it solves) or at a smaller margin (CPO); the gradient of a fresh
    pair is beta / 2 times that of its margin. ``nll_weight``: the NLL of the chosen translations
    (CPO's term; None: the method's own, 1.0 for CPO as published and 0 for DPO, where a positive
    weight gives RPO, Pang et al. 2024). ``reference`` (DPO): "initial", the starting translator
    (DPO's own), or "teacher", the teacher as last refreshed, which with ``refresh_every`` > 0 makes
    iterative DPO: each round's reference is the policy that wrote its candidates.
    ``ce_weight``: the labelled CE's, as every method keeps it; 0 skips its forward pass."""

    candidates: str = "sample"
    pool: str = "mono"  # mono | labelled | both
    include_reference: bool = False
    beta: float = 0.1
    ce_weight: float = 1.0
    nll_weight: Optional[float] = None
    reference: str = "initial"  # initial | teacher (DPO)
    guards: bool = True

# Why a source yields no pair.
GUARDED, TIE = "guarded", "tie"


# ----------------------------------------------------------------------------------------------
# The losses, on sequence log-probs [P]


def dpo_loss(chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor,
             beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPO's sigmoid loss per pair [P], and the implicit rewards beta * (log pi - log pi_ref) of the
    chosen and the rejected (detached)."""
    logits = (chosen - rejected) - (ref_chosen - ref_rejected)
    losses = -F.logsigmoid(beta * logits)
    return losses, (beta * (chosen - ref_chosen)).detach(), (beta * (rejected - ref_rejected)).detach()


def cpo_loss(chosen: torch.Tensor, rejected: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CPO's preference term per pair [P] (its NLL term aside), and the implicit rewards beta * log pi
    of the chosen and the rejected (detached)."""
    losses = -F.logsigmoid(beta * (chosen - rejected))
    return losses, (beta * chosen).detach(), (beta * rejected).detach()


# ----------------------------------------------------------------------------------------------
# Pairs


def preference_pair(texts: list[str], scores: list[float], tripped: list[bool]) -> tuple[int, int, str | None]:
    """(chosen, rejected, None) positions among one source's candidates, or with the reason there is
    no preference (``GUARDED``, ``TIE``) in place of None; the positions then still name two rows.

    Chosen: the highest score among the candidates that trip no guard. Rejected: the lowest score
    among those that trip one, else among all. Ties go to the earlier candidate, as ``qad`` does."""
    everyone = range(len(texts))
    rejected = min(everyone, key=lambda i: (not tripped[i], scores[i]))
    clean = [i for i in everyone if not tripped[i]]
    if not clean:
        return max(everyone, key=lambda i: scores[i]), rejected, GUARDED
    chosen = max(clean, key=lambda i: scores[i])
    if texts[chosen] == texts[rejected] or (not tripped[rejected] and scores[chosen] == scores[rejected]):
        return chosen, rejected, TIE
    return chosen, rejected, None


@dataclass
class Pairs:
    """P sources' chosen and rejected translations as 2P teacher-forced rows, the P chosen first.

    ``input_ids``, ``attention_mask`` [2P, S]: the sources, twice. ``labels``, ``decoder_input_ids``
    [2P, T]: the targets as ``Translator.encode`` builds them (language code, tokens, </s>).
    ``mask`` [2P, T]: the tokens a sequence log-prob sums, the labels without the language code.
    ``weight`` [P]: 1.0 for a pair that trains, 0.0 for a source without a preference."""

    src: list[str]
    chosen: list[str]
    rejected: list[str]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    decoder_input_ids: torch.Tensor
    labels: torch.Tensor
    mask: torch.Tensor
    weight: torch.Tensor

    def __len__(self) -> int:
        return len(self.src)


def pair_logprobs(module: torch.nn.Module, p: Pairs) -> tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs [2P, T] (0 off ``p.mask``) and sequence log-probs [2P] of the pairs' rows."""
    logits = module(input_ids=p.input_ids, attention_mask=p.attention_mask, decoder_input_ids=p.decoder_input_ids,
                    use_cache=False).logits
    return sequence_logprobs(logits, p.labels, p.mask)


@dataclass
class PreferenceRollout:
    """One micro-batch: the labelled ``batch`` (CE term) and its sources' ``pairs``.

    ``scores`` [P, 2]: the QE's score of each chosen and rejected; ``from_reference`` [P]: 1.0 where
    the chosen is the source's reference; ``ref_logp`` [2P]: DPO's reference log-probs (None for
    CPO); ``skipped``: sources without a preference, by reason; ``candidates``: how many were scored;
    ``guards``: their guard result (None with ``preference.guards`` off). Set by ``finish_rollouts``
    from the whole step: ``counts`` (pairs, chosen tokens of the pairs, sources, candidates) and
    ``step_stats``, the run's totals, logged as they are. ``terms``: each ``reward.terms`` term's
    scores of every candidate (empty without them)."""

    batch: Batch
    pairs: Pairs
    scores: torch.Tensor
    from_reference: torch.Tensor
    ref_logp: torch.Tensor | None
    skipped: dict[str, int]
    candidates: int
    guards: GuardResult | None
    counts: dict[str, float] = field(default_factory=dict)
    step_stats: dict[str, float] = field(default_factory=dict)
    terms: dict[str, torch.Tensor] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# The method


class Preference(Method):
    """What DPO and CPO share; a subclass names itself, says whether it needs the reference model
    and gives the loss (``pair_loss``)."""

    section = "preference"
    uses_reference = False
    default_nll_weight = 0.0

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        check_static_qe(cfg)
        c = cfg.preference
        if c.include_reference and c.pool == "mono":
            raise QeebmError("preference.include_reference adds a labelled source's reference to its candidates; "
                             "the source-only pool has none: set preference.pool to labelled or both")
        least = c.num_candidates + (1 if c.include_reference and c.pool == "labelled" else 0)
        if c.num_candidates < 1 or least < 2:
            raise QeebmError(f"preference.num_candidates must be at least 2 (1 with include_reference and "
                             f"pool=labelled): a pair needs two translations of a source; got {c.num_candidates}")
        if c.num_beams < 1 or c.max_new_tokens < 1:
            raise QeebmError(f"preference.num_beams and max_new_tokens must be at least 1; got {c.num_beams} and "
                             f"{c.max_new_tokens}")
        if c.refresh_every < 0:
            raise QeebmError(f"preference.refresh_every must be 0 (never) or a number of steps; got {c.refresh_every}")
        if c.beta <= 0:
            raise QeebmError(f"preference.beta must be > 0 (the implicit reward's scale, not a loss weight); got {c.beta}")
        if c.ce_weight < 0 or (c.nll_weight is not None and c.nll_weight < 0):
            raise QeebmError(f"preference.ce_weight and nll_weight must be >= 0; got {c.ce_weight} and {c.nll_weight}")
        if c.reference != "initial" and not cls.uses_reference:
            raise QeebmError(f"preference.reference sets DPO's reference model; method '{cfg.method}' has none")
        if c.candidates == "sample" and c.temperature <= 0:
            raise QeebmError(f"preference.temperature must be > 0 for sampled candidates; got {c.temperature}")

    def __init__(self, cfg: Config, translator, model: torch.nn.Module):
        self.cfg, self.c = cfg, cfg.preference
        self.translator, self.model = translator, model
        c = self.c
        # The loop reads the source-only pool only for a pool that uses it.
        self.needs_mono = c.pool != "labelled"
        self.label_smoothing = cfg.optim.label_smoothing  # of the CE term, as SFT's
        self.nll_weight = self.default_nll_weight if c.nll_weight is None else c.nll_weight
        self.gen = candidate_generation(GenerationConfig(
            num_beams=c.num_beams, max_new_tokens=c.max_new_tokens, temperature=c.temperature, top_k=c.top_k,
            top_p=c.top_p, epsilon=c.epsilon), c.num_candidates, c.candidates)
        self.reward = QEReward(cfg, translator, c.guards, reads_pool=self.needs_mono)
        # A reference-based reward (a COMET, chrF++) reads each source's reference: the pool's, or the
        # labelled pair's.
        self.needs_reference = self.reward.needs_reference
        # Built before the loop restores a checkpoint: both start as the initial model. Without
        # refresh the teacher is DPO's initial reference itself (one copy, or none with LoRA).
        self.initial = InitialPolicy(translator) if self.uses_reference and c.reference == "initial" else None
        self.teacher = Teacher(translator, c.refresh_every, initial=self.initial, name=self.name)
        self.totals = {"pairs": 0, GUARDED: 0, TIE: 0}  # over the run, restored on resume

    def frozen_qes(self) -> dict[str, torch.nn.Module]:
        return self.reward.frozen_qes()

    def state_dict(self) -> dict:
        return {**self.teacher.state_dict(), "totals": dict(self.totals)}

    def load_state_dict(self, state: dict) -> None:
        self.teacher.load_state_dict(state)
        self.totals = {k: int(v) for k, v in state["totals"].items()}

    # The teacher is left out of the snapshot: a refresh copies the translator as the previous step
    # left it, which a step left before its update did not change, so the resumed step's refresh
    # gives the same teacher again; copying it before every step would cost a model's weights.
    def step_snapshot(self) -> dict:
        return {"totals": dict(self.totals)}

    def undo_step(self, snapshot: dict) -> None:
        self.totals = dict(snapshot["totals"])

    def before_step(self, batches: list[Batch], all_reduce) -> dict[str, float]:
        """1. The teacher becomes the translator as it is after ``step - 1`` updates, when due."""
        self.teacher.before_step(batches[0].step)
        return {}

    def reference(self):
        """DPO's reference model, without dropout: the initial translator or the teacher."""
        return self.initial() if self.initial is not None else self.teacher()

    def pair_loss(self, chosen: torch.Tensor, rejected: torch.Tensor, r: PreferenceRollout):
        """(losses [P], chosen rewards [P], rejected rewards [P]) from the policy's log-probs."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------
    # Rollout (no gradient)

    def sources(self, batch: Batch) -> tuple[list[str], list[str | None], list[str | None]]:
        """The pool's sources in this micro-batch, the references that may join their candidates (a
        labelled pair's; None for a source-only sentence), and the references a reference-based
        reward reads (a source-only sentence's too, from a pool with references)."""
        src: list[str] = []
        refs: list[str | None] = []
        scored: list[str | None] = []
        if self.c.pool in ("mono", "both"):
            mono = mono_sources(batch)
            src, refs = src + mono, refs + [None] * len(mono)
            scored += list(batch.mono_ref) if batch.mono_ref is not None else [None] * len(mono)
        if self.c.pool in ("labelled", "both"):
            src += batch.src
            labelled = list(batch.tgt) if batch.tgt is not None else [None] * len(batch.src)
            refs += labelled
            scored += labelled
        return src, refs, scored

    @torch.no_grad()
    def rollout(self, batch: Batch) -> PreferenceRollout:
        # 2. Candidates from the teacher (and references), scored and guarded together.
        src, refs, scored = self.sources(batch)
        cands = self.teacher.candidates(src, self.gen, self.c.num_candidates)
        if self.c.include_reference:
            cands = [c + [ref] if ref is not None else c for c, ref in zip(cands, refs)]
        flat_src = [s for s, c in zip(src, cands) for _ in c]
        flat_refs = [r for r, c in zip(scored, cands) for _ in c] if self.needs_reference else None
        if flat_refs is not None and None in flat_refs:
            raise QeebmError(f"{self.reward.reader} reads each candidate's reference, and some sources have none "
                             "(a source-only pool without a reference column)")
        qe, penalty, guards, terms = self.reward(flat_src, [h for c in cands for h in c], flat_refs)
        qe, tripped = qe.tolist(), (penalty > 0).tolist()
        chosen, rejected, weight, scores, from_reference = [], [], [], [], []
        skipped = {GUARDED: 0, TIE: 0}
        start = 0
        for c, ref in zip(cands, refs):
            s, t = qe[start:start + len(c)], tripped[start:start + len(c)]
            start += len(c)
            i, j, why = preference_pair(c, s, t)
            chosen.append(c[i])
            rejected.append(c[j])
            scores.append((s[i], s[j]))
            weight.append(0.0 if why else 1.0)
            from_reference.append(float(self.c.include_reference and ref is not None and i == len(c) - 1))
            if why:
                skipped[why] += 1
        pairs = self.encode(src, chosen, rejected, weight)
        ref_logp = None
        if self.uses_reference:
            with self.reference() as ref_model:
                _, ref_logp = pair_logprobs(ref_model, pairs)
        device = pairs.labels.device
        return PreferenceRollout(batch=batch, pairs=pairs, scores=torch.tensor(scores, device=device),
                                 from_reference=torch.tensor(from_reference, device=device), ref_logp=ref_logp,
                                 skipped=skipped, candidates=len(flat_src), guards=guards, terms=terms)

    def encode(self, src: list[str], chosen: list[str], rejected: list[str], weight: list[float]) -> Pairs:
        tr = self.translator
        enc = {k: v.to(tr.device) for k, v in tr.encode(src + src, chosen + rejected).items()}
        labels = enc["labels"]
        if (labels[:, 0] != tr.tgt_lang_id).any():
            # An NLLB tokenizer with legacy_behaviour=True puts the code after </s>.
            raise QeebmError(f"the tokenizer does not start a target with its language code {tr.tgt_code}; "
                             "sequence log-probs leave that code out and need it first")
        mask = labels != -100
        mask[:, 0] = False  # the forced language code: no choice of the translator
        return Pairs(src=list(src), chosen=list(chosen), rejected=list(rejected), input_ids=enc["input_ids"],
                     attention_mask=enc["attention_mask"], decoder_input_ids=enc["decoder_input_ids"], labels=labels,
                     mask=mask, weight=torch.tensor(weight, device=tr.device))

    def finish_rollouts(self, rollouts: list[PreferenceRollout], gather) -> list[PreferenceRollout]:
        """3. The step's counts over every micro-batch and process; the run's totals."""
        keys = ("pairs", "tokens", "sources", "candidates", GUARDED, TIE)
        device = rollouts[0].pairs.labels.device
        local = torch.zeros(len(keys), dtype=torch.float64, device=device)
        for r in rollouts:
            p, n = r.pairs, len(r.pairs)
            w = p.weight.double()
            local += torch.tensor([w.sum().item(), (p.mask[:n].sum(1).double() * w).sum().item(), n, r.candidates,
                                   r.skipped[GUARDED], r.skipped[TIE]], dtype=torch.float64, device=device)
        counts = dict(zip(keys, gather(local).view(-1, len(keys)).sum(0).tolist()))
        for key in ("pairs", GUARDED, TIE):
            self.totals[key] += round(counts[key])
        stats = {f"{self.name}/pairs_total": float(self.totals["pairs"]),
                 f"{self.name}/skipped_total": float(self.totals[GUARDED] + self.totals[TIE]),
                 **self.reward.step_means([r.terms for r in rollouts], gather)}
        for r in rollouts:
            r.counts, r.step_stats = counts, stats
        return rollouts

    # ------------------------------------------------------------------------------------------
    # Loss

    def loss(self, r: PreferenceRollout) -> StepOutput:
        # 4. The preference loss (mean over the step's pairs) [+ NLL of the chosen] [+ alpha * CE].
        p, n, name = r.pairs, len(r.pairs), self.name
        with eval_mode(self.model):
            _, logp = pair_logprobs(self.model, p)  # [2P]
        chosen, rejected = logp[:n], logp[n:]
        losses, chosen_reward, rejected_reward = self.pair_loss(chosen, rejected, r)
        w = p.weight
        pairs = max(r.counts["pairs"], 1.0)
        preference = (w * losses).sum() / pairs
        terms = {"preference": preference}
        sources, lengths = r.counts["sources"], p.mask.sum(1).float()
        with torch.no_grad():
            metrics = {
                f"{name}/loss": preference.item(),
                f"{name}/reward_margin": (w * (chosen_reward - rejected_reward)).sum().item() / pairs,
                f"{name}/reward_accuracy": (w * (chosen_reward > rejected_reward).float()).sum().item() / pairs,
                f"{name}/chosen_reward": (w * chosen_reward).sum().item() / pairs,
                f"{name}/rejected_reward": (w * rejected_reward).sum().item() / pairs,
                f"{name}/chosen_logp": (w * chosen).sum().item() / pairs,
                f"{name}/rejected_logp": (w * rejected).sum().item() / pairs,
                f"{name}/chosen_score": (w * r.scores[:, 0]).sum().item() / pairs,
                f"{name}/rejected_score": (w * r.scores[:, 1]).sum().item() / pairs,
                f"{name}/chosen_len": (w * lengths[:n]).sum().item() / pairs,
                f"{name}/rejected_len": (w * lengths[n:]).sum().item() / pairs,
                f"{name}/pairs": w.sum().item() / sources,
                f"{name}/skipped_guarded": r.skipped[GUARDED] / sources,
                f"{name}/skipped_tie": r.skipped[TIE] / sources,
            }
        if self.c.include_reference:
            metrics[f"{name}/chosen_reference"] = (w * r.from_reference).sum().item() / pairs
        if self.nll_weight > 0:
            # The chosen translations' NLL, a token mean over the step's pairs (TRL: CrossEntropyLoss's mean).
            nll = -(w * chosen).sum() / max(r.counts["tokens"], 1.0)
            terms["nll"] = self.nll_weight * nll
            metrics[f"{name}/chosen_nll"] = nll.item()
        if self.c.ce_weight > 0:
            ce, ce_nll = label_smoothed_ce(self.model, r.batch, self.label_smoothing, with_nll=True)
            terms = {"ce": self.c.ce_weight * ce, **terms}
            metrics |= {f"{name}/ce": ce.item(), f"{name}/nll": ce_nll.item()}
        if r.guards is not None:
            metrics |= hit_rates(r.guards, normaliser=r.counts["candidates"])
        return StepOutput(loss=sum(terms.values()), metrics=metrics, terms=terms, values=r.step_stats)


class DPO(Preference):
    name = "dpo"
    uses_reference = True

    def pair_loss(self, chosen, rejected, r):
        n = len(r.pairs)
        return dpo_loss(chosen, rejected, r.ref_logp[:n], r.ref_logp[n:], self.c.beta)


class CPO(Preference):
    name = "cpo"
    default_nll_weight = 1.0  # published (ALMA-R), TRL's cpo_alpha

    def pair_loss(self, chosen, rejected, r):
        return cpo_loss(chosen, rejected, self.c.beta)
