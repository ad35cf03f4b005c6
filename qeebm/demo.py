"""The main job on the embedded default: ``qeebm demo``.

1. Build the tiny world if it is absent (``qeebm tinyworld build``; docs/tinyworld.md).
2. From the same base translator (the tiny NLLB-style one, which has never seen the task's pairs)
   and under the same protocol (``protocol_overrides``: the published one, scaled to the tiny
   world), train SFT, REINFORCE, PPO, QE-EBM static, QE-EBM dynamic and QE finetuning, each with its
   tuned settings from ``recipes/configs/tiny_*.yaml`` (``scripts/sweep.py``). Two runs go at a time,
   each in its own process on one thread: the machine this was built for has two cores.
3. Evaluate the base and every run on the test set, twice: the checkpoint selected on dev Kiwi (as
   published, ``best/``) and the one selected on dev chrF++ (``best-chrf/``); BLEU, chrF++, TER, the
   tiny COMET, the tiny CometKiwi the RL and QE-EBM runs were trained against, and the held-out tiny
   judge. The base and the best trained system (by dev chrF++) again with quality-aware decoding of
   8 beam candidates: QE reranking by the tiny CometKiwi (``+rerank``) and MBR with the chrF++
   utility (``+mbr``), with their cost printed.
4. Print both comparison tables (``scripts/compare.py``: 95% bootstrap CIs, paired significance
   against the base) and write them with plots to ``<runs>/comparison`` and
   ``<runs>/comparison-chrf``.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from qeebm import resources
from qeebm.config import SEEDS, SYSTEMS, data_path_overrides
from qeebm.runlog import validations
from qeebm.tinyworld.build import build, is_built

log = logging.getLogger("qeebm.demo")

CONFIGS = resources.CONFIGS


# Each system's training time in the demo (seconds on the project's 2-core CPU, 2026-12-03), to start
# the longest first; only their order matters.
EXPECTED_SECONDS = {"qe-ebm-dynamic": 803, "reinforce": 497, "qe-ebm-static": 481, "qe-finetune": 316, "ppo": 217,
                    "sft": 44}


def tiny_recipe(system: str) -> str:
    """The tiny world's tuned recipe of a system (``scripts/sweep.py`` picked its settings)."""
    return f"tiny_{system}.yaml"


def budget(quick: bool) -> dict:
    """The protocol every method gets: optimiser steps, global labelled batch (and as many
    source-only sentences), validation interval and patience (validations without a better dev
    Kiwi before stopping: the published 10; a shorter one stopped runs still improving on a noisy
    early Kiwi peak), dev sentences per validation (0: all). ``quick`` is a smoke run on the micro
    world."""
    if quick:
        return {"steps": 4, "batch_size": 4, "every": 2, "patience": 0, "eval_examples": 16}
    return {"steps": 600, "batch_size": 16, "every": 50, "patience": 10, "eval_examples": 0}


def protocol_overrides(world: Path, run_dir: Path, b: dict, seed: int, base: str = "nllb") -> list[str]:
    """What every method's run shares: the base, the data, the QE, the budget, the validation and
    the selection (dev Kiwi as published, with the chrF++ choice kept beside it)."""
    steps = b["steps"]
    return [
        f"seed={seed}",
        f"model.name_or_path={world / f'{base}-base'}",
        *data_path_overrides(world / "data"),
        f"qe.path={world / 'qe/kiwi'}",
        f"optim.max_steps={steps}",
        f"optim.batch_size={b['batch_size']}",
        f"optim.warmup_steps={max(steps // 10, 1)}",
        f"eval.every={b['every']}",
        f"eval.max_examples={b['eval_examples']}",
        f"eval.patience={b['patience']}",
        "eval.metric=kiwi",
        "eval.also_best=[chrf]",
        # Greedy validation keeps it cheap; the test set is decoded with beam 5.
        "generation.num_beams=1",
        f"output.run_dir={run_dir}",
        f"output.save_every={steps}",
        "logging.progress_bar=false",
        "logging.report_to=[]",
    ]


def run_overrides(name: str, world: Path, run_dir: Path, b: dict, seed: int, base: str = "nllb") -> list[str]:
    """``protocol_overrides`` and what the protocol implies for one method: PPO's minibatches of 4
    rollouts (published), and schedules that scale with the run (QE-dynamic's warm-up)."""
    extra = []
    if name == "ppo":
        extra.append(f"ppo.minibatches={max(b['batch_size'] // 4, 1)}")
    if name == "qe-ebm-dynamic":
        extra.append(f"qe.warmup_steps={max(b['steps'] // 10, 1)}")
    return protocol_overrides(world, run_dir, b, seed, base) + extra


