"""Method ``grpo``: the loss equals TRL's GRPO loss on the same log-probs and advantages, the group
advantages, the k3 KL and the three normalisations by hand, the first epoch's ratio is 1 (its
gradient REINFORCE's), the LoRA reference costs no second model, it trains tiny NLLB and mBART
translators, resumes exactly, and two DDP processes follow one.

Run as a script (``python tests/integration/test_grpo.py BASE.yaml key=value ...``, or under ``accelerate
launch``) it trains with a toy reward and a sampler that draws each source's samples from a stream
of its own, so one process and two draw the same samples (the DDP test)."""

from __future__ import annotations

import math
import subprocess
import sys
import zlib
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import set_seed
from transformers import AutoModelForSeq2SeqLM

from qeebm.config import load_config
from qeebm.errors import QeebmError
from qeebm.methods import common, rl
from qeebm.methods.base import Batch
from qeebm.methods.grpo import GRPO, GRPORollout
from qeebm.training.loop import train
from qeebm.translation.translator import Translator

from support.runs import (
    REPO,
    final_weights,
    finish,
    launch_env,
    launch_two,
    make_config,
    read_metrics,
    write_tiny_world_with_mono,
)
from support.tiny import tiny_texts, tiny_translator_dir

FAST = ("method=grpo", "grpo.sampling.max_new_tokens=8", "grpo.sampling.num_samples=3", "optim.max_steps=2")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The loop tests' tiny world plus a source-only pool."""
    return write_tiny_world_with_mono(tmp_path_factory.mktemp("world"))


class HashScorer:
    """Toy QE: a score in [0, 1) read off the translation's bytes, so samples of a group that differ
    at all score differently (a random tiny translator's samples often have the same length)."""

    def score(self, src, mt):
        return [zlib.crc32(m.encode()) % 1000 / 1000 for m in mt]


@pytest.fixture
def toy_reward(monkeypatch):
    monkeypatch.setattr(common, "build_scorer", lambda cfg, device: HashScorer())


# ----------------------------------------------------------------------------------------------
# The loss, against TRL and by hand


def random_step(b: int = 6, t: int = 7, seed: int = 0):
    """Per-token log-probs of b sequences of up to t tokens (lengths 1..t), old log-probs far enough
    from them that the clip acts on both sides, reference log-probs, and advantages."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    old = logp + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.3
    ref = logp + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.5
    lengths = torch.tensor([1 + (i * 3) % t for i in range(b)])
    mask = torch.arange(t).expand(b, t) < lengths[:, None]
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    zero = lambda x: torch.where(mask, x, torch.zeros_like(x))  # noqa: E731
    return zero(logp), zero(old), zero(ref), adv, mask


def trl_loss(logp, old, ref, adv, mask, beta, clip, loss_type, max_len):
    """TRL 0.23.1's GRPOTrainer._compute_loss on these tensors: a stand-in for the trainer holds only
    what that method reads, and its forward pass returns ``logp``."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    b = logp.shape[0]
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logp, torch.zeros_like(logp)),
        top_entropy_quantile=1.0, beta=beta, importance_sampling_level="token", epsilon_low=clip, epsilon_high=clip,
        args=SimpleNamespace(delta=None), use_vllm=False, loss_type=loss_type, current_gradient_accumulation_steps=1,
        max_completion_length=max_len, model=SimpleNamespace(training=True), _metrics={"train": defaultdict(list)},
        accelerator=SimpleNamespace(gather=lambda t: t.reshape(-1), num_processes=1))
    inputs = {"prompt_ids": torch.zeros(b, 1, dtype=torch.long), "prompt_mask": torch.ones(b, 1, dtype=torch.long),
              "completion_ids": torch.zeros(mask.shape, dtype=torch.long), "completion_mask": mask.to(logp.dtype),
              "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": mask.sum()}
    loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    return loss, trainer._metrics["train"]


