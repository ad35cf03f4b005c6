"""Comparing evaluated systems: bootstrap confidence intervals and paired significance against a baseline.

Everything here reads evaluation reports (``qeebm/evaluation/report.py``) and nothing else. Every metric is a
matrix of additive per-segment statistics ``[N, D]`` (sacrebleu's for BLEU/chrF++/TER, ``[score, 1]``
for COMET-type scores), so one resampling routine serves all of them:

* One matrix of resample counts ``[R, N]`` is drawn once, the same draws sacrebleu's
  ``paired_bs`` makes for the same seed (``default_rng(seed).choice(N, (R, N))``), and is shared by
  every system, seed and metric: the comparisons are paired and use common random numbers.
* Confidence interval: the 95% percentile interval of the resampled corpus scores, taken as the
  order statistics sacrebleu uses (sorted[R // 40], sorted[R - R // 40 - 1]). The difference to the
  baseline gets the same interval over the resampled differences: both sides are scored on the
  same resamples, so it is a paired interval, much narrower than the two scores' own intervals
  when the systems agree on which segments are hard (the forest plot draws it).
* Paired test (Koehn 2004): p = (1 + #resamples where the system-minus-baseline difference does not
  keep the observed sign) / (R + 1). The +1 keeps p above zero with a finite number of resamples,
  as sacrebleu does; identical systems give p = 1.

Seeds. A system is every report with the same ``system`` name (and the same ``config_id``). Its
score is the mean over seeds, shown with the standard deviation over seeds (n - 1); its CI is the
percentile interval of the seed-mean, resampling the same segments for every seed, so it covers
test-set sampling only, and the sd shows the seed variance. Significance is tested per seed pair,
the usual paired bootstrap of MT papers run once per pair: seed k of the system against seed k of
the baseline when both have the same seed values, otherwise every system seed against every
baseline seed. Each pair's p is taken in the direction of the mean difference over seeds (a pair
pointing the other way gets a large p). A difference is marked ``*`` when p < 0.05 in every pair,
``†`` when it is in a majority of pairs but not all; the reported p is the largest over pairs. With one seed each this
is the plain paired bootstrap. "Significant" below (the reward-hacking check) means ``*`` or ``†``.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from qeebm import __version__ as QEEBM_VERSION
from qeebm.errors import QeebmError
from qeebm.evaluation.plots import DEFAULT_CURVE_KEYS, plot_curves, plot_forest
from qeebm.evaluation.report import TEXT_KEYS, read_report
from qeebm.metrics.bootstrap import (
    paired_bootstrap_p,
    percentile_ci,
    resample_counts,
    resampled_scores,
    sacrebleu_paired_p,
    seed_pairs,
)
from qeebm.metrics.registry import SACREBLEU_METRICS, column, higher_is_better, label, scale
from qeebm.metrics.sacrebleu import corpus_from_stats, mean_stats, metric_signature, segment_stats

SIGNIFICANCE = 0.05  # the level of every significance mark
# The order neural metrics appear in; any other per-segment score follows alphabetically.
NEURAL_ORDER = ("comet", "xcomet", "kiwi", "judge")
# Reports may round corpus scores to one decimal; a larger gap means different metric options.
CORPUS_TOLERANCE = 0.05


# ----------------------------------------------------------------------------------------------
# Inputs


@dataclass
class Entry:
    """One report file: one system, one seed."""

    path: Path
    report: dict

    @property
    def run_dir(self) -> Path:
        return self.path.parent.parent if self.path.parent.name == "eval" else self.path.parent

    @property
    def label(self) -> str:
        seed = self.report["seed"]
        return self.report["system"] if seed is None else f"{self.report['system']} (seed {seed})"


@dataclass
class System:
    name: str
    entries: list[Entry]  # sorted by seed

    @property
    def seeds(self) -> list:
        return [e.report["seed"] for e in self.entries]

    @property
    def trained_on(self) -> str | None:
        return self.entries[0].report.get("trained_on")

    @property
    def reward_terms(self) -> list[dict]:
        """The terms of the composite reward it was trained against (empty for a single QE)."""
        return list(self.entries[0].report.get("reward_terms", []))

    @property
    def trained(self) -> list[str]:
        """Every metric it was trained against: ``trained_on`` and each reward term's."""
        return list(dict.fromkeys(m for m in (self.trained_on, *(t.get("metric") for t in self.reward_terms)) if m))

    @property
    def heldout(self) -> list[str]:
        return list(self.entries[0].report.get("heldout", []))

    @property
    def selected_on(self) -> str | None:
        """The metric whose model chose the hypotheses among candidates (QE reranking, MBR), or None."""
        return self.entries[0].report.get("selected_on")

    @property
    def optimised(self) -> list[str]:
        """Every metric the system's outputs were pushed towards: in training, then in selection."""
        return list(dict.fromkeys(m for m in (*self.trained, self.selected_on) if m))

    @property
    def selection(self) -> dict | None:
        return self.entries[0].report.get("selection")


