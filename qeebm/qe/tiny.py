"""Tiny COMET-family models for the offline tiny world and for tests.

Each builder makes the real comet class (UnifiedMetric for CometKiwi, RegressionMetric for COMET,
XCOMETMetric for XCOMET) on top of a randomly initialised tiny XLM-R encoder, and saves it with
`save_qe`, so that `comet.load_from_checkpoint`, `comet-score` and `load_qe` all read it offline.

Hyperparameters follow the public hparams.yaml of Unbabel/wmt22-cometkiwi-da where they change
the computation: class unified_metric, input_segments [mt, src] (input `<s> mt </s></s> src </s>`),
sent_layer mix with layer_transformation sparsemax and layer_norm false, pooling on the first
token (hardcoded in UnifiedMetric), estimator hidden_sizes [3072, 1024] on a 1024-wide encoder
(here scaled to [3*hidden, hidden]), activations Tanh, final_activation null (no sigmoid), dropout
0.1, word_level_training false, keep_embeddings_frozen true, nr_frozen_epochs 0.3,
learning_rate 1.5e-05, encoder_learning_rate 1e-06, layerwise_decay 0.95.
The reference-based tiny COMET shares these settings (sparsemax layer mix without layer norm, a
[3h, h] Tanh head) and adds RegressionMetric's avg pooling over src, mt and ref, each encoded
separately; wmt22-comet-da's own hparams.yaml was not in the sources searched, so its values are
not checked here.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch

from qeebm.qe.models import ENCODER_SUBDIR, save_qe
from qeebm.qe.scoring import QEScorer
from qeebm.qe.train import torch_threads, train_qe

log = logging.getLogger(__name__)

MAX_POSITIONS = 258  # XLM-R keeps 2 positions for padding offset: 256 usable tokens
# XLM-R's 0.02 init leaves a random 2-layer encoder almost input-blind (score spread ~5e-4 over
# varied pairs); 0.1 gives a spread of ~1e-2, enough for parity and gradient tests to mean something.
INIT_STD = 0.1


def write_encoder(out_dir, tokenizer_dir, *, hidden=64, layers=2, heads=4, ffn=128,
                  init_std=INIT_STD, vocab_size: int | None = None,
                  max_positions: int = MAX_POSITIONS) -> Path:
    """Write `<out_dir>/encoder/` (XLM-R config + tokenizer, no weights); vocab defaults to the
    tokenizer's size. A larger vocab_size only adds never-used embedding rows (for benchmarks)."""
    from transformers import XLMRobertaConfig, XLMRobertaTokenizerFast

    enc = Path(out_dir).resolve() / ENCODER_SUBDIR
    tok = XLMRobertaTokenizerFast.from_pretrained(str(tokenizer_dir))
    tok.model_max_length = max_positions - 2
    tok.save_pretrained(enc)
    XLMRobertaConfig(
        vocab_size=vocab_size or len(tok), hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=max_positions,
        type_vocab_size=1, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, layer_norm_eps=1e-5, initializer_range=init_std,
    ).save_pretrained(enc)
    return enc


def new_qe(kind: str, encoder_dir, *, seed: int = 0):
    """A randomly initialised comet model of `kind` ("kiwi" | "comet" | "xcomet") on the encoder
    described by `encoder_dir` (from `write_encoder`), in eval mode, not saved."""
    from comet.models import RegressionMetric, UnifiedMetric, XCOMETMetric
    from transformers import XLMRobertaConfig

    cfg = XLMRobertaConfig.from_pretrained(str(encoder_dir))
    hidden, layers = cfg.hidden_size, cfg.num_hidden_layers
    common = dict(
        encoder_model="XLM-RoBERTa", pretrained_model=str(Path(encoder_dir).resolve()),
        load_pretrained_weights=False, local_files_only=True, layer_transformation="sparsemax",
        layer_norm=False, hidden_sizes=[3 * hidden, hidden], activations="Tanh",
        final_activation=None, dropout=0.1, keep_embeddings_frozen=True, nr_frozen_epochs=0.3,
        optimizer="AdamW", learning_rate=1.5e-05, encoder_learning_rate=1.0e-06,
        layerwise_decay=0.95, batch_size=16,
    )
    if kind == "kiwi":
        cls, extra = UnifiedMetric, dict(sent_layer="mix", word_layer=layers,
                                         input_segments=["mt", "src"], word_level_training=False)
    elif kind == "comet":
        cls, extra = RegressionMetric, dict(layer="mix", pool="avg")
    elif kind == "xcomet":
        cls, extra = XCOMETMetric, dict(sent_layer="mix", word_layer=layers, word_level_training=True,
                                        error_labels=["minor", "major", "critical"])
    else:
        raise ValueError(f"unknown QE kind {kind!r}")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = cls(**common, **extra)
    return model.eval()


def _build(kind, out_dir, tokenizer_dir, hidden, layers, heads, ffn, seed, init_std) -> Path:
    enc = write_encoder(out_dir, tokenizer_dir, hidden=hidden, layers=layers, heads=heads, ffn=ffn,
                        init_std=init_std)
    return save_qe(new_qe(kind, enc, seed=seed), out_dir)


def build_tiny_kiwi(out_dir, tokenizer_dir, *, hidden=64, layers=2, heads=4, ffn=128, seed=0,
                    init_std=INIT_STD) -> Path:
    """A random CometKiwi-shaped UnifiedMetric (input [mt, src]) saved in comet's format."""
    return _build("kiwi", out_dir, tokenizer_dir, hidden, layers, heads, ffn, seed, init_std)


def build_tiny_comet(out_dir, tokenizer_dir, *, hidden=64, layers=2, heads=4, ffn=128, seed=0,
                     init_std=INIT_STD) -> Path:
    """A random reference-based COMET (RegressionMetric, avg pooling) saved in comet's format."""
    return _build("comet", out_dir, tokenizer_dir, hidden, layers, heads, ffn, seed, init_std)


def build_tiny_xcomet(out_dir, tokenizer_dir, *, hidden=64, layers=2, heads=4, ffn=128, seed=0,
                      init_std=INIT_STD) -> Path:
    """A random XCOMETMetric (word-level tags + three segment combos) on a tiny XLM-R encoder."""
    return _build("xcomet", out_dir, tokenizer_dir, hidden, layers, heads, ffn, seed, init_std)


# ------------------------------------------------------------------ correlations (no scipy needed)
def pearson(x, y) -> float:
    """Pearson's r; nan when either side is constant."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.size < 2:
        raise ValueError("pearson needs two sequences of the same length >= 2")
    dx, dy = x - x.mean(), y - y.mean()
    den = math.sqrt(float(dx @ dx) * float(dy @ dy))
    return float(dx @ dy) / den if den > 0 else float("nan")


def rankdata(x) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank (as scipy.stats.rankdata's default)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    sx = x[order]
    start = 0
    for end in range(1, len(x) + 1):
        if end == len(x) or sx[end] != sx[start]:
            ranks[order[start:end]] = (start + end + 1) / 2  # mean of ranks start+1 .. end
            start = end
    return ranks


def spearman(x, y) -> float:
    """Spearman's rho: Pearson's r of the tie-averaged ranks."""
    return pearson(rankdata(x), rankdata(y))


# ------------------------------------------------------------------ the tiny world's three QEs
# Shapes, data and schedules of the three estimators. The judge differs in seed, shape AND data (its
# own shard of judged sources), so its errors are not the trained-on QE's errors (the paper's
# reward-hacking check needs an independent QE). ``data`` names the rows it learns from.
# Epochs: the reference-based COMET fits in one; the reference-free ones gain from a third (the
# default world, measured with the build's own report).
TINY_QES = {
    "kiwi": dict(kind="kiwi", hidden=64, layers=2, heads=4, ffn=128, seed_offset=0, data="qe", train={"epochs": 3}),
    "comet": dict(kind="comet", hidden=64, layers=2, heads=4, ffn=128, seed_offset=1, data="qe", train={"epochs": 1}),
    "judge": dict(kind="kiwi", hidden=48, layers=2, heads=4, ffn=96, seed_offset=7919, data="judge",
                  train={"epochs": 3}),
}
# Defaults for all three (train_qe keywords). lr: these encoders start from random weights, so far
# above comet's fine-tuning rates; for the same reason the embeddings are trained too.
FIT = dict(mode="full", epochs=2, lr=1e-3, batch_size=32, train_embeddings=True, schedule="linear")
FIT_THREADS = 1  # tiny matrices: a second thread gains little and collapses when cores are shared


def _unpack(triples):
    rows = [(t["src"], t["mt"], t.get("ref"), t["score"]) if isinstance(t, dict) else tuple(t)
            for t in triples]
    if not rows or any(len(r) != 4 for r in rows):
        raise ValueError("triples must be (src, mt, ref, quality) tuples or dicts with those keys")
    src, mt, ref, q = (list(c) for c in zip(*rows))
    return src, mt, ref, [float(v) for v in q]


def fit_tiny_qe(name: str, out_dir, tokenizer_dir, train_triples, seed: int = 0, *, fit: dict | None = None,
                spec: dict | None = None) -> dict:
    """Train the tiny world's QE ``name`` (a key of TINY_QES, or any name with ``spec``) on
    ``train_triples`` ((src, mt, ref, quality) tuples or dicts; a reference-free model never sees
    ref) and save it in comet's format in ``out_dir``. ``fit`` overrides FIT and the model's own
    settings (train_qe keywords, plus num_threads). Returns its path, kind, seed, shape, number of
    training rows and seconds."""

    spec = dict(spec or TINY_QES[name])
    settings = {**FIT, **spec.get("train", {}), **(fit or {})}
    threads = settings.pop("num_threads", FIT_THREADS)
    out = Path(out_dir).resolve()
    start = time.perf_counter()
    src, mt, ref, q = _unpack(train_triples)
    model_seed = seed + spec["seed_offset"]
    with torch_threads(threads):
        enc = write_encoder(out, tokenizer_dir, hidden=spec["hidden"], layers=spec["layers"],
                            heads=spec["heads"], ffn=spec["ffn"])
        model = new_qe(spec["kind"], enc, seed=model_seed)
        train_qe(model, src, mt, q, ref=ref if spec["kind"] == "comet" else None, seed=model_seed, **settings)
        save_qe(model, out)
    return {"path": str(out), "kind": spec["kind"], "seed": model_seed,
            "shape": {k: spec[k] for k in ("hidden", "layers", "heads", "ffn")},
            "train_examples": len(src), "seconds": round(time.perf_counter() - start, 1)}


def heldout_correlation(model_dir, heldout_triples) -> dict:
    """Pearson / Spearman of the saved QE's scores (through the files later runs load) with the
    true quality of held-out (src, mt, ref, quality) rows; the reference is used by COMET only."""
    from qeebm.qe.models import load_qe, qe_kind

    model = load_qe(str(model_dir))
    src, mt, ref, q = _unpack(heldout_triples)
    scores = QEScorer(model, batch_size=128).score(src, mt, ref if qe_kind(model) == "comet" else None)
    return {"pearson": pearson(scores, q), "spearman": spearman(scores, q), "heldout_examples": len(q)}


def fit_tiny_quality_estimators(out_dir, tokenizer_dir, train_triples, heldout_triples, seed: int = 0,
                                *, fit: dict | None = None) -> dict:
    """Train the tiny world's QEs one after the other and save each in comet's format under out_dir:

    * kiwi/  - the CometKiwi stand-in (reference-free, input [mt, src]) that QE-EBM trains against;
    * comet/ - a reference-based COMET (RegressionMetric) for evaluation;
    * judge/ - an independently trained reference-free QE (other seed, size and data), evaluation only.

    ``train_triples``: the rows every model learns from, or a dict of them by TINY_QES' ``data``
    names ("qe", "judge"). Returns, per model, ``fit_tiny_qe``'s record and its correlations on
    ``heldout_triples`` (``heldout_correlation``); out_dir/qe_report.json gets the same without the
    timings. (The tiny-world build trains them in two processes instead, tinyworld/build.py.)"""
    out = Path(out_dir).resolve()
    report = {}
    for name, spec in TINY_QES.items():
        rows = train_triples[spec["data"]] if isinstance(train_triples, dict) else train_triples
        report[name] = fit_tiny_qe(name, out / name, tokenizer_dir, rows, seed, fit=fit)
        report[name] |= heldout_correlation(out / name, heldout_triples)
        log.info("tiny QE %s: pearson %.3f spearman %.3f on %d held-out rows (%.1fs)", name,
                 report[name]["pearson"], report[name]["spearman"], report[name]["heldout_examples"],
                 report[name]["seconds"])
    stable = {k: {f: v for f, v in r.items() if f != "seconds"} for k, r in report.items()}
    (out / "qe_report.json").write_text(json.dumps(stable, indent=2, sort_keys=True) + "\n")
    return report
