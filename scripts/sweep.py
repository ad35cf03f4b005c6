"""The tuning sweep behind the tiny recipes' settings: the same trial budget for every method, on dev.

    python scripts/sweep.py --world data/tinyworld --out runs/sweep

Every method gets four settings, each trained with the demo's budget (``qeebm/demo.py``: 120 steps,
batch 16, seed 42, validation every 60 steps on the whole dev set) from the same base. A setting's
score is its best validation chrF++ on dev, the demo's selection metric (not the Kiwi the QE methods
train against, which would favour them). The test set is not read. The winners are what
``recipes/configs/tiny_*.yaml`` use; the table goes to ``OUT/sweep.md`` and ``OUT/sweep.json``.

REINFORCE's and PPO's settings come from their own sweep (docs/rl_baselines.md); ``--methods``
chooses which methods run here.
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

from qeebm.demo import SYSTEMS, _train_worker, budget, run_overrides

# system -> four settings (label, overrides): the learning rate for SFT and QE finetuning, the
# energy's weight for QE-EBM (the published absolute beta and three relative weights).
_ENERGY = [("beta 0.001 (published)", ["qe_ebm.weighting=absolute", "qe_ebm.beta_max=0.001"]),
           *[(f"rho {rho:g}", ["qe_ebm.weighting=relative", f"qe_ebm.rho={rho:g}"]) for rho in (0.03, 0.1, 0.3)]]
GRID = {
    "sft": [(f"lr {lr:g}", [f"optim.lr={lr:g}"]) for lr in (1e-4, 2e-4, 5e-4, 1e-3)],
    "qe-ebm-static": _ENERGY,
    "qe-ebm-dynamic": _ENERGY,
    "qe-finetune": [(f"lr {lr:g}", [f"optim.lr={lr:g}"]) for lr in (1e-4, 2e-4, 5e-4, 1e-3)],
}


def best_dev(run_dir: Path) -> tuple[float, int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    vals = [(r["val/chrf"], r["step"]) for r in rows if "val/chrf" in r]
    return max(vals)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="data/tinyworld", help="a built tiny world (default %(default)s)")
    p.add_argument("--out", default="runs/sweep", help="output directory (default %(default)s)")
    p.add_argument("--methods", default=",".join(GRID), help="which systems (default: %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="runs at a time, one thread each (default %(default)s)")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.methods.split(",") if n.strip()]
    unknown = [n for n in names if n not in GRID]
    if unknown:
        print(f"error: unknown methods {unknown}; choose from {', '.join(GRID)}", file=sys.stderr)
        return 2
    world, out, b = Path(args.world), Path(args.out), budget(quick=False)
    start = time.perf_counter()
    runs = {(name, i): out / f"{name}-{i}" for name in names for i in range(len(GRID[name]))}
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_train_worker, f"{name}/{GRID[name][i][0]}", SYSTEMS[name],
                               run_overrides(name, world, d, b, seed=42) + GRID[name][i][1])
                   for (name, i), d in runs.items() if not (d / "final").is_dir()]
        for future in futures:
            future.result()
    lines = [f"Tuning sweep on dev: {b['steps']} steps, batch {b['batch_size']}, seed 42, from {world / 'nllb-base'}; "
             "score = best validation chrF++ on the dev set (300 sentences, greedy).", "",
             "| system | setting | dev chrF++ (step) | chosen |", "|:--|:--|--:|:--|"]
    result = {}
    for name in names:
        scores = [best_dev(runs[(name, i)]) for i in range(len(GRID[name]))]
        chosen = max(range(len(scores)), key=lambda i: scores[i][0])
        result[name] = {"chosen": GRID[name][chosen][0], "settings": [
            {"label": label, "overrides": o, "dev_chrf": s[0], "step": s[1]} for (label, o), s in zip(GRID[name], scores)]}
        for i, ((label, _), (chrf, step)) in enumerate(zip(GRID[name], scores)):
            lines.append(f"| {name} | {label} | {chrf:.2f} ({step}) | {'**yes**' if i == chosen else ''} |")
    lines += ["", f"Wall time {time.perf_counter() - start:.0f} s."]
    text = "\n".join(lines) + "\n"
    (out / "sweep.md").write_text(text, encoding="utf-8")
    (out / "sweep.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
