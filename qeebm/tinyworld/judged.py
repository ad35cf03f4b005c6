"""The tiny world's judged translations: what its quality estimators learn from and are measured on.

A real CometKiwi learns from human judgements of many systems' translations, far more than any
translator it is later used with was trained on. The tiny world mirrors that with its own split of
sentences (``qe``, disjoint from the task's train/pool/dev/test; the judge has a shard of its own):

* **systems**: each base translator at several points of its training, and the base fine-tuned on a
  slice of the QE split's own pairs (a stand-in for the SFT-trained translators the methods produce),
  each decoding greedily and sampling at temperatures 0.7, 1.0 and 1.3; every judged source gets a
  random share of these outputs;
* **corruptions** of the reference (omissions, wrong cases, word order, source copies, untranslated
  words, ...: ``language.CORRUPTIONS``) and **degenerate outputs** an optimiser finds when a QE
  rewards them (over-long, repeated n-grams, run-on copies, off-target script:
  ``language.DEGENERATIONS``), made from references and from system outputs; the reference itself
  for one source in five.

The judgement (``quality``) is chrF with word bigrams and beta = 1, times the length ratio. chrF++'s
beta = 2 weights recall twice as much as precision, so a reference said twice still scores about 0.83
against itself, and a QE fitted to it learns to pay for length: in the first tiny world energy-only
training made outputs five times longer while that QE's score rose. Precision counted as much as
recall, and a length ratio on top, make additions cost what omissions cost, as they do in human
judgements of adequacy: the doubled reference scores 0.33.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import sacrebleu
import torch

from qeebm.analysis.qe_check import within_source as mean_within
from qeebm.config import GenerationConfig
from qeebm.qe.tiny import pearson, spearman
from qeebm.tinyworld.language import CORRUPTIONS, DEGENERATIONS, corrupt, degenerate

_CHRF1 = sacrebleu.metrics.CHRF(word_order=2, beta=1)

# The shipped QEs (build.SHIPPED_QE) learnt from samples drawn this way; another sampler would
# build other, equally good, QEs than the ones shipped.
SHIPPED_SAMPLER = "multinomial"
# name -> decoding of every judged system
DECODINGS = {
    "greedy": GenerationConfig(num_beams=1, batch_size=256),
    "t0.7": GenerationConfig(num_beams=1, do_sample=True, temperature=0.7, batch_size=256, sampler=SHIPPED_SAMPLER),
    "t1.0": GenerationConfig(num_beams=1, do_sample=True, temperature=1.0, batch_size=256, sampler=SHIPPED_SAMPLER),
    "t1.3": GenerationConfig(num_beams=1, do_sample=True, temperature=1.3, batch_size=256, sampler=SHIPPED_SAMPLER),
}


def quality(mt: str, ref: str) -> float:
    """The tiny world's judgement of ``mt`` against ``ref``, in [0, 1] (module docstring)."""
    h, r = len("".join(mt.split())), len("".join(ref.split()))
    if not max(h, r):
        return 1.0
    return _CHRF1.sentence_score(mt, [ref]).score / 100 * min(h, r) / max(h, r)


@dataclass
class Judged:
    """One judged translation: its source, the translation, the reference, the quality, and where the
    translation came from (``system/decoding``, ``reference``, ``corrupt/<kind>``, ``degenerate/<kind>``)."""

    src: str
    mt: str
    ref: str
    score: float
    origin: str

    def row(self) -> tuple[str, str, str, float]:
        return self.src, self.mt, self.ref, self.score


@torch.no_grad()
def system_outputs(systems: dict, sources: list[str], share: float, seed: int, k: int = 0) -> list[list[tuple[str, str]]]:
    """For every source, (origin, translation) pairs: each (system, decoding) translates a random
    ``share`` of the sources (at least one per source, so every source gets a system output); and
    ``k`` more ancestral samples of one system chosen at random, so the QE also learns to rank the
    close translations of one source that QE-EBM and the RL baselines compare (origin
    ``<system>/samples``)."""
    rng = random.Random(seed)
    combos = [(name, dec) for name in systems for dec in DECODINGS]
    chosen: list[set] = []
    for _ in sources:
        picked = {c for c in combos if rng.random() < share}
        chosen.append(picked or {rng.choice(combos)})
    sampler = [rng.choice(list(systems)) for _ in sources]
    out: list[list[tuple[str, str]]] = [[] for _ in sources]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name, dec in combos:
            # By length: a batch then finishes together, instead of waiting for its one long source.
            idx = sorted((i for i, c in enumerate(chosen) if (name, dec) in c), key=lambda i: len(sources[i]))
            if not idx:
                continue
            for i, hyp in zip(idx, systems[name].generate([sources[i] for i in idx], DECODINGS[dec])):
                out[i].append((f"{name}/{dec}", hyp))
        for name in systems if k else ():
            idx = sorted((i for i, s in enumerate(sampler) if s == name), key=lambda i: len(sources[i]))
            hyps = systems[name].generate([sources[i] for i in idx], DECODINGS["t1.0"], num_return_sequences=k)
            for j, i in enumerate(idx):
                out[i] += [(f"{name}/samples", h) for h in hyps[j * k:(j + 1) * k]]
    return out