def find_reports(inputs: Sequence[str | Path], split: str = "test") -> list[Path]:
    """Report files for the given paths: a report file as is, a run directory as
    ``<run>/eval/<split>.json`` (an ``eval`` directory as ``<eval>/<split>.json``)."""
    if not inputs:
        raise QeebmError("no runs or reports given")
    found: list[Path] = []
    for item in map(Path, inputs):
        if item.is_file():
            path = item
        elif item.is_dir():
            eval_dir = item if item.name == "eval" else item / "eval"
            path = eval_dir / f"{split}.json"
            if not path.is_file():
                have = sorted(p.stem for p in eval_dir.glob("*.json")) if eval_dir.is_dir() else []
                hint = f" (evaluated splits: {', '.join(have)})" if have else " (was it evaluated?)"
                raise QeebmError(f"{item}: no evaluation report {path}{hint}")
        else:
            raise QeebmError(f"{item}: no such report file or run directory")
        if path.resolve() in {p.resolve() for p in found}:
            raise QeebmError(f"{path}: given twice")
        found.append(path)
    return found


def load_entries(inputs: Sequence[str | Path], split: str = "test") -> list[Entry]:
    return [Entry(path, read_report(path)) for path in find_reports(inputs, split)]


def group_systems(entries: Sequence[Entry]) -> list[System]:
    """Systems in order of first appearance; seeds of one system must share config_id,
    trained_on and heldout, and no seed may appear twice."""
    groups: dict[str, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(entry.report["system"], []).append(entry)
    systems = []
    for name, group in groups.items():
        first = group[0]
        for entry in group[1:]:
            for key in ("config_id", "trained_on", "heldout", "selected_on", "reward_terms"):
                if entry.report.get(key) != first.report.get(key):
                    raise QeebmError(
                        f"system '{name}': {first.path} and {entry.path} differ in {key} "
                        f"({first.report.get(key)!r} vs {entry.report.get(key)!r}); give different configs different system names")
        seen: dict = {}
        for entry in group:
            other = seen.setdefault(entry.report["seed"], entry)
            if other is not entry:
                raise QeebmError(f"system '{name}' has seed {entry.report['seed']} twice ({other.path}, {entry.path})")
        group.sort(key=lambda e: (e.report["seed"] is None, e.report["seed"] or 0))
        systems.append(System(name, group))
    return systems


def check_same_test_set(entries: Sequence[Entry]) -> int:
    """All reports must score the same segments against the same references; returns N."""
    first = entries[0]
    sha, refs = first.report["data"]["sha256"], first.report["segments"]["ref"]
    for entry in entries[1:]:
        other = entry.report
        if other["data"]["sha256"] != sha:
            raise QeebmError(f"{entry.path} and {first.path} were evaluated on different test sets "
                             f"(data.sha256 {other['data']['sha256'][:12]} vs {sha[:12]})")
        if len(other["segments"]["ref"]) != len(refs):
            raise QeebmError(f"{entry.path} has {len(other['segments']['ref'])} segments, "
                             f"{first.path} has {len(refs)}: not the same test set")
        if other["segments"]["ref"] != refs:
            i = next(i for i, (a, b) in enumerate(zip(other["segments"]["ref"], refs)) if a != b)
            raise QeebmError(f"{entry.path} and {first.path} have different references at segment {i} "
                             "despite the same data.sha256")
    return len(refs)


def neural_metrics(report: dict) -> list[str]:
    return [k for k in report["segments"] if k not in TEXT_KEYS]


def select_metrics(entries: Sequence[Entry], requested: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """Metrics to compare (sacrebleu ones first) and the neural ones left out because some report
    lacks them. An explicitly requested metric that a report lacks is an error."""
    if requested:
        for metric in requested:
            if metric in SACREBLEU_METRICS:
                continue
            for entry in entries:
                if metric not in entry.report["segments"]:
                    have = ", ".join(list(SACREBLEU_METRICS) + neural_metrics(entry.report))
                    raise QeebmError(f"{entry.path}: no per-segment '{metric}' scores (has: {have})")
        return list(dict.fromkeys(requested)), []
    present = [set(neural_metrics(e.report)) for e in entries]
    common, union = set.intersection(*present), set.union(*present)
    order = lambda m: (NEURAL_ORDER.index(m) if m in NEURAL_ORDER else len(NEURAL_ORDER), m)  # noqa: E731
    return list(SACREBLEU_METRICS) + sorted(common, key=order), sorted(union - common, key=order)


def sacrebleu_options(entries: Sequence[Entry], metric: str) -> str | None:
    """The signature all reports agree on for a sacrebleu metric (version aside), or None for
    sacrebleu's defaults when no report records one."""
    strip = lambda sig: "|".join(p for p in sig.split("|") if not p.startswith("version:"))  # noqa: E731
    chosen, source = None, None
    for entry in entries:
        sig = entry.report.get("signatures", {}).get(metric)
        if sig is None:
            continue
        if chosen is not None and strip(sig) != strip(chosen):
            raise QeebmError(f"{entry.path} and {source} computed {label(metric)} with different options "
                             f"({strip(sig)} vs {strip(chosen)})")
        chosen, source = chosen or sig, source or entry.path
    return chosen


# ----------------------------------------------------------------------------------------------
# The comparison


@dataclass
class Cell:
    """One system x metric, in display units (COMET-type metrics x100)."""

    score: float  # mean over seeds
    ci: tuple[float, float]  # 95% percentile interval of the seed-mean
    seed_scores: list[float]
    sd: float | None = None  # over seeds (n - 1); None with one seed
    delta: float | None = None  # score - baseline score; None for the baseline
    delta_ci: tuple[float, float] | None = None  # 95% percentile interval of the paired resampled differences
    pair_p: list[float] = field(default_factory=list)  # paired bootstrap p per seed pair, in the direction of `delta`
    sig_pairs: int = 0  # pairs with p < SIGNIFICANCE
    pair_p_sacrebleu: list[float] = field(default_factory=list)

    @property
    def n_pairs(self) -> int:
        return len(self.pair_p)

    @property
    def p(self) -> float | None:
        """The largest p over seed pairs: below SIGNIFICANCE exactly when every pair is significant."""
        return max(self.pair_p) if self.pair_p else None

    @property
    def p_sacrebleu(self) -> float | None:
        return max(self.pair_p_sacrebleu) if self.pair_p_sacrebleu else None

    @property
    def mark(self) -> str:
        if not self.n_pairs or not self.sig_pairs:
            return ""
        if self.sig_pairs == self.n_pairs:
            return "*"
        return "†" if 2 * self.sig_pairs > self.n_pairs else ""

    @property
    def significant(self) -> bool:
        return bool(self.mark)


@dataclass
class Comparison:
    split: str | None
    n_segments: int
    baseline: str
    systems: list[System]
    metrics: list[str]
    cells: dict[str, dict[str, Cell]]  # system name -> metric -> cell
    resamples: int
    seed: int
    sacrebleu_signatures: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def signature(self) -> str:
        import sacrebleu

        return (f"test:paired-bs|ci:95%-percentile|resamples:{self.resamples}|seed:{self.seed}"
                f"|significance:{SIGNIFICANCE}|seeds:same-seed-else-all-pairs|sacrebleu:{sacrebleu.__version__}|qeebm:{QEEBM_VERSION}")

    def improved(self, system: str, metric: str) -> bool:
        """Significantly better than the baseline (mark * or †, difference in the good direction)."""
        cell = self.cells[system].get(metric)
        if cell is None or not cell.significant or not cell.delta:
            return False
        return (cell.delta > 0) == higher_is_better(metric)


def _check_corpus(entry: Entry, metric: str, score: float, signature: str | None) -> None:
    reported = entry.report.get("corpus", {}).get(metric)
    if reported is not None and abs(reported - score) > CORPUS_TOLERANCE:
        raise QeebmError(f"{entry.path}: corpus.{metric} is {reported} but its segments give {score:.2f} "
                         f"with {metric_signature(metric, signature)}; were they scored differently?")


def compare(entries: Sequence[Entry], baseline: str | None = None, metrics: Sequence[str] | None = None,
            resamples: int = 1000, seed: int = 12345, sacrebleu_test: bool = True,
            split: str | None = None) -> Comparison:
    """Scores, confidence intervals and paired tests for every system and metric (module docstring)."""
    if resamples < 10:
        raise QeebmError(f"--resamples must be at least 10, got {resamples}")
    if not entries:
        raise QeebmError("no evaluation reports to compare")
    n = check_same_test_set(entries)
    systems = group_systems(entries)
    names = [s.name for s in systems]
    baseline = baseline or names[0]
    if baseline not in names:
        raise QeebmError(f"baseline '{baseline}' is not among the systems ({', '.join(names)})")
    systems.sort(key=lambda s: s.name != baseline)  # baseline first, the rest in input order
    metrics, dropped = select_metrics(entries, metrics)
    options = {m: sacrebleu_options(entries, m) for m in metrics if m in SACREBLEU_METRICS}
    refs = entries[0].report["segments"]["ref"]
    counts = resample_counts(n, resamples, seed)

    # 1. per seed: observed corpus score and the R resampled ones, in the metric's own units
    observed: dict[tuple[str, int, str], float] = {}
    resampled: dict[tuple[str, int, str], np.ndarray] = {}
    for system in systems:
        for k, entry in enumerate(system.entries):
            seg = entry.report["segments"]
            for metric in metrics:
                if metric in SACREBLEU_METRICS:
                    stats = segment_stats(metric, seg["hyp"], refs, options[metric])
                    observed[system.name, k, metric] = corpus_from_stats(metric, stats, options[metric])
                    _check_corpus(entry, metric, observed[system.name, k, metric], options[metric])
                else:
                    stats = mean_stats(seg[metric])
                    observed[system.name, k, metric] = corpus_from_stats(metric, stats)
                resampled[system.name, k, metric] = resampled_scores(metric, stats, counts, options.get(metric))

    # 2. per system: seed mean, sd, CI of the seed-mean
    cells: dict[str, dict[str, Cell]] = {}
    seed_means: dict[tuple[str, str], np.ndarray] = {}  # the resampled seed-mean, display units
    for system in systems:
        cells[system.name] = {}
        for metric in metrics:
            x = scale(metric)
            seeds = [observed[system.name, k, metric] * x for k in range(len(system.entries))]
            mean_curve = np.mean([resampled[system.name, k, metric] for k in range(len(seeds))], axis=0) * x
            seed_means[system.name, metric] = mean_curve
            cells[system.name][metric] = Cell(
                score=float(np.mean(seeds)), ci=percentile_ci(mean_curve), seed_scores=seeds,
                sd=float(np.std(seeds, ddof=1)) if len(seeds) > 1 else None)

    # 3. paired tests against the baseline, one per seed pair
    base = systems[0]
    for system in systems[1:]:
        pairs = seed_pairs(system.seeds, base.seeds)
        sb_p: dict[tuple[int, int], dict[str, float]] = {}
        sb_metrics = [m for m in metrics if m in ("bleu", "chrf")]
        if sacrebleu_test and sb_metrics:
            for i, j in pairs:
                sb_p[i, j] = sacrebleu_paired_p(sb_metrics, base.entries[j].report["segments"]["hyp"],
                                                system.entries[i].report["segments"]["hyp"], refs,
                                                resamples, seed, options)
        for metric in metrics:
            cell = cells[system.name][metric]
            cell.delta = cell.score - cells[base.name][metric].score
            cell.delta_ci = percentile_ci(seed_means[system.name, metric] - seed_means[base.name, metric])
            for i, j in pairs:
                d_star = resampled[system.name, i, metric] - resampled[base.name, j, metric]
                # one-sided in the direction of the seed-mean difference, so a pair pointing the
                # other way gets a large p instead of counting as support
                p = paired_bootstrap_p(cell.delta, d_star)
                cell.pair_p.append(p)
                cell.sig_pairs += p < SIGNIFICANCE
                if metric in sb_p.get((i, j), {}):
                    cell.pair_p_sacrebleu.append(sb_p[i, j][metric])

    result = Comparison(split=split, n_segments=n, baseline=baseline, systems=systems, metrics=metrics,
                        cells=cells, resamples=resamples, seed=seed,
                        sacrebleu_signatures={m: metric_signature(m, options[m]) for m in options})
    if sacrebleu_test and seed == 0:
        result.notes.append("note: sacrebleu's PairedTest treats seed 0 as unseeded; its p-values will vary")
    if dropped:
        result.notes.append(f"note: left out {', '.join(dropped)}: not scored in every report")
    result.warnings, notes = reward_hacking_checks(result)
    result.notes += notes
    return result


def reward_hacking_checks(result: Comparison) -> tuple[list[str], list[str]]:
    """A system whose training QE (or the QE that reranked its candidates) improves significantly
    while no held-out judge does is likely exploiting the QE rather than translating better. Every
    term of a composite reward (``reward_terms``) is a training QE here, chrF++ included.
    Returns WARNING lines and notes about systems that could not be checked."""
    warnings, notes = [], []
    for system in result.systems:
        if system.name == result.baseline:
            continue
        judges = [h for h in system.heldout if h in result.metrics and h not in system.optimised]
        for metric in system.optimised:
            if metric not in result.metrics or not result.improved(system.name, metric):
                continue
            if not judges:
                notes.append(f"note: cannot check {system.name} for reward hacking: none of its held-out "
                             f"judges ({', '.join(system.heldout) or 'none listed'}) was compared")
                break
            if not any(result.improved(system.name, h) for h in judges):
                role = " and ".join(r for r, hit in (("training", metric in system.trained),
                                                     ("selection", metric == system.selected_on)) if hit)
                delta = result.cells[system.name][metric].delta
                warnings.append(
                    f"WARNING: possible reward hacking: {system.name} improves its {role} "
                    f"{'metric' if metric in SACREBLEU_METRICS else 'QE'} "
                    f"{label(metric)} significantly ({delta:+.2f}) but none of the held-out judges "
                    f"({', '.join(label(h) for h in judges)}) improves significantly over {result.baseline}")
    return warnings, notes


def curve_runs(result: Comparison) -> list[tuple[str, Path]]:
    """(label, run directory) of every seed whose training curves are drawn. A row that selected
    among candidates at decoding time (``sft+rerank``) was not trained: its run directory is the
    trained system's, so a curve of its own would only repeat that one over it."""
    return [(e.label, e.run_dir) for s in result.systems if not s.selection for e in s.entries]


def selection_line(system: System) -> str | None:
    """How a system's hypotheses were chosen among candidates, and what that cost per segment."""
    sel = system.selection
    if not sel:
        return None
    by = f"QE {sel.get('model')}" if sel["rule"] == "rerank" else f"MBR (utility {sel.get('utility')})"
    costs = [e.report.get("selection", {}).get("ms_per_segment") for e in system.entries]
    costs = [c for c in costs if isinstance(c, (int, float))]
    cost = f"; {np.mean(costs):.1f} ms per segment to generate and select" if costs else ""
    return f"- {system.name}: chosen by {by} among {sel['candidates']} {sel.get('mode', '')} candidates{cost}"


# ----------------------------------------------------------------------------------------------
# Output


def _cell_text(cell: Cell) -> str:
    lo, hi = cell.ci
    text = f"{cell.score:.2f} ± {(hi - lo) / 2:.2f}"
    if cell.sd is not None:
        text += f" sd {cell.sd:.2f}"
    if cell.delta is not None:
        text += f" ({cell.delta:+.2f}{cell.mark})"
    return text


def format_markdown(result: Comparison) -> str:
    neural = [label(m) for m in result.metrics if scale(m) != 1]
    split = f"{result.split} set, " if result.split else ""
    lines = [f"## {split}{result.n_segments} segments, baseline {result.baseline}", ""]
    lines.append("| system | seeds | " + " | ".join(column(m) for m in result.metrics) + " |")
    lines.append("|:--|--:|" + "--:|" * len(result.metrics))
    for system in result.systems:
        name = f"{system.name} (baseline)" if system.name == result.baseline else system.name
        cells = [_cell_text(result.cells[system.name][m]) for m in result.metrics]
        lines.append(f"| {name} | {len(system.entries)} | " + " | ".join(cells) + " |")
    lines.append("")
    legend = ("Cells: score ± half-width of its 95% bootstrap CI (percentile, segments resampled); "
              "several seeds: mean over seeds and sd over seeds (n-1). In parentheses: difference to the "
              "baseline; * p < 0.05 in every seed pair, † in most (paired bootstrap resampling, Koehn 2004).")
    if neural:
        legend += f" Shown ×100: {', '.join(neural)}."
    lines.append(legend)
    lines.append("")
    for system in result.systems[1:]:
        deltas = ", ".join(f"{result.cells[system.name][m].delta:+.1f} {label(m)}{result.cells[system.name][m].mark}"
                           for m in result.metrics)
        lines.append(f"- {system.name} vs {result.baseline}: {deltas}")
    if len(result.systems) > 1:
        lines.append("")
    selected = [line for line in map(selection_line, result.systems) if line]
    if selected:
        lines += ["Selection among candidates (the selecting QE is not a held-out judge of its row):", *selected, ""]
    for line in result.warnings + result.notes:
        lines.extend([line, ""])
    lines.append(f"signature: {result.signature}")
    for metric, sig in result.sacrebleu_signatures.items():
        lines.append(f"{label(metric)}: {sig}")
    return "\n".join(lines) + "\n"


def _r(x: float | None, digits: int = 4):
    return None if x is None else round(float(x), digits)


def comparison_rows(result: Comparison) -> list[dict]:
    """One flat record per system x metric, the numbers CSV and JSON share."""
    rows = []
    for system in result.systems:
        for metric in result.metrics:
            cell = result.cells[system.name][metric]
            rows.append({
                "system": system.name,
                "seeds": " ".join(str(s) for s in system.seeds),
                "metric": metric,
                "scale": scale(metric),
                "score": _r(cell.score),
                "ci_low": _r(cell.ci[0]),
                "ci_high": _r(cell.ci[1]),
                "sd": _r(cell.sd),
                "delta": _r(cell.delta),
                "delta_ci_low": _r(cell.delta_ci[0]) if cell.delta_ci else None,
                "delta_ci_high": _r(cell.delta_ci[1]) if cell.delta_ci else None,
                "p": _r(cell.p),
                "sig_pairs": cell.sig_pairs if cell.n_pairs else None,
                "n_pairs": cell.n_pairs or None,
                "mark": cell.mark,
                "p_sacrebleu": _r(cell.p_sacrebleu),
                "seed_scores": " ".join(f"{s:.4f}" for s in cell.seed_scores),
            })
    return rows


def format_csv(result: Comparison) -> str:
    rows = comparison_rows(result)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*rows[0], "signature"], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({**{k: ("" if v is None else v) for k, v in row.items()}, "signature": result.signature})
    return out.getvalue()


def to_json(result: Comparison) -> dict:
    rows = comparison_rows(result)
    systems = []
    for system in result.systems:
        systems.append({
            "name": system.name,
            "seeds": system.seeds,
            "config_id": system.entries[0].report.get("config_id"),
            "reports": [str(e.path) for e in system.entries],
            "trained_on": system.trained_on,
            "reward_terms": system.reward_terms,
            "selected_on": system.selected_on,
            "selection": system.selection,
            "heldout": system.heldout,
            "metrics": {r["metric"]: {k: v for k, v in r.items() if k not in ("system", "seeds", "metric")}
                        for r in rows if r["system"] == system.name},
        })
        for metric, cell in result.cells[system.name].items():
            systems[-1]["metrics"][metric]["pair_p"] = [_r(p) for p in cell.pair_p]
            systems[-1]["metrics"][metric]["pair_p_sacrebleu"] = [_r(p) for p in cell.pair_p_sacrebleu]
    return {
        "signature": result.signature,
        "split": result.split,
        "n_segments": result.n_segments,
        "baseline": result.baseline,
        "metrics": result.metrics,
        "systems": systems,
        "warnings": result.warnings,
        "notes": result.notes,
        "sacrebleu_signatures": result.sacrebleu_signatures,
    }


def format_json(result: Comparison) -> str:
    return json.dumps(to_json(result), indent=1, ensure_ascii=False) + "\n"


FORMATTERS = {"md": format_markdown, "csv": format_csv, "json": format_json}


# ----------------------------------------------------------------------------------------------
# The command


def run(inputs: Sequence[str], *, split: str = "test", baseline: str | None = None,
        metrics: Sequence[str] | None = None, resamples: int = 1000, seed: int = 12345,
        fmt: str = "md", out: str | Path | None = None, plots: bool = False,
        curve_keys: Sequence[str] = DEFAULT_CURVE_KEYS, sacrebleu_test: bool = True,
        stderr=None) -> str:
    """What ``scripts/compare.py`` does; returns the text for stdout. Warnings and notes go to
    ``stderr`` too unless they are already part of that text (markdown)."""
    stderr = stderr or sys.stderr
    if fmt not in FORMATTERS:
        raise QeebmError(f"--format must be one of {', '.join(FORMATTERS)}, got '{fmt}'")
    if plots and out is None:
        raise QeebmError("--plots needs --out DIR to write the PNG files to")
    entries = load_entries(inputs, split)
    result = compare(entries, baseline=baseline, metrics=metrics, resamples=resamples, seed=seed,
                     sacrebleu_test=sacrebleu_test, split=split)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for ext, formatter in FORMATTERS.items():
            (out / f"comparison.{ext}").write_text(formatter(result), encoding="utf-8")
        if plots:
            plot_forest(result, out / "plots")
            _, notes = plot_curves(curve_runs(result), curve_keys, out / "plots")
            for line in notes:
                print(line, file=stderr)
    if fmt != "md":
        for line in result.warnings + result.notes:
            print(line, file=stderr)
    return FORMATTERS[fmt](result)
