"""Bootstrap resampling over segments, shared by every metric, system and seed of a comparison.

Every metric is a matrix of additive per-segment statistics ``[N, D]`` (qeebm/evaluation/report.py), so one
matrix of resample counts ``[R, N]`` turns into every resampled corpus score by one product. The
draws are sacrebleu's (``default_rng(seed).choice(N, (R, N))``), so both score the same resampled
corpora for the same seed; ``sacrebleu_paired_p`` runs sacrebleu's own test for a cross-check.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Sequence

import numpy as np

from qeebm.metrics.sacrebleu import corpus_from_sums, make_metric


def resample_counts(n: int, resamples: int, seed: int) -> np.ndarray:
    """``[R, N]``: how often each segment occurs in each bootstrap resample. The draws are exactly
    sacrebleu.significance's (``default_rng(seed).choice(N, size=(R, N))``), so for the same seed
    both implementations score the same resampled corpora."""
    idx = np.random.default_rng(seed).choice(n, size=(resamples, n), replace=True)
    flat = (idx + n * np.arange(resamples)[:, None]).ravel()
    return np.bincount(flat, minlength=resamples * n).reshape(resamples, n).astype(np.float64)


def resampled_scores(metric: str, stats: np.ndarray, counts: np.ndarray, signature: str | None = None) -> np.ndarray:
    """Corpus score of every resample ``[R]``. Counts and statistics are integers held in float64,
    so the summed statistics, and hence the scores, are exact."""
    return corpus_from_sums(metric, counts @ stats, signature)


def percentile_ci(samples: np.ndarray) -> tuple[float, float]:
    """95% percentile interval with sacrebleu's order statistics (``significance.estimate_ci``)."""
    ordered = np.sort(np.asarray(samples, dtype=np.float64))
    k = len(ordered) // 40
    return float(ordered[k]), float(ordered[len(ordered) - k - 1])


def paired_bootstrap_p(delta: float, resampled_deltas: np.ndarray) -> float:
    """Koehn (2004): the share of resamples in which the difference does not keep the sign of
    ``delta`` (the observed difference), with +1 smoothing. A zero difference has no direction to
    confirm: p = 1."""
    if delta == 0:
        return 1.0
    flips = int(np.count_nonzero(math.copysign(1.0, delta) * resampled_deltas <= 0))
    return (flips + 1) / (len(resampled_deltas) + 1)


def seed_pairs(system_seeds: Sequence, baseline_seeds: Sequence) -> list[tuple[int, int]]:
    """Index pairs (system seed, baseline seed) to test: same seed values when both sides ran the
    same seeds, otherwise every combination (no pairing would be less arbitrary than another)."""
    if sorted(system_seeds, key=str) == sorted(baseline_seeds, key=str) and None not in system_seeds:
        return [(i, list(baseline_seeds).index(s)) for i, s in enumerate(system_seeds)]
    return [(i, j) for i in range(len(system_seeds)) for j in range(len(baseline_seeds))]


@contextlib.contextmanager
def _environ(key: str, value: str):
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def sacrebleu_paired_p(metrics: Sequence[str], baseline_hyps: Sequence[str], system_hyps: Sequence[str],
                       refs: Sequence[str], resamples: int, seed: int,
                       signatures: dict[str, str | None] | None = None) -> dict[str, float]:
    """p-values of sacrebleu's own paired bootstrap (``PairedTest(test_type='bs')``), for a cross-check.
    Its statistic differs from ours: it centres the resampled |differences| and counts those
    exceeding the observed |difference|, so two identical systems get p = 1/(R+1), not 1."""
    from sacrebleu.significance import PairedTest

    signatures = signatures or {}
    # Fresh metric objects: PairedTest keeps state on them
    objects = {m: make_metric.__wrapped__(m, signatures.get(m)) for m in metrics}
    # PairedTest reads its seed from the environment only; it treats seed 0 as "unseeded"
    with _environ("SACREBLEU_SEED", str(seed)):
        test = PairedTest([("baseline", list(baseline_hyps)), ("system", list(system_hyps))], objects,
                          [list(refs)], test_type="bs", n_samples=resamples)
        _, scores = test()
    # results are keyed by sacrebleu's display names, in the order of `metrics`
    names = [k for k in scores if k != "System"]
    return {m: float(scores[name][1].p_value) for m, name in zip(metrics, names)}
