"""Method ``qe-finetune`` on a tiny random translator: every parameter moves, one greedy candidate
without refresh is SFT on the base's own greedy translations, the selected targets are the
argmax-QE candidates of the teacher, the teacher follows the translator at each refresh, and a run
interrupted in the middle of a refresh period resumes exactly."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from accelerate.utils import set_seed
from transformers import AutoModelForSeq2SeqLM

from qeebm.config import GenerationConfig
from qeebm.data.corpus import write_tsv
from qeebm.errors import QeebmError
from qeebm.methods import METHODS
from qeebm.training import checkpoint as ckpt
from qeebm.training.loop import count_label_tokens, load_data, load_mono, make_batch, train
from qeebm.translation.qad import generate_candidates
from qeebm.translation.translator import Translator

from support.runs import assert_identical, make_config, read_metrics, write_tiny_world_with_mono

SMALL = ["method=qe-finetune", "qe_finetune.num_candidates=3", "qe_finetune.max_new_tokens=8", "data.dev.path="]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    from support.qe import kiwi_dir

    root = tmp_path_factory.mktemp("world")
    return {"base": write_tiny_world_with_mono(root), "root": root, "kiwi": kiwi_dir()}


def config(world, run_dir: Path, *overrides: str):
    return make_config(world["base"], run_dir, *SMALL, f"qe.path={world['kiwi']}", *overrides)



def build(cfg):
    """Translator, method and one micro-batch of 4 labelled + 4 source-only sentences, as the loop
    builds them, without accelerate."""
    set_seed(cfg.seed)
    tr = Translator.load(cfg.model)
    method = METHODS[cfg.method](cfg, tr, tr.model)
    train_set, _ = load_data(cfg, tr)
    idx = list(range(4))
    batch = make_batch(tr, train_set, idx, count_label_tokens(tr, train_set, idx), len(idx), tr.device, step=1)
    batch.mono, batch.global_mono = load_mono(cfg, tr).src[:4], 4
    return tr, method, batch


def test_two_steps_move_every_trainable_parameter(world, tmp_path):
    cfg = config(world, tmp_path / "run", "optim.max_steps=2", "output.save_every=1")
    result = train(cfg)
    start = AutoModelForSeq2SeqLM.from_pretrained(cfg.model.name_or_path)
    ends = dict(AutoModelForSeq2SeqLM.from_pretrained(result.run_dir / "final").named_parameters())
    unchanged = [name for name, p in start.named_parameters() if torch.equal(p, ends[name])]
    assert not unchanged, f"no update reached {unchanged}"
    for record in read_metrics(cfg.output.run_dir):
        for key in ("qe-finetune/ce", "qe-finetune/distill_ce", "qe-finetune/selected_score", "qe-finetune/changed"):
            assert key in record, key
        # the step's loss is the sum of the two weighted CE terms (alpha = beta = 1)
        assert record["loss"] == pytest.approx(record["qe-finetune/ce"] + record["qe-finetune/distill_ce"], rel=1e-6)
        assert record["qe-finetune/target_len"] > 1  # at least the language code and </s>


def test_terms_are_the_weighted_parts_of_the_loss(world, tmp_path, length_scorer):
    cfg = config(world, tmp_path / "run", "qe_finetune.ce_weight=0.3", "qe_finetune.distill_weight=2.0")
    _, method, batch = build(cfg)
    (rollout,) = method.finish_rollouts([method.rollout(batch)], gather=lambda t: t)
    out = method.loss(rollout)
    assert set(out.terms) == {"ce", "distill"}
    assert torch.allclose(out.loss, out.terms["ce"] + out.terms["distill"])
    assert out.terms["ce"].item() == pytest.approx(0.3 * out.metrics["qe-finetune/ce"], rel=1e-6)
    assert out.terms["distill"].item() == pytest.approx(2.0 * out.metrics["qe-finetune/distill_ce"], rel=1e-6)


def test_selected_targets_are_the_teachers_argmax_qe_candidates(world, tmp_path, length_scorer):
    cfg = config(world, tmp_path / "run", "qe_finetune.num_candidates=4")
    tr, method, batch = build(cfg)
    rollout = method.rollout(batch)
    # The teacher is the initial model: the same translator, freshly loaded, makes the same candidates.
    fresh = Translator.load(cfg.model)
    cands = generate_candidates(fresh, batch.mono, GenerationConfig(num_beams=4, max_new_tokens=8), 4)
    best = [c[max(range(4), key=lambda i: (len(c[i]), -i))] for c in cands]
    assert rollout.pseudo.tgt == best and rollout.choice.hyps == best
    assert any(i != 0 for i in rollout.choice.index)  # the QE overruled the beam somewhere
    assert torch.equal(rollout.pseudo.labels, tr.encode(batch.mono, best)["labels"])
    assert rollout.pseudo.src == batch.mono and rollout.pseudo.global_examples == 4


def test_teacher_follows_the_translator_at_each_refresh(world, tmp_path, length_scorer):
    cfg = config(world, tmp_path / "run", "qe_finetune.refresh_every=2")
    tr, method, batch = build(cfg)
    initial = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    gen = GenerationConfig(num_beams=3, max_new_tokens=8)
    before = [max(c, key=len) for c in generate_candidates(tr, batch.mono, gen, 3)]
    # As if training had moved the translator: its translations change.
    torch.manual_seed(0)
    with torch.no_grad():
        for p in tr.model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    after = [max(c, key=len) for c in generate_candidates(tr, batch.mono, gen, 3)]
    assert after != before
    for step, refreshed in ((1, False), (2, False), (3, True), (4, False)):
        method.before_step([dataclasses.replace(batch, step=step)], lambda t: t)
        expected = dict(tr.model.named_parameters()) if step >= 3 else initial
        assert all(torch.equal(p, expected[n]) for n, p in method.teacher.model.named_parameters()), step
        # the pseudo-targets are the teacher's, never those of the translator being trained
        assert method.rollout(dataclasses.replace(batch, step=step)).pseudo.tgt == (after if step >= 3 else before)
    state = method.state_dict()
    assert state["refreshed_at"] == 2 and set(state["teacher"]) == {n for n, _ in tr.model.named_parameters()}
    _, other, _ = build(cfg)
    other.load_state_dict(state)
    assert other.teacher.refreshed_at == 2
    assert all(torch.equal(p, state["teacher"][n]) for n, p in other.teacher.model.named_parameters())
    # Before any refresh the teacher is the initial model, which the method rebuilds: nothing to save.
    _, unrefreshed, _ = build(cfg)
    assert unrefreshed.state_dict() == {"refreshed_at": 0, "teacher": {}}


def test_one_greedy_candidate_without_refresh_is_sft_on_the_base_greedy_translations(world, tmp_path):
    common = ["optim.max_steps=3", "qe_finetune.num_candidates=1", "qe_finetune.num_beams=1",
              "qe_finetune.ce_weight=0.0", "qe_finetune.refresh_every=0"]
    finetune = config(world, tmp_path / "finetune", *common)
    tr = Translator.load(finetune.model)
    mono = load_mono(finetune, tr).src
    greedy = [" ".join(h.split()) for h in tr.generate(mono, GenerationConfig(num_beams=1, max_new_tokens=8))]
    write_tsv(tmp_path / "greedy.tsv", mono, greedy)
    # The source-only pool is drawn with seed + 1 (loop.train): SFT with seed 8 on the pool draws the
    # same sentences in the same steps as qe-finetune with seed 7. Dropout is 0 in the base config.
    sft = make_config(world["base"], tmp_path / "sft", "method=sft", "seed=8", "optim.max_steps=3", "data.dev.path=",
                      f"data.train.path={tmp_path / 'greedy.tsv'}")
    train(finetune)
    train(sft)
    a, b = read_metrics(tmp_path / "finetune"), read_metrics(tmp_path / "sft")
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert [r["qe-finetune/distill_nll"] for r in a] == [r["sft/nll"] for r in b]
    assert all(r["qe-finetune/changed"] == 0 for r in a)
    ends = lambda run: ckpt.latest_checkpoint(tmp_path / run / "checkpoints") / "model.pt"  # noqa: E731
    assert_identical(torch.load(ends("finetune"), weights_only=True), torch.load(ends("sft"), weights_only=True))


def test_run_interrupted_mid_refresh_resumes_exactly(world, tmp_path):
    # Sampled candidates (the run's RNG) with dropout on; the teacher is refreshed at steps 3 and 5,
    # and B stops after step 3, in the middle of the refresh period 3-4.
    # A large learning rate, so that the refreshed teacher samples differently from the initial one.
    common = ["qe_finetune.candidates=sample", "qe_finetune.num_candidates=2", "qe_finetune.refresh_every=2",
              "model.dropout=null", "optim.lr=0.05"]
    train(config(world, tmp_path / "A", *common, "optim.max_steps=5"))
    train(config(world, tmp_path / "B", *common, "optim.max_steps=3"))
    mid = torch.load(ckpt.step_dir(tmp_path / "B" / "checkpoints", 3) / "method.pt", weights_only=True)
    assert mid["refreshed_at"] == 2 and mid["teacher"]
    assert train(config(world, tmp_path / "B", *common, "optim.max_steps=5")).step == 5

    def load(run: str, name: str):
        return torch.load(ckpt.step_dir(tmp_path / run / "checkpoints", 5) / name, weights_only=True)

    for name in ("model.pt", "optimizer.pt", "method.pt"):
        assert_identical(load("A", name), load("B", name), name)
    assert load("A", "method.pt")["refreshed_at"] == 4
    a, b = read_metrics(tmp_path / "A"), read_metrics(tmp_path / "B")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert [r["qe-finetune/selected_score"] for r in a] == [r["qe-finetune/selected_score"] for r in b]


@pytest.mark.parametrize("override, message", [
    ("qe_finetune.refresh_every=-1", "refresh_every must be 0"),
    ("qe_finetune.num_candidates=0", "num_candidates and num_beams must be at least 1"),
    ("qe_finetune.ce_weight=0.0 qe_finetune.distill_weight=0.0", "not both 0"),
    ("qe.mode=dynamic", "qe.mode must be 'static'"),
    ("qe_finetune.selection=best", "must be one of rerank, mbr"),
])
def test_config_mistakes_fail_before_anything_loads(world, tmp_path, override, message):
    with pytest.raises(QeebmError, match=message):
        train(config(world, tmp_path / "run", *override.split()))
