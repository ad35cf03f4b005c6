"""Method ``reinforce`` through the training loop on tiny translators: every parameter moves, a toy
reward pulls the policy its way, the step-wide baseline and scaling, and the running mean resumes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from qeebm.methods import common, rl
from qeebm.methods.reinforce import Reinforce, ReinforceRollout
from qeebm.methods.rl import RunningMeanBaseline
from qeebm.training.checkpoint import latest_checkpoint
from qeebm.training.loop import train
from qeebm.translation.translator import Translator

from support.runs import make_config, read_metrics, write_tiny_world_with_mono
from support.tiny import tiny_texts, tiny_translator_dir

# Short samples and few of them: the tests are about plumbing, not learning.
FAST = ("reinforce.sampling.max_new_tokens=8", "reinforce.sampling.num_samples=2", "optim.max_steps=2")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The loop tests' tiny world plus a source-only pool."""
    return write_tiny_world_with_mono(tmp_path_factory.mktemp("world"))


class ToyScorer:
    """Reward 1 when a translation starts with a Latin letter, else 0: decided by the first sampled
    token alone, so the policy gradient has one clear place to act."""

    def score(self, src, mt):
        return [1.0 if m.strip()[:1].isascii() and m.strip()[:1].isalpha() else 0.0 for m in mt]


@pytest.fixture
def toy_reward(monkeypatch):
    monkeypatch.setattr(common, "build_scorer", lambda cfg, device: ToyScorer())


@pytest.mark.parametrize("family", ["nllb", "mbart"])
def test_two_steps_move_every_trainable_parameter(base, tmp_path, family):
    from support.qe import kiwi_dir

    cfg = make_config(base, tmp_path / "run", "method=reinforce", f"model.name_or_path={tiny_translator_dir(family)}",
                      f"qe.path={kiwi_dir()}", "output.save_every=1", "reinforce.baseline=running_mean", *FAST)
    result = train(cfg)
    start = AutoModelForSeq2SeqLM.from_pretrained(cfg.model.name_or_path)
    ends = dict(AutoModelForSeq2SeqLM.from_pretrained(result.run_dir / "final").named_parameters())
    unchanged = [name for name, p in start.named_parameters() if torch.equal(p, ends[name])]
    assert not unchanged, f"no update reached {unchanged}"

    records = read_metrics(cfg.output.run_dir)
    for key in ("reinforce/reward", "reinforce/score", "reinforce/advantage", "reinforce/sample_len",
                "reinforce/pg_loss", "reinforce/ce", "reinforce/guard_penalty", "reinforce/score_std",
                "reinforce/advantage_std", "diag/ratio_pg", "guard/any", "guard/script"):
        assert all(key in r for r in records), key
    # Samples end at </s> within 8 tokens: the language code is no action, </s> is one.
    assert all(0 < r["reinforce/sample_len"] <= 7 for r in records)
    # The running mean is checkpointed: 2 steps x 8 sources x 2 samples seen.
    state = torch.load(latest_checkpoint(Path(cfg.output.run_dir) / "checkpoints") / "method.pt", weights_only=True)
    assert state["running_mean"]["count"] == 2 * 8 * 2


def test_bf16_mixed_precision_samples_and_trains(base, tmp_path, toy_reward, fresh_accelerate_state):
    """accelerate wraps the model's forward for autocast; generate still takes the sampler's
    encoder_outputs through it (a wrapper without forward's signature refuses them)."""
    cfg = make_config(base, tmp_path / "run", "method=reinforce", "optim.mixed_precision=bf16", *FAST)
    train(cfg)
    records = read_metrics(cfg.output.run_dir)
    assert [r["step"] for r in records if "loss" in r] == [1, 2]
    assert all(torch.isfinite(torch.tensor(r["loss"])) and 0 < r["reinforce/sample_len"] <= 7 for r in records if "loss" in r)


def first_token_mass(model_dir: Path, sources: list[str], favoured: list[int], cfg) -> float:
    """Mean probability, over ``sources``, that the first token after the language code is favoured."""
    translator = Translator.load(dataclasses.replace(cfg.model, name_or_path=str(model_dir)))
    enc = translator.encode(sources)
    start = torch.tensor([[translator.tokenizer.eos_token_id, translator.tgt_lang_id]] * len(sources))
    translator.model.eval()
    with torch.no_grad():
        logits = translator.model(**enc, decoder_input_ids=start).logits[:, -1]  # [N, V]
    return logits.softmax(-1)[:, favoured].sum(-1).mean().item()


