"""QE-EBM's gradient estimators on problems small enough to solve exactly: ReinMax's backward on
hand-computed values, and the leave-one-out control-variate estimator (``loo-cv``) on a two-step
autoregressive policy whose expected-score gradient is computed by enumerating every sequence."""

from __future__ import annotations

import math

import pytest
import torch

from qeebm.methods.control_variate import CvWeight, leave_one_out, surrogate
from qeebm.qe.bridge import _zero_forward_product, reinmax_jvp, softmax_jvp

# ------------------------------------------------------------------------------------ ReinMax
P = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
V_GRAD = torch.tensor([[1.0, 0.0, -1.0]], dtype=torch.float64)  # dE/dD


def test_straight_through_jvp_by_hand():
    # p . v = 0.5 - 0.2 = 0.3; p * (v - 0.3) = (0.5 * 0.7, 0.3 * -0.3, 0.2 * -1.3)
    assert softmax_jvp(P, V_GRAD)[0].tolist() == pytest.approx([0.35, -0.09, -0.26])


def test_reinmax_jvp_by_hand_at_tau_one():
    # Emitted token 0: pi_1 = (p + D) / 2 = (0.75, 0.15, 0.1); pi_1 . v = 0.65;
    # 2 J(pi_1) v = 2 * (0.75 * 0.35, 0.15 * -0.65, 0.1 * -1.65) = (0.525, -0.195, -0.33);
    # J(p) v / 2 = (0.175, -0.045, -0.13); ReinMax = (0.35, -0.15, -0.2).
    got = reinmax_jvp(P, P, torch.tensor([0]), V_GRAD)
    assert got[0].tolist() == pytest.approx([0.35, -0.15, -0.2])
    assert got.sum().item() == pytest.approx(0.0, abs=1e-12)  # a softmax's gradient sums to 0


def test_reinmax_jvp_by_hand_at_tau_two():
    # p_tau = softmax(log p / 2) = sqrt(p) / sum sqrt(p) = (0.4154453, 0.3218022, 0.2627525);
    # token 2: pi_1 = (0.2077227, 0.1609011, 0.6313763); pi_1 . v = -0.4236536;
    # 2 J(pi_1) v = 2 * (0.2077227 * 1.4236536, 0.1609011 * 0.4236536, 0.6313763 * -0.5763464)
    #             = (0.591451, 0.136333, -0.727783); minus J(p) v / 2 = (0.175, -0.045, -0.13).
    p_tau = P.sqrt() / P.sqrt().sum()
    got = reinmax_jvp(P, p_tau, torch.tensor([2]), V_GRAD)
    assert got[0].tolist() == pytest.approx([0.416451, 0.181333, -0.597783], abs=2e-6)


@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_bridge_backward_is_reinmax_and_straight_through(tau):
    # Through the bridge's zero-forward product with an identity table (dE/dD = the incoming
    # gradient): the value is zero, the logits' gradient is ReinMax's (or ST's without tokens), and
    # rows are handled independently.
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]], dtype=torch.float64)).requires_grad_()
    steps, table = torch.tensor([1, 0]), torch.eye(3, dtype=torch.float64)
    grad_out = torch.tensor([[0.2, -0.4, 1.0], [1.0, 0.0, -1.0]], dtype=torch.float64)
    tokens = torch.tensor([1, 0])
    out = _zero_forward_product(logits, steps, table, None, tokens, tau)
    assert torch.equal(out, torch.zeros(2, 3, dtype=torch.float64))
    (grad,) = torch.autograd.grad(out, logits, grad_out)
    p = torch.softmax(logits.detach()[steps], -1)
    want = reinmax_jvp(p, torch.softmax(logits.detach()[steps] / tau, -1), tokens, grad_out)
    assert torch.allclose(grad[steps], want)
    assert torch.allclose(grad[0], torch.tensor([0.35, -0.15, -0.2], dtype=torch.float64)) if tau == 1.0 else True
    (st,) = torch.autograd.grad(_zero_forward_product(logits, steps, table, None), logits, grad_out)
    assert torch.allclose(st[steps], softmax_jvp(p, grad_out))


# ----------------------------------------------------------- the control variate, in closed form
V, H, K = 3, 2, 4


def _problem():
    g = torch.Generator().manual_seed(0)
    theta1 = torch.randn(V, generator=g, dtype=torch.float64)       # step 1 logits
    theta2 = torch.randn(V, V, generator=g, dtype=torch.float64)    # step 2 logits given y1
    emb = torch.randn(V, H, generator=g, dtype=torch.float64)
    w = torch.randn(H, generator=g, dtype=torch.float64)
    return theta1, theta2, emb, w


