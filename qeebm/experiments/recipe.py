"""The recipe runner: one language pair's published comparison, from a ``Recipe`` of a few lines.

A ``Recipe`` states the pair, the public corpus, the models, the systems and the seeds; the table
of published pairs is ``qeebm/experiments/pairs.py``, run by ``recipes/recipe.sh`` (every ``recipes/<pair>.sh``
links to it). ``main`` parses the command line into a ``Plan`` (every run's resolved config for
the launch's process count, checked before anything slow happens) and runs it:

0. access: every model and data set the plan touches, asked of the local cache or the hub in
   seconds (``qeebm/experiments/preflight.py``; ``--check`` also downloads and loads each);
1. data: the corpus is downloaded once and split as published (``qeebm/data/prepare.py``) by the
   main process of each node, while the others wait for its manifest; ``--tiny DIR`` uses the tiny
   world's files;
2. training: every (seed, system) run in turn, in this process, through ``qeebm.training.loop.train``.
   Under ``accelerate launch`` every process executes the same sequence (SPMD) and the Accelerator
   inside ``train`` picks up the distributed environment;
3. evaluation: ``qeebm.evaluation.evaluate.evaluate_run`` on each run's best model (BLEU, chrF++, TER, COMET,
   COMET-Kiwi, XCOMET) -> ``<run>/eval/test.json``, on the main process only; with ``--rerank`` also
   with QE reranking of its beam candidates by the COMET-Kiwi -> ``<run>/eval/test-rerank.json``;
4. comparison: ``scripts/compare.py``'s ``run`` over every report, on the main process.

Finished work is skipped when the same command runs again (a run with ``final/``, an existing
report) and an interrupted run resumes from its newest checkpoint.

``python -m qeebm.experiments.recipe relaunch SCRIPT ARGS`` is what a recipe's shell part calls: it runs the
recipe under ``accelerate launch`` planned for the processes that launch starts (directly for
--dry-run, --check and --help), passes preemption signals to the training processes and exits 0
when they stopped with a checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional, Union

from qeebm.config import EXTRA_SYSTEMS, SEEDS, SYSTEMS, Config, data_path_overrides, flat_dict, load_config, to_dict
from qeebm.data.prepare import HubCorpus, is_prepared, prepare
from qeebm.errors import QeebmError
from qeebm.evaluation.compare import run as compare
from qeebm.experiments import disk
from qeebm.metrics.registry import DEFAULT_MODELS
from qeebm.translation.qad import DEFAULT_CANDIDATES, Selection
from qeebm.utils import resources
from qeebm.utils.langcodes import NLLB_TO_MBART50, to_model_code
from qeebm.utils.process import setup_process

log = logging.getLogger("qeebm.experiments.recipe")

REPO = Path(__file__).resolve().parents[2]
CONFIGS = resources.CONFIGS / "real"
# Set by `bash RECIPE` for the launch: where a training process notes that it stopped on a signal.
PREEMPTED_FILE = "QEEBM_PREEMPTED_FILE"
# Set by `bash RECIPE` for every process it starts (the plan's check, --dry-run, --check, the
# launch's workers): the accelerate config the launch reads, empty for accelerate's default. Their
# checks then see that launch's process count, backend and GPUs before it starts, and their fixes
# name the config file, since `bash` passes no process count to accelerate.
BASH_LAUNCH = "QEEBM_BASH_LAUNCH"
DEFAULT_MODEL = "mbart50"
# What --systems may name: the comparison's systems (run by default), those run on request and any
# other with a recipe in recipes/configs/real (a new method needs only its recipe there).
KNOWN_SYSTEMS = tuple(dict.fromkeys(SYSTEMS + EXTRA_SYSTEMS + tuple(sorted(p.stem for p in CONFIGS.glob("*.yaml")))))


@dataclass(frozen=True)
class ModelChoice:
    hub_id: str
    family: str  # "mbart" | "nllb": which language table the codes must be in
    tiny: str  # the stand-in inside a tiny world


MODELS = {
    # Published: mBART-50 with bottleneck adapters (LoRA in the YAML files; model.bottleneck for the paper's).
    "mbart50": ModelChoice("facebook/mbart-large-50", "mbart", "mbart-base"),
    "nllb600m": ModelChoice("facebook/nllb-200-distilled-600M", "nllb", "nllb-base"),
}

# Evaluation (qeebm/evaluation/evaluate.py decides; these name its models in the dry run without importing torch):
# report key -> model. Every system but SFT optimises kiwi; COMET and XCOMET are the independent
# checks (compare.py's reward-hacking warning reads each report's trained_on and heldout).
METRICS = DEFAULT_MODELS
# The tiny world has no XCOMET; its held-out judge stands in its place: reference-based like XCOMET, of
# another seed, size and data shard than the tiny COMET.
TINY_METRICS = {"comet": "qe/comet", "kiwi": "qe/kiwi", "judge": "qe/judge"}
# The tiny world's language pair stands in for every recipe's.
TINY_PAIR = ("eng_Latn", "khk_Cyrl")


@dataclass
class Recipe:
    """What a recipe file states. ``models[0]`` is the default model; ``length_ratio`` is He et
    al.'s published target/source token-ratio range for the pair's reward-hacking guard (None: the
    guard's default range, nothing being published for the pair)."""

    name: str
    tgt_lang: str
    corpus: HubCorpus
    src_lang: str = "eng_Latn"
    models: tuple[str, ...] = (DEFAULT_MODEL, "nllb600m")
    systems: tuple[str, ...] = SYSTEMS
    seeds: tuple[int, ...] = SEEDS
    length_ratio: Optional[tuple[float, float]] = None
    overrides: tuple[str, ...] = ()


@dataclass
class Run:
    system: str
    seed: int
    config_file: Path
    overrides: list[str]
    cfg: Config

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.output.run_dir)

    @property
    def report(self) -> Path:
        return self.run_dir / "eval" / "test.json"

    @property
    def rerank_report(self) -> Path:
        return self.run_dir / "eval" / "test-rerank.json"


