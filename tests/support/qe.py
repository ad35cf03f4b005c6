"""Session-cached tiny quality estimators for any test: `from support.qe import kiwi_dir, load_tiny`.

Everything is built once per test process in one temporary directory (removed at exit). Models
returned by `load_tiny` are shared: a test that trains or edits one must `copy.deepcopy` it or
call `fresh(kind)`.
"""

from __future__ import annotations

import atexit
import functools
import os
import random
import shutil
import tempfile
from pathlib import Path

from qeebm.data.corpus import write_lines
from qeebm.qe.tiny import build_tiny_kiwi

from support.runs import make_config, write_tiny_world
from support.tiny import tiny_texts
from support.tiny import tokenizer_dir as translator_tokenizer_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SYLLABLES = ["ka", "to", "mi", "ra", "nu", "sel", "bor", "fa", "qui", "zen", "lo", "pa", "dar", "vi",
             "mo", "tes", "gu", "lin", "ef", "yo"]


@functools.lru_cache(maxsize=None)
def root() -> Path:
    path = Path(tempfile.mkdtemp(prefix="qeebm-qe-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def sentence(rng: random.Random, lo: int = 1, hi: int = 12) -> str:
    return " ".join("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
                    for _ in range(rng.randint(lo, hi)))


def toy_triples(n: int, seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    """(src, mt, ref) lists of syllable sentences, mt a noisy copy of ref."""
    rng = random.Random(seed)
    src, mt, ref = [], [], []
    for _ in range(n):
        r = sentence(rng)
        words = r.split()
        kept = [w if rng.random() > 0.3 else sentence(rng, 1, 1) for w in words]
        src.append(sentence(rng))
        ref.append(r)
        mt.append(" ".join(kept))
    return src, mt, ref


@functools.lru_cache(maxsize=None)
def tokenizer_dir() -> Path:
    from qeebm.tinyworld.tokenizers import build_xlmr_tokenizer, train_sentencepiece

    rng = random.Random(0)
    texts = [sentence(rng) for _ in range(2000)]
    sp = train_sentencepiece(texts, root() / "sp" / "sp.model", vocab_size=200, seed=0)
    out = root() / "xlmr_tok"
    build_xlmr_tokenizer(sp, out)
    return out


@functools.lru_cache(maxsize=None)
def model_dir(kind: str = "kiwi") -> Path:
    from qeebm.qe import tiny

    builder = {"kiwi": tiny.build_tiny_kiwi, "comet": tiny.build_tiny_comet,
               "xcomet": tiny.build_tiny_xcomet}[kind]
    return builder(root() / f"tiny_{kind}", tokenizer_dir())


def kiwi_dir() -> Path:
    return model_dir("kiwi")


def comet_dir() -> Path:
    return model_dir("comet")


def fresh(kind: str = "kiwi"):
    from qeebm.qe.models import load_qe

    return load_qe(str(model_dir(kind)))


@functools.lru_cache(maxsize=None)
def load_tiny(kind: str = "kiwi"):
    """The shared (do not modify) tiny model of this kind, in eval mode."""
    return fresh(kind)


def predict(model, src, mt, ref=None, batch_size: int = 16) -> list[float]:
    """comet's own scores (Lightning predict on CPU), the reference every fast path must match."""
    samples = [{"src": s, "mt": m} for s, m in zip(src, mt)]
    if ref is not None:
        for d, r in zip(samples, ref):
            d["ref"] = r
    return list(model.predict(samples, batch_size=batch_size, gpus=0, progress_bar=False).scores)


def toy_quality_triples(n: int, seed: int = 0) -> list[tuple[str, str, str, float]]:
    """(src, mt, ref, chrF++/100) where the "language pair" is a fixed word cipher: ref is the
    word-by-word image of src, mt a corruption of ref (drops, substitutions, swaps, truncation,
    source copies, repeats), so quality is learnable from (src, mt) alone, as QE needs."""
    from sacrebleu.metrics import CHRF

    chrf = CHRF(word_order=2)
    rng = random.Random(seed)
    word_rng = random.Random(1234)
    vocab = sorted({"".join(word_rng.choice(SYLLABLES) for _ in range(1 + i % 3)) for i in range(300)})
    cipher = {w: vocab[(i * 7 + 3) % len(vocab)] for i, w in enumerate(vocab)}
    out = []
    for _ in range(n):
        words = [rng.choice(vocab) for _ in range(rng.randint(2, 14))]
        src, ref = " ".join(words), " ".join(cipher[w] for w in words)
        hyp = [cipher[w] for w in words]
        kind = rng.choice(["clean", "drop", "sub", "swap", "trunc", "copy", "repeat", "mix"])
        if kind in ("drop", "mix"):
            hyp = [w for w in hyp if rng.random() > 0.3] or hyp[:1]
        if kind in ("sub", "mix"):
            hyp = [rng.choice(vocab) if rng.random() < 0.3 else w for w in hyp]
        if kind == "swap" and len(hyp) > 2:
            i = rng.randrange(len(hyp) - 1)
            hyp[i], hyp[i + 1] = hyp[i + 1], hyp[i]
        if kind == "trunc":
            hyp = hyp[: max(1, len(hyp) // 2)]
        if kind == "copy":
            hyp = list(words)
        if kind == "repeat":
            hyp = hyp + hyp[-3:] * 2
        mt = " ".join(hyp)
        out.append((src, mt, ref, chrf.sentence_score(mt, [ref]).score / 100))
    return out


@functools.lru_cache(maxsize=None)
def world_pairs(n: int = 1200, seed: int = 0):
    from qeebm.tinyworld.language import generate_pairs

    return generate_pairs(n, seed)


@functools.lru_cache(maxsize=None)
def world_tokenizer_dir() -> Path:
    """An XLM-R-style tokenizer over the tiny-world language pair (both sides)."""
    from qeebm.tinyworld.tokenizers import build_xlmr_tokenizer, train_sentencepiece

    texts = [t for p in world_pairs() for t in (p.src, p.tgt)]
    sp = train_sentencepiece(texts, root() / "sp-world" / "sp.model", vocab_size=1000, seed=0)
    out = root() / "xlmr_world_tok"
    build_xlmr_tokenizer(sp, out)
    return out


def world_quality_triples(pairs, seed: int = 0, per_source: int = 3):
    """(src, mt, ref, chrF++/100) from the tiny-world language: corrupted references plus, for
    some sources, the reference itself (the build adds base-translator outputs on top)."""
    from sacrebleu.metrics import CHRF

    from qeebm.tinyworld.language import CORRUPTIONS, corrupt

    chrf = CHRF(word_order=2)
    rng = random.Random(seed)
    out = []
    for p in pairs:
        mts = [corrupt(p, rng.choice(CORRUPTIONS), rng) for _ in range(per_source)]
        if rng.random() < 0.3:
            mts.append(p.tgt)
        for mt in dict.fromkeys(mts):
            out.append((p.src, mt, p.tgt, chrf.sentence_score(mt, [p.tgt]).score / 100))
    return out


class LengthScorer:
    """Longer translations score higher: distinct, easy to recompute scores."""

    kind = "kiwi"

    def score(self, src, mt):
        return [float(len(m)) for m in mt]


# Few, short samples: the tests need the paths to run, not good translations.
SMALL = ["qe_ebm.sampling.num_samples=2", "qe_ebm.sampling.max_new_tokens=8", "data.dev.path="]
# Pure energy: alpha 0, beta 1 from the first step.
ENERGY_ONLY = ["qe_ebm.ce_weight=0.0", "qe_ebm.energy_weight=1.0", "qe_ebm.energy_ramp_steps=0"]


def write_kiwi_world(root: Path) -> dict:
    """A tiny translator's world (support.runs.write_tiny_world), source-only sentences and a tiny
    random CometKiwi over the XLM-R-style tokenizer: what the qe-ebm runs read."""
    base = write_tiny_world(root)
    write_lines(root / "mono.txt", tiny_texts(80, seed=5)[0::2])
    kiwi = build_tiny_kiwi(root / "kiwi", translator_tokenizer_dir("xlmr"))
    return {"base": base, "mono": root / "mono.txt", "kiwi": kiwi}


def qe_config(world, run_dir: Path, *overrides: str):
    """A qe-ebm run's config on ``write_kiwi_world``'s world, few and short samples."""
    return make_config(world["base"], run_dir, "method=qe-ebm", f"data.mono.path={world['mono']}",
                       f"qe.path={world['kiwi']}", *SMALL, *overrides)
