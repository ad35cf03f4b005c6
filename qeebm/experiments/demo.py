"""The main job on the embedded default: ``qeebm demo`` (the protocol of docs/results.md).

Users of a QE-trained method start from their own converged SFT model, as RLHF pipelines do, and
every method is compared at the same continuation budget from that common point:

1. Build the tiny world if it is absent (``qeebm tinyworld build``; docs/tinyworld.md).
2. SFT's plateau, once per seed: from the base translator (the tiny NLLB-style one, which has never
   seen the task's pairs), SFT on the labelled pairs (``recipes/configs/tiny_plateau.yaml``) until
   dev chrF++ stops improving; its best dev-chrF++ checkpoint is every system's starting point.
3. Every system continues from it for the same budget (``budget``), each with its settings tuned on
   dev by ``scripts/sweep.py`` (``recipes/configs/tiny_<system>.yaml``): SFT continued (the
   control); the realistic rows, trained against the tiny CometKiwi (QE-EBM static and dynamic,
   REINFORCE, PPO, QE finetuning, and DPO, CPO and GRPO when present); and the positive control, trained
   against an energy or reward that knows the answer (``target``: QE-EBM static and REINFORCE with
   the tiny reference-based COMET reading each pool sentence's true reference, REINFORCE with
   sentence chrF++ against it). Two runs go at a time, each in its own process on one thread: the
   machine this was built for has two cores.
4. Evaluate the plateau and every run on the test set, twice: the checkpoint selected on dev Kiwi
   (as published, ``best/``) and the one selected on dev chrF++ (``best-chrf/``); BLEU, chrF++,
   TER, the tiny COMET, the tiny CometKiwi and the held-out tiny judge. The best system by dev
   chrF++ again with quality-aware decoding of 8 beam candidates: QE reranking by the tiny CometKiwi
   (``+rerank``) and MBR with the chrF++ utility (``+mbr``).
5. Print both comparison tables against SFT continued (``scripts/compare.py``: 95% bootstrap CIs,
   paired significance, a reward-hacking warning) and write them with plots to
   ``<runs>/comparison`` and ``<runs>/comparison-chrf``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import yaml

from qeebm.config import (
    EXTRA_SYSTEMS,
    KIWI_ESTIMATOR_SYSTEMS,
    ORACLE_SYSTEMS,
    SEEDS,
    SPLIT_FILES,
    SYSTEMS,
    TINYWORLD_DIR,
    data_path_overrides,
    load_config,
)
from qeebm.errors import QeebmError
from qeebm.evaluation.compare import run as compare
from qeebm.evaluation.evaluate import MetricSpec, evaluate_run
from qeebm.tinyworld.build import build
from qeebm.tinyworld.world import InlineExecutor, is_built
from qeebm.translation.qad import Selection
from qeebm.utils import resources
from qeebm.utils.integrity import sha256_file
from qeebm.utils.runlog import best_validation, validations

log = logging.getLogger("qeebm.experiments.demo")

CONFIGS = resources.CONFIGS

# What a system trains against, relative to the world: (qe.path, data.mono). Its tiny recipe says it;
# the realistic rows train against the tiny CometKiwi and sample the plain pool (the config's
# defaults), the positive control reads each pool sentence's true reference, rewarded by the tiny
# reference-based COMET or by sentence chrF++.
KIWI = ("qe/kiwi", "data/mono.txt")
ORACLE = ("qe/comet", "data/mono_ref.tsv")
CHRF = ("chrf", "data/mono_ref.tsv")


def target(name: str) -> tuple[str, str]:
    """The (qe.path, data.mono) a system's tiny recipe trains against, relative to the world
    (``KIWI``, ``ORACLE``, ``CHRF`` or another QE of the world)."""
    cfg = load_config(CONFIGS / tiny_recipe(name))
    return tuple(path.removeprefix(f"{TINYWORLD_DIR}/") for path in (cfg.qe.path, cfg.data.mono.path))


def knows_reference(name: str) -> bool:
    """A positive-control system: it trains against the pool's true references, which no user has."""
    return target(name)[1] != KIWI[1]


