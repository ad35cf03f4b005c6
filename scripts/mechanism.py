"""The mechanism test: does the energy's gradient optimise the QE, and better than a scalar reward?

    python scripts/mechanism.py --world data/tinyworld --out runs/mechanism

From the tiny world's base translator, with no supervised term (alpha = 0), every method optimises the
trained-on Kiwi on the source-only pool and nothing else:

* QE-EBM with each relaxation (st, softmax, gumbel-st): loss = mean energy = -mean Kiwi of K samples;
* REINFORCE with the leave-one-out (RLOO) baseline, reward = Kiwi;
* PPO, reward = Kiwi (with its KL penalty to the base, its own regulariser).

Every method draws the same samples per step (``--batch`` sources x ``--samples`` ancestral samples),
makes ``--steps`` optimiser steps, and has no reward-hacking guards (the test is of the gradient, not
of the guards). Each method's learning rate is picked from ``--lrs`` by the best validation Kiwi on
the dev set (the objective it optimises; the test set is not used). Validation every ``--every`` steps
decodes the dev set (greedy, ``--dev`` sentences) and scores it with the trained-on Kiwi, the held-out
judge and chrF++.

Writes ``OUT/mechanism.md`` (the table: Kiwi gain per 1,000 samples drawn, the judge and chrF++ moves,
the learning-rate grid) and ``OUT/mechanism.png`` (dev Kiwi and judge against samples drawn).
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

from qeebm.analysis.probe import qe_only_overrides, start_metrics
from qeebm.config import data_path_overrides
from qeebm.experiments.demo import train_worker
from qeebm.utils.process import setup_process
from qeebm.utils.runlog import read_metrics, validations

# name -> (recipe, overrides): every variant optimises Kiwi alone.
VARIANTS = {
    "qe-ebm-st": ("tiny_qe-ebm-static.yaml", ["qe_ebm.estimator=st"]),
    "qe-ebm-softmax": ("tiny_qe-ebm-static.yaml", ["qe_ebm.estimator=softmax"]),
    "qe-ebm-gumbel-st": ("tiny_qe-ebm-static.yaml", ["qe_ebm.estimator=gumbel-st"]),
    "reinforce-rloo": ("tiny_reinforce.yaml", ["reinforce.baseline=rloo"]),
    "ppo": ("tiny_ppo.yaml", []),
}


def variant_overrides(name: str, k: int) -> list[str]:
    method = name.split("-")[0] if not name.startswith("qe-ebm") else "qe-ebm"
    return qe_only_overrides(method, k)


def overrides(name: str, lr: float, args, run_dir: Path) -> list[str]:
    world = Path(args.world)
    recipe_overrides = VARIANTS[name][1]
    return recipe_overrides + variant_overrides(name, args.samples) + [
        f"seed={args.seed}",
        f"model.name_or_path={world / args.base}",
        *data_path_overrides(world / "data"),
        f"qe.path={world / 'qe/kiwi'}",
        f"optim.lr={lr}",
        f"optim.max_steps={args.steps}",
        f"optim.batch_size={args.batch}",
        "optim.warmup_steps=0",
        "optim.scheduler=constant",
        f"eval.every={args.every}",
        f"eval.max_examples={args.dev}",
        "eval.metric=kiwi",
        "eval.qe_metrics=[kiwi,judge]",
        f"eval.judge_path={world / 'qe/judge'}",
        "generation.num_beams=1",
        f"output.run_dir={run_dir}",
        f"output.save_every={args.steps}",
        "output.keep_last=1",
        f"logging.every={args.every}",
        "logging.progress_bar=false",
        "logging.report_to=[]",
    ]


def read_validations(run_dir: Path) -> list[dict]:
    return validations(run_dir, "val/kiwi")


def sample_length_ratio(run_dir: Path, step: int) -> float | None:
    """The training samples' output/source length ratio logged at ``step`` (None if not logged)."""
    for row in read_metrics(run_dir):
        if row.get("step") == step and "val/kiwi" not in row:
            ratio = [v for k, v in row.items() if k.endswith("/len_ratio")]
            if ratio:
                return ratio[0]
    return None


def step0(args) -> dict:
    """Dev metrics of the base translator, the common starting point (step 0) of every curve."""
    import torch

    from qeebm.config import load_config

    torch.set_num_threads(1)
    world = Path(args.world)
    cfg = load_config(overrides=[*data_path_overrides(world / "data"), f"qe.path={world / 'qe/kiwi'}",
                                 f"model.name_or_path={world / args.base}",
                                 f"eval.max_examples={args.dev}", "eval.qe_metrics=[kiwi,judge]",
                                 f"eval.judge_path={world / 'qe/judge'}", "generation.num_beams=1"])
    return {"step": 0, **{f"val/{k}": v for k, v in start_metrics(cfg, device="cpu").items()}}