@dataclass
class Plan:
    recipe: Recipe
    model: str
    out: Path
    world: int
    runs: list[Run]
    metrics: dict[str, str]
    data_dir: Path
    tiny: Optional[Path] = None
    prepare_only: bool = False
    notes: list[str] = field(default_factory=list)
    rerank: int = 0  # candidates of the extra reranked evaluation; 0: none

    def selection(self):
        """The reranked evaluation's selection (the trained-on COMET-Kiwi over beam candidates), or None."""

        return Selection("rerank", self.metrics["kiwi"], candidates=self.rerank) if self.rerank else None

    def rerank_reports(self) -> list[str]:
        return [str(r.rerank_report) for r in self.runs] if self.rerank else []

    @property
    def results(self) -> Path:
        return self.out / "results" / self.model

    @property
    def baseline(self) -> str:
        return "sft" if "sft" in {r.system for r in self.runs} else self.runs[0].system

    def run_dirs(self) -> list[str]:
        return list(dict.fromkeys(str(r.run_dir) for r in self.runs))

    def prepare_corpus(self) -> None:
        """The data step: the corpus downloaded and split into ``data_dir`` (once)."""

        cfg, choice = self.runs[0].cfg, MODELS[self.model]
        prepare(self.recipe.corpus, self.data_dir, tokenizer=choice.hub_id,
                src_code=to_model_code(cfg.model.src_lang, choice.family),
                tgt_code=to_model_code(cfg.model.tgt_lang, choice.family), max_tokens=cfg.data.max_tokens)

    def metric_spec(self):
        from qeebm.evaluation.evaluate import MetricSpec

        return MetricSpec.tinyworld(self.tiny) if self.tiny is not None else MetricSpec()

    def compare_args(self) -> list[str]:
        return [*self.run_dirs(), *self.rerank_reports(), "--baseline", self.baseline, "--out", str(self.results),
                "--plots"]


# ----------------------------------------------------------------------------------------------
# Planning: everything here is offline and loads no model or data


def parse_args(argv: list[str], recipe: Union[Recipe, Callable], prog: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description="The published comparison for one language pair "
                                "(recipes/README.md). Runs under `accelerate launch` or `bash`.")
    if callable(recipe) and not isinstance(recipe, Recipe):
        p.add_argument("language", help="target language, an NLLB-200 code such as khk_Cyrl")
        p.add_argument("--corpus-lang", help="the language's key in the corpus (OPUS-100: ISO 639-1, e.g. mn); "
                                             "derived from the mBART-50 code when there is one")
        p.add_argument("--corpus", choices=("opus100", "ted"), default="opus100", help="public corpus (default opus100)")
    p.add_argument("--model", help="translator: mbart50 (published, default) or nllb600m")
    p.add_argument("--systems", help=f"comma-separated systems among {','.join(KNOWN_SYSTEMS)} (default: "
                                     f"{','.join(SYSTEMS)})")
    p.add_argument("--seeds", type=int, metavar="N", help="run the first N of the recipe's seeds")
    p.add_argument("--seed", type=int, action="append", metavar="S", help="run this seed (repeatable) instead")
    p.add_argument("--steps", type=int, metavar="N", help="optimiser steps per run (optim.max_steps)")
    p.add_argument("--out", help="output root (default runs/recipes/NAME)")
    p.add_argument("--tiny", metavar="DIR", default=os.environ.get("QEEBM_TINY_WORLD") or None,
                   help="run offline on the tiny world in DIR (qeebm tinyworld build DIR) instead of the real "
                        "models and data (env QEEBM_TINY_WORLD)")
    p.add_argument("--set", action="append", default=[], metavar="[SYSTEM:]KEY=VALUE",
                   help="dotted config override for every run (--set optim.lr=1e-4) or one system's runs "
                        "(--set ppo:optim.batch_size=24); repeatable")
    p.add_argument("--rerank", nargs="?", type=int, const=DEFAULT_CANDIDATES, default=0, metavar="N",
                   help="also evaluate every run with QE reranking: the best of N beam candidates (default "
                        f"{DEFAULT_CANDIDATES}) by the COMET-Kiwi, as rows SYSTEM+rerank in the comparison")
    p.add_argument("--processes", type=int, metavar="N", help="plan for N processes (default: the launch's: the "
                   "launcher's WORLD_SIZE, or under `bash RECIPE` num_processes of its accelerate config, which N must "
                   "then equal)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit; loads no model or data")
    p.add_argument("--prepare-only", action="store_true", help="download and split the data, then stop")
    p.add_argument("--check", action="store_true",
                   help="check the plan for this launch's process count, then access to, download and loading of every "
                        "model and data set it will touch (translator, corpus, COMET-Kiwi, COMET, XCOMET, judges), "
                        "and exit: 0 when all of them load here")
    # What `bash RECIPE` runs before it starts accelerate: the plan alone, in a second.
    p.add_argument("--check-plan", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--qe-check", action="store_true", help="check the request, then run `qeebm qe-check` "
                   "(docs/qe-check.md) on the translator, the COMET-Kiwi it is trained against and the dev set "
                   "(prepared first) -> OUT/qe-check/MODEL/; run it before a real run")
    p.add_argument("--accelerate-config", metavar="FILE",
                   help="with `bash RECIPE`: the accelerate config to launch with (recipes/accelerate/*.yaml)")
    return p.parse_args(argv)


def config_diff(cfg: Config, explicit: list[str] = ()) -> dict:
    """Every setting that differs from the dataclass defaults, as dotted keys, and the ``explicit``
    ones (``key=value`` overrides) even where they equal the default: the seed, the language pair."""
    keys = {o.split("=", 1)[0].strip() for o in explicit}
    base, mine = flat_dict(to_dict(Config())), flat_dict(to_dict(cfg))
    return {k: v for k, v in mine.items() if base.get(k) != v or k in keys}


