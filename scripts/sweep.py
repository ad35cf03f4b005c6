"""The tuning sweep behind the tiny recipes' settings: the same trial budget for every system, on dev.

    python scripts/sweep.py --world data/tinyworld --out runs/sweep --test   # docs/results.md

Every setting is trained under the demo's protocol (``qeebm/experiments/demo.py``: ``budget`` and
``run_overrides``; seed 42), continuing from the same SFT plateau (``--plateau``; by default the one the
default world ships for seed 42, or trained first): four learning rates for SFT continued, which has nothing else to tune; for every other
system SFT's best learning rate (times each of ``--lr-factors``, default 1 alone; PPO also divided
by its 8 optimiser updates per step) with three values of the system's own knob (PPO: two, at each
of its two learning rates): the energy's weight rho for QE-EBM (relative weighting),
the policy-gradient weight for REINFORCE and GRPO, the KL target for PPO, the pseudo-target weight for
QE finetuning, DPO's and CPO's beta. A system trained against the oracle gets the grid of its
method trained against the Kiwi. A setting's score is
its best validation on dev, by the selection metric (``--metric``: ``chrf``, the default, or
``kiwi``, the published checkpoint selection; a Kiwi pick of settings chooses whatever raises the
trained-on QE most, reward hacking included); both are in the table. The winners are what ``recipes/configs/tiny_*.yaml``
use; the table goes to ``OUT/sweep.md`` and ``OUT/sweep.json``.

The sweep does not read the test set. ``--test`` then evaluates the base and the winners on it, once,
exactly as the demo does (both checkpoint selections, QE reranking and MBR of the best system), into
``OUT/comparison`` and ``OUT/comparison-chrf``: the demo's table for seed 42 without training the
winners a second time.
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

from qeebm.config import SEEDS
from qeebm.experiments.demo import (
    budget,
    default_systems,
    evaluate_and_compare,
    plateau_start,
    train_plateaus,
    train_runs,
)
from qeebm.utils.process import setup_process
from qeebm.utils.runlog import best_validation

# Continuing from the plateau, where SFT's own run ended at a learning rate decayed to 0.
SFT_LRS = (5e-4, 1e-3, 2e-3, 4e-3)
# Every other system: SFT's best learning rate with three values of its own knob.
KNOBS = {
    # From SFT's plateau: rho from a tenth of the CE's gradient to as much (from the base, rho 1 made
    # QE-EBM static's samples 6-8 times the source's length within 100 steps; docs/results.md).
    "qe-ebm-static": ("qe_ebm.rho", (0.1, 0.3, 1.0), "rho"),
    "qe-ebm-dynamic": ("qe_ebm.rho", (0.1, 0.3, 1.0), "rho"),
    "reinforce": ("reinforce.pg_weight", (0.3, 1.0, 3.0), "pg_weight"),
    "ppo": ("ppo.kl_target", (1.0, 4.0), "KL target"),
    "grpo": ("grpo.pg_weight", (0.3, 1.0, 3.0), "pg_weight"),
    "qe-finetune": ("qe_finetune.distill_weight", (0.5, 1.0, 2.0), "distill_weight"),
    "dpo": ("preference.beta", (0.1, 0.3, 1.0), "beta"),
    # CPO's margins are raw sequence log-prob differences (tens of nats): its loss saturates sooner.
    "cpo": ("preference.beta", (0.03, 0.1, 0.3), "beta"),
}
# A score-function gradient's norm at K = 5 is mostly noise, so the same rho puts less signal into
# the update than a relaxation's nearly noise-free gradient: loo-cv's grid sits one step higher.
KNOBS["qe-ebm-loo-cv"] = ("qe_ebm.rho", (0.3, 1.0, 3.0), "rho")


def grid_of(system: str) -> tuple[str, tuple, str]:
    """A system's grid: its own, else its method's. The positive control (``*-oracle``, ``*-chrf``)
    gets the grid of the system it controls, and QE-EBM with another estimator straight-through's."""
    for name in (system, system.removesuffix("-oracle").removesuffix("-chrf")):
        if name in KNOBS:
            return KNOBS[name]
    if system.startswith("qe-ebm"):
        return KNOBS["qe-ebm-static"]
    raise KeyError(f"{system}: no tuning grid in scripts/sweep.py's KNOBS")


# PPO makes epochs x minibatches optimiser updates per step (2 x 4 in the demo) where every other
# method makes one, so at SFT's learning rate it moves the model several times as far per step; it
# also gets SFT's rates divided by that count (the same distance per step). It is a baseline, so the
# extra trials can only make the comparison harder for QE-EBM.
PPO_UPDATES_PER_STEP = 8


def grid(name: str, sft_lr: float, lr_factors=(0.5, 1.0)) -> list[tuple[str, list[str]]]:
    """The (label, overrides) settings of ``name``, given SFT's chosen learning rate."""
    if name == "sft":
        return [(f"lr {lr:g}", [f"optim.lr={lr:g}"]) for lr in SFT_LRS]
    knob, values, label = grid_of(name)
    lrs = [sft_lr * f for f in lr_factors]
    if name == "ppo":
        lrs += [lr / PPO_UPDATES_PER_STEP for lr in lrs]
    return [(f"lr {lr:g}, {label} {v:g}", [f"optim.lr={lr:g}", f"{knob}={v:g}"]) for lr in lrs for v in values]


