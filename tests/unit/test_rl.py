import math

import pytest
import torch

from qeebm.methods.rl import (
    AdaptiveKLController,
    FixedKLController,
    RunningMeanBaseline,
    eos_mask,
    gae,
    masked_moments,
    normalise_rewards,
    per_token_rewards,
    policy_gradient_loss,
    ppo_policy_loss,
    ppo_value_loss,
    rloo_baseline,
    sequence_kl,
    sequence_logprobs,
    whiten,
)

EOS, PAD = 2, 1


# ----------------------------------------------------------------------------------------------
# Sequences


def test_eos_mask_keeps_up_to_first_eos_or_all_non_pad():
    tokens = torch.tensor(
        [
            [5, 6, EOS, 7, EOS],  # tokens after the first EOS are out even when not padding
            [5, 6, 7, PAD, PAD],  # cut off by max_new_tokens: every non-pad token
            [5, EOS, PAD, PAD, PAD],
        ]
    )
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(eos_mask(tokens, EOS, PAD), expected)
    forced = expected.clone()
    forced[:, 0] = False
    assert torch.equal(eos_mask(tokens, EOS, PAD, n_forced=1), forced)


def test_sequence_logprobs_ignores_everything_after_eos_and_padding():
    torch.manual_seed(0)
    tokens = torch.tensor([[3, 4, EOS, 5, PAD], [3, 4, 5, 6, PAD]])
    mask = eos_mask(tokens, EOS, PAD)
    logits = torch.randn(2, 5, 7, requires_grad=True)
    token_logp, seq_logp = sequence_logprobs(logits, tokens, mask)

    ref = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1) * mask
    assert torch.allclose(token_logp, ref, atol=1e-6)
    assert torch.allclose(seq_logp, ref.sum(1), atol=1e-6)
    assert torch.all(token_logp[~mask] == 0)

    # Anything at masked positions: other logits (even -inf), other ids (even -100).
    logits2 = logits.detach().clone()
    logits2[~mask] = torch.randn(int((~mask).sum()), 7) * 100
    logits2[0, 4, 0] = -math.inf
    tokens2 = tokens.masked_fill(~mask, -100)
    token_logp2, seq_logp2 = sequence_logprobs(logits2, tokens2, mask)
    assert torch.equal(token_logp2, token_logp.detach())
    assert torch.equal(seq_logp2, seq_logp.detach())

    seq_logp.sum().backward()
    assert torch.all(logits.grad[~mask] == 0)


# ----------------------------------------------------------------------------------------------
# REINFORCE


def test_rloo_baseline_leaves_each_sample_out():
    # rewards [1, 2, 6]: b_0 = (2+6)/2 = 4, b_1 = (1+6)/2 = 3.5, b_2 = (1+2)/2 = 1.5
    rewards = torch.tensor([[1.0, 2.0, 6.0]])
    assert torch.allclose(rloo_baseline(rewards), torch.tensor([[4.0, 3.5, 1.5]]))
    with pytest.raises(ValueError, match="K >= 2"):
        rloo_baseline(torch.tensor([[1.0], [2.0]]))


def test_running_mean_baseline_uses_past_rewards_only_and_resumes():
    base = RunningMeanBaseline()
    first = torch.tensor([0.2, 0.4])
    # No past yet: the batch's own mean, 0.3.
    assert torch.allclose(base(first), torch.tensor([0.3, 0.3]))
    base.update(first)
    base.update(total=0.9, count=1)
    # mean of 0.2, 0.4, 0.9 = 0.5, whatever this batch holds
    assert torch.allclose(base(torch.tensor([10.0])), torch.tensor([0.5]))

    resumed = RunningMeanBaseline()
    resumed.load_state_dict(base.state_dict())
    assert resumed.value == base.value and resumed.count == 3


def test_normalise_rewards_published_max_abs_scaling():
    # centred on 0.4: [-0.2, 0.1, 0.4]; the largest |.| is 0.4 -> [-0.5, 0.25, 1.0]
    adv = normalise_rewards(torch.tensor([0.2, 0.5, 0.8]), baseline=0.4, scaling="max_abs")
    assert torch.allclose(adv, torch.tensor([-0.5, 0.25, 1.0]))
    white = normalise_rewards(torch.tensor([1.0, 2.0, 3.0]), scaling="whiten")
    # mean 2, unbiased std 1 -> [-1, 0, 1]
    assert torch.allclose(white, torch.tensor([-1.0, 0.0, 1.0]), atol=1e-6)
    with pytest.raises(ValueError, match="unknown reward scaling"):
        normalise_rewards(torch.zeros(2), scaling="tanh")


