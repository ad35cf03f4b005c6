"""How good must the QE be? QE-EBM and REINFORCE against tiny Kiwis of three strengths.

    python scripts/qe_strength.py --world data/tinyworld --out runs/qe-strength

A low-resource user's CometKiwi is weaker on their language than on German; nobody has measured what
that costs a method trained against it. The default tiny world ships three reference-free QEs of the
same shape trained on 5%, 20% and all of the same judged rows (``qe/kiwi-weak``, ``qe/kiwi-medium``,
``qe/kiwi``; their held-out correlations are in ``qe/qe_report.json``). Under the demo's protocol and
tuned recipes (``qeebm/demo.py``, seed 42), SFT is trained once and QE-EBM static and REINFORCE once
against each QE. Every run's checkpoint is selected on dev chrF++ (not on the Kiwi it was trained
against, so that SFT's choice does not depend on the QE and a weak QE cannot pick its own favourite).
The test set is decoded with beam 5 and scored with BLEU and the held-out judge (the same judge for
every run). Writes ``OUT/qe_strength.md`` (the table) and ``OUT/qe_strength.png`` (the gain over SFT
on the judge and on BLEU against each QE's held-out Pearson and within-source correlation).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

try:
    import qeebm  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qeebm.demo import train_worker, budget, run_overrides, tiny_recipe
from qeebm.entry import setup_process

QES = ("kiwi-weak", "kiwi-medium", "kiwi")
METHODS = ("qe-ebm-static", "reinforce")


def evaluate(run_dir: Path, world: Path, qe: str) -> dict:
    import torch

    from qeebm.evaluate import MetricSpec, evaluate_run

    torch.set_num_threads(1)
    spec = MetricSpec.tinyworld(world)
    report, _ = evaluate_run(run_dir, metrics=spec, checkpoint="best-chrf", split="test-best-chrf")
    return {m: report["corpus"][m] for m in ("bleu", "chrf", "judge", "kiwi")} | {"qe": qe}


def main(argv=None) -> int:
    setup_process()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="data/tinyworld", help="a built tiny world (default %(default)s)")
    p.add_argument("--out", default="runs/qe-strength", help="output directory (default %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="runs at a time, one thread each (default %(default)s)")
    args = p.parse_args(argv)
    world, out, b = Path(args.world).resolve(), Path(args.out), budget(quick=False)
    report = json.loads((world / "qe" / "qe_report.json").read_text())
    missing = [q for q in QES if not (world / "qe" / q).is_dir() or q not in report]
    if missing:
        print(f"error: {world / 'qe'} has no {', '.join(missing)} (the default world ships them)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    runs = {("sft", "-"): out / "sft"} | {(m, q): out / f"{m}-{q}" for m in METHODS for q in QES}
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(train_worker, f"{m}/{q}", tiny_recipe(m),
                               run_overrides(m, world, d, b, seed=42) + ["eval.metric=chrf", "eval.also_best=[chrf]"]
                               + ([f"qe.path={world / 'qe' / q}"] if q != "-" else []))
                   for (m, q), d in runs.items() if not (d / "final").is_dir()]
        for future in futures:
            future.result()
        scores = dict(zip(runs, pool.map(evaluate, runs.values(), [world] * len(runs),
                                         [q for _, q in runs])))
    sft = scores[("sft", "-")]
    rows = []
    for m in METHODS:
        for q in QES:
            s = scores[(m, q)]
            rows.append({"method": m, "qe": q, "pearson": report[q]["pearson"], "within": report[q]["within_source_pearson"],
                         **{k: s[k] for k in ("bleu", "chrf", "judge")},
                         "gain_bleu": s["bleu"] - sft["bleu"], "gain_judge": 100 * (s["judge"] - sft["judge"])})
    png = plot(rows, out)
    lines = [f"QE strength: seed 42, the demo's protocol (at most {b['steps']} steps), checkpoints selected on dev chrF++; "
             f"test set, beam 5. SFT: BLEU {sft['bleu']:.2f}, chrF++ {sft['chrf']:.2f}, judge x100 {100 * sft['judge']:.2f}.", "",
             "| method | QE | QE held-out Pearson | QE within-source r | BLEU | chrF++ | judge x100 | BLEU - SFT | judge - SFT |",
             "|:--|:--|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['qe']} | {r['pearson']:.3f} | {r['within']:.3f} | {r['bleu']:.2f} | {r['chrf']:.2f} | "
                     f"{100 * r['judge']:.2f} | {r['gain_bleu']:+.2f} | {r['gain_judge']:+.2f} |")
    lines += ["", f"Plot: {png}. Wall time {time.perf_counter() - start:.0f} s (one seed: differences of a few tenths are noise)."]
    text = "\n".join(lines) + "\n"
    (out / "qe_strength.md").write_text(text, encoding="utf-8")
    (out / "qe_strength.json").write_text(json.dumps({"sft": sft, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    print(text)
    return 0


def plot(rows: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for method in METHODS:
        mine = [r for r in rows if r["method"] == method]
        for ax, key, title in zip(axes, ("gain_judge", "gain_bleu"), ("held-out judge x100 - SFT", "BLEU - SFT")):
            ax.plot([r["pearson"] for r in mine], [r[key] for r in mine], marker="o", label=method)
            ax.set_title(title)
    for ax in axes:
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel("the trained-on QE's held-out Pearson with true quality")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    path = out / "qe_strength.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
