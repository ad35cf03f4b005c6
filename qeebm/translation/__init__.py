"""The translator (an NLLB-200 or mBART-50 model with its tokenizer), its decoding settings, and
quality-aware decoding (QE reranking and MBR)."""