# Each system's training time in the demo (seconds on the project's 2-core CPU), to start the
# longest first; only their order matters.
EXPECTED_SECONDS = {"qe-ebm-dynamic": 600, "reinforce": 420, "reinforce-oracle": 420, "reinforce-chrf": 380,
                    "qe-ebm-static": 340, "qe-ebm-oracle": 340, "qe-ebm-loo-cv-oracle": 360, "qe-ebm-reinmax-oracle": 340,
                    "qe-ebm-softmax-oracle": 340, "qe-finetune": 330, "dpo": 300, "dpo-oracle": 300, "cpo": 300,
                    "ppo": 300, "grpo": 420, "grpo-oracle": 420,
                    "qe-ebm-softmax": 340, "qe-ebm-reinmax": 340, "qe-ebm-loo-cv": 360, "sft": 40}


def tiny_recipe(system: str) -> str:
    """The tiny world's tuned recipe of a system (``scripts/sweep.py`` picked its settings)."""
    return f"tiny_{system}.yaml"


def budget(quick: bool) -> dict:
    """The protocol every system gets. ``plateau``: SFT's run to its plateau (a cap on its steps,
    validation interval and patience on dev chrF++); then the continuation every system gets from it:
    optimiser steps, global labelled batch (and as many source-only sentences), validation interval,
    patience (validations without a better dev Kiwi before stopping: the published 10), dev sentences
    per validation (0: all). ``quick`` is a smoke run on the micro world."""
    if quick:
        return {"plateau": {"steps": 8, "every": 4, "patience": 0},
                "steps": 4, "batch_size": 4, "every": 2, "patience": 0, "eval_examples": 16}
    return {"plateau": {"steps": 6000, "every": 100, "patience": 10},
            "steps": 400, "batch_size": 16, "every": 50, "patience": 10, "eval_examples": 0}


def plateau_overrides(world: Path, run_dir: Path, b: dict, seed: int, base: str = "nllb") -> list[str]:
    """SFT from the base until dev chrF++ stops improving (``b["plateau"]``)."""
    p = b["plateau"]
    return [
        f"seed={seed}",
        f"model.name_or_path={world / f'{base}-base'}",
        *data_path_overrides(world / "data"),
        f"qe.path={world / KIWI[0]}",
        f"optim.max_steps={p['steps']}",
        f"eval.every={p['every']}",
        f"eval.patience={p['patience']}",
        f"eval.max_examples={b['eval_examples']}",
        f"output.run_dir={run_dir}",
        f"output.save_every={p['steps']}",
        "logging.progress_bar=false",
        "logging.report_to=[]",
    ]


def protocol_overrides(world: Path, run_dir: Path, b: dict, seed: int, start: Path, name: str = "sft") -> list[str]:
    """What every system's continuation shares: the starting checkpoint, the data, the budget, the
    validation (the tiny Kiwi and chrF++ on every run, whatever it trains against) and the selection
    (dev Kiwi as published, with the chrF++ choice kept beside it); and what it trains against."""
    steps = b["steps"]
    qe, mono = target(name)
    return [
        f"seed={seed}",
        f"model.name_or_path={start}",
        *data_path_overrides(world / "data"),
        f"qe.path={qe if qe == 'chrf' else world / qe}",
        f"data.mono.path={world / mono}",
        f"optim.max_steps={steps}",
        f"optim.batch_size={b['batch_size']}",
        f"optim.warmup_steps={max(steps // 10, 1)}",
        f"eval.every={b['every']}",
        f"eval.max_examples={b['eval_examples']}",
        f"eval.patience={b['patience']}",
        "eval.at_start=true",
        "eval.metric=kiwi",
        f"eval.kiwi_path={world / KIWI[0]}",
        "eval.also_best=[chrf]",
        # Greedy validation keeps it cheap; the test set is decoded with beam 5.
        "generation.num_beams=1",
        f"output.run_dir={run_dir}",
        f"output.save_every={steps}",
        "logging.progress_bar=false",
        "logging.report_to=[]",
    ]


