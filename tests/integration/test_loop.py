"""The training loop with method ``sft`` on a tiny random NLLB: gradients reach every parameter,
accumulation and process count do not change the update, clipping, validation, early stopping and
the run directory's files."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from accelerate.utils import set_seed
from transformers import AutoModelForSeq2SeqLM

from qeebm.config import dump_config
from qeebm.errors import QeebmError
from qeebm.methods import METHODS
from qeebm.training.loop import train
from qeebm.translation.translator import Translator

from support.runs import (
    assert_only_adapters_trained,
    final_weights,
    finish,
    launch_two,
    make_config,
    read_metrics,
    write_tiny_world,
)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return write_tiny_world(tmp_path_factory.mktemp("world"))


def initial_state(cfg) -> dict[str, torch.Tensor]:
    """The weights a run starts from (LoRA adapters are drawn after set_seed, as the loop does)."""
    set_seed(cfg.seed)
    return {k: v.clone() for k, v in Translator.load(cfg.model).model.state_dict().items()}


def test_sft_changes_every_trainable_parameter(base, tmp_path):
    cfg = make_config(base, tmp_path / "run", "optim.max_steps=2")
    result = train(cfg)
    start = AutoModelForSeq2SeqLM.from_pretrained(cfg.model.name_or_path)
    end = AutoModelForSeq2SeqLM.from_pretrained(result.run_dir / "final")
    ends = dict(end.named_parameters())
    unchanged = [name for name, p in start.named_parameters() if torch.equal(p, ends[name])]
    assert not unchanged, f"no update reached {unchanged}"


def test_lora_changes_only_the_adapters(base, tmp_path):
    cfg = make_config(base, tmp_path / "run", "optim.max_steps=3", "model.lora.enabled=true", "model.lora.r=4")
    before = initial_state(cfg)
    train(cfg)
    assert_only_adapters_trained(before, cfg.output.run_dir, cfg.model.lora.alpha / cfg.model.lora.r)


def test_gradient_accumulation_gives_the_full_batch_update(base, tmp_path):
    # Micro-batches are padded separately, so only float rounding may differ.
    one = make_config(base, tmp_path / "accum1", "optim.grad_accum=1")
    two = make_config(base, tmp_path / "accum2", "optim.grad_accum=2")
    train(one)
    train(two)
    a, b = final_weights(one.output.run_dir), final_weights(two.output.run_dir)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=key)
    la = [r["sft/nll"] for r in read_metrics(one.output.run_dir)]
    lb = [r["sft/nll"] for r in read_metrics(two.output.run_dir)]
    assert la == pytest.approx(lb, rel=1e-6)


def test_clipping_bounds_the_first_update(base, tmp_path):
    # Adam's first update is lr * g / (|g| + eps) per element, so gradients clipped to a total norm c
    # move no parameter by more than lr * c / eps, while unclipped ones move many by about lr.
    free = make_config(base, tmp_path / "free", "optim.max_steps=1")
    tight = make_config(base, tmp_path / "tight", "optim.max_steps=1", "optim.max_grad_norm=1e-8")
    start = initial_state(free)
    train(free)
    train(tight)

    def largest_change(cfg) -> float:
        end = final_weights(cfg.output.run_dir)
        return max((end[k] - start[k]).abs().max().item() for k in start)

    bound = tight.optim.lr * tight.optim.max_grad_norm / tight.optim.eps
    assert largest_change(tight) <= bound * 1.01
    assert largest_change(free) > 50 * bound
    # The logged norm is the one before clipping: the same in both runs.
    (rf,), (rt,) = read_metrics(free.output.run_dir), read_metrics(tight.output.run_dir)
    assert rt["grad_norm"] == pytest.approx(rf["grad_norm"]) and rt["grad_norm"] > 1e-3


def test_run_directory_holds_config_metrics_best_and_final(base, tmp_path):
    cfg = make_config(base, tmp_path / "run", "optim.max_steps=4", "eval.every=2", "output.save_every=1",
                      "logging.report_to=[tensorboard]", "eval.metric=chrf", "eval.mode=max")
    result = train(cfg)
    run = Path(cfg.output.run_dir)
    assert (run / "config.yaml").read_text(encoding="utf-8") == dump_config(cfg)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    train_records = [r for r in records if "loss" in r]
    assert [r["step"] for r in train_records] == [1, 2, 3, 4]
    for key in ("epoch", "lr", "loss", "grad_norm", "sft/nll", "sft/loss", "elapsed"):
        assert all(isinstance(r[key], float) for r in train_records), key
    # epoch = examples seen / training pairs kept by the length filter (logged in train.log).
    kept = int(re.search(r"train: kept (\d+) of", (run / "train.log").read_text(encoding="utf-8")).group(1))
    assert train_records[0]["epoch"] == pytest.approx(8 / kept)
    val = [r for r in records if "val/chrf" in r]
    assert [r["step"] for r in val] == [2, 4]
    assert all({"val/bleu", "val/chrf", "val/loss"} <= r.keys() for r in val)
    # Best is the validation with the highest chrF.
    best = max(val, key=lambda r: r["val/chrf"])
    assert result.best_metric == pytest.approx(best["val/chrf"])
    assert result.best_path == run / "best" and result.step == 4
    for out in ("best", "final"):
        AutoModelForSeq2SeqLM.from_pretrained(run / out)
    assert (run / "train.log").stat().st_size > 0
    assert any((run / "tb").iterdir())
    # keep_last=2 of the checkpoints written every step.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000003", "step-0000004"]
    final = final_weights(run)
    end = dict(AutoModelForSeq2SeqLM.from_pretrained(run / "final").state_dict())
    assert all(torch.equal(final[k], end[k]) for k in end if k in final)


def test_early_stopping_after_patience(base, tmp_path):
    # lr 0 leaves the weights, hence the dev loss, exactly as they are: the first validation sets
    # the best, the second cannot beat it, and patience 1 ends the run there.
    cfg = make_config(base, tmp_path / "run", "optim.lr=0.0", "optim.max_steps=10", "eval.every=1",
                      "eval.patience=1", "eval.metric=loss", "eval.mode=min")
    result = train(cfg)
    assert result.step == 2
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["val/loss"] for r in records if "val/loss" in r]
    assert len(losses) == 2 and losses[0] == losses[1]
    assert result.best_metric == losses[0]


def test_batch_must_divide_into_processes_and_micro_steps(base, tmp_path):
    cfg = make_config(base, tmp_path / "run", "optim.batch_size=6", "optim.grad_accum=4")
    with pytest.raises(QeebmError, match="divisible"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_unknown_method_names_the_closest(base, tmp_path):
    with pytest.raises(QeebmError, match="did you mean 'sft'"):
        METHODS["sfft"]
    # Before any model is loaded or the run directory is made.
    with pytest.raises(QeebmError, match="unknown method 'sfft'"):
        train(make_config(base, tmp_path / "run", "method=sfft"))
    assert not (tmp_path / "run").exists()


def test_sft_loss_is_the_per_token_mean_over_the_step(base, tmp_path):
    # Without label smoothing the SFT loss of step 1 is the teacher-forced NLL per target token of
    # that step's 8 pairs, computed here independently of the loop.
    from qeebm.data.corpus import read_corpus
    from qeebm.data.step_sampler import StepSampler

    cfg = make_config(base, tmp_path / "run", "optim.max_steps=1", "optim.label_smoothing=0.0", "data.dedup=false",
                      "data.max_tokens=0")
    train(cfg)
    (record,) = read_metrics(cfg.output.run_dir)
    corpus = read_corpus(cfg.data.train, "train", need_target=True)
    idx = StepSampler(len(corpus), cfg.optim.batch_size, cfg.seed).global_indices(0)
    translator = Translator.load(cfg.model)
    enc = translator.encode([corpus.src[i] for i in idx], [corpus.tgt[i] for i in idx])
    with torch.no_grad():
        expected = translator.model(**enc).loss.item()  # HF's mean over non-ignored label tokens
    assert record["sft/loss"] == pytest.approx(expected, rel=1e-5)
    assert record["sft/nll"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.usefixtures("one_launch_at_a_time")
@pytest.mark.slow
def test_ddp_parity(base, tmp_path):
    """Two gloo processes, each accumulating two micro-batches of 2, follow the one-process run of
    batch 8 step for step: the same losses, validation and final weights up to float rounding."""
    args = ["optim.max_steps=20", "eval.every=10"]
    # One after the other: a job of more processes than cores runs several times slower
    # (tests/e2e/test_backends.py, _ddp_then_deepspeed).
    train(make_config(base, tmp_path / "one", *args))
    two = launch_two(base, tmp_path / "two", *args, "optim.grad_accum=2")
    out = finish(two, 240, "two")
    assert two.returncode == 0, f"run 'two' failed:\n{out[-4000:]}"
    runs = ("one", "two")
    assert "2 processes x 2 micro-steps" in (tmp_path / "two" / "train.log").read_text(encoding="utf-8")
    curve = {name: [r["loss"] for r in read_metrics(tmp_path / name)] for name in runs}
    assert len(curve["one"]) == 20
    assert curve["two"] == pytest.approx(curve["one"], rel=1e-4)
    val = {name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
           for name in runs}
    val = {name: [r["val/loss"] for r in records if "val/loss" in r] for name, records in val.items()}
    assert len(val["one"]) == 2 and val["two"] == pytest.approx(val["one"], rel=1e-4)
    one, two = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    # docs/training.md quotes these (pytest -s -k ddp_parity).
    loss_gap = max(abs(a - b) / abs(a) for a, b in zip(curve["one"], curve["two"]))
    weight_gap = max((two[k] - one[k]).abs().max().item() for k in one)
    print(f"\nddp parity over 20 steps: loss curves {loss_gap:.1e} relative, weights {weight_gap:.1e} absolute")
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=0, atol=1e-5, msg=key)


def test_schedule_starts_moving_at_the_first_update():
    from qeebm.training.loop import lr_factor

    # 4 warm-up updates of 10: 1/4, 2/4, 3/4, 1, then linear towards 0 without reaching it.
    linear = lr_factor("linear", 4, 10)
    assert [linear(s) for s in range(10)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6])
    assert [lr_factor("constant", 2, 10)(s) for s in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]
    cosine = lr_factor("cosine", 0, 4)
    assert [cosine(s) for s in range(4)] == pytest.approx([1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4))])
