"""Reference-based energies (CometEnergy for a RegressionMetric, UnifiedEnergy for XCOMET's input):
the value is comet's own score of the decoded text against the reference, the gradient reaches the
translator only through the translation, and a missing reference is an error.

The tiny world of tests/unit/test_energy.py (an XLM-R tokenizer shared with a tiny mBART-50, an NLLB with
its own) with a tiny random COMET and XCOMET over the XLM-R tokenizer.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from qeebm.config import GenerationConfig
from qeebm.errors import QeebmError
from qeebm.qe.bridge import Bridge
from qeebm.qe.energy import CometEnergy, KiwiEnergy, UnifiedEnergy, load_energy
from qeebm.qe.models import load_qe
from qeebm.qe.tiny import build_tiny_comet, build_tiny_xcomet

from support.energy import FAMILIES, SRCS, TEXTS, TOL, emitted, energy_world
from support.qe import predict

KINDS = {"comet": (build_tiny_comet, CometEnergy), "xcomet": (build_tiny_xcomet, UnifiedEnergy)}
# References: one equal to its translation, one empty, one longer than the QE's segment limit.
REFS = ["муур нохой харж 2025 (том).", "the cat", "", "3.14 today", "муур", " ".join(["нохой 7,"] * 90)]


@functools.lru_cache(maxsize=None)
def model_path(kind: str):
    return KINDS[kind][0](energy_world().translators["mbart"].parent / f"tiny_{kind}", energy_world().tokenizers["xlmr"])


def load(kind: str, dtype=torch.float32):
    model = load_qe(str(model_path(kind))).to(dtype)
    # Spread a random head's scores so that a wrong segment, pooling or position shows far above noise.
    with torch.no_grad():
        model.estimator.ff[-1].weight.mul_(20.0 if kind == "comet" else 3.0)
    return model


def energy_for(model, translator, kind):
    bridge = Bridge(translator.tokenizer, model.encoder.tokenizer, vocab_size=translator.model.config.vocab_size)
    return KINDS[kind][1](model, bridge)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_st_energy_is_minus_comet_score_against_the_reference(translators, family, kind):
    model, tr = load(kind), translators[family]
    energy = energy_for(model, tr, kind)
    ids, mask = emitted(tr, TEXTS)
    logits = torch.randn(*ids.shape, tr.model.config.vocab_size, requires_grad=True)
    e = energy(SRCS, ids, mask, logits, ref=REFS)
    texts = tr.tokenizer.batch_decode(ids, skip_special_tokens=True)
    want = torch.tensor(predict(model, SRCS, texts, REFS), dtype=torch.float64)
    assert torch.allclose(-e.double(), want, atol=TOL, rtol=0)
    assert want.max() - want.min() > 100 * TOL
    assert torch.equal(energy.score_ids(SRCS, ids, mask, ref=REFS), -e.detach())
    # The reference matters: another reference gives another score.
    other = energy.score_ids(SRCS, ids, mask, ref=REFS[1:] + REFS[:1])
    assert (other - (-e.detach())).abs().max() > 100 * TOL
    e.sum().backward()
    assert logits.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_reach_every_translator_parameter(translators, kind):
    model, tr = load(kind), translators["nllb"]
    net = copy.deepcopy(tr.model).train()
    energy = energy_for(model, tr, kind)
    src, ref = ["the cat sees 12 dogs.", "муур нохой 7"], ["муур 12 нохой харж.", "нохой 7"]
    enc = tr.encode(src)
    torch.manual_seed(0)
    gen = GenerationConfig(num_beams=1, do_sample=True, max_new_tokens=10)
    seqs = tr.generate_ids(enc["input_ids"], enc["attention_mask"], gen, num_return_sequences=2, min_new_tokens=4)
    tf = tr.teacher_forcing(seqs)
    logits = net(input_ids=enc["input_ids"].repeat_interleave(2, 0),
                 attention_mask=enc["attention_mask"].repeat_interleave(2, 0),
                 decoder_input_ids=tf["decoder_input_ids"]).logits
    srcs, refs = [s for s in src for _ in range(2)], [r for r in ref for _ in range(2)]
    e = energy(srcs, seqs[:, 1:], tf["labels"] != -100, logits, ref=refs)
    want = predict(model, srcs, tr.decode(seqs), refs)
    assert torch.allclose(-e.double(), torch.tensor(want, dtype=torch.float64), atol=TOL, rtol=0)
    e.sum().backward()
    assert not [n for n, p in net.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_softmax_relaxation_gradcheck(translators, family, kind, monkeypatch):
    """The relaxed energy is smooth in the logits and autograd's gradient is its derivative (the
    straight-through gradient is this one's at the one-hot point)."""
    import comet.models.pooling_utils as pooling

    # comet's average pooling rounds through float32 (mask_fill casts), which drowns a float64
    # finite difference in noise; the same masking without the cast.
    monkeypatch.setattr(pooling, "mask_fill", lambda fill, tokens, emb, pad: emb.masked_fill(
        tokens.eq(pad).unsqueeze(-1), fill))
    tr = translators[family]
    energy = energy_for(load(kind, torch.float64), tr, kind)
    ids, mask = emitted(tr, ["муур 12 (том).", "the cat"])
    srcs, refs = ["the cat", "a dog 3"], ["муур том.", "нохой 3"]
    g = torch.Generator().manual_seed(0)
    base = torch.randn(*ids.shape, tr.model.config.vocab_size, dtype=torch.float64, generator=g)
    dirs = torch.randn(4, *base.shape, dtype=torch.float64, generator=g)
    coef = torch.zeros(4, dtype=torch.float64, requires_grad=True)

    def f(c):
        return energy(srcs, ids, mask, base + torch.einsum("k,k...->...", c, dirs), relaxation="softmax", ref=refs)

    assert torch.autograd.gradcheck(f, (coef,), eps=1e-6, atol=1e-6, rtol=1e-4)


def test_packed_rows_equal_full_logits(translators):
    """The content rows alone (what output_rows gives) and the full [B, T, V] logits: one energy."""
    tr = translators["nllb"]
    energy = energy_for(load("comet"), tr, "comet")
    ids, mask = emitted(tr, TEXTS[:4])
    full = torch.randn(*ids.shape, tr.model.config.vocab_size, requires_grad=True)
    content = energy.bridge.content_mask(ids, mask)
    rows = full.detach()[content].clone().requires_grad_(True)
    a, b = energy(SRCS[:4], ids, mask, full, ref=REFS[:4]), energy(SRCS[:4], ids, mask, rows, ref=REFS[:4])
    assert torch.allclose(a, b, atol=1e-6)
    a.sum().backward()
    b.sum().backward()
    assert torch.allclose(full.grad[content], rows.grad, atol=1e-6)


def test_reference_is_required_and_counted(translators):
    tr = translators["mbart"]
    energy = energy_for(load("comet"), tr, "comet")
    ids, mask = emitted(tr, TEXTS[:2])
    logits = torch.randn(*ids.shape, tr.model.config.vocab_size)
    with pytest.raises(QeebmError, match="reference"):
        energy(SRCS[:2], ids, mask, logits)
    with pytest.raises(ValueError, match="1 references for 2"):
        energy(SRCS[:2], ids, mask, logits, ref=REFS[:1])


def test_load_energy_picks_the_kind_and_refuses_a_trained_reference_based_qe(translators):
    tr = translators["mbart"]
    assert type(load_energy(str(model_path("comet")), tr, freeze=True)) is CometEnergy
    assert type(load_energy(str(model_path("xcomet")), tr, freeze=True)) is UnifiedEnergy
    assert type(load_energy(str(energy_world().kiwi), tr, freeze=True)) is KiwiEnergy
    assert not KiwiEnergy.needs_reference and CometEnergy.needs_reference and UnifiedEnergy.needs_reference
    with pytest.raises(QeebmError, match="reference-free CometKiwi"):
        load_energy(str(model_path("comet")), tr, freeze=False)


@pytest.mark.parametrize("kind", ["kiwi", *KINDS])
@pytest.mark.parametrize("family", FAMILIES)
def test_token_gradients_are_what_straight_through_and_reinmax_backpropagate(translators, family, kind):
    # token_gradients (loo-cv's control variate) and the relaxations' backward passes must agree on
    # the QE's gradient: dE/dlogits = J(p) (-B g_t) under straight-through, ReinMax's Jacobians of
    # the same vector under reinmax, with g_t the gradient of the score at step t's embedding.
    from qeebm.qe.bridge import reinmax_jvp, softmax_jvp

    from support.energy import energy_for as kiwi_energy_for
    from support.energy import load_kiwi

    tr = translators[family]
    energy = kiwi_energy_for(load_kiwi(), tr) if kind == "kiwi" else energy_for(load(kind, torch.float64), tr, kind)
    energy.double()
    refs = REFS if energy.needs_reference else None
    ids, mask = emitted(tr, TEXTS)
    scores, g = energy.token_gradients(SRCS, ids, mask, ref=refs)  # [B], [B, T, H]
    assert torch.allclose(scores, energy.score_ids(SRCS, ids, mask, ref=refs))
    content = energy.bridge.content_mask(ids, mask)
    assert g[~content].abs().max() == 0 and g[content].abs().sum() > 0
    table = energy.bridge_table()  # [V, H]
    logits = torch.randn(*ids.shape, tr.model.config.vocab_size, dtype=torch.float64)
    p = torch.softmax(logits[content], -1)
    d_energy = -(g[content] @ table.T)  # dE/dD at each content step
    want = {"st": softmax_jvp(p, d_energy), "reinmax": reinmax_jvp(p, p, ids[content], d_energy)}
    for relaxation, expected in want.items():
        x = logits.clone().requires_grad_()
        energy(SRCS, ids, mask, x, relaxation=relaxation, ref=refs).sum().backward()
        assert torch.allclose(x.grad[content], expected, atol=1e-9), relaxation
        assert x.grad[~content].abs().max() == 0
