"""Plots of a comparison (one bar chart per metric) and of training curves (one per logged key).

matplotlib is imported only here and only when a plot is drawn: comparing runs never needs it.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from qeebm.report import column, label
from qeebm.runlog import log_path, read_metrics

if TYPE_CHECKING:
    from qeebm.compare import Comparison

# The weight of each added term next to the CE (diag/ratio_*) and the QE signal within one source's
# samples (score_spread) are what say whether a QE-trained method could move at all.
DEFAULT_CURVE_KEYS = ("loss", "energy/mean", "*/reward", "diag/ratio_*", "*/score_spread", "*/sample_score",
                      "val/bleu", "val/chrf", "val/kiwi")


def _figure(width: float = 6.4, height: float = 4.0):
    # Figure without pyplot: no global backend or figure registry, so Agg is used and nothing leaks
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "metric"


def plot_metrics(result: Comparison, out_dir: Path) -> list[Path]:
    """One bar chart per metric: seed-mean with its 95% CI as error bars, seeds as dots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for metric in result.metrics:
        cells = [result.cells[s.name][metric] for s in result.systems]
        fig = _figure(max(4.0, 1.2 * len(cells) + 2), 4.0)
        ax = fig.add_subplot()
        x = np.arange(len(cells))
        scores = np.array([c.score for c in cells])
        err = np.array([[c.score - c.ci[0] for c in cells], [c.ci[1] - c.score for c in cells]])
        ax.bar(x, scores, color=["0.6"] + ["C0"] * (len(cells) - 1))
        ax.errorbar(x, scores, yerr=np.clip(err, 0, None), fmt="none", ecolor="black", capsize=4)
        for i, cell in enumerate(cells):
            if len(cell.seed_scores) > 1:
                ax.plot([i] * len(cell.seed_scores), cell.seed_scores, "k.", markersize=4)
            if cell.mark:
                ax.annotate(cell.mark, (i, cell.ci[1]), ha="center", va="bottom")
        ax.set_xticks(x, [s.name for s in result.systems], rotation=20, ha="right")
        ax.set_ylabel(column(metric))
        ax.set_title(f"{label(metric)} (95% bootstrap CI, {result.n_segments} segments)")
        path = out_dir / f"metric-{_safe(metric)}.png"
        fig.savefig(path, dpi=120)
        paths.append(path)
    return paths


def plot_curves(runs: Iterable[tuple[str, Path]], keys: Sequence[str], out_dir: Path) -> tuple[list[Path], list[str]]:
    """Training curves from each run's metrics.jsonl: one PNG per logged key that matches one of
    ``keys`` (shell patterns, e.g. ``*/reward``), one line per run. Returns the files and notes
    about runs without a log."""
    logs, notes = {}, []
    for name, run_dir in runs:
        path = log_path(run_dir)
        if path.is_file():
            logs[name] = read_metrics(path)
        else:
            notes.append(f"note: no training curves for {name}: {path} does not exist")
    logged = sorted({k for records in logs.values() for r in records for k in r if k != "step"})
    chosen = list(dict.fromkeys(k for pattern in keys for k in logged if fnmatch.fnmatchcase(k, pattern)))
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for key in chosen:
        fig = _figure()
        ax = fig.add_subplot()
        for name, records in logs.items():
            points = [(r["step"], r[key]) for r in records
                      if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, marker="." if len(points) < 30 else None, label=name)
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.set_title(key)
        ax.legend(fontsize="small")
        path = out_dir / f"curve-{_safe(key)}.png"
        fig.savefig(path, dpi=120)
        paths.append(path)
    return paths, notes


def plot_qe_check(result: dict, out_dir: Path) -> list[Path]:
    """``qeebm qe-check``'s plots (qeebm/qe/check.py): the reliability plot of each reference-based
    quality (quality by QE-score bin, with the best monotone map's bin means), the QE's preference
    for the reference over each degradation, and the probe's curves when it ran."""
    m = result["measurements"]
    paths = []
    cal = m["calibration"]
    fig = _figure(5.0 * len(cal), 4.0)
    for i, (name, c) in enumerate(cal.items(), 1):
        ax = fig.add_subplot(1, len(cal), i)
        bins = c["bins"]
        x = [b["qe_mean"] for b in bins]
        ax.errorbar(x, [b["quality_mean"] for b in bins], yerr=[b["quality_sd"] for b in bins], fmt="o", capsize=3,
                    label="quality in the bin")
        ax.plot(x, [b["monotone_mean"] for b in bins], color="C1", label="best monotone map")
        ax.legend(fontsize="small")
        ax.set_xlabel("QE score (bin mean)")
        ax.set_ylabel(f"{name} (mean, sd)")
        ax.set_title(f"{name}: monotone R^2 {c['monotone_r2']:.2f}" if c["monotone_r2"] is not None else name)
        ax.grid(alpha=0.3)
    path = out_dir / "reliability.png"
    fig.savefig(path, dpi=110)
    paths.append(path)

    spots = {k: v for k, v in m["blind_spots"].items() if v["rows"]}
    fig = _figure(6.4, 0.45 * len(spots) + 1.5)
    ax = fig.add_subplot()
    kinds = list(spots)
    y = np.arange(len(kinds))
    ax.barh(y, [spots[k]["prefers_reference"] for k in kinds], color="C0")
    threshold = 1 - result["thresholds"]["blind_spot_failures"]
    ax.axvline(threshold, color="C3", lw=1, ls="--", label=f"{threshold:.0%}: below, the guard is needed")
    for j, k in enumerate(kinds):
        catches = spots[k].get("guard_catches")
        if catches is not None:
            ax.annotate(f"{spots[k].get('guard')} guard catches {catches:.0%}", (0.02, j), va="center", fontsize=8,
                        color="white")
    ax.set_yticks(y, kinds)
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of pairs whose reference the QE scores above the degraded copy")
    ax.legend(fontsize="small", loc="lower right")
    path = out_dir / "blind_spots.png"
    fig.savefig(path, dpi=110)
    paths.append(path)

    probe = result.get("probe")
    if probe:
        fig = _figure(14.0, 3.6)
        per_sample = 1000 / (probe["sources_per_step"] * probe["samples_per_source"])
        steps = [r["step"] / per_sample for r in probe["per_step"]]
        dev = [r["samples"] / 1000 for r in probe["curve"]]
        ax = fig.add_subplot(1, 3, 1)
        ax.plot(steps, [r["samples_qe"] for r in probe["per_step"]], lw=0.8, label="the samples' (each step)")
        ax.plot(dev, [r["qe"] for r in probe["curve"]], marker="o", label="dev, greedy")
        ax.set_title("QE score")
        ax.legend(fontsize="small")
        ax = fig.add_subplot(1, 3, 2)
        ax.plot(dev, [r["chrf"] for r in probe["curve"]], marker="o")
        ax.set_title("chrF++ (dev, greedy)")
        ax = fig.add_subplot(1, 3, 3)
        ax.plot(steps, [r["sample_length_ratio"] for r in probe["per_step"]])
        ax.set_title("the samples' length / source's")
        for ax in fig.axes:
            ax.set_xlabel("samples drawn (thousands)")
            ax.grid(alpha=0.3)
        path = out_dir / "probe.png"
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths
