"""Learning sanity checks (each could fail) and policy files of lib.learners."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lib.learners import Learner, PolicyFormatError, PPOAgent, PPOConfig, gae
from lib.learners.bandit import BanditConfig, ShareBandit, log_speedup
from lib.learners.ppo import interior_shares
from lib.learners.td3 import TD3Agent, TD3Config
from lib.learners.toy import SpeedShareProblem, evaluate, train_ppo

# --------------------------------------------------------------------------
# GAE


def test_gae_hand_computed():
    # t=2: delta = 3 + 0.9 * 2.0 - 1.5 = 3.3                 -> A = 3.3
    # t=1: episode ends, delta = 2 - 1.0 = 1.0                -> A = 1.0
    # t=0: delta = 1 + 0.9 * 1.0 - 0.5 = 1.4; A = 1.4 + 0.72 * 1.0 = 2.12
    adv, ret = gae(np.array([1.0, 2.0, 3.0]), np.array([0.5, 1.0, 1.5]),
                   np.array([0, 1, 0]), 2.0, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(adv, [2.12, 1.0, 3.3], rtol=1e-14)
    np.testing.assert_allclose(ret, [2.62, 2.0, 4.8], rtol=1e-14)


def test_gae_columns_are_independent_environments():
    rng = np.random.default_rng(0)
    r, v = rng.normal(size=(6, 3)), rng.normal(size=(6, 3))
    d = rng.random((6, 3)) < 0.3
    last = rng.normal(size=3)
    adv, ret = gae(r, v, d, last, 0.99, 0.95)
    for j in range(3):
        a1, r1 = gae(r[:, j], v[:, j], d[:, j], last[j], 0.99, 0.95)
        np.testing.assert_allclose(adv[:, j], a1, rtol=1e-14)
        np.testing.assert_allclose(ret[:, j], r1, rtol=1e-14)


def test_gae_lambda_one_is_discounted_return_minus_value():
    r, v = np.array([1.0, 1.0, 1.0]), np.array([0.3, 0.2, 0.1])
    adv, _ = gae(r, v, np.zeros(3), 0.0, gamma=0.5, lam=1.0)
    np.testing.assert_allclose(adv, [1.75 - 0.3, 1.5 - 0.2, 1.0 - 0.1], rtol=1e-14)


# --------------------------------------------------------------------------
# PPO acting contract


def _agent(seed: int = 0, **kw) -> PPOAgent:
    p = SpeedShareProblem()
    settings = {"lr": 1e-3, "minibatch_size": 64, "epochs": 5, **kw}
    return PPOAgent(p.obs_dim, p.n_devices, [p.n_options],
                    PPOConfig(seed=seed, **settings))


def test_act_respects_masks_and_sums_to_one():
    agent = _agent()
    p = SpeedShareProblem()
    rng = np.random.default_rng(1)
    obs, dmask, cmasks, _ = p.sample(rng, 300)
    out = agent.act_batch(obs, dmask, cmasks, rng)
    assert np.all(out.shares[~dmask] == 0.0)
    np.testing.assert_allclose(out.shares.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(cmasks[0][np.arange(300), out.choices[:, 0]])
    shares, choices, logp, value = agent.act(obs[0], dmask[0], [cmasks[0][0]],
                                             deterministic=True)
    assert shares.shape == (p.n_devices,) and isinstance(choices[0], int)
    assert np.isfinite(logp) and np.isfinite(value)
    assert isinstance(agent, Learner)


def test_update_reproduces_the_acting_log_probabilities():
    # With the rollout's masks stored and re-applied, the first minibatch of
    # an update sees ratio 1 everywhere (approx_kl of the first step is 0).
    agent = _agent(epochs=1, minibatch_size=10_000)
    p = SpeedShareProblem()
    rng = np.random.default_rng(2)
    obs, dmask, cmasks, info = p.sample(rng, 200)
    agent.obs_rms.update(obs)
    out = agent.act_batch(obs, dmask, cmasks, rng)
    r = p.reward(info, out.shares, out.choices)
    batch = {"obs": obs, "device_mask": dmask, "discrete_masks": cmasks,
             "shares": out.shares, "choices": out.choices, "logp": out.logp,
             "advantages": r - out.value, "returns": r}
    _, _, stats = agent.loss_and_grads(batch)
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-12)
    assert stats["clip_frac"] == 0.0


# --------------------------------------------------------------------------
# Learning


def test_ppo_learns_speed_proportional_shares():
    problem = SpeedShareProblem()
    agent = _agent(seed=0)
    before = evaluate(agent, problem, np.random.default_rng(9), 256)
    train_ppo(agent, problem, iterations=15, batch=256,
              rng=np.random.default_rng(100), evaluate_every=0)
    after = evaluate(agent, problem, np.random.default_rng(9), 256)
    _, _, _, info = problem.sample(np.random.default_rng(9), 256)
    optimum = float(problem.optimum(info).mean())
    # Equal split with the right option scores 0.2; random options half that.
    assert before < 0.2
    assert after > before + 0.3
    assert after > 0.45
    assert after <= optimum + 1e-9


def test_td3_improves_shares_on_the_toy_problem():
    problem = SpeedShareProblem()
    agent = TD3Agent(problem.obs_dim, problem.n_devices, [problem.n_options],
                     TD3Config(seed=0, batch_size=64))
    before = evaluate(agent, problem, np.random.default_rng(9), 256)
    rng = np.random.default_rng(100)
    for _ in range(100):
        obs, dmask, _, info = problem.sample(rng, 64)
        shares = agent.shares(obs, dmask, noise=agent.config.explore_noise)
        assert np.all(shares[~dmask] == 0.0)
        r = problem.reward(info, shares, np.zeros((64, 1), dtype=np.int64))
        agent.observe(obs, dmask, shares, r, obs, dmask, np.ones(64))
        agent.update(8)
    after = evaluate(agent, problem, np.random.default_rng(9), 256)
    assert after > before + 0.25
    assert after > 0.3


def test_td3_discrete_defaults_respect_masks():
    agent = TD3Agent(3, 2, [3, 2], default_choices=[1, 0])
    assert agent.default_discrete([np.array([1, 1, 1], bool),
                                   np.array([1, 1], bool)]) == [1, 0]
    assert agent.default_discrete([np.array([0, 0, 1], bool),
                                   np.array([0, 1], bool)]) == [2, 1]


@pytest.mark.parametrize("strategy", ["ucb", "thompson"])
def test_bandit_finds_the_best_perturbation_per_context(strategy):
    speeds = {0: np.array([1.0, 2.0, 1.0, 1.0]), 1: np.array([1.0, 1.2, 0.6, 1.5])}
    mask = np.ones(4, dtype=bool)
    base = np.full(4, 0.25)

    def true_reward(shares, sp):
        return log_speedup(float(np.max(base / sp)), float(np.max(shares / sp)))

    bandit = ShareBandit(4, 2, BanditConfig(strategy=strategy, seed=0))
    cands, ok = bandit.candidates(base, mask)
    best = {c: max(true_reward(s, speeds[c]) for s in cands[ok]) for c in speeds}
    rng = np.random.default_rng(0)
    late: dict[int, list[float]] = {0: [], 1: []}
    arms: dict[int, list[int]] = {0: [], 1: []}
    for t in range(600):
        c = int(rng.integers(2))
        choice = bandit.select(np.eye(2)[c], base, mask)
        r = true_reward(choice.shares, speeds[c])
        bandit.update(choice, r + 0.05 * rng.standard_normal())
        if t >= 400:
            late[c].append(r)
            arms[c].append(choice.arm)
    for c in speeds:
        modal = int(np.bincount(arms[c]).argmax())
        assert true_reward(cands[modal], speeds[c]) == pytest.approx(best[c])
        # Near-optimal on average, and clearly better than staying at the base.
        assert np.mean(late[c]) > best[c] - 0.03
        assert np.mean(late[c]) > 0.1


def test_bandit_candidates_keep_masked_devices_at_zero():
    bandit = ShareBandit(3, 0)
    mask = np.array([True, False, True])
    cands, ok = bandit.candidates(np.array([0.5, 0.0, 0.5]), mask)
    assert np.all(cands[:, 1] == 0.0)
    np.testing.assert_allclose(cands.sum(axis=1), 1.0)
    assert not ok[[1 + 2 * 1, 2 + 2 * 1]].any()  # arms of device 1
    shares, choices = bandit.propose(np.zeros(0), mask, [np.array([0, 1], bool)])
    assert shares[1] == 0.0 and choices == [1]
    assert bandit.describe_arm(3) == "+0.1 to device 1"


# --------------------------------------------------------------------------
# Policy files


SPEC = {"state_version": 1, "fields": ["task.kind.matmul", "dev0.present"]}


def test_save_load_round_trip(tmp_path):
    problem = SpeedShareProblem()
    agent = _agent(seed=3)
    rng = np.random.default_rng(4)
    obs, dmask, cmasks, _ = problem.sample(rng, 32)
    agent.obs_rms.update(obs)
    path = agent.save(tmp_path / "policy.npz", {"spec": SPEC, "note": "toy"})
    loaded = PPOAgent.load(path, expected_spec=SPEC)
    a = agent.act_batch(obs, dmask, cmasks, deterministic=True)
    b = loaded.act_batch(obs, dmask, cmasks, deterministic=True)
    np.testing.assert_array_equal(a.shares, b.shares)
    np.testing.assert_array_equal(a.choices, b.choices)
    np.testing.assert_array_equal(a.value, b.value)
    np.testing.assert_array_equal(loaded.obs_rms.var, agent.obs_rms.var)
    assert loaded.loaded_header["note"] == "toy"
    assert loaded.config == agent.config


def test_load_refuses_a_different_spec(tmp_path):
    path = _agent().save(tmp_path / "policy.npz", {"spec": SPEC})
    other = {**SPEC, "state_version": 2}
    with pytest.raises(PolicyFormatError, match=r"state_version: saved 1, "
                                                r"expected 2"):
        PPOAgent.load(path, expected_spec=other)


def test_load_refuses_other_versions_and_non_policies(tmp_path):
    agent = _agent()
    path = tmp_path / "old.npz"
    head = agent.header({"spec": SPEC})
    head["version"] = 0
    with path.open("wb") as fh:
        np.savez(fh, header=np.array(json.dumps(head)))
    with pytest.raises(PolicyFormatError, match="version 0"):
        PPOAgent.load(path)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(PolicyFormatError, match="not a readable policy file"):
        PPOAgent.load(junk)


# --------------------------------------------------------------------------
# Imitation


def test_interior_shares_mixes_in_uniform_over_usable_devices_only():
    out = interior_shares(np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 0.5, 0.5, 0.0]]),
                          np.array([[1, 1, 1, 0], [0, 1, 1, 1]], dtype=bool),
                          eps=0.03)
    np.testing.assert_allclose(out, [[0.98, 0.01, 0.01, 0.0],
                                     [0.0, 0.495, 0.495, 0.01]], rtol=1e-12)


def test_imitation_copies_an_expert_that_ppo_would_take_long_to_find():
    problem = SpeedShareProblem()
    agent = _agent(seed=1, alpha_min=0.05)
    rng = np.random.default_rng(3)
    obs, dmask, cmasks, info = problem.sample(rng, 1024)
    expert = info["speeds"] / info["speeds"].sum(axis=1, keepdims=True)
    batch = {"obs": obs, "device_mask": dmask, "discrete_masks": cmasks,
             "shares": interior_shares(expert, dmask, 1e-3),
             "choices": info["right"][:, None],
             "returns": problem.optimum(info)}
    agent.obs_rms.update(obs)
    before = evaluate(agent, problem, np.random.default_rng(9), 256)
    first = agent.imitation_update(batch, steps=1)
    agent.imitation_update(batch, steps=300)
    last = agent.imitation_update(batch, steps=1)
    after = evaluate(agent, problem, np.random.default_rng(9), 256)
    _, _, _, held = problem.sample(np.random.default_rng(9), 256)
    assert last["nll"] < first["nll"] - 2.0
    assert last["choice_accuracy"] > 0.95 > first["choice_accuracy"]
    assert last["share_error"] < 0.25 * first["share_error"]
    # Fresh contexts: from about 0.1 to within 0.15 of the optimum (about 0.75).
    assert after > before + 0.4
    assert after > float(problem.optimum(held).mean()) - 0.15