def judged_rows(pairs, outputs: list[list[tuple[str, str]]], seed: int, corruptions: int = 2,
                degenerates: int = 3, reference_share: float = 0.2) -> list[Judged]:
    """The judged rows of ``pairs`` (language.Pair) with their systems' ``outputs``: the outputs,
    ``corruptions`` corrupted references, ``degenerates`` degenerate versions of the reference or of an
    output, and the reference for a ``reference_share`` of the sources. A text that occurs twice for
    one source is one row."""

    rng = random.Random(seed)
    rows: list[Judged] = []
    for pair, outs in zip(pairs, outputs):
        cands = list(outs)
        for kind in rng.sample(CORRUPTIONS, corruptions):
            cands.append((f"corrupt/{kind}", corrupt(pair, kind, rng)))
        bases = [pair.tgt] + [t for _, t in outs]
        for kind in rng.sample(DEGENERATIONS, degenerates):
            filler = pairs[rng.randrange(len(pairs))].tgt
            cands.append((f"degenerate/{kind}", degenerate(rng.choice(bases), kind, rng, filler)))
        if rng.random() < reference_share:
            cands.append(("reference", pair.tgt))
        seen = set()
        for origin, mt in cands:
            if mt in seen:
                continue
            seen.add(mt)
            rows.append(Judged(pair.src, mt, pair.tgt, quality(mt, pair.tgt), origin))
    return rows


@torch.no_grad()
def heldout_samples(systems: dict, pairs, k: int, seed: int) -> list[Judged]:
    """``k`` ancestral samples and the greedy output of each system for every held-out pair: the
    outputs of the translators the methods train, on which a QE's within-source correlation is
    measured (origin ``<system>/sample`` and ``<system>/greedy``)."""
    rows: list[Judged] = []
    src = [p.src for p in pairs]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name, tr in systems.items():
            samples = tr.generate(src, DECODINGS["t1.0"], num_return_sequences=k)
            greedy = tr.generate(src, DECODINGS["greedy"])
            for i, pair in enumerate(pairs):
                for mt in samples[i * k:(i + 1) * k]:
                    rows.append(Judged(pair.src, mt, pair.tgt, quality(mt, pair.tgt), f"{name}/sample"))
                rows.append(Judged(pair.src, greedy[i], pair.tgt, quality(greedy[i], pair.tgt), f"{name}/greedy"))
    return rows


def degenerate_probes(pairs, seed: int) -> dict[str, list[Judged]]:
    """For each degeneration, the held-out references made degenerate that way, to compare a QE's
    score of each against its score of the reference itself."""

    rng = random.Random(seed)
    out = {}
    for kind in DEGENERATIONS:
        out[kind] = [Judged(p.src, degenerate(p.tgt, kind, rng, pairs[(i + 7) % len(pairs)].tgt), p.tgt, 0.0, kind)
                     for i, p in enumerate(pairs)]
    return out


def within_source(scores, quality_, groups) -> float:
    """Mean over groups (one source's samples of one system) of the Pearson correlation between a
    QE's scores and the true quality; groups with no spread on either side are left out (the same
    rule as ``qeebm qe-check``'s)."""

    return mean_within(scores, quality_, groups)


def report(scorer, heldout: list[Judged], samples: list[Judged], probes: dict[str, list[Judged]]) -> dict:
    """What a QE gets right on held-out sources: Pearson / Spearman with the true quality over every
    held-out judged row (``heldout``) and over the translators' own outputs (``samples``), the mean
    within-source Pearson over the K samples of each source and system, and for each degeneration
    the share of sources whose reference it scores above the degenerate version."""

    def scores(rows):
        return scorer.score([r.src for r in rows], [r.mt for r in rows])

    out = {}
    s = scores(heldout)
    out["pearson"], out["spearman"] = pearson(s, [r.score for r in heldout]), spearman(s, [r.score for r in heldout])
    s = scores(samples)
    q = [r.score for r in samples]
    out["outputs_pearson"], out["outputs_spearman"] = pearson(s, q), spearman(s, q)
    picked = [i for i, r in enumerate(samples) if r.origin.endswith("/sample")]
    out["within_source_pearson"] = within_source([s[i] for i in picked], [q[i] for i in picked],
                                                 [(samples[i].src, samples[i].origin) for i in picked])
    refs = [Judged(r.src, r.ref, r.ref, 1.0, "reference") for r in next(iter(probes.values()))]
    good = np.array(scores(refs))
    out["prefers_reference_over"] = {kind: float(np.mean(good > np.array(scores(rows)))) for kind, rows in probes.items()}
    out["heldout_rows"], out["output_rows"] = len(heldout), len(samples)
    return out
