"""Dev curves of the three-seed tables: each system's validation metric over the continuation, mean
over seeds with the seeds' range shaded, the realistic rows and the positive control side by side,
SFT continued in both.

    qeebm demo --seeds 3 --systems all --runs runs/tables     # the tables, first
    python scripts/curves.py --runs runs/tables --out runs/curves

Writes ``OUT/curves-val_chrf.png`` and ``OUT/curves-val_kiwi.png`` (``--keys``), and prints each
system's step of its best validation per seed, which says whether the budget ended while it was
still improving.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import qeebm  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qeebm.config import EXTRA_SYSTEMS, ORACLE_SYSTEMS, SEEDS, SYSTEMS
from qeebm.runlog import read_metrics

PANELS = {"realistic rows (trained against the tiny Kiwi)": (*SYSTEMS, *EXTRA_SYSTEMS),
          "positive control (an energy or reward that knows the reference)": ("sft", *ORACLE_SYSTEMS)}


def validations(run_dir: Path, key: str) -> dict[int, float]:
    return {r["step"]: r[key] for r in read_metrics(run_dir) if key in r}


def plot(runs: Path, key: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(14, 4.5), sharey=True)
    for ax, (title, systems) in zip(axes, PANELS.items()):
        for system in systems:
            curves = [validations(d, key) for d in (runs / f"{system}-seed{s}" for s in SEEDS) if (d / "metrics.jsonl").is_file()]
            if not curves:
                continue
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            values = [[c[s] for c in curves] for s in steps]
            mean = [sum(v) / len(v) for v in values]
            line, = ax.plot(steps, mean, marker=".", label=f"{system} ({len(curves)} seeds)",
                            color="black" if system == "sft" else None)
            ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], color=line.get_color(), alpha=0.12)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step of the continuation")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel(f"dev {key.removeprefix('val/')} (mean over seeds; band: their range)")
    fig.tight_layout()
    path = out / f"curves-{key.replace('/', '_')}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", required=True, help="the runs directory of `qeebm demo --seeds 3 --systems all`")
    p.add_argument("--out", default="runs/curves", help="output directory (default %(default)s)")
    p.add_argument("--keys", default="val/chrf,val/kiwi", help="validation metrics to plot (default %(default)s)")
    args = p.parse_args(argv)
    runs, out = Path(args.runs), Path(args.out)
    if not any(runs.glob("*-seed*/metrics.jsonl")):
        print(f"error: {runs} holds no <system>-seed<N> runs: run `qeebm demo --seeds 3 --systems all --runs {runs}`",
              file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for key in args.keys.split(","):
        print(plot(runs, key, out))
    print("\n| system | step of the best dev chrF++ (seeds " + " / ".join(map(str, SEEDS)) + ") | best - start | last - best |")
    print("|:--|:--|:--|:--|")
    for system in dict.fromkeys(s for systems in PANELS.values() for s in systems):
        cells = []
        for seed in SEEDS:
            v = validations(runs / f"{system}-seed{seed}", "val/chrf") if (runs / f"{system}-seed{seed}" / "metrics.jsonl").is_file() else {}
            if v:
                best = max(v, key=v.get)
                first, last = min(v), max(v)
                cells.append((str(best), f"{v[best] - v[first]:+.2f}", f"{v[last] - v[best]:+.2f}"))
        if cells:
            print(f"| {system} | " + " | ".join(" / ".join(c[i] for c in cells) for i in range(3)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
