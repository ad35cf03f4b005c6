"""How strong must the QE be? Each method's gain over SFT against the strength of what it trains on.

    qeebm demo --seeds 3 --systems all --runs runs/tables     # the three-seed tables, first
    python scripts/qe_strength.py --tables runs/tables --out runs/qe-strength

The three-seed tables train three methods against signals of three strengths: QE-EBM static, REINFORCE
and DPO against the tiny CometKiwi (``qe/kiwi``, the realistic rows) and against the reference-based
COMET reading each pool sentence's true reference (``qe/comet``, the oracle rows), and REINFORCE
against sentence chrF++ itself. A signal's strength is measured where the methods use it: ``qeebm
qe-check`` on the seed-42 plateau translator's own samples of the dev sentences (8 a sentence), the
mean within-source Spearman correlation with sentence chrF++ (1 for chrF++ itself). A system's gain
is its three-seed mean difference to SFT continued on the test set, checkpoints selected on dev
chrF++ (the tables' ``comparison-chrf``), with the sd over seeds. Writes ``OUT/qe_strength.md``,
``OUT/qe_strength.json`` and ``OUT/qe_strength.png``; the qe-check reports go to ``OUT/qe-check/QE``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

try:
    import qeebm  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qeebm.utils.process import setup_process

# system -> (method, the signal it trains on)
SYSTEMS = {
    "qe-ebm-static": ("QE-EBM static", "kiwi"), "qe-ebm-oracle": ("QE-EBM static", "comet"),
    "reinforce": ("REINFORCE", "kiwi"), "reinforce-oracle": ("REINFORCE", "comet"), "reinforce-chrf": ("REINFORCE", "chrf"),
    "dpo": ("DPO", "kiwi"), "dpo-oracle": ("DPO", "comet"),
}
METRICS = {"bleu": "BLEU", "chrf": "chrF++", "judge": "judge x100"}


def strength(world: Path, translator: Path, signal: str, out: Path) -> float:
    """The signal's within-source Spearman with sentence chrF++ on the translator's samples (qe-check,
    run once and then read back); chrF++ itself is 1."""
    if signal == "chrf":
        return 1.0
    from qeebm.analysis.qe_check import run

    path = out / "qe_check.json"
    if not path.is_file():
        run(str(world / "qe" / signal), str(translator), str(world / "data" / "dev.tsv"), out, seed=0)
    return json.loads(path.read_text())["measurements"]["ranking"]["chrf"]["within_source_spearman"]


def gains(comparison_csv: Path) -> dict:
    """system -> metric -> (mean difference to the baseline, sd over seeds of the per-seed differences)."""
    rows = list(csv.DictReader(comparison_csv.open(encoding="utf-8")))
    # seed_scores are in the table's units (COMET-family scores x100).
    per_seed = {(r["system"], r["metric"]): dict(zip(r["seeds"].split(), map(float, r["seed_scores"].split()))) for r in rows}
    baseline = next(r["system"] for r in rows if not r["delta"])
    out = {}
    for (system, metric), scores in per_seed.items():
        if system in SYSTEMS and metric in METRICS:
            base = per_seed[(baseline, metric)]
            diffs = [score - base[seed] for seed, score in scores.items()]
            mean = sum(diffs) / len(diffs)
            sd = (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)) ** 0.5 if len(diffs) > 1 else 0.0
            out.setdefault(system, {})[metric] = (mean, sd)
    return out


def plot(rows: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(14, 4))
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["strength"])
        for ax, (key, title) in zip(axes, METRICS.items()):
            ax.errorbar([r["strength"] for r in mine], [r[key] for r in mine], yerr=[r[f"{key}_sd"] for r in mine],
                        marker="o", capsize=3, label=method)
            for r in mine:
                ax.annotate(r["signal"], (r["strength"], r[key]), fontsize=7, alpha=0.7)
            ax.set_title(f"{title}: difference to SFT continued")
    for ax in axes:
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel("the signal's within-source Spearman with chrF++")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    path = out / "qe_strength.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    setup_process()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", required=True, help="the runs directory of `qeebm demo --seeds 3 --systems all`")
    p.add_argument("--world", default="data/tinyworld", help="the tiny world the tables were trained in (default %(default)s)")
    p.add_argument("--out", default="runs/qe-strength", help="output directory (default %(default)s)")
    args = p.parse_args(argv)
    tables, world, out = Path(args.tables), Path(args.world), Path(args.out)
    comparison = tables / "comparison-chrf" / "comparison.csv"
    translator = tables / "plateau-seed42" / "best"
    for needed in (comparison, translator):
        if not needed.exists():
            print(f"error: {needed} is missing: run `qeebm demo --seeds 3 --systems all --runs {tables}` first", file=sys.stderr)
            return 2
    measured = gains(comparison)
    missing = sorted(set(SYSTEMS) - set(measured))
    if missing:
        print(f"error: {comparison} has no {', '.join(missing)}: the tables need every system (--systems all)", file=sys.stderr)
        return 2
    strengths = {s: strength(world, translator, s, out / "qe-check" / s) for s in dict.fromkeys(v[1] for v in SYSTEMS.values())}
    rows = []
    for system, (method, signal) in SYSTEMS.items():
        row = {"system": system, "method": method, "signal": signal, "strength": strengths[signal]}
        for key, (mean, sd) in measured[system].items():
            row |= {key: mean, f"{key}_sd": sd}
        rows.append(row)
    png = plot(rows, out)
    lines = ["Gain over SFT continued (test set, three seeds, checkpoints selected on dev chrF++; mean difference "
             "and sd over seeds) against the trained-on signal's within-source Spearman with sentence chrF++ on "
             "the plateau translator's own samples of the dev sentences (qeebm qe-check).", "",
             "| method | signal | within-source Spearman | " + " | ".join(f"{t} - SFT" for t in METRICS.values()) + " |",
             "|:--|:--|--:|" + "--:|" * len(METRICS)]
    for r in rows:
        cells = " | ".join(f"{r[k]:+.2f} (sd {r[f'{k}_sd']:.2f})" for k in METRICS)
        lines.append(f"| {r['method']} | {r['signal']} | {r['strength']:.3f} | {cells} |")
    lines += ["", f"Plot: {png}."]
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "qe_strength.md").write_text(text, encoding="utf-8")
    (out / "qe_strength.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
