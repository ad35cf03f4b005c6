"""The tiny tokenizers keep the real vocabularies' id layout (see qeebm/tinyworld/tokenizers.py)."""

from __future__ import annotations

import pytest
import sentencepiece as spm
from transformers import (
    AutoTokenizer,
    MBart50TokenizerFast,
    NllbTokenizerFast,
    XLMRobertaTokenizerFast,
)

from qeebm.tinyworld.tokenizers import sp_size, train_sentencepiece

from support.tiny import nllb_sp_model, shared_sp_model, tiny_texts, tokenizer_dir

SAMPLES = [
    "the cat sees 12 dogs, today!",
    "муур нохой харж 2025 (том).",
    "Hello: Сайн байна уу? 3.14 - 42%",
    "water; ус, mother & ээж ... 7",
    "UNSEEN Wörter ünd Ωmega 0",
]


def test_train_sentencepiece_is_byte_identical(tmp_path):
    texts = tiny_texts(120)
    a = train_sentencepiece(texts, tmp_path / "a" / "x.model", 200, seed=5)
    b = train_sentencepiece(texts, tmp_path / "b" / "other-name.model", 200, seed=5)
    assert a.read_bytes() == b.read_bytes()
    sp = spm.SentencePieceProcessor(model_file=str(a))
    assert [sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()] == [0, 1, 2, -1]
    assert [sp.id_to_piece(i) for i in range(3)] == ["<unk>", "<s>", "</s>"]


def test_xlmr_special_ids():
    tok = XLMRobertaTokenizerFast.from_pretrained(tokenizer_dir("xlmr"))
    n = sp_size(shared_sp_model())
    assert (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.mask_token_id == n + 1 == len(tok) - 1
    ids = tok("the cat")["input_ids"]
    assert ids[0] == 0 and ids[-1] == 2


def test_mbart_ids_equal_xlmr_ids():
    xlmr = AutoTokenizer.from_pretrained(tokenizer_dir("xlmr"))
    mbart = AutoTokenizer.from_pretrained(tokenizer_dir("mbart"))
    assert isinstance(mbart, MBart50TokenizerFast)
    for text in SAMPLES + tiny_texts(30, seed=9):
        x = xlmr(text, add_special_tokens=False)["input_ids"]
        m = mbart(text, add_special_tokens=False)["input_ids"]
        assert x == m, text
    # Whole-vocabulary identity, except XLM-R's <mask>, whose id is mBART's first language code.
    xv, mv = xlmr.get_vocab(), mbart.get_vocab()
    for piece, i in xv.items():
        if piece != "<mask>":
            assert mv[piece] == i, piece


def test_mbart_language_codes_follow_the_pieces():
    mbart = AutoTokenizer.from_pretrained(tokenizer_dir("mbart"))
    xlmr = AutoTokenizer.from_pretrained(tokenizer_dir("xlmr"))
    first = sp_size(shared_sp_model()) + 1
    codes = mbart.additional_special_tokens
    assert len(codes) == 52 and {"en_XX", "mn_MN"} <= set(codes)
    ids = mbart.convert_tokens_to_ids(codes)
    assert ids == list(range(first, first + 52))
    assert ids[0] == xlmr.mask_token_id  # the real-world quirk
    assert mbart.mask_token_id == first + 52 == len(mbart) - 1


def test_nllb_tokenizer_layout():
    nllb = AutoTokenizer.from_pretrained(tokenizer_dir("nllb"))
    assert isinstance(nllb, NllbTokenizerFast)
    first = sp_size(nllb_sp_model()) + 1
    codes = nllb.additional_special_tokens
    assert len(codes) == 202
    assert nllb.convert_tokens_to_ids(codes) == list(range(first, first + 202))
    assert nllb.convert_tokens_to_ids("eng_Latn") >= first
    assert nllb.convert_tokens_to_ids("khk_Cyrl") >= first
    assert nllb.mask_token_id == len(nllb) - 1 == first + 202
    # A different SentencePiece model from the shared one.
    assert nllb_sp_model().read_bytes() != shared_sp_model().read_bytes()


@pytest.mark.parametrize(
    "kind,src,tgt",
    [("nllb", "eng_Latn", "khk_Cyrl"), ("mbart", "en_XX", "mn_MN")],
)
@pytest.mark.parametrize("use_fast", [True, False])
def test_translation_formats(kind, src, tgt, use_fast):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir(kind), use_fast=use_fast)
    tok.src_lang, tok.tgt_lang = src, tgt
    enc = tok("the cat 12.", text_target="муур хот.")
    src_id, tgt_id = tok.convert_tokens_to_ids([src, tgt])
    assert enc["input_ids"][0] == src_id and enc["input_ids"][-1] == tok.eos_token_id
    assert enc["labels"][0] == tgt_id and enc["labels"][-1] == tok.eos_token_id
    assert tok.eos_token_id not in enc["input_ids"][:-1]
    assert tok.decode(enc["labels"], skip_special_tokens=True) == "муур хот."


@pytest.mark.parametrize("kind", ["xlmr", "mbart", "nllb"])
def test_fast_equals_slow(kind):
    fast = AutoTokenizer.from_pretrained(tokenizer_dir(kind), use_fast=True)
    slow = AutoTokenizer.from_pretrained(tokenizer_dir(kind), use_fast=False)
    assert type(slow).__name__ + "Fast" == type(fast).__name__
    assert len(fast) == len(slow)
    for text in SAMPLES + tiny_texts(20, seed=3):
        assert fast(text)["input_ids"] == slow(text)["input_ids"], text