def best_dev(run_dir: Path, metric: str) -> tuple[float, int]:
    return best_validation(run_dir, f"val/{metric}")


def train_all(runs: dict, settings: dict, world: Path, b: dict, start: Path) -> None:
    """Train every (name, i) run not finished yet (a rerun of the sweep resumes it)."""
    todo = {(name, i): d for (name, i), d in runs.items() if not (d / "final").is_dir()}
    # train_runs keys runs by (name, seed); a setting's index stands in for the seed, the seed is 42.
    # output.resume: a run stopped by a signal (it checkpoints first) continues where it stopped.
    train_runs(todo, world, b, {SEEDS[0]: start}, seed=SEEDS[0],
               extra={k: settings[k[0]][k[1]][1] + ["output.resume=true"] for k in todo})


def main(argv=None) -> int:
    setup_process()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="data/tinyworld", help="a built tiny world (default %(default)s)")
    p.add_argument("--out", default="runs/sweep", help="output directory (default %(default)s)")
    p.add_argument("--methods", default=",".join(default_systems()), help="which systems (default: %(default)s)")
    p.add_argument("--plateau", help="SFT's plateau run to continue from (default OUT/plateau: the shipped one for the default world, else trained)")
    p.add_argument("--metric", default="chrf", choices=["kiwi", "chrf"], help="what picks the winner (default %(default)s)")
    p.add_argument("--base", default="nllb", choices=["nllb", "mbart"])
    p.add_argument("--lr-factors", default="1",
                   help="the other methods' learning rates, as multiples of SFT's best (default %(default)s)")
    p.add_argument("--test", action="store_true", help="then evaluate the base and the winners on the test set, once")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.methods.split(",") if n.strip()]
    known = default_systems()
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"error: unknown methods {unknown}; choose from {', '.join(known)}", file=sys.stderr)
        return 2
    world, out, b = Path(args.world), Path(args.out), budget(quick=False)
    start = time.perf_counter()
    plateau = Path(args.plateau) if args.plateau else out / "plateau"
    train_plateaus({SEEDS[0]: plateau}, world, b, args.base)  # the shipped one where it is that plateau
    begin = plateau_start(plateau)
    # SFT first: the other methods' learning rates are its best and half of it.
    sft_grid = {"sft": grid("sft", 0.0)}
    sft_runs = {("sft", i): out / f"sft-{i}" for i in range(len(sft_grid["sft"]))}
    train_all(sft_runs, sft_grid, world, b, begin)
    score = lambda d: best_dev(d, args.metric)[0]  # noqa: E731
    sft_lr = SFT_LRS[max(range(len(SFT_LRS)), key=lambda i: score(sft_runs[("sft", i)]))]
    factors = tuple(float(f) for f in args.lr_factors.split(","))
    settings = sft_grid | {name: grid(name, sft_lr, factors) for name in names if name != "sft"}
    runs = {(name, i): out / f"{name}-{i}" for name in settings for i in range(len(settings[name]))}
    train_all(runs, settings, world, b, begin)
    lines = [f"Tuning sweep on dev: the demo's protocol (at most {b['steps']} steps, batch {b['batch_size']}, validation "
             f"every {b['every']} steps on the whole dev set, greedy, patience {b['patience']}), seed 42, from "
             f"SFT's plateau {begin}; a setting's score is its best validation {args.metric} (both shown). "
             f"The other methods' learning rates: SFT's best, {sft_lr:g}, times {', '.join(f'{f:g}' for f in factors)}.", "",
             "| system | setting | dev Kiwi x100 (step) | dev chrF++ (step) | chosen |", "|:--|:--|--:|--:|:--|"]
    result = {"sft_lr": sft_lr}
    for name in settings:
        grid_ = settings[name]
        kiwi = [best_dev(runs[(name, i)], "kiwi") for i in range(len(grid_))]
        chrf = [best_dev(runs[(name, i)], "chrf") for i in range(len(grid_))]
        picked = kiwi if args.metric == "kiwi" else chrf
        chosen = max(range(len(picked)), key=lambda i: picked[i][0])
        result[name] = {"chosen": grid_[chosen][0], "chosen_index": chosen, "overrides": grid_[chosen][1], "settings": [
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
    if args.test:
        winners = {(name, 42): runs[(name, result[name]["chosen_index"])] for name in settings}
        head = (f"Tiny world, test set (beam 5), seed 42, the sweep's winners (by dev {args.metric}): every system from "
                f"SFT's plateau for at most {b['steps']} steps of {b['batch_size']} labelled pairs, validated every "
                f"{b['every']} steps")
        evaluate_and_compare(winners, world, out, {SEEDS[0]: plateau}, head)
    return 0


if __name__ == "__main__":
    sys.exit(main())
