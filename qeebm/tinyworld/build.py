"""``qeebm tinyworld build DIR``: the offline stand-in for NLLB / mBART / CometKiwi and a low-resource corpus.

Steps, each deterministic in the seed:
1. data: English -> pseudo-Mongolian pairs split into a small labelled set, a larger source-only pool,
   dev and test (``language.py``);
2. tokenizers: one SentencePiece model shared by the XLM-R-style (QE) and mBART-50-style tokenizers,
   as real mBART-50 shares XLM-R's ids, and a separate one for the NLLB-style tokenizer, so both
   vocabulary bridges are exercised;
3. base translators: tiny M2M100 ("nllb") and MBart ("mbart") models SFT-trained on the labelled set
   with qeebm's own training loop; these play the part of the pretrained checkpoints;
4. quality estimators: translations of a separate "qe" split (samples and greedy outputs of both base
   translators, corrupted references, a few references) scored by sentence chrF++ against the
   reference; on them a tiny CometKiwi (``qe/kiwi``, what QE-EBM and the RL baselines optimise), a
   reference-based tiny COMET (``qe/comet``) and a held-out QE of another seed and size
   (``qe/judge``, evaluation only) are trained, and their correlations with the true quality logged;
   the held-out rows they were measured on are kept in ``qe/heldout.tsv`` (src, mt, ref, score).

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

from qeebm.config import data_path_overrides, load_config
from qeebm.errors import QeebmError
from qeebm.langcodes import FAMILIES

log = logging.getLogger("qeebm.tinyworld")


@dataclass(frozen=True)
class WorldSize:
    """How big each part of the world is. ``default`` is the demo; ``micro`` builds in seconds for tests."""

    splits: dict  # "qe" holds the sources whose translations the quality estimators learn from
    shared_vocab: int  # XLM-R / mBART-50 SentencePiece pieces (upper bound)
    nllb_vocab: int
    model: dict  # tiny_config keyword arguments
    train_steps: int
    batch_size: int
    lr: float
    warmup: int


SIZES = {
    "default": WorldSize(
        splits={"train": 3000, "mono": 20000, "dev": 300, "test": 500, "qe": 4000},
        shared_vocab=4000,
        nllb_vocab=3000,
        model=dict(d_model=64, layers=2, heads=4, ffn=256, max_positions=128, dropout=0.1),
        train_steps=1400,
        batch_size=32,
        lr=3e-3,
        warmup=100,
    ),
    "micro": WorldSize(
        splits={"train": 200, "mono": 200, "dev": 16, "test": 16, "qe": 60},
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

    t = time.perf_counter()
    base_metrics, candidates = train_bases(world, [p.src for p in splits["qe"]], seed, spec)
    # The workers also translate the QE split for step 4; that part is timed there.
    timings["qe_candidates_s"] = max(m.pop("qe_candidates_s") for m in base_metrics.values())
    timings["base_translators_s"] = time.perf_counter() - t - timings["qe_candidates_s"]

    t = time.perf_counter()
    qe_report = train_quality_estimators(world, splits, candidates, seed, size)
    timings["qe_s"] = time.perf_counter() - t

    timings["total_s"] = time.perf_counter() - start
    build_log = {"timings": timings, "base": base_metrics, "qe": qe_report}
    (world / "build_log.json").write_text(json.dumps(build_log, indent=2) + "\n")
    manifest = {
        "seed": seed,
        "size": size,
        "splits": {k: len(v) for k, v in splits.items()},
        "base_test": base_metrics,
        "qe_correlation": {k: {m: round(v[m], 4) for m in ("pearson", "spearman")} for k, v in qe_report.items()},
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
    for name in ("train", "dev", "test", "qe"):
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


def base_config(world: Path, seed: int, spec: WorldSize, init_dir: Path, run_dir: Path):
    overrides = [
        f"seed={seed}",
        f"model.name_or_path={init_dir}",
        *data_path_overrides(world / "data"),
        f"optim.lr={spec.lr}",
        f"optim.warmup_steps={spec.warmup}",
        f"optim.max_steps={spec.train_steps}",
        f"optim.batch_size={spec.batch_size}",
        "optim.max_grad_norm=1.0",
        "optim.weight_decay=0.0",
        "optim.scheduler=linear",
        # Greedy dev decoding keeps validation cheap; the final test score uses beam search.
        "generation.num_beams=1",
        f"eval.every={max(spec.train_steps // 2, 1)}",
        "eval.metric=chrf",
        f"output.run_dir={run_dir}",
        f"output.save_every={spec.train_steps}",
        "output.resume=false",
        "logging.report_to=[]",
        "logging.progress_bar=false",
    ]
    return load_config(overrides=overrides)


def train_bases(world: Path, qe_src: list[str], seed: int, spec: WorldSize) -> tuple[dict, dict]:
    """Both base translators at once, each in its own process on one thread: the build takes half
    the time on two cores, and one thread per model makes the weights bitwise reproducible whatever
    the machine's core count."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn: a forked child would inherit torch's thread pool and any accelerate state of the parent.
    with ProcessPoolExecutor(max_workers=len(FAMILIES), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {f: pool.submit(_train_base_worker, str(world), f, qe_src, seed, spec) for f in FAMILIES}
        results = {family: future.result() for family, future in futures.items()}
    return {f: r[0] for f, r in results.items()}, {f: r[1] for f, r in results.items()}


def _train_base_worker(world: str, family: str, qe_src: list[str], seed: int, spec: WorldSize):
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {family} %(name)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    return train_base(Path(world), family, qe_src, seed, spec)


def train_base(world: Path, family: str, qe_src: list[str], seed: int, spec: WorldSize) -> tuple[dict, list]:
    """Random init -> SFT on the labelled set -> ``DIR/<family>-base`` (the best dev checkpoint).
    Returns its test BLEU / chrF++ and its outputs for the QE sources."""
    from qeebm.data import read_corpus
    from qeebm.evaluate import corpus_metrics, translate_corpus
    from qeebm.loop import train
    from qeebm.tinyworld.models import build_tiny_translator
    from qeebm.translator import Translator

    tok_dir = world / "tokenizers" / ("nllb" if family == "nllb" else "mbart50")
    init_dir = world / "runs" / f"{family}-init"
    build_tiny_translator(family, tok_dir, init_dir, seed=seed, **spec.model)
    run_dir = world / "runs" / f"{family}-base"
    cfg = base_config(world, seed, spec, init_dir, run_dir)
    result = train(cfg)
    out = world / f"{family}-base"
    shutil.copytree(result.best_path, out)

    cfg.model.name_or_path = str(out)
    translator = Translator.load(cfg.model)
    test = read_corpus(cfg.data.test, "test", need_target=True)
    cfg.generation.num_beams = 5
    hyps = translate_corpus(translator, test.src, cfg.generation)
    t = time.perf_counter()
    candidates = qe_candidates(translator, qe_src, seed)
    return corpus_metrics(hyps, test.tgt) | {"qe_candidates_s": time.perf_counter() - t}, candidates


def quality_triples(pairs: list, candidates: list[list[str]], seed: int) -> list[tuple[str, str, str, float]]:
    """(src, mt, ref, quality) rows for the QE training data: per source, the base translators'
    outputs (``candidates``), one corrupted reference and, for one source in ten, the reference
    itself; quality is sentence chrF++ against the reference, scaled to [0, 1]."""
    import random

    import sacrebleu

    from qeebm.tinyworld.language import CORRUPTIONS, corrupt

    rng = random.Random(seed)
    chrf = sacrebleu.metrics.CHRF(word_order=2)
    triples = []
    for pair, outputs in zip(pairs, candidates):
        mts = list(outputs) + [corrupt(pair, rng.choice(CORRUPTIONS), rng)]
        if rng.random() < 0.1:
            mts.append(pair.tgt)
        for mt in dict.fromkeys(mts):  # a repeated output is one training row, not several
            triples.append((pair.src, mt, pair.tgt, chrf.sentence_score(mt, [pair.tgt]).score / 100))
    return triples


def qe_candidates(translator, src: list[str], seed: int) -> list[list[str]]:
    """A greedy output and an ancestral sample of ``translator`` for every source."""
    from qeebm.config import GenerationConfig

    out: list[list[str]] = [[] for _ in src]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for gen in (GenerationConfig(num_beams=1, batch_size=128),
                    GenerationConfig(num_beams=1, do_sample=True, batch_size=128)):
            for i, hyp in enumerate(translator.generate(src, gen)):
                out[i].append(hyp)
    return out


def train_quality_estimators(world: Path, splits: dict, candidates: dict, seed: int, size: str) -> dict:
    from qeebm.qe.heldout import write_judged
    from qeebm.qe.tiny import fit_tiny_quality_estimators

    per_source = [sum((candidates[f][i] for f in FAMILIES), []) for i in range(len(splits["qe"]))]
    triples = quality_triples(splits["qe"], per_source, seed)
    # Held out by source, so no source is scored in both parts.
    n_heldout = max(len(splits["qe"]) // 10, 4)
    heldout_src = {p.src for p in splits["qe"][:n_heldout]}
    train = [t for t in triples if t[0] not in heldout_src]
    heldout = [t for t in triples if t[0] in heldout_src]
    log.info("qe data: %d training and %d held-out (src, mt, quality) rows", len(train), len(heldout))
    # Kept, so that a QE trained later (QE-dynamic's qe.heldout_path) is judged on the same rows.
    write_judged(world / "qe" / "heldout.tsv", heldout)
    fit = {"epochs": 1} if size == "micro" else None
    return fit_tiny_quality_estimators(world / "qe", world / "tokenizers" / "xlmr", train, heldout, seed=seed, fit=fit)


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
