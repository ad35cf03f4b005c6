"""How good must the QE be? QE-EBM static and REINFORCE against QEs of every strength, from SFT's plateau.

    python scripts/qe_strength.py --world data/tinyworld --out runs/qe-strength

A low-resource user's CometKiwi is weaker on their language than on German; nobody has measured what
that costs a method trained against it. Under protocol v3 (``qeebm/demo.py``, seed 42: every run
continues from SFT's plateau for the same budget, with its tuned recipe), SFT is continued once and
QE-EBM static and REINFORCE once against each QE the world ships, from the weakest to an oracle:
``qe/kiwi-weak``, ``qe/kiwi-medium`` and ``qe/kiwi-v1`` (the same tiny Kiwi trained on 5%, 20% and all
of the first judged rows), ``qe/kiwi`` (the first one trained further on converged systems' outputs),
and ``qe/comet``, the reference-based COMET reading each pool sentence's true reference (the oracle).
Each QE's strength is measured where the methods use it: ``qeebm qe-check`` on the plateau
translator's own samples of the dev sentences (8 a sentence), the mean within-source Spearman
correlation with sentence chrF++ (``OUT/qe-check/QE``). Every run's checkpoint is selected on dev
chrF++ (no QE picks its own favourite); the test set is decoded with beam 5 and scored with BLEU,
chrF++ and the held-out judge. Writes ``OUT/qe_strength.md`` (the table), ``OUT/qe_strength.json``
and ``OUT/qe_strength.png`` (the gain over SFT against the QE's within-source correlation).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

try:
    import qeebm  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qeebm.demo import budget, plateau_start, run_jobs, run_overrides, tiny_recipe, train_plateaus
from qeebm.entry import setup_process

QES = ("kiwi-weak", "kiwi-medium", "kiwi-v1", "kiwi", "comet")
METHODS = ("qe-ebm-static", "reinforce")
SEED = 42
# A reference-based QE reads each pool sentence's reference.
REFERENCE_BASED = {"comet"}


def evaluate(run_dir: Path, world: Path) -> dict:
    import torch

    from qeebm.evaluate import MetricSpec, evaluate_run

    torch.set_num_threads(1)
    spec = MetricSpec.tinyworld(world)
    report, _ = evaluate_run(run_dir, metrics=spec, checkpoint="best-chrf", split="test-best-chrf")
    return {m: report["corpus"][m] for m in ("bleu", "chrf", "judge")}


def strength(world: Path, translator: Path, qe: str, out: Path) -> dict:
    """qe-check's ranking of the QE on the translator's own samples (run once, then read back)."""
    from qeebm.qe.check import run

    path = out / "qe_check.json"
    if not path.is_file():
        run(str(world / "qe" / qe), str(translator), str(world / "data" / "dev.tsv"), out, seed=0)
    ranking = json.loads(path.read_text())["measurements"]["ranking"]["chrf"]
    return {"within_spearman": ranking["within_source_spearman"], "within_se": ranking["within_source_spearman_se"],
            "pearson": ranking["pearson"]}


def main(argv=None) -> int:
    setup_process()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="data/tinyworld", help="a built tiny world (default %(default)s)")
    p.add_argument("--out", default="runs/qe-strength", help="output directory (default %(default)s)")
    args = p.parse_args(argv)
    world, out, b = Path(args.world), Path(args.out), budget(quick=False)
    missing = [q for q in QES if not (world / "qe" / q).is_dir()]
    if missing:
        print(f"error: {world / 'qe'} has no {', '.join(missing)} (the default world ships them)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    plateau = out / "plateau"
    train_plateaus({SEED: plateau}, world, b)
    begin = plateau_start(plateau)
    runs = {("sft", "-"): out / "sft"} | {(m, q): out / f"{m}-{q}" for m in METHODS for q in QES}
    jobs = []
    for (m, q), d in runs.items():
        overrides = run_overrides(m, world, d, b, SEED, begin) + ["eval.metric=chrf", "eval.also_best=[chrf]"]
        if q != "-":
            overrides.append(f"qe.path={world / 'qe' / q}")
        if q in REFERENCE_BASED:
            overrides.append(f"data.mono.path={world / 'data' / 'mono_ref.tsv'}")
        jobs.append((f"{m}/{q}", tiny_recipe(m), overrides))
    run_jobs(jobs)
    measured = {q: strength(world, begin, q, out / "qe-check" / q) for q in QES}
    scores = {key: evaluate(d, world) for key, d in runs.items()}
    sft = scores[("sft", "-")]
    rows = []
    for m in METHODS:
        for q in QES:
            s = scores[(m, q)]
            rows.append({"method": m, "qe": q, **measured[q], **s, "gain_bleu": s["bleu"] - sft["bleu"],
                         "gain_chrf": s["chrf"] - sft["chrf"], "gain_judge": 100 * (s["judge"] - sft["judge"])})
    png = plot(rows, out)
    lines = [f"QE strength: seed 42, protocol v3 ({b['steps']} steps from SFT's plateau), checkpoints selected on dev "
             f"chrF++; test set, beam 5. SFT continued: BLEU {sft['bleu']:.2f}, chrF++ {sft['chrf']:.2f}, judge x100 "
             f"{100 * sft['judge']:.2f}. A QE's strength: its within-source Spearman with sentence chrF++ on the plateau's "
             "own samples of the dev sentences (qeebm qe-check).", "",
             "| method | QE | within-source Spearman (se) | BLEU | chrF++ | judge x100 | BLEU - SFT | chrF++ - SFT | judge - SFT |",
             "|:--|:--|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['qe']} | {r['within_spearman']:.3f} ({r['within_se']:.3f}) | {r['bleu']:.2f} | "
                     f"{r['chrf']:.2f} | {100 * r['judge']:.2f} | {r['gain_bleu']:+.2f} | {r['gain_chrf']:+.2f} | "
                     f"{r['gain_judge']:+.2f} |")
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

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for method in METHODS:
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["within_spearman"])
        for ax, key, title in zip(axes, ("gain_bleu", "gain_chrf", "gain_judge"),
                                  ("BLEU - SFT", "chrF++ - SFT", "held-out judge x100 - SFT")):
            ax.plot([r["within_spearman"] for r in mine], [r[key] for r in mine], marker="o", label=method)
            for r in mine:
                ax.annotate(r["qe"], (r["within_spearman"], r[key]), fontsize=7, alpha=0.7)
            ax.set_title(title)
    for ax in axes:
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel("the trained-on QE's within-source Spearman with chrF++")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    path = out / "qe_strength.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