def run_overrides(name: str, world: Path, run_dir: Path, b: dict, seed: int, start: Path) -> list[str]:
    """``protocol_overrides`` and what the protocol implies for one system: PPO's minibatches of 4
    rollouts (published), and schedules that scale with the run (QE-dynamic's warm-up)."""
    extra = []
    if name == "ppo":
        extra.append(f"ppo.minibatches={max(b['batch_size'] // 4, 1)}")
    if name == "qe-ebm-dynamic":
        extra.append(f"qe.warmup_steps={max(b['steps'] // 10, 1)}")
    return protocol_overrides(world, run_dir, b, seed, start, name) + extra


def train_worker(name: str, recipe: str, overrides: list[str], own_process: bool = True) -> tuple[str, float]:
    if own_process:
        torch.set_num_threads(1)
        # force: a worker process trains several runs in turn, each logging under its own name.
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(name)s %(levelname)s %(message)s",
                            datefmt="%H:%M:%S", force=True)
    from qeebm.training.loop import train

    start = time.perf_counter()
    train(load_config(CONFIGS / recipe, overrides))
    return name, time.perf_counter() - start


def _evaluate_worker(jobs: list[tuple], world: str, own_process: bool = True) -> list[tuple[str, float]]:
    """Evaluate (run_dir, system, checkpoint, split, selection) jobs; returns (report path, seconds)."""
    if own_process:
        torch.set_num_threads(1)

    spec = MetricSpec.tinyworld(Path(world))
    # This world's test set, not the run's data.test: a shipped plateau's config names the world it
    # was trained in, relative to wherever that was.
    test = Path(world) / "data" / SPLIT_FILES["test"]
    out = []
    for run_dir, system, checkpoint, split, selection in jobs:
        t = time.perf_counter()
        _, path = evaluate_run(run_dir, test, metrics=spec, system=system, checkpoint=checkpoint, split=split,
                               selection=selection_of(selection, spec))
        out.append((str(path), time.perf_counter() - t))
    return out


def selection_of(rule: str | None, spec):
    if rule is None:
        return None
    return Selection("rerank", spec.models["kiwi"]) if rule == "rerank" else Selection("mbr")


def best_system(run_dirs: dict) -> str:
    """The trained system with the best dev chrF++ (its runs' best validation, mean over seeds), among
    those a user could train: the positive control knows the references of the pool."""
    scores: dict[str, list[float]] = {}
    for (name, _), run_dir in run_dirs.items():
        if knows_reference(name):
            continue
        chrf = [r["val/chrf"] for r in validations(run_dir, "val/chrf")]
        scores.setdefault(name, []).append(max(chrf) if chrf else float("-inf"))
    return max(scores, key=lambda name: sum(scores[name]) / len(scores[name]))


# What `qeebm demo` trains by default, within its 20 minutes: SFT continued, QE-EBM static and the
# reward and preference baselines trained against the same Kiwi, and the positive control of
# REINFORCE and of QE-EBM with straight-through and with the softmax relaxation, the estimator that
# passes it. `--systems all` trains every one (the three-seed tables).
DEMO_SYSTEMS = ("sft", "qe-ebm-static", "reinforce", "dpo", "qe-ebm-oracle", "qe-ebm-softmax-oracle", "reinforce-chrf")


def default_systems() -> list[str]:
    """Every system the demo and the sweep can train: every tiny recipe but the plateau's, in
    ``SYSTEMS``, ``EXTRA_SYSTEMS``, ``KIWI_ESTIMATOR_SYSTEMS``, ``ORACLE_SYSTEMS`` order, then those
    no list names (a new system needs only its recipe), the realistic before the positive control."""
    listed = [name for name in (*SYSTEMS, *EXTRA_SYSTEMS, *KIWI_ESTIMATOR_SYSTEMS, *ORACLE_SYSTEMS)
              if (CONFIGS / tiny_recipe(name)).is_file()]
    others = {p.name.removeprefix("tiny_").removesuffix(".yaml") for p in CONFIGS.glob("tiny_*.yaml")}
    others -= {*listed, "plateau"}
    return listed + sorted(others, key=lambda name: (knows_reference(name), name))


def plateau_dir(runs: Path, seed: int, seeds: int) -> Path:
    return runs / ("plateau" if seeds == 1 else f"plateau-seed{seed}")


