"""Method ``ppo`` on tiny translators: rollouts end at </s> and padding carries nothing, the first
update starts from ratio 1 and KL 0, the LoRA reference costs no second model, every parameter (the
value head included) moves, and a resumed run matches an uninterrupted one."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest
import torch
from accelerate.utils import set_seed
from transformers import AutoModelForSeq2SeqLM

from qeebm.config import load_config
from qeebm.methods import common, rl
from qeebm.methods.base import Batch
from qeebm.methods.ppo import PPO, PPOConfig
from qeebm.training.checkpoint import latest_checkpoint, step_dir
from qeebm.training.loop import train
from qeebm.translation.translator import Translator

from support.runs import final_weights, make_config, read_metrics, write_tiny_world_with_mono
from support.tiny import tiny_texts, tiny_translator_dir

FAST = ("method=ppo", "ppo.sampling.max_new_tokens=8", "ppo.minibatches=2", "optim.max_steps=2")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The loop tests' tiny world plus a source-only pool."""
    return write_tiny_world_with_mono(tmp_path_factory.mktemp("world"))


class LengthScorer:
    """Toy QE: longer translations score higher, so rewards vary and advantages are not all 0."""

    def score(self, src, mt):
        return [len(m) / 10 for m in mt]


@pytest.fixture
def toy_reward(monkeypatch):
    monkeypatch.setattr(common, "build_scorer", lambda cfg, device: LengthScorer())


def method_state(run_dir: Path, step: int | None = None) -> dict:
    root = Path(run_dir) / "checkpoints"
    where = step_dir(root, step) if step is not None else latest_checkpoint(root)
    return torch.load(where / "method.pt", weights_only=True)


def test_defaults_are_the_published_setup():
    c = PPOConfig()
    assert (c.init_kl_coef, c.kl_target, c.kl_horizon) == (rl.INIT_KL_COEF, rl.KL_TARGET, rl.KL_HORIZON)
    assert (c.gamma, c.lam, c.clip, c.value_clip, c.value_coef) == (rl.GAMMA, rl.LAM, rl.CLIP, rl.VALUE_CLIP, rl.VALUE_COEF)
    # batch 20 / minibatch 4 / 2 epochs, with optim.batch_size: 20
    assert (c.epochs, c.minibatches) == (2, 5)


@pytest.mark.parametrize("family", ["nllb", "mbart"])
def test_two_steps_move_every_parameter_and_start_at_kl_zero(base, tmp_path, family):
    from support.qe import kiwi_dir

    cfg = make_config(base, tmp_path / "run", *FAST, f"model.name_or_path={tiny_translator_dir(family)}",
                      f"qe.path={kiwi_dir()}", "output.save_every=1")
    result = train(cfg)
    start = AutoModelForSeq2SeqLM.from_pretrained(cfg.model.name_or_path)
    ends = dict(AutoModelForSeq2SeqLM.from_pretrained(result.run_dir / "final").named_parameters())
    unchanged = [name for name, p in start.named_parameters() if torch.equal(p, ends[name])]
    assert not unchanged, f"no update reached {unchanged}"
    # The value head is trained too (and checkpointed): it moved during step 2.
    one, two = method_state(cfg.output.run_dir, 1), method_state(cfg.output.run_dir, 2)
    for key in one["value_head"]:
        assert not torch.equal(one["value_head"][key], two["value_head"][key]), key

    first, second = read_metrics(cfg.output.run_dir)
    for key in ("ppo/kl", "ppo/kl_coef", "ppo/clipfrac", "ppo/approx_kl", "ppo/value_loss", "ppo/policy_loss",
                "ppo/reward", "ppo/score", "guard/any"):
        assert key in first and key in second, key
    # Step 1 samples from the initial policy, which is the reference: KL exactly 0, reward = score.
    assert first["ppo/kl"] == 0.0 and first["ppo/reward"] == pytest.approx(first["ppo/score"])
    assert first["ppo/kl_coef"] == pytest.approx(0.2)
    # KL 0 < target 6: the controller lowers the coefficient by 0.2 * 8 samples / 10000.
    assert second["ppo/kl_coef"] == pytest.approx(0.2 * (1 - 0.2 * 8 / 10_000))
    assert two["kl_ctl"]["value"] == pytest.approx(0.2 * (1 - 0.2 * 8 / 10_000) ** 2)


