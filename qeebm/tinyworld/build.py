"""``qeebm tinyworld build DIR``: the offline stand-in for NLLB / mBART / CometKiwi and a low-resource task.

The world mirrors the published protocol (docs/tinyworld.md):

1. data: English -> pseudo-Mongolian pairs (``language/``) in source-disjoint splits. The task:
   ``train`` pairs of which the first 20% are labelled (``data/train.tsv``) and whose sources are
   all the source-only pool (``data/mono.txt``), dev and test. The bases' "pretraining" corpus, a
   narrower slice of the same language (only the most common content words). The QEs' judged
   sentences: ``qe`` (kiwi and comet), ``judge`` (the judge's own shard) and ``qe_heldout``.
2. tokenizers: one SentencePiece model shared by the XLM-R-style (QE) and mBART-50-style tokenizers,
   as real mBART-50 shares XLM-R's ids, and a separate one for the NLLB-style tokenizer, so both
   vocabulary bridges are exercised;
3. base translators: tiny M2M100 ("nllb") and MBart ("mbart") models trained on the pretraining
   corpus alone with qeebm's own loop: like a pretrained NLLB-200 / mBART-50 they know the language
   a little and have never seen the task's pairs;
4. quality estimators, from judged translations of the QE sentences by many systems, corruptions and
   degenerate outputs (``judged.py``): a tiny CometKiwi (``qe/kiwi``, what QE-EBM and the RL
   baselines optimise), a reference-based tiny COMET (``qe/comet``) and a first held-out QE of
   another seed, size and data shard; then the top of the quality range (``toprange.py``): the Kiwi
   trained further on converged systems' outputs, and the held-out judge (``qe/judge``, evaluation
   only), reference-based, trained on its own shard's. Their correlations with the true quality are
   measured on held-out sentences, overall and within the samples of one source
   (``qe/qe_report.json``); the held-out judged rows are kept in ``qe/heldout.tsv``.

Step 4 costs more than the main demo's budget on two cores (about 9 minutes here), so the default
world's QEs are shipped in ``data/tinyworld-qe`` with the hashes of the inputs they were built from
(the tokenizer, the judged data and the systems that translated it); ``qe="auto"`` copies them when
those hashes match this build's and builds them otherwise. ``qeebm tinyworld build-qe`` rebuilds the
shipped files (``tests/integration/test_tinyworld.py`` checks the hashes).

``manifest.json`` (written last, so its presence means the build finished) lists every artifact's
sha256; the same seed gives the same manifest. Timings go to ``build_log.json``, which is not hashed.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch

from qeebm.config import CorpusConfig, ModelConfig
from qeebm.data.corpus import read_corpus, write_lines, write_tsv
from qeebm.errors import QeebmError
from qeebm.qe.heldout import write_judged
from qeebm.qe.scoring import QEScorer
from qeebm.qe.train import torch_threads
from qeebm.tinyworld.judged import Judged, degenerate_probes, heldout_samples, judged_rows, report, system_outputs
from qeebm.tinyworld.language import Pair, build_splits, narrow_pairs
from qeebm.tinyworld.models import build_tiny_translator
from qeebm.tinyworld.tokenizers import (
    build_mbart50_tokenizer,
    build_nllb_tokenizer,
    build_xlmr_tokenizer,
    train_sentencepiece,
)
from qeebm.tinyworld.toprange import add_top_range
from qeebm.tinyworld.world import (
    BASE_PREFIXES,
    SIZES,
    WithReferences,
    WorldSize,
    code_version,
    fit_qe_worker,
    hash_tree,
    is_built,
    stage_pool,
    translator_config,
    write_manifest,
)
from qeebm.training.checkpoint import load_model, step_dir
from qeebm.training.loop import train
from qeebm.translation.decoding import translate_corpus
from qeebm.translation.translator import Translator
from qeebm.utils import resources
from qeebm.utils.langcodes import FAMILIES

log = logging.getLogger("qeebm.tinyworld")

SHIPPED_QE = resources.SHIPPED_QE


def build(world_dir: str | Path, seed: int = 0, size: str = "default", force: bool = False, qe: str = "auto",
          shipped: str | Path = SHIPPED_QE) -> Path:
    """Build the world in ``world_dir``. ``qe``: "auto" copies the base translators and QEs shipped in
    ``shipped`` when they were built from this build's inputs (the same seed, size, data and
    tokenizers), else trains them; "build" always trains them."""
    world = Path(world_dir)
    if size not in SIZES:
        raise QeebmError(f"unknown tiny-world size {size!r}; expected one of {', '.join(SIZES)}")
    if qe not in ("auto", "build"):
        raise QeebmError(f"unknown QE source {qe!r}; expected auto or build")
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

    shipped = shipped_qe_matches(Path(shipped), world, seed, size) if qe == "auto" else None
    t = time.perf_counter()
    if shipped is not None and (shipped / "bases").is_dir():
        base_metrics = copy_shipped_bases(shipped, world)
        timings["base_translators_s"] = time.perf_counter() - t
    else:
        workers = train_bases(world, seed, spec, judged=shipped is None)
        base_metrics = {f: w["test"] for f, w in workers.items()}
        timings["base_translators_s"] = max(w["base_s"] for w in workers.values())
        if shipped is None:
            timings["judged_systems_s"] = max(w["judged_s"] for w in workers.values())

    t = time.perf_counter()
    if shipped is not None:
        qe_report = copy_shipped_qe(shipped, world)
        log.info("quality estimators: the shipped ones (%s), built from this world's inputs", shipped)
    else:
        qe_report = train_quality_estimators(world, splits, workers, seed, spec)
        if spec.top_range:
            t_top = time.perf_counter()
            qe_report = add_top_range(world, seed, size, manifest=False)
            timings["qe_top_range_s"] = time.perf_counter() - t_top
    timings["qe_s"] = time.perf_counter() - t

    timings["total_s"] = time.perf_counter() - start
    build_log = {"timings": timings, "base": base_metrics, "qe": qe_report, "qe_source": "shipped" if shipped else "built",
                 "code": code_version()}
    (world / "build_log.json").write_text(json.dumps(build_log, indent=2) + "\n")
    write_manifest(world, {"seed": seed, "size": size, "splits": {k: len(v) for k, v in splits.items()},
                           "base_test": base_metrics})
    for family, m in base_metrics.items():
        log.info("base %s: test BLEU %.1f chrF++ %.1f", family, m["bleu"], m["chrf"])
    log.info("tiny world built in %s in %.0f s", world, timings["total_s"])
    return world


# ----------------------------------------------------------------------------------------------
# 1-2. Data and tokenizers


def write_data(out: Path, seed: int, spec: WorldSize) -> dict:
    """Every split, as files: the task (train.tsv = the labelled share, mono.txt = every training
    source, train_all.tsv = every training pair, the "all pairs labelled" ceiling), dev, test, the
    bases' corpus (pretrain.tsv, pretrain_dev.tsv) and the judged sentences (qe.tsv, judge.tsv,
    qe_heldout.tsv). Returns the splits as lists of pairs."""

    splits = build_splits(seed, dict(spec.splits))
    taken = {p.src for pairs in splits.values() for p in pairs}
    pre = narrow_pairs(spec.pretrain + spec.pretrain_dev, seed + 1000, spec.common_fraction, exclude=taken)
    splits["pretrain"], splits["pretrain_dev"] = pre[:spec.pretrain], pre[spec.pretrain:]
    n_labelled = round(spec.labelled * len(splits["train"]))
    files = {"train": splits["train"][:n_labelled], "train_all": splits["train"]}
    files |= {name: splits[name] for name in ("dev", "test", "pretrain", "pretrain_dev", "qe", "judge", "qe_heldout")}
    for name, pairs in files.items():
        write_tsv(out / f"{name}.tsv", [p.src for p in pairs], [p.tgt for p in pairs])
    # The pool is every training source, the labelled ones included (as published); the references
    # of the pool are kept apart for analysis, never for training.
    write_lines(out / "mono.txt", [p.src for p in splits["train"]])
    write_tsv(out / "mono_ref.tsv", [p.src for p in splits["train"]], [p.tgt for p in splits["train"]])
    log.info("data: %s; %d labelled", ", ".join(f"{k} {len(v)}" for k, v in splits.items()), n_labelled)
    return splits


def write_tokenizers(out: Path, splits: dict, seed: int, spec: WorldSize) -> None:
    # Both languages, as the real multilingual vocabularies cover both sides.
    texts = [t for name in ("pretrain", "train", "qe") for p in splits[name] for t in (p.src, p.tgt)]
    shared = train_sentencepiece(texts, out / "spm-shared.model", spec.shared_vocab, seed)
    nllb = train_sentencepiece(texts, out / "spm-nllb.model", spec.nllb_vocab, seed + 1)
    build_xlmr_tokenizer(shared, out / "xlmr")
    build_mbart50_tokenizer(shared, out / "mbart50")
    build_nllb_tokenizer(nllb, out / "nllb")


# ----------------------------------------------------------------------------------------------
# 3. Base translators (and the judged systems' outputs, in the same worker)


def train_bases(world: Path, seed: int, spec: WorldSize, judged: bool) -> dict:
    """Both base translators at once, each in its own process on one thread (the build takes half
    the time on two cores, and one thread per model makes the weights bitwise reproducible whatever
    the machine's core count; ``stage_pool``); with ``judged``, each worker then translates the
    judged sentences."""
    with stage_pool(spec, len(FAMILIES)) as pool:
        futures = {f: pool.submit(_family_worker, str(world), f, seed, spec, judged) for f in FAMILIES}
        return {family: future.result() for family, future in futures.items()}


def _family_worker(world: str, family: str, seed: int, spec: WorldSize, judged: bool) -> dict:
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {family} %(name)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    world_ = Path(world)
    t = time.perf_counter()
    test = train_base(world_, family, seed, spec)
    out = {"test": test, "base_s": time.perf_counter() - t}
    if judged:
        t = time.perf_counter()
        out |= judged_outputs(world_, family, seed, spec)
        out["judged_s"] = time.perf_counter() - t
    return out


def train_base(world: Path, family: str, seed: int, spec: WorldSize) -> dict:
    """Random init -> the pretraining corpus -> ``DIR/<family>-base`` (the best checkpoint by chrF++
    on the corpus's own dev set, never the task's). Returns its test BLEU / chrF++ on the task."""
    from qeebm.metrics.sacrebleu import corpus_metrics

    tok_dir = world / "tokenizers" / ("nllb" if family == "nllb" else "mbart50")
    init_dir = world / "runs" / f"{family}-init"
    build_tiny_translator(family, tok_dir, init_dir, seed=seed, **spec.model)
    # Checkpoints at each quarter are kept: the judged systems include the base as it learnt.
    data = world / "data"
    cfg = translator_config(world, seed, spec, init_dir, world / "runs" / f"{family}-base", train=data / "pretrain.tsv",
                            dev=data / "pretrain_dev.tsv", steps=spec.train_steps, lr=spec.lr, warmup=spec.warmup,
                            save_every=max(spec.train_steps // 4, 1), keep_last=4)
    result = train(cfg)
    shutil.copytree(result.best_path, world / f"{family}-base")
    cfg.model.name_or_path = str(world / f"{family}-base")
    translator = Translator.load(cfg.model)
    test = read_corpus(cfg.data.test, "test", need_target=True)
    cfg.generation.num_beams = 5
    return corpus_metrics(translate_corpus(translator, test.src, cfg.generation), test.tgt)


def judged_systems(world: Path, family: str, seed: int, spec: WorldSize) -> dict:
    """name -> Translator: the base at a quarter and half of its training and at its best, and the
    base fine-tuned on the first ``judged_sft_pairs`` pairs of the QE split at half and all of its
    steps (those pairs are then not judged: ``judged_outputs``)."""

    init = world / "runs" / f"{family}-init"
    systems = {}
    for quarter in (1, 2):
        tr = Translator.load(ModelConfig(name_or_path=str(init)))
        load_model(step_dir(world / "runs" / f"{family}-base" / "checkpoints", quarter * max(spec.train_steps // 4, 1)), tr.model)
        systems[f"{family}-base@{quarter}q"] = tr
    systems[f"{family}-base"] = Translator.load(ModelConfig(name_or_path=str(world / f"{family}-base")))
    # The base fine-tuned like the methods' SFT runs, on pairs the task never sees.

    qe = read_corpus(CorpusConfig(path=str(world / "data" / "qe.tsv")), "qe", need_target=True)
    n = spec.judged_sft_pairs
    pairs = world / "runs" / f"{family}-judged-sft.tsv"
    write_tsv(pairs, qe.src[:n], qe.tgt[:n])
    steps = spec.judged_sft_steps
    cfg = translator_config(world, seed, spec, world / f"{family}-base", world / "runs" / f"{family}-judged-sft",
                            train=pairs, dev=world / "data" / "pretrain_dev.tsv", steps=steps, lr=5e-4,
                            warmup=max(steps // 10, 1), save_every=max(steps // 2, 1), keep_last=2)
    train(cfg)
    for half in (1, 2):
        tr = Translator.load(ModelConfig(name_or_path=str(world / f"{family}-base")))
        load_model(step_dir(world / "runs" / f"{family}-judged-sft" / "checkpoints", half * max(steps // 2, 1)), tr.model)
        systems[f"{family}-sft@{half}h"] = tr
    for tr in systems.values():
        tr.model.eval()
    return systems


def judged_outputs(world: Path, family: str, seed: int, spec: WorldSize) -> dict:
    """This family's systems' translations of the judged sentences (``qe`` past the pairs the
    fine-tuned system learnt from, ``judge``) and their held-out samples (``qe_heldout``: the base
    and the fine-tuned system, K samples and the greedy output each)."""

    systems = judged_systems(world, family, seed, spec)
    read = lambda name: read_corpus(CorpusConfig(path=str(world / "data" / f"{name}.tsv")), name, need_target=True)  # noqa: E731
    out = {}
    family_seed = seed + FAMILIES.index(family) * 101
    for name in ("qe", "judge"):
        corpus = read(name)
        src = corpus.src[spec.judged_sft_pairs:] if name == "qe" else corpus.src
        out[f"outputs_{name}"] = system_outputs(systems, src, spec.judged_share, family_seed + len(out), k=spec.judged_k)
    held = read("qe_heldout")
    pairs = [Pair(s, t) for s, t in zip(held.src, held.tgt)]
    chosen = {name: systems[name] for name in (f"{family}-base", f"{family}-sft@2h")}
    out["heldout_samples"] = [r.__dict__ for r in heldout_samples(chosen, pairs, spec.heldout_k, family_seed)]
    return out


# ----------------------------------------------------------------------------------------------
# 4. Quality estimators


def judged_data(world: Path, splits: dict, workers: dict, seed: int, spec: WorldSize):
    """The judged rows each QE learns from ("qe": kiwi and comet, "judge"), the held-out rows they
    are measured on (every kind of output), the translators' held-out samples and the degenerate
    probes (``judged.report``)."""

    rows = {}
    for name in ("qe", "judge"):
        pairs = splits[name][spec.judged_sft_pairs:] if name == "qe" else splits[name]
        # Both families' outputs of each source.
        outputs = [sum((workers[f][f"outputs_{name}"][i] for f in FAMILIES), []) for i in range(len(pairs))]
        rows[name] = judged_rows(pairs, outputs, seed + (0 if name == "qe" else 1))
    held_pairs = splits["qe_heldout"]
    samples = [Judged(**r) for f in FAMILIES for r in workers[f]["heldout_samples"]]
    # Held-out rows of every kind: the translators' outputs, corruptions, degenerates, references.
    by_src: dict = {}
    for r in samples:
        by_src.setdefault(r.src, []).append((r.origin, r.mt))
    heldout = judged_rows(held_pairs, [by_src.get(p.src, []) for p in held_pairs], seed + 2)
    return rows, heldout, samples, degenerate_probes(held_pairs, seed + 3)


def train_quality_estimators(world: Path, splits: dict, workers: dict, seed: int, spec: WorldSize) -> dict:
    """The three QEs in two processes (kiwi; comet then judge), then their report."""

    rows, heldout, samples, probes = judged_data(world, splits, workers, seed, spec)
    log.info("judged data: %s rows; %d held-out rows, %d held-out samples",
             ", ".join(f"{k} {len(v)}" for k, v in rows.items()), len(heldout), len(samples))
    qe_dir = world / "qe"
    # Kept, so that a QE trained later (QE-dynamic's qe.heldout_path) is judged on the same rows.
    write_judged(qe_dir / "heldout.tsv", [r.row() for r in heldout])
    # And what they learnt from, with each row's origin (judged.Judged), for studies of the QEs.
    for name, judged in rows.items():
        write_judged(qe_dir / f"train_{name}.tsv", [r.row() for r in judged], origins=[r.origin for r in judged])
    tok = world / "tokenizers" / "xlmr"
    # Weaker kiwis for the QE-strength study (scripts/qe_strength.py): the same model on a random
    # share of the same rows.
    weaker = [(name, random.Random(seed + 7).sample(rows["qe"], max(1, round(share * len(rows["qe"])))))
              for name, share in spec.weaker_kiwis.items()]
    # Two processes of about equal work: comet encodes three segments a row.
    plan = {"kiwis": [("kiwi", rows["qe"]), *weaker, ("judge", rows["judge"])], "comet": [("comet", rows["qe"])]}
    with stage_pool(spec, 2) as pool:
        futures = [pool.submit(fit_qe_worker, str(qe_dir), str(tok), [(n, [r.row() for r in rs]) for n, rs in jobs],
                               seed, spec.qe_fit) for jobs in plan.values()]
        fitted = {name: rec for future in futures for name, rec in future.result().items()}
    return qe_report(qe_dir, fitted, heldout, samples, probes)


def qe_report(qe_dir: Path, fitted: dict, heldout, samples, probes) -> dict:
    """Each QE's ``judged.report`` on the held-out sentences (COMET with the reference), written to
    ``qe/qe_report.json`` without timings, so the same seed writes the same file."""
    from qeebm.qe.models import load_qe, qe_kind

    out = {}
    for name, record in fitted.items():
        model = load_qe(str(qe_dir / name))
        scorer = QEScorer(model, batch_size=128)
        if qe_kind(model) == "comet":
            ref_of = {r.src: r.ref for r in heldout}
            scorer = WithReferences(scorer, ref_of)
        # One thread, as the stage workers: the scores' last digits depend on the thread count, and
        # an in-process build (the micro world's) runs at whatever count its caller left.
        with torch_threads(1):
            out[name] = record | report(scorer, heldout, samples, probes)
        log.info("tiny QE %s: held-out Pearson %.3f, Spearman %.3f; translator outputs %.3f; within source %.3f",
                 name, out[name]["pearson"], out[name]["spearman"], out[name]["outputs_pearson"],
                 out[name]["within_source_pearson"])
    stable = {k: {f: v for f, v in r.items() if f not in ("seconds", "path")} for k, r in out.items()}
    (qe_dir / "qe_report.json").write_text(json.dumps(stable, indent=2, sort_keys=True) + "\n")
    return out


# ----------------------------------------------------------------------------------------------
# The shipped QEs


def qe_inputs_digest(world: Path) -> str:
    """sha256 over what the QEs are built from: the QE tokenizer, every data file, and the base
    translators (whose checkpoints translate the judged sentences): a QE built from the same digest
    is the QE this build would train."""
    h = hashlib.sha256()
    files = hash_tree(world)
    for key in sorted(files):
        if key.startswith(("tokenizers/", "data/", "nllb-base/", "mbart-base/")):
            h.update(f"{key}={files[key]}\n".encode())
    return h.hexdigest()


def shipped_qe_matches(shipped: Path, world: Path, seed: int, size: str) -> Path | None:
    """``shipped`` when its QEs were built with this seed and size from data and tokenizers equal to
    this build's (the bases are checked after they are trained: ``copy_shipped_qe``)."""
    source = shipped / "source.json"
    if not source.is_file():
        return None
    recorded = json.loads(source.read_text())
    files = hash_tree(world)
    data = {k: v for k, v in files.items() if k.startswith(("tokenizers/", "data/"))}
    if recorded.get("seed") != seed or recorded.get("size") != size or recorded.get("data_files") != data:
        log.info("the shipped QEs in %s were built from other inputs: building them (several minutes)", shipped)
        return None
    return shipped


def shipped_models(qe_dir: Path) -> list[str]:
    """The QE model directories in ``qe_dir``: the three of every world, and the weaker kiwis."""
    return [d.name for d in sorted(Path(qe_dir).iterdir()) if (d / "hparams.yaml").is_file()]


# What of a QE directory is shipped: its weights and settings; the encoder's tokenizer is the world's
# own (tokenizers/xlmr) and is attached again on copy.
SHIPPED_FILES = ("hparams.yaml", "checkpoints/model.ckpt", "encoder/config.json")


def copy_shipped_qe(shipped: Path, world: Path) -> dict:
    """Copy the shipped QEs into ``world/qe`` with the world's QE tokenizer, saved again so that
    their hparams name this world's paths."""
    from transformers import XLMRobertaConfig, XLMRobertaTokenizerFast

    from qeebm.qe.models import load_qe, save_qe

    recorded = json.loads((shipped / "source.json").read_text())
    if recorded["inputs_digest"] != qe_inputs_digest(world):
        if "qe_bases_note" not in recorded:
            raise QeebmError(f"{shipped}: the base translators of this build differ from those the shipped QEs' data "
                             "came from; rebuild with `qeebm tinyworld build DIR --qe build` (or `qeebm tinyworld build-qe`)")
        log.info("shipped QEs: %s", recorded["qe_bases_note"])
    qe_dir = world / "qe"
    for name in shipped_models(shipped):
        staging = qe_dir / f"{name}.shipped"
        for rel in SHIPPED_FILES:
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(shipped / name / rel, staging / rel)
        tok = XLMRobertaTokenizerFast.from_pretrained(str(world / "tokenizers" / "xlmr"))
        tok.model_max_length = XLMRobertaConfig.from_pretrained(str(staging / "encoder")).max_position_embeddings - 2
        tok.save_pretrained(staging / "encoder")
        save_qe(load_qe(str(staging)), qe_dir / name)
        shutil.rmtree(staging)
    with gzip.open(shipped / "heldout.tsv.gz", "rb") as src, open(qe_dir / "heldout.tsv", "wb") as dst:
        shutil.copyfileobj(src, dst)
    shutil.copy(shipped / "qe_report.json", qe_dir / "qe_report.json")
    return json.loads((shipped / "qe_report.json").read_text())


def copy_shipped_bases(shipped: Path, world: Path) -> dict:
    """Copy the shipped base translators into ``world``; returns their recorded test metrics.
    Trained weights are shipped because they are bitwise reproducible only on the same kind of CPU
    (another matrix kernel rounds differently), and the QEs' data came from these very bases."""
    recorded = json.loads((shipped / "source.json").read_text())
    for family in FAMILIES:
        shutil.copytree(shipped / "bases" / f"{family}-base", world / f"{family}-base")
    got = {k: v for k, v in hash_tree(world).items() if k.startswith(BASE_PREFIXES)}
    if got != recorded["base_files"]:
        raise QeebmError(f"{shipped / 'bases'}: the files differ from their digests in {shipped / 'source.json'}")
    log.info("base translators: the shipped ones (%s)", shipped / "bases")
    return recorded["base_test"]


def ship_qe(out: str | Path = SHIPPED_QE, seed: int = 0, size: str = "default", work: str | Path | None = None) -> Path:
    """``qeebm tinyworld build-qe``: build a world with its QEs trained (``qe="build"``; in ``work``,
    else a temporary directory) and ``export_qe`` them to ``out``."""

    with tempfile.TemporaryDirectory() as tmp:
        world = build(Path(work) if work else Path(tmp) / "world", seed=seed, size=size, force=True, qe="build")
        return export_qe(world, out)


def export_qe(world: str | Path, out: str | Path) -> Path:
    """Keep a built world's QEs (their weights and settings), their held-out rows and report, its
    base translators, and the digests of their inputs (``source.json``) in ``out``, replaced as a
    whole."""
    world, out = Path(world), Path(out)
    manifest = json.loads((world / "manifest.json").read_text())
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    for name in shipped_models(world / "qe"):
        for rel in SHIPPED_FILES:
            (staging / name / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(world / "qe" / name / rel, staging / name / rel)
    # Compressed: the held-out rows are the largest file (about 3 MB as text).
    with open(world / "qe" / "heldout.tsv", "rb") as src, gzip.GzipFile(staging / "heldout.tsv.gz", "wb", mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    shutil.copy(world / "qe" / "qe_report.json", staging / "qe_report.json")
    for family in FAMILIES:
        shutil.copytree(world / f"{family}-base", staging / "bases" / f"{family}-base")
    files = manifest["files"]
    build_log = json.loads((world / "build_log.json").read_text())
    source = {"seed": manifest["seed"], "size": manifest["size"], "code": build_log.get("code", code_version()),
              "inputs_digest": qe_inputs_digest(world),
              "data_files": {k: v for k, v in files.items() if k.startswith(("tokenizers/", "data/"))},
              "qe_files": {k: v for k, v in files.items() if k.startswith("qe/")},
              "base_files": {k: v for k, v in files.items() if k.startswith(BASE_PREFIXES)},
              "base_test": manifest["base_test"]}
    if "top_range_code" in build_log:
        source["top_range_code"] = build_log["top_range_code"]
    (staging / "source.json").write_text(json.dumps(source, indent=2, sort_keys=True) + "\n")
    # The demo's shipped SFT plateau (qeebm/experiments/demo.py) lives here too and is not the QEs' to replace.
    if (out / "plateau").is_dir():
        shutil.copytree(out / "plateau", staging / "plateau")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


