"""The top of the quality range: judged translations of converged systems, and the QEs that learn them.

The first tiny QEs (``kiwi-lowrange``, ``judge-lowrange``) learnt from ten systems that are all far weaker than
a translator trained to its plateau: they rank a converged SFT system below QE-trained systems many
BLEU points worse, so a method started from SFT's plateau and trained against them is pushed away
from quality by construction. A real CometKiwi learns from human judgements of strong systems too.
This stage gives the tiny world's QEs that range (``build``, after the first QEs):

1. **converged systems**, per translator family: the base fine-tuned on the first ``pairs`` pairs of
   the QE split (sentences the task never sees) to its plateau, with checkpoints over its last third
   (``checkpoints``, evenly spaced; the first judged systems cover the range below);
2. **QE-trained systems** started from that plateau against the first Kiwi (QE-EBM static and
   REINFORCE, ``hacked_steps`` each, sampling the rest of the QE split's sources): they show the QE
   the outputs an optimiser finds when it follows it;
3. their outputs on the QE split past the fine-tuned pairs and on the judge's shard, judged like
   the first systems' (``judged.judged_rows``: the same precision-aware quality, corruptions and
   degenerations);
4. ``kiwi``: the first Kiwi (kept as ``kiwi-lowrange``) trained further on the QE split's rows
   (``top_range["fit"]``). Continuing from it, rather than from scratch on both sets, needs nothing
   but a built world: the stage runs on a world whose first QEs were copied from
   ``data/tinyworld-qe`` (``qeebm tinyworld build-top DIR``) as it runs inside a full build;
5. ``judge``: the held-out judge, of its own seed, size and data shard and of **another kind** than
   the Kiwi: a reference-based tiny COMET (``JUDGE``) trained from random weights on the judge
   shard's rows. The first judge (kept as ``judge-lowrange``) was a reference-free model like the Kiwi, and
   one trained further on these rows still scored a 600-step QE-trained system above a converged SFT
   system 13 BLEU better: a judge of the Kiwi's own kind shares its blind spots, while one that reads
   the reference sees what the Kiwi cannot (as XCOMET, reference-based, checks a CometKiwi-trained
   system on a real pair).

The held-out measurement gains the converged systems' samples on the held-out sources
(``heldout_samples``), so a QE's correlation at the top of the range is measured where the methods
will use it (``top_range_report``).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from qeebm.config import CorpusConfig, ModelConfig, load_config
from qeebm.data.corpus import read_corpus, write_lines, write_tsv
from qeebm.qe.heldout import write_judged
from qeebm.qe.scoring import QEScorer
from qeebm.qe.tiny import FIT, pearson, spearman
from qeebm.qe.train import torch_threads, train_qe
from qeebm.tinyworld.judged import (
    Judged,
    degenerate_probes,
    heldout_samples,
    judged_rows,
    system_outputs,
    within_source,
)
from qeebm.tinyworld.language import Pair
from qeebm.tinyworld.world import (
    SIZES,
    WithReferences,
    code_version,
    fit_qe_worker,
    stage_pool,
    translator_config,
    write_manifest,
)
from qeebm.training.checkpoint import load_model, step_dir
from qeebm.training.loop import train
from qeebm.translation.translator import Translator
from qeebm.utils import resources
from qeebm.utils.langcodes import FAMILIES

log = logging.getLogger("qeebm.tinyworld")

# The first QEs keep these names beside the ones trained on the whole range.
FIRST = {"kiwi": "kiwi-lowrange", "judge": "judge-lowrange"}
# The held-out judge (``fit_tiny_qe``'s spec): reference-based, smaller than the world's COMET and of
# another seed; trained with the world's first QEs' settings (``WorldSize.qe_fit``).
JUDGE = dict(kind="comet", hidden=48, layers=2, heads=4, ffn=96, seed_offset=7919, data="judge", train={"epochs": 3})


def top_range_systems(world: Path, family: str, seed: int, spec, kiwi: Path) -> dict:
    """name -> Translator: the plateau run's checkpoints and the QE-trained systems from its end."""

    top = spec.top_range
    runs = world / "runs"
    qe = read_corpus(CorpusConfig(path=str(world / "data" / "qe.tsv")), "qe", need_target=True)
    n = top["pairs"]
    pairs, pool = runs / f"{family}-top-sft.tsv", runs / f"{family}-top-pool.txt"
    write_tsv(pairs, qe.src[:n], qe.tgt[:n])
    write_lines(pool, qe.src[n:])
    marks = top["checkpoints"]
    steps = marks[-1]
    # Saved every `every` steps, the last `keep` saves kept: exactly the checkpoints listed.
    every = min((b - a for a, b in zip(marks, marks[1:])), default=steps)
    keep = (steps - marks[0]) // every + 1
    plateau = runs / f"{family}-top-sft"
    cfg = translator_config(world, seed, spec, world / f"{family}-base", plateau, train=pairs,
                            dev=world / "data" / "pretrain_dev.tsv", steps=steps, lr=top["lr"],
                            warmup=max(steps // 60, 1), save_every=every, keep_last=keep)
    cfg.eval.every = 0  # the plateau is the schedule's end: nothing is selected on the QE split's own pairs
    cfg.optim.batch_size = 16
    if not (plateau / "final").is_dir():
        train(cfg)
    systems = {}
    for s in top["checkpoints"]:
        tr = Translator.load(ModelConfig(name_or_path=str(world / f"{family}-base")))
        load_model(step_dir(plateau / "checkpoints", s), tr.model)
        systems[f"{family}-plateau@{s}"] = tr
    # QE-trained systems from the plateau, against the first Kiwi, with the tiny recipes' methods.
    recipes = resources.CONFIGS
    for name, recipe, knob in (("qe-ebm", "tiny_qe-ebm-static.yaml", top["qe_ebm"]),
                               ("reinforce", "tiny_reinforce.yaml", top["reinforce"])):
        run = runs / f"{family}-top-{name}"
        hsteps = top["hacked_steps"]
        overrides = [f"seed={seed}", f"model.name_or_path={plateau / 'final'}", f"data.train.path={pairs}",
                     "data.dev.path=", f"data.mono.path={pool}", f"qe.path={kiwi}", f"optim.lr={top['hacked_lr']}",
                     f"optim.max_steps={hsteps}", f"optim.warmup_steps={max(hsteps // 10, 1)}", "eval.every=0",
                     "eval.at_start=false", f"output.run_dir={run}", f"output.save_every={hsteps}",
                     "output.resume=false", "logging.report_to=[]", "logging.progress_bar=false", *knob]
        if not (run / "final").is_dir():
            train(load_config(recipes / recipe, overrides))
        systems[f"{family}-{name}"] = Translator.load(ModelConfig(name_or_path=str(run / "final")))
    for tr in systems.values():
        tr.model.eval()
    return systems


def top_range_outputs(world: str, family: str, seed: int, spec, kiwi: str) -> dict:
    """A worker's share (one family): its top-range systems' translations of the judged sentences and
    their held-out samples (``build.judged_outputs``' layout)."""

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s top/{family} %(name)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    world_, top = Path(world), spec.top_range
    t = time.perf_counter()
    systems = top_range_systems(world_, family, seed, spec, Path(kiwi))
    read = lambda name: read_corpus(CorpusConfig(path=str(world_ / "data" / f"{name}.tsv")), name, need_target=True)  # noqa: E731
    out = {}
    family_seed = seed + 5003 + FAMILIES.index(family) * 101
    for name in ("qe", "judge"):
        corpus = read(name)
        src = corpus.src[top["pairs"]:] if name == "qe" else corpus.src
        out[f"outputs_{name}"] = system_outputs(systems, src, top["share"], family_seed + len(out), k=top["k"])
    held = read("qe_heldout")
    pairs = [Pair(s, t) for s, t in zip(held.src, held.tgt)]
    last = f"{family}-plateau@{top['checkpoints'][-1]}"
    chosen = {name: systems[name] for name in (last, f"{family}-qe-ebm", f"{family}-reinforce")}
    out["heldout_samples"] = [r.__dict__ for r in heldout_samples(chosen, pairs, spec.heldout_k, family_seed)]
    out["seconds"] = time.perf_counter() - t
    return out


def train_top_range_qes(world: Path, seed: int, spec) -> dict:
    """Stages 1-5 on a built world holding the first QEs (``FIRST``): every family's top-range outputs
    (a process each), judged; ``kiwi`` trained further from the first one on them and ``judge``
    trained on its shard's (two processes). Returns the fitted records, the judged row counts and the
    held-out samples."""

    top = spec.top_range
    qe_dir = world / "qe"
    families = top["families"]
    with stage_pool(spec, len(families)) as pool:
        futures = {f: pool.submit(top_range_outputs, str(world), f, seed, spec, str(qe_dir / FIRST["kiwi"]))
                   for f in families}
        workers = {f: future.result() for f, future in futures.items()}
    rows = {}
    for name in ("qe", "judge"):
        corpus = read_corpus(CorpusConfig(path=str(world / "data" / f"{name}.tsv")), name, need_target=True)
        pairs = [Pair(x, y) for x, y in zip(corpus.src, corpus.tgt)]
        pairs = pairs[top["pairs"]:] if name == "qe" else pairs
        outputs = [sum((workers[f][f"outputs_{name}"][i] for f in families), []) for i in range(len(pairs))]
        rows[name] = judged_rows(pairs, outputs, seed + 11 + (0 if name == "qe" else 1))
        write_judged(qe_dir / f"train_{name}_top.tsv", [r.row() for r in rows[name]], origins=[r.origin for r in rows[name]])
    samples = [Judged(**r) for f in families for r in workers[f]["heldout_samples"]]
    log.info("top-range judged data: %s rows; %d held-out samples",
             ", ".join(f"{k} {len(v)}" for k, v in rows.items()), len(samples))
    with stage_pool(spec, 2) as pool:
        kiwi = pool.submit(_continue_worker, str(qe_dir / FIRST["kiwi"]), str(qe_dir / "kiwi"),
                           [r.row() for r in rows["qe"]], seed, top["fit"])
        judge = pool.submit(fit_qe_worker, str(qe_dir), str(world / "tokenizers" / "xlmr"),
                            [("judge", [r.row() for r in rows["judge"]])], seed, spec.qe_fit, {"judge": JUDGE})
        fitted = {"kiwi": kiwi.result(), "judge": judge.result()["judge"]}
    return {"fitted": fitted, "samples": samples, "rows": {k: len(v) for k, v in rows.items()},
            "seconds": {f: round(w["seconds"], 1) for f, w in workers.items()}}


def _continue_worker(first: str, out: str, rows: list, seed: int, fit: dict) -> dict:
    """The QE at ``first`` trained further on ``rows`` and saved to ``out`` (comet's format)."""
    from qeebm.qe.models import load_qe, save_qe

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s qe %(name)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    start = time.perf_counter()
    settings = {**FIT, **fit}
    threads = settings.pop("num_threads", 1)
    src, mt, _, q = (list(c) for c in zip(*rows))
    with torch_threads(threads), torch.random.fork_rng(devices=[]):
        model = load_qe(first)
        train_qe(model, src, mt, [float(v) for v in q], seed=seed, **settings)
        save_qe(model, out)
    return {"path": out, "continued_from": Path(first).name, "train_examples": len(src),
            "seconds": round(time.perf_counter() - start, 1)}


def top_range_report(scorer, samples, top_fraction_of: str) -> dict:
    """A QE on the converged systems' held-out outputs (``samples``: ``judged.Judged`` rows): Pearson
    and within-source Pearson with the true quality over all of them, and over the top of the range,
    the outputs whose sentence chrF++ is at least the median of the plateau system's
    (``top_fraction_of``: its name prefix) outputs."""
    import sacrebleu


    chrf = sacrebleu.metrics.CHRF(word_order=2)
    c = np.array([chrf.sentence_score(r.mt, [r.ref]).score for r in samples])
    median = float(np.median([ci for ci, r in zip(c, samples) if r.origin.startswith(top_fraction_of)]))
    s = np.array(scorer.score([r.src for r in samples], [r.mt for r in samples]))
    q = np.array([r.score for r in samples])
    out = {"chrf_median": median}
    for part, keep in (("all", np.ones(len(samples), bool)), ("top", c >= median)):
        idx = np.nonzero(keep)[0]
        picked = [i for i in idx if samples[i].origin.endswith("/sample")]
        out[part] = {"rows": int(len(idx)), "pearson": pearson(s[idx], q[idx]),
                     "within_source_pearson": within_source(s[picked], q[picked],
                                                            [(samples[i].src, samples[i].origin) for i in picked])}
    return out


def first_qes_report(old: dict) -> dict:
    """``qe/qe_report.json``'s records before this stage adds its QEs': the first ``kiwi`` and
    ``judge`` under ``FIRST``'s names; where the stage ran before, its QEs' records are dropped (they
    are measured again) and the first ones' kept."""
    if all(first in old for first in FIRST.values()):
        return {name: record for name, record in old.items() if name not in FIRST}
    return {FIRST.get(name, name): record for name, record in old.items()}


def rename_first_qes(qe_dir: Path) -> None:
    """The first ``kiwi`` and ``judge`` keep their weights under ``FIRST``'s names."""
    for name, first in FIRST.items():
        if (qe_dir / name).is_dir() and not (qe_dir / first).is_dir():
            model_dir = qe_dir / first
            shutil.move(str(qe_dir / name), str(model_dir))
            _repoint(model_dir)


def _repoint(model_dir: Path) -> None:
    """A QE directory moved: save it again so its hparams name its own encoder directory."""
    from qeebm.qe.models import load_qe, save_qe

    save_qe(load_qe(str(model_dir)), model_dir)


def add_top_range(world: str | Path, seed: int = 0, size: str = "default", manifest: bool = True) -> dict:
    """Give a built world its top-range QEs (``qeebm tinyworld build-top``; a full build runs it after
    the first QEs): the first ``kiwi`` and ``judge`` move to ``FIRST``'s names, the new ones take
    theirs, ``qe/qe_report.json`` gains them and every QE's top-range measurement, and the manifest
    is written again (``manifest``: a build writes it itself, once everything is in place)."""


    world = Path(world)
    spec = SIZES[size]
    qe_dir = world / "qe"
    rename_first_qes(qe_dir)
    top = train_top_range_qes(world, seed, spec)
    report_path = qe_dir / "qe_report.json"
    old = json.loads(report_path.read_text())
    report = first_qes_report(old)
    for name, record in top["fitted"].items():
        first = report[FIRST[name]]
        report[name] = {k: first[k] for k in ("kind", "seed", "shape", "heldout_rows", "output_rows") if k in first}
        report[name] |= {k: v for k, v in record.items() if k not in ("path", "seconds")} | {"top_range_rows": top["rows"]}
    last = f"{spec.top_range['families'][0]}-plateau@{spec.top_range['checkpoints'][-1]}"
    measured = measure_qes(world, sorted(report), top["samples"], last, seed)
    for name, values in measured.items():
        report[name] = report[name] | values
    report_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    # The code of this stage, beside the first QEs' (``export_qe`` records both).
    build_log = world / "build_log.json"
    if build_log.is_file():
        build_log.write_text(json.dumps(json.loads(build_log.read_text()) | {"top_range_code": code_version()},
                                        indent=2) + "\n")
    if manifest:
        write_manifest(world)
    log.info("top-range QEs in %s: %s", qe_dir, ", ".join(f"{n} top within-source {m['top_range']['top']['within_source_pearson']:.3f}"
                                                         for n, m in measured.items()))
    return report | {"seconds": top["seconds"]}


def measure_qes(world: Path, names: list[str], samples: list, plateau: str, seed: int) -> dict:
    """Every QE on the same rows: Pearson with the true quality on the held-out judged rows of every
    kind (``qe/heldout.tsv``), how often it prefers the held-out reference over each degenerate
    version of it, and ``top_range_report`` on the converged systems' held-out samples."""
    held = read_corpus(CorpusConfig(path=str(world / "data" / "qe_heldout.tsv")), "qe_heldout", need_target=True)
    probes = degenerate_probes([Pair(s, t) for s, t in zip(held.src, held.tgt)], seed + 3)
    rows = _read_heldout(world / "qe" / "heldout.tsv")
    refs = {r.src: r.ref for r in rows} | {r.src: r.ref for r in samples} | dict(zip(held.src, held.tgt))
    # One thread, as in build.qe_report: the same world writes the same report whoever builds it.
    with torch_threads(1):
        return {name: _measure_qe(world / "qe" / name, rows, refs, probes, samples, plateau) for name in names}


def _measure_qe(path: Path, rows: list, refs: dict, probes: dict, samples: list, plateau: str) -> dict:
    from qeebm.qe.models import load_qe, qe_kind

    model = load_qe(str(path))
    scorer = QEScorer(model, batch_size=128)
    if qe_kind(model) == "comet":
        scorer = WithReferences(scorer, refs)
    s = scorer.score([r.src for r in rows], [r.mt for r in rows])
    q = [r.score for r in rows]
    refs_rows = [Judged(r.src, r.ref, r.ref, 1.0, "reference") for r in next(iter(probes.values()))]
    good = np.array(scorer.score([r.src for r in refs_rows], [r.mt for r in refs_rows]))
    return {"pearson": pearson(s, q), "spearman": spearman(s, q),
            "prefers_reference_over": {kind: float(np.mean(good > np.array(scorer.score(
                [r.src for r in probe], [r.mt for r in probe])))) for kind, probe in probes.items()},
            "top_range": top_range_report(scorer, samples, plateau)}


def _read_heldout(path: Path) -> list:
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    at = {c: header.index(c) for c in ("src", "mt", "ref", "score")}
    out = []
    for line in lines[1:]:
        f = line.split("\t")
        out.append(Judged(f[at["src"]], f[at["mt"]], f[at["ref"]], float(f[at["score"]]), "heldout"))
    return out
