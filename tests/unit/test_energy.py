"""KiwiEnergy: the value is comet's own score, the gradient reaches the translator (and only it).

Every QE here is a tiny random CometKiwi over a tiny XLM-R tokenizer, which shares its SentencePiece
model with a tiny mBART-50 tokenizer; the tiny NLLB tokenizer has its own, so both bridges run.
"""

from __future__ import annotations

import copy

import pytest
import torch

import qeebm.analysis.benchmark as bm
from qeebm.config import GenerationConfig
from qeebm.errors import QeebmError

from support.energy import FAMILIES, SRCS, TEXTS, TOL, emitted, energy_for, load_kiwi
from support.qe import predict


@pytest.mark.parametrize("family", FAMILIES)
def test_st_energy_is_minus_comet_score(kiwi, translators, family):
    tr = translators[family]
    energy = energy_for(kiwi, tr)
    ids, mask = emitted(tr, TEXTS)
    logits = torch.randn(*ids.shape, tr.model.config.vocab_size)
    e = energy(SRCS, ids, mask, logits)
    texts = tr.tokenizer.batch_decode(ids, skip_special_tokens=True)
    # Every character is a real piece (nothing became <unk> and vanished from the text).
    assert tr.tokenizer.unk_token_id not in ids and texts[:4] == TEXTS[:4]
    want = predict(kiwi, SRCS, texts)
    assert torch.allclose(-e.double(), torch.tensor(want, dtype=torch.float64), atol=TOL, rtol=0)
    # The scores are spread enough for the tolerance to mean something.
    assert max(want) - min(want) > 100 * TOL
    # Truncation really happened: the mt segment of row 4 at comet's limit, the concatenation of row 5.
    al = energy.last_alignment
    limit = kiwi.encoder.max_positions
    assert len(al.qe_ids[4]) == limit - 4
    assert len(kiwi.encoder.tokenizer(SRCS[5])["input_ids"]) + len(al.qe_ids[5]) + 2 > limit
    assert al.qe_ids[2] == []
    assert torch.allclose(energy.score_ids(SRCS, ids, mask), -e, atol=0, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_reach_every_translator_parameter(kiwi, translators, family):
    tr = translators[family]
    model = copy.deepcopy(tr.model).train()
    energy = energy_for(kiwi, tr)
    src = ["the cat sees 12 dogs.", "муур нохой 7"]
    enc = tr.encode(src)
    torch.manual_seed(0)
    gen = GenerationConfig(num_beams=1, do_sample=True, max_new_tokens=10)
    seqs = tr.generate_ids(enc["input_ids"], enc["attention_mask"], gen, num_return_sequences=2,
                           min_new_tokens=4)
    tf = tr.teacher_forcing(seqs)
    logits = model(input_ids=enc["input_ids"].repeat_interleave(2, 0),
                   attention_mask=enc["attention_mask"].repeat_interleave(2, 0),
                   decoder_input_ids=tf["decoder_input_ids"]).logits
    mt_ids, mt_mask = seqs[:, 1:], tf["labels"] != -100
    srcs = [s for s in src for _ in range(2)]
    e = energy(srcs, mt_ids, mt_mask, logits)
    # Sampled rows of a random model: arbitrary pieces, sometimes special tokens in the middle.
    want = predict(kiwi, srcs, tr.decode(seqs))
    assert torch.allclose(-e.double(), torch.tensor(want, dtype=torch.float64), atol=TOL, rtol=0)
    e.sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing
    assert all(p.grad is None for p in kiwi.parameters())


def test_qe_frozen_by_default_and_kept_in_eval(kiwi_path, translators):
    qe = load_kiwi(kiwi_path)
    # comet leaves the estimator and the layer mix trainable after loading; the energy freezes them.
    assert any(p.requires_grad for p in qe.parameters())
    energy = energy_for(qe, translators["mbart"])
    assert not any(p.requires_grad for p in qe.parameters())
    energy.train()
    assert not qe.training and not qe.layerwise_attention.training
    ids, mask = emitted(translators["mbart"], TEXTS[:2])
    logits = torch.randn(*ids.shape, translators["mbart"].model.config.vocab_size, requires_grad=True)
    energy(SRCS[:2], ids, mask, logits).sum().backward()
    assert logits.grad.abs().sum() > 0
    assert all(p.grad is None for p in qe.parameters())


@pytest.mark.parametrize("family", FAMILIES)
def test_trainable_qe_gets_gradients(kiwi_path, translators, family):
    qe = load_kiwi(kiwi_path)
    qe.requires_grad_(True)
    tr = translators[family]
    energy = energy_for(qe, tr, freeze=False)
    ids, mask = emitted(tr, TEXTS[:4])
    logits = torch.randn(*ids.shape, tr.model.config.vocab_size, requires_grad=True)
    qe.eval()
    e = energy(SRCS[:4], ids, mask, logits)
    assert torch.allclose(-e.double(), torch.tensor(predict(qe, SRCS[:4], tr.decode(ids))).double(), atol=TOL)
    e.sum().backward()
    for name, p in qe.named_parameters():
        if name.startswith(("estimator", "layerwise_attention.gamma")) or name.endswith("word_embeddings.weight"):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    # With the QE trainable the bridge table is rebuilt inside the graph, so the word embeddings also
    # get the straight-through gradient of every translator step.
    emb = qe.encoder.model.embeddings.word_embeddings.weight
    touched = (emb.grad.abs().sum(1) > 0).sum().item()
    assert touched > len(set(sum(energy.last_alignment.qe_ids, [])))


@pytest.mark.parametrize("family", FAMILIES)
def test_softmax_relaxation_gradcheck(kiwi_path, translators, family):
    tr = translators[family]
    qe = load_kiwi(kiwi_path).double()
    energy = energy_for(qe, tr)
    texts = ["муур 12 (том).", "the cat"]
    srcs = ["the cat", "a dog 3"]
    ids, mask = emitted(tr, texts)
    g = torch.Generator().manual_seed(0)
    base = torch.randn(*ids.shape, tr.model.config.vocab_size, dtype=torch.float64, generator=g)

    def f(logits):
        return energy(srcs, ids, mask, logits, relaxation="softmax")

    logits = base.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (logits,), eps=1e-6, atol=1e-6, rtol=1e-4, fast_mode=True)
    # Full Jacobian along a few random directions of the logit space.
    dirs = torch.randn(6, *base.shape, dtype=torch.float64, generator=g)
    coef = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda c: f(base + torch.einsum("k,k...->...", c, dirs)), (coef,),
                                    eps=1e-6, atol=1e-6, rtol=1e-4)


