"""Validation on quality estimators (the published setup selects and early-stops on validation
COMET-Kiwi): the QE metrics equal QEScorer's mean over the decoded dev set, ``eval.metric: kiwi``
keeps the checkpoint with the highest validation Kiwi, early stopping counts validations without
improvement, ``also_best`` keeps one more best checkpoint, and gradient diagnostics are logged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from qeebm.errors import QeebmError
from qeebm.training.loop import train

from support.runs import make_config, write_tiny_world_with_mono
from support.tiny import tokenizer_dir


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    from qeebm.qe.tiny import build_tiny_kiwi

    root = tmp_path_factory.mktemp("world")
    base = write_tiny_world_with_mono(root)
    return {"base": base, "kiwi": build_tiny_kiwi(root / "kiwi", tokenizer_dir("xlmr")),
            "judge": build_tiny_kiwi(root / "judge", tokenizer_dir("xlmr"), seed=1)}


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


def weights_at(run: Path, step: int) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / f"step-{step:07d}" / "model.pt", weights_only=True)


def same_weights(model_dir: Path, state: dict[str, torch.Tensor]) -> bool:
    saved = AutoModelForSeq2SeqLM.from_pretrained(model_dir).state_dict()
    return all(torch.equal(saved[k], state[k]) for k in saved if k in state)


def test_kiwi_selects_the_best_checkpoint_and_stops_early(world, tmp_path):
    run = tmp_path / "run"
    cfg = make_config(world["base"], run, f"qe.path={world['kiwi']}", f"eval.judge_path={world['judge']}",
                      "eval.metric=kiwi", "eval.mode=max", "eval.qe_metrics=[judge]", "eval.also_best=[chrf]",
                      "eval.every=1", "eval.patience=2", "optim.lr=3e-2", "optim.max_steps=12",
                      "output.save_every=1", "output.keep_last=20")
    result = train(cfg)
    vals = [r for r in records(run) if "val/kiwi" in r]
    steps = [r["step"] for r in vals]
    kiwi = [r["val/kiwi"] for r in vals]
    best = steps[kiwi.index(max(kiwi))]  # the first of equal maxima: a tie is no improvement
    # Early stopping: the run ends after `patience` validations without a new best, unless max_steps
    # comes first.
    assert result.step == min(best + 2, 12)
    assert steps == list(range(1, result.step + 1))
    assert result.best_metric == max(kiwi)
    assert same_weights(run / "best", weights_at(run, best))
    chrf = [r["val/chrf"] for r in vals]
    assert same_weights(run / "best-chrf", weights_at(run, steps[chrf.index(max(chrf))]))
    for r in vals:
        assert {"val/judge", "val/seconds_kiwi", "val/seconds_judge", "val/seconds_decode"} <= set(r)


def test_qe_validation_metric_is_the_mean_qe_score_of_the_dev_outputs(world, tmp_path):
    from qeebm.config import GenerationConfig
    from qeebm.data.corpus import read_corpus
    from qeebm.qe.models import load_qe
    from qeebm.qe.scoring import QEScorer
    from qeebm.translation.translator import Translator

    run = tmp_path / "run"
    cfg = make_config(world["base"], run, f"qe.path={world['kiwi']}", "eval.qe_metrics=[kiwi]", "optim.max_steps=1")
    train(cfg)
    (val,) = [r for r in records(run) if "val/kiwi" in r]
    dev = read_corpus(cfg.data.dev, "dev", need_target=True)
    src = dev.src[: cfg.eval.max_examples]
    translator = Translator.load(cfg.model.__class__(**{**cfg.model.__dict__, "name_or_path": str(run / "final")}))
    hyps = translator.generate(src, GenerationConfig(**cfg.generation.__dict__))
    scores = QEScorer(load_qe(str(world["kiwi"]))).score(src, hyps)
    assert val["val/kiwi"] == pytest.approx(sum(scores) / len(scores), abs=1e-6)


def test_judge_needs_a_path_and_unknown_metrics_fail_early(world, tmp_path):
    with pytest.raises(QeebmError, match="eval.judge_path"):
        train(make_config(world["base"], tmp_path / "a", "eval.metric=judge"))
    with pytest.raises(QeebmError, match="eval.qe_metrics has unknown metrics"):
        train(make_config(world["base"], tmp_path / "b", "eval.qe_metrics=[bleurt]"))
    with pytest.raises(QeebmError, match="validation metric 'kiwi'"):
        train(make_config(world["base"], tmp_path / "c", "eval.metric=kiwi", f"qe.path={tmp_path / 'none'}"))
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("method", ["qe-ebm"])
def test_gradient_diagnostics_are_logged(world, tmp_path, method):
    run = tmp_path / "run"
    extra = {"qe-ebm": ["qe_ebm.ce_weight=1.0", "qe_ebm.energy_weight=0.5", "qe_ebm.energy_ramp_steps=0", "qe_ebm.sampling.num_samples=2"],
             "reinforce": ["reinforce.sampling.num_samples=2"]}[method]
    cfg = make_config(world["base"], run, f"method={method}", f"qe.path={world['kiwi']}", "optim.max_steps=2",
                      "logging.every=2", "data.dev.path=", "qe_ebm.sampling.max_new_tokens=8", "reinforce.sampling.max_new_tokens=8",
                      *extra)
    train(cfg)
    rows = [r for r in records(run) if "loss" in r]
    assert [r["step"] for r in rows] == [2]
    (row,) = rows
    term = {"qe-ebm": "energy", "reinforce": "pg"}[method]
    assert row["diag/grad_ce"] > 0 and row[f"diag/grad_{term}"] > 0
    assert row[f"diag/ratio_{term}"] == pytest.approx(row[f"diag/grad_{term}"] / row["diag/grad_ce"], rel=1e-9)
    assert -1 <= row[f"diag/cos_{term}"] <= 1


def test_budget_in_epochs_of_the_labelled_pairs():
    from qeebm.config import load_config
    from qeebm.training.loop import Budget

    def budget(*overrides, n=300):
        return Budget.of(load_config(None, ["optim.batch_size=16", *overrides]), n)

    # 300 pairs in batches of 16: 18.75 steps an epoch, 19 with the last partial batch.
    b = budget("optim.max_steps=0", "optim.max_epochs=3", "optim.min_epochs=2", "eval.every=100")
    assert (b.max_steps, b.min_steps, b.eval_every) == (57, 38, 19)  # ceil(56.25), ceil(37.5), min(100, 19)
    # whichever bound comes first; validation keeps eval.every when it is shorter than an epoch
    assert (budget("optim.max_steps=50", "optim.max_epochs=3", "eval.every=10").max_steps,
            budget("optim.max_steps=50", "optim.max_epochs=3", "eval.every=10").eval_every) == (50, 10)
    assert budget("optim.max_steps=80", "optim.max_epochs=3").max_steps == 57
    assert budget("optim.max_steps=0", "optim.max_epochs=3", "eval.every=0").eval_every == 0
    # a step budget alone is what it always was: eval.every is not capped by an epoch
    b = budget("optim.max_steps=500", "eval.every=100")
    assert (b.max_steps, b.min_steps, b.eval_every) == (500, 0, 100)
    # 10 epochs of 1440 pairs in batches of 16 are 900 steps: no float rounding up to 901
    assert budget("optim.max_steps=0", "optim.max_epochs=10", n=1440).max_steps == 900


@pytest.mark.parametrize("overrides,message", [
    (["optim.max_steps=0"], "optim.max_steps and optim.max_epochs are both 0"),
    (["optim.max_epochs=-1"], "optim.max_epochs must be >= 0"),
    (["optim.max_epochs=2", "optim.min_epochs=3"], "optim.min_epochs=3.0 is more than optim.max_epochs=2.0"),
])
def test_budget_mistakes_fail_before_loading(world, tmp_path, overrides, message):
    with pytest.raises(QeebmError, match=message):
        train(make_config(world["base"], tmp_path / "run", "model.name_or_path=/nonexistent", *overrides))
    assert not (tmp_path / "run").exists()


def test_epoch_budget_validates_every_epoch_and_stops_early_not_before_min_epochs(world, tmp_path):
    # lr 0 keeps the dev loss where it is, so no validation after the first improves on it (a tie is
    # no improvement) and patience 1 runs out at the second.
    run = tmp_path / "run"
    cfg = make_config(world["base"], run, "optim.max_steps=0", "optim.max_epochs=4", "optim.min_epochs=3",
                      "optim.lr=0", "eval.every=100", "eval.patience=1")
    result = train(cfg)
    rows = [r for r in records(run) if "loss" in r]
    n = round(8 / rows[0]["epoch"])  # labelled pairs left by the length filter and dedup (58 of 64)
    epoch = math.ceil(n / 8)  # steps an epoch, the last batch rounded up: validation every epoch
    vals = [r["step"] for r in records(run) if "val/loss" in r]
    # patience runs out at the second validation, but early stopping waits for epoch 3, where the
    # run ends with a last validation
    assert 2 * epoch < math.ceil(3 * n / 8) == result.step
    assert vals == [epoch, 2 * epoch, result.step]
    assert rows[-1]["epoch"] == pytest.approx(result.step * 8 / n)
    # without min_epochs it stops at the second validation; with no early stopping at max_epochs
    assert train(make_config(world["base"], tmp_path / "b", "optim.max_steps=0", "optim.max_epochs=4", "optim.lr=0",
                             "eval.every=100", "eval.patience=1")).step == 2 * epoch
    assert train(make_config(world["base"], tmp_path / "c", "optim.max_steps=0", "optim.max_epochs=4",
                             "eval.every=100")).step == math.ceil(4 * n / 8)


def test_validation_bleu_is_tokenized_for_the_target_language(world, tmp_path, monkeypatch):
    import qeebm.training.loop

    seen = []
    real = qeebm.training.loop.corpus_metrics
    monkeypatch.setattr(qeebm.training.loop, "corpus_metrics", lambda hyps, refs, tok=None: seen.append(tok) or real(hyps, refs, tok))
    for i, extra in enumerate([[], ["eval.bleu_tokenize=char"], ["model.tgt_lang=eng_Latn"]]):
        train(make_config(world["base"], tmp_path / f"run{i}", "model.tgt_lang=zho_Hans", "optim.max_steps=1", *extra))
    assert seen == ["zh", "char", "13a"]
    with pytest.raises(QeebmError, match="validation BLEU: BLEU tokenizer '13b' is not one of sacrebleu's"):
        train(make_config(world["base"], tmp_path / "bad", "eval.bleu_tokenize=13b"))
    assert not (tmp_path / "bad").exists()
