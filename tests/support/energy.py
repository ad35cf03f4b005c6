"""The energy tests' own tiny world (test_energy, test_bridge, test_energy_reference): an XLM-R
tokenizer and a random CometKiwi over it, an mBART-50 sharing its SentencePiece model, an NLLB with its
own, and the helpers that feed them."""

from __future__ import annotations

import atexit
import functools
import random
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

from qeebm.qe.bridge import Bridge
from qeebm.qe.energy import KiwiEnergy
from qeebm.qe.models import load_qe
from qeebm.qe.tiny import build_tiny_kiwi
from qeebm.tinyworld.models import build_tiny_translator
from qeebm.tinyworld.tokenizers import (
    build_mbart50_tokenizer,
    build_nllb_tokenizer,
    build_xlmr_tokenizer,
    train_sentencepiece,
)

FAMILIES = ["mbart", "nllb"]
TOL = 1e-5

# Cyrillic + digits + punctuation, repeated tokens, an empty output, digits/punctuation, an output
# longer than the QE's segment limit, and a short output whose long source makes comet cut the
# concatenation (dropping the source's tail and the final </s>).
TEXTS = [
    "муур нохой харж 2025 (том).",
    "the the the cat cat cat , , ,",
    "",
    "3.14 - 42, today: 7!",
    " ".join(["муур 12,"] * 100),
    "the dog",
]
SRCS = ["the cat sees 12 dogs.", "a b", "the river", "water 3", "big city", " ".join(["the old house"] * 100)]


_WORDS = (
    "the a cat dog house river city child book water tree road bird sees walks reads finds gives big "
    "small old new today here and with муур нохой байшин гол хот хүүхэд ном ус мод зам шувуу харж "
    "алхаж уншиж том жижиг хуучин шинэ өнөөдөр энд ба"
).split()
_PUNCT = [".", "!", "?", ",", ":", ";", "-", "(", ")", "%", "'"]


def corpus(n: int = 400, seed: int = 0) -> list[str]:
    """Latin and Cyrillic words, digits and punctuation: every character the tests emit is a piece."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(2, 8))]
        words.insert(rng.randint(0, len(words)), str(rng.randint(0, 3000)))
        lines.append(" ".join(words) + rng.choice(_PUNCT) + " " + rng.choice(_PUNCT) + rng.choice("0123456789"))
    return lines


@functools.lru_cache(maxsize=None)
def energy_world() -> SimpleNamespace:
    """A tiny world of our own (the shared test corpus may change under us): an XLM-R tokenizer and a
    CometKiwi over it, an mBART-50 sharing its SentencePiece model, an NLLB with its own.
    Built once per process. Treat every path as read-only."""
    root = Path(tempfile.mkdtemp(prefix="qeebm-energy-"))
    atexit.register(shutil.rmtree, root, True)
    shared = train_sentencepiece(corpus(), root / "sp" / "shared.model", 400, seed=11)
    own = train_sentencepiece(corpus(seed=1), root / "sp" / "nllb.model", 300, seed=23)
    tok = {"xlmr": root / "tok" / "xlmr", "mbart": root / "tok" / "mbart", "nllb": root / "tok" / "nllb"}
    build_xlmr_tokenizer(shared, tok["xlmr"])
    build_mbart50_tokenizer(shared, tok["mbart"])
    build_nllb_tokenizer(own, tok["nllb"])
    size = dict(d_model=32, layers=2, heads=4, ffn=64, max_positions=64, dropout=0.1)
    models = {fam: build_tiny_translator(fam, tok[fam], root / fam, seed=0, **size) for fam in FAMILIES}
    return SimpleNamespace(tokenizers=tok, translators=models, kiwi=build_tiny_kiwi(root / "kiwi", tok["xlmr"]))


def load_kiwi(path=None):
    model = load_qe(str(path or energy_world().kiwi))
    # A random head scores every input nearly alike; a steeper last layer spreads the scores so that a
    # wrong segment order or position id shows far above float noise.
    with torch.no_grad():
        model.estimator.ff[-1].weight.mul_(20.0)
    return model


def emitted(translator, texts):
    """mt_ids/mt_mask as generate_ids lays them out after the decoder start: [lang] X </s> <pad>..."""
    tok = translator.tokenizer
    rows = [[translator.tgt_lang_id] + tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            for t in texts]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row)
        mask[b, : len(row)] = 1
    return ids, mask


def energy_for(kiwi, translator, **kw):
    v = translator.model.config.vocab_size
    return KiwiEnergy(kiwi, Bridge(translator.tokenizer, kiwi.encoder.tokenizer, vocab_size=v), **kw)