@pytest.mark.parametrize("baseline_kind", ["rloo", "running_mean"])
def test_reinforce_step_moves_probability_to_the_better_sample(baseline_kind):
    # A two-armed "translator": one logit vector, sampled arm 0 (reward 0.2) and arm 1 (reward 0.9).
    logits = torch.zeros(2, requires_grad=True)
    arms = torch.tensor([0, 1])
    rewards = torch.tensor([0.2, 0.9])
    if baseline_kind == "rloo":
        baseline = rloo_baseline(rewards.view(1, 2)).view(2)  # [0.9, 0.2]
    else:
        past = RunningMeanBaseline()
        past.update(torch.tensor([0.5]))
        baseline = past(rewards)  # [0.5, 0.5]
    advantages = normalise_rewards(rewards, baseline)
    seq_logp = torch.log_softmax(logits, -1)[arms]  # [2]
    loss = policy_gradient_loss(seq_logp, advantages)
    loss.backward()
    with torch.no_grad():
        before = torch.softmax(logits, -1)[1].item()
        after = torch.softmax(logits - 1.0 * logits.grad, -1)[1].item()
    assert before == 0.5 and after > before


def test_policy_gradient_loss_sums_over_the_normaliser_and_detaches_advantages():
    seq_logp = torch.tensor([-1.0, -2.0, -3.0, -4.0], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0], requires_grad=True)
    full = policy_gradient_loss(seq_logp, adv)
    # -(1*-1 + -1*-2 + 0.5*-3 + 2*-4) / 4 = -(-1 + 2 - 1.5 - 8) / 4 = 2.125
    assert math.isclose(full.item(), 2.125)
    halves = policy_gradient_loss(seq_logp[:2], adv[:2], normaliser=4) + policy_gradient_loss(
        seq_logp[2:], adv[2:], normaliser=4
    )
    assert math.isclose(halves.item(), full.item())
    full.backward()
    assert adv.grad is None


# ----------------------------------------------------------------------------------------------
# PPO


