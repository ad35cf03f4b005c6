"""QE finetuning (Finkelstein & Freitag 2023, "MBR and QE Finetuning"): distil the QE's choices.

The simplest strong way to use a QE at training time, and the one QE-EBM must beat ("is
backpropagating through the QE better than distilling its choices?"). Per optimiser step:

1. (``before_step``) every ``qe_finetune.refresh_every`` steps the teacher becomes a copy of the
   translator as it is now; until the first refresh (and forever with 0) it is the initial model,
   which makes the pseudo-targets the paper's offline QE-finetuning data;
2. (``rollout``) the teacher translates each source-only sentence of the batch into N candidates
   (beam N-best or samples) and the best is kept: by the reward-based methods' reward, the QE at
   ``qe.path`` or ``reward.terms`` (rerank), or by MBR (qeebm/translation/qad.py, the same selection
   ``qeebm evaluate --rerank/--mbr`` makes);
3. (``finish_rollouts``) the selected targets' token count over the whole step, the normaliser of
   their token-mean CE;
4. (``loss``) alpha * CE(labelled batch) + distill_weight * CE(sources, selected targets), both SFT's
   label-smoothed token means.

Exact resume: the teacher (``common.Teacher``) saves what it needs; candidate sampling draws from
the run's RNG, which the checkpoint restores.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from qeebm.config import Config, GenerationConfig, method_section
from qeebm.errors import QeebmError
from qeebm.methods import common
from qeebm.methods.base import Batch, Method, StepOutput
from qeebm.methods.common import CandidatesConfig, Teacher, label_smoothed_ce
from qeebm.methods.sampling import mono_sources
from qeebm.translation.qad import CHRF, Choice, Selection, choose_best


@method_section("qe_finetune", choices={"candidates": ("beam", "sample"), "selection": ("rerank", "mbr")},
                renamed={"beta": "distill_weight", "alpha": "ce_weight"})
@dataclass
class QeFinetuneConfig(CandidatesConfig):
    """QE finetuning (Finkelstein & Freitag 2023, "MBR and QE Finetuning"): loss = ce_weight * CE(labelled
    batch) + distill_weight * CE(source-only batch, each source's selected pseudo-target), both label-smoothed
    token means like SFT's.

    A pseudo-target is the best of ``num_candidates`` translations of the source by the *teacher*: the
    translator as it was at the latest refresh, every ``refresh_every`` optimiser steps (0: never, so
    the teacher stays the initial model, as in the paper's offline QE-finetuning data).
    ``candidates``: "beam" (the N best of a beam of max(``num_beams``, N); N = 1 with num_beams 1 is
    greedy) or "sample" (``temperature``, ``top_k``, ``top_p``, ``epsilon``: epsilon sampling).
    ``selection``: "rerank" (the candidate with the highest score of the QE at ``qe.path``, or of
    ``reward.terms``; a reference-based one reads the pool's references) or "mbr" (the highest
    expected ``utility`` with the candidates as pseudo-references: "chrf" = chrF++, or a
    reference-based COMET checkpoint)."""

    selection: str = "rerank"  # rerank | mbr
    utility: str = "chrf"  # mbr: chrf, or a reference-based COMET directory / hub id
    ce_weight: float = 1.0  # on the labelled batch; 0 skips its forward pass
    distill_weight: float = 1.0  # CE weight on the selected pseudo-targets

log = logging.getLogger(__name__)


@dataclass
class QeFinetuneRollout:
    """One micro-batch: the labelled ``batch`` and ``pseudo``, its N source-only sentences with
    their selected targets as labels (``global_tokens`` set by ``finish_rollouts``); ``choice``:
    the selection (chosen texts, candidate positions, every candidate's score); ``terms``: each
    ``reward.terms`` term's score of every candidate (empty without them); ``step_stats``: the
    terms' step means, logged as they are."""

    batch: Batch
    pseudo: Batch
    choice: Choice
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    step_stats: dict[str, float] = field(default_factory=dict)


class QeFinetune(Method):
    name = "qe-finetune"
    section = "qe_finetune"
    needs_mono = True

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        c = cfg.qe_finetune
        if c.selection == "rerank":
            common.check_static_qe(cfg)
        elif cfg.reward.terms:
            raise QeebmError("config key 'reward.terms' ranks candidates for qe_finetune.selection=rerank; "
                             "selection=mbr chooses by qe_finetune.utility")
        if c.num_candidates < 1 or c.num_beams < 1:
            raise QeebmError(f"qe_finetune.num_candidates and num_beams must be at least 1; got "
                             f"{c.num_candidates} and {c.num_beams}")
        if c.refresh_every < 0:
            raise QeebmError(f"qe_finetune.refresh_every must be 0 (never) or a number of steps; got {c.refresh_every}")
        if c.ce_weight < 0 or c.distill_weight < 0 or c.ce_weight + c.distill_weight == 0:
            raise QeebmError(f"qe_finetune.ce_weight and distill_weight must be >= 0, not both 0; got {c.ce_weight} and "
                             f"{c.distill_weight}")

    def __init__(self, cfg: Config, translator, model: torch.nn.Module):
        self.cfg, self.c = cfg, cfg.qe_finetune
        self.translator, self.model = translator, model
        c = self.c
        self.label_smoothing = cfg.optim.label_smoothing
        self.selection = Selection("rerank" if c.selection == "rerank" else "mbr",
                                   model=cfg.qe.path if c.selection == "rerank" else (None if c.utility == CHRF else c.utility),
                                   candidates=c.num_candidates, mode=c.candidates).check()
        self.gen = self.selection.generation(GenerationConfig(
            num_beams=c.num_beams, max_new_tokens=c.max_new_tokens, temperature=c.temperature, top_k=c.top_k,
            top_p=c.top_p, epsilon=c.epsilon))
        # Reranking scores with the reward-based methods' reward (qe.path or reward.terms, no guards);
        # a reference-based one reads the pool's references.
        self.reward = common.QEReward(cfg, translator, use_guards=False) if c.selection == "rerank" else None
        self.needs_reference = self.reward is not None and self.reward.needs_reference
        self.select = self.selection.selector(translator.device) if self.reward is None else None
        # The loop builds the method before it restores a checkpoint: the teacher starts as the initial model.
        self.teacher = Teacher(translator, c.refresh_every, name=self.name)

    def state_dict(self) -> dict:
        return self.teacher.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.teacher.load_state_dict(state)

    # Nothing to put back: the teacher's refresh is redone alike by the resumed step (as Preference's).
    def step_snapshot(self) -> dict:
        return {}

    def undo_step(self, snapshot: dict) -> None:
        pass

    def before_step(self, batches: list[Batch], all_reduce) -> dict[str, float]:
        """1. The teacher becomes the translator as it is after ``step - 1`` updates, when due."""
        self.teacher.before_step(batches[0].step)
        return {}

    @torch.no_grad()
    def rollout(self, batch: Batch) -> QeFinetuneRollout:
        # 2. N candidates of each source-only sentence from the teacher; the selection keeps one.
        src = mono_sources(batch)
        cands = self.teacher.candidates(src, self.gen, self.c.num_candidates)
        terms = {}
        if self.reward is not None:
            refs = common.mono_references(batch) if self.needs_reference else None
            flat_src = [s for s, c in zip(src, cands) for _ in c]
            flat_refs = [r for r, c in zip(refs, cands) for _ in c] if refs is not None else None
            score, _, _, terms = self.reward(flat_src, [h for c in cands for h in c], flat_refs)
            choice = choose_best(cands, score.tolist())
        else:
            choice = self.select(src, cands)
        enc = {k: v.to(batch.input_ids.device) for k, v in self.translator.encode(src, choice.hyps).items()}
        pseudo = Batch(src=src, tgt=choice.hyps, input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                       labels=enc["labels"], decoder_input_ids=enc["decoder_input_ids"], global_tokens=0,
                       global_examples=batch.global_mono, step=batch.step)
        return QeFinetuneRollout(batch=batch, pseudo=pseudo, choice=choice, terms=terms)

    def finish_rollouts(self, rollouts: list[QeFinetuneRollout], gather) -> list[QeFinetuneRollout]:
        """3. The step's selected-target tokens over all micro-batches and processes."""
        local = sum(int((r.pseudo.labels != -100).sum()) for r in rollouts)
        device = rollouts[0].pseudo.labels.device
        total = int(gather(torch.tensor([local], dtype=torch.long, device=device)).sum())
        stats = self.reward.step_means([r.terms for r in rollouts], gather) if self.reward is not None else {}
        for r in rollouts:
            r.pseudo.global_tokens, r.step_stats = total, stats
        return rollouts

    def loss(self, r: QeFinetuneRollout) -> StepOutput:
        # 4. alpha * CE(labelled) + distill_weight * CE(selected targets).
        n = r.pseudo.global_examples
        distill, nll = label_smoothed_ce(self.model, r.pseudo, self.label_smoothing, with_nll=True)
        terms = {"distill": self.c.distill_weight * distill}
        metrics = {
            "qe-finetune/distill_ce": distill.item(),
            "qe-finetune/distill_nll": nll.item(),
            "qe-finetune/selected_score": sum(s[i] for s, i in zip(r.choice.scores, r.choice.index)) / n,
            "qe-finetune/changed": sum(i != 0 for i in r.choice.index) / n,
            "qe-finetune/target_len": float((r.pseudo.labels != -100).sum()) / n,
        }
        if self.c.ce_weight > 0:
            ce, ce_nll = label_smoothed_ce(self.model, r.batch, self.label_smoothing, with_nll=True)
            terms = {"ce": self.c.ce_weight * ce, **terms}
            metrics |= {"qe-finetune/ce": ce.item(), "qe-finetune/nll": ce_nll.item()}
        return StepOutput(loss=sum(terms.values()), metrics=metrics, terms=terms, values=r.step_stats)
