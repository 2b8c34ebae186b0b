"""The set network, water-filling and the set PPO learner: centred
finite-difference checks of every hand-written gradient (float64, relative
error below 1e-6, as ``tests/test_agent_gradients.py``), and the properties the
policy relies on (any number of devices, order does not matter)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gradcheck import numeric_grad, rel_error

from lib.learners.setnet import (
    SetNet,
    SetNetSizes,
    broadcast_backward,
    broadcast_forward,
    item_affine_backward,
    item_affine_forward,
    masked_pool_backward,
    masked_pool_forward,
    waterfill_backward,
    waterfill_forward,
)
from lib.learners.setppo import SetPPOAgent, SetPPOConfig

TOL = 1e-6


@pytest.fixture
def rng():
    return np.random.default_rng(2024)


def _mask(rng, b, n, p=0.7):
    m = rng.random((b, n)) < p
    m[:, 0] = True
    return m


# --------------------------------------------------------------------------
# Layers


def test_item_affine_backward(rng):
    x, w, b = rng.normal(size=(3, 5, 4)), rng.normal(size=(4, 6)), rng.normal(size=6)
    dout = rng.normal(size=(3, 5, 6))
    dx, dw, db = item_affine_backward(dout, item_affine_forward(x, w, b)[1])

    def f():
        return float(np.sum(item_affine_forward(x, w, b)[0] * dout))

    for analytic, wrt in ((dx, x), (dw, w), (db, b)):
        assert rel_error(analytic, numeric_grad(f, wrt)) < TOL


def test_masked_pool_backward_and_absent_items(rng):
    h = rng.normal(size=(4, 6, 5))
    mask = _mask(rng, 4, 6)
    dpool = rng.normal(size=(4, 10))
    pooled, cache = masked_pool_forward(h, mask)
    dh = masked_pool_backward(dpool, cache)
    num = numeric_grad(lambda: float(np.sum(masked_pool_forward(h, mask)[0]
                                            * dpool)), h)
    assert rel_error(dh, num) < TOL
    assert np.all(dh[~mask] == 0.0)
    # absent items change nothing
    h2 = np.where(mask[..., None], h, 1e3)
    assert np.array_equal(masked_pool_forward(h2, mask)[0], pooled)


def test_broadcast_backward(rng):
    ctx = rng.normal(size=(3, 4))
    dout = rng.normal(size=(3, 5, 4))
    num = numeric_grad(lambda: float(np.sum(broadcast_forward(ctx, 5) * dout)), ctx)
    assert rel_error(broadcast_backward(dout), num) < TOL


@pytest.mark.parametrize("hidden", [(6, 5, 7), (6, 0, 7)])
def test_setnet_backward(rng, hidden):
    net = SetNet(SetNetSizes(3, 4, 2, 5, hidden), rng, item_gain=1.0, set_gain=1.0)
    for v in net.params.values():
        v += rng.normal(scale=0.3, size=v.shape)
    ctx, items, mask = rng.normal(size=(3, 3)), rng.normal(size=(3, 5, 4)), \
        _mask(rng, 3, 5)
    dz = rng.normal(size=(3, 5, 2)) * mask[..., None]
    dy = rng.normal(size=(3, 5))
    _, _, cache = net.forward(ctx, items, mask)
    grads = net.backward(dz, dy, cache)
    assert set(grads) == set(net.params)

    def f():
        z, y, _ = net.forward(ctx, items, mask)
        return float(np.sum(z * dz) + np.sum(y * dy))

    for k, v in net.params.items():
        assert rel_error(grads[k], numeric_grad(f, v)) < TOL, k


@pytest.mark.parametrize("hidden", [(6, 5, 7), (6, 0, 7)])
def test_setnet_is_permutation_equivariant_and_takes_any_count(rng, hidden):
    net = SetNet(SetNetSizes(3, 4, 2, 5, hidden), rng, item_gain=1.0)
    for n in (1, 2, 7, 64):
        ctx, items = rng.normal(size=(2, 3)), rng.normal(size=(2, n, 4))
        mask = np.ones((2, n), dtype=bool)
        z, y = net(ctx, items, mask)
        perm = rng.permutation(n)
        zp, yp = net(ctx, items[:, perm], mask[:, perm])
        np.testing.assert_allclose(yp, y, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(zp, z[:, perm], rtol=1e-12, atol=1e-12)
        for b in range(2):
            z1, y1 = net.forward_one(ctx[b], items[b])
            np.testing.assert_allclose(z1, z[b], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(y1, y[b], rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------
# Water-filling


def test_waterfill_equalises_finish_times(rng):
    for _ in range(200):
        n = int(rng.integers(1, 9))
        a, b = rng.normal(size=(1, n)), rng.normal(size=(1, n)) - 1
        mask = _mask(rng, 1, n)
        s, _ = waterfill_forward(a, b, mask)
        assert s.sum() == pytest.approx(1.0, rel=1e-12)
        assert np.all(s[~mask] == 0.0) and np.all(s >= 0)
        finish = np.exp(b) + s * np.exp(a)
        used = s > 0
        np.testing.assert_allclose(finish[used], finish[used].max(), rtol=1e-9)
        # a present device left out could not have started before the others end
        idle = mask & ~used
        assert np.all(np.exp(b)[idle] >= finish[used].max() * (1 - 1e-12))


def test_waterfill_backward(rng):
    a, b = rng.normal(size=(6, 5)), rng.normal(size=(6, 5)) - 1.0
    mask = _mask(rng, 6, 5, 0.8)
    ds = rng.normal(size=(6, 5))
    s, cache = waterfill_forward(a, b, mask)
    assert ((s > 0) & mask).sum() < mask.sum()  # some devices are left out
    da, db = waterfill_backward(ds, cache)

    def f():
        return float(np.sum(waterfill_forward(a, b, mask)[0] * ds))

    assert rel_error(da, numeric_grad(f, a)) < TOL
    assert rel_error(db, numeric_grad(f, b)) < TOL


# --------------------------------------------------------------------------
# The learner


def _agent(rng, **kw):
    agent = SetPPOAgent(3, 4, [3, 2], SetPPOConfig(
        hidden=(5, 6, 7), kappa_init=8.0, kappa_min=1.0, alpha_floor=0.3,
        share_head=0, **kw))
    for v in agent.params.values():
        v += rng.normal(scale=0.3, size=v.shape)
    return agent


def _batch(rng, agent, b=4, n=5):
    obs = rng.normal(size=(b, 3 + n * 4))
    dm = _mask(rng, b, n)
    cm = [np.ones((b, 3), bool), np.array([[1, 1], [1, 0], [1, 1], [0, 1]], bool)]
    out = agent.act_batch(obs, dm, cm)
    return obs, dm, cm, out


def test_ppo_loss_gradient(rng):
    agent = _agent(rng, ent_coef=0.01)
    obs, dm, cm, out = _batch(rng, agent)
    mb = {"obs": obs, "device_mask": dm, "discrete_masks": cm,
          "shares": out.shares, "choices": out.choices,
          "logp": out.logp + rng.normal(scale=0.05, size=4),
          "advantages": rng.normal(size=4), "returns": rng.normal(size=4)}
    _, grads, _ = agent.loss_and_grads(mb)
    for k, v in agent.params.items():
        num = numeric_grad(lambda: agent.loss_and_grads(mb)[0], v)
        assert rel_error(grads[k], num) < TOL, k


def test_imitation_loss_gradient(rng):
    agent = _agent(rng)
    obs, dm, cm, out = _batch(rng, agent)
    target = np.where(dm, rng.random(dm.shape), 0.0)
    target[0, 1:] = 0.0
    target /= target.sum(axis=1, keepdims=True)
    mb = {"obs": obs, "device_mask": dm, "discrete_masks": cm, "shares": target,
          "choices": out.choices, "returns": rng.normal(size=4),
          "choice_weights": rng.uniform(0, 1, (4, 2))}
    _, grads, stats = agent.imitation_loss_and_grads(mb)
    assert 0.0 <= stats["excluded_ok"] <= 1.0
    for k, v in agent.params.items():
        num = numeric_grad(lambda: agent.imitation_loss_and_grads(mb)[0], v)
        assert rel_error(grads[k], num) < TOL, k


def test_the_deterministic_action_is_the_waterfilled_share(rng):
    agent = _agent(rng)
    obs, dm, cm, _ = _batch(rng, agent)
    out = agent.act_batch(obs, dm, cm, deterministic=True)
    assert np.allclose(out.shares.sum(axis=1), 1.0)
    assert np.all(out.shares[~dm] == 0.0)
    z, y = agent.actor(*agent.split(obs, dm.shape[1]), dm)
    for row in range(len(obs)):
        c = 2 * out.choices[row, 0]
        s, _ = waterfill_forward(z[row:row + 1, :, c], z[row:row + 1, :, c + 1],
                                 dm[row:row + 1])
        np.testing.assert_allclose(out.shares[row], s[0], rtol=1e-12)


def test_save_load_round_trip_and_refusals(rng, tmp_path):
    agent = _agent(rng, share_prior=((1, 0, 2.0), (-1, 1, -3.0)))
    path = agent.save(tmp_path / "p.npz", {"spec": {"v": 2}})
    back = SetPPOAgent.load(path, expected_spec={"v": 2})
    for k, v in agent.params.items():
        assert np.array_equal(back.params[k], v)
    assert back.config == agent.config
    with pytest.raises(ValueError, match="feature spec differs"):
        SetPPOAgent.load(path, expected_spec={"v": 1})


def test_share_prior_sets_the_skip_weights(rng):
    agent = SetPPOAgent(3, 4, [3, 2], SetPPOConfig(
        hidden=(5, 6, 7), share_head=0, share_prior=((2, 1, 1.5), (-1, 3, -2.0))))
    assert agent.actor.params["Ws"][2, 1] == 1.5
    assert agent.actor.params["bz"][3] == -2.0


def test_minibatches_cut_sets_to_their_own_width(rng):
    agent = _agent(rng)
    b, n = 40, 6
    dm = np.zeros((b, n), dtype=bool)
    widths = rng.integers(1, n + 1, size=b)
    for i, w in enumerate(widths):
        dm[i, :w] = True
    data = {"obs": rng.normal(size=(b, 3 + n * 4)), "device_mask": dm,
            "shares": dm / dm.sum(axis=1, keepdims=True),
            "advantages": np.arange(b, dtype=float)}
    seen = []
    for mb in agent._minibatches(data, 8):
        w = mb["device_mask"].shape[1]
        assert mb["obs"].shape[1] == 3 + w * 4
        assert w == mb["device_mask"].sum(axis=1).max()
        seen += mb["advantages"].tolist()
    assert sorted(seen) == list(range(b))  # every row once


def test_ppo_with_demonstrations_moves_toward_them(rng):
    """The imitation term in every PPO step pulls the deterministic shares
    toward the demonstrated ones even with rewards that say nothing."""
    agent = SetPPOAgent(3, 4, [2], SetPPOConfig(hidden=(8, 8, 8), lr=3e-3,
                                                bc_coef=1.0, seed=3))
    n, b = 3, 64
    obs = rng.normal(size=(b, 3 + n * 4))
    dm = np.ones((b, n), dtype=bool)
    # the demonstrated share follows the first feature of each device
    weight = np.exp(2.0 * obs[:, 3::4])
    target = weight / weight.sum(axis=1, keepdims=True)
    demo = {"obs": obs, "device_mask": dm, "shares": target,
            "choices": np.zeros((b, 1), dtype=np.int64)}
    before = np.abs(agent.act_batch(obs, dm, deterministic=True).shares
                    - target).sum(axis=1).mean()
    agent.demonstrate(demo)
    for _ in range(40):
        agent.explore(obs, dm)
        agent.record(np.zeros(b))
        stats = agent.learn()
    after = np.abs(agent.act_batch(obs, dm, deterministic=True).shares
                   - target).sum(axis=1).mean()
    assert "bc_loss" in stats and math.isfinite(stats["bc_loss"])
    assert after < 0.5 * before
