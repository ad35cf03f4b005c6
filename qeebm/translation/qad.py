"""Quality-aware decoding: N candidate translations per source, then one chosen per source.

Two selection rules, as WMT systems use their metrics at inference:

* **rerank**: the candidate with the highest score of a reference-free QE (CometKiwi; XCOMET in
  its QE mode), scored by ``QEScorer`` (cached, batched, equal to ``qeebm score``);
* **mbr** (minimum Bayes risk): the candidate with the highest expected utility when every
  candidate, itself included, serves as a pseudo-reference (Kumar & Byrne 2004; Freitag et al.
  2022): U[i, j] = utility(hypothesis i, pseudo-reference j), expected[i] = mean_j U[i, j].
  The utility is chrF++ (sacrebleu's sentence chrF++, exactly) or a reference-based COMET.

Candidates come from beam search (the N best of a beam of max(num_beams, N)) or from sampling
(temperature, top-k, nucleus, epsilon). Ties go to the earliest candidate, so with beam candidates
the selection falls back to the beam's own best; N = 1 is plain decoding.

Why not ``mbrs``: version 0.1.8 co-installs with qeebm's pins, but its chrF++ (word n-grams rule out
its fastchrf path) scores every pair with sacrebleu's ``sentence_score`` in a fresh process pool per
call, measured 11x slower than ``chrf_matrix`` below on this project's machine, and its COMET utility
loads models through ``comet.download_model``, which accepts hub ids only, so no local checkpoint
(the tiny world's, or an offline copy) can be used. The decision rule itself is an argmax of row
means; what costs time is the utility, which is where this module spends its code.

Used by ``qeebm translate`` / ``qeebm evaluate`` (``--rerank``, ``--mbr``; qeebm/evaluation/evaluate.py) and
by the ``qe-finetune`` training method (qeebm/methods/qe_finetune.py).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from qeebm.config import GenerationConfig
from qeebm.errors import QeebmError
from qeebm.metrics.registry import SELECTION_RULES
from qeebm.metrics.sacrebleu import make_metric, metric_signature

log = logging.getLogger(__name__)

CANDIDATE_MODES = ("beam", "sample")
# Candidates per source. A tiny-world evaluation of one system with 8 beam candidates takes well
# under a minute on 2 CPU cores (README, "Other commands"); real systems often use more.
DEFAULT_CANDIDATES = 8
CHRF = "chrf"


# ----------------------------------------------------------------------------------------------
# Candidates


def candidate_generation(gen: GenerationConfig, n: int, mode: str) -> GenerationConfig:
    """The decoding that yields ``n`` candidates per source: beam search with a beam of at least
    ``n`` (its n best), or sampling with ``gen``'s temperature, top-k, top-p and epsilon."""
    if mode not in CANDIDATE_MODES:
        raise QeebmError(f"candidate mode must be one of {', '.join(CANDIDATE_MODES)}; got {mode!r}")
    if mode == "beam":
        return dataclasses.replace(gen, do_sample=False, num_beams=max(gen.num_beams, n))
    return dataclasses.replace(gen, do_sample=True, num_beams=1)


def generate_candidates(translator, src: Sequence[str], gen: GenerationConfig, n: int) -> list[list[str]]:
    """``n`` translations of each source with ``gen`` as given (see ``candidate_generation``), each
    on one line (whitespace collapsed, as ``qeebm evaluate`` writes hypotheses)."""
    flat = translator.generate(list(src), gen, num_return_sequences=n)
    flat = [" ".join(h.split()) for h in flat]
    return [flat[i * n:(i + 1) * n] for i in range(len(src))]


# ----------------------------------------------------------------------------------------------
# Selection


@dataclass
class Choice:
    """One selection per source: ``hyps`` the chosen texts, ``index`` their candidate positions,
    ``scores`` every candidate's score (QE score, or expected utility for MBR)."""

    hyps: list[str]
    index: list[int]
    scores: list[list[float]]

    @property
    def changed(self) -> float:
        """Share of sources whose choice is not the first candidate (the beam's best)."""
        return sum(i != 0 for i in self.index) / max(len(self.index), 1)


def _choose(cands: Sequence[Sequence[str]], scores: Sequence[Sequence[float]]) -> Choice:
    # np.argmax returns the first maximum: ties go to the earlier candidate
    index = [int(np.argmax(row)) for row in scores]
    return Choice(hyps=[c[i] for c, i in zip(cands, index)], index=index,
                  scores=[[float(x) for x in row] for row in scores])


def _check_candidates(src: Sequence[str], cands: Sequence[Sequence[str]]) -> None:
    if len(src) != len(cands):
        raise ValueError(f"{len(src)} sources but {len(cands)} candidate lists")
    empty = next((i for i, c in enumerate(cands) if not c), None)
    if empty is not None:
        raise ValueError(f"source {empty} has no candidates")


