"""qeebm.analysis.gradient_bias: the unbiased score-function estimate and the noise-corrected agreement that
measure how far QE-EBM's relaxed gradients point where the expected QE score goes."""

from __future__ import annotations

import math

import pytest
import torch

from qeebm.analysis.gradient_bias import Draws, agreement, cosine, draw, relaxed_gradient, score_function_gradient
from qeebm.config import GenerationConfig, ModelConfig
from qeebm.methods.rl import policy_logits, sequence_logprobs
from qeebm.methods.sampling import sample
from qeebm.translation.translator import Translator

from support.tiny import tiny_translator_dir


def test_agreement_corrects_the_cosine_for_the_noise_of_both_estimates():
    g = torch.Generator().manual_seed(0)
    truth = torch.randn(20000, generator=g)
    noisy = lambda scale: truth + scale * torch.randn(20000, generator=g)  # noqa: E731
    # Two unbiased estimates of the same direction with independent noise: the raw cosine is far
    # below 1, the corrected one is 1 to within the sampling error.
    a = agreement((noisy(1.5), noisy(1.5)), (noisy(2.0), noisy(2.0)))
    assert a["cosine"] < 0.4 and a["corrected"] == pytest.approx(1.0, abs=0.05)
    # The opposite direction: -1; an unrelated one: 0.
    assert agreement((-noisy(1.5), -noisy(1.5)), (noisy(2.0), noisy(2.0)))["corrected"] == pytest.approx(-1.0, abs=0.05)
    other = torch.randn(20000, generator=g)
    unrelated = agreement((other + torch.randn(20000, generator=g), other + torch.randn(20000, generator=g)),
                          (noisy(1.0), noisy(1.0)))
    assert abs(unrelated["corrected"]) < 0.05
    # A split-half cosine that is not positive leaves nothing to correct with.
    assert math.isnan(agreement((truth, -truth), (truth, truth))["corrected"])
    assert cosine(truth, 2 * truth) == pytest.approx(1.0)


@pytest.fixture(scope="module")
def translator():
    return Translator.load(ModelConfig(name_or_path=str(tiny_translator_dir("nllb")), dropout=0.0))


def draws(translator, scores_of, n=8):
    torch.manual_seed(0)
    src = ["the cat sees a dog.", "i am here."]
    s = sample(translator, src, n, GenerationConfig(num_beams=1, do_sample=True, max_new_tokens=8), decode=False)
    scores = torch.tensor([scores_of(i) for i in range(len(src) * n)], dtype=torch.float32)
    return Draws(samples=s, scores=scores, half=torch.arange(n).remainder(2).repeat(len(src)), n=n, refs=None)


def test_score_function_gradient_is_the_leave_one_out_estimate(translator):
    d = draws(translator, lambda i: float((i * 37) % 11) / 10)
    got = score_function_gradient(translator, d, 0, chunk=3)
    # The same estimate one sample at a time: sum_i (Q_i - mean of the others in its source's half)
    # * grad log p(y_i) / (samples per half).
    model = translator.model
    params = [p for p in model.parameters() if p.requires_grad]
    rows = (d.half == 0).nonzero().squeeze(1).tolist()
    m = d.n // 2
    want = torch.zeros(sum(p.numel() for p in params), dtype=torch.float64)
    s = d.samples
    for source in range(2):
        mine = [r for r in rows if r // d.n == source]
        for r in mine:
            b = sum(d.scores[o].item() for o in mine if o != r) / (m - 1)
            logits = model.eval()(input_ids=s.input_ids[r:r + 1], attention_mask=s.attention_mask[r:r + 1],
                                  decoder_input_ids=s.sequences[r:r + 1, :-1]).logits
            _, logp = sequence_logprobs(policy_logits(logits, 1.0, s.suppress), s.sequences[r:r + 1, 1:], s.mask[r:r + 1])
            grads = torch.autograd.grad(logp.sum(), params, allow_unused=True)
            flat = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])
            want += (d.scores[r].item() - b) * flat.double() / m
    assert torch.allclose(got.double(), want, atol=1e-6, rtol=1e-4)
    assert got.abs().sum() > 0


def test_a_constant_score_has_no_score_function_gradient(translator):
    d = draws(translator, lambda i: 0.7)
    assert score_function_gradient(translator, d, 1).abs().max() == 0


