"""Tiny random-weight NLLB-200 (M2M100) and mBART-50 translators with the real checkpoints' conventions.

Only the sizes are small: special ids, decoder start, embedding scaling, tying, activation and the
tokenizer class are those of facebook/nllb-200-distilled-600M and facebook/mbart-large-50, so code
that works on these works on the real models.
"""

from __future__ import annotations

from pathlib import Path

import torch

from qeebm.utils.langcodes import FAMILIES

TOKENIZER_CLASS = {"nllb": "NllbTokenizer", "mbart": "MBart50Tokenizer"}

# Shared by both real checkpoints: <s>=0 <pad>=1 </s>=2, and the decoder starts from </s>.
PAD_ID, BOS_ID, EOS_ID = 1, 0, 2


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown translator family {family!r}; expected one of {FAMILIES}")


def tiny_config(
    family: str,
    vocab_size: int | None = None,
    tokenizer=None,
    *,
    d_model: int = 64,
    layers: int = 2,
    heads: int = 4,
    ffn: int = 256,
    max_positions: int = 128,
    dropout: float = 0.1,
):
    """An ``M2M100Config`` ("nllb") or ``MBartConfig`` ("mbart") of the given size.

    ``vocab_size`` defaults to ``len(tokenizer)``; when both are given they must agree, because a
    larger embedding would hold rows no token maps to (and the samplers could emit them).
    """
    _check_family(family)
    if tokenizer is not None:
        if vocab_size is not None and vocab_size != len(tokenizer):
            raise ValueError(f"vocab_size {vocab_size} != len(tokenizer) {len(tokenizer)}")
        vocab_size = len(tokenizer)
    if vocab_size is None:
        raise ValueError("tiny_config needs vocab_size or tokenizer")
    common = dict(
        vocab_size=vocab_size,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        max_position_embeddings=max_positions,
        dropout=dropout,
        # M2M100 defaults to 0.05: a layer skipped at random gets no gradient that step.
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=EOS_ID,
        scale_embedding=True,
        tie_word_embeddings=True,
        tokenizer_class=TOKENIZER_CLASS[family],
    )
    if family == "nllb":
        from transformers import M2M100Config

        return M2M100Config(activation_function="relu", attention_dropout=dropout, activation_dropout=0.0, **common)
    from transformers import MBartConfig

    return MBartConfig(
        activation_function="gelu",
        attention_dropout=0.0,
        activation_dropout=0.0,
        forced_eos_token_id=EOS_ID,
        **common,
    )


def tiny_generation_config(family: str, max_positions: int = 128):
    """The checkpoints' generation defaults, without ``forced_bos_token_id``: the target language is
    forced at generate() time, so a stale default in a saved model can never pick the language."""
    from transformers import GenerationConfig

    _check_family(family)
    values = dict(
        bos_token_id=BOS_ID,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=EOS_ID,
        # The real checkpoints say 200; learned positions (mBART) cannot go past max_positions.
        max_length=min(200, max_positions),
    )
    if family == "mbart":
        # As facebook/mbart-large-50 ships: beam search by default, and a forced </s> at max_length.
        values.update(forced_eos_token_id=EOS_ID, num_beams=5)
    return GenerationConfig(**values)


def sinusoidal_positions(num_rows: int, dim: int) -> torch.Tensor:
    """M2M100's fixed position table (``num_rows`` x ``dim``), row p+2 holding position p and row 1
    (the padding row) zero, as transformers builds it for NLLB-200."""
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding

    return M2M100SinusoidalPositionalEmbedding.get_embedding(num_rows, dim, PAD_ID)


def init_mbart_positions(model) -> None:
    """Start a random MBart's learned positions (encoder and decoder) from M2M100's sinusoidal table.

    mBART-50's positions come pretrained; random ones must first be learned before word order means
    anything, and the tiny MBart learned several times slower than the tiny M2M100 for that alone
    (dev NLL at step 700: 3.77 random vs 2.89 from the table vs 2.92 for M2M100). Both families put
    position p at row p+2 (MBart's learned embedding has an offset of 2; M2M100 counts positions
    from padding_idx + 1 = 2), so the whole table is copied row for row. The rows stay trainable.
    """
    for stack in (model.get_encoder(), model.get_decoder()):
        weight = stack.embed_positions.weight
        table = sinusoidal_positions(weight.shape[0], weight.shape[1])
        with torch.no_grad():
            weight.copy_(table.to(dtype=weight.dtype, device=weight.device))


def _tokenizer_family(tokenizer) -> str:
    name = type(tokenizer).__name__
    if name.startswith("Nllb"):
        return "nllb"
    if name.startswith("MBart50"):
        return "mbart"
    raise ValueError(f"tokenizer {name} is neither an NLLB nor an mBART-50 tokenizer")


def build_tiny_translator(
    family: str,
    tokenizer_dir: str | Path,
    out_dir: str | Path,
    seed: int,
    **size,
) -> Path:
    """Random-init translator of ``family`` over the tokenizer in ``tokenizer_dir``, saved with its
    tokenizer to ``out_dir`` (loadable offline by AutoModelForSeq2SeqLM / AutoTokenizer / pipeline).

    ``size``: keyword arguments of ``tiny_config`` (d_model, layers, heads, ffn, max_positions, dropout).
    The global torch RNG is left as it was. The MBart's learned positions start from M2M100's
    sinusoidal table (``init_mbart_positions``), standing in for mBART-50's pretrained ones.
    """
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    _check_family(family)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if _tokenizer_family(tokenizer) != family:
        raise ValueError(f"{tokenizer_dir} holds a {type(tokenizer).__name__}, not a {family} tokenizer")
    config = tiny_config(family, tokenizer=tokenizer, **size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForSeq2SeqLM.from_config(config)
    if family == "mbart":
        init_mbart_positions(model)
    model.generation_config = tiny_generation_config(family, config.max_position_embeddings)
    tokenizer.model_max_length = config.max_position_embeddings
    out_dir = Path(out_dir)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir
