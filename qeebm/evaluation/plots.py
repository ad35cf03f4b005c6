"""Plots of a comparison (the forest plot of differences to the baseline) and of training curves
(one per logged key).

matplotlib is imported only here and only when a plot is drawn: comparing runs never needs it.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from qeebm.metrics.registry import column
from qeebm.utils.runlog import log_path, read_metrics

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


def forest_figure(result):
    """The comparison as differences: one panel per metric, one row per system under the baseline,
    a dot at its difference to the baseline and a line over the 95% interval of that difference
    (paired bootstrap, ``Cell.delta_ci``), with zero marked. A difference marked significant in the
    table is drawn in green when it is an improvement and in red when it is not (TER: lower is
    better, as the arrow in its title says), the rest in grey.
    The axes fit the intervals, not zero-based bars, so a half-point difference is as visible as the
    table makes it."""
    systems = [s.name for s in result.systems[1:]]
    cols = min(3, len(result.metrics))
    rows = -(-len(result.metrics) // cols)
    fig = _figure(3.4 * cols + 1.2, rows * (0.35 * max(len(systems), 1) + 1.1))
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    y = np.arange(len(systems))[::-1]  # the table's order, top to bottom
    for i, ax in enumerate(axes.flat):
        if i >= len(result.metrics):
            ax.set_visible(False)
            continue
        metric = result.metrics[i]
        cells = [result.cells[name][metric] for name in systems]
        ax.set_axisbelow(True)
        ax.axvline(0.0, color="black", linewidth=1.0, zorder=1.5)
        for row, name, cell in zip(y, systems, cells):
            better = result.improved(name, metric)
            color = "C2" if better else ("C3" if cell.significant else "0.45")
            if cell.delta_ci is not None:
                ax.plot(cell.delta_ci, [row, row], color=color, linewidth=2, solid_capstyle="butt", zorder=2)
            ax.plot([cell.delta], [row], "o", color=color, markersize=5, zorder=3)
        ax.set_title(column(metric), fontsize="medium")
        ax.set_xlabel(f"difference to {result.baseline}", fontsize="small")
        ax.margins(x=0.08, y=0.15)
        ax.grid(axis="x", color="0.9")
    axes[0][0].set_yticks(y, systems)
    for ax_row in axes:
        ax_row[0].tick_params(axis="y", labelleft=True)
    fig.suptitle(f"Difference to {result.baseline} with its 95% paired bootstrap interval "
                 f"({result.n_segments} segments{', ' + result.split + ' set' if result.split else ''})",
                 fontsize="medium")
    return fig


def plot_forest(result, out_dir: Path) -> Path:
    """``forest_figure`` written to ``out_dir/forest.png``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "forest.png"
    forest_figure(result).savefig(path, dpi=120)
    return path


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
    """``qeebm qe-check``'s plots (qeebm/analysis/qe_check.py): the reliability plot of each reference-based
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
