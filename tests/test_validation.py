"""Validation on quality estimators (the published setup selects and early-stops on validation
COMET-Kiwi): the QE metrics equal QEScorer's mean over the decoded dev set, ``eval.metric: kiwi``
keeps the checkpoint with the highest validation Kiwi, early stopping counts validations without
improvement, ``also_best`` keeps one more best checkpoint, and gradient diagnostics are logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from ddp_parity import make_config, write_tiny_world_with_mono
from helpers import tokenizer_dir
from qeebm.errors import QeebmError
from qeebm.loop import train


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
    from qeebm.data import read_corpus
    from qeebm.qe.models import load_qe
    from qeebm.qe.scoring import QEScorer
    from qeebm.translator import Translator

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
    extra = {"qe-ebm": ["qe_ebm.alpha=1.0", "qe_ebm.beta_max=0.5", "qe_ebm.beta_ramp_steps=0", "qe_ebm.sampling.num_samples=2"],
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