def test_toy_reward_moves_probability_toward_rewarded_samples(base, tmp_path, toy_reward):
    # Pure policy gradient (no CE), leave-one-out baseline: only the toy reward drives the update.
    cfg = make_config(base, tmp_path / "run", "method=reinforce", "reinforce.ce_weight=0.0", "reinforce.pg_weight=1.0",
                      "reinforce.baseline=rloo", "reinforce.reward_scaling=none", "reinforce.guards=false",
                      "reinforce.sampling.num_samples=8", "reinforce.sampling.max_new_tokens=3", "optim.max_steps=2", "optim.batch_size=16",
                      "optim.lr=1e-2")
    result = train(cfg)
    tok = Translator.load(cfg.model).tokenizer
    pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
    special = set(tok.all_special_ids)
    favoured = [i for i, p in enumerate(pieces)
                if i not in special and p.lstrip("\u2581")[:1].isascii() and p.lstrip("\u2581")[:1].isalpha()]
    sources = tiny_texts(64, seed=5)[0::2][:16]
    before = first_token_mass(Path(cfg.model.name_or_path), sources, favoured, cfg)
    after = first_token_mass(result.run_dir / "final", sources, favoured, cfg)
    # From 0.34 to 0.38-0.40 over seeds 1-5.
    assert after > before + 0.02, (before, after)
    records = read_metrics(cfg.output.run_dir)
    assert records[-1]["reinforce/reward"] > 0  # the toy reward was seen


# ----------------------------------------------------------------------------------------------
# Advantages over the whole step, without a model


def rollout(scores: list[list[float]], global_samples: int, penalty: list[list[float]] | None = None) -> ReinforceRollout:
    r = torch.tensor(scores)
    p = torch.zeros_like(r) if penalty is None else torch.tensor(penalty)
    samples = SimpleNamespace(mask=torch.ones(r.numel(), 3, dtype=torch.bool))  # 3 actions per sample
    return ReinforceRollout(batch=None, samples=samples, scores=r, penalty=p, guards=None, global_samples=global_samples)


def bare_method(baseline: str, scaling: str, penalty_unit: str = "spread") -> Reinforce:
    method = Reinforce.__new__(Reinforce)
    method.c = SimpleNamespace(baseline=baseline, reward_scaling=scaling)
    method.cfg = SimpleNamespace(guards=SimpleNamespace(penalty_unit=penalty_unit))
    method.running = RunningMeanBaseline()
    method.reward = SimpleNamespace(step_means=lambda terms, gather: {})  # one QE: no terms to log
    return method


def test_running_mean_baseline_and_scaling_use_the_whole_step():
    # Step 1 has no past: its own mean 2.5 is the baseline. Centred: [-1.5, -0.5, 0.5, 1.5]; the
    # largest |centred| of the step (1.5) scales all micro-batches alike.
    method = bare_method("running_mean", "max_abs")
    one = method.finish_rollouts([rollout([[1.0, 2.0]], 4), rollout([[3.0, 4.0]], 4)], gather=lambda t: t)
    assert torch.allclose(one[0].advantages, torch.tensor([[-1.0, -1 / 3]]))
    assert torch.allclose(one[1].advantages, torch.tensor([[1 / 3, 1.0]]))
    # Step 2 uses the mean of step 1 (2.5), not its own: centred [2.5, -2.5] -> [1, -1].
    (two,) = method.finish_rollouts([rollout([[5.0, 0.0]], 2)], gather=lambda t: t)
    assert torch.allclose(two.baselines, torch.full((1, 2), 2.5))
    assert torch.allclose(two.advantages, torch.tensor([[1.0, -1.0]]))
    assert method.state_dict()["running_mean"] == {"total": 15.0, "count": 6}

    # One micro-batch holding the same step gives the same advantages.
    whole = bare_method("running_mean", "max_abs")
    (both,) = whole.finish_rollouts([rollout([[1.0, 2.0], [3.0, 4.0]], 4)], gather=lambda t: t)
    assert torch.allclose(both.advantages, torch.cat([one[0].advantages, one[1].advantages]))