def test_draw_scores_every_sample_and_the_relaxed_gradient_is_qe_ebms(translator):
    """draw() lays the samples out source-major with their exact scores, and the straight-through
    gradient equals the gradient of QE-EBM's energy term on the same rows."""
    from qeebm.qe.energy import load_energy
    from qeebm.translation.translator import output_rows

    from support.qe import kiwi_dir

    energy = load_energy(str(kiwi_dir()), translator, freeze=True)
    src = ["the cat sees a dog.", "i am here."]
    torch.manual_seed(1)
    d = draw(translator, energy, src, 6, max_new_tokens=8, chunk=4)
    s = d.samples
    assert s.src == [x for x in src for _ in range(6)] and d.scores.shape == (12,)
    mt_mask = translator.teacher_forcing(s.sequences)["labels"] != -100
    texts = energy.texts(s.sequences[:, 1:], mt_mask)
    from support.qe import predict

    assert d.scores.tolist() == pytest.approx(predict(energy.qe, s.src, texts), abs=1e-5)
    got = relaxed_gradient(translator, energy, d, 0, "st", chunk=2)
    model = translator.model
    params = [p for p in model.parameters() if p.requires_grad]
    rows = (d.half == 0).nonzero().squeeze(1)
    content = energy.bridge.content_mask(s.sequences[rows, 1:], mt_mask[rows])
    with output_rows(model.eval(), content):
        logits = model(input_ids=s.input_ids[rows], attention_mask=s.attention_mask[rows],
                       decoder_input_ids=s.sequences[rows, :-1]).logits
    e = energy([s.src[i] for i in rows.tolist()], s.sequences[rows, 1:], mt_mask[rows], logits)
    grads = torch.autograd.grad(-e.sum() / 3, params, allow_unused=True)
    want = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-4)


def test_signal_to_noise_of_synthetic_estimates():
    # 400 estimates = mu + N(0, sigma^2 I) in 1,000 dimensions: SNR = |mu|^2 / (1000 sigma^2) = 0.25;
    # the estimator is unbiased (corrected cosine 1); one estimate's cosine with the truth is
    # |mu| / sqrt(|mu|^2 + 1000 sigma^2) = sqrt(0.2). A biased estimator (a rotated mean) shows it.
    from qeebm.analysis.gradient_bias import signal_to_noise

    g = torch.Generator().manual_seed(0)
    mu = torch.zeros(1000, dtype=torch.float64)
    mu[:250] = 1.0  # |mu|^2 = 250
    sigma = 1.0
    truth_halves = tuple(mu + 0.2 * torch.randn(1000, generator=g, dtype=torch.float64) for _ in range(2))
    est = mu + sigma * torch.randn(400, 1000, generator=g, dtype=torch.float64)
    stats = signal_to_noise(est, truth_halves)
    assert stats["snr"] == pytest.approx(0.25, rel=0.1)
    assert stats["corrected"] == pytest.approx(1.0, abs=0.05)
    assert stats["single_cosine"] == pytest.approx(math.sqrt(0.2), abs=0.02)
    biased = torch.zeros(1000, dtype=torch.float64)
    biased[125:375] = 1.0  # half along mu, half orthogonal: cosine 0.5
    assert signal_to_noise(biased + sigma * torch.randn(400, 1000, generator=g, dtype=torch.float64),
                           truth_halves)["corrected"] == pytest.approx(0.5, abs=0.05)


def test_group_estimates_are_the_training_step_estimators(translator):
    """estimate() with 'reinforce' over one half's rows is score_function_gradient; a relaxation's is
    relaxed_gradient; loo-cv at weight 0 is leave-one-out REINFORCE on the same rows."""
    from qeebm.analysis.gradient_bias import estimate, group_rows, qe_cost
    from qeebm.qe.energy import load_energy

    from support.qe import kiwi_dir

    energy = load_energy(str(kiwi_dir()), translator, freeze=True)
    torch.manual_seed(2)
    d = draw(translator, energy, ["the cat sees a dog.", "i am here."], 8, max_new_tokens=8)
    rows = group_rows(d, 4, 1)  # samples 4..7 of each source
    assert rows.tolist() == [4, 5, 6, 7, 12, 13, 14, 15]
    reinforce = estimate(translator, energy, d, rows, 4, "reinforce")
    assert torch.allclose(estimate(translator, energy, d, rows, 4, "loo-cv", eta=0.0), reinforce, atol=1e-6)
    assert not torch.allclose(estimate(translator, energy, d, rows, 4, "loo-cv", eta=1.0), reinforce, atol=1e-6)
    # The halves of draw() alternate; estimate() on a half's rows with k = n / 2 is the half's estimate.
    half = (d.half == 0).nonzero().squeeze(1)
    assert torch.allclose(estimate(translator, energy, d, half, 4, "reinforce"),
                          score_function_gradient(translator, d, 0), atol=1e-6, rtol=1e-4)
    assert torch.allclose(estimate(translator, energy, d, half, 4, "st"), relaxed_gradient(translator, energy, d, 0, "st"),
                          atol=1e-6, rtol=1e-4)
    assert qe_cost("reinforce", 8) == 8 and qe_cost("st", 2) == 6 and qe_cost("softmax", 2) == 8
