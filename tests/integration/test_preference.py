"""Methods ``dpo`` and ``cpo`` on tiny translators: the losses equal TRL's and hand arithmetic, the
pair is the QE's best clean candidate against its worst, sequence log-probs leave out the language
code and keep </s>, DPO starts at log 2 against its reference (a frozen copy, or with LoRA the
adapter disabled), both families and LoRA train, and an interrupted run resumes exactly."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from accelerate.utils import set_seed
from transformers import AutoModelForSeq2SeqLM

from qeebm.errors import QeebmError
from qeebm.methods import METHODS, common
from qeebm.methods.preference import GUARDED, TIE, cpo_loss, dpo_loss, pair_logprobs, preference_pair
from qeebm.training import checkpoint as ckpt
from qeebm.training.loop import count_label_tokens, load_data, load_mono, make_batch, train
from qeebm.translation.translator import Translator

from support.runs import (
    assert_identical,
    assert_only_adapters_trained,
    final_weights,
    make_config,
    read_metrics,
    write_tiny_world_with_mono,
)
from support.tiny import tiny_translator_dir

SMALL = ["preference.num_candidates=3", "preference.max_new_tokens=8", "data.dev.path="]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    from support.qe import kiwi_dir

    return {"base": write_tiny_world_with_mono(tmp_path_factory.mktemp("world")), "kiwi": kiwi_dir()}


def config(world, run_dir: Path, method: str, *overrides: str):
    return make_config(world["base"], run_dir, f"method={method}", *SMALL, f"qe.path={world['kiwi']}", *overrides)



def build(cfg, n: int = 4):
    """Translator, method and one micro-batch of ``n`` labelled + ``n`` source-only sentences, as the
    loop builds them, without accelerate."""
    set_seed(cfg.seed)
    tr = Translator.load(cfg.model)
    method = METHODS[cfg.method](cfg, tr, tr.model)
    train_set, _ = load_data(cfg, tr)
    idx = list(range(n))
    batch = make_batch(tr, train_set, idx, count_label_tokens(tr, train_set, idx), n, tr.device, step=1)
    batch.mono, batch.global_mono = load_mono(cfg, tr).src[:n], n
    return tr, method, batch


def finished(method, batch):
    (rollout,) = method.finish_rollouts([method.rollout(batch)], gather=lambda t: t)
    return rollout


# ----------------------------------------------------------------------------------------------
# The losses


LOGPS = torch.tensor([[-10.0, -12.0, -11.0, -11.0], [-3.5, -2.0, -4.0, -2.5], [-40.0, -41.5, -30.0, -33.0],
                      [-7.25, -7.25, -6.0, -8.0]], dtype=torch.float64)  # chosen, rejected, ref chosen, ref rejected


@pytest.mark.parametrize("beta", [0.1, 0.5, 2.0])
def test_losses_equal_trls(beta):
    pytest.importorskip("trl", reason="the parity test needs trl (the dev extra)")
    from trl.trainer.cpo_trainer import CPOTrainer
    from trl.trainer.dpo_trainer import DPOTrainer

    c, r, rc, rr = LOGPS.unbind(1)
    accelerator = SimpleNamespace(device=torch.device("cpu"))
    # Only the attributes TRL 0.23.1's dpo_loss / cpo_loss read, at their defaults: sigmoid loss, no
    # label smoothing, reverse KL, a reference model (DPO), no AlphaPO transform (CPO).
    dpo_self = SimpleNamespace(accelerator=accelerator, beta=beta, label_smoothing=0.0, reference_free=False,
                               f_divergence_type="reverse_kl", f_divergence_params=None)
    cpo_self = SimpleNamespace(accelerator=accelerator, beta=beta, label_smoothing=0.0, alpha=0.0, loss_type="sigmoid")
    for ours, theirs in [(dpo_loss(c, r, rc, rr, beta), DPOTrainer.dpo_loss(dpo_self, c, r, rc, rr, loss_type="sigmoid")),
                         (cpo_loss(c, r, beta), CPOTrainer.cpo_loss(cpo_self, c, r))]:
        for a, b in zip(ours, theirs):
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-12), (a, b)


def test_losses_by_hand():
    # DPO, beta 0.5: chosen -10 against its reference's -11, rejected -12 against -11:
    # logit = (-10 - -12) - (-11 - -11) = 2; loss = -log sigmoid(0.5 * 2) = log(1 + e^-1) = 0.31326168751822286;
    # rewards 0.5 * (-10 - -11) = 0.5 and 0.5 * (-12 - -11) = -0.5.
    losses, chosen, rejected = dpo_loss(*LOGPS[:1].unbind(1), beta=0.5)
    assert losses.item() == pytest.approx(0.31326168751822286, abs=1e-15)
    assert (chosen.item(), rejected.item()) == (0.5, -0.5)
    # Row 4, beta 0.1: chosen and rejected equally likely (-7.25), the reference preferring the chosen
    # (-6 against -8): logit = 0 - (-6 - -8) = -2; loss = -log sigmoid(-0.2) = log(1 + e^0.2) = 0.7981388693815918.
    losses, _, _ = dpo_loss(*LOGPS[3:].unbind(1), beta=0.1)
    assert losses.item() == pytest.approx(0.7981388693815918, abs=1e-15)
    # CPO, beta 0.1: chosen -3.5, rejected -2 (the model prefers the rejected): loss = -log sigmoid(0.1 * -1.5)
    # = log(1 + e^0.15) = 0.770957047789532; rewards 0.1 * -3.5 = -0.35 and 0.1 * -2 = -0.2.
    losses, chosen, rejected = cpo_loss(LOGPS[1:2, 0], LOGPS[1:2, 1], beta=0.1)
    assert losses.item() == pytest.approx(0.770957047789532, abs=1e-15)
    assert (chosen.item(), rejected.item()) == pytest.approx((-0.35, -0.2), abs=1e-15)
    # A policy equal to its reference: every DPO loss is log 2, whatever the log-probs.
    c, r = LOGPS[:, 0], LOGPS[:, 1]
    assert torch.allclose(dpo_loss(c, r, c, r, 0.7)[0], torch.full((4,), math.log(2), dtype=torch.float64))


def test_the_pair_is_the_best_clean_candidate_against_the_worst():
    texts = ["a", "b", "c", "d"]
    # No guard: the highest and the lowest score; ties go to the earlier candidate.
    assert preference_pair(texts, [0.2, 0.9, 0.1, 0.9], [False] * 4) == (1, 2, None)
    assert preference_pair(texts, [0.5, 0.1, 0.1, 0.3], [False] * 4) == (0, 1, None)
    # The top-scoring candidate trips a guard: never chosen, and it ranks below every clean one.
    assert preference_pair(texts, [0.2, 0.9, 0.1, 0.5], [False, True, False, False]) == (3, 1, None)
    # Of two tripping candidates the lower-scoring one is rejected.
    assert preference_pair(texts, [0.2, 0.9, 0.8, 0.5], [False, True, True, False]) == (3, 2, None)
    # Every candidate trips a guard: no pair.
    assert preference_pair(texts, [0.2, 0.9, 0.8, 0.5], [True] * 4)[2] == GUARDED
    # Chosen and rejected the same text, or the same score with no guard between them: no preference.
    assert preference_pair(["x", "x"], [0.1, 0.1], [False, False])[2] == TIE
    assert preference_pair(["x", "y"], [0.4, 0.4], [False, False]) == (0, 0, TIE)
    # The same score, but the rejected one trips a guard: a preference all the same.
    assert preference_pair(["x", "y"], [0.4, 0.4], [False, True]) == (0, 1, None)


# ----------------------------------------------------------------------------------------------
# Pairs and sequence log-probs on tiny translators


@pytest.mark.parametrize("family", ["nllb", "mbart"])
def test_dpo_starts_at_log_two_on_logprobs_without_the_language_code(world, tmp_path, length_scorer, family):
    cfg = config(world, tmp_path / "run", "dpo", f"model.name_or_path={tiny_translator_dir(family)}",
                 "preference.guards=false", "model.dropout=0.1")
    tr, method, batch = build(cfg)
    r = finished(method, batch)
    p, n = r.pairs, len(r.pairs)
    assert n == 4 and p.weight.sum() > 0
    # Every row is [language code, tokens, </s>]; the mask keeps the tokens and </s>.
    eos = tr.tokenizer.eos_token_id
    assert (p.labels[:, 0] == tr.tgt_lang_id).all() and not p.mask[:, 0].any()
    last = p.mask.sum(1)  # the position of </s>: the code sits at 0
    assert (p.labels[torch.arange(2 * n), last] == eos).all()
    assert torch.equal(p.mask.sum(1) + 1, (p.labels != -100).sum(1))
    # The log-probs: log_softmax of the model's logits at each masked label, summed, dropout off.
    model = tr.model.eval()
    logits = model(input_ids=p.input_ids, attention_mask=p.attention_mask, decoder_input_ids=p.decoder_input_ids).logits
    picked = torch.log_softmax(logits.float(), -1).gather(-1, p.labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    expected = (picked * p.mask).sum(1)
    tr.model.train()  # the method turns dropout off itself
    _, got = pair_logprobs_eval(method, p)
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(r.ref_logp, expected, atol=1e-5)
    # The chosen is the longest candidate (the toy QE), the rejected the shortest.
    out = method.loss(r)
    assert out.metrics["dpo/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert out.metrics["dpo/reward_margin"] == pytest.approx(0.0, abs=1e-7)
    assert out.metrics["dpo/reward_accuracy"] == 0.0
    assert out.metrics["dpo/chosen_score"] >= out.metrics["dpo/rejected_score"]
    assert set(out.terms) == {"ce", "preference"}  # DPO: no NLL term by default
    assert torch.allclose(out.loss, out.terms["ce"] + out.terms["preference"])


def pair_logprobs_eval(method, p):
    from qeebm.translation.translator import eval_mode

    with eval_mode(method.model):
        return pair_logprobs(method.model, p)


def test_cpo_nll_is_the_chosen_rows_token_mean_and_terms_add_up(world, tmp_path, length_scorer):
    cfg = config(world, tmp_path / "run", "cpo", "preference.ce_weight=0.3", "preference.nll_weight=2.0",
                 "preference.beta=0.2", "preference.guards=false")
    tr, method, batch = build(cfg)
    r = finished(method, batch)
    out = method.loss(r)
    assert set(out.terms) == {"ce", "preference", "nll"}
    assert torch.allclose(out.loss, sum(out.terms.values()))
    assert out.terms["ce"].item() == pytest.approx(0.3 * out.metrics["cpo/ce"], rel=1e-6)
    assert out.terms["nll"].item() == pytest.approx(2.0 * out.metrics["cpo/chosen_nll"], rel=1e-6)
    # The NLL, as cross-entropy of the pairs' chosen rows without the language code, a token mean.
    p, n = r.pairs, len(r.pairs)
    keep = p.weight.bool()
    labels = p.labels[:n][keep].masked_fill(~p.mask[:n][keep], -100)
    model = tr.model.eval()
    logits = model(input_ids=p.input_ids[:n][keep], attention_mask=p.attention_mask[:n][keep],
                   decoder_input_ids=p.decoder_input_ids[:n][keep]).logits
    nll = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    assert out.metrics["cpo/chosen_nll"] == pytest.approx(nll.item(), rel=1e-5)
    # The preference term: CPO's loss of the policy's log-probs, a mean over the pairs.
    _, logp = pair_logprobs_eval(method, p)
    losses, _, _ = cpo_loss(logp[:n][keep], logp[n:][keep], 0.2)
    assert out.metrics["cpo/loss"] == pytest.approx(losses.mean().item(), rel=1e-5)


def candidates_of(mapping):
    """A teacher whose candidates are given: ``mapping[source]``."""
    return lambda src, gen, n: [list(mapping[s]) for s in src]


def test_a_guard_tripping_candidate_is_never_chosen_and_sources_without_a_preference_train_nothing(
        world, tmp_path, length_scorer):
    cfg = config(world, tmp_path / "run", "dpo", "guards.length_ratio=false")
    tr, method, batch = build(cfg)
    a, b, c, d = batch.mono
    # The toy QE likes length: a copy of the source scores best but trips the copy guard; "" (the
    # empty guard) is the worst. Source c: every candidate trips a guard (the English source of
    # another sentence trips the script guard); d: one text three times.
    fine, good = "хот ном", "хот ном муур"
    method.teacher.candidates = candidates_of({a: [fine, a, good], b: [good, "", fine], c: ["", b, c],
                                               d: [good, good, good]})
    r = finished(method, batch)
    p = r.pairs
    assert p.chosen[:2] == [good, good] and p.rejected[:2] == [a, ""]
    assert p.weight.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert r.skipped == {GUARDED: 1, TIE: 1} and r.counts["pairs"] == 2 and r.counts["sources"] == 4
    out = method.loss(r)
    assert out.metrics["dpo/pairs"] == 0.5
    assert (out.metrics["dpo/skipped_guarded"], out.metrics["dpo/skipped_tie"]) == (0.25, 0.25)
    assert out.values == {"dpo/pairs_total": 2.0, "dpo/skipped_total": 2.0}
    assert (out.metrics["guard/copy"], out.metrics["guard/empty"]) == (2 / 12, 2 / 12)
    # The preference term is the mean over the two pairs alone.
    _, logp = pair_logprobs_eval(method, p)
    losses, _, _ = dpo_loss(logp[:4], logp[4:], r.ref_logp[:4], r.ref_logp[4:], cfg.preference.beta)
    assert out.terms["preference"].item() == pytest.approx(losses[:2].mean().item(), rel=1e-6)
    # The run's totals go on and come back from the state.
    method.finish_rollouts([r], gather=lambda t: t)
    assert method.state_dict()["totals"] == {"pairs": 4, GUARDED: 2, TIE: 2}
    _, other, _ = build(cfg)
    other.load_state_dict(method.state_dict())
    assert other.totals == method.totals


def test_the_reference_joins_the_labelled_sources_candidates(world, tmp_path, monkeypatch):
    refs: set[str] = set()

    class RefScorer:
        kind = "kiwi"

        def score(self, src, mt):
            return [1000.0 if m in refs else float(len(m)) for m in mt]

    monkeypatch.setattr(common, "build_scorer", lambda cfg, device: RefScorer())
    cfg = config(world, tmp_path / "run", "cpo", "preference.pool=labelled", "preference.include_reference=true",
                 "preference.num_candidates=2", "preference.guards=false")
    tr, method, batch = build(cfg)
    refs.update(batch.tgt)
    r = finished(method, batch)
    assert method.needs_mono is False
    assert r.pairs.src == batch.src and r.candidates == 4 * 3
    assert r.pairs.chosen == batch.tgt and r.from_reference.tolist() == [1.0] * 4
    assert method.loss(r).metrics["cpo/chosen_reference"] == 1.0
    # pool both: the source-only sentences first, then the labelled ones (only they have a reference).
    both = config(world, tmp_path / "both", "cpo", "preference.pool=both", "preference.include_reference=true",
                  "preference.guards=false")
    _, method, batch = build(both)
    r = finished(method, batch)
    assert r.pairs.src == batch.mono + batch.src and r.candidates == 4 * 3 + 4 * 4
    assert r.from_reference.tolist() == [0.0] * 4 + [1.0] * 4


# ----------------------------------------------------------------------------------------------
# Training runs


@pytest.mark.parametrize("method", ["dpo", "cpo"])
@pytest.mark.parametrize("family", ["nllb", "mbart"])
def test_two_steps_move_every_parameter(world, tmp_path, method, family):
    cfg = config(world, tmp_path / "run", method, f"model.name_or_path={tiny_translator_dir(family)}",
                 "optim.max_steps=2", "preference.guards=false")
    result = train(cfg)
    start = AutoModelForSeq2SeqLM.from_pretrained(cfg.model.name_or_path)
    ends = dict(AutoModelForSeq2SeqLM.from_pretrained(result.run_dir / "final").named_parameters())
    unchanged = [name for name, p in start.named_parameters() if torch.equal(p, ends[name])]
    assert not unchanged, f"no update reached {unchanged}"
    first, second = read_metrics(cfg.output.run_dir)
    for record in (first, second):
        for key in ("loss", "reward_margin", "reward_accuracy", "chosen_logp", "rejected_logp", "pairs", "ce"):
            assert f"{method}/{key}" in record, key
        # alpha = 1, and CPO's nll_weight 1
        parts = record[f"{method}/ce"] + record[f"{method}/loss"] + record.get(f"{method}/chosen_nll", 0.0)
        assert record["loss"] == pytest.approx(parts, rel=1e-5)
        assert "diag/ratio_preference" in record
    assert (f"{method}/chosen_nll" in first) == (method == "cpo")
    if method == "dpo":
        assert first["dpo/loss"] == pytest.approx(math.log(2), abs=1e-6) and first["dpo/reward_margin"] == 0.0
        assert second["dpo/reward_margin"] != 0.0


@pytest.mark.parametrize("method", ["dpo", "cpo"])
def test_micro_batches_add_up_to_the_full_batch_step(world, tmp_path, method):
    # Beam candidates (no RNG), dropout 0: two micro-batches of 4 train as one batch of 8 does,
    # the means over the step's pairs and chosen tokens included; only float rounding may differ.
    runs = {}
    for accum in (1, 2):
        cfg = config(world, tmp_path / f"accum{accum}", method, f"optim.grad_accum={accum}", "optim.max_steps=2",
                     "preference.candidates=beam", "optim.max_grad_norm=0.5", "preference.guards=false")
        train(cfg)
        runs[accum] = (read_metrics(cfg.output.run_dir), final_weights(cfg.output.run_dir))
    (one, w1), (two, w2) = runs[1], runs[2]
    assert one[0][f"{method}/pairs"] > 0.5  # pairs in both micro-batches
    for a, b in zip(one, two):
        for key in ("loss", f"{method}/loss", f"{method}/reward_margin", f"{method}/pairs", f"{method}/chosen_logp",
                    f"{method}/ce"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key
    assert all(torch.allclose(w1[k], w2[k], atol=1e-6) for k in w1)


def test_lora_dpo_reference_is_the_translator_with_its_adapter_disabled(world, tmp_path, length_scorer, monkeypatch):
    lora = ["model.lora.enabled=true", "model.lora.r=4", "model.lora.dropout=0.1", "model.dropout=0.1"]
    cfg = config(world, tmp_path / "lora", "dpo", *lora, "preference.guards=false")
    tr, method, batch = build(cfg)
    # No second copy: the reference and the teacher are the translator with its adapter disabled.
    assert method.initial.copy is None and method.teacher.model is None
    calls = []
    original = type(tr.model).disable_adapter

    @contextlib.contextmanager
    def counting(self):
        calls.append(1)
        with original(self):
            yield

    monkeypatch.setattr(type(tr.model), "disable_adapter", counting)
    tr.model.train()
    r = finished(method, batch)
    assert calls == [1, 1] and tr.model.training  # candidates, then reference log-probs
    assert method.loss(r).metrics["dpo/loss"] == pytest.approx(math.log(2), abs=1e-6)
    # A trained adapter: the reference is still the initial model, no longer the policy.
    with torch.no_grad():
        for name, q in tr.model.named_parameters():
            if "lora_B" in name:
                q.add_(0.5)
    with method.reference() as ref:
        assert torch.allclose(pair_logprobs(ref, r.pairs)[1], r.ref_logp)
    assert method.loss(r).metrics["dpo/reward_margin"] != pytest.approx(0.0, abs=1e-6)
    # An adapter loaded with weights of its own is no initial model disabled: that takes a copy.
    assert common.InitialPolicy(tr).copy is not None
    # A run changes the adapters only.
    monkeypatch.undo()
    run = config(world, tmp_path / "run", "dpo", *lora, "optim.max_steps=2")
    set_seed(run.seed)
    before = {k: v.clone() for k, v in Translator.load(run.model).model.state_dict().items()}
    train(run)
    assert_only_adapters_trained(before, run.output.run_dir, run.model.lora.alpha / run.model.lora.r)


def test_iterative_dpo_takes_the_teacher_as_reference(world, tmp_path, length_scorer):
    cfg = config(world, tmp_path / "run", "dpo", "preference.refresh_every=1", "preference.reference=teacher",
                 "preference.guards=false")
    tr, method, batch = build(cfg)
    assert method.initial is None and method.teacher.model is not None
    with torch.no_grad():
        for q in tr.model.parameters():
            q.add_(0.05 * torch.randn_like(q))
    # Step 2: the teacher, and so the reference, becomes the translator: log 2 again.
    method.before_step([dataclasses.replace(batch, step=2)], lambda t: t)
    r = finished(method, dataclasses.replace(batch, step=2))
    assert method.loss(r).metrics["dpo/loss"] == pytest.approx(math.log(2), abs=1e-6)


def test_run_interrupted_mid_refresh_resumes_exactly(world, tmp_path):
    # Sampled candidates (the run's RNG) with dropout on; the teacher is refreshed at steps 3 and 5,
    # and B stops after step 3, in the middle of the refresh period 3-4. DPO's reference stays the
    # initial model, rebuilt on resume.
    common_ = ["preference.refresh_every=2", "model.dropout=null", "optim.lr=0.05", "preference.guards=false"]
    train(config(world, tmp_path / "A", "dpo", *common_, "optim.max_steps=5"))
    train(config(world, tmp_path / "B", "dpo", *common_, "optim.max_steps=3"))
    mid = torch.load(ckpt.step_dir(tmp_path / "B" / "checkpoints", 3) / "method.pt", weights_only=True)
    assert mid["refreshed_at"] == 2 and mid["teacher"] and mid["totals"]["pairs"] > 0
    assert train(config(world, tmp_path / "B", "dpo", *common_, "optim.max_steps=5")).step == 5

    def load(run: str, name: str):
        return torch.load(ckpt.step_dir(tmp_path / run / "checkpoints", 5) / name, weights_only=True)

    for name in ("model.pt", "optimizer.pt", "method.pt"):
        assert_identical(load("A", name), load("B", name), name)
    a, b = read_metrics(tmp_path / "A"), read_metrics(tmp_path / "B")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    for key in ("loss", "dpo/reward_margin", "dpo/chosen_score", "dpo/pairs_total"):
        assert [r[key] for r in a] == [r[key] for r in b], key
    assert a[-1]["dpo/reward_margin"] != 0.0


@pytest.mark.parametrize("override, message", [
    ("preference.include_reference=true", "the source-only pool has none"),
    ("preference.num_candidates=1", "num_candidates must be at least 2"),
    ("preference.beta=0", "beta must be > 0"),
    ("preference.refresh_every=-1", "refresh_every must be 0"),
    ("preference.nll_weight=-1", "ce_weight and nll_weight must be >= 0"),
    ("preference.pool=all", "must be one of mono, labelled, both"),
    ("qe.mode=dynamic", "qe.mode must be 'static'"),
    ("method=cpo preference.reference=teacher", "method 'cpo' has none"),
])
def test_config_mistakes_fail_before_anything_loads(world, tmp_path, override, message):
    with pytest.raises(QeebmError, match=message):
        train(config(world, tmp_path / "run", "dpo", *override.split()))


def test_one_candidate_and_the_reference_make_a_pair(world, tmp_path):
    cfg = config(world, tmp_path / "run", "cpo", "preference.pool=labelled", "preference.include_reference=true",
                 "preference.num_candidates=1")
    METHODS["cpo"].check_config(cfg)