def run_demo(world_dir: str | None = None, runs_dir: str | None = None, quick: bool = False,
             seeds: int = 1, steps: int | None = None, base: str = "nllb", systems: list[str] | None = None,
             train_plateau: bool = False) -> str:
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
    names = systems or list(DEMO_SYSTEMS)
    plateaus = {seed: plateau_dir(runs, seed, seeds) for seed in SEEDS[:seeds]}
    # The smoke run trains and evaluates in this process (``workers``).
    timings.update(train_plateaus(plateaus, world, b, base, train=train_plateau, in_process=quick))
    starts = {seed: plateau_start(d) for seed, d in plateaus.items()}
    run_dirs = {(name, seed): runs / (name if seeds == 1 else f"{name}-seed{seed}")
                for seed in SEEDS[:seeds] for name in names}
    timings.update(train_runs(run_dirs, world, b, starts, in_process=quick))
    head = (f"Tiny world, test set (beam 5), {seeds} seed(s): every system continues from SFT's plateau (dev chrF++ "
            f"{plateau_summary(plateaus)}) for at most {b['steps']} steps of {b['batch_size']} labelled pairs "
            f"(+ {b['batch_size']} source-only sentences), validated every {b['every']} steps")
    by_kiwi, by_chrf, eval_timings = evaluate_and_compare(run_dirs, world, runs, plateaus, head, in_process=quick)
    timings.update(eval_timings)
    timings["total"] = time.perf_counter() - start
    (runs / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    world_s = f"world build {timings['world']:.0f} s, " if "world" in timings else ""
    print(f"\ntime: {world_s}plateau {timings.get('plateau', 0.0):.0f} s, training {timings['training']:.0f} s (wall; "
          f"{sum(v for k, v in timings.items() if k.startswith('train/')):.0f} s summed over runs), evaluation "
          f"{timings['evaluation']:.0f} s")
    print(f"tables and plots: {runs / 'comparison'}, {runs / 'comparison-chrf'}; total time {timings['total']:.0f} s")
    return by_kiwi


# SFT's plateau for seed 42 from the NLLB-style base, shipped beside the world's QEs: training it
# takes the demo's machine about 11 of its 20 minutes, and trained weights are bitwise reproducible
# only on the same kind of CPU (as the bases). `qeebm demo --train-plateau` trains it instead;
# ``export_plateau`` writes it.
SHIPPED_PLATEAU = resources.SHIPPED_QE / "plateau"
# What the plateau is made from: the base's and the labelled pairs' files in the world.
PLATEAU_INPUTS = ("data/train.tsv", "data/dev.tsv")


def plateau_inputs(world: Path, base: str) -> dict[str, str]:

    files = sorted((world / f"{base}-base").iterdir()) + [world / f for f in PLATEAU_INPUTS]
    # The recipe's settings, not its bytes: a comment edited leaves the plateau what it was.
    recipe = yaml.safe_load((CONFIGS / "tiny_plateau.yaml").read_text(encoding="utf-8"))
    settings = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()
    return {str(f.relative_to(world)): sha256_file(f) for f in files if f.is_file()} | {
        "recipe tiny_plateau.yaml (settings)": settings}


def export_plateau(run_dir: Path, world: Path, seed: int, base: str = "nllb", out: Path = SHIPPED_PLATEAU) -> Path:
    """Keep a plateau run's ``best/`` model, its curve (``metrics.jsonl``) and settings (``config.yaml``)
    in ``out``, with the digests of its inputs and of every file (``source.json``)."""


    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(run_dir / "best", staging / "best")
    # config.trained.yaml, when there is one: the settings the run was trained with where they differ
    # from the recipe's only in what training does not read (extra validation metrics).
    optional = [name for name in ("config.trained.yaml",) if (run_dir / name).is_file()]
    for name in ("metrics.jsonl", "config.yaml", *optional):
        shutil.copy(run_dir / name, staging / name)
    files = {str(f.relative_to(staging)): sha256_file(f) for f in sorted(staging.rglob("*")) if f.is_file()}
    source = {"seed": seed, "base": base, "inputs": plateau_inputs(world, base), "files": files}
    (staging / "source.json").write_text(json.dumps(source, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


def shipped_plateau(world: Path, seed: int, base: str, shipped: Path | None = None) -> Path | None:
    """``shipped`` (default ``SHIPPED_PLATEAU``) when it is the plateau this world, seed and base would
    train, else None; its files differing from their recorded digests is a one-line error."""

    shipped = Path(shipped or SHIPPED_PLATEAU)
    source = shipped / "source.json"
    if not source.is_file():
        return None
    recorded = json.loads(source.read_text())
    if recorded["seed"] != seed or recorded["base"] != base or recorded["inputs"] != plateau_inputs(world, base):
        return None
    for name, digest in recorded["files"].items():
        if not (shipped / name).is_file() or sha256_file(shipped / name) != digest:
            raise QeebmError(f"{shipped / name}: differs from its digest in {source}; delete {shipped} to train "
                             "the plateau instead")
    return shipped


def rebase_world(config_file: Path, world: Path) -> None:
    """Rewrite a shipped plateau's saved config, which names the default world's files
    (``data/tinyworld/...``), to name ``world``'s, as a plateau trained in it would: the seeds'
    plateaus then share one config_id whatever path the world is given by."""
    prefix = TINYWORLD_DIR + "/"

    def rebase(value):
        if isinstance(value, dict):
            return {k: rebase(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rebase(v) for v in value]
        if isinstance(value, str) and value.startswith(prefix):
            return str(world / value[len(prefix):])
        return value

    config = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    config_file.write_text(yaml.safe_dump(rebase(config), sort_keys=False, allow_unicode=True), encoding="utf-8")


def plateau_done(run_dir: Path) -> bool:
    return (run_dir / "final").is_dir() or (run_dir / "shipped.json").is_file()


def plateau_start(run_dir: Path) -> Path:
    """The checkpoint every system starts from: the plateau's best dev chrF++."""
    return run_dir / "best"


def plateau_summary(plateaus: dict) -> str:
    """The plateaus' best dev chrF++ and its step, for the table's heading."""

    return ", ".join(f"{value:.1f} at step {step}" for value, step in
                     (best_validation(d, "val/chrf") for d in plateaus.values()))


def workers(in_process: bool = False):
    """Two worker processes, one thread each (the machine this was built for has two cores), or, for
    the smoke run, this process (``InlineExecutor``): its jobs take less time than starting workers,
    each of which imports torch, transformers and comet before its first step."""
    return InlineExecutor() if in_process else ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn"))


def run_jobs(jobs: list[tuple[str, str, list[str]]], in_process: bool = False) -> dict:
    """Train ``(label, recipe, overrides)`` jobs two at a time, each in its own process on one thread
    (``workers``), in the order given; a finished run (its ``final/`` exists) is skipped, so an
    interrupted demo or sweep resumes. Returns the wall times."""
    timings = {}
    todo = [(label, recipe, o) for label, recipe, o in jobs
            if not (Path(next(x.split("=", 1)[1] for x in o if x.startswith("output.run_dir="))) / "final").is_dir()]
    with workers(in_process) as pool:
        futures = [pool.submit(train_worker, label, recipe, overrides, not in_process) for label, recipe, overrides in todo]
        for future in futures:
            label, seconds = future.result()
            timings[f"train/{label}"] = seconds
            log.info("%s trained in %.0f s", label, seconds)
    return timings


def train_plateaus(plateaus: dict, world: Path, b: dict, base: str = "nllb", train: bool = False,
                   in_process: bool = False) -> dict:
    """SFT's plateau for every ``seed -> run_dir`` (``recipes/configs/tiny_plateau.yaml``), or the
    shipped one where it is that plateau (``shipped_plateau``; not with ``train``)."""
    t = time.perf_counter()
    jobs = []
    for seed, d in plateaus.items():
        if plateau_done(d):
            continue
        shipped = None if train or b["plateau"] != budget(False)["plateau"] else shipped_plateau(world, seed, base)
        if shipped is not None:
            shutil.copytree(shipped, d, dirs_exist_ok=True)
            for name in ("config.yaml", "config.trained.yaml"):
                if (d / name).is_file():
                    rebase_world(d / name, world)
            (d / "shipped.json").write_text(json.dumps({"from": str(shipped)}) + "\n")
            log.info("SFT's plateau for seed %d: the shipped one (%s); --train-plateau trains it", seed, shipped)
            continue
        jobs.append((f"plateau/{seed}", "tiny_plateau.yaml", plateau_overrides(world, d, b, seed, base)))
    return run_jobs(jobs, in_process) | {"plateau": time.perf_counter() - t}


def train_runs(run_dirs: dict, world: Path, b: dict, starts: dict, seed: int | None = None,
               extra: dict | None = None, in_process: bool = False) -> dict:
    """Continue every ``(name, seed) -> run_dir`` from its seed's plateau (``starts``) under the
    protocol. A sweep keys its runs by ``(name, setting)`` instead, gives the one ``seed`` and, in
    ``extra``, each key's overrides. Returns the wall times."""
    t = time.perf_counter()
    # The longest runs first: two workers then finish close together.
    order = sorted(run_dirs.items(), key=lambda item: -EXPECTED_SECONDS.get(item[0][0], 0.0))
    jobs = []
    for (name, key), d in order:
        run_seed = key if seed is None else seed
        jobs.append((f"{name}/{key}", tiny_recipe(name),
                     run_overrides(name, world, d, b, run_seed, starts[run_seed]) + list((extra or {}).get((name, key), []))))
    return run_jobs(jobs, in_process) | {"training": time.perf_counter() - t}


def evaluate_and_compare(run_dirs: dict, world: Path, runs: Path, plateaus: dict, head: str,
                         in_process: bool = False) -> tuple[str, str, dict]:
    """Evaluate the plateaus and every continued run on the test set, twice: the checkpoint selected
    on dev Kiwi (as published) and the one selected on dev chrF++; then quality-aware decoding of the
    best system (by dev chrF++). Prints and returns both comparison tables, against SFT continued."""

    timings = {}
    t = time.perf_counter()
    best = best_system(run_dirs)
    jobs = [(str(d), "plateau", "best", "test", None) for d in plateaus.values()]
    jobs += [(str(d), name, None, "test", None) for (name, _), d in run_dirs.items()]
    jobs += [(str(d), name, "best-chrf", "test-best-chrf", None) for (name, _), d in run_dirs.items()]
    jobs += [(str(d), f"{name}+{rule}", None, "test", rule) for rule in ("rerank", "mbr")
             for (name, _), d in run_dirs.items() if name == best]
    with workers(in_process) as pool:
        done = [pool.submit(_evaluate_worker, jobs[i::2], str(world), not in_process) for i in range(2)]
        reports = [r for future in done for r in future.result()]
    for path, seconds in reports:
        timings[f"evaluate_{Path(path).parents[1].name}_{Path(path).stem}"] = seconds
    # Reranking's rows first, then MBR's (the workers finish in either order).
    selected = sorted((Path(path) for path, _ in reports if path.endswith(("-rerank.json", "-mbr.json"))),
                      key=lambda p: p.name.endswith("-mbr.json"))
    timings["evaluation"] = time.perf_counter() - t

    # The tables (seeds of one system are grouped by its name), against SFT continued.
    baseline = "sft" if any(name == "sft" for name, _ in run_dirs) else "plateau"
    plateau_reports = [str(d / "eval" / "test.json") for d in plateaus.values()]
    by_kiwi = compare(plateau_reports + [str(d) for d in run_dirs.values()] + [str(r) for r in selected],
                      baseline=baseline, out=runs / "comparison", plots=True)
    by_chrf = compare(plateau_reports + [str(d / "eval" / "test-best-chrf.json") for d in run_dirs.values()],
                      baseline=baseline, out=runs / "comparison-chrf", plots=False)
    print(f"\n{head}; checkpoint selected on dev Kiwi (as published); +rerank / +mbr: the best of 8 beam candidates by "
          f"Kiwi / by MBR with the chrF++ utility:\n")
    print(by_kiwi)
    print("\nThe same runs, checkpoint selected on dev chrF++ instead:\n")
    print(by_chrf)
    return by_kiwi, by_chrf, timings