# TRL's "bnpo" and "dapo" both are the token mean for one micro-batch on one process; ours is "dapo"
# (the step's tokens).
@pytest.mark.parametrize("ours, theirs", [("grpo", "grpo"), ("dapo", "dapo"), ("dapo", "bnpo"), ("dr_grpo", "dr_grpo")])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_and_gradient_equal_trls(ours, theirs, beta):
    logp, old, ref, adv, mask = random_step()
    clip, max_len = 0.2, 9
    ratio = torch.exp(logp - old)[mask]
    assert (ratio < 1 - clip).any() and (ratio > 1 + clip).any()  # both sides of the clip act
    a, b = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    loss, surrogate, kl = rl.grpo_loss(a, old, adv, mask, clip, ref_logp=ref, kl_coef=beta, loss_type=ours,
                                       max_len=max_len)
    expected, metrics = trl_loss(b, old, ref, adv, mask, beta, clip, theirs, max_len)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-14)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-14)
    # TRL's clip ratio counts the tokens where the clip took the gradient away: ours too.
    assert (surrogate.clipped & mask).sum().item() / mask.sum().item() == pytest.approx(
        metrics["clip_ratio/region_mean"][0])
    if beta:
        assert (kl * mask).sum().item() / mask.sum().item() == pytest.approx(metrics["kl"][0])
    else:
        assert kl is None and "kl" not in metrics


def test_group_advantages_hand_computed():
    rewards = torch.tensor([[1.0, 2.0, 6.0], [5.0, 5.0, 5.0]])
    centred = torch.tensor([[-2.0, -1.0, 3.0], [0.0, 0.0, 0.0]])
    # The group's unbiased std: sqrt((4 + 1 + 9) / 2) = sqrt(7); a flat group gets 0, not NaN.
    assert torch.allclose(rl.group_advantages(rewards, "group"),
                          centred / torch.tensor([[math.sqrt(7) + 1e-4], [1e-4]]))
    # Dr. GRPO: centred only.
    assert torch.equal(rl.group_advantages(rewards, "none"), centred)
    # The step's std (mean 4; squares 9 4 4 1 1 1 over 5): 2.
    assert torch.allclose(rl.group_advantages(rewards, "batch", batch_std=rewards.std()), centred / (2 + 1e-4))
    with pytest.raises(ValueError, match="G >= 2"):
        rl.group_advantages(torch.ones(3, 1))


def test_k3_kl_by_hand_and_zero_at_the_reference():
    half, quarter = math.log(0.5), math.log(0.25)
    logp = torch.tensor([[half, half, half]], requires_grad=True)
    ref = torch.tensor([[quarter, half, 0.0]])
    mask = torch.tensor([[True, True, False]])
    kl = rl.k3_kl(logp, ref, mask)
    # ref/p - log(ref/p) - 1 = 0.5 + log 2 - 1 where they differ, 0 where they agree and off the mask.
    assert torch.allclose(kl, torch.tensor([[0.5 + math.log(2) - 1, 0.0, 0.0]]))
    kl.sum().backward()
    # d/dlogp = 1 - ref/p: no pull where the policy is the reference.
    assert torch.allclose(logp.grad, torch.tensor([[0.5, 0.0, 0.0]]))


def test_the_three_normalisations_by_hand():
    # Ratio 1 (old = the policy's own), no KL: per token -A of its sequence.
    logp = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    adv = torch.tensor([1.0, -2.0])
    loss = lambda kind, **kw: rl.grpo_loss(logp, logp.detach(), adv, mask, loss_type=kind, **kw)[0].item()  # noqa: E731
    # grpo: each sequence's token mean (-1, +2), then their mean.
    assert loss("grpo") == pytest.approx((-1 + 2) / 2)
    # dapo: every token alike: (-3 + 2) / 4 tokens.
    assert loss("dapo") == pytest.approx((-3 + 2) / 4)
    # dr_grpo: the token sum over sequences x max_len.
    assert loss("dr_grpo", max_len=5) == pytest.approx((-3 + 2) / (2 * 5))
    # A caller's normaliser (the whole step's count) replaces the local one.
    assert loss("dapo", normaliser=8) == pytest.approx((-3 + 2) / 8)


def test_at_ratio_one_the_gradient_is_reinforces():
    """One epoch: the ratio is exactly 1, the clip never acts, and without a KL the token-mean GRPO
    loss has REINFORCE's gradient (with the group mean as baseline)."""
    logp, _, _, adv, mask = random_step(seed=3)
    a, b = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    loss, surrogate, _ = rl.grpo_loss(a, a.detach(), adv, mask, loss_type="dapo", normaliser=11.0)
    assert torch.equal(surrogate.ratio, torch.ones_like(logp)) and not surrogate.clipped.any()
    loss.backward()
    seq_logp = torch.where(mask, b, torch.zeros_like(b)).sum(1)  # as rl.sequence_logprobs sums them
    rl.policy_gradient_loss(seq_logp, adv, normaliser=11.0).backward()
    torch.testing.assert_close(a.grad, b.grad)


