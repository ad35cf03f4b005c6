"""The tuning sweep behind the tiny recipes' settings: the same trial budget for every method, on dev.

    python scripts/sweep.py --world data/tinyworld --out runs/sweep

Every method gets four settings, each trained under the demo's protocol (``qeebm/demo.py``:
``budget`` and ``run_overrides``; seed 42) from the same base: four learning rates for SFT, which has
nothing else to tune; for every other method SFT's best learning rate and half of it, crossed with
two values of the method's own knob: the energy's weight rho for QE-EBM (relative weighting), the
policy-gradient weight beta for REINFORCE, the KL target for PPO, the pseudo-target weight for QE
finetuning. A setting's score is its best
validation on dev, by the selection metric (``--metric``: ``kiwi``, the published selection, or
``chrf``); both are in the table. The test set is not read. The winners are what
``recipes/configs/tiny_*.yaml`` use; the table goes to ``OUT/sweep.md`` and ``OUT/sweep.json``.
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

SFT_LRS = (2e-3, 4e-3, 6e-3, 8e-3)
# Every other method: SFT's best learning rate and half of it (an added loss term can want a smaller
# step), crossed with two values of its own knob.
KNOBS = {
    "qe-ebm-static": ("qe_ebm.rho", (0.3, 1.0), "rho"),
    "qe-ebm-dynamic": ("qe_ebm.rho", (0.3, 1.0), "rho"),
    "reinforce": ("reinforce.beta", (0.3, 1.0), "beta"),
    "ppo": ("ppo.kl_target", (1.0, 4.0), "KL target"),
    "qe-finetune": ("qe_finetune.beta", (0.5, 1.0), "beta"),
}


def grid(name: str, sft_lr: float) -> list[tuple[str, list[str]]]:
    """The four (label, overrides) settings of ``name``, given SFT's chosen learning rate."""
    if name == "sft":
        return [(f"lr {lr:g}", [f"optim.lr={lr:g}"]) for lr in SFT_LRS]
    knob, values, label = KNOBS[name]
    return [(f"lr {lr:g}, {label} {v:g}", [f"optim.lr={lr:g}", f"{knob}={v:g}"])
            for lr in (sft_lr / 2, sft_lr) for v in values]


def best_dev(run_dir: Path, metric: str) -> tuple[float, int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return max((r[f"val/{metric}"], r["step"]) for r in rows if f"val/{metric}" in r)


def train_all(runs: dict, settings: dict, world: Path, b: dict, base: str, workers: int) -> None:
    """Train every (name, i) run not finished yet, ``workers`` at a time."""
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_train_worker, f"{name}/{settings[name][i][0]}", SYSTEMS[name],
                               run_overrides(name, world, d, b, seed=42, base=base) + settings[name][i][1])
                   for (name, i), d in runs.items() if not (d / "final").is_dir()]
        for future in futures:
            future.result()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="data/tinyworld", help="a built tiny world (default %(default)s)")
    p.add_argument("--out", default="runs/sweep", help="output directory (default %(default)s)")
    p.add_argument("--methods", default=",".join(SYSTEMS), help="which systems (default: %(default)s)")
    p.add_argument("--metric", default="kiwi", choices=["kiwi", "chrf"], help="what picks the winner (default %(default)s)")
    p.add_argument("--base", default="nllb", choices=["nllb", "mbart"])
    p.add_argument("--workers", type=int, default=2, help="runs at a time, one thread each (default %(default)s)")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.methods.split(",") if n.strip()]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown:
        print(f"error: unknown methods {unknown}; choose from {', '.join(SYSTEMS)}", file=sys.stderr)
        return 2
    world, out, b = Path(args.world), Path(args.out), budget(quick=False)
    start = time.perf_counter()
    # SFT first: the other methods' learning rates are its best and half of it.
    sft_grid = {"sft": grid("sft", 0.0)}
    sft_runs = {("sft", i): out / f"sft-{i}" for i in range(len(sft_grid["sft"]))}
    train_all(sft_runs, sft_grid, world, b, args.base, args.workers)
    score = lambda d: best_dev(d, args.metric)[0]  # noqa: E731
    sft_lr = SFT_LRS[max(range(len(SFT_LRS)), key=lambda i: score(sft_runs[("sft", i)]))]
    settings = {name: grid(name, sft_lr) for name in names}
    runs = {(name, i): out / f"{name}-{i}" for name in names for i in range(len(settings[name]))}
    train_all(runs, settings, world, b, args.base, args.workers)
    lines = [f"Tuning sweep on dev: the demo's protocol (at most {b['steps']} steps, batch {b['batch_size']}, validation "
             f"every {b['every']} steps on the whole dev set, greedy, patience {b['patience']}), seed 42, from "
             f"{world / (args.base + '-base')}; a setting's score is its best validation {args.metric} (both shown). "
             f"SFT's learning rate {sft_lr:g} and half of it are the other methods' two.", "",
             "| system | setting | dev Kiwi x100 (step) | dev chrF++ (step) | chosen |", "|:--|:--|--:|--:|:--|"]
    result = {"sft_lr": sft_lr}
    for name in names:
        grid_ = settings[name]
        kiwi = [best_dev(runs[(name, i)], "kiwi") for i in range(len(grid_))]
        chrf = [best_dev(runs[(name, i)], "chrf") for i in range(len(grid_))]
        picked = kiwi if args.metric == "kiwi" else chrf
        chosen = max(range(len(picked)), key=lambda i: picked[i][0])
        result[name] = {"chosen": grid_[chosen][0], "overrides": grid_[chosen][1], "settings": [
            {"label": label, "overrides": o, "dev_kiwi": k[0], "kiwi_step": k[1], "dev_chrf": c[0], "chrf_step": c[1]}
            for (label, o), k, c in zip(grid_, kiwi, chrf)]}
        for i, ((label, _), k, c) in enumerate(zip(grid_, kiwi, chrf)):
            lines.append(f"| {name} | {label} | {100 * k[0]:.2f} ({k[1]}) | {c[0]:.2f} ({c[1]}) | "
                         f"{'**yes**' if i == chosen else ''} |")
    lines += ["", f"Wall time {time.perf_counter() - start:.0f} s."]
    text = "\n".join(lines) + "\n"
    (out / "sweep.md").write_text(text, encoding="utf-8")
    (out / "sweep.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
