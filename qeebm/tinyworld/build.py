"""``qeebm tinyworld build DIR``: the offline stand-in for NLLB / mBART / CometKiwi and a low-resource corpus.

Steps, each deterministic in the seed:
1. data: English -> pseudo-Mongolian pairs split into a small labelled set, a larger source-only pool,
   dev and test (``language.py``);
2. tokenizers: one SentencePiece model shared by the XLM-R-style (QE) and mBART-50-style tokenizers,
   as real mBART-50 shares XLM-R's ids, and a separate one for the NLLB-style tokenizer, so both
   vocabulary bridges are exercised;
3. base translators: tiny M2M100 ("nllb") and MBart ("mbart") models SFT-trained on the labelled set
   with qeebm's own training loop; these play the part of the pretrained checkpoints.

``manifest.json`` (written last, so its presence means the build finished) lists every artifact's
sha256; the same seed gives the same manifest. Timings go to ``build_log.json``, which is not hashed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from qeebm.errors import QeebmError

log = logging.getLogger("qeebm.tinyworld")

FAMILIES = ("nllb", "mbart")


@dataclass(frozen=True)
class WorldSize:
    """How big each part of the world is. ``default`` is the demo; ``micro`` builds in seconds for tests."""

    splits: dict
    shared_vocab: int  # XLM-R / mBART-50 SentencePiece pieces (upper bound)
    nllb_vocab: int
    model: dict  # tiny_config keyword arguments
    train_steps: int
    batch_size: int
    lr: float
    warmup: int


SIZES = {
    "default": WorldSize(
        splits={"train": 3000, "mono": 20000, "dev": 300, "test": 500},
        shared_vocab=4000,
        nllb_vocab=3000,
        model=dict(d_model=64, layers=2, heads=4, ffn=256, max_positions=128, dropout=0.1),
        train_steps=1500,
        batch_size=32,
        lr=3e-3,
        warmup=100,
    ),
    "micro": WorldSize(
        splits={"train": 200, "mono": 200, "dev": 16, "test": 16},
        shared_vocab=400,
        nllb_vocab=300,
        model=dict(d_model=32, layers=1, heads=2, ffn=64, max_positions=64, dropout=0.1),
        train_steps=20,
        batch_size=16,
        lr=1e-3,
        warmup=5,
    ),
}

# Artifacts whose bytes must not depend on anything but the seed (training logs and TensorBoard
# files carry wall-clock times and are left out).
HASHED = ("data", "tokenizers", "nllb-base", "mbart-base", "qe")


def is_built(world: Path) -> bool:
    return (Path(world) / "manifest.json").is_file()


def build(world_dir: str | Path, seed: int = 0, size: str = "default", force: bool = False) -> Path:
    world = Path(world_dir)
    if size not in SIZES:
        raise QeebmError(f"unknown tiny-world size {size!r}; expected one of {', '.join(SIZES)}")
    if is_built(world) and not force:
        log.info("tiny world already built in %s (manifest.json present); use --force to rebuild", world)
        return world
    if world.exists():
        shutil.rmtree(world)
    world.mkdir(parents=True)
    spec = SIZES[size]
    timings: dict[str, float] = {}
    start = time.perf_counter()

    t = time.perf_counter()
    splits = write_data(world / "data", seed, spec)
    timings["data_s"] = time.perf_counter() - t

    t = time.perf_counter()
    write_tokenizers(world / "tokenizers", splits, seed, spec)
    timings["tokenizers_s"] = time.perf_counter() - t

    base_metrics = {}
    for family in FAMILIES:
        t = time.perf_counter()
        base_metrics[family] = train_base(world, family, seed, spec)
        timings[f"{family}_base_s"] = time.perf_counter() - t

    timings["total_s"] = time.perf_counter() - start
    build_log = {"timings": timings, "torch_threads": torch.get_num_threads(), "base": base_metrics}
    (world / "build_log.json").write_text(json.dumps(build_log, indent=2) + "\n")
    manifest = {
        "seed": seed,
        "size": size,
        "splits": {k: len(v) for k, v in splits.items()},
        "base_test": base_metrics,
        "files": hash_tree(world),
    }
    tmp = world / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(world / "manifest.json")
    for family, m in base_metrics.items():
        log.info("base %s: test BLEU %.1f chrF++ %.1f", family, m["bleu"], m["chrf"])
    log.info("tiny world built in %s in %.0f s", world, timings["total_s"])
    return world


def write_data(out: Path, seed: int, spec: WorldSize) -> dict:
    from qeebm.data import write_lines, write_tsv
    from qeebm.tinyworld.language import build_splits

    splits = build_splits(seed, dict(spec.splits))
    for name in ("train", "dev", "test"):
        write_tsv(out / f"{name}.tsv", [p.src for p in splits[name]], [p.tgt for p in splits[name]])
    # The pool is source-only; its references are kept apart for analysis, never for training.
    write_lines(out / "mono.txt", [p.src for p in splits["mono"]])
    write_tsv(out / "mono_ref.tsv", [p.src for p in splits["mono"]], [p.tgt for p in splits["mono"]])
    log.info("data: %s", ", ".join(f"{k} {len(v)}" for k, v in splits.items()))
    return splits


def write_tokenizers(out: Path, splits: dict, seed: int, spec: WorldSize) -> None:
    from qeebm.tinyworld.tokenizers import (
        build_mbart50_tokenizer,
        build_nllb_tokenizer,
        build_xlmr_tokenizer,
        train_sentencepiece,
    )

    # Both languages, as the real multilingual vocabularies cover both sides.
    texts = [t for name in ("train", "mono") for p in splits[name] for t in (p.src, p.tgt)]
    shared = train_sentencepiece(texts, out / "spm-shared.model", spec.shared_vocab, seed)
    nllb = train_sentencepiece(texts, out / "spm-nllb.model", spec.nllb_vocab, seed + 1)
    build_xlmr_tokenizer(shared, out / "xlmr")
    build_mbart50_tokenizer(shared, out / "mbart50")
    build_nllb_tokenizer(nllb, out / "nllb")


def base_config(world: Path, family: str, seed: int, spec: WorldSize, init_dir: Path, run_dir: Path):
    from qeebm.config import load_config

    overrides = [
        f"seed={seed}",
        f"model.name_or_path={init_dir}",
        f"data.train.path={world / 'data/train.tsv'}",
        f"data.dev.path={world / 'data/dev.tsv'}",
        f"data.test.path={world / 'data/test.tsv'}",
        f"data.mono.path={world / 'data/mono.txt'}",
        f"optim.lr={spec.lr}",
        f"optim.warmup_steps={spec.warmup}",
        f"optim.max_steps={spec.train_steps}",
        f"optim.batch_size={spec.batch_size}",
        "optim.max_grad_norm=1.0",
        "optim.weight_decay=0.0",
        "optim.scheduler=linear",
        # Greedy dev decoding keeps validation cheap; the final test score uses beam search.
        "generation.num_beams=1",
        f"eval.every={max(spec.train_steps // 4, 1)}",
        "eval.metric=chrf",
        f"output.run_dir={run_dir}",
        f"output.save_every={spec.train_steps}",
        "output.resume=false",
        "logging.tensorboard=false",
        "logging.progress_bar=false",
    ]
    return load_config(overrides=overrides)


def train_base(world: Path, family: str, seed: int, spec: WorldSize) -> dict:
    """Random init -> SFT on the labelled set -> ``DIR/<family>-base`` (the best dev checkpoint)."""
    from qeebm.data import read_corpus
    from qeebm.evaluate import corpus_metrics, translate_corpus
    from qeebm.loop import train
    from qeebm.tinyworld.models import build_tiny_translator
    from qeebm.translator import Translator

    tok_dir = world / "tokenizers" / ("nllb" if family == "nllb" else "mbart50")
    init_dir = world / "runs" / f"{family}-init"
    build_tiny_translator(family, tok_dir, init_dir, seed=seed, **spec.model)
    run_dir = world / "runs" / f"{family}-base"
    cfg = base_config(world, family, seed, spec, init_dir, run_dir)
    result = train(cfg)
    out = world / f"{family}-base"
    shutil.copytree(result.best_path, out)

    cfg.model.name_or_path = str(out)
    translator = Translator.load(cfg.model)
    test = read_corpus(cfg.data.test, "test", need_target=True)
    cfg.generation.num_beams = 5
    hyps = translate_corpus(translator, test.src, cfg.generation)
    return corpus_metrics(hyps, test.tgt)


def hash_tree(world: Path) -> dict[str, str]:
    files = {}
    for top in HASHED:
        root = world / top
        if not root.exists():
            continue
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            files[str(path.relative_to(world))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files
