"""``qeebm qe-check``: will training against this QE help this pair? A report before any GPU time.

What decided, in the tiny world, whether training against a QE helps (docs/qe-check.md):

* **ranking**: whether the QE ranks the translator's own candidates for one source as a
  reference-based quality does. K samples (QE-EBM's sampler: ancestral, temperature 1) and the beam
  output of every dev source: Pearson and Spearman with sentence chrF++ (and a reference-based
  COMET when given) over all of them, the mean within-source correlation over each source's K
  samples (the signal QE-EBM's gradient and REINFORCE's leave-one-out baseline use), how often the
  QE puts the reference above the samples, and what picking the QE's favourite of the K samples
  gains over a random one, as a share of what the best one (the oracle) would gain;
* **blind spots**: how often the QE prefers the reference over each degraded version of it
  (``qeebm.qe.degrade``: doubled, over-long, repeated n-grams, truncated, the source copied,
  another script, empty), and whether the reward-hacking guard for that kind catches it;
* **calibration**: quality against QE score in equal-count bins (a reliability plot), the error
  left after the best monotone map from score to quality, the share of that error that is a
  per-source offset, and the quality a score difference buys within one source against across
  sources;
* **hackability** (optional, ``qeebm.analysis.probe``): a short energy-only QE-EBM run on the dev sources.

``measure`` computes all of it from the candidates (``make_candidates``) and a QE's scores of them
(``score_candidates``), so several QEs can be judged on the same candidates; ``run`` is the command.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from qeebm.config import CorpusConfig, GenerationConfig, ModelConfig, SamplingConfig
from qeebm.data.corpus import read_corpus
from qeebm.errors import QeebmError
from qeebm.evaluation.plots import plot_qe_check
from qeebm.guards import GuardConfig, check
from qeebm.methods.sampling import sampling_config
from qeebm.metrics.sacrebleu import make_metric
from qeebm.qe.degrade import DEGRADATIONS, degrade_all
from qeebm.qe.scoring import QEScorer
from qeebm.qe.tiny import pearson, spearman
from qeebm.translation.qad import generate_candidates
from qeebm.translation.translator import Translator

log = logging.getLogger(__name__)

DEFAULT_SAMPLES = 8
DEFAULT_MAX_SENTENCES = 500
CALIBRATION_BINS = 10


# ----------------------------------------------------------------------------------------------
# Candidates and their scores


@dataclass
class Candidates:
    """What the translator makes of N dev sources, with the references and their degradations.

    ``samples``: N lists of K sampled translations; ``beam``: N beam outputs; ``degraded``: kind ->
    N degraded references (``qeebm.qe.degrade.degrade_all``); ``info``: how they were made."""

    src: list[str]
    ref: list[str]
    samples: list[list[str]]
    beam: list[str]
    degraded: dict[str, list[str]]
    info: dict = field(default_factory=dict)

    @property
    def k(self) -> int:
        return len(self.samples[0]) if self.samples else 0


def _one_line(text: str) -> str:
    return " ".join(text.split())


@torch.no_grad()
def make_candidates(translator, src: Sequence[str], ref: Sequence[str], k: int = DEFAULT_SAMPLES, beams: int = 5,
                    max_new_tokens: int = 50, batch_size: int = 32, seed: int = 0) -> Candidates:
    """K samples of each source as QE-EBM draws them (ancestral, temperature 1, no top-k/top-p:
    ``methods.sampling.sampling_config``), its beam output, and the degraded references; the
    sampling is seeded and leaves torch's global generator as it was."""

    if k < 3:
        raise QeebmError(f"qe-check needs at least 3 samples per source to rank them; got {k}")
    if len(src) != len(ref) or not src:
        raise QeebmError(f"qe-check needs dev sources with one reference each; got {len(src)} and {len(ref)}")
    # batch_size counts sequences: a sampling batch holds batch_size // k sources
    sampling = dataclasses.replace(sampling_config(SamplingConfig(num_samples=k, max_new_tokens=max_new_tokens)),
                                   batch_size=max(1, batch_size // k))
    beam = GenerationConfig(num_beams=beams, max_new_tokens=max_new_tokens, batch_size=batch_size)
    with torch.random.fork_rng(devices=[translator.device] if translator.device.type == "cuda" else []):
        torch.manual_seed(seed)
        samples = generate_candidates(translator, list(src), sampling, k)
    beam_out = [_one_line(h) for h in translator.generate(list(src), beam)]
    ref = [_one_line(r) for r in ref]
    info = {"samples": k, "sampling": "ancestral, temperature 1", "beams": beams, "max_new_tokens": max_new_tokens,
            "seed": seed}
    return Candidates(list(src), ref, samples, beam_out, degrade_all(list(src), ref, seed), info)


@dataclass
class Scores:
    """A score of every candidate: ``samples`` [N, K], ``beam`` and ``ref`` [N], ``degraded`` kind -> [N]."""

    samples: np.ndarray
    beam: np.ndarray
    ref: np.ndarray
    degraded: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def outputs(self) -> np.ndarray:
        """[N, K + 1]: each source's samples and its beam output."""
        return np.concatenate([self.samples, self.beam[:, None]], axis=1)


def score_candidates(c: Candidates, score: Callable[[list[str], list[str], list[str]], list[float]]) -> Scores:
    """Every candidate scored in one call of ``score(src, mt, ref)``, so a cached scorer scores a
    text repeated among the samples once."""
    n, k = len(c.src), c.k
    src, mt, ref = [], [], []
    for i in range(n):
        texts = c.samples[i] + [c.beam[i], c.ref[i]] + [c.degraded[kind][i] for kind in c.degraded]
        src += [c.src[i]] * len(texts)
        ref += [c.ref[i]] * len(texts)
        mt += texts
    flat = np.asarray(score(src, mt, ref), dtype=np.float64).reshape(n, -1)
    return Scores(samples=flat[:, :k], beam=flat[:, k], ref=flat[:, k + 1],
                  degraded={kind: flat[:, k + 2 + j] for j, kind in enumerate(c.degraded)})


def qe_score_fn(scorer) -> Callable:
    """``score(src, mt, ref)`` of a QE under test (a ``QEScorer``): CometKiwi and XCOMET score as
    QEs, without the reference; a reference-based COMET cannot do without it."""
    uses_ref = scorer.kind == "comet"
    return lambda src, mt, ref: scorer.score(src, mt, ref if uses_ref else None)


def reference_score_fn(scorer) -> Callable:
    """``score(src, mt, ref)`` of a reference-based quality model (COMET, or XCOMET with references)."""
    if scorer.kind == "kiwi":
        raise QeebmError("the reference-based quality model (--comet) is a reference-free CometKiwi; pass a "
                         "reference-based COMET or XCOMET")
    return lambda src, mt, ref: scorer.score(src, mt, ref)


def chrf_scores(src: list[str], mt: list[str], ref: list[str]) -> list[float]:
    """Sentence chrF++ (sacrebleu's defaults, as ``qeebm evaluate`` computes corpus chrF++)."""

    metric = make_metric("chrf")
    return [metric.sentence_score(m, [r]).score for m, r in zip(mt, ref)]


def text_score_fn(fn: Callable[[str, str], float]) -> Callable:
    """``score(src, mt, ref)`` of a quality that reads only the translation and its reference."""
    return lambda src, mt, ref: [fn(m, r) for m, r in zip(mt, ref)]


def target_scores(c: Candidates, score: Callable) -> Scores:
    """A reference-based quality of the translator's outputs only (samples and beam; the reference
    and its degradations are what the QE is compared on, not what the quality needs to rate)."""
    n, k = len(c.src), c.k
    src = [c.src[i] for i in range(n) for _ in range(k + 1)]
    ref = [c.ref[i] for i in range(n) for _ in range(k + 1)]
    mt = [t for i in range(n) for t in c.samples[i] + [c.beam[i]]]
    flat = np.asarray(score(src, mt, ref), dtype=np.float64).reshape(n, k + 1)
    return Scores(samples=flat[:, :k], beam=flat[:, k], ref=np.full(n, np.nan))


# ----------------------------------------------------------------------------------------------
# Ranking


def per_source(scores, quality, groups, corr: Callable = pearson, min_size: int = 3) -> list[float]:
    """``corr`` between a QE's scores and the quality within each group (one source's candidates),
    in order of first appearance; groups of fewer than ``min_size`` members, or with no spread on
    either side, are left out."""
    by: dict = {}
    for s, q, g in zip(scores, quality, groups):
        by.setdefault(g, []).append((s, q))
    values = []
    for members in by.values():
        if len(members) < min_size:
            continue
        x, y = zip(*members)
        if np.std(x) > 0 and np.std(y) > 0:
            values.append(corr(x, y))
    return values


def within_source(scores, quality, groups, corr: Callable = pearson, min_size: int = 3) -> float:
    """The mean of ``per_source``: the within-source correlation (nan when no group counts)."""
    values = per_source(scores, quality, groups, corr, min_size)
    return float(np.mean(values)) if values else float("nan")


def ranking(qe: Scores, target: Scores) -> dict:
    """How the QE ranks the translator's outputs against one reference-based quality."""
    n, k = qe.samples.shape
    groups = np.repeat(np.arange(n), k)
    x, y = qe.outputs.ravel(), target.outputs.ravel()
    ranks = per_source(qe.samples.ravel(), target.samples.ravel(), groups, spearman)
    return {
        "pearson": pearson(x, y),
        "spearman": spearman(x, y),
        "within_source_spearman": float(np.mean(ranks)) if ranks else float("nan"),
        # its standard error over sources (each source's value carries its own samples' noise too)
        "within_source_spearman_se": (float(np.std(ranks, ddof=1) / math.sqrt(len(ranks))) if len(ranks) > 1
                                      else float("nan")),
        "within_source_pearson": within_source(qe.samples.ravel(), target.samples.ravel(), groups, pearson),
        "sources_with_spread": len(ranks),
    }


def reranking(qe: Scores, target: Scores) -> dict:
    """The quality of one of each source's K samples, chosen at random (its expectation: the mean),
    by the QE (its highest score, ties to the first) and by an oracle (the best); the beam output's;
    and the QE's gain over random as a share of the oracle's."""
    pick = qe.samples.argmax(axis=1)
    chosen = target.samples[np.arange(len(pick)), pick]
    random_, qe_, oracle = float(target.samples.mean()), float(chosen.mean()), float(target.samples.max(axis=1).mean())
    headroom = oracle - random_
    return {"random": random_, "qe": qe_, "oracle": oracle, "beam": float(target.beam.mean()),
            "gain_over_random": qe_ - random_,
            "share_of_oracle_gain": (qe_ - random_) / headroom if headroom > 0 else float("nan")}


def reference_above_samples(qe: Scores) -> float:
    """Share of (reference, sample) pairs of a source whose reference the QE scores strictly above
    the sample (``qeebm.qe.heldout.ref_above_rate``'s rule)."""
    return float((qe.ref[:, None] > qe.samples).mean())


# ----------------------------------------------------------------------------------------------
# Blind spots


def blind_spots(c: Candidates, qe: Scores) -> dict:
    """For each degradation: over the pairs where it changed the reference, the share whose
    reference the QE scores strictly above the degraded version (``prefers_reference``; a tie counts
    against the QE, as in ``tinyworld.judged.report``), and the mean score margin."""
    out = {}
    for kind, texts in c.degraded.items():
        rows = [i for i, (d, r) in enumerate(zip(texts, c.ref)) if d.strip() != r.strip()]
        if not rows:
            out[kind] = {"rows": 0, "prefers_reference": float("nan"), "margin": float("nan")}
            continue
        ref, bad = qe.ref[rows], qe.degraded[kind][rows]
        out[kind] = {"rows": len(rows), "prefers_reference": float(np.mean(ref > bad)),
                     "margin": float(np.mean(ref - bad))}
    return out


def guard_coverage(c: Candidates, guards, tgt_lang: str, src_lang: str, count_tokens=None) -> dict:
    """For each degradation, the share of its (changed) rows that the guard meant for it
    (``qeebm.qe.degrade.DEGRADATIONS``) flags; and for each guard, how often it flags a reference
    (a false alarm). ``guards``: a ``qeebm.guards.GuardConfig``; a guard it disables, or one that
    cannot run for this language, is reported as None."""

    cfg = dataclasses.replace(guards, language_id=False)
    try:
        ref_hits = check(c.src, c.ref, cfg, tgt_lang=tgt_lang, src_lang=src_lang, count_tokens=count_tokens).hits
    except QeebmError as err:
        if "script" not in str(err):
            raise
        log.warning("guard 'script' left out: %s", err)
        cfg = dataclasses.replace(cfg, script=False)
        ref_hits = check(c.src, c.ref, cfg, tgt_lang=tgt_lang, src_lang=src_lang, count_tokens=count_tokens).hits
    out = {"false_alarm_on_references": {g: float(np.mean(h)) for g, h in ref_hits.items()}, "catches": {}}
    for kind, texts in c.degraded.items():
        guard = DEGRADATIONS.get(kind)
        rows = [i for i, (d, r) in enumerate(zip(texts, c.ref)) if d.strip() != r.strip()]
        if guard not in ref_hits or not rows:
            out["catches"][kind] = None
            continue
        hits = check([c.src[i] for i in rows], [texts[i] for i in rows], cfg, tgt_lang=tgt_lang, src_lang=src_lang,
                     count_tokens=count_tokens).hits
        out["catches"][kind] = float(np.mean(hits[guard]))
    return out


# ----------------------------------------------------------------------------------------------
# Calibration


def isotonic(x, y) -> np.ndarray:
    """The least-squares non-decreasing fit of ``y`` on ``x`` (pool adjacent violators), at each
    point; equal ``x`` get equal fitted values."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order]
    # blocks of [sum, count, first index]; tied x start as one block
    blocks: list[list[float]] = []
    start = 0
    for end in range(1, len(xs) + 1):
        if end == len(xs) or xs[end] != xs[start]:
            blocks.append([float(ys[start:end].sum()), float(end - start), start])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                s, n, _ = blocks.pop()
                blocks[-1][0] += s
                blocks[-1][1] += n
            start = end
    fitted = np.empty_like(ys)
    for j, (s, n, first) in enumerate(blocks):
        last = blocks[j + 1][2] if j + 1 < len(blocks) else len(ys)
        fitted[int(first):int(last)] = s / n
    out = np.empty_like(fitted)
    out[order] = fitted
    return out


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    dx = x - x.mean()
    den = float(dx @ dx)
    return float(dx @ (y - y.mean())) / den if den > 0 else float("nan")


def calibration(qe: Scores, target: Scores, bins: int = CALIBRATION_BINS) -> dict:
    """Quality against QE score over the translator's outputs: equal-count bins of the score (with
    the best monotone map's mean in each), that map's RMSE and R^2, the share of its squared error
    that is a per-source offset (``1 / (K + 1)`` is what independent errors give), and the
    least-squares slope of quality on score across all outputs and within sources (each source's
    mean removed): a ratio below 1 means a score difference between one source's candidates buys
    less quality than the same difference across sources."""
    x, y = qe.outputs, target.outputs  # [N, K + 1]
    fx, fy = x.ravel(), y.ravel()
    fit = isotonic(fx, fy)
    order = np.argsort(fx, kind="stable")
    table = []
    for idx in np.array_split(order, min(bins, len(order))):
        table.append({"qe_low": float(fx[idx].min()), "qe_high": float(fx[idx].max()), "qe_mean": float(fx[idx].mean()),
                      "quality_mean": float(fy[idx].mean()), "quality_sd": float(fy[idx].std()),
                      "monotone_mean": float(fit[idx].mean()), "n": int(len(idx))})
    resid = (fy - fit).reshape(x.shape)
    sse, var = float((resid ** 2).sum()), float(((fy - fy.mean()) ** 2).sum())
    offsets = resid.mean(axis=1)
    within_x, within_y = (x - x.mean(axis=1, keepdims=True)).ravel(), (y - y.mean(axis=1, keepdims=True)).ravel()
    overall, within = _slope(fx, fy), _slope(within_x, within_y)
    return {
        "bins": table,
        "monotone_rmse": math.sqrt(sse / fy.size),
        "monotone_r2": 1 - sse / var if var > 0 else float("nan"),
        "source_offset_share": float((offsets ** 2).sum() * x.shape[1] / sse) if sse > 0 else float("nan"),
        "source_offset_share_if_independent": 1 / x.shape[1],
        "slope_overall": overall,
        "slope_within_source": within,
        "slope_ratio": within / overall if overall and not math.isnan(overall) else float("nan"),
    }


# ----------------------------------------------------------------------------------------------
# Everything about one QE


def measure(c: Candidates, qe: Scores, targets: dict[str, Scores], guards: Optional[dict] = None) -> dict:
    """The report's measurements of one QE (its ``Scores`` of ``c``) against each reference-based
    quality in ``targets`` (name -> ``target_scores``); ``guards``: ``guard_coverage``'s result."""
    spots = blind_spots(c, qe)
    if guards is not None:
        for kind, row in spots.items():
            row["guard"] = DEGRADATIONS.get(kind)
            row["guard_catches"] = guards["catches"].get(kind)
    return {
        "sources": len(c.src),
        "samples_per_source": c.k,
        "reference_above_samples": reference_above_samples(qe),
        "score_spread_within_source": float(qe.samples.std(axis=1).mean()),
        "ranking": {name: ranking(qe, t) for name, t in targets.items()},
        "reranking": {name: reranking(qe, t) for name, t in targets.items()},
        "blind_spots": spots,
        "calibration": {name: calibration(qe, t) for name, t in targets.items()},
    }


# ----------------------------------------------------------------------------------------------
# The verdict. Thresholds from the tiny world's measurements (docs/qe-check.md shows them): change
# them there and here together, when a study moves them.

# Mean within-source Spearman with chrF++, K = 8, the tiny world's 300 dev sentences, three sampling
# seeds: the weak, medium and strong tiny Kiwis measure 0.15, 0.16 and 0.23 (+-0.02), the judge 0.19,
# the reference-based COMET 0.48. Trained against, none of the Kiwis made QE-EBM or REINFORCE beat SFT
# on BLEU or chrF++ (the weak one cost QE-EBM 1.6 BLEU), while every run raised the held-out judge; no
# run has trained against a QE above 0.30, and none below the weak Kiwi.
RANKING_WEAK = 0.10
RANKING_MEASURED = 0.30
# A kind of degradation the QE fails to rank below the reference in at least this share of pairs
# needs its guard: the one rate measured to be found by an optimiser is the strong tiny Kiwi's 10-13%
# of over-long references (energy-only training found length within 50 steps); this leaves a margin.
BLIND_SPOT_FAILURES = 0.05
# A guard that flags fewer of a needed kind's pairs than this leaves the blind spot open (a convention).
GUARD_CATCHES = 0.9
# The probe flags the QE as hackable when its samples' score rose while dev chrF++ fell this many
# points below the start (a convention: energy-only runs on the strong tiny Kiwi fell 26-29 points).
PROBE_CHRF_DROP = 1.0
RANKING_TARGET = "chrf"  # the verdict's quality: the one every pair has

THRESHOLDS = {"ranking_weak": RANKING_WEAK, "ranking_measured": RANKING_MEASURED,
              "blind_spot_failures": BLIND_SPOT_FAILURES, "guard_catches": GUARD_CATCHES,
              "probe_chrf_drop": PROBE_CHRF_DROP}


def verdict(m: dict, probe: Optional[dict] = None) -> dict:
    """What ``measure``'s result (and the probe's, if run) says about training against the QE:
    ``level`` ("weak", "limited", "strong" or "unknown") from the within-source ranking, the guards
    the blind spots call for (``guards_needed``), the blind spots no guard covers (``open``), whether
    the probe found a way to raise the QE while chrF++ fell (``hackable``, None without a probe),
    and the findings in words."""
    ranking_ = m["ranking"][RANKING_TARGET]
    rank, se = ranking_["within_source_spearman"], ranking_.get("within_source_spearman_se")
    findings = []
    if rank is None or math.isnan(rank):
        level = "unknown"
        findings.append("no source's samples differ in both QE score and chrF++: the within-source ranking "
                        "cannot be judged (sample more, or at a higher temperature)")
    else:
        half = 1.96 * se if se is not None and not math.isnan(se) else float("nan")
        said = f"within-source ranking {rank:.2f} +- {half:.2f}"
        if rank < RANKING_WEAK:
            level = "weak"
            findings.append(f"{said}, below {RANKING_WEAK}: weaker than every QE the tiny world trained against (its "
                            "weakest Kiwi measures 0.15 and cost QE-EBM 1.6 BLEU against SFT)")
        elif rank < RANKING_MEASURED:
            level = "limited"
            findings.append(f"{said}, in the range of the tiny world's Kiwis ({RANKING_WEAK}-{RANKING_MEASURED}): "
                            "trained against, they raised the held-out judge but never BLEU or chrF++ over SFT")
        else:
            level = "strong"
            findings.append(f"{said}, at least {RANKING_MEASURED}: stronger than any QE the tiny world trained against "
                            "(its reference-based COMET measures 0.48); whether that turns into reference-metric "
                            "gains is not measured yet")
        if any(rank - half < t <= rank + half for t in (RANKING_WEAK, RANKING_MEASURED)):
            findings[-1] += "; the interval crosses a threshold: more sentences or samples would settle the level"
    needed, open_ = [], []
    for kind, row in m["blind_spots"].items():
        fails = 1 - row["prefers_reference"] if row["rows"] else float("nan")
        if not fails >= BLIND_SPOT_FAILURES:
            continue
        guard = row.get("guard")
        catches = row.get("guard_catches")
        if guard not in needed:
            needed.append(guard)
        text = f"{kind}: the QE prefers it over the reference in {100 * fails:.0f}% of pairs"
        if catches is None:
            open_.append(kind)
            findings.append(f"{text}, and its guard ({guard}) cannot run here")
        elif catches < GUARD_CATCHES:
            open_.append(kind)
            findings.append(f"{text}, and the {guard} guard catches only {100 * catches:.0f}% of them")
        else:
            findings.append(f"{text}; the {guard} guard catches {100 * catches:.0f}% of them")
    hackable = None
    if probe is not None:
        rise, fall = probe["qe_rise"], probe["chrf_fall"]
        lengths = probe["sample_length_ratio"]
        said = (f"probe: {probe['samples_drawn']} samples of energy-only QE-EBM raised the samples' QE score by "
                f"{rise:+.3f} (running mean) while dev chrF++ fell by up to {fall:.1f} and the samples grew from "
                f"{lengths['start']:.2f} to at most {lengths['max']:.2f} times the source's length")
        if fall < PROBE_CHRF_DROP:
            hackable = False
        elif rise > 0:
            hackable = True
            said += " (hackable: the QE rose while the translation got worse)"
        else:
            said += " (inconclusive: the QE did not rise; fewer steps or a lower --probe-lr would tell)"
        findings.append(said)
    return {"level": level, "within_source_spearman": rank, "guards_needed": needed, "open": open_,
            "hackable": hackable, "findings": findings}


# ----------------------------------------------------------------------------------------------
# The command


def _device(device: Optional[str]) -> torch.device:
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _same_model(a: str, b: str) -> bool:
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return (pa.exists() and pb.exists() and pa.resolve() == pb.resolve()) or a == b


def run(qe: str, translator: str, dev: str, out: str | Path, *, src_lang: str = "eng_Latn", tgt_lang: str = "khk_Cyrl",
        comet: Optional[str] = None, samples: int = DEFAULT_SAMPLES, max_sentences: int = DEFAULT_MAX_SENTENCES,
        beams: int = 5, max_new_tokens: int = 50, batch_size: int = 32, qe_batch_size: int = 64, seed: int = 0,
        device: Optional[str] = None, guards=None, probe_steps: int = 0, probe_batch: int = 16,
        probe_samples: int = 5, probe_lr: float = 3e-4) -> dict:
    """``qeebm qe-check``: candidates of the first ``max_sentences`` pairs of ``dev`` (0: all) from
    ``translator``, scored by ``qe``, measured against sentence chrF++ and, if given, the
    reference-based ``comet``; the hackability probe with ``probe_steps`` > 0. Writes
    ``OUT/qe_check.json``, ``OUT/qe_check.md`` and the plots; returns the JSON's content."""
    from qeebm.qe.models import load_qe

    if max_sentences < 0:
        raise QeebmError(f"--max-sentences must be >= 0 (0: all); got {max_sentences}")
    if probe_steps < 0:
        raise QeebmError(f"--probe-steps must be >= 0; got {probe_steps}")
    corpus = read_corpus(CorpusConfig(path=str(dev), max_examples=max_sentences), "dev", need_target=True)
    out = Path(out)
    dev_, seconds = _device(device), {}
    t = time.perf_counter()
    tr = Translator.load(ModelConfig(name_or_path=translator, src_lang=src_lang, tgt_lang=tgt_lang)).to(dev_)
    tr.model.eval()
    c = make_candidates(tr, corpus.src, corpus.tgt, k=samples, beams=beams, max_new_tokens=max_new_tokens,
                        batch_size=batch_size, seed=seed)
    seconds["translate"] = time.perf_counter() - t
    coverage = guard_coverage(c, guards or GuardConfig(), tgt_lang=tgt_lang, src_lang=src_lang,
                              count_tokens=tr.num_tokens)
    del tr
    _free(dev_)

    t = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        qe_model = load_qe(qe).to(dev_)
    scorer = QEScorer(qe_model, batch_size=qe_batch_size)
    if probe_steps and scorer.kind != "kiwi":
        raise QeebmError(f"--probe-steps: the probe trains against the QE's energy, which needs a reference-free "
                         f"CometKiwi; {qe} is a {scorer.kind} model")
    qe_scores, kind = score_candidates(c, qe_score_fn(scorer)), scorer.kind
    seconds["qe"] = time.perf_counter() - t
    del qe_model, scorer
    _free(dev_)

    t = time.perf_counter()
    targets = {"chrf": target_scores(c, chrf_scores)}
    notes = []
    if comet is not None and _same_model(comet, qe):
        notes.append(f"--comet {comet} is the QE under test: it is not measured against itself")
    elif comet is not None:
        with torch.random.fork_rng(devices=[]):
            comet_model = load_qe(comet).to(dev_)
        targets["comet"] = target_scores(c, reference_score_fn(QEScorer(comet_model, batch_size=qe_batch_size)))
        del comet_model
        _free(dev_)
    seconds["quality"] = time.perf_counter() - t

    m = measure(c, qe_scores, targets, coverage)
    probe = None
    if probe_steps:
        from qeebm.analysis.probe import hackability_probe

        t = time.perf_counter()
        probe = hackability_probe(qe, translator, str(dev), src_lang, tgt_lang, out / "probe", steps=probe_steps,
                                  sources=len(c.src), batch=probe_batch, k=probe_samples, lr=probe_lr,
                                  seed=seed, device=device)
        seconds["probe"] = time.perf_counter() - t
    result = {
        "qe": qe, "translator": translator, "dev": str(dev), "src_lang": src_lang, "tgt_lang": tgt_lang,
        "comet": comet, "qe_kind": kind, "candidates": c.info, "device": str(dev_),
        "measurements": m, "guards": coverage, "probe": probe, "verdict": verdict(m, probe),
        "thresholds": THRESHOLDS, "notes": notes, "seconds": seconds,
    }
    write(result, out)
    return result


# ----------------------------------------------------------------------------------------------
# The report


def _plain(value):
    """JSON-safe: NaN and infinities as null, numpy numbers as Python ones."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def _f(x, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _pct(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


QUALITY_LABELS = {"chrf": "chrF++", "comet": "COMET (reference-based)"}


def format_markdown(result: dict, plots: Sequence[Path] = ()) -> str:
    """The short report: the verdict, then each section's table."""
    m, v = result["measurements"], result["verdict"]
    info = result["candidates"]
    lines = [f"# qe-check: {result['qe']} ({result['qe_kind']}) on {result['translator']}", "",
             f"{m['sources']} sources of {result['dev']} ({result['src_lang']} -> {result['tgt_lang']}), "
             f"{info['samples']} samples each ({info['sampling']}) and the beam output (beam {info['beams']}).", "",
             f"**Ranking: {v['level']}.** " + " ".join(f + "." for f in v["findings"][:1]), ""]
    if v["guards_needed"]:
        lines.append("**Guards this QE needs:** " + ", ".join(v["guards_needed"])
                     + (f"; **open blind spots:** {', '.join(v['open'])}" if v["open"] else "") + ".")
    else:
        lines.append("**Guards this QE needs:** none (it prefers the reference over every degradation in at least "
                     f"{_pct(1 - THRESHOLDS['blind_spot_failures'])} of pairs).")
    if result.get("probe"):
        said = {True: "hackable", False: "not hackable in this probe", None: "inconclusive"}[v["hackable"]]
        lines.append(f"**Hackability probe:** {said}.")
    lines += [""] + [f"- {f}" for f in v["findings"][1:]] + [""]
    lines += ["## Ranking the translator's outputs", "",
              "| against | Pearson | Spearman | within-source Spearman | within-source Pearson | chosen of K: random / QE / oracle "
              "(beam) | QE's share of the oracle's gain |", "|:--|--:|--:|--:|--:|:--|--:|"]
    for name, r in m["ranking"].items():
        rr = m["reranking"][name]
        d = 1 if name == "chrf" else 3
        lines.append(f"| {QUALITY_LABELS.get(name, name)} | {_f(r['pearson'])} | {_f(r['spearman'])} | "
                     f"{_f(r['within_source_spearman'])} | {_f(r['within_source_pearson'])} | {_f(rr['random'], d)} / "
                     f"{_f(rr['qe'], d)} / {_f(rr['oracle'], d)} ({_f(rr['beam'], d)}) | {_f(rr['share_of_oracle_gain'], 2)} |")
    lines += ["", f"Within-source: the mean over sources of the correlation across each source's {info['samples']} samples "
              f"({m['ranking']['chrf']['sources_with_spread']} sources had a spread on both sides). The QE scores the "
              f"reference above the samples in {_pct(m['reference_above_samples'])} of pairs; its scores spread "
              f"{_f(m['score_spread_within_source'], 4)} (sd) within a source.", "",
              "## Blind spots: does the QE prefer the reference over a degraded copy?", "",
              "| degradation | pairs | prefers the reference | mean margin | guard | the guard catches |",
              "|:--|--:|--:|--:|:--|--:|"]
    for kind, b in m["blind_spots"].items():
        lines.append(f"| {kind} | {b['rows']} | {_pct(b['prefers_reference'])} | {_f(b['margin'])} | {b.get('guard', '-')} | "
                     f"{_pct(b.get('guard_catches'))} |")
    alarms = result["guards"]["false_alarm_on_references"]
    lines += ["", "The guards (qeebm/guards.py, default settings) flag the references themselves: "
              + ", ".join(f"{g} {_pct(x)}" for g, x in alarms.items()) + ".", "",
              "## Calibration", "",
              "| against | best monotone map: R^2 / RMSE | per-source offset share of its error (independent errors) | "
              "slope within a source / across sources |", "|:--|--:|--:|--:|"]
    for name, cal in m["calibration"].items():
        lines.append(f"| {QUALITY_LABELS.get(name, name)} | {_f(cal['monotone_r2'])} / {_f(cal['monotone_rmse'])} | "
                     f"{_f(cal['source_offset_share'], 2)} ({_f(cal['source_offset_share_if_independent'], 2)}) | "
                     f"{_f(cal['slope_ratio'], 2)} |")
    lines += ["", "A slope ratio below 1: a score difference between one source's candidates buys less quality than the "
              "same difference between sources."]
    p = result.get("probe")
    if p:
        q, ln = p["samples_qe"], p["sample_length_ratio"]
        dev0, devn = p["curve"][0], p["curve"][-1]
        rate = p["per_1000_samples"]
        first = p["curve"][1]["samples"] if len(p["curve"]) > 1 else 0
        lines += ["", "## Hackability probe: energy-only QE-EBM on the dev sources", "",
                  f"{p['steps']} steps x {p['sources_per_step']} sources x {p['samples_per_source']} samples "
                  f"({p['samples_drawn']} samples), lr {p['lr']:g}, no CE term, no guards; validated on "
                  f"{p['dev_sentences']} dev sentences (greedy).", "",
                  f"| | start | peak / lowest (step) | end | per 1,000 samples, first {first} |",
                  "|:--|--:|--:|--:|--:|",
                  f"| the samples' QE score (mean of {q['window']} steps) | {_f(q['start'])} | {_f(q['peak'])} "
                  f"({q['peak_step']}) | {_f(q['end'])} | |",
                  f"| dev QE (greedy) | {_f(dev0['qe'])} | {_f(max(r['qe'] for r in p['curve']))} | {_f(devn['qe'])} | "
                  f"{_f(rate['dev_qe'], 4)} |",
                  f"| dev chrF++ (greedy) | {_f(dev0['chrf'], 1)} | {_f(dev0['chrf'] - p['chrf_fall'], 1)} | "
                  f"{_f(devn['chrf'], 1)} | {_f(rate['dev_chrf'], 2)} |",
                  f"| the samples' length / source's | {_f(ln['start'], 2)} | {_f(ln['max'], 2)} ({ln['max_step']}) | "
                  f"{_f(ln['end'], 2)} | {_f(rate['sample_length_ratio'], 3)} |"]
    if result.get("notes"):
        lines += [""] + [f"Note: {n}." for n in result["notes"]]
    if plots:
        lines += [""] + [f"![{p.stem}]({p.name})" for p in plots]
    lines += ["", "Thresholds and the measurements behind them: docs/qe-check.md. Seconds: "
              + ", ".join(f"{k} {s:.0f}" for k, s in result["seconds"].items()) + "."]
    return "\n".join(lines) + "\n"


def write(result: dict, out: str | Path) -> tuple[Path, Path]:
    """``OUT/qe_check.json``, the plots and ``OUT/qe_check.md``."""

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = _plain(result)
    path = out / "qe_check.json"
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    plots = plot_qe_check(result, out)
    md = out / "qe_check.md"
    md.write_text(format_markdown(result, plots), encoding="utf-8")
    log.info("qe-check report: %s, %s", md, path)
    return path, md