# ----------------------------------------------------------------------------------------------
# The method alone


def mono_batch(n: int) -> Batch:
    sources = tiny_texts(64, seed=5)[0::2][:n]
    empty = torch.zeros(0, 0, dtype=torch.long)
    return Batch(src=[], tgt=None, input_ids=empty, attention_mask=empty, labels=None, global_tokens=0,
                 global_examples=0, step=1, mono=sources, global_mono=n)


def build(cfg) -> GRPO:
    set_seed(cfg.seed)
    translator = Translator.load(cfg.model)
    return GRPO(cfg, translator, translator.model)


def bare_method(scale: str, loss_type: str = "grpo", g: int = 3, max_new_tokens: int = 5) -> GRPO:
    method = GRPO.__new__(GRPO)
    method.c = SimpleNamespace(scale_rewards=scale, loss_type=loss_type,
                               sampling=SimpleNamespace(num_samples=g, max_new_tokens=max_new_tokens))
    method.cfg = SimpleNamespace(guards=SimpleNamespace(penalty_unit="spread"))
    method.reward = SimpleNamespace(step_means=lambda terms, gather: {})  # one QE: no terms to log
    return method


def rollout(scores: list[list[float]], lengths: list[int], global_samples: int) -> GRPORollout:
    r = torch.tensor(scores)
    mask = torch.arange(5).expand(len(lengths), 5) < torch.tensor(lengths)[:, None]
    return GRPORollout(batch=None, samples=SimpleNamespace(mask=mask), scores=r, penalty=torch.zeros_like(r),
                       guards=None, global_samples=global_samples)


def test_finish_rollouts_takes_the_steps_statistics():
    # Two micro-batches of one source each: the group's statistics stay the group's, the step's
    # std and the normalisers are the whole step's.
    parts = lambda: [rollout([[1.0, 2.0, 6.0]], [1, 2, 3], 6), rollout([[5.0, 5.0, 5.0]], [4, 5, 5], 6)]  # noqa: E731
    group = bare_method("group").finish_rollouts(parts(), gather=lambda t: t)
    assert torch.allclose(group[0].advantages, torch.tensor([[-2.0, -1.0, 3.0]]) / (math.sqrt(7) + 1e-4))
    assert torch.equal(group[1].advantages, torch.zeros(1, 3))
    assert group[0].step_stats["grpo/flat_groups"] == 0.5
    step = bare_method("batch").finish_rollouts(parts(), gather=lambda t: t)
    assert torch.allclose(step[0].advantages, torch.tensor([[-2.0, -1.0, 3.0]]) / (2 + 1e-4))
    for kind, expected in (("grpo", 6.0), ("dapo", 20.0), ("dr_grpo", 6.0 * 5)):
        (first, _) = bare_method("none", kind).finish_rollouts(parts(), gather=lambda t: t)
        assert first.normaliser == expected and first.tokens == 20.0, kind


def test_config_checks(base, tmp_path):
    for override, message in (("grpo.sampling.num_samples=1", "num_samples must be at least 2"),
                              ("grpo.sampling.top_p=0.9", "grpo.sampling.top_k must be 0"),
                              ("grpo.epochs=0", "grpo.epochs must be at least 1"),
                              ("grpo.kl_coef=-0.1", "grpo.kl_coef must be >= 0")):
        with pytest.raises(QeebmError, match=message):
            GRPO.check_config(make_config(base, tmp_path / "run", "method=grpo", override))
    with pytest.raises(QeebmError, match="grpo.loss_type' must be one of grpo, dapo, dr_grpo"):
        make_config(base, tmp_path / "run", "method=grpo", "grpo.loss_type=bnpo")


@pytest.mark.parametrize("epochs", [1, 2])
def test_the_first_epoch_starts_at_ratio_one_and_kl_zero(base, tmp_path, toy_reward, epochs):
    # No CE term: the batch holds source-only sentences alone.
    cfg = make_config(base, tmp_path / "run", *FAST, f"grpo.epochs={epochs}", "grpo.kl_coef=0.1", "grpo.ce_weight=0.0")
    method = build(cfg)
    (r,) = method.finish_rollouts([method.rollout(mono_batch(4))], gather=lambda t: t)
    # Old log-probs are kept only for a later epoch's ratio.
    assert (r.old_logp is None) == (epochs == 1)
    assert r.ref_logp is not None and (r.ref_logp[~r.samples.mask] == 0).all()
    out = method.loss(r)
    # The policy that sampled is the one updated, and it is the initial model.
    assert out.metrics["grpo/ratio"] == pytest.approx(1.0, abs=1e-6) and out.metrics["grpo/clipfrac"] == 0.0
    assert out.metrics["grpo/kl"] == 0.0
    assert set(out.terms) == {"pg"} and torch.isfinite(out.loss)


