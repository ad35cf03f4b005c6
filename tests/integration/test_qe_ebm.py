"""Method ``qe-ebm`` on tiny random translators and a tiny random CometKiwi: the energy reaches the
translator and never the QE, beta = 0 is SFT exactly, a step against the energy gradient raises the
QE score, QE-dynamic trains exactly the chosen QE parts and resumes exactly, and the published schedule.

The tiny Kiwi is built on the XLM-R-style tokenizer of tests/support/tiny.py, which shares its SentencePiece
model with the tiny mBART-50 tokenizer; the tiny NLLB has its own, so both bridges run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from accelerate.utils import set_seed

import qeebm.qe.bridge
from qeebm.errors import QeebmError
from qeebm.methods import METHODS
from qeebm.methods.diagnostics import term_gradient_stats
from qeebm.methods.qe_ebm import QeEbmConfig, schedule
from qeebm.methods.rl import sequence_logprobs
from qeebm.methods.sampling import sample
from qeebm.training import checkpoint as ckpt
from qeebm.training.loop import count_label_tokens, load_data, load_mono, make_batch, train
from qeebm.translation.translator import Translator

from support.qe import ENERGY_ONLY, qe_config
from support.runs import assert_identical, final_weights, make_config, read_metrics
from support.tiny import tiny_texts, tiny_translator_dir


def build(cfg):
    """Translator, method and one micro-batch of 4 labelled + 4 source-only sentences, as the loop
    would build them, without accelerate (the method gets the bare model)."""
    set_seed(cfg.seed)
    tr = Translator.load(cfg.model)
    method = METHODS[cfg.method](cfg, tr, tr.model)
    train_set, _ = load_data(cfg, tr)
    mono = load_mono(cfg, tr)
    idx = list(range(4))
    batch = make_batch(tr, train_set, idx, count_label_tokens(tr, train_set, idx), len(idx), tr.device, step=1)
    batch.mono, batch.global_mono = mono.src[:4], 4
    return tr, method, batch


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def changed(before: dict, module: torch.nn.Module) -> set[str]:
    return {n for n, p in module.named_parameters() if not torch.equal(before[n], p.detach())}


# ---------------------------------------------------------------------------------- the schedule
def test_published_schedule():
    c = QeEbmConfig()
    # beta = min(1, s / 4000) * 0.001, alpha = 1 - 10 * beta:
    #   s=1: 0.001/4000 = 2.5e-7, alpha 1 - 2.5e-6;  s=400: 1e-4, 0.999;  s=2000: 5e-4, 0.995;
    #   s=4000 and after: 1e-3, 0.99.
    for step, alpha, beta in [(1, 0.9999975, 2.5e-7), (400, 0.999, 1e-4), (2000, 0.995, 5e-4),
                              (4000, 0.99, 1e-3), (10000, 0.99, 1e-3)]:
        assert schedule(step, c) == pytest.approx((alpha, beta), rel=1e-12, abs=1e-15)
    # A fixed alpha, and a constant beta without a ramp.
    assert schedule(7, QeEbmConfig(ce_weight=0.5, energy_weight=0.2, energy_ramp_steps=0)) == (0.5, 0.2)
    assert schedule(50, QeEbmConfig(energy_weight=0.0)) == (1.0, 0.0)
    # alpha = 1 - 10 beta is floored at 0, as the reference code does: energy_weight 50 would otherwise give
    # a negative alpha and the run would maximise the CE. Ramped over 100 steps, beta = 50 s / 100:
    # s=1: beta 0.5, alpha max(0, 1 - 5) = 0.  Unramped beta 0.05: alpha 1 - 0.5 = 0.5.
    assert schedule(1, QeEbmConfig(energy_weight=50.0, energy_ramp_steps=100)) == (0.0, 0.5)
    assert schedule(1, QeEbmConfig(energy_weight=0.05, energy_ramp_steps=0)) == pytest.approx((0.5, 0.05))


def test_bad_settings_fail_before_loading(kiwi_world, tmp_path):
    with pytest.raises(QeebmError, match="train_parts"):
        train(qe_config(kiwi_world, tmp_path / "a", "qe.train_parts=[head,adapter]"))
    with pytest.raises(QeebmError, match="qe.mode"):
        qe_config(kiwi_world, tmp_path / "b", "qe.mode=sometimes")


# ------------------------------------------------------------------------------------ QE-static
@pytest.mark.parametrize("family,lora", [("nllb", False), ("mbart", False), ("mbart", True)])
def test_energy_moves_the_translator_and_never_the_qe(kiwi_world, tmp_path, family, lora):
    cfg = qe_config(kiwi_world, tmp_path / "run", f"model.name_or_path={tiny_translator_dir(family)}",
                    f"model.lora.enabled={str(lora).lower()}", "model.lora.r=4", *ENERGY_ONLY)
    tr, method, batch = build(cfg)
    qe_before, tr_before = snapshot(method.qe), snapshot(tr.model)
    trainable = [p for p in tr.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3, weight_decay=0.0)
    with torch.no_grad():
        rollout = method.rollout(batch)
    out = method.loss(rollout)
    out.loss.backward()
    # Every trainable parameter gets a gradient from the energy alone: no detached path. (LoRA's A
    # matrices are the exception by construction: B starts at zero, so their first gradient is zero.)
    expected = {n for n, p in tr.model.named_parameters() if p.requires_grad and "lora_A" not in n}
    assert {n for n, p in tr.model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0} == expected
    assert all(p.grad is None for p in method.qe.parameters())
    optimizer.step()
    assert changed(tr_before, tr.model) == expected
    assert changed(qe_before, method.qe) == set()
    for key in ("qe-ebm/energy", "qe-ebm/sample_score", "qe-ebm/score_spread", "qe-ebm/len_ratio",
                "qe-ebm/empty_rate", "qe-ebm/copy_rate"):
        assert isinstance(out.metrics[key], float), key
    assert set(out.values) == {"qe-ebm/alpha", "qe-ebm/beta"}  # the step's weights, logged as they are
    # alpha = 0: no CE forward, no CE term.
    assert "qe-ebm/ce" not in out.metrics and set(out.terms) == {"energy"}
    # The energy term is the mean of -score over the M*K samples, and the straight-through value is the
    # score of the emitted text.
    scores = method.energy.score_ids(rollout.src, rollout.mt_ids, rollout.mt_mask)
    assert out.metrics["qe-ebm/energy"] == pytest.approx(-scores.mean().item(), abs=1e-5)
    assert out.loss.item() == pytest.approx(out.metrics["qe-ebm/energy"], abs=1e-6)


@pytest.mark.parametrize("estimator", ["softmax", "gumbel-st", "reinmax", "loo-cv"])
def test_other_estimators_reach_the_translator(kiwi_world, tmp_path, estimator):
    cfg = qe_config(kiwi_world, tmp_path / "run", f"qe_ebm.estimator={estimator}", *ENERGY_ONLY)
    tr, method, batch = build(cfg)
    with torch.no_grad():
        rollout = method.rollout(batch)
    out = method.loss(rollout)
    out.loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in tr.model.parameters())
    assert all(p.grad is None for p in method.qe.parameters())
    # The metric is the emitted text's own score whatever the estimator's forward value.
    scores = method.energy.score_ids(rollout.src, rollout.mt_ids, rollout.mt_mask)
    assert out.metrics["qe-ebm/sample_score"] == pytest.approx(scores.mean().item(), abs=1e-6)
    if estimator in ("reinmax", "loo-cv"):
        # Their value is the exact mean energy; only the gradient differs from straight-through's.
        assert out.metrics["qe-ebm/energy"] == pytest.approx(-scores.mean().item(), abs=1e-5)
        assert out.loss.item() == pytest.approx(out.metrics["qe-ebm/energy"], abs=1e-6)
    if estimator == "loo-cv":
        assert out.values["qe-ebm/cv_weight"] == 1.0  # the first step's weight, before any fit


def test_beta_zero_is_sft_exactly(kiwi_world, tmp_path):
    sft = make_config(kiwi_world["base"], tmp_path / "sft", "optim.max_steps=1", "data.dev.path=")
    qe = qe_config(kiwi_world, tmp_path / "qe", "optim.max_steps=1", "qe_ebm.energy_weight=0.0")
    train(sft)
    train(qe)
    a, b = final_weights(sft.output.run_dir), final_weights(qe.output.run_dir)
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    (ra,), (rb,) = read_metrics(sft.output.run_dir), read_metrics(qe.output.run_dir)
    assert rb["loss"] == ra["loss"] and rb["qe-ebm/alpha"] == 1.0 and rb["qe-ebm/beta"] == 0.0


def test_guard_hits_carry_no_energy(kiwi_world, tmp_path):
    cfg = qe_config(kiwi_world, tmp_path / "g", "qe_ebm.guards=true", "qe_ebm.energy_weight=1.0", "qe_ebm.energy_ramp_steps=0")
    _, method, batch = build(cfg)
    r = method.rollout(batch)
    assert r.keep is not None and r.keep.shape == (r.mt_ids.shape[0],)
    # The logged hit rate is the share of samples dropped.
    assert r.stats["guard/any"] == pytest.approx(1 - r.keep.mean().item())
    energy = lambda keep: method.loss(dataclasses.replace(r, keep=keep)).metrics["qe-ebm/energy"]  # noqa: E731
    every = energy(None)
    half = torch.tensor([1.0, 0.0] * (len(r.keep) // 2))
    # Masking is linear in the samples: the kept and the dropped halves add up to the whole.
    assert energy(half) + energy(1 - half) == pytest.approx(every, abs=1e-6)
    assert energy(torch.zeros_like(r.keep)) == 0.0
    # Without guards nothing is dropped and nothing is checked.
    _, plain, batch = build(qe_config(kiwi_world, tmp_path / "p", "qe_ebm.energy_weight=1.0", "qe_ebm.energy_ramp_steps=0"))
    rp = plain.rollout(batch)
    assert rp.keep is None and not any(k.startswith("guard/") for k in rp.stats)


@pytest.mark.parametrize("family", ["nllb", "mbart"])
def test_step_against_the_energy_gradient_raises_the_qe_score(kiwi_world, tmp_path, family):
    # The softmax relaxation's value moves with the translator (straight-through's is the fixed
    # score of the emitted text), so the same samples' relaxed QE score must rise after a small step.
    cfg = qe_config(kiwi_world, tmp_path / "run", f"model.name_or_path={tiny_translator_dir(family)}",
                    "qe_ebm.estimator=softmax", *ENERGY_ONLY)
    tr, method, batch = build(cfg)
    tr.model.double()
    method.energy.double()
    with torch.no_grad():
        rollout = method.rollout(batch)
    out = method.loss(rollout)
    params = [p for p in tr.model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out.loss, params)
    sq = sum((g * g).sum() for g in grads).item()
    eta = 1e-3 / max(sq, 1e-12) ** 0.5  # a step of length 1e-3 in parameter space
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.sub_(eta * g)
        after = method.loss(rollout)
    # loss = mean energy = -mean score: it falls by about eta * |g|^2 (first order).
    drop = out.loss.item() - after.loss.item()
    assert drop > 0
    assert drop == pytest.approx(eta * sq, rel=0.05)


# ------------------------------------------------------------------- gradient diagnostics, weighting
def _grads(term, params):
    """The gradient of ``term`` by a plain backward pass (what an optimiser would see)."""
    for p in params:
        p.grad = None
    term.backward()
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]


def test_term_gradient_stats_equal_two_backward_passes(kiwi_world, tmp_path):
    cfg = qe_config(kiwi_world, tmp_path / "run", "qe_ebm.ce_weight=0.7", "qe_ebm.energy_weight=0.3", "qe_ebm.energy_ramp_steps=0")
    tr, method, batch = build(cfg)
    tr.model.eval()  # dropout off: the three forward passes below build the same graph
    params = [p for p in tr.model.parameters() if p.requires_grad]
    with torch.no_grad():
        rollout = method.rollout(batch)
    g_ce = _grads(method.loss(rollout).terms["ce"], params)
    g_e = _grads(method.loss(rollout).terms["energy"], params)
    out = method.loss(rollout)
    stats = term_gradient_stats(out.terms, params)
    norm = lambda g: sum((x.double() ** 2).sum() for x in g).sqrt().item()  # noqa: E731
    dot = sum((a.double() * b.double()).sum() for a, b in zip(g_ce, g_e)).item()
    assert stats["grad_ce"] == pytest.approx(norm(g_ce), rel=1e-5)
    assert stats["grad_energy"] == pytest.approx(norm(g_e), rel=1e-5)
    assert stats["ratio_energy"] == pytest.approx(norm(g_e) / norm(g_ce), rel=1e-5)
    assert stats["cos_energy"] == pytest.approx(dot / (norm(g_e) * norm(g_ce)), abs=1e-5)
    # The terms are the weighted parts of the loss and leave .grad alone; the loss still backpropagates.
    assert out.loss.item() == pytest.approx(sum(t.item() for t in out.terms.values()), rel=1e-6)
    for p in params:
        p.grad = None
    out.loss.backward()
    assert all(p.grad is not None for p in params)


def test_relative_weighting_hits_rho_and_is_scale_free(kiwi_world, tmp_path):
    cfg = qe_config(kiwi_world, tmp_path / "run", "qe_ebm.weighting=relative", "qe_ebm.rho=0.1", "qe_ebm.energy_ramp_steps=0")
    tr, method, batch = build(cfg)
    tr.model.eval()
    params = [p for p in tr.model.parameters() if p.requires_grad]
    with torch.no_grad():
        rollout = method.rollout(batch)
    out = method.loss(rollout)
    stats = term_gradient_stats(out.terms, params)
    assert stats["ratio_energy"] == pytest.approx(0.1, abs=1e-3)
    update = torch.autograd.grad(out.loss, params)
    # Doubling the QE's score scale doubles the energy's gradient; beta halves, the update stays.
    head = [m for m in method.qe.estimator.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        head.weight.mul_(2)
        head.bias.mul_(2)
    method.grad_ratio = None  # measure again
    doubled = method.loss(rollout)
    assert doubled.metrics["qe-ebm/energy"] == pytest.approx(2 * out.metrics["qe-ebm/energy"], rel=1e-6)
    assert doubled.values["qe-ebm/beta"] == pytest.approx(out.values["qe-ebm/beta"] / 2, rel=1e-6)
    for a, b in zip(update, torch.autograd.grad(doubled.loss, params)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-8)


def test_relative_weighting_backward_reuses_the_measured_gradients(kiwi_world, tmp_path, monkeypatch):
    """The loss of a measuring step carries alpha * grad CE + beta * grad E (already computed for
    beta), so its backward does not traverse the QE again; value and gradient equal those of the
    plain weighted sum, and accelerate-style scaling of the loss scales the gradient."""
    cfg = qe_config(kiwi_world, tmp_path / "run", "qe_ebm.weighting=relative", "qe_ebm.rho=0.3", "qe_ebm.energy_ramp_steps=0")
    tr, method, batch = build(cfg)
    params = [p for p in tr.model.parameters() if p.requires_grad]
    with torch.no_grad():
        rollout = method.rollout(batch)
    out = method.loss(rollout)
    assert method.ratio_step == 1  # this call measured
    plain = sum(out.terms.values())
    assert out.loss.item() == plain.item()
    passes = []  # backward passes through the straight-through bridge into the QE
    zero_forward = qeebm.qe.bridge._ZeroForwardProduct
    original = zero_forward.backward
    monkeypatch.setattr(zero_forward, "backward", staticmethod(lambda ctx, g: passes.append(1) or original(ctx, g)))
    want = torch.autograd.grad(plain, params, retain_graph=True)
    assert passes, "the plain sum backpropagates through the QE"
    passes.clear()
    got = torch.autograd.grad(3.0 * out.loss, params)
    assert not passes, "the step's loss went through the QE a second time"
    scale = max(float(w.abs().max()) for w in want)
    for g, w in zip(got, want):  # float rounding of sums taken in another order: 1e-6 of the largest entry
        torch.testing.assert_close(g, 3.0 * w, rtol=1e-5, atol=3e-6 * scale)
    # A step that reuses the last measurement backpropagates through the graph as before.
    rollout.batch.step = 1
    again = method.loss(rollout)
    assert again.loss.grad_fn is not None and type(again.loss.grad_fn).__name__ == "AddBackward0"


def test_a_measuring_step_hands_the_loop_its_gradient_diagnostics(kiwi_world, tmp_path):
    """When relative weighting measured both terms' gradients, the step's gradient diagnostics come
    from them: equal to the loop's own measurement of the weighted terms (float rounding), and
    None on a step that did not measure (the loop then measures)."""
    cfg = qe_config(kiwi_world, tmp_path / "run", "qe_ebm.weighting=relative", "qe_ebm.rho=0.3", "qe_ebm.energy_ramp_steps=0",
                    "qe_ebm.rho_every=5")
    tr, method, batch = build(cfg)
    params = [p for p in tr.model.parameters() if p.requires_grad]
    with torch.no_grad():
        rollout = method.rollout(batch)
    out = method.loss(rollout)
    want = term_gradient_stats(out.terms, params)
    assert set(out.gradient_stats) == set(want) == {"grad_ce", "grad_energy", "ratio_energy", "cos_energy"}
    for key, value in want.items():
        assert out.gradient_stats[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    assert want["grad_energy"] > 0 and abs(want["cos_energy"]) < 1
    rollout.batch.step = 2  # not due: beta from the last measurement, no gradients in hand
    assert method.loss(rollout).gradient_stats is None


def test_relative_weighting_reuses_its_measurement_between_due_steps(kiwi_world, tmp_path):
    cfg = qe_config(kiwi_world, tmp_path / "run", "qe_ebm.weighting=relative", "qe_ebm.rho_every=3", "qe_ebm.energy_ramp_steps=0")
    tr, method, batch = build(cfg)
    with torch.no_grad():
        rollout = method.rollout(batch)
    method.loss(rollout)
    assert method.ratio_step == 1
    measured = method.grad_ratio
    method.grad_ratio = 123.0  # a stand-in measurement: steps 2 and 3 must use it, step 4 replace it
    for step, expected_step, ratio in ((2, 1, 123.0), (3, 1, 123.0), (4, 4, measured)):
        rollout.batch.step = step
        out = method.loss(rollout)
        assert method.ratio_step == expected_step
        assert method.grad_ratio == pytest.approx(ratio, rel=1e-9)
        # beta = rho * alpha * ratio (no ramp, alpha 1, rho 0.1), the micro-batch's whole step
        assert out.values["qe-ebm/beta"] == pytest.approx(0.1 * ratio, rel=1e-9)
    state = method.state_dict()
    assert state["grad_ratio"] == method.grad_ratio and state["ratio_step"] == 4


def test_relative_weighting_needs_a_ce_term(kiwi_world, tmp_path):
    with pytest.raises(QeebmError, match="ce_weight must be > 0"):
        train(qe_config(kiwi_world, tmp_path / "a", "qe_ebm.weighting=relative", "qe_ebm.ce_weight=0"))


def test_straight_through_sgd_raises_the_expected_qe_score(kiwi_world, tmp_path):
    # Energy only, a few steps of plain SGD on one fixed batch. Straight-through's gradient is that of
    # the first-order expansion of the expected score around each sample, so the translator must move
    # towards what the QE prefers: (1) its probability mass over a fixed set of its own samples of
    # those sources shifts towards the higher-scored ones (the self-normalised importance-weighted
    # mean score rises), and (2) fresh samples drawn with the same seeds score higher. The tiny random QE is
    # nearly flat (gradient norm ~1e-3), hence the large rate; with the sign flipped both fall.
    cfg = qe_config(kiwi_world, tmp_path / "run", *ENERGY_ONLY)
    tr, method, batch = build(cfg)
    params = [p for p in tr.model.parameters() if p.requires_grad]

    def draw(seed: int):
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            drawn = sample(tr, batch.mono, 32, method.gen, decode=False)
            mask = tr.teacher_forcing(drawn.sequences)["labels"] != -100
            return drawn, method.energy.score_ids(drawn.src, drawn.tokens, mask).view(len(batch.mono), 32)

    def logp(drawn) -> torch.Tensor:
        with torch.no_grad():
            logits = tr.model(input_ids=drawn.input_ids, attention_mask=drawn.attention_mask,
                              decoder_input_ids=drawn.decoder_input_ids).logits
            return sequence_logprobs(logits, drawn.tokens, drawn.mask)[1].view(len(batch.mono), 32)

    def fresh() -> float:  # 4 x 32 fresh samples of each source, the same seeds before and after
        return sum(draw(seed)[1].mean().item() for seed in range(1, 5)) / 4

    fixed, fixed_scores = draw(0)
    logp_before, fresh_before = logp(fixed), fresh()
    optimizer = torch.optim.SGD(params, lr=50.0)
    for _ in range(5):
        with torch.no_grad():
            rollout = method.rollout(batch)
        optimizer.zero_grad()
        method.loss(rollout).loss.backward()
        optimizer.step()
    weights = torch.softmax(logp(fixed) - logp_before, dim=1)  # p_new / p_old, normalised per source
    assert (weights * fixed_scores).sum(1).mean().item() > fixed_scores.mean().item()
    assert fresh() > fresh_before


# ----------------------------------------------------------------------------------- QE-dynamic
@pytest.mark.parametrize("parts", [["head"], ["layerwise"], ["lora"], ["head", "layerwise", "lora"]])
def test_qe_update_changes_only_the_chosen_parts(kiwi_world, tmp_path, parts):
    cfg = qe_config(kiwi_world, tmp_path / "run", "qe.mode=dynamic", "qe.warmup_steps=0", "qe.lr=1e-2",
                    f"qe.train_parts=[{','.join(parts)}]")
    tr, method, batch = build(cfg)
    qe_before, tr_before = snapshot(method.qe), snapshot(tr.model)
    metrics = method.before_step([batch], lambda t: t)
    assert set(metrics) == {"qe-ebm/qe_loss", "qe-ebm/ref_above_samples", "qe-ebm/ref_score_above_samples"}
    moved = changed(qe_before, method.qe)
    prefixes = {"head": "estimator.", "layerwise": "layerwise_attention.", "lora": "encoder.model."}
    for name in moved:
        assert any(name.startswith(prefixes[p]) for p in parts), name
    for part in parts:
        assert any(n.startswith(prefixes[part]) for n in moved), part
    if "lora" in parts:
        # B starts at zero, so A gets no gradient on the first update; B must move everywhere.
        lora_b = {n for n in qe_before if "lora_B" in n}
        assert lora_b and lora_b <= moved
        assert not any("lora_" not in n for n in moved if n.startswith("encoder."))
    assert changed(tr_before, tr.model) == set()
    assert all(p.grad is None for p in tr.model.parameters())
    # The NMT phase afterwards leaves no gradient on the QE.
    with torch.no_grad():
        rollout = method.rollout(batch)
    method.loss(rollout).loss.backward()
    assert all(p.grad is None for p in method.qe.parameters())


def test_margin_loss_and_update_schedule(kiwi_world, tmp_path):
    cfg = qe_config(kiwi_world, tmp_path / "run", "qe.mode=dynamic", "qe.warmup_steps=2", "qe.interval=2",
                    "qe.loss=margin", "qe.margin=0.5", "qe.train_parts=[head]")
    tr, method, batch = build(cfg)
    assert [s for s in range(1, 9) if method.dynamic_qe.update_due(s)] == [4, 6, 8]
    loss, stats = method.qe_loss(batch)
    # Every hinge is at least margin - (score gap); the random QE scores differ by far less than 0.5.
    assert loss.item() > 0.4 and 0.0 <= stats["qe-ebm/ref_above_samples"] <= 1.0
    before = snapshot(method.qe)
    assert method.before_step([batch], lambda t: t) == {}  # step 1: still warming up
    assert changed(before, method.qe) == set()


def straight_and_resumed(kiwi_world, tmp_path, common: list[str]):
    """Run A for 4 steps straight, run B for 2 steps and then resumed to 4 (checkpoints every 2);
    assert their step-4 model, optimiser and method states identical. Returns a loader of run
    ``A``'s or ``B``'s step-4 checkpoint files and both runs' metrics."""
    train(qe_config(kiwi_world, tmp_path / "A", *common, "optim.max_steps=4"))
    train(qe_config(kiwi_world, tmp_path / "B", *common, "optim.max_steps=2"))
    assert train(qe_config(kiwi_world, tmp_path / "B", *common, "optim.max_steps=4")).step == 4

    def load(run: str, name: str):
        return torch.load(ckpt.step_dir(tmp_path / run / "checkpoints", 4) / name, weights_only=True)

    for name in ("model.pt", "optimizer.pt", "method.pt"):
        assert_identical(load("A", name), load("B", name), name)
    return load, read_metrics(tmp_path / "A"), read_metrics(tmp_path / "B")