def _score(d1, d2, emb, w):
    """f(D1, D2) for one-hot (or relaxed) rows [..., V]: smooth, close to linear in the tokens but
    not linear (a QE's score of a sentence whose tokens matter mostly one by one)."""
    e1, e2 = 0.3 * d1 @ emb, 0.3 * d2 @ emb
    return torch.tanh((e1 + e2) @ w) + 0.5 * (e1 * e2).sum(-1)


def _exact_gradient(theta1, theta2, emb, w):
    t1, t2 = theta1.clone().requires_grad_(), theta2.clone().requires_grad_()
    p1, p2 = torch.softmax(t1, -1), torch.softmax(t2, -1)  # [V], [V, V]
    eye = torch.eye(V, dtype=torch.float64)
    f = _score(eye[:, None, :].expand(V, V, V), eye[None, :, :].expand(V, V, V), emb, w)  # [y1, y2]
    expected = (p1[:, None] * p2 * f).sum()
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(expected, (t1, t2))])


def _estimates(theta1, theta2, emb, w, groups: int, eta: float, seed: int) -> torch.Tensor:
    """``[groups, V + V*V]`` independent loo-cv estimates of the expected score's gradient, each
    from K samples: every group has its own copy of the parameters, so one backward pass gives
    each group's estimate."""
    g = torch.Generator().manual_seed(seed)
    t1 = theta1.repeat(groups, 1).requires_grad_()       # [G, V]
    t2 = theta2.repeat(groups, 1, 1).requires_grad_()    # [G, V, V]
    lp1 = torch.log_softmax(t1, -1).repeat_interleave(K, 0)  # [R, V], R = G * K
    y1 = torch.multinomial(lp1.detach().exp(), 1, generator=g).squeeze(1)
    lp2 = torch.log_softmax(t2.repeat_interleave(K, 0)[torch.arange(groups * K), y1], -1)  # [R, V]
    y2 = torch.multinomial(lp2.detach().exp(), 1, generator=g).squeeze(1)
    eye = torch.eye(V, dtype=torch.float64)
    d1, d2 = eye[y1].requires_grad_(), eye[y2].requires_grad_()
    f = _score(d1, d2, emb, w)
    h1, h2 = torch.autograd.grad(f.sum(), (d1, d2))  # each sample's QE gradient, dQ/dD_t  [R, V]
    gbar = leave_one_out(torch.stack([h1, h2], 1), K)   # [R, T, V]: the other samples' gradients
    y = torch.stack([y1, y2], 1)                        # [R, T]
    logp = torch.stack([lp1, lp2], 1).gather(-1, y[..., None]).squeeze(-1)  # [R, T]
    probs = torch.stack([lp1, lp2], 1).exp()
    expected = (probs * gbar).sum(-1)
    taken = gbar.gather(-1, y[..., None]).squeeze(-1)
    mask = torch.ones_like(logp, dtype=torch.bool)
    s = surrogate(logp, mask, expected, taken, mask, f.detach(), K, eta)
    g1, g2 = torch.autograd.grad(s.value, (t1, t2))
    return torch.cat([g1, g2.reshape(groups, -1)], 1) / K  # a mean over each group's K samples


@pytest.mark.parametrize("eta", [0.0, 1.0, 2.5])
def test_control_variate_estimator_is_unbiased(eta):
    # Unbiased for ANY weight: eta = 0 is plain leave-one-out REINFORCE, 1 the Taylor control
    # variate, 2.5 an over-weighted one. The mean of 20,000 estimates matches the enumerated
    # gradient within 4 standard errors in every coordinate.
    theta1, theta2, emb, w = _problem()
    exact = _exact_gradient(theta1, theta2, emb, w)
    est = _estimates(theta1, theta2, emb, w, groups=20000, eta=eta, seed=1)
    mean, se = est.mean(0), est.std(0) / math.sqrt(est.shape[0])
    assert ((mean - exact).abs() <= 4 * se + 1e-12).all(), ((mean - exact) / se).tolist()


def test_control_variate_removes_variance():
    # The same draws (same seed), two weights: the QE-gradient control variate has about half the
    # total variance of leave-one-out REINFORCE on this smooth score (0.011 against 0.021).
    theta1, theta2, emb, w = _problem()
    var = {eta: _estimates(theta1, theta2, emb, w, groups=20000, eta=eta, seed=2).var(0).sum().item()
           for eta in (0.0, 1.0)}
    assert var[1.0] < 0.7 * var[0.0], var


def test_own_gradient_as_control_variate_would_be_biased():
    # Why the control variate must use the OTHER samples' gradients: with each sample's own
    # gradient the correction term no longer has the expectation it assumes.
    theta1, theta2, emb, w = _problem()
    exact = _exact_gradient(theta1, theta2, emb, w)
    est = _own_gradient_estimates(theta1, theta2, emb, w, groups=20000, seed=3)
    mean, se = est.mean(0), est.std(0) / math.sqrt(est.shape[0])
    assert ((mean - exact).abs() / se).max() > 6