def rerank(scorer, src: Sequence[str], cands: Sequence[Sequence[str]]) -> Choice:
    """The candidate with the highest QE score; ``scorer.score(src, mt)`` scores all candidates of
    all sources in one call (a QEScorer batches them and scores repeated candidates once)."""
    _check_candidates(src, cands)
    flat_src = [s for s, c in zip(src, cands) for _ in c]
    return choose_best(cands, scorer.score(flat_src, [h for c in cands for h in c]))


def choose_best(cands: Sequence[Sequence[str]], flat: Sequence[float]) -> Choice:
    """The highest-scoring candidate of each source, from every candidate's score in order."""
    scores, start = [], 0
    for c in cands:
        scores.append(flat[start:start + len(c)])
        start += len(c)
    return _choose(cands, scores)


def mbr(utility, src: Sequence[str], cands: Sequence[Sequence[str]]) -> Choice:
    """Minimum Bayes risk with the candidates as pseudo-references (uniform weights, the hypothesis
    itself included): the candidate with the highest mean utility against all of them."""
    _check_candidates(src, cands)
    matrices = utility.matrices(src, cands)
    return _choose(cands, [m.mean(axis=1) for m in matrices])


def _ngrams(metric, text: str) -> list:
    """One segment's n-gram Counters for every order, as sacrebleu's CHRF extracts them for a
    hypothesis or a reference (character orders, then word orders)."""
    from sacrebleu.metrics.helpers import extract_all_char_ngrams, extract_word_ngrams

    text = metric._preprocess_segment(text)
    grams = extract_all_char_ngrams(text, metric.char_order, metric.whitespace)
    if metric.word_order > 0:
        words = metric._remove_punctuation(text)
        grams.extend(extract_word_ngrams(words, n) for n in range(1, metric.word_order + 1))
    return grams


def _matches(a, b) -> int:
    if len(a) > len(b):
        a, b = b, a
    return sum(min(count, b[g]) for g, count in a.items() if g in b)


def chrf_matrix(metric, texts: Sequence[str]) -> np.ndarray:
    """``[n, n]``: sacrebleu's sentence score of ``texts[i]`` against the single reference
    ``texts[j]`` (``metric.sentence_score(texts[i], [texts[j]]).score``), computed with the same
    statistics and f-score code, but each text's n-grams are extracted once and each pair's
    matches counted once (they are symmetric); repeated texts are scored once."""
    unique = list(dict.fromkeys(texts))
    grams = [_ngrams(metric, t) for t in unique]
    totals = [[sum(g.values()) for g in per] for per in grams]  # [u, orders]
    m = len(unique)
    scores = np.empty((m, m))
    for i in range(m):
        for j in range(i, m):
            match = [_matches(a, b) for a, b in zip(grams[i], grams[j])]
            for h, r in ((i, j), (j, i)):
                stats = []
                for o, k in enumerate(match):
                    # sacrebleu counts no hypothesis n-grams of an order the reference lacks
                    stats += [totals[h][o] if totals[r][o] else 0, totals[r][o], k]
                scores[h, r] = metric._compute_f_score(stats)
    pos = {t: i for i, t in enumerate(unique)}
    idx = np.array([pos[t] for t in texts])
    return scores[np.ix_(idx, idx)]


class ChrfUtility:
    """chrF++ (sacrebleu's defaults: 6 character orders, 2 word orders, beta 2) as MBR utility."""

    def __init__(self):
        self.metric = make_metric("chrf")

    def matrices(self, src: Sequence[str], cands: Sequence[Sequence[str]]) -> list[np.ndarray]:
        return [chrf_matrix(self.metric, c) for c in cands]


class ChrfScorer:
    """Sentence chrF++ of each (mt, ref) as a score in [0, 1] (sacrebleu's ``sentence_score`` / 100):
    the minimum-risk-training reward, with the interface of ``QEScorer.score``. Each distinct text's
    n-grams are extracted once (the K samples of a source share its reference)."""

    kind = CHRF

    def __init__(self, cache_size: int = 100_000):
        self.metric = make_metric("chrf")
        self._grams: dict[str, tuple[list, list[int]]] = {}
        self.cache_size = cache_size

    def _stats(self, text: str) -> tuple[list, list[int]]:
        got = self._grams.get(text)
        if got is None:
            if len(self._grams) >= self.cache_size:
                self._grams.clear()
            grams = _ngrams(self.metric, text)
            got = self._grams[text] = (grams, [sum(g.values()) for g in grams])
        return got

    def score(self, src: Sequence[str], mt: Sequence[str], ref: Sequence[str] | None = None) -> list[float]:
        if ref is None:
            raise QeebmError("the chrF++ reward reads a reference for every translation; none was given")
        if not len(src) == len(mt) == len(ref):
            raise QeebmError(f"chrF++ inputs differ in length: src {len(src)}, mt {len(mt)}, ref {len(ref)}")
        out = []
        for h, r in zip(mt, ref):
            (hg, ht), (rg, rt) = self._stats(h), self._stats(r)
            stats = []
            for o, (a, b) in enumerate(zip(hg, rg)):
                # sacrebleu counts no hypothesis n-grams of an order the reference lacks
                stats += [ht[o] if rt[o] else 0, rt[o], _matches(a, b)]
            out.append(self.metric._compute_f_score(stats) / 100)
        return out