def test_leave_one_out_baseline_without_scaling():
    method = bare_method("rloo", "none")
    (r,) = method.finish_rollouts([rollout([[1.0, 2.0, 6.0]], 3)], gather=lambda t: t)
    # b = [4, 3.5, 1.5] (the other two samples' mean)
    assert torch.allclose(r.advantages, torch.tensor([[-3.0, -1.5, 4.5]]))


def test_default_rloo_whitened_advantages_hand_computed():
    # Two sources, three samples each. RLOO: b = mean of the other two; centred per source
    # [-3, -1.5, 4.5] and [0, 0, 0] -> step std (unbiased, over 6 values; the mean is 0) = sqrt(31.5/5).
    method = bare_method("rloo", "whiten")
    (r,) = method.finish_rollouts([rollout([[1.0, 2.0, 6.0], [5.0, 5.0, 5.0]], 6)], gather=lambda t: t)
    std = (31.5 / 5) ** 0.5
    assert torch.allclose(r.advantages, torch.tensor([[-3.0, -1.5, 4.5], [0.0, 0.0, 0.0]]) / std, atol=1e-6)
    # The policy gradient is a token mean over the step: 6 samples x 3 actions.
    assert r.global_tokens == 18


def test_guard_hits_rank_last_on_the_scale_of_the_step_spread():
    # Scores [0.40, 0.42, 0.50, 0.90]; the last one trips a guard (penalty 1). Spread unit: at most the
    # lowest unflagged score (0.40) minus 1 std of all four scores; the rest keep their scores.
    scores = torch.tensor([0.40, 0.42, 0.50, 0.90])
    penalty = torch.tensor([0.0, 0.0, 0.0, 1.0])
    std = scores.std()
    got = rl.penalised_rewards(scores, penalty, "spread", scores, penalty)
    assert torch.allclose(got, torch.tensor([0.40, 0.42, 0.50, 0.40 - std.item()]))
    # The published unit subtracts the penalty itself.
    assert torch.allclose(rl.penalised_rewards(scores, penalty, "reward", scores, penalty),
                          torch.tensor([0.40, 0.42, 0.50, -0.10]))
    # A flagged output the QE already scores below the floor keeps its (lower) score; when every
    # output is flagged the floor is the lowest of them all.
    low = rl.penalised_rewards(torch.tensor([-5.0]), torch.tensor([1.0]), "spread", scores, penalty)
    assert low.item() == -5.0
    everything = torch.ones(4)
    assert torch.allclose(rl.penalised_rewards(scores, 0.5 * everything, "spread", scores, everything),
                          torch.full((4,), 0.40 - 0.5 * std.item()))
    # In the step: the hit's advantage is the most negative one, by far less than a fixed 1.0 would give.
    method = bare_method("rloo", "none")
    (r,) = method.finish_rollouts([rollout([[0.40, 0.42, 0.50, 0.90]], 4, penalty=[[0.0, 0.0, 0.0, 1.0]])],
                                  gather=lambda t: t)
    assert r.advantages.argmin().item() == 3 and r.advantages.min().item() > -0.5


def test_the_reward_offers_its_qe_to_validation(base, tmp_path, monkeypatch):
    """REINFORCE and PPO hand the reward's QE model to validation (``Method.frozen_qes``), keyed by
    ``qe.path``; a scorer without a model (a toy) offers nothing."""
    from types import SimpleNamespace

    cfg = make_config(base, tmp_path / "run", "method=reinforce", "qe.path=some/kiwi")
    translator = SimpleNamespace(device=torch.device("cpu"), num_tokens=len)
    model = torch.nn.Linear(1, 1)
    monkeypatch.setattr(common, "build_scorer", lambda cfg, device: SimpleNamespace(model=model))
    assert common.QEReward(cfg, translator, False).frozen_qes() == {"some/kiwi": model}
    monkeypatch.setattr(common, "build_scorer", lambda cfg, device: ToyScorer())
    assert common.QEReward(cfg, translator, False).frozen_qes() == {}
