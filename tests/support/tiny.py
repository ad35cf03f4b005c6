"""Shared builders for tests: tiny SentencePiece models, tokenizers and random translators.

Everything is built once per test session under one temporary directory (module-level cache) and
handed out as copies or read-only paths, so a test file that needs a tiny NLLB costs about a second
the first time and a directory copy after that.
"""

from __future__ import annotations

import atexit
import random
import shutil
import tempfile
from pathlib import Path

import torch

from qeebm.tinyworld.models import build_tiny_translator
from qeebm.tinyworld.tokenizers import (
    build_mbart50_tokenizer,
    build_nllb_tokenizer,
    build_xlmr_tokenizer,
    train_sentencepiece,
)

# Two different SentencePiece models, as in the real world: XLM-R/mBART-50 share one, NLLB has its own.
SHARED_SP_VOCAB, SHARED_SP_SEED = 600, 11
NLLB_SP_VOCAB, NLLB_SP_SEED = 500, 23
TINY_SIZE = dict(d_model=32, layers=2, heads=4, ffn=64, max_positions=64, dropout=0.1)

_EN = (
    "the a cat dog house river city child teacher book water tree road bird horse mother father "
    "sees walks reads finds gives likes big small red green old new quickly slowly today here there "
    "and with in on"
).split()
_MN = (
    "муур нохой байшин гол хот хүүхэд багш ном ус мод зам шувуу морь ээж аав харж алхаж уншиж "
    "олж өгч дуртай том жижиг улаан ногоон хуучин шинэ хурдан удаан өнөөдөр энд тэнд ба хамт"
).split()

# Tiny models gain nothing from intra-op threads, and on a shared 2-core machine the thread pool's
# spinning against other busy processes made these tests 3-5 times slower.
torch.set_num_threads(1)

_cache_root: Path | None = None
_cache: dict[str, Path] = {}


def _root() -> Path:
    global _cache_root
    if _cache_root is None:
        _cache_root = Path(tempfile.mkdtemp(prefix="qeebm-test-cache-"))
        atexit.register(shutil.rmtree, _cache_root, True)
    return _cache_root


def tiny_texts(n: int = 300, seed: int = 0) -> list[str]:
    """Mixed English/Cyrillic lines with digits and punctuation: the tiny-world language pair when its
    generator exists, otherwise a small word-salad of both scripts."""
    try:
        from qeebm.tinyworld.language import generate_pairs
    except ImportError:
        generate_pairs = None
    if generate_pairs is not None:
        texts: list[str] = []
        for pair in generate_pairs(max(1, n // 2), seed):
            texts.extend([pair.src, pair.tgt])
        return texts[:n]
    rng = random.Random(seed)
    punct = [".", "!", "?", ",", ":", ";", "-", "(1)", "\"", "'"]
    out = []
    for i in range(n):
        words = _EN if i % 2 == 0 else _MN
        line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 9)))
        out.append(f"{line} {rng.randint(0, 2025)}{rng.choice(punct)}")
    return out


def shared_sp_model() -> Path:
    """The SentencePiece model shared by the XLM-R and mBART-50 tokenizers."""
    if "sp_shared" not in _cache:
        _cache["sp_shared"] = train_sentencepiece(
            tiny_texts(), _root() / "sp" / "shared.model", SHARED_SP_VOCAB, SHARED_SP_SEED
        )
    return _cache["sp_shared"]


def nllb_sp_model() -> Path:
    """NLLB's own SentencePiece model (another size and seed)."""
    if "sp_nllb" not in _cache:
        _cache["sp_nllb"] = train_sentencepiece(
            tiny_texts(seed=1), _root() / "sp" / "nllb.model", NLLB_SP_VOCAB, NLLB_SP_SEED
        )
    return _cache["sp_nllb"]


def tokenizer_dir(kind: str) -> Path:
    """Cached tokenizer directory; kind: "xlmr" | "mbart" | "nllb". Treat it as read-only."""
    key = f"tok_{kind}"
    if key not in _cache:
        out = _root() / "tokenizers" / kind
        if kind == "xlmr":
            build_xlmr_tokenizer(shared_sp_model(), out)
        elif kind == "mbart":
            build_mbart50_tokenizer(shared_sp_model(), out)
        elif kind == "nllb":
            build_nllb_tokenizer(nllb_sp_model(), out)
        else:
            raise ValueError(f"unknown tokenizer kind {kind!r}")
        _cache[key] = out
    return _cache[key]


def tiny_translator_dir(family: str, seed: int = 0) -> Path:
    """Cached tiny random translator (model + tokenizer) for "nllb" | "mbart". Treat it as read-only."""
    key = f"model_{family}_{seed}"
    if key not in _cache:
        _cache[key] = build_tiny_translator(
            family, tokenizer_dir(family), _root() / "models" / f"{family}-{seed}", seed, **TINY_SIZE
        )
    return _cache[key]


def make_tiny_translator_dir(tmp_path: Path, family: str, seed: int = 0) -> Path:
    """A private copy of the cached tiny translator under ``tmp_path`` (safe to modify)."""
    dst = Path(tmp_path) / f"tiny-{family}-{seed}"
    if not dst.exists():
        shutil.copytree(tiny_translator_dir(family, seed), dst)
    return dst


def no_backoff(seconds: float) -> None:
    """Stands in for time.sleep where a failure must come at once: a retry loop's back-off fails the test."""
    raise AssertionError(f"slept {seconds} s: the failure was retried instead of reported")
