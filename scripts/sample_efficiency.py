"""Sample efficiency of the positive control: dev chrF++ gain over SFT continued against the QE passes
each system spent to get there, per gradient estimator.

    qeebm demo --seeds 3 --runs runs/tables --systems sft,reinforce-oracle,qe-ebm-oracle,qe-ebm-softmax-oracle,qe-ebm-reinmax-oracle,qe-ebm-loo-cv-oracle
    python scripts/sample_efficiency.py --runs runs/tables --out runs/efficiency

A system's QE cost at step s is s x (source-only sentences per step) x its estimator's QE cost per
sentence (``qeebm.analysis.gradient_bias.qe_cost``: K forward passes, and K backward passes to the QE's inputs
counted as 2 forwards each, for the estimators that use the QE's gradient), read from the run's saved
config. The gain at a validation step is the system's dev chrF++ minus SFT continued's at the same
step, averaged over the seeds both have. Writes ``OUT/sample_efficiency.png`` and
``OUT/sample_efficiency.md`` (the gain at fixed QE budgets).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

try:
    import qeebm  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qeebm.analysis.gradient_bias import qe_cost
from qeebm.config import SEEDS
from qeebm.utils.runlog import validations

SYSTEMS = ("reinforce-oracle", "qe-ebm-oracle", "qe-ebm-softmax-oracle", "qe-ebm-reinmax-oracle",
           "qe-ebm-loo-cv-oracle")


def cost_per_step(run_dir: Path) -> tuple[str, float]:
    """(estimator, QE forward-pass equivalents per optimiser step) from a run's saved config."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    batch = cfg["optim"]["batch_size"]
    if cfg["method"] == "reinforce":
        return "reinforce", batch * qe_cost("reinforce", cfg["reinforce"]["sampling"]["num_samples"])
    section = cfg["qe_ebm"]
    estimator = section.get("estimator", section.get("relaxation", "st"))
    return estimator, batch * qe_cost(estimator, section["sampling"]["num_samples"])


def gains(runs: Path, system: str, key: str = "val/chrf") -> tuple[str, list[tuple[float, float, int]]]:
    """(estimator, [(QE cost, mean gain over SFT continued, seeds)] per validation step)."""
    per_step: dict[int, list[float]] = {}
    estimator, per = None, 0.0
    for seed in SEEDS:
        run, sft = runs / f"{system}-seed{seed}", runs / f"sft-seed{seed}"
        if not (run / "metrics.jsonl").is_file() or not (sft / "metrics.jsonl").is_file():
            continue
        estimator, per = cost_per_step(run)
        base = {r["step"]: r[key] for r in validations(sft, key)}
        for r in validations(run, key):
            if r["step"] in base:
                per_step.setdefault(r["step"], []).append(r[key] - base[r["step"]])
    return estimator or "?", [(step * per, sum(v) / len(v), len(v)) for step, v in sorted(per_step.items())]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="runs/tables")
    p.add_argument("--out", default="runs/efficiency")
    p.add_argument("--budgets", default="10000,30000,90000",
                   help="QE costs (forward-pass equivalents) at which the table reads each curve")
    args = p.parse_args(argv)
    runs, out = Path(args.runs), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    measured = {s: gains(runs, s) for s in SYSTEMS}
    measured = {s: v for s, v in measured.items() if v[1]}
    if not measured:
        print(f"error: no run of {', '.join(SYSTEMS)} beside an sft run under {runs}", file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for system, (estimator, points) in measured.items():
        # Solid while every seed's run (and SFT continued's) is still going; dotted once patience has
        # stopped one of them and the mean is over fewer seeds.
        seeds = max(n for _, _, n in points)
        full = [p for p in points if p[2] == seeds]
        line, = ax.plot([c / 1000 for c, _, _ in full], [g for _, g, _ in full], marker=".",
                        label=f"{system} ({estimator}, {seeds} seeds)")
        if len(full) < len(points):  # dotted from the last point every seed reached
            rest = points[len(full) - 1:]
            ax.plot([c / 1000 for c, _, _ in rest], [g for _, g, _ in rest], linestyle=":", marker=".",
                    color=line.get_color())
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("QE passes spent (thousands of forward-pass equivalents; a backward counts 2)")
    ax.set_ylabel("dev chrF++ minus SFT continued's")
    ax.set_title("Positive control: gain per QE pass", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "sample_efficiency.png", dpi=120)
    budgets = [float(b) for b in args.budgets.split(",")]
    lines = ["| system | estimator | " + " | ".join(f"gain at {b / 1000:g}k" for b in budgets) + " |",
             "|:--|:--|" + "--:|" * len(budgets)]
    for system, (estimator, points) in measured.items():
        cells = []
        for b in budgets:
            within = [g for c, g, _ in points if c <= b]
            cells.append(f"{max(within):+.2f}" if within and points[-1][0] >= b else "")
        lines.append(f"| {system} | {estimator} | " + " | ".join(cells) + " |")
    text = ("Best dev chrF++ gain over SFT continued (mean over the seeds whose runs reached the step) reached "
            "within each QE budget; empty where the runs ended before spending it.\n\n" + "\n".join(lines) + "\n")
    (out / "sample_efficiency.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"figure: {out / 'sample_efficiency.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