class CometUtility:
    """A reference-based COMET as MBR utility: U[i, j] = COMET(src, candidate i, ref = candidate j).
    All pairs of all sources go to the scorer in one call: a QEScorer encodes each distinct
    sentence once and runs the estimator on the gathered embeddings."""

    def __init__(self, scorer):
        self.scorer = scorer

    def matrices(self, src: Sequence[str], cands: Sequence[Sequence[str]]) -> list[np.ndarray]:
        s, h, r = [], [], []
        for x, c in zip(src, cands):
            for hyp in c:
                s += [x] * len(c)
                h += [hyp] * len(c)
                r += list(c)
        flat = np.asarray(self.scorer.score(s, h, r), dtype=np.float64)
        out, start = [], 0
        for c in cands:
            n = len(c)
            out.append(flat[start:start + n * n].reshape(n, n))
            start += n * n
        return out


def utility_signature(model: Optional[str]) -> str:
    """An MBR utility as signatures name it: chrF++ with sacrebleu's signature, or the COMET model."""
    return f"chrf[{metric_signature('chrf')}]" if not model else f"comet[{model}]"


# ----------------------------------------------------------------------------------------------
# What --rerank / --mbr ask for


def _load_scorer(model: str, device, batch_size: int):
    from qeebm.qe.models import load_qe
    from qeebm.qe.scoring import QEScorer

    return QEScorer(load_qe(model).to(device), batch_size=batch_size)


@dataclass
class Selection:
    """A selection rule with its candidates.

    ``rule``: "rerank" or "mbr". ``model``: for rerank the reference-free QE (a comet directory or
    hub id); for mbr None (chrF++ utility) or a reference-based COMET. ``candidates``: N per
    source; ``mode``: "beam" or "sample" (``candidate_generation``)."""

    rule: str
    model: Optional[str] = None
    candidates: int = DEFAULT_CANDIDATES
    mode: str = "beam"
    batch_size: int = 64

    def check(self) -> "Selection":
        if self.rule not in SELECTION_RULES:
            raise QeebmError(f"selection rule must be one of {', '.join(SELECTION_RULES)}; got {self.rule!r}")
        if self.mode not in CANDIDATE_MODES:
            raise QeebmError(f"candidate mode must be one of {', '.join(CANDIDATE_MODES)}; got {self.mode!r}")
        if self.candidates < 1:
            raise QeebmError(f"--candidates must be at least 1; got {self.candidates}")
        if self.rule == "rerank" and not self.model:
            raise QeebmError("reranking needs a QE model (--rerank MODEL)")
        return self

    @property
    def utility(self) -> Optional[str]:
        """The MBR utility's name: chrf, or the COMET model; None for reranking."""
        if self.rule != "mbr":
            return None
        return self.model or CHRF

    def generation(self, gen: GenerationConfig) -> GenerationConfig:
        return candidate_generation(gen, self.candidates, self.mode)

    def selector(self, device=None, scorer=None) -> Callable[[Sequence[str], Sequence[Sequence[str]]], Choice]:
        """``select(src, cands) -> Choice``, loading the QE or COMET model now (on ``device``) unless
        ``scorer`` is given. A model of the wrong kind is a one-line error."""
        self.check()
        if self.rule == "mbr" and not self.model:
            utility = ChrfUtility()
            return lambda src, cands: mbr(utility, src, cands)
        if scorer is None:
            import torch

            scorer = _load_scorer(self.model, device or torch.device("cpu"), self.batch_size)
        kind = getattr(scorer, "kind", "kiwi" if self.rule == "rerank" else "comet")
        if self.rule == "rerank":
            if kind == "comet":
                raise QeebmError(f"--rerank needs a reference-free QE (CometKiwi); {self.model} is a "
                                 "reference-based COMET: use it as an MBR utility (--mbr MODEL)")
            return lambda src, cands: rerank(scorer, src, cands)
        if kind == "kiwi":
            raise QeebmError(f"--mbr needs a utility that reads a reference (chrf, COMET); {self.model} is a "
                             "reference-free QE: rerank with it instead (--rerank MODEL)")
        utility = CometUtility(scorer)
        return lambda src, cands: mbr(utility, src, cands)

    def signature(self, gen: GenerationConfig) -> str:
        """The selection, as the report's ``signatures.selection`` names it."""
        g = self.generation(gen)
        if g.do_sample:
            how = f"sample|t:{g.temperature}|top_k:{g.top_k}|top_p:{g.top_p}|eps:{g.epsilon}"
        else:
            how = f"beam{g.num_beams}"
        what = f"qe:{self.model}" if self.rule == "rerank" else f"utility:{utility_signature(self.model)}"
        return f"rule:{self.rule}|{what}|candidates:{self.candidates}|gen:{how}|max_new:{g.max_new_tokens}"

    def describe(self) -> str:
        by = f"the QE {self.model}" if self.rule == "rerank" else f"MBR, utility {self.utility}"
        return f"{by} over {self.candidates} {self.mode} candidates"