def test_dynamic_run_resumes_exactly(kiwi_world, tmp_path):
    # Dropout on, so the result also depends on the restored RNG states; QE updates from step 2 on.
    common = ["qe.mode=dynamic", "qe.warmup_steps=1", "model.dropout=null", "output.save_every=2"]
    load, a, b = straight_and_resumed(kiwi_world, tmp_path, common)
    state = load("A", "method.pt")
    assert state["qe"] and state["qe_optimizer"]["state"]
    # The QE really trained: its head differs from the checkpoint it started from.
    from qeebm.qe.models import load_qe

    start = dict(load_qe(str(kiwi_world["kiwi"])).named_parameters())
    assert any(not torch.equal(start[n], v) for n, v in state["qe"].items() if n in start)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert [r.get("qe-ebm/qe_loss") for r in a] == [r.get("qe-ebm/qe_loss") for r in b]
    assert "qe-ebm/qe_loss" not in a[0] and "qe-ebm/qe_loss" in a[1]


@pytest.mark.parametrize("estimator", ["reinmax", "loo-cv"])
def test_estimator_run_resumes_exactly(kiwi_world, tmp_path, estimator):
    # loo-cv's weight is fitted on the previous step: a run stopped after step 2 must carry step 2's
    # sums into step 3 as the straight run does. Dropout on, so the RNG states matter too.
    common = [f"qe_ebm.estimator={estimator}", "model.dropout=null", "output.save_every=2", "qe_ebm.ce_weight=1.0",
              "qe_ebm.energy_weight=1.0", "qe_ebm.energy_ramp_steps=0"]
    load, a, b = straight_and_resumed(kiwi_world, tmp_path, common)
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    if estimator == "loo-cv":
        weights = [r["qe-ebm/cv_weight"] for r in a]
        assert weights == [r["qe-ebm/cv_weight"] for r in b]
        assert weights[0] == 1.0 and weights[1] != 1.0  # fitted from step 2 on
        assert load("A", "method.pt")["cv_weight"]["pending_step"] == 4