def _own_gradient_estimates(theta1, theta2, emb, w, groups, seed):
    g = torch.Generator().manual_seed(seed)
    t1 = theta1.repeat(groups, 1).requires_grad_()
    t2 = theta2.repeat(groups, 1, 1).requires_grad_()
    lp1 = torch.log_softmax(t1, -1).repeat_interleave(K, 0)
    y1 = torch.multinomial(lp1.detach().exp(), 1, generator=g).squeeze(1)
    lp2 = torch.log_softmax(t2.repeat_interleave(K, 0)[torch.arange(groups * K), y1], -1)
    y2 = torch.multinomial(lp2.detach().exp(), 1, generator=g).squeeze(1)
    eye = torch.eye(V, dtype=torch.float64)
    d1, d2 = eye[y1].requires_grad_(), eye[y2].requires_grad_()
    f = _score(d1, d2, emb, w)
    own = torch.stack(torch.autograd.grad(f.sum(), (d1, d2)), 1) * 3.0  # not independent of y_k
    y = torch.stack([y1, y2], 1)
    logp = torch.stack([lp1, lp2], 1).gather(-1, y[..., None]).squeeze(-1)
    probs = torch.stack([lp1, lp2], 1).exp()
    mask = torch.ones_like(logp, dtype=torch.bool)
    s = surrogate(logp, mask, (probs * own).sum(-1), own.gather(-1, y[..., None]).squeeze(-1), mask, f.detach(), K, 1.0)
    g1, g2 = torch.autograd.grad(s.value, (t1, t2))
    return torch.cat([g1, g2.reshape(groups, -1)], 1) / K


def test_surrogate_masks_and_cumulates_by_hand():
    # Two sources x K = 2 samples, three steps; the last step of row 1 is padding, step 1 of row 0
    # is </s>-like (an action the QE does not read).
    logp = torch.zeros(4, 3, requires_grad=True)
    actions = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    content = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    taken = torch.tensor([[1.0, 9.0, 9.0], [0.5, 0.5, 0.5], [2.0, 9.0, 9.0], [0.0, 1.0, 9.0]])
    expected = torch.tensor([[0.5, 9.0, 9.0], [0.0, 0.0, 0.0], [1.0, 9.0, 9.0], [1.0, 1.0, 9.0]])
    f = torch.tensor([1.0, 3.0, 0.0, 4.0])
    s = surrogate(logp, actions, expected, taken, content, f, 2, eta=2.0)
    # f - b: leave-one-out within each pair: (1 - 3, 3 - 1, 0 - 4, 4 - 0)
    assert s.centred.tolist() == [-2.0, 2.0, -4.0, 4.0]
    # cumulative (taken - expected) on content steps, on action steps only
    assert s.cv.tolist() == [[0.5, 0.5, 0.0], [0.5, 1.0, 1.5], [1.0, 0.0, 0.0], [-1.0, -1.0, 0.0]]
    (g,) = torch.autograd.grad(s.value, logp)
    # advantage = f - b - eta * cv on actions, 0 elsewhere
    assert g.tolist() == [[-3.0, -3.0, 0.0], [1.0, 0.0, -1.0], [-6.0, 0.0, 0.0], [6.0, 6.0, 0.0]]
    # sums a*s, s*s, a*a over action steps
    assert s.sums.tolist() == pytest.approx([-2 * 1.0 + 2 * 3.0 - 4 * 1.0 + 4 * -2.0, 0.5 + 3.5 + 1.0 + 2.0,
                                             8.0 + 12.0 + 16.0 + 32.0])


def test_leave_one_out_needs_groups():
    x = torch.tensor([[1.0], [2.0], [4.0], [10.0], [20.0], [30.0]])
    assert leave_one_out(x, 3).squeeze(1).tolist() == [3.0, 2.5, 1.5, 25.0, 20.0, 15.0]
    with pytest.raises(ValueError, match="groups"):
        leave_one_out(x, 4)


def test_cv_weight_fits_on_the_previous_step_only():
    cv = CvWeight()
    assert cv.current(1) == 1.0
    cv.add(1, torch.tensor([2.0, 4.0, 9.0]))
    cv.add(1, torch.tensor([1.0, 2.0, 3.0]))
    assert cv.current(1) == 1.0  # the step's own sums are not used within it
    assert cv.current(2) == pytest.approx(3.0 / 6.0)
    assert cv.explained_last == pytest.approx(9.0 / (6.0 * 12.0))
    cv.add(2, torch.tensor([-1.0, 0.0, 1.0]))  # no control variate signal: the weight stays
    state = cv.state_dict()
    again = CvWeight()
    again.load_state_dict(state)
    assert again.current(3) == cv.current(3) == pytest.approx(0.5)
    fixed = CvWeight(fixed=0.25)
    fixed.add(1, torch.tensor([2.0, 1.0, 9.0]))
    assert fixed.current(2) == 0.25
