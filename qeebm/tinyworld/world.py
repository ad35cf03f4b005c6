"""What the tiny world's build stages share: its sizes, the process pools of their workers, the
translator training settings and QE fitting they run, and the manifest that says a build finished."""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import subprocess
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from qeebm import __version__
from qeebm.config import data_path_overrides, load_config
from qeebm.qe.tiny import TINY_QES, fit_tiny_qe
from qeebm.utils import resources
from qeebm.utils.langcodes import FAMILIES

BASE_PREFIXES = tuple(f"{f}-base/" for f in FAMILIES)  # the base translators' files in a world


QE_MODELS = ("kiwi", "comet", "judge")  # every world's; the default one also has weaker kiwis


@dataclass(frozen=True)
class WorldSize:
    """How big each part of the world is. ``default`` is the demo; ``micro`` builds in seconds for tests.

    ``splits``: distinct sources of the task (train, dev, test) and of the judged data (qe, judge,
    qe_heldout). ``labelled``: the labelled share of ``train`` (published: 20%). ``pretrain``
    (+ ``pretrain_dev``): pairs of the bases' corpus, whose content words are all among the most
    frequent ``common_fraction`` of each word class. ``judged_sft_pairs`` / ``judged_sft_steps``:
    the judged systems include each base fine-tuned on this many QE-split pairs (its checkpoints at
    half and all of the steps); every judged source gets a ``judged_share`` of the (system, decoding)
    outputs and ``judged_k`` samples of one system. ``heldout_k``: samples per held-out source for the
    within-source correlation."""

    splits: dict
    labelled: float
    pretrain: int
    pretrain_dev: int
    common_fraction: float
    shared_vocab: int  # XLM-R / mBART-50 SentencePiece pieces (upper bound)
    nllb_vocab: int
    model: dict  # tiny_config keyword arguments
    train_steps: int
    batch_size: int
    lr: float
    warmup: int
    judged_sft_pairs: int
    judged_sft_steps: int
    judged_share: float
    judged_k: int
    heldout_k: int
    qe_fit: dict  # train_qe overrides for the three QEs
    weaker_kiwis: dict  # name -> share of kiwi's rows: the QE-strength study's weaker estimators
    # The top-range stage (toprange.py): converged systems on the first ``pairs`` QE-split pairs (their
    # plateau run's ``checkpoints``, evenly spaced, at learning rate ``lr``), QE-EBM and REINFORCE from its end against the
    # first Kiwi (``hacked_steps`` at ``hacked_lr``, each with its knob's overrides), their outputs'
    # ``share`` and ``k`` as ``judged_*``, for ``families``; ``fit``: train_qe settings of the continued QEs.
    # None: no such stage.
    top_range: dict | None = None
    # Each stage's workers in spawned processes (two cores halve the build), or one after another in
    # the building process where the work takes seconds and a spawned process's imports cost more.
    in_process: bool = False


SIZES = {
    "default": WorldSize(
        splits={"train": 10000, "dev": 300, "test": 500, "qe": 8000, "judge": 3000, "qe_heldout": 400},
        labelled=0.2,
        pretrain=1000,
        pretrain_dev=200,
        common_fraction=0.05,
        shared_vocab=4000,
        nllb_vocab=3000,
        model=dict(d_model=64, layers=2, heads=4, ffn=256, max_positions=128, dropout=0.1),
        train_steps=1400,
        batch_size=32,
        lr=3e-3,
        warmup=100,
        judged_sft_pairs=1500,
        judged_sft_steps=300,
        judged_share=0.3,
        judged_k=3,
        heldout_k=5,
        qe_fit={},
        weaker_kiwis={"kiwi-weak": 0.05, "kiwi-medium": 0.2},
        top_range=dict(families=("nllb",), pairs=2000, checkpoints=(4000, 4500, 5000, 5500, 6000), lr=8e-3,
                       hacked_steps=300, hacked_lr=2e-3, qe_ebm=["qe_ebm.rho=0.3"], reinforce=["reinforce.pg_weight=1.0"],
                       share=0.3, k=3, fit={"epochs": 2, "lr": 3e-4}),
    ),
    "micro": WorldSize(
        splits={"train": 200, "dev": 16, "test": 16, "qe": 60, "judge": 30, "qe_heldout": 12},
        labelled=0.5,
        pretrain=80,
        pretrain_dev=8,
        common_fraction=0.3,
        shared_vocab=400,
        nllb_vocab=300,
        model=dict(d_model=32, layers=1, heads=2, ffn=64, max_positions=64, dropout=0.1),
        train_steps=20,
        batch_size=16,
        lr=1e-3,
        warmup=5,
        judged_sft_pairs=20,
        judged_sft_steps=4,
        judged_share=0.3,
        judged_k=2,
        heldout_k=3,
        qe_fit={"epochs": 1},
        weaker_kiwis={},
        top_range=dict(families=("nllb",), pairs=20, checkpoints=(2, 4), lr=1e-3, hacked_steps=2, hacked_lr=1e-3,
                       qe_ebm=["qe_ebm.rho=0.3", "qe_ebm.sampling.max_new_tokens=8"],
                       reinforce=["reinforce.pg_weight=1.0", "reinforce.sampling.max_new_tokens=8"], share=0.3, k=2,
                       fit={"epochs": 1}),
        in_process=True,
    ),
}