def _judged_rows(path: Path) -> Path:
    from qeebm.qe.heldout import write_judged

    texts = tiny_texts(24, seed=9)
    rows = [(src, mt, mt, i / 11) for i, (src, mt) in enumerate(zip(texts[0::2], texts[1::2]))]
    return write_judged(path, rows)


def test_heldout_correlation_is_measured_on_logged_steps_every_n_updates(kiwi_world, tmp_path):
    from qeebm.qe.heldout import HeldoutProbe

    heldout = _judged_rows(tmp_path / "heldout.tsv")
    cfg = qe_config(kiwi_world, tmp_path / "run", "qe.mode=dynamic", "qe.warmup_steps=0", "qe.lr=1e-2",
                    "qe.train_parts=[head]", f"qe.heldout_path={heldout}", "qe.heldout_every=2",
                    "qe.heldout_max_rows=10", "logging.every=1")
    tr, method, batch = build(cfg)
    probe = HeldoutProbe(heldout, max_rows=10)
    measured = {}
    for step in range(1, 6):
        batch.step = step
        metrics = method.before_step([batch], lambda t: t)
        assert 0.0 <= metrics["qe-ebm/ref_score_above_samples"] <= 1.0
        if "qe-ebm/heldout_pearson" in metrics:
            # The QE after this step's update, scored directly: the same numbers.
            direct = probe.measure(method.qe)
            assert metrics["qe-ebm/heldout_pearson"] == pytest.approx(direct["pearson"], abs=1e-9)
            assert metrics["qe-ebm/heldout_spearman"] == pytest.approx(direct["spearman"], abs=1e-9)
            measured[step] = metrics["qe-ebm/heldout_updates"]
    assert measured == {1: 1, 3: 3, 5: 5}


