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

from qeebm.config import SEEDS
from qeebm.experiments.demo import default_systems, knows_reference
from qeebm.utils.runlog import validations

_SYSTEMS = default_systems()
PANELS = {"realistic rows (trained against the tiny Kiwi)": [s for s in _SYSTEMS if not knows_reference(s)],
          "positive control (an energy or reward that knows the reference)":
              ["sft", *(s for s in _SYSTEMS if knows_reference(s))]}


def curves(runs: Path, key: str) -> dict[str, list[dict[int, float]]]:
    """system -> one ``{step: value}`` per seed that has a run (a step logged twice: its later record)."""
    out = {}
    for system in dict.fromkeys(s for systems in PANELS.values() for s in systems):
        dirs = [d for d in (runs / f"{system}-seed{seed}" for seed in SEEDS) if (d / "metrics.jsonl").is_file()]
        if dirs:
            out[system] = [{r["step"]: r[key] for r in validations(d, key)} for d in dirs]
    return out


def plot(measured: dict[str, list[dict[int, float]]], key: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(14, 4.5), sharey=True)
    for ax, (title, systems) in zip(axes, PANELS.items()):
        for system in (s for s in systems if s in measured):
            seeds = measured[system]
            steps = sorted(set.intersection(*(set(c) for c in seeds)))
            values = [[c[s] for c in seeds] for s in steps]
            mean = [sum(v) / len(v) for v in values]
            line, = ax.plot(steps, mean, marker=".", label=f"{system} ({len(seeds)} seeds)",
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
    measured = {key: curves(runs, key) for key in args.keys.split(",")}
    for key, by_system in measured.items():
        print(plot(by_system, key, out))
    print("\n| system | step of the best dev chrF++ (seeds " + " / ".join(map(str, SEEDS)) + ") | best - start | last - best |")
    print("|:--|:--|:--|:--|")
    for system, seeds in (measured.get("val/chrf") or curves(runs, "val/chrf")).items():
        cells = []
        for v in (v for v in seeds if v):
            best = max(v, key=v.get)
            cells.append((str(best), f"{v[best] - v[min(v)]:+.2f}", f"{v[max(v)] - v[best]:+.2f}"))
        if cells:
            print(f"| {system} | " + " | ".join(" / ".join(c[i] for c in cells) for i in range(3)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