def test_without_a_kl_term_no_reference_is_kept(base, tmp_path, toy_reward):
    method = build(make_config(base, tmp_path / "run", *FAST, "grpo.kl_coef=0.0", "grpo.ce_weight=0.0"))
    assert method.initial is None
    (r,) = method.finish_rollouts([method.rollout(mono_batch(2))], gather=lambda t: t)
    assert r.ref_logp is None and "grpo/kl" not in method.loss(r).metrics


def test_with_lora_the_reference_is_the_translator_with_its_adapter_disabled(base, tmp_path, toy_reward):
    cfg = make_config(base, tmp_path / "run", *FAST, "model.lora.enabled=true", "model.lora.r=4", "grpo.ce_weight=0.0",
                      "grpo.epochs=2")
    method = build(cfg)
    assert method.initial.copy is None  # no second model in memory
    (r,) = method.finish_rollouts([method.rollout(mono_batch(2))], gather=lambda t: t)
    # A fresh adapter adds nothing yet: with or without it the policy is the same.
    assert torch.equal(r.old_logp, r.ref_logp)


def test_the_recipes_and_the_demo_know_it():
    from qeebm.evaluation.evaluate import QE_TRAINED_METHODS
    from qeebm.experiments.demo import CONFIGS, default_systems, tiny_recipe
    from qeebm.experiments.pairs import PAIRS
    from qeebm.experiments.recipe import build_plan, parse_args

    assert "grpo" in default_systems() and "grpo" in QE_TRAINED_METHODS  # `qeebm demo --systems all`
    # The tiny recipe borrows REINFORCE's settings until the sweep has tuned its own.
    tiny, like = (load_config(CONFIGS / tiny_recipe(name)) for name in ("grpo", "reinforce"))
    assert tiny.method == "grpo" and tiny.optim == like.optim and tiny.eval == like.eval
    assert tiny.grpo.sampling.num_samples == like.reinforce.sampling.num_samples and tiny.grpo.guards
    # A recipe runs it when named, under the protocol REINFORCE's runs get.
    recipe = PAIRS["en-mn"]
    assert "grpo" not in {r.system for r in build_plan(recipe, parse_args([], recipe, "test")).runs}
    plan = build_plan(recipe, parse_args(["--systems", "sft,reinforce,grpo", "--seeds", "1"], recipe, "test"))
    by_system = {r.system: r.cfg for r in plan.runs}
    cfg = by_system["grpo"]
    assert cfg.method == "grpo" and (cfg.optim, cfg.eval) == (by_system["reinforce"].optim, by_system["reinforce"].eval)
    assert cfg.qe.path == "Unbabel/wmt22-cometkiwi-da" and cfg.model.lora.enabled and cfg.grpo.guards


# ----------------------------------------------------------------------------------------------
# Through the loop


@pytest.mark.parametrize("family", ["nllb", "mbart"])
def test_two_steps_move_every_parameter(base, tmp_path, family):
    from support.qe import kiwi_dir

    cfg = make_config(base, tmp_path / "run", *FAST, f"model.name_or_path={tiny_translator_dir(family)}",
                      f"qe.path={kiwi_dir()}", "grpo.epochs=2")
    result = train(cfg)
    start = AutoModelForSeq2SeqLM.from_pretrained(cfg.model.name_or_path)
    ends = dict(AutoModelForSeq2SeqLM.from_pretrained(result.run_dir / "final").named_parameters())
    unchanged = [name for name, p in start.named_parameters() if torch.equal(p, ends[name])]
    assert not unchanged, f"no update reached {unchanged}"
    first, second = read_metrics(cfg.output.run_dir)
    for key in ("grpo/pg_loss", "grpo/kl", "grpo/ratio", "grpo/clipfrac", "grpo/reward", "grpo/score", "grpo/ce",
                "grpo/reward_std", "grpo/flat_groups", "diag/ratio_pg", "guard/any"):
        assert key in first and key in second, key
    assert all(math.isfinite(r["loss"]) for r in (first, second))
    # Samples end at </s> within 8 tokens: the language code is no action, </s> is one.
    assert all(0 < r["grpo/sample_len"] <= 7 for r in (first, second))
    # Step 1 samples from the initial model; its second epoch moved away from the sampler.
    assert 0 < first["grpo/kl"] and second["grpo/kl"] > 0