# Artifacts whose bytes must not depend on anything but the seed (training logs and TensorBoard
# files carry wall-clock times and are left out).
HASHED = ("data", "tokenizers", "nllb-base", "mbart-base", "qe")


def stage_pool(spec: WorldSize, n: int):
    """The executor of a stage's ``n`` workers: spawned processes (a forked child would inherit
    torch's thread pool and any accelerate state of the parent), or ``InlineExecutor`` for a world
    built ``in_process``. Every worker seeds what it draws, so both give the same files."""
    if spec.in_process:
        return InlineExecutor()
    return ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn"))


class InlineExecutor:
    """Runs each submitted call at once, in this process; the worker's one-thread setting is undone
    after it."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        threads = torch.get_num_threads()
        try:
            future.set_result(fn(*args))
        except Exception as err:  # noqa: BLE001 - raised again by future.result(), as a pool's would be
            future.set_exception(err)
        finally:
            torch.set_num_threads(threads)
        return future


def is_built(world: Path) -> bool:
    return (Path(world) / "manifest.json").is_file()


def write_manifest(world: Path, fields: dict | None = None) -> None:
    """``manifest.json``: ``fields`` (or those of the existing manifest), the QEs' held-out
    correlations from ``qe/qe_report.json`` and the sha256 of every artifact. Written last (through a
    temporary file), so its presence means the build finished."""
    path = world / "manifest.json"
    manifest = dict(fields) if fields is not None else {k: v for k, v in json.loads(path.read_text()).items()
                                                        if k in ("seed", "size", "splits", "base_test")}
    report = json.loads((world / "qe" / "qe_report.json").read_text())
    manifest["qe_report"] = {k: {m: round(v[m], 4) for m in ("pearson", "spearman", "within_source_pearson") if m in v}
                             for k, v in report.items() if k in QE_MODELS}
    manifest["files"] = hash_tree(world)
    tmp = world / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(path)


def translator_config(world: Path, seed: int, spec: WorldSize, init_dir: Path, run_dir: Path, *, train: Path,
                      dev: Path, steps: int, lr: float, warmup: int, save_every: int, keep_last: int = 1):
    """The loop's settings for the build's own translator training on the ``train`` pairs, selected
    on the ``dev`` pairs; greedy dev decoding keeps validation cheap."""
    overrides = [
        f"seed={seed}",
        f"model.name_or_path={init_dir}",
        *data_path_overrides(world / "data"),
        f"data.train.path={train}",
        f"data.dev.path={dev}",
        f"optim.lr={lr}",
        f"optim.warmup_steps={warmup}",
        f"optim.max_steps={steps}",
        f"optim.batch_size={spec.batch_size}",
        "optim.max_grad_norm=1.0",
        "optim.weight_decay=0.0",
        "optim.scheduler=linear",
        "generation.num_beams=1",
        f"eval.every={max(steps // 2, 1)}",
        "eval.metric=chrf",
        f"output.run_dir={run_dir}",
        f"output.save_every={save_every}",
        f"output.keep_last={keep_last}",
        "output.resume=false",
        "logging.report_to=[]",
        "logging.progress_bar=false",
    ]
    return load_config(overrides=overrides)


def fit_qe_worker(qe_dir: str, tok: str, jobs: list, seed: int, fit: dict, specs: dict | None = None) -> dict:
    """Each (name, rows) job's tiny QE trained into ``qe_dir/name``: its spec from ``specs``, else
    TINY_QES (a weaker kiwi: the kiwi's)."""

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s qe %(name)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    specs = {**TINY_QES, **(specs or {})}
    return {name: fit_tiny_qe(name, Path(qe_dir) / name, tok, rows, seed, fit=fit, spec=specs.get(name, TINY_QES["kiwi"]))
            for name, rows in jobs}


class WithReferences:
    """A reference-based scorer seen through the reference-free ``score(src, mt)`` call."""

    def __init__(self, scorer, ref_of: dict):
        self.scorer, self.ref_of = scorer, ref_of

    def score(self, src, mt):
        return self.scorer.score(src, mt, [self.ref_of[s] for s in src])


def code_version() -> str:
    """The commit of this checkout, when there is one (the QEs' weights depend on the sampler's code);
    an installed package has none."""


    if not (resources.PACKAGE.parent / ".git").exists():
        return f"qeebm {__version__}"
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"qeebm {__version__}" + (f" @ {commit}" if commit else "")


def hash_tree(world: Path) -> dict[str, str]:
    """sha256 of every artifact, with the world's own absolute path (which comet's hparams.yaml
    must hold, see qeebm/qe/models.py) replaced by a placeholder, so the hashes say whether two
    builds made the same files wherever they were built."""
    files = {}
    where = str(world.resolve()).encode()
    for top in HASHED:
        root = world / top
        if not root.exists():
            continue
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            data = path.read_bytes().replace(where, b"<world>")
            files[str(path.relative_to(world))] = hashlib.sha256(data).hexdigest()
    return files