def test_one_update_per_step_starts_from_ratio_one(base, tmp_path, toy_reward):
    cfg = make_config(base, tmp_path / "run", *FAST, "ppo.epochs=1", "ppo.minibatches=1", "optim.max_steps=1")
    train(cfg)
    (record,) = read_metrics(cfg.output.run_dir)
    assert record["ppo/ratio"] == pytest.approx(1.0, abs=1e-6)
    assert record["ppo/clipfrac"] == 0.0
    assert record["ppo/approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert record["ppo/kl"] == 0.0


# ----------------------------------------------------------------------------------------------
# The method alone


def build(cfg, edit=None) -> PPO:
    set_seed(cfg.seed)
    translator = Translator.load(cfg.model)
    if edit is not None:
        edit(translator.model)
    return PPO(cfg, translator, translator.model)


def likely_eos(model) -> None:
    # mBART's final_logits_bias: </s> becomes likely, so rows end at different lengths.
    with torch.no_grad():
        model.final_logits_bias[0, 2] = 4.0


def mono_batch(n: int) -> Batch:
    sources = tiny_texts(64, seed=5)[0::2][:n]
    empty = torch.zeros(0, 0, dtype=torch.long)
    return Batch(src=[], tgt=None, input_ids=empty, attention_mask=empty, labels=None, global_tokens=0,
                 global_examples=0, step=1, mono=sources, global_mono=n)


def test_rollouts_stop_at_eos_and_padding_carries_nothing(base, tmp_path, toy_reward):
    cfg = make_config(base, tmp_path / "run", "method=ppo", f"model.name_or_path={tiny_translator_dir('mbart')}",
                      "ppo.sampling.max_new_tokens=12", "ppo.sampling.num_samples=2", "ppo.minibatches=2", "ppo.epochs=2")
    method = build(cfg, edit=likely_eos)
    (r,) = method.finish_rollouts([method.rollout(mono_batch(6))], gather=lambda t: t)
    s, eos, pad = r.samples, 2, 1
    tokens = s.tokens  # [B, T], tokens[:, 0] is the forced language code
    assert (tokens[:, 0] == method.translator.tgt_lang_id).all()
    ended = (tokens == eos).any(dim=1)
    assert ended.sum() >= 2 and (s.mask.sum(dim=1) < tokens.shape[1] - 1).any()
    capped = 0
    for row, mask in zip(tokens, s.mask):
        hits = (row == eos).nonzero().flatten()
        if len(hits):
            first = hits[0].item()
            assert (row[first + 1:] == pad).all(), "generation went on after </s>"
            assert not mask[first + 1:].any() and not mask[0]
            # mBART forces </s> at the 12-token cap: that one is no action of the policy.
            forced = first == 11
            capped += forced
            assert mask[1:first].all() and bool(mask[first]) != forced
    assert capped >= 1  # the case is exercised
    off = ~s.mask
    for name in ("logp", "ref_logp", "values", "token_rewards", "advantages", "returns"):
        assert (getattr(r, name)[off] == 0).all(), name
    assert (r.logp[s.mask] < 0).all()
    # The score sits on the last action of each row: summed rewards = score - kl_coef * KL.
    assert torch.allclose(r.token_rewards.sum(1), r.scores - r.kl_coef * r.kl, atol=1e-6)

    # The first minibatch of the first epoch is scored by the policy that sampled it: ratio 1.
    first = method.loss(method.minibatch(r, 0, 0))
    assert first.metrics["ppo/ratio"] == pytest.approx(1.0, abs=1e-6)
    assert first.metrics["ppo/clipfrac"] == 0.0
    assert first.metrics["ppo/kl"] == 0.0
    # Every row is in exactly one minibatch of each epoch; each minibatch's normaliser is its tokens.
    for epoch in range(2):
        rows = torch.cat([rw for rw, _ in r.plan[epoch]])
        assert sorted(rows.tolist()) == list(range(tokens.shape[0]))
        for m, (rw, _) in enumerate(r.plan[epoch]):
            assert r.norms[epoch, m, 0].item() == s.mask[rw].sum().item()


def count_parameters(method: PPO) -> int:
    """Distinct parameters the method can reach through its attributes."""
    seen = {}
    for value in vars(method).values():
        modules = [value] if isinstance(value, torch.nn.Module) else []
        if value is method.translator:
            modules = [value.model]
        for module in modules:
            for p in module.parameters():
                seen[id(p)] = p.numel()
    return sum(seen.values())


def test_lora_reference_is_the_same_model_with_the_adapter_disabled(base, tmp_path, toy_reward, monkeypatch):
    # Dropout on in the model: PPO's forwards (and the reference) run without it all the same.
    lora = make_config(base, tmp_path / "lora", "method=ppo", "model.lora.enabled=true", "model.lora.r=4",
                       "model.lora.dropout=0.1", "model.dropout=0.1", "ppo.sampling.max_new_tokens=6")
    method = build(lora)
    model = method.translator.model
    head = sum(p.numel() for p in method.value_head.parameters())
    assert method.reference is None
    assert count_parameters(method) == sum(p.numel() for p in model.parameters()) + head

    calls = []
    original = type(model).disable_adapter

    @contextlib.contextmanager
    def counting(self):
        calls.append(1)
        with original(self):
            yield

    monkeypatch.setattr(type(model), "disable_adapter", counting)
    model.train()
    r = method.rollout(mono_batch(4))
    assert calls == [1] and model.training
    # LoRA's B starts at 0: with or without the adapter the policy is the same.
    assert torch.equal(r.logp, r.ref_logp)
    # Without LoRA the reference is a frozen copy: a second model's worth of parameters.
    full = build(make_config(base, tmp_path / "full", "method=ppo"))
    n_model = sum(p.numel() for p in full.translator.model.parameters())
    assert count_parameters(full) == 2 * n_model + head
    assert not any(p.requires_grad for p in full.reference.parameters())


def test_resume_gives_identical_weights_value_head_and_kl_coef(base, tmp_path, toy_reward):
    straight = make_config(base, tmp_path / "straight", *FAST, "optim.max_steps=3")
    train(straight)
    # Same run, stopped after step 2 and resumed for step 3.
    split = make_config(base, tmp_path / "split", *FAST, "output.save_every=1")
    train(split)
    train(load_config(Path(split.output.run_dir) / "config.yaml", ["optim.max_steps=3"]))
    a, b = final_weights(straight.output.run_dir), final_weights(split.output.run_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = method_state(straight.output.run_dir), method_state(split.output.run_dir)
    assert sa["kl_ctl"] == sb["kl_ctl"] and sa["kl_ctl"]["value"] != 0.2
    assert all(torch.equal(sa["value_head"][k], sb["value_head"][k]) for k in sa["value_head"])
    ra = [r["ppo/reward"] for r in read_metrics(straight.output.run_dir)]
    rb = [r["ppo/reward"] for r in read_metrics(split.output.run_dir)]
    assert ra == rb


# ----------------------------------------------------------------------------------------------
# The fixes of docs/rl_baselines.md: the critic, the sampling distribution, special tokens


@pytest.mark.parametrize("critic", ["detached", "shared"])
def test_a_detached_critic_has_no_gradient_path_into_the_translator(base, tmp_path, toy_reward, critic):
    cfg = make_config(base, tmp_path / "run", "method=ppo", "ppo.sampling.max_new_tokens=8", "ppo.minibatches=1",
                      f"ppo.critic={critic}")
    method = build(cfg)
    (r,) = method.finish_rollouts([method.rollout(mono_batch(4))], gather=lambda t: t)
    # Its output layer starts at 0: every first value estimate is exactly 0.
    assert (r.values == 0).all()
    with torch.no_grad():  # a trained head, as after a few updates: now the trunk could be reached
        method.value_head.out.weight.fill_(0.1)
    out = method.loss(method.minibatch(r, 0, 0))
    out.terms["value"].backward()
    reached = [n for n, p in method.translator.model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    head = [p.grad for p in method.value_head.parameters()]
    assert all(g is not None for g in head) and method.value_head.out.weight.grad.abs().sum() > 0
    if critic == "detached":
        assert not reached
    else:
        assert reached  # TRL's shared trunk: the value loss trains the decoder


def test_old_logprobs_are_the_sampling_distributions(base, tmp_path, toy_reward):
    # Temperature 0.7 and the suppressed special tokens: generate()'s own processed scores at each
    # step give the log-probability each drawn token was sampled with; PPO records the same.
    cfg = make_config(base, tmp_path / "run", "method=ppo", "ppo.sampling.max_new_tokens=8", "ppo.sampling.temperature=0.7")
    method = build(cfg)
    tr = method.translator
    sources = mono_batch(4).mono
    enc = tr.encode(sources)
    torch.manual_seed(3)
    # transformers' own sampling, whose scores are the processed distribution (the default sampler's
    # are its one-hot draws); both samplers draw from that distribution.
    gen = dataclasses.replace(method.gen, sampler="multinomial")
    out = tr.model.generate(**enc, **tr.generation_kwargs(gen), eos_token_id=2, pad_token_id=1,
                            output_scores=True, return_dict_in_generate=True)
    tokens = out.sequences[:, 1:]
    mask = rl.eos_mask(tokens, 2, 1, n_forced=1)
    sampled = torch.stack([torch.log_softmax(step.float(), -1) for step in out.scores], dim=1)  # [B, T, V]
    expected = torch.where(mask, sampled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), torch.zeros(()))
    samples = reinforce_samples(tr, sources, out.sequences, method.gen)
    with method.policy_mode(tr.model), torch.no_grad():
        logp, _, _ = method.forward(tr.model, samples)
    assert torch.allclose(logp, expected, atol=1e-5)


def reinforce_samples(tr, sources, sequences, gen):
    from qeebm.methods.sampling import Samples

    enc = tr.encode(sources)
    tokens = sequences[:, 1:]
    return Samples(src=sources, hyps=None, input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                   sequences=sequences, mask=rl.eos_mask(tokens, 2, 1, n_forced=1), temperature=gen.temperature,
                   suppress=torch.tensor(tr.suppressed_ids))


@pytest.mark.parametrize("family", ["nllb", "mbart"])
def test_no_special_token_but_eos_is_ever_sampled(base, tmp_path, family):
    from qeebm.methods.sampling import sample, sampling_config

    cfg = make_config(base, tmp_path / "run", "method=ppo", f"model.name_or_path={tiny_translator_dir(family)}")
    tr = Translator.load(cfg.model)
    specials = sorted(set(tr.tokenizer.all_special_ids) - {2})
    # Make every special token but </s> the model's favourite: unsuppressed, they would fill the rows.
    bias = tr.model.final_logits_bias if family == "mbart" else None
    with torch.no_grad():
        if bias is not None:
            bias[0, specials] = 6.0
        else:
            tr.model.lm_head.weight[specials] *= 0
            tr.model.lm_head.weight[specials] += tr.model.lm_head.weight[5] * 3
    torch.manual_seed(0)
    s = sample(tr, tiny_texts(64, seed=5)[0::2][:16], 8, sampling_config(cfg.ppo.sampling))  # 128 rows
    actions = s.tokens[s.mask]
    assert actions.numel() > 200
    assert not torch.isin(actions, torch.tensor(specials)).any()
    # Outside the actions: the forced language code first, padding after </s>, nothing else special.
    assert (s.tokens[:, 0] == tr.tgt_lang_id).all()


def test_ppo_refuses_a_truncated_sampler(base, tmp_path):
    from qeebm.errors import QeebmError

    for override in ("ppo.sampling.top_p=0.9", "ppo.sampling.top_k=50"):
        with pytest.raises(QeebmError, match="ppo.sampling.top_k must be 0 and ppo.sampling.top_p 1.0"):
            PPO.check_config(make_config(base, tmp_path / "run", "method=ppo", override))