def test_resume_gives_identical_weights_and_curves(base, tmp_path, toy_reward):
    args = (*FAST, "grpo.epochs=2", "grpo.kl_coef=0.1", "grpo.scale_rewards=batch", "grpo.guards=false")
    straight = make_config(base, tmp_path / "straight", *args, "optim.max_steps=3")
    train(straight)
    # Same run, stopped after step 2 and resumed for step 3.
    split = make_config(base, tmp_path / "split", *args, "output.save_every=1")
    train(split)
    train(load_config(Path(split.output.run_dir) / "config.yaml", ["optim.max_steps=3"]))
    a, b = final_weights(straight.output.run_dir), final_weights(split.output.run_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # Every logged number of every step (timings aside), step 3's from the resumed run included.
    curve = lambda d: [{k: v for k, v in r.items() if "seconds" not in k and k != "elapsed"}  # noqa: E731
                       for r in read_metrics(d)]
    assert len(curve(straight.output.run_dir)) == 3
    assert curve(straight.output.run_dir) == curve(split.output.run_dir)


# ----------------------------------------------------------------------------------------------
# Two processes


def per_source_sample(real):
    """``methods.sampling.sample`` drawing each source's samples from a random stream seeded by the
    source alone, so the samples do not depend on which process or micro-batch holds the source."""
    from qeebm.methods.sampling import Samples

    def draw(translator, src, k, gen, enc=None, decode=True):
        parts = []
        for s in src:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(zlib.crc32(s.encode()))
                parts.append(real(translator, [s], k, gen, decode=decode))
        pad = translator.tokenizer.pad_token_id

        def stack(name, value):
            width = max(getattr(p, name).shape[1] for p in parts)
            return torch.cat([torch.nn.functional.pad(getattr(p, name), (0, width - getattr(p, name).shape[1]),
                                                      value=value) for p in parts])

        first = parts[0]
        return Samples(src=[x for p in parts for x in p.src],
                       hyps=[h for p in parts for h in p.hyps] if decode else None,
                       input_ids=stack("input_ids", pad), attention_mask=stack("attention_mask", 0),
                       sequences=stack("sequences", pad), mask=stack("mask", False), temperature=first.temperature,
                       suppress=first.suppress)

    return draw


@pytest.mark.usefixtures("one_launch_at_a_time")
@pytest.mark.slow
def test_two_processes_follow_one(base, tmp_path):
    """Two gloo processes, each with two micro-batches of 2 sources, follow the one-process run of 8
    sources per step: the same losses, rewards and final weights up to float rounding."""
    args = [*FAST, "optim.max_steps=3", "grpo.epochs=2", "grpo.kl_coef=0.1", "grpo.guards=false", "data.dev.path=",
            "output.save_every=0"]
    script = Path(__file__).resolve()
    one = subprocess.Popen([sys.executable, str(script), str(base), *args, f"output.run_dir={tmp_path / 'one'}"],
                           cwd=REPO, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    out = finish(one, 300, "one")
    assert one.returncode == 0, f"run 'one' failed:\n{out[-4000:]}"
    # Then, not beside it: a job of more processes than cores runs several times slower.
    two = launch_two(base, tmp_path / "two", *args, "optim.grad_accum=2", script=script)
    out = finish(two, 300, "two")
    assert two.returncode == 0, f"run 'two' failed:\n{out[-4000:]}"
    assert "2 processes x 2 micro-steps" in (tmp_path / "two" / "train.log").read_text(encoding="utf-8")
    records = {name: read_metrics(tmp_path / name) for name in ("one", "two")}
    for key in ("loss", "grpo/reward", "grpo/pg_loss", "grpo/kl", "grpo/ratio", "grpo/reward_std"):
        got, want = [r[key] for r in records["two"]], [r[key] for r in records["one"]]
        assert len(want) == 3 and got == pytest.approx(want, rel=1e-4, abs=1e-7), key
    a, b = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-5, msg=key)


if __name__ == "__main__":
    from qeebm.methods import grpo

    from support.runs import main

    common.build_scorer = lambda cfg, device: HashScorer()
    grpo.sample = per_source_sample(grpo.sample)
    main(sys.argv[1:])