def train_worker(name: str, recipe: str, overrides: list[str]) -> tuple[str, float]:
    torch.set_num_threads(1)
    # force: a worker process trains several runs in turn, each logging under its own name.
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(name)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S", force=True)
    from qeebm.config import load_config
    from qeebm.loop import train

    start = time.perf_counter()
    train(load_config(CONFIGS / recipe, overrides))
    return name, time.perf_counter() - start


def _evaluate_worker(jobs: list[tuple], world: str) -> list[tuple[str, float]]:
    """Evaluate (run_dir, system, checkpoint, split, selection) jobs; returns (report path, seconds)."""
    torch.set_num_threads(1)
    from qeebm.evaluate import MetricSpec, evaluate_run

    spec = MetricSpec.tinyworld(Path(world))
    out = []
    for run_dir, system, checkpoint, split, selection in jobs:
        t = time.perf_counter()
        _, path = evaluate_run(run_dir, metrics=spec, system=system, checkpoint=checkpoint, split=split,
                               selection=selection_of(selection, spec))
        out.append((str(path), time.perf_counter() - t))
    return out


def selection_of(rule: str | None, spec):
    from qeebm.qad import Selection

    if rule is None:
        return None
    return Selection("rerank", spec.kiwi) if rule == "rerank" else Selection("mbr")


def best_system(run_dirs: dict) -> str:
    """The trained system with the best dev chrF++ (its runs' best validation, mean over seeds)."""
    scores: dict[str, list[float]] = {}
    for (name, _), run_dir in run_dirs.items():
        chrf = [r["val/chrf"] for r in validations(run_dir, "val/chrf")]
        scores.setdefault(name, []).append(max(chrf) if chrf else float("-inf"))
    return max(scores, key=lambda name: sum(scores[name]) / len(scores[name]))


def run_demo(world_dir: str | None = None, runs_dir: str | None = None, quick: bool = False,
             seeds: int = 1, steps: int | None = None, base: str = "nllb", systems: list[str] | None = None) -> str:
    start = time.perf_counter()
    world = Path(world_dir or ("data/tinyworld-micro" if quick else "data/tinyworld"))
    # The smoke run has its own directory: a full demo after it would otherwise try to resume its runs.
    runs = Path(runs_dir or ("runs/demo-quick" if quick else "runs/demo"))
    timings: dict[str, float] = {}
    if not is_built(world):
        t = time.perf_counter()
        build(world, size="micro" if quick else "default")
        timings["world"] = time.perf_counter() - t
    b = budget(quick) | ({"steps": steps} if steps else {})
    names = systems or list(SYSTEMS)
    run_dirs = {(name, seed): runs / (name if seeds == 1 else f"{name}-seed{seed}")
                for seed in SEEDS[:seeds] for name in names}
    timings.update(train_runs(run_dirs, world, b, base))
    head = (f"Tiny world, test set (beam 5), {seeds} seed(s): every method from {base}-base (never trained on the "
            f"task) for at most {b['steps']} steps of {b['batch_size']} labelled pairs (+ {b['batch_size']} source-only "
            f"sentences), validated every {b['every']} steps")
    by_kiwi, by_chrf, eval_timings = evaluate_and_compare(run_dirs, world, runs, base, head)
    timings.update(eval_timings)
    timings["total"] = time.perf_counter() - start
    (runs / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    world_s = f"world build {timings['world']:.0f} s, " if "world" in timings else ""
    print(f"\ntime: {world_s}training {timings['training']:.0f} s (wall; {sum(v for k, v in timings.items() if k.startswith('train/')):.0f} s "
          f"summed over runs), evaluation {timings['evaluation']:.0f} s (of which quality-aware decoding: base "
          f"+rerank {timings['evaluate_base_rerank']:.0f} s, +mbr {timings['evaluate_base_mbr']:.0f} s)")
    print(f"tables and plots: {runs / 'comparison'}, {runs / 'comparison-chrf'}; total time {timings['total']:.0f} s")
    return by_kiwi


def train_runs(run_dirs: dict, world: Path, b: dict, base: str, seed: int | None = None,
               extra: dict | None = None) -> dict:
    """Train every ``(name, seed) -> run_dir`` under the protocol, two at a time, each in its own
    process on one thread (the machine this was built for has two cores). A sweep keys its runs by
    ``(name, setting)`` instead, gives the one ``seed`` and, in ``extra``, each key's overrides.
    Returns the wall times."""
    timings = {}
    t = time.perf_counter()
    # The longest runs first: two workers then finish close together (in SYSTEMS' order QE-dynamic,
    # the longest, started last and ran alone for about 4 of the demo's 24 minutes, measured 2026-12-03).
    order = sorted(run_dirs.items(), key=lambda item: -EXPECTED_SECONDS.get(item[0][0], 0.0))
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(train_worker, f"{name}/{key}", tiny_recipe(name),
                               run_overrides(name, world, d, b, key if seed is None else seed, base)
                               + list((extra or {}).get((name, key), [])))
                   for (name, key), d in order]
        for future in futures:
            name, seconds = future.result()
            timings[f"train/{name}"] = seconds
            log.info("%s trained in %.0f s", name, seconds)
    timings["training"] = time.perf_counter() - t
    return timings