def _split_problem(cfg: Config, world: int, accum: int) -> Optional[str]:
    """Why the global batch does not split into ``world`` x ``accum`` micro-batches, or None."""
    from qeebm.training.loop import check_batch_split

    try:
        check_batch_split(cfg, world, accum)
    except QeebmError as err:
        return str(err)
    return None


def fit_grad_accum(cfg: Config, world: int) -> Optional[int]:
    """The accumulation that splits the config's global batch exactly over ``world`` processes, or
    None: the fewest micro-steps whose micro-batch is no larger than the config's own on one process
    (the memory it was sized for: 16 = 4 x 4 on one GPU, 2 x 2 x 4 on two, 4 x 1 x 4 on four), else
    the smallest micro-batch there is."""
    o = cfg.optim
    fits = [a for a in range(1, o.batch_size // world + 1) if _split_problem(cfg, world, a) is None]
    sized = [a for a in fits if o.grad_accum <= world * a]
    return sized[0] if sized else fits[-1] if fits else None


def _fits(cfg: Config, world: int, system: str, fixed: set[str]) -> bool:
    """Whether ``cfg``'s global batch splits over ``world`` processes: at the optim.grad_accum the
    user set (``system`` in ``fixed``), else at one the recipe picks."""
    if system in fixed:
        return _split_problem(cfg, world, cfg.optim.grad_accum) is None
    return fit_grad_accum(cfg, world) is not None


def split_error(runs: list[Run], world: int, fixed: set[str], launch: Optional[Launch] = None) -> QeebmError:
    """The plan cannot run on ``world`` processes: which batches do not split and why, the process
    counts that run all of it (and how to set one, for the ``launch`` as it was started), and the
    batch sizes that would run on ``world`` (one line). ``fixed``: the systems whose optim.grad_accum
    the user set, which stays as set."""
    def fits(cfg: Config, w: int, system: str) -> bool:
        return _fits(cfg, w, system, fixed)

    def with_batch(cfg: Config, size: int) -> Config:
        return dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, batch_size=size))

    by_system = {r.system: r.cfg for r in runs}
    failing = {name: cfg for name, cfg in by_system.items() if not fits(cfg, world, name)}
    # The reason at the largest micro-batch there is (one micro-step), or at the accumulation set.
    reasons: dict[str, list[str]] = {}
    for name, cfg in failing.items():
        reasons.setdefault(_split_problem(cfg, world, cfg.optim.grad_accum if name in fixed else 1), []).append(name)
    top = max(cfg.optim.batch_size for cfg in by_system.values())
    counts = [w for w in range(1, top + 1) if all(fits(cfg, w, name) for name, cfg in by_system.items())]
    larger = {}
    for name, cfg in failing.items():
        size = next((b for b in range(cfg.optim.batch_size + 1, 4 * cfg.optim.batch_size + world + 1)
                     if fits(with_batch(cfg, b), world, name)), None)
        if size is not None:
            larger[name] = size
    sets = [f"--set {name}:optim.batch_size={size}" for name, size in larger.items()]
    if len(larger) == len(by_system) > 1:
        # Every system needs another batch: the commonest size for all, the others scoped (they win).
        common = max(set(larger.values()), key=list(larger.values()).count)
        sets = [f"--set optim.batch_size={common}"] + [f"--set {n}:optim.batch_size={b}" for n, b in larger.items()
                                                        if b != common]
    how = (launch or Launch(world)).count_fix("N")
    fix = (f"process counts that run every system of this plan: {', '.join(map(str, counts))} ({how})"
           if counts else "no process count runs every system of this plan as configured")
    if sets:
        fix += f"; or, on {world}, {' '.join(sets)} (a larger batch than configured: say so when reporting)"
    why = "; ".join(f"{', '.join(names)}: {problem}" for problem, names in reasons.items())
    return QeebmError(f"{world} processes cannot split the global batch of every run exactly ({why}). Fix: {fix}")


# ----------------------------------------------------------------------------------------------
# The launch: the processes, backend and GPUs a plan is checked against


