"""What the energy's weight amounts to: the measured gradient ratio of QE-EBM's two terms.

    python scripts/energy_weight.py --world data/tinyworld

From the tiny world's base translator, two short QE-EBM static runs with the demo's batch (16
labelled + 16 source-only sentences, K = 5 samples): one at the published weight (``weighting:
absolute``, beta = 0.001 from the first step, alpha = 1 - beta), one with ``weighting: relative``
at ``--rho``. Every step logs the norms of alpha*grad(CE) and beta*grad(E), their ratio and cosine
(``diag/*``) and the within-source spread of the samples' QE scores; the table gives their means over
the run, and for the relative run the beta it chose. The published beta was tuned for the real
CometKiwi on mBART-50: this says what it means for another QE and translator.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

try:
    import qeebm  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qeebm.config import data_path_overrides
from qeebm.experiments.demo import CONFIGS, train_worker
from qeebm.utils.process import setup_process
from qeebm.utils.runlog import read_metrics

KEYS = ("diag/grad_ce", "diag/grad_energy", "diag/ratio_energy", "diag/cos_energy", "qe-ebm/beta",
        "qe-ebm/score_spread", "qe-ebm/sample_score")


def run(world: Path, run_dir: Path, steps: int, extra: list[str]) -> dict[str, float]:
    overrides = [
        f"model.name_or_path={world / 'nllb-base'}",
        *data_path_overrides(world / "data"),
        f"qe.path={world / 'qe/kiwi'}",
        f"optim.max_steps={steps}",
        "optim.batch_size=16",
        "optim.warmup_steps=0",
        "optim.scheduler=constant",
        "qe_ebm.energy_ramp_steps=0",
        "eval.every=0",
        f"output.run_dir={run_dir}",
        f"output.save_every={steps}",
        "logging.every=1",
        "logging.progress_bar=false",
        "logging.report_to=[]",
        *extra,
    ]
    train_worker(run_dir.name, "tiny_qe-ebm-static.yaml", overrides)
    rows = [r for r in read_metrics(run_dir) if "diag/ratio_energy" in r]  # the training records
    return {k: statistics.fmean(r[k] for r in rows) for k in KEYS if rows and all(k in r for r in rows)}


def main(argv=None) -> int:
    setup_process()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="data/tinyworld", help="a built tiny world (default %(default)s)")
    p.add_argument("--steps", type=int, default=20, help="optimiser steps per run (default %(default)s)")
    p.add_argument("--beta", type=float, default=0.001, help="the absolute weight (default: published %(default)s)")
    p.add_argument("--rho", type=float, default=0.1, help="the relative weight (default %(default)s)")
    args = p.parse_args(argv)
    world = Path(args.world)
    if not (CONFIGS / "tiny_qe-ebm-static.yaml").is_file() or not (world / "nllb-base").is_dir():
        print(f"error: {world} is not a built tiny world (qeebm tinyworld build {world})", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        absolute = run(world, Path(tmp) / "absolute", args.steps,
                       ["qe_ebm.weighting=absolute", f"qe_ebm.energy_weight={args.beta}"])
        relative = run(world, Path(tmp) / "relative", args.steps,
                       ["qe_ebm.weighting=relative", f"qe_ebm.rho={args.rho}", "qe_ebm.rho_every=1"])
    print(f"\nQE-EBM static from {world / 'nllb-base'}, {args.steps} steps, batch 16 + 16, K = 5; "
          "means over the steps:\n")
    print("| weighting | beta | norm alpha*grad CE | norm beta*grad E | ratio | cosine | QE score spread within source "
          "| samples' mean QE score |")
    print("|:--|--:|--:|--:|--:|--:|--:|--:|")
    for name, m in ((f"absolute (published beta {args.beta:g})", absolute), (f"relative (rho {args.rho:g})", relative)):
        print(f"| {name} | {m['qe-ebm/beta']:.4g} | {m['diag/grad_ce']:.3g} | {m['diag/grad_energy']:.3g} "
              f"| {m['diag/ratio_energy']:.3g} | {m['diag/cos_energy']:+.3f} | {m['qe-ebm/score_spread']:.4f} "
              f"| {m['qe-ebm/sample_score']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