def plot(curves: dict[str, list[dict]], chosen: dict[str, float], per_step: dict[str, int], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for name, rows in curves.items():
        x = [r["step"] * per_step[name] / 1000 for r in rows]
        for ax, key in zip(axes, ("val/kiwi", "val/judge", "val/chrf")):
            ax.plot(x, [r[key] for r in rows], marker="o", ms=3, label=f"{name} (lr {chosen[name]:g})")
    for ax, title in zip(axes, ("trained-on Kiwi (dev, greedy)", "held-out judge (dev)", "chrF++ (dev)")):
        ax.set_title(title)
        ax.set_xlabel("samples drawn (thousands)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path = out / "mechanism.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    setup_process()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="data/tinyworld", help="a built tiny world (default %(default)s)")
    p.add_argument("--base", default="nllb-base", help="its base translator to start from (default %(default)s)")
    p.add_argument("--out", default="runs/mechanism", help="output directory (default %(default)s)")
    p.add_argument("--steps", type=int, default=40, help="optimiser steps per run (default %(default)s)")
    p.add_argument("--batch", type=int, default=16, help="source sentences per step (default %(default)s)")
    p.add_argument("--samples", type=int, default=5, help="samples per source (default %(default)s)")
    p.add_argument("--lrs", default="3e-4,1e-3", help="learning-rate grid (default %(default)s)")
    p.add_argument("--every", type=int, default=10, help="steps between validations (default %(default)s)")
    p.add_argument("--dev", type=int, default=200, help="dev sentences per validation (default %(default)s)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="which variants (default: all)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--workers", type=int, default=2, help="runs at a time, one thread each (default %(default)s)")
    args = p.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(f"error: unknown variants {unknown}; choose from {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    lrs = [float(x) for x in args.lrs.split(",")]
    start = time.perf_counter()
    runs = {(name, lr): out / f"{name}-lr{lr:g}" for name in names for lr in lrs}
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(train_worker, f"{name}/lr{lr:g}", VARIANTS[name][0], overrides(name, lr, args, d))
                   for (name, lr), d in runs.items() if not (d / "final").is_dir()]
        start_row = pool.submit(step0, args)
        for future in futures:
            future.result()
        base = start_row.result()

    # The learning rate of each variant: its best validation Kiwi over the run (dev only).
    grid: dict[str, dict[float, float]] = {n: {} for n in names}
    curves, chosen = {}, {}
    for (name, lr), d in runs.items():
        grid[name][lr] = max(r["val/kiwi"] for r in read_validations(d))
    for name in names:
        chosen[name] = max(grid[name], key=grid[name].get)
        curves[name] = [base] + read_validations(runs[(name, chosen[name])])
    per_step = {n: args.batch * args.samples for n in names}  # the same for every variant
    png = plot(curves, chosen, per_step, out)

    lines = [f"Mechanism test: alpha = 0, {args.steps} steps x {args.batch} sources x {args.samples} samples "
             f"from {Path(args.world) / args.base}, dev {args.dev} sentences (greedy), seed {args.seed}.", "",
             "| variant | lr (picked on dev Kiwi) | dev Kiwi x100: start -> best (step) | Kiwi gain per 1,000 samples, "
             f"first {args.every} steps "
             "| judge x100 at that step (start) | chrF++ at that step (start) | samples' length ratio at that step "
             "| Kiwi at each lr |",
             "|:--|--:|--:|--:|--:|--:|--:|:--|"]
    for name in names:
        rows = curves[name][1:]
        best = max(rows, key=lambda r: r["val/kiwi"])
        # The rate over the first validation interval: later the QE saturates and the rate says nothing.
        first = rows[0]
        gain = (first["val/kiwi"] - base["val/kiwi"]) * 100
        drawn = first["step"] * per_step[name] / 1000
        at_lr = ", ".join(f"{lr:g}: {100 * v:.2f}" for lr, v in sorted(grid[name].items()))
        ratio = sample_length_ratio(runs[(name, chosen[name])], best["step"])
        lines.append(f"| {name} | {chosen[name]:g} | {100 * base['val/kiwi']:.2f} -> {100 * best['val/kiwi']:.2f} "
                     f"({best['step']}) | {gain / drawn:+.3f} | {100 * best['val/judge']:.2f} "
                     f"({100 * base['val/judge']:.2f}) | {best['val/chrf']:.1f} ({base['val/chrf']:.1f}) "
                     f"| {'-' if ratio is None else f'{ratio:.2f}'} | {at_lr} |")
    lines += ["", f"Curves: {png}. Wall time {time.perf_counter() - start:.0f} s."]
    text = "\n".join(lines) + "\n"
    (out / "mechanism.md").write_text(text, encoding="utf-8")
    (out / "mechanism.json").write_text(json.dumps({"base": base, "curves": curves, "chosen": chosen,
                                                    "grid": {n: {str(k): v for k, v in g.items()} for n, g in grid.items()},
                                                    "args": vars(args)}, indent=2) + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