def evaluate_and_compare(run_dirs: dict, world: Path, runs: Path, base: str, head: str) -> tuple[str, str, dict]:
    """Evaluate the base and every trained run on the test set, twice: the checkpoint selected on dev
    Kiwi (as published) and the one selected on dev chrF++; then quality-aware decoding of the base
    and of the best trained system (by dev chrF++). Prints and returns both comparison tables."""
    from qeebm.compare import run as compare
    from qeebm.config import ModelConfig
    from qeebm.evaluate import MetricSpec, evaluate_system, write_eval
    from qeebm.translator import Translator

    timings = {}
    t = time.perf_counter()
    spec = MetricSpec.tinyworld(world)
    base_dir = world / f"{base}-base"
    translator = Translator.load(ModelConfig(name_or_path=str(base_dir)))
    write_eval(evaluate_system(translator, world / "data/test.tsv", spec, system="base", model=str(base_dir)), runs / "base")
    best = best_system(run_dirs)
    jobs = [(str(d), name, None, "test", None) for (name, _), d in run_dirs.items()]
    jobs += [(str(d), name, "best-chrf", "test-best-chrf", None) for (name, _), d in run_dirs.items()]
    jobs += [(str(d), f"{name}+{rule}", None, "test", rule) for rule in ("rerank", "mbr")
             for (name, _), d in run_dirs.items() if name == best]
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = [pool.submit(_evaluate_worker, jobs[i::2], str(world)) for i in range(2)]
        reports = [r for future in done for r in future.result()]
    selected = []  # base+rerank, SYSTEM+rerank, base+mbr, SYSTEM+mbr
    for rule in ("rerank", "mbr"):
        tq = time.perf_counter()
        report = evaluate_system(translator, world / "data/test.tsv", spec, system=f"base+{rule}", model=str(base_dir),
                                 selection=selection_of(rule, spec))
        selected.append(write_eval(report, runs / "base", f"test-{rule}"))
        timings[f"evaluate_base_{rule}"] = time.perf_counter() - tq
        for path, seconds in reports:
            if path.endswith(f"-{rule}.json"):
                selected.append(Path(path))
                timings[f"evaluate_{Path(path).parents[1].name}_{Path(path).stem}"] = seconds
    timings["evaluation"] = time.perf_counter() - t
    del translator

    # The tables (seeds of one system are grouped by its name).
    by_kiwi = compare([str(runs / "base")] + [str(d) for d in run_dirs.values()] + [str(r) for r in selected],
                      baseline="base", out=runs / "comparison", plots=True)
    by_chrf = compare([str(runs / "base" / "eval" / "test.json")] +
                      [str(d / "eval" / "test-best-chrf.json") for d in run_dirs.values()],
                      baseline="base", out=runs / "comparison-chrf", plots=False)
    print(f"\n{head}; checkpoint selected on dev Kiwi (as published); +rerank / +mbr: the best of 8 beam candidates by "
          f"Kiwi / by MBR with the chrF++ utility:\n")
    print(by_kiwi)
    print("\nThe same runs, checkpoint selected on dev chrF++ instead:\n")
    print(by_chrf)
    return by_kiwi, by_chrf, timings
