"""Tiny tokenizers laid out exactly like the real ones, so id arithmetic tested here holds at full size.

The facts mirrored (ids of the real checkpoints in brackets):

* XLM-R / InfoXLM (the quality estimator): ``<s>=0 <pad>=1 </s>=2 <unk>=3``, SentencePiece piece ``i``
  (``i >= 3``) at id ``i + 1`` (fairseq offset), ``<mask>`` last [250001].
* mBART-50: the *same* SentencePiece model and the same ids for every piece [0..250000], then the 52
  language codes (the first one, ``ar_AR``, takes XLM-R's ``<mask>`` id [250001]), then ``<mask>``
  [250053].
* NLLB-200: its own SentencePiece model, same special/offset layout, then the 202 language codes
  [256001..256202], then ``<mask>`` [256203]; ``legacy_behaviour=False`` (``[lang] X </s>``).

Every builder writes the SentencePiece file (slow tokenizer) and ``tokenizer.json`` (fast tokenizer),
so ``AutoTokenizer`` works with ``use_fast`` True and False and both give the same ids.
"""

from __future__ import annotations

import io
from pathlib import Path

import sentencepiece as spm

# The SentencePiece model's own ids, as in XLM-R's sentencepiece.bpe.model. The transformers converters
# take pieces[3:] as the ordinary pieces, so these three must come first and pad must not exist.
SP_UNK_ID, SP_BOS_ID, SP_EOS_ID = 0, 1, 2
FAIRSEQ_OFFSET = 1

# model_max_length of the real tokenizers; tiny models lower it to their own position count.
XLMR_MAX_LENGTH = 512
TRANSLATOR_MAX_LENGTH = 1024


def train_sentencepiece(texts: list[str], model_path: Path, vocab_size: int, seed: int) -> Path:
    """Train a unigram SentencePiece model on ``texts`` and write it to ``model_path``.

    Deterministic: the same texts, size and seed give a byte-identical file. ``vocab_size`` is an upper
    bound (``hard_vocab_limit`` off), because a small corpus may not support as many pieces; read the
    real size from the model. The seed only matters to SentencePiece's internal random generator.
    """
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError("train_sentencepiece needs at least one non-empty text")
    model_path = Path(model_path)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    spm.set_random_generator_seed(seed)
    buffer = io.BytesIO()
    # model_writer instead of model_prefix: the prefix would be stored inside the model's trainer spec,
    # so the same training written to two paths would give two different files.
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buffer,
        model_type="unigram",
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        character_coverage=1.0,
        unk_id=SP_UNK_ID,
        bos_id=SP_BOS_ID,
        eos_id=SP_EOS_ID,
        pad_id=-1,
        num_threads=1,
        # 0 = use every sentence: no random subsampling, no shuffling.
        input_sentence_size=0,
        shuffle_input_sentence=False,
        minloglevel=2,
    )
    model_path.write_bytes(buffer.getvalue())
    return model_path


def sp_size(sp_model: Path) -> int:
    """Number of pieces in a SentencePiece model (including its unk/bos/eos)."""
    return spm.SentencePieceProcessor(model_file=str(sp_model)).get_piece_size()


def _mask_token():
    from transformers import AddedToken

    # As in the real tokenizers: <mask> swallows the space before it.
    return AddedToken("<mask>", lstrip=True, normalized=True, special=True)


def build_xlmr_tokenizer(sp_model: Path, out_dir: Path):
    """XLM-R / InfoXLM layout over ``sp_model``; returns the fast tokenizer (also saved in ``out_dir``)."""
    from transformers import XLMRobertaTokenizerFast

    tok = XLMRobertaTokenizerFast(vocab_file=str(sp_model), model_max_length=XLMR_MAX_LENGTH)
    _check_layout(tok, sp_model, first_extra=None)
    if tok.mask_token_id != sp_size(sp_model) + FAIRSEQ_OFFSET:
        raise AssertionError("XLM-R <mask> is not right after the pieces")
    tok.save_pretrained(str(out_dir))
    return tok


def build_mbart50_tokenizer(sp_model: Path, out_dir: Path, src_lang: str = "en_XX", tgt_lang: str = "mn_MN"):
    """mBART-50 layout over the same ``sp_model`` as the XLM-R tokenizer: identical ids for all pieces,
    then the 52 language codes, then ``<mask>``."""
    from transformers import MBart50TokenizerFast

    tok = MBart50TokenizerFast(
        vocab_file=str(sp_model), src_lang=src_lang, tgt_lang=tgt_lang, model_max_length=TRANSLATOR_MAX_LENGTH
    )
    first_code = sp_size(sp_model) + FAIRSEQ_OFFSET
    _check_layout(tok, sp_model, first_extra=first_code)
    if tok.mask_token_id != len(tok) - 1:
        raise AssertionError("mBART-50 <mask> is not the last id")
    tok.save_pretrained(str(out_dir))
    return tok


def build_nllb_tokenizer(sp_model2: Path, out_dir: Path, src_lang: str = "eng_Latn", tgt_lang: str = "khk_Cyrl"):
    """NLLB-200 layout over its own ``sp_model2``: pieces, the 202 language codes, then ``<mask>``."""
    from transformers import NllbTokenizerFast

    # transformers would register <mask> before the language codes; the real NLLB vocabulary has it
    # last, so it is added afterwards.
    tok = NllbTokenizerFast(
        vocab_file=str(sp_model2),
        src_lang=src_lang,
        tgt_lang=tgt_lang,
        legacy_behaviour=False,
        mask_token=None,
        model_max_length=TRANSLATOR_MAX_LENGTH,
    )
    tok.add_special_tokens({"mask_token": _mask_token()})
    first_code = sp_size(sp_model2) + FAIRSEQ_OFFSET
    _check_layout(tok, sp_model2, first_extra=first_code)
    if tok.mask_token_id != len(tok) - 1:
        raise AssertionError("NLLB <mask> is not the last id")
    tok.save_pretrained(str(out_dir))
    return tok


def _check_layout(tok, sp_model: Path, first_extra: int | None) -> None:
    """Fail loudly if a transformers release ever changes the fairseq layout this module relies on."""
    sp = spm.SentencePieceProcessor(model_file=str(sp_model))
    specials = tok.convert_tokens_to_ids(["<s>", "<pad>", "</s>", "<unk>"])
    if specials != [0, 1, 2, 3]:
        raise AssertionError(f"special ids {specials}, expected [0, 1, 2, 3]")
    n = sp.get_piece_size()
    for i in (3, n // 2, n - 1):
        if tok.convert_tokens_to_ids(sp.id_to_piece(i)) != i + FAIRSEQ_OFFSET:
            raise AssertionError(f"piece {sp.id_to_piece(i)!r} is not at sp id + {FAIRSEQ_OFFSET}")
    if first_extra is not None:
        codes = tok.additional_special_tokens
        if tok.convert_tokens_to_ids(codes[0]) != first_extra:
            raise AssertionError(f"first language code is not at id {first_extra}")