def select(selection: Selection, src: Sequence[str], cands: Sequence[Sequence[str]], device=None,
           scorer=None) -> tuple[Choice, float]:
    """(the choice, seconds spent loading the model and scoring); the model is freed after."""
    start = time.perf_counter()
    choose = selection.selector(device, scorer)
    choice = choose(src, cands)
    del choose
    gc.collect()
    return choice, time.perf_counter() - start


def selection_report(selection: Selection, gen: GenerationConfig, choice: Choice, generate_s: float,
                     select_s: float) -> dict:
    """What an evaluation report records about the selection (``report["selection"]``), with its
    cost: candidates x (generation + scoring) per segment."""
    n = max(len(choice.index), 1)
    info = {
        "rule": selection.rule,
        "model": selection.model if selection.rule == "rerank" else None,
        "utility": selection.utility,
        "candidates": selection.candidates,
        "mode": selection.mode,
        "signature": selection.signature(gen),
        "changed": round(choice.changed, 4),
        "seconds": {"generate": round(generate_s, 3), "select": round(select_s, 3)},
        "ms_per_segment": round(1000 * (generate_s + select_s) / n, 2),
    }
    log.info("%s: %d segments x %d candidates: generation %.1f s, selection %.1f s (%.1f ms a segment); "
             "%.0f%% of the choices differ from the first candidate", selection.describe(), n,
             selection.candidates, generate_s, select_s, info["ms_per_segment"], 100 * choice.changed)
    return info


def decode_and_select(load_translator: Callable[[], object], src: Sequence[str], gen: GenerationConfig,
                      selection: Selection, device=None) -> tuple[list[str], dict]:
    """Candidates from the translator ``load_translator()`` returns, then the selection; returns
    (hypotheses, the report's selection record). The translator is dropped before the QE or COMET
    model is loaded, so a loader that builds it leaves one model in memory at a time."""
    selection.check()
    translator = load_translator()
    start = time.perf_counter()
    cands = generate_candidates(translator, src, selection.generation(gen), selection.candidates)
    generate_s = time.perf_counter() - start
    del translator
    gc.collect()
    choice, select_s = select(selection, src, cands, device)
    return choice.hyps, selection_report(selection, gen, choice, generate_s, select_s)


def selection_from_args(args, models: dict) -> Optional[Selection]:
    """The Selection of ``--rerank [QE]`` / ``--mbr [UTILITY]`` / ``--candidates N`` / ``--sample``
    (``qeebm translate`` and ``qeebm evaluate``), or None. A QE or utility given by a name in
    ``models`` (kiwi, comet, a judge's name) means that model; anything else is a directory or hub
    id; ``--mbr chrf`` (the default) is chrF++."""
    if args.rerank is not None and args.mbr is not None:
        raise QeebmError("give --rerank or --mbr, not both: each is a way to choose among the candidates")
    if args.rerank is None and args.mbr is None:
        if args.candidates is not None:
            raise QeebmError("--candidates needs a selection rule: --rerank [QE] or --mbr [UTILITY]")
        return None
    rule, name = ("rerank", args.rerank) if args.rerank is not None else ("mbr", args.mbr)
    model = None if rule == "mbr" and name == CHRF else str(models.get(name, name))
    candidates = DEFAULT_CANDIDATES if args.candidates is None else args.candidates
    return Selection(rule, model, candidates=candidates, mode="sample" if args.sample else "beam").check()


def check_selection_model(selection: Optional[Selection]) -> None:
    """Find the selection's QE or COMET checkpoint now, before anything is translated."""
    if selection is not None and selection.model:
        from qeebm.qe.models import resolve_checkpoint

        resolve_checkpoint(selection.model)
