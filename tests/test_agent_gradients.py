"""Centred finite-difference checks of every hand-written gradient in lib.learners.

All in float64, away from kinks (ReLU at 0, the PPO clip at 1 +- eps). The
relative error is ``max |analytic - numeric| / max(|analytic|, |numeric|)`` over
all entries of a gradient, and must stay below 1e-6.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from gradcheck import numeric_grad, rel_error

from lib.learners.distributions import (
    MaskedCategorical,
    MaskedDirichlet,
    concentration_backward,
    concentration_forward,
    digamma,
    lgamma,
    trigamma,
)
from lib.learners.nn import (
    MLP,
    affine_backward,
    affine_forward,
    masked_softmax_backward,
    masked_softmax_forward,
    relu_backward,
    relu_forward,
    tanh_backward,
    tanh_forward,
)
from lib.learners.ppo import PPOAgent, PPOConfig, interior_shares
from lib.learners.td3 import TD3Agent, TD3Config

TOL = 1e-6


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# --------------------------------------------------------------------------
# Layers


def test_affine_backward(rng):
    x, w, b = rng.normal(size=(4, 5)), rng.normal(size=(5, 3)), rng.normal(size=3)
    dout = rng.normal(size=(4, 3))
    _, cache = affine_forward(x, w, b)
    dx, dw, db = affine_backward(dout, cache)

    def f():
        return float(np.sum(affine_forward(x, w, b)[0] * dout))

    for analytic, wrt in ((dx, x), (dw, w), (db, b)):
        assert rel_error(analytic, numeric_grad(f, wrt)) < TOL


def test_relu_backward_away_from_kink(rng):
    x = rng.normal(size=(6, 4))
    x = np.where(np.abs(x) < 0.1, 0.5, x)
    dout = rng.normal(size=x.shape)
    dx = relu_backward(dout, relu_forward(x)[1])
    num = numeric_grad(lambda: float(np.sum(relu_forward(x)[0] * dout)), x)
    assert rel_error(dx, num) < TOL


def test_tanh_backward(rng):
    x = rng.normal(size=(6, 4)) * 2
    dout = rng.normal(size=x.shape)
    dx = tanh_backward(dout, tanh_forward(x)[1])
    num = numeric_grad(lambda: float(np.sum(tanh_forward(x)[0] * dout)), x)
    assert rel_error(dx, num) < TOL


def test_masked_softmax_backward(rng):
    z = rng.normal(size=(5, 4))
    mask = rng.random((5, 4)) < 0.7
    mask[:, 0] = True
    dout = rng.normal(size=z.shape)
    _, cache = masked_softmax_forward(z, mask)
    dz = masked_softmax_backward(dout, cache)
    num = numeric_grad(
        lambda: float(np.sum(masked_softmax_forward(z, mask)[0] * dout)), z)
    assert rel_error(dz, num) < TOL
    assert np.all(dz[~mask] == 0.0)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_mlp_backward(rng, activation):
    net = MLP([4, 7, 5, 3], rng, activation=activation)
    x = rng.normal(size=(6, 4))
    dout = rng.normal(size=(6, 3))
    out, caches = net.forward(x)
    if activation == "relu":  # stay away from the kinks
        for _, c_act in caches:
            if c_act is not None:
                assert np.abs(c_act).min() > 1e-4
    dx, grads = net.backward(dout, caches)

    def f():
        return float(np.sum(net(x) * dout))

    assert rel_error(dx, numeric_grad(f, x)) < TOL
    for k, g in grads.items():
        assert rel_error(g, numeric_grad(f, net.params[k])) < TOL, k


def test_concentration_backward(rng):
    z = rng.normal(size=(3, 4)) * 3
    dalpha = rng.normal(size=z.shape)
    dz = concentration_backward(dalpha, z)
    num = numeric_grad(
        lambda: float(np.sum(concentration_forward(z, 0.5) * dalpha)), z)
    assert rel_error(dz, num) < TOL


# --------------------------------------------------------------------------
# Distributions


def test_digamma_is_derivative_of_lgamma():
    x = np.array([1e-2, 0.3, 1.0, 2.5, 5.9, 6.1, 17.0, 250.0])
    h = 1e-5 * x
    num = (lgamma(x + h) - lgamma(x - h)) / (2 * h)
    assert rel_error(digamma(x), num) < TOL
    assert np.max(np.abs(digamma(x) - num) / np.abs(num)) < 1e-6


def test_trigamma_is_derivative_of_digamma():
    x = np.array([1e-2, 0.3, 1.0, 2.5, 5.9, 6.1, 17.0, 250.0])
    h = 1e-5 * x
    num = (digamma(x + h) - digamma(x - h)) / (2 * h)
    assert np.max(np.abs(trigamma(x) - num) / np.abs(num)) < 1e-6


def _categorical_case(rng):
    logits = rng.normal(size=(5, 4))
    mask = np.array([[1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 1, 1], [1, 1, 0, 1],
                     [0, 1, 0, 0]], dtype=bool)
    actions = np.array([3, 2, 2, 0, 1])
    return logits, mask, actions


def test_categorical_log_prob_gradient(rng):
    logits, mask, actions = _categorical_case(rng)
    w = rng.normal(size=5)
    d = MaskedCategorical(logits, mask).log_prob_backward(actions, w)
    num = numeric_grad(
        lambda: float(MaskedCategorical(logits, mask).log_prob(actions) @ w), logits)
    assert rel_error(d, num) < TOL
    assert np.all(d[~mask] == 0.0)


def test_categorical_entropy_gradient(rng):
    logits, mask, _ = _categorical_case(rng)
    w = rng.normal(size=5)
    d = MaskedCategorical(logits, mask).entropy_backward(w)
    num = numeric_grad(
        lambda: float(MaskedCategorical(logits, mask).entropy() @ w), logits)
    assert rel_error(d, num) < TOL
    assert np.all(d[~mask] == 0.0)


def _dirichlet_case(rng):
    alpha = rng.uniform(0.3, 6.0, size=(4, 5))
    mask = np.array([[1, 1, 1, 1, 1], [1, 0, 1, 0, 1], [0, 1, 1, 0, 0],
                     [0, 0, 0, 1, 0]], dtype=bool)
    x = MaskedDirichlet(alpha, mask).sample(rng)
    x = np.where(mask, np.maximum(x, 1e-3), 0.0)
    return alpha, mask, x / x.sum(axis=1, keepdims=True)


def test_dirichlet_log_prob_gradient_alpha(rng):
    alpha, mask, x = _dirichlet_case(rng)
    w = rng.normal(size=4)
    d = MaskedDirichlet(alpha, mask).log_prob_backward_alpha(x, w)
    num = numeric_grad(
        lambda: float(MaskedDirichlet(alpha, mask).log_prob(x) @ w), alpha)
    assert rel_error(d, num) < TOL
    assert np.all(d[~mask] == 0.0)


def test_dirichlet_entropy_gradient_alpha(rng):
    alpha, mask, _ = _dirichlet_case(rng)
    w = rng.normal(size=4)
    d = MaskedDirichlet(alpha, mask).entropy_backward_alpha(w)
    num = numeric_grad(
        lambda: float(MaskedDirichlet(alpha, mask).entropy() @ w), alpha)
    assert rel_error(d, num) < TOL
    assert np.all(d[~mask] == 0.0)


def test_dirichlet_gradients_through_softplus(rng):
    _, mask, x = _dirichlet_case(rng)
    z = rng.normal(size=mask.shape) * 2
    w1, w2 = rng.normal(size=4), rng.normal(size=4)

    def f():
        dist = MaskedDirichlet(concentration_forward(z, 1e-3), mask)
        return float(dist.log_prob(x) @ w1 + dist.entropy() @ w2)

    dist = MaskedDirichlet(concentration_forward(z, 1e-3), mask)
    dalpha = dist.log_prob_backward_alpha(x, w1) + dist.entropy_backward_alpha(w2)
    assert rel_error(concentration_backward(dalpha, z), numeric_grad(f, z)) < TOL


# --------------------------------------------------------------------------
# Full PPO loss


def _ppo_case(clip: float, seed: int = 3):
    cfg = PPOConfig(hidden=(6,), clip=clip, ent_coef=0.05, vf_coef=0.7, seed=seed,
                    alpha_init=3.0)
    agent = PPOAgent(5, 3, [3, 2], cfg)
    rng = np.random.default_rng(seed)
    for v in agent.params.values():  # move away from the init's tiny outputs
        v += 0.3 * rng.normal(size=v.shape)
    b = 12
    obs = rng.normal(size=(b, 5))
    agent.obs_rms.update(rng.normal(size=(50, 5)) * 2 + 1)
    dmask = rng.random((b, 3)) < 0.7
    dmask[:, 1] = True
    cmasks = [rng.random((b, 3)) < 0.7, np.ones((b, 2), dtype=bool)]
    cmasks[0][:, 2] = True
    out = agent.act_batch(obs, dmask, cmasks, rng)
    shares = np.where(dmask, np.maximum(out.shares, 1e-3), 0.0)
    shares /= shares.sum(axis=1, keepdims=True)
    batch = {"obs": obs, "device_mask": dmask, "discrete_masks": cmasks,
             "shares": shares, "choices": out.choices,
             "logp": out.logp + rng.normal(scale=0.4, size=b),
             "advantages": rng.normal(size=b), "returns": rng.normal(size=b)}
    return agent, batch


@pytest.mark.parametrize("clip", [0.2, 50.0])
def test_full_ppo_loss_gradient(clip):
    agent, batch = _ppo_case(clip)
    _, grads, stats = agent.loss_and_grads(batch)
    if clip < 1:  # the check must exercise both branches, away from the kinks
        assert 0.0 < stats["clip_frac"] < 1.0

    def f():
        return agent.loss_and_grads(batch)[0]

    # Ratios must stay clear of the clip kinks under the perturbation.
    logp_now = _joint_logp(agent, batch)
    ratio = np.exp(logp_now - batch["logp"])
    assert np.abs(np.abs(ratio - 1.0) - clip).min() > 1e-3
    worst = 0.0
    for k, g in grads.items():
        err = rel_error(g, numeric_grad(f, agent.params[k]))
        worst = max(worst, err)
        assert err < TOL, k
    assert worst < TOL


def _joint_logp(agent, batch):
    x, dm, masks = agent._prep(batch["obs"], batch["device_mask"],
                               batch["discrete_masks"])
    dirichlet, cats = agent._dists(agent.actor(agent._normalize(x)), dm, masks)
    logp = dirichlet.log_prob(batch["shares"])
    for h, cat in enumerate(cats):
        logp = logp + cat.log_prob(batch["choices"][:, h])
    return logp


# --------------------------------------------------------------------------
# TD3


def _td3_case():
    agent = TD3Agent(4, 3, [2], TD3Config(hidden=(6,), activation="tanh", seed=5))
    rng = np.random.default_rng(5)
    for v in agent.actor_params.values():
        v += 0.5 * rng.normal(size=v.shape)
    obs = rng.normal(size=(7, 4))
    mask = rng.random((7, 3)) < 0.7
    mask[:, 0] = True
    return agent, obs, mask, rng


def test_td3_actor_gradient_through_critic():
    agent, obs, mask, _ = _td3_case()
    _, grads = agent.actor_loss_and_grads(obs, mask)
    f = lambda: agent.actor_loss_and_grads(obs, mask)[0]  # noqa: E731
    for k, g in grads.items():
        assert rel_error(g, numeric_grad(f, agent.actor_params[k])) < TOL, k


def test_td3_critic_gradient():
    agent, obs, mask, rng = _td3_case()
    shares = agent.shares(obs, mask, noise=0.5, rng=rng)
    batch = {"obs": obs, "shares": shares}
    y = rng.normal(size=7)
    _, grads = agent.critic_loss_and_grads(batch, y)
    f = lambda: agent.critic_loss_and_grads(batch, y)[0]  # noqa: E731
    for k, g in grads.items():
        assert rel_error(g, numeric_grad(f, agent.critic_params[k])) < TOL, k


def test_relative_error_helper_would_catch_a_wrong_gradient(rng):
    x = rng.normal(size=(3, 3))
    num = numeric_grad(lambda: float(np.sum(np.sin(x))), x)
    assert rel_error(np.cos(x), num) < TOL
    assert rel_error(np.cos(x) * (1 + 1e-4), num) > TOL
    assert math.isclose(float(digamma(1.0)), -0.5772156649015329, abs_tol=1e-12)


# --------------------------------------------------------------------------
# Imitation (behaviour-cloning) loss


def _imitation_case(seed: int = 4):
    agent, batch = _ppo_case(clip=0.2, seed=seed)
    rng = np.random.default_rng(seed + 1)
    expert = np.where(batch["device_mask"], rng.random(batch["shares"].shape), 0.0)
    expert[:, 0] = 0.0  # the expert leaves a device out: the mix must cope
    expert[:, 1] += batch["device_mask"][:, 1]
    expert /= expert.sum(axis=1, keepdims=True)
    mb = {"obs": batch["obs"], "device_mask": batch["device_mask"],
          "discrete_masks": batch["discrete_masks"],
          "shares": interior_shares(expert, batch["device_mask"], eps=0.05),
          "choices": batch["choices"], "returns": rng.normal(size=len(expert))}
    return agent, mb


def test_imitation_loss_gradient():
    agent, mb = _imitation_case()
    loss, grads, stats = agent.imitation_loss_and_grads(mb)
    assert stats["value_loss"] > 0 and np.isfinite(loss)

    def f():
        return agent.imitation_loss_and_grads(mb)[0]

    for k, g in grads.items():
        assert rel_error(g, numeric_grad(f, agent.params[k])) < TOL, k


def test_imitation_loss_is_the_mean_negative_log_likelihood():
    agent, mb = _imitation_case()
    mb = {k: v for k, v in mb.items() if k != "returns"}
    loss, grads, stats = agent.imitation_loss_and_grads(mb)
    assert loss == pytest.approx(-float(np.mean(_joint_logp(agent, mb))), rel=1e-12)
    assert stats["value_loss"] == 0.0
    assert all(np.all(g == 0.0) for k, g in grads.items() if k.startswith("critic"))