@dataclass(frozen=True)
class Launch:
    """The launch this process plans for (``current_launch``): its processes over all machines,
    whether they take a GPU each (and which ones accelerate gives them), the accelerate variables
    they get (the backend), and how it was started: ``bash`` (RECIPE), ``accelerate`` (launch, or
    another launcher) or ``python`` (RECIPE, one plain process), for the fixes its errors suggest."""

    processes: int
    machines: int = 1
    gpus: bool = False
    gpu_ids: Optional[str] = None  # "0,1": the GPUs accelerate makes visible; None or "all": every one
    env: Mapping[str, str] = field(default_factory=dict)
    by: str = "python"
    config: Optional[str] = None  # the accelerate config file it reads, where known

    @property
    def per_machine(self) -> int:
        return max(self.processes // self.machines, 1)

    def name(self) -> str:
        if self.by == "bash":
            return self.config or "accelerate's default launch (no config file)"
        return "this launch" if self.by == "accelerate" else "this process"

    def count_fix(self, n: Union[int, str]) -> str:
        """How to start ``n`` processes in all (a count, or "N"), given how this launch was started."""
        if self.by == "bash":
            if n == 1:
                return "pass --accelerate-config recipes/accelerate/single_gpu.yaml (one process)"
            where = (f"in {self.config} or in a copy of it" if self.config else
                     "in a copy of recipes/accelerate/multi_gpu.yaml")
            return (f"set num_processes: {n} {where} passed as --accelerate-config: `bash` launches with the "
                    "config's count")
        if self.by == "accelerate":
            if n == 1:
                return "accelerate launch --config_file recipes/accelerate/single_gpu.yaml ..."
            return f"accelerate launch --num_processes {n} ..., or num_processes: {n} in its --config_file"
        return f"accelerate launch --num_processes {n}, or num_processes in the --accelerate-config file"


def _launch_backend(args: argparse.Namespace) -> dict[str, str]:
    """The backend variables accelerate's launchers export for these launch arguments
    (accelerate.utils.launch: prepare_multi_gpu_env, prepare_deepspeed_cmd_env): those that
    qeebm.training.backends.check_backend_request reads."""
    if args.cpu:
        return {}
    if args.use_fsdp:
        return {"ACCELERATE_USE_FSDP": "true"}
    if args.use_deepspeed:
        stage = getattr(args, "zero_stage", None)
        return {"ACCELERATE_USE_DEEPSPEED": "true", **({} if stage is None else
                                                        {"ACCELERATE_DEEPSPEED_ZERO_STAGE": str(stage)})}
    return {}


def read_launch(config: Optional[str]) -> Optional[Launch]:
    """The launch `bash RECIPE` starts, ``accelerate launch [--config_file CONFIG] RECIPE``, as
    accelerate itself reads it: the config's values, else its default config's, else one process
    per GPU. None where this accelerate has no such reader (a private function): the launch's
    workers then check the plan, under accelerate's variables."""
    try:
        from accelerate.commands.config import default_config_file
        from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    except ImportError:
        return None

    args = launch_command_parser().parse_args([*(["--config_file", config] if config else []), "recipe"])
    logging.disable(logging.WARNING)  # its notes on values it filled in are for the launch itself
    try:
        args = _validate_launch_command(args)[0]
    except ValueError as err:
        raise QeebmError(f"accelerate launch{' --config_file ' + config if config else ''}: {err}") from None
    finally:
        logging.disable(logging.NOTSET)
    cpu = (args.cpu or bool(getattr(args, "use_cpu", False))
           or os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true")
    gpu_ids = None if args.gpu_ids is None else str(args.gpu_ids)
    file = config or (default_config_file if os.path.isfile(default_config_file) else None)
    return Launch(int(args.num_processes or 1), int(args.num_machines or 1), gpus=not cpu, gpu_ids=gpu_ids,
                  env={**os.environ, **_launch_backend(args)}, by="bash", config=file)


def current_launch() -> Launch:
    """The launch this process belongs to: the one `bash RECIPE` starts (BASH_LAUNCH), read from its
    accelerate config; else the launcher's this process runs under (its variables); else one plain
    process."""
    if BASH_LAUNCH in os.environ:
        launch = read_launch(os.environ[BASH_LAUNCH] or None)
        if launch is not None:
            return launch
    world = os.environ.get("WORLD_SIZE")
    if world is None:
        return Launch(1, env=os.environ)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true"
    return Launch(int(world), max(int(world) // local, 1), gpus=not cpu, env=os.environ, by="accelerate")


def process_count(args: argparse.Namespace, launch: Launch) -> int:
    """The processes the plan is for: the launch's (its launcher's WORLD_SIZE; what the accelerate
    config of `bash RECIPE` starts), else --processes, else one."""
    launched = None if launch.by == "python" else launch.processes
    if args.processes is not None:
        if args.processes < 1:
            raise QeebmError(f"--processes must be at least 1; got {args.processes}")
        if launched is not None and launched != args.processes:
            if launch.by == "bash":  # the count is the config's: say how to change it there
                raise QeebmError(f"--processes {args.processes}, but {launch.name()} starts {launched} processes; "
                                 f"to run {args.processes}: {launch.count_fix(args.processes)}")
            raise QeebmError(f"--processes {args.processes}, but this launch has {launched} processes")
        return args.processes
    return launched or 1


def check_gpus(launch: Launch, runs: list[Run], fixed: set[str]) -> None:
    """Refuse a launch that starts more processes on a machine than it has GPUs: accelerate gives
    each process the GPU of its local rank, and those past the last fail at start-up. The fix is the
    largest count the GPUs take that splits every run's batch. A machine without any GPU runs every
    launch on CPU processes (qeebm.training.backends.make_accelerator): nothing to compare there."""
    if not launch.gpus or launch.per_machine < 2:
        return
    import torch

    present = torch.cuda.device_count()
    ids = None if launch.gpu_ids in (None, "all") else [i for i in launch.gpu_ids.split(",") if i.strip()]
    usable = present if ids is None else min(present, len(ids))
    if present == 0 or launch.per_machine <= usable:
        return
    counts = [launch.machines * n for n in range(usable, 0, -1)]
    fit = next((n for n in counts if all(_fits(r.cfg, n, r.system, fixed) for r in runs)), None)
    machines = f" on each of its {launch.machines} machines" if launch.machines > 1 else ""
    have = f"{usable} GPU{'s' if usable != 1 else ''}" + (f" (gpu_ids {launch.gpu_ids} of {present})" if ids else "")
    fix = launch.count_fix(fit) if fit else f"no count up to {counts[0]} splits every run's batch"
    if fit and fit != counts[0]:
        fix += f" ({fit}: the most processes the GPUs take that split every run's batch)"
    raise QeebmError(f"{launch.name()} starts {launch.per_machine} processes{machines}, one per GPU, but this machine "
                     f"has {have} (torch.cuda.device_count()). Fix: {fix}")


def resolve_recipe(recipe: Union[Recipe, Callable], args: argparse.Namespace) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    # A language the chosen model lacks is the first thing to say, before any corpus question.
    model = MODELS.get(args.model or DEFAULT_MODEL)
    if model is not None:
        to_model_code(args.language, model.family)
    return recipe(args.language, corpus_lang=args.corpus_lang, corpus=args.corpus)


def build_plan(recipe: Recipe, args: argparse.Namespace) -> Plan:
    model = args.model or recipe.models[0]
    if model not in MODELS:
        raise QeebmError(f"--model must be one of {', '.join(MODELS)}; got '{model}'")
    choice = MODELS[model]
    # The pair must exist in the model's language table, whatever the tiny world stands in with.
    to_model_code(recipe.src_lang, choice.family)
    to_model_code(recipe.tgt_lang, choice.family)
    # FSDP and ZeRO-3 shard the weights every method samples from: refused before the data download,
    # as the launch's workers would refuse them (under `bash`, before it starts them).
    from qeebm.training.backends import check_backend_request

    launch = current_launch()
    check_backend_request(env=launch.env)
    systems = recipe.systems
    if args.systems:
        systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
        unknown = [s for s in systems if s not in KNOWN_SYSTEMS]
        if unknown:
            raise QeebmError(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(KNOWN_SYSTEMS)}")
    seeds = tuple(args.seed) if args.seed else recipe.seeds[: args.seeds] if args.seeds else recipe.seeds
    if not seeds or not systems:
        raise QeebmError("nothing to run: no seeds or no systems selected")
    if args.steps is not None and args.steps < 1:
        raise QeebmError(f"--steps must be at least 1; got {args.steps}")
    if args.rerank < 0:
        raise QeebmError(f"--rerank takes a number of candidates of at least 1; got {args.rerank}")
    out = Path(args.out or REPO / "runs" / "recipes" / recipe.name)
    world = process_count(args, launch)
    tiny = Path(args.tiny).resolve() if args.tiny else None
    notes = []
    if tiny is not None:
        if not is_prepared(tiny):
            raise QeebmError(f"--tiny {tiny}: no finished tiny world there (build one: qeebm tinyworld build {tiny})")
        data_dir = tiny / "data"
        metrics = {k: str(tiny / v) for k, v in TINY_METRICS.items()}
        notes.append(f"tiny world {tiny}: its English -> pseudo-Mongolian pair, models and QEs stand in for "
                     f"{recipe.src_lang} -> {recipe.tgt_lang}, {choice.hub_id} and {recipe.corpus.describe()}")
    else:
        # Per model: the length filter counts the translator's own tokens.
        data_dir = out / "data" / model
        metrics = dict(METRICS)
    common = [f"model.src_lang={recipe.src_lang}", f"model.tgt_lang={recipe.tgt_lang}",
              f"model.name_or_path={choice.hub_id}"]
    common += data_path_overrides(data_dir)
    if recipe.length_ratio is not None:
        lo, hi = recipe.length_ratio
        common.append(f"guards.length_ratio_ranges=[[{recipe.src_lang}, {recipe.tgt_lang}, {lo}, {hi}]]")
    common += list(recipe.overrides)
    if tiny is not None:
        src, tgt = TINY_PAIR
        common += [f"model.src_lang={src}", f"model.tgt_lang={tgt}", f"model.name_or_path={tiny / choice.tiny}",
                   f"qe.path={tiny / 'qe/kiwi'}", 'optim.mixed_precision="no"', "optim.max_steps=4",
                   "optim.warmup_steps=0", "qe.warmup_steps=0", "eval.every=0", "eval.max_examples=16",
                   "output.save_every=0", "logging.every=1", "logging.report_to=[]", "logging.progress_bar=false"]
    if args.steps is not None:
        common.append(f"optim.max_steps={args.steps}")
    scoped = {}
    for item in args.set:
        key = item.split("=", 1)[0]
        target, sep, _ = key.partition(":")
        if sep and target not in KNOWN_SYSTEMS:
            raise QeebmError(f"--set {item}: '{target}' is not a system ({', '.join(KNOWN_SYSTEMS)})")
        scoped.setdefault(target if sep else None, []).append(item[len(target) + 1:] if sep else item)
    runs, fixed, splits = [], set(), True
    for seed in seeds:
        for system in systems:
            user = scoped.get(None, []) + scoped.get(system, [])
            path = CONFIGS / f"{system}.yaml"
            overrides = common + [f"seed={seed}", f"output.run_dir={out / 'runs' / model / system / f'seed{seed}'}"]
            cfg = load_config(path, overrides + user)
            if any(o.split("=", 1)[0].strip() == "optim.grad_accum" for o in user):
                fixed.add(system)
                ok = _split_problem(cfg, world, cfg.optim.grad_accum) is None
            else:
                accum = fit_grad_accum(cfg, world)
                ok = accum is not None
                if ok and accum != cfg.optim.grad_accum:
                    overrides.append(f"optim.grad_accum={accum}")
                    cfg = load_config(path, overrides + user)
            runs.append(Run(system, seed, path, overrides + user, cfg))
            splits &= ok
    check_gpus(launch, runs, fixed)
    if not splits:
        raise split_error(runs, world, fixed, launch)
    precisions = {r.cfg.optim.mixed_precision for r in runs}
    if len(precisions) > 1:
        # accelerate keeps one mixed-precision state per process, fixed by the first run.
        raise QeebmError(f"all runs of a recipe must share optim.mixed_precision; got {', '.join(sorted(precisions))}")
    return Plan(recipe, model, out, world, runs, metrics, data_dir, tiny, args.prepare_only, notes, args.rerank)


# ----------------------------------------------------------------------------------------------
# The dry run


def _yaml_value(value) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True, allow_unicode=True).strip().removesuffix("...").strip()


def plan_disk(plan: Plan) -> list[Optional[disk.RunDisk]]:
    """Each run's disk (None where its translator's architecture is not known offline)."""
    out = []
    for run in plan.runs:
        counts = disk.translator_counts(run.cfg.model)
        out.append(None if counts is None else disk.run_disk(run.cfg, counts))
    return out


def format_disk(d: Optional[disk.RunDisk]) -> str:
    if d is None:
        return "not known offline (the translator's config.json is neither local nor cached)"
    text = (f"{disk.size(d.model_bytes)} in {d.model_dirs} model directories, {d.checkpoints} checkpoint(s) of "
            f"{disk.size(d.checkpoint_bytes)}: {disk.size(d.total)}")
    return f"{text} ({d.note})" if d.note else text


def format_plan(plan: Plan) -> str:
    r, choice = plan.recipe, MODELS[plan.model]
    lines = [f"recipe {r.name}: {r.src_lang} -> {r.tgt_lang}, model {plan.model} ({choice.hub_id}), "
             f"{len({x.system for x in plan.runs})} systems x {len({x.seed for x in plan.runs})} seeds = "
             f"{len(plan.runs)} runs, {plan.world} process(es)"]
    lines += [f"note: {n}" for n in plan.notes]
    lines.append("")
    if plan.tiny is None:
        lines.append(f"1. data: {r.corpus.describe()}: all splits <= 50 {plan.model} tokens per side, train capped "
                     f"at 200000 pairs, 20% labelled, every training source in the source-only pool (qeebm/data/prepare.py)")
        state = "already prepared" if is_prepared(plan.data_dir) else "downloaded on the first real run"
        lines.append(f"   -> {plan.data_dir}/{{train.tsv,mono.txt,dev.tsv,test.tsv}} ({state})")
    else:
        lines.append(f"1. data: the tiny world's files in {plan.data_dir}")
    diffs = [config_diff(run.cfg, run.overrides) for run in plan.runs]
    disks = plan_disk(plan)
    shared = {k: v for k, v in diffs[0].items() if all(d.get(k) == v for d in diffs[1:])}
    lines += ["", "2. training; settings shared by every run (differences from qeebm/config.py's defaults):"]
    lines += [f"     {k}: {_yaml_value(v)}" for k, v in shared.items()]
    for i, (run, diff) in enumerate(zip(plan.runs, diffs), 1):
        rel = run.config_file.relative_to(REPO) if run.config_file.is_relative_to(REPO) else run.config_file
        done = " (done: final/ exists)" if (run.run_dir / "final").is_dir() else ""
        lines.append(f"   [{i}/{len(plan.runs)}] {run.system} seed {run.seed} -> {run.run_dir}{done}")
        lines += [f"       {k}: {_yaml_value(v)}" for k, v in diff.items() if k not in shared]
        lines.append(f"       same run alone: accelerate launch -m qeebm.cli train --config {rel} "
                     + " ".join(shlex.quote(o) for o in run.overrides))
        lines.append(f"       disk: {format_disk(disks[i - 1])}")
    metrics = " ".join(f"{k}={v}" for k, v in plan.metrics.items())
    g = plan.runs[0].cfg.generation
    tiny = f" --tinyworld {shlex.quote(str(plan.tiny))}" if plan.tiny is not None else ""
    lines += ["", f"3. evaluation on the main process, of each run's best/ model on {plan.runs[0].cfg.data.test.path} "
              f"(beam {g.num_beams}, max {g.max_new_tokens} new tokens): BLEU, chrF++, TER, {metrics}; "
              "trained_on kiwi for every system but sft; for each run the same as",
              f"   qeebm evaluate --run RUN_DIR{tiny} --beams {g.num_beams} --max-new-tokens {g.max_new_tokens} "
              f"--batch-size {g.batch_size} --system SYSTEM   -> RUN_DIR/eval/test.json"]
    if plan.rerank:
        lines += [f"   and with QE reranking: the best of {plan.rerank} beam candidates by kiwi, the same as",
                  f"   qeebm evaluate --run RUN_DIR{tiny} --beams {g.num_beams} --max-new-tokens {g.max_new_tokens} "
                  f"--batch-size {g.batch_size} --rerank {shlex.quote(plan.metrics['kiwi'])} --candidates {plan.rerank} "
                  "--system SYSTEM+rerank   -> RUN_DIR/eval/test-rerank.json"]
    known = [d for d in disks if d is not None]
    models, ckpts = sum(d.model_bytes for d in known), sum(d.checkpoints * d.checkpoint_bytes for d in known)
    lines += ["", f"disk, computed from the plan (fp32, qeebm/experiments/disk.py): {disk.size(models)} of model directories "
              f"and {disk.size(ckpts)} of checkpoints for {len(known)} of {len(disks)} runs under {plan.out}, "
              "besides the data and the Hugging Face cache"]
    lines += ["",
              "4. comparison:", "   python scripts/compare.py " + " ".join(shlex.quote(a) for a in plan.compare_args())]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Running the plan (SPMD: every process calls this with the same plan)


def _free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def prepare_data(plan: Plan, state) -> None:
    if plan.tiny is not None:
        return
    if state.is_local_main_process:
        plan.prepare_corpus()
        return
    # Polling the manifest instead of a barrier: a download may outlast NCCL's collective timeout,
    # and if the main process fails the launcher ends this one.
    while not is_prepared(plan.data_dir):
        time.sleep(5)


def train_runs(plan: Plan) -> None:
    from qeebm.training.loop import train

    for i, run in enumerate(plan.runs, 1):
        if (run.run_dir / "final").is_dir():
            log.info("[%d/%d] %s seed %d: already trained (%s/final)", i, len(plan.runs), run.system, run.seed, run.run_dir)
            continue
        log.info("[%d/%d] training %s seed %d -> %s", i, len(plan.runs), run.system, run.seed, run.run_dir)
        result = train(run.cfg)
        if result.preempted:
            # The loop printed how to resume: the same command skips the finished runs and resumes this one.
            marker = os.environ.get(PREEMPTED_FILE)
            if marker and _is_local_main_process():
                Path(marker).write_text(f"{run.system} seed {run.seed} stopped after step {result.step} with a "
                                        f"checkpoint in {run.run_dir / 'checkpoints'}\n", encoding="utf-8")
            raise SystemExit(0)
        _free_memory()


def evaluate_runs(plan: Plan) -> None:
    """Each run's best model on the test set, through qeebm/evaluation/evaluate.py (the numbers comet-score and
    sacrebleu would give). Main process only: it takes no collective, so the other processes may
    already have left and no barrier can time out during a long XCOMET-XL pass."""
    from qeebm.evaluation.evaluate import evaluate_run, selection_split, selection_system

    spec = plan.metric_spec()
    rerank = plan.selection()
    for i, run in enumerate(plan.runs, 1):
        # best/ (selected by eval.metric) as test.json; each eval.also_best choice as test-best-<metric>.json;
        # with --rerank, best/ again with QE reranking of its candidates as test-rerank.json
        todo = [(checkpoint, split, None) for checkpoint, split in selections(run)]
        if rerank is not None:
            todo.append(("best", "test", rerank))
        for checkpoint, split, sel in todo:
            path = run.run_dir / "eval" / f"{selection_split(split, sel)}.json"
            if path.is_file():
                log.info("[%d/%d] %s seed %d: already evaluated (%s)", i, len(plan.runs), run.system, run.seed, path)
                continue
            if checkpoint != "best" and not (run.run_dir / checkpoint).is_dir():
                continue  # no validation ran, so no such choice was made
            report, path = evaluate_run(run.run_dir, run.cfg.data.test, spec, generation=run.cfg.generation,
                                        system=selection_system(run.system, sel),
                                        checkpoint=None if checkpoint == "best" else checkpoint, split=split,
                                        selection=sel)
            log.info("[%d/%d] %s seed %d, %s: %s -> %s", i, len(plan.runs), report["system"], run.seed, checkpoint,
                     " ".join(f"{k}={v:.4g}" for k, v in report["corpus"].items()), path)
            _free_memory()


def selections(run: Run) -> list[tuple[str, str]]:
    """(checkpoint, report split) of each checkpoint choice a run makes: best/ by eval.metric, and
    best-<metric>/ for each of eval.also_best."""
    return [("best", "test")] + [(f"best-{m}", f"test-best-{m}") for m in run.cfg.eval.also_best]


def compare_runs(plan: Plan) -> str:
    """The comparison of the best/ choices, and (written beside it) of each other selection."""

    text = compare(plan.run_dirs() + plan.rerank_reports(), baseline=plan.baseline, out=plan.results, plots=True)
    splits = dict.fromkeys(split for run in plan.runs for _, split in selections(run)[1:])
    for split in splits:
        if all((Path(d) / "eval" / f"{split}.json").is_file() for d in plan.run_dirs()):
            compare(plan.run_dirs(), split=split, baseline=plan.baseline, out=plan.results / split, plots=False)
            text += f"\n(selected by {split.removeprefix('test-best-')} instead: {plan.results / split}/comparison.md)\n"
    return text


def qe_check(plan: Plan) -> Path:
    """``qeebm qe-check`` of the plan's translator, the QE its QE-trained systems optimise (with their
    guard settings) and its dev set, measured against the evaluation's reference-based COMET too;
    the data is prepared first, as the real run would. Returns the report directory."""
    from qeebm.analysis.qe_check import run

    if plan.tiny is None:  # one process: under a launcher only the main one gets here
        plan.prepare_corpus()
    cfg = next((r.cfg for r in plan.runs if r.system != "sft"), plan.runs[0].cfg)
    out = plan.out / "qe-check" / plan.model
    result = run(cfg.qe.path, cfg.model.name_or_path, cfg.data.dev.path, out, src_lang=cfg.model.src_lang,
                 tgt_lang=cfg.model.tgt_lang, comet=plan.metrics["comet"], max_new_tokens=cfg.generation.max_new_tokens,
                 guards=cfg.guards)
    sys.stdout.write((out / "qe_check.md").read_text(encoding="utf-8"))
    print(f"qe-check report: {out}/qe_check.md (verdict: {result['verdict']['level']})")
    return out


def execute(plan: Plan) -> None:
    import torch
    from accelerate import PartialState

    # As qeebm/training/loop.py's Accelerator: without cpu=True, processes on a machine without CUDA would each
    # think they are alone instead of joining one gloo group.
    state = PartialState(cpu=not torch.cuda.is_available())
    if plan.tiny is not None:
        # Tiny models gain nothing from intra-op threads, and lose a lot on a busy shared machine.
        torch.set_num_threads(1)
    if state.is_local_main_process:
        # Seconds: a model or data set this plan cannot have (a licence not accepted for XCOMET, which
        # only the evaluation reads) stops it now, not after the trainings.
        from qeebm.experiments import preflight

        preflight.access(plan)
    prepare_data(plan, state)
    if plan.prepare_only:
        return
    train_runs(plan)
    if not state.is_main_process:
        return
    evaluate_runs(plan)
    sys.stdout.write(compare_runs(plan))
    print(f"results: {plan.results}/comparison.md")


# ----------------------------------------------------------------------------------------------
# Entry points


def _is_main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _is_local_main_process() -> bool:
    return os.environ.get("LOCAL_RANK", "0") == "0"


def format_split(plan: Plan) -> str:
    """How each system's global batch is split over the plan's processes."""
    parts = {}
    for r in plan.runs:
        o = r.cfg.optim
        parts[r.system] = (f"{r.system} {o.batch_size} = {plan.world} x {o.grad_accum} x "
                           f"{o.batch_size // (plan.world * o.grad_accum)}")
    return (f"{plan.world} process(es); global batch = processes x micro-steps x micro-batch: "
            + ", ".join(parts.values()))


def main(recipe: Union[Recipe, Callable], argv: Optional[list[str]] = None, prog: Optional[str] = None) -> int:
    """The Python part of a recipe file: plan, then print (--dry-run) or run. Exit code 2 with a
    one-line error for anything wrong in the request."""
    setup_process()
    argv = sys.argv[1:] if argv is None else argv
    if prog is None:
        prog = os.path.relpath(sys.argv[0]) if sys.argv and sys.argv[0] else "recipe"
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    # Progress from qeebm on the main process; libraries (sacrebleu's per-test lines) only warn.
    logging.getLogger("qeebm").setLevel(logging.INFO if _is_main_process() else logging.WARNING)
    try:
        args = parse_args(argv, recipe, prog)
        if args.accelerate_config:
            raise QeebmError("--accelerate-config is for `bash RECIPE ...`; under accelerate launch pass "
                             "--config_file to accelerate itself")
        plan = build_plan(resolve_recipe(recipe, args), args)
        if args.qe_check:
            if _is_main_process():
                qe_check(plan)
            return 0
        if args.check_plan:
            return 0
        if args.check:
            if _is_local_main_process():
                from qeebm.experiments import preflight

                print(f"check of {prog}: model {plan.model}, {len(plan.runs)} runs, {format_split(plan)}", flush=True)
                preflight.check(plan)
                print("check passed: every model and data set of the plan loads here", flush=True)
            return 0
        if args.dry_run:
            if _is_main_process():
                sys.stdout.write(format_plan(plan))
            return 0
        execute(plan)
    except QeebmError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


def relaunch(script: str, args: list[str]) -> int:
    """``bash RECIPE ARGS``: run the recipe file through ``accelerate launch`` with this Python, the
    config from --accelerate-config (or QEEBM_ACCELERATE_CONFIG), else accelerate's own default
    config. A dry run, --check or --help needs no launcher; they plan for the launch as it would
    start (``current_launch``: its process count, backend and GPUs). --qe-check runs in this one
    process."""
    py = sys.executable
    if any(a in ("--qe-check", "-h", "--help") for a in args):
        os.execv(py, [py, script, *args])
    config = os.environ.get("QEEBM_ACCELERATE_CONFIG")
    rest = []
    it = iter(args)
    for a in it:
        if a == "--accelerate-config":
            config = next(it, None)
            if config is None:
                print("error: --accelerate-config needs a file", file=sys.stderr)
                return 2
        elif a.startswith("--accelerate-config="):
            config = a.split("=", 1)[1]
        else:
            rest.append(a)
    if config and not Path(config).is_file():
        print(f"error: accelerate config file not found: {config}", file=sys.stderr)
        return 2
    # Every process started from here plans for this launch (current_launch): its count, backend, GPUs.
    os.environ[BASH_LAUNCH] = config or ""
    if any(a in ("--dry-run", "--check") for a in rest):
        os.execv(py, [py, script, *rest])
    # A bad request is a one-line error and exit 2 here, not a launcher traceback around it.
    checked = subprocess.run([py, script, *rest, "--check-plan"])
    if checked.returncode:
        return checked.returncode
    cmd = [py, "-m", "accelerate.commands.launch", *(["--config_file", config] if config else []), script, *rest]
    print("+ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    return supervise(cmd, script)


def _is_worker(cmdline: list[str], script: str) -> bool:
    """Whether a process runs ``script`` with Python (``python [-u] SCRIPT ...``), as every launcher
    starts the training processes; the launchers themselves run a module (``-m``)."""
    args = cmdline[1:]
    while args and args[0].startswith("-"):
        if args[0] in ("-m", "-c"):
            return False
        args = args[1:]
    return bool(args) and os.path.abspath(args[0]) == os.path.abspath(script)


def supervise(cmd: list[str], script: str) -> int:
    """Run the launcher ``cmd`` and pass the preemption signals (SIGTERM, SIGUSR1) to the training
    processes it started, not to the launcher: a launcher that gets SIGTERM itself gives its workers
    5 s (accelerate's single-process launcher) or 30 s (torchrun) before SIGKILL, and exits 143 though
    they stopped cleanly. SIGINT and SIGHUP go to the launcher, which ends its workers. Exit status:
    the launcher's, or 0 when a training process reports (through $QEEBM_PREEMPTED_FILE) that it
    stopped on a signal with a checkpoint, whatever the launcher says: the same command resumes."""

    import psutil

    marker = Path(tempfile.mkdtemp(prefix="qeebm-launch-")) / "preempted"
    # A session of its own: a signal to this process group (a terminal's, or `kill -- -PGID`) reaches
    # this process alone, which passes it on as above.
    proc = subprocess.Popen(cmd, env={**os.environ, PREEMPTED_FILE: str(marker)}, start_new_session=True)

    def relay(signum, frame):
        try:
            if signum in (signal.SIGINT, signal.SIGHUP):
                proc.send_signal(signum)
                return
            for child in psutil.Process(proc.pid).children(recursive=True):
                try:
                    if _is_worker(child.cmdline(), script):
                        child.send_signal(signum)
                except psutil.Error:
                    pass
        except psutil.Error:
            pass  # the launcher has gone

    handled = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
    previous = {sig: signal.signal(sig, relay) for sig in handled}
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    code = 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
    if marker.is_file():
        print(f"preempted: {marker.read_text(encoding='utf-8').strip()}; exit 0 (the launcher exited {code}): "
              "run the same command to resume", file=sys.stderr, flush=True)
        code = 0
    shutil.rmtree(marker.parent, ignore_errors=True)
    return code


def corpus_code(nllb: str, corpus_lang: Optional[str]) -> str:
    """The target's key in OPUS-100 / TED (ISO 639-1): given, or the language part of its mBART-50 code."""
    if corpus_lang:
        return corpus_lang
    to_model_code(nllb, "nllb")  # an unknown code is an error with a suggestion
    mbart = NLLB_TO_MBART50.get(nllb)
    if mbart is None:
        raise QeebmError(f"cannot tell the corpus key of '{nllb}' (it has no mBART-50 code): pass --corpus-lang, "
                         "e.g. --corpus-lang ha for OPUS-100's en-ha")
    return mbart.split("_")[0]


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "relaunch":
        sys.exit(relaunch(sys.argv[2], sys.argv[3:]))
    print("usage: python -m qeebm.experiments.recipe relaunch RECIPE [ARGS]  (what `bash recipes/<pair>.sh` runs)", file=sys.stderr)
    sys.exit(2)
