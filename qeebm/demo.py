"""The main job on the embedded default: ``qeebm demo``.

1. Build the tiny world if it is absent (``qeebm tinyworld build``).
2. From the same base translator (the tiny NLLB-style one) and with the same budget (optimiser steps,
   labelled batch, learning rate), train SFT, REINFORCE, PPO, QE-EBM static, QE-EBM dynamic and QE
   finetuning, each from its recipe in ``recipes/configs/tiny_*.yaml``. Two runs go at a time, each
   in its own process on one thread: the machine this was built for has two cores.
3. Evaluate the base and every run on the test set: BLEU, chrF++, TER, the tiny COMET, the tiny
   CometKiwi the RL and QE-EBM runs were trained against, and the held-out tiny judge; then the base
   and the best trained system (by dev chrF++) again with quality-aware decoding of 8 beam
   candidates: QE reranking by the tiny CometKiwi (rows ``base+rerank``, ``SYSTEM+rerank``) and MBR
   with the chrF++ utility (``base+mbr``, ``SYSTEM+mbr``), with their cost printed.
4. Print the comparison table (``scripts/compare.py``: 95% bootstrap CIs, paired significance
   against the base) and write it with plots to ``<runs>/comparison``.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from qeebm.config import data_path_overrides
from qeebm.tinyworld.build import build, is_built

log = logging.getLogger("qeebm.demo")

CONFIGS = Path(__file__).resolve().parent.parent / "recipes" / "configs"
# name -> recipe; the name is also the system's name in the table.
SEEDS = (42, 231, 6)  # the published seeds, in the order they are used
SYSTEMS = {
    "sft": "tiny_sft.yaml",
    "reinforce": "tiny_reinforce.yaml",
    "ppo": "tiny_ppo.yaml",
    "qe-ebm-static": "tiny_qe-ebm_static.yaml",
    "qe-ebm-dynamic": "tiny_qe-ebm_dynamic.yaml",
    "qe-finetune": "tiny_qe-finetune.yaml",
}


def budget(quick: bool) -> dict:
    """The equal budget every method gets. ``quick`` is a smoke run on the micro world."""
    if quick:
        return {"steps": 4, "batch_size": 4, "eval_examples": 16}
    return {"steps": 120, "batch_size": 16, "eval_examples": 0}


def run_overrides(name: str, world: Path, run_dir: Path, b: dict, seed: int) -> list[str]:
    steps = b["steps"]
    # PPO's published minibatch is 4 rollouts, whatever the batch.
    ppo = [f"ppo.minibatches={max(b['batch_size'] // 4, 1)}"] if name == "ppo" else []
    return ppo + [
        f"seed={seed}",
        f"model.name_or_path={world / 'nllb-base'}",
        *data_path_overrides(world / "data"),
        f"qe.path={world / 'qe/kiwi'}",
        f"optim.max_steps={steps}",
        f"optim.batch_size={b['batch_size']}",
        f"optim.warmup_steps={max(steps // 10, 1)}",
        # The QE-EBM energy weight and the dynamic QE's warm-up scale with the run's length.
        f"qe_ebm.beta_ramp_steps={max(steps // 3, 1)}",
        f"qe.warmup_steps={max(steps // 4, 1)}",
        f"eval.every={max(steps // 2, 1)}",
        f"eval.max_examples={b['eval_examples']}",
        "generation.num_beams=1",
        f"output.run_dir={run_dir}",
        f"output.save_every={steps}",
        "logging.progress_bar=false",
        "logging.report_to=[]",
    ]


def _train_worker(name: str, recipe: str, overrides: list[str]) -> tuple[str, float]:
    torch.set_num_threads(1)
    # force: a worker process trains several runs in turn, each logging under its own name.
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(name)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S", force=True)
    from qeebm.config import load_config
    from qeebm.loop import train

    start = time.perf_counter()
    train(load_config(CONFIGS / recipe, overrides))
    return name, time.perf_counter() - start


def best_system(run_dirs: dict) -> str:
    """The trained system with the best dev chrF++ (its runs' best validation, mean over seeds)."""
    from qeebm.checkpoint import latest_checkpoint, read_state

    scores: dict[str, list[float]] = {}
    for (name, _), run_dir in run_dirs.items():
        best = read_state(latest_checkpoint(Path(run_dir) / "checkpoints"))["best"]
        scores.setdefault(name, []).append(float("-inf") if best is None else best)
    return max(scores, key=lambda name: sum(scores[name]) / len(scores[name]))


def run_demo(world_dir: str | None = None, runs_dir: str | None = None, quick: bool = False,
             seeds: int = 1, steps: int | None = None) -> str:
    from qeebm.compare import run as compare
    from qeebm.config import ModelConfig
    from qeebm.evaluate import MetricSpec, evaluate_run, evaluate_system, write_eval
    from qeebm.qad import Selection
    from qeebm.translator import Translator

    start = time.perf_counter()
    world = Path(world_dir or ("data/tinyworld-micro" if quick else "data/tinyworld"))
    # The smoke run has its own directory: a full demo after it would otherwise try to resume its runs.
    runs = Path(runs_dir or ("runs/demo-quick" if quick else "runs/demo"))
    if not is_built(world):
        build(world, size="micro" if quick else "default")
    b = budget(quick) | ({"steps": steps} if steps else {})
    timings: dict[str, float] = {}
    run_dirs = {(name, seed): runs / (name if seeds == 1 else f"{name}-seed{seed}")
                for seed in SEEDS[:seeds] for name in SYSTEMS}

    # 2. Training, two runs at a time.
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_train_worker, f"{name}/{seed}", SYSTEMS[name], run_overrides(name, world, d, b, seed))
                   for (name, seed), d in run_dirs.items()]
        for future in futures:
            name, seconds = future.result()
            timings[f"train/{name}"] = seconds
            log.info("%s trained in %.0f s", name, seconds)

    # 3. Evaluation: beam 5 on the whole test set, every metric of the tiny world.
    spec = MetricSpec.tinyworld(world)
    t = time.perf_counter()
    base = Translator.load(ModelConfig(name_or_path=str(world / "nllb-base")))
    report = evaluate_system(base, world / "data/test.tsv", spec, system="base", model=str(world / "nllb-base"))
    write_eval(report, runs / "base")
    for (name, _), run_dir in run_dirs.items():
        evaluate_run(run_dir, metrics=spec, system=name)
    timings["evaluate"] = time.perf_counter() - t
    # Quality-aware decoding of the base and of the best system by dev chrF++: QE reranking by the
    # trained-on Kiwi, and MBR with the chrF++ utility, each over the same 8 beam candidates.
    best = best_system(run_dirs)
    selected = []
    for selection in (Selection("rerank", spec.kiwi), Selection("mbr")):
        t = time.perf_counter()
        rule = selection.rule
        report = evaluate_system(base, world / "data/test.tsv", spec, system=f"base+{rule}",
                                 model=str(world / "nllb-base"), selection=selection)
        selected.append(write_eval(report, runs / "base", f"test-{rule}"))
        for (name, _), run_dir in run_dirs.items():
            if name == best:
                selected.append(evaluate_run(run_dir, metrics=spec, system=f"{name}+{rule}", selection=selection)[1])
        timings[f"evaluate_{rule}"] = time.perf_counter() - t
    del base

    # 4. The table (seeds of one system are grouped by its name).
    table = compare([str(runs / "base")] + [str(d) for d in run_dirs.values()] + [str(r) for r in selected],
                    baseline="base", out=runs / "comparison", plots=True)
    timings["total"] = time.perf_counter() - start
    (runs / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    print(f"\nTiny world, test set, {b['steps']} steps of each method from the same base "
          f"(batch {b['batch_size']}, {seeds} seed(s)); beam 5; +rerank / +mbr: the best of 8 beam candidates by Kiwi / by MBR with the chrF++ utility:\n")
    print(table)
    print(f"\ntime: training {sum(v for k, v in timings.items() if k.startswith('train/')):.0f} s (summed over runs), "
          f"plain evaluation {timings['evaluate']:.0f} s, +rerank {timings['evaluate_rerank']:.0f} s, "
          f"+mbr {timings['evaluate_mbr']:.0f} s (two systems each)")
    print(f"tables and plots: {runs / 'comparison'}; total time {timings['total']:.0f} s")
    return table
