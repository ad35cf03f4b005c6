import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from qeebm.tinyworld.models import tiny_config

from support.tiny import TINY_SIZE, tiny_translator_dir


def test_mbart_positions_start_from_m2m100_sinusoidal_table():
    model = AutoModelForSeq2SeqLM.from_pretrained(str(tiny_translator_dir("mbart")))
    # The table M2M100 itself builds for the same width and length: what a tiny NLLB actually adds.
    m2m = AutoModelForSeq2SeqLM.from_config(tiny_config("nllb", vocab_size=100, **TINY_SIZE))
    table = m2m.get_encoder().embed_positions.weights
    assert table.shape[0] == TINY_SIZE["max_positions"] + 2
    for stack in (model.get_encoder(), model.get_decoder()):
        weight = stack.embed_positions.weight
        assert weight.requires_grad
        assert torch.equal(weight.detach(), table)
    # Position p is row p+2 in both: the first real token of MBart gets M2M100's first position.
    tok = AutoTokenizer.from_pretrained(str(tiny_translator_dir("mbart")))
    ids = tok(["a b"], return_tensors="pt").input_ids
    pos = model.get_encoder().embed_positions(ids)
    m2m_pos = m2m.get_encoder().embed_positions(ids.clamp(min=2))  # no pad ids: positions 0..n-1
    assert torch.equal(pos.expand_as(m2m_pos), m2m_pos)


def test_mbart_positions_stay_trainable():
    model = AutoModelForSeq2SeqLM.from_pretrained(str(tiny_translator_dir("mbart")))
    tok = AutoTokenizer.from_pretrained(str(tiny_translator_dir("mbart")))
    enc = tok(["the cat sees the dog"], text_target=["муур нохой харж"], return_tensors="pt")
    model(**enc).loss.backward()
    for stack in (model.get_encoder(), model.get_decoder()):
        grad = stack.embed_positions.weight.grad
        assert grad is not None and grad.abs().sum() > 0


def test_nllb_translator_is_unchanged_by_the_mbart_init():
    model = AutoModelForSeq2SeqLM.from_pretrained(str(tiny_translator_dir("nllb")))
    assert not any("embed_positions" in name for name, _ in model.named_parameters())