def test_softmax_relaxation_is_the_expected_embedding(kiwi, translators):
    """mBART, canonical segmentation: the QE sees p_t @ E_qe at each mt position. Checked against
    comet's own forward with the word-embedding output replaced."""
    tr = translators["mbart"]
    energy = energy_for(kiwi, tr)
    text, src = "муур нохой 12.", "the cat"
    ids, mask = emitted(tr, [text])
    logits = torch.randn(*ids.shape, tr.model.config.vocab_size)
    e = energy([src], ids, mask, logits, relaxation="softmax")
    assert energy.last_alignment.canonical == [True]
    n = len(energy.last_alignment.qe_ids[0])
    emb = kiwi.encoder.model.embeddings.word_embeddings
    table = torch.zeros(logits.shape[-1], emb.weight.shape[1])
    pieces = ~energy.bridge.special
    table[pieces] = emb.weight[torch.nonzero(pieces).flatten()]  # shared ids: mBART id == XLM-R id
    expected = torch.softmax(logits[0, 1 : 1 + n], -1) @ table  # steps after the language code

    def replace(module, inputs, output):
        output = output.clone()
        output[0, 1 : 1 + n] = expected
        return output

    batch = kiwi.prepare_sample([{"src": src, "mt": text}], stage="predict")[0]
    handle = emb.register_forward_hook(replace)
    try:
        with torch.no_grad():
            want = kiwi(**batch).score
    finally:
        handle.remove()
    assert torch.allclose(-e, want, atol=TOL, rtol=0)
    assert not torch.allclose(e, energy(["the cat"], ids, mask, logits), atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_gumbel_st_scores_its_own_sample(kiwi, translators, family):
    tr = translators[family]
    energy = energy_for(kiwi, tr)
    ids, mask = emitted(tr, TEXTS[:4])
    v = tr.model.config.vocab_size
    logits = torch.randn(*ids.shape, v, requires_grad=True)
    e = energy(SRCS[:4], ids, mask, logits, relaxation="gumbel-st", tau=0.5,
               generator=torch.Generator().manual_seed(1))
    # The forward tokens are a fresh sample, so the text differs from the emitted one; the value is
    # the exact score of the sampled text.
    texts = energy.last_alignment.texts
    assert texts != tr.decode(ids)
    want = predict(kiwi, SRCS[:4], texts)
    assert torch.allclose(-e.double(), torch.tensor(want, dtype=torch.float64), atol=TOL, rtol=0)
    e.sum().backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
    # Language code, </s> and padding are never resampled.
    fwd = torch.tensor(energy.last_alignment.forward_ids)
    content = energy.bridge.content_mask(ids, mask)
    assert torch.equal(fwd[~content], ids[~content])
    # A distribution peaked on the emitted tokens samples them back.
    peaked = 60.0 * torch.nn.functional.one_hot(ids, v).float()
    energy(SRCS[:4], ids, mask, peaked, relaxation="gumbel-st", generator=torch.Generator().manual_seed(2))
    assert energy.last_alignment.texts == tr.decode(ids)


def test_literal_special_text_is_handled_like_comet(kiwi, translators):
    """comet drops pad ids after tokenising, so a literal "<pad>" in a text never reaches the QE
    (other literal specials do)."""
    tr = translators["nllb"]
    energy = energy_for(kiwi, tr)
    srcs = ["the <pad> cat", "a </s> b <pad>"]
    ids, mask = emitted(tr, ["муур", "ном 3"])
    want = predict(kiwi, srcs, tr.decode(ids))
    assert torch.allclose(energy.score_ids(srcs, ids, mask).double(), torch.tensor(want).double(), atol=TOL)


def test_all_empty_outputs_still_backpropagate(kiwi, translators):
    tr = translators["mbart"]
    energy = energy_for(kiwi, tr)
    ids, mask = emitted(tr, ["", ""])  # [lang] </s>: the QE sees <s> </s></s> src </s>
    logits = torch.randn(*ids.shape, tr.model.config.vocab_size, requires_grad=True)
    e = energy(["the cat", "a"], ids, mask, logits)
    assert torch.allclose(-e.double(), torch.tensor(predict(kiwi, ["the cat", "a"], ["", ""])).double(), atol=TOL)
    e.sum().backward()
    assert not logits.grad.any()


def test_rejects_bad_inputs(kiwi, translators):
    tr = translators["nllb"]
    energy = energy_for(kiwi, tr)
    ids, mask = emitted(tr, TEXTS[:2])
    logits = torch.randn(*ids.shape, tr.model.config.vocab_size)
    with pytest.raises(ValueError, match="relaxation"):
        energy(SRCS[:2], ids, mask, logits, relaxation="hard")
    with pytest.raises(ValueError, match="sources"):
        energy(SRCS[:1], ids, mask, logits)
    with pytest.raises(ValueError, match="classes"):
        energy(SRCS[:2], ids, mask, logits[..., :-1])


def _energy_and_grad(energy, tr, relaxation, seed=3):
    ids, mask = emitted(tr, TEXTS)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(*ids.shape, tr.model.config.vocab_size, generator=g).requires_grad_(True)
    e = energy(SRCS, ids, mask, logits, relaxation=relaxation, tau=0.7,
               generator=torch.Generator().manual_seed(seed))
    (e * torch.linspace(0.5, 1.5, len(e))).sum().backward()
    return e.detach(), logits.grad


@pytest.mark.parametrize("relaxation", ["st", "softmax", "gumbel-st"])
@pytest.mark.parametrize("family", FAMILIES)
def test_packed_energy_equals_the_padded_one(kiwi, translators, family, relaxation, monkeypatch):
    tr = translators[family]
    energy = energy_for(kiwi, tr)
    ids, mask = emitted(tr, TEXTS)
    rows = [len(q) for q in energy.align(ids, mask).qe_ids]
    assert sum(rows) < 0.5 * len(rows) * max(rows)  # the mt segments are mostly padding
    e_packed, g_packed = _energy_and_grad(energy, tr, relaxation)
    monkeypatch.setattr("qeebm.qe.energy.packable", lambda model: False)
    e_padded, g_padded = _energy_and_grad(energy, tr, relaxation)
    assert (e_packed - e_padded).abs().max() < 1e-6
    assert g_padded.abs().max() > 1e-3  # a gradient worth comparing
    assert (g_packed - g_padded).abs().max() < 1e-6


@pytest.mark.parametrize("train_mode", [False, True])
def test_qe_gradient_checkpointing_keeps_the_gradients(kiwi_path, translators, train_mode):
    """Recomputing each QE layer in the backward pass changes memory, not the gradients: with the QE in
    train mode too, where checkpointing must replay the layers' dropout draws exactly."""
    tr = translators["nllb"]
    qe = load_kiwi(kiwi_path)
    results, calls = [], []
    qe.encoder.model.encoder.layer[0].attention.self.query.register_forward_hook(lambda *a: calls.append(1))
    for checkpointing in (False, True):
        energy = energy_for(qe, tr, freeze=not train_mode, gradient_checkpointing=checkpointing)
        if train_mode:
            qe.estimator.requires_grad_(True)
            energy.train()
        qe.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        e, g = _energy_and_grad(energy, tr, "st")
        head = qe.estimator.ff[0].weight.grad
        results.append((e, g, head.clone() if head is not None else None))
    assert len(calls) == 3  # the checkpointed layer ran again in the backward pass
    (e0, g0, h0), (e1, g1, h1) = results
    assert torch.equal(e0, e1) if not train_mode else (e0 - e1).abs().max() < 1e-6
    assert (g0 - g1).abs().max() < 1e-6 and g0.abs().max() > 1e-3
    if train_mode:
        assert (h0 - h1).abs().max() < 1e-6 and h0.abs().max() > 0
        # Dropout really is on, so the equality above is a replay of the same draws, not their absence.
        torch.manual_seed(6)
        e2, _ = _energy_and_grad(energy, tr, "st")
        assert (e2 - e1).abs().max() > 1e-4


def test_qe_gradient_checkpointing_needs_the_packed_encoder(kiwi_path, translators):
    qe = load_kiwi(kiwi_path)
    qe.layerwise_attention.layer_norm = True  # not packable (see tests/unit/test_qe_scoring.py)
    with pytest.raises(QeebmError, match="qe.gradient_checkpointing"):
        energy_for(qe, translators["nllb"], gradient_checkpointing=True)


@pytest.mark.parametrize("relaxation", ["st", "softmax", "gumbel-st"])
@pytest.mark.parametrize("family", FAMILIES)
def test_energy_on_the_content_rows_equals_the_full_logits(kiwi, translators, family, relaxation):
    """The energy takes the translator's logits at its content steps only ([N, V], as
    ``output_rows`` makes them); value and gradient equal those of the full [B, T, V] logits."""
    tr = translators[family]
    energy = energy_for(kiwi, tr)
    ids, mask = emitted(tr, TEXTS)
    content = energy.bridge.content_mask(ids, mask)
    assert content.sum() < 0.5 * content.numel()  # mostly padding and specials
    full = torch.randn(*ids.shape, tr.model.config.vocab_size, generator=torch.Generator().manual_seed(0))
    results, floors = [], []
    for logits in (full.clone().requires_grad_(True), full[content].clone().requires_grad_(True)):
        # The step benchmark's bridge floor counts the same distinct steps whichever form it gets.
        timer = bm.PhaseTimer()
        bm.instrument(timer)
        try:
            e = energy(SRCS, ids, mask, logits, relaxation=relaxation, tau=0.7,
                       generator=torch.Generator().manual_seed(3))
        finally:
            timer.restore()
        floors.append(dict(timer._flops))
        (e * torch.linspace(0.5, 1.5, len(e))).sum().backward()
        results.append((e.detach(), logits.grad))
    (e_full, g_full), (e_rows, g_rows) = results
    assert floors[0] == floors[1] and floors[0]["backward"] > 0
    assert (e_full - e_rows).abs().max() < 1e-6
    assert g_full.abs().max() > 1e-3 and not g_full[~content].any()
    assert (g_full[content] - g_rows).abs().max() < 1e-6
    with pytest.raises(ValueError, match="content step"):
        energy(SRCS, ids, mask, full[content][:-1])