def test_heldout_path_auto_is_the_file_beside_the_qe_when_there_is_one(tmp_path):
    from qeebm.config import QEConfig
    from qeebm.qe.dynamic import heldout_path

    q = QEConfig(path=str(tmp_path / "qe" / "kiwi"), heldout_path="auto")
    assert heldout_path(q) == ""
    _judged_rows(tmp_path / "qe" / "heldout.tsv")
    assert heldout_path(q) == str(tmp_path / "qe" / "heldout.tsv")
    assert heldout_path(QEConfig(heldout_path="rows.jsonl")) == "rows.jsonl" and heldout_path(QEConfig()) == ""


def test_heldout_metrics_reach_metrics_jsonl_and_a_bad_file_fails_first(kiwi_world, tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("src\tmt\tscore\na\tb\t0.5\nc\td\tmany\n")
    with pytest.raises(QeebmError, match=f"{bad}:3: 'score' is not a number"):
        train(qe_config(kiwi_world, tmp_path / "bad", "qe.mode=dynamic", f"qe.heldout_path={bad}"))
    with pytest.raises(QeebmError, match=f"no such file: {tmp_path / 'nowhere.tsv'}"):
        train(qe_config(kiwi_world, tmp_path / "bad", "qe.mode=dynamic", f"qe.heldout_path={tmp_path / 'nowhere.tsv'}"))
    heldout = _judged_rows(tmp_path / "heldout.tsv")
    # Warm-up 2 = logging.every: the first measurement is of the QE as loaded, the next after 2 updates.
    train(qe_config(kiwi_world, tmp_path / "run", "qe.mode=dynamic", "qe.warmup_steps=2", "optim.max_steps=4",
                    "logging.every=2", f"qe.heldout_path={heldout}", "qe.heldout_every=1"))
    records = {r["step"]: r for r in read_metrics(tmp_path / "run")}
    assert sorted(records) == [2, 4]
    assert records[2]["qe-ebm/heldout_updates"] == 0 and records[4]["qe-ebm/heldout_updates"] == 2
    assert "qe-ebm/ref_above_samples" not in records[2] and "qe-ebm/ref_score_above_samples" in records[4]
    for r in records.values():
        assert -1.0 <= r["qe-ebm/heldout_pearson"] <= 1.0 and -1.0 <= r["qe-ebm/heldout_spearman"] <= 1.0


# ------------------------------------------------------------------------------------------- DDP
DDP_SCRIPT = '''
import sys
from pathlib import Path

import torch

from qeebm.config import load_config
from qeebm.training.loop import train
from qeebm.methods.qe_ebm import QeEbm

original = QeEbm.before_step


def recording(self, batches, all_reduce):
    # Every process records its QE after each step's update, to compare across processes.
    out = original(self, batches, all_reduce)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    state = {n: p.detach().clone() for n, p in self.dynamic_qe.params.items()}
    # loo-cv's control-variate weight and its pending sums must agree across processes too.
    state["cv_weight"] = torch.tensor([self.cv.value, *self.cv.pending], dtype=torch.float64)
    torch.save(state, Path(self.record_dir) / f"qe-step{batches[0].step}-rank{rank}.pt")
    return out


QeEbm.before_step = recording
cfg = load_config(sys.argv[1], sys.argv[2:])
QeEbm.record_dir = cfg.output.run_dir
train(cfg)
'''


@pytest.mark.usefixtures("one_launch_at_a_time")
@pytest.mark.slow
def test_ddp_processes_hold_the_same_qe(kiwi_world, tmp_path):
    """Two gloo processes in QE-dynamic mode with the loo-cv estimator: after every QE update both
    hold the same QE weights and the same control-variate weight and sums, and the translator's
    final weights come from a run that finished on both."""
    from support.runs import finish, launch_two

    # Relative weighting too: its measurement is all-reduced inside the loss (a collective every
    # process must reach), and the logged gradient diagnostics run beside DDP's own backward.
    # The held-out measurement runs on every process and the loop sums metrics over processes.
    heldout = _judged_rows(tmp_path / "heldout.tsv")
    cfg = qe_config(kiwi_world, tmp_path / "run", "qe.mode=dynamic", "qe.warmup_steps=0", "optim.max_steps=3",
                    "optim.grad_accum=2", "qe.max_grad_norm=1.0", "qe_ebm.weighting=relative", "qe_ebm.rho_every=2",
                    "qe_ebm.estimator=loo-cv",
                    f"qe.heldout_path={heldout}", "qe.heldout_every=2")
    config = tmp_path / "run.yaml"
    from qeebm.config import dump_config

    config.write_text(dump_config(cfg), encoding="utf-8")
    script = tmp_path / "record.py"
    script.write_text(DDP_SCRIPT, encoding="utf-8")
    proc = launch_two(config, tmp_path / "run", script=script)
    out = finish(proc, 300)
    assert proc.returncode == 0, out[-4000:]
    assert "2 processes x 2 micro-steps" in (tmp_path / "run" / "train.log").read_text(encoding="utf-8")
    for step in (1, 2, 3):
        a = torch.load(tmp_path / "run" / f"qe-step{step}-rank0.pt", weights_only=True)
        b = torch.load(tmp_path / "run" / f"qe-step{step}-rank1.pt", weights_only=True)
        assert a.keys() == b.keys() and a
        assert [n for n in a if not torch.equal(a[n], b[n])] == [], step
    first = torch.load(tmp_path / "run" / "qe-step1-rank0.pt", weights_only=True)
    last = torch.load(tmp_path / "run" / "qe-step3-rank0.pt", weights_only=True)
    assert any(not torch.equal(first[n], last[n]) for n in first if n != "cv_weight")
    # Step 2's sums hold both processes' (and both micro-steps') samples.
    assert last["cv_weight"][2] > 0
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["diag/ratio_energy"] > 0 and r["qe-ebm/beta"] > 0 for r in rows)
    assert [r.get("qe-ebm/heldout_updates") for r in rows] == [1, None, 3]
    assert all(-1 <= r["qe-ebm/heldout_pearson"] <= 1 for r in rows if "qe-ebm/heldout_pearson" in r)


def test_validation_scores_with_the_static_qe_it_already_holds(kiwi_world, tmp_path, monkeypatch):
    """QE-static's validation Kiwi is the energy's own QE object, not a second load of the same
    weights; QE-dynamic's QE changes, so its validation loads the checkpoint."""
    import qeebm.qe.models
    from qeebm.training.loop import ValidationScorers

    cfg = qe_config(kiwi_world, tmp_path / "run", "eval.qe_metrics=[kiwi]")
    _, method, _ = build(cfg)
    assert method.frozen_qes() == {cfg.qe.path: method.qe}
    dynamic = qe_config(kiwi_world, tmp_path / "dyn", "qe.mode=dynamic")
    assert build(dynamic)[1].frozen_qes() == {}

    def no_load(path):
        raise AssertionError(f"loaded {path} again")

    monkeypatch.setattr(qeebm.qe.models, "load_qe", no_load)
    scorers = dict(ValidationScorers(cfg, torch.device("cpu"), shared=method.frozen_qes()).items())
    assert scorers["kiwi"].model is method.qe
    with pytest.raises(AssertionError, match="loaded"):  # nothing shared: it loads
        dict(ValidationScorers(cfg, torch.device("cpu")).items())