def test_gae_hand_computed_and_padding_carries_nothing():
    # T = 3, gamma = 1, lam = 0.95, rewards r = [0, 0, 1], values V = [0.5, 0.6, 0.7]
    # TD errors:  d2 = 1 + 0 - 0.7 = 0.3 (nothing after the last token)
    #             d1 = 0 + 0.7 - 0.6 = 0.1,  d0 = 0 + 0.6 - 0.5 = 0.1
    # advantages: A2 = 0.3,  A1 = 0.1 + 0.95 * 0.3 = 0.385,  A0 = 0.1 + 0.95 * 0.385 = 0.46575
    # returns = A + V = [0.96575, 0.985, 1.0]
    rewards = torch.tensor([[0.0, 0.0, 1.0, 9.0, -9.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 5.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.95)
    assert torch.allclose(adv, torch.tensor([[0.46575, 0.385, 0.3, 0.0, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[0.96575, 0.985, 1.0, 0.0, 0.0]]))

    # The unpadded row alone gives the same valid values.
    adv3, ret3 = gae(rewards[:, :3], values[:, :3], mask[:, :3], gamma=1.0, lam=0.95)
    assert torch.allclose(adv3, adv[:, :3]) and torch.allclose(ret3, ret[:, :3])

    # A masked position in front (the forced language code) is skipped, not a step.
    adv_f, ret_f = gae(
        torch.tensor([[4.0, 0.0, 0.0, 1.0]]), torch.tensor([[3.0, 0.5, 0.6, 0.7]]), torch.tensor([[0, 1, 1, 1]])
    )
    assert torch.allclose(adv_f, torch.tensor([[0.0, 0.46575, 0.385, 0.3]]))
    assert torch.allclose(ret_f, torch.tensor([[0.0, 0.96575, 0.985, 1.0]]))


def test_per_token_rewards_put_the_score_on_the_last_valid_token():
    logp = torch.tensor([[-1.0, -2.0, -3.0, 0.0], [-1.0, -1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    score = torch.tensor([0.8, 0.6])
    # logp == ref_logp: the KL part is 0 and only the scores remain.
    same = per_token_rewards(score, logp, logp.clone(), mask, kl_coef=0.2)
    assert torch.equal(same, torch.tensor([[0.0, 0.0, 0.8, 0.0], [0.0, 0.6, 0.0, 0.0]]))
    # ref 0.5 lower everywhere: -0.2 * 0.5 = -0.1 at every valid token.
    ref = logp - 0.5
    r = per_token_rewards(score, logp, ref, mask, kl_coef=0.2)
    assert torch.allclose(r, torch.tensor([[-0.1, -0.1, 0.7, 0.0], [-0.1, 0.5, 0.0, 0.0]]))
    assert torch.allclose(sequence_kl(logp, ref, mask), torch.tensor([1.5, 1.0]))
    # A row without any valid token gets nothing.
    empty = per_token_rewards(score[:1], logp[:1], ref[:1], torch.zeros(1, 4), kl_coef=0.2)
    assert torch.equal(empty, torch.zeros(1, 4))


def test_first_ppo_minibatch_has_ratio_one_and_no_clipping():
    torch.manual_seed(0)
    old = torch.randn(3, 5)
    logp = old.clone().requires_grad_(True)
    adv = torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    loss, stats = ppo_policy_loss(logp, old, adv, mask, clip=0.2)
    assert stats["ratio_mean"].item() == 1.0
    assert stats["clipfrac"].item() == 0.0
    assert stats["approx_kl"].item() == 0.0
    # ratio 1: the loss is -mean(A) over valid tokens
    assert torch.allclose(loss, -(adv * mask).sum() / mask.sum())


def test_ppo_clipping_hand_computed():
    # clip 0.2; four tokens:
    #   r = 1.5, A = +1: max(-1.5, -1.2) = -1.2   clipped
    #   r = 1.5, A = -1: max( 1.5,  1.2) =  1.5
    #   r = 0.5, A = +1: max(-0.5, -0.8) = -0.5
    #   r = 0.5, A = -1: max( 0.5,  0.8) =  0.8   clipped
    # loss = (-1.2 + 1.5 - 0.5 + 0.8) / 4 = 0.15, clipfrac = 2 / 4
    ratio = torch.tensor([[1.5, 1.5, 0.5, 0.5]])
    old = torch.zeros(1, 4)
    logp = ratio.log().requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    mask = torch.ones(1, 4)
    loss, stats = ppo_policy_loss(logp, old, adv, mask, clip=0.2)
    assert math.isclose(loss.item(), 0.15, abs_tol=1e-6)
    assert math.isclose(stats["clipfrac"].item(), 0.5)
    loss.backward()
    # clipped tokens pass no gradient; d/dlogp of -A r / 4 = -A r / 4 elsewhere
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 1.5 / 4, -0.5 / 4, 0.0]]))

    # Split over two micro-batches with the global token count: the same total.
    halves = [slice(0, 2), slice(2, 4)]
    parts = [ppo_policy_loss(logp[:, h], old[:, h], adv[:, h], mask[:, h], 0.2, normaliser=4)[0] for h in halves]
    assert math.isclose(sum(p.item() for p in parts), 0.15, abs_tol=1e-6)


def test_ppo_value_loss_hand_computed():
    # clip 0.2, return 2.0, old value 1.0:
    #   V = 1.5: V_clip = 1.2, max((1.5-2)^2, (1.2-2)^2) = max(0.25, 0.64) = 0.64   clipped
    #   V = 1.1: inside the clip, (1.1-2)^2 = 0.81
    # loss = 0.5 * (0.64 + 0.81) / 2 = 0.3625; the padded third token counts for nothing
    values = torch.tensor([[1.5, 1.1, 50.0]], requires_grad=True)
    old = torch.tensor([[1.0, 1.0, 0.0]])
    returns = torch.tensor([[2.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, stats = ppo_value_loss(values, old, returns, mask, clip=0.2)
    assert math.isclose(loss.item(), 0.3625, abs_tol=1e-6)
    assert math.isclose(stats["vf_clipfrac"].item(), 0.5)


def test_whiten_is_masked_and_accepts_global_moments():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    w = whiten(x, mask)
    assert torch.allclose(w, torch.tensor([[-1.0, 0.0, 1.0, 0.0]]), atol=1e-6)
    kept = whiten(x, mask, shift_mean=False)
    assert torch.allclose(kept, torch.tensor([[1.0, 2.0, 3.0, 0.0]]), atol=1e-6)
    # Moments of two shards summed equal the moments of the whole.
    m = masked_moments(x[:, :2], mask[:, :2]) + masked_moments(x[:, 2:], mask[:, 2:])
    assert torch.allclose(whiten(x[:, 2:], mask[:, 2:], moments=m), w[:, 2:], atol=1e-6)


def test_adaptive_kl_controller_hand_computed_and_resumes():
    ctl = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10_000)
    # KL 9: error 9/6 - 1 = 0.5, clipped to 0.2; 20 sequences: 0.2 * (1 + 0.2 * 20 / 10000) = 0.20008
    assert math.isclose(ctl.update(9.0, 20), 0.20008)
    # KL 5.4: error -0.1; 100 sequences: 0.20008 * (1 - 0.1 * 100 / 10000) = 0.20008 * 0.999
    assert math.isclose(ctl.update(5.4, 100), 0.20008 * 0.999)
    resumed = AdaptiveKLController()
    resumed.load_state_dict(ctl.state_dict())
    assert resumed.value == ctl.value

    fixed = FixedKLController(0.05)
    assert fixed.update(100.0, 20) == 0.05
    other = FixedKLController()
    other.load_state_dict(fixed.state_dict())
    assert other.value == 0.05
